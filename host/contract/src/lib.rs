//! The rules of the plugin contract (`wit/`), written once.
//!
//! The host binds the WIT with wasmtime's `bindgen!` and the guest SDK with wit-bindgen's
//! `generate!`: two families of Rust types generated from one contract, with the same names
//! and fields. A rule written against one family would have to be written again for the
//! other, and the copies drift (the SDK once accepted hyperparameters the host refused). So
//! each rule is written here once, as a macro over the path of a generated module, and both
//! sides expand it against their own types:
//!
//! - [`workload_rules!`]: hyperparameters, variants, reference layouts;
//! - [`reference_layout!`]: a reference layout's defaults (every degree 1, options off);
//! - [`cost_rules!`]: offerings, quotes (money, currency, the list-price floor);
//! - [`precision_rules!`]: plans (formats, blocks, scales against the device) and actions;
//! - [`graph_to_ir!`]: a plugin's graph into the host's `runner_graph` IR, with the size
//!   bounds that keep every later count inside u64;
//! - [`text`]: plain functions for the strings a plugin returns (names, free text, dates).
//!
//! Every rule answers with a message that names the field and the value, escaped, so a
//! hostile string never reaches a terminal raw. Bounds on counts and sizes live in
//! [`limits`]; they keep the host's work linear in what it asked for.

pub mod cost;
pub mod ir;
pub mod precision;
pub mod text;
pub mod workload;

/// Bounds on what a plugin may return. Each is far above any real model or price list
/// (Llama 3.1 405B's training graph has ~2,000 operations; a cloud lists ~100 instances),
/// and far below what would make the host slow or its arithmetic overflow.
/// What the local measurement of a training step runs (`host/runner/src/measure.rs`), so
/// a model plugin's tests check its CPU proxy against the host's own budget.
pub mod measurement {
    /// Transformer layers run; the rest is composed from the per-layer time.
    pub const LAYERS_RUN: u32 = 2;
    /// f32 weights, gradients and two AdamW moments.
    pub const BYTES_PER_PARAM: u64 = 16;
    /// On the CPU: the layers' parameters at [`BYTES_PER_PARAM`] fit in 1 GiB (the default
    /// run stays well inside a 24 GiB, 2-core CI machine and under a minute), at sequences
    /// up to 256 and 2048 tokens a step.
    pub const CPU_PARAM_BUDGET_BYTES: u64 = 1 << 30;
    pub const CPU_MAX_SEQ: u32 = 256;
    pub const CPU_TOKENS: u32 = 2048;
    /// On a GPU: a budget an 80 GiB device holds with room for activations, the variant's
    /// own sequence up to 4096, 8192 tokens a step.
    pub const GPU_PARAM_BUDGET_BYTES: u64 = 24 << 30;
    pub const GPU_MAX_SEQ: u32 = 4096;
    pub const GPU_TOKENS: u32 = 8192;
}

pub mod limits {
    /// Variants per workload plugin, layouts per variant.
    pub const VARIANTS: usize = 1024;
    pub const LAYOUTS: usize = 256;
    /// Tensors and operations of one graph.
    pub const GRAPH_TENSORS: usize = 1 << 20;
    pub const GRAPH_OPS: usize = 1 << 20;
    /// Inputs, outputs and attributes of one operation; axes of one tensor.
    pub const OP_INPUTS: usize = 16;
    pub const OP_OUTPUTS: usize = 16;
    pub const OP_ATTRS: usize = 64;
    pub const RANK: usize = 8;
    /// Elements of one tensor, and of all tensors of a graph together: 2^50 elements is a
    /// petabyte at one byte each; below 2^56 in total, every sum and every product of two
    /// counts by a small factor the host forms stays inside u64.
    pub const TENSOR_ELEMENTS: u64 = 1 << 50;
    pub const GRAPH_ELEMENTS: u64 = 1 << 56;
    /// Offerings per cost plugin, prices per offering, lines and warnings per quote.
    pub const OFFERINGS: usize = 4096;
    pub const PRICES: usize = 1024;
    pub const QUOTE_LINES: usize = 256;
    pub const WARNINGS: usize = 32;
    pub const CAVEATS: usize = 8;
    /// Actions per step and entries per site selector.
    pub const ACTIONS: usize = 1024;
    pub const SELECTOR: usize = 4096;
    /// The opaque state a precision policy keeps between calls.
    pub const STATE_BYTES: usize = 1 << 20;
    /// Hyperparameter ceilings (astronomical values are refused, not computed with).
    pub const LAYERS: u32 = 10_000;
    pub const WIDTH: u32 = 1 << 20;
    pub const HEADS: u32 = 1 << 16;
    pub const VOCAB: u32 = 1 << 24;
    pub const EXPERTS: u32 = 1 << 16;
    /// Mamba-2 mixer ceilings: the state per head (d_state: 128 in Mamba-2 and Nemotron-H),
    /// the causal convolution's width (4) and the SSD scan's chunk (128 to 256).
    pub const SSM_STATE: u32 = 1 << 12;
    pub const CONV_KERNEL: u32 = 64;
    pub const SSM_CHUNK: u32 = 4096;
    pub const SEQ_LEN: u32 = 1 << 24;
    pub const TOKENS: f64 = 1e16;
    /// Learning rates a run trains at (a plugin's default, `runner train --lr`): no
    /// recipe publishes one outside them, and 1e-300 or 1e300 would print as 301 digits.
    pub const LEARNING_RATE: std::ops::RangeInclusive<f64> = 1e-8..=10.0;
    /// AdamW's decoupled weight decay (a plugin's default, `runner train --weight-decay`):
    /// recipes use 0 to 0.1; past 1 none publishes one, and 1e300 would print 301 digits.
    pub const WEIGHT_DECAY: std::ops::RangeInclusive<f64> = 0.0..=1.0;
    pub const GPUS: u32 = 1 << 20;
}
