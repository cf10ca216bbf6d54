//! Nemotron-H: hybrid Mamba-2/attention decoders, and their mixture-of-experts successors.
//! Every layer is one pre-norm residual block of a single kind, placed by Megatron's
//! `hybrid_override_pattern` (`M` Mamba-2 mixer, `*` self-attention, `-` squared-ReLU MLP,
//! `E` mixture of experts). Nemotron-H 4B/8B/47B/56B and Nemotron Nano v2 9B/12B mix
//! Mamba-2, attention and dense MLP layers; Nemotron 3 Nano 30B-A3B and Super 120B-A12B
//! replace the MLPs with experts (Super's in a 1024-wide latent space, LatentMoE, plus
//! one multi-token-prediction module applied twice). `nemotronh-tiny` is a runner CPU
//! proxy with every block kind.
//!
//! Shared conventions (Megatron-Bridge `MambaModelProvider` and `NemotronHModelProvider`):
//! no position embedding (`position_embedding_type = "none"`: no RoPE in the attention
//! layers), RMSNorm eps 1e-5, squared-ReLU MLPs and experts (not gated), no linear
//! biases (the Mamba conv has one), untied embeddings, GQA, a 131,072-token vocabulary,
//! Mamba-2 groups of 8, conv width 4, scan chunk 128.
//!
//! Sources:
//! - Architecture: github:NVIDIA-NeMo/Megatron-Bridge/src/megatron/bridge/models/nemotronh/
//!   nemotron_h_provider.py@160cccc (patterns, widths, heads, Mamba heads/head dim/state,
//!   experts, latent width, MTP pattern `*E`), mamba/mamba_provider.py@0944463 (no
//!   position embedding, RMSNorm 1e-5, untied, no biases); the Mamba-2 mixer as
//!   github:NVIDIA/Megatron-LM/megatron/core/ssm/mamba_mixer.py@2255f6b builds it, LatentMoE
//!   as megatron/core/transformer/moe/moe_layer.py@0011998 (see the SDK's builder).
//! - Vocabulary 131,072: the DGXC Nemotron-H README's FLOP formula and NeMo's
//!   `Nemotron5HybridConfig8B` (github:NVIDIA/NeMo/nemo/collections/llm/gpt/model/ssm.py@0468449);
//!   for Nemotron 3 the Hugging Face config of Nemotron-3-Nano-30B-A3B (read through
//!   verbatim third-party copies; Super uses Nano's tokenizer in its Megatron-Bridge
//!   recipe, so its vocabulary is inferred, not read).
//! - Nemotron 3 Super's MTP: Megatron-Bridge recipes/nemotronh/nemotron_3_super.py@1c92643
//!   (`mtp_num_layers = 2`, `mtp_use_repeated_layer = True`: one `*E` module, its weights
//!   shared by both depths; the provider's default says otherwise, the training recipe
//!   wins).
//! - Training defaults: Nemotron-H (arXiv 2504.03624; NVIDIA ADLR blog): 56B on 20T tokens,
//!   47B distilled from it on 63B tokens; the 8B's 15T and Nano v2 12B's 20T (arXiv
//!   2508.14444) are the reports' abstracts as recalled, not re-read; 4B and 9B v2 are
//!   pruned and distilled (no budget established: their parents' is used). Peak learning
//!   rates of the Nemotron-H and Nano v2 runs are not published in what was read: 3e-4 is
//!   NeMo's `nemotronh_56b` recipe default. Nemotron 3: Megatron-Bridge recipes
//!   (`nemotron_3_nano.py`@04d6386 lr 1.6e-3, `nemotron_3_super.py` 4.5e-4, weight decay
//!   0.1, seq 8192) and 25T tokens (arXiv 2512.20848, 2604.12374).
//! - Layouts and their measurements: the calibration rows in host/project/data/
//!   calibration.toml, each citing its table (DGXC Benchmarking nemotronh/README.md@1f6d9f4;
//!   Megatron-Bridge performance summaries@067f987).
//!
//! Known departures: the router's expert-bias vector (one number per expert) is not in the
//! primitive set; the grouped gate norm's weight is di/G wide instead of di (see the
//! builder); the DGXC FLOP formula counts the SSD scan with chunk 256 where the mixer
//! trains with 128, so its per-sequence FLOPs differ from the graph's by that term.

