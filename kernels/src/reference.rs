//! f64 reference implementations of every forward kernel, plus test helpers.
//!
//! These are the "obviously correct" versions the tests trust: naive loops, f64
//! throughout, whole score matrices materialised, no tiling, no threads. The tests
//! compare each f32 kernel's forward against them, and each backward against central
//! finite differences of them. Built for tests, or for other crates with the
//! `reference` feature (e.g. to check a CUDA kernel against the same definition).
//!
//! Shape notation as in the crate root (B, T, C, H, Hkv, D, Dv, V, E, k, N = B*T);
//! all buffers row-major.

use crate::cpu::attention::Attn;
use crate::cpu::cp::CpShard;
use crate::cpu::moe::{Router, ScoreFn};
use crate::cpu::precision::Fp8Format;
use crate::cpu::rope::Rope;
use crate::cpu::ssm::{Conv1d, Ssm, SsmGrads, SsmInputs};

/// c (M,N) = op(a) · op(b), a stored (M,K) or (K,M) if `ta`, b stored (K,N) or (N,K) if `tb`.
pub fn matmul(a: &[f64], b: &[f64], m: usize, n: usize, k: usize, ta: bool, tb: bool) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                let av = if ta { a[p * m + i] } else { a[i * k + p] };
                let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                s += av * bv;
            }
            c[i * n + j] = s;
        }
    }
    c
}

/// out (N,C) = weight[tokens[n]] for weight (V,C).
pub fn embedding(tokens: &[u32], weight: &[f64], c: usize) -> Vec<f64> {
    tokens
        .iter()
        .flat_map(|&t| weight[t as usize * c..(t as usize + 1) * c].to_vec())
        .collect()
}

/// RMSNorm over rows of width C: out = x / sqrt(mean(x²) + eps) * w.
pub fn rmsnorm(x: &[f64], w: &[f64], c: usize, eps: f64) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for (o, xr) in out.chunks_mut(c).zip(x.chunks(c)) {
        let ms = xr.iter().map(|v| v * v).sum::<f64>() / c as f64;
        let r = 1.0 / (ms + eps).sqrt();
        for i in 0..c {
            o[i] = xr[i] * r * w[i];
        }
    }
    out
}

/// LayerNorm over rows of width C (biased variance, as PyTorch).
pub fn layernorm(x: &[f64], w: &[f64], b: &[f64], c: usize, eps: f64) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for (o, xr) in out.chunks_mut(c).zip(x.chunks(c)) {
        let mean = xr.iter().sum::<f64>() / c as f64;
        let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / c as f64;
        let r = 1.0 / (var + eps).sqrt();
        for i in 0..c {
            o[i] = (xr[i] - mean) * r * w[i] + b[i];
        }
    }
    out
}

/// Global positions of `t` local rows of context-parallel rank `cp` (0..t without one),
/// listed chunk by chunk from Megatron's load-balanced split: the global sequence is
/// 2·size chunks of t/2 tokens and rank r holds chunks r and 2·size−1−r, in that order.
pub fn cp_positions(t: usize, cp: Option<CpShard>) -> Vec<usize> {
    let Some(cp) = cp else {
        return (0..t).collect();
    };
    let c = t / 2;
    let mut pos = Vec::new();
    for chunk in [cp.rank, 2 * cp.size - 1 - cp.rank] {
        pos.extend(chunk * c..(chunk + 1) * c);
    }
    pos
}

/// Global positions of the `size·t` rows a context-parallel all-gather makes of every
/// rank's `t` local rows (rank order); 0..t without context parallelism.
pub fn cp_gathered_positions(t: usize, cp: Option<CpShard>) -> Vec<usize> {
    let Some(cp) = cp else {
        return (0..t).collect();
    };
    (0..cp.size)
        .flat_map(|rank| cp_positions(t, Some(CpShard { rank, ..cp })))
        .collect()
}

