//! `runner train` end to end on the real plugins: llama3-tiny on a slice of the shipped
//! text, precision policies planning every GEMM site, their rules acting on injected
//! faults (one test per trigger and action the faults reach), and the host's refusals.
//! Short runs (40 steps of 128 tokens); the long convergence runs are in
//! docs/PERFORMANCE.md with their commands.

use std::path::PathBuf;

use runner::train::{self, Injection, RunResult, TrainConfig, TrainReport};

/// 300 kB of the King James Bible in a temporary file (the tokenizer learns faster on it).
/// One file under a fixed name, reused by later runs (it was one per process, never
/// removed); written to a file of its own and renamed into place, so a reader never sees
/// it half written.
fn text() -> PathBuf {
    let p = std::env::temp_dir().join("runner-train-text-kjv-300000.txt");
    let wanted = &train::corpus::KJV[..300_000];
    if std::fs::read(&p).ok().as_deref() != Some(wanted.as_bytes()) {
        let mut f = tempfile::Builder::new().prefix("runner-train-text-").tempfile().unwrap();
        std::io::Write::write_all(&mut f, wanted.as_bytes()).unwrap();
        f.persist(&p).unwrap();
    }
    p
}

fn config(policies: &[&str], inject: &[&str]) -> TrainConfig {
    TrainConfig {
        steps: 40,
        seq_len: 32,
        micro_batch: 4,
        eval_every: 10,
        eval_batches: 2,
        checkpoint_every: 5,
        text: Some(text()),
        injections: inject.iter().map(|s| Injection::parse(s).unwrap()).collect(),
        ..TrainConfig::new("llama3.wasm", policies.iter().map(|s| s.to_string()).collect())
    }
}

fn run(policies: &[&str], inject: &[&str]) -> TrainReport {
    train::run(&config(policies, inject), &|_| {}).unwrap()
}

fn get<'a>(r: &'a TrainReport, policy: &str) -> &'a RunResult {
    r.runs.iter().find(|x| x.policy == policy).unwrap()
}

fn acted(r: &RunResult, action: &str) -> usize {
    r.decisions.iter().filter(|d| d.action == action && d.applied).count()
}

