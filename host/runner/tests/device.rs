//! `--device`: an explicit `cuda` without a usable GPU exits with a message naming what is
//! missing (never a panic), `auto` falls back to the CPU, and the device benches run.

use std::process::{Command, Output};

fn runner(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .env_remove("RUNNER_PLUGIN_PATH")
        .output()
        .expect("runner starts")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn explicit_cuda_without_a_gpu_names_what_is_missing() {
    let Some(why) = runner_exec::select::cuda_unusable(0) else {
        eprintln!("a usable GPU is present: nothing to check here");
        return;
    };
    for args in [&["--device", "cuda", "bench", "gemm"][..], &["--device", "cuda:0", "models"]] {
        let o = runner(args);
        let t = text(&o);
        assert!(!o.status.success(), "{args:?}: {t}");
        assert!(t.contains("error: --device cuda:0: ") && t.contains(&why), "{args:?}: {t}");
        assert!(!t.contains("panicked"), "{t}");
    }
    let o = runner(&["--device", "cuda:7x", "models"]);
    assert!(!o.status.success() && text(&o).contains("cuda:N"), "{}", text(&o));
}

#[test]
fn kernel_check_and_device_gemm_run_on_the_cpu() {
    let o = runner(&["--device", "cpu", "bench", "kernels", "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert!(rows.len() > 100, "{}", rows.len());
    assert!(rows.iter().any(|r| r["kernel"] == "attention_backward dq (causal GQA)"));
    let o = runner(&["--device", "cpu", "bench", "gemm", "--dtype", "fp8", "--sizes", "64", "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rows[0]["dtype"], "fp8-e4m3");
    let o = runner(&["bench", "gemm", "--dtype", "int4"]);
    assert!(!o.status.success() && text(&o).contains("--dtype int4"), "{}", text(&o));
}

/// `bench layer --cuda-graph` on the CPU stops before the (long) eager measurement with
/// the reason and the fix.
#[test]
fn cuda_graphs_on_the_cpu_say_they_need_a_gpu() {
    let o = runner(&["--device", "cpu", "bench", "layer", "--seq", "8", "--cuda-graph"]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("cannot record a CUDA graph") && t.contains("--device cuda"), "{t}");
    assert!(!t.contains("panicked"), "{t}");
}

/// The emulated CUDA device computes a GPU's results, not its speed: every command that
/// times the device refuses it (before building anything) and says what it is for.
#[test]
fn timing_commands_refuse_the_emulated_device() {
    for args in [
        &["--device", "cuda-emulated", "bench", "memory"][..],
        &["--device", "cuda-emulated", "bench", "gemm", "--dtype", "bf16", "--sizes", "64"],
        &["--device", "cuda-emulated", "bench", "layer", "--seq", "8"],
        &["--device", "cuda-emulated", "measure", "--model", "llama3.1-8b", "--gpu", "h100"],
    ] {
        let o = runner(args);
        let t = text(&o);
        assert!(!o.status.success(), "{args:?}: {t}");
        assert!(t.contains("--device cuda-emulated computes what a GPU would, not how fast") && t.contains("bench kernels"), "{args:?}: {t}");
        assert!(!t.contains("panicked"), "{t}");
    }
}
