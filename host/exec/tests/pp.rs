//! Pipeline and data parallelism end to end on the CPU: shard a toy Llama over a
//! tp × pp × dp mesh, run every rank as a thread (each simply runs forward, backward and
//! the step's gradient reduction: sends are queued, receives wait), and check the last
//! stage's loss and every weight gradient on every rank that holds the weight against
//! the unsharded graph.

mod common;

use std::collections::HashMap;

use common::{
    Data, Grads, close, gather, grads, half_of, inputs, load_weights, mesh, options, rank_inputs, run, split_axis,
    train, weights, with_roles,
};
use runner_exec::cpu::Cpu;
use runner_exec::proxy::synthetic_inputs;
use runner_exec::toy::{self, ToyConfig};
use runner_exec::executor::PipelineSchedule;
use runner_exec::precision::{AmaxReduction, GemmRole, OperandPlan, Scaling, SitePlan};
use runner_exec::{ExecOptions, Executor, Input};
use runner_graph::recompute::RecomputePolicy;
use runner_graph::pipeline::PipelineSplit;
use runner_graph::shard::{Layout, RankCoord, shard};
use runner_graph::{DType, Graph, OpKind};

/// What one rank reports: its coordinates, loss, weight gradients and local shapes.
struct Out {
    coord: RankCoord,
    loss: f32,
    grads: Grads,
    shapes: HashMap<String, Vec<u64>>,
    last: bool,
}

/// Run `g` (logical, with roles) over a tp × pp mesh with `vp` chunks per stage and
/// compare with the unsharded run.
fn check(g: &Graph, tp: u32, pp: u32, vp: u32, sequence_parallel: bool) {
    check_with(g, tp, pp, vp, sequence_parallel, options());
}

/// As [`check`], with the layers split over the chunks as `split` says.
fn check_split(g: &Graph, tp: u32, pp: u32, vp: u32, split: PipelineSplit) {
    check_layout(g, tp, pp, vp, false, split, options());
}

/// As [`check`], the ranks run with `rank_options`.
fn check_with(
    g: &Graph,
    tp: u32,
    pp: u32,
    vp: u32,
    sequence_parallel: bool,
    rank_options: ExecOptions,
) {
    check_layout(g, tp, pp, vp, sequence_parallel, PipelineSplit::default(), rank_options);
}

fn check_layout(
    g: &Graph,
    tp: u32,
    pp: u32,
    vp: u32,
    sequence_parallel: bool,
    split: PipelineSplit,
    rank_options: ExecOptions,
) {
    let data = synthetic_inputs(g, 17);
    let mut full = Executor::new(g, Cpu::new(), options()).unwrap();
    let w0 = weights(&full);
    let (loss, want) = run(&mut full, &data);

    let b = g.tensors[g.tensor_id("tokens").unwrap()].shape[0] as u32;
    let layout = Layout {
        tp,
        pp,
        vp,
        sequence_parallel,
        split,
        // The interleaved schedule wants a multiple of pp micro-batches per step; the
        // executor runs one, which is what a step of one micro-batch per chunk checks.
        ..Layout::single(b, b * pp)
    };
    let hs: Vec<_> = mesh(tp, pp, 1)
        .into_iter()
        .map(|m| {
            let s = shard(g, &layout, m.coord).unwrap();
            let (g, w0, data, o) = (g.clone(), w0.clone(), data.clone(), rank_options.clone());
            std::thread::spawn(move || {
                let last = s.graph.ops.iter().any(|o| o.kind == OpKind::CrossEntropy);
                if pp > 1 {
                    assert!(
                        s.graph
                            .ops
                            .iter()
                            .any(|o| matches!(o.kind, OpKind::Send | OpKind::Recv)),
                        "stage {} has pipeline ops",
                        m.coord.pp
                    );
                }
                let recompute = o.recompute;
                let mut ex = Executor::for_rank(&s, Cpu::new(), o, m.groups).unwrap();
                let r = m.coord.tp as usize;
                load_weights(&mut ex, &g, &s.graph, &w0, r, tp as usize);
                let d = rank_inputs(&g, &s.graph, &data, r, tp as usize);
                let (loss, grads) = run(&mut ex, &d);
                if recompute != RecomputePolicy::None {
                    assert!(
                        !ex.profile().recomputed_ops.is_empty(),
                        "{:?} re-ran nothing",
                        m.coord
                    );
                }
                let shapes = s
                    .graph
                    .tensors
                    .iter()
                    .map(|t| (t.name.clone(), t.shape.clone()))
                    .collect();
                Out {
                    coord: m.coord,
                    loss,
                    grads,
                    shapes,
                    last,
                }
            })
        })
        .collect();
    let out: Vec<Out> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let what = format!("tp={tp} pp={pp} vp={vp} sp={sequence_parallel}");
    for o in &out {
        if o.last {
            assert!(
                (o.loss - loss).abs() <= 1e-5 * loss.abs(),
                "{what} {:?}: loss {} vs unsharded {loss}",
                o.coord,
                o.loss
            );
        } else {
            // The objective of a stage without the head is its send tokens, all 0.
            assert_eq!(o.loss, 0.0, "{what} {:?}", o.coord);
        }
    }
    assert_eq!(out.iter().filter(|o| o.last).count(), tp as usize);
    for (name, want) in &want {
        let fshape = &g.tensors[g.tensor_id(name).unwrap()].shape;
        let mut holders = 0;
        for stage in 0..pp {
            let ranks: Vec<&Out> = out
                .iter()
                .filter(|o| o.coord.pp == stage && o.grads.contains_key(name))
                .collect();
            if ranks.is_empty() {
                continue;
            }
            holders += 1;
            assert_eq!(
                ranks.len(),
                tp as usize,
                "{what}: {name} on every tp rank of stage {stage}"
            );
            match split_axis(fshape, &ranks[0].shapes[name]) {
                None => {
                    for o in &ranks {
                        close(
                            &format!("{what} {name} ({:?})", o.coord),
                            &o.grads[name],
                            want,
                        );
                    }
                }
                Some(ax) => {
                    let parts: Vec<Vec<f32>> =
                        ranks.iter().map(|o| o.grads[name].clone()).collect();
                    close(
                        &format!("{what} {name} (stage {stage}, split on axis {ax})"),
                        &gather(&parts, fshape, ax),
                        want,
                    );
                }
            }
        }
        assert!(holders >= 1, "{what}: no stage holds {name}");
    }
}

fn llama(layers: u32, tied: bool, vocab_parallel: bool) -> Graph {
    with_roles(
        toy::llama(&ToyConfig {
            layers,
            tied,
            ..ToyConfig::tiny()
        }),
        vocab_parallel,
    )
}

