//! The backend trait: device memory, kernels on device buffers, and device clocks;
//! nothing about graphs.
//!
//! Candle's split: one trait, one implementation per backend side by side
//! ([`crate::cpu`], [`crate::cuda`]). The executor owns the schedule (which op runs when,
//! which buffer lives how long, where gradients accumulate) and, in
//! `executor/ops.rs`, the mapping of graph ops onto these kernels: attribute parsing and
//! gradient staging live there once, for every backend. A device owns its buffers'
//! memory and runs kernels on them, queued on its stream in call order.
//!
//! Conventions every device follows:
//! - Buffers hold one element type ([`Elem`]): f32, bf16, f16, FP8 (E4M3/E5M2, with the
//!   tensor's scale stored beside the codes: `x ≈ decode(q) / scale`, Transformer
//!   Engine's convention) or int32 (tokens, targets, router indices; ids are
//!   non-negative and read as u32). The executor computes in f32; the narrower types
//!   are for GEMM operands ([`Device::matmul`] takes any float pair the backend
//!   supports) and storage ([`Device::cast`]).
//! - Every kernel keeps the name, argument order and shape notation of its CPU function
//!   in `runner_kernels::cpu` (and its CUDA C twin in `kernels/cuda/`), and the same
//!   write mode: a `d*` output named "adds into" accumulates, every other output is
//!   overwritten.
//! - A fresh buffer from [`Device::alloc`] holds garbage; in debug and test builds the CPU
//!   fills it with NaN (u32::MAX for ints) so an element a kernel forgot to write fails
//!   the tests instead of reading as a plausible zero.
//! - Kernels may run asynchronously: results are ordered on the device's stream, and a
//!   read back to the host ([`Device::read_f32`]) waits for them. Time is measured with
//!   [`Device::record`] events (host clocks on the CPU, CUDA events on a GPU), so
//!   per-op timing does not synchronise after every op.
//! - Every byte a device allocates is counted in [`MemStats`], so the executor can report
//!   its real peak.

use std::collections::HashMap;

use runner_graph::{DType, GraphError, TensorId};
use runner_kernels::KernelError;
use runner_kernels::cpu::adamw::{AdamW, Scalars, scalars};
use runner_kernels::cpu::attention::Attn;
use runner_kernels::cpu::matmul::Gemm;
use runner_kernels::cpu::moe::Router;
use runner_kernels::cpu::precision::Fp8Format;
use runner_kernels::cpu::quant::{QuantReport, QuantSpec};
use runner_kernels::cpu::rope::Rope;
use runner_kernels::cpu::ssm::{Conv1d, Ssm, SsmGrads, SsmInputs};
use serde::Serialize;

/// The recording of a device that cannot record ([`Device::Graph`] of the CPU).
#[derive(Debug)]
pub enum NoGraph {}

/// Why `device` cannot record a step.
pub fn no_graphs(device: &str) -> String {
    format!("{device} cannot record a CUDA graph: graphs need a GPU (--device cuda); run without --cuda-graph")
}

/// A buffer holding AdamW's scalars of step `step` ([`Device::adamw`]).
///
/// # Errors
/// `step` is 0, or the device fails.
pub fn adamw_scalars<D: Device + ?Sized>(dev: &D, h: &AdamW, step: u32) -> Result<D::Buffer, ExecError> {
    let mut b = dev.alloc(Elem::F32, Scalars::WORDS)?;
    write_adamw_scalars(dev, &mut b, h, step)?;
    Ok(b)
}

/// Write AdamW's scalars of step `step` into `buf` (of [`Scalars::WORDS`] f32).
///
/// # Errors
/// `step` is 0, or the device fails.
pub fn write_adamw_scalars<D: Device + ?Sized>(dev: &D, buf: &mut D::Buffer, h: &AdamW, step: u32) -> Result<(), ExecError> {
    let s = scalars(h, step).map_err(|source| ExecError::Kernel { op: "adamw".into(), source })?;
    dev.write_f32(buf, &s.words())
}

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
    /// The CUDA backend is not usable here: not built in, or a driver, library or
    /// device is missing (the message names which and what to do).
    #[error("{0}")]
    NoCuda(String),
    /// A device call failed (CUDA error, NCCL error, out of device memory).
    #[error("{device}: {what}")]
    Device { device: String, what: String },
    /// Calls out of order (backward before forward) or an internal inconsistency.
    #[error("executor state: {0}")]
    State(String),
}

/// Element type of a device buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Elem {
    F32,
    BF16,
    F16,
    /// OCP E4M3FN codes with a per-tensor scale.
    F8E4M3,
    /// OCP E5M2 codes with a per-tensor scale.
    F8E5M2,
    /// 32-bit integer ids (non-negative; read and written as u32).
    I32,
}

