//! The sandbox every plugin instance runs in: no preopened directories, no environment,
//! no arguments, no sockets, stdin closed (or, for a cost plugin given a user's price file,
//! that file's bytes and nothing else), stdout/stderr captured (panic messages land
//! there), a memory cap enforced by a limiter whose refusal is a typed error, a deadline
//! on every call, and both WASI random generators seeded with fixed values, so a plugin
//! stays a pure function of its inputs and every rank (and every replay) decides alike.
//!
//! A trapped instance is discarded and re-created on the next call; so is one whose memory
//! has grown past half its cap (a plugin that leaks across calls never reaches the cap).

use rand::SeedableRng as _;
use serde::{Deserialize, Serialize};
use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store, Trap};
use wasmtime_wasi::p2::pipe::{MemoryInputPipe, MemoryOutputPipe};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::bindings::{v1, v2, v3};
use crate::engine::{TICK, engine};
use crate::error::{Failure, PluginError};

/// Resource limits for plugin instances (the run file's `[limits]` table).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Linear-memory cap per instance, MiB.
    pub memory_mib: u64,
    /// Wall-clock deadline per call, milliseconds.
    pub call_timeout_ms: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            memory_mib: 256,
            call_timeout_ms: 10_000,
        }
    }
}

/// Log lines kept per call, and their length; a plugin that logs in a loop must not
/// exhaust the host or flood the terminal.
const MAX_LOG_LINES: usize = 1000;
const MAX_LOG_LINE: usize = 4096;
/// Captured stdout+stderr per instance.
const PIPE_CAPACITY: usize = 64 * 1024;
/// Largest single draw from WASI random (wasmtime's default is 64 MiB).
const MAX_RANDOM_BYTES: u64 = 1 << 20;
/// The seeds of the two generators and of `insecure-seed` ("runner" in ASCII, varied).
const SECURE_SEED: u64 = 0x7275_6e6e_6572_0001;
const INSECURE_SEED: u64 = 0x7275_6e6e_6572_0002;
const INSECURE_SEED_VALUE: u128 = 0x7275_6e6e_6572_0003;

/// What the limiter raises when a plugin asks for more linear memory than its cap: the
/// sandbox recognises a memory-cap failure by this type, not by an error message.
#[derive(Debug)]
pub struct MemoryCapExceeded {
    pub requested: usize,
    pub cap: usize,
}

impl std::fmt::Display for MemoryCapExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "memory growth to {} bytes refused (cap {} bytes)",
            self.requested, self.cap
        )
    }
}

impl std::error::Error for MemoryCapExceeded {}

/// The store's resource limiter: the memory cap, and small fixed limits on tables,
/// instances and memories.
struct Limiter {
    memory_cap: usize,
    /// The largest linear memory this instance has grown to, bytes.
    memory: usize,
    /// Set when the cap refused a growth (the trap that follows is this one's).
    hit: bool,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_cap {
            self.hit = true;
            return Err(wasmtime::Error::new(MemoryCapExceeded {
                requested: desired,
                cap: self.memory_cap,
            }));
        }
        self.memory = self.memory.max(desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }

    fn instances(&self) -> usize {
        16
    }
    fn tables(&self) -> usize {
        16
    }
    fn memories(&self) -> usize {
        8
    }
}

