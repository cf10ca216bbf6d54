//! The layout search on proxy models small enough that every layout fits: which degrees
//! it tries (every one its doc names, up to their stated bounds) and which it refuses; and
//! the verdict on a layout only offloading could fit.

mod common;

use std::collections::BTreeSet;

use runner_project::precision::Recipe;
use runner_project::search::{self, Family, Found, Space, Verdict};

use common::projector;

/// Every layout that fits, with `space` (a top far past the layouts there are).
fn all(model: &str, seq: u32, gpus: u32, gbs: u32, space: &Space) -> Found {
    let mut pr = projector(model, seq, "h100", Recipe::Bf16);
    search::search(&mut pr, gpus, gbs, space, 1_000_000)
}

/// Llama 3 tiny (4 layers, 8 heads, 2 kv heads, sequence 256) on 16 GPUs: the search tries
/// cp up to 16 (the sequence splits into 2·cp chunks), mbs up to 8, pp up to the layers,
/// vp up to the layers plus the embedding and the loss over pp, FSDP beside the
/// distributed optimizer (also where cp alone shards it), tp up to the kv heads; every
/// layout is on the 16 GPUs.
#[test]
fn the_search_tries_every_degree_up_to_its_bounds() {
    let f = all("llama3-tiny", 256, 16, 64, &Space::default());
    assert!(!f.best.is_empty());
    let set = |g: &dyn Fn(&runner_project::step::LayoutSpec) -> u32| f.best.iter().map(|p| g(&p.layout)).collect::<BTreeSet<u32>>();
    assert_eq!(set(&|l| l.tp), BTreeSet::from([1, 2]), "tp divides the 2 kv heads");
    assert_eq!(set(&|l| l.cp), BTreeSet::from([1, 2, 4, 8, 16]));
    assert_eq!(set(&|l| l.mbs), BTreeSet::from([1, 2, 4, 8]));
    assert_eq!(set(&|l| l.pp), BTreeSet::from([1, 2, 4]), "pp up to the 4 layers");
    let pvs: BTreeSet<(u32, u32)> = f.best.iter().map(|p| (p.layout.pp, p.layout.vp)).collect();
    // 4 layers, the embedding and the loss: 6 units, so PP2 runs up to 3 chunks a stage.
    assert_eq!(pvs, BTreeSet::from([(1, 1), (2, 1), (2, 2), (2, 3), (4, 1)]));
    assert!(f.best.iter().any(|p| p.layout.fsdp) && f.best.iter().any(|p| !p.layout.fsdp));
    // FSDP shards over dp·cp: one data-parallel rank with cp is sharded, one rank of neither is not.
    assert!(f.best.iter().any(|p| p.layout.fsdp && p.layout.dp == 1 && p.layout.cp > 1));
    assert!(!f.best.iter().any(|p| p.layout.fsdp && p.layout.dp * p.layout.cp == 1));
    assert!(f.best.iter().all(|p| p.layout.gpus() == 16 && p.fits));
}

/// A tp·cp that does not divide the GPUs is a refusal of its own kind
/// ([`search::Refusal::StageCount`]), which `explore` sets apart by kind, not by its
/// words; every other refusal (here a pp that does not divide) is of another.
#[test]
fn a_stage_that_does_not_divide_the_gpus_is_refused_as_its_own_kind() {
    let f = all("llama3-tiny", 256, 8, 64, &Space { pp: Some(3), ..Space::default() });
    let refused: Vec<(&str, search::Refusal)> = f
        .families
        .iter()
        .filter_map(|fam| match &fam.verdict {
            Verdict::Divisibility { reason, kind } => Some((reason.as_str(), *kind)),
            _ => None,
        })
        .collect();
    assert!(refused.contains(&("tp·cp = 16 does not divide 8 GPUs", search::Refusal::StageCount)), "{refused:?}");
    assert!(refused.iter().any(|&(r, k)| r.starts_with("pp=3 does not divide") && k == search::Refusal::Other), "{refused:?}");
    for (reason, kind) in refused {
        assert_eq!(kind == search::Refusal::StageCount, reason.starts_with("tp·cp = "), "{reason}");
    }
    // The kind is not in the JSON: `reason` says it.
    let json = serde_json::to_value(&f.families).unwrap();
    assert!(json.as_array().unwrap().iter().all(|fam| fam.get("kind").is_none()), "{json}");
}

