//! Logging into the host's log. The host tags each line with the plugin's name.

#[cfg(feature = "workload")]
use crate::bindings::workload::runner::plugin::log as imp;
#[cfg(all(feature = "precision", not(feature = "workload")))]
use crate::bindings::precision::runner::plugin::log as imp;
#[cfg(all(feature = "cost", not(any(feature = "workload", feature = "precision"))))]
use crate::bindings::cost::runner::plugin::log as imp;

/// Log at info level.
pub fn info(message: &str) {
    imp::log(imp::Level::Info, message);
}

/// Log at debug level.
pub fn debug(message: &str) {
    imp::log(imp::Level::Debug, message);
}

/// Log at warn level.
pub fn warn(message: &str) {
    imp::log(imp::Level::Warn, message);
}
