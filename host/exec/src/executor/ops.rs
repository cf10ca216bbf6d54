//! Graph ops onto device kernels, once for every backend: reading shapes and
//! attributes off the graph, picking buffers, and the two gradient write modes.
//!
//! A backward step either overwrites a gradient (its first contribution) or adds into
//! it (a tensor read by several ops): [`GradTarget::accumulate`]. Kernels that overwrite
//! their gradient output get a scratch buffer when the step must accumulate, added in
//! afterwards ([`stage`], [`settle`]); kernels that add into a weight gradient get it
//! zeroed first when the step is the first writer ([`emit_add`]).
//!
//! Shape notation as in `runner-kernels`: N rows, C channels, B,T,H,Hkv,D as usual.
//! Collective ops, pipeline send/recv and the vocab-parallel embedding and loss are
//! the executor's communication layer (`comm.rs`, `ep.rs`), which runs before this.

use runner_graph::autodiff::BackwardStep;
use runner_graph::{Graph, Op, OpKind, TensorId};
use runner_kernels::cpu::attention::Attn;
use runner_kernels::cpu::cp::CpShard;
use runner_kernels::cpu::matmul::Gemm;
use runner_kernels::cpu::moe::{Router, ScoreFn};
use runner_kernels::cpu::rope::Rope;
use runner_kernels::cpu::ssm::{Conv1d, Ssm, SsmGrads, SsmInputs};

use runner_kernels::cpu::quant::QuantSpec;

use crate::device::{CastProducer, ConcatShapes, Device, DeviceBuffer, Elem, ExecError, ExpertWeights, Plans};

/// Gradient output of a backward step: the buffer and whether to add into it.
pub(super) struct GradTarget<'a, B> {
    pub(super) buf: &'a mut B,
    pub(super) accumulate: bool,
}

/// Everything one backward step reads and writes, per slot of the forward op.
pub(super) struct BackwardIo<'a, D: Device> {
    /// Forward inputs that are still alive (saved, weights, graph inputs); `None` otherwise.
    pub(super) inputs: Vec<Option<&'a D::Buffer>>,
    /// Forward outputs that are still alive.
    pub(super) outputs: Vec<Option<&'a D::Buffer>>,
    /// The op's saved statistics, in the order of the plan's `aux`.
    pub(super) aux: &'a [D::Buffer],
    /// Gradient of each forward output (`None`: zero).
    pub(super) grads_in: Vec<Option<&'a D::Buffer>>,
    /// Gradient to produce for each forward input (`None`: not needed).
    pub(super) grads_out: Vec<Option<GradTarget<'a, D::Buffer>>>,
    pub(super) plans: &'a Plans<D::Plan>,
    /// A linear or grouped linear with a precision plan: its backward GEMMs' quantised
    /// operands.
    pub(super) linear: Option<&'a super::quant::LinearBackward<D::Buffer>>,
}

