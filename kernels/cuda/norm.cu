// RMSNorm and LayerNorm, forward beside backward (CPU twin: runner-kernels cpu/norm.rs).
//
// One block per row for the row-wise work (statistics, dx); the weight gradients sum over
// all rows in two stages (per-chunk column sums, then the chunks in order), so dw and db
// are deterministic (no atomics). Launch the row kernels with 256 threads.
//
// rmsnorm_forward_codes fuses the FP8 cast of the normalised output (the next GEMM's
// input) at a known scale, with the cast's statistics: norm + cast in one pass.
#include "common.cuh"

// out = x · rstd · w, rstd = 1/sqrt(mean(x²) + eps); one block per row.
extern "C" __global__ void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int c,
                                           float eps) {
    __shared__ float scratch[32];
    i64 row = blockIdx.x;
    const float* xr = x + row * c;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < c; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, scratch);
    float r = rsqrtf(ss / c + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int i = threadIdx.x; i < c; i += blockDim.x) out[row * c + i] = xr[i] * r * w[i];
}

// rmsnorm_forward whose output also lands as FP8 codes (`fmt` 0 E4M3, 1 E5M2, nearest
// even) at the given `scale` (delayed scaling: known before the norm runs), with the
// statistics quant_tensor_codes keeps (meta = [scale, 1/scale, amax], meta[2] and stats
// zeroed by the caller): norm + cast in one pass, the cast reading no f32 tensor back.
extern "C" __global__ void rmsnorm_forward_codes(float* out, float* rstd, u8* q, float* meta, u64* stats,
                                                 const float* x, const float* w, int c, float eps, int fmt,
                                                 float scale, int saturate) {
    __shared__ float scratch[32];
    i64 row = blockIdx.x;
    const float* xr = x + row * c;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < c; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, scratch);
    float r = rsqrtf(ss / c + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    fp8_meta_scale(meta, scale);
    QGrid g = qgrid(fmt);
    // Whole warps step together, so every lane reaches the ballots of qstats.
    for (int base = 0; base < c; base += blockDim.x) {
        int i = base + threadIdx.x;
        bool in = i < c;
        float y = in ? xr[i] * r * w[i] : 0.0f;
        u8 code = fp8_code_counted(y, in, scale, g, fmt, saturate, stats, meta + 2);
        if (in) {
            out[row * c + i] = y;
            q[row * c + i] = code;
        }
    }
}

// dx = r·(dout∘w) − r³·mean(dout∘w∘x)·x, overwritten; one block per row.
extern "C" __global__ void rmsnorm_backward_dx(float* dx, const float* dout, const float* x, const float* w,
                                               const float* rstd, int c) {
    __shared__ float scratch[32];
    i64 row = blockIdx.x;
    const float *xr = x + row * c, *g = dout + row * c;
    float r = rstd[row], d = 0.0f;
    for (int i = threadIdx.x; i < c; i += blockDim.x) d += g[i] * w[i] * xr[i];
    d = block_sum(d, scratch);
    float k = r * r * r * d / c;
    for (int i = threadIdx.x; i < c; i += blockDim.x) dx[row * c + i] = r * g[i] * w[i] - k * xr[i];
}

// out = (x − mean)·rstd·w + b, two-pass variance; one block per row.
extern "C" __global__ void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                                             const float* b, int c, float eps) {
    __shared__ float scratch[32];
    i64 row = blockIdx.x;
    const float* xr = x + row * c;
    float s = 0.0f;
    for (int i = threadIdx.x; i < c; i += blockDim.x) s += xr[i];
    float m = block_sum(s, scratch) / c;
    float v = 0.0f;
    for (int i = threadIdx.x; i < c; i += blockDim.x) {
        float d = xr[i] - m;
        v += d * d;
    }
    float r = rsqrtf(block_sum(v, scratch) / c + eps);
    if (threadIdx.x == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
    for (int i = threadIdx.x; i < c; i += blockDim.x) out[row * c + i] = (xr[i] - m) * r * w[i] + b[i];
}

// dx = r·(g∘w − mean(g∘w) − n̂·mean(g∘w∘n̂)), n̂ = (x − mean)·r; one block per row.
extern "C" __global__ void layernorm_backward_dx(float* dx, const float* dout, const float* x, const float* w,
                                                 const float* mean, const float* rstd, int c) {
    __shared__ float scratch[32];
    i64 row = blockIdx.x;
    const float *xr = x + row * c, *g = dout + row * c;
    float m = mean[row], r = rstd[row], sg = 0.0f, sgn = 0.0f;
    for (int i = threadIdx.x; i < c; i += blockDim.x) {
        float gw = g[i] * w[i];
        sg += gw;
        sgn += gw * (xr[i] - m) * r;
    }
    float mg = block_sum(sg, scratch) / c;
    float mgn = block_sum(sgn, scratch) / c;
    for (int i = threadIdx.x; i < c; i += blockDim.x) {
        float nh = (xr[i] - m) * r;
        dx[row * c + i] = r * (g[i] * w[i] - mg - nh * mgn);
    }
}

// Weight and bias gradients: column sums over rows, in two deterministic stages.
// column_partials: partial[chunk][j] = Σ over the chunk's rows (in order) of
//   mode 0: dout                      (bias, LayerNorm db)
//   mode 1: dout·x·rstd[r]            (RMSNorm dw)
//   mode 2: dout·(x − mean[r])·rstd[r] (LayerNorm dw)
// grid (ceil(c/256), chunks); column_finish adds the chunks in order into dst.
extern "C" __global__ void column_partials(float* partial, const float* dout, const float* x, const float* mean,
                                           const float* rstd, i64 rows, int c, i64 rows_per_chunk, int mode) {
    // 64-bit: with c near 2^31 the last block's index passes an int.
    i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c) return;
    i64 r0 = (i64)blockIdx.y * rows_per_chunk, r1 = r0 + rows_per_chunk;
    if (r1 > rows) r1 = rows;
    float acc = 0.0f;
    for (i64 r = r0; r < r1; r++) {
        float g = dout[r * c + j];
        if (mode == 1) g *= x[r * c + j] * rstd[r];
        else if (mode == 2) g *= (x[r * c + j] - mean[r]) * rstd[r];
        acc += g;
    }
    partial[(i64)blockIdx.y * c + j] = acc;
}

extern "C" __global__ void column_finish(float* dst, const float* partial, int chunks, int c) {
    i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= c) return;
    float acc = 0.0f;
    for (int k = 0; k < chunks; k++) acc += partial[(i64)k * c + j];
    dst[j] += acc;
}
