//! The compiled-component cache runs native code outside the sandbox, so it must never run
//! an entry someone else wrote: entries are verified by a keyed hash, the directory is
//! owner-only, and a directory others can write to is refused.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use runner::plugin::cache::Cache;
use runner::plugin::{CacheOutcome, compile_with, embedded, sha256_hex};

/// A cache directory not yet made (the cache makes it), inside a scratch directory removed
/// when the guard goes, also when the test fails.
fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::Builder::new().prefix(&format!("runner-cache-{name}-")).tempdir().unwrap();
    let dir = tmp.path().join("cache");
    (tmp, dir)
}

/// The two smallest embedded plugins (fast to compile in a debug build).
fn two_plugins() -> [(&'static [u8], String); 2] {
    let mut all: Vec<&[u8]> = embedded().iter().map(|(_, _, b)| *b).collect();
    all.sort_by_key(|b| b.len());
    [(all[0], sha256_hex(all[0])), (all[1], sha256_hex(all[1]))]
}

fn entry(dir: &Path, sha: &str) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(sha))
        .expect("the entry was written")
}

fn outcome(bytes: &[u8], sha: &str, cache: &Cache) -> CacheOutcome {
    compile_with(bytes, sha, cache).unwrap().1
}

#[test]
fn a_tampered_or_swapped_entry_is_recompiled_never_run() {
    let (_dir, dir) = scratch("tamper");
    let cache = Cache::open(&dir).unwrap();
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "created owner-only");
    let [(a, sha_a), (b, sha_b)] = two_plugins();
    assert_eq!(outcome(a, &sha_a, &cache), CacheOutcome::Miss);
    assert_eq!(outcome(a, &sha_a, &cache), CacheOutcome::Hit);

    // Flip one byte of the compiled code: the tag no longer matches.
    let path_a = entry(&dir, &sha_a);
    let mut bytes = std::fs::read(&path_a).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&path_a, &bytes).unwrap();
    assert_eq!(outcome(a, &sha_a, &cache), CacheOutcome::Rejected);
    assert_eq!(
        outcome(a, &sha_a, &cache),
        CacheOutcome::Hit,
        "the entry was rewritten"
    );

    // Put plugin B's (valid, tagged) entry under A's name: its tag binds it to B's hash.
    assert_eq!(outcome(b, &sha_b, &cache), CacheOutcome::Miss);
    std::fs::copy(entry(&dir, &sha_b), &path_a).unwrap();
    assert_eq!(outcome(a, &sha_a, &cache), CacheOutcome::Rejected);

    // A file that is not an entry at all (e.g. a raw precompiled component).
    std::fs::write(&path_a, b"\x00asm not an entry").unwrap();
    assert_eq!(outcome(a, &sha_a, &cache), CacheOutcome::Rejected);

    // A new key (another user's cache copied here) invalidates every entry.
    std::fs::remove_file(dir.join("key")).unwrap();
    let cache = Cache::open(&dir).unwrap();
    assert_eq!(outcome(a, &sha_a, &cache), CacheOutcome::Rejected);
}

#[test]
fn a_cache_directory_others_can_write_to_is_refused() {
    let (_dir, dir) = scratch("open");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = Cache::open(&dir).err().expect("refused");
    assert!(
        err.contains("can be written by others") && err.contains("chmod 700"),
        "{err}"
    );

    // Readable by others but writable only by us: nothing can have been planted; tightened.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    Cache::open(&dir).unwrap();
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );

    // A key file others can read is not a secret any more.
    std::fs::set_permissions(dir.join("key"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = Cache::open(&dir).err().expect("refused");
    assert!(err.contains("not a private 32-byte file"), "{err}");
    std::fs::set_permissions(dir.join("key"), std::fs::Permissions::from_mode(0o600)).unwrap();

    // Someone else's directory (only checkable where this test may give files away).
    if std::os::unix::fs::chown(&dir, Some(65534), None).is_ok() {
        let err = Cache::open(&dir).err().expect("refused");
        assert!(err.contains("belongs to uid 65534"), "{err}");
    }
}

/// What the entry format and the key file are checked for, each found missing by a hand
/// mutation audit: an entry's tag binds it to the wasm hash and to the engine (an entry moved
/// to another engine's name is refused), an entry of another format version (its magic) is
/// refused even with a valid tag, and the key must be exactly 32 bytes of this user's.
#[test]
fn an_entry_is_bound_to_its_hash_engine_and_format_and_the_key_is_exactly_ours() {
    let (_dir, dir) = scratch("bind");
    let cache = Cache::open(&dir).unwrap();
    let sha = "ab".repeat(32);
    cache.put(&sha, "engine-a", b"compiled code");
    assert_eq!(cache.get(&sha, "engine-a"), Ok(Some(b"compiled code".to_vec())));
    assert_eq!(cache.get(&sha, "engine-b"), Ok(None));
    let path = |sha: &str, engine: &str| dir.join(format!("{sha}-{engine}.cwasm"));
    std::fs::copy(path(&sha, "engine-a"), path(&sha, "engine-b")).unwrap();
    assert_eq!(cache.get(&sha, "engine-b"), Err(()), "another engine's entry");
    let other = "cd".repeat(32);
    std::fs::copy(path(&sha, "engine-a"), path(&other, "engine-a")).unwrap();
    assert_eq!(cache.get(&other, "engine-a"), Err(()), "another wasm's entry");
    // Another format version: same tag and code, another magic.
    let mut bytes = std::fs::read(path(&sha, "engine-a")).unwrap();
    bytes[7] = b'0';
    std::fs::write(path(&sha, "engine-a"), &bytes).unwrap();
    assert_eq!(cache.get(&sha, "engine-a"), Err(()), "another format's entry");

    // A key of 33 bytes is not the key this runner wrote.
    let key = dir.join("key");
    let mut k = std::fs::read(&key).unwrap();
    k.push(0);
    std::fs::write(&key, &k).unwrap();
    let err = Cache::open(&dir).err().expect("refused");
    assert!(err.contains("not a private 32-byte file"), "{err}");
    k.pop();
    std::fs::write(&key, &k).unwrap();
    Cache::open(&dir).unwrap();
    // Someone else's key (only checkable where this test may give files away).
    if std::os::unix::fs::chown(&key, Some(65534), None).is_ok() {
        let err = Cache::open(&dir).err().expect("refused");
        assert!(err.contains("not a private 32-byte file"), "{err}");
    }
}

/// A symlink where the cache directory should be is refused: whoever can change the link
/// chooses the code that runs.
#[test]
fn a_cache_path_that_is_a_symlink_is_refused() {
    let (_dir, dir) = scratch("link");
    let (_target, target) = scratch("link-target");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&target, &dir).unwrap();
    let err = Cache::open(&dir).err().expect("refused");
    assert!(err.contains("is not a directory (a symlink or a file)"), "{err}");
}
