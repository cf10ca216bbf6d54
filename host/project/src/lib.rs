//! The runner's performance model: how long a training step of a model takes on a GPU
//! cluster under a parallel layout, how much memory each GPU needs, and which layout is
//! best at each GPU count.
//!
//! It reads the same sharded per-rank graphs the executor runs (`runner_graph::shard`),
//! so what is counted, run and projected cannot drift apart, and composes them with a
//! device profile and a schedule:
//!
//! ```text
//! GraphSource (plugin) --> Model (depth: which layers are alike; reduced graphs)
//!                            |  per ShardKey (tp, cp, ep, etp, SP, MBS)
//!                            v
//!                          Template (sharded rank graph: GEMMs, attention, bytes,
//!                            |       collectives, activations, parameters per layer)
//!    Plan (precision) ------>+<------ GpuProfile (peaks, HBM, NVLink, NICs, efficiency)
//!                            v
//!                          Costed (per-layer seconds and bytes, prefix sums)
//!                            |  per Schedule (pp, vp, dp, GBS, recompute, optimizer
//!                            v  sharding, overlaps)
//!                          Projection (step time, breakdown, memory, fits)
//! ```
//!
//! Core items: [`profile::Profiles`] and [`profile::GpuProfile`] (device and cluster
//! data, `data/gpus.toml`), [`model::Model`] over a [`model::GraphSource`],
//! [`precision::Plan`], [`template::Template`], [`step::Costed::evaluate`] →
//! [`step::Projection`], [`search::search`], [`calibrate`] (fit efficiencies to
//! published runs), [`published`] (the published runs' file), [`measured`] (per-op
//! times measured on a device: the file, where it holds, the GEMM and memory fit) and
//! [`collectives`] (a `bench collectives` sweep, or nccl-tests' own output, and the
//! network-tier fit).

pub mod calibrate;
pub mod collectives;
pub mod comm;
pub mod depth;
mod file_kind;
pub mod measured;
pub mod model;
mod nccl_tests;
pub mod precision;
pub mod profile;
pub mod project;
pub mod published;
pub mod search;
pub mod spelling;
pub mod step;
pub mod template;
#[doc(hidden)]
pub mod toy;
