//! The number-format kernels (`cuda/precision.cu`, `cuda/quant.cu` and `common.cuh`'s
//! conversions) and the MoE router (`cuda/moe.cu`) under the emulation, launched as the
//! CUDA backend launches them (`host/exec/src/cuda/mod.rs`) and compared with what the
//! CPU backend (`host/exec/src/cpu.rs`) computes with `runner_kernels::cpu`:
//!
//! - `cast` from f32 into bf16, f16 and FP8 (`quantize_current`: the destination's meta
//!   zeroed, `amax_f32` into it, `fp8_scale_from_amax`, `fp8_quantize`) and back
//!   (`widen`); `round_to_storage` for bf16, f16, E4M3, E5M2 and MXFP8;
//! - `quantize_fp8_codes` (the meta set to [scale, 1/scale, 0, 0], a zeroed statistics
//!   record, `amax_f32` for a current scale, `quant_tensor_codes`, `keep_amax`) with given
//!   and current scales, saturating or not;
//! - `quantize` (`quant_float`, `quant_tensor`, `quant_block_amax` + `quant_blocks`);
//! - `router_forward`, softmax and sigmoid top-k.
//!
//! A GPU run must store the bits a CPU run stores, so codes are compared byte for byte,
//! f32 results bit for bit (any NaN matches any NaN: payloads are not part of the
//! contract), and the statistics record read as `CudaQuantStats::report` reads it must
//! give the CPU's `QuantReport` exactly. The router's probabilities come from different
//! `exp`s (CUDA's `expf`, the CPU's polynomial), so they are compared to 1e-6; its
//! expert indices exactly.

use runner_kernels::cpu::moe::{Router, ScoreFn, router_forward};
use runner_kernels::cpu::precision::{self as prec, Fp8Format};
use runner_kernels::cpu::quant::{self, BlockSpec, FloatFormat, Format, QuantReport, QuantSpec, ScaleFormat, ScaleRounding};

use super::{A, Emu, error, launcher_or_skip, normals};

/// 4-byte words of the backend's statistics record (`STATS_WORDS`): saturated,
/// underflowed and non-finite counts (3 x u64), the amax, the current-scaling amax.
const STATS_WORDS: usize = 8;
/// Byte offsets of the amax and the current-scaling amax in the record.
const STATS_AMAX: u64 = 24;
const STATS_CUR: u64 = 28;

/// What code and half-precision outputs start as, so an element no kernel wrote shows
/// (0xA5: a code that none of the edge cases has).
const FILL: u8 = 0xA5;

/// The FP8 formats and the codes the kernels take for them (`fmt_code`).
const FP8: [(Fp8Format, Format, i32); 2] = [(Fp8Format::E4M3, Format::E4M3, 0), (Fp8Format::E5M2, Format::E5M2, 1)];

/// Row length of the MXFP8 rounding: not a multiple of 32, so each row ends in a short
/// block, and the inputs not a multiple of it, so a tail is left alone.
const MX_ROW: usize = 100;

/// The inputs: zeros of both signs; values that underflow every format; each format's
/// largest value and what lies past it (65504, 65520, 70000 for f16; 448, 464, 465, 480
/// for E4M3; 57344, 61440 for E5M2; f32::MAX for bf16); Inf and NaN of both signs; ties
/// of bf16 and f16; every midpoint between neighbouring FP8 codes, both signs (ties while
/// the scale is 1, where the rounding direction shows); 4000 normals of std 30.
fn inputs() -> Vec<f32> {
    let p2 = |e: i32| 2f32.powi(e);
    let mut xs = vec![
        0.0,
        -0.0,
        1e-30,
        -1e-8,
        1e-45,
        f32::MIN_POSITIVE,
        65504.0,
        65519.0,
        65520.0,
        70000.0,
        -70000.0,
        448.0,
        464.0,
        465.0,
        -465.0,
        480.0,
        57344.0,
        61440.0,
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        // NaNs with the payload's top bits set, as a GPU's canonical NaN (0x7FFFFFFF) is:
        // rounding their bits carried them into the sign bit, so they were stored as -0.
        f32::from_bits(0x7FFF_FFFF),
        f32::from_bits(0xFFFF_FFFF),
        f32::from_bits(0x7FF8_0000),
        1.0 + p2(-8),
        1.0 + 3.0 * p2(-8),
        1.0 + p2(-11),
        1.0 + 3.0 * p2(-11),
        p2(-25),
        3.0 * p2(-25),
    ];
    for (f, _, _) in FP8 {
        for b in 0..0x7Eu8 {
            let (lo, hi) = (prec::fp8_decode(b, f), prec::fp8_decode(b + 1, f));
            if hi.is_finite() {
                xs.extend([(lo + hi) / 2.0, -(lo + hi) / 2.0]);
            }
        }
    }
    xs.extend(normals(4000, 21).iter().map(|v| 30.0 * v));
    xs
}

