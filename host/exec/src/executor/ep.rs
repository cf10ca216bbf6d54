//! Expert parallelism on the host: the two `ep` all-to-alls around the experts of a
//! sharded MoE layer, as Megatron-LM's dropless all-to-all token dispatcher runs them.
//!
//! - The dispatch side (the all-to-all reading the `moe-dispatch` output, whose rows are
//!   sorted by global expert) first all-gathers every rank's rows per expert over `ep`,
//!   so every rank knows how many rows it receives from whom, then sends each rank the
//!   rows of the experts it holds: rank j of the `ep` group holds experts
//!   j·E/ep..(j+1)·E/ep, whose rows are contiguous in the sorted input. The received rows
//!   are arranged expert-major (local expert, then source rank, then the source's order),
//!   so each local expert's rows are one contiguous GEMM operand; a plan over them
//!   ([`Device::presorted_plan`], kept in [`Plans::received`](crate::device::Plans)) is
//!   what the grouped linears between the two all-to-alls run on. The router's own plan
//!   stays for the dispatch and the combine.
//! - The combine side (the all-to-all whose output the `moe-combine` reads) is the exact
//!   inverse: every expert output row goes back to the rank and the position it came
//!   from, in the order of that rank's routing plan.
//! - Backward: each side's backward is the other side's exchange on the gradients, with
//!   the same counts.
//! - Data-dependent rows: how many rows a rank receives depends on the routing. The
//!   sharded graph declares the tensors between the two all-to-alls at their balanced
//!   size (each rank receives what it sends), which is what the counters price; the
//!   executor records the actual rows of the received tensor and of every tensor
//!   computed from it ([`EpState::rows`]) and sizes their values and gradients by them.
//!   [`super::Executor::memory`]'s required bytes keep the balanced sizes.
//! - Expert tensor parallelism (etp > 1; etp consecutive ranks of one tp group), without
//!   sequence parallelism: the etp ranks hold the same tokens. The grouped linears that split an expert's
//!   width (their output is not summed by an `etp` all-reduce) leave a per-rank partial
//!   input gradient, all-reduced over `etp` (Megatron's `f`); the sharded graph sums the
//!   other linears' partial outputs with an `etp` all-reduce.
//! - With sequence parallelism each etp rank holds its own tokens, as
//!   Megatron's alltoall dispatcher has them: the rows each rank has for its experts
//!   (what the ep all-to-all received, or without one what it routed) are all-gathered
//!   over etp, arranged expert-major (local expert, then etp rank) with a plan over
//!   them, and after the experts the partial outputs are reduce-scattered back, each
//!   rank's rows summed over the etp ranks ([`Executor::etp_forward`]). The counts per
//!   expert differ between the ranks, so the gather first all-gathers them; the
//!   backward of each is the other's arithmetic on the gradients. Other layouts are
//!   refused when the executor is built.

use std::collections::HashMap;

use runner_graph::{Graph, Op, OpKind, TensorId};


use super::Executor;
use super::comm::Timed;
use crate::device::{Device, DeviceBuffer, Elem, ExecError};

/// Which all-to-all of an expert-parallel MoE layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    /// Sorted token copies → the rows of this rank's experts.
    Dispatch,
    /// Expert outputs → back to the ranks the rows came from.
    Combine,
}

/// One MoE layer's exchange in this step.
#[derive(Clone, Debug)]
struct Route {
    /// `counts[s][e]`: rows rank `s` of the ep group routes to global expert `e`.
    counts: Vec<Vec<usize>>,
    /// This rank in the ep group.
    me: usize,
    /// Experts per rank.
    local: usize,
}

