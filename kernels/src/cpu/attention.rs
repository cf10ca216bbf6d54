//! Fused scaled-dot-product attention, flash style, with grouped-query heads,
//! causal and sliding-window masks, and a value head dim that may differ from the
//! query/key head dim (MLA).
//!
//! Shapes: q (B,T,H,D), k (B,Tk,Hkv,D), v (B,Tk,Hkv,Dv), out (B,T,H,Dv), lse (B,H,T).
//! Query head h reads kv head h / (H/Hkv). Tk = T, except under context parallelism.
//!
//! Mask, on global positions i (query) and j (key): key j is visible to query i iff
//! - causal: `i - window < j <= i` (no lower bound without a window);
//! - not causal: `|i - j| < window` with a window, everything without.
//!
//! Without context parallelism row t of q, k and v is position t. With it
//! ([`Attn::cp`]), q's T rows are a cp rank's two chunks of the global sequence and k, v
//! hold the cp·T rows all-gathered over the cp group (every rank's chunks, rank order),
//! see [`super::cp`]; each row has its global position and the mask compares those.
//! The kernel walks rows as [`Run`]s of consecutive positions (one run per tensor
//! without cp, so the plain path is unchanged): query tiles stay inside a query run, and
//! each query tile visits, run by run, the key tiles its mask reaches.
//!
//! Every query sees at least the key at its own position, so no softmax row is empty.
//!
//! The (T,T) score matrix is never materialised. Both directions run one rayon task
//! per (batch, query head) and walk tiles of [`BR`] queries × [`BC`] keys: the score
//! tile S = scale·Q Kᵀ and every other tile product are small GEMMs (faer, AVX-512 or
//! AVX2 micro-kernels picked at run time), and the element-wise softmax work between
//! them runs in [`super::simd`] code. The forward keeps a running max, running sum and
//! output accumulator per query row (online softmax): memory per task is O(T·Dv +
//! BR·BC). It saves lse = log Σ_j exp(s_ij), so the backward can rebuild
//! P_ij = exp(s_ij − lse_i) tile by tile (FlashAttention-2) in a single pass: each task
//! owns its head's dq and private dk/dv blocks, summed over the query heads of a kv head
//! in head order afterwards, so there are no atomics and results do not depend on the
//! thread count.

use super::cp::{CpShard, Run};
use super::{clear_upper, dot, exp_f32, max, simd, sum};
use crate::{Result, check_len, numel, shape_err};
use faer::linalg::matmul::matmul as faer_matmul;
use faer::{Accum, MatMut, MatRef, Par};
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
    /// Sequence length of q (and of k, v without context parallelism).
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
    /// Context parallelism: q's `t` rows (even) are this rank's two chunks and k, v
    /// hold the `size·t` rows gathered over the cp group (module docs). `None`: q, k
    /// and v are all positions 0..t.
    pub cp: Option<CpShard>,
}

impl Attn {
    /// Rows of k and v (and the global sequence length): t, or cp·t.
    pub fn kv_len(&self) -> usize {
        self.cp.map_or(self.t, |cp| cp.size * self.t)
    }

    /// Global positions of the keys visible to the query at global position i: [lo, hi).
    #[inline]
    fn keys(&self, i: usize) -> (usize, usize) {
        let tg = self.kv_len();
        let lo = self.window.map_or(0, |w| (i + 1).saturating_sub(w));
        let hi = if self.causal {
            i + 1
        } else {
            self.window.map_or(tg, |w| (i + w).min(tg))
        };
        (lo, hi)
    }

    /// The rows of q and of k/v as runs of consecutive global positions.
    fn runs(&self) -> Runs {
        match self.cp {
            None => {
                let all = Run {
                    row: 0,
                    pos: 0,
                    len: self.t,
                };
                Runs {
                    q: vec![all],
                    k: vec![all],
                }
            }
            Some(cp) => Runs {
                q: cp.local_runs(self.t).to_vec(),
                k: cp.gathered_runs(self.t),
            },
        }
    }

