//! Scaled quantisation of GEMM operands, vectorised: what a precision plan asks of each
//! operand before an FP8 or FP4 GEMM, emulated exactly in f32 ("quantise, then
//! dequantise": every value becomes the f32 the low-precision GEMM would read, so an f32
//! GEMM with f32 accumulation computes what the tensor core computes, up to summation
//! order).
//!
//! Recipes (Transformer Engine's; docs/ARCHITECTURE.md, "Precision in the executor"):
//! - per tensor, one FP32 scale: `q = cast(x·scale)`, `x̂ = q / scale`; delayed scaling
//!   passes the scale from its amax history, current scaling takes it from this tensor
//!   ([`qdq_tensor`], [`amax`]);
//! - blocks ([`qdq_blocks`]): `rows x cols` elements of the operand as stored share a
//!   scale: 1x128 activations and 128x128 weights (DeepSeek-V3, FP32 scales), 1x32 MXFP8
//!   (E8M0 scales), 1x16 / 16x16 NVFP4 (E4M3 block scales under a per-tensor FP32 scale,
//!   `s_global = amax / (448·6)`, `s_block = (amax_block / 6) / s_global` stored as E4M3);
//! - block scales rounded to powers of two either way: up (`2^ceil(log2(amax/max))`, the
//!   RCEIL rule of cuBLAS and TE's MXFP8, never overflows) or down (OCP MX v1.0's FLOOR,
//!   `2^(floor(log2 amax) - emax)`, which can overflow and then clips);
//! - stochastic rounding (NVFP4 gradients) from a counter-based hash of (seed, index), so
//!   a run replays bit for bit;
//! - the random Hadamard transform NVFP4 applies to the weight-gradient inputs
//!   ([`hadamard_rows`]).
//!
//! Rounding is done on f32 bits, branch-free, with the same result as the scalar
//! encoder of [`super::precision`] (tested against it): RNE to the format's mantissa
//! width for normal values, to the subnormal spacing below the smallest normal, then the
//! overflow check on the rounded value. The loops run inside [`super::simd`] with 16
//! accumulator lanes, so LLVM emits AVX2 / AVX-512 code (`runner bench quantize`
//! measures GB/s per core; docs/PERFORMANCE.md).

use super::{ELEM_GRAIN, Lanes, simd, simd_lanes};
use crate::{Result, check_len, numel, shape_err};
use rayon::prelude::*;

/// A low-precision element format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// OCP E4M3FN: max 448, NaN, no Inf.
    E4M3,
    /// OCP E5M2: max 57344, Inf and NaN.
    E5M2,
    /// OCP E2M1 (FP4): max 6, neither Inf nor NaN (always saturates).
    E2M1,
}

/// NVFP4's second-level, per-tensor scale: amax / (E4M3 max × the element format's max),
/// so every block scale, stored in E4M3, stays in range (Transformer Engine's
/// `global_amax / (fp8_max * fp4_max)`). `kernels/cuda/quant.cu` computes the same.
///
/// An amax of 0 or not finite gives 1, as TE's encode scale
/// (`compute_global_encode_scaling_factor_FP4` in
/// transformer_engine/common/cast/nvfp4/core_nvfp4.cuh: `fp8_max * fp4_max / amax`, 1
/// where amax is 0 or the quotient is 0): an Inf in the operand made this Inf, every
/// finite block's E4M3 scale rounded to zero and those blocks came back as zeros.
pub fn tensor_scale_of_blocks(amax: f32, element: Format) -> f32 {
    if !amax.is_finite() || amax == 0.0 {
        return 1.0;
    }
    amax / (Format::E4M3.max() * element.max())
}

/// The per-tensor encode scale a two-level quantisation reports (`q = x·scale`) for its
/// decode scale `global`: `1 / global`, held at FLT_MAX as TE's
/// `compute_global_encode_scaling_factor_FP4` holds it (a tensor amax below 7.9e-36
/// made it Inf), and 1 for a decode scale of 0.
pub fn encode_scale_of_blocks(global: f32) -> f32 {
    if global > 0.0 { (1.0 / global).min(f32::MAX) } else { 1.0 }
}

impl Format {
    /// Largest finite value.
    pub fn max(self) -> f32 {
        match self {
            Format::E4M3 => 448.0,
            Format::E5M2 => 57344.0,
            Format::E2M1 => 6.0,
        }
    }
    /// Exponent of the largest binade (OCP MX `emax_elem`): 8, 15, 2.
    pub fn emax(self) -> i32 {
        match self {
            Format::E4M3 => 8,
            Format::E5M2 => 15,
            Format::E2M1 => 2,
        }
    }
    fn grid(self) -> Grid {
        let (mbits, emin) = match self {
            Format::E4M3 => (3u32, -6i32),
            Format::E5M2 => (2, -14),
            Format::E2M1 => (1, 0),
        };
        Grid {
            mbits,
            min_normal: pow2(emin),
            sub_mul: pow2(mbits as i32 - emin),
            sub_inv: pow2(emin - mbits as i32),
            half_ulp: (1 << (22 - mbits)) - 1,
            mask: !((1u32 << (23 - mbits)) - 1),
            max: self.max(),
            // E4M3 has no Inf: a non-saturating overflow is NaN; E2M1 has neither.
            overflow: match self {
                Format::E4M3 => f32::NAN,
                Format::E5M2 => f32::INFINITY,
                Format::E2M1 => 6.0,
            },
        }
    }
}

/// The format a scale factor is stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleFormat {
    /// FP32.
    Fp32,
    /// E8M0: a power of two, 2^-127..2^127.
    E8M0,
    /// E4M3 (NVFP4 block scales, under an FP32 tensor scale).
    E4M3,
}

/// How a block's scale is derived from its amax.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleRounding {
    /// `max / amax` exactly (FP32 scales).
    Exact,
    /// OCP MX FLOOR: dequantisation scale `2^(floor(log2 amax) - emax)`; can clip.
    Pow2Down,
    /// RCEIL: dequantisation scale `2^ceil(log2(amax / max))`; never overflows (cuBLAS,
    /// TE's MXFP8, and TE's power-of-two block scales).
    Pow2Up,
}

/// How one operand is block-quantised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockSpec {
    /// Element format.
    pub format: Format,
    /// Rows x columns of the operand (as stored, row-major) sharing one scale; both >= 1.
    pub block: (usize, usize),
    /// Format of the block scales.
    pub scale_format: ScaleFormat,
    /// How a block's scale is derived from its amax.
    pub scale_rounding: ScaleRounding,
    /// A second, per-tensor FP32 scale over E4M3 block scales (NVFP4).
    pub tensor_scale: bool,
    /// Clip overflow to ±max instead of NaN / Inf.
    pub saturate: bool,
    /// Stochastic rounding with this seed; `None`: round to nearest even.
    pub stochastic: Option<u64>,
}

/// What a quantisation did (the numbers a precision policy reads).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QuantReport {
    /// max |x| before scaling, NaN ignored.
    pub amax: f32,
    /// The per-tensor scale (`q = x·scale`); for block scaling, the scale of the block
    /// holding the amax (NVFP4: of the tensor, `1 / s_global`).
    pub scale: f32,
    /// Elements beyond the format's range after rounding (Inf included): clipped to ±max
    /// when saturating, else NaN / Inf.
    pub saturated: u64,
    /// Non-zero finite inputs that became zero.
    pub underflowed: u64,
    /// NaN or Inf inputs.
    pub nonfinite: u64,
    /// Elements quantised.
    pub elements: u64,
}

impl QuantReport {
    fn merge(self, o: QuantReport) -> QuantReport {
        QuantReport {
            amax: self.amax.max(o.amax),
            // The identity rayon's reduce starts from (no elements, scale 0) never wins:
            // a tensor of zeros keeps the scale its chunks used.
            scale: if self.elements == 0 || o.amax > self.amax { o.scale } else { self.scale },
            saturated: self.saturated + o.saturated,
            underflowed: self.underflowed + o.underflowed,
            nonfinite: self.nonfinite + o.nonfinite,
            elements: self.elements + o.elements,
        }
    }
}

#[inline(always)]
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// A format's value grid, as constants for the branch-free rounding.
#[derive(Clone, Copy, Debug)]
struct Grid {
    mbits: u32,
    min_normal: f32,
    /// 2^(mbits - emin): subnormal values to integers.
    sub_mul: f32,
    sub_inv: f32,
    /// Added to f32 bits before masking: just under half an ulp of the format.
    half_ulp: u32,
    mask: u32,
    max: f32,
    overflow: f32,
}

/// 1.5 * 2^23: adding and subtracting it rounds a float below 2^22 to an integer, ties
/// to even, in plain SSE/AVX arithmetic.
const MAGIC: f32 = 12_582_912.0;

/// A uniform 32-bit hash of (seed, index): the randomness of stochastic rounding.
#[inline(always)]
fn hash(seed: u32, i: u32) -> u32 {
    let mut h = i.wrapping_mul(0x9E37_79B1) ^ seed;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^ (h >> 16)
}

/// |y| rounded onto the format's grid (sign restored), before the overflow check.
/// `rand`: `None` rounds to nearest even; `Some(u)` rounds up with probability equal to
/// the fraction of an ulp (u uniform in 0..2^32).
#[inline(always)]
fn round_grid(y: f32, g: &Grid, rand: Option<u32>) -> f32 {
    let a = y.abs();
    let b = a.to_bits();
    let (normal, sub) = match rand {
        None => {
            let lsb = (b >> (23 - g.mbits)) & 1;
            let n = f32::from_bits(b.wrapping_add(g.half_ulp.wrapping_add(lsb)) & g.mask);
            let s = ((a * g.sub_mul + MAGIC) - MAGIC) * g.sub_inv;
            (n, s)
        }
        Some(u) => {
            let n = f32::from_bits(b.wrapping_add(u >> (9 + g.mbits)) & g.mask);
            let frac = (u >> 8) as f32 * (1.0 / 16_777_216.0);
            let s = (a * g.sub_mul + frac).floor() * g.sub_inv;
            (n, s)
        }
    };
    // A NaN's bits plus the increment can carry through the exponent into the sign bit
    // (0x7FFFFFFF, a GPU's canonical NaN, became -0): NaN passes through unrounded.
    let r = if a.is_nan() { a } else if a < g.min_normal { sub } else { normal };
    r.copysign(y)
}

/// Counters of a pass. The element loops keep them in plain locals that LLVM's loop
/// vectoriser recognises as reductions: `u32` sums added with `wrapping_add` (an
/// overflow check, on in debug builds, is a branch that stops vectorisation; [`SUB`]
/// keeps them far from overflowing) and amax as `f32::max`, which ignores NaN and is
/// exact in any order.
#[derive(Clone, Copy, Default)]
struct Acc {
    amax: f32,
    sat: u64,
    under: u64,
    nonfinite: u64,
}

impl Acc {
    /// One inner loop's counters (see [`SUB`]).
    #[inline(always)]
    fn add(&mut self, amax: f32, sat: u32, under: u32, nonfinite: u32) {
        self.amax = self.amax.max(amax);
        self.sat += u64::from(sat);
        self.under += u64::from(under);
        self.nonfinite += u64::from(nonfinite);
    }
    #[inline(always)]
    fn report(&self, n: usize, scale: f32) -> QuantReport {
        QuantReport {
            amax: self.amax,
            scale,
            saturated: self.sat,
            underflowed: self.under,
            nonfinite: self.nonfinite,
            elements: n as u64,
        }
    }
}

