//! Context parallelism end to end on the CPU: shard a toy Llama at cp=2 (and cp=2 ×
//! tp=2), run every rank as a thread, and check the loss and the weight gradients
//! against the unsharded graph.
//!
//! Each cp rank holds two chunks of every sequence (Megatron's load-balanced causal
//! split: 2·cp chunks, rank i holds chunks i and 2·cp−1−i), rotates them by their
//! global positions, all-gathers K and V over `cp` and masks attention on global
//! positions; the gathered K/V's gradient is reduce-scattered (summed) back. Each rank's
//! loss is the mean over its own tokens, so the unsharded loss is the mean of the cp
//! ranks' losses, and the step's `dp` all-reduce (over the dp·cp ranks, divided by
//! dp·cp) turns the ranks' gradients into the unsharded one.

mod common;

use std::collections::HashMap;

use common::{
    Data, Grads, Groups, close, gather, load_weights, options, run, slice, split_axis, train,
    weights, with_roles,
};
use runner_exec::Executor;
use runner_exec::collective::ThreadGroup;
use runner_exec::cpu::Cpu;
use runner_exec::proxy::synthetic_inputs;
use runner_exec::toy::{self, ToyConfig};
use runner_graph::shard::{Layout, RankCoord, shard};
use runner_graph::{Attr, Graph, OpKind};

/// One rank of a tp × cp mesh (dp = 1, one stage): tp fastest, then cp (Megatron's
/// order). Groups of more than one rank: `tp` (same cp rank), `cp` (same tp rank: the
/// K/V all-gathers) and `dp` (the dp·cp ranks holding the same weights: the step's
/// gradient mean, as `runner_graph::shard` emits it).
struct CpRank {
    coord: RankCoord,
    groups: Groups,
}

fn cp_mesh(tp: u32, cp: u32) -> Vec<CpRank> {
    let at = |t: u32, c: u32| (c * tp + t) as usize;
    let mut ranks: Vec<CpRank> = (0..tp * cp)
        .map(|i| CpRank {
            coord: RankCoord {
                tp: i % tp,
                cp: i / tp,
                ..RankCoord::default()
            },
            groups: Vec::new(),
        })
        .collect();
    let mut push = |members: Vec<usize>, name: &str| {
        if members.len() < 2 {
            return;
        }
        for (m, h) in members.iter().zip(ThreadGroup::new(members.len())) {
            ranks[*m].groups.push((name.to_string(), Box::new(h)));
        }
    };
    for c in 0..cp {
        push((0..tp).map(|t| at(t, c)).collect(), "tp");
    }
    for t in 0..tp {
        push((0..cp).map(|c| at(t, c)).collect(), "cp");
        push((0..cp).map(|c| at(t, c)).collect(), "dp");
    }
    ranks
}

/// Cp rank `r`'s tokens of `x` (shape (B,T,..)): chunks r and 2·cp−1−r of each
/// sequence, in that order.
fn cp_rows<T: Copy>(x: &[T], full: &[u64], cp: usize, r: usize) -> Vec<T> {
    let (b, t) = (full[0] as usize, full[1] as usize);
    let inner: usize = full[2..].iter().product::<u64>() as usize;
    let c = t / (2 * cp);
    let mut out = Vec::with_capacity(x.len() / cp);
    for s in 0..b {
        for chunk in [r, 2 * cp - 1 - r] {
            let from = (s * t + chunk * c) * inner;
            out.extend_from_slice(&x[from..from + c * inner]);
        }
    }
    out
}

