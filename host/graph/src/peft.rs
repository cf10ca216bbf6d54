//! Parameter-efficient fine-tuning as a graph transform: [`lora`] turns a model's logical
//! forward graph into its LoRA fine-tuning graph, which validation, autodiff, counting,
//! sharding, execution and the projection then read like any other.
//!
//! LoRA (Hu et al. 2021, arXiv:2106.09685) freezes every weight of the model and adds to
//! each targeted linear `y = x·Wᵀ` a trained low-rank path `y += (x·Aᵀ)·Bᵀ`, A of shape
//! (r, K) and B of shape (N, r), B starting at zero so the fine-tune starts at the base
//! model. The targets are Megatron-Bridge's defaults (`src/megatron/bridge/peft/lora.py`:
//! `linear_qkv`, `linear_proj`, `linear_fc1`, `linear_fc2`, dim 32), which in this IR
//! are the column- and row-parallel linears of the transformer layers (q, k, v and the
//! attention output, the MLP's gate, up and down, a shared expert's); the head, routers,
//! latent down-projections and routed experts stay frozen without adapters. The scale
//! alpha/r is a constant factor folded into B; it changes no cost. Megatron fuses q, k
//! and v into one `linear_qkv` and gate and up into one `linear_fc1`, each with one
//! adapter; here they are separate linears reading the same input, so they share one A
//! (named after the first of them) and each has its own B, the rows of the fused B: the
//! same parameters, FLOPs and traffic.
//!
//! Tensor parallelism follows Megatron-Bridge's `ParallelLinearAdapter` where it moves
//! data: on a column-parallel linear the up-projection B is column-parallel like its
//! base; on a row-parallel linear A is row-parallel (its partial sums reduced like the
//! base's) and B replicated. On a column-parallel linear Megatron also splits A's rank
//! over tp and gathers it; here A is replicated on the rank's tokens and its rank-r
//! output gathered, a difference of a few rank-r rows. The adapter's output is added to
//! the base's by an `add`, which Megatron runs as a separate kernel too (`LoRALinear`).
//!
//! What changes downstream follows from [`TensorKind::Frozen`]: no weight gradient, no
//! optimizer state or gradient reduction for the base weights (autodiff, sharding),
//! no stored input for a frozen linear's weight gradient (recompute), no backward at all
//! before the first adapter (the embedding), and a GEMM backward of one GEMM, not two.

use std::collections::{HashMap, HashSet};

use crate::ir::{Attr, Graph, GraphError, NamedOp, Op, Role, Tensor, TensorKind};
use crate::OpKind;
use crate::validate::leading_axes;

/// Megatron-Bridge's default LoRA rank (`dim`).
pub const DEFAULT_RANK: u32 = 32;

/// Attribute (text) marking an adapter's linears: `a` for the down-projection, `b` for
/// the up-projection, whose weight starts at zero.
pub const LORA_ATTR: &str = "lora";

/// Whether `op` is a LoRA adapter's linear. Adapters run in BF16 outside any precision
/// plan: Megatron-Bridge builds them from Megatron's own parallel linears, which
/// Transformer Engine's FP8 autocast does not reach.
pub fn is_adapter(op: &Op) -> bool {
    op.attrs.contains_key(LORA_ATTR)
}

/// A LoRA fine-tune.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lora {
    /// Rank r of every adapter.
    pub rank: u32,
    /// Which linears of each layer carry an adapter.
    pub targets: LoraTargets,
}

impl Default for Lora {
    fn default() -> Lora {
        Lora { rank: DEFAULT_RANK, targets: LoraTargets::All }
    }
}

/// The linears a LoRA fine-tune adapts, in Megatron-Bridge's `target_modules` terms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LoraTargets {
    /// `linear_qkv`, `linear_proj`, `linear_fc1`, `linear_fc2` (the default): every column-
    /// and row-parallel linear of a transformer layer.
    #[default]
    All,
    /// `linear_qkv` alone: the linears whose outputs become the attention core's q, k and v
    /// (NVIDIA's LoRA performance configs, e.g. Megatron-Bridge
    /// `src/megatron/bridge/perf_recipes/llama/h100/llama3.py` at 71eaba6,
    /// `llama3_70b_lora_8gpu_h100_fp8cs_config`: `cfg.peft.target_modules = ["linear_qkv"]`).
    Qkv,
}