/// Bits of +Inf: |x| bits above it are NaN, at or above it not finite.
const INF_BITS: u32 = 0x7F80_0000;

/// Elements per inner loop of [`qdq_loop`]: L1-sized, and counted in `u32`.
const SUB: usize = 4096;

/// The scales of a pass: one for the whole slice, or one per element (block scales
/// spread over a row).
trait Scales: Sized {
    /// The scales of elements `start..start + n` (so the loop indexes a slice whose
    /// length LLVM knows, without bounds checks).
    fn sub(&self, start: usize, n: usize) -> Self;
    /// The encode multiplier of element `j`.
    fn enc(&self, j: usize) -> f32;
    /// Element `j`'s rounded value `r` back in the input's units.
    fn dec(&self, r: f32, j: usize) -> f32;
}

/// One per-tensor scale: `q = x·s`, `x̂ = q / s` (a division, as Transformer Engine
/// dequantises, so `x̂` is exactly what its GEMM reads).
struct TensorScale(f32);

impl Scales for TensorScale {
    #[inline(always)]
    fn sub(&self, _: usize, _: usize) -> Self {
        TensorScale(self.0)
    }
    #[inline(always)]
    fn enc(&self, _: usize) -> f32 {
        self.0
    }
    #[inline(always)]
    fn dec(&self, r: f32, _: usize) -> f32 {
        r / self.0
    }
}

/// Per-element encode and decode multipliers.
struct ElementScales<'a> {
    enc: &'a [f32],
    dec: &'a [f32],
}

impl Scales for ElementScales<'_> {
    #[inline(always)]
    fn sub(&self, start: usize, n: usize) -> Self {
        ElementScales { enc: &self.enc[start..start + n], dec: &self.dec[start..start + n] }
    }
    #[inline(always)]
    fn enc(&self, j: usize) -> f32 {
        self.enc[j]
    }
    #[inline(always)]
    fn dec(&self, r: f32, j: usize) -> f32 {
        r * self.dec[j]
    }
}

/// One element quantised: its rounded (or clipped) value and what it adds to the
/// counters, as 0 or 1 (summed in `u32` locals, see [`Acc`]).
struct One {
    r: f32,
    sat: u32,
    under: u32,
    nonfinite: u32,
}

/// Input `v` times its encode multiplier `e`, rounded onto the grid, then `clip` (±max,
/// or the format's NaN / Inf) where the rounded value is beyond the format's range. The
/// quantise-dequantise loop and the cast to codes both call this, so they round and
/// count alike.
#[inline(always)]
fn qdq_one(v: f32, e: f32, g: &Grid, clip: f32, rand: Option<u32>) -> One {
    let b = v.to_bits() & 0x7FFF_FFFF;
    let y = v * e;
    let r = round_grid(y, g, rand);
    let over = r.abs() > g.max;
    let r = if over { clip.copysign(y) } else { r };
    One { r, sat: u32::from(over), under: u32::from(r == 0.0 && b != 0 && b < INF_BITS), nonfinite: u32::from(b >= INF_BITS) }
}

/// Quantise-dequantise `x` in place: element `j` is scaled by its encode multiplier,
/// rounded onto the grid (stochastically when `SR`, from the hash of `seed` and `base + j`), clipped
/// or overflowed, and written back through `sc.dec`; the counters go to `acc`.
#[inline(always)]
fn qdq_loop<const SR: bool>(x: &mut [f32], base: usize, sc: &impl Scales, g: &Grid, sat: bool, seed: u32, acc: &mut Acc) {
    // A copy of the grid, as the cast to codes takes: read through `g`, which the stores
    // to `x` might alias for all LLVM knows, grid constants were masked gathers in the
    // AVX-512 code (1-3 per 16 elements), and every recipe ran 1.2-1.6x slower.
    let g = *g;
    let clip = if sat { g.max } else { g.overflow };
    for (k, xs) in x.chunks_mut(SUB).enumerate() {
        let start = k * SUB;
        // amax in a loop of its own, over data still in L1: inside the main loop, a NaN-
        // ignoring max beside the other reductions makes LLVM give up vectorising.
        let amax = amax_of(xs);
        let (mut sa, mut un, mut nf) = (0u32, 0u32, 0u32);
        let sc = sc.sub(start, xs.len());
        for (i, xv) in xs.iter_mut().enumerate() {
            let j = start.wrapping_add(i);
            let rand = if SR { Some(hash(seed, base.wrapping_add(j) as u32)) } else { None };
            let o = qdq_one(*xv, sc.enc(i), &g, clip, rand);
            sa = sa.wrapping_add(o.sat);
            un = un.wrapping_add(o.under);
            nf = nf.wrapping_add(o.nonfinite);
            *xv = sc.dec(o.r, i);
        }
        acc.add(amax, sa, un, nf);
    }
}

/// Quantise-dequantise `x` in place with one scale (`q = x·scale`, `x̂ = q / scale`).
fn qdq_const(x: &mut [f32], base: usize, scale: f32, g: &Grid, sat: bool, seed: Option<u32>) -> QuantReport {
    let n = x.len();
    simd_lanes(TensorPass { x, base, scale, g, sat, seed }).report(n, scale)
}

/// The loop of [`qdq_const`] (a [`Lanes`] body: too large for a closure).
struct TensorPass<'a> {
    x: &'a mut [f32],
    base: usize,
    scale: f32,
    g: &'a Grid,
    sat: bool,
    seed: Option<u32>,
}

impl Lanes for TensorPass<'_> {
    type Out = Acc;
    #[inline(always)]
    fn run(self) -> Acc {
        let TensorPass { x, base, scale, g, sat, seed } = self;
        let mut acc = Acc::default();
        // One loop per rounding mode, so the nearest-even loop carries no random draws.
        match seed {
            None => qdq_loop::<false>(x, base, &TensorScale(scale), g, sat, 0, &mut acc),
            Some(s) => qdq_loop::<true>(x, base, &TensorScale(scale), g, sat, s, &mut acc),
        }
        acc
    }
}

/// max |x| (NaN ignored), vectorised and parallel.
pub fn amax(x: &[f32]) -> f32 {
    x.par_chunks(ELEM_GRAIN).map(|c| simd(|| amax_of(c))).reduce(|| 0.0, f32::max)
}

/// max |x| over `x`, NaN ignored (`f32::max` is a reduction LLVM vectorises).
#[inline(always)]
fn amax_of(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// Transformer Engine's per-tensor scale for amax: `max / amax / 2^margin`, with TE's
/// edge cases (amax 0 or not finite: 1; a scale that overflows: f32::MAX).
pub fn tensor_scale(amax: f32, f: Format, margin: i32) -> f32 {
    if !amax.is_finite() || amax == 0.0 {
        return 1.0;
    }
    let s = f.max() / amax / 2f32.powi(margin);
    if s.is_finite() { s } else { f32::MAX }
}

/// The 32-bit seed of the stochastic-rounding and Hadamard hashes (what the CUDA
/// kernels take).
pub fn seed32(seed: Option<u64>) -> Option<u32> {
    seed.map(|s| (s ^ (s >> 32)) as u32)
}

/// A per-tensor scale must be finite and positive (every backend's rule: the CUDA one
/// checks with this too).
///
/// # Errors
/// `ShapeMismatch` for a scale that is zero, negative or not finite.
pub fn check_scale(scale: f32) -> Result<()> {
    if !(scale.is_finite() && scale > 0.0) {
        return shape_err(format!("quantisation scale {scale} is not finite and positive"));
    }
    Ok(())
}

/// Quantise-dequantise `x` in place with one per-tensor scale (`q = cast(x·scale)`,
/// `x̂ = q / scale`): the delayed and current FP8 recipes. A scale that is not finite
/// and positive is refused.
///
/// # Errors
/// `ShapeMismatch` for a scale that is zero, negative or not finite.
pub fn qdq_tensor(x: &mut [f32], f: Format, scale: f32, saturate: bool, stochastic: Option<u64>) -> Result<QuantReport> {
    check_scale(scale)?;
    let g = f.grid();
    let seed = seed32(stochastic);
    Ok(x.par_chunks_mut(ELEM_GRAIN)
        .enumerate()
        .map(|(i, c)| qdq_const(c, i * ELEM_GRAIN, scale, &g, saturate, seed))
        .reduce(QuantReport::default, QuantReport::merge))
}

/// `v` rounded to E4M3 (nearest even, subnormals, saturating at 448; NaN stays NaN):
/// `fp8_decode(fp8_encode(v, E4M3, true))` without the table, so it inlines into the
/// vector loops (tested equal to it).
#[inline(always)]
fn e4m3_saturating(v: f32) -> f32 {
    let g = Format::E4M3.grid();
    let r = round_grid(v, &g, None);
    if v.is_nan() {
        v
    } else if r.abs() > g.max {
        g.max.copysign(v)
    } else {
        r
    }
}

/// NVFP4's (encode, decode) multipliers of a block whose amax is `a`: its decode scale
/// stored as E4M3 (RNE, saturating) under the FP32 tensor scale `g` (1 without one); (1, 1)
/// for an amax of 0 or not finite, or a tensor scale of 0. Selects, not branches, so a
/// loop over a strip's blocks is vector code.
#[inline(always)]
fn e4m3_block_scale(a: f32, element_max: f32, g: f32) -> (f32, f32) {
    let d = e4m3_saturating(a / element_max / g) * g;
    // Held at FLT_MAX, as TE's `compute_scaling_coefficient`: a decode scale below
    // 2.9e-39 has an infinite reciprocal, and a block's zeros became NaN (0 · Inf).
    let (enc, dec) = if d > 0.0 && d.is_finite() { ((1.0 / d).min(f32::MAX), d) } else { (0.0, 0.0) };
    if !a.is_finite() || a == 0.0 || g == 0.0 { (1.0, 1.0) } else { (enc, dec) }
}

/// The (encode, decode) multipliers of a block whose amax is `a` (`global`: NVFP4's
/// per-tensor decode scale).
#[inline]
pub fn block_scale(a: f32, s: &BlockSpec, global: f32) -> (f32, f32) {
    let f = s.format;
    if !a.is_finite() || a == 0.0 {
        return (1.0, 1.0);
    }
    if s.scale_format == ScaleFormat::E4M3 {
        return e4m3_block_scale(a, f.max(), if s.tensor_scale { global } else { 1.0 });
    }
    let e = match s.scale_rounding {
        ScaleRounding::Exact => {
            let enc = f.max() / a;
            return if enc.is_finite() { (enc, 1.0 / enc) } else { (f32::MAX, 1.0 / f32::MAX) };
        }
        ScaleRounding::Pow2Up => {
            let r = a / f.max();
            let bits = r.to_bits();
            let (exp, mant) = ((bits >> 23) as i32 - 127, bits & 0x7F_FFFF);
            if exp == -127 { -126 } else if mant == 0 { exp } else { exp + 1 }
        }
        ScaleRounding::Pow2Down => ((a.to_bits() >> 23) as i32 - 127).max(-126) - f.emax(),
    };
    // E8M0 (and any power-of-two scale) spans 2^-127..2^127; keep both multipliers normal.
    let e = e.clamp(-126, 126);
    (pow2(-e), pow2(e))
}

/// Quantise-dequantise a (rows, cols) operand in place with block scales: every
/// `block.0 x block.1` tile (shorter at the edges) shares one scale, derived from its
/// amax by the spec's scale format and rounding; NVFP4's per-tensor FP32 scale first
/// when `tensor_scale`. A block side longer than the operand's is its whole height or
/// width (the same tiles, without `block.0 · cols` overflowing).
///
/// # Errors
/// `ShapeMismatch` unless `x` holds rows x cols elements and both block sides are >= 1.
pub fn qdq_blocks(x: &mut [f32], rows: usize, cols: usize, s: &BlockSpec) -> Result<QuantReport> {
    check_len("qdq_blocks x", x.len(), numel(&[rows, cols])?)?;
    let (br, bc) = s.block;
    if br == 0 || bc == 0 {
        return shape_err(format!("block {br}x{bc}: both sides must be at least 1"));
    }
    if x.is_empty() {
        return Ok(QuantReport::default());
    }
    let (br, bc) = (br.min(rows), bc.min(cols));
    let s = &BlockSpec { block: (br, bc), ..*s };
    let g = s.format.grid();
    let global = if s.tensor_scale { tensor_scale_of_blocks(amax(x), s.format) } else { 1.0 };
    let seed = seed32(s.stochastic);
    let strip = br * cols;
    let per_task = (ELEM_GRAIN / strip).max(1);
    let mut r = x
        .par_chunks_mut(strip * per_task)
        .enumerate()
        .map(|(t, strips)| simd_lanes(BlockTask { strips, base: t * per_task * strip, cols, s, global, g: &g, seed }))
        .reduce(QuantReport::default, QuantReport::merge);
    if s.tensor_scale {
        r.scale = encode_scale_of_blocks(global);
    }
    Ok(r)
}

/// One rayon task of [`qdq_blocks`]: whole strips of `block.0` rows, each with its block
/// scales computed first (a [`Lanes`] body, so the amax and scale loops are vector code
/// too).
struct BlockTask<'a> {
    strips: &'a mut [f32],
    /// Index of the task's first element in the operand (the stochastic-rounding hash's).
    base: usize,
    cols: usize,
    s: &'a BlockSpec,
    global: f32,
    g: &'a Grid,
    seed: Option<u32>,
}