/// `xs` without ±Inf and f32::MAX (NaN kept: the amax ignores it), so current scaling
/// takes a scale other than 1 from 70000.
fn finite(xs: &[f32]) -> Vec<f32> {
    xs.iter().copied().filter(|v| v.is_nan() || v.abs() <= 1e6).collect()
}

fn as_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn as_u32(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn as_u16(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2).map(|c| u16::from_le_bytes(c.try_into().unwrap())).collect()
}

/// `got` is `want` bit for bit, any NaN matching any NaN; a failure names how many
/// differ and the first with its input.
fn same_f32(what: &str, xs: &[f32], want: &[f32], got: &[f32]) {
    assert_eq!(want.len(), got.len(), "{what}: lengths");
    let differs = |&i: &usize| want[i].to_bits() != got[i].to_bits() && !(want[i].is_nan() && got[i].is_nan());
    let bad: Vec<usize> = (0..want.len()).filter(differs).collect();
    if let Some(&i) = bad.first() {
        panic!(
            "{what}: {} of {} differ; at {i}, x = {:e} ({:#010x}): CPU {:e} ({:#010x}), CUDA {:e} ({:#010x})",
            bad.len(),
            want.len(),
            xs[i],
            xs[i].to_bits(),
            want[i],
            want[i].to_bits(),
            got[i],
            got[i].to_bits()
        );
    }
}

/// `got` is `want` code for code (`nan`: codes that are NaN, which match any NaN code).
fn same_codes<T: Copy + PartialEq + std::fmt::LowerHex>(what: &str, xs: &[f32], want: &[T], got: &[T], nan: impl Fn(T) -> bool) {
    assert_eq!(want.len(), got.len(), "{what}: lengths");
    let bad: Vec<usize> = (0..want.len()).filter(|&i| want[i] != got[i] && !(nan(want[i]) && nan(got[i]))).collect();
    if let Some(&i) = bad.first() {
        panic!("{what}: {} of {} codes differ; at {i}, x = {:e} ({:#010x}): CPU {:#x}, CUDA {:#x}", bad.len(), want.len(), xs[i], xs[i].to_bits(), want[i], got[i]);
    }
}

fn f16_nan(h: u16) -> bool {
    h & 0x7C00 == 0x7C00 && h & 0x03FF != 0
}

/// The report `CudaQuantStats::report` makes of a statistics record, its scale from the
/// record's (amax, current-scaling amax).
fn report(rec: &[u8], elements: usize, scale: impl FnOnce(f32, f32) -> f32) -> QuantReport {
    let w = as_u32(rec);
    assert_eq!(w.len(), STATS_WORDS);
    let count = |i: usize| u64::from(w[2 * i]) | (u64::from(w[2 * i + 1]) << 32);
    let (amax, cur) = (f32::from_bits(w[6]), f32::from_bits(w[7]));
    QuantReport { amax, scale: scale(amax, cur), saturated: count(0), underflowed: count(1), nonfinite: count(2), elements: elements as u64 }
}

/// The same report, amax and scale bit for bit.
fn same_report(what: &str, want: &QuantReport, got: &QuantReport) {
    let key = |r: &QuantReport| (r.amax.to_bits(), r.scale.to_bits(), r.saturated, r.underflowed, r.nonfinite, r.elements);
    assert_eq!(key(got), key(want), "{what}: CUDA {got:?}, CPU {want:?}");
}

