//! The CUDA kernels (`cuda/*.cu` with the real `cuda/common.cuh`), compiled as C++ under
//! an emulation of a block's threads (`cuda/emulation/emu.h`) and run on the CPU: their
//! index math, masks, barriers and shuffles, checked on a machine without a GPU. A
//! barrier or full-mask warp shuffle that some thread never reaches stops the emulation
//! with a report of where each thread waits (on a GPU: a hang; a kernel that loops
//! forever still hangs, so a deadline here); shared memory starts as NaN, and so do
//! outputs and scratch buffers; the address and undefined-behaviour sanitizers watch every
//! buffer where the compiler has them.
//!
//! - The attention kernels against a double-precision reference
//!   (`cuda/emulation/attention_check.cpp`).
//! - Every kernel can be launched from a script (`cuda/emulation/launcher.cpp`, [`Emu`]):
//!   the tests below replay the CUDA backend's launch sequences (`host/exec/src/cuda`)
//!   and compare with the CPU kernels (`runner_kernels::cpu`).
//! - The emulation's own promises, on kernels written to break them: a deadlock is
//!   reported, a missing barrier changes what other warps read.
//!
//! Needs a C++20 compiler (`c++`, or `CXX`); without one the tests say so and pass,
//! unless `RUNNER_REQUIRE_CXX` is set (CI sets it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use runner_kernels::cpu::ssm::{Ssm, SsmGrads, SsmInputs};
use runner_kernels::cuda::emulation::{self, compiler, point_dynamic_shared};

const CUDA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda");

fn build(cxx: &str, dir: &Path, main: &str, sanitize: bool) -> Output {
    let mut c = Command::new(cxx);
    c.current_dir(dir).args(["-std=c++20", "-O1", "-ffp-contract=off", main, "-o", main.trim_end_matches(".cpp")]);
    if sanitize {
        c.arg("-fsanitize=address,undefined");
    }
    c.output().expect("the C++ compiler ran a moment ago")
}

/// Build `main` in `dir` (with the sanitizers where the compiler has them); the binary.
fn compile(cxx: &str, dir: &Path, main: &str) -> PathBuf {
    let mut built = build(cxx, dir, main, true);
    if !built.status.success() {
        built = build(cxx, dir, main, false);
    }
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    dir.join(main.trim_end_matches(".cpp"))
}

