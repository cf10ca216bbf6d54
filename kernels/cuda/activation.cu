// MLP activations, forward beside backward (CPU twin: runner-kernels cpu/activation.rs):
// SwiGLU, GeGLU (fused gelu(gate)·up), GELU (tanh approximation), squared ReLU. The
// forwards save nothing; the backwards recompute the cheap nonlinearity.
//
// activation_forward_codes fuses the FP8 cast of the output (the next GEMM's input) at a
// known scale into any of them, with the cast's statistics on the fly (Transformer
// Engine's fused activation + cast): the cast reads no f32 tensor back.
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

// An MLP activation's forward whose output also lands as FP8 codes at the given `scale`
// (delayed scaling), with quant_tensor_codes' statistics (meta = [scale, 1/scale, amax],
// meta[2] and stats zeroed by the caller): activation + cast in one pass. `act`: 0
// SwiGLU silu(a)·b, 1 GeGLU gelu(a)·b, 2 GELU gelu(a), 3 squared ReLU relu(a)² (b unused
// for the last two), each as its forward kernel above computes it.
extern "C" __global__ void activation_forward_codes(float* out, u8* q, float* meta, u64* stats, const float* a,
                                                    const float* b, i64 n, int act, int fmt, float scale,
                                                    int saturate) {
    QGrid g = qgrid(fmt);
    fp8_meta_scale(meta, scale);
    i64 stride = (i64)blockDim.x * gridDim.x;
    for (i64 base = (i64)blockIdx.x * blockDim.x; base < n; base += stride) {
        i64 i = base + threadIdx.x;
        bool in = i < n;
        float y = 0.0f;
        if (in) {
            if (act == 0) y = silu(a[i]) * b[i];
            else if (act == 1) y = gelu(a[i]) * b[i];
            else if (act == 2) y = gelu(a[i]);
            else {
                float r = a[i] > 0.0f ? a[i] : 0.0f;
                y = r * r;
            }
        }
        u8 c = fp8_code_counted(y, in, scale, g, fmt, saturate, stats, meta + 2);
        if (in) {
            out[i] = y;
            q[i] = c;
        }
    }
}
