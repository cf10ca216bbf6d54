//! Machine micro-benchmarks: GEMM throughput of the kernels' matmul, the CPU's f32 peak
//! (computed from its features and measured with a register-only FMA loop), and STREAM
//! style memory bandwidth. Plain functions returning serialisable rows; the CLI's
//! `runner bench gemm|memory` prints them.
//!
//! Everything runs on rayon's current pool, so `RAYON_NUM_THREADS` sets the threads, as
//! for the executor.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;
use runner_kernels::cpu::matmul::{Gemm, matmul};
use serde::Serialize;

use crate::timing::Stat;

/// One GEMM size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GemmRow {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub threads: usize,
    /// Seconds per GEMM.
    pub time: Stat,
    /// 2·M·N·K / median time.
    pub gflops: f64,
    /// 2·M·N·K / best time.
    pub best_gflops: f64,
    /// The FMA-loop peak measured in this size's window (fastest of the runs paired
    /// with its samples); `None` without AVX2/AVX-512.
    pub window_peak_gflops: Option<f64>,
    /// Median over the samples of GEMM GFLOP/s / the FMA-loop GFLOP/s measured right
    /// before it: on a shared machine whose speed drifts by ±20 % over seconds, each
    /// sample is compared with the peak of the same moment.
    pub paired_fraction_of_peak: Option<f64>,
}

/// Seconds per call of `f`: each sample repeats it until ~`min_s` elapsed, so tiny sizes
/// are not timer noise. Returns the per-call samples.
fn sample(samples: usize, min_s: f64, mut f: impl FnMut()) -> Vec<f64> {
    f(); // warm-up: page faults, faer's packing buffers, thread spin-up
    (0..samples).map(|_| per_call(min_s, &mut f)).collect()
}

/// Seconds per call of `f`, repeated until ~`min_s` elapsed.
fn per_call(min_s: f64, f: &mut impl FnMut()) -> f64 {
    let (t0, mut calls) = (Instant::now(), 0u32);
    loop {
        f();
        calls += 1;
        let e = t0.elapsed().as_secs_f64();
        if e >= min_s {
            return e / f64::from(calls);
        }
    }
}

/// Samples per GEMM size.
const GEMM_SAMPLES: usize = 9;
/// FMA-loop iterations of the peak run paired with each GEMM sample (~10-15 ms).
const PAIRED_FMA_ITERS: u64 = 4_000_000;

/// Square f32 GEMMs C = A·B of each size through `runner_kernels`' matmul (faer);
/// [`GEMM_SAMPLES`] samples of at least 50 ms each, each right after a short FMA-loop
/// run, so every sample has a peak from the same moment to be compared with.
pub fn gemm_bench(sizes: &[usize]) -> Vec<GemmRow> {
    sizes
        .iter()
        .map(|&s| {
            let a: Vec<f32> = (0..s * s).map(|i| ((i % 13) as f32 - 6.0) * 0.01).collect();
            let b: Vec<f32> = (0..s * s).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect();
            let mut c = vec![0f32; s * s];
            let g = Gemm {
                m: s,
                n: s,
                k: s,
                trans_a: false,
                trans_b: false,
            };
            let flops = 2.0 * (s as f64).powi(3);
            let mut t = Vec::with_capacity(GEMM_SAMPLES);
            let mut peaks = Vec::with_capacity(GEMM_SAMPLES);
            let mut fractions = Vec::with_capacity(GEMM_SAMPLES);
            let mut gemm_call = || {
                // Sizes come from our own vectors, so the length check cannot fail.
                let _ = matmul(&mut c, &a, &b, g, false);
                black_box(&mut c);
            };
            gemm_call(); // warm-up: page faults, faer's packing buffers, thread spin-up
            for _ in 0..GEMM_SAMPLES {
                let peak = fma_loop_gflops(PAIRED_FMA_ITERS);
                let gemm = per_call(0.05, &mut gemm_call);
                t.push(gemm);
                if let Some(p) = peak {
                    peaks.push(p);
                    fractions.push(flops / gemm / 1e9 / p);
                }
            }
            let time = Stat::of(&t);
            GemmRow {
                m: s,
                n: s,
                k: s,
                threads: rayon::current_num_threads(),
                time,
                gflops: flops / time.median / 1e9,
                best_gflops: flops / time.min / 1e9,
                window_peak_gflops: peaks.iter().copied().reduce(f64::max),
                paired_fraction_of_peak: (!fractions.is_empty())
                    .then(|| Stat::of(&fractions).median),
            }
        })
        .collect()
}

