//! The CPU backend: [`Cpu`] implements [`Device`] with the f32 kernels of
//! `runner-kernels`, on rayon's current thread pool (set `RAYON_NUM_THREADS`).
//!
//! Each graph op maps onto one kernel family; this file only reads shapes and attributes
//! off the graph, picks buffers and handles the two gradient write modes (overwrite or
//! accumulate, see [`crate::device`]). Kernels that overwrite their gradient output get a
//! scratch buffer when the step must accumulate; kernels that add into a weight gradient
//! get it zeroed first when the step is the first writer.
//!
//! Shape notation as in `runner-kernels`: N rows, C channels, B,T,H,Hkv,D as usual.
//! Ops without a kernel are composed here: GeGLU (GELU ∘ product), `concat` with
//! broadcast leading axes, bias gradients (column sums). Collectives have no meaning on
//! one CPU device and are refused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use matmul::Gemm;
use moe::{DispatchPlan, Router, ScoreFn};
use runner_graph::autodiff::BackwardStep;
use runner_graph::{Graph, Op, OpKind, TensorId};
use runner_kernels::KernelError;
use runner_kernels::cpu::adamw::{AdamW, adamw_step};
use runner_kernels::cpu::attention::{Attn, attention_backward, attention_forward};
use runner_kernels::cpu::cp::CpShard;
use runner_kernels::cpu::{activation, embedding, loss, matmul, moe, norm, rope};

use crate::device::{
    BackwardIo, Device, DeviceBuffer, Elem, ExecError, GradTarget, MemStats, Plans,
};

/// Byte accounting shared by every buffer of one [`Cpu`] device, and the pool that
/// dropped buffers go back to.
#[derive(Debug, Default)]
struct Tracker {
    current: AtomicU64,
    peak: AtomicU64,
    allocations: AtomicU64,
    pool: Mutex<Pool>,
}

/// Storage of dropped buffers, by (element type, length), for the next allocation of
/// the same size.
///
/// A training step allocates and frees the same activation and gradient buffers every
/// step (about 250 MiB for the 4-layer bench model). From the allocator those come
/// back as fresh pages: the buffers of 128 KiB and more are `mmap`ed and unmapped on
/// free, so each step page-faulted ~65k times and had the kernel zero the memory
/// (~8% of the step). Reusing them skips both. Pooled bytes are not live: they do not
/// count in [`MemStats`], and the pool holds at most the device's peak live bytes.
#[derive(Debug, Default)]
struct Pool {
    free: HashMap<(bool, usize), Vec<CpuData>>,
    bytes: u64,
}

/// Buffers below this many bytes go back to the allocator (cheap to get again).
const POOL_MIN_BYTES: usize = 64 << 10;

impl Tracker {
    fn add(&self, bytes: u64) {
        let now = self.current.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
        self.allocations.fetch_add(1, Ordering::Relaxed);
    }
    fn sub(&self, bytes: u64) {
        self.current.fetch_sub(bytes, Ordering::Relaxed);
    }
    /// Keep `data` for reuse if it is big enough and the pool has room.
    fn recycle(&self, data: CpuData) {
        let (is_f32, len) = match &data {
            CpuData::F32(v) => (true, v.len()),
            CpuData::U32(v) => (false, v.len()),
        };
        let bytes = (len * 4) as u64;
        if len * 4 < POOL_MIN_BYTES {
            return;
        }
        let cap = self.peak.load(Ordering::Relaxed);
        if let Ok(mut p) = self.pool.lock()
            && p.bytes + bytes <= cap
        {
            p.bytes += bytes;
            p.free.entry((is_f32, len)).or_default().push(data);
        }
    }
    /// A pooled buffer of this type and length, if there is one (contents arbitrary).
    fn reuse(&self, is_f32: bool, len: usize) -> Option<CpuData> {
        if len * 4 < POOL_MIN_BYTES {
            return None;
        }
        let mut p = self.pool.lock().ok()?;
        let data = p.free.get_mut(&(is_f32, len))?.pop()?;
        p.bytes -= (len * 4) as u64;
        Some(data)
    }
}

/// The contents of a CPU buffer.
#[derive(Debug)]
pub enum CpuData {
    F32(Vec<f32>),
    U32(Vec<u32>),
}

/// A host-memory buffer that reports its size to its device's tracker on drop.
#[derive(Debug)]
pub struct CpuBuffer {
    data: CpuData,
    tracker: Arc<Tracker>,
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        self.tracker.sub(self.bytes());
        let data = std::mem::replace(&mut self.data, CpuData::F32(Vec::new()));
        self.tracker.recycle(data);
    }
}

impl CpuBuffer {
    fn bytes(&self) -> u64 {
        (self.len() * 4) as u64
    }
    /// The f32 contents (empty for a u32 buffer).
    pub fn f32(&self) -> &[f32] {
        match &self.data {
            CpuData::F32(v) => v,
            CpuData::U32(_) => &[],
        }
    }
    fn f32_mut(&mut self) -> &mut [f32] {
        match &mut self.data {
            CpuData::F32(v) => v,
            CpuData::U32(_) => &mut [],
        }
    }
    /// The u32 contents (empty for an f32 buffer).
    pub fn u32(&self) -> &[u32] {
        match &self.data {
            CpuData::U32(v) => v,
            CpuData::F32(_) => &[],
        }
    }
}

