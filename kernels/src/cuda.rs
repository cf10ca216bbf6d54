//! The CUDA C sources of the GPU backend (`kernels/cuda/*.cu`), embedded in the binary
//! and compiled at run time with NVRTC for the device's architecture by `runner-exec`'s
//! CUDA backend. Each file mirrors a CPU module (`norm.cu` ↔ [`crate::cpu::norm`], ...):
//! same kernel names, argument order and shape notation.
//!
//! NVRTC reads no files, so [`assemble`] inlines the shared header `common.cuh`; the
//! sources include no CUDA toolkit header, so any machine with the NVRTC library (the
//! pip wheel `nvidia-cuda-nvrtc` is enough) compiles them.

pub mod emulation;

/// The shared header every source includes.
pub const COMMON: &str = include_str!("../cuda/common.cuh");

/// (file name, source) of every kernel file.
pub const SOURCES: &[(&str, &str)] = &[
    ("activation.cu", include_str!("../cuda/activation.cu")),
    ("adamw.cu", include_str!("../cuda/adamw.cu")),
    ("attention.cu", include_str!("../cuda/attention.cu")),
    ("elementwise.cu", include_str!("../cuda/elementwise.cu")),
    ("embedding.cu", include_str!("../cuda/embedding.cu")),
    ("loss.cu", include_str!("../cuda/loss.cu")),
    ("moe.cu", include_str!("../cuda/moe.cu")),
    ("muon.cu", include_str!("../cuda/muon.cu")),
    ("norm.cu", include_str!("../cuda/norm.cu")),
    ("precision.cu", include_str!("../cuda/precision.cu")),
    ("quant.cu", include_str!("../cuda/quant.cu")),
    ("rope.cu", include_str!("../cuda/rope.cu")),
    ("ssm.cu", include_str!("../cuda/ssm.cu")),
];

/// `src` with its `#include "common.cuh"` line replaced by the header.
pub fn assemble(src: &str) -> String {
    src.replacen("#include \"common.cuh\"", COMMON, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `.cu` file in kernels/cuda is embedded (a new file must be listed), and each
    /// includes the header exactly once.
    #[test]
    fn every_source_is_listed_and_includes_the_header() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".cu"))
            .collect();
        on_disk.sort();
        let listed: Vec<&str> = SOURCES.iter().map(|(n, _)| *n).collect();
        assert_eq!(on_disk, listed);
        for (name, src) in SOURCES {
            assert_eq!(src.matches("#include \"common.cuh\"").count(), 1, "{name}");
            assert!(!assemble(src).contains("#include"), "{name}");
        }
    }
}
