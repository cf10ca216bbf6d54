// Mamba-2's mixer, forward beside backward (CPU twin: runner-kernels cpu/ssm.rs): the
// depthwise causal conv1d with SiLU fused, and the SSD scan with one scalar decay per head.
//
// Conv: x, out, du, dx (B,T,C), w (C,K), bias (C); one thread per element. The weight
// gradient sums over rows in two deterministic stages (causal_conv1d_dw_partials, then
// norm.cu's column_finish); the bias gradient is norm.cu's column sums of du.
//
// Scan: x, y (B,T,H,P), dt (B,T,H), bm, cm (B,T,G,N), a_log, d, dt_bias (H), states
// (B,H,chunks,P,N): the state entering each chunk of `chunk` steps. dt' = softplus(dt +
// dt_bias), a = −exp(a_log), S ← exp(dt'a)·S + dt'·x_t b_tᵀ, y_t = S c_t + d·x_t.
//
// ssm_scan_forward: one block per (b,h) walks the sequence with S (P,N) in dynamic shared
//   memory; warp w owns rows p = w, w + warps, ... (lanes over n), so the warps never wait
//   for each other.
// The backward needs no state going backwards:
//   ssm_scan_backward_fwd: one block per (b,h,chunk) re-runs its chunk from the saved
//     state (a thread per column n of S) and writes this head's dC_t = S_tᵀ dy_t (B,T,H,N);
//   ssm_scan_backward_rev: one block per (b,h) carries dS (P,N) from the last step back,
//     writing dx, ddt, this head's dB_t (B,T,H,N), and its sums of the weights' gradients
//     (B,H,3). The gradient of step t's log-decay, ⟨dS_t, exp(dt'_t a) S_{t−1}⟩, is the
//     reverse cumulative sum over s >= t of ⟨dy_s c_sᵀ, S_s⟩ − dt'_s·⟨dS_s, x_s b_sᵀ⟩
//     (Mamba-2's ddA_cumsum; runner-kernels' reference::ssm_scan_backward takes the same
//     route and is checked against the CPU kernel's direct one);
//   ssm_scan_group_sum: a group's dB or dC, its heads' in order; ssm_scan_weights: the
//     per-head gradients summed over the batch in order, added in. No atomics.
#include "common.cuh"

__device__ __forceinline__ float sigm(float v) { return 1.0f / (1.0f + expf(-v)); }

// ln(1 + e^v), v itself above 20 (as the CPU and PyTorch's F.softplus).
__device__ __forceinline__ float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }
// a = −exp(a_log), a_log clamped below expf's overflow (ln(FLT_MAX) ≈ 88.72): past it a is
// −∞ and the backward's 0·∞ is NaN. As the CPU kernels' A_LOG_MAX (cpu/ssm.rs says why);
// a NaN a_log stays NaN (fminf would hide it).
#define SSM_A_LOG_MAX 88.0f
__device__ __forceinline__ float decay_rate(float v) { return -expf(v > SSM_A_LOG_MAX ? SSM_A_LOG_MAX : v); }

// ---- causal conv1d ------------------------------------------------------------------

// u of element (row, ch), row = (b,t): the bias, then the taps in order; tap j reads
// position t − (K−1) + j, zero before the sequence.
__device__ __forceinline__ float conv_u(const float* x, const float* w, const float* bias, i64 row, i64 t, int c,
                                        int k, int ch) {
    float u = bias[ch];
    for (int j = 0; j < k; j++) {
        i64 src = t + j - (k - 1);
        if (src >= 0) u += w[(i64)ch * k + j] * x[(row - t + src) * c + ch];
    }
    return u;
}

extern "C" __global__ void causal_conv1d_forward(float* out, const float* x, const float* w, const float* bias,
                                                 i64 b, i64 t_len, int c, int k) {
    FOR_EACH(i, b * t_len * c) {
        int ch = (int)(i % c);
        i64 row = i / c;
        float u = conv_u(x, w, bias, row, row % t_len, c, k, ch);
        out[i] = u * sigm(u);
    }
}

