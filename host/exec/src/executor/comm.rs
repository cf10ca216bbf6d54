//! The executor's side of a sharded graph: collective ops, pipeline send/recv, the
//! vocab-parallel embedding and cross-entropy, and the conjugate all-reduce of
//! column-parallel input gradients, run on the host through a [`Collective`] per parallel
//! group. (The step-level gradient reductions are in `finalize.rs`, the expert-parallel
//! exchange in `ep.rs`.)
//!
//! Conventions (Megatron-LM tensor parallelism, with or without sequence parallelism,
//! pipeline stages and expert parallelism):
//! - A replicated activation's gradient is complete and identical on every rank.
//! - All-reduce of a row-parallel partial sum (Megatron's `g`): forward sums, backward
//!   passes the gradient through.
//! - A row-parallel linear's bias is added by tp rank 0 only (the others add zeros), so
//!   the all-reduce after it counts the bias once, as Megatron's bias-after-reduce does.
//! - A column-parallel (or vocab-parallel) linear reading a replicated input (Megatron's
//!   `f`): its input-gradient contribution is partial per rank. The contributions of all
//!   such readers of one input (q, k, v; gate, up) are summed and all-reduced over tp
//!   once, right before a step consumes the gradient, as Megatron's fused qkv and fc1
//!   linears do; so the traffic run is what `comm_volume` prices (tested). Not when the
//!   input comes from an all-gather or all-to-all (sequence parallelism), whose backward
//!   reduce-scatters instead.
//! - All-gather ↔ reduce-scatter along the `axis` attribute
//!   ([`runner_graph::shard::all_gather_backward_reduces`], shared with `comm_volume`);
//!   an all-gather read by replicated ops (a sequence-parallel gather before a
//!   replicated loss) keeps this rank's part of its output gradient instead, which is
//!   complete on every rank.
//! - Context parallelism (group `cp`): K and V are all-gathered along T before
//!   attention, every rank's local rows in rank order (its two chunks of Megatron's
//!   load-balanced split); the attention and rotary ops carry `cp`/`cp-rank` and map
//!   each row to its global position (`runner_kernels::cpu::cp`). The gradient of the
//!   gathered K/V covers only this rank's queries, so the backward reduce-scatters
//!   (sums) it. Each rank's loss is the mean over its own tokens; the `dp` step
//!   collective averages over the dp·cp ranks, which gives the full batch's gradient.
//! - Vocab-parallel embedding (attr `vocab-start`): rows outside this rank's shard read
//!   zero; the all-reduce that follows sums the ranks.
//! - Vocab-parallel cross-entropy (`row-stats` all-reduces read its logits): the row
//!   max, the row sum of exponentials and the target's logit are all-reduced over tp,
//!   (B,T) each, as Megatron does. Each `row-stats` op runs the reduction it names
//!   (`max`, `sumexp`, `target-logit`) and the loss reuses the results, so each
//!   reduction happens once and where `comm_volume` counts it.
//! - Pipeline `send` (group `pp`, attr `peer`: the next stage): forward sends the
//!   activation and writes 0 into its scalar token (which the stage's objective adds, so
//!   the loss is unchanged); backward receives the activation's gradient from `peer` and
//!   makes it the gradient of the send's input. `recv` (no inputs; `peer`: the producing
//!   stage): forward receives the activation; backward sends its gradient back to `peer`.
//!   Sends are queued and receives wait, so each stage simply runs forward then backward
//!   (one micro-batch: stage 0 forward, …, last stage forward and backward, …, stage 0
//!   backward); messages between two stages keep their order.
//! - Expert-parallel all-to-all (group `ep`, before and after a MoE layer's experts;
//!   `ep.rs`): dropless and data-dependent. The dispatch side all-gathers every rank's
//!   rows per expert, then sends each rank the rows of the experts it holds (rank j of
//!   `ep`: experts j·E/ep..(j+1)·E/ep) and arranges what it receives expert-major; the
//!   grouped linears run on a plan over those rows. The combine side is the exact
//!   inverse; each side's backward is the other side's exchange, with the same counts.
//!   The rows received, and so the size of every tensor up to the combine side, follow
//!   the routing, not the graph's balanced shape.
//! - Sequence-parallel all-to-all over `tp` (a replicated op reading a feature-split
//!   tensor, with SP): token chunk j goes to rank j and the feature slices come back in
//!   rank order, so the output is this rank's sequence shard with every feature; the
//!   backward is the inverse trade.
//! - Time spent inside collective calls is summed into [`super::StepProfile`]'s
//!   `communication_s` (from the start of each forward).
//!
//! All of it runs through host copies of the buffers ([`Device::read_f32`]): correct on
//! any device, meant for tests and CPU runs, not for speed.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Instant;

