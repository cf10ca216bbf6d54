//! Activation recomputation: which forward tensors a rank keeps for the backward pass
//! under a [`RecomputePolicy`], what they cost in memory, and the forward FLOPs the
//! backward repeats (the same figure [`count::hardware_flops_per_step`] adds, by
//! construction).
//!
//! Conventions (Korthikanti et al. 2022, arXiv 2205.05198, §4 and Table 2):
//! - What an op keeps is Megatron's: a linear its input (for the weight gradient), a norm
//!   its input, an activation function its input(s), attention q, k, v and its output
//!   (flash-style backward), cross-entropy its logits, a router its logits, MoE dispatch
//!   and combine their routing. Adds, concatenations, rotary embeddings and collectives
//!   keep nothing. Weights and graph inputs (tokens) are not activations.
//! - A tensor an all-gather produced (the sequence-parallel gather before a
//!   column-parallel linear, the context-parallel K/V gather) is kept as its local shard
//!   and gathered again in the backward, as Megatron does; this is why TP+SP divides
//!   every term by t.
//! - Per-row fp32 statistics (norm rstd, attention and loss log-sum-exp) are left out, as
//!   Korthikanti leaves them out; they are at most a/(8h) of a layer's bytes.
//! - Our graphs have no dropout, so a GPT-style layer keeps 32·s·b·h bytes, not
//!   Korthikanti's 34 (two 1-byte masks of s·b·h); and attention is flash-style, so the
//!   5·a·s/h term (scores, softmax, its dropout) never exists. Hence for GPT-style
//!   layers with bf16 activations: none 32·sbh; TP 8·sbh + 24·sbh/t; TP+SP 32·sbh/t;
//!   selective recompute the same (it only re-runs the attention core, whose internals
//!   a flash kernel never stores); full recompute 2·sbh (2·sbh/t with SP) per layer.
//!
//! Key items: [`RecomputePolicy`], [`saved_for_backward`] → [`Saved`],
//! [`stored_bytes`], [`layer_bytes`], [`activation_bytes`], [`in_flight_micro_batches`].

use std::collections::BTreeMap;
// Tensor ids hash with FxHash; layer numbers, which a plugin chooses, with std's SipHash.
use rustc_hash::FxHashMap as HashMap;

use crate::count::{self, AttentionFlops, Convention, Recompute};
use crate::autodiff::{BackwardPlan, needs_grad};
use crate::ir::{Graph, Op, OpKind, TensorId, TensorKind};
use crate::shard::{Layout, RankCoord, shard};

/// Which forward work the backward pass recomputes instead of storing (Megatron's
/// `--recompute-granularity`; `none` when off). Written lowercase in run files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecomputePolicy {
    #[default]
    None,
    /// The attention cores (Korthikanti's selective recompute).
    Selective,
    /// Every op of every transformer layer; only each layer's input is kept.
    Full,
}

impl From<RecomputePolicy> for Recompute {
    fn from(p: RecomputePolicy) -> Recompute {
        match p {
            RecomputePolicy::None => Recompute::None,
            RecomputePolicy::Selective => Recompute::Selective,
            RecomputePolicy::Full => Recompute::Full,
        }
    }
}

/// What the forward keeps under a policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Saved {
    /// Activations kept from the forward to the backward.
    pub stored: Vec<TensorId>,
    /// Activations the backward reads but the policy drops and recomputes.
    pub recomputed: Vec<TensorId>,
    /// Matrix FLOPs of the recomputed forward, attention counted over unmasked keys (what
    /// a causal kernel does); [`recompute_flops`] takes another convention.
    pub extra_forward_flops: f64,
}

