//! Run-time compilation of `kernels/cuda/*.cu` with NVRTC for the device's architecture,
//! and kernel launches.
//!
//! Each source ([`runner_kernels::cuda::SOURCES`], the shared header inlined) compiles to
//! PTX for `compute_XY` of the device (so the driver JITs it for the exact chip), once per
//! process when the device opens; a source that does not compile fails the open with
//! NVRTC's log. [`compile_all`] is the same compilation without a device, which CI runs
//! for sm_90 and sm_100 with the NVRTC wheel.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};

use crate::device::ExecError;

/// Options every kernel compiles with: exact division and square root, no fused
/// contractions beyond what the CPU code does implicitly, C++17.
fn options(arch: &'static str, name: &str) -> CompileOptions {
    CompileOptions {
        arch: Some(arch),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        ftz: Some(false),
        name: Some(name.to_string()),
        options: vec!["--std=c++17".into()],
        ..Default::default()
    }
}

/// The NVRTC log of a failed compilation, readable.
fn describe(file: &str, arch: &str, e: CompileError) -> String {
    match e {
        CompileError::CompileError { log, .. } => format!(
            "{file} does not compile for {arch}:\n{}",
            log.to_string_lossy()
        ),
        other => format!("NVRTC failed on {file} for {arch}: {other:?}"),
    }
}

/// Compile one source for `arch` (`compute_90`, `sm_100`, ...).
fn compile_one(file: &str, src: &str, arch: &'static str) -> Result<Ptx, String> {
    cudarc::nvrtc::compile_ptx_with_opts(runner_kernels::cuda::assemble(src), options(arch, file))
        .map_err(|e| describe(file, arch, e))
}

/// Whether the NVRTC library can be loaded (checked before any NVRTC call: cudarc panics
/// when it cannot find the library).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library names cudarc knows.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compile every kernel source for `arch` without a device, returning each file's PTX
/// size; the first failure is an error with NVRTC's log.
///
/// # Errors
/// NVRTC missing, or a source that does not compile.
pub fn compile_all(arch: &'static str) -> Result<Vec<(&'static str, usize)>, String> {
    if !nvrtc_present() {
        return Err("the NVRTC library (libnvrtc.so) is not on the loader path".into());
    }
    runner_kernels::cuda::SOURCES
        .iter()
        .map(|(file, src)| compile_one(file, src, arch).map(|p| (*file, p.to_src().len())))
        .collect()
}

/// `compute_XY` for compute capability (X, Y) (a static string, as NVRTC's options take).
pub fn arch_of(major: i32, minor: i32) -> Result<&'static str, ExecError> {
    Ok(match (major, minor) {
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (10, 3) => "compute_103",
        (12, 0) => "compute_120",
        (12, 1) => "compute_121",
        _ => {
            return Err(ExecError::NoCuda(format!(
                "compute capability {major}.{minor} is not one the CUDA backend compiles for \
                 (8.0 and newer: A100, H100/H200, B200, ...)"
            )));
        }
    })
}

/// The compiled kernels of one device, by name.
pub(super) struct Kernels {
    functions: HashMap<String, CudaFunction>,
}

/// Kernel names each source defines (its `extern "C" __global__` functions).
fn kernel_names(src: &str) -> Vec<String> {
    src.split("extern \"C\" __global__ void ")
        .skip(1)
        .filter_map(|rest| rest.split('(').next().map(|n| n.trim().to_string()))
        .collect()
}

impl Kernels {
    /// Compile every source for `arch` and load it into `ctx`.
    pub(super) fn load(ctx: &Arc<CudaContext>, arch: &'static str) -> Result<Kernels, ExecError> {
        let mut functions = HashMap::new();
        for (file, src) in runner_kernels::cuda::SOURCES {
            let ptx = compile_one(file, src, arch).map_err(ExecError::NoCuda)?;
            let module = ctx.load_module(ptx).map_err(|e| {
                ExecError::NoCuda(format!(
                    "the driver refused the PTX of {file} ({e}); a driver older than the NVRTC \
                     library cannot load its PTX: use the NVRTC that matches the driver's CUDA \
                     version"
                ))
            })?;
            for name in kernel_names(src) {
                let f = module.load_function(&name).map_err(|e| {
                    ExecError::NoCuda(format!("kernel {name} of {file} did not load: {e}"))
                })?;
                functions.insert(name, f);
            }
        }
        Ok(Kernels { functions })
    }

    pub(super) fn get(&self, name: &str) -> Result<&CudaFunction, ExecError> {
        self.functions
            .get(name)
            .ok_or_else(|| ExecError::State(format!("no CUDA kernel named {name}")))
    }
}

/// A kernel argument: a device pointer, an integer, a float, or a struct.
#[derive(Clone, Copy)]
pub(super) enum Arg {
    P(u64),
    I(i64),
    I32(i32),
    F(f32),
    Attn(super::AttnShape),
}

/// Launch `f` on `stream`.
pub(super) fn launch(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    cfg: LaunchConfig,
    args: &[Arg],
) -> Result<(), cudarc::driver::DriverError> {
    let mut b = stream.launch_builder(f);
    for a in args {
        match a {
            Arg::P(v) => b.arg(v),
            Arg::I(v) => b.arg(v),
            Arg::I32(v) => b.arg(v),
            Arg::F(v) => b.arg(v),
            Arg::Attn(v) => b.arg(v),
        };
    }
    // SAFETY: every launch site passes the argument list of the kernel's C signature in
    // kernels/cuda (pointers to device buffers the caller checked the lengths of).
    unsafe { b.launch(cfg) }.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_are_read_from_the_sources() {
        let names = kernel_names(runner_kernels::cuda::SOURCES.iter().find(|(f, _)| *f == "adamw.cu").unwrap().1);
        assert_eq!(names, ["adamw"]);
        let all: usize = runner_kernels::cuda::SOURCES.iter().map(|(_, s)| kernel_names(s).len()).sum();
        assert!(all > 40, "{all}");
    }

    /// Every kernel source compiles with the real NVRTC for Hopper and Blackwell. CI
    /// installs NVIDIA's NVRTC wheel and sets RUNNER_REQUIRE_NVRTC=1 (`.ci/run`); without
    /// the library and without that variable the test says it was skipped.
    #[test]
    fn every_kernel_compiles_with_nvrtc_for_sm90_and_sm100() {
        if !nvrtc_present() {
            assert!(
                std::env::var_os("RUNNER_REQUIRE_NVRTC").is_none(),
                "RUNNER_REQUIRE_NVRTC is set but libnvrtc is not on the loader path"
            );
            eprintln!("skipped: libnvrtc not found (set LD_LIBRARY_PATH to NVRTC's lib dir)");
            return;
        }
        for arch in ["sm_90", "sm_100"] {
            let done = compile_all(arch).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(done.len(), runner_kernels::cuda::SOURCES.len());
            assert!(done.iter().all(|(_, n)| *n > 0), "{done:?}");
        }
    }
}
