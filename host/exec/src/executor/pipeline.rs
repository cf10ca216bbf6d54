//! The order of a step's forward and backward passes over several micro-batches, and
//! the micro-batches set aside between their two passes.
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
//! The executor keeps one micro-batch's activations in its tensor store; the others wait
//! here ([`Parked`]). Sends and receives between stages keep Megatron's pairing: in the
//! steady state a forward's send to the next stage goes with the next backward's
//! receive from it as one call, and a backward's send to the previous stage with the
//! next forward's receive (`comm.rs`, `defer_sends`), since on NCCL a send waits for its
//! receive and two stages sending to each other first would wait forever.
//!
//! The weight gradients come out bit for bit as the in-order schedule's: the backwards
//! still run in micro-batch order, so each gradient sums the same values in the same
//! order. A rank whose graph holds several pipeline chunks (virtual pipeline stages,
//! which receive in the middle of their forward) runs the micro-batches in order; the
//! interleaved schedule would need its passes cut at the chunks.

use runner_graph::{OpKind, TensorId, TensorKind};

use super::{Executor, Input};
use crate::device::{Device, ExecError, Plans};

/// How [`Executor::step_micro_batches`] orders the passes of a pipeline stage's
/// micro-batches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PipelineSchedule {
    /// Megatron's 1F1B (the default): warm-up forwards, then one forward and one
    /// backward in turn, then the backwards left.
    #[default]
    OneFOneB,
    /// Each micro-batch's forward and backward before the next one's forward: the stages
    /// take turns (what a pipeline without a schedule does; kept to measure against).
    InOrder,
}

/// One pass of a step: the forward or the backward of micro-batch `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Forward(usize),
    Backward(usize),
}

/// Each micro-batch's forward, then its backward, in micro-batch order.
pub fn in_order(micro_batches: usize) -> Vec<Pass> {
    (0..micro_batches).flat_map(|i| [Pass::Forward(i), Pass::Backward(i)]).collect()
}

/// The 1F1B order of stage `stage` of `stages` over `micro_batches` (Megatron's
/// non-interleaved schedule): `stages - stage - 1` warm-up forwards (at most every
/// micro-batch), one forward and one backward in turn, then the backwards left.
pub fn one_f_one_b(stages: usize, stage: usize, micro_batches: usize) -> Vec<Pass> {
    let warmup = runner_graph::pipeline::warmup_forwards(stages, stage, micro_batches);
    let mut order: Vec<Pass> = (0..warmup).map(Pass::Forward).collect();
    for i in 0..micro_batches - warmup {
        order.push(Pass::Forward(warmup + i));
        order.push(Pass::Backward(i));
    }
    order.extend((micro_batches - warmup..micro_batches).map(Pass::Backward));
    order
}

/// The most micro-batches `order` holds between their forward and their backward at
/// once.
pub fn in_flight(order: &[Pass]) -> usize {
    let (mut now, mut most) = (0usize, 0usize);
    for p in order {
        match p {
            Pass::Forward(_) => {
                now += 1;
                most = most.max(now);
            }
            Pass::Backward(_) => now = now.saturating_sub(1),
        }
    }
    most
}

/// A micro-batch between its forward and its backward, set aside while others run:
/// its inputs, activations and activation gradients (by tensor), the statistics its ops
/// saved, its GEMM plans and its expert-parallel routing.
pub(super) struct Parked<D: Device> {
    vals: Vec<(TensorId, D::Buffer)>,
    grads: Vec<(TensorId, D::Buffer)>,
    aux: Vec<(usize, Vec<D::Buffer>)>,
    plans: Plans<D::Plan>,
    ep: super::ep::EpState,
}

impl<D: Device> Executor<D> {
    /// This rank's (stage, stages) when its graph is one pipeline stage that receives
    /// only at its start and sends only at its end (no virtual chunks), so 1F1B applies.
    pub(super) fn pipeline_stage(&self) -> Option<(usize, usize)> {
        let c = self.collectives.get("pp").filter(|c| c.size() > 1)?;
        let ops = &self.graph.ops;
        let count = |k: OpKind| ops.iter().filter(|o| o.kind == k && o.text("group") == Some("pp")).count();
        (count(OpKind::Send) <= 1 && count(OpKind::Recv) <= 1).then(|| (c.rank(), c.size()))
    }