/// Rotate-half RoPE, written from the HF Llama formula
/// `x*cos + rotate_half(x)*sin` with `rotate_half(x) = cat(-x2, x1)`.
pub fn rope(x: &[f64], r: &Rope) -> Vec<f64> {
    let half = r.rot_dim / 2;
    let mut out = x.to_vec();
    let positions = cp_positions(r.t, r.cp);
    for b in 0..r.b {
        for (t, &p) in positions.iter().enumerate() {
            let pos = (r.pos_offset + p) as f64;
            for h in 0..r.h {
                let base = ((b * r.t + t) * r.h + h) * r.d;
                for i in 0..r.rot_dim {
                    let fi = i % half;
                    let inv_freq = (r.theta as f64).powf(-(2.0 * fi as f64) / r.rot_dim as f64);
                    let (s, c) = (pos * inv_freq).sin_cos();
                    let rot = if i < half {
                        -x[base + i + half]
                    } else {
                        x[base + i - half]
                    };
                    out[base + i] = x[base + i] * c + rot * s;
                }
            }
        }
    }
    out
}

/// Whether key j is visible to query i (the mask `attention_forward` documents), both
/// global positions.
pub fn visible(a: &Attn, i: usize, j: usize) -> bool {
    let upper = if a.causal {
        j <= i
    } else {
        a.window.is_none_or(|w| j < i + w)
    };
    let lower = a.window.is_none_or(|w| j + w > i);
    upper && lower
}

/// Scaled dot-product attention with the full score matrix, grouped-query.
/// Returns out (B,T,H,Dv) and lse (B,H,T). With `a.cp`, q's T rows are a cp rank's
/// chunks and k, v hold the size·T gathered rows ([`cp_positions`],
/// [`cp_gathered_positions`]); the mask compares global positions.
pub fn attention(q: &[f64], k: &[f64], v: &[f64], a: &Attn) -> (Vec<f64>, Vec<f64>) {
    let group = a.h / a.hkv;
    let (qpos, kpos) = (cp_positions(a.t, a.cp), cp_gathered_positions(a.t, a.cp));
    let tk = kpos.len();
    let mut out = vec![0.0; a.b * a.t * a.h * a.dv];
    let mut lse = vec![0.0; a.b * a.h * a.t];
    for b in 0..a.b {
        for h in 0..a.h {
            let g = h / group;
            for i in 0..a.t {
                let qi = &q[((b * a.t + i) * a.h + h) * a.d..][..a.d];
                let s: Vec<Option<f64>> = (0..tk)
                    .map(|j| {
                        visible(a, qpos[i], kpos[j]).then(|| {
                            let kj = &k[((b * tk + j) * a.hkv + g) * a.d..][..a.d];
                            qi.iter().zip(kj).map(|(x, y)| x * y).sum::<f64>() * a.scale as f64
                        })
                    })
                    .collect();
                let m = s
                    .iter()
                    .flatten()
                    .cloned()
                    .fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().flatten().map(|x| (x - m).exp()).sum();
                lse[(b * a.h + h) * a.t + i] = m + z.ln();
                let o = &mut out[((b * a.t + i) * a.h + h) * a.dv..][..a.dv];
                for (j, sj) in s.iter().enumerate() {
                    if let Some(sj) = sj {
                        let p = (sj - m).exp() / z;
                        let vj = &v[((b * tk + j) * a.hkv + g) * a.dv..][..a.dv];
                        for (oo, vv) in o.iter_mut().zip(vj) {
                            *oo += p * vv;
                        }
                    }
                }
            }
        }
    }
    (out, lse)
}

/// silu(gate) * up.
pub fn swiglu(gate: &[f64], up: &[f64]) -> Vec<f64> {
    gate.iter()
        .zip(up)
        .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
        .collect()
}

/// GELU, tanh approximation.
pub fn gelu(x: &[f64]) -> Vec<f64> {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    x.iter()
        .map(|x| 0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh()))
        .collect()
}

/// relu(x)².
pub fn squared_relu(x: &[f64]) -> Vec<f64> {
    x.iter().map(|x| x.max(0.0) * x.max(0.0)).collect()
}

