//! Mixture-of-experts building blocks: top-k router, token dispatch, grouped expert
//! GEMM and weighted combine (Mixtral / DeepSeek-V3 / Qwen-MoE style, dropless).
//!
//! Shapes: x (N,C) tokens; router logits and probs (N,E); indices and weights (N,k);
//! x_sorted, y_sorted (N·k, ·) token copies grouped by expert; expert weights
//! w (E, n_out, k_in) in `nn.Linear` layout (out = x · W_eᵀ).
//!
//! One MoE FFN forward is:
//!   router_forward → dispatch_plan → dispatch_forward → grouped_matmul_forward
//!   (gate/up) → activation → grouped_matmul_forward (down) → combine_forward,
//! and the backward runs the same chain in reverse. The [`DispatchPlan`] is a stable
//! counting sort of the N·k (token, choice) slots by expert: slots routed to expert e
//! occupy sorted rows `offsets[e]..offsets[e+1]`, in token order, so each expert's
//! tokens form one contiguous GEMM operand and results are deterministic.
//!
//! Saved for backward: probs (router), the plan, x_sorted (grouped GEMM input),
//! y_sorted and weights (combine).
//! Parallelism: rows of the gather/scatter kernels over rayon; the grouped GEMM runs
//! experts in parallel when segments are small, one after another (each GEMM
//! multithreaded by faer) when they are large.

use super::matmul::{Gemm, PAR_MIN_FLOPS, gemm_unchecked, par_for};
use super::{dot, exp_f32, rows_per_task};
use crate::{Result, check_len, numel, rows_of, shape_err};
use faer::Par;
use rayon::prelude::*;

/// How router logits become expert scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreFn {
    /// softmax over the E experts (Mixtral, Qwen-MoE, DeepSeek-V2).
    Softmax,
    /// independent sigmoid per expert (DeepSeek-V3), usually with `normalize_topk`.
    Sigmoid,
}

/// Router configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Router {
    /// Tokens.
    pub n: usize,
    /// Experts.
    pub e: usize,
    /// Experts per token (1 <= k <= e).
    pub k: usize,
    /// Score function.
    pub score: ScoreFn,
    /// Renormalise the k selected scores to sum to 1.
    pub normalize_topk: bool,
}

fn check_router(r: &Router, logits: usize, probs: usize, k_bufs: &[(&str, usize)]) -> Result<()> {
    if r.e == 0 || r.k == 0 || r.k > r.e {
        return shape_err(format!("router: need 1 <= k ({}) <= e ({})", r.k, r.e));
    }
    let ne = numel(&[r.n, r.e])?;
    check_len("router logits", logits, ne)?;
    check_len("router probs", probs, ne)?;
    let nk = numel(&[r.n, r.k])?;
    for (name, len) in k_bufs {
        check_len(name, *len, nk)?;
    }
    Ok(())
}

/// logits (N,E) → probs (N,E) saved, top-k expert indices (N,k) in descending score
/// order (ties → lower index), weights (N,k) = probs at the indices, renormalised to
/// sum 1 if `normalize_topk` (left as is if they sum to 0).
///
/// # Errors
/// `ShapeMismatch` for inconsistent lengths or k outside 1..=e.
pub fn router_forward(
    weights: &mut [f32],
    indices: &mut [u32],
    probs: &mut [f32],
    logits: &[f32],
    r: &Router,
) -> Result<()> {
    check_router(
        r,
        logits.len(),
        probs.len(),
        &[
            ("router weights", weights.len()),
            ("router indices", indices.len()),
        ],
    )?;
    if r.n == 0 {
        return Ok(());
    }
    let (e, k) = (r.e, r.k);
    probs
        .par_chunks_mut(e)
        .zip(indices.par_chunks_mut(k))
        .zip(weights.par_chunks_mut(k))
        .zip(logits.par_chunks(e))
        .for_each_init(
            || vec![false; e],
            |taken, (((p, idx), w), x)| {
                match r.score {
                    ScoreFn::Softmax => {
                        let m = super::max(x);
                        for (p, &x) in p.iter_mut().zip(x) {
                            *p = exp_f32(x - m);
                        }
                        let inv = 1.0 / super::sum(p);
                        p.iter_mut().for_each(|v| *v *= inv);
                    }
                    ScoreFn::Sigmoid => {
                        for (p, &x) in p.iter_mut().zip(x) {
                            *p = super::sigmoid(x);
                        }
                    }
                }
                taken.fill(false);
                for slot in idx.iter_mut() {
                    let mut best = taken.iter().position(|t| !t).unwrap_or(0);
                    for j in best + 1..e {
                        if !taken[j] && p[j] > p[best] {
                            best = j;
                        }
                    }
                    taken[best] = true;
                    *slot = best as u32;
                }
                for (w, &i) in w.iter_mut().zip(idx.iter()) {
                    *w = p[i as usize];
                }
                if r.normalize_topk {
                    let s: f32 = w.iter().sum();
                    if s > 0.0 {
                        w.iter_mut().for_each(|v| *v /= s);
                    }
                }
            },
        );
    Ok(())
}

