//! The benches that run on the `--device` device: GEMM throughput per number format and
//! copy bandwidth on a GPU, every kernel checked against the CPU backend, the step of
//! one Llama 3.1 8B layer, and `runner measure` (the per-op times of the projection's
//! own rank graph, for `project --measured` and `calibrate --ops`). The CPU-only benches
//! (and a CPU run of `gemm`/`memory`) stay in `commands.rs`.

use std::collections::HashMap;

use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;
use serde_json::json;

use runner::report::{Table, si};
use runner_exec::Device;
use runner_exec::bench::{device_gemm_bench, device_memory_bench};
use runner_exec::device::Elem;
use runner_exec::devcheck::{CheckRow, compare_kernels, compare_steps};
use runner_exec::executor::Optimizer;
use runner_exec::linear_time::{LinearGemms, time_linear};
use runner_exec::proxy::{MeasureOptions, measure_training_step_on, measure_training_step_with};
use runner_exec::select::{Chosen, DeviceSpec, choose, choose_timed};
use runner_exec::timing::TimingOptions;
use runner_exec::toy::{ToyConfig, llama};
use runner_graph::count::{AttentionFlops, op_cost};
use runner_graph::{DType, Graph, Op, OpKind};
use runner_project::measured::{self, GemmDetail, MemoryDetail, OpClass, OpTime, OpsFile};
use runner_project::precision::Plan;
use runner_project::profile::{GemmFormat, Profiles};
use runner_project::template::ShardKey;

use crate::commands::project::Target;
use crate::commands::{self, emit_csv};
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

/// Refuses a bench's list flag that names one item twice (`gemm --sizes 8,8`,
/// `collectives --ops all_reduce,allreduce`): the item was measured twice, in two rows.
/// The shared rule, [`runner::input::refuse_repeats`].
fn refuse_repeats<K: PartialEq + std::fmt::Display>(flag: &str, items: &[(String, K)]) -> Result<()> {
    runner::input::refuse_repeats(flag, items, "each is measured once, in one row").map_err(anyhow::Error::msg)
}

/// Whether `spec` lands on the CPU (asked for, or `auto` without a usable GPU).
fn cpu_only(spec: DeviceSpec) -> bool {
    match spec {
        DeviceSpec::Cpu => true,
        DeviceSpec::Auto => runner_exec::select::cuda_unusable(0).is_some(),
        DeviceSpec::Cuda(_) | DeviceSpec::CudaEmulated => false,
    }
}

