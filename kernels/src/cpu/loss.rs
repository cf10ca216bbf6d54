//! Softmax cross-entropy over the vocabulary, fused (no probabilities stored).
//!
//! Shapes: logits, dlogits (N,V); targets, losses, lse (N), N = B*T.
//!
//! loss_n = lse_n − logits[n, target_n], with lse_n = log Σ_v exp(logits[n,v]) computed
//! stably (max subtracted first). The mean is over rows whose target is not
//! [`IGNORE_INDEX`] (`u32::MAX`, PyTorch's `ignore_index` for padding and prompt
//! tokens); ignored rows get loss 0 and a zero gradient. The forward saves lse so the
//! backward can form softmax = exp(logits − lse) in one pass. Rows split over rayon.
//! Reference: PyTorch `F.cross_entropy(reduction="mean", ignore_index=...)`, except
//! that a batch with no valid target gives loss 0 (PyTorch: NaN), so a fully-masked
//! micro-batch does not poison a gradient-accumulation step.

use super::{exp_f32, max, rows_per_task, simd, sum_exp};
use crate::{KernelError, Result, check_len, rows_of};
use rayon::prelude::*;

/// Targets equal to this are skipped and excluded from the mean.
pub const IGNORE_INDEX: u32 = u32::MAX;

fn check_targets(targets: &[u32], v: usize) -> Result<usize> {
    let mut valid = 0;
    for &t in targets {
        if t == IGNORE_INDEX {
            continue;
        }
        if t as usize >= v {
            return Err(KernelError::TokenOutOfRange { token: t, vocab: v });
        }
        valid += 1;
    }
    Ok(valid)
}

/// Per-row losses (N) and lse (N, saved for backward) from logits (N,V); returns the
/// mean loss over non-ignored rows (0 if there are none).
///
/// # Errors
/// `TokenOutOfRange` for a target >= V other than `IGNORE_INDEX`; `ShapeMismatch` for
/// inconsistent lengths or `v == 0`.
pub fn cross_entropy_forward(
    losses: &mut [f32],
    lse: &mut [f32],
    logits: &[f32],
    targets: &[u32],
    v: usize,
) -> Result<f32> {
    let n = rows_of("cross_entropy logits", logits.len(), v)?;
    check_len("cross_entropy targets", targets.len(), n)?;
    check_len("cross_entropy losses", losses.len(), n)?;
    check_len("cross_entropy lse", lse.len(), n)?;
    let valid = check_targets(targets, v)?;
    let blk = rows_per_task(v);
    let total: f64 = losses
        .par_chunks_mut(blk)
        .zip(lse.par_chunks_mut(blk))
        .enumerate()
        .map(|(c, (ls, lz))| {
            simd(
                #[inline(always)]
                || {
                    let mut part = 0f64;
                    for (r, (l, z)) in ls.iter_mut().zip(lz.iter_mut()).enumerate() {
                        let row = c * blk + r;
                        let x = &logits[row * v..(row + 1) * v];
                        let m = max(x);
                        *z = m + sum_exp(x, m).ln();
                        let t = targets[row];
                        *l = if t == IGNORE_INDEX {
                            0.0
                        } else {
                            *z - x[t as usize]
                        };
                        part += *l as f64;
                    }
                    part
                },
            )
        })
        .collect::<Vec<f64>>()
        .iter()
        .sum();
    Ok(if valid == 0 {
        0.0
    } else {
        (total / valid as f64) as f32
    })
}

/// dlogits (N,V) = dloss · (softmax(logits) − onehot(target)) / n_valid, overwritten;
/// zero rows for ignored targets. `lse` is the forward's.
///
/// # Errors
/// As [`cross_entropy_forward`].
pub fn cross_entropy_backward(
    dlogits: &mut [f32],
    logits: &[f32],
    lse: &[f32],
    targets: &[u32],
    v: usize,
    dloss: f32,
) -> Result<()> {
    let n = rows_of("cross_entropy logits", logits.len(), v)?;
    check_len("cross_entropy dlogits", dlogits.len(), logits.len())?;
    check_len("cross_entropy targets", targets.len(), n)?;
    check_len("cross_entropy lse", lse.len(), n)?;
    let valid = check_targets(targets, v)?;
    let scale = if valid == 0 {
        0.0
    } else {
        dloss / valid as f32
    };
    dlogits.par_chunks_mut(v).enumerate().for_each(|(row, d)| {
        let t = targets[row];
        if t == IGNORE_INDEX {
            d.fill(0.0);
            return;
        }
        let z = lse[row];
        simd(
            #[inline(always)]
            || {
                for (d, &x) in d.iter_mut().zip(&logits[row * v..(row + 1) * v]) {
                    *d = scale * exp_f32(x - z);
                }
            },
        );
        d[t as usize] -= scale;
    });
    Ok(())
}