/// dlogits (N,E) (overwritten) from dweights (N,k), the saved probs and indices. The
/// gradient flows only through the selected scores (top-k selection is piecewise
/// constant): through the renormalisation, dp_a = (dw_a − Σ_j dw_j·w_j)/S with
/// S = Σ_j p_j over the selected; then softmax: dlogits = p∘(dp − Σ p∘dp), sigmoid:
/// dlogits = dp∘p(1 − p).
///
/// # Errors
/// `ShapeMismatch` for inconsistent lengths, k outside 1..=e, or an index >= E.
pub fn router_backward(
    dlogits: &mut [f32],
    dweights: &[f32],
    probs: &[f32],
    indices: &[u32],
    r: &Router,
) -> Result<()> {
    check_router(
        r,
        dlogits.len(),
        probs.len(),
        &[
            ("router dweights", dweights.len()),
            ("router indices", indices.len()),
        ],
    )?;
    if let Some(&bad) = indices.iter().find(|&&i| i as usize >= r.e) {
        return shape_err(format!("router: expert index {bad} >= e {}", r.e));
    }
    if r.n == 0 {
        return Ok(());
    }
    let (e, k) = (r.e, r.k);
    dlogits
        .par_chunks_mut(e)
        .zip(dweights.par_chunks(k))
        .zip(probs.par_chunks(e))
        .zip(indices.par_chunks(k))
        .for_each(|(((dl, dw), p), idx)| {
            // dl holds dp (dense over experts) first, then becomes dlogits in place.
            dl.fill(0.0);
            let s: f32 = idx.iter().map(|&i| p[i as usize]).sum();
            if r.normalize_topk && s > 0.0 {
                let dot_ww: f32 = dw
                    .iter()
                    .zip(idx)
                    .map(|(d, &i)| d * p[i as usize] / s)
                    .sum();
                for (d, &i) in dw.iter().zip(idx) {
                    dl[i as usize] += (d - dot_ww) / s;
                }
            } else {
                for (d, &i) in dw.iter().zip(idx) {
                    dl[i as usize] += d;
                }
            }
            match r.score {
                ScoreFn::Softmax => {
                    let pd = dot(p, dl);
                    for (g, &pe) in dl.iter_mut().zip(p) {
                        *g = pe * (*g - pd);
                    }
                }
                ScoreFn::Sigmoid => {
                    for (g, &pe) in dl.iter_mut().zip(p) {
                        *g *= pe * (1.0 - pe);
                    }
                }
            }
        });
    Ok(())
}

/// Which sorted row each (token, choice) slot went to, grouped by expert.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchPlan {
    /// Experts.
    pub e: usize,
    /// Experts per token.
    pub k: usize,
    /// E+1 row offsets: expert e owns sorted rows `offsets[e]..offsets[e+1]`.
    pub offsets: Vec<usize>,
    /// N·k entries: sorted row → slot `token*k + j`.
    pub order: Vec<u32>,
}

impl DispatchPlan {
    /// Tokens covered by the plan.
    fn tokens(&self) -> usize {
        self.order.len() / self.k.max(1)
    }
}

/// Stable counting sort of the (token, choice) slots by expert.
///
/// # Errors
/// `ShapeMismatch` if `indices.len() != n*k`, k or e is 0, an index is >= e, or N·k
/// does not fit in u32.
pub fn dispatch_plan(indices: &[u32], n: usize, k: usize, e: usize) -> Result<DispatchPlan> {
    if k == 0 || e == 0 {
        return shape_err("dispatch_plan: k and e must be > 0");
    }
    let nk = numel(&[n, k])?;
    check_len("dispatch_plan indices", indices.len(), nk)?;
    if u32::try_from(nk).is_err() {
        return shape_err(format!("dispatch_plan: {nk} slots do not fit u32"));
    }
    let mut offsets = vec![0usize; e + 1];
    for &i in indices {
        if i as usize >= e {
            return shape_err(format!("dispatch_plan: expert index {i} >= e {e}"));
        }
        offsets[i as usize + 1] += 1;
    }
    for x in 0..e {
        offsets[x + 1] += offsets[x];
    }
    let mut fill = offsets.clone();
    let mut order = vec![0u32; nk];
    for (slot, &i) in indices.iter().enumerate() {
        order[fill[i as usize]] = slot as u32;
        fill[i as usize] += 1;
    }
    Ok(DispatchPlan {
        e,
        k,
        offsets,
        order,
    })
}