/// `cast` f32 into bf16, f16, E4M3 and E5M2 and back, and `round_to_storage` in every
/// format the CUDA backend emulates: on the edge cases (Inf among them, so the current
/// FP8 scale is 1 and the midpoints are exact ties), on them without Inf (a scale from
/// the amax 70000), and on normals alone. Codes, decoded values, rounded values and the
/// FP8 meta [scale, 1/scale, amax, 0] must be the CPU's bits.
#[test]
fn casts_and_storage_rounding_store_the_cpus_bits_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    let all = inputs();
    let normal: Vec<f32> = normals(4000, 22).iter().map(|v| 30.0 * v).collect();
    for (case, xs) in [("edge cases", all.clone()), ("edge cases without Inf", finite(&all)), ("normals", normal)] {
        let n = xs.len();
        let len = || A::I(n as i64);
        let mut e = Emu::default();
        let x = e.f32s(&xs);
        // cast into bf16 / f16, then widen back to f32.
        let mut halves = Vec::new();
        for kind in ["bf16", "f16"] {
            let (h, back) = (e.bytes(&vec![FILL; 2 * n]), e.nans(n));
            e.ew(&format!("f32_to_{kind}_kernel"), n, &[A::P(h), A::P(x), len()]);
            e.ew(&format!("{kind}_to_f32_kernel"), n, &[A::P(back), A::P(h), len()]);
            halves.push((h, back));
        }
        // cast into FP8 (quantize_current, which zeroes the meta first), then widen back.
        let mut casts = Vec::new();
        for (_, _, fmt) in FP8 {
            let (q, meta, back) = (e.bytes(&vec![FILL; n]), e.f32s(&[0.0; 4]), e.nans(n));
            e.ew("amax_f32", n, &[A::POff(meta, 8), A::P(x), len()]);
            // LaunchConfig::for_num_elems(1): one block of 1024 threads.
            e.launch("fp8_scale_from_amax", 1, 1024, 0, &[A::P(meta), A::I32(fmt)]);
            e.ew("fp8_quantize", n, &[A::P(q), A::P(x), A::P(meta), len(), A::I32(fmt)]);
            e.ew("fp8_dequantize", n, &[A::P(back), A::P(q), A::P(meta), len(), A::I32(fmt)]);
            casts.push((q, meta, back));
        }
        // round_to_storage in place; FP8 through a zeroed 4-float scratch meta.
        let (rb, rh) = (e.f32s(&xs), e.f32s(&xs));
        e.ew("round_bf16", n, &[A::P(rb), len()]);
        e.ew("round_f16", n, &[A::P(rh), len()]);
        let mut rounds = Vec::new();
        for (_, _, fmt) in FP8 {
            let (r, meta) = (e.f32s(&xs), e.f32s(&[0.0; 4]));
            e.ew("amax_f32", n, &[A::POff(meta, 8), A::P(r), len()]);
            e.launch("fp8_scale_from_amax", 1, 1024, 0, &[A::P(meta), A::I32(fmt)]);
            e.ew("round_fp8", n, &[A::P(r), A::P(meta), len(), A::I32(fmt)]);
            rounds.push(r);
        }
        let rm = e.f32s(&xs);
        let warps = n / MX_ROW * MX_ROW.div_ceil(32);
        e.launch("round_mxfp8", warps.div_ceil(8) as u32, 256, 0, &[A::P(rm), A::I((n / MX_ROW) as i64), A::I32(MX_ROW as i32)]);
        let out = e.run_bytes(bin);
        let got = |b: super::Buf| &out[b.0 as usize];

        // The CPU backend: write_f32 into the narrow buffer, read_f32 back.
        let bf16: Vec<u16> = xs.iter().map(|&v| prec::bf16_bits(v)).collect();
        same_codes(&format!("{case}: cast to bf16"), &xs, &bf16, &as_u16(got(halves[0].0)), |_| false);
        let back: Vec<f32> = bf16.iter().map(|&b| prec::bf16_from_bits(b)).collect();
        same_f32(&format!("{case}: bf16 widened"), &xs, &back, &as_f32(got(halves[0].1)));
        let f16: Vec<u16> = xs.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
        same_codes(&format!("{case}: cast to f16"), &xs, &f16, &as_u16(got(halves[1].0)), f16_nan);
        let back: Vec<f32> = f16.iter().map(|&b| half::f16::from_bits(b).to_f32()).collect();
        same_f32(&format!("{case}: f16 widened"), &xs, &back, &as_f32(got(halves[1].1)));
        for ((f, _, _), (q, meta, back)) in FP8.into_iter().zip(casts) {
            let what = format!("{case}: cast to {f:?}");
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = prec::fp8_current_scale(amax, f);
            let mut codes = vec![0u8; n];
            prec::fp8_quantize(&mut codes, &xs, scale, f, true).unwrap();
            same_codes(&what, &xs, &codes, got(q), |_| false);
            let meta = as_f32(got(meta));
            same_f32(&format!("{what}: meta"), &[amax; 4], &[scale, 1.0 / scale, amax, 0.0], &meta);
            let mut wide = vec![0f32; n];
            prec::fp8_dequantize(&mut wide, &codes, scale, f).unwrap();
            same_f32(&format!("{what}, widened"), &xs, &wide, &as_f32(got(back)));
        }

        // round_to_storage.
        let mut want = xs.clone();
        prec::round_to_bf16(&mut want);
        same_f32(&format!("{case}: round_to_storage bf16"), &xs, &want, &as_f32(got(rb)));
        let mut want = xs.clone();
        prec::round_to_f16(&mut want);
        same_f32(&format!("{case}: round_to_storage f16"), &xs, &want, &as_f32(got(rh)));
        for ((f, _, _), r) in FP8.into_iter().zip(rounds) {
            let mut want = xs.clone();
            prec::round_to_fp8_current(&mut want, f);
            same_f32(&format!("{case}: round_to_storage {f:?}"), &xs, &want, &as_f32(got(r)));
        }
        // The launch above covers the n / MX_ROW whole rows, and so does the CPU's
        // rounding here (which refuses a buffer that is not whole rows, as the backend
        // does); the tail stays as it was in both.
        let mut want = xs.clone();
        prec::round_to_mxfp8(&mut want[..n / MX_ROW * MX_ROW], MX_ROW).unwrap();
        same_f32(&format!("{case}: round_to_storage MXFP8"), &xs, &want, &as_f32(got(rm)));
    }
}

