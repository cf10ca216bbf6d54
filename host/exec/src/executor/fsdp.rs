//! FSDP (ZeRO-3: PyTorch FSDP wrapping each layer, Megatron's distributed optimizer with
//! parameter sharding) for the weights a pair of FSDP step collectives covers (a
//! `ReduceScatter` of the fp32 gradients and an `AllGather` of the parameters over the
//! same group, `dp` or `edp`, from [`runner_graph::shard`] with `fsdp: true`; the
//! all-gather also covers the frozen weights, as LoRA's base, whose pieces have no
//! gradient or moments: see `units_of`).
//!
//! - **Layout.** Each pair is cut into units, one per layer (the layer of each weight's
//!   first reader; a weight outside the layers, as the embedding or the head, is a unit
//!   of its own): a unit's weights, in the collective's `weights` order (sorted names,
//!   the same on every rank of the group), are flattened into one buffer, padded with
//!   zeros to a multiple of the group size n; rank r owns chunk r. A weight
//!   lies in one or two (or more, for a big one) chunks: this rank stores the piece of
//!   each weight inside its chunk as its own device buffer (a parameter piece, a gradient
//!   piece and two AdamW moment pieces), so the optimizer still runs per tensor and the
//!   padding takes no device memory.
//! - **At rest** (between steps) a rank holds only those pieces: a covered weight has no
//!   whole value, gradient or moments ([`Executor::weight`] refuses it then).
//! - **Forward and backward.** Right before an op (a backward step, or the re-run of a
//!   recomputed segment before it) reads a weight that is not whole, the pass
//!   all-gathers that weight's unit and materialises the unit's weights it reads; each
//!   is freed right after the last op of the pass that reads it. So a pass holds about
//!   one layer's parameters at a time (PyTorch FSDP without prefetch), and gathers
//!   every weight once: the step collective's count 2·m, a forward and a backward
//!   gather of the model per micro-batch, in one call per unit. A pipeline chunk's pass
//!   gathers what its own ops read (and prefetches within the chunk only).
//! - **Gradients.** The backward writes whole gradients. A unit's reduce-scatter sums
//!   them over the group, divides by the collective's `mean_over` (as the `dp`
//!   all-reduce divides) and adds this rank's chunk to its gradient pieces; the whole
//!   gradients are freed. When it runs:
//!   - Each micro-batch (PyTorch FSDP's default; [`super::ExecOptions::fsdp_sharded_grads`],
//!     on by default): in a step ([`Executor::step`], [`Executor::step_micro_batches`]:
//!     armed as the overlapped buckets are, `overlap.rs`), once every backward step
//!     writing a unit's gradients has run for the k-th micro-batch, they are copied into
//!     one buffer (scaled by 1/m as the step scales each gradient), freed, and the unit's
//!     k-th reduce-scatter runs: started ([`crate::Collective::start`]) to run beside
//!     the backward with [`super::ExecOptions::overlap_grad_reduce`] (PyTorch FSDP's
//!     post-backward reduce-scatter), the one started before it finished first (it had
//!     a layer's backward to run) so at most one is in flight; at once without. No
//!     whole gradient outlives its unit's backward, at any micro-batch count.
//!   - Without sharded gradients (PyTorch's `no_sync`), micro-batches accumulate whole
//!     gradients and each unit's one reduce-scatter runs after the last micro-batch's
//!     backward steps for it (during the backward, with `overlap_grad_reduce`): the
//!     sums are then plain data parallelism's, bit for bit.
//!   - After the backward, [`Executor::reduce_gradients`] finishes the one in flight,
//!     runs the step's all-reduces (`tp`, `tp-kv`, `pp-embed`: they sum whole
//!     gradients), then the reduce-scatter of every unit not reduced yet: those whose
//!     weights one of those all-reduces also sums (so the bits stay those of the order
//!     all-reduce, then reduce-scatter; their whole gradients accumulate), and every
//!     unit outside a step.
//! - **Optimizer.** AdamW updates the pieces (parameter, gradient, moments). It is
//!   elementwise, so the result equals the unsharded update of the same elements.
//!   Muon's matrices keep one momentum piece instead of the two moments; their pieces'
//!   Nesterov updates are all-gathered over the group in the unit's flat layout, each
//!   rank orthogonalises every whole matrix and applies its own range
//!   ([`Executor::fsdp_muon_step`], `muon.rs`).
//! - **Memory.** At rest about 1/n of the covered state ([`super::MemoryReport`]'s
//!   `state_bytes`); during a pass, plus the gathered weights not yet past their last
//!   reader; plus each unit's whole gradients from its backward steps to its
//!   reduce-scatter, and the one in flight (the last one a backward started stays in
//!   flight through the forwards run before the next one starts: 1F1B's last stage,
//!   micro-batches in order). [`Executor::memory`] walks exactly these allocations, over
//!   micro-batches pass by pass in the order they ran ([`Executor::fsdp_pass_walks`]),
//!   each pipeline chunk's apart: a chunk's whole gradients accumulated live from its
//!   first backward on (stage 0 of 1F1B runs its warm-up forwards and first backward
//!   without them), and only the last micro-batch's backward frees them by its
//!   reduce-scatters; each other micro-batch parked holds what it held after its last
//!   pass, and the pipeline's mailbox the buffers of an interleaved iteration's other
//!   pass. The collectives run through host copies, as the rest of the in-process
//!   backend does.
//!
//! Inspection: [`Executor::gather_weights`] and [`Executor::gather_grads`] return whole
//! tensors (collective calls: every rank of each FSDP group must make them, in the same
//! order); [`Executor::weight_shard`] and [`Executor::grad_shard`] read this rank's piece.
//! [`Executor::set_weight`] takes the whole tensor and keeps this rank's piece.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;

use runner_graph::autodiff::BackwardPlan;
use runner_graph::recompute::RecomputeSchedule;
use runner_graph::shard::StepCollective;
use runner_graph::{Graph, OpKind, TensorId, TensorKind};

use super::Executor;
use crate::collective::{InFlight, Started};
use crate::device::{Device, DeviceBuffer, Elem, ExecError};

/// A rank's part of a weight (or of its gradient): the element range of the flattened
/// tensor it holds, and those elements.
pub type Shard = (Range<usize>, Vec<f32>);

/// This rank's part of one covered weight: elements `range` of the weight, at `at` in
/// this rank's chunk.
struct Piece<B> {
    id: TensorId,
    range: Range<usize>,
    at: usize,
    param: B,
    /// The reduced gradient (written by the reduce-scatter), for weights that train.
    grad: Option<B>,
    /// AdamW's two moments, for weights AdamW updates.
    moments: Option<(B, B)>,
    /// Muon's momentum, for the matrices Muon updates (`muon.rs`).
    momentum: Option<B>,
}

/// One FSDP unit: the weights of one (reduce-scatter, all-gather) pair.
struct Unit<B> {
    group: String,
    n: usize,
    rank: usize,
    mean_over: u32,
    ids: Vec<TensorId>,
    /// Where each weight starts in the flat buffer.
    offsets: Vec<usize>,
    /// Elements per rank (the padded flat length / n).
    chunk: usize,
    pieces: Vec<Piece<B>>,
}

/// A rank's FSDP state (empty without FSDP).
pub(super) struct FsdpState<B> {
    units: Vec<Unit<B>>,
    /// Covered weight → (unit, its piece on this rank, if any).
    owner: HashMap<TensorId, (usize, Option<usize>)>,
    /// When the passes free the gathered weights (also what [`super::live_bytes`] walks).
    pub(super) resting: Option<Resting>,
    /// The reduce-scatters started during the backward.
    scatters: Scatters<B>,
    /// The unit whose all-gather a pass started ahead (prefetch), and the call.
    prefetched: Option<(usize, InFlight<B>)>,
    /// Micro-batches of the last step; `None` when the last forward was called by
    /// hand ([`Executor::forward`]), outside a step.
    micro_batches: Option<u32>,
    /// How the last step ran its passes (what the memory walk follows).
    pub(super) passes: StepPasses,
}

