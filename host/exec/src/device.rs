//! The backend trait: what the executor needs from a device, and nothing more.
//!
//! Candle's split: one trait, one implementation per backend side by side ([`crate::cpu`],
//! [`crate::cuda`]). The executor owns the schedule (which op runs when, which buffer
//! lives how long, where gradients accumulate); a device owns its buffers' memory and
//! runs one forward op or one backward step at a time on buffers the executor lends it.
//!
//! Conventions every device follows:
//! - Buffers hold f32 (every floating tensor, whatever its logical dtype: precision
//!   emulation is a later layer) or u32 (int32 graph tensors: tokens, targets, router
//!   indices).
//! - A fresh buffer from [`Device::alloc`] holds garbage; in debug and test builds the CPU
//!   fills it with NaN (u32::MAX for indices) so an element a kernel forgot to write fails
//!   the tests instead of reading as a plausible zero.
//! - [`GradTarget::accumulate`] says whether a backward step adds into the gradient
//!   buffer (a tensor read by several ops) or overwrites it (the first contribution).
//! - Every byte a device allocates is counted in [`MemStats`], so the executor can report
//!   its real peak.

use std::collections::HashMap;

use runner_graph::autodiff::BackwardStep;
use runner_graph::{Graph, GraphError, TensorId};
use runner_kernels::KernelError;
use runner_kernels::cpu::adamw::AdamW;
use serde::Serialize;

/// Why execution failed. Nothing in this crate panics on a bad graph or bad input.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The graph failed validation or differentiation.
    #[error("invalid graph: {0}")]
    Graph(#[from] GraphError),
    /// A kernel refused its arguments (the op names where).
    #[error("operation '{op}': {source}")]
    Kernel { op: String, source: KernelError },
    /// Inputs missing, unknown, of the wrong size or out of range.
    #[error("input: {0}")]
    Input(String),
    /// The op exists in the IR but this backend cannot run it.
    #[error("operation '{op}' ({kind}) is not supported on {device}: {why}")]
    Unsupported {
        op: String,
        kind: String,
        device: String,
        why: String,
    },
    /// Built without the CUDA backend.
    #[error(
        "the CUDA backend is not built into this binary (built without CUDA; a later issue adds it)"
    )]
    NoCuda,
    /// Calls out of order (backward before forward) or an internal inconsistency.
    #[error("executor state: {0}")]
    State(String),
}

/// Element type of a device buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Elem {
    F32,
    U32,
}

/// Bytes a device holds now and at most since the last [`Device::reset_peak`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemStats {
    pub current_bytes: u64,
    pub peak_bytes: u64,
    /// Allocations made (a count, for spotting per-step churn).
    pub allocations: u64,
}

/// What the executor needs to know of a device buffer.
pub trait DeviceBuffer {
    /// Elements held.
    fn len(&self) -> usize;
    /// Element type.
    fn elem(&self) -> Elem;
    /// Whether it holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Gradient output of a backward step: the buffer and whether to add into it.
pub struct GradTarget<'a, B> {
    pub buf: &'a mut B,
    pub accumulate: bool,
}

/// MoE routing plans, by the router-indices tensor they belong to, built in the forward
/// and read in both passes.
#[derive(Debug)]
pub struct Plans<P> {
    /// The dispatch's plan (this rank's token copies sorted over all experts), read by
    /// the dispatch and the combine, and by the grouped linears without expert
    /// parallelism.
    pub routed: HashMap<TensorId, P>,
    /// On an expert-parallel rank: the plan over the rows the dispatch's all-to-all
    /// received (this rank's experts, each one's rows contiguous), which the grouped
    /// linears between the two all-to-alls run on instead.
    pub received: HashMap<TensorId, P>,
}

impl<P> Default for Plans<P> {
    fn default() -> Self {
        Plans {
            routed: HashMap::new(),
            received: HashMap::new(),
        }
    }
}

impl<P> Plans<P> {
    pub fn new() -> Plans<P> {
        Plans::default()
    }
    /// Forget every plan.
    pub fn clear(&mut self) {
        self.routed.clear();
        self.received.clear();
    }
    /// The plan a grouped linear reading indices `idx` runs on: the received one on an
    /// expert-parallel rank, the routed one otherwise.
    pub fn for_experts(&self, idx: TensorId) -> Option<&P> {
        self.received.get(&idx).or_else(|| self.routed.get(&idx))
    }
}

/// Everything one backward step reads and writes, per slot of the forward op.
pub struct BackwardIo<'a, D: Device + ?Sized> {
    /// Forward inputs that are still alive (saved, weights, graph inputs); `None` otherwise.
    pub inputs: Vec<Option<&'a D::Buffer>>,
    /// Forward outputs that are still alive.
    pub outputs: Vec<Option<&'a D::Buffer>>,
    /// The op's saved statistics, in the order of the plan's `aux`.
    pub aux: &'a [D::Buffer],
    /// Gradient of each forward output (`None`: zero).
    pub grads_in: Vec<Option<&'a D::Buffer>>,
    /// Gradient to produce for each forward input (`None`: not needed).
    pub grads_out: Vec<Option<GradTarget<'a, D::Buffer>>>,
    pub plans: &'a Plans<D::Plan>,
}