impl DeviceBuffer for CpuBuffer {
    fn len(&self) -> usize {
        match &self.data {
            CpuData::F32(v) => v.len(),
            CpuData::U32(v) => v.len(),
        }
    }
    fn elem(&self) -> Elem {
        match &self.data {
            CpuData::F32(_) => Elem::F32,
            CpuData::U32(_) => Elem::U32,
        }
    }
}

/// The CPU device.
#[derive(Debug, Default, Clone)]
pub struct Cpu {
    tracker: Arc<Tracker>,
}

impl Cpu {
    pub fn new() -> Cpu {
        Cpu::default()
    }
}

/// Whether fresh buffers are filled with NaN / u32::MAX. Debug and test builds only:
/// the fill costs a pass over memory that a release benchmark should not pay.
const POISON: bool = cfg!(debug_assertions);

fn kerr(op: &Op) -> impl FnOnce(KernelError) -> ExecError + '_ {
    move |source| ExecError::Kernel {
        op: op.name.clone(),
        source,
    }
}

fn state(op: &Op, what: &str) -> ExecError {
    ExecError::State(format!("operation '{}': {what}", op.name))
}

fn shape(g: &Graph, id: TensorId) -> &[u64] {
    &g.tensors[id].shape
}
fn numel(g: &Graph, id: TensorId) -> usize {
    g.tensors[id].numel() as usize
}
fn last(g: &Graph, id: TensorId) -> usize {
    shape(g, id).last().copied().unwrap_or(1) as usize
}

fn f32_attr(op: &Op, key: &str, default: f64) -> f32 {
    op.float(key).unwrap_or(default) as f32
}

/// The context-parallel rank of a sharded rotary or attention op (attrs `cp`,
/// `cp-rank`, set by `runner_graph::shard` when cp > 1): its rows are that rank's two
/// chunks of the sequence (`runner_kernels::cpu::cp`). `None` when there are none.
fn cp_of(op: &Op) -> Option<CpShard> {
    let size = op.int("cp").unwrap_or(1);
    (size > 1).then(|| CpShard {
        size: size as usize,
        rank: op.int("cp-rank").unwrap_or(0).max(0) as usize,
    })
}

/// The attention shape of op `op` (q, k, v inputs (B,T,H,D), (B,Tk,Hkv,D),
/// (B,Tk,Hkv,Dv); Tk = cp·T under context parallelism, the all-gathered K/V).
fn attn_of(g: &Graph, op: &Op) -> Attn {
    let (q, v) = (shape(g, op.inputs[0]), shape(g, op.inputs[2]));
    let k = shape(g, op.inputs[1]);
    let window = op.int("window").unwrap_or(0);
    Attn {
        b: q[0] as usize,
        t: q[1] as usize,
        h: q[2] as usize,
        hkv: k[2] as usize,
        d: q[3] as usize,
        dv: v[3] as usize,
        causal: op.flag("causal").unwrap_or(true),
        window: (window > 0).then_some(window as usize),
        scale: f32_attr(op, "scale", 1.0 / (q[3] as f64).sqrt()),
        cp: cp_of(op),
    }
}

fn rope_of(g: &Graph, op: &Op) -> rope::Rope {
    let x = shape(g, op.inputs[0]);
    rope::Rope {
        b: x[0] as usize,
        t: x[1] as usize,
        h: x[2] as usize,
        d: x[3] as usize,
        rot_dim: op.int("rot-dim").unwrap_or(x[3] as i64) as usize,
        theta: f32_attr(op, "theta", 10_000.0),
        pos_offset: 0,
        cp: cp_of(op),
    }
}

fn router_of(g: &Graph, op: &Op) -> Router {
    let logits = op.inputs[0];
    let e = last(g, logits);
    Router {
        n: numel(g, logits) / e.max(1),
        e,
        k: op.int("top-k").unwrap_or(1) as usize,
        score: if op.text("score") == Some("sigmoid") {
            ScoreFn::Sigmoid
        } else {
            ScoreFn::Softmax
        },
        normalize_topk: op.flag("normalize").unwrap_or(true),
    }
}

/// Row index into a source whose leading axes broadcast (size 1) against `out_lead`.
fn broadcast_row(out_lead: &[u64], src_lead: &[u64], row: usize) -> usize {
    let (mut r, mut idx, mut stride) = (row, 0usize, 1usize);
    for ax in (0..out_lead.len()).rev() {
        let d = out_lead[ax] as usize;
        let i = r % d;
        r /= d;
        let s = src_lead[ax] as usize;
        if s != 1 {
            idx += i * stride;
        }
        stride *= s;
    }
    idx
}

impl Cpu {
    fn scratch(&self, len: usize) -> Result<CpuBuffer, ExecError> {
        self.alloc(Elem::F32, len)
    }