/// The toy of `c`, with roles.
fn toy_graph(c: ToyConfig) -> Graph {
    with_roles(toy::llama(&c), false)
}

/// The 2-layer toy with one sequence per batch (half of [`llama`]'s two).
fn half_llama(tied: bool, vocab_parallel: bool) -> Graph {
    with_roles(
        toy::llama(&ToyConfig {
            batch: 1,
            tied,
            ..ToyConfig::tiny()
        }),
        vocab_parallel,
    )
}

#[test]
fn pp2_matches_unsharded() {
    check(&llama(2, false, false), 1, 2, 1, false);
}

/// With tp=2 inside each stage (vocab-parallel head; with and without SP, whose sends
/// carry each rank's sequence shard).
#[test]
fn pp2_tp2_matches_unsharded() {
    check(&llama(2, false, true), 2, 2, 1, false);
    check(&llama(2, false, true), 2, 2, 1, true);
}

/// A tied embedding lives on the first stage (embedding) and the last (head): each has
/// a partial gradient until the step's `pp-embed` all-reduce sums them.
#[test]
fn pp2_tied_embedding_gradients_are_summed_across_stages() {
    check(&llama(2, true, true), 1, 2, 1, false);
    // A replicated (not vocab-parallel) tied table too: its sum was missed until
    // 2026-12-01, when only vocab-parallel roles marked the embedding and the head.
    check(&llama(2, true, false), 1, 2, 1, false);
    check(&llama(2, true, true), 2, 2, 1, true);
}

/// Interleaved (virtual) pipeline: 4 layers, pp=2, vp=2: stage 0 runs chunks 0 and 2,
/// stage 1 chunks 1 and 3, so activations go 0 → 1 → 0 → 1 and gradients back.
#[test]
fn pp2_vp2_matches_unsharded() {
    check(&llama(4, false, false), 1, 2, 2, false);
    check(&llama(4, true, true), 2, 2, 2, true);
}

/// Full activation recompute on the stages: the re-run layers repeat their tp
/// collectives on every rank alike, and never a send or a receive.
#[test]
fn pp2_tp2_with_full_recompute_matches_unsharded() {
    for policy in [RecomputePolicy::Full, RecomputePolicy::Selective] {
        let o = ExecOptions {
            recompute: policy,
            ..options()
        };
        check_with(&llama(4, true, true), 2, 2, 2, true, o);
    }
}

/// Megatron's accounting of the embedding and the loss as layers: with 2 layers over
/// pp=2 vp=2 the first chunk holds only the embedding and the last only the head, so
/// stage 0's first chunk sends the embedding's output and stage 1's last chunk starts
/// at a receive; the run still equals the unsharded one. With 3 layers over pp=2 and
/// only the loss counted, the stages hold two layers and one.
#[test]
fn pp2_with_the_embedding_and_loss_counted_as_layers_matches_unsharded() {
    check_split(&llama(2, false, false), 1, 2, 2, PipelineSplit::megatron(true, true));
    check_split(&llama(2, true, false), 1, 2, 2, PipelineSplit::megatron(true, true));
    check_split(&llama(3, false, false), 1, 2, 1, PipelineSplit::megatron(false, true));
    let l = llama(2, false, false);
    let s = shard(&l, &Layout { pp: 2, vp: 2, split: PipelineSplit::megatron(true, true), ..Layout::single(2, 4) }, RankCoord::default()).unwrap();
    // Stage 0 runs chunk 0 (the embedding alone) and chunk 2 (layer 1).
    let layers: std::collections::BTreeSet<i32> = s.graph.ops.iter().map(|o| o.layer).filter(|&l| l >= 0).collect();
    assert_eq!(layers.into_iter().collect::<Vec<_>>(), vec![1]);
    let e = Layout { pp: 2, vp: 2, split: PipelineSplit { embedding: 3, loss: 0 }, ..Layout::single(2, 4) }.validate(&l, 2).unwrap_err();
    assert!(e.contains("the embedding counts as 3 layers"), "{e}");
}

/// Three layers over pp=3: the middle stage receives and sends.
#[test]
fn pp3_matches_unsharded() {
    check(&llama(3, true, true), 1, 3, 1, false);
}

/// Data parallelism: two ranks each run half of the batch; after the step's dp
/// all-reduce (sum, then divide by dp) both hold the full batch's gradient, since the
/// loss is a mean over tokens and the halves are of equal size. Before it, neither does.
#[test]
fn dp2_gradients_are_the_full_batch_mean() {
    let full_g = llama(2, false, false);
    let half_g = half_llama(false, false);
    let data = synthetic_inputs(&full_g, 23);
    let mut full = Executor::new(&full_g, Cpu::new(), options()).unwrap();
    let w0 = weights(&full);
    let (loss, want) = run(&mut full, &data);
    let layout = Layout {
        dp: 2,
        ..Layout::single(1, 2)
    };
    let hs: Vec<_> = mesh(1, 1, 2)
        .into_iter()
        .map(|m| {
            let s = shard(&half_g, &layout, m.coord).unwrap();
            assert_eq!(s.step.len(), 1);
            assert_eq!((s.step[0].group.as_str(), s.step[0].group_size), ("dp", 2));
            // Rank d takes batch row d.
            let half = half_of(&data, m.coord.dp as usize);
            let (g, w0) = (half_g.clone(), w0.clone());
            std::thread::spawn(move || {
                let mut ex = Executor::for_rank(&s, Cpu::new(), options(), m.groups).unwrap();
                load_weights(&mut ex, &g, &s.graph, &w0, 0, 1);
                let inputs: Vec<(&str, Input<'_>)> = half
                    .iter()
                    .map(|(n, u, _)| (n.as_str(), Input::U32(u)))
                    .collect();
                let loss = ex.forward(&inputs).unwrap();
                ex.backward().unwrap();
                let before = grads(&ex);
                ex.reduce_gradients().unwrap();
                let again = ex.reduce_gradients().unwrap_err().to_string();
                assert!(again.contains("already reduced"), "{again}");
                (loss, before, grads(&ex))
            })
        })
        .collect();
    let out: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let mean = (out[0].0 + out[1].0) / 2.0;
    assert!(
        (mean - loss).abs() <= 1e-5 * loss,
        "mean of the halves' losses {mean} vs {loss}"
    );
    for (name, w) in &want {
        for (d, (_, before, after)) in out.iter().enumerate() {
            close(&format!("{name} (dp rank {d}, reduced)"), &after[name], w);
            let off = before[name]
                .iter()
                .zip(w)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                off > 1e-6,
                "{name}: dp rank {d} had the full gradient before the reduction"
            );
        }
    }
}

