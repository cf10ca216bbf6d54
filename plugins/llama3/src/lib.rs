//! Llama 3 and 3.1: dense GQA decoders with RoPE, RMSNorm and SwiGLU, plus `llama3-tiny`,
//! a proxy small enough to train on a CPU (its exact shape is shared with the PyTorch
//! comparison benchmark, so do not change it).
//!
//! Sources: Hugging Face `config.json` of meta-llama/Meta-Llama-3-8B, -3-70B,
//! Llama-3.1-8B, -3.1-70B, -3.1-405B (hidden, intermediate_size, layers, heads,
//! key_value_heads, vocab 128256, rope_theta 500000, rms_norm_eps 1e-5,
//! max_position_embeddings 8192 / 131072); "The Llama 3 Herd of Models" (arXiv 2407.21783)
//! Table 3 (peak learning rates 3e-4 / 1.5e-4 / 8e-5) and §3.1 (15T+ training tokens).
//! Llama 3.1's "llama3" RoPE frequency scaling changes no shape or FLOP and is not modelled.
//! Layouts: DGXC Benchmarking (github:NVIDIA/dgxc-benchmarking) and Megatron-Bridge
//! performance summaries (github:NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md@067f987),
//! as the calibration rows in host/project/data/calibration.toml cite them.

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, variant, Layout};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "llama3";
const DGXC_V2502_8B: &str = "github:NVIDIA/dgxc-benchmarking/llama3.1/README_8b.md@8f5cbb3 (v25.02, NeMo 24.12)";
const DGXC_V2502_70B: &str = "github:NVIDIA/dgxc-benchmarking/llama3.1/README_70b.md@8f5cbb3 (v25.02, NeMo 24.12)";
const DGXC_V2504: &str = "github:NVIDIA/dgxc-benchmarking/llama3.1/README.md@741c886 (v25.04, NeMo 25.02.01)";
const DGXC_V2505: &str = "github:NVIDIA/dgxc-benchmarking/llama3.1/README.md@1f6d9f4 (v25.05.04, NeMo 25.04.01)";
const DGXC_CURRENT: &str = "github:NVIDIA/dgxc-benchmarking/llama3.1/README.md@841f546 (v26.06.01)";
const MB_ARCHIVE: &str = "github:NVIDIA-NeMo/Megatron-Bridge/docs/performance-summary-archive.md@067f987";
const NEMO_2407: &str = "github:NVIDIA/NeMo/docs/source/performance/performance_summary.md@9c4726d (NeMo 24.07)";

/// Llama 3 shape: GQA with 8 KV heads, 128,256-token vocabulary, RoPE theta 500,000.
fn llama(layers: u32, hidden: u32, ffn: u32, heads: u32, max_position: u32) -> Hyperparameters {
    Hyperparameters { rope_theta: 500_000.0, max_position, ..decoder(layers, hidden, ffn, heads, 8, 128_256) }
}

/// The plugin; tests call its `Guest` functions natively.
pub struct Llama3;

