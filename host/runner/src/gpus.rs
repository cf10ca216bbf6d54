//! Device profiles: dense peak FLOP/s per precision for the GPUs the runner projects
//! onto, as NVIDIA's DGX Cloud benchmarking README uses them for MFU (BF16 and FP8 dense,
//! no sparsity). MFU is always against the peak of the precision the run uses.

use serde::Serialize;

/// One GPU type's published peaks, TFLOP/s (dense).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct GpuProfile {
    pub name: &'static str,
    pub bf16_tflops: f64,
    pub fp8_tflops: f64,
    pub memory_gib: f64,
}

/// Known profiles. Sources: dgxc-benchmarking README peak table (GB300, GB200, B300, B200,
/// H100); H200 shares H100's compute; A100 from its datasheet (no FP8).
pub const PROFILES: &[GpuProfile] = &[
    GpuProfile {
        name: "H100",
        bf16_tflops: 989.0,
        fp8_tflops: 1979.0,
        memory_gib: 80.0,
    },
    GpuProfile {
        name: "H200",
        bf16_tflops: 989.0,
        fp8_tflops: 1979.0,
        memory_gib: 141.0,
    },
    GpuProfile {
        name: "B200",
        bf16_tflops: 2250.0,
        fp8_tflops: 4500.0,
        memory_gib: 180.0,
    },
    GpuProfile {
        name: "B300",
        bf16_tflops: 2250.0,
        fp8_tflops: 4500.0,
        memory_gib: 270.0,
    },
    GpuProfile {
        name: "GB200",
        bf16_tflops: 2450.0,
        fp8_tflops: 4900.0,
        memory_gib: 186.0,
    },
    GpuProfile {
        name: "GB300",
        bf16_tflops: 2450.0,
        fp8_tflops: 4900.0,
        memory_gib: 279.0,
    },
    GpuProfile {
        name: "A100-80GB",
        bf16_tflops: 312.0,
        fp8_tflops: 0.0,
        memory_gib: 80.0,
    },
    GpuProfile {
        name: "A100-40GB",
        bf16_tflops: 312.0,
        fp8_tflops: 0.0,
        memory_gib: 40.0,
    },
];

/// Look up a profile by name, case-insensitively.
///
/// # Errors
/// Lists the known GPU names.
pub fn profile(name: &str) -> Result<GpuProfile, String> {
    PROFILES
        .iter()
        .find(|p| p.name.eq_ignore_ascii_case(name))
        .copied()
        .ok_or_else(|| {
            let names: Vec<&str> = PROFILES.iter().map(|p| p.name).collect();
            format!("unknown GPU '{name}'; known GPUs: {}", names.join(", "))
        })
}