pub fn bench(cmd: BenchCommand, global: &Global) -> Result<()> {
    match cmd {
        BenchCommand::Gemm { sizes, dtype } => {
            refuse_repeats("--sizes", &sizes.iter().map(|&n| (n.to_string(), n)).collect::<Vec<_>>())?;
            let elem = elem_of(&dtype)?;
            if elem == Elem::F32 && cpu_only(global.device) {
                return commands::bench(BenchCommand::Gemm { sizes, dtype }, global);
            }
            if let Some(&bad) = sizes.iter().find(|&&n| n == 0 || n > 32_768) {
                bail!("--sizes: {bad} is outside 1..=32768");
            }
            let chosen = choose_timed(global.device, "bench gemm")?;
            let name = chosen.name();
            let rows = on_device!(chosen, |dev| device_gemm_bench(&dev, &sizes, elem))?;
            let mut t = Table::new(
                format!("{} GEMM on {name}", elem.name()),
                &["M=N=K", "median TFLOP/s", "best TFLOP/s", "median time"],
            );
            for r in &rows {
                t.rows.push(vec![
                    r.m.to_string(),
                    // A CPU's 0.04 TFLOP/s is not 0.0.
                    runner::report::fixed_or_significant(r.tflops, 1),
                    runner::report::fixed_or_significant(r.best_tflops, 1),
                    format!("{:.3} ms", r.time.median * 1e3),
                ]);
            }
            t.notes.push(
                "c (M,N) = a (M,K) · b (N,K)ᵀ (a linear layer's forward; the TN layout FP8 GEMMs take), output f32 \
                 for f32 operands and bf16 otherwise; FP8 operands with per-tensor scales; 7 samples timed with device \
                 events"
                    .into(),
            );
            let mut csv = runner::report::records(&rows);
            csv.notes = t.notes.clone();
            csv.notes.push("time.*: seconds per GEMM".into());
            emit_csv(global, &t, &rows, &csv)
        }
        BenchCommand::Memory if !cpu_only(global.device) => {
            let chosen = choose_timed(global.device, "bench memory")?;
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
                "1 GiB f32 arrays; bytes = what each kernel must read + write (STREAM and nccl-tests count this way; \
                 an FP8 code is 1 byte); 7 samples of 3 calls timed with device events; each FP8 cast also \
                 allocates and zeroes its 32-byte statistics record, which the timing includes (the executor \
                 reads the records once per pass)"
                    .into(),
            );
            let mut csv = runner::report::records(&rows);
            csv.notes = t.notes.clone();
            csv.notes.push("time.*: seconds per call".into());
            emit_csv(global, &t, &rows, &csv)
        }
        BenchCommand::Kernels => {
            let chosen = choose(global.device)?;
            let name = chosen.name();
            let mut rows: Vec<CheckRow> = on_device!(chosen, |dev| {
                let mut r = compare_kernels(&dev);
                r.extend(compare_steps(dev));
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
                "{} checks, {failed} failed, on seeded inputs; error = max |device - cpu| / max(1, max |cpu|), except: \
                 tolerance 0 asks for the same bits (error inf when any differs), rows ending 'relative' are relative \
                 to max |cpu| alone, rows 'in FP8 steps' count steps of the format{}",
                rows.len(),
                if name.starts_with("cpu") { "; on the CPU this compares the CPU backend with itself" } else { "" }
            ));
            emit_csv(global, &t, &rows, &runner::report::records(&rows))?;
            if failed > 0 {
                bail!("{} failed on {name}", runner::report::plural(failed, "kernel check"));
            }
            Ok(())
        }
        BenchCommand::Layer { seq, batch, repeats, cuda_graph, optimizer } => {
            if seq == 0 || batch == 0 || repeats == 0 || seq > 131_072 {
                bail!("--seq (1..=131072), --batch and --repeats must be positive");
            }
            // --batch had no ceiling: --batch 4294967295 allocated until the process was
            // killed or aborted, larger ones wrapped the graph's sizes. As `runner train`.
            if seq.saturating_mul(batch) > 1 << 20 {
                bail!("--seq x --batch = {seq} x {batch}: at most 2^20 tokens a step (1048576; e.g. --seq 131072 --batch 8)");
            }
            let g = llama(&ToyConfig::llama31_8b_layer(seq, batch));
            let opts = MeasureOptions {
                timing: TimingOptions { warmup: 2, repeats },
                full_layers: Some(32),
                optimizer: runner::train::optimizer_flag(&optimizer)?,
                ..MeasureOptions::default()
            };
            let chosen = choose_timed(global.device, "bench layer")?;
            if cuda_graph && let Chosen::Cpu(cpu, _) = &chosen {
                bail!("--cuda-graph: {}", runner_exec::device::no_graphs(&cpu.name()));
            }
            // The embedding and the head (128k x 4096 each) come with the layer: gigabytes
            // in f32 and many seconds on a CPU even at seq 1.
            let on_cpu = match (&chosen, opts.optimizer) {
                // What a CPU run costs, said before it starts: it measured 57 s and 20 GB
                // resident at --seq 16 --repeats 1 on two cores, and gave no sign for
                // minutes at the default --seq 2048.
                (Chosen::Cpu(..), Optimizer::AdamW) => {
                    "; on a CPU: minutes, and some 20 GB of memory (weights, gradients and AdamW moments of 1.3B \
                     parameters with the 128k-token embedding and head); --seq 128 --repeats 1 for a quick look"
                }
                // Five Newton-Schulz iterations of the three 4096 x 14336 matrices alone are
                // some 1.7e13 FLOPs a step, whatever --seq: minutes a step on a CPU.
                (Chosen::Cpu(..), Optimizer::Muon(_)) => {
                    "; on a CPU: some 20 GB of memory, and Muon's Newton-Schulz GEMMs (about 2e13 FLOPs a step on the \
                     4096 x 14336 matrices, whatever --seq) take minutes a step: a GPU's run"
                }
                _ => "",
            };
            if !global.quiet {
                elog!(
                    "{}",
                    runner::report::visible(&format!(
                        "one Llama 3.1 8B layer step with embedding and head, {}, {} warm-up + {repeats} timed{}{on_cpu}",
                        opts.optimizer.name(),
                        opts.timing.warmup,
                        if cuda_graph { ", eager then as a CUDA graph" } else { "" }
                    ))
                );
            }
            // Each step takes tens of seconds on a CPU: a bar through them (on a log, the
            // step and its seconds so far at least every 15 s). Two warm-up steps, as
            // the CUDA graph's run needs (eager, then recorded), so both runs take as many.
            let per_run = opts.timing.warmup + repeats;
            let bar = commands::Steps::new(global, per_run * if cuda_graph { 2 } else { 1 });
            let announce = |run: &'static str| {
                let steps = &bar;
                move |_, _, warmup: bool| steps.step(&format!("{run}{} step", if warmup { "warm-up" } else { "timed" }))
            };
            let m = on_device!(&chosen, |dev| measure_training_step_with(&g, dev.clone(), opts, &mut announce(""))).context("the layer step");
            let graphed = if cuda_graph && m.is_ok() {
                let o = MeasureOptions { cuda_graph: true, ..opts };
                Some(
                    on_device!(&chosen, |dev| measure_training_step_with(&g, dev.clone(), o, &mut announce("CUDA graph: ")))
                        .context("the layer step recorded as a CUDA graph"),
                )
            } else {
                None
            };
            drop(bar);
            let m = m?;
            let graphed = graphed.transpose()?;
            let mut t = Table::new(
                format!("Llama 3.1 8B layer, seq {seq} x batch {batch}, f32, {}, on {}", opts.optimizer.name(), m.timing.device),
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
            // Three significant figures (a CPU's 0.05 TFLOP/s printed as 0.0), and the
            // memory in GiB (`si` wrote 20.32e9 bytes as "20.32B").
            t.notes.push(format!(
                "{} model TFLOP/s over the step ({}); peak memory {:.2} GiB",
                runner::report::fixed_or_significant(m.achieved_tflops, 1),
                m.convention,
                m.memory.peak_bytes as f64 / f64::from(1u32 << 30)
            ));
            let mut same_losses = None;
            let mut same_bitwise = None;
            if let Some(gm) = &graphed {
                let s = gm.timing.step;
                t.rows.push(vec!["whole step, one CUDA graph".into(), ms(s.median), ms(s.p10), ms(s.p90)]);
                // Same seed, inputs and kernels: the replayed steps' losses equal the
                // eager ones, bit for bit except where the embedding gradient's atomic
                // adds meet in another order (a token repeated in the batch), so within
                // 1e-5 relative, or the recording is wrong.
                let (a, b) = (&m.timing.losses, &gm.timing.losses);
                let bitwise = a.iter().map(|l| l.to_bits()).eq(b.iter().map(|l| l.to_bits()));
                let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5 * x.abs().max(y.abs()));
                same_losses = Some(same);
                same_bitwise = Some(bitwise);
                t.notes.push(format!(
                    "CUDA graph: step {:.2}x the eager step's speed (eager {} / graph {}); losses of the {} timed steps {}",
                    m.timing.step.median / s.median,
                    ms(m.timing.step.median),
                    ms(s.median),
                    gm.timing.losses.len(),
                    match (same, bitwise) {
                        (true, true) => "equal to the eager run's, bit for bit".to_string(),
                        (true, _) => "equal to the eager run's within 1e-5 (not bit for bit)".to_string(),
                        _ => format!("DIFFER from the eager run's: {:?} vs {:?}", gm.timing.losses, m.timing.losses),
                    }
                ));
            }
            #[derive(Serialize)]
            struct Out<'a> {
                optimizer: &'static str,
                layer_forward_s: f64,
                layer_backward_s: f64,
                measured: &'a runner_exec::MeasuredStep,
                #[serde(skip_serializing_if = "Option::is_none")]
                cuda_graph: Option<&'a runner_exec::MeasuredStep>,
                #[serde(skip_serializing_if = "Option::is_none")]
                cuda_graph_losses_equal: Option<bool>,
                #[serde(skip_serializing_if = "Option::is_none")]
                cuda_graph_losses_bitwise: Option<bool>,
            }
            // The CSV: a row per part with its timing's figures in seconds, unrounded (the
            // JSON's `measured.timing.step` and the rest; the table's were "12.34 ms").
            let mut parts = vec![("step", m.timing.step), ("forward", m.timing.forward), ("backward", m.timing.backward), ("optimizer", m.timing.optimizer)];
            if let Some(gm) = &graphed {
                parts.push(("cuda_graph_step", gm.timing.step));
            }
            let mut csv_rows: Vec<runner::report::Record> = parts.iter().map(|(part, s)| runner::report::record([("part", json!(part)), ("median_s", json!(s.median)), ("p10_s", json!(s.p10)), ("p90_s", json!(s.p90)), ("min_s", json!(s.min)), ("max_s", json!(s.max)), ("n", json!(s.n))])).collect();
            csv_rows.push(runner::report::record([("part", json!("layer_forward")), ("median_s", json!(layer_f))]));
            csv_rows.push(runner::report::record([("part", json!("layer_backward")), ("median_s", json!(layer_b))]));
            let mut csv = runner::report::records_of(&csv_rows);
            csv.notes = t.notes.clone();
            csv.notes.push(format!("achieved_tflops {}; peak_bytes {}", m.achieved_tflops, m.memory.peak_bytes));
            emit_csv(global, &t, &Out { optimizer: opts.optimizer.name(), layer_forward_s: layer_f, layer_backward_s: layer_b, measured: &m, cuda_graph: graphed.as_ref(), cuda_graph_losses_equal: same_losses, cuda_graph_losses_bitwise: same_bitwise }, &csv)?;
            if same_losses == Some(false) {
                bail!("the step replayed as a CUDA graph gave other losses than the eager step");
            }
            Ok(())
        }
        BenchCommand::Collectives { minbytes, maxbytes, stepfactor, stepbytes, ngpus, iters, warmup, check, datatype, ops, timeout } => {
            let dtype = match datatype.as_str() {
                "float" | "f32" => Elem::F32,
                "bfloat16" | "bf16" => Elem::BF16,
                "half" | "f16" => Elem::F16,
                other => bail!("-d {other}: use float, bfloat16 or half"),
            };
            let colls: Vec<(String, crate::dist_bench::Coll)> = ops.iter().map(|o| Ok((o.clone(), crate::dist_bench::Coll::parse(o)?))).collect::<Result<_>>()?;
            refuse_repeats("--ops", &colls)?;
            let args = crate::dist_bench::CollArgs {
                // Each size names its flag: "size '1e3'" did not say which of the three.
                minbytes: crate::dist_bench::parse_size(&minbytes).context("-b")?,
                maxbytes: crate::dist_bench::parse_size(&maxbytes).context("-e")?,
                stepfactor,
                stepbytes: stepbytes.as_deref().map(crate::dist_bench::parse_size).transpose().context("-i")?,
                ngpus: ngpus.max(1),
                iters,
                warmup,
                check,
                dtype,
                ops: colls.into_iter().map(|(_, c)| c).collect(),
                timeout: std::time::Duration::from_secs(timeout),
            };
            if args.stepbytes == Some(0) {
                bail!("-i 0: a zero increment never reaches -e; give a positive one (e.g. -i 1M), or drop -i for the -f factor");
            }
            if args.maxbytes < args.minbytes || args.maxbytes > 64 << 30 {
                bail!("-e must be at least -b and at most 64G");
            }
            // Refused here, before any rank starts, by the sweep's own rule.
            args.sizes()?;
            crate::dist_bench::collectives(args, global)
        }
        BenchCommand::Step { layout, steps, micro_batches, schedule, toy, in_process, overlap_grad_reduce, fsdp_prefetch, fsdp_sharded_grads, ddp_bucket_size, optimizer, muon_tp_mode, timeout } => {
            let run = crate::dist_bench::StepRun {
                overlap: overlap_grad_reduce == "on",
                prefetch: fsdp_prefetch == "on",
                sharded_grads: fsdp_sharded_grads == "on",
                bucket: ddp_bucket_size,
                ..crate::dist_bench::StepRun::new(&layout, steps, micro_batches, &schedule, &toy)?
            }
            .with_optimizer(&optimizer, muon_tp_mode.as_deref())?;
            crate::dist_bench::step(run, in_process, std::time::Duration::from_secs(timeout), global)
        }
        other => commands::bench(other, global),
    }
}

