//! Muon on the CPU: Newton–Schulz and the whole update against f64 references written
//! from the papers' formulas (not from the device code), which weights take Muon, a toy
//! run that learns, the state it keeps, snapshots, and the refusals.

use std::collections::HashMap;

use runner_graph::TensorKind;

use super::*;
use crate::cpu::Cpu;
use crate::device::adamw_scalars;
use crate::proxy::synthetic_inputs;
use crate::toy::{self, ToyConfig};

fn inputs_of(data: &[(String, Vec<u32>, Vec<f32>)]) -> Vec<(&str, Input<'_>)> {
    data.iter().map(|(n, u, _)| (n.as_str(), Input::U32(u))).collect()
}

/// Normal draws from the executor's own generator (scaled by `std`).
fn randn(n: usize, seed: u64, std: f32) -> Vec<f32> {
    let mut out = vec![0f32; n];
    SplitMix(seed).normals(&mut out, std);
    out
}

/// (m × k) · (k × n), row-major, in f64.
fn mm(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += x * b[p * n + j];
            }
        }
    }
    c
}

fn transpose(a: &[f64], m: usize, n: usize) -> Vec<f64> {
    let mut t = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            t[j * m + i] = a[i * n + j];
        }
    }
    t
}

/// Keller Jordan's `zeropower_via_newtonschulz5` in f64, transposing a tall matrix as
/// his code does (`if G.size(-2) > G.size(-1): X = X.mT`).
fn ns_reference(u: &[f32], rows: usize, cols: usize, steps: u32) -> Vec<f64> {
    let (a, b, c) = (3.4445f64, -4.7750f64, 2.0315f64);
    let norm = u.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
    let mut x: Vec<f64> = u.iter().map(|&v| f64::from(v) / (norm + 1e-7)).collect();
    let tall = rows > cols;
    let (m, n) = if tall { (cols, rows) } else { (rows, cols) };
    if tall {
        x = transpose(&x, rows, cols);
    }
    for _ in 0..steps {
        let aa = mm(&x, &transpose(&x, m, n), m, n, m);
        let a2 = mm(&aa, &aa, m, m, m);
        let bm: Vec<f64> = aa.iter().zip(&a2).map(|(p, q)| b * p + c * q).collect();
        let bx = mm(&bm, &x, m, m, n);
        x = x.iter().zip(&bx).map(|(p, q)| a * p + q).collect();
    }
    if tall { transpose(&x, m, n) } else { x }
}

/// Eigenvalues of a symmetric s × s matrix (cyclic Jacobi rotations).
fn sym_eigenvalues(mut a: Vec<f64>, s: usize) -> Vec<f64> {
    for _ in 0..100 {
        let off: f64 = (0..s).flat_map(|i| (0..s).filter(move |&j| j != i).map(move |j| (i, j))).map(|(i, j)| a[i * s + j].powi(2)).sum();
        if off < 1e-22 {
            break;
        }
        for p in 0..s {
            for q in p + 1..s {
                let apq = a[p * s + q];
                if apq.abs() < 1e-300 {
                    continue;
                }
                let theta = (a[q * s + q] - a[p * s + p]) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let (c, sn) = (1.0 / (t * t + 1.0).sqrt(), t / (t * t + 1.0).sqrt());
                for k in 0..s {
                    let (akp, akq) = (a[k * s + p], a[k * s + q]);
                    a[k * s + p] = c * akp - sn * akq;
                    a[k * s + q] = sn * akp + c * akq;
                }
                for k in 0..s {
                    let (apk, aqk) = (a[p * s + k], a[q * s + k]);
                    a[p * s + k] = c * apk - sn * aqk;
                    a[q * s + k] = sn * apk + c * aqk;
                }
            }
        }
    }
    (0..s).map(|i| a[i * s + i]).collect()
}

/// Singular values of a rows × cols matrix: √ of the eigenvalues of its short side's Gram.
fn singular_values(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let (m, n, y) = if rows <= cols { (rows, cols, x.to_vec()) } else { (cols, rows, transpose(x, rows, cols)) };
    sym_eigenvalues(mm(&y, &transpose(&y, m, n), m, n, m), m).into_iter().map(|e| e.max(0.0).sqrt()).collect()
}

