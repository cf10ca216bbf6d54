//! The data-parallel gradient reduction overlapped with the backward (Megatron's
//! `overlap_grad_reduce`, PyTorch DDP's gradient buckets).
//!
//! The weights of each `dp` and `edp` all-reduce of the step ([`StepCollective`]) are cut
//! into buckets of at least [`ExecOptions::grad_bucket_elems`] elements (Megatron's
//! max(40M, 1M·ranks) by default: [`ddp_bucket_elems`]), in the order the
//! backward finishes their gradients (the last backward step that writes each). While a
//! step runs ([`Executor::step`], [`Executor::step_micro_batches`]) the executor counts
//! the passes of each backward step; once every step writing a bucket's weights has run
//! for every micro-batch (in a pipeline's chunk passes too), the bucket's gradients are
//! final: they are copied into one buffer and its all-reduce is started
//! ([`crate::Collective::start`]), to run while the backward goes on.
//! [`Executor::reduce_gradients`] starts what is left, finishes them all, divides by
//! `mean_over` and copies the results back.
//!
//! The result is the same bits as the reduction after the backward: each element is
//! summed in rank order either way, and the division by the micro-batch count happens on
//! the bucket's copy, the same multiply the whole-step path does on the gradient itself.
//!
//! Only `dp` and `edp` overlap: their ranks run the same rank graph, so every rank forms
//! the same buckets and starts them in the same order, and no op of the graph calls
//! those groups (a call on a group between a start and its finish could not be matched).
//! Not with FSDP on the group (its units' reduce-scatters start in the backward instead,
//! the same way: `fsdp.rs`), and not in a recorded CUDA-graph step. The `pp-embed` and `tp` reductions run after the backward
//! as before, as in Megatron's `finalize_model_grads`.

use runner_graph::OpKind;
use runner_graph::TensorId;
use runner_graph::shard::{StepCollective, ddp_bucket_elems};
use serde::Serialize;

use super::Executor;
use crate::collective::{InFlight, ReduceOp, Started};
use crate::device::{Device, ExecError};

/// One overlapped bucket of the last step, for the profile: an all-reduce's bucket, or
/// an FSDP unit's reduce-scatter (its padded flat buffer).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GradBucket {
    /// The group it was all-reduced over (`dp`, `edp`).
    pub group: String,
    /// Gradient elements in it.
    pub elems: usize,
    /// Backward steps the rank still had to run when its all-reduce started (0: after
    /// the backward).
    pub steps_left: usize,
}

/// A rank's buckets and their state in the step under way.
pub(super) struct Buckets<B> {
    list: Vec<Bucket>,
    /// Passes each backward step has run in this step.
    runs: Vec<u32>,
    /// The step's micro-batches, while a step tracks its backward steps (to overlap its
    /// buckets, or for FSDP's reduce-scatters).
    armed: Option<u32>,
    /// Whether the step overlaps its buckets.
    overlapping: bool,
    /// The next bucket to start (they start in order).
    next: usize,
    in_flight: Vec<(usize, InFlight<B>)>,
    report: Vec<GradBucket>,
    /// Whether the last reduction's buckets ran overlapped (what the memory account
    /// walks: [`Executor::bucket_flats`]).
    overlapped: bool,
}

impl<B> Default for Buckets<B> {
    fn default() -> Self {
        Buckets { list: Vec::new(), runs: Vec::new(), armed: None, overlapping: false, next: 0, in_flight: Vec::new(), report: Vec::new(), overlapped: false }
    }
}

struct Bucket {
    /// Index of its step collective.
    sc: usize,
    weights: Vec<TensorId>,
    elems: usize,
    /// The backward steps that write its weights' gradients.
    writers: Vec<usize>,
}