    fn group(&self) -> usize {
        self.h / self.hkv
    }
}

/// Query and key rows as runs of consecutive global positions.
struct Runs {
    q: Vec<Run>,
    k: Vec<Run>,
}

/// The shape rules of an attention call (every backend's: the CUDA one checks with this
/// too): heads, head dims, window, the cp shard.
///
/// # Errors
/// `ShapeMismatch` naming the rule broken.
pub fn check_shape(a: &Attn) -> Result<()> {
    if a.hkv == 0 || !a.h.is_multiple_of(a.hkv) {
        return shape_err(format!("attention: hkv {} must divide h {}", a.hkv, a.h));
    }
    if a.d == 0 || a.dv == 0 {
        return shape_err("attention: d and dv must be > 0");
    }
    if a.window == Some(0) {
        return shape_err("attention: window must be >= 1");
    }
    if let Some(cp) = a.cp {
        cp.check("attention", a.t)?;
    }
    // the mask arithmetic adds window to positions
    if a.window
        .is_some_and(|w| w.checked_add(a.kv_len()).is_none())
    {
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
    check_len("attention k", k, numel(&[a.b, a.kv_len(), a.hkv, a.d])?)?;
    check_len("attention v", v, numel(&[a.b, a.kv_len(), a.hkv, a.dv])?)?;
    check_len("attention out", o, numel(&[a.b, a.t, a.h, a.dv])?)?;
    check_len("attention lse", lse, numel(&[a.b, a.h, a.t])?)?;
    Ok(Strides {
        q: a.h * a.d,
        k: a.hkv * a.d,
        v: a.hkv * a.dv,
        o: a.h * a.dv,
    })
}

/// One (rows × width) block of a (B,T,heads,width)-style buffer: `rows` rows from flat
/// row `row0` (= b·T + i), `width` columns from column `col0`, row stride `stride`.
#[inline]
fn view(
    x: &[f32],
    row0: usize,
    rows: usize,
    stride: usize,
    col0: usize,
    width: usize,
) -> MatRef<'_, f32> {
    MatRef::from_row_major_slice_with_stride(&x[row0 * stride + col0..], rows, width, stride)
}

/// c = alpha · a · b (+ c if `acc`) on the calling thread: the tile products. faer picks
/// its own AVX-512/AVX2 micro-kernels at run time.
#[inline]
fn mm(c: MatMut<'_, f32>, acc: bool, a: MatRef<'_, f32>, b: MatRef<'_, f32>, alpha: f32) {
    let accum = if acc { Accum::Add } else { Accum::Replace };
    faer_matmul(c, accum, a, b, alpha, Par::Seq);
    clear_upper();
}

/// The query at global position i against the key tile of global positions
/// [j0, j0 + cols): the visible columns [a0, a1) of the tile row (empty if none).
#[inline]
fn visible(a: &Attn, i: usize, j0: usize, cols: usize) -> (usize, usize) {
    let (lo, hi) = a.keys(i);
    let (lo, hi) = (lo.max(j0), hi.min(j0 + cols));
    if lo >= hi { (0, 0) } else { (lo - j0, hi - j0) }
}

/// Global key positions [klo, khi) some query of the tile of global positions
/// [i0, i0 + rows) sees.
#[inline]
fn key_span(a: &Attn, i0: usize, rows: usize) -> (usize, usize) {
    (a.keys(i0).0, a.keys(i0 + rows - 1).1)
}

