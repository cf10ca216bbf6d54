//! Grok-1: 314B mixture-of-experts decoder, 8 GeGLU experts with top-2 softmax routing,
//! GQA with 8 KV heads, tied input/output embedding; plus `grok1-tiny`, a runner CPU proxy
//! with the same architecture.
//!
//! Sources: github:xai-org/grok-1 `run.py` / `model.py` (64 layers, emb_size 6144
//! = 48 x 128, 48 query heads, 8 KV heads, key size 128, widening_factor 8 giving an FFN of
//! int(8 x 6144) x 2/3 = 32768, num_experts 8, num_selected_experts 2, vocab 131072,
//! sequence 8192, gelu-gated experts, output through the embedding's transpose); xAI's
//! "Open Release of Grok-1" (314B parameters). Grok-1's extra post-attention/post-MLP
//! RMSNorms (2 x 6144 weights a layer) are not modelled. Training tokens are not published.
//! DGXC Benchmarking (github:NVIDIA/dgxc-benchmarking, grok1 recipe) gives an H100 layout
//! (TP4 PP8 CP2 EP8 VP8) without GPU counts or GBS, so no reference layout is listed.

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, moe, variant, Layout};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "grok1";

/// Grok-1's conventions: 8 GeGLU experts of `expert_ffn`, top-2 softmax routing in every
/// layer, tied embedding.
fn grok(layers: u32, hidden: u32, expert_ffn: u32, heads: u32, kv_heads: u32, vocab: u32) -> Hyperparameters {
    Hyperparameters {
        tied_embeddings: true,
        activation: ActivationKind::Geglu,
        moe: Some(moe(8, 2, expert_ffn)),
        ..decoder(layers, hidden, 0, heads, kv_heads, vocab)
    }
}

/// The plugin; tests call its `Guest` functions natively.
pub struct Grok1;

impl Guest for Grok1 {
    fn describe() -> ModelInfo {
        ModelInfo {
            family: FAMILY.into(),
            variants: vec![
                variant(
                    "grok1-314b",
                    FAMILY,
                    "xAI, Open Release of Grok-1 (2024); github:xai-org/grok-1 model.py",
                    grok(64, 6144, 32_768, 48, 8, 131_072),
                    defaults(8192, 1e12, 1e-4),
                    [],
                ),
                // CPU proxy with the Grok-1 architecture (8 GeGLU experts, top-2 softmax
                // routing in every layer, GQA, RoPE, RMSNorm, tied embedding) at 4 layers x
                // 256, 8 heads of 32 sharing 2 KV heads, experts of width 256.
                variant(
                    "grok1-tiny",
                    FAMILY,
                    "runner proxy with the Grok-1 architecture (4 layers, hidden 256, 8 experts top-2)",
                    grok(4, 256, 256, 8, 2, 8192),
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

runner_plugin_sdk::export_workload!(Grok1);

#[cfg(test)]
mod tests {
    use runner_graph::count::Convention;
    use runner_graph::OpKind as HostOp;
    use runner_plugin_testkit as kit;

    use super::*;

    #[test]
    fn every_variant_builds_and_validates() {
        kit::check_all_variants(&Grok1::describe(), Grok1::graph);
    }

    #[test]
    fn parameters_match_published() {
        let p = kit::params(Grok1::graph, "grok1-314b", 0);
        // "314B" is rounded; the release's own shapes give 315.7B (tied embedding counted once).
        kit::assert_close("grok1 params", p.total as f64, 314e9, 0.006);
        println!("grok1 active: {:.4e} (no published figure)", p.active as f64);
    }

    /// DGXC: attention s/h/2 (causal-halved), MLP 18·L·f·h·topK: 4.27e15 at 8192.
    #[test]
    fn model_flops_match_dgxc() {
        let f = kit::flops_per_sample(Grok1::graph, "grok1-314b", 8192, 0, &Convention::CAUSAL);
        kit::assert_close("grok1 FLOPs/sample (causal)", f, 4.27e15, 0.01);
        // 48 heads of 128.
        kit::assert_causal_halves_scores(Grok1::graph, "grok1-314b", 8192, 64, 6144, 6144);
    }

    /// The CPU proxy is the last variant, fits the host's measurement budget (2 layers of
    /// f32 weights, grads and AdamW moments in 1 GiB) and builds at the measured size
    /// (seq 256 x batch 8) with Grok-1's GeGLU experts under top-2 softmax routing in every
    /// layer and the head tied to the embedding.
    #[test]
    fn tiny_proxy_has_the_grok1_architecture() {
        let info = Grok1::describe();
        let v = info.variants.last().unwrap();
        assert_eq!(v.name, "grok1-tiny");
        assert_eq!(v.hyper.attention, AttentionKind::Gqa);
        let (g, p2) = kit::measured_graph(Grok1::graph, "grok1-tiny", 2);
        let count = |k: HostOp| g.ops.iter().filter(|o| o.kind == k).count();
        assert_eq!((count(HostOp::Router), count(HostOp::GroupedLinear), count(HostOp::MoeCombine)), (2, 6, 2));
        assert_eq!((count(HostOp::GeGlu), count(HostOp::SwiGlu)), (2, 0));
        let router = g.ops.iter().find(|o| o.kind == HostOp::Router).unwrap();
        assert_eq!((router.int("top-k"), router.text("score")), (Some(2), Some("softmax")));
        assert!(g.tensor_id("lm_head.weight").is_none(), "head is tied to the embedding");
        // embed 8192*256 (tied), final norm 256; per layer: attention 256*(256+64+64+256),
        // router 256*8, experts 8*3*256*256, two norms 512. Active: 2 of 8 experts.
        let (dense, experts) = (8192 * 256 + 256 + 4 * (256 * 640 + 256 * 8 + 512), 4 * 8 * 3 * 256 * 256);
        let p = kit::params(Grok1::graph, "grok1-tiny", 0);
        assert_eq!((p.total, p.active), (dense + experts, dense + experts / 4));
        println!("grok1-tiny params: {} total, {} active (2 layers: {})", p.total, p.active, p2.total);
    }
}