/// Three AdamW steps at dp=2 × pp=2 (tied embedding) track the unsharded full batch:
/// [`Executor::step`] reduces over dp and across the stages before each update, and a
/// rank that skipped it would refuse to step.
#[test]
fn dp2_pp2_training_steps_track_unsharded() {
    let full_g = llama(2, true, true);
    let half_g = half_llama(true, true);
    let data = synthetic_inputs(&full_g, 29);
    let mut full = Executor::new(&full_g, Cpu::new(), options()).unwrap();
    let w0 = weights(&full);
    let want = train(&mut full, &data, 3);
    let w3 = weights(&full);
    let layout = Layout {
        dp: 2,
        pp: 2,
        ..Layout::single(1, 2)
    };
    let hs: Vec<_> = mesh(1, 2, 2)
        .into_iter()
        .map(|m| {
            let s = shard(&half_g, &layout, m.coord).unwrap();
            let half = half_of(&data, m.coord.dp as usize);
            let (g, w0) = (half_g.clone(), w0.clone());
            std::thread::spawn(move || {
                let mut ex = Executor::for_rank(&s, Cpu::new(), options(), m.groups).unwrap();
                load_weights(&mut ex, &g, &s.graph, &w0, 0, 1);
                let half = rank_inputs(&g, &s.graph, &half, 0, 1);
                let last = s.graph.ops.iter().any(|o| o.kind == OpKind::CrossEntropy);
                // Stepping without the reduction is refused (the ranks would drift).
                let inputs: Vec<(&str, Input<'_>)> = half
                    .iter()
                    .map(|(n, u, _)| (n.as_str(), Input::U32(u)))
                    .collect();
                ex.forward(&inputs).unwrap();
                ex.backward().unwrap();
                let e = ex
                    .optimizer_step(&runner_exec::executor::ADAMW_DEFAULT)
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("reduce_gradients"), "{e}");
                ex.reduce_gradients().unwrap();
                let losses = train(&mut ex, &half, 3);
                (last, losses, weights(&ex))
            })
        })
        .collect();
    let out: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    // The last stage's per-rank losses are means over its half; their mean is the full
    // batch's loss, step by step.
    let lasts: Vec<&Vec<f32>> = out.iter().filter(|o| o.0).map(|o| &o.1).collect();
    assert_eq!(lasts.len(), 2);
    for i in 0..3 {
        let mean = (lasts[0][i] + lasts[1][i]) / 2.0;
        assert!(
            (mean - want[i]).abs() <= 1e-5 * want[i],
            "step {i}: mean over dp {mean} vs unsharded {}",
            want[i]
        );
    }
    // Every rank's weights after three steps: AdamW moves each by up to lr (1e-3) per
    // step, so a rank that stepped on an unreduced gradient would be off by about that.
    for (_, _, w) in &out {
        for (name, v) in w {
            let worst = v
                .iter()
                .zip(&w3[name])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                worst < 1e-5,
                "{name} drifted from the unsharded run by {worst:e}"
            );
        }
    }
}

/// A pipeline step over two micro-batches (gradient accumulation; each stage runs them
/// in order) makes the same update as the unsharded step over the whole batch.
#[test]
fn pp2_step_over_two_micro_batches_matches_the_full_batch_step() {
    let full_g = llama(2, true, true);
    let half_g = half_llama(true, true);
    let data = synthetic_inputs(&full_g, 31);
    let mut full = Executor::new(&full_g, Cpu::new(), options()).unwrap();
    let w0 = weights(&full);
    let want = train(&mut full, &data, 1)[0];
    let w1 = weights(&full);
    let layout = Layout {
        pp: 2,
        ..Layout::single(1, 2)
    };
    let micro: Vec<Data> = (0..2).map(|k| half_of(&data, k)).collect();
    let hs: Vec<_> = mesh(1, 2, 1)
        .into_iter()
        .map(|m| {
            let s = shard(&half_g, &layout, m.coord).unwrap();
            let (g, w0, micro) = (half_g.clone(), w0.clone(), micro.clone());
            std::thread::spawn(move || {
                let mut ex = Executor::for_rank(&s, Cpu::new(), options(), m.groups).unwrap();
                load_weights(&mut ex, &g, &s.graph, &w0, 0, 1);
                let micro: Vec<Data> = micro
                    .iter()
                    .map(|d| rank_inputs(&g, &s.graph, d, 0, 1))
                    .collect();
                let batches: Vec<_> = micro.iter().map(inputs).collect();
                let last = s.graph.ops.iter().any(|o| o.kind == OpKind::CrossEntropy);
                let loss = ex
                    .step_micro_batches(&batches, &runner_exec::executor::ADAMW_DEFAULT)
                    .unwrap();
                (last, loss, weights(&ex))
            })
        })
        .collect();
    for (last, loss, w) in hs.into_iter().map(|h| h.join().unwrap()) {
        if last {
            assert!((loss - want).abs() <= 1e-5 * want, "{loss} vs {want}");
        }
        for (name, x) in &w {
            let y = &w1[name];
            let worst = x
                .iter()
                .zip(y)
                .map(|(p, q)| (p - q).abs())
                .fold(0f32, f32::max);
            assert!(worst <= 1e-6, "{name}: {worst:e} from the full-batch step");
        }
    }
}

/// An interleaved pipeline step (pp = 2, vp = 2: stage 0 runs chunks 0 and 2, stage 1
/// chunks 1 and 3) over two micro-batches makes the unsharded full batch's update. Each
/// chunk's backward is a pass of its own, so a weight of chunk 2 gets its gradient in
/// that pass and none in chunk 0's that follows: it must keep it (and its mark as
/// written) to the end of the step, to be divided by the micro-batch count and updated.
/// No step collective runs here (untied, dp = 1), so nothing else marks it; the
/// schedule tests compare two schedules that would lose it alike.
#[test]
fn interleaved_pp2_step_keeps_each_chunks_gradients_to_the_update() {
    let cfg = ToyConfig { layers: 4, ..ToyConfig::tiny() };
    let full_g = toy_graph(cfg.clone());
    let half_g = toy_graph(ToyConfig { batch: 1, ..cfg });
    let data = synthetic_inputs(&full_g, 23);
    let mut full = Executor::new(&full_g, Cpu::new(), options()).unwrap();
    let w0 = weights(&full);
    let want = train(&mut full, &data, 1)[0];
    let w1 = weights(&full);
    let layout = Layout { pp: 2, vp: 2, ..Layout::single(1, 2) };
    let micro: Vec<Data> = (0..2).map(|k| half_of(&data, k)).collect();
    let hs: Vec<_> = mesh(1, 2, 1)
        .into_iter()
        .map(|m| {
            let s = shard(&half_g, &layout, m.coord).unwrap();
            assert!(s.step.is_empty(), "no step collective");
            let (g, w0, micro) = (half_g.clone(), w0.clone(), micro.clone());
            std::thread::spawn(move || {
                let mut ex = Executor::for_rank(&s, Cpu::new(), options(), m.groups).unwrap();
                load_weights(&mut ex, &g, &s.graph, &w0, 0, 1);
                let micro: Vec<Data> = micro.iter().map(|d| rank_inputs(&g, &s.graph, d, 0, 1)).collect();
                let batches: Vec<_> = micro.iter().map(inputs).collect();
                let last = s.graph.ops.iter().any(|o| o.kind == OpKind::CrossEntropy);
                let loss = ex.step_micro_batches(&batches, &runner_exec::executor::ADAMW_DEFAULT).unwrap();
                (m.coord.pp, last, loss, weights(&ex))
            })
        })
        .collect();
    let mut seen = 0;
    for (stage, last, loss, w) in hs.into_iter().map(|h| h.join().unwrap()) {
        if last {
            assert!((loss - want).abs() <= 1e-5 * want, "{loss} vs {want}");
        }
        assert!(w.keys().any(|n| n.starts_with(&format!("layers.{}.", stage + 2))), "stage {stage} holds chunk {}", stage + 2);
        for (name, x) in &w {
            let worst = x.iter().zip(&w1[name]).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
            assert!(worst <= 1e-6, "stage {stage}: {name} is {worst:e} from the full-batch step");
            seen += 1;
        }
    }
    assert_eq!(seen, w1.len(), "every weight on one stage");
}

