//! Qwen3 mixture-of-experts decoders: 128 SwiGLU experts, top-8 softmax routing with the
//! top-k renormalised, GQA with 4 KV heads of 128, no shared expert; plus `qwen3-tiny`, a
//! runner CPU proxy with the same architecture.
//!
//! Sources: Hugging Face `config.json` of Qwen/Qwen3-30B-A3B (48 layers, hidden 2048,
//! 32 heads, 4 KV heads, head_dim 128, moe_intermediate_size 768, 128 experts, 8 per token,
//! vocab 151936, rope_theta 1e6, rms_norm_eps 1e-6, untied) and Qwen/Qwen3-235B-A22B
//! (94 layers, hidden 4096, 64 heads, moe_intermediate_size 1536); "Qwen3 Technical
//! Report" (arXiv 2505.09388): 36T pretraining tokens, 30.5B/3.3B and 235B/22B parameters.
//! Every variant has the per-head query/key RMSNorms (QK norm, 2 x head_dim weights a
//! layer, before RoPE; Hugging Face `Qwen3MoeAttention.q_norm`/`k_norm`), which the
//! builder adds with [`GraphOptions::qk_norm`]. Layouts: Megatron-Bridge performance
//! summaries (github:NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md@067f987).

use runner_plugin_sdk::workload::builder::{GraphOptions, decoder, defaults, graph_for_with, moe, variant, Layout};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "qwen3";
const MB: &str = "github:NVIDIA-NeMo/Megatron-Bridge/docs/performance-summary-archive.md@067f987";

fn qwen3(layers: u32, hidden: u32, heads: u32, expert_ffn: u32) -> Hyperparameters {
    qwen3_shape(layers, hidden, heads, 4, 128, moe(128, 8, expert_ffn), 151_936)
}

/// Qwen3's conventions (head dim set apart from hidden / heads, RoPE theta 1e6, RMSNorm
/// eps 1e-6, MoE in every layer) at any size.
fn qwen3_shape(layers: u32, hidden: u32, heads: u32, kv_heads: u32, head_dim: u32, experts: MoeConfig, vocab: u32) -> Hyperparameters {
    Hyperparameters {
        head_dim,
        rope_theta: 1e6,
        max_position: 40_960,
        norm_eps: 1e-6,
        moe: Some(experts),
        ..decoder(layers, hidden, 0, heads, kv_heads, vocab)
    }
}

/// The plugin; tests call its `Guest` functions natively.
pub struct Qwen3;

impl Guest for Qwen3 {
    fn describe() -> ModelInfo {
        let cite = "Qwen Team, Qwen3 Technical Report, arXiv 2505.09388; HF config.json";
        ModelInfo {
            family: FAMILY.into(),
            variants: vec![
                variant("qwen3-30b-a3b", FAMILY, cite, qwen3(48, 2048, 32, 768), defaults(4096, 36e12, 3e-4), [
                    // QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 (current scaling); the
                    // summaries say FP8.
                    Layout::new("H100", 16, 16, "FP8-CS").ep(16).gbs_fixed(1024).source(&format!("{MB} (26.06)")),
                    Layout::new("H100", 16, 16, "FP8-CS").pp(2).vp(12).ep(8).gbs_fixed(1024).source(&format!("{MB} (26.02)")),
                    Layout::new("B200", 8, 8, "MXFP8").ep(8).mbs(4).gbs_fixed(512).source(&format!("{MB} (26.02.01)")),
                    Layout::new("GB200", 8, 8, "MXFP8").ep(8).mbs(4).gbs_fixed(512).source(&format!("{MB} (26.02, 26.06)")),
                    Layout::new("B300", 8, 8, "MXFP8").ep(8).mbs(8).gbs_fixed(512).source(&format!("{MB} (26.02.01)")),
                    Layout::new("GB300", 8, 8, "MXFP8").ep(8).mbs(8).gbs_fixed(512).source(&format!("{MB} (26.02.01, 26.06.01)")),
                ]),
                variant("qwen3-235b-a22b", FAMILY, cite, qwen3(94, 4096, 64, 1536), defaults(4096, 36e12, 3e-4), []),
                // CPU proxy: the Qwen3-MoE architecture (softmax top-k routing renormalised over
                // the top-k in every layer, no shared expert, SwiGLU experts, GQA whose heads
                // are twice as wide as hidden / heads, as in 30B-A3B) at 4 layers x 256,
                // 8 heads of 64 sharing 2 KV heads, 8 experts of width 256, top-2.
                variant(
                    "qwen3-tiny",
                    FAMILY,
                    "runner proxy with the Qwen3-MoE architecture (4 layers, hidden 256, 8 experts top-2)",
                    qwen3_shape(4, 256, 8, 2, 64, moe(8, 2, 256), 8192),
                    defaults(256, 1e8, 1e-3),
                    [Layout::new("CPU", 1, 1, "BF16").mbs(8).gbs_fixed(8).source("runner CPU proxy")],
                ),
            ],
        }
    }