impl Lanes for BlockTask<'_> {
    type Out = QuantReport;
    #[inline(always)]
    fn run(self) -> QuantReport {
        let BlockTask { strips, base, cols, s, global, g, seed } = self;
        let (br, bc) = s.block;
        let strip = br * cols;
        let sat = s.saturate || s.format == Format::E2M1;
        let mut out = QuantReport::default();
        let (mut enc, mut dec) = (vec![0f32; cols], vec![0f32; cols]);
        let mut bmax = vec![0f32; cols.div_ceil(bc)];
        let (mut benc, mut bdec) = (vec![0f32; bmax.len()], vec![0f32; bmax.len()]);
        for (k, st) in strips.chunks_mut(strip).enumerate() {
            bmax.fill(0.0);
            for row in st.chunks(cols) {
                if bc == 1 {
                    for (m, v) in bmax.iter_mut().zip(row) {
                        let a = v.abs();
                        *m = if a > *m { a } else { *m };
                    }
                } else {
                    for (m, c) in bmax.iter_mut().zip(row.chunks(bc)) {
                        *m = m.max(super::max_abs(c));
                    }
                }
            }
            if s.scale_format == ScaleFormat::E4M3 {
                // NVFP4's blocks of 16 in one vector loop: block_scale called per block
                // (with its branches) was a quarter of a 1x16 pass.
                let (fmax, g) = (s.format.max(), if s.tensor_scale { global } else { 1.0 });
                for ((e, d), &a) in benc.iter_mut().zip(bdec.iter_mut()).zip(&bmax) {
                    (*e, *d) = e4m3_block_scale(a, fmax, g);
                }
            } else {
                for ((e, d), &a) in benc.iter_mut().zip(bdec.iter_mut()).zip(&bmax) {
                    (*e, *d) = block_scale(a, s, global);
                }
            }
            let (mut top, mut top_scale) = (-1f32, 1f32);
            for (j, &a) in bmax.iter().enumerate() {
                let (e, d) = (benc[j], bdec[j]);
                let end = ((j + 1) * bc).min(cols);
                enc[j * bc..end].fill(e);
                dec[j * bc..end].fill(d);
                if a > top {
                    (top, top_scale) = (a, e);
                }
            }
            let mut acc = Acc::default();
            let sc = ElementScales { enc: &enc, dec: &dec };
            for (ri, row) in st.chunks_mut(cols).enumerate() {
                let base = base + k * strip + ri * cols;
                match seed {
                    None => qdq_loop::<false>(row, base, &sc, g, sat, 0, &mut acc),
                    Some(seed) => qdq_loop::<true>(row, base, &sc, g, sat, seed, &mut acc),
                }
            }
            out = out.merge(acc.report(st.len(), top_scale));
        }
        out
    }
}

/// FP8 codes of `x·scale` (RNE, subnormals included; overflow to ±max when saturating,
/// else NaN for E4M3 and ±Inf for E5M2; −0 kept), with the same report as
/// [`qdq_tensor`]: the vectorised storage cast behind
/// [`super::precision::fp8_quantize`].
///
/// # Errors
/// `ShapeMismatch` if `out` and `x` differ in length, or the scale is not finite and
/// positive (0 gave all zeros, a negative scale flipped every sign, NaN gave NaN codes,
/// each reported as that scale).
pub fn fp8_codes(out: &mut [u8], x: &[f32], scale: f32, f: super::precision::Fp8Format, saturate: bool) -> Result<QuantReport> {
    check_len("fp8_codes out", out.len(), x.len())?;
    check_scale(scale)?;
    let (fmt, bias) = match f {
        super::precision::Fp8Format::E4M3 => (Format::E4M3, 7u32),
        super::precision::Fp8Format::E5M2 => (Format::E5M2, 15),
    };
    let g = fmt.grid();
    Ok(out
        .par_chunks_mut(ELEM_GRAIN)
        .zip(x.par_chunks(ELEM_GRAIN))
        .map(|(q, x)| simd_lanes(CodesPass { q, x, enc: Encoder { scale, g: &g, bias, saturate } }))
        .reduce(QuantReport::default, QuantReport::merge))
}

/// The loop of [`fp8_codes`] (a [`Lanes`] body).
struct CodesPass<'a> {
    q: &'a mut [u8],
    x: &'a [f32],
    enc: Encoder<'a>,
}

/// What turns one value into its FP8 code.
struct Encoder<'a> {
    scale: f32,
    g: &'a Grid,
    /// The format's exponent bias.
    bias: u32,
    saturate: bool,
}

impl Encoder<'_> {
    /// The code of input `v` whose scaled value rounded (and clipped) to `r`.
    #[inline(always)]
    fn code(&self, v: f32, r: f32) -> u8 {
        let g = self.g;
        let sign = (v.to_bits() >> 24) & 0x80;
        let a = r.abs();
        let b = a.to_bits();
        let normal = (((b >> 23).wrapping_add(self.bias).wrapping_sub(127)) << g.mbits) | ((b >> (23 - g.mbits)) & ((1 << g.mbits) - 1));
        // Where it is used, `a · 2^(mbits - emin)` is a whole number below 2^mbits, and
        // adding 2^23 puts it in the mantissa bits. `as u32` (Rust's cast saturates, and
        // sends NaN to 0) compiled to sixteen scalar conversions and branches per vector.
        let sub = (a * g.sub_mul + 8_388_608.0).to_bits().wrapping_sub(0x4B00_0000);
        let c = if a < g.min_normal { sub } else { normal };
        let c = if a.is_infinite() { 0x7C } else { c };
        // NaN in, or E4M3's non-saturating overflow: 0x7F in both formats.
        let c = if v.is_nan() || r.is_nan() { 0x7F } else { c };
        (sign | c) as u8
    }
}

impl Lanes for CodesPass<'_> {
    type Out = QuantReport;
    #[inline(always)]
    fn run(self) -> QuantReport {
        let CodesPass { q, x, enc } = self;
        // A copy of the grid: read through `enc.g` inside the loop, a constant of the
        // subnormal arm was fetched by a masked gather every 16 elements (slow on Intel).
        let g = *enc.g;
        let enc = Encoder { g: &g, ..enc };
        let clip = if enc.saturate { g.max } else { g.overflow };
        let mut acc = Acc::default();
        // Its own loop, reading `x` and writing codes: the in-place one cost a copy of
        // every block into a buffer and a store of each value back.
        for (qs, xs) in q.chunks_mut(SUB).zip(x.chunks(SUB)) {
            let amax = amax_of(xs);
            let (mut sa, mut un, mut nf) = (0u32, 0u32, 0u32);
            for (c, &v) in qs.iter_mut().zip(xs) {
                let o = qdq_one(v, enc.scale, &g, clip, None);
                sa = sa.wrapping_add(o.sat);
                un = un.wrapping_add(o.under);
                nf = nf.wrapping_add(o.nonfinite);
                *c = enc.code(v, o.r);
            }
            acc.add(amax, sa, un, nf);
        }
        acc.report(x.len(), enc.scale)
    }
}

/// A 16- or 32-bit float an operand is kept in when it is not quantised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FloatFormat {
    /// Kept as it is.
    F32,
    /// Rounded to bfloat16 (RNE).
    Bf16,
    /// Rounded to IEEE half (RNE, subnormals; beyond 65504 becomes Inf).
    F16,
}

/// How an operand is quantised: the one argument of [`quantize`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum QuantSpec {
    /// Rounded to a 16/32-bit float, no scale.
    Float(FloatFormat),
    /// One scale for the tensor: `scale` (delayed scaling, from the amax history), or
    /// `None` for current scaling (`max / amax / 2^margin` of this tensor).
    Tensor {
        /// Element format.
        format: Format,
        /// The scale; `None`: from this tensor's amax.
        scale: Option<f32>,
        /// Binades of headroom current scaling leaves.
        margin: i32,
        /// Clip overflow to ±max.
        saturate: bool,
        /// Stochastic rounding seed; `None`: nearest even.
        stochastic: Option<u64>,
    },
    /// Block scales.
    Blocks(BlockSpec),
}

/// Quantise-dequantise a (rows, cols) operand in place as `spec` says, with its report.
///
/// # Errors
/// `ShapeMismatch` for a wrong length, an empty block side, or a bad scale.
pub fn quantize(x: &mut [f32], rows: usize, cols: usize, spec: &QuantSpec) -> Result<QuantReport> {
    check_len("quantize x", x.len(), numel(&[rows, cols])?)?;
    match *spec {
        QuantSpec::Float(f) => Ok(round_float(x, f)),
        QuantSpec::Tensor { format, scale, margin, saturate, stochastic } => {
            let a = match scale {
                Some(_) => 0.0,
                None => amax(x),
            };
            let s = scale.unwrap_or_else(|| tensor_scale(a, format, margin));
            qdq_tensor(x, format, s, saturate || format == Format::E2M1, stochastic)
        }
        QuantSpec::Blocks(b) => qdq_blocks(x, rows, cols, &b),
    }
}