    /// Write a gradient with a kernel that overwrites its output: straight into the
    /// target, or into scratch then added when the step accumulates.
    fn emit(
        &self,
        target: &mut GradTarget<'_, CpuBuffer>,
        f: impl FnOnce(&mut [f32]) -> Result<(), ExecError>,
    ) -> Result<(), ExecError> {
        let mut staged = self.stage(target)?;
        f(staged.out())?;
        self.settle(staged)
    }

    /// Prepare one output of a kernel that writes several gradients at once (the
    /// multi-output form of [`Cpu::emit`]); [`Cpu::settle`] finishes it.
    fn stage<'t, 'b>(&self, target: &'t mut GradTarget<'b, CpuBuffer>) -> Result<Staged<'t, 'b>, ExecError> {
        let scratch = if target.accumulate { Some(self.scratch(target.buf.len())?) } else { None };
        Ok(Staged { target, scratch })
    }

    /// Add a staged gradient into its target when the step accumulates.
    fn settle(&self, staged: Staged<'_, '_>) -> Result<(), ExecError> {
        match staged.scratch {
            Some(tmp) => self.add_assign(staged.target.buf, &tmp),
            None => Ok(()),
        }
    }

    /// Write a gradient with a kernel that adds into its output (weight gradients).
    fn emit_add(
        &self,
        target: &mut GradTarget<'_, CpuBuffer>,
        f: impl FnOnce(&mut [f32]) -> Result<(), ExecError>,
    ) -> Result<(), ExecError> {
        if !target.accumulate {
            target.buf.f32_mut().fill(0.0);
        }
        f(target.buf.f32_mut())
    }

    /// The gradient target of input `slot`, or a scratch buffer of `len` whose result is
    /// dropped (kernels that always write every gradient, e.g. attention's dq/dk/dv).
    fn target_or_scratch<'b>(
        &self,
        slot: Option<GradTarget<'b, CpuBuffer>>,
        len: usize,
        keep: &'b mut Option<CpuBuffer>,
    ) -> Result<GradTarget<'b, CpuBuffer>, ExecError> {
        match slot {
            Some(t) => Ok(t),
            None => {
                let buf = keep.insert(self.scratch(len)?);
                Ok(GradTarget {
                    buf,
                    accumulate: false,
                })
            }
        }
    }
}

/// A gradient output staged by [`Cpu::stage`]: the kernel writes [`Staged::out`], which is
/// the target itself, or scratch that [`Cpu::settle`] adds into the target.
struct Staged<'t, 'b> {
    target: &'t mut GradTarget<'b, CpuBuffer>,
    scratch: Option<CpuBuffer>,
}

impl Staged<'_, '_> {
    fn out(&mut self) -> &mut [f32] {
        match &mut self.scratch {
            Some(s) => s.f32_mut(),
            None => self.target.buf.f32_mut(),
        }
    }
}

fn need<'b>(
    v: &[Option<&'b CpuBuffer>],
    i: usize,
    op: &Op,
    what: &str,
) -> Result<&'b CpuBuffer, ExecError> {
    v.get(i).copied().flatten().ok_or_else(|| {
        state(
            op,
            &format!("backward needs {what} (slot {i}), which was not saved"),
        )
    })
}

impl Device for Cpu {
    type Buffer = CpuBuffer;
    type Plan = DispatchPlan;

    fn name(&self) -> String {
        format!("cpu ({} threads)", rayon::current_num_threads())
    }

    fn alloc(&self, elem: Elem, len: usize) -> Result<CpuBuffer, ExecError> {
        let pooled = self.tracker.reuse(elem == Elem::F32, len).map(|mut d| {
            if POISON {
                match &mut d {
                    CpuData::F32(v) => v.fill(f32::NAN),
                    CpuData::U32(v) => v.fill(u32::MAX),
                }
            }
            d
        });
        let data = pooled.unwrap_or_else(|| match (elem, POISON) {
            (Elem::F32, true) => CpuData::F32(vec![f32::NAN; len]),
            (Elem::F32, false) => CpuData::F32(vec![0.0; len]),
            (Elem::U32, true) => CpuData::U32(vec![u32::MAX; len]),
            (Elem::U32, false) => CpuData::U32(vec![0; len]),
        });
        let buf = CpuBuffer {
            data,
            tracker: self.tracker.clone(),
        };
        self.tracker.add(buf.bytes());
        Ok(buf)
    }

    fn zero(&self, buf: &mut CpuBuffer) -> Result<(), ExecError> {
        match &mut buf.data {
            CpuData::F32(v) => v.fill(0.0),
            CpuData::U32(v) => v.fill(0),
        }
        Ok(())
    }

    fn write_f32(&self, buf: &mut CpuBuffer, data: &[f32]) -> Result<(), ExecError> {
        match &mut buf.data {
            CpuData::F32(v) if v.len() == data.len() => {
                v.copy_from_slice(data);
                Ok(())
            }
            _ => Err(ExecError::State(format!(
                "write of {} f32 into a buffer of {} {:?}",
                data.len(),
                buf.len(),
                buf.elem()
            ))),
        }
    }

