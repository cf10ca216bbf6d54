//! Precision plans in the executor: each linear GEMM reads operands quantised as its
//! site plan says, per role, with the numerics recorded; delayed scaling follows its
//! amax history; faults show up in the numerics; snapshots restore the training state.

use runner_exec::cpu::Cpu;
use runner_exec::precision::{AmaxReduction, Fault, FaultKind, GemmRole, Operand, OperandPlan, Scaling, SitePlan};
use runner_exec::toy::{self, ToyConfig};
use runner_exec::{AdamW, ExecOptions, Executor, Input};
use runner_graph::{DType, Graph, OpKind};
use runner_kernels::cpu::matmul::{Gemm, matmul};
use runner_kernels::cpu::precision::round_to_bf16;
use runner_kernels::cpu::quant::{Format, QuantSpec, quantize, tensor_scale};

fn graph() -> Graph {
    toy::llama(&ToyConfig::tiny())
}

fn linears(g: &Graph) -> Vec<String> {
    g.ops.iter().filter(|o| o.kind == OpKind::Linear).map(|o| o.name.clone()).collect()
}

fn every_site(g: &Graph, plan: SitePlan) -> Vec<(String, GemmRole, SitePlan)> {
    linears(g).into_iter().flat_map(|n| GemmRole::ALL.map(|r| (n.clone(), r, plan))).collect()
}

fn fp8(format: DType, scaling: Scaling) -> OperandPlan {
    OperandPlan { format, scaling, saturate: true, stochastic: false, hadamard: 0 }
}

fn hybrid(scaling: Scaling) -> SitePlan {
    SitePlan {
        activation: fp8(DType::Fp8E4M3, scaling),
        weight: fp8(DType::Fp8E4M3, scaling),
        gradient: fp8(DType::Fp8E5M2, scaling),
        output: DType::BF16,
    }
}

fn run(ex: &mut Executor<Cpu>, g: &Graph, seed: u32) -> f32 {
    let (tokens, targets) = toy::repeating_batch(g, seed);
    let loss = ex.forward(&[("tokens", Input::U32(&tokens)), ("targets", Input::U32(&targets))]).unwrap();
    ex.backward().unwrap();
    loss
}

fn executor(g: &Graph) -> Executor<Cpu> {
    Executor::new(g, Cpu::new(), ExecOptions { seed: 3, ..ExecOptions::default() }).unwrap()
}

/// The forward output of a planned linear is exactly the f32 product of its quantised
/// operands, rounded to the plan's output format; every planned (role, operand) is
/// reported.
#[test]
fn a_planned_linear_multiplies_its_quantised_operands() {
    let g = graph();
    let mut ex = executor(&g);
    ex.set_precision(&every_site(&g, hybrid(Scaling::Current { margin: 0 }))).unwrap();
    let (tokens, targets) = toy::repeating_batch(&g, 1);
    ex.forward(&[("tokens", Input::U32(&tokens)), ("targets", Input::U32(&targets))]).unwrap();
    let op = g.ops.iter().find(|o| o.name == "layers.1.mlp.up").unwrap();
    let x = ex.activation(&g.tensors[op.inputs[0]].name).unwrap();
    let w = ex.weight(&g.tensors[op.inputs[1]].name).unwrap();
    let (n, k) = (g.tensors[op.inputs[1]].shape[0] as usize, g.tensors[op.inputs[1]].shape[1] as usize);
    let m = x.len() / k;
    let q = |mut v: Vec<f32>, rows: usize| {
        let spec = QuantSpec::Tensor { format: Format::E4M3, scale: None, margin: 0, saturate: true, stochastic: None };
        quantize(&mut v, rows, k, &spec).unwrap();
        v
    };
    let (qx, qw) = (q(x.clone(), m), q(w.clone(), n));
    assert_ne!(qx, x, "the activation was quantised");
    let mut want = vec![0f32; m * n];
    matmul(&mut want, &qx, &qw, Gemm { m, n, k, trans_a: false, trans_b: true }, false).unwrap();
    round_to_bf16(&mut want);
    let got = ex.activation(&g.tensors[op.outputs[0]].name).unwrap();
    assert_eq!(got, want);
    ex.backward().unwrap();
    let numerics = ex.precision_numerics();
    assert_eq!(numerics.len(), linears(&g).len() * 6, "two operands for each of three roles");
    let s = numerics.iter().find(|s| s.name == "layers.1.mlp.up" && s.role == GemmRole::Forward && s.operand == Operand::Activation).unwrap();
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    assert_eq!(s.numerics.amax, amax);
    assert_eq!(s.numerics.scale, tensor_scale(amax, Format::E4M3, 0));
    assert_eq!(s.numerics.elements, x.len() as u64);
    assert!(numerics.iter().filter(|s| s.operand == Operand::Gradient).all(|s| s.numerics.amax > 0.0 && s.numerics.nonfinite == 0));
}

