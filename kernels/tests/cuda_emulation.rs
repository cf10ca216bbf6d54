//! The CUDA attention kernels (`cuda/attention.cu` with the real `cuda/common.cuh`),
//! compiled as C++ under an emulation of a block's threads (`cuda/emulation/emu.h`) and
//! run against a double-precision reference (`cuda/emulation/attention_check.cpp`): their
//! index math, masks, context-parallel positions, tile skipping and barriers, checked on
//! a machine without a GPU. A barrier or full-mask warp shuffle that some thread never
//! reaches hangs the emulation as it would a GPU (a deadline here), shared memory starts
//! as NaN and outputs too, and the address and undefined-behaviour sanitizers watch every
//! buffer where the compiler has them.
//!
//! Needs a C++20 compiler (`c++`, or `CXX`); without one the test says so and passes,
//! unless `RUNNER_REQUIRE_CXX` is set (CI sets it).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const CUDA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda");

fn compiler() -> Option<String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let runs = Command::new(&cxx).arg("--version").output().is_ok_and(|o| o.status.success());
    runs.then_some(cxx)
}

fn build(cxx: &str, dir: &Path, sanitize: bool) -> Output {
    let mut c = Command::new(cxx);
    c.current_dir(dir).args(["-std=c++20", "-O1", "-ffp-contract=off", "-pthread", "attention_check.cpp", "-o", "check"]);
    if sanitize {
        c.arg("-fsanitize=address,undefined");
    }
    c.output().expect("the C++ compiler ran a moment ago")
}

#[test]
fn attention_kernels_match_a_double_reference_under_emulation() {
    let Some(cxx) = compiler() else {
        assert!(std::env::var_os("RUNNER_REQUIRE_CXX").is_none(), "RUNNER_REQUIRE_CXX is set but no C++ compiler runs (c++ or CXX)");
        eprintln!("skipped: no C++ compiler (c++, or CXX); install g++ to check the CUDA kernels under emulation");
        return;
    };
    let dir = std::env::temp_dir().join(format!("runner-cuda-emulation-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["emulation/emu.h", "emulation/attention_check.cpp", "common.cuh"] {
        let from = Path::new(CUDA).join(file);
        std::fs::copy(&from, dir.join(from.file_name().unwrap())).unwrap();
    }
    let src = std::fs::read_to_string(Path::new(CUDA).join("attention.cu")).unwrap();
    let dynamic = "extern __shared__ float smem[];";
    assert_eq!(src.matches(dynamic).count(), 3, "attention.cu's kernels declare their dynamic shared memory so");
    std::fs::write(dir.join("attention_emu.cu"), src.replace(dynamic, "float* smem = emu_dynamic_smem;")).unwrap();

    // The sanitizers where the compiler has them, else a plain build.
    let mut built = build(&cxx, &dir, true);
    if !built.status.success() {
        built = build(&cxx, &dir, false);
    }
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));

    let mut child = Command::new(dir.join("check")).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the emulated attention kernels did not finish in 600 s: a barrier or warp shuffle that not every thread reaches");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("\n0 of ") && text.contains("shapes failed") && !text.contains("FAILED"), "{text}");
}
