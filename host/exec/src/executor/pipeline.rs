//! The order of a step's forward and backward passes over several micro-batches, the
//! micro-batches set aside between their passes, and the pipeline's sends and receives
//! between passes.
//!
//! A pipeline stage that ran each micro-batch's forward and backward before the next
//! micro-batch's forward would wait, for every micro-batch, for the whole pipeline to
//! run it there and back: the stages take turns and the step costs about `stages`
//! times one stage's work. Megatron runs 1F1B instead
//! (`forward_backward_pipelining_without_interleaving`,
//! megatron/core/pipeline_parallel/schedules.py; PipeDream-Flush, Narayanan et al. 2021):
//! stage `s` of `p` first runs `p - s - 1` warm-up forwards, then alternates one forward
//! and one backward, then drains the backwards left. The stages then work at once and
//! the step costs about `micro-batches + p - 1` stage-passes. Stage `s` holds up to
//! `p - s` micro-batches between their forward and their backward (their activations,
//! saved statistics and inputs): [`one_f_one_b`] and [`in_flight`].
//!
//! A rank that holds several pipeline chunks (virtual stages: stage `s` of `p` runs
//! chunks `s`, `s + p`, ... of the model, so a micro-batch goes round the stages `vp`
//! times) runs Megatron's interleaved schedule
//! (`forward_backward_pipelining_with_interleaving`, Narayanan et al. 2021, section
//! 2.2): its passes are one chunk's forward or backward of one micro-batch, taken `p`
//! micro-batches of a chunk at a time, after `(p - s - 1)·2 + (vp - 1)·p` warm-up chunk
//! forwards ([`interleaved`]). The bubble shrinks `vp`-fold, and stage 0 holds
//! `p + (p - 1)/vp` micro-batches' activations instead of `p`.
//!
//! The executor keeps one micro-batch's activations in its tensor store; the others wait
//! here ([`Parked`]). The pipeline's sends and receives do not happen as their ops run:
//! the schedule posts them between its iterations as one batched call
//! (`Collective::batch_send_recv`, Megatron's `batch_isend_irecv`), the sends of the
//! iteration before with the receives of the iteration after. An iteration is one pass,
//! as in Megatron's 1F1B (`send_forward_recv_backward` between a forward and the next
//! backward, `send_backward_recv_forward` after it), or under interleaving a forward and
//! a backward of the steady state, whose sends go with the next two passes' receives
//! (`send_forward_backward_recv_forward_backward`). On NCCL a send waits for its
//! receive: stages that each sent before receiving would wait on each other forever;
//! interleaved stages that posted pass by pass would too, through the ring of stages.
//!
//! The weight gradients come out bit for bit as the in-order schedule's: each chunk's
//! backwards run in micro-batch order, so each gradient sums the same values in the
//! same order.

use std::ops::Range;

use runner_graph::{OpKind, TensorId, TensorKind};

use super::comm::Mailbox;
use super::{BackwardSpan, Executor, Input, elem_of};
use crate::device::{Device, Elem, ExecError, Plans};

/// How [`Executor::step_micro_batches`] orders the passes of a pipeline stage's
/// micro-batches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PipelineSchedule {
    /// Megatron's 1F1B (the default): warm-up forwards, then one forward and one
    /// backward in turn, then the backwards left; interleaved over the chunks of a rank
    /// that holds several (when the micro-batches are a multiple of the stages, as
    /// Megatron requires; in order otherwise).
    #[default]
    OneFOneB,
    /// Each micro-batch's forward and backward before the next one's forward: the stages
    /// take turns (what a pipeline without a schedule does; kept to measure against).
    InOrder,
}

/// One pass of a step: the forward or the backward of pipeline chunk `.1` (0 on a rank
/// of one chunk) of micro-batch `.0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Forward(usize, usize),
    Backward(usize, usize),
}

impl Pass {
    fn micro_batch(self) -> usize {
        match self {
            Pass::Forward(i, _) | Pass::Backward(i, _) => i,
        }
    }
}

/// A schedule: its iterations in order, each one pass, or a forward and a backward (the
/// interleaved schedule's steady state). The pipeline's traffic is posted between them:
/// the sends of the iteration before with the receives of the iteration after.
pub type Schedule = Vec<Vec<Pass>>;

/// The passes of `schedule` in order.
pub fn passes(schedule: &Schedule) -> Vec<Pass> {
    schedule.iter().flatten().copied().collect()
}

/// Each micro-batch's forward, then its backward, in micro-batch order (over its
/// `chunks` in order forward, in reverse backward); one pass per iteration.
pub fn in_order(micro_batches: usize, chunks: usize) -> Schedule {
    (0..micro_batches)
        .flat_map(|i| (0..chunks).map(move |c| Pass::Forward(i, c)).chain((0..chunks).rev().map(move |c| Pass::Backward(i, c))))
        .map(|p| vec![p])
        .collect()
}

