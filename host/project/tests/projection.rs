//! The performance model against published runs, hand-computed cases, and the
//! behaviours a cluster shows: efficiency falls where communication or pipeline bubbles
//! grow, layouts that need more memory than the GPU has are refused, the reduced-depth
//! costing equals the full graph's.

mod common;


use runner_graph::modules::{Module, Modules};
use runner_graph::recompute::RecomputePolicy;
use runner_graph::{Graph, OpKind, Role, TensorKind};
use runner_project::calibrate;
use runner_project::depth;
use runner_graph::peft::{Lora, LoraTargets};
use runner_project::model::{GraphSource, Model, TrainedSource, Training};
use runner_project::precision::{Plan, Recipe, SiteFormats};
use runner_project::profile::{GpuProfile, Profiles};
use runner_project::project::Projector;
use runner_project::published::{self, Resolver};
use runner_project::search::{self, Space, Verdict};
use runner_project::step::{LayoutSpec, Optimizer, PipelineKind, Projection, Schedule};
use runner_project::template::{Dispatcher, Kernels, Measured, Rates, ShardKey, Template};

use common::{layout, projector};

/// The accuracy targets of the projection issue, as a test: every published point is
/// projected or listed as unsupported with its reason, at least the 113 projected today
/// stay projected, and the absolute step-time error is at most 5 % at the median and 15 %
/// at p90 (docs/VALIDATION.md has the table; a change that breaks either target fails
/// here rather than in the page).
#[test]
fn published_runs_are_projected_within_the_accuracy_target() {
    let points = common::calibration();
    let v = published::validate(&points, &Profiles::builtin(), &mut common::Native, &|_| {});
    assert_eq!(v.checked.len() + v.unsupported.len(), points.len(), "no point may be dropped");
    assert!(v.unsupported.iter().all(|u| !u.reason.is_empty()));
    assert!(v.checked.len() >= 113, "only {} points projected", v.checked.len());
    assert!(v.overall.median <= 0.05, "median absolute step-time error {:.2} %", 100.0 * v.overall.median);
    assert!(v.overall.p90 <= 0.15, "p90 absolute step-time error {:.1} %", 100.0 * v.overall.p90);
    // Each point's breakdown is that of the projection it reports (the recompute-to-fit
    // one where the published layout needed it), so its parts add up to the prediction.
    for c in &v.checked {
        let total = c.breakdown.total();
        assert!((total / c.predicted_step_s - 1.0).abs() < 1e-9, "#{}: parts {total} s, step {} s", c.index, c.predicted_step_s);
    }
    // The dense H100 runs, the bulk of the file, are the model's home ground (FP8 at
    // 5.5 % with the shipped tables; the fit over the whole file, the NeMo 24.07 rows
    // included, would take it higher: docs/VALIDATION.md). FP8 counts both scalings:
    // NeMo's delayed-scaling rows and Megatron-Bridge's current-scaling ones.
    let s = &v.groups["H100 / bf16 / llama3"];
    assert!(s.median <= 0.05, "H100 BF16 Llama 3: median {:.1} %", 100.0 * s.median);
    let mut fp8: Vec<f64> = v
        .checked
        .iter()
        .filter(|c| c.gpu == "H100" && c.family == "llama3" && (c.precision == "fp8" || c.precision == "fp8-cs"))
        .map(|c| c.error.abs())
        .collect();
    fp8.sort_by(f64::total_cmp);
    assert!(fp8.len() >= 15, "{} H100 FP8 Llama 3 runs", fp8.len());
    let median = fp8[fp8.len() / 2];
    assert!(median <= 0.055, "H100 FP8 Llama 3: median {:.1} %", 100.0 * median);
}

/// DeepSeek-V3's own run (2,048 H800, DualPipe, 1,543 tokens/s/GPU; never fitted) is
/// projected within 15 % by the efficiencies fitted to Megatron's and NeMo's runs; under
/// Megatron's 1F1B at the same layout its expert all-to-all cannot hide (no virtual
/// pipeline) and the step comes out far slower than DeepSeek measured.
#[test]
fn deepseek_v3_on_h800_is_projected_within_fifteen_percent_with_dualpipe() {
    let points: Vec<_> = common::other_frameworks().into_iter().filter(|p| p.model == "deepseek-v3-671b").collect();
    let v = published::validate(&points, &Profiles::builtin(), &mut common::Native, &|_| {});
    assert_eq!((v.checked.len(), v.unsupported.len()), (1, 0), "{:?}", v.unsupported);
    let c = &v.checked[0];
    assert!(c.error.abs() <= 0.15, "DeepSeek-V3 on H800: {:+.1} %", 100.0 * c.error);
    let megatron: Vec<_> = points.iter().map(|p| published::Point { pipeline_schedule: None, ..p.clone() }).collect();
    let w = published::validate(&megatron, &Profiles::builtin(), &mut common::Native, &|_| {});
    assert!(w.checked[0].error > 0.5, "under 1F1B: {:+.1} %", 100.0 * w.checked[0].error);
}

/// The A100 runs of other stacks (never fitted; the A100 profiles take H100's fitted
/// table, its GEMMs scaled by the two chips' measured best-matmul shares): Megatron-LM's
/// of 2022 and torchtitan's FSDP2 runs each come out within 25 %, at a median under 6 %
/// (9.4 % with H100's GEMM efficiency unscaled); with the priors every one came out
/// optimistic, by a median of over 15 %.
#[test]
fn a100_runs_of_other_stacks_are_projected_within_a_quarter_with_h100s_table() {
    let points: Vec<_> = common::other_frameworks().into_iter().filter(|p| p.gpu == "A100-80GB").collect();
    assert_eq!(points.len(), 10);
    let errors = |profiles: &Profiles| {
        let v = published::validate(&points, profiles, &mut common::Native, &|_| {});
        assert_eq!((v.checked.len(), v.unsupported.len()), (10, 0), "{:?}", v.unsupported);
        let mut e: Vec<f64> = v.checked.iter().map(|c| c.error).collect();
        e.sort_by(f64::total_cmp);
        e
    };
    let taken = errors(&Profiles::builtin());
    assert!(taken.iter().all(|e| e.abs() <= 0.25), "{taken:?}");
    let mut abs: Vec<f64> = taken.iter().map(|e| e.abs()).collect();
    abs.sort_by(f64::total_cmp);
    // Ten runs: the median is the mean of the middle two.
    let median = |v: &[f64]| 0.5 * (v[4] + v[5]);
    assert!(median(&abs) < 0.06, "median {:.1} %", 100.0 * median(&abs));
    let built = Profiles::builtin();
    let (a100, h100) = (built.get("a100").unwrap(), built.get("h100").unwrap());
    assert!(a100.efficiency.gemm.bf16 > h100.efficiency.gemm.bf16, "A100 takes H100's table, its GEMMs scaled up");
    // The priors the profile carried before (what `Profiles::priors` still gives it).
    let e = errors(&Profiles::priors());
    assert!(e.iter().all(|&x| x < 0.0) && median(&e) < -0.15, "priors: {e:?}");
}

/// The AMD runs of other stacks (never fitted; MI300X and MI355X take H100's fitted table,
/// their GEMMs scaled by each chip's best BF16 matmul as a share of its peak against H100's,
/// data/gpus.toml): AMD's MLPerf Training v5.1 Llama 3.1 8B run on 8 MI355X, FP8, comes out
/// within 10 % (+4.6 % when written). The bound is the A100 runs' (other stacks, the same
/// borrowed table) spread, under a fifth, halved for one run of one node with no pipeline:
/// what fails it is a broken profile. Unscaled GEMMs (gemm_from_ratio 1) make the run 10.7 %
/// fast, MI350X's peaks (2,300 and 4,600 TFLOP/s) on MI355X's board 12.9 % slow.
#[test]
fn amd_runs_of_other_stacks_are_projected_within_ten_percent_with_h100s_table_scaled() {
    let points: Vec<_> = common::other_frameworks().into_iter().filter(|p| p.gpu.starts_with("MI")).collect();
    assert_eq!(points.len(), 1);
    let errors = |profiles: &Profiles| {
        let v = published::validate(&points, profiles, &mut common::Native, &|_| {});
        assert_eq!((v.checked.len(), v.unsupported.len()), (points.len(), 0), "{:?}", v.unsupported);
        v.checked.iter().map(|c| c.error).collect::<Vec<f64>>()
    };
    let built = errors(&Profiles::builtin());
    assert!(built.iter().all(|e| e.abs() <= 0.10), "{built:?}");
    let unscaled = Profiles::with_overrides("[[gpu]]\nname = \"mi355x\"\ngemm_from_ratio = 1.0\n", "u.toml").unwrap();
    assert!(errors(&unscaled).iter().all(|e| *e < -0.10), "GEMMs unscaled: {:?}", errors(&unscaled));
    let mi350x_peaks = Profiles::with_overrides("[[gpu]]\nname = \"mi355x\"\n[gpu.peak_tflops]\nbf16 = 2300.0\nfp8 = 4600.0\n", "u.toml").unwrap();
    assert!(errors(&mi350x_peaks).iter().all(|e| *e > 0.10), "MI350X's peaks: {:?}", errors(&mi350x_peaks));
}

/// Llama 3.1 8B on one node of 8 MI300X (BF16, data-parallel, MBS 1, GBS 128): an MFU of
/// 30-45 % (38.1 % when written; H100 53.7 % at the same layout). Below 45 %: a step cannot
/// beat the chip's best BF16 matmul in the public benchmark the ratio comes from (668.4 of
/// 1,307.4 TFLOP/s, 51.1 %), and a step is more than its GEMMs (H100's projection here is
/// 0.67 of its own best-matmul share, 80.3 %). Above 30 %: H100's MFU with only the GEMMs
/// scaled by the ratio (53.7 % x 0.636 = 34 %), less a margin; the rest of the step runs at
/// H100's shares of MI300X's larger peak and faster HBM, which only lifts it. With the
/// GEMMs unscaled (gemm_from_ratio 1) the MFU is 54.8 %, past the chip's best matmul.
#[test]
fn llama31_8b_on_8_mi300x_projects_an_mfu_under_the_chips_best_matmul() {
    let lay = layout(1, 1, 1, 1, 8, 1, 128);
    let mut pr = projector("llama3.1-8b", 8192, "mi300x", Recipe::Bf16);
    let p = pr.project(&lay).unwrap();
    assert!(p.fits, "{}", p.layout.short());
    assert!((0.30..=0.45).contains(&p.mfu), "MI300X MFU {:.1} %", 100.0 * p.mfu);
    let h100 = projector("llama3.1-8b", 8192, "h100", Recipe::Bf16).project(&lay).unwrap();
    let ratio = Profiles::builtin().get("mi300x").unwrap().gemm_from_ratio.unwrap();
    assert!(p.mfu >= h100.mfu * ratio && p.mfu < h100.mfu, "MI300X {:.1} %, H100 {:.1} %", 100.0 * p.mfu, 100.0 * h100.mfu);
}

/// DualPipe runs each forward chunk beside another micro-batch's backward chunk, so the
/// expert all-to-all hides at pp > 1 without a virtual pipeline, where Megatron's combined
/// 1F1B cannot overlap it (Qwen3-30B-A3B, EP16 over two H100 nodes, PP2); so does
/// DualPipeV, the same pairing.
#[test]
fn dualpipe_hides_the_expert_all_to_all_without_a_virtual_pipeline() {
    let mut pr = projector("qwen3-30b-a3b", 4096, "h100", Recipe::Bf16);
    let one = LayoutSpec { ep: 16, ep_overlap: true, ..layout(1, 2, 1, 1, 16, 1, 512) };
    let dual = LayoutSpec { pipeline: PipelineKind::DualPipe, ..one };
    let (a, b) = (pr.project(&one).unwrap(), pr.project(&dual).unwrap());
    assert!(a.breakdown.ep > 0.0);
    assert!(b.breakdown.ep < 0.5 * a.breakdown.ep, "exposed EP: DualPipe {} s, 1F1B {} s", b.breakdown.ep, a.breakdown.ep);
    assert!(b.breakdown.bubble < a.breakdown.bubble);
    let v = pr.project(&LayoutSpec { pipeline: PipelineKind::DualPipeV, ..one }).unwrap();
    assert!(v.breakdown.ep < 0.5 * a.breakdown.ep, "exposed EP: DualPipeV {} s, 1F1B {} s", v.breakdown.ep, a.breakdown.ep);
}

/// The Performance Explorer's reference scenario (DGXC v25.02 table): Llama 3.1 70B,
/// FP8, H100, TP4 PP4 CP2 VP5, GBS = 2 x GPUs, 1T tokens: 115.46 days on 64 GPUs and 3.79
/// on 2048.
#[test]
fn reference_scenario_days_within_ten_percent() {
    let mut pr = projector("llama3.1-70b", 8192, "h100", Recipe::Fp8);
    for (n, published_days) in [(64u32, 115.46), (2048, 3.79)] {
        let p = pr.project(&layout(4, 4, 2, 5, n / 32, 1, 2 * n)).unwrap();
        assert!(p.fits);
        let days = 1e12 / (p.tokens_per_sec_per_gpu * f64::from(n)) / 86_400.0;
        assert!((days / published_days - 1.0).abs() < 0.10, "{n} GPUs: {days:.2} days vs {published_days}");
    }
}

/// One GEMM layer between an embedding and an output head, on a made-up GPU whose
/// kernels run at exactly their peak: the step is 3 x the forward GEMM FLOPs over the
/// peak, and the data-parallel all-reduce (not overlapped) is latency plus the ring's
/// 2(n-1)/n of the BF16 gradients over the link.
#[test]
fn hand_computed_step_and_all_reduce() {
    let (t, c, v) = (1024u64, 512u64, 4096u64);
    let mut gpu: GpuProfile = Profiles::builtin().get("h100").unwrap().clone();
    gpu.peak_tflops.bf16 = 1000.0;
    gpu.hbm_gbs = 1e12; // memory-bound work takes no time
    gpu.scale_up_gbs = 100.0;
    let e = &mut gpu.efficiency;
    e.gemm.bf16 = 1.0;
    e.gemm_half_gflop = 1e-12;
    e.memory = 1.0;
    e.scale_up = 0.5;
    e.scale_up_latency_us = 7.0;
    let mut pr = runner_project::toy::projector(t, c, v, gpu);
    let mut l = layout(1, 1, 1, 1, 2, 1, 8);
    l.dp_overlap = false;
    l.distributed_optimizer = false;
    let p = pr.project(&l).unwrap();
    let m = 4.0; // GBS 8 over mbs 1 x dp 2
    let gemm = 3.0 * (2.0 * (t * c * c) as f64 + 2.0 * (t * c * v) as f64) / 1e15;
    assert!((p.breakdown.compute / (m * gemm) - 1.0).abs() < 1e-6, "{} vs {}", p.breakdown.compute, m * gemm);
    let grad_bytes = 2.0 * (2 * v * c + c * c) as f64;
    let all_reduce = 7e-6 + 2.0 * 0.5 * grad_bytes / (100e9 * 0.5);
    assert!((p.breakdown.dp / all_reduce - 1.0).abs() < 1e-9, "{} vs {all_reduce}", p.breakdown.dp);
    assert!((p.breakdown.total() - p.step_time_s).abs() < 1e-12);
    assert_eq!((p.breakdown.tp, p.breakdown.bubble, p.breakdown.pp), (0.0, 0.0, 0.0));
    let tokens = (8 * t) as f64;
    assert!((p.tokens_per_sec_per_gpu - tokens / p.step_time_s / 2.0).abs() < 1e-9);
}

