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
use runner_project::step::LayoutSpec;

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
    move |mb: u32| -> Result<Graph, String> {
        let b = u64::from(mb);
        let ten = |name: &str, s: Vec<u64>, d: DType, k: TensorKind| Tensor { name: name.into(), shape: s, dtype: d, kind: k };
        let op = |name: &str, k: OpKind, i: &[&str], o: &[&str], layer: i32, role: Role| NamedOp::of(name, k, i, o, &[], layer, role);
        let mut tensors = vec![
            ten("tokens", vec![b, T], DType::I32, TensorKind::Input),
            ten("targets", vec![b, T], DType::I32, TensorKind::Input),
            ten("table", vec![v, C], DType::BF16, TensorKind::Weight),
            ten("x0", vec![b, T, C], DType::BF16, TensorKind::Activation),
            ten("logits", vec![b, T, v], DType::BF16, TensorKind::Activation),
            ten("loss", vec![], DType::F32, TensorKind::Activation),
        ];
        if !tied {
            tensors.push(ten("head", vec![v, C], DType::BF16, TensorKind::Weight));
        }
        let mut ops = vec![op("embed", OpKind::Embedding, &["tokens", "table"], &["x0"], -1, Role::VocabParallel)];
        for i in 0..n {
            let (w, x, y) = (format!("w{i}"), format!("x{i}"), format!("x{}", i + 1));
            let kind = if i < frozen { TensorKind::Frozen } else { TensorKind::Weight };
            tensors.push(ten(&w, vec![C, C], DType::BF16, kind));
            tensors.push(ten(&y, vec![b, T, C], DType::BF16, TensorKind::Activation));
            ops.push(op(&format!("layers.{i}.fc"), OpKind::Linear, &[&x, &w], &[&y], i as i32, Role::ColumnParallel));
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
    let mut source: Box<dyn GraphSource> = Box::new(graph_v(n, v));
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
#[test]
fn fsdp_moves_three_parameter_volumes_per_micro_batch() {
    let (m, layers) = (4.0, 4.0);
    let bytes = 2.0 * params(4);
    // A fast link: the traffic exceeds the compute by less than the whole.
    let mut fast = gpu(1e12);
    fast.scale_up_gbs = 1000.0;
    let link = 1000e9 * 0.5;
    let mut pr = toy_on(4, fast);
    let mut l = plain(1, 1, 2, 8);
    l.fsdp = true;
    let p = pr.project(&l).unwrap();
    let per_mb = 2.0 * ring(false, 2, bytes, link) + ring(false, 2, bytes, link);
    let t_mb = 4.0 * layer_s() + head_s();
    assert!(per_mb > t_mb && per_mb / layers < m * t_mb, "the case the test means: {per_mb} vs {t_mb}");
    close(p.comm.dp, m * per_mb, "FSDP traffic");
    close(p.breakdown.dp, m * (per_mb - t_mb) + per_mb / layers, "FSDP exposed");
    // The slow link: what the compute cannot hide plus the first wait would exceed the
    // traffic itself; the whole of it is exposed.
    let mut pr = toy(4, 1e12);
    let p = pr.project(&l).unwrap();
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
    let mut source: Box<dyn GraphSource> = Box::new(graph_with(4, V, true));
    let model = Model::new("toy", T as u32, source.as_mut()).unwrap();
    let plan = Plan::builtin(Recipe::Bf16, &model.graph);
    let mut pr = Projector::new(model, source, gpu(1e12), plan);
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
    let mut g = gpu(1e12);
    g.host_link_gbs = Some(64.0);
    g.host_memory_gib = Some(1000.0);
    let mut pr = toy_v(8, 256, g);
    let bytes = (2 * T * C) as f64;
    let copy = bytes / (64e9 * 0.8);
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


/// Frozen weights (a fine-tune's) have no gradient and no optimizer state, only their
/// BF16 values; FSDP still shards and gathers them with the trained ones (twice per
/// micro-batch) but reduce-scatters only the trained ones' gradients. One of four layers
/// frozen, dp = 2, m = 4.
#[test]
fn frozen_weights_are_gathered_but_never_reduced() {
    let mut source: Box<dyn GraphSource> = Box::new(graph_frozen(4, V, false, 1));
    let model = Model::new("toy", T as u32, source.as_mut()).unwrap();
    let plan = Plan::builtin(Recipe::Bf16, &model.graph);
    let mut pr = Projector::new(model, source, gpu(1e12), plan);
    let frozen = (C * C) as f64;
    let trained = params(4) - frozen;
    let p = pr.project(&plain(1, 1, 2, 8)).unwrap();
    close(p.memory.weights * GIB, 2.0 * (trained + frozen), "weights");
    close(p.memory.gradients * GIB, 2.0 * trained, "gradients");
    close(p.memory.optimizer * GIB, 12.0 * trained, "optimizer state");
    close(p.comm.dp, ring(true, 2, 2.0 * trained, LINK), "the all-reduce of the trained gradients");
    let mut l = plain(1, 1, 2, 8);
    l.fsdp = true;
    let p = pr.project(&l).unwrap();
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
