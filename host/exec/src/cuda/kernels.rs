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

/// Options every kernel compiles with: exact division and square root, no flush to zero,
/// C++17. Multiply-add contraction stays NVRTC's default (on: attention's f32 speed needs
/// it); the kernels whose results must equal the CPU's bit for bit (conversions, storage
/// rounding, the scaled quantisation helpers in `common.cuh`) keep their multiplies and
/// adds apart with the `__fmul_rn` / `__fadd_rn` intrinsics.
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

/// Every source compiled for `arch`, in [`runner_kernels::cuda::SOURCES`]' order, each
/// on a thread of its own: NVRTC compiles distinct programs concurrently, and a process
/// opening the device pays for the slowest file rather than the sum (several seconds
/// per process otherwise; `scripts/gpu-check.sh` starts a dozen).
fn compile_sources(arch: &'static str) -> Vec<(&'static str, &'static str, Result<Ptx, String>)> {
    std::thread::scope(|s| {
        let jobs: Vec<_> = runner_kernels::cuda::SOURCES
            .iter()
            .map(|&(file, src)| (file, src, s.spawn(move || compile_one(file, src, arch))))
            .collect();
        jobs.into_iter()
            .map(|(file, src, job)| (file, src, job.join().unwrap_or_else(|_| Err(format!("NVRTC's thread for {file} panicked")))))
            .collect()
    })
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
    compile_sources(arch).into_iter().map(|(file, _, ptx)| ptx.map(|p| (file, p.to_src().len()))).collect()
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
    functions: HashMap<String, Kernel>,
}

/// One loaded kernel and the kinds of its parameters.
pub(super) struct Kernel {
    pub(super) f: CudaFunction,
    params: Vec<Kind>,
}

/// How a kernel parameter is passed: what an [`Arg`] must be for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// A device pointer (`T*`, `const T*`).
    Ptr,
    /// `i64`.
    I64,
    /// A 4-byte integer (`int`, `u32`).
    I32,
    /// `float`.
    F32,
    /// Attention's `Shape` struct, by value.
    Attn,
}

impl Arg {
    fn kind(&self) -> Kind {
        match self {
            Arg::P(_) => Kind::Ptr,
            Arg::I(_) => Kind::I64,
            Arg::I32(_) => Kind::I32,
            Arg::F(_) => Kind::F32,
            Arg::Attn(_) => Kind::Attn,
        }
    }
}

/// The kind of one C parameter declaration (`const float* x`, `i64 n`, `Shape s`).
fn kind_of(decl: &str) -> Result<Kind, String> {
    if decl.contains('*') {
        return Ok(Kind::Ptr);
    }
    let words: Vec<&str> = decl.split_whitespace().filter(|w| *w != "const").collect();
    match words.as_slice() {
        ["i64", _] => Ok(Kind::I64),
        ["int" | "u32", _] => Ok(Kind::I32),
        ["float", _] => Ok(Kind::F32),
        ["Shape", _] => Ok(Kind::Attn),
        _ => Err(format!("parameter `{decl}`: a type launches do not pass (pointer, i64, int, u32, float, Shape)")),
    }
}

