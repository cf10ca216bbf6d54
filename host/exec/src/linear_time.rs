//! The three GEMMs of one linear layer timed on a device at the formats a precision plan
//! gives them, with the casts a low-precision GEMM needs: what `runner measure` records
//! for each GEMM op of a rank's graph.
//!
//! Shapes (row-major, one notation): x is (M,K), the weight w is (N,K), y and its
//! gradient dy are (M,N).
//! - forward: y = x·wᵀ (the TN layout FP8 kernels take directly);
//! - input gradient: dx (M,K) = dy·w;
//! - weight gradient: dw (N,K) = dyᵀ·x.
//!
//! A BF16 role multiplies BF16 operands; an FP8 role multiplies E4M3 activations and
//! weights and E5M2 gradients (Transformer Engine's hybrid recipe), each with a
//! per-tensor scale. Outputs are BF16, accumulation f32. FP8 GEMMs take cuBLASLt's TN
//! layout only, so an FP8 input or weight gradient multiplies transposed copies of its
//! operands, made once before the timing (Transformer Engine keeps them, made by the
//! fused cast-transpose): the GEMMs alone are timed, as the projection prices them. A
//! low-precision forward or weight gradient needs x cast to FP8, a low-precision input or
//! weight gradient needs dy cast: those casts are timed as the executor's native route
//! runs them under delayed scaling, one pass from its f32 activations at a known scale
//! (4 bytes in, 1 out). The executor computes in f32, so these GEMMs are run here on
//! buffers of their own rather than inside a training step.

use crate::device::{Device, DeviceBuffer, Elem, ExecError};
use crate::timing::Stat;
use runner_kernels::cpu::matmul::Gemm;

/// One linear layer's problem and the operand format of each of its GEMMs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinearGemms {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Forward, input gradient, weight gradient: `Elem::BF16` or `Elem::F8E4M3` (FP8:
    /// the role's gradient operand is E5M2).
    pub formats: [Elem; 3],
}

/// Median seconds of each GEMM and cast.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinearTimes {
    pub kernel_s: [f64; 3],
    /// Casting x to E4M3 (0 when no role needs it), and dy to E5M2.
    pub cast_x_s: f64,
    pub cast_dy_s: f64,
}