impl Route {
    /// Rows rank `s` sends to each expert of rank `j`.
    fn block(&self, s: usize, j: usize) -> &[usize] {
        &self.counts[s][j * self.local..(j + 1) * self.local]
    }
    /// Rows rank `s` sends to rank `j`.
    fn between(&self, s: usize, j: usize) -> usize {
        self.block(s, j).iter().sum()
    }
    fn ranks(&self) -> usize {
        self.counts.len()
    }
    /// Rows this rank receives.
    fn received(&self) -> usize {
        (0..self.ranks()).map(|s| self.between(s, self.me)).sum()
    }
    /// Rows this rank routed (its dispatch output).
    fn routed(&self) -> usize {
        self.counts[self.me].iter().sum()
    }
    /// Rows of each local expert, over all sources.
    fn local_counts(&self) -> Vec<usize> {
        (0..self.local)
            .map(|e| (0..self.ranks()).map(|s| self.block(s, self.me)[e]).sum())
            .collect()
    }
}

/// The expert-parallel state of one step: the exchanges and the tensors whose rows they
/// decide.
#[derive(Debug, Default)]
pub(super) struct EpState {
    /// Actual leading rows of the tensors whose row count depends on the routing (the
    /// received rows and everything computed from them), when they differ from nothing
    /// but the routing; absent tensors have their graph shape.
    pub(super) rows: HashMap<TensorId, usize>,
    /// The exchange of each MoE layer, by its router-indices tensor.
    routes: HashMap<TensorId, Route>,
    /// Under expert tensor parallelism with sequence parallelism: rows per local expert
    /// of every etp rank (`[m][e]`), by the gathered router-indices tensor the layer's
    /// grouped linears read.
    etp_rows: HashMap<TensorId, Vec<Vec<usize>>>,
}

impl EpState {
    pub(super) fn clear(&mut self) {
        self.rows.clear();
        self.routes.clear();
        self.etp_rows.clear();
    }

    /// Rows of op `op`'s outputs when it reads a tensor of data-dependent rows (an op
    /// between an expert-parallel layer's all-to-alls): the same rows, on the same
    /// leading axis. `None` for every other op; the all-to-alls size their own outputs.
    ///
    /// # Errors
    /// Inputs of different data-dependent rows, or an output whose leading axis is not
    /// those rows.
    pub(super) fn propagated_rows(&self, g: &Graph, op: &Op) -> Result<Option<usize>, ExecError> {
        if op.kind == OpKind::AllToAll || etp_side(op).is_some() || self.rows.is_empty() {
            return Ok(None);
        }
        let mut found: Option<(usize, TensorId)> = None;
        for &i in &op.inputs {
            let Some(&r) = self.rows.get(&i) else {
                continue;
            };
            match found {
                Some((r0, i0)) if r0 != r => {
                    return Err(ExecError::State(format!(
                        "operation '{}' reads '{}' of {r0} rows and '{}' of {r} rows (rows set by \
                         the expert routing)",
                        op.name, g.tensors[i0].name, g.tensors[i].name
                    )));
                }
                _ => found = Some((r, i)),
            }
        }
        let Some((r, i)) = found else {
            return Ok(None);
        };
        let lead = g.tensors[i].shape.first();
        if let Some(&o) = op
            .outputs
            .iter()
            .find(|&&o| g.tensors[o].shape.first() != lead)
        {
            return Err(ExecError::Unsupported {
                op: op.name.clone(),
                kind: format!("{:?}", op.kind),
                device: "the expert-parallel executor".into(),
                why: format!(
                    "it reads '{}', whose rows depend on the expert routing, but its output '{}' \
                     {:?} does not keep those rows as its leading axis",
                    g.tensors[i].name, g.tensors[o].name, g.tensors[o].shape
                ),
            });
        }
        Ok(Some(r))
    }
}