use runner_plugin_sdk::workload::builder::{
    GraphOptions, MtpWeights, decoder, defaults, graph_for_with, moe, variant, Layout,
};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "nemotronh";
const PROVIDER: &str = "github:NVIDIA-NeMo/Megatron-Bridge/src/megatron/bridge/models/nemotronh/nemotron_h_provider.py@160ccccbb49d8eb37d05197a9fd4c4390eb9f88e";
const DGXC: &str = "github:NVIDIA/dgxc-benchmarking/nemotronh/README.md@1f6d9f40e4117d7c71b726f86074ac01c29f87f5 (release v25.05.04), table \"Nemotron-H 56b FP8\"";
const MB_ARCHIVE: &str = "github:NVIDIA-NeMo/Megatron-Bridge/docs/performance-summary-archive.md@067f987df03b8355b03192d88d70f1709fedf51a";
const MB_SUMMARY: &str = "github:NVIDIA-NeMo/Megatron-Bridge/docs/performance-summary.md@067f987df03b8355b03192d88d70f1709fedf51a";

const H_56B: &str = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-";
const H_47B: &str = "M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---M-M*-M-M-M-M-M-";
const H_8B: &str = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-";
const NANO2_9B: &str = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-";
const NANO2_12B: &str = "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-";
const NANO3: &str = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME";
const SUPER3: &str = "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME";

/// The Mamba-2 mixer of the family: 8 groups, conv width 4, scan chunk 128.
fn mixer(heads: u32, head_dim: u32, state: u32) -> MambaConfig {
    MambaConfig { heads, head_dim, state, groups: 8, conv_kernel: 4, chunk: 128 }
}

/// A Nemotron-H stack: the family's conventions with attention heads of 128 and the
/// dense MLP width `ffn` (0 when the pattern has no `-`).
#[allow(clippy::too_many_arguments, reason = "one row of the family's table")]
fn hybrid(pattern: &str, hidden: u32, ffn: u32, heads: u32, kv_heads: u32, mamba: MambaConfig, max_position: u32) -> Hyperparameters {
    let layers = pattern.chars().count() as u32;
    Hyperparameters {
        head_dim: 128,
        position: PositionScheme::None,
        max_position,
        activation: ActivationKind::SquaredRelu,
        mamba: Some(mamba),
        layer_pattern: pattern.into(),
        ..decoder(layers, hidden, ffn, heads, kv_heads, 131_072)
    }
}

/// Nemotron 3's experts: sigmoid scores with the top-k renormalised, one shared expert of
/// `shared_ffn`, routed experts at `latent` width (0: hidden).
fn experts(count: u32, top_k: u32, expert_ffn: u32, shared_ffn: u32, latent: u32) -> MoeConfig {
    MoeConfig {
        shared_experts: 1,
        shared_ffn,
        score: RouterScore::Sigmoid,
        normalize_top_k: true,
        latent,
        ..moe(count, top_k, expert_ffn)
    }
}

/// What a published run measured: `step` s per step (0: not published), tokens/s/GPU and
/// model TFLOP/s/GPU as the source counts them, on `gpus` GPUs.
fn measured(step: f64, tokens: f64, tflops: f64, gpus: u32, source: &str) -> PublishedMeasurement {
    PublishedMeasurement {
        step_time_s: step,
        tokens_per_s_per_gpu: tokens,
        model_tflops_per_gpu: tflops,
        gpus,
        source: source.into(),
    }
}

/// A Megatron-Bridge performance-summary row: `gpus` GPUs, fixed GBS, EP, MBS and TP
/// (sequence parallelism with TP, which Megatron's MoE layer requires in training).
#[allow(clippy::too_many_arguments, reason = "one row of the published table")]
fn mb_row(gpu: &str, gpus: u32, precision: &str, tp: u32, ep: u32, mbs: u32, gbs: u32, tokens: f64, tflops: f64, source: &str) -> Layout {
    let l = Layout::new(gpu, gpus, gpus, precision).tp(tp).ep(ep).mbs(mbs).gbs_fixed(gbs).source(source);
    let l = if tp > 1 { l.sp() } else { l };
    l.measured(measured(0.0, tokens, tflops, gpus, source))
}

