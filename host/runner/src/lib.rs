//! `runner`: a workload runner for AI training benchmarks and total cost of ownership.
//!
//! A run file (or the command line) names a workload plugin (the model), the GPU types
//! and precisions to compare and the clouds to price. The [`explore`]r loads those plugins
//! into the sandboxed [`plugin`] host, measures what it can on the local device, projects
//! the model onto each GPU count, prices every cloud and hands a [`report`] to the
//! terminal and to files; the [`history`] keeps every run.
//!
//! Core concepts:
//! - [`plugin`]: finding, checking, compiling and sandboxing WASM plugins (the
//!   `runner-plugin-host` crate, re-exported under its old path).
//! - [`runfile`]: the TOML run file, parsed strictly (unknown keys are errors).
//! - [`project`]: the performance model (`runner_project`) fed by the plugins: models
//!   found by name, precision plans, GPU profiles, reference layouts.
//! - [`local_device`]: the `--device` the local measurement runs on.
//! - [`explore`]: one run, end to end: series of rows, sweet spots, comparisons, goals.
//! - [`pricing`]: a cloud's cheapest quote for a row, with where every number came from.
//! - [`prices`]: the list prices themselves, per GPU-hour across the clouds (`runner prices`).
//! - [`report`]: tables, JSON, CSV and HTML with charts.
//! - [`history`]: runs kept in SQLite; resume, show, compare.
//! - [`train`]: a small model trained on real text under precision policies.

pub mod explore;
pub mod history;
pub mod local_device;
pub mod input;
pub mod measure;
pub use runner_plugin_host as plugin;
pub mod pricing;
pub mod prices;
pub mod project;
pub mod report;
pub mod runfile;
pub mod train;