/// out = softmax(scale · q kᵀ + mask) v per (batch, head), flash style.
/// q (B,T,H,D), k (B,Tk,Hkv,D), v (B,Tk,Hkv,Dv) → out (B,T,H,Dv); lse (B,H,T) saved
/// (log-sum-exp of the scaled, masked scores of each query row). Tk = [`Attn::kv_len`].
///
/// One rayon task per (batch, head). Per query tile of [`BR`] rows and key tile of
/// [`BC`] keys: S = scale·Q Kᵀ and O += P V are small GEMMs (faer); the online softmax
/// between them runs over the tile rows in [`super::simd`] code. A head's lse is
/// contiguous in (B,H,T) and written in place; its output rows are strided in
/// (B,T,H,Dv), so each task fills a (T,Dv) block that is copied into place after.
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
    let (dv, t) = (a.dv, a.t);
    let runs = a.runs();
    let blocks: Vec<Vec<f32>> = lse
        .par_chunks_mut(t)
        .enumerate()
        .map(|(bh, lse_h)| {
            let mut o_h = vec![0f32; t * dv];
            simd(
                #[inline(always)]
                || forward_head(&mut o_h, lse_h, q, k, v, &a, &s, &runs, bh / a.h, bh % a.h),
            );
            o_h
        })
        .collect();
    out.par_chunks_mut(t * s.o).enumerate().for_each(|(b, ob)| {
        for h in 0..a.h {
            let src = &blocks[b * a.h + h];
            for (i, row) in src.chunks_exact(dv).enumerate() {
                ob[i * s.o + h * dv..][..dv].copy_from_slice(row);
            }
        }
    });
    Ok(())
}

/// Forward of head h of batch b: o_h (T,Dv), lse_h (T).
#[allow(
    clippy::too_many_arguments,
    reason = "internal helper of attention_forward"
)]
#[inline(always)]
fn forward_head(
    o_h: &mut [f32],
    lse_h: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    a: &Attn,
    s: &Strides,
    runs: &Runs,
    b: usize,
    h: usize,
) {
    let (d, dv, t, tk) = (a.d, a.dv, a.t, a.kv_len());
    let g = h / a.group();
    let mut sc = vec![0f32; BR * BC];
    let (mut m, mut l) = ([0f32; BR], [0f32; BR]);
    for qr in &runs.q {
        let mut i0 = 0;
        while i0 < qr.len {
            // Query rows [row0, row0 + rows) at global positions [p0, p0 + rows).
            let rows = BR.min(qr.len - i0);
            let (row0, p0) = (qr.row + i0, qr.pos + i0);
            let qm = view(q, b * t + row0, rows, s.q, h * d, d);
            let acc = &mut o_h[row0 * dv..(row0 + rows) * dv];
            acc.fill(0.0);
            m.fill(f32::NEG_INFINITY);
            l.fill(0.0);
            let (klo, khi) = key_span(a, p0, rows);
            for kr in &runs.k {
                // Keys of this run the tile reaches, by global position.
                let (klo, khi) = (klo.max(kr.pos), khi.min(kr.pos + kr.len));
                let mut j0 = klo;
                while j0 < khi {
                    let cols = BC.min(khi - j0);
                    let krow = kr.row + (j0 - kr.pos);
                    let km = view(k, b * tk + krow, cols, s.k, g * d, d);
                    let vm = view(v, b * tk + krow, cols, s.v, g * dv, dv);
                    let st = &mut sc[..rows * cols];
                    mm(
                        MatMut::from_row_major_slice_mut(st, rows, cols),
                        false,
                        qm,
                        km.transpose(),
                        a.scale,
                    );
                    for (r, row) in st.chunks_exact_mut(cols).enumerate() {
                        let (a0, a1) = visible(a, p0 + r, j0, cols);
                        row[..a0].fill(0.0);
                        row[a1..].fill(0.0);
                        if a0 == a1 {
                            continue;
                        }
                        let x = &mut row[a0..a1];
                        let m_new = m[r].max(max(x));
                        if m[r] != m_new {
                            let corr = if m[r] == f32::NEG_INFINITY {
                                0.0
                            } else {
                                (m[r] - m_new).exp()
                            };
                            l[r] *= corr;
                            acc[r * dv..(r + 1) * dv]
                                .iter_mut()
                                .for_each(|y| *y *= corr);
                            m[r] = m_new;
                        }
                        for y in x.iter_mut() {
                            *y = exp_f32(*y - m_new);
                        }
                        l[r] += sum(x);
                    }
                    mm(
                        MatMut::from_row_major_slice_mut(acc, rows, dv),
                        true,
                        MatRef::from_row_major_slice(st, rows, cols),
                        vm,
                        1.0,
                    );
                    j0 += cols;
                }
            }
            for (r, orow) in acc.chunks_exact_mut(dv).enumerate() {
                let inv = 1.0 / l[r];
                orow.iter_mut().for_each(|y| *y *= inv);
                lse_h[row0 + r] = m[r] + l[r].ln();
            }
            i0 += rows;
        }
    }
}

