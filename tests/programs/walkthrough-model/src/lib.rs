//! A new model family in one table: "mymodel", a Llama-style decoder at two sizes.
//! Source: the configs our lab trains (hypothetical; cite the real config.json here).

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, variant, Layout};
use runner_plugin_sdk::workload::*;

pub struct MyModel;

impl Guest for MyModel {
    fn describe() -> ModelInfo {
        let cite = "our-lab/mymodel config.json";
        ModelInfo {
            family: "mymodel".into(),
            variants: vec![
                variant(
                    "mymodel-1b",
                    "mymodel",
                    cite,
                    // layers, hidden, ffn, heads, kv heads, vocab; the rest is Llama-style.
                    decoder(16, 2048, 8192, 16, 4, 64_000),
                    defaults(4096, 2e12, 3e-4), // seq len, tokens to train, learning rate
                    vec![Layout::new("H100", 8, 64, "BF16").gbs_per_gpu(8.0).source(cite)],
                ),
                variant(
                    "mymodel-7b",
                    "mymodel",
                    cite,
                    Hyperparameters { rope_theta: 1e6, ..decoder(32, 4096, 14_336, 32, 8, 64_000) },
                    defaults(4096, 2e12, 3e-4),
                    vec![Layout::new("H100", 16, 256, "BF16").tp(2).gbs_per_gpu(4.0).source(cite)],
                ),
            ],
        }
    }

    fn graph(request: GraphRequest) -> Result<Graph, String> {
        // The SDK's transformer builder turns the hyperparameters into the full graph.
        graph_for(&Self::describe(), &request)
    }
}

runner_plugin_sdk::export_workload!(MyModel);
