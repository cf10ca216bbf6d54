//! Fused scaled-dot-product attention, flash style, with grouped-query heads,
//! causal and sliding-window masks, and a value head dim that may differ from the
//! query/key head dim (MLA).
//!
//! Shapes: q (B,T,H,D), k (B,T,Hkv,D), v (B,T,Hkv,Dv), out (B,T,H,Dv), lse (B,H,T).
//! Query head h reads kv head h / (H/Hkv).
//!
//! Mask: key j is visible to query i iff
//! - causal: `i - window < j <= i` (no lower bound without a window);
//! - not causal: `|i - j| < window` with a window, everything without.
//!
//! Every query sees at least key i itself, so no softmax row is empty.
//!
//! The (T,T) score matrix is never materialised. The forward walks key tiles of
//! [`BC`] for each tile of [`BR`] queries and keeps a running max, running sum and
//! output accumulator per query row (online softmax): memory per rayon task is
//! O(BR·Dv + BC). It saves lse = log Σ_j exp(s_ij), so the backward can rebuild
//! P_ij = exp(s_ij − lse_i) tile by tile (FlashAttention-2). The backward runs as two
//! passes that each own their output, so it needs neither atomics nor per-thread
//! copies: a key-tile pass accumulates dk and dv, and a query-tile pass accumulates
//! dq. Each pass recomputes the scores, about 1.5× the flops of a single pass with
//! atomics, but it stays deterministic. Parallel tasks are (batch, tile) blocks, which
//! are contiguous in the (B,T,·,·) layouts; heads loop inside a task.

use super::{axpy, dot, exp_f32, max, sum};
use crate::{Result, check_len, numel, shape_err};
use rayon::prelude::*;

/// Queries per tile (rows of one online-softmax block, and one rayon task).
pub const BR: usize = 64;
/// Keys per tile (one score row segment).
pub const BC: usize = 64;

/// Attention shape and options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Attn {
    /// Batch.
    pub b: usize,
    /// Sequence length (queries and keys).
    pub t: usize,
    /// Query heads.
    pub h: usize,
    /// Key/value heads; must divide `h`.
    pub hkv: usize,
    /// Query/key head dim.
    pub d: usize,
    /// Value (and output) head dim.
    pub dv: usize,
    /// Mask future keys.
    pub causal: bool,
    /// Sliding window (>= 1), see the module docs.
    pub window: Option<usize>,
    /// Score scale, usually 1/sqrt(D).
    pub scale: f32,
}

impl Attn {
    /// Keys visible to query i: [lo, hi).
    #[inline]
    fn keys(&self, i: usize) -> (usize, usize) {
        let lo = self.window.map_or(0, |w| (i + 1).saturating_sub(w));
        let hi = if self.causal {
            i + 1
        } else {
            self.window.map_or(self.t, |w| (i + w).min(self.t))
        };
        (lo, hi)
    }

    /// Queries that see key j: [lo, hi).
    #[inline]
    fn queries(&self, j: usize) -> (usize, usize) {
        let lo = if self.causal {
            j
        } else {
            self.window.map_or(0, |w| (j + 1).saturating_sub(w))
        };
        let hi = self.window.map_or(self.t, |w| (j + w).min(self.t));
        (lo, hi)
    }

    fn group(&self) -> usize {
        self.h / self.hkv
    }
}

fn check_shape(a: &Attn) -> Result<()> {
    if a.hkv == 0 || !a.h.is_multiple_of(a.hkv) {
        return shape_err(format!("attention: hkv {} must divide h {}", a.hkv, a.h));
    }
    if a.d == 0 || a.dv == 0 {
        return shape_err("attention: d and dv must be > 0");
    }
    if a.window == Some(0) {
        return shape_err("attention: window must be >= 1");
    }
    // the mask arithmetic adds window to positions
    if a.window.is_some_and(|w| w.checked_add(a.t).is_none()) {
        return shape_err("attention: window too large");
    }
    Ok(())
}

struct Strides {
    q: usize,
    k: usize,
    v: usize,
    o: usize,
}