use runner_graph::shard::{StepCollective, all_gather_backward_reduces};
use runner_graph::{Op, OpKind, Role, TensorId};
use runner_kernels::cpu::loss::IGNORE_INDEX;

use super::Executor;
use crate::collective::{Collective, ReduceOp};
use crate::device::{Device, Elem, ExecError};

/// A rank's communication state beyond its handles: the step-level collectives it runs
/// after the backward, whether the last backward's gradients were reduced, and the
/// seconds spent in collective calls since the last forward began.
#[derive(Debug, Default)]
pub(super) struct CommState {
    pub(super) step: Vec<StepCollective>,
    pub(super) reduced: bool,
    busy_s: Cell<f64>,
    /// The vocab-parallel loss's row statistics of this forward, all-reduced, by
    /// (logits, statistic): made once, by the `row-stats` op or else by the loss.
    row_stats: RefCell<HashMap<(TensorId, &'static str), Vec<f32>>>,
}

/// A group handle whose calls add their wall time to the rank's communication time.
pub(super) struct Timed<'a> {
    c: &'a dyn Collective,
    busy_s: &'a Cell<f64>,
}

impl Timed<'_> {
    fn time<T>(&self, f: impl FnOnce(&dyn Collective) -> T) -> T {
        let t0 = Instant::now();
        let r = f(self.c);
        self.busy_s
            .set(self.busy_s.get() + t0.elapsed().as_secs_f64());
        r
    }
    pub(super) fn rank(&self) -> usize {
        self.c.rank()
    }
    pub(super) fn size(&self) -> usize {
        self.c.size()
    }
    pub(super) fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), ExecError> {
        self.time(|c| c.all_reduce(buf, op))
    }
    pub(super) fn all_gather(&self, input: &[f32]) -> Result<Vec<f32>, ExecError> {
        self.time(|c| c.all_gather(input))
    }
    pub(super) fn all_to_all_v(
        &self,
        input: &[f32],
        send: &[usize],
        recv: &[usize],
    ) -> Result<Vec<f32>, ExecError> {
        self.time(|c| c.all_to_all_v(input, send, recv))
    }
    pub(super) fn reduce_scatter(&self, input: &[f32]) -> Result<Vec<f32>, ExecError> {
        self.time(|c| c.reduce_scatter(input))
    }
    fn all_to_all(&self, input: &[f32]) -> Result<Vec<f32>, ExecError> {
        self.time(|c| c.all_to_all(input))
    }
    fn send(&self, peer: usize, data: &[f32]) -> Result<(), ExecError> {
        self.time(|c| c.send(peer, data))
    }
    fn recv(&self, peer: usize) -> Result<Vec<f32>, ExecError> {
        self.time(|c| c.recv(peer))
    }
}

/// The two axes a sequence-parallel all-to-all trades: (token axis, feature axis) of a
/// tensor whose features are split (`input` shape) into one whose tokens are split
/// (`output` shape), over `n` ranks.
fn traded_axes(input: &[u64], output: &[u64], n: u64) -> Option<(usize, usize)> {
    if input.len() != output.len() || n < 2 {
        return None;
    }
    let tok = input.iter().zip(output).position(|(i, o)| *o * n == *i)?;
    let feat = input.iter().zip(output).position(|(i, o)| *i * n == *o)?;
    (tok != feat).then_some((tok, feat))
}

fn unsupported(op: &Op, why: &str) -> ExecError {
    ExecError::Unsupported {
        op: op.name.clone(),
        kind: format!("{:?}", op.kind),
        device: "the in-process collective backend".into(),
        why: why.into(),
    }
}