/// The DGXC Nemotron-H 56B FP8 table at `gpus` GPUs: TP 8 (sequence parallel, as NeMo's
/// `nemotronh_56b` recipe), MBS 1, GBS 3 per GPU. Tokens/s/GPU is the table's tokens/s
/// over the GPUs, rounded as the calibration row has it; the README's MFU is over its own
/// FLOP formula (2.816e15 per sequence), and model TFLOP/s = MFU x 1979.
fn dgxc_56b(gpus: u32, step: f64, tokens: f64, tflops: f64) -> Layout {
    let source = format!("{DGXC}; tokens/s/GPU = tokens/s / GPUs, model TFLOP/s = MFU x 1979 (derived)");
    Layout::new("H100", gpus, gpus, "FP8")
        .tp(8)
        .sp()
        .gbs_per_gpu(3.0)
        .source(DGXC)
        .measured(measured(step, tokens, tflops, gpus, &source))
}

/// The plugin; tests call its `Guest` functions natively.
pub struct NemotronH;

impl Guest for NemotronH {
    fn describe() -> ModelInfo {
        let h_cite = |size: &str| format!("NVIDIA, Nemotron-H (arXiv 2504.03624); {PROVIDER} NemotronHModelProvider{size}");
        let nano2_cite = |size: &str| format!("NVIDIA, Nemotron Nano 2 (arXiv 2508.14444); {PROVIDER} NemotronNanoModelProvider{size}v2");
        let super_src = |rel: &str| format!("{MB_ARCHIVE}, section \"{rel} NeMo Container / Pre-Training\" (Nemotron_3_Super)");
        let nano_src = |doc: &str, rel: &str| format!("{doc}, section \"{rel} NeMo Container / Pre-Training\" (Nemotron_3_Nano)");
        let nano = |gpu: &str, gpus: u32, p: &str, mbs: u32, gbs: u32, tokens: f64, tflops: f64, source: &str| {
            mb_row(gpu, gpus, p, 1, 8, mbs, gbs, tokens, tflops, source)
        };
        let sup = |gpu: &str, p: &str, tp: u32, ep: u32, tokens: f64, tflops: f64| {
            mb_row(gpu, 64, p, tp, ep, 1, 512, tokens, tflops, &super_src("26.04.01"))
        };
        ModelInfo {
            family: FAMILY.into(),
            variants: vec![
                variant("nemotron-h-4b", FAMILY, &h_cite("4B"), hybrid(H_8B, 3072, 12_288, 32, 8, mixer(112, 64, 128), 8192), defaults(8192, 15e12, 3e-4), []),
                variant("nemotron-h-8b", FAMILY, &h_cite("8B"), hybrid(H_8B, 4096, 21_504, 32, 8, mixer(128, 64, 128), 8192), defaults(8192, 15e12, 3e-4), []),
                variant("nemotron-h-47b", FAMILY, &h_cite("47B"), hybrid(H_47B, 8192, 30_720, 64, 8, mixer(256, 64, 256), 8192), defaults(8192, 63e9, 3e-4), []),
                variant("nemotron-h-56b", FAMILY, &h_cite("56B"), hybrid(H_56B, 8192, 32_768, 64, 8, mixer(256, 64, 256), 8192), defaults(8192, 20e12, 3e-4), [
                    dgxc_56b(64, 15.058, 1632.1, 561.0),
                    dgxc_56b(1024, 15.678, 1567.5, 538.9),
                ]),
                variant("nemotron-nano-9b-v2", FAMILY, &nano2_cite("9B"), hybrid(NANO2_9B, 4480, 15_680, 40, 8, mixer(128, 80, 128), 131_072), defaults(8192, 20e12, 3e-4), []),
                variant("nemotron-nano-12b-v2", FAMILY, &nano2_cite("12B"), hybrid(NANO2_12B, 5120, 20_480, 40, 8, mixer(128, 80, 128), 131_072), defaults(8192, 20e12, 3e-4), []),
                variant(
                    "nemotron-3-nano-30b",
                    FAMILY,
                    &format!("NVIDIA, Nemotron 3 Nano 30B-A3B (arXiv 2512.20848); {PROVIDER} Nemotron3NanoProvider"),
                    Hyperparameters { moe: Some(experts(128, 6, 1856, 3712, 0)), ..hybrid(NANO3, 2688, 0, 32, 2, mixer(64, 64, 128), 262_144) },
                    defaults(8192, 25e12, 1.6e-3),
                    [
                        nano("GB300", 8, "MXFP8", 4, 512, 38_102.0, 849.0, &nano_src(MB_ARCHIVE, "26.04")),
                        nano("GB200", 8, "MXFP8", 2, 512, 32_727.0, 729.0, &nano_src(MB_ARCHIVE, "26.04")),
                        nano("B300", 8, "MXFP8", 4, 512, 35_282.0, 786.0, &nano_src(MB_ARCHIVE, "26.04")),
                        // The recipe config is NEMOTRON_3_NANO_PRETRAIN_CONFIG_H100_FP8_CS_V1
                        // (current scaling); the summary says FP8.
                        nano("H100", 16, "FP8-CS", 1, 1024, 14_507.0, 323.0, &nano_src(MB_ARCHIVE, "26.04")),
                        nano("GB300", 8, "MXFP8", 4, 512, 39_936.0, 901.0, &nano_src(MB_SUMMARY, "26.08")),
                    ],
                ),
                variant(
                    "nemotron-3-super-120b",
                    FAMILY,
                    &format!("NVIDIA, Nemotron 3 Super 120B-A12B (arXiv 2604.12374); {PROVIDER} Nemotron3SuperProvider; MTP per recipes/nemotronh/nemotron_3_super.py@1c92643"),
                    Hyperparameters {
                        moe: Some(experts(512, 22, 2688, 5376, 1024)),
                        mtp_depth: 2,
                        ..hybrid(SUPER3, 4096, 0, 32, 2, mixer(128, 64, 128), 262_144)
                    },
                    defaults(8192, 25e12, 4.5e-4),
                    [
                        sup("GB300", "MXFP8", 1, 64, 9344.0, 795.0),
                        sup("GB300", "NVFP4", 1, 64, 9600.0, 817.0),
                        sup("GB200", "MXFP8", 2, 64, 6656.0, 564.0),
                        sup("GB200", "NVFP4", 2, 64, 6784.0, 574.0),
                        sup("B300", "MXFP8", 1, 8, 7296.0, 623.0),
                        sup("B300", "NVFP4", 1, 8, 7424.0, 634.0),
                        sup("B200", "MXFP8", 1, 64, 6400.0, 542.0),
                        sup("B200", "NVFP4", 2, 64, 5632.0, 475.0),
                    ],
                ),
                // CPU proxy: every block kind of the family at hidden 256 (Mamba-2 mixer of 8
                // heads of 64 in 2 groups, state 32, chunk 64; GQA 8 heads of 32 over 2;
                // squared-ReLU MLP of 1024; 8 experts of 256, top-2, one shared of 512, at a
                // latent width of 128), pattern M E * - M E.
                variant(
                    "nemotronh-tiny",
                    FAMILY,
                    "runner proxy with the Nemotron-H / Nemotron 3 blocks (6 layers M E * - M E, hidden 256, LatentMoE)",
                    Hyperparameters {
                        head_dim: 32,
                        vocab: 8192,
                        moe: Some(experts(8, 2, 256, 512, 128)),
                        ..hybrid("ME*-ME", 256, 1024, 8, 2, MambaConfig { groups: 2, chunk: 64, ..mixer(8, 64, 32) }, 4096)
                    },
                    defaults(256, 1e8, 1e-3),
                    [Layout::new("CPU", 1, 1, "BF16").mbs(8).gbs_fixed(8).source("runner CPU proxy")],
                ),
            ],
        }
    }

