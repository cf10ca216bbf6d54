//! GPT-3: dense MHA decoders with learned positions, LayerNorm, GeLU and biases, at the
//! sizes NeMo's GPT-3 recipes and MLPerf train (5B, 20B, 175B), plus `gpt3-tiny`, a
//! runner CPU proxy with the same architecture.
//!
//! Sources: Brown et al., "Language Models are Few-Shot Learners" (arXiv 2005.14165)
//! Table 2.1 (175B: 96 layers, d_model 12288, 96 heads of 128, context 2048, lr 0.6e-4,
//! 300B tokens); NeMo `conf/training/gpt3/{5b,20b,175b}.yaml` shapes (5B: 24x4096, 32 heads;
//! 20B: 44x6144, 48 heads; FFN 4h); Megatron pads the 50,257-token GPT-2 vocabulary to
//! 51,200, the V every published GPT-3 FLOP formula uses, and ties the output head to the
//! input embedding. Learning rates for 5B/20B follow the paper's 6.7B/13B rows.
//! Layouts: DGXC Benchmarking (github:NVIDIA/dgxc-benchmarking/nemo_megatron/README_175b.md)
//! and NeMo 24.07's performance summary (github:NVIDIA/NeMo docs/source/performance/performance_summary.md@r2.1.1).
//!
//! Megatron-LM's A100 benchmark models (Korthikanti et al., "Reducing Activation
//! Recomputation in Large Transformer Models", arXiv 2205.05198, Table 3: heads, hidden,
//! layers, the TP/PP/GPU/batch layout on 80 GB A100s; section 6: sequence 2048, vocabulary
//! 51,200): 22B (48x6144, 64 heads), 530B (MT-NLG: 105x20480, 128 heads) and 1T
//! (128x25600, 160 heads), the GPT-3 architecture at other sizes. MT-NLG's learning rate
//! and tokens are its paper's (Smith et al., arXiv 2201.11990: 5e-5, 270B); 22B and 1T
//! were benchmarks, never trained, and take the GPT-3 paper's rows nearest in size
//! (13B: 1.0e-4; 175B: 0.6e-4). Their layouts carry the paper's sequence parallelism and
//! selective recompute of the attention core ("present work", Table 5), Megatron's
//! default `core_attn`.

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, variant, Layout};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "gpt3";
const DGXC_V2502: &str = "github:NVIDIA/dgxc-benchmarking/nemo_megatron/README_175b.md@8f5cbb3 (v25.02, NeMo 24.12)";
const NEMO_2407: &str = "github:NVIDIA/NeMo/docs/source/performance/performance_summary.md@9c4726d (NeMo 24.07)";
const MEGATRON_SR: &str = "Korthikanti et al. 2022, arXiv 2205.05198, Table 3 (Megatron-LM, A100 80GB, no data parallelism)";

fn gpt3(layers: u32, hidden: u32, heads: u32, vocab: u32) -> Hyperparameters {
    Hyperparameters {
        tied_embeddings: true,
        position: PositionScheme::Learned,
        max_position: 2048,
        norm: NormKind::LayerNorm,
        activation: ActivationKind::Gelu,
        bias: true,
        ..decoder(layers, hidden, 4 * hidden, heads, heads, vocab)
    }
}

/// A layout of the paper's Table 3 on `gpus` A100 80GB: TP8 with sequence parallelism and
/// selective recompute of the attention core, as every one of its "present work" runs.
fn megatron_2022(gpus: u32) -> Layout {
    Layout::new("A100-80GB", gpus, gpus, "BF16").tp(8).sp().recompute(RecomputeGranularity::Selective, 0).source(MEGATRON_SR)
}

/// The plugin; tests call its `Guest` functions natively.
pub struct Gpt3;