/// The CPU's f32 peak, computed and measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeakEstimate {
    pub model: String,
    /// Widest FMA vector: "avx512", "avx2+fma", or "scalar".
    pub isa: String,
    /// f32 lanes per vector.
    pub lanes: u32,
    /// FMA pipes per core assumed.
    pub fma_units: u32,
    /// Logical CPUs counted.
    pub cpus: u32,
    pub ghz: f64,
    /// Where the clock came from.
    pub clock_source: String,
    /// lanes × 2 (an FMA is 2 flops) × fma_units × cpus × GHz.
    pub theoretical_gflops: f64,
    /// Register-only FMA loop on every rayon thread (x86-64 AVX-512 or AVX2 intrinsics);
    /// `None` where neither is available.
    pub measured_fma_gflops: Option<f64>,
    /// How `measured_fma_gflops` was obtained.
    pub measured_method: String,
}

/// Parse `/proc/cpuinfo` (first processor's fields, processor count) and the cpufreq
/// maximum into a theoretical peak, then measure the FMA loop.
pub fn peak_gflops() -> PeakEstimate {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let flags: Vec<String> = field("flags")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let has = |f: &str| flags.iter().any(|x| x == f);
    let (isa, lanes) = if has("avx512f") {
        ("avx512", 16)
    } else if has("avx2") && has("fma") {
        ("avx2+fma", 8)
    } else {
        ("scalar", 1)
    };
    // Two FMA pipes: every AVX2 core since Haswell has two 256-bit FMA ports, and the
    // AVX-512 server cores (Xeon Scalable Gold/Platinum, Sapphire Rapids) have two
    // 512-bit ones (port 0+1 fused and port 5). Some Silver/Bronze parts have one, which
    // would halve the figure; the measured loop below tells the two apart.
    let fma_units = if isa == "scalar" { 1 } else { 2 };
    let cpus = info
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count()
        .max(1) as u32;
    let max_khz = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok());
    let (ghz, clock_source) = match (
        max_khz,
        field("cpu MHz").and_then(|s| s.parse::<f64>().ok()),
    ) {
        (Some(k), _) => (k / 1e6, "cpufreq cpuinfo_max_freq".to_string()),
        (None, Some(mhz)) => (
            mhz / 1e3,
            "/proc/cpuinfo cpu MHz (current clock; no cpufreq)".to_string(),
        ),
        (None, None) => (0.0, "unknown".to_string()),
    };
    let theoretical = f64::from(lanes) * 2.0 * f64::from(fma_units) * f64::from(cpus) * ghz;
    let measured = measured_fma_gflops();
    PeakEstimate {
        model: field("model name").unwrap_or_else(|| "unknown".into()),
        isa: isa.into(),
        lanes,
        fma_units,
        cpus,
        ghz,
        clock_source,
        theoretical_gflops: theoretical,
        measured_method: match measured {
            Some(_) => format!(
                "register-only FMA loop, {} rayon threads, fastest of 5 runs",
                rayon::current_num_threads()
            ),
            None => "no AVX2/AVX-512 on this CPU; use the best GEMM row".into(),
        },
        measured_fma_gflops: measured,
    }
}

/// Independent FMA chains per loop: FMA latency (4 cycles) × 2 pipes = 8 in flight keep
/// both pipes busy; 12 leave slack and still fit the 16 (AVX2) / 32 (AVX-512) registers.
const CHAINS: usize = 12;
const FMA_ITERS: u64 = 20_000_000;

#[cfg(target_arch = "x86_64")]
mod fma {
    use std::arch::x86_64::*;

    use super::CHAINS;

    /// `iters` × CHAINS fused multiply-adds of 16 lanes, all in registers.
    #[target_feature(enable = "avx512f")]
    pub fn avx512(iters: u64) -> f32 {
        let a = _mm512_set1_ps(0.999_999);
        let b = _mm512_set1_ps(1e-7);
        let mut acc = [_mm512_set1_ps(1.0); CHAINS];
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, a, b);
            }
        }
        acc.iter().map(|&x| _mm512_reduce_add_ps(x)).sum()
    }

    /// As [`avx512`] with 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    pub fn avx2(iters: u64) -> f32 {
        let a = _mm256_set1_ps(0.999_999);
        let b = _mm256_set1_ps(1e-7);
        let mut acc = [_mm256_set1_ps(1.0); CHAINS];
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, a, b);
            }
        }
        let mut s = 0.0;
        for x in acc {
            let mut lanes = [0f32; 8];
            // SAFETY: `lanes` is 8 f32 = 32 bytes, the store's width; unaligned store.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), x) };
            s += lanes.iter().sum::<f32>();
        }
        s
    }
}

