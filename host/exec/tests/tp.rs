//! Tensor parallelism end to end on the CPU: shard a toy Llama at tp=2, run both ranks as
//! threads joined by a [`ThreadGroup`], and check the loss and the gathered weight
//! gradients against the unsharded graph.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{
    Data, Grads, close, counted, gather, load_weights, mesh, options, priced_elems, rank_inputs,
    run, split_axis, train, weights, with_roles,
};
use runner_exec::collective::{Collective, ThreadGroup};
use runner_exec::cpu::Cpu;
use runner_exec::proxy::synthetic_inputs;
use runner_exec::toy::{self, ToyConfig};
use runner_exec::{Executor, Input};
use runner_graph::shard::{Layout, RankCoord, shard};
use runner_graph::{Graph, OpKind};

/// Shard `g` at `layout` (tp only) and run every tp rank as a thread: `f` gets the rank's
/// executor (weights loaded from `weights`), its graph and its inputs.
fn on_tp_ranks<T: Send + 'static>(
    g: &Graph,
    layout: &Layout,
    weights: &Grads,
    data: &Data,
    f: impl Fn(&mut Executor<Cpu>, &Graph, &Data) -> T + Send + Sync + Copy + 'static,
) -> Vec<T> {
    let tp = layout.tp as usize;
    let hs: Vec<_> = mesh(layout.tp, 1, 1)
        .into_iter()
        .map(|m| {
            let r = m.coord.tp as usize;
            let s = shard(g, layout, m.coord).unwrap();
            let (g, weights, data) = (g.clone(), weights.clone(), data.clone());
            std::thread::spawn(move || {
                let mut ex = Executor::for_rank(&s, Cpu::new(), options(), m.groups).unwrap();
                load_weights(&mut ex, &g, &s.graph, &weights, r, tp);
                let d = rank_inputs(&g, &s.graph, &data, r, tp);
                f(&mut ex, &s.graph, &d)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn check_tp2(vocab_parallel: bool, sequence_parallel: bool) {
    let tp = 2usize;
    let g = with_roles(toy::llama(&ToyConfig::tiny()), vocab_parallel);
    // Random ids over the whole vocabulary, so both vocabulary shards see tokens and targets.
    let data = synthetic_inputs(&g, 11);
    let mut full = Executor::new(&g, Cpu::new(), options()).unwrap();
    let w0 = weights(&full);
    let (loss, grads) = run(&mut full, &data);

    let b = g.tensors[g.tensor_id("tokens").unwrap()].shape[0] as u32;
    let layout = Layout {
        tp: tp as u32,
        sequence_parallel,
        ..Layout::single(b, b)
    };
    let out = on_tp_ranks(&g, &layout, &w0, &data, move |ex, s, d| {
        let kind = if sequence_parallel {
            OpKind::ReduceScatter
        } else {
            OpKind::AllReduce
        };
        assert!(
            s.ops.iter().any(|o| o.kind == kind),
            "the tp=2 graph has {kind:?}"
        );
        // With SP the replicated weights' gradients are partial per rank until the
        // step's tp all-reduce (Megatron's finalize_model_grads).
        assert_eq!(
            ex.step_collectives().iter().any(|c| c.group == "tp"),
            sequence_parallel
        );
        let (loss, grads) = run(ex, d);
        let shapes: HashMap<String, Vec<u64>> = s
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone()))
            .collect();
        (loss, grads, shapes)
    });
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
            None => {
                // Complete on every rank: without SP by construction, with SP after the
                // executor's tp all-reduce.
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

/// Three AdamW steps at tp=2 track the unsharded run: every rank updates its shard from
/// the same gradients the unsharded graph has; with SP that needs the step's tp
/// all-reduce of the norm gains' gradients ([`Executor::step`] runs it), which the final
/// weights check.
fn check_training(sequence_parallel: bool) {
    let tp = 2usize;
    let g = with_roles(toy::llama(&ToyConfig::tiny()), true);
    let data = synthetic_inputs(&g, 5);
    let mut full = Executor::new(&g, Cpu::new(), options()).unwrap();
    let w0 = weights(&full);
    let want = train(&mut full, &data, 3);
    let w3 = weights(&full);
    let layout = Layout {
        tp: tp as u32,
        sequence_parallel,
        ..Layout::single(2, 2)
    };
    let out = on_tp_ranks(&g, &layout, &w0, &data, |ex, s, d| {
        let shapes: HashMap<String, Vec<u64>> = s
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone()))
            .collect();
        (
            train(ex, d, 3),
            weights(ex),
            ex.profile().communication_s,
            shapes,
        )
    });
    for (r, (got, _, comm, _)) in out.iter().enumerate() {
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs(),
                "rank {r} step {i}: loss {a} vs unsharded {b}"
            );
        }
        assert!(*comm > 0.0, "rank {r}: communication time recorded");
    }
    // The weights after three steps: AdamW moves each by up to lr (1e-3) per step, so a
    // rank that stepped on a partial gradient would be off by about that much.
    for (name, want) in &w3 {
        let fshape = &g.tensors[g.tensor_id(name).unwrap()].shape;
        let got = match split_axis(fshape, &out[0].3[name]) {
            None => {
                for (r, o) in out.iter().enumerate() {
                    assert_eq!(
                        o.1[name], out[0].1[name],
                        "{name}: rank {r} differs from rank 0"
                    );
                }
                out[0].1[name].clone()
            }
            Some(ax) => {
                let parts: Vec<Vec<f32>> = out.iter().map(|o| o.1[name].clone()).collect();
                gather(&parts, fshape, ax)
            }
        };
        let worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst < 1e-5,
            "{name} drifted from the unsharded run by {worst:e}"
        );
    }
    assert!(want[2] < want[0], "the toy model learns: {want:?}");
}