/// The reduced-depth graph (one layer of each kind, then the head side) costs every
/// layer exactly as the full graph does: DeepSeek's proxy has a dense first layer, MoE
/// layers and an MTP module; gpt-oss's alternates windowed and global attention; a LoRA
/// fine-tune's first layer receives no gradient from the frozen embedding, so it has
/// less backward than the layers after it.
#[test]
fn reduced_depth_costs_as_the_full_graph() {
    for (model, key, training) in [
        ("deepseek-tiny", ShardKey { tp: 2, cp: 1, ep: 2, etp: 1, sp: true, mbs: 2 }, Training::Full),
        ("gpt-oss-tiny", ShardKey { tp: 2, cp: 2, ep: 2, etp: 1, sp: true, mbs: 1 }, Training::Full),
        ("llama3-tiny", ShardKey { tp: 2, cp: 1, ep: 1, etp: 1, sp: true, mbs: 1 }, Training::Lora(Lora { rank: 4, ..Lora::default() })),
    ] {
        let (_, inner) = common::Native.resolve(model, 256).unwrap();
        let mut src = TrainedSource { inner, training };
        let full = src.graph(key.mbs).unwrap();
        let d = depth::analyse(&full);
        assert!(d.prefix < d.len() && d.reps.len() >= 2, "{model}: {} classes in {} layers", d.reps.len(), d.len());
        let reduced = depth::reduce(&full, &d).expect("reducible");
        assert!(reduced.ops.len() < full.ops.len());
        let whole = Template::build(&full, &d.layers, key).unwrap();
        let small = Template::build(&reduced, &d.layers, key).unwrap();
        let plan = Plan::builtin(Recipe::Fp8, &full);
        let rates = Rates::new(Profiles::builtin().get("h100").unwrap());
        let m = Measured::default();
        let time = |t: &Template, part, names: &[String]| t.time_part(part, names, &plan, &rates, &m, Kernels::default());
        for p in 0..d.len() {
            let rep = d.reps[d.class[p]];
            let a = time(&whole, &whole.layers[p], &d.gemm_names[p]);
            let b = time(&small, &small.layers[rep], &d.gemm_names[p]);
            assert_eq!(a, b, "{model} layer {p} (as layer {rep})");
            assert_eq!(whole.layers[p].activations, small.layers[rep].activations);
            assert_eq!(whole.layers[p].kept, small.layers[rep].kept, "{model} layer {p}: kept tensors");
            assert_eq!(
                Template::stored(&whole.layers[p], &d.gemm_names[p], &plan),
                Template::stored(&small.layers[rep], &d.gemm_names[p], &plan)
            );
            let params = |p: &runner_project::template::Part| (p.dense_params + p.expert_params, p.frozen_params);
            assert_eq!(params(&whole.layers[p]), params(&small.layers[rep]));
        }
        if training != Training::Full {
            assert_ne!(d.class[0], d.class[1], "{model}: the first LoRA layer is a class of its own");
            let t0 = time(&whole, &whole.layers[0], &d.gemm_names[0]);
            let t1 = time(&whole, &whole.layers[1], &d.gemm_names[1]);
            assert!(t0.bwd < t1.bwd && t0.fwd == t1.fwd, "{model}: {t0:?} vs {t1:?}");
        }
        assert_eq!(time(&whole, &whole.post, &d.post_gemms), time(&small, &small.post, &d.post_gemms), "{model} head side");
        assert_eq!(whole.post.activations, small.post.activations);
        assert_eq!(whole.pre.dense_params, small.pre.dense_params);
        assert_eq!(whole.stage_message_bytes, small.stage_message_bytes);
    }
}

/// A precision plan names a layer's GEMMs by the layer's own op names: DeepSeek's proxy
/// lists each layer's linear and grouped-linear (routed expert) ops in op order, the ops
/// before the first layer on the embedding side and the ones after the last (head, MTP)
/// on the head side, read off the graph here op by op.
#[test]
fn each_layers_gemm_names_are_its_linear_and_expert_ops() {
    let (_, mut src) = common::Native.resolve("deepseek-tiny", 256).unwrap();
    let g = src.graph(1).unwrap();
    let d = depth::analyse(&g);
    let gemm = |k: OpKind| matches!(k, OpKind::Linear | OpKind::GroupedLinear);
    let mut grouped = 0;
    for (p, &l) in d.layers.iter().enumerate() {
        let want: Vec<String> = g.ops.iter().filter(|o| o.layer == l && gemm(o.kind)).map(|o| o.name.clone()).collect();
        grouped += g.ops.iter().filter(|o| o.layer == l && o.kind == OpKind::GroupedLinear).count();
        assert_eq!(d.gemm_names[p], want, "layer {l}");
    }
    assert!(grouped > 0, "the proxy routes experts");
    let first = g.ops.iter().position(|o| o.layer >= 0).unwrap();
    let last = g.ops.iter().rposition(|o| d.layers.contains(&o.layer)).unwrap();
    let side = |ops: &[runner_graph::Op]| -> Vec<String> { ops.iter().filter(|o| gemm(o.kind)).map(|o| o.name.clone()).collect() };
    assert_eq!(d.pre_gemms, side(&g.ops[..first]));
    assert_eq!(d.post_gemms, side(&g.ops[last + 1..]));
    assert!(!d.post_gemms.is_empty());
}

/// validate keeps every point: each one it cannot take is listed with its own reason, in
/// file order, and each one it projects carries its error, its published throughput per
/// GPU (tokens of a step over the step and the GPUs, by hand), its family (a LoRA
/// fine-tune grouped apart, on a projector of its own) and the notes its FSDP figure
/// calls for. Llama 3 tiny on 8 H100s at sequence 256, 16 sequences a step, 10 ms.
#[test]
fn validate_keeps_every_point_and_says_why() {
    let (family, _) = common::Native.resolve("llama3-tiny", 256).unwrap();
    let base = published::Point {
        source: "s".into(),
        model: "llama3-tiny".into(),
        gpu: "H100".into(),
        num_gpus: Some(8),
        precision: "BF16".into(),
        workload: "pretrain".into(),
        seq_len: Some(256),
        gbs: Some(16),
        tp: Some(1),
        step_time_s: Some(0.01),
        ..Default::default()
    };
    let layout = "Et*3|t*2L";
    let with = |f: &dyn Fn(&mut published::Point)| {
        let mut p = base.clone();
        f(&mut p);
        p
    };
    let points = vec![
        base.clone(),
        with(&|p| p.workload = "finetune_lora".into()),
        with(&|p| p.lora_target_modules = Some(vec!["linear_qkv".into()])),
        with(&|p| p.workload = "inference".into()),
        with(&|p| p.step_time_s = None),
        with(&|p| (p.gpu, p.precision) = ("A100-80GB".into(), "FP8".into())),
        with(&|p| (p.pp, p.pipeline_layout) = (Some(2), Some(layout.into()))),
        with(&|p| (p.tp, p.fsdp) = (None, Some(1))),
        with(&|p| (p.tp, p.fsdp) = (None, Some(4))),
        with(&|p| (p.tp, p.fsdp) = (None, Some(8))),
        with(&|p| (p.tp, p.fsdp, p.num_gpus) = (None, Some(1), Some(1))),
        with(&|p| p.workload = "finetune_sft".into()),
        with(&|p| (p.gpu, p.precision) = ("B200".into(), "NVFP4".into())),
        with(&|p| (p.gpu, p.precision, p.num_layers_at_end_in_bf16) = ("B200".into(), "NVFP4".into(), Some(0))),
        with(&|p| (p.pp, p.vp) = (Some(4), Some(2))),
        with(&|p| p.workload = "inference".into()),
    ];
    let v = published::validate(&points, &Profiles::builtin(), &mut common::Native, &|_| {});
    let unsupported: Vec<(usize, &str)> = v.unsupported.iter().map(|u| (u.index, u.reason.as_str())).collect();
    let split = runner_graph::pipeline::PipelineSplit::from_megatron_layout(layout).unwrap().check(4, 2).unwrap_err();
    assert_eq!(unsupported.iter().map(|u| u.0).collect::<Vec<_>>(), [2, 3, 4, 5, 6, 14, 15], "{unsupported:?}");
    for ((_, reason), want) in unsupported.iter().zip([
        "lora_target_modules is set on a run that is not a LoRA fine-tune",
        "workload 'inference' is not a training step",
        "the source gives neither a step time nor a throughput",
        "A100-80GB has no fp8 tensor-core path",
        split.as_str(),
        "the layout does not fit the model: ",
        "workload 'inference' is not a training step",
    ]) {
        assert!(reason.starts_with(want), "'{reason}' does not start '{want}'");
    }
    let at = |i: usize| v.checked.iter().find(|c| c.index == i).unwrap_or_else(|| panic!("point {i} not projected"));
    assert_eq!(v.checked.iter().map(|c| c.index).collect::<Vec<_>>(), [0, 1, 7, 8, 9, 10, 11, 12, 13]);
    for c in &v.checked {
        let gpus = if c.index == 10 { 1.0 } else { 8.0 };
        assert_eq!(c.published_step_s, 0.01);
        assert!((c.error - (c.predicted_step_s / 0.01 - 1.0)).abs() < 1e-12, "{}", c.index);
        assert!((c.published_tokens_per_sec_per_gpu - 256.0 * 16.0 / 0.01 / gpus).abs() < 1e-6, "{}", c.index);
    }
    assert_eq!(at(0).family, family);
    assert_eq!(at(11).family, family);
    assert_eq!(at(1).family, format!("{family} LoRA"));
    assert_eq!(at(1).note, "LoRA fine-tune, rank 32 on the attention and MLP linears");
    // The fine-tune's graph is its own (adapters, frozen weights), so its step is not the
    // pre-training step of the same layout, which SFT (full training) matches.
    assert_ne!(at(1).predicted_step_s, at(0).predicted_step_s);
    assert_eq!(at(11).predicted_step_s, at(0).predicted_step_s);
    // NVFP4 keeps the last four layers (all of the tiny model's) in BF16 unless the run
    // says otherwise: a run with none at the end is projected under its own plan.
    assert_ne!(at(12).predicted_step_s, at(13).predicted_step_s);
    assert_eq!(at(7).note, "fsdp = 1 read as the table's FSDP flag: full sharding over 8 ranks");
    assert_eq!(at(8).note, "FSDP group 4 of 8 data-parallel ranks modelled as full sharding");
    assert_eq!((at(9).note.as_str(), at(10).note.as_str(), at(0).note.as_str()), ("", "", ""));
    let groups: Vec<(&str, usize)> = v.groups.iter().map(|(k, s)| (k.as_str(), s.points)).collect();
    let (full, lora) = (format!("H100 / bf16 / {family}"), format!("H100 / bf16 / {family} LoRA"));
    let nvfp4 = format!("B200 / nvfp4 / {family}");
    assert_eq!(groups, [(nvfp4.as_str(), 2), (full.as_str(), 6), (lora.as_str(), 1)]);
    assert_eq!(v.overall.points, 9);
}

/// A published run that does not fit is projected with the recompute a framework user
/// would have turned on, and says so; one that nothing makes fit is projected as
/// published and says it does not fit. Llama 3 tiny at sequence 2048, 8 sequences per
/// micro-batch on one GPU, whose memory (reserve included) is set between the
/// run's need with full recompute and without, then below both.
#[test]
fn validate_recomputes_to_fit_where_that_fits_and_says_so() {
    let mut pr = projector("llama3-tiny", 2048, "H100", Recipe::Bf16);
    let plain = layout(1, 1, 1, 1, 1, 8, 8);
    let none = pr.project(&plain).unwrap();
    let full = pr.project(&LayoutSpec { recompute: RecomputePolicy::Full, ..plain }).unwrap();
    assert!(full.memory.total < none.memory.total);
    let point = published::Point {
        source: "s".into(),
        model: "llama3-tiny".into(),
        gpu: "H100".into(),
        num_gpus: Some(1),
        precision: "BF16".into(),
        seq_len: Some(2048),
        gbs: Some(8),
        mbs: Some(8),
        tp: Some(1),
        step_time_s: Some(0.1),
        ..Default::default()
    };
    let run = |gib: f64| {
        let mut profiles = Profiles::builtin();
        let h100 = profiles.gpus.iter_mut().find(|g| g.name == "H100").unwrap();
        h100.memory_gib = gib;
        let v = published::validate(std::slice::from_ref(&point), &profiles, &mut common::Native, &|_| {});
        assert!(v.unsupported.is_empty(), "{:?}", v.unsupported);
        v.checked[0].clone()
    };
    let fitted = run(0.5 * (full.memory.total + none.memory.total));
    assert!(fitted.fits);
    assert!(fitted.predicted_step_s > none.step_time_s, "recompute costs time");
    assert!(fitted.note.starts_with("selective recompute of ") && fitted.note.ends_with(" to fit in memory"), "{}", fitted.note);
    // Just above what full recompute of every layer needs, only that fits.
    let tight = run(full.memory.total + 1e-3 * (none.memory.total - full.memory.total));
    assert_eq!((tight.fits, tight.note.as_str()), (true, "full recompute to fit in memory"));
    // Memory totals count the reserve; half of what full recompute needs beside it.
    let short = run(none.memory.reserved + 0.5 * (full.memory.total - none.memory.reserved));
    assert!(!short.fits);
    assert_eq!(short.predicted_step_s, none.step_time_s);
    assert!(short.note.starts_with("does not fit: needs "), "{}", short.note);
}

/// A template's parts hold their own GEMMs: DeepSeek's proxy sharded at tp 2, ep 2 has
/// a part per main layer with that layer's GEMMs, and its MTP module's GEMMs with the
/// head's on the head side (the depth analysis names each side's GEMMs op by op).
#[test]
fn template_parts_hold_their_sides_gemms() {
    let (_, mut src) = common::Native.resolve("deepseek-tiny", 256).unwrap();
    let g = src.graph(1).unwrap();
    let d = depth::analyse(&g);
    assert!(g.ops.iter().any(|o| o.layer >= 0 && !d.layers.contains(&o.layer)), "the proxy has an MTP module");
    let t = Template::build(&g, &d.layers, ShardKey { tp: 2, cp: 1, ep: 2, etp: 1, sp: true, mbs: 1 }).unwrap();
    let names = |p: &runner_project::template::Part| p.gemms.iter().map(|x| x.name.clone()).collect::<Vec<_>>();
    assert_eq!(t.layers.len(), d.len());
    for p in 0..d.len() {
        assert_eq!(names(&t.layers[p]), d.gemm_names[p], "layer {p}");
    }
    assert_eq!(names(&t.pre), d.pre_gemms);
    assert_eq!(names(&t.post), d.post_gemms);
    // Unsharded, each trained GEMM's Newton-Schulz FLOPs come off its weight's shape by
    // hand: 5 steps of 4·m²·n + 2·m³ on the short side m, once per routed expert.
    let t = Template::build(&g, &d.layers, ShardKey { tp: 1, cp: 1, ep: 1, etp: 1, sp: false, mbs: 1 }).unwrap();
    let mut experts = 0;
    for part in t.layers.iter().chain([&t.pre, &t.post]) {
        for x in &part.gemms {
            let op = g.ops.iter().find(|o| o.name == x.name).unwrap();
            let shape = &g.tensors[op.inputs[1]].shape;
            let (count, a, b) = match shape[..] {
                [e, a, b] => (e as f64, a as f64, b as f64),
                [a, b] => (1.0, a as f64, b as f64),
                _ => panic!("{shape:?}"),
            };
            experts += usize::from(shape.len() == 3 && count > 1.0);
            let (m, n) = (a.min(b), a.max(b));
            assert_eq!(x.ns_flops, count * 5.0 * (4.0 * m * m * n + 2.0 * m * m * m), "{}", x.name);
        }
    }
    assert!(experts > 0);
    // A kept tensor is listed with a part's GEMM only as that GEMM's input (what its
    // weight gradient reads), never as its weight or its expert indices.
    let mut by_gemm = 0;
    for part in t.layers.iter().chain([&t.post]) {
        for k in &part.kept {
            for &j in &k.gemms {
                assert_eq!(k.elements, part.gemms[j].x, "{}", part.gemms[j].name);
                by_gemm += 1;
            }
        }
    }
    assert!(by_gemm > 0);
}

