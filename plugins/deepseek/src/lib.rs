//! DeepSeek-V3: multi-head latent attention, 1 shared + 256 routed SwiGLU experts with
//! sigmoid top-8 routing, 3 dense leading layers, and one multi-token-prediction module;
//! plus `deepseek-tiny`, a runner CPU proxy with the same architecture.
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
//!
//! Kimi-K2 (`kimi-k2-1t`) is the same architecture at other sizes: Hugging Face
//! `config.json` of moonshotai/Kimi-K2-Instruct (61 layers, hidden 7168, intermediate
//! 18432, moe_intermediate 2048, 64 heads, the same MLA ranks, 384 routed experts and 1
//! shared, 8 per token, first_k_dense_replace 1, sigmoid scoring, vocab 163840, no
//! next-token-prediction layer); "Kimi K2: Open Agentic Intelligence" (arXiv 2507.20534):
//! 1.04T total / 32.6B activated parameters, 15.5T tokens at seq 4096, MuonClip.
//! Layouts: DGXC Benchmarking and Megatron-Bridge performance summaries.

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, moe, variant, Layout};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "deepseek";
const DGXC: &str = "github:NVIDIA/dgxc-benchmarking/deepseek_v3/pretraining/README.md@1f6d9f4 (v25.05.04, NeMo 25.04.01)";
const MB: &str = "github:NVIDIA-NeMo/Megatron-Bridge/docs/performance-summary-archive.md@067f987";

fn v3() -> Hyperparameters {
    let mla = MlaConfig { q_lora_rank: 1536, kv_lora_rank: 512, qk_nope_head_dim: 128, qk_rope_head_dim: 64, v_head_dim: 128 };
    deepseek(decoder(61, 7168, 18_432, 128, 128, 129_280), mla, 3, moe(256, 8, 2048))
}

/// DeepSeek-V3's conventions on a base decoder shape: MLA (head dim = nope + rope), one
/// shared expert beside sigmoid-scored routed experts after `dense_layers` dense layers,
/// one MTP module, RMSNorm eps 1e-6.
fn deepseek(base: Hyperparameters, mla: MlaConfig, dense_layers: u32, routed: MoeConfig) -> Hyperparameters {
    Hyperparameters {
        head_dim: mla.qk_nope_head_dim + mla.qk_rope_head_dim,
        max_position: 163_840,
        norm_eps: 1e-6,
        attention: AttentionKind::Mla,
        mla: Some(mla),
        moe: Some(MoeConfig { shared_experts: 1, dense_layers, score: RouterScore::Sigmoid, ..routed }),
        mtp_depth: 1,
        ..base
    }
}

/// Kimi-K2: DeepSeek-V3's layer with half the heads, 384 routed experts, one dense
/// leading layer and no MTP module.
fn kimi_k2() -> Hyperparameters {
    let mla = MlaConfig { q_lora_rank: 1536, kv_lora_rank: 512, qk_nope_head_dim: 128, qk_rope_head_dim: 64, v_head_dim: 128 };
    Hyperparameters { mtp_depth: 0, ..deepseek(decoder(61, 7168, 18_432, 64, 64, 163_840), mla, 1, moe(384, 8, 2048)) }
}

