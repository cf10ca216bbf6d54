//! The kernels of [`super::SOURCES`] as C++ for a CPU: an emulation of a thread block
//! (`cuda/emulation/emu.h`, `emu_runtime.h`) and a launcher that calls any kernel by name
//! (`cuda/emulation/launcher.cpp`). Two uses: the kernels crate's emulation tests run it
//! as a program on scripts of launches, and `runner-exec`'s CUDA backend loads it as a
//! shared library (`Cuda::emulated`) so that the backend's own launch sequences, buffer
//! management and FP8 scale handling run on a machine without a GPU.
//!
//! Building needs a C++20 compiler (`c++`, or the one `CXX` names).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The emulation's header: CUDA's built-ins as C++.
pub const EMU_H: &str = include_str!("../../cuda/emulation/emu.h");
/// The emulation's run time: barriers, shuffles, and the loop over a grid's blocks.
pub const EMU_RUNTIME_H: &str = include_str!("../../cuda/emulation/emu_runtime.h");
/// The launcher: `main` over a script, or (`-DEMU_LIBRARY`) the C entry `emu_launch`.
pub const LAUNCHER_CPP: &str = include_str!("../../cuda/emulation/launcher.cpp");

/// The C++ compiler to build with (`CXX`, else `c++`), when it runs.
pub fn compiler() -> Option<String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let runs = Command::new(&cxx).arg("--version").output().is_ok_and(|o| o.status.success());
    runs.then_some(cxx)
}

/// `extern __shared__ float NAME[];` (a kernel's dynamic shared memory) pointed at the
/// emulation's block buffer.
pub fn point_dynamic_shared(src: &str) -> String {
    const DECL: &str = "extern __shared__ float ";
    let mut out = String::new();
    let mut rest = src;
    while let Some(at) = rest.find(DECL) {
        out.push_str(&rest[..at]);
        let after = &rest[at + DECL.len()..];
        let Some(end) = after.find("[];") else {
            // Not the form the kernels use: left as it is, and the C++ compiler says so.
            out.push_str(DECL);
            rest = after;
            continue;
        };
        out.push_str(&format!("float* {} = emu_dynamic_smem;", &after[..end]));
        rest = &after[end + 3..];
    }
    out.push_str(rest);
    out
}

/// The C++ expression passing launch argument `k` as a parameter of C type `ty`.
fn cast(ty: &str, k: usize) -> String {
    match ty {
        t if t.ends_with('*') => format!("({t})a[{k}].p"),
        "float" => format!("a[{k}].f"),
        "i64" | "int" | "u32" | "unsigned" | "u64" => format!("({ty})a[{k}].i"),
        t => format!("*({t}*)a[{k}].raw"),
    }
}

/// Every kernel source as one C++ translation unit (the launcher's `kernels_emu.inc`):
/// each in a namespace with its own copy of common.cuh (its two lines of PTX made C++),
/// dynamic shared memory pointed at the emulation's, a wrapper per kernel that calls it
/// with the launch's arguments cast to its C signature, and a `find` from a kernel's name
/// to its wrapper; then one `find` over them all (looked up once per launch, not by each
/// thread).
///
/// # Errors
/// common.cuh's PTX lines are not the ones the emulation replaces, or a kernel's
/// signature cannot be read.
pub fn translation_unit() -> Result<String, String> {
    let f16_out = r#"asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));"#;
    let f16_in = r#"asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h));"#;
    let common = super::COMMON;
    if !(common.contains(f16_out) && common.contains(f16_in)) {
        return Err("common.cuh's f16 conversions changed: update the emulation (kernels/src/cuda/emulation.rs)".into());
    }
    let common = common.replace(f16_out, "h = emu_f32_to_f16(x);").replace(f16_in, "x = emu_f16_to_f32(h);");
    let mut tu = String::new();
    let mut spaces = Vec::new();
    for (file, src) in super::SOURCES {
        let space = format!("k_{}", file.trim_end_matches(".cu"));
        let body = point_dynamic_shared(&src.replacen("#include \"common.cuh\"", "", 1));
        let (mut wrappers, mut calls) = (String::new(), String::new());
        for decl in src.split("extern \"C\" __global__ void ").skip(1) {
            let unreadable = || format!("{file}: a kernel signature the emulation cannot read");
            let (name, tail) = decl.split_once('(').ok_or_else(unreadable)?;
            let params = tail.split_once(')').ok_or_else(unreadable)?.0;
            let args = params
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .enumerate()
                .map(|(k, p)| p.rfind([' ', '*']).map(|cut| cast(p[..=cut].trim(), k)).ok_or_else(unreadable))
                .collect::<Result<Vec<_>, _>>()?;
            let name = name.trim();
            wrappers.push_str(&format!("static void call_{name}(Arg* a) {{ {name}({}); }}\n", args.join(", ")));
            calls.push_str(&format!("    if (!strcmp(name, \"{name}\")) return call_{name};\n"));
        }
        tu.push_str(&format!(
            "namespace {space} {{\n{common}\n{body}\n{wrappers}static Kernel find(const char* name) {{\n{calls}    return nullptr;\n}}\n}}\n"
        ));
        spaces.push(format!("    if (Kernel k = {space}::find(name)) return k;\n"));
    }
    tu.push_str(&format!("static Kernel find(const char* name) {{\n{}    return nullptr;\n}}\n", spaces.concat()));
    Ok(tu)
}

/// Write the launcher's files (its headers, `launcher.cpp`, `kernels_emu.inc`) into `dir`.
///
/// # Errors
/// [`translation_unit`]'s, or a file that cannot be written.
pub fn write_launcher(dir: &Path) -> Result<(), String> {
    let tu = translation_unit()?;
    for (file, text) in [("emu.h", EMU_H), ("emu_runtime.h", EMU_RUNTIME_H), ("launcher.cpp", LAUNCHER_CPP), ("kernels_emu.inc", tu.as_str())] {
        std::fs::write(dir.join(file), text).map_err(|e| format!("writing {}: {e}", dir.join(file).display()))?;
    }
    Ok(())
}

/// The launcher built into `dir` as a shared library (`libemu_kernels.so`) exporting
/// `emu_launch` (see launcher.cpp), optimised. With `sanitize`, under the address and
/// undefined-behaviour sanitizers: only for a process started with the address
/// sanitizer's run time preloaded (a library cannot bring it in later), where every
/// allocation, the backend's buffers included, then has guarded edges.
///
/// # Errors
/// No C++ compiler, or the compiler's message.
pub fn build_library(dir: &Path, sanitize: bool) -> Result<PathBuf, String> {
    let cxx = compiler().ok_or("no C++ compiler runs (c++, or the one CXX names); install g++")?;
    write_launcher(dir)?;
    let lib = dir.join("libemu_kernels.so");
    let mut cmd = Command::new(&cxx);
    cmd.current_dir(dir).args(["-std=c++20", "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-DEMU_LIBRARY"]);
    if sanitize {
        cmd.args(["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g"]);
    }
    let out = cmd
        .args(["launcher.cpp", "-o"])
        .arg(&lib)
        .output()
        .map_err(|e| format!("running {cxx}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cxx} could not build the emulated kernels:\n{}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(lib)
}