/// Under LoRA the embedding is frozen, so the first layer's GEMMs that read the
/// embedding's stream (through the norm) have no input gradient to compute; from the
/// second layer on every GEMM's input carries one (the first layer's adapters are
/// trained). Every frozen base weight has no weight gradient; every adapter has one.
#[test]
fn lora_gemms_run_the_backward_their_inputs_and_weights_need() {
    let (_, inner) = common::Native.resolve("llama3-tiny", 256).unwrap();
    let mut src = TrainedSource { inner, training: Training::Lora(Lora::default()) };
    let g = src.graph(1).unwrap();
    let d = depth::analyse(&g);
    let t = Template::build(&g, &d.layers, ShardKey { tp: 1, cp: 1, ep: 1, etp: 1, sp: false, mbs: 1 }).unwrap();
    let frozen = |name: &str| {
        let op = g.ops.iter().find(|o| o.name == name).unwrap();
        g.tensors[op.inputs[1]].kind == TensorKind::Frozen
    };
    assert!(t.layers[0].gemms.iter().any(|x| !x.dgrad), "{:?}", t.layers[0].gemms.iter().map(|x| (&x.name, x.dgrad)).collect::<Vec<_>>());
    for p in 1..d.len() {
        assert!(t.layers[p].gemms.iter().all(|x| x.dgrad), "layer {p}");
    }
    for p in 0..d.len() {
        for x in &t.layers[p].gemms {
            assert_eq!(x.wgrad, !frozen(&x.name), "{}", x.name);
        }
    }
    // Nor do the embedding and the first norm run a backward; every memory-bound op of
    // the second layer does. At tp 2 with SP, the first layer's gather of the normed
    // stream has no backward either, where the second layer's has.
    assert!(t.pre.vector.iter().all(|v| !v.backward));
    assert!(t.layers[0].vector.iter().any(|v| !v.backward));
    assert!(t.layers[1].vector.iter().all(|v| v.backward));
    let t = Template::build(&g, &d.layers, ShardKey { tp: 2, cp: 1, ep: 1, etp: 1, sp: true, mbs: 1 }).unwrap();
    let back = |p: usize| t.layers[p].comm.iter().map(|c| c.backward.is_some()).collect::<Vec<_>>();
    assert_eq!(back(0).len(), back(1).len());
    assert!(back(1).iter().all(|&b| b));
    assert!(back(0).iter().any(|&b| !b), "{:?}", back(0));
}

fn share(p: &Projection, part: f64) -> f64 {
    part / p.step_time_s
}

/// Efficiency falls where the model says it must: at a fixed global batch more GPUs mean
/// fewer micro-batches per pipeline and a larger bubble share; a data-parallel all-reduce
/// that is not overlapped costs more once the group leaves the NVLink domain.
#[test]
fn efficiency_falls_where_bubbles_or_communication_grow() {
    let mut pr = projector("llama3.1-70b", 8192, "h100", Recipe::Fp8);
    let mut last: Option<Projection> = None;
    for n in [128u32, 256, 512, 1024] {
        let p = pr.project(&layout(4, 8, 1, 5, n / 32, 1, 256)).unwrap();
        if let Some(prev) = &last {
            assert!(p.tokens_per_sec_per_gpu < prev.tokens_per_sec_per_gpu, "{n} GPUs");
            assert!(share(&p, p.breakdown.bubble) > share(prev, prev.breakdown.bubble), "{n} GPUs: bubble share");
        }
        last = Some(p);
    }
    let mut pr = projector("llama3.1-8b", 8192, "h100", Recipe::Bf16);
    let at = |pr: &mut Projector, dp: u32| {
        let mut l = layout(1, 1, 1, 1, dp, 1, 16 * dp);
        l.dp_overlap = false;
        pr.project(&l).unwrap()
    };
    let (inside, across) = (at(&mut pr, 8), at(&mut pr, 16));
    // Over two nodes the ring runs on 8 rails of 50 GB/s at the fitted scale_out (0.83:
    // 333 GB/s) instead of NVLink's 450 GB/s at 0.75 (338 GB/s), with 30/16 against
    // 14/8 of the buffer on the wire: 1.09x the time at that share.
    let h100 = Profiles::builtin().get("h100").unwrap().clone();
    let e = &h100.efficiency;
    assert!(e.scale_out > 0.55, "the ring's NIC share is not the all-to-all's: {}", e.scale_out);
    let want = (30.0 / 16.0) / (14.0 / 8.0) * (450.0 * e.scale_up) / (400.0 * e.scale_out);
    let got = across.breakdown.dp / inside.breakdown.dp;
    // Within 1 %: NVLink pricing of the two-node ring would give 30/16 / (14/8) = 1.07.
    assert!(want > 1.05 && (got / want - 1.0).abs() < 0.01, "{got} vs {want}");
    assert!(across.tokens_per_sec_per_gpu < inside.tokens_per_sec_per_gpu);
    // Overlapped, most of it hides behind the backward.
    let mut l = layout(1, 1, 1, 1, 16, 1, 256);
    l.dp_overlap = true;
    assert!(pr.project(&l).unwrap().breakdown.dp < 0.5 * across.breakdown.dp);
}

/// Llama 3.1 405B cannot train on one 8-GPU H100 node: every layout is refused for
/// memory, and a forced layout reports that it does not fit.
#[test]
fn layouts_needing_more_memory_than_the_gpu_are_refused() {
    let mut pr = projector("llama3.1-405b", 8192, "h100", Recipe::Bf16);
    let f = search::search(&mut pr, 8, 16, &Space::default(), 5);
    assert!(f.best.is_empty(), "405B fits on 8 H100? {:?}", f.best.first().map(|p| p.layout.short()));
    assert!(f.families.iter().any(|fam| matches!(fam.verdict, Verdict::Memory { .. })));
    assert!(f.families.iter().all(|fam| matches!(fam.verdict, Verdict::Memory { .. } | Verdict::Divisibility { .. })));
    // A family that does not fit reports the least memory its layouts need (what the
    // explorer's "nothing fits" names): no more than TP8 at one micro-batch with every
    // layer recomputed, one of them.
    let least = pr.project(&LayoutSpec { recompute: RecomputePolicy::Full, ..layout(8, 1, 1, 1, 1, 1, 16) }).unwrap();
    match &f.families.iter().find(|fam| fam.name == "TP").expect("a TP family").verdict {
        Verdict::Memory { need_gib, .. } => assert!(*need_gib <= least.memory.total * (1.0 + 1e-9), "{need_gib} GiB, more than {} for {}", least.memory.total, least.layout.short()),
        v => panic!("{v:?}"),
    }
    let p = pr.project(&layout(8, 1, 1, 1, 1, 1, 16)).unwrap();
    assert!(!p.fits && p.memory.total > p.memory.capacity, "{:?}", p.memory);
    // 16 nodes are enough.
    let f = search::search(&mut pr, 128, 256, &Space::default(), 1);
    assert!(f.best.first().is_some_and(|p| p.fits));
}

/// No layout of an MoE model reaches a model-FLOP rate above what the GPU's GEMMs reach
/// at best. Expert tensor parallelism under sequence parallelism once did 1/etp of the
/// experts' work and came out at 98 % MFU (Mixtral) and 129 % (Grok-1); now its rows are
/// gathered over etp = tp, so the experts' GEMM seconds equal those of etp = 1 (the same
/// work, split by width instead of by rows) and only the communication and the expert
/// weights' memory differ. An etp group inside the tp group is refused.
#[test]
fn moe_layouts_never_beat_the_gpus_gemm_rate() {
    let bf16 = Profiles::builtin().get("h100").unwrap().efficiency.gemm.bf16;
    for model in ["mixtral-8x7b", "qwen3-30b-a3b"] {
        let mut pr = projector(model, 4096, "h100", Recipe::Bf16);
        let f = search::search(&mut pr, 64, 512, &Space::default(), 5);
        assert!(!f.best.is_empty(), "{model}");
        for p in &f.best {
            assert!(p.mfu < bf16, "{model} {}: MFU {:.3} above the GEMM efficiency {bf16:.3}", p.layout.short(), p.mfu);
        }
        let one = pr.project(&LayoutSpec { ep: 8, ..layout(8, 1, 1, 1, 8, 1, 512) }).unwrap();
        let etp = pr.project(&LayoutSpec { ep: 8, etp: 8, ..layout(8, 1, 1, 1, 8, 1, 512) }).unwrap();
        assert!(etp.mfu < bf16, "{model} {}: MFU {:.3}", etp.layout.short(), etp.mfu);
        let (g1, g8) = (one.breakdown.compute_parts.gemm, etp.breakdown.compute_parts.gemm);
        assert!((g8 / g1 - 1.0).abs() < 0.02, "{model}: expert GEMMs {g8} s at etp 8, {g1} s at etp 1");
        assert!(etp.comm.ep > one.comm.ep, "{model}: the etp gather and reduce-scatter move rows");
        assert!(etp.memory.weights < one.memory.weights, "{model}: each rank holds 1/8 of its experts' width");
        // An etp group inside the tp group: the same expert GEMM seconds.
        let inside = pr.project(&LayoutSpec { ep: 8, etp: 2, ..layout(8, 1, 1, 1, 8, 1, 512) }).unwrap();
        let g2 = inside.breakdown.compute_parts.gemm;
        assert!((g2 / g1 - 1.0).abs() < 0.02, "{model}: expert GEMMs {g2} s at etp 2, {g1} s at etp 1");
        let across = LayoutSpec { ep: 4, etp: 16, ..layout(8, 1, 1, 1, 8, 1, 512) };
        let err = pr.project(&across).unwrap_err();
        assert!(err.contains("etp=16 does not divide tp=8"), "{model}: {err}");
    }
}

/// The search returns distinct layouts that fit, fastest first, each consistent with
/// the GPU count, and explains every other family.
#[test]
fn search_ranks_fitting_layouts_and_explains_the_rest() {
    let mut pr = projector("gpt3-175b", 2048, "h100", Recipe::Bf16);
    let f = search::search(&mut pr, 1024, 2048, &Space::default(), 8);
    assert!(f.evaluated > 1000, "{} layouts", f.evaluated);
    assert!(!f.best.is_empty());
    for w in f.best.windows(2) {
        assert!(w[0].step_time_s <= w[1].step_time_s);
        assert_ne!(w[0].layout, w[1].layout);
    }
    for p in &f.best {
        assert!(p.fits);
        assert_eq!(p.layout.gpus(), 1024);
    }
    // The winner is what projecting its layout on its own gives, and no layout of the
    // kinds Megatron's GPT-3 recipes use, projected by hand, beats it.
    let again = pr.project(&f.best[0].layout).unwrap();
    assert!((again.step_time_s / f.best[0].step_time_s - 1.0).abs() < 1e-12, "{} vs {}", again.step_time_s, f.best[0].step_time_s);
    let mut tried = 0;
    for (tp, pp, vp) in [(8, 8, 1), (8, 8, 2), (8, 16, 1), (4, 16, 1), (4, 8, 3), (8, 4, 1), (2, 16, 1)] {
        let dp = 1024 / (tp * pp);
        if let Ok(p) = pr.project(&layout(tp, pp, 1, vp, dp, 1, 2048))
            && p.fits
        {
            tried += 1;
            assert!(p.step_time_s >= f.best[0].step_time_s, "{} at {} s beats the search's {}", p.layout.short(), p.step_time_s, f.best[0].layout.short());
        }
    }
    assert!(tried >= 3, "only {tried} hand layouts fit");
    assert_eq!(f.families.iter().filter(|fam| matches!(fam.verdict, Verdict::Best { .. })).count(), 1);
    // Fewer asked for are the fastest of the same ranking (the search keeps the top as it
    // goes rather than sorting everything at the end).
    let f3 = search::search(&mut pr, 1024, 2048, &Space::default(), 3);
    assert_eq!(f3.best.as_slice(), &f.best[..3.min(f.best.len())]);
    assert_eq!(f3.evaluated, f.evaluated);
    // Pure data parallelism cannot hold 175B parameters' optimizer state on 80 GB.
    let dp = f.families.iter().find(|fam| fam.name == "DP").expect("a DP family");
    assert!(matches!(dp.verdict, Verdict::Memory { .. }), "{:?}", dp.verdict);
    // Fixing a degree restricts the search to it.
    let f = search::search(&mut pr, 1024, 2048, &Space { tp: Some(8), ..Space::default() }, 3);
    assert!(f.best.iter().all(|p| p.layout.tp == 8));
}

/// TP stays inside one NVLink domain: GPT-3's 96 heads divide by 16 and 32, but on
/// 8-GPU H100 nodes no layout the search returns spreads TP across nodes; a TP of the
/// whole domain (8, as Megatron's GPT-3 175B recipes run it) is inside and searched.
#[test]
fn the_search_keeps_tp_inside_the_nvlink_domain() {
    let mut pr = projector("gpt3-175b", 2048, "h100", Recipe::Bf16);
    let f = search::search(&mut pr, 64, 128, &Space::default(), 2000);
    let tps: std::collections::BTreeSet<u32> = f.best.iter().map(|p| p.layout.tp).collect();
    assert!(tps.len() > 1 && tps.iter().all(|&t| t <= 8), "{tps:?}");
    assert!(tps.contains(&8), "{tps:?}");
}

/// Megatron-Core's attention divides its query groups (kv heads) by tp, so the search
/// offers no tp past them: Qwen3-30B-A3B's 4 kv heads allow tp 1, 2 and 4 of the 8 an
/// H100 node holds. A tp of 8 asked for on the command line is priced (the executor
/// replicates the kv heads).
#[test]
fn the_search_keeps_tp_within_the_kv_heads() {
    let mut pr = projector("qwen3-30b-a3b", 4096, "h100", Recipe::Bf16);
    assert!(pr.model.shape.heads.iter().all(|&(h, kv)| (h, kv) == (32, 4)), "{:?}", pr.model.shape.heads);
    let f = search::search(&mut pr, 64, 256, &Space::default(), 2000);
    let tps: std::collections::BTreeSet<u32> = f.best.iter().map(|p| p.layout.tp).collect();
    assert!(tps.len() > 1 && tps.iter().all(|&t| t <= 4), "{tps:?}");
    assert!(f.not_tried.iter().any(|w| w.starts_with("tp 8 not tried") && w.contains("4 kv heads")), "{:?}", f.not_tried);
    let asked = search::search(&mut pr, 64, 256, &Space { tp: Some(8), ..Space::default() }, 3);
    assert!(!asked.best.is_empty() && asked.best.iter().all(|p| p.layout.tp == 8));
    assert!(asked.not_tried.is_empty(), "{:?}", asked.not_tried);
}

/// What the search recommends runs as NeMo and Megatron-Bridge configure it: a pipelined
/// layout splits its layers as Megatron-Core's flags build them (the layers, with the
/// embedding and the loss counted or not, dividing by pp and each stage's share by vp)
/// and needs no layout string, or, at a pp and vp no flags build, takes the first split a
/// `pipeline_model_parallel_layout` builds with the same units in every chunk and names
/// that string (Megatron-Bridge's DeepSeek-V3 presets); a pipeline fixed on the command
/// line that neither builds is priced as asked, with the layout string it needs.
#[test]
fn the_search_recommends_pipeline_splits_megatron_builds() {
    use runner_graph::pipeline::PipelineSplit;
    for (model, seq, layers) in [("llama3.1-70b", 8192, 80u32), ("llama3.1-405b", 8192, 126), ("gpt3-175b", 2048, 96)] {
        let mut pr = projector(model, seq, "h100", Recipe::Bf16);
        assert_eq!(pr.model.shape.layers, layers);
        for pp in [2u32, 4, 8] {
            let f = search::search(&mut pr, 512, 512, &Space { pp: Some(pp), ..Space::default() }, 40);
            assert!(!f.best.is_empty(), "{model} pp={pp}");
            for p in &f.best {
                let l = &p.layout;
                let (n, vp) = (layers as usize, l.vp as usize);
                if l.split.megatron_flags(n, pp as usize, vp).is_ok() {
                    assert_eq!(p.pipeline_model_parallel_layout, None, "{model}: {}", l.short());
                } else {
                    assert!(PipelineSplit::megatron_choices(n, pp as usize, vp).is_empty(), "{model}: {}", l.short());
                    assert_eq!(PipelineSplit::layout_choices(n, pp as usize, vp).first(), Some(&l.split), "{model}: {}", l.short());
                    let text = p.pipeline_model_parallel_layout.as_deref().unwrap_or_else(|| panic!("{model}: {} names no layout", l.short()));
                    let back = PipelineSplit::from_megatron_layout(text).unwrap();
                    assert_eq!((back.split, back.chunks, back.layers), (l.split, pp as usize * vp, n), "{model}: {text}");
                }
            }
        }
    }
    // 80 layers on PP2 VP12: no flags build it; searched with vp free it is refused with
    // Megatron's reason, fixed on the command line it is priced with its layout string.
    let mut pr = projector("llama3.1-70b", 8192, "h100", Recipe::Bf16);
    let free = search::search(&mut pr, 64, 128, &Space { tp: Some(4), vp: Some(12), ..Space::default() }, 3);
    assert!(free.best.iter().all(|p| p.layout.pp != 2), "{:?}", free.best.iter().map(|p| p.layout.short()).collect::<Vec<_>>());
    let why = free.families.iter().find_map(|f| match &f.verdict {
        Verdict::Divisibility { reason, .. } if reason.contains("pp=2 vp=12") => Some(reason.clone()),
        _ => None,
    });
    assert!(why.as_deref().is_some_and(|w| w.contains("40 layers")), "{:?}", free.families);
    let fixed = search::search(&mut pr, 64, 128, &Space { tp: Some(4), pp: Some(2), vp: Some(12), ..Space::default() }, 1);
    let p = fixed.best.first().expect("PP2 VP12 priced when asked for");
    assert_eq!(p.layout.split, PipelineSplit::default());
    let text = p.pipeline_model_parallel_layout.as_deref().expect("a layout string");
    let back = PipelineSplit::from_megatron_layout(text).unwrap();
    assert_eq!((back.chunks, back.layers), (24, 80), "{text}");
}

