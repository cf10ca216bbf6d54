//! AdamW optimiser step, PyTorch `torch.optim.AdamW` semantics (single-tensor,
//! `foreach=False`, `amsgrad=False`, `maximize=False`).
//!
//! Shapes: param, grad, m, v all (P), any flat parameter tensor.
//!
//! Per element, in PyTorch's order of operations:
//! ```text
//! param *= 1 - lr·wd                        (decoupled weight decay, before the update)
//! m = m + (1-β1)·(g - m)                    (exp_avg.lerp_(grad, 1-β1))
//! v = β2·v + (1-β2)·g²                      (exp_avg_sq.mul_(β2).addcmul_(g, g, 1-β2))
//! denom = sqrt(v) / sqrt(1-β2^step) + eps
//! param -= lr/(1-β1^step) · m / denom
//! ```
//! The bias corrections are computed in f64, as Python floats are. `step` counts from
//! 1. m and v are the optimiser state (updated in place); nothing else is saved.

use super::{ELEM_GRAIN, simd};
use crate::{Result, check_len, shape_err};
use rayon::prelude::*;

/// AdamW hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
}

/// The per-step scalars of the update, computed in f64 (Python floats) and rounded once,
/// shared by every backend so they all update with the same constants. A device reads
/// them from a small buffer ([`Scalars::words`]) rather than as kernel arguments, so a
/// step recorded once (a CUDA graph) replays with each later step's bias corrections:
/// only the buffer changes between replays.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scalars {
    /// 1 − lr·wd (decoupled weight decay).
    pub decay: f32,
    /// 1 − β1.
    pub w1: f32,
    /// 1 − β2.
    pub w2: f32,
    /// β2.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// lr / (1 − β1^step).
    pub step_size: f32,
    /// sqrt(1 − β2^step).
    pub bc2_sqrt: f32,
    /// The learning rate itself: Muon's update scales by it ([`super::muon`]), AdamW's
    /// reads `step_size`.
    pub lr: f32,
}

impl Scalars {
    /// Words in [`Scalars::words`].
    pub const WORDS: usize = 8;

    /// The scalars as the f32 words a device buffer holds, in the field order.
    pub fn words(&self) -> [f32; Self::WORDS] {
        [self.decay, self.w1, self.w2, self.beta2, self.eps, self.step_size, self.bc2_sqrt, self.lr]
    }

    /// The scalars back from [`Scalars::words`].
    ///
    /// # Errors
    /// `ShapeMismatch` unless `w` holds exactly [`Scalars::WORDS`] words.
    pub fn from_words(w: &[f32]) -> Result<Scalars> {
        check_len("adamw scalars", w.len(), Self::WORDS)?;
        Ok(Scalars {
            decay: w[0],
            w1: w[1],
            w2: w[2],
            beta2: w[3],
            eps: w[4],
            step_size: w[5],
            bc2_sqrt: w[6],
            lr: w[7],
        })
    }
}

/// [`Scalars`] of step `step` (>= 1).
///
/// # Errors
/// `ShapeMismatch` if `step == 0`.
pub fn scalars(h: &AdamW, step: u32) -> Result<Scalars> {
    if step == 0 {
        return shape_err("adamw: step counts from 1");
    }
    let bc1 = 1.0 - (h.beta1 as f64).powi(step as i32);
    let bc2 = 1.0 - (h.beta2 as f64).powi(step as i32);
    Ok(Scalars {
        decay: (1.0 - h.lr as f64 * h.weight_decay as f64) as f32,
        w1: (1.0 - h.beta1 as f64) as f32,
        w2: (1.0 - h.beta2 as f64) as f32,
        beta2: h.beta2,
        eps: h.eps,
        step_size: (h.lr as f64 / bc1) as f32,
        bc2_sqrt: bc2.sqrt() as f32,
        lr: h.lr,
    })
}

/// One AdamW step on a flat tensor; `step` >= 1 is this step's number.
///
/// # Errors
/// `ShapeMismatch` if the four slices differ in length or `step == 0`.
pub fn adamw_step(
    param: &mut [f32],
    grad: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    h: &AdamW,
    step: u32,
) -> Result<()> {
    adamw_with(param, grad, m, v, &scalars(h, step)?)
}

