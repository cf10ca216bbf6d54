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
//! start pays no compilation. An entry of another engine (an older runner's, unreadable by
//! this one) is deleted when an entry is stored and it is more than [`STALE_AFTER`] old:
//! only regular files of this user whose names are entry names. Not at once: one binary
//! runs two engines (under `ulimit -v` its code is bounds-checked, another hash), and each
//! must not delete the other's live entries on every store. Not unix: no cache.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

const MAGIC: &[u8; 8] = b"rcwasm01";
const TAG: usize = 32;
const KEY_FILE: &str = "key";

/// How old an entry of another engine must be before a store deletes it: a week, so a
/// binary whose engine changes (see the module's note) recompiles at most once a week.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(7 * 86_400);

/// The engine key of a file named as an entry is (`{64 hex}-{16 hex}.cwasm`), else `None`.
fn entry_engine(name: &str) -> Option<&str> {
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let (sha, engine) = name.strip_suffix(".cwasm")?.split_once('-')?;
    (hex(sha, 64) && hex(engine, 16)).then_some(engine)
}

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

/// Where compiled components are cached: `$RUNNER_CACHE_DIR` (a relative one is taken
/// relative to the working directory, as any path the user names is; an empty one is
/// unset), else `runner/components` in the user's cache directory (on Linux
/// `$XDG_CACHE_HOME`, else `$HOME/.cache`). An empty or relative `$XDG_CACHE_HOME` is
/// ignored, as the XDG spec says, and so is a relative `$HOME` (each working directory
/// would get a cache of its own): then there is none.
pub fn default_dir() -> Option<PathBuf> {
    dir_from(std::env::var_os("RUNNER_CACHE_DIR"), dirs::cache_dir())
}

/// [`default_dir`] from `$RUNNER_CACHE_DIR` and the user's cache directory.
fn dir_from(given: Option<std::ffi::OsString>, cache_dir: Option<PathBuf>) -> Option<PathBuf> {
    match given {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => Some(cache_dir.filter(|d| d.is_absolute())?.join("runner").join("components")),
    }
}

/// Why there is no default cache directory, for the warning.
pub fn no_dir_reason() -> String {
    match std::env::var_os("HOME") {
        Some(home) if !home.is_empty() => format!(
            "HOME ({}) is not an absolute path, so it is ignored; set an absolute HOME or RUNNER_CACHE_DIR",
            home.to_string_lossy().escape_debug()
        ),
        _ => "no cache directory: neither RUNNER_CACHE_DIR nor HOME is set".into(),
    }
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

    /// What to say of the entry for (`sha`, `engine`) that [`Cache::get`] refused. A
    /// directory at its name (made by hand, or by a tool that mirrors caches) is not a
    /// sign of tampering and would never be replaced by [`Cache::put`]'s rename: an empty
    /// one is removed so the entry can be written; another is named for the user to remove.
    pub fn refused(&self, sha: &str, engine: &str) -> String {
        let path = self.path(sha, engine);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            return match std::fs::remove_dir(&path) {
                Ok(()) => format!("the cache entry {} was an empty directory, not a file: removed; compiling plugin {sha} into it", path.display()),
                Err(_) => format!(
                    "the cache entry {} is a directory, not a file: remove it (plugin {sha} is compiled on every run until then)",
                    path.display()
                ),
            };
        }
        format!("the cached compilation of plugin {sha} failed verification (edited, swapped or written by someone else); recompiling it")
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
        if write_private(&tmp, &data).is_ok() {
            match std::fs::rename(&tmp, self.path(sha, engine)) {
                Ok(()) => self.prune(engine),
                Err(e) => {
                    tracing::debug!("cannot store a compiled component: {e}");
                    let _ = std::fs::remove_file(&tmp);
                }
            }
        }
    }

    /// Delete (best effort) the entries of engines other than `engine` older than
    /// [`STALE_AFTER`]: regular files (not links: `symlink_metadata`) this user owns, named
    /// as entries. Nothing else in the directory is touched.
    fn prune(&self, engine: &str) {
        let Ok(listing) = std::fs::read_dir(&self.dir) else { return };
        let now = std::time::SystemTime::now();
        for entry in listing.flatten() {
            let name = entry.file_name();
            let Some(other) = name.to_str().and_then(entry_engine) else { continue };
            if other == engine {
                continue;
            }
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
            let old = meta.modified().ok().and_then(|m| now.duration_since(m).ok()).is_some_and(|age| age > STALE_AFTER);
            #[cfg(unix)]
            let ours = std::os::unix::fs::MetadataExt::uid(&meta) == unix::euid();
            #[cfg(not(unix))]
            let ours = false;
            if meta.file_type().is_file()
                && ours
                && old
                && let Err(e) = std::fs::remove_file(&path)
            {
                tracing::debug!("cannot delete the stale cache entry {}: {e}", path.display());
            }
        }
    }
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    write_or_remove(path, options.open(path)?, data)
}

