// Number-format conversions (CPU twin: runner-kernels cpu/precision.rs and the CPU
// backend's casts): bf16 / f16 casts both ways, FP8 quantisation with per-tensor current
// scaling (amax on device, scale derived on device, no host round trip), dequantisation,
// the in-place storage emulation of round_to_storage (bf16, f16, FP8, MXFP8), and the
// byte transpose the FP8 GEMM layout needs.
//
// An FP8 buffer carries `meta`, 4 floats on the device: [scale, 1/scale, amax, 0];
// x ≈ decode(q) / scale, and 1/scale is what cuBLASLt's A/B scale pointers take.
#include "common.cuh"

extern "C" __global__ void f32_to_bf16_kernel(u16* out, const float* x, i64 n) {
    FOR_EACH(i, n) out[i] = f32_to_bf16(x[i]);
}
extern "C" __global__ void bf16_to_f32_kernel(float* out, const u16* x, i64 n) {
    FOR_EACH(i, n) out[i] = bf16_to_f32(x[i]);
}
extern "C" __global__ void f32_to_f16_kernel(u16* out, const float* x, i64 n) {
    FOR_EACH(i, n) out[i] = f32_to_f16(x[i]);
}
extern "C" __global__ void f16_to_f32_kernel(float* out, const u16* x, i64 n) {
    FOR_EACH(i, n) out[i] = f16_to_f32(x[i]);
}

// amax[0] = max(amax[0], max |x|), NaNs ignored (as f32::max does on the CPU).
extern "C" __global__ void amax_f32(float* amax, const float* x, i64 n) {
    float local = 0.0f;
    FOR_EACH(i, n) {
        float a = fabsf(x[i]);
        if (!isnan(a)) local = fmaxf(local, a);
    }
    local = warp_max(local);
    if ((threadIdx.x & 31) == 0) atomic_max_abs(amax, local);
}

// meta = [scale, 1/scale, amax, 0] from meta[2] (current scaling). One thread.
extern "C" __global__ void fp8_scale_from_amax(float* meta, int fmt) {
    float s = fp8_current_scale(meta[2], fmt);
    meta[0] = s;
    meta[1] = 1.0f / s;
}

extern "C" __global__ void fp8_quantize(u8* q, const float* x, const float* meta, i64 n, int fmt) {
    float s = meta[0];
    FOR_EACH(i, n) q[i] = fp8_encode(keep_nan_sign(x[i] * s, x[i]), fmt, true);
}

extern "C" __global__ void fp8_dequantize(float* out, const u8* q, const float* meta, i64 n, int fmt) {
    float s = meta[0];
    FOR_EACH(i, n) out[i] = fp8_decode(q[i], fmt) / s;
}

// ---- storage emulation in place (f32 buffers) ----------------------------------------

extern "C" __global__ void round_bf16(float* x, i64 n) {
    FOR_EACH(i, n) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}

extern "C" __global__ void round_f16(float* x, i64 n) {
    FOR_EACH(i, n) x[i] = f16_to_f32(f32_to_f16(x[i]));
}

// x = decode(encode(x·scale)) / scale with meta[0] (from amax_f32 + fp8_scale_from_amax).
extern "C" __global__ void round_fp8(float* x, const float* meta, i64 n, int fmt) {
    float s = meta[0];
    FOR_EACH(i, n) x[i] = keep_nan_sign(fp8_decode(fp8_encode(keep_nan_sign(x[i] * s, x[i]), fmt, true), fmt) / s, x[i]);
}

// The E8M0 block scale 2^ceil(log2(amax / 448)) (RCEIL), 1 for a zero or non-finite amax.
__device__ __forceinline__ float mx_scale_rceil(float amax) {
    if (!isfinite(amax) || amax == 0.0f) return 1.0f;
    float r = amax / 448.0f;
    u32 bits = __float_as_uint(r);
    int ex = (int)(bits >> 23) - 127;
    u32 mant = bits & 0x7fffffu;
    int e = ex == -127 ? -126 : (mant == 0 ? ex : ex + 1);
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return e >= -126 ? pow2f(e) : __uint_as_float(1u << 22);
}

// MXFP8 (E4M3 elements, one E8M0 scale per 32 elements of each row of `row` elements; a
// row's last block may be shorter). One warp per block of 32.
extern "C" __global__ void round_mxfp8(float* x, i64 rows, int row) {
    const int lane = threadIdx.x & 31;
    const i64 blocks_per_row = (row + 31) / 32;
    const i64 blk = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (blk >= rows * blocks_per_row) return;
    i64 r = blk / blocks_per_row;
    // 64-bit: a row within 31 of 2^31 puts its last block's lanes past an int.
    i64 c = (blk % blocks_per_row) * 32 + lane;
    bool in = c < row;
    float v = in ? x[r * row + c] : 0.0f;
    float a = fabsf(v);
    float amax = warp_max(isnan(a) ? 0.0f : a);
    float s = mx_scale_rceil(amax);
    if (in) x[r * row + c] = keep_nan_sign(fp8_decode(fp8_encode(keep_nan_sign(v / s, v), 0, true), 0) * s, v);
}

// dst (rows, k_pad) from 1-byte src (FP8 operands into cuBLASLt's TN layout): src is
// (rows, k), or (k, rows) when `transposed`; columns k..k_pad are zero (an FP8 GEMM's
// contraction padded to a multiple of 16). One block of 256 threads per 32 x 32 tile of
// dst (tiles row-major, ceil(k_pad / 32) per row of tiles): a transposed source goes
// through shared memory, so reads and writes are both along rows (coalesced), the
// 33-wide tile keeping the column reads off one bank.
extern "C" __global__ void pack_u8(u8* dst, const u8* src, i64 rows, i64 k, i64 k_pad, int transposed) {
    __shared__ u8 tile[32][33];
    const i64 tiles_c = (k_pad + 31) / 32;
    const i64 r0 = ((i64)blockIdx.x / tiles_c) * 32, c0 = ((i64)blockIdx.x % tiles_c) * 32;
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    if (transposed) {
        // src (k, rows): tile row j is source row c0 + j, read along rows r0..r0 + 32.
        for (int j = ty; j < 32; j += 8) {
            i64 c = c0 + j, r = r0 + tx;
            tile[j][tx] = (c < k && r < rows) ? src[c * rows + r] : (u8)0;
        }
        __syncthreads();
        for (int j = ty; j < 32; j += 8) {
            i64 r = r0 + j, c = c0 + tx;
            if (r < rows && c < k_pad) dst[r * k_pad + c] = tile[tx][j];
        }
    } else {
        for (int j = ty; j < 32; j += 8) {
            i64 r = r0 + j, c = c0 + tx;
            if (r < rows && c < k_pad) dst[r * k_pad + c] = c < k ? src[r * k + c] : (u8)0;
        }
    }
}