/// Source-major blocks `[s][e]` of `x` (rows of `w` elements, block sizes `rows(s, e)`)
/// rearranged expert-major `[e][s]`, or back when `to_expert_major` is false: one
/// device copy per non-empty block.
fn transpose_blocks<D: Device>(
    dev: &D,
    x: &D::Buffer,
    n: usize,
    local: usize,
    w: usize,
    rows: impl Fn(usize, usize) -> usize,
    to_expert_major: bool,
) -> Result<D::Buffer, ExecError> {
    // Start of block (s, e) in each layout.
    let mut src_at = vec![vec![0usize; local]; n];
    let mut exp_at = vec![vec![0usize; local]; n];
    let mut at = 0;
    for (s, starts) in src_at.iter_mut().enumerate() {
        for (e, st) in starts.iter_mut().enumerate() {
            *st = at;
            at += rows(s, e) * w;
        }
    }
    at = 0;
    for e in 0..local {
        for (s, starts) in exp_at.iter_mut().enumerate() {
            starts[e] = at;
            at += rows(s, e) * w;
        }
    }
    let mut out = dev.alloc(x.elem(), x.len())?;
    for s in 0..n {
        for e in 0..local {
            let len = rows(s, e) * w;
            let (from, to) = if to_expert_major {
                (src_at[s][e], exp_at[s][e])
            } else {
                (exp_at[s][e], src_at[s][e])
            };
            if len > 0 {
                dev.copy(&mut out, to, x, from, len)?;
            }
        }
    }
    Ok(out)
}

/// Which side of the experts an etp collective of the sequence-parallel scheme is: the
/// all-gather of the rows before them (`true`) or the reduce-scatter after (`false`).
/// The gather of the routing indices beside the first is a plain all-gather.
fn etp_side(op: &Op) -> Option<bool> {
    match op.kind {
        OpKind::AllGather | OpKind::ReduceScatter if op.text("group") == Some("etp") => Some(op.kind == OpKind::AllGather),
        _ => None,
    }
}

fn state(op: &Op, what: String) -> ExecError {
    ExecError::State(format!("operation '{}': {what}", op.name))
}

/// Every rank's rows per expert (`[rank][expert]`) from this rank's `mine`, all-gathered
/// over `c` as int32 counts: what an exchange of routed rows sizes its parts by.
fn all_gather_counts<D: Device>(dev: &D, c: &Timed<'_, D>, op: &Op, mine: &[usize]) -> Result<Vec<Vec<usize>>, ExecError> {
    let mine: Vec<u32> = mine
        .iter()
        .map(|&v| u32::try_from(v))
        .collect::<Result<_, _>>()
        .map_err(|_| state(op, "more rows for one expert than an int32 count holds".into()))?;
    let e = mine.len();
    if e == 0 {
        return Err(state(op, "no experts to count rows for".into()));
    }
    let mut counts = dev.alloc(Elem::I32, mine.len())?;
    dev.write_u32(&mut counts, &mine)?;
    let mut all = dev.alloc(Elem::I32, mine.len() * c.size())?;
    c.all_gather(&counts, &mut all)?;
    Ok(dev.read_u32(&all)?.chunks(e).map(|r| r.iter().map(|&v| v as usize).collect()).collect())
}

/// Every etp rank's rows (`x`, this rank's, expert-major by `rows[me]`) gathered over
/// `c`, expert-major over the ranks: local expert, then rank.
fn gather_rows<D: Device>(dev: &D, c: &Timed<'_, D>, op: &Op, x: &D::Buffer, rows: &[Vec<usize>], w: usize) -> Result<D::Buffer, ExecError> {
    let (n, me) = (c.size(), c.rank());
    let total = |m: usize| rows[m].iter().sum::<usize>() * w;
    if x.len() != total(me) {
        return Err(state(op, format!("{} elements to gather, the routing says {} rows of {w}", x.len(), total(me) / w.max(1))));
    }
    // An all-gather of unequal parts: this rank's rows sent to every rank.
    let mut send = dev.alloc(x.elem(), x.len() * n)?;
    for j in 0..n {
        dev.copy(&mut send, j * x.len(), x, 0, x.len())?;
    }
    let recv: Vec<usize> = (0..n).map(total).collect();
    let mut got = dev.alloc(x.elem(), recv.iter().sum())?;
    c.all_to_all_v(&send, &vec![x.len(); n], &mut got, &recv)?;
    let local = rows[me].len();
    transpose_blocks(dev, &got, n, local, w, |m, e| rows[m][e], true)
}

