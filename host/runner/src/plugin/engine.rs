//! The wasmtime engine every plugin shares: configuration, the epoch ticker that enforces
//! call deadlines, and the on-disk cache of compiled components (keyed by the content
//! hash of the component and the engine's compatibility hash), so a warm start pays no
//! compilation.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Config, Engine};

/// How often the epoch advances. Deadlines are whole ticks, so this is their resolution.
pub const TICK: Duration = Duration::from_millis(5);

/// The process-wide engine. Created once; its ticker thread lives as long as the process.
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let mut config = Config::new();
        config.epoch_interruption(true);
        config.wasm_component_model(true);
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

/// Hex sha256 of a component's bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where compiled components are cached: `$RUNNER_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/runner/components`, else `~/.cache/runner/components`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("RUNNER_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("runner").join("components"))
}

fn engine_key(engine: &Engine) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Whether the last [`compile`] was served from the cache (for `plugins list` and benches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    Hit,
    Miss,
    Disabled,
}

/// Compile `bytes` (whose hash is `sha`), using and filling the on-disk cache.
pub fn compile(bytes: &[u8], sha: &str) -> Result<(Component, CacheOutcome), String> {
    let engine = engine();
    let Some(dir) = cache_dir() else {
        return Component::new(engine, bytes)
            .map(|c| (c, CacheOutcome::Disabled))
            .map_err(|e| format!("{e:#}"));
    };
    let path = dir.join(format!("{sha}-{}.cwasm", engine_key(engine)));
    if path.exists() {
        // SAFETY: the file was written by `precompile_component` of an engine with the same
        // compatibility hash (it is in the file name), into a cache directory we own, and
        // wasmtime re-checks the header before using it.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(c) => return Ok((c, CacheOutcome::Hit)),
            Err(e) => tracing::debug!("ignoring unusable cache entry {}: {e:#}", path.display()),
        }
    }
    let compiled = engine
        .precompile_component(bytes)
        .map_err(|e| format!("{e:#}"))?;
    if std::fs::create_dir_all(&dir).is_ok() {
        // Unique per process and call: tests compile the same plugin on several threads.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".{sha}.{}.{seq}.tmp", std::process::id()));
        if std::fs::write(&tmp, &compiled).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
    // SAFETY: `compiled` was produced just now by this engine's `precompile_component`.
    let component =
        unsafe { Component::deserialize(engine, &compiled) }.map_err(|e| format!("{e:#}"))?;
    Ok((component, CacheOutcome::Miss))
}