/// A full-recompute layer count fixed by the caller is what every layout the search
/// returns runs (it was dropped: `--recompute full --recompute-layers 5` came back as
/// full recompute of every layer), and a pipeline whose chunks hold fewer layers than
/// that is refused by name rather than clamped.
#[test]
fn the_search_keeps_a_fixed_full_recompute_layer_count() {
    let mut pr = projector("llama3.1-70b", 8192, "h100", Recipe::Bf16);
    let space = Space { recompute: Some(RecomputePolicy::Full), recompute_layers: Some(5), ..Space::default() };
    let f = search::search(&mut pr, 64, 128, &space, 5);
    assert!(!f.best.is_empty());
    for p in &f.best {
        assert_eq!((p.layout.recompute, p.layout.recompute_layers), (RecomputePolicy::Full, 5), "{}", p.layout.short());
    }
    // PP8 VP10 leaves one layer per chunk: five per chunk cannot be recomputed there.
    let deep = Space { pp: Some(8), vp: Some(10), ..space };
    let f = search::search(&mut pr, 64, 128, &deep, 1);
    assert!(f.best.is_empty(), "{:?}", f.best.iter().map(|p| p.layout.short()).collect::<Vec<_>>());
    assert!(
        f.families.iter().any(|fam| matches!(&fam.verdict, Verdict::Divisibility { reason, .. } if reason.contains("full recompute of 5 layers per chunk"))),
        "{:?}",
        f.families
    );
}

/// FP8's gain comes from the plan: a plan with no FP8 GEMM is exactly as fast as BF16; the
/// FP8 plan is faster by less than the 2x of the peaks (attention, norms and casts stay);
/// NVFP4 on a Hopper is refused.
#[test]
fn fp8_gain_follows_the_plan() {
    let mut bf16 = projector("llama3.1-70b", 8192, "h100", Recipe::Bf16);
    let mut fp8 = projector("llama3.1-70b", 8192, "h100", Recipe::Fp8);
    let l = layout(4, 4, 2, 5, 2, 1, 128);
    let (a, b) = (bf16.project(&l).unwrap(), fp8.project(&l).unwrap());
    let speedup = a.step_time_s / b.step_time_s;
    assert!(speedup > 1.15 && speedup < 1.9, "FP8 speedup {speedup:.2}");
    // An FP8 recipe whose plan keeps every GEMM in BF16 (all sites answered BF16).
    let g = fp8.model.graph.clone();
    let none = Plan::from_sites(Recipe::Fp8, "test", &g, std::iter::empty());
    let mut flat = projector("llama3.1-70b", 8192, "h100", Recipe::Bf16);
    flat.plan = none;
    let c = flat.project(&l).unwrap();
    assert!((c.step_time_s / a.step_time_s - 1.0).abs() < 1e-12, "{} vs {}", c.step_time_s, a.step_time_s);
    let mut nv = projector("llama3.1-70b", 8192, "h100", Recipe::Nvfp4);
    assert!(nv.project(&l).unwrap_err().contains("no nvfp4"));
}

/// The fitter does its job: refitting the H100 from the priors on the published H100
/// runs lowers the error, and the parameters stay physical.
#[test]
fn calibration_fits_better_than_its_priors() {
    let points = common::calibration();
    let fits = calibrate::calibrate(&points, &Profiles::priors(), &mut common::Native, Some(("h100", None)), "test", &|_| {})
        .unwrap();
    let f = &fits[0];
    assert_eq!(f.gpu, "H100");
    assert!(f.after.median < 0.5 * f.before.median, "{:?} -> {:?}", f.before, f.after);
    for (name, _, v) in &f.params {
        // The fitted scan sits at 2-6 % of the BF16 peak (docs/VALIDATION.md, item 11);
        // the straggler spread, a share of a step, between 0.1 and 10 %; every other
        // efficiency well above a fifth.
        let (floor, cap) = match name.as_str() {
            "ssm" => (0.01, 1.0),
            "straggler" => (0.001, 0.1),
            _ => (0.2, 1.0),
        };
        if name != "gemm_half_gflop" {
            assert!(*v > floor && *v <= cap, "{name} = {v}");
        }
    }
    // The weak-scaling series ask for about twice the prior's spread (1 %).
    let spread = f.params.iter().find(|p| p.0 == "straggler").unwrap_or_else(|| panic!("the H100 runs repeat layouts at 8-2048 GPUs: {:?}", f.params));
    assert!(spread.2 > 0.015, "{spread:?}");
}

/// Per-op times measured on the target device replace the roofline op by op.
#[test]
fn measured_op_times_replace_the_roofline() {
    let (_, mut src) = common::Native.resolve("llama3-tiny", 256).unwrap();
    let g = src.graph(1).unwrap();
    let d = depth::analyse(&g);
    let key = ShardKey { tp: 1, cp: 1, ep: 1, etp: 1, sp: false, mbs: 1 };
    let t = Template::build(&depth::reduce(&g, &d).unwrap_or(g.clone()), &d.layers, key).unwrap();
    let plan = Plan::builtin(Recipe::Bf16, &g);
    let rates = Rates::new(Profiles::builtin().get("h100").unwrap());
    let part = &t.layers[0];
    let roofline = t.time_part(part, &d.gemm_names[0], &plan, &rates, &Measured::default(), Kernels::default());
    let gemm = &part.gemms[0].name;
    let mut m = Measured::default();
    m.ops.insert(gemm.clone(), (1.0, 2.0));
    let measured = t.time_part(part, &d.gemm_names[0], &plan, &rates, &m, Kernels::default());
    let one = t.time_part(&runner_project::template::Part { gemms: vec![part.gemms[0].clone()], ..Default::default() }, &d.gemm_names[0][..1], &plan, &rates, &Measured::default(), Kernels::default());
    assert!((measured.fwd - (roofline.fwd - one.fwd + 1.0)).abs() < 1e-12);
    assert!((measured.bwd - (roofline.bwd - one.bwd + 2.0)).abs() < 1e-12);
}

/// Selective recompute frees exactly the activations of the modules it names (Megatron's
/// `recompute_modules`), counted by hand: a Llama layer's two norm outputs (layernorm)
/// and its MLP's gate, up and SwiGLU outputs (mlp); a DeepSeek MoE layer's expert
/// SwiGLU output (moe_act), MLA's q, k, v (mla_up_proj) and the shared expert's three
/// tensors (shared_experts). In a projected step the memory falls by those bytes in
/// every layer of the stage, and the time grows by their forward.
#[test]
fn selective_recompute_frees_exactly_the_named_modules() {
    let bf16 = |g: &Graph| Plan::builtin(Recipe::Bf16, g);
    let freed = |model: &str, layer: usize| {
        let (_, mut src) = common::Native.resolve(model, 256).unwrap();
        let g = src.graph(1).unwrap();
        let d = depth::analyse(&g);
        let key = ShardKey { tp: 1, cp: 1, ep: 1, etp: 1, sp: false, mbs: 1 };
        let t = Template::build(&g, &d.layers, key).unwrap();
        Template::stored(&t.layers[layer], &d.gemm_names[layer], &bf16(&g)).freed
    };
    let (s, h) = (256.0, 256.0);
    let f = freed("llama3-tiny", 0);
    assert_eq!(f[Module::Layernorm.index()], 2.0 * s * h * 2.0);
    assert_eq!(f[Module::Mlp.index()], 3.0 * s * 688.0 * 2.0);
    assert_eq!((f[Module::CoreAttn.index()], f[Module::MoeAct.index()], f[Module::MlaUpProj.index()]), (0.0, 0.0, 0.0));
    // DeepSeek's proxy: layer 0 dense, layer 1 MoE (top-2 of 8 experts, width 256, one
    // shared expert of width 256) with MLA (8 heads, q/k 32 + 16 rotary, v 32).
    let f = freed("deepseek-tiny", 1);
    assert_eq!(f[Module::Layernorm.index()], 2.0 * s * h * 2.0);
    assert_eq!(f[Module::MoeAct.index()], 2.0 * s * 256.0 * 2.0);
    assert_eq!(f[Module::MlaUpProj.index()], s * 8.0 * (48.0 + 48.0 + 32.0) * 2.0);
    assert_eq!(f[Module::SharedExperts.index()], 3.0 * s * 256.0 * 2.0);
    assert_eq!(f[Module::Mlp.index()], 0.0);
    // The whole MoE layer (moe), besides its activation and shared expert: the router's
    // logits (8 experts, BF16), top-2 weights (F32) and indices (I32), the dispatched
    // tokens and the experts' gate and up outputs (512 = 256 tokens x 2, BF16). Not the
    // experts' down outputs: Megatron-Core weights by the router inside the experts, and
    // the combine's backward reads only the weights and indices.
    assert_eq!(f[Module::Moe.index()], s * 8.0 * 2.0 + 2.0 * s * 2.0 * 4.0 + 3.0 * (2.0 * s) * h * 2.0);

    // A projected step: memory falls by the freed bytes of every layer (one micro-batch
    // in flight without pipelining), time grows by the norms' forward.
    let mut pr = projector("llama3.1-8b", 8192, "h100", Recipe::Bf16);
    let none = layout(1, 1, 1, 1, 8, 1, 64);
    let norms = LayoutSpec { recompute: RecomputePolicy::Selective, recompute_modules: Modules::of(&[Module::Layernorm]), ..none };
    let (a, b) = (pr.project(&none).unwrap(), pr.project(&norms).unwrap());
    let per_layer = 2.0 * 8192.0 * 4096.0 * 2.0;
    let slack = 1.0 + pr.gpu.efficiency.allocator_slack;
    let want = 32.0 * per_layer * slack / (1u64 << 30) as f64;
    assert!(((a.memory.activations - b.memory.activations) / want - 1.0).abs() < 1e-9, "{} vs {want}", a.memory.activations - b.memory.activations);
    assert!(b.breakdown.recompute > 0.0 && b.breakdown.recompute < 0.02 * b.step_time_s, "{:?}", b.breakdown);
    assert_eq!(b.layout.short(), "TP1 PP1 DP8 MBS1 GBS64 RC-sel:layernorm");
    // A dense model has no MoE, MLA or shared-expert modules to recompute.
    let c = pr.costed(none.key(), none.kernels).unwrap();
    let present: Vec<Modules> = search::selective_levels().iter().map(|&m| c.present(m)).collect();
    let (norms, mlp) = (Modules::of(&[Module::Layernorm]), Modules::of(&[Module::Mlp]));
    assert_eq!(present, [norms, Modules::EMPTY, norms, mlp, norms.with(Module::Mlp)]);

    // `moe` contains `moe_act` and `shared_experts`: listing it frees and repeats them
    // too, once; listing all three changes nothing more.
    let mut pr = projector("deepseek-tiny", 256, "h100", Recipe::Bf16);
    let base = layout(1, 1, 1, 1, 1, 1, 1);
    let with = |m: &[Module]| LayoutSpec { recompute: RecomputePolicy::Selective, recompute_modules: Modules::of(m), ..base };
    let moe = pr.project(&with(&[Module::Moe])).unwrap();
    let all = pr.project(&with(&[Module::Moe, Module::MoeAct, Module::SharedExperts])).unwrap();
    let inner = pr.project(&with(&[Module::MoeAct, Module::SharedExperts])).unwrap();
    assert_eq!((moe.memory.activations, moe.step_time_s), (all.memory.activations, all.step_time_s));
    assert!(moe.memory.activations < inner.memory.activations && moe.breakdown.recompute > inner.breakdown.recompute);
}

/// Transformer Engine keeps a low-precision GEMM's input as the cast copy its weight
/// gradient reads: with FP8, a Llama layer stores each norm output and the SwiGLU output
/// in one byte instead of two, and the attention output twice (BF16 for the attention
/// backward, FP8 for the output projection): (h + ffn) bytes less per token.
#[test]
fn low_precision_gemms_keep_their_inputs_cast() {
    let (_, mut src) = common::Native.resolve("llama3-tiny", 256).unwrap();
    let g = src.graph(1).unwrap();
    let d = depth::analyse(&g);
    let t = Template::build(&g, &d.layers, ShardKey { tp: 1, cp: 1, ep: 1, etp: 1, sp: false, mbs: 1 }).unwrap();
    let at = |r: Recipe| Template::stored(&t.layers[0], &d.gemm_names[0], &Plan::builtin(r, &g)).none;
    assert_eq!(at(Recipe::Bf16), t.layers[0].activations[0]);
    assert_eq!(at(Recipe::Bf16) - at(Recipe::Fp8), 256.0 * (256.0 + 688.0));
    let mx = at(Recipe::Bf16) - at(Recipe::Mxfp8);
    let e = 1.0 + 1.0 / 32.0;
    assert!((mx - 256.0 * ((2.0 - e) * (2.0 * 256.0 + 688.0) - e * 256.0)).abs() < 1e-6, "{mx}");
}

/// A layout that does not fit takes the fastest recompute that makes it fit: on B200,
/// DeepSeek-V3 at TP1 PP16 EP8 (Megatron-Bridge's 26.02 layout) with two sequences per
/// micro-batch fits with the norms and some of the MoE and MLA modules recomputed, which
/// costs less than recomputing whole layers.
#[test]
fn memory_bound_layouts_take_the_cheapest_recompute_that_fits() {
    let mut pr = projector("deepseek-v3-671b", 4096, "b200", Recipe::Mxfp8);
    let mut l = layout(1, 16, 1, 1, 16, 2, 4096);
    l.ep = 8;
    l.ep_overlap = true;
    assert!(!pr.project(&l).unwrap().fits);
    let layers = pr.model.depth.len() as u32;
    let c = pr.costed(l.key(), l.kernels).unwrap();
    let p = search::recompute_to_fit(c, &l.schedule(), layers, &mut 0).unwrap();
    assert!(p.fits);
    assert_eq!(p.layout.recompute, RecomputePolicy::Selective, "{}", p.layout.short());
    assert!(p.layout.recompute_modules.contains(Module::Layernorm));
    // No other module list that fits is faster.
    for m in search::selective_levels() {
        let s = Schedule { recompute: RecomputePolicy::Selective, recompute_modules: c.present(m), ..l.schedule() };
        let q = c.evaluate(&s).unwrap();
        assert!(!q.fits || p.step_time_s <= q.step_time_s, "{} beats {}", q.layout.short(), p.layout.short());
    }
    // Nor recomputing whole layers, as few as fit.
    let full = (1..=layers)
        .map(|k| pr.project(&LayoutSpec { recompute: RecomputePolicy::Full, recompute_layers: k, ..l }).unwrap())
        .find(|q| q.fits)
        .unwrap();
    assert!(p.step_time_s < full.step_time_s, "{} vs {} ({})", p.step_time_s, full.step_time_s, full.layout.short());
    // The published-layout projection makes the same choice and says so.
    let (q, note) = published::project_fitting(&mut pr, &l).unwrap();
    assert_eq!(q.layout, p.layout);
    assert_eq!(note.as_deref(), Some(format!("selective recompute of {}", p.layout.recompute_modules).as_str()));
}

