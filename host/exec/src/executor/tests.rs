//! Whole-model tests of the executor on the CPU: gradients against f64 finite
//! differences, training, timing, memory accounting and input errors.

use std::collections::HashMap;

use runner_graph::{Graph, TensorKind};

use super::*;
use crate::cpu::Cpu;
use crate::proxy::synthetic_inputs;
use crate::timing::{TimingOptions, time_steps};
use crate::toy::{self, ToyConfig};

fn inputs_of(data: &[(String, Vec<u32>, Vec<f32>)]) -> Vec<(&str, Input<'_>)> {
    data.iter()
        .map(|(n, u, _)| (n.as_str(), Input::U32(u)))
        .collect()
}

/// Run forward + backward, then compare sampled weight gradients with central
/// differences of the f64 reference loss.
///
/// The executor runs in f32 and the reference in f64 on the same (f32-representable)
/// weights. FD in f64 with h = 1e-4 is accurate to ~1e-8 (truncation h² · f''' and
/// rounding 1e-16/h), so the difference is the executor's f32 rounding, ~1e-6 of the
/// gradient's scale. The tolerance, 1e-3 relative plus 1e-4 of the largest gradient
/// anywhere, is 100x that yet far below what a wrong or missing contribution gives
/// (O(1) relative).
fn grad_check(g: &Graph, seed: u64) {
    grad_check_with(g, seed, |_| ());
}

/// [`grad_check`] after `prepare` (e.g. setting weights) on the executor; the gradients.
pub(super) fn grad_check_with(
    g: &Graph,
    seed: u64,
    prepare: impl FnOnce(&mut Executor<Cpu>),
) -> HashMap<String, Vec<f32>> {
    let mut ex = Executor::new(
        g,
        Cpu::new(),
        ExecOptions {
            seed,
            ..ExecOptions::default()
        },
    )
    .unwrap();
    prepare(&mut ex);
    let data = synthetic_inputs(g, seed + 1);
    let loss = ex.forward(&inputs_of(&data)).unwrap();
    ex.backward().unwrap();
    let ints: HashMap<String, Vec<u32>> = data
        .iter()
        .map(|(n, u, _)| (n.clone(), u.clone()))
        .collect();
    let mut weights: HashMap<String, Vec<f64>> = HashMap::new();
    for t in g.tensors.iter().filter(|t| t.kind == TensorKind::Weight) {
        weights.insert(
            t.name.clone(),
            ex.weight(&t.name)
                .unwrap()
                .iter()
                .map(|&x| f64::from(x))
                .collect(),
        );
    }
    let ref_loss = crate::reference::loss(g, &weights, &ints);
    assert!(
        (f64::from(loss) - ref_loss).abs() < 1e-4 * ref_loss.abs().max(1.0),
        "loss {loss} vs reference {ref_loss}"
    );

    let names = ex.trainable();
    let grads: HashMap<String, Vec<f32>> = names
        .iter()
        .map(|n| {
            (
                n.clone(),
                ex.grad(n)
                    .unwrap()
                    .unwrap_or_else(|| panic!("no gradient for {n}")),
            )
        })
        .collect();
    let gmax = grads.values().flatten().fold(0f32, |m, &x| m.max(x.abs())) as f64;
    assert!(gmax > 0.0);
    let h = 1e-4;
    let mut checked = 0;
    for name in &names {
        let gr = &grads[name];
        assert!(
            gr.iter().all(|x| x.is_finite()),
            "{name}: non-finite gradient (an unwritten, NaN-poisoned element?)"
        );
        // The three largest entries (certainly exercised) and two spread-out ones.
        let mut order: Vec<usize> = (0..gr.len()).collect();
        order.sort_by(|&a, &b| gr[b].abs().total_cmp(&gr[a].abs()));
        let mut picks: Vec<usize> = order.iter().take(3).copied().collect();
        picks.extend([gr.len() / 3, (2 * gr.len()) / 3 + 1].map(|i| i.min(gr.len() - 1)));
        for &i in &picks {
            let orig = weights[name][i];
            let mut eval = |x: f64| {
                weights.get_mut(name).unwrap()[i] = x;
                crate::reference::loss(g, &weights, &ints)
            };
            let fd = (eval(orig + h) - eval(orig - h)) / (2.0 * h);
            eval(orig);
            let got = f64::from(gr[i]);
            let tol = 1e-3 * fd.abs() + 1e-4 * gmax;
            assert!(
                (got - fd).abs() <= tol,
                "{name}[{i}]: executor {got:e}, finite difference {fd:e} (tol {tol:e})"
            );
            checked += 1;
        }
    }
    assert!(checked >= 5 * names.len());
    grads
}

fn small() -> ToyConfig {
    ToyConfig {
        hidden: 16,
        ffn: 32,
        ..ToyConfig::tiny()
    }
}

#[test]
fn gradients_match_finite_differences_llama() {
    grad_check(&toy::llama(&small()), 1);
}

/// Qwen3's per-head q/k RMSNorms: each gain (D) normalises every head of every token
/// (rows = B·T·H of a (B,T,H,D) tensor), so its gradient sums over the heads, and the
/// projections' gradients pass back through the norm and RoPE.
#[test]
fn gradients_match_finite_differences_qk_norm() {
    let g = toy::llama(&ToyConfig { qk_norm: true, ..small() });
    assert!(g.tensor_id("layers.1.attn.k_norm.weight").is_some());
    grad_check(&g, 6);
}

