// The emulation's run time (see emu.h): its globals, the block and warp barriers, and
// `launch`, which runs every block of a grid in turn, the block's threads as fibers on
// the calling thread. Included once by each program that launches emulated
// kernels.
//
// Why fibers: a barrier of OS threads costs a trip through the scheduler for each of the
// block's threads, and a warp shuffle is two barriers, so with a thread per CUDA thread
// nearly all of the time went to waiting (a kernel check of about a minute, a two-step
// training run of over an hour). Here a barrier is a switch to the next thread.
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

Dim3 threadIdx, blockIdx;
Dim3 blockDim, gridDim;
float* emu_dynamic_smem;
// The running kernel's name, for the deadlock report.
static const char* emu_kernel_name = "?";

namespace emu {

// A fiber's saved registers, and the switch between two fibers. On x86-64, a switch
// saves and restores the callee-saved registers only: glibc's swapcontext also saves the
// signal mask (a system call) and the floating-point environment, which made it most of
// the emulation's time. Elsewhere (or with -DEMU_UCONTEXT), ucontext.
#if defined(__x86_64__) && !defined(EMU_UCONTEXT)
extern "C" void emu_switch_stack(void** save_sp, void* to_sp);
asm(R"(
    .pushsection .text
    .globl emu_switch_stack
    .hidden emu_switch_stack
    .type emu_switch_stack, @function
emu_switch_stack:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch_stack, .-emu_switch_stack
    .popsection
)");
struct Context {
    void* sp = nullptr;
};
// A context that starts `entry` (which must never return) on the stack [stack, stack + size).
static void context_init(Context& c, char* stack, size_t size, void (*entry)()) {
    void** sp = reinterpret_cast<void**>(reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t{15});
    *--sp = nullptr;                        // entry's return address: it never returns
    *--sp = reinterpret_cast<void*>(entry);  // where the first switch returns to
    for (int i = 0; i < 6; i++) *--sp = nullptr;  // rbp, rbx, r12-r15
    c.sp = sp;
}
static void context_switch(Context& from, Context& to) { emu_switch_stack(&from.sp, to.sp); }
#else
struct Context {
    ucontext_t uc;
};
static void context_init(Context& c, char* stack, size_t size, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
static void context_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// Threads arrive; the last one to arrive opens the barrier for all of them.
struct Barrier {
    unsigned expected = 0, arrived = 0;
    unsigned long long generation = 0;
};

struct Fiber {
    Context ctx;
    char* stack = nullptr;
    // Waiting at `waiting` until its generation moves past `generation`; null: runnable.
    Barrier* waiting = nullptr;
    unsigned long long generation = 0;
    bool done = false;
};

// Each thread's stack, with a guard page below it (an overflow faults, not corrupts).
constexpr size_t STACK = 1 << 18, GUARD = 1 << 12;

static std::vector<Fiber> fibers;  // one per thread of the block; stacks reused by launches
static unsigned current;
static Context scheduler;
static Barrier block_barrier, warp_barriers[32];
static void (*body)(void*);
static void* body_arg;

#ifdef EMU_ASAN
// The scheduler's stack, as the sanitizer reports it when a fiber starts or resumes.
static const void* scheduler_bottom;
static size_t scheduler_size;
#endif

// Back to the scheduler; returns when the scheduler resumes this thread.
static void yield() {
#ifdef EMU_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, scheduler_bottom, scheduler_size);
#endif
    context_switch(fibers[current].ctx, scheduler);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, &scheduler_bottom, &scheduler_size);
#endif
}

static void fiber_main() {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &scheduler_bottom, &scheduler_size);
#endif
    body(body_arg);
    fibers[current].done = true;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(nullptr, scheduler_bottom, scheduler_size);  // this fiber ends
#endif
    context_switch(fibers[current].ctx, scheduler);  // never resumed
    abort();
}

static void wait_at(Barrier& b) {
    if (++b.arrived == b.expected) {
        b.arrived = 0;
        b.generation++;
        return;
    }
    fibers[current].waiting = &b;
    fibers[current].generation = b.generation;
    yield();
}

