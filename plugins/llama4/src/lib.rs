//! Llama 4 Maverick: 48 layers alternating dense SwiGLU MLPs with MoE layers of 128
//! routed experts (top-1, sigmoid gate) plus one shared expert; GQA with 8 KV heads. Plus
//! `llama4-tiny`, a runner CPU proxy with the same architecture.
//!
//! Sources: Hugging Face `config.json` (text_config) of
//! meta-llama/Llama-4-Maverick-17B-128E (48 layers, hidden 5120, 40 heads, 8 KV heads,
//! head_dim 128, intermediate_size 8192 per expert and shared expert,
//! intermediate_size_mlp 16384 for dense layers, 128 local experts, 1 per token,
//! interleave_moe_layer_step 2 (MoE in layers 1, 3, 5, ...), vocab 202048, rope_theta
//! 500000, rms_norm_eps 1e-5, untied); Meta's Llama 4 model card: 17B active / 400B total,
//! ~22T training tokens. The vision encoder, the NoPE layers (every 4th layer skips RoPE,
//! same FLOPs) and the per-head QK norm are not modelled. No reference layout is
//! transcribed in our notes.

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, moe, variant, Layout};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "llama4";

/// Llama 4's conventions: routed experts of `expert_ffn` with one shared expert of the same
/// width in every other layer (1, 3, 5, ...), sigmoid top-1 gate without renormalisation,
/// dense layers of `dense_ffn`, RoPE theta 500,000.
#[allow(clippy::too_many_arguments, reason = "one row of the family's table")]
fn llama4(layers: u32, hidden: u32, dense_ffn: u32, heads: u32, kv_heads: u32, head_dim: u32, experts: u32, expert_ffn: u32, vocab: u32) -> Hyperparameters {
    Hyperparameters {
        head_dim,
        rope_theta: 500_000.0,
        max_position: 1_048_576,
        moe: Some(MoeConfig {
            shared_experts: 1,
            layer_frequency: 2,
            score: RouterScore::Sigmoid,
            normalize_top_k: false,
            ..moe(experts, 1, expert_ffn)
        }),
        ..decoder(layers, hidden, dense_ffn, heads, kv_heads, vocab)
    }
}

/// The plugin; tests call its `Guest` functions natively.
pub struct Llama4;

impl Guest for Llama4 {
    fn describe() -> ModelInfo {
        ModelInfo {
            family: FAMILY.into(),
            variants: vec![
                variant(
                    "llama4-maverick-400b",
                    FAMILY,
                    "Meta, Llama 4 model card (Maverick 17B-128E); HF config.json",
                    llama4(48, 5120, 16_384, 40, 8, 128, 128, 8192, 202_048),
                    defaults(8192, 22e12, 1e-4),
                    [],
                ),
                // CPU proxy with the Llama 4 architecture (dense and MoE layers alternating,
                // sigmoid top-1 routing plus a shared expert, dense FFN twice the expert
                // width, GQA, RoPE, RMSNorm, untied) at 4 layers x 256, 8 heads of 32 sharing
                // 2 KV heads, 8 experts of width 256, dense FFN 512.
                variant(
                    "llama4-tiny",
                    FAMILY,
                    "runner proxy with the Llama 4 Maverick architecture (4 layers, hidden 256, 8 experts top-1 + shared)",
                    llama4(4, 256, 512, 8, 2, 32, 8, 256, 8192),
                    defaults(256, 1e8, 1e-3),
                    [Layout::new("CPU", 1, 1, "BF16").mbs(8).gbs_fixed(8).source("runner CPU proxy")],
                ),
            ],
        }
    }

    fn graph(request: GraphRequest) -> Result<Graph, String> {
        graph_for(&Self::describe(), &request)
    }
}

runner_plugin_sdk::export_workload!(Llama4);

#[cfg(test)]
mod tests {
    use runner_graph::count::Convention;
    use runner_graph::OpKind as HostOp;
    use runner_plugin_testkit as kit;

    use super::*;

    #[test]
    fn every_variant_builds_and_validates() {
        kit::check_all_variants(&Llama4::describe(), Llama4::graph);
    }

    /// Meta counts active parameters with embeddings (17.2B rounds to 17B).
    #[test]
    fn parameters_match_published() {
        let p = kit::params(Llama4::graph, "llama4-maverick-400b", 0);
        kit::assert_close("llama4-maverick params", p.total as f64, 400e9, 0.005);
        kit::assert_close("llama4-maverick active", p.active as f64, 17e9, 0.015);
    }

    /// DGXC Benchmarking's Llama 4 Maverick README (github:NVIDIA/dgxc-benchmarking) quotes
    /// 8.92e14 FLOPs/sample: the causal-halved convention at
    /// sequence 8192 (non-causal would be +11%).
    #[test]
    fn model_flops_match_dgxc() {
        let f = kit::flops_per_sample(Llama4::graph, "llama4-maverick-400b", 8192, 0, &Convention::CAUSAL);
        kit::assert_close("llama4-maverick FLOPs/sample (causal, 8192)", f, 8.92e14, 0.01);
        // 40 heads of 128 in all 48 layers.
        kit::assert_causal_halves_scores(Llama4::graph, "llama4-maverick-400b", 8192, 48, 5120, 5120);
    }

    /// The CPU proxy is the last variant, fits the host's measurement budget (2 layers of
    /// f32 weights, grads and AdamW moments in 1 GiB) and builds at the measured size
    /// (seq 256 x batch 8) with Llama 4's interleaving: layer 0 dense, layer 1 routed
    /// (sigmoid top-1, not renormalised) beside a shared expert.
    #[test]
    fn tiny_proxy_has_the_llama4_architecture() {
        let info = Llama4::describe();
        let v = info.variants.last().unwrap();
        assert_eq!(v.name, "llama4-tiny");
        assert_eq!(v.hyper.attention, AttentionKind::Gqa);
        let (g, p2) = kit::measured_graph(Llama4::graph, "llama4-tiny", 2);
        let count = |k: HostOp| g.ops.iter().filter(|o| o.kind == k).count();
        assert_eq!((count(HostOp::Router), count(HostOp::GroupedLinear)), (1, 3));
        let has = |n: &str| g.ops.iter().any(|o| o.name == n);
        assert!(has("layers.0.mlp.down") && has("layers.1.moe.router") && has("layers.1.moe.shared.down"));
        let router = g.ops.iter().find(|o| o.kind == HostOp::Router).unwrap();
        assert_eq!((router.int("top-k"), router.text("score"), router.flag("normalize")), (Some(1), Some("sigmoid"), Some(false)));
        // embed + head 2*8192*256, final norm 256; per layer: attention 256*(256+64+64+256),
        // two norms 512; layers 0, 2 dense 3*256*512; layers 1, 3 router 256*8, experts
        // 8*3*256*256, shared 3*256*256. Active: 1 of 8 experts.
        let base = 2 * 8192 * 256 + 256 + 4 * (256 * 640 + 512) + 2 * 3 * 256 * 512 + 2 * (256 * 8 + 3 * 256 * 256);
        let experts = 2 * 8 * 3 * 256 * 256;
        let p = kit::params(Llama4::graph, "llama4-tiny", 0);
        assert_eq!((p.total, p.active), (base + experts, base + experts / 8));
        println!("llama4-tiny params: {} total, {} active (2 layers: {})", p.total, p.active, p2.total);
    }
}