/// Causal depthwise conv1d with SiLU (causal-conv1d's `activation="silu"`): x (B,T,C),
/// w (C,K), bias (C); u = bias + Σ_k w[c,k]·x[t−(K−1)+k] (zero before the sequence),
/// out = u·σ(u).
pub fn causal_conv1d(x: &[f64], w: &[f64], bias: &[f64], s: &Conv1d) -> Vec<f64> {
    let (c, k) = (s.c, s.k);
    let mut out = vec![0.0; x.len()];
    for b in 0..s.b {
        for t in 0..s.t {
            for ch in 0..c {
                let mut u = bias[ch];
                for j in 0..k {
                    if t + j >= k - 1 {
                        u += w[ch * k + j] * x[(b * s.t + t + j - (k - 1)) * c + ch];
                    }
                }
                out[(b * s.t + t) * c + ch] = u / (1.0 + (-u).exp());
            }
        }
    }
    out
}

/// The conv's input, weight and bias gradients for output gradient `dy`, as the adjoint
/// of [`causal_conv1d`] written as a scatter (each output sends its gradient back to the
/// inputs it read).
pub fn causal_conv1d_backward(
    dy: &[f64],
    x: &[f64],
    w: &[f64],
    bias: &[f64],
    s: &Conv1d,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (c, k) = (s.c, s.k);
    let (mut dx, mut dw, mut db) = (vec![0.0; x.len()], vec![0.0; w.len()], vec![0.0; c]);
    for b in 0..s.b {
        for t in 0..s.t {
            for ch in 0..c {
                let src = |j: usize| (t + j >= k - 1).then(|| (b * s.t + t + j - (k - 1)) * c + ch);
                let mut u = bias[ch];
                for j in 0..k {
                    if let Some(i) = src(j) {
                        u += w[ch * k + j] * x[i];
                    }
                }
                let sg = 1.0 / (1.0 + (-u).exp());
                let du = dy[(b * s.t + t) * c + ch] * sg * (1.0 + u * (1.0 - sg));
                db[ch] += du;
                for j in 0..k {
                    if let Some(i) = src(j) {
                        dw[ch * k + j] += du * x[i];
                        dx[i] += w[ch * k + j] * du;
                    }
                }
            }
        }
    }
    (dx, dw, db)
}

/// softplus in f64 without a threshold: max(v, 0) + ln(1 + e^−|v|).
fn softplus(v: f64) -> f64 {
    v.max(0.0) + (-v.abs()).exp().ln_1p()
}

/// a = −exp(a_log), a_log clamped to the kernels' [`crate::cpu::ssm::A_LOG_MAX`] as they
/// clamp it (in f64 exp does not overflow there, but the reference computes what the
/// kernels define).
fn decay_rate(a_log: f64) -> f64 {
    let max = f64::from(crate::cpu::ssm::A_LOG_MAX);
    -(if a_log > max { max } else { a_log }).exp()
}

/// Mamba-2's SSD scan step by step (the definition on `runner_kernels::cpu::ssm`):
/// returns y (B,T,H,P).
pub fn ssm_scan(i: SsmInputs<&[f64]>, s: &Ssm) -> Vec<f64> {
    let (p, n, hpg) = (s.p, s.n, s.h / s.g);
    let mut y = vec![0.0; s.b * s.t * s.h * p];
    for b in 0..s.b {
        for h in 0..s.h {
            let a = decay_rate(i.a_log[h]);
            let mut st = vec![0.0; p * n];
            for t in 0..s.t {
                let row = (b * s.t + t) * s.h + h;
                let grow = (b * s.t + t) * s.g + h / hpg;
                let dtv = softplus(i.dt[row] + i.dt_bias[h]);
                let decay = (dtv * a).exp();
                for pp in 0..p {
                    for nn in 0..n {
                        st[pp * n + nn] =
                            decay * st[pp * n + nn] + dtv * i.x[row * p + pp] * i.bm[grow * n + nn];
                    }
                }
                for pp in 0..p {
                    let sc: f64 = (0..n).map(|nn| st[pp * n + nn] * i.cm[grow * n + nn]).sum();
                    y[row * p + pp] = sc + i.d[h] * i.x[row * p + pp];
                }
            }
        }
    }
    y
}

