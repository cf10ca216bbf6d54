//! `runner`: a workload runner for AI training benchmarks and total cost of ownership.
//!
//! A run file (or the command line) names a workload plugin (the model), a precision
//! policy and the clouds to price. The [`session`] loads those plugins into the sandboxed
//! [`plugin`] host, measures what it can on the local device, projects the model onto a
//! cluster, prices every cloud and hands a [`report`] to the terminal and to files.
//!
//! Core concepts:
//! - [`plugin`]: finding, checking, compiling and sandboxing WASM plugins (the
//!   `runner-plugin-host` crate, re-exported under its old path).
//! - [`runfile`]: the TOML run file, parsed strictly (unknown keys are errors).
//! - [`project`]: the performance model (`runner_project`) fed by the plugins: models
//!   found by name, precision plans, GPU profiles, reference layouts.
//! - [`local_device`]: the `--device` the local measurement runs on.
//! - [`session`]: one run, end to end.
//! - [`report`]: tables, JSON and CSV.
//! - [`train`]: a small model trained on real text under precision policies.

pub mod local_device;
pub mod measure;
pub use runner_plugin_host as plugin;
pub mod project;
pub mod report;
pub mod runfile;
pub mod session;
pub mod train;