impl Guest for Llama3 {
    fn describe() -> ModelInfo {
        let paper = "Llama Team, The Llama 3 Herd of Models, arXiv 2407.21783; HF config.json";
        let v = |name: &str, hyper, lr, layouts: Vec<Layout>| {
            variant(name, FAMILY, paper, hyper, defaults(8192, 15e12, lr), layouts)
        };
        let h100_8b = |p: &str, src: &str| Layout::new("H100", 8, 128, p).cp(2).gbs_per_gpu(16.0).source(src);
        ModelInfo {
            family: FAMILY.into(),
            variants: vec![
                v("llama3-8b", llama(32, 4096, 14_336, 32, 8192), 3e-4, vec![
                    Layout::new("H100", 8, 8, "FP8").cp(2).gbs_fixed(128).source(NEMO_2407),
                    // Megatron-Bridge's FP8 presets are current scaling (FP8_CS); its
                    // summaries say FP8.
                    Layout::new("B200", 8, 8, "FP8-CS").mbs(2).gbs_fixed(128).source(&format!("{MB_ARCHIVE} (25.09)")),
                    Layout::new("GB200", 8, 8, "FP8-CS").mbs(2).gbs_fixed(128).source("docs.nvidia.com/nemo-framework performance-summary (NeMo 25.07)"),
                ]),
                v("llama3-70b", llama(80, 8192, 28_672, 64, 8192), 1.5e-4, vec![
                    Layout::new("H100", 64, 64, "FP8-CS").tp(4).pp(8).vp(5).gbs_fixed(256).source(&format!("{MB_ARCHIVE} (26.02)")),
                    Layout::new("GB200", 64, 64, "FP8-CS").fsdp(64).mbs(2).gbs_fixed(256).source(&format!("{MB_ARCHIVE} (26.04)")),
                    Layout::new("H100", 128, 2048, "FP8").fsdp(128).mbs(2).gbs_per_gpu(2.0).source("github:NVIDIA/dgxc-benchmarking/maxtext/README_70b.md@8f5cbb3 (MaxText, JAX 25.01)"),
                ]),
                v("llama3.1-8b", llama(32, 4096, 14_336, 32, 131_072), 3e-4, vec![
                    h100_8b("BF16", DGXC_V2502_8B),
                    h100_8b("FP8", DGXC_V2502_8B),
                    Layout::new("H100", 8, 128, "FP8").gbs_per_gpu(16.0).source(&format!("{DGXC_CURRENT} (TP1 PP1 MBS1; GBS rule as v25.02)")),
                    Layout::new("GB200", 8, 128, "FP8").mbs(2).gbs_per_gpu(16.0).source(&format!("{DGXC_CURRENT} (MBS2; GBS rule as v25.02)")),
                ]),
                v("llama3.1-70b", llama(80, 8192, 28_672, 64, 131_072), 1.5e-4, vec![
                    Layout::new("H100", 64, 2048, "BF16").tp(4).pp(4).cp(2).vp(5).gbs_per_gpu(2.0).source(DGXC_V2504),
                    Layout::new("H100", 64, 2048, "FP8").tp(4).pp(4).cp(2).vp(5).gbs_per_gpu(2.0).source(DGXC_V2502_70B),
                    Layout::new("H100", 128, 2048, "FP8").tp(4).pp(8).vp(5).gbs_per_gpu(2.0).source(DGXC_V2504),
                    Layout::new("H100", 64, 512, "BF16").tp(4).pp(4).cp(2).vp(5).gbs_per_gpu(4.0).source(DGXC_CURRENT),
                    Layout::new("H100", 64, 512, "FP8").tp(4).pp(8).vp(5).mbs(2).gbs_per_gpu(4.0).source(&format!("{DGXC_CURRENT} (GBS rule of the BF16 row; not stated for FP8)")),
                    Layout::new("GB200", 64, 512, "FP8").fsdp(64).mbs(2).gbs_per_gpu(4.0).source(DGXC_CURRENT),
                ]),
                v("llama3.1-405b", llama(126, 16_384, 53_248, 128, 131_072), 8e-5, vec![
                    Layout::new("H100", 512, 2048, "BF16").tp(8).pp(8).cp(2).vp(8).gbs_per_gpu(0.5).source(DGXC_V2504),
                    Layout::new("H100", 512, 2048, "FP8").tp(8).pp(8).cp(2).vp(8).gbs_per_gpu(0.5).source(DGXC_V2505),
                    Layout::new("H100", 256, 1024, "FP8").tp(8).pp(8).cp(2).vp(8).gbs_fixed(1536).source(&format!("{DGXC_CURRENT}; {MB_ARCHIVE} (26.02, 1024 GPUs)")),
                    Layout::new("GB200", 256, 256, "BF16").tp(4).pp(8).cp(2).vp(8).gbs_per_gpu(0.5).source(DGXC_V2505),
                    Layout::new("GB200", 256, 512, "FP8").tp(4).pp(16).vp(4).gbs_per_gpu(6.0).source(&format!("{DGXC_CURRENT}; {MB_ARCHIVE} (26.04, 256 GPUs)")),
                    Layout::new("GB300", 256, 256, "FP8-CS").tp(2).pp(8).cp(2).vp(4).gbs_fixed(1536).source(&format!("{MB_ARCHIVE} (26.02.01)")),
                ]),
                // CPU proxy: shape shared with the PyTorch comparison benchmark.
                variant(
                    "llama3-tiny",
                    FAMILY,
                    "runner proxy with the Llama 3 architecture (4 layers, hidden 256)",
                    Hyperparameters { rope_theta: 500_000.0, max_position: 2048, ..decoder(4, 256, 688, 8, 2, 8192) },
                    defaults(256, 1e8, 1e-3),
                    [Layout::new("CPU", 1, 1, "BF16").mbs(4).gbs_fixed(4).source("runner CPU proxy")],
                ),
            ],
        }
    }