/// The SSD scan's gradients for output gradient `dy`, by a route other than the CPU
/// kernel's, the one its CUDA twin takes: a forward sweep gives dC and
/// q_t = ⟨dy_t c_tᵀ, S_t⟩; a backward sweep carries dS, and the gradient of step t's
/// log-decay dt'_t·a, ⟨dS_t, exp(dt'_t a) S_{t−1}⟩, is the reverse cumulative sum of
/// q_s − dt'_s·⟨dS_s, x_s b_sᵀ⟩ over s >= t (Mamba-2's `ddA_cumsum`), so no state is
/// needed going backwards. dB, dC sum over the heads of a group; the weights over B, T.
pub fn ssm_scan_backward(dy: &[f64], i: SsmInputs<&[f64]>, s: &Ssm) -> SsmGrads<Vec<f64>> {
    let (p, n, hpg) = (s.p, s.n, s.h / s.g);
    let mut gr = SsmGrads {
        dx: vec![0.0; i.x.len()],
        ddt: vec![0.0; i.dt.len()],
        dbm: vec![0.0; i.bm.len()],
        dcm: vec![0.0; i.cm.len()],
        da_log: vec![0.0; s.h],
        dd: vec![0.0; s.h],
        ddt_bias: vec![0.0; s.h],
    };
    for b in 0..s.b {
        for h in 0..s.h {
            let a = decay_rate(i.a_log[h]);
            // Step t: its (b,t,h) and (b,t,g) rows, dt', x_t, b_t, c_t.
            let step = |t: usize| {
                let (row, grow) = ((b * s.t + t) * s.h + h, (b * s.t + t) * s.g + h / hpg);
                let dv = softplus(i.dt[row] + i.dt_bias[h]);
                let (x, bm, cm) = (
                    &i.x[row * p..][..p],
                    &i.bm[grow * n..][..n],
                    &i.cm[grow * n..][..n],
                );
                (row, grow, dv, x, bm, cm)
            };
            let mut st = vec![0.0; p * n];
            let mut q = vec![0.0; s.t];
            for (t, qt) in q.iter_mut().enumerate() {
                let (row, grow, dv, x, bm, cm) = step(t);
                let decay = (dv * a).exp();
                for pp in 0..p {
                    for nn in 0..n {
                        let v = decay * st[pp * n + nn] + dv * x[pp] * bm[nn];
                        st[pp * n + nn] = v;
                        gr.dcm[grow * n + nn] += v * dy[row * p + pp];
                        *qt += dy[row * p + pp] * v * cm[nn];
                    }
                }
            }
            let mut ds = vec![0.0; p * n];
            let (mut cum, mut da) = (0.0, 0.0);
            for t in (0..s.t).rev() {
                let (row, grow, dv, x, bm, cm) = step(t);
                let dyt = &dy[row * p..][..p];
                let mut g1 = 0.0;
                for pp in 0..p {
                    let mut r = 0.0;
                    for nn in 0..n {
                        ds[pp * n + nn] += dyt[pp] * cm[nn];
                        r += ds[pp * n + nn] * bm[nn];
                        gr.dbm[grow * n + nn] += dv * ds[pp * n + nn] * x[pp];
                    }
                    gr.dx[row * p + pp] = i.d[h] * dyt[pp] + dv * r;
                    g1 += x[pp] * r;
                    gr.dd[h] += dyt[pp] * x[pp];
                }
                cum += q[t] - dv * g1;
                da += dv * cum;
                let sg = 1.0 / (1.0 + (-(i.dt[row] + i.dt_bias[h])).exp());
                gr.ddt[row] = (g1 + a * cum) * sg;
                gr.ddt_bias[h] += gr.ddt[row];
                let decay = (dv * a).exp();
                for v in &mut ds {
                    *v *= decay;
                }
            }
            gr.da_log[h] += da * a;
        }
    }
    gr
}