/// Inverse of [`gather_rows`]: rows expert-major over the etp ranks → each rank's own
/// rows (expert-major), summed over the ranks' values of them.
fn scatter_rows<D: Device>(dev: &D, c: &Timed<'_, D>, op: &Op, y: &D::Buffer, rows: &[Vec<usize>], w: usize) -> Result<D::Buffer, ExecError> {
    let (n, me) = (c.size(), c.rank());
    let total = |m: usize| rows[m].iter().sum::<usize>() * w;
    if y.len() != (0..n).map(total).sum::<usize>() {
        return Err(state(op, format!("{} elements to reduce-scatter, the etp ranks gathered {}", y.len(), (0..n).map(total).sum::<usize>())));
    }
    let local = rows[me].len();
    let by_rank = transpose_blocks(dev, y, n, local, w, |m, e| rows[m][e], false)?;
    let mine = total(me);
    let mut got = dev.alloc(y.elem(), mine * n)?;
    c.all_to_all_v(&by_rank, &(0..n).map(total).collect::<Vec<_>>(), &mut got, &vec![mine; n])?;
    let mut out = dev.alloc(y.elem(), mine)?;
    dev.copy(&mut out, 0, &got, 0, mine)?;
    if mine > 0 {
        for j in 1..n {
            let mut part = dev.alloc(y.elem(), mine)?;
            dev.copy(&mut part, 0, &got, j * mine, mine)?;
            dev.add_assign(&mut out, &part)?;
        }
    }
    Ok(out)
}

impl<D: Device> Executor<D> {
    /// For an `ep` all-to-all: which side of its MoE layer it is and the router-indices
    /// tensor of that layer.
    fn ep_link(&self, op: &Op) -> Option<(Side, TensorId)> {
        if op.kind != OpKind::AllToAll || op.text("group") != Some("ep") {
            return None;
        }
        let (x, y) = (*op.inputs.first()?, *op.outputs.first()?);
        self.graph.ops.iter().find_map(|o| match o.kind {
            OpKind::MoeDispatch if o.outputs.first() == Some(&x) => {
                Some((Side::Dispatch, *o.inputs.get(1)?))
            }
            OpKind::MoeCombine if o.inputs.first() == Some(&y) => {
                Some((Side::Combine, *o.inputs.get(2)?))
            }
            _ => None,
        })
    }

    /// Whether op `op` is an expert-parallel all-to-all this module runs.
    pub(super) fn is_ep_all_to_all(&self, op: &Op) -> bool {
        self.ep_link(op).is_some()
    }

    /// Width of the rows an all-to-all moves (the last axis of its input).
    fn row_width(&self, op: &Op) -> usize {
        self.graph.tensors[op.inputs[0]]
            .shape
            .last()
            .copied()
            .unwrap_or(1)
            .max(1) as usize
    }

    /// Rows per global expert of every rank of the ep group (an all-gather of this
    /// rank's routing plan's counts).
    fn exchange_counts(&self, op: &Op, c: &Timed<'_, D>, idx: TensorId) -> Result<Route, ExecError> {
        let plan = self.plans.routed.get(&idx).ok_or_else(|| {
            state(
                op,
                format!(
                    "no routing plan for '{}' (the dispatch runs first)",
                    self.graph.tensors[idx].name
                ),
            )
        })?;
        let mine = self.device.plan_counts(plan)?;
        let (n, e) = (c.size(), mine.len());
        if e == 0 || !e.is_multiple_of(n) {
            return Err(state(
                op,
                format!("{e} experts do not split over the {n} ranks of group 'ep'"),
            ));
        }
        Ok(Route {
            counts: all_gather_counts(&self.device, c, op, &mine)?,
            me: c.rank(),
            local: e / n,
        })
    }