#[allow(dead_code, reason = "keeps the trait in scope for the macro's bodies")]
fn _device_in_scope<D: Device>(_: &D) {}

// ---------------------------------------------------------------------------------------
// runner measure
// ---------------------------------------------------------------------------------------

/// The buffer format a GEMM role of `f` runs in on the device.
fn operand_elem(f: GemmFormat) -> Result<Elem> {
    match f {
        GemmFormat::Bf16 => Ok(Elem::BF16),
        GemmFormat::Fp8 => Ok(Elem::F8E4M3),
        other => bail!(
            "the plan runs GEMMs in {other}, which the device GEMM path has no block-scaled kernels for yet; measure with \
             --precision bf16 or fp8"
        ),
    }
}

/// A linear op's (rows per call, N, K, calls): one call for a linear, one per local
/// expert for a grouped linear (each with an even share of the routed rows).
fn gemm_shape(g: &Graph, op: &Op) -> Result<(usize, usize, usize, usize)> {
    let dims = |i: usize| op.inputs.get(i).map(|&t| g.tensors[t].shape.clone()).unwrap_or_default();
    let x: u64 = dims(0).iter().product();
    let (calls, n, k) = match (op.kind, dims(1).as_slice()) {
        (OpKind::Linear, &[n, k]) => (1, n, k),
        (OpKind::GroupedLinear, &[e, n, k]) => (e.max(1), n, k),
        _ => bail!("{}: a {:?} op whose weight is not a matrix (or a stack of them)", op.name, op.kind),
    };
    let rows = x / k.max(1);
    let size = |v: u64| usize::try_from(v).map_err(|_| anyhow!("{}: dimension {v} does not fit this machine", op.name));
    Ok((size(rows.div_ceil(calls).max(1))?, size(n)?, size(k)?, size(calls)?))
}

