//! Exact storage emulation for low-precision training: bf16 rounding and FP8
//! (OCP E4M3FN / E5M2) encode, decode and scaled (de)quantisation.
//!
//! Precision-policy plugins decide which tensors are stored in bf16 or FP8; the CPU
//! executor emulates that by rounding f32 values exactly as the hardware cast would,
//! so a CPU run shows the same quantisation effects (loss deltas, under/overflow) as
//! a GPU run. Bit-level rules follow the OCP 8-bit floating point
//! specification (Micikevicius et al., arXiv 2209.05433) and PyTorch's casts
//! (its `Float8_e4m3fn.h` and `Float8_e5m2.h`):
//!
//! - round to nearest, ties to even, subnormals included; round first, then check
//!   overflow;
//! - E4M3FN: max 448 (0x7E), NaN 0x7F/0xFF, no Inf: overflow (|x| > 464 after rounding,
//!   and ±Inf) gives NaN, or ±448 when saturating;
//! - E5M2: max 57344 (0x7B), Inf 0x7C/0xFC, NaN 0x7D–0x7F: overflow (|x| >= 61440)
//!   gives ±Inf, or ±57344 when saturating;
//! - the sign of zero is kept (−0 → 0x80); NaN in gives NaN out.
//!
//! Scaled quantisation follows Transformer Engine: q = cast(x·scale),
//! x̂ = decode(q) / scale. Decoding uses a 256-entry table per format, built once.

use super::ELEM_GRAIN;
use crate::{Result, check_len};
use rayon::prelude::*;
use std::sync::OnceLock;

// ---------------------------------------------------------------------------
// bf16
// ---------------------------------------------------------------------------

/// f32 bits rounded to the nearest bf16 (ties to even), low 16 bits cleared.
/// NaN stays NaN (quieted, sign kept); overflow rounds to ±Inf as the IEEE cast does.
#[inline(always)]
fn bf16_round_bits(b: u32) -> u32 {
    let nan = (b & 0x7FFF_FFFF) > 0x7F80_0000;
    // cannot overflow u32: the largest non-NaN pattern is 0xFF80_0000 (−Inf)
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000;
    if nan {
        (b | 0x0040_0000) & 0xFFFF_0000
    } else {
        rounded
    }
}

/// Rounds every element to the nearest bf16 value in place (RNE; NaN stays NaN).
pub fn round_to_bf16(x: &mut [f32]) {
    x.par_chunks_mut(ELEM_GRAIN).for_each(|c| {
        for v in c {
            *v = f32::from_bits(bf16_round_bits(v.to_bits()));
        }
    });
}

/// The bf16 bit pattern nearest to `x` (RNE).
pub fn bf16_bits(x: f32) -> u16 {
    (bf16_round_bits(x.to_bits()) >> 16) as u16
}

/// The f32 value of a bf16 bit pattern (exact).
pub fn bf16_from_bits(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

// ---------------------------------------------------------------------------
// FP8
// ---------------------------------------------------------------------------

/// An 8-bit float format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    /// 4 exponent bits (bias 7), 3 mantissa bits, no Inf (`float8_e4m3fn`).
    E4M3,
    /// 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like Inf/NaN (`float8_e5m2`).
    E5M2,
}

impl Fp8Format {
    /// Largest finite value: 448 or 57344 (the quantiser's [`super::quant::Format::max`]).
    pub fn max_finite(self) -> f32 {
        match self {
            Fp8Format::E4M3 => super::quant::Format::E4M3.max(),
            Fp8Format::E5M2 => super::quant::Format::E5M2.max(),
        }
    }

    /// (mantissa bits, exponent bias, code of +max, code of the non-saturated overflow).
    fn params(self) -> (i32, i32, u8, u8) {
        match self {
            Fp8Format::E4M3 => (3, 7, 0x7E, 0x7F),
            Fp8Format::E5M2 => (2, 15, 0x7B, 0x7C),
        }
    }
}

