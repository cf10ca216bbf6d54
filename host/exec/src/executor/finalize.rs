//! The step-level gradient collectives of a sharded rank (Megatron-LM's
//! `finalize_model_grads`): after the backward and before the optimizer, the gradients
//! of the weights each [`StepCollective`] lists are all-reduced over its group.
//!
//! - `dp` / `edp` (data parallel, expert data parallel): summed, then divided by the
//!   collective's `mean_over`, so every rank holds the mean over the data-parallel ranks
//!   (each rank's loss is a mean over its own tokens; with equal token counts the mean of
//!   the means is the full batch's mean). For `dp` that is the group size. An expert's
//!   gradient already sums the tokens of its whole `ep` group (the all-to-all's backward
//!   brings them), so `edp` divides by the dp·cp ranks whose losses it covers (Megatron's
//!   expert gradient scaling), more than its group size; a group of one rank moves
//!   nothing and only divides.
//! - `pp-embed` (a tied embedding on the first and the last stage): summed.
//! - `tp` (sequence parallelism: replicated weights read on a sequence shard): summed.
//!
//! Each collective moves all its weights' gradients in one call, in the order the step
//! lists them (sorted names, the same on every rank).
//!
//! FSDP (`fsdp: true` in the layout: a `ReduceScatter` of the gradients and an
//! `AllGather` of the parameters over `dp` or `edp` instead of the all-reduce) runs in
//! `fsdp.rs`: the rank keeps 1/n of those weights, their gradients and moments, the
//! passes gather the parameters, the backward starts each unit's reduce-scatter once its
//! gradients are final, and [`Executor::reduce_gradients`] finishes the one in flight,
//! runs the step's all-reduces (on whole gradients), then the reduce-scatters not
//! started (summed, divided by `mean_over`, this rank's chunk kept).

use runner_graph::{OpKind, TensorId};
use runner_graph::shard::{Sharded, StepCollective};

use super::{ExecOptions, Executor};
use crate::collective::{Collective, ReduceOp};
use crate::device::{Device, Elem, ExecError};

impl<D: Device> Executor<D> {
    /// One rank of a sharded graph: [`Executor::with_collectives`] on `sharded.graph`,
    /// plus its step-level collectives ([`Executor::reduce_gradients`], which
    /// [`Executor::step`] runs). `groups` must hold a handle for every group the graph's
    /// ops and the step collectives name (`tp`, `pp`, `dp`, `pp-embed`, `ep`, `edp`, ...),
    /// but none for a step collective over one rank (which only divides). Each weight the
    /// rank holds a part of starts as that part of the unsharded weight
    /// (`sharded.splits`, placed by the rank's handles on `tp`, `ep` and `etp`). A layout with
    /// `fsdp: true` shards the weights its FSDP collectives cover over their group as
    /// the executor is made (see [`Executor::set_step_collectives`]).
    ///
    /// # Errors
    /// As [`Executor::with_collectives`] and [`Executor::set_step_collectives`].
    pub fn for_rank(
        sharded: &Sharded,
        device: D,
        options: ExecOptions,
        groups: Vec<(String, Box<dyn Collective<D>>)>,
    ) -> Result<Executor<D>, ExecError> {
        let mut ex = Self::build(&sharded.graph, device, options, groups, &sharded.splits)?;
        ex.set_step_collectives(sharded.step.clone())?;
        Ok(ex)
    }