/// Every recipe trains (the loss falls from ln(8192) and stays finite) close to BF16 at
/// equal tokens, with the coverage its plan says; the report renders.
#[test]
fn every_recipe_trains_close_to_bf16() {
    let r = run(&["bf16", "fp8", "fp8-cs", "mxfp8", "nvfp4", "fp8-safe"], &[]);
    for run in &r.runs {
        assert!(run.final_eval_loss.is_finite() && run.final_eval_loss < 8.0, "{}: {}", run.policy, run.final_eval_loss);
        assert_eq!((run.steps, run.skipped, run.rollbacks), (40, 0, 0), "{}", run.policy);
        // tokens/s is one step's tokens over the median step, which the whole run's time
        // (evaluations and the slowest steps included) bounds from above.
        assert!((run.tokens_per_s * run.median_step_seconds - r.tokens_per_step as f64).abs() < 1e-6 * r.tokens_per_step as f64, "{}", run.policy);
        assert!(run.median_step_seconds > 0.0 && run.median_step_seconds * run.steps as f64 <= run.seconds * 1.5, "{}", run.policy);
    }
    assert_eq!(get(&r, "bf16").planned_coverage, 0.0);
    for (p, lo, hi) in [("fp8", 0.5, 0.65), ("fp8-cs", 0.5, 0.65), ("mxfp8", 0.5, 0.65), ("nvfp4", 0.3, 0.5), ("fp8-safe", 0.2, 0.35)] {
        let c = get(&r, p).planned_coverage;
        assert!(c > lo && c < hi, "{p}: coverage {c}");
    }
    for g in &r.gaps {
        assert_eq!(g.baseline, "bf16");
        let limit = if g.policy == "nvfp4" { 0.05 } else { 0.02 };
        assert!(g.eval_gap.abs() < limit, "{}: held-out gap {:+.3}% vs bf16", g.policy, 100.0 * g.eval_gap);
    }
    assert!(get(&r, "fp8").final_eval_loss != get(&r, "bf16").final_eval_loss, "FP8 changes the numerics");
    let html = train::report::html(&r);
    assert!(html.contains("<svg") && html.contains("held-out loss") && html.contains("fp8-safe"));
    let text = train::report::text(&r);
    assert!(text.contains("FP8 coverage") && text.contains("emulated"), "{text}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["runs"].as_array().unwrap().len(), 6);
}

/// nan@: without rules the NaN reaches the weights and the run diverges; fp8-safe skips
/// the step and demotes the layer holding the NaN, and the loss stays finite. The NaN
/// comes in the last tenth of the steps: the final training loss is the applied steps'
/// (it averaged the skipped iteration's NaN in).
#[test]
fn a_nan_diverges_without_rules_and_is_skipped_with_them() {
    let r = run(&["fp8", "fp8-safe"], &["nan@38"]);
    let (plain, safe) = (get(&r, "fp8"), get(&r, "fp8-safe"));
    assert!(!plain.final_eval_loss.is_finite(), "fp8 without rules diverges: {}", plain.final_eval_loss);
    assert!(plain.decisions.iter().any(|d| d.action == "alert" && d.detail.contains("no fallback")));
    assert!(safe.final_eval_loss.is_finite());
    assert!(safe.final_train_loss.is_finite(), "{}", safe.final_train_loss);
    assert_eq!(safe.skipped, 1);
    assert_eq!(acted(safe, "skip-step"), 1);
    assert!(safe.decisions.iter().any(|d| d.action == "fallback" && d.applied && d.detail.contains("layers [2]")), "{:?}", safe.decisions);
    assert!(safe.effective_coverage < safe.planned_coverage, "the demoted layer ran in BF16");
}

/// amax-spike@: fp8-safe sees the amax jump, skips the step and forgets the layer's amax
/// history, and ends where the clean run ends.
#[test]
fn an_amax_spike_resets_the_history_and_recovers() {
    let clean = run(&["fp8-safe"], &[]);
    let r = run(&["fp8-safe"], &["amax-spike@25"]);
    let safe = get(&r, "fp8-safe");
    assert!(acted(safe, "reset-amax") >= 1 && acted(safe, "skip-step") >= 1, "{:?}", safe.decisions);
    assert!(safe.decisions.iter().any(|d| d.action == "alert" && d.detail.contains("amax jump")));
    let gap = (safe.final_eval_loss - clean.runs[0].final_eval_loss) / clean.runs[0].final_eval_loss;
    assert!(gap.abs() < 0.02, "recovered to within 2% of the clean run: {:+.2}%", 100.0 * gap);
}

/// grad-spike@: without rules the spike's square stays in AdamW's second moment and
/// training stalls; fp8-safe skips the step.
#[test]
fn a_gradient_spike_stalls_without_rules_and_is_skipped_with_them() {
    let long = |policies: &[&str], inject: &[&str]| train::run(&TrainConfig { steps: 60, ..config(policies, inject) }, &|_| {}).unwrap();
    let clean = long(&["fp8"], &[]);
    let r = long(&["fp8", "fp8-safe"], &["grad-spike@22"]);
    let (plain, safe) = (get(&r, "fp8"), get(&r, "fp8-safe"));
    let base = clean.runs[0].final_eval_loss;
    assert!(plain.final_eval_loss > base * 1.02, "fp8 stalls: {} vs clean {base}", plain.final_eval_loss);
    assert_eq!(acted(safe, "skip-step"), 1);
    assert!(safe.decisions.iter().any(|d| d.detail.contains("gradient norm")));
    assert!((safe.final_eval_loss - base).abs() / base < 0.02, "fp8-safe {} vs clean fp8 {base}", safe.final_eval_loss);
}

/// bad-batch@: a loss spike with healthy numerics rolls back to the last known-good
/// checkpoint and skips batches; the run still reaches its steps, and ends near the
/// clean run.
#[test]
fn a_loss_spike_rolls_back_to_a_checkpoint() {
    // Larger batches than the other tests: the loss must have settled (its EMA variance
    // small) for one bad batch to stand out.
    let cfg = |inject: &[&str]| TrainConfig { steps: 60, seq_len: 64, micro_batch: 8, ..config(&["fp8-safe"], inject) };
    let r = train::run(&cfg(&["bad-batch@50"]), &|_| {}).unwrap();
    let safe = get(&r, "fp8-safe");
    assert_eq!(safe.rollbacks, 1, "{:?}", safe.decisions);
    assert!(safe.decisions.iter().any(|d| d.action == "rollback" && d.applied));
    assert!(safe.decisions.iter().any(|d| d.action == "alert" && d.detail.contains("loss spike")));
    assert_eq!(safe.steps, 60);
    assert!(safe.iterations > 60);
    assert!(safe.train.iter().all(|p| p.step <= 60));
    let clean = train::run(&cfg(&[]), &|_| {}).unwrap();
    let gap = (safe.final_eval_loss - clean.runs[0].final_eval_loss) / clean.runs[0].final_eval_loss;
    assert!(gap.abs() < 0.02, "{:+.2}%", 100.0 * gap);
}

/// A learning rate the model cannot take: fp8-safe's rules skip or roll back every
/// step, and the run is stopped as diverged after a few retries, not retried to the
/// iteration cap (about 3x the steps, as long as the run).
#[test]
fn a_learning_rate_that_diverges_is_stopped_not_retried_to_the_cap() {
    let cfg = TrainConfig { steps: 40, lr: Some(10.0), ..config(&["fp8-safe"], &[]) };
    let r = train::run(&cfg, &|_| {}).unwrap();
    let safe = get(&r, "fp8-safe");
    let why = safe.aborted.as_deref().unwrap_or_default();
    assert!(why.contains("diverged") && why.contains("--lr"), "{why:?} {:?}", safe.decisions);
    assert!(safe.iterations <= 30, "stopped after {} iterations", safe.iterations);
    assert!(safe.steps < 40);
}

/// A learning rate outside 1e-8..=10, a held-out loss over no batches (NaN),
/// and a fault past the last step (it would never fire and the run would read as clean),
/// are refused before anything runs.
#[test]
fn a_bad_learning_rate_and_a_fault_past_the_last_step_are_refused() {
    for lr in [f64::NAN, 0.0, -1.0, f64::INFINITY, 1e300] {
        let e = train::run(&TrainConfig { lr: Some(lr), ..config(&["bf16"], &[]) }, &|_| {}).unwrap_err().to_string();
        assert!(e.contains("a peak learning rate is from 1e-8 to 10"), "{lr}: {e}");
    }
    for n in [0, 10_001] {
        let e = train::run(&TrainConfig { eval_batches: n, ..config(&["bf16"], &[]) }, &|_| {}).unwrap_err().to_string();
        assert!(e.contains(&format!("--eval-batches {n}: use 1..=10000")), "{n}: {e}");
    }
    let e = train::run(&config(&["bf16"], &["nan@40"]), &|_| {}).unwrap_err().to_string();
    assert!(e.contains("--inject at step 40 would never fire: the run takes steps 0 to 39"), "{e}");
    // A site that is no GEMM of the model is refused before the first step, not when the
    // fault fires (after all the steps before it).
    let steps = std::sync::Mutex::new(0);
    let e = train::run(&config(&["fp8"], &["nan@30:layers.9.mlp.up"]), &|m| {
        if matches!(m, train::Progress::Step { .. }) {
            *steps.lock().unwrap() += 1;
        }
    })
    .unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("site 'layers.9.mlp.up' is not a GEMM") && e.contains("layers.0.mlp.up"), "{e}");
    assert_eq!(*steps.lock().unwrap(), 0, "no step ran");
}