/// On Blackwell, per-tensor FP8 and MXFP8 run the same tensor-core instructions at one
/// peak: the fit gives them one efficiency, from the runs of both recipes.
#[test]
fn blackwell_fp8_recipes_share_one_gemm_efficiency() {
    let points = common::calibration();
    let fits = calibrate::calibrate(&points, &Profiles::priors(), &mut common::Native, Some(("gb300", None)), "test", &|_| {})
        .unwrap();
    let e = &fits[0].efficiency;
    assert_eq!(e.gemm.fp8, e.gemm.mxfp8);
    assert!(fits[0].params.iter().any(|(n, _, _)| n == "gemm.fp8+mxfp8"), "{:?}", fits[0].params);
    let h100 = calibrate::calibrate(&points, &Profiles::priors(), &mut common::Native, Some(("h100", None)), "test", &|_| {})
        .unwrap();
    assert!(h100[0].params.iter().any(|(n, _, _)| n == "gemm.fp8"));
    // Both GPUs have unfused MoE runs of several families: the grouped GEMMs' share is
    // fitted. H100's four (DeepSeek, gpt-oss, Qwen3 twice) run slower than their GEMMs at
    // the dense efficiency would: the share comes out well below 1.
    let grouped = |f: &calibrate::Fit| f.params.iter().find(|(n, _, _)| n == "grouped_gemm").map(|p| p.2);
    assert!(grouped(&fits[0]).is_some(), "{:?}", fits[0].params);
    let h = grouped(&h100[0]).unwrap_or_else(|| panic!("{:?}", h100[0].params));
    assert!(h < 0.8, "H100 grouped_gemm {h}");
    // H100 has hybrid Mamba runs of two models (Nemotron-H 56B twice, Nemotron 3 Nano):
    // the scan's efficiency is fitted there, and nowhere without them.
    let ssm = |f: &calibrate::Fit| f.params.iter().any(|(n, _, _)| n == "ssm");
    assert!(ssm(&h100[0]), "{:?}", h100[0].params);
    let dense = common::calibration_without_hybrids();
    let h100 = calibrate::calibrate(&dense, &Profiles::priors(), &mut common::Native, Some(("h100", None)), "test", &|_| {})
        .unwrap();
    assert!(!ssm(&h100[0]), "{:?}", h100[0].params);
}

/// The search builds and times its templates on every core before it walks them; a
/// template built and timed that way projects exactly as one built on first use, and a
/// sharding the graph refuses is refused the same way.
#[test]
fn prebuilt_templates_project_as_built_on_demand() {
    let mut lazy = projector("mixtral-tiny", 256, "h100", Recipe::Bf16);
    let mut eager = projector("mixtral-tiny", 256, "h100", Recipe::Bf16);
    let layouts: Vec<LayoutSpec> = [(1, 1, 1), (2, 1, 2), (1, 2, 4), (2, 2, 1), (3, 1, 1)]
        .into_iter()
        .map(|(tp, ep, mbs)| LayoutSpec { ep, ..layout(tp, 1, 1, 1, 4, mbs, 16) })
        .collect();
    eager.prebuild(&layouts.iter().map(|l| l.key()).collect::<Vec<_>>(), layouts[0].kernels);
    for (i, l) in layouts.iter().enumerate() {
        let (a, b) = (lazy.project(l), eager.project(l));
        assert_eq!(a, b, "{}", l.short());
        assert_eq!(a.is_ok(), i < 4, "{}: {a:?}", l.short());
    }
}

/// A GPU whose runs are too few to fit a parameter takes it from its nearest fitted
/// sibling (B200 from GB200: the same die), not from the best-measured GPU (H100, another
/// architecture); without siblings it takes H100's.
#[test]
fn a_gpu_with_few_runs_borrows_from_its_sibling_first() {
    let points: Vec<_> = common::calibration_without_hybrids()
        .into_iter()
        .filter(|p| ["h100", "gb200", "b200"].iter().any(|g| p.gpu.eq_ignore_ascii_case(g)))
        .collect();
    let fit = |profiles: &Profiles| calibrate::calibrate(&points, profiles, &mut common::Native, None, "test", &|_| {}).unwrap();
    let fits = fit(&Profiles::priors());
    let by = |fits: &[calibrate::Fit], g: &str| fits.iter().find(|f| f.gpu == g).unwrap().efficiency.clone();
    let (h100, gb200, b200) = (by(&fits, "H100"), by(&fits, "GB200"), by(&fits, "B200"));
    // GB200's BF16 runs (three families) fit its BF16 GEMM efficiency; B200 has one BF16 run.
    assert!((gb200.gemm.bf16 / h100.gemm.bf16 - 1.0).abs() > 0.02, "the two fits must differ for the test to mean anything");
    assert_eq!(b200.gemm.bf16, gb200.gemm.bf16);
    // Too few runs for the shared parameters: GB200's attention and HBM shares.
    assert_eq!((b200.attention, b200.memory), (gb200.attention, gb200.memory));
    // GB200's runs never cross its 72-GPU domain with an all-to-all: B200 takes H100's.
    assert_eq!(b200.scale_out_a2a, h100.scale_out_a2a);
    // And says where each borrowed parameter came from.
    let borrowed = &fits.iter().find(|f| f.gpu == "B200").unwrap().borrowed;
    for (name, from) in [("gemm.bf16", "GB200"), ("attention", "GB200"), ("scale_out_a2a", "H100")] {
        assert!(borrowed.contains(&(name.to_string(), from.to_string())), "{name} from {from}: {borrowed:?}");
    }
    let mut lone = Profiles::priors();
    lone.gpus.iter_mut().filter(|g| g.name == "B200").for_each(|g| g.siblings.clear());
    assert_eq!(by(&fit(&lone), "B200").gemm.bf16, h100.gemm.bf16);
}

/// The hybrid runs inform the scan's efficiency and nothing else: fitted with them, every
/// other H100 parameter comes out exactly as without them (a joint fit had bent the HBM,
/// expert and NVFP4 efficiencies to explain the Mamba layers' costs), and the scan lands
/// well under its prior (the Triton kernels Megatron runs, forward and backward). B200,
/// whose hybrid runs are one model's, takes the scan at H100's TFLOP/s, not its share of
/// the peak.
#[test]
fn hybrid_runs_fit_the_scan_alone() {
    let on = |gpus: &[&str], points: Vec<runner_project::published::Point>| {
        let points: Vec<_> = points.into_iter().filter(|p| gpus.iter().any(|g| p.gpu.eq_ignore_ascii_case(g))).collect();
        calibrate::calibrate(&points, &Profiles::priors(), &mut common::Native, None, "test", &|_| {}).unwrap()
    };
    let with = on(&["h100", "b200"], common::calibration());
    let without = on(&["h100"], common::calibration_without_hybrids());
    let (a, b) = (&with[0], &without[0]);
    assert_eq!((a.gpu.as_str(), b.gpu.as_str(), with[1].gpu.as_str()), ("H100", "H100", "B200"));
    let others = |f: &calibrate::Fit| f.params.iter().filter(|p| p.0 != "ssm").cloned().collect::<Vec<_>>();
    assert_eq!(others(a), others(b));
    let (prior, fitted) = a.params.iter().find(|p| p.0 == "ssm").map(|p| (p.1, p.2)).unwrap_or_else(|| panic!("{:?}", a.params));
    assert!(fitted < 0.7 * prior && fitted >= 0.01, "H100 ssm {prior} -> {fitted}");
    assert!(!with[1].params.iter().any(|p| p.0 == "ssm"), "{:?}", with[1].params);
    let peak = |g: &str| Profiles::priors().get(g).unwrap().peak_tflops.bf16;
    let rate = |e: &runner_project::profile::Efficiency, g: &str| e.ssm * peak(g);
    assert!((rate(&with[1].efficiency, "b200") / rate(&a.efficiency, "h100") - 1.0).abs() < 1e-12);
}

/// Routed experts' GEMMs on Megatron's default path (Transformer Engine's GroupedLinear)
/// run at the profile's `grouped_gemm` share of the dense efficiency; on the fused path
/// (`cutedsl_fused_grouped_mlp`) at the dense efficiency, with the activation between
/// them inside the GEMMs. Dense GEMMs and every other op time the same either way.
#[test]
fn unfused_routed_experts_run_at_the_grouped_share() {
    use runner_project::template::{Gemm, Part};
    let (_, mut src) = common::Native.resolve("deepseek-tiny", 256).unwrap();
    let g = src.graph(1).unwrap();
    let d = depth::analyse(&g);
    let key = ShardKey { tp: 1, cp: 1, ep: 1, etp: 1, sp: false, mbs: 1 };
    let t = Template::build(&g, &d.layers, key).unwrap();
    let plan = Plan::builtin(Recipe::Bf16, &g);
    // Layer 1 of DeepSeek's proxy routes to experts beside a shared one.
    let part = &t.layers[1];
    let (experts, dense): (Vec<Gemm>, Vec<Gemm>) = part.gemms.iter().cloned().partition(|gm| gm.expert);
    assert!(!experts.is_empty() && !dense.is_empty(), "{:?}", part.gemms);
    let fused = Kernels { fused_grouped_mlp: true, ..Kernels::default() };
    let unfused = Kernels::default();
    // Compute-bound GEMMs (a vast HBM), the unfused path at half the dense efficiency.
    let mut gpu = Profiles::builtin().get("h100").unwrap().clone();
    gpu.hbm_gbs = 1e9;
    gpu.efficiency.grouped_gemm = 0.5;
    let rates = Rates::new(&gpu);
    let gemms = |gemms: &[Gemm], k: Kernels| {
        let names: Vec<String> = gemms.iter().map(|gm| gm.name.clone()).collect();
        t.time_part(&Part { gemms: gemms.to_vec(), ..Default::default() }, &names, &plan, &rates, &Measured::default(), k).gemm
    };
    let ratio = gemms(&experts, unfused) / gemms(&experts, fused);
    assert!((ratio - 2.0).abs() < 1e-9, "expert GEMMs unfused / fused: {ratio}");
    assert_eq!(gemms(&dense, unfused), gemms(&dense, fused));
    // NVFP4 (every layer, as NVIDIA's performance configs run it): unfused, the experts'
    // GEMMs take the MXFP8 rate (Transformer Engine's GroupedLinear); fused, and for the
    // dense GEMMs, NVFP4's own.
    let mut b200 = Profiles::builtin().get("b200").unwrap().clone();
    b200.hbm_gbs = 1e9;
    b200.efficiency.grouped_gemm = 0.5;
    let rates4 = Rates::new(&b200);
    let at = |recipe: Recipe, gemms: &[Gemm], k: Kernels| {
        let plan = Plan::builtin_with(recipe, &g, Some((0, 0)));
        let names: Vec<String> = gemms.iter().map(|gm| gm.name.clone()).collect();
        t.time_part(&Part { gemms: gemms.to_vec(), ..Default::default() }, &names, &plan, &rates4, &Measured::default(), k).gemm
    };
    let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-6;
    assert!(close(at(Recipe::Nvfp4, &experts, unfused), at(Recipe::Mxfp8, &experts, unfused)));
    assert!(at(Recipe::Nvfp4, &experts, fused) < 0.8 * at(Recipe::Mxfp8, &experts, fused));
    assert!(at(Recipe::Nvfp4, &dense, unfused) < 0.8 * at(Recipe::Mxfp8, &dense, unfused));
    // The activation: its bytes at the achieved HBM rate, forward and (twice) backward,
    // unless fused; every other memory-bound op the same.
    let rates = Rates::new(Profiles::builtin().get("h100").unwrap());
    let vector = |k: Kernels| t.time_part(&Part { vector: part.vector.clone(), ..Default::default() }, &[], &plan, &rates, &Measured::default(), k);
    let act: f64 = part.vector.iter().filter(|v| v.module == Some(Module::MoeAct)).map(|v| v.bytes).sum();
    assert!(act > 0.0, "{:?}", part.vector);
    let (a, b) = (vector(unfused), vector(fused));
    assert!(((a.fwd - b.fwd) / (act / rates.hbm) - 1.0).abs() < 1e-9, "{a:?} {b:?}");
    assert!(((a.bwd - b.bwd) / (2.0 * act / rates.hbm) - 1.0).abs() < 1e-9, "{a:?} {b:?}");
    // A projected step: faster fused, said in the layout; a dense model is unchanged.
    let mut pr = projector("qwen3-30b-a3b", 4096, "b200", Recipe::Mxfp8);
    let l = LayoutSpec { ep: 8, ..layout(1, 1, 1, 1, 8, 4, 512) };
    let f = LayoutSpec { kernels: fused, ..l };
    let (slow, fast) = (pr.project(&l).unwrap(), pr.project(&f).unwrap());
    assert!(fast.step_time_s < 0.97 * slow.step_time_s, "{} vs {}", fast.step_time_s, slow.step_time_s);
    assert!(fast.layout.short().ends_with("FUSED-MLP"), "{}", fast.layout.short());
    let mut pr = projector("llama3.1-8b", 8192, "b200", Recipe::Bf16);
    let l = layout(1, 1, 1, 1, 8, 1, 64);
    assert_eq!(pr.project(&l).unwrap().step_time_s, pr.project(&LayoutSpec { kernels: fused, ..l }).unwrap().step_time_s);
    // The published rows say which runs took the fused path.
    let points = common::calibration();
    let fused_rows: Vec<usize> =
        points.iter().enumerate().filter(|(_, p)| p.layout().is_ok_and(|l| l.kernels.fused_grouped_mlp)).map(|(i, _)| i).collect();
    assert_eq!(fused_rows, [41, 42, 43, 45, 46, 47]);
}

/// An expert group spanning scale-up domains: the flex dispatchers (DeepEP, HybridEP) send
/// a token to each remote domain once, Megatron's plain `alltoall` dispatcher once per
/// routed expert there. Qwen3-30B-A3B (top-8 of 128) over two H100 nodes: per token,
/// alltoall sends 8 x 8/16 = 4 copies to the other node, flex 1 - C(64,8)/C(128,8)
/// (0.997), so the network part of the exchange is about 4x; the NVLink part is the same.
/// Inside one node the two dispatchers time the same.
#[test]
fn the_alltoall_dispatcher_sends_a_copy_per_expert_across_domains() {
    let mut pr = projector("qwen3-30b-a3b", 4096, "h100", Recipe::Bf16);
    let across = LayoutSpec { ep: 16, ..layout(1, 1, 1, 1, 16, 1, 256) };
    let alltoall = Kernels { dispatcher: Dispatcher::AllToAll, ..Kernels::default() };
    let plain = LayoutSpec { kernels: alltoall, ..across };
    let (flex, a2a) = (pr.project(&across).unwrap(), pr.project(&plain).unwrap());
    let ratio = a2a.breakdown.ep / flex.breakdown.ep;
    assert!((2.0..4.0).contains(&ratio), "alltoall / flex exposed EP time over two nodes: {ratio}");
    assert_eq!(a2a.breakdown.compute, flex.breakdown.compute);
    assert!(a2a.layout.short().ends_with("A2A-DISPATCH"), "{}", a2a.layout.short());
    assert!(!flex.layout.short().contains("A2A-DISPATCH"), "{}", flex.layout.short());
    let mut pr = projector("qwen3-30b-a3b", 4096, "h100", Recipe::Bf16);
    let inside = LayoutSpec { ep: 8, ..layout(1, 1, 1, 1, 8, 1, 128) };
    let plain = LayoutSpec { kernels: alltoall, ..inside };
    assert_eq!(pr.project(&inside).unwrap().step_time_s, pr.project(&plain).unwrap().step_time_s);
    // The published rows that record the plain dispatcher: NeMo 25.04's DeepSeek-V3
    // (token dropping takes no other) and gpt-oss's BF16 presets (no flex backend set).
    let points = common::calibration();
    let rows: Vec<usize> =
        points.iter().enumerate().filter(|(_, p)| p.layout().is_ok_and(|l| l.kernels.dispatcher == Dispatcher::AllToAll)).map(|(i, _)| i).collect();
    assert_eq!(rows, [36, 37, 91, 92, 93, 94]);
    assert_eq!(Dispatcher::parse("DeepEP"), Ok(Dispatcher::Flex));
    assert!(Dispatcher::parse("allgather").unwrap_err().contains("flex"));
    // A layout's kernels are fields of its JSON: it reads back as written, and a layout
    // written before a kernel choice existed reads with that choice at its default.
    let json = serde_json::to_value(plain).unwrap();
    assert_eq!(json["dispatcher"], "alltoall");
    assert_eq!(serde_json::from_value::<LayoutSpec>(json.clone()).unwrap(), plain);
    let mut old = json;
    for k in ["dispatcher", "fused_grouped_mlp"] {
        old.as_object_mut().unwrap().remove(k);
    }
    assert_eq!(serde_json::from_value::<LayoutSpec>(old).unwrap(), inside);
}