/// Store data of one plugin instance.
pub struct HostState {
    plugin: String,
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
    output: MemoryOutputPipe,
    logged: usize,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl HostState {
    /// A log line from the plugin, escaped (no terminal sequences, no forged lines), cut to
    /// length, and counted against the per-call budget.
    fn log(&mut self, level: tracing::Level, message: &str) {
        let Some(message) = admit_log_line(&mut self.logged, message) else {
            return;
        };
        let plugin = &self.plugin;
        match level {
            tracing::Level::TRACE => tracing::trace!(target: "plugin", "[{plugin}] {message}"),
            tracing::Level::DEBUG => tracing::debug!(target: "plugin", "[{plugin}] {message}"),
            tracing::Level::INFO => tracing::info!(target: "plugin", "[{plugin}] {message}"),
            tracing::Level::WARN => tracing::warn!(target: "plugin", "[{plugin}] {message}"),
            tracing::Level::ERROR => tracing::error!(target: "plugin", "[{plugin}] {message}"),
        }
    }
}

/// The line a plugin's log message becomes, escaped and cut to [`MAX_LOG_LINE`] bytes;
/// `None` once `logged` (this call's count, which it advances) is past [`MAX_LOG_LINES`].
fn admit_log_line(logged: &mut usize, message: &str) -> Option<String> {
    *logged += 1;
    (*logged <= MAX_LOG_LINES).then(|| runner_contract::text::escape(message, MAX_LOG_LINE))
}

/// The log import of each contract version: the same function, the version's own types.
macro_rules! log_import {
    ($($version:ident),*) => {
        $(impl $version::workload::runner::plugin::log::Host for HostState {
            fn log(&mut self, level: $version::LogLevel, message: String) {
                use $version::LogLevel as L;
                let level = match level {
                    L::Trace => tracing::Level::TRACE,
                    L::Debug => tracing::Level::DEBUG,
                    L::Info => tracing::Level::INFO,
                    L::Warn => tracing::Level::WARN,
                    L::Error => tracing::Level::ERROR,
                };
                HostState::log(self, level, &message);
            }
        })*
    };
}

log_import!(v1, v2, v3);

fn new_store(plugin: &str, limits: Limits, input: Option<&bytes::Bytes>) -> Store<HostState> {
    let output = MemoryOutputPipe::new(PIPE_CAPACITY);
    let mut builder = WasiCtx::builder();
    if let Some(data) = input {
        builder.stdin(MemoryInputPipe::new(data.clone()));
    }
    let wasi = builder
        .stdout(output.clone())
        .stderr(output.clone())
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .secure_random(rand::rngs::StdRng::seed_from_u64(SECURE_SEED))
        .insecure_random(rand::rngs::StdRng::seed_from_u64(INSECURE_SEED))
        .insecure_random_seed(INSECURE_SEED_VALUE)
        .max_random_size(MAX_RANDOM_BYTES)
        .build();
    let state = HostState {
        plugin: plugin.to_string(),
        wasi,
        table: ResourceTable::new(),
        limiter: Limiter {
            memory_cap: usize::try_from(limits.memory_mib.saturating_mul(1 << 20))
                .unwrap_or(usize::MAX),
            memory: 0,
            hit: false,
        },
        output,
        logged: 0,
    };
    let mut store = Store::new(engine(), state);
    store.limiter(|s| &mut s.limiter);
    store
}

/// What a trapped plugin printed, for its error, escaped (line breaks read `\n`, as the
/// price-file reader in the runner expects): all of it up to 4 KiB, else its first and last
/// 2 KiB (a panic message comes last); and, where the capture was full, why a print then
/// trapped.
fn captured_output(bytes: &[u8]) -> String {
    const SHOWN: usize = 4096;
    let text = String::from_utf8_lossy(bytes);
    let escape = |s: &str| runner_contract::text::escape(s, usize::MAX);
    let mut out = if text.len() <= SHOWN {
        escape(&text)
    } else {
        let mut head = SHOWN / 2;
        while !text.is_char_boundary(head) {
            head -= 1;
        }
        let mut tail = text.len() - SHOWN / 2;
        while !text.is_char_boundary(tail) {
            tail += 1;
        }
        format!(
            "{} [{} bytes left out] {}",
            escape(&text[..head]),
            tail - head,
            escape(&text[tail..])
        )
    };
    // A write that does not fit is refused whole, so a full capture may stop short of it.
    if bytes.len() + SHOWN > PIPE_CAPACITY {
        out.push_str(&format!(
            "\\n[stdout and stderr filled the {} KiB the host captures per instance, and a print past that \
             fails (Rust's print! then panics): print less, or log through runner_plugin_sdk::log, which is \
             capped and never fails]",
            PIPE_CAPACITY >> 10
        ));
    }
    out
}

/// The epoch deadline of a call of `timeout_ms`, in ticks from now: the whole ticks that
/// cover the timeout, plus one for the tick under way (it may end at once), so a call runs
/// at least its timeout and less than two ticks more.
fn deadline_ticks(timeout_ms: u64) -> u64 {
    timeout_ms.div_ceil(TICK.as_millis() as u64).max(1) + 1
}

/// Generated bindings that can be instantiated from a pre-instantiation (built once per
/// plugin at load).
pub trait World: Sized {
    type Pre: Clone;
    fn instantiate(pre: &Self::Pre, store: &mut Store<HostState>) -> wasmtime::Result<Self>;
}

macro_rules! world {
    ($($world:ty => $pre:ty),* $(,)?) => {
        $(impl World for $world {
            type Pre = $pre;
            fn instantiate(pre: &Self::Pre, store: &mut Store<HostState>) -> wasmtime::Result<Self> {
                pre.instantiate(store)
            }
        })*
    };
}

world! {
    v3::workload::WorkloadPlugin => v3::workload::WorkloadPluginPre<HostState>,
    v3::precision::PrecisionPlugin => v3::precision::PrecisionPluginPre<HostState>,
    v3::cost::CostPlugin => v3::cost::CostPluginPre<HostState>,
    v2::workload::WorkloadPlugin => v2::workload::WorkloadPluginPre<HostState>,
    v2::precision::PrecisionPlugin => v2::precision::PrecisionPluginPre<HostState>,
    v2::cost::CostPlugin => v2::cost::CostPluginPre<HostState>,
    v1::workload::WorkloadPlugin => v1::workload::WorkloadPluginPre<HostState>,
    v1::precision::PrecisionPlugin => v1::precision::PrecisionPluginPre<HostState>,
    v1::cost::CostPlugin => v1::cost::CostPluginPre<HostState>,
}

/// One sandboxed plugin instance, re-created after a trap or when it has grown too big.
pub struct Sandboxed<W: World> {
    name: String,
    /// The path of a plugin that shadows an embedded one (see [`PluginError::of`]).
    shadowing: Option<String>,
    limits: Limits,
    pre: W::Pre,
    live: Option<(Store<HostState>, W)>,
    /// Bytes every instance reads as its standard input (the same for each, so a plugin
    /// stays a pure function of them).
    input: Option<bytes::Bytes>,
}

impl<W: World> Sandboxed<W> {
    pub fn new(name: &str, pre: W::Pre, limits: Limits) -> Sandboxed<W> {
        Sandboxed {
            name: name.to_string(),
            shadowing: None,
            limits,
            pre,
            live: None,
            input: None,
        }
    }