fn check_io(a: &Attn, q: usize, k: usize, v: usize, o: usize, lse: usize) -> Result<Strides> {
    check_shape(a)?;
    check_len("attention q", q, numel(&[a.b, a.t, a.h, a.d])?)?;
    check_len("attention k", k, numel(&[a.b, a.t, a.hkv, a.d])?)?;
    check_len("attention v", v, numel(&[a.b, a.t, a.hkv, a.dv])?)?;
    check_len("attention out", o, numel(&[a.b, a.t, a.h, a.dv])?)?;
    check_len("attention lse", lse, numel(&[a.b, a.h, a.t])?)?;
    Ok(Strides {
        q: a.h * a.d,
        k: a.hkv * a.d,
        v: a.hkv * a.dv,
        o: a.h * a.dv,
    })
}

/// Splits a (B,T,row) buffer into (b, tile index, chunk of up to `tile` rows) tasks.
fn tiles(buf: &mut [f32], t: usize, row: usize, tile: usize) -> Vec<(usize, usize, &mut [f32])> {
    buf.chunks_mut(t * row)
        .enumerate()
        .flat_map(|(b, bb)| {
            bb.chunks_mut(tile * row)
                .enumerate()
                .map(move |(ti, c)| (b, ti, c))
        })
        .collect()
}

/// out = softmax(scale · q kᵀ + mask) v per (batch, head), flash style.
/// q (B,T,H,D), k (B,T,Hkv,D), v (B,T,Hkv,Dv) → out (B,T,H,Dv); lse (B,H,T) saved
/// (log-sum-exp of the scaled, masked scores of each query row).
///
/// # Errors
/// `ShapeMismatch` for wrong lengths, `hkv` not dividing `h`, `d`/`dv` of 0 or a window of 0.
pub fn attention_forward(
    out: &mut [f32],
    lse: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    a: Attn,
) -> Result<()> {
    let s = check_io(&a, q.len(), k.len(), v.len(), out.len(), lse.len())?;
    if out.is_empty() {
        return Ok(());
    }
    let (d, dv, t) = (a.d, a.dv, a.t);
    let tasks = tiles(out, t, s.o, BR);
    // Each task returns its lse values (H, rows), scattered afterwards: lse is
    // (B,H,T), so a task's rows are not contiguous there.
    let lse_parts: Vec<(usize, usize, Vec<f32>)> = tasks
        .into_par_iter()
        .map(|(b, ti, o)| {
            let t0 = ti * BR;
            let rows = o.len() / s.o;
            let mut lse_t = vec![0f32; a.h * rows];
            let mut m = vec![0f32; rows];
            let mut l = vec![0f32; rows];
            let mut acc = vec![0f32; rows * dv];
            let mut sc = vec![0f32; BC];
            let mut kt = vec![0f32; d * BC];
            for h in 0..a.h {
                let g = h / a.group();
                m.fill(f32::NEG_INFINITY);
                l.fill(0.0);
                acc.fill(0.0);
                let (klo, _) = a.keys(t0);
                let (_, khi) = a.keys(t0 + rows - 1);
                let mut j0 = klo;
                while j0 < khi {
                    let j1 = (j0 + BC).min(khi);
                    gather_t(&mut kt, k, s.k, (b * t + j0) * s.k + g * d, d, j1 - j0);
                    for r in 0..rows {
                        let i = t0 + r;
                        let (lo, hi) = a.keys(i);
                        let (lo, hi) = (lo.max(j0), hi.min(j1));
                        if lo >= hi {
                            continue;
                        }
                        let qi = &q[(b * t + i) * s.q + h * d..][..d];
                        let sr = &mut sc[..hi - lo];
                        row_times_tile(sr, qi, &kt, lo - j0, a.scale);
                        let m_new = m[r].max(max(sr));
                        let accr = &mut acc[r * dv..(r + 1) * dv];
                        if m[r] != m_new {
                            let corr = if m[r] == f32::NEG_INFINITY {
                                0.0
                            } else {
                                (m[r] - m_new).exp()
                            };
                            l[r] *= corr;
                            accr.iter_mut().for_each(|x| *x *= corr);
                            m[r] = m_new;
                        }
                        for x in sr.iter_mut() {
                            *x = exp_f32(*x - m_new);
                        }
                        l[r] += sum(sr);
                        for (jj, &p) in sr.iter().enumerate() {
                            axpy(accr, p, &v[(b * t + lo + jj) * s.v + g * dv..][..dv]);
                        }
                    }
                    j0 = j1;
                }
                for r in 0..rows {
                    let inv = 1.0 / l[r];
                    let orow = &mut o[r * s.o + h * dv..][..dv];
                    for (x, y) in orow.iter_mut().zip(&acc[r * dv..(r + 1) * dv]) {
                        *x = y * inv;
                    }
                    lse_t[h * rows + r] = m[r] + l[r].ln();
                }
            }
            (b, t0, lse_t)
        })
        .collect();
    for (b, t0, part) in lse_parts {
        let rows = part.len() / a.h;
        for h in 0..a.h {
            lse[(b * a.h + h) * t + t0..][..rows].copy_from_slice(&part[h * rows..(h + 1) * rows]);
        }
    }
    Ok(())
}