/// The breakdown splits compute into GEMMs, attention cores and the rest, and the split
/// follows the arithmetic: doubling the sequence at a fixed token count per micro-batch
/// leaves the GEMM time as it is (same tokens, same weights) and doubles the attention
/// cores' (twice the keys per query).
#[test]
fn compute_splits_into_gemms_attention_and_the_rest() {
    let at = |seq: u32, mbs: u32| {
        let mut pr = projector("llama3.1-8b", seq, "h100", Recipe::Bf16);
        let mut l = layout(1, 1, 1, 1, 8, mbs, 8 * mbs);
        l.recompute = RecomputePolicy::None;
        pr.project(&l).unwrap().breakdown
    };
    let (short, long) = (at(4096, 2), at(8192, 1));
    for b in [&short, &long] {
        let rest = b.compute - b.compute_parts.gemm - b.compute_parts.attention;
        assert!(b.compute_parts.gemm > 0.6 * b.compute, "GEMMs dominate a dense 8B step: {b:?}");
        assert!(b.compute_parts.attention > 0.02 * b.compute && rest > 0.0, "{b:?}");
    }
    let gemm = long.compute_parts.gemm / short.compute_parts.gemm;
    let attn = long.compute_parts.attention / short.compute_parts.attention;
    assert!((gemm - 1.0).abs() < 0.02, "GEMM time at equal tokens: x{gemm}");
    assert!((1.8..2.2).contains(&attn), "attention time with twice the keys: x{attn}");
}

/// LoRA on a frozen model (Megatron-Bridge's recipe: rank 32 on the attention and MLP
/// linears): the base GEMMs run their input gradient only, so GEMM time is about 2/3 of
/// full training plus the adapters'; the base has no gradients, optimizer state or
/// data-parallel reduction; what the adapters add is small.
#[test]
fn lora_trains_the_adapters_on_a_frozen_model() {
    let mut full = projector("llama3.1-8b", 4096, "h100", Recipe::Bf16);
    let (_, inner) = common::Native.resolve("llama3.1-8b", 4096).unwrap();
    let mut src = TrainedSource { inner, training: Training::Lora(Lora::default()) };
    let m = Model::new("llama3.1-8b", 4096, &mut src).unwrap();
    let ratio = m.flops_per_sequence / full.model.flops_per_sequence;
    assert!((0.66..0.70).contains(&ratio), "LoRA model FLOPs {ratio:.3} of full training");
    assert!(m.params.trainable < m.params.total / 100 && m.params.trainable > 0, "{:?}", m.params);
    let plan = Plan::builtin(Recipe::Bf16, &m.graph);
    let mut lora = Projector::new(m, Box::new(src), Profiles::builtin().get("h100").unwrap().clone(), plan);
    let mut l = layout(1, 1, 1, 1, 16, 1, 64);
    l.dp_overlap = false;
    let (f, p) = (full.project(&l).unwrap(), lora.project(&l).unwrap());
    let gemm = p.breakdown.compute_parts.gemm / f.breakdown.compute_parts.gemm;
    assert!((0.66..0.80).contains(&gemm), "GEMM time {gemm:.3} of full training");
    assert!(p.step_time_s < 0.85 * f.step_time_s, "{} vs {}", p.step_time_s, f.step_time_s);
    assert!(p.memory.optimizer < 0.02 * f.memory.optimizer && p.memory.gradients < 0.02 * f.memory.gradients, "{:?}", p.memory);
    assert!(p.breakdown.dp < 0.02 * f.breakdown.dp, "{} vs {}", p.breakdown.dp, f.breakdown.dp);
    assert!(p.breakdown.optimizer < 0.02 * f.breakdown.optimizer);
    // The frozen weights are still held, in BF16.
    assert!((p.memory.weights / f.memory.weights - 1.0).abs() < 0.02, "{} vs {}", p.memory.weights, f.memory.weights);
    // GPT-3 ties its embedding to the head: on two stages both hold the frozen table,
    // and neither keeps optimizer state for it.
    let (_, inner) = common::Native.resolve("gpt3-5b", 2048).unwrap();
    let mut src = TrainedSource { inner, training: Training::Lora(Lora::default()) };
    let m = Model::new("gpt3-5b", 2048, &mut src).unwrap();
    let plan = Plan::builtin(Recipe::Bf16, &m.graph);
    let mut lora = Projector::new(m, Box::new(src), Profiles::builtin().get("h100").unwrap().clone(), plan);
    let mut full = projector("gpt3-5b", 2048, "h100", Recipe::Bf16);
    let l = layout(1, 2, 1, 1, 4, 1, 64);
    let (f, p) = (full.project(&l).unwrap(), lora.project(&l).unwrap());
    assert!(p.memory.optimizer < 0.02 * f.memory.optimizer, "{:?} vs {:?}", p.memory, f.memory);
    assert!((p.memory.weights / f.memory.weights - 1.0).abs() < 0.02, "{:?} vs {:?}", p.memory, f.memory);
    // The last stage (the head's, the slowest) updates no copy of the table either.
    assert!(p.breakdown.optimizer < 0.02 * f.breakdown.optimizer, "{} vs {}", p.breakdown.optimizer, f.breakdown.optimizer);
}

/// LoRA on q, k and v alone (`target_modules = ["linear_qkv"]`, NVIDIA's LoRA performance
/// configs): a fraction of the default's trained parameters and adapter traffic over the
/// same frozen GEMMs, so a shorter step whose GEMM time falls by the adapters' own
/// (rank-32 products, small and far from peak) and no more.
#[test]
fn lora_on_qkv_alone_adapts_less_than_every_linear() {
    let lora = |targets| {
        let (_, inner) = common::Native.resolve("llama3.1-8b", 4096).unwrap();
        let mut src = TrainedSource { inner, training: Training::Lora(Lora { targets, ..Lora::default() }) };
        let m = Model::new("llama3.1-8b", 4096, &mut src).unwrap();
        let trainable = m.params.trainable;
        let plan = Plan::builtin(Recipe::Bf16, &m.graph);
        let mut p = Projector::new(m, Box::new(src), Profiles::builtin().get("h100").unwrap().clone(), plan);
        (trainable, p.project(&layout(1, 1, 1, 1, 16, 1, 64)).unwrap())
    };
    let (n_all, all) = lora(LoraTargets::All);
    let (n_qkv, qkv) = lora(LoraTargets::Qkv);
    // Rank 32 per adapter: q, k, v share one A (4096 x 32) and have B's of 4096, 1024, 1024
    // rows; every linear adds o, gate/up (shared A) and down.
    assert!(n_qkv > 0 && n_qkv * 4 < n_all, "{n_qkv} vs {n_all}");
    assert!(qkv.step_time_s < 0.97 * all.step_time_s, "{} vs {}", qkv.step_time_s, all.step_time_s);
    let gemm = qkv.breakdown.compute_parts.gemm / all.breakdown.compute_parts.gemm;
    assert!((0.85..0.97).contains(&gemm), "GEMM time x{gemm:.3}");
}

/// Activation offload (Megatron's `cpu_offloading_num_layers`): the offloaded layers'
/// activations leave the GPU but for the one in flight, and the copies cost what they take
/// beyond the layers' own compute, which depends on the host link: PCIe Gen5 on an H100
/// board (63 GB/s per direction) against NVLink-C2C on GB200 (225).
#[test]
fn offloaded_activations_leave_the_gpu_and_cost_what_the_host_link_cannot_hide() {
    let run = |gpu: &str, n: u32| {
        let mut pr = projector("llama3.1-8b", 8192, gpu, Recipe::Bf16);
        pr.project(&LayoutSpec { offload_layers: n, ..layout(1, 1, 1, 1, 8, 1, 64) }).unwrap()
    };
    for gpu in ["h100", "gb200"] {
        let (none, off) = (run(gpu, 0), run(gpu, 8));
        // 8 of 32 layers leave; one layer's worth stays as the buffer of the copy.
        let left = off.memory.activations / none.memory.activations;
        assert!((0.75..0.80).contains(&left), "{gpu}: activations x{left:.3}");
        assert!(off.breakdown.offload > 0.0, "{gpu}");
        assert!((off.step_time_s - none.step_time_s - off.breakdown.offload).abs() < 1e-9, "{gpu}");
        assert_eq!((off.breakdown.compute, none.breakdown.offload), (none.breakdown.compute, 0.0));
        // The 8 layers' activations wait in host memory (one micro-batch in flight
        // without a pipeline); 7 of them are what the GPU saves, the 8th's room it keeps
        // for the copy.
        assert_eq!(none.memory.host_offload, 0.0);
        let saved = none.memory.activations - off.memory.activations;
        assert!((off.memory.host_offload / saved - 8.0 / 7.0).abs() < 1e-9, "{gpu}: {} GiB on the host, {saved} saved", off.memory.host_offload);
        assert!(off.fits && off.memory.host_offload < off.memory.host_capacity, "{gpu}");
    }
    // The host has to hold them: a node with less host memory refuses the layout and
    // says why.
    let mut pr = projector("llama3.1-8b", 8192, "h100", Recipe::Bf16);
    pr.gpu.host_memory_gib = Some(5.0);
    let small = pr.project(&LayoutSpec { offload_layers: 8, ..layout(1, 1, 1, 1, 8, 1, 64) }).unwrap();
    assert!(small.memory.gpu_fits() && !small.fits, "{:?}", small.memory);
    let why = small.memory.shortfall().unwrap();
    assert!(why.contains("offloads 9 GiB of activations per GPU to 5 GiB of host memory"), "{why}");
    let mut pr = projector("llama3.1-8b", 8192, "h100", Recipe::Bf16);
    pr.gpu.host_memory_gib = None;
    let err = pr.project(&LayoutSpec { offload_layers: 8, ..layout(1, 1, 1, 1, 8, 1, 64) }).unwrap_err();
    assert!(err.contains("host_memory_gib"), "{err}");
    // At MBS1 and 8192 tokens a Llama 3.1 8B layer stores ~1 GB: PCIe takes longer to
    // move it than the layer computes, NVLink-C2C much less so.
    let (h, g) = (run("h100", 8), run("gb200", 8));
    assert!(h.breakdown.offload > 3.0 * g.breakdown.offload, "{} vs {}", h.breakdown.offload, g.breakdown.offload);
    // A profile without a host link cannot offload.
    let mut pr = projector("llama3.1-8b", 8192, "h100", Recipe::Bf16);
    pr.gpu.host_link_gbs = None;
    let err = pr.project(&LayoutSpec { offload_layers: 8, ..layout(1, 1, 1, 1, 8, 1, 64) }).unwrap_err();
    assert!(err.contains("host_link_gbs"), "{err}");
    // Every layer of the one chunk may go; one more than it has is refused, not clamped
    // to 32 under a label that says 33.
    assert!(run("gb200", 32).breakdown.offload > run("gb200", 31).breakdown.offload);
    let mut pr = projector("llama3.1-8b", 8192, "gb200", Recipe::Bf16);
    let err = pr.project(&LayoutSpec { offload_layers: 33, ..layout(1, 1, 1, 1, 8, 1, 64) }).unwrap_err();
    assert!(err.contains("33 layers") && err.contains("at most 32"), "{err}");
    // So is full recompute of more layers than the chunk has (it printed RC-full:999).
    let err = pr.project(&LayoutSpec { recompute: RecomputePolicy::Full, recompute_layers: 33, ..layout(1, 1, 1, 1, 8, 1, 64) }).unwrap_err();
    assert!(err.contains("full recompute of 33 layers") && err.contains("at most 32"), "{err}");
    assert!(pr.project(&LayoutSpec { recompute: RecomputePolicy::Full, recompute_layers: 32, ..layout(1, 1, 1, 1, 8, 1, 64) }).is_ok());
}

/// Offload under selective recompute: an offloaded layer sends what it still keeps, its
/// activations less those the recomputed modules free (Megatron offloads the tensors
/// saved for the backward, and a recomputed module saves none of its own). Llama 3.1 8B
/// on GB200, one stage, one micro-batch, every layer offloaded: what selective recompute
/// of the MLP saves on the GPU without offload is what it saves on the host with it.
#[test]
fn offload_sends_what_selective_recompute_leaves() {
    let mut pr = projector("llama3.1-8b", 8192, "gb200", Recipe::Bf16);
    let none = layout(1, 1, 1, 1, 1, 1, 1);
    let mlp = LayoutSpec { recompute: RecomputePolicy::Selective, recompute_modules: Modules::of(&[Module::Mlp]), ..none };
    let mut run = |l: LayoutSpec| pr.project(&l).unwrap().memory;
    let (gpu_none, gpu_mlp) = (run(none), run(mlp));
    let (host_none, host_mlp) = (run(LayoutSpec { offload_layers: 32, ..none }), run(LayoutSpec { offload_layers: 32, ..mlp }));
    let saved = gpu_none.activations - gpu_mlp.activations;
    assert!(saved > 1.0, "the MLP's stored activations: {saved} GiB");
    let moved = host_none.host_offload - host_mlp.host_offload;
    assert!((moved / saved - 1.0).abs() < 1e-9, "{moved} GiB less on the host, {saved} GiB less on the GPU");
}

/// Offloading to fit: the fewest layers per chunk whose activations, on the host, make the
/// layout fit; the search takes it on GB200 (NVLink-C2C) where it beats recompute, and
/// keeps recompute on H100 (PCIe) where the copies would be exposed.
#[test]
fn a_layout_that_does_not_fit_offloads_the_fewest_layers_that_fit_where_the_link_hides_them() {
    let l = LayoutSpec { fsdp: true, distributed_optimizer: false, ..layout(1, 1, 1, 1, 64, 2, 256) };
    let mut gb = projector("llama3.1-70b", 8192, "gb200", Recipe::Fp8);
    assert!(!gb.project(&l).unwrap().fits);
    let layers = gb.model.depth.len() as u32;
    let c = gb.costed(l.key(), l.kernels).unwrap();
    let p = search::offload_to_fit(c, &l.schedule(), layers, &mut 0).unwrap().expect("offloading enough layers fits");
    let n = p.layout.offload_layers;
    assert!(p.fits && n > 0 && n < layers, "{}", p.layout.short());
    assert!(!c.evaluate(&Schedule { offload_layers: n - 1, ..l.schedule() }).unwrap().fits, "{n} is not the fewest");
    let rc = search::recompute_to_fit(c, &l.schedule(), layers, &mut 0).unwrap();
    assert!(p.step_time_s < rc.step_time_s, "offload {} vs recompute {}", p.step_time_s, rc.step_time_s);
    let space = Space { tp: Some(1), pp: Some(1), cp: Some(1), mbs: Some(2), fsdp: Some(true), ..Space::default() };
    let best = &search::search(&mut gb, 64, 256, &space, 1).best[0];
    assert_eq!(best.layout.offload_layers, n, "{}", best.layout.short());
    // The same layout on H100 keeps recompute: PCIe cannot hide the copies.
    let mut h = projector("llama3.1-70b", 8192, "h100", Recipe::Fp8);
    let best = &search::search(&mut h, 64, 256, &space, 1).best[0];
    assert_eq!(best.layout.offload_layers, 0, "{}", best.layout.short());
    assert_ne!(best.layout.recompute, RecomputePolicy::None, "{}", best.layout.short());
    // A space that fixes the offload keeps it.
    let fixed = Space { offload_layers: Some(0), ..space };
    assert_eq!(search::search(&mut gb, 64, 256, &fixed, 1).best[0].layout.offload_layers, 0);
    // With less host memory than the fewest offloaded layers take, offload is out: the
    // search recomputes instead, and held to those layers without recompute says the
    // host is short.
    let mut small = projector("llama3.1-70b", 8192, "gb200", Recipe::Fp8);
    small.gpu.host_memory_gib = Some(0.99 * p.memory.host_offload);
    let c = small.costed(l.key(), l.kernels).unwrap();
    let miss = search::offload_to_fit(c, &l.schedule(), layers, &mut 0).unwrap().unwrap_err();
    assert_eq!(miss.layout.offload_layers, n);
    assert!(miss.memory.gpu_fits() && !miss.memory.host_fits());
    let best = &search::search(&mut small, 64, 256, &space, 1).best[0];
    assert_eq!(best.layout.offload_layers, 0, "{}", best.layout.short());
    let none = Space { recompute: Some(RecomputePolicy::None), offload_layers: Some(n), ..space };
    let found = search::search(&mut small, 64, 256, &none, 1);
    assert!(found.best.is_empty());
    assert!(
        found.families.iter().any(|f| matches!(&f.verdict, Verdict::HostMemory { need_gib, have_gib, .. } if need_gib > have_gib)),
        "{:?}",
        found.families
    );
}

