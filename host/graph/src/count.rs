//! The one canonical FLOP, byte and parameter counter. Projection, MFU reports and the
//! published-figure checks all read a graph through these functions, so a convention
//! (causal attention halved or not, recompute counted or not) is chosen once, printed by
//! [`Convention`]'s `Display`, and never silently differs between two reports.
//!
//! Conventions, all per graph (one micro-batch of B sequences of T tokens):
//! - Matrix ("model") FLOPs: `linear` 2·M·N·K with M = x.numel/K; `grouped-linear`
//!   2·(N·k)·Nout·K; `attention` 2·B·H·T·T_eff·D (QKᵀ) + 2·B·H·T·T_eff·Dv (PV). Bias adds,
//!   softmax and everything elementwise are *vector* FLOPs and are excluded from model
//!   FLOPs, as Megatron does. `embedding` lookups are 0.
//! - T_eff: [`AttentionFlops::Full`] counts every key (T, or the window when windowed);
//!   [`AttentionFlops::CausalHalved`] counts T/2 for full causal attention (Megatron-Bridge
//!   and NeMo's published "model TFLOP/s") and the exact mean number of unmasked keys for a
//!   sliding window, w - w(w-1)/(2T) for w < T.
//! - Backward = 2x forward for matrix ops (input and weight gradients; for attention dQ,
//!   dK, dV, dP), so model FLOPs per step = 3x forward; a GEMM of a frozen weight
//!   ([`TensorKind::Frozen`], a LoRA fine-tune's base weights) has no weight gradient,
//!   so its backward is 1x forward (the 2/3-of-training convention NeMo's LoRA MFU uses).
//! - Hardware FLOPs add the recomputed forward: [`Recompute::Selective`] re-runs the
//!   attention cores, [`Recompute::Full`] every op inside the transformer layers.
//! - Bytes: forward reads + writes at each tensor's dtype; an embedding reads only the
//!   gathered rows; a grouped linear reads every expert's weights.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::fmt;

use crate::ir::{Graph, Op, OpKind, TensorId, TensorKind};

/// How attention score/value FLOPs are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionFlops {
    /// Every query against every key of its (window of the) sequence, masked or not.
    /// The convention of the DGXC Llama 3.1, GPT-3 and Nemotron-4 README formulas.
    Full,
    /// Only unmasked keys: T/2 per query for causal attention. The convention of the
    /// Megatron-Bridge / NeMo performance tables.
    CausalHalved,
}

/// Which forward work the backward pass recomputes (hardware FLOPs only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recompute {
    None,
    /// Attention cores only (Korthikanti et al. 2022 selective recompute).
    Selective,
    /// The whole forward of every transformer layer.
    Full,
}

/// A FLOP-counting convention. `Display` prints it in words for reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Convention {
    pub attention: AttentionFlops,
    pub recompute: Recompute,
}

impl Convention {
    /// The DGXC README convention (non-causal attention, no recompute).
    pub const FULL: Convention = Convention { attention: AttentionFlops::Full, recompute: Recompute::None };
    /// The Megatron-Bridge/NeMo table convention (causal-halved attention, no recompute).
    pub const CAUSAL: Convention = Convention { attention: AttentionFlops::CausalHalved, recompute: Recompute::None };
}

impl fmt::Display for Convention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let attn = match self.attention {
            AttentionFlops::Full => "attention counted over all T keys (non-causal, as the DGXC READMEs)",
            AttentionFlops::CausalHalved => "attention counted over unmasked keys only (causal T/2, as Megatron-Bridge)",
        };
        let rc = match self.recompute {
            Recompute::None => "no recompute",
            Recompute::Selective => "hardware FLOPs add recomputed attention cores",
            Recompute::Full => "hardware FLOPs add a recomputed forward of every layer",
        };
        write!(f, "{attn}; backward = 2x forward for matrix ops; elementwise ops excluded; {rc}")
    }
}

