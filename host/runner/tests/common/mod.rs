//! What the runner's integration tests share: a scratch directory of their own, removed
//! when the test ends, also when it fails (before, every run left its directories in /tmp).

use std::ffi::OsStr;
use std::ops::Deref;
use std::path::Path;

/// A fresh, empty directory that is removed when this guard is dropped. Derefs to its
/// path, so `dir.join(..)`, `&dir` as a `&Path` and `current_dir(&dir)` and `env("HOME", &dir)` read as
/// before.
pub struct Scratch(tempfile::TempDir);

/// A new scratch directory named `runner-{suite}-{name}-…` in the system's temp directory.
pub fn scratch(suite: &str, name: &str) -> Scratch {
    Scratch(tempfile::Builder::new().prefix(&format!("runner-{suite}-{name}-")).tempdir().unwrap())
}

impl Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<OsStr> for Scratch {
    fn as_ref(&self) -> &OsStr {
        self.0.path().as_os_str()
    }
}