/// Write `data` to `out`, the file just created at `path`; if the write fails (a full
/// disk), remove the file rather than leave a partial one behind: a partial entry's
/// temporary file would never be renamed or cleaned up, and a partial key file would make
/// every later run refuse the cache.
fn write_or_remove(path: &Path, mut out: impl std::io::Write, data: &[u8]) -> std::io::Result<()> {
    let written = out.write_all(data).and_then(|()| out.flush());
    if written.is_err() {
        drop(out);
        let _ = std::fs::remove_file(path);
    }
    written
}

#[cfg(unix)]
mod unix {
    use std::io::Read as _;
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
    use std::path::Path;

    pub(super) fn euid() -> u32 {
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
        // Printed whole: `chmod 1777` (sticky, as /tmp) read "mode 777".
        let mode = meta.mode() & 0o7777;
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    /// A cache directory not yet made (the cache makes it), inside a scratch directory
    /// removed when the guard goes, also when the test fails.
    fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::Builder::new().prefix(&format!("runner-cache-unit-{name}-")).tempdir().unwrap();
        let dir = tmp.path().join("cache");
        (tmp, dir)
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    /// A store deletes the entries of other engines a week old, and nothing else: not a
    /// newer one (the other engine of this binary may be using it), not this engine's,
    /// not a file that is not named as an entry, not a link named as one (nor what it
    /// points to), not the key. Kills: the age, engine, name or file-type check dropped,
    /// the link's target's metadata read instead of the link's.
    #[test]
    fn a_store_deletes_other_engines_stale_entries_and_nothing_else() {
        let (tmp, dir) = scratch("prune");
        let cache = Cache::open(&dir).unwrap();
        let (this, other) = ("1111111111111111", "2222222222222222");
        let week_old = std::time::SystemTime::now() - STALE_AFTER - std::time::Duration::from_secs(3600);
        let make = |name: &str, old: bool| {
            let p = dir.join(name);
            std::fs::write(&p, b"x").unwrap();
            if old {
                std::fs::File::options().write(true).open(&p).unwrap().set_modified(week_old).unwrap();
            }
            p
        };
        let sha = |c: char| c.to_string().repeat(64);
        let stale = make(&format!("{}-{other}.cwasm", sha('a')), true);
        let fresh = make(&format!("{}-{other}.cwasm", sha('b')), false);
        let mine = make(&format!("{}-{this}.cwasm", sha('c')), true);
        let odd = make(&format!("{}-{other}.cwasm.bak", sha('d')), true);
        let upper = make(&format!("{}-{}.cwasm", sha('E'), other.to_uppercase()), true);
        let target = tmp.path().join("target");
        std::fs::write(&target, b"not ours to delete").unwrap();
        std::fs::File::options().write(true).open(&target).unwrap().set_modified(week_old).unwrap();
        let link = dir.join(format!("{}-{other}.cwasm", sha('f')));
        std::os::unix::fs::symlink(&target, &link).unwrap();
        cache.put(&sha('9'), this, b"code");
        assert!(!stale.exists(), "the week-old entry of another engine is deleted");
        for kept in [&fresh, &mine, &odd, &upper, &target, &dir.join(KEY_FILE)] {
            assert!(kept.exists(), "{} kept", kept.display());
        }
        assert!(std::fs::symlink_metadata(&link).is_ok(), "the link is kept");
        assert_eq!(cache.get(&sha('9'), this), Ok(Some(b"code".to_vec())));
        assert_eq!(entry_engine(&format!("{}-{this}.cwasm", sha('0'))), Some(this));
        assert_eq!(entry_engine("key"), None);
    }

    /// An entry cut short anywhere (a full disk, a killed writer) is refused as an entry,
    /// never read past its end: only its magic, its magic and part of the tag, the magic and
    /// the whole tag but no code (a tag over no code is not the tag written), or its code
    /// cut by a byte. (A hand mutation audit found a length check that allowed the magic
    /// alone passed every test: the short entry then panicked in `split_at`.)
    #[test]
    fn a_truncated_entry_is_refused_not_read_past_its_end() {
        let (_dir, dir) = scratch("short");
        let cache = Cache::open(&dir).unwrap();
        let sha = "ab".repeat(32);
        cache.put(&sha, "e", b"compiled code");
        let path = cache.path(&sha, "e");
        let whole = std::fs::read(&path).unwrap();
        assert_eq!(whole.len(), MAGIC.len() + TAG + 13);
        for len in [0, MAGIC.len(), MAGIC.len() + 1, MAGIC.len() + TAG - 1, MAGIC.len() + TAG, whole.len() - 1] {
            std::fs::write(&path, &whole[..len]).unwrap();
            assert_eq!(cache.get(&sha, "e"), Err(()), "an entry cut to {len} bytes");
        }
        std::fs::write(&path, &whole).unwrap();
        assert_eq!(cache.get(&sha, "e"), Ok(Some(b"compiled code".to_vec())));
    }

    /// Group permissions count as others': a directory its group may write to is refused,
    /// one its group may only read is tightened to 0700, and a key its group may read is
    /// refused. Entries and the key are written 0600. (The integration tests used 0777, 0755
    /// and 0644, which the others' bits alone refuse: checks of only those bits passed them.)
    #[test]
    fn group_permissions_count_as_others() {
        let (_dir, dir) = scratch("group");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770)).unwrap();
        let err = Cache::open(&dir).err().expect("a group-writable directory is refused");
        assert!(err.contains("can be written by others (mode 770)"), "{err}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
        let cache = Cache::open(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700, "a group-readable directory is tightened");
        let key = dir.join(KEY_FILE);
        assert_eq!(mode(&key), 0o600);
        cache.put(&"ab".repeat(32), "e", b"code");
        assert_eq!(mode(&cache.path(&"ab".repeat(32), "e")), 0o600);
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = Cache::open(&dir).err().expect("a group-readable key is refused");
        assert!(err.contains("not a private 32-byte file"), "{err}");
    }

