//! End-to-end tests of the runner library: one binary, one module per theme. CLI surface
//! tests live beside the binary in `host/runner/tests/cli.rs` (they need its path).

mod adapter;
mod cache;
mod contract;
mod explore;
mod hostile;
mod models;
mod sandbox;
mod sources;
mod train;
mod training;
mod util;
mod walkthrough;
mod workloads;
