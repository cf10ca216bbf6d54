// Shared helpers of the CUDA kernels: integer types, warp and block reductions, and the
// number formats (bf16, f16, OCP FP8) written with bit operations and plain PTX so the
// sources need no CUDA toolkit header: NVRTC compiles them as they are, on any machine
// with the NVRTC library (the backend prepends this file to every .cu it compiles).
//
// Every conversion rounds to nearest, ties to even, exactly as runner-kernels'
// cpu/precision.rs does, so a GPU run stores the same bits as a CPU run.

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#define FULL_MASK 0xffffffffu

// math.h's constants (NVRTC compiles without the toolkit's headers).
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
// `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : -INFINITY;
    return warp_max(v);
}

// Grid-stride loop over n elements.
#define FOR_EACH(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)blockDim.x * gridDim.x)

// ---- bf16 and f16 ------------------------------------------------------------------

__device__ __forceinline__ u16 f32_to_bf16(float x) {
    u32 b = __float_as_uint(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (u16)((b | 0x00400000u) >> 16);  // NaN, quieted
    b += 0x7fffu + ((b >> 16) & 1u);
    return (u16)(b >> 16);
}

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

__device__ __forceinline__ u16 f32_to_f16(float x) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float x;
    asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h));
    return x;
}

// ---- OCP FP8 (E4M3FN, E5M2) ----------------------------------------------------------
// fmt 0: E4M3 (3 mantissa bits, bias 7, max 448 = 0x7E, NaN 0x7F, no Inf)
// fmt 1: E5M2 (2 mantissa bits, bias 15, max 57344 = 0x7B, Inf 0x7C)

__device__ __forceinline__ float fp8_max(int fmt) { return fmt == 0 ? 448.0f : 57344.0f; }

__device__ __forceinline__ float pow2f(int e) { return __uint_as_float((u32)(e + 127) << 23); }

// y (a product or quotient of x) with a NaN carrying x's sign: a GPU's arithmetic
// returns its canonical, positive NaN where the CPU's keeps the operand's, and an FP8
// code carries the sign (0xFF against 0x7F for a -NaN).
__device__ __forceinline__ float keep_nan_sign(float y, float x) { return isnan(y) ? copysignf(y, x) : y; }

// RNE encode, rounding before the overflow check; overflow saturates to ±max when
// `saturate`, else NaN (E4M3) or ±Inf (E5M2). NaN stays NaN; the sign of zero is kept.
__device__ __forceinline__ u8 fp8_encode(float x, int fmt, bool saturate) {
    int mbits = fmt == 0 ? 3 : 2, bias = fmt == 0 ? 7 : 15;
    u8 max_code = fmt == 0 ? 0x7E : 0x7B, ovf_code = fmt == 0 ? 0x7F : 0x7C;
    u8 sign = (u8)((__float_as_uint(x) >> 24) & 0x80u);
    float a = fabsf(x);
    if (isnan(a)) return sign | 0x7F;
    u8 overflow = sign | (saturate ? max_code : ovf_code);
    if (isinf(a)) return overflow;
    if (a == 0.0f) return sign;
    int emin = 1 - bias;
    int e = (int)(__float_as_uint(a) >> 23) - 127;
    if (e < emin) e = emin;
    float scaled = a * pow2f(mbits - e);
    int n = (int)rintf(scaled);
    if (n == 0) return sign;
    if (n == (1 << (mbits + 1))) {
        n >>= 1;
        e += 1;
    }
    int field, mant;
    if (n < (1 << mbits)) {
        field = 0;
        mant = n;
    } else {
        field = e + bias;
        mant = n - (1 << mbits);
    }
    int code = (field << mbits) | mant;
    if (code > (int)max_code) return overflow;
    return sign | (u8)code;
}

__device__ __forceinline__ float fp8_decode(u8 b, int fmt) {
    int mbits = fmt == 0 ? 3 : 2, bias = fmt == 0 ? 7 : 15;
    bool neg = (b & 0x80) != 0;
    int field = (b & 0x7F) >> mbits, mant = b & ((1 << mbits) - 1);
    float mag;
    if (fmt == 0 && (b & 0x7F) == 0x7F) {
        mag = NAN;
    } else if (fmt == 1 && field == 31) {
        mag = mant == 0 ? INFINITY : NAN;
    } else if (field == 0) {
        mag = (float)mant * pow2f(1 - bias - mbits);
    } else {
        mag = (1.0f + (float)mant / (float)(1 << mbits)) * pow2f(field - bias);
    }
    return neg ? -mag : mag;
}

// Transformer Engine's current scale for a tensor of max |x| `amax`: fp8_max / amax, 1
// for amax 0 or non-finite, FLT_MAX when the quotient overflows.
__device__ __forceinline__ float fp8_current_scale(float amax, int fmt) {
    if (!isfinite(amax) || amax == 0.0f) return 1.0f;
    float s = fp8_max(fmt) / amax;
    return isfinite(s) ? s : 3.402823466e38f;
}

// |x| as an ordered integer, for atomicMax on non-negative floats.
__device__ __forceinline__ void atomic_max_abs(float* target, float v) {
    atomicMax((unsigned int*)target, __float_as_uint(fabsf(v)));
}

// ---- scaled quantisation (cpu/quant.rs) ---------------------------------------------
// Shared by quant.cu and the fused norm / activation + cast kernels. Element formats: 0
// E4M3, 1 E5M2, 2 E2M1. Statistics: stats[0] saturated, stats[1] underflowed, stats[2]
// non-finite (u64 counters), amax[0] max |x|; all zeroed by the caller.