// du = dout·σ(u)(1 + u(1 − σ(u))), u recomputed.
extern "C" __global__ void causal_conv1d_backward_du(float* du, const float* dout, const float* x, const float* w,
                                                     const float* bias, i64 b, i64 t_len, int c, int k) {
    FOR_EACH(i, b * t_len * c) {
        int ch = (int)(i % c);
        i64 row = i / c;
        float u = conv_u(x, w, bias, row, row % t_len, c, k, ch);
        float s = sigm(u);
        du[i] = dout[i] * s * (1.0f + u * (1.0f - s));
    }
}

// dx[b,t,c] = Σ_j w[c,j]·du[b, t+(K−1)−j, c] over the outputs inside the sequence.
extern "C" __global__ void causal_conv1d_backward_dx(float* dx, const float* du, const float* w, i64 b, i64 t_len,
                                                     int c, int k) {
    FOR_EACH(i, b * t_len * c) {
        int ch = (int)(i % c);
        i64 row = i / c, t = row % t_len;
        float acc = 0.0f;
        for (int j = 0; j < k; j++) {
            i64 dst = t + (k - 1) - j;
            if (dst < t_len) acc += w[(i64)ch * k + j] * du[(row - t + dst) * c + ch];
        }
        dx[i] = acc;
    }
}

// partial[chunk][c·K + j] = Σ over the chunk's rows (in order) of du[row, c]·x[row −
// (K−1) + j, c]; grid (ceil(C·K/256), chunks). column_finish adds the chunks into dw.
extern "C" __global__ void causal_conv1d_dw_partials(float* partial, const float* du, const float* x, i64 rows,
                                                     i64 t_len, int c, int k, i64 rows_per_chunk) {
    i64 col = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= (i64)c * k) return;
    int ch = (int)(col / k), j = (int)(col % k);
    i64 r0 = (i64)blockIdx.y * rows_per_chunk, r1 = r0 + rows_per_chunk;
    if (r1 > rows) r1 = rows;
    float acc = 0.0f;
    for (i64 r = r0; r < r1; r++) {
        i64 t = r % t_len, src = t + j - (k - 1);
        if (src >= 0) acc += du[r * c + ch] * x[(r - t + src) * c + ch];
    }
    partial[(i64)blockIdx.y * c * k + col] = acc;
}

// ---- SSD scan -------------------------------------------------------------------------

// The (b,t,h) row and the (b,t,g) row of step t of pair bh = (b,h).
__device__ __forceinline__ void ssm_rows(i64 bh, i64 t, i64 t_len, int h, int g, i64* row, i64* grow) {
    i64 bb = bh / h;
    int hh = (int)(bh % h);
    *row = (bb * t_len + t) * h + hh;
    *grow = (bb * t_len + t) * g + hh / (h / g);
}

// grid (B·H), block 32·warps, dynamic shared memory P·N floats.
extern "C" __global__ void ssm_scan_forward(float* y, float* states, const float* x, const float* dt, const float* bm,
                                            const float* cm, const float* a_log, const float* d,
                                            const float* dt_bias, i64 t_len, int h, int p, int g, int n, int chunk) {
    extern __shared__ float st[];
    i64 bh = blockIdx.x;
    int hh = (int)(bh % h);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    i64 chunks = (t_len + chunk - 1) / chunk;
    float a = decay_rate(a_log[hh]), dh = d[hh], bias = dt_bias[hh];
    for (int pi = warp; pi < p; pi += warps)
        for (int ni = lane; ni < n; ni += 32) st[(i64)pi * n + ni] = 0.0f;
    for (i64 t = 0; t < t_len; t++) {
        i64 row, grow;
        ssm_rows(bh, t, t_len, h, g, &row, &grow);
        float dtv = softplus(dt[row] + bias), decay = expf(dtv * a);
        const float *xs = x + row * p, *bs = bm + grow * n, *cs = cm + grow * n;
        float* saved = t % chunk == 0 ? states + (bh * chunks + t / chunk) * p * n : nullptr;
        for (int pi = warp; pi < p; pi += warps) {
            float* sr = st + (i64)pi * n;
            float xv = dtv * xs[pi], acc = 0.0f;
            for (int ni = lane; ni < n; ni += 32) {
                if (saved) saved[(i64)pi * n + ni] = sr[ni];
                float v = decay * sr[ni] + xv * bs[ni];
                sr[ni] = v;
                acc += v * cs[ni];
            }
            acc = warp_sum(acc);
            if (lane == 0) y[row * p + pi] = acc + dh * xs[pi];
        }
    }
}