/// What one rank of [`pipeline_steps`] reports.
struct StageRun {
    coord: RankCoord,
    last: bool,
    losses: Vec<f32>,
    weights: Grads,
    memory: runner_exec::executor::MemoryReport,
    /// The last step's overlapped gradient buckets.
    buckets: Vec<runner_exec::executor::GradBucket>,
}

/// How [`pipeline_steps`] shards: tp, pp, dp (every dp rank the same data), sequence
/// parallelism, FSDP, and the pipeline chunks per stage (vp).
#[derive(Clone, Copy)]
struct Mesh(u32, u32, u32, bool, bool, u32);

/// A per-tensor FP8 plan for every role of every linear (E4M3 forward operands, E5M2
/// gradients), round to nearest.
fn fp8_plan(scaling: Scaling) -> SitePlan {
    let op = |format| OperandPlan { format, scaling, saturate: true, stochastic: false, hadamard: 0 };
    SitePlan { activation: op(DType::Fp8E4M3), weight: op(DType::Fp8E4M3), gradient: op(DType::Fp8E5M2), output: DType::BF16 }
}

/// Two optimizer steps of `m` micro-batches of `g` over a tp × pp × dp mesh (whose sends
/// wait for their receive, NCCL's semantics: an unpaired order times out), the stages'
/// passes in `schedule`'s order.
fn pipeline_steps(g: &Graph, shape: Mesh, m: usize, schedule: PipelineSchedule) -> Vec<StageRun> {
    pipeline_steps_planned(g, shape, m, schedule, None, PipelineSplit::default())
}

/// As [`pipeline_steps`], every linear of each stage under `plan`, the layers cut into
/// stages by `split`.
fn pipeline_steps_planned(g: &Graph, shape: Mesh, m: usize, schedule: PipelineSchedule, plan: Option<SitePlan>, split: PipelineSplit) -> Vec<StageRun> {
    mesh_steps(g, shape, m, ExecOptions { pipeline_schedule: schedule, ..options() }, plan, split, false)
}

