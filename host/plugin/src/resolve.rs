//! Finding a plugin by what the user typed: a path first, then the plugin directories
//! (`./plugins/dist`, each entry of `$RUNNER_PLUGIN_PATH`, the user data dir), then the
//! first-party plugins embedded in the binary. Dropping a `.wasm` into a plugin directory
//! makes it available (and lets it override an embedded plugin of the same name)
//! without rebuilding the host.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// Where a plugin's bytes came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Path(PathBuf),
    Embedded,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Path(p) => write!(f, "{}", p.display()),
            Source::Embedded => write!(f, "embedded"),
        }
    }
}

mod generated {
    include!(concat!(env!("OUT_DIR"), "/plugins.rs"));
}

/// First-party plugins compiled into this binary: (file name, kind, bytes).
pub fn embedded() -> &'static [(&'static str, &'static str, &'static [u8])] {
    generated::EMBEDDED
}

#[doc(hidden)]
/// Paths of the misbehaving test programs built alongside the plugins (for tests only).
pub fn test_programs() -> &'static [(&'static str, &'static str)] {
    generated::TEST_PROGRAMS
}

/// The plugin directories, in search order.
pub fn plugin_dirs() -> Vec<PathBuf> {
    dirs_from(std::env::var_os("RUNNER_PLUGIN_PATH").as_deref(), user_data_dir())
}

/// `./plugins/dist`, each entry of `path` (`$RUNNER_PLUGIN_PATH`), then `data`. An empty
/// entry (`a::b`, a trailing `:`) is no directory: read as one, it would be the working
/// directory, whose `.wasm` files would then load without being asked for.
fn dirs_from(path: Option<&std::ffi::OsStr>, data: Option<PathBuf>) -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from("plugins/dist")];
    if let Some(path) = path {
        dirs.extend(std::env::split_paths(path).filter(|p| !p.as_os_str().is_empty()));
    }
    dirs.extend(data);
    dirs
}

/// `runner/plugins` in the user's data directory: on Linux `$XDG_DATA_HOME/runner/plugins`,
/// else `~/.local/share/runner/plugins`. The `dirs` crate applies the XDG base directory
/// rule that an empty or relative `$XDG_DATA_HOME` is ignored (read as given, an empty one
/// would make `runner/plugins` under the working directory a plugin directory); the
/// component cache, the history store and the NCCL shim take their directories from it too.
/// A relative `$HOME` is ignored the same way (plugins would be loaded from under the
/// working directory): then there is no such directory.
pub fn user_data_dir() -> Option<PathBuf> {
    Some(dirs::data_dir().filter(|d| d.is_absolute())?.join("runner").join("plugins"))
}

fn file_name(spec: &str) -> String {
    if spec.ends_with(".wasm") {
        spec.to_string()
    } else {
        format!("{spec}.wasm")
    }
}

/// Resolve `spec` to (file name, source, bytes).
///
/// # Errors
/// Says every place that was searched and which plugins exist, or why the file found
/// cannot be read.
pub fn resolve(spec: &str) -> Result<(String, Source, Vec<u8>), String> {
    let (name, source) = locate(spec)?;
    let bytes = match &source {
        Source::Path(path) => read_plugin(path)?,
        Source::Embedded => embedded_bytes(&name).map(<[u8]>::to_vec).unwrap_or_default(),
    };
    Ok((name, source, bytes))
}

/// Where `spec` resolves to (file name, source), without reading the plugin: what a
/// check that a run's plugins are installed needs before anything loads.
///
/// # Errors
/// Says every place that was searched and which plugins exist.
pub fn locate(spec: &str) -> Result<(String, Source), String> {
    locate_in(spec, &plugin_dirs())
}

