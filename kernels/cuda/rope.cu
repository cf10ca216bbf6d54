// Rotary position embedding (CPU twin: runner-kernels cpu/rope.rs), half-split pairs:
// dims i and i + rot/2 of each head rotate by pos·θ^(−2i/rot); dims past rot_dim pass
// through. The backward is the inverse rotation (sign −1). Angles are computed in f64, as
// the CPU does, so both backends use the same cos/sin values to f32 rounding.
//
// Under context parallelism (cp > 1) row t of the T local rows is this rank's chunk
// (Megatron's load-balanced split: chunks rank and 2·cp−1−rank of T/2 rows each).
#include "common.cuh"

__device__ __forceinline__ i64 cp_position(int cp, int cp_rank, i64 t_len, i64 t) {
    if (cp <= 1) return t;
    i64 c = t_len / 2;
    i64 chunk = t < c ? cp_rank : 2 * cp - 1 - cp_rank;
    return chunk * c + t % c;
}

// x, out (B,T,H,D); sign +1 forward, −1 backward. One thread per element.
extern "C" __global__ void rope(float* out, const float* x, i64 b, i64 t_len, int h, int d, int rot_dim,
                                float theta, i64 pos_offset, int cp, int cp_rank, float sign) {
    int half = rot_dim / 2;
    FOR_EACH(idx, b * t_len * h * d) {
        int i = (int)(idx % d);
        i64 row = idx / d;  // (b, t, h)
        i64 t = (row / h) % t_len;
        if (i >= rot_dim) {
            out[idx] = x[idx];
            continue;
        }
        int f = i < half ? i : i - half;
        double pos = (double)(pos_offset + cp_position(cp, cp_rank, t_len, t));
        double inv = pow((double)theta, -(2.0 * f) / (double)rot_dim);
        double s, c;
        sincos(pos * inv, &s, &c);
        float cf = (float)c, sf = sign * (float)s;
        const float* xh = x + row * d;
        float x1 = xh[f], x2 = xh[f + half];
        out[idx] = i < half ? x1 * cf - x2 * sf : x2 * cf + x1 * sf;
    }
}
