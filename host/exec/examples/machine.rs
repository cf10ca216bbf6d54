//! GEMM throughput, f32 peak and memory bandwidth of this machine, as JSON rows.
//!
//! `RAYON_NUM_THREADS=2 cargo run --release -p runner-exec --example machine`

fn main() {
    let gemm = runner_exec::bench::gemm_bench(&[256, 512, 1024, 2048]);
    for r in &gemm {
        println!(
            "gemm {:>5}^3  median {:7.1} GFLOP/s  best {:7.1}  ({} threads)",
            r.m, r.gflops, r.best_gflops, r.threads
        );
    }
    let p = runner_exec::bench::peak_gflops();
    println!(
        "peak {}: {} x{} lanes x2 x{} FMA x{} cpus x{:.2} GHz ({}) = {:.1} GFLOP/s theoretical; measured {:?} ({})",
        p.model,
        p.isa,
        p.lanes,
        p.fma_units,
        p.cpus,
        p.ghz,
        p.clock_source,
        p.theoretical_gflops,
        p.measured_fma_gflops,
        p.measured_method
    );
    for r in runner_exec::bench::memory_bench() {
        println!(
            "memory {:5}  median {:6.2} GB/s  best {:6.2}  ({} threads)",
            r.kernel, r.gbps, r.best_gbps, r.threads
        );
    }
}
