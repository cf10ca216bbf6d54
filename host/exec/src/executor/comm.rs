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
//! Everything runs on device buffers: the collectives through [`Collective`] (NCCL on
//! GPUs, a staging copy for host transports), the layout changes around them
//! ([`Device::transpose_outer`], [`Device::copy`]) and the vocab-parallel statistics as
//! kernels. Communication time is measured with device events around each call and
//! summed when a phase ends.

use std::cell::RefCell;
use std::collections::HashMap;

use runner_graph::shard::{StepCollective, all_gather_backward_reduces};
use runner_graph::{Op, OpKind, Role, TensorId};

use super::Executor;
use crate::collective::{Collective, InFlight, ReduceOp, Started};
use crate::device::{Device, DeviceBuffer, Elem, ExecError};

/// A rank's communication state beyond its handles: the step-level collectives it runs
/// after the backward, whether the last backward's gradients were reduced, and the
/// time spent in collective calls since the last forward began.
pub(super) struct CommState<D: Device> {
    pub(super) step: Vec<StepCollective>,
    pub(super) reduced: bool,
    busy_s: f64,
    /// Device events around each collective call not yet added to `busy_s`.
    spans: RefCell<Vec<(D::Event, D::Event)>>,
    /// The vocab-parallel loss's row statistics of this forward, all-reduced, by
    /// (logits, statistic): made once, by the `row-stats` op or else by the loss.
    row_stats: RefCell<HashMap<(TensorId, &'static str), D::Buffer>>,
    /// The pipeline's sends and receives while a schedule drives them (`pipeline.rs`):
    /// `None` outside a scheduled step, when each send and receive happens as its op runs.
    pub(super) mailbox: RefCell<Option<Mailbox<D::Buffer>>>,
}

/// A pipeline stage's point-to-point traffic under a schedule (Megatron's
/// `batch_isend_irecv` between passes): what the coming passes receive, posted before
/// they run, and what the passes since the last call sent, posted with the next one.
pub(super) struct Mailbox<B> {
    /// Received data by (forward pass?, op index): a recv op's output in the forward, the
    /// gradient of a send op's input in the backward.
    pub(super) inbox: HashMap<(bool, usize), B>,
    /// (peer, a copy of the data) of each send since the last call.
    pub(super) outbox: Vec<(usize, B)>,
}

impl<B> Default for Mailbox<B> {
    fn default() -> Self {
        Mailbox { inbox: HashMap::new(), outbox: Vec::new() }
    }
}

impl<D: Device> CommState<D> {
    /// Handle `c` on `dev`, its calls timed into this rank's communication time (where
    /// the executor's other fields are borrowed apart, as the optimizer's are).
    pub(super) fn timed<'a>(&'a self, c: &'a dyn Collective<D>, dev: &'a D) -> Timed<'a, D> {
        Timed { c, dev, spans: &self.spans }
    }
}

impl<D: Device> Default for CommState<D> {
    fn default() -> Self {
        CommState {
            step: Vec::new(),
            reduced: false,
            busy_s: 0.0,
            spans: RefCell::new(Vec::new()),
            row_stats: RefCell::new(HashMap::new()),
            mailbox: RefCell::new(None),
        }
    }
}

/// A group handle whose calls are timed with device events into the rank's
/// communication time.
pub(super) struct Timed<'a, D: Device> {
    c: &'a dyn Collective<D>,
    dev: &'a D,
    spans: &'a RefCell<Vec<(D::Event, D::Event)>>,
}