    fn write_u32(&self, buf: &mut CpuBuffer, data: &[u32]) -> Result<(), ExecError> {
        match &mut buf.data {
            CpuData::U32(v) if v.len() == data.len() => {
                v.copy_from_slice(data);
                Ok(())
            }
            _ => Err(ExecError::State(format!(
                "write of {} u32 into a buffer of {} {:?}",
                data.len(),
                buf.len(),
                buf.elem()
            ))),
        }
    }

    fn read_f32(&self, buf: &CpuBuffer) -> Result<Vec<f32>, ExecError> {
        match &buf.data {
            CpuData::F32(v) => Ok(v.clone()),
            CpuData::U32(_) => Err(ExecError::State("read_f32 of a u32 buffer".into())),
        }
    }

    fn round_to_storage(&self, buf: &mut CpuBuffer, dtype: runner_graph::DType, row: usize) -> Result<(), ExecError> {
        use runner_graph::DType;
        use runner_kernels::cpu::precision::{self as p, Fp8Format};
        match dtype {
            DType::BF16 => p::round_to_bf16(buf.f32_mut()),
            DType::F16 => p::round_to_f16(buf.f32_mut()),
            DType::Fp8E4M3 => {
                p::round_to_fp8_current(buf.f32_mut(), Fp8Format::E4M3);
            }
            DType::Fp8E5M2 => {
                p::round_to_fp8_current(buf.f32_mut(), Fp8Format::E5M2);
            }
            DType::MxFp8 => p::round_to_mxfp8(buf.f32_mut(), row),
            DType::F32 | DType::NvFp4 | DType::I32 => {}
        }
        Ok(())
    }

    fn add_assign(&self, dst: &mut CpuBuffer, src: &CpuBuffer) -> Result<(), ExecError> {
        use rayon::prelude::*;
        let (d, s) = (dst.f32_mut(), src.f32());
        if d.len() != s.len() {
            return Err(ExecError::State(format!(
                "add of {} elements into {}",
                s.len(),
                d.len()
            )));
        }
        // Same grain as the kernels' element-wise loops (2^15 elements per task).
        d.par_chunks_mut(1 << 15)
            .zip(s.par_chunks(1 << 15))
            .for_each(|(d, s)| {
                for (a, b) in d.iter_mut().zip(s) {
                    *a += b;
                }
            });
        Ok(())
    }