/// An MoE model's ep divides its experts up to the GPUs, the GPUs included: Mixtral tiny's
/// 8 experts on 8 GPUs take ep 1, 2, 4 and 8.
#[test]
fn the_search_tries_ep_up_to_the_gpus() {
    let f = all("mixtral-tiny", 256, 8, 64, &Space { tp: Some(1), cp: Some(1), pp: Some(1), mbs: Some(1), fsdp: Some(false), ..Space::default() });
    let eps: BTreeSet<u32> = f.best.iter().map(|p| p.layout.ep).collect();
    assert_eq!(eps, BTreeSet::from([1, 2, 4, 8]));
}

/// A pp fixed on the command line that does not divide the GPUs tp·cp leave is refused
/// by name, not priced on fewer GPUs; families of one standing are listed by name.
#[test]
fn a_fixed_pp_that_does_not_divide_the_gpus_is_refused() {
    let f = all("llama3-tiny", 256, 8, 64, &Space { pp: Some(3), ..Space::default() });
    assert!(f.best.is_empty(), "{:?}", f.best.iter().map(|p| p.layout.short()).collect::<Vec<_>>());
    assert!(
        f.families.iter().any(|fam| matches!(&fam.verdict, Verdict::Divisibility { reason, .. } if reason.starts_with("pp=3 does not divide the 8 GPUs"))),
        "{:?}",
        f.families
    );
    assert!(f.families.iter().all(|fam| matches!(fam.verdict, Verdict::Divisibility { .. })));
    // Found in the order tp, cp (PP, PP+CP, CP: cp 16 does not divide 8, TP+PP, ...).
    let names: Vec<&str> = f.families.iter().map(|fam| fam.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted);
    assert!(names.contains(&"CP") && names.contains(&"PP+CP"), "{names:?}");
}

/// With pp fixed and vp free, a vp whose split Megatron-Core's flags cannot build is
/// refused rather than priced with a layout string: Llama 3.1 8B's 32 layers on PP4
/// build VP 1, 2, 4 and 8 but not 3; on PP2, vp reaches 16 chunks a stage (one layer each).
#[test]
fn a_fixed_pp_with_vp_free_prices_only_the_splits_megatron_builds_up_to_16_chunks() {
    let vps = |pp: u32| {
        let space = Space { tp: Some(1), cp: Some(1), pp: Some(pp), mbs: Some(1), fsdp: Some(false), ..Space::default() };
        let f = all("llama3.1-8b", 8192, 8, 64, &space);
        let (mut flags, mut laid) = (BTreeSet::new(), BTreeSet::new());
        for p in &f.best {
            // The flags' splits need no layout string; the others count the embedding as
            // one layer and the head as three: 36 units.
            match &p.pipeline_model_parallel_layout {
                None => flags.insert(p.layout.vp),
                Some(text) => {
                    assert_eq!((p.layout.split.embedding, p.layout.split.loss), (1, 3), "{}: {text}", p.layout.short());
                    laid.insert(p.layout.vp)
                }
            };
        }
        (flags, laid)
    };
    // 32 layers: the flags build VP1, 2, 4 and 8 at PP4; 36 units (the embedding as one,
    // the head as three) split evenly into 12 chunks of 3 at VP3, and at VP9 into 36 of
    // one, too few for the head's three: refused. At PP2, 6 and 12 chunks (VP3, VP6).
    assert_eq!(vps(4), (BTreeSet::from([1, 2, 4, 8]), BTreeSet::from([3])));
    assert_eq!(vps(2), (BTreeSet::from([1, 2, 4, 8, 16]), BTreeSet::from([3, 6])));
}

