//! Tensor parallelism end to end on the CPU: shard a toy Llama at tp=2, run both ranks as
//! threads joined by a [`ThreadGroup`], and check the loss and the gathered weight
//! gradients against the unsharded graph.

use std::collections::HashMap;

use runner_exec::collective::{Collective, ThreadGroup};
use runner_exec::cpu::Cpu;
use runner_exec::proxy::synthetic_inputs;
use runner_exec::toy::{self, ToyConfig};
use runner_exec::{ExecOptions, Executor, Input};
use runner_graph::shard::{Layout, RankCoord, shard};
use runner_graph::{Graph, OpKind, Role, TensorKind};

/// The toy Llama with Megatron's parallel roles (the SDK builder's), the embedding, head
/// and loss vocab-parallel or replicated.
fn with_roles(mut g: Graph, vocab_parallel: bool) -> Graph {
    for op in &mut g.ops {
        let n = op.name.as_str();
        let ends = |s: &[&str]| s.iter().any(|x| n.ends_with(x));
        op.role = if ends(&[
            ".attn.q",
            ".attn.k",
            ".attn.v",
            ".mlp.gate",
            ".mlp.up",
            ".mlp.act",
        ]) {
            Role::ColumnParallel
        } else if ends(&[".attn.q_rope", ".attn.k_rope", ".attn.core"]) {
            Role::HeadParallel
        } else if ends(&[".attn.out", ".mlp.down"]) {
            Role::RowParallel
        } else if vocab_parallel && matches!(n, "embed" | "lm_head" | "loss") {
            Role::VocabParallel
        } else {
            Role::Replicated
        };
    }
    g
}

type Grads = HashMap<String, Vec<f32>>;

fn options() -> ExecOptions {
    ExecOptions {
        seed: 3,
        ..ExecOptions::default()
    }
}

/// Loss and every weight gradient of one forward + backward.
fn run(ex: &mut Executor<Cpu>, data: &[(String, Vec<u32>, Vec<f32>)]) -> (f32, Grads) {
    let inputs: Vec<(&str, Input<'_>)> = data
        .iter()
        .map(|(n, u, _)| (n.as_str(), Input::U32(u)))
        .collect();
    let loss = ex.forward(&inputs).unwrap();
    ex.backward().unwrap();
    let grads = ex
        .trainable()
        .into_iter()
        .map(|w| (w.clone(), ex.grad(&w).unwrap().unwrap()))
        .collect();
    (loss, grads)
}

/// The axis along which `local` splits `full` (None: replicated).
fn split_axis(full: &[u64], local: &[u64]) -> Option<usize> {
    assert_eq!(full.len(), local.len());
    full.iter().zip(local).position(|(f, l)| f != l)
}

/// Rank `r`'s part of `x` (shape `full`) along `axis`, `n` ranks.
fn slice<T: Copy>(x: &[T], full: &[u64], axis: usize, r: usize, n: usize) -> Vec<T> {
    let outer: usize = full[..axis].iter().product::<u64>() as usize;
    let inner: usize = full[axis..].iter().product::<u64>() as usize;
    let c = inner / n;
    (0..outer)
        .flat_map(|o| {
            x[o * inner + r * c..o * inner + (r + 1) * c]
                .iter()
                .copied()
        })
        .collect()
}

/// The ranks' parts concatenated along `axis` (inverse of [`slice`]).
fn gather(parts: &[Vec<f32>], full: &[u64], axis: usize) -> Vec<f32> {
    let outer: usize = full[..axis].iter().product::<u64>() as usize;
    let c = parts[0].len() / outer.max(1);
    (0..outer)
        .flat_map(|o| {
            parts
                .iter()
                .flat_map(move |p| p[o * c..(o + 1) * c].iter().copied())
        })
        .collect()
}

fn close(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= 1e-5 * scale,
        "{name}: max |Δ| {worst:e} against max |grad| {scale:e}"
    );
}