/// Softmax cross-entropy per row; returns (losses (N), lse (N), mean over non-ignored rows).
pub fn cross_entropy(logits: &[f64], targets: &[u32], v: usize) -> (Vec<f64>, Vec<f64>, f64) {
    let mut losses = Vec::new();
    let mut lses = Vec::new();
    let (mut total, mut count) = (0.0, 0usize);
    for (row, &t) in logits.chunks(v).zip(targets) {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
        lses.push(lse);
        if t == u32::MAX {
            losses.push(0.0);
        } else {
            let l = lse - row[t as usize];
            losses.push(l);
            total += l;
            count += 1;
        }
    }
    let mean = if count == 0 {
        0.0
    } else {
        total / count as f64
    };
    (losses, lses, mean)
}

/// Router: probs (N,E), top-k indices (N,k) by repeated arg-max (ties -> lower index),
/// weights (N,k).
pub fn router(logits: &[f64], r: &Router) -> (Vec<f64>, Vec<u32>, Vec<f64>) {
    let mut probs = Vec::new();
    let mut idx = Vec::new();
    let mut wts = Vec::new();
    for row in logits.chunks(r.e) {
        let p: Vec<f64> = match r.score {
            ScoreFn::Softmax => {
                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = row.iter().map(|x| (x - m).exp()).sum();
                row.iter().map(|x| (x - m).exp() / z).collect()
            }
            ScoreFn::Sigmoid => row.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect(),
        };
        let mut taken = vec![false; r.e];
        let mut sel = Vec::new();
        for _ in 0..r.k {
            let mut best = None;
            for e in 0..r.e {
                if !taken[e] && best.is_none_or(|b: usize| p[e] > p[b]) {
                    best = Some(e);
                }
            }
            let b = best.unwrap();
            taken[b] = true;
            sel.push(b);
        }
        let s: f64 = sel.iter().map(|&e| p[e]).sum();
        for &e in &sel {
            idx.push(e as u32);
            wts.push(if r.normalize_topk { p[e] / s } else { p[e] });
        }
        probs.extend(p);
    }
    (probs, idx, wts)
}

/// The MoE layer the dispatch → grouped GEMM → combine pipeline computes, as a naive
/// per-token loop: out[n] = Σ_j weights[n,j] · (x[n] · W_{e}^T), e = indices[n,j],
/// w (E, n_out, k_in).
pub fn moe_naive(
    x: &[f64],
    indices: &[u32],
    weights: &[f64],
    w: &[f64],
    k: usize,
    k_in: usize,
    n_out: usize,
) -> Vec<f64> {
    let n = x.len() / k_in;
    let mut out = vec![0.0; n * n_out];
    for t in 0..n {
        for j in 0..k {
            let e = indices[t * k + j] as usize;
            for o in 0..n_out {
                let we = &w[(e * n_out + o) * k_in..][..k_in];
                let y: f64 = x[t * k_in..][..k_in]
                    .iter()
                    .zip(we)
                    .map(|(a, b)| a * b)
                    .sum();
                out[t * n_out + o] += weights[t * k + j] * y;
            }
        }
    }
    out
}

/// The non-negative finite values of an FP8 format, ascending, with their codes,
/// from the format definition (OCP FP8: E4M3FN bias 7, E5M2 bias 15).
pub fn fp8_values(f: Fp8Format) -> Vec<(u8, f64)> {
    let (mbits, bias, max_code) = match f {
        Fp8Format::E4M3 => (3, 7, 0x7Eu8),
        Fp8Format::E5M2 => (2, 15, 0x7B),
    };
    (0..=max_code)
        .map(|code| {
            let field = (code >> mbits) as i32;
            let mant = (code & ((1 << mbits) - 1)) as f64;
            let v = if field == 0 {
                mant * 2f64.powi(1 - bias - mbits)
            } else {
                (1.0 + mant / (1 << mbits) as f64) * 2f64.powi(field - bias)
            };
            (code, v)
        })
        .collect()
}