// grid (B·H·chunks), dynamic shared memory P·N floats; thread per column n of S.
// dch (B,T,H,N): this head's S_tᵀ dy_t.
extern "C" __global__ void ssm_scan_backward_fwd(float* dch, const float* dy, const float* states, const float* x,
                                                 const float* dt, const float* bm, const float* a_log,
                                                 const float* dt_bias, i64 t_len, int h, int p, int g, int n,
                                                 int chunk) {
    extern __shared__ float st[];
    i64 chunks = (t_len + chunk - 1) / chunk;
    i64 bh = blockIdx.x / chunks, ci = blockIdx.x % chunks;
    int hh = (int)(bh % h);
    float a = decay_rate(a_log[hh]), bias = dt_bias[hh];
    const float* saved = states + (bh * chunks + ci) * p * n;
    for (int ni = threadIdx.x; ni < n; ni += blockDim.x)
        for (int pi = 0; pi < p; pi++) st[(i64)pi * n + ni] = saved[(i64)pi * n + ni];
    i64 t1 = (ci + 1) * chunk < t_len ? (ci + 1) * chunk : t_len;
    for (i64 t = ci * chunk; t < t1; t++) {
        i64 row, grow;
        ssm_rows(bh, t, t_len, h, g, &row, &grow);
        float dtv = softplus(dt[row] + bias), decay = expf(dtv * a);
        const float *xs = x + row * p, *bs = bm + grow * n, *dys = dy + row * p;
        for (int ni = threadIdx.x; ni < n; ni += blockDim.x) {
            float bn = bs[ni], acc = 0.0f;
            for (int pi = 0; pi < p; pi++) {
                float v = decay * st[(i64)pi * n + ni] + (dtv * xs[pi]) * bn;
                st[(i64)pi * n + ni] = v;
                acc += v * dys[pi];
            }
            dch[row * n + ni] = acc;
        }
    }
}

