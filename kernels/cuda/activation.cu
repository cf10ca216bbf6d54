// MLP activations, forward beside backward (CPU twin: runner-kernels cpu/activation.rs):
// SwiGLU, GeGLU (fused gelu(gate)·up), GELU (tanh approximation), squared ReLU. The
// forwards save nothing; the backwards recompute the cheap nonlinearity.
//
// The *_quantize forwards fuse the FP8 cast of the output into the activation (the next
// GEMM's input) with a known scale, and record the output's amax on the fly
// (Transformer Engine's fused activation + cast): one pass over memory instead of three.
#include "common.cuh"

#define GELU_K 0.7978845608f
#define GELU_C 0.044715f

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

__device__ __forceinline__ float gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_C * x * x * x)));
}

__device__ __forceinline__ float gelu_grad(float x) {
    float th = tanhf(GELU_K * (x + GELU_C * x * x * x));
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
}

extern "C" __global__ void swiglu_forward(float* out, const float* gate, const float* up, i64 n) {
    FOR_EACH(i, n) out[i] = silu(gate[i]) * up[i];
}

extern "C" __global__ void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                           const float* up, i64 n) {
    FOR_EACH(i, n) {
        float g = gate[i], s = 1.0f / (1.0f + expf(-g));
        float d = dout[i];
        dup[i] = d * g * s;
        dgate[i] = d * up[i] * s * (1.0f + g * (1.0f - s));
    }
}

extern "C" __global__ void geglu_forward(float* out, const float* gate, const float* up, i64 n) {
    FOR_EACH(i, n) out[i] = gelu(gate[i]) * up[i];
}

extern "C" __global__ void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                          const float* up, i64 n) {
    FOR_EACH(i, n) {
        float g = gate[i], d = dout[i];
        dgate[i] = d * up[i] * gelu_grad(g);
        dup[i] = d * gelu(g);
    }
}

extern "C" __global__ void gelu_forward(float* out, const float* x, i64 n) {
    FOR_EACH(i, n) out[i] = gelu(x[i]);
}

extern "C" __global__ void gelu_backward(float* dx, const float* dout, const float* x, i64 n) {
    FOR_EACH(i, n) dx[i] = dout[i] * gelu_grad(x[i]);
}

extern "C" __global__ void squared_relu_forward(float* out, const float* x, i64 n) {
    FOR_EACH(i, n) {
        float r = x[i] > 0.0f ? x[i] : 0.0f;
        out[i] = r * r;
    }
}

extern "C" __global__ void squared_relu_backward(float* dx, const float* dout, const float* x, i64 n) {
    FOR_EACH(i, n) {
        float r = x[i] > 0.0f ? x[i] : 0.0f;
        dx[i] = 2.0f * r * dout[i];
    }
}

// out = fp8(silu(gate)·up · scale[0]); amax[0] = max |silu(gate)·up| (atomic, starts at
// the caller's value). fmt 0: E4M3, 1: E5M2; saturating.
extern "C" __global__ void swiglu_quantize(u8* out, float* amax, const float* scale, const float* gate,
                                           const float* up, i64 n, int fmt) {
    float s = scale[0], local = 0.0f;
    FOR_EACH(i, n) {
        float y = silu(gate[i]) * up[i];
        out[i] = fp8_encode(y * s, fmt, true);
        if (!isnan(y)) local = fmaxf(local, fabsf(y));
    }
    local = warp_max(local);
    if ((threadIdx.x & 31) == 0) atomic_max_abs(amax, local);
}