/// Parameter counts from the graph's weight tensors (each tensor once, so a tied
/// embedding counts once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamCount {
    /// Every weight element.
    pub total: u64,
    /// Weights one token uses: routed-expert weights (inputs of `grouped-linear`) count
    /// top-k/E of their elements, with top-k from the router that produced the op's indices
    /// and E from the weight's first axis; everything else counts fully.
    pub active: u64,
    /// Tables read by `embedding` ops (token and learned-position tables).
    pub embedding: u64,
    /// Elements of the trained weights (all of `total` unless some are frozen, as a
    /// LoRA fine-tune's base weights are).
    pub trainable: u64,
}

/// Work and traffic of one operation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpCost {
    /// Forward FLOPs: matrix FLOPs for matrix ops, vector FLOPs for the rest.
    pub fwd_flops: f64,
    /// Backward FLOPs under the same split.
    pub bwd_flops: f64,
    /// Forward bytes read and written at tensor dtypes.
    pub bytes: f64,
    /// Whether the FLOPs run on the matrix engine (and count as model FLOPs).
    pub matrix: bool,
}

fn numel(g: &Graph, id: TensorId) -> f64 {
    g.tensors.get(id).map_or(0.0, |t| t.numel() as f64)
}

fn dims(g: &Graph, id: TensorId) -> &[u64] {
    g.tensors.get(id).map_or(&[], |t| t.shape.as_slice())
}

fn bytes_of(g: &Graph, id: TensorId) -> f64 {
    g.tensors.get(id).map_or(0.0, |t| t.numel() as f64 * t.dtype.bytes())
}

fn input(op: &Op, i: usize) -> Option<TensorId> {
    op.inputs.get(i).copied()
}

/// Mean keys attended per query.
fn t_eff(t: f64, window: f64, conv: AttentionFlops, causal: bool) -> f64 {
    let windowed = window > 0.0 && window < t;
    match (conv, causal, windowed) {
        (AttentionFlops::Full, _, false) => t,
        (AttentionFlops::Full, _, true) => window,
        (AttentionFlops::CausalHalved, false, false) => t,
        (AttentionFlops::CausalHalved, false, true) => window,
        (AttentionFlops::CausalHalved, true, false) => t / 2.0,
        // Query i sees min(i+1, w) keys: (w(w+1)/2 + (T-w)w)/T = w - w(w-1)/(2T).
        (AttentionFlops::CausalHalved, true, true) => window - window * (window - 1.0) / (2.0 * t),
    }
}

/// Attention forward matrix FLOPs.
fn attention_flops(g: &Graph, op: &Op, conv: AttentionFlops) -> f64 {
    let (Some(q), Some(v)) = (input(op, 0), input(op, 2)) else { return 0.0 };
    let (q, v) = (dims(g, q), dims(g, v));
    if q.len() != 4 || v.len() != 4 {
        return 0.0;
    }
    let (b, t, h, d) = (q[0] as f64, q[1] as f64, q[2] as f64, q[3] as f64);
    let dv = v[3] as f64;
    let window = op.int("window").unwrap_or(0).max(0) as f64;
    let causal = op.flag("causal").unwrap_or(true);
    // Keys come from v's T: under context parallelism q holds T/cp tokens and k/v the
    // gathered T (load-balanced, so a causal rank still sees T/2 keys per query on average).
    let te = t_eff(v[1] as f64, window, conv, causal);
    2.0 * b * h * t * te * (d + dv)
}

/// Forward matrix FLOPs of Mamba-2's chunked SSD algorithm (Dao and Gu, arXiv
/// 2405.21060, section 6), as its GPU kernels run it with chunks of Q = `chunk` tokens:
/// per chunk and group the scores C·Bᵀ (2·Q²·N), per chunk and head the masked scores
/// times x (2·Q²·P), the chunk's state Bᵀ·x (2·Q·N·P) and the output from the states
/// entering it (2·Q·N·P); the recurrence over chunk states is negligible.
pub fn ssm_scan_flops(g: &Graph, op: &Op) -> f64 {
    let Some(Ssd { bs, t, h, p, gr, n, q, .. }) = ssd(g, op) else { return 0.0 };
    bs * (gr * 2.0 * t * q * n + h * (2.0 * t * q * p + 4.0 * t * n * p))
}