    fn graph(request: GraphRequest) -> Result<Graph, String> {
        graph_for(&Self::describe(), &request)
    }
}

runner_plugin_sdk::export_workload!(Llama3);

#[cfg(test)]
mod tests {
    use runner_graph::count::Convention;
    use runner_plugin_testkit as kit;

    use super::*;

    #[test]
    fn every_variant_builds_and_validates() {
        kit::check_all_variants(&Llama3::describe(), Llama3::graph);
    }

    #[test]
    fn parameters_match_published() {
        for (name, want) in [("llama3.1-8b", 8.03e9), ("llama3.1-70b", 70.6e9), ("llama3.1-405b", 405.9e9)] {
            let p = kit::params(Llama3::graph, name, 0);
            kit::assert_close(&format!("{name} params"), p.total as f64, want, 0.005);
            assert_eq!(p.total, p.active, "dense model");
        }
    }

    #[test]
    fn tiny_is_the_benchmark_shape() {
        let info = Llama3::describe();
        let h = &info.variants.iter().find(|v| v.name == "llama3-tiny").unwrap().hyper;
        assert_eq!((h.layers, h.hidden, h.heads, h.kv_heads, h.ffn, h.vocab), (4, 256, 8, 2, 688, 8192));
        let p = kit::params(Llama3::graph, "llama3-tiny", 0);
        // embed + head 2*8192*256, final norm 256; per layer attn 256*(256+64+64+256),
        // mlp 3*256*688, 2 norms.
        assert_eq!(p.total, 2 * 8192 * 256 + 256 + 4 * (256 * 640 + 3 * 256 * 688 + 512));
    }

    /// DGXC README formula F = s(12Lh²(1+g/a+s/h) + 18Lfh + 6Vh): non-causal attention.
    #[test]
    fn model_flops_match_dgxc_readme() {
        for (name, want, layers, width) in [("llama3.1-8b", 4.74e14, 32, 4096), ("llama3.1-70b", 3.94e15, 80, 8192), ("llama3.1-405b", 2.17e16, 126, 16_384)] {
            let f = kit::flops_per_sample(Llama3::graph, name, 8192, 0, &Convention::FULL);
            kit::assert_close(&format!("{name} FLOPs/sample (full attention)"), f, want, 0.01);
            kit::assert_causal_halves_scores(Llama3::graph, name, 8192, layers, width, width);
        }
    }

    /// Megatron-Bridge's performance summaries (docs/performance-summary.md@067f987) imply 5.147e10, 4.492e11, 2.524e12
    /// FLOPs per token, which is the causal-halved convention.
    #[test]
    fn causal_convention_matches_megatron_bridge_tables() {
        for (name, per_token) in [("llama3.1-8b", 5.147e10), ("llama3.1-70b", 4.492e11), ("llama3.1-405b", 2.524e12)] {
            let f = kit::flops_per_sample(Llama3::graph, name, 8192, 0, &Convention::CAUSAL);
            kit::assert_close(&format!("{name} FLOPs/token (causal)"), f / 8192.0, per_token, 0.01);
        }
    }
}
