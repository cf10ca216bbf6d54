//! The benches that run on the `--device` device: GEMM throughput per number format and
//! copy bandwidth on a GPU, every kernel checked against the CPU backend, and the step of
//! one Llama 3.1 8B layer. The CPU-only benches (and a CPU run of `gemm`/`memory`) stay in
//! `commands.rs`.

use anyhow::{Context, Result, bail};
use serde::Serialize;

use runner::report::{Table, si};
use runner_exec::Device;
use runner_exec::bench::{device_gemm_bench, device_memory_bench};
use runner_exec::device::Elem;
use runner_exec::devcheck::{CheckRow, compare_kernels, compare_steps};
use runner_exec::proxy::{MeasureOptions, measure_training_step_on};
use runner_exec::select::{Chosen, DeviceSpec, choose};
use runner_exec::timing::TimingOptions;
use runner_exec::toy::{ToyConfig, llama};

use crate::commands::{self, emit};
use crate::{BenchCommand, Global};

/// Run `$body` with `$dev` bound to the chosen device, whatever its type.
macro_rules! on_device {
    ($chosen:expr, |$dev:ident| $body:expr) => {
        match $chosen {
            Chosen::Cpu($dev, _) => $body,
            #[cfg(feature = "cuda")]
            Chosen::Cuda($dev) => $body,
        }
    };
}

fn elem_of(dtype: &str) -> Result<Elem> {
    Ok(match dtype {
        "f32" | "fp32" => Elem::F32,
        "bf16" => Elem::BF16,
        "f16" | "fp16" => Elem::F16,
        "fp8" | "e4m3" | "fp8-e4m3" => Elem::F8E4M3,
        other => bail!("--dtype {other}: use f32, bf16, f16 or fp8"),
    })
}

/// Whether `spec` lands on the CPU (asked for, or `auto` without a usable GPU).
fn cpu_only(spec: DeviceSpec) -> bool {
    match spec {
        DeviceSpec::Cpu => true,
        DeviceSpec::Auto => runner_exec::select::cuda_unusable(0).is_some(),
        DeviceSpec::Cuda(_) => false,
    }
}