    /// Set the step-level collectives [`Executor::reduce_gradients`] runs.
    ///
    /// All-reduces run as listed. A `ReduceScatter` with the `AllGather` of the same
    /// group and weights (FSDP) shards those weights now: this rank keeps its 1/n of the
    /// flattened parameters (and AdamW moments) and frees the rest; from then on each
    /// forward and backward gathers them and the reduction reduce-scatters their
    /// gradients (`executor/fsdp.rs`). Every rank of the group must hold the same whole
    /// weights when this runs (they do from the same seed, or after the same
    /// [`Executor::set_weight`] calls; [`Executor::set_weight`] also works afterwards).
    ///
    /// # Errors
    /// A collective of another kind, an FSDP reduce-scatter or all-gather without its
    /// partner, a weight in two FSDP groups, a rank already sharded by FSDP (they are set
    /// once), a group without a handle of its size, or a weight this graph does not
    /// have.
    pub fn set_step_collectives(&mut self, step: Vec<StepCollective>) -> Result<(), ExecError> {
        if let Err(why) = self.check_fsdp(&step) {
            return Err(ExecError::Unsupported {
                op: "FSDP step collectives".into(),
                kind: format!("{:?}", OpKind::ReduceScatter),
                device: "the in-process collective backend".into(),
                why,
            });
        }
        for sc in &step {
            let fail = |why: String| {
                Err(ExecError::Unsupported {
                    op: format!("step collective '{}'", sc.what),
                    kind: format!("{:?}", sc.kind),
                    device: "the in-process collective backend".into(),
                    why,
                })
            };
            if !matches!(
                sc.kind,
                OpKind::AllReduce | OpKind::ReduceScatter | OpKind::AllGather
            ) {
                return fail(
                    "a step collective is an all-reduce, or an FSDP reduce-scatter and \
                     all-gather pair"
                        .into(),
                );
            }
            match self.collectives.get(&sc.group) {
                // A group of one rank only scales.
                None if sc.group_size <= 1 => {}
                None => {
                    return fail(format!(
                        "no handle for group '{}' of {} ranks; pass one to Executor::for_rank",
                        sc.group, sc.group_size
                    ));
                }
                Some(c) if c.size() != sc.group_size as usize => {
                    return fail(format!(
                        "group '{}' has {} ranks, the step collective says {}",
                        sc.group,
                        c.size(),
                        sc.group_size
                    ));
                }
                Some(_) => {}
            }
            for w in &sc.weights {
                match self.graph.tensor_id(w) {
                    Some(id) if self.graph.tensors[id].kind.is_param() => {
                    }
                    _ => return fail(format!("'{w}' is not a weight of this rank's graph")),
                }
            }
        }
        self.shard_fsdp(&step)?;
        self.comm.step = step;
        self.plan_buckets();
        Ok(())
    }

    /// The step-level collectives [`Executor::reduce_gradients`] runs.
    pub fn step_collectives(&self) -> &[StepCollective] {
        &self.comm.step
    }

    /// Run the step-level gradient collectives on the gradients of the last backward
    /// (nothing when there are none). [`Executor::step`] calls it between the backward
    /// and the optimizer; call it yourself when you call those separately.
    ///
    /// # Errors
    /// No backward before it, or already run for this backward; a collective failed.
    pub fn reduce_gradients(&mut self) -> Result<(), ExecError> {
        if !self.backward_done {
            return Err(ExecError::State(
                "reduce_gradients needs a backward first".into(),
            ));
        }
        if self.comm.reduced {
            return Err(ExecError::State(
                "the gradients of this backward are already reduced".into(),
            ));
        }
        let step = self.comm.step.clone();
        let r = self.run_step_collectives(&step);
        self.note_comm()?;
        r?;
        self.comm.reduced = true;
        Ok(())
    }