/// The activation inputs (and outputs) an op's backward reads, before policy, given
/// which of its inputs carry a gradient (`need`, per input slot): nothing when none
/// does (the op has no backward, as the ops before a LoRA fine-tune's first adapter),
/// and a linear's input only when its weight is trained (the input is for the weight
/// gradient). In a fixed array, not a vector: the templates call this for every op of
/// every sharding, three times.
fn reads(op: &Op, need: &[bool]) -> impl Iterator<Item = TensorId> {
    const NONE: [Option<TensorId>; 4] = [None; 4];
    let picked: [Option<TensorId>; 4] = if !need.iter().any(|&n| n) {
        NONE
    } else {
        let i = |k: usize| op.inputs.get(k).copied();
        let trained = |k: usize| need.get(k).copied().unwrap_or(false);
        match op.kind {
            OpKind::Linear => [i(0).filter(|_| trained(1)), None, None, None],
            OpKind::RmsNorm | OpKind::LayerNorm | OpKind::Gelu | OpKind::SquaredRelu => [i(0), None, None, None],
            OpKind::CrossEntropy | OpKind::Router => [i(0), None, None, None],
            OpKind::SwiGlu | OpKind::GeGlu => [i(0), i(1), None, None],
            OpKind::GroupedLinear => [i(0).filter(|_| trained(1)), i(2), None, None],
            OpKind::MoeDispatch => [i(1), None, None, None],
            // Megatron-Core applies the routing weights inside the experts, to the
            // activation's output (TEGroupedMLP's bias_act_func,
            // megatron/core/transformer/moe/experts.py), and the unpermute only sums: the
            // weights' gradient comes from the activation's input, which the activation
            // keeps, so nothing keeps the experts' outputs for the combine.
            OpKind::MoeCombine => [i(1), i(2), None, None],
            OpKind::Attention => [i(0), i(1), i(2), op.outputs.first().copied()],
            OpKind::CausalConv1d => [i(0), None, None, None],
            OpKind::SsmScan => [i(0), i(1), i(2), i(3)],
            OpKind::Embedding
            | OpKind::Rotary
            | OpKind::Add
            | OpKind::Concat
            | OpKind::AllReduce
            | OpKind::AllGather
            | OpKind::ReduceScatter
            | OpKind::AllToAll
            | OpKind::Send
            | OpKind::Recv => NONE,
        }
    };
    picked.into_iter().flatten()
}

/// Per op, which of its inputs carry a gradient.
fn input_needs(g: &Graph) -> InputNeeds {
    let needs = needs_grad(g);
    let mut start = Vec::with_capacity(g.ops.len() + 1);
    let mut flags = Vec::with_capacity(g.ops.iter().map(|op| op.inputs.len()).sum());
    start.push(0);
    for op in &g.ops {
        flags.extend(op.inputs.iter().map(|&i| needs.get(i).copied().unwrap_or(false)));
        start.push(flags.len());
    }
    InputNeeds { flags, start }
}

/// Per op, which of its inputs carry a gradient: op i's are `flags[start[i]..start[i + 1]]`
/// (one list for the graph, where a vector per op was an allocation each).
struct InputNeeds {
    flags: Vec<bool>,
    start: Vec<usize>,
}

impl std::ops::Index<usize> for InputNeeds {
    type Output = [bool];

    fn index(&self, op: usize) -> &[bool] {
        &self.flags[self.start[op]..self.start[op + 1]]
    }
}

/// The op that writes each tensor, by tensor id (the last if several do).
fn producers(g: &Graph) -> Vec<Option<&Op>> {
    let mut producer: Vec<Option<&Op>> = vec![None; g.tensors.len()];
    for op in &g.ops {
        for &o in &op.outputs {
            if let Some(p) = producer.get_mut(o) {
                *p = Some(op);
            }
        }
    }
    producer
}

/// A gathered tensor is kept as the shard it was gathered from.
fn gather_source(producer: &[Option<&Op>], mut id: TensorId) -> TensorId {
    while let Some(p) = producer.get(id).copied().flatten().filter(|p| p.kind == OpKind::AllGather) {
        match p.inputs.first() {
            Some(&x) => id = x,
            None => break,
        }
    }
    id
}

fn kept(g: &Graph, policy: RecomputePolicy) -> (Vec<(TensorId, i32)>, Vec<TensorId>) {
    kept_given(g, policy, &input_needs(g))
}