impl<D: Device> Timed<'_, D> {
    fn time<T>(&self, f: impl FnOnce(&dyn Collective<D>, &D) -> Result<T, ExecError>) -> Result<T, ExecError> {
        let start = self.dev.record()?;
        let r = f(self.c, self.dev)?;
        let end = self.dev.record()?;
        self.spans.borrow_mut().push((start, end));
        Ok(r)
    }
    pub(super) fn rank(&self) -> usize {
        self.c.rank()
    }
    pub(super) fn size(&self) -> usize {
        self.c.size()
    }
    pub(super) fn all_reduce(&self, buf: &mut D::Buffer, op: ReduceOp) -> Result<(), ExecError> {
        self.time(|c, d| c.all_reduce(d, buf, op))
    }
    pub(super) fn start(&self, what: Started, buf: D::Buffer) -> Result<InFlight<D::Buffer>, ExecError> {
        self.time(|c, d| c.start(d, what, buf))
    }
    pub(super) fn finish(&self, f: InFlight<D::Buffer>) -> Result<D::Buffer, ExecError> {
        self.time(|c, d| c.finish(d, f))
    }
    pub(super) fn all_gather(&self, input: &D::Buffer, output: &mut D::Buffer) -> Result<(), ExecError> {
        self.time(|c, d| c.all_gather(d, input, output))
    }
    pub(super) fn broadcast(&self, buf: &mut D::Buffer, root: usize) -> Result<(), ExecError> {
        self.time(|c, d| c.broadcast(d, buf, root))
    }
    pub(super) fn all_to_all_v(
        &self,
        input: &D::Buffer,
        send: &[usize],
        output: &mut D::Buffer,
        recv: &[usize],
    ) -> Result<(), ExecError> {
        self.time(|c, d| c.all_to_all_v(d, input, send, output, recv))
    }
    pub(super) fn reduce_scatter(&self, input: &D::Buffer, output: &mut D::Buffer) -> Result<(), ExecError> {
        self.time(|c, d| c.reduce_scatter(d, input, output))
    }
    fn all_to_all(&self, input: &D::Buffer, output: &mut D::Buffer) -> Result<(), ExecError> {
        self.time(|c, d| c.all_to_all(d, input, output))
    }
    fn send(&self, peer: usize, buf: &D::Buffer) -> Result<(), ExecError> {
        self.time(|c, d| c.send(d, peer, buf))
    }
    fn recv(&self, peer: usize, buf: &mut D::Buffer) -> Result<(), ExecError> {
        self.time(|c, d| c.recv(d, peer, buf))
    }
    /// `sends` and `recvs` as one call (a pipeline schedule's, `pipeline.rs`), its
    /// failures naming this stage.
    pub(super) fn batch_send_recv(&self, sends: &[(usize, D::Buffer)], recvs: &mut [(usize, D::Buffer)]) -> Result<(), ExecError> {
        if sends.is_empty() && recvs.is_empty() {
            return Ok(());
        }
        let sends: Vec<(usize, &D::Buffer)> = sends.iter().map(|(p, b)| (*p, b)).collect();
        let mut recvs: Vec<(usize, &mut D::Buffer)> = recvs.iter_mut().map(|(p, b)| (*p, b)).collect();
        self.time(|c, d| c.batch_send_recv(d, &sends, &mut recvs)).map_err(|e| match e {
            ExecError::State(m) => ExecError::State(format!("pipeline stage {} of {}: {m}", self.rank(), self.size())),
            other => other,
        })
    }
}

/// A buffer borrowed from the executor's store or made for the call.
pub(super) enum Held<'a, B> {
    Borrowed(&'a B),
    Owned(B),
}

impl<B> Held<'_, B> {
    pub(super) fn get(&self) -> &B {
        match self {
            Held::Borrowed(b) => b,
            Held::Owned(b) => b,
        }
    }
}

/// What the communication layer did with a backward step.
pub(super) enum CommBackward<B> {
    /// Not one of its ops: the device dispatch runs it.
    NotMine,
    /// Ran, with no input gradient to write (a pipeline recv has no input).
    Done,
    /// Ran; the gradient contribution of every input the step writes.
    Grad(B),
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
        device: "the collective backend".into(),
        why: why.into(),
    }
}

