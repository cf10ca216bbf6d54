//! Llama 2: dense decoders with RoPE, RMSNorm and SwiGLU over a 32,000-token vocabulary;
//! 7B and 13B use multi-head attention, 70B groups its 64 query heads over 8 KV heads.
//!
//! Sources: Hugging Face `config.json` of meta-llama/Llama-2-7b-hf, -13b-hf, -70b-hf
//! (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
//! num_key_value_heads, vocab_size 32000, rms_norm_eps 1e-5, rope_theta 10000,
//! max_position_embeddings 4096, tie_word_embeddings false); Touvron et al., "Llama 2: Open
//! Foundation and Fine-Tuned Chat Models" (arXiv 2307.09288) Table 1 (2T training tokens,
//! peak learning rates 3e-4 / 3e-4 / 1.5e-4, GQA for 70B only). The same shapes are NeMo's
//! `Llama2Config7B/13B/70B` (github:NVIDIA/NeMo nemo/collections/llm/gpt/model/llama.py).
//! Layouts: the NeMo 24.07 performance summary (H100 FP8, seq 4096), whose model-TFLOPs
//! column this plugin's graph reproduces (see the tests).

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, variant, Layout};
use runner_plugin_sdk::workload::*;

const FAMILY: &str = "llama2";
const NEMO_2407: &str = "github:NVIDIA/NeMo/docs/source/performance/performance_summary.md@9c4726d (NeMo 24.07)";

/// The plugin; tests call its `Guest` functions natively.
pub struct Llama2;

impl Guest for Llama2 {
    fn describe() -> ModelInfo {
        let paper = "Touvron et al., Llama 2: Open Foundation and Fine-Tuned Chat Models, arXiv 2307.09288; HF config.json";
        // RoPE theta 10,000 and RMSNorm eps 1e-5 are the builder's defaults.
        let v = |name: &str, layers, hidden, ffn, heads, kv_heads, lr, layout: Layout| {
            let hyper = Hyperparameters { max_position: 4096, ..decoder(layers, hidden, ffn, heads, kv_heads, 32_000) };
            variant(name, FAMILY, paper, hyper, defaults(4096, 2e12, lr), [layout.source(NEMO_2407)])
        };
        ModelInfo {
            family: FAMILY.into(),
            variants: vec![
                v("llama2-7b", 32, 4096, 11_008, 32, 32, 3e-4, Layout::new("H100", 8, 8, "FP8").gbs_fixed(128)),
                v("llama2-13b", 40, 5120, 13_824, 40, 40, 3e-4, Layout::new("H100", 16, 16, "FP8").pp(4).vp(10).gbs_fixed(128)),
                v("llama2-70b", 80, 8192, 28_672, 64, 8, 1.5e-4, Layout::new("H100", 64, 64, "FP8").tp(4).pp(4).vp(20).gbs_fixed(128)),
            ],
        }
    }

    fn graph(request: GraphRequest) -> Result<Graph, String> {
        graph_for(&Self::describe(), &request)
    }
}

runner_plugin_sdk::export_workload!(Llama2);

#[cfg(test)]
mod tests {
    use runner_graph::count::Convention;
    use runner_plugin_testkit as kit;

    use super::*;

    #[test]
    fn every_variant_builds_and_validates() {
        kit::check_all_variants(&Llama2::describe(), Llama2::graph);
    }

    /// arXiv 2307.09288 / the HF model cards: 6.74B, 13.0B, 69.0B parameters.
    #[test]
    fn parameters_match_published() {
        for (name, want) in [("llama2-7b", 6.74e9), ("llama2-13b", 13.0e9), ("llama2-70b", 69.0e9)] {
            let p = kit::params(Llama2::graph, name, 0);
            kit::assert_close(&format!("{name} params"), p.total as f64, want, 0.005);
            assert_eq!(p.total, p.active, "dense model");
        }
    }

    #[test]
    fn attention_is_mha_below_70b_and_gqa_at_70b() {
        let info = Llama2::describe();
        let kind = |n: &str| info.variants.iter().find(|v| v.name == n).unwrap().hyper.attention;
        assert_eq!(kind("llama2-7b"), AttentionKind::Mha);
        assert_eq!(kind("llama2-13b"), AttentionKind::Mha);
        assert_eq!(kind("llama2-70b"), AttentionKind::Gqa);
    }

    /// The NeMo 24.07 performance summary prints model TFLOPs/GPU next to tokens/s/GPU
    /// (780 / 16934, 760 / 8715, 768 / 1728); their ratio is its FLOPs per token, counted
    /// with attention over all keys. The TFLOPs are rounded to 3 digits: 1%.
    #[test]
    fn model_flops_match_nemo_performance_summary() {
        for (name, tflops, tokens) in [("llama2-7b", 780.0, 16934.0), ("llama2-13b", 760.0, 8715.0), ("llama2-70b", 768.0, 1728.0)] {
            let f = kit::flops_per_sample(Llama2::graph, name, 4096, 0, &Convention::FULL);
            kit::assert_close(&format!("{name} FLOPs/token (full attention)"), f / 4096.0, tflops * 1e12 / tokens, 0.01);
        }
    }
}