    /// Nemotron 3 Super's two MTP depths apply one module (`MtpWeights::Repeated`); the
    /// other variants have no MTP.
    fn graph(request: GraphRequest) -> Result<Graph, String> {
        graph_for_with(&Self::describe(), &request, GraphOptions { mtp_weights: MtpWeights::Repeated, ..GraphOptions::default() })
    }
}

runner_plugin_sdk::export_workload!(NemotronH);

#[cfg(test)]
mod tests {
    use runner_graph::count::Convention;
    use runner_graph::shard::{Layout as Parallel, RankCoord, shard};
    use runner_graph::validate::validate;
    use runner_graph::{Graph as HostGraph, OpKind as HostOp};
    use runner_plugin_testkit as kit;

    use super::*;

    fn count(g: &HostGraph, kind: HostOp) -> usize {
        g.ops.iter().filter(|o| o.kind == kind).count()
    }

    fn hyper(name: &str) -> Hyperparameters {
        NemotronH::describe().variants.into_iter().find(|v| v.name == name).unwrap().hyper
    }

    #[test]
    fn every_variant_builds_and_validates() {
        kit::check_all_variants(&NemotronH::describe(), NemotronH::graph);
    }

    /// Each pattern character is one block: the 56B's 54 Mamba-2, 54 MLP and 10 attention
    /// layers (DGXC README FLOP notes; NVIDIA ADLR blog), Nemotron 3 Nano's 23 Mamba-2,
    /// 23 MoE and 6 attention layers (arXiv 2512.20848), Super's 40/40/8 plus its MTP
    /// module (one attention and one MoE block) at both depths.
    #[test]
    fn layer_kinds_are_the_published_counts() {
        for (name, mamba, mlp_blocks, attention, moe_blocks) in [
            ("nemotron-h-56b", 54, 54, 10, 0),
            ("nemotron-3-nano-30b", 23, 0, 6, 23),
            ("nemotron-3-super-120b", 40, 0, 8 + 2, 40 + 2),
        ] {
            let g = kit::host_graph(NemotronH::graph, name, 256, 1, 0);
            assert_eq!(count(&g, HostOp::SsmScan), mamba, "{name}: scans");
            assert_eq!(count(&g, HostOp::CausalConv1d), 3 * mamba, "{name}: convs over x, B and C");
            assert_eq!(count(&g, HostOp::Attention), attention, "{name}: attention");
            assert_eq!(count(&g, HostOp::Router), moe_blocks, "{name}: routers");
            let mlp = g.ops.iter().filter(|o| o.name.ends_with(".mlp.down")).count();
            assert_eq!(mlp, mlp_blocks, "{name}: dense MLPs");
            assert_eq!(count(&g, HostOp::Rotary), 0, "{name}: no position embedding");
            assert_eq!(count(&g, HostOp::SquaredRelu), mlp_blocks + 2 * moe_blocks, "{name}: squared ReLU in MLPs and experts");
        }
    }