    /// Name `info`'s path in errors if it shadows an embedded plugin.
    pub fn of(mut self, info: &crate::PluginInfo) -> Sandboxed<W> {
        self.shadowing = info.shadowing();
        self
    }

    /// Give every instance `data` on its standard input.
    pub fn with_input(mut self, data: Vec<u8>) -> Sandboxed<W> {
        self.input = Some(bytes::Bytes::from(data));
        self.live = None;
        self
    }

    /// Run `f` against a live instance under the call deadline. Any trap discards the
    /// instance and comes back as a classified [`PluginError`].
    pub fn call<R>(
        &mut self,
        call: &str,
        f: impl FnOnce(&mut Store<HostState>, &W) -> wasmtime::Result<R>,
    ) -> Result<R, PluginError> {
        if self.live.is_none() {
            let mut store = new_store(&self.name, self.limits, self.input.as_ref());
            // Instantiation runs guest code too (a component's start functions), so it has
            // the call's deadline: a start function that loops must not hang the host.
            // Rust-built plugins run their constructors inside the first export call
            // instead; a hand-made component reaches this (tests/all/sandbox.rs,
            // `instantiation_is_under_the_call_deadline`).
            store.set_epoch_deadline(deadline_ticks(self.limits.call_timeout_ms));
            let instance = W::instantiate(&self.pre, &mut store)
                .map_err(|e| self.classify(call, e, &store))?;
            self.live = Some((store, instance));
        }
        let (store, instance) = self.live.as_mut().expect("instance is live");
        store.set_epoch_deadline(deadline_ticks(self.limits.call_timeout_ms));
        store.data_mut().logged = 0;
        match f(store, instance) {
            Ok(r) => {
                // A plugin is a pure function: an instance whose memory has grown past half
                // its cap (a slow leak) is replaced before it can fail a later call.
                let state = store.data();
                // So is one whose captured stdout/stderr is half full: a write past the
                // capacity fails (Rust's `println!` then panics), so a plugin that prints a
                // line per call would otherwise trap after some thousands of calls.
                if state.limiter.memory > state.limiter.memory_cap / 2
                    || state.output.contents().len() > PIPE_CAPACITY / 2
                {
                    tracing::debug!(
                        "[{}] recycling an instance grown to {} bytes",
                        self.name,
                        state.limiter.memory
                    );
                    self.live = None;
                }
                Ok(r)
            }
            Err(e) => {
                let (store, _) = self.live.take().expect("instance is live");
                Err(self.classify(call, e, &store))
            }
        }
    }