    /// The order of this step's passes over `micro_batches`.
    pub(super) fn pass_order(&self, micro_batches: usize) -> Vec<Pass> {
        match (self.options.pipeline_schedule, self.pipeline_stage()) {
            (PipelineSchedule::OneFOneB, Some((stage, stages))) => one_f_one_b(stages, stage, micro_batches),
            _ => in_order(micro_batches),
        }
    }

    /// Run `order`'s passes over `batches`, parking each micro-batch whose forward is done
    /// while another one runs; returns the sum of the forwards' losses.
    pub(super) fn run_passes(&mut self, order: &[Pass], batches: &[Vec<(&str, Input<'_>)>]) -> Result<f64, ExecError> {
        let mut parked: Vec<Option<Parked<D>>> = (0..batches.len()).map(|_| None).collect();
        // The micro-batch whose activations are in the tensor store.
        let mut active: Option<usize> = None;
        let mut total = 0f64;
        self.comm.defer_sends = order != in_order(batches.len()).as_slice();
        let r = (|| {
            for (k, pass) in order.iter().enumerate() {
                match *pass {
                    Pass::Forward(i) => {
                        if let Some(a) = active.take() {
                            parked[a] = Some(self.park());
                        }
                        self.mid_step = k > 0;
                        total += f64::from(self.forward(&batches[i])?);
                        active = Some(i);
                    }
                    Pass::Backward(i) => {
                        if active != Some(i) {
                            if let Some(a) = active.take() {
                                parked[a] = Some(self.park());
                            }
                            let p = parked[i].take().ok_or_else(|| {
                                ExecError::State(format!("schedule: backward of micro-batch {i} before its forward"))
                            })?;
                            self.resume(p);
                        }
                        self.backward_pass(i > 0)?;
                        active = None;
                    }
                }
            }
            self.flush_deferred_send()
        })();
        self.comm.defer_sends = false;
        self.mid_step = false;
        self.in_flight = in_flight(order).max(1) as u64;
        r.map(|()| total)
    }

    /// Move the active micro-batch's state out of the tensor store (after its forward).
    fn park(&mut self) -> Parked<D> {
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

    /// Put a parked micro-batch back, ready for its backward; the store holds no other.
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

    fn check(stages: usize, m: usize) {
        for s in 0..stages {
            let o = one_f_one_b(stages, s, m);
            // Every micro-batch once each way, its forward first, the backwards in order.
            let f: Vec<usize> = o.iter().filter_map(|p| if let Pass::Forward(i) = p { Some(*i) } else { None }).collect();
            let b: Vec<usize> = o.iter().filter_map(|p| if let Pass::Backward(i) = p { Some(*i) } else { None }).collect();
            assert_eq!(f, (0..m).collect::<Vec<_>>(), "stage {s} of {stages}, {m} micro-batches: {o:?}");
            assert_eq!(b, (0..m).collect::<Vec<_>>(), "stage {s} of {stages}, {m} micro-batches: {o:?}");
            for i in 0..m {
                let at = |p: Pass| o.iter().position(|q| *q == p).unwrap();
                assert!(at(Pass::Forward(i)) < at(Pass::Backward(i)), "{o:?}");
            }
            assert_eq!(in_flight(&o), (stages - s).min(m), "stage {s} of {stages}, {m}: {o:?}");
        }
    }

    #[test]
    fn each_stage_warms_up_then_alternates_and_holds_at_most_its_distance_to_the_end() {
        for stages in 1..=5 {
            for m in 1..=9 {
                check(stages, m);
            }
        }
        use Pass::{Backward as B, Forward as F};
        // Megatron's picture for 4 stages and 6 micro-batches, stages 0 and 3.
        assert_eq!(
            one_f_one_b(4, 0, 6),
            vec![F(0), F(1), F(2), F(3), B(0), F(4), B(1), F(5), B(2), B(3), B(4), B(5)]
        );
        assert_eq!(one_f_one_b(4, 3, 6), in_order(6));
        assert_eq!(in_flight(&in_order(6)), 1);
    }
}
