// Flash-style attention, forward beside backward (CPU twin: runner-kernels
// cpu/attention.rs; FlashAttention-2, Dao 2023): grouped-query heads, causal and
// sliding-window masks on global positions (context parallelism), a value head dim that
// may differ from the query/key head dim. f32 throughout; the (T,T) score matrix is never
// stored: each block walks key tiles with an online softmax and saves lse = log Σ exp(s).
//
// Shapes: q (B,T,H,D), k (B,Tk,Hkv,D), v (B,Tk,Hkv,Dv), out (B,T,H,Dv), lse (B,H,T);
// Tk = T, or cp·T under context parallelism (K/V all-gathered over the cp group, rank
// order). D, Dv <= 256.
//
// Layout of the work: a warp is 32 lanes; in score phases lane j owns key j of a 32-key
// tile (one dot product each, rows in shared memory at an odd stride, d | 1 floats, so
// the 32 lanes reading one column each hit 32 different banks); in accumulation phases lane l owns dims l, l+32, ... of a row. Each block
// has 4 warps.
//
// Backward, in two deterministic kernels (no atomics): attention_backward_dq walks key
// tiles per query tile, as the forward; attention_backward_dkdv walks query tiles (and
// the query heads of its kv head) per key tile. Both rebuild P = exp(s − lse) and use
// delta = rowsum(dO∘O) from attention_backward_delta.
#include "common.cuh"

#define WARPS 4
#define TILE 32
#define MAXD 256
#define ROWS_PER_WARP 4
#define QROWS (WARPS * ROWS_PER_WARP)

struct Shape {
    i64 b, t, tk;
    int h, hkv, d, dv;
    int causal, window;  // window 0: none
    float scale;
    int cp, cp_rank;
};

__device__ __forceinline__ i64 local_position(int cp, int rank, i64 t, i64 i) {
    if (cp <= 1) return i;
    i64 c = t / 2;
    i64 chunk = i < c ? rank : 2 * cp - 1 - rank;
    return chunk * c + i % c;
}

// Global position of query row i (this rank's local rows) and of key row j (gathered).
__device__ __forceinline__ i64 q_pos(const Shape& s, i64 i) { return local_position(s.cp, s.cp_rank, s.t, i); }
__device__ __forceinline__ i64 k_pos(const Shape& s, i64 j) {
    if (s.cp <= 1) return j;
    return local_position(s.cp, (int)(j / s.t), s.t, j % s.t);
}

__device__ __forceinline__ bool visible(const Shape& s, i64 qp, i64 kp) {
    i64 lo = s.window > 0 ? qp + 1 - s.window : 0;
    if (lo < 0) lo = 0;
    i64 hi;
    if (s.causal) hi = qp + 1;
    else hi = s.window > 0 ? (qp + s.window < s.tk ? qp + s.window : s.tk) : s.tk;
    return kp >= lo && kp < hi;
}

// Whether any of a warp's query rows (positions qp, -1: past the end) sees key position
// kp (-1: past the end): the lane's vote on skipping a key tile.
__device__ __forceinline__ int sees_any(const Shape& s, const i64* qp, i64 kp) {
    int any = 0;
    for (int r = 0; r < ROWS_PER_WARP; r++) any |= qp[r] >= 0 && kp >= 0 && visible(s, qp[r], kp);
    return any;
}

// Element (b, row, head, dim) of a (B, rows, heads, dims) tensor.
__device__ __forceinline__ i64 at4(i64 b, i64 rows, i64 row, int heads, int head, int dims, int dim) {
    return ((b * rows + row) * heads + head) * (i64)dims + dim;
}

// Rows r0..r0+n of head `head` of a (B, rows, heads, dims) tensor into shared memory
// with an odd pitch of dims | 1 floats (against bank conflicts); rows past the end read zero.
__device__ __forceinline__ void load_rows(float* dst, const float* src, i64 b, i64 rows, i64 r0, int n, int heads,
                                          int head, int dims) {
    const int pitch = dims | 1;
    for (int idx = threadIdx.x; idx < n * dims; idx += blockDim.x) {
        int r = idx / dims, c = idx % dims;
        dst[r * pitch + c] = r0 + r < rows ? src[at4(b, rows, r0 + r, heads, head, dims, c)] : 0.0f;
    }
}