/// How a step ran its forward and backward passes, as far as the memory walk
/// ([`super::walk_live`]) needs it; the default: whole-graph passes, one micro-batch.
#[derive(Default)]
pub(super) struct StepPasses {
    /// Per pass (forward ops, backward steps): the range each pipeline chunk ran, by
    /// chunk, when the passes ran a chunk at a time; empty when each ran the whole
    /// graph. A pass prefetches only within its own range (`gather_for`).
    pub(super) chunks: [Vec<Range<usize>>; 2],
    /// The step's passes in the order they ran (empty: one whole-graph forward and
    /// backward), and per pass the bytes the others of its iteration keep in the
    /// pipeline's mailbox meanwhile.
    pub(super) order: Vec<super::pipeline::Pass>,
    pub(super) mailbox: Vec<u64>,
    /// Whether a pipeline schedule drove the passes: each pipeline send then copies its
    /// buffer into the mailbox, held to the next batched call (the walk counts a
    /// receive's backward's copy, besides the gradient it copies, to the pass's end).
    pub(super) driven: bool,
}

/// How one pass of a step's order finds the rank, for the memory account
/// ([`Executor::fsdp_pass_walks`]).
#[derive(Clone, Debug)]
pub(super) struct PassWalk {
    /// The pass: a forward or backward of pipeline chunk `.1` (0 on a rank of one).
    pub(super) backward: bool,
    pub(super) chunk: usize,
    /// The other micro-batches between their first forward and their last backward
    /// meanwhile, each by the last pass it ran: a forward (`false`) or a backward
    /// (`true`) of a chunk.
    pub(super) others: Vec<(bool, usize)>,
    /// What the pipeline's mailbox holds for the other passes of its iteration.
    pub(super) mailbox: u64,
    /// What the walk of this micro-batch starts with and does besides its own passes.
    pub(super) around: AroundKey,
}

/// What a micro-batch's walk finds around it ([`PassWalk`]): the same for many passes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct AroundKey {
    /// Per chunk: its weights' whole gradients (those `fsdp_carried` names) an earlier
    /// backward left live.
    pub(super) carried: Vec<bool>,
    /// Per chunk: its backward runs the reduce-scatters.
    pub(super) scatters: Vec<bool>,
    /// The unit whose reduce-scatter an earlier backward left in flight.
    pub(super) left: Option<usize>,
}

impl<B> Default for FsdpState<B> {
    fn default() -> Self {
        FsdpState {
            units: Vec::new(),
            owner: HashMap::new(),
            resting: None,
            scatters: Scatters { writers: Vec::new(), by_step: Vec::new(), done: Vec::new(), in_flight: None },
            prefetched: None,
            micro_batches: None,
            passes: StepPasses::default(),
        }
    }
}

/// The units whose reduce-scatters may run during the backward, and this step's state.
struct Scatters<B> {
    /// Per unit: the backward steps writing its gradients, for units over more than one
    /// rank whose weights no all-reduce sums (empty for the others).
    writers: Vec<Vec<usize>>,
    /// Per backward step: the units it writes (of those with writers).
    by_step: Vec<Vec<usize>>,
    /// Per unit: the reduce-scatters run (or started) this step.
    done: Vec<u32>,
    /// The one started and not finished: its unit, whether it is the unit's first this
    /// step (its chunk replaces the pieces' gradients; later ones add to them).
    in_flight: Option<(usize, bool, InFlight<B>)>,
}

/// Where the covered weights are at rest and when the passes free their gathered copy,
/// by tensor id; what the memory accounting needs.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Resting {
    /// Elements this rank keeps of each covered weight (`None`: not covered, kept whole).
    pub(super) kept: Vec<Option<u64>>,
    /// The last forward op that reads each weight (`None`: none does, it is not gathered
    /// for the forward).
    last_forward: Vec<Option<usize>>,
    /// The last backward step that needs each weight: a step of an op that reads it, or
    /// the step a re-run of an op reading it precedes.
    last_backward: Vec<Option<usize>>,
    /// Per pass: the covered weights it gathers (those it reads), and per op (forward)
    /// or step (backward) those it frees after it (from [`Resting::index`]).
    gathers: [Vec<TensorId>; 2],
    frees: [Vec<Vec<TensorId>>; 2],
    /// Per pass, per op (forward) or step (backward, with the re-run before it): the
    /// units whole passes gather right before it (its units' first reader), each with
    /// the weights of it the pass reads.
    before: [Vec<Vec<UnitGather>>; 2],
    /// Per pass, per op or step: the unit whose gather starts after those (the next
    /// one the pass gathers) and the op or step it is gathered before, when passes
    /// prefetch.
    prefetch_after: [Vec<Option<(usize, usize)>>; 2],
    /// Whether the passes prefetch ([`super::ExecOptions::fsdp_prefetch`]).
    prefetch: bool,
    /// Per pass: the ops each forward op, or backward step, runs (the step's re-run
    /// segment first), whose parameter inputs must be gathered first.
    readers: [Vec<Vec<usize>>; 2],
    /// Per backward step: the units whose reduce-scatter runs after it (in a step);
    /// at once (`scatter_waits`) or started.
    pub(super) scatter_after: Vec<Vec<usize>>,
    scatter_waits: bool,
    /// Per unit: its weights, and the elements of its padded flat buffer and of one
    /// rank's chunk of it.
    pub(super) units: Vec<(Vec<TensorId>, u64, u64)>,
}

impl Resting {
    fn new(g: &Graph, plan: &BackwardPlan, sched: &RecomputeSchedule) -> Resting {
        let nt = g.tensors.len();
        let mut last_forward = vec![None; nt];
        for (oi, op) in g.ops.iter().enumerate() {
            for &i in &op.inputs {
                if g.tensors[i].kind.is_param() {
                    last_forward[i] = Some(oi);
                }
            }
        }
        let mut last_backward = vec![None; nt];
        let mut step_ops = Vec::with_capacity(plan.steps.len());
        for (si, s) in plan.steps.iter().enumerate() {
            let rerun = sched.rerun_before_step[si]
                .map(|seg| sched.segments[seg].as_slice())
                .unwrap_or_default();
            let ops: Vec<usize> = rerun.iter().copied().chain(std::iter::once(s.op)).collect();
            for &oi in &ops {
                for &i in &g.ops[oi].inputs {
                    if g.tensors[i].kind.is_param() {
                        last_backward[i] = Some(si);
                    }
                }
            }
            step_ops.push(ops);
        }
        Resting {
            kept: vec![None; nt],
            last_forward,
            last_backward,
            gathers: [Vec::new(), Vec::new()],
            frees: [
                vec![Vec::new(); g.ops.len()],
                vec![Vec::new(); plan.steps.len()],
            ],
            before: [
                vec![Vec::new(); g.ops.len()],
                vec![Vec::new(); plan.steps.len()],
            ],
            prefetch_after: [vec![None; g.ops.len()], vec![None; plan.steps.len()]],
            prefetch: false,
            readers: [(0..g.ops.len()).map(|oi| vec![oi]).collect(), step_ops],
            scatter_after: vec![Vec::new(); plan.steps.len()],
            scatter_waits: false,
            units: Vec::new(),
        }
    }

    /// Which units a whole pass gathers before each op or step: walking it as the
    /// passes run ([`Executor::fsdp_gather_before`]), a unit is gathered when a reader
    /// needs one of its weights that is not whole, and each weight freed after its last
    /// reader; with `prefetch`, each gather but the last starts the next one's. Needs
    /// `units`.
    fn plan_gathers(&mut self, g: &Graph, unit_of: &HashMap<TensorId, usize>, prefetch: bool) {
        self.prefetch = prefetch;
        for p in [Pass::Forward, Pass::Backward] {
            let mut whole = vec![false; self.kept.len()];
            let mut last: Option<usize> = None;
            for at in 0..self.readers[p as usize].len() {
                for &oi in &self.readers[p as usize][at] {
                    for &i in &g.ops[oi].inputs {
                        if whole[i] {
                            continue;
                        }
                        let Some(&u) = unit_of.get(&i) else { continue };
                        let mut reads = Vec::new();
                        for &id in &self.units[u].0 {
                            if self.reads(p, id) && !whole[id] {
                                whole[id] = true;
                                reads.push(id);
                            }
                        }
                        if !reads.is_empty() {
                            self.before[p as usize][at].push((u, reads));
                        }
                    }
                }
                if let Some(&(u, _)) = self.before[p as usize][at].first() {
                    let shared = self.units[u].1 > self.units[u].2;
                    if let Some(l) = last.filter(|_| prefetch && shared) {
                        self.prefetch_after[p as usize][l] = Some((u, at));
                    }
                    last = Some(at);
                }
                for &id in &self.frees[p as usize][at] {
                    whole[id] = false;
                }
            }
        }
    }

