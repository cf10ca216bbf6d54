// Mixture-of-experts routing (CPU twin: runner-kernels cpu/moe.rs): top-k router
// (softmax or sigmoid scores, ties to the lower index, optional renormalisation of the
// selected weights), token dispatch into expert-sorted rows and the weighted combine
// back, each with its backward. The grouped expert GEMMs are cuBLASLt calls per expert
// (the backend's gemm.rs). A routing plan is `order` (sorted row → slot token·k + j) and
// its inverse `inv` (slot → sorted row); the backend builds it from the router's indices.
#include "common.cuh"

// One thread per token: probs (N, e), indices (N, k), weights (N, k). mode 0 softmax,
// 1 sigmoid.
extern "C" __global__ void router_forward(float* weights, u32* indices, float* probs, const float* logits,
                                          i64 n, int e, int k, int mode, int normalize) {
    FOR_EACH(t, n) {
        const float* x = logits + t * e;
        float* p = probs + t * e;
        if (mode == 0) {
            float m = -INFINITY, s = 0.0f;
            for (int j = 0; j < e; j++) m = fmaxf(m, x[j]);
            for (int j = 0; j < e; j++) {
                p[j] = expf(x[j] - m);
                s += p[j];
            }
            float inv = 1.0f / s;
            for (int j = 0; j < e; j++) p[j] *= inv;
        } else {
            for (int j = 0; j < e; j++) p[j] = 1.0f / (1.0f + expf(-x[j]));
        }
        // k passes: the best expert not yet taken, lower index on ties (taken ones are
        // marked in the output indices).
        float wsum = 0.0f;
        for (int slot = 0; slot < k; slot++) {
            int best = -1;
            for (int j = 0; j < e; j++) {
                bool taken = false;
                for (int q = 0; q < slot; q++) taken |= indices[t * k + q] == (u32)j;
                if (taken) continue;
                if (best < 0 || p[j] > p[best]) best = j;
            }
            indices[t * k + slot] = (u32)best;
            weights[t * k + slot] = p[best];
            wsum += p[best];
        }
        if (normalize && wsum > 0.0f)
            for (int slot = 0; slot < k; slot++) weights[t * k + slot] /= wsum;
    }
}

// dlogits (N, e), overwritten, from dweights (N, k), the saved probs and indices.
extern "C" __global__ void router_backward(float* dlogits, const float* dweights, const float* probs,
                                           const u32* indices, i64 n, int e, int k, int mode, int normalize) {
    FOR_EACH(t, n) {
        float* dl = dlogits + t * e;
        const float* p = probs + t * e;
        const float* dw = dweights + t * k;
        const u32* idx = indices + t * k;
        for (int j = 0; j < e; j++) dl[j] = 0.0f;
        float s = 0.0f;
        for (int a = 0; a < k; a++) s += p[idx[a]];
        if (normalize && s > 0.0f) {
            float dot_ww = 0.0f;
            for (int a = 0; a < k; a++) dot_ww += dw[a] * p[idx[a]] / s;
            for (int a = 0; a < k; a++) dl[idx[a]] += (dw[a] - dot_ww) / s;
        } else {
            for (int a = 0; a < k; a++) dl[idx[a]] += dw[a];
        }
        if (mode == 0) {
            float pd = 0.0f;
            for (int j = 0; j < e; j++) pd += p[j] * dl[j];
            for (int j = 0; j < e; j++) dl[j] = p[j] * (dl[j] - pd);
        } else {
            for (int j = 0; j < e; j++) dl[j] *= p[j] * (1.0f - p[j]);
        }
    }
}

// x_sorted (N·k, c): sorted row r is a copy of token order[r] / k.
extern "C" __global__ void dispatch_forward(float* x_sorted, const float* x, const u32* order, i64 rows, int c,
                                            int k) {
    FOR_EACH(i, rows * c) {
        i64 r = i / c;
        x_sorted[i] = x[(i64)(order[r] / k) * c + i % c];
    }
}

// dx (N, c) = Σ_j dx_sorted[inv[t·k + j]], overwritten.
extern "C" __global__ void dispatch_backward(float* dx, const float* dx_sorted, const u32* inv, i64 n, int c,
                                             int k) {
    FOR_EACH(i, n * c) {
        i64 t = i / c;
        int col = (int)(i % c);
        float acc = 0.0f;
        for (int j = 0; j < k; j++) acc += dx_sorted[(i64)inv[t * k + j] * c + col];
        dx[i] = acc;
    }
}

// out (N, c) = Σ_j weights[t·k + j] · y_sorted[inv[t·k + j]], overwritten.
extern "C" __global__ void combine_forward(float* out, const float* y_sorted, const float* weights, const u32* inv,
                                           i64 n, int c, int k) {
    FOR_EACH(i, n * c) {
        i64 t = i / c;
        int col = (int)(i % c);
        float acc = 0.0f;
        for (int j = 0; j < k; j++) acc += weights[t * k + j] * y_sorted[(i64)inv[t * k + j] * c + col];
        out[i] = acc;
    }
}

// dy_sorted (N·k, c) = weights[slot] · dout[token] (slot = order[row]).
extern "C" __global__ void combine_backward_dy(float* dy_sorted, const float* dout, const float* weights,
                                               const u32* order, i64 rows, int c, int k) {
    FOR_EACH(i, rows * c) {
        i64 r = i / c;
        u32 slot = order[r];
        dy_sorted[i] = weights[slot] * dout[(i64)(slot / k) * c + i % c];
    }
}

// dweights (N·k) = dout[token] · y_sorted[inv[slot]]; one warp per slot.
extern "C" __global__ void combine_backward_dw(float* dweights, const float* dout, const float* y_sorted,
                                               const u32* inv, i64 slots, int c, int k) {
    const int lane = threadIdx.x & 31;
    const i64 slot = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (slot >= slots) return;
    const float* d = dout + (slot / k) * c;
    const float* y = y_sorted + (i64)inv[slot] * c;
    float acc = 0.0f;
    for (int i = lane; i < c; i += 32) acc += d[i] * y[i];
    acc = warp_sum(acc);
    if (lane == 0) dweights[slot] = acc;
}