/// Run `bin` with `args` under a deadline: a kernel that never finishes is a failure,
/// not a hung test.
fn run_with_deadline(bin: &Path, args: &[&Path]) -> (bool, String) {
    let mut child = Command::new(bin).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the emulated kernels did not finish in 600 s: a loop some thread never leaves");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// A fresh directory for one build.
fn scratch_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("runner-cuda-emulation-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The launcher, built once per test run (`None`: no compiler, and none required). Its
/// directory outlives every test (the process ends with it in use), so a run removes
/// those that earlier runs, no longer running, left behind.
fn launcher() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| {
        let cxx = compiler()?;
        let prefix = "runner-cuda-emulation-launcher-";
        for entry in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let ended = name.strip_prefix(prefix).and_then(|pid| pid.parse::<u32>().ok()).is_some_and(|pid| {
                pid != std::process::id() && cfg!(target_os = "linux") && !Path::new("/proc").join(pid.to_string()).exists()
            });
            if ended {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let dir = scratch_dir("launcher");
        emulation::write_launcher(&dir).unwrap();
        Some(compile(&cxx, &dir, "launcher.cpp"))
    })
    .as_deref()
}

/// A buffer of an [`Emu`] script.
#[derive(Clone, Copy)]
struct Buf(u32);

/// A launch argument, as the CUDA backend's `Arg` (`P`: a buffer at a byte offset).
enum A {
    P(Buf),
    POff(Buf, u64),
    I(i64),
    I32(i32),
    F(f32),
}

/// A script of buffers and launches for the launcher.
#[derive(Default)]
struct Emu {
    bufs: Vec<Vec<u8>>,
    launches: Vec<u8>,
    count: u32,
}

impl Emu {
    fn f32s(&mut self, v: &[f32]) -> Buf {
        self.bufs.push(v.iter().flat_map(|x| x.to_le_bytes()).collect());
        Buf(self.bufs.len() as u32 - 1)
    }
    /// An output or scratch buffer: NaN until a kernel writes it.
    fn nans(&mut self, n: usize) -> Buf {
        self.f32s(&vec![f32::NAN; n])
    }
    /// A u32 (indices, token ids) buffer.
    fn u32s(&mut self, v: &[u32]) -> Buf {
        self.bufs.push(v.iter().flat_map(|x| x.to_le_bytes()).collect());
        Buf(self.bufs.len() as u32 - 1)
    }
    /// A raw byte buffer (FP8 codes, bf16 words, FP8 meta).
    fn bytes(&mut self, v: &[u8]) -> Buf {
        self.bufs.push(v.to_vec());
        Buf(self.bufs.len() as u32 - 1)
    }
    /// Launch `name` on a one-dimensional grid (most of the backend's launches).
    fn launch(&mut self, name: &str, grid: u32, threads: u32, smem_floats: usize, args: &[A]) {
        self.launch3(name, (grid, 1, 1), threads, smem_floats, args);
    }
    fn launch3(&mut self, name: &str, grid: (u32, u32, u32), threads: u32, smem_floats: usize, args: &[A]) {
        let l = &mut self.launches;
        l.extend((name.len() as u32).to_le_bytes());
        l.extend(name.as_bytes());
        for v in [grid.0, grid.1, grid.2, threads] {
            l.extend(v.to_le_bytes());
        }
        l.extend((smem_floats as u64).to_le_bytes());
        l.extend((args.len() as u32).to_le_bytes());
        for a in args {
            match a {
                A::P(b) => {
                    l.push(0);
                    l.extend(b.0.to_le_bytes());
                    l.extend(0u64.to_le_bytes());
                }
                A::POff(b, off) => {
                    l.push(0);
                    l.extend(b.0.to_le_bytes());
                    l.extend(off.to_le_bytes());
                }
                A::F(v) => {
                    l.push(2);
                    l.extend(v.to_le_bytes());
                }
                A::I(v) => {
                    l.push(1);
                    l.extend(v.to_le_bytes());
                }
                A::I32(v) => {
                    l.push(1);
                    l.extend(i64::from(*v).to_le_bytes());
                }
            }
        }
        self.count += 1;
    }
    /// Grid-stride element-wise launch, as the backend's `ew` (256 threads, at most 2^20 blocks).
    fn ew(&mut self, name: &str, n: usize, args: &[A]) {
        self.launch(name, n.div_ceil(256).clamp(1, 1 << 20) as u32, 256, 0, args);
    }
    /// Run the script; every buffer after it, as f32 (see [`Emu::run_bytes`]).
    fn run(self, bin: &Path) -> Vec<Vec<f32>> {
        self.run_bytes(bin).into_iter().map(|b| b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()).collect()
    }
    /// Run the script; every buffer after it, as bytes.
    fn run_bytes(self, bin: &Path) -> Vec<Vec<u8>> {
        let dir = scratch_dir(&format!("script-{:?}", std::thread::current().id()).replace(['(', ')'], ""));
        let mut script = Vec::new();
        script.extend((self.bufs.len() as u32).to_le_bytes());
        for b in &self.bufs {
            script.extend((b.len() as u64).to_le_bytes());
            script.extend(b);
        }
        script.extend(self.count.to_le_bytes());
        script.extend(&self.launches);
        let (input, output) = (dir.join("script"), dir.join("out"));
        std::fs::write(&input, script).unwrap();
        let (ok, text) = run_with_deadline(bin, &[&input, &output]);
        assert!(ok, "{text}");
        let bytes = std::fs::read(&output).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let n = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            at += 8;
            out.push(bytes[at..at + n].to_vec());
            at += n;
        }
        out
    }
}

/// max |got − want| / max(1, max |want|), infinite for a NaN where `want` has none.
fn error(want: &[f32], got: &[f32]) -> f64 {
    assert_eq!(want.len(), got.len());
    let scale = want.iter().fold(1f64, |m, &x| m.max(f64::from(x).abs()));
    want.iter()
        .zip(got)
        .map(|(&w, &g)| if g.is_nan() != w.is_nan() { f64::INFINITY } else if w.is_nan() { 0.0 } else { (f64::from(w) - f64::from(g)).abs() })
        .fold(0.0, f64::max)
        / scale
}