fn run_ns(u: &[f32], rows: usize, cols: usize, steps: u32) -> Vec<f32> {
    let dev = Cpu::new();
    let mut x = dev.alloc(Elem::F32, u.len()).unwrap();
    dev.write_f32(&mut x, u).unwrap();
    newton_schulz(&dev, &mut x, rows, cols, steps).unwrap();
    dev.read_f32(&x).unwrap()
}

/// The largest difference over the largest value of `want`.
fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
    got.iter().zip(want).map(|(&g, &w)| (f64::from(g) - w).abs()).fold(0.0, f64::max) / scale
}

/// Tall, wide and square random matrices: the device composition (GEMMs, scales, adds;
/// a tall matrix iterated untransposed) is the reference's iteration on the transposed
/// matrix to f32 rounding (~1e-6 of the largest entry; a wrong coefficient, a missing
/// transpose or a skipped step moves entries by O(0.1)).
#[test]
fn newton_schulz_matches_the_f64_reference_tall_wide_and_square() {
    for (i, &(rows, cols)) in [(24usize, 9usize), (9, 24), (16, 16), (1, 7), (7, 1)].iter().enumerate() {
        let u = randn(rows * cols, 11 + i as u64, 0.3);
        let got = run_ns(&u, rows, cols, 5);
        let want = ns_reference(&u, rows, cols, 5);
        let e = rel_err(&got, &want);
        assert!(e < 2e-5, "{rows} x {cols}: relative error {e}");
    }
    // A zero update stays zero (the ε), rather than dividing 0 by 0.
    assert!(run_ns(&[0.0; 12], 3, 4, 5).iter().all(|&x| x == 0.0));
}

/// Keller's quintic brings a well-conditioned matrix's singular values into about
/// [0.68, 1.13] in 5 steps (his post: "S' ∈ [0.68, 1.13]"; the band the quintic
/// settles into reaches 1.1326, hence 1.135 here), from 1/‖U‖_F-scaled ones far below
/// 1; the input's own spread is checked so the test sees the iteration work.
#[test]
fn newton_schulz_brings_singular_values_near_one() {
    for (rows, cols) in [(16usize, 48usize), (48, 16), (24, 24)] {
        // A random Gaussian with a known spread: rows of U scaled by 1..2.
        let mut u = randn(rows * cols, 5, 1.0);
        // Better conditioned than a square Gaussian: add a multiple of a partial identity.
        for i in 0..rows.min(cols) {
            u[i * cols + i] += 8.0;
        }
        let before = singular_values(&ns_reference(&u, rows, cols, 0), rows, cols);
        let max_before = before.iter().copied().fold(0.0, f64::max);
        assert!(max_before < 0.5, "{rows} x {cols}: the normalised input's singular values {before:?} are all below 1");
        let sv = singular_values(&run_ns(&u, rows, cols, 5).iter().map(|&x| f64::from(x)).collect::<Vec<_>>(), rows, cols);
        assert_eq!(sv.len(), rows.min(cols));
        for s in &sv {
            assert!((0.675..=1.135).contains(s), "{rows} x {cols}: singular value {s} of {sv:?}");
        }
    }
}

/// Moonlight's update written out in f64: momentum, Nesterov, Newton–Schulz, the
/// 0.2·√max(m, n) scale and decoupled weight decay.
#[allow(clippy::too_many_arguments)]
fn update_reference(w: &[f32], g: &[f32], b: &[f32], rows: usize, cols: usize, mu: f64, lr: f64, wd: f64) -> (Vec<f64>, Vec<f64>) {
    let b1: Vec<f64> = b.iter().zip(g).map(|(&b, &g)| mu * f64::from(b) + f64::from(g)).collect();
    let u: Vec<f32> = g.iter().zip(&b1).map(|(&g, &b)| (f64::from(g) + mu * b) as f32).collect();
    let o = ns_reference(&u, rows, cols, 5);
    let scale = lr * 0.2 * (rows.max(cols) as f64).sqrt();
    let w1 = w.iter().zip(&o).map(|(&w, &o)| f64::from(w) * (1.0 - lr * wd) - scale * o).collect();
    (w1, b1)
}