/// Time `samples` samples of each GEMM of `l` on `dev` after a warm-up call, each sample
/// enough calls to last about a millisecond; medians.
///
/// # Errors
/// A format other than BF16 and E4M3, a zero dimension, or a device error (out of
/// memory, a GEMM the device cannot run).
pub fn time_linear<D: Device>(dev: &D, l: &LinearGemms, samples: usize) -> Result<LinearTimes, ExecError> {
    let (m, n, k) = (l.m, l.n, l.k);
    if m == 0 || n == 0 || k == 0 {
        return Err(ExecError::State(format!("linear GEMMs of {m}x{n}x{k}: every dimension must be at least 1")));
    }
    if let Some(f) = l.formats.iter().find(|f| !matches!(f, Elem::BF16 | Elem::F8E4M3)) {
        return Err(ExecError::State(format!("linear GEMMs in {}: bf16 or fp8-e4m3 operands only", f.name())));
    }
    let fp8 = |r: usize| l.formats[r] == Elem::F8E4M3;
    let bf16 = |len: usize, seed: u64| -> Result<_, ExecError> {
        let mut b = dev.alloc(Elem::BF16, len)?;
        dev.write_f32(&mut b, &crate::bench::operand(len, seed))?;
        Ok(b)
    };
    let (x, w, dy) = (bf16(m * k, 1)?, bf16(n * k, 2)?, bf16(m * n, 3)?);
    let cast_of = |src: &D::Buffer, elem: Elem, len: usize| -> Result<_, ExecError> {
        let mut q = dev.alloc(elem, len)?;
        dev.cast(&mut q, src)?;
        Ok(q)
    };
    let need_x8 = fp8(0) || fp8(2);
    let need_dy8 = fp8(1) || fp8(2);
    let (x8, w8) = if need_x8 || fp8(1) {
        (cast_of(&x, Elem::F8E4M3, m * k)?, cast_of(&w, Elem::F8E4M3, n * k)?)
    } else {
        (dev.alloc(Elem::F8E4M3, 1)?, dev.alloc(Elem::F8E4M3, 1)?)
    };
    let dy8 = if need_dy8 { cast_of(&dy, Elem::F8E5M2, m * n)? } else { dev.alloc(Elem::F8E5M2, 1)? };
    // Transposed FP8 copies (rows, cols) -> (cols, rows), scale kept, for the TN form of
    // the gradient GEMMs.
    let transposed = |src: &D::Buffer, rows: usize, cols: usize| -> Result<_, ExecError> {
        let mut t = dev.alloc(src.elem(), rows * cols)?;
        dev.transpose_outer(&mut t, src, rows, cols, 1)?;
        Ok(t)
    };
    let w8t = if fp8(1) { transposed(&w8, n, k)? } else { dev.alloc(Elem::F8E4M3, 1)? };
    let (dy8t, x8t) = if fp8(2) { (transposed(&dy8, m, n)?, transposed(&x8, m, k)?) } else { (dev.alloc(Elem::F8E5M2, 1)?, dev.alloc(Elem::F8E4M3, 1)?) };
    let tn = |m: usize, n: usize, k: usize| Gemm { m, n, k, trans_a: false, trans_b: true };
    let mut kernel_s = [0.0; 3];
    for (r, time) in kernel_s.iter_mut().enumerate() {
        let low = fp8(r);
        // dx (M,K) = dy·w = dy·(wᵀ)ᵀ; dw (N,K) = dyᵀ·x = dyᵀ·(xᵀ)ᵀ.
        let (a, b, g, out_len) = match (r, low) {
            (0, _) => (if low { &x8 } else { &x }, if low { &w8 } else { &w }, tn(m, n, k), m * n),
            (1, true) => (&dy8, &w8t, tn(m, k, n), m * k),
            (1, false) => (&dy, &w, Gemm { m, n: k, k: n, trans_a: false, trans_b: false }, m * k),
            (_, true) => (&dy8t, &x8t, tn(n, k, m), n * k),
            (_, false) => (&dy, &x, Gemm { m: n, n: k, k: m, trans_a: true, trans_b: false }, n * k),
        };
        let mut c = dev.alloc(Elem::BF16, out_len)?;
        *time = median_time(dev, samples, || dev.matmul(&mut c, a, b, g, false))?;
    }
    let mut cast_x_s = 0.0;
    let mut cast_dy_s = 0.0;
    let one_pass = |elem: Elem, len: usize| -> Result<f64, ExecError> {
        let mut src = dev.alloc(Elem::F32, len)?;
        dev.write_f32(&mut src, &crate::bench::operand(len, 4))?;
        let mut q = dev.alloc(elem, len)?;
        let format = if elem == Elem::F8E5M2 { runner_kernels::cpu::quant::Format::E5M2 } else { runner_kernels::cpu::quant::Format::E4M3 };
        let spec = runner_kernels::cpu::quant::QuantSpec::Tensor { format, scale: Some(1.0), margin: 0, saturate: true, stochastic: None };
        median_time(dev, samples, || dev.quantize_fp8_codes(&mut q, &src, 0, &spec).map(|_| ()))
    };
    if need_x8 {
        cast_x_s = one_pass(Elem::F8E4M3, m * k)?;
    }
    if need_dy8 {
        cast_dy_s = one_pass(Elem::F8E5M2, m * n)?;
    }
    Ok(LinearTimes { kernel_s, cast_x_s, cast_dy_s })
}