impl<D: Device> Executor<D> {
    /// Cut the overlappable step collectives' weights into buckets (after
    /// [`Executor::set_step_collectives`]).
    pub(super) fn plan_buckets(&mut self) {
        let fsdp: Vec<&str> = self
            .comm
            .step
            .iter()
            .filter(|sc| sc.kind != OpKind::AllReduce)
            .map(|sc| sc.group.as_str())
            .collect();
        let used = |g: &str| self.graph.ops.iter().any(|op| op.text("group") == Some(g));
        let overlaps = |sc: &StepCollective| {
            sc.kind == OpKind::AllReduce
                && matches!(sc.group.as_str(), "dp" | "edp")
                && sc.group_size > 1
                && self.collectives.contains_key(&sc.group)
                && !fsdp.contains(&sc.group.as_str())
                && !used(&sc.group)
        };
        let writers = self.grad_writers();
        let mut list = Vec::new();
        for (i, sc) in self.comm.step.iter().enumerate().filter(|(_, sc)| overlaps(sc)) {
            let cap = self
                .options
                .grad_bucket_elems
                .unwrap_or_else(|| usize::try_from(ddp_bucket_elems(sc.group_size)).unwrap_or(usize::MAX))
                .max(1);
            // By the backward step that finishes each gradient; weights no step writes
            // (frozen this step) last.
            let mut ids: Vec<TensorId> = sc.weights.iter().filter_map(|w| self.graph.tensor_id(w)).collect();
            ids.sort_by_key(|&id| writers[id].iter().max().copied().unwrap_or(usize::MAX));
            let mut b = Bucket { sc: i, weights: Vec::new(), elems: 0, writers: Vec::new() };
            for id in ids {
                b.elems += self.graph.tensors[id].numel() as usize;
                b.weights.push(id);
                b.writers.extend(&writers[id]);
                if b.elems >= cap {
                    list.push(std::mem::replace(&mut b, Bucket { sc: i, weights: Vec::new(), elems: 0, writers: Vec::new() }));
                }
            }
            if !b.weights.is_empty() {
                list.push(b);
            }
        }
        // Across collectives too, in the order they become ready.
        list.sort_by_key(|b| b.writers.iter().max().copied().unwrap_or(usize::MAX));
        for b in &mut list {
            b.writers.sort_unstable();
            b.writers.dedup();
        }
        self.buckets = Buckets { list, runs: vec![0; self.plan.steps.len()], ..Buckets::default() };
    }

    /// Per tensor, the backward steps that write its gradient (in step order): when a
    /// bucket, or an FSDP unit, has its gradients final.
    pub(super) fn grad_writers(&self) -> Vec<Vec<usize>> {
        let mut writers: Vec<Vec<usize>> = vec![Vec::new(); self.graph.tensors.len()];
        for (si, step) in self.plan.steps.iter().enumerate() {
            for go in &step.grads_out {
                writers[go.tensor].push(si);
            }
        }
        writers
    }

    /// Overlap the coming step's reduction with its backward passes over
    /// `micro_batches` micro-batches (when there are buckets and the options allow).
    pub(super) fn arm_buckets(&mut self, micro_batches: usize) {
        self.fsdp_arm(micro_batches.max(1) as u32);
        let fsdp = self.fsdp_tracks_backward();
        let b = &mut self.buckets;
        b.overlapping = self.options.overlap_grad_reduce && !b.list.is_empty();
        b.armed = (b.overlapping || fsdp).then_some(micro_batches.max(1) as u32);
        b.runs.iter_mut().for_each(|r| *r = 0);
        b.next = 0;
        b.in_flight.clear();
        b.report.clear();
    }

    /// Backward step `si` ran: start every bucket it made ready, and every FSDP
    /// reduce-scatter (`fsdp.rs`).
    pub(super) fn bucket_step_done(&mut self, si: usize) -> Result<(), ExecError> {
        let Some(m) = self.buckets.armed else { return Ok(()) };
        self.buckets.runs[si] += 1;
        while let Some(b) = self.buckets.list.get(self.buckets.next).filter(|_| self.buckets.overlapping) {
            if b.writers.iter().any(|&w| self.buckets.runs[w] < m) {
                break;
            }
            self.start_bucket(self.buckets.next, m)?;
            self.buckets.next += 1;
        }
        let runs = std::mem::take(&mut self.buckets.runs);
        let started = self.fsdp_scatter_ready(si, &runs, m);
        self.buckets.runs = runs;
        for (group, elems) in started? {
            self.note_started(group, elems, m);
        }
        Ok(())
    }