    /// Every Qwen3 variant normalises its query and key heads (the option is per family:
    /// the contract's hyperparameters have no field for it).
    fn graph(request: GraphRequest) -> Result<Graph, String> {
        graph_for_with(&Self::describe(), &request, GraphOptions { qk_norm: true, ..GraphOptions::default() })
    }
}

runner_plugin_sdk::export_workload!(Qwen3);

#[cfg(test)]
mod tests {
    use runner_graph::OpKind as HostOp;
    use runner_plugin_testkit as kit;

    use super::*;

    #[test]
    fn every_variant_builds_and_validates() {
        kit::check_all_variants(&Qwen3::describe(), Qwen3::graph);
    }

    /// Totals exactly those of the released checkpoints (the Hugging Face model pages'
    /// safetensors parameter counts of Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B, the
    /// q/k norms included: without them each total is 2 x 128 per layer short). Active
    /// counts include the embedding tables; Qwen publishes them rounded to 0.1B (3.3B) and
    /// 1B (22B), so the tolerance is the rounding.
    #[test]
    fn parameters_match_published() {
        for (name, total, active, tol) in [("qwen3-30b-a3b", 30_532_122_624u64, 3.3e9, 0.02), ("qwen3-235b-a22b", 235_093_634_560, 22e9, 0.025)] {
            let p = kit::params(Qwen3::graph, name, 0);
            assert_eq!(p.total, total, "{name} params");
            kit::assert_close(&format!("{name} active"), p.active as f64, active, tol);
        }
    }

    /// The CPU proxy is the last variant, fits the host's measurement budget (2 layers of
    /// f32 weights, grads and AdamW moments in 1 GiB) and builds at the measured size
    /// (seq 256 x batch 8) with Qwen3's routed experts in every layer (softmax top-2,
    /// renormalised, no shared expert) and query heads wider than hidden / heads.
    #[test]
    fn tiny_proxy_has_the_qwen3_architecture() {
        let info = Qwen3::describe();
        let v = info.variants.last().unwrap();
        assert_eq!(v.name, "qwen3-tiny");
        assert_eq!(v.hyper.attention, AttentionKind::Gqa);
        let (g, p2) = kit::measured_graph(Qwen3::graph, "qwen3-tiny", 2);
        let count = |k: HostOp| g.ops.iter().filter(|o| o.kind == k).count();
        assert_eq!(count(HostOp::Router), 2, "MoE in every layer");
        assert_eq!(count(HostOp::GroupedLinear), 6, "gate, up, down per layer");
        assert_eq!((count(HostOp::MoeDispatch), count(HostOp::MoeCombine)), (2, 2));
        let router = g.ops.iter().find(|o| o.kind == HostOp::Router).unwrap();
        assert_eq!((router.int("top-k"), router.text("score"), router.flag("normalize")), (Some(2), Some("softmax"), Some(true)));
        assert!(!g.ops.iter().any(|o| o.name.contains("shared")));
        let shape = |n: &str| g.tensor(g.tensor_id(n).unwrap()).shape.clone();
        assert_eq!(shape("layers.0.attn.q.weight"), vec![512, 256]);
        assert_eq!(shape("layers.0.attn.k.weight"), vec![128, 256]);
        assert_eq!(shape("layers.0.attn.out.weight"), vec![256, 512]);
        // The q/k norms: over the head dim 64, head-parallel, between projection and RoPE.
        for (x, heads) in [("q", 8), ("k", 2)] {
            assert_eq!(shape(&format!("layers.1.attn.{x}_norm.weight")), vec![64]);
            assert_eq!(shape(&format!("layers.1.attn.{x}_norm")), vec![8, 256, heads, 64]);
            let rope = g.ops.iter().find(|o| o.name == format!("layers.1.attn.{x}_rope")).unwrap();
            assert_eq!(g.tensor(rope.inputs[0]).name, format!("layers.1.attn.{x}_norm"));
        }
        assert_eq!(count(HostOp::RmsNorm), 2 * 4 + 1, "attention, MLP, q and k norms per layer; the final norm");
        // embed + head 2*8192*256, final norm 256; per layer: attention 256*(512+128+128+512),
        // router 256*8, experts 8*3*256*256, two norms 512, q/k norms 2*64. Active: 2 of 8
        // experts.
        let p = kit::params(Qwen3::graph, "qwen3-tiny", 0);
        let (dense, experts) = (2 * 8192 * 256 + 256 + 4 * (256 * 1280 + 256 * 8 + 512 + 128), 4 * 8 * 3 * 256 * 256);
        assert_eq!((p.total, p.active), (dense + experts, dense + experts / 4));
        println!("qwen3-tiny params: {} total, {} active (2 layers: {})", p.total, p.active, p2.total);
    }
}