/// As [`pipeline_steps_planned`], under options `o`; with `own_data`, each dp rank
/// trains on micro-batches of its own.
fn mesh_steps(g: &Graph, shape: Mesh, m: usize, o: ExecOptions, plan: Option<SitePlan>, split: PipelineSplit, own_data: bool) -> Vec<StageRun> {
    let Mesh(tp, pp, dp, sp, fsdp, vp) = shape;
    let b = g.tensors[g.tensor_id("tokens").unwrap()].shape[0] as u32;
    let layout = Layout {
        tp,
        pp,
        vp,
        dp,
        sequence_parallel: sp,
        fsdp,
        split,
        ..Layout::single(b, b * m as u32 * dp)
    };
    let hs: Vec<_> = mesh(tp, pp, dp)
        .into_iter()
        .map(|r| {
            let s = shard(g, &layout, r.coord).unwrap();
            let seed = if own_data { 40 + 1000 * r.coord.dp as u64 } else { 40 };
            let micro: Vec<Data> = (0..2 * m).map(|k| synthetic_inputs(g, seed + k as u64)).collect();
            let (g, o) = (g.clone(), o.clone());
            std::thread::spawn(move || {
                let mut ex = Executor::for_rank(&s, Cpu::new(), o, r.groups).unwrap();
                if let Some(p) = plan {
                    let sites: Vec<(String, GemmRole, SitePlan)> = s
                        .graph
                        .ops
                        .iter()
                        .filter(|o| o.kind == OpKind::Linear)
                        .flat_map(|o| GemmRole::ALL.map(|r| (o.name.clone(), r, p)))
                        .collect();
                    ex.set_precision(&sites).unwrap();
                }
                let t = r.coord.tp as usize;
                let mine: Vec<Data> = micro.iter().map(|d| rank_inputs(&g, &s.graph, d, t, tp as usize)).collect();
                let batches: Vec<Vec<(&str, Input<'_>)>> = mine
                    .iter()
                    .map(|d| d.iter().map(|(n, u, _)| (n.as_str(), Input::U32(u))).collect())
                    .collect();
                let losses = batches
                    .chunks(m)
                    .map(|step| ex.step_micro_batches(step, &runner_exec::executor::ADAMW_DEFAULT).unwrap())
                    .collect();
                StageRun {
                    coord: r.coord,
                    last: s.graph.ops.iter().any(|o| o.kind == OpKind::CrossEntropy),
                    losses,
                    weights: if fsdp { ex.gather_weights().unwrap() } else { weights(&ex) },
                    memory: ex.memory(),
                    buckets: ex.profile().grad_buckets.clone(),
                }
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// What a pipeline schedule must keep against the in-order one (`want`): the last
/// stage's losses and every stage's weights bit for bit; stage s holding `held[s]`
/// micro-batches at once (the in-order run one), more memory where it holds more, and
/// the memory account within 1.5x of the measured peak either way.
fn same_training(want: &[StageRun], got: &[StageRun], held: &[u64], what: &str) {
    for (a, b) in want.iter().zip(got) {
        assert_eq!(a.coord, b.coord);
        let stage = b.coord.pp as usize;
        if b.last {
            assert_eq!(a.losses, b.losses, "{what}: stage {stage}'s losses");
            assert!(b.losses.iter().all(|l| l.is_finite() && *l > 0.0), "{what}: {:?}", b.losses);
        }
        let differ: Vec<(&String, f32)> = a
            .weights
            .iter()
            .filter(|(n, w)| b.weights.get(*n) != Some(*w))
            .map(|(n, w)| (n, w.iter().zip(&b.weights[n]).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)))
            .collect();
        assert!(differ.is_empty(), "{what}: stage {stage}'s weights differ between the schedules (largest difference): {differ:?}");
        assert_eq!(a.memory.micro_batches_in_flight, 1, "{what}");
        assert_eq!(b.memory.micro_batches_in_flight, held[stage], "{what}: stage {stage}");
        if held[stage] > 1 {
            assert!(b.memory.peak_bytes > a.memory.peak_bytes, "{what}: stage {stage} held nothing more: {:?} vs {:?}", b.memory, a.memory);
            assert!(b.memory.required_bytes > a.memory.required_bytes, "{what}: stage {stage}");
        }
        for r in [&a.memory, &b.memory] {
            assert!(
                r.peak_bytes as f64 <= 1.5 * r.required_bytes as f64 && r.required_bytes as f64 <= 1.5 * r.peak_bytes as f64,
                "{what}: stage {stage}: {r:?}"
            );
        }
    }
}

/// Megatron's pipeline schedules against running each micro-batch's passes in order:
/// the same losses and weights bit for bit over two steps, over sends that wait for
/// their receive as on NCCL (an order that would hang GPUs times out here: the batched
/// sends and receives between the schedule's passes are what keeps the stages, and
/// with interleaving the ring of stages, from waiting on each other).
/// - 1F1B: each stage holds up to its distance to the last stage plus one micro-batch
///   (stage 0 of 4: 4 of 6).
/// - Interleaved (stage s of p holding chunks s, s + p, ...; Megatron's
///   `forward_backward_pipelining_with_interleaving`): stage 0 holds p·vp + p - 1 chunk
///   forwards at once (p = 2, vp = 2: 5 chunks, 3 micro-batches' worth; with exactly p
///   micro-batches stage 0 runs every forward first).
///
/// Over tp = 2 with SP and a tied vocabulary-parallel head, whose row statistics a later
/// micro-batch's pass must not reuse; over FSDP, whose passes gather the stage's weights
/// over dp between the pipeline's calls; and interleaved over MoE layers (routing plans
/// parked with their micro-batch), a multi-token-prediction head and Mamba layers, so
/// each of those rank graphs is cut into its chunks (a rank graph that could not be
/// would run in order and hold one micro-batch).
#[test]
fn pipeline_schedules_match_the_in_order_schedule_over_sends_that_wait_for_their_receive() {
    let cases = [
        (llama(4, false, false), Mesh(1, 4, 1, false, false, 1), 6, vec![4, 3, 2, 1]),
        (llama(2, true, true), Mesh(2, 2, 1, true, false, 1), 3, vec![2, 1]),
        (llama(2, true, false), Mesh(1, 2, 2, false, true, 1), 3, vec![2, 1]),
        (llama(4, false, false), Mesh(1, 2, 1, false, false, 2), 4, vec![3, 2]),
        (llama(6, false, false), Mesh(1, 3, 1, false, false, 2), 6, vec![4, 3, 2]),
        (llama(4, true, true), Mesh(2, 2, 1, true, false, 2), 2, vec![2, 2]),
        (llama(4, true, false), Mesh(1, 2, 2, false, true, 2), 4, vec![3, 2]),
        (toy_graph(ToyConfig { layers: 4, moe: Some((4, 2, 32)), ..ToyConfig::tiny() }), Mesh(1, 2, 1, false, false, 2), 4, vec![3, 2]),
        (toy_graph(ToyConfig { layers: 4, mtp: 1, ..ToyConfig::tiny() }), Mesh(1, 2, 1, false, false, 2), 4, vec![3, 2]),
        (with_roles(toy::mamba(&ToyConfig { layers: 4, ..ToyConfig::tiny() }), false), Mesh(1, 2, 1, false, false, 2), 4, vec![3, 2]),
    ];
    for (g, shape, m, held) in cases {
        let Mesh(tp, pp, dp, sp, fsdp, vp) = shape;
        let what = format!("tp={tp} pp={pp} vp={vp} dp={dp} sp={sp} fsdp={fsdp}, {m} micro-batches");
        let want = pipeline_steps(&g, shape, m, PipelineSchedule::InOrder);
        let got = pipeline_steps(&g, shape, m, PipelineSchedule::OneFOneB);
        same_training(&want, &got, &held, &what);
    }
}

/// The data-parallel gradient reduction overlapped with the backward, a bucket at a time
/// (Megatron's `overlap_grad_reduce`), against the reduction after the backward: the
/// same losses and weights bit for bit over two steps, each dp rank on data of its own,
/// with one weight per bucket and with one bucket for all; and the first bucket started
/// while backward steps were still to run. Over gradient accumulation (3 micro-batches:
/// the 1/3 scaling happens on the bucket's copy), a 1F1B and an interleaved pipeline
/// (each chunk's buckets start after its last micro-batch's backward), tp = 2 with SP (the
/// tp reduction stays after the backward) and FSDP, alone and under both pipeline
/// schedules (each layer's reduce-scatter, one per micro-batch, starts once its
/// gradients are final, as PyTorch FSDP's post-backward hook, instead of running at
/// once; it has no buckets: each unit is one). FSDP also against plain dp on the same
/// mesh: bit for bit with whole gradients accumulated (no pipeline), to 1e-5 after two
/// AdamW steps with sharded ones.
#[test]
fn overlapped_gradient_reduction_trains_as_the_reduction_after_the_backward() {
    let cases = [
        (llama(2, false, false), Mesh(1, 1, 2, false, false, 1), 3),
        (llama(2, false, false), Mesh(1, 2, 2, false, false, 1), 4),
        (llama(4, false, false), Mesh(1, 2, 2, false, false, 2), 4),
        (llama(2, true, true), Mesh(2, 1, 2, true, false, 1), 2),
        (llama(2, false, false), Mesh(1, 1, 2, false, true, 1), 2),
        (llama(2, true, false), Mesh(1, 2, 2, false, true, 1), 3),
        (llama(4, true, false), Mesh(1, 2, 2, false, true, 2), 4),
    ];
    for (g, shape, m) in cases {
        let Mesh(tp, pp, dp, sp, fsdp, vp) = shape;
        let what = format!("tp={tp} pp={pp} vp={vp} dp={dp} sp={sp} fsdp={fsdp}, {m} micro-batches");
        let run = |overlap: bool, elems: Option<usize>| {
            let o = ExecOptions { overlap_grad_reduce: overlap, grad_bucket_elems: elems, ..options() };
            mesh_steps(&g, shape, m, o, None, PipelineSplit::default(), true)
        };
        let after = run(false, Some(1));
        if fsdp {
            // Against plain dp over the same mesh: without sharded gradients the same
            // sums, bit for bit without a pipeline (with one, the tied embedding sums
            // over pp-embed before its reduce-scatter, and plain dp's bucket sums over dp
            // first); with them (each micro-batch's reduce-scatter added to the shard)
            // the same to rounding.
            let plain = mesh_steps(&g, Mesh(tp, pp, dp, sp, false, vp), m, options(), None, PipelineSplit::default(), true);
            let whole = ExecOptions { fsdp_sharded_grads: false, ..options() };
            let whole = mesh_steps(&g, shape, m, whole, None, PipelineSplit::default(), true);
            for ((p, w), a) in plain.iter().zip(&whole).zip(&after) {
                assert!(pp > 1 || (p.weights == w.weights && p.losses == w.losses), "{what}: without sharded gradients against plain dp");
                for (name, x) in &p.weights {
                    for (got, how) in [(&a.weights[name], "sharded"), (&w.weights[name], "whole")] {
                        let worst = x.iter().zip(got).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
                        assert!(worst <= 1e-5, "{what}: {name} ({how} gradients): {worst:e} from plain dp");
                    }
                }
            }
        }
        // A bucket closes once it holds at least the cap: at the smallest weight's size
        // every weight fills a bucket alone, as with a cap of 1.
        let smallest = g.tensors.iter().filter(|t| t.kind == runner_graph::TensorKind::Weight).map(|t| t.numel() as usize).min();
        for elems in [Some(1), smallest, None] {
            let over = run(true, elems);
            for (a, b) in after.iter().zip(&over) {
                let stage = b.coord.pp;
                if b.last {
                    assert_eq!(a.losses, b.losses, "{what}, buckets of {elems:?}: stage {stage}'s losses");
                }
                assert!(a.weights == b.weights, "{what}, buckets of {elems:?}: stage {stage}'s weights differ");
                assert!(a.buckets.is_empty(), "{what}: {:?}", a.buckets);
                assert!(b.buckets.iter().all(|k| k.group == "dp"), "{what}: {:?}", b.buckets);
                if fsdp {
                    // A reduce-scatter per unit and micro-batch (padded to the group),
                    // the bucket size aside; the first while backward steps were left.
                    // Without a pipeline every unit's; with one, a tied embedding's
                    // (summed over pp-embed first) runs after the backward.
                    let total: usize = b.buckets.iter().map(|k| k.elems).sum();
                    let dense = m * b.weights.values().map(Vec::len).sum::<usize>();
                    assert!(total <= dense + 2 * b.buckets.len() && (pp > 1 || total >= dense), "{what}: {total} for {dense}: {:?}", b.buckets);
                    assert!(!b.buckets.is_empty() && b.buckets[0].steps_left > 0, "{what}: {:?}", b.buckets);
                    continue;
                }
                let total: usize = b.buckets.iter().map(|k| k.elems).sum();
                let dense: usize = b.weights.values().map(Vec::len).sum();
                assert_eq!(total, dense, "{what}: every weight of the stage in one bucket");
                if elems.is_some_and(|e| e == 1 || Some(e) == smallest) {
                    assert_eq!(b.buckets.len(), b.weights.len(), "{what}, buckets of {elems:?}");
                    assert!(b.buckets[0].steps_left > 0, "{what}: the first bucket started after the backward: {:?}", b.buckets);
                } else {
                    assert_eq!(b.buckets.len(), 1, "{what}");
                    // One stage: its last backward step (the embedding's) writes a
                    // weight, so the one bucket starts with no step left.
                    if pp == 1 {
                        assert_eq!(b.buckets[0].steps_left, 0, "{what}: {:?}", b.buckets);
                    }
                }
            }
        }
    }
}

/// Under FP8 plans the schedules still agree bit for bit: each GEMM role keeps its own
/// scales and amax history (the backward's weight-gradient cast of X is its own site, not
/// the forward's), so running a later micro-batch's forward before an earlier one's
/// backward changes no scale a pass reads. Current scaling and delayed scaling with a
/// history, pp = 2 over 3 micro-batches, two steps.
#[test]
fn one_f_one_b_matches_the_in_order_schedule_under_fp8_plans() {
    let g = llama(2, false, false);
    let plain = pipeline_steps(&g, Mesh(1, 2, 1, false, false, 1), 3, PipelineSchedule::InOrder);
    let delayed = Scaling::Delayed { history: 4, reduction: AmaxReduction::Max, margin: 0 };
    for scaling in [Scaling::Current { margin: 0 }, delayed] {
        let plan = Some(fp8_plan(scaling));
        let shape = Mesh(1, 2, 1, false, false, 1);
        let want = pipeline_steps_planned(&g, shape, 3, PipelineSchedule::InOrder, plan, PipelineSplit::default());
        let got = pipeline_steps_planned(&g, shape, 3, PipelineSchedule::OneFOneB, plan, PipelineSplit::default());
        // The plans take effect on every stage.
        for (a, p) in want.iter().zip(&plain) {
            assert_ne!(a.weights, p.weights, "{scaling:?}: stage {} trained as without a plan", a.coord.pp);
        }
        for (a, b) in want.iter().zip(&got) {
            assert_eq!(b.memory.micro_batches_in_flight, (2 - b.coord.pp as u64).min(3));
            if b.last {
                assert_eq!(a.losses, b.losses, "{scaling:?}");
            }
            assert_eq!(a.weights, b.weights, "{scaling:?}: stage {}", b.coord.pp);
        }
    }
}

/// A chunk without a backward: LoRA freezes the embedding, and Megatron's split counting
/// it as a layer gives it a chunk of its own (pp = 2, vp = 2: stage 0's chunk 0), which
/// sends its output and receives no gradient back. The interleaved schedule still ends
/// each micro-batch's backward there and trains the adapters as the in-order one does.
#[test]
fn interleaving_with_a_frozen_chunk_matches_the_in_order_schedule() {
    let g = runner_graph::peft::lora(&llama(2, false, false), &runner_graph::peft::Lora { rank: 4, ..Default::default() }).unwrap();
    let shape = Mesh(1, 2, 1, false, false, 2);
    let split = PipelineSplit::megatron(true, true);
    let want = pipeline_steps_planned(&g, shape, 4, PipelineSchedule::InOrder, None, split);
    let got = pipeline_steps_planned(&g, shape, 4, PipelineSchedule::OneFOneB, None, split);
    for a in &want {
        assert!(a.weights.keys().all(|n| n.contains(".lora_")), "{:?}", a.weights.keys());
    }
    same_training(&want, &got, &[3, 2], "LoRA, pp=2 vp=2, the embedding a chunk");
}

/// The rank graphs of a two-stage pipeline of the two-layer toy (one sequence per
/// micro-batch), and two micro-batches of data.
fn two_stages() -> (Graph, Vec<runner_graph::shard::Sharded>, Vec<Data>) {
    let g = half_llama(false, false);
    let layout = Layout { pp: 2, ..Layout::single(1, 2) };
    let stages = (0..2).map(|p| shard(&g, &layout, RankCoord { pp: p, ..RankCoord::default() }).unwrap()).collect();
    let data = (0..2).map(|k| synthetic_inputs(&g, 50 + k)).collect();
    (g, stages, data)
}

/// A pipeline send or receive whose peer is not another rank of the `pp` group (rank 2
/// of two, or the stage itself) is refused, naming the op and the peer, by a step and
/// by a scheduled step over micro-batches (which posts the receives before the pass:
/// the check is there too), before any call that would wait on a rank that is not
/// there: the other stage never runs.
#[test]
fn a_pipeline_peer_outside_the_group_or_the_stage_itself_is_refused() {
    use runner_graph::Attr;
    let (g, stages, data) = two_stages();
    for (stage, kind, peer) in [(0usize, OpKind::Send, 2i64), (1, OpKind::Recv, 1), (1, OpKind::Recv, -1)] {
        let mut s = stages[stage].clone();
        let op = s.graph.ops.iter_mut().find(|o| o.kind == kind).unwrap();
        op.attrs.insert("peer".into(), Attr::Int(peer));
        let name = op.name.clone();
        let d: Vec<Data> = data.iter().map(|d| rank_inputs(&g, &s.graph, d, 0, 1)).collect();
        let batches: Vec<_> = d.iter().map(inputs).collect();
        for scheduled in [false, true] {
            let h = runner_exec::collective::ThreadGroup::rendezvous(2, std::time::Duration::from_secs(2)).swap_remove(stage);
            let groups: Vec<(String, Box<dyn runner_exec::collective::Collective>)> = vec![("pp".into(), Box::new(h))];
            let mut ex = Executor::for_rank(&s, Cpu::new(), options(), groups).unwrap();
            let e = if scheduled {
                ex.step_micro_batches(&batches, &runner_exec::executor::ADAMW_DEFAULT)
            } else {
                ex.step(&batches[0], &runner_exec::executor::ADAMW_DEFAULT)
            }
            .unwrap_err()
            .to_string();
            let want = format!("'{name}': peer Some({peer}) is not another rank of its group of 2 (this rank is {stage})");
            assert!(e.contains(&want), "stage {stage}, scheduled {scheduled}: {e}");
        }
    }
}

/// The schedule posts the pipeline's traffic on the `pp` group: a rank graph whose
/// sends and receives name another group (here `x`, the same two stages in the other
/// order, so each op's peer is the other stage's rank there, which on `pp` is the stage
/// itself) is not scheduled. Its sends and receives run with their ops, over `x`, one
/// micro-batch at a time, and train as the same pipeline over `pp` does, bit for bit.
#[test]
fn sends_and_receives_over_another_group_run_with_their_ops() {
    use runner_graph::Attr;
    let (g, stages, data) = two_stages();
    let run = |over_x: bool| {
        let x = runner_exec::collective::ThreadGroup::rendezvous(2, std::time::Duration::from_secs(20));
        let pp = runner_exec::collective::ThreadGroup::rendezvous(2, std::time::Duration::from_secs(20));
        let hs: Vec<_> = stages
            .iter()
            .cloned()
            .zip(x.into_iter().rev())
            .zip(pp)
            .enumerate()
            .map(|(stage, ((mut s, x), pp))| {
                if over_x {
                    for op in s.graph.ops.iter_mut().filter(|o| matches!(o.kind, OpKind::Send | OpKind::Recv)) {
                        op.attrs.insert("group".into(), Attr::Text("x".into()));
                        // The other stage is rank `stage` of `x`.
                        op.attrs.insert("peer".into(), Attr::Int(stage as i64));
                    }
                }
                let d: Vec<Data> = data.iter().map(|d| rank_inputs(&g, &s.graph, d, 0, 1)).collect();
                std::thread::spawn(move || {
                    let groups: Vec<(String, Box<dyn runner_exec::collective::Collective>)> = vec![("pp".into(), Box::new(pp)), ("x".into(), Box::new(x))];
                    let mut ex = Executor::for_rank(&s, Cpu::new(), options(), groups).unwrap();
                    let batches: Vec<_> = d.iter().map(inputs).collect();
                    let losses: Vec<f32> = (0..2).map(|_| ex.step_micro_batches(&batches, &runner_exec::executor::ADAMW_DEFAULT).unwrap()).collect();
                    (losses, weights(&ex), ex.memory().micro_batches_in_flight)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    };
    let (over_pp, over_x) = (run(false), run(true));
    assert_eq!(over_pp[0].2, 2, "stage 0 of 2 holds two micro-batches under 1F1B");
    for (stage, (a, b)) in over_pp.iter().zip(&over_x).enumerate() {
        assert_eq!(b.2, 1, "stage {stage}: over another group, one micro-batch at a time");
        assert_eq!(a.0, b.0, "stage {stage}: losses");
        assert_eq!(a.1, b.1, "stage {stage}: weights");
    }
}

/// A hand-written three-stage pipeline whose later stages start with two receives:
/// the hidden state (f32, it carries a gradient back) and the targets, an int32 tensor
/// the first stage reads as an input and the stages pass on (no gradient). Returns the
/// unsplit graph and the three stage graphs.
fn two_receives() -> (Graph, Vec<Graph>) {
    use runner_graph::{Attr, DType::*, NamedOp, Role, Tensor, TensorKind::*};
    let t = |name: &str, shape: &[u64], dtype, kind| Tensor { name: name.into(), shape: shape.to_vec(), dtype, kind };
    let op = |name: &str, kind, ins: &[&str], outs: &[&str], attrs: &[(&str, Attr)]| NamedOp::of(name, kind, ins, outs, attrs, -1, Role::Replicated);
    let pp = |peer: i64, no_grad: bool| {
        let mut a = vec![("group", Attr::Text("pp".into())), ("group-size", Attr::Int(3)), ("peer", Attr::Int(peer))];
        if no_grad {
            a.push(("no-grad", Attr::Flag(true)));
        }
        a
    };
    let scalar = |n: &str| t(n, &[], F32, Activation);
    let hidden = |n: &str| t(n, &[1, 4, 8], F32, Activation);
    let targets = |kind| t("y", &[1, 4], I32, kind);
    let (tokens, emb) = (t("tokens", &[1, 4], I32, Input), t("emb", &[16, 8], F32, Weight));
    let (w1, w2, w3) = (t("w1", &[8, 8], F32, Weight), t("w2", &[8, 8], F32, Weight), t("w3", &[16, 8], F32, Weight));
    let (logits, loss) = (t("logits", &[1, 4, 16], F32, Activation), t("loss", &[], F32, Activation));
    let stage_ops = [
        vec![op("embed", OpKind::Embedding, &["tokens", "emb"], &["h0"], &[]), op("lin1", OpKind::Linear, &["h0", "w1"], &["h1"], &[])],
        vec![op("lin2", OpKind::Linear, &["h1", "w2"], &["h2"], &[])],
        vec![op("head", OpKind::Linear, &["h2", "w3"], &["logits"], &[]), op("loss", OpKind::CrossEntropy, &["logits", "y"], &["loss"], &[])],
    ];
    let whole = Graph::new(
        vec![tokens.clone(), targets(Input), emb.clone(), w1.clone(), w2.clone(), w3.clone(), hidden("h0"), hidden("h1"), hidden("h2"), logits.clone(), loss.clone()],
        stage_ops.iter().flatten().cloned().collect(),
        "loss",
    )
    .unwrap();
    // Stage s receives its hidden state and the targets from s - 1 and sends its own
    // hidden state and the targets to s + 1; the send tokens sum into its objective.
    let receive = |s: i64, h: &str| vec![op(&format!("{h}.recv"), OpKind::Recv, &[], &[h], &pp(s - 1, false)), op("y.recv", OpKind::Recv, &[], &["y"], &pp(s - 1, true))];
    let send = |s: i64, h: &str| {
        let sent = format!("{h}.sent");
        vec![
            op(&format!("{h}.send"), OpKind::Send, &[h], &[&sent], &pp(s + 1, false)),
            op("y.send", OpKind::Send, &["y"], &["y.sent"], &pp(s + 1, false)),
            op("objective", OpKind::Add, &[&sent, "y.sent"], &["objective"], &[]),
        ]
    };
    let first = Graph::new(
        vec![tokens, targets(Input), emb, w1, hidden("h0"), hidden("h1"), scalar("h1.sent"), scalar("y.sent"), scalar("objective")],
        stage_ops[0].iter().cloned().chain(send(0, "h1")).collect(),
        "objective",
    )
    .unwrap();
    let middle = Graph::new(
        vec![hidden("h1"), targets(Activation), w2, hidden("h2"), scalar("h2.sent"), scalar("y.sent"), scalar("objective")],
        receive(1, "h1").into_iter().chain(stage_ops[1].iter().cloned()).chain(send(1, "h2")).collect(),
        "objective",
    )
    .unwrap();
    let last = Graph::new(
        vec![hidden("h2"), targets(Activation), w3, logits, loss],
        receive(2, "h2").into_iter().chain(stage_ops[2].iter().cloned()).collect(),
        "loss",
    )
    .unwrap();
    let stages = vec![first, middle, last];
    for g in stages.iter().chain([&whole]) {
        runner_graph::validate::validate(g).unwrap();
    }
    (whole, stages)
}

/// A pipeline chunk that starts with several receives is one chunk, scheduled: its
/// receives are posted together before its forward, and an int32 activation (the
/// targets, which the first stage reads and each stage passes on) crosses the pipeline
/// as its exact bits, whether the schedule posts it or the op receives it. Under 1F1B
/// over four micro-batches on three stages, stage s holds 3 - s micro-batches at once
/// (a graph cut at each receive would not be one chunk, and would run in order,
/// holding one), and either schedule's step equals the unsplit graph's: the mean loss
/// and the updated weights.
#[test]
fn a_chunk_starting_with_two_receives_one_of_int32_targets_is_scheduled() {
    let (whole, stages) = two_receives();
    let m = 4;
    let micro: Vec<Data> = (0..m)
        .map(|k| {
            let ids = |salt: u32| (0..4).map(|i| (i * 7 + k * 5 + salt) % 16).collect::<Vec<u32>>();
            vec![("tokens".to_string(), ids(1), Vec::new()), ("y".to_string(), ids(3), Vec::new())]
        })
        .collect();
    let mut reference = Executor::new(&whole, Cpu::new(), options()).unwrap();
    let w0 = weights(&reference);
    let batches: Vec<_> = micro.iter().map(inputs).collect();
    let want_loss = reference.step_micro_batches(&batches, &runner_exec::executor::ADAMW_DEFAULT).unwrap();
    let want = weights(&reference);
    assert!(want_loss > 0.0);
    for (schedule, held) in [(PipelineSchedule::OneFOneB, [3, 2, 1]), (PipelineSchedule::InOrder, [1, 1, 1])] {
        let groups = runner_exec::collective::ThreadGroup::rendezvous(3, std::time::Duration::from_secs(10));
        let hs: Vec<_> = stages
            .iter()
            .cloned()
            .zip(groups)
            .enumerate()
            .map(|(stage, (g, h))| {
                let (w0, micro) = (w0.clone(), micro.clone());
                std::thread::spawn(move || {
                    let o = ExecOptions { pipeline_schedule: schedule, ..options() };
                    let groups: Vec<(String, Box<dyn runner_exec::collective::Collective>)> = vec![("pp".into(), Box::new(h))];
                    let mut ex = Executor::with_collectives(&g, Cpu::new(), o, groups).unwrap();
                    for (name, v) in &w0 {
                        if g.tensor_id(name).is_some() {
                            ex.set_weight(name, v).unwrap();
                        }
                    }
                    let mine: Vec<Data> = if stage == 0 { micro } else { vec![Vec::new(); micro.len()] };
                    let batches: Vec<_> = mine.iter().map(inputs).collect();
                    let loss = ex.step_micro_batches(&batches, &runner_exec::executor::ADAMW_DEFAULT).unwrap();
                    (loss, weights(&ex), ex.memory().micro_batches_in_flight)
                })
            })
            .collect();
        let out: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let what = format!("{schedule:?}");
        assert_eq!(out.iter().map(|o| o.2).collect::<Vec<_>>(), held, "{what}: micro-batches each stage held at once");
        assert!((out[2].0 - want_loss).abs() <= 1e-6 * want_loss, "{what}: loss {} against {want_loss}", out[2].0);
        for (stage, (_, w, _)) in out.iter().enumerate() {
            assert!(!w.is_empty());
            for (name, v) in w {
                close(&format!("{what}: stage {stage}'s {name}"), v, &want[name]);
            }
        }
    }
}
