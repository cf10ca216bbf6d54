//! Llama 4 Maverick: 48 layers alternating dense SwiGLU MLPs with MoE layers of 128
//! routed experts (top-1, sigmoid gate) plus one shared expert; GQA with 8 KV heads.
//!
//! Sources: Hugging Face `config.json` (text_config) of
//! meta-llama/Llama-4-Maverick-17B-128E (48 layers, hidden 5120, 40 heads, 8 KV heads,
//! head_dim 128, intermediate_size 8192 per expert and shared expert,
//! intermediate_size_mlp 16384 for dense layers, 128 local experts, 1 per token,
//! interleave_moe_layer_step 2 (MoE in layers 1, 3, 5, ...), vocab 202048, rope_theta
//! 500000, rms_norm_eps 1e-5, untied); Meta's Llama 4 model card: 17B active / 400B total,
//! ~22T training tokens. The vision encoder, the NoPE layers (every 4th layer skips RoPE,
//! same FLOPs) and the per-head QK norm are not modelled. No reference layout is
//! transcribed in our notes.

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, moe, variant};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "llama4";

/// The plugin; tests call its `Guest` functions natively.
pub struct Llama4;

impl Guest for Llama4 {
    fn describe() -> ModelInfo {
        let hyper = Hyperparameters {
            head_dim: 128,
            rope_theta: 500_000.0,
            max_position: 1_048_576,
            moe: Some(MoeConfig {
                shared_experts: 1,
                layer_frequency: 2,
                score: RouterScore::Sigmoid,
                normalize_top_k: false,
                ..moe(128, 1, 8192)
            }),
            ..decoder(48, 5120, 16_384, 40, 8, 202_048)
        };
        ModelInfo {
            family: FAMILY.into(),
            variants: vec![variant(
                "llama4-maverick-400b",
                FAMILY,
                "Meta, Llama 4 model card (Maverick 17B-128E); HF config.json",
                hyper,
                defaults(8192, 22e12, 1e-4),
                [],
            )],
        }
    }

    fn graph(request: GraphRequest) -> Result<Graph, String> {
        graph_for(&Self::describe(), &request)
    }
}

runner_plugin_sdk::export_workload!(Llama4);

#[cfg(test)]
mod tests {
    use runner_graph::count::Convention;
    use runner_plugin_testkit as kit;

    use super::*;

    #[test]
    fn every_variant_builds_and_validates() {
        kit::check_all_variants(&Llama4::describe(), Llama4::graph);
    }

    /// Meta counts active parameters with embeddings (17.2B rounds to 17B).
    #[test]
    fn parameters_match_published() {
        let p = kit::params(Llama4::graph, "llama4-maverick-400b", 0);
        kit::assert_close("llama4-maverick params", p.total as f64, 400e9, 0.005);
        kit::assert_close("llama4-maverick active", p.active as f64, 17e9, 0.015);
    }

    /// notes/dgxc.md §3.2 quotes 8.92e14 FLOPs/sample: the causal-halved convention at
    /// sequence 8192 (non-causal would be +11%).
    #[test]
    fn model_flops_match_dgxc() {
        let f = kit::flops_per_sample(Llama4::graph, "llama4-maverick-400b", 8192, 0, &Convention::CAUSAL);
        kit::assert_close("llama4-maverick FLOPs/sample (causal, 8192)", f, 8.92e14, 0.01);
        let full = kit::flops_per_sample(Llama4::graph, "llama4-maverick-400b", 8192, 0, &Convention::FULL);
        kit::rel_err("llama4-maverick FLOPs/sample (full, 8192)", full, 8.92e14);
    }
}