/// `quantize_fp8_codes` (the native FP8 GEMM route's cast) in E4M3 and E5M2, saturating
/// and not, at given (delayed) scales 1, 0.37 and 3e4 and at current scales with margins
/// 0 and 1, on the edge cases (and, for current scales, on them without Inf): the codes,
/// the meta and the report (saturated, underflowed and non-finite counts, amax, scale)
/// must be the CPU's.
#[test]
fn fp8_codes_and_their_statistics_match_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    let all = inputs();
    let fin = finite(&all);
    let mut e = Emu::default();
    let mut runs = Vec::new();
    // A given scale does not depend on the Inf among the inputs: only current scales are
    // checked on both (the emulation's time goes into launches).
    for (xs, scales) in [(&all, &[(Some(1.0f32), 0), (Some(0.37), 0), (Some(3e4), 0), (None, 0), (None, 1)][..]), (&fin, &[(None, 0), (None, 1)][..])] {
        let n = xs.len();
        let x = e.f32s(xs);
        for (_, format, fmt) in FP8 {
            for saturate in [true, false] {
                for &(scale, margin) in scales {
                    let spec = QuantSpec::Tensor { format, scale, margin, saturate, stochastic: None };
                    // codes_meta sets [s, 1/s, 0, 0] (s = 1 for a current scale); stats_record zeroes the record.
                    let s = scale.unwrap_or(1.0);
                    let (q, meta, rec) = (e.bytes(&vec![FILL; n]), e.f32s(&[s, 1.0 / s, 0.0, 0.0]), e.bytes(&[0; 4 * STATS_WORDS]));
                    if scale.is_none() {
                        e.ew("amax_f32", n, &[A::POff(rec, STATS_CUR), A::P(x), A::I(n as i64)]);
                    }
                    let args = [
                        A::P(q),
                        A::P(meta),
                        A::P(x),
                        A::POff(rec, STATS_CUR),
                        A::P(rec),
                        A::I(n as i64),
                        A::I32(fmt),
                        A::F(scale.unwrap_or(0.0)),
                        A::I32(margin),
                        A::I32(i32::from(saturate)),
                    ];
                    e.ew("quant_tensor_codes", n, &args);
                    runs.push((xs, spec, q, meta, rec));
                }
            }
        }
    }
    let out = e.run_bytes(bin);
    for (xs, spec, q, meta, rec) in runs {
        let QuantSpec::Tensor { format, scale, margin, .. } = spec else { unreachable!() };
        let what = format!("{spec:?} on {} inputs", xs.len());
        let mut codes = vec![0u8; xs.len()];
        let want = quant::quantize_codes(&mut codes, xs, &spec).unwrap();
        same_codes(&what, xs, &codes, &out[q.0 as usize], |_| false);
        // keep_amax: the amax the kernel left in meta[2] copied into the record.
        let mut rec = out[rec.0 as usize].clone();
        let meta_bytes = &out[meta.0 as usize];
        rec[STATS_AMAX as usize..STATS_CUR as usize].copy_from_slice(&meta_bytes[8..12]);
        let got = report(&rec, xs.len(), |_, cur| scale.unwrap_or_else(|| quant::tensor_scale(cur, format, margin)));
        same_report(&what, &want, &got);
        // The CPU backend keeps (scale, amax) with the codes; CUDA's meta must say the same.
        let meta = as_f32(meta_bytes);
        same_f32(&format!("{what}: meta"), &[0.0; 3], &[want.scale, 1.0 / want.scale, want.amax], &meta[..3]);
    }
}

