//! Qwen3 mixture-of-experts decoders: 128 SwiGLU experts, top-8 softmax routing with the
//! top-k renormalised, GQA with 4 KV heads of 128, no shared expert.
//!
//! Sources: Hugging Face `config.json` of Qwen/Qwen3-30B-A3B (48 layers, hidden 2048,
//! 32 heads, 4 KV heads, head_dim 128, moe_intermediate_size 768, 128 experts, 8 per token,
//! vocab 151936, rope_theta 1e6, rms_norm_eps 1e-6, untied) and Qwen/Qwen3-235B-A22B
//! (94 layers, hidden 4096, 64 heads, moe_intermediate_size 1536); "Qwen3 Technical
//! Report" (arXiv 2505.09388): 36T pretraining tokens, 30.5B/3.3B and 235B/22B parameters.
//! The per-head q/k RMSNorms (256 weights a layer) are not in the primitive set and are
//! left out. Layouts: Megatron-Bridge performance summaries (shared/data/calibration.toml).

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, moe, variant, Layout};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "qwen3";
const MB: &str = "github:NVIDIA-NeMo/Megatron-Bridge/docs/performance-summary-archive.md@067f987";

fn qwen3(layers: u32, hidden: u32, heads: u32, expert_ffn: u32) -> Hyperparameters {
    Hyperparameters {
        head_dim: 128,
        rope_theta: 1e6,
        max_position: 40_960,
        norm_eps: 1e-6,
        moe: Some(moe(128, 8, expert_ffn)),
        ..decoder(layers, hidden, 0, heads, 4, 151_936)
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
                    Layout::new("H100", 16, 16, "FP8").ep(16).gbs_fixed(1024).source(&format!("{MB} (26.06)")),
                    Layout::new("H100", 16, 16, "FP8").pp(2).vp(12).ep(8).gbs_fixed(1024).source(&format!("{MB} (26.02)")),
                    Layout::new("B200", 8, 8, "MXFP8").ep(8).mbs(4).gbs_fixed(512).source(&format!("{MB} (26.02.01)")),
                    Layout::new("GB200", 8, 8, "MXFP8").ep(8).mbs(4).gbs_fixed(512).source(&format!("{MB} (26.02, 26.06)")),
                    Layout::new("B300", 8, 8, "MXFP8").ep(8).mbs(8).gbs_fixed(512).source(&format!("{MB} (26.02.01)")),
                    Layout::new("GB300", 8, 8, "MXFP8").ep(8).mbs(8).gbs_fixed(512).source(&format!("{MB} (26.02.01, 26.06.01)")),
                ]),
                variant("qwen3-235b-a22b", FAMILY, cite, qwen3(94, 4096, 64, 1536), defaults(4096, 36e12, 3e-4), []),
            ],
        }
    }

    fn graph(request: GraphRequest) -> Result<Graph, String> {
        graph_for(&Self::describe(), &request)
    }
}

runner_plugin_sdk::export_workload!(Qwen3);

#[cfg(test)]
mod tests {
    use runner_plugin_testkit as kit;

    use super::*;

    #[test]
    fn every_variant_builds_and_validates() {
        kit::check_all_variants(&Qwen3::describe(), Qwen3::graph);
    }

    /// Totals within 0.5%. Active counts include the embedding tables; Qwen publishes them
    /// rounded to 0.1B (3.3B) and 1B (22B), so the tolerance is the rounding.
    #[test]
    fn parameters_match_published() {
        for (name, total, active, tol) in [("qwen3-30b-a3b", 30.5e9, 3.3e9, 0.02), ("qwen3-235b-a22b", 235e9, 22e9, 0.025)] {
            let p = kit::params(Qwen3::graph, name, 0);
            kit::assert_close(&format!("{name} params"), p.total as f64, total, 0.005);
            kit::assert_close(&format!("{name} active"), p.active as f64, active, tol);
        }
    }
}
