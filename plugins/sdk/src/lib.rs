//! The runner's guest SDK: write a plugin in plain Rust.
//!
//! A plugin is one crate of type `cdylib`, built for `wasm32-wasip2`, that enables exactly
//! one feature of this crate (`workload`, `precision` or `cost`), implements that world's
//! `Guest` trait, and calls the matching export macro:
//!
//! ```ignore
//! use runner_plugin_sdk::cost::*;
//!
//! struct MyCloud;
//! impl Guest for MyCloud {
//!     fn provider() -> Provider { Provider { name: "mycloud".into(), display_name: "My Cloud".into() } }
//!     fn offerings() -> Vec<Offering> { vec![/* ... */] }
//!     fn quote(request: QuoteRequest) -> Result<Quote, String> { standard_quote(&Self::offerings(), &request) }
//! }
//! runner_plugin_sdk::export_cost!(MyCloud);
//! ```
//!
//! Core concepts:
//! - [`workload`]: model families, hyperparameters, reference layouts and the logical
//!   forward graph; [`workload::builder`] carries the shared transformer building blocks.
//! - [`precision`]: per-GEMM number formats and the reaction to each step's numerics.
//! - [`cost`]: a cloud's offerings and itemised quotes; [`cost::standard_quote`] implements
//!   the usual node-hours-with-billing-increment arithmetic.
//! - [`log`]: the one host function plugins may call.
//!
//! Plugins never see files, sockets, clocks or the environment: the host's sandbox grants
//! none, and the contracts need none.

#[doc(hidden)]
pub mod bindings;

#[cfg(feature = "workload")]
pub mod workload;

#[cfg(feature = "precision")]
pub mod precision;

#[cfg(feature = "cost")]
pub mod cost;

// export_workload!, export_precision! and export_cost! are defined in workload.rs,
// precision.rs and cost.rs (exported at the crate root): they export only in wasm builds,
// so plugins' native unit tests link.

#[cfg(any(feature = "workload", feature = "precision", feature = "cost"))]
pub mod log;

/// The contract version this SDK builds plugins against (the WIT package version).
pub const CONTRACT_VERSION: &str = "0.3.0";