/// `quantize` (quantise-dequantise in place with the report): bf16, f16 and f32 rounding;
/// per-tensor E4M3, E5M2 and E2M1 with given and current scales, saturating or not, and
/// stochastic rounding; block scales (MXFP8's 1x32 E8M0, OCP FLOOR 32x1, FP32 1x128 and
/// 128x128, NVFP4's two-level 1x16 with stochastic rounding, 16x16 E4M3 scales alone),
/// on (45, 100) of the edge cases (and without Inf where the scales come from the amax).
#[test]
fn quantize_matches_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    const COLS: usize = 100;
    let tensor = |format, scale, margin, saturate, stochastic| QuantSpec::Tensor { format, scale, margin, saturate, stochastic };
    let blocks = |format, block, scale_format, scale_rounding, tensor_scale, saturate, stochastic| {
        QuantSpec::Blocks(BlockSpec { format, block, scale_format, scale_rounding, tensor_scale, saturate, stochastic })
    };
    let specs = [
        QuantSpec::Float(FloatFormat::Bf16),
        QuantSpec::Float(FloatFormat::F16),
        QuantSpec::Float(FloatFormat::F32),
        tensor(Format::E4M3, Some(0.37), 0, true, None),
        tensor(Format::E4M3, None, 0, false, None),
        tensor(Format::E5M2, Some(3e4), 0, false, None),
        tensor(Format::E5M2, None, 1, true, None),
        tensor(Format::E2M1, None, 0, false, None),
        tensor(Format::E4M3, Some(1.0), 0, true, Some(0x1234_5678_9ABC)),
        blocks(Format::E4M3, (1, 32), ScaleFormat::E8M0, ScaleRounding::Pow2Up, false, true, None),
        blocks(Format::E5M2, (32, 1), ScaleFormat::E8M0, ScaleRounding::Pow2Down, false, false, None),
        blocks(Format::E4M3, (1, 128), ScaleFormat::Fp32, ScaleRounding::Exact, false, true, None),
        blocks(Format::E4M3, (128, 128), ScaleFormat::Fp32, ScaleRounding::Pow2Up, false, false, None),
        blocks(Format::E2M1, (1, 16), ScaleFormat::E4M3, ScaleRounding::Exact, true, true, Some(7)),
        blocks(Format::E2M1, (16, 16), ScaleFormat::E4M3, ScaleRounding::Exact, false, true, None),
    ];
    let all = inputs();
    let fin = finite(&all);
    let mut e = Emu::default();
    let mut runs = Vec::new();
    for xs in [&all, &fin] {
        let rows = xs.len() / COLS;
        let xs = &xs[..rows * COLS];
        let n = xs.len();
        let len = || A::I(n as i64);
        let fmt_of = |f: Format| match f {
            Format::E4M3 => 0,
            Format::E5M2 => 1,
            Format::E2M1 => 2,
        };
        let seed = |s: Option<u64>| [A::I32(i32::from(s.is_some())), A::I32(quant::seed32(s).unwrap_or(0) as i32)];
        // Without Inf, only the specs whose scales come from the tensor's amax (the
        // emulation's time goes into launches).
        let amax_scaled = |s: &QuantSpec| match s {
            QuantSpec::Tensor { scale, .. } => scale.is_none(),
            QuantSpec::Blocks(b) => b.tensor_scale,
            QuantSpec::Float(_) => false,
        };
        let with_inf = xs.iter().any(|v| v.is_infinite());
        for spec in specs.into_iter().filter(|s| with_inf || amax_scaled(s)) {
            let (x, rec) = (e.f32s(xs), e.bytes(&[0; 4 * STATS_WORDS]));
            match spec {
                QuantSpec::Float(f) => {
                    let kind = match f {
                        FloatFormat::Bf16 => 0,
                        FloatFormat::F16 => 1,
                        FloatFormat::F32 => 2,
                    };
                    e.ew("quant_float", n, &[A::P(x), A::P(rec), A::POff(rec, STATS_AMAX), len(), A::I32(kind)]);
                }
                QuantSpec::Tensor { format, scale, margin, saturate, stochastic } => {
                    if scale.is_none() {
                        e.ew("amax_f32", n, &[A::POff(rec, STATS_CUR), A::P(x), len()]);
                    }
                    let [sr, sd] = seed(stochastic);
                    let args = [
                        A::P(x),
                        A::POff(rec, STATS_CUR),
                        A::P(rec),
                        A::POff(rec, STATS_AMAX),
                        len(),
                        A::I32(fmt_of(format)),
                        A::F(scale.unwrap_or(0.0)),
                        A::I32(margin),
                        A::I32(i32::from(saturate)),
                        sr,
                        sd,
                    ];
                    e.ew("quant_tensor", n, &args);
                }
                QuantSpec::Blocks(b) => {
                    let (br, bc) = b.block;
                    let nb = rows.div_ceil(br) * COLS.div_ceil(bc);
                    let (bamax, tamax) = (e.nans(nb), e.f32s(&[0.0]));
                    if b.tensor_scale {
                        e.ew("amax_f32", n, &[A::P(tamax), A::P(x), len()]);
                    }
                    let (r, c) = (A::I(rows as i64), A::I(COLS as i64));
                    e.ew("quant_block_amax", nb, &[A::P(bamax), A::P(x), r, c, A::I32(br as i32), A::I32(bc as i32)]);
                    let sf = match b.scale_format {
                        ScaleFormat::Fp32 => 0,
                        ScaleFormat::E8M0 => 1,
                        ScaleFormat::E4M3 => 2,
                    };
                    let rnd = match b.scale_rounding {
                        ScaleRounding::Exact => 0,
                        ScaleRounding::Pow2Down => 1,
                        ScaleRounding::Pow2Up => 2,
                    };
                    let [sr, sd] = seed(b.stochastic);
                    let args = [
                        A::P(x),
                        A::P(bamax),
                        A::P(tamax),
                        A::P(rec),
                        A::POff(rec, STATS_AMAX),
                        A::I(rows as i64),
                        A::I(COLS as i64),
                        A::I32(br as i32),
                        A::I32(bc as i32),
                        A::I32(fmt_of(b.format)),
                        A::I32(sf),
                        A::I32(rnd),
                        A::I32(i32::from(b.tensor_scale)),
                        A::I32(i32::from(b.saturate)),
                        sr,
                        sd,
                    ];
                    e.ew("quant_blocks", n, &args);
                }
            }
            runs.push((xs, rows, spec, x, rec));
        }
    }
    let out = e.run_bytes(bin);
    for (xs, rows, spec, x, rec) in runs {
        let what = format!("{spec:?} on ({rows}, {COLS}) with{} Inf", if xs.iter().any(|v| v.is_infinite()) { "" } else { "out" });
        let mut want_x = xs.to_vec();
        let want = quant::quantize(&mut want_x, rows, COLS, &spec).unwrap();
        same_f32(&what, xs, &want_x, &as_f32(&out[x.0 as usize]));
        // CudaQuantStats::report's scale for each ScaleFrom.
        let got = report(&out[rec.0 as usize], xs.len(), |amax, cur| match spec {
            QuantSpec::Float(_) => 1.0,
            QuantSpec::Tensor { format, scale, margin, .. } => scale.unwrap_or_else(|| quant::tensor_scale(cur, format, margin)),
            QuantSpec::Blocks(b) => {
                let global = if b.tensor_scale { quant::tensor_scale_of_blocks(amax, b.format) } else { 1.0 };
                match (b.tensor_scale, global > 0.0) {
                    (true, true) => 1.0 / global,
                    (true, false) => 1.0,
                    (false, _) => quant::block_scale(amax, &b, global).0,
                }
            }
        });
        same_report(&what, &want, &got);
    }
}

