//! CPU kernels: one module per layer family, forward and backward side by side.
//!
//! All kernels are f32, take row-major contiguous slices, validate their arguments
//! (returning [`crate::KernelError`] instead of panicking) and use rayon's current
//! thread pool, splitting over rows, (batch, tile) blocks or experts. Reductions
//! that cross rows (weight gradients) are summed in a fixed block order, so results
//! do not depend on the number of threads.
//!
//! This file also holds the small vectorisable building blocks the kernels share
//! (`dot`, `axpy`, a polynomial `exp`): written with independent accumulator lanes so
//! LLVM turns them into SIMD code without fast-math.
//!
//! The crate is compiled for baseline x86-64 (SSE2, 4 lanes, no FMA). Hot loops run
//! through [`simd`], which re-compiles a closure for AVX-512 or AVX2+FMA and picks the
//! best one the CPU has at run time, so one binary is fast on new machines and still
//! runs on old ones, without a global `-C target-cpu`.

pub mod activation;
pub mod adamw;
pub mod attention;
pub mod cp;
pub mod embedding;
pub mod loss;
pub mod matmul;
pub mod moe;
pub mod muon;
pub mod norm;
pub mod precision;
pub mod quant;
pub mod rope;
pub mod ssm;

/// Elements per rayon task for element-wise kernels: large enough that task overhead
/// (~1 µs) is negligible, small enough to balance over a handful of cores.
pub(crate) const ELEM_GRAIN: usize = 1 << 15;

/// Row index into a source whose leading axes broadcast (size 1) against `out_lead`: for
/// row `row` of an output with leading axes `out_lead`, the row of a source with leading
/// axes `src_lead` it reads (concat's broadcast inputs; every backend's rule).
pub fn broadcast_row(out_lead: &[u64], src_lead: &[u64], row: usize) -> usize {
    let (mut r, mut idx, mut stride) = (row, 0usize, 1usize);
    for ax in (0..out_lead.len()).rev() {
        let d = out_lead[ax] as usize;
        let i = r % d;
        r /= d;
        let s = src_lead[ax] as usize;
        if s != 1 {
            idx += i * stride;
        }
        stride *= s;
    }
    idx
}

/// Rows per rayon task for row-wise kernels with row width `c`: aim for about
/// `ELEM_GRAIN` elements per task, at least one row.
pub(crate) fn rows_per_task(c: usize) -> usize {
    (ELEM_GRAIN / c.max(1)).max(1)
}

const LANES: usize = 16;

/// Runs `f` compiled for the widest instruction set this CPU offers: AVX-512
/// (F/VL/DQ/BW), else AVX2+FMA, else the baseline build.
///
/// `f` and everything it inlines (the `#[inline]` helpers below) are code-generated
/// once per variant; calls it does not inline (rayon, faer) keep their own dispatch.
/// So call it inside a rayon task, around the loop, not around a parallel iterator.
/// The variants compute the same values: LLVM never fuses `a*b+c` into an FMA on its
/// own (Rust has no fast-math), and the summation order is the code's, not the
/// vector width's (the helpers keep [`LANES`] explicit accumulators).
#[inline(always)]
pub(crate) fn simd<R>(f: impl FnOnce() -> R) -> R {
    simd_lanes(Closure(f))
}

/// A closure as a [`Lanes`] body (the closure itself is inlined, or not, by LLVM's
/// judgement: see [`Lanes`]).
struct Closure<F>(F);

impl<R, F: FnOnce() -> R> Lanes for Closure<F> {
    type Out = R;
    #[inline(always)]
    fn run(self) -> R {
        (self.0)()
    }
}

/// Marks the upper halves of the vector registers clean (`vzeroupper`) on CPUs with AVX.
///
/// faer's AVX-512 GEMM micro-kernels (private-gemm-x86, generated assembly) return
/// without `vzeroupper`. Until something clears them, every legacy-SSE instruction of
/// the baseline-compiled code that runs next on that thread (all of this crate
/// outside [`simd`], the executor, std's f64 math) carries a false dependency on the
/// dirty registers: the RoPE table after the attention backward took 1.7 ms instead
/// of 0.1 ms. Called after every faer product.
#[inline]
pub(crate) fn clear_upper() {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: AVX was detected.
        unsafe { vzeroupper() }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn vzeroupper() {
    std::arch::x86_64::_mm256_zeroupper();
}

/// A loop body too large for [`simd`]: a closure is only re-compiled for the wider
/// instruction sets when LLVM inlines it into the dispatch functions, and it stops doing
/// so once a closure holds a few inlined helpers (its three call sites forfeit the
/// single-caller bonus). The quantisation loops ran as baseline SSE2 code that way,
/// calling libm's `floorf` per element. A `Lanes` type's `run` is `#[inline(always)]`,
/// which LLVM must honour, so [`simd_lanes`] always gets one copy per instruction set.
pub(crate) trait Lanes {
    type Out;
    /// The loop; implementations mark it `#[inline(always)]`.
    fn run(self) -> Self::Out;
}

/// [`simd`] for a [`Lanes`] body.
#[inline(always)]
pub(crate) fn simd_lanes<K: Lanes>(k: K) -> K::Out {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the features `lanes_avx512` is compiled for were detected above.
            return unsafe { lanes_avx512(k) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: as above, for AVX2 and FMA.
            return unsafe { lanes_avx2(k) };
        }
    }
    k.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx512bw,avx2,fma,bmi1,bmi2,lzcnt,popcnt")]
fn lanes_avx512<K: Lanes>(k: K) -> K::Out {
    k.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,bmi1,bmi2,lzcnt,popcnt")]
fn lanes_avx2<K: Lanes>(k: K) -> K::Out {
    k.run()
}

/// Dot product of two equal-length slices (lengths are the caller's responsibility;
/// extra elements of the longer one are ignored). 16 independent accumulators so the
/// loop vectorises and the summation error grows like that of a 16-way pairwise sum.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        acc[l] += x * y;
    }
    hsum(acc)
}