/// (outer, chunk): a tensor of `shape` viewed as [outer, n, chunk] around `axis`.
fn around(shape: &[u64], axis: usize, n: usize) -> (usize, usize) {
    let outer: usize = shape[..axis].iter().product::<u64>() as usize;
    let len = shape[axis] as usize;
    let inner: usize = shape[axis + 1..].iter().product::<u64>() as usize;
    (outer, len / n.max(1) * inner)
}

/// `x` (of `shape`) split along `axis` into `n` chunks, rank-major: [n, outer, chunk]
/// (itself when nothing precedes the axis).
fn to_rank_major<'a, D: Device>(
    dev: &D,
    x: &'a D::Buffer,
    shape: &[u64],
    axis: usize,
    n: usize,
) -> Result<Held<'a, D::Buffer>, ExecError> {
    let (outer, c) = around(shape, axis, n);
    if outer <= 1 {
        return Ok(Held::Borrowed(x));
    }
    let mut out = dev.alloc(x.elem(), x.len())?;
    dev.transpose_outer(&mut out, x, outer, n, c)?;
    Ok(Held::Owned(out))
}

/// Inverse of [`to_rank_major`] into `out`: `shape` is the full (gathered) shape.
fn from_rank_major<D: Device>(
    dev: &D,
    out: &mut D::Buffer,
    x: &D::Buffer,
    shape: &[u64],
    axis: usize,
    n: usize,
) -> Result<(), ExecError> {
    let (outer, c) = around(shape, axis, n);
    if outer <= 1 {
        return dev.copy(out, 0, x, 0, x.len());
    }
    dev.transpose_outer(out, x, n, outer, c)
}

/// The row-stats key of a shard's sum of exp(x − max) against the reduced max, made with
/// the max and all-reduced into "sumexp".
const SHARD_SUMEXP: &str = "shard-sumexp";

/// The vocab-parallel row statistics, by the name a `row-stats` op gives them.
fn row_stat_name(op: &Op) -> Result<&'static str, ExecError> {
    match op.text("reduce") {
        Some("max") => Ok("max"),
        Some("sumexp") => Ok("sumexp"),
        Some("target-logit") => Ok("target-logit"),
        other => Err(unsupported(op, &format!("row statistic {other:?}"))),
    }
}

impl<D: Device> Executor<D> {
    /// Start the communication account of a forward: a new step's (`new_step`), or a
    /// later micro-batch's, whose calls count on in its step's.
    pub(super) fn begin_comm_step(&mut self, new_step: bool) {
        self.forget_row_stats();
        if new_step {
            self.comm.busy_s = 0.0;
            self.comm.spans.borrow_mut().clear();
            self.comm.reduced = false;
            self.profile.communication_s = 0.0;
        }
    }

    /// Drop the vocab-parallel row statistics: a forward pass (a micro-batch's, or one
    /// pipeline chunk's of it) makes its own. Another micro-batch's pass may have run since.
    pub(super) fn forget_row_stats(&self) {
        self.comm.row_stats.borrow_mut().clear();
    }

    /// Add the collective calls timed so far to the communication time (waits for the
    /// last one to finish); called as a phase ends.
    pub(super) fn note_comm(&mut self) -> Result<(), ExecError> {
        let spans = std::mem::take(&mut *self.comm.spans.borrow_mut());
        for (start, end) in &spans {
            self.comm.busy_s += self.device.elapsed_s(start, end)?;
        }
        self.profile.communication_s = self.comm.busy_s;
        // The phase's work is done (its events reached): a failure a group's watchdog
        // found meanwhile surfaces here at the latest.
        for c in self.collectives.values() {
            c.health()?;
        }
        Ok(())
    }

