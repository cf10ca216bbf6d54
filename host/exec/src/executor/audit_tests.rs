//! Executor tests from the gradient audit: planned gradients rounded to their output
//! format bit for bit, the attention window, the router's `normalize` attribute, and
//! the zero gradient of an op output that reaches the loss only through integers.

use runner_graph::{Attr, DType, Graph, NamedOp, OpKind, Role, Tensor, TensorKind};
use runner_kernels::cpu::precision::round_to_bf16;

use super::*;
use crate::cpu::Cpu;
use crate::precision::{GemmRole, SitePlan};

fn t(name: &str, shape: &[u64], dtype: DType, kind: TensorKind) -> Tensor {
    Tensor { name: name.into(), shape: shape.to_vec(), dtype, kind }
}

fn op(name: &str, kind: OpKind, inputs: &[&str], outputs: &[&str], attrs: &[(&str, Attr)]) -> NamedOp {
    NamedOp::of(name, kind, inputs, outputs, attrs, 0, Role::Replicated)
}

fn executor(g: &Graph) -> Executor<Cpu> {
    Executor::new(g, Cpu::new(), ExecOptions { seed: 11, ..ExecOptions::default() }).unwrap()
}

/// Values of order one that no short mantissa holds (a bf16 rounding moves them).
fn wave(n: usize, f: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 * f).sin() + 0.3 * (i as f32 * 0.37 + 0.1).cos()) * 0.9).collect()
}

/// F32 operands (each quantised copy holds the value itself) and a result kept in bf16.
fn bf16_output() -> SitePlan {
    SitePlan { output: DType::BF16, ..SitePlan::float(DType::F32) }
}

fn rounded(v: &[f32]) -> Vec<f32> {
    let mut r = v.to_vec();
    round_to_bf16(&mut r);
    r
}

const M: usize = 6;
const K: usize = 5;
const N: usize = 7;

/// y = x Wᵀ (x (M, K) and W (N, K) weights, so both gradients are handed out) under a
/// mean cross-entropy.
fn linear_graph() -> Graph {
    Graph::new(
        vec![
            t("x", &[M as u64, K as u64], DType::F32, TensorKind::Weight),
            t("w", &[N as u64, K as u64], DType::F32, TensorKind::Weight),
            t("targets", &[M as u64], DType::I32, TensorKind::Input),
            t("y", &[M as u64, N as u64], DType::F32, TensorKind::Activation),
            t("loss", &[], DType::F32, TensorKind::Activation),
        ],
        vec![
            op("y", OpKind::Linear, &["x", "w"], &["y"], &[]),
            op("loss", OpKind::CrossEntropy, &["y", "targets"], &["loss"], &[]),
        ],
        "loss",
    )
    .unwrap()
}

/// Experts E = 3 over R = 7 rows sorted by expert (3, 0 and 4 rows: expert 1 idle), X (R, K)
/// and W (E, N, K) weights.
const ROWS: [usize; 3] = [3, 0, 4];

fn grouped_graph() -> Graph {
    let r = ROWS.iter().sum::<usize>() as u64;
    Graph::new(
        vec![
            t("x", &[r, K as u64], DType::F32, TensorKind::Weight),
            t("w", &[ROWS.len() as u64, N as u64, K as u64], DType::F32, TensorKind::Weight),
            t("idx", &[r, 1], DType::I32, TensorKind::Input),
            t("targets", &[r], DType::I32, TensorKind::Input),
            t("y", &[r, N as u64], DType::F32, TensorKind::Activation),
            t("loss", &[], DType::F32, TensorKind::Activation),
        ],
        vec![
            op("y", OpKind::GroupedLinear, &["x", "w", "idx"], &["y"], &[]),
            op("loss", OpKind::CrossEntropy, &["y", "targets"], &["loss"], &[]),
        ],
        "loss",
    )
    .unwrap()
}

/// The gradients of x and w after one forward and backward of `g` (a linear or grouped
/// linear "y" over x and w) with `plans` for y's (role, plan).
fn gemm_grads(g: &Graph, plans: &[(GemmRole, SitePlan)]) -> (Vec<f32>, Vec<f32>) {
    let mut ex = executor(g);
    let sites: Vec<(String, GemmRole, SitePlan)> = plans.iter().map(|(r, p)| ("y".to_string(), *r, *p)).collect();
    ex.set_precision(&sites).unwrap();
    let (xn, wn) = (g.tensors[g.tensor_id("x").unwrap()].numel() as usize, g.tensors[g.tensor_id("w").unwrap()].numel() as usize);
    ex.set_weight("x", &wave(xn, 0.71)).unwrap();
    ex.set_weight("w", &wave(wn, 1.13)).unwrap();
    let rows = g.tensors[g.tensor_id("targets").unwrap()].numel() as usize;
    let targets: Vec<u32> = (0..rows as u32).map(|i| (i * 3 + 1) % N as u32).collect();
    let idx: Vec<u32> = ROWS.iter().enumerate().flat_map(|(e, &n)| std::iter::repeat_n(e as u32, n)).collect();
    let mut inputs = vec![("targets", Input::U32(&targets))];
    if g.tensor_id("idx").is_some() {
        inputs.push(("idx", Input::U32(&idx)));
    }
    ex.forward(&inputs).unwrap();
    ex.backward().unwrap();
    (ex.grad("x").unwrap().unwrap(), ex.grad("w").unwrap().unwrap())
}

/// A planned input-gradient (weight-gradient) GEMM whose output format is bf16 gives
/// exactly the unplanned f32 dX (dW) rounded to bf16, each role by its own plan: the other
/// gradient stays the f32 one bit for bit. With f32 operands the quantised copies hold
/// the values themselves, so the rounding is the only difference, and the f32 gradients
/// are not bf16 values (the rounding is seen).
fn check_rounded_gradients(g: &Graph, what: &str) {
    let (dx, dw) = gemm_grads(g, &[]);
    assert_ne!(rounded(&dx), dx, "{what}: dX already bf16");
    assert_ne!(rounded(&dw), dw, "{what}: dW already bf16");
    let forward = (GemmRole::Forward, SitePlan::float(DType::F32));
    let dgrad = (GemmRole::InputGradient, bf16_output());
    let wgrad = (GemmRole::WeightGradient, bf16_output());
    let (px, pw) = gemm_grads(g, &[forward, dgrad, wgrad]);
    assert_eq!(px, rounded(&dx), "{what}: dX under a bf16 input-gradient output");
    assert_eq!(pw, rounded(&dw), "{what}: dW under a bf16 weight-gradient output");
    let (px, pw) = gemm_grads(g, &[dgrad]);
    assert_eq!((px, pw), (rounded(&dx), dw.clone()), "{what}: only the input gradient planned in bf16");
    let (px, pw) = gemm_grads(g, &[wgrad]);
    assert_eq!((px, pw), (dx.clone(), rounded(&dw)), "{what}: only the weight gradient planned in bf16");
}

#[test]
fn a_linears_planned_gradients_are_rounded_to_their_output_format() {
    check_rounded_gradients(&linear_graph(), "linear");
}

#[test]
fn a_grouped_linears_planned_gradients_are_rounded_to_their_output_format() {
    let (_, dw) = gemm_grads(&grouped_graph(), &[]);
    assert!(dw[N * K..2 * N * K].iter().all(|v| *v == 0.0), "the idle expert's gradient");
    check_rounded_gradients(&grouped_graph(), "grouped linear");
}
