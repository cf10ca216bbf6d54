//! The on-disk cache of compiled components. A cache entry is native code that wasmtime
//! runs outside the sandbox, so an entry is used only if this user's runner wrote it from
//! these very wasm bytes:
//!
//! - the directory is created owner-only (0700) and refused when another user owns it or
//!   anyone else may write to it (a directory only others may read is tightened to 0700);
//! - it holds a random 256-bit key (`key`, 0600), made on first use;
//! - each entry is `MAGIC`, then HMAC-SHA256(key, wasm sha256 | engine hash | compiled
//!   bytes), then the compiled bytes. The tag is checked over the bytes read, and those
//!   same bytes are deserialised, so a file swapped or edited by anyone without the key is
//!   recompiled and overwritten, never executed.
//!
//! Entries are keyed by the wasm's sha256 and wasmtime's compatibility hash, so a warm
//! start pays no compilation. Not unix: no cache.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

const MAGIC: &[u8; 8] = b"rcwasm01";
const TAG: usize = 32;
const KEY_FILE: &str = "key";

/// What happened to the cache on one compile (for `plugins list`, benches and tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// A verified entry was used.
    Hit,
    /// No entry: compiled and stored.
    Miss,
    /// An entry failed verification (tampered, swapped, truncated): compiled and replaced.
    Rejected,
    /// No usable cache directory; the reason.
    Disabled(String),
}

/// A verified cache directory and its key.
pub struct Cache {
    dir: PathBuf,
    key: [u8; 32],
}

/// Where compiled components are cached: `$RUNNER_CACHE_DIR`, else `runner/components` in
/// the user's cache directory (on Linux `$XDG_CACHE_HOME`, else `~/.cache`; an empty or
/// relative `$XDG_CACHE_HOME` is ignored, as the XDG spec says, so the cache is never
/// under the working directory).
pub fn default_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("RUNNER_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    Some(dirs::cache_dir()?.join("runner").join("components"))
}

impl Cache {
    /// Open (creating if needed) the cache at `dir` after checking who owns it and who may
    /// write to it.
    ///
    /// # Errors
    /// Why the directory is not safe to run code from, and how to fix it.
    pub fn open(dir: &Path) -> Result<Cache, String> {
        #[cfg(unix)]
        {
            let key = unix::open(dir)?;
            Ok(Cache {
                dir: dir.to_path_buf(),
                key,
            })
        }
        #[cfg(not(unix))]
        {
            let _ = dir;
            Err("the compiled-component cache needs unix permissions".into())
        }
    }

    fn path(&self, sha: &str, engine: &str) -> PathBuf {
        self.dir.join(format!("{sha}-{engine}.cwasm"))
    }

    fn tag(&self, sha: &str, engine: &str, compiled: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(b"runner compiled component\0");
        mac.update(sha.as_bytes());
        mac.update(b"\0");
        mac.update(engine.as_bytes());
        mac.update(b"\0");
        mac.update(compiled);
        mac
    }

    /// The compiled bytes of the entry for (`sha`, `engine`), if there is one and its tag
    /// verifies. `Err(())` when an entry exists but does not verify.
    #[allow(
        clippy::result_unit_err,
        reason = "the only failure is 'rejected'; the caller logs it"
    )]
    pub fn get(&self, sha: &str, engine: &str) -> Result<Option<Vec<u8>>, ()> {
        let Ok(mut file) = std::fs::File::open(self.path(sha, engine)) else {
            return Ok(None);
        };
        let mut bytes = Vec::new();
        if file.read_to_end(&mut bytes).is_err()
            || bytes.len() < MAGIC.len() + TAG
            || &bytes[..MAGIC.len()] != MAGIC
        {
            return Err(());
        }
        let (tag, compiled) = bytes[MAGIC.len()..].split_at(TAG);
        self.tag(sha, engine, compiled)
            .verify_slice(tag)
            .map_err(|_| ())?;
        Ok(Some(compiled.to_vec()))
    }

    /// Store `compiled` for (`sha`, `engine`): written owner-only to a temporary file, then
    /// renamed over the entry. Failures only cost a recompilation next time.
    pub fn put(&self, sha: &str, engine: &str, compiled: &[u8]) {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!(".{sha}.{}.{seq}.tmp", std::process::id()));
        let mut data = Vec::with_capacity(MAGIC.len() + TAG + compiled.len());
        data.extend_from_slice(MAGIC);
        data.extend_from_slice(&self.tag(sha, engine, compiled).finalize().into_bytes());
        data.extend_from_slice(compiled);
        if write_private(&tmp, &data).is_ok()
            && let Err(e) = std::fs::rename(&tmp, self.path(sha, engine))
        {
            tracing::debug!("cannot store a compiled component: {e}");
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(data)
}

#[cfg(unix)]
mod unix {
    use std::io::Read as _;
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
    use std::path::Path;

    fn euid() -> u32 {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() }
    }

    /// Check (or create) the directory and its key file; return the key.
    pub fn open(dir: &Path) -> Result<[u8; 32], String> {
        let shown = dir.display();
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("cannot create the cache directory {shown}: {e}"))?;
        }
        let meta =
            std::fs::symlink_metadata(dir).map_err(|e| format!("cannot read {shown}: {e}"))?;
        if !meta.is_dir() {
            return Err(format!(
                "the cache path {shown} is not a directory (a symlink or a file)"
            ));
        }
        if meta.uid() != euid() {
            return Err(format!(
                "the cache directory {shown} belongs to uid {}, not to this user (uid {}); \
                 point RUNNER_CACHE_DIR at a directory of your own",
                meta.uid(),
                euid()
            ));
        }
        let mode = meta.mode() & 0o777;
        if mode & 0o022 != 0 {
            return Err(format!(
                "the cache directory {shown} can be written by others (mode {mode:o}); its compiled code \
                 could be anyone's. Remove it or `chmod 700` it and delete its files"
            ));
        }
        if mode & 0o077 != 0 {
            // Readable by others but writable only by us: nothing can have been planted.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("cannot make {shown} owner-only: {e}"))?;
        }
        let key_path = dir.join(super::KEY_FILE);
        // Two tries: another process may create the key between our look and our write.
        for _ in 0..2 {
            match std::fs::symlink_metadata(&key_path) {
                Ok(m)
                    if m.is_file()
                        && m.uid() == euid()
                        && m.mode() & 0o077 == 0
                        && m.len() == 32 =>
                {
                    let mut key = [0u8; 32];
                    std::fs::File::open(&key_path)
                        .and_then(|mut f| f.read_exact(&mut key))
                        .map_err(|e| {
                            format!("cannot read the cache key {}: {e}", key_path.display())
                        })?;
                    return Ok(key);
                }
                Ok(_) => {
                    return Err(format!(
                        "the cache key {} is not a private 32-byte file of this user; delete it to start a new cache",
                        key_path.display()
                    ));
                }
                Err(_) => {
                    let mut key = [0u8; 32];
                    std::fs::File::open("/dev/urandom")
                        .and_then(|mut f| f.read_exact(&mut key))
                        .map_err(|e| format!("cannot draw a cache key from /dev/urandom: {e}"))?;
                    match super::write_private(&key_path, &key) {
                        Ok(()) => return Ok(key),
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                        Err(e) => {
                            return Err(format!(
                                "cannot write the cache key {}: {e}",
                                key_path.display()
                            ));
                        }
                    }
                }
            }
        }
        Err(format!(
            "the cache key {} keeps changing under us",
            key_path.display()
        ))
    }
}