/// The router's forward (`router_forward`, one thread per token), softmax and sigmoid,
/// k of 1 to 8 of 16 experts, with and without renormalising the selected weights, over
/// 300 tokens: three with exact ties (all logits equal, equal pairs) or a softmax all
/// but one-hot. Indices exactly, probabilities and weights to 1e-6.
#[test]
fn router_forward_matches_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    let (n, experts) = (300, 16);
    let mut logits: Vec<f32> = normals(n * experts, 31).iter().map(|v| 2.0 * v).collect();
    logits[..experts].fill(0.5);
    for j in 0..experts {
        logits[experts + j] = (j / 2) as f32 * 0.25;
        logits[2 * experts + j] = if j == 5 { 60.0 } else { j as f32 - 20.0 };
    }
    let mut e = Emu::default();
    let lg = e.f32s(&logits);
    let mut runs = Vec::new();
    for (score, k, normalize_topk) in [(ScoreFn::Softmax, 2, false), (ScoreFn::Softmax, 4, true), (ScoreFn::Sigmoid, 8, true), (ScoreFn::Sigmoid, 1, false)] {
        let r = Router { n, e: experts, k, score, normalize_topk };
        let (w, idx, p) = (e.nans(n * k), e.u32s(&vec![u32::MAX; n * k]), e.nans(n * experts));
        let args = [
            A::P(w),
            A::P(idx),
            A::P(p),
            A::P(lg),
            A::I(n as i64),
            A::I32(experts as i32),
            A::I32(k as i32),
            A::I32(i32::from(score == ScoreFn::Sigmoid)),
            A::I32(i32::from(normalize_topk)),
        ];
        e.ew("router_forward", n, &args);
        runs.push((r, w, idx, p));
    }
    let out = e.run_bytes(bin);
    for (r, w, idx, p) in runs {
        let (mut ww, mut wi, mut wp) = (vec![0f32; n * r.k], vec![0u32; n * r.k], vec![0f32; n * experts]);
        router_forward(&mut ww, &mut wi, &mut wp, &logits, &r).unwrap();
        assert_eq!(as_u32(&out[idx.0 as usize]), wi, "{r:?}: expert indices");
        for (what, want, buf) in [("probs", &wp, p), ("weights", &ww, w)] {
            let err = error(want, &as_f32(&out[buf.0 as usize]));
            assert!(err <= 1e-6, "{r:?}: {what} off by {err:.2e} (tolerance 1e-6)");
        }
    }
}
