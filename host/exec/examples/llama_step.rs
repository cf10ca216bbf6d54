//! Time a training step of the executor-issue benchmark model (4 layers, hidden 256,
//! 8 heads over 2 KV heads, FFN 688, seq 256, batch 8, vocab 8192) on the CPU and
//! compose it to 32 layers.
//!
//! `RAYON_NUM_THREADS=2 cargo run --release -p runner-exec --example llama_step [repeats] [none|selective|full]`
//!
//! The second argument sets activation recompute (default none).
//!
//! `host/exec/benches/pytorch_llama_step.py` runs the same step in PyTorch eager; the
//! `params` lines of the two must agree. `JSON=1` adds the full measurement; the last
//! line is always a one-line JSON summary in the Python script's format.

use runner_exec::proxy::{MeasureOptions, measure_training_step};
use runner_exec::timing::TimingOptions;
use runner_exec::toy::{ToyConfig, llama};
use runner_graph::recompute::RecomputePolicy;

fn main() -> Result<(), runner_exec::ExecError> {
    let repeats = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let recompute = match std::env::args().nth(2).as_deref() {
        None | Some("none") => RecomputePolicy::None,
        Some("selective") => RecomputePolicy::Selective,
        Some("full") => RecomputePolicy::Full,
        Some(other) => {
            return Err(runner_exec::ExecError::Input(format!(
                "recompute '{other}': use none, selective or full"
            )));
        }
    };
    let g = llama(&ToyConfig::bench());
    let opts = MeasureOptions {
        timing: TimingOptions { warmup: 2, repeats },
        full_layers: Some(32),
        recompute,
        ..MeasureOptions::default()
    };
    let params: u64 = g
        .tensors
        .iter()
        .filter(|t| t.kind == runner_graph::TensorKind::Weight)
        .map(|t| t.numel())
        .sum();
    let m = measure_training_step(&g, opts)?;
    let s = |x: runner_exec::Stat| {
        format!(
            "median {:.4} s (p10 {:.4}, p90 {:.4})",
            x.median, x.p10, x.p90
        )
    };
    println!("device      {}", m.timing.device);
    println!("params      {params}");
    println!("step        {}", s(m.timing.step));
    println!("  forward   {}", s(m.timing.forward));
    println!("  backward  {}", s(m.timing.backward));
    println!("  optimizer {}", s(m.timing.optimizer));
    println!("  recompute {} ({recompute:?}; inside backward)", s(m.timing.recompute));
    println!(
        "tokens/s    {:.0}   model TFLOP/s {:.4}  ({})",
        m.tokens_per_s, m.achieved_tflops, m.convention
    );
    println!(
        "per layer   {:.4} s, outside layers {:.4} s -> 32 layers {:.3} s",
        m.per_layer_s, m.non_layer_s, m.projected_full_step_s
    );
    println!(
        "memory      peak {:.1} MiB, live tensors {:.1} MiB (ratio {:.3}), keep-everything {:.1} MiB",
        m.memory.peak_bytes as f64 / 1048576.0,
        m.memory.required_bytes as f64 / 1048576.0,
        m.memory.peak_bytes as f64 / m.memory.required_bytes as f64,
        m.memory.keep_everything_bytes as f64 / 1048576.0
    );
    println!("losses      {:?}", m.timing.losses);
    let mut ops = m.timing.ops.clone();
    ops.sort_by(|a, b| {
        (b.forward.median + b.backward.median).total_cmp(&(a.forward.median + a.backward.median))
    });
    println!("slowest ops (fwd / bwd median s):");
    for o in ops.iter().take(10) {
        println!(
            "  {:32} {:>10.5} {:>10.5}",
            o.name, o.forward.median, o.backward.median
        );
    }
    let mut kinds: Vec<(String, f64, f64)> = Vec::new();
    for o in &m.timing.ops {
        match kinds.iter_mut().find(|k| k.0 == o.kind) {
            Some(k) => {
                k.1 += o.forward.median;
                k.2 += o.backward.median;
            }
            None => kinds.push((o.kind.clone(), o.forward.median, o.backward.median)),
        }
    }
    kinds.sort_by(|a, b| (b.1 + b.2).total_cmp(&(a.1 + a.2)));
    println!("by op kind (sum of medians, fwd / bwd s):");
    for (k, f, b) in &kinds {
        println!("  {k:32} {f:>10.5} {b:>10.5}");
    }
    if std::env::var_os("JSON").is_some() {
        println!("{}", serde_json::to_string_pretty(&m).unwrap_or_default());
    }
    let stat = |x: runner_exec::Stat| serde_json::json!({"median": x.median, "p10": x.p10, "p90": x.p90, "min": x.min, "max": x.max, "n": x.n});
    println!(
        "{}",
        serde_json::json!({
            "impl": "runner-exec",
            "threads": rayon::current_num_threads(),
            "params": params,
            "warmup": m.timing.warmup,
            "repeats": m.timing.repeats,
            "step": stat(m.timing.step),
            "forward": stat(m.timing.forward),
            "backward": stat(m.timing.backward),
            "optimizer": stat(m.timing.optimizer),
        })
    );
    Ok(())
}