/// Median seconds of one call of `f`: one call timed to size the samples, then
/// `samples` samples of enough calls to last about a millisecond.
fn median_time<D: Device>(dev: &D, samples: usize, mut f: impl FnMut() -> Result<(), ExecError>) -> Result<f64, ExecError> {
    let once = crate::bench::device_samples(dev, 1, 1, &mut f)?.first().copied().unwrap_or(0.0).max(1e-7);
    let calls = ((1e-3 / once).ceil() as usize).clamp(1, 100);
    Ok(Stat::of(&crate::bench::device_samples(dev, samples.max(1), calls, f)?).median)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Cpu;

    /// Each GEMM of a small layer runs on the CPU backend in BF16 and FP8 (the same
    /// calls the CUDA backend gets), and a larger layer takes longer.
    #[test]
    fn times_every_gemm_and_cast_of_a_linear_layer_cpu() {
        let dev = Cpu::new();
        let small = LinearGemms { m: 32, n: 48, k: 16, formats: [Elem::BF16; 3] };
        let t = time_linear(&dev, &small, 3).unwrap();
        assert!(t.kernel_s.iter().all(|&s| s > 0.0) && t.cast_x_s == 0.0 && t.cast_dy_s == 0.0, "{t:?}");
        let fp8 = LinearGemms { formats: [Elem::F8E4M3, Elem::F8E4M3, Elem::BF16], ..small };
        let t8 = time_linear(&dev, &fp8, 3).unwrap();
        assert!(t8.cast_x_s > 0.0 && t8.cast_dy_s > 0.0, "{t8:?}");
        // Every role in FP8: the gradient GEMMs on transposed copies (TN).
        let all8 = time_linear(&dev, &LinearGemms { formats: [Elem::F8E4M3; 3], ..small }, 3).unwrap();
        assert!(all8.kernel_s.iter().all(|&s| s > 0.0), "{all8:?}");
        let big = LinearGemms { m: 256, n: 384, k: 256, ..small };
        let tb = time_linear(&dev, &big, 3).unwrap();
        assert!(tb.kernel_s[0] > t.kernel_s[0], "{tb:?} vs {t:?}");
        let e = time_linear(&dev, &LinearGemms { formats: [Elem::F32; 3], ..small }, 1).unwrap_err();
        assert!(e.to_string().contains("bf16 or fp8"), "{e}");
    }

    /// Each role in FP8 alone: a low-precision forward casts x only, an input gradient
    /// dy only, a weight gradient both (dyᵀ·x).
    #[test]
    fn each_fp8_role_casts_its_own_operands() {
        let dev = Cpu::new();
        let l = |formats| LinearGemms { m: 32, n: 48, k: 16, formats };
        let (b, f) = (Elem::BF16, Elem::F8E4M3);
        let casts = |formats| {
            let t = time_linear(&dev, &l(formats), 1).unwrap();
            (t.cast_x_s > 0.0, t.cast_dy_s > 0.0)
        };
        assert_eq!(casts([f, b, b]), (true, false));
        assert_eq!(casts([b, f, b]), (false, true));
        assert_eq!(casts([b, b, f]), (true, true));
    }

    /// A zero dimension is an error, and zero samples still time one.
    #[test]
    fn zero_dimensions_are_errors_and_zero_samples_time_one() {
        let dev = Cpu::new();
        for (m, n, k) in [(0, 48, 16), (32, 0, 16), (32, 48, 0)] {
            let e = time_linear(&dev, &LinearGemms { m, n, k, formats: [Elem::BF16; 3] }, 1).unwrap_err();
            assert!(e.to_string().contains("at least 1"), "{e}");
        }
        let t = time_linear(&dev, &LinearGemms { m: 32, n: 48, k: 16, formats: [Elem::BF16; 3] }, 0).unwrap();
        assert!(t.kernel_s.iter().all(|&s| s > 0.0), "{t:?}");
    }

    /// A role's format is BF16 or E4M3 (an FP8 role's gradient operand is E5M2 by the
    /// recipe, not by asking): E5M2, F16 or int32 in any role is refused, the error
    /// naming that role's format, not the first role's.
    #[test]
    fn a_format_other_than_bf16_and_e4m3_is_refused_by_name() {
        let dev = Cpu::new();
        for bad in [Elem::F8E5M2, Elem::F16, Elem::I32] {
            for r in 0..3 {
                let mut formats = [Elem::BF16; 3];
                formats[r] = bad;
                let e = time_linear(&dev, &LinearGemms { m: 32, n: 48, k: 16, formats }, 1).unwrap_err().to_string();
                assert!(e.contains(&format!("linear GEMMs in {}:", bad.name())), "role {r}: {e}");
            }
        }
    }
}