/// [`kept`] with `need` (per op, which inputs carry a gradient) already worked out.
fn kept_given(g: &Graph, policy: RecomputePolicy, need: &InputNeeds) -> (Vec<(TensorId, i32)>, Vec<TensorId>) {
    let producer = producers(g);
    let source = |id: TensorId| gather_source(&producer, id);
    let is_act = |id: TensorId| g.tensors.get(id).is_some_and(|t| t.kind == TensorKind::Activation);
    let mut stored: Vec<(TensorId, i32)> = Vec::new();
    let mut dropped: Vec<TensorId> = Vec::new();
    // By tensor id (every id kept or dropped is an activation of `g`): which are stored,
    // and which dropped so far.
    let mut seen = vec![false; g.tensors.len()];
    let mut seen_dropped = vec![false; g.tensors.len()];
    let mut keep = |id: TensorId, layer: i32, stored: &mut Vec<(TensorId, i32)>| {
        if !std::mem::replace(&mut seen[id], true) {
            stored.push((id, layer));
        }
    };
    for (oi, op) in g.ops.iter().enumerate() {
        let needed = reads(op, &need[oi]).map(source).filter(|&t| is_act(t));
        if policy == RecomputePolicy::Full && op.layer >= 0 {
            // Only the layer's inputs survive; everything made inside it is recomputed.
            for &x in &op.inputs {
                let inside = producer.get(x).copied().flatten().is_some_and(|p| p.layer == op.layer && p.kind != OpKind::Recv);
                if is_act(x) && !inside {
                    keep(x, op.layer, &mut stored);
                }
            }
            for t in needed {
                let inside = producer.get(t).copied().flatten().is_some_and(|p| p.layer == op.layer && p.kind != OpKind::Recv);
                if inside && !std::mem::replace(&mut seen_dropped[t], true) {
                    dropped.push(t);
                }
            }
        } else {
            for t in needed {
                keep(t, op.layer, &mut stored);
            }
        }
    }
    dropped.retain(|&t| !seen[t]);
    (stored, dropped)
}

/// Which activations of `g` (a logical or sharded graph, one micro-batch) are stored and
/// which recomputed under `policy`, and the forward FLOPs recomputation adds.
///
/// Selective recompute stores the same graph tensors as none: it re-runs the attention
/// cores, whose internals (scores, probabilities) are not graph tensors and which a
/// flash-style kernel never stores; it costs their forward FLOPs and saves the
/// statistics.
pub fn saved_for_backward(g: &Graph, policy: RecomputePolicy) -> Saved {
    let (stored, recomputed) = kept(g, policy);
    Saved {
        stored: stored.into_iter().map(|(t, _)| t).collect(),
        recomputed,
        extra_forward_flops: recompute_flops(g, policy, AttentionFlops::CausalHalved),
    }
}

/// Forward matrix FLOPs the backward repeats under `policy` (one micro-batch): exactly
/// `hardware_flops_per_step - model_flops_per_step` of [`count`].
pub fn recompute_flops(g: &Graph, policy: RecomputePolicy, attention: AttentionFlops) -> f64 {
    let conv = Convention { attention, recompute: policy.into() };
    count::hardware_flops_per_step(g, &conv) - count::model_flops_per_step(g, &conv)
}

fn bytes(g: &Graph, id: TensorId) -> f64 {
    g.tensors.get(id).map_or(0.0, |t| t.numel() as f64 * t.dtype.bytes())
}

/// One activation the forward keeps with no recompute, and who keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Kept {
    pub tensor: TensorId,
    /// The layer of the first op that keeps it (-1: embedding, head and loss).
    pub layer: i32,
    /// The ops whose backward reads it: (op index, which of its inputs; `usize::MAX`
    /// for an output the op keeps, as attention keeps its own).
    pub by: Vec<(usize, usize)>,
}

/// The activations one micro-batch of `g` keeps for the backward with no recompute, in
/// the order [`stored_bytes`] counts them, with the ops that keep each (what a precision
/// recipe needs to know: a low-precision GEMM keeps its own cast copy of its input).
pub fn kept_by(g: &Graph) -> Vec<Kept> {
    let need = input_needs(g);
    let (stored, _) = kept_given(g, RecomputePolicy::None, &need);
    kept_by_given(g, &need, stored)
}

/// [`kept_by`] and [`layer_bytes`] under none, selective and full recompute (in that
/// order), float for float, with what they share worked out once: which inputs carry a
/// gradient, and the list kept with no recompute. The projection's templates read all
/// four for every sharding the search tries; called one by one they worked each out
/// three or four times.
pub fn kept_and_layer_bytes(g: &Graph) -> (Vec<Kept>, [BTreeMap<i32, f64>; 3]) {
    let need = input_needs(g);
    let (stored, _) = kept_given(g, RecomputePolicy::None, &need);
    let none = bytes_by_layer(g, &stored);
    // `kept_given` tells the policies apart only for full recompute: selective keeps
    // exactly what none keeps (see `saved_for_backward`).
    let selective = none.clone();
    let full = bytes_by_layer(g, &kept_given(g, RecomputePolicy::Full, &need).0);
    (kept_by_given(g, &need, stored), [none, selective, full])
}