/// Where the user fixed pp, every split a layout string builds is priced, not only the
/// first: DeepSeek-V3's 61 layers on PP16 make 64 units with the embedding as none and the
/// head as three (E0L3, the search's first choice) or the embedding as one and the head
/// as two (E1L2, NeMo's PP16 script), and the even split is priced beside them. With pp
/// free, only E0L3 is.
#[test]
fn a_fixed_pp_prices_every_split_a_layout_string_builds() {
    let mut pr = projector("deepseek-v3-671b", 4096, "h800", Recipe::Fp8);
    let mut splits = |pp: Option<u32>| {
        let space = Space { tp: Some(1), cp: Some(1), pp, vp: Some(1), ep: Some(64), mbs: Some(1), fsdp: Some(false), ..Space::default() };
        let f = search::search(&mut pr, 2048, 15360, &space, 1_000_000);
        f.best.iter().filter(|p| p.layout.pp == 16).map(|p| (p.layout.split.embedding, p.layout.split.loss)).collect::<BTreeSet<_>>()
    };
    assert_eq!(splits(Some(16)), BTreeSet::from([(0, 0), (0, 3), (1, 2)]));
    assert_eq!(splits(None), BTreeSet::from([(0, 3)]));
}

/// Under DualPipe rank r holds stage r and stage pp-1-r, so a split and its mirror (the
/// embedding counted as a layer and not the loss, or the loss and not the embedding) put
/// the same layers on every rank and project alike: the search prices one of them, where
/// it listed both as two layouts of one figure. Under 1F1B both stay (DeepSeek-V3's 61
/// layers at PP2: 62 units either way).
#[test]
fn dualpipe_prices_one_of_two_mirrored_splits() {
    use runner_graph::pipeline::PipelineSplit;
    use runner_project::step::PipelineKind;
    let mut pr = projector("deepseek-v3-671b", 4096, "h800", Recipe::Fp8);
    let (e1l0, e0l1) = (PipelineSplit::megatron(true, false), PipelineSplit::megatron(false, true));
    let splits = |pr: &mut runner_project::project::Projector, pipeline: PipelineKind| {
        let space = Space { tp: Some(4), cp: Some(1), pp: Some(2), vp: Some(1), ep: Some(64), mbs: Some(1), fsdp: Some(false), pipeline, ..Space::default() };
        let f = search::search(pr, 2048, 15360, &space, 1_000_000);
        assert!(!f.best.is_empty(), "{:?}", f.families.iter().map(|x| format!("{:?}", x.verdict)).collect::<Vec<_>>());
        f.best.iter().map(|p| (p.layout.split.embedding, p.layout.split.loss)).collect::<BTreeSet<_>>()
    };
    assert_eq!(splits(&mut pr, PipelineKind::OneFOneB), BTreeSet::from([(1, 0), (0, 1)]));
    assert_eq!(splits(&mut pr, PipelineKind::DualPipe), BTreeSet::from([(1, 0)]));
    let mut l = common::layout(4, 2, 1, 1, 256, 1, 15360);
    l.ep = 64;
    l.pipeline = PipelineKind::DualPipe;
    l.recompute = runner_graph::recompute::RecomputePolicy::Full;
    let (a, b) = (pr.project(&runner_project::step::LayoutSpec { split: e1l0, ..l }).unwrap(), pr.project(&runner_project::step::LayoutSpec { split: e0l1, ..l }).unwrap());
    assert_eq!((a.step_time_s, a.memory.total), (b.step_time_s, b.memory.total), "mirrored splits under DualPipe");
}

