//! gpt-oss-120b: 36 layers of GQA attention alternating 128-token sliding windows with
//! full attention, and 128 SwiGLU experts with top-4 softmax routing; attention and router
//! linears carry biases.
//!
//! Sources: Hugging Face `config.json` of openai/gpt-oss-120b (36 layers, hidden 2880,
//! 64 heads, 8 KV heads, head_dim 64, intermediate_size 2880, num_local_experts 128,
//! experts_per_token 4, vocab 201088, sliding_window 128 with layer_types alternating
//! sliding/full from layer 0, rope_theta 150000, rms_norm_eps 1e-5, attention_bias true,
//! untied); OpenAI "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv 2508.10925) Table 1:
//! 116.83B total, 5.13B active parameters. Not representable in the primitive set and left
//! out: expert biases (39.8M), attention sinks (64 per layer), the clamped SwiGLU variant
//! (same FLOPs), YaRN. Training tokens are not published (1e12 is the runner default).
//! Layouts: Megatron-Bridge tables (shared/data/calibration.toml).

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, moe, variant, Layout};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "gptoss";
const MB: &str = "github:NVIDIA-NeMo/Megatron-Bridge/docs/performance-summary-archive.md@067f987";

/// The plugin; tests call its `Guest` functions natively.
pub struct GptOss;

impl Guest for GptOss {
    fn describe() -> ModelInfo {
        let hyper = Hyperparameters {
            head_dim: 64,
            rope_theta: 150_000.0,
            max_position: 131_072,
            moe: Some(moe(128, 4, 2880)),
            attention_window: 128,
            window_every: 2,
            bias: true,
            ..decoder(36, 2880, 0, 64, 8, 201_088)
        };
        let l = |gpu: &str, p: &str, ep: u32, mbs: u32, rel: &str| {
            Layout::new(gpu, 64, 64, p).ep(ep).mbs(mbs).gbs_fixed(1280).source(&format!("{MB} ({rel})"))
        };
        ModelInfo {
            family: FAMILY.into(),
            variants: vec![variant(
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
            )],
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
}