/// [`quantize`] of a per-tensor FP8 operand (a given or a current scale, nearest even)
/// straight into its FP8 codes: the report `quantize` gives and the codes
/// [`fp8_codes`] makes of its result, without the dequantised copy: one pass over `x`
/// (two with current scaling, the amax first). The native FP8 GEMM route's cast.
///
/// # Errors
/// `ShapeMismatch` for a spec that is not per-tensor FP8 with nearest-even rounding, a
/// length mismatch, or a bad scale.
pub fn quantize_codes(out: &mut [u8], x: &[f32], spec: &QuantSpec) -> Result<QuantReport> {
    use super::precision::Fp8Format;
    let QuantSpec::Tensor { format, scale, margin, saturate, stochastic: None } = *spec else {
        return shape_err(format!("quantize_codes: {spec:?} is not a per-tensor FP8 spec rounding to nearest"));
    };
    let f = match format {
        Format::E4M3 => Fp8Format::E4M3,
        Format::E5M2 => Fp8Format::E5M2,
        Format::E2M1 => return shape_err("quantize_codes: E2M1 has no FP8 codes".to_string()),
    };
    check_len("quantize_codes out", out.len(), x.len())?;
    fp8_codes(out, x, scale.unwrap_or_else(|| tensor_scale(amax(x), format, margin)), f, saturate)
}

/// Round to a 16/32-bit float with the report: amax, non-finite inputs, finite values
/// that became Inf (saturated) and non-zero values that became zero.
fn round_float(x: &mut [f32], f: FloatFormat) -> QuantReport {
    x.par_chunks_mut(ELEM_GRAIN)
        .map(|c| {
            let acc = simd(|| Acc {
                amax: amax_of(c),
                nonfinite: c.iter().fold(0u32, |n, v| n.wrapping_add(u32::from(v.to_bits() & 0x7FFF_FFFF >= INF_BITS))).into(),
                ..Acc::default()
            });
            let count = |c: &[f32]| c.iter().fold((0u64, 0u64), |(z, i), v| (z + u64::from(*v == 0.0), i + u64::from(v.is_infinite())));
            let mut r = acc.report(c.len(), 1.0);
            if f != FloatFormat::F32 {
                let (z0, i0) = count(c);
                match f {
                    FloatFormat::Bf16 => super::precision::round_to_bf16(c),
                    _ => super::precision::round_to_f16(c),
                }
                let (z1, i1) = count(c);
                r.underflowed = z1 - z0;
                r.saturated = i1 - i0;
            }
            r
        })
        .reduce(QuantReport::default, QuantReport::merge)
}

/// The random signs of the Hadamard transform: ±1 per position of a group, from `seed`.
fn signs(h: usize, seed: u64) -> Vec<f32> {
    (0..h as u32).map(|i| if hash(seed32(Some(seed)).unwrap_or(0), i) & 1 == 0 { 1.0 } else { -1.0 }).collect()
}