/// `warmup` forwards alone, then forward `warmup + k` with backward `k`, then the
/// backwards left alone: the shape of both of Megatron's 1F1B schedules, given the
/// k-th forward and backward.
fn warm_steady_cool(total: usize, warmup: usize, forward: impl Fn(usize) -> Pass, backward: impl Fn(usize) -> Pass) -> Schedule {
    let mut s: Schedule = (0..warmup).map(|k| vec![forward(k)]).collect();
    s.extend((0..total - warmup).map(|k| vec![forward(warmup + k), backward(k)]));
    s.extend((total - warmup..total).map(|k| vec![backward(k)]));
    s
}

/// The 1F1B order of stage `stage` of `stages` over `micro_batches` (Megatron's
/// non-interleaved schedule): `stages - stage - 1` warm-up forwards (at most every
/// micro-batch), one forward and one backward in turn, then the backwards left. Each
/// pass is an iteration of its own: Megatron posts a forward's send with the next
/// backward's receive between the two (`send_forward_recv_backward`), so a stage runs
/// its next forward while the next stage works out the gradient; receiving that
/// gradient before the forward, as the interleaved schedule's pairs do, would make the
/// stages take turns again (measured: `docs/PERFORMANCE.md`).
pub fn one_f_one_b(stages: usize, stage: usize, micro_batches: usize) -> Schedule {
    let warmup = runner_graph::pipeline::warmup_forwards(stages, stage, micro_batches);
    let s = warm_steady_cool(micro_batches, warmup, |k| Pass::Forward(k, 0), |k| Pass::Backward(k, 0));
    passes(&s).into_iter().map(|p| vec![p]).collect()
}

/// Megatron's interleaved 1F1B order of stage `stage` of `stages` holding `chunks`
/// chunks, over `micro_batches` (`forward_backward_pipelining_with_interleaving`):
/// chunk forwards taken `stages` micro-batches of one chunk at a time (chunk 0 of
/// micro-batches 0..p, chunk 1 of the same, ..., then the next p micro-batches),
/// backwards likewise from the last chunk; `(p - s - 1)·2 + (vp - 1)·p` warm-up chunk
/// forwards, at most all of them (the Megatron of 2025; earlier ones ran every forward
/// first whenever the micro-batches were exactly `p`). `None` when the micro-batches are
/// not a multiple of the stages (Megatron refuses them).
pub fn interleaved(stages: usize, stage: usize, chunks: usize, micro_batches: usize) -> Option<Schedule> {
    if stages == 0 || chunks == 0 || !micro_batches.is_multiple_of(stages) || micro_batches == 0 {
        return None;
    }
    let total = micro_batches * chunks;
    let warmup = runner_graph::pipeline::warmup_chunk_forwards(stages, stage, chunks, micro_batches);
    // The k-th chunk pass: its micro-batch and its place among the chunks.
    let group = stages * chunks;
    let at = |k: usize| ((k / group) * stages + k % stages, (k % group) / stages);
    Some(warm_steady_cool(
        total,
        warmup,
        |k| {
            let (i, c) = at(k);
            Pass::Forward(i, c)
        },
        |k| {
            let (i, c) = at(k);
            Pass::Backward(i, chunks - 1 - c)
        },
    ))
}

/// The most chunk forwards `order` holds before their backward at once (micro-batches,
/// on a rank of one chunk).
pub fn in_flight(order: &[Pass]) -> usize {
    let (mut now, mut most) = (0usize, 0usize);
    for p in order {
        match p {
            Pass::Forward(..) => {
                now += 1;
                most = most.max(now);
            }
            Pass::Backward(..) => now = now.saturating_sub(1),
        }
    }
    most
}

/// Where a rank graph's pipeline chunks lie: each chunk's forward ops and backward steps
/// (ranges of op and step indices), and the ops whose data the schedule receives for
/// each chunk's forward (recv ops) and backward (send ops, whose gradient comes back).
pub(super) struct Chunks {
    ops: Vec<Range<usize>>,
    steps: Vec<Range<usize>>,
    forward_recvs: Vec<Vec<usize>>,
    backward_recvs: Vec<Vec<usize>>,
}

impl Chunks {
    fn len(&self) -> usize {
        self.ops.len()
    }