    fn classify(&self, call: &str, e: wasmtime::Error, store: &Store<HostState>) -> PluginError {
        let state = store.data();
        let output = captured_output(&state.output.contents());
        let failure = if state.limiter.hit || e.downcast_ref::<MemoryCapExceeded>().is_some() {
            Failure::OutOfMemory {
                limit_mib: self.limits.memory_mib,
            }
        } else {
            match e.downcast_ref::<Trap>() {
                Some(Trap::Interrupt | Trap::OutOfFuel) => Failure::Timeout {
                    limit_ms: self.limits.call_timeout_ms,
                },
                Some(trap) => Failure::Trap {
                    message: trap.to_string(),
                    stderr: output,
                },
                // An mmap the host could not make (the sandbox's memory under `ulimit -v`)
                // is no trap of the plugin's.
                None if e.chain().any(is_enomem) => {
                    Failure::HostMemory(runner_contract::text::escape(&format!("{e:#}"), 4096))
                }
                None => Failure::Trap {
                    message: runner_contract::text::escape(&format!("{e:#}"), 4096),
                    stderr: output,
                },
            }
        };
        PluginError { shadowing: self.shadowing.clone(), ..PluginError::new(&self.name, call, failure) }
    }
}

/// An error of the host's own memory: an mmap refused with ENOMEM, as std reports it or as
/// wasmtime does (rustix's errno, for the sandbox's reservations under `ulimit -v`).
fn is_enomem(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<std::io::Error>().is_some_and(|io| io.raw_os_error() == Some(libc::ENOMEM))
        || e.downcast_ref::<rustix::io::Errno>().is_some_and(|&errno| errno == rustix::io::Errno::NOMEM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_output_keeps_the_panic_at_the_end_and_says_why_a_full_capture_traps() {
        let panic = "\nthread '<unnamed>' panicked at src/lib.rs:3:5:\nboom \u{1b}[31m\n";
        let shown = captured_output(panic.as_bytes());
        assert_eq!(shown, "\\nthread '<unnamed>' panicked at src/lib.rs:3:5:\\nboom \\u{1b}[31m\\n");

        let spam = "x".repeat(100) + "\n";
        let mut full = spam.repeat(PIPE_CAPACITY / spam.len());
        full.push_str("last line");
        let shown = captured_output(full.as_bytes());
        assert!(shown.contains(&format!(" [{} bytes left out] ", full.len() - 4096)), "{shown}");
        assert!(shown.contains("last line"), "{shown}");
        assert!(shown.contains("filled the 64 KiB"), "{shown}");
        assert!(!captured_output(spam.as_bytes()).contains("filled"));
    }

    /// The cap refuses the first byte past it, and says so by type (a mutation audit found
    /// a cap four times too large passed every test: the hog plugin grows without end).
    #[test]
    fn the_memory_cap_refuses_the_first_byte_past_it() {
        let cap = 64 << 20;
        let mut limiter = Limiter { memory_cap: cap, memory: 0, hit: false };
        assert!(limiter.memory_growing(0, cap, None).unwrap());
        assert_eq!((limiter.memory, limiter.hit), (cap, false));
        let e = limiter.memory_growing(cap, cap + 1, None).unwrap_err();
        let refused = e.downcast_ref::<MemoryCapExceeded>().expect("typed");
        assert_eq!((refused.requested, refused.cap), (cap + 1, cap));
        assert!(limiter.hit && limiter.memory == cap);
    }

    /// A plugin's log lines are escaped, cut, and counted: the first MAX_LOG_LINES of a call
    /// are kept, the rest dropped (no test looked at what reaches the log before). What
    /// shows as nothing is escaped too: a zero-width space, an RLM and a BOM reached the log
    /// raw.
    #[test]
    fn log_lines_are_escaped_cut_and_capped_per_call() {
        let mut logged = 0;
        assert_eq!(admit_log_line(&mut logged, "a\u{1b}[2J\nforged").as_deref(), Some("a\\u{1b}[2J\\nforged"));
        assert_eq!(admit_log_line(&mut 0, "ok\u{200b}\u{200f}\u{feff}").as_deref(), Some("ok\\u{200b}\\u{200f}\\u{feff}"));
        let long = admit_log_line(&mut logged, &"x".repeat(MAX_LOG_LINE + 10)).unwrap();
        assert!(long.starts_with(&"x".repeat(MAX_LOG_LINE)) && long.ends_with(" [10 more bytes]"), "{}", &long[MAX_LOG_LINE..]);
        for _ in 2..MAX_LOG_LINES {
            assert!(admit_log_line(&mut logged, "line").is_some());
        }
        assert_eq!(logged, MAX_LOG_LINES);
        assert_eq!(admit_log_line(&mut logged, "one too many"), None);
    }

    /// A call's deadline covers its timeout in whole ticks plus the tick under way: the
    /// call runs at least its timeout, and less than two ticks more. (A hand mutation audit
    /// found the timeout read as ticks, 5 times too long, and the tick under way left out,
    /// up to a tick too short, passed every test: the one timeout test allowed 5 s.)
    #[test]
    fn a_call_deadline_covers_its_timeout_in_whole_ticks() {
        let tick = TICK.as_millis() as u64;
        for timeout_ms in [1, 4, 5, 6, 200, 10_000, 1 << 40] {
            let ticks = deadline_ticks(timeout_ms);
            assert!((ticks - 1) * tick >= timeout_ms, "{timeout_ms} ms: {ticks} ticks end early");
            assert!((ticks - 2) * tick < timeout_ms, "{timeout_ms} ms: {ticks} ticks run a tick long");
        }
    }

    /// The cap is `memory_mib` MiB exactly, saturating rather than wrapping.
    #[test]
    fn a_store_caps_memory_at_memory_mib() {
        let store = new_store("p", Limits { memory_mib: 64, ..Limits::default() }, None);
        assert_eq!(store.data().limiter.memory_cap, 64 << 20);
        let store = new_store("p", Limits { memory_mib: u64::MAX, ..Limits::default() }, None);
        assert_eq!(store.data().limiter.memory_cap, usize::MAX);
    }

    /// Exactly 4 KiB of output is shown whole; past it the cut falls on character
    /// boundaries (here inside two-byte characters at both ends, where slicing would panic);
    /// the note on a full capture starts where a 4 KiB write no longer fits.
    #[test]
    fn captured_output_is_cut_past_4_kib_on_character_boundaries() {
        let exact = "y".repeat(4096);
        assert_eq!(captured_output(exact.as_bytes()), exact);
        let text = format!("x{}y", "\u{e9}".repeat(3000));
        let shown = captured_output(text.as_bytes());
        assert!(shown.starts_with(&format!("x{}", "\u{e9}".repeat(1023))), "{}", &shown[..16]);
        assert!(shown.contains(" [1908 bytes left out] "), "{shown}");
        assert!(shown.ends_with(&format!("{}y", "\u{e9}".repeat(1023))));
        assert!(!captured_output(&vec![b'z'; PIPE_CAPACITY - 4096]).contains("filled the 64 KiB"));
        assert!(captured_output(&vec![b'z'; PIPE_CAPACITY - 4095]).contains("filled the 64 KiB"));
    }

    /// A sandboxed instance of the embedded bf16 precision plugin.
    fn bf16(limits: Limits) -> Sandboxed<v3::precision::PrecisionPlugin> {
        let (name, _, bytes) = *crate::embedded().iter().find(|(n, _, _)| *n == "bf16.wasm").unwrap();
        let plugin = crate::load_bytes(name, crate::Source::Embedded, bytes).unwrap();
        let crate::Pre::PrecisionV3(pre) = plugin.pre.clone() else { panic!("bf16 is a 0.3 precision plugin") };
        Sandboxed::new(name, pre, limits)
    }

    /// The instance's life, driven from the host side of a call: kept at half its cap,
    /// replaced past it; each call's log budget starts afresh; any failure discards the
    /// instance and is classified: an interrupt as the timeout, a refused growth as the cap
    /// (by its type, or by the limiter's record when the error that follows is another),
    /// anything else as a trap whose message is escaped. (A hand mutation audit found each of
    /// these could go with every test of this crate passing.)
    #[test]
    fn an_instance_is_recycled_past_half_its_cap_and_discarded_after_any_failure() {
        let limits = Limits { memory_mib: 64, call_timeout_ms: 300 };
        let cap = 64usize << 20;
        let mut s = bf16(limits);
        s.call("x", |st, _| {
            st.data_mut().limiter.memory = cap / 2;
            st.data_mut().logged = MAX_LOG_LINES;
            Ok(())
        })
        .unwrap();
        assert!(s.live.is_some(), "at half its cap an instance is kept");
        let logged = s.call("x", |st, _| Ok(st.data().logged)).unwrap();
        assert_eq!(logged, 0, "a call's log budget starts afresh");
        s.call("x", |st, _| {
            st.data_mut().limiter.memory = cap / 2 + 1;
            Ok(())
        })
        .unwrap();
        assert!(s.live.is_none(), "past half its cap it is replaced");

        let fail = |s: &mut Sandboxed<v3::precision::PrecisionPlugin>, e: fn(&mut Store<HostState>) -> wasmtime::Error| {
            let err = s.call("plan", |st, _| Err::<(), _>(e(st))).unwrap_err();
            assert!(s.live.is_none(), "the failed instance was discarded: {err}");
            assert_eq!((err.plugin.as_str(), err.call.as_str()), ("bf16.wasm", "plan"));
            err.failure
        };
        assert_eq!(fail(&mut s, |_| wasmtime::Error::new(Trap::Interrupt)), Failure::Timeout { limit_ms: 300 });
        let oom = Failure::OutOfMemory { limit_mib: 64 };
        assert_eq!(fail(&mut s, |_| wasmtime::Error::new(MemoryCapExceeded { requested: (64 << 20) + 1, cap: 64 << 20 })), oom);
        assert_eq!(
            fail(&mut s, |st| {
                let cap = st.data().limiter.memory_cap;
                let refused = st.data_mut().limiter.memory_growing(0, cap + 1, None).unwrap_err();
                wasmtime::Error::msg(format!("a trap after: {refused}"))
            }),
            oom
        );
        let Failure::Trap { message, .. } = fail(&mut s, |_| wasmtime::Error::msg("boom \u{1b}[2J")) else {
            panic!("a trap")
        };
        assert_eq!(message, "boom \\u{1b}[2J");
        // An mmap the host could not make (as wasmtime reports one under `ulimit -v`) is
        // the host's, not a trap of the plugin's.
        let enomem = fail(&mut s, |_| {
            wasmtime::Error::new(std::io::Error::from_raw_os_error(libc::ENOMEM)).context("mmap failed to reserve 0x104000000 bytes")
        });
        assert_eq!(enomem, Failure::HostMemory("mmap failed to reserve 0x104000000 bytes: Cannot allocate memory (os error 12)".into()));
        // wasmtime's own mmaps report rustix's errno.
        let enomem = fail(&mut s, |_| wasmtime::Error::new(rustix::io::Errno::NOMEM).context("mmap failed to reserve 0x1130000 bytes"));
        assert!(matches!(&enomem, Failure::HostMemory(m) if m.starts_with("mmap failed to reserve 0x1130000 bytes: ")), "{enomem:?}");
        assert!(s.call("x", |_, _| Ok(())).is_ok(), "a fresh instance serves the next call");
    }
}
