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
    let mut dirs = vec![PathBuf::from("plugins/dist")];
    if let Some(path) = std::env::var_os("RUNNER_PLUGIN_PATH") {
        dirs.extend(std::env::split_paths(&path).filter(|p| !p.as_os_str().is_empty()));
    }
    if let Some(data) = user_data_dir() {
        dirs.push(data);
    }
    dirs
}

/// `$XDG_DATA_HOME/runner/plugins`, else `~/.local/share/runner/plugins`.
pub fn user_data_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))?;
    Some(base.join("runner").join("plugins"))
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
        for dir in plugin_dirs() {
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
    let searched: Vec<String> = plugin_dirs()
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
fn read_plugin(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_PLUGIN_BYTES + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_PLUGIN_BYTES {
        return Err(format!("{} is larger than {} MiB, more than any plugin: is it the right file?", path.display(), MAX_PLUGIN_BYTES >> 20));
    }
    Ok(bytes)
}

/// The largest plugin file read.
pub const MAX_PLUGIN_BYTES: u64 = 256 << 20;

/// Every `.wasm` in the plugin directories, in search order (earlier shadows later).
pub fn installed_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in plugin_dirs() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
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
        let dir = std::env::temp_dir().join(format!("runner-locate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("huge.wasm");
        // Sparse: no disk is written for the hole.
        std::fs::File::create(&path).unwrap().set_len(MAX_PLUGIN_BYTES + 1).unwrap();
        let spec = path.to_str().unwrap();
        let located = locate(spec);
        let resolved = resolve(spec);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(located, Ok(("huge.wasm".to_string(), Source::Path(path))));
        assert!(resolved.unwrap_err().contains("larger than"));
        assert_eq!(locate("bf16"), Ok(("bf16.wasm".to_string(), Source::Embedded)));
        assert_eq!(resolve("bf16").unwrap().2, embedded_bytes("bf16.wasm").unwrap());
    }
}
