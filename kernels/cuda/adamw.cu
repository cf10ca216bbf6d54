// AdamW step, PyTorch `torch.optim.AdamW` semantics (CPU twin: runner-kernels
// cpu/adamw.rs): decoupled weight decay first, then the moments, then the bias-corrected
// update. The scalar hyper-parameter arithmetic (bias corrections, 1 − lr·wd) is done on
// the host in f64 and rounded once, as the CPU does, and read from device memory
// (decay, 1 - beta1, 1 - beta2, beta2, eps, step size, sqrt of the second bias
// correction, then the learning rate, which muon.cu reads), so that a recorded step (a
// CUDA graph) replays with each step's values.
#include "common.cuh"

extern "C" __global__ void adamw(float* param, const float* grad, float* m, float* v, i64 n, const float* s) {
    const float decay = s[0], w1 = s[1], w2 = s[2], beta2 = s[3], eps = s[4], step_size = s[5], bc2_sqrt = s[6];
    FOR_EACH(i, n) {
        float g = grad[i], p = param[i] * decay;
        float mi = m[i] + w1 * (g - m[i]);
        float vi = v[i] * beta2 + w2 * g * g;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        param[i] = p - step_size * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}
