//! Measured per-op times in the projection: they replace the roofline for exactly the
//! ops they name, only at the sharding and GEMM formats they were measured at, and a
//! measurement file names only ops of the rank graph it claims.

mod common;

use common::{layout, projector};
use runner_project::measured::{GemmDetail, OpClass, OpTime, OpsFile};
use runner_project::model::Model;
use runner_project::precision::Recipe;
use runner_project::profile::GemmFormat;
use runner_project::published::Resolver;
use runner_project::template::{Measured, ShardKey};

const TP1: ShardKey = ShardKey { tp: 1, cp: 1, ep: 1, etp: 1, sp: false, mbs: 1 };

/// llama3-tiny (4 alike layers) on one H100, one micro-batch: the step is the sum of the
/// parts' times, so a change to one op of the representative layer shows four times.
fn step_with(measured: Measured) -> f64 {
    let mut p = projector("llama3-tiny", 256, "h100", Recipe::Bf16).with_measured(measured);
    p.project(&layout(1, 1, 1, 1, 1, 1, 1)).unwrap().step_time_s
}

fn table(key: ShardKey, ops: &[(&str, f64, f64)], formats: Option<[GemmFormat; 3]>) -> Measured {
    Measured {
        ops: ops.iter().map(|(n, f, b)| ((*n).to_string(), (*f, *b))).collect(),
        key: Some(key),
        formats: formats.map(|f| ops.iter().map(|(n, _, _)| ((*n).to_string(), f)).collect()).unwrap_or_default(),
    }
}

/// A BF16 GEMM entry of 1 GFLOP whose three kernels take `kernel` s each and whose
/// forward, casts included, takes `fwd` s.
fn gemm_op(name: &str, fwd: f64, kernel: f64) -> OpTime {
    OpTime {
        name: name.into(),
        kind: OpClass::Gemm,
        layer: 0,
        shape: Vec::new(),
        fwd_s: fwd,
        bwd_s: 2.0 * kernel,
        gemm: Some(GemmDetail { formats: [GemmFormat::Bf16; 3], flops: 1e9, calls: 1, bytes: 1e6, kernel_s: [kernel; 3] }),
        memory: None,
    }
}

/// A measurement of llama3-tiny at seq 256 on H100, BF16, tp 1, holding `ops`.
fn ops_file(ops: Vec<OpTime>) -> OpsFile {
    OpsFile {
        format: runner_project::measured::FORMAT.into(),
        version: runner_project::measured::VERSION,
        device: "cpu".into(),
        measured_at: "2026-12-01T10:00:00Z".into(),
        gpu: "H100".into(),
        model: "llama3-tiny".into(),
        seq_len: 256,
        precision: "bf16".into(),
        shard: TP1,
        repeats: 1,
        notes: Vec::new(),
        ops,
    }
}

#[test]
fn a_measured_op_changes_the_step_by_exactly_its_time_difference() {
    let base = step_with(Measured::default());
    for op in ["layers.0.mlp.gate", "layers.0.residual1"] {
        let a = step_with(table(TP1, &[(op, 1e-3, 2e-3)], None));
        let b = step_with(table(TP1, &[(op, 4e-3, 7e-3)], None));
        assert!(a != base, "{op}: the measurement was not applied");
        // Four layers share the representative layer's costing: 4 × (3 ms + 5 ms).
        let want = 4.0 * (3e-3 + 5e-3);
        assert!(((b - a) - want).abs() < 1e-12 * b, "{op}: {} vs {want}", b - a);
    }
    // The head's GEMM is outside the layers: once.
    let a = step_with(table(TP1, &[("lm_head", 1e-3, 2e-3)], None));
    let b = step_with(table(TP1, &[("lm_head", 2e-3, 4e-3)], None));
    assert!(((b - a) - 3e-3).abs() < 1e-12 * b, "{}", b - a);
}