/// View `x` as [outer, len, inner] split along `axis` of `shape` into `n` chunks, and
/// return it rank-major: [n, outer, len/n, inner].
fn to_rank_major(x: &[f32], shape: &[u64], axis: usize, n: usize) -> Vec<f32> {
    let outer: usize = shape[..axis].iter().product::<u64>() as usize;
    let len = shape[axis] as usize;
    let inner: usize = shape[axis + 1..].iter().product::<u64>() as usize;
    let c = len / n * inner;
    let mut out = Vec::with_capacity(x.len());
    for r in 0..n {
        for o in 0..outer {
            let base = o * len * inner + r * c;
            out.extend_from_slice(&x[base..base + c]);
        }
    }
    out
}

/// Inverse of [`to_rank_major`]: `shape` is the full (gathered) shape.
fn from_rank_major(x: &[f32], shape: &[u64], axis: usize, n: usize) -> Vec<f32> {
    let outer: usize = shape[..axis].iter().product::<u64>() as usize;
    let len = shape[axis] as usize;
    let inner: usize = shape[axis + 1..].iter().product::<u64>() as usize;
    let c = len / n * inner;
    let mut out = vec![0f32; x.len()];
    for r in 0..n {
        for o in 0..outer {
            let src = (r * outer + o) * c;
            let dst = o * len * inner + r * c;
            out[dst..dst + c].copy_from_slice(&x[src..src + c]);
        }
    }
    out
}

impl<D: Device> Executor<D> {
    /// Start the communication account of a new step (called as a forward begins).
    pub(super) fn begin_comm_step(&mut self) {
        self.comm.busy_s.set(0.0);
        self.comm.reduced = false;
        self.comm.row_stats.borrow_mut().clear();
        self.note_comm();
    }

    /// Copy the communication time so far into the profile.
    pub(super) fn note_comm(&mut self) {
        self.profile.communication_s = self.comm.busy_s.get();
    }

