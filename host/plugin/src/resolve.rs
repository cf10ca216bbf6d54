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
/// Says every place that was searched and which plugins exist.
pub fn resolve(spec: &str) -> Result<(String, Source, Vec<u8>), String> {
    let path = Path::new(spec);
    if path.is_file() {
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| spec.into());
        return Ok((name, Source::Path(path.to_path_buf()), bytes));
    }
    let name = file_name(spec);
    let looks_like_path = spec.contains('/') || spec.contains(std::path::MAIN_SEPARATOR);
    if !looks_like_path {
        for dir in plugin_dirs() {
            let candidate = dir.join(&name);
            if candidate.is_file() {
                let bytes = std::fs::read(&candidate)
                    .map_err(|e| format!("cannot read {}: {e}", candidate.display()))?;
                return Ok((name, Source::Path(candidate), bytes));
            }
        }
        if let Some((n, _, bytes)) = embedded().iter().find(|(n, _, _)| *n == name) {
            return Ok((n.to_string(), Source::Embedded, bytes.to_vec()));
        }
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