/// The CPU proxy: 4 layers x 256 with 8 heads, MLA ranks scaled down (q latent 128, kv
/// latent 64, per-head nope 32 + rope 16, values 32), 1 dense leading layer of FFN 688,
/// then 1 shared + 8 routed experts of width 256 with sigmoid top-2 routing, and the MTP
/// module.
fn tiny() -> Hyperparameters {
    let mla = MlaConfig { q_lora_rank: 128, kv_lora_rank: 64, qk_nope_head_dim: 32, qk_rope_head_dim: 16, v_head_dim: 32 };
    deepseek(decoder(4, 256, 688, 8, 8, 8192), mla, 1, moe(8, 2, 256))
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
            variants: vec![
                variant(
                    "deepseek-v3-671b",
                    FAMILY,
                    "DeepSeek-AI, DeepSeek-V3 Technical Report, arXiv 2412.19437; HF config.json",
                    v3(),
                    defaults(4096, 14.8e12, 2.2e-4),
                    layouts,
                ),
                variant(
                    "kimi-k2-1t",
                    FAMILY,
                    "Moonshot AI, Kimi K2: Open Agentic Intelligence, arXiv 2507.20534; HF config.json of moonshotai/Kimi-K2-Instruct",
                    kimi_k2(),
                    defaults(4096, 15.5e12, 2e-4),
                    [Layout::new("GB300", 256, 256, "MXFP8").pp(4).vp(4).ep(64).mbs(2).gbs_fixed(4096).source(&format!("{MB} (26.04)"))],
                ),
                // CPU proxy with the DeepSeek-V3 architecture (see `tiny`).
                variant(
                    "deepseek-tiny",
                    FAMILY,
                    "runner proxy with the DeepSeek-V3 architecture (4 layers, hidden 256, MLA, 1 shared + 8 routed experts top-2, MTP)",
                    tiny(),
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

runner_plugin_sdk::export_workload!(DeepSeek);

#[cfg(test)]
mod tests {
    use runner_graph::OpKind as HostOp;
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
        kit::assert_close("deepseek-v3 active without input embedding", (p.active - p.embedding) as f64, 37e9, 0.02);
        // The MTP module shares embedding and head; its own weights are one MoE block plus
        // the 2C->C projection and norms (~11.7B). HF's 685B also stores a copy of both
        // tables (2 x 0.93B) for the module.
        let with_mtp = kit::params(DeepSeek::graph, "deepseek-v3-671b", 0);
        let mtp = (with_mtp.total - p.total) as f64;
        assert!((11.0e9..12.5e9).contains(&mtp), "MTP module has {mtp:.3e} params");
    }

    /// Kimi-K2's published 1.04T total and 32.6B activated parameters (the input table
    /// counted, as the report does). The config's shapes give 1.026T (60 MoE layers of
    /// 384 x 3 x 7168 x 2048 is 1.015T alone): the headline figure is rounded up, so the
    /// total is held to 2 %.
    #[test]
    fn kimi_k2_parameters_match_published() {
        let p = kit::params(DeepSeek::graph, "kimi-k2-1t", 0);
        kit::assert_close("kimi-k2 params", p.total as f64, 1.04e12, 0.02);
        kit::assert_close("kimi-k2 active", p.active as f64, 32.6e9, 0.02);
    }

    /// MLA's scores: 128 heads, Q·Kᵀ over 192 dims (128 nope + 64 rope), P·V over 128; in
    /// all 61 layers and the MTP module's.
    #[test]
    fn causal_attention_halves_mla_scores() {
        kit::assert_causal_halves_scores(DeepSeek::graph, "deepseek-v3-671b", 4096, 62, 128 * 192, 128 * 128);
    }

    /// The CPU proxy is the last variant, fits the host's measurement budget (2 layers of
    /// f32 weights, grads and AdamW moments in 1 GiB) and builds at the measured size
    /// (seq 256 x batch 8) with DeepSeek-V3's pieces: MLA (latent norms, rope/nope concat),
    /// a dense first layer, then sigmoid top-2 routing beside a shared expert; the whole
    /// model adds the MTP module.
    #[test]
    fn tiny_proxy_has_the_deepseek_architecture() {
        let info = DeepSeek::describe();
        let v = info.variants.last().unwrap();
        assert_eq!(v.name, "deepseek-tiny");
        assert_eq!((v.hyper.attention, v.hyper.head_dim), (AttentionKind::Mla, 48));
        let (g, p2) = kit::measured_graph(DeepSeek::graph, "deepseek-tiny", 2);
        let count = |k: HostOp| g.ops.iter().filter(|o| o.kind == k).count();
        assert_eq!(count(HostOp::Concat), 4, "q and k rope/nope concat per layer");
        assert!(g.ops.iter().any(|o| o.name == "layers.0.attn.q_a_norm") && g.ops.iter().any(|o| o.name == "layers.1.attn.kv_norm"));
        assert!(g.ops.iter().any(|o| o.name == "layers.0.mlp.down"), "first layer dense");
        assert_eq!((count(HostOp::Router), count(HostOp::GroupedLinear)), (1, 3), "layer 1 routed");
        assert!(g.ops.iter().any(|o| o.name == "layers.1.moe.shared.down"), "shared expert");
        let router = g.ops.iter().find(|o| o.kind == HostOp::Router).unwrap();
        assert_eq!((router.int("top-k"), router.text("score"), router.flag("normalize")), (Some(2), Some("sigmoid"), Some(true)));
        assert!(!g.ops.iter().any(|o| o.name.starts_with("mtp.")), "proxy builds omit MTP");
        let full = kit::host_graph(DeepSeek::graph, "deepseek-tiny", 256, 1, 0);
        assert!(full.ops.iter().any(|o| o.name == "mtp.0.concat") && full.ops.iter().any(|o| o.name == "mtp.0.moe.router"));
        // embed + head 2*8192*256, final norm 256; per layer: MLA q_a 256*128 + 128,
        // q 128*8*32, q_pe 128*8*16, kv_a 256*64 + 64, k_rope 256*16, k_nope and v 2*64*8*32,
        // out 8*32*256; two norms 512; dense MLP 3*256*688 or router 256*8 + routed
        // 8*3*256*256 + shared 3*256*256.
        let mla = 256 * 128 + 128 + 128 * 256 + 128 * 128 + 256 * 64 + 64 + 256 * 16 + 2 * 64 * 256 + 256 * 256;
        let (dense, routed, shared) = (3 * 256 * 688, 8 * 3 * 256 * 256, 3 * 256 * 256 + 256 * 8);
        let no_mtp = kit::params(DeepSeek::graph, "deepseek-tiny", 4);
        let base = 2 * 8192 * 256 + 256 + 4 * (mla + 512) + 3 * shared;
        assert_eq!((no_mtp.total, no_mtp.active), (base + dense + 3 * routed, base + dense + 3 * routed / 4));
        // MTP: two input norms, 2C -> C projection, one MoE block, its final norm.
        let p = kit::params(DeepSeek::graph, "deepseek-tiny", 0);
        assert_eq!(p.total - no_mtp.total, 2 * 256 + 512 * 256 + mla + 512 + shared + routed + 256);
        println!("deepseek-tiny params: {} total, {} active; without MTP {} (2 layers: {})", p.total, p.active, no_mtp.total, p2.total);
    }
}
