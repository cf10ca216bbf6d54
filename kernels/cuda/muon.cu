// Muon's element-wise kernels whose scalars are read from device memory, so a Muon step
// needs no host read and a recorded step (a CUDA graph) replays it with each step's
// learning rate (CPU twin: runner-kernels cpu/muon.rs). The Newton–Schulz GEMMs are
// cuBLASLt calls, not kernels here.
#include "common.cuh"

// x <- x / (sqrt(max(sumsq[0], 0)) + eps): the Frobenius normalisation, sumsq = |x|_F^2
// from a 1 x 1 GEMM on the device. fmaxf takes a NaN sum as 0, as the CPU twin does.
extern "C" __global__ void scale_by_inverse_norm(float* x, const float* sumsq, float eps, i64 n) {
    const float r = 1.0f / (sqrtf(fmaxf(sumsq[0], 0.0f)) + eps);
    FOR_EACH(i, n) x[i] *= r;
}

// w <- w * decay + (lr * k) * o, decay and lr from AdamW's step scalars (words 0 and 7,
// adamw.cu's layout); k holds the sign and Moonlight's -0.2 * sqrt(max(m, n)).
extern "C" __global__ void muon_apply(float* w, const float* o, const float* s, float k, i64 n) {
    const float decay = s[0], step = s[7] * k;
    FOR_EACH(i, n) {
        float kept = w[i] * decay;
        float moved = step * o[i];
        w[i] = kept + moved;
    }
}
