//! Nemotron-4: dense GQA decoders with squared-ReLU MLPs, LayerNorm, RoPE, no biases and
//! untied embeddings over a 256k vocabulary (15B, 340B).
//!
//! Sources: "Nemotron-4 15B Technical Report" (arXiv 2402.16819) Table 1 (32 layers,
//! hidden 6144, 48 heads, 8 KV heads, seq 4096, 256,000 vocab, 8T tokens); "Nemotron-4 340B
//! Technical Report" (arXiv 2406.11704) Table 1 (96 layers, hidden 18432, 96 heads, 8 KV
//! heads, FFN 73728, 9T tokens); FFN = 4h. Nemotron rotates half of each head
//! (rotary_percentage 0.5): the rotary op carries the full head dim since the contract has
//! no partial-rotary field; no FLOP or parameter count depends on it.
//! Layouts: DGXC Benchmarking (shared/data/calibration.toml, notes/dgxc.md §4).

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, variant, Layout};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "nemotron4";
const DGXC_15B: &str = "github:NVIDIA/dgxc-benchmarking/nemotron/README_15b.md@8f5cbb3 (v25.02, NeMo 24.12)";
const DGXC_V25041: &str = "github:NVIDIA/dgxc-benchmarking/nemotron/README.md@85380ff (v25.04.01, NeMo 25.02.01)";
const DGXC_340B: &str = "notes/dgxc.md §4: DGXC Benchmarking H100 history (S2), Nemotron-4 340B TP8 PP8 VP12 GBS=GPUs/4 (PP per launch.sh, PR #44)";

fn nemotron(layers: u32, hidden: u32, heads: u32) -> Hyperparameters {
    Hyperparameters {
        max_position: 4096,
        norm: NormKind::LayerNorm,
        activation: ActivationKind::SquaredRelu,
        ..decoder(layers, hidden, 4 * hidden, heads, 8, 256_000)
    }
}

/// The plugin; tests call its `Guest` functions natively.
pub struct Nemotron4;

impl Guest for Nemotron4 {
    fn describe() -> ModelInfo {
        ModelInfo {
            family: FAMILY.into(),
            variants: vec![
                variant("nemotron4-15b", FAMILY, "Parmar et al., Nemotron-4 15B Technical Report, arXiv 2402.16819", nemotron(32, 6144, 48), defaults(4096, 8e12, 4.5e-4), [
                    Layout::new("H100", 16, 1024, "BF16").tp(4).mbs(4).gbs_per_gpu(4.0).source(DGXC_15B),
                    Layout::new("H100", 16, 1024, "FP8").tp(4).mbs(4).gbs_per_gpu(4.0).source(DGXC_15B),
                    Layout::new("H100", 16, 16, "BF16").tp(2).mbs(2).gbs_per_gpu(4.0).source(DGXC_V25041),
                    Layout::new("H100", 16, 16, "FP8").tp(2).mbs(2).gbs_per_gpu(4.0).source(DGXC_V25041),
                ]),
                variant("nemotron4-340b", FAMILY, "NVIDIA, Nemotron-4 340B Technical Report, arXiv 2406.11704", nemotron(96, 18_432, 96), defaults(4096, 9e12, 9e-5), [
                    Layout::new("H100", 128, 2048, "BF16").tp(8).pp(8).vp(12).gbs_per_gpu(0.25).source(DGXC_340B),
                    Layout::new("H100", 128, 2048, "FP8").tp(8).pp(8).vp(12).gbs_per_gpu(0.25).source(DGXC_340B),
                ]),
            ],
        }
    }

    fn graph(request: GraphRequest) -> Result<Graph, String> {
        graph_for(&Self::describe(), &request)
    }
}

runner_plugin_sdk::export_workload!(Nemotron4);

#[cfg(test)]
mod tests {
    use runner_graph::count::Convention;
    use runner_plugin_testkit as kit;

    use super::*;

    #[test]
    fn every_variant_builds_and_validates() {
        kit::check_all_variants(&Nemotron4::describe(), Nemotron4::graph);
    }

    #[test]
    fn parameters_match_published() {
        for (name, want) in [("nemotron4-15b", 15.6e9), ("nemotron4-340b", 341e9)] {
            let p = kit::params(Nemotron4::graph, name, 0);
            kit::assert_close(&format!("{name} params"), p.total as f64, want, 0.005);
        }
    }

    /// DGXC corrected figures (3.85e14, 8.62e15 at seq 4096; mlp = 12Lhf).
    #[test]
    fn model_flops_match_published() {
        for (name, want) in [("nemotron4-15b", 3.85e14), ("nemotron4-340b", 8.62e15)] {
            let full = kit::flops_per_sample(Nemotron4::graph, name, 4096, 0, &Convention::FULL);
            kit::assert_close(&format!("{name} FLOPs/sample (full attention)"), full, want, 0.01);
            let causal = kit::flops_per_sample(Nemotron4::graph, name, 4096, 0, &Convention::CAUSAL);
            kit::rel_err(&format!("{name} FLOPs/sample (causal)"), causal, want);
        }
    }
}