impl Elem {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            Elem::F32 | Elem::I32 => 4,
            Elem::BF16 | Elem::F16 => 2,
            Elem::F8E4M3 | Elem::F8E5M2 => 1,
        }
    }
    /// Whether it holds floating-point values.
    pub fn is_float(self) -> bool {
        self != Elem::I32
    }
    /// The FP8 format of an FP8 type.
    pub fn fp8(self) -> Option<Fp8Format> {
        match self {
            Elem::F8E4M3 => Some(Fp8Format::E4M3),
            Elem::F8E5M2 => Some(Fp8Format::E5M2),
            _ => None,
        }
    }
    /// The buffer type that stores graph dtype `d` exactly (`None`: MXFP8 and NVFP4,
    /// whose block scales are the precision policy's, are stored emulated in f32).
    pub fn of(d: DType) -> Option<Elem> {
        match d {
            DType::F32 => Some(Elem::F32),
            DType::BF16 => Some(Elem::BF16),
            DType::F16 => Some(Elem::F16),
            DType::Fp8E4M3 => Some(Elem::F8E4M3),
            DType::Fp8E5M2 => Some(Elem::F8E5M2),
            DType::I32 => Some(Elem::I32),
            DType::MxFp8 | DType::NvFp4 => None,
        }
    }
    /// Lower-case name (`f32`, `bf16`, `fp8-e4m3`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::BF16 => "bf16",
            Elem::F16 => "f16",
            Elem::F8E4M3 => "fp8-e4m3",
            Elem::F8E5M2 => "fp8-e5m2",
            Elem::I32 => "int32",
        }
    }
}

/// Bytes a device holds now and at most since the last [`Device::reset_peak`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemStats {
    pub current_bytes: u64,
    pub peak_bytes: u64,
    /// Allocations made (a count, for spotting per-step churn).
    pub allocations: u64,
}