#[test]
fn gradients_accumulate_through_tied_embeddings_and_mtp() {
    // Tied head + one MTP module: embed.weight collects gradients from two embeddings
    // and two heads, the last hidden state feeds the final norm and the MTP module, and
    // the MTP module concatenates.
    let cfg = ToyConfig {
        layers: 1,
        tied: true,
        mtp: 1,
        ..small()
    };
    grad_check(&toy::llama(&cfg), 2);
}

#[test]
fn gradients_match_finite_differences_moe() {
    let cfg = ToyConfig {
        layers: 1,
        moe: Some((4, 2, 16)),
        ..small()
    };
    grad_check(&toy::llama(&cfg), 3);
}

/// The toy Mamba-2 with weights at scales where every path matters: matrices
/// N(0, 0.3²) (the default 0.02 leaves the mixer's output a rounding error next to the
/// residual), a_log and dt_bias N(0, 0.5²) (decays across (0, 1)), d about 1, the conv's
/// bias nonzero.
fn mamba_weights(ex: &mut Executor<Cpu>) {
    let g = ex.graph().clone();
    let mut rng = SplitMix(99);
    for t in g.tensors.iter().filter(|t| t.kind == TensorKind::Weight) {
        let mut v = vec![0f32; t.numel() as usize];
        let norm = t.name.ends_with("norm.weight");
        rng.normals(&mut v, if t.shape.len() == 2 { 0.3 } else { 0.5 });
        if norm || t.name.ends_with(".scan.d") {
            v.iter_mut().for_each(|x| *x += 1.0);
        }
        ex.set_weight(&t.name, &v).unwrap();
    }
}

/// Both Mamba ops through the executor, forward (the loss against the f64 interpreter)
/// and backward (every weight against differences of it): two layers, so the conv and
/// the scan get their input gradients from a later layer and pass theirs on; T = 5 over
/// chunks of 4 (uneven), two groups of two heads.
#[test]
fn gradients_match_finite_differences_mamba() {
    let cfg = ToyConfig { seq: 5, ..small() };
    let g = toy::mamba(&cfg);
    let grads = grad_check_with(&g, 5, mamba_weights);
    // The check's absolute term (1e-4 of the largest gradient) must not hide the scan's
    // and the conv's weights: it stays under 2 % of each one's largest entry (the
    // smallest, layer 1's d, is 0.8 % of the largest gradient, layer 0's conv weight).
    let gmax = grads.values().flatten().fold(0f32, |m, &x| m.max(x.abs()));
    for (name, gr) in &grads {
        if name.contains(".mixer.scan.") || name.contains(".mixer.conv.") {
            let m = gr.iter().fold(0f32, |m, &x| m.max(x.abs()));
            assert!(m >= 5e-3 * gmax, "{name}: largest gradient {m} of {gmax}");
        }
    }
}

/// Gradients that several readers add up, through the Mamba ops' two write modes: layer
/// 0's gate reads the conv's output as z and layer 1's gate reads the conv's input, so
/// the scan's dx and the conv's dx add into what the gates wrote (staged); layer 1's conv
/// and scan read layer 0's weights (layer 0's gradients add into layer 1's); each scan
/// reads its B as C too (a second gradient of one tensor from one op).
#[test]
fn mamba_gradients_accumulate_into_shared_inputs() {
    use runner_graph::OpKind;
    let mut g = toy::mamba(&ToyConfig { seq: 5, ..small() });
    let find = |g: &Graph, name: &str| g.ops.iter().position(|o| o.name == name).unwrap();
    for l in 0..2 {
        let scan = find(&g, &format!("layers.{l}.mixer.scan"));
        assert_eq!(g.ops[scan].kind, OpKind::SsmScan);
        g.ops[scan].inputs[3] = g.ops[scan].inputs[2];
    }
    for op in ["conv", "scan"] {
        let (a, b) = (
            find(&g, &format!("layers.0.mixer.{op}")),
            find(&g, &format!("layers.1.mixer.{op}")),
        );
        let first = if op == "conv" { 1 } else { 4 };
        for slot in first..g.ops[a].inputs.len() {
            g.ops[b].inputs[slot] = g.ops[a].inputs[slot];
        }
    }
    for (l, z) in [(0, "conv"), (1, "x")] {
        let gate = find(&g, &format!("layers.{l}.mixer.gate"));
        g.ops[gate].inputs[0] = g.ops[find(&g, &format!("layers.{l}.mixer.{z}"))].outputs[0];
    }
    let grads = grad_check_with(&g, 6, mamba_weights);
    assert!(
        grads.contains_key("layers.0.mixer.scan.a_log")
            && !grads.contains_key("layers.1.mixer.scan.a_log")
    );
    for unread in ["layers.0.mixer.c.weight", "layers.0.mixer.z.weight"] {
        assert!(!grads.contains_key(unread), "{unread} is no longer read");
    }
}

