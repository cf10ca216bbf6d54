//! Grok-1: 314B mixture-of-experts decoder, 8 GeGLU experts with top-2 softmax routing,
//! GQA with 8 KV heads, tied input/output embedding.
//!
//! Sources: github:xai-org/grok-1 `run.py` / `model.py` (64 layers, emb_size 6144
//! = 48 x 128, 48 query heads, 8 KV heads, key size 128, widening_factor 8 giving an FFN of
//! int(8 x 6144) x 2/3 = 32768, num_experts 8, num_selected_experts 2, vocab 131072,
//! sequence 8192, gelu-gated experts, output through the embedding's transpose); xAI's
//! "Open Release of Grok-1" (314B parameters). Grok-1's extra post-attention/post-MLP
//! RMSNorms (2 x 6144 weights a layer) are not modelled. Training tokens are not published.
//! notes/dgxc.md §4 records DGXC's H100 layout (TP4 PP8 CP2 EP8 VP8) without GPU counts or
//! GBS, so no reference layout is listed.

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, moe, variant};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "grok1";

/// The plugin; tests call its `Guest` functions natively.
pub struct Grok1;

impl Guest for Grok1 {
    fn describe() -> ModelInfo {
        let hyper = Hyperparameters {
            tied_embeddings: true,
            activation: ActivationKind::Geglu,
            moe: Some(moe(8, 2, 32_768)),
            ..decoder(64, 6144, 0, 48, 8, 131_072)
        };
        ModelInfo {
            family: FAMILY.into(),
            variants: vec![variant(
                "grok1-314b",
                FAMILY,
                "xAI, Open Release of Grok-1 (2024); github:xai-org/grok-1 model.py",
                hyper,
                defaults(8192, 1e12, 1e-4),
                [],
            )],
        }
    }

    fn graph(request: GraphRequest) -> Result<Graph, String> {
        graph_for(&Self::describe(), &request)
    }
}

runner_plugin_sdk::export_workload!(Grok1);

#[cfg(test)]
mod tests {
    use runner_graph::count::Convention;
    use runner_plugin_testkit as kit;

    use super::*;

    #[test]
    fn every_variant_builds_and_validates() {
        kit::check_all_variants(&Grok1::describe(), Grok1::graph);
    }

    #[test]
    fn parameters_match_published() {
        let p = kit::params(Grok1::graph, "grok1-314b", 0);
        // "314B" is rounded; the release's own shapes give 315.7B (tied embedding counted once).
        kit::assert_close("grok1 params", p.total as f64, 314e9, 0.006);
        println!("grok1 active: {:.4e} (no published figure)", p.active as f64);
    }

    /// DGXC: attention s/h/2 (causal-halved), MLP 18·L·f·h·topK: 4.27e15 at 8192.
    #[test]
    fn model_flops_match_dgxc() {
        let f = kit::flops_per_sample(Grok1::graph, "grok1-314b", 8192, 0, &Convention::CAUSAL);
        kit::assert_close("grok1 FLOPs/sample (causal)", f, 4.27e15, 0.01);
        kit::rel_err("grok1 FLOPs/sample (full)", kit::flops_per_sample(Grok1::graph, "grok1-314b", 8192, 0, &Convention::FULL), 4.27e15);
    }
}