/// 2^e for e in the f32 normal range.
#[inline]
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// Encodes x; the flag says whether it overflowed (finite or infinite input beyond
/// the format's range after rounding).
#[inline]
fn encode(x: f32, f: Fp8Format, saturate: bool) -> (u8, bool) {
    let (mbits, bias, max_code, ovf_code) = f.params();
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    let a = x.abs();
    if a.is_nan() {
        return (sign | 0x7F, false);
    }
    let overflow = (sign | if saturate { max_code } else { ovf_code }, true);
    if a.is_infinite() {
        return overflow;
    }
    if a == 0.0 {
        return (sign, false);
    }
    let emin = 1 - bias;
    // unbiased exponent of a; f32 subnormals read as −127 and clamp to emin below
    let e = ((a.to_bits() >> 23) as i32 - 127).max(emin);
    // a / 2^(e − mbits): exact (power-of-two scaling of a value that only grows or
    // stays normal), lands in [0, 2^(mbits+1)); round to an integer, ties to even
    let scaled = a * pow2(mbits - e);
    let mut n = scaled.round_ties_even() as i32;
    if n == 0 {
        return (sign, false);
    }
    let mut e = e;
    if n == 1 << (mbits + 1) {
        n >>= 1;
        e += 1;
    }
    let (field, mant) = if n < 1 << mbits {
        (0, n)
    } else {
        (e + bias, n - (1 << mbits))
    };
    let code = (field << mbits) | mant;
    let too_big = match f {
        Fp8Format::E4M3 => code > 0x7E,
        Fp8Format::E5M2 => code > 0x7B,
    };
    if too_big {
        overflow
    } else {
        (sign | code as u8, false)
    }
}

/// Encodes one value: RNE (subnormals too), rounding before the overflow check.
/// Overflow gives ±max if `saturate`, else NaN (E4M3) or ±Inf (E5M2). NaN → NaN,
/// −0 → 0x80.
pub fn fp8_encode(x: f32, f: Fp8Format, saturate: bool) -> u8 {
    encode(x, f, saturate).0
}

fn decode_exact(b: u8, f: Fp8Format) -> f32 {
    let (mbits, bias, _, _) = f.params();
    let neg = b & 0x80 != 0;
    let field = ((b & 0x7F) >> mbits) as i32;
    let mant = (b & ((1 << mbits) - 1)) as i32;
    let mag = match f {
        Fp8Format::E4M3 if b & 0x7F == 0x7F => f64::NAN,
        Fp8Format::E5M2 if field == 31 => {
            if mant == 0 {
                f64::INFINITY
            } else {
                f64::NAN
            }
        }
        _ if field == 0 => mant as f64 * 2f64.powi(1 - bias - mbits),
        _ => (1.0 + mant as f64 / (1 << mbits) as f64) * 2f64.powi(field - bias),
    };
    (if neg { -mag } else { mag }) as f32
}

fn table(f: Fp8Format) -> &'static [f32; 256] {
    static TABLES: OnceLock<[[f32; 256]; 2]> = OnceLock::new();
    let t = TABLES.get_or_init(|| {
        [Fp8Format::E4M3, Fp8Format::E5M2]
            .map(|f| std::array::from_fn(|b| decode_exact(b as u8, f)))
    });
    match f {
        Fp8Format::E4M3 => &t[0],
        Fp8Format::E5M2 => &t[1],
    }
}

/// The exact f32 value of an FP8 code (table lookup).
pub fn fp8_decode(b: u8, f: Fp8Format) -> f32 {
    table(f)[b as usize]
}

/// What a quantisation did to the data (for precision-policy decisions).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QuantStats {
    /// max |x| over the input before scaling (NaNs ignored).
    pub amax: f32,
    /// Elements whose scaled value was beyond the format's range after rounding
    /// (including ±Inf): clamped to ±max if saturating, else NaN/Inf.
    pub saturated: usize,
    /// Nonzero finite inputs that became ±0.
    pub underflowed: usize,
}

/// q[i] = encode(x[i]·scale); returns amax of x and saturation/underflow counts.
///
/// # Errors
/// `ShapeMismatch` if `out` and `x` differ in length, or the scale is not finite and
/// positive.
pub fn fp8_quantize(
    out: &mut [u8],
    x: &[f32],
    scale: f32,
    f: Fp8Format,
    saturate: bool,
) -> Result<QuantStats> {
    let r = super::quant::fp8_codes(out, x, scale, f, saturate)?;
    Ok(QuantStats { amax: r.amax, saturated: r.saturated as usize, underflowed: r.underflowed as usize })
}

/// x[i] = decode(q[i]) / scale.
///
/// # Errors
/// `ShapeMismatch` if `out` and `q` differ in length, or the scale is not finite and
/// positive (0 gave ±Inf, a negative scale flipped every sign).
pub fn fp8_dequantize(out: &mut [f32], q: &[u8], scale: f32, f: Fp8Format) -> Result<()> {
    check_len("fp8_dequantize out", out.len(), q.len())?;
    super::quant::check_scale(scale)?;
    let t = table(f);
    out.par_chunks_mut(ELEM_GRAIN)
        .zip(q.par_chunks(ELEM_GRAIN))
        .for_each(|(o, q)| {
            for (o, &b) in o.iter_mut().zip(q) {
                *o = t[b as usize] / scale;
            }
        });
    Ok(())
}