// ---- forward --------------------------------------------------------------------------
// grid (ceil(T/QROWS), H, B), block WARPS·32, dynamic shared memory
// (QROWS·(D|1) + TILE·(D|1) + TILE·(Dv|1)) floats.
extern "C" __global__ void attention_forward(float* out, float* lse, const float* q, const float* k,
                                             const float* v, Shape s) {
    extern __shared__ float smem[];
    const int dp = s.d | 1, vp = s.dv | 1;
    float* qs = smem;
    float* ks = qs + QROWS * dp;
    float* vs = ks + TILE * dp;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const i64 bi = blockIdx.z, q0 = (i64)blockIdx.x * QROWS;
    const int hi = blockIdx.y, kvh = hi / (s.h / s.hkv);

    load_rows(qs, q, bi, s.t, q0, QROWS, s.h, hi, s.d);
    float m[ROWS_PER_WARP], l[ROWS_PER_WARP], acc[ROWS_PER_WARP][MAXD / 32];
    i64 qp[ROWS_PER_WARP];
    for (int r = 0; r < ROWS_PER_WARP; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        for (int c = 0; c < MAXD / 32; c++) acc[r][c] = 0.0f;
        i64 row = q0 + warp * ROWS_PER_WARP + r;
        qp[r] = row < s.t ? q_pos(s, row) : -1;
    }
    for (i64 k0 = 0; k0 < s.tk; k0 += TILE) {
        const i64 kj = k0 + lane;
        const i64 kp = kj < s.tk ? k_pos(s, kj) : -1;
        // A key tile no row of the block sees (causal and window masks) is skipped by
        // every thread alike; the barrier also guards the tiles' reload.
        if (!__syncthreads_or(sees_any(s, qp, kp))) continue;
        load_rows(ks, k, bi, s.tk, k0, TILE, s.hkv, kvh, s.d);
        load_rows(vs, v, bi, s.tk, k0, TILE, s.hkv, kvh, s.dv);
        __syncthreads();
        for (int r = 0; r < ROWS_PER_WARP; r++) {
            if (qp[r] < 0) continue;
            const float* qr = qs + (warp * ROWS_PER_WARP + r) * dp;
            bool vis = kp >= 0 && visible(s, qp[r], kp);
            float sc = -INFINITY;
            if (vis) {
                float dot = 0.0f;
                for (int c = 0; c < s.d; c++) dot += qr[c] * ks[lane * dp + c];
                sc = dot * s.scale;
            }
            float mt = warp_max(sc);
            float mn = fmaxf(m[r], mt);
            if (mn == -INFINITY) continue;  // nothing visible yet
            float p = vis ? expf(sc - mn) : 0.0f;
            float corr = expf(m[r] - mn);
            l[r] = l[r] * corr + warp_sum(p);
            m[r] = mn;
            for (int c = 0; c < MAXD / 32; c++) acc[r][c] *= corr;
            for (int j = 0; j < TILE; j++) {
                float pj = __shfl_sync(FULL_MASK, p, j);
                if (pj == 0.0f) continue;
                for (int c = 0; c < MAXD / 32; c++) {
                    int dim = lane + 32 * c;
                    if (dim < s.dv) acc[r][c] += pj * vs[j * vp + dim];
                }
            }
        }
    }
    for (int r = 0; r < ROWS_PER_WARP; r++) {
        i64 row = q0 + warp * ROWS_PER_WARP + r;
        if (row >= s.t) continue;
        float inv = 1.0f / l[r];
        for (int c = 0; c < MAXD / 32; c++) {
            int dim = lane + 32 * c;
            if (dim < s.dv) out[at4(bi, s.t, row, s.h, hi, s.dv, dim)] = acc[r][c] * inv;
        }
        if (lane == 0) lse[(bi * s.h + hi) * s.t + row] = m[r] + logf(l[r]);
    }
}

// ---- backward -------------------------------------------------------------------------

// delta (B,H,T) = Σ_d dout·out, one warp per row.
extern "C" __global__ void attention_backward_delta(float* delta, const float* dout, const float* out, Shape s) {
    const int lane = threadIdx.x & 31;
    const i64 row = (i64)blockIdx.x * WARPS + (threadIdx.x >> 5);  // over (b, t, h)
    if (row >= s.b * s.t * s.h) return;
    float acc = 0.0f;
    for (int c = lane; c < s.dv; c += 32) acc += dout[row * s.dv + c] * out[row * s.dv + c];
    acc = warp_sum(acc);
    if (lane == 0) {
        i64 hh = row % s.h, bt = row / s.h, t = bt % s.t, bb = bt / s.t;
        delta[(bb * s.h + hh) * s.t + t] = acc;
    }
}