/// A plan over rows that arrive already grouped by expert: expert e owns the next
/// `counts[e]` rows, in order (k = 1, identity order). An expert-parallel rank runs its
/// grouped GEMMs on such a plan over the rows its dispatch all-to-all received.
///
/// # Errors
/// `ShapeMismatch` for no experts, or more rows than fit in u32.
pub fn presorted_plan(counts: &[usize]) -> Result<DispatchPlan> {
    if counts.is_empty() {
        return shape_err("presorted_plan: no experts");
    }
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    offsets.push(0usize);
    for &c in counts {
        let next = offsets[offsets.len() - 1].checked_add(c);
        match next {
            Some(v) => offsets.push(v),
            None => return shape_err("presorted_plan: row count overflows"),
        }
    }
    let rows = offsets[counts.len()];
    let Ok(rows32) = u32::try_from(rows) else {
        return shape_err(format!("presorted_plan: {rows} rows do not fit u32"));
    };
    Ok(DispatchPlan {
        e: counts.len(),
        k: 1,
        offsets,
        order: (0..rows32).collect(),
    })
}

/// Checks a plan's invariants (its fields are public) and returns the inverse
/// permutation: slot → sorted row.
fn plan_inverse(p: &DispatchPlan) -> Result<Vec<u32>> {
    if p.k == 0 || p.e == 0 {
        return shape_err("dispatch plan: k and e must be > 0");
    }
    let nk = p.order.len();
    if !nk.is_multiple_of(p.k) {
        return shape_err(format!(
            "dispatch plan: order length {nk} not a multiple of k {}",
            p.k
        ));
    }
    if p.offsets.len() != p.e + 1
        || p.offsets[0] != 0
        || p.offsets[p.e] != nk
        || p.offsets.windows(2).any(|w| w[0] > w[1])
    {
        return shape_err("dispatch plan: offsets must be E+1 non-decreasing values from 0 to N*k");
    }
    let mut inv = vec![u32::MAX; nk];
    for (row, &slot) in p.order.iter().enumerate() {
        match inv.get_mut(slot as usize) {
            Some(x) if *x == u32::MAX => *x = row as u32,
            _ => {
                return shape_err(format!(
                    "dispatch plan: order is not a permutation (slot {slot})"
                ));
            }
        }
    }
    Ok(inv)
}

/// x (N,C) → x_sorted (N·k, C): sorted row r is a copy of token order[r] / k.
///
/// # Errors
/// `ShapeMismatch` for an inconsistent plan or lengths.
pub fn dispatch_forward(x_sorted: &mut [f32], x: &[f32], p: &DispatchPlan, c: usize) -> Result<()> {
    plan_inverse(p)?;
    check_len("dispatch x", x.len(), numel(&[p.tokens(), c])?)?;
    check_len(
        "dispatch x_sorted",
        x_sorted.len(),
        numel(&[p.order.len(), c])?,
    )?;
    if c == 0 {
        return Ok(());
    }
    let blk = rows_per_task(c);
    x_sorted
        .par_chunks_mut(blk * c)
        .enumerate()
        .for_each(|(b, xs)| {
            for (row, &slot) in xs.chunks_mut(c).zip(&p.order[b * blk..]) {
                let t = slot as usize / p.k;
                row.copy_from_slice(&x[t * c..(t + 1) * c]);
            }
        });
    Ok(())
}

/// dx (N,C), overwritten: each token's gradient is the sum of its k copies' rows of
/// dx_sorted (N·k, C), added in choice order j = 0..k.
///
/// # Errors
/// `ShapeMismatch` for an inconsistent plan or lengths.
pub fn dispatch_backward(
    dx: &mut [f32],
    dx_sorted: &[f32],
    p: &DispatchPlan,
    c: usize,
) -> Result<()> {
    let inv = plan_inverse(p)?;
    check_len("dispatch dx", dx.len(), numel(&[p.tokens(), c])?)?;
    check_len(
        "dispatch dx_sorted",
        dx_sorted.len(),
        numel(&[p.order.len(), c])?,
    )?;
    if c == 0 {
        return Ok(());
    }
    dx.par_chunks_mut(c).enumerate().for_each(|(t, d)| {
        d.fill(0.0);
        for &row in &inv[t * p.k..(t + 1) * p.k] {
            for (a, b) in d.iter_mut().zip(&dx_sorted[row as usize * c..][..c]) {
                *a += b;
            }
        }
    });
    Ok(())
}

