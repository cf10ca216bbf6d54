//! Nemotron-4: dense GQA decoders with squared-ReLU MLPs, LayerNorm, RoPE, no biases and
//! untied embeddings over a 256k vocabulary (15B, 340B), plus `nemotron4-tiny`, a runner
//! CPU proxy with the same architecture.
//!
//! Sources: "Nemotron-4 15B Technical Report" (arXiv 2402.16819) Table 1 (32 layers,
//! hidden 6144, 48 heads, 8 KV heads, seq 4096, 256,000 vocab, 8T tokens); "Nemotron-4 340B
//! Technical Report" (arXiv 2406.11704) Table 1 (96 layers, hidden 18432, 96 heads, 8 KV
//! heads, FFN 73728, 9T tokens); FFN = 4h. Nemotron rotates half of each head
//! (rotary_percentage 0.5): the rotary op carries the full head dim since the contract has
//! no partial-rotary field; no FLOP or parameter count depends on it.
//! Nemotron-3 8B and 22B (the NeMo performance summary's `nemotron-8b`, `nemotron-22b`)
//! are the same architecture with multi-head attention: `Nemotron3Config8B` (32 layers,
//! hidden 4096, FFN 16384, 32 heads, no query groups) and `Nemotron3Config22B` (40, 6144,
//! 24576, 48 heads) in github:NVIDIA/NeMo/nemo/collections/llm/gpt/model/nemotron.py@c341fb3
//! (NeMo 24.07 named the 22B `Nemotron4Config22B`, same shape; its `nemotron4_22b` recipe
//! is the TP2 PP4 VP10 layout benchmarked). Those configs take the vocabulary from the
//! tokenizer: 256,000 here, which reproduces the summary's model-TFLOPs column to 0.1%
//! (see the tests). Peak learning rates are the NeMo recipes' defaults (`nemotron3_8b`
//! 3e-4, `nemotron4_22b` 1e-4); no training-token count is published for either, so the
//! default budget is Nemotron-4 15B's 8T.
//! Layouts: DGXC Benchmarking (github:NVIDIA/dgxc-benchmarking, nemotron/README_15b.md and
//! README_340b.md), as the calibration rows in host/project/data/calibration.toml cite them.

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, variant, Layout};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "nemotron4";
const DGXC_15B: &str = "github:NVIDIA/dgxc-benchmarking/nemotron/README_15b.md@8f5cbb3 (v25.02, NeMo 24.12)";
const DGXC_V25041: &str = "github:NVIDIA/dgxc-benchmarking/nemotron/README.md@85380ff (v25.04.01, NeMo 25.02.01)";
const NEMO_2407: &str = "github:NVIDIA/NeMo/docs/source/performance/performance_summary.md@9c4726d (NeMo 24.07)";
const NEMO_CONFIG: &str = "NVIDIA NeMo Nemotron3Config8B / Nemotron3Config22B, github:NVIDIA/NeMo/nemo/collections/llm/gpt/model/nemotron.py@c341fb3";
const DGXC_340B: &str = "github:NVIDIA/dgxc-benchmarking/nemotron/README_340b.md@143b90d (NeMo 24.11): TP8 PP8 VP12 MBS1, GBS = 2 x nodes = GPUs/4";

fn nemotron(layers: u32, hidden: u32, heads: u32, kv_heads: u32, vocab: u32) -> Hyperparameters {
    Hyperparameters {
        max_position: 4096,
        norm: NormKind::LayerNorm,
        activation: ActivationKind::SquaredRelu,
        ..decoder(layers, hidden, 4 * hidden, heads, kv_heads, vocab)
    }
}

/// The plugin; tests call its `Guest` functions natively.
pub struct Nemotron4;