// dq = scale · Σ_j p_ij (dP_ij − delta_i) k_j, dP = dO·vᵀ. Same grid as the forward;
// shared memory (QROWS·(D|1) + QROWS·(Dv|1) + TILE·(D|1) + TILE·(Dv|1)) floats.
extern "C" __global__ void attention_backward_dq(float* dq, const float* dout, const float* q, const float* k,
                                                 const float* v, const float* lse, const float* delta, Shape s) {
    extern __shared__ float smem[];
    const int dp = s.d | 1, vp = s.dv | 1;
    float* qs = smem;
    float* gs = qs + QROWS * dp;
    float* ks = gs + QROWS * vp;
    float* vs = ks + TILE * dp;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const i64 bi = blockIdx.z, q0 = (i64)blockIdx.x * QROWS;
    const int hi = blockIdx.y, kvh = hi / (s.h / s.hkv);
    load_rows(qs, q, bi, s.t, q0, QROWS, s.h, hi, s.d);
    load_rows(gs, dout, bi, s.t, q0, QROWS, s.h, hi, s.dv);
    float acc[ROWS_PER_WARP][MAXD / 32], ls[ROWS_PER_WARP], dl[ROWS_PER_WARP];
    i64 qp[ROWS_PER_WARP];
    for (int r = 0; r < ROWS_PER_WARP; r++) {
        for (int c = 0; c < MAXD / 32; c++) acc[r][c] = 0.0f;
        i64 row = q0 + warp * ROWS_PER_WARP + r;
        qp[r] = row < s.t ? q_pos(s, row) : -1;
        ls[r] = row < s.t ? lse[(bi * s.h + hi) * s.t + row] : 0.0f;
        dl[r] = row < s.t ? delta[(bi * s.h + hi) * s.t + row] : 0.0f;
    }
    for (i64 k0 = 0; k0 < s.tk; k0 += TILE) {
        const i64 kj = k0 + lane;
        const i64 kp = kj < s.tk ? k_pos(s, kj) : -1;
        if (!__syncthreads_or(sees_any(s, qp, kp))) continue;  // as in the forward
        load_rows(ks, k, bi, s.tk, k0, TILE, s.hkv, kvh, s.d);
        load_rows(vs, v, bi, s.tk, k0, TILE, s.hkv, kvh, s.dv);
        __syncthreads();
        for (int r = 0; r < ROWS_PER_WARP; r++) {
            if (qp[r] < 0) continue;
            int lr = warp * ROWS_PER_WARP + r;
            float ds = 0.0f;
            if (kp >= 0 && visible(s, qp[r], kp)) {
                float sc = 0.0f, dpv = 0.0f;
                for (int c = 0; c < s.d; c++) sc += qs[lr * dp + c] * ks[lane * dp + c];
                for (int c = 0; c < s.dv; c++) dpv += gs[lr * vp + c] * vs[lane * vp + c];
                float p = expf(sc * s.scale - ls[r]);
                ds = p * (dpv - dl[r]);
            }
            for (int j = 0; j < TILE; j++) {
                float dj = __shfl_sync(FULL_MASK, ds, j);
                if (dj == 0.0f) continue;
                for (int c = 0; c < MAXD / 32; c++) {
                    int dim = lane + 32 * c;
                    if (dim < s.d) acc[r][c] += dj * ks[j * dp + dim];
                }
            }
        }
    }
    for (int r = 0; r < ROWS_PER_WARP; r++) {
        i64 row = q0 + warp * ROWS_PER_WARP + r;
        if (row >= s.t) continue;
        for (int c = 0; c < MAXD / 32; c++) {
            int dim = lane + 32 * c;
            if (dim < s.d) dq[at4(bi, s.t, row, s.h, hi, s.d, dim)] = acc[r][c] * s.scale;
        }
    }
}

#define KEYS_PER_WARP 4
#define KROWS (WARPS * KEYS_PER_WARP)

