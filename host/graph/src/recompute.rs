//! Activation recomputation: which forward tensors a rank keeps for the backward pass
//! under a [`RecomputePolicy`], what they cost in memory, and the forward FLOPs the
//! backward repeats (the same figure [`count::hardware_flops_per_step`] adds, by
//! construction).
//!
//! Conventions (Korthikanti et al. 2022, modeling.md §2.5):
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

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::count::{self, AttentionFlops, Convention, Recompute};
use crate::ir::{Graph, Op, OpKind, TensorId, TensorKind};
use crate::shard::{Layout, RankCoord, shard};

/// Which forward work the backward pass recomputes instead of storing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecomputePolicy {
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

/// The activation inputs (and outputs) an op's backward reads, before policy.
fn reads(op: &Op) -> Vec<TensorId> {
    let i = |k: usize| op.inputs.get(k).copied();
    let picked: Vec<Option<TensorId>> = match op.kind {
        OpKind::Linear | OpKind::RmsNorm | OpKind::LayerNorm | OpKind::Gelu | OpKind::SquaredRelu => vec![i(0)],
        OpKind::CrossEntropy | OpKind::Router => vec![i(0)],
        OpKind::SwiGlu | OpKind::GeGlu => vec![i(0), i(1)],
        OpKind::GroupedLinear => vec![i(0), i(2)],
        OpKind::MoeDispatch => vec![i(1)],
        OpKind::MoeCombine => vec![i(0), i(1), i(2)],
        OpKind::Attention => vec![i(0), i(1), i(2), op.outputs.first().copied()],
        OpKind::Embedding
        | OpKind::Rotary
        | OpKind::Add
        | OpKind::Concat
        | OpKind::AllReduce
        | OpKind::AllGather
        | OpKind::ReduceScatter
        | OpKind::AllToAll
        | OpKind::Send
        | OpKind::Recv => vec![],
    };
    picked.into_iter().flatten().collect()
}

/// Per kept tensor, the layer of the first op that keeps it, in op order.
fn kept(g: &Graph, policy: RecomputePolicy) -> (Vec<(TensorId, i32)>, Vec<TensorId>) {
    let mut producer: HashMap<TensorId, &Op> = HashMap::new();
    for op in &g.ops {
        for &o in &op.outputs {
            producer.insert(o, op);
        }
    }
    // A gathered tensor is kept as the shard it was gathered from.
    let source = |mut id: TensorId| {
        while let Some(p) = producer.get(&id).filter(|p| p.kind == OpKind::AllGather) {
            match p.inputs.first() {
                Some(&x) => id = x,
                None => break,
            }
        }
        id
    };
    let is_act = |id: TensorId| g.tensors.get(id).is_some_and(|t| t.kind == TensorKind::Activation);
    let mut stored: Vec<(TensorId, i32)> = Vec::new();
    let mut dropped: Vec<TensorId> = Vec::new();
    let mut seen: HashSet<TensorId> = HashSet::new();
    let mut seen_dropped: HashSet<TensorId> = HashSet::new();
    let mut keep = |id: TensorId, layer: i32, stored: &mut Vec<(TensorId, i32)>| {
        if seen.insert(id) {
            stored.push((id, layer));
        }
    };
    for op in &g.ops {
        let needed: Vec<TensorId> = reads(op).into_iter().map(source).filter(|&t| is_act(t)).collect();
        if policy == RecomputePolicy::Full && op.layer >= 0 {
            // Only the layer's inputs survive; everything made inside it is recomputed.
            for &x in &op.inputs {
                let inside = producer.get(&x).is_some_and(|p| p.layer == op.layer && p.kind != OpKind::Recv);
                if is_act(x) && !inside {
                    keep(x, op.layer, &mut stored);
                }
            }
            for t in needed {
                let inside = producer.get(&t).is_some_and(|p| p.layer == op.layer && p.kind != OpKind::Recv);
                if inside && seen_dropped.insert(t) {
                    dropped.push(t);
                }
            }
        } else {
            for t in needed {
                keep(t, op.layer, &mut stored);
            }
        }
    }
    let stored_set: HashSet<TensorId> = stored.iter().map(|(t, _)| *t).collect();
    dropped.retain(|t| !stored_set.contains(t));
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

/// Bytes of the activations one micro-batch of `g` keeps for the backward.
pub fn stored_bytes(g: &Graph, policy: RecomputePolicy) -> f64 {
    kept(g, policy).0.iter().map(|&(t, _)| bytes(g, t)).sum()
}

/// [`stored_bytes`] by layer (of the first op that keeps each tensor; -1: embedding,
/// head and loss).
pub fn layer_bytes(g: &Graph, policy: RecomputePolicy) -> BTreeMap<i32, f64> {
    let mut out = BTreeMap::new();
    for (t, layer) in kept(g, policy).0 {
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