/// Flash backward. Given dout (B,T,H,Dv) and the forward's q, k, v, out, lse:
/// with P_ij = exp(scale·q_i·k_j − lse_i), D_i = Σ dout_i∘out_i,
/// dS_ij = P_ij (dout_i·v_j − D_i):
/// dv_j = Σ_i P_ij dout_i,  dk_j = scale Σ_i dS_ij q_i,  dq_i = scale Σ_j dS_ij k_j,
/// summed over the query heads of each kv head. dq, dk, dv are overwritten.
///
/// One rayon task per (batch, query head), FlashAttention-2 order: per query tile, per
/// key tile, rebuild P from lse and run the four products (dV += Pᵀ dO, dP = dO Vᵀ,
/// dQ += dS K, dK += dSᵀ Q) as small GEMMs. A task owns its head's dq and a private
/// (Tk,D) dk and (Tk,Dv) dv, so scores are computed once, with no atomics; the private
/// dk/dv of the query heads sharing a kv head are then summed in head order, so the
/// result does not depend on the thread count. Extra memory: B·H·(T·D + Tk·(D + Dv))
/// floats, freed on return.
///
/// Under context parallelism dk and dv cover the whole gathered sequence but only this
/// rank's queries: the cp ranks' dk, dv are partial sums, to be reduce-scattered.
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
    let (d, dvd, t, tk, group) = (a.d, a.dv, a.t, a.kv_len(), a.group());
    let runs = a.runs();
    let parts: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = (0..a.b * a.h)
        .into_par_iter()
        .map(|bh| {
            let mut dq_h = vec![0f32; t * d];
            let mut dk_h = vec![0f32; tk * d];
            let mut dv_h = vec![0f32; tk * dvd];
            simd(
                #[inline(always)]
                || {
                    backward_head(
                        &mut dq_h,
                        &mut dk_h,
                        &mut dv_h,
                        dout,
                        q,
                        k,
                        v,
                        out,
                        lse,
                        &a,
                        &s,
                        &runs,
                        bh / a.h,
                        bh % a.h,
                    )
                },
            );
            (dq_h, dk_h, dv_h)
        })
        .collect();
    dq.par_chunks_mut(t * s.q).enumerate().for_each(|(b, qb)| {
        for h in 0..a.h {
            for (i, row) in parts[b * a.h + h].0.chunks_exact(d).enumerate() {
                qb[i * s.q + h * d..][..d].copy_from_slice(row);
            }
        }
    });
    dk.par_chunks_mut(tk * s.k)
        .zip(dv.par_chunks_mut(tk * s.v))
        .enumerate()
        .for_each(|(b, (kb, vb))| {
            for g in 0..a.hkv {
                let heads = &parts[b * a.h + g * group..b * a.h + (g + 1) * group];
                for i in 0..tk {
                    let kr = &mut kb[i * s.k + g * d..][..d];
                    kr.copy_from_slice(&heads[0].1[i * d..][..d]);
                    for p in &heads[1..] {
                        kr.iter_mut()
                            .zip(&p.1[i * d..][..d])
                            .for_each(|(x, y)| *x += y);
                    }
                    let vr = &mut vb[i * s.v + g * dvd..][..dvd];
                    vr.copy_from_slice(&heads[0].2[i * dvd..][..dvd]);
                    for p in &heads[1..] {
                        vr.iter_mut()
                            .zip(&p.2[i * dvd..][..dvd])
                            .for_each(|(x, y)| *x += y);
                    }
                }
            }
        });
    Ok(())
}