/// `--pipeline-schedule dualpipev` searches pp ≥ 2 with no virtual pipeline, an odd pp
/// included (unlike DualPipe's): Llama 3.1 8B's 32 layers on 24 GPUs split over 2·pp
/// stages, pp 3 as 36 units (the embedding as one, the head as three, a layout string)
/// over 6 stages; pp 1, and pp 24 (no split of 32 layers over 48 stages), are refused
/// by name.
#[test]
fn dualpipev_searches_every_pp_from_two_without_a_virtual_pipeline() {
    use runner_project::step::PipelineKind;
    let space = Space { tp: Some(1), cp: Some(1), mbs: Some(1), fsdp: Some(false), pipeline: PipelineKind::DualPipeV, ..Space::default() };
    let f = all("llama3.1-8b", 8192, 24, 48, &space);
    assert!(f.best.iter().all(|p| p.layout.pipeline == PipelineKind::DualPipeV && p.layout.vp == 1), "a virtual pipeline or another schedule");
    let pps: BTreeSet<u32> = f.best.iter().map(|p| p.layout.pp).collect();
    assert!(pps.contains(&3) && !pps.contains(&1), "{pps:?}");
    let three = f.best.iter().find(|p| p.layout.pp == 3).unwrap();
    assert_eq!((three.layout.split.embedding, three.layout.split.loss), (1, 3), "{}", three.layout.short());
    assert_eq!(three.pipeline_model_parallel_layout.as_deref(), Some("Et*5|(t*6|)*4t*3L"));
    let reasons: Vec<&str> = f.families.iter().filter_map(|fam| match &fam.verdict { Verdict::Divisibility { reason, .. } => Some(reason.as_str()), _ => None }).collect();
    assert!(reasons.iter().any(|r| r.contains("DualPipeV needs pp ≥ 2")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("no split at pp=24 (DualPipeV's 2·pp stages)")), "{reasons:?}");
}

/// A layout that fits the GPU neither as it is nor with every layer recomputed, but would
/// by offloading activations to a host too small for them, is reported short of host
/// memory (the closer miss, and what stands in the way), not of GPU memory: Llama 3.1 8B
/// at 4 sequences a micro-batch on one GB200 held to 137.8 GiB (every layer recomputed
/// needs 139.8, every layer offloaded 135.9) with 50 GiB of host memory.
#[test]
fn a_layout_only_offload_could_fit_is_reported_short_of_host_memory() {
    let mut pr = projector("llama3.1-8b", 8192, "gb200", Recipe::Bf16);
    pr.gpu.memory_gib = 137.8;
    pr.gpu.host_memory_gib = Some(50.0);
    let space = Space { tp: Some(1), pp: Some(1), cp: Some(1), mbs: Some(4), fsdp: Some(false), ..Space::default() };
    let f = search::search(&mut pr, 1, 4, &space, 1);
    assert!(f.best.is_empty());
    match &f.families[..] {
        [Family { verdict: Verdict::HostMemory { layout, need_gib, have_gib }, .. }] => {
            assert!(*need_gib > *have_gib && *have_gib == 50.0, "{need_gib} GiB on a host of {have_gib}");
            assert!(layout.contains("OFFLOAD:"), "{layout}");
        }
        other => panic!("{other:?}"),
    }
}

/// Llama 3.1 405B on 256 H100 at 2,048 sequences, the whole search: with the PCIe link
/// to the offload copies alone, it picks FSDP offloading most layers (an audit found 111
/// of 126 at 58 % MFU, above NVIDIA's best published layout); with FSDP's gathers and
/// reduce-scatters sharing that link, as on an HGX board, it offloads a layer or two
/// beside a pipeline, and the step it picks is slower.
#[test]
fn sharing_the_pcie_link_with_fsdp_traffic_makes_offload_less_attractive() {
    let best = |shared: bool| {
        let mut pr = projector("llama3.1-405b", 8192, "h100", Recipe::Bf16);
        pr.gpu.nic_shares_host_link = shared;
        let f = search::search(&mut pr, 256, 2048, &Space::default(), 1);
        f.best.into_iter().next().expect("a layout fits")
    };
    let (alone, shared) = (best(false), best(true));
    assert!(alone.layout.fsdp && alone.layout.offload_layers > 100, "{}", alone.layout.short());
    assert!(shared.layout.offload_layers <= 2, "{}", shared.layout.short());
    assert!(shared.step_time_s > alone.step_time_s, "{} s against {} s", shared.step_time_s, alone.step_time_s);
}

