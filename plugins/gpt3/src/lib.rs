//! GPT-3: dense MHA decoders with learned positions, LayerNorm, GeLU and biases, at the
//! sizes NeMo's GPT-3 recipes and MLPerf train (5B, 20B, 175B).
//!
//! Sources: Brown et al., "Language Models are Few-Shot Learners" (arXiv 2005.14165)
//! Table 2.1 (175B: 96 layers, d_model 12288, 96 heads of 128, context 2048, lr 0.6e-4,
//! 300B tokens); NeMo `conf/training/gpt3/{5b,20b,175b}.yaml` shapes (5B: 24x4096, 32 heads;
//! 20B: 44x6144, 48 heads; FFN 4h); Megatron pads the 50,257-token GPT-2 vocabulary to
//! 51,200, the V every published GPT-3 FLOP formula uses, and ties the output head to the
//! input embedding. Learning rates for 5B/20B follow the paper's 6.7B/13B rows.
//! Layouts: DGXC Benchmarking and NeMo 24.07 tables (shared/data/calibration.toml).

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, variant, Layout};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "gpt3";
const DGXC_V2502: &str = "github:NVIDIA/dgxc-benchmarking/nemo_megatron/README_175b.md@8f5cbb3 (v25.02, NeMo 24.12)";
const NEMO_2407: &str = "github:NVIDIA/NeMo/docs/source/performance/performance_summary.md@9c4726d (NeMo 24.07)";

fn gpt3(layers: u32, hidden: u32, heads: u32) -> Hyperparameters {
    Hyperparameters {
        tied_embeddings: true,
        position: PositionScheme::Learned,
        max_position: 2048,
        norm: NormKind::LayerNorm,
        activation: ActivationKind::Gelu,
        bias: true,
        ..decoder(layers, hidden, 4 * hidden, heads, heads, 51_200)
    }
}

/// The plugin; tests call its `Guest` functions natively.
pub struct Gpt3;

impl Guest for Gpt3 {
    fn describe() -> ModelInfo {
        let cite = "Brown et al. 2020, arXiv 2005.14165; NeMo GPT-3 training configs";
        let v = |name: &str, hyper, lr, layouts: Vec<Layout>| variant(name, FAMILY, cite, hyper, defaults(2048, 300e9, lr), layouts);
        ModelInfo {
            family: FAMILY.into(),
            variants: vec![
                v("gpt3-5b", gpt3(24, 4096, 32), 1.2e-4, vec![Layout::new("H100", 64, 64, "FP8").mbs(4).gbs_fixed(2048).source(NEMO_2407)]),
                v("gpt3-20b", gpt3(44, 6144, 48), 1.0e-4, vec![Layout::new("H100", 64, 64, "FP8").tp(2).mbs(2).gbs_fixed(256).source(NEMO_2407)]),
                v("gpt3-175b", gpt3(96, 12_288, 96), 0.6e-4, vec![
                    Layout::new("H100", 128, 2048, "BF16").tp(4).pp(8).vp(12).gbs_per_gpu(2.0).source(DGXC_V2502),
                    Layout::new("H100", 128, 2048, "FP8").tp(4).pp(8).vp(12).gbs_per_gpu(2.0).source(DGXC_V2502),
                    Layout::new("H100", 128, 128, "FP8").tp(4).pp(8).vp(6).gbs_fixed(256).source(NEMO_2407),
                ]),
            ],
        }
    }

    fn graph(request: GraphRequest) -> Result<Graph, String> {
        graph_for(&Self::describe(), &request)
    }
}

runner_plugin_sdk::export_workload!(Gpt3);

#[cfg(test)]
mod tests {
    use runner_graph::count::Convention;
    use runner_plugin_testkit as kit;

    use super::*;

    #[test]
    fn every_variant_builds_and_validates() {
        kit::check_all_variants(&Gpt3::describe(), Gpt3::graph);
    }

    #[test]
    fn parameters_match_published() {
        let p = kit::params(Gpt3::graph, "gpt3-175b", 0);
        kit::assert_close("gpt3-175b params", p.total as f64, 175e9, 0.005);
    }

    /// DGXC: F = s(24Lh² + 12Lhs + 48Lh² + 6Vh), non-causal attention; Google's table
    /// gives 6.69e13 for 5B.
    #[test]
    fn model_flops_match_published() {
        for (name, want) in [("gpt3-175b", 2.20e15), ("gpt3-5b", 6.69e13)] {
            let f = kit::flops_per_sample(Gpt3::graph, name, 2048, 0, &Convention::FULL);
            kit::assert_close(&format!("{name} FLOPs/sample (full attention)"), f, want, 0.01);
            kit::rel_err(&format!("{name} FLOPs/sample (causal)"), kit::flops_per_sample(Gpt3::graph, name, 2048, 0, &Convention::CAUSAL), want);
        }
    }
}