    /// Published parameter totals, within the rounding of the published figure:
    /// Nemotron 3 Nano 31.6B total, 3.6B active with embeddings (NVIDIA's Nemotron 3
    /// announcement, research.nvidia.com/labs/nemotron/Nemotron-3, read 2026-12-02 via a
    /// quoting page); Super 120B total, 12B active without the input embedding (the name
    /// 120B-A12B; MTP weights excluded, as NVIDIA's total excludes them); the Nemotron-H
    /// and Nano v2 sizes from their names.
    #[test]
    fn parameters_match_published() {
        let p = kit::params(NemotronH::graph, "nemotron-3-nano-30b", 0);
        kit::assert_close("nemotron-3-nano-30b params", p.total as f64, 31.6e9, 0.005);
        kit::assert_close("nemotron-3-nano-30b active", p.active as f64, 3.6e9, 0.015);
        let p = kit::params(NemotronH::graph, "nemotron-3-super-120b", 88);
        kit::assert_close("nemotron-3-super-120b params (no MTP)", p.total as f64, 120e9, 0.01);
        kit::assert_close("nemotron-3-super-120b active (no input table)", (p.active - p.embedding) as f64, 12e9, 0.025);
        for (name, want, tol) in [
            ("nemotron-h-56b", 56e9, 0.01),
            ("nemotron-h-47b", 47e9, 0.01),
            ("nemotron-h-8b", 8e9, 0.02),
            ("nemotron-nano-9b-v2", 9e9, 0.02),
            ("nemotron-nano-12b-v2", 12e9, 0.03),
        ] {
            let p = kit::params(NemotronH::graph, name, 0);
            kit::assert_close(&format!("{name} params"), p.total as f64, want, tol);
        }
        // 4B is a name: its provider config has 4.49B, 3.68B without the two 131072 x 3072
        // tables (untied: the checkpoint's 311 tensors include an lm head). By hand, per
        // Mamba layer (24): norm 3072, in_proj 3072 x (2x7168 + 2x8x128 + 112), conv
        // (7168 + 2048) x 5, A_log/D/dt_bias 3 x 112, gate norm 7168/8, out 7168 x 3072;
        // per MLP layer (24): norm + 2 x 3072 x 12288; per attention layer (4): norm,
        // q and o 2 x 4096 x 3072, k and v 2 x 1024 x 3072; the final norm.
        let p = kit::params(NemotronH::graph, "nemotron-h-4b", 0);
        let mamba = 3072 + 3072 * 16_496 + 9216 * 5 + 3 * 112 + 896 + 7168 * 3072;
        let (mlp, attention) = (3072 + 2 * 3072 * 12_288, 3072 + 2 * 4096 * 3072 + 2 * 1024 * 3072);
        assert_eq!(p.total - 2 * 131_072 * 3072, 24 * mamba + 24 * mlp + 4 * attention + 3072, "nemotron-h-4b without embeddings");
    }