/// Splits `buf` (rows of width `w`) into the E expert segments of the plan.
fn segments<'a>(mut buf: &'a mut [f32], p: &DispatchPlan, w: usize) -> Vec<&'a mut [f32]> {
    let mut segs = Vec::with_capacity(p.e);
    for e in 0..p.e {
        let (head, tail) =
            std::mem::take(&mut buf).split_at_mut((p.offsets[e + 1] - p.offsets[e]) * w);
        segs.push(head);
        buf = tail;
    }
    segs
}

/// Expert-parallel (Par::Seq GEMMs on rayon tasks) or GEMM-parallel (faer threads).
fn experts_in_parallel(p: &DispatchPlan, k_in: usize, n_out: usize) -> bool {
    let avg = (p.order.len() / p.e)
        .saturating_mul(k_in)
        .saturating_mul(n_out);
    p.e > 1 && avg < PAR_MIN_FLOPS * 16
}

fn check_grouped(
    p: &DispatchPlan,
    x_sorted: usize,
    w: usize,
    out: usize,
    k_in: usize,
    n_out: usize,
) -> Result<()> {
    plan_inverse(p)?;
    let rows = rows_of("grouped_matmul x_sorted", x_sorted, k_in)?;
    check_len("grouped_matmul x_sorted rows", rows, p.order.len())?;
    if n_out == 0 {
        return shape_err("grouped_matmul: n_out must be > 0");
    }
    check_len("grouped_matmul w", w, numel(&[p.e, n_out, k_in])?)?;
    check_len("grouped_matmul out", out, numel(&[rows, n_out])?)
}

/// out (N·k, n_out) = x_sorted (N·k, k_in) · W_eᵀ on each expert's segment of rows;
/// w (E, n_out, k_in). Saves nothing beyond x_sorted.
///
/// # Errors
/// `ShapeMismatch` for an inconsistent plan or lengths, or zero `k_in`/`n_out`.
pub fn grouped_matmul_forward(
    out: &mut [f32],
    x_sorted: &[f32],
    w: &[f32],
    p: &DispatchPlan,
    k_in: usize,
    n_out: usize,
) -> Result<()> {
    check_grouped(p, x_sorted.len(), w.len(), out.len(), k_in, n_out)?;
    let job = |e: usize, o: &mut [f32], par: Par| {
        let (r0, r1) = (p.offsets[e], p.offsets[e + 1]);
        let g = Gemm {
            m: r1 - r0,
            n: n_out,
            k: k_in,
            trans_a: false,
            trans_b: true,
        };
        let par = if par == Par::Seq { par } else { par_for(&g) };
        gemm_unchecked(
            o,
            &x_sorted[r0 * k_in..r1 * k_in],
            &w[e * n_out * k_in..(e + 1) * n_out * k_in],
            g,
            false,
            par,
        );
    };
    let segs = segments(out, p, n_out);
    if experts_in_parallel(p, k_in, n_out) {
        segs.into_par_iter()
            .enumerate()
            .for_each(|(e, o)| job(e, o, Par::Seq));
    } else {
        segs.into_iter()
            .enumerate()
            .for_each(|(e, o)| job(e, o, Par::rayon(0)));
    }
    Ok(())
}