    /// This rank's routed rows (sorted by global expert) → the rows of its experts from
    /// every rank, expert-major.
    fn to_experts(
        &self,
        op: &Op,
        c: &Timed<'_, D>,
        r: &Route,
        x: &D::Buffer,
        w: usize,
    ) -> Result<D::Buffer, ExecError> {
        if x.len() != r.routed() * w {
            return Err(state(
                op,
                format!(
                    "{} elements to send, the routing says {} rows of {w}",
                    x.len(),
                    r.routed()
                ),
            ));
        }
        let n = r.ranks();
        let send: Vec<usize> = (0..n).map(|j| r.between(r.me, j) * w).collect();
        let recv: Vec<usize> = (0..n).map(|s| r.between(s, r.me) * w).collect();
        let mut got = self.device.alloc(x.elem(), recv.iter().sum())?;
        c.all_to_all_v(x, &send, &mut got, &recv)?;
        transpose_blocks(&self.device, &got, n, r.local, w, |s, e| r.block(s, r.me)[e], true)
    }

    /// Inverse of [`Executor::to_experts`]: rows of this rank's experts, expert-major →
    /// back to their ranks, which get them in the order of their routing plans.
    fn to_sources(
        &self,
        op: &Op,
        c: &Timed<'_, D>,
        r: &Route,
        y: &D::Buffer,
        w: usize,
    ) -> Result<D::Buffer, ExecError> {
        if y.len() != r.received() * w {
            return Err(state(
                op,
                format!(
                    "{} elements to send back, this rank received {} rows of {w}",
                    y.len(),
                    r.received()
                ),
            ));
        }
        let n = r.ranks();
        let by_source = transpose_blocks(&self.device, y, n, r.local, w, |s, e| r.block(s, r.me)[e], false)?;
        let send: Vec<usize> = (0..n).map(|s| r.between(s, r.me) * w).collect();
        let recv: Vec<usize> = (0..n).map(|j| r.between(r.me, j) * w).collect();
        let mut out = self.device.alloc(y.elem(), recv.iter().sum())?;
        c.all_to_all_v(&by_source, &send, &mut out, &recv)?;
        Ok(out)
    }

    fn route(&self, op: &Op, idx: TensorId) -> Result<&Route, ExecError> {
        self.ep.routes.get(&idx).ok_or_else(|| {
            state(
                op,
                "no expert-parallel exchange recorded for its layer (the dispatch all-to-all \
                 runs first)"
                    .into(),
            )
        })
    }

    /// Forward of expert-parallel all-to-all `oi`: writes its output into `out`
    /// (replaced by a buffer of the rows received) and records the rows and the
    /// received plan.
    pub(super) fn ep_forward(&mut self, oi: usize, out: &mut D::Buffer) -> Result<(), ExecError> {
        let op = self.graph.ops[oi].clone();
        let Some((side, idx)) = self.ep_link(&op) else {
            return Err(state(&op, "not an expert-parallel all-to-all".into()));
        };
        let w = self.row_width(&op);
        let (y, route) = {
            let x = self.val(op.inputs[0], &op)?;
            let c = self.group(&op)?;
            match side {
                Side::Dispatch => {
                    let r = self.exchange_counts(&op, &c, idx)?;
                    (self.to_experts(&op, &c, &r, x, w)?, Some(r))
                }
                Side::Combine => {
                    let r = self.route(&op, idx)?;
                    (self.to_sources(&op, &c, r, x, w)?, None)
                }
            }
        };
        *out = y;
        if let Some(r) = route {
            let plan = self.device.presorted_plan(&r.local_counts())?;
            self.plans.received.insert(idx, plan);
            self.ep.rows.insert(op.outputs[0], r.received());
            self.ep.routes.insert(idx, r);
        }
        Ok(())
    }

    /// Backward of expert-parallel all-to-all `op`: the gradient of its input from
    /// `dout`, the gradient of its output (the other side's exchange).
    pub(super) fn ep_backward(&self, op: &Op, dout: &D::Buffer) -> Result<D::Buffer, ExecError> {
        let Some((side, idx)) = self.ep_link(op) else {
            return Err(state(op, "not an expert-parallel all-to-all".into()));
        };
        let w = self.row_width(op);
        let c = self.group(op)?;
        let r = self.route(op, idx)?;
        match side {
            Side::Dispatch => self.to_sources(op, &c, r, dout, w),
            Side::Combine => self.to_experts(op, &c, r, dout, w),
        }
    }

