//! RMSNorm (Llama and most current models) and LayerNorm (GPT-2 style), per row of C.
//!
//! Shapes: x, out, dx (N,C); w, b, dw, db (C); mean, rstd (N), N = B*T.
//!
//! Forwards save the per-row statistics (rstd, and mean for LayerNorm) so the backward
//! does not recompute them. Rows are independent, so both directions split rows over
//! rayon tasks. The weight gradients sum over all rows: each block of
//! [`BLOCK_ROWS`] rows produces a partial (C) sum in parallel, and the partials are added
//! in block order, so dw is the same whatever the thread count.
//! References: PyTorch `nn.RMSNorm`, `nn.LayerNorm` (biased variance); llm.c
//! `layernorm_forward/backward`.

use super::{dot, simd, sum};
use crate::{Result, check_len, rows_of};
use rayon::prelude::*;

/// Rows per block in the backward (weight-gradient partial sums are per block).
const BLOCK_ROWS: usize = 32;

/// RMSNorm: out = x · rstd · w, rstd = 1/sqrt(mean(x²) + eps), per row.
/// x, out (N,C); w (C); rstd (N) saved for backward.
///
/// # Errors
/// `ShapeMismatch` for inconsistent lengths or `c == 0`.
pub fn rmsnorm_forward(
    out: &mut [f32],
    rstd: &mut [f32],
    x: &[f32],
    w: &[f32],
    c: usize,
    eps: f32,
) -> Result<()> {
    let n = rows_of("rmsnorm x", x.len(), c)?;
    check_len("rmsnorm out", out.len(), x.len())?;
    check_len("rmsnorm w", w.len(), c)?;
    check_len("rmsnorm rstd", rstd.len(), n)?;
    out.par_chunks_mut(c)
        .zip(rstd.par_iter_mut())
        .zip(x.par_chunks(c))
        .for_each(|((o, rs), xr)| {
            simd(
                #[inline(always)]
                || {
                    let r = 1.0 / (dot(xr, xr) / c as f32 + eps).sqrt();
                    *rs = r;
                    for ((o, &x), &w) in o.iter_mut().zip(xr).zip(w) {
                        *o = x * r * w;
                    }
                },
            )
        });
    Ok(())
}

/// RMSNorm backward. With g = dout, r = rstd:
/// dx = r·(g∘w) − r³/C · x · Σ(g∘w∘x)  (overwritten);  dw += Σ_rows g∘x·r.
///
/// # Errors
/// `ShapeMismatch` for inconsistent lengths or `c == 0`.
pub fn rmsnorm_backward(
    dx: &mut [f32],
    dw: &mut [f32],
    dout: &[f32],
    x: &[f32],
    w: &[f32],
    rstd: &[f32],
    c: usize,
) -> Result<()> {
    let n = rows_of("rmsnorm x", x.len(), c)?;
    check_len("rmsnorm dx", dx.len(), x.len())?;
    check_len("rmsnorm dout", dout.len(), x.len())?;
    check_len("rmsnorm w", w.len(), c)?;
    check_len("rmsnorm dw", dw.len(), c)?;
    check_len("rmsnorm rstd", rstd.len(), n)?;
    let partials: Vec<Vec<f32>> = dx
        .par_chunks_mut(c * BLOCK_ROWS)
        .enumerate()
        .map(|(blk, dxb)| {
            simd(
                #[inline(always)]
                || {
                    let mut dwp = vec![0f32; c];
                    let mut gw = vec![0f32; c];
                    let r0 = blk * BLOCK_ROWS;
                    for (ri, dxr) in dxb.chunks_mut(c).enumerate() {
                        let row = r0 + ri;
                        let xr = &x[row * c..(row + 1) * c];
                        let g = &dout[row * c..(row + 1) * c];
                        let r = rstd[row];
                        for i in 0..c {
                            gw[i] = g[i] * w[i];
                            dwp[i] += g[i] * xr[i] * r;
                        }
                        let k = r * r * r * dot(&gw, xr) / c as f32;
                        for i in 0..c {
                            dxr[i] = r * gw[i] - k * xr[i];
                        }
                    }
                    dwp
                },
            )
        })
        .collect();
    for p in &partials {
        for (a, b) in dw.iter_mut().zip(p) {
            *a += b;
        }
    }
    Ok(())
}