/// Per expert segment: dx_sorted = dout · W_e (overwritten), dW_e += dout_wᵀ · x_sorted.
/// dout and dout_w (N·k, n_out), x_sorted and dx_sorted (N·k, k_in), w and dw (E, n_out,
/// k_in). `dout_w` is `dout` unless a precision plan quantises the output gradient
/// differently for the two GEMMs (input-gradient and weight-gradient plans).
/// Experts that received no token keep their dw unchanged.
///
/// # Errors
/// As [`grouped_matmul_forward`].
#[allow(
    clippy::too_many_arguments,
    reason = "signature fixed by the executor's API"
)]
pub fn grouped_matmul_backward(
    dx_sorted: &mut [f32],
    dw: &mut [f32],
    dout: &[f32],
    dout_w: &[f32],
    x_sorted: &[f32],
    w: &[f32],
    p: &DispatchPlan,
    k_in: usize,
    n_out: usize,
) -> Result<()> {
    check_grouped(p, x_sorted.len(), w.len(), dout.len(), k_in, n_out)?;
    check_len("grouped_matmul dout_w", dout_w.len(), dout.len())?;
    check_len("grouped_matmul dx_sorted", dx_sorted.len(), x_sorted.len())?;
    check_len("grouped_matmul dw", dw.len(), w.len())?;
    let job = |e: usize, dx: &mut [f32], dwe: &mut [f32], par: Par| {
        let (r0, r1) = (p.offsets[e], p.offsets[e + 1]);
        let m = r1 - r0;
        let d = &dout[r0 * n_out..r1 * n_out];
        let dwo = &dout_w[r0 * n_out..r1 * n_out];
        let we = &w[e * n_out * k_in..(e + 1) * n_out * k_in];
        let gx = Gemm {
            m,
            n: k_in,
            k: n_out,
            trans_a: false,
            trans_b: false,
        };
        let gw = Gemm {
            m: n_out,
            n: k_in,
            k: m,
            trans_a: true,
            trans_b: false,
        };
        let (px, pw) = if par == Par::Seq {
            (par, par)
        } else {
            (par_for(&gx), par_for(&gw))
        };
        gemm_unchecked(dx, d, we, gx, false, px);
        gemm_unchecked(dwe, dwo, &x_sorted[r0 * k_in..r1 * k_in], gw, true, pw);
    };
    let segs = segments(dx_sorted, p, k_in);
    let dws = dw.chunks_mut(n_out * k_in);
    if experts_in_parallel(p, k_in, n_out) {
        segs.into_par_iter()
            .zip(dws.collect::<Vec<_>>())
            .enumerate()
            .for_each(|(e, (dx, dwe))| job(e, dx, dwe, Par::Seq));
    } else {
        segs.into_iter()
            .zip(dws)
            .enumerate()
            .for_each(|(e, (dx, dwe))| job(e, dx, dwe, Par::rayon(0)));
    }
    Ok(())
}

fn check_combine(
    p: &DispatchPlan,
    tok: usize,
    sorted: usize,
    weights: usize,
    c: usize,
) -> Result<Vec<u32>> {
    let inv = plan_inverse(p)?;
    check_len("combine out", tok, numel(&[p.tokens(), c])?)?;
    check_len("combine y_sorted", sorted, numel(&[p.order.len(), c])?)?;
    check_len("combine weights", weights, p.order.len())?;
    Ok(inv)
}

/// out (N,C) = Σ_j weights[n,j] · y_sorted[row of slot (n,j)], overwritten; saves
/// nothing (backward reads y_sorted and weights).
///
/// # Errors
/// `ShapeMismatch` for an inconsistent plan or lengths.
pub fn combine_forward(
    out: &mut [f32],
    y_sorted: &[f32],
    weights: &[f32],
    p: &DispatchPlan,
    c: usize,
) -> Result<()> {
    let inv = check_combine(p, out.len(), y_sorted.len(), weights.len(), c)?;
    if c == 0 {
        return Ok(());
    }
    out.par_chunks_mut(c).enumerate().for_each(|(t, o)| {
        o.fill(0.0);
        for j in 0..p.k {
            let row = inv[t * p.k + j] as usize;
            super::axpy(o, weights[t * p.k + j], &y_sorted[row * c..(row + 1) * c]);
        }
    });
    Ok(())
}

