//! The CUDA backend with its kernels emulated on the CPU (`Cuda::emulated`) against the
//! CPU backend: every row of the kernel check (`runner bench kernels`, the GPU check's
//! correctness half) and training steps through the executor. The backend's own launch
//! sequences, scratch and FP8 scale handling run here as they would on a GPU.
//!
//! Each test runs in a child process of this binary started with the address sanitizer's
//! run time preloaded: the emulated kernels are then built under the address and
//! undefined-behaviour sanitizers, and every buffer the backend allocates has guarded
//! edges, so a launch whose grid, arguments or scratch size lets a kernel read or write
//! past a buffer fails with the sanitizer's report (on a GPU: an illegal address, or
//! silently wrong values). A kernel that faults fails its test, not the binary.
//!
//! Needs a C++20 compiler (`c++`, or `CXX`) with its sanitizer run time; without them the
//! tests say so and pass (without a sanitizer: run in this process), unless
//! `RUNNER_REQUIRE_CXX` is set (CI sets it).
#![cfg(feature = "cuda")]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use runner_exec::cuda::Cuda;
use runner_exec::devcheck;

/// Set in the child process a test starts: run the test's body here.
const CHILD: &str = "RUNNER_EMULATED_CUDA_SANITIZED_CHILD";

/// The compiler's address sanitizer run time (`libasan.so`), when it has one.
fn asan_runtime() -> Option<PathBuf> {
    let cxx = runner_kernels::cuda::emulation::compiler()?;
    let out = Command::new(cxx).arg("-print-file-name=libasan.so").output().ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (path.is_absolute() && path.exists()).then_some(path)
}

/// Run this binary's test `name` again in a child process under the sanitizers (see the
/// module doc) and fail with its report if it fails. `false` when the caller should run
/// the test's body itself: this process is that child, or there is no sanitizer run time
/// (said so; a failure when `RUNNER_REQUIRE_CXX` is set).
fn ran_under_sanitizer(name: &str) -> bool {
    if std::env::var_os(CHILD).is_some() {
        // The child must really be sanitized, or this test checks less than it says.
        assert!(runner_exec::cuda::under_address_sanitizer(), "{CHILD} is set but the address sanitizer's run time is not loaded");
        return false;
    }
    let Some(asan) = asan_runtime() else {
        assert!(std::env::var_os("RUNNER_REQUIRE_CXX").is_none(), "RUNNER_REQUIRE_CXX is set but the C++ compiler has no libasan.so");
        eprintln!("no address sanitizer run time: running {name} unsanitized");
        return false;
    };
    let log_path = std::env::temp_dir().join(format!("runner-emulated-cuda-{name}-{}.log", std::process::id()));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env("LD_PRELOAD", &asan)
        .env("ASAN_OPTIONS", "detect_leaks=0:print_legend=0")
        .env(CHILD, "1")
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    // Generous: CI's two cores, and the sanitizers' cost (about 1.7x here).
    let deadline = Instant::now() + Duration::from_secs(2400);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // The child keeps its sanitized library for the reports' sake; it is not needed now.
    let prefix = format!("runner-emulated-cuda-{}-", child.id());
    for entry in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let out = std::fs::read_to_string(&log_path).unwrap_or_default();
    let _ = std::fs::remove_file(&log_path);
    // The sanitizer's or the emulation's report (its first lines name the kernel), else
    // the output's end.
    let lines: Vec<&str> = out.lines().collect();
    let report = match lines.iter().position(|l| l.contains("ERROR: AddressSanitizer") || l.contains("runtime error:") || l.starts_with("emulated kernel ")) {
        Some(at) => lines[at..].iter().take(40).copied().collect::<Vec<_>>(),
        None => lines[lines.len().saturating_sub(60)..].to_vec(),
    };
    let Some(status) = status else { panic!("{name} under the sanitizers did not finish in 2400 s:\n{}", report.join("\n")) };
    assert!(
        status.success() && out.contains("test result: ok. 1 passed"),
        "{name} under the address and undefined-behaviour sanitizers ({status}):\n{}",
        report.join("\n")
    );
    true
}