    /// For an etp collective around the experts: whether it gathers (else reduce-
    /// scatters) and the gathered router-indices tensor its grouped linears read. `None`
    /// for every other op, the gather of the indices included (a plain all-gather).
    fn etp_link(&self, op: &Op) -> Option<(bool, TensorId)> {
        let gather = etp_side(op)?;
        let g = &self.graph;
        let linear = if gather {
            let x = *op.outputs.first()?;
            g.ops.iter().find(|o| o.kind == OpKind::GroupedLinear && o.inputs.first() == Some(&x))?
        } else {
            let x = *op.inputs.first()?;
            g.ops.iter().find(|o| o.kind == OpKind::GroupedLinear && o.outputs.first() == Some(&x))?
        };
        Some((gather, *linear.inputs.get(2)?))
    }

    /// Whether op `op` is an etp gather or reduce-scatter of expert rows this module runs.
    pub(super) fn is_etp_exchange(&self, op: &Op) -> bool {
        self.etp_link(op).is_some()
    }

    /// This rank's rows per local expert ahead of the etp gather reading `x`: what the
    /// ep all-to-all received (expert-major), or without one what the dispatch routed.
    fn rows_per_local_expert(&self, op: &Op, x: TensorId, gathered_idx: TensorId) -> Result<Vec<usize>, ExecError> {
        let g = &self.graph;
        let idx = g
            .ops
            .iter()
            .find(|o| o.kind == OpKind::AllGather && o.outputs.first() == Some(&gathered_idx))
            .and_then(|o| o.inputs.first().copied())
            .ok_or_else(|| state(op, "no gather of the routing indices beside it".into()))?;
        let from_a2a = g.ops.iter().any(|o| o.kind == OpKind::AllToAll && o.outputs.first() == Some(&x));
        if from_a2a {
            return Ok(self.route(op, idx)?.local_counts());
        }
        let plan = self.plans.routed.get(&idx).ok_or_else(|| state(op, "no routing plan (the dispatch runs first)".into()))?;
        self.device.plan_counts(plan)
    }

    /// Forward of etp exchange `oi`. The gather: every etp rank's rows (each rank's
    /// expert-major), arranged expert-major over the ranks (local expert, then etp rank),
    /// with the plan the grouped linears run on; the reduce-scatter: the inverse, each
    /// rank's rows back to it, summed over the etp ranks' partial outputs.
    pub(super) fn etp_forward(&mut self, oi: usize, out: &mut D::Buffer) -> Result<(), ExecError> {
        let op = self.graph.ops[oi].clone();
        let Some((gather, gidx)) = self.etp_link(&op) else {
            return Err(state(&op, "not an etp exchange of expert rows".into()));
        };
        let w = self.row_width(&op);
        let x = op.inputs[0];
        if !gather {
            let rows = self.etp_rows(&op, gidx)?;
            let c = self.group(&op)?;
            *out = scatter_rows(&self.device, &c, &op, self.val(x, &op)?, rows, w)?;
            // The rows go back to the ranks that had them: data-dependent where an
            // all-to-all received them.
            let mine = rows.get(c.rank()).map_or(0, |r| r.iter().sum());
            if self.ep.rows.contains_key(&x) {
                self.ep.rows.insert(op.outputs[0], mine);
            }
            return Ok(());
        }
        let mine = self.rows_per_local_expert(&op, x, gidx)?;
        let dev = &self.device;
        let (y, rows) = {
            let c = self.group(&op)?;
            let rows = all_gather_counts(dev, &c, &op, &mine)?;
            (gather_rows(dev, &c, &op, self.val(x, &op)?, &rows, w)?, rows)
        };
        let per_expert: Vec<usize> = (0..mine.len()).map(|j| rows.iter().map(|r| r[j]).sum()).collect();
        let plan = dev.presorted_plan(&per_expert)?;
        self.plans.received.insert(gidx, plan);
        if self.ep.rows.contains_key(&x) {
            self.ep.rows.insert(op.outputs[0], per_expert.iter().sum());
        }
        self.ep.etp_rows.insert(gidx, rows);
        *out = y;
        Ok(())
    }