    /// Report a reduction started during the backward of a step over `m` micro-batches.
    fn note_started(&mut self, group: String, elems: usize, m: u32) {
        let total = m as usize * self.plan.steps.len();
        let run: usize = self.buckets.runs.iter().map(|&r| r as usize).sum();
        self.buckets.report.push(GradBucket { group, elems, steps_left: total.saturating_sub(run) });
    }

    fn start_bucket(&mut self, k: usize, m: u32) -> Result<(), ExecError> {
        let b = &self.buckets.list[k];
        let sc = &self.comm.step[b.sc];
        let mut flat = self.flat_grads(&b.weights, b.elems)?;
        if m > 1 {
            // Exactly the scaling `step_micro_batches` gives each gradient.
            self.device.scale(&mut flat, 1.0 / m as f32)?;
        }
        let c = self
            .timed(&sc.group)
            .ok_or_else(|| ExecError::State(format!("no handle for group '{}'", sc.group)))?;
        let started = c.start(Started::AllReduce(ReduceOp::Sum), flat)?;
        let (group, elems) = (sc.group.clone(), b.elems);
        self.buckets.in_flight.push((k, started));
        self.note_started(group, elems, m);
        Ok(())
    }

    /// Start the buckets not started yet, finish them all and put the reduced gradients
    /// back; returns the step collectives they covered (none when the step did not
    /// overlap).
    pub(super) fn finish_buckets(&mut self) -> Result<Vec<usize>, ExecError> {
        let m = self.buckets.armed.take();
        self.buckets.overlapped = m.is_some() && self.buckets.overlapping;
        let Some(m) = m.filter(|_| self.buckets.overlapping) else {
            // FSDP's reduce-scatters started in the backward, if any.
            self.profile.grad_buckets = std::mem::take(&mut self.buckets.report);
            return Ok(Vec::new());
        };
        while self.buckets.next < self.buckets.list.len() {
            self.start_bucket(self.buckets.next, m)?;
            self.buckets.next += 1;
        }
        for (k, started) in std::mem::take(&mut self.buckets.in_flight) {
            let b = &self.buckets.list[k];
            let sc = &self.comm.step[b.sc];
            let c = self
                .timed(&sc.group)
                .ok_or_else(|| ExecError::State(format!("no handle for group '{}'", sc.group)))?;
            let mut flat = c.finish(started)?;
            if sc.mean_over > 1 {
                self.device.scale(&mut flat, 1.0 / sc.mean_over as f32)?;
            }
            let weights = b.weights.clone();
            self.unflat_grads(&weights, &flat)?;
        }
        self.profile.grad_buckets = std::mem::take(&mut self.buckets.report);
        let mut covered: Vec<usize> = self.buckets.list.iter().map(|b| b.sc).collect();
        covered.sort_unstable();
        covered.dedup();
        Ok(covered)
    }

    /// The flat buffers of the last step's reduction, for the memory account: each
    /// overlapped bucket that started in the backward, by the backward step whose last
    /// run (the last micro-batch's) started it, with its bytes (it stays until the
    /// reduction finishes it); and the most the reduction itself holds at once: every
    /// bucket in flight, or one all-reduce's flat copy of its gradients (they run one
    /// after the other).
    pub(super) fn bucket_flats(&self) -> (Vec<(usize, u64)>, u64) {
        let b = &self.buckets;
        let bytes = |elems: usize| elems as u64 * 4;
        let overlapped: Vec<&Bucket> = if b.overlapped { b.list.iter().collect() } else { Vec::new() };
        let started = overlapped.iter().filter_map(|k| Some((*k.writers.iter().max()?, bytes(k.elems)))).collect();
        let covered: Vec<usize> = overlapped.iter().map(|k| k.sc).collect();
        let one = self
            .comm
            .step
            .iter()
            .enumerate()
            .filter(|(i, sc)| sc.kind == OpKind::AllReduce && !covered.contains(i))
            .map(|(_, sc)| bytes(sc.weights.iter().filter_map(|w| self.graph.tensor_id(w)).map(|id| self.graph.tensors[id].numel() as usize).sum()))
            .max()
            .unwrap_or(0);
        (started, one.max(overlapped.iter().map(|k| bytes(k.elems)).sum()))
    }
}