/// LayerNorm: out = (x − mean)·rstd·w + b, per row; biased variance as PyTorch.
/// x, out (N,C); w, b (C); mean, rstd (N) saved for backward.
///
/// # Errors
/// `ShapeMismatch` for inconsistent lengths or `c == 0`.
#[allow(
    clippy::too_many_arguments,
    reason = "signature fixed by the executor's API"
)]
pub fn layernorm_forward(
    out: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    x: &[f32],
    w: &[f32],
    b: &[f32],
    c: usize,
    eps: f32,
) -> Result<()> {
    let n = rows_of("layernorm x", x.len(), c)?;
    check_len("layernorm out", out.len(), x.len())?;
    check_len("layernorm w", w.len(), c)?;
    check_len("layernorm b", b.len(), c)?;
    check_len("layernorm mean", mean.len(), n)?;
    check_len("layernorm rstd", rstd.len(), n)?;
    out.par_chunks_mut(c)
        .zip(mean.par_iter_mut().zip(rstd.par_iter_mut()))
        .zip(x.par_chunks(c))
        .for_each(|((o, (mu, rs)), xr)| {
            let m = sum(xr) / c as f32;
            // two-pass variance: no cancellation when |mean| >> std
            for i in 0..c {
                o[i] = xr[i] - m;
            }
            let var = dot(o, o) / c as f32;
            let r = 1.0 / (var + eps).sqrt();
            for i in 0..c {
                o[i] = o[i] * r * w[i] + b[i];
            }
            *mu = m;
            *rs = r;
        });
    Ok(())
}

