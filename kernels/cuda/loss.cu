// Softmax cross-entropy over the vocabulary (CPU twin: runner-kernels cpu/loss.rs) and
// the three row statistics of Megatron's vocab-parallel cross-entropy. Row kernels: one
// block of 256 threads per row. Targets equal to IGNORE (u32::MAX) are skipped and left
// out of the mean. The mean is a fixed-order sum (cross_entropy_mean) so the loss is
// deterministic.
#include "common.cuh"

#define IGNORE 0xffffffffu

// The block's max m of row x (v elements) and the sum s of exp(x - m), in one pass (a
// vocabulary row is too large to stay in cache for a second): each thread keeps its
// running max and the sum of exp(x - max), rescaling the sum when the max grows; then
// the block's max, and the threads' sums rescaled to it. Every thread gets both. A row
// of -inf only gives (-inf, 0).
__device__ void row_online_softmax(const float* x, int v, float* scratch, float& m_out, float& s_out) {
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x; i < v; i += blockDim.x) {
        float xi = x[i];
        if (xi > m) {
            s = s * expf(m - xi) + 1.0f;
            m = xi;
        } else if (xi != -INFINITY) {  // a masked logit adds nothing, even before a finite max
            s += expf(xi - m);         // a NaN logit makes the sum NaN, as it should
        }
    }
    float mb = block_max(m, scratch);
    s_out = block_sum(m == -INFINITY ? s : s * expf(m - mb), scratch);
    m_out = mb;
}

// losses (N), lse (N) from logits (N, v).
extern "C" __global__ void cross_entropy_rows(float* losses, float* lse, const float* logits, const u32* targets,
                                              int v) {
    __shared__ float scratch[32];
    i64 row = blockIdx.x;
    const float* x = logits + row * v;
    float m, s;
    row_online_softmax(x, v, scratch, m, s);
    if (threadIdx.x == 0) {
        float z = m + logf(s);
        lse[row] = z;
        u32 t = targets[row];
        // A target past the vocabulary (the executor bounds its inputs; a direct call may
        // not) is a NaN loss, never a read past the row.
        losses[row] = t == IGNORE ? 0.0f : (t < (u32)v ? z - x[t] : __int_as_float(0x7fc00000));
    }
}

// out[0] = mean over non-ignored rows of losses (0 when none), summed in f64 in row order
// by one block: per-thread strided partials, then the partials in thread order.
extern "C" __global__ void cross_entropy_mean(float* out, const float* losses, const u32* targets, i64 n) {
    __shared__ double part[256];
    __shared__ long long cnt[256];
    double acc = 0.0;
    long long valid = 0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
        if (targets[i] != IGNORE) {
            acc += (double)losses[i];
            valid++;
        }
    }
    part[threadIdx.x] = acc;
    cnt[threadIdx.x] = valid;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        long long all = 0;
        for (int i = 0; i < blockDim.x; i++) {
            total += part[i];
            all += cnt[i];
        }
        out[0] = all == 0 ? 0.0f : (float)(total / (double)all);
    }
}

// Rows with a target (not ignored) into count[0], counted in integers by one block.
extern "C" __global__ void count_valid(float* count, const u32* targets, i64 n) {
    __shared__ long long cnt[256];
    long long c = 0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) c += targets[i] != IGNORE ? 1 : 0;
    cnt[threadIdx.x] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long all = 0;
        for (int i = 0; i < blockDim.x; i++) all += cnt[i];
        count[0] = (float)all;
    }
}

// dlogits (N, v) of the classes start..start+v: dloss · (exp(x − lse) − onehot) / valid,
// zero rows for ignored targets. dloss: one element, or null for zero; count from
// count_valid. A block per row (rows beyond the grid taken in turn): the row's target
// and lse are read once, and no element's row and column come from a 64-bit division.
extern "C" __global__ void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                                                  const u32* targets, const float* dloss, const float* count,
                                                  i64 rows, int v, i64 start) {
    float c = count[0];
    float scale = (c == 0.0f || dloss == 0) ? 0.0f : dloss[0] / c;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        u32 t = targets[r];
        float z = lse[r];
        const float* x = logits + r * v;
        float* d = dlogits + r * v;
        // The target's column in this shard, or -1 (ignored, or another shard's class).
        i64 tj = t == IGNORE ? -1 : (i64)t - start;
        for (int j = threadIdx.x; j < v; j += blockDim.x) {
            float g = t == IGNORE ? 0.0f : expf(x[j] - z) * scale;
            if (j == tj) g -= scale;
            d[j] = g;
        }
    }
}

// ---- vocab-parallel statistics ------------------------------------------------------

// max (N), sumexp (N) of a shard's rows (N, v) in one pass: the shard's own max, and the
// sum against it, which sumexp_rescale moves onto the max reduced over the shards.
extern "C" __global__ void row_max_sumexp(float* max, float* sumexp, const float* x, int v) {
    __shared__ float scratch[32];
    i64 row = blockIdx.x;
    float m, s;
    row_online_softmax(x + row * v, v, scratch, m, s);
    if (threadIdx.x == 0) {
        max[row] = m;
        sumexp[row] = s;
    }
}

// sumexp *= exp(local_max - max), for a shard of -inf only: 0.
extern "C" __global__ void sumexp_rescale(float* sumexp, const float* local_max, const float* max, i64 rows) {
    FOR_EACH(r, rows) {
        float l = local_max[r];
        sumexp[r] = l == -INFINITY ? 0.0f : sumexp[r] * expf(l - max[r]);
    }
}

extern "C" __global__ void target_logit(float* out, const float* x, const u32* targets, i64 rows, int v, i64 start) {
    FOR_EACH(r, rows) {
        u32 t = targets[r];
        i64 j = (i64)t - start;
        out[r] = (t != IGNORE && j >= 0 && j < v) ? x[r * v + j] : 0.0f;
    }
}

// lse = max + ln(sumexp); losses = lse − target logit (0 for ignored rows); the mean is
// cross_entropy_mean's.
extern "C" __global__ void cross_entropy_stats_rows(float* losses, float* lse, const float* max,
                                                    const float* sumexp, const float* tl, const u32* targets,
                                                    i64 rows) {
    FOR_EACH(r, rows) {
        float z = max[r] + logf(sumexp[r]);
        lse[r] = z;
        losses[r] = targets[r] == IGNORE ? 0.0f : z - tl[r];
    }
}