/// One update of a small matrix with a momentum already held: weight and momentum
/// as the f64 reference gives them.
#[test]
fn one_muon_update_matches_the_whole_f64_reference() {
    let dev = Cpu::new();
    for (rows, cols) in [(6usize, 10usize), (10, 6)] {
        let n = rows * cols;
        let (w, g, b) = (randn(n, 1, 0.02), randn(n, 2, 1e-3), randn(n, 3, 1e-3));
        let h = AdamW { lr: 0.01, weight_decay: 0.1, ..ADAMW_DEFAULT };
        let mut bufs = [&w, &g, &b].map(|x| {
            let mut d = dev.alloc(Elem::F32, n).unwrap();
            dev.write_f32(&mut d, x).unwrap();
            d
        });
        let [wb, gb, bb] = &mut bufs;
        let s = adamw_scalars(&dev, &h, 1).unwrap();
        muon_update(&dev, wb, gb, bb, rows, cols, &MUON_DEFAULT, &s).unwrap();
        let (w1, b1) = update_reference(&w, &g, &b, rows, cols, 0.95, 0.01, 0.1);
        // The update moves w by lr·0.2·√10 ≈ 6e-3 per unit of O: compare the change.
        let dw: Vec<f32> = dev.read_f32(wb).unwrap().iter().zip(&w).map(|(a, b)| a - b).collect();
        let want_dw: Vec<f64> = w1.iter().zip(&w).map(|(a, &b)| a - f64::from(b)).collect();
        let e = rel_err(&dw, &want_dw);
        assert!(e < 1e-4, "{rows} x {cols}: weight change off by {e}");
        let e = rel_err(&dev.read_f32(bb).unwrap(), &b1);
        assert!(e < 1e-6, "{rows} x {cols}: momentum off by {e}");
        // Weight decay alone, had the update vanished, is a 1e-3 relative change; the
        // check above sees it: a run without it is off by far more than 1e-4.
        let no_decay = update_reference(&w, &g, &b, rows, cols, 0.95, 0.01, 0.0).0;
        let nd: Vec<f64> = no_decay.iter().zip(&w).map(|(a, &b)| a - f64::from(b)).collect();
        assert!(rel_err(&dw, &nd) > 1e-3, "the reference tells decay from none");
    }
}

/// The toy Llama's hidden matrices (the MoE router's linear among them, as Moonlight
/// has it) take Muon; the embedding, the head, a tied embedding, norms and 3-D expert
/// stacks take AdamW.
#[test]
fn only_hidden_matrices_take_muon() {
    for (tied, moe) in [(false, None), (true, None), (false, Some((4, 2, 32)))] {
        let g = toy::llama(&ToyConfig { tied, moe, layers: 1, ..ToyConfig::tiny() });
        let plan = backward_plan(&g).unwrap();
        let muon = muon_weights(&g, &plan.needs_grad);
        for (id, t) in g.tensors.iter().enumerate() {
            if t.kind != TensorKind::Weight {
                assert!(!muon[id], "{} is not a weight", t.name);
                continue;
            }
            let hidden = t.name.starts_with("layers.") && t.shape.len() == 2 && !t.name.contains("norm");
            assert_eq!(muon[id], hidden, "{} {:?} (tied {tied}, moe {moe:?})", t.name, t.shape);
        }
        assert!(muon.iter().filter(|&&m| m).count() >= 4, "attention's four projections at least");
    }
}

/// Under Muon a weight AdamW keeps (the embedding, the head, a norm) steps exactly as
/// under AdamW alone, and a hidden matrix does not; their steps from the same start
/// and the same first gradients.
#[test]
fn adamw_weights_step_as_under_adamw_and_matrices_do_not() {
    let g = toy::llama(&ToyConfig::tiny());
    let data = synthetic_inputs(&g, 0);
    let h = AdamW { lr: 1e-2, ..ADAMW_DEFAULT };
    let step = |opt: Optimizer| {
        let mut ex = Executor::new(&g, Cpu::new(), ExecOptions::default()).unwrap();
        ex.set_optimizer(opt).unwrap();
        ex.step(&inputs_of(&data), &h).unwrap();
        ex
    };
    let (a, m) = (step(Optimizer::AdamW), step(Optimizer::Muon(MUON_DEFAULT)));
    for w in ["embed.weight", "lm_head.weight", "final_norm.weight", "layers.0.attn_norm.weight"] {
        assert!(!m.takes_muon(w), "{w}");
        assert_eq!(a.weight(w).unwrap(), m.weight(w).unwrap(), "{w}: AdamW's update under both");
    }
    let w = "layers.0.attn.q.weight";
    assert!(m.takes_muon(w) && !a.takes_muon(w));
    assert_ne!(a.weight(w).unwrap(), m.weight(w).unwrap(), "{w}: Muon's update");
}