    /// Fill the per-pass lists once `kept` says which weights are covered.
    fn index(&mut self) {
        for (p, last) in [&self.last_forward, &self.last_backward]
            .into_iter()
            .enumerate()
        {
            for (id, l) in last.iter().enumerate() {
                if let (Some(at), Some(_)) = (l, self.kept[id]) {
                    self.gathers[p].push(id);
                    self.frees[p][*at].push(id);
                }
            }
        }
    }

    /// Whether `pass` reads weight `id`.
    fn reads(&self, pass: Pass, id: TensorId) -> bool {
        match pass {
            Pass::Forward => self.last_forward[id].is_some(),
            Pass::Backward => self.last_backward[id].is_some(),
        }
    }

    /// The covered weights `pass` gathers (every one it reads).
    pub(super) fn gathered(&self, pass: Pass) -> &[TensorId] {
        &self.gathers[pass as usize]
    }

    /// The covered weights `pass` frees after op (forward) or step (backward) `at`: those
    /// it reads last.
    pub(super) fn freed_after(&self, pass: Pass, at: usize) -> &[TensorId] {
        &self.frees[pass as usize][at]
    }

    /// Walk the gathers a whole `pass` makes right before op (forward) or step
    /// (backward) `at`, for the memory account ([`super::walk_live`]): for each unit,
    /// its own chunk and the gathered flat buffer (allocated when its gather started:
    /// here, or at the gather before when it was prefetched), the chunk freed at the
    /// finish, the weights the pass reads copied out, the flat buffer freed; then the
    /// prefetch of the next unit starts, if it is gathered before `end`: a pass that
    /// runs one pipeline chunk ([`Executor::fsdp_passes`]) prefetches nothing past it.
    pub(super) fn walk_gathers(&self, pass: Pass, at: usize, end: usize, bytes: impl Fn(TensorId) -> u64, mut w: Walk<'_>) {
        for (u, reads) in &self.before[pass as usize][at] {
            let (_, flat, chunk) = self.units[*u];
            // A unit over one rank: its chunk is the whole (no call, no second buffer).
            let solo = flat == chunk;
            if w.in_flight.prefetched.take_if(|p| p == u).is_none() {
                w.add(if solo { chunk * 4 } else { (flat + chunk) * 4 });
            }
            if !solo {
                w.sub(chunk * 4);
            }
            w.add(reads.iter().map(|&id| bytes(id)).sum());
            w.sub(flat * 4);
        }
        if let Some((next, before)) = self.prefetch_after[pass as usize][at]
            && before < end
            && w.in_flight.prefetched.is_none()
        {
            w.add((self.units[next].1 + self.units[next].2) * 4);
            w.in_flight.prefetched = Some(next);
        }
    }

    /// Start the walk with unit `u`'s reduce-scatter in flight (as an earlier
    /// micro-batch's backward left it into the forward: [`Executor::fsdp_pass_walks`]):
    /// its flat input and chunk live until the next reduce-scatter starts.
    pub(super) fn walk_scatter_left(&self, u: usize, mut w: Walk<'_>) {
        w.add((self.units[u].1 + self.units[u].2) * 4);
        w.in_flight.scattering = Some(u);
    }

    /// Walk the reduce-scatters run after backward step `si` (in a step): the one in
    /// flight finished (its flat input and chunk freed), the unit's gradients (those
    /// `grads` holds) copied into its flat buffer and freed, its chunk allocated (and,
    /// run at once, both freed).
    pub(super) fn walk_scatters(&self, si: usize, bytes: impl Fn(TensorId) -> u64, grads: &mut HashSet<TensorId>, mut w: Walk<'_>) {
        for &u in &self.scatter_after[si] {
            if let Some(p) = w.in_flight.scattering.take() {
                w.sub((self.units[p].1 + self.units[p].2) * 4);
            }
            let (ids, flat, chunk) = &self.units[u];
            w.add(flat * 4);
            for id in ids {
                if grads.remove(id) {
                    w.sub(bytes(*id));
                }
            }
            w.add(chunk * 4);
            if self.scatter_waits {
                w.sub((flat + chunk) * 4);
            } else {
                w.in_flight.scattering = Some(u);
            }
        }
    }

    /// Whether `id` is covered.
    pub(super) fn covers(&self, id: TensorId) -> bool {
        self.kept[id].is_some()
    }
}

/// Device bytes live and at most, as [`super::walk_live`] walks a step, and the FSDP
/// gather prefetched and reduce-scatter in flight there.
pub(super) struct Walk<'a> {
    pub(super) live: &'a mut u64,
    pub(super) peak: &'a mut u64,
    pub(super) in_flight: &'a mut InFlightUnits,
}

/// The units whose gather (prefetched) and reduce-scatter are in flight, in a walk.
#[derive(Default)]
pub(super) struct InFlightUnits {
    prefetched: Option<usize>,
    scattering: Option<usize>,
}

impl Walk<'_> {
    /// `b` more bytes live.
    fn add(&mut self, b: u64) {
        *self.live += b;
        *self.peak = (*self.peak).max(*self.live);
    }
    fn sub(&mut self, b: u64) {
        *self.live -= b;
    }
}

/// A unit a pass gathers, and the weights of it the pass reads.
type UnitGather = (usize, Vec<TensorId>);

/// The two passes that gather parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pass {
    Forward,
    Backward,
}