    /// DGXC's 56B README counts 2.816e15 model FLOPs per 8192-token sequence (attention
    /// over all keys, lm head included). Its SSD term uses chunk 256 where the mixer
    /// trains with 128, so the graph's count is a little lower.
    #[test]
    fn model_flops_match_dgxc() {
        let full = kit::flops_per_sample(NemotronH::graph, "nemotron-h-56b", 8192, 0, &Convention::FULL);
        kit::assert_close("nemotron-h-56b FLOPs/sample (full attention)", full, 2.816e15, 0.01);
        assert!(full < 2.816e15, "chunk 128 counts less scan work than DGXC's chunk 256");
    }

    /// Super's two MTP depths apply one module: every depth computes, its weights count
    /// once (Megatron-Bridge's `mtp_use_repeated_layer`).
    #[test]
    fn super_mtp_is_one_module_applied_twice() {
        let g = kit::host_graph(NemotronH::graph, "nemotron-3-super-120b", 256, 1, 0);
        let layer_ops = |l: i32| g.ops.iter().filter(|o| o.layer == l).count();
        assert_eq!(layer_ops(88), layer_ops(89));
        assert!(layer_ops(88) > 0);
        assert!(g.tensor_id("mtp.0.moe.experts.up.weight").is_some());
        assert!(!g.tensors.iter().any(|t| t.name.starts_with("mtp.1.")
            && t.kind == runner_graph::TensorKind::Weight));
        let with = kit::params(NemotronH::graph, "nemotron-3-super-120b", 0).total;
        let without = kit::params(NemotronH::graph, "nemotron-3-super-120b", 88).total;
        // One *E module: attention 4096 x (4096 + 2 x 256) + 4096 x 4096, the LatentMoE
        // block (router, latent projections, 512 experts of 1024 <-> 2688, a 5376-wide
        // shared expert), eh_proj 8192 -> 4096 and five norms.
        let attention = 4096 * (4096 + 2 * 256) + 4096 * 4096;
        let moe = 512 * 4096 + 2 * 1024 * 4096 + 512 * 2 * 1024 * 2688 + 2 * 4096 * 5376;
        assert_eq!(with - without, attention + moe + 8192 * 4096 + 5 * 4096);
    }