/// LayerNorm backward (llm.c form). With n̂ = (x − mean)·rstd and g' = g∘w:
/// dx = rstd·(g' − mean(g') − n̂·mean(g'∘n̂))  (overwritten);  dw += Σ g∘n̂;  db += Σ g.
///
/// # Errors
/// `ShapeMismatch` for inconsistent lengths or `c == 0`.
#[allow(
    clippy::too_many_arguments,
    reason = "signature fixed by the executor's API"
)]
pub fn layernorm_backward(
    dx: &mut [f32],
    dw: &mut [f32],
    db: &mut [f32],
    dout: &[f32],
    x: &[f32],
    w: &[f32],
    mean: &[f32],
    rstd: &[f32],
    c: usize,
) -> Result<()> {
    let n = rows_of("layernorm x", x.len(), c)?;
    check_len("layernorm dx", dx.len(), x.len())?;
    check_len("layernorm dout", dout.len(), x.len())?;
    check_len("layernorm w", w.len(), c)?;
    check_len("layernorm dw", dw.len(), c)?;
    check_len("layernorm db", db.len(), c)?;
    check_len("layernorm mean", mean.len(), n)?;
    check_len("layernorm rstd", rstd.len(), n)?;
    let partials: Vec<(Vec<f32>, Vec<f32>)> = dx
        .par_chunks_mut(c * BLOCK_ROWS)
        .enumerate()
        .map(|(blk, dxb)| {
            let mut dwp = vec![0f32; c];
            let mut dbp = vec![0f32; c];
            let mut nh = vec![0f32; c];
            let mut gw = vec![0f32; c];
            let r0 = blk * BLOCK_ROWS;
            for (ri, dxr) in dxb.chunks_mut(c).enumerate() {
                let row = r0 + ri;
                let xr = &x[row * c..(row + 1) * c];
                let g = &dout[row * c..(row + 1) * c];
                let (m, r) = (mean[row], rstd[row]);
                for i in 0..c {
                    nh[i] = (xr[i] - m) * r;
                    gw[i] = g[i] * w[i];
                    dwp[i] += g[i] * nh[i];
                    dbp[i] += g[i];
                }
                let mg = sum(&gw) / c as f32;
                let mgn = dot(&gw, &nh) / c as f32;
                for i in 0..c {
                    dxr[i] = r * (gw[i] - mg - nh[i] * mgn);
                }
            }
            (dwp, dbp)
        })
        .collect();
    for (pw, pb) in &partials {
        for i in 0..c {
            dw[i] += pw[i];
            db[i] += pb[i];
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{self as r, check::*};

    const SHAPES: &[(usize, usize)] = &[(1, 1), (7, 13), (33, 64), (70, 257)];

    #[test]
    fn rmsnorm_forward_matches_reference() {
        let mut rng = rng(20);
        for &(n, c) in SHAPES {
            let x = randn(&mut rng, n * c);
            let w = randn(&mut rng, c);
            let (mut out, mut rs) = (vec![f32::NAN; n * c], vec![f32::NAN; n]);
            rmsnorm_forward(&mut out, &mut rs, &x, &w, c, 1e-5).unwrap();
            // a few f32 roundings per element on O(1) values
            assert_close(
                "rmsnorm",
                &out,
                &r::rmsnorm(&f64s(&x), &f64s(&w), c, 1e-5),
                1e-5,
                1e-5,
            );
            let want_rs: Vec<f64> = x
                .chunks(c)
                .map(|r| {
                    1.0 / (r.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / c as f64 + 1e-5)
                        .sqrt()
                })
                .collect();
            assert_close("rmsnorm rstd", &rs, &want_rs, 1e-5, 1e-5);
        }
    }

    #[test]
    fn rmsnorm_backward_matches_finite_differences() {
        let mut rng = rng(21);
        for &(n, c) in SHAPES {
            let x = randn(&mut rng, n * c);
            let w = randn(&mut rng, c);
            let rr = randn(&mut rng, n * c);
            let eps = 1e-5;
            let (mut out, mut rs) = (vec![0.0; n * c], vec![0.0; n]);
            rmsnorm_forward(&mut out, &mut rs, &x, &w, c, eps).unwrap();
            let mut dx = vec![f32::NAN; n * c];
            let dw0 = randn(&mut rng, c);
            let mut dw = dw0.clone();
            rmsnorm_backward(&mut dx, &mut dw, &rr, &x, &w, &rs, c).unwrap();
            let (xf, wf) = (f64s(&x), f64s(&w));
            let ix = some(&mut rng, n * c, 80);
            let fdx = fd_grad(&xf, &ix, |xp| {
                loss(&r::rmsnorm(xp, &wf, c, eps as f64), &rr)
            });
            let fdw = fd_grad(&wf, &all(c), |wp| {
                loss(&r::rmsnorm(&xf, wp, c, eps as f64), &rr)
            });
            // rows of |x|~0.6, rstd ~1.7: f32 rounding of a C-term dot ~1e-6 relative
            assert_close("rmsnorm dx", &pick(&dx, &ix), &fdx, 2e-5, 1e-4);
            let ddw: Vec<f32> = dw.iter().zip(&dw0).map(|(a, b)| a - b).collect();
            // dw sums N rows: atol scales with N
            assert_close("rmsnorm dw (+=)", &ddw, &fdw, 1e-5 * n as f64, 1e-4);
        }
    }

    #[test]
    fn layernorm_forward_matches_reference() {
        let mut rng = rng(22);
        for &(n, c) in SHAPES {
            // offset mean so the two-pass variance matters
            let x: Vec<f32> = randn(&mut rng, n * c).iter().map(|v| v + 3.0).collect();
            let w = randn(&mut rng, c);
            let b = randn(&mut rng, c);
            let (mut out, mut m, mut rs) =
                (vec![f32::NAN; n * c], vec![f32::NAN; n], vec![f32::NAN; n]);
            layernorm_forward(&mut out, &mut m, &mut rs, &x, &w, &b, c, 1e-5).unwrap();
            let want = r::layernorm(&f64s(&x), &f64s(&w), &f64s(&b), c, 1e-5);
            // x ~ 3 ± 1: subtracting the f32 mean loses ~eps·3 relative to std ~0.6
            assert_close("layernorm", &out, &want, 5e-5, 5e-5);
            assert!(m.iter().chain(&rs).all(|v| v.is_finite()));
        }
    }

    #[test]
    fn layernorm_backward_matches_finite_differences() {
        let mut rng = rng(23);
        for &(n, c) in SHAPES {
            if c == 1 {
                continue; // variance 0: out = b, derivative w.r.t. x is 0/0-prone at eps scale
            }
            let x = randn(&mut rng, n * c);
            let w = randn(&mut rng, c);
            let b = randn(&mut rng, c);
            let rr = randn(&mut rng, n * c);
            let eps = 1e-5;
            let (mut out, mut m, mut rs) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
            layernorm_forward(&mut out, &mut m, &mut rs, &x, &w, &b, c, eps).unwrap();
            let mut dx = vec![f32::NAN; n * c];
            let (dw0, db0) = (randn(&mut rng, c), randn(&mut rng, c));
            let (mut dw, mut db) = (dw0.clone(), db0.clone());
            layernorm_backward(&mut dx, &mut dw, &mut db, &rr, &x, &w, &m, &rs, c).unwrap();
            let (xf, wf, bf) = (f64s(&x), f64s(&w), f64s(&b));
            let e = eps as f64;
            let ix = some(&mut rng, n * c, 80);
            let fdx = fd_grad(&xf, &ix, |p| loss(&r::layernorm(p, &wf, &bf, c, e), &rr));
            let fdw = fd_grad(&wf, &all(c), |p| {
                loss(&r::layernorm(&xf, p, &bf, c, e), &rr)
            });
            let fdb = fd_grad(&bf, &all(c), |p| {
                loss(&r::layernorm(&xf, &wf, p, c, e), &rr)
            });
            // small C (7 rows of 13) has rstd up to ~3: allow 1e-4 relative
            assert_close("layernorm dx", &pick(&dx, &ix), &fdx, 5e-5, 1e-4);
            let ddw: Vec<f32> = dw.iter().zip(&dw0).map(|(a, b)| a - b).collect();
            let ddb: Vec<f32> = db.iter().zip(&db0).map(|(a, b)| a - b).collect();
            assert_close("layernorm dw (+=)", &ddw, &fdw, 1e-5 * n as f64, 1e-4);
            assert_close("layernorm db (+=)", &ddb, &fdb, 1e-5 * n as f64, 1e-4);
        }
    }

    /// eps goes inside the square root, once: rstd = 1/sqrt(mean + eps). The tests above
    /// use eps = 1e-5 on rows of mean square ~0.3, where 1/(sqrt(ms) + eps) and no eps at
    /// all differ from it by ~2e-6 relative, inside their tolerance. Here rows of 1e-3
    /// (mean square 3e-7, under eps = 1e-6) and a large eps (0.1) tell them apart by
    /// percents; LayerNorm rows at a mean of 100 also fail a one-pass variance
    /// E[x²] − mean², which loses ~1% of the variance there in f32.
    #[test]
    fn norms_add_eps_inside_the_sqrt() {
        let mut rng = rng(24);
        let (n, c) = (5, 48);
        for (scale, eps) in [(1e-3f32, 1e-6f32), (1.0, 0.1)] {
            let x: Vec<f32> = randn(&mut rng, n * c).iter().map(|v| v * scale).collect();
            let w = randn(&mut rng, c);
            let (mut out, mut rs) = (vec![f32::NAN; n * c], vec![f32::NAN; n]);
            rmsnorm_forward(&mut out, &mut rs, &x, &w, c, eps).unwrap();
            let want = r::rmsnorm(&f64s(&x), &f64s(&w), c, eps as f64);
            assert_close(
                &format!("rmsnorm x·{scale} eps {eps}"),
                &out,
                &want,
                1e-5,
                1e-5,
            );
            let want_rs: Vec<f64> = x
                .chunks(c)
                .map(|r| 1.0 / (dot64(&f64s(r), &f64s(r)) / c as f64 + eps as f64).sqrt())
                .collect();
            assert_close(
                &format!("rmsnorm rstd x·{scale} eps {eps}"),
                &rs,
                &want_rs,
                0.0,
                1e-5,
            );
        }
        for (scale, offset, eps) in [
            (1e-3f32, 0.0f32, 1e-6f32),
            (1.0, 0.0, 0.1),
            (1.0, 100.0, 1e-5),
        ] {
            let x: Vec<f32> = randn(&mut rng, n * c)
                .iter()
                .map(|v| v * scale + offset)
                .collect();
            let (w, b) = (randn(&mut rng, c), randn(&mut rng, c));
            let (mut out, mut m, mut rs) =
                (vec![f32::NAN; n * c], vec![f32::NAN; n], vec![f32::NAN; n]);
            layernorm_forward(&mut out, &mut m, &mut rs, &x, &w, &b, c, eps).unwrap();
            let want = r::layernorm(&f64s(&x), &f64s(&w), &f64s(&b), c, eps as f64);
            // at a mean of 100 the f32 mean is off by ~1e-5 (ulp 8e-6): ~3e-5 on out
            assert_close(
                &format!("layernorm x·{scale}+{offset} eps {eps}"),
                &out,
                &want,
                1e-4,
                1e-4,
            );
        }
    }

    #[test]
    fn norms_reject_bad_shapes() {
        let mut out = vec![0.0; 6];
        let mut rs = vec![0.0; 2];
        assert!(rmsnorm_forward(&mut out, &mut rs, &[0.0; 6], &[1.0; 3], 0, 1e-5).is_err());
        assert!(rmsnorm_forward(&mut out, &mut rs, &[0.0; 6], &[1.0; 2], 3, 1e-5).is_err());
        assert!(rmsnorm_forward(&mut out, &mut rs[..1], &[0.0; 6], &[1.0; 3], 3, 1e-5).is_err());
        let mut m = vec![0.0; 2];
        assert!(
            layernorm_forward(
                &mut out, &mut m, &mut rs, &[0.0; 6], &[1.0; 3], &[0.0; 2], 3, 1e-5
            )
            .is_err()
        );
        let (mut dx, mut dw) = (vec![0.0; 6], vec![0.0; 3]);
        assert!(
            rmsnorm_backward(
                &mut dx, &mut dw, &[0.0; 5], &[0.0; 6], &[1.0; 3], &[1.0; 2], 3
            )
            .is_err()
        );
    }
}