// ---------------------------------------------------------------------------
// Vocab-parallel cross-entropy (Megatron-LM's `_VocabParallelCrossEntropy`)
// ---------------------------------------------------------------------------
//
// Each tp rank holds the logits of classes `start..start + v`. Three (N) row
// statistics, each all-reduced over tp between these kernels, give the loss: the row
// max, the row sum of exp(x − max) (with the reduced max) and the target's logit (from
// the rank that holds it, zero elsewhere). Megatron reads its shard twice for the first
// two (max, then the sum with the reduced max); here one pass gives the shard's max and
// its sum against it ([`row_max_sumexp`]), and once the max is reduced
// [`sumexp_rescale`] moves that sum onto it: Σ exp(x − M) = e^(m − M) Σ exp(x − m).

/// max (N) = max of each row of x (N, v); sumexp (N) = Σ_j exp(x[r, j] − max[r]) (0 for a
/// row of −∞ only).
///
/// # Errors
/// `ShapeMismatch` for inconsistent lengths.
pub fn row_max_sumexp(max_out: &mut [f32], sumexp: &mut [f32], x: &[f32], v: usize) -> Result<()> {
    let n = rows_of("row_max_sumexp x", x.len(), v)?;
    check_len("row_max_sumexp max", max_out.len(), n)?;
    check_len("row_max_sumexp sumexp", sumexp.len(), n)?;
    max_out.par_iter_mut().zip(sumexp.par_iter_mut()).enumerate().for_each(|(r, (m, s))| {
        let row = &x[r * v..(r + 1) * v];
        *m = max(row);
        *s = if *m == f32::NEG_INFINITY { 0.0 } else { sum_exp(row, *m) };
    });
    Ok(())
}

/// sumexp[r] ·= exp(local_max[r] − max[r]): a shard's sum against its own max
/// ([`row_max_sumexp`]) moved onto the reduced max (a shard of −∞ only stays 0).
///
/// # Errors
/// `ShapeMismatch` for inconsistent lengths.
pub fn sumexp_rescale(sumexp: &mut [f32], local_max: &[f32], max: &[f32]) -> Result<()> {
    check_len("sumexp_rescale local max", local_max.len(), sumexp.len())?;
    check_len("sumexp_rescale max", max.len(), sumexp.len())?;
    for ((s, &l), &m) in sumexp.iter_mut().zip(local_max).zip(max) {
        *s = if l == f32::NEG_INFINITY { 0.0 } else { *s * (l - m).exp() };
    }
    Ok(())
}

/// out (N) = x[r, target[r] − start] where this shard (classes `start..start + v`)
/// holds the target, else 0 (ignored rows too).
///
/// # Errors
/// `ShapeMismatch` for inconsistent lengths.
pub fn target_logit(out: &mut [f32], x: &[f32], targets: &[u32], start: usize, v: usize) -> Result<()> {
    let n = rows_of("target_logit x", x.len(), v)?;
    check_len("target_logit out", out.len(), n)?;
    check_len("target_logit targets", targets.len(), n)?;
    out.par_iter_mut().enumerate().for_each(|(r, o)| {
        let t = targets[r];
        *o = match (t as usize).checked_sub(start) {
            Some(j) if t != IGNORE_INDEX && j < v => x[r * v + j],
            _ => 0.0,
        };
    });
    Ok(())
}

/// From the all-reduced statistics: lse (N) = max + ln(sumexp), and the mean over
/// non-ignored rows of lse − target logit (0 when none is valid), returned.
///
/// # Errors
/// `ShapeMismatch` for inconsistent lengths.
pub fn cross_entropy_from_stats(
    lse: &mut [f32],
    max: &[f32],
    sumexp: &[f32],
    target_logit: &[f32],
    targets: &[u32],
) -> Result<f32> {
    let n = targets.len();
    for (name, len) in [("lse", lse.len()), ("max", max.len()), ("sumexp", sumexp.len()), ("target logit", target_logit.len())] {
        check_len(&format!("cross_entropy_from_stats {name}"), len, n)?;
    }
    let (mut total, mut valid) = (0f64, 0usize);
    for r in 0..n {
        lse[r] = max[r] + sumexp[r].ln();
        if targets[r] != IGNORE_INDEX {
            total += f64::from(lse[r] - target_logit[r]);
            valid += 1;
        }
    }
    Ok(if valid == 0 { 0.0 } else { (total / valid as f64) as f32 })
}