    /// Nemotron 3 Super's LatentMoE: the router and shared expert at hidden 4096, the
    /// routed experts between 4096 -> 1024 and 1024 -> 4096 projections.
    #[test]
    fn super_experts_run_in_the_latent_space() {
        let g = kit::host_graph(NemotronH::graph, "nemotron-3-super-120b", 256, 1, 2);
        let shape = |n: &str| g.tensor(g.tensor_id(n).unwrap_or_else(|| panic!("no {n}"))).shape.clone();
        assert_eq!(shape("layers.1.moe.router_logits.weight"), [512, 4096]);
        assert_eq!(shape("layers.1.moe.fc1_latent_proj.weight"), [1024, 4096]);
        assert_eq!(shape("layers.1.moe.experts.up.weight"), [512, 2688, 1024]);
        assert_eq!(shape("layers.1.moe.experts.down.weight"), [512, 1024, 2688]);
        assert_eq!(shape("layers.1.moe.fc2_latent_proj.weight"), [4096, 1024]);
        assert_eq!(shape("layers.1.moe.shared.up.weight"), [5376, 4096]);
        assert_eq!(shape("layers.1.moe.dispatch"), [256 * 22, 1024]);
    }

    /// Tensor parallelism over the mixers: tp 2 gives each rank half the Mamba heads and
    /// groups (and half the attention heads), and the sharded graph validates; a tp the
    /// groups cannot split is refused. The 56B's published TP 8 splits its 8 groups.
    #[test]
    fn tensor_parallelism_splits_mamba_heads_and_groups() {
        let g = kit::host_graph(NemotronH::graph, "nemotronh-tiny", 64, 2, 0);
        let l = |tp: u32| Parallel { tp, sequence_parallel: tp > 1, ..Parallel::single(2, 2) };
        l(2).validate(&g, 2).unwrap();
        for r in 0..2 {
            let s = shard(&g, &l(2), RankCoord { tp: r, ..RankCoord::default() }).unwrap();
            validate(&s.graph).unwrap_or_else(|e| panic!("rank {r}: {e}"));
            let sg = &s.graph;
            let shape = |n: &str| sg.tensors.iter().rev().find(|t| t.name == n).unwrap_or_else(|| panic!("no {n}")).shape.clone();
            // 8 heads of 64 in 2 groups of state 32: 4 heads and 1 group a rank.
            assert_eq!(shape("layers.0.mixer.z.weight"), [256, 256]);
            assert_eq!(shape("layers.0.mixer.conv_x.weight"), [256, 4]);
            assert_eq!(shape("layers.0.mixer.conv_b.weight"), [32, 4]);
            assert_eq!(shape("layers.0.mixer.scan.a_log"), [4]);
            assert_eq!(shape("layers.0.mixer.out.weight"), [256, 256]);
            let scan = sg.ops.iter().find(|o| o.name == "layers.0.mixer.scan").unwrap();
            assert_eq!(sg.tensors[scan.inputs[2]].shape, [2, 64, 1, 32], "B holds this rank's group");
        }
        let e = l(4).validate(&g, 4).unwrap_err();
        assert!(e.contains("does not divide the 2 groups"), "{e}");
        // With experts parallel too (Super's GB200 rows: TP 2, EP 64): the latent
        // projections stay whole on every rank (replicated), the experts split.
        let ep = Parallel { ep: 2, dp: 2, global_batch: 4, ..l(2) };
        ep.validate(&g, 4).unwrap();
        let s = shard(&g, &ep, RankCoord { tp: 1, dp: 1, ..RankCoord::default() }).unwrap();
        validate(&s.graph).unwrap();
        let shape = |n: &str| s.graph.tensors.iter().rev().find(|t| t.name == n).unwrap_or_else(|| panic!("no {n}")).shape.clone();
        assert_eq!(shape("layers.1.moe.fc1_latent_proj.weight"), [128, 256]);
        assert_eq!(shape("layers.1.moe.fc2_latent_proj.weight"), [256, 128]);
        assert_eq!(shape("layers.1.moe.experts.up.weight"), [4, 256, 128], "4 of the 8 experts, latent-wide");
        let big = kit::host_graph(NemotronH::graph, "nemotron-h-56b", 256, 1, 2);
        Parallel { tp: 8, sequence_parallel: true, ..Parallel::single(1, 1) }.validate(&big, 8).unwrap();
        assert_eq!(hyper("nemotron-h-56b").mamba.map(|m| m.groups), Some(8));
    }