// dv_j = Σ_i p_ij dO_i, dk_j = scale · Σ_i p_ij (dP_ij − delta_i) q_i, over the query
// heads of kv head j's group and every query tile. grid (ceil(Tk/KROWS), Hkv, B);
// shared memory (TILE·(D|1) + TILE·(Dv|1) + KROWS·(D|1) + KROWS·(Dv|1)) floats. In the
// score phase lane i owns query i of the 32-query tile.
extern "C" __global__ void attention_backward_dkdv(float* dk, float* dv, const float* dout, const float* q,
                                                   const float* k, const float* v, const float* lse,
                                                   const float* delta, Shape s) {
    extern __shared__ float smem[];
    const int dp = s.d | 1, vp = s.dv | 1;
    float* qs = smem;
    float* gs = qs + TILE * dp;
    float* ks = gs + TILE * vp;
    float* vs = ks + KROWS * dp;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const i64 bi = blockIdx.z, k0 = (i64)blockIdx.x * KROWS;
    const int kvh = blockIdx.y, group = s.h / s.hkv;
    load_rows(ks, k, bi, s.tk, k0, KROWS, s.hkv, kvh, s.d);
    load_rows(vs, v, bi, s.tk, k0, KROWS, s.hkv, kvh, s.dv);
    float ak[KEYS_PER_WARP][MAXD / 32], av[KEYS_PER_WARP][MAXD / 32];
    i64 kp[KEYS_PER_WARP];
    for (int r = 0; r < KEYS_PER_WARP; r++) {
        for (int c = 0; c < MAXD / 32; c++) ak[r][c] = av[r][c] = 0.0f;
        i64 row = k0 + warp * KEYS_PER_WARP + r;
        kp[r] = row < s.tk ? k_pos(s, row) : -1;
    }
    for (int g = 0; g < group; g++) {
        const int hi = kvh * group + g;
        for (i64 q0 = 0; q0 < s.t; q0 += TILE) {
            const i64 qi = q0 + lane;
            const i64 qp = qi < s.t ? q_pos(s, qi) : -1;
            // A query tile that sees none of the block's keys is skipped by every thread
            // alike; the barrier also guards the tiles' reload.
            int any = 0;
            for (int r = 0; r < KEYS_PER_WARP; r++) any |= kp[r] >= 0 && qp >= 0 && visible(s, qp, kp[r]);
            if (!__syncthreads_or(any)) continue;
            load_rows(qs, q, bi, s.t, q0, TILE, s.h, hi, s.d);
            load_rows(gs, dout, bi, s.t, q0, TILE, s.h, hi, s.dv);
            __syncthreads();
            const float lq = qi < s.t ? lse[(bi * s.h + hi) * s.t + qi] : 0.0f;
            const float dq = qi < s.t ? delta[(bi * s.h + hi) * s.t + qi] : 0.0f;
            // Unrolled so the accumulators stay in registers (not unrolled, ak, av and kp
            // went to local memory: a load and a store around every multiply-add).
#pragma unroll
            for (int r = 0; r < KEYS_PER_WARP; r++) {
                if (kp[r] < 0) continue;
                int kr = warp * KEYS_PER_WARP + r;
                float p = 0.0f, ds = 0.0f;
                if (qp >= 0 && visible(s, qp, kp[r])) {
                    float sc = 0.0f, dpv = 0.0f;
                    for (int c = 0; c < s.d; c++) sc += qs[lane * dp + c] * ks[kr * dp + c];
                    for (int c = 0; c < s.dv; c++) dpv += gs[lane * vp + c] * vs[kr * vp + c];
                    p = expf(sc * s.scale - lq);
                    ds = p * (dpv - dq);
                }
                for (int i = 0; i < TILE; i++) {
                    float pi = __shfl_sync(FULL_MASK, p, i);
                    float di = __shfl_sync(FULL_MASK, ds, i);
                    if (pi == 0.0f && di == 0.0f) continue;
                    for (int c = 0; c < MAXD / 32; c++) {
                        int dim = lane + 32 * c;
                        if (dim < s.dv) av[r][c] += pi * gs[i * vp + dim];
                        if (dim < s.d) ak[r][c] += di * qs[i * dp + dim];
                    }
                }
            }
        }
    }
    for (int r = 0; r < KEYS_PER_WARP; r++) {
        i64 row = k0 + warp * KEYS_PER_WARP + r;
        if (row >= s.tk) continue;
        for (int c = 0; c < MAXD / 32; c++) {
            int dim = lane + 32 * c;
            if (dim < s.d) dk[at4(bi, s.tk, row, s.hkv, kvh, s.d, dim)] = ak[r][c] * s.scale;
            if (dim < s.dv) dv[at4(bi, s.tk, row, s.hkv, kvh, s.dv, dim)] = av[r][c];
        }
    }
}