/// Runs of the FMA loop; the fastest counts.
const PEAK_RUNS: usize = 5;

/// GFLOP/s of the register-only FMA loop on every rayon thread at once (best of
/// [`PEAK_RUNS`]: a peak is the best the machine shows, and on a shared VM single runs
/// vary by ±20 % with CPU steal).
fn measured_fma_gflops() -> Option<f64> {
    (0..PEAK_RUNS)
        .map(|_| fma_loop_gflops(FMA_ITERS))
        .try_fold(0f64, |best, r| r.map(|g| best.max(g)))
}

/// GFLOP/s of one run of the register-only FMA loop, `iters` iterations on every rayon
/// thread at once; `None` without AVX2/AVX-512.
fn fma_loop_gflops(iters: u64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        let (run, lanes): (fn(u64) -> f32, f64) = if is_x86_feature_detected!("avx512f") {
            // SAFETY: avx512f was detected at run time just above.
            (|n| unsafe { fma::avx512(n) }, 16.0)
        } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: avx2 and fma were detected at run time just above.
            (|n| unsafe { fma::avx2(n) }, 8.0)
        } else {
            return None;
        };
        let threads = rayon::current_num_threads();
        let flops = iters as f64 * CHAINS as f64 * lanes * 2.0 * threads as f64;
        let t0 = Instant::now();
        let s: f32 = (0..threads).into_par_iter().map(|_| run(iters)).sum();
        black_box(s);
        Some(flops / t0.elapsed().as_secs_f64() / 1e9)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = iters;
        None
    }
}

/// One bandwidth kernel.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemRow {
    /// "copy" (b = a), "triad" (a = b + s·c), or "device copy" (a device-to-device copy).
    pub kernel: String,
    /// Bytes moved per pass, STREAM convention (reads + writes, no write-allocate).
    pub bytes: u64,
    pub threads: usize,
    pub time: Stat,
    pub gbps: f64,
    pub best_gbps: f64,
}

/// Copy and triad bandwidth over three f32 arrays of 2^26 elements (256 MiB each, well
/// beyond any last-level cache), on all rayon threads.
pub fn memory_bench() -> Vec<MemRow> {
    memory_bench_with(1 << 26, 7)
}

/// [`memory_bench`] with `elems` per array and `samples` timed passes per kernel.
pub fn memory_bench_with(elems: usize, samples: usize) -> Vec<MemRow> {
    let threads = rayon::current_num_threads();
    let chunk = elems.div_ceil(threads).max(1);
    // First touch on the threads that will stream the data, so pages sit near them.
    let par_vec = |v: f32| {
        let mut x: Vec<f32> = Vec::with_capacity(elems);
        x.resize(elems, 0.0);
        x.par_chunks_mut(chunk).for_each(|c| c.fill(v));
        x
    };
    let (mut a, mut b, c) = (par_vec(1.0), par_vec(2.0), par_vec(0.5));
    let row = |kernel: &str, bytes: u64, t: Vec<f64>| {
        let time = Stat::of(&t);
        MemRow {
            kernel: kernel.into(),
            bytes,
            threads,
            time,
            gbps: bytes as f64 / time.median / 1e9,
            best_gbps: bytes as f64 / time.min / 1e9,
        }
    };
    let bytes = (elems * 4) as u64;
    let copy = sample(samples, 0.0, || {
        b.par_chunks_mut(chunk)
            .zip(a.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        black_box(&mut b);
    });
    let triad = sample(samples, 0.0, || {
        a.par_chunks_mut(chunk)
            .zip(b.par_chunks(chunk))
            .zip(c.par_chunks(chunk))
            .for_each(|((x, y), z)| {
                for i in 0..x.len() {
                    x[i] = y[i] + 0.5 * z[i];
                }
            });
        black_box(&mut a);
    });
    vec![row("copy", 2 * bytes, copy), row("triad", 3 * bytes, triad)]
}

/// One quantisation recipe's throughput.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QuantRow {
    /// What runs: recipe, block shape, scale format.
    pub recipe: String,
    pub elements: usize,
    pub threads: usize,
    pub time: Stat,
    /// f32 input bytes read per second (4 bytes per element), median.
    pub gbps: f64,
    pub best_gbps: f64,
}