    fn run_step_collectives(&mut self, step: &[StepCollective]) -> Result<(), ExecError> {
        // The overlapped buckets first (`overlap.rs`): their all-reduces are under way.
        let overlapped = self.finish_buckets()?;
        self.fsdp_finish_scatters()?;
        // The all-reduces sum whole gradients, so they run before FSDP keeps a chunk of
        // them (sums and the mean commute: the order changes only rounding).
        for (_, sc) in step.iter().enumerate().filter(|(i, sc)| sc.kind == OpKind::AllReduce && !overlapped.contains(i)) {
            let ids = sc
                .weights
                .iter()
                .map(|w| self.id(w))
                .collect::<Result<Vec<_>, _>>()?;
            let total: usize = ids.iter().map(|&id| self.graph.tensors[id].numel() as usize).sum();
            let mut flat = self.flat_grads(&ids, total)?;
            let dev = &self.device;
            if sc.group_size > 1 {
                let c = self.timed(&sc.group).ok_or_else(|| {
                    ExecError::State(format!("no handle for group '{}'", sc.group))
                })?;
                c.all_reduce(&mut flat, ReduceOp::Sum)?;
            }
            if sc.mean_over > 1 {
                dev.scale(&mut flat, 1.0 / sc.mean_over as f32)?;
            }
            self.unflat_grads(&ids, &flat)?;
        }
        self.fsdp_reduce_scatter()
    }

    /// The gradients of weights `ids`, end to end, in a new f32 buffer of `len` elements
    /// (at least theirs; the rest zero): what a step-level collective moves. A weight
    /// without a gradient this step contributes zeros, so every rank passes the same
    /// length.
    pub(super) fn flat_grads(&self, ids: &[TensorId], len: usize) -> Result<D::Buffer, ExecError> {
        let dev = &self.device;
        let has = |id: TensorId| (self.grad_written[id] || self.carry[id]) && self.grads[id].is_some();
        let total: usize = ids.iter().map(|&id| self.graph.tensors[id].numel() as usize).sum();
        let mut flat = dev.alloc(Elem::F32, len)?;
        if len > total || ids.iter().any(|&id| !has(id)) {
            dev.zero(&mut flat)?;
        }
        let mut at = 0;
        for &id in ids {
            let n = self.graph.tensors[id].numel() as usize;
            if let (true, Some(g)) = (has(id), &self.grads[id]) {
                dev.copy(&mut flat, at, g, 0, n)?;
            }
            at += n;
        }
        Ok(flat)
    }