fn check_tp2(vocab_parallel: bool, sequence_parallel: bool) {
    let tp = 2usize;
    let g = with_roles(toy::llama(&ToyConfig::tiny()), vocab_parallel);
    // Random ids over the whole vocabulary, so both vocabulary shards see tokens and targets.
    let data = synthetic_inputs(&g, 11);
    let mut full = Executor::new(&g, Cpu::new(), options()).unwrap();
    let (loss, grads) = run(&mut full, &data);
    let weights: Grads = full
        .trainable()
        .into_iter()
        .map(|w| (w.clone(), full.weight(&w).unwrap()))
        .collect();

    let b = g.tensors[g.tensor_id("tokens").unwrap()].shape[0] as u32;
    let layout = Layout {
        tp: tp as u32,
        sequence_parallel,
        ..Layout::single(b, b)
    };
    let ranks: Vec<_> = ThreadGroup::new(tp)
        .into_iter()
        .enumerate()
        .map(|(r, handle)| {
            let s = shard(
                &g,
                &layout,
                RankCoord {
                    tp: r as u32,
                    ..RankCoord::default()
                },
            )
            .unwrap()
            .graph;
            let (g, weights, data) = (g.clone(), weights.clone(), data.clone());
            std::thread::spawn(move || {
                let kind = if sequence_parallel {
                    OpKind::ReduceScatter
                } else {
                    OpKind::AllReduce
                };
                assert!(
                    s.ops.iter().any(|o| o.kind == kind),
                    "the tp=2 graph has {kind:?}"
                );
                let groups: Vec<(String, Box<dyn Collective>)> =
                    vec![("tp".into(), Box::new(handle))];
                let mut ex = Executor::with_collectives(&s, Cpu::new(), options(), groups).unwrap();
                for t in s.tensors.iter().filter(|t| t.kind == TensorKind::Weight) {
                    let fshape = &g.tensors[g.tensor_id(&t.name).unwrap()].shape;
                    let w = &weights[&t.name];
                    let local = match split_axis(fshape, &t.shape) {
                        None => w.clone(),
                        Some(ax) => slice(w, fshape, ax, r, tp),
                    };
                    ex.set_weight(&t.name, &local).unwrap();
                }
                // Inputs split over the sequence (SP) take this rank's shard.
                let data: Vec<(String, Vec<u32>, Vec<f32>)> = data
                    .iter()
                    .map(|(n, u, f)| {
                        let fs = &g.tensors[g.tensor_id(n).unwrap()].shape;
                        let ls = &s.tensors[s.tensor_id(n).unwrap()].shape;
                        match split_axis(fs, ls) {
                            None => (n.clone(), u.clone(), f.clone()),
                            Some(ax) => (n.clone(), slice(u, fs, ax, r, tp), f.clone()),
                        }
                    })
                    .collect();
                let (loss, grads) = run(&mut ex, &data);
                let shapes: HashMap<String, Vec<u64>> = s
                    .tensors
                    .iter()
                    .map(|t| (t.name.clone(), t.shape.clone()))
                    .collect();
                (loss, grads, shapes)
            })
        })
        .collect();
    let out: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
    for (r, (l, _, _)) in out.iter().enumerate() {
        assert!(
            (l - loss).abs() <= 1e-5 * loss.abs(),
            "rank {r}: loss {l} vs unsharded {loss}"
        );
    }
    for (name, want) in &grads {
        let fshape = &g.tensors[g.tensor_id(name).unwrap()].shape;
        let lshape = &out[0].2[name];
        match split_axis(fshape, lshape) {
            None if sequence_parallel => {
                // Replicated weights see only this rank's tokens in the sequence-parallel
                // region: their gradients are partial sums, all-reduced over tp at the step
                // (Megatron's finalize_model_grads), here summed by hand.
                let mut sum = vec![0f32; want.len()];
                for (_, gr, _) in &out {
                    sum.iter_mut().zip(&gr[name]).for_each(|(a, b)| *a += b);
                }
                close(&format!("{name} (replicated, summed over tp)"), &sum, want);
            }
            None => {
                for (r, (_, gr, _)) in out.iter().enumerate() {
                    close(&format!("{name} (replicated, rank {r})"), &gr[name], want);
                }
            }
            Some(ax) => {
                let parts: Vec<Vec<f32>> = out.iter().map(|(_, gr, _)| gr[name].clone()).collect();
                close(
                    &format!("{name} (split on axis {ax})"),
                    &gather(&parts, fshape, ax),
                    want,
                );
            }
        }
    }
}

#[test]
fn tp2_matches_unsharded_with_replicated_head() {
    check_tp2(false, false);
}

#[test]
fn tp2_matches_unsharded_with_vocab_parallel_embedding_head_and_loss() {
    check_tp2(true, false);
}