/// An all-f32 plan changes nothing; BF16 and FP8 plans change the gradients by about
/// their precision, FP8 more than BF16.
#[test]
fn plans_change_gradients_by_their_precision() {
    let g = graph();
    let grads = |plan: Option<SitePlan>| {
        let mut ex = executor(&g);
        if let Some(p) = plan {
            ex.set_precision(&every_site(&g, p)).unwrap();
        }
        run(&mut ex, &g, 2);
        ex.grad("layers.0.attn.qkv.weight").ok().flatten().or_else(|| ex.grad("layers.0.attn.q.weight").unwrap()).unwrap()
    };
    let base = grads(None);
    assert_eq!(grads(Some(SitePlan::float(DType::F32))), base, "f32 plans are the unplanned run bit for bit");
    let rel = |v: &[f32]| {
        let d: f64 = v.iter().zip(&base).map(|(a, b)| f64::from(a - b).powi(2)).sum();
        let n: f64 = base.iter().map(|b| f64::from(*b).powi(2)).sum();
        (d / n).sqrt()
    };
    let bf16 = rel(&grads(Some(SitePlan::float(DType::BF16))));
    let f8 = rel(&grads(Some(hybrid(Scaling::Current { margin: 0 }))));
    assert!(bf16 > 0.0 && bf16 < 0.02, "bf16 gradient error {bf16}");
    assert!(f8 > 2.0 * bf16 && f8 < 0.5, "fp8 gradient error {f8} vs bf16 {bf16}");
}

/// Delayed scaling: the first step takes the current amax (no cold start); later steps
/// take `max / max(history)`; a reset forgets the history.
#[test]
fn delayed_scaling_follows_the_amax_history() {
    let g = graph();
    let mut ex = executor(&g);
    let delayed = Scaling::Delayed { history: 4, reduction: AmaxReduction::Max, margin: 1 };
    ex.set_precision(&every_site(&g, hybrid(delayed))).unwrap();
    let h = AdamW { lr: 1e-2, ..runner_exec::executor::ADAMW_DEFAULT };
    let pick = |ex: &Executor<Cpu>| {
        ex.precision_numerics().into_iter().find(|s| s.name == "layers.0.mlp.down" && s.role == GemmRole::Forward && s.operand == Operand::Activation).unwrap().numerics
    };
    let mut amaxes = Vec::new();
    for step in 0..6 {
        run(&mut ex, &g, step);
        let n = pick(&ex);
        let want = if amaxes.is_empty() {
            tensor_scale(n.amax, Format::E4M3, 1)
        } else {
            let recent: Vec<f32> = amaxes.iter().rev().take(4).copied().collect();
            tensor_scale(recent.iter().copied().fold(0.0, f32::max), Format::E4M3, 1)
        };
        assert_eq!(n.scale, want, "step {step}");
        amaxes.push(n.amax);
        ex.reduce_gradients().unwrap();
        ex.optimizer_step(&h).unwrap();
        ex.end_precision_step();
    }
    let oi = g.ops.iter().position(|o| o.name == "layers.0.mlp.down").unwrap();
    ex.reset_amax(oi, &[]);
    run(&mut ex, &g, 9);
    let n = pick(&ex);
    assert_eq!(n.scale, tensor_scale(n.amax, Format::E4M3, 1), "after a reset the step's own amax");
}