/// dy_sorted (N·k, C) = weights[slot] · dout[token] and dweights (N,k) =
/// dout[n] · y_sorted[row of (n,j)]; both overwritten.
///
/// # Errors
/// `ShapeMismatch` for an inconsistent plan or lengths.
#[allow(
    clippy::too_many_arguments,
    reason = "signature fixed by the executor's API"
)]
pub fn combine_backward(
    dy_sorted: &mut [f32],
    dweights: &mut [f32],
    dout: &[f32],
    y_sorted: &[f32],
    weights: &[f32],
    p: &DispatchPlan,
    c: usize,
) -> Result<()> {
    let inv = check_combine(p, dout.len(), y_sorted.len(), weights.len(), c)?;
    check_len("combine dy_sorted", dy_sorted.len(), y_sorted.len())?;
    check_len("combine dweights", dweights.len(), weights.len())?;
    if c == 0 {
        dweights.fill(0.0);
        return Ok(());
    }
    let blk = rows_per_task(c);
    dy_sorted
        .par_chunks_mut(blk * c)
        .enumerate()
        .for_each(|(b, dys)| {
            for (row, &slot) in dys.chunks_mut(c).zip(&p.order[b * blk..]) {
                let (t, wgt) = (slot as usize / p.k, weights[slot as usize]);
                for (d, &g) in row.iter_mut().zip(&dout[t * c..(t + 1) * c]) {
                    *d = wgt * g;
                }
            }
        });
    dweights.par_iter_mut().enumerate().for_each(|(slot, dw)| {
        let (t, row) = (slot / p.k, inv[slot] as usize);
        *dw = dot(&dout[t * c..(t + 1) * c], &y_sorted[row * c..(row + 1) * c]);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{self as r, check::*};

    fn routers() -> Vec<Router> {
        let mut v = Vec::new();
        for &(n, e, k) in &[(1, 1, 1), (7, 8, 2), (33, 13, 3), (5, 6, 6)] {
            for score in [ScoreFn::Softmax, ScoreFn::Sigmoid] {
                for normalize_topk in [false, true] {
                    v.push(Router {
                        n,
                        e,
                        k,
                        score,
                        normalize_topk,
                    });
                }
            }
        }
        v
    }

    #[test]
    fn router_forward_matches_reference() {
        let mut rng = rng(70);
        for rt in routers() {
            let logits: Vec<f32> = randn(&mut rng, rt.n * rt.e)
                .iter()
                .map(|x| 3.0 * x)
                .collect();
            let (mut w, mut idx, mut p) = (
                vec![f32::NAN; rt.n * rt.k],
                vec![u32::MAX; rt.n * rt.k],
                vec![f32::NAN; rt.n * rt.e],
            );
            router_forward(&mut w, &mut idx, &mut p, &logits, &rt).unwrap();
            let (wp, wi, ww) = r::router(&f64s(&logits), &rt);
            assert_eq!(idx, wi, "{rt:?}");
            // probabilities of O(1) logits: exp_f32 and a normalising division
            assert_close(&format!("router probs {rt:?}"), &p, &wp, 1e-6, 1e-6);
            assert_close(&format!("router weights {rt:?}"), &w, &ww, 1e-6, 1e-6);
        }
    }

    #[test]
    fn router_ties_pick_lower_index() {
        let logits = [
            1.0f32, 3.0, 3.0, 0.0, 3.0, /* row 2: all equal */ 0.5, 0.5, 0.5, 0.5, 0.5,
        ];
        for score in [ScoreFn::Softmax, ScoreFn::Sigmoid] {
            let rt = Router {
                n: 2,
                e: 5,
                k: 2,
                score,
                normalize_topk: true,
            };
            let (mut w, mut idx, mut p) = (vec![0.0; 4], vec![0; 4], vec![0.0; 10]);
            router_forward(&mut w, &mut idx, &mut p, &logits, &rt).unwrap();
            assert_eq!(idx, [1, 2, 0, 1]);
            assert_eq!(w, [0.5, 0.5, 0.5, 0.5]);
        }
    }

    #[test]
    fn router_backward_matches_finite_differences() {
        let mut rng = rng(71);
        for rt in routers() {
            let logits: Vec<f32> = randn(&mut rng, rt.n * rt.e)
                .iter()
                .map(|x| 3.0 * x)
                .collect();
            let (mut w, mut idx, mut p) = (
                vec![0.0; rt.n * rt.k],
                vec![0; rt.n * rt.k],
                vec![0.0; rt.n * rt.e],
            );
            router_forward(&mut w, &mut idx, &mut p, &logits, &rt).unwrap();
            let rr = randn(&mut rng, rt.n * rt.k);
            let mut dl = vec![f32::NAN; rt.n * rt.e];
            router_backward(&mut dl, &rr, &p, &idx, &rt).unwrap();
            let lf = f64s(&logits);
            // random logits: the k-th and (k+1)-th scores differ by far more than the
            // FD step, so the selection is constant around x
            let fd = fd_grad(&lf, &all(lf.len()), |x| loss(&r::router(x, &rt).2, &rr));
            assert_close(&format!("router dlogits {rt:?}"), &dl, &fd, 1e-6, 1e-5);
        }
    }

    #[test]
    fn dispatch_plan_is_a_stable_sort_by_expert() {
        let idx = [2u32, 0, 0, 1, 2, 0, 3, 0];
        let p = dispatch_plan(&idx, 4, 2, 5).unwrap();
        assert_eq!(p.offsets, [0, 4, 5, 7, 8, 8]); // expert 4 gets nothing
        assert_eq!(p.order, [1, 2, 5, 7, 3, 0, 4, 6]);
        assert!(dispatch_plan(&idx, 4, 2, 3).is_err()); // index 3 >= e
        assert!(dispatch_plan(&idx, 3, 2, 5).is_err());
        assert!(dispatch_plan(&idx, 4, 0, 5).is_err());
        let mut bad = p.clone();
        bad.order[0] = 2; // duplicate slot
        let mut xs = vec![0.0; 8];
        assert!(dispatch_forward(&mut xs, &[0.0; 4], &bad, 1).is_err());
        let mut bad = p.clone();
        bad.offsets[2] = 9;
        assert!(combine_forward(&mut [0.0; 4], &xs, &[0.0; 8], &bad, 1).is_err());
    }

    /// Builds a routed batch: x (N,C), router weights/indices, and the plan.
    fn routed(
        rng: &mut Rng,
        n: usize,
        c: usize,
        e: usize,
        k: usize,
    ) -> (Vec<f32>, Vec<f32>, Vec<u32>, DispatchPlan) {
        let rt = Router {
            n,
            e,
            k,
            score: ScoreFn::Softmax,
            normalize_topk: true,
        };
        let logits: Vec<f32> = randn(rng, n * e).iter().map(|x| 4.0 * x).collect();
        let (mut w, mut idx, mut p) = (vec![0.0; n * k], vec![0; n * k], vec![0.0; n * e]);
        router_forward(&mut w, &mut idx, &mut p, &logits, &rt).unwrap();
        let plan = dispatch_plan(&idx, n, k, e).unwrap();
        (randn(rng, n * c), w, idx, plan)
    }

    /// dispatch → grouped GEMM → combine equals the naive per-token expert loop, and
    /// the reversed chain of backwards equals finite differences of that loop.
    #[test]
    fn moe_pipeline_matches_naive_loop_and_finite_differences() {
        let mut rng = rng(72);
        // (N, C=k_in, n_out, E, k): includes experts with no tokens (E > N·k) and a
        // size that takes the GEMM-parallel path
        for &(n, c, n_out, e, k) in &[
            (7, 5, 3, 4, 2),
            (3, 4, 6, 16, 2),
            (1, 3, 2, 1, 1),
            (300, 64, 48, 4, 2),
        ] {
            let (x, wts, idx, plan) = routed(&mut rng, n, c, e, k);
            let w = randn(&mut rng, e * n_out * c);
            let mut xs = vec![f32::NAN; n * k * c];
            dispatch_forward(&mut xs, &x, &plan, c).unwrap();
            let mut ys = vec![f32::NAN; n * k * n_out];
            grouped_matmul_forward(&mut ys, &xs, &w, &plan, c, n_out).unwrap();
            let mut out = vec![f32::NAN; n * n_out];
            combine_forward(&mut out, &ys, &wts, &plan, n_out).unwrap();
            let (xf, wf, wtf) = (f64s(&x), f64s(&w), f64s(&wts));
            let want = r::moe_naive(&xf, &idx, &wtf, &wf, k, c, n_out);
            // C-term f32 dot products of O(1) values, then a k-term weighted sum
            assert_close("moe forward", &out, &want, 1e-5, 1e-5);

            let rr = randn(&mut rng, n * n_out);
            let (mut dys, mut dwts) = (vec![f32::NAN; ys.len()], vec![f32::NAN; wts.len()]);
            combine_backward(&mut dys, &mut dwts, &rr, &ys, &wts, &plan, n_out).unwrap();
            let mut dxs = vec![f32::NAN; xs.len()];
            let dw0 = randn(&mut rng, w.len());
            let mut dw = dw0.clone();
            grouped_matmul_backward(&mut dxs, &mut dw, &dys, &dys, &xs, &w, &plan, c, n_out).unwrap();
            let mut dx = vec![f32::NAN; x.len()];
            dispatch_backward(&mut dx, &dxs, &plan, c).unwrap();

            let f = |x: &[f64], wt: &[f64], w: &[f64]| {
                loss(&r::moe_naive(x, &idx, wt, w, k, c, n_out), &rr)
            };
            let ix = some(&mut rng, x.len(), 60);
            let iw = some(&mut rng, w.len(), 60);
            let fx = fd_grad(&xf, &ix, |p| f(p, &wtf, &wf));
            let iwt = some(&mut rng, wts.len(), 60);
            let fwt = fd_grad(&wtf, &iwt, |p| f(&xf, p, &wf));
            let fw = fd_grad(&wf, &iw, |p| f(&xf, &wtf, p));
            // sums over n_out (dx) or over routed tokens (dw, up to ~N·k/E·... terms)
            assert_close("moe dx", &pick(&dx, &ix), &fx, 1e-5, 1e-4);
            assert_close("moe dweights", &pick(&dwts, &iwt), &fwt, 1e-5, 1e-4);
            assert!(
                dwts.iter().chain(&dx).all(|v| v.is_finite()),
                "unwritten gradient"
            );
            let ddw: Vec<f32> = iw.iter().map(|&i| dw[i] - dw0[i]).collect();
            assert_close("moe dw (+=)", &ddw, &fw, 1e-4, 1e-4);
            // experts without tokens: dw untouched exactly
            for ex in 0..e {
                if plan.offsets[ex] == plan.offsets[ex + 1] {
                    let s = ex * n_out * c..(ex + 1) * n_out * c;
                    assert_eq!(dw[s.clone()], dw0[s]);
                }
            }
        }
    }

    /// A presorted plan runs the grouped GEMM on rows grouped by expert as they are, empty
    /// experts included, and its length checks still bind: rows against the plan, the
    /// weight against its expert count.
    #[test]
    fn presorted_plan_runs_grouped_rows_in_place() {
        let mut rng = rng(73);
        let counts = [3usize, 0, 2];
        let p = presorted_plan(&counts).unwrap();
        assert_eq!((p.e, p.k, p.offsets.as_slice()), (3, 1, &[0, 3, 3, 5][..]));
        let (k_in, n_out) = (4, 2);
        let x = randn(&mut rng, 5 * k_in);
        let w = randn(&mut rng, 3 * n_out * k_in);
        let mut y = vec![f32::NAN; 5 * n_out];
        grouped_matmul_forward(&mut y, &x, &w, &p, k_in, n_out).unwrap();
        for (row, e) in [(0, 0), (1, 0), (2, 0), (3, 2), (4, 2)] {
            for o in 0..n_out {
                let want: f32 = (0..k_in)
                    .map(|i| x[row * k_in + i] * w[(e * n_out + o) * k_in + i])
                    .sum();
                assert!((y[row * n_out + o] - want).abs() < 1e-5);
            }
        }
        assert!(grouped_matmul_forward(&mut y, &x[..4 * k_in], &w, &p, k_in, n_out).is_err());
        assert!(
            grouped_matmul_forward(&mut y, &x, &w[..2 * n_out * k_in], &p, k_in, n_out).is_err()
        );
        let empty = presorted_plan(&[0, 0]).unwrap();
        grouped_matmul_forward(&mut [], &[], &w[..2 * n_out * k_in], &empty, k_in, n_out).unwrap();
        assert!(presorted_plan(&[]).is_err());
    }

    #[test]
    fn moe_kernels_reject_bad_lengths() {
        let p = dispatch_plan(&[0, 1, 1, 0], 2, 2, 2).unwrap();
        let mut xs = vec![0.0; 4 * 3];
        assert!(dispatch_forward(&mut xs, &[0.0; 5], &p, 3).is_err());
        assert!(dispatch_forward(&mut xs, &[0.0; 6], &p, 3).is_ok());
        let mut ys = vec![0.0; 4 * 2];
        assert!(grouped_matmul_forward(&mut ys, &xs, &[0.0; 11], &p, 3, 2).is_err());
        assert!(grouped_matmul_forward(&mut ys, &xs, &[0.0; 12], &p, 3, 0).is_err());
        assert!(grouped_matmul_forward(&mut ys, &xs, &[0.0; 12], &p, 3, 2).is_ok());
        let mut out = vec![0.0; 4];
        assert!(combine_forward(&mut out, &ys, &[0.0; 3], &p, 2).is_err());
        let rt = Router {
            n: 2,
            e: 2,
            k: 3,
            score: ScoreFn::Softmax,
            normalize_topk: false,
        };
        assert!(router_forward(&mut [0.0; 6], &mut [0; 6], &mut [0.0; 4], &[0.0; 4], &rt).is_err());
        let rt = Router { k: 1, ..rt };
        assert!(router_backward(&mut [0.0; 4], &[0.0; 2], &[0.0; 4], &[0, 2], &rt).is_err());
    }

    /// Softmax scores of large logits: the row max is taken out before exp, so logits
    /// near 1000 (exp overflows f32 past 88.7) score as softmax([2, 1, 0]) =
    /// [e^2, e, 1] / (e^2 + e + 1) = [0.665241, 0.244728, 0.090031], not NaN.
    #[test]
    fn softmax_router_survives_large_logits() {
        let rt = Router { n: 1, e: 3, k: 2, score: ScoreFn::Softmax, normalize_topk: false };
        let (mut w, mut idx, mut p) = ([0f32; 2], [0u32; 2], [0f32; 3]);
        router_forward(&mut w, &mut idx, &mut p, &[1000.0, 999.0, 998.0], &rt).unwrap();
        for (g, want) in p.iter().zip([0.665_241f32, 0.244_728, 0.090_031]) {
            assert!((g - want).abs() < 1e-5, "{p:?}");
        }
        assert_eq!(idx, [0, 1]);
        assert!((w[0] - 0.665_241).abs() < 1e-5 && (w[1] - 0.244_728).abs() < 1e-5, "{w:?}");
    }
}