// ---------------------------------------------------------------------------
// Storage emulation: round an f32 tensor to what a narrower format would hold
// ---------------------------------------------------------------------------

/// Rounds every element to the nearest IEEE half-precision value in place (RNE,
/// subnormals included; beyond 65504 after rounding → ±Inf, as the IEEE cast does; NaN
/// stays NaN).
pub fn round_to_f16(x: &mut [f32]) {
    const MBITS: i32 = 10;
    const EMIN: i32 = -14;
    x.par_chunks_mut(ELEM_GRAIN).for_each(|c| {
        for v in c {
            let a = v.abs();
            if !a.is_finite() || a == 0.0 {
                continue;
            }
            // The spacing of f16 values around a: 2^(e − 10), e clamped at the subnormal
            // exponent. Scaling by a power of two is exact, so one rounding happens.
            let e = ((a.to_bits() >> 23) as i32 - 127).max(EMIN);
            let r = (a * pow2(MBITS - e)).round_ties_even() * pow2(e - MBITS);
            let r = if r > 65504.0 { f32::INFINITY } else { r };
            *v = r.copysign(*v);
        }
    });
}

/// Transformer Engine's per-tensor scale for a tensor whose max |x| is `amax`:
/// `fp8_max / amax`, with TE's edge cases (amax 0, Inf or NaN → 1; a scale that
/// overflows → f32::MAX).
pub fn fp8_current_scale(amax: f32, f: Fp8Format) -> f32 {
    if !amax.is_finite() || amax == 0.0 {
        return 1.0;
    }
    let s = f.max_finite() / amax;
    if s.is_finite() { s } else { f32::MAX }
}

/// Rounds `x` in place to what an FP8 tensor with per-tensor current scaling holds
/// (`x̂ = RNE(x·scale) / scale`, saturating, the scale from this tensor's own amax);
/// returns the scale.
pub fn round_to_fp8_current(x: &mut [f32], f: Fp8Format) -> f32 {
    let q = match f {
        Fp8Format::E4M3 => super::quant::Format::E4M3,
        Fp8Format::E5M2 => super::quant::Format::E5M2,
    };
    let scale = fp8_current_scale(super::quant::amax(x), f);
    // The scale is finite and positive by construction, so this cannot fail.
    let _ = super::quant::qdq_tensor(x, q, scale, true, None);
    scale
}

/// MX block of 32 elements (OCP MX v1.0).
pub const MX_BLOCK: usize = 32;

/// The E8M0 block scale of an MX block whose max |x| is `amax`, by the RCEIL rule that
/// cuBLAS and Transformer Engine use: `2^ceil(log2(amax / fp8_max))`, which never
/// overflows the element format. 1 for an all-zero (or non-finite) block.
///
/// The exponent needs no clamp to E8M0's range 2^−127..2^127: for a finite amax,
/// r = amax / fp8_max is at most f32::MAX / 448 < 2^120, so the exponent is at most 120
/// (113 for E5M2); and an r below 2^−126 (an f32 subnormal, or 0 after underflow) takes
/// 2^−126, so it is at least −126. The scale is thus always a normal f32. 2^−126 is the
/// floor `quant`'s block scales keep too (both multipliers normal), which
/// [`round_to_mxfp8`] uses; E8M0 could hold 2^−127, which Transformer Engine's software
/// path gives an r ≤ 2^−127: blocks whose amax is below 448·2^−127 ≈ 2.6e-36.
pub fn mx_scale_rceil(amax: f32, f: Fp8Format) -> f32 {
    if !amax.is_finite() || amax == 0.0 {
        return 1.0;
    }
    let r = amax / f.max_finite();
    let bits = r.to_bits();
    let (exp, mant) = ((bits >> 23) as i32 - 127, bits & 0x7F_FFFF);
    // ceil(log2 r): r's exponent, plus one unless r is a power of two; a subnormal r
    // (exponent field 0) is below 2^−126 and takes that floor.
    let e = if exp == -127 { -126 } else if mant == 0 { exp } else { exp + 1 };
    pow2(e)
}

