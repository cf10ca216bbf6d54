//! The step's schedule rules (pipeline bubble and sends, data-parallel traffic, the
//! optimizer's time and state, memory per GPU) on a toy model whose every figure is
//! known by hand: N fully-connected layers of C x C between an embedding and an output
//! head, on a made-up GPU whose GEMMs run at exactly their peak and whose memory-bound
//! work takes no time, so a layer's forward is 2·T·C² FLOPs over the peak and its
//! backward twice that (the input and the weight gradient).

mod common;


use runner_graph::{DType, Graph, NamedOp, OpKind, Role, Tensor, TensorKind};
use runner_project::model::{GraphSource, Model};
use runner_project::precision::{Plan, Recipe};
use runner_project::profile::{GIB, GpuProfile, Profiles};
use runner_project::project::Projector;
use runner_project::step::{LayoutSpec, PipelineKind, Projection};

use common::layout;

/// Tokens per sequence, width, vocabulary.
const T: u64 = 1024;
const C: u64 = 512;
const V: u64 = 4096;
/// GEMM peak of the made-up GPU, FLOP/s; NVLink per GPU and the share NCCL reaches;
/// latency of one collective step.
const PEAK: f64 = 1e15;
const LINK: f64 = 100e9 * 0.5;
const ALPHA: f64 = 7e-6;

/// The toy graph with `n` layers (untied embedding and head).
fn graph(n: usize) -> impl FnMut(u32) -> Result<Graph, String> {
    graph_v(n, V)
}

/// The toy graph with `n` layers over a vocabulary of `v`.
fn graph_v(n: usize, v: u64) -> impl FnMut(u32) -> Result<Graph, String> {
    graph_with(n, v, false)
}

/// The toy graph with `n` layers over a vocabulary of `v`, the head reading the
/// embedding's table where `tied`.
fn graph_with(n: usize, v: u64, tied: bool) -> impl FnMut(u32) -> Result<Graph, String> {
    graph_frozen(n, v, tied, 0)
}

/// The toy graph whose first `frozen` layers' weights are frozen (a fine-tune's).
fn graph_frozen(n: usize, v: u64, tied: bool, frozen: usize) -> impl FnMut(u32) -> Result<Graph, String> {
    graph_of(n, v, tied, frozen, false, 1)
}

/// The toy graph in full: `n` layers of `fcs` C x C linears each, the first `frozen`
/// layers' weights frozen, the embedding's table too where `frozen_table`.
fn graph_of(n: usize, v: u64, tied: bool, frozen: usize, frozen_table: bool, fcs: usize) -> impl FnMut(u32) -> Result<Graph, String> {
    move |mb: u32| -> Result<Graph, String> {
        let b = u64::from(mb);
        let ten = |name: &str, s: Vec<u64>, d: DType, k: TensorKind| Tensor { name: name.into(), shape: s, dtype: d, kind: k };
        let op = |name: &str, k: OpKind, i: &[&str], o: &[&str], layer: i32, role: Role| NamedOp::of(name, k, i, o, &[], layer, role);
        let mut tensors = vec![
            ten("tokens", vec![b, T], DType::I32, TensorKind::Input),
            ten("targets", vec![b, T], DType::I32, TensorKind::Input),
            ten("table", vec![v, C], DType::BF16, if frozen_table { TensorKind::Frozen } else { TensorKind::Weight }),
            ten("x0", vec![b, T, C], DType::BF16, TensorKind::Activation),
            ten("logits", vec![b, T, v], DType::BF16, TensorKind::Activation),
            ten("loss", vec![], DType::F32, TensorKind::Activation),
        ];
        if !tied {
            tensors.push(ten("head", vec![v, C], DType::BF16, TensorKind::Weight));
        }
        let mut ops = vec![op("embed", OpKind::Embedding, &["tokens", "table"], &["x0"], -1, Role::VocabParallel)];
        for i in 0..n {
            let (x, y) = (format!("x{i}"), format!("x{}", i + 1));
            let kind = if i < frozen { TensorKind::Frozen } else { TensorKind::Weight };
            for j in 0..fcs {
                // The first linear keeps the toy's names; later ones read the one before.
                let w = if j == 0 { format!("w{i}") } else { format!("w{i}_{j}") };
                let input = if j == 0 { x.clone() } else { format!("x{i}_{j}") };
                let out = if j + 1 == fcs { y.clone() } else { format!("x{i}_{}", j + 1) };
                let name = if j == 0 { format!("layers.{i}.fc") } else { format!("layers.{i}.fc{j}") };
                tensors.push(ten(&w, vec![C, C], DType::BF16, kind));
                tensors.push(ten(&out, vec![b, T, C], DType::BF16, TensorKind::Activation));
                ops.push(op(&name, OpKind::Linear, &[&input, &w], &[&out], i as i32, Role::ColumnParallel));
            }
        }
        let last = format!("x{n}");
        let head = if tied { "table" } else { "head" };
        ops.push(op("head", OpKind::Linear, &[&last, head], &["logits"], -1, Role::VocabParallel));
        ops.push(op("loss", OpKind::CrossEntropy, &["logits", "targets"], &["loss"], -1, Role::VocabParallel));
        Graph::new(tensors, ops, "loss").map_err(|e| e.to_string())
    }
}

/// The made-up GPU: BF16 GEMMs at exactly 1 PFLOP/s, memory-bound work free (unless
/// `hbm_gbs` says otherwise), NVLink at 50 GB/s achieved with 7 µs per step, no
/// allocator slack, no straggler spread.
fn gpu(hbm_gbs: f64) -> GpuProfile {
    let mut gpu: GpuProfile = Profiles::builtin().get("h100").unwrap().clone();
    gpu.peak_tflops.bf16 = PEAK / 1e12;
    gpu.hbm_gbs = hbm_gbs;
    gpu.scale_up_gbs = 100.0;
    let e = &mut gpu.efficiency;
    e.gemm.bf16 = 1.0;
    e.gemm_half_gflop = 1e-12;
    e.memory = 1.0;
    e.scale_up = 0.5;
    e.scale_up_latency_us = ALPHA * 1e6;
    e.pp_overlap = 0.25;
    e.allocator_slack = 0.0;
    e.straggler = 0.0;
    gpu
}

fn toy(n: usize, hbm_gbs: f64) -> Projector<'static> {
    toy_on(n, gpu(hbm_gbs))
}

fn toy_on(n: usize, gpu: GpuProfile) -> Projector<'static> {
    toy_v(n, V, gpu)
}

fn toy_v(n: usize, v: u64, gpu: GpuProfile) -> Projector<'static> {
    projector(graph_v(n, v), gpu)
}

