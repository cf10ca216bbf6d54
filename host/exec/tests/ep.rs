//! Expert parallelism end to end on the CPU: shard the toy MoE Llama with ep = 2 carved
//! out of the data-parallel (or tensor-parallel) ranks, run every rank as a thread, and
//! check each rank's loss, its dense and expert weight gradients after the step's
//! reduction, and a few AdamW steps against the unsharded model, with routing that sends
//! the ranks different numbers of rows (down to none).

mod common;

use std::collections::HashMap;

use common::{
    Data, Grads, close, expert_coord, expert_mesh, options, rank_inputs, run, slice, split_axis,
    train, weights, with_roles,
};
use runner_exec::cpu::Cpu;
use runner_exec::proxy::synthetic_inputs;
use runner_exec::toy::{self, ToyConfig};
use runner_exec::precision::{GemmRole, OperandPlan, Scaling, SitePlan};
use runner_exec::{ExecOptions, Executor, Input};
use runner_graph::recompute::RecomputePolicy;
use runner_graph::shard::{Layout, shard};
use runner_graph::{DType, Graph, OpKind, TensorKind};

/// Experts, top-k, expert width of the toy MoE.
const MOE: (u64, u64, u64) = (4, 2, 32);

/// The toy MoE Llama with its parallel roles, at `batch` sequences.
fn toy_moe(batch: u64) -> Graph {
    with_roles(
        toy::llama(&ToyConfig {
            moe: Some(MOE),
            batch,
            ..ToyConfig::tiny()
        }),
        true,
    )
}

fn is_expert(name: &str) -> bool {
    name.contains(".moe.experts.")
}

/// Rows `r·n/parts..` of `x` (shape `full`) along axis 0: part `r` of `parts`.
fn part<T: Copy>(x: &[T], full: &[u64], r: usize, parts: usize) -> Vec<T> {
    slice(x, full, 0, r, parts)
}

/// Data-parallel rank `d`'s half (of `dp`) of the full batch `data` of graph `gfull`.
fn dp_part(gfull: &Graph, data: &Data, d: usize, dp: usize) -> Data {
    data.iter()
        .map(|(n, u, f)| {
            let s = &gfull.tensors[gfull.tensor_id(n).unwrap()].shape;
            (n.clone(), part(u, s, d, dp), f.clone())
        })
        .collect()
}

/// What one rank reports.
struct Out {
    ep_rank: usize,
    tp_rank: usize,
    holder: Holder,
    losses: Vec<f32>,
    grads: Grads,
    weights: Grads,
    shapes: HashMap<String, Vec<u64>>,
    /// Rows each MoE layer's dispatch all-to-all received.
    rows: Vec<(String, usize)>,
    /// GEMMs that ran on FP8 codes (the native route).
    native_gemms: u64,
    /// The group of each overlapped gradient bucket of the last step.
    buckets: Vec<String>,
}

/// How a test drives one rank.
#[derive(Clone, Copy)]
enum Drive {
    /// One forward, backward and gradient reduction.
    Gradients,
    /// `n` AdamW steps.
    Train(usize),
    /// `n` AdamW steps with every GEMM but the router's per-tensor FP8 ([`fp8_sites`]).
    TrainFp8(usize),
}

/// Every linear and expert linear of `g` but the router, all three GEMMs in per-tensor
/// FP8 (E4M3, E5M2 gradients) under current scaling.
fn fp8_sites(g: &Graph) -> Vec<(String, GemmRole, SitePlan)> {
    let operand = |format| OperandPlan { format, scaling: Scaling::Current { margin: 0 }, saturate: true, stochastic: false, hadamard: 0 };
    let plan = SitePlan { activation: operand(DType::Fp8E4M3), weight: operand(DType::Fp8E4M3), gradient: operand(DType::Fp8E5M2), output: DType::BF16 };
    g.ops
        .iter()
        .filter(|o| matches!(o.kind, OpKind::Linear | OpKind::GroupedLinear) && !o.name.contains("router"))
        .flat_map(|o| GemmRole::ALL.map(|r| (o.name.clone(), r, plan)))
        .collect()
}

/// Shard `g` (the micro-batch graph) at `layout`, give every rank the unsharded weights
/// `w0` (its experts and tp shards of them) and its data-parallel part of `data` (the full
/// batch of `gfull`, split over dp, then over tp where sequence parallelism splits the
/// inputs), and drive each rank as a thread.
fn on_ranks(
    g: &Graph,
    gfull: &Graph,
    layout: &Layout,
    w0: &Grads,
    data: &Data,
    drive: Drive,
) -> Vec<Out> {
    on_ranks_with(g, gfull, layout, w0, data, drive, &options())
}