impl LoraTargets {
    /// The command line's spelling: `all` or `qkv`.
    pub fn parse(s: &str) -> Result<LoraTargets, String> {
        match s {
            "all" => Ok(LoraTargets::All),
            "qkv" => Ok(LoraTargets::Qkv),
            _ => Err(format!("unknown LoRA targets '{s}': use all or qkv")),
        }
    }

    /// Megatron-Bridge's module names: `linear_qkv` alone, or the four defaults in any order.
    pub fn from_modules(modules: &[String]) -> Result<LoraTargets, String> {
        let mut set: Vec<&str> = modules.iter().map(String::as_str).collect();
        set.sort_unstable();
        set.dedup();
        match set.as_slice() {
            ["linear_qkv"] => Ok(LoraTargets::Qkv),
            ["linear_fc1", "linear_fc2", "linear_proj", "linear_qkv"] => Ok(LoraTargets::All),
            _ => Err(format!(
                "LoRA target modules {modules:?}: supported are [\"linear_qkv\"] and [\"linear_qkv\", \"linear_proj\", \"linear_fc1\", \"linear_fc2\"]"
            )),
        }
    }

    /// What the adapters sit on, in words.
    pub fn describe(self) -> &'static str {
        match self {
            LoraTargets::All => "the attention and MLP linears",
            LoraTargets::Qkv => "the q, k and v linears",
        }
    }
}

/// The linears whose outputs reach an attention core's inputs through position encodings,
/// concatenations and per-head norms only: Megatron's `linear_qkv` (q, k and v here;
/// Qwen3's q/k norms over each head's (B,T,H,D) sit after `linear_qkv`, Megatron's
/// `q_layernorm`/`k_layernorm`). Under multi-latent attention these are the
/// up-projections (Megatron's `linear_q_up_proj` and `linear_kv_up_proj`); the latents'
/// norms are not per head, so the latent down-projections stay without adapters.
fn qkv_linears(g: &Graph) -> HashSet<usize> {
    let producer = g.producers();
    let mut found = HashSet::new();
    let mut stack: Vec<usize> =
        g.ops.iter().filter(|op| op.kind == OpKind::Attention).flat_map(|op| op.inputs.iter().copied()).collect();
    let mut seen = HashSet::new();
    while let Some(t) = stack.pop() {
        if !seen.insert(t) {
            continue;
        }
        let Some(i) = producer.get(t).copied().flatten() else { continue };
        match g.ops[i].kind {
            OpKind::Linear => {
                found.insert(i);
            }
            OpKind::Rotary | OpKind::Concat => stack.extend(g.ops[i].inputs.iter().copied()),
            OpKind::RmsNorm | OpKind::LayerNorm => {
                let x = g.ops[i].inputs[0];
                if g.tensors[x].shape.len() == 4 {
                    stack.push(x);
                }
            }
            _ => {}
        }
    }
    found
}