/// [`locate`] with the plugin directories `dirs`.
fn locate_in(spec: &str, dirs: &[PathBuf]) -> Result<(String, Source), String> {
    let path = Path::new(spec);
    // Something at that path that is not a plugin file; said if no plugin has the name
    // (from the `plugins/` source tree, `llama3` is a directory and a plugin).
    let not_a_file = match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Some(format!("'{spec}' is a directory, not a plugin file: name the .wasm in it")),
        Ok(m) if !m.is_file() => Some(format!("'{spec}' is not a regular file (a device or a pipe): name a .wasm plugin file")),
        // A path that exists but cannot be followed (a symbolic link loop, no permission).
        Err(e) if e.kind() != std::io::ErrorKind::NotFound && std::fs::symlink_metadata(path).is_ok() => {
            Some(format!("cannot read '{spec}': {e}"))
        }
        _ => None,
    };
    if path.is_file() {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| spec.into());
        return Ok((name, Source::Path(path.to_path_buf())));
    }
    let name = file_name(spec);
    let looks_like_path = spec.contains('/') || spec.contains(std::path::MAIN_SEPARATOR);
    if !looks_like_path {
        for dir in dirs {
            let candidate = dir.join(&name);
            if candidate.is_file() {
                return Ok((name, Source::Path(candidate)));
            }
        }
        if embedded_bytes(&name).is_some() {
            return Ok((name, Source::Embedded));
        }
    }
    if let Some(why) = not_a_file {
        return Err(why);
    }
    let searched: Vec<String> = dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    let known: Vec<&str> = embedded().iter().map(|(n, _, _)| *n).collect();
    Err(format!(
        "no plugin '{spec}': not a file, not in the plugin directories ({}), and not embedded. \
         Embedded plugins: {}. Run `runner plugins list` to see everything installed.",
        searched.join(", "),
        known.join(", ")
    ))
}

/// The embedded plugin file `name`'s bytes.
fn embedded_bytes(name: &str) -> Option<&'static [u8]> {
    embedded().iter().find(|(n, _, _)| *n == name).map(|(_, _, bytes)| *bytes)
}

/// A plugin file's bytes, refused past [`MAX_PLUGIN_BYTES`] (the largest first-party
/// plugin is under 2 MB; a multi-gigabyte file is the wrong file).
pub(crate) fn read_plugin(path: &Path) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    read_at_most(file, MAX_PLUGIN_BYTES)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .ok_or_else(|| format!("{} is larger than {} MiB, more than any plugin: is it the right file?", path.display(), MAX_PLUGIN_BYTES >> 20))
}

/// All of `reader` if it holds at most `max` bytes, else `None`, reading at most one byte
/// past `max` (a named pipe or a huge file is never read to its end).
fn read_at_most(reader: impl std::io::Read, max: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    reader.take(max + 1).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= max).then_some(bytes))
}

/// The largest plugin file read.
pub const MAX_PLUGIN_BYTES: u64 = 256 << 20;

/// Every `.wasm` in the plugin directories, in search order (earlier shadows later).
pub fn installed_files() -> Vec<PathBuf> {
    wasm_files_in(&plugin_dirs())
}