impl Guest for Gpt3 {
    fn describe() -> ModelInfo {
        let cite = "Brown et al. 2020, arXiv 2005.14165; NeMo GPT-3 training configs";
        let v = |name: &str, hyper, lr, layouts: Vec<Layout>| variant(name, FAMILY, cite, hyper, defaults(2048, 300e9, lr), layouts);
        // Megatron-LM's benchmark sizes: never trained, so the GPT-3 paper's token budget.
        let benchmark = |name: &str, hyper, lr, layout: Layout| {
            variant(name, FAMILY, "Korthikanti et al. 2022, arXiv 2205.05198 Table 3", hyper, defaults(2048, 300e9, lr), [layout])
        };
        ModelInfo {
            family: FAMILY.into(),
            variants: vec![
                v("gpt3-5b", gpt3(24, 4096, 32, 51_200), 1.2e-4, vec![Layout::new("H100", 64, 64, "FP8").mbs(4).gbs_fixed(2048).source(NEMO_2407)]),
                v("gpt3-20b", gpt3(44, 6144, 48, 51_200), 1.0e-4, vec![Layout::new("H100", 64, 64, "FP8").tp(2).mbs(2).gbs_fixed(256).source(NEMO_2407)]),
                v("gpt3-175b", gpt3(96, 12_288, 96, 51_200), 0.6e-4, vec![
                    Layout::new("H100", 128, 2048, "BF16").tp(4).pp(8).vp(12).gbs_per_gpu(2.0).source(DGXC_V2502),
                    Layout::new("H100", 128, 2048, "FP8").tp(4).pp(8).vp(12).gbs_per_gpu(2.0).source(DGXC_V2502),
                    Layout::new("H100", 128, 128, "FP8").tp(4).pp(8).vp(6).gbs_fixed(256).source(NEMO_2407),
                    megatron_2022(64).pp(8).vp(3).gbs_fixed(64),
                ]),
                benchmark("megatron-gpt-22b", gpt3(48, 6144, 64, 51_200), 1.0e-4,
                    megatron_2022(8).mbs(4).gbs_fixed(4),
                ),
                variant(
                    "mt-nlg-530b",
                    FAMILY,
                    "Smith et al. 2022, arXiv 2201.11990 (MT-NLG); Korthikanti et al. 2022, arXiv 2205.05198 Table 3",
                    gpt3(105, 20_480, 128, 51_200),
                    defaults(2048, 270e9, 5.0e-5),
                    [megatron_2022(280).pp(35).vp(3).gbs_fixed(280)],
                ),
                benchmark("megatron-gpt-1t", gpt3(128, 25_600, 160, 51_200), 0.6e-4,
                    megatron_2022(512).pp(64).gbs_fixed(512),
                ),
                // CPU proxy: the GPT-3 architecture (MHA, learned 2048 positions, LayerNorm,
                // GeLU MLP of 4h, biases, tied embedding) at 4 layers x 256, 8 heads of 32.
                variant(
                    "gpt3-tiny",
                    FAMILY,
                    "runner proxy with the GPT-3 architecture (4 layers, hidden 256)",
                    gpt3(4, 256, 8, 8192),
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

runner_plugin_sdk::export_workload!(Gpt3);

#[cfg(test)]
mod tests {
    use runner_graph::count::Convention;
    use runner_graph::OpKind as HostOp;
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
        // Megatron's sizes: 22B and 530B by name, 1T as Narayanan et al. 2021 (arXiv
        // 2104.04473) Table 1 counts the same shape, 1,008.0B.
        for (name, want) in [("megatron-gpt-22b", 22e9), ("mt-nlg-530b", 530e9), ("megatron-gpt-1t", 1008.0e9)] {
            let p = kit::params(Gpt3::graph, name, 0);
            kit::assert_close(&format!("{name} params"), p.total as f64, want, 0.01);
        }
    }

    /// DGXC: F = s(24Lh² + 12Lhs + 48Lh² + 6Vh), non-causal attention; Google's table
    /// gives 6.69e13 for 5B.
    #[test]
    fn model_flops_match_published() {
        for (name, want, layers, width) in [("gpt3-175b", 2.20e15, 96, 12_288), ("gpt3-5b", 6.69e13, 24, 4096)] {
            let f = kit::flops_per_sample(Gpt3::graph, name, 2048, 0, &Convention::FULL);
            kit::assert_close(&format!("{name} FLOPs/sample (full attention)"), f, want, 0.01);
            kit::assert_causal_halves_scores(Gpt3::graph, name, 2048, layers, width, width);
        }
    }

    /// The CPU proxy is the last variant, fits the host's measurement budget (2 layers of
    /// f32 weights, grads and AdamW moments in 1 GiB) and builds at the measured size
    /// (seq 256 x batch 8) with GPT-3's distinctive pieces: learned positions, LayerNorm,
    /// GeLU, biased linears, tied head, no rotary.
    #[test]
    fn tiny_proxy_has_the_gpt3_architecture() {
        assert_eq!(Gpt3::describe().variants.last().unwrap().name, "gpt3-tiny");
        let (g, p2) = kit::measured_graph(Gpt3::graph, "gpt3-tiny", 2);
        let has = |k: HostOp| g.ops.iter().any(|o| o.kind == k);
        assert!(has(HostOp::LayerNorm) && has(HostOp::Gelu) && !has(HostOp::Rotary) && !has(HostOp::RmsNorm));
        assert!(g.ops.iter().any(|o| o.name == "pos_embed" && o.kind == HostOp::Embedding));
        assert!(g.tensor_id("layers.0.attn.q.bias").is_some() && g.tensor_id("layers.1.mlp.down.bias").is_some());
        assert!(g.tensor_id("lm_head.weight").is_none(), "head is tied to the embedding");
        // embed 8192*256 + positions 2048*256 + final LN 512; per layer: qkvo 4*(256*256+256),
        // MLP 256*1024+1024 + 1024*256+256, two LayerNorms 4*256.
        let per_layer = 4 * (256 * 256 + 256) + (256 * 1024 + 1024) + (1024 * 256 + 256) + 4 * 256;
        let p = kit::params(Gpt3::graph, "gpt3-tiny", 0);
        assert_eq!(p.total, 8192 * 256 + 2048 * 256 + 512 + 4 * per_layer);
        println!("gpt3-tiny params: {} (2 layers: {})", p.total, p2.total);
    }
}