/// dlogits (N, v) of the shard holding classes `start..start + v`, overwritten:
/// dloss · (exp(x − lse) − onehot(target)) / n_valid, zero rows for ignored targets.
///
/// # Errors
/// `ShapeMismatch` for inconsistent lengths.
pub fn cross_entropy_shard_backward(
    dlogits: &mut [f32],
    logits: &[f32],
    lse: &[f32],
    targets: &[u32],
    start: usize,
    v: usize,
    dloss: f32,
) -> Result<()> {
    let n = rows_of("cross_entropy logits", logits.len(), v)?;
    check_len("cross_entropy dlogits", dlogits.len(), logits.len())?;
    check_len("cross_entropy targets", targets.len(), n)?;
    check_len("cross_entropy lse", lse.len(), n)?;
    let valid = targets.iter().filter(|&&t| t != IGNORE_INDEX).count();
    let scale = if valid == 0 { 0.0 } else { dloss / valid as f32 };
    dlogits.par_chunks_mut(v).enumerate().for_each(|(r, d)| {
        let t = targets[r];
        if t == IGNORE_INDEX {
            d.fill(0.0);
            return;
        }
        for (a, &b) in d.iter_mut().zip(&logits[r * v..(r + 1) * v]) {
            *a = (b - lse[r]).exp() * scale;
        }
        if let Some(j) = (t as usize).checked_sub(start).filter(|&j| j < v) {
            d[j] -= scale;
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{self as r, check::*};
    use rand::Rng as _;

    fn case(rng: &mut Rng, n: usize, v: usize, ignore_every: usize) -> (Vec<f32>, Vec<u32>) {
        // logits spread over ±8 so softmax is far from uniform
        let logits: Vec<f32> = randn(rng, n * v).iter().map(|x| 8.0 * x).collect();
        let targets = (0..n)
            .map(|i| {
                if ignore_every > 0 && i % ignore_every == 1 {
                    IGNORE_INDEX
                } else {
                    rng.random_range(0..v as u32)
                }
            })
            .collect();
        (logits, targets)
    }

    #[test]
    fn cross_entropy_forward_matches_reference() {
        let mut rng = rng(60);
        for &(n, v, ig) in &[(1, 1, 0), (7, 13, 3), (33, 1000, 2), (5, 50_000, 0)] {
            let (logits, targets) = case(&mut rng, n, v, ig);
            let (mut l, mut z) = (vec![f32::NAN; n], vec![f32::NAN; n]);
            let mean = cross_entropy_forward(&mut l, &mut z, &logits, &targets, v).unwrap();
            let (wl, wz, wm) = r::cross_entropy(&f64s(&logits), &targets, v);
            // lse ~ up to 8 + ln V ≈ 19: f32 ulp there is ~2e-6; sums of V exp terms
            assert_close("ce losses", &l, &wl, 1e-5, 1e-5);
            assert_close("ce lse", &z, &wz, 1e-5, 1e-5);
            assert_close("ce mean", &[mean], &[wm], 1e-5, 1e-5);
        }
    }

    #[test]
    fn cross_entropy_backward_matches_finite_differences() {
        let mut rng = rng(61);
        for &(n, v, ig) in &[(1, 1, 0), (7, 13, 3), (20, 300, 2)] {
            let (logits, targets) = case(&mut rng, n, v, ig);
            let (mut l, mut z) = (vec![0.0; n], vec![0.0; n]);
            cross_entropy_forward(&mut l, &mut z, &logits, &targets, v).unwrap();
            let dloss = 1.7f32;
            let mut d = vec![f32::NAN; n * v];
            cross_entropy_backward(&mut d, &logits, &z, &targets, v, dloss).unwrap();
            let lf = f64s(&logits);
            let idx = some(&mut rng, n * v, 150);
            // the scalar is the mean loss itself, times dloss
            let fd = fd_grad(&lf, &idx, |p| {
                dloss as f64 * r::cross_entropy(p, &targets, v).2
            });
            // softmax entries <= 1 divided by n_valid: absolute 1e-6 is ~20 ulp
            assert_close("ce dlogits", &pick(&d, &idx), &fd, 1e-6, 1e-5);
            for (row, &t) in targets.iter().enumerate() {
                if t == IGNORE_INDEX {
                    assert!(d[row * v..(row + 1) * v].iter().all(|&x| x == 0.0));
                }
            }
        }
    }

    #[test]
    fn cross_entropy_ignore_index_and_errors() {
        let logits = vec![0.0f32, 1.0, 2.0, 0.5, 0.5, 0.5];
        let (mut l, mut z) = (vec![0.0; 2], vec![0.0; 2]);
        // only row 0 counts: loss = lse - logit[2]
        let mean = cross_entropy_forward(&mut l, &mut z, &logits, &[2, IGNORE_INDEX], 3).unwrap();
        let want = (1.0f64 + 1f64.exp() + 2f64.exp()).ln() - 2.0;
        assert!((mean as f64 - want).abs() < 1e-6);
        assert_eq!(l[1], 0.0);
        // all ignored: mean 0, gradient 0
        let mean = cross_entropy_forward(&mut l, &mut z, &logits, &[IGNORE_INDEX; 2], 3).unwrap();
        assert_eq!(mean, 0.0);
        let mut d = vec![f32::NAN; 6];
        cross_entropy_backward(&mut d, &logits, &z, &[IGNORE_INDEX; 2], 3, 1.0).unwrap();
        assert!(d.iter().all(|&x| x == 0.0));
        let err = cross_entropy_forward(&mut l, &mut z, &logits, &[3, 0], 3).unwrap_err();
        assert_eq!(err, KernelError::TokenOutOfRange { token: 3, vocab: 3 });
        assert!(cross_entropy_forward(&mut l, &mut z, &logits, &[0], 3).is_err());
        assert!(cross_entropy_forward(&mut l, &mut z, &logits, &[0, 0], 0).is_err());
        assert!(cross_entropy_backward(&mut d, &logits, &z, &[0, 5], 3, 1.0).is_err());
    }

    /// Two vocab shards with the statistics summed (max: maxed) by hand give the whole
    /// vocabulary's loss and, concatenated, its gradient.
    #[test]
    fn vocab_shards_with_reduced_statistics_equal_the_whole_vocabulary() {
        let mut rng = rng(31);
        let (n, v, tp) = (9, 12, 2);
        let (x, mut t) = case(&mut rng, n, v, 4);
        t[1] = IGNORE_INDEX;
        let (mut losses, mut lse) = (vec![0.0; n], vec![0.0; n]);
        let want = cross_entropy_forward(&mut losses, &mut lse, &x, &t, v).unwrap();
        let mut dwant = vec![0.0; n * v];
        cross_entropy_backward(&mut dwant, &x, &lse, &t, v, 1.5).unwrap();
        let w = v / tp;
        let shard = |s: usize| -> Vec<f32> {
            (0..n).flat_map(|r| x[r * v + s * w..r * v + (s + 1) * w].to_vec()).collect()
        };
        let (mut m, mut se, mut tl) = (vec![f32::NEG_INFINITY; n], vec![0.0; n], vec![0.0; n]);
        let mut local = vec![(vec![0.0; n], vec![0.0; n]); tp];
        for (s, (lm, ls)) in local.iter_mut().enumerate() {
            row_max_sumexp(lm, ls, &shard(s), w).unwrap();
            m.iter_mut().zip(lm.iter()).for_each(|(a, b)| *a = a.max(*b));
        }
        for (s, (lm, ls)) in local.iter_mut().enumerate() {
            let mut p = vec![0.0; n];
            sumexp_rescale(ls, lm, &m).unwrap();
            target_logit(&mut p, &shard(s), &t, s * w, w).unwrap();
            se.iter_mut().zip(ls.iter()).for_each(|(a, b)| *a += b);
            tl.iter_mut().zip(&p).for_each(|(a, b)| *a += b);
        }
        let mut lse2 = vec![0.0; n];
        let got = cross_entropy_from_stats(&mut lse2, &m, &se, &tl, &t).unwrap();
        assert!((got - want).abs() < 1e-5 * want.abs(), "{got} vs {want}");
        for s in 0..tp {
            let mut d = vec![f32::NAN; n * w];
            cross_entropy_shard_backward(&mut d, &shard(s), &lse2, &t, s * w, w, 1.5).unwrap();
            for r in 0..n {
                for j in 0..w {
                    let (a, b) = (d[r * w + j], dwant[r * v + s * w + j]);
                    assert!((a - b).abs() < 1e-6, "row {r} class {}: {a} vs {b}", s * w + j);
                }
            }
        }
    }

    /// Logits near 1000 (exp overflows f32 past 88.7): the row max comes out before exp,
    /// so lse = 998 + ln(e^2 + e + 1) = 1000.407606 and the loss of target 1 is
    /// 1.407606 (hand values), not Inf / NaN. A shard row of -inf only has sumexp 0, as
    /// documented (exp(-inf - -inf) would be NaN).
    #[test]
    fn large_logits_and_an_all_masked_shard_row() {
        let (mut loss, mut lse) = ([0f32; 1], [0f32; 1]);
        let l = cross_entropy_forward(&mut loss, &mut lse, &[1000.0, 999.0, 998.0], &[1], 3).unwrap();
        assert!((l - 1.407_606).abs() < 1e-3 && (lse[0] - 1_000.407_6).abs() < 1e-3, "{l} {lse:?}");
        let (mut m, mut s) = ([0f32; 2], [0f32; 2]);
        row_max_sumexp(&mut m, &mut s, &[f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0, 0.0], 2).unwrap();
        assert_eq!((m, s), ([f32::NEG_INFINITY, 0.0], [0.0, 2.0]));
    }
}
