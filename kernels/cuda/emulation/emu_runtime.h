// The emulation's run time (see emu.h): its globals, the block and warp barriers, and
// `launch`, which runs every block of a grid in turn on one pool of threads. Included
// once by each program that launches emulated kernels.
#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

thread_local Dim3 threadIdx, blockIdx;
Dim3 blockDim, gridDim;
float* emu_dynamic_smem;

static std::barrier<>* block_barrier;
static std::barrier<>* warp_barriers[32];
static float warp_values[32][32];
static int warp_votes[32][32];
static int block_votes[1024];

void __syncthreads() { block_barrier->arrive_and_wait(); }

int __syncthreads_or(int predicate) {
    block_votes[threadIdx.x] = predicate != 0;
    block_barrier->arrive_and_wait();
    int any = 0;
    for (unsigned i = 0; i < blockDim.x; i++) any |= block_votes[i];
    block_barrier->arrive_and_wait();  // nobody votes again before everyone has counted
    return any;
}

float emu_warp_exchange(float v, int src) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    warp_barriers[w]->arrive_and_wait();  // the last exchange's reads are done
    warp_values[w][l] = v;
    warp_barriers[w]->arrive_and_wait();
    return warp_values[w][src];
}

unsigned emu_warp_ballot(int predicate) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    warp_barriers[w]->arrive_and_wait();
    warp_votes[w][l] = predicate != 0;
    warp_barriers[w]->arrive_and_wait();
    unsigned bits = 0;
    for (int i = 0; i < 32; i++) bits |= (unsigned)warp_votes[w][i] << i;
    return bits;
}

// Every block of `grid` in turn on one pool of `threads` threads.
template <class F>
static void launch(Dim3 grid, unsigned threads, size_t smem_floats, F kernel) {
    gridDim = grid;
    blockDim = {threads, 1, 1};
    std::vector<float> smem(std::max<size_t>(smem_floats, 1));
    emu_dynamic_smem = smem.data();
    std::barrier<> block(threads), step(threads);
    block_barrier = &block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    for (unsigned w = 0; w < threads / 32; w++) {
        warps.emplace_back(new std::barrier<>(32));
        warp_barriers[w] = warps.back().get();
    }
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; t++) {
        pool.emplace_back([&, t] {
            threadIdx = {t, 0, 0};
            for (unsigned z = 0; z < grid.z; z++)
                for (unsigned y = 0; y < grid.y; y++)
                    for (unsigned x = 0; x < grid.x; x++) {
                        if (t == 0) std::fill(smem.begin(), smem.end(), NAN);
                        step.arrive_and_wait();  // the last block is done, smem is NaN
                        blockIdx = {x, y, z};
                        kernel();
                        step.arrive_and_wait();
                    }
        });
    }
    for (auto& th : pool) th.join();
}