/// Two steps of the executor on the toy model: a hidden matrix moves as the f64
/// reference of Muon says, from its weight before the step, its gradients (the first
/// step's momentum carried into the second) and the step's learning rate and decay.
#[test]
fn executor_steps_apply_muon_to_hidden_matrices() {
    let g = toy::llama(&ToyConfig::tiny());
    let mut ex = Executor::new(&g, Cpu::new(), ExecOptions::default()).unwrap();
    ex.set_optimizer(Optimizer::Muon(MUON_DEFAULT)).unwrap();
    let name = "layers.1.mlp.down.weight";
    let id = g.tensor_id(name).unwrap();
    let (rows, cols) = (g.tensors[id].shape[0] as usize, g.tensors[id].shape[1] as usize);
    let mut b = vec![0f32; rows * cols];
    for (s, (lr, wd)) in [(0.02f32, 0.1f32), (0.01, 0.0)].into_iter().enumerate() {
        let data = synthetic_inputs(&g, s as u64);
        let w = ex.weight(name).unwrap();
        ex.step(&inputs_of(&data), &AdamW { lr, weight_decay: wd, ..ADAMW_DEFAULT }).unwrap();
        let grad = ex.grad(name).unwrap().unwrap();
        let (w1, b1) = update_reference(&w, &grad, &b, rows, cols, 0.95, f64::from(lr), f64::from(wd));
        let dw: Vec<f32> = ex.weight(name).unwrap().iter().zip(&w).map(|(a, b)| a - b).collect();
        let want: Vec<f64> = w1.iter().zip(&w).map(|(a, &b)| a - f64::from(b)).collect();
        let e = rel_err(&dw, &want);
        assert!(e < 1e-4, "step {s}: {name} moved off the reference by {e}");
        b = b1.iter().map(|&x| x as f32).collect();
    }
    assert_eq!(ex.steps_taken(), 2);
}

