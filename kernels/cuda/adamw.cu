// AdamW step, PyTorch `torch.optim.AdamW` semantics (CPU twin: runner-kernels
// cpu/adamw.rs): decoupled weight decay first, then the moments, then the bias-corrected
// update. The scalar hyper-parameter arithmetic (bias corrections, 1 − lr·wd) is done on
// the host in f64 and passed rounded once, as the CPU does.
#include "common.cuh"

extern "C" __global__ void adamw(float* param, const float* grad, float* m, float* v, i64 n, float decay,
                                 float w1, float w2, float beta2, float eps, float step_size, float bc2_sqrt) {
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