/// A compute backend.
pub trait Device {
    /// A buffer in device memory.
    type Buffer: DeviceBuffer;
    /// A device-resident MoE routing plan.
    type Plan;

    /// Human-readable name, e.g. "cpu (2 threads)".
    fn name(&self) -> String;

    /// A buffer of `len` elements, uninitialised (poisoned in debug builds).
    ///
    /// # Errors
    /// Out of memory, or a backend that is not available.
    fn alloc(&self, elem: Elem, len: usize) -> Result<Self::Buffer, ExecError>;
    /// Set every element to zero.
    fn zero(&self, buf: &mut Self::Buffer) -> Result<(), ExecError>;
    /// Copy host f32 data in (lengths must match).
    fn write_f32(&self, buf: &mut Self::Buffer, data: &[f32]) -> Result<(), ExecError>;
    /// Copy host u32 data in (lengths must match).
    fn write_u32(&self, buf: &mut Self::Buffer, data: &[u32]) -> Result<(), ExecError>;
    /// Copy an f32 buffer out.
    fn read_f32(&self, buf: &Self::Buffer) -> Result<Vec<f32>, ExecError>;
    /// dst += src, elementwise (gradient accumulation).
    fn add_assign(&self, dst: &mut Self::Buffer, src: &Self::Buffer) -> Result<(), ExecError>;
    /// Round an f32 buffer in place to the values `dtype` can store (round-to-nearest-even),
    /// emulating that storage exactly while computing in f32: BF16 and F16 directly; FP8
    /// E4M3/E5M2 with a per-tensor current scale (Transformer Engine's
    /// `Float8CurrentScaling`: fp8_max / amax of this tensor); MXFP8 with one E8M0 scale
    /// (RCEIL) per 32 elements of each row of length `row` (the last dimension). F32,
    /// integers and NVFP4 (whose two-level scales belong to the precision policy) are left
    /// as they are.
    fn round_to_storage(
        &self,
        buf: &mut Self::Buffer,
        dtype: runner_graph::DType,
        row: usize,
    ) -> Result<(), ExecError>;

    /// Run forward op `op` of `g`: read `inputs` (one per op input), overwrite `outputs`
    /// (one per op output, allocated by the executor), push the statistics the backward
    /// needs onto `aux` (in the order of the plan's [`runner_graph::autodiff::Aux`]) and
    /// record routing plans in `plans`.
    ///
    /// # Errors
    /// A kernel's refusal (bad ids, inconsistent shapes) or an op this backend lacks.
    fn forward(
        &self,
        g: &Graph,
        op: usize,
        inputs: &[&Self::Buffer],
        outputs: &mut [Self::Buffer],
        aux: &mut Vec<Self::Buffer>,
        plans: &mut Plans<Self::Plan>,
    ) -> Result<(), ExecError>;

    /// Run one backward step.
    ///
    /// # Errors
    /// As [`Device::forward`], or a saved tensor the step needs that is missing.
    fn backward(
        &self,
        g: &Graph,
        step: &BackwardStep,
        io: BackwardIo<'_, Self>,
    ) -> Result<(), ExecError>;

    /// Rows per expert of routing plan `plan` (for the expert-parallel exchange, which
    /// runs on the host).
    ///
    /// # Errors
    /// A backend that cannot read it back.
    fn plan_counts(&self, plan: &Self::Plan) -> Result<Vec<usize>, ExecError>;

    /// A plan over rows that are already grouped by expert: expert e owns the next
    /// `counts[e]` rows (the rows an expert-parallel rank received).
    ///
    /// # Errors
    /// No experts, or more rows than a plan can index.
    fn presorted_plan(&self, counts: &[usize]) -> Result<Self::Plan, ExecError>;

    /// One AdamW step (`step` counts from 1) on a parameter tensor.
    ///
    /// # Errors
    /// Mismatched buffers.
    fn adamw(
        &self,
        param: &mut Self::Buffer,
        grad: &Self::Buffer,
        m: &mut Self::Buffer,
        v: &mut Self::Buffer,
        h: &AdamW,
        step: u32,
    ) -> Result<(), ExecError>;

    /// Wait for queued work (a no-op on the CPU, whose kernels return when done).
    ///
    /// # Errors
    /// An asynchronous failure of earlier work.
    fn synchronize(&self) -> Result<(), ExecError>;

    /// Bytes held now and at peak.
    fn memory(&self) -> MemStats;
    /// Start a new peak measurement from the current holding.
    fn reset_peak(&self);
}