/// Every `.wasm` file in `dirs`, in order, each directory's sorted by name.
fn wasm_files_in(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut found: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "wasm") && p.is_file())
            .collect();
        found.sort();
        files.extend(found);
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locating a plugin reads none of it: a file past the size limit is found by
    /// `locate` (a run file's check that its plugins are installed) and refused only when
    /// `resolve` reads it for loading.
    #[test]
    fn locate_finds_a_file_it_does_not_read() {
        let (tmp, dir) = scratch("locate");
        let path = dir.join("huge.wasm");
        // Sparse: no disk is written for the hole.
        std::fs::File::create(&path).unwrap().set_len(MAX_PLUGIN_BYTES + 1).unwrap();
        let spec = path.to_str().unwrap();
        let located = locate(spec);
        let resolved = resolve(spec);
        drop(tmp);
        assert_eq!(located, Ok(("huge.wasm".to_string(), Source::Path(path))));
        assert!(resolved.unwrap_err().contains("larger than"));
        assert_eq!(locate("bf16"), Ok(("bf16.wasm".to_string(), Source::Embedded)));
        assert_eq!(resolve("bf16").unwrap().2, embedded_bytes("bf16.wasm").unwrap());
    }

    /// A fresh scratch directory, removed when the guard goes (also when the test fails).
    fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::Builder::new().prefix(&format!("runner-resolve-{name}-")).tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        (tmp, dir)
    }

    /// Zeros without end, refusing to be read past `left` bytes: reading it all would
    /// never finish.
    struct Endless {
        left: usize,
    }

    impl std::io::Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.left);
            if n == 0 {
                return Err(std::io::Error::other("read past the bound"));
            }
            buf[..n].fill(0);
            self.left -= n;
            Ok(n)
        }
    }

    /// The size bound at its edge: `max` bytes are read whole, `max + 1` refused, and an
    /// endless source is read only one byte past `max` (a read without the bound, or with
    /// the comparison moved by one, fails here; the plugin-sized files above do not tell).
    #[test]
    fn a_plugin_file_is_read_to_its_bound_and_no_further() {
        let read = |bytes: &[u8]| read_at_most(bytes, 16).unwrap();
        assert_eq!(read(&[7; 16]), Some(vec![7; 16]));
        assert_eq!(read(&[7; 17]), None);
        assert_eq!(read(&[]), Some(Vec::new()));
        assert_eq!(read_at_most(Endless { left: 17 }, 16).unwrap(), None);
    }

    /// `$RUNNER_PLUGIN_PATH`'s entries in order between `./plugins/dist` and the user data
    /// dir, its empty entries dropped (not the working directory).
    #[cfg(unix)]
    #[test]
    fn the_plugin_directories_are_in_order_and_never_the_working_directory() {
        use std::ffi::OsStr;
        let dirs = dirs_from(Some(OsStr::new("/x::/y:")), Some(PathBuf::from("/d")));
        assert_eq!(dirs, ["plugins/dist", "/x", "/y", "/d"].map(PathBuf::from));
        assert_eq!(dirs_from(None, None), [PathBuf::from("plugins/dist")]);
    }

    /// The search order at each step: a plugin directory before the embedded plugins, an
    /// earlier directory before a later one, an entry named like a plugin that is no file
    /// skipped; the embedded plugin of exactly the name given (not one whose name begins
    /// with it); a spec that looks like a path is not looked up in the directories.
    #[test]
    fn plugin_directories_are_searched_in_order_before_the_embedded_plugins() {
        let ((_a, a), (_b, b)) = (scratch("order-a"), scratch("order-b"));
        std::fs::write(a.join("mine.wasm"), b"a").unwrap();
        std::fs::write(b.join("mine.wasm"), b"b").unwrap();
        std::fs::create_dir(a.join("bf16.wasm")).unwrap();
        std::fs::write(b.join("bf16.wasm"), b"b").unwrap();
        let dirs = [a.clone(), b.clone()];
        let path = |p: PathBuf, name: &str| Ok((name.to_string(), Source::Path(p.join(name))));
        assert_eq!(locate_in("mine", &dirs), path(a.clone(), "mine.wasm"));
        assert_eq!(locate_in("bf16.wasm", &dirs), path(b.clone(), "bf16.wasm"));
        assert_eq!(locate_in("bf16", &[]), Ok(("bf16.wasm".to_string(), Source::Embedded)));
        assert!(locate_in("bf1", &dirs).unwrap_err().starts_with("no plugin 'bf1'"));
        // An absolute spec without the extension names no file; `b.join` of it would.
        let spec = a.join("mine");
        let spec = spec.to_str().unwrap();
        assert!(locate_in(spec, std::slice::from_ref(&b)).unwrap_err().starts_with("no plugin"), "{spec}");
        let files = wasm_files_in(&[b.clone(), a.join("missing"), a.clone()]);
        assert_eq!(files, [b.join("bf16.wasm"), b.join("mine.wasm"), a.join("mine.wasm")]);
    }

    /// Only `.wasm` files are installed plugins, each directory's sorted by name.
    #[test]
    fn installed_files_are_the_wasm_files_sorted() {
        let (_d, d) = scratch("files");
        for name in ["c.wasm", "a.wasm", "notes.txt", "d.wasm", "b.wasm"] {
            std::fs::write(d.join(name), b"").unwrap();
        }
        std::fs::create_dir(d.join("e.wasm")).unwrap();
        let files = wasm_files_in(std::slice::from_ref(&d));
        assert_eq!(files, ["a.wasm", "b.wasm", "c.wasm", "d.wasm"].map(|n| d.join(n)));
    }

    /// A symbolic link loop at the path is said to be unreadable, not "no plugin".
    #[cfg(unix)]
    #[test]
    fn a_link_loop_is_named_as_unreadable() {
        let (_d, d) = scratch("loop");
        let link = d.join("loop.wasm");
        std::os::unix::fs::symlink(&link, &link).unwrap();
        let m = locate_in(link.to_str().unwrap(), &[]).unwrap_err();
        assert!(m.starts_with("cannot read"), "{m}");
    }
}