struct QGrid {
    u32 mbits;
    float min_normal, sub_mul, sub_inv, max, overflow;
    u32 half_ulp, mask;
};

__device__ __forceinline__ QGrid qgrid(int fmt) {
    QGrid g;
    int emin;
    if (fmt == 0) { g.mbits = 3; emin = -6; g.max = 448.0f; g.overflow = NAN; }
    else if (fmt == 1) { g.mbits = 2; emin = -14; g.max = 57344.0f; g.overflow = INFINITY; }
    else { g.mbits = 1; emin = 0; g.max = 6.0f; g.overflow = 6.0f; }
    g.min_normal = pow2f(emin);
    g.sub_mul = pow2f((int)g.mbits - emin);
    g.sub_inv = pow2f(emin - (int)g.mbits);
    g.half_ulp = (1u << (22 - g.mbits)) - 1u;
    g.mask = ~((1u << (23 - g.mbits)) - 1u);
    return g;
}

__device__ __forceinline__ u32 qhash(u32 seed, u32 i) {
    u32 h = (i * 0x9E3779B1u) ^ seed;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    return h ^ (h >> 16);
}

// |y| onto the grid, sign restored, before the overflow check (cpu/quant.rs round_grid).
// NaN passes through unrounded: the GPU's canonical NaN 0x7FFFFFFF plus the rounding
// increment carries through the exponent into the sign bit, which read as -0.
__device__ __forceinline__ float qround(float y, const QGrid& g, int sr, u32 u) {
    float a = fabsf(y);
    u32 b = __float_as_uint(a);
    float r;
    if (!sr) {
        u32 lsb = (b >> (23 - g.mbits)) & 1u;
        float n = __uint_as_float((b + g.half_ulp + lsb) & g.mask);
        float s = __fsub_rn(__fadd_rn(__fmul_rn(a, g.sub_mul), 12582912.0f), 12582912.0f) * g.sub_inv;
        r = isnan(a) ? a : (a < g.min_normal ? s : n);
    } else {
        float n = __uint_as_float((b + (u >> (9 + g.mbits))) & g.mask);
        float frac = (float)(u >> 8) * (1.0f / 16777216.0f);
        float s = floorf(__fadd_rn(__fmul_rn(a, g.sub_mul), frac)) * g.sub_inv;
        r = isnan(a) ? a : (a < g.min_normal ? s : n);
    }
    return copysignf(r, y);
}

// Warp-aggregated statistics: one atomic per warp and counter.
__device__ __forceinline__ void qstats(u64* stats, float* amax, float a, int sat, int under, int nonfinite) {
    float m = warp_max(isnan(a) ? 0.0f : a);
    unsigned s = __popc(__ballot_sync(FULL_MASK, sat));
    unsigned u = __popc(__ballot_sync(FULL_MASK, under));
    unsigned f = __popc(__ballot_sync(FULL_MASK, nonfinite));
    if ((threadIdx.x & 31) == 0) {
        atomic_max_abs(amax, m);
        if (s) atomicAdd(&stats[0], (u64)s);
        if (u) atomicAdd(&stats[1], (u64)u);
        if (f) atomicAdd(&stats[2], (u64)f);
    }
}

// One element: y = x·enc, rounded, clipped, then ·dec (or /dec when `div`).
__device__ __forceinline__ float qdq(float x, float enc, float dec, int div, const QGrid& g, int saturate, int sr,
                                     u32 u, int* sat, int* under) {
    float y = keep_nan_sign(x * enc, x);
    float r = qround(y, g, sr, u);
    int over = fabsf(r) > g.max;
    *sat = over;
    r = over ? copysignf(saturate ? g.max : g.overflow, y) : r;
    *under = (r == 0.0f && x != 0.0f && isfinite(x));
    return keep_nan_sign(div ? r / dec : r * dec, x);
}

// Transformer Engine's scale from an amax: max / amax / 2^margin (1 for 0 or non-finite).
__device__ __forceinline__ float qtensor_scale(float amax, float max, int margin) {
    if (!isfinite(amax) || amax == 0.0f) return 1.0f;
    float s = max / amax / ldexpf(1.0f, margin);
    return isfinite(s) ? s : 3.402823466e38f;
}

// One element of a cast to FP8 codes at scale `s` (nearest even), `in` false for the lanes
// past the end: its code, the cast's statistics gathered warp by warp into stats and amax
// (every lane of the warp must call it, as qstats asks).
__device__ __forceinline__ u8 fp8_code_counted(float v, bool in, float s, const QGrid& g, int fmt, int saturate,
                                               u64* stats, float* amax) {
    int sat = 0, under = 0;
    // The scaled value on the grid (decode 1, multiplied): its code is exact.
    float r = qdq(v, s, 1.0f, 0, g, saturate, 0, 0u, &sat, &under);
    qstats(stats, amax, in ? fabsf(v) : 0.0f, in && sat, in && under, in && !isfinite(v));
    return fp8_encode(r, fmt, saturate != 0);
}

// An FP8 buffer's meta = [scale, 1/scale, amax, -]: the scale its codes were cast at.
__device__ __forceinline__ void fp8_meta_scale(float* meta, float s) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        meta[0] = s;
        meta[1] = 1.0f / s;
    }
}