#[cfg(test)]
mod tests {
    use runner_graph::TensorKind;
    use runner_graph::shard::{Layout, RankCoord, shard};

    use crate::collective::{Collective, ThreadGroup};
    use crate::cpu::Cpu;
    use crate::executor::{ADAMW_DEFAULT, ExecOptions, Executor, Input};
    use crate::toy::{self, ToyConfig};

    /// What one rank of a dp = 2 step reports about its buckets.
    struct Seen {
        /// Each bucket in the order it starts: its group, weights, the backward step
        /// that finishes it (the last that writes one of its weights) and the layers of
        /// the ops reading its weights.
        order: Vec<(String, Vec<String>, usize, Vec<i32>)>,
        reported: Vec<super::GradBucket>,
        flats: (Vec<(usize, u64)>, u64),
        /// Elements of the dp and the edp all-reduce's weights.
        totals: (usize, usize),
        last_writer: std::collections::HashMap<String, usize>,
        /// Backward steps of the rank graph.
        steps: usize,
    }

    /// One training step of the two-layer MoE toy at dp = 2 (dense weights over `dp`,
    /// experts over `edp`), buckets of `cap` elements, overlapped or not.
    fn dp2_step(overlap: bool, cap: usize) -> Vec<Seen> {
        let cfg = ToyConfig { layers: 2, hidden: 16, ffn: 32, moe: Some((4, 2, 16)), ..ToyConfig::tiny() };
        let g = toy::llama(&cfg);
        let b = g.tensors[g.tensor_id("tokens").unwrap()].shape[0] as u32;
        let layout = Layout { dp: 2, ..Layout::single(b, 2 * b) };
        let (dp, edp) = (ThreadGroup::new(2), ThreadGroup::new(2));
        std::thread::scope(|sc| {
            let hs: Vec<_> = dp
                .into_iter()
                .zip(edp)
                .enumerate()
                .map(|(r, (hd, he))| {
                    let (g, layout) = (&g, &layout);
                    sc.spawn(move || {
                        let s = shard(g, layout, RankCoord { tp: 0, pp: 0, cp: 0, dp: r as u32 }).unwrap();
                        let groups: Vec<(String, Box<dyn Collective<Cpu>>)> = vec![("dp".into(), Box::new(hd)), ("edp".into(), Box::new(he))];
                        let o = ExecOptions { overlap_grad_reduce: overlap, grad_bucket_elems: Some(cap), seed: 5, ..ExecOptions::default() };
                        let mut ex = Executor::for_rank(&s, Cpu::new(), o, groups).unwrap();
                        let gr = &ex.graph;
                        let order = ex
                            .buckets
                            .list
                            .iter()
                            .map(|k| {
                                let names = k.weights.iter().map(|&id| gr.tensors[id].name.clone()).collect();
                                let layers = gr.ops.iter().filter(|o| o.inputs.iter().any(|i| k.weights.contains(i))).map(|o| o.layer).collect();
                                (ex.comm.step[k.sc].group.clone(), names, *k.writers.iter().max().unwrap(), layers)
                            })
                            .collect();
                        let writers = ex.grad_writers();
                        let last_writer = gr.tensors.iter().enumerate().filter(|(_, t)| t.kind == TensorKind::Weight).map(|(id, t)| (t.name.clone(), *writers[id].iter().max().unwrap())).collect();
                        let elems = |group: &str| -> usize {
                            let sc = ex.comm.step.iter().find(|sc| sc.group == group).unwrap();
                            sc.weights.iter().map(|w| gr.tensors[gr.tensor_id(w).unwrap()].numel() as usize).sum()
                        };
                        let totals = (elems("dp"), elems("edp"));
                        let data = toy::batch_inputs(&s.graph, r as u32);
                        let inputs: Vec<(&str, Input<'_>)> = data.iter().map(|(n, v)| (n.as_str(), Input::U32(v))).collect();
                        ex.step(&inputs, &ADAMW_DEFAULT).unwrap();
                        let steps = ex.plan.steps.len();
                        Seen { order, reported: ex.profile().grad_buckets.clone(), flats: ex.bucket_flats(), totals, last_writer, steps }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// The buckets are all-reduced in the order the backward finishes them, as DDP's
    /// are: reverse layer order (the head and the last layer first, the embedding last),
    /// across the dense (`dp`) and expert (`edp`) reductions alike (layer 1's experts
    /// before layer 0's dense weights); each bucket the moment its last writer ran. The
    /// memory account's figure (`bucket_flats`): each overlapped bucket at the backward
    /// step that finishes it with its bytes, and at most every bucket in flight at once;
    /// without overlap no bucket and the larger of the two reductions' flat copies.
    #[test]
    fn buckets_reduce_in_reverse_layer_order_and_the_memory_account_holds_them() {
        for seen in dp2_step(true, 1) {
            let n = seen.order.len();
            assert_eq!(n, seen.last_writer.len(), "one bucket per weight at a cap of one element");
            assert_eq!(seen.reported.len(), n);
            for (k, (b, r)) in seen.order.iter().zip(&seen.reported).enumerate() {
                assert_eq!(b.1.len(), 1);
                assert_eq!(b.2, seen.last_writer[&b.1[0]], "bucket {k} {:?}", b.1);
                assert_eq!((&r.group, 4 * r.elems as u64), (&b.0, seen.flats.0[k].1), "bucket {k} {:?}", b.1);
                // One micro-batch, steps run 0, 1, ...: started right after step b.2.
                assert_eq!(r.steps_left, seen.steps - b.2 - 1, "bucket {k} {:?}: steps left when it started", b.1);
            }
            let finish: Vec<usize> = seen.order.iter().map(|b| b.2).collect();
            assert!(finish.windows(2).all(|w| w[0] <= w[1]), "buckets not in the order the backward finishes them: {finish:?}");
            let top = |b: &(String, Vec<String>, usize, Vec<i32>)| b.3.iter().copied().max().unwrap_or(-1);
            // The head and the final norm (layer -1) first, the embedding (-1) last,
            // the layers' weights in between from the last layer down.
            let layers: Vec<i32> = seen.order.iter().map(top).collect();
            let name = |k: usize| seen.order[k].1[0].as_str();
            assert!(name(0).starts_with("lm_head") || name(0).starts_with("final_norm"), "first {}", name(0));
            assert_eq!(name(n - 1), "embed.weight");
            let inner = &layers[2..n - 1];
            assert!(layers[..2] == [-1, -1] && inner.iter().all(|&l| l >= 0), "{layers:?}");
            assert!(inner.windows(2).all(|w| w[0] >= w[1]), "not in reverse layer order: {layers:?}");
            let first_edp = seen.order.iter().position(|b| b.0 == "edp").unwrap();
            let last_dp_of_1 = seen.order.iter().rposition(|b| b.0 == "dp" && top(b) == 1).unwrap();
            assert!(first_edp < last_dp_of_1, "the experts of layer 1 wait for the dense weights: {:?}", seen.order);
            let steps_left: Vec<usize> = seen.reported.iter().map(|r| r.steps_left).collect();
            assert!(steps_left.windows(2).all(|w| w[0] >= w[1]) && steps_left[0] > 0, "{steps_left:?}");
            assert_eq!(seen.flats.0.iter().map(|f| f.0).collect::<Vec<_>>(), finish);
            assert_eq!(seen.flats.1, 4 * (seen.totals.0 + seen.totals.1) as u64, "every bucket in flight at once");
        }
        for seen in dp2_step(false, 1) {
            assert!(seen.reported.is_empty() && seen.flats.0.is_empty());
            assert_eq!(seen.flats.1, 4 * seen.totals.0.max(seen.totals.1) as u64, "the larger reduction's flat copy");
        }
        // Buckets of several weights (a cap of 300 elements): each holds weights the
        // backward finishes one after the other (none of a later bucket's weights of the
        // group before one of an earlier bucket's), and starts, in the memory account
        // too, at the backward step that finishes its last weight.
        for seen in dp2_step(true, 300) {
            assert!(seen.order.len() < seen.last_writer.len() && seen.order.iter().any(|b| b.1.len() > 2), "{:?}", seen.order);
            let span = |b: &(String, Vec<String>, usize, Vec<i32>)| {
                let w: Vec<usize> = b.1.iter().map(|n| seen.last_writer[n]).collect();
                (*w.iter().min().unwrap(), *w.iter().max().unwrap())
            };
            for (k, b) in seen.order.iter().enumerate() {
                assert_eq!((b.2, seen.flats.0[k].0), (span(b).1, span(b).1), "bucket {k} {:?}", b.1);
                assert_eq!(seen.reported[k].steps_left, seen.steps - b.2 - 1, "bucket {k} {:?}: steps left when it started", b.1);
            }
            for group in ["dp", "edp"] {
                let spans: Vec<(usize, usize)> = seen.order.iter().filter(|b| b.0 == group).map(span).collect();
                assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "{group}: buckets mix weights finished apart: {spans:?}");
            }
        }
    }

    /// A reduction run by hand (forward, backward, `reduce_gradients`: no step armed the
    /// buckets) after an overlapped step runs after the backward: the memory account
    /// (`bucket_flats`) holds no bucket started in the backward, only the reduction's
    /// flat copy, and the profile reports no bucket. Fails if the last step's overlap is
    /// taken for this reduction's (`overlapped` set from `overlapping` alone).
    #[test]
    fn a_reduction_by_hand_after_an_overlapped_step_holds_no_overlapped_bucket() {
        let g = toy::llama(&ToyConfig::tiny());
        let b = g.tensors[g.tensor_id("tokens").unwrap()].shape[0] as u32;
        let layout = Layout { dp: 2, ..Layout::single(b, 2 * b) };
        let out: Vec<_> = std::thread::scope(|sc| {
            let hs: Vec<_> = ThreadGroup::new(2)
                .into_iter()
                .enumerate()
                .map(|(r, h)| {
                    let (g, layout) = (&g, &layout);
                    sc.spawn(move || {
                        let s = shard(g, layout, RankCoord { dp: r as u32, ..RankCoord::default() }).unwrap();
                        let groups: Vec<(String, Box<dyn Collective<Cpu>>)> = vec![("dp".into(), Box::new(h))];
                        let o = ExecOptions { overlap_grad_reduce: true, grad_bucket_elems: Some(1), ..ExecOptions::default() };
                        let mut ex = Executor::for_rank(&s, Cpu::new(), o, groups).unwrap();
                        let data = toy::batch_inputs(&s.graph, r as u32);
                        let inputs: Vec<(&str, Input<'_>)> = data.iter().map(|(n, v)| (n.as_str(), Input::U32(v))).collect();
                        ex.step(&inputs, &ADAMW_DEFAULT).unwrap();
                        let stepped = (ex.bucket_flats().0.len(), ex.profile().grad_buckets.len());
                        ex.forward(&inputs).unwrap();
                        ex.backward().unwrap();
                        ex.reduce_gradients().unwrap();
                        (stepped, ex.bucket_flats(), ex.profile().grad_buckets.len())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, (stepped, flats, reported)) in out.iter().enumerate() {
            assert!(stepped.0 > 0 && stepped.0 == stepped.1, "rank {r}: the step overlapped its buckets: {stepped:?}");
            assert!(flats.0.is_empty() && flats.1 > 0, "rank {r}: the reduction by hand started no bucket in the backward: {flats:?}");
            assert_eq!(*reported, 0, "rank {r}");
        }
    }
}