/// Sum of a slice, 16 lanes (see [`dot`]).
#[inline(always)]
pub(crate) fn sum(a: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let ra = ca.remainder();
    for x in ca {
        for l in 0..LANES {
            acc[l] += x[l];
        }
    }
    for (l, x) in ra.iter().enumerate() {
        acc[l] += x;
    }
    hsum(acc)
}

/// Maximum of a slice (NaN elements are ignored; `-inf` for an empty slice).
#[inline(always)]
pub(crate) fn max(a: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let ca = a.chunks_exact(LANES);
    let ra = ca.remainder();
    for x in ca {
        for l in 0..LANES {
            acc[l] = if x[l] > acc[l] { x[l] } else { acc[l] };
        }
    }
    for (l, &x) in ra.iter().enumerate() {
        acc[l] = if x > acc[l] { x } else { acc[l] };
    }
    acc.into_iter().fold(f32::NEG_INFINITY, f32::max)
}

/// max |x| of a slice (NaN ignored; 0 for an empty slice), 16 lanes.
#[inline(always)]
pub(crate) fn max_abs(a: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let ra = ca.remainder();
    for x in ca {
        for l in 0..LANES {
            let v = x[l].abs();
            acc[l] = if v > acc[l] { v } else { acc[l] };
        }
    }
    for (l, &x) in ra.iter().enumerate() {
        let v = x.abs();
        acc[l] = if v > acc[l] { v } else { acc[l] };
    }
    acc.into_iter().fold(0.0, f32::max)
}

/// Σ exp(x_i − m), 16 lanes, with the vectorisable [`exp_f32`].
#[inline(always)]
pub(crate) fn sum_exp(x: &[f32], m: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let cx = x.chunks_exact(LANES);
    let rx = cx.remainder();
    for c in cx {
        for l in 0..LANES {
            acc[l] += exp_f32(c[l] - m);
        }
    }
    for (l, &v) in rx.iter().enumerate() {
        acc[l] += exp_f32(v - m);
    }
    hsum(acc)
}

#[inline(always)]
fn hsum(acc: [f32; LANES]) -> f32 {
    // pairwise tree over the lanes
    let mut w = acc;
    let mut n = LANES;
    while n > 1 {
        n /= 2;
        for l in 0..n {
            w[l] += w[l + n];
        }
    }
    w[0]
}

/// y += a * x
#[inline(always)]
pub(crate) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// exp(x) for f32 in a form LLVM vectorises (std's `exp` is a libm call per element).
///
/// Cephes `expf`: x = n·ln2 + r with |r| <= ln2/2, a degree-6 polynomial for e^r, and
/// 2^n put together from exponent bits. Measured max relative error about 2 ulp over
/// [-87, 88] (see the test). Inputs are clamped to [-87.33, 88.37], so the result is
/// always a finite normal number: exp of very negative x gives ~1.2e-38 instead of 0
/// and exp of very large x gives ~2.4e38 instead of inf. Callers use it where that
/// cannot matter (softmax terms next to a term of 1, sigmoid denominators). NaN in
/// gives NaN out.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding it rounds to an integer (ties to even) with plain SSE2 adds.
    const MAGIC: f32 = 12_582_912.0;
    let xc = if x < -87.336_54 { -87.336_54 } else { x };
    let xc = if xc > 88.376_26 { 88.376_26 } else { xc };
    let t = xc * LOG2E + MAGIC;
    let n = t - MAGIC;
    let ni = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let r = xc - n * LN2_HI - n * LN2_LO;
    let z = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5; // Cephes: 5.0000001201e-1, which rounds to 0.5 in f32
    let er = p * z + r + 1.0;
    // NaN propagates through `er`, so the garbage `ni` a NaN produces is harmless.
    let pow2 = f32::from_bits((ni.wrapping_add(127) as u32) << 23);
    er * pow2
}

/// 1 / (1 + e^-x), vectorisable.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_f32_matches_f64_exp() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let got = exp_f32(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        // 2 ulp of f32 is 2.4e-7.
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert!(exp_f32(f32::NAN).is_nan());
        assert!(exp_f32(f32::NEG_INFINITY) < 1.3e-38);
        assert!(exp_f32(-1e30) >= 0.0);
        assert!(exp_f32(1e30).is_finite());
        assert_eq!(exp_f32(0.0), 1.0);
    }

    #[test]
    fn reductions_match_naive_sums() {
        for n in [0usize, 1, 5, 16, 17, 100] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let d: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let s: f64 = a.iter().map(|x| *x as f64).sum();
            assert!((dot(&a, &b) as f64 - d).abs() < 1e-5);
            assert!((sum(&a) as f64 - s).abs() < 1e-5);
            let m = a.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max(&a), m);
        }
    }
}