/// A device error from a kernel, renamed to the graph op it ran for.
fn named(op: &Op) -> impl Fn(ExecError) -> ExecError + '_ {
    move |e| match e {
        ExecError::Kernel { source, .. } => ExecError::Kernel {
            op: op.name.clone(),
            source,
        },
        other => other,
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

fn rope_of(g: &Graph, op: &Op) -> Rope {
    let x = shape(g, op.inputs[0]);
    Rope {
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

/// The convolution of a causal conv1d op: x (B,T,..) with C channels in its trailing axes,
/// w (C,K).
fn conv_of(g: &Graph, op: &Op) -> Conv1d {
    let x = shape(g, op.inputs[0]);
    Conv1d {
        b: x.first().copied().unwrap_or(0) as usize,
        t: x.get(1).copied().unwrap_or(0) as usize,
        c: x.iter().skip(2).product::<u64>() as usize,
        k: shape(g, op.inputs[1]).get(1).copied().unwrap_or(0) as usize,
    }
}

/// The scan of an SSD op: x (B,T,H,P), B (B,T,G,N), attribute `chunk`.
fn ssm_of(g: &Graph, op: &Op) -> Ssm {
    let (x, bm) = (shape(g, op.inputs[0]), shape(g, op.inputs[2]));
    let at = |s: &[u64], i: usize| s.get(i).copied().unwrap_or(0) as usize;
    Ssm {
        b: at(x, 0),
        t: at(x, 1),
        h: at(x, 2),
        p: at(x, 3),
        g: at(bm, 2),
        n: at(bm, 3),
        chunk: op.int("chunk").unwrap_or(1).max(1) as usize,
    }
}

/// The linear shape of `op`: weight (n, k), m rows of input.
fn linear_of(g: &Graph, op: &Op) -> (usize, usize, usize) {
    let (xid, wid) = (op.inputs[0], op.inputs[1]);
    let (n, k) = (shape(g, wid)[0] as usize, shape(g, wid)[1] as usize);
    (numel(g, xid) / k.max(1), n, k)
}

fn concat_of<'g>(g: &'g Graph, op: &Op) -> ConcatShapes<'g> {
    ConcatShapes {
        out: shape(g, op.outputs[0]),
        a: shape(g, op.inputs[0]),
        b: shape(g, op.inputs[1]),
    }
}

fn scratch<D: Device>(dev: &D, len: usize) -> Result<D::Buffer, ExecError> {
    dev.alloc(Elem::F32, len)
}

/// A gradient output staged for a kernel that overwrites it: the target itself, or
/// scratch that [`settle`] adds into the target.
struct Staged<'t, 'b, B> {
    target: &'t mut GradTarget<'b, B>,
    scratch: Option<B>,
}

impl<B> Staged<'_, '_, B> {
    fn out(&mut self) -> &mut B {
        match &mut self.scratch {
            Some(s) => s,
            None => self.target.buf,
        }
    }
}

fn stage<'t, 'b, D: Device>(
    dev: &D,
    target: &'t mut GradTarget<'b, D::Buffer>,
) -> Result<Staged<'t, 'b, D::Buffer>, ExecError> {
    let scratch = if target.accumulate {
        Some(scratch(dev, target.buf.len())?)
    } else {
        None
    };
    Ok(Staged { target, scratch })
}

/// Add a staged gradient into its target when the step accumulates.
fn settle<D: Device>(dev: &D, staged: Staged<'_, '_, D::Buffer>) -> Result<(), ExecError> {
    match staged.scratch {
        Some(tmp) => dev.add_assign(staged.target.buf, &tmp),
        None => Ok(()),
    }
}

/// Write a gradient with a kernel that overwrites its output.
fn emit<D: Device>(
    dev: &D,
    target: &mut GradTarget<'_, D::Buffer>,
    f: impl FnOnce(&mut D::Buffer) -> Result<(), ExecError>,
) -> Result<(), ExecError> {
    let mut staged = stage(dev, target)?;
    f(staged.out())?;
    settle(dev, staged)
}

/// Write a gradient with a kernel that adds into its output (weight gradients).
fn emit_add<D: Device>(
    dev: &D,
    target: &mut GradTarget<'_, D::Buffer>,
    f: impl FnOnce(&mut D::Buffer) -> Result<(), ExecError>,
) -> Result<(), ExecError> {
    if !target.accumulate {
        dev.zero(target.buf)?;
    }
    f(target.buf)
}

/// The gradient target of input `slot`, or a scratch buffer of `len` whose result is
/// dropped (kernels that always write every gradient, e.g. attention's dq/dk/dv).
fn target_or_scratch<'b, D: Device>(
    dev: &D,
    slot: Option<GradTarget<'b, D::Buffer>>,
    len: usize,
    keep: &'b mut Option<D::Buffer>,
) -> Result<GradTarget<'b, D::Buffer>, ExecError> {
    match slot {
        Some(t) => Ok(t),
        None => Ok(GradTarget {
            buf: keep.insert(scratch(dev, len)?),
            accumulate: false,
        }),
    }
}

/// A weight-gradient target that a kernel adds into: zeroed when the step is the first
/// writer.
fn zeroed_unless_accumulating<D: Device>(
    dev: &D,
    t: &mut GradTarget<'_, D::Buffer>,
) -> Result<(), ExecError> {
    if !t.accumulate {
        dev.zero(t.buf)?;
    }
    Ok(())
}

fn need<'b, B>(v: &[Option<&'b B>], i: usize, op: &Op, what: &str) -> Result<&'b B, ExecError> {
    v.get(i).copied().flatten().ok_or_else(|| {
        state(
            op,
            &format!("backward needs {what} (slot {i}), which was not saved"),
        )
    })
}