/// A scan's sizes: batch, tokens, heads, head dim, groups, state, and the chunk `q` (the
/// op's `chunk`, at most the sequence) with the chunks it makes (a part chunk counts).
struct Ssd {
    bs: f64,
    t: f64,
    h: f64,
    p: f64,
    gr: f64,
    n: f64,
    q: f64,
    chunks: f64,
}

fn ssd(g: &Graph, op: &Op) -> Option<Ssd> {
    let (x, b) = (input(op, 0)?, input(op, 2)?);
    let (&[bs, t, h, p], &[_, _, gr, n]) = (dims(g, x), dims(g, b)) else { return None };
    let q = (op.int("chunk").unwrap_or(1).max(1) as u64).min(t.max(1));
    let f = |v: u64| v as f64;
    Some(Ssd { bs: f(bs), t: f(t), h: f(h), p: f(p), gr: f(gr), n: f(n), q: f(q), chunks: f(t.div_ceil(q)) })
}

/// Bytes the chunked SSD kernels pass between themselves through HBM, forward and
/// backward: the chunk states (B·bs·chunks·H·P·N elements) and the chunk scores C·Bᵀ
/// (bs·chunks·G·Q² elements), which the op's inputs and outputs do not show. Counted from
/// mamba_ssm's `_mamba_chunk_scan_combined_fwd` and `_bwd` (state-spaces/mamba,
/// mamba_ssm/ops/triton/ssd_combined.py at d757aef), which Megatron's Mamba mixer calls:
/// - forward: `_chunk_state_fwd` writes the states in fp32 (4 bytes), `_state_passing_fwd`
///   reads them and writes them in the activation dtype (4 + 2), `_chunk_scan_fwd` reads
///   those (2): 12 bytes per state element; the scores are written and read in fp32 (8);
/// - backward, which recomputes the forward's states: written in fp32 (4), passed in fp32
///   (4 + 4), their gradients written in fp32 (4), `_state_passing_bwd` reading both and
///   writing both in the activation dtype (4 + 4 + 2 + 2), three kernels reading the
///   gradients or states back (2 + 2 + 2): 34 bytes; the scores written, read by the dx
///   and ddA kernels, their gradient written and read by two kernels: 24 bytes.
pub fn ssm_scan_spill(g: &Graph, op: &Op) -> [f64; 2] {
    let Some(Ssd { bs, h, p, gr, n, q, chunks, .. }) = ssd(g, op) else { return [0.0; 2] };
    let states = bs * chunks * h * p * n;
    let scores = bs * chunks * gr * q * q;
    [12.0 * states + 8.0 * scores, 34.0 * states + 24.0 * scores]
}

/// Elements an op processes, for vector-FLOP estimates.
fn out_numel(g: &Graph, op: &Op) -> f64 {
    op.outputs.iter().map(|&o| numel(g, o)).sum()
}