/// The FSDP units of `step`: each parameter all-gather, with the `mean_over` of the
/// gradient reduce-scatter of the same group and trained weights (1 without one). The
/// all-gather also covers the frozen weights (`trains` false: LoRA's base), which have no
/// gradient to reduce, so its partner lists only the trained ones (as shard emits them
/// with fsdp = true); an all-gather of frozen weights only has none.
///
/// # Errors
/// A reduce-scatter without the all-gather of its weights, an all-gather of trained
/// weights without their reduce-scatter, or a weight in two units.
fn units_of(step: &[StepCollective], trains: impl Fn(&str) -> bool) -> Result<Vec<(&StepCollective, u32)>, String> {
    let trained = |sc: &StepCollective| -> Vec<String> {
        sc.weights.iter().filter(|w| trains(w)).cloned().collect()
    };
    let mut out: Vec<(&StepCollective, u32)> = Vec::new();
    for sc in step {
        match sc.kind {
            OpKind::ReduceScatter => {
                let paired = step.iter().any(|o| {
                    o.kind == OpKind::AllGather && o.group == sc.group && trained(o) == sc.weights
                });
                if !paired {
                    return Err(format!(
                        "'{}': an FSDP gradient reduce-scatter over '{}' needs the parameter \
                         all-gather of the same weights (as shard emits them with fsdp = true)",
                        sc.what, sc.group
                    ));
                }
            }
            OpKind::AllGather => {
                let want = trained(sc);
                let partner = step
                    .iter()
                    .find(|o| o.kind == OpKind::ReduceScatter && o.group == sc.group && o.weights == want);
                match partner {
                    Some(rs) => out.push((sc, rs.mean_over)),
                    None if want.is_empty() => out.push((sc, 1)),
                    None => {
                        return Err(format!(
                            "'{}': an FSDP parameter all-gather over '{}' needs the gradient \
                             reduce-scatter of the same weights",
                            sc.what, sc.group
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for (sc, _) in &out {
        for w in &sc.weights {
            if let Some(g) = seen.insert(w, &sc.group) {
                return Err(format!(
                    "'{w}' is sharded by two FSDP groups ('{g}' and '{}')",
                    sc.group
                ));
            }
        }
    }
    Ok(out)
}

impl<D: Device> Executor<D> {
    /// Whether weight `name` trains (anything but a frozen weight; an unknown name is
    /// left to the caller's lookup).
    fn trains(&self, name: &str) -> bool {
        self.graph.tensor_id(name).is_none_or(|id| self.graph.tensors[id].kind != TensorKind::Frozen)
    }

    /// Check the FSDP pairs of `step` (the all-reduces are checked by the caller).
    pub(super) fn check_fsdp(&self, step: &[StepCollective]) -> Result<(), String> {
        if !self.fsdp.units.is_empty() {
            return Err(
                "this rank's parameters are already sharded by FSDP step collectives, \
                 which are set once"
                    .into(),
            );
        }
        units_of(step, |w| self.trains(w)).map(|_| ())
    }

    /// Shard the weights the FSDP pairs of `step` cover: keep this rank's pieces of the
    /// parameters and AdamW moments, allocate its gradient pieces, and free the whole
    /// tensors. Every rank initialised (or was given) the same whole weights, so this
    /// moves nothing between ranks.
    pub(super) fn shard_fsdp(&mut self, step: &[StepCollective]) -> Result<(), ExecError> {
        let units = units_of(step, |w| self.trains(w)).map_err(ExecError::State)?;
        if units.is_empty() {
            return Ok(());
        }
        let mut resting = Resting::new(&self.graph, &self.plan, &self.sched);
        for (sc, mean_over) in units {
            let (n, rank) = match self.collectives.get(&sc.group) {
                Some(c) => (c.size(), c.rank()),
                None => (1, 0),
            };
            // One unit per layer (the layer of the weight's first reader; a weight
            // outside the layers, as the embedding or the head, alone): a pass gathers a
            // layer's weights right before it needs them.
            let mut by_layer: BTreeMap<(i32, usize), Vec<TensorId>> = BTreeMap::new();
            for w in &sc.weights {
                let id = self.id(w)?;
                let first = self.graph.ops.iter().enumerate().find(|(_, op)| op.inputs.contains(&id));
                let key = match first {
                    Some((_, op)) if op.layer >= 0 => (op.layer, 0),
                    Some((oi, op)) => (op.layer, oi),
                    None => (i32::MAX, 0),
                };
                by_layer.entry(key).or_default().push(id);
            }
            for ids in by_layer.into_values() {
                let mut offsets = Vec::with_capacity(ids.len());
                let mut total = 0usize;
                for &id in &ids {
                    offsets.push(total);
                    total += self.graph.tensors[id].numel() as usize;
                }
                let chunk = total.div_ceil(n);
                let mine = rank * chunk..(rank + 1) * chunk;
                let ui = self.fsdp.units.len();
                let mut pieces = Vec::new();
                for (&id, &off) in ids.iter().zip(&offsets) {
                    let numel = self.graph.tensors[id].numel() as usize;
                    let lo = off.max(mine.start);
                    let hi = (off + numel).min(mine.end);
                    let piece = if lo < hi {
                        let range = lo - off..hi - off;
                        let cut = |b: &D::Buffer, dev: &D| -> Result<D::Buffer, ExecError> {
                            let mut p = dev.alloc(Elem::F32, range.len())?;
                            dev.copy(&mut p, 0, b, range.start, range.len())?;
                            Ok(p)
                        };
                        let whole = self.vals[id].as_ref().ok_or_else(|| {
                            ExecError::State(format!(
                                "weight '{}' has no buffer to shard",
                                self.graph.tensors[id].name
                            ))
                        })?;
                        let param = cut(whole, &self.device)?;
                        let moments = match &self.moments[id] {
                            Some((m, v)) => Some((cut(m, &self.device)?, cut(v, &self.device)?)),
                            None => None,
                        };
                        let momentum = match &self.momentum[id] {
                            Some(b) => Some(cut(b, &self.device)?),
                            None => None,
                        };
                        let grad = if self.plan.needs_grad[id] {
                            let mut g = self.device.alloc(Elem::F32, range.len())?;
                            self.device.zero(&mut g)?;
                            Some(g)
                        } else {
                            None
                        };
                        pieces.push(Piece {
                            id,
                            at: lo - mine.start,
                            range,
                            param,
                            grad,
                            moments,
                            momentum,
                        });
                        Some(pieces.len() - 1)
                    } else {
                        None
                    };
                    resting.kept[id] = Some((hi.saturating_sub(lo)) as u64);
                    self.fsdp.owner.insert(id, (ui, piece));
                    self.vals[id] = None;
                    self.grads[id] = None;
                    self.moments[id] = None;
                    self.momentum[id] = None;
                    self.grad_written[id] = false;
                    self.carry[id] = false;
                }
                self.fsdp.units.push(Unit {
                    group: sc.group.clone(),
                    n,
                    rank,
                    mean_over,
                    ids,
                    offsets,
                    chunk,
                    pieces,
                });
            }
        }
        resting.index();
        let unit_of: HashMap<TensorId, usize> = self.fsdp.owner.iter().map(|(&id, &(u, _))| (id, u)).collect();
        resting.units = self.fsdp.units.iter().map(|u| (u.ids.clone(), (u.chunk * u.n) as u64, u.chunk as u64)).collect();
        resting.plan_gathers(&self.graph, &unit_of, self.options.fsdp_prefetch);
        self.plan_scatters(step, &mut resting);
        self.fsdp.resting = Some(resting);
        Ok(())
    }

    /// Which units' reduce-scatters may run during the backward, and when (see the
    /// module doc): a unit over more than one rank, whose weights no all-reduce of
    /// `step` sums, once the last backward step writing its gradients ran (for the
    /// micro-batch, or for the last).
    fn plan_scatters(&mut self, step: &[StepCollective], resting: &mut Resting) {
        let summed: Vec<TensorId> = step
            .iter()
            .filter(|sc| sc.kind == OpKind::AllReduce)
            .flat_map(|sc| sc.weights.iter().filter_map(|w| self.graph.tensor_id(w)))
            .collect();
        let writers = self.grad_writers();
        let mut sc = Scatters {
            writers: vec![Vec::new(); self.fsdp.units.len()],
            by_step: vec![Vec::new(); self.plan.steps.len()],
            done: vec![0; self.fsdp.units.len()],
            in_flight: None,
        };
        let in_backward = self.fsdp_scatters_in_backward();
        for (u, unit) in self.fsdp.units.iter().enumerate() {
            if unit.n <= 1 || unit.ids.iter().any(|id| summed.contains(id)) {
                continue;
            }
            let mut w: Vec<usize> = unit.ids.iter().flat_map(|&id| writers[id].iter().copied()).collect();
            w.sort_unstable();
            w.dedup();
            if let Some(&last) = w.last() {
                for &si in &w {
                    sc.by_step[si].push(u);
                }
                sc.writers[u] = w;
                if in_backward {
                    resting.scatter_after[last].push(u);
                }
            }
        }
        resting.scatter_waits = !self.options.overlap_grad_reduce;
        self.fsdp.scatters = sc;
    }

    /// Whether reduce-scatters run during the backward: each micro-batch's (sharded
    /// gradients), or the last one's started beside it (overlapped).
    fn fsdp_scatters_in_backward(&self) -> bool {
        self.options.fsdp_sharded_grads || self.options.overlap_grad_reduce
    }

    /// The covered weights whose whole gradients the last step's micro-batches
    /// accumulated (each one after the first starts with them): every trained one
    /// without sharded gradients, else those of units reduced after the backward.
    pub(super) fn fsdp_carried(&self) -> Vec<TensorId> {
        let Some(m) = self.fsdp.micro_batches else {
            // Called by hand: the gradients the last backward added to
            // (`backward_accumulate`), whatever the last step's micro-batches were.
            return self.fsdp.units.iter().flat_map(|unit| unit.ids.iter().copied()).filter(|&id| self.carry[id] && self.plan.needs_grad[id]).collect();
        };
        if m <= 1 {
            return Vec::new();
        }
        let sharded = self.options.fsdp_sharded_grads;
        let sc = &self.fsdp.scatters;
        self.fsdp
            .units
            .iter()
            .enumerate()
            .filter(|&(u, _)| !(sharded && sc.writers.get(u).is_some_and(|w| !w.is_empty())))
            .flat_map(|(_, unit)| unit.ids.iter().copied())
            .filter(|&id| self.plan.needs_grad[id])
            .collect()
    }

    /// Whether a step tracks its backward steps for FSDP's reduce-scatters.
    pub(super) fn fsdp_tracks_backward(&self) -> bool {
        self.fsdp_scatters_in_backward() && self.fsdp.scatters.writers.iter().any(|w| !w.is_empty())
    }

    /// A forward called by hand begins, outside any step.
    pub(super) fn fsdp_by_hand(&mut self) {
        self.fsdp.micro_batches = None;
        self.fsdp.passes = StepPasses::default();
    }

    /// The coming step runs `order`'s passes, each over one pipeline chunk (or, on a
    /// rank of one, the whole graph): forward ops `ops[c]` and backward steps
    /// `steps[c]` for chunk c (what [`Executor::memory`] walks).
    pub(super) fn fsdp_passes(&mut self, ops: &[Range<usize>], steps: &[Range<usize>], order: &[super::pipeline::Pass], mailbox: Vec<u64>) {
        self.fsdp.passes = StepPasses { chunks: [ops.to_vec(), steps.to_vec()], order: order.to_vec(), mailbox, driven: false };
    }

    /// Each pass of the last step in the order it ran (empty for a whole-graph step):
    /// the micro-batches parked meanwhile, each by the last pass it ran; what the
    /// pipeline's mailbox holds meanwhile; the chunks whose whole gradients
    /// (those `fsdp_carried` names) an earlier backward left (accumulated: none before
    /// a chunk's first backward, as stage 0 of 1F1B runs its warm-up forwards and its
    /// first backward without them); which chunks' backwards run the reduce-scatters
    /// (each micro-batch's with sharded gradients; else, with `overlap_grad_reduce`,
    /// only the last micro-batch's, which frees them); and the reduce-scatter the last
    /// backward that started one left in flight (the runtime waits for it only as the
    /// next one starts).
    pub(super) fn fsdp_pass_walks(&self) -> Vec<PassWalk> {
        use super::pipeline::Pass as Run;
        let order = &self.fsdp.passes.order;
        let n = self.fsdp.passes.chunks[1].len().max(1);
        let m = self.fsdp.micro_batches.unwrap_or(1) as usize;
        let r = self.fsdp.resting.as_ref();
        let in_backward = r.is_some() && self.fsdp_in_a_step() && self.fsdp_scatters_in_backward();
        let sharded = self.options.fsdp_sharded_grads;
        // The chunks with whole gradients to carry (none but on an FSDP rank).
        let carries: Vec<bool> = self.fsdp_carried_by_chunk().iter().map(|ids| !ids.is_empty()).collect();
        // The last reduce-scatter each chunk's backward starts (overlapped).
        let started: Vec<Option<usize>> = (0..n)
            .map(|c| {
                let r = r.filter(|r| !r.scatter_waits)?;
                let steps = self.fsdp.passes.chunks[1].get(c).cloned().unwrap_or(0..r.scatter_after.len());
                r.scatter_after.get(steps)?.iter().flatten().last().copied()
            })
            .collect();
        // Per micro-batch: the last pass it ran, while it has not run them all.
        let mut open: Vec<Option<(bool, usize)>> = vec![None; m.max(1)];
        let (mut ran, mut last_ran) = (vec![false; n], vec![false; n]);
        let mut left = None;
        let mut out = Vec::with_capacity(order.len());
        for (at, &p) in order.iter().enumerate() {
            let (backward, i, c) = match p {
                Run::Forward(i, c) => (false, i, c),
                Run::Backward(i, c) => (true, i, c),
            };
            if i >= open.len() || c >= n {
                return Vec::new();
            }
            let others = open.iter().enumerate().filter(|&(j, _)| j != i).filter_map(|(_, o)| *o).collect();
            let scatters_in = |k: usize| in_backward && (sharded || last_ran[k] || (k == c && i + 1 == m));
            let around = AroundKey {
                carried: (0..n).map(|k| carries.get(k) == Some(&true) && ran[k] && (sharded || !in_backward || !last_ran[k])).collect(),
                // A backward walks the chunks after its own first (this micro-batch's
                // backwards of them ran).
                scatters: (0..n).map(|k| backward && k >= c && scatters_in(k)).collect(),
                left,
            };
            let mailbox = self.fsdp.passes.mailbox.get(at).copied().unwrap_or(0);
            out.push(PassWalk { backward, chunk: c, others, mailbox, around });
            open[i] = Some((backward, c)).filter(|_| !(backward && c == 0));
            if backward {
                let scatters = scatters_in(c);
                ran[c] = true;
                last_ran[c] |= i + 1 == m;
                left = started[c].filter(|_| scatters).or(left);
            }
        }
        out
    }

    /// The covered weights `fsdp_carried` names, by the pipeline chunk whose backward
    /// writes their gradients (one chunk on a rank of one; a weight two chunks write
    /// is in both).
    pub(super) fn fsdp_carried_by_chunk(&self) -> Vec<Vec<TensorId>> {
        let carried = self.fsdp_carried();
        let chunks = &self.fsdp.passes.chunks[1];
        if chunks.len() <= 1 {
            return vec![carried];
        }
        chunks
            .iter()
            .map(|steps| {
                let mut ids: Vec<TensorId> = steps.clone().flat_map(|si| self.plan.steps[si].grads_out.iter().map(|g| g.tensor)).filter(|id| carried.contains(id)).collect();
                ids.sort_unstable();
                ids.dedup();
                ids
            })
            .collect()
    }

    /// Whether the last forward and backward ran in a step, whose backward may start
    /// reduce-scatters (by hand, the whole gradients stay to `reduce_gradients`).
    pub(super) fn fsdp_in_a_step(&self) -> bool {
        self.fsdp.micro_batches.is_some()
    }

    /// A step over `m` micro-batches starts: nothing of the last one is in flight.
    pub(super) fn fsdp_arm(&mut self, m: u32) {
        self.fsdp.micro_batches = Some(m);
        self.fsdp.passes = StepPasses::default();
        self.fsdp.prefetched = None;
        let sc = &mut self.fsdp.scatters;
        sc.in_flight = None;
        sc.done.iter_mut().for_each(|d| *d = 0);
    }

    /// In an armed step over `m` micro-batches, backward step `si` ran (each step has
    /// run `runs` times): run the reduce-scatter of each unit it made ready, in unit
    /// order (the same on every rank of the group). Returns those started to run beside
    /// the backward (group, elements).
    pub(super) fn fsdp_scatter_ready(&mut self, si: usize, runs: &[u32], m: u32) -> Result<Vec<(String, usize)>, ExecError> {
        let mut started = Vec::new();
        if !self.fsdp_scatters_in_backward() {
            return Ok(started);
        }
        let sharded = self.options.fsdp_sharded_grads;
        for k in 0..self.fsdp.scatters.by_step.get(si).map_or(0, Vec::len) {
            let u = self.fsdp.scatters.by_step[si][k];
            let done = self.fsdp.scatters.done[u];
            // The micro-batch whose gradients this reduce-scatter would carry.
            let (due, needs) = if sharded { (done < m, done + 1) } else { (done == 0, m) };
            if !due || self.fsdp.scatters.writers[u].iter().any(|&w| runs[w] < needs) {
                continue;
            }
            self.run_scatter(u, m)?;
            if self.options.overlap_grad_reduce {
                let unit = &self.fsdp.units[u];
                started.push((unit.group.clone(), unit.chunk * unit.n));
            }
        }
        Ok(started)
    }

    /// Finish the reduce-scatter in flight, copy unit `u`'s gradients (scaled by 1/`m`)
    /// into one buffer, free them and run this one's (started, with
    /// `overlap_grad_reduce`; else at once).
    fn run_scatter(&mut self, u: usize, m: u32) -> Result<(), ExecError> {
        // First, so that its buffers are free before this one's is made.
        self.fsdp_finish_scatters()?;
        let first = self.fsdp.scatters.done[u] == 0;
        self.fsdp.scatters.done[u] += 1;
        let mut flat = self.take_unit_grads(u)?;
        if m > 1 {
            // Exactly the scaling `step_micro_batches` gives each gradient.
            self.device.scale(&mut flat, 1.0 / m as f32)?;
        }
        let f = self.fsdp_group(u)?.start(Started::ReduceScatter, flat)?;
        self.fsdp.scatters.in_flight = Some((u, first, f));
        if !self.options.overlap_grad_reduce {
            self.fsdp_finish_scatters()?;
        }
        Ok(())
    }

    /// Unit `u`'s whole gradients, laid end to end and padded with zeros to the group's
    /// chunks (what its reduce-scatter moves), and freed.
    fn take_unit_grads(&mut self, u: usize) -> Result<D::Buffer, ExecError> {
        let unit = &self.fsdp.units[u];
        let flat = self.flat_grads(&unit.ids, unit.chunk * unit.n)?;
        for &id in &unit.ids {
            self.grads[id] = None;
            self.grad_written[id] = false;
            self.carry[id] = false;
        }
        Ok(flat)
    }

    /// The timed handle of unit `u`'s group.
    fn fsdp_group(&self, u: usize) -> Result<super::comm::Timed<'_, D>, ExecError> {
        let group = &self.fsdp.units[u].group;
        self.timed(group).ok_or_else(|| ExecError::State(format!("no handle for FSDP group '{group}'")))
    }

    /// Unit `u`'s reduce-scattered chunk `mine`: divided by `mean_over`, into this
    /// rank's gradient pieces (`first`: in place of what they hold; else added).
    fn keep_scattered(&mut self, u: usize, mut mine: D::Buffer, first: bool) -> Result<(), ExecError> {
        let unit = &mut self.fsdp.units[u];
        if unit.mean_over > 1 {
            self.device.scale(&mut mine, 1.0 / unit.mean_over as f32)?;
        }
        for p in &mut unit.pieces {
            if let Some(g) = p.grad.as_mut() {
                if first {
                    self.device.copy(g, 0, &mine, p.at, p.range.len())?;
                } else {
                    let mut part = self.device.alloc(Elem::F32, p.range.len())?;
                    self.device.copy(&mut part, 0, &mine, p.at, p.range.len())?;
                    self.device.add_assign(g, &part)?;
                }
            }
        }
        Ok(())
    }

    /// Whether FSDP shards some of this rank's weights.
    pub fn fsdp_sharded(&self) -> bool {
        !self.fsdp.units.is_empty()
    }

    /// Whether `id` is a weight FSDP shards on this rank.
    pub(super) fn fsdp_covers(&self, id: TensorId) -> bool {
        self.fsdp.owner.contains_key(&id)
    }

    /// This rank's chunk of unit `u`'s flat parameter (or gradient) buffer, padding zero.
    fn own_chunk(&self, u: usize, grads: bool) -> Result<D::Buffer, ExecError> {
        let unit = &self.fsdp.units[u];
        let dev = &self.device;
        let mut mine = dev.alloc(Elem::F32, unit.chunk)?;
        dev.zero(&mut mine)?;
        for p in &unit.pieces {
            let b = if grads {
                p.grad.as_ref()
            } else {
                Some(&p.param)
            };
            if let Some(b) = b {
                dev.copy(&mut mine, p.at, b, 0, b.len())?;
            }
        }
        Ok(mine)
    }

    /// The whole flat buffer of unit `u` (parameters or reduced gradients), gathered over
    /// its group; `timed`: counted as step communication.
    fn gather_unit(&self, u: usize, grads: bool, timed: bool) -> Result<D::Buffer, ExecError> {
        let unit = &self.fsdp.units[u];
        let mine = self.own_chunk(u, grads)?;
        if unit.n <= 1 {
            return Ok(mine);
        }
        if timed {
            // Started and finished: in a step a reduce-scatter or a prefetch may be in
            // flight on the group, and calls on it then go the same way, in order.
            let g = self.fsdp_group(u)?;
            let f = g.start(Started::AllGather, mine)?;
            return g.finish(f);
        }
        let missing = || ExecError::State(format!("no handle for FSDP group '{}'", unit.group));
        let mut all = self.device.alloc(Elem::F32, unit.chunk * unit.n)?;
        self.collectives
            .get(&unit.group)
            .ok_or_else(missing)?
            .all_gather(&self.device, &mine, &mut all)?;
        Ok(all)
    }

    /// Before op (forward) or step (backward) `at` of `pass` (whose ops or steps end
    /// before `end`): all-gather each unit one of whose weights its ops read and is not
    /// whole (finish it, when it was prefetched), and materialise the unit's weights the
    /// pass reads; then, with [`super::ExecOptions::fsdp_prefetch`], start the gather of
    /// the next unit the pass will need.
    pub(super) fn fsdp_gather_before(&mut self, pass: Pass, at: usize, end: usize) -> Result<(), ExecError> {
        let Some(resting) = self.fsdp.resting.take() else {
            return Ok(());
        };
        let r = self.gather_for(&resting, pass, at, end);
        self.fsdp.resting = Some(resting);
        r
    }

    /// The units op (forward) or step (backward) `at` of `pass` needs gathered: those of
    /// the covered weights its ops read that are not whole.
    fn units_needed(&self, resting: &Resting, pass: Pass, at: usize) -> Vec<usize> {
        let mut units: Vec<usize> = Vec::new();
        for &oi in &resting.readers[pass as usize][at] {
            for &i in &self.graph.ops[oi].inputs {
                if let Some(&(u, _)) = self.fsdp.owner.get(&i)
                    && self.vals[i].is_none()
                    && !units.contains(&u)
                {
                    units.push(u);
                }
            }
        }
        units
    }

    fn gather_for(&mut self, resting: &Resting, pass: Pass, at: usize, end: usize) -> Result<(), ExecError> {
        let units = self.units_needed(resting, pass, at);
        if units.is_empty() {
            return Ok(());
        }
        for &u in &units {
            let flat = match self.fsdp.prefetched.take() {
                Some((p, f)) if p == u => self.fsdp_group(u)?.finish(f)?,
                other => {
                    self.fsdp.prefetched = other;
                    self.gather_unit(u, false, true)?
                }
            };
            let unit = &self.fsdp.units[u];
            for (&id, &off) in unit.ids.iter().zip(&unit.offsets) {
                if !resting.reads(pass, id) || self.vals[id].is_some() {
                    continue;
                }
                let n = self.graph.tensors[id].numel() as usize;
                let buf = match self.vals[id].take() {
                    Some(b) => b,
                    None => self.device.alloc(Elem::F32, n)?,
                };
                let buf = self.vals[id].insert(buf);
                self.device.copy(buf, 0, &flat, off, n)?;
            }
        }
        // The next unit this pass gathers: the first needed at a later op or step.
        if resting.prefetch && self.fsdp.prefetched.is_none() {
            let next = (at + 1..end).find_map(|a| self.units_needed(resting, pass, a).first().copied());
            if let Some(next) = next.filter(|&u| self.fsdp.units[u].n > 1) {
                let mine = self.own_chunk(next, false)?;
                let f = self.fsdp_group(next)?.start(Started::AllGather, mine)?;
                self.fsdp.prefetched = Some((next, f));
            }
        }
        Ok(())
    }

    /// Free the gathered weights whose last reader in `pass` is `at` (an op index in the
    /// forward, a step index in the backward); `None`: every gathered weight.
    pub(super) fn fsdp_release(&mut self, pass: Pass, at: Option<usize>) {
        let Some(resting) = &self.fsdp.resting else {
            return;
        };
        let ids = match at {
            Some(at) => resting.freed_after(pass, at),
            None => resting.gathered(pass),
        };
        for &id in ids {
            self.vals[id] = None;
        }
    }

    /// Finish the reduce-scatter the backward left in flight (before the step's
    /// all-reduces: nothing else may run on its group meanwhile).
    pub(super) fn fsdp_finish_scatters(&mut self) -> Result<(), ExecError> {
        match self.fsdp.scatters.in_flight.take() {
            Some((u, first, f)) => {
                let mine = self.fsdp_group(u)?.finish(f)?;
                self.keep_scattered(u, mine, first)
            }
            None => Ok(()),
        }
    }

    /// The reduce-scatter of every unit the backward did not reduce: the whole gradients
    /// of the last backward summed over the group and divided by `mean_over`; this
    /// rank's chunk goes to its gradient pieces and the whole gradients are freed. A
    /// unit of frozen weights only (a LoRA base's embedding, head, or whole layer) has
    /// no gradient: shard pairs its all-gather with no reduce-scatter, and none runs (it
    /// moved the unit's flat buffer of zeros; every rank skips the same units).
    pub(super) fn fsdp_reduce_scatter(&mut self) -> Result<(), ExecError> {
        for u in 0..self.fsdp.units.len() {
            if self.fsdp.scatters.done.get_mut(u).map(std::mem::take).unwrap_or(0) > 0 {
                continue;
            }
            if !self.fsdp.units[u].ids.iter().any(|&id| self.plan.needs_grad[id]) {
                continue;
            }
            let flat = self.take_unit_grads(u)?;
            let (n, chunk) = (self.fsdp.units[u].n, self.fsdp.units[u].chunk);
            let mine = if n > 1 {
                let mut mine = self.device.alloc(Elem::F32, chunk)?;
                self.fsdp_group(u)?.reduce_scatter(&flat, &mut mine)?;
                mine
            } else {
                flat
            };
            self.keep_scattered(u, mine, true)?;
        }
        Ok(())
    }

    /// The optimizer on this rank's pieces (after [`Executor::fsdp_reduce_scatter`]):
    /// Muon's matrices ([`Executor::fsdp_muon_step`]), then AdamW on the rest.
    pub(super) fn fsdp_optimizer_step(&mut self) -> Result<(), ExecError> {
        self.fsdp_muon_step()?;
        for unit in &mut self.fsdp.units {
            for p in &mut unit.pieces {
                let (Some(g), Some((m, v))) = (p.grad.as_ref(), p.moments.as_mut()) else {
                    continue;
                };
                let start = if self.options.profile { Some(self.device.record()?) } else { None };
                self.device.adamw(&mut p.param, g, m, v, &self.adam_scalars)?;
                if let Some(s) = start {
                    self.pending.optimizer.push((p.id, s, self.device.record()?));
                }
            }
        }
        Ok(())
    }

    /// Muon on the pieces of the matrices it takes. Per unit holding one: each rank's
    /// momentum step on its pieces (elementwise: B ← μ·B + G, U = G + μ·B), the Nesterov
    /// updates laid into this rank's chunk of the unit's flat layout (zero elsewhere)
    /// and all-gathered over the unit's group (every rank's chunk is the same length:
    /// the padded layout), so every rank holds every matrix's whole U; the rank each
    /// matrix is dealt to ([`Executor::deal_fsdp_muon`]) runs its Newton–Schulz (a
    /// tensor-parallel block gathered further over `tp`, where one tp rank runs it and
    /// broadcasts it, `super::muon::orthogonalise`; under `MuonTpMode::Blockwise` the
    /// block alone, no tp call) and broadcasts the result over the group, and every
    /// rank applies its own range of it to its piece, scaled for the whole matrix (the
    /// block, under blockwise). Every rank of the group makes the same calls (a rank holding none
    /// of a matrix still gathers it and receives its broadcast). The gather moves the
    /// unit's whole flat buffer, the AdamW weights' elements as zeros: one parameter
    /// all-gather's worth per unit holding a matrix; it and the broadcasts count in the
    /// communication time.
    pub(super) fn fsdp_muon_step(&mut self) -> Result<(), ExecError> {
        let super::muon::Optimizer::Muon(mu) = self.optimizer else {
            return Ok(());
        };
        let takes = |id: TensorId| self.muon.get(id) == Some(&true);
        let dev = &self.device;
        for unit in &mut self.fsdp.units {
            if !unit.ids.iter().any(|&id| takes(id)) {
                continue;
            }
            let mut mine = dev.alloc(Elem::F32, unit.chunk)?;
            dev.zero(&mut mine)?;
            for p in unit.pieces.iter_mut().filter(|p| takes(p.id)) {
                let (Some(g), Some(b)) = (p.grad.as_ref(), p.momentum.as_mut()) else {
                    return Err(ExecError::State(format!("Muon: the FSDP piece of '{}' has no gradient or momentum", self.graph.tensors[p.id].name)));
                };
                let u = super::muon::nesterov_elems(dev, g, b, &mu)?;
                dev.copy(&mut mine, p.at, &u, 0, u.len())?;
            }
            let all = if unit.n > 1 {
                let group = self.collectives.get(&unit.group).ok_or_else(|| ExecError::State(format!("no handle for FSDP group '{}'", unit.group)))?;
                let mut all = dev.alloc(Elem::F32, unit.chunk * unit.n)?;
                self.comm.timed(group.as_ref(), dev).all_gather(&mine, &mut all)?;
                all
            } else {
                mine
            };
            for (&id, &off) in unit.ids.iter().zip(&unit.offsets) {
                if !takes(id) {
                    continue;
                }
                let start = if self.options.profile { Some(dev.record()?) } else { None };
                let (rows, cols) = super::muon::dims(&self.graph, id);
                let mut whole = dev.alloc(Elem::F32, rows * cols)?;
                dev.copy(&mut whole, 0, &all, off, rows * cols)?;
                let split = self.muon_split.get(id).copied().flatten();
                // One rank of the unit's group orthogonalises it and broadcasts the
                // result (every rank, without an owner).
                let owner = self.fsdp_muon_owner.get(id).and_then(Option::as_ref);
                let full = if owner.is_none_or(|o| o.mine) {
                    let tp = self.collectives.get("tp").map(|c| self.comm.timed(c.as_ref(), dev));
                    super::muon::orthogonalise(dev, tp.as_ref(), split, &mut whole, (rows, cols), mu.ns_steps)?
                } else {
                    split.map_or((rows, cols), |sp| sp.full)
                };
                if let Some(o) = owner {
                    let group = self.collectives.get(&o.group).ok_or_else(|| ExecError::State(format!("no handle for FSDP group '{}'", o.group)))?;
                    self.comm.timed(group.as_ref(), dev).broadcast(&mut whole, o.root)?;
                }
                if let Some(p) = unit.pieces.iter_mut().find(|p| p.id == id) {
                    let mut o = dev.alloc(Elem::F32, p.range.len())?;
                    dev.copy(&mut o, 0, &whole, p.range.start, p.range.len())?;
                    dev.muon_apply(&mut p.param, &o, &self.adam_scalars, super::muon::update_scale(full.0, full.1))?;
                }
                if let Some(s) = start {
                    self.pending.optimizer.push((id, s, dev.record()?));
                }
            }
        }
        Ok(())
    }

    /// Under Muon (`takes`: per tensor, Muon updates it), this rank's pieces of Muon's
    /// matrices trade AdamW's two moments for one momentum buffer, zeroed; the others
    /// get their moments back (zeroed), as [`Executor::set_optimizer`] does for whole
    /// weights.
    pub(super) fn fsdp_swap_moments(&mut self, takes: &[bool]) -> Result<(), ExecError> {
        for unit in &mut self.fsdp.units {
            for p in &mut unit.pieces {
                if p.grad.is_some() {
                    super::muon::swap_state(&self.device, takes.get(p.id) == Some(&true), &mut p.moments, &mut p.momentum)?;
                }
            }
        }
        Ok(())
    }

    /// Elements of the scratch [`Executor::fsdp_muon_step`] holds besides a matrix's
    /// update U (its whole copy) and Newton–Schulz's scratch, for covered weight `id` (0
    /// for others): the unit's chunk and, over more than one rank, its gathered flat
    /// buffer. (This rank's piece of the result comes after Newton–Schulz frees its
    /// scratch, which is larger.)
    pub(super) fn fsdp_muon_extra(&self, id: TensorId) -> usize {
        let Some(&(u, _)) = self.fsdp.owner.get(&id) else {
            return 0;
        };
        let unit = &self.fsdp.units[u];
        if unit.n > 1 { unit.chunk * (unit.n + 1) } else { unit.chunk }
    }

    /// The owners of the Muon matrices (`takes`) FSDP covers over more than one rank:
    /// each group's matrices dealt over its ranks by their whole matrix's Newton–Schulz
    /// work (`muon::deal`, the same on every rank of the group, whose units list the
    /// same weights), so one rank orthogonalises each and broadcasts it.
    pub(super) fn deal_fsdp_muon(&self, takes: &[bool], split: &[Option<super::muon::MuonSplit>]) -> Vec<Option<super::muon::Owner>> {
        let mut owner = vec![None; takes.len()];
        // Per group: its size, this rank's place in it, and its matrices.
        let mut groups: BTreeMap<&str, (usize, usize, Vec<TensorId>)> = BTreeMap::new();
        for unit in self.fsdp.units.iter().filter(|u| u.n > 1) {
            let g = groups.entry(unit.group.as_str()).or_insert((unit.n, unit.rank, Vec::new()));
            g.2.extend(unit.ids.iter().filter(|&&id| takes.get(id) == Some(&true)));
        }
        for (group, (n, rank, ids)) in groups {
            for (id, root) in self.deal_matrices(ids, split, n) {
                owner[id] = Some(super::muon::Owner { group: group.to_string(), root, mine: root == rank });
            }
        }
        owner
    }

    /// Elements of covered weight `id`'s piece on this rank (0 for none).
    pub(super) fn fsdp_piece_len(&self, id: TensorId) -> usize {
        self.piece(id).map_or(0, |p| p.range.len())
    }

    /// The piece of covered weight `id` on this rank, if any.
    fn piece(&self, id: TensorId) -> Option<&Piece<D::Buffer>> {
        let &(u, p) = self.fsdp.owner.get(&id)?;
        p.map(|p| &self.fsdp.units[u].pieces[p])
    }

    /// Why a whole covered weight (or gradient) cannot be read now.
    pub(super) fn sharded_error(&self, id: TensorId, what: &str, instead: &str) -> ExecError {
        let t = &self.graph.tensors[id];
        let group = self
            .fsdp
            .owner
            .get(&id)
            .map_or_else(String::new, |&(u, _)| {
                let u = &self.fsdp.units[u];
                format!("'{}' (rank {} of {})", u.group, u.rank, u.n)
            });
        let held = self.piece(id).map_or_else(
            || "none of it".to_string(),
            |p| format!("elements {:?}", p.range),
        );
        ExecError::State(format!(
            "the {what} of '{}' is sharded over FSDP group {group}: this rank holds {held} \
             of {}; {instead}",
            t.name,
            t.numel()
        ))
    }

    /// Write the whole value `data` of covered weight `id`: this rank keeps its piece
    /// (and the gathered copy, while there is one, takes all of it).
    pub(super) fn fsdp_set_weight(&mut self, id: TensorId, data: &[f32]) -> Result<(), ExecError> {
        let numel = self.graph.tensors[id].numel() as usize;
        if data.len() != numel {
            return Err(ExecError::Input(format!(
                "'{}' holds {numel} elements, got {}",
                self.graph.tensors[id].name,
                data.len()
            )));
        }
        if let Some(&(u, Some(p))) = self.fsdp.owner.get(&id) {
            let piece = &mut self.fsdp.units[u].pieces[p];
            self.device
                .write_f32(&mut piece.param, &data[piece.range.clone()])?;
        }
        if let Some(b) = self.vals[id].as_mut() {
            self.device.write_f32(b, data)?;
        }
        Ok(())
    }

    /// This rank's part of weight `name`: the element range (of the flattened tensor) it
    /// holds and its values. A weight FSDP does not shard is held whole; a rank may hold
    /// none of a small sharded weight (an empty range).
    ///
    /// # Errors
    /// Unknown name or not a weight.
    pub fn weight_shard(&self, name: &str) -> Result<Shard, ExecError> {
        let id = self.id(name)?;
        if !self.fsdp_covers(id) {
            let w = self.weight(name)?;
            return Ok((0..w.len(), w));
        }
        match self.piece(id) {
            Some(p) => Ok((p.range.clone(), self.device.read_f32(&p.param)?)),
            None => Ok((0..0, Vec::new())),
        }
    }

    /// This rank's part of the reduced gradient of weight `name` (after
    /// [`Executor::reduce_gradients`]), as [`Executor::weight_shard`]; `None` for a weight
    /// without one. A weight FSDP does not shard: [`Executor::grad`].
    ///
    /// # Errors
    /// Unknown name.
    pub fn grad_shard(&self, name: &str) -> Result<Option<Shard>, ExecError> {
        let id = self.id(name)?;
        if !self.fsdp_covers(id) {
            return Ok(self.grad(name)?.map(|g| (0..g.len(), g)));
        }
        if !self.plan.needs_grad[id] {
            return Ok(None);
        }
        match self.piece(id) {
            Some(p) => match &p.grad {
                Some(g) => Ok(Some((p.range.clone(), self.device.read_f32(g)?))),
                None => Ok(None),
            },
            None => Ok(Some((0..0, Vec::new()))),
        }
    }

    /// Every weight of this rank's graph, whole, by name: the sharded ones all-gathered
    /// over their FSDP group, the others read. Not timed as step communication and
    /// allocates nothing on the device.
    ///
    /// A collective call on an FSDP rank: every rank of each FSDP group must make it
    /// (in the same order as their other calls on that group).
    ///
    /// # Errors
    /// A collective failed.
    pub fn gather_weights(&self) -> Result<HashMap<String, Vec<f32>>, ExecError> {
        let mut out = HashMap::new();
        for u in 0..self.fsdp.units.len() {
            let flat = self.device.read_f32(&self.gather_unit(u, false, false)?)?;
            self.split_unit(u, &flat, |_| true, &mut out);
        }
        for (id, t) in self.graph.tensors.iter().enumerate() {
            if t.kind.is_param() && !self.fsdp_covers(id) {
                out.insert(t.name.clone(), self.weight(&t.name)?);
            }
        }
        Ok(out)
    }

    /// Every weight gradient the step's reduction left, whole, by name: on an FSDP rank
    /// after [`Executor::reduce_gradients`], the sharded weights' reduced gradients
    /// all-gathered over their group, the others' as [`Executor::grad`] reads them.
    /// Without FSDP it is every gradient of [`Executor::grad`]. A collective call, as
    /// [`Executor::gather_weights`].
    ///
    /// # Errors
    /// On an FSDP rank, the last backward's gradients not reduced yet; a collective
    /// failed.
    pub fn gather_grads(&self) -> Result<HashMap<String, Vec<f32>>, ExecError> {
        if self.fsdp_sharded() && !self.comm.reduced {
            return Err(ExecError::State(
                "gather_grads on an FSDP rank reads the reduced gradient shards: run \
                 reduce_gradients first"
                    .into(),
            ));
        }
        let mut out = HashMap::new();
        for u in 0..self.fsdp.units.len() {
            let flat = self.device.read_f32(&self.gather_unit(u, true, false)?)?;
            let needs = &self.plan.needs_grad;
            self.split_unit(u, &flat, |id| needs[id], &mut out);
        }
        for (id, t) in self.graph.tensors.iter().enumerate() {
            if t.kind == TensorKind::Weight
                && !self.fsdp_covers(id)
                && let Some(g) = self.grad(&t.name)?
            {
                out.insert(t.name.clone(), g);
            }
        }
        Ok(out)
    }

    /// Cut unit `u`'s gathered flat buffer into its weights (those `keep` accepts).
    fn split_unit(
        &self,
        u: usize,
        flat: &[f32],
        keep: impl Fn(TensorId) -> bool,
        out: &mut HashMap<String, Vec<f32>>,
    ) {
        let unit = &self.fsdp.units[u];
        for (&id, &off) in unit.ids.iter().zip(&unit.offsets) {
            if keep(id) {
                let n = self.graph.tensors[id].numel() as usize;
                out.insert(
                    self.graph.tensors[id].name.clone(),
                    flat[off..off + n].to_vec(),
                );
            }
        }
    }
}