/// Flash backward. Given dout (B,T,H,Dv) and the forward's q, k, v, out, lse:
/// with P_ij = exp(scale·q_i·k_j − lse_i), D_i = Σ dout_i∘out_i,
/// dS_ij = P_ij (dout_i·v_j − D_i):
/// dv_j = Σ_i P_ij dout_i,  dk_j = scale Σ_i dS_ij q_i,  dq_i = scale Σ_j dS_ij k_j,
/// summed over the query heads of each kv head. dq, dk, dv are overwritten.
///
/// # Errors
/// As [`attention_forward`], plus lengths of the gradient buffers.
#[allow(
    clippy::too_many_arguments,
    reason = "signature fixed by the executor's API"
)]
pub fn attention_backward(
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
    dout: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    a: Attn,
) -> Result<()> {
    let s = check_io(&a, q.len(), k.len(), v.len(), out.len(), lse.len())?;
    check_len("attention dq", dq.len(), q.len())?;
    check_len("attention dk", dk.len(), k.len())?;
    check_len("attention dv", dv.len(), v.len())?;
    check_len("attention dout", dout.len(), out.len())?;
    if dq.is_empty() {
        return Ok(());
    }
    let (d, dvd, t, group) = (a.d, a.dv, a.t, a.group());
    // D_i = rowsum(dout ∘ out), laid out (B,T,H) like the rows it comes from.
    let mut delta = vec![0f32; a.b * t * a.h];
    delta.par_chunks_mut(a.h).enumerate().for_each(|(bt, dr)| {
        for (h, x) in dr.iter_mut().enumerate() {
            let off = bt * s.o + h * dvd;
            *x = dot(&dout[off..off + dvd], &out[off..off + dvd]);
        }
    });
    let lse_at = |b: usize, h: usize, i: usize| lse[(b * a.h + h) * t + i];

    // Pass 1: dk, dv, one task per (batch, key tile), all kv heads.
    let dk_tiles = tiles(dk, t, s.k, BC);
    let dv_tiles = tiles(dv, t, s.v, BC);
    dk_tiles
        .into_par_iter()
        .zip(dv_tiles)
        .for_each(|((b, ti, dkt), (_, _, dvt))| {
            dkt.fill(0.0);
            dvt.fill(0.0);
            let j0 = ti * BC;
            let cols = dkt.len() / s.k;
            let j1 = j0 + cols;
            let mut p = vec![0f32; BC];
            let mut ds = vec![0f32; BC];
            let mut kt = vec![0f32; d * BC];
            let mut vt = vec![0f32; dvd * BC];
            let (qlo, _) = a.queries(j0);
            let (_, qhi) = a.queries(j1 - 1);
            for g in 0..a.hkv {
                gather_t(&mut kt, k, s.k, (b * t + j0) * s.k + g * d, d, cols);
                gather_t(&mut vt, v, s.v, (b * t + j0) * s.v + g * dvd, dvd, cols);
                for h in g * group..(g + 1) * group {
                    for i in qlo..qhi {
                        let (lo, hi) = a.keys(i);
                        let (lo, hi) = (lo.max(j0), hi.min(j1));
                        if lo >= hi {
                            continue;
                        }
                        let n = hi - lo;
                        let qi = &q[(b * t + i) * s.q + h * d..][..d];
                        let doi = &dout[(b * t + i) * s.o + h * dvd..][..dvd];
                        let (li, di) = (lse_at(b, h, i), delta[(b * t + i) * a.h + h]);
                        scores_and_ds(
                            &mut p[..n],
                            &mut ds[..n],
                            qi,
                            doi,
                            &kt,
                            &vt,
                            lo - j0,
                            a.scale,
                            li,
                            di,
                        );
                        for jj in 0..n {
                            let jl = lo + jj - j0;
                            axpy(&mut dvt[jl * s.v + g * dvd..][..dvd], p[jj], doi);
                            axpy(&mut dkt[jl * s.k + g * d..][..d], ds[jj] * a.scale, qi);
                        }
                    }
                }
            }
        });

    // Pass 2: dq, one task per (batch, query tile), all heads.
    tiles(dq, t, s.q, BR)
        .into_par_iter()
        .for_each(|(b, ti, dqt)| {
            dqt.fill(0.0);
            let t0 = ti * BR;
            let rows = dqt.len() / s.q;
            let mut p = vec![0f32; BC];
            let mut ds = vec![0f32; BC];
            let mut kt = vec![0f32; d * BC];
            let mut vt = vec![0f32; dvd * BC];
            let (klo, _) = a.keys(t0);
            let (_, khi) = a.keys(t0 + rows - 1);
            for h in 0..a.h {
                let g = h / group;
                let mut j0 = klo;
                while j0 < khi {
                    let j1 = (j0 + BC).min(khi);
                    gather_t(&mut kt, k, s.k, (b * t + j0) * s.k + g * d, d, j1 - j0);
                    gather_t(&mut vt, v, s.v, (b * t + j0) * s.v + g * dvd, dvd, j1 - j0);
                    for r in 0..rows {
                        let i = t0 + r;
                        let (lo, hi) = a.keys(i);
                        let (lo, hi) = (lo.max(j0), hi.min(j1));
                        if lo >= hi {
                            continue;
                        }
                        let n = hi - lo;
                        let qi = &q[(b * t + i) * s.q + h * d..][..d];
                        let doi = &dout[(b * t + i) * s.o + h * dvd..][..dvd];
                        let (li, di) = (lse_at(b, h, i), delta[(b * t + i) * a.h + h]);
                        scores_and_ds(
                            &mut p[..n],
                            &mut ds[..n],
                            qi,
                            doi,
                            &kt,
                            &vt,
                            lo - j0,
                            a.scale,
                            li,
                            di,
                        );
                        let dqi = &mut dqt[r * s.q + h * d..][..d];
                        for jj in 0..n {
                            axpy(
                                dqi,
                                ds[jj] * a.scale,
                                &k[(b * t + lo + jj) * s.k + g * d..][..d],
                            );
                        }
                    }
                    j0 = j1;
                }
            }
        });
    Ok(())
}

