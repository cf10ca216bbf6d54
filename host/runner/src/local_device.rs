//! The device the local measurement runs on (`--device auto|cpu|cuda[:N]`), set once by
//! the command line; `auto` when nothing set it.

use std::sync::OnceLock;

use runner_exec::select::DeviceSpec;

static REQUESTED: OnceLock<DeviceSpec> = OnceLock::new();

/// Record the `--device` choice (the first call wins).
pub fn set_requested(spec: DeviceSpec) {
    let _ = REQUESTED.set(spec);
}

/// The `--device` choice, `auto` by default.
pub fn requested() -> DeviceSpec {
    REQUESTED.get().copied().unwrap_or_default()
}