/// The inputs rank graph `s` reads: the cp rank's chunks of each (B,T) input, further
/// cut to the tp rank's sequence shard where sequence parallelism splits it.
fn cp_inputs(g: &Graph, s: &Graph, data: &Data, coord: RankCoord, layout: &Layout) -> Data {
    let (cp, tp) = (layout.cp as usize, layout.tp as usize);
    data.iter()
        .filter_map(|(n, u, f)| {
            let ls = &s.tensors[s.tensor_id(n)?].shape;
            let fs = &g.tensors[g.tensor_id(n).unwrap()].shape;
            let mut u = cp_rows(u, fs, cp, coord.cp as usize);
            let mut cs = fs.clone();
            cs[1] /= cp as u64;
            if let Some(ax) = split_axis(&cs, ls) {
                u = slice(&u, &cs, ax, coord.tp as usize, tp);
            }
            Some((n.clone(), u, f.clone()))
        })
        .collect()
}

type Shapes = HashMap<String, Vec<u64>>;

/// Shard `g` at `layout` (tp × cp) and run every rank as a thread: `f` gets the rank's
/// executor (weights: its tp part of `weights`) and its inputs. Results in rank order
/// (tp fastest), each with the rank's coordinates and local tensor shapes.
fn on_cp_ranks<T: Send + 'static>(
    g: &Graph,
    layout: &Layout,
    weights: &Grads,
    data: &Data,
    f: impl Fn(&mut Executor<Cpu>, &Graph, &Data) -> T + Send + Sync + Copy + 'static,
) -> Vec<(RankCoord, Shapes, T)> {
    let tp = layout.tp as usize;
    let hs: Vec<_> = cp_mesh(layout.tp, layout.cp)
        .into_iter()
        .map(|m| {
            let s = shard(g, layout, m.coord).unwrap();
            let (g, weights, data, layout) =
                (g.clone(), weights.clone(), data.clone(), layout.clone());
            std::thread::spawn(move || {
                let mut ex = Executor::for_rank(&s, Cpu::new(), options(), m.groups).unwrap();
                load_weights(&mut ex, &g, &s.graph, &weights, m.coord.tp as usize, tp);
                let d = cp_inputs(&g, &s.graph, &data, m.coord, &layout);
                let shapes: Shapes = s
                    .graph
                    .tensors
                    .iter()
                    .map(|t| (t.name.clone(), t.shape.clone()))
                    .collect();
                (m.coord, shapes, f(&mut ex, &s.graph, &d))
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Each cp rank's view of the weights (or gradients) `per_rank`, its tp parts gathered
/// into the unsharded shapes: one map per cp rank.
fn assemble(g: &Graph, out: &[(RankCoord, Shapes, Grads)], cp: u32) -> Vec<Grads> {
    (0..cp)
        .map(|c| {
            let ranks: Vec<&(RankCoord, Shapes, Grads)> =
                out.iter().filter(|(co, _, _)| co.cp == c).collect();
            ranks[0]
                .2
                .keys()
                .map(|name| {
                    let fshape = &g.tensors[g.tensor_id(name).unwrap()].shape;
                    let v = match split_axis(fshape, &ranks[0].1[name]) {
                        None => {
                            for r in &ranks {
                                assert_eq!(
                                    r.2[name], ranks[0].2[name],
                                    "{name}: replicated over tp but differs"
                                );
                            }
                            ranks[0].2[name].clone()
                        }
                        Some(ax) => {
                            let parts: Vec<Vec<f32>> =
                                ranks.iter().map(|r| r.2[name].clone()).collect();
                            gather(&parts, fshape, ax)
                        }
                    };
                    (name.clone(), v)
                })
                .collect()
        })
        .collect()
}

fn tiny16() -> Graph {
    with_roles(
        toy::llama(&ToyConfig {
            seq: 16,
            ..ToyConfig::tiny()
        }),
        true,
    )
}

/// [`tiny16`] with Qwen3's per-head q/k RMSNorms before RoPE.
fn tiny16_qk_norm() -> Graph {
    with_roles(
        toy::llama(&ToyConfig {
            seq: 16,
            qk_norm: true,
            ..ToyConfig::tiny()
        }),
        true,
    )
}

/// [`tiny16`] with a causal sliding window of `w` tokens on every attention op.
fn tiny16_window(w: i64) -> Graph {
    let mut g = tiny16();
    for op in g.ops.iter_mut().filter(|o| o.kind == OpKind::Attention) {
        op.attrs.insert("window".into(), Attr::Int(w));
    }
    g
}

fn layout(tp: u32, cp: u32, sequence_parallel: bool) -> Layout {
    Layout {
        tp,
        cp,
        sequence_parallel,
        ..Layout::single(2, 2)
    }
}

/// Loss and gradients at `layout` against the unsharded model: the mean of the cp
/// ranks' losses is the unsharded loss (the tp ranks of a cp rank agree), and after the
/// step's reduction every rank's gradient is the unsharded one (its tp part).
fn check_loss_and_grads(layout: Layout) {
    check_loss_and_grads_of(tiny16(), layout);
}

fn check_loss_and_grads_of(g: Graph, layout: Layout) {
    let data = synthetic_inputs(&g, 21);
    let mut full = Executor::new(&g, Cpu::new(), options()).unwrap();
    let w0 = weights(&full);
    let (loss, want) = run(&mut full, &data);
    let out = on_cp_ranks(&g, &layout, &w0, &data, |ex, s, d| {
        let gathers = s
            .ops
            .iter()
            .filter(|o| o.kind == OpKind::AllGather && o.text("group") == Some("cp"))
            .count();
        assert_eq!(
            gathers, 4,
            "K and V of both layers are all-gathered over cp"
        );
        assert!(
            ex.step_collectives()
                .iter()
                .any(|c| c.group == "dp" && c.mean_over == 2)
        );
        run(ex, d)
    });
    let cp = layout.cp as usize;
    for t in 0..layout.tp {
        let losses: Vec<f32> = out
            .iter()
            .filter(|(c, _, _)| c.tp == t)
            .map(|(_, _, (l, _))| *l)
            .collect();
        assert_eq!(losses.len(), cp);
        let mean = losses.iter().sum::<f32>() / cp as f32;
        assert!(
            (mean - loss).abs() <= 1e-5 * loss.abs(),
            "tp rank {t}: mean of the cp ranks' losses {losses:?} = {mean} vs unsharded {loss}"
        );
        assert!(
            losses.iter().any(|l| (l - loss).abs() > 1e-4),
            "the cp ranks' losses differ from each other: {losses:?}"
        );
    }
    let grads: Vec<(RankCoord, Shapes, Grads)> =
        out.into_iter().map(|(c, s, (_, g))| (c, s, g)).collect();
    for (c, got) in assemble(&g, &grads, layout.cp).iter().enumerate() {
        assert_eq!(got.len(), want.len());
        for (name, w) in &want {
            close(&format!("{name} (cp rank {c})"), &got[name], w);
        }
    }
}

#[test]
fn cp2_matches_unsharded() {
    check_loss_and_grads(layout(1, 2, false));
}

/// A sliding window of 5 over chunks of 4: the mask reaches across chunk and rank
/// boundaries and cuts inside chunks, all on global positions.
#[test]
fn cp2_sliding_window_matches_unsharded() {
    check_loss_and_grads_of(tiny16_window(5), layout(1, 2, false));
}

/// Qwen3's per-head q/k norms under cp: each cp rank normalises the heads of its own
/// tokens (q and k come out of the projections per token, before the K/V all-gather),
/// and the gains' partial gradients join the dense weights' dp·cp reduction; with tp 2
/// and sequence parallelism the tp ranks' parts are summed first. cp 2, and cp 2 × tp 2
/// with SP.
#[test]
fn cp2_qk_norm_matches_unsharded() {
    check_loss_and_grads_of(tiny16_qk_norm(), layout(1, 2, false));
    check_loss_and_grads_of(tiny16_qk_norm(), layout(2, 2, true));
}

#[test]
fn cp2_tp2_matches_unsharded() {
    check_loss_and_grads(layout(2, 2, false));
}

#[test]
fn cp2_tp2_sequence_parallel_matches_unsharded() {
    check_loss_and_grads(layout(2, 2, true));
}

/// Three AdamW steps track the unsharded run: per step the mean of the cp ranks' losses,
/// and the weights after the last step.
fn check_training(layout: Layout) {
    let g = tiny16();
    let data = synthetic_inputs(&g, 5);
    let mut full = Executor::new(&g, Cpu::new(), options()).unwrap();
    let w0 = weights(&full);
    let want = train(&mut full, &data, 3);
    let w3 = weights(&full);
    let out = on_cp_ranks(&g, &layout, &w0, &data, |ex, _, d| {
        (train(ex, d, 3), weights(ex))
    });
    let cp = layout.cp as f32;
    for t in 0..layout.tp {
        for (i, w) in want.iter().enumerate() {
            let mean = out
                .iter()
                .filter(|(c, _, _)| c.tp == t)
                .map(|(_, _, (l, _))| l[i])
                .sum::<f32>()
                / cp;
            assert!(
                (mean - w).abs() <= 1e-5 * w.abs(),
                "tp rank {t} step {i}: mean cp loss {mean} vs unsharded {w}"
            );
        }
    }
    let ws: Vec<(RankCoord, Shapes, Grads)> =
        out.into_iter().map(|(c, s, (_, w))| (c, s, w)).collect();
    // AdamW moves each weight by up to lr (1e-3) per step: a rank stepping on a wrong
    // gradient would be off by about that much.
    for (c, got) in assemble(&g, &ws, layout.cp).iter().enumerate() {
        for (name, w) in &w3 {
            let worst = got[name]
                .iter()
                .zip(w)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                worst < 1e-5,
                "{name} (cp rank {c}) drifted from the unsharded run by {worst:e}"
            );
        }
    }
    assert!(want[2] < want[0], "the toy model learns: {want:?}");
}

#[test]
fn cp2_training_steps_track_unsharded() {
    check_training(layout(1, 2, false));
}

#[test]
fn cp2_tp2_training_steps_track_unsharded() {
    check_training(layout(2, 2, true));
}

/// Counting and running agree on context parallelism's communication too: the elements
/// a rank's forward and backward move (the K/V all-gathers and their reduce-scatters,
/// with tp and SP traffic) equal what `comm_volume` prices for its graph.
#[test]
fn cp_executed_communication_equals_comm_volume() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let g = tiny16();
    let data = synthetic_inputs(&g, 41);
    for l in [layout(1, 2, false), layout(2, 2, true)] {
        let hs: Vec<_> = cp_mesh(l.tp, l.cp)
            .into_iter()
            .map(|m| {
                let s = shard(&g, &l, m.coord).unwrap();
                let (g, data, l) = (g.clone(), data.clone(), l.clone());
                std::thread::spawn(move || {
                    let (ars, elems) =
                        (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
                    let groups = common::counted(m.groups, &ars, &elems);
                    let mut ex = Executor::for_rank(&s, Cpu::new(), options(), groups).unwrap();
                    let d = cp_inputs(&g, &s.graph, &data, m.coord, &l);
                    run_forward_backward(&mut ex, &d);
                    (
                        m.coord,
                        elems.load(Ordering::SeqCst),
                        common::priced_elems(&s.graph),
                    )
                })
            })
            .collect();
        for h in hs {
            let (coord, ran, priced) = h.join().unwrap();
            assert!(ran > 0);
            assert_eq!(
                ran, priced,
                "tp={} cp={} rank {coord:?}: moved vs priced",
                l.tp, l.cp
            );
        }
    }
}

/// One forward and backward, no gradient reduction.
fn run_forward_backward(ex: &mut Executor<Cpu>, data: &Data) {
    let inputs: Vec<(&str, runner_exec::Input<'_>)> = data
        .iter()
        .map(|(n, u, _)| (n.as_str(), runner_exec::Input::U32(u)))
        .collect();
    ex.forward(&inputs).unwrap();
    ex.backward().unwrap();
}