/// Each kernel a source defines (its `extern "C" __global__` functions) with the kinds
/// of its parameters, read from its C signature.
fn signatures(src: &str) -> Result<Vec<(String, Vec<Kind>)>, String> {
    src.split("extern \"C\" __global__ void ")
        .skip(1)
        .map(|rest| {
            let (name, tail) = rest.split_once('(').ok_or("a kernel without a parameter list")?;
            let name = name.trim().to_string();
            let list = tail.split_once(')').ok_or_else(|| format!("{name}: unclosed parameter list"))?.0;
            let params = list
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(|d| kind_of(d).map_err(|e| format!("{name}: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((name, params))
        })
        .collect()
}

/// Kernel names each source defines.
#[cfg(test)]
fn kernel_names(src: &str) -> Vec<String> {
    signatures(src).unwrap_or_default().into_iter().map(|(n, _)| n).collect()
}

impl Kernels {
    /// Compile every source for `arch` and load it into `ctx`.
    pub(super) fn load(ctx: &Arc<CudaContext>, arch: &'static str) -> Result<Kernels, ExecError> {
        let mut functions = HashMap::new();
        for (file, src, ptx) in compile_sources(arch) {
            let ptx = ptx.map_err(ExecError::NoCuda)?;
            let module = ctx.load_module(ptx).map_err(|e| {
                ExecError::NoCuda(format!(
                    "the driver refused the PTX of {file} ({e}); a driver older than the NVRTC \
                     library cannot load its PTX: use the NVRTC that matches the driver's CUDA \
                     version"
                ))
            })?;
            for (name, params) in signatures(src).map_err(|e| ExecError::NoCuda(format!("{file}: {e}")))? {
                let f = module.load_function(&name).map_err(|e| {
                    ExecError::NoCuda(format!("kernel {name} of {file} did not load: {e}"))
                })?;
                functions.insert(name, Kernel { f, params });
            }
        }
        Ok(Kernels { functions })
    }

    pub(super) fn get(&self, name: &str) -> Result<&Kernel, ExecError> {
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

impl Kernel {
    /// Whether `args` are of the kinds the kernel's C signature takes ([`check_args`]).
    pub(super) fn check(&self, name: &str, args: &[Arg]) -> Result<(), ExecError> {
        check_args(name, &self.params, args).map_err(ExecError::State)
    }
}

/// Whether `args` are of the kinds `params` (a kernel's C signature) takes: a mismatch
/// would be read as garbage by the kernel.
pub(super) fn check_args(name: &str, params: &[Kind], args: &[Arg]) -> Result<(), String> {
    let given: Vec<Kind> = args.iter().map(Arg::kind).collect();
    if given == params {
        return Ok(());
    }
    Err(format!("kernel {name} takes {params:?}, the launch passed {given:?}"))
}

/// Every kernel of every source with the kinds of its parameters (what [`Kernels::load`]
/// reads per source), without compiling anything.
pub(super) fn all_signatures() -> Result<HashMap<String, Vec<Kind>>, String> {
    let mut all = HashMap::new();
    for (file, src) in runner_kernels::cuda::SOURCES {
        all.extend(signatures(src).map_err(|e| format!("{file}: {e}"))?);
    }
    Ok(all)
}

/// Launch kernel `k` on `stream` with `args` ([`Kernel::check`]ed by the caller).
pub(super) fn launch(
    stream: &Arc<CudaStream>,
    k: &Kernel,
    cfg: LaunchConfig,
    args: &[Arg],
) -> Result<(), cudarc::driver::DriverError> {
    let mut b = stream.launch_builder(&k.f);
    for a in args {
        match a {
            Arg::P(v) => b.arg(v),
            Arg::I(v) => b.arg(v),
            Arg::I32(v) => b.arg(v),
            Arg::F(v) => b.arg(v),
            Arg::Attn(v) => b.arg(v),
        };
    }
    // SAFETY: the arguments are of the kinds of the kernel's C signature in kernels/cuda
    // (Kernel::check); pointers are to device buffers the caller checked the lengths of.
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

    /// The text up to the bracket that closes the one just before `s`.
    fn inside(s: &str) -> &str {
        let mut depth = 0i32;
        for (i, c) in s.char_indices() {
            match c {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' if depth == 0 => return &s[..i],
                ')' | ']' | '}' => depth -= 1,
                _ => {}
            }
        }
        s
    }

    /// `s` split at its top-level commas, trimmed, empty pieces dropped.
    fn top_level(s: &str) -> Vec<&str> {
        let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
        for (i, c) in s.char_indices() {
            match c {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(s[start..i].trim());
                    start = i + 1;
                }
                _ => {}
            }
        }
        out.push(s[start..].trim());
        out.retain(|p| !p.is_empty());
        out
    }

    /// The kind an argument expression of a launch passes, when it is written out.
    fn kind_of_arg(e: &str) -> Option<Kind> {
        [("self.p(", Kind::Ptr), ("Arg::P(", Kind::Ptr), ("Arg::I(", Kind::I64), ("Arg::I32(", Kind::I32), ("Arg::F(", Kind::F32), ("Arg::Attn(", Kind::Attn)]
            .into_iter()
            .find(|(p, _)| e.starts_with(p))
            .map(|(_, k)| k)
    }

    /// Every launch in `cuda/mod.rs` that names its kernel and writes out its arguments
    /// passes the kinds of that kernel's C signature: what `Kernel::check` verifies on a
    /// GPU at run time, checked here without one, so a kernel whose parameters change
    /// (adamw's scalars moved to a device pointer) cannot drift from its launch.
    #[test]
    fn every_written_out_launch_matches_its_kernels_signature() {
        let sigs: HashMap<String, Vec<Kind>> =
            runner_kernels::cuda::SOURCES.iter().flat_map(|(f, s)| signatures(s).unwrap_or_else(|e| panic!("{f}: {e}"))).collect();
        let src = include_str!("mod.rs");
        let (mut checked, mut unnamed, mut problems) = (0, 0, Vec::new());
        // Each launch helper and how many of its arguments sit between the kernel's name
        // and the argument list.
        for (call, between) in [("self.ew(", 1), ("self.run(", 1), ("self.run_attn(", 2), ("self.run_shared(", 3)] {
            for (pos, _) in src.match_indices(call) {
                let parts = top_level(inside(&src[pos + call.len()..]));
                let line = src[..pos].lines().count();
                let Some(name) = parts.first().and_then(|n| n.strip_prefix('"')).and_then(|n| n.strip_suffix('"')) else {
                    unnamed += 1;
                    continue;
                };
                let Some(list) = parts.get(1 + between).and_then(|a| a.strip_prefix("&[")).and_then(|a| a.strip_suffix(']')) else {
                    unnamed += 1;
                    continue;
                };
                let kinds: Option<Vec<Kind>> = top_level(list).into_iter().map(kind_of_arg).collect();
                let Some(kinds) = kinds else {
                    unnamed += 1;
                    continue;
                };
                match sigs.get(name) {
                    None => problems.push(format!("mod.rs:{line}: no kernel named {name}")),
                    Some(want) if *want != kinds => problems.push(format!("mod.rs:{line}: {name} takes {want:?}, the launch passes {kinds:?}")),
                    Some(_) => checked += 1,
                }
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        assert!(checked >= 50, "only {checked} launches read ({unnamed} name their kernel or arguments through variables)");
        assert_eq!(signatures("extern \"C\" __global__ void k(const float* x, i64 n, int c, float a, u32 b, Shape s) {}").unwrap()[0].1,
            [Kind::Ptr, Kind::I64, Kind::I32, Kind::F32, Kind::I32, Kind::Attn]);
        assert!(signatures("extern \"C\" __global__ void k(double x) {}").is_err());
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