    /// The chunks of `ex`'s graph as `runner_graph::shard` lays a pipeline rank out
    /// (each chunk: its receives, its ops, its sends; then the objective summing the
    /// loss and the send tokens), or `None` when the graph cannot be cut there: an
    /// activation read across chunks other than through a send and receive, backward
    /// steps or a recompute segment out of chunk order, or a send or receive outside
    /// the `pp` group.
    fn of<D: Device>(ex: &Executor<D>) -> Option<Chunks> {
        let (g, plan, sched) = (&ex.graph, &ex.plan, &ex.sched);
        let is = |oi: usize, k: OpKind| g.ops[oi].kind == k;
        if g.ops.iter().any(|o| matches!(o.kind, OpKind::Send | OpKind::Recv) && o.text("group") != Some("pp")) {
            return None;
        }
        // A chunk starts at the first of a run of receives (or at op 0).
        let mut starts = vec![0];
        for oi in 1..g.ops.len() {
            if is(oi, OpKind::Recv) && !is(oi - 1, OpKind::Recv) {
                starts.push(oi);
            }
        }
        let mut chunk_of = vec![0usize; g.ops.len()];
        let mut ops = Vec::new();
        for (c, &s) in starts.iter().enumerate() {
            let e = starts.get(c + 1).copied().unwrap_or(g.ops.len());
            chunk_of[s..e].iter_mut().for_each(|x| *x = c);
            ops.push(s..e);
        }
        let mut producer: Vec<Option<usize>> = vec![None; g.tensors.len()];
        for (oi, op) in g.ops.iter().enumerate() {
            for &o in &op.outputs {
                producer[o] = Some(oi);
            }
        }
        // Activations stay in their chunk; a send's token is read by the objective.
        for (oi, op) in g.ops.iter().enumerate() {
            for &x in &op.inputs {
                if let Some(p) = producer[x]
                    && g.tensors[x].kind == TensorKind::Activation
                    && chunk_of[p] != chunk_of[oi]
                    && !is(p, OpKind::Send)
                {
                    return None;
                }
            }
        }
        // Backward steps run the chunks last to first, each chunk's steps together, and
        // a recompute segment re-runs ops of its step's chunk.
        let mut steps = vec![0..0; ops.len()];
        let mut prev = ops.len();
        for (si, st) in plan.steps.iter().enumerate() {
            let c = chunk_of[st.op];
            if c > prev || (c < prev && !steps[c].is_empty()) {
                return None;
            }
            if let Some(seg) = sched.rerun_before_step[si]
                && sched.segments[seg].iter().any(|&oi| chunk_of[oi] != c)
            {
                return None;
            }
            steps[c] = if steps[c].is_empty() { si..si + 1 } else { steps[c].start..si + 1 };
            prev = c;
        }
        let forward_recvs = ops.iter().map(|r| r.clone().filter(|&oi| is(oi, OpKind::Recv)).collect()).collect();
        let backward_recvs = steps
            .iter()
            .map(|r| r.clone().map(|si| plan.steps[si].op).filter(|&oi| is(oi, OpKind::Send)).collect())
            .collect();
        Some(Chunks { ops, steps, forward_recvs, backward_recvs })
    }
}

/// A micro-batch between its passes, set aside while others run: its inputs,
/// activations and activation gradients (by tensor), the statistics its ops saved, its
/// GEMM plans and its expert-parallel routing.
pub(super) struct Parked<D: Device> {
    vals: Vec<(TensorId, D::Buffer)>,
    grads: Vec<(TensorId, D::Buffer)>,
    aux: Vec<(usize, Vec<D::Buffer>)>,
    plans: Plans<D::Plan>,
    ep: super::ep::EpState,
}

/// How a step runs its passes: the schedule, the chunks they cut the graph at, and
/// whether the schedule posts the pipeline's traffic (else each send and receive runs
/// with its op).
pub(super) struct PassPlan {
    schedule: Schedule,
    chunks: Chunks,
    driven: bool,
}

impl<D: Device> Executor<D> {
    /// This rank's (stage, stages) on a pipeline of more than one stage.
    fn pipeline_stage(&self) -> Option<(usize, usize)> {
        let c = self.collectives.get("pp").filter(|c| c.size() > 1)?;
        Some((c.rank(), c.size()))
    }

    /// How this step runs its passes over `micro_batches`.
    pub(super) fn pass_plan(&self, micro_batches: usize) -> PassPlan {
        let whole = || Chunks {
            ops: std::iter::once(0..self.graph.ops.len()).collect(),
            steps: std::iter::once(0..self.plan.steps.len()).collect(),
            forward_recvs: vec![Vec::new()],
            backward_recvs: vec![Vec::new()],
        };
        let (Some((stage, stages)), Some(chunks)) = (self.pipeline_stage(), Chunks::of(self)) else {
            return PassPlan { schedule: in_order(micro_batches, 1), chunks: whole(), driven: false };
        };
        let n = chunks.len();
        let schedule = match self.options.pipeline_schedule {
            PipelineSchedule::OneFOneB if n == 1 => one_f_one_b(stages, stage, micro_batches),
            PipelineSchedule::OneFOneB => interleaved(stages, stage, n, micro_batches).unwrap_or_else(|| in_order(micro_batches, n)),
            PipelineSchedule::InOrder => in_order(micro_batches, n),
        };
        PassPlan { schedule, chunks, driven: true }
    }

