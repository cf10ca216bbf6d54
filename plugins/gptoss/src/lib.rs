//! gpt-oss-120b: 36 layers of GQA attention alternating 128-token sliding windows with
//! full attention, and 128 SwiGLU experts with top-4 softmax routing; attention and router
//! linears carry biases; plus `gpt-oss-tiny`, a runner CPU proxy with the same
//! architecture.
//!
//! Sources: Hugging Face `config.json` of openai/gpt-oss-120b (36 layers, hidden 2880,
//! 64 heads, 8 KV heads, head_dim 64, intermediate_size 2880, num_local_experts 128,
//! experts_per_token 4, vocab 201088, sliding_window 128 with layer_types alternating
//! sliding/full from layer 0, rope_theta 150000, rms_norm_eps 1e-5, attention_bias true,
//! untied); OpenAI "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv 2508.10925) Table 1:
//! 116.83B total, 5.13B active parameters. Not representable in the primitive set and left
//! out: expert biases (39.8M), attention sinks (64 per layer), the clamped SwiGLU variant
//! (same FLOPs), YaRN. Training tokens are not published (1e12 is the runner default).
//! Layouts: Megatron-Bridge performance summaries
//! (github:NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md@067f987).

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, moe, variant, Layout};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "gptoss";
const MB: &str = "github:NVIDIA-NeMo/Megatron-Bridge/docs/performance-summary-archive.md@067f987";

/// gpt-oss conventions: heads of 64 whatever the width, every other layer (from layer 0)
/// a 128-token sliding window, biased attention and router linears, RoPE theta 150,000.
fn gptoss(layers: u32, hidden: u32, heads: u32, kv_heads: u32, experts: MoeConfig, vocab: u32) -> Hyperparameters {
    Hyperparameters {
        head_dim: 64,
        rope_theta: 150_000.0,
        max_position: 131_072,
        moe: Some(experts),
        attention_window: 128,
        window_every: 2,
        bias: true,
        ..decoder(layers, hidden, 0, heads, kv_heads, vocab)
    }
}

/// The plugin; tests call its `Guest` functions natively.
pub struct GptOss;

