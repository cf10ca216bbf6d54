//! Mamba-2's mixer: the depthwise causal convolution with SiLU fused, and the selective
//! state-space scan with one scalar decay per head (SSD).
//!
//! - Causal conv1d, as `causal_conv1d_fn(x, w, b, activation="silu")` of
//!   Dao-AILab/causal-conv1d: x, out (B,T,C) (C channels, the trailing axes of the graph
//!   tensor), w (C,K), bias (C);
//!   u[b,t,c] = bias[c] + Σ_k w[c,k]·x[b, t−(K−1)+k, c] (positions before the sequence
//!   read 0), out = u·σ(u). The forward saves nothing; the backward recomputes u.
//! - SSD scan (Dao and Gu, "Transformers are SSMs", arXiv 2405.21060: the selective SSM
//!   with A = a·I per head): x, y (B,T,H,P), dt (B,T,H), bm, cm (B,T,G,N), a_log, d, dt_bias
//!   (H); head h reads group h / (H/G). With dt' = softplus(dt + dt_bias) and
//!   a = −exp(a_log), the state S (P,N) of each (b,h) starts at 0 and per step
//!   S ← exp(dt'·a)·S + dt'·x_t b_tᵀ, y_t = S c_t + d·x_t.
//!
//! The scan runs the recurrence step by step (mamba_ssm's chunked SSD kernels reach the
//! same numbers with matrix products): (b,h) pairs split over rayon tasks.
//! The forward saves the state entering every chunk of [`Ssm::chunk`] steps, as
//! mamba_ssm's chunked kernels keep their chunk states; the backward walks the chunks
//! from the last, re-running each one's forward from its saved state to hold that
//! chunk's states, and carries dS backwards through them. The chunk length changes only
//! what is kept: results are bit-identical for every chunk length. (The CUDA twin,
//! `kernels/cuda/ssm.cu`, takes another route to the decay's gradient that needs no
//! state going backwards; `reference::ssm_scan_backward` follows it.)
//!
//! a_log is clamped to [`A_LOG_MAX`] ([`decay_rate`]): past ln(f32::MAX) ≈ 88.72,
//! exp(a_log) is +∞ in f32 and the backward's 0·∞ turned every gradient of the head NaN.
//!
//! Reductions that cross tasks (the groups' dB and dC over their heads, the per-head
//! weights over the batch, the conv's dw and db over rows) are per-task partials added
//! in a fixed order, so results do not depend on the thread count.

use super::{axpy, dot, rows_per_task, simd};
use crate::{Result, check_len, numel, shape_err};
use rayon::prelude::*;

/// Shape of a causal depthwise convolution: B sequences of T steps, C channels, K taps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1d {
    /// Batch.
    pub b: usize,
    /// Sequence length.
    pub t: usize,
    /// Channels.
    pub c: usize,
    /// Taps (kernel width), >= 1.
    pub k: usize,
}

impl Conv1d {
    /// Checks the lengths of a conv's (B,T,C) tensors (`btc`, named), of its weight or
    /// weight gradient (C,K) and of its bias or bias gradient (C).
    ///
    /// # Errors
    /// `ShapeMismatch` naming the first of the wrong length, for K = 0, or for a size that
    /// overflows.
    pub fn check_lens(&self, btc: &[(&str, usize)], w: usize, bias: usize) -> Result<()> {
        if self.k == 0 {
            return shape_err("causal_conv1d needs a kernel width K >= 1");
        }
        let n = numel(&[self.b, self.t, self.c])?;
        for &(name, got) in btc {
            check_len(&format!("conv {name}"), got, n)?;
        }
        check_len("conv w", w, numel(&[self.c, self.k])?)?;
        check_len("conv bias", bias, self.c)
    }
}

/// w (C,K) transposed to (K,C), so that a tap's weights are contiguous over channels.
fn taps(w: &[f32], s: &Conv1d) -> Vec<f32> {
    let mut wt = vec![0f32; s.c * s.k];
    for c in 0..s.c {
        for j in 0..s.k {
            wt[j * s.c + c] = w[c * s.k + j];
        }
    }
    wt
}

/// The pre-activation u (C) of row `row` = (b,t): bias, then the taps k = 0..K in order.
#[inline(always)]
fn conv_row(u: &mut [f32], x: &[f32], wt: &[f32], bias: &[f32], s: &Conv1d, row: usize) {
    let (c, k) = (s.c, s.k);
    let t = row % s.t;
    u.copy_from_slice(bias);
    for j in 0..k {
        // Tap j reads position t − (K−1) + j; before the sequence it reads zero.
        let Some(src) = (t + j).checked_sub(k - 1) else {
            continue;
        };
        axpy_mul(u, &wt[j * c..][..c], &x[(row - t + src) * c..][..c]);
    }
}

/// Each row of dst (B,T,C) set to its pre-activation u ([`conv_row`]), then handed to
/// `then` with its row index; rows split over rayon tasks.
fn pre_activations(
    dst: &mut [f32],
    x: &[f32],
    wt: &[f32],
    bias: &[f32],
    s: &Conv1d,
    then: impl Fn(usize, &mut [f32]) + Sync,
) {
    let rows_blk = rows_per_task(s.c);
    dst.par_chunks_mut(s.c * rows_blk)
        .enumerate()
        .for_each(|(blk, db)| {
            simd(
                #[inline(always)]
                || {
                    for (ri, d) in db.chunks_mut(s.c).enumerate() {
                        let row = blk * rows_blk + ri;
                        conv_row(d, x, wt, bias, s, row);
                        then(row, d);
                    }
                },
            )
        });
}

/// u += w ∘ x.
#[inline(always)]
fn axpy_mul(u: &mut [f32], w: &[f32], x: &[f32]) {
    for ((u, &w), &x) in u.iter_mut().zip(w).zip(x) {
        *u += w * x;
    }
}