/// The random Hadamard transform along the rows of a (rows, cols) matrix, in groups of
/// `h` consecutive rows: each group becomes `H·diag(signs)·group / sqrt(h)` (orthogonal),
/// so `(T a)ᵀ(T b) = aᵀb` for two operands transformed alike: applied to both inputs of
/// a GEMM along its reduction axis (NVFP4's weight gradient, dW = dYᵀX over tokens), it
/// spreads outliers over the group before quantisation without changing the product. A
/// last group shorter than `h` is left as it is (in both operands), and so is an operand
/// of fewer than `h` rows (checked first, so `h · cols` cannot overflow).
///
/// # Errors
/// `ShapeMismatch` unless `x` holds rows x cols and `h` is a power of two.
pub fn hadamard_rows(x: &mut [f32], rows: usize, cols: usize, h: usize, seed: u64) -> Result<()> {
    check_len("hadamard_rows x", x.len(), numel(&[rows, cols])?)?;
    if !h.is_power_of_two() {
        return shape_err(format!("Hadamard size {h} is not a power of two"));
    }
    if h == 1 || cols == 0 || h > rows {
        return Ok(());
    }
    let sg = signs(h, seed);
    let norm = 1.0 / (h as f32).sqrt();
    x.par_chunks_mut(h * cols).filter(|g| g.len() == h * cols).for_each(|grp| {
        simd(|| {
            for (r, s) in grp.chunks_mut(cols).zip(&sg) {
                r.iter_mut().for_each(|v| *v *= s * norm);
            }
            let mut len = 1;
            while len < h {
                for start in (0..h).step_by(2 * len) {
                    for i in start..start + len {
                        let (lo, hi) = grp.split_at_mut((i + len) * cols);
                        let (a, b) = (&mut lo[i * cols..(i + 1) * cols], &mut hi[..cols]);
                        for (p, q) in a.iter_mut().zip(b.iter_mut()) {
                            let (u, v) = (*p, *q);
                            *p = u + v;
                            *q = u - v;
                        }
                    }
                }
                len *= 2;
            }
        })
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::precision::{Fp8Format, fp8_decode, fp8_encode};
    use super::*;
    use crate::reference::check::*;
    use rand::Rng as _;

    fn fp8(f: Format) -> Fp8Format {
        if f == Format::E4M3 { Fp8Format::E4M3 } else { Fp8Format::E5M2 }
    }

    /// Every FP8 result equals the scalar encoder's decode(encode(x·s))/s, on edge
    /// values (midpoints, subnormals, overflow, NaN, Inf, signed zero) and random ones
    /// over the whole exponent range, saturating and not, with the counts.
    #[test]
    fn fp8_qdq_equals_the_scalar_encoder() {
        let mut rng = rng(90);
        for f in [Format::E4M3, Format::E5M2] {
            let ff = fp8(f);
            let mut xs: Vec<f32> = Vec::new();
            for b in 0..=255u8 {
                let v = fp8_decode(b, ff);
                let n = fp8_decode(b.wrapping_add(1), ff);
                xs.push(v);
                if v.is_finite() && n.is_finite() {
                    let mid = (v + n) / 2.0;
                    xs.extend([mid, f32::from_bits(mid.to_bits() + 1), f32::from_bits(mid.to_bits().saturating_sub(1))]);
                }
            }
            xs.extend([0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-45, 464.0, 464.01, 61440.0, 1e30]);
            // NaNs whose payload is all ones (a GPU's canonical NaN, 0x7FFFFFFF) or has
            // the mantissa's top bits set: rounding their bits must not carry them into zero.
            xs.extend([0x7FFF_FFFF, 0xFFFF_FFFF, 0x7FF8_0000, 0x7FC0_0001].map(f32::from_bits));
            for _ in 0..50_000 {
                xs.push(rng.random_range(-1.0f32..1.0) * 2f32.powi(rng.random_range(-30..20)));
            }
            for sat in [true, false] {
                for scale in [1.0f32, 0.37, 1024.0] {
                    let mut got = xs.clone();
                    let r = qdq_tensor(&mut got, f, scale, sat, None).unwrap();
                    let (mut s, mut u, mut nf) = (0u64, 0u64, 0u64);
                    for (x, g) in xs.iter().zip(&got) {
                        let code = fp8_encode(x * scale, ff, sat);
                        let want = fp8_decode(code, ff) / scale;
                        assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()), "{f:?} sat={sat} s={scale} x={x:e}: {g:e} vs {want:e}");
                        let over = x.is_infinite() || (x.is_finite() && !fp8_decode(fp8_encode(x * scale, ff, false), ff).is_finite())
                            || (x * scale).is_infinite();
                        s += u64::from(over && !x.is_nan());
                        u += u64::from(*x != 0.0 && x.is_finite() && want == 0.0);
                        nf += u64::from(!x.is_finite());
                    }
                    assert_eq!((r.saturated, r.underflowed, r.nonfinite), (s, u, nf), "{f:?} sat={sat} scale={scale}");
                    let amax = xs.iter().filter(|v| !v.is_nan()).fold(0f32, |m, v| m.max(v.abs()));
                    assert_eq!(r.amax, amax);
                    assert_eq!(r.elements, xs.len() as u64);
                }
            }
        }
    }

    /// The vectorised cast to codes (`fp8_codes`) gives the scalar encoder's code for
    /// every class of f32 input, in both formats, saturating and not, at scales that
    /// send values past the format's max, past f32's, and below its smallest subnormal:
    /// every f32 exponent (f32 subnormals, Inf and NaN included) with every FP8 mantissa
    /// and the f32 bits around its rounding point (ties, one either side, the ends of the
    /// range), each FP8 midpoint and its neighbours (subnormal ties, the tie above the
    /// max), NaN payloads that round into the exponent (0x7FFFFFFF), ±0, ±Inf. The
    /// report's amax and counts equal what the scalar encoder's codes say.
    #[test]
    fn fp8_codes_equal_the_scalar_encoder_on_every_input_class() {
        for f in [Format::E4M3, Format::E5M2] {
            let ff = fp8(f);
            let m = f.grid().mbits;
            let (ulp, tie) = (1u32 << (23 - m), 1u32 << (22 - m));
            let mut xs: Vec<f32> = Vec::new();
            for e in 0..=255u32 {
                for k in 0..1u32 << m {
                    for low in [0, 1, tie - 1, tie, tie + 1, ulp - 1] {
                        xs.push(f32::from_bits((e << 23) | (k << (23 - m)) | low));
                    }
                }
            }
            let top = (f.max() + f.max() + 2f32.powi(f.emax() - m as i32)) / 2.0;
            for b in 0..=255u8 {
                let (v, n) = (fp8_decode(b, ff), fp8_decode(b.wrapping_add(1), ff));
                let mid = if (b == 0x7E && f == Format::E4M3) || (b == 0x7B && f == Format::E5M2) { top } else { (v + n) / 2.0 };
                if mid.is_finite() && mid > 0.0 {
                    xs.extend([v, mid, f32::from_bits(mid.to_bits() - 1), f32::from_bits(mid.to_bits() + 1)]);
                }
            }
            xs.extend([0x7FFF_FFFF, 0x7FC0_0000, 0x7F80_0001, 0x7FC0_0001, 0x7FF8_0000].map(f32::from_bits));
            xs.extend([0.0, f32::INFINITY, f32::MAX, f32::MIN_POSITIVE, f32::from_bits(1)]);
            let neg: Vec<f32> = xs.iter().map(|v| -v).collect();
            xs.extend(neg);
            for saturate in [false, true] {
                for scale in [1.0f32, 0.37, 1024.0, 1e-30] {
                    let mut codes = vec![0u8; xs.len()];
                    let got = fp8_codes(&mut codes, &xs, scale, ff, saturate).unwrap();
                    let mut want = QuantReport { scale, elements: xs.len() as u64, ..QuantReport::default() };
                    for (x, &c) in xs.iter().zip(&codes) {
                        let code = fp8_encode(x * scale, ff, saturate);
                        assert_eq!(c, code, "{f:?} sat={saturate} scale={scale} x={x:e} ({:#010x})", x.to_bits());
                        if !x.is_nan() {
                            want.amax = want.amax.max(x.abs());
                            want.saturated += u64::from(!fp8_decode(fp8_encode(x * scale, ff, false), ff).is_finite());
                        }
                        want.underflowed += u64::from(x.is_finite() && *x != 0.0 && fp8_decode(code, ff) == 0.0);
                        want.nonfinite += u64::from(!x.is_finite());
                    }
                    assert_eq!(got, want, "{f:?} sat={saturate} scale={scale}");
                    if scale == 1.0 {
                        // The cases reach every counter (a list that lost its edges would not).
                        assert!(got.saturated > 0 && got.underflowed > 0 && got.nonfinite > 0, "{got:?}");
                    }
                }
            }
        }
    }

    /// The one-pass cast to codes equals quantising a copy and encoding the result with
    /// the scale it reports: the same codes (NaN, Inf, overflow, subnormals, signed zero
    /// included), the same report, for given and current scales, saturating or not; it
    /// refuses what has no FP8 codes (block scales, stochastic rounding, E2M1).
    #[test]
    fn quantize_codes_equals_quantize_then_encode() {
        let mut rng = rng(91);
        let mut xs: Vec<f32> = vec![0.0, -0.0, f32::NAN, f32::INFINITY, -f32::INFINITY, 1e-45, -3e-8, 464.0, 470.0, 61440.0, 1e30];
        for _ in 0..20_000 {
            xs.push(rng.random_range(-1.0f32..1.0) * 2f32.powi(rng.random_range(-30..20)));
        }
        let finite: Vec<f32> = xs.iter().copied().filter(|v| v.is_finite()).collect();
        for f in [Format::E4M3, Format::E5M2] {
            for saturate in [true, false] {
                for scale in [Some(1.0f32), Some(0.37), Some(3e4), None] {
                    for (margin, x) in [(0, &xs), (1, &finite)] {
                        let spec = QuantSpec::Tensor { format: f, scale, margin, saturate, stochastic: None };
                        let mut copy = x.clone();
                        let want = quantize(&mut copy, 1, x.len(), &spec).unwrap();
                        let mut want_codes = vec![0u8; x.len()];
                        fp8_codes(&mut want_codes, &copy, want.scale, fp8(f), saturate).unwrap();
                        let mut codes = vec![0u8; x.len()];
                        let got = quantize_codes(&mut codes, x, &spec).unwrap();
                        assert_eq!(got, want, "{f:?} sat={saturate} scale={scale:?} margin={margin}");
                        assert_eq!(codes, want_codes, "{f:?} sat={saturate} scale={scale:?} margin={margin}");
                    }
                }
            }
        }
        let mut out = vec![0u8; 4];
        let x = [1.0f32; 4];
        let sr = QuantSpec::Tensor { format: Format::E4M3, scale: None, margin: 0, saturate: true, stochastic: Some(1) };
        assert!(quantize_codes(&mut out, &x, &sr).is_err());
        let fp4 = QuantSpec::Tensor { format: Format::E2M1, scale: Some(1.0), margin: 0, saturate: true, stochastic: None };
        assert!(quantize_codes(&mut out, &x, &fp4).is_err());
        assert!(quantize_codes(&mut out, &x, &QuantSpec::Float(FloatFormat::Bf16)).is_err());
        assert!(quantize_codes(&mut out[..3], &x, &QuantSpec::Tensor { format: Format::E4M3, scale: Some(1.0), margin: 0, saturate: true, stochastic: None }).is_err());
    }

    /// A tensor of zeros keeps the scale it was quantised with (given, or its current
    /// scale), so its codes decode to zeros, not 0/0: the reduction over chunks starts
    /// from an empty report whose scale is 0.
    #[test]
    fn a_tensor_of_zeros_keeps_its_scale() {
        let zeros = vec![0.0f32; 100_000];
        for (scale, want) in [(Some(2.0f32), 2.0f32), (None, tensor_scale(0.0, Format::E4M3, 0))] {
            let spec = QuantSpec::Tensor { format: Format::E4M3, scale, margin: 0, saturate: true, stochastic: None };
            let mut codes = vec![0u8; zeros.len()];
            let r = quantize_codes(&mut codes, &zeros, &spec).unwrap();
            assert_eq!(r.scale, want, "codes, scale {scale:?}");
            let mut x = zeros.clone();
            let n = x.len();
            assert_eq!(quantize(&mut x, 1, n, &spec).unwrap().scale, want, "quantize, scale {scale:?}");
        }
        assert!(tensor_scale(0.0, Format::E4M3, 0) > 0.0);
    }

    /// E2M1 rounds to {0, 0.5, 1, 1.5, 2, 3, 4, 6}, ties to even, and clips at 6.
    #[test]
    fn e2m1_grid_ties_to_even_and_clips() {
        let cases = [
            (0.2f32, 0.0f32), (0.25, 0.0), (0.26, 0.5), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0),
            (3.5, 4.0), (5.0, 4.0), (5.1, 6.0), (6.0, 6.0), (7.0, 6.0), (100.0, 6.0), (-2.6, -3.0),
        ];
        for (x, want) in cases {
            let mut v = [x];
            let r = qdq_tensor(&mut v, Format::E2M1, 1.0, false, None).unwrap();
            assert_eq!(v[0], want, "{x}");
            assert_eq!(r.saturated, u64::from(x.abs() >= 7.0), "{x}");
        }
    }

    #[test]
    fn stochastic_rounding_is_unbiased_and_stays_on_the_grid() {
        // 1.1 lies between 1 and 1.125 (E4M3): mean of many draws -> 1.1; 0.3 x 2^-9 is a
        // subnormal fraction.
        for (x, lo, hi) in [(1.1f32, 1.0f32, 1.125f32), (0.3 * 2f32.powi(-9), 0.0, 2f32.powi(-9))] {
            let mut v = vec![x; 200_000];
            qdq_tensor(&mut v, Format::E4M3, 1.0, true, Some(7)).unwrap();
            assert!(v.iter().all(|&y| y == lo || y == hi), "{x}");
            let mean = v.iter().map(|&y| f64::from(y)).sum::<f64>() / v.len() as f64;
            assert!((mean - f64::from(x)).abs() < 2e-3 * f64::from(hi - lo) * 10.0, "{x}: mean {mean}");
            let mut w = vec![x; 200_000];
            qdq_tensor(&mut w, Format::E4M3, 1.0, true, Some(7)).unwrap();
            assert_eq!(v, w, "the same seed replays");
        }
    }

    /// NaN in gives NaN out on every path that rounds on bits (per tensor, blocks, nearest
    /// and stochastic), whatever its payload: 0x7FFFFFFF (a GPU's canonical NaN) once
    /// rounded into -0 and vanished from the GEMM's operand; the counts still see it.
    #[test]
    fn nan_payloads_stay_nan() {
        let nans = [0x7FFF_FFFFu32, 0xFFFF_FFFF, 0x7FF8_0000, 0x7FC0_0000].map(f32::from_bits);
        let mut x = vec![1.0f32; 64];
        x[..4].copy_from_slice(&nans);
        for (f, sr) in [(Format::E4M3, None), (Format::E5M2, None), (Format::E5M2, Some(3)), (Format::E2M1, Some(3))] {
            let mut y = x.clone();
            let r = qdq_tensor(&mut y, f, 1.0, true, sr).unwrap();
            assert!(y[..4].iter().all(|v| v.is_nan()), "{f:?} sr={sr:?}: {:?}", &y[..4]);
            assert_eq!(r.nonfinite, 4);
        }
        let mx = BlockSpec { format: Format::E4M3, block: (1, 32), scale_format: ScaleFormat::E8M0, scale_rounding: ScaleRounding::Pow2Up, tensor_scale: false, saturate: true, stochastic: None };
        let nv = BlockSpec { format: Format::E2M1, block: (1, 16), scale_format: ScaleFormat::E4M3, scale_rounding: ScaleRounding::Exact, tensor_scale: true, saturate: true, stochastic: Some(5) };
        for s in [mx, nv] {
            let mut y = x.clone();
            qdq_blocks(&mut y, 2, 32, &s).unwrap();
            assert!(y[..4].iter().all(|v| v.is_nan()), "{s:?}: {:?}", &y[..4]);
        }
        let mut codes = vec![0u8; 64];
        quantize_codes(&mut codes, &x, &QuantSpec::Tensor { format: Format::E4M3, scale: Some(1.0), margin: 0, saturate: true, stochastic: None }).unwrap();
        assert_eq!(codes[..4], [0x7F, 0xFF, 0x7F, 0x7F]);
    }

    /// Blocks against a plain per-block loop: amax, scale by the rule, scalar encode.
    #[test]
    fn blocks_match_a_per_block_reference() {
        let mut rng = rng(91);
        let (rows, cols) = (70, 300);
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| rng.random_range(-1.0f32..1.0) * 2f32.powi(((i / 37) % 11) as i32 - 5))
            .collect();
        let specs = [
            ((1, 32), ScaleFormat::E8M0, ScaleRounding::Pow2Up),
            ((32, 1), ScaleFormat::E8M0, ScaleRounding::Pow2Down),
            ((1, 128), ScaleFormat::Fp32, ScaleRounding::Exact),
            ((128, 128), ScaleFormat::Fp32, ScaleRounding::Pow2Up),
        ];
        for (block, sf, sr) in specs {
            let s = BlockSpec { format: Format::E4M3, block, scale_format: sf, scale_rounding: sr, tensor_scale: false, saturate: true, stochastic: None };
            let mut got = x.clone();
            let rep = qdq_blocks(&mut got, rows, cols, &s).unwrap();
            let mut sat = 0;
            for r0 in (0..rows).step_by(block.0) {
                for c0 in (0..cols).step_by(block.1) {
                    let idx: Vec<usize> = (r0..(r0 + block.0).min(rows)).flat_map(|r| (c0..(c0 + block.1).min(cols)).map(move |c| r * cols + c)).collect();
                    let a = idx.iter().fold(0f32, |m, &i| m.max(x[i].abs()));
                    let d = match sr {
                        ScaleRounding::Exact => 1.0 / (448.0 / a),
                        ScaleRounding::Pow2Up => 2f32.powf((a / 448.0).log2().ceil()),
                        ScaleRounding::Pow2Down => 2f32.powf(a.log2().floor() - 8.0),
                    };
                    for &i in &idx {
                        let enc = if sr == ScaleRounding::Exact { 448.0 / a } else { 1.0 / d };
                        let y = x[i] * enc;
                        sat += usize::from(fp8_decode(fp8_encode(y, Fp8Format::E4M3, false), Fp8Format::E4M3).is_nan());
                        let want = fp8_decode(fp8_encode(y, Fp8Format::E4M3, true), Fp8Format::E4M3) * d;
                        assert_eq!(got[i].to_bits(), want.to_bits(), "{block:?} {sr:?} at {i}: {} vs {want}", got[i]);
                    }
                }
            }
            assert_eq!(rep.saturated as usize, sat, "{block:?} {sr:?}");
            if sr == ScaleRounding::Pow2Up {
                assert_eq!(sat, 0, "RCEIL never overflows");
            }
        }
    }

    /// The NVFP4 block-scale rounding equals the scalar encoder's saturating E4M3 round
    /// trip on every code's neighbourhood, far out of range, and at NaN / Inf.
    #[test]
    fn e4m3_block_scale_rounding_equals_the_scalar_encoder() {
        let mut xs = vec![0.0f32, 1e-45, 1e-10, 448.0, 464.0, 465.0, 1e30, f32::MAX, f32::INFINITY, f32::NAN];
        for b in 0..0x7Fu8 {
            let v = fp8_decode(b, Fp8Format::E4M3);
            xs.extend([v, f32::from_bits(v.to_bits() + 1), f32::from_bits(v.to_bits().saturating_sub(1)), v * 1.0625, v * 1.03125]);
        }
        for x in xs {
            let want = fp8_decode(fp8_encode(x, Fp8Format::E4M3, true), Fp8Format::E4M3);
            let got = e4m3_saturating(x);
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{x:e}: {got:e} vs {want:e}");
        }
    }

    #[test]
    fn nvfp4_two_level_scales() {
        let mut rng = rng(92);
        let (rows, cols) = (16, 64);
        let x: Vec<f32> = (0..rows * cols).map(|i| rng.random_range(-1.0f32..1.0) * if i % 100 == 0 { 50.0 } else { 1.0 }).collect();
        let s = BlockSpec { format: Format::E2M1, block: (1, 16), scale_format: ScaleFormat::E4M3, scale_rounding: ScaleRounding::Exact, tensor_scale: true, saturate: true, stochastic: None };
        let mut got = x.clone();
        let rep = qdq_blocks(&mut got, rows, cols, &s).unwrap();
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let sg = amax / (448.0 * 6.0);
        assert_eq!(rep.scale, 1.0 / sg);
        let grid = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for (b, (xb, gb)) in x.chunks(16).zip(got.chunks(16)).enumerate() {
            let ab = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let sb = fp8_decode(fp8_encode(ab / 6.0 / sg, Fp8Format::E4M3, true), Fp8Format::E4M3);
            let d = sb * sg;
            for (&v, &g) in xb.iter().zip(gb) {
                let q = g / d;
                assert!(grid.iter().any(|&p| (q.abs() - p).abs() < 1e-4), "block {b}: {v} -> {g} ({q} is off the E2M1 grid)");
                let err = (g - v).abs();
                assert!(err <= 1.0 * d + 1e-6, "block {b}: {v} -> {g}");
            }
        }
    }

    #[test]
    fn hadamard_keeps_products_and_spreads_outliers() {
        let mut rng = rng(93);
        let (m, n, k) = (40, 5, 7); // 40 rows: two groups of 16, one partial group of 8
        let a = randn(&mut rng, m * n);
        let mut b = randn(&mut rng, m * k);
        b[3 * k] = 100.0;
        let prod = |a: &[f32], b: &[f32]| -> Vec<f64> {
            let mut c = vec![0f64; n * k];
            for r in 0..m {
                for i in 0..n {
                    for j in 0..k {
                        c[i * k + j] += f64::from(a[r * n + i]) * f64::from(b[r * k + j]);
                    }
                }
            }
            c
        };
        let want = prod(&a, &b);
        let (mut ta, mut tb) = (a.clone(), b.clone());
        hadamard_rows(&mut ta, m, n, 16, 5).unwrap();
        hadamard_rows(&mut tb, m, k, 16, 5).unwrap();
        for (g, w) in prod(&ta, &tb).iter().zip(&want) {
            assert!((g - w).abs() < 1e-3 * (1.0 + w.abs()), "{g} vs {w}");
        }
        let col0_max = (0..16).map(|r| tb[r * k].abs()).fold(0f32, f32::max);
        assert!(col0_max < 30.0, "the outlier is spread over its group: max {col0_max}");
        assert_eq!(&ta[32 * n..], &a[32 * n..], "the partial group is untouched");
        assert!(hadamard_rows(&mut ta, m, n, 12, 5).is_err());
    }

    #[test]
    fn quantize_dispatches_and_reports_float_rounding() {
        let mut x = vec![1.0f32, 1e-40, 3.4e38, f32::NAN, 0.0, -2.5];
        let r = quantize(&mut x, 2, 3, &QuantSpec::Float(FloatFormat::F16)).unwrap();
        assert_eq!((r.saturated, r.underflowed, r.nonfinite), (1, 1, 1));
        assert_eq!(r.amax, 3.4e38);
        assert_eq!(x[0], 1.0);
        let mut y = vec![0.5f32, -3.0, 0.001, 0.0];
        let r = quantize(&mut y, 1, 4, &QuantSpec::Tensor { format: Format::E4M3, scale: None, margin: 1, saturate: true, stochastic: None }).unwrap();
        assert_eq!(r.scale, 448.0 / 3.0 / 2.0, "current scaling with a margin of one binade");
        assert_eq!(y[1], -3.0);
        assert!(quantize(&mut y, 2, 3, &QuantSpec::Float(FloatFormat::F32)).is_err());
    }

    #[test]
    fn bad_arguments_are_errors() {
        let mut x = vec![1.0f32; 10];
        assert!(qdq_tensor(&mut x, Format::E4M3, 0.0, true, None).is_err());
        assert!(qdq_tensor(&mut x, Format::E4M3, f32::NAN, true, None).is_err());
        let s = BlockSpec { format: Format::E4M3, block: (1, 32), scale_format: ScaleFormat::E8M0, scale_rounding: ScaleRounding::Pow2Up, tensor_scale: false, saturate: true, stochastic: None };
        assert!(qdq_blocks(&mut x, 3, 4, &s).is_err());
        assert!(qdq_blocks(&mut x, 2, 5, &BlockSpec { block: (0, 4), ..s }).is_err());
        assert_eq!(tensor_scale(3.0, Format::E4M3, 1), 448.0 / 3.0 / 2.0);
        assert_eq!(tensor_scale(0.0, Format::E4M3, 0), 1.0);
    }

    /// RCEIL at exact powers of two: amax / max = 2^k takes the scale 2^k, not 2^(k+1)
    /// (2^ceil(log2(amax / max)), and the ceiling of an integer is itself): 448 / 448,
    /// 896 / 448, 7 / 448 = 2^-6, 57344 / 57344, 6 / 6, 0.75 / 6 = 2^-3; a ratio that is
    /// an f32 subnormal takes the smallest normal scale, 2^-126. A block whose amax is
    /// the format's max comes back unchanged (its other values on the E4M3 grid).
    #[test]
    fn rceil_keeps_exact_powers_of_two() {
        let up = |format| BlockSpec { format, block: (1, 32), scale_format: ScaleFormat::E8M0, scale_rounding: ScaleRounding::Pow2Up, tensor_scale: false, saturate: true, stochastic: None };
        for (a, f, x) in [
            (448.0f32, Format::E4M3, 1.0f32), (896.0, Format::E4M3, 2.0), (7.0, Format::E4M3, 0.015625),
            (57344.0, Format::E5M2, 1.0), (6.0, Format::E2M1, 1.0), (0.75, Format::E2M1, 0.125),
        ] {
            assert_eq!(block_scale(a, &up(f), 1.0), (1.0 / x, x), "amax {a} {f:?}");
        }
        assert_eq!(block_scale(1e-40, &up(Format::E4M3), 1.0), (2f32.powi(126), f32::MIN_POSITIVE));
        let mut b: Vec<f32> = (0..32).map(|i| if i == 5 { -448.0 } else { 2f32.powi(i % 10 - 5) * (1.0 + (i % 8) as f32 / 8.0) }).collect();
        let want = b.clone();
        let r = qdq_blocks(&mut b, 1, 32, &up(Format::E4M3)).unwrap();
        assert_eq!(b, want);
        assert_eq!((r.scale, r.saturated), (1.0, 0));
    }

    /// OCP FLOOR with an amax that is an f32 subnormal (2^-130): 2^(floor(log2 amax) -
    /// emax) = 2^-138 is below E8M0's range and is held at 2^-126 (both multipliers
    /// finite and non-zero), so 2^-130 and -2^-133 scale to 2^-4 and -2^-7, both exact in
    /// E4M3, and come back unchanged.
    #[test]
    fn floor_scale_of_a_subnormal_block_stays_in_range() {
        let s = BlockSpec { format: Format::E4M3, block: (1, 32), scale_format: ScaleFormat::E8M0, scale_rounding: ScaleRounding::Pow2Down, tensor_scale: false, saturate: true, stochastic: None };
        let (p130, p133) = (f32::from_bits(1 << 19), f32::from_bits(1 << 16));
        assert_eq!(block_scale(p130, &s, 1.0), (2f32.powi(126), f32::MIN_POSITIVE));
        let mut x = vec![0f32; 32];
        (x[0], x[1]) = (p130, -p133);
        let want = x.clone();
        let r = qdq_blocks(&mut x, 1, 32, &s).unwrap();
        assert_eq!(x, want);
        assert_eq!((r.underflowed, r.saturated), (0, 0));
    }

    /// E4M3 block scales: without the per-tensor scale the `global` argument is not used
    /// (amax / 6 rounded to E4M3: 12 / 6 = 2, 10 / 6 = 1.667 -> 1.625 on a step of
    /// 0.125); with it, a block whose scale rounds to E4M3 zero decodes to zeros (the
    /// stored scale code is 0), counted as underflowed: block 1 below, amax 1 under a
    /// tensor amax of 1e6, has 1 / 6 / (1e6 / 2688) = 4.5e-4 < 2^-10, half E4M3's least
    /// subnormal. Block 0's fifteen ones (scale 448 · 1e6 / 2688) round to zero as well:
    /// 31 underflows.
    #[test]
    fn e4m3_block_scales_ignore_an_unused_global_and_underflow_to_zero() {
        let mut s = BlockSpec { format: Format::E2M1, block: (1, 16), scale_format: ScaleFormat::E4M3, scale_rounding: ScaleRounding::Exact, tensor_scale: false, saturate: true, stochastic: None };
        assert_eq!(block_scale(12.0, &s, 5.0), (0.5, 2.0));
        assert_eq!(block_scale(10.0, &s, 5.0), (1.0 / 1.625, 1.625));
        s.tensor_scale = true;
        let mut x = vec![1.0f32; 32];
        x[0] = 1e6;
        let r = qdq_blocks(&mut x, 1, 32, &s).unwrap();
        assert!(x[16..].iter().all(|&v| v == 0.0), "{:?}", &x[16..]);
        assert_eq!(r.underflowed, 31);
    }

    /// Current scaling reads the amax of the whole tensor (here its last element):
    /// scale 448 / 3, so -3 is not clipped.
    #[test]
    fn current_scaling_takes_the_amax_of_the_whole_tensor() {
        let mut y = vec![0.001f32, 0.5, 0.25, -3.0];
        let spec = QuantSpec::Tensor { format: Format::E4M3, scale: None, margin: 0, saturate: true, stochastic: None };
        let r = quantize(&mut y, 2, 2, &spec).unwrap();
        assert_eq!((r.scale, r.saturated, r.amax), (448.0 / 3.0, 0, 3.0));
        assert!((y[3] + 3.0).abs() < 1e-6, "{}", y[3]);
    }

    /// Stochastic rounding draws from the element's index in the whole operand and the
    /// whole 64-bit seed: the two ELEM_GRAIN chunks of a tensor of equal values, and the
    /// equal rows of a block operand (one task, one strip per row), do not replay each
    /// other's draws; seeds that differ only in their high 32 bits draw differently.
    #[test]
    fn stochastic_draws_follow_the_element_index_and_the_whole_seed() {
        let mut v = vec![1.1f32; 2 * ELEM_GRAIN];
        qdq_tensor(&mut v, Format::E4M3, 1.0, true, Some(7)).unwrap();
        assert_ne!(v[..ELEM_GRAIN], v[ELEM_GRAIN..]);
        let mut w = vec![1.1f32; 4096];
        qdq_tensor(&mut w, Format::E4M3, 1.0, true, Some(7 | 1 << 32)).unwrap();
        assert_ne!(w[..], v[..4096]);
        let row: Vec<f32> = (0..16).map(|i| 0.3 + 0.37 * i as f32).collect();
        let mut y = row.repeat(64);
        let s = BlockSpec { format: Format::E2M1, block: (1, 16), scale_format: ScaleFormat::E4M3, scale_rounding: ScaleRounding::Exact, tensor_scale: true, saturate: true, stochastic: Some(3) };
        qdq_blocks(&mut y, 64, 16, &s).unwrap();
        assert!(y.chunks(16).any(|r| r != &y[..16]), "every row drew the same");
    }

    /// The transform's random signs: a column constant over a group of 16 is spread over
    /// the group (H·1 / 4 alone would put all of it, 4 times the value, in the first row),
    /// its norm kept.
    #[test]
    fn hadamard_signs_spread_a_constant_column() {
        for seed in [1, 5, 9] {
            let mut x = vec![1.0f32; 16];
            hadamard_rows(&mut x, 16, 1, 16, seed).unwrap();
            let top = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(top < 3.9, "seed {seed}: {x:?}");
            let n2: f32 = x.iter().map(|v| v * v).sum();
            assert!((n2 - 16.0).abs() < 1e-4, "seed {seed}: {n2}");
        }
    }

    /// RCEIL's ceiling reads every mantissa bit of amax / max: 672 / 448 = 1.5 (only the
    /// top bit set), 560 / 448 = 1.25, 9 / 6 = 1.5 (E2M1), 1.5 · 57344 (E5M2) and one f32
    /// ulp above 448 all take the next power of two, so nothing in the block overflows
    /// (RCEIL `2^ceil(log2(amax / max))`: cuBLAS's and Transformer Engine's MXFP8 rule,
    /// the rounding that OCP Microscaling Formats v1.0 §6.3 leaves to the
    /// implementation). 672 / 2 = 336 is an E4M3 tie between 320 and 352: to even, 320.
    /// Kills: a mantissa test that skips bits (bits & 0x3F_FFFF).
    #[test]
    fn rceil_rounds_up_on_any_mantissa_bit() {
        let up = |format| BlockSpec { format, block: (1, 32), scale_format: ScaleFormat::E8M0, scale_rounding: ScaleRounding::Pow2Up, tensor_scale: false, saturate: true, stochastic: None };
        let ulp_above = f32::from_bits(448f32.to_bits() + 1);
        for (a, f) in [(672.0f32, Format::E4M3), (560.0, Format::E4M3), (ulp_above, Format::E4M3), (9.0, Format::E2M1), (86016.0, Format::E5M2)] {
            assert_eq!(block_scale(a, &up(f), 1.0), (0.5, 2.0), "amax {a} {f:?}");
        }
        let mut b = vec![1.0f32; 32];
        b[7] = -672.0;
        let r = qdq_blocks(&mut b, 1, 32, &up(Format::E4M3)).unwrap();
        assert_eq!((r.saturated, r.scale, b[7]), (0, 0.5, -640.0));
    }

    /// A NaN is ignored by its block's amax in both layouts (1x32 rows go through
    /// `max_abs`, 32x1 columns through the `bc == 1` loop; the NaN is the column's last
    /// element, so a max that lets NaN in keeps it): every other element comes back as it
    /// does with the NaN replaced by 0. The values are small (|x| <= 0.034, E4M3
    /// subnormals at scale 1), so a scale other than the block's shows. A block whose amax is Inf keeps the scale 1 (TE's
    /// `isinf(amax) -> scale 1`): its finite elements round as per tensor at scale 1 and
    /// the Inf saturates to 448, where the RCEIL rule on Inf would give 2^-126, flushing
    /// them to zero and sending the Inf to 448 · 2^126 = Inf.
    /// Kills: a NaN-propagating column max; no special case for an Inf block amax.
    #[test]
    fn block_amax_ignores_nan_and_an_inf_block_keeps_scale_one() {
        let (rows, cols) = (32, 32);
        let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173 / 256.0).collect();
        let at = 31 * cols + 3;
        let mut unit = x.clone();
        qdq_tensor(&mut unit, Format::E4M3, 1.0, true, None).unwrap();
        for block in [(1, 32), (32, 1)] {
            let s = BlockSpec { format: Format::E4M3, block, scale_format: ScaleFormat::E8M0, scale_rounding: ScaleRounding::Pow2Up, tensor_scale: false, saturate: true, stochastic: None };
            let (mut want, mut got) = (x.clone(), x.clone());
            want[at] = 0.0;
            got[at] = f32::NAN;
            qdq_blocks(&mut want, rows, cols, &s).unwrap();
            let r = qdq_blocks(&mut got, rows, cols, &s).unwrap();
            assert!(got[at].is_nan());
            for i in (0..rows * cols).filter(|&i| i != at) {
                assert_eq!(got[i].to_bits(), want[i].to_bits(), "{block:?} at {i}");
            }
            assert_eq!(r.nonfinite, 1);
            let mut y = x.clone();
            y[at] = f32::INFINITY;
            let r = qdq_blocks(&mut y, rows, cols, &s).unwrap();
            assert_eq!((y[at], r.scale, r.saturated), (448.0, 1.0, 1), "{block:?}");
            let in_block: Vec<usize> = if block == (1, 32) { (31 * cols..32 * cols).collect() } else { (0..rows).map(|r| r * cols + 3).collect() };
            for i in in_block.into_iter().filter(|&i| i != at) {
                assert_eq!(y[i].to_bits(), unit[i].to_bits(), "{block:?} at {i}: {} vs {}", y[i], unit[i]);
            }
        }
    }

    /// Stochastic rounding in blocks draws from the element's index in the whole operand,
    /// as the per-tensor path does: an E2M1 operand whose every 2x16 block holds a 6
    /// (E4M3 block scale 6 / 6 = 1, no tensor scale) rounds bit for bit as `qdq_tensor`
    /// at scale 1 with the same seed, over two rayon tasks (4096 x 16 = 2 ELEM_GRAIN) and
    /// strips of two rows.
    /// Kills: a task's base index without its strips-per-task factor; a strip's second row
    /// drawing with its first row's indices.
    #[test]
    fn stochastic_blocks_draw_as_the_tensor_path_does() {
        let (rows, cols) = (4096, 16);
        let x: Vec<f32> = (0..rows * cols).map(|i| if i % 32 == 0 { 6.0 } else { (i * 7919 % 1000) as f32 / 1000.0 * 5.5 - 2.75 }).collect();
        let s = BlockSpec { format: Format::E2M1, block: (2, 16), scale_format: ScaleFormat::E4M3, scale_rounding: ScaleRounding::Exact, tensor_scale: false, saturate: true, stochastic: Some(11) };
        let (mut got, mut want) = (x.clone(), x.clone());
        qdq_blocks(&mut got, rows, cols, &s).unwrap();
        qdq_tensor(&mut want, Format::E2M1, 1.0, true, Some(11)).unwrap();
        let diff = got.iter().zip(&want).position(|(g, w)| g.to_bits() != w.to_bits());
        assert_eq!(diff, None, "first difference at {diff:?}");
    }

    /// FP32 exact block scales of a block whose amax is an f32 subnormal: 448 / 1e-40
    /// overflows, so the encode multiplier is held at f32::MAX (decode 1 / f32::MAX) and
    /// the block is still quantised on its own scale: 1e-40 · MAX = 0.034 rounds to the
    /// E4M3 0.03515625 (9 · 2^-8) and comes back as 0.03515625 / MAX, not 0.
    /// Kills: an overflowing exact scale replaced by 1 (the block then underflows).
    #[test]
    fn exact_scale_of_a_subnormal_block_is_held_at_f32_max() {
        let s = BlockSpec { format: Format::E4M3, block: (1, 32), scale_format: ScaleFormat::Fp32, scale_rounding: ScaleRounding::Exact, tensor_scale: false, saturate: true, stochastic: None };
        assert_eq!(block_scale(1e-40, &s, 1.0), (f32::MAX, 1.0 / f32::MAX));
        let mut x = vec![1e-40f32; 32];
        x[1] = -1e-40;
        let r = qdq_blocks(&mut x, 1, 32, &s).unwrap();
        assert_eq!((x[0], x[1]), (0.03515625 * (1.0 / f32::MAX), -0.03515625 * (1.0 / f32::MAX)));
        assert_eq!((r.underflowed, r.saturated, r.scale), (0, 0, f32::MAX));
    }

    /// NVFP4 with an Inf in the operand: Transformer Engine's global encode scale
    /// (`compute_global_encode_scaling_factor_FP4`, transformer_engine/common/cast/nvfp4/
    /// core_nvfp4.cuh: 448 · 6 / amax, held at FLT_MAX, and 1 where amax is 0 or the
    /// quotient is 0) is 1 for an infinite amax, so the finite blocks are quantised
    /// under their own E4M3 scales. `amax / 2688` made the decode scale Inf: every finite
    /// block's scale rounded to E4M3 zero and the block came back as zeros, with the
    /// reported scale 1 / Inf = 0.
    #[test]
    fn nvfp4_with_an_inf_keeps_the_finite_blocks() {
        assert_eq!(tensor_scale_of_blocks(f32::INFINITY, Format::E2M1), 1.0);
        assert_eq!(tensor_scale_of_blocks(0.0, Format::E2M1), 1.0);
        let mut s = BlockSpec { format: Format::E2M1, block: (1, 16), scale_format: ScaleFormat::E4M3, scale_rounding: ScaleRounding::Exact, tensor_scale: true, saturate: true, stochastic: None };
        let mut x: Vec<f32> = (0..32).map(|i| i as f32 * 0.25 - 2.0).collect();
        x[2] = f32::NEG_INFINITY;
        let mut want = x.clone();
        let r = qdq_blocks(&mut x, 1, 32, &s).unwrap();
        s.tensor_scale = false;
        qdq_blocks(&mut want, 1, 32, &s).unwrap();
        assert_eq!(x[16..], want[16..]);
        assert!(x[16..].iter().any(|&v| v != 0.0));
        assert_eq!((x[2], r.scale), (-6.0, 1.0));
    }

    /// NVFP4 on a tensor of tiny values stays finite and reads back as zeros, as Transformer
    /// Engine's (`compute_scaling_coefficient` in core_nvfp4.cuh holds a block's encode
    /// scale at FLT_MAX, and `compute_global_encode_scaling_factor_FP4` the tensor's): at
    /// an amax of 1e-40 the decode scale `sb · g` was so small its reciprocal was Inf, and
    /// a block's zeros came back NaN (0 · Inf), its other elements ±6 · d; the reported
    /// scale `1 / g` was Inf below an amax of 7.9e-36.
    #[test]
    fn nvfp4_of_tiny_values_is_finite_zeros() {
        let s = BlockSpec { format: Format::E2M1, block: (1, 16), scale_format: ScaleFormat::E4M3, scale_rounding: ScaleRounding::Exact, tensor_scale: true, saturate: true, stochastic: None };
        for amax in [1e-30f32, 1e-36, 1e-38, 1e-40, 3e-42, 1e-44] {
            let mut x: Vec<f32> = (0..32).map(|i| amax * (i as f32 - 16.0) / 16.0).collect();
            let r = qdq_blocks(&mut x, 1, 32, &s).unwrap();
            assert!(x.iter().all(|v| v.is_finite()), "amax {amax}: {x:?}");
            assert!(r.scale.is_finite() && r.scale > 0.0, "amax {amax}: scale {}", r.scale);
            // Within one step of the block's own E2M1 grid (amax / 6 · 2), or zero.
            assert!(x.iter().all(|v| v.abs() <= amax * 1.01), "amax {amax}: {x:?}");
        }
        // Where the scales are normal numbers, the values survive as usual.
        let mut x: Vec<f32> = (0..32).map(|i| 1e-30 * (i as f32 - 16.0) / 16.0).collect();
        qdq_blocks(&mut x, 1, 32, &s).unwrap();
        assert!((x[0] + 1e-30).abs() < 1e-36, "{}", x[0]);
    }

    /// Invalid shapes and scales are errors, never panics or overflows: an empty block
    /// side either way round, rows x cols past usize, a scale that is zero, negative or
    /// not finite handed to `quantize_codes`. A block taller or wider than the operand
    /// (usize::MAX rows: `block.0 · cols` overflowed usize, a panic in debug builds) is
    /// the whole operand's height or width; a Hadamard group taller than the operand
    /// (h · cols overflowed) leaves it as it is, like any partial group.
    /// Kills: the `bc == 0` check dropped (a division by zero); quantize_codes without
    /// its scale check.
    #[test]
    fn bad_shapes_and_scales_are_errors_and_oversized_blocks_clip() {
        let x0: Vec<f32> = (0..6).map(|i| i as f32 * 0.7 - 1.5).collect();
        let s = BlockSpec { format: Format::E4M3, block: (1, 32), scale_format: ScaleFormat::E8M0, scale_rounding: ScaleRounding::Pow2Up, tensor_scale: false, saturate: true, stochastic: None };
        let mut x = x0.clone();
        for block in [(1, 0), (0, 1), (0, 0)] {
            assert!(qdq_blocks(&mut x, 2, 3, &BlockSpec { block, ..s }).is_err(), "{block:?}");
        }
        assert!(qdq_blocks(&mut x, usize::MAX, 2, &s).is_err());
        assert!(quantize(&mut x, usize::MAX, 2, &QuantSpec::Blocks(s)).is_err());
        assert!(hadamard_rows(&mut x, usize::MAX, 2, 16, 1).is_err());
        let mut codes = vec![0u8; 6];
        for scale in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
            let spec = QuantSpec::Tensor { format: Format::E4M3, scale: Some(scale), margin: 0, saturate: true, stochastic: None };
            assert!(quantize_codes(&mut codes, &x0, &spec).is_err(), "scale {scale}");
            assert!(quantize(&mut x, 2, 3, &spec).is_err(), "scale {scale}");
        }
        for block in [(usize::MAX, 1), (usize::MAX, usize::MAX), (2, usize::MAX), (usize::MAX / 2 + 1, 3), (5, 2)] {
            let mut want = x0.clone();
            qdq_blocks(&mut want, 2, 3, &BlockSpec { block: (block.0.min(2), block.1.min(3)), ..s }).unwrap();
            let mut got = x0.clone();
            qdq_blocks(&mut got, 2, 3, &BlockSpec { block, ..s }).unwrap();
            assert_eq!(got, want, "{block:?}");
        }
        for (rows, cols) in [(0, 5), (5, 0), (0, 0)] {
            let r = qdq_blocks(&mut [], rows, cols, &BlockSpec { block: (2, 3), ..s }).unwrap();
            assert_eq!(r, QuantReport::default(), "{rows}x{cols}");
        }
        for h in [4usize, 1 << 40, 1 << (usize::BITS - 1)] {
            let mut y = x0.clone();
            hadamard_rows(&mut y, 2, 3, h, 1).unwrap();
            assert_eq!(y, x0, "h = {h}");
        }
    }

    /// A row longer than the inner loop's 4096-element stretch keeps each block's own
    /// scale past the stretch, and the row's ragged last block (8 of 32) takes the scale
    /// of its own amax (OCP Microscaling Formats v1.0 §6: a block shares one scale X):
    /// each 32-element block of a 1 x 8200 operand (binades 2^-10..2^9, MXFP8 RCEIL)
    /// equals that block quantised alone.
    /// Kills: the per-element scales read from the row's start in every stretch.
    #[test]
    fn long_rows_keep_each_blocks_scale() {
        let n = 8200;
        let x: Vec<f32> = (0..n).map(|i| 2f32.powi((i / 32 % 20) as i32 - 10) * (1.0 + (i % 7) as f32 / 8.0) * if i % 3 == 0 { -1.0 } else { 1.0 }).collect();
        let s = BlockSpec { format: Format::E4M3, block: (1, 32), scale_format: ScaleFormat::E8M0, scale_rounding: ScaleRounding::Pow2Up, tensor_scale: false, saturate: true, stochastic: None };
        let mut got = x.clone();
        qdq_blocks(&mut got, 1, n, &s).unwrap();
        for (b, (xb, gb)) in x.chunks(32).zip(got.chunks(32)).enumerate() {
            let mut want = xb.to_vec();
            qdq_blocks(&mut want, 1, xb.len(), &s).unwrap();
            assert_eq!(gb, &want[..], "block {b}");
        }
    }

    /// MXFP4 (E2M1 elements, E8M0 scales) under OCP MX v1.0's FLOOR rule, `X = 2^(floor(log2
    /// amax) - emax_elem)`, with emax_elem = 2 for E2M1 (OCP Microscaling Formats v1.0,
    /// §5.3, Table 1: FP4 E2M1 emax 2): a block whose amax is 7 takes X = 2^(2 - 2) = 1, so
    /// 7 rounds past 6 and clips (FLOOR can overflow) while 0.5, the smallest E2M1
    /// subnormal, survives. With emax 1 the scale was 2 and 0.5 / 2 = 0.25, a tie between 0
    /// and 0.5, went to zero.
    /// Kills: E2M1's emax taken as 1.
    #[test]
    fn mxfp4_floor_scale_takes_e2m1_emax_two() {
        let s = BlockSpec { format: Format::E2M1, block: (1, 32), scale_format: ScaleFormat::E8M0, scale_rounding: ScaleRounding::Pow2Down, tensor_scale: false, saturate: true, stochastic: None };
        assert_eq!(block_scale(7.0, &s, 1.0), (1.0, 1.0));
        assert_eq!(block_scale(0.75, &s, 1.0), (8.0, 0.125), "floor(log2 0.75) - 2 = -3");
        let mut x = vec![0.0f32; 32];
        x[..4].copy_from_slice(&[7.0, 0.5, -1.5, 3.0]);
        let r = qdq_blocks(&mut x, 1, 32, &s).unwrap();
        assert_eq!(x[..4], [6.0, 0.5, -1.5, 3.0]);
        assert_eq!((r.saturated, r.underflowed, r.scale), (1, 0, 1.0));
    }

    /// 128x128 blocks (DeepSeek-V3's weight tiles) on an operand whose strip of 128 rows
    /// (128 x 384 = 49152 elements) is longer than one rayon task's ELEM_GRAIN (32768):
    /// each strip is still a task of its own, and every block equals that block quantised
    /// alone. Kills: the tasks' strip count without its floor of one (a chunk size of 0,
    /// a panic on any weight wider than 256 columns).
    #[test]
    fn block_strips_longer_than_a_task_are_quantised() {
        let (rows, cols, b) = (256, 384, 128);
        assert!(b * cols > ELEM_GRAIN);
        let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 97.0 * 2f32.powi(((i / cols) / b * 3 + (i % cols) / b) as i32 - 3)).collect();
        let s = BlockSpec { format: Format::E4M3, block: (b, b), scale_format: ScaleFormat::Fp32, scale_rounding: ScaleRounding::Pow2Up, tensor_scale: false, saturate: true, stochastic: None };
        let mut got = x.clone();
        let r = qdq_blocks(&mut got, rows, cols, &s).unwrap();
        assert_eq!(r.elements, (rows * cols) as u64);
        for r0 in (0..rows).step_by(b) {
            for c0 in (0..cols).step_by(b) {
                let at = |r: usize, c: usize| (r0 + r) * cols + c0 + c;
                let mut want: Vec<f32> = (0..b * b).map(|i| x[at(i / b, i % b)]).collect();
                qdq_blocks(&mut want, b, b, &s).unwrap();
                for (i, w) in want.iter().enumerate() {
                    assert_eq!(got[at(i / b, i % b)].to_bits(), w.to_bits(), "block ({r0}, {c0}) element {i}");
                }
            }
        }
    }

    /// Rounding to a 16-bit float reports each count on its own: in f16, 1e-9 (below half
    /// the smallest subnormal, 2^-25) underflows, 1e6 and -7e4 (past 65520, the midpoint
    /// above 65504) become ±Inf, and ±Inf and NaN are the non-finite inputs (3, not the
    /// NaN alone); in bf16, f32::MAX rounds to Inf and 1e-45 to zero.
    /// Kills: the underflow and saturation counts swapped; Inf not counted as non-finite.
    #[test]
    fn float_rounding_counts_underflow_saturation_and_nonfinite_apart() {
        let mut x = vec![1e-9f32, 1e6, -7e4, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.0, 2.0];
        let r = quantize(&mut x, 1, 8, &QuantSpec::Float(FloatFormat::F16)).unwrap();
        assert_eq!((r.underflowed, r.saturated, r.nonfinite, r.elements), (1, 2, 3, 8));
        assert_eq!((x[0], x[1], x[2], x[7]), (0.0, f32::INFINITY, f32::NEG_INFINITY, 2.0));
        let mut y = vec![f32::MAX, 1e-45, f32::INFINITY, f32::NAN, -0.0, 2.0];
        let r = quantize(&mut y, 2, 3, &QuantSpec::Float(FloatFormat::Bf16)).unwrap();
        assert_eq!((r.underflowed, r.saturated, r.nonfinite), (1, 1, 2));
    }

    /// A group of h rows becomes `H·diag(s)·group / sqrt(h)` with H the Sylvester Hadamard
    /// matrix (`H[i][j] = (-1)^popcount(i & j)`), also when the operand is exactly one
    /// group (rows == h): the transform of the identity has column j equal to
    /// `s_j · H[:, j] / sqrt(h)`, one sign per column (checked against f64).
    /// Kills: an operand of exactly h rows left untransformed; the butterfly's difference
    /// taken the other way round (an orthogonal matrix, but not H).
    #[test]
    fn hadamard_of_one_group_is_the_sylvester_matrix_with_signs() {
        for h in [2usize, 8, 16] {
            let mut x: Vec<f32> = (0..h * h).map(|i| f32::from(u8::from(i / h == i % h))).collect();
            hadamard_rows(&mut x, h, h, h, 3).unwrap();
            let root = (h as f64).sqrt();
            for j in 0..h {
                let sign = f64::from(x[j]) * root;
                assert!((sign.abs() - 1.0).abs() < 1e-6, "h {h} column {j}: {}", x[j]);
                for i in 0..h {
                    let hij = if (i & j).count_ones() % 2 == 0 { 1.0 } else { -1.0 };
                    let want = sign.signum() * hij / root;
                    assert!((f64::from(x[i * h + j]) - want).abs() < 1e-6, "h {h} ({i}, {j}): {} vs {want}", x[i * h + j]);
                }
            }
        }
    }
}