impl Guest for GptOss {
    fn describe() -> ModelInfo {
        let hyper = gptoss(36, 2880, 64, 8, moe(128, 4, 2880), 201_088);
        let l = |gpu: &str, p: &str, ep: u32, mbs: u32, rel: &str| {
            Layout::new(gpu, 64, 64, p).ep(ep).mbs(mbs).gbs_fixed(1280).source(&format!("{MB} ({rel})"))
        };
        ModelInfo {
            family: FAMILY.into(),
            variants: vec![
                variant(
                    "gpt-oss-120b",
                    FAMILY,
                    "OpenAI, gpt-oss-120b & gpt-oss-20b Model Card, arXiv 2508.10925; HF config.json",
                    hyper,
                    defaults(4096, 1e12, 3e-4),
                    [
                        Layout::new("H100", 64, 64, "BF16").pp(4).ep(8).gbs_fixed(1280).source(&format!("{MB} (26.02)")),
                        l("B200", "BF16", 64, 4, "26.02"),
                        l("B300", "BF16", 8, 4, "26.02.01"),
                        l("GB200", "BF16", 64, 4, "26.02"),
                        l("GB200", "MXFP8", 64, 4, "26.06.01"),
                        l("GB300", "BF16", 64, 4, "26.02"),
                        l("GB300", "MXFP8", 16, 4, "26.06.01"),
                    ],
                ),
                // CPU proxy with the gpt-oss architecture (alternating 128-token windows and
                // full attention, GQA with heads of 64, biased attention and router, softmax
                // top-k SwiGLU experts in every layer) at 4 layers x 256, 8 heads sharing 2 KV
                // heads, 8 experts of width 256, top-2.
                variant(
                    "gpt-oss-tiny",
                    FAMILY,
                    "runner proxy with the gpt-oss architecture (4 layers, hidden 256, 8 experts top-2, 128-token windows)",
                    gptoss(4, 256, 8, 2, moe(8, 2, 256), 8192),
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

runner_plugin_sdk::export_workload!(GptOss);

#[cfg(test)]
mod tests {
    use runner_graph::count::Convention;
    use runner_graph::OpKind as HostOp;
    use runner_plugin_testkit as kit;

    use super::*;

    #[test]
    fn every_variant_builds_and_validates() {
        kit::check_all_variants(&GptOss::describe(), GptOss::graph);
    }

    /// OpenAI counts active parameters without the input embedding table (the unembedding
    /// counts): 5.13B.
    #[test]
    fn parameters_match_published() {
        let p = kit::params(GptOss::graph, "gpt-oss-120b", 0);
        kit::assert_close("gpt-oss-120b params", p.total as f64, 116.83e9, 0.005);
        kit::assert_close("gpt-oss-120b active (no input embedding)", (p.active - p.embedding) as f64, 5.13e9, 0.005);
    }

    #[test]
    fn windowed_layers_alternate() {
        let g = kit::host_graph(GptOss::graph, "gpt-oss-120b", 4096, 1, 2);
        let w: Vec<i64> = g.ops.iter().filter(|o| o.name.ends_with("attn.core")).map(|o| o.int("window").unwrap()).collect();
        assert_eq!(w, vec![128, 0]);
        let f = kit::flops_per_sample(GptOss::graph, "gpt-oss-120b", 4096, 0, &Convention::CAUSAL);
        println!("gpt-oss-120b FLOPs/sample at 4096 [causal]: {f:.4e}");
    }

    /// The CPU proxy is the last variant, fits the host's measurement budget (2 layers of
    /// f32 weights, grads and AdamW moments in 1 GiB) and builds at the measured size
    /// (seq 256 x batch 8, longer than the window) with gpt-oss's pieces: alternating
    /// windowed/full attention, biased attention and router, routed experts every layer.
    #[test]
    fn tiny_proxy_has_the_gptoss_architecture() {
        let info = GptOss::describe();
        let v = info.variants.last().unwrap();
        assert_eq!(v.name, "gpt-oss-tiny");
        assert_eq!(v.hyper.attention, AttentionKind::Gqa);
        let (g, p2) = kit::measured_graph(GptOss::graph, "gpt-oss-tiny", 2);
        let w: Vec<i64> = g.ops.iter().filter(|o| o.name.ends_with("attn.core")).map(|o| o.int("window").unwrap()).collect();
        assert_eq!(w, vec![128, 0]);
        let full = kit::host_graph(GptOss::graph, "gpt-oss-tiny", 256, 1, 0);
        let w: Vec<i64> = full.ops.iter().filter(|o| o.name.ends_with("attn.core")).map(|o| o.int("window").unwrap()).collect();
        assert_eq!(w, vec![128, 0, 128, 0]);
        let count = |k: HostOp| g.ops.iter().filter(|o| o.kind == k).count();
        assert_eq!((count(HostOp::Router), count(HostOp::GroupedLinear), count(HostOp::SwiGlu)), (2, 6, 2));
        let router = g.ops.iter().find(|o| o.kind == HostOp::Router).unwrap();
        assert_eq!((router.int("top-k"), router.text("score")), (Some(2), Some("softmax")));
        for t in ["layers.0.attn.q.bias", "layers.0.attn.out.bias", "layers.1.moe.router_logits.bias"] {
            assert!(g.tensor_id(t).is_some(), "{t}");
        }
        // embed + head 2*8192*256, final norm 256; per layer: q 256*512 + 512, k, v
        // 2*(256*128 + 128), out 512*256 + 256, router 256*8 + 8, experts 8*3*256*256,
        // two norms 512. Active: 2 of 8 experts.
        let attn = 256 * 512 + 512 + 2 * (256 * 128 + 128) + 512 * 256 + 256;
        let (dense, experts) = (2 * 8192 * 256 + 256 + 4 * (attn + 256 * 8 + 8 + 512), 4 * 8 * 3 * 256 * 256);
        let p = kit::params(GptOss::graph, "gpt-oss-tiny", 0);
        assert_eq!((p.total, p.active), (dense + experts, dense + experts / 4));
        println!("gpt-oss-tiny params: {} total, {} active (2 layers: {})", p.total, p.active, p2.total);
    }
}