/// The most GEMM work `runner measure` takes on on the CPU: about five minutes of
/// emulated BF16 at this machine's 60 GFLOP/s.
const CPU_MEASURE_FLOPS: f64 = 2e13;

fn si_flop(v: f64) -> String {
    format!("{:.1} TFLOP", v / 1e12)
}

/// `g` with every floating-point tensor in f32: what the executor stores.
fn as_f32(g: &Graph) -> Graph {
    let mut g = g.clone();
    for t in &mut g.tensors {
        if t.dtype != DType::I32 {
            t.dtype = DType::F32;
        }
    }
    g
}

/// Time every GEMM of `g` at `plan`'s formats and, when `g` has no collectives, its
/// memory-bound ops inside a training step; what was left to the model goes to `notes`.
fn measure_rank<D: Device>(g: &Graph, dev: D, plan: &Plan, repeats: usize, global: &Global, notes: &mut Vec<String>) -> Result<Vec<OpTime>> {
    let mut out = Vec::new();
    let gemms: Vec<&Op> = g.ops.iter().filter(|o| OpClass::of(o.kind) == Some(OpClass::Gemm)).collect();
    if dev.name().starts_with("cpu") {
        // Each of a GEMM's three kernels runs about repeats + 3 times (sizing, warm-up,
        // samples); a full-size model on the CPU would take hours, which is a hang to the
        // user. Refuse up front, with the ways out.
        let flops: f64 = gemms.iter().map(|op| op_cost(g, op, AttentionFlops::CausalHalved).fwd_flops).sum();
        let total = 3.0 * flops * (repeats + 3) as f64;
        if total > CPU_MEASURE_FLOPS {
            bail!(
                "measuring this rank's GEMMs on the CPU would take {} of work (about {:.0} minutes at 60 GFLOP/s; the limit is {}): \
                 measure on a GPU (--device cuda), or a -tiny variant or a shorter --seq-len on the CPU",
                si_flop(total),
                total / 60e9 / 60.0,
                si_flop(CPU_MEASURE_FLOPS)
            );
        }
    }
    // One step per GEMM and one for the training step of the memory-bound ops.
    let steps = commands::Steps::new(global, gemms.len() + 1);
    for op in &gemms {
        steps.step(&format!("GEMM {}", op.name));
        let formats = plan.formats(&op.name);
        let elems = [operand_elem(formats[0])?, operand_elem(formats[1])?, operand_elem(formats[2])?];
        let (m, n, k, calls) = gemm_shape(g, op)?;
        let t = time_linear(&dev, &LinearGemms { m, n, k, formats: elems }, repeats).with_context(|| format!("GEMMs of {}", op.name))?;
        let c = calls as f64;
        let cost = op_cost(g, op, AttentionFlops::CausalHalved);
        out.push(OpTime {
            name: op.name.clone(),
            kind: OpClass::Gemm,
            layer: op.layer,
            shape: [m, n, k].map(|d| d as u64).to_vec(),
            fwd_s: c * (t.kernel_s[0] + t.cast_x_s),
            bwd_s: c * (t.kernel_s[1] + t.kernel_s[2] + t.cast_dy_s),
            gemm: Some(GemmDetail {
                formats,
                flops: cost.fwd_flops,
                calls: calls as u64,
                bytes: cost.bytes,
                kernel_s: t.kernel_s.map(|s| c * s),
            }),
            memory: None,
        });
    }
    if g.ops.iter().any(|o| OpClass::of(o.kind).is_none()) {
        notes.push(
            "memory-bound ops not measured: this rank's graph has collectives (tp, cp or ep > 1), which one process cannot \
             run without its peers; they keep the roofline"
                .into(),
        );
        return Ok(out);
    }
    let on_cpu = dev.name().starts_with("cpu");
    let bytes = runner::measure::executor_bytes(g).unwrap_or(u64::MAX);
    // The CPU's budget; a GPU's free memory (an allocation past it would fail mid-step).
    let limit = if on_cpu { Some((runner::measure::EXECUTOR_BUDGET_BYTES, "budget")) } else { dev.memory_free().map(|f| (f, "free")) };
    if let Some((limit, what)) = limit
        && bytes > limit
    {
        notes.push(format!(
            "memory-bound ops not measured: the training step would allocate {} on {} ({what} {}); they keep the roofline",
            runner::report::si(bytes as f64),
            dev.name(),
            runner::report::si(limit as f64)
        ));
        return Ok(out);
    }
    steps.step("training step: memory-bound ops");
    let opts = MeasureOptions { timing: TimingOptions { warmup: 1, repeats }, ..MeasureOptions::default() };
    let m = measure_training_step_on(g, dev, opts).context("the training step of the memory-bound ops")?;
    let timed: HashMap<&str, &runner_exec::timing::OpTiming> = m.timing.ops.iter().map(|o| (o.name.as_str(), o)).collect();
    let g32 = as_f32(g);
    for (op, op32) in g.ops.iter().zip(&g32.ops) {
        if OpClass::of(op.kind) != Some(OpClass::Memory) {
            continue;
        }
        let Some(t) = timed.get(op.name.as_str()) else { continue };
        let graph_bytes = op_cost(g, op, AttentionFlops::CausalHalved).bytes;
        let run_bytes = op_cost(&g32, op32, AttentionFlops::CausalHalved).bytes;
        if run_bytes <= 0.0 {
            continue;
        }
        // Bandwidth-bound: at the graph's formats the op moves graph_bytes, not run_bytes.
        let scale = graph_bytes / run_bytes;
        out.push(OpTime {
            name: op.name.clone(),
            kind: OpClass::Memory,
            layer: op.layer,
            shape: op.outputs.first().map(|&t| g.tensors[t].shape.clone()).unwrap_or_default(),
            fwd_s: t.forward.median * scale,
            bwd_s: t.backward.median * scale,
            gemm: None,
            memory: Some(MemoryDetail { bytes: graph_bytes, run_bytes, run_fwd_s: t.forward.median, run_bwd_s: t.backward.median }),
        });
    }
    notes.push(
        "memory-bound ops ran in f32 inside a training step; their times are scaled by the bytes they move at the graph's \
         formats over the bytes they moved in f32"
            .into(),
    );
    Ok(out)
}