#[test]
fn tp2_training_steps_track_unsharded() {
    check_training(false);
}

#[test]
fn tp2_sequence_parallel_training_steps_track_unsharded() {
    check_training(true);
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

/// What a rank reports: loss, gradients after the step's reduction, local shapes.
type RankOut = (f32, Grads, HashMap<String, Vec<u64>>);

/// Run every rank of a tp-only `layout` as a thread with hand-made `groups` per rank;
/// the unsharded weights `w0` are cut with [`common::part_of`]. Returns each rank's loss, gradients (after the
/// step's reduction) and local shapes.
fn run_ranks_with(
    g: &Graph,
    layout: &Layout,
    groups: Vec<common::Groups>,
    data: &Data,
    w0: &Grads,
) -> Vec<RankOut> {
    let tp = layout.tp as usize;
    let hs: Vec<_> = groups
        .into_iter()
        .enumerate()
        .map(|(r, groups)| {
            let coord = RankCoord {
                tp: r as u32,
                ..RankCoord::default()
            };
            let s = shard(g, layout, coord).unwrap();
            let (g, w0, data) = (g.clone(), w0.clone(), data.clone());
            std::thread::spawn(move || {
                let mut ex = Executor::for_rank(&s, Cpu::new(), options(), groups).unwrap();
                let shapes: HashMap<String, Vec<u64>> = s
                    .graph
                    .tensors
                    .iter()
                    .map(|t| (t.name.clone(), t.shape.clone()))
                    .collect();
                load_weights(&mut ex, &g, &s.graph, &w0, r, tp);
                let d = rank_inputs(&g, &s.graph, &data, r, tp);
                let (loss, grads) = run(&mut ex, &d);
                (loss, grads, shapes)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Every rank's loss equals `want_loss` and every gradient equals its part of the
/// unsharded one.
fn check_ranks(g: &Graph, out: &[RankOut], want_loss: f32, want: &Grads) {
    let tp = out.len();
    for (r, (l, grads, shapes)) in out.iter().enumerate() {
        assert!(
            (l - want_loss).abs() <= 1e-5 * want_loss.abs(),
            "rank {r}: loss {l} vs unsharded {want_loss}"
        );
        for (name, w) in want {
            let fshape = &g.tensors[g.tensor_id(name).unwrap()].shape;
            close(
                &format!("{name} (rank {r})"),
                &grads[name],
                &common::part_of(w, fshape, &shapes[name], r, tp),
            );
        }
    }
}

/// tp=4 over 2 kv heads: each kv head lives on 2 ranks that see different query heads;
/// the step's `tp-kv` all-reduce sums their parts of its projections' gradients.
#[test]
fn tp4_with_replicated_kv_heads_matches_unsharded() {
    let g = with_roles(toy::llama(&ToyConfig::tiny()), true);
    let data = synthetic_inputs(&g, 12);
    let mut full = Executor::new(&g, Cpu::new(), options()).unwrap();
    let (loss, want) = run(&mut full, &data);
    let layout = Layout {
        tp: 4,
        ..Layout::single(2, 2)
    };
    let step = shard(&g, &layout, RankCoord::default()).unwrap().step;
    let kv = step
        .iter()
        .find(|c| c.group == "tp-kv")
        .expect("a tp-kv step collective");
    assert_eq!(kv.group_size, 2);
    assert!(
        kv.weights
            .iter()
            .all(|w| w.contains(".attn.k.") || w.contains(".attn.v.")),
        "{:?}",
        kv.weights
    );
    let mut groups: Vec<common::Groups> = ThreadGroup::new(4)
        .into_iter()
        .map(|h| vec![("tp".to_string(), Box::new(h) as Box<dyn Collective>)])
        .collect();
    for pair in [[0usize, 1], [2, 3]] {
        for (&r, h) in pair.iter().zip(ThreadGroup::new(2)) {
            groups[r].push(("tp-kv".to_string(), Box::new(h)));
        }
    }
    let out = run_ranks_with(&g, &layout, groups, &data, &weights(&full));
    check_ranks(&g, &out, loss, &want);
}

/// A GPT-style block with biased column- and row-parallel linears: the row-parallel
/// bias counts once after the tp all-reduce.
#[test]
fn tp2_row_parallel_bias_counts_once() {
    use runner_graph::{Attr, DType::*, NamedOp, Role, Tensor, TensorKind::*};
    let t = |n: &str, s: &[u64], d, k| Tensor {
        name: n.into(),
        shape: s.to_vec(),
        dtype: d,
        kind: k,
    };
    let op = |n: &str, kind, i: &[&str], role, layer| NamedOp {
        name: n.into(),
        kind,
        inputs: i.iter().map(|s| s.to_string()).collect(),
        outputs: vec![n.to_string()],
        attrs: if kind == OpKind::LayerNorm {
            [("eps".to_string(), Attr::Float(1e-5))].into()
        } else {
            Default::default()
        },
        layer,
        role,
    };
    let (b, s, c, f, v) = (2, 4, 8, 16, 12);
    let g = Graph::new(
        vec![
            t("tokens", &[b, s], I32, Input),
            t("targets", &[b, s], I32, Input),
            t("embed.weight", &[v, c], BF16, Weight),
            t("embed", &[b, s, c], BF16, Activation),
            t("ln.weight", &[c], BF16, Weight),
            t("ln.bias", &[c], BF16, Weight),
            t("ln", &[b, s, c], BF16, Activation),
            t("fc1.weight", &[f, c], BF16, Weight),
            t("fc1.bias", &[f], BF16, Weight),
            t("fc1", &[b, s, f], BF16, Activation),
            t("gelu", &[b, s, f], BF16, Activation),
            t("fc2.weight", &[c, f], BF16, Weight),
            t("fc2.bias", &[c], BF16, Weight),
            t("fc2", &[b, s, c], BF16, Activation),
            t("res", &[b, s, c], BF16, Activation),
            t("head.weight", &[v, c], BF16, Weight),
            t("head", &[b, s, v], BF16, Activation),
            t("loss", &[], F32, Activation),
        ],
        vec![
            op(
                "embed",
                OpKind::Embedding,
                &["tokens", "embed.weight"],
                Role::Replicated,
                -1,
            ),
            op(
                "ln",
                OpKind::LayerNorm,
                &["embed", "ln.weight", "ln.bias"],
                Role::Replicated,
                0,
            ),
            op(
                "fc1",
                OpKind::Linear,
                &["ln", "fc1.weight", "fc1.bias"],
                Role::ColumnParallel,
                0,
            ),
            op("gelu", OpKind::Gelu, &["fc1"], Role::ColumnParallel, 0),
            op(
                "fc2",
                OpKind::Linear,
                &["gelu", "fc2.weight", "fc2.bias"],
                Role::RowParallel,
                0,
            ),
            op("res", OpKind::Add, &["embed", "fc2"], Role::Replicated, 0),
            op(
                "head",
                OpKind::Linear,
                &["res", "head.weight"],
                Role::Replicated,
                -1,
            ),
            NamedOp {
                outputs: vec!["loss".into()],
                ..op(
                    "loss",
                    OpKind::CrossEntropy,
                    &["head", "targets"],
                    Role::Replicated,
                    -1,
                )
            },
        ],
        "loss",
    )
    .unwrap();
    let data = synthetic_inputs(&g, 13);
    let mut full = Executor::new(&g, Cpu::new(), options()).unwrap();
    // Non-zero biases, so a bias counted twice shows.
    full.set_weight(
        "fc2.bias",
        &(0..c).map(|i| 0.1 * i as f32 - 0.3).collect::<Vec<_>>(),
    )
    .unwrap();
    full.set_weight(
        "fc1.bias",
        &(0..f).map(|i| 0.05 * i as f32 - 0.4).collect::<Vec<_>>(),
    )
    .unwrap();
    let (loss, want) = run(&mut full, &data);
    let layout = Layout {
        tp: 2,
        ..Layout::single(2, 2)
    };
    let groups: Vec<common::Groups> = ThreadGroup::new(2)
        .into_iter()
        .map(|h| vec![("tp".to_string(), Box::new(h) as Box<dyn Collective>)])
        .collect();
    let out = run_ranks_with(&g, &layout, groups, &data, &weights(&full));
    check_ranks(&g, &out, loss, &want);
}

/// Qwen3's per-head q/k RMSNorms (the toy's `qk_norm`, head-parallel as the SDK builds
/// them) under tp: each rank normalises the query heads and the kv heads its projections
/// left it (at tp 4 each of the 2 kv heads on 2 ranks) with the whole (D) gain, so each
/// gain's gradient is partial per rank until the step's tp all-reduce sums it. At tp 2
/// with and without sequence parallelism and at tp 4 with it, the norms add no collective
/// to the graph (q and k come out of the column-parallel projections whole in tokens and
/// split in heads, as the norms want them), and the loss and every gradient match the
/// unsharded run.
#[test]
fn tp_qk_norm_gains_are_summed_over_tp_and_match_unsharded() {
    let toy_qk = |qk_norm| with_roles(toy::llama(&ToyConfig { qk_norm, ..ToyConfig::tiny() }), true);
    let g = toy_qk(true);
    let gains: Vec<String> = (0..2)
        .flat_map(|i| ["q", "k"].map(|x| format!("layers.{i}.attn.{x}_norm.weight")))
        .collect();
    let data = synthetic_inputs(&g, 14);
    let mut full = Executor::new(&g, Cpu::new(), options()).unwrap();
    let w0 = weights(&full);
    let (loss, want) = run(&mut full, &data);
    let collectives = |g: &Graph| -> Vec<(OpKind, Option<String>, Option<String>)> {
        g.ops
            .iter()
            .filter(|o| o.text("group").is_some())
            .map(|o| (o.kind, o.text("group").map(str::to_string), o.text("tensor").map(str::to_string)))
            .collect()
    };
    for (tp, sequence_parallel) in [(2u32, false), (2, true), (4, true)] {
        let layout = Layout {
            tp,
            sequence_parallel,
            ..Layout::single(2, 2)
        };
        let what = format!("tp={tp} sp={sequence_parallel}");
        let s = shard(&g, &layout, RankCoord::default()).unwrap();
        let plain = shard(&toy_qk(false), &layout, RankCoord::default()).unwrap().graph;
        assert_eq!(collectives(&s.graph), collectives(&plain), "{what}");
        let sum = s.step.iter().find(|c| c.group == "tp").unwrap_or_else(|| panic!("{what}: {:?}", s.step));
        assert!(gains.iter().all(|w| sum.weights.contains(w)), "{what}: {:?}", sum.weights);
        let out = run_ranks_with(&g, &layout, common::tp_groups(tp as usize), &data, &w0);
        check_ranks(&g, &out, loss, &want);
    }
}

/// Counting and running agree on communication: the elements a rank's forward and
/// backward move through its collectives equal what `comm_volume` prices for its graph
/// (each collective plus its backward conjugate), and its forward runs each all-reduce
/// of the graph once, for tp with and without sequence
/// parallelism, a replicated or vocab-parallel head, pipeline stages and both at once.
/// (The column-parallel readers of one input share one all-reduce of its gradient, as
/// Megatron's fused qkv and fc1 linears do.)
#[test]
fn executed_communication_equals_comm_volume() {
    for (tp, pp, sp, vocab) in [
        (2u32, 1u32, false, true),
        (2, 1, false, false),
        (2, 1, true, true),
        (2, 1, true, false),
        (1, 2, false, true),
        (2, 2, true, true),
    ] {
        let g = with_roles(toy::llama(&ToyConfig::tiny()), vocab);
        let data = synthetic_inputs(&g, 19);
        let layout = Layout {
            tp,
            pp,
            sequence_parallel: sp,
            ..Layout::single(2, 2)
        };
        let hs: Vec<_> = mesh(tp, pp, 1)
            .into_iter()
            .map(|m| {
                let s = shard(&g, &layout, m.coord).unwrap();
                let (g, data) = (g.clone(), data.clone());
                std::thread::spawn(move || {
                    let (ars, elems) =
                        (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
                    let groups = counted(m.groups, &ars, &elems);
                    let mut ex = Executor::for_rank(&s, Cpu::new(), options(), groups).unwrap();
                    let d = rank_inputs(&g, &s.graph, &data, m.coord.tp as usize, tp as usize);
                    let inputs: Vec<(&str, Input<'_>)> = d
                        .iter()
                        .map(|(n, u, _)| (n.as_str(), Input::U32(u)))
                        .collect();
                    ex.forward(&inputs).unwrap();
                    // The forward runs each all-reduce of the graph once, no more: the
                    // vocab-parallel loss reuses what its `row-stats` ops reduced.
                    let count = |f: &dyn Fn(&runner_graph::Op) -> bool| {
                        s.graph.ops.iter().filter(|o| f(o)).count()
                    };
                    let in_graph = count(&|o| o.kind == OpKind::AllReduce);
                    let stats = count(&|o| o.flag("row-stats") == Some(true));
                    let forward_ars = ars.load(Ordering::SeqCst);
                    ex.backward().unwrap();
                    let priced = priced_elems(&s.graph);
                    (
                        m.coord,
                        elems.load(Ordering::SeqCst),
                        priced,
                        forward_ars,
                        in_graph,
                        stats,
                    )
                })
            })
            .collect();
        for h in hs {
            let (coord, ran, priced, forward_ars, in_graph, stats) = h.join().unwrap();
            let what = format!("tp={tp} pp={pp} sp={sp} vocab-parallel={vocab}, rank {coord:?}");
            assert_eq!(ran, priced, "{what}: elements moved vs priced");
            assert_eq!(
                forward_ars, in_graph,
                "{what}: forward all-reduces run vs in the graph"
            );
            let loss_here = coord.pp + 1 == pp;
            if vocab && tp > 1 && loss_here {
                assert_eq!(stats, 3, "{what}: max, sum-exp and target-logit");
            }
        }
    }
}

/// With sequence parallelism, a replicated op that reads a column-parallel (feature-split)
/// output gets it through an all-to-all over tp that trades the feature split for a
/// sequence split (here a replicated SwiGLU and down projection after column-parallel
/// gate/up): it runs and matches the unsharded model, on every rank.
#[test]
fn tp2_sequence_parallel_all_to_all_matches_unsharded() {
    use runner_graph::Role;
    let mut g = with_roles(toy::llama(&ToyConfig::tiny()), true);
    for op in &mut g.ops {
        if op.name.ends_with(".mlp.act") || op.name.ends_with(".mlp.down") {
            op.role = Role::Replicated;
        }
    }
    let data = synthetic_inputs(&g, 16);
    let mut full = Executor::new(&g, Cpu::new(), options()).unwrap();
    let w0 = weights(&full);
    let (loss, want) = run(&mut full, &data);
    let layout = Layout {
        tp: 2,
        sequence_parallel: true,
        ..Layout::single(2, 2)
    };
    let s = shard(&g, &layout, RankCoord::default()).unwrap();
    assert_eq!(
        s.graph
            .ops
            .iter()
            .filter(|o| o.kind == OpKind::AllToAll)
            .count(),
        2 * 2,
        "gate and up of each layer trade features for tokens"
    );
    let groups: Vec<common::Groups> = ThreadGroup::new(2)
        .into_iter()
        .map(|h| vec![("tp".to_string(), Box::new(h) as Box<dyn Collective>)])
        .collect();
    let out = run_ranks_with(&g, &layout, groups, &data, &w0);
    check_ranks(&g, &out, loss, &want);
}

/// A tp rank starts from its part of the unsharded model's initial weights (as
/// Megatron slices a master weight), not from the same values on every rank: at tp=2,
/// at tp=4 (the kv heads then shared by pairs of ranks), and at tp=4 with a vocabulary
/// of 62 padded to 64 (the last rank's rows 62 and 63 continue the weight's stream, as
/// the rows of a 64-row table would be), vocab-parallel, every weight of every rank
/// equals its part of the unsharded executor's, bit for bit.
#[test]
fn tp_ranks_start_from_their_part_of_the_unsharded_weights() {
    let toy = |vocab| with_roles(toy::llama(&ToyConfig { vocab, ..ToyConfig::tiny() }), true);
    // The 64-row tables hold the 62-row ones' values and their continuation.
    let reference = toy(64);
    let full = weights(&Executor::new(&reference, Cpu::new(), options()).unwrap());
    for (vocab, tp) in [(64, 2u32), (64, 4), (62, 4)] {
        let g = toy(vocab);
        let layout = Layout { tp, ..Layout::single(2, 2) };
        let mut split = 0;
        for (r, h) in ThreadGroup::new(tp as usize).into_iter().enumerate() {
            let coord = RankCoord { tp: r as u32, ..RankCoord::default() };
            let s = shard(&g, &layout, coord).unwrap();
            // Its handle on tp is all a rank's weight origins need (tp-kv's gradient sum,
            // whose handles are left out, does not run here).
            let mut step = s.step.clone();
            step.retain(|c| c.group != "tp-kv");
            let ex = Executor::for_rank(
                &runner_graph::shard::Sharded { step, ..s.clone() },
                Cpu::new(),
                options(),
                vec![("tp".to_string(), Box::new(h) as Box<dyn Collective>)],
            )
            .unwrap();
            for t in s.graph.tensors.iter().filter(|t| t.kind.is_param()) {
                let rshape = &reference.tensors[reference.tensor_id(&t.name).unwrap()].shape;
                let want = common::part_of(&full[&t.name], rshape, &t.shape, r, tp as usize);
                let got = ex.weight(&t.name).unwrap();
                split += usize::from(rshape != &t.shape);
                assert!(
                    got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()) && got.len() == want.len(),
                    "vocab {vocab}, tp={tp} rank {r}: '{}' is not its part of the unsharded weight",
                    t.name
                );
            }
        }
        assert!(split >= 2 * tp as usize * 7, "tp={tp}: only {split} split weights over the ranks");
    }
}