/// FP8 encode by exhaustive nearest-value search: the nearest of the finite values
/// and of the first value past the maximum (480 for E4M3, 2^16 for E5M2, standing for
/// overflow); ties go to the even code. Overflow gives ±max if `saturate`, else NaN
/// (E4M3, 0x7F) or Inf (E5M2, 0x7C).
pub fn fp8_encode(x: f64, f: Fp8Format, saturate: bool) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    if x.is_nan() {
        return sign | 0x7F;
    }
    let vals = fp8_values(f);
    let (max_code, max) = *vals.last().unwrap();
    let virt = (max_code + 1, 2.0 * max - vals[vals.len() - 2].1);
    let overflow = sign | if saturate { max_code } else { max_code + 1 };
    let a = x.abs();
    if a >= virt.1 {
        return overflow; // (also keeps huge |x| from tying in f64 distances)
    }
    let mut best = vals[0];
    for &(code, v) in vals.iter().chain(std::iter::once(&virt)) {
        let (d, bd) = ((a - v).abs(), (a - best.1).abs());
        if d < bd || (d == bd && code % 2 == 0) {
            best = (code, v);
        }
    }
    if best.0 == virt.0 {
        overflow
    } else {
        sign | best.0
    }
}

/// Test helpers: seeded random data, tolerant comparison, finite differences.
#[cfg(test)]
pub mod check {
    use rand::{Rng as _, SeedableRng, seq::index::sample};

    /// The test RNG.
    pub type Rng = rand::rngs::StdRng;

    /// A seeded RNG (tests are reproducible).
    pub fn rng(seed: u64) -> Rng {
        Rng::seed_from_u64(seed)
    }

    /// `n` values uniform in [-1, 1).
    pub fn randn(rng: &mut Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    }

    /// Widen to f64 (exact).
    pub fn f64s(x: &[f32]) -> Vec<f64> {
        x.iter().map(|&v| v as f64).collect()
    }

    /// Σ a·b in f64.
    pub fn dot64(a: &[f64], b: &[f64]) -> f64 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    /// All indices 0..n.
    pub fn all(n: usize) -> Vec<usize> {
        (0..n).collect()
    }

    /// Up to `count` distinct random indices below `n` (all of them if n <= count).
    pub fn some(rng: &mut Rng, n: usize, count: usize) -> Vec<usize> {
        if n <= count {
            all(n)
        } else {
            sample(rng, n, count).into_vec()
        }
    }

    /// `g[idx]`.
    pub fn pick(g: &[f32], idx: &[usize]) -> Vec<f32> {
        idx.iter().map(|&i| g[i]).collect()
    }

    /// Central finite differences of the scalar `f` at `x`, for the elements `idx`.
    /// Step 1e-5·max(1,|x_i|): in f64 the truncation error (~h²·f''') and the
    /// cancellation error (~1e-16·|f|/h) are both far below the f32 kernels' errors.
    pub fn fd_grad(x: &[f64], idx: &[usize], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
        let mut xp = x.to_vec();
        idx.iter()
            .map(|&i| {
                let h = 1e-5 * x[i].abs().max(1.0);
                xp[i] = x[i] + h;
                let fp = f(&xp);
                xp[i] = x[i] - h;
                let fm = f(&xp);
                xp[i] = x[i];
                (fp - fm) / (2.0 * h)
            })
            .collect()
    }

    /// Asserts |got - want| <= atol + rtol·|want| elementwise (NaN fails), reporting the
    /// worst element.
    pub fn assert_close(name: &str, got: &[f32], want: &[f64], atol: f64, rtol: f64) {
        assert_eq!(got.len(), want.len(), "{name}: length");
        let mut worst: Option<(usize, f64)> = None;
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let err = (g as f64 - w).abs();
            let excess = if err.is_nan() {
                f64::INFINITY
            } else {
                err / (atol + rtol * w.abs())
            };
            if excess > 1.0 && worst.is_none_or(|(_, e)| excess > e) {
                worst = Some((i, excess));
            }
        }
        if let Some((i, e)) = worst {
            panic!(
                "{name}: element {i}: got {} want {} (error {:.3}x tolerance atol={atol} rtol={rtol})",
                got[i], want[i], e
            );
        }
    }

    /// `L = Σ out·r` for the gradient checks.
    pub fn loss(out: &[f64], r: &[f32]) -> f64 {
        dot64(out, &f64s(r))
    }
}