/// Muon trains the toy model on a repeating sequence as AdamW does (its test:
/// `training_on_a_repeating_sequence_lowers_the_loss`).
#[test]
fn training_with_muon_lowers_the_loss() {
    let g = toy::llama(&ToyConfig::tiny());
    let mut ex = Executor::new(&g, Cpu::new(), ExecOptions::default()).unwrap();
    ex.set_optimizer(Optimizer::Muon(MUON_DEFAULT)).unwrap();
    let data = toy::batch_inputs(&g, 0);
    let inputs: Vec<(&str, Input<'_>)> = data.iter().map(|(n, v)| (n.as_str(), Input::U32(v))).collect();
    let h = AdamW { lr: 1e-2, weight_decay: 0.0, ..ADAMW_DEFAULT };
    let first = ex.step(&inputs, &h).unwrap();
    let last = (0..29).map(|_| ex.step(&inputs, &h).unwrap()).last().unwrap();
    assert!(last < 0.5 * first, "loss {first} -> {last} after 30 Muon steps");
}

/// Muon keeps one momentum per matrix: the device holds one buffer fewer per matrix
/// than under AdamW, and the state the memory report counts says so too.
#[test]
fn muon_state_is_one_momentum_per_matrix() {
    let g = toy::llama(&ToyConfig::tiny());
    let data = synthetic_inputs(&g, 0);
    let plan = backward_plan(&g).unwrap();
    let matrices: u64 = muon_weights(&g, &plan.needs_grad).iter().zip(&g.tensors).filter(|(m, _)| **m).map(|(_, t)| 4 * t.numel()).sum();
    assert!(matrices > 0);
    let run = |opt: Optimizer| {
        let mut ex = Executor::new(&g, Cpu::new(), ExecOptions::default()).unwrap();
        ex.set_optimizer(opt).unwrap();
        ex.step(&inputs_of(&data), &ADAMW_DEFAULT).unwrap();
        (ex.device().memory().current_bytes, ex.memory())
    };
    let ((held_a, mem_a), (held_m, mem_m)) = (run(Optimizer::AdamW), run(Optimizer::Muon(MUON_DEFAULT)));
    assert_eq!(held_a - held_m, matrices, "bytes held after a step");
    assert_eq!(mem_a.state_bytes - mem_m.state_bytes, matrices, "{mem_a:?} {mem_m:?}");
    assert_eq!(mem_m.param_bytes, mem_a.param_bytes);
    // The scratch of the largest update is counted beside the state.
    assert!(mem_m.peak_bytes as f64 <= 1.5 * mem_m.required_bytes as f64, "{mem_m:?}");
    let (inputs, largest) = (
        g.tensors.iter().filter(|t| t.kind == TensorKind::Input).map(|t| 4 * t.numel()).sum::<u64>(),
        g.tensors.iter().zip(muon_weights(&g, &plan.needs_grad)).filter(|(_, m)| *m).map(|(t, _)| 4 * scratch_elems(t.shape[0] as usize, t.shape[1] as usize) as u64).max().unwrap(),
    );
    assert!(mem_m.required_bytes >= mem_m.state_bytes + inputs + largest, "{mem_m:?}");
}

/// A snapshot carries Muon's momentum: a run restored from step 2's snapshot into a
/// fresh executor and run on equals the uninterrupted run bit for bit (without the
/// momentum the third step would differ).
#[test]
fn muon_resumes_from_a_snapshot_bit_for_bit() {
    let g = toy::llama(&ToyConfig::tiny());
    let batches: Vec<_> = (0..4).map(|s| synthetic_inputs(&g, s)).collect();
    let h = AdamW { lr: 1e-2, ..ADAMW_DEFAULT };
    let fresh = || {
        let mut ex = Executor::new(&g, Cpu::new(), ExecOptions::default()).unwrap();
        ex.set_optimizer(Optimizer::Muon(MUON_DEFAULT)).unwrap();
        ex
    };
    let mut whole = fresh();
    let (mut snap, mut at2) = (None, HashMap::new());
    let mut losses = Vec::new();
    for (s, b) in batches.iter().enumerate() {
        if s == 2 {
            snap = Some(whole.snapshot().unwrap());
            at2 = whole.trainable().into_iter().map(|w| (w.clone(), whole.weight(&w).unwrap())).collect();
        }
        losses.push(whole.step(&inputs_of(b), &h).unwrap());
    }
    let snap = snap.unwrap();
    let mut resumed = fresh();
    resumed.restore(&snap).unwrap();
    for (s, b) in batches.iter().enumerate().skip(2) {
        assert_eq!(resumed.step(&inputs_of(b), &h).unwrap().to_bits(), losses[s].to_bits(), "step {s}'s loss");
    }
    for w in whole.trainable() {
        assert_eq!(whole.weight(&w).unwrap(), resumed.weight(&w).unwrap(), "{w}");
    }
    // Restoring a Muon snapshot under AdamW would leave the matrices' state behind.
    let mut adam = Executor::new(&g, Cpu::new(), ExecOptions::default()).unwrap();
    let e = adam.restore(&snap).unwrap_err().to_string();
    assert!(e.contains("snapshot of muon training restored into an executor training with adamw"), "{e}");
    // And the momentum matters: the resumed run from a snapshot whose momentum is lost
    // (a fresh Muon executor given only the weights) differs.
    let mut weights_only = fresh();
    for w in whole.trainable() {
        weights_only.set_weight(&w, &at2[&w]).unwrap();
    }
    for b in &batches[2..] {
        weights_only.step(&inputs_of(b), &h).unwrap();
    }
    assert_ne!(weights_only.weight("layers.0.attn.q.weight").unwrap(), whole.weight("layers.0.attn.q.weight").unwrap());
}

/// The optimizer is chosen before training, and Muon's settings are checked.
#[test]
fn the_optimizer_is_set_before_the_first_step_with_sane_settings() {
    let g = toy::llama(&ToyConfig::tiny());
    let data = synthetic_inputs(&g, 0);
    let mut ex = Executor::new(&g, Cpu::new(), ExecOptions::default()).unwrap();
    for bad in [Muon { momentum: 1.0, ..MUON_DEFAULT }, Muon { momentum: f32::NAN, ..MUON_DEFAULT }, Muon { ns_steps: 0, ..MUON_DEFAULT }] {
        let e = ex.set_optimizer(Optimizer::Muon(bad)).unwrap_err().to_string();
        assert!(e.contains("use a momentum in [0, 1) and 1..=100 steps"), "{e}");
    }
    // Muon, then back to AdamW: AdamW's moments return (its figures are AdamW's alone).
    ex.set_optimizer(Optimizer::Muon(MUON_DEFAULT)).unwrap();
    ex.set_optimizer(Optimizer::AdamW).unwrap();
    ex.step(&inputs_of(&data), &ADAMW_DEFAULT).unwrap();
    let mut plain = Executor::new(&g, Cpu::new(), ExecOptions::default()).unwrap();
    plain.step(&inputs_of(&data), &ADAMW_DEFAULT).unwrap();
    for w in ex.trainable() {
        assert_eq!(ex.weight(&w).unwrap(), plain.weight(&w).unwrap(), "{w}");
    }
    let e = ex.set_optimizer(Optimizer::Muon(MUON_DEFAULT)).unwrap_err().to_string();
    assert!(e.contains("the optimizer is chosen before the first step (1 taken)"), "{e}");
    // Muon reads nothing on the host, so graph mode takes it (graph.rs's tests run the
    // recorded step); the CPU's one blocker is that it cannot record.
    let mut graphed = Executor::new(&g, Cpu::new(), ExecOptions { cuda_graph: true, ..ExecOptions::default() }).unwrap();
    graphed.set_optimizer(Optimizer::Muon(MUON_DEFAULT)).unwrap();
    assert!(graphed.graph_blocker().is_some_and(|b| b.contains("--device cuda")), "{:?}", graphed.graph_blocker());
}

/// The deal of matrices over ranks: largest Newton–Schulz work first, each to the
/// least-loaded rank (ties to the lowest rank, equal work by name), so every rank of a
/// group computes the same owners; no rank ends more than the largest matrix's work
/// above another.
#[test]
fn matrices_are_dealt_largest_first_to_the_least_loaded_rank() {
    use super::muon::{deal, ns_work};
    let got: HashMap<&str, usize> = deal(vec![("c", 1), ("a", 10), ("d", 1), ("b", 9)], 2).into_iter().collect();
    // a (10) → 0; b (9) → 1; c (1) → 1 (9 < 10); d (1): 10 = 10, the lower rank → 0.
    assert_eq!(got, HashMap::from([("a", 0), ("b", 1), ("c", 1), ("d", 0)]));
    // The order the list comes in does not matter.
    let again: HashMap<&str, usize> = deal(vec![("b", 9), ("d", 1), ("a", 10), ("c", 1)], 2).into_iter().collect();
    assert_eq!(got, again);
    assert!(deal(vec![("x", 5), ("y", 7)], 1).iter().all(|&(_, r)| r == 0));
    // Work is the iteration's multiply-adds: X·Xᵀ and B'·X s·s·l each, A·A s³.
    assert_eq!(ns_work((4, 6)), 4 * 4 * (2 * 6 + 4));
    assert_eq!(ns_work((6, 4)), ns_work((4, 6)));
    assert_eq!(ns_work((usize::MAX, usize::MAX)), u128::MAX, "saturates, never overflows");
    // Balance: 40 matrices of assorted shapes over 3 ranks.
    let names: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
    let work: Vec<u128> = (0..40).map(|i| ns_work((16 + 8 * (i % 5), 32 + 16 * (i % 7)))).collect();
    let mut load = [0u128; 3];
    for (name, r) in deal(names.iter().map(String::as_str).zip(work.iter().copied()).collect(), 3) {
        load[r] += work[names.iter().position(|n| n == name).unwrap()];
    }
    let (lo, hi) = (load.iter().min().unwrap(), load.iter().max().unwrap());
    assert!(hi - lo <= *work.iter().max().unwrap(), "{load:?}");
}