    fn forward(
        &self,
        g: &Graph,
        oi: usize,
        inputs: &[&CpuBuffer],
        outputs: &mut [CpuBuffer],
        aux: &mut Vec<CpuBuffer>,
        plans: &mut Plans<DispatchPlan>,
    ) -> Result<(), ExecError> {
        let op = &g.ops[oi];
        let ke = || kerr(op);
        let x = |i: usize| inputs[i].f32();
        match op.kind {
            OpKind::Linear => {
                let (xid, wid) = (op.inputs[0], op.inputs[1]);
                let (n, k) = (shape(g, wid)[0] as usize, shape(g, wid)[1] as usize);
                let m = numel(g, xid) / k;
                let out = outputs[0].f32_mut();
                matmul::matmul(
                    out,
                    x(0),
                    x(1),
                    Gemm {
                        m,
                        n,
                        k,
                        trans_a: false,
                        trans_b: true,
                    },
                    false,
                )
                .map_err(ke())?;
                if let Some(b) = inputs.get(2) {
                    for row in out.chunks_mut(n) {
                        for (o, bb) in row.iter_mut().zip(b.f32()) {
                            *o += bb;
                        }
                    }
                }
            }
            OpKind::Embedding => {
                let c = last(g, op.inputs[1]);
                embedding::embedding_forward(outputs[0].f32_mut(), inputs[0].u32(), x(1), c)
                    .map_err(ke())?;
            }
            OpKind::RmsNorm => {
                let c = last(g, op.inputs[0]);
                let mut rstd = self.scratch(numel(g, op.inputs[0]) / c)?;
                let eps = f32_attr(op, "eps", 1e-5);
                norm::rmsnorm_forward(outputs[0].f32_mut(), rstd.f32_mut(), x(0), x(1), c, eps)
                    .map_err(ke())?;
                aux.push(rstd);
            }
            OpKind::LayerNorm => {
                let c = last(g, op.inputs[0]);
                let rows = numel(g, op.inputs[0]) / c;
                let (mut mean, mut rstd) = (self.scratch(rows)?, self.scratch(rows)?);
                let eps = f32_attr(op, "eps", 1e-5);
                norm::layernorm_forward(
                    outputs[0].f32_mut(),
                    mean.f32_mut(),
                    rstd.f32_mut(),
                    x(0),
                    x(1),
                    x(2),
                    c,
                    eps,
                )
                .map_err(ke())?;
                aux.push(mean);
                aux.push(rstd);
            }
            OpKind::Rotary => {
                rope::rope_forward(outputs[0].f32_mut(), x(0), rope_of(g, op)).map_err(ke())?
            }
            OpKind::Attention => {
                let a = attn_of(g, op);
                let mut lse = self.scratch(a.b * a.h * a.t)?;
                attention_forward(outputs[0].f32_mut(), lse.f32_mut(), x(0), x(1), x(2), a)
                    .map_err(ke())?;
                aux.push(lse);
            }
            OpKind::SwiGlu => {
                activation::swiglu_forward(outputs[0].f32_mut(), x(0), x(1)).map_err(ke())?
            }
            OpKind::GeGlu => {
                let out = outputs[0].f32_mut();
                activation::gelu_forward(out, x(0)).map_err(ke())?;
                if x(1).len() != out.len() {
                    return Err(state(op, "gate and up differ in length"));
                }
                for (o, u) in out.iter_mut().zip(x(1)) {
                    *o *= u;
                }
            }
            OpKind::Gelu => activation::gelu_forward(outputs[0].f32_mut(), x(0)).map_err(ke())?,
            OpKind::SquaredRelu => {
                activation::squared_relu_forward(outputs[0].f32_mut(), x(0)).map_err(ke())?
            }
            OpKind::Add => {
                activation::add_forward(outputs[0].f32_mut(), x(0), x(1)).map_err(ke())?
            }
            OpKind::Concat => {
                let (a, b, o) = (op.inputs[0], op.inputs[1], op.outputs[0]);
                let (la, lb, lo) = (last(g, a), last(g, b), last(g, o));
                let (sa, sb, so) = (shape(g, a), shape(g, b), shape(g, o));
                let r = so.len() - 1;
                let out = outputs[0].f32_mut();
                for (row, dst) in out.chunks_mut(lo).enumerate() {
                    let ra = broadcast_row(&so[..r], &sa[..r], row);
                    let rb = broadcast_row(&so[..r], &sb[..r], row);
                    dst[..la].copy_from_slice(&x(0)[ra * la..(ra + 1) * la]);
                    dst[la..].copy_from_slice(&x(1)[rb * lb..(rb + 1) * lb]);
                }
            }
            OpKind::CrossEntropy => {
                let v = last(g, op.inputs[0]);
                let rows = numel(g, op.inputs[0]) / v;
                let (mut losses, mut lse) = (self.scratch(rows)?, self.scratch(rows)?);
                let mean = loss::cross_entropy_forward(
                    losses.f32_mut(),
                    lse.f32_mut(),
                    x(0),
                    inputs[1].u32(),
                    v,
                )
                .map_err(ke())?;
                outputs[0].f32_mut()[0] = mean;
                aux.push(lse);
            }
            OpKind::Router => {
                let r = router_of(g, op);
                let mut probs = self.scratch(r.n * r.e)?;
                let (w, idx) = outputs.split_at_mut(1);
                let idx = match &mut idx[0].data {
                    CpuData::U32(v) => v,
                    CpuData::F32(_) => {
                        return Err(state(op, "router indices must be an int32 tensor"));
                    }
                };
                moe::router_forward(w[0].f32_mut(), idx, probs.f32_mut(), x(0), &r).map_err(ke())?;
                aux.push(probs);
            }
            OpKind::MoeDispatch => {
                let idx = op.inputs[1];
                let (n, k) = (shape(g, idx)[0] as usize, shape(g, idx)[1] as usize);
                let e = op.int("experts").unwrap_or(0).max(0) as usize;
                let plan = moe::dispatch_plan(inputs[1].u32(), n, k, e).map_err(ke())?;
                let c = last(g, op.outputs[0]);
                moe::dispatch_forward(outputs[0].f32_mut(), x(0), &plan, c).map_err(ke())?;
                plans.routed.insert(idx, plan);
            }
            OpKind::GroupedLinear => {
                let w = shape(g, op.inputs[1]);
                let (e, n_out, k_in) = (w[0] as usize, w[1] as usize, w[2] as usize);
                // An expert-parallel rank runs on the rows its all-to-all received.
                let plan = if plans.received.contains_key(&op.inputs[2]) {
                    plans
                        .for_experts(op.inputs[2])
                        .ok_or_else(|| state(op, "routing plan vanished"))?
                } else {
                    plan_for(g, op, op.inputs[2], inputs[2], e, plans)?
                };
                moe::grouped_matmul_forward(outputs[0].f32_mut(), x(0), x(1), plan, k_in, n_out)
                    .map_err(ke())?;
            }
            OpKind::MoeCombine => {
                let c = last(g, op.inputs[0]);
                let plan = plans
                    .routed
                    .get(&op.inputs[2])
                    .ok_or_else(|| state(op, "no dispatch built a plan for these indices"))?;
                moe::combine_forward(outputs[0].f32_mut(), x(0), x(1), plan, c).map_err(ke())?;
            }
            OpKind::AllReduce
            | OpKind::AllGather
            | OpKind::ReduceScatter
            | OpKind::AllToAll
            | OpKind::Send
            | OpKind::Recv => return Err(unsupported(self, op)),
        }
        Ok(())
    }