/// The LoRA fine-tuning graph of `g`: every weight frozen, and an adapter on each
/// column- and row-parallel linear of the transformer layers.
///
/// # Errors
/// A rank of 0 or above a targeted linear's smaller dimension, a graph with no linear to
/// adapt, or a name the adapter would take that the graph already uses.
pub fn lora(g: &Graph, spec: &Lora) -> Result<Graph, GraphError> {
    let invalid = |problem: String| GraphError::Invalid { op: "(lora)".into(), problem };
    if spec.rank == 0 {
        return Err(invalid("the LoRA rank must be at least 1".into()));
    }
    let r = u64::from(spec.rank);
    let mut tensors: Vec<Tensor> = g
        .tensors
        .iter()
        .map(|t| Tensor { kind: if t.kind == TensorKind::Weight { TensorKind::Frozen } else { t.kind }, ..t.clone() })
        .collect();
    let mut names: HashSet<String> = tensors.iter().map(|t| t.name.clone()).collect();
    let mut add = |tensors: &mut Vec<Tensor>, name: String, shape: Vec<u64>, like: &Tensor, kind| {
        if !names.insert(name.clone()) {
            return Err(invalid(format!("the adapter tensor '{name}' is already a tensor of the graph")));
        }
        tensors.push(Tensor { name: name.clone(), shape, dtype: like.dtype, kind });
        Ok(name)
    };
    let qkv = match spec.targets {
        LoraTargets::All => None,
        LoraTargets::Qkv => Some(qkv_linears(g)),
    };
    let target = |i: usize, op: &Op| {
        qkv.as_ref().is_none_or(|set| set.contains(&i))
            && op.kind == OpKind::Linear
            && op.layer >= 0
            && matches!(op.role, Role::ColumnParallel | Role::RowParallel)
            && op.inputs.get(1).is_some_and(|&w| g.tensors[w].shape.len() == 2)
            && !op.outputs.is_empty()
    };
    // Low rank: at most the smaller side of the narrowest adapted linear.
    if let Some((op, n, k)) = g
        .ops
        .iter()
        .enumerate()
        .filter(|&(i, op)| target(i, op))
        .map(|(_, op)| (op, g.tensors[op.inputs[1]].shape[0], g.tensors[op.inputs[1]].shape[1]))
        .min_by_key(|&(_, n, k)| n.min(k))
        && r > n.min(k)
    {
        return Err(invalid(format!(
            "a rank-{r} adapter is not low-rank for '{}' ({n} x {k}), the narrowest linear it adapts: use a rank of at most {}",
            op.name,
            n.min(k)
        )));
    }
    let mut ops = Vec::with_capacity(g.ops.len());
    let mut adapted = 0usize;
    // The A of the column-parallel linears reading one input: (layer, input) -> its output.
    let mut shared: HashMap<(i32, usize), String> = HashMap::new();
    for (i, op) in g.ops.iter().enumerate() {
        let base = g.named(op);
        if !target(i, op) {
            ops.push(base);
            continue;
        }
        let column = op.role == Role::ColumnParallel;
        let (x, w, y) = (op.inputs[0], op.inputs[1], op.outputs[0]);
        let (xt, wt, yt) = (&g.tensors[x], &g.tensors[w], &g.tensors[y]);
        let (n, k) = (wt.shape[0], wt.shape[1]);
        let p = &op.name;
        let b_w = add(&mut tensors, format!("{p}.lora_b.weight"), vec![n, r], wt, TensorKind::Weight)?;
        // The input's leading (token) axes, then r.
        let Some(lead) = leading_axes(&xt.shape, k) else {
            return Err(invalid(format!("'{p}': input '{}' {:?} has no trailing axes of size {k}", xt.name, xt.shape)));
        };
        let mid_shape: Vec<u64> = xt.shape[..lead].iter().copied().chain([r]).collect();
        let out = add(&mut tensors, format!("{p}.lora_out"), yt.shape.clone(), yt, TensorKind::Activation)?;
        let base_out = add(&mut tensors, format!("{p}.base_out"), yt.shape.clone(), yt, TensorKind::Activation)?;
        let (a_role, b_role, add_role) = if column {
            (Role::Replicated, Role::ColumnParallel, Role::ColumnParallel)
        } else {
            (Role::RowParallel, Role::Replicated, Role::Replicated)
        };
        let linear = |name: String, inputs: Vec<String>, output: String, role: Role, which: &str| NamedOp {
            name,
            kind: OpKind::Linear,
            inputs,
            outputs: vec![output],
            attrs: [(LORA_ATTR.to_string(), Attr::Text(which.into()))].into(),
            layer: op.layer,
            role,
        };
        ops.push(NamedOp { outputs: vec![base_out.clone()], ..base });
        let mid = match shared.get(&(op.layer, x)).filter(|_| column) {
            Some(mid) => mid.clone(),
            None => {
                let a_w = add(&mut tensors, format!("{p}.lora_a.weight"), vec![r, k], wt, TensorKind::Weight)?;
                let mid = add(&mut tensors, format!("{p}.lora_mid"), mid_shape, yt, TensorKind::Activation)?;
                ops.push(linear(format!("{p}.lora_a"), vec![xt.name.clone(), a_w], mid.clone(), a_role, "a"));
                if column {
                    shared.insert((op.layer, x), mid.clone());
                }
                mid
            }
        };
        ops.push(linear(format!("{p}.lora_b"), vec![mid, b_w], out.clone(), b_role, "b"));
        ops.push(NamedOp {
            name: format!("{p}.lora_add"),
            kind: OpKind::Add,
            inputs: vec![base_out, out],
            outputs: vec![yt.name.clone()],
            attrs: Default::default(),
            layer: op.layer,
            role: add_role,
        });
        adapted += 1;
    }
    if adapted == 0 {
        return Err(invalid(
            "the graph has no column- or row-parallel linear in a transformer layer for a LoRA adapter".into(),
        ));
    }
    Graph::new(tensors, ops, &g.tensors[g.loss].name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::backward_plan;
    use crate::count::{self, Convention};
    use crate::ir::DType::*;
    use crate::recompute::{RecomputePolicy, saved_for_backward};
    use crate::shard::{Layout, RankCoord, shard};
    use crate::testing::{op_in, t};
    use crate::validate::validate;
    use TensorKind::*;

    fn role(mut op: NamedOp, r: Role) -> NamedOp {
        op.role = r;
        op
    }

    /// tokens -> embedding -> norm -> up (column, 8->16) -> gelu (column) -> down (row,
    /// 16->8) -> residual add -> head (vocab-parallel) -> loss.
    fn mlp() -> Graph {
        mlp_gated(false)
    }

    /// [`mlp`], with `gated` a second column-parallel linear on the norm's output (gate)
    /// whose output the activation reads beside up's (SwiGLU).
    fn mlp_gated(gated: bool) -> Graph {
        let act = if gated {
            role(op_in("act", OpKind::SwiGlu, &["g", "u"], &["a"], &[], 0), Role::ColumnParallel)
        } else {
            role(op_in("act", OpKind::Gelu, &["u"], &["a"], &[], 0), Role::ColumnParallel)
        };
        let mut tensors = vec![
            t("tokens", &[2, 4], I32, Input),
            t("targets", &[2, 4], I32, Input),
            t("embed", &[16, 8], BF16, Weight),
            t("h0", &[2, 4, 8], BF16, Activation),
            t("gain", &[8], BF16, Weight),
            t("n0", &[2, 4, 8], BF16, Activation),
            t("up.weight", &[16, 8], BF16, Weight),
            t("u", &[2, 4, 16], BF16, Activation),
            t("a", &[2, 4, 16], BF16, Activation),
            t("down.weight", &[8, 16], BF16, Weight),
            t("d", &[2, 4, 8], BF16, Activation),
            t("h1", &[2, 4, 8], BF16, Activation),
            t("head", &[16, 8], BF16, Weight),
            t("logits", &[2, 4, 16], BF16, Activation),
            t("loss", &[], F32, Activation),
        ];
        let mut ops = vec![
            role(op_in("embedding", OpKind::Embedding, &["tokens", "embed"], &["h0"], &[], -1), Role::VocabParallel),
            op_in("norm", OpKind::RmsNorm, &["h0", "gain"], &["n0"], &[("eps", Attr::Float(1e-5))], 0),
            role(op_in("up", OpKind::Linear, &["n0", "up.weight"], &["u"], &[], 0), Role::ColumnParallel),
        ];
        if gated {
            tensors.push(t("gate.weight", &[16, 8], BF16, Weight));
            tensors.push(t("g", &[2, 4, 16], BF16, Activation));
            ops.push(role(op_in("gate", OpKind::Linear, &["n0", "gate.weight"], &["g"], &[], 0), Role::ColumnParallel));
        }
        ops.push(act);
        ops.extend([
            role(op_in("down", OpKind::Linear, &["a", "down.weight"], &["d"], &[], 0), Role::RowParallel),
            op_in("residual", OpKind::Add, &["h0", "d"], &["h1"], &[], 0),
            role(op_in("lm_head", OpKind::Linear, &["h1", "head"], &["logits"], &[], -1), Role::VocabParallel),
            role(op_in("xent", OpKind::CrossEntropy, &["logits", "targets"], &["loss"], &[], -1), Role::VocabParallel),
        ]);
        Graph::new(tensors, ops, "loss").unwrap()
    }

    #[test]
    fn freezes_the_model_and_adapts_column_and_row_linears() {
        let base = mlp();
        validate(&base).unwrap();
        let g = lora(&base, &Lora { rank: 2, ..Lora::default() }).unwrap();
        validate(&g).unwrap();
        let kind = |n: &str| g.tensors[g.tensor_id(n).unwrap()].kind;
        let shape = |n: &str| g.tensors[g.tensor_id(n).unwrap()].shape.clone();
        for w in ["embed", "gain", "up.weight", "down.weight", "head"] {
            assert_eq!(kind(w), Frozen, "{w}");
        }
        assert_eq!((shape("up.lora_a.weight"), shape("up.lora_b.weight")), (vec![2, 8], vec![16, 2]));
        assert_eq!((shape("down.lora_a.weight"), shape("down.lora_b.weight")), (vec![2, 16], vec![8, 2]));
        assert!(g.tensor_id("lm_head.lora_a.weight").is_none(), "the head gets no adapter");
        let roles: Vec<(String, Role)> =
            g.ops.iter().filter(|o| o.name.contains("lora")).map(|o| (o.name.clone(), o.role)).collect();
        assert_eq!(
            roles,
            [
                ("up.lora_a", Role::Replicated),
                ("up.lora_b", Role::ColumnParallel),
                ("up.lora_add", Role::ColumnParallel),
                ("down.lora_a", Role::RowParallel),
                ("down.lora_b", Role::Replicated),
                ("down.lora_add", Role::Replicated),
            ]
            .map(|(n, r)| (n.to_string(), r))
        );
        let params = count::params(&g);
        assert_eq!(params.trainable, 2 * 8 + 16 * 2 + 2 * 16 + 8 * 2);
        assert_eq!(params.total, count::params(&base).total + params.trainable);
    }

    #[test]
    fn only_the_adapters_get_gradients_and_the_embedding_no_backward() {
        let g = lora(&mlp(), &Lora { rank: 2, ..Lora::default() }).unwrap();
        let plan = backward_plan(&g).unwrap();
        let id = |n: &str| g.tensor_id(n).unwrap();
        for w in ["embed", "gain", "up.weight", "down.weight", "head"] {
            assert!(!plan.needs_grad[id(w)], "{w}");
        }
        for w in ["up.lora_a.weight", "up.lora_b.weight", "down.lora_a.weight", "down.lora_b.weight"] {
            assert!(plan.needs_grad[id(w)], "{w}");
        }
        // Nothing trained comes before the first adapter: h0 and the norm carry no
        // gradient, so neither has a backward step.
        assert!(!plan.needs_grad[id("h0")] && !plan.needs_grad[id("n0")]);
        let stepped: Vec<&str> = plan.steps.iter().map(|s| g.ops[s.op].name.as_str()).collect();
        assert!(!stepped.contains(&"embedding") && !stepped.contains(&"norm") && !stepped.contains(&"up"), "{stepped:?}");
        assert!(stepped.contains(&"down") && stepped.contains(&"lm_head"), "{stepped:?}");
        // A frozen linear keeps no input for a weight gradient: the residual stream (h0,
        // h1) is kept by the base model's linears, by nothing here; the adapters' A keep
        // their inputs (n0, a) and gelu its own (u).
        let names = |g: &Graph| -> HashSet<String> {
            saved_for_backward(g, RecomputePolicy::None).stored.iter().map(|&t| g.tensors[t].name.clone()).collect()
        };
        let kept = names(&g);
        assert!(["n0", "u", "a"].iter().all(|n| kept.contains(*n)), "{kept:?}");
        assert!(!kept.contains("h0") && !kept.contains("h1"), "{kept:?}");
        let base_kept = names(&mlp());
        assert!(base_kept.contains("h0") && base_kept.contains("h1"), "{base_kept:?}");
    }

    #[test]
    fn a_frozen_gemm_has_one_backward_gemm() {
        let base = mlp();
        let g = lora(&base, &Lora { rank: 2, ..Lora::default() }).unwrap();
        let conv = Convention::CAUSAL;
        // Base: every linear 3x forward. LoRA: base linears 2x, adapters 3x.
        let fwd = |n: u64, k: u64| 2.0 * 8.0 * (n * k) as f64;
        let base_flops = 3.0 * (fwd(16, 8) + fwd(8, 16) + fwd(16, 8));
        assert_eq!(count::model_flops_per_step(&base, &conv), base_flops);
        let adapters = fwd(2, 8) + fwd(16, 2) + fwd(2, 16) + fwd(8, 2);
        let lora_flops = 2.0 * (fwd(16, 8) + fwd(8, 16) + fwd(16, 8)) + 3.0 * adapters;
        assert_eq!(count::model_flops_per_step(&g, &conv), lora_flops);
    }

    #[test]
    fn shards_for_tensor_and_sequence_parallelism_and_reduces_only_adapter_gradients() {
        let g = lora(&mlp(), &Lora { rank: 2, ..Lora::default() }).unwrap();
        for sp in [false, true] {
            let l = Layout {
                tp: 2,
                pp: 1,
                cp: 1,
                ep: 1,
                etp: 1,
                dp: 2,
                vp: 1,
                sequence_parallel: sp,
                fsdp: false,
                micro_batch: 2,
                global_batch: 4,
                split: Default::default(),
            };
            let s = shard(&g, &l, RankCoord::default()).unwrap();
            validate(&s.graph).unwrap();
            let shape = |n: &str| s.graph.tensors[s.graph.tensor_id(n).unwrap()].shape.clone();
            assert_eq!(shape("up.lora_b.weight"), vec![8, 2], "B of a column-parallel base splits N");
            assert_eq!(shape("down.lora_a.weight"), vec![2, 8], "A of a row-parallel base splits K");
            assert_eq!(shape("up.lora_a.weight"), vec![2, 8]);
            let dp: Vec<&Vec<String>> = s.step.iter().filter(|c| c.group == "dp").map(|c| &c.weights).collect();
            assert_eq!(dp.len(), 1, "sp={sp}");
            assert!(dp[0].iter().all(|w| w.contains(".lora_")), "only adapters reduce gradients: {:?}", dp[0]);
            // A replicated adapter weight read on a sequence shard sums its tp parts.
            let tp: Vec<&String> = s.step.iter().filter(|c| c.group == "tp").flat_map(|c| &c.weights).collect();
            if sp {
                assert!(tp.iter().any(|w| *w == "up.lora_a.weight") && tp.iter().all(|w| w.contains(".lora_")), "{tp:?}");
            } else {
                assert!(tp.is_empty(), "{tp:?}");
            }
        }
    }

    /// Column-parallel linears reading one input (Megatron's fused qkv and fc1) share
    /// one A; each keeps its B.
    #[test]
    fn linears_reading_one_input_share_the_down_projection() {
        let l = lora(&mlp_gated(true), &Lora { rank: 2, ..Lora::default() }).unwrap();
        validate(&l).unwrap();
        assert!(l.tensor_id("up.lora_a.weight").is_some() && l.tensor_id("gate.lora_a.weight").is_none());
        let gate_b = l.ops.iter().find(|o| o.name == "gate.lora_b").unwrap();
        assert_eq!(l.tensors[gate_b.inputs[0]].name, "up.lora_mid");
        assert_eq!(l.tensors[gate_b.inputs[1]].shape, vec![16, 2]);
    }

    #[test]
    fn refuses_rank_zero_and_graphs_without_targets() {
        let err = lora(&mlp(), &Lora { rank: 0, ..Lora::default() }).unwrap_err().to_string();
        assert!(err.contains("rank"), "{err}");
        let err = lora(&mlp(), &Lora { rank: 9, ..Lora::default() }).unwrap_err().to_string();
        assert!(err.contains("not low-rank for 'up' (16 x 8)") && err.contains("at most 8"), "{err}");
        assert!(lora(&mlp(), &Lora { rank: 8, ..Lora::default() }).is_ok());
        let once = lora(&mlp(), &Lora { rank: 2, ..Lora::default() }).unwrap();
        let err = lora(&once, &Lora { rank: 2, ..Lora::default() }).unwrap_err().to_string();
        assert!(err.contains("already a tensor"), "{err}");
        // Nothing to adapt: every linear replicated (no tensor-parallel role), or outside
        // the transformer layers (layer -1: embedding, head and loss).
        for (role, layer) in [(Role::Replicated, 0), (Role::ColumnParallel, -1)] {
            let mut g = mlp();
            for op in &mut g.ops {
                op.role = role;
                op.layer = layer;
            }
            let err = lora(&g, &Lora { rank: 2, ..Lora::default() }).unwrap_err().to_string();
            assert!(err.contains("no column- or row-parallel linear in a transformer layer"), "{role:?} {layer}: {err}");
        }
    }

    /// `linear_qkv` alone adapts the linears that feed the attention core, dense or
    /// multi-latent, and nothing of the MLP, the output projection or the experts.
    #[test]
    fn qkv_targets_adapt_only_the_attention_inputs() {
        let mut g = crate::modules::tests::layers();
        for op in &mut g.ops {
            if op.kind == OpKind::Linear {
                let row = ["l0.out", "l0.down", "l1.out", "l1.sd"].contains(&op.name.as_str());
                op.role = if row { Role::RowParallel } else { Role::ColumnParallel };
            }
        }
        let spec = Lora { rank: 2, targets: LoraTargets::Qkv };
        // (Two layers cut from a model: no embedding or loss, so not a validating graph.)
        let l = lora(&g, &spec).unwrap();
        let mut adapted: Vec<&str> =
            l.ops.iter().filter(|o| o.attrs.get(LORA_ATTR) == Some(&Attr::Text("b".into()))).map(|o| o.name.as_str()).collect();
        adapted.sort_unstable();
        assert_eq!(adapted, ["l0.k.lora_b", "l0.q.lora_b", "l0.v.lora_b", "l1.ku.lora_b", "l1.qu.lora_b", "l1.vu.lora_b"]);
        // q, k and v read one input: one shared down-projection, as Megatron's fused linear_qkv.
        assert_eq!(l.ops.iter().filter(|o| o.name.starts_with("l0.") && o.name.ends_with(".lora_a")).count(), 1);
        // The default adapts every column- and row-parallel linear of both layers.
        let all = lora(&g, &Lora { rank: 2, ..Lora::default() }).unwrap();
        let n_all = all.ops.iter().filter(|o| o.attrs.get(LORA_ATTR) == Some(&Attr::Text("b".into()))).count();
        assert!(n_all > adapted.len() + 6, "{n_all}");
    }

    /// MLA-style queries and keys are concatenations (a no-position part beside a rotary
    /// part, each from its own linear): the qkv targets follow attention's inputs back
    /// through the concatenation and the rotary embedding to every linear that makes a
    /// part of q, k or v: here q_nope and q_rope (concatenated into q), k and v, four
    /// adapters; the output projection after attention is not one of them.
    #[test]
    fn qkv_targets_follow_concatenated_queries() {
        let a = |n: &str, s: &[u64]| t(n, s, BF16, Activation);
        let w = |n: &str, s: &[u64]| t(n, s, BF16, Weight);
        let tensors = vec![
            a("x", &[1, 4, 8]),
            w("wqn", &[8, 8]),
            a("qn", &[1, 4, 2, 4]),
            w("wqr", &[4, 8]),
            a("qr", &[1, 4, 2, 2]),
            a("qrr", &[1, 4, 2, 2]),
            a("q", &[1, 4, 2, 6]),
            w("wk", &[12, 8]),
            a("k", &[1, 4, 2, 6]),
            w("wv", &[8, 8]),
            a("v", &[1, 4, 2, 4]),
            a("o", &[1, 4, 2, 4]),
            w("wo", &[8, 8]),
            a("y", &[1, 4, 8]),
        ];
        let col = |n: &str, i: &[&str], o: &str| role(op_in(n, OpKind::Linear, i, &[o], &[], 0), Role::ColumnParallel);
        let ops = vec![
            col("q_nope", &["x", "wqn"], "qn"),
            col("q_rope", &["x", "wqr"], "qr"),
            op_in("rope", OpKind::Rotary, &["qr"], &["qrr"], &[("rot-dim", Attr::Int(2)), ("theta", Attr::Float(1e4))], 0),
            op_in("q_cat", OpKind::Concat, &["qn", "qrr"], &["q"], &[], 0),
            col("k", &["x", "wk"], "k"),
            col("v", &["x", "wv"], "v"),
            op_in("core", OpKind::Attention, &["q", "k", "v"], &["o"], &[("causal", Attr::Flag(true))], 0),
            role(op_in("out", OpKind::Linear, &["o", "wo"], &["y"], &[], 0), Role::RowParallel),
        ];
        let g = Graph::new(tensors, ops, "y").unwrap();
        let l = lora(&g, &Lora { rank: 2, targets: LoraTargets::Qkv }).unwrap();
        let mut adapted: Vec<&str> =
            l.ops.iter().filter(|o| o.attrs.get(LORA_ATTR) == Some(&Attr::Text("b".into()))).map(|o| o.name.as_str()).collect();
        adapted.sort_unstable();
        assert_eq!(adapted, ["k.lora_b", "q_nope.lora_b", "q_rope.lora_b", "v.lora_b"]);
    }

    /// Qwen3's per-head q/k norms sit between the q and k linears and RoPE: the qkv
    /// targets follow attention's inputs back through them (and the rotary embeddings) to
    /// q, k and v, three adapters; the residual norm before the projections stops the walk.
    #[test]
    fn qkv_targets_follow_per_head_query_and_key_norms() {
        let a = |n: &str, s: &[u64]| t(n, s, BF16, Activation);
        let w = |n: &str, s: &[u64]| t(n, s, BF16, Weight);
        let tensors = vec![
            a("h", &[1, 4, 8]),
            w("n", &[8]),
            a("x", &[1, 4, 8]),
            w("wq", &[8, 8]),
            a("q", &[1, 4, 2, 4]),
            w("qn", &[4]),
            a("qnorm", &[1, 4, 2, 4]),
            a("qr", &[1, 4, 2, 4]),
            w("wk", &[8, 8]),
            a("k", &[1, 4, 2, 4]),
            w("kn", &[4]),
            a("knorm", &[1, 4, 2, 4]),
            a("kr", &[1, 4, 2, 4]),
            w("wv", &[8, 8]),
            a("v", &[1, 4, 2, 4]),
            a("o", &[1, 4, 2, 4]),
        ];
        let col = |n: &str, i: &[&str], o: &str| role(op_in(n, OpKind::Linear, i, &[o], &[], 0), Role::ColumnParallel);
        let eps = [("eps", Attr::Float(1e-6))];
        let rope = [("rot-dim", Attr::Int(4)), ("theta", Attr::Float(1e6))];
        let ops = vec![
            op_in("norm", OpKind::RmsNorm, &["h", "n"], &["x"], &eps, 0),
            col("q", &["x", "wq"], "q"),
            role(op_in("q_norm", OpKind::RmsNorm, &["q", "qn"], &["qnorm"], &eps, 0), Role::HeadParallel),
            op_in("q_rope", OpKind::Rotary, &["qnorm"], &["qr"], &rope, 0),
            col("k", &["x", "wk"], "k"),
            role(op_in("k_norm", OpKind::RmsNorm, &["k", "kn"], &["knorm"], &eps, 0), Role::HeadParallel),
            op_in("k_rope", OpKind::Rotary, &["knorm"], &["kr"], &rope, 0),
            col("v", &["x", "wv"], "v"),
            op_in("core", OpKind::Attention, &["qr", "kr", "v"], &["o"], &[("causal", Attr::Flag(true))], 0),
        ];
        let g = Graph::new(tensors, ops, "o").unwrap();
        let l = lora(&g, &Lora { rank: 2, targets: LoraTargets::Qkv }).unwrap();
        let mut adapted: Vec<&str> =
            l.ops.iter().filter(|o| o.attrs.get(LORA_ATTR) == Some(&Attr::Text("b".into()))).map(|o| o.name.as_str()).collect();
        adapted.sort_unstable();
        assert_eq!(adapted, ["k.lora_b", "q.lora_b", "v.lora_b"]);
    }

    #[test]
    fn target_modules_parse_as_megatron_bridge_names_them() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(LoraTargets::from_modules(&names(&["linear_qkv"])), Ok(LoraTargets::Qkv));
        assert_eq!(
            LoraTargets::from_modules(&names(&["linear_fc2", "linear_qkv", "linear_fc1", "linear_proj"])),
            Ok(LoraTargets::All)
        );
        let err = LoraTargets::from_modules(&names(&["linear_fc1"])).unwrap_err();
        assert!(err.contains("linear_fc1") && err.contains("supported"), "{err}");
    }
}