/// σ(v) with std's exp (the scan's per-step scalars; the conv uses the vectorised one).
fn sigmoid_exact(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

/// out = silu(bias + causal depthwise conv of x with w); x, out (B,T,C), w (C,K),
/// bias (C). Saves nothing.
///
/// # Errors
/// `ShapeMismatch` for wrong lengths or K = 0.
pub fn causal_conv1d_forward(
    out: &mut [f32],
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    s: Conv1d,
) -> Result<()> {
    s.check_lens(&[("out", out.len()), ("x", x.len())], w.len(), bias.len())?;
    if out.is_empty() {
        return Ok(());
    }
    let wt = taps(w, &s);
    pre_activations(out, x, &wt, bias, &s, |_, o| {
        for u in o.iter_mut() {
            *u *= super::sigmoid(*u);
        }
    });
    Ok(())
}

/// Rows per block of the conv backward's weight-gradient partials.
const BLOCK_ROWS: usize = 32;

/// Causal conv1d backward, u recomputed from x, w, bias: du = dout·σ(u)(1 + u(1 − σ(u)));
/// dx[b,s,c] = Σ_k w[c,k]·du[b, s+(K−1)−k, c] (overwritten);
/// dw[c,k] += Σ_{b,t} du[b,t,c]·x[b, t−(K−1)+k, c]; dbias[c] += Σ_{b,t} du[b,t,c].
///
/// # Errors
/// As [`causal_conv1d_forward`].
#[allow(
    clippy::too_many_arguments,
    reason = "the Device trait's argument order"
)]
pub fn causal_conv1d_backward(
    dx: &mut [f32],
    dw: &mut [f32],
    dbias: &mut [f32],
    dout: &[f32],
    x: &[f32],
    w: &[f32],
    bias: &[f32],
    s: Conv1d,
) -> Result<()> {
    s.check_lens(
        &[("dx", dx.len()), ("dout", dout.len()), ("x", x.len())],
        w.len(),
        bias.len(),
    )?;
    s.check_lens(&[], dw.len(), dbias.len())?;
    if dx.is_empty() {
        return Ok(());
    }
    let (c, k) = (s.c, s.k);
    let wt = taps(w, &s);
    let mut du = vec![0f32; dx.len()];
    pre_activations(&mut du, x, &wt, bias, &s, |row, d| {
        for (d, &g) in d.iter_mut().zip(&dout[row * c..][..c]) {
            let u = *d;
            let sg = super::sigmoid(u);
            *d = g * sg * (1.0 + u * (1.0 - sg));
        }
    });
    let partials: Vec<(Vec<f32>, Vec<f32>)> = dx
        .par_chunks_mut(c * BLOCK_ROWS)
        .enumerate()
        .map(|(blk, dxb)| {
            simd(
                #[inline(always)]
                || {
                    // dw partial in the taps' (K,C) layout.
                    let (mut dwp, mut dbp) = (vec![0f32; k * c], vec![0f32; c]);
                    for (ri, dxr) in dxb.chunks_mut(c).enumerate() {
                        let row = blk * BLOCK_ROWS + ri;
                        let t = row % s.t;
                        let base = row - t;
                        dxr.fill(0.0);
                        for j in 0..k {
                            // Output position t + (K−1) − j read this row through tap j.
                            let dst = t + (k - 1) - j;
                            if dst < s.t {
                                axpy_mul(dxr, &wt[j * c..][..c], &du[(base + dst) * c..][..c]);
                            }
                            // This row's output read position t − (K−1) + j through tap j.
                            if let Some(src) = (t + j).checked_sub(k - 1) {
                                axpy_mul(
                                    &mut dwp[j * c..][..c],
                                    &du[row * c..][..c],
                                    &x[(base + src) * c..][..c],
                                );
                            }
                        }
                        for (b, &g) in dbp.iter_mut().zip(&du[row * c..][..c]) {
                            *b += g;
                        }
                    }
                    (dwp, dbp)
                },
            )
        })
        .collect();
    let (mut dwt, mut dbs) = (vec![0f32; k * c], vec![0f32; c]);
    for (pw, pb) in &partials {
        for (a, b) in dwt.iter_mut().zip(pw) {
            *a += b;
        }
        for (a, b) in dbs.iter_mut().zip(pb) {
            *a += b;
        }
    }
    for ch in 0..c {
        for j in 0..k {
            dw[ch * k + j] += dwt[j * c + ch];
        }
    }
    for (a, b) in dbias.iter_mut().zip(&dbs) {
        *a += b;
    }
    Ok(())
}

/// Shape of an SSD scan: x (B,T,H,P), B and C (B,T,G,N), and the chunk length whose
/// entering states the forward keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ssm {
    /// Batch.
    pub b: usize,
    /// Sequence length.
    pub t: usize,
    /// Heads.
    pub h: usize,
    /// Head dim (P).
    pub p: usize,
    /// Groups of B and C (G divides H).
    pub g: usize,
    /// State size (N).
    pub n: usize,
    /// Steps per chunk (>= 1): the forward keeps the state entering each chunk.
    pub chunk: usize,
}

impl Ssm {
    /// Chunks of the sequence: ⌈T / chunk⌉.
    pub fn chunks(&self) -> usize {
        self.t.div_ceil(self.chunk.max(1))
    }
    /// Elements of the saved chunk states, (B,H,chunks,P,N); 0 for a shape the scan
    /// rejects ([`Ssm::lens`]: G not dividing H, N or chunk 0, a size that overflows),
    /// whose kernels then say why.
    pub fn states_len(&self) -> usize {
        self.lens().map_or(0, |l| l[4])
    }
}

/// The scan's seven inputs (slices on the CPU, device buffers in `runner-exec`), in the
/// graph op's order.
#[derive(Clone, Copy, Debug)]
pub struct SsmInputs<T> {
    /// (B,T,H,P).
    pub x: T,
    /// (B,T,H), before the bias and softplus.
    pub dt: T,
    /// B (B,T,G,N).
    pub bm: T,
    /// C (B,T,G,N).
    pub cm: T,
    /// (H); a = −exp(a_log).
    pub a_log: T,
    /// (H), the skip connection.
    pub d: T,
    /// (H).
    pub dt_bias: T,
}

/// The scan's gradients, one per input: dx, ddt, dbm, dcm overwritten; da_log, dd and
/// ddt_bias added into (weights).
#[derive(Debug)]
pub struct SsmGrads<T> {
    /// Of x (B,T,H,P).
    pub dx: T,
    /// Of dt (B,T,H).
    pub ddt: T,
    /// Of B (B,T,G,N).
    pub dbm: T,
    /// Of C (B,T,G,N).
    pub dcm: T,
    /// Of a_log (H).
    pub da_log: T,
    /// Of d (H).
    pub dd: T,
    /// Of dt_bias (H).
    pub ddt_bias: T,
}

impl<T> SsmInputs<T> {
    /// Each input through `f`, in order (a backend's buffers to its slices or pointers).
    ///
    /// # Errors
    /// The first error of `f`.
    pub fn try_map<U, E>(self, mut f: impl FnMut(T) -> Result<U, E>) -> Result<SsmInputs<U>, E> {
        Ok(SsmInputs {
            x: f(self.x)?,
            dt: f(self.dt)?,
            bm: f(self.bm)?,
            cm: f(self.cm)?,
            a_log: f(self.a_log)?,
            d: f(self.d)?,
            dt_bias: f(self.dt_bias)?,
        })
    }

    /// Each input through `f`, in order.
    pub fn map<U>(self, mut f: impl FnMut(T) -> U) -> SsmInputs<U> {
        match self.try_map(|v| Ok::<U, std::convert::Infallible>(f(v))) {
            Ok(m) => m,
            Err(never) => match never {},
        }
    }
}

impl<T> SsmGrads<T> {
    /// The gradients in their inputs' places (x's gradient as `x`, ...).
    pub fn by_input(&self) -> SsmInputs<&T> {
        SsmGrads::<&T> { dx: &self.dx, ddt: &self.ddt, dbm: &self.dbm, dcm: &self.dcm, da_log: &self.da_log, dd: &self.dd, ddt_bias: &self.ddt_bias }.into()
    }

    /// Each gradient through `f`, in order.
    ///
    /// # Errors
    /// The first error of `f`.
    pub fn try_map<U, E>(self, f: impl FnMut(T) -> Result<U, E>) -> Result<SsmGrads<U>, E> {
        SsmInputs::from(self).try_map(f).map(SsmGrads::from)
    }
}

/// Each gradient in its input's place.
impl<T> From<SsmGrads<T>> for SsmInputs<T> {
    fn from(g: SsmGrads<T>) -> SsmInputs<T> {
        SsmInputs { x: g.dx, dt: g.ddt, bm: g.dbm, cm: g.dcm, a_log: g.da_log, d: g.dd, dt_bias: g.ddt_bias }
    }
}

/// Each input's place as its gradient.
impl<T> From<SsmInputs<T>> for SsmGrads<T> {
    fn from(i: SsmInputs<T>) -> SsmGrads<T> {
        SsmGrads { dx: i.x, ddt: i.dt, dbm: i.bm, dcm: i.cm, da_log: i.a_log, dd: i.d, ddt_bias: i.dt_bias }
    }
}