fn collective_here<D: Device>(dev: &D, op: &Op) -> ExecError {
    ExecError::Unsupported {
        op: op.name.clone(),
        kind: format!("{:?}", op.kind),
        device: dev.name(),
        why: "collectives need a multi-device backend; run the unsharded graph on one device"
            .into(),
    }
}

/// The routing plan of indices tensor `idx`: the dispatch's, or built here when the graph
/// runs a grouped linear without a dispatch of the same indices.
pub(super) fn plan_for<'p, D: Device>(
    dev: &D,
    g: &Graph,
    idx: TensorId,
    indices: &D::Buffer,
    e: usize,
    plans: &'p mut Plans<D::Plan>,
) -> Result<&'p D::Plan, ExecError> {
    if let std::collections::hash_map::Entry::Vacant(slot) = plans.routed.entry(idx) {
        let s = shape(g, idx);
        let (n, k) = (s[0] as usize, s.get(1).copied().unwrap_or(1) as usize);
        slot.insert(dev.dispatch_plan(indices, n, k, e)?);
    }
    plans
        .routed
        .get(&idx)
        .ok_or_else(|| ExecError::State("routing plan vanished".into()))
}

/// Run forward op `oi` of `g` on `dev`: read `inputs` (one per op input), overwrite
/// `outputs` (one per op output, allocated by the caller), push the statistics the
/// backward needs onto `aux` (in the order of the plan's
/// [`runner_graph::autodiff::Aux`]) and record routing plans in `plans`. `experts`: a
/// grouped linear's weights as one FP8 tensor per expert (the native FP8 route), read
/// instead of its weight input.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward<D: Device>(
    dev: &D,
    g: &Graph,
    oi: usize,
    inputs: &[&D::Buffer],
    experts: Option<&[D::Buffer]>,
    outputs: &mut [D::Buffer],
    aux: &mut Vec<D::Buffer>,
    plans: &mut Plans<D::Plan>,
) -> Result<(), ExecError> {
    let op = &g.ops[oi];
    forward_inner(dev, g, op, inputs, experts, outputs, aux, plans).map_err(named(op))
}

/// [`forward`] of an RMSNorm or MLP activation op `oi` whose output is also cast to the FP8
/// `codes` of the GEMM that reads it, under per-tensor `spec` with a given scale
/// ([`Device::forward_with_cast`]); what the cast did. Other ops are refused.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward_with_cast<D: Device>(
    dev: &D,
    g: &Graph,
    oi: usize,
    x: &[&D::Buffer],
    outputs: &mut [D::Buffer],
    aux: &mut Vec<D::Buffer>,
    codes: &mut D::Buffer,
    spec: &QuantSpec,
) -> Result<D::QuantStats, ExecError> {
    let op = &g.ops[oi];
    let r = match op.kind {
        OpKind::RmsNorm => {
            let (c, rows, eps) = rmsnorm_of(g, op);
            let mut rstd = scratch(dev, rows)?;
            let r = dev.forward_with_cast(CastProducer::RmsNorm { out: &mut outputs[0], rstd: &mut rstd, x: x[0], w: x[1], c, eps }, codes, spec);
            aux.push(rstd);
            r
        }
        OpKind::SwiGlu => dev.forward_with_cast(CastProducer::SwiGlu { out: &mut outputs[0], gate: x[0], up: x[1] }, codes, spec),
        OpKind::GeGlu => dev.forward_with_cast(CastProducer::GeGlu { out: &mut outputs[0], gate: x[0], up: x[1] }, codes, spec),
        OpKind::Gelu => dev.forward_with_cast(CastProducer::Gelu { out: &mut outputs[0], x: x[0] }, codes, spec),
        OpKind::SquaredRelu => dev.forward_with_cast(CastProducer::SquaredRelu { out: &mut outputs[0], x: x[0] }, codes, spec),
        _ => Err(state(op, "has no fused FP8 cast")),
    };
    r.map_err(named(op))
}

/// An RMSNorm's channels, rows and epsilon.
fn rmsnorm_of(g: &Graph, op: &Op) -> (usize, usize, f32) {
    let c = last(g, op.inputs[0]);
    (c, numel(g, op.inputs[0]) / c.max(1), f32_attr(op, "eps", 1e-5))
}

