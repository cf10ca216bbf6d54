//! The wasmtime engine every plugin shares: configuration, the epoch ticker that enforces
//! call deadlines, the one linker (WASI as sandboxed, and the log import of every contract
//! version), and compilation through the verified on-disk cache (`cache.rs`).

use std::sync::OnceLock;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine};

use crate::bindings::{v1, v2, v3};
use crate::cache::{Cache, CacheOutcome};
use crate::sandbox::HostState;

/// How often the epoch advances. Deadlines are whole ticks, so this is their resolution.
pub const TICK: Duration = Duration::from_millis(5);

/// Under an address-space limit: the room a memory may grow into before it is moved, and
/// its guard region (wasmtime's defaults are 2 GiB and 32 MiB).
const SMALL_GROWTH_RESERVATION: u64 = 16 << 20;
const SMALL_GUARD: u64 = 64 << 10;

/// The process's virtual address-space limit (`ulimit -v`, RLIMIT_AS) in bytes; `None`
/// where there is none.
pub fn address_space_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct it is given.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } == 0;
    (read && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// The process-wide engine. Created once; its ticker thread lives as long as the process.
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let mut config = Config::new();
        config.epoch_interruption(true);
        config.wasm_component_model(true);
        if address_space_limit().is_some() {
            // By default each linear memory reserves 4 GiB of address space (plus guard
            // pages) so that compiled code needs no bounds checks. Under `ulimit -v`, as
            // on many HPC login nodes, a handful of plugin instances would exhaust the
            // limit and the first `mmap` fail: reserve only what a memory needs and grow
            // by copying, at the cost of explicit bounds checks. (The compiled-component
            // cache keys on the engine's settings, so the two kinds never mix.)
            config.memory_reservation(0);
            config.memory_reservation_for_growth(SMALL_GROWTH_RESERVATION);
            config.memory_guard_size(SMALL_GUARD);
        }
        let engine = Engine::new(&config).expect("the fixed wasmtime configuration is valid");
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("runner-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(TICK);
                }
            })
            .expect("spawning the epoch ticker thread");
        engine
    })
}

/// The one linker every plugin is pre-instantiated against, built once: WASI p2 as the
/// sandbox configures it per store, and the log import of contracts 0.1, 0.2 and 0.3.
/// (The `types` imports hold types only; wasmtime needs no definition for them.)
pub fn linker() -> &'static Linker<HostState> {
    static LINKER: OnceLock<Linker<HostState>> = OnceLock::new();
    LINKER.get_or_init(|| {
        let build = || -> wasmtime::Result<Linker<HostState>> {
            let mut linker = Linker::new(engine());
            wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
            v3::workload::runner::plugin::log::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
            v2::workload::runner::plugin::log::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
            v1::workload::runner::plugin::log::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
            Ok(linker)
        };
        build().expect("the host's imports link (fixed at build time)")
    })
}

/// Hex sha256 of a component's bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// wasmtime's compatibility hash of this engine, as it appears in cache entry names.
fn engine_key(engine: &Engine) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// The default cache, opened (and its directory checked) once per process.
fn default_cache() -> Result<&'static Cache, String> {
    static CACHE: OnceLock<Result<Cache, String>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            let Some(dir) = crate::cache::default_dir() else {
                let reason = crate::cache::no_dir_reason();
                // No HOME at all (a container under an arbitrary uid) is normal there and
                // costs only compile time; a relative HOME is a mistake worth a word.
                if std::env::var_os("HOME").is_some_and(|h| !h.is_empty()) {
                    tracing::warn!("compiled plugins are not cached: {reason}");
                }
                return Err(reason);
            };
            Cache::open(&dir)
                .inspect_err(|e| tracing::warn!("compiled plugins are not cached: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Compile `bytes` (whose sha256 is `sha`) through the default cache.
pub fn compile(bytes: &[u8], sha: &str) -> Result<(Component, CacheOutcome), String> {
    match default_cache() {
        Ok(cache) => compile_with(bytes, sha, cache),
        Err(reason) => Component::new(engine(), bytes)
            .map(|c| (c, CacheOutcome::Disabled(reason)))
            .map_err(|e| format!("{e:#}")),
    }
}

/// Compile `bytes` through `cache`: a verified entry is deserialised, anything else is
/// compiled and (re)written.
pub fn compile_with(
    bytes: &[u8],
    sha: &str,
    cache: &Cache,
) -> Result<(Component, CacheOutcome), String> {
    let engine = engine();
    let key = engine_key(engine);
    let mut outcome = CacheOutcome::Miss;
    match cache.get(sha, &key) {
        Ok(Some(compiled)) => {
            // SAFETY: the HMAC under this user's private key proves these bytes are what
            // `precompile_component` of an engine with this compatibility hash produced
            // from the wasm whose hash is `sha`, written by this user's runner; they are
            // the bytes that were verified (read once, not re-read from the file).
            match unsafe { Component::deserialize(engine, &compiled) } {
                Ok(c) => return Ok((c, CacheOutcome::Hit)),
                Err(e) => tracing::debug!("ignoring an unusable cache entry for {sha}: {e:#}"),
            }
        }
        Ok(None) => {}
        Err(()) => {
            tracing::warn!("{}", cache.refused(sha, &key));
            outcome = CacheOutcome::Rejected;
        }
    }
    let compiled = engine
        .precompile_component(bytes)
        .map_err(|e| format!("{e:#}"))?;
    cache.put(sha, &key, &compiled);
    // SAFETY: `compiled` was produced just now by this engine's `precompile_component`.
    let component =
        unsafe { Component::deserialize(engine, &compiled) }.map_err(|e| format!("{e:#}"))?;
    Ok((component, outcome))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hex is two digits a byte (a byte below 0x10 keeps its leading 0): "abc"'s sha256
    /// has three such bytes.
    #[test]
    fn sha256_hex_is_the_standard_digest() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    /// An entry whose tag verifies but which this engine cannot deserialise (written by a
    /// runner whose wasmtime had the same compatibility hash but another format, or cut
    /// short before it was tagged) costs a recompilation, not the plugin: compiled, the
    /// entry replaced, and the next compile a hit.
    #[test]
    fn a_verified_entry_that_does_not_deserialise_is_recompiled_and_replaced() {
        let tmp = tempfile::Builder::new().prefix("runner-engine-unit-").tempdir().unwrap();
        let dir = tmp.path().join("cache");
        let cache = Cache::open(&dir).unwrap();
        let bytes = crate::embedded().iter().map(|(_, _, b)| *b).min_by_key(|b| b.len()).unwrap();
        let sha = sha256_hex(bytes);
        cache.put(&sha, &engine_key(engine()), b"not a compiled component");
        let (_, outcome) = compile_with(bytes, &sha, &cache).expect("recompiled");
        assert_eq!(outcome, CacheOutcome::Miss);
        let (_, outcome) = compile_with(bytes, &sha, &cache).unwrap();
        assert_eq!(outcome, CacheOutcome::Hit, "the entry was replaced");
    }
}