    fn backward(
        &self,
        g: &Graph,
        step: &BackwardStep,
        io: BackwardIo<'_, Self>,
    ) -> Result<(), ExecError> {
        let op = &g.ops[step.op];
        let ke = || kerr(op);
        let BackwardIo {
            inputs,
            outputs,
            aux,
            grads_in,
            mut grads_out,
            plans,
        } = io;
        // Zero gradient for outputs that carry none (not reaching the loss).
        let mut zeros = Vec::new();
        for (slot, gi) in grads_in.iter().enumerate() {
            if gi.is_none() {
                let mut z = self.scratch(numel(g, op.outputs[slot]))?;
                z.f32_mut().fill(0.0);
                zeros.push((slot, z));
            }
        }
        let dout = |slot: usize| -> &[f32] {
            match grads_in[slot] {
                Some(b) => b.f32(),
                None => zeros
                    .iter()
                    .find(|(s, _)| *s == slot)
                    .map_or(&[], |(_, z)| z.f32()),
            }
        };
        let input = |i: usize, what: &str| need(&inputs, i, op, what);
        let mut take = |i: usize| grads_out.get_mut(i).and_then(Option::take);
        match op.kind {
            OpKind::Linear => {
                let (xid, wid) = (op.inputs[0], op.inputs[1]);
                let (n, k) = (shape(g, wid)[0] as usize, shape(g, wid)[1] as usize);
                let m = numel(g, xid) / k;
                let dy = dout(0);
                if let Some(t) = take(0) {
                    let w = input(1, "the weight")?.f32();
                    let gm = Gemm {
                        m,
                        n: k,
                        k: n,
                        trans_a: false,
                        trans_b: false,
                    };
                    matmul::matmul(t.buf.f32_mut(), dy, w, gm, t.accumulate).map_err(ke())?;
                }
                if let Some(t) = take(1) {
                    let x = input(0, "the input")?.f32();
                    let gm = Gemm {
                        m: n,
                        n: k,
                        k: m,
                        trans_a: true,
                        trans_b: false,
                    };
                    matmul::matmul(t.buf.f32_mut(), dy, x, gm, t.accumulate).map_err(ke())?;
                }
                if let Some(mut t) = take(2) {
                    self.emit_add(&mut t, |db| {
                        for row in dy.chunks(n) {
                            for (d, g) in db.iter_mut().zip(row) {
                                *d += g;
                            }
                        }
                        Ok(())
                    })?;
                }
            }
            OpKind::Embedding => {
                if let Some(mut t) = take(1) {
                    let c = last(g, op.inputs[1]);
                    let tokens = input(0, "the tokens")?.u32();
                    self.emit_add(&mut t, |dw| {
                        embedding::embedding_backward(dw, dout(0), tokens, c).map_err(ke())
                    })?;
                }
            }
            OpKind::RmsNorm => {
                let c = last(g, op.inputs[0]);
                let (x, w) = (input(0, "the input")?.f32(), input(1, "the weight")?.f32());
                let rstd = aux
                    .first()
                    .ok_or_else(|| state(op, "rstd was not saved"))?
                    .f32();
                let mut dw_scratch = None;
                let dwt = self.target_or_scratch(take(1), c, &mut dw_scratch)?;
                if !dwt.accumulate {
                    dwt.buf.f32_mut().fill(0.0);
                }
                let mut dx_scratch = None;
                let mut dxt = self.target_or_scratch(take(0), x.len(), &mut dx_scratch)?;
                let dw = dwt.buf.f32_mut();
                self.emit(&mut dxt, |dx| {
                    norm::rmsnorm_backward(dx, dw, dout(0), x, w, rstd, c).map_err(ke())
                })?;
            }
            OpKind::LayerNorm => {
                let c = last(g, op.inputs[0]);
                let (x, w) = (input(0, "the input")?.f32(), input(1, "the weight")?.f32());
                let (mean, rstd) = match aux {
                    [m, r, ..] => (m.f32(), r.f32()),
                    _ => return Err(state(op, "mean and rstd were not saved")),
                };
                let (mut s1, mut s2, mut s3) = (None, None, None);
                let mut dwt = self.target_or_scratch(take(1), c, &mut s1)?;
                let mut dbt = self.target_or_scratch(take(2), c, &mut s2)?;
                for t in [&mut dwt, &mut dbt] {
                    if !t.accumulate {
                        t.buf.f32_mut().fill(0.0);
                    }
                }
                let mut dxt = self.target_or_scratch(take(0), x.len(), &mut s3)?;
                let (dw, db) = (dwt.buf.f32_mut(), dbt.buf.f32_mut());
                self.emit(&mut dxt, |dx| {
                    norm::layernorm_backward(dx, dw, db, dout(0), x, w, mean, rstd, c).map_err(ke())
                })?;
            }
            OpKind::Rotary => {
                if let Some(mut t) = take(0) {
                    let r = rope_of(g, op);
                    self.emit(&mut t, |dx| {
                        rope::rope_backward(dx, dout(0), r).map_err(ke())
                    })?;
                }
            }
            OpKind::Attention => {
                let a = attn_of(g, op);
                let (q, k, v) = (
                    input(0, "q")?.f32(),
                    input(1, "k")?.f32(),
                    input(2, "v")?.f32(),
                );
                let out = need(&outputs, 0, op, "the attention output")?.f32();
                let lse = aux
                    .first()
                    .ok_or_else(|| state(op, "lse was not saved"))?
                    .f32();
                let (mut s0, mut s1, mut s2) = (None, None, None);
                let mut dq = self.target_or_scratch(take(0), q.len(), &mut s0)?;
                let mut dk = self.target_or_scratch(take(1), k.len(), &mut s1)?;
                let mut dv = self.target_or_scratch(take(2), v.len(), &mut s2)?;
                // The kernel writes all three at once; accumulating targets go via scratch.
                let (mut t0, mut t1, mut t2) = (self.stage(&mut dq)?, self.stage(&mut dk)?, self.stage(&mut dv)?);
                attention_backward(t0.out(), t1.out(), t2.out(), dout(0), q, k, v, out, lse, a).map_err(ke())?;
                for t in [t0, t1, t2] {
                    self.settle(t)?;
                }
            }
            OpKind::SwiGlu | OpKind::GeGlu => {
                let (gate, up) = (
                    input(0, "the gate")?.f32(),
                    input(1, "the up projection")?.f32(),
                );
                let (mut s0, mut s1) = (None, None);
                let mut dg = self.target_or_scratch(take(0), gate.len(), &mut s0)?;
                let mut du = self.target_or_scratch(take(1), up.len(), &mut s1)?;
                let (mut tg, mut tu) = (self.stage(&mut dg)?, self.stage(&mut du)?);
                {
                    let (dgs, dus) = (tg.out(), tu.out());
                    if op.kind == OpKind::SwiGlu {
                        activation::swiglu_backward(dgs, dus, dout(0), gate, up).map_err(ke())?;
                    } else {
                        // out = gelu(g)·u: dg = gelu'(g)·(dout·u), du = dout·gelu(g).
                        let d = dout(0);
                        let dxu: Vec<f32> = d.iter().zip(up).map(|(a, b)| a * b).collect();
                        activation::gelu_backward(dgs, &dxu, gate).map_err(ke())?;
                        activation::gelu_forward(dus, gate).map_err(ke())?;
                        for (u, a) in dus.iter_mut().zip(d) {
                            *u *= a;
                        }
                    }
                }
                self.settle(tg)?;
                self.settle(tu)?;
            }
            OpKind::Gelu | OpKind::SquaredRelu => {
                if let Some(mut t) = take(0) {
                    let x = input(0, "the input")?.f32();
                    let gelu = op.kind == OpKind::Gelu;
                    self.emit(&mut t, |dx| {
                        if gelu {
                            activation::gelu_backward(dx, dout(0), x).map_err(ke())
                        } else {
                            activation::squared_relu_backward(dx, dout(0), x).map_err(ke())
                        }
                    })?;
                }
            }
            OpKind::Add => {
                for slot in 0..2 {
                    if let Some(mut t) = take(slot) {
                        self.emit(&mut t, |dx| {
                            dx.copy_from_slice(dout(0));
                            Ok(())
                        })?;
                    }
                }
            }
            OpKind::Concat => {
                let o = op.outputs[0];
                let so = shape(g, o);
                let r = so.len() - 1;
                let lo = last(g, o);
                let d = dout(0);
                let mut col0 = 0;
                for slot in 0..2 {
                    let id = op.inputs[slot];
                    let (ls, ss) = (last(g, id), shape(g, id));
                    if let Some(mut t) = take(slot) {
                        self.emit_add(&mut t, |dx| {
                            // Broadcast leading axes sum their gradient over the copies.
                            for (row, src) in d.chunks(lo).enumerate() {
                                let rs = broadcast_row(&so[..r], &ss[..r], row);
                                for (a, b) in dx[rs * ls..(rs + 1) * ls]
                                    .iter_mut()
                                    .zip(&src[col0..col0 + ls])
                                {
                                    *a += b;
                                }
                            }
                            Ok(())
                        })?;
                    }
                    col0 += ls;
                }
            }
            OpKind::CrossEntropy => {
                if let Some(mut t) = take(0) {
                    let v = last(g, op.inputs[0]);
                    let logits = input(0, "the logits")?.f32();
                    let targets = input(1, "the targets")?.u32();
                    let lse = aux
                        .first()
                        .ok_or_else(|| state(op, "lse was not saved"))?
                        .f32();
                    let dloss = dout(0).first().copied().unwrap_or(0.0);
                    self.emit(&mut t, |dl| {
                        loss::cross_entropy_backward(dl, logits, lse, targets, v, dloss)
                            .map_err(ke())
                    })?;
                }
            }
            OpKind::Router => {
                if let Some(mut t) = take(0) {
                    let r = router_of(g, op);
                    let probs = aux
                        .first()
                        .ok_or_else(|| state(op, "probs were not saved"))?
                        .f32();
                    let idx = need(&outputs, 1, op, "the router indices")?.u32();
                    self.emit(&mut t, |dl| {
                        moe::router_backward(dl, dout(0), probs, idx, &r).map_err(ke())
                    })?;
                }
            }
            OpKind::MoeDispatch => {
                if let Some(mut t) = take(0) {
                    let plan = plans
                        .routed
                        .get(&op.inputs[1])
                        .ok_or_else(|| state(op, "the routing plan was not saved"))?;
                    let c = last(g, op.outputs[0]);
                    self.emit(&mut t, |dx| {
                        moe::dispatch_backward(dx, dout(0), plan, c).map_err(ke())
                    })?;
                }
            }
            OpKind::GroupedLinear => {
                let w = shape(g, op.inputs[1]);
                let (n_out, k_in) = (w[1] as usize, w[2] as usize);
                let plan = plans
                    .for_experts(op.inputs[2])
                    .ok_or_else(|| state(op, "the routing plan was not saved"))?;
                let xs = input(0, "the sorted tokens")?.f32();
                let wv = input(1, "the expert weights")?.f32();
                let (mut s0, mut s1) = (None, None);
                let dwt = self.target_or_scratch(take(1), wv.len(), &mut s1)?;
                if !dwt.accumulate {
                    dwt.buf.f32_mut().fill(0.0);
                }
                let mut dxt = self.target_or_scratch(take(0), xs.len(), &mut s0)?;
                let dw = dwt.buf.f32_mut();
                self.emit(&mut dxt, |dx| {
                    moe::grouped_matmul_backward(dx, dw, dout(0), xs, wv, plan, k_in, n_out)
                        .map_err(ke())
                })?;
            }
            OpKind::MoeCombine => {
                let c = last(g, op.inputs[0]);
                let plan = plans
                    .routed
                    .get(&op.inputs[2])
                    .ok_or_else(|| state(op, "the routing plan was not saved"))?;
                let ys = input(0, "the expert outputs")?.f32();
                let wts = input(1, "the router weights")?.f32();
                let (mut s0, mut s1) = (None, None);
                let mut dyt = self.target_or_scratch(take(0), ys.len(), &mut s0)?;
                let mut dwt = self.target_or_scratch(take(1), wts.len(), &mut s1)?;
                let (mut ty, mut tw) = (self.stage(&mut dyt)?, self.stage(&mut dwt)?);
                moe::combine_backward(ty.out(), tw.out(), dout(0), ys, wts, plan, c).map_err(ke())?;
                self.settle(ty)?;
                self.settle(tw)?;
            }
            OpKind::AllReduce
            | OpKind::AllGather
            | OpKind::ReduceScatter
            | OpKind::AllToAll
            | OpKind::Send
            | OpKind::Recv => return Err(unsupported(self, op)),
        }
        Ok(())
    }