/// Faults reach the numerics: an outlier raises the amax by its factor, a NaN is counted
/// and makes the loss non-finite; each fires once.
#[test]
fn injected_faults_show_in_the_numerics() {
    let g = graph();
    let mut ex = executor(&g);
    ex.set_precision(&every_site(&g, hybrid(Scaling::Current { margin: 0 }))).unwrap();
    run(&mut ex, &g, 1);
    let amax0 = ex.precision_numerics().iter().find(|s| s.name == "layers.1.mlp.down" && s.role == GemmRole::Forward && s.operand == Operand::Activation).unwrap().numerics.amax;
    ex.end_precision_step();
    let fault = |kind| Fault { op: "layers.1.mlp.down".into(), role: GemmRole::Forward, operand: Operand::Activation, kind };
    ex.inject(fault(FaultKind::Outlier(1000.0))).unwrap();
    run(&mut ex, &g, 1);
    let n = ex.precision_numerics().into_iter().find(|s| s.name == "layers.1.mlp.down" && s.role == GemmRole::Forward && s.operand == Operand::Activation).unwrap().numerics;
    assert!((n.amax / amax0 - 1000.0).abs() < 1.0, "{} vs {amax0}", n.amax);
    ex.end_precision_step();
    ex.inject(fault(FaultKind::Nan)).unwrap();
    let loss = run(&mut ex, &g, 1);
    assert!(!loss.is_finite());
    assert!(ex.precision_numerics().iter().any(|s| s.name == "layers.1.mlp.down" && s.numerics.nonfinite > 0));
    ex.end_precision_step();
    assert!(run(&mut ex, &g, 1).is_finite(), "a fault fires once");
    assert!(ex.inject(Fault { op: "embed".into(), ..fault(FaultKind::Nan) }).is_err());
}

/// A snapshot brings back weights, moments and step, so training after a restore
/// repeats bit for bit.
#[test]
fn restore_replays_training_exactly() {
    let g = graph();
    let mut ex = executor(&g);
    ex.set_precision(&every_site(&g, hybrid(Scaling::Delayed { history: 8, reduction: AmaxReduction::Max, margin: 0 }))).unwrap();
    let h = runner_exec::executor::ADAMW_DEFAULT;
    let step = |ex: &mut Executor<Cpu>, s: u32| {
        let l = run(ex, &g, s);
        ex.reduce_gradients().unwrap();
        ex.optimizer_step(&h).unwrap();
        ex.end_precision_step();
        l
    };
    step(&mut ex, 0);
    let snap = ex.snapshot().unwrap();
    let a: Vec<f32> = (1..4).map(|s| step(&mut ex, s)).collect();
    ex.restore(&snap).unwrap();
    let b: Vec<f32> = (1..4).map(|s| step(&mut ex, s)).collect();
    assert_eq!(a, b);
    assert!(snap.bytes() > 0);
}

#[test]
fn plans_the_executor_cannot_run_are_refused() {
    let g = graph();
    let mut ex = executor(&g);
    let mut p = hybrid(Scaling::Current { margin: 0 });
    p.activation.hadamard = 16;
    let e = ex.set_precision(&[("layers.0.mlp.up".into(), GemmRole::Forward, p)]).unwrap_err().to_string();
    assert!(e.contains("Hadamard"), "{e}");
    let e = ex.set_precision(&[("layers.0.mlp.up".into(), GemmRole::WeightGradient, p)]).unwrap_err().to_string();
    assert!(e.contains("both inputs"), "{e}");
    let e = ex.set_precision(&[("nope".into(), GemmRole::Forward, p)]).unwrap_err().to_string();
    assert!(e.contains("no such op"), "{e}");
    let mut q = hybrid(Scaling::None);
    q.weight.format = DType::F32;
    assert!(ex.set_precision(&[("layers.0.mlp.up".into(), GemmRole::Forward, q)]).unwrap_err().to_string().contains("scaling"));
}