    /// The handle of group `name`, timed.
    pub(super) fn timed(&self, name: &str) -> Option<Timed<'_, D>> {
        self.collectives.get(name).map(|c| self.comm.timed(c.as_ref(), &self.device))
    }

    /// The handle of `op`'s group, checked against its `group-size`.
    pub(super) fn group(&self, op: &Op) -> Result<Timed<'_, D>, ExecError> {
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
    fn tp_group(&self) -> Option<Timed<'_, D>> {
        self.timed("tp").filter(|c| c.size() > 1)
    }

    /// The `peer` attribute of a send or recv, checked against the group.
    pub(super) fn peer(&self, op: &Op, c: &Timed<'_, D>) -> Result<usize, ExecError> {
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

    /// A pipeline receive into `buf` (a recv's forward, a send's backward: `key` in the
    /// mailbox), its failures naming the op and what it carried. Under a schedule the
    /// data came before the pass began; otherwise it is received now.
    fn recv_for(&self, op: &Op, key: (bool, usize), what: &str, c: &Timed<'_, D>, peer: usize, buf: &mut D::Buffer) -> Result<(), ExecError> {
        let r = match self.comm.mailbox.borrow_mut().as_mut() {
            Some(m) => match m.inbox.remove(&key) {
                Some(got) if got.len() == buf.len() && got.elem() == buf.elem() => {
                    *buf = got;
                    Ok(())
                }
                Some(got) => Err(ExecError::State(format!(
                    "the schedule received {} {} elements, the op expects {} {}",
                    got.len(),
                    got.elem().name(),
                    buf.len(),
                    buf.elem().name()
                ))),
                None => Err(ExecError::State("the schedule posted no receive for this pass".into())),
            },
            None => c.recv(peer, buf),
        };
        r.map_err(|e| match e {
            ExecError::State(m) => ExecError::State(format!(
                "operation '{}' receiving {what} from rank {peer}: {m}",
                op.name
            )),
            other => other,
        })
    }

    /// A pipeline send of `buf` to `peer` (a send's forward, a recv's backward): now, or
    /// under a schedule a copy held for its next batched call.
    fn send_for(&self, c: &Timed<'_, D>, peer: usize, buf: &D::Buffer) -> Result<(), ExecError> {
        match self.comm.mailbox.borrow_mut().as_mut() {
            Some(m) => {
                let mut copy = self.device.alloc(buf.elem(), buf.len())?;
                self.device.copy(&mut copy, 0, buf, 0, buf.len())?;
                m.outbox.push((peer, copy));
                Ok(())
            }
            None => c.send(peer, buf),
        }
    }

    /// The live value of tensor `id`, read by `op`.
    pub(super) fn val(&self, id: TensorId, op: &Op) -> Result<&D::Buffer, ExecError> {
        self.vals[id].as_ref().ok_or_else(|| {
            ExecError::State(format!(
                "operation '{}' reads '{}', which is not live",
                op.name, self.graph.tensors[id].name
            ))
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
    pub(super) fn all_reduce_over(&mut self, group: &str, buf: &mut D::Buffer) -> Result<(), ExecError> {
        match self.timed(group).filter(|c| c.size() > 1) {
            Some(c) => c.all_reduce(buf, ReduceOp::Sum),
            None => Ok(()),
        }
    }

    /// Make row statistic `stat` of vocab-parallel logits `logits` over the tp group: the
    /// row max, the row sum of exp(x − max), or the target's logit (from the shard that
    /// holds it; the targets are those of the loss reading these logits). Each is one
    /// (B,T) all-reduce, as in Megatron's vocab-parallel cross-entropy, made once per
    /// forward: by the `row-stats` op that stands for it in the graph (and in
    /// `comm_volume`), else by the loss. The shard is read once for the first two
    /// (Megatron reads it twice): its own max and its sum against that max, which is
    /// moved onto the reduced max before the sum is all-reduced.
    fn row_stat(&self, logits: TensorId, stat: &'static str, op: &Op) -> Result<(), ExecError> {
        if self.comm.row_stats.borrow().contains_key(&(logits, stat)) {
            return Ok(());
        }
        let c = self
            .tp_group()
            .ok_or_else(|| unsupported(op, "vocab-parallel loss without a tp group"))?;
        let v = self.graph.tensors[logits].shape.last().copied().unwrap_or(1).max(1) as usize;
        let x = self.val(logits, op)?;
        let dev = &self.device;
        let rows = x.len() / v;
        let out = match stat {
            "max" => {
                let (mut local, mut sumexp) = (dev.alloc(Elem::F32, rows)?, dev.alloc(Elem::F32, rows)?);
                dev.row_max_sumexp(&mut local, &mut sumexp, x, v)?;
                let mut out = dev.alloc(Elem::F32, rows)?;
                dev.copy(&mut out, 0, &local, 0, rows)?;
                c.all_reduce(&mut out, ReduceOp::Max)?;
                dev.sumexp_rescale(&mut sumexp, &local, &out)?;
                self.comm.row_stats.borrow_mut().insert((logits, SHARD_SUMEXP), sumexp);
                out
            }
            "sumexp" => {
                // The shard's sums, made with the max and already on the reduced max.
                self.row_stat(logits, "max", op)?;
                let mut out = self
                    .comm
                    .row_stats
                    .borrow_mut()
                    .remove(&(logits, SHARD_SUMEXP))
                    .ok_or_else(|| ExecError::State("the shard's row sums vanished".into()))?;
                c.all_reduce(&mut out, ReduceOp::Sum)?;
                out
            }
            _ => {
                let loss = self
                    .graph
                    .ops
                    .iter()
                    .find(|o| o.kind == OpKind::CrossEntropy && o.inputs[0] == logits)
                    .ok_or_else(|| unsupported(op, "no cross-entropy reads these logits"))?;
                let targets = self.val(loss.inputs[1], op)?;
                let mut out = dev.alloc(Elem::F32, rows)?;
                dev.target_logit(&mut out, x, targets, c.rank() * v, v)?;
                c.all_reduce(&mut out, ReduceOp::Sum)?;
                out
            }
        };
        self.comm.row_stats.borrow_mut().insert((logits, stat), out);
        Ok(())
    }

    /// Run forward op `oi` if it is one of the ops this module owns; `false` leaves it to
    /// the device dispatch.
    pub(super) fn comm_forward(
        &mut self,
        oi: usize,
        outs: &mut [D::Buffer],
        aux: &mut Vec<D::Buffer>,
    ) -> Result<bool, ExecError> {
        if self.is_ep_all_to_all(&self.graph.ops[oi]) {
            self.ep_forward(oi, &mut outs[0])?;
            return Ok(true);
        }
        if self.is_etp_exchange(&self.graph.ops[oi]) {
            self.etp_forward(oi, &mut outs[0])?;
            return Ok(true);
        }
        self.comm_forward_op(oi, outs, aux)
    }

    fn comm_forward_op(
        &self,
        oi: usize,
        outs: &mut [D::Buffer],
        aux: &mut Vec<D::Buffer>,
    ) -> Result<bool, ExecError> {
        let op = &self.graph.ops[oi];
        let dev = &self.device;
        let shape = |id: TensorId| self.graph.tensors[id].shape.as_slice();
        match op.kind {
            OpKind::AllReduce if op.flag("row-stats") == Some(true) => {
                self.group(op)?;
                let stat = row_stat_name(op)?;
                self.row_stat(op.inputs[0], stat, op)?;
                let stats = self.comm.row_stats.borrow();
                let s = stats
                    .get(&(op.inputs[0], stat))
                    .ok_or_else(|| ExecError::State("row statistic vanished".into()))?;
                dev.copy(&mut outs[0], 0, s, 0, s.len())?;
            }
            OpKind::AllReduce => {
                let x = self.val(op.inputs[0], op)?;
                dev.copy(&mut outs[0], 0, x, 0, x.len())?;
                self.group(op)?.all_reduce(&mut outs[0], ReduceOp::Sum)?;
            }
            OpKind::AllGather => {
                let c = self.group(op)?;
                let axis = op.int("axis").unwrap_or(0).max(0) as usize;
                let x = self.val(op.inputs[0], op)?;
                let so = shape(op.outputs[0]);
                if around(so, axis, c.size()).0 <= 1 {
                    c.all_gather(x, &mut outs[0])?;
                } else {
                    let mut all = dev.alloc(x.elem(), outs[0].len())?;
                    c.all_gather(x, &mut all)?;
                    from_rank_major(dev, &mut outs[0], &all, so, axis, c.size())?;
                }
            }
            OpKind::ReduceScatter => {
                let c = self.group(op)?;
                let axis = op.int("axis").unwrap_or(0).max(0) as usize;
                let x = self.val(op.inputs[0], op)?;
                let rm = to_rank_major(dev, x, shape(op.inputs[0]), axis, c.size())?;
                c.reduce_scatter(rm.get(), &mut outs[0])?;
            }
            OpKind::AllToAll => {
                // Sequence parallelism's feature-for-tokens trade: token chunk j goes to
                // rank j; the feature slices received come back in rank order.
                let c = self.group(op)?;
                let (is, os) = (shape(op.inputs[0]), shape(op.outputs[0]));
                let n = c.size();
                let (tok, feat) = traded_axes(is, os, n as u64).ok_or_else(|| {
                    unsupported(op, "an all-to-all that does not trade features for tokens")
                })?;
                let x = self.val(op.inputs[0], op)?;
                let rm = to_rank_major(dev, x, is, tok, n)?;
                let mut recv = dev.alloc(x.elem(), outs[0].len())?;
                c.all_to_all(rm.get(), &mut recv)?;
                from_rank_major(dev, &mut outs[0], &recv, os, feat, n)?;
            }
            OpKind::Send => {
                let c = self.group(op)?;
                let peer = self.peer(op, &c)?;
                self.send_for(&c, peer, self.val(op.inputs[0], op)?)?;
                dev.zero(&mut outs[0])?;
            }
            OpKind::Recv => {
                let c = self.group(op)?;
                let peer = self.peer(op, &c)?;
                let what = format!("'{}'", self.graph.tensors[op.outputs[0]].name);
                self.recv_for(op, (true, oi), &what, &c, peer, &mut outs[0])?;
            }
            OpKind::Embedding if is_vocab_parallel_embedding(op) => {
                let start = op.int("vocab-start").unwrap_or(0).max(0) as usize;
                let c = shape(op.inputs[1])[1] as usize;
                let (tokens, table) = (self.val(op.inputs[0], op)?, self.val(op.inputs[1], op)?);
                dev.embedding_forward(&mut outs[0], tokens, table, c, Some(start))
                    .map_err(|e| rename(e, op))?;
            }
            OpKind::CrossEntropy if self.vocab_parallel_ce(op).is_some() => {
                let x = op.inputs[0];
                for stat in ["max", "sumexp", "target-logit"] {
                    self.row_stat(x, stat, op)?;
                }
                let stats = self.comm.row_stats.borrow();
                let get = |s: &'static str| {
                    stats
                        .get(&(x, s))
                        .ok_or_else(|| ExecError::State("row statistic vanished".into()))
                };
                let targets = self.val(op.inputs[1], op)?;
                let mut lse = dev.alloc(Elem::F32, targets.len())?;
                dev.cross_entropy_from_stats(
                    &mut outs[0],
                    &mut lse,
                    get("max")?,
                    get("sumexp")?,
                    get("target-logit")?,
                    targets,
                )
                .map_err(|e| rename(e, op))?;
                aux.push(lse);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Backward step `si` if it is one of the ops this module owns.
    pub(super) fn comm_backward(&self, si: usize) -> Result<CommBackward<D::Buffer>, ExecError> {
        let step = &self.plan.steps[si];
        let op = &self.graph.ops[step.op];
        let dev = &self.device;
        let shape = |id: TensorId| self.graph.tensors[id].shape.as_slice();
        let dout = || -> Result<Held<'_, D::Buffer>, ExecError> {
            match step
                .grads_in
                .first()
                .copied()
                .flatten()
                .and_then(|t| self.grads[t].as_ref())
            {
                Some(b) => Ok(Held::Borrowed(b)),
                None => {
                    let mut z = dev.alloc(Elem::F32, self.numel_of(op.outputs[0]))?;
                    dev.zero(&mut z)?;
                    Ok(Held::Owned(z))
                }
            }
        };
        let fresh = |id: TensorId| dev.alloc(Elem::F32, self.numel_of(id));
        let d = match op.kind {
            OpKind::AllReduce if op.flag("row-stats") == Some(true) => {
                // The statistics feed nothing the loss reads; the loss's own backward is local.
                let mut z = fresh(op.inputs[0])?;
                dev.zero(&mut z)?;
                z
            }
            OpKind::AllReduce => {
                self.group(op)?;
                let g = dout()?;
                let mut d = fresh(op.inputs[0])?;
                dev.copy(&mut d, 0, g.get(), 0, g.get().len())?;
                d
            }
            OpKind::AllGather | OpKind::ReduceScatter if self.is_etp_exchange(op) => self.etp_backward(op, dout()?.get())?,
            OpKind::AllGather => {
                let c = self.group(op)?;
                let axis = op.int("axis").unwrap_or(0).max(0) as usize;
                let g = dout()?;
                let rm = to_rank_major(dev, g.get(), shape(op.outputs[0]), axis, c.size())?;
                let mut d = fresh(op.inputs[0])?;
                if all_gather_backward_reduces(&self.graph, op) {
                    // Column-parallel readers, or attention over cp-gathered K/V, leave
                    // per-rank partial gradients: sum them.
                    c.reduce_scatter(rm.get(), &mut d)?;
                } else {
                    // Replicated readers leave the complete gradient on every rank: keep
                    // this rank's part (Megatron's tensor_parallel_output_grad=False).
                    let n = d.len();
                    dev.copy(&mut d, 0, rm.get(), c.rank() * n, n)?;
                }
                d
            }
            OpKind::ReduceScatter => {
                let c = self.group(op)?;
                let axis = op.int("axis").unwrap_or(0).max(0) as usize;
                let g = dout()?;
                let mut all = fresh(op.inputs[0])?;
                c.all_gather(g.get(), &mut all)?;
                let mut d = fresh(op.inputs[0])?;
                from_rank_major(dev, &mut d, &all, shape(op.inputs[0]), axis, c.size())?;
                d
            }
            OpKind::AllToAll if self.is_ep_all_to_all(op) => self.ep_backward(op, dout()?.get())?,
            OpKind::AllToAll => {
                // The inverse trade: feature slice j goes back to rank j.
                let c = self.group(op)?;
                let (is, os) = (shape(op.inputs[0]), shape(op.outputs[0]));
                let n = c.size();
                let (tok, feat) = traded_axes(is, os, n as u64).ok_or_else(|| {
                    unsupported(op, "an all-to-all that does not trade features for tokens")
                })?;
                let g = dout()?;
                let rm = to_rank_major(dev, g.get(), os, feat, n)?;
                let mut recv = fresh(op.inputs[0])?;
                c.all_to_all(rm.get(), &mut recv)?;
                let mut d = fresh(op.inputs[0])?;
                from_rank_major(dev, &mut d, &recv, is, tok, n)?;
                d
            }
            OpKind::Send => {
                // The token's gradient is the loss seed; the sent activation's comes from
                // the next stage.
                let c = self.group(op)?;
                let peer = self.peer(op, &c)?;
                let what = format!("the gradient of '{}'", self.graph.tensors[op.inputs[0]].name);
                let mut d = fresh(op.inputs[0])?;
                self.recv_for(op, (false, step.op), &what, &c, peer, &mut d)?;
                d
            }
            OpKind::Recv => {
                let c = self.group(op)?;
                let peer = self.peer(op, &c)?;
                self.send_for(&c, peer, dout()?.get())?;
                return Ok(CommBackward::Done);
            }
            OpKind::Embedding if is_vocab_parallel_embedding(op) => {
                let start = op.int("vocab-start").unwrap_or(0).max(0) as usize;
                let c = shape(op.inputs[1])[1] as usize;
                let tokens = self.val(op.inputs[0], op)?;
                let mut d = fresh(op.inputs[1])?;
                dev.zero(&mut d)?;
                dev.embedding_backward(&mut d, dout()?.get(), tokens, c, Some(start))
                    .map_err(|e| rename(e, op))?;
                d
            }
            OpKind::CrossEntropy if self.vocab_parallel_ce(op).is_some() => {
                let c = self
                    .tp_group()
                    .ok_or_else(|| unsupported(op, "vocab-parallel loss without a tp group"))?;
                let v = shape(op.inputs[0]).last().copied().unwrap_or(1).max(1) as usize;
                let x = self.val(op.inputs[0], op)?;
                let targets = self.val(op.inputs[1], op)?;
                let lse = self.aux[step.op].first().ok_or_else(|| {
                    ExecError::State(format!("'{}': lse was not saved", op.name))
                })?;
                let dloss = step.grads_in.first().copied().flatten().and_then(|t| self.grads[t].as_ref());
                let mut d = fresh(op.inputs[0])?;
                dev.cross_entropy_shard_backward(&mut d, x, lse, targets, c.rank() * v, v, dloss)
                    .map_err(|e| rename(e, op))?;
                d
            }
            _ => return Ok(CommBackward::NotMine),
        };
        // Every op above writes the gradient of input slot 0, or of the table (slot 1) for
        // the embedding, whose slot 0 (token ids) never carries one.
        Ok(CommBackward::Grad(d))
    }
}

/// Whether `op` is a vocab-parallel embedding, whose backward here writes the table's
/// gradient into a buffer of its own (a whole local table shard) before the executor
/// adds or copies it into the gradient store: for that step both are live, one table
/// shard more than the store holds (the memory walk counts it). The other ops that hand
/// back `CommBackward::Grad` do the same with an activation-sized buffer; counting theirs
/// moved no walked peak in the FSDP tests, so the walk leaves them out.
pub(super) fn is_vocab_parallel_embedding(op: &Op) -> bool {
    op.kind == OpKind::Embedding && op.int("vocab-start").is_some()
}

/// A kernel error renamed to the graph op it ran for.
fn rename(e: ExecError, op: &Op) -> ExecError {
    match e {
        ExecError::Kernel { source, .. } => ExecError::Kernel {
            op: op.name.clone(),
            source,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Cpu;

    #[test]
    fn rank_major_round_trips() {
        let dev = Cpu::new();
        let shape = [2u64, 4, 3];
        let mut x = dev.alloc(Elem::F32, 24).unwrap();
        let xs: Vec<f32> = (0..24).map(|i| i as f32).collect();
        dev.write_f32(&mut x, &xs).unwrap();
        let rm = to_rank_major(&dev, &x, &shape, 1, 2).unwrap();
        let r = dev.read_f32(rm.get()).unwrap();
        // Rank 0's chunk: rows 0..2 of axis 1 from both outer slices.
        assert_eq!(r[..6], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(r[6..12], [12.0, 13.0, 14.0, 15.0, 16.0, 17.0]);
        let mut back = dev.alloc(Elem::F32, 24).unwrap();
        from_rank_major(&dev, &mut back, rm.get(), &shape, 1, 2).unwrap();
        assert_eq!(dev.read_f32(&back).unwrap(), xs);
    }
}
