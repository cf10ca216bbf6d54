// Scaled quantisation of GEMM operands, emulated in f32 (CPU twin: runner-kernels
// cpu/quant.rs, same rounding bit for bit): quantise-dequantise in place with per-tensor
// scales (given, or current from the amax), block scales (FP32 exact or power of two,
// E8M0, NVFP4's E4M3 block scales under an FP32 tensor scale), stochastic rounding from
// the same counter hash, 16/32-bit float rounding, and the random Hadamard transform.
//
// Element formats: 0 E4M3, 1 E5M2, 2 E2M1. Scale formats: 0 FP32, 1 E8M0, 2 E4M3.
// Scale rounding: 0 exact, 1 power of two down (OCP FLOOR), 2 power of two up (RCEIL).
// Statistics: stats[0] saturated, stats[1] underflowed, stats[2] non-finite (u64
// counters, zeroed by the caller), amax[0] max |x| (zeroed by the caller).
#include "common.cuh"

// Per tensor: `scale`, or (scale <= 0) current scaling from cur_amax[0] with `margin`.
extern "C" __global__ void quant_tensor(float* x, const float* cur_amax, u64* stats, float* amax, i64 n, int fmt,
                                        float scale, int margin, int saturate, int sr, u32 seed) {
    QGrid g = qgrid(fmt);
    float s = scale > 0.0f ? scale : qtensor_scale(cur_amax[0], g.max, margin);
    // Whole blocks step together, so every lane of a warp reaches the ballots.
    i64 stride = (i64)blockDim.x * gridDim.x;
    for (i64 base = (i64)blockIdx.x * blockDim.x; base < n; base += stride) {
        i64 i = base + threadIdx.x;
        bool in = i < n;
        float v = in ? x[i] : 0.0f;
        int sat = 0, under = 0;
        float o = qdq(v, s, s, 1, g, saturate || fmt == 2, sr, sr ? qhash(seed, (u32)i) : 0u, &sat, &under);
        if (in) x[i] = o;
        qstats(stats, amax, in ? fabsf(v) : 0.0f, in && sat, in && under, in && !isfinite(v));
    }
}

// quant_tensor straight into FP8 codes (fmt 0 E4M3, 1 E5M2, nearest even): q = the code of
// the rounded, clipped x·s, meta = [s, 1/s, amax] of the FP8 buffer (meta[2] and stats
// zeroed by the caller), the same counts as quant_tensor (cpu/quant.rs quantize_codes).
// One read of x where quant_tensor on a copy and fp8_quantize take three and a copy.
extern "C" __global__ void quant_tensor_codes(u8* q, float* meta, const float* x, const float* cur_amax, u64* stats,
                                              i64 n, int fmt, float scale, int margin, int saturate) {
    QGrid g = qgrid(fmt);
    float s = scale > 0.0f ? scale : qtensor_scale(cur_amax[0], g.max, margin);
    fp8_meta_scale(meta, s);
    i64 stride = (i64)blockDim.x * gridDim.x;
    for (i64 base = (i64)blockIdx.x * blockDim.x; base < n; base += stride) {
        i64 i = base + threadIdx.x;
        bool in = i < n;
        u8 c = fp8_code_counted(in ? x[i] : 0.0f, in, s, g, fmt, saturate, stats, meta + 2);
        if (in) q[i] = c;
    }
}

// Block amax: one thread per block of br x bc (shorter at the edges).
extern "C" __global__ void quant_block_amax(float* bamax, const float* x, i64 rows, i64 cols, int br, int bc) {
    i64 nbc = (cols + bc - 1) / bc, nbr = (rows + br - 1) / br;
    FOR_EACH(b, nbr * nbc) {
        i64 r0 = (b / nbc) * br, c0 = (b % nbc) * bc;
        float m = 0.0f;
        for (i64 r = r0; r < r0 + br && r < rows; ++r)
            for (i64 c = c0; c < c0 + bc && c < cols; ++c) {
                float a = fabsf(x[r * cols + c]);
                if (!isnan(a)) m = fmaxf(m, a);
            }
        bamax[b] = m;
    }
}

