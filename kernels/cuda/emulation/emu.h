// CUDA C compiled as C++ for a check of the kernels' logic on a machine without a GPU
// (kernels/tests/cuda_emulation.rs, runner-exec's emulated CUDA device). Each CUDA
// thread of a block is a fiber (emu_runtime.h); blocks run one after another.
// __syncthreads is a barrier of the block's threads and a warp shuffle or ballot one of
// the warp's 32, so a barrier or a full-mask shuffle that some thread of the block (or
// lane of the warp) never reaches stops the run with a report naming the kernel, the
// block and where each thread waits (on a GPU: a hang). Dynamic shared memory starts as
// NaN, so a read before a write shows.
//
// What it cannot show: timing, races between threads of one warp or of one phase that
// a barrier does not separate (each thread runs until its next barrier, shuffle or
// return before another runs; warps in the order emu_runtime.h describes), and anything
// of the real compiler.
#include <math.h>
#include <string.h>
#include <atomic>
#include <cstdint>

#define __device__
#define __global__
#define __forceinline__ inline
// Blocks run one at a time, so a function-local static is one block's shared array.
#define __shared__ static

struct Dim3 {
    unsigned x = 0, y = 0, z = 0;
};
extern Dim3 threadIdx, blockIdx;
extern Dim3 blockDim, gridDim;
// The running block's dynamic shared memory (`extern __shared__ float smem[]` is
// rewritten to point here).
extern float* emu_dynamic_smem;

void __syncthreads();
int __syncthreads_or(int predicate);
// Lane `src`'s value of `v` in the calling lane's warp (every lane must call).
float emu_warp_exchange(float v, int src);
unsigned emu_warp_ballot(int predicate);

inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
// common.cuh's two lines of PTX (f16 conversions, round to nearest even) become these.
inline unsigned short emu_f32_to_f16(float x) {
    _Float16 h = (_Float16)x;
    unsigned short b;
    memcpy(&b, &h, 2);
    return b;
}
inline float emu_f16_to_f32(unsigned short b) {
    _Float16 h;
    memcpy(&h, &b, 2);
    return (float)h;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline float __shfl_sync(unsigned, float v, int src) { return emu_warp_exchange(v, src & 31); }
inline float __shfl_xor_sync(unsigned, float v, int mask) { return emu_warp_exchange(v, (threadIdx.x & 31) ^ mask); }
inline unsigned __ballot_sync(unsigned, int predicate) { return emu_warp_ballot(predicate); }
inline unsigned atomicMax(unsigned* p, unsigned v) {
    std::atomic_ref<unsigned> a(*p);
    unsigned old = a.load();
    while (old < v && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
