//! The published model figures, checked through the real plugin boundary: the wasm plugin
//! builds the graph, the host converts and validates it, and the host's one FLOP counter
//! counts it. (The plugins' native unit tests check the same figures without wasm.)

use runner::plugin::workload::GraphRequest;
use runner::plugin::{self, Limits};
use runner_graph::count::{self, Convention};

fn graph(plugin_name: &str, variant: &str, seq_len: u32, layers: u32) -> runner_graph::Graph {
    let mut w = plugin::load(plugin_name)
        .unwrap()
        .workload(Limits::default())
        .unwrap();
    w.graph(&GraphRequest::training(variant, seq_len, 1, layers))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn close(what: &str, got: f64, want: f64, tol: f64) {
    let err = (got - want) / want;
    assert!(
        err.abs() <= tol,
        "{what}: got {got:.4e}, published {want:.4e}, error {:+.2}% > {:.1}%",
        err * 100.0,
        tol * 100.0
    );
}

#[test]
fn parameter_counts_match_the_published_figures() {
    // (plugin, variant, total, active or 0, tolerance). 0.5% unless the published figure
    // is itself rounded coarser (then the tolerance says so).
    for (p, v, total, active, tol) in [
        ("llama3", "llama3.1-8b", 8.03e9, 0.0, 0.005),
        ("llama3", "llama3.1-70b", 70.6e9, 0.0, 0.005),
        ("llama3", "llama3.1-405b", 405.9e9, 0.0, 0.005),
        ("gpt3", "gpt3-175b", 175e9, 0.0, 0.005),
        ("nemotron4", "nemotron4-340b", 341e9, 0.0, 0.005),
        ("mixtral", "mixtral-8x7b", 46.7e9, 12.9e9, 0.005),
        ("mixtral", "mixtral-8x22b", 141e9, 39.1e9, 0.005),
        ("qwen3", "qwen3-235b-a22b", 235e9, 0.0, 0.005),
        ("gptoss", "gpt-oss-120b", 116.83e9, 0.0, 0.005),
        // NVIDIA's Nemotron 3 announcement: 31.6B total, 3.6B active with embeddings,
        // rounded to 0.1B (1.5% on the active figure).
        ("nemotronh", "nemotron-3-nano-30b", 31.6e9, 3.6e9, 0.015),
    ] {
        // 2048: within every model's position table (GPT-3's learned positions stop there).
        let g = graph(p, v, 2048, 0);
        let c = count::params(&g);
        close(&format!("{v} total params"), c.total as f64, total, tol);
        if active > 0.0 {
            close(&format!("{v} active params"), c.active as f64, active, tol);
        }
    }
    // DeepSeek-V3: the published 671B excludes the 14B multi-token-prediction module, so
    // count the 61 main layers only (a layer count builds no MTP module). 37B active is
    // rounded to the billion: 2%.
    let g = graph("deepseek", "deepseek-v3-671b", 4096, 61);
    let c = count::params(&g);
    close("deepseek-v3 total params", c.total as f64, 671e9, 0.005);
    close("deepseek-v3 active params", c.active as f64, 37e9, 0.02);
}

#[test]
fn model_flops_per_sample_match_the_published_figures() {
    // The DGXC Benchmarking READMEs (github:NVIDIA/dgxc-benchmarking, e.g.
    // llama3.1/README_70b.md@8f5cbb3) count attention over all keys (no causal halving).
    // Llama 3.1 405B: the README prints 2.17e16 but its own formula gives 2.1507e16, which
    // we reproduce; hence 1% there.
    for (p, v, seq, want) in [
        ("llama3", "llama3.1-8b", 8192, 4.74e14),
        ("llama3", "llama3.1-70b", 8192, 3.94e15),
        ("llama3", "llama3.1-405b", 8192, 2.17e16),
        ("gpt3", "gpt3-175b", 2048, 2.20e15),
        ("nemotron4", "nemotron4-15b", 4096, 3.85e14),
        ("nemotron4", "nemotron4-340b", 4096, 8.62e15),
        // The DGXC Nemotron-H README (2.816e15); its SSD term assumes chunk 256 where the
        // mixer trains with 128: the graph counts 0.2% less.
        ("nemotronh", "nemotron-h-56b", 8192, 2.816e15),
    ] {
        let g = graph(p, v, seq, 0);
        close(
            &format!("{v} model FLOPs/sample"),
            count::model_flops_per_step(&g, &Convention::FULL),
            want,
            0.01,
        );
    }
    // Megatron-Bridge tables imply per-token figures under causal halving.
    let g = graph("llama3", "llama3.1-70b", 8192, 0);
    close(
        "llama3.1-70b FLOPs/token (causal)",
        count::model_flops_per_step(&g, &Convention::CAUSAL) / 8192.0,
        4.492e11,
        0.01,
    );
}