/// Rounds `x` in place to what an MXFP8 tensor (E4M3 elements, one E8M0 scale per 32
/// consecutive elements of each row of length `row`) holds. A row whose length is not
/// a multiple of 32 ends in a shorter block with its own scale, from the elements it
/// holds (as if padded with zeros to 32).
///
/// # Errors
/// `ShapeMismatch` unless `x` is whole rows ([`mx_rows`]); `x` is then untouched.
pub fn round_to_mxfp8(x: &mut [f32], row: usize) -> Result<()> {
    use super::quant::{BlockSpec, Format, ScaleFormat, ScaleRounding, qdq_blocks};
    let rows = mx_rows(x.len(), row)?;
    if rows == 0 {
        return Ok(());
    }
    let spec = BlockSpec {
        format: Format::E4M3,
        block: (1, MX_BLOCK),
        scale_format: ScaleFormat::E8M0,
        scale_rounding: ScaleRounding::Pow2Up,
        tensor_scale: false,
        saturate: true,
        stochastic: None,
    };
    qdq_blocks(x, rows, row, &spec).map(|_| ())
}

/// The rows of `row` elements in an MXFP8 buffer of `len` elements, for the CPU's
/// [`round_to_mxfp8`] and the CUDA backend's launch alike.
///
/// Every caller passes the tensor's last dimension, so a buffer that is not whole rows
/// is a caller's bug: its whole rows used to be rounded and the ragged tail silently
/// left as it was. Refusing names the bug instead.
///
/// # Errors
/// `ShapeMismatch` unless `len` is a multiple of `row` (a `row` of 0 only for `len` 0).
pub fn mx_rows(len: usize, row: usize) -> Result<usize> {
    if len == 0 {
        return Ok(0);
    }
    // (a row of 0 divides only a length of 0)
    if !len.is_multiple_of(row) {
        return crate::shape_err(format!("mxfp8: {len} elements are not whole rows of {row}"));
    }
    Ok(len / row)
}

#[cfg(test)]
mod tests {
    use super::Fp8Format::{E4M3, E5M2};
    use super::*;
    use crate::reference::{self as r, check::*};
    use rand::Rng as _;

    fn p2(e: i32) -> f32 {
        2f32.powi(e)
    }