    fn plan_counts(&self, plan: &DispatchPlan) -> Result<Vec<usize>, ExecError> {
        Ok(plan.offsets.windows(2).map(|w| w[1] - w[0]).collect())
    }

    fn presorted_plan(&self, counts: &[usize]) -> Result<DispatchPlan, ExecError> {
        moe::presorted_plan(counts).map_err(|source| ExecError::Kernel {
            op: "(expert-parallel plan)".into(),
            source,
        })
    }

    fn adamw(
        &self,
        param: &mut CpuBuffer,
        grad: &CpuBuffer,
        m: &mut CpuBuffer,
        v: &mut CpuBuffer,
        h: &AdamW,
        step: u32,
    ) -> Result<(), ExecError> {
        adamw_step(
            param.f32_mut(),
            grad.f32(),
            m.f32_mut(),
            v.f32_mut(),
            h,
            step,
        )
        .map_err(|source| ExecError::Kernel {
            op: "(optimizer)".into(),
            source,
        })
    }

    fn synchronize(&self) -> Result<(), ExecError> {
        Ok(())
    }

    fn memory(&self) -> MemStats {
        MemStats {
            current_bytes: self.tracker.current.load(Ordering::Relaxed),
            peak_bytes: self.tracker.peak.load(Ordering::Relaxed),
            allocations: self.tracker.allocations.load(Ordering::Relaxed),
        }
    }