/// [`kept_by`] from `need` and the list `stored` with no recompute, already worked out.
fn kept_by_given(g: &Graph, need: &InputNeeds, stored: Vec<(TensorId, i32)>) -> Vec<Kept> {
    let at: HashMap<TensorId, usize> = stored.iter().enumerate().map(|(i, (t, _))| (*t, i)).collect();
    let mut out: Vec<Kept> = stored.into_iter().map(|(tensor, layer)| Kept { tensor, layer, by: Vec::new() }).collect();
    let producer = producers(g);
    for (i, op) in g.ops.iter().enumerate() {
        for t in reads(op, &need[i]) {
            let slot = op.inputs.iter().position(|&x| x == t).unwrap_or(usize::MAX);
            // Ops come in order, so this op's entries are the list's last: only those can
            // repeat (an op reading one tensor twice). Scanning the whole list made a
            // tensor read by n ops cost n^2.
            if let Some(&k) = at.get(&gather_source(&producer, t))
                && !out[k].by.iter().rev().take_while(|&&(j, _)| j == i).any(|&e| e == (i, slot))
            {
                out[k].by.push((i, slot));
            }
        }
    }
    out
}

/// Bytes of the activations one micro-batch of `g` keeps for the backward.
pub fn stored_bytes(g: &Graph, policy: RecomputePolicy) -> f64 {
    kept(g, policy).0.iter().map(|&(t, _)| bytes(g, t)).sum()
}

/// [`stored_bytes`] by layer (of the first op that keeps each tensor; -1: embedding,
/// head and loss).
pub fn layer_bytes(g: &Graph, policy: RecomputePolicy) -> BTreeMap<i32, f64> {
    bytes_by_layer(g, &kept(g, policy).0)
}

/// The bytes of the tensors `stored` keeps, summed per layer in the list's order.
fn bytes_by_layer(g: &Graph, stored: &[(TensorId, i32)]) -> BTreeMap<i32, f64> {
    let mut out = BTreeMap::new();
    for &(t, layer) in stored {
        *out.entry(layer).or_insert(0.0) += bytes(g, t);
    }
    out
}

/// Micro-batches whose activations the first pipeline stage holds at once under 1F1B:
/// pp (so the first stage holds L layers' worth), times 1 + (pp−1)/(pp·vp) when
/// interleaved, scaled by m/pp when there are fewer micro-batches than stages (Megatron's
/// theoretical_memory_usage.py).
pub fn in_flight_micro_batches(layout: &Layout) -> f64 {
    if layout.pp <= 1 {
        return 1.0;
    }
    let (p, v) = (f64::from(layout.pp), f64::from(layout.vp.max(1)));
    let m = f64::from(layout.micro_batches());
    let interleave = if layout.vp > 1 { 1.0 + (p - 1.0) / (p * v) } else { 1.0 };
    p * interleave * (m / p).min(1.0)
}

/// Peak activation bytes of one rank: the first pipeline stage (the most loaded under
/// 1F1B) of logical graph `g` sharded for `layout`, times the micro-batches in flight.
///
/// # Errors
/// The layout does not fit the graph (see [`Layout::validate`]).
pub fn activation_bytes(g: &Graph, layout: &Layout, policy: RecomputePolicy) -> Result<f64, String> {
    let s = shard(g, layout, RankCoord::default())?;
    Ok(stored_bytes(&s.graph, policy) * in_flight_micro_batches(layout))
}