    #[test]
    fn bf16_matches_half_crate_and_rounds_ties_to_even() {
        let mut rng = rng(80);
        let mut xs: Vec<f32> = (0..200_000).map(|_| f32::from_bits(rng.random())).collect();
        xs.extend([
            0.0,
            -0.0,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-45,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        for &x in &xs {
            let want = half::bf16::from_f32(x);
            if x.is_nan() {
                assert!(bf16_from_bits(bf16_bits(x)).is_nan());
            } else {
                assert_eq!(
                    bf16_bits(x),
                    want.to_bits(),
                    "x = {x:e} ({:#x})",
                    x.to_bits()
                );
            }
        }
        let mut y = xs.clone();
        round_to_bf16(&mut y);
        for (a, b) in xs.iter().zip(&y) {
            if a.is_nan() {
                assert!(b.is_nan());
            } else {
                assert_eq!(*b, bf16_from_bits(bf16_bits(*a)));
            }
        }
        // bf16 has 7 stored mantissa bits: ulp(1) = 2^-7
        assert_eq!(bf16_from_bits(bf16_bits(1.0 + p2(-8))), 1.0); // tie → even (down)
        assert_eq!(bf16_from_bits(bf16_bits(1.0 + 3.0 * p2(-8))), 1.0 + p2(-6)); // tie → even (up)
        assert_eq!(
            bf16_from_bits(bf16_bits(1.0 + p2(-8) + p2(-20))),
            1.0 + p2(-7)
        ); // above tie
        assert_eq!(bf16_bits(f32::MAX), 0x7F80); // overflow → Inf
        assert_eq!(bf16_bits(-0.0), 0x8000);
    }

    #[test]
    fn fp8_facts_from_the_notes() {
        // E4M3FN
        assert_eq!(fp8_encode(448.0, E4M3, false), 0x7E);
        assert_eq!(fp8_decode(0x7E, E4M3), 448.0);
        assert_eq!(fp8_encode(464.0, E4M3, false), 0x7E); // tie at 464 → even (448)
        assert_eq!(fp8_encode(464.01, E4M3, false), 0x7F); // rounds past max → NaN
        assert_eq!(fp8_encode(464.01, E4M3, true), 0x7E);
        assert_eq!(fp8_encode(-500.0, E4M3, true), 0xFE);
        assert_eq!(fp8_encode(480.0, E4M3, false), 0x7F);
        assert_eq!(fp8_encode(1e30, E4M3, false), 0x7F);
        assert_eq!(fp8_encode(f32::INFINITY, E4M3, false), 0x7F);
        assert_eq!(fp8_encode(f32::NEG_INFINITY, E4M3, true), 0xFE);
        assert!(fp8_decode(0x7F, E4M3).is_nan() && fp8_decode(0xFF, E4M3).is_nan());
        assert_eq!(fp8_encode(f32::NAN, E4M3, true) & 0x7F, 0x7F);
        assert_eq!(fp8_encode(p2(-6), E4M3, false), 0x08); // min normal
        assert_eq!(fp8_encode(p2(-9), E4M3, false), 0x01); // min subnormal
        assert_eq!(fp8_encode(p2(-10), E4M3, false), 0x00); // half of it: tie → 0
        assert_eq!(fp8_encode(1.5 * p2(-10), E4M3, false), 0x01);
        assert_eq!(fp8_encode(-p2(-10), E4M3, false), 0x80); // sign kept on underflow
        assert_eq!(fp8_encode(-0.0, E4M3, false), 0x80);
        assert_eq!(fp8_encode(0.0, E4M3, false), 0x00);
        assert_eq!(fp8_encode(0.125, E4M3, false), 0x20); // machine epsilon
        assert_eq!(fp8_encode(1.0, E4M3, false), 0x38);
        assert_eq!(fp8_encode(1.0625, E4M3, false), 0x38); // tie between 1 and 1.125 → even
        assert_eq!(fp8_encode(1.1875, E4M3, false), 0x3A); // tie 1.125/1.25 → even (1.25)
        assert_eq!(fp8_encode(7.5 * p2(-9), E4M3, false), 0x08); // top subnormal rounds into normal
        assert_eq!(fp8_decode(0x01, E4M3), p2(-9));
        assert_eq!(fp8_decode(0x80, E4M3).to_bits(), (-0.0f32).to_bits());
        // E5M2
        assert_eq!(fp8_encode(57344.0, E5M2, false), 0x7B);
        assert_eq!(fp8_encode(61439.0, E5M2, false), 0x7B);
        assert_eq!(fp8_encode(61440.0, E5M2, false), 0x7C); // tie → even = 2^16 → Inf
        assert_eq!(fp8_encode(61440.0, E5M2, true), 0x7B);
        assert_eq!(fp8_encode(-1e9, E5M2, false), 0xFC);
        assert_eq!(fp8_encode(f32::INFINITY, E5M2, false), 0x7C);
        assert_eq!(fp8_decode(0x7C, E5M2), f32::INFINITY);
        assert_eq!(fp8_decode(0xFC, E5M2), f32::NEG_INFINITY);
        for b in [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF] {
            assert!(fp8_decode(b, E5M2).is_nan());
        }
        assert_eq!(fp8_encode(p2(-14), E5M2, false), 0x04); // min normal
        assert_eq!(fp8_encode(p2(-16), E5M2, false), 0x01); // min subnormal
        assert_eq!(fp8_encode(p2(-17), E5M2, false), 0x00);
        assert_eq!(fp8_encode(1.5 * p2(-17), E5M2, false), 0x01);
        assert_eq!(fp8_encode(0.25, E5M2, false), 0x34); // machine epsilon
        assert_eq!(fp8_encode(f32::NAN, E5M2, false) & 0x7F, 0x7F);
        assert_eq!(fp8_encode(-0.0, E5M2, false), 0x80);
        // f32 subnormal input
        assert_eq!(fp8_encode(1e-45, E4M3, false), 0x00);
        assert_eq!(fp8_encode(-1e-45, E5M2, false), 0x80);
    }

    #[test]
    fn fp8_every_code_round_trips() {
        for f in [E4M3, E5M2] {
            let mut finite = 0;
            for b in 0..=255u8 {
                let x = fp8_decode(b, f);
                assert_eq!(x.to_bits(), decode_exact(b, f).to_bits());
                if x.is_nan() {
                    continue;
                }
                assert_eq!(
                    fp8_decode(fp8_encode(x, f, false), f).to_bits(),
                    x.to_bits(),
                    "{f:?} {b:#04x}"
                );
                assert_eq!(fp8_encode(x, f, false), b, "{f:?} {b:#04x}");
                if x.is_finite() {
                    finite += 1;
                    assert_eq!(fp8_encode(x, f, true), b);
                }
            }
            assert_eq!(finite, if f == E4M3 { 254 } else { 248 }); // less 2 NaN, or 6 NaN + 2 Inf
        }
    }

    /// Against an exact nearest-value search (reference.rs) at every midpoint between
    /// adjacent codes, one f32 ulp either side of it, and random values over the
    /// whole exponent range.
    #[test]
    fn fp8_encode_matches_exact_nearest_search() {
        let mut rng = rng(81);
        for f in [E4M3, E5M2] {
            let rf = f;
            let vals = r::fp8_values(rf);
            let mut xs = Vec::new();
            for w in vals.windows(2) {
                let mid = ((w[0].1 + w[1].1) / 2.0) as f32; // exact: midpoints fit f32
                xs.extend([
                    mid,
                    f32::from_bits(mid.to_bits() + 1),
                    f32::from_bits(mid.to_bits().saturating_sub(1)),
                ]);
            }
            let top = vals.last().unwrap().1 as f32;
            let next = (vals.last().unwrap().1 * 2.0 - vals[vals.len() - 2].1) as f32;
            let mid = (top + next) / 2.0;
            xs.extend([
                mid,
                f32::from_bits(mid.to_bits() + 1),
                f32::from_bits(mid.to_bits() - 1),
                next,
                1e38,
            ]);
            for _ in 0..100_000 {
                let e = rng.random_range(-30..20);
                xs.push(rng.random_range(1.0f32..2.0) * p2(e));
            }
            for &x in &xs {
                for sign in [1.0f32, -1.0] {
                    for sat in [false, true] {
                        let v = sign * x;
                        assert_eq!(
                            fp8_encode(v, f, sat),
                            r::fp8_encode(v as f64, rf, sat),
                            "{f:?} x={v:e} sat={sat}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn fp8_quantize_dequantize_with_scale_and_stats() {
        let x = [1.0f32, -3.0, 0.001, 0.0, 1e-9, 200.0, f32::NAN, -0.0];
        let scale = 448.0 / 3.0; // amax 3 maps to the E4M3 max
        let mut q = [0u8; 8];
        let st = fp8_quantize(&mut q, &x, scale, E4M3, true).unwrap();
        assert_eq!(st.amax, 200.0);
        assert_eq!(st.saturated, 1); // 200·149.3 ≫ 448
        assert_eq!(st.underflowed, 1); // 1e-9·149.3 < 2^-10
        assert_eq!(q[1], 0xFE); // −3·scale = −448
        assert_eq!(q[5], 0x7E);
        assert_eq!(q[7], 0x80);
        for (i, &xi) in x.iter().enumerate() {
            assert_eq!(q[i], fp8_encode(xi * scale, E4M3, true));
        }
        let mut back = [0f32; 8];
        fp8_dequantize(&mut back, &q, scale, E4M3).unwrap();
        assert_eq!(back[1], -3.0);
        assert!((back[0] - 1.0).abs() <= 0.0625 * 1.0); // 3-bit mantissa: half-ulp 1/16 rel.
        assert!(back[6].is_nan());
        for i in 0..8 {
            let want = fp8_decode(q[i], E4M3) / scale;
            assert!(back[i].to_bits() == want.to_bits() || (back[i].is_nan() && want.is_nan()));
        }
        // non-saturating E5M2 overflow counts too, and gives Inf
        let mut q2 = [0u8; 2];
        let st = fp8_quantize(&mut q2, &[1e6, 1.0], 1.0, E5M2, false).unwrap();
        assert_eq!((st.saturated, q2[0]), (1, 0x7C));
        // large input across rayon chunks
        let mut rng = rng(82);
        let big = randn(&mut rng, 100_001);
        let mut qb = vec![0u8; big.len()];
        let st = fp8_quantize(&mut qb, &big, 100.0, E4M3, false).unwrap();
        assert_eq!(st.amax, big.iter().fold(0f32, |a, b| a.max(b.abs())));
        assert_eq!(
            st.saturated,
            big.iter().filter(|v| (**v * 100.0).abs() > 464.0).count()
        );
        assert!(fp8_quantize(&mut qb[..3], &big, 1.0, E4M3, false).is_err());
        assert!(fp8_dequantize(&mut back[..3], &q, 1.0, E4M3).is_err());
        // A scale that is not finite and positive is refused both ways (0 gave zeros and
        // ±Inf, a negative one flipped every sign, each reported as that scale).
        for bad in [0.0, -2.0, f32::NAN, f32::INFINITY] {
            let e = fp8_quantize(&mut qb, &big, bad, E4M3, true).unwrap_err();
            assert!(format!("{e:?}").contains("not finite and positive"), "{e:?}");
            assert!(fp8_dequantize(&mut back, &q, bad, E5M2).is_err(), "{bad}");
        }
    }

    #[test]
    fn f16_rounding_matches_the_half_crate() {
        let mut rng = rng(31);
        let mut x: Vec<f32> = (0..20000)
            .map(|i| {
                let m: f32 = rng.random_range(-1.0..1.0);
                m * 2f32.powi(i % 40 - 28)
            })
            .collect();
        x.extend([65504.0, 65519.0, 65520.0, -70000.0, 6.0e-8, 2.9e-8, 3.0e-8, 1e-10, -0.0, f32::INFINITY]);
        let want: Vec<f32> = x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
        let mut got = x.clone();
        round_to_f16(&mut got);
        for ((g, w), v) in got.iter().zip(&want).zip(&x) {
            assert_eq!(g.to_bits(), w.to_bits(), "f16({v:e}): {g:e} vs {w:e}");
        }
    }

    #[test]
    fn fp8_current_scaling_storage_is_quantize_then_dequantize() {
        let mut rng = rng(32);
        for f in [E4M3, E5M2] {
            let x: Vec<f32> = (0..5000).map(|_| rng.random_range(-3.0f32..3.0)).collect();
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let mut got = x.clone();
            let scale = round_to_fp8_current(&mut got, f);
            assert_eq!(scale, f.max_finite() / amax);
            let mut q = vec![0u8; x.len()];
            fp8_quantize(&mut q, &x, scale, f, true).unwrap();
            let mut want = vec![0f32; x.len()];
            fp8_dequantize(&mut want, &q, scale, f).unwrap();
            assert_eq!(got, want, "{f:?}");
            // The largest magnitude lands exactly on the format's maximum.
            assert!(got.iter().any(|v| (v.abs() * scale / f.max_finite() - 1.0).abs() < 1e-6));
        }
        assert_eq!(fp8_current_scale(0.0, E4M3), 1.0);
        assert_eq!(fp8_current_scale(f32::INFINITY, E4M3), 1.0);
        assert_eq!(fp8_current_scale(1e-45, E4M3), f32::MAX);
        // Transformer Engine's current scaling: scale = max / amax (margin 0), 448/3 at amax 3.
        assert_eq!(fp8_current_scale(3.0, E4M3), 448.0 / 3.0);
    }

    #[test]
    fn mxfp8_blocks_use_rceil_power_of_two_scales() {
        // amax 1000 gives X = 4 under RCEIL (FLOOR would give 2 and overflow).
        assert_eq!(mx_scale_rceil(1000.0, E4M3), 4.0);
        assert_eq!(mx_scale_rceil(448.0, E4M3), 1.0);
        assert_eq!(mx_scale_rceil(448.1, E4M3), 2.0);
        assert_eq!(mx_scale_rceil(0.0, E4M3), 1.0);
        let mut rng = rng(33);
        // Rows of 80: two full blocks and one of 16; magnitudes differ by block.
        let row = 80;
        let x: Vec<f32> = (0..row * 7)
            .map(|i| rng.random_range(-1.0f32..1.0) * 2f32.powi((i / 16 % 9) as i32 * 3 - 12))
            .collect();
        let mut got = x.clone();
        round_to_mxfp8(&mut got, row).unwrap();
        for (r, (xr, gr)) in x.chunks(row).zip(got.chunks(row)).enumerate() {
            for (xb, gb) in xr.chunks(MX_BLOCK).zip(gr.chunks(MX_BLOCK)) {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                let s = mx_scale_rceil(amax, E4M3);
                assert_eq!(s.to_bits() & 0x7F_FFFF, 0, "row {r}: scale {s} is a power of two");
                for (&v, &g) in xb.iter().zip(gb) {
                    let y = v / s;
                    assert!(y.abs() <= 448.0);
                    let want = fp8_decode(fp8_encode(y, E4M3, true), E4M3) * s;
                    assert_eq!(g.to_bits(), want.to_bits(), "row {r}: {v:e}");
                }
            }
        }
    }

    /// A NaN keeps its sign in the scalar encoder, as in the vector cast
    /// (`quant::fp8_codes`, which gives 0xFF for -NaN): S.1111.111 (E4M3) and
    /// S.11111.11 (E5M2) are NaN of either sign in OCP FP8.
    #[test]
    fn fp8_nan_codes_keep_the_sign() {
        for f in [E4M3, E5M2] {
            for sat in [true, false] {
                assert_eq!(fp8_encode(f32::NAN, f, sat), 0x7F, "{f:?}");
                assert_eq!(fp8_encode(-f32::NAN, f, sat), 0xFF, "{f:?}");
                let mut q = [0u8; 2];
                fp8_quantize(&mut q, &[f32::NAN, -f32::NAN], 1.0, f, sat).unwrap();
                assert_eq!(q, [0x7F, 0xFF], "{f:?} sat={sat}");
            }
        }
    }

    /// Current scaling saturates, as documented: an Inf makes the amax Inf, so the scale
    /// is 1 (TE's edge case) and the Inf lands on ±448 (E4M3's satfinite cast), not NaN;
    /// NaN stays NaN.
    #[test]
    fn current_scaling_saturates_an_inf() {
        let mut x = [1.0f32, f32::INFINITY, -2.0, f32::NEG_INFINITY, f32::NAN];
        assert_eq!(round_to_fp8_current(&mut x, E4M3), 1.0);
        assert_eq!(x[..4], [1.0, 448.0, -2.0, -448.0]);
        assert!(x[4].is_nan());
    }

    /// MXFP8 rows of 40 are a block of 32 and a short one of 8, each with its own scale; a
    /// buffer that ends in a partial row is refused and left as it is (its whole rows
    /// used to be rounded, the tail silently not).
    /// Block of 32: amax 1000, RCEIL X = 4; 1000 / 4 = 250 -> 256 (E4M3 step 16 in
    /// [128, 256)) -> 1024, 250 / 4 = 62.5 -> 64 (step 4 in [32, 64)) -> 256. Block of 8: amax 3, X = 2^ceil(log2(3 / 448)) = 2^-7, 1.1 · 128
    /// = 140.8 -> 144 (step 16 in [128, 256)) -> 1.125; 3 · 128 = 384 exact.
    #[test]
    fn mxfp8_rounds_short_final_blocks_and_refuses_a_partial_row() {
        let row = 40;
        let mut x = vec![0f32; 2 * row];
        for r in 0..2 {
            x[r * row] = 1000.0;
            x[r * row + 1] = -250.0;
            x[r * row + 32] = 3.0;
            x[r * row + 33] = -1.1;
        }
        let orig = x.clone();
        round_to_mxfp8(&mut x, row).unwrap();
        for r in 0..2 {
            assert_eq!(x[r * row..r * row + 2], [1024.0, -256.0], "row {r}");
            assert_eq!(x[r * row + 32..r * row + 34], [3.0, -1.125], "row {r}");
        }
        let mut y = orig.clone();
        y.extend([1.1; 5]);
        let e = round_to_mxfp8(&mut y, row).unwrap_err().to_string();
        assert!(e.contains("85 elements are not whole rows of 40"), "{e}");
        assert_eq!(y[..2 * row], orig[..], "untouched");
        assert!(y[2 * row..].iter().all(|&v| v == 1.1));
        // A row of 0 holds nothing: only an empty buffer is whole rows of it.
        assert!(round_to_mxfp8(&mut y, 0).is_err());
        assert_eq!(mx_rows(0, 0), Ok(0));
        assert_eq!(mx_rows(80, 40), Ok(2));
        assert!(mx_rows(80, 30).is_err());
    }

    /// The RCEIL scale of any finite amax is a normal power of two from 2^−126 (an
    /// amax / 448 below that, subnormal or 0 after underflow) to 2^120 (f32::MAX / 448 <
    /// 2^120), so it needs no clamp; and it is the scale `round_to_mxfp8` uses at both
    /// ends (values 2^−126·{100, 50, …}: amax / 448 subnormal).
    #[test]
    fn mx_scale_rceil_spans_2_pow_minus_126_to_2_pow_120() {
        assert_eq!(mx_scale_rceil(f32::MAX, E4M3), p2(120));
        assert_eq!(mx_scale_rceil(f32::MAX, E5M2), p2(113));
        assert_eq!(mx_scale_rceil(448.0 * p2(-126), E4M3), p2(-126));
        assert_eq!(mx_scale_rceil(448.0 * p2(-126) * 1.5, E4M3), p2(-125));
        assert_eq!(mx_scale_rceil(100.0 * p2(-126), E4M3), p2(-126));
        assert_eq!(mx_scale_rceil(f32::from_bits(1), E4M3), p2(-126));
        for (amax, s) in [(100.0 * p2(-126), p2(-126)), (3e38, p2(120))] {
            let x: Vec<f32> = (0..MX_BLOCK).map(|i| amax / (1 + i % 7) as f32 * if i % 2 == 0 { 1.0 } else { -1.0 }).collect();
            let mut got = x.clone();
            round_to_mxfp8(&mut got, MX_BLOCK).unwrap();
            for (&v, &g) in x.iter().zip(&got) {
                let want = fp8_decode(fp8_encode(v / s, E4M3, true), E4M3) * s;
                assert_eq!(g.to_bits(), want.to_bits(), "amax {amax:e}: {v:e}");
            }
        }
    }
}