#[test]
fn a_measurement_holds_only_at_its_sharding_and_formats() {
    let base = step_with(Measured::default());
    let elsewhere = ShardKey { tp: 2, sp: true, ..TP1 };
    assert_eq!(step_with(table(elsewhere, &[("layers.0.mlp.gate", 1.0, 1.0)], None)), base, "another sharding's times were applied");
    let fp8 = [GemmFormat::Fp8; 3];
    assert_eq!(step_with(table(TP1, &[("layers.0.mlp.gate", 1.0, 1.0)], Some(fp8))), base, "FP8 times were applied to a BF16 GEMM");
    assert!(step_with(table(TP1, &[("layers.0.mlp.gate", 1.0, 1.0)], Some([GemmFormat::Bf16; 3]))) > base + 7.9);
    // A file's table carries each GEMM's formats: its BF16 times stand for the BF16
    // plan's GEMM, not the FP8 plan's GEMM of that name.
    let file = ops_file(vec![gemm_op("layers.0.mlp.gate", 1.0, 1.0)]);
    let fp8 = |m: Measured| projector("llama3-tiny", 256, "h100", Recipe::Fp8).with_measured(m).project(&layout(1, 1, 1, 1, 1, 1, 1)).unwrap().step_time_s;
    assert_eq!(fp8(file.measured()), fp8(Measured::default()), "BF16 times were applied to an FP8 GEMM");
    assert!(step_with(file.measured()) > base + 7.9);
}

#[test]
fn a_measurement_file_names_only_ops_of_its_rank_graph() {
    let (_, mut src) = common::Native.resolve("llama3-tiny", 256).unwrap();
    let mut model = Model::new("llama3-tiny", 256, src.as_mut()).unwrap();
    let rank = model.rank_graph(TP1, src.as_mut()).unwrap();
    let plan = projector("llama3-tiny", 256, "h100", Recipe::Bf16).plan;
    let gemm = |name: &str| gemm_op(name, 1e-3, 1e-3);
    let mut file = ops_file(vec![gemm("layers.0.mlp.gate"), gemm("lm_head")]);
    file.check_graph("ops.json", &rank, &plan).unwrap();
    file.ops.push(gemm("layers.0.mlp.gate_up"));
    let e = file.check_graph("ops.json", &rank, &plan).unwrap_err();
    assert!(e.contains("ops[2]") && e.contains("gate_up") && e.contains("rank graph"), "{e}");
    file.ops.pop();
    file.ops.push(gemm("layers.0.residual1"));
    let e = file.check_graph("ops.json", &rank, &plan).unwrap_err();
    assert!(e.contains("listed as gemm") && e.contains("memory"), "{e}");
    // A GEMM at formats the plan does not give it would be listed as measured and keep
    // the roofline: refused (an edited file set an op to fp8 under the bf16 plan, and
    // the projection said the op replaced the roofline).
    file.ops.pop();
    let mut fp8 = gemm("layers.0.attn.q");
    fp8.gemm.as_mut().unwrap().formats = [GemmFormat::Fp8; 3];
    file.ops.push(fp8);
    let e = file.check_graph("ops.json", &rank, &plan).unwrap_err();
    assert!(e.contains("ops[2] 'layers.0.attn.q' ran at fp8/fp8/fp8") && e.contains("runs it at bf16/bf16/bf16"), "{e}");
    // Sharded for tp = 2, the same names exist (shapes changed): only the key tells.
    let tp2 = model.rank_graph(ShardKey { tp: 2, sp: true, ..TP1 }, src.as_mut()).unwrap();
    assert!(tp2.ops.iter().any(|o| o.name == "layers.0.mlp.gate"));
}