/// Known-bad combinations are refused when the plan loads, naming the device.
#[test]
fn nvfp4_is_refused_on_hopper() {
    let h100 = runner::project::plan_for("H100", &runner_project::profile::Profiles::builtin()).unwrap();
    let cfg = TrainConfig { plan_for: h100.clone(), ..config(&["nvfp4"], &[]) };
    let e = format!("{:#}", train::run(&cfg, &|_| {}).unwrap_err());
    assert!(e.contains("H100") && e.contains("compute capability 90"), "{e}");
    let cfg = TrainConfig { plan_for: h100, steps: 2, ..config(&["fp8"], &[]) };
    assert!(train::run(&cfg, &|_| {}).is_ok(), "FP8 runs on Hopper");
}

/// A run that asks for FP8 from a policy that plans BF16 (or another format) is an error
/// naming both, not a note.
#[test]
fn a_run_asking_for_a_precision_its_policy_does_not_plan_is_an_error() {
    for (plugin, gpu, want) in [("bf16.wasm", "H100", "plans every GEMM in BF16"), ("mxfp8.wasm", "B200", "plans mxfp8 GEMMs")] {
        let toml = format!(
            "[model]\nplugin = \"llama3.wasm\"\nvariant = \"llama3-tiny\"\n[cluster]\ngpu = \"{gpu}\"\n[precision]\nformat = \"fp8\"\nplugin = \"{plugin}\"\n"
        );
        let run = runner::runfile::parse(&toml, "t.toml").unwrap();
        let Err(e) = runner::explore::run(&run, &|_, _, _| {}) else { panic!("{plugin}: an fp8 run was accepted") };
        let e = format!("{e:#}");
        assert!(e.contains(want) && e.contains("fp8"), "{plugin}: {e}");
    }
}

/// The projection now takes its plans from these plugins (`fp8.wasm` for `--precision fp8`,
/// ...): each plans the same format for every GEMM of every op as the built-in plan of its
/// name, so projections do not move when the plugins are installed.
#[test]
fn the_plugins_plan_what_the_built_in_plans_say() {
    use runner::plugin::workload::GraphRequest;
    use runner_project::precision::{Plan, Recipe};
    let limits = runner::plugin::Limits::default();
    let profiles = runner::project::profiles(None).unwrap();
    let mut w = runner::plugin::load("llama3.wasm").unwrap().workload(limits).unwrap();
    let info = w.describe().unwrap();
    let variant = info.variants.iter().find(|v| v.name == "llama3.1-8b").unwrap();
    let graph = w.graph(&GraphRequest::training("llama3.1-8b", 1024, 1, 0)).unwrap();
    for (recipe, gpu) in [(Recipe::Fp8, "H100"), (Recipe::Fp8Cs, "H100"), (Recipe::Mxfp8, "B200"), (Recipe::Nvfp4, "B200")] {
        let gpu = profiles.get(gpu).unwrap();
        let (plan, info) = runner::project::plan(recipe, variant, gpu, &graph, limits).unwrap();
        assert_eq!(info.expect("the plugin is installed").name, format!("{}.wasm", recipe.name()));
        let builtin = Plan::builtin(recipe, &graph);
        for op in graph.ops.iter().filter(|o| o.kind == runner_graph::OpKind::Linear) {
            assert_eq!(plan.formats(&op.name), builtin.formats(&op.name), "{recipe} {}", op.name);
        }
        assert!((plan.low_precision_share() - builtin.low_precision_share()).abs() < 1e-12);
    }
}
