//! `runner-kernels`: the CPU compute kernels of the workload runner.
//!
//! Every layer a dense, mixture-of-experts or Mamba-2 model needs for a training step,
//! written as plain f32 functions over row-major contiguous slices, in the style of
//! llm.c: each `*_forward` is immediately followed by its `*_backward` (the
//! vector-Jacobian product), and each forward documents what it saves for backward.
//! The executor strings these together; the CUDA backend mirrors the same functions in
//! CUDA C (`kernels/cuda/*.cu`, embedded by [`cuda`] and compiled at run time).
//!
//! # Brief overview
//!
//! - [`cpu::matmul`]: GEMM through faer (the only kernel that is not hand-written).
//! - [`cpu::embedding`], [`cpu::norm`], [`cpu::rope`], [`cpu::attention`],
//!   [`cpu::activation`], [`cpu::loss`]: the dense transformer layers.
//! - [`cpu::cp`]: context parallelism's token layout (which global positions a cp rank's
//!   rows and the all-gathered K/V rows hold), read by rotary and attention.
//! - [`cpu::moe`]: top-k router, token dispatch, grouped expert GEMM, weighted combine.
//! - [`cpu::ssm`]: Mamba-2's mixer: the causal depthwise conv1d with SiLU and the SSD
//!   selective scan (heads of P channels, B and C in G groups of state size N).
//! - [`cpu::adamw`]: the optimiser step (PyTorch `AdamW` semantics).
//! - [`cpu::precision`]: exact bf16 / FP8 storage emulation for precision policies.
//!
//! Shapes use one notation across the crate: B batch, T sequence, C channels,
//! H query heads, Hkv kv heads, D head dim, Dv value head dim, V vocabulary,
//! F ffn width, E experts, k experts per token, N = B*T rows.
//!
//! # Errors
//!
//! Callers are user-facing (shapes come from workload plugins), so no kernel panics
//! on bad input: every kernel checks its slice lengths and indices first and returns
//! [`KernelError`] before writing anything.
//!
//! # Examples
//!
//! ```
//! use runner_kernels::cpu::{matmul::{matmul, Gemm}, activation::gelu_forward};
//! // y = gelu(x · W^T) for x (2,3) and a Linear weight W (4,3)
//! let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let w = [0.1f32; 12];
//! let mut h = [0.0f32; 8];
//! matmul(&mut h, &x, &w, Gemm { m: 2, n: 4, k: 3, trans_a: false, trans_b: true }, false)?;
//! let mut y = [0.0f32; 8];
//! gelu_forward(&mut y, &h)?;
//! assert!((h[0] - 0.6).abs() < 1e-6);
//! # Ok::<(), runner_kernels::KernelError>(())
//! ```
#![warn(missing_docs)]

pub mod cpu;
pub mod cuda;

#[cfg(any(test, feature = "reference"))]
pub mod reference;

use std::fmt;

/// Why a kernel refused its arguments. Kernels validate everything before writing,
/// so on error the outputs are untouched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// A token or target id is not below the vocabulary size.
    TokenOutOfRange {
        /// The offending id.
        token: u32,
        /// The vocabulary size it had to be below.
        vocab: usize,
    },
    /// Slice lengths or shape parameters are inconsistent (the message says which).
    ShapeMismatch(String),
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelError::TokenOutOfRange { token, vocab } => {
                write!(f, "token id {token} out of range for vocabulary of {vocab}")
            }
            KernelError::ShapeMismatch(msg) => write!(f, "shape mismatch: {msg}"),
        }
    }
}

impl std::error::Error for KernelError {}

/// Shorthand for kernel results.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;

/// `ShapeMismatch` with a formatted message.
pub(crate) fn shape_err<T>(msg: impl Into<String>) -> Result<T> {
    Err(KernelError::ShapeMismatch(msg.into()))
}

/// Checks that slice `name` has exactly `want` elements.
pub(crate) fn check_len(name: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        shape_err(format!("{name} has {got} elements, expected {want}"))
    }
}

/// Product of shape dimensions, as an error instead of an overflow panic.
pub(crate) fn numel(dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| KernelError::ShapeMismatch(format!("shape {dims:?} overflows usize")))
}

/// Number of rows of a (rows, c) buffer: checks `c > 0` and that `len` is a multiple of `c`.
pub(crate) fn rows_of(name: &str, len: usize, c: usize) -> Result<usize> {
    if c == 0 {
        return shape_err(format!("{name}: row width must be > 0"));
    }
    if !len.is_multiple_of(c) {
        return shape_err(format!(
            "{name} has {len} elements, not a multiple of row width {c}"
        ));
    }
    Ok(len / c)
}