#[test]
fn tp2_sequence_parallel_matches_unsharded() {
    check_tp2(true, true);
    check_tp2(false, true);
}

/// Three AdamW steps at tp=2 (vocab-parallel, no SP) track the unsharded run: every rank
/// updates its shard from the same gradients the unsharded graph has.
#[test]
fn tp2_training_steps_track_unsharded() {
    let tp = 2usize;
    let g = with_roles(toy::llama(&ToyConfig::tiny()), true);
    let data = synthetic_inputs(&g, 5);
    let inputs = |d: &[(String, Vec<u32>, Vec<f32>)]| -> Vec<(String, Vec<u32>)> {
        d.iter().map(|(n, u, _)| (n.clone(), u.clone())).collect()
    };
    let steps = |ex: &mut Executor<Cpu>, d: &[(String, Vec<u32>)]| -> Vec<f32> {
        let inp: Vec<(&str, Input<'_>)> =
            d.iter().map(|(n, u)| (n.as_str(), Input::U32(u))).collect();
        (0..3)
            .map(|_| {
                ex.step(&inp, &runner_exec::executor::ADAMW_DEFAULT)
                    .unwrap()
            })
            .collect()
    };
    let mut full = Executor::new(&g, Cpu::new(), options()).unwrap();
    let weights: Grads = full
        .trainable()
        .into_iter()
        .map(|w| (w.clone(), full.weight(&w).unwrap()))
        .collect();
    let want = steps(&mut full, &inputs(&data));
    let layout = Layout {
        tp: tp as u32,
        ..Layout::single(2, 2)
    };
    let hs: Vec<_> = ThreadGroup::new(tp)
        .into_iter()
        .enumerate()
        .map(|(r, handle)| {
            let s = shard(
                &g,
                &layout,
                RankCoord {
                    tp: r as u32,
                    ..RankCoord::default()
                },
            )
            .unwrap()
            .graph;
            let (g, weights, d) = (g.clone(), weights.clone(), inputs(&data));
            std::thread::spawn(move || {
                let groups: Vec<(String, Box<dyn Collective>)> =
                    vec![("tp".into(), Box::new(handle))];
                let mut ex = Executor::with_collectives(&s, Cpu::new(), options(), groups).unwrap();
                for t in s.tensors.iter().filter(|t| t.kind == TensorKind::Weight) {
                    let fshape = &g.tensors[g.tensor_id(&t.name).unwrap()].shape;
                    let w = &weights[&t.name];
                    let local = split_axis(fshape, &t.shape)
                        .map_or_else(|| w.clone(), |ax| slice(w, fshape, ax, r, tp));
                    ex.set_weight(&t.name, &local).unwrap();
                }
                steps(&mut ex, &d)
            })
        })
        .collect();
    for (r, h) in hs.into_iter().enumerate() {
        let got = h.join().unwrap();
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs(),
                "rank {r} step {i}: loss {a} vs unsharded {b}"
            );
        }
    }
    assert!(want[2] < want[0], "the toy model learns: {want:?}");
}

/// A sharded rank bounds its token and target ids by the whole vocabulary, not its shard.
#[test]
fn vocab_parallel_ids_are_bounded_by_the_whole_vocabulary() {
    let g = with_roles(toy::llama(&ToyConfig::tiny()), true);
    let layout = Layout {
        tp: 2,
        ..Layout::single(2, 2)
    };
    let s = shard(
        &g,
        &layout,
        RankCoord {
            tp: 1,
            ..RankCoord::default()
        },
    )
    .unwrap()
    .graph;
    let bounds = runner_exec::executor::int_bounds_of(&s);
    for name in ["tokens", "targets"] {
        assert_eq!(bounds[&s.tensor_id(name).unwrap()].0, 64, "{name}");
    }
    let groups: Vec<(String, Box<dyn Collective>)> =
        vec![("tp".into(), Box::new(ThreadGroup::new(2).remove(1)))];
    let mut ex = Executor::with_collectives(&s, Cpu::new(), options(), groups).unwrap();
    let ids = vec![64u32; 16];
    let err = ex
        .forward(&[("tokens", Input::U32(&ids)), ("targets", Input::U32(&ids))])
        .unwrap_err()
        .to_string();
    assert!(err.contains("id 64"), "{err}");
}
