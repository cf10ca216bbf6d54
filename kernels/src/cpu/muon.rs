//! Muon's two element-wise kernels whose scalars live in device memory, so a Muon step
//! runs without a host read and a recorded step (a CUDA graph) replays it with each
//! step's learning rate (runner-exec's `executor/muon.rs` has the optimizer; these are
//! its CPU twins of `kernels/cuda/muon.cu`).
//!
//! - [`scale_by_inverse_norm`]: X ← X / (√max(s, 0) + ε), s = ‖X‖²_F computed on the
//!   device (a 1 × 1 GEMM), Newton–Schulz's normalisation. A negative or NaN sum of
//!   squares counts as 0, as `fmaxf` does on the GPU.
//! - [`muon_apply`]: W ← W·(1 − lr·wd) + (lr·k)·O, the decay and the learning rate read
//!   from AdamW's step scalars ([`Scalars::decay`], [`Scalars::lr`]); k carries the sign
//!   and Moonlight's RMS matching, −0.2·√max(m, n).
//!
//! Each element rounds as the CUDA twin does: the reciprocal once, then one multiply;
//! the decayed weight, the scaled update and their sum each once.

use super::ELEM_GRAIN;
use super::adamw::Scalars;
use crate::{Result, check_len};
use rayon::prelude::*;

/// The factor [`scale_by_inverse_norm`] multiplies by: 1 / (√max(sumsq, 0) + eps).
pub fn inverse_norm(sumsq: f32, eps: f32) -> f32 {
    1.0 / (sumsq.max(0.0).sqrt() + eps)
}

/// x ← x · [`inverse_norm`]`(sumsq, eps)`.
pub fn scale_by_inverse_norm(x: &mut [f32], sumsq: f32, eps: f32) {
    let r = inverse_norm(sumsq, eps);
    x.par_chunks_mut(ELEM_GRAIN).for_each(|c| c.iter_mut().for_each(|v| *v *= r));
}

/// w ← w · s.decay + (s.lr · k) · o.
///
/// # Errors
/// `ShapeMismatch` if `w` and `o` differ in length.
pub fn muon_apply(w: &mut [f32], o: &[f32], s: &Scalars, k: f32) -> Result<()> {
    check_len("muon update", o.len(), w.len())?;
    let (decay, step) = (s.decay, s.lr * k);
    w.par_chunks_mut(ELEM_GRAIN).zip(o.par_chunks(ELEM_GRAIN)).for_each(|(w, o)| {
        for (w, &o) in w.iter_mut().zip(o) {
            let kept = *w * decay;
            let moved = step * o;
            *w = kept + moved;
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::adamw::{AdamW, scalars};

    #[test]
    fn inverse_norm_normalises_and_keeps_zero_finite() {
        // ‖(3, 4)‖ = 5.
        let mut x = [3.0f32, 4.0];
        scale_by_inverse_norm(&mut x, 25.0, 0.0);
        assert_eq!(x, [0.6, 0.8]);
        // A zero update stays zero: ε keeps the factor finite.
        let mut z = [0.0f32; 3];
        scale_by_inverse_norm(&mut z, 0.0, 1e-7);
        assert_eq!(z, [0.0; 3]);
        // A sum of squares rounded below zero, or NaN, counts as zero, as fmaxf does.
        assert_eq!(inverse_norm(-1e-30, 0.5), 2.0);
        assert_eq!(inverse_norm(f32::NAN, 0.5), 2.0);
    }

    #[test]
    fn apply_reads_decay_and_learning_rate_from_the_step_scalars() {
        let h = AdamW { lr: 0.1, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.5 };
        let s = scalars(&h, 3).unwrap();
        let mut w = [1.0f32, -2.0, 4.0];
        let o = [1.0f32, 1.0, -0.5];
        muon_apply(&mut w, &o, &s, -2.0).unwrap();
        // decay 1 − 0.05 = 0.95, step 0.1 · −2 = −0.2.
        let want = [0.95 - 0.2, -1.9 - 0.2, 3.8 + 0.1];
        for (g, w) in w.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
        assert!(muon_apply(&mut w, &o[..2], &s, 1.0).is_err());
    }
}