impl Ssm {
    /// Elements of x (and y, dx), dt, B and C, each per-head weight, and the saved
    /// states.
    ///
    /// # Errors
    /// `ShapeMismatch` unless G divides H and N and the chunk are >= 1, or for a size
    /// that overflows.
    pub fn lens(&self) -> Result<[usize; 5]> {
        if self.g == 0 || !self.h.is_multiple_of(self.g) || self.n == 0 || self.chunk == 0 {
            return shape_err(format!(
                "ssm_scan: {} heads must split into {} groups (>= 1), state size {} and chunk {} must be >= 1",
                self.h, self.g, self.n, self.chunk
            ));
        }
        Ok([
            numel(&[self.b, self.t, self.h, self.p])?,
            numel(&[self.b, self.t, self.h])?,
            numel(&[self.b, self.t, self.g, self.n])?,
            self.h,
            numel(&[self.b, self.h, self.chunks(), self.p, self.n])?,
        ])
    }
}

impl Ssm {
    /// Checks the lengths of a scan's seven tensors, its inputs or their gradients
    /// (`what`), against [`Ssm::lens`].
    ///
    /// # Errors
    /// `ShapeMismatch` naming the first tensor of the wrong length, or as [`Ssm::lens`].
    pub fn check_lens(&self, what: &str, lens: SsmInputs<usize>) -> Result<()> {
        let want = self.lens()?;
        let got = [
            lens.x,
            lens.dt,
            lens.bm,
            lens.cm,
            lens.a_log,
            lens.d,
            lens.dt_bias,
        ];
        let names = ["x", "dt", "B", "C", "a_log", "d", "dt_bias"];
        for (k, kind) in [0, 1, 2, 2, 3, 3, 3].into_iter().enumerate() {
            check_len(&format!("ssm {what} {}", names[k]), got[k], want[kind])?;
        }
        Ok(())
    }
}

/// Checks (name, length, which of [`Ssm::lens`]).
fn ssm_check(s: &Ssm, what: &[(&str, usize, usize)]) -> Result<()> {
    let want = s.lens()?;
    for &(name, got, kind) in what {
        check_len(name, got, want[kind])?;
    }
    Ok(())
}

/// The largest a_log the scan reads as itself. Past ln(f32::MAX) ≈ 88.72, a = −exp(a_log)
/// is −∞ in f32: the forward's decay exp(dt'·a) is still 0, but the backward's
/// da_log = da·a and d(dt') ∋ ⟨dS, S⟩·a·exp(dt'·a) are 0·∞ = NaN, and a NaN in one head's
/// a_log gradient spreads through the optimizer to the whole model. Clamped a little below
/// the overflow (exp(88) ≈ 1.65e38, so dt'·a stays finite for dt' ≤ 1), the decay is 0 as
/// the exact value's (a head whose state forgets every step) and the gradients are 0 where
/// the exact ones are. Mamba-2 starts a_log at ln of U(1, 16) (state-spaces/mamba at
/// 8ffd905c, `mamba_ssm/modules/mamba2.py`, `A_init_range`), the executor at N(0, 0.02²):
/// only a diverged or hand-set weight reaches the clamp. The CUDA twin (`ssm.cu`,
/// `SSM_A_LOG_MAX`) and the f64 reference clamp alike; the CUDA backward's log-decay
/// route still multiplies a finite cumulative sum by a ≈ −1.65e38 there, so its ddt of a
/// clamped head overflows where this one is 0 (open: not yet in the emulation test).
pub const A_LOG_MAX: f32 = 88.0;

/// A head's decay rate a = −exp(a_log), a_log clamped to [`A_LOG_MAX`]; a NaN a_log stays
/// NaN (`f32::min` would hide it as the clamp), so a corrupted weight still shows.
#[inline(always)]
pub fn decay_rate(a_log: f32) -> f32 {
    -(if a_log > A_LOG_MAX { A_LOG_MAX } else { a_log }).exp()
}

/// ln(1 + eᵛ), taken as v above 20 (PyTorch's `F.softplus` threshold, where they agree
/// in f32).
#[inline(always)]
fn softplus(v: f32) -> f32 {
    if v > 20.0 { v } else { v.exp().ln_1p() }
}

/// dt' and the decay exp(dt'·a) of one step: written once for the forward and the
/// backward's re-run, so both see the same values.
#[inline(always)]
fn step(dt: f32, dt_bias: f32, a: f32) -> (f32, f32) {
    let dtv = softplus(dt + dt_bias);
    (dtv, (dtv * a).exp())
}

/// S (P,N) ← decay·S + (dt'·x[p])·b[n]: the recurrence, for the forward and the re-run.
#[inline(always)]
fn advance(st: &mut [f32], decay: f32, dtv: f32, x: &[f32], b: &[f32]) {
    let n = b.len();
    for (row, &xp) in st.chunks_mut(n).zip(x) {
        let xv = dtv * xp;
        for (s, &bn) in row.iter_mut().zip(b) {
            *s = decay * *s + xv * bn;
        }
    }
}

/// Offsets of step t of pair `bh` = (b,h): its (b,t,h) row and its (b,t,g) row.
#[inline(always)]
fn rows(s: &Ssm, bh: usize, t: usize) -> (usize, usize) {
    let (b, h) = (bh / s.h, bh % s.h);
    let g = h / (s.h / s.g);
    ((b * s.t + t) * s.h + h, (b * s.t + t) * s.g + g)
}

/// y = SSD scan of x (see the module doc); y, x (B,T,H,P). Saves `states`
/// (B,H,chunks,P,N): the state entering each chunk (zero for the first).
///
/// # Errors
/// `ShapeMismatch` for wrong lengths, G not dividing H, N or chunk of 0.
pub fn ssm_scan_forward(
    y: &mut [f32],
    states: &mut [f32],
    i: SsmInputs<&[f32]>,
    s: Ssm,
) -> Result<()> {
    s.check_lens("input", i.map(<[f32]>::len))?;
    ssm_check(
        &s,
        &[("ssm y", y.len(), 0), ("ssm states", states.len(), 4)],
    )?;
    if y.is_empty() {
        return Ok(());
    }
    // B, T, H, P >= 1 here, so the states' checked length bounds chunks·P·N (with an
    // empty batch, sequence or no heads, P·N alone may overflow).
    let (p, n, q) = (s.p, s.n, s.chunk);
    let per_bh = s.chunks() * p * n;
    // Each (b,h) task writes its states and returns its (T,P) outputs.
    let ys: Vec<Vec<f32>> = states
        .par_chunks_mut(per_bh)
        .enumerate()
        .map(|(bh, saved)| {
            simd(
                #[inline(always)]
                || {
                    let h = bh % s.h;
                    let a = decay_rate(i.a_log[h]);
                    let mut st = vec![0f32; p * n];
                    let mut yh = vec![0f32; s.t * p];
                    for t in 0..s.t {
                        if t % q == 0 {
                            saved[(t / q) * p * n..][..p * n].copy_from_slice(&st);
                        }
                        let (row, grow) = rows(&s, bh, t);
                        let (dtv, decay) = step(i.dt[row], i.dt_bias[h], a);
                        let xs = &i.x[row * p..][..p];
                        advance(&mut st, decay, dtv, xs, &i.bm[grow * n..][..n]);
                        let cs = &i.cm[grow * n..][..n];
                        for (pi, yv) in yh[t * p..][..p].iter_mut().enumerate() {
                            *yv = dot(&st[pi * n..][..n], cs) + i.d[h] * xs[pi];
                        }
                    }
                    yh
                },
            )
        })
        .collect();
    // Rows (b,t) of y gather their heads.
    y.par_chunks_mut(s.h * p).enumerate().for_each(|(bt, yr)| {
        let (b, t) = (bt / s.t, bt % s.t);
        for (h, yo) in yr.chunks_mut(p).enumerate() {
            yo.copy_from_slice(&ys[b * s.h + h][t * p..][..p]);
        }
    });
    Ok(())
}