/// How an executor carries out a [`RecomputePolicy`] for one graph and its
/// [`BackwardPlan`]: which forward ops it re-runs inside the backward, and when it frees
/// each activation. With [`RecomputePolicy::None`] the lists are the plan's own.
///
/// The re-run unit is a segment: the ops of one transformer layer under
/// [`RecomputePolicy::Full`] (sends and receives excepted, which move data between
/// pipeline stages and are never repeated), each attention core under
/// [`RecomputePolicy::Selective`]. These are exactly the ops whose forward FLOPs
/// [`count::hardware_flops_per_step`] adds, so what the executor re-runs and what the
/// counter charges agree by construction. A segment is re-run once, right before the
/// first backward step of any of its ops (Megatron's checkpointed block), from the
/// inputs it read in the forward, which stay live.
///
/// An activation made inside a segment is dropped after the forward (and regenerated
/// by the re-run) when only that segment's backward steps read it and no other segment
/// reads it; op statistics (norm rstd, attention log-sum-exp) of segment ops are
/// dropped too. Intermediates the re-run makes only to feed later ops of the segment
/// are freed as soon as the segment no longer reads them.
#[derive(Clone, Debug, PartialEq)]
pub struct RecomputeSchedule {
    pub policy: RecomputePolicy,
    /// Forward op indices re-run in the backward, each segment in forward order.
    pub segments: Vec<Vec<usize>>,
    /// Per backward step: the segment to re-run right before it.
    pub rerun_before_step: Vec<Option<usize>>,
    /// Per forward op: activations freed right after it.
    pub free_after_forward: Vec<Vec<TensorId>>,
    /// Per forward op: whether its statistics are kept from the forward to its backward
    /// step (false for segment ops: the re-run makes them again).
    pub keep_aux: Vec<bool>,
    /// Per forward op: whether a re-run keeps its statistics (the op has a backward step
    /// to read them).
    pub rerun_keeps_aux: Vec<bool>,
    /// Per segment, per position in it: activations freed right after that op re-runs.
    pub free_after_rerun: Vec<Vec<Vec<TensorId>>>,
    /// Per backward step: activations no later step or re-run reads.
    pub free_saved_after_step: Vec<Vec<TensorId>>,
    /// Activations the forward drops and the re-runs regenerate.
    pub dropped: Vec<TensorId>,
}