/// Muon under the layer-wise distributed optimizer (Megatron's `dist_muon`): 8 bytes of
/// fp32 state per owned parameter against AdamW's 12, gradients all-reduced and the
/// updated weights all-gathered unhidden, and the Newton-Schulz GEMMs of the owned
/// weights on top of the element-wise update; not with FSDP.
#[test]
fn muon_keeps_less_state_and_pays_newton_schulz_and_the_weight_gather() {
    let mut pr = projector("llama3.1-8b", 8192, "h100", Recipe::Bf16);
    let adam = layout(1, 1, 1, 1, 8, 1, 64);
    let muon = LayoutSpec { optimizer: Optimizer::Muon, ..adam };
    let (a, m) = (pr.project(&adam).unwrap(), pr.project(&muon).unwrap());
    // Muon keeps 8 B a weight (fp32 master and momentum) for the layers, AdamW's 12 for
    // the embedding and the output layer (128256 x 4096 each, untied) and the final norm:
    // per layer q, o 4096 x 4096, k, v 1024 x 4096, gate, up, down 14336 x 4096, two norms.
    let layers = 32.0 * (2.0 * 4096.0 * 4096.0 + 2.0 * 1024.0 * 4096.0 + 3.0 * 14336.0 * 4096.0 + 2.0 * 4096.0);
    let side = 2.0 * 128256.0 * 4096.0 + 4096.0;
    let ratio = (8.0 * layers + 12.0 * side) / (12.0 * (layers + side));
    assert!((m.memory.optimizer / a.memory.optimizer / ratio - 1.0).abs() < 1e-6, "{ratio}: {:?} vs {:?}", m.memory, a.memory);
    assert_eq!(m.memory.gradients, a.memory.gradients);
    assert!(m.breakdown.dp > a.breakdown.dp, "{} vs {}", m.breakdown.dp, a.breakdown.dp);
    // Newton-Schulz over the weights a rank owns (1/8 of them): per layer q and o 4096 x
    // 4096, k and v 1024 x 4096, gate and up 14336 x 4096, down 4096 x 14336; 32 layers.
    let ns = |a: u64, b: u64| runner_project::template::newton_schulz_flops(a, b, 1.0);
    let per_layer = 2.0 * ns(4096, 4096) + 2.0 * ns(1024, 4096) + 3.0 * ns(14336, 4096);
    let local = 32.0 * per_layer / 8.0;
    let peak = pr.gpu.peak_flops(runner_project::profile::GemmFormat::Bf16).unwrap();
    let extra = m.breakdown.optimizer - a.breakdown.optimizer;
    assert!(extra > local / peak && extra < 3.0 * local / peak + a.breakdown.optimizer, "NS {extra:.4} s for {local:.3e} FLOPs");
    assert_eq!(runner_project::template::newton_schulz_flops(3, 2, 1.0), 5.0 * (4.0 * 4.0 * 3.0 + 2.0 * 8.0));
    assert!(m.layout.short().contains("Muon"));
    let err = pr.project(&LayoutSpec { fsdp: true, ..muon }).unwrap_err();
    assert!(err.contains("layer-wise"), "{err}");
}

/// The pipeline split moves layers off the stage with the head: Llama 3.1 8B on PP4
/// puts 8 layers and the head (2.4 layers' worth of GEMM) on the last stage, which sets
/// the step; counting the loss as 2 layers leaves it 6 and the first two stages 9, a
/// shorter critical stage. 405B's 126 layers over 128 chunks run only with the
/// embedding and the loss counted (Megatron-Bridge's 405B recipe).
#[test]
fn pipeline_split_moves_layers_off_the_head_stage() {
    use runner_graph::pipeline::PipelineSplit;
    let mut pr = projector("llama3.1-8b", 8192, "h100", Recipe::Bf16);
    let even = layout(1, 4, 1, 1, 2, 1, 64);
    let moved = LayoutSpec { split: PipelineSplit { embedding: 0, loss: 2 }, ..even };
    let (a, b) = (pr.project(&even).unwrap(), pr.project(&moved).unwrap());
    assert!(b.breakdown.compute < 0.97 * a.breakdown.compute, "{} vs {}", b.breakdown.compute, a.breakdown.compute);
    assert!(b.layout.short().contains("E0L2"), "{}", b.layout.short());
    // Too much moved: the last stage would hold a negative count.
    let e = pr.project(&LayoutSpec { split: PipelineSplit { embedding: 0, loss: 12 }, ..even }).unwrap_err();
    assert!(e.contains("the loss counts as 12 layers"), "{e}");
    let mut pr = projector("llama3.1-405b", 8192, "gb200", Recipe::Mxfp8);
    let l = layout(4, 16, 1, 8, 4, 1, 1536);
    assert!(pr.project(&l).unwrap_err().contains("fill only 126"));
    let p = pr.project(&LayoutSpec { split: PipelineSplit::megatron(true, true), ..l }).unwrap();
    assert!(p.step_time_s > 0.0 && p.fits, "{p:?}");
}


/// The BF16 layers of a low-precision plan: NVFP4's built-in default keeps the last
/// four transformer layers in BF16; a run that states Megatron's
/// `num_layers_at_start_in_bf16` / `num_layers_at_end_in_bf16` gets exactly those, and
/// a stage holding BF16 layers is the slow one (405B on GB200, PP16 VP4: the last four
/// layers sit on stages 13-15).
#[test]
fn bf16_layers_of_a_low_precision_plan_follow_the_run() {
    let mut pr = projector("llama3.1-405b", 8192, "gb200", Recipe::Nvfp4);
    let g = pr.model.graph.clone();
    let share = |p: &Plan| p.coverage.iter().find(|c| c.0 == runner_project::profile::GemmFormat::Bf16).map_or(0.0, |c| c.1);
    let (default, none, both) = (
        Plan::builtin(Recipe::Nvfp4, &g),
        Plan::builtin_with(Recipe::Nvfp4, &g, Some((0, 0))),
        Plan::builtin_with(Recipe::Nvfp4, &g, Some((2, 4))),
    );
    // Only the head and embedding stay BF16 without a tail; two more layers at the start
    // add half again what four at the end do.
    assert!(share(&none) < share(&default), "{} vs {}", share(&none), share(&default));
    let per_layer = (share(&default) - share(&none)) / 4.0;
    assert!((share(&both) - share(&none) - 6.0 * per_layer).abs() < 1e-9);
    let l = LayoutSpec { split: runner_graph::pipeline::PipelineSplit::megatron(true, true), ..layout(4, 16, 1, 4, 4, 1, 1536) };
    let slow = pr.project(&l).unwrap();
    pr.set_plan(none);
    let fast = pr.project(&l).unwrap();
    assert!(fast.step_time_s < 0.8 * slow.step_time_s, "{} vs {}", fast.step_time_s, slow.step_time_s);
}

/// A run whose GEMM format keeps its prior (NVFP4: one model family only) is projected
/// but not fitted to: GB300's fit counts every supported GB300 run but its NVFP4 ones.
#[test]
fn runs_of_an_unfitted_format_do_not_move_the_fit() {
    // The shipped fit's file: the hybrid Mamba runs are checked out of sample (with them,
    // GB300 has NVFP4 runs of two families, Llama 3 and Nemotron 3 Super).
    let points = common::calibration_without_hybrids();
    let fits = calibrate::calibrate(&points, &Profiles::priors(), &mut common::Native, Some(("gb300", None)), "test", &|_| {})
        .unwrap();
    let v = published::validate(&points, &Profiles::priors(), &mut common::Native, &|_| {});
    // Fitted alone, GB300 fits its FP8 family only (its BF16 runs are one model's,
    // and it borrows nothing without the H100 fit first).
    let on = |p: &[&str]| v.checked.iter().filter(|c| c.gpu == "GB300" && p.contains(&c.precision.as_str())).count();
    assert!(on(&["nvfp4"]) >= 2 && on(&["bf16"]) >= 1, "the file's GB300 NVFP4 and BF16 runs");
    assert_eq!(fits[0].points, on(&["fp8", "fp8-cs", "mxfp8"]));
    assert!(!fits[0].params.iter().any(|(n, _, _)| n == "gemm.nvfp4"));
}

/// A Mamba-2 mixer layer projects: its scan is timed as a sequence-mixing kernel in the
/// breakdown's scan part (forward at the profile's `ssm` rate, backward twice the
/// forward's matrix work, the chunk states' HBM round trips on top), its convolutions and
/// gate as memory-bound ops; tensor
/// parallelism halves the scan per rank; context parallelism is refused by name.
#[test]
fn mamba_mixer_layers_project() {
    use runner_plugin_testkit::mamba::{Sizes, mamba_graph};
    let sizes = Sizes { b: 1, t: 4096, c: 2048, heads: 32, p: 64, groups: 8, n: 128, k: 4, chunk: 128 };
    let graph = move |mb: u32| -> Result<Graph, String> { Ok(mamba_graph(Sizes { b: u64::from(mb), ..sizes })) };
    let mut source: Box<dyn GraphSource> = Box::new(graph);
    let model = Model::new("mamba-toy", 4096, source.as_mut()).unwrap();
    let plan = Plan::builtin(Recipe::Bf16, &model.graph);
    let gpu = Profiles::builtin().get("h100").unwrap().clone();
    let rates = Rates::new(&gpu);
    let mut pr = Projector::new(model, source, gpu, plan);
    let one = pr.project(&layout(1, 1, 1, 1, 8, 1, 8)).unwrap();
    let two = pr.project(&layout(2, 1, 1, 1, 4, 1, 8)).unwrap();
    // One micro-batch per rank at tp=1 (GBS 8 over dp 8), two at tp=2 (dp 4).
    let g = mamba_graph(sizes);
    let scan = g.ops.iter().find(|o| o.kind == OpKind::SsmScan).unwrap();
    let c = runner_graph::count::op_flops(&g, scan);
    // The chunk states and scores the kernels pass through HBM, at the HBM rate on top.
    let spill = runner_graph::count::ssm_scan_spill(&g, scan);
    assert!(spill[0] > c.bytes && spill[1] > spill[0], "{spill:?} vs the op's own {} bytes", c.bytes);
    let spilled = |s: [f64; 2]| (s[0] + s[1]) / rates.hbm;
    let want = rates.scan_forward(c.fwd_flops, c.bytes) + rates.scan_backward(c.fwd_flops, c.bytes) + spilled(spill);
    let parts = one.breakdown.compute_parts;
    assert!((parts.scan / want - 1.0).abs() < 1e-9, "{} vs {want}", parts.scan);
    assert_eq!(parts.attention, 0.0, "the layer has no attention core");
    // Half the heads and groups per rank: half the work and bytes (at the efficiency of
    // the smaller call).
    let half = rates.scan_forward(c.fwd_flops / 2.0, c.bytes / 2.0)
        + rates.scan_backward(c.fwd_flops / 2.0, c.bytes / 2.0)
        + spilled(spill) / 2.0;
    let per_mb = two.breakdown.compute_parts.scan / 2.0;
    assert!((per_mb / half - 1.0).abs() < 1e-9, "tp=2 scan per micro-batch {per_mb} vs {half}");
    // The scan runs at the profile's own `ssm` efficiency, not the attention kernels':
    // at efficiencies low enough to be compute-bound, halving it doubles the scan, and
    // attention does not move.
    let at = |ssm: f64| {
        let mut g = Profiles::builtin().get("h100").unwrap().clone();
        g.efficiency.ssm = ssm;
        Rates::new(&g)
    };
    let (a, b) = (at(0.02), at(0.01));
    assert!((b.scan_forward(c.fwd_flops, c.bytes) / a.scan_forward(c.fwd_flops, c.bytes) - 2.0).abs() < 1e-9);
    assert!((b.scan_backward(c.fwd_flops, c.bytes) / a.scan_backward(c.fwd_flops, c.bytes) - 2.0).abs() < 1e-9);
    assert_eq!(a.attention_forward(c.fwd_flops, c.bytes), rates.attention_forward(c.fwd_flops, c.bytes));
    assert!(one.fits && one.step_time_s > parts.scan);
    let e = pr.project(&LayoutSpec { cp: 2, ..layout(1, 1, 2, 1, 4, 1, 8) }).unwrap_err();
    assert!(e.contains("context parallelism over Mamba mixers is not supported"), "{e}");
}

/// The weak-scaling series of the file (one layout per GPU of one model and recipe, from
/// one table, at GPU counts 4x and more apart: DGX Cloud's 8 to 2,048 H100s) slow down
/// with the GPU count more than the model's communication says. Without the straggler
/// term the model misses that drift by about 2 points of the step on average; with the
/// shipped spread (fitted to these series) by well under one. A step at 1,024 GPUs
/// waits σ times E[max of 1,024 normals] less E[max of 8] longer than the same per-GPU
/// step on one node.
#[test]
fn the_straggler_spread_takes_up_the_weak_scaling_drift() {
    let points = common::calibration();
    let drift = |profiles: &Profiles| -> f64 {
        let v = published::validate(&points, profiles, &mut common::Native, &|_| {});
        // The explorer's caveat past the fitted range names the largest projected run.
        assert_eq!(v.checked.iter().map(|c| u64::from(c.gpus)).max(), Some(runner_project::step::STRAGGLER_FITTED_UP_TO));
        let mut series: std::collections::BTreeMap<String, Vec<(u64, f64)>> = Default::default();
        for c in &v.checked {
            let per_gpu: Vec<&str> = c.layout.split(' ').filter(|t| !t.starts_with("DP") && !t.starts_with("GBS")).collect();
            let key = format!("{} {} {} {} {}", c.model, c.gpu, c.precision, per_gpu.join(" "), c.source);
            series.entry(key).or_default().push((u64::from(c.gpus), (c.predicted_step_s / c.published_step_s).ln()));
        }
        let d: Vec<f64> = series
            .values()
            .filter_map(|s| {
                let lo = s.iter().min_by_key(|x| x.0)?;
                let hi = s.iter().max_by_key(|x| x.0)?;
                (hi.0 >= 4 * lo.0).then_some(lo.1 - hi.1)
            })
            .collect();
        assert!(d.len() >= 6, "{} series", d.len());
        d.iter().sum::<f64>() / d.len() as f64
    };
    let shipped = Profiles::builtin();
    let mut none = shipped.clone();
    none.gpus.iter_mut().for_each(|g| g.efficiency.straggler = 0.0);
    let (with, without) = (drift(&shipped), drift(&none));
    assert!(without > 0.015, "without stragglers the model should miss the drift: {without}");
    assert!(with.abs() < 0.0075, "with the shipped spread: {with}");
    // The term itself: the same per-GPU step at 8 and 1,024 GPUs.
    let mut p = projector("llama3.1-8b", 8192, "h100", Recipe::Bf16);
    let sigma = p.gpu.efficiency.straggler;
    assert!((0.01..0.05).contains(&sigma), "{sigma}");
    let (a, b) = (p.project(&layout(1, 1, 1, 1, 8, 1, 64)).unwrap(), p.project(&layout(1, 1, 1, 1, 1024, 1, 8192)).unwrap());
    assert_eq!((a.gpus, b.gpus, a.breakdown.straggler), (8, 1024, 0.0));
    let rest = b.step_time_s - b.breakdown.straggler;
    let want = sigma * (runner_project::step::expected_max_normal(1024) - runner_project::step::expected_max_normal(8));
    assert!((b.breakdown.straggler / rest - want).abs() < 1e-12, "{} vs {want}", b.breakdown.straggler / rest);
}