    /// An entry whose rename fails (here the entry's name is taken by a directory) leaves
    /// no temporary file behind: each failed store would otherwise leave a whole compiled
    /// component in the cache, on every run. The directory entry is refused, not read.
    #[test]
    fn a_store_that_cannot_be_renamed_leaves_no_temporary_file() {
        let (_dir, dir) = scratch("rename");
        let cache = Cache::open(&dir).unwrap();
        let sha = "cd".repeat(32);
        std::fs::create_dir_all(cache.path(&sha, "e").join("occupied")).unwrap();
        cache.put(&sha, "e", b"compiled code");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert_eq!(cache.get(&sha, "e"), Err(()));
    }

    /// A write that fails after its file was created (a full disk) removes that file.
    #[test]
    fn a_failed_write_leaves_no_file() {
        struct Full(std::fs::File);
        impl std::io::Write for Full {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.write(&buf[..buf.len().min(3)])?;
                Err(std::io::Error::other("no space left on device"))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (_dir, dir) = scratch("full");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(".entry.tmp");
        let file = std::fs::File::create(&path).unwrap();
        let err = write_or_remove(&path, Full(file), b"compiled code").unwrap_err();
        assert!(err.to_string().contains("no space"), "{err}");
        assert!(!path.exists(), "the partial file was left behind");
        write_or_remove(&path, std::fs::File::create(&path).unwrap(), b"code").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"code");
    }