#[test]
fn training_on_a_repeating_sequence_lowers_the_loss() {
    let g = toy::llama(&ToyConfig::tiny());
    let mut ex = Executor::new(&g, Cpu::new(), ExecOptions::default()).unwrap();
    let data = toy::batch_inputs(&g, 0);
    let inputs: Vec<(&str, Input<'_>)> = data
        .iter()
        .map(|(n, v)| (n.as_str(), Input::U32(v)))
        .collect();
    let h = AdamW {
        lr: 1e-2,
        weight_decay: 0.0,
        ..ADAMW_DEFAULT
    };
    let first = ex.step(&inputs, &h).unwrap();
    let mut last = first;
    for _ in 0..29 {
        last = ex.step(&inputs, &h).unwrap();
    }
    assert!(
        last < 0.5 * first,
        "loss {first} -> {last} after 30 AdamW steps"
    );
    assert_eq!(ex.steps_taken(), 30);
}

#[test]
fn moe_model_trains() {
    let g = toy::llama(&ToyConfig {
        layers: 1,
        moe: Some((4, 2, 32)),
        ..ToyConfig::tiny()
    });
    let mut ex = Executor::new(&g, Cpu::new(), ExecOptions::default()).unwrap();
    let data = toy::batch_inputs(&g, 0);
    let inputs: Vec<(&str, Input<'_>)> = data
        .iter()
        .map(|(n, v)| (n.as_str(), Input::U32(v)))
        .collect();
    let h = AdamW {
        lr: 1e-2,
        weight_decay: 0.0,
        ..ADAMW_DEFAULT
    };
    let first = ex.step(&inputs, &h).unwrap();
    let last = (0..19)
        .map(|_| ex.step(&inputs, &h).unwrap())
        .last()
        .unwrap();
    assert!(last < 0.7 * first, "loss {first} -> {last}");
}

#[test]
fn timing_harness_reports_sane_medians() {
    let g = toy::llama(&small());
    let mut ex = Executor::new(&g, Cpu::new(), ExecOptions::default()).unwrap();
    let data = synthetic_inputs(&g, 0);
    let t = time_steps(
        &mut ex,
        &inputs_of(&data),
        &ADAMW_DEFAULT,
        TimingOptions {
            warmup: 1,
            repeats: 3,
        },
        &mut |_, _, _| {},
    )
    .unwrap();
    // Every phase was timed on each repeat (warm-up left out). The order of the
    // percentiles holds for any sorted list; timing.rs's tests pin their values.
    for s in [t.step, t.forward, t.backward, t.optimizer] {
        assert!(s.median > 0.0 && s.n == 3, "{s:?}");
    }
    assert_eq!(t.communication.median, 0.0);
    // The phases fit in the step. Medians of the parts need not sum below the median of
    // the totals (that flaked under load); minima must: the fastest step's phases are each
    // at least their own minimum.
    assert!(t.forward.min + t.backward.min + t.optimizer.min <= t.step.min);
    assert_eq!(t.ops.len(), g.ops.len());
    let core = t
        .ops
        .iter()
        .find(|o| o.name == "layers.0.attn.core")
        .unwrap();
    assert!(core.forward.median > 0.0 && core.backward.median > 0.0);
    assert_eq!(t.losses.len(), 3);
}

#[test]
fn peak_memory_within_one_and_a_half_of_live_tensors() {
    for g in [
        toy::llama(&ToyConfig::tiny()),
        toy::llama(&ToyConfig {
            layers: 1,
            moe: Some((4, 2, 32)),
            ..ToyConfig::tiny()
        }),
        toy::mamba(&ToyConfig::tiny()),
    ] {
        let mut ex = Executor::new(&g, Cpu::new(), ExecOptions::default()).unwrap();
        let data = synthetic_inputs(&g, 0);
        ex.step(&inputs_of(&data), &ADAMW_DEFAULT).unwrap();
        let m = ex.memory();
        assert!(
            m.peak_bytes as f64 <= 1.5 * m.required_bytes as f64,
            "{m:?}"
        );
        assert!(m.required_bytes < m.keep_everything_bytes, "{m:?}");
        // After the step only weights, their gradients, moments and inputs remain.
        let held = ex.device().memory().current_bytes;
        let inputs: u64 = g
            .tensors
            .iter()
            .filter(|t| t.kind == TensorKind::Input)
            .map(|t| t.numel() * 4)
            .sum();
        // The loss scalar stays for the caller until the next forward; the executor's
        // constants: the loss gradient's 1 and AdamW's scalars.
        assert_eq!(held, 4 * m.param_bytes + inputs + 4 + CONSTANT_BYTES, "activations leaked");
    }
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let g = toy::llama(&small());
    let mut ex = Executor::new(&g, Cpu::new(), ExecOptions::default()).unwrap();
    let (mut tokens, targets) = toy::repeating_batch(&g, 0);
    let good = tokens.clone();
    tokens[3] = 64; // vocab is 64
    let e = ex
        .forward(&[
            ("tokens", Input::U32(&tokens)),
            ("targets", Input::U32(&targets)),
        ])
        .unwrap_err();
    assert!(
        matches!(e, ExecError::Input(_)) && e.to_string().contains("'tokens' holds id 64"),
        "{e}"
    );
    let mut bad_t = targets.clone();
    bad_t[0] = 1000;
    let e = ex
        .forward(&[
            ("tokens", Input::U32(&good)),
            ("targets", Input::U32(&bad_t)),
        ])
        .unwrap_err();
    assert!(e.to_string().contains("targets"), "{e}");
    let e = ex.forward(&[("tokens", Input::U32(&good))]).unwrap_err();
    assert!(e.to_string().contains("missing input(s): targets"), "{e}");
    let e = ex
        .forward(&[
            ("tokens", Input::U32(&good[1..])),
            ("targets", Input::U32(&targets)),
        ])
        .unwrap_err();
    assert!(e.to_string().contains("needs 16 values"), "{e}");
    assert!(
        ex.backward().is_err(),
        "backward without a successful forward"
    );
    // Still usable afterwards.
    let loss = ex
        .step(
            &[
                ("tokens", Input::U32(&good)),
                ("targets", Input::U32(&targets)),
            ],
            &ADAMW_DEFAULT,
        )
        .unwrap();
    assert!(loss.is_finite());
}

/// Normals filled in parallel chunks equal the one-thread sequence value for value, for
/// lengths around the chunk size (odd ones included), and the generator continues where
/// the one-thread fill would.
#[test]
fn parallel_normals_equal_the_sequential_stream() {
    for len in [0usize, 1, 7, (1 << 16) - 1, 1 << 16, (1 << 16) + 1, 3 * (1 << 16) + 5] {
        let (mut par, mut seq) = (SplitMix(42), SplitMix(42));
        let mut a = vec![0f32; len];
        par.normals(&mut a, 0.02);
        let mut b = vec![0f32; len];
        seq.fill_pairs(&mut b, 0.02);
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "len {len}");
        assert_eq!(par.next_u64(), seq.next_u64(), "len {len}: the stream continues in step");
    }
}

/// A block of a tensor, filled on its own, holds the values the whole tensor's fill
/// puts there: blocks along either axis of a matrix, at odd and even offsets (a value
/// is half of a Box-Muller pair), a 3-d block, and rows past the first axis's end (a
/// padded vocabulary) continuing the stream.
#[test]
fn a_block_of_the_stream_equals_that_block_of_the_whole() {
    let (full, rows, cols) = ([7u64, 5, 9], 7usize, 45usize);
    let mut whole = vec![0f32; 9 * cols];
    SplitMix(7).normals(&mut whole, 0.02);
    let at = |r: usize, c: usize| whole[r * cols + c];
    // (start, local) as 2-d blocks of the (rows + 2, 45) view: the whole, column halves
    // at even and odd offsets, one odd-width column, row blocks, two rows past the end.
    for (start, local) in [([0u64, 0], [7u64, 45]), ([0, 0], [7, 22]), ([0, 23], [7, 22]), ([0, 17], [7, 1]), ([3, 0], [4, 45]), ([6, 5], [3, 11])] {
        let mut got = vec![f32::NAN; (local[0] * local[1]) as usize];
        SplitMix(7).normals_block(&mut got, &[rows as u64, cols as u64], &start, &local, 0.02);
        for r in 0..local[0] as usize {
            for c in 0..local[1] as usize {
                let want = at(start[0] as usize + r, start[1] as usize + c);
                assert_eq!(got[r * local[1] as usize + c].to_bits(), want.to_bits(), "block {start:?}+{local:?} at ({r}, {c})");
            }
        }
    }
    // (7, 5, 9): the block [2..5, 1..4, 3..8].
    let mut got = vec![f32::NAN; 3 * 3 * 5];
    SplitMix(7).normals_block(&mut got, &full, &[2, 1, 3], &[3, 3, 5], 0.02);
    for (i, g) in got.iter().enumerate() {
        let (a, b, c) = (2 + i / 15, 1 + i / 5 % 3, 3 + i % 5);
        assert_eq!(g.to_bits(), whole[(a * 5 + b) * 9 + c].to_bits(), "3-d block at ({a}, {b}, {c})");
    }
}

#[test]
fn init_is_deterministic_and_by_name() {
    let a = Executor::new(&toy::llama(&small()), Cpu::new(), ExecOptions::default()).unwrap();
    let b = Executor::new(
        &toy::llama(&ToyConfig {
            layers: 1,
            ..small()
        }),
        Cpu::new(),
        ExecOptions::default(),
    )
    .unwrap();
    assert_eq!(
        a.weight("layers.0.attn.q.weight").unwrap(),
        b.weight("layers.0.attn.q.weight").unwrap()
    );
    assert!(
        a.weight("final_norm.weight")
            .unwrap()
            .iter()
            .all(|&x| x == 1.0)
    );
    let q = a.weight("layers.0.attn.q.weight").unwrap();
    let std = (q.iter().map(|x| x * x).sum::<f32>() / q.len() as f32).sqrt();
    assert!((std - 0.02).abs() < 0.004, "std {std}");
}

/// The ops the llama and MoE toys do not use: LayerNorm, biased linears, GELU,
/// squared ReLU, GeGLU, and a `concat` whose first operand broadcasts over the batch.
fn gpt_style() -> Graph {
    use runner_graph::{Attr, DType::*, NamedOp, OpKind, Role, Tensor, TensorKind::*};
    let t = |n: &str, s: &[u64], d, k| Tensor {
        name: n.into(),
        shape: s.to_vec(),
        dtype: d,
        kind: k,
    };
    let op = |n: &str, kind, i: &[&str], attrs: Vec<(&str, Attr)>| NamedOp {
        name: n.into(),
        kind,
        inputs: i.iter().map(|s| s.to_string()).collect(),
        outputs: vec![n.to_string()],
        attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        layer: 0,
        role: Role::Replicated,
    };
    let (b, s, c, f, v) = (2, 4, 8, 12, 16);
    Graph::new(
        vec![
            t("tokens", &[b, s], I32, Input),
            t("targets", &[b, s], I32, Input),
            t("embed.weight", &[v, c], BF16, Weight),
            t("embed", &[b, s, c], BF16, Activation),
            t("ln.weight", &[c], BF16, Weight),
            t("ln.bias", &[c], BF16, Weight),
            t("ln", &[b, s, c], BF16, Activation),
            t("up.weight", &[f, c], BF16, Weight),
            t("up.bias", &[f], BF16, Weight),
            t("up", &[b, s, f], BF16, Activation),
            t("gelu", &[b, s, f], BF16, Activation),
            t("sq", &[b, s, f], BF16, Activation),
            t("geglu", &[b, s, f], BF16, Activation),
            t("prefix", &[1, s, 4], BF16, Weight),
            t("cat", &[b, s, f + 4], BF16, Activation),
            t("head.weight", &[v, f + 4], BF16, Weight),
            t("head.bias", &[v], BF16, Weight),
            t("head", &[b, s, v], BF16, Activation),
            t("loss", &[], F32, Activation),
        ],
        vec![
            op(
                "embed",
                OpKind::Embedding,
                &["tokens", "embed.weight"],
                vec![],
            ),
            op(
                "ln",
                OpKind::LayerNorm,
                &["embed", "ln.weight", "ln.bias"],
                vec![("eps", Attr::Float(1e-5))],
            ),
            op(
                "up",
                OpKind::Linear,
                &["ln", "up.weight", "up.bias"],
                vec![],
            ),
            op("gelu", OpKind::Gelu, &["up"], vec![]),
            op("sq", OpKind::SquaredRelu, &["up"], vec![]),
            op("geglu", OpKind::GeGlu, &["gelu", "sq"], vec![]),
            op("cat", OpKind::Concat, &["geglu", "prefix"], vec![]),
            op(
                "head",
                OpKind::Linear,
                &["cat", "head.weight", "head.bias"],
                vec![],
            ),
            NamedOp {
                outputs: vec!["loss".into()],
                ..op("loss", OpKind::CrossEntropy, &["head", "targets"], vec![])
            },
        ],
        "loss",
    )
    .unwrap()
}

#[test]
fn gradients_match_finite_differences_gpt_style_ops() {
    grad_check(&gpt_style(), 4);
}

#[test]
fn bf16_storage_is_emulated_exactly_when_asked() {
    let g = toy::llama(&small());
    let data = synthetic_inputs(&g, 3);
    let run = |emulate: bool| {
        let opts = ExecOptions {
            emulate_storage: emulate,
            ..ExecOptions::default()
        };
        let mut ex = Executor::new(&g, Cpu::new(), opts).unwrap();
        let loss = ex.forward(&inputs_of(&data)).unwrap();
        (ex, loss)
    };
    let (exact, loss_exact) = run(true);
    let (_, loss_f32) = run(false);
    let mut checked = 0;
    for t in g
        .tensors
        .iter()
        .filter(|t| t.kind == TensorKind::Activation && t.dtype == runner_graph::DType::BF16)
    {
        let Ok(values) = exact.activation(&t.name) else {
            continue;
        };
        for v in values {
            // A bf16 value is an f32 whose low 16 bits are zero.
            assert_eq!(
                v.to_bits() & 0xFFFF,
                0,
                "{} holds {v}, not a bf16 value",
                t.name
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 5,
        "only {checked} bf16 activations were live to check"
    );
    // Rounding every activation to 8 mantissa bits moves the loss, but only a little.
    assert!(loss_exact != loss_f32, "emulation changed nothing");
    assert!(
        (loss_exact - loss_f32).abs() < 0.01 * loss_f32.abs(),
        "{loss_exact} vs {loss_f32}"
    );
}

/// Loss, every weight gradient, and the recompute record of one forward + backward.
fn run_with(
    g: &Graph,
    recompute: RecomputePolicy,
) -> (f32, HashMap<String, Vec<f32>>, Executor<Cpu>) {
    let mut ex = Executor::new(
        g,
        Cpu::new(),
        ExecOptions {
            seed: 7,
            recompute,
            ..ExecOptions::default()
        },
    )
    .unwrap();
    let data = synthetic_inputs(g, 8);
    let loss = ex.forward(&inputs_of(&data)).unwrap();
    ex.backward().unwrap();
    let grads = ex
        .trainable()
        .into_iter()
        .map(|w| (w.clone(), ex.grad(&w).unwrap().unwrap()))
        .collect();
    (loss, grads, ex)
}

/// Recomputation changes when values are made, not what they are: the loss and every
/// gradient are bit-identical to keeping everything, the re-run ops are exactly the
/// ones the FLOP counter charges (each once), and the measured peak drops.
#[test]
fn recompute_reruns_what_the_counter_charges_and_changes_no_gradient() {
    use runner_graph::count::{AttentionFlops, op_cost};
    use runner_graph::recompute::recompute_flops;
    for g in [
        toy::llama(&ToyConfig::tiny()),
        toy::llama(&ToyConfig {
            layers: 1,
            tied: true,
            mtp: 1,
            ..small()
        }),
        toy::llama(&ToyConfig {
            layers: 2,
            moe: Some((4, 2, 32)),
            ..ToyConfig::tiny()
        }),
        toy::mamba(&ToyConfig::tiny()),
    ] {
        let (loss, grads, base) = run_with(&g, RecomputePolicy::None);
        assert!(base.profile().recomputed_ops.is_empty());
        for policy in [RecomputePolicy::Selective, RecomputePolicy::Full] {
            let (l, gr, ex) = run_with(&g, policy);
            assert_eq!(l.to_bits(), loss.to_bits(), "{policy:?}: loss");
            for (name, want) in &grads {
                assert!(
                    gr[name]
                        .iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{policy:?}: gradient of {name} differs"
                );
            }
            let mut rerun = ex.profile().recomputed_ops.clone();
            let n = rerun.len();
            rerun.sort_unstable();
            rerun.dedup();
            assert_eq!(rerun.len(), n, "{policy:?}: an op re-ran twice");
            let want_ops: Vec<usize> = g
                .ops
                .iter()
                .enumerate()
                .filter(|(_, op)| match policy {
                    RecomputePolicy::Selective => op.kind == runner_graph::OpKind::Attention,
                    _ => op.layer >= 0,
                })
                .map(|(i, _)| i)
                .collect();
            assert_eq!(rerun, want_ops, "{policy:?}: re-run ops");
            let flops: f64 = rerun
                .iter()
                .map(|&oi| op_cost(&g, &g.ops[oi], AttentionFlops::CausalHalved))
                .filter(|c| c.matrix)
                .map(|c| c.fwd_flops)
                .sum();
            let counted = recompute_flops(&g, policy, AttentionFlops::CausalHalved);
            assert!(
                (flops - counted).abs() <= 1e-9 * counted,
                "{policy:?}: re-ran {flops} FLOPs, the counter charges {counted}"
            );
            let (m0, m1) = (base.memory(), ex.memory());
            assert!(
                m1.peak_bytes as f64 <= 1.5 * m1.required_bytes as f64,
                "{policy:?}: {m1:?}"
            );
            if policy == RecomputePolicy::Full {
                assert!(
                    m1.peak_bytes < m0.peak_bytes && m1.required_bytes < m0.required_bytes,
                    "full recompute keeps less: {m1:?} vs {m0:?}"
                );
            } else {
                assert!(m1.peak_bytes <= m0.peak_bytes, "{m1:?} vs {m0:?}");
            }
        }
    }
}

/// Without recomputation the schedule frees exactly what the backward plan frees.
#[test]
fn no_recompute_schedule_is_the_plans_liveness() {
    let g = toy::llama(&ToyConfig {
        layers: 1,
        tied: true,
        mtp: 1,
        ..small()
    });
    let ex = Executor::new(&g, Cpu::new(), ExecOptions::default()).unwrap();
    let (p, s) = (ex.plan(), ex.recompute_schedule());
    let sorted = |v: &[Vec<usize>]| -> Vec<Vec<usize>> {
        v.iter()
            .map(|x| {
                let mut x = x.clone();
                x.sort_unstable();
                x
            })
            .collect()
    };
    assert_eq!(sorted(&s.free_after_forward), sorted(&p.free_after_forward));
    assert_eq!(
        sorted(&s.free_saved_after_step),
        sorted(&p.free_saved_after_step)
    );
    assert!(s.segments.is_empty() && s.dropped.is_empty());
}

/// Training with full recomputation follows the same trajectory, step for step, and
/// holds no activation between steps.
#[test]
fn training_with_full_recompute_tracks_keeping_everything() {
    let g = toy::llama(&ToyConfig::tiny());
    let data = synthetic_inputs(&g, 4);
    let losses = |policy| {
        let mut ex = Executor::new(
            &g,
            Cpu::new(),
            ExecOptions {
                recompute: policy,
                ..ExecOptions::default()
            },
        )
        .unwrap();
        let l: Vec<u32> = (0..3)
            .map(|_| {
                ex.step(&inputs_of(&data), &ADAMW_DEFAULT)
                    .unwrap()
                    .to_bits()
            })
            .collect();
        let m = ex.memory();
        let inputs: u64 = g
            .tensors
            .iter()
            .filter(|t| t.kind == TensorKind::Input)
            .map(|t| t.numel() * 4)
            .sum();
        assert_eq!(
            ex.device().memory().current_bytes,
            4 * m.param_bytes + inputs + 4 + CONSTANT_BYTES,
            "{policy:?}: activations leaked"
        );
        l
    };
    assert_eq!(losses(RecomputePolicy::Full), losses(RecomputePolicy::None));
}

/// Activations declared FP8 (per-tensor current scaling), MXFP8 (32-element E8M0
/// blocks) or F16 are stored as exactly those formats hold them when emulating storage.
#[test]
fn fp8_mxfp8_and_f16_storage_are_emulated_exactly() {
    use runner_graph::DType;
    use runner_kernels::cpu::precision::{
        Fp8Format, MX_BLOCK, fp8_decode, fp8_encode, mx_scale_rceil,
    };
    let base = toy::llama(&small());
    for dtype in [DType::Fp8E4M3, DType::Fp8E5M2, DType::MxFp8, DType::F16] {
        let mut g = base.clone();
        for t in &mut g.tensors {
            if t.kind == TensorKind::Activation && t.dtype == DType::BF16 {
                t.dtype = dtype;
            }
        }
        let data = synthetic_inputs(&g, 3);
        let opts = ExecOptions {
            emulate_storage: true,
            ..ExecOptions::default()
        };
        let mut ex = Executor::new(&g, Cpu::new(), opts).unwrap();
        let loss = ex.forward(&inputs_of(&data)).unwrap();
        assert!(loss.is_finite(), "{dtype:?}: loss {loss}");
        let mut checked = 0;
        for t in g.tensors.iter().filter(|t| t.dtype == dtype) {
            let Ok(v) = ex.activation(&t.name) else {
                continue;
            };
            let on_grid = |y: f32, f: Fp8Format| fp8_decode(fp8_encode(y, f, true), f) == y;
            match dtype {
                DType::Fp8E4M3 | DType::Fp8E5M2 => {
                    let f = if dtype == DType::Fp8E4M3 {
                        Fp8Format::E4M3
                    } else {
                        Fp8Format::E5M2
                    };
                    // The stored tensor's own amax sits at the format's maximum.
                    let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
                    let scale = f.max_finite() / amax;
                    let off = v
                        .iter()
                        .filter(|&&x| {
                            let y = x * scale;
                            !(on_grid(y, f)
                                || on_grid(f32::from_bits(y.to_bits() + 1), f)
                                || on_grid(f32::from_bits(y.to_bits().saturating_sub(1)), f))
                        })
                        .count();
                    assert_eq!(off, 0, "{}: {off} values off the {f:?} grid", t.name);
                }
                DType::MxFp8 => {
                    let row = *t.shape.last().unwrap() as usize;
                    for r in v.chunks(row) {
                        for b in r.chunks(MX_BLOCK) {
                            let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
                            // Stored values re-derive the same block scale (RCEIL of their
                            // own amax) and sit on its E4M3 grid exactly.
                            let s = mx_scale_rceil(amax, Fp8Format::E4M3);
                            assert!(
                                b.iter().all(|&x| on_grid(x / s, Fp8Format::E4M3)),
                                "{}: block off the MXFP8 grid",
                                t.name
                            );
                        }
                    }
                }
                _ => {
                    for x in v {
                        assert_eq!(half::f16::from_f32(x).to_f32(), x, "{}: {x}", t.name);
                    }
                }
            }
            checked += 1;
        }
        assert!(
            checked >= 3,
            "{dtype:?}: only {checked} activations checked"
        );
    }
}

/// Two micro-batches with gradient accumulation give the gradients (and the AdamW
/// update) of the one batch that holds both: the step is the mean over micro-batches.
#[test]
fn micro_batches_accumulate_to_the_full_batch_step() {
    let cfg = ToyConfig::tiny();
    let half = toy::llama(&ToyConfig {
        batch: 1,
        ..cfg.clone()
    });
    let whole = toy::llama(&cfg);
    let data = synthetic_inputs(&whole, 21);
    // The whole batch's rows split into two micro-batches of one sequence each.
    let split = |k: usize| -> Vec<(String, Vec<u32>, Vec<f32>)> {
        data.iter()
            .map(|(n, u, f)| {
                let h = u.len() / 2;
                (n.clone(), u[k * h..(k + 1) * h].to_vec(), f.clone())
            })
            .collect()
    };
    let (a, b) = (split(0), split(1));
    let mut full = Executor::new(&whole, Cpu::new(), ExecOptions::default()).unwrap();
    let mut micro = Executor::new(&half, Cpu::new(), ExecOptions::default()).unwrap();
    let loss = full.forward(&inputs_of(&data)).unwrap();
    full.backward().unwrap();
    let want: HashMap<String, Vec<f32>> = full
        .trainable()
        .into_iter()
        .map(|w| (w.clone(), full.grad(&w).unwrap().unwrap()))
        .collect();
    // Accumulated gradients before the division: the sum of the two micro-batches'.
    let la = micro.forward(&inputs_of(&a)).unwrap();
    micro.backward().unwrap();
    let ga: HashMap<String, Vec<f32>> = want
        .keys()
        .map(|w| (w.clone(), micro.grad(w).unwrap().unwrap()))
        .collect();
    let lb = micro.forward(&inputs_of(&b)).unwrap();
    micro.backward_accumulate().unwrap();
    assert!(
        (0.5 * (la + lb) - loss).abs() <= 1e-5 * loss.abs(),
        "{la} {lb} {loss}"
    );
    for (w, g) in &want {
        let sum = micro.grad(w).unwrap().unwrap();
        let mean: Vec<f32> = sum.iter().map(|x| 0.5 * x).collect();
        let scale = g.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
        let worst = mean
            .iter()
            .zip(g)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1e-5 * scale, "{w}: {worst:e} vs {scale:e}");
        assert!(ga[w] != sum, "{w}: the second micro-batch added nothing");
    }
    // The whole step: same update as the full batch.
    let mut micro = Executor::new(&half, Cpu::new(), ExecOptions::default()).unwrap();
    let got = micro
        .step_micro_batches(&[inputs_of(&a), inputs_of(&b)], &ADAMW_DEFAULT)
        .unwrap();
    full.reduce_gradients().unwrap();
    full.optimizer_step(&ADAMW_DEFAULT).unwrap();
    assert!((got - loss).abs() <= 1e-5 * loss.abs());
    for w in want.keys() {
        let (x, y) = (micro.weight(w).unwrap(), full.weight(w).unwrap());
        let worst = x
            .iter()
            .zip(&y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-6,
            "{w}: weights differ by {worst:e} after the step"
        );
    }
    assert!(micro.step_micro_batches(&[], &ADAMW_DEFAULT).is_err());
}

/// Gradients that several readers add up, through the kernels that write several input
/// gradients at once (each staged when the step accumulates, then added in): in a
/// two-layer MoE model, layer 1's attention reads layer 0's v, layer 1's expert SwiGLU
/// reads layer 0's up rows and layer 1's combine reads layer 0's router weights, so
/// layer 0's attention dv, SwiGLU du and combine dweights add into what layer 1's
/// backward wrote. Dropping one staged contribution (a missing `settle`) leaves that
/// gradient wrong by it.
#[test]
fn attention_swiglu_and_combine_gradients_accumulate_into_shared_inputs() {
    use runner_graph::OpKind;
    let cfg = ToyConfig { layers: 2, moe: Some((4, 2, 16)), ..small() };
    let mut g = toy::llama(&cfg);
    let find = |g: &Graph, name: &str| g.ops.iter().position(|o| o.name == name).unwrap();
    for (op, kind, slot) in [("attn.core", OpKind::Attention, 2), ("moe.experts.act", OpKind::SwiGlu, 1), ("moe.combine", OpKind::MoeCombine, 1)] {
        let (a, b) = (find(&g, &format!("layers.0.{op}")), find(&g, &format!("layers.1.{op}")));
        assert_eq!((g.ops[a].kind, g.ops[b].kind), (kind, kind));
        g.ops[b].inputs[slot] = g.ops[a].inputs[slot];
    }
    // Seed 3: no router score within the finite difference's step of a top-k tie (seed
    // 7 has one, where the difference jumps and no gradient matches it).
    let grads = grad_check_with(&g, 3, |_| ());
    for unread in ["layers.1.attn.v.weight", "layers.1.moe.experts.up.weight"] {
        assert!(!grads.contains_key(unread), "{unread} is no longer read");
    }
}

/// A linear's bias in the forward: the GPT-style graph with every weight, biases
/// included, nonzero (a zero bias, the default init, hides a forward that skips it:
/// the loss against the f64 reference and every gradient then agree either way).
#[test]
fn gradients_match_finite_differences_with_nonzero_biases() {
    let grads = grad_check_with(&gpt_style(), 8, |ex| {
        let g = ex.graph().clone();
        let mut rng = SplitMix(7);
        for t in g.tensors.iter().filter(|t| t.kind == TensorKind::Weight) {
            let mut v = vec![0f32; t.numel() as usize];
            rng.normals(&mut v, 0.5);
            if t.name == "ln.weight" {
                v.iter_mut().for_each(|x| *x += 1.0);
            }
            ex.set_weight(&t.name, &v).unwrap();
        }
    });
    assert!(grads.contains_key("up.bias") && grads.contains_key("head.bias"));
}

/// Attention made sharp (q, k, v and out projections ×8, so the scores and what they
/// mix move the loss) with and without a sliding window of 3 over the 8 tokens: the
/// executor's forward loss equals the f64 reference's within 1e-6 (they agree to ~3e-8;
/// the reference ignoring the window is off by 8e-4, RoPE at twice its θ by 7.6e-6,
/// both below the 1e-4 the gradient checks allow), and the windowed gradients match
/// finite differences.
#[test]
fn sharp_and_windowed_attention_matches_the_reference_closely() {
    let sharpen = |ex: &mut Executor<Cpu>| {
        for n in ex.trainable().into_iter().filter(|n| [".attn.q.", ".attn.k.", ".attn.v.", ".attn.out."].iter().any(|p| n.contains(p))) {
            let w: Vec<f32> = ex.weight(&n).unwrap().iter().map(|x| x * 8.0).collect();
            ex.set_weight(&n, &w).unwrap();
        }
    };
    for window in [0, 3] {
        let mut g = toy::llama(&small());
        for o in g.ops.iter_mut().filter(|o| o.kind == runner_graph::OpKind::Attention) {
            o.attrs.insert("window".into(), runner_graph::Attr::Int(window));
        }
        let mut ex = Executor::new(&g, Cpu::new(), ExecOptions { seed: 1, ..ExecOptions::default() }).unwrap();
        sharpen(&mut ex);
        let data = synthetic_inputs(&g, 2);
        let loss = f64::from(ex.forward(&inputs_of(&data)).unwrap());
        let ints: HashMap<String, Vec<u32>> = data.iter().map(|(n, u, _)| (n.clone(), u.clone())).collect();
        let weights: HashMap<String, Vec<f64>> = g
            .tensors
            .iter()
            .filter(|t| t.kind == TensorKind::Weight)
            .map(|t| (t.name.clone(), ex.weight(&t.name).unwrap().iter().map(|&x| f64::from(x)).collect()))
            .collect();
        let want = crate::reference::loss(&g, &weights, &ints);
        assert!((loss - want).abs() <= 1e-6 * want.abs(), "window {window}: loss {loss} vs reference {want}");
        if window > 0 {
            grad_check_with(&g, 1, sharpen);
        }
    }
}