// (enc, dec) of a block whose amax is `a` (cpu/quant.rs block_scale).
__device__ __forceinline__ void qblock_scale(float a, float max, int emax, int scale_fmt, int scale_round, int two_level,
                                             float global, float* enc, float* dec) {
    if (!isfinite(a) || a == 0.0f) { *enc = 1.0f; *dec = 1.0f; return; }
    if (scale_fmt == 2) {
        float g = two_level ? global : 1.0f;
        if (g == 0.0f) { *enc = 1.0f; *dec = 1.0f; return; }
        float sb = fp8_decode(fp8_encode(a / max / g, 0, true), 0);
        float d = sb * g;
        // Held at FLT_MAX: a decode scale below 2.9e-39 has an infinite reciprocal.
        if (d > 0.0f && isfinite(d)) { *enc = fminf(1.0f / d, 3.402823466e38f); *dec = d; } else { *enc = 0.0f; *dec = 0.0f; }
        return;
    }
    int e;
    if (scale_round == 0) {
        float s = max / a;
        if (isfinite(s)) { *enc = s; *dec = 1.0f / s; } else { *enc = 3.402823466e38f; *dec = 1.0f / 3.402823466e38f; }
        return;
    } else if (scale_round == 2) {
        u32 bits = __float_as_uint(a / max);
        int ex = (int)(bits >> 23) - 127;
        u32 mant = bits & 0x7fffffu;
        e = ex == -127 ? -126 : (mant == 0 ? ex : ex + 1);
    } else {
        int ex = (int)(__float_as_uint(a) >> 23) - 127;
        e = (ex < -126 ? -126 : ex) - emax;
    }
    e = e < -126 ? -126 : (e > 126 ? 126 : e);
    *enc = pow2f(-e);
    *dec = pow2f(e);
}

// Per element with its block's scale; `tamax` the tensor amax (NVFP4's global scale).
extern "C" __global__ void quant_blocks(float* x, const float* bamax, const float* tamax, u64* stats, float* amax,
                                        i64 rows, i64 cols, int br, int bc, int fmt, int scale_fmt, int scale_round,
                                        int two_level, int saturate, int sr, u32 seed) {
    QGrid g = qgrid(fmt);
    int emax = fmt == 0 ? 8 : (fmt == 1 ? 15 : 2);
    // cpu/quant.rs tensor_scale_of_blocks: 1 for an amax of 0 or not finite (TE's rule).
    float ta = tamax[0];
    float global = two_level && isfinite(ta) && ta > 0.0f ? ta / (448.0f * g.max) : 1.0f;
    i64 n = rows * cols, nbc = (cols + bc - 1) / bc;
    // Whole blocks step together, so every lane of a warp reaches the ballots.
    i64 stride = (i64)blockDim.x * gridDim.x;
    for (i64 base = (i64)blockIdx.x * blockDim.x; base < n; base += stride) {
        i64 i = base + threadIdx.x;
        bool in = i < n;
        float v = 0.0f, o = 0.0f;
        int sat = 0, under = 0;
        if (in) {
            i64 r = i / cols, c = i % cols;
            float enc, dec;
            qblock_scale(bamax[(r / br) * nbc + c / bc], g.max, emax, scale_fmt, scale_round, two_level, global, &enc, &dec);
            v = x[i];
            o = qdq(v, enc, dec, 0, g, saturate || fmt == 2, sr, sr ? qhash(seed, (u32)i) : 0u, &sat, &under);
            x[i] = o;
        }
        qstats(stats, amax, in ? fabsf(v) : 0.0f, in && sat, in && under, in && !isfinite(v));
    }
}

// Round to bf16 (kind 0), f16 (kind 1) or keep f32 (kind 2), with the statistics.
extern "C" __global__ void quant_float(float* x, u64* stats, float* amax, i64 n, int kind) {
    // Whole blocks step together, so every lane of a warp reaches the ballots.
    i64 stride = (i64)blockDim.x * gridDim.x;
    for (i64 base = (i64)blockIdx.x * blockDim.x; base < n; base += stride) {
        i64 i = base + threadIdx.x;
        bool in = i < n;
        float v = in ? x[i] : 0.0f;
        float o = kind == 0 ? bf16_to_f32(f32_to_bf16(v)) : (kind == 1 ? f16_to_f32(f32_to_f16(v)) : v);
        if (in) x[i] = o;
        int sat = in && isinf(o) && !isinf(v), under = in && o == 0.0f && v != 0.0f && !isnan(v);
        qstats(stats, amax, in ? fabsf(v) : 0.0f, sat, under, in && !isfinite(v));
    }
}

// The random Hadamard transform along rows in groups of h (<= 256): one thread per
// (group, column); a last group shorter than h is left alone.
extern "C" __global__ void hadamard_rows(float* x, i64 rows, i64 cols, int h, u32 seed) {
    float v[256];
    i64 groups = rows / h;
    float norm = 1.0f / sqrtf((float)h);  // correctly rounded, as the CPU's (rsqrtf is approximate)
    FOR_EACH(t, groups * cols) {
        i64 g0 = (t / cols) * h, c = t % cols;
        for (int i = 0; i < h; ++i) {
            float s = (qhash(seed, (u32)i) & 1u) == 0u ? 1.0f : -1.0f;
            v[i] = x[(g0 + i) * cols + c] * (s * norm);
        }
        for (int len = 1; len < h; len <<= 1)
            for (int st = 0; st < h; st += 2 * len)
                for (int i = st; i < st + len; ++i) {
                    float a = v[i], b = v[i + len];
                    v[i] = a + b;
                    v[i + len] = a - b;
                }
        for (int i = 0; i < h; ++i) x[(g0 + i) * cols + c] = v[i];
    }
}
