//! Time a training step of the executor-issue benchmark model (4 layers, hidden 256,
//! 8 heads over 2 KV heads, FFN 688, seq 256, batch 8, vocab 8192) on the CPU and
//! compose it to 32 layers.
//!
//! `RAYON_NUM_THREADS=2 cargo run --release -p runner-exec --example llama_step [repeats]`

use runner_exec::proxy::{MeasureOptions, measure_training_step};
use runner_exec::timing::TimingOptions;
use runner_exec::toy::{ToyConfig, llama};

fn main() -> Result<(), runner_exec::ExecError> {
    let repeats = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let g = llama(&ToyConfig::bench());
    let opts = MeasureOptions {
        timing: TimingOptions { warmup: 1, repeats },
        full_layers: Some(32),
        ..MeasureOptions::default()
    };
    let m = measure_training_step(&g, opts)?;
    let s = |x: runner_exec::Stat| {
        format!(
            "median {:.4} s (p10 {:.4}, p90 {:.4})",
            x.median, x.p10, x.p90
        )
    };
    println!("device      {}", m.timing.device);
    println!("step        {}", s(m.timing.step));
    println!("  forward   {}", s(m.timing.forward));
    println!("  backward  {}", s(m.timing.backward));
    println!("  optimizer {}", s(m.timing.optimizer));
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
    if std::env::var_os("JSON").is_some() {
        println!("{}", serde_json::to_string_pretty(&m).unwrap_or_default());
    }
    Ok(())
}