/// A file whose times cannot be right (zero, 1e-300 s, a forward shorter than its own
/// kernel, a GEMM past the GPU's peak, a memory op whose times do not follow its bytes)
/// is refused by name: `project --measured` had projected a step of nothing from it.
#[test]
fn a_measurement_file_with_impossible_times_is_refused() {
    let parse = |f: &OpsFile| OpsFile::parse(&serde_json::to_string(f).unwrap(), "ops.json");
    let h100 = runner_project::profile::Profiles::builtin().get("h100").unwrap().clone();
    // 1 GFLOP in 1 ms: 1 TFLOP/s, well under H100's BF16 peak.
    let good = ops_file(vec![gemm_op("lm_head", 1.2e-3, 1e-3)]);
    parse(&good).unwrap().check_gpu("ops.json", &h100).unwrap();
    for (fwd, kernel, want) in [(0.0, 1e-3, "fwd_s must be"), (1e-300, 1e-3, "fwd_s must be"), (5e-4, 1e-3, "disagree")] {
        let e = parse(&ops_file(vec![gemm_op("lm_head", fwd, kernel)])).unwrap_err();
        assert!(e.contains("ops[0] ('lm_head')") && e.contains(want), "{fwd}: {e}");
    }
    // 1 GFLOP in 10 ns is 100 PFLOP/s: consistent with itself, impossible on an H100.
    let fast = parse(&ops_file(vec![gemm_op("lm_head", 1e-8, 1e-8)])).unwrap();
    let e = fast.check_gpu("ops.json", &h100).unwrap_err();
    assert!(e.contains("past H100's bf16 peak") && e.contains("units"), "{e}");
    let e = parse(&OpsFile { repeats: 0, ..good.clone() }).unwrap_err();
    assert!(e.contains("repeats must be at least 1"), "{e}");
    let mut deep = good.clone();
    deep.ops[0].layer = -5;
    assert!(parse(&deep).unwrap_err().contains("layer must be"));
    // A memory op: its times are the run's scaled by the bytes, or the file is refused.
    let mem = |fwd: f64| OpTime {
        name: "layers.0.norm1".into(),
        kind: OpClass::Memory,
        layer: 0,
        shape: Vec::new(),
        fwd_s: fwd,
        bwd_s: 2e-5,
        gemm: None,
        memory: Some(runner_project::measured::MemoryDetail { bytes: 1e6, run_bytes: 2e6, run_fwd_s: 2e-5, run_bwd_s: 4e-5 }),
    };
    parse(&ops_file(vec![mem(1e-5)])).unwrap();
    assert!(parse(&ops_file(vec![mem(1e-9)])).unwrap_err().contains("disagree"));
}

/// The ops a file leaves out keep the roofline, and the projection names them: every
/// GEMM of the rank graph, and the memory-bound ops once the file times any; never the
/// attention cores or the collectives, which `runner measure` leaves to the model.
#[test]
fn the_ops_a_file_leaves_out_are_named() {
    let (_, mut src) = common::Native.resolve("llama3-tiny", 256).unwrap();
    let mut model = Model::new("llama3-tiny", 256, src.as_mut()).unwrap();
    let rank = model.rank_graph(TP1, src.as_mut()).unwrap();
    let gemms: Vec<&str> = rank.ops.iter().filter(|o| OpClass::of(o.kind) == Some(OpClass::Gemm)).map(|o| o.name.as_str()).collect();
    assert_eq!(gemms.len(), 8, "{gemms:?}");
    let all = ops_file(gemms.iter().map(|n| gemm_op(n, 1e-3, 1e-3)).collect());
    assert!(all.unmeasured(&rank).is_empty(), "{:?}", all.unmeasured(&rank));
    let mut some = all.clone();
    some.ops.retain(|o| o.name != "layers.0.mlp.gate");
    assert_eq!(some.unmeasured(&rank), ["layers.0.mlp.gate"]);
    let norm = OpTime {
        name: "layers.0.attn_norm".into(),
        kind: OpClass::Memory,
        layer: 0,
        shape: Vec::new(),
        fwd_s: 1e-5,
        bwd_s: 2e-5,
        gemm: None,
        memory: Some(runner_project::measured::MemoryDetail { bytes: 1e6, run_bytes: 2e6, run_fwd_s: 2e-5, run_bwd_s: 4e-5 }),
    };
    some.ops.push(norm);
    let left = some.unmeasured(&rank);
    assert!(left.contains(&"layers.0.mlp.gate") && left.contains(&"layers.0.mlp_norm") && !left.contains(&"layers.0.attn_norm"), "{left:?}");
    assert!(!left.iter().any(|n| n.contains("core")), "attention is never measured: {left:?}");
}