/// Cost of one op. `attention` picks the attention convention (recompute does not apply
/// per op).
pub fn op_cost(g: &Graph, op: &Op, attention: AttentionFlops) -> OpCost {
    let io_bytes: f64 = op.inputs.iter().chain(&op.outputs).map(|&i| bytes_of(g, i)).sum();
    let matrix = |fwd: f64, bytes: f64| OpCost { fwd_flops: fwd, bwd_flops: 2.0 * fwd, bytes, matrix: true };
    // Rough per-element costs of elementwise work; the vector engine is rarely the limit,
    // these only order-of-magnitude its time.
    let vector = |per_elem: f64, elems: f64| OpCost {
        fwd_flops: per_elem * elems,
        bwd_flops: 2.0 * per_elem * elems,
        bytes: io_bytes,
        matrix: false,
    };
    match op.kind {
        OpKind::Linear | OpKind::GroupedLinear => {
            let (Some(x), Some(w)) = (input(op, 0), input(op, 1)) else { return OpCost::default() };
            let w = dims(g, w);
            let (n, k) = match (op.kind, w) {
                (OpKind::Linear, [n, k]) => (*n as f64, *k as f64),
                (OpKind::GroupedLinear, [_, n, k]) => (*n as f64, *k as f64),
                _ => return OpCost::default(),
            };
            if k == 0.0 {
                return OpCost::default();
            }
            let m = numel(g, x) / k;
            let fwd = 2.0 * m * n * k;
            let frozen = input(op, 1).is_some_and(|w| g.tensors[w].kind == TensorKind::Frozen);
            OpCost { bwd_flops: if frozen { fwd } else { 2.0 * fwd }, ..matrix(fwd, io_bytes) }
        }
        OpKind::Attention => matrix(attention_flops(g, op, attention), io_bytes),
        // Depthwise: K multiply-adds per output element, then SiLU.
        OpKind::CausalConv1d => {
            let k = input(op, 1).and_then(|w| dims(g, w).get(1).copied()).unwrap_or(1) as f64;
            vector(2.0 * k + 5.0, out_numel(g, op))
        }
        OpKind::SsmScan => matrix(ssm_scan_flops(g, op), io_bytes),
        OpKind::Embedding => {
            // Gathers B*T rows; the rest of the table is never touched.
            let rows = op.outputs.first().map_or(0.0, |&o| bytes_of(g, o));
            let tokens = input(op, 0).map_or(0.0, |t| bytes_of(g, t));
            OpCost { fwd_flops: 0.0, bwd_flops: 0.0, bytes: tokens + 2.0 * rows, matrix: false }
        }
        OpKind::RmsNorm => vector(4.0, out_numel(g, op)),
        OpKind::LayerNorm => vector(7.0, out_numel(g, op)),
        OpKind::Rotary => vector(3.0, out_numel(g, op)),
        OpKind::SwiGlu => vector(5.0, out_numel(g, op)),
        OpKind::GeGlu => vector(9.0, out_numel(g, op)),
        OpKind::Gelu => vector(8.0, out_numel(g, op)),
        OpKind::SquaredRelu => vector(2.0, out_numel(g, op)),
        OpKind::Add => vector(1.0, out_numel(g, op)),
        OpKind::Concat | OpKind::MoeDispatch => vector(0.0, 0.0),
        // log-softmax over V per row plus the gather.
        OpKind::CrossEntropy => vector(4.0, input(op, 0).map_or(0.0, |l| numel(g, l))),
        OpKind::Router => vector(4.0, input(op, 0).map_or(0.0, |l| numel(g, l))),
        // Weighted sum of k rows per token.
        OpKind::MoeCombine => vector(2.0, input(op, 0).map_or(0.0, |y| numel(g, y))),
        OpKind::AllReduce | OpKind::ReduceScatter => vector(1.0, input(op, 0).map_or(0.0, |x| numel(g, x))),
        OpKind::AllGather | OpKind::AllToAll | OpKind::Send | OpKind::Recv => vector(0.0, 0.0),
    }
}

/// Per-op cost with attention counted over unmasked keys only ([`AttentionFlops::CausalHalved`]):
/// the work a causal kernel really does, which is what a time projection wants. Use
/// [`op_cost`] to pick another convention.
pub fn op_flops(g: &Graph, op: &Op) -> OpCost {
    op_cost(g, op, AttentionFlops::CausalHalved)
}

/// Forward matrix FLOPs of the whole graph (one micro-batch).
pub fn forward_flops(g: &Graph, conv: &Convention) -> f64 {
    g.ops.iter().map(|op| op_cost(g, op, conv.attention)).filter(|c| c.matrix).map(|c| c.fwd_flops).sum()
}

/// Model FLOPs of one step of this graph: forward + backward of the matrix ops (3x
/// forward), no recompute whatever `conv.recompute` says.
pub fn model_flops_per_step(g: &Graph, conv: &Convention) -> f64 {
    g.ops
        .iter()
        .map(|op| op_cost(g, op, conv.attention))
        .filter(|c| c.matrix)
        .map(|c| c.fwd_flops + c.bwd_flops)
        .sum()
}

/// Hardware FLOPs: model FLOPs plus the forward work `conv.recompute` repeats.
pub fn hardware_flops_per_step(g: &Graph, conv: &Convention) -> f64 {
    let extra: f64 = g
        .ops
        .iter()
        .filter(|op| match conv.recompute {
            Recompute::None => false,
            Recompute::Selective => op.kind == OpKind::Attention,
            Recompute::Full => op.layer >= 0,
        })
        .map(|op| op_cost(g, op, conv.attention))
        .filter(|c| c.matrix)
        .map(|c| c.fwd_flops)
        .sum();
    model_flops_per_step(g, conv) + extra
}