/// `Some(device)`, or `None` after saying why the test is skipped (no C++ compiler,
/// and `RUNNER_REQUIRE_CXX` unset).
fn emulated() -> Option<Cuda> {
    match Cuda::emulated() {
        Ok(d) => Some(d),
        Err(e) => {
            assert!(std::env::var_os("RUNNER_REQUIRE_CXX").is_none(), "RUNNER_REQUIRE_CXX is set but the emulated device failed: {e}");
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// Rows that failed, one line each.
fn failures(rows: &[devcheck::CheckRow]) -> Vec<String> {
    rows.iter().filter(|r| !r.ok).map(|r| format!("{}: error {:.3e} (tolerance {:.0e})", r.kernel, r.error, r.tolerance)).collect()
}

/// Every row of `runner bench kernels` on the CUDA backend, its kernels emulated,
/// against the CPU backend: the GPU check's correctness half, run without a GPU.
#[test]
fn every_kernel_check_passes_on_the_emulated_cuda_backend() {
    if ran_under_sanitizer("every_kernel_check_passes_on_the_emulated_cuda_backend") {
        return;
    }
    let Some(dev) = emulated() else { return };
    let rows = devcheck::compare_kernels(&dev);
    let failed = failures(&rows);
    assert!(rows.len() > 300, "{} rows", rows.len());
    assert!(failed.is_empty(), "{} of {} rows failed:\n{}", failed.len(), rows.len(), failed.join("\n"));
}

/// Training steps of the toy Llama, MoE and Mamba models through the executor on the
/// emulated CUDA backend, and of the toy Llama at tp=2 (vocab-parallel, SP) over two
/// ranks: losses and gradients as the CPU backend's; three FP8 steps of the toy Llama
/// and MoE on the native route (the MoE's expert GEMMs on codes with a scale per expert);
/// and three Muon steps of the toy Llama.
#[test]
fn training_steps_match_the_cpu_on_the_emulated_cuda_backend() {
    if ran_under_sanitizer("training_steps_match_the_cpu_on_the_emulated_cuda_backend") {
        return;
    }
    let Some(dev) = emulated() else { return };
    let rows = devcheck::compare_steps(dev);
    let failed = failures(&rows);
    assert_eq!(rows.len(), 16, "{rows:?}");
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Muon on the emulated CUDA backend, where it runs on the backend's own GEMM, scale,
/// add and copy kernels (no kernel of its own, its norm read back): three steps of the
/// toy Llama give the CPU's losses and weights to rounding, 1e-4 where a step moves a
/// hidden matrix's entries by about 1e-3.
#[test]
fn muon_steps_match_the_cpu_on_the_emulated_cuda_backend() {
    use runner_exec::cpu::Cpu;
    use runner_exec::executor::{ADAMW_DEFAULT, MUON_DEFAULT, Optimizer};
    use runner_exec::toy::{self, ToyConfig};
    use runner_exec::{AdamW, Device, ExecOptions, Executor, Input};
    if ran_under_sanitizer("muon_steps_match_the_cpu_on_the_emulated_cuda_backend") {
        return;
    }
    let Some(dev) = emulated() else { return };
    fn muon<D: Device>(g: &runner_graph::Graph, dev: D) -> Executor<D> {
        let mut ex = Executor::new(g, dev, ExecOptions::default()).unwrap();
        ex.set_optimizer(Optimizer::Muon(MUON_DEFAULT)).unwrap();
        ex
    }
    let g = toy::llama(&ToyConfig::tiny());
    let (mut gpu, mut cpu) = (muon(&g, dev), muon(&g, Cpu::new()));
    let h = AdamW { lr: 1e-2, ..ADAMW_DEFAULT };
    let w0 = cpu.weight("layers.0.attn.q.weight").unwrap();
    for s in 0..3u32 {
        let (tokens, targets) = toy::repeating_batch(&g, s);
        let inputs = [("tokens", Input::U32(&tokens)), ("targets", Input::U32(&targets))];
        let (a, b) = (gpu.step(&inputs, &h).unwrap(), cpu.step(&inputs, &h).unwrap());
        assert!((a - b).abs() <= 1e-5 * b.abs(), "step {s}: loss {a} on the emulated CUDA backend, {b} on the CPU");
    }
    let moved = cpu.weight("layers.0.attn.q.weight").unwrap().iter().zip(&w0).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(moved > 1e-3, "Muon moved the matrix by {moved}");
    for w in cpu.trainable() {
        let d = gpu.weight(&w).unwrap().iter().zip(&cpu.weight(&w).unwrap()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(d < 1e-4, "{w}: {d} from the CPU's");
    }
}

/// The CUDA backend refuses to round a buffer that is not whole MXFP8 rows, as the CPU
/// backend does (both take the rows from `precision::mx_rows`), and leaves it as it was;
/// its launch used to cover the whole rows and silently skip the tail.
#[test]
fn mxfp8_rounding_of_a_ragged_buffer_is_refused_on_the_emulated_cuda_backend() {
    use runner_exec::device::{Device, Elem};
    if ran_under_sanitizer("mxfp8_rounding_of_a_ragged_buffer_is_refused_on_the_emulated_cuda_backend") {
        return;
    }
    let Some(dev) = emulated() else { return };
    let mut b = dev.alloc(Elem::F32, 6).unwrap();
    dev.write_f32(&mut b, &[1.1; 6]).unwrap();
    let e = dev.round_to_storage(&mut b, runner_graph::DType::MxFp8, 4).unwrap_err().to_string();
    assert!(e.contains("6 elements are not whole rows of 4"), "{e}");
    assert_eq!(dev.read_f32(&b).unwrap(), [1.1; 6]);
    dev.round_to_storage(&mut b, runner_graph::DType::MxFp8, 3).unwrap();
    assert_eq!(dev.read_f32(&b).unwrap(), [1.125; 6]);
}

/// Concat buffers that disagree with their shapes are refused by the CUDA backend with
/// the CPU's rule (`ConcatShapes::dims`): its launch trusted the shapes, so a short
/// buffer was read or written out of bounds on a GPU (only the ranks were checked).
#[test]
fn concat_buffers_that_disagree_with_their_shapes_are_refused_on_the_emulated_cuda_backend() {
    use runner_exec::device::{ConcatShapes, Device, Elem};
    if ran_under_sanitizer("concat_buffers_that_disagree_with_their_shapes_are_refused_on_the_emulated_cuda_backend") {
        return;
    }
    let Some(dev) = emulated() else { return };
    let buf = |n: usize| {
        let mut b = dev.alloc(Elem::F32, n).unwrap();
        dev.write_f32(&mut b, &vec![1.0; n]).unwrap();
        b
    };
    let s = ConcatShapes { out: &[2, 4], a: &[2, 2], b: &[1, 2] };
    let e = dev.concat_forward(&mut buf(8), &buf(4), &buf(4), s).unwrap_err().to_string();
    assert!(e.contains("concat_forward: shapes [2, 2] + [1, 2] -> [2, 4]"), "{e}");
    assert!(dev.concat_forward(&mut buf(6), &buf(4), &buf(2), s).is_err(), "out of 6 for a [2, 4]");
    let s3 = ConcatShapes { out: &[2, 5], a: &[2, 2], b: &[1, 2] };
    assert!(dev.concat_forward(&mut buf(10), &buf(4), &buf(2), s3).is_err(), "last axes 2 + 2 for 5");
    assert!(dev.concat_backward(Some(&mut buf(4)), None, &buf(6), s).is_err(), "dout of 6 for a [2, 4]");
    assert!(dev.concat_backward(None, Some(&mut buf(4)), &buf(8), s).is_err(), "db of 4 for a [1, 2]");
    let mut out = buf(8);
    dev.concat_forward(&mut out, &buf(4), &buf(2), s).unwrap();
    assert_eq!(dev.read_f32(&out).unwrap(), [1.0; 8]);
    dev.concat_backward(Some(&mut buf(4)), Some(&mut buf(2)), &buf(8), s).unwrap();
}

/// Sizes past what the CUDA kernels and grids take are refused by name before anything
/// is allocated or launched, on buffers of a few elements: a block of i32::MAX rows is
/// taken (as the block of the tensor's 4 rows it amounts to) and one more row refused
/// (its `as i32` was i32::MIN: the block amaxes were never written and the values came
/// back scaled by NaN); products that overflow usize (an unchecked product wrapped to
/// the small buffers' lengths, or panicked) and a class offset past i64 are refused; an
/// allocation whose byte count overflows is refused instead of wrapping (to a 1-byte
/// allocation that claimed 2^62 elements).
#[test]
fn sizes_past_the_cuda_kernels_limits_are_refused_before_anything_is_allocated_on_the_emulated_cuda_backend() {
    use runner_exec::device::{Device, Elem};
    use runner_kernels::cpu::attention::Attn;
    use runner_kernels::cpu::quant::{BlockSpec, Format, QuantSpec, ScaleFormat, ScaleRounding};
    if ran_under_sanitizer("sizes_past_the_cuda_kernels_limits_are_refused_before_anything_is_allocated_on_the_emulated_cuda_backend") {
        return;
    }
    let Some(dev) = emulated() else { return };
    let buf = |data: &[f32]| {
        let mut b = dev.alloc(Elem::F32, data.len()).unwrap();
        dev.write_f32(&mut b, data).unwrap();
        b
    };
    let x0: Vec<f32> = (0..16).map(|i| 0.37 * i as f32 - 2.9).collect();
    let spec = |rows: usize| {
        QuantSpec::Blocks(BlockSpec { format: Format::E4M3, block: (rows, 4), scale_format: ScaleFormat::Fp32, scale_rounding: ScaleRounding::Exact, tensor_scale: false, saturate: true, stochastic: None })
    };
    let (mut a, mut b) = (buf(&x0), buf(&x0));
    let ra = dev.quantize(&mut a, 4, 4, &spec(i32::MAX as usize)).unwrap();
    let rb = dev.quantize(&mut b, 4, 4, &spec(4)).unwrap();
    let qa = dev.read_f32(&a).unwrap();
    assert_eq!(qa, dev.read_f32(&b).unwrap());
    assert!(qa.iter().all(|v| v.is_finite()) && qa != x0, "{qa:?}");
    assert_eq!(dev.read_quant(vec![ra]).unwrap(), dev.read_quant(vec![rb]).unwrap());

    let mut x = buf(&x0);
    let (s4, mut d4, mut one) = (buf(&[1.0; 4]), buf(&[0.0; 4]), buf(&[0.0]));
    let (s8, mut d8) = (buf(&[1.0; 8]), buf(&[0.0; 8]));
    let mut targets = dev.alloc(Elem::I32, 1).unwrap();
    dev.write_u32(&mut targets, &[2]).unwrap();
    let before = dev.memory();

    let e = dev.quantize(&mut x, 4, 4, &spec(i32::MAX as usize + 1)).map(|_| ()).unwrap_err().to_string();
    assert_eq!(e, "operation 'quantize': shape mismatch: the block's rows 2147483648 is past the CUDA kernels' limit of 2147483647 (an int)");
    assert_eq!(dev.read_f32(&x).unwrap(), x0, "refused, so untouched");

    // (2^62 + 1)·4 wraps to 4, the buffers' length.
    let e = dev.transpose_outer(&mut d4, &s4, (1 << 62) + 1, 4, 1).unwrap_err().to_string();
    assert!(e.contains("operation 'transpose_outer': shape mismatch: the shape [4611686018427387905, 4, 1] holds more elements"), "{e}");
    // Every size of this attention wraps to its buffer's (q and out 8, k, v and lse 4):
    // unchecked, the kernel ran over a sequence of 2^62 + 1 rows.
    let huge = Attn { b: 1, t: (1 << 62) + 1, h: 4, hkv: 2, d: 2, dv: 2, causal: false, window: None, scale: 0.5, cp: None };
    let e = dev.attention_forward(&mut d8, &mut d4, &s8, &s4, &s4, huge).unwrap_err().to_string();
    assert!(e.contains("operation 'attention_forward': shape mismatch: the shape [1, 4611686018427387905, 4, 2] holds more elements"), "{e}");

    // A class offset past i64 reached the kernel as a negative one.
    let e = dev.target_logit(&mut one, &s4, &targets, i64::MAX as usize + 1, 4).unwrap_err().to_string();
    assert!(e.contains("operation 'target_logit': shape mismatch: the shard's first class 9223372036854775808 is past the CUDA kernels' limit of 9223372036854775807 (an i64)"), "{e}");
    dev.target_logit(&mut one, &s4, &targets, 1, 4).unwrap();

    // 2^62 f32 are 2^64 bytes: unchecked, a 1-byte allocation claiming 2^62 elements.
    let e = dev.alloc(Elem::F32, 1 << 62).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("allocating 4611686018427387904 f32 elements: more bytes than an allocation holds"), "{e}");
    assert!(dev.alloc(Elem::F32, (isize::MAX as usize) / 4 + 1).is_err(), "past isize::MAX bytes");
    let after = dev.memory();
    assert_eq!((after.allocations, after.current_bytes), (before.allocations, before.current_bytes), "nothing allocated by the refused calls");
}