static void resume(unsigned t) {
    current = t;
    threadIdx = {t, 0, 0};
#ifdef EMU_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, fibers[t].stack, STACK);
#endif
    context_switch(scheduler, fibers[t].ctx);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

[[noreturn]] static void deadlock(unsigned threads) {
    fprintf(stderr,
            "emulated kernel %s, block (%u, %u, %u): no thread can go on (a barrier or warp shuffle that "
            "not every thread of the block or lane of the warp reaches; on a GPU, a hang):\n",
            emu_kernel_name, blockIdx.x, blockIdx.y, blockIdx.z);
    // Where each thread is, in runs of threads at the same place.
    auto place = [](unsigned t) -> const void* { return fibers[t].done ? nullptr : fibers[t].waiting; };
    for (unsigned t = 0, end; t < threads; t = end) {
        for (end = t + 1; end < threads && place(end) == place(t); end++) {
        }
        if (end - t == 1)
            fprintf(stderr, "  thread %u: ", t);
        else
            fprintf(stderr, "  threads %u-%u: ", t, end - 1);
        if (fibers[t].done)
            fprintf(stderr, "returned\n");
        else if (fibers[t].waiting == &block_barrier)
            fprintf(stderr, "wait at __syncthreads\n");
        else
            fprintf(stderr, "wait at a shuffle or ballot of warp %u\n", t / 32);
    }
    abort();
}

// One block: every thread from the start of the kernel to its return.
static void run_block(unsigned threads) {
    const unsigned warps = threads / 32;
    block_barrier = {threads, 0, 0};
    for (unsigned w = 0; w < warps; w++) warp_barriers[w] = {32, 0, 0};
    for (unsigned t = 0; t < threads; t++) {
        Fiber& f = fibers[t];
        context_init(f.ctx, f.stack, STACK, fiber_main);
        f.waiting = nullptr;
        f.done = false;
    }
    // Each warp runs as far as it can (to a __syncthreads, or its end) before the next
    // warp runs, and the order of the warps alternates, phase by phase and block by
    // block: the warp that runs first reads what the others have not written yet and
    // overwrites what they have not read yet, so a missing __syncthreads shows whichever
    // side of it the warps are on. Lanes of a warp take turns between its shuffles.
    auto runnable = [](const Fiber& f) { return !f.done && (!f.waiting || f.waiting->generation != f.generation); };
    bool reverse = (blockIdx.x + blockIdx.y + blockIdx.z) % 2 == 1;
    for (;; reverse = !reverse) {
        bool progressed = false;
        for (unsigned k = 0; k < warps; k++) {
            const unsigned w = reverse ? warps - 1 - k : k;
            for (bool again = true; again;) {
                again = false;
                for (unsigned t = 32 * w; t < 32 * w + 32; t++) {
                    if (!runnable(fibers[t])) continue;
                    fibers[t].waiting = nullptr;
                    resume(t);
                    again = progressed = true;
                }
            }
        }
        if (std::all_of(fibers.begin(), fibers.begin() + threads, [](const Fiber& f) { return f.done; })) return;
        if (!progressed) deadlock(threads);
    }
}

template <class F>
static void call(void* f) {
    (*static_cast<F*>(f))();
}

}  // namespace emu

void __syncthreads() { emu::wait_at(emu::block_barrier); }

int __syncthreads_or(int predicate) {
    static int block_votes[1024];
    block_votes[threadIdx.x] = predicate != 0;
    __syncthreads();
    int any = 0;
    for (unsigned i = 0; i < blockDim.x; i++) any |= block_votes[i];
    __syncthreads();  // nobody votes again before everyone has counted
    return any;
}

static float warp_values[32][32];
static int warp_votes[32][32];

float emu_warp_exchange(float v, int src) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu::wait_at(emu::warp_barriers[w]);  // the last exchange's reads are done
    warp_values[w][l] = v;
    emu::wait_at(emu::warp_barriers[w]);
    return warp_values[w][src];
}

unsigned emu_warp_ballot(int predicate) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu::wait_at(emu::warp_barriers[w]);
    warp_votes[w][l] = predicate != 0;
    emu::wait_at(emu::warp_barriers[w]);
    unsigned bits = 0;
    for (int i = 0; i < 32; i++) bits |= (unsigned)warp_votes[w][i] << i;
    return bits;
}

// Every block of `grid` in turn, each with `threads` threads (whole warps, at most 1024)
// and `smem_floats` floats of dynamic shared memory, NaN at each block's start.
template <class F>
static void launch(Dim3 grid, unsigned threads, size_t smem_floats, F kernel) {
    gridDim = grid;
    blockDim = {threads, 1, 1};
    std::vector<float> smem(std::max<size_t>(smem_floats, 1));
    emu_dynamic_smem = smem.data();
    while (emu::fibers.size() < threads) {
        void* m = mmap(nullptr, emu::STACK + emu::GUARD, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "emulated kernels: no memory for a thread's stack\n");
            abort();
        }
        mprotect(m, emu::GUARD, PROT_NONE);
        emu::fibers.emplace_back();
        emu::fibers.back().stack = static_cast<char*>(m) + emu::GUARD;
    }
    emu::body = emu::call<F>;
    emu::body_arg = &kernel;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                std::fill(smem.begin(), smem.end(), NAN);
                blockIdx = {x, y, z};
                emu::run_block(threads);
            }
}
