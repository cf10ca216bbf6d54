//! The CUDA backend with its kernels emulated on the CPU (`Cuda::emulated`) against the
//! CPU backend: every row of the kernel check (`runner bench kernels`, the GPU check's
//! correctness half) and training steps through the executor. The backend's own launch
//! sequences, scratch and FP8 scale handling run here as they would on a GPU; a kernel
//! that faults crashes this test binary (its own, so no other test goes with it).
//!
//! Needs a C++20 compiler (`c++`, or `CXX`); without one the tests say so and pass,
//! unless `RUNNER_REQUIRE_CXX` is set (CI sets it).
#![cfg(feature = "cuda")]

use runner_exec::cuda::Cuda;
use runner_exec::devcheck;

/// `Some(device)`, or `None` after saying why the test is skipped (no C++ compiler,
/// and `RUNNER_REQUIRE_CXX` unset).
fn emulated() -> Option<Cuda> {
    match Cuda::emulated() {
        Ok(d) => Some(d),
        Err(e) => {
            assert!(std::env::var_os("RUNNER_REQUIRE_CXX").is_none(), "RUNNER_REQUIRE_CXX is set but the emulated device failed: {e}");
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// Rows that failed, one line each.
fn failures(rows: &[devcheck::CheckRow]) -> Vec<String> {
    rows.iter().filter(|r| !r.ok).map(|r| format!("{}: error {:.3e} (tolerance {:.0e})", r.kernel, r.error, r.tolerance)).collect()
}

/// Every row of `runner bench kernels` on the CUDA backend, its kernels emulated,
/// against the CPU backend: the GPU check's correctness half, run without a GPU.
#[test]
fn every_kernel_check_passes_on_the_emulated_cuda_backend() {
    let Some(dev) = emulated() else { return };
    let rows = devcheck::compare_kernels(&dev).unwrap_or_else(|e| panic!("{e}"));
    let failed = failures(&rows);
    assert!(rows.len() > 300, "{} rows", rows.len());
    assert!(failed.is_empty(), "{} of {} rows failed:\n{}", failed.len(), rows.len(), failed.join("\n"));
}

/// Training steps of the toy Llama, MoE and Mamba models through the executor on the
/// emulated CUDA backend: losses and gradients as the CPU backend's.
#[test]
fn training_steps_match_the_cpu_on_the_emulated_cuda_backend() {
    let Some(dev) = emulated() else { return };
    let rows = devcheck::compare_steps(dev).unwrap_or_else(|e| panic!("{e}"));
    let failed = failures(&rows);
    assert_eq!(rows.len(), 6);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