pub fn bench(cmd: BenchCommand, global: &Global) -> Result<()> {
    match cmd {
        BenchCommand::Gemm { sizes, dtype } => {
            let elem = elem_of(&dtype)?;
            if elem == Elem::F32 && cpu_only(global.device) {
                return commands::bench(BenchCommand::Gemm { sizes, dtype }, global);
            }
            if let Some(&bad) = sizes.iter().find(|&&n| n == 0 || n > 32_768) {
                bail!("--sizes: {bad} is outside 1..=32768");
            }
            let chosen = choose(global.device)?;
            let name = chosen.name();
            let rows = on_device!(chosen, |dev| device_gemm_bench(&dev, &sizes, elem))?;
            let mut t = Table::new(
                format!("{} GEMM on {name}", elem.name()),
                &["M=N=K", "median TFLOP/s", "best TFLOP/s", "median time"],
            );
            for r in &rows {
                t.rows.push(vec![
                    r.m.to_string(),
                    format!("{:.1}", r.tflops),
                    format!("{:.1}", r.best_tflops),
                    format!("{:.3} ms", r.time.median * 1e3),
                ]);
            }
            t.notes.push(
                "c (M,N) = a (M,K) · b (N,K)ᵀ (a linear layer's forward; the TN layout FP8 GEMMs take), output f32 \
                 for f32 operands and bf16 otherwise; FP8 operands with per-tensor scales; 7 samples timed with device \
                 events"
                    .into(),
            );
            emit(global, &t, &rows)
        }
        BenchCommand::Memory if !cpu_only(global.device) => {
            let chosen = choose(global.device)?;
            let name = chosen.name();
            let rows = on_device!(chosen, |dev| device_memory_bench(&dev, 1 << 28))?;
            let copy = rows.first().map_or(f64::NAN, |r| r.gbps);
            let mut t = Table::new(
                format!("memory bandwidth on {name}"),
                &["kernel", "median GB/s", "best GB/s", "% of copy", "bytes per pass"],
            );
            for r in &rows {
                t.rows.push(vec![
                    r.kernel.clone(),
                    format!("{:.1}", r.gbps),
                    format!("{:.1}", r.best_gbps),
                    format!("{:.0}%", 100.0 * r.gbps / copy),
                    si(r.bytes as f64),
                ]);
            }
            t.notes.push(
                "1 GiB f32 arrays; bytes = what each kernel must read + write (STREAM and nccl-tests count this way); \
                 7 samples of 3 calls timed with device events"
                    .into(),
            );
            emit(global, &t, &rows)
        }
        BenchCommand::Kernels => {
            let chosen = choose(global.device)?;
            let name = chosen.name();
            let mut rows: Vec<CheckRow> = on_device!(chosen, |dev| {
                let mut r = compare_kernels(&dev)?;
                r.extend(compare_steps(dev)?);
                Ok::<_, runner_exec::ExecError>(r)
            })?;
            rows.sort_by_key(|r| r.ok);
            let failed = rows.iter().filter(|r| !r.ok).count();
            let mut t = Table::new(
                format!("kernels on {name} against the CPU backend"),
                &["kernel", "error", "tolerance", "result"],
            );
            for r in &rows {
                t.rows.push(vec![
                    r.kernel.clone(),
                    format!("{:.2e}", r.error),
                    format!("{:.0e}", r.tolerance),
                    if r.ok { "ok" } else { "FAILED" }.into(),
                ]);
            }
            t.notes.push(format!(
                "{} checks, {failed} failed; error = max |device - cpu| / max(1, max |cpu|) on seeded inputs{}",
                rows.len(),
                if name.starts_with("cpu") { "; on the CPU this compares the CPU backend with itself" } else { "" }
            ));
            emit(global, &t, &rows)?;
            if failed > 0 {
                bail!("{failed} kernel check(s) failed on {name}");
            }
            Ok(())
        }
        BenchCommand::Layer { seq, batch, repeats } => {
            if seq == 0 || batch == 0 || repeats == 0 || seq > 131_072 {
                bail!("--seq (1..=131072), --batch and --repeats must be positive");
            }
            let g = llama(&ToyConfig::llama31_8b_layer(seq, batch));
            let opts = MeasureOptions {
                timing: TimingOptions { warmup: 2, repeats },
                full_layers: Some(32),
                ..MeasureOptions::default()
            };
            let chosen = choose(global.device)?;
            let m = on_device!(chosen, |dev| measure_training_step_on(&g, dev, opts)).context("the layer step")?;
            let mut t = Table::new(
                format!("Llama 3.1 8B layer, seq {seq} x batch {batch}, f32, on {}", m.timing.device),
                &["part", "median", "p10", "p90"],
            );
            let ms = |x: f64| format!("{:.2} ms", x * 1e3);
            for (what, s) in [
                ("whole step", m.timing.step),
                ("forward", m.timing.forward),
                ("backward", m.timing.backward),
                ("optimizer", m.timing.optimizer),
            ] {
                t.rows.push(vec![what.into(), ms(s.median), ms(s.p10), ms(s.p90)]);
            }
            let layer_f: f64 = m.timing.ops.iter().filter(|o| o.layer >= 0).map(|o| o.forward.median).sum();
            let layer_b: f64 = m.timing.ops.iter().filter(|o| o.layer >= 0).map(|o| o.backward.median).sum();
            t.rows.push(vec!["layer forward (ops of layer 0)".into(), ms(layer_f), String::new(), String::new()]);
            t.rows.push(vec!["layer backward (ops of layer 0)".into(), ms(layer_b), String::new(), String::new()]);
            t.notes.push(format!(
                "{:.1} model TFLOP/s over the step ({}); peak memory {}",
                m.achieved_tflops,
                m.convention,
                si(m.memory.peak_bytes as f64)
            ));
            #[derive(Serialize)]
            struct Out<'a> {
                layer_forward_s: f64,
                layer_backward_s: f64,
                measured: &'a runner_exec::MeasuredStep,
            }
            emit(global, &t, &Out { layer_forward_s: layer_f, layer_backward_s: layer_b, measured: &m })
        }
        BenchCommand::Collectives { minbytes, maxbytes, stepfactor, stepbytes, ngpus, iters, warmup, check, datatype, ops, timeout } => {
            let dtype = match datatype.as_str() {
                "float" | "f32" => Elem::F32,
                "bfloat16" | "bf16" => Elem::BF16,
                "half" | "f16" => Elem::F16,
                other => bail!("-d {other}: use float, bfloat16 or half"),
            };
            let args = crate::dist_bench::CollArgs {
                minbytes: crate::dist_bench::parse_size(&minbytes)?,
                maxbytes: crate::dist_bench::parse_size(&maxbytes)?,
                stepfactor,
                stepbytes: stepbytes.as_deref().map(crate::dist_bench::parse_size).transpose()?,
                ngpus: ngpus.max(1),
                iters,
                warmup,
                check,
                dtype,
                ops: ops.iter().map(|o| crate::dist_bench::Coll::parse(o)).collect::<Result<_>>()?,
                timeout: std::time::Duration::from_secs(timeout.max(1)),
            };
            if args.maxbytes < args.minbytes || args.maxbytes > 64 << 30 {
                bail!("-e must be at least -b and at most 64G");
            }
            crate::dist_bench::collectives(args, global)
        }
        BenchCommand::Step { layout, steps, in_process, timeout } => {
            crate::dist_bench::step(&layout, steps, in_process, std::time::Duration::from_secs(timeout.max(1)), global)
        }
        other => commands::bench(other, global),
    }
}

#[allow(dead_code, reason = "keeps the trait in scope for the macro's bodies")]
fn _device_in_scope<D: Device>(_: &D) {}