    /// Run `plan`'s passes over `batches`, parking each micro-batch between its passes
    /// while another one runs; returns the sum of the forwards' losses.
    pub(super) fn run_passes(&mut self, plan: &PassPlan, batches: &[Vec<(&str, Input<'_>)>]) -> Result<f64, ExecError> {
        if self.options.cuda_graph {
            return Err(super::graph::whole_steps_only("step_micro_batches"));
        }
        let mut parked: Vec<Option<Parked<D>>> = (0..batches.len()).map(|_| None).collect();
        // The micro-batch whose activations are in the tensor store.
        let mut active: Option<usize> = None;
        let mut total = 0f64;
        let last = plan.chunks.len() - 1;
        self.fsdp_passes(&plan.chunks.ops, &plan.chunks.steps, &passes(&plan.schedule), self.mailbox_bytes(plan));
        self.fsdp.passes.driven = plan.driven;
        *self.comm.mailbox.borrow_mut() = plan.driven.then(Mailbox::default);
        let r = (|| {
            let mut started = false;
            let mut backwards = 0usize;
            for iteration in &plan.schedule {
                if plan.driven {
                    self.post_pipeline(iteration, &plan.chunks)?;
                }
                for &pass in iteration {
                    let i = pass.micro_batch();
                    if active != Some(i) {
                        if let Some(a) = active.take() {
                            parked[a] = Some(self.park());
                        }
                        if let Some(p) = parked[i].take() {
                            self.resume(p);
                            active = Some(i);
                        }
                    }
                    match pass {
                        Pass::Forward(i, c) => {
                            let fresh = c == 0;
                            if fresh == (active == Some(i)) {
                                return Err(ExecError::State(format!("schedule: forward of chunk {c} of micro-batch {i} out of order")));
                            }
                            self.mid_step = started;
                            started = true;
                            let loss = self.forward_pass(fresh.then(|| batches[i].as_slice()), plan.chunks.ops[c].clone(), c == last)?;
                            if c == last {
                                total += f64::from(loss);
                            }
                            active = Some(i);
                        }
                        Pass::Backward(i, c) => {
                            if active != Some(i) {
                                return Err(ExecError::State(format!("schedule: backward of micro-batch {i} before its forward")));
                            }
                            let span = BackwardSpan { steps: plan.chunks.steps[c].clone(), begins: c == last, ends: c == 0 };
                            self.backward_steps(backwards > 0, span)?;
                            backwards += 1;
                            if c == 0 {
                                active = None;
                            }
                        }
                    }
                }
            }
            // The last iteration's sends.
            if plan.driven {
                self.post_pipeline(&[], &plan.chunks)?;
            }
            Ok(())
        })();
        *self.comm.mailbox.borrow_mut() = None;
        self.mid_step = false;
        self.in_flight = in_flight(&passes(&plan.schedule)).max(1) as u64;
        self.chunks = plan.chunks.len() as u64;
        r.map(|()| total)
    }

    /// Per pass of `plan`'s order: the bytes the other passes of its iteration keep in
    /// the mailbox while it runs (what the memory account adds to its walk): the
    /// receives of those after it, posted before the iteration, and the sends of those
    /// before it, held to the next post. One pass per iteration (1F1B, in order): none.
    fn mailbox_bytes(&self, plan: &PassPlan) -> Vec<u64> {
        let bytes = |id: TensorId| 4 * self.graph.tensors[id].numel();
        let (g, c) = (&self.graph, &plan.chunks);
        // A pass's receives and sends: a forward receives its recvs' outputs and sends
        // its sends' inputs; a backward receives the gradients of its sends' inputs and
        // sends those of its recvs' outputs.
        let traffic = |p: Pass| -> (u64, u64) {
            match p {
                Pass::Forward(_, k) => (
                    c.forward_recvs[k].iter().map(|&oi| bytes(g.ops[oi].outputs[0])).sum(),
                    c.ops[k].clone().filter(|&oi| g.ops[oi].kind == OpKind::Send).map(|oi| bytes(g.ops[oi].inputs[0])).sum(),
                ),
                Pass::Backward(_, k) => (
                    c.backward_recvs[k].iter().map(|&oi| bytes(g.ops[oi].inputs[0])).sum(),
                    c.forward_recvs[k].iter().map(|&oi| bytes(g.ops[oi].outputs[0])).sum(),
                ),
            }
        };
        let mut out = Vec::new();
        for iteration in &plan.schedule {
            for k in 0..iteration.len() {
                let before: u64 = iteration[..k].iter().map(|&p| traffic(p).1).sum();
                let after: u64 = iteration[k + 1..].iter().map(|&p| traffic(p).0).sum();
                out.push(if plan.driven { before + after } else { 0 });
            }
        }
        out
    }

    /// Post, as one call on the pipeline group, what the passes since the last call sent
    /// and what `iteration`'s passes will receive (into the mailbox, by op).
    fn post_pipeline(&mut self, iteration: &[Pass], chunks: &Chunks) -> Result<(), ExecError> {
        let sends = self.comm.mailbox.borrow_mut().as_mut().map(|m| std::mem::take(&mut m.outbox)).unwrap_or_default();
        let pp = self
            .timed("pp")
            .ok_or_else(|| ExecError::State("pipeline schedule: no collective handle for group 'pp'".into()))?;
        let mut keys = Vec::new();
        let mut recvs = Vec::new();
        for &pass in iteration {
            let (forward, ops) = match pass {
                Pass::Forward(_, c) => (true, &chunks.forward_recvs[c]),
                Pass::Backward(_, c) => (false, &chunks.backward_recvs[c]),
            };
            for &oi in ops {
                let op = &self.graph.ops[oi];
                let peer = self.peer(op, &pp)?;
                // What the op will take: a recv's output as stored, a send's input's
                // gradient in f32.
                let buf = if forward {
                    let o = op.outputs[0];
                    self.device.alloc(elem_of(self.graph.tensors[o].dtype), self.numel_of(o))?
                } else {
                    self.device.alloc(Elem::F32, self.numel_of(op.inputs[0]))?
                };
                keys.push((forward, oi));
                recvs.push((peer, buf));
            }
        }
        pp.batch_send_recv(&sends, &mut recvs)?;
        if let Some(m) = self.comm.mailbox.borrow_mut().as_mut() {
            m.inbox.extend(keys.into_iter().zip(recvs.into_iter().map(|(_, b)| b)));
        }
        Ok(())
    }

    /// Move the active micro-batch's state out of the tensor store (between its passes).
    fn park(&mut self) -> Parked<D> {
        // A pass ends with its fused cast consumed and its partial input gradients
        // reduced; neither is parked, so a leftover would leak into the next micro-batch.
        debug_assert!(self.cast.is_none(), "a fused cast outlived its pass");
        debug_assert!(self.pending_partials.is_empty(), "partial gradients outlived their pass");
        let mut p = Parked {
            vals: Vec::new(),
            grads: Vec::new(),
            aux: Vec::new(),
            plans: std::mem::take(&mut self.plans),
            ep: std::mem::take(&mut self.ep),
        };
        for (id, t) in self.graph.tensors.iter().enumerate() {
            if matches!(t.kind, TensorKind::Activation | TensorKind::Input) {
                if let Some(b) = self.vals[id].take() {
                    p.vals.push((id, b));
                }
                if let Some(b) = self.grads[id].take() {
                    p.grads.push((id, b));
                }
            }
        }
        for (oi, a) in self.aux.iter_mut().enumerate() {
            if !a.is_empty() {
                p.aux.push((oi, std::mem::take(a)));
            }
        }
        self.forward_done = false;
        p
    }

    /// Put a parked micro-batch back, ready for its next pass; the store holds no other.
    fn resume(&mut self, p: Parked<D>) {
        self.release_activations();
        for (id, b) in p.vals {
            self.vals[id] = Some(b);
        }
        for (id, b) in p.grads {
            self.grads[id] = Some(b);
        }
        for (oi, a) in p.aux {
            self.aux[oi] = a;
        }
        self.plans = p.plans;
        self.ep = p.ep;
        self.forward_done = true;
        self.backward_done = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Pass::{Backward as B, Forward as F};

    fn forwards(o: &[Pass]) -> Vec<(usize, usize)> {
        o.iter().filter_map(|p| if let F(i, c) = p { Some((*i, *c)) } else { None }).collect()
    }

    fn backwards(o: &[Pass]) -> Vec<(usize, usize)> {
        o.iter().filter_map(|p| if let B(i, c) = p { Some((*i, *c)) } else { None }).collect()
    }

    fn at(o: &[Pass], p: Pass) -> usize {
        o.iter().position(|q| *q == p).unwrap()
    }

    /// What any schedule must be: every chunk of every micro-batch once each way, a
    /// micro-batch's chunks forward in order and backward in reverse, its forwards done
    /// before its backwards, and each chunk's backwards in micro-batch order (so the
    /// gradients sum as in order). Iterations are one pass, or a forward and a backward.
    fn valid(s: &Schedule, m: usize, chunks: usize, what: &str) {
        let o = passes(s);
        let mut f = forwards(&o);
        let mut b = backwards(&o);
        f.sort();
        b.sort();
        let all: Vec<(usize, usize)> = (0..m).flat_map(|i| (0..chunks).map(move |c| (i, c))).collect();
        assert_eq!((f, b), (all.clone(), all), "{what}: {o:?}");
        for i in 0..m {
            for c in 1..chunks {
                assert!(at(&o, F(i, c - 1)) < at(&o, F(i, c)), "{what}: {o:?}");
                assert!(at(&o, B(i, c)) < at(&o, B(i, c - 1)), "{what}: {o:?}");
            }
            assert!(at(&o, F(i, chunks - 1)) < at(&o, B(i, chunks - 1)), "{what}: {o:?}");
        }
        for c in 0..chunks {
            let order: Vec<usize> = backwards(&o).into_iter().filter(|p| p.1 == c).map(|p| p.0).collect();
            assert_eq!(order, (0..m).collect::<Vec<_>>(), "{what}: chunk {c}'s backwards: {o:?}");
        }
        for it in s {
            assert!(matches!(it.as_slice(), [_] | [F(..), B(..)]), "{what}: iteration {it:?}");
            assert!(chunks > 1 || it.len() == 1, "{what}: 1F1B posts between every two passes: {it:?}");
        }
    }

    #[test]
    fn each_stage_warms_up_then_alternates_and_holds_at_most_its_distance_to_the_end() {
        for stages in 1..=5 {
            for m in 1..=9 {
                for s in 0..stages {
                    let o = one_f_one_b(stages, s, m);
                    valid(&o, m, 1, &format!("stage {s} of {stages}, {m} micro-batches"));
                    assert_eq!(in_flight(&passes(&o)), (stages - s).min(m), "stage {s} of {stages}, {m}");
                }
            }
        }
        // Megatron's picture for 4 stages and 6 micro-batches, stages 0 and 3.
        assert_eq!(
            passes(&one_f_one_b(4, 0, 6)),
            vec![F(0, 0), F(1, 0), F(2, 0), F(3, 0), B(0, 0), F(4, 0), B(1, 0), F(5, 0), B(2, 0), B(3, 0), B(4, 0), B(5, 0)]
        );
        assert_eq!(passes(&one_f_one_b(4, 3, 6)), passes(&in_order(6, 1)));
        assert_eq!(in_flight(&passes(&in_order(6, 1))), 1);
        assert_eq!(in_flight(&passes(&in_order(6, 3))), 3);
        valid(&in_order(4, 3), 4, 3, "in order over 3 chunks");
    }

    /// Megatron's interleaved schedule: chunk forwards p micro-batches of a chunk at a
    /// time, (p - s - 1)·2 + (vp - 1)·p warm-up forwards on stage s (at most all), and
    /// stage 0 holding p·vp + p - 1 chunk forwards at once (p + (p - 1)/vp micro-batches'
    /// worth) when the step has that many.
    #[test]
    fn interleaving_takes_the_stages_micro_batches_a_chunk_at_a_time() {
        for stages in 2..=5 {
            for chunks in 2..=4 {
                for m in [stages, 2 * stages, 3 * stages] {
                    for s in 0..stages {
                        let o = interleaved(stages, s, chunks, m).unwrap();
                        let what = format!("stage {s} of {stages}, {chunks} chunks, {m} micro-batches");
                        valid(&o, m, chunks, &what);
                        let warmup = o.iter().take_while(|it| it.len() == 1 && matches!(it[0], F(..))).count();
                        let want = ((stages - s - 1) * 2 + (chunks - 1) * stages).min(m * chunks);
                        assert_eq!(warmup, want, "{what}");
                        assert_eq!(in_flight(&passes(&o)), (want + 1).min(m * chunks), "{what}");
                    }
                }
            }
        }
        // pp = 2, vp = 2, 4 micro-batches, stage 0 (worked by hand from schedules.py).
        assert_eq!(
            passes(&interleaved(2, 0, 2, 4).unwrap()),
            vec![
                F(0, 0), F(1, 0), F(0, 1), F(1, 1),
                F(2, 0), B(0, 1), F(3, 0), B(1, 1), F(2, 1), B(0, 0), F(3, 1), B(1, 0),
                B(2, 1), B(3, 1), B(2, 0), B(3, 0),
            ]
        );
        assert_eq!(interleaved(4, 0, 2, 6), None, "6 micro-batches over 4 stages");
    }

    /// The interleaved schedule exists exactly when Megatron's does: a positive multiple
    /// of the stages in micro-batches, some stages and chunks; otherwise `None` (and the
    /// step runs in order), never a schedule that misses or repeats a pass. One stage
    /// of several chunks is a valid schedule too, with (vp - 1) warm-up forwards.
    #[test]
    fn interleaving_needs_a_positive_multiple_of_the_stages() {
        for stages in 1..=4 {
            for chunks in 2..=3 {
                for m in 0..=3 * stages + 1 {
                    for s in 0..stages {
                        let what = format!("stage {s} of {stages}, {chunks} chunks, {m} micro-batches");
                        let o = interleaved(stages, s, chunks, m);
                        assert_eq!(o.is_some(), m > 0 && m % stages == 0, "{what}");
                        if let Some(o) = o {
                            valid(&o, m, chunks, &what);
                            let want = ((stages - s - 1) * 2 + (chunks - 1) * stages).min(m * chunks);
                            assert_eq!(in_flight(&passes(&o)), (want + 1).min(m * chunks), "{what}");
                        }
                    }
                }
            }
        }
        assert_eq!((interleaved(0, 0, 2, 4), interleaved(2, 0, 0, 4), interleaved(2, 1, 0, 2)), (None, None, None));
        // What the count of forwards held sees of orders no schedule makes: nothing held,
        // and a backward with nothing held holds nothing less.
        assert_eq!((in_flight(&[]), in_flight(&[B(0, 0), F(1, 0), F(2, 0), B(1, 0)])), (0, 2));
    }

    /// A schedule that runs a micro-batch's forward twice, or a backward before its
    /// forward, is refused before it trains on a wrong step (a schedule generator's bug
    /// would otherwise pass silently), and the executor's next step is as a fresh one's.
    #[test]
    fn run_passes_refuses_a_schedule_out_of_order() {
        let g = crate::toy::llama(&crate::toy::ToyConfig::tiny());
        let data = [crate::proxy::synthetic_inputs(&g, 0), crate::proxy::synthetic_inputs(&g, 1)];
        let batches: Vec<Vec<(&str, Input<'_>)>> = data.iter().map(|d| d.iter().map(|(n, u, _)| (n.as_str(), Input::U32(u))).collect()).collect();
        let fresh = || Executor::new(&g, crate::cpu::Cpu::new(), crate::executor::ExecOptions::default()).unwrap();
        let mut ex = fresh();
        for bad in [vec![F(0, 0), F(0, 0), B(0, 0)], vec![B(0, 0), F(0, 0)], vec![F(0, 0), B(1, 0), F(1, 0)], vec![F(0, 0), F(1, 0), B(1, 0), B(1, 0)]] {
            let mut plan = ex.pass_plan(2);
            plan.schedule = bad.iter().map(|&p| vec![p]).collect();
            match ex.run_passes(&plan, &batches) {
                Err(ExecError::State(e)) if e.starts_with("schedule: ") => {}
                r => panic!("{bad:?}: {r:?}"),
            }
        }
        let want = fresh().step_micro_batches(&batches, &crate::executor::ADAMW_DEFAULT).unwrap();
        assert_eq!(ex.step_micro_batches(&batches, &crate::executor::ADAMW_DEFAULT).unwrap(), want);
    }

    /// A run of passes that fails after it set the step's pass state (here: a plan
    /// driven by a pipeline schedule on an executor with no `pp` group, refused at its
    /// first post) leaves `fsdp.passes` as that run set it, `driven` included. Not a
    /// bug: every step arms first ([`Executor::arm_buckets`] → `fsdp_arm`, which resets
    /// the pass state, the prefetch and the reduce-scatters in flight) and a step over
    /// micro-batches then sets its own; `driven` is only read by the memory walk, for
    /// receive ops. The next step (over micro-batches, or a plain one) gives a fresh
    /// executor's loss, weights and memory account, bit for bit.
    #[test]
    fn a_failed_driven_run_leaves_nothing_to_the_next_step() {
        let g = crate::toy::llama(&crate::toy::ToyConfig::tiny());
        let data = [crate::proxy::synthetic_inputs(&g, 0), crate::proxy::synthetic_inputs(&g, 1)];
        let batches: Vec<Vec<(&str, Input<'_>)>> = data.iter().map(|d| d.iter().map(|(n, u, _)| (n.as_str(), Input::U32(u))).collect()).collect();
        let fresh = || Executor::new(&g, crate::cpu::Cpu::new(), crate::executor::ExecOptions::default()).unwrap();
        let h = &crate::executor::ADAMW_DEFAULT;
        let weights = |ex: &Executor<crate::cpu::Cpu>| -> Vec<Vec<f32>> { g.tensors.iter().filter(|t| t.kind.is_param()).map(|t| ex.weight(&t.name).unwrap()).collect() };
        let fail = |ex: &mut Executor<crate::cpu::Cpu>| {
            let mut plan = ex.pass_plan(2);
            plan.driven = true;
            match ex.run_passes(&plan, &batches) {
                Err(ExecError::State(e)) if e.contains("no collective handle for group 'pp'") => {}
                r => panic!("{r:?}"),
            }
            assert!(ex.fsdp.passes.driven && !ex.fsdp.passes.order.is_empty(), "the failed run set the pass state");
        };
        // Over micro-batches.
        let (mut ex, mut want) = (fresh(), fresh());
        fail(&mut ex);
        assert_eq!(ex.step_micro_batches(&batches, h).unwrap().to_bits(), want.step_micro_batches(&batches, h).unwrap().to_bits());
        assert!(!ex.fsdp.passes.driven);
        assert_eq!((weights(&ex), format!("{:?}", ex.memory())), (weights(&want), format!("{:?}", want.memory())));
        // A plain step.
        let (mut ex, mut want) = (fresh(), fresh());
        fail(&mut ex);
        assert_eq!(ex.step(&batches[0], h).unwrap().to_bits(), want.step(&batches[0], h).unwrap().to_bits());
        assert!(!ex.fsdp.passes.driven && ex.fsdp.passes.order.is_empty());
        assert_eq!((weights(&ex), format!("{:?}", ex.memory())), (weights(&want), format!("{:?}", want.memory())));
    }

    /// Stage `stage` of the 4-layer toy (batch 1) cut pp = 2, vp = 2, with a `pp` group
    /// of two (`keep` holds the other rank's handle).
    fn vp2_stage(stage: u32, pp: crate::collective::ThreadGroup) -> Executor<crate::cpu::Cpu> {
        vp2_stage_with(stage, pp, crate::executor::ExecOptions::default())
    }

    fn vp2_stage_with(stage: u32, pp: crate::collective::ThreadGroup, options: crate::executor::ExecOptions) -> Executor<crate::cpu::Cpu> {
        use runner_graph::shard::{Layout, RankCoord, shard};
        let g = crate::toy::with_roles(crate::toy::llama(&crate::toy::ToyConfig { layers: 4, batch: 1, ..crate::toy::ToyConfig::tiny() }), false);
        let layout = Layout { pp: 2, vp: 2, ..Layout::single(1, 4) };
        let s = shard(&g, &layout, RankCoord { tp: 0, pp: stage, cp: 0, dp: 0 }).unwrap();
        let groups: Vec<(String, Box<dyn crate::collective::Collective<crate::cpu::Cpu>>)> = vec![("pp".into(), Box::new(pp))];
        Executor::for_rank(&s, crate::cpu::Cpu::new(), options, groups).unwrap()
    }

    /// Under the interleaved schedule (pp = 2, vp = 2, four micro-batches) with full
    /// recompute, the profile's record of the last backward (`recomputed_ops`) covers
    /// the last micro-batch's backward over both of the stage's chunks: a chunk's
    /// backward begins the micro-batch's backward (clearing the record, seeding the
    /// loss gradient) only at the rank's last chunk. Fails if every chunk's backward is
    /// taken for the beginning of one (the record then holds chunk 0's re-runs alone).
    #[test]
    fn the_recompute_record_covers_every_chunk_of_the_last_micro_batch() {
        let mut groups = crate::collective::ThreadGroup::new(2).into_iter();
        let (a, b) = (groups.next().unwrap(), groups.next().unwrap());
        let o = crate::executor::ExecOptions { recompute: runner_graph::recompute::RecomputePolicy::Full, ..crate::executor::ExecOptions::default() };
        let out: Vec<(Vec<Range<usize>>, Vec<usize>)> = std::thread::scope(|sc| {
            let hs: Vec<_> = [(0, a), (1, b)]
                .into_iter()
                .map(|(stage, pp)| {
                    let o = o.clone();
                    sc.spawn(move || {
                        let mut ex = vp2_stage_with(stage, pp, o);
                        let ops = ex.pass_plan(4).chunks.ops;
                        let data: Vec<_> = (0..4).map(|k| crate::toy::batch_inputs(&ex.graph, k)).collect();
                        let batches: Vec<Vec<(&str, Input<'_>)>> = data.iter().map(|d| d.iter().map(|(n, v)| (n.as_str(), Input::U32(v))).collect()).collect();
                        ex.step_micro_batches(&batches, &crate::executor::ADAMW_DEFAULT).unwrap();
                        (ops, ex.profile().recomputed_ops.clone())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (stage, (ops, re)) in out.iter().enumerate() {
            assert_eq!(ops.len(), 2, "stage {stage} runs two chunks");
            for (c, r) in ops.iter().enumerate() {
                assert!(re.iter().any(|oi| r.contains(oi)), "stage {stage}: no re-run of chunk {c}'s ops {r:?} in {re:?}");
            }
        }
    }

    /// What the memory account adds per pass for the mailbox (pp = 2, vp = 2, four
    /// micro-batches): in a steady-state pair [forward, backward] the forward runs
    /// beside the backward's gradient, received before the pair, and the backward beside
    /// the forward's activation, sent after it; a pass alone holds nothing there. Every
    /// chunk's boundary is one [1, 8, 32] f32 hidden state (1024 bytes), except that the
    /// last chunk (stage 1's second) sends nothing and gets no gradient back.
    #[test]
    fn interleaved_pairs_hold_each_others_traffic_in_the_mailbox() {
        let h = 4 * 8 * 32;
        let mut groups = crate::collective::ThreadGroup::new(2).into_iter();
        let (a, b) = (groups.next().unwrap(), groups.next().unwrap());
        for (stage, pp, want) in [
            (0, a, vec![0, 0, 0, 0, h, h, h, h, h, h, h, h, 0, 0, 0, 0]),
            (1, b, vec![0, 0, 0, 0, 0, 0, h, h, h, h, 0, 0, 0, 0, 0, 0]),
        ] {
            let ex = vp2_stage(stage, pp);
            let plan = ex.pass_plan(4);
            assert!(plan.driven && plan.chunks.len() == 2, "stage {stage}");
            assert_eq!(plan.schedule.iter().filter(|it| it.len() == 2).count(), [4, 6][stage as usize], "stage {stage}");
            assert_eq!(ex.mailbox_bytes(&plan), want, "stage {stage}: {:?}", plan.schedule);
        }
    }

    /// A graph whose chunks read each other's activations other than through a send
    /// and a receive cannot be cut into passes: `Chunks::of` says so (the step then runs
    /// whole, in order) instead of running a chunk whose input another pass dropped.
    /// Stage 1 of pp = 2, vp = 2 cuts into its two chunks; with the first op after the
    /// second chunk's receive reading the first chunk's received hidden state instead, it
    /// does not.
    #[test]
    fn chunks_that_share_an_activation_are_not_cut() {
        let mut groups = crate::collective::ThreadGroup::new(2).into_iter();
        let ex = vp2_stage(1, groups.next().unwrap());
        assert_eq!(Chunks::of(&ex).map(|c| c.len()), Some(2));
        let mut g = ex.graph.clone();
        let recvs: Vec<usize> = (0..g.ops.len()).filter(|&oi| g.ops[oi].kind == OpKind::Recv).collect();
        let (first, second) = (g.ops[recvs[0]].outputs[0], g.ops[*recvs.last().unwrap()].outputs[0]);
        let reader = (recvs.last().unwrap() + 1..g.ops.len()).find(|&oi| g.ops[oi].inputs.contains(&second)).unwrap();
        for x in &mut g.ops[reader].inputs {
            if *x == second {
                *x = first;
            }
        }
        let ex = Executor::new(&g, crate::cpu::Cpu::new(), crate::executor::ExecOptions::default()).unwrap();
        assert!(Chunks::of(&ex).is_none());
    }
}
