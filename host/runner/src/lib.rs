//! `runner`: a workload runner for AI training benchmarks and total cost of ownership.
//!
//! A run file (or the command line) names a workload plugin (the model), a precision
//! policy and the clouds to price. The [`session`] loads those plugins into the sandboxed
//! [`plugin`] host, measures what it can on the local device, projects the model onto a
//! cluster, prices every cloud and hands a [`report`] to the terminal and to files.
//!
//! Core concepts:
//! - [`plugin`]: finding, checking, compiling and sandboxing WASM plugins.
//! - [`runfile`]: the TOML run file, parsed strictly (unknown keys are errors).
//! - [`gpus`]: device profiles (peak FLOP/s per precision) the projection uses.
//! - [`local_device`]: the `--device` the local measurement runs on.
//! - [`session`]: one run, end to end.
//! - [`report`]: tables, JSON and CSV.

pub mod gpus;
pub mod local_device;
pub mod measure;
pub mod plugin;
pub mod report;
pub mod runfile;
pub mod session;