/// Scaled quantisation of an f32 operand of `rows x cols` in every recipe the executor
/// runs (quantise-dequantise in place with the statistics, as a GEMM site does; and the
/// FP8 storage cast to codes), on ONE thread (GB/s per core), `samples` passes each.
pub fn quant_bench(rows: usize, cols: usize, samples: usize) -> Vec<QuantRow> {
    use runner_kernels::cpu::precision::{Fp8Format, fp8_quantize};
    use runner_kernels::cpu::quant::{BlockSpec, Format, ScaleFormat, ScaleRounding, amax, qdq_blocks, qdq_tensor, tensor_scale};
    let n = rows * cols;
    let src: Vec<f32> = {
        let mut v = vec![0f32; n];
        crate::executor::SplitMix(7).normals(&mut v, 1.0);
        v
    };
    let block = |format, block, scale_format, scale_rounding, tensor_scale, stochastic| BlockSpec {
        format,
        block,
        scale_format,
        scale_rounding,
        tensor_scale,
        saturate: true,
        stochastic,
    };
    type Job<'a> = Box<dyn Fn(&mut [f32]) + Sync + 'a>;
    let jobs: Vec<(&str, Job<'_>)> = vec![
        ("fp8 e4m3 per tensor, delayed (scale given)", Box::new(|x: &mut [f32]| {
            black_box(qdq_tensor(x, Format::E4M3, 100.0, true, None).ok());
        })),
        ("fp8 e5m2 per tensor, current (amax + cast)", Box::new(|x: &mut [f32]| {
            let s = tensor_scale(amax(x), Format::E5M2, 0);
            black_box(qdq_tensor(x, Format::E5M2, s, true, None).ok());
        })),
        ("mxfp8 1x32 e8m0 (RCEIL)", Box::new(|x: &mut [f32]| {
            black_box(qdq_blocks(x, rows, cols, &block(Format::E4M3, (1, 32), ScaleFormat::E8M0, ScaleRounding::Pow2Up, false, None)).ok());
        })),
        ("fp8 1x128 blocks, fp32 power-of-two scales", Box::new(|x: &mut [f32]| {
            black_box(qdq_blocks(x, rows, cols, &block(Format::E4M3, (1, 128), ScaleFormat::Fp32, ScaleRounding::Pow2Up, false, None)).ok());
        })),
        ("fp8 128x128 blocks, fp32 power-of-two scales", Box::new(|x: &mut [f32]| {
            black_box(qdq_blocks(x, rows, cols, &block(Format::E4M3, (128, 128), ScaleFormat::Fp32, ScaleRounding::Pow2Up, false, None)).ok());
        })),
        ("nvfp4 1x16 e4m3 + fp32 tensor scale", Box::new(|x: &mut [f32]| {
            black_box(qdq_blocks(x, rows, cols, &block(Format::E2M1, (1, 16), ScaleFormat::E4M3, ScaleRounding::Exact, true, None)).ok());
        })),
        ("nvfp4 16x16 e4m3 + fp32 tensor scale", Box::new(|x: &mut [f32]| {
            black_box(qdq_blocks(x, rows, cols, &block(Format::E2M1, (16, 16), ScaleFormat::E4M3, ScaleRounding::Exact, true, None)).ok());
        })),
        ("nvfp4 1x16, stochastic rounding", Box::new(|x: &mut [f32]| {
            black_box(qdq_blocks(x, rows, cols, &block(Format::E2M1, (1, 16), ScaleFormat::E4M3, ScaleRounding::Exact, true, Some(3))).ok());
        })),
    ];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build();
    let run = || {
        let mut out = Vec::new();
        let mut x = src.clone();
        for (name, job) in &jobs {
            // Each sample starts from the original operand (refilled untimed): the
            // passes are branch-free, so a value already on the grid would cost the
            // same, but the statistics would not be the ones a GEMM site reports.
            job(&mut x); // warm-up
            let t: Vec<f64> = (0..samples)
                .map(|_| {
                    x.copy_from_slice(&src);
                    let t0 = Instant::now();
                    job(black_box(&mut x));
                    t0.elapsed().as_secs_f64()
                })
                .collect();
            out.push(row(name, n, t));
        }
        let mut codes = vec![0u8; n];
        let t = sample(samples, 0.0, || {
            black_box(fp8_quantize(&mut codes, &src, 100.0, Fp8Format::E4M3, true).ok());
        });
        out.push(row("fp8 e4m3 storage cast to codes (delayed scale)", n, t));
        out
    };
    fn row(name: &str, n: usize, t: Vec<f64>) -> QuantRow {
        let time = Stat::of(&t);
        QuantRow {
            recipe: name.into(),
            elements: n,
            threads: 1,
            time,
            gbps: (n * 4) as f64 / time.median / 1e9,
            best_gbps: (n * 4) as f64 / time.min / 1e9,
        }
    }
    match pool {
        Ok(p) => p.install(run),
        Err(_) => run(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rates count what the tools they are compared with count: 2·M·N·K FLOPs per
    /// GEMM (cuBLAS, PyTorch), STREAM's bytes (copy reads and writes each element: 2
    /// arrays; triad 3), and a quantiser's f32 input.
    #[test]
    fn gemm_and_memory_rows_count_as_the_reference_tools() {
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-12;
        let rows = gemm_bench(&[64]);
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!((r.m, r.n, r.k), (64, 64, 64));
        assert!(r.time.median > 0.0 && r.time.min <= r.time.median, "{rows:?}");
        assert!(close(r.gflops, 2.0 * 64f64.powi(3) / r.time.median / 1e9), "{rows:?}");
        assert!(close(r.best_gflops, 2.0 * 64f64.powi(3) / r.time.min / 1e9), "{rows:?}");
        let q = quant_bench(64, 256, 2);
        assert_eq!(q.len(), 9);
        for r in &q {
            assert_eq!((r.elements, r.threads), (64 * 256, 1), "{r:?}");
            assert!(close(r.gbps, (r.elements * 4) as f64 / r.time.median / 1e9), "{r:?}");
        }
        let elems = 1 << 16;
        let mem = memory_bench_with(elems, 3);
        let kinds: Vec<(&str, u64)> = mem.iter().map(|r| (r.kernel.as_str(), r.bytes)).collect();
        assert_eq!(kinds, [("copy", 2 * 4 * elems as u64), ("triad", 3 * 4 * elems as u64)]);
        for r in &mem {
            assert!(r.time.median > 0.0 && close(r.gbps, r.bytes as f64 / r.time.median / 1e9), "{r:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Any device: GEMM throughput per number format, and copy bandwidth, timed with the
// device's events (CUDA events on a GPU).
// ---------------------------------------------------------------------------------------

/// One GEMM size on a device.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceGemmRow {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Operand format (`f32`, `bf16`, `fp8-e4m3`); the output is f32 for f32 operands,
    /// bf16 otherwise (as `torch.matmul` and `torch._scaled_mm` with a bf16 out_dtype).
    pub dtype: String,
    /// Seconds per GEMM over the samples.
    pub time: Stat,
    pub tflops: f64,
    pub best_tflops: f64,
}

/// Seconds per call of `f` on `dev`, from events around `calls` back-to-back calls, for
/// `samples` samples after one untimed call.
pub(crate) fn device_samples<D: crate::device::Device>(
    dev: &D,
    samples: usize,
    calls: usize,
    mut f: impl FnMut() -> Result<(), crate::device::ExecError>,
) -> Result<Vec<f64>, crate::device::ExecError> {
    f()?;
    dev.synchronize()?;
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = dev.record()?;
        for _ in 0..calls {
            f()?;
        }
        let end = dev.record()?;
        out.push(dev.elapsed_s(&start, &end)? / calls as f64);
    }
    Ok(out)
}

/// Benchmark operand values (the device GEMM bench, `runner measure`'s GEMMs): seeded
/// standard normals, as PyTorch's reference draws them (operands that flip few bits draw less power and let a GPU clock
/// higher, which would flatter the times; finite in every format, and so are the
/// products). A pool of about a million is tiled over the buffer: its length is prime, so
/// no row of any shape repeats another, and a head's half-billion values drawn afresh
/// would cost seconds per linear.
pub(crate) fn operand(len: usize, seed: u64) -> Vec<f32> {
    const POOL: usize = 1_048_573; // prime
    let mut pool = vec![0f32; POOL.min(len)];
    crate::executor::SplitMix(seed).normals(&mut pool, 1.0);
    pool.iter().copied().cycle().take(len).collect()
}

/// The TN GEMM of a linear layer's forward, c (m,n) = a (m,k) · b (n,k)ᵀ, in `elem`, for
/// each square size: the layout cuBLASLt's FP8 kernels take directly.
///
/// # Errors
/// A format the device cannot multiply, or a device error.
pub fn device_gemm_bench<D: crate::device::Device>(
    dev: &D,
    sizes: &[usize],
    elem: crate::device::Elem,
) -> Result<Vec<DeviceGemmRow>, crate::device::ExecError> {
    use crate::device::Elem;
    let out_elem = if elem == Elem::F32 { Elem::F32 } else { Elem::BF16 };
    sizes
        .iter()
        .map(|&s| {
            // Normals, as PyTorch's reference draws (`torch.randn`): operands that flip
            // few bits draw less power and let the chip clock higher (an H200 ran 894
            // TFLOP/s on zeros against 788 on random data), which would flatter the
            // comparison. FP8 takes its current scale from the data (amax at 448), as the
            // reference scales its operands.
            let (mut a, mut b) = (dev.alloc(elem, s * s)?, dev.alloc(elem, s * s)?);
            dev.write_f32(&mut a, &operand(s * s, 1))?;
            dev.write_f32(&mut b, &operand(s * s, 2))?;
            let mut c = dev.alloc(out_elem, s * s)?;
            let g = Gemm {
                m: s,
                n: s,
                k: s,
                trans_a: false,
                trans_b: true,
            };
            let flops = 2.0 * (s as f64).powi(3);
            // ~50 ms per sample at 500 TFLOP/s for the large sizes, at least 3 calls.
            let calls = ((25e12 / flops) as usize).clamp(3, 1000);
            let t = device_samples(dev, 7, calls, || dev.matmul(&mut c, &a, &b, g, false))?;
            let time = Stat::of(&t);
            Ok(DeviceGemmRow {
                m: s,
                n: s,
                k: s,
                dtype: elem.name().into(),
                time,
                tflops: flops / time.median / 1e12,
                best_tflops: flops / time.min / 1e12,
            })
        })
        .collect()
}

/// The copy bandwidth and the memory-bound kernels of a training step on `elems`-element
/// f32 arrays (rows of 4096 for RMSNorm), each as GB/s of the bytes it must move, reads
/// and writes: element-wise add, SwiGLU forward, RMSNorm forward, the f32→bf16 cast, the
/// FP8 casts (alone and fused), the loss over Llama 3's vocabulary (forward and backward)
/// and AdamW.
///
/// # Errors
/// Out of device memory, or a device error.
pub fn device_memory_bench<D: crate::device::Device>(dev: &D, elems: usize) -> Result<Vec<MemRow>, crate::device::ExecError> {
    use crate::device::Elem;
    let n = elems / 4096 * 4096;
    let sized = |e: Elem, len: usize| -> Result<_, crate::device::ExecError> {
        let mut b = dev.alloc(e, len)?;
        dev.zero(&mut b)?;
        Ok(b)
    };
    let (mut a, mut b, mut c, mut d) = (sized(Elem::F32, n)?, sized(Elem::F32, n)?, sized(Elem::F32, n)?, sized(Elem::F32, n)?);
    let w = sized(Elem::F32, 4096)?;
    let mut rstd = dev.alloc(Elem::F32, n / 4096)?;
    let mut half = dev.alloc(Elem::BF16, n)?;
    let h = crate::executor::ADAMW_DEFAULT;
    let f = 4.0 * n as f64;
    let mut rows = Vec::new();
    let mut row = |kernel: &str, bytes: f64, t: Vec<f64>| {
        let time = Stat::of(&t);
        rows.push(MemRow {
            kernel: kernel.into(),
            bytes: bytes as u64,
            threads: 1,
            gbps: bytes / time.median / 1e9,
            best_gbps: bytes / time.min / 1e9,
            time,
        });
    };
    row("device copy", 2.0 * f, device_samples(dev, 7, 3, || dev.copy(&mut b, 0, &a, 0, n))?);
    row("add (residual)", 3.0 * f, device_samples(dev, 7, 3, || dev.add_forward(&mut c, &a, &b))?);
    row("swiglu forward", 3.0 * f, device_samples(dev, 7, 3, || dev.swiglu_forward(&mut c, &a, &b))?);
    row("rmsnorm forward (C 4096)", 2.0 * f, device_samples(dev, 7, 3, || dev.rmsnorm_forward(&mut c, &mut rstd, &a, &w, 4096, 1e-5))?);
    row("cast f32 -> bf16", 1.5 * f, device_samples(dev, 7, 3, || dev.cast(&mut half, &a))?);
    // The native FP8 route's casts: an operand to codes in one pass, and the fused norm /
    // activation + cast (their statistics stay on the device, unread, as in a pass).
    use runner_kernels::cpu::quant::{Format, QuantSpec};
    let spec = QuantSpec::Tensor { format: Format::E4M3, scale: Some(1.0), margin: 0, saturate: true, stochastic: None };
    let mut q = dev.alloc(Elem::F8E4M3, n)?;
    row("FP8 cast to codes", 1.25 * f, device_samples(dev, 7, 3, || dev.quantize_fp8_codes(&mut q, &a, 0, &spec).map(|_| ()))?);
    row("swiglu + FP8 cast (fused)", 3.25 * f, device_samples(dev, 7, 3, || {
        dev.forward_with_cast(crate::device::CastProducer::SwiGlu { out: &mut c, gate: &a, up: &b }, &mut q, &spec).map(|_| ())
    })?);
    row("rmsnorm + FP8 cast (fused, C 4096)", 2.25 * f, device_samples(dev, 7, 3, || {
        let p = crate::device::CastProducer::RmsNorm { out: &mut c, rstd: &mut rstd, x: &a, w: &w, c: 4096, eps: 1e-5 };
        dev.forward_with_cast(p, &mut q, &spec).map(|_| ())
    })?);
    // The loss over rows of Llama 3's 128256 logits: the forward reads each row once (a
    // row, 500 kB, is too large to read twice from cache), the backward reads it and
    // writes its gradient.
    let v = 128_256.min(n);
    let ce_rows = n / v;
    let (logits, mut dlogits, targets) = (sized(Elem::F32, ce_rows * v)?, sized(Elem::F32, ce_rows * v)?, sized(Elem::I32, ce_rows)?);
    let (mut loss, mut lse) = (sized(Elem::F32, 1)?, sized(Elem::F32, ce_rows)?);
    let logits_bytes = 4.0 * (ce_rows * v) as f64;
    row(&format!("cross-entropy forward (V {v})"), logits_bytes, device_samples(dev, 7, 3, || dev.cross_entropy_forward(&mut loss, &mut lse, &logits, &targets, v))?);
    row(&format!("cross-entropy backward (V {v})"), 2.0 * logits_bytes, device_samples(dev, 7, 3, || {
        dev.cross_entropy_backward(&mut dlogits, &logits, &lse, &targets, v, Some(&loss))
    })?);
    // Vocab-parallel (Megatron's tp = 8 split of the same logits): each rank's row max
    // and sum of exp of its shard, in one read of the shard.
    let (shard, shard_rows) = (v / 8, ce_rows * 8);
    if shard > 0 {
        let (mut mx, mut se) = (sized(Elem::F32, shard_rows)?, sized(Elem::F32, shard_rows)?);
        row(&format!("vocab-parallel row max + sum of exp (shard {shard} of V {v})"), logits_bytes, device_samples(dev, 7, 3, || {
            dev.row_max_sumexp(&mut mx, &mut se, &logits, shard)
        })?);
    }
    let s = crate::device::adamw_scalars(dev, &h, 1)?;
    row("adamw", 7.0 * f, device_samples(dev, 7, 3, || dev.adamw(&mut a, &b, &mut c, &mut d, &s))?);
    Ok(rows)
}

#[cfg(test)]
mod device_tests {
    use super::*;
    use crate::cpu::Cpu;
    use crate::device::Elem;

    /// Operands are normals, not a short repeating pattern: no row of a large buffer
    /// repeats the one before it, and the values spread as a standard normal's.
    #[test]
    fn operands_are_normals_that_do_not_repeat_by_row() {
        let k = 4096;
        let v = operand(3 * 1_048_573, 9);
        assert_eq!(v.len(), 3 * 1_048_573);
        assert_eq!(&v[..16], &operand(16, 9)[..], "the same seed gives the same values");
        assert!((0..700).all(|r| v[r * k..(r + 1) * k] != v[(r + 1) * k..(r + 2) * k]));
        let mut distinct: Vec<u32> = v[..100_000].iter().map(|x| x.to_bits()).collect();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 99_000, "{} distinct values in 100000", distinct.len());
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.01, "mean {mean}, variance {var}");
        assert!(v.iter().all(|x| x.is_finite()));
    }

    /// On the CPU backend the device benches run and report positive, consistent rates.
    #[test]
    fn device_benches_run_on_the_cpu() {
        let dev = Cpu::new();
        let rows = device_gemm_bench(&dev, &[32, 64], Elem::BF16).unwrap();
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().all(|r| r.tflops > 0.0 && r.best_tflops >= r.tflops && r.dtype == "bf16"));
        let rows = device_memory_bench(&dev, 1 << 17).unwrap();
        assert_eq!(rows.len(), 12);
        assert!(rows.iter().all(|r| r.gbps > 0.0), "{rows:?}");
        assert!(rows.iter().any(|r| r.kernel == "vocab-parallel row max + sum of exp (shard 16032 of V 128256)"), "{rows:?}");
    }

    /// A device GEMM's rates count 2·M·N·K FLOPs over the median and the best time (as
    /// cuBLAS and PyTorch do), and the row names the operand format asked for.
    #[test]
    fn device_gemm_rates_count_two_flops_per_multiply_add() {
        let dev = Cpu::new();
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-12;
        for elem in [Elem::BF16, Elem::F8E4M3] {
            let rows = device_gemm_bench(&dev, &[32, 48], elem).unwrap();
            for r in &rows {
                let flops = 2.0 * (r.m * r.n * r.k) as f64;
                assert_eq!((r.m, r.n, r.k, r.dtype.as_str()), (r.m, r.m, r.m, elem.name()), "{r:?}");
                assert!(close(r.tflops, flops / r.time.median / 1e12), "{r:?}");
                assert!(close(r.best_tflops, flops / r.time.min / 1e12), "{r:?}");
            }
        }
    }

    /// Each memory-bound kernel's bytes are what it must read and write per element
    /// (f32 4 bytes, bf16 2, fp8 1): a copy reads and writes one array; add and SwiGLU
    /// read two and write one; RMSNorm reads and writes one (its 4096 weights aside);
    /// the casts read f32 and write bf16 or fp8; a fused cast writes both the f32 result
    /// and its FP8 codes; the loss's forward reads the logits once, its backward reads
    /// them and writes their gradient, the vocab-parallel statistics read them once;
    /// AdamW reads weight, gradient and both moments and writes weight and moments. The
    /// arrays are cut to whole rows of 4096, and the loss's vocabulary to the array when
    /// it is smaller than Llama 3's.
    #[test]
    fn device_memory_rows_count_the_bytes_each_kernel_moves() {
        let dev = Cpu::new();
        let n = 4 * 4096;
        // Not a whole number of rows: the last, partial one is left out.
        let rows = device_memory_bench(&dev, n + 100).unwrap();
        let per_element: Vec<(String, u64)> = rows.iter().map(|r| (r.kernel.clone(), r.bytes / n as u64)).collect();
        let want = [
            ("device copy", 4 + 4),
            ("add (residual)", 4 + 4 + 4),
            ("swiglu forward", 4 + 4 + 4),
            ("rmsnorm forward (C 4096)", 4 + 4),
            ("cast f32 -> bf16", 4 + 2),
            ("FP8 cast to codes", 4 + 1),
            ("swiglu + FP8 cast (fused)", 4 + 4 + 4 + 1),
            ("rmsnorm + FP8 cast (fused, C 4096)", 4 + 4 + 1),
            ("cross-entropy forward (V 16384)", 4),
            ("cross-entropy backward (V 16384)", 4 + 4),
            ("vocab-parallel row max + sum of exp (shard 2048 of V 16384)", 4),
            ("adamw", 4 * 4 + 3 * 4),
        ];
        assert_eq!(per_element, want.map(|(k, b)| (k.to_string(), b)), "{rows:?}");
        for r in &rows {
            assert_eq!(r.bytes % n as u64, 0, "{r:?}");
            assert!(r.gbps > 0.0 && (r.gbps / (r.bytes as f64 / r.time.median / 1e9) - 1.0).abs() < 1e-12, "{r:?}");
        }
    }

    /// The device's samples are per call: one untimed call first, then each sample
    /// times `calls` calls and divides by them (a call sleeping 1 ms reads at least 1 ms
    /// and, with 16 calls a sample, far less than the 16 ms the sample takes: the bound
    /// of 8 ms leaves each sleep 7 ms of overshoot on a loaded machine).
    #[test]
    fn device_samples_are_per_call_after_one_untimed_call() {
        let dev = Cpu::new();
        let mut calls = 0;
        let t = device_samples(&dev, 2, 16, || {
            calls += 1;
            std::thread::sleep(std::time::Duration::from_millis(1));
            Ok(())
        })
        .unwrap();
        assert_eq!((calls, t.len()), (1 + 2 * 16, 2));
        assert!(t.iter().all(|&s| (1e-3..8e-3).contains(&s)), "{t:?}");
    }
}