/// As [`on_ranks`], the ranks running with `opts`.
fn on_ranks_with(
    g: &Graph,
    gfull: &Graph,
    layout: &Layout,
    w0: &Grads,
    data: &Data,
    drive: Drive,
    opts: &ExecOptions,
) -> Vec<Out> {
    let (tp, ep, dp) = (layout.tp, layout.ep, layout.dp);
    let hs: Vec<_> = expert_mesh(tp, 1, dp, ep, layout.etp)
        .into_iter()
        .map(|m| {
            let s = shard(g, layout, m.coord).unwrap();
            let (etr, er, _) = expert_coord(m.coord, tp, ep, layout.etp);
            let me = Holder {
                ep_rank: er as usize,
                ep: ep as usize,
                etp_rank: etr as usize,
                etp: layout.etp as usize,
                tp_rank: m.coord.tp as usize,
                tp: tp as usize,
            };
            let (tr, d) = (m.coord.tp as usize, m.coord.dp as usize);
            let half = dp_part(gfull, data, d, dp as usize);
            let (g, w0, opts) = (g.clone(), w0.clone(), opts.clone());
            std::thread::spawn(move || {
                let mut ex = Executor::for_rank(&s, Cpu::new(), opts, m.groups).unwrap();
                for t in s
                    .graph
                    .tensors
                    .iter()
                    .filter(|t| t.kind == TensorKind::Weight)
                {
                    let local = me.part(&g, &t.name, &t.shape, &w0[&t.name]);
                    ex.set_weight(&t.name, &local).unwrap();
                }
                let d = rank_inputs(&g, &s.graph, &half, tr, tp as usize);
                let (losses, grads) = match drive {
                    Drive::Gradients => {
                        let (l, gr) = run(&mut ex, &d);
                        (vec![l], gr)
                    }
                    Drive::Train(n) => (train(&mut ex, &d, n), Grads::new()),
                    Drive::TrainFp8(n) => {
                        ex.set_precision(&fp8_sites(&s.graph)).unwrap();
                        let losses = (0..n)
                            .map(|_| {
                                let l = train(&mut ex, &d, 1)[0];
                                ex.end_precision_step();
                                l
                            })
                            .collect();
                        (losses, Grads::new())
                    }
                };
                Out {
                    ep_rank: er as usize,
                    tp_rank: tr,
                    holder: me,
                    losses,
                    grads,
                    weights: weights(&ex),
                    shapes: s
                        .graph
                        .tensors
                        .iter()
                        .map(|t| (t.name.clone(), t.shape.clone()))
                        .collect(),
                    rows: ex.expert_rows(),
                    native_gemms: ex.native_fp8_gemms(),
                    buckets: ex.profile().grad_buckets.iter().map(|b| b.group.clone()).collect(),
                }
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// What part of each weight a rank holds: its experts (ep) and its part of their width
/// (etp), its tp shard of the dense weights.
#[derive(Clone, Copy, Debug)]
struct Holder {
    ep_rank: usize,
    ep: usize,
    etp_rank: usize,
    etp: usize,
    tp_rank: usize,
    tp: usize,
}

impl Holder {
    /// This rank's part (local shape `local`) of unsharded weight `name` of `g`, `value`.
    fn part(&self, g: &Graph, name: &str, local: &[u64], value: &[f32]) -> Vec<f32> {
        let mut shape = g.tensors[g.tensor_id(name).unwrap()].shape.clone();
        let mut v = value.to_vec();
        if is_expert(name) {
            if shape[0] != local[0] {
                v = part(&v, &shape, self.ep_rank, self.ep);
                shape[0] = local[0];
            }
            match split_axis(&shape, local) {
                None => v,
                Some(ax) => slice(&v, &shape, ax, self.etp_rank, self.etp),
            }
        } else {
            match split_axis(&shape, local) {
                None => v,
                Some(ax) => slice(&v, &shape, ax, self.tp_rank, self.tp),
            }
        }
    }
}

/// Rank `o`'s part of unsharded tensor `name` (shape from `g`).
fn own_part(g: &Graph, o: &Out, name: &str, full_value: &[f32]) -> Vec<f32> {
    o.holder.part(g, name, &o.shapes[name], full_value)
}

/// Every weight's gradient on every rank against the unsharded full-batch gradient `want`
/// (a rank checks the part it holds).
fn check_grads(g: &Graph, out: &[Out], want: &Grads) {
    for o in out {
        assert_eq!(o.grads.len(), want.len(), "every weight has a gradient");
        for (name, w) in want {
            let label = format!("{name} (ep rank {}, tp rank {})", o.ep_rank, o.tp_rank);
            close(&label, &o.grads[name], &own_part(g, o, name, w));
        }
    }
}

/// Rows each rank's MoE layers received, by rank.
fn rows_by_rank(out: &[Out]) -> Vec<Vec<usize>> {
    out.iter()
        .map(|o| o.rows.iter().map(|(_, r)| *r).collect())
        .collect()
}

/// The unsharded runs: the full batch (loss, gradients) and each dp half's loss.
fn unsharded(
    g: &Graph,
    gfull: &Graph,
    w0: &Grads,
    data: &Data,
    dp: usize,
) -> (f32, Grads, Vec<f32>) {
    let mut full = Executor::new(gfull, Cpu::new(), options()).unwrap();
    for (n, w) in w0 {
        full.set_weight(n, w).unwrap();
    }
    let (loss, grads) = run(&mut full, data);
    let halves = (0..dp)
        .map(|d| {
            let mut ex = Executor::new(g, Cpu::new(), options()).unwrap();
            for (n, w) in w0 {
                ex.set_weight(n, w).unwrap();
            }
            run(&mut ex, &dp_part(gfull, data, d, dp)).0
        })
        .collect();
    (loss, grads, halves)
}

fn ep_dp_layout(ep: u32, dp: u32) -> Layout {
    Layout {
        ep,
        dp,
        ..Layout::single(2, 2 * dp)
    }
}

/// ep = 2 over dp = 2 against the unsharded model, starting from weights `w0`: each
/// rank's loss is the unsharded loss of its half of the batch, and after the step's
/// reduction every rank holds the full batch's gradients (dense weights: the dp mean;
/// its experts: the sum its ep group's tokens brought, over dp). Returns the rows each
/// rank's layers received, and the unsharded gradients.
fn check_ep2_dp2(w0: &Grads, seed: u64) -> (Vec<Vec<usize>>, Grads) {
    let (g, gfull) = (toy_moe(2), toy_moe(4));
    let data = synthetic_inputs(&gfull, seed);
    let (loss, want, halves) = unsharded(&g, &gfull, w0, &data, 2);
    let layout = ep_dp_layout(2, 2);
    let out = on_ranks(&g, &gfull, &layout, w0, &data, Drive::Gradients);
    for (d, o) in out.iter().enumerate() {
        assert_eq!(o.ep_rank, d, "ep rank = dp rank at tp = 1");
        let l = o.losses[0];
        assert!(
            (l - halves[d]).abs() <= 1e-5 * halves[d].abs(),
            "rank {d}: loss {l} vs its half's {}",
            halves[d]
        );
    }
    let mean = (out[0].losses[0] + out[1].losses[0]) / 2.0;
    assert!(
        (mean - loss).abs() <= 1e-5 * loss.abs(),
        "mean of the ranks' losses {mean} vs the full batch's {loss}"
    );
    check_grads(&g, &out, &want);
    (rows_by_rank(&out), want)
}

fn initial_weights() -> Grads {
    weights(&Executor::new(&toy_moe(2), Cpu::new(), options()).unwrap())
}

/// Balanced rows per rank per layer: N·k of one rank's micro-batch.
const BALANCED: usize = 2 * 8 * MOE.1 as usize;

#[test]
fn ep2_over_dp2_matches_unsharded_loss_and_gradients() {
    let (rows, _) = check_ep2_dp2(&initial_weights(), 11);
    // The routing is data-dependent: the ranks' layers do not all receive the balanced
    // count, so the dynamic sizes are exercised.
    let all: Vec<usize> = rows.concat();
    assert_eq!(all.len(), 4, "two layers on two ranks: {rows:?}");
    assert!(all.iter().any(|&r| r != BALANCED), "rows received {rows:?}");
    // Every row sent is received once per layer.
    for layer in 0..2 {
        assert_eq!(rows[0][layer] + rows[1][layer], 2 * BALANCED, "{rows:?}");
    }
}

/// Router weights that send every token to expert 0 and to expert 2 or 1 (expert 2 only
/// when its logit is positive): expert 3 gets no row, so ep rank 1 receives rows for one
/// of its experts and none for the other. With `starve`, all router weights are zero:
/// every token ties and goes to experts 0 and 1, and ep rank 1 receives no row at all.
fn skewed_router(w0: &Grads, starve: bool) -> Grads {
    let mut w = w0.clone();
    for (name, v) in w.iter_mut() {
        if name.ends_with(".moe.router_logits.weight") {
            let c = v.len() / MOE.0 as usize;
            for (e, row) in v.chunks_mut(c).enumerate() {
                if starve || e != 2 {
                    row.fill(0.0);
                }
            }
        }
    }
    w
}

#[test]
fn ep2_rank_receiving_no_rows_for_an_expert_matches_unsharded() {
    let (rows, want) = check_ep2_dp2(&skewed_router(&initial_weights(), false), 5);
    for layer in 0..2 {
        assert!(
            rows[1][layer] > 0 && rows[0][layer] > rows[1][layer],
            "{rows:?}"
        );
        // Expert 3 (ep rank 1's second) got no row, expert 2 (its first) some.
        for w in ["gate", "up", "down"] {
            let g = &want[&format!("layers.{layer}.moe.experts.{w}.weight")];
            let per = g.len() / MOE.0 as usize;
            assert!(
                g[3 * per..].iter().all(|&x| x == 0.0),
                "expert 3 has no rows"
            );
            assert!(
                g[2 * per..3 * per].iter().any(|&x| x != 0.0),
                "expert 2 has rows"
            );
        }
    }
}

#[test]
fn ep2_rank_receiving_no_rows_at_all_matches_unsharded() {
    let (rows, _) = check_ep2_dp2(&skewed_router(&initial_weights(), true), 5);
    assert_eq!(rows, [[2 * BALANCED, 2 * BALANCED], [0, 0]]);
}

/// Three AdamW steps at ep = 2 over dp = 2 track the unsharded full-batch run: the mean of
/// the ranks' losses is the full batch's at every step, and every rank's weights (dense,
/// and its own experts) end where the unsharded run's do.
#[test]
fn ep2_training_steps_track_unsharded() {
    let (g, gfull) = (toy_moe(2), toy_moe(4));
    let data = synthetic_inputs(&gfull, 7);
    let w0 = initial_weights();
    let mut full = Executor::new(&gfull, Cpu::new(), options()).unwrap();
    let want = train(&mut full, &data, 3);
    let w3 = weights(&full);
    let out = on_ranks(&g, &gfull, &ep_dp_layout(2, 2), &w0, &data, Drive::Train(3));
    for (i, w) in want.iter().enumerate() {
        let mean = (out[0].losses[i] + out[1].losses[i]) / 2.0;
        assert!(
            (mean - w).abs() <= 1e-5 * w.abs(),
            "step {i}: {mean} vs {w}"
        );
    }
    assert!(want[2] < want[0], "the toy learns: {want:?}");
    for o in &out {
        for (name, w) in &w3 {
            let got = &o.weights[name];
            let want = own_part(&g, o, name, w);
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                worst < 1e-5,
                "{name} on ep rank {} drifted by {worst:e}",
                o.ep_rank
            );
        }
    }
}

/// The overlapped gradient reduction over expert parallelism: ep = 2 over dp = 4, so the
/// dense weights reduce over dp (4 ranks) and the experts over edp (2 ranks, divided by
/// all 4), each a bucket per weight started during the backward. The same losses and
/// weights bit for bit as the reduction after the backward, over two steps.
#[test]
fn overlapped_reduction_over_dp_and_edp_trains_as_after_the_backward() {
    let (g, gfull) = (toy_moe(2), toy_moe(8));
    let data = synthetic_inputs(&gfull, 13);
    let w0 = initial_weights();
    let layout = ep_dp_layout(2, 4);
    let run = |overlap: bool| {
        let o = ExecOptions { overlap_grad_reduce: overlap, grad_bucket_elems: Some(1), ..options() };
        on_ranks_with(&g, &gfull, &layout, &w0, &data, Drive::Train(2), &o)
    };
    let (after, over) = (run(false), run(true));
    for (a, b) in after.iter().zip(&over) {
        assert_eq!(a.losses, b.losses);
        assert!(a.weights == b.weights, "ep rank {}: the weights differ", b.ep_rank);
        assert!(a.buckets.is_empty());
        let dense = b.buckets.iter().filter(|g| *g == "dp").count();
        let expert = b.buckets.iter().filter(|g| *g == "edp").count();
        assert!(dense > 0 && expert > 0 && dense + expert == b.buckets.len(), "{:?}", b.buckets);
        assert!(b.losses.iter().all(|l| l.is_finite()));
    }
}

/// Expert parallelism under FP8 on the native route: each rank casts its own experts'
/// weights to one FP8 tensor per expert and the rows its all-to-all received to one,
/// and its losses and weights after two steps equal the emulated route's bit for bit,
/// with every planned GEMM of every rank on codes.
#[test]
fn ep2_fp8_native_route_matches_the_emulated_route() {
    let (g, gfull) = (toy_moe(2), toy_moe(4));
    let data = synthetic_inputs(&gfull, 7);
    let w0 = initial_weights();
    let layout = ep_dp_layout(2, 2);
    let train_in = |native: bool| {
        let opts = ExecOptions { native_fp8: Some(native), ..options() };
        on_ranks_with(&g, &gfull, &layout, &w0, &data, Drive::TrainFp8(2), &opts)
    };
    let (emulated, native) = (train_in(false), train_in(true));
    let planned = 2 * fp8_sites(&g).len() as u64;
    assert!(planned > 0);
    for (e, n) in emulated.iter().zip(&native) {
        assert_eq!(e.native_gemms, 0, "the emulated route encodes nothing");
        assert_eq!(n.native_gemms, planned, "ep rank {}: every planned GEMM of two steps on codes", n.ep_rank);
        assert_eq!(n.losses, e.losses, "ep rank {}: losses", n.ep_rank);
        assert_eq!(n.weights, e.weights, "ep rank {}: weights after two steps", n.ep_rank);
    }
}

/// FP8 expert linears under etp = tp = 2 with sequence parallelism and ep = 2 over
/// dp = 2: each expert's scale covers the rows gathered over etp, and the native route
/// (GEMMs on codes) trains as the emulated one, bit for bit.
#[test]
fn etp2_sequence_parallel_fp8_native_route_matches_the_emulated_route() {
    let (g, gfull) = (toy_moe(2), toy_moe(4));
    let data = synthetic_inputs(&gfull, 7);
    let w0 = initial_weights();
    let layout = Layout { tp: 2, etp: 2, ep: 2, dp: 2, sequence_parallel: true, ..Layout::single(2, 4) };
    let train_in = |native: bool| {
        let opts = ExecOptions { native_fp8: Some(native), ..options() };
        on_ranks_with(&g, &gfull, &layout, &w0, &data, Drive::TrainFp8(2), &opts)
    };
    let (emulated, native) = (train_in(false), train_in(true));
    for (e, n) in emulated.iter().zip(&native) {
        assert!(n.native_gemms > 0 && e.native_gemms == 0);
        assert!(e.losses.iter().all(|l| l.is_finite()), "{:?}", e.losses);
        assert_eq!(n.losses, e.losses, "ep rank {}: losses", n.ep_rank);
        assert_eq!(n.weights, e.weights, "ep rank {}: weights after two steps", n.ep_rank);
    }
    // The etp pair of each ep rank ends with the same dense weights (their tp parts
    // aside, the same replicated norms).
    assert_eq!(native[0].losses, native[1].losses);
}

/// Full activation recompute re-runs each layer, its two all-to-alls included, before
/// the layer's backward: every rank re-runs the same exchanges in the same order, and
/// the gradients are those of keeping everything.
#[test]
fn ep2_with_full_recompute_matches_unsharded() {
    let (g, gfull) = (toy_moe(2), toy_moe(4));
    let data = synthetic_inputs(&gfull, 11);
    let w0 = initial_weights();
    let (_, want, _) = unsharded(&g, &gfull, &w0, &data, 2);
    let opts = ExecOptions {
        recompute: RecomputePolicy::Full,
        ..options()
    };
    let layout = ep_dp_layout(2, 2);
    let out = on_ranks_with(&g, &gfull, &layout, &w0, &data, Drive::Gradients, &opts);
    check_grads(&g, &out, &want);
}

/// Expert tensor parallelism: etp = 2 over tp = 2, alone (ep = 1) and with ep = 2 over
/// dp = 2. Each etp rank holds half of every expert's width. Without sequence
/// parallelism the etp ranks hold the same tokens and the input gradients of the
/// linears split in width are all-reduced over etp; with it each rank's received rows
/// are gathered over etp before the experts and the outputs reduce-scattered after.
fn check_etp2_over_tp2(sequence_parallel: bool) {
    for (ep, dp) in [(1u32, 1u32), (2, 2)] {
        let (g, gfull) = (toy_moe(2), toy_moe(2 * u64::from(dp)));
        let data = synthetic_inputs(&gfull, 13);
        let w0 = initial_weights();
        let (loss, want, halves) = unsharded(&g, &gfull, &w0, &data, dp as usize);
        let layout = Layout {
            tp: 2,
            etp: 2,
            ep,
            dp,
            sequence_parallel,
            ..Layout::single(2, 2 * dp)
        };
        let s = shard(&g, &layout, runner_graph::shard::RankCoord::default()).unwrap();
        let etp_ops: Vec<OpKind> = s.graph.ops.iter().filter(|o| o.text("group") == Some("etp")).map(|o| o.kind).collect();
        let per_layer = if sequence_parallel {
            // The rows and the routing indices gathered, the output reduce-scattered.
            vec![OpKind::AllGather, OpKind::AllGather, OpKind::ReduceScatter]
        } else {
            vec![OpKind::AllReduce]
        };
        assert_eq!(etp_ops, [per_layer.clone(), per_layer].concat(), "sequence parallel {sequence_parallel}, ep={ep}");
        let out = on_ranks(&g, &gfull, &layout, &w0, &data, Drive::Gradients);
        for (i, o) in out.iter().enumerate() {
            let want_loss = if dp == 1 { loss } else { halves[i / 2] };
            let l = o.losses[0];
            assert!(
                (l - want_loss).abs() <= 1e-5 * want_loss.abs(),
                "ep={ep}: {l} vs {want_loss}"
            );
        }
        check_grads(&g, &out, &want);
        if sequence_parallel {
            // Recomputing the layers runs the gather again, with the counts of its step.
            let opts = ExecOptions { recompute: RecomputePolicy::Full, ..options() };
            check_grads(&g, &on_ranks_with(&g, &gfull, &layout, &w0, &data, Drive::Gradients, &opts), &want);
        }
    }
}

#[test]
fn etp2_over_tp2_matches_unsharded() {
    check_etp2_over_tp2(false);
}

#[test]
fn etp2_over_tp2_sequence_parallel_matches_unsharded() {
    check_etp2_over_tp2(true);
}

/// An etp group inside a sequence-parallel tp group: etp = 2 within tp = 4, alone and
/// with ep = 2 carved out of the tp ranks. Each pair of tp ranks gathers its two
/// sequence shards before the experts, so the rows an etp rank runs are half the tp
/// group's; the gradients are the unsharded run's.
#[test]
fn etp2_within_a_sequence_parallel_tp4_group_matches_unsharded() {
    // Four kv heads, one per tp rank (the mesh makes no tp-kv groups).
    let g = with_roles(toy::llama(&ToyConfig { moe: Some(MOE), batch: 2, kv_heads: 4, ..ToyConfig::tiny() }), true);
    let data = synthetic_inputs(&g, 17);
    let w0 = weights(&Executor::new(&g, Cpu::new(), options()).unwrap());
    let (loss, want, _) = unsharded(&g, &g, &w0, &data, 1);
    for ep in [1u32, 2] {
        let layout = Layout { tp: 4, etp: 2, ep, sequence_parallel: true, ..Layout::single(2, 2) };
        let s = shard(&g, &layout, runner_graph::shard::RankCoord::default()).unwrap();
        let ag = s.graph.ops.iter().find(|o| o.kind == OpKind::AllGather && o.text("group") == Some("etp")).unwrap();
        let (i, o) = (&s.graph.tensors[ag.inputs[0]].shape, &s.graph.tensors[ag.outputs[0]].shape);
        assert_eq!(o[0], 2 * i[0], "ep={ep}: two sequence shards' rows");
        let out = on_ranks(&g, &g, &layout, &w0, &data, Drive::Gradients);
        for o in &out {
            assert!((o.losses[0] - loss).abs() <= 1e-5 * loss.abs(), "ep={ep}: {} vs {loss}", o.losses[0]);
        }
        check_grads(&g, &out, &want);
    }
    // An etp group across tp groups is refused by the layout check (so a projection
    // cannot price it either), naming the etp that works.
    let layout = Layout { tp: 2, etp: 4, dp: 2, sequence_parallel: true, ..Layout::single(2, 4) };
    let err = shard(&toy_moe(2), &layout, runner_graph::shard::RankCoord::default()).expect_err("refused");
    assert!(err.contains("use etp = 1 or a divisor of 2"), "{err}");
}

/// ep = 2 carved out of tp = 2 (etp = 1, dp = 1): the ep group is the tp group. With
/// sequence parallelism each tp rank routes its own sequence shard; without it both
/// route copies of the same tokens, each copy's rows go through the experts, and the
/// expert gradients are divided by those copies (`edp` of one rank, mean over tp).
fn check_ep2_tp2(sequence_parallel: bool) {
    let g = toy_moe(2);
    let data = synthetic_inputs(&g, 13);
    let w0 = initial_weights();
    let (loss, want, _) = unsharded(&g, &g, &w0, &data, 1);
    let layout = Layout {
        tp: 2,
        ep: 2,
        sequence_parallel,
        ..Layout::single(2, 2)
    };
    let out = on_ranks(&g, &g, &layout, &w0, &data, Drive::Gradients);
    for o in &out {
        assert_eq!(o.ep_rank, o.tp_rank);
        let l = o.losses[0];
        assert!(
            (l - loss).abs() <= 1e-5 * loss.abs(),
            "tp rank {}: loss {l} vs {loss}",
            o.tp_rank
        );
    }
    check_grads(&g, &out, &want);
    let rows = rows_by_rank(&out);
    let per_rank = if sequence_parallel {
        BALANCED / 2
    } else {
        BALANCED
    };
    for layer in 0..2 {
        assert_eq!(rows[0][layer] + rows[1][layer], 2 * per_rank, "{rows:?}");
    }
}

#[test]
fn ep2_over_tp2_sequence_parallel_matches_unsharded() {
    check_ep2_tp2(true);
}

#[test]
fn ep2_over_tp2_without_sequence_parallelism_matches_unsharded() {
    check_ep2_tp2(false);
}

/// Replicated experts (ep = 1) at tp = 2 with sequence parallelism: each tp rank's expert
/// gradients cover its sequence shard only; the `edp` reduction over the tp ranks sums
/// them (divided by dp·cp = 1, not by the group's 2 ranks).
#[test]
fn moe_tp2_sequence_parallel_expert_gradients_match_unsharded() {
    let g = toy_moe(2);
    let data = synthetic_inputs(&g, 3);
    let w0 = initial_weights();
    let (loss, want, _) = unsharded(&g, &g, &w0, &data, 1);
    let layout = Layout {
        tp: 2,
        sequence_parallel: true,
        ..Layout::single(2, 2)
    };
    let s = shard(&g, &layout, runner_graph::shard::RankCoord::default()).unwrap();
    let edp = s.step.iter().find(|c| c.group == "edp").unwrap();
    assert_eq!((edp.group_size, edp.mean_over), (2, 1));
    let out = on_ranks(&g, &g, &layout, &w0, &data, Drive::Gradients);
    for o in &out {
        assert!((o.losses[0] - loss).abs() <= 1e-5 * loss.abs());
    }
    check_grads(&g, &out, &want);
}

/// The EP rank graph: the all-to-alls are still declared (and priced) at the balanced
/// size, the expert gradients are averaged over dp with no edp peer, and token ids are
/// still bounded by the vocabulary on the rank.
#[test]
fn ep_rank_graph_keeps_balanced_shapes_and_input_checks() {
    let g = toy_moe(2);
    let layout = ep_dp_layout(2, 2);
    let s = shard(
        &g,
        &layout,
        runner_graph::shard::RankCoord {
            dp: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let a2a: Vec<_> = runner_project::comm::comm_volume(&s.graph)
        .into_iter()
        .filter(|c| c.kind == OpKind::AllToAll)
        .collect();
    assert_eq!(a2a.len(), 4, "dispatch and combine, two layers");
    for c in &a2a {
        assert_eq!((c.group.as_str(), c.group_size), ("ep", 2));
        assert_eq!(c.bytes, (BALANCED * 32 * 2) as f64, "bf16 rows of C = 32");
    }
    let edp = s.step.iter().find(|c| c.group == "edp").unwrap();
    assert_eq!(
        (edp.group_size, edp.mean_over),
        (1, 2),
        "no peer; the mean over dp"
    );
    assert_eq!(
        s.step
            .iter()
            .find(|c| c.group == "dp")
            .map(|c| (c.group_size, c.mean_over)),
        Some((2, 2))
    );
    let bounds = runner_exec::executor::int_bounds_of(&s.graph);
    for name in ["tokens", "targets"] {
        assert_eq!(bounds[&s.graph.tensor_id(name).unwrap()].0, 64, "{name}");
    }
    let mut m = expert_mesh(1, 1, 2, 2, 1);
    let mut ex = Executor::for_rank(&s, Cpu::new(), options(), m.remove(1).groups).unwrap();
    let ids = vec![64u32; 16];
    let err = ex
        .forward(&[("tokens", Input::U32(&ids)), ("targets", Input::U32(&ids))])
        .unwrap_err()
        .to_string();
    assert!(err.contains("id 64"), "{err}");
}

/// Every rank starts from its part of the unsharded model's initial weights: at tp = 2,
/// ep = 2, etp = 2 over dp = 2, each expert weight is its ep rank's experts cut to its
/// etp rank's width, each dense weight its tp rank's part, bit for bit.
#[test]
fn ranks_start_from_their_part_of_the_unsharded_weights() {
    let g = toy_moe(2);
    let full = weights(&Executor::new(&g, Cpu::new(), options()).unwrap());
    let layout = Layout { tp: 2, ep: 2, etp: 2, dp: 2, ..Layout::single(2, 4) };
    let mut experts = 0;
    for m in expert_mesh(2, 1, 2, 2, 2) {
        let s = shard(&g, &layout, m.coord).unwrap();
        let (etr, er, _) = expert_coord(m.coord, 2, 2, 2);
        let ex = Executor::for_rank(&s, Cpu::new(), options(), m.groups).unwrap();
        for t in s.graph.tensors.iter().filter(|t| t.kind.is_param()) {
            let fshape = &g.tensors[g.tensor_id(&t.name).unwrap()].shape;
            let mut want = full[&t.name].clone();
            let mut shape = fshape.clone();
            for axis in 0..shape.len() {
                let parts = (shape[axis] / t.shape[axis]) as usize;
                let r = match (is_expert(&t.name), axis) {
                    (true, 0) => er as usize,
                    (true, _) => etr as usize,
                    (false, _) => m.coord.tp as usize * parts / 2,
                };
                if parts > 1 {
                    want = slice(&want, &shape, axis, r, parts);
                    shape[axis] = t.shape[axis];
                }
            }
            experts += usize::from(is_expert(&t.name));
            let got = ex.weight(&t.name).unwrap();
            assert!(
                got.len() == want.len() && got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "rank {:?}: '{}' is not its part of the unsharded weight",
                m.coord,
                t.name
            );
        }
    }
    assert!(experts >= 8, "{experts} expert weights checked");
}

/// An ep group the experts do not split over (4 experts, 3 ranks: the rank graph of ep = 2
/// run on a group of three) is refused by name at the dispatch, on every rank, before any
/// row moves: with one expert per rank (4 / 3) the exchange would send expert 3's rows
/// nowhere. (`Executor::for_rank` refuses the group earlier, from the rank's splits.)
#[test]
fn experts_that_do_not_split_over_the_ep_ranks_are_refused_by_name() {
    let mut s = shard(&toy_moe(2), &ep_dp_layout(2, 2), runner_graph::shard::RankCoord::default()).unwrap();
    // The ep all-to-alls say the group's size (the executor checks it against the handle).
    for op in s.graph.ops.iter_mut().filter(|o| o.kind == OpKind::AllToAll) {
        op.attrs.insert("group-size".into(), runner_graph::Attr::Int(3));
    }
    let data = synthetic_inputs(&s.graph, 5);
    let hs: Vec<_> = runner_exec::collective::ThreadGroup::with_timeout(3, std::time::Duration::from_secs(5))
        .into_iter()
        .map(|h| {
            let (s, data) = (s.clone(), data.clone());
            std::thread::spawn(move || {
                let groups: Vec<(String, Box<dyn runner_exec::collective::Collective<Cpu>>)> = vec![("ep".into(), Box::new(h))];
                // Without the rank graph's splits (they name the ep group's size), as a
                // caller building from the graph alone.
                let mut ex = Executor::with_collectives(&s.graph, Cpu::new(), options(), groups).map_err(|e| format!("build: {e}"))?;
                ex.forward(&common::inputs(&data)).map(|_| ()).map_err(|e| e.to_string())
            })
        })
        .collect();
    for h in hs {
        let e = h.join().unwrap().unwrap_err();
        assert!(e.contains("4 experts do not split over the 3 ranks of group 'ep'"), "{e}");
    }
}

/// The executor's own refusal of an etp all-reduce under sequence parallelism (shard
/// gathers over etp instead, so no sharded graph has it): the etp = 2 rank graph
/// without sequence parallelism, with a tp reduce-scatter added (as sequence
/// parallelism places after a row-parallel linear), is refused as the executor is
/// built, naming sequence parallelism; the graph as shard emits it builds. Kills the
/// refusal not seeing the tp reduce-scatter.
#[test]
fn expert_tensor_parallelism_with_sequence_parallelism_is_refused_when_built() {
    let layout = Layout { tp: 2, etp: 2, ..Layout::single(2, 2) };
    let s = shard(&toy_moe(2), &layout, runner_graph::shard::RankCoord::default()).unwrap();
    let build = |g: &Graph| {
        let tp = runner_exec::collective::ThreadGroup::with_timeout(2, std::time::Duration::from_secs(5)).remove(0);
        let groups: Vec<(String, Box<dyn runner_exec::collective::Collective<Cpu>>)> = vec![("tp".into(), Box::new(tp))];
        Executor::with_collectives(g, Cpu::new(), options(), groups).err().map(|e| e.to_string())
    };
    assert_eq!(build(&s.graph), None);
    let mut sp = s.graph.clone();
    let mut op = sp.ops.iter().find(|o| o.kind == OpKind::AllReduce && o.text("group") == Some("tp")).unwrap().clone();
    let mut out = sp.tensors[op.outputs[0]].clone();
    out.name = format!("{}.rs_tp", out.name);
    out.shape[0] /= 2;
    sp.tensors.push(out);
    op.kind = OpKind::ReduceScatter;
    op.name = format!("{}.rs", op.name);
    op.outputs = vec![sp.tensors.len() - 1];
    sp.ops.push(op);
    let e = build(&sp).expect("refused");
    assert!(e.contains("sequence parallelism"), "{e}");
}
