//! The tiny proxy trains on the CPU: the graph comes from the real wasm plugin, through the
//! host's validation, into the executor; loss falls on a learnable token stream.

use runner::plugin::workload::GraphRequest;
use runner::plugin::{self, Limits};
use runner_exec::cpu::Cpu;
use runner_exec::executor::ADAMW_DEFAULT;
use runner_exec::{ExecOptions, Executor, Input};

#[test]
fn llama3_tiny_trains_and_its_loss_falls() {
    let (seq, batch) = (32u32, 2u32);
    let mut w = plugin::load("llama3.wasm")
        .unwrap()
        .workload(Limits::default())
        .unwrap();
    // Two of the proxy's four layers keep the debug-mode test light.
    let graph = w
        .graph(&GraphRequest::training("llama3-tiny", seq, batch, 2))
        .unwrap();
    let mut ex = Executor::new(&graph, Cpu::new(), ExecOptions::default()).unwrap();
    // A learnable stream: each token determines the next (t -> 7t + 3 mod 61).
    let n = (seq * batch) as usize;
    let mut tokens = Vec::with_capacity(n);
    let mut t = 5u32;
    for _ in 0..n {
        tokens.push(t);
        t = (7 * t + 3) % 61;
    }
    let targets: Vec<u32> = tokens.iter().map(|&t| (7 * t + 3) % 61).collect();
    let inputs = [
        ("tokens", Input::U32(&tokens)),
        ("targets", Input::U32(&targets)),
    ];
    let first = ex.step(&inputs, &ADAMW_DEFAULT).unwrap();
    assert!(
        (first - (8192f32).ln()).abs() < 0.5,
        "initial loss {first} should be near ln(vocab)"
    );
    let mut last = first;
    for _ in 0..25 {
        last = ex.step(&inputs, &ADAMW_DEFAULT).unwrap();
        assert!(last.is_finite());
    }
    assert!(last < 0.5 * first, "loss fell only from {first} to {last}");
}

#[test]
fn every_family_proxy_runs_forward_backward_and_adamw() {
    // Each family's CPU proxy keeps the family's architecture (MoE routing, MLA, windows,
    // learned positions, ...): a few steps on a fixed batch must lower the loss.
    for (plugin_name, variant) in [
        ("gpt3.wasm", "gpt3-tiny"),
        ("nemotron4.wasm", "nemotron4-tiny"),
        ("mixtral.wasm", "mixtral-tiny"),
        ("qwen3.wasm", "qwen3-tiny"),
        ("deepseek.wasm", "deepseek-tiny"),
        ("gptoss.wasm", "gpt-oss-tiny"),
        ("grok1.wasm", "grok1-tiny"),
        ("llama4.wasm", "llama4-tiny"),
    ] {
        let mut w = plugin::load(plugin_name)
            .unwrap()
            .workload(Limits::default())
            .unwrap();
        // All four layers, so every layer kind (dense and MoE, windowed and full) runs.
        let graph = w.graph(&GraphRequest::training(variant, 16, 2, 4)).unwrap();
        let mut ex = Executor::new(&graph, Cpu::new(), ExecOptions::default()).unwrap();
        let inputs = runner_exec::proxy::synthetic_inputs(&graph, 7);
        let named: Vec<(&str, Input<'_>)> = inputs
            .iter()
            .map(|(name, ints, floats)| {
                (
                    name.as_str(),
                    if floats.is_empty() {
                        Input::U32(ints)
                    } else {
                        Input::F32(floats)
                    },
                )
            })
            .collect();
        let first = ex
            .step(&named, &ADAMW_DEFAULT)
            .unwrap_or_else(|e| panic!("{variant}: {e}"));
        let mut last = first;
        for _ in 0..8 {
            last = ex
                .step(&named, &ADAMW_DEFAULT)
                .unwrap_or_else(|e| panic!("{variant}: {e}"));
        }
        assert!(
            first.is_finite() && last < first,
            "{variant}: loss went from {first} to {last}"
        );
    }
}