/// A low-precision GEMM weight keeps two casts through the step, the row-wise one the
/// forward reads and the transposed one the input gradient reads (Transformer Engine's
/// FP8 transpose on Hopper, MXFP8's two block layouts on Blackwell): 2 bytes per element
/// in FP8, 2·(1 + 1/32) in MXFP8, beside the BF16 weight. With FP8 parameters under the
/// distributed optimizer, the FP8 copy and its transpose replace the BF16 weight (2 bytes
/// for 2).
#[test]
fn low_precision_weights_keep_their_row_wise_and_transposed_casts() {
    let l = LayoutSpec { distributed_optimizer: false, ..layout(2, 1, 1, 1, 4, 1, 64) };
    let weights = |recipe: Recipe, l: &LayoutSpec| projector("llama3.1-8b", 8192, "b200", recipe).project(l).unwrap().memory.weights;
    let bf16 = weights(Recipe::Bf16, &l);
    let fp8 = weights(Recipe::Fp8Cs, &l) - bf16;
    let mxfp8 = weights(Recipe::Mxfp8, &l) - bf16;
    assert!(fp8 > 0.5, "{fp8} GiB of casts");
    assert!((mxfp8 / fp8 - 1.0 - 1.0 / 32.0).abs() < 1e-9, "MXFP8 {mxfp8} GiB against FP8 {fp8}");
    // FP8 casts cover the GEMM weights of every layer: each FP8 element holds 2 bytes.
    let p = projector("llama3.1-8b", 8192, "b200", Recipe::Fp8Cs);
    let elems = p.model.depth.len() as f64 * 4096.0 * (4096.0 + 2.0 * 1024.0 + 4096.0 + 3.0 * 14_336.0) / 2.0;
    assert!((fp8 * 1024f64.powi(3) / (2.0 * elems) - 1.0).abs() < 0.01, "{fp8} GiB for {elems} elements per GPU");
    let dist = LayoutSpec { distributed_optimizer: true, ..l };
    assert!((weights(Recipe::Fp8Cs, &dist) - weights(Recipe::Bf16, &dist)).abs() < 1e-9, "FP8 parameters: 2 bytes for 2");
}

/// The built-in plans run every linear inside the transformer layers in the recipe's
/// format and keep in BF16 what Transformer Engine and Megatron's recipes keep there:
/// the embedding and every vocabulary-parallel output head (the MTP module's too), and
/// the MoE routers' GEMMs (DeepSeek-V3 report §3.3); NVFP4 also keeps the last four
/// transformer layers (Megatron-Bridge's NVFP4 recipe), not the first.
#[test]
fn builtin_plans_keep_heads_routers_and_the_nvfp4_tail_in_bf16() {
    use runner_project::profile::GemmFormat;
    let (_, mut src) = common::Native.resolve("deepseek-tiny", 256).unwrap();
    let g = src.graph(1).unwrap();
    let router_inputs: Vec<usize> = g.ops.iter().filter(|o| o.kind == OpKind::Router).map(|o| o.inputs[0]).collect();
    let gemms: Vec<_> = g.ops.iter().filter(|o| matches!(o.kind, OpKind::Linear | OpKind::GroupedLinear)).collect();
    let is_router = |o: &&runner_graph::Op| o.outputs.iter().any(|t| router_inputs.contains(t));
    let is_head = |o: &&runner_graph::Op| o.role == Role::VocabParallel;
    assert!(gemms.iter().any(is_router), "the case the test means: a router GEMM");
    assert!(gemms.iter().any(|o| is_head(o) && o.layer >= 0), "the case the test means: an MTP head");
    let fp8 = Plan::builtin(Recipe::Fp8, &g);
    for o in &gemms {
        let want = if is_router(o) || is_head(o) || o.layer < 0 { GemmFormat::Bf16 } else { GemmFormat::Fp8 };
        assert_eq!(fp8.formats(&o.name), [want; 3], "{} (layer {})", o.name, o.layer);
    }
    // NVFP4 over Llama 3.1 8B's 32 layers.
    let (_, mut src) = common::Native.resolve("llama3.1-8b", 256).unwrap();
    let g = src.graph(1).unwrap();
    let d = depth::analyse(&g);
    let nvfp4 = Plan::builtin(Recipe::Nvfp4, &g);
    let layer_format = |p: usize| {
        let names = &d.gemm_names[p];
        assert!(!names.is_empty());
        let f: Vec<SiteFormats> = names.iter().map(|n| nvfp4.formats(n)).collect();
        assert!(f.windows(2).all(|w| w[0] == w[1]), "layer {p}: {f:?}");
        f[0][0]
    };
    let n = d.len();
    assert!(n > 4, "{n} layers");
    for p in 0..n {
        let want = if p + 4 >= n { GemmFormat::Bf16 } else { GemmFormat::Nvfp4 };
        assert_eq!(layer_format(p), want, "layer {p} of {n}");
    }
}

/// LoRA adapters stay in BF16 under a low-precision built-in plan, as `Plan::builtin`
/// documents; the frozen base linears of the transformer layers take the recipe's format.
/// (Under a mutation that put adapters in FP8, every test passed.)
#[test]
fn builtin_plans_keep_lora_adapters_in_bf16() {
    use runner_project::profile::GemmFormat;
    let (_, inner) = common::Native.resolve("llama3-tiny", 256).unwrap();
    let mut src = TrainedSource { inner, training: Training::Lora(Lora::default()) };
    let g = src.graph(1).unwrap();
    let fp8 = Plan::builtin(Recipe::Fp8, &g);
    let (mut adapters, mut base) = (0, 0);
    for o in g.ops.iter().filter(|o| matches!(o.kind, OpKind::Linear | OpKind::GroupedLinear)) {
        if runner_graph::peft::is_adapter(o) {
            adapters += 1;
            assert_eq!(fp8.formats(&o.name), [GemmFormat::Bf16; 3], "adapter {}", o.name);
        } else if o.layer >= 0 && o.role != Role::VocabParallel {
            base += 1;
            assert_eq!(fp8.formats(&o.name), [GemmFormat::Fp8; 3], "base linear {}", o.name);
        }
    }
    assert!(adapters > 0 && base > 0, "the case the test means: {adapters} adapters, {base} base linears");
}

/// A plugin's plan may set each role of a GEMM apart: its coverage counts the three GEMMs
/// of every linear (forward, input and weight gradient) at their own formats. Every linear
/// with its forward and input gradient in FP8 and its weight gradient in BF16 is two
/// thirds FP8; the low-precision share counts the FP8 part alone. (A coverage that read
/// the forward's format alone, and a share that counted BF16 in, passed every test.)
#[test]
fn a_plans_coverage_counts_each_role_at_its_format() {
    use runner_project::precision::GemmRole;
    use runner_project::profile::GemmFormat;
    let (_, mut src) = common::Native.resolve("llama3-tiny", 256).unwrap();
    let g = src.graph(1).unwrap();
    let linears: Vec<String> =
        g.ops.iter().filter(|o| matches!(o.kind, OpKind::Linear | OpKind::GroupedLinear)).map(|o| o.name.clone()).collect();
    let answers = linears.iter().flat_map(|n| {
        [(n.clone(), GemmRole::Forward, GemmFormat::Fp8), (n.clone(), GemmRole::InputGradient, GemmFormat::Fp8)]
    });
    let plan = Plan::from_sites(Recipe::Fp8, "test", &g, answers);
    assert_eq!(plan.formats(&linears[0]), [GemmFormat::Fp8, GemmFormat::Fp8, GemmFormat::Bf16]);
    let share = |f: GemmFormat| plan.coverage.iter().find(|c| c.0 == f).map_or(0.0, |c| c.1);
    assert!((share(GemmFormat::Fp8) - 2.0 / 3.0).abs() < 1e-12, "{:?}", plan.coverage);
    assert!((share(GemmFormat::Bf16) - 1.0 / 3.0).abs() < 1e-12, "{:?}", plan.coverage);
    assert!((plan.low_precision_share() - 2.0 / 3.0).abs() < 1e-12, "{}", plan.low_precision_share());
    assert_eq!(plan.coverage.len(), 2, "no format listed at a share of 0: {:?}", plan.coverage);
}

/// The verdicts of a search, in the order the output lists them: the winner's family, then
/// the slower ones by how much slower (the factor their best layout's step time over the
/// winner's, never below 1), then memory, then divisibility, each kind by name. A layout
/// without a pipeline has nothing to split, so none is offered with the embedding or the
/// loss counted as a layer.
#[test]
fn search_verdicts_name_the_factor_in_order() {
    let mut pr = projector("llama3.1-8b", 8192, "h100", Recipe::Bf16);
    let f = search::search(&mut pr, 8, 64, &Space::default(), 2000);
    let w = f.best[0].step_time_s;
    let rank = |v: &Verdict| match v {
        Verdict::Best { .. } => 0,
        Verdict::Speed { .. } => 1,
        Verdict::HostMemory { .. } => 2,
        Verdict::Memory { .. } => 3,
        Verdict::Divisibility { .. } => 4,
    };
    let mut speeds = 0;
    for fam in &f.families {
        if let Verdict::Speed { step_time_s, slower, .. } = fam.verdict {
            assert_eq!(slower, step_time_s / w, "{}", fam.name);
            assert!(slower >= 1.0, "{}: {slower}", fam.name);
            speeds += 1;
        }
    }
    assert!(speeds >= 2, "{:?}", f.families);
    assert!(matches!(f.families[0].verdict, Verdict::Best { .. }));
    assert!(f.best.iter().filter(|p| p.layout.pp == 1).all(|p| p.layout.split.is_even()), "a split without a pipeline");
    assert!(f.best.iter().any(|p| p.layout.pp == 1));
    // Llama 3.1 405B on 8 GPUs: memory (least first) and divisibility (tp·cp of 16 on 8 GPUs).
    let mut pr = projector("llama3.1-405b", 8192, "h100", Recipe::Bf16);
    let big = search::search(&mut pr, 8, 16, &Space::default(), 5).families;
    assert!(big.iter().filter(|fam| rank(&fam.verdict) == 3).count() >= 2, "{big:?}");
    // What comes closest recomputes every layer, named so (no count of layers).
    for fam in &big {
        if let Verdict::Memory { layout, .. } = &fam.verdict {
            assert!(layout.ends_with(" RC-full"), "{}: {layout}", fam.name);
        }
    }
    // Llama 3.1 8B on 6 GPUs at 3 sequences a step: the batch does not divide by dp 6.
    let mut pr = projector("llama3.1-8b", 8192, "h100", Recipe::Bf16);
    let odd = search::search(&mut pr, 6, 3, &Space::default(), 5).families;
    assert!(odd.iter().filter(|fam| rank(&fam.verdict) == 4).count() >= 2, "{odd:?}");
    for pair in f.families.windows(2).chain(big.windows(2)).chain(odd.windows(2)) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(rank(&a.verdict) <= rank(&b.verdict), "{} before {}", a.name, b.name);
        match (&a.verdict, &b.verdict) {
            (Verdict::Speed { slower: x, .. }, Verdict::Speed { slower: y, .. }) => assert!(x <= y, "{} before {}", a.name, b.name),
            (Verdict::Memory { need_gib: x, .. }, Verdict::Memory { need_gib: y, .. }) => assert!(x <= y, "{} before {}", a.name, b.name),
            (Verdict::Divisibility { .. }, Verdict::Divisibility { .. }) => assert!(a.name < b.name, "{} before {}", a.name, b.name),
            _ => {}
        }
    }
}

/// FSDP shards over dp·cp, so it is searched where cp > 1 even without data parallelism
/// (TP4 CP2 on 8 GPUs), and its family is named FSDP, not also DP, where dp > 1.
#[test]
fn the_search_shards_fsdp_over_cp_alone() {
    let mut pr = projector("llama3.1-8b", 8192, "h100", Recipe::Bf16);
    let space = Space { tp: Some(4), cp: Some(2), fsdp: Some(true), ..Space::default() };
    let f = search::search(&mut pr, 8, 16, &Space { pp: Some(1), ..space.clone() }, 3);
    assert!(!f.best.is_empty() && f.best.iter().all(|p| p.layout.fsdp && p.layout.cp == 2 && p.layout.dp == 1), "{:?}", f.families);
    let f = search::search(&mut pr, 16, 32, &Space { pp: Some(1), ..space }, 3);
    assert!(f.best.iter().all(|p| p.layout.dp == 2));
    let names: Vec<&str> = f.families.iter().map(|fam| fam.name.as_str()).collect();
    assert_eq!(names, ["TP+CP+FSDP"]);
}

/// The search's pipelines reach the model's depth (Llama 3.1 8B's 32 layers on PP32, one a
/// stage) and the interleaving fills every chunk where the embedding and the loss count as
/// layers (Llama 3.1 405B's 126 + 2 units on PP16 VP8, Megatron-Bridge's recipe).
#[test]
fn the_search_reaches_one_layer_per_chunk() {
    let mut pr = projector("llama3.1-8b", 8192, "h100", Recipe::Bf16);
    let f = search::search(&mut pr, 32, 64, &Space { tp: Some(1), cp: Some(1), mbs: Some(1), fsdp: Some(false), ..Space::default() }, 2000);
    assert!(f.best.iter().any(|p| p.layout.pp == 32), "{:?}", f.best.iter().map(|p| p.layout.short()).collect::<Vec<_>>());
    let mut pr = projector("llama3.1-405b", 8192, "h100", Recipe::Bf16);
    let space = Space { tp: Some(8), pp: Some(16), cp: Some(1), mbs: Some(1), fsdp: Some(false), ..Space::default() };
    let f = search::search(&mut pr, 256, 512, &space, 2000);
    assert!(f.best.iter().any(|p| p.layout.vp == 8 && p.layout.split == runner_graph::pipeline::PipelineSplit::megatron(true, true)), "{:?}", f.best.iter().map(|p| p.layout.short()).collect::<Vec<_>>());
}

/// Selective recompute frees the named modules in the head side's layers too: DeepSeek's
/// multi-token-prediction module runs a transformer layer of its own (Megatron-Core's
/// multi_token_prediction.py builds it as a TransformerLayer), whose two norm outputs
/// (attention and MLP input, s x h in BF16) the `layernorm` module frees as in every
/// decoder layer. DeepSeek's proxy at s = h = 256, one stage: 4 decoder layers and the
/// MTP layer, 5 x 2 norm outputs freed.
#[test]
fn selective_layernorm_frees_the_multi_token_prediction_layers_norms_too() {
    let mut pr = projector("deepseek-tiny", 256, "h100", Recipe::Bf16);
    assert_eq!((pr.model.shape.layers, pr.model.shape.mtp, pr.model.shape.hidden), (4, 1, 256));
    let none = layout(1, 1, 1, 1, 1, 1, 1);
    let norms = LayoutSpec { recompute: RecomputePolicy::Selective, recompute_modules: Modules::of(&[Module::Layernorm]), ..none };
    let (a, b) = (pr.project(&none).unwrap(), pr.project(&norms).unwrap());
    let slack = 1.0 + pr.gpu.efficiency.allocator_slack;
    let want = (4.0 + 1.0) * 2.0 * (256.0 * 256.0 * 2.0) * slack / (1u64 << 30) as f64;
    let got = a.memory.activations - b.memory.activations;
    assert!((got / want - 1.0).abs() < 1e-9, "{got} vs {want}");
}

/// H20 is H100's die at 148 of 989 dense BF16 TFLOP/s with 4.0 TB/s of HBM against
/// 3.35, and takes H100's efficiencies: on one layout (Llama 3.1 70B, BF16, TP8 PP4,
/// 32 GPUs) its GEMMs and attention take about the peak ratio (6.7x) longer, while its
/// memory-bound kernels (norms, activations, casts) run faster, by about the HBM ratio.
#[test]
fn h20_is_slower_than_h100_by_the_peak_ratio_on_gemms_only() {
    let lay = LayoutSpec { recompute: RecomputePolicy::Full, ..layout(8, 4, 1, 1, 1, 1, 32) };
    let on = |gpu: &str| projector("llama3.1-70b", 8192, gpu, Recipe::Bf16).project(&lay).unwrap();
    let (h100, h20) = (on("h100"), on("h20"));
    let peak_ratio = 989.0 / 148.0;
    let (a, b) = (h100.breakdown.compute_parts, h20.breakdown.compute_parts);
    let gemm = b.gemm / a.gemm;
    assert!(gemm > 0.95 * peak_ratio && gemm <= peak_ratio * (1.0 + 1e-9), "GEMMs {gemm:.2}x slower, peaks {peak_ratio:.2}x");
    let attention = b.attention / a.attention;
    assert!((attention / peak_ratio - 1.0).abs() < 0.05, "attention {attention:.2}x slower");
    let rest = |p: &Projection| p.breakdown.compute - p.breakdown.compute_parts.gemm - p.breakdown.compute_parts.attention;
    let memory = rest(&h20) / rest(&h100);
    assert!(memory < 1.0 && (memory / (3350.0 / 4000.0) - 1.0).abs() < 0.05, "memory-bound work {memory:.3}x");
    // The step as a whole lands between: GEMM-bound, so several times slower.
    let step = h20.step_time_s / h100.step_time_s;
    assert!(step > 4.0 && step < peak_ratio, "step {step:.2}x");
}