    /// Put `flat`, laid out as [`Executor::flat_grads`] lays it, back into the gradients
    /// of `ids`.
    pub(super) fn unflat_grads(&mut self, ids: &[TensorId], flat: &D::Buffer) -> Result<(), ExecError> {
        let mut at = 0;
        for &id in ids {
            let n = self.graph.tensors[id].numel() as usize;
            if let Some(g) = self.grads[id].as_mut() {
                self.device.copy(g, 0, flat, at, n)?;
                self.grad_written[id] = true;
            }
            at += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use runner_graph::{Graph, TensorKind};

    use super::*;
    use crate::collective::ThreadGroup;
    use crate::cpu::Cpu;
    use crate::executor::Input;
    use crate::toy::{self, ToyConfig};

    type Groups = Vec<(String, Box<dyn Collective<Cpu>>)>;

    fn dp(handle: ThreadGroup) -> Groups {
        vec![("dp".to_string(), Box::new(handle) as Box<dyn Collective<Cpu>>)]
    }

    fn all_reduce(group: &str, group_size: u32, mean_over: u32, weights: &[&str]) -> StepCollective {
        StepCollective {
            kind: OpKind::AllReduce,
            group: group.into(),
            group_size,
            bytes: 0.0,
            count: 1,
            mean_over,
            what: format!("{group} gradients"),
            weights: weights.iter().map(|w| w.to_string()).collect(),
        }
    }

    /// The toy Llama with its first query projection frozen (no gradient, as LoRA's
    /// base weights).
    fn with_a_frozen_weight() -> Graph {
        let mut g = toy::llama(&ToyConfig::tiny());
        let id = g.tensor_id("layers.0.attn.q.weight").unwrap();
        g.tensors[id].kind = TensorKind::Frozen;
        g
    }

    /// Step collectives a rank cannot run are refused when set, each naming what is
    /// wrong: a kind other than all-reduce / reduce-scatter / all-gather, a group whose
    /// handle has another size, a group of several ranks without a handle, a name that
    /// is not a weight of the graph; and the reduction needs a backward, once.
    #[test]
    fn step_collectives_a_rank_cannot_run_are_refused_by_name() {
        let g = toy::llama(&ToyConfig::tiny());
        let w = "lm_head.weight";
        let mut ex = Executor::with_collectives(&g, Cpu::new(), ExecOptions::default(), dp(ThreadGroup::new(1).remove(0))).unwrap();
        let refused = |ex: &mut Executor<Cpu>, sc: StepCollective| ex.set_step_collectives(vec![sc]).unwrap_err().to_string();
        let e = refused(&mut ex, StepCollective { kind: OpKind::AllToAll, ..all_reduce("dp", 1, 1, &[w]) });
        assert!(e.contains("a step collective is an all-reduce"), "{e}");
        let e = refused(&mut ex, all_reduce("dp", 2, 2, &[w]));
        assert!(e.contains("group 'dp' has 1 ranks, the step collective says 2"), "{e}");
        let e = refused(&mut ex, all_reduce("edp", 2, 2, &[w]));
        assert!(e.contains("no handle for group 'edp' of 2 ranks"), "{e}");
        for name in ["tokens", "layers.0.attn.q", "no.such.weight"] {
            let e = refused(&mut ex, all_reduce("dp", 1, 1, &[w, name]));
            assert!(e.contains(&format!("'{name}' is not a weight of this rank's graph")), "{e}");
        }
        assert!(ex.step_collectives().is_empty(), "a refused list is not kept");
        ex.set_step_collectives(vec![all_reduce("dp", 1, 1, &[w])]).unwrap();
        let e = ex.reduce_gradients().unwrap_err().to_string();
        assert!(e.contains("needs a backward first"), "{e}");
        let (tokens, targets) = toy::repeating_batch(&g, 1);
        ex.forward(&[("tokens", Input::U32(&tokens)), ("targets", Input::U32(&targets))]).unwrap();
        ex.backward().unwrap();
        ex.reduce_gradients().unwrap();
        let e = ex.reduce_gradients().unwrap_err().to_string();
        assert!(e.contains("already reduced"), "{e}");
    }

    /// Two data-parallel ranks on different batches, their step collective listing a
    /// frozen weight (no gradient: zeros in its place) before trained ones: after the
    /// reduction each rank holds, for every trained weight, the mean of the two ranks'
    /// own gradients (summed, divided by `mean_over` = 2), each in its own place.
    #[test]
    fn data_parallel_ranks_hold_the_mean_of_their_gradients() {
        let g = with_a_frozen_weight();
        let names = ["layers.0.attn.q.weight", "layers.0.attn.k.weight", "lm_head.weight", "layers.1.mlp.down.weight"];
        let batch = |r: u32| toy::repeating_batch(&g, 5 + r);
        let own = |r: u32| -> Vec<Vec<f32>> {
            let mut ex = Executor::new(&g, Cpu::new(), ExecOptions::default()).unwrap();
            let (tokens, targets) = batch(r);
            ex.forward(&[("tokens", Input::U32(&tokens)), ("targets", Input::U32(&targets))]).unwrap();
            ex.backward().unwrap();
            assert_eq!(ex.grad(names[0]).unwrap(), None, "the frozen weight has no gradient");
            names[1..].iter().map(|n| ex.grad(n).unwrap().unwrap()).collect()
        };
        let (a, b) = (own(0), own(1));
        assert_ne!(a, b);
        let step = vec![all_reduce("dp", 2, 2, &names)];
        let got: Vec<Vec<Vec<f32>>> = std::thread::scope(|sc| {
            let runs: Vec<_> = ThreadGroup::new(2)
                .into_iter()
                .zip(0u32..)
                .map(|(h, r)| {
                    let (g, step, batch) = (&g, step.clone(), &batch);
                    sc.spawn(move || {
                        let mut ex = Executor::with_collectives(g, Cpu::new(), ExecOptions::default(), dp(h)).unwrap();
                        ex.set_step_collectives(step).unwrap();
                        let (tokens, targets) = batch(r);
                        ex.forward(&[("tokens", Input::U32(&tokens)), ("targets", Input::U32(&targets))]).unwrap();
                        ex.backward().unwrap();
                        ex.reduce_gradients().unwrap();
                        names[1..].iter().map(|n| ex.grad(n).unwrap().unwrap()).collect::<Vec<_>>()
                    })
                })
                .collect();
            runs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, rank) in got.iter().enumerate() {
            for (i, g) in rank.iter().enumerate() {
                let want: Vec<f32> = a[i].iter().zip(&b[i]).map(|(x, y)| (x + y) / 2.0).collect();
                assert!(crate::devcheck::relative_error(&want, g) < 1e-6, "rank {r}, {}: {:?} vs {:?}", names[i + 1], &g[..4], &want[..4]);
            }
        }
    }

    /// Data-parallel ranks where one rank's backward leaves a weight without a
    /// gradient, with and without FSDP: that rank contributes zeros, still takes the
    /// group's reduced gradient (half of rank 1's) and applies the same AdamW update, so
    /// the replicas stay equal. Today's backward writes every trained weight's gradient
    /// (zeros where no token reached it: see the test below), so the missing gradient
    /// is made by hand (`grad_written` cleared on rank 0 after its backward); this pins
    /// the reduction's rule for a backward that would skip one. Fails if the reduction
    /// writes back only into gradients this rank wrote, or does not mark them written
    /// (rank 0 keeps no gradient and skips the update: the replicas drift), or if a
    /// gradient the backward did not write is sent (rank 0 sends its stale buffer).
    #[test]
    fn a_rank_without_a_gradient_takes_the_groups_reduced_gradient() {
        use runner_graph::shard::{Layout, RankCoord, shard};
        let g = toy::with_roles(toy::llama(&ToyConfig::tiny()), false);
        let w = "layers.1.mlp.down.weight";
        for fsdp in [false, true] {
            let layout = Layout { dp: 2, fsdp, ..Layout::single(2, 4) };
            let out: Vec<_> = std::thread::scope(|sc| {
                let runs: Vec<_> = ThreadGroup::new(2)
                    .into_iter()
                    .zip(0u32..)
                    .map(|(h, r)| {
                        let s = shard(&g, &layout, RankCoord { dp: r, ..RankCoord::default() }).unwrap();
                        let g = &g;
                        sc.spawn(move || {
                            let mut ex = Executor::for_rank(&s, Cpu::new(), ExecOptions::default(), dp(h)).unwrap();
                            assert_eq!(ex.fsdp_sharded(), fsdp);
                            let (tokens, targets) = toy::repeating_batch(g, 5 + r);
                            ex.forward(&[("tokens", Input::U32(&tokens)), ("targets", Input::U32(&targets))]).unwrap();
                            ex.backward().unwrap();
                            let local = ex.grad(w).unwrap().unwrap();
                            if r == 0 {
                                let id = ex.id(w).unwrap();
                                ex.grad_written[id] = false;
                            }
                            ex.reduce_gradients().unwrap();
                            let reduced = ex.gather_grads().unwrap();
                            ex.optimizer_step(&crate::executor::ADAMW_DEFAULT).unwrap();
                            (local, reduced, ex.gather_weights().unwrap())
                        })
                    })
                    .collect();
                runs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let what = if fsdp { "FSDP" } else { "all-reduce" };
            assert!(out[0].0.iter().any(|&x| x != 0.0), "{what}: rank 0 had a gradient to withhold");
            let want: Vec<f32> = out[1].0.iter().map(|x| x / 2.0).collect();
            for (r, (_, reduced, _)) in out.iter().enumerate() {
                let got = reduced.get(w).unwrap_or_else(|| panic!("{what}: rank {r} has no gradient of {w}"));
                assert!(crate::devcheck::relative_error(&want, got) < 1e-6, "{what}, rank {r}: {:?} vs {:?}", &got[..4], &want[..4]);
            }
            assert_eq!(out[0].1.len(), out[1].1.len(), "{what}");
            for (name, v) in &out[0].2 {
                assert!(out[1].2[name] == *v, "{what}: the replicas' {name} differ after the step");
            }
        }
    }

    /// Experts, top-k and expert width of [`moe_toy`].
    const MOE: (u64, u64, u64) = (4, 2, 32);
    /// The expert only [`RARE`] tokens reach in layer 0 (see [`skewed_weights`]).
    const REACHED: usize = 2;
    /// The tokens only row 2 of [`full_batch`] holds (the first row of dp rank 1).
    const RARE: [u32; 2] = [50, 51];
    const SEQ: usize = 8;

    /// The toy MoE Llama at `batch` sequences (embedding and head replicated).
    fn moe_toy(batch: u64) -> Graph {
        toy::with_roles(toy::llama(&ToyConfig { moe: Some(MOE), batch, ..ToyConfig::tiny() }), false)
    }

    /// Four sequences of [`SEQ`] (tokens, targets): tokens under 40 but the [`RARE`]
    /// ones at two places of row 2.
    fn full_batch() -> (Vec<u32>, Vec<u32>) {
        let mut tokens: Vec<u32> = (0..4 * SEQ as u32).map(|i| (3 + 7 * (i / SEQ as u32) + 5 * (i % SEQ as u32)) % 40).collect();
        tokens[2 * SEQ + 2] = RARE[0];
        tokens[2 * SEQ + 5] = RARE[1];
        let targets = tokens.iter().map(|t| (3 * t + 1) % 64).collect();
        (tokens, targets)
    }

    /// Rows `rows` of the full batch.
    fn rows_of(rows: std::ops::Range<usize>) -> (Vec<u32>, Vec<u32>) {
        let (t, y) = full_batch();
        let r = rows.start * SEQ..rows.end * SEQ;
        (t[r.clone()].to_vec(), y[r].to_vec())
    }

    /// The seeded weights with layer 0's attention output zero (its MLP norm reads the
    /// embedded token itself), its router's logits zero but expert [`REACHED`]'s, the
    /// first element of the normed token (so it wins exactly where that is positive),
    /// and that element of the embedding positive for the [`RARE`] tokens only: in layer
    /// 0 only they reach expert [`REACHED`].
    fn skewed_weights() -> HashMap<String, Vec<f32>> {
        let ex = Executor::new(&moe_toy(1), Cpu::new(), ExecOptions::default()).unwrap();
        let mut w: HashMap<String, Vec<f32>> = ex.trainable().into_iter().map(|n| { let v = ex.weight(&n).unwrap(); (n, v) }).collect();
        w.get_mut("layers.0.attn.out.weight").unwrap().fill(0.0);
        let router = w.get_mut("layers.0.moe.router_logits.weight").unwrap();
        let c = router.len() / MOE.0 as usize;
        router.fill(0.0);
        router[REACHED * c] = 1.0;
        let embed = w.get_mut("embed.weight").unwrap();
        for (tok, row) in embed.chunks_mut(c).enumerate() {
            row[0] = if RARE.contains(&(tok as u32)) { 0.5 } else { -0.5 };
        }
        w
    }

    fn load(ex: &mut Executor<Cpu>, w: &HashMap<String, Vec<f32>>) {
        for (n, v) in w {
            ex.set_weight(n, v).unwrap();
        }
    }

    /// Layer 0's expert [`REACHED`] (its three weights) and the embedding rows of the
    /// [`RARE`] tokens, out of whole weights or gradients `w`.
    fn reached_parts(w: &HashMap<String, Vec<f32>>) -> Vec<f32> {
        let mut out = Vec::new();
        for m in ["gate", "up", "down"] {
            let v = &w[&format!("layers.0.moe.experts.{m}.weight")];
            let per = v.len() / MOE.0 as usize;
            out.extend_from_slice(&v[REACHED * per..(REACHED + 1) * per]);
        }
        let e = &w["embed.weight"];
        let c = e.len() / ToyConfig::tiny().vocab as usize;
        for t in RARE {
            out.extend_from_slice(&e[t as usize * c..(t as usize + 1) * c]);
        }
        out
    }

    /// The gradients one rank's backward alone gives rows `rows` at weights `w`.
    fn local_grads(w: &HashMap<String, Vec<f32>>, rows: std::ops::Range<usize>) -> HashMap<String, Vec<f32>> {
        let mut ex = Executor::new(&moe_toy(rows.len() as u64), Cpu::new(), ExecOptions::default()).unwrap();
        load(&mut ex, w);
        let (tokens, targets) = rows_of(rows);
        ex.forward(&[("tokens", Input::U32(&tokens)), ("targets", Input::U32(&targets))]).unwrap();
        ex.backward().unwrap();
        // Every trained weight has a gradient, zeros where no token reached it.
        ex.trainable().into_iter().map(|n| { let g = ex.grad(&n).unwrap().unwrap(); (n, g) }).collect()
    }

    /// A data-parallel step where a weight gets no gradient on one rank: with the
    /// routing of [`skewed_weights`], no token of dp rank 0 (rows 0 and 1) reaches layer
    /// 0's expert 2 or holds a [`RARE`] token, and of dp rank 1 only row 2 does (row 3
    /// neither: with two micro-batches, rank 1's expert and rows get a gradient in the
    /// first and none in the second). The executor's backward writes such a weight's
    /// gradient whole (zeros; `grads` are allocated for every trained weight when the
    /// executor is made), and the reduction gives every rank the group's sum: after two
    /// AdamW steps the two replicas hold the same weights, bit for bit, equal to the
    /// unsharded model's two steps on the four rows (rank 0's expert 2 and rare rows
    /// moved as rank 1's did). The same with the all-reduce after the backward, overlapped
    /// in buckets during it, with FSDP's reduce-scatter (gradients sharded per
    /// micro-batch or accumulated whole), over one micro-batch and two; and a single rank
    /// accumulating the four rows as four micro-batches (expert 2 reached in the third,
    /// not the fourth) takes the same steps. The zero and non-zero local gradients are
    /// checked first, at both steps' starting weights. Fails if an expert no row reached
    /// overwrites its gradient (an earlier micro-batch's is lost) or if a weight
    /// gradient is not zeroed before the step's first backward adds into it (the last
    /// step's reduced gradient stays in it).
    #[test]
    fn a_weight_no_token_of_a_rank_reaches_gets_the_other_ranks_gradient() {
        use runner_graph::shard::{Layout, RankCoord, shard};
        let w0 = skewed_weights();
        let adamw = &crate::executor::ADAMW_DEFAULT;
        // The unsharded reference: two steps on the four rows.
        let mut full = Executor::new(&moe_toy(4), Cpu::new(), ExecOptions::default()).unwrap();
        load(&mut full, &w0);
        let (tokens, targets) = full_batch();
        let mut weights_after = Vec::new();
        for _ in 0..2 {
            weights_after.push(full.gather_weights().unwrap());
            full.step(&[("tokens", Input::U32(&tokens)), ("targets", Input::U32(&targets))], adamw).unwrap();
        }
        let want = full.gather_weights().unwrap();
        // Where each step starts, rank 0's rows and rank 1's second row leave expert 2
        // and the rare rows a zero gradient, rank 1's first row does not.
        for (step, w) in weights_after.iter().enumerate() {
            for (rows, reached) in [(0..2, false), (2..3, true), (3..4, false)] {
                let g = reached_parts(&local_grads(w, rows.clone()));
                assert_eq!(g.iter().any(|&x| x != 0.0), reached, "step {step}, rows {rows:?}");
            }
        }
        let moved = |w: &HashMap<String, Vec<f32>>| {
            reached_parts(w).iter().zip(reached_parts(&w0)).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max)
        };
        assert!(moved(&want) > 1e-3, "the reference updates expert 2 and the rare rows");
        let check = |what: &str, ranks: &[HashMap<String, Vec<f32>>]| {
            for (r, got) in ranks.iter().enumerate() {
                assert_eq!(got.len(), want.len(), "{what}");
                for (name, v) in &want {
                    let e = got[name].iter().zip(v).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                    assert!(e <= 1e-5, "{what}: {name} on rank {r} is {e:e} from the unsharded steps");
                }
                assert!(ranks[0] == *got, "{what}: rank {r}'s weights differ from rank 0's");
            }
        };
        // One rank, the four rows as four micro-batches.
        let mut one = Executor::new(&moe_toy(1), Cpu::new(), ExecOptions::default()).unwrap();
        load(&mut one, &w0);
        let micro: Vec<(Vec<u32>, Vec<u32>)> = (0..4).map(|k| rows_of(k..k + 1)).collect();
        let batches: Vec<Vec<(&str, Input<'_>)>> = micro.iter().map(|(t, y)| vec![("tokens", Input::U32(t)), ("targets", Input::U32(y))]).collect();
        for _ in 0..2 {
            one.step_micro_batches(&batches, adamw).unwrap();
        }
        check("one rank, four micro-batches", &[one.gather_weights().unwrap()]);
        // Two data-parallel ranks.
        for (fsdp, overlap, sharded, m) in [
            (false, false, true, 1usize),
            (false, true, true, 1),
            (false, false, true, 2),
            (false, true, true, 2),
            (true, false, true, 1),
            (true, true, true, 2),
            (true, false, false, 2),
        ] {
            let what = format!("dp 2, fsdp {fsdp}, overlap {overlap}, sharded gradients {sharded}, {m} micro-batches");
            let per = 2 / m;
            let g = moe_toy(per as u64);
            let layout = Layout { dp: 2, fsdp, ..Layout::single(per as u32, 4) };
            let o = ExecOptions { overlap_grad_reduce: overlap, grad_bucket_elems: Some(1), fsdp_sharded_grads: sharded, ..ExecOptions::default() };
            let ranks: Vec<HashMap<String, Vec<f32>>> = std::thread::scope(|sc| {
                let runs: Vec<_> = ThreadGroup::new(2)
                    .into_iter()
                    .zip(ThreadGroup::new(2))
                    .zip(0u32..)
                    .map(|((dh, eh), r)| {
                        let s = shard(&g, &layout, RankCoord { dp: r, ..RankCoord::default() }).unwrap();
                        let (o, w0) = (o.clone(), &w0);
                        sc.spawn(move || {
                            let groups: Groups = vec![("dp".into(), Box::new(dh)), ("edp".into(), Box::new(eh))];
                            let mut ex = Executor::for_rank(&s, Cpu::new(), o, groups).unwrap();
                            assert_eq!(ex.fsdp_sharded(), fsdp);
                            load(&mut ex, w0);
                            let r = r as usize;
                            let micro: Vec<(Vec<u32>, Vec<u32>)> = (0..m).map(|k| rows_of(2 * r + k * per..2 * r + (k + 1) * per)).collect();
                            let batches: Vec<Vec<(&str, Input<'_>)>> = micro.iter().map(|(t, y)| vec![("tokens", Input::U32(t)), ("targets", Input::U32(y))]).collect();
                            for _ in 0..2 {
                                ex.step_micro_batches(&batches, adamw).unwrap();
                            }
                            ex.gather_weights().unwrap()
                        })
                    })
                    .collect();
                runs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            check(&what, &ranks);
        }
    }
}
