// Token embedding lookup and its scatter-add backward (CPU twin: runner-kernels
// cpu/embedding.rs), with Megatron's vocab-parallel shard: the table holds ids
// start..start+rows, others read zeros and get no gradient. Ids were checked against the
// vocabulary on the host before upload; an id outside the table still reads zeros here
// instead of faulting.
//
// The backward adds with atomics: rows hit by several tokens sum in an unspecified order
// (the CPU sums in token order), so dtable matches to rounding, not bit for bit.
#include "common.cuh"

// out (N, c) = table[tokens - start] or 0.
extern "C" __global__ void embedding_forward(float* out, const u32* tokens, const float* table, i64 n, int c,
                                             i64 rows, i64 start) {
    FOR_EACH(i, n * c) {
        i64 r = (i64)tokens[i / c] - start;
        out[i] = (r >= 0 && r < rows) ? table[r * c + i % c] : 0.0f;
    }
}

// dtable (rows, c) += dout rows of the tokens this table holds.
extern "C" __global__ void embedding_backward(float* dtable, const float* dout, const u32* tokens, i64 n, int c,
                                              i64 rows, i64 start) {
    FOR_EACH(i, n * c) {
        i64 r = (i64)tokens[i / c] - start;
        if (r >= 0 && r < rows) atomicAdd(&dtable[r * c + i % c], dout[i]);
    }
}