impl Guest for Nemotron4 {
    fn describe() -> ModelInfo {
        ModelInfo {
            family: FAMILY.into(),
            variants: vec![
                variant("nemotron4-15b", FAMILY, "Parmar et al., Nemotron-4 15B Technical Report, arXiv 2402.16819", nemotron(32, 6144, 48, 8, 256_000), defaults(4096, 8e12, 4.5e-4), [
                    Layout::new("H100", 16, 1024, "BF16").tp(4).mbs(4).gbs_per_gpu(4.0).source(DGXC_15B),
                    Layout::new("H100", 16, 1024, "FP8").tp(4).mbs(4).gbs_per_gpu(4.0).source(DGXC_15B),
                    Layout::new("H100", 16, 16, "BF16").tp(2).mbs(2).gbs_per_gpu(4.0).source(DGXC_V25041),
                    Layout::new("H100", 16, 16, "FP8").tp(2).mbs(2).gbs_per_gpu(4.0).source(DGXC_V25041),
                ]),
                variant("nemotron4-340b", FAMILY, "NVIDIA, Nemotron-4 340B Technical Report, arXiv 2406.11704", nemotron(96, 18_432, 96, 8, 256_000), defaults(4096, 9e12, 9e-5), [
                    Layout::new("H100", 128, 2048, "BF16").tp(8).pp(8).vp(12).gbs_per_gpu(0.25).source(DGXC_340B),
                    Layout::new("H100", 128, 2048, "FP8").tp(8).pp(8).vp(12).gbs_per_gpu(0.25).source(DGXC_340B),
                ]),
                variant("nemotron-8b", FAMILY, NEMO_CONFIG, nemotron(32, 4096, 32, 32, 256_000), defaults(4096, 8e12, 3e-4), [
                    Layout::new("H100", 64, 64, "FP8").tp(2).mbs(4).gbs_fixed(256).source(NEMO_2407),
                ]),
                variant("nemotron-22b", FAMILY, NEMO_CONFIG, nemotron(40, 6144, 48, 48, 256_000), defaults(4096, 8e12, 1e-4), [
                    Layout::new("H100", 64, 64, "FP8").tp(2).pp(4).vp(10).mbs(2).gbs_fixed(256).source(NEMO_2407),
                ]),
                // CPU proxy: the Nemotron-4 architecture (GQA, RoPE, LayerNorm, squared-ReLU MLP
                // of 4h, no biases, untied) at 4 layers x 256, 8 heads of 32 sharing 2 KV heads.
                variant(
                    "nemotron4-tiny",
                    FAMILY,
                    "runner proxy with the Nemotron-4 architecture (4 layers, hidden 256)",
                    nemotron(4, 256, 8, 2, 8192),
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

runner_plugin_sdk::export_workload!(Nemotron4);

#[cfg(test)]
mod tests {
    use runner_graph::count::Convention;
    use runner_graph::OpKind as HostOp;
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
        // 48 heads of 128 (15B), 96 of 192 (340B).
        for (name, want, layers, width) in [("nemotron4-15b", 3.85e14, 32, 6144), ("nemotron4-340b", 8.62e15, 96, 18_432)] {
            let full = kit::flops_per_sample(Nemotron4::graph, name, 4096, 0, &Convention::FULL);
            kit::assert_close(&format!("{name} FLOPs/sample (full attention)"), full, want, 0.01);
            kit::assert_causal_halves_scores(Nemotron4::graph, name, 4096, layers, width, width);
        }
    }

    /// Nemotron-3 8B / 22B: the NeMo 24.07 performance summary's model TFLOPs/GPU over
    /// tokens/s/GPU (643 / 12507, 562 / 4312) is its FLOPs per token with attention over
    /// all keys; TFLOPs are rounded to 3 digits: 1%.
    #[test]
    fn nemotron3_flops_match_nemo_performance_summary() {
        for (name, tflops, tokens) in [("nemotron-8b", 643.0, 12507.0), ("nemotron-22b", 562.0, 4312.0)] {
            let f = kit::flops_per_sample(Nemotron4::graph, name, 4096, 0, &Convention::FULL);
            kit::assert_close(&format!("{name} FLOPs/token (full attention)"), f / 4096.0, tflops * 1e12 / tokens, 0.01);
        }
    }

    /// The CPU proxy is the last variant, fits the host's measurement budget (2 layers of
    /// f32 weights, grads and AdamW moments in 1 GiB) and builds at the measured size
    /// (seq 256 x batch 8) with Nemotron-4's distinctive pieces: squared-ReLU, LayerNorm,
    /// GQA with rotary, no biases, untied head.
    #[test]
    fn tiny_proxy_has_the_nemotron4_architecture() {
        let info = Nemotron4::describe();
        let v = info.variants.last().unwrap();
        assert_eq!(v.name, "nemotron4-tiny");
        assert_eq!(v.hyper.attention, AttentionKind::Gqa);
        let (g, p2) = kit::measured_graph(Nemotron4::graph, "nemotron4-tiny", 2);
        let has = |k: HostOp| g.ops.iter().any(|o| o.kind == k);
        assert!(has(HostOp::SquaredRelu) && has(HostOp::LayerNorm) && has(HostOp::Rotary));
        assert!(!has(HostOp::SwiGlu) && !has(HostOp::RmsNorm));
        assert!(g.tensor_id("layers.0.attn.q.bias").is_none() && g.tensor_id("lm_head.weight").is_some());
        // embed + head 2*8192*256, final LN 512; per layer: q,o 2*256*256, k,v 2*256*64,
        // MLP 2*256*1024, two LayerNorms 4*256.
        let p = kit::params(Nemotron4::graph, "nemotron4-tiny", 0);
        assert_eq!(p.total, 2 * 8192 * 256 + 512 + 4 * (2 * 256 * 256 + 2 * 256 * 64 + 2 * 256 * 1024 + 4 * 256));
        println!("nemotron4-tiny params: {} (2 layers: {})", p.total, p2.total);
    }
}