/// One AdamW step on a flat tensor with the step's [`Scalars`].
///
/// # Errors
/// `ShapeMismatch` if the four slices differ in length.
pub fn adamw_with(param: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], s: &Scalars) -> Result<()> {
    check_len("adamw grad", grad.len(), param.len())?;
    check_len("adamw m", m.len(), param.len())?;
    check_len("adamw v", v.len(), param.len())?;
    let Scalars {
        decay,
        w1,
        w2,
        beta2: b2,
        eps,
        step_size,
        bc2_sqrt,
        ..
    } = *s;
    param
        .par_chunks_mut(ELEM_GRAIN)
        .zip(m.par_chunks_mut(ELEM_GRAIN))
        .zip(v.par_chunks_mut(ELEM_GRAIN))
        .zip(grad.par_chunks(ELEM_GRAIN))
        .for_each(|(((p, m), v), g)| {
            simd(
                #[inline(always)]
                || {
                    for (((p, m), v), &g) in p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g)
                    {
                        *p *= decay;
                        *m += w1 * (g - *m);
                        *v = *v * b2 + w2 * g * g;
                        let denom = v.sqrt() / bc2_sqrt + eps;
                        *p -= step_size * (*m / denom);
                    }
                },
            )
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two steps on three elements, worked by hand in f64 from the formulas above.
    #[test]
    fn adamw_matches_hand_computed_two_step_trace() {
        let h = AdamW {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.01,
        };
        let mut p = vec![1.0f32, -2.0, 0.5];
        let (mut m, mut v) = (vec![0.0f32; 3], vec![0.0f32; 3]);
        let g1 = [0.5f32, -1.0, 0.0];
        let g2 = [0.25f32, 2.0, -0.5];
        // step 1: m = 0.1 g, v = 0.01 g², m̂ = g, v̂ = g², update = lr·g/(|g|+eps) ≈ lr·sign(g)
        // p1 = p0·(1 − 0.001) − 0.1·sign(g)
        let p1 = [1.0 * 0.999 - 0.1, -2.0 * 0.999 + 0.1, 0.5 * 0.999];
        adamw_step(&mut p, &g1, &mut m, &mut v, &h, 1).unwrap();
        for i in 0..3 {
            assert!(
                (p[i] as f64 - p1[i]).abs() < 1e-6,
                "step 1 elem {i}: {} vs {}",
                p[i],
                p1[i]
            );
        }
        for (mi, want) in m.iter().zip([0.05, -0.1, 0.0]) {
            assert!((mi - want).abs() < 1e-7); // 1 − β1 rounds to f32
        }
        // step 2 by hand
        let mut want = [0.0f64; 3];
        for i in 0..3 {
            let (ga, gb) = (g1[i] as f64, g2[i] as f64);
            let m2 = 0.9 * (0.1 * ga) + 0.1 * gb;
            let v2 = 0.99 * (0.01 * ga * ga) + 0.01 * gb * gb;
            let mhat_step = 0.1 / (1.0 - 0.81);
            let denom = v2.sqrt() / (1.0 - 0.9801f64).sqrt() + 1e-8;
            want[i] = p1[i] * 0.999 - mhat_step * m2 / denom;
        }
        adamw_step(&mut p, &g2, &mut m, &mut v, &h, 2).unwrap();
        // concrete values, so a change of formula is caught even if both sides drift
        // elem 0: m2 = 0.07, v2 = 0.0031, denom = 0.0556776/0.141067 = 0.394689;
        //         p = 0.899·0.999 − 0.526316·0.07/0.394689 = 0.898101 − 0.093345 = 0.804756
        assert!((want[0] - 0.804756).abs() < 1e-5, "hand value {}", want[0]);
        for i in 0..3 {
            assert!(
                (p[i] as f64 - want[i]).abs() < 2e-6,
                "step 2 elem {i}: {} vs {}",
                p[i],
                want[i]
            );
        }
    }

    #[test]
    fn adamw_large_tensor_and_errors() {
        // more than one rayon chunk; zero gradient with wd only decays
        let h = AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        };
        let n = 100_003;
        let mut p = vec![2.0f32; n];
        let (mut m, mut v) = (vec![0.0; n], vec![0.0; n]);
        adamw_step(&mut p, &vec![0.0; n], &mut m, &mut v, &h, 1).unwrap();
        assert!(p.iter().all(|&x| x == 2.0 * (1.0 - 1e-4)));
        assert!(adamw_step(&mut p, &vec![0.0; n], &mut m, &mut v, &h, 0).is_err());
        assert!(adamw_step(&mut p, &vec![0.0; n - 1], &mut m, &mut v, &h, 1).is_err());
        assert!(adamw_step(&mut p, &vec![0.0; n], &mut m[..3], &mut v, &h, 1).is_err());
    }

    /// The words a device reads its scalars from carry every field, in order, and a step
    /// run from them equals the step run from the hyper-parameters.
    #[test]
    fn scalars_travel_as_words() {
        let h = AdamW {
            lr: 3e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        };
        let s = scalars(&h, 7).unwrap();
        assert_eq!(Scalars::from_words(&s.words()).unwrap(), s);
        assert_ne!(scalars(&h, 8).unwrap().words(), s.words(), "the bias corrections move with the step");
        assert!(Scalars::from_words(&s.words()[..6]).is_err());
        let g = [0.5f32, -1.0, 0.25];
        let (mut p1, mut m1, mut v1) = ([1.0f32, 2.0, -3.0], [0.1f32; 3], [0.2f32; 3]);
        let (mut p2, mut m2, mut v2) = (p1, m1, v1);
        adamw_step(&mut p1, &g, &mut m1, &mut v1, &h, 7).unwrap();
        adamw_with(&mut p2, &g, &mut m2, &mut v2, &Scalars::from_words(&s.words()).unwrap()).unwrap();
        assert_eq!((p1, m1, v1), (p2, m2, v2));
        assert!(scalars(&h, 0).is_err());
    }

    /// eps is added to the bias-corrected sqrt(v̂), as in PyTorch's AdamW, whose update
    /// is lr · m̂ / (sqrt(v̂) + eps), not before the correction. With eps comparable to
    /// sqrt(v̂), step 1 of a gradient of 1e-3 (lr 0.1, betas 0.9 and 0.999, eps 1e-2)
    /// has m̂ = 1e-3 and sqrt(v̂) = 1e-3, so the update is 0.1 · 1e-3 / 0.011 = 0.0090909
    /// (hand values; 3.2e-4 with eps inside the correction).
    #[test]
    fn eps_is_added_after_the_bias_correction() {
        let h = AdamW { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-2, weight_decay: 0.0 };
        let (mut p, mut m, mut v) = ([1.0f32], [0.0f32], [0.0f32]);
        adamw_step(&mut p, &[1e-3], &mut m, &mut v, &h, 1).unwrap();
        assert!((p[0] - (1.0 - 0.1 * 1e-3 / 0.011)).abs() < 1e-6, "{}", p[0]);
    }
}