    /// An empty `$RUNNER_CACHE_DIR` is unset (it read "cannot read : No such file"), and
    /// a relative user cache directory (from a relative `$HOME`) is none, not one under
    /// the working directory; a relative `$RUNNER_CACHE_DIR`, named by the user, is kept.
    /// Kills: the empty variable taken, the relative directory not filtered.
    #[test]
    fn an_empty_variable_is_unset_and_a_relative_home_is_ignored() {
        let home = Some(PathBuf::from("/home/u/.cache"));
        let default = Some(PathBuf::from("/home/u/.cache/runner/components"));
        assert_eq!(dir_from(Some("".into()), home.clone()), default);
        assert_eq!(dir_from(None, home), default);
        assert_eq!(dir_from(None, Some(PathBuf::from("relh/.cache"))), None);
        assert_eq!(dir_from(Some("".into()), Some(PathBuf::from("relh/.cache"))), None);
        assert_eq!(dir_from(Some("mine".into()), None), Some(PathBuf::from("mine")));
    }

    /// A directory at an entry's name is said to be one, not tampering: an empty one is
    /// removed (so the entry can be stored), another is named for the user to remove. A
    /// refused file is still "failed verification". Kills: every refusal read as failed
    /// verification; the empty directory left in place.
    #[test]
    fn a_directory_at_an_entrys_name_is_named_not_called_tampering() {
        let (_dir, dir) = scratch("entry-dir");
        let cache = Cache::open(&dir).unwrap();
        let sha = "12".repeat(32);
        std::fs::create_dir(cache.path(&sha, "e")).unwrap();
        assert_eq!(cache.get(&sha, "e"), Err(()));
        let said = cache.refused(&sha, "e");
        assert!(said.contains("was an empty directory, not a file: removed"), "{said}");
        cache.put(&sha, "e", b"code");
        assert_eq!(cache.get(&sha, "e"), Ok(Some(b"code".to_vec())));
        let other = "34".repeat(32);
        std::fs::create_dir_all(cache.path(&other, "e").join("inside")).unwrap();
        let said = cache.refused(&other, "e");
        assert!(said.contains("is a directory, not a file: remove it"), "{said}");
        assert!(cache.path(&other, "e").join("inside").is_dir(), "its content is the user's to remove");
        std::fs::write(cache.path(&sha, "e"), b"edited").unwrap();
        assert!(cache.refused(&sha, "e").contains("failed verification"));
    }

    /// A world-writable sticky directory (as /tmp is) is refused with its whole mode:
    /// it read "mode 777". Kills: the mode cut to its permission bits.
    #[test]
    fn a_refused_mode_is_printed_whole() {
        let (_dir, dir) = scratch("sticky");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let err = Cache::open(&dir).err().expect("a world-writable directory is refused");
        assert!(err.contains("(mode 1777)"), "{err}");
    }

    /// Two caches draw two keys: an entry of one, copied into the other, is refused.
    #[test]
    fn each_cache_draws_its_own_key() {
        let ((_a, a), (_b, b)) = (scratch("key-a"), scratch("key-b"));
        let (ca, cb) = (Cache::open(&a).unwrap(), Cache::open(&b).unwrap());
        assert_ne!(ca.key, cb.key);
        assert_ne!(ca.key, [0; 32]);
        let sha = "ef".repeat(32);
        ca.put(&sha, "e", b"code");
        std::fs::copy(ca.path(&sha, "e"), cb.path(&sha, "e")).unwrap();
        assert_eq!(cb.get(&sha, "e"), Err(()));
    }
}