/// Backward of head h of batch b into its own dq_h (T,D), dk_h (Tk,D) and dv_h (Tk,Dv).
#[allow(
    clippy::too_many_arguments,
    reason = "internal helper of attention_backward"
)]
#[inline(always)]
fn backward_head(
    dq_h: &mut [f32],
    dk_h: &mut [f32],
    dv_h: &mut [f32],
    dout: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    a: &Attn,
    s: &Strides,
    runs: &Runs,
    b: usize,
    h: usize,
) {
    let (d, dvd, t, tk) = (a.d, a.dv, a.t, a.kv_len());
    let g = h / a.group();
    let lse_h = &lse[(b * a.h + h) * t..][..t];
    let mut p = vec![0f32; BR * BC];
    let mut ds = vec![0f32; BR * BC];
    let mut delta = [0f32; BR];
    for qr in &runs.q {
        let mut i0 = 0;
        while i0 < qr.len {
            // Query rows [row0, row0 + rows) at global positions [p0, p0 + rows).
            let rows = BR.min(qr.len - i0);
            let (row0, p0) = (qr.row + i0, qr.pos + i0);
            let qm = view(q, b * t + row0, rows, s.q, h * d, d);
            let dom = view(dout, b * t + row0, rows, s.o, h * dvd, dvd);
            for (r, x) in delta[..rows].iter_mut().enumerate() {
                let off = (b * t + row0 + r) * s.o + h * dvd;
                *x = dot(&dout[off..off + dvd], &out[off..off + dvd]);
            }
            let (klo, khi) = key_span(a, p0, rows);
            for kr in &runs.k {
                // Keys of this run the tile reaches, by global position.
                let (klo, khi) = (klo.max(kr.pos), khi.min(kr.pos + kr.len));
                let mut j0 = klo;
                while j0 < khi {
                    let cols = BC.min(khi - j0);
                    let krow = kr.row + (j0 - kr.pos);
                    let km = view(k, b * tk + krow, cols, s.k, g * d, d);
                    let vm = view(v, b * tk + krow, cols, s.v, g * dvd, dvd);
                    let (pt, dst) = (&mut p[..rows * cols], &mut ds[..rows * cols]);
                    mm(
                        MatMut::from_row_major_slice_mut(pt, rows, cols),
                        false,
                        qm,
                        km.transpose(),
                        a.scale,
                    );
                    for (r, row) in pt.chunks_exact_mut(cols).enumerate() {
                        let (a0, a1) = visible(a, p0 + r, j0, cols);
                        row[..a0].fill(0.0);
                        row[a1..].fill(0.0);
                        let li = lse_h[row0 + r];
                        for y in row[a0..a1].iter_mut() {
                            *y = exp_f32(*y - li);
                        }
                    }
                    let pm = MatRef::from_row_major_slice(pt, rows, cols);
                    mm(
                        MatMut::from_row_major_slice_mut(
                            &mut dv_h[krow * dvd..(krow + cols) * dvd],
                            cols,
                            dvd,
                        ),
                        true,
                        pm.transpose(),
                        dom,
                        1.0,
                    );
                    mm(
                        MatMut::from_row_major_slice_mut(dst, rows, cols),
                        false,
                        dom,
                        vm.transpose(),
                        1.0,
                    );
                    for ((prow, drow), &di) in pt
                        .chunks_exact(cols)
                        .zip(dst.chunks_exact_mut(cols))
                        .zip(&delta[..rows])
                    {
                        for (y, &x) in drow.iter_mut().zip(prow) {
                            *y = x * (*y - di);
                        }
                    }
                    let dsm = MatRef::from_row_major_slice(dst, rows, cols);
                    mm(
                        MatMut::from_row_major_slice_mut(
                            &mut dq_h[row0 * d..(row0 + rows) * d],
                            rows,
                            d,
                        ),
                        true,
                        dsm,
                        km,
                        a.scale,
                    );
                    mm(
                        MatMut::from_row_major_slice_mut(
                            &mut dk_h[krow * d..(krow + cols) * d],
                            cols,
                            d,
                        ),
                        true,
                        dsm.transpose(),
                        qm,
                        a.scale,
                    );
                    j0 += cols;
                }
            }
            i0 += rows;
        }
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
            cp: None,
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
            randn(rng, a.b * a.kv_len() * a.hkv * a.d),
            randn(rng, a.b * a.kv_len() * a.hkv * a.dv),
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

    /// Both the plain cases and the context-parallel ones (query and key positions
    /// mapped to their global places).
    #[test]
    fn attention_forward_matches_reference() {
        let mut rng = rng(40);
        for a in forward_cases().into_iter().chain(cp_cases()) {
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
            backward_matches_fd(&mut rng, a, "attention");
        }
    }

    /// Forward, then backward of a random output gradient; dq, dk, dv on 40 sampled
    /// entries each against central differences of the f64 reference. The gradients sum
    /// O(T·H/Hkv) f32 terms of size ~1 and D_i cancels against dout·v: 1e-4 absolute +
    /// relative.
    fn backward_matches_fd(rng: &mut Rng, a: Attn, what: &str) {
        let (q, k, v) = inputs(rng, &a);
        let mut out = vec![0.0; a.b * a.t * a.h * a.dv];
        let mut lse = vec![0.0; a.b * a.h * a.t];
        attention_forward(&mut out, &mut lse, &q, &k, &v, a).unwrap();
        let rr = randn(rng, out.len());
        let (mut dq, mut dk, mut dv) = (
            vec![f32::NAN; q.len()],
            vec![f32::NAN; k.len()],
            vec![f32::NAN; v.len()],
        );
        attention_backward(&mut dq, &mut dk, &mut dv, &rr, &q, &k, &v, &out, &lse, a).unwrap();
        let (qf, kf, vf) = (f64s(&q), f64s(&k), f64s(&v));
        let iq = some(rng, q.len(), 40);
        let ik = some(rng, k.len(), 40);
        let iv = some(rng, v.len(), 40);
        let fq = fd_grad(&qf, &iq, |p| loss(&r::attention(p, &kf, &vf, &a).0, &rr));
        let fk = fd_grad(&kf, &ik, |p| loss(&r::attention(&qf, p, &vf, &a).0, &rr));
        let fv = fd_grad(&vf, &iv, |p| loss(&r::attention(&qf, &kf, p, &a).0, &rr));
        assert_close(
            &format!("{what} dq {a:?}"),
            &pick(&dq, &iq),
            &fq,
            1e-4,
            1e-4,
        );
        assert_close(
            &format!("{what} dk {a:?}"),
            &pick(&dk, &ik),
            &fk,
            1e-4,
            1e-4,
        );
        assert_close(
            &format!("{what} dv {a:?}"),
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

    /// `a` on context-parallel rank `rank` of `size`.
    fn on_cp(a: Attn, size: usize, rank: usize) -> Attn {
        Attn {
            cp: Some(CpShard { size, rank }),
            ..a
        }
    }

    /// Context-parallel cases: cp 2 to 4, odd chunk lengths, GQA and MQA, D != Dv,
    /// windows shorter than a chunk (whole key runs masked), bidirectional masks, and
    /// chunks longer than a tile.
    fn cp_cases() -> Vec<Attn> {
        vec![
            on_cp(mk(2, 6, 4, 2, 8, 8, true, None), 2, 0),
            on_cp(mk(2, 6, 4, 2, 8, 8, true, None), 2, 1),
            on_cp(mk(1, 2, 2, 1, 4, 4, true, None), 2, 1), // chunks of one token
            on_cp(mk(1, 10, 6, 3, 5, 3, true, Some(4)), 3, 1),
            on_cp(mk(1, 6, 2, 2, 6, 10, true, Some(7)), 4, 3),
            on_cp(mk(1, 14, 2, 1, 4, 4, false, Some(9)), 2, 1),
            on_cp(mk(1, 6, 2, 1, 4, 4, false, None), 3, 0),
            on_cp(mk(1, 140, 2, 1, 8, 8, true, None), 2, 1), // 70-token chunks: 2 tiles each
            on_cp(mk(1, 150, 1, 1, 4, 4, true, Some(100)), 2, 0),
        ]
    }

    #[test]
    fn attention_cp_backward_matches_finite_differences() {
        let mut rng = rng(44);
        let cases = cp_cases();
        for a in cases.iter().filter(|a| a.t < 100).chain(&cases[7..8]) {
            backward_matches_fd(&mut rng, *a, "cp attention");
        }
    }

    /// The cp ranks together compute the unsharded attention: each rank's output and lse
    /// rows are the unsharded rows at its positions, its dq rows likewise, and the ranks'
    /// dk, dv over the gathered rows sum (a reduce-scatter) to the unsharded dk, dv.
    #[test]
    fn attention_cp_ranks_reassemble_the_unsharded_attention() {
        let mut rng = rng(45);
        for (full, size) in [
            (mk(2, 12, 4, 2, 8, 6, true, None), 2),
            (mk(1, 18, 2, 1, 4, 4, true, Some(5)), 3),
            (mk(1, 280, 2, 2, 8, 8, true, None), 2),
        ] {
            let (q, k, v) = inputs(&mut rng, &full);
            let (mut out, mut lse) = (
                vec![0.0; full.b * full.t * full.h * full.dv],
                vec![0.0; full.b * full.h * full.t],
            );
            attention_forward(&mut out, &mut lse, &q, &k, &v, full).unwrap();
            let rr = randn(&mut rng, out.len());
            let (mut dq, mut dk, mut dv) =
                (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
            attention_backward(&mut dq, &mut dk, &mut dv, &rr, &q, &k, &v, &out, &lse, full)
                .unwrap();
            // Rows of a (B,T,w) buffer at the given positions.
            let rows = |x: &[f32], w: usize, pos: &[usize]| -> Vec<f32> {
                (0..full.b)
                    .flat_map(|b| {
                        pos.iter()
                            .flat_map(move |&p| (0..w).map(move |c| (b, p, c)))
                    })
                    .map(|(b, p, c)| x[(b * full.t + p) * w + c])
                    .collect()
            };
            let (wq, wk, wv, wo) = (
                full.h * full.d,
                full.hkv * full.d,
                full.hkv * full.dv,
                full.h * full.dv,
            );
            let t = full.t / size;
            let mut dk_sum = vec![0f64; dk.len()];
            let mut dv_sum = vec![0f64; dv.len()];
            for rank in 0..size {
                let a = on_cp(Attn { t, ..full }, size, rank);
                let (qp, kp) = (r::cp_positions(t, a.cp), r::cp_gathered_positions(t, a.cp));
                let (ql, kl, vl) = (rows(&q, wq, &qp), rows(&k, wk, &kp), rows(&v, wv, &kp));
                let (mut o, mut l) = (vec![0.0; a.b * t * a.h * a.dv], vec![0.0; a.b * a.h * t]);
                attention_forward(&mut o, &mut l, &ql, &kl, &vl, a).unwrap();
                let name = format!("rank {rank} of {size}, {full:?}");
                assert_close(
                    &format!("out, {name}"),
                    &o,
                    &f64s(&rows(&out, wo, &qp)),
                    1e-5,
                    1e-5,
                );
                for bh in 0..a.b * a.h {
                    let want: Vec<f64> = qp.iter().map(|&p| lse[bh * full.t + p] as f64).collect();
                    assert_close(
                        &format!("lse, {name}"),
                        &l[bh * t..][..t],
                        &want,
                        1e-5,
                        1e-5,
                    );
                }
                let ro = rows(&rr, wo, &qp);
                let (mut gq, mut gk, mut gv) = (
                    vec![f32::NAN; ql.len()],
                    vec![f32::NAN; kl.len()],
                    vec![f32::NAN; vl.len()],
                );
                attention_backward(&mut gq, &mut gk, &mut gv, &ro, &ql, &kl, &vl, &o, &l, a)
                    .unwrap();
                assert_close(
                    &format!("dq, {name}"),
                    &gq,
                    &f64s(&rows(&dq, wq, &qp)),
                    1e-5,
                    1e-5,
                );
                // Gathered row j of batch b holds global position kp[j].
                for b in 0..a.b {
                    for (j, &p) in kp.iter().enumerate() {
                        let (src, dst) = (b * kp.len() + j, b * full.t + p);
                        for c in 0..wk {
                            dk_sum[dst * wk + c] += gk[src * wk + c] as f64;
                        }
                        for c in 0..wv {
                            dv_sum[dst * wv + c] += gv[src * wv + c] as f64;
                        }
                    }
                }
            }
            let to32 = |x: &[f64]| x.iter().map(|&y| y as f32).collect::<Vec<f32>>();
            assert_close(
                &format!("summed dk, {full:?}"),
                &to32(&dk_sum),
                &f64s(&dk),
                1e-5,
                1e-5,
            );
            assert_close(
                &format!("summed dv, {full:?}"),
                &to32(&dv_sum),
                &f64s(&dv),
                1e-5,
                1e-5,
            );
        }
    }

    /// Scores in the hundreds (q 100 times larger than `inputs`' own): exp of an
    /// unshifted score overflows f32 past 88, so the online softmax must subtract its
    /// running max. The other tests keep scores under ~15, where a softmax without the
    /// max subtraction gives the same values. The backward rebuilds P from lse and must
    /// stay finite too.
    #[test]
    fn attention_softmax_survives_scores_in_the_hundreds() {
        let mut rng = rng(46);
        for a in [
            mk(1, 70, 2, 1, 16, 8, true, None), // two key tiles: the max moves across them
            mk(1, 9, 2, 2, 8, 8, false, None),
        ] {
            let (q, k, v) = inputs(&mut rng, &a);
            let q: Vec<f32> = q.iter().map(|x| 100.0 * x).collect();
            let mut out = vec![f32::NAN; a.b * a.t * a.h * a.dv];
            let mut lse = vec![f32::NAN; a.b * a.h * a.t];
            attention_forward(&mut out, &mut lse, &q, &k, &v, a).unwrap();
            let (wo, wl) = r::attention(&f64s(&q), &f64s(&k), &f64s(&v), &a);
            assert!(wl.iter().any(|&l| l > 200.0), "scores not large enough");
            // f32 scores of ~300 are off by ~3e-5, and P by that relative
            assert_close(&format!("big-score out {a:?}"), &out, &wo, 2e-4, 2e-4);
            assert_close(&format!("big-score lse {a:?}"), &lse, &wl, 1e-4, 1e-5);
            let rr = randn(&mut rng, out.len());
            let (mut dq, mut dk, mut dv) = (
                vec![f32::NAN; q.len()],
                vec![f32::NAN; k.len()],
                vec![f32::NAN; v.len()],
            );
            attention_backward(&mut dq, &mut dk, &mut dv, &rr, &q, &k, &v, &out, &lse, a).unwrap();
            assert!(dq.iter().chain(&dk).chain(&dv).all(|x| x.is_finite()));
        }
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
        // Context parallelism: k, v hold cp·T rows; T splits into two chunks; the rank
        // is inside the group.
        let c = on_cp(Attn { t: 2, ..a }, 2, 1);
        assert!(attention_forward(&mut o[..16], &mut l[..8], &q[..16], &k, &v, c).is_ok());
        assert!(
            attention_forward(&mut o[..16], &mut l[..8], &q[..16], &k[..8], &v[..8], c).is_err()
        );
        assert!(
            attention_forward(&mut o[..16], &mut l[..8], &q[..16], &k, &v, on_cp(c, 2, 2)).is_err()
        );
        let odd = on_cp(Attn { t: 1, ..a }, 4, 0);
        assert!(attention_forward(&mut o[..8], &mut l[..4], &q[..8], &k, &v, odd).is_err());
    }
}