/// The [`RecomputeSchedule`] of `g` (with backward plan `plan`) under `policy`.
pub fn schedule(g: &Graph, plan: &BackwardPlan, policy: RecomputePolicy) -> RecomputeSchedule {
    let nops = g.ops.len();
    let nt = g.tensors.len();
    let nsteps = plan.steps.len();
    let in_segment = |op: &Op| match policy {
        RecomputePolicy::None => false,
        RecomputePolicy::Selective => op.kind == OpKind::Attention,
        RecomputePolicy::Full => op.layer >= 0 && !matches!(op.kind, OpKind::Send | OpKind::Recv),
    };
    let mut step_of: Vec<Option<usize>> = vec![None; nops];
    for (si, s) in plan.steps.iter().enumerate() {
        step_of[s.op] = Some(si);
    }
    // Segments in forward order; one per layer (Full) or per attention op (Selective).
    let mut segments: Vec<Vec<usize>> = Vec::new();
    let mut by_layer: std::collections::HashMap<i32, usize> = std::collections::HashMap::new();
    for (oi, op) in g.ops.iter().enumerate() {
        if !in_segment(op) {
            continue;
        }
        if policy == RecomputePolicy::Full {
            let s = *by_layer.entry(op.layer).or_insert_with(|| {
                segments.push(Vec::new());
                segments.len() - 1
            });
            segments[s].push(oi);
        } else {
            segments.push(vec![oi]);
        }
    }
    // A segment none of whose ops has a backward step is never needed again.
    segments.retain(|s| s.iter().any(|&oi| step_of[oi].is_some()));
    let mut seg_of: Vec<Option<usize>> = vec![None; nops];
    let mut rerun_before_step = vec![None; nsteps];
    for (s, ops) in segments.iter().enumerate() {
        for &oi in ops {
            seg_of[oi] = Some(s);
        }
        if let Some(trigger) = ops.iter().filter_map(|&oi| step_of[oi]).min() {
            rerun_before_step[trigger] = Some(s);
        }
    }
    let trigger_of: Vec<usize> = segments
        .iter()
        .map(|ops| ops.iter().filter_map(|&oi| step_of[oi]).min().unwrap_or(0))
        .collect();

    let producer = g.producers();
    let mut last_fwd: Vec<Option<usize>> = vec![None; nt];
    // Segments (other than the producer's) whose ops read each tensor, each once: listed
    // as met, then sorted and deduplicated (a search of the list per reader was quadratic
    // in a tensor read by many layers).
    let mut seg_readers: Vec<Vec<usize>> = vec![Vec::new(); nt];
    for (oi, op) in g.ops.iter().enumerate() {
        for &t in &op.outputs {
            last_fwd[t] = Some(oi);
        }
        for &t in &op.inputs {
            last_fwd[t] = Some(oi);
            if let Some(s) = seg_of[oi]
                && seg_readers[t].last() != Some(&s)
            {
                seg_readers[t].push(s);
            }
        }
    }
    for readers in &mut seg_readers {
        readers.sort_unstable();
        readers.dedup();
    }
    let mut bwd_readers: Vec<Vec<usize>> = vec![Vec::new(); nt];
    for (si, s) in plan.steps.iter().enumerate() {
        for &t in &s.saved {
            bwd_readers[t].push(si);
        }
    }

    let mut free_after_forward = vec![Vec::new(); nops];
    let mut free_saved_after_step = vec![Vec::new(); nsteps];
    let mut dropped = Vec::new();
    let mut is_dropped = vec![false; nt];
    for (t, tensor) in g.tensors.iter().enumerate() {
        if tensor.kind != TensorKind::Activation || t == g.loss {
            continue;
        }
        let own = producer[t].and_then(|p| seg_of[p]);
        let drop = own.is_some_and(|s| {
            !bwd_readers[t].is_empty()
                && bwd_readers[t].iter().all(|&si| seg_of[plan.steps[si].op] == Some(s))
                && seg_readers[t].iter().all(|&r| r == s)
        });
        // The last step before (or at) which this tensor is read in the backward: by a
        // step, or by the re-run of another segment (which runs before its trigger).
        let last_bwd = bwd_readers[t]
            .iter()
            .copied()
            .chain(
                seg_readers[t]
                    .iter()
                    .filter(|&&s| Some(s) != own)
                    .map(|&s| trigger_of[s]),
            )
            .max();
        if drop {
            is_dropped[t] = true;
            dropped.push(t);
            if let Some(o) = last_fwd[t] {
                free_after_forward[o].push(t);
            }
        } else if last_bwd.is_none()
            && let Some(o) = last_fwd[t]
        {
            free_after_forward[o].push(t);
        }
        if let Some(si) = last_bwd {
            free_saved_after_step[si].push(t);
        }
    }
    // Inside a re-run: an output no step will read (and not kept from the forward) is
    // an intermediate, freed after its last reader in the segment.
    // The step after which each kept tensor is freed in the backward.
    let mut freed_after: Vec<Option<usize>> = vec![None; nt];
    for (si, ts) in free_saved_after_step.iter().enumerate() {
        for &t in ts {
            freed_after[t] = Some(si);
        }
    }
    // Inside a re-run: an output still live from the forward is left alone (the
    // executor discards the copy); a dropped one is kept for its steps; anything else
    // (an intermediate, or a kept tensor whose last reader has already run) is freed
    // after its last reader in the segment.
    let free_after_rerun = segments
        .iter()
        .zip(&trigger_of)
        .map(|(ops, &trigger)| {
            let mut free = vec![Vec::new(); ops.len()];
            // Each tensor's last reader in the segment, in one pass: a backward scan of
            // the segment per output was quadratic in a layer's operations (a plugin may
            // put 60,000 in one layer: 7 s).
            let mut last_read: std::collections::HashMap<TensorId, usize> = std::collections::HashMap::new();
            for (pos, &oi) in ops.iter().enumerate() {
                for &t in &g.ops[oi].inputs {
                    last_read.insert(t, pos);
                }
            }
            for (pos, &oi) in ops.iter().enumerate() {
                for &t in &g.ops[oi].outputs {
                    let live = !is_dropped[t] && freed_after[t].is_some_and(|si| si >= trigger);
                    if live || is_dropped[t] || t == g.loss {
                        continue;
                    }
                    let last = last_read.get(&t).copied().unwrap_or(pos).max(pos);
                    free[last].push(t);
                }
            }
            free
        })
        .collect();
    let keep_aux = (0..nops).map(|oi| seg_of[oi].is_none()).collect();
    let rerun_keeps_aux = step_of.iter().map(Option::is_some).collect();
    RecomputeSchedule {
        policy,
        segments,
        rerun_before_step,
        free_after_forward,
        keep_aux,
        rerun_keeps_aux,
        free_after_rerun,
        free_saved_after_step,
        dropped,
    }
}