/// Forward + backward vector FLOPs (elementwise work, excluded from model FLOPs).
pub fn vector_flops(g: &Graph) -> f64 {
    g.ops
        .iter()
        .map(|op| op_flops(g, op))
        .filter(|c| !c.matrix)
        .map(|c| c.fwd_flops + c.bwd_flops)
        .sum()
}

/// Total, active and embedding parameters.
pub fn params(g: &Graph) -> ParamCount {
    let mut producer: HashMap<TensorId, &Op> = HashMap::default();
    for op in &g.ops {
        for &o in &op.outputs {
            producer.insert(o, op);
        }
    }
    // Fraction of each expert weight one token uses: top-k / E.
    let mut expert_fraction: HashMap<TensorId, f64> = HashMap::default();
    let mut embedding: HashSet<TensorId> = HashSet::default();
    for op in &g.ops {
        match op.kind {
            OpKind::GroupedLinear => {
                let (Some(w), Some(idx)) = (input(op, 1), input(op, 2)) else { continue };
                let e = dims(g, w).first().copied().unwrap_or(1).max(1) as f64;
                let k = producer
                    .get(&idx)
                    .filter(|r| r.kind == OpKind::Router)
                    .and_then(|r| r.int("top-k"))
                    .map_or_else(|| dims(g, idx).last().copied().unwrap_or(1) as f64, |k| k as f64);
                expert_fraction.insert(w, (k / e).min(1.0));
            }
            OpKind::Embedding => {
                if let Some(t) = input(op, 1) {
                    embedding.insert(t);
                }
            }
            _ => {}
        }
    }
    let mut count = ParamCount { total: 0, active: 0, embedding: 0, trainable: 0 };
    let mut active = 0.0;
    for (id, t) in g.tensors.iter().enumerate() {
        if !t.kind.is_param() {
            continue;
        }
        let n = t.numel();
        count.total += n;
        if t.kind == TensorKind::Weight {
            count.trainable += n;
        }
        active += n as f64 * expert_fraction.get(&id).copied().unwrap_or(1.0);
        if embedding.contains(&id) {
            count.embedding += n;
        }
    }
    count.active = active.round() as u64;
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{op_in as op, t};
    use crate::ir::{Attr, DType};

    use DType::*;
    use TensorKind::*;

    /// x (2,8,16) -> linear 16->24 -> attention with 2 heads of 4 (q=k=v) -> moe with 4
    /// experts top-2 -> cross-entropy. Shapes chosen so every count is easy by hand.
    fn graph(window: i64) -> Graph {
        Graph::new(
            vec![
                t("x", &[2, 8, 16], BF16, Input),
                t("tgt", &[2, 8], I32, Input),
                t("w", &[8, 16], BF16, Weight),
                t("q", &[2, 8, 2, 4], BF16, Activation),
                t("a", &[2, 8, 2, 4], BF16, Activation),
                t("rw", &[4, 8], BF16, Weight),
                t("logits", &[2, 8, 4], BF16, Activation),
                t("gw", &[16, 2], F32, Activation),
                t("gi", &[16, 2], I32, Activation),
                t("xs", &[32, 8], BF16, Activation),
                t("ew", &[4, 6, 8], BF16, Weight),
                t("ys", &[32, 6], BF16, Activation),
                t("y", &[2, 8, 6], BF16, Activation),
                t("loss", &[], F32, Activation),
            ],
            vec![
                op("lin", OpKind::Linear, &["x", "w"], &["q"], &[], 0),
                op(
                    "attn",
                    OpKind::Attention,
                    &["q", "q", "q"],
                    &["a"],
                    &[("causal", Attr::Flag(true)), ("window", Attr::Int(window)), ("scale", Attr::Float(0.5))],
                    0,
                ),
                op("router_logits", OpKind::Linear, &["a", "rw"], &["logits"], &[], 0),
                op(
                    "router",
                    OpKind::Router,
                    &["logits"],
                    &["gw", "gi"],
                    &[("top-k", Attr::Int(2)), ("score", Attr::Text("softmax".into())), ("normalize", Attr::Flag(true))],
                    0,
                ),
                op("dispatch", OpKind::MoeDispatch, &["a", "gi"], &["xs"], &[("experts", Attr::Int(4))], 0),
                op("experts", OpKind::GroupedLinear, &["xs", "ew", "gi"], &["ys"], &[], 0),
                op("combine", OpKind::MoeCombine, &["ys", "gw", "gi"], &["y"], &[], 0),
                op("loss", OpKind::CrossEntropy, &["y", "tgt"], &["loss"], &[], -1),
            ],
            "loss",
        )
        .unwrap()
    }

    #[test]
    fn matrix_flops_by_hand() {
        let g = graph(0);
        crate::validate::validate(&g).unwrap();
        let lin = 2.0 * 16.0 * 8.0 * 16.0; // M = 2*8 rows, N 8, K 16
        let attn_full = 2.0 * 2.0 * 2.0 * 8.0 * 8.0 * (4.0 + 4.0); // 2 B H T T (D + Dv)
        let router = 2.0 * 16.0 * 4.0 * 8.0;
        let experts = 2.0 * 32.0 * 6.0 * 8.0; // (N*k) rows
        assert_eq!(forward_flops(&g, &Convention::FULL), lin + attn_full + router + experts);
        assert_eq!(forward_flops(&g, &Convention::CAUSAL), lin + attn_full / 2.0 + router + experts);
        assert_eq!(model_flops_per_step(&g, &Convention::FULL), 3.0 * (lin + attn_full + router + experts));
        let sel = Convention { attention: AttentionFlops::Full, recompute: Recompute::Selective };
        assert_eq!(hardware_flops_per_step(&g, &sel), 3.0 * (lin + attn_full + router + experts) + attn_full);
        assert!(vector_flops(&g) > 0.0);
    }

    #[test]
    fn sliding_window_keys() {
        // Window 4 over T = 8, causal: keys per query 1,2,3,4,4,4,4,4 -> mean 26/8.
        let g = graph(4);
        let attn = |conv| op_cost(&g, &g.ops[1], conv).fwd_flops;
        assert_eq!(attn(AttentionFlops::CausalHalved), 2.0 * 2.0 * 2.0 * 8.0 * (26.0 / 8.0) * 8.0);
        assert_eq!(attn(AttentionFlops::Full), 2.0 * 2.0 * 2.0 * 8.0 * 4.0 * 8.0);
    }

    #[test]
    fn params_active_uses_router_top_k() {
        let p = params(&graph(0));
        assert_eq!(p.total, 8 * 16 + 4 * 8 + 4 * 6 * 8);
        assert_eq!(p.active, 8 * 16 + 4 * 8 + 6 * 8 * 2); // 2 of 4 experts
        assert_eq!(p.embedding, 0);
    }

    #[test]
    fn bytes_and_display() {
        let g = graph(0);
        let c = op_flops(&g, &g.ops[0]);
        assert_eq!(c.bytes, (2.0 * 8.0 * 16.0 + 8.0 * 16.0 + 2.0 * 8.0 * 8.0) * 2.0);
        assert!(Convention::FULL.to_string().contains("non-causal"));
        assert!(Convention::CAUSAL.to_string().contains("causal T/2"));
    }

    /// Attention FLOPs by hand, 2·B·H·T·T_eff·(D + Dv), under each convention: B 1, H 2,
    /// D 4, Dv 8. A non-causal op counts every key under either convention (a window's
    /// keys when windowed); under context parallelism q holds T/cp tokens and the keys are
    /// the gathered T, of which a causal query sees T/2 on average (load-balanced cp).
    #[test]
    fn attention_flops_by_convention_by_hand() {
        let attn = |tq: u64, tk: u64, causal: Option<bool>, window: i64, cp: i64| {
            let mut attrs = vec![("window", Attr::Int(window)), ("scale", Attr::Float(0.5)), ("cp", Attr::Int(cp))];
            if let Some(c) = causal {
                attrs.push(("causal", Attr::Flag(c)));
            }
            let g = Graph::new(
                vec![
                    t("q", &[1, tq, 2, 4], BF16, Input),
                    t("k", &[1, tk, 2, 4], BF16, Input),
                    t("v", &[1, tk, 2, 8], BF16, Input),
                    t("o", &[1, tq, 2, 8], BF16, Activation),
                ],
                vec![op("a", OpKind::Attention, &["q", "k", "v"], &["o"], &attrs, 0)],
                "o",
            )
            .unwrap();
            if causal.is_some() {
                let e = crate::validate::validate(&g).unwrap_err().to_string();
                assert!(e.contains("(loss)"), "the op is valid, the graph has no loss: {e}");
            }
            let f = |c| op_cost(&g, &g.ops[0], c).fwd_flops;
            (f(AttentionFlops::Full), f(AttentionFlops::CausalHalved))
        };
        let hand = |tq: f64, te: f64| 2.0 * 2.0 * tq * te * (4.0 + 8.0);
        assert_eq!(attn(8, 8, Some(true), 0, 1), (hand(8.0, 8.0), hand(8.0, 4.0)));
        assert_eq!(attn(8, 8, Some(false), 0, 1), (hand(8.0, 8.0), hand(8.0, 8.0)), "non-causal: every key");
        assert_eq!(attn(8, 8, Some(false), 4, 1), (hand(8.0, 4.0), hand(8.0, 4.0)), "non-causal window: w keys");
        assert_eq!(attn(8, 8, Some(true), 8, 1), (hand(8.0, 8.0), hand(8.0, 4.0)), "a window of T is no window");
        assert_eq!(attn(4, 8, Some(true), 0, 2), (hand(4.0, 8.0), hand(4.0, 4.0)), "cp 2: T/2 of the gathered 8 keys");
        assert_eq!(attn(8, 8, None, 0, 1).1, hand(8.0, 4.0), "causal unless flagged otherwise");
        // Backward twice the forward (dQ, dK, dV, dP): a step is 3x.
        let g = graph(0);
        let c = op_cost(&g, &g.ops[1], AttentionFlops::Full);
        assert_eq!((c.bwd_flops, c.matrix), (2.0 * c.fwd_flops, true));
    }

    /// A frozen weight (a LoRA fine-tune's base) has no weight gradient: its GEMM's
    /// backward is the input gradient alone, 1x the forward (the 2/3-of-training
    /// convention of NeMo's LoRA MFU), and it counts in the total parameters but not the
    /// trainable ones. An embedding costs no FLOPs, reads its token ids and the gathered
    /// rows and writes them (never the rest of the table), and its table counts as
    /// embedding parameters.
    #[test]
    fn frozen_gemms_and_embeddings_by_hand() {
        let g = Graph::new(
            vec![
                t("tok", &[2, 3], I32, Input),
                t("tgt", &[2, 3], I32, Input),
                t("table", &[100, 8], BF16, Weight),
                t("e", &[2, 3, 8], BF16, Activation),
                t("wf", &[5, 8], BF16, Frozen),
                t("y", &[2, 3, 5], BF16, Activation),
                t("wt", &[10, 5], BF16, Weight),
                t("logits", &[2, 3, 10], BF16, Activation),
                t("loss", &[], F32, Activation),
            ],
            vec![
                op("embed", OpKind::Embedding, &["tok", "table"], &["e"], &[], -1),
                op("frozen", OpKind::Linear, &["e", "wf"], &["y"], &[], 0),
                op("head", OpKind::Linear, &["y", "wt"], &["logits"], &[], -1),
                op("loss", OpKind::CrossEntropy, &["logits", "tgt"], &["loss"], &[], -1),
            ],
            "loss",
        )
        .unwrap();
        crate::validate::validate(&g).unwrap();
        let fwd = 2.0 * 6.0 * 5.0 * 8.0;
        let c = op_flops(&g, &g.ops[1]);
        assert_eq!((c.fwd_flops, c.bwd_flops), (fwd, fwd));
        let c = op_flops(&g, &g.ops[2]);
        assert_eq!((c.fwd_flops, c.bwd_flops), (2.0 * 6.0 * 10.0 * 5.0, 2.0 * 2.0 * 6.0 * 10.0 * 5.0));
        let e = op_flops(&g, &g.ops[0]);
        assert_eq!((e.fwd_flops, e.bwd_flops, e.matrix), (0.0, 0.0, false));
        assert_eq!(e.bytes, 6.0 * 4.0 + 2.0 * 6.0 * 8.0 * 2.0, "token ids, then 6 rows of 8 bf16 read and written");
        let p = params(&g);
        assert_eq!((p.total, p.trainable, p.embedding, p.active), (800 + 40 + 50, 800 + 50, 800, 800 + 40 + 50));
        // The loss's work is per logit: twice the vocabulary, twice the cross-entropy's.
        let ce = op_flops(&g, &g.ops[3]).fwd_flops;
        let mut wide = g.clone();
        wide.tensors[7].shape = vec![2, 3, 20];
        wide.tensors[6].shape = vec![20, 5];
        assert_eq!(op_flops(&wide, &wide.ops[3]).fwd_flops, 2.0 * ce);
    }

    /// A token uses at most every expert: indices that name 8 experts per token of an
    /// expert weight of 4 (a graph input, no router's top-k to read) make the whole weight
    /// active, never twice it.
    #[test]
    fn active_params_are_at_most_all() {
        let g = Graph::new(
            vec![
                t("xs", &[24, 8], BF16, Input),
                t("idx", &[3, 8], I32, Input),
                t("ew", &[4, 6, 8], BF16, Weight),
                t("ys", &[24, 6], BF16, Activation),
            ],
            vec![op("experts", OpKind::GroupedLinear, &["xs", "ew", "idx"], &["ys"], &[], 0)],
            "ys",
        )
        .unwrap();
        let p = params(&g);
        assert_eq!((p.total, p.active), (192, 192));
    }

    /// Vector (elementwise) work by hand, each backward twice its forward: an add one FLOP
    /// per output element, the MoE combine two per row it reads (the k rows per token of
    /// the experts' output, not the token's output row), an all-reduce one per element it
    /// sums; none of it counts as matrix work.
    #[test]
    fn vector_work_by_hand() {
        let g = graph(0);
        let combine = op_flops(&g, &g.ops[6]);
        assert_eq!((combine.fwd_flops, combine.bwd_flops, combine.matrix), (2.0 * 32.0 * 6.0, 4.0 * 32.0 * 6.0, false));
        let g = Graph::new(
            vec![t("x", &[2, 4], BF16, Input), t("s", &[2, 4], BF16, Activation), t("r", &[2, 4], BF16, Activation)],
            vec![
                op("add", OpKind::Add, &["x", "x"], &["s"], &[], 0),
                op("ar", OpKind::AllReduce, &["s"], &["r"], &[], 0),
            ],
            "r",
        )
        .unwrap();
        let (add, ar) = (op_flops(&g, &g.ops[0]), op_flops(&g, &g.ops[1]));
        assert_eq!((add.fwd_flops, add.bwd_flops, add.matrix), (8.0, 16.0, false));
        assert_eq!((ar.fwd_flops, ar.bwd_flops, ar.matrix), (8.0, 16.0, false));
        assert_eq!(vector_flops(&g), 48.0);
        assert_eq!(model_flops_per_step(&g, &Convention::FULL), 0.0);
    }

    /// Active parameters are the nearest integer to the fractional sum: 41 of 160 experts
    /// of 3 elements each use 480·41/160 = 123 elements, which f64 makes
    /// 122.99999999999999 (truncated, 122).
    #[test]
    fn active_params_round_to_the_nearest() {
        let g = Graph::new(
            vec![
                t("xs", &[41, 1], BF16, Input),
                t("idx", &[1, 41], I32, Input),
                t("ew", &[160, 3, 1], BF16, Weight),
                t("ys", &[41, 3], BF16, Activation),
            ],
            vec![op("experts", OpKind::GroupedLinear, &["xs", "ew", "idx"], &["ys"], &[], 0)],
            "ys",
        )
        .unwrap();
        let p = params(&g);
        assert_eq!((p.total, p.active), (480, 123));
    }
}