/// An element-wise forward whose output the next GEMM reads as FP8 codes, for
/// [`Device::forward_with_cast`]: the arguments of [`Device::rmsnorm_forward`] or of an
/// MLP activation's forward.
pub enum CastProducer<'a, B> {
    RmsNorm { out: &'a mut B, rstd: &'a mut B, x: &'a B, w: &'a B, c: usize, eps: f32 },
    SwiGlu { out: &'a mut B, gate: &'a B, up: &'a B },
    GeGlu { out: &'a mut B, gate: &'a B, up: &'a B },
    Gelu { out: &'a mut B, x: &'a B },
    SquaredRelu { out: &'a mut B, x: &'a B },
}

/// A grouped linear's expert weights (E, n, k), as its GEMMs read them: one stacked
/// tensor, or one tensor per expert (the native FP8 route's codes: each expert's matrix
/// its own FP8 tensor with its own scale, as Transformer Engine keeps one FP8 weight per
/// expert).
pub enum ExpertWeights<'a, B> {
    Stacked(&'a B),
    Each(&'a [B]),
}

impl<'a, B: DeviceBuffer> ExpertWeights<'a, B> {
    /// Expert `e`'s (n, k) matrix of `per` = n·k elements: its buffer and the element
    /// where it starts (`None`: no such expert).
    pub fn expert(&self, e: usize, per: usize) -> Option<(&'a B, usize)> {
        match *self {
            ExpertWeights::Stacked(b) => (per.checked_mul(e.checked_add(1)?)? <= b.len()).then_some((b, e * per)),
            ExpertWeights::Each(bs) => bs.get(e).filter(|b| b.len() == per).map(|b| (b, 0)),
        }
    }
    /// Elements over all experts.
    pub fn len(&self) -> usize {
        match *self {
            ExpertWeights::Stacked(b) => b.len(),
            ExpertWeights::Each(bs) => bs.iter().map(DeviceBuffer::len).sum(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
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

/// Shapes of a concat along the last axis whose leading axes broadcast (size 1 against
/// the output's): output, first and second input.
#[derive(Clone, Copy, Debug)]
pub struct ConcatShapes<'a> {
    pub out: &'a [u64],
    pub a: &'a [u64],
    pub b: &'a [u64],
}

impl ConcatShapes<'_> {
    /// The shapes checked against the buffers' element counts (`None`: a gradient not
    /// asked for), one rule for every backend, since [`Device`] promises an error where a
    /// row loop would panic on a slice or read a wrong row (on a GPU: out of bounds): one
    /// rank, the last axes adding up, every leading axis of an input 1 (broadcast) or the
    /// output's, each buffer holding its shape's elements. Returns the last axes (a, b, out).
    ///
    /// # Errors
    /// [`ExecError::State`] naming kernel `k`, the shapes and the buffers' lengths.
    pub fn dims(&self, k: &str, out: usize, a: Option<usize>, b: Option<usize>) -> Result<(usize, usize, usize), ExecError> {
        let last = |s: &[u64]| s.last().copied().unwrap_or(1) as usize;
        let (la, lb, lo) = (last(self.a), last(self.b), last(self.out));
        let r = self.out.len().saturating_sub(1);
        let broadcasts = |x: &[u64]| x.len() == self.out.len() && x[..r].iter().zip(&self.out[..r]).all(|(&d, &o)| d == 1 || d == o);
        let holds = |sh: &[u64], len: Option<usize>| {
            len.is_none_or(|n| sh.iter().try_fold(1u64, |p, &d| p.checked_mul(d)) == Some(n as u64))
        };
        if la.checked_add(lb) != Some(lo) || !broadcasts(self.a) || !broadcasts(self.b) || !holds(self.out, Some(out)) || !holds(self.a, a) || !holds(self.b, b) {
            return Err(ExecError::State(format!(
                "{k}: shapes {:?} + {:?} -> {:?} over buffers of {a:?} + {b:?} -> {out} elements",
                self.a, self.b, self.out
            )));
        }
        Ok((la, lb, lo))
    }
}

/// A compute backend: memory, kernels, clocks.
///
/// Errors: every method returns [`ExecError`] instead of panicking; a kernel refusing
/// its arguments returns [`ExecError::Kernel`] with `op` naming the kernel (the
/// executor rewrites it to name the graph op).
pub trait Device {
    /// A buffer in device memory.
    type Buffer: DeviceBuffer;
    /// A device-resident MoE routing plan.
    type Plan;
    /// A point on the device's stream, for timing ([`Device::record`]).
    type Event;
    /// What a quantisation did, kept where the device keeps it until
    /// [`Device::read_quant`] (the CPU: the report itself; CUDA: counters in device
    /// memory), so that quantising a GEMM operand does not wait for the device.
    type QuantStats;
    /// A recorded sequence of this device's work, replayed by [`Device::launch`] (a CUDA
    /// graph); [`NoGraph`] on a device that cannot record.
    type Graph: Send;

    /// Human-readable name, e.g. "cpu (2 threads)" or "cuda:0 (NVIDIA H200, sm_90)".
    fn name(&self) -> String;

    // ---- memory -------------------------------------------------------------------

    /// A buffer of `len` elements of `elem`, uninitialised (poisoned in debug builds).
    ///
    /// # Errors
    /// Out of memory.
    fn alloc(&self, elem: Elem, len: usize) -> Result<Self::Buffer, ExecError>;
    /// Set every element to zero.
    fn zero(&self, buf: &mut Self::Buffer) -> Result<(), ExecError>;
    /// Copy host f32 data in (lengths must match), converting to the buffer's float
    /// type (round to nearest even; FP8 with current scaling from `data`'s amax).
    fn write_f32(&self, buf: &mut Self::Buffer, data: &[f32]) -> Result<(), ExecError>;
    /// Copy host ids into an int32 buffer (lengths must match).
    fn write_u32(&self, buf: &mut Self::Buffer, data: &[u32]) -> Result<(), ExecError>;
    /// A float buffer's values as f32 (exact: every stored type widens exactly; FP8
    /// divided by its scale). Waits for queued work.
    fn read_f32(&self, buf: &Self::Buffer) -> Result<Vec<f32>, ExecError>;
    /// An int32 buffer's ids. Waits for queued work.
    fn read_u32(&self, buf: &Self::Buffer) -> Result<Vec<u32>, ExecError>;
    /// `dst[dst_at..dst_at+len] = src[src_at..src_at+len]` (same element type).
    fn copy(
        &self,
        dst: &mut Self::Buffer,
        dst_at: usize,
        src: &Self::Buffer,
        src_at: usize,
        len: usize,
    ) -> Result<(), ExecError>;
    /// `dst` (b, a, c) ← `src` (a, b, c): swap the two outer axes (rank-major layouts
    /// of the collectives).
    fn transpose_outer(
        &self,
        dst: &mut Self::Buffer,
        src: &Self::Buffer,
        a: usize,
        b: usize,
        c: usize,
    ) -> Result<(), ExecError>;
    /// `dst` ← `src` converted to `dst`'s float type: round to nearest even; into FP8
    /// with per-tensor current scaling (scale = fp8_max / amax(src), kept with `dst`);
    /// out of FP8 divided by its scale.
    fn cast(&self, dst: &mut Self::Buffer, src: &Self::Buffer) -> Result<(), ExecError>;
    /// Whether FP8 GEMMs on this device run natively (tensor cores) and so are worth
    /// encoding operands for; the CPU dequantises them again.
    fn native_fp8(&self) -> bool {
        false
    }
    /// Bytes of device memory free for new allocations now (`None`: not known, as on
    /// the CPU, whose budget the caller sets).
    fn memory_free(&self) -> Option<u64> {
        None
    }
    /// The scale stored with an FP8 buffer (`x ≈ decode(q) / scale`); 1 otherwise.
    fn fp8_scale(&self, buf: &Self::Buffer) -> Result<f32, ExecError>;
    /// The amax recorded with an FP8 buffer by its last write (max |x| before
    /// quantisation: the cast's input, or a GEMM's f32 result); 0 otherwise.
    fn fp8_amax(&self, buf: &Self::Buffer) -> Result<f32, ExecError>;
    /// Round an f32 buffer in place to the values `dtype` can store (round-to-nearest-even),
    /// emulating that storage exactly while computing in f32: BF16 and F16 directly; FP8
    /// E4M3/E5M2 with a per-tensor current scale (Transformer Engine's
    /// `Float8CurrentScaling`: fp8_max / amax of this tensor); MXFP8 with one E8M0 scale
    /// (RCEIL) per 32 elements of each row of length `row` (the last dimension; a buffer
    /// that is not whole rows is refused, untouched). F32,
    /// integers and NVFP4 (whose two-level scales belong to the precision policy) are left
    /// as they are.
    fn round_to_storage(
        &self,
        buf: &mut Self::Buffer,
        dtype: DType,
        row: usize,
    ) -> Result<(), ExecError>;

    /// Quantise-dequantise an f32 buffer of (rows, cols), row-major, in place as `spec`
    /// says (a GEMM operand under its precision plan: FP8 per tensor with a given or a
    /// current scale, block scales, NVFP4, or a plain 16-bit float rounding), keeping
    /// what it did for [`Device::read_quant`] (`runner_kernels::cpu::quant::quantize` is
    /// the reference).
    fn quantize(
        &self,
        x: &mut Self::Buffer,
        rows: usize,
        cols: usize,
        spec: &QuantSpec,
    ) -> Result<Self::QuantStats, ExecError>;
    /// The reports of quantisations, in order, waiting for the device once for all of
    /// them (the executor reads a pass's worth at its end).
    fn read_quant(&self, stats: Vec<Self::QuantStats>) -> Result<Vec<QuantReport>, ExecError>;
    /// One quantisation's report, now.
    fn report(&self, stats: Self::QuantStats) -> Result<QuantReport, ExecError> {
        self.read_quant(vec![stats])?.pop().ok_or_else(|| ExecError::State("read_quant returned no report".into()))
    }
    /// [`Device::quantize`] of f32 `src` under a per-tensor FP8 `spec` (a given or a
    /// current scale, nearest even, in `dst`'s format) straight into the codes of `dst`,
    /// the scale and amax kept with it: the report `quantize` gives on a copy and the codes
    /// of that copy's values, in one pass over `src` and no f32 copy
    /// (`runner_kernels::cpu::quant::quantize_codes` is the reference). The native FP8
    /// route's cast of a GEMM operand (a given scale: delayed scaling, the values encode
    /// exactly on that scale's grid). The codes are of `src`'s `dst.len()` elements from
    /// element `src_at` on (0 but for one expert's matrix of a grouped linear's weights).
    fn quantize_fp8_codes(&self, dst: &mut Self::Buffer, src: &Self::Buffer, src_at: usize, spec: &QuantSpec) -> Result<Self::QuantStats, ExecError>;
    /// Run `producer` and cast its f32 output also to the FP8 codes of `codes` under
    /// per-tensor `spec` with a given scale (delayed scaling, so known before the producer
    /// runs), keeping what [`Device::quantize_fp8_codes`] of the output would. The
    /// default runs the two one after the other (the reference); a backend with fused
    /// kernels writes the output and its codes in one pass, the cast reading nothing back
    /// (Transformer Engine's fused norm / activation + cast).
    fn forward_with_cast(&self, producer: CastProducer<'_, Self::Buffer>, codes: &mut Self::Buffer, spec: &QuantSpec) -> Result<Self::QuantStats, ExecError> {
        let out = match producer {
            CastProducer::RmsNorm { out, rstd, x, w, c, eps } => {
                self.rmsnorm_forward(out, rstd, x, w, c, eps)?;
                out
            }
            CastProducer::SwiGlu { out, gate, up } => {
                self.swiglu_forward(out, gate, up)?;
                out
            }
            CastProducer::GeGlu { out, gate, up } => {
                self.geglu_forward(out, gate, up)?;
                out
            }
            CastProducer::Gelu { out, x } => {
                self.gelu_forward(out, x)?;
                out
            }
            CastProducer::SquaredRelu { out, x } => {
                self.squared_relu_forward(out, x)?;
                out
            }
        };
        self.quantize_fp8_codes(codes, out, 0, spec)
    }
    /// The random Hadamard transform along the rows of an f32 (rows, cols) buffer, in
    /// groups of `h` rows (`runner_kernels::cpu::quant::hadamard_rows`).
    fn hadamard_rows(
        &self,
        x: &mut Self::Buffer,
        rows: usize,
        cols: usize,
        h: usize,
        seed: u64,
    ) -> Result<(), ExecError>;

    // ---- element-wise -------------------------------------------------------------

    /// dst += src (gradient accumulation).
    fn add_assign(&self, dst: &mut Self::Buffer, src: &Self::Buffer) -> Result<(), ExecError>;
    /// buf *= s.
    fn scale(&self, buf: &mut Self::Buffer, s: f32) -> Result<(), ExecError>;
    /// out = a + b.
    fn add_forward(
        &self,
        out: &mut Self::Buffer,
        a: &Self::Buffer,
        b: &Self::Buffer,
    ) -> Result<(), ExecError>;
    /// out (rows, n) += bias (n) on every row.
    fn add_bias(&self, out: &mut Self::Buffer, bias: &Self::Buffer) -> Result<(), ExecError>;
    /// dbias (n) adds into: the column sums of dout (rows, n).
    fn bias_backward(&self, dbias: &mut Self::Buffer, dout: &Self::Buffer)
    -> Result<(), ExecError>;
    fn swiglu_forward(
        &self,
        out: &mut Self::Buffer,
        gate: &Self::Buffer,
        up: &Self::Buffer,
    ) -> Result<(), ExecError>;
    fn swiglu_backward(
        &self,
        dgate: &mut Self::Buffer,
        dup: &mut Self::Buffer,
        dout: &Self::Buffer,
        gate: &Self::Buffer,
        up: &Self::Buffer,
    ) -> Result<(), ExecError>;
    /// out = gelu(gate) · up.
    fn geglu_forward(
        &self,
        out: &mut Self::Buffer,
        gate: &Self::Buffer,
        up: &Self::Buffer,
    ) -> Result<(), ExecError>;
    fn geglu_backward(
        &self,
        dgate: &mut Self::Buffer,
        dup: &mut Self::Buffer,
        dout: &Self::Buffer,
        gate: &Self::Buffer,
        up: &Self::Buffer,
    ) -> Result<(), ExecError>;
    fn gelu_forward(&self, out: &mut Self::Buffer, x: &Self::Buffer) -> Result<(), ExecError>;
    fn gelu_backward(
        &self,
        dx: &mut Self::Buffer,
        dout: &Self::Buffer,
        x: &Self::Buffer,
    ) -> Result<(), ExecError>;
    fn squared_relu_forward(&self, out: &mut Self::Buffer, x: &Self::Buffer)
    -> Result<(), ExecError>;
    fn squared_relu_backward(
        &self,
        dx: &mut Self::Buffer,
        dout: &Self::Buffer,
        x: &Self::Buffer,
    ) -> Result<(), ExecError>;
    /// Concatenate along the last axis, leading axes broadcasting.
    fn concat_forward(
        &self,
        out: &mut Self::Buffer,
        a: &Self::Buffer,
        b: &Self::Buffer,
        s: ConcatShapes<'_>,
    ) -> Result<(), ExecError>;
    /// da, db add into (a broadcast input sums its copies' gradients).
    fn concat_backward(
        &self,
        da: Option<&mut Self::Buffer>,
        db: Option<&mut Self::Buffer>,
        dout: &Self::Buffer,
        s: ConcatShapes<'_>,
    ) -> Result<(), ExecError>;

    // ---- GEMM ---------------------------------------------------------------------

    /// c (m,n) = op(a) · op(b), or += with `accumulate`. `a` and `b` are f32, or a pair
    /// of narrower types (bf16·bf16, f16·f16, FP8·FP8 with their scales, not
    /// e5m2·e5m2); c is f32, bf16 or f16, or FP8 for FP8 operands without `accumulate`:
    /// then the f32 result is quantised with c's current scale (delayed scaling) and its
    /// amax recorded ([`Device::fp8_amax`]). Accumulation is f32.
    fn matmul(
        &self,
        c: &mut Self::Buffer,
        a: &Self::Buffer,
        b: &Self::Buffer,
        g: Gemm,
        accumulate: bool,
    ) -> Result<(), ExecError>;

    // ---- transformer layers ---------------------------------------------------------

    /// out (N,C) = table[tokens]; with `vocab_start`, the table is one vocab-parallel
    /// shard holding ids `vocab_start..vocab_start + rows` and other ids read zeros.
    fn embedding_forward(
        &self,
        out: &mut Self::Buffer,
        tokens: &Self::Buffer,
        table: &Self::Buffer,
        c: usize,
        vocab_start: Option<usize>,
    ) -> Result<(), ExecError>;
    /// dtable adds into (only this shard's ids under `vocab_start`).
    fn embedding_backward(
        &self,
        dtable: &mut Self::Buffer,
        dout: &Self::Buffer,
        tokens: &Self::Buffer,
        c: usize,
        vocab_start: Option<usize>,
    ) -> Result<(), ExecError>;
    fn rmsnorm_forward(
        &self,
        out: &mut Self::Buffer,
        rstd: &mut Self::Buffer,
        x: &Self::Buffer,
        w: &Self::Buffer,
        c: usize,
        eps: f32,
    ) -> Result<(), ExecError>;
    /// dx overwritten, dw adds into.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_backward(
        &self,
        dx: &mut Self::Buffer,
        dw: &mut Self::Buffer,
        dout: &Self::Buffer,
        x: &Self::Buffer,
        w: &Self::Buffer,
        rstd: &Self::Buffer,
        c: usize,
    ) -> Result<(), ExecError>;
    #[allow(clippy::too_many_arguments)]
    fn layernorm_forward(
        &self,
        out: &mut Self::Buffer,
        mean: &mut Self::Buffer,
        rstd: &mut Self::Buffer,
        x: &Self::Buffer,
        w: &Self::Buffer,
        b: &Self::Buffer,
        c: usize,
        eps: f32,
    ) -> Result<(), ExecError>;
    /// dx overwritten, dw and db add into.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward(
        &self,
        dx: &mut Self::Buffer,
        dw: &mut Self::Buffer,
        db: &mut Self::Buffer,
        dout: &Self::Buffer,
        x: &Self::Buffer,
        w: &Self::Buffer,
        mean: &Self::Buffer,
        rstd: &Self::Buffer,
        c: usize,
    ) -> Result<(), ExecError>;
    fn rope_forward(&self, out: &mut Self::Buffer, x: &Self::Buffer, r: Rope)
    -> Result<(), ExecError>;
    fn rope_backward(
        &self,
        dx: &mut Self::Buffer,
        dout: &Self::Buffer,
        r: Rope,
    ) -> Result<(), ExecError>;
    /// Flash-style attention; saves lse (B,H,T).
    fn attention_forward(
        &self,
        out: &mut Self::Buffer,
        lse: &mut Self::Buffer,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        a: Attn,
    ) -> Result<(), ExecError>;
    /// dq, dk, dv overwritten.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        dq: &mut Self::Buffer,
        dk: &mut Self::Buffer,
        dv: &mut Self::Buffer,
        dout: &Self::Buffer,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        out: &Self::Buffer,
        lse: &Self::Buffer,
        a: Attn,
    ) -> Result<(), ExecError>;
    /// loss (1 element) = mean over non-ignored rows; saves lse (N).
    fn cross_entropy_forward(
        &self,
        loss: &mut Self::Buffer,
        lse: &mut Self::Buffer,
        logits: &Self::Buffer,
        targets: &Self::Buffer,
        v: usize,
    ) -> Result<(), ExecError>;
    /// dlogits overwritten; `dloss` is the loss's gradient (1 element; `None`: zero).
    fn cross_entropy_backward(
        &self,
        dlogits: &mut Self::Buffer,
        logits: &Self::Buffer,
        lse: &Self::Buffer,
        targets: &Self::Buffer,
        v: usize,
        dloss: Option<&Self::Buffer>,
    ) -> Result<(), ExecError>;

    // ---- Mamba-2 mixer ----------------------------------------------------------------

    /// out (B,T,C) = silu(bias + the causal depthwise convolution of x (B,T,C) with w
    /// (C,K)); saves nothing.
    fn causal_conv1d_forward(
        &self,
        out: &mut Self::Buffer,
        x: &Self::Buffer,
        w: &Self::Buffer,
        bias: &Self::Buffer,
        s: Conv1d,
    ) -> Result<(), ExecError>;
    /// dx overwritten, dw and dbias add into (the pre-activation recomputed).
    #[allow(clippy::too_many_arguments)]
    fn causal_conv1d_backward(
        &self,
        dx: &mut Self::Buffer,
        dw: &mut Self::Buffer,
        dbias: &mut Self::Buffer,
        dout: &Self::Buffer,
        x: &Self::Buffer,
        w: &Self::Buffer,
        bias: &Self::Buffer,
        s: Conv1d,
    ) -> Result<(), ExecError>;
    /// Mamba-2's SSD scan: y (B,T,H,P); saves `states` (B,H,chunks,P,N), the state
    /// entering each chunk ([`Ssm::states_len`]).
    fn ssm_scan_forward(
        &self,
        y: &mut Self::Buffer,
        states: &mut Self::Buffer,
        i: SsmInputs<&Self::Buffer>,
        s: Ssm,
    ) -> Result<(), ExecError>;
    /// dx, ddt, dbm, dcm overwritten; da_log, dd, ddt_bias add into.
    fn ssm_scan_backward(
        &self,
        g: SsmGrads<&mut Self::Buffer>,
        dy: &Self::Buffer,
        i: SsmInputs<&Self::Buffer>,
        states: &Self::Buffer,
        s: Ssm,
    ) -> Result<(), ExecError>;

    // ---- vocab-parallel cross-entropy (Megatron's three row statistics) ----------

    /// max (N) = max of each row of x (N, v); sumexp (N) = Σ_j exp(x[r, j] − max[r]), in
    /// one pass over x.
    fn row_max_sumexp(
        &self,
        max: &mut Self::Buffer,
        sumexp: &mut Self::Buffer,
        x: &Self::Buffer,
        v: usize,
    ) -> Result<(), ExecError>;
    /// sumexp (N) ·= exp(local_max − max): a shard's sum against its own max moved onto
    /// the max reduced over the shards.
    fn sumexp_rescale(
        &self,
        sumexp: &mut Self::Buffer,
        local_max: &Self::Buffer,
        max: &Self::Buffer,
    ) -> Result<(), ExecError>;
    /// out (N) = x[r, target[r] − start] when this shard (classes start..start+v) holds
    /// the target, else 0.
    fn target_logit(
        &self,
        out: &mut Self::Buffer,
        x: &Self::Buffer,
        targets: &Self::Buffer,
        start: usize,
        v: usize,
    ) -> Result<(), ExecError>;
    /// lse = max + ln(sumexp); loss (1) = mean over non-ignored rows of lse − target
    /// logit, from the all-reduced statistics.
    fn cross_entropy_from_stats(
        &self,
        loss: &mut Self::Buffer,
        lse: &mut Self::Buffer,
        max: &Self::Buffer,
        sumexp: &Self::Buffer,
        target_logit: &Self::Buffer,
        targets: &Self::Buffer,
    ) -> Result<(), ExecError>;
    /// dlogits (N, v) of a vocab shard holding classes start..start+v, overwritten.
    #[allow(clippy::too_many_arguments)]
    fn cross_entropy_shard_backward(
        &self,
        dlogits: &mut Self::Buffer,
        logits: &Self::Buffer,
        lse: &Self::Buffer,
        targets: &Self::Buffer,
        start: usize,
        v: usize,
        dloss: Option<&Self::Buffer>,
    ) -> Result<(), ExecError>;

    // ---- mixture of experts ---------------------------------------------------------

    /// Top-k routing: weights (N,k), indices (N,k, int32), probs (N,E) saved.
    fn router_forward(
        &self,
        weights: &mut Self::Buffer,
        indices: &mut Self::Buffer,
        probs: &mut Self::Buffer,
        logits: &Self::Buffer,
        r: &Router,
    ) -> Result<(), ExecError>;
    fn router_backward(
        &self,
        dlogits: &mut Self::Buffer,
        dweights: &Self::Buffer,
        probs: &Self::Buffer,
        indices: &Self::Buffer,
        r: &Router,
    ) -> Result<(), ExecError>;
    /// The routing plan of indices (N,k) over `e` experts.
    fn dispatch_plan(
        &self,
        indices: &Self::Buffer,
        n: usize,
        k: usize,
        e: usize,
    ) -> Result<Self::Plan, ExecError>;
    /// A plan over rows that are already grouped by expert: expert e owns the next
    /// `counts[e]` rows (the rows an expert-parallel rank received).
    fn presorted_plan(&self, counts: &[usize]) -> Result<Self::Plan, ExecError>;
    /// Rows per expert of `plan` (for the expert-parallel exchange's counts).
    fn plan_counts(&self, plan: &Self::Plan) -> Result<Vec<usize>, ExecError>;
    fn dispatch_forward(
        &self,
        x_sorted: &mut Self::Buffer,
        x: &Self::Buffer,
        plan: &Self::Plan,
        c: usize,
    ) -> Result<(), ExecError>;
    fn dispatch_backward(
        &self,
        dx: &mut Self::Buffer,
        dx_sorted: &Self::Buffer,
        plan: &Self::Plan,
        c: usize,
    ) -> Result<(), ExecError>;
    /// out = x · Wᵀ per expert, over each expert's rows of `x_sorted`. The operands are
    /// f32, or (the native FP8 route) FP8 codes: `x_sorted` one tensor, the weights
    /// stacked (one scale) or one per expert (a scale each); the contraction over an expert's rows (the weight gradient's) is then
    /// padded with zeros to the FP8 GEMM's multiple of 16.
    fn grouped_matmul_forward(
        &self,
        out: &mut Self::Buffer,
        x_sorted: &Self::Buffer,
        w: ExpertWeights<'_, Self::Buffer>,
        plan: &Self::Plan,
        k_in: usize,
        n_out: usize,
    ) -> Result<(), ExecError>;
    /// dx = dout · W per expert, overwritten; dw (f32) += dout_wᵀ · x per expert.
    /// `dout_w` is `dout` unless a precision plan quantises the output gradient
    /// differently for the input-gradient and weight-gradient GEMMs. Operand types as
    /// [`Device::grouped_matmul_forward`]'s.
    #[allow(clippy::too_many_arguments)]
    fn grouped_matmul_backward(
        &self,
        dx_sorted: &mut Self::Buffer,
        dw: &mut Self::Buffer,
        dout: &Self::Buffer,
        dout_w: &Self::Buffer,
        x_sorted: &Self::Buffer,
        w: ExpertWeights<'_, Self::Buffer>,
        plan: &Self::Plan,
        k_in: usize,
        n_out: usize,
    ) -> Result<(), ExecError>;
    fn combine_forward(
        &self,
        out: &mut Self::Buffer,
        y_sorted: &Self::Buffer,
        weights: &Self::Buffer,
        plan: &Self::Plan,
        c: usize,
    ) -> Result<(), ExecError>;
    /// dy and dweights overwritten.
    #[allow(clippy::too_many_arguments)]
    fn combine_backward(
        &self,
        dy_sorted: &mut Self::Buffer,
        dweights: &mut Self::Buffer,
        dout: &Self::Buffer,
        y_sorted: &Self::Buffer,
        weights: &Self::Buffer,
        plan: &Self::Plan,
        c: usize,
    ) -> Result<(), ExecError>;

    // ---- optimizer ------------------------------------------------------------------

    /// One AdamW step on a parameter tensor, the step's scalars read from `scalars` (an
    /// f32 buffer of [`Scalars::words`], [`adamw_scalars`]) on the device: a recorded
    /// step ([`Device::begin_capture`]) replays with each later step's bias corrections
    /// once the buffer is rewritten between replays.
    fn adamw(
        &self,
        param: &mut Self::Buffer,
        grad: &Self::Buffer,
        m: &mut Self::Buffer,
        v: &mut Self::Buffer,
        scalars: &Self::Buffer,
    ) -> Result<(), ExecError>;

    /// Newton–Schulz's normalisation, x ← x / (√max(s, 0) + eps) with s the first
    /// element of `sumsq` (‖x‖²_F from a 1 × 1 GEMM), read on the device: Muon's step
    /// then needs no host read, and can be recorded
    /// (`runner_kernels::cpu::muon::scale_by_inverse_norm`).
    fn scale_by_inverse_norm(&self, x: &mut Self::Buffer, sumsq: &Self::Buffer, eps: f32) -> Result<(), ExecError>;

    /// Muon's update of a weight from its orthogonalised momentum `o`, w ← w·decay +
    /// (lr·k)·o, with the decay and learning rate read from `scalars` (AdamW's step
    /// scalars, [`adamw_scalars`]) on the device (`runner_kernels::cpu::muon::muon_apply`).
    fn muon_apply(&self, w: &mut Self::Buffer, o: &Self::Buffer, scalars: &Self::Buffer, k: f32) -> Result<(), ExecError>;

    // ---- recorded steps -------------------------------------------------------------

    /// Start recording: until [`Device::end_capture`], the kernels, copies, allocations
    /// and frees this thread queues are recorded, not run (CUDA stream capture). Host
    /// reads and writes, waits and events fail meanwhile, so what is recorded must be
    /// device work only; buffers allocated before it keep their addresses, which the
    /// recording bakes in.
    ///
    /// # Errors
    /// The device cannot record (the CPU), or a capture is already open.
    fn begin_capture(&self) -> Result<(), ExecError> {
        Err(ExecError::NoCuda(no_graphs(&self.name())))
    }
    /// Stop recording and make what was recorded launchable. Ends the capture even when
    /// it fails, so a failed recording leaves the device usable.
    ///
    /// # Errors
    /// Nothing was being recorded, something recorded was not device work, or a buffer
    /// allocated while recording outlives it.
    fn end_capture(&self) -> Result<Self::Graph, ExecError> {
        Err(ExecError::NoCuda(no_graphs(&self.name())))
    }
    /// Queue one replay of `graph` on the stream.
    ///
    /// # Errors
    /// A device error.
    fn launch(&self, graph: &Self::Graph) -> Result<(), ExecError> {
        let _ = graph;
        Err(ExecError::NoCuda(no_graphs(&self.name())))
    }
    /// Whether [`Device::begin_capture`] can record here.
    fn records(&self) -> bool {
        false
    }

    // ---- clocks and bookkeeping -----------------------------------------------------

    /// Mark the current point of the stream (after the work queued so far).
    fn record(&self) -> Result<Self::Event, ExecError>;
    /// Seconds between two recorded points; waits for `end`.
    fn elapsed_s(&self, start: &Self::Event, end: &Self::Event) -> Result<f64, ExecError>;
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