#[allow(clippy::too_many_arguments)]
fn forward_inner<D: Device>(
    dev: &D,
    g: &Graph,
    op: &Op,
    x: &[&D::Buffer],
    experts: Option<&[D::Buffer]>,
    outputs: &mut [D::Buffer],
    aux: &mut Vec<D::Buffer>,
    plans: &mut Plans<D::Plan>,
) -> Result<(), ExecError> {
    match op.kind {
        OpKind::Linear => {
            let (m, n, k) = linear_of(g, op);
            let gm = Gemm {
                m,
                n,
                k,
                trans_a: false,
                trans_b: true,
            };
            dev.matmul(&mut outputs[0], x[0], x[1], gm, false)?;
            if let Some(b) = x.get(2) {
                dev.add_bias(&mut outputs[0], b)?;
            }
        }
        OpKind::Embedding => {
            let c = last(g, op.inputs[1]);
            dev.embedding_forward(&mut outputs[0], x[0], x[1], c, None)?;
        }
        OpKind::RmsNorm => {
            let (c, rows, eps) = rmsnorm_of(g, op);
            let mut rstd = scratch(dev, rows)?;
            dev.rmsnorm_forward(&mut outputs[0], &mut rstd, x[0], x[1], c, eps)?;
            aux.push(rstd);
        }
        OpKind::LayerNorm => {
            let c = last(g, op.inputs[0]);
            let rows = numel(g, op.inputs[0]) / c;
            let (mut mean, mut rstd) = (scratch(dev, rows)?, scratch(dev, rows)?);
            let eps = f32_attr(op, "eps", 1e-5);
            dev.layernorm_forward(&mut outputs[0], &mut mean, &mut rstd, x[0], x[1], x[2], c, eps)?;
            aux.push(mean);
            aux.push(rstd);
        }
        OpKind::Rotary => dev.rope_forward(&mut outputs[0], x[0], rope_of(g, op))?,
        OpKind::Attention => {
            let a = attn_of(g, op);
            let mut lse = scratch(dev, a.b * a.h * a.t)?;
            dev.attention_forward(&mut outputs[0], &mut lse, x[0], x[1], x[2], a)?;
            aux.push(lse);
        }
        OpKind::CausalConv1d => dev.causal_conv1d_forward(&mut outputs[0], x[0], x[1], x[2], conv_of(g, op))?,
        OpKind::SsmScan => {
            let s = ssm_of(g, op);
            let mut states = scratch(dev, s.states_len())?;
            let i = SsmInputs { x: x[0], dt: x[1], bm: x[2], cm: x[3], a_log: x[4], d: x[5], dt_bias: x[6] };
            dev.ssm_scan_forward(&mut outputs[0], &mut states, i, s)?;
            aux.push(states);
        }
        OpKind::SwiGlu => dev.swiglu_forward(&mut outputs[0], x[0], x[1])?,
        OpKind::GeGlu => dev.geglu_forward(&mut outputs[0], x[0], x[1])?,
        OpKind::Gelu => dev.gelu_forward(&mut outputs[0], x[0])?,
        OpKind::SquaredRelu => dev.squared_relu_forward(&mut outputs[0], x[0])?,
        OpKind::Add => dev.add_forward(&mut outputs[0], x[0], x[1])?,
        OpKind::Concat => dev.concat_forward(&mut outputs[0], x[0], x[1], concat_of(g, op))?,
        OpKind::CrossEntropy => {
            let v = last(g, op.inputs[0]);
            let mut lse = scratch(dev, numel(g, op.inputs[0]) / v)?;
            dev.cross_entropy_forward(&mut outputs[0], &mut lse, x[0], x[1], v)?;
            aux.push(lse);
        }
        OpKind::Router => {
            let r = router_of(g, op);
            let mut probs = scratch(dev, r.n * r.e)?;
            let (w, idx) = outputs.split_at_mut(1);
            if idx[0].elem() != Elem::I32 {
                return Err(state(op, "router indices must be an int32 tensor"));
            }
            dev.router_forward(&mut w[0], &mut idx[0], &mut probs, x[0], &r)?;
            aux.push(probs);
        }
        OpKind::MoeDispatch => {
            let idx = op.inputs[1];
            let (n, k) = (shape(g, idx)[0] as usize, shape(g, idx)[1] as usize);
            let e = op.int("experts").unwrap_or(0).max(0) as usize;
            let plan = dev.dispatch_plan(x[1], n, k, e)?;
            let c = last(g, op.outputs[0]);
            dev.dispatch_forward(&mut outputs[0], x[0], &plan, c)?;
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
                plan_for(dev, g, op.inputs[2], x[2], e, plans)?
            };
            let w = experts.map_or(ExpertWeights::Stacked(x[1]), ExpertWeights::Each);
            dev.grouped_matmul_forward(&mut outputs[0], x[0], w, plan, k_in, n_out)?;
        }
        OpKind::MoeCombine => {
            let c = last(g, op.inputs[0]);
            let plan = plans
                .routed
                .get(&op.inputs[2])
                .ok_or_else(|| state(op, "no dispatch built a plan for these indices"))?;
            dev.combine_forward(&mut outputs[0], x[0], x[1], plan, c)?;
        }
        OpKind::AllReduce
        | OpKind::AllGather
        | OpKind::ReduceScatter
        | OpKind::AllToAll
        | OpKind::Send
        | OpKind::Recv => return Err(collective_here(dev, op)),
    }
    Ok(())
}