    /// The handle of group `name`, timed.
    pub(super) fn timed(&self, name: &str) -> Option<Timed<'_>> {
        self.collectives.get(name).map(|c| Timed {
            c: c.as_ref(),
            busy_s: &self.comm.busy_s,
        })
    }

    /// The handle of `op`'s group, checked against its `group-size`.
    pub(super) fn group(&self, op: &Op) -> Result<Timed<'_>, ExecError> {
        let name = op.text("group").unwrap_or("");
        let c = self.timed(name).ok_or_else(|| {
            unsupported(
                op,
                &format!("no collective handle for group '{name}' (Executor::with_collectives)"),
            )
        })?;
        let n = op.int("group-size").unwrap_or(1).max(1) as usize;
        if c.size() != n {
            return Err(ExecError::State(format!(
                "operation '{}': group '{name}' has {} ranks, the op says {n}",
                op.name,
                c.size()
            )));
        }
        Ok(c)
    }

    /// The tp group, when there is one of more than one rank.
    fn tp_group(&self) -> Option<Timed<'_>> {
        self.timed("tp").filter(|c| c.size() > 1)
    }

    /// The `peer` attribute of a send or recv, checked against the group.
    fn peer(&self, op: &Op, c: &Timed<'_>) -> Result<usize, ExecError> {
        match op.int("peer") {
            Some(p) if p >= 0 && (p as usize) < c.size() && p as usize != c.rank() => {
                Ok(p as usize)
            }
            p => Err(ExecError::State(format!(
                "operation '{}': peer {p:?} is not another rank of its group of {} (this rank is {})",
                op.name,
                c.size(),
                c.rank()
            ))),
        }
    }

    /// A received buffer, checked to hold `numel` elements.
    fn received(
        &self,
        op: &Op,
        what: &str,
        peer: usize,
        numel: usize,
        data: Vec<f32>,
    ) -> Result<Vec<f32>, ExecError> {
        if data.len() != numel {
            return Err(ExecError::State(format!(
                "operation '{}': received {} elements of {what} from rank {peer}, expected {numel} \
                 (the stages were sharded with different layouts or run out of order)",
                op.name,
                data.len()
            )));
        }
        Ok(data)
    }

    pub(super) fn host(&self, id: TensorId, op: &Op) -> Result<Vec<f32>, ExecError> {
        let b = self.vals[id].as_ref().ok_or_else(|| {
            ExecError::State(format!(
                "operation '{}' reads '{}', which is not live",
                op.name, self.graph.tensors[id].name
            ))
        })?;
        self.device.read_f32(b)
    }

    fn host_ints(&self, id: TensorId, op: &Op) -> Result<&[u32], ExecError> {
        self.host_ints.get(&id).map(Vec::as_slice).ok_or_else(|| {
            unsupported(
                op,
                &format!(
                    "'{}' must be a graph input given as u32",
                    self.graph.tensors[id].name
                ),
            )
        })
    }

    /// Group size of the row-stats all-reduces reading cross-entropy op `oi`'s logits
    /// (the op is then vocab-parallel over that many ranks).
    fn vocab_parallel_ce(&self, op: &Op) -> Option<usize> {
        if op.kind != OpKind::CrossEntropy || op.role != Role::VocabParallel {
            return None;
        }
        self.graph
            .ops
            .iter()
            .find(|o| {
                o.kind == OpKind::AllReduce
                    && o.flag("row-stats") == Some(true)
                    && o.inputs.first() == op.inputs.first()
            })
            .map(|o| o.int("group-size").unwrap_or(1).max(1) as usize)
    }

    /// Whether op `op`'s input-0 gradient is a per-rank partial to all-reduce over tp.
    pub(super) fn column_input_partial(&self, op: &Op) -> bool {
        if op.kind != OpKind::Linear
            || !matches!(op.role, Role::ColumnParallel | Role::VocabParallel)
            || self.tp_group().is_none()
        {
            return false;
        }
        let x = op.inputs[0];
        !self.graph.ops.iter().any(|o| {
            o.outputs.contains(&x)
                && matches!(o.kind, OpKind::AllGather | OpKind::AllToAll)
                && o.text("group") == Some("tp")
        })
    }

    /// For a row-parallel linear with a bias on a tp rank other than 0: the bias length.
    /// The partial products are summed over tp after the op, and Megatron adds the bias
    /// once, after that sum; here rank 0 adds it and the others add zeros. Its gradient
    /// (the column sum of the output gradient, complete on every rank) is unchanged.
    pub(super) fn bias_added_elsewhere(&self, op: &Op) -> Option<usize> {
        let c = self.tp_group()?;
        (op.kind == OpKind::Linear && op.role == Role::RowParallel && c.rank() != 0)
            .then(|| op.inputs.get(2))
            .flatten()
            .map(|&b| self.graph.tensors[b].numel() as usize)
    }

    /// All-reduce `buf` (a gradient contribution) over `group` (`tp`, `etp`), when this
    /// rank has a handle on it of more than one rank.
    pub(super) fn all_reduce_over(
        &mut self,
        group: &str,
        buf: &mut D::Buffer,
    ) -> Result<(), ExecError> {
        let Some(c) = self.timed(group).filter(|c| c.size() > 1) else {
            return Ok(());
        };
        let mut h = self.device.read_f32(buf)?;
        c.all_reduce(&mut h, ReduceOp::Sum)?;
        self.device.write_f32(buf, &h)?;
        self.note_comm();
        Ok(())
    }

    /// Row statistic `stat` of vocab-parallel logits `logits` over the tp group: the row
    /// max, the row sum of exp(x − max), or the target's logit (from the shard that
    /// holds it; the targets are those of the loss reading these logits). Each is one
    /// (B,T) all-reduce, as in Megatron's vocab-parallel cross-entropy, made once per
    /// forward: by the `row-stats` op that stands for it in the graph (and in
    /// `comm_volume`), else by the loss.
    fn row_stat(&self, logits: TensorId, stat: &'static str, op: &Op) -> Result<Vec<f32>, ExecError> {
        if let Some(v) = self.comm.row_stats.borrow().get(&(logits, stat)) {
            return Ok(v.clone());
        }
        let c = self
            .tp_group()
            .ok_or_else(|| unsupported(op, "vocab-parallel loss without a tp group"))?;
        let v = self.graph.tensors[logits].shape.last().copied().unwrap_or(1).max(1) as usize;
        let x = self.host(logits, op)?;
        let out = match stat {
            "max" => {
                let mut m: Vec<f32> = x
                    .chunks(v)
                    .map(|r| r.iter().copied().fold(f32::NEG_INFINITY, f32::max))
                    .collect();
                c.all_reduce(&mut m, ReduceOp::Max)?;
                m
            }
            "sumexp" => {
                let m = self.row_stat(logits, "max", op)?;
                let mut s: Vec<f32> = x
                    .chunks(v)
                    .zip(&m)
                    .map(|(r, &mx)| r.iter().map(|&a| (a - mx).exp()).sum())
                    .collect();
                c.all_reduce(&mut s, ReduceOp::Sum)?;
                s
            }
            _ => {
                let loss = self
                    .graph
                    .ops
                    .iter()
                    .find(|o| o.kind == OpKind::CrossEntropy && o.inputs[0] == logits)
                    .ok_or_else(|| unsupported(op, "no cross-entropy reads these logits"))?;
                let targets = self.host_ints(loss.inputs[1], op)?;
                let start = c.rank() * v;
                let mut tl: Vec<f32> = targets
                    .iter()
                    .enumerate()
                    .map(|(row, &t)| {
                        let t = t as usize;
                        if t != IGNORE_INDEX as usize && t >= start && t < start + v {
                            x[row * v + t - start]
                        } else {
                            0.0
                        }
                    })
                    .collect();
                c.all_reduce(&mut tl, ReduceOp::Sum)?;
                tl
            }
        };
        self.comm.row_stats.borrow_mut().insert((logits, stat), out.clone());
        Ok(out)
    }

    /// Run forward op `oi` on the host if it is one of the ops this module owns; `false`
    /// leaves it to the device.
    pub(super) fn host_forward(
        &mut self,
        oi: usize,
        outs: &mut [D::Buffer],
        aux: &mut Vec<D::Buffer>,
    ) -> Result<bool, ExecError> {
        let r = self.host_forward_inner(oi, outs, aux);
        self.note_comm();
        r
    }

    fn host_forward_inner(
        &mut self,
        oi: usize,
        outs: &mut [D::Buffer],
        aux: &mut Vec<D::Buffer>,
    ) -> Result<bool, ExecError> {
        let op = &self.graph.ops[oi];
        let shape = |id: TensorId| self.graph.tensors[id].shape.clone();
        let out: Vec<f32> = match op.kind {
            OpKind::AllReduce if op.flag("row-stats") == Some(true) => {
                self.group(op)?;
                let stat = match op.text("reduce") {
                    Some("max") => "max",
                    Some("sumexp") => "sumexp",
                    Some("target-logit") => "target-logit",
                    other => return Err(unsupported(op, &format!("row statistic {other:?}"))),
                };
                self.row_stat(op.inputs[0], stat, op)?
            }
            OpKind::AllReduce => {
                let mut x = self.host(op.inputs[0], op)?;
                self.group(op)?.all_reduce(&mut x, ReduceOp::Sum)?;
                x
            }
            OpKind::AllGather => {
                let c = self.group(op)?;
                let axis = op.int("axis").unwrap_or(0).max(0) as usize;
                let all = c.all_gather(&self.host(op.inputs[0], op)?)?;
                from_rank_major(&all, &shape(op.outputs[0]), axis, c.size())
            }
            OpKind::ReduceScatter => {
                let c = self.group(op)?;
                let axis = op.int("axis").unwrap_or(0).max(0) as usize;
                let x = self.host(op.inputs[0], op)?;
                c.reduce_scatter(&to_rank_major(&x, &shape(op.inputs[0]), axis, c.size()))?
            }
            OpKind::AllToAll if self.is_ep_all_to_all(op) => {
                self.ep_forward(oi, &mut outs[0])?;
                return Ok(true);
            }
            OpKind::AllToAll => {
                // Sequence parallelism's feature-for-tokens trade: token chunk j goes to
                // rank j; the feature slices received come back in rank order.
                let c = self.group(op)?;
                let (is, os) = (shape(op.inputs[0]), shape(op.outputs[0]));
                let n = c.size();
                let (tok, feat) = traded_axes(&is, &os, n as u64)
                    .ok_or_else(|| unsupported(op, "an all-to-all that does not trade features for tokens"))?;
                let x = self.host(op.inputs[0], op)?;
                let recv = c.all_to_all(&to_rank_major(&x, &is, tok, n))?;
                from_rank_major(&recv, &os, feat, n)
            }
            OpKind::Send => {
                let c = self.group(op)?;
                let peer = self.peer(op, &c)?;
                c.send(peer, &self.host(op.inputs[0], op)?)?;
                vec![0.0]
            }
            OpKind::Recv => {
                let c = self.group(op)?;
                let peer = self.peer(op, &c)?;
                let n = self.graph.tensors[op.outputs[0]].numel() as usize;
                let what = format!("'{}'", self.graph.tensors[op.outputs[0]].name);
                self.received(op, &what, peer, n, c.recv(peer)?)?
            }
            OpKind::Embedding if op.int("vocab-start").is_some() => {
                let start = op.int("vocab-start").unwrap_or(0).max(0) as u64;
                let tokens = self.host_ints(op.inputs[0], op)?;
                let table = self.host(op.inputs[1], op)?;
                let ts = shape(op.inputs[1]);
                let (rows, c) = (ts[0], ts[1] as usize);
                let mut o = vec![0f32; tokens.len() * c];
                for (dst, &t) in o.chunks_mut(c).zip(tokens) {
                    let t = u64::from(t);
                    if t >= start && t < start + rows {
                        let r = (t - start) as usize;
                        dst.copy_from_slice(&table[r * c..(r + 1) * c]);
                    }
                }
                o
            }
            OpKind::CrossEntropy if self.vocab_parallel_ce(op).is_some() => {
                let x = op.inputs[0];
                let m = self.row_stat(x, "max", op)?;
                let s = self.row_stat(x, "sumexp", op)?;
                let tl = self.row_stat(x, "target-logit", op)?;
                let targets = self.host_ints(op.inputs[1], op)?;
                let lse: Vec<f32> = m.iter().zip(&s).map(|(&mx, &se)| mx + se.ln()).collect();
                let (mut total, mut valid) = (0f64, 0usize);
                for (row, &t) in targets.iter().enumerate() {
                    if t != IGNORE_INDEX {
                        total += f64::from(lse[row] - tl[row]);
                        valid += 1;
                    }
                }
                let mut lb = self.device.alloc(Elem::F32, lse.len())?;
                self.device.write_f32(&mut lb, &lse)?;
                aux.push(lb);
                vec![if valid == 0 {
                    0.0
                } else {
                    (total / valid as f64) as f32
                }]
            }
            _ => return Ok(false),
        };
        self.device.write_f32(&mut outs[0], &out)?;
        Ok(true)
    }

    /// The input-gradient contributions of backward step `si` (one per `grads_out`
    /// entry), if it is one of the ops this module owns.
    pub(super) fn host_backward(&mut self, si: usize) -> Result<Option<Vec<Vec<f32>>>, ExecError> {
        let r = self.host_backward_inner(si);
        self.note_comm();
        r
    }

    fn host_backward_inner(&self, si: usize) -> Result<Option<Vec<Vec<f32>>>, ExecError> {
        let step = &self.plan.steps[si];
        let op = &self.graph.ops[step.op];
        let shape = |id: TensorId| self.graph.tensors[id].shape.clone();
        let dout = || -> Result<Vec<f32>, ExecError> {
            match step
                .grads_in
                .first()
                .copied()
                .flatten()
                .and_then(|t| self.grads[t].as_ref())
            {
                Some(b) => self.device.read_f32(b),
                None => Ok(vec![0.0; self.numel_of(op.outputs[0])]),
            }
        };
        let d: Vec<f32> = match op.kind {
            OpKind::AllReduce if op.flag("row-stats") == Some(true) => {
                // The statistics feed nothing the loss reads; the loss's own backward is local.
                return Ok(Some(
                    step.grads_out
                        .iter()
                        .map(|g| vec![0.0; self.graph.tensors[g.tensor].numel() as usize])
                        .collect(),
                ));
            }
            OpKind::AllReduce => {
                self.group(op)?;
                dout()?
            }
            OpKind::AllGather => {
                let c = self.group(op)?;
                let axis = op.int("axis").unwrap_or(0).max(0) as usize;
                let rm = to_rank_major(&dout()?, &shape(op.outputs[0]), axis, c.size());
                if all_gather_backward_reduces(&self.graph, op) {
                    // Column-parallel readers, or attention over cp-gathered K/V, leave
                    // per-rank partial gradients: sum them.
                    c.reduce_scatter(&rm)?
                } else {
                    // Replicated readers leave the complete gradient on every rank: keep
                    // this rank's part (Megatron's tensor_parallel_output_grad=False).
                    let n = rm.len() / c.size();
                    rm[c.rank() * n..(c.rank() + 1) * n].to_vec()
                }
            }
            OpKind::ReduceScatter => {
                let c = self.group(op)?;
                let axis = op.int("axis").unwrap_or(0).max(0) as usize;
                let all = c.all_gather(&dout()?)?;
                from_rank_major(&all, &shape(op.inputs[0]), axis, c.size())
            }
            OpKind::AllToAll if self.is_ep_all_to_all(op) => self.ep_backward(op, &dout()?)?,
            OpKind::AllToAll => {
                // The inverse trade: feature slice j goes back to rank j.
                let c = self.group(op)?;
                let (is, os) = (shape(op.inputs[0]), shape(op.outputs[0]));
                let n = c.size();
                let (tok, feat) = traded_axes(&is, &os, n as u64)
                    .ok_or_else(|| unsupported(op, "an all-to-all that does not trade features for tokens"))?;
                let recv = c.all_to_all(&to_rank_major(&dout()?, &os, feat, n))?;
                from_rank_major(&recv, &is, tok, n)
            }
            OpKind::Send => {
                // The token's gradient is the loss seed; the sent activation's comes from
                // the next stage.
                let c = self.group(op)?;
                let peer = self.peer(op, &c)?;
                let n = self.graph.tensors[op.inputs[0]].numel() as usize;
                let what = format!(
                    "the gradient of '{}'",
                    self.graph.tensors[op.inputs[0]].name
                );
                self.received(op, &what, peer, n, c.recv(peer)?)?
            }
            OpKind::Recv => {
                let c = self.group(op)?;
                let peer = self.peer(op, &c)?;
                c.send(peer, &dout()?)?;
                return Ok(Some(Vec::new()));
            }
            OpKind::Embedding if op.int("vocab-start").is_some() => {
                let start = op.int("vocab-start").unwrap_or(0).max(0) as u64;
                let tokens = self.host_ints(op.inputs[0], op)?;
                let ts = shape(op.inputs[1]);
                let (rows, c) = (ts[0], ts[1] as usize);
                let dy = dout()?;
                let mut dt = vec![0f32; rows as usize * c];
                for (src, &t) in dy.chunks(c).zip(tokens) {
                    let t = u64::from(t);
                    if t >= start && t < start + rows {
                        let r = (t - start) as usize;
                        for (a, b) in dt[r * c..(r + 1) * c].iter_mut().zip(src) {
                            *a += b;
                        }
                    }
                }
                dt
            }
            OpKind::CrossEntropy if self.vocab_parallel_ce(op).is_some() => {
                let c = self
                    .tp_group()
                    .ok_or_else(|| unsupported(op, "vocab-parallel loss without a tp group"))?;
                let v = shape(op.inputs[0]).last().copied().unwrap_or(1).max(1) as usize;
                let start = c.rank() * v;
                let x = self.host(op.inputs[0], op)?;
                let targets = self.host_ints(op.inputs[1], op)?;
                let lse = self
                    .device
                    .read_f32(self.aux[step.op].first().ok_or_else(|| {
                        ExecError::State(format!("'{}': lse was not saved", op.name))
                    })?)?;
                let dloss = dout()?.first().copied().unwrap_or(0.0);
                let valid = targets.iter().filter(|&&t| t != IGNORE_INDEX).count();
                let scale = if valid == 0 {
                    0.0
                } else {
                    dloss / valid as f32
                };
                let mut dl = vec![0f32; x.len()];
                for (row, &t) in targets.iter().enumerate() {
                    if t == IGNORE_INDEX {
                        continue;
                    }
                    let (xr, dr) = (&x[row * v..(row + 1) * v], &mut dl[row * v..(row + 1) * v]);
                    for (a, &b) in dr.iter_mut().zip(xr) {
                        *a = (b - lse[row]).exp() * scale;
                    }
                    let t = t as usize;
                    if t >= start && t < start + v {
                        dr[t - start] -= scale;
                    }
                }
                dl
            }
            _ => return Ok(None),
        };
        // Every op above writes the gradient of input slot 0, or of the table (slot 1) for
        // the embedding, whose slot 0 (token ids) never carries one.
        Ok(Some(step.grads_out.iter().map(|_| d.clone()).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_major_round_trips() {
        let shape = [2u64, 4, 3];
        let x: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let rm = to_rank_major(&x, &shape, 1, 2);
        // Rank 0's chunk: rows 0..2 of axis 1 from both outer slices.
        assert_eq!(rm[..6], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(rm[6..12], [12.0, 13.0, 14.0, 15.0, 16.0, 17.0]);
        assert_eq!(from_rank_major(&rm, &shape, 1, 2), x);
    }
}