/// out = Σ parts, added in order.
fn sum_into<'a>(out: &mut [f32], parts: impl Iterator<Item = &'a [f32]>) {
    out.fill(0.0);
    for part in parts {
        for (o, v) in out.iter_mut().zip(part) {
            *o += v;
        }
    }
}

/// One (b,h) pair's share of the scan's gradients.
struct PairGrads {
    /// (T,P)
    dx: Vec<f32>,
    /// (T)
    ddt: Vec<f32>,
    /// (T,N): this head's part of its group's dB and dC.
    dbm: Vec<f32>,
    dcm: Vec<f32>,
    da_log: f32,
    dd: f32,
    ddt_bias: f32,
}

/// The SSD scan's backward (reverse mode through the recurrence), from the chunk states
/// the forward saved. With dS = 0 after the last step, at step t (last to first):
/// dS += dy_t c_tᵀ; dc_t += S_tᵀ dy_t; dd += dy_t·x_t; dx_t = d·dy_t + dt'·(dS b_t);
/// db_t += dt'·(dSᵀ x_t); d(dt'_t) = ⟨dS, x_t b_tᵀ⟩ + ⟨dS, S_{t−1}⟩·a·exp(dt'a);
/// da += ⟨dS, S_{t−1}⟩·dt'·exp(dt'a); dS ← exp(dt'a)·dS. Then ddt = σ(dt + dt_bias)·d(dt'),
/// d(a_log) = da·a, and dB, dC sum over the heads of each group.
///
/// dx, ddt, dbm, dcm are overwritten; da_log, dd, ddt_bias added into.
///
/// # Errors
/// As [`ssm_scan_forward`].
pub fn ssm_scan_backward(
    gr: SsmGrads<&mut [f32]>,
    dy: &[f32],
    i: SsmInputs<&[f32]>,
    states: &[f32],
    s: Ssm,
) -> Result<()> {
    s.check_lens("input", i.map(<[f32]>::len))?;
    s.check_lens("gradient", gr.by_input().map(|v| v.len()))?;
    ssm_check(
        &s,
        &[("ssm dy", dy.len(), 0), ("ssm states", states.len(), 4)],
    )?;
    if dy.is_empty() {
        // B·T·H·P = 0 (N >= 1): nothing flows, every overwritten gradient is zero (dt's,
        // dB and dC when P = 0). Checked before any size product: with an empty batch,
        // sequence or no heads, P·N alone may overflow.
        for v in [gr.dx, gr.ddt, gr.dbm, gr.dcm] {
            v.fill(0.0);
        }
        return Ok(());
    }
    let (p, n, q) = (s.p, s.n, s.chunk);
    let (pn, chunks) = (p * n, s.chunks());
    let qmax = q.min(s.t);
    let pairs: Vec<PairGrads> = (0..s.b * s.h)
        .into_par_iter()
        .map(|bh| {
            simd(
                #[inline(always)]
                || {
                    let h = bh % s.h;
                    let a = decay_rate(i.a_log[h]);
                    let saved = &states[bh * chunks * pn..][..chunks * pn];
                    let mut o = PairGrads {
                        dx: vec![0f32; s.t * p],
                        ddt: vec![0f32; s.t],
                        dbm: vec![0f32; s.t * n],
                        dcm: vec![0f32; s.t * n],
                        da_log: 0.0,
                        dd: 0.0,
                        ddt_bias: 0.0,
                    };
                    // hist[i] = the state before step t0 + i of the current chunk.
                    let mut hist = vec![0f32; (qmax + 1) * pn];
                    let mut ds = vec![0f32; pn];
                    let mut da = 0f32;
                    for ci in (0..chunks).rev() {
                        let (t0, t1) = (ci * q, ((ci + 1) * q).min(s.t));
                        hist[..pn].copy_from_slice(&saved[ci * pn..][..pn]);
                        for k in 0..t1 - t0 {
                            let (row, grow) = rows(&s, bh, t0 + k);
                            let (dtv, decay) = step(i.dt[row], i.dt_bias[h], a);
                            let (before, after) = hist.split_at_mut((k + 1) * pn);
                            let next = &mut after[..pn];
                            next.copy_from_slice(&before[k * pn..]);
                            advance(
                                next,
                                decay,
                                dtv,
                                &i.x[row * p..][..p],
                                &i.bm[grow * n..][..n],
                            );
                        }
                        for k in (0..t1 - t0).rev() {
                            let t = t0 + k;
                            let (row, grow) = rows(&s, bh, t);
                            let raw = i.dt[row] + i.dt_bias[h];
                            let (dtv, decay) = step(i.dt[row], i.dt_bias[h], a);
                            let (prev, cur) = (&hist[k * pn..][..pn], &hist[(k + 1) * pn..][..pn]);
                            let (dyt, xs) = (&dy[row * p..][..p], &i.x[row * p..][..p]);
                            let (bs, cs) = (&i.bm[grow * n..][..n], &i.cm[grow * n..][..n]);
                            let dct = &mut o.dcm[t * n..][..n];
                            let dbt = &mut o.dbm[t * n..][..n];
                            let dxt = &mut o.dx[t * p..][..p];
                            let (mut g1, mut g2) = (0f32, 0f32);
                            for pi in 0..p {
                                let dsr = &mut ds[pi * n..][..n];
                                axpy(dsr, dyt[pi], cs);
                                axpy(dct, dyt[pi], &cur[pi * n..][..n]);
                                let r = dot(dsr, bs);
                                dxt[pi] = i.d[h] * dyt[pi] + dtv * r;
                                g1 += xs[pi] * r;
                                g2 += dot(dsr, &prev[pi * n..][..n]);
                                axpy(dbt, xs[pi], dsr);
                                for v in dsr.iter_mut() {
                                    *v *= decay;
                                }
                            }
                            for v in dbt.iter_mut() {
                                *v *= dtv;
                            }
                            o.dd += dot(dyt, xs);
                            da += g2 * dtv * decay;
                            let ddt = (g1 + g2 * a * decay) * sigmoid_exact(raw);
                            o.ddt[t] = ddt;
                            o.ddt_bias += ddt;
                        }
                    }
                    o.da_log = da * a;
                    o
                },
            )
        })
        .collect();
    let hpg = s.h / s.g;
    // Rows (b,t): the heads' dx and ddt in place, and each group's dB and dC summed over
    // its heads in order.
    gr.dx
        .par_chunks_mut(s.h * p)
        .zip(gr.ddt.par_chunks_mut(s.h))
        .zip(
            gr.dbm
                .par_chunks_mut(s.g * n)
                .zip(gr.dcm.par_chunks_mut(s.g * n)),
        )
        .enumerate()
        .for_each(|(bt, ((dxr, ddtr), (dbr, dcr)))| {
            let (b, t) = (bt / s.t, bt % s.t);
            for h in 0..s.h {
                let pg = &pairs[b * s.h + h];
                dxr[h * p..][..p].copy_from_slice(&pg.dx[t * p..][..p]);
                ddtr[h] = pg.ddt[t];
            }
            for g in 0..s.g {
                let heads = || (g * hpg..(g + 1) * hpg).map(|h| &pairs[b * s.h + h]);
                sum_into(
                    &mut dbr[g * n..][..n],
                    heads().map(|pg| &pg.dbm[t * n..][..n]),
                );
                sum_into(
                    &mut dcr[g * n..][..n],
                    heads().map(|pg| &pg.dcm[t * n..][..n]),
                );
            }
        });
    for h in 0..s.h {
        let (mut da, mut dd, mut db) = (0f32, 0f32, 0f32);
        for b in 0..s.b {
            let pg = &pairs[b * s.h + h];
            da += pg.da_log;
            dd += pg.dd;
            db += pg.ddt_bias;
        }
        gr.da_log[h] += da;
        gr.dd[h] += dd;
        gr.ddt_bias[h] += db;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{self as r, check::*};

    fn conv_cases() -> Vec<Conv1d> {
        vec![
            Conv1d {
                b: 2,
                t: 9,
                c: 5,
                k: 4,
            },
            // T shorter than K: every tap reaches before the sequence somewhere.
            Conv1d {
                b: 1,
                t: 3,
                c: 6,
                k: 4,
            },
            Conv1d {
                b: 3,
                t: 5,
                c: 3,
                k: 1,
            },
            // 80 rows: several backward blocks of BLOCK_ROWS.
            Conv1d {
                b: 2,
                t: 40,
                c: 24,
                k: 3,
            },
        ]
    }

    /// One conv problem: x, w, bias and an output weighting r for the loss Σ out·r.
    fn conv_data(rng: &mut Rng, s: &Conv1d) -> [Vec<f32>; 4] {
        let n = s.b * s.t * s.c;
        // |u| up to ~K+1: both tails of SiLU and its curved middle.
        let x: Vec<f32> = randn(rng, n).iter().map(|v| 2.0 * v).collect();
        [x, randn(rng, s.c * s.k), randn(rng, s.c), randn(rng, n)]
    }

    #[test]
    fn causal_conv1d_forward_matches_reference() {
        let mut rng = rng(60);
        for s in conv_cases() {
            let [x, w, b, _] = conv_data(&mut rng, &s);
            let mut out = vec![f32::NAN; x.len()];
            causal_conv1d_forward(&mut out, &x, &w, &b, s).unwrap();
            let want = r::causal_conv1d(&f64s(&x), &f64s(&w), &f64s(&b), &s);
            // K+1 products summed in f32 (|u| <= ~9), then σ through exp_f32 (2 ulp);
            // the worst element measured at about 1/5 of the tolerance
            assert_close(&format!("conv {s:?}"), &out, &want, 5e-7, 5e-7);
        }
    }

    #[test]
    fn causal_conv1d_backward_matches_reference_and_finite_differences() {
        let mut rng = rng(61);
        for s in conv_cases() {
            let [x, w, b, rr] = conv_data(&mut rng, &s);
            let (dw0, db0) = (randn(&mut rng, w.len()), randn(&mut rng, b.len()));
            let (mut dx, mut dw, mut db) = (vec![f32::NAN; x.len()], dw0.clone(), db0.clone());
            causal_conv1d_backward(&mut dx, &mut dw, &mut db, &rr, &x, &w, &b, s).unwrap();
            let ddw: Vec<f32> = dw.iter().zip(&dw0).map(|(a, b)| a - b).collect();
            let ddb: Vec<f32> = db.iter().zip(&db0).map(|(a, b)| a - b).collect();
            let (xf, wf, bf) = (f64s(&x), f64s(&w), f64s(&b));
            let (rx, rw, rb) = r::causal_conv1d_backward(&f64s(&rr), &xf, &wf, &bf, &s);
            // dx: K terms; dw, db: sums over B·T rows (atol grows with them). Measured
            // worst: 1/10 of these against the reference, 1/50 against the differences.
            let rows = (s.b * s.t) as f64;
            assert_close("conv dx", &dx, &rx, 2e-7, 2e-6);
            assert_close("conv dw (+=)", &ddw, &rw, 2e-7 * rows, 1e-6);
            assert_close("conv db (+=)", &ddb, &rb, 2e-7 * rows, 1e-6);
            let f = |x: &[f64], w: &[f64], b: &[f64]| loss(&r::causal_conv1d(x, w, b, &s), &rr);
            let ix = some(&mut rng, x.len(), 120);
            let fx = fd_grad(&xf, &ix, |p| f(p, &wf, &bf));
            let fw = fd_grad(&wf, &all(wf.len()), |p| f(&xf, p, &bf));
            let fb = fd_grad(&bf, &all(bf.len()), |p| f(&xf, &wf, p));
            assert_close("conv dx vs fd", &pick(&dx, &ix), &fx, 1e-6, 1e-5);
            assert_close("conv dw vs fd", &ddw, &fw, 1e-6 * rows, 1e-5);
            assert_close("conv db vs fd", &ddb, &fb, 1e-6 * rows, 1e-5);
        }
    }

    #[test]
    fn causal_conv1d_rejects_bad_shapes() {
        let s = Conv1d {
            b: 1,
            t: 4,
            c: 2,
            k: 3,
        };
        let (x, w, b) = (vec![0.0; 8], vec![0.0; 6], vec![0.0; 2]);
        let mut out = vec![0.0; 8];
        assert!(causal_conv1d_forward(&mut out, &x, &w, &b, s).is_ok());
        assert!(causal_conv1d_forward(&mut out, &x, &w[..5], &b, s).is_err());
        assert!(causal_conv1d_forward(&mut out, &x, &w, &b, Conv1d { k: 0, ..s }).is_err());
        // K = 0 with a weight of C·K = 0 elements: an error, not a conv without taps
        assert!(causal_conv1d_forward(&mut out, &x, &[], &b, Conv1d { k: 0, ..s }).is_err());
        let (mut dx, mut dw0, mut db2) = (vec![0.0; 8], Vec::new(), vec![0.0; 2]);
        let k0 = Conv1d { k: 0, ..s };
        assert!(causal_conv1d_backward(&mut dx, &mut dw0, &mut db2, &x, &x, &[], &b, k0).is_err());
        // every tensor one element short, forward and backward
        let (mut dw, mut db) = (vec![0.0; 6], vec![0.0; 2]);
        assert!(causal_conv1d_backward(&mut out, &mut dw, &mut db, &x, &x, &w, &b, s).is_ok());
        let short = |v: &[f32]| v[..v.len() - 1].to_vec();
        assert!(causal_conv1d_forward(&mut short(&out), &x, &w, &b, s).is_err());
        assert!(causal_conv1d_forward(&mut out, &short(&x), &w, &b, s).is_err());
        assert!(causal_conv1d_forward(&mut out, &x, &w, &short(&b), s).is_err());
        let bwd = |k: usize| {
            let mut t = [out.clone(), dw.clone(), db.clone(), x.clone(), x.clone(), w.clone(), b.clone()];
            t[k].pop();
            let [dx, dw, db, dout, x, w, b] = &mut t;
            causal_conv1d_backward(dx, dw, db, dout, x, w, b, s)
        };
        for k in 0..7 {
            assert!(bwd(k).is_err(), "backward tensor {k} short");
        }
        let (mut dw, mut db) = (vec![0.0; 6], vec![0.0; 1]);
        assert!(causal_conv1d_backward(&mut out, &mut dw, &mut db, &x, &x, &w, &b, s).is_err());
    }

    /// Rows split over several rayon tasks in the forward (32 rows of 1000 channels per
    /// task) and the backward (blocks of 32 rows), the task boundaries inside the
    /// sequences: every conv test above fits one forward task, where a row index that
    /// forgets its task's offset goes unseen.
    #[test]
    fn causal_conv1d_splits_rows_over_tasks() {
        let mut rng = rng(59);
        let s = Conv1d { b: 2, t: 37, c: 1000, k: 4 };
        assert!(rows_per_task(s.c) < s.t && BLOCK_ROWS < s.t);
        let [x, w, b, rr] = conv_data(&mut rng, &s);
        let mut out = vec![f32::NAN; x.len()];
        causal_conv1d_forward(&mut out, &x, &w, &b, s).unwrap();
        let (xf, wf, bf) = (f64s(&x), f64s(&w), f64s(&b));
        assert_close("conv out", &out, &r::causal_conv1d(&xf, &wf, &bf, &s), 5e-7, 5e-7);
        let (mut dx, mut dw, mut db) = (vec![f32::NAN; x.len()], vec![0.0; w.len()], vec![0.0; b.len()]);
        causal_conv1d_backward(&mut dx, &mut dw, &mut db, &rr, &x, &w, &b, s).unwrap();
        let (rx, rw, rb) = r::causal_conv1d_backward(&f64s(&rr), &xf, &wf, &bf, &s);
        // A wrong row is an error of the values' size (~1); over 74 000 elements the f32
        // tail reaches 1.3x the small cases' tolerance on dx, so 5x theirs here.
        let rows = (s.b * s.t) as f64;
        assert_close("conv dx", &dx, &rx, 1e-6, 1e-5);
        assert_close("conv dw", &dw, &rw, 1e-6 * rows, 5e-6);
        assert_close("conv db", &db, &rb, 1e-6 * rows, 5e-6);
    }

    fn ssm_cases() -> Vec<Ssm> {
        vec![
            // one group, a chunk that does not divide T
            Ssm {
                b: 1,
                t: 7,
                h: 2,
                p: 3,
                g: 1,
                n: 4,
                chunk: 3,
            },
            // two groups of two heads, two sequences
            Ssm {
                b: 2,
                t: 6,
                h: 4,
                p: 2,
                g: 2,
                n: 5,
                chunk: 2,
            },
            // a head per group, one chunk longer than the sequence
            Ssm {
                b: 2,
                t: 5,
                h: 3,
                p: 4,
                g: 3,
                n: 3,
                chunk: 8,
            },
            Ssm {
                b: 1,
                t: 1,
                h: 2,
                p: 1,
                g: 1,
                n: 1,
                chunk: 1,
            },
        ]
    }

    /// x, dt, B, C, a_log, d, dt_bias of a scan, and an output weighting r.
    fn ssm_data(rng: &mut Rng, s: &Ssm) -> ([Vec<f32>; 7], Vec<f32>) {
        let (nx, nt, ng) = (
            s.b * s.t * s.h * s.p,
            s.b * s.t * s.h,
            s.b * s.t * s.g * s.n,
        );
        // dt + dt_bias over [-3, 3]: dt' from 0.05 to 3, decays from ~0 to ~1.
        let dt: Vec<f32> = randn(rng, nt).iter().map(|v| 2.0 * v).collect();
        let data = [
            randn(rng, nx),
            dt,
            randn(rng, ng),
            randn(rng, ng),
            randn(rng, s.h),
            randn(rng, s.h),
            randn(rng, s.h),
        ];
        (data, randn(rng, nx))
    }

    fn inputs<T: AsRef<[E]>, E>(d: &[T; 7]) -> SsmInputs<&[E]> {
        SsmInputs {
            x: d[0].as_ref(),
            dt: d[1].as_ref(),
            bm: d[2].as_ref(),
            cm: d[3].as_ref(),
            a_log: d[4].as_ref(),
            d: d[5].as_ref(),
            dt_bias: d[6].as_ref(),
        }
    }

    /// The forward and the backward (weights' gradients from zero) of the kernels.
    fn run(d: &[Vec<f32>; 7], dy: &[f32], s: Ssm) -> (Vec<f32>, [Vec<f32>; 7]) {
        let mut y = vec![f32::NAN; d[0].len()];
        let mut states = vec![f32::NAN; s.states_len()];
        ssm_scan_forward(&mut y, &mut states, inputs(d), s).unwrap();
        let mut g: [Vec<f32>; 7] =
            std::array::from_fn(|k| vec![if k < 4 { f32::NAN } else { 0.0 }; d[k].len()]);
        let [dx, ddt, dbm, dcm, da, dd, ddb] = &mut g;
        let gr = SsmGrads {
            dx: &mut dx[..],
            ddt,
            dbm,
            dcm,
            da_log: da,
            dd,
            ddt_bias: ddb,
        };
        ssm_scan_backward(gr, dy, inputs(d), &states, s).unwrap();
        (y, g)
    }

    const NAMES: [&str; 7] = ["x", "dt", "b", "c", "a_log", "d", "dt_bias"];

    #[test]
    fn ssm_scan_forward_matches_reference() {
        let mut rng = rng(62);
        for s in ssm_cases() {
            let (d, _) = ssm_data(&mut rng, &s);
            let mut y = vec![f32::NAN; d[0].len()];
            let mut states = vec![f32::NAN; s.states_len()];
            ssm_scan_forward(&mut y, &mut states, inputs(&d), s).unwrap();
            let df: [Vec<f64>; 7] = std::array::from_fn(|k| f64s(&d[k]));
            let want = r::ssm_scan(inputs(&df), &s);
            // states of N terms carried over T steps, |y| up to ~5 (worst measured 1/10)
            assert_close(&format!("ssm y {s:?}"), &y, &want, 5e-7, 1e-6);
            // the state entering the first chunk is zero, every saved one is written
            let pn = s.p * s.n;
            assert!(
                states
                    .chunks(s.chunks() * pn)
                    .all(|c| c[..pn].iter().all(|&v| v == 0.0))
            );
            assert!(states.iter().all(|v| v.is_finite()));
        }
    }

    /// Each gradient of the kernels against the f64 reference's backward (the other
    /// route to it, see `reference::ssm_scan_backward`) on every element, and against
    /// central differences of the f64 forward.
    #[test]
    fn ssm_scan_backward_matches_reference_and_finite_differences() {
        let mut rng = rng(63);
        for s in ssm_cases() {
            let (d, rr) = ssm_data(&mut rng, &s);
            let (_, g) = run(&d, &rr, s);
            let df: [Vec<f64>; 7] = std::array::from_fn(|k| f64s(&d[k]));
            let want = r::ssm_scan_backward(&f64s(&rr), inputs(&df), &s);
            let want = [
                want.dx,
                want.ddt,
                want.dbm,
                want.dcm,
                want.da_log,
                want.dd,
                want.ddt_bias,
            ];
            // per-head weights sum over B·T steps; worst measured 1/10 of the tolerance
            let steps = (s.b * s.t) as f64;
            for k in 0..7 {
                let atol = if k >= 4 { 2e-7 * steps } else { 2e-7 };
                assert_close(
                    &format!("ssm d{} {s:?}", NAMES[k]),
                    &g[k],
                    &want[k],
                    atol,
                    2e-6,
                );
                let idx = some(&mut rng, df[k].len(), 60);
                let fd = fd_grad(&df[k], &idx, |p| {
                    let mut v = df.clone();
                    v[k] = p.to_vec();
                    loss(&r::ssm_scan(inputs(&v), &s), &rr)
                });
                assert_close(
                    &format!("ssm d{} vs fd {s:?}", NAMES[k]),
                    &pick(&g[k], &idx),
                    &fd,
                    atol,
                    2e-6,
                );
            }
        }
    }

    /// An a_log past f32's exp overflow (88.72) reads as [`A_LOG_MAX`]: outputs and
    /// gradients finite and equal to those at the limit, against the f64 reference, which
    /// clamps alike; a NaN a_log stays NaN. Kills: the clamp removed (a = −∞ and the
    /// backward's 0·∞ makes da_log and ddt NaN), or written with `f32::min` (NaN hidden).
    #[test]
    fn ssm_scan_clamps_a_log_past_the_exp_overflow() {
        let mut rng = rng(66);
        let s = Ssm { b: 2, t: 7, h: 3, p: 2, g: 1, n: 3, chunk: 4 };
        let (mut d, rr) = ssm_data(&mut rng, &s);
        d[4] = vec![1000.0, 89.0, 0.5];
        let (y, g) = run(&d, &rr, s);
        assert!(y.iter().chain(g.iter().flatten()).all(|v| v.is_finite()), "{y:?} {g:?}");
        let mut at_limit = d.clone();
        at_limit[4] = vec![A_LOG_MAX, A_LOG_MAX, 0.5];
        let (y_limit, g_limit) = run(&at_limit, &rr, s);
        assert_eq!((&y, &g), (&y_limit, &g_limit));
        let df: [Vec<f64>; 7] = std::array::from_fn(|k| f64s(&d[k]));
        assert_close("clamped ssm y", &y, &r::ssm_scan(inputs(&df), &s), 5e-7, 1e-6);
        assert!(decay_rate(f32::NAN).is_nan());
        assert_eq!(decay_rate(A_LOG_MAX + 1.0), decay_rate(A_LOG_MAX));
        assert!(decay_rate(A_LOG_MAX).is_finite() && decay_rate(1.0) == -(1f32.exp()));
        // The CUDA twin clamps at the same value.
        assert!(crate::cuda::SOURCES.iter().any(|(f, src)| *f == "ssm.cu" && src.contains(&format!("#define SSM_A_LOG_MAX {A_LOG_MAX:.1}f"))));
    }

    /// The chunk length decides only which states the forward keeps: every output is
    /// bit-identical for every chunk length.
    #[test]
    fn ssm_scan_results_do_not_depend_on_chunk() {
        let mut rng = rng(64);
        let base = Ssm {
            b: 2,
            t: 11,
            h: 4,
            p: 3,
            g: 2,
            n: 4,
            chunk: 1,
        };
        let (d, rr) = ssm_data(&mut rng, &base);
        let (y1, g1) = run(&d, &rr, base);
        for chunk in [2, 3, 4, 11, 16] {
            let (y, g) = run(&d, &rr, Ssm { chunk, ..base });
            assert_eq!(y, y1, "y, chunk {chunk}");
            for k in 0..7 {
                assert_eq!(g[k], g1[k], "d{}, chunk {chunk}", NAMES[k]);
            }
        }
    }

    /// A long sequence whose heads decay very fast (a = −e⁵: the decay underflows to
    /// zero in f32), fast, slowly (a = −e⁻⁵, the state sums ~T inputs) and with dt past
    /// softplus's threshold: finite, and the recurrence's values and gradients.
    #[test]
    fn ssm_scan_long_sequence_with_strong_decay_matches_the_recurrence() {
        let mut rng = rng(65);
        let s = Ssm {
            b: 1,
            t: 1500,
            h: 3,
            p: 2,
            g: 1,
            n: 4,
            chunk: 64,
        };
        let (mut d, rr) = ssm_data(&mut rng, &s);
        d[4] = vec![5.0, 1.0, -5.0];
        d[6] = vec![0.5, 0.0, -1.0];
        d[1][3 * 10] = 30.0;
        d[1][3 * 11 + 1] = -40.0;
        let (y, g) = run(&d, &rr, s);
        assert!(y.iter().chain(g.iter().flatten()).all(|v| v.is_finite()));
        let df: [Vec<f64>; 7] = std::array::from_fn(|k| f64s(&d[k]));
        let want_y = r::ssm_scan(inputs(&df), &s);
        // The slow head's state sums hundreds of steps' inputs in f32 (worst measured
        // error 1/4 of the tolerance, for y and for the activations' gradients).
        assert_close("long ssm y", &y, &want_y, 2e-5, 2e-5);
        let w = r::ssm_scan_backward(&f64s(&rr), inputs(&df), &s);
        let want = [w.dx, w.ddt, w.dbm, w.dcm, w.da_log, w.dd, w.ddt_bias];
        for k in 0..7 {
            let atol = if k >= 4 { 1e-4 } else { 1e-5 };
            assert_close(
                &format!("long ssm d{}", NAMES[k]),
                &g[k],
                &want[k],
                atol,
                1e-4,
            );
        }
        // and the weights against the f64 forward's differences
        for k in 4..7 {
            let fd = fd_grad(&df[k], &all(s.h), |p| {
                let mut v = df.clone();
                v[k] = p.to_vec();
                loss(&r::ssm_scan(inputs(&v), &s), &rr)
            });
            assert_close(
                &format!("long ssm d{} vs fd", NAMES[k]),
                &g[k],
                &fd,
                1e-4,
                1e-4,
            );
        }
    }

    #[test]
    fn ssm_scan_rejects_bad_shapes() {
        let s = Ssm {
            b: 1,
            t: 2,
            h: 2,
            p: 1,
            g: 1,
            n: 1,
            chunk: 1,
        };
        let d: [Vec<f32>; 7] = [
            vec![0.0; 4],
            vec![0.0; 4],
            vec![0.0; 2],
            vec![0.0; 2],
            vec![0.0; 2],
            vec![0.0; 2],
            vec![0.0; 2],
        ];
        let (mut y, mut st) = (vec![0.0; 4], vec![0.0; s.states_len()]);
        assert!(ssm_scan_forward(&mut y, &mut st, inputs(&d), s).is_ok());
        for bad in [
            Ssm { g: 3, ..s },
            Ssm { chunk: 0, ..s },
            Ssm { n: 0, ..s },
            Ssm { t: 3, ..s },
        ] {
            let mut st = vec![0.0; bad.states_len()];
            assert!(
                ssm_scan_forward(&mut y, &mut st, inputs(&d), bad).is_err(),
                "{bad:?}"
            );
        }
        assert!(ssm_scan_forward(&mut y, &mut st[..1], inputs(&d), s).is_err());
        let mut g: [Vec<f32>; 7] = std::array::from_fn(|k| vec![0.0; d[k].len()]);
        let [dx, ddt, dbm, dcm, da, dd, ddb] = &mut g;
        let gr = SsmGrads {
            dx: &mut dx[..3],
            ddt,
            dbm,
            dcm,
            da_log: da,
            dd,
            ddt_bias: ddb,
        };
        assert!(ssm_scan_backward(gr, &y, inputs(&d), &st, s).is_err());
    }

    /// The backward of `d` into gradient buffers `g` (the weights' gradients added into).
    fn backward_into(g: &mut [Vec<f32>; 7], dy: &[f32], d: &[Vec<f32>; 7], states: &[f32], s: Ssm) -> Result<()> {
        let [dx, ddt, dbm, dcm, da, dd, ddb] = g;
        let gr = SsmGrads { dx: &mut dx[..], ddt, dbm, dcm, da_log: da, dd, ddt_bias: ddb };
        ssm_scan_backward(gr, dy, inputs(d), states, s)
    }

    /// The per-head weights' gradients add into what their buffers hold (shared weights
    /// gather from every layer and micro-batch), the others are overwritten: a second
    /// backward into the first one's gradients doubles exactly the weights' and leaves
    /// the rest bit-identical. (Every other test starts the weights' gradients at zero,
    /// where `=` and `+=` agree.)
    #[test]
    fn ssm_scan_backward_adds_into_the_weights_and_overwrites_the_rest() {
        let s = Ssm { b: 2, t: 6, h: 4, p: 2, g: 2, n: 5, chunk: 4 };
        let (d, rr) = ssm_data(&mut rng(66), &s);
        let (_, g) = run(&d, &rr, s);
        assert!(g[4..].iter().flatten().all(|&v| v != 0.0));
        let mut states = vec![f32::NAN; s.states_len()];
        let mut y = vec![f32::NAN; d[0].len()];
        ssm_scan_forward(&mut y, &mut states, inputs(&d), s).unwrap();
        let mut g2 = g.clone();
        backward_into(&mut g2, &rr, &d, &states, s).unwrap();
        for k in 0..7 {
            let want: Vec<f32> = if k < 4 { g[k].clone() } else { g[k].iter().map(|v| v + v).collect() };
            assert_eq!(g2[k], want, "d{}", NAMES[k]);
        }
    }

    /// Head dim P = 0 (and an empty batch or sequence): nothing flows, dt's, B's and C's
    /// gradients are zeros (they start as NaN here), the weights' keep their values.
    #[test]
    fn ssm_scan_with_nothing_to_scan_zeroes_the_activation_gradients() {
        for s in [
            Ssm { b: 2, t: 3, h: 2, p: 0, g: 1, n: 3, chunk: 2 },
            Ssm { b: 0, t: 3, h: 2, p: 2, g: 1, n: 3, chunk: 2 },
            Ssm { b: 2, t: 0, h: 2, p: 2, g: 2, n: 3, chunk: 2 },
        ] {
            let (d, rr) = ssm_data(&mut rng(67), &s);
            let mut y = vec![f32::NAN; d[0].len()];
            let mut states = vec![f32::NAN; s.states_len()];
            ssm_scan_forward(&mut y, &mut states, inputs(&d), s).unwrap();
            let w0 = randn(&mut rng(68), s.h);
            let mut g: [Vec<f32>; 7] =
                std::array::from_fn(|k| if k < 4 { vec![f32::NAN; d[k].len()] } else { w0.clone() });
            backward_into(&mut g, &rr, &d, &states, s).unwrap();
            for k in 0..4 {
                assert!(g[k].iter().all(|&v| v == 0.0), "d{} {s:?}", NAMES[k]);
            }
            for k in 4..7 {
                assert_eq!(g[k], w0, "d{} {s:?}", NAMES[k]);
            }
        }
    }

    /// Each of the scan's tensors one element short is an error, forward and backward,
    /// and so are configurations whose lengths all agree: G not dividing H (head 3 of 4
    /// would read a fourth group of three), N = 0 (y would be left unwritten).
    #[test]
    fn ssm_scan_rejects_every_wrong_length_and_config() {
        let s = Ssm { b: 2, t: 3, h: 4, p: 2, g: 2, n: 3, chunk: 2 };
        let (d, rr) = ssm_data(&mut rng(69), &s);
        let (mut y, mut st) = (vec![0.0; d[0].len()], vec![0.0; s.states_len()]);
        ssm_scan_forward(&mut y, &mut st, inputs(&d), s).unwrap();
        let g0: [Vec<f32>; 7] = std::array::from_fn(|k| vec![0.0; d[k].len()]);
        backward_into(&mut g0.clone(), &rr, &d, &st, s).unwrap();
        let short = |v: &[f32]| v[..v.len() - 1].to_vec();
        for k in 0..7 {
            let mut dk = d.clone();
            dk[k].pop();
            assert!(ssm_scan_forward(&mut y, &mut st, inputs(&dk), s).is_err(), "{}", NAMES[k]);
            assert!(backward_into(&mut g0.clone(), &rr, &dk, &st, s).is_err(), "{}", NAMES[k]);
            let mut gk = g0.clone();
            gk[k].pop();
            assert!(backward_into(&mut gk, &rr, &d, &st, s).is_err(), "d{}", NAMES[k]);
        }
        assert!(ssm_scan_forward(&mut short(&y), &mut st, inputs(&d), s).is_err());
        assert!(ssm_scan_forward(&mut y, &mut short(&st), inputs(&d), s).is_err());
        assert!(backward_into(&mut g0.clone(), &short(&rr), &d, &st, s).is_err());
        assert!(backward_into(&mut g0.clone(), &rr, &d, &short(&st), s).is_err());
        // Lengths from the shapes, written out here (not through `Ssm::lens`).
        for bad in [
            Ssm { b: 1, t: 2, h: 4, p: 1, g: 3, n: 2, chunk: 1 },
            Ssm { b: 1, t: 2, h: 2, p: 2, g: 1, n: 0, chunk: 1 },
        ] {
            let (bt, ch) = (bad.b * bad.t, bad.t.div_ceil(bad.chunk));
            let lens = [bt * bad.h * bad.p, bt * bad.h, bt * bad.g * bad.n, bt * bad.g * bad.n, bad.h, bad.h, bad.h];
            let d: [Vec<f32>; 7] = std::array::from_fn(|k| vec![0.5; lens[k]]);
            let mut y = vec![0.0; lens[0]];
            let mut st = vec![0.0; bad.b * bad.h * ch * bad.p * bad.n];
            assert!(ssm_scan_forward(&mut y, &mut st, inputs(&d), bad).is_err(), "{bad:?}");
            let mut g: [Vec<f32>; 7] = std::array::from_fn(|k| vec![0.0; lens[k]]);
            assert!(backward_into(&mut g, &y, &d, &st, bad).is_err(), "{bad:?}");
        }
    }

    /// Sizes whose products overflow usize are errors, or nothing to do where a factor is
    /// zero, never an overflow panic: P·N of 2⁸⁰ with an empty batch or sequence (every
    /// tensor but the weights empty), and saved states of 2⁸⁰ elements.
    #[test]
    fn ssm_scan_sizes_that_overflow_are_not_a_panic() {
        let big = 1usize << 40;
        let none: [Vec<f32>; 7] = std::array::from_fn(|_| Vec::new());
        for s in [
            Ssm { b: 0, t: 2, h: 1, p: big, g: 1, n: big, chunk: 1 },
            Ssm { b: 1, t: 0, h: 1, p: big, g: 1, n: big, chunk: 1 },
        ] {
            let mut d = none.clone();
            for w in &mut d[4..] {
                *w = vec![0.5; s.h];
            }
            let mut g = d.clone();
            assert_eq!(s.states_len(), 0, "{s:?}");
            ssm_scan_forward(&mut [], &mut [], inputs(&d), s).unwrap();
            backward_into(&mut g, &[], &d, &[], s).unwrap();
        }
        let s = Ssm { b: 1, t: 1, h: 1, p: big, g: 1, n: big, chunk: 1 };
        assert_eq!(s.states_len(), 0, "an invalid shape has no states");
        let d: [Vec<f32>; 7] = std::array::from_fn(|k| vec![0.5; if k < 4 { 0 } else { 1 }]);
        assert!(ssm_scan_forward(&mut [], &mut [], inputs(&d), s).is_err());
        assert!(backward_into(&mut d.clone(), &[], &d, &[], s).is_err());
    }

    /// dt + dt_bias near, past and far past softplus's threshold (20: dt' = dt there),
    /// up to 1000 (eᵛ overflows f32 from 89) and far below zero (dt' underflows): y and
    /// every gradient finite and the f64 recurrence's (errors relative to each tensor's
    /// largest value, which reaches ~10³).
    #[test]
    fn ssm_scan_softplus_of_large_and_small_dt() {
        let s = Ssm { b: 1, t: 8, h: 2, p: 2, g: 1, n: 3, chunk: 3 };
        let (mut d, rr) = ssm_data(&mut rng(70), &s);
        d[1] = vec![
            12.0, 19.5, 20.5, 30.0, 90.0, 1000.0, -30.0, -200.0, 5.0, 15.0, 25.0, 100.0, -90.0, 0.5, 8.0, 3.0,
        ];
        d[6] = vec![0.0, 0.25];
        let (y, g) = run(&d, &rr, s);
        let df: [Vec<f64>; 7] = std::array::from_fn(|k| f64s(&d[k]));
        let w = r::ssm_scan_backward(&f64s(&rr), inputs(&df), &s);
        let want = [r::ssm_scan(inputs(&df), &s), w.dx, w.ddt, w.dbm, w.dcm, w.da_log, w.dd, w.ddt_bias];
        for (k, (got, want)) in std::iter::once(&y).chain(&g).zip(&want).enumerate() {
            let top = want.iter().fold(0f64, |m, v| m.max(v.abs()));
            assert!(top > 0.0 && top.is_finite());
            // worst measured: 1/12 of the tolerance
            assert_close(&format!("large dt, output {k}"), got, want, 2e-6 * top, 2e-6);
        }
    }
}