/// Run one backward step on `dev`.
pub(super) fn backward<D: Device>(
    dev: &D,
    g: &Graph,
    step: &BackwardStep,
    io: BackwardIo<'_, D>,
) -> Result<(), ExecError> {
    let op = &g.ops[step.op];
    backward_inner(dev, g, op, io).map_err(named(op))
}

fn backward_inner<D: Device>(
    dev: &D,
    g: &Graph,
    op: &Op,
    io: BackwardIo<'_, D>,
) -> Result<(), ExecError> {
    let BackwardIo {
        inputs,
        outputs,
        aux,
        grads_in,
        mut grads_out,
        plans,
        linear,
    } = io;
    // Zero gradient for outputs that carry none (not reaching the loss).
    let mut zeros: Vec<(usize, D::Buffer)> = Vec::new();
    for (slot, gi) in grads_in.iter().enumerate() {
        if gi.is_none() {
            let mut z = scratch(dev, numel(g, op.outputs[slot]))?;
            dev.zero(&mut z)?;
            zeros.push((slot, z));
        }
    }
    let dout = |slot: usize| -> Result<&D::Buffer, ExecError> {
        match grads_in.get(slot).copied().flatten() {
            Some(b) => Ok(b),
            None => zeros
                .iter()
                .find(|(s, _)| *s == slot)
                .map(|(_, z)| z)
                .ok_or_else(|| state(op, "output gradient missing")),
        }
    };
    // The loss's own gradient (a scalar; `None`: zero).
    let dloss = || grads_in.first().copied().flatten();
    let input = |i: usize, what: &str| need(&inputs, i, op, what);
    let saved = |i: usize, what: &str| aux.get(i).ok_or_else(|| state(op, &format!("{what} was not saved")));
    let mut take = |i: usize| grads_out.get_mut(i).and_then(Option::take);
    match op.kind {
        OpKind::Linear => {
            let (m, n, k) = linear_of(g, op);
            let dy = dout(0)?;
            let dgrad = Gemm { m, n: k, k: n, trans_a: false, trans_b: false };
            let wgrad = Gemm { m: n, n: k, k: m, trans_a: true, trans_b: false };
            if let Some(mut t) = take(0) {
                match linear.and_then(|l| l.dgrad.as_ref()) {
                    // Quantised operands; the result rounded to the plan's output format.
                    Some((qdy, qw, output)) => emit(dev, &mut t, |dx| {
                        let qw = qw.one().ok_or_else(|| state(op, "a linear's weight quantised per expert"))?;
                        dev.matmul(dx, qdy, qw, dgrad, false)?;
                        dev.round_to_storage(dx, *output, k)
                    })?,
                    None => dev.matmul(t.buf, dy, input(1, "the weight")?, dgrad, t.accumulate)?,
                }
            }
            if let Some(mut t) = take(1) {
                match linear.and_then(|l| l.wgrad.as_ref()) {
                    Some((qdy, qx, output)) => emit(dev, &mut t, |dw| {
                        dev.matmul(dw, qdy, qx, wgrad, false)?;
                        dev.round_to_storage(dw, *output, k)
                    })?,
                    None => dev.matmul(t.buf, dy, input(0, "the input")?, wgrad, t.accumulate)?,
                }
            }
            if let Some(mut t) = take(2) {
                emit_add(dev, &mut t, |db| dev.bias_backward(db, dy))?;
            }
        }
        OpKind::Embedding => {
            if let Some(mut t) = take(1) {
                let c = last(g, op.inputs[1]);
                let tokens = input(0, "the tokens")?;
                let d = dout(0)?;
                emit_add(dev, &mut t, |dw| dev.embedding_backward(dw, d, tokens, c, None))?;
            }
        }
        OpKind::RmsNorm => {
            let c = last(g, op.inputs[0]);
            let (x, w) = (input(0, "the input")?, input(1, "the weight")?);
            let rstd = saved(0, "rstd")?;
            let mut dw_scratch = None;
            let mut dwt = target_or_scratch(dev, take(1), c, &mut dw_scratch)?;
            zeroed_unless_accumulating(dev, &mut dwt)?;
            let mut dx_scratch = None;
            let mut dxt = target_or_scratch(dev, take(0), x.len(), &mut dx_scratch)?;
            let d = dout(0)?;
            emit(dev, &mut dxt, |dx| dev.rmsnorm_backward(dx, dwt.buf, d, x, w, rstd, c))?;
        }
        OpKind::LayerNorm => {
            let c = last(g, op.inputs[0]);
            let (x, w) = (input(0, "the input")?, input(1, "the weight")?);
            let (mean, rstd) = match aux {
                [m, r, ..] => (m, r),
                _ => return Err(state(op, "mean and rstd were not saved")),
            };
            let (mut s1, mut s2, mut s3) = (None, None, None);
            let mut dwt = target_or_scratch(dev, take(1), c, &mut s1)?;
            let mut dbt = target_or_scratch(dev, take(2), c, &mut s2)?;
            zeroed_unless_accumulating(dev, &mut dwt)?;
            zeroed_unless_accumulating(dev, &mut dbt)?;
            let mut dxt = target_or_scratch(dev, take(0), x.len(), &mut s3)?;
            let d = dout(0)?;
            emit(dev, &mut dxt, |dx| {
                dev.layernorm_backward(dx, dwt.buf, dbt.buf, d, x, w, mean, rstd, c)
            })?;
        }
        OpKind::Rotary => {
            if let Some(mut t) = take(0) {
                let r = rope_of(g, op);
                let d = dout(0)?;
                emit(dev, &mut t, |dx| dev.rope_backward(dx, d, r))?;
            }
        }
        OpKind::Attention => {
            let a = attn_of(g, op);
            let (q, k, v) = (input(0, "q")?, input(1, "k")?, input(2, "v")?);
            let out = need(&outputs, 0, op, "the attention output")?;
            let lse = saved(0, "lse")?;
            let (mut s0, mut s1, mut s2) = (None, None, None);
            let mut dq = target_or_scratch(dev, take(0), q.len(), &mut s0)?;
            let mut dk = target_or_scratch(dev, take(1), k.len(), &mut s1)?;
            let mut dv = target_or_scratch(dev, take(2), v.len(), &mut s2)?;
            // The kernel writes all three at once; accumulating targets go via scratch.
            let (mut t0, mut t1, mut t2) = (stage(dev, &mut dq)?, stage(dev, &mut dk)?, stage(dev, &mut dv)?);
            dev.attention_backward(t0.out(), t1.out(), t2.out(), dout(0)?, q, k, v, out, lse, a)?;
            for t in [t0, t1, t2] {
                settle(dev, t)?;
            }
        }
        OpKind::CausalConv1d => {
            let s = conv_of(g, op);
            let (x, w, b) = (input(0, "the input")?, input(1, "the weight")?, input(2, "the bias")?);
            let (mut s0, mut s1, mut s2) = (None, None, None);
            let mut dwt = target_or_scratch(dev, take(1), w.len(), &mut s1)?;
            let mut dbt = target_or_scratch(dev, take(2), b.len(), &mut s2)?;
            zeroed_unless_accumulating(dev, &mut dwt)?;
            zeroed_unless_accumulating(dev, &mut dbt)?;
            let mut dxt = target_or_scratch(dev, take(0), x.len(), &mut s0)?;
            let d = dout(0)?;
            emit(dev, &mut dxt, |dx| dev.causal_conv1d_backward(dx, dwt.buf, dbt.buf, d, x, w, b, s))?;
        }
        OpKind::SsmScan => {
            let s = ssm_of(g, op);
            let i = SsmInputs {
                x: input(0, "x")?,
                dt: input(1, "dt")?,
                bm: input(2, "B")?,
                cm: input(3, "C")?,
                a_log: input(4, "a_log")?,
                d: input(5, "d")?,
                dt_bias: input(6, "dt_bias")?,
            };
            let states = saved(0, "the chunk states")?;
            // Every gradient is written; those nobody needs go to scratch.
            let mut keep: [Option<D::Buffer>; 7] = Default::default();
            let [k0, k1, k2, k3, k4, k5, k6] = &mut keep;
            let n = i.map(|b| b.len());
            let mut t_dx = target_or_scratch(dev, take(0), n.x, k0)?;
            let mut t_ddt = target_or_scratch(dev, take(1), n.dt, k1)?;
            let mut t_dbm = target_or_scratch(dev, take(2), n.bm, k2)?;
            let mut t_dcm = target_or_scratch(dev, take(3), n.cm, k3)?;
            let mut t_da = target_or_scratch(dev, take(4), n.a_log, k4)?;
            let mut t_dd = target_or_scratch(dev, take(5), n.d, k5)?;
            let mut t_ddtb = target_or_scratch(dev, take(6), n.dt_bias, k6)?;
            for t in [&mut t_da, &mut t_dd, &mut t_ddtb] {
                zeroed_unless_accumulating(dev, t)?;
            }
            let (mut sx, mut sdt, mut sb, mut sc) = (stage(dev, &mut t_dx)?, stage(dev, &mut t_ddt)?, stage(dev, &mut t_dbm)?, stage(dev, &mut t_dcm)?);
            let grads = SsmGrads {
                dx: sx.out(),
                ddt: sdt.out(),
                dbm: sb.out(),
                dcm: sc.out(),
                da_log: t_da.buf,
                dd: t_dd.buf,
                ddt_bias: t_ddtb.buf,
            };
            dev.ssm_scan_backward(grads, dout(0)?, i, states, s)?;
            for t in [sx, sdt, sb, sc] {
                settle(dev, t)?;
            }
        }
        OpKind::SwiGlu | OpKind::GeGlu => {
            let (gate, up) = (input(0, "the gate")?, input(1, "the up projection")?);
            let (mut s0, mut s1) = (None, None);
            let mut dg = target_or_scratch(dev, take(0), gate.len(), &mut s0)?;
            let mut du = target_or_scratch(dev, take(1), up.len(), &mut s1)?;
            let (mut tg, mut tu) = (stage(dev, &mut dg)?, stage(dev, &mut du)?);
            let d = dout(0)?;
            if op.kind == OpKind::SwiGlu {
                dev.swiglu_backward(tg.out(), tu.out(), d, gate, up)?;
            } else {
                dev.geglu_backward(tg.out(), tu.out(), d, gate, up)?;
            }
            settle(dev, tg)?;
            settle(dev, tu)?;
        }
        OpKind::Gelu | OpKind::SquaredRelu => {
            if let Some(mut t) = take(0) {
                let x = input(0, "the input")?;
                let d = dout(0)?;
                if op.kind == OpKind::Gelu {
                    emit(dev, &mut t, |dx| dev.gelu_backward(dx, d, x))?;
                } else {
                    emit(dev, &mut t, |dx| dev.squared_relu_backward(dx, d, x))?;
                }
            }
        }
        OpKind::Add => {
            let d = dout(0)?;
            for slot in 0..2 {
                if let Some(mut t) = take(slot) {
                    emit(dev, &mut t, |dx| dev.copy(dx, 0, d, 0, d.len()))?;
                }
            }
        }
        OpKind::Concat => {
            let (mut ta, mut tb) = (take(0), take(1));
            for t in [&mut ta, &mut tb].into_iter().flatten() {
                zeroed_unless_accumulating(dev, t)?;
            }
            dev.concat_backward(
                ta.map(|t| t.buf),
                tb.map(|t| t.buf),
                dout(0)?,
                concat_of(g, op),
            )?;
        }
        OpKind::CrossEntropy => {
            if let Some(mut t) = take(0) {
                let v = last(g, op.inputs[0]);
                let logits = input(0, "the logits")?;
                let targets = input(1, "the targets")?;
                let lse = saved(0, "lse")?;
                emit(dev, &mut t, |dl| {
                    dev.cross_entropy_backward(dl, logits, lse, targets, v, dloss())
                })?;
            }
        }
        OpKind::Router => {
            if let Some(mut t) = take(0) {
                let r = router_of(g, op);
                let probs = saved(0, "probs")?;
                let idx = need(&outputs, 1, op, "the router indices")?;
                let d = dout(0)?;
                emit(dev, &mut t, |dl| dev.router_backward(dl, d, probs, idx, &r))?;
            }
        }
        OpKind::MoeDispatch => {
            if let Some(mut t) = take(0) {
                let plan = plans
                    .routed
                    .get(&op.inputs[1])
                    .ok_or_else(|| state(op, "the routing plan was not saved"))?;
                let c = last(g, op.outputs[0]);
                let d = dout(0)?;
                emit(dev, &mut t, |dx| dev.dispatch_backward(dx, d, plan, c))?;
            }
        }
        OpKind::GroupedLinear => {
            let w = shape(g, op.inputs[1]);
            let (n_out, k_in) = (w[1] as usize, w[2] as usize);
            let plan = plans
                .for_experts(op.inputs[2])
                .ok_or_else(|| state(op, "the routing plan was not saved"))?;
            let xs = input(0, "the sorted tokens")?;
            let wv = input(1, "the expert weights")?;
            let d = dout(0)?;
            // Under a precision plan each GEMM reads its own quantised copies, and its
            // result is rounded to its plan's output format before it joins a sum.
            let dgrad = linear.and_then(|l| l.dgrad.as_ref());
            let wgrad = linear.and_then(|l| l.wgrad.as_ref());
            let (dy_d, w_d) = dgrad.map_or((d, ExpertWeights::Stacked(wv)), |(g, w, _)| (g, w.experts()));
            let (dy_w, x_w) = wgrad.map_or((d, xs), |(g, x, _)| (g, x));
            let (mut s0, mut s1, mut s2) = (None, None, None);
            let mut dwt = target_or_scratch(dev, take(1), wv.len(), &mut s1)?;
            // A rounded weight gradient is computed alone, then added in.
            let mut dw_own = match wgrad {
                Some(_) => Some(GradTarget { buf: s2.insert(scratch(dev, wv.len())?), accumulate: false }),
                None => None,
            };
            let dw_into = dw_own.as_mut().unwrap_or(&mut dwt);
            zeroed_unless_accumulating(dev, dw_into)?;
            let mut dxt = target_or_scratch(dev, take(0), xs.len(), &mut s0)?;
            emit(dev, &mut dxt, |dx| {
                dev.grouped_matmul_backward(dx, dw_into.buf, dy_d, dy_w, x_w, w_d, plan, k_in, n_out)?;
                match dgrad {
                    Some((_, _, output)) => dev.round_to_storage(dx, *output, k_in),
                    None => Ok(()),
                }
            })?;
            if let (Some((_, _, output)), Some(own)) = (wgrad, dw_own) {
                dev.round_to_storage(own.buf, *output, k_in)?;
                emit_add(dev, &mut dwt, |dw| dev.add_assign(dw, own.buf))?;
            }
        }
        OpKind::MoeCombine => {
            let c = last(g, op.inputs[0]);
            let plan = plans
                .routed
                .get(&op.inputs[2])
                .ok_or_else(|| state(op, "the routing plan was not saved"))?;
            let ys = input(0, "the expert outputs")?;
            let wts = input(1, "the router weights")?;
            let (mut s0, mut s1) = (None, None);
            let mut dyt = target_or_scratch(dev, take(0), ys.len(), &mut s0)?;
            let mut dwt = target_or_scratch(dev, take(1), wts.len(), &mut s1)?;
            let (mut ty, mut tw) = (stage(dev, &mut dyt)?, stage(dev, &mut dwt)?);
            dev.combine_backward(ty.out(), tw.out(), dout(0)?, ys, wts, plan, c)?;
            settle(dev, ty)?;
            settle(dev, tw)?;
        }
        OpKind::AllReduce
        | OpKind::AllGather
        | OpKind::ReduceScatter
        | OpKind::AllToAll
        | OpKind::Send
        | OpKind::Recv => return Err(collective_here(dev, op)),
    }
    Ok(())
}