/// `error` within `tol`, or the same bits for a tolerance of 0 (NaNs of any payload
/// alike, as devcheck's `bit_error`: -0 is not +0).
fn check(what: &str, want: &[f32], got: &[f32], tol: f64) {
    if tol == 0.0 {
        assert_eq!(want.len(), got.len(), "{what}: lengths");
        for (k, (w, g)) in want.iter().zip(got).enumerate() {
            assert!(w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan()), "{what}: element {k} is {g}, the CPU's {w}");
        }
    } else {
        let err = error(want, got);
        assert!(err <= tol, "{what} off by {err:.2e} (tolerance {tol:.0e})");
    }
}

fn normals(n: usize, seed: u64) -> Vec<f32> {
    // SplitMix64 and Box-Muller: any fixed values will do.
    let mut z = seed;
    let mut next = || {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut x = z;
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((x ^ (x >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n).map(|_| ((-2.0 * (next() + 1e-12).ln()).sqrt() * (2.0 * std::f64::consts::PI * next()).cos()) as f32).collect()
}

#[test]
fn attention_kernels_match_a_double_reference_under_emulation() {
    let Some(cxx) = compiler() else {
        assert!(std::env::var_os("RUNNER_REQUIRE_CXX").is_none(), "RUNNER_REQUIRE_CXX is set but no C++ compiler runs (c++ or CXX)");
        eprintln!("skipped: no C++ compiler (c++, or CXX); install g++ to check the CUDA kernels under emulation");
        return;
    };
    let dir = scratch_dir("attention");
    for file in ["emulation/emu.h", "emulation/emu_runtime.h", "emulation/attention_check.cpp", "common.cuh"] {
        let from = Path::new(CUDA).join(file);
        std::fs::copy(&from, dir.join(from.file_name().unwrap())).unwrap();
    }
    let src = std::fs::read_to_string(Path::new(CUDA).join("attention.cu")).unwrap();
    std::fs::write(dir.join("attention_emu.cu"), point_dynamic_shared(&src)).unwrap();
    let bin = compile(&cxx, &dir, "attention_check.cpp");
    let (ok, text) = run_with_deadline(&bin, &[]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "{text}");
    assert!(text.contains("\n0 of ") && text.contains("shapes failed") && !text.contains("FAILED"), "{text}");
}

/// `Some(launcher)`, or `None` after saying why the test is skipped.
fn launcher_or_skip() -> Option<&'static Path> {
    let bin = launcher();
    if bin.is_none() {
        assert!(std::env::var_os("RUNNER_REQUIRE_CXX").is_none(), "RUNNER_REQUIRE_CXX is set but no C++ compiler runs (c++ or CXX)");
        eprintln!("skipped: no C++ compiler (c++, or CXX); install g++ to check the CUDA kernels under emulation");
    }
    bin
}

/// Mamba-2's SSD scan, forward and backward, launched as the CUDA backend launches it
/// (`host/exec/src/cuda/mod.rs`: the chunked forward, the backward's per-chunk pass, its
/// reverse pass, the group sums of dB and dC and the per-head weight gradients), against
/// the CPU kernels: the shapes `runner bench kernels` checks, one group and several,
/// chunks that do not divide T, P = 64 with N = 128, and a 64 KiB state. The weight
/// gradients add into random values; every other output starts as NaN.
#[test]
fn ssm_scan_matches_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    use runner_kernels::cpu::ssm::{ssm_scan_backward, ssm_scan_forward};
    let cases = [
        Ssm { b: 2, t: 33, h: 4, p: 16, g: 1, n: 32, chunk: 8 },
        Ssm { b: 1, t: 20, h: 4, p: 64, g: 2, n: 128, chunk: 7 },
        Ssm { b: 2, t: 9, h: 2, p: 3, g: 2, n: 40, chunk: 16 },
        Ssm { b: 1, t: 12, h: 2, p: 64, g: 1, n: 256, chunk: 5 },
    ];
    for (ci, s) in cases.into_iter().enumerate() {
        let [lx, lt, lg, lh, _] = s.lens().unwrap();
        let seed = 100 * ci as u64;
        let (x, dt, bm, cm) = (normals(lx, seed + 1), normals(lt, seed + 2), normals(lg, seed + 3), normals(lg, seed + 4));
        let (a_log, d, dt_bias, dy) = (normals(lh, seed + 5), normals(lh, seed + 6), normals(lh, seed + 7), normals(lx, seed + 8));
        let w0: Vec<Vec<f32>> = (9..12).map(|k| normals(lh, seed + k)).collect();
        let inputs = SsmInputs { x: &x[..], dt: &dt[..], bm: &bm[..], cm: &cm[..], a_log: &a_log[..], d: &d[..], dt_bias: &dt_bias[..] };
        let (mut y, mut states) = (vec![0f32; lx], vec![0f32; s.states_len()]);
        ssm_scan_forward(&mut y, &mut states, inputs, s).unwrap();
        let (mut gx, mut gdt, mut gbm, mut gcm) = (vec![0f32; lx], vec![0f32; lt], vec![0f32; lg], vec![0f32; lg]);
        let (mut ga, mut gd, mut gb) = (w0[0].clone(), w0[1].clone(), w0[2].clone());
        let grads = SsmGrads { dx: &mut gx[..], ddt: &mut gdt[..], dbm: &mut gbm[..], dcm: &mut gcm[..], da_log: &mut ga[..], dd: &mut gd[..], ddt_bias: &mut gb[..] };
        ssm_scan_backward(grads, &dy, inputs, &states, s).unwrap();

        let mut e = Emu::default();
        let ins: Vec<Buf> = [&x, &dt, &bm, &cm, &a_log, &d, &dt_bias].iter().map(|v| e.f32s(v)).collect();
        let (ey, es, edy) = (e.nans(lx), e.nans(s.states_len()), e.f32s(&dy));
        let (edx, eddt, edbm, edcm) = (e.nans(lx), e.nans(lt), e.nans(lg), e.nans(lg));
        let (eda, edd, edb) = (e.f32s(&w0[0]), e.f32s(&w0[1]), e.f32s(&w0[2]));
        let (dch, dbh, wpart) = (e.nans(s.b * s.t * s.h * s.n), e.nans(s.b * s.t * s.h * s.n), e.nans(s.b * s.h * 3));
        let dims = || [A::I(s.t as i64), A::I32(s.h as i32), A::I32(s.p as i32), A::I32(s.g as i32), A::I32(s.n as i32)];
        // The backend passes min(chunk, T) (chunk_arg).
        let chunk = || A::I32(s.chunk.min(s.t.max(1)) as i32);
        let p = |b: Buf| A::P(b);
        let warps = s.p.clamp(1, 8) as u32;
        let mut args: Vec<A> = [ey, es].into_iter().chain(ins.iter().copied()).map(p).collect();
        args.extend(dims());
        args.push(chunk());
        e.launch("ssm_scan_forward", (s.b * s.h) as u32, 32 * warps, s.p * s.n, &args);
        let mut args: Vec<A> = [dch, edy, es, ins[0], ins[1], ins[2], ins[4], ins[6]].into_iter().map(p).collect();
        args.extend(dims());
        args.push(chunk());
        e.launch("ssm_scan_backward_fwd", (s.b * s.h * s.chunks()) as u32, (s.n.div_ceil(32) * 32).clamp(32, 256) as u32, s.p * s.n, &args);
        let mut args: Vec<A> = [edx, eddt, dbh, wpart, edy, dch].into_iter().chain(ins.iter().copied()).map(p).collect();
        args.extend(dims());
        e.launch("ssm_scan_backward_rev", (s.b * s.h) as u32, 32 * warps, s.p * s.n + warps as usize * s.n + 32, &args);
        let (bt, gn) = (s.b * s.t, s.g * s.n);
        for (dst, per_head) in [(edbm, dbh), (edcm, dch)] {
            e.ew("ssm_scan_group_sum", bt * gn, &[p(dst), p(per_head), A::I(bt as i64), A::I32(s.h as i32), A::I32(s.g as i32), A::I32(s.n as i32)]);
        }
        e.ew("ssm_scan_weights", s.h, &[p(eda), p(edd), p(edb), p(wpart), A::I(s.b as i64), A::I32(s.h as i32)]);
        let out = e.run(bin);

        let checks: [(&str, &[f32], Buf, f64); 9] = [
            ("y", &y, ey, 1e-4),
            ("states", &states, es, 1e-4),
            ("dx", &gx, edx, 1e-4),
            ("ddt", &gdt, eddt, 1e-3),
            ("dB", &gbm, edbm, 1e-4),
            ("dC", &gcm, edcm, 1e-4),
            ("da_log", &ga, eda, 1e-3),
            ("dd", &gd, edd, 1e-4),
            ("ddt_bias", &gb, edb, 1e-3),
        ];
        for (what, want, buf, tol) in checks {
            let err = error(want, &out[buf.0 as usize]);
            assert!(err <= tol, "{s:?}: {what} off by {err:.2e} (tolerance {tol:.0e})");
        }
    }
}

// Kernel families replayed under the emulation, a module each (they use this file's
// `Emu`, `A`, `Buf`, `launcher_or_skip`, `error` and `normals`).
#[path = "cuda_emulation/layout.rs"]
mod layout;
#[path = "cuda_emulation/loss.rs"]
mod loss;
#[path = "cuda_emulation/norm.rs"]
mod norm;
#[path = "cuda_emulation/precision.rs"]
mod precision;

/// The emulation's own promises, on two kernels written to break them: a barrier that
/// thread 5 never reaches stops the run with where each thread is (not a hang), and a
/// missing write-after-read barrier between two phases of a block reduction changes what
/// the other warps read (the same kernel with the barrier reads the right values).
#[test]
fn the_emulation_reports_a_deadlock_and_shows_a_missing_barrier() {
    const PROGRAM: &str = r#"
#include "emu.h"
#include <cstdio>
#include <cstring>
#include "emu_runtime.h"

// Each warp's leader publishes 1, every thread sums the 8 slots (8) and trades its sum
// with a neighbour lane (a warp shuffle, as a block reduction does), then the leaders
// publish 2 for a second sum. Without the barrier before the second publish, a warp
// that runs ahead overwrites a slot another warp has not read yet; with every thread in
// lockstep, all reads would land before the first shuffle and the race would not show.
static void two_sums(float* out, bool barrier) {
    __shared__ float slots[8];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) slots[warp] = 1.0f;
    __syncthreads();
    float first = 0.0f;
    for (int w = 0; w < 8; w++) first += slots[w];
    first = __shfl_xor_sync(0xffffffffu, first, 1);
    if (barrier) __syncthreads();
    if (lane == 0) slots[warp] = 2.0f;
    __syncthreads();
    out[threadIdx.x] = first;
}

static void early_return() {
    if (threadIdx.x == 5) return;
    __syncthreads();
}

int main(int argc, char** argv) {
    if (argc > 1 && !strcmp(argv[1], "deadlock")) {
        emu_kernel_name = "early_return";
        launch({1, 1, 1}, 64, 0, [] { early_return(); });
        return 0;
    }
    for (bool barrier : {true, false}) {
        float out[256];
        launch({1, 1, 1}, 256, 0, [&] { two_sums(out, barrier); });
        int wrong = 0;
        for (float x : out) wrong += x != 8.0f;
        printf("barrier %d: %d of 256 threads read a wrong sum\n", barrier, wrong);
    }
    return 0;
}
"#;
    let Some(cxx) = compiler() else {
        assert!(std::env::var_os("RUNNER_REQUIRE_CXX").is_none(), "RUNNER_REQUIRE_CXX is set but no C++ compiler runs (c++ or CXX)");
        eprintln!("skipped: no C++ compiler (c++, or CXX)");
        return;
    };
    let dir = scratch_dir("runtime");
    std::fs::write(dir.join("emu.h"), emulation::EMU_H).unwrap();
    std::fs::write(dir.join("emu_runtime.h"), emulation::EMU_RUNTIME_H).unwrap();
    std::fs::write(dir.join("runtime_check.cpp"), PROGRAM).unwrap();
    let bin = compile(&cxx, &dir, "runtime_check.cpp");
    let (ok, races) = run_with_deadline(&bin, &[]);
    let (deadlocked, report) = run_with_deadline(&bin, &[Path::new("deadlock")]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "{races}");
    assert!(races.contains("barrier 1: 0 of 256 threads read a wrong sum"), "{races}");
    assert!(races.contains("barrier 0: ") && !races.contains("barrier 0: 0 of"), "the missing barrier went unseen:\n{races}");
    assert!(!deadlocked, "{report}");
    for line in ["emulated kernel early_return, block (0, 0, 0): no thread can go on", "threads 0-4: wait at __syncthreads", "thread 5: returned", "threads 6-63: wait at __syncthreads"] {
        assert!(report.contains(line), "missing '{line}' in:\n{report}");
    }
}