    fn reset_peak(&self) {
        self.tracker.peak.store(
            self.tracker.current.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
    }
}

/// The routing plan of indices tensor `idx`: the dispatch's, or built here when the graph
/// runs a grouped linear without a dispatch of the same indices.
fn plan_for<'p>(
    g: &Graph,
    op: &Op,
    idx: TensorId,
    indices: &CpuBuffer,
    e: usize,
    plans: &'p mut Plans<DispatchPlan>,
) -> Result<&'p DispatchPlan, ExecError> {
    if let std::collections::hash_map::Entry::Vacant(slot) = plans.routed.entry(idx) {
        let s = shape(g, idx);
        let (n, k) = (s[0] as usize, s.get(1).copied().unwrap_or(1) as usize);
        slot.insert(moe::dispatch_plan(indices.u32(), n, k, e).map_err(kerr(op))?);
    }
    plans
        .routed
        .get(&idx)
        .ok_or_else(|| state(op, "routing plan vanished"))
}

fn unsupported(dev: &Cpu, op: &Op) -> ExecError {
    ExecError::Unsupported {
        op: op.name.clone(),
        kind: format!("{:?}", op.kind),
        device: dev.name(),
        why: "collectives need a multi-device backend; run the unsharded graph on one CPU".into(),
    }
}
