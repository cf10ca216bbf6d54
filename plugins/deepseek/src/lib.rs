//! DeepSeek-V3: multi-head latent attention, 1 shared + 256 routed SwiGLU experts with
//! sigmoid top-8 routing, 3 dense leading layers, and one multi-token-prediction module.
//!
//! Sources: Hugging Face `config.json` of deepseek-ai/DeepSeek-V3 (61 layers, hidden 7168,
//! intermediate 18432, moe_intermediate 2048, 128 heads, q_lora_rank 1536, kv_lora_rank 512,
//! qk_nope 128, qk_rope 64, v_head 128, n_routed_experts 256, n_shared_experts 1,
//! num_experts_per_tok 8, first_k_dense_replace 3, moe_layer_freq 1, scoring_func sigmoid,
//! norm_topk_prob true, vocab 129280, rope_theta 10000, rms_norm_eps 1e-6,
//! num_nextn_predict_layers 1); "DeepSeek-V3 Technical Report" (arXiv 2412.19437): 671B total
//! / 37B activated parameters excluding the 14B MTP module, 14.8T tokens, seq 4096, peak lr
//! 2.2e-4. The routing bias (e_score_correction_bias) is not trained by gradient and is
//! left out; YaRN context extension changes no shape.
//! Layouts: DGXC Benchmarking and Megatron-Bridge tables (shared/data/calibration.toml).

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, moe, variant, Layout};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "deepseek";
const DGXC: &str = "github:NVIDIA/dgxc-benchmarking/deepseek_v3/pretraining/README.md@1f6d9f4 (v25.05.04, NeMo 25.04.01)";
const MB: &str = "github:NVIDIA-NeMo/Megatron-Bridge/docs/performance-summary-archive.md@067f987";

fn v3() -> Hyperparameters {
    Hyperparameters {
        head_dim: 192,
        max_position: 163_840,
        norm_eps: 1e-6,
        attention: AttentionKind::Mla,
        mla: Some(MlaConfig { q_lora_rank: 1536, kv_lora_rank: 512, qk_nope_head_dim: 128, qk_rope_head_dim: 64, v_head_dim: 128 }),
        moe: Some(MoeConfig { shared_experts: 1, dense_layers: 3, score: RouterScore::Sigmoid, ..moe(256, 8, 2048) }),
        mtp_depth: 1,
        ..decoder(61, 7168, 18_432, 128, 128, 129_280)
    }
}

/// The plugin; tests call its `Guest` functions natively.
pub struct DeepSeek;

impl Guest for DeepSeek {
    fn describe() -> ModelInfo {
        let layouts = [
            Layout::new("H100", 1024, 1024, "BF16").tp(2).pp(16).ep(64).gbs_fixed(8192).source(DGXC),
            Layout::new("GB200", 256, 256, "BF16").tp(2).pp(4).ep(64).gbs_fixed(2048).source(DGXC),
            Layout::new("GB200", 256, 256, "MXFP8").pp(4).vp(4).ep(64).gbs_fixed(4096).source(&format!("{MB} (26.02, 26.06)")),
            Layout::new("B200", 256, 256, "MXFP8").pp(8).vp(2).ep(32).gbs_fixed(4096).source(&format!("{MB} (26.04.01)")),
            Layout::new("B200", 256, 256, "MXFP8").pp(16).ep(8).gbs_fixed(4096).source(&format!("{MB} (26.02)")),
            Layout::new("B300", 256, 256, "MXFP8").pp(16).ep(8).gbs_fixed(4096).source(&format!("{MB} (26.02.01)")),
            Layout::new("GB300", 256, 256, "MXFP8").pp(2).vp(8).ep(32).mbs(2).gbs_fixed(4096).source(&format!("{MB} (26.02.01)")),
        ];
        ModelInfo {
            family: FAMILY.into(),
            variants: vec![variant(
                "deepseek-v3-671b",
                FAMILY,
                "DeepSeek-AI, DeepSeek-V3 Technical Report, arXiv 2412.19437; HF config.json",
                v3(),
                defaults(4096, 14.8e12, 2.2e-4),
                layouts,
            )],
        }
    }

    fn graph(request: GraphRequest) -> Result<Graph, String> {
        graph_for(&Self::describe(), &request)
    }
}

runner_plugin_sdk::export_workload!(DeepSeek);

#[cfg(test)]
mod tests {
    use runner_graph::count::Convention;
    use runner_plugin_testkit as kit;

    use super::*;

    #[test]
    fn every_variant_builds_and_validates() {
        kit::check_all_variants(&DeepSeek::describe(), DeepSeek::graph);
    }

    /// The published 671B/37B exclude the MTP module: build all 61 layers explicitly
    /// (layers > 0 omits MTP). 37B is rounded: with embeddings the count is 37.6B, without
    /// the input table 36.6B, so active is checked to 2%.
    #[test]
    fn parameters_match_published() {
        let p = kit::params(DeepSeek::graph, "deepseek-v3-671b", 61);
        kit::assert_close("deepseek-v3 params (no MTP)", p.total as f64, 671e9, 0.005);
        kit::assert_close("deepseek-v3 active (no MTP)", p.active as f64, 37e9, 0.02);
        kit::rel_err("deepseek-v3 active without input embedding", (p.active - p.embedding) as f64, 37e9);
        // The MTP module shares embedding and head; its own weights are one MoE block plus
        // the 2C->C projection and norms (~11.7B). HF's 685B also stores a copy of both
        // tables (2 x 0.93B) for the module.
        let with_mtp = kit::params(DeepSeek::graph, "deepseek-v3-671b", 0);
        let mtp = (with_mtp.total - p.total) as f64;
        kit::rel_err("deepseek-v3 MTP module (shared tables)", mtp, 14e9 - 2.0 * 0.927e9);
        assert!((11.0e9..12.5e9).contains(&mtp), "MTP module has {mtp:.3e} params");
    }

    #[test]
    fn flops_for_reference() {
        for conv in [Convention::FULL, Convention::CAUSAL] {
            let f = kit::flops_per_sample(DeepSeek::graph, "deepseek-v3-671b", 4096, 0, &conv);
            println!("deepseek-v3 FLOPs/sample at 4096 with MTP [{conv}]: {f:.4e}");
        }
    }
}