/// Copies `n` rows of width `w` (row stride `stride`, first at `start`) of `src` into
/// `dst` transposed: dst[c·BC + jj] = row jj, column c. Keys of a tile then sit
/// contiguously per channel, so scores for a whole tile come out of plain axpys
/// (see [`row_times_tile`]) instead of one horizontal dot-product reduction per key.
fn gather_t(dst: &mut [f32], src: &[f32], stride: usize, start: usize, w: usize, n: usize) {
    for jj in 0..n {
        let row = &src[start + jj * stride..][..w];
        for (c, &x) in row.iter().enumerate() {
            dst[c * BC + jj] = x;
        }
    }
}

/// out[jj] = alpha · Σ_c x[c] · tile[c·BC + off + jj], for the tile columns off..off+out.len().
#[inline]
fn row_times_tile(out: &mut [f32], x: &[f32], tile: &[f32], off: usize, alpha: f32) {
    out.fill(0.0);
    let n = out.len();
    for (c, &xc) in x.iter().enumerate() {
        axpy(out, alpha * xc, &tile[c * BC + off..][..n]);
    }
}

/// For query row i (q_i, dout_i, lse_i, D_i) against the keys at columns off.. of the
/// transposed k and v tiles: p_j = exp(scale·q_i·k_j − lse_i), ds_j = p_j (dout_i·v_j − D_i).
#[allow(
    clippy::too_many_arguments,
    reason = "internal helper of the two backward passes"
)]
#[inline]
fn scores_and_ds(
    p: &mut [f32],
    ds: &mut [f32],
    qi: &[f32],
    doi: &[f32],
    kt: &[f32],
    vt: &[f32],
    off: usize,
    scale: f32,
    lse_i: f32,
    delta_i: f32,
) {
    row_times_tile(p, qi, kt, off, scale);
    row_times_tile(ds, doi, vt, off, 1.0);
    for (x, y) in p.iter_mut().zip(ds.iter_mut()) {
        *x = exp_f32(*x - lse_i);
        *y = *x * (*y - delta_i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{self as r, check::*};

    #[allow(clippy::too_many_arguments)]
    fn mk(
        b: usize,
        t: usize,
        h: usize,
        hkv: usize,
        d: usize,
        dv: usize,
        causal: bool,
        window: Option<usize>,
    ) -> Attn {
        Attn {
            b,
            t,
            h,
            hkv,
            d,
            dv,
            causal,
            window,
            scale: 1.0 / (d as f32).sqrt(),
        }
    }

    fn inputs(rng: &mut Rng, a: &Attn) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        // scale q up so softmax rows are peaked, not near-uniform (exercises the
        // running-max rescaling)
        let q: Vec<f32> = randn(rng, a.b * a.t * a.h * a.d)
            .iter()
            .map(|x| 3.0 * x)
            .collect();
        (
            q,
            randn(rng, a.b * a.t * a.hkv * a.d),
            randn(rng, a.b * a.t * a.hkv * a.dv),
        )
    }

    fn forward_cases() -> Vec<Attn> {
        vec![
            mk(1, 1, 1, 1, 4, 4, true, None),
            mk(2, 7, 6, 2, 8, 8, true, None),
            mk(1, 7, 6, 1, 5, 3, false, None), // MQA, D != Dv, bidirectional
            mk(2, 13, 6, 6, 16, 24, true, Some(4)),
            mk(1, 130, 4, 2, 16, 8, true, None), // crosses BR/BC tile edges
            mk(1, 150, 2, 1, 8, 8, true, Some(70)),
            mk(1, 100, 2, 2, 8, 4, false, Some(30)),
            mk(1, 129, 1, 1, 4, 4, false, None),
        ]
    }

    #[test]
    fn attention_forward_matches_reference() {
        let mut rng = rng(40);
        for a in forward_cases() {
            let (q, k, v) = inputs(&mut rng, &a);
            let mut out = vec![f32::NAN; a.b * a.t * a.h * a.dv];
            let mut lse = vec![f32::NAN; a.b * a.h * a.t];
            attention_forward(&mut out, &mut lse, &q, &k, &v, a).unwrap();
            let (wo, wl) = r::attention(&f64s(&q), &f64s(&k), &f64s(&v), &a);
            // scores up to ~|3·D·scale|: f32 dot + exp_f32 (2 ulp) + T-term sums;
            // 1e-5 relative on |out| <= 1 leaves ~10x margin
            assert_close(&format!("attention out {a:?}"), &out, &wo, 1e-5, 1e-5);
            assert_close(&format!("attention lse {a:?}"), &lse, &wl, 1e-5, 1e-5);
        }
    }

    #[test]
    fn attention_backward_matches_finite_differences() {
        let mut rng = rng(41);
        let cases = [
            mk(2, 7, 6, 2, 8, 8, true, None),
            mk(1, 7, 6, 1, 5, 3, false, None),
            mk(1, 13, 4, 2, 6, 10, true, Some(4)),
            mk(1, 70, 2, 1, 6, 4, true, None), // two key/query tiles
            mk(1, 80, 2, 2, 4, 4, false, Some(20)),
        ];
        for a in cases {
            let (q, k, v) = inputs(&mut rng, &a);
            let mut out = vec![0.0; a.b * a.t * a.h * a.dv];
            let mut lse = vec![0.0; a.b * a.h * a.t];
            attention_forward(&mut out, &mut lse, &q, &k, &v, a).unwrap();
            let rr = randn(&mut rng, out.len());
            let (mut dq, mut dk, mut dv) = (
                vec![f32::NAN; q.len()],
                vec![f32::NAN; k.len()],
                vec![f32::NAN; v.len()],
            );
            attention_backward(&mut dq, &mut dk, &mut dv, &rr, &q, &k, &v, &out, &lse, a).unwrap();
            let (qf, kf, vf) = (f64s(&q), f64s(&k), f64s(&v));
            let iq = some(&mut rng, q.len(), 40);
            let ik = some(&mut rng, k.len(), 40);
            let iv = some(&mut rng, v.len(), 40);
            let fq = fd_grad(&qf, &iq, |p| loss(&r::attention(p, &kf, &vf, &a).0, &rr));
            let fk = fd_grad(&kf, &ik, |p| loss(&r::attention(&qf, p, &vf, &a).0, &rr));
            let fv = fd_grad(&vf, &iv, |p| loss(&r::attention(&qf, &kf, p, &a).0, &rr));
            // gradients sum O(T·H/Hkv) f32 terms of size ~1; D_i cancels against
            // dout·v: 1e-4 absolute + relative
            assert_close(
                &format!("attention dq {a:?}"),
                &pick(&dq, &iq),
                &fq,
                1e-4,
                1e-4,
            );
            assert_close(
                &format!("attention dk {a:?}"),
                &pick(&dk, &ik),
                &fk,
                1e-4,
                1e-4,
            );
            assert_close(
                &format!("attention dv {a:?}"),
                &pick(&dv, &iv),
                &fv,
                1e-4,
                1e-4,
            );
            assert!(
                dq.iter().chain(&dk).chain(&dv).all(|x| x.is_finite()),
                "unwritten gradient"
            );
        }
    }

    /// T = 2048: a materialised (T,T) f32 score matrix would be 16 MiB per head; the
    /// kernel only holds tiles. Checks a sample of rows against the reference
    /// computed row by row.
    #[test]
    fn attention_long_sequence_is_tiled_and_correct() {
        let mut rng = rng(42);
        let a = mk(1, 2048, 1, 1, 16, 16, true, None);
        let (q, k, v) = inputs(&mut rng, &a);
        let mut out = vec![f32::NAN; a.t * a.dv];
        let mut lse = vec![f32::NAN; a.t];
        attention_forward(&mut out, &mut lse, &q, &k, &v, a).unwrap();
        let rows = [0usize, 1, 63, 64, 65, 1000, 2046, 2047];
        for &i in &rows {
            let qi = f64s(&q[i * 16..(i + 1) * 16]);
            let s: Vec<f64> = (0..=i)
                .map(|j| dot64(&qi, &f64s(&k[j * 16..(j + 1) * 16])) * a.scale as f64)
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            let mut o = vec![0.0; 16];
            for (j, sj) in s.iter().enumerate() {
                for (c, oc) in o.iter_mut().enumerate() {
                    *oc += (sj - m).exp() / z * v[j * 16 + c] as f64;
                }
            }
            assert_close(
                &format!("long row {i}"),
                &out[i * 16..(i + 1) * 16],
                &o,
                1e-5,
                1e-5,
            );
            assert_close(
                &format!("long lse {i}"),
                &lse[i..i + 1],
                &[m + z.ln()],
                1e-5,
                1e-5,
            );
        }
        // the backward at the same size runs and writes every element
        let rr = randn(&mut rng, out.len());
        let (mut dq, mut dk, mut dv) = (
            vec![f32::NAN; q.len()],
            vec![f32::NAN; k.len()],
            vec![f32::NAN; v.len()],
        );
        attention_backward(&mut dq, &mut dk, &mut dv, &rr, &q, &k, &v, &out, &lse, a).unwrap();
        assert!(dq.iter().chain(&dk).chain(&dv).all(|x| x.is_finite()));
    }

    #[test]
    fn attention_rejects_bad_shapes() {
        let a = mk(1, 4, 4, 2, 2, 2, true, None);
        let (q, k, v) = (vec![0.0; 32], vec![0.0; 16], vec![0.0; 16]);
        let (mut o, mut l) = (vec![0.0; 32], vec![0.0; 16]);
        assert!(attention_forward(&mut o, &mut l, &q, &k, &v, a).is_ok());
        assert!(attention_forward(&mut o, &mut l, &q, &k, &v, Attn { hkv: 3, ..a }).is_err());
        assert!(attention_forward(&mut o, &mut l, &q, &k, &v, Attn { hkv: 0, ..a }).is_err());
        assert!(
            attention_forward(
                &mut o,
                &mut l,
                &q,
                &k,
                &v,
                Attn {
                    window: Some(0),
                    ..a
                }
            )
            .is_err()
        );
        assert!(
            attention_forward(
                &mut o,
                &mut l,
                &q,
                &k,
                &v,
                Attn {
                    window: Some(usize::MAX),
                    ..a
                }
            )
            .is_err()
        );
        assert!(attention_forward(&mut o, &mut l[..15], &q, &k, &v, a).is_err());
        assert!(attention_forward(&mut o, &mut l, &q, &k[..15], &v, a).is_err());
        let (mut dq, mut dk, mut dv) = (vec![0.0; 32], vec![0.0; 16], vec![0.0; 15]);
        assert!(attention_backward(&mut dq, &mut dk, &mut dv, &o, &q, &k, &v, &o, &l, a).is_err());
    }
}
