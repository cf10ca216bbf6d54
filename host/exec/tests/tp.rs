//! Tensor parallelism end to end on the CPU: shard a toy Llama at tp=2, run both ranks as
//! threads joined by a [`ThreadGroup`], and check the loss and the gathered weight
//! gradients against the unsharded graph.

mod common;

use std::collections::HashMap;

use common::{
    Data, Grads, close, gather, load_weights, mesh, options, rank_inputs, run, split_axis, train,
    weights, with_roles,
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