/// `runner measure`: the per-op times of the rank graph the projection builds for
/// `target` at sharding `[tp, cp, ep, etp, mbs]`, on the `--device` device.
/// `gpu_given`: whether `--gpu` was typed; its default (h100) is named as the default, so
/// a refusal does not quote back a flag the user never gave.
pub fn measure(target: &Target, gpu_given: bool, shard: [u32; 5], repeats: usize, global: &Global) -> Result<()> {
    let [tp, cp, ep, etp, mbs] = shard;
    if shard.contains(&0) {
        bail!("--tp, --cp, --ep, --etp and --mbs must be at least 1");
    }
    if repeats == 0 || repeats > 1000 {
        bail!("--repeats must be in 1..=1000");
    }
    // The rank graph is one micro-batch's: a global batch was taken and ignored.
    if let Some(g) = target.gbs {
        bail!("--gbs {g}: measure times one micro-batch of the rank graph (--mbs); the global batch is project's and search's");
    }
    let mut s = commands::project::setup(target, global)?;
    let target = &s.named(target);
    let key = ShardKey { tp, cp, ep, etp, sp: tp > 1, mbs };
    let gpu = s.projector.gpu.clone();
    let chosen = choose_timed(global.device, "measure")?;
    let device = chosen.name();
    measured::stands_for(&device, &gpu, Profiles::builtin().get(&gpu.name).is_ok()).map_err(|e| {
        let flag = if gpu_given { format!("--gpu {}", target.gpu) } else { format!("the default --gpu {} (no --gpu was given)", target.gpu) };
        anyhow!("{flag}: {e}")
    })?;
    let rank = s
        .projector
        .rank_graph(key)
        .map_err(|e| anyhow!("{} at {}: {e}", target.model, measured::key_text(&key)))?;
    let plan = s.projector.plan.clone();
    let mut notes = vec!["attention cores keep the roofline: the executor's attention kernel computes in f32 (on a GPU, on CUDA cores), not the tensor-core FlashAttention a BF16 run uses".to_string()];
    let ops = on_device!(chosen, |dev| measure_rank(&rank, dev, &plan, repeats, global, &mut notes))?;
    let file = OpsFile {
        format: measured::FORMAT.into(),
        version: measured::VERSION,
        device: device.clone(),
        measured_at: runner_store::now(),
        gpu: gpu.name.clone(),
        model: target.model.clone(),
        seq_len: s.projector.model.seq_len,
        precision: s.recipe.name().into(),
        shard: key,
        repeats,
        notes,
        ops,
    };
    let mut t = Table::new(
        format!(
            "{} at {}, seq {}, {} on {device} (standing for {}), {}",
            file.model,
            measured::key_text(&key),
            file.seq_len,
            file.precision,
            gpu.name,
            file.measured_at
        ),
        &["op", "kind", "shape", "formats", "fwd ms", "bwd ms", "rate"],
    );
    for o in &file.ops {
        let (formats, rate) = match (&o.gemm, &o.memory) {
            (Some(g), _) => (
                g.formats.iter().map(|f| f.name()).collect::<Vec<_>>().join("/"),
                format!("{:.1} GFLOP/s", 3.0 * g.flops / g.kernel_s.iter().sum::<f64>() / 1e9),
            ),
            (_, Some(m)) if m.run_fwd_s > 0.0 => (String::new(), format!("{:.1} GB/s", m.run_bytes / m.run_fwd_s / 1e9)),
            _ => (String::new(), String::new()),
        };
        let shape = o.shape.iter().map(u64::to_string).collect::<Vec<_>>().join("x");
        let shape = match &o.gemm {
            Some(g) if g.calls > 1 => format!("{} x{shape}", g.calls),
            _ => shape,
        };
        t.rows.push(vec![o.name.clone(), format!("{:?}", o.kind).to_lowercase(), shape, formats, format!("{:.4}", o.fwd_s * 1e3), format!("{:.4}", o.bwd_s * 1e3), rate]);
    }
    t.notes = file.notes.clone();
    t.notes.push(format!(
        "{} per op, medians; GEMM rate over its three kernels, memory rate of the f32 forward",
        runner::report::plural(repeats, "timed sample")
    ));
    t.notes.push("use it with: runner project ... --measured FILE.json, or runner calibrate --ops FILE.json -o fitted.toml".into());
    // The CSV: a row per op under the JSON's names (`ops`; seconds, bytes and FLOPs
    // unrounded, lists as JSON), not the table's ms and GFLOP/s.
    let mut csv = runner::report::records(&file.ops);
    csv.notes = t.notes.clone();
    emit_csv(global, &t, &file, &csv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_graph::{NamedOp, Role, Tensor, TensorKind};

    /// A graph of one `kind` op reading `x` and the weight `w`.
    fn one_op(kind: OpKind, x: &[u64], w: &[u64]) -> Graph {
        let t = |name: &str, shape: &[u64], dtype: DType, kind: TensorKind| Tensor { name: name.into(), shape: shape.to_vec(), dtype, kind };
        let mut y = x.to_vec();
        *y.last_mut().unwrap() = w[w.len() - 2];
        let tensors = vec![
            t("x", x, DType::BF16, TensorKind::Input),
            t("w", w, DType::BF16, TensorKind::Weight),
            t("y", &y, DType::BF16, TensorKind::Activation),
            t("ids", &[4], DType::I32, TensorKind::Input),
        ];
        let op = NamedOp {
            name: "proj".into(),
            kind,
            inputs: vec!["x".into(), "w".into()],
            outputs: vec!["y".into()],
            attrs: Default::default(),
            layer: 0,
            role: Role::Replicated,
        };
        Graph::new(tensors, vec![op], "y").unwrap()
    }

    /// Rows per call, N, K and calls: a linear's rows are every leading dimension; a
    /// grouped linear shares its routed rows evenly (rounded up) over its experts; no rows
    /// is one.
    #[test]
    fn gemm_shapes_split_rows_over_experts() {
        let g = one_op(OpKind::Linear, &[4, 6, 8], &[16, 8]);
        assert_eq!(gemm_shape(&g, &g.ops[0]).unwrap(), (24, 16, 8, 1));
        let g = one_op(OpKind::Linear, &[0, 8], &[16, 8]);
        assert_eq!(gemm_shape(&g, &g.ops[0]).unwrap(), (1, 16, 8, 1));
        let g = one_op(OpKind::GroupedLinear, &[10, 8], &[3, 16, 8]);
        assert_eq!(gemm_shape(&g, &g.ops[0]).unwrap(), (4, 16, 8, 3));
        let g = one_op(OpKind::Linear, &[10, 8], &[3, 16, 8]);
        assert!(gemm_shape(&g, &g.ops[0]).unwrap_err().to_string().contains("proj: a Linear op whose weight is not a matrix"));
    }

    #[test]
    fn formats_read_as_written_and_integers_stay_integers() {
        for (s, e) in [("f32", Elem::F32), ("fp32", Elem::F32), ("bf16", Elem::BF16), ("f16", Elem::F16), ("fp16", Elem::F16), ("fp8", Elem::F8E4M3), ("e4m3", Elem::F8E4M3), ("fp8-e4m3", Elem::F8E4M3)] {
            assert_eq!(elem_of(s).unwrap(), e, "{s}");
        }
        assert!(elem_of("int8").is_err());
        assert_eq!((operand_elem(GemmFormat::Bf16).unwrap(), operand_elem(GemmFormat::Fp8).unwrap()), (Elem::BF16, Elem::F8E4M3));
        assert!(operand_elem(GemmFormat::Mxfp8).is_err());
        let g = as_f32(&one_op(OpKind::Linear, &[2, 8], &[16, 8]));
        let dtypes: Vec<DType> = g.tensors.iter().map(|t| t.dtype).collect();
        assert_eq!(dtypes, [DType::F32, DType::F32, DType::F32, DType::I32]);
    }

    /// A GEMM too big for the CPU is refused before anything runs, with its work: a
    /// 65536 x 4096 x 4096 linear is 2 * 2^40 = 2.2 TFLOP forward; its three kernels run
    /// 1 + 3 times: 12 * 2^41 = 26.4 TFLOP, 7 minutes at 60 GFLOP/s, past the 20 TFLOP limit.
    #[test]
    fn a_gemm_too_big_for_the_cpu_is_refused_up_front() {
        let g = one_op(OpKind::Linear, &[65536, 4096], &[4096, 4096]);
        let plan = Plan::builtin(runner_project::precision::Recipe::Bf16, &g);
        let global = <crate::Cli as clap::Parser>::parse_from(["runner", "-q", "--device", "cpu"]).global;
        let mut notes = Vec::new();
        let e = measure_rank(&g, runner_exec::cpu::Cpu::new(), &plan, 1, &global, &mut notes).unwrap_err().to_string();
        assert!(
            e.starts_with("measuring this rank's GEMMs on the CPU would take 26.4 TFLOP of work (about 7 minutes at 60 GFLOP/s; the limit is 20.0 TFLOP)"),
            "{e}"
        );
    }
}