// grid (B·H), block 32·warps, dynamic shared memory P·N + warps·N + 32 floats: dS, the
// warps' partial dB rows, block_sum's scratch. dbh (B,T,H,N): this head's dB_t; wpart
// (B,H,3): this pair's d(a_log), d(d), d(dt_bias).
extern "C" __global__ void ssm_scan_backward_rev(float* dx, float* ddt, float* dbh, float* wpart, const float* dy,
                                                 const float* dch, const float* x, const float* dt, const float* bm,
                                                 const float* cm, const float* a_log, const float* d,
                                                 const float* dt_bias, i64 t_len, int h, int p, int g, int n) {
    extern __shared__ float sm[];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float* ds = sm;
    float* part = sm + (i64)p * n;
    float* scratch = part + warps * n;
    i64 bh = blockIdx.x;
    int hh = (int)(bh % h);
    float a = decay_rate(a_log[hh]), dh = d[hh], bias = dt_bias[hh];
    for (i64 e = threadIdx.x; e < (i64)p * n; e += blockDim.x) ds[e] = 0.0f;
    for (int e = threadIdx.x; e < warps * n; e += blockDim.x) part[e] = 0.0f;
    __syncthreads();
    // cum: the reverse cumulative sum (the current step's log-decay gradient); da, ddb:
    // the pair's d(a), d(dt_bias); dd_lane: lane 0's share of d(d).
    float cum = 0.0f, da = 0.0f, ddb = 0.0f, dd_lane = 0.0f;
    for (i64 t = t_len - 1; t >= 0; t--) {
        i64 row, grow;
        ssm_rows(bh, t, t_len, h, g, &row, &grow);
        float raw = dt[row] + bias;
        float dtv = softplus(raw), decay = expf(dtv * a);
        const float *xs = x + row * p, *bs = bm + grow * n, *cs = cm + grow * n, *dys = dy + row * p;
        float* pw = part + warp * n;
        float g1w = 0.0f;  // Σ over this warp's rows of x_p·(dS b)_p
        for (int pi = warp; pi < p; pi += warps) {
            float* dr = ds + (i64)pi * n;
            float dyp = dys[pi], xp = xs[pi], r = 0.0f;
            for (int ni = lane; ni < n; ni += 32) {
                float v = dr[ni] + dyp * cs[ni];
                r += v * bs[ni];
                pw[ni] += v * xp;
                dr[ni] = v * decay;
            }
            r = warp_sum(r);
            if (lane == 0) {
                dx[row * p + pi] = dh * dyp + dtv * r;
                dd_lane += dyp * xp;
            }
            g1w += xp * r;
        }
        float qv = 0.0f;
        for (int ni = threadIdx.x; ni < n; ni += blockDim.x) qv += cs[ni] * dch[row * n + ni];
        float q = block_sum(qv, scratch);
        float g1 = block_sum(lane == 0 ? g1w : 0.0f, scratch);
        // block_sum's barriers have ordered every warp's partial dB row before this.
        for (int ni = threadIdx.x; ni < n; ni += blockDim.x) {
            float acc = 0.0f;
            for (int w = 0; w < warps; w++) {
                acc += part[w * n + ni];
                part[w * n + ni] = 0.0f;
            }
            dbh[row * n + ni] = dtv * acc;
        }
        cum += q - dtv * g1;
        da += dtv * cum;
        float ddt_t = (g1 + a * cum) * sigm(raw);
        if (threadIdx.x == 0) ddt[row] = ddt_t;
        ddb += ddt_t;
        __syncthreads();
    }
    float dd = block_sum(dd_lane, scratch);
    if (threadIdx.x == 0) {
        wpart[bh * 3] = da * a;
        wpart[bh * 3 + 1] = dd;
        wpart[bh * 3 + 2] = ddb;
    }
}

// dst (B,T,G,N) = Σ over the heads of group g, in order, of per_head (B,T,H,N).
extern "C" __global__ void ssm_scan_group_sum(float* dst, const float* per_head, i64 bt, int h, int g, int n) {
    int hpg = h / g;
    FOR_EACH(i, bt * g * n) {
        int ni = (int)(i % n);
        i64 r = i / n;
        int gg = (int)(r % g);
        i64 row = r / g;
        float acc = 0.0f;
        for (int k = 0; k < hpg; k++) acc += per_head[(row * h + gg * hpg + k) * n + ni];
        dst[i] = acc;
    }
}

// da_log, dd, ddt_bias (H) += Σ over b, in order, of wpart (B,H,3).
extern "C" __global__ void ssm_scan_weights(float* da_log, float* dd, float* ddt_bias, const float* wpart, i64 b,
                                            int h) {
    FOR_EACH(hh, h) {
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f;
        for (i64 bb = 0; bb < b; bb++) {
            const float* w = wpart + (bb * h + hh) * 3;
            s0 += w[0];
            s1 += w[1];
            s2 += w[2];
        }
        da_log[hh] += s0;
        dd[hh] += s1;
        ddt_bias[hh] += s2;
    }
}