/// The search's shortcuts in projecting one schedule give what projecting it whole gives,
/// bit for bit (compared as JSON, shortest round-trip floats): a layout staged for its
/// memory first and its times added to the same stages (`evaluate_where` that wants it),
/// a memory alone (`memory_of`), and stages taken from the vector the schedule before
/// left (pipelines of 16, 2 and 4 stages in turn, each projected again after the others).
/// Schedules: 1F1B with and without a virtual pipeline and an uneven split, selective
/// recompute of several module lists, full recompute of some layers of a chunk and of
/// all, offload with and without recompute, FSDP, Muon, DualPipe and DualPipeV.
#[test]
fn a_layout_projected_in_parts_is_the_layout_projected_whole() {
    use runner_graph::modules::{Module, Modules};
    use runner_graph::pipeline::PipelineSplit;
    use runner_graph::recompute::RecomputePolicy;
    use runner_project::step::{Optimizer, PipelineKind, Schedule};
    use runner_project::template::ShardKey;

    let mut pr = projector("deepseek-v3-671b", 4096, "gb200", Recipe::Fp8);
    let key = ShardKey { tp: 2, cp: 1, ep: 8, etp: 1, sp: true, mbs: 1 };
    let kernels = Default::default();
    let c = pr.costed(key, kernels).unwrap();
    let plain = Schedule {
        pp: 4,
        vp: 1,
        dp: 8,
        global_batch: 1024,
        recompute: RecomputePolicy::None,
        recompute_layers: 0,
        recompute_modules: Modules::EMPTY,
        distributed_optimizer: true,
        fsdp: false,
        tp_overlap: true,
        ep_overlap: true,
        dp_overlap: true,
        grad_fp32: false,
        kernels,
        split: PipelineSplit::default(),
        offload_layers: 0,
        optimizer: Optimizer::default(),
        pipeline: PipelineKind::default(),
    };
    let selective = |m: &[Module]| Schedule { recompute: RecomputePolicy::Selective, recompute_modules: Modules::of(m), ..plain };
    let schedules = [
        Schedule { pp: 16, dp: 4, ..plain },
        Schedule { pp: 2, dp: 16, ..plain },
        plain,
        Schedule { vp: 2, split: PipelineSplit::megatron(true, true), ..plain },
        Schedule { pp: 4, vp: 4, split: PipelineSplit { embedding: 0, loss: 3 }, ..plain },
        selective(&[Module::Layernorm, Module::MoeAct]),
        selective(&[Module::MlaUpProj, Module::Mlp, Module::SharedExperts]),
        Schedule { recompute: RecomputePolicy::Full, recompute_layers: 3, ..plain },
        Schedule { recompute: RecomputePolicy::Full, ..plain },
        Schedule { offload_layers: 5, ..plain },
        Schedule { offload_layers: 2, recompute: RecomputePolicy::Full, recompute_layers: 4, vp: 2, ..plain },
        Schedule { offload_layers: 3, ..selective(&[Module::MlaUpProj]) },
        Schedule { fsdp: true, distributed_optimizer: false, ..plain },
        Schedule { optimizer: Optimizer::Muon, ..plain },
        Schedule { pipeline: PipelineKind::DualPipe, ..plain },
        Schedule { pipeline: PipelineKind::DualPipeV, recompute: RecomputePolicy::Full, recompute_layers: 2, ..plain },
        Schedule { pipeline: PipelineKind::DualPipeV, offload_layers: 1, ..plain },
    ];
    let json = |p: &runner_project::step::Projection| serde_json::to_string(p).unwrap();
    let whole: Vec<String> = schedules.iter().map(|s| json(&c.evaluate(s).unwrap())).collect();
    for round in 0..2 {
        for (s, want) in schedules.iter().zip(&whole) {
            let staged = c.evaluate_where(s, |_| true).unwrap().unwrap();
            assert_eq!(&json(&staged), want, "round {round}: {s:?}");
            let memory = c.memory_of(s).unwrap();
            assert_eq!(serde_json::to_string(&memory).unwrap(), serde_json::to_string(&c.evaluate(s).unwrap().memory).unwrap(), "{s:?}");
            assert_eq!(&json(&c.evaluate(s).unwrap()), want, "round {round}, projected again: {s:?}");
            // Not wanted: the memory alone, the same.
            let refused = c.evaluate_where(s, |_| false).unwrap().unwrap_err();
            assert_eq!(serde_json::to_string(&refused).unwrap(), serde_json::to_string(&memory).unwrap());
        }
    }
    // The first schedule, projected first in this thread, projected again after all the
    // others (a stage vector left by a longer pipeline is emptied, not added to).
    assert_eq!(json(&c.evaluate(&schedules[0]).unwrap()), whole[0]);
}