/// A projector of the model `source` builds, on `gpu`, under the built-in BF16 plan.
fn projector(source: impl GraphSource + 'static, gpu: GpuProfile) -> Projector<'static> {
    let mut source: Box<dyn GraphSource> = Box::new(source);
    let model = Model::new("toy", T as u32, source.as_mut()).unwrap();
    let plan = Plan::builtin(Recipe::Bf16, &model.graph);
    Projector::new(model, source, gpu, plan)
}

/// Seconds of one layer's forward and backward (3 x 2·T·C² FLOPs), and of the head's.
fn layer_s() -> f64 {
    3.0 * 2.0 * (T * C * C) as f64 / PEAK
}
fn head_s() -> f64 {
    3.0 * 2.0 * (T * C * V) as f64 / PEAK
}

fn close(got: f64, want: f64, what: &str) {
    assert!((got / want - 1.0).abs() < 1e-6, "{what}: {got} vs {want}");
}

fn plain(pp: u32, vp: u32, dp: u32, gbs: u32) -> LayoutSpec {
    let mut l = layout(1, pp, 1, vp, dp, 1, gbs);
    l.dp_overlap = false;
    l.distributed_optimizer = false;
    l
}

/// The 1F1B fill and drain (Narayanan et al. 2021, "Efficient Large-Scale Language Model
/// Training on GPU Clusters Using Megatron-LM", §2.2): (p − 1) stage times, divided by v
/// with an interleaved schedule; with stages of unequal time the model takes their mean
/// (step.rs's schedule model). Four layers over two stages: stage 0 runs layers 0-1,
/// stage 1 layers 2-3 and the head, so the mean stage is (4L + H)/2 and the step's
/// compute is m times the slower stage, 2L + H. With vp = 2 the chunks alternate (layers
/// 0, 2 on stage 0; 1, 3 on stage 1): the same stages, half the bubble.
#[test]
fn the_bubble_is_the_mean_stage_over_the_virtual_chunks() {
    let mut pr = toy(4, 1e12);
    let (l, h, m) = (layer_s(), head_s(), 4.0);
    for vp in [1u32, 2] {
        let p = pr.project(&plain(2, vp, 1, 4)).unwrap();
        assert_eq!(p.micro_batches, 4);
        close(p.breakdown.compute, m * (2.0 * l + h), "compute: m x the slower stage");
        close(p.breakdown.bubble, (2.0 - 1.0) / f64::from(vp) * (4.0 * l + h) / 2.0, &format!("bubble at vp {vp}"));
    }
    // Four stages of one layer each (the head on the last): (p − 1) = 3 mean stages.
    let p = pr.project(&plain(4, 1, 1, 4)).unwrap();
    close(p.breakdown.bubble, 3.0 * (4.0 * l + h) / 4.0, "bubble at pp 4");
    close(p.breakdown.compute, m * (l + h), "compute at pp 4");
}

/// DualPipe (DeepSeek-V3 Technical Report, arXiv:2412.19437, §3.2.1, Table 2; the table
/// of github:deepseek-ai/DualPipe's README): pipeline rank r runs stage r for half the
/// micro-batches and stage p − 1 − r for the other half, so with one layer a stage and
/// the head on the last, ranks 0 and 3 take (L + (L + H))/2 per micro-batch and the step's
/// compute is m(L + H/2) where 1F1B's is m(L + H). The bubble is (p/2 − 1)(F&B + B − 3W):
/// F&B a rank's micro-batch time (its mean over the ranks is 1F1B's mean stage, S =
/// (4L + H)/4), B the backward, two thirds of it, W the weight-gradient GEMMs, a third of
/// the GEMMs (here all of it): (2 − 1)(S + 2S/3 − 3·S/3).
/// Only the fill's and the drain's sends wait. Ranks 0 and 3 hold two layers, the
/// embedding and the head: weights and gradients of both stages, and, without the
/// distributed optimizer, the state of both; with it, each stage's state is spread over
/// the 2·dp ranks that hold the stage.
#[test]
fn dualpipe_pairs_mirrored_stages_and_shrinks_the_bubble() {
    let mut pr = toy(4, 1e12);
    let (l, h, m) = (layer_s(), head_s(), 8.0);
    let dual = |mut x: LayoutSpec| {
        x.pipeline = PipelineKind::DualPipe;
        x
    };
    let one = pr.project(&plain(4, 1, 1, 8)).unwrap();
    close(one.breakdown.compute, m * (l + h), "1F1B compute");
    let p = pr.project(&dual(plain(4, 1, 1, 8))).unwrap();
    assert!(p.layout.short().contains(" DualPipe"), "{}", p.layout.short());
    close(p.breakdown.compute, m * (l + h / 2.0), "DualPipe compute: the mirrored stages' mean");
    let s = (4.0 * l + h) / 4.0;
    close(p.breakdown.bubble, (4.0 / 2.0 - 1.0) * (s - s / 3.0), "DualPipe bubble");
    let msg = ALPHA + (2 * T * C) as f64 / LINK;
    close(p.comm.pp, m * 2.0 * msg, "DualPipe: all sends");
    close(p.breakdown.pp, 2.0 * 3.0 * msg, "DualPipe: the fill's and the drain's sends");
    let n = params(2);
    close(p.memory.weights * GIB, 2.0 * n, "weights of both stages");
    close(p.memory.gradients * GIB, 2.0 * n, "gradients of both stages");
    close(p.memory.optimizer * GIB, 12.0 * n, "optimizer state of both stages");
    let mut l2 = dual(plain(4, 1, 2, 16));
    l2.distributed_optimizer = true;
    let p = pr.project(&l2).unwrap();
    close(p.memory.optimizer * GIB, 12.0 * n / 2.0 / 2.0, "distributed optimizer: over dp 2 and the two holders");
    // Two stages: pp/2 − 1 = 0, no bubble at all.
    let p = pr.project(&dual(plain(2, 1, 1, 4))).unwrap();
    assert_eq!(p.breakdown.bubble, 0.0);
    // What the reference implementation asserts, and no FSDP.
    let mut refused = |x: LayoutSpec| pr.project(&x).unwrap_err();
    assert!(refused(dual(plain(4, 1, 1, 6))).contains("at least 2·pp = 8: GBS/(MBS·DP) = 6"));
    assert!(refused(dual(plain(2, 1, 1, 5))).contains("an even number of micro-batches"));
    assert!(refused(dual(plain(1, 1, 1, 4))).contains("DualPipe needs an even pp"));
    assert!(refused(dual(plain(2, 2, 1, 8))).contains("no virtual pipeline: pp = 2, vp = 2"));
    let mut f = dual(plain(2, 1, 2, 8));
    f.fsdp = true;
    assert!(refused(f).contains("leave out --fsdp"));
    assert_eq!(PipelineKind::parse("DualPipe"), Ok(PipelineKind::DualPipe));
    assert!(PipelineKind::parse("gpipe").unwrap_err().contains("use 1f1b"));
}

/// DualPipeV (github:deepseek-ai/DualPipe README, "DualPipeV": DualPipe cut in half):
/// the layers split over PP = 2·pp stages and rank r runs stage r and stage 2·pp − 1 − r
/// for every micro-batch. Eight layers at pp = 2: four stages of two layers, rank 0 the
/// first and the last (the embedding, free here, and the head), rank 1 the middle two;
/// rank 0 takes 4L + H a micro-batch, both its stages' time, where DualPipe's rank 0
/// takes the mean of its two stages. The bubble is the README's (PP/2 − 1)(F&B + B − 3W)
/// with a chunk's (one stage's) figures, the mean stage S = (8L + H)/4: (4/2 − 1)(S +
/// 2S/3 − S). Weights, gradients and optimizer state are rank 0's two stages, each held
/// once (the distributed optimizer shards them over dp alone, not over DualPipe's two
/// holders). Activations: stage s keeps 2·pp − s micro-batches (1F1B's count over the
/// four stages), so rank 0 holds 4 of stage 0's two layer inputs and 1 of stage 3's, and
/// the head's input and logits once. A micro-batch crosses two links (the V turns on
/// rank 1, stage 1 to stage 2, without a send), each end rank sending 2 a micro-batch,
/// all hidden but the fill's and the drain's.
#[test]
fn dualpipev_runs_both_stages_of_the_v_on_each_rank() {
    let mut pr = toy(8, 1e12);
    let (l, h, m) = (layer_s(), head_s(), 8.0);
    let v = |mut x: LayoutSpec| {
        x.pipeline = PipelineKind::DualPipeV;
        x
    };
    let p = pr.project(&v(plain(2, 1, 1, 8))).unwrap();
    assert!(p.layout.short().ends_with(" DualPipeV"), "{}", p.layout.short());
    assert_eq!(serde_json::to_value(p.layout).unwrap()["pipeline"], "dualpipev");
    close(p.breakdown.compute, m * (4.0 * l + h), "DualPipeV compute: both stages of rank 0");
    let s = (8.0 * l + h) / 4.0;
    close(p.breakdown.bubble, (4.0 / 2.0 - 1.0) * (s + 2.0 * s / 3.0 - 3.0 * s / 3.0), "DualPipeV bubble");
    let msg = ALPHA + (2 * T * C) as f64 / LINK;
    close(p.comm.pp, m * 2.0 * msg, "DualPipeV at pp 2: two sends a micro-batch");
    close(p.breakdown.pp, 2.0 * 2.0 * msg, "DualPipeV: the fill's and the drain's two links");
    assert_eq!(p.memory.stage, 0);
    let n = params(4);
    close(p.memory.weights * GIB, 2.0 * n, "rank 0's weights: four layers, the embedding and the head");
    close(p.memory.gradients * GIB, 2.0 * n, "rank 0's gradients");
    close(p.memory.optimizer * GIB, 12.0 * n, "rank 0's optimizer state");
    let input = (2 * T * C) as f64;
    close(p.memory.activations * GIB, (4.0 * 2.0 + 1.0 * 2.0 + 1.0) * input + (2 * T * V) as f64, "rank 0's activations");
    // Data parallelism over rank 0's weights, as under 1F1B.
    let p2 = pr.project(&v(plain(2, 1, 2, 16))).unwrap();
    close(p2.comm.dp, ring(true, 2, 2.0 * n, LINK), "the gradients' all-reduce over dp 2");
    let mut l2 = v(plain(2, 1, 2, 16));
    l2.distributed_optimizer = true;
    close(pr.project(&l2).unwrap().memory.optimizer * GIB, 12.0 * n / 2.0, "distributed optimizer: over dp 2 alone");
    // An odd pp: 12 layers over 6 stages on 3 ranks, 5 micro-batches (2·pp − 1; DualPipe
    // takes neither). Rank 1, in the middle, sends 4 a micro-batch; a micro-batch
    // crosses 4 links; PP/2 − 1 = 2; rank 0 keeps 5 (not 6) of stage 0's.
    let mut pr = toy(12, 1e12);
    let p = pr.project(&v(plain(3, 1, 1, 5))).unwrap();
    let m = 5.0;
    close(p.breakdown.compute, m * (4.0 * l + h), "pp 3 compute");
    let s = (12.0 * l + h) / 6.0;
    close(p.breakdown.bubble, (6.0 / 2.0 - 1.0) * (s + 2.0 * s / 3.0 - 3.0 * s / 3.0), "pp 3 bubble");
    close(p.comm.pp, m * 4.0 * msg, "pp 3: four sends a micro-batch on the middle rank");
    close(p.breakdown.pp, 2.0 * 4.0 * msg, "pp 3: the fill's and the drain's four links");
    assert_eq!(p.memory.stage, 0);
    close(p.memory.activations * GIB, (5.0 * 2.0 + 1.0 * 2.0 + 1.0) * input + (2 * T * V) as f64, "pp 3, m 5: rank 0's activations");
    // A tied table is one weight on rank 0, which holds both ends: no copy, no sync.
    let mut pr = projector(graph_with(8, V, true), gpu(1e12));
    let p = pr.project(&v(plain(2, 1, 1, 8))).unwrap();
    close(p.memory.weights * GIB, 2.0 * ((V * C) as f64 + 4.0 * (C * C) as f64), "tied: one table on rank 0");
    close(p.breakdown.pp, 2.0 * 2.0 * msg, "tied: the exposed sends only");
    // MindSpeed's checks, and no FSDP.
    let mut pr = toy(8, 1e12);
    let mut refused = |x: LayoutSpec| pr.project(&x).unwrap_err();
    assert!(refused(v(plain(3, 1, 1, 4))).contains("at least 2·pp - 1 = 5 micro-batches: GBS/(MBS·DP) = 4"));
    assert!(refused(v(plain(1, 1, 1, 4))).contains("DualPipeV needs pp ≥ 2"));
    assert!(refused(v(plain(2, 2, 1, 8))).contains("no virtual pipeline (its two stages a rank are the V's): pp = 2, vp = 2"));
    assert!(refused(v(plain(8, 1, 1, 16))).contains("the 8 transformer layers over 2·pp = 16 stages and needs one a stage at least: use pp ≤ 4"));
    let mut f = v(plain(2, 1, 2, 8));
    f.fsdp = true;
    assert!(refused(f).contains("DualPipeV under FSDP"));
    assert_eq!(PipelineKind::parse("DualPipeV"), Ok(PipelineKind::DualPipeV));
    assert!(PipelineKind::parse("gpipe").unwrap_err().contains("or dualpipev"));
}

/// DualPipeV against DualPipe on the same pp ranks of the same model (16 layers, pp 4, a
/// small vocabulary so the layers dominate): each rank holds about half DualPipe's
/// weights (DualPipe puts two stages of pp on a rank, DualPipeV two of 2·pp), and the
/// bubble, (PP/2 − 1) chunks over PP stages, is (pp − 1) chunks of half DualPipe's
/// against its pp/2 − 1 = 1: (pp − 1)/2 / (pp/2 − 1) = 1.5 times DualPipe's, both
/// taken over the mean stage, however the head weighs on the last one.
#[test]
fn dualpipev_holds_half_of_dualpipes_weights_on_the_same_ranks() {
    let mut pr = toy_v(16, 256, gpu(1e12));
    let with = |k: PipelineKind| LayoutSpec { pipeline: k, ..plain(4, 1, 1, 8) };
    let (d, v) = (pr.project(&with(PipelineKind::DualPipe)).unwrap(), pr.project(&with(PipelineKind::DualPipeV)).unwrap());
    let ratio = v.memory.weights / d.memory.weights;
    assert!((0.5..0.6).contains(&ratio), "DualPipeV weights / DualPipe's: {ratio}");
    assert!(v.memory.total < d.memory.total, "DualPipeV {} GiB, DualPipe {} GiB", v.memory.total, d.memory.total);
    let (l, h) = (layer_s(), 3.0 * 2.0 * (T * C * 256) as f64 / PEAK);
    // The mean stage of each: DualPipe's 4 stages, DualPipeV's 8; the bubble's factor
    // (F&B + B − 3W) is 2/3 of a stage here.
    let (sd, sv) = ((16.0 * l + h) / 4.0, (16.0 * l + h) / 8.0);
    close(d.breakdown.bubble, 1.0 * 2.0 * sd / 3.0, "DualPipe bubble");
    close(v.breakdown.bubble, 3.0 * 2.0 * sv / 3.0, "DualPipeV bubble");
    close(v.breakdown.bubble / d.breakdown.bubble, 1.5, "(pp − 1)/2 over pp/2 − 1");
}

/// Under DualPipe a split and its mirror (E1L0 and E0L1) project alike, and the search
/// prices one; under DualPipeV rank 0 also holds both ends, but its first stage keeps
/// 2·pp micro-batches' activations and its last one, so the mirror differs: seven
/// layers at pp 2 over four stages of two units, E1L0 gives stage 0 one layer and stage
/// 3 two, E0L1 the reverse; the same time, (4·1 + 2) or (4·2 + 1) layer inputs held.
#[test]
fn dualpipev_mirrored_splits_differ_in_rank_0s_activations() {
    use runner_graph::pipeline::PipelineSplit;
    let mut pr = toy(7, 1e12);
    let at = |pr: &mut Projector, k: PipelineKind, e: bool| {
        pr.project(&LayoutSpec { pipeline: k, split: PipelineSplit::megatron(e, !e), ..plain(2, 1, 1, 8) }).unwrap()
    };
    let (a, b) = (at(&mut pr, PipelineKind::DualPipe, true), at(&mut pr, PipelineKind::DualPipe, false));
    close(a.step_time_s, b.step_time_s, "DualPipe: mirrors alike in time");
    close(a.memory.total, b.memory.total, "DualPipe: mirrors alike in memory");
    let (a, b) = (at(&mut pr, PipelineKind::DualPipeV, true), at(&mut pr, PipelineKind::DualPipeV, false));
    close(a.step_time_s, b.step_time_s, "DualPipeV: the same time");
    assert_eq!((a.memory.stage, b.memory.stage), (0, 0));
    let (input, logits) = ((2 * T * C) as f64, (2 * T * V) as f64);
    close(a.memory.activations * GIB, (4.0 * 1.0 + 2.0 + 1.0) * input + logits, "E1L0");
    close(b.memory.activations * GIB, (4.0 * 2.0 + 1.0 + 1.0) * input + logits, "E0L1");
}

/// Pipeline sends: the residual stream of one micro-batch (T x C BF16) goes forward and
/// its gradient back once per chunk per micro-batch; `pp_overlap` of them hide, but the
/// fill's and the drain's 2(p − 1) are on the critical path. Each is one send between two
/// GPUs of a domain: one latency step plus the message over the link (bus factor 1).
#[test]
fn pipeline_sends_are_two_per_chunk_and_micro_batch() {
    let mut pr = toy(4, 1e12);
    let msg = ALPHA + (2 * T * C) as f64 / LINK;
    for (pp, vp, gbs) in [(2u32, 1u32, 4u32), (2, 2, 4), (4, 1, 8)] {
        let p = pr.project(&plain(pp, vp, 1, gbs)).unwrap();
        let m = f64::from(gbs);
        let sends = m * 2.0 * f64::from(vp) * msg;
        close(p.comm.pp, sends, &format!("pp {pp} vp {vp}: all sends"));
        close(p.breakdown.pp, sends * (1.0 - 0.25) + 2.0 * f64::from(pp - 1) * msg, &format!("pp {pp} vp {vp}: exposed sends"));
    }
}

/// Parameters of the toy, and of one stage of it.
fn params(n: u64) -> f64 {
    (2 * V * C + n * C * C) as f64
}

/// Memory per GPU without sharding (one stage): BF16 weights (2 B), BF16 gradients (2 B,
/// 4 with grad_fp32) and AdamW's fp32 master weights and two moments (12 B) per
/// parameter, the 16 B of mixed-precision Adam in Rajbhandari et al. 2020 (ZeRO, §3.1:
/// 2Ψ + 2Ψ + 12Ψ). The distributed optimizer (ZeRO-1) divides the 12 B by dp; FSDP
/// (ZeRO-3) divides all of them, but keeps two gathered layers whole (the one in use and
/// the one prefetched) with their gradients.
#[test]
fn memory_per_parameter_follows_mixed_precision_adam() {
    let mut pr = toy(4, 1e12);
    let n = params(4);
    let p = pr.project(&plain(1, 1, 2, 8)).unwrap();
    close(p.memory.weights * GIB, 2.0 * n, "weights");
    close(p.memory.gradients * GIB, 2.0 * n, "gradients");
    close(p.memory.optimizer * GIB, 12.0 * n, "optimizer state");
    // The total adds the activations and what the profile reserves (context, NCCL,
    // workspaces) to the model state.
    let reserved = gpu(1e12).efficiency.reserved_gib;
    assert!(reserved > 0.0);
    let m = &p.memory;
    close(m.total, m.weights + m.gradients + m.optimizer + m.activations + reserved, "total");
    let mut l = plain(1, 1, 2, 8);
    l.grad_fp32 = true;
    let p = pr.project(&l).unwrap();
    close(p.memory.gradients * GIB, 4.0 * n, "fp32 gradients");
    l.grad_fp32 = false;
    l.distributed_optimizer = true;
    let p = pr.project(&l).unwrap();
    close(p.memory.weights * GIB, 2.0 * n, "weights with the distributed optimizer");
    close(p.memory.gradients * GIB, 2.0 * n, "gradients with the distributed optimizer");
    close(p.memory.optimizer * GIB, 12.0 * n / 2.0, "optimizer state over dp 2");
    l.fsdp = true;
    l.distributed_optimizer = false;
    let p = pr.project(&l).unwrap();
    // The largest transformer layer: one C x C weight.
    let big = (C * C) as f64;
    close(p.memory.weights * GIB, 2.0 * n / 2.0 + 2.0 * 2.0 * big, "FSDP weights: a shard and two whole units");
    close(p.memory.gradients * GIB, 2.0 * n / 2.0 + 2.0 * big, "FSDP gradients: a shard and one whole unit");
    close(p.memory.optimizer * GIB, 12.0 * n / 2.0, "FSDP optimizer state");
}

/// One collective over `n` GPUs of a domain (nccl-tests' conventions, as in NVIDIA's
/// nccl-tests doc/PERFORMANCE.md): ⌈log2 n⌉ latency steps plus the bus bytes, S x
/// 2(n − 1)/n for an all-reduce and S x (n − 1)/n for an all-gather or a reduce-scatter,
/// over the link.
fn ring(all_reduce: bool, n: u32, bytes: f64, link: f64) -> f64 {
    let nf = f64::from(n);
    let factor = if all_reduce { 2.0 * (nf - 1.0) / nf } else { (nf - 1.0) / nf };
    nf.log2().ceil() * ALPHA + factor * bytes / link
}

/// Data-parallel gradients, not overlapped: an all-reduce of the BF16 gradients over the
/// dp·cp ranks that hold the same weights (context parallelism splits the sequence, not
/// the weights, so its ranks reduce together: Megatron's data-parallel-with-cp group);
/// with the distributed optimizer (ZeRO-1) a reduce-scatter of them and an all-gather of
/// the BF16 parameters instead, the same bytes over the same ring in two halves.
#[test]
fn data_parallel_traffic_runs_over_the_dp_and_cp_ranks() {
    let mut pr = toy(4, 1e12);
    let grads = 2.0 * params(4);
    for (dp, cp) in [(2u32, 1u32), (4, 1), (2, 2)] {
        let mut l = plain(1, 1, dp, 4 * dp);
        l.cp = cp;
        let p = pr.project(&l).unwrap();
        let n = dp * cp;
        close(p.breakdown.dp, ring(true, n, grads, LINK), &format!("all-reduce over dp {dp} cp {cp}"));
        l.distributed_optimizer = true;
        let p = pr.project(&l).unwrap();
        let want = ring(false, n, grads, LINK) + ring(false, n, grads, LINK);
        close(p.breakdown.dp, want, &format!("reduce-scatter + all-gather over dp {dp} cp {cp}"));
        close(p.comm.dp, want, &format!("dp traffic over dp {dp} cp {cp}"));
    }
}

/// Megatron reduces gradients in buckets of max(40M, 1M·dp) elements
/// (megatron/core/distributed/distributed_data_parallel_config.py, bucket_size) and the
/// last bucket's reduction has no backward left to hide behind; the toy's 5.2M
/// parameters are one bucket, so overlapping the reduction (and the distributed
/// optimizer's parameter gather, whose first bucket the first forward waits for) hides
/// none of it.
#[test]
fn a_model_of_one_bucket_hides_none_of_its_reduction() {
    let mut pr = toy(4, 1e12);
    assert!(params(4) < 40e6);
    for distributed in [false, true] {
        let mut l = plain(1, 1, 2, 8);
        l.distributed_optimizer = distributed;
        let exposed = pr.project(&l).unwrap().breakdown.dp;
        l.dp_overlap = true;
        let p = pr.project(&l).unwrap();
        close(p.breakdown.dp, exposed, &format!("overlapped, distributed optimizer {distributed}"));
        assert!(p.breakdown.dp > 0.0);
    }
}

/// FSDP (ZeRO-3) gathers each micro-batch's parameters twice (forward and backward) and
/// reduce-scatters its gradients (Rajbhandari et al. 2020, §5.3: 3Ψ per step against
/// data parallelism's 2Ψ, here per micro-batch): m(2·AG + RS) in all. A micro-batch's
/// compute hides its traffic but what exceeds it, and the first layer's gather waits
/// (one layer's share of a micro-batch's traffic); never more than the whole.
/// FSDP over dp = 2, `pp` stages, 8 sequences.
fn fsdp_dp2(pp: u32) -> LayoutSpec {
    let mut l = plain(pp, 1, 2, 8);
    l.fsdp = true;
    l
}

/// The 4-layer toy under [`fsdp_dp2`] on a fast link, so that the traffic exceeds the
/// compute by less than the whole; and the link's bytes per second the ring moves at.
fn fsdp_on_a_fast_link(pp: u32) -> (Projection, f64) {
    let mut fast = gpu(1e12);
    fast.scale_up_gbs = 1000.0;
    (toy_on(4, fast).project(&fsdp_dp2(pp)).unwrap(), 1000e9 * 0.5)
}

#[test]
fn fsdp_moves_three_parameter_volumes_per_micro_batch() {
    let (m, layers) = (4.0, 4.0);
    let bytes = 2.0 * params(4);
    let (p, link) = fsdp_on_a_fast_link(1);
    let per_mb = 2.0 * ring(false, 2, bytes, link) + ring(false, 2, bytes, link);
    let t_mb = 4.0 * layer_s() + head_s();
    assert!(per_mb > t_mb && per_mb / layers < m * t_mb, "the case the test means: {per_mb} vs {t_mb}");
    close(p.comm.dp, m * per_mb, "FSDP traffic");
    close(p.breakdown.dp, m * (per_mb - t_mb) + per_mb / layers, "FSDP exposed");
    // The slow link: what the compute cannot hide plus the first wait would exceed the
    // traffic itself; the whole of it is exposed.
    let p = toy(4, 1e12).project(&fsdp_dp2(1)).unwrap();
    let per_mb = 3.0 * ring(false, 2, bytes, LINK);
    assert!(per_mb / layers > m * t_mb);
    close(p.breakdown.dp, m * per_mb, "FSDP exposed, capped at its traffic");
}

/// The optimizer is memory-bound over the rank's shard: AdamW reads and writes the fp32
/// master weight and both moments and reads and writes the gradient (28 B per element of
/// the shard), and the whole gradient buffer is zeroed and its norm taken (8 B per
/// parameter): step.rs's model. Sharded over dp by the distributed optimizer, not without.
#[test]
fn the_optimizer_streams_its_shard_at_the_hbm_rate() {
    let hbm = 1000e9;
    let mut pr = toy(4, hbm / 1e9);
    let n = params(4);
    let mut l = plain(1, 1, 2, 8);
    close(pr.project(&l).unwrap().breakdown.optimizer, (28.0 * n + 8.0 * n) / hbm, "AdamW, unsharded");
    l.distributed_optimizer = true;
    close(pr.project(&l).unwrap().breakdown.optimizer, (28.0 * n / 2.0 + 8.0 * n) / hbm, "AdamW over dp 2");
}

/// Activations held at the 1F1B peak (Narayanan et al. 2021, §2.2: stage s keeps
/// p − s micro-batches in flight; never more than the step has; Korthikanti et al. 2022
/// §4.2.3 size the first stage's memory so): on the first of four stages, 2, 4 and still
/// 4 micro-batches' activations of its layers at m = 2, 4, 8 (at m = 1 the last stage,
/// with the logits, needs more). With an
/// interleaved schedule, Megatron's warm-up (forward_backward_pipelining_with_interleaving
/// in megatron/core/pipeline_parallel/schedules.py: (p − s − 1)·2 + (v − 1)·p chunk
/// forwards) plus the one in progress: at p = 2, v = 2 on stage 0, 2 + 2 + 1 = 5 chunks,
/// 2.5 micro-batches of the stage, against 2 without interleaving. Sixteen layers and
/// a vocabulary of 256, so that the last stage's logits do not outweigh the first
/// stage's micro-batches in flight.
#[test]
fn the_first_stage_holds_the_micro_batches_in_flight() {
    let mut pr = toy_v(16, 256, gpu(1e12));
    let acts = |pr: &mut Projector, pp: u32, vp: u32, m: u32| {
        let p = pr.project(&plain(pp, vp, 1, m)).unwrap();
        assert_eq!(p.memory.stage, 0, "pp {pp} vp {vp} m {m}: the first stage needs most");
        p.memory.activations
    };
    // A micro-batch's activations of the first stage's four layers: each keeps its
    // T x C BF16 input (activations_are_the_tensors_the_backward_reads).
    let one = (4 * 2 * T * C) as f64 / GIB;
    close(acts(&mut pr, 4, 1, 2), 2.0 * one, "pp 4, m 2");
    for (m, held) in [(4u32, 4.0), (8, 4.0)] {
        close(acts(&mut pr, 4, 1, m), held * one, &format!("pp 4, m {m}"));
    }
    // Two stages of four layers, with and without two chunks per stage.
    let plain_1f1b = acts(&mut pr, 2, 1, 4);
    close(acts(&mut pr, 2, 2, 4), 2.5 / 2.0 * plain_1f1b, "interleaved: 5 chunks of 2 per stage against 2 micro-batches");
    // The allocator's slack scales the activations and nothing else.
    let mut g = gpu(1e12);
    g.efficiency.allocator_slack = 0.1;
    let mut slack = toy_v(16, 256, g);
    let p = slack.project(&plain(4, 1, 1, 4)).unwrap();
    close(p.memory.activations, 1.1 * 4.0 * one, "activations with 10 % slack");
}

/// Low-precision GEMM weights keep their row-wise and transposed casts resident
/// (Transformer Engine caches the FP8 weight and its transpose across micro-batches on
/// Hopper): 2 x 1 B per weight element of the FP8 layers (the head, vocabulary-parallel,
/// stays BF16) beside the BF16 weight; with the distributed optimizer and FP8 parameters
/// (Megatron's fp8_param_gather) the two FP8 copies replace the BF16 one; under FSDP only
/// the two gathered layers' casts exist.
#[test]
fn fp8_weights_keep_their_two_casts_resident() {
    let mut source: Box<dyn GraphSource> = Box::new(graph(4));
    let model = Model::new("toy", T as u32, source.as_mut()).unwrap();
    let plan = Plan::builtin(Recipe::Fp8, &model.graph);
    let mut pr = Projector::new(model, source, gpu(1e12), plan);
    let (n, low) = (params(4), (4 * C * C) as f64);
    let mut l = plain(1, 1, 2, 8);
    close(pr.project(&l).unwrap().memory.weights * GIB, 2.0 * n + 2.0 * low, "BF16 weights and two FP8 casts");
    l.distributed_optimizer = true;
    close(pr.project(&l).unwrap().memory.weights * GIB, 2.0 * n - 2.0 * low + 2.0 * low, "FP8 parameters replace the BF16 copy");
    l.distributed_optimizer = false;
    l.fsdp = true;
    let big = (C * C) as f64;
    close(pr.project(&l).unwrap().memory.weights * GIB, 2.0 * n / 2.0 + 2.0 * 2.0 * big + 2.0 * 2.0 * big, "FSDP: casts of two units");
}

/// The weights' casts happen once per step, not per micro-batch (Transformer Engine
/// caches the FP8 weight and its transpose from the first micro-batch on): the step's
/// compute is m x a micro-batch's plus the casts, so 2·compute(m = 4) − compute(m = 8) is
/// the casts alone. Per weight element (precision.rs's `cast_bytes_per_element`):
/// delayed scaling reads the BF16 weight and writes the FP8 copy and its transpose, 4 B;
/// current scaling reads it once more for its amax, 6 B; at the HBM rate.
#[test]
fn fp8_weight_casts_are_paid_once_per_step() {
    let hbm = 1000e9;
    for (recipe, bytes) in [(Recipe::Fp8, 2.0 + 1.0 + 1.0), (Recipe::Fp8Cs, 2.0 + 2.0 + 1.0 + 1.0)] {
        let mut source: Box<dyn GraphSource> = Box::new(graph(4));
        let model = Model::new("toy", T as u32, source.as_mut()).unwrap();
        let plan = Plan::builtin(recipe, &model.graph);
        let mut pr = Projector::new(model, source, gpu(hbm / 1e9), plan);
        let compute = |pr: &mut Projector, m: u32| pr.project(&plain(1, 1, 1, m)).unwrap().breakdown.compute;
        let casts = 2.0 * compute(&mut pr, 4) - compute(&mut pr, 8);
        close(casts, bytes * (4 * C * C) as f64 / hbm, &format!("{recipe}: the casts of the four FP8 layers' weights"));
    }
}

/// Stored activations are the tensors the backward reads: each linear layer keeps its
/// BF16 input (T x C, 2 B) for its weight gradient (dW = dYᵀX), the head keeps its input
/// too, and the loss keeps the BF16 logits (T x V); the embedding keeps no
/// floating-point tensor. Without a pipeline one micro-batch is in flight whatever m is,
/// so N layers hold (N + 1)·2TC + 2TV bytes.
#[test]
fn activations_are_the_tensors_the_backward_reads() {
    for (n, v) in [(4usize, 256u64), (8, 256), (4, 4096)] {
        let mut pr = toy_v(n, v, gpu(1e12));
        let want = ((n as u64 + 1) * 2 * T * C + 2 * T * v) as f64;
        for m in [1u32, 4] {
            close(pr.project(&plain(1, 1, 1, m)).unwrap().memory.activations * GIB, want, &format!("{n} layers, vocabulary {v}, m {m}"));
        }
    }
}

/// A tied embedding (the head reads the embedding's table) is one set of parameters
/// without a pipeline; with one, the last stage holds a copy of the table beside the
/// first stage's (Megatron's shared embedding, whose gradients the two stages
/// all-reduce), with its gradient and optimizer state. At m = 1 the last stage, with the
/// logits, needs most.
#[test]
fn a_tied_embedding_is_held_at_both_ends_of_the_pipeline() {
    let mut pr = projector(graph_with(4, V, true), gpu(1e12));
    let table = (V * C) as f64;
    let p = pr.project(&plain(1, 1, 1, 1)).unwrap();
    close(p.memory.weights * GIB, 2.0 * (table + 4.0 * (C * C) as f64), "one table without a pipeline");
    let p = pr.project(&plain(2, 1, 1, 1)).unwrap();
    assert_eq!(p.memory.stage, 1);
    let last = table + 2.0 * (C * C) as f64;
    close(p.memory.weights * GIB, 2.0 * last, "the last stage's weights");
    close(p.memory.gradients * GIB, 2.0 * last, "the last stage's gradients");
    close(p.memory.optimizer * GIB, 12.0 * last, "the last stage's optimizer state");
    // The two copies' gradients are all-reduced between the first and the last stage
    // after the backward, nothing left to hide it (Megatron's finalize_model_grads): one
    // ring step over the table's BF16 gradient, on top of the exposed sends (m = 1: the
    // one forward and one backward send, neither hidden by another micro-batch).
    let msg = ALPHA + (2 * T * C) as f64 / LINK;
    let sends = 2.0 * msg * (1.0 - 0.25) + 2.0 * msg;
    close(p.breakdown.pp, sends + ring(true, 2, 2.0 * table, LINK), "exposed sends and the tied gradient's all-reduce");
    close(p.comm.pp, 2.0 * msg + ring(true, 2, 2.0 * table, LINK), "all sends and the tied gradient's all-reduce");
    // Untied, the same layout has the sends only.
    let p = toy(4, 1e12).project(&plain(2, 1, 1, 1)).unwrap();
    close(p.breakdown.pp, sends, "untied: the exposed sends only");
}

/// The offload tests' GPU: a 64 GB/s host link and room on the host for whatever is
/// offloaded.
fn offload_gpu() -> GpuProfile {
    let mut g = gpu(1e12);
    g.host_link_gbs = Some(64.0);
    g.host_memory_gib = Some(1000.0);
    g
}

/// One layer's stored input (T x C in BF16) over that link at 80 % of its rate (step.rs's
/// HOST_LINK_EFFICIENCY), in seconds.
fn offload_copy_s() -> f64 {
    (2 * T * C) as f64 / (64e9 * 0.8)
}

/// Seconds of one layer's backward: the input and the weight gradient, 2 x 2·T·C² FLOPs.
fn layer_bwd_s() -> f64 {
    2.0 * 2.0 * (T * C * C) as f64 / PEAK
}

/// Overlapped gradient reduction without a virtual pipeline (Megatron's schedules.py,
/// as step.rs describes it): a stage after the first launches its whole reduction after
/// its last backward, in the drain, which the backwards of the stages before it take.
/// Three layers with the embedding counted as a layer in the split (Megatron's
/// account_for_embedding_in_pipeline_split): stage 0 holds the table and layer 0, stage 1
/// layers 1-2 and the head, C² more parameters. The toy is one 40M-element bucket, so the
/// first stage hides nothing; the second hides one layer's backward (the first stage's
/// drain), and being larger it is the one the step waits for.
#[test]
fn a_later_stage_hides_its_reduction_in_the_drain() {
    let mut pr = toy(3, 1e12);
    let mut l = plain(2, 1, 2, 8);
    l.dp_overlap = true;
    l.split = runner_graph::pipeline::PipelineSplit { embedding: 1, loss: 0 };
    let p = pr.project(&l).unwrap();
    let last = 2.0 * (V * C + 2 * C * C) as f64;
    let want = ring(true, 2, last, LINK) - layer_bwd_s();
    assert!(want > ring(true, 2, 2.0 * (V * C + C * C) as f64, LINK), "the case the test means");
    close(p.breakdown.dp, want, "the last stage's reduction less the drain");
    close(p.comm.dp, ring(true, 2, last, LINK), "the largest stage's reduction");
}

/// Under DualPipeV a rank's last backward is its first stage's (stage r), after which
/// only stages r − 1 .. 0 run theirs: rank 1's drain is stage 0's backward, not rank 0's
/// two stages'. Six layers over four stages with the embedding and the loss counted as a
/// layer each, a vocabulary of 256: rank 0 holds one layer in stage 0 and one in stage 3
/// with the two small tables (3C²), rank 1 stages 1 and 2 (4C²), and is the one the
/// step waits for: its reduction less one layer's backward.
#[test]
fn a_dualpipev_rank_hides_its_reduction_behind_the_stages_before_it() {
    let mut pr = toy_v(6, 256, gpu(1e12));
    let mut l = plain(2, 1, 2, 8);
    l.pipeline = PipelineKind::DualPipeV;
    l.dp_overlap = true;
    l.split = runner_graph::pipeline::PipelineSplit { embedding: 1, loss: 1 };
    let p = pr.project(&l).unwrap();
    let rank1 = 2.0 * (4 * C * C) as f64;
    let want = ring(true, 2, rank1, LINK) - layer_bwd_s();
    assert!(want > ring(true, 2, 2.0 * (3 * C * C) as f64, LINK), "the case the test means");
    close(p.breakdown.dp, want, "rank 1's reduction less stage 0's backward");
    close(p.comm.dp, ring(true, 2, rank1, LINK), "the largest rank's reduction");
}

/// With a virtual pipeline each chunk's reduction launches whole once the chunk's last
/// backward is done; the reductions queue on one communicator. Two stages of two
/// one-layer chunks: on stage 0 the first chunk to finish still has one group of pp = 2
/// chunk-backwards (its other chunk's, one layer each) to hide the queue behind, so with a
/// reduction far slower than a layer the step waits for both chunks' reductions, the
/// stage's whole reduction, less two layers' backward.
#[test]
fn interleaved_reductions_queue_behind_the_last_chunk_backwards() {
    let mut pr = toy(4, 1e12);
    let mut l = plain(2, 2, 2, 8);
    l.dp_overlap = true;
    let p = pr.project(&l).unwrap();
    let all = ring(true, 2, 2.0 * (V * C + 2 * C * C) as f64, LINK);
    assert!(all / 2.0 > 2.0 * layer_bwd_s(), "the case the test means");
    close(p.breakdown.dp, all - 2.0 * layer_bwd_s(), "both chunks' reductions less two chunk-backwards");
}

/// Activation offload (Megatron's cpu_offloading_num_layers): each offloaded layer's
/// stored activations (its T x C BF16 input) go to host memory after its forward and
/// come back before its backward, over the host link at 80 % of its rate (step.rs's
/// HOST_LINK_EFFICIENCY); what each copy takes beyond the layer's forward (and backward)
/// is exposed, every micro-batch. On the GPU the offloaded bytes leave the micro-batches
/// in flight but one layer's copy in transit stays; the host holds them for every
/// micro-batch in flight (2 on the first of two stages).
#[test]
fn offloaded_activations_cost_what_the_host_link_cannot_hide() {
    let mut pr = toy_v(8, 256, offload_gpu());
    let (bytes, copy) = ((2 * T * C) as f64, offload_copy_s());
    let (fwd, bwd) = (layer_s() / 3.0, layer_bwd_s());
    assert!(copy > bwd, "the case the test means");
    let m = 4u32;
    let without = pr.project(&plain(2, 1, 1, m)).unwrap();
    let mut l = plain(2, 1, 1, m);
    l.offload_layers = 1;
    let p = pr.project(&l).unwrap();
    close(p.breakdown.offload, f64::from(m) * ((copy - fwd) + (copy - bwd)), "exposed copies");
    assert_eq!((without.memory.stage, p.memory.stage), (0, 0));
    close(p.memory.activations * GIB, without.memory.activations * GIB - 2.0 * bytes + bytes, "two micro-batches' layer leave, one copy stays");
    close(p.memory.host_offload * GIB, 2.0 * bytes, "the host holds the two in flight");
}

/// Where the GPU reaches its NIC and the host over one link (`nic_shares_host_link`, a
/// PCIe switch on HGX boards), FSDP's traffic for a layer crosses it in the same window
/// as the layer's offload copy, one direction each way. dp = 2 over domains of one GPU
/// (so every FSDP collective crosses the NICs, one member a domain), a host link of
/// 1,250 GB/s at 80 %: 1e12 B/s. Per micro-batch the offloaded layer copies its input,
/// 2TC = 1,048,576 B, out in its forward (2TC²/peak = 0.536871 µs) and back in its
/// backward (1.073742 µs); FSDP gathers its C² BF16 weight over the two ranks, half of
/// it through the NIC each way (the ring's (n−1)/n over one member a domain): C² =
/// 262,144 B in the forward, and in the backward the gather again and the gradient's
/// reduce-scatter, 2C² = 524,288 B. Exposed: (copy + nic)/link less the longer of the
/// compute and the NIC's own time on the link:
///   alone:  forward 1.048576 − 0.536871 = 0.511705 µs; backward hidden (1.048576 < 1.073742);
///   shared: forward 1.310720 − 0.536871 = 0.773849 µs; backward 1.572864 − 1.073742 = 0.499122 µs.
/// m = 4 micro-batches, one offloaded layer.
#[test]
fn offload_shares_a_pcie_link_with_the_nic_traffic_beside_it() {
    let peak_s = |flops: f64| flops / PEAK;
    let (fwd, bwd) = (peak_s(2.0 * (T * C * C) as f64), peak_s(4.0 * (T * C * C) as f64));
    let (copy, link) = ((2 * T * C) as f64, 1e12);
    let (nic_fwd, nic_bwd) = ((C * C) as f64, 2.0 * (C * C) as f64);
    let on = |shared: bool| {
        let mut g = offload_gpu();
        g.host_link_gbs = Some(1250.0);
        g.scale_up_domain = 1;
        g.nic_shares_host_link = shared;
        let mut l = plain(1, 1, 2, 8);
        l.fsdp = true;
        l.offload_layers = 1;
        toy_v(8, 256, g).project(&l).unwrap()
    };
    let alone = (copy / link - fwd).max(0.0) + (copy / link - bwd).max(0.0);
    assert_eq!((copy / link - bwd).max(0.0), 0.0, "the case the test means: the backward hides the copy alone");
    close(on(false).breakdown.offload, 4.0 * alone, "the copies alone on their link");
    close(alone * 1e6, 0.511705, "the comment's figure");
    let shared = ((copy + nic_fwd) / link - fwd) + ((copy + nic_bwd) / link - bwd);
    close(on(true).breakdown.offload, 4.0 * shared, "the copies beside FSDP's traffic");
    close(shared * 1e6, 0.773849 + 0.499122, "the comment's figures");
}


/// Frozen weights (a fine-tune's) have no gradient and no optimizer state, only their
/// BF16 values; FSDP still shards and gathers them with the trained ones (twice per
/// micro-batch) but reduce-scatters only the trained ones' gradients. One of four layers
/// frozen, dp = 2, m = 4.
#[test]
fn frozen_weights_are_gathered_but_never_reduced() {
    let mut pr = projector(graph_frozen(4, V, false, 1), gpu(1e12));
    let frozen = (C * C) as f64;
    let trained = params(4) - frozen;
    let p = pr.project(&plain(1, 1, 2, 8)).unwrap();
    close(p.memory.weights * GIB, 2.0 * (trained + frozen), "weights");
    close(p.memory.gradients * GIB, 2.0 * trained, "gradients");
    close(p.memory.optimizer * GIB, 12.0 * trained, "optimizer state");
    close(p.comm.dp, ring(true, 2, 2.0 * trained, LINK), "the all-reduce of the trained gradients");
    let p = pr.project(&fsdp_dp2(1)).unwrap();
    let gathers = ring(false, 2, 2.0 * trained, LINK) + ring(false, 2, 2.0 * frozen, LINK);
    close(p.comm.dp, 4.0 * (2.0 * gathers + ring(false, 2, 2.0 * trained, LINK)), "FSDP traffic");
}

/// Full recompute of the first k layers of each pipeline chunk (Megatron's block method,
/// recompute_num_layers) repeats those layers' forward in the backward, one more layer's
/// forward per micro-batch for each layer more: over four layers on one stage, m = 4,
/// recomputing every layer repeats four layers' forwards per micro-batch, one layer one.
/// The head (and the embedding) sit outside the checkpointed layers (Megatron-Core's
/// TransformerBlock checkpoints its layers; GPTModel's output_layer and loss run once):
/// their forward is never repeated (it was: every layer charged 12 layer-forwards per
/// micro-batch here, the head being worth 8).
#[test]
fn partial_full_recompute_repeats_the_first_layers_of_each_chunk() {
    use runner_graph::recompute::RecomputePolicy;
    let mut pr = toy(4, 1e12);
    let (m, fwd) = (4.0, layer_s() / 3.0);
    let mut recompute = |k: u32| {
        let mut l = plain(1, 1, 1, 4);
        l.recompute = RecomputePolicy::Full;
        l.recompute_layers = k;
        pr.project(&l).unwrap().breakdown.recompute
    };
    let (every, one, two) = (recompute(0), recompute(1), recompute(2));
    close(every, m * 4.0 * fwd, "every layer, and not the head");
    close(one, m * fwd, "the first layer");
    close(every - one, m * 3.0 * fwd, "every layer against the first one");
    close(every - two, m * 2.0 * fwd, "every layer against the first two");
    close(recompute(4), every, "all four layers of the chunk");
}

/// The search's shape facts come off the graph: the toy's layers, width and vocabulary
/// as built, no multi-token-prediction layers, experts, scans or attention.
#[test]
fn the_shape_is_read_off_the_graph() {
    let p = toy(6, 1e12);
    let s = &p.model.shape;
    assert_eq!((s.layers, s.hidden, s.vocab, s.mtp, s.experts, s.scans), (6, C, V, 0, 0, 0));
    assert!(s.heads.is_empty());
}

/// A micro-batch whose graph the source cannot give is reported for that micro-batch
/// alone (building the others' templates ahead goes on), and a graph whose layer pattern
/// changes with the micro-batch is refused by name.
#[test]
fn a_micro_batch_the_source_fails_or_reshapes_is_reported_alone() {
    let key = |mbs: u32| runner_project::template::ShardKey { tp: 1, cp: 1, ep: 1, etp: 1, sp: false, mbs };
    let mut build = graph(4);
    let mut deeper = graph(5);
    let mut source = move |mb: u32| match mb {
        2 => Err("no graph at micro-batch 2".to_string()),
        3 => deeper(mb),
        _ => build(mb),
    };
    let mut model = Model::new("toy", T as u32, &mut source).unwrap();
    model.prebuild(&[key(1), key(2), key(4)], &mut source);
    assert_eq!(model.template(key(2), &mut source).err().as_deref(), Some("no graph at micro-batch 2"));
    assert_eq!(model.template(key(1), &mut source).unwrap().layers.len(), 1);
    assert_eq!(model.template(key(4), &mut source).unwrap().key, key(4));
    let e = model.template(key(3), &mut source).err().unwrap();
    assert!(e.contains("layer pattern changes with the micro-batch"), "{e}");
}

/// Measured op times given to a projector that has already costed a layout replace the
/// roofline from then on: the toy's one layer timed at 1 s forward and 2 s backward
/// (both its GEMMs) stands for each of its 4 alike layers, so the step grows by
/// 4 x (3 s - the layer's roofline).
#[test]
fn measured_times_given_later_replace_the_cached_costing() {
    let mut p = toy(4, 1e12);
    let l = layout(1, 1, 1, 1, 1, 1, 1);
    let before = p.project(&l).unwrap().step_time_s;
    let mut m = runner_project::template::Measured::default();
    m.ops.insert("layers.0.fc".into(), (1.0, 2.0));
    let mut p = p.with_measured(m);
    let after = p.project(&l).unwrap().step_time_s;
    let want = 4.0 * (3.0 - layer_s());
    assert!(((after - before) / want - 1.0).abs() < 1e-9, "{} against {want}", after - before);
}

/// A tied embedding's gradient all-reduce between the first and the last stage moves the
/// gradient buffer's elements at its precision: 4 B each with grad_reduce_in_fp32
/// (Megatron's `_allreduce_word_embedding_grads` reduces the main_grad buffer, fp32 under
/// grad_reduce_in_fp32), one all-reduce over 2 ranks, 2(n − 1)/n = 1 bus factor
/// (nccl-tests doc/PERFORMANCE.md).
#[test]
fn a_tied_gradient_is_all_reduced_at_the_gradient_buffers_precision() {
    let mut pr = projector(graph_with(4, V, true), gpu(1e12));
    let table = (V * C) as f64;
    let msg = ALPHA + (2 * T * C) as f64 / LINK;
    let sends = 2.0 * msg * (1.0 - 0.25) + 2.0 * msg;
    let mut l = plain(2, 1, 1, 1);
    l.grad_fp32 = true;
    let p = pr.project(&l).unwrap();
    close(p.breakdown.pp, sends + ring(true, 2, 4.0 * table, LINK), "fp32: the table's gradient at 4 B");
    close(p.comm.pp, 2.0 * msg + ring(true, 2, 4.0 * table, LINK), "fp32: all sends and the all-reduce");
}

/// Gradients reduced in fp32 (grad_reduce_in_fp32) move 4 B per element; the parameters
/// gathered back stay BF16 (2 B). Distributed optimizer (ZeRO-1), no overlap: a
/// reduce-scatter of 4N B and an all-gather of 2N B over dp = 2, each (n − 1)/n of its
/// bytes on the bus. FSDP (ZeRO-3): per micro-batch two BF16 gathers and one fp32
/// reduce-scatter (Rajbhandari et al. 2020, §5.3), m = 4 micro-batches.
#[test]
fn fp32_gradients_double_the_reduce_scatter_alone() {
    let mut pr = toy(4, 1e12);
    let n = params(4);
    let mut l = plain(1, 1, 2, 8);
    l.grad_fp32 = true;
    l.distributed_optimizer = true;
    let p = pr.project(&l).unwrap();
    close(p.breakdown.dp, ring(false, 2, 4.0 * n, LINK) + ring(false, 2, 2.0 * n, LINK), "fp32 reduce-scatter, BF16 gather");
    l.distributed_optimizer = false;
    l.fsdp = true;
    let p = pr.project(&l).unwrap();
    close(p.comm.dp, 4.0 * (2.0 * ring(false, 2, 2.0 * n, LINK) + ring(false, 2, 4.0 * n, LINK)), "FSDP: two BF16 gathers, one fp32 reduce-scatter");
}

/// Context parallelism splits the sequence, not the weights: the distributed optimizer
/// shards its 12 B of fp32 state per parameter over all dp·cp ranks that hold the same
/// weights (Megatron's data-parallel-with-cp group), dp = 2, cp = 2: N/4 per rank, and
/// the optimizer streams that shard (28 B an element) and the whole gradient buffer
/// (8 B a parameter, zeroed and normed) at the HBM rate.
#[test]
fn the_distributed_optimizer_shards_over_dp_and_cp() {
    let hbm = 1000e9;
    let mut pr = toy(4, hbm / 1e9);
    let n = params(4);
    let mut l = plain(1, 1, 2, 16);
    l.cp = 2;
    l.distributed_optimizer = true;
    let p = pr.project(&l).unwrap();
    close(p.memory.optimizer * GIB, 12.0 * n / 4.0, "optimizer state over dp·cp = 4");
    close(p.breakdown.optimizer, (28.0 * n / 4.0 + 8.0 * n) / hbm, "AdamW over dp·cp = 4");
}

/// Without a pipeline there is no send between stages: nothing in the step's pipeline
/// part, exposed or not.
#[test]
fn one_stage_sends_nothing() {
    let p = toy(4, 1e12).project(&plain(1, 1, 2, 8)).unwrap();
    assert_eq!((p.breakdown.pp, p.comm.pp), (0.0, 0.0));
}

/// Layouts Megatron refuses are refused: the interleaved schedule needs the micro-batches
/// to be a multiple of pp (Megatron-LM's forward_backward_pipelining_with_interleaving
/// asserts `num_microbatches % pipeline_parallel_size == 0`). Offloading every layer of
/// the fullest chunk is allowed (one more is not).
#[test]
fn layouts_megatron_refuses_are_refused() {
    let mut pr = toy(4, 1e12);
    let e = pr.project(&plain(2, 2, 1, 3)).unwrap_err();
    assert!(e.contains("multiple of pp = 2"), "{e}");
    assert!(pr.project(&plain(2, 2, 1, 4)).is_ok());
    let mut pr = toy_on(8, offload_gpu());
    let mut l = plain(2, 1, 1, 4);
    l.offload_layers = 4;
    assert!(pr.project(&l).is_ok(), "every layer of a 4-layer chunk");
    l.offload_layers = 5;
    assert!(pr.project(&l).is_err(), "past the chunk");
}

/// The micro-batches in flight never exceed the step's: at pp = 2, vp = 2 and m = 2 the
/// first stage's warm-up ((p − 1)·2 + (v − 1)·p = 4 chunk forwards) already runs every
/// chunk forward of the step, so it holds the two micro-batches, as 1F1B does at m = 2.
/// The EP overlap's extra warm-up chunk (Megatron's `num_warmup_microbatches += 1` under
/// overlap_moe_expert_parallel_comm) needs an expert-parallel group: without experts
/// asking for it changes nothing (2.5 micro-batches at m = 4, as without).
#[test]
fn micro_batches_in_flight_are_capped_at_the_steps() {
    let mut pr = toy_v(16, 256, gpu(1e12));
    // A micro-batch's activations of the first stage's eight layers (T x C BF16 each).
    let one = (8 * 2 * T * C) as f64;
    let p = pr.project(&plain(2, 2, 1, 2)).unwrap();
    assert_eq!(p.memory.stage, 0);
    close(p.memory.activations * GIB, 2.0 * one, "vp 2, m 2: both micro-batches");
    close(pr.project(&plain(2, 1, 1, 2)).unwrap().memory.activations * GIB, 2.0 * one, "vp 1, m 2");
    let mut l = plain(2, 2, 1, 4);
    l.ep_overlap = true;
    close(pr.project(&l).unwrap().memory.activations * GIB, 2.5 * one, "no experts: no extra warm-up chunk");
}

/// Two offloaded layers per chunk: both layers' stored inputs leave the GPU for every
/// micro-batch in flight but one layer's copy in transit stays (Transformer Engine's
/// double-buffered handler holds one at a time), and each copy's time beyond its layer's
/// forward and backward is exposed, every micro-batch.
#[test]
fn offloading_two_layers_keeps_one_copy_in_transit() {
    let mut pr = toy_v(8, 256, offload_gpu());
    let (bytes, copy) = ((2 * T * C) as f64, offload_copy_s());
    let (fwd, bwd) = (layer_s() / 3.0, layer_bwd_s());
    let m = 4u32;
    let without = pr.project(&plain(2, 1, 1, m)).unwrap();
    let mut l = plain(2, 1, 1, m);
    l.offload_layers = 2;
    let p = pr.project(&l).unwrap();
    close(p.breakdown.offload, f64::from(m) * 2.0 * ((copy - fwd) + (copy - bwd)), "two exposed copies a micro-batch");
    assert_eq!(p.memory.stage, 0);
    close(p.memory.activations * GIB, without.memory.activations * GIB - 2.0 * 2.0 * bytes + bytes, "two layers of two micro-batches leave, one copy stays");
    close(p.memory.host_offload * GIB, 2.0 * 2.0 * bytes, "the host holds them");
}

/// FSDP with a pipeline: the first gather a micro-batch waits for is one layer's share of
/// the critical stage's traffic (its own layers, not the model's). Four layers on two
/// stages, the last (layers 2-3 and the head, C² + C² + VC elements) the slower; m = 4;
/// dp = 2 ranks, a fast link so that the traffic exceeds the compute by less than the
/// whole.
#[test]
fn fsdp_waits_for_one_of_the_critical_stages_layers() {
    let (p, link) = fsdp_on_a_fast_link(2);
    let bytes = 2.0 * (V * C + 2 * C * C) as f64;
    let per_mb = 3.0 * ring(false, 2, bytes, link);
    let t_mb = 2.0 * layer_s() + head_s();
    let m = 4.0;
    assert!(per_mb > t_mb && m * (per_mb - t_mb) + per_mb / 2.0 < m * per_mb, "the case the test means");
    close(p.comm.dp, m * per_mb, "FSDP traffic of the last stage");
    close(p.breakdown.dp, m * (per_mb - t_mb) + per_mb / 2.0, "FSDP exposed: one of the stage's two layers waits");
}

/// Under FSDP frozen weights are sharded like trained ones (their BF16 values over dp),
/// beside the two whole gathered units (the largest layer, C x C, frozen or not).
#[test]
fn fsdp_shards_frozen_weights_too() {
    let mut pr = projector(graph_frozen(4, V, false, 1), gpu(1e12));
    let (n, big) = (params(4), (C * C) as f64);
    let p = pr.project(&fsdp_dp2(1)).unwrap();
    close(p.memory.weights * GIB, 2.0 * n / 2.0 + 2.0 * 2.0 * big, "every weight sharded over dp 2, two whole units");
}

/// Muon under Megatron's layer-wise distributed optimizer (`dist_muon`, as step.rs
/// describes it): each of dp = 2 ranks owns half the parameters; the layers' 2D weights
/// keep fp32 master and momentum (8 B) and stream 22 B each (master and momentum read and
/// written, the gradient read, the BF16 weight written), the embedding and the head stay
/// on AdamW (12 B, 28 B streamed); every rank zeroes and norms the whole gradient buffer
/// (8 B a parameter). The owned layers' momenta are orthogonalised by 5 quintic
/// Newton-Schulz steps, each 4·m²·n + 2·m³ FLOPs on an m x n matrix (Jordan et al. 2024,
/// "Muon"; X·Xᵀ, A², (bA + cA²)·X), at the toy's GEMM peak: C x C weights, 30·C³ per
/// layer. The gradients are all-reduced and the updated BF16 weights all-gathered after
/// the step, nothing hiding them.
#[test]
fn muon_owns_half_the_layers_and_keeps_the_ends_on_adamw() {
    use runner_project::step::Optimizer;
    let hbm = 1000e9;
    let mut pr = toy(4, hbm / 1e9);
    let (n, side, layers) = (params(4), (2 * V * C) as f64, (4 * C * C) as f64);
    let mut l = plain(1, 1, 2, 8);
    l.optimizer = Optimizer::Muon;
    let p = pr.project(&l).unwrap();
    let ns = 4.0 * 5.0 * 6.0 * (C * C * C) as f64;
    close(p.breakdown.optimizer, (22.0 * layers / 2.0 + 28.0 * side / 2.0 + 8.0 * n) / hbm + ns / 2.0 / PEAK, "Muon's step");
    close(p.memory.optimizer * GIB, 8.0 * layers / 2.0 + 12.0 * side / 2.0, "Muon's state");
    close(p.breakdown.dp, ring(true, 2, 2.0 * n, LINK) + ring(false, 2, 2.0 * n, LINK), "gradients all-reduced, weights all-gathered");
    // A tied table's copy on the last stage stays on AdamW as well: at pp = 2, m = 1 the
    // last stage (layers 2-3 and the tied copy of the table, with the logits) needs most.
    let mut pr = projector(graph_with(4, V, true), gpu(hbm / 1e9));
    let mut l = plain(2, 1, 1, 1);
    l.optimizer = Optimizer::Muon;
    let p = pr.project(&l).unwrap();
    assert_eq!(p.memory.stage, 1);
    close(p.memory.optimizer * GIB, 8.0 * (2 * C * C) as f64 + 12.0 * (V * C) as f64, "the last stage's Muon and AdamW state");
}

/// A synchronous step waits for its slowest rank: n ranks whose step times spread by σ
/// (the profile's straggler share of the step) wait σ·E[max of n normals] beyond the
/// mean, of which the profile's 8-GPU node already waits E[max of 8]. PP4 x DP4 = 16 GPUs,
/// σ = 2 %: 0.02 x (1.76599 − 1.42360) of the rest of the step (expected largest of 16
/// and of 8 standard normal draws, Harter 1961's tables).
#[test]
fn the_straggler_wait_counts_every_gpu_of_the_step() {
    let mut g = gpu(1e12);
    g.efficiency.straggler = 0.02;
    let p = toy_on(4, g).project(&plain(4, 1, 4, 16)).unwrap();
    assert_eq!(p.gpus, 16);
    let b = &p.breakdown;
    let rest = b.total() - b.straggler;
    let want = 0.02 * (1.76599 - 1.42360) * rest;
    assert!((b.straggler / want - 1.0).abs() < 1e-4, "{} vs {want}", b.straggler);
}

/// The headline figures: on the made-up GPU every GEMM runs at its peak and nothing else
/// takes time, so without communication (one GPU) a step of m micro-batches is m x the
/// model's GEMMs (forward 2·T·(4C² + CV), backward twice that) plus the optimizer;
/// tokens/s/GPU = T·GBS/step/GPUs, model TFLOP/s/GPU = FLOPs per sequence·GBS/step/GPUs,
/// MFU = that over the peak (NVIDIA's definition for its performance tables). With dp = 2
/// each GPU runs its own 4 micro-batches of GBS 8.
#[test]
fn throughput_and_mfu_follow_the_step() {
    let mut pr = toy(4, 1e12);
    let p = pr.project(&plain(1, 1, 2, 8)).unwrap();
    let (m, gemms) = (4.0, 4.0 * layer_s() + head_s());
    close(p.breakdown.compute_parts.gemm, m * gemms, "GEMMs of four micro-batches");
    close(p.breakdown.compute, m * gemms, "all the compute is GEMMs");
    let step = p.step_time_s;
    close(p.tokens_per_sec_per_gpu, (T * 8) as f64 / step / 2.0, "tokens/s/GPU");
    let flops = 3.0 * 2.0 * (T * (4 * C * C + C * V)) as f64;
    close(p.model_tflops_per_gpu, flops * 8.0 / step / 2.0 / 1e12, "model TFLOP/s/GPU");
    close(p.mfu, flops * 8.0 / step / 2.0 / PEAK, "MFU");
}

/// Full recompute of the first k layers of each chunk, with chunks of unequal length: six
/// layers over pp = 2, vp = 2 split 2, 2, 1, 1 (the first chunks take one more), chunk c
/// on stage c mod 2, so stage 0 runs layers 0-1 and 4, stage 1 layers 2-3 and 5 and the
/// head. k = 2 covers every layer of every chunk (a chunk of one layer recomputes its one
/// layer): the same step as recomputing every layer, stage 1's three layers' forward
/// repeated per micro-batch, and the bubble (p − 1)/v of the mean stage.
#[test]
fn partial_recompute_of_a_short_chunk_stops_at_its_end() {
    use runner_graph::recompute::RecomputePolicy;
    let mut pr = toy(6, 1e12);
    let (l, h, f, m) = (layer_s(), head_s(), layer_s() / 3.0, 4.0);
    let mut project = |k: u32| {
        let mut s = plain(2, 2, 1, 4);
        s.recompute = RecomputePolicy::Full;
        s.recompute_layers = k;
        pr.project(&s).unwrap()
    };
    let (two, every) = (project(2), project(0));
    close(two.breakdown.recompute, m * 3.0 * f, "stage 1's three layers");
    close(two.breakdown.bubble, 0.5 * ((3.0 * l + 3.0 * f) + (3.0 * l + h + 3.0 * f)) / 2.0, "bubble: half the mean stage");
    close(two.step_time_s, every.step_time_s, "k = 2 covers every chunk");
}

/// The parameter gather and the gradient reduction of a model larger than a bucket
/// (Megatron's max(40M, 1M·dp) elements): without a virtual pipeline, the gather hides
/// behind the first micro-batch's forward but for the first bucket, the reduction behind
/// the last backward but for the last bucket (the first stage, launched bucket by bucket,
/// megatron/core/distributed/param_and_grad_buffer.py and schedules.py). A vocabulary of
/// 65,536: 68.2M parameters, the gather (1.36 ms over dp = 2) far longer than the
/// forward (70.9 µs, mostly the head's), so exposed: the gather less the whole forward
/// (the head's included), the reduce-scatter less the whole backward, each more than its
/// last 40M-element bucket.
#[test]
fn a_model_larger_than_a_bucket_hides_what_its_compute_covers() {
    let v = 65_536u64;
    let mut pr = toy_v(4, v, gpu(1e12));
    let n = (2 * v * C + 4 * C * C) as f64;
    let mut l = plain(1, 1, 2, 4);
    l.distributed_optimizer = true;
    l.dp_overlap = true;
    let p = pr.project(&l).unwrap();
    let fwd = (4 * 2 * T * C * C + 2 * T * C * v) as f64 / PEAK;
    let (ag, rs) = (ring(false, 2, 2.0 * n, LINK), ring(false, 2, 2.0 * n, LINK));
    let bucket = ring(false, 2, 2.0 * 40e6, LINK);
    assert!(ag - fwd > bucket && rs - 2.0 * fwd > bucket, "the case the test means");
    close(p.breakdown.dp, (rs - 2.0 * fwd) + (ag - fwd), "each less the compute that hides it");
    close(p.comm.dp, rs + ag, "all of it");
    // With HBM at 4 TB/s the memory-bound ops take time too (the embedding's lookup and
    // its gradient's scatter into the table, the loss): they hide the traffic as the
    // GEMMs do, so the step waits for all of it less one micro-batch's forward and
    // backward, half the compute of m = 2 (BF16: no casts).
    let mut pr = toy_v(4, v, gpu(4000.0));
    let p = pr.project(&l).unwrap();
    assert!(p.breakdown.compute > 2.0 * 3.0 * fwd * 1.01, "the case the test means: memory-bound work counts");
    close(p.breakdown.dp, p.comm.dp - p.breakdown.compute / 2.0, "the traffic less a micro-batch's compute");
}

/// With a virtual pipeline and align_param_gather (NeMo and Megatron-Bridge, pp > 1,
/// vp > 1), the first two chunks' gathers go out whole as the step starts and queue on
/// one communicator; chunk c is needed at its first forward, c groups of pp chunk
/// forwards in, after the stage's fill (the forwards of the stages before it). The
/// gradients' reduce-scatter per chunk goes out as the chunk's last backward ends, the
/// last chunk's hidden only by the drain (the backwards of the stages before it).
/// Three layers of 4096 with a vocabulary of 256 and the embedding counted as a layer
/// (account_for_embedding_in_pipeline_split): four chunks of one unit each, the
/// embedding; layer 0; layer 1; layer 2 and the head: stage 0 holds the table and layer
/// 1, stage 1 layers 0 and 2 and the head, nearly twice stage 0's weights, so stage 1 is
/// the one the step waits for. Per stage, a = its gather (reduce-scatter) over vp = 2,
/// f = its forward over 2, s = the fill over 2:
/// - gather: chunk 0 needed after s + f: a − f − s exposed; chunk 1 (both queued,
///   done at 2a) needed one group (2f) later: 2a − 3f − s; stage 0 also waits for its
///   first bucket, here its whole gather (17.8M elements, one bucket);
/// - reduce-scatter: the last chunk's a less the drain (stage 0's backward) over 2; the
///   two queued, 2a, less one group of 2 chunk backwards.
#[test]
fn interleaved_gathers_queue_behind_the_fill() {
    const CW: u64 = 4096;
    const VS: u64 = 256;
    // Same toy, wider: C = 4096, V = 256.
    let mut source: Box<dyn GraphSource> = Box::new(move |mb: u32| -> Result<Graph, String> {
        let b = u64::from(mb);
        let ten = |name: &str, s: Vec<u64>, d: DType, k: TensorKind| Tensor { name: name.into(), shape: s, dtype: d, kind: k };
        let op = |name: &str, k: OpKind, i: &[&str], o: &[&str], layer: i32, role: Role| NamedOp::of(name, k, i, o, &[], layer, role);
        let mut tensors = vec![
            ten("tokens", vec![b, T], DType::I32, TensorKind::Input),
            ten("targets", vec![b, T], DType::I32, TensorKind::Input),
            ten("table", vec![VS, CW], DType::BF16, TensorKind::Weight),
            ten("head", vec![VS, CW], DType::BF16, TensorKind::Weight),
            ten("x0", vec![b, T, CW], DType::BF16, TensorKind::Activation),
            ten("logits", vec![b, T, VS], DType::BF16, TensorKind::Activation),
            ten("loss", vec![], DType::F32, TensorKind::Activation),
        ];
        let mut ops = vec![op("embed", OpKind::Embedding, &["tokens", "table"], &["x0"], -1, Role::VocabParallel)];
        for i in 0..3 {
            let (w, x, y) = (format!("w{i}"), format!("x{i}"), format!("x{}", i + 1));
            tensors.push(ten(&w, vec![CW, CW], DType::BF16, TensorKind::Weight));
            tensors.push(ten(&y, vec![b, T, CW], DType::BF16, TensorKind::Activation));
            ops.push(op(&format!("layers.{i}.fc"), OpKind::Linear, &[&x, &w], &[&y], i, Role::ColumnParallel));
        }
        ops.push(op("head", OpKind::Linear, &["x3", "head"], &["logits"], -1, Role::VocabParallel));
        ops.push(op("loss", OpKind::CrossEntropy, &["logits", "targets"], &["loss"], -1, Role::VocabParallel));
        Graph::new(tensors, ops, "loss").map_err(|e| e.to_string())
    });
    let model = Model::new("wide", T as u32, source.as_mut()).unwrap();
    let plan = Plan::builtin(Recipe::Bf16, &model.graph);
    let mut pr = Projector::new(model, source, gpu(1e12), plan);
    let mut l = plain(2, 2, 2, 8);
    l.distributed_optimizer = true;
    l.dp_overlap = true;
    l.split = runner_graph::pipeline::PipelineSplit { embedding: 1, loss: 0 };
    let p = pr.project(&l).unwrap();
    let (layer, table) = ((CW * CW) as f64, (VS * CW) as f64);
    let gemm_fwd = |elems: f64| 2.0 * T as f64 * elems / PEAK;
    // Stage 0: the table (the embedding's forward is a lookup, no GEMM) and layer 1.
    let (p0, fwd0) = (table + layer, gemm_fwd(layer));
    // Stage 1: layers 0 and 2, the head.
    let (p1, fwd1) = (2.0 * layer + table, gemm_fwd(2.0 * layer + table));
    let (bwd0, bwd1) = (2.0 * fwd0, 2.0 * fwd1);
    assert!(p0 < 40e6, "stage 0 is one bucket");
    let coll = |elems: f64| ring(false, 2, 2.0 * elems, LINK);
    let gather = |all: f64, fwd: f64, fill: f64| {
        let (a, f, s) = (all / 2.0, fwd / 2.0, fill / 2.0);
        (a - f - s).max(2.0 * a - 3.0 * f - s)
    };
    let ag0 = gather(coll(p0), fwd0, 0.0).max(coll(p0));
    let ag1 = gather(coll(p1), fwd1, fwd0);
    let reduce = |all: f64, bwd: f64, drain: f64| {
        let (a, b) = (all / 2.0, bwd / 2.0);
        (a - drain / 2.0).max(0.0).max(2.0 * a - 2.0 * b)
    };
    let (rs0, rs1) = (reduce(coll(p0), bwd0, 0.0), reduce(coll(p1), bwd1, bwd0));
    assert!(ag1 > ag0 && rs1 > rs0, "the case the test means: stage 1 decides");
    close(p.breakdown.dp, rs1 + ag1, "stage 1's queued reduce-scatter and gather");
    close(p.comm.dp, 2.0 * coll(p1), "the larger stage's traffic");
    // The four-layer toy at pp = 2, vp = 2: stage 0 holds the table and layers 0 and 2,
    // stage 1 layers 1 and 3 and the head, as many weights (2.6M elements, one bucket).
    // Stage 0 decides: its gather waits for its first bucket, the whole of it, and of
    // its reduce-scatter the two queued chunks' (its whole) less one group of two chunk
    // backwards (layers 0 and 2); stage 1's head hides more of its own.
    let mut pr = toy(4, 1e12);
    let p = pr.project(&l_toy()).unwrap();
    let all = coll((V * C + 2 * C * C) as f64);
    assert!(all / 2.0 < all - 2.0 * layer_bwd_s(), "the case the test means");
    close(p.breakdown.dp, (all - 2.0 * layer_bwd_s()) + all, "stage 0: reduce-scatter less two chunk backwards, and its first bucket's gather");
}

/// pp = 2, vp = 2, dp = 2, m = 4, the distributed optimizer overlapped.
fn l_toy() -> runner_project::step::LayoutSpec {
    let mut l = plain(2, 2, 2, 8);
    l.distributed_optimizer = true;
    l.dp_overlap = true;
    l
}

/// A layout's GPUs are tp·pp·cp·dp (expert parallelism folds into them); a host that holds
/// exactly the offloaded activations holds them.
#[test]
fn gpus_count_every_parallel_degree_and_full_hosts_fit() {
    use runner_project::step::Memory;
    assert_eq!(common::layout(2, 3, 5, 1, 7, 1, 7).gpus(), 2 * 3 * 5 * 7);
    let m = Memory { host_offload: 10.0, host_capacity: 10.0, total: 1.0, capacity: 1.0, ..Memory::default() };
    assert!(m.host_fits() && m.gpu_fits() && m.fits() && m.shortfall().is_none());
    // One stage needs no pipeline layout string, whatever the split.
    let mut one = common::layout(1, 1, 1, 1, 8, 1, 8);
    one.split = runner_graph::pipeline::PipelineSplit { embedding: 1, loss: 1 };
    assert_eq!(one.pipeline_layout_needed(32, 0), None);
    let over = Memory { host_offload: 10.5, ..m };
    assert!(!over.fits() && over.shortfall().is_some());
}

/// A tied table's gradient is all-reduced between the first and the last stage, which sit
/// (pp − 1)·tp·cp·dp ranks apart in Megatron's rank order: at pp = 4, dp = 4 the pair
/// (ranks 0 and 12) spans two 8-GPU H100 nodes, one NIC each: one scale-out latency step
/// and the table's BF16 gradient (all-reduce of 2 ranks: bus factor 2(n − 1)/n = 1) at
/// the slower of NVLink and one NIC; the sends between neighbouring stages (4 ranks
/// apart) stay on NVLink. m = 1: every send exposed.
#[test]
fn the_tied_gradient_goes_from_the_first_to_the_last_stage() {
    let g = gpu(1e12);
    let nic = g.scale_out_gbs * 1e9 * g.efficiency.scale_out;
    let nic_lat = g.efficiency.scale_out_latency_us * 1e-6;
    let mut pr = projector(graph_with(4, V, true), g);
    let p = pr.project(&plain(4, 1, 4, 4)).unwrap();
    assert_eq!(p.micro_batches, 1);
    let msg = ALPHA + (2 * T * C) as f64 / LINK;
    let sends = 2.0 * msg * (1.0 - 0.25) + 2.0 * 3.0 * msg;
    let tied = nic_lat + 2.0 * (V * C) as f64 / LINK.min(nic);
    close(p.breakdown.pp, sends + tied, "sends on NVLink, the tied all-reduce over the NICs");
}

/// A frozen tied table (a LoRA fine-tune's): the last stage holds its BF16 copy, with
/// neither gradient nor optimizer state, and no gradient crosses between the ends.
#[test]
fn a_frozen_tied_table_is_held_but_never_reduced() {
    let mut pr = projector(graph_of(4, V, true, 0, true, 1), gpu(1e12));
    let p = pr.project(&plain(2, 1, 1, 1)).unwrap();
    assert_eq!(p.memory.stage, 1);
    let (table, layers) = ((V * C) as f64, (2 * C * C) as f64);
    close(p.memory.weights * GIB, 2.0 * (table + layers), "the table's copy and two layers");
    close(p.memory.gradients * GIB, 2.0 * layers, "gradients of the two layers");
    close(p.memory.optimizer * GIB, 12.0 * layers, "optimizer state of the two layers");
    let msg = ALPHA + (2 * T * C) as f64 / LINK;
    close(p.breakdown.pp, 2.0 * msg * (1.0 - 0.25) + 2.0 * msg, "the sends alone");
}

/// Offload under partial full recompute: of two layers of two linears each (C x C), the
/// first fully recomputed keeps only its input (Korthikanti et al. 2022, §4: full
/// recompute stores each layer's input alone), the second both linears' inputs; both
/// offloaded, the host holds 2TC + 2·2TC bytes of the one micro-batch in flight.
#[test]
fn offload_moves_what_each_layer_keeps_under_its_own_recompute() {
    use runner_graph::recompute::RecomputePolicy;
    let g = offload_gpu();
    let mut pr = projector(graph_of(2, 256, false, 0, false, 2), g);
    let mut l = plain(1, 1, 1, 1);
    l.recompute = RecomputePolicy::Full;
    l.recompute_layers = 1;
    l.offload_layers = 2;
    let p = pr.project(&l).unwrap();
    let input = (2 * T * C) as f64;
    close(p.memory.host_offload * GIB, input + 2.0 * input, "one input, then two");
}

/// NVFP4 runs keep fp8_param_gather off (Megatron-Bridge's NVFP4 precision config): the
/// distributed optimizer gathers BF16 weights (2 B an element) and the BF16 copy stays
/// resident beside the casts of the NVFP4 layers, as without the distributed optimizer.
/// dp = 2, no overlap:
/// a reduce-scatter and an all-gather of 2N bytes.
#[test]
fn nvfp4_keeps_bf16_parameters() {
    let mut g = gpu(1e12);
    g.peak_tflops.nvfp4 = Some(4.0 * PEAK / 1e12);
    g.peak_tflops.fp8 = Some(2.0 * PEAK / 1e12);
    // Eight layers: the builtin NVFP4 plan keeps the last four in BF16, as NVIDIA's
    // NVFP4 recipe does, and runs the first four in NVFP4.
    let mut source: Box<dyn GraphSource> = Box::new(graph(8));
    let model = Model::new("toy", T as u32, source.as_mut()).unwrap();
    let plan = Plan::builtin(Recipe::Nvfp4, &model.graph);
    let mut pr = Projector::new(model, source, g, plan);
    let n = params(8);
    let mut l = plain(1, 1, 2, 8);
    let without = pr.project(&l).unwrap();
    l.distributed_optimizer = true;
    let p = pr.project(&l).unwrap();
    close(p.comm.dp, 2.0 * ring(false, 2, 2.0 * n, LINK), "BF16 reduce-scatter and gather");
    close(p.memory.weights, without.memory.weights, "the BF16 copy stays");
    assert!(p.memory.weights * GIB > 2.0 * n, "the casts are there too");
}

/// Memory-bound ops at the HBM rate, each op's bytes as runner_graph::count counts them:
/// the embedding's lookup reads the B·T int32 tokens and reads and writes B·T rows of C
/// BF16 (4T + 2·2TC), the loss reads the BF16 logits (2TV), the int32 targets (4T) and
/// writes one fp32 scalar (4); each one's backward moves twice its forward's bytes (the
/// gradient read, the input re-read, the input gradient written), and an op nothing
/// upstream needs a gradient from runs none. With a frozen table (a fine-tune's), the
/// embedding runs no backward and the first layer, whose input then needs no gradient,
/// runs its weight gradient alone (PyTorch's autograd skips the input gradient of a
/// tensor that does not require one): one micro-batch's compute is 4 layer forwards,
/// 7 of their backward GEMMs, the head's 3, the embedding's forward and the loss's 3.
/// HBM at 10 TB/s: every GEMM still compute-bound (the head's 4.3 GFLOP over its 13.6 MB
/// is 316 FLOP/B, the layers' 205, both above the 100 of 1 PFLOP/s over 10 TB/s).
#[test]
fn memory_bound_ops_and_gemms_run_the_backward_their_inputs_need() {
    let hbm = 10_000e9;
    let (f, h) = (layer_s() / 3.0, head_s() / 3.0);
    let embed = (4 * T + 4 * T * C) as f64 / hbm;
    let loss = (2 * T * V + 4 * T + 4) as f64 / hbm;
    let compute = |frozen_table: bool| {
        let mut pr = projector(graph_of(4, V, false, 0, frozen_table, 1), gpu(hbm / 1e9));
        pr.project(&plain(1, 1, 1, 1)).unwrap().breakdown.compute
    };
    close(compute(false), 12.0 * f + 3.0 * h + 3.0 * embed + 3.0 * loss, "trained table");
    close(compute(true), 11.0 * f + 3.0 * h + embed + 3.0 * loss, "frozen table");
}

/// A measured GEMM's backward is the input and the weight gradient `runner measure`
/// timed together; a frozen weight's GEMM runs the input gradient alone, taken as half of
/// it. The toy's first layer frozen, measured at 1 s forward and 2 s backward: its forward
/// becomes 1 s and its backward 1 s, in place of its roofline forward and input gradient.
#[test]
fn a_measured_frozen_gemm_runs_half_its_backward() {
    let mut pr = projector(graph_frozen(4, V, false, 1), gpu(1e12));
    let l = plain(1, 1, 1, 1);
    let before = pr.project(&l).unwrap().breakdown.compute;
    let mut m = runner_project::template::Measured::default();
    m.ops.insert("layers.0.fc".into(), (1.0, 2.0));
    let mut pr = pr.with_measured(m);
    let after = pr.project(&l).unwrap().breakdown.compute;
    let f = layer_s() / 3.0;
    close(after - before, (1.0 + 1.0) - (f + f), "the frozen layer: 1 s forward, half of 2 s backward");
}

/// The FP8 recipe's parameter gather (fp8_param_gather) moves the trained weights of FP8
/// GEMMs at 1 B and every other trained weight at 2 B; frozen weights are neither reduced
/// nor gathered by the distributed optimizer, FP8 or not. The toy's four layers run FP8
/// (the head, vocabulary-parallel, BF16), the first frozen: dp = 2, no overlap, a
/// reduce-scatter of the 2N_trained BF16 gradients and an all-gather of
/// 2·(N_trained − 3C²) + 3C² bytes.
#[test]
fn fp8_parameters_gathered_are_the_trained_ones() {
    let mut source: Box<dyn GraphSource> = Box::new(graph_frozen(4, V, false, 1));
    let model = Model::new("toy", T as u32, source.as_mut()).unwrap();
    let plan = Plan::builtin(Recipe::Fp8, &model.graph);
    let mut pr = Projector::new(model, source, gpu(1e12), plan);
    let trained = params(4) - (C * C) as f64;
    let fp8 = (3 * C * C) as f64;
    let mut l = plain(1, 1, 2, 8);
    l.distributed_optimizer = true;
    let p = pr.project(&l).unwrap();
    close(p.comm.dp, ring(false, 2, 2.0 * trained, LINK) + ring(false, 2, 2.0 * (trained - fp8) + fp8, LINK), "BF16 gradients, FP8 trained weights");
}

/// A grouped GEMM runs one call per local expert, and a GEMM's efficiency grows with the
/// FLOPs of its call (the profile's x / (x + x½) law, x½ = gemm_half_gflop): one layer of
/// a 4-expert grouped linear (C x C each, the B·T rows split among them, 2·T·C² FLOPs in
/// all), at ep = 1 four calls of a quarter each. With x½ set to that quarter the experts'
/// GEMMs run at half the peak (forward, input and weight gradient alike), the head's
/// 4.29 GFLOP call at 4.29 / (4.29 + 0.134) of it.
#[test]
fn a_grouped_gemms_efficiency_follows_each_experts_call() {
    let mut source: Box<dyn GraphSource> = Box::new(move |mb: u32| -> Result<Graph, String> {
        let b = u64::from(mb);
        let ten = |name: &str, s: Vec<u64>, d: DType, k: TensorKind| Tensor { name: name.into(), shape: s, dtype: d, kind: k };
        let op = |name: &str, k: OpKind, i: &[&str], o: &[&str], layer: i32, role: Role| NamedOp::of(name, k, i, o, &[], layer, role);
        let tensors = vec![
            ten("tokens", vec![b, T], DType::I32, TensorKind::Input),
            ten("targets", vec![b, T], DType::I32, TensorKind::Input),
            ten("table", vec![V, C], DType::BF16, TensorKind::Weight),
            ten("head", vec![V, C], DType::BF16, TensorKind::Weight),
            ten("experts", vec![4, C, C], DType::BF16, TensorKind::Weight),
            // Each row's expert (the routing the experts' GEMMs read).
            ten("idx", vec![b, T], DType::I32, TensorKind::Input),
            ten("x0", vec![b, T, C], DType::BF16, TensorKind::Activation),
            ten("x1", vec![b, T, C], DType::BF16, TensorKind::Activation),
            ten("logits", vec![b, T, V], DType::BF16, TensorKind::Activation),
            ten("loss", vec![], DType::F32, TensorKind::Activation),
        ];
        let ops = vec![
            op("embed", OpKind::Embedding, &["tokens", "table"], &["x0"], -1, Role::VocabParallel),
            op("layers.0.experts", OpKind::GroupedLinear, &["x0", "experts", "idx"], &["x1"], 0, Role::Expert),
            op("head", OpKind::Linear, &["x1", "head"], &["logits"], -1, Role::VocabParallel),
            op("loss", OpKind::CrossEntropy, &["logits", "targets"], &["loss"], -1, Role::VocabParallel),
        ];
        Graph::new(tensors, ops, "loss").map_err(|e| e.to_string())
    });
    let model = Model::new("moe", T as u32, source.as_mut()).unwrap();
    let plan = Plan::builtin(Recipe::Bf16, &model.graph);
    let (fwd, head) = ((2 * T * C * C) as f64, (2 * T * C * V) as f64);
    let mut g = gpu(1e12);
    g.efficiency.gemm_half_gflop = fwd / 4.0 / 1e9;
    g.efficiency.grouped_gemm = 1.0;
    let mut pr = Projector::new(model, source, g, plan);
    let p = pr.project(&plain(1, 1, 1, 1)).unwrap();
    let share = head / (head + fwd / 4.0);
    close(p.breakdown.compute_parts.gemm, 3.0 * fwd / (PEAK * 0.5) + 3.0 * head / (PEAK * share), "experts at half the peak");
}

/// Recomputing to fit takes the fewest layers per chunk whose memory fits, one layer
/// included (search.rs's binary search over 1..=chunk). Four layers of two C x C linears
/// each: a layer keeps both linears' BF16 inputs (2 x 2TC bytes), and fully recomputed
/// only its input (Korthikanti et al. 2022, §4), so each recomputed layer frees 2TC. On a
/// GPU short of half that, recomputing one layer fits, and one is the answer.
#[test]
fn recompute_to_fit_takes_the_fewest_layers_down_to_one() {
    use runner_graph::recompute::RecomputePolicy;
    use runner_project::search;
    let source = || graph_of(4, 256, false, 0, false, 2);
    let l = plain(1, 1, 1, 1);
    let none = projector(source(), gpu(1e12)).project(&l).unwrap();
    let input = (2 * T * C) as f64;
    let mut g = gpu(1e12);
    g.memory_gib = none.memory.total - 0.5 * input / GIB;
    let mut pr = projector(source(), g);
    assert!(!pr.project(&l).unwrap().fits);
    let c = pr.costed(l.key(), l.kernels).unwrap();
    let p = search::recompute_to_fit(c, &l.schedule(), 4, &mut 0).unwrap();
    assert!(p.fits, "{}", p.layout.short());
    assert_eq!((p.layout.recompute, p.layout.recompute_layers), (RecomputePolicy::Full, 1), "{}", p.layout.short());
    close((none.memory.total - p.memory.total) * GIB, input, "one recomputed layer frees one linear's input");
}

/// DualPipe's optimizer step streams the shard its state is spread over (DeepSeek-V3
/// Technical Report, arXiv:2412.19437, §3.2.1: DualPipe keeps two copies of the
/// parameters, pipeline ranks r and pp − 1 − r holding the same stages): with the
/// distributed optimizer (ZeRO-1, Rajbhandari et al. 2020) each stage's state lies over
/// the 2·dp ranks that hold it, so the step reads and writes 28 B an element of that
/// quarter (dp = 2, two holders) and zeroes and norms the rank's whole gradient buffer,
/// 8 B a parameter of both its stages. Four one-layer stages: ranks 0 and 3 hold the
/// embedding, layer 0, layer 3 and the head, N = 2VC + 2C² parameters. (A hand mutation
/// audit let the optimizer's time divide by dp alone, the memory by both, with every other
/// test passing.)
#[test]
fn dualpipe_streams_the_optimizer_shard_of_both_holders() {
    let hbm = 1000e9;
    let mut pr = toy(4, hbm / 1e9);
    let mut l = plain(4, 1, 2, 16);
    l.pipeline = PipelineKind::DualPipe;
    l.distributed_optimizer = true;
    let p = pr.project(&l).unwrap();
    let n = params(2);
    close(p.memory.optimizer * GIB, 12.0 * n / 4.0, "state over dp 2 and the two holders");
    close(p.breakdown.optimizer, (28.0 * n / 4.0 + 8.0 * n) / hbm, "the step over the same shard");
}

/// DualPipe keeps pp + 1 micro-batches' activations on each rank (the table of
/// github:deepseek-ai/DualPipe's README: "Activation: PP+1", against 1F1B's PP on its first
/// stage), never more than the step has. pp = 4, m = 8: rank 0 runs stage 0 (layer 0) and
/// stage 3 (layer 3 and the head) for half the micro-batches each, a one-layer stage's
/// stored input (2TC, activations_are_the_tensors_the_backward_reads) for each of the
/// 5 micro-batches in flight, plus the head's input and the logits (2TC + 2TV) once, as
/// the last stage of 1F1B holds them; the embedding keeps no floating-point tensor. At
/// m = 4 (pp = 2) the 3 in flight are under the step's 4. (A hand mutation audit held pp
/// of them, with every other test passing.)
#[test]
fn dualpipe_holds_pp_plus_one_micro_batches_in_flight() {
    let mut pr = toy(4, 1e12);
    let dual = |pp: u32, gbs: u32| LayoutSpec { pipeline: PipelineKind::DualPipe, ..plain(pp, 1, 1, gbs) };
    let p = pr.project(&dual(4, 8)).unwrap();
    let (input, head) = ((2 * T * C) as f64, (2 * T * C + 2 * T * V) as f64);
    assert_eq!(p.memory.stage, 0, "an end rank needs most");
    close(p.memory.activations * GIB, 5.0 * input + head, "pp + 1 = 5 micro-batches of a one-layer stage, and the head's");
    // Two stages of two layers: 3 micro-batches of two layers' inputs, and the head's.
    let p = pr.project(&dual(2, 4)).unwrap();
    close(p.memory.activations * GIB, 3.0 * 2.0 * input + head, "pp + 1 = 3 micro-batches of a two-layer stage");
}

/// MFU is against the dense peak of the plan's low-precision format (an FP8 run against the
/// FP8 peak, as NVIDIA's performance tables report it; step.rs's `Projection::mfu`), not
/// the BF16 peak: the toy in FP8 on a GPU whose FP8 peak is twice its BF16 one,
/// model FLOPs per sequence 3·2·T·(4C² + CV), GBS 8 on dp = 2. (A hand mutation audit took
/// the BF16 peak for every run, with every other test passing.)
#[test]
fn an_fp8_runs_mfu_is_against_the_fp8_peak() {
    let mut g = gpu(1e12);
    g.peak_tflops.fp8 = Some(2.0 * PEAK / 1e12);
    g.efficiency.gemm.fp8 = 1.0;
    let mut source: Box<dyn GraphSource> = Box::new(graph(4));
    let model = Model::new("toy", T as u32, source.as_mut()).unwrap();
    let plan = Plan::builtin(Recipe::Fp8, &model.graph);
    let mut pr = Projector::new(model, source, g, plan);
    let p = pr.project(&plain(1, 1, 2, 8)).unwrap();
    let flops = 3.0 * 2.0 * (T * (4 * C * C + C * V)) as f64;
    let achieved = flops * 8.0 / p.step_time_s / 2.0;
    close(p.model_tflops_per_gpu, achieved / 1e12, "model TFLOP/s/GPU");
    close(p.mfu, achieved / (2.0 * PEAK), "MFU against the FP8 peak");
}
