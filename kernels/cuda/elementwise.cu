// Element-wise arithmetic and layout kernels: accumulation, scaling, residual add, bias
// and its gradient, concat with broadcast leading axes, and the outer-axis transpose
// the collectives' rank-major layouts need. CPU twins: runner-exec's cpu.rs and
// runner-kernels' activation.rs (add).
#include "common.cuh"

extern "C" __global__ void scale_f32(float* x, float s, i64 n) {
    FOR_EACH(i, n) x[i] *= s;
}

extern "C" __global__ void add_assign_f32(float* dst, const float* src, i64 n) {
    FOR_EACH(i, n) dst[i] += src[i];
}

extern "C" __global__ void add_forward(float* out, const float* a, const float* b, i64 n) {
    FOR_EACH(i, n) out[i] = a[i] + b[i];
}

// out (rows, c) += bias (c) on every row.
extern "C" __global__ void add_bias(float* out, const float* bias, i64 rows, int c) {
    FOR_EACH(i, rows * c) out[i] += bias[i % c];
}

// The bias gradient (column sums) is norm.cu's column_partials, mode 0.

// dst (b, a, c) <- src (a, b, c), for 4-, 2- and 1-byte elements.
template <typename T>
__device__ void transpose_outer(T* dst, const T* src, i64 a, i64 b, i64 c) {
    FOR_EACH(idx, a * b * c) {
        i64 k = idx % c, ij = idx / c;
        i64 i = ij / b, j = ij % b;
        dst[(j * a + i) * c + k] = src[idx];
    }
}
extern "C" __global__ void transpose_outer_u32(u32* dst, const u32* src, i64 a, i64 b, i64 c) {
    transpose_outer(dst, src, a, b, c);
}
extern "C" __global__ void transpose_outer_u16(u16* dst, const u16* src, i64 a, i64 b, i64 c) {
    transpose_outer(dst, src, a, b, c);
}
extern "C" __global__ void transpose_outer_u8(u8* dst, const u8* src, i64 a, i64 b, i64 c) {
    transpose_outer(dst, src, a, b, c);
}

// Row index into a source whose leading axes broadcast against the output's. `lead`
// holds, for each leading axis, the output's size and the source's (1 or equal), rank
// axes of it, innermost last.
__device__ __forceinline__ i64 broadcast_row(const i64* out_lead, const i64* src_lead, int rank, i64 row) {
    i64 r = row, idx = 0, stride = 1;
    for (int ax = rank - 1; ax >= 0; ax--) {
        i64 d = out_lead[ax], i = r % d;
        r /= d;
        i64 s = src_lead[ax];
        if (s != 1) idx += i * stride;
        stride *= s;
    }
    return idx;
}

// out (rows, la + lb) = [a row | b row]; `shapes` packs the leading axes of out, a, b
// (rank each).
extern "C" __global__ void concat_forward(float* out, const float* a, const float* b, const i64* shapes,
                                          int rank, i64 rows, int la, int lb) {
    int lo = la + lb;
    FOR_EACH(i, rows * lo) {
        i64 row = i / lo;
        int col = (int)(i % lo);
        if (col < la) {
            out[i] = a[broadcast_row(shapes, shapes + rank, rank, row) * la + col];
        } else {
            out[i] = b[broadcast_row(shapes, shapes + 2 * rank, rank, row) * lb + col - la];
        }
    }
}

// da / db add into; a broadcast input's row sums the gradient of every output row that
// read it, in ascending output row order (as the CPU does): the output rows of source
// row rs take rs's index on every axis the source keeps and every index on the axes it
// broadcasts, enumerated row-major. `which` is 1 for a, 2 for b.
extern "C" __global__ void concat_backward(float* dx, const float* dout, const i64* shapes, int rank,
                                           int which, i64 rows_src, int lx, int col0, int lo) {
    const i64* out_lead = shapes;
    const i64* src_lead = shapes + which * rank;
    i64 copies = 1;
    for (int ax = 0; ax < rank; ax++)
        if (src_lead[ax] == 1) copies *= out_lead[ax];
    FOR_EACH(i, rows_src * lx) {
        i64 rs = i / lx;
        int col = (int)(i % lx);
        float acc = 0.0f;
        for (i64 k = 0; k < copies; k++) {
            // Compose the output row from rs (kept axes) and k (broadcast axes).
            i64 rem_s = rs, rem_k = k, row = 0, stride = 1;
            for (int ax = rank - 1; ax >= 0; ax--) {
                i64 d = out_lead[ax], idx;
                if (src_lead[ax] == 1) {
                    idx = rem_k % d;
                    rem_k /= d;
                } else {
                    idx = rem_s % d;
                    rem_s /= d;
                }
                row += idx * stride;
                stride *= d;
            }
            acc += dout[row * lo + col0 + col];
        }
        dx[i] += acc;
    }
}