    /// Every NVIDIA reference row of these models in the calibration file is a layout here
    /// with its measured figures: the same GPU, precision, GPU count, TP, EP, MBS and GBS,
    /// tokens/s/GPU, model TFLOP/s/GPU and step time. Third-party rows (a cloud re-run) are
    /// calibration data, not reference layouts.
    #[test]
    fn layouts_are_the_calibration_rows() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../host/project/data/calibration.toml")).unwrap();
        let file: toml::Table = toml::from_str(&text).unwrap();
        let info = NemotronH::describe();
        let mut rows = 0;
        for p in file["point"].as_array().unwrap() {
            let get = |k: &str| p.get(k);
            let model = get("model").and_then(|v| v.as_str()).unwrap();
            let Some(v) = info.variants.iter().find(|v| v.name == model) else { continue };
            if get("source_kind").and_then(|v| v.as_str()).is_some_and(|k| k.starts_with("THIRD-PARTY")) {
                continue;
            }
            rows += 1;
            let int = |k: &str, default: i64| get(k).and_then(|v| v.as_integer()).unwrap_or(default) as u32;
            let num = |k: &str| get(k).and_then(|v| v.as_float()).unwrap_or(0.0);
            let (gpu, precision, gpus) = (get("gpu").unwrap().as_str().unwrap(), get("precision").unwrap().as_str().unwrap(), int("num_gpus", 0));
            let found = v.layouts.iter().any(|l| {
                let gbs = (l.gbs_per_gpu * f64::from(gpus)).round() as u32 + l.gbs_fixed;
                let m = l.measured.as_ref();
                l.gpu == gpu
                    && training_precision_name(l.precision) == precision
                    && (l.gpus_min, l.gpus_max) == (gpus, gpus)
                    && (l.tp, l.pp, l.cp, l.ep, l.mbs, gbs) == (int("tp", 1), int("pp", 1), int("cp", 1), int("ep", 1), int("mbs", 1), int("gbs", 0))
                    && m.is_some_and(|m| {
                        m.gpus == gpus
                            && (m.tokens_per_s_per_gpu - num("tokens_per_sec_per_gpu")).abs() < 1e-6
                            && (m.model_tflops_per_gpu - num("model_tflops_per_gpu")).abs() < 1e-6
                            && (m.step_time_s - num("step_time_s")).abs() < 1e-6
                            && m.source.starts_with(get("source").unwrap().as_str().unwrap().split(", section").next().unwrap())
                    })
            });
            assert!(found, "{model}: no layout for the calibration row {p:?}");
        }
        assert_eq!(rows, 2 + 8 + 5, "the 56B's two DGXC rows, Super's eight, Nano's five");
    }

    /// The CPU proxy is the last variant, fits the host's measurement budget (2 layers of
    /// f32 weights, grads and AdamW moments in 1 GiB), builds at the measured size (seq
    /// 256 x batch 8) and has every block kind with the family's pieces: Mamba-2 mixers,
    /// unrotated GQA, a squared-ReLU MLP and LatentMoE experts.
    #[test]
    fn tiny_proxy_has_every_block_kind() {
        let info = NemotronH::describe();
        let v = info.variants.last().unwrap();
        assert_eq!(v.name, "nemotronh-tiny");
        let (g, p2) = kit::measured_graph(NemotronH::graph, "nemotronh-tiny", 0);
        for k in [HostOp::SsmScan, HostOp::CausalConv1d, HostOp::Attention, HostOp::Router, HostOp::SquaredRelu] {
            assert!(count(&g, k) > 0, "{k:?} missing");
        }
        assert_eq!(count(&g, HostOp::Rotary), 0);
        assert!(g.tensor_id("layers.1.moe.fc1_latent_proj.weight").is_some());
        // The first two layers (a 2-layer measurement) hold a mixer and the experts.
        let two = kit::host_graph(NemotronH::graph, "nemotronh-tiny", 256, 8, 2);
        assert_eq!((count(&two, HostOp::SsmScan), count(&two, HostOp::Router)), (1, 1));
        println!("nemotronh-tiny params: {} (2 layers: {})", kit::params(NemotronH::graph, "nemotronh-tiny", 0).total, p2.total);
    }
}
