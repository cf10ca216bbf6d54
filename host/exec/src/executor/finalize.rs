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