    /// Backward of etp exchange `op`: the other side's arithmetic on the gradients.
    pub(super) fn etp_backward(&self, op: &Op, dout: &D::Buffer) -> Result<D::Buffer, ExecError> {
        let Some((gather, gidx)) = self.etp_link(op) else {
            return Err(state(op, "not an etp exchange of expert rows".into()));
        };
        let w = self.row_width(op);
        let c = self.group(op)?;
        let rows = self.etp_rows(op, gidx)?;
        if gather { scatter_rows(&self.device, &c, op, dout, rows, w) } else { gather_rows(&self.device, &c, op, dout, rows, w) }
    }

    fn etp_rows(&self, op: &Op, gidx: TensorId) -> Result<&Vec<Vec<usize>>, ExecError> {
        self.ep.etp_rows.get(&gidx).ok_or_else(|| state(op, "no etp gather recorded for its layer (the gather runs first)".into()))
    }

    /// The etp group, when there is one of more than one rank.
    fn etp_group(&self) -> Option<Timed<'_, D>> {
        self.timed("etp").filter(|c| c.size() > 1)
    }

    /// Whether grouped linear `op` splits its experts' output width over etp (its output
    /// is not summed by an etp all-reduce), which leaves its input gradient a per-rank
    /// partial to all-reduce over etp.
    pub(super) fn expert_input_partial(&self, op: &Op) -> bool {
        op.kind == OpKind::GroupedLinear
            && self.etp_group().is_some()
            // Under sequence parallelism the etp gather's backward sums them.
            && !self.graph.ops.iter().any(|o| etp_side(o) == Some(true))
            && !self.graph.ops.iter().any(|o| {
                o.kind == OpKind::AllReduce
                    && o.text("group") == Some("etp")
                    && o.inputs.first() == op.outputs.first()
            })
    }

    /// Refuse an etp all-reduce of partial expert outputs whose etp ranks hold different
    /// tokens: with sequence parallelism (whose etp scheme is a gather and a
    /// reduce-scatter), or an etp group that does not divide the tp group.
    pub(super) fn check_expert_tensor_parallel(&self) -> Result<(), ExecError> {
        let Some(op) = self.graph.ops.iter().find(|o| {
            o.kind == OpKind::AllReduce
                && o.text("group") == Some("etp")
                && o.int("group-size").unwrap_or(1) > 1
        }) else {
            return Ok(());
        };
        let etp = op.int("group-size").unwrap_or(1) as usize;
        let sp = self
            .graph
            .ops
            .iter()
            .any(|o| o.kind == OpKind::ReduceScatter && o.text("group") == Some("tp"));
        let tp = self.collectives.get("tp").map_or(1, |c| c.size());
        let why = if sp {
            // Sequence parallelism's etp scheme gathers and reduce-scatters; an etp
            // all-reduce would sum partial outputs of different tokens.
            Err("with sequence parallelism the etp ranks hold different tokens: their rows are gathered over etp \
                 before the experts and reduce-scattered after, not summed with an all-reduce (shard the graph \
                 with runner_graph::shard)"
                .to_string())
        } else {
            runner_graph::shard::expert_tensor_parallel_tokens(tp as u64, etp as u64, sp)
        };
        if let Err(why) = why {
            return Err(ExecError::Unsupported {
                op: op.name.clone(),
                kind: format!("{:?}", op.kind),
                device: "the in-process collective backend".into(),
                why,
            });
        }
        Ok(())
    }

    /// Elements tensor `id` holds this step: its graph size, or its data-dependent rows
    /// times its row size.
    pub(super) fn numel_of(&self, id: TensorId) -> usize {
        let t = &self.graph.tensors[id];
        let n = t.numel() as usize;
        match (self.ep.rows.get(&id), t.shape.first()) {
            (Some(&r), Some(&lead)) if lead > 0 => n / lead as usize * r,
            _ => n,
        }
    }

    /// Rows each expert-parallel MoE layer's dispatch all-to-all received in the last
    /// forward, by the name of its output (sorted), for tests and reports.
    pub fn expert_rows(&self) -> Vec<(String, usize)> {
        let mut v: Vec<(String, usize)> = self
            .graph
            .ops
            .iter()
            .filter(|o| matches!(self.ep_link(o), Some((Side::Dispatch, _))))
            .filter_map(|o| {
                let out = o.outputs[0];
                let rows = self.ep.rows.get(&out)?;
                Some((self.graph.tensors[out].name.clone(), *rows))
            })
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Cpu;

    fn blocks(x: &[f32], rows: impl Fn(usize, usize) -> usize, to: bool) -> Vec<f32> {
        let dev = Cpu::new();
        let mut b = dev.alloc(Elem::F32, x.len()).unwrap();
        dev.write_f32(&mut b, x).unwrap();
        dev.read_f32(&transpose_blocks(&dev, &b, 2, 2, 1, rows, to).unwrap()).unwrap()
    }

    /// The rows an op between the all-to-alls propagates: its input's routed rows, on the
    /// same leading axis; two inputs of different routed rows, or an output that drops
    /// the rows' axis, are refused by name (neither occurs in the toy models, whose
    /// sharded MoE layers only pass the rows on). Kills dropping either check.
    #[test]
    fn propagated_rows_refuse_mixed_rows_and_a_dropped_row_axis() {
        let g = crate::toy::llama(&crate::toy::ToyConfig::tiny());
        let lead = |t: TensorId| g.tensors[t].shape.first().copied();
        let mut ep = EpState::default();
        // An op keeping its input's leading axis, with two activation inputs (a residual
        // add): the rows pass on; two different row counts are refused.
        let op = g
            .ops
            .iter()
            .find(|o| o.inputs.len() == 2 && o.inputs.iter().chain(&o.outputs).all(|&t| lead(t) == lead(o.inputs[0]) && !g.tensors[t].kind.is_param()))
            .unwrap();
        ep.rows.insert(op.inputs[0], 3);
        assert_eq!(ep.propagated_rows(&g, op).unwrap(), Some(3));
        ep.rows.insert(op.inputs[1], 3);
        assert_eq!(ep.propagated_rows(&g, op).unwrap(), Some(3));
        ep.rows.insert(op.inputs[1], 5);
        let e = ep.propagated_rows(&g, op).unwrap_err().to_string();
        assert!(e.contains("of 3 rows") && e.contains("of 5 rows"), "{e}");
        // An op whose output does not keep the input's leading axis (the loss).
        let op = g.ops.iter().find(|o| o.kind == OpKind::CrossEntropy).unwrap();
        assert_ne!(lead(op.outputs[0]), lead(op.inputs[0]));
        let mut ep = EpState::default();
        ep.rows.insert(op.inputs[0], 3);
        let e = ep.propagated_rows(&g, op).unwrap_err().to_string();
        assert!(e.contains("does not keep those rows as its leading axis"), "{e}");
    }

    #[test]
    fn blocks_transpose_and_back() {
        // 2 sources × 2 local experts, rows (s, e): (0,0)=1, (0,1)=0, (1,0)=2, (1,1)=1, w=1.
        let rows = |s: usize, e: usize| [[1, 0], [2, 1]][s][e];
        let x = [10.0, 20.0, 21.0, 22.0];
        assert_eq!(blocks(&x, rows, true), [10.0, 20.0, 21.0, 22.0]);
        let rows = |s: usize, e: usize| [[1, 2], [1, 1]][s][e];
        let x = [1.0, 2.0, 3.0, 4.0, 5.0];
        let em = blocks(&x, rows, true);
        assert_eq!(em, [1.0, 4.0, 2.0, 3.0, 5.0]);
        assert_eq!(blocks(&em, rows, false), x);
    }
}
