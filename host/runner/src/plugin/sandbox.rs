//! The sandbox every plugin instance runs in: no preopened directories, no environment,
//! no arguments, no sockets, stdin closed, stdout/stderr captured (panic messages land
//! there), a memory cap, a deadline on every call, and a fixed random seed so that
//! plugins stay pure functions of their inputs. A trapped instance is discarded and
//! re-created on the next call.

use serde::{Deserialize, Serialize};
use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Store, StoreLimits, StoreLimitsBuilder, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::{self, LogLevel};
use super::engine::{TICK, engine};
use super::error::{Failure, PluginError};

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

/// Log lines kept per instance; a plugin that logs in a loop must not exhaust the host.
const MAX_LOG_LINES: usize = 1000;
const MAX_LOG_LINE: usize = 4096;
/// Captured stdout+stderr per instance.
const PIPE_CAPACITY: usize = 64 * 1024;

/// Store data of one plugin instance.
pub struct HostState {
    plugin: String,
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
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

impl bindings::workload::runner::plugin::log::Host for HostState {
    fn log(&mut self, level: LogLevel, message: String) {
        self.logged += 1;
        if self.logged > MAX_LOG_LINES {
            return;
        }
        let mut message = message;
        if message.len() > MAX_LOG_LINE {
            let mut cut = MAX_LOG_LINE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str(" [truncated]");
        }
        let plugin = &self.plugin;
        match level {
            LogLevel::Trace => tracing::trace!(target: "plugin", "[{plugin}] {message}"),
            LogLevel::Debug => tracing::debug!(target: "plugin", "[{plugin}] {message}"),
            LogLevel::Info => tracing::info!(target: "plugin", "[{plugin}] {message}"),
            LogLevel::Warn => tracing::warn!(target: "plugin", "[{plugin}] {message}"),
            LogLevel::Error => tracing::error!(target: "plugin", "[{plugin}] {message}"),
        }
    }
}

impl bindings::workload::runner::plugin::types::Host for HostState {}

fn new_store(plugin: &str, limits: Limits) -> Store<HostState> {
    let output = MemoryOutputPipe::new(PIPE_CAPACITY);
    let wasi = WasiCtx::builder()
        .stdout(output.clone())
        .stderr(output.clone())
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .insecure_random_seed(0)
        .build();
    let store_limits = StoreLimitsBuilder::new()
        .memory_size((limits.memory_mib as usize).saturating_mul(1 << 20))
        .instances(16)
        .memories(8)
        .tables(16)
        .trap_on_grow_failure(true)
        .build();
    let state = HostState {
        plugin: plugin.to_string(),
        wasi,
        table: ResourceTable::new(),
        limits: store_limits,
        output,
        logged: 0,
    };
    let mut store = Store::new(engine(), state);
    store.limiter(|s| &mut s.limits);
    store
}

/// A linker with WASI (as sandboxed above) and the host's log import.
pub fn linker() -> wasmtime::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine());
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    bindings::workload::runner::plugin::log::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
    bindings::workload::runner::plugin::types::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
    Ok(linker)
}

/// Generated bindings that can be instantiated from a pre-linked component.
pub trait World: Sized {
    type Pre: Clone;
    fn instantiate(pre: &Self::Pre, store: &mut Store<HostState>) -> wasmtime::Result<Self>;
}

impl World for bindings::workload::WorkloadPlugin {
    type Pre = bindings::workload::WorkloadPluginPre<HostState>;
    fn instantiate(pre: &Self::Pre, store: &mut Store<HostState>) -> wasmtime::Result<Self> {
        pre.instantiate(store)
    }
}

impl World for bindings::precision::PrecisionPlugin {
    type Pre = bindings::precision::PrecisionPluginPre<HostState>;
    fn instantiate(pre: &Self::Pre, store: &mut Store<HostState>) -> wasmtime::Result<Self> {
        pre.instantiate(store)
    }
}

impl World for bindings::cost::CostPlugin {
    type Pre = bindings::cost::CostPluginPre<HostState>;
    fn instantiate(pre: &Self::Pre, store: &mut Store<HostState>) -> wasmtime::Result<Self> {
        pre.instantiate(store)
    }
}

/// One sandboxed plugin instance, re-created after a trap.
pub struct Sandboxed<W: World> {
    name: String,
    limits: Limits,
    pre: W::Pre,
    live: Option<(Store<HostState>, W)>,
}

impl<W: World> Sandboxed<W> {
    pub fn new(name: &str, pre: W::Pre, limits: Limits) -> Sandboxed<W> {
        Sandboxed {
            name: name.to_string(),
            limits,
            pre,
            live: None,
        }
    }

    /// Run `f` against a live instance under the call deadline. Any trap discards the
    /// instance and comes back as a classified [`PluginError`].
    pub fn call<R>(
        &mut self,
        call: &str,
        f: impl FnOnce(&mut Store<HostState>, &W) -> wasmtime::Result<R>,
    ) -> Result<R, PluginError> {
        if self.live.is_none() {
            let mut store = new_store(&self.name, self.limits);
            store.set_epoch_deadline(u64::MAX / 2);
            let instance = W::instantiate(&self.pre, &mut store)
                .map_err(|e| self.classify(call, e, &store))?;
            self.live = Some((store, instance));
        }
        let (store, instance) = self.live.as_mut().expect("instance is live");
        let ticks = self
            .limits
            .call_timeout_ms
            .div_ceil(TICK.as_millis() as u64)
            .max(1)
            + 1;
        store.set_epoch_deadline(ticks);
        store.data_mut().logged = 0;
        match f(store, instance) {
            Ok(r) => Ok(r),
            Err(e) => {
                let (store, _) = self.live.take().expect("instance is live");
                Err(self.classify(call, e, &store))
            }
        }
    }

    fn classify(&self, call: &str, e: wasmtime::Error, store: &Store<HostState>) -> PluginError {
        let output = String::from_utf8_lossy(&store.data().output.contents()).into_owned();
        let root = format!("{:#}", e.root_cause());
        let failure = match e.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => Failure::Timeout {
                limit_ms: self.limits.call_timeout_ms,
            },
            Some(Trap::OutOfFuel) => Failure::Timeout {
                limit_ms: self.limits.call_timeout_ms,
            },
            _ if root.contains("forcing trap when growing memory")
                || output.contains("memory allocation of") =>
            {
                Failure::OutOfMemory {
                    limit_mib: self.limits.memory_mib,
                }
            }
            Some(trap) => Failure::Trap {
                message: trap.to_string(),
                stderr: output,
            },
            None => Failure::Trap {
                message: format!("{e:#}"),
                stderr: output,
            },
        };
        PluginError::new(&self.name, call, failure)
    }
}
