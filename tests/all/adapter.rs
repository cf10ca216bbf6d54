//! Plugins built against the published contracts 0.1.0 and 0.2.0 (tests/programs/
//! contract-v01-* and contract-v02-*, built from tests/wit-0.1.0 and tests/wit-0.2.0 with
//! no SDK) keep working: the host binds them beside 0.3.0 and adapts their answers, with
//! defaults for what an older contract cannot say (0.1 -> 0.2 -> 0.3).

use runner::plugin::cost::PriceCaveat;
use runner::plugin::cost::{LineCategory, PurchaseOption, QuoteRequest};
use runner::plugin::precision::{
    Action, Dtype, FallbackScope, GemmRole, GemmSite, Operand, OperandMetrics, PlanRequest,
    ScaleFormat, ScalingRecipe, SiteMetrics, device_capabilities, healthy_step,
};
use runner::plugin::workload::{
    GraphRequest, InferenceShape, Phase, RecomputeGranularity, TrainingPrecision,
};
use runner::plugin::{self, Failure, Kind, Limits};
use runner::{explore, runfile};

use crate::util::{on_demand, program};

#[test]
fn a_0_1_workload_is_described_and_built_with_0_2_and_0_3_defaults() {
    let p = plugin::load(&program("contract_v01_workload.wasm")).unwrap();
    assert_eq!(
        (p.info.kind, p.info.contract.as_str()),
        (Kind::Workload, "0.1.0")
    );
    assert!(
        p.info.provenance().contains("contract 0.1.0, adapted"),
        "{}",
        p.info.provenance()
    );
    let mut w = p.workload(Limits::default()).unwrap();
    let info = w.describe().unwrap();
    let v = &info.variants[0];
    assert_eq!(v.name, "old-tiny");
    let precisions: Vec<_> = v.layouts.iter().map(|l| l.precision).collect();
    assert_eq!(
        precisions,
        [TrainingPrecision::Fp8, TrainingPrecision::Bf16],
        "\"FP8\" and \"bf16\" parsed"
    );
    let l = &v.layouts[0];
    assert_eq!(
        (l.tp, l.gpus_min, l.seq_len, l.sequence_parallel),
        (2, 8, 0, false)
    );
    assert_eq!(l.recompute, RecomputeGranularity::None);
    assert!(l.measured.is_none() && !l.distributed_optimizer);
    assert!(v.hyper.mamba.is_none() && v.hyper.layer_pattern.is_empty());

    let g = w
        .graph(&GraphRequest::training("old-tiny", 16, 2, 0))
        .unwrap();
    assert_eq!(
        g.ops.iter().filter(|o| o.layer == 1).count(),
        5,
        "two MLP blocks of five ops"
    );
    // 0.1 has no phase: an inference request is refused as a contract limit, not sent.
    let mut prefill = GraphRequest::training("old-tiny", 16, 2, 0);
    prefill.phase = Phase::Prefill(InferenceShape {
        kv_len: 16,
        concurrency: 1,
    });
    let err = w.graph(&prefill).unwrap_err();
    assert!(
        matches!(err.failure, Failure::Contract(_)) && err.to_string().contains("0.1.0"),
        "{err}"
    );
}

#[test]
fn a_0_1_cost_plugin_prices_per_price_with_its_billing_and_quotes_in_usd() {
    let mut c = plugin::load(&program("contract_v01_cost.wasm"))
        .unwrap()
        .cost(Limits::default())
        .unwrap();
    assert_eq!(c.provider().unwrap().name, "oldcloud");
    let offerings = c.offerings().unwrap();
    let o = &offerings[0];
    assert_eq!(o.node_multiple, 1);
    let options: Vec<_> = o.prices.iter().map(|p| p.option).collect();
    assert_eq!(
        options,
        [PurchaseOption::OnDemand, PurchaseOption::OneYearNoUpfront]
    );
    for p in &o.prices {
        assert_eq!((p.billing_increment_s, p.minimum_charge_s), (60, 600));
        assert_eq!(
            (p.effective_date.as_str(), p.upfront_usd_per_node),
            ("2026-01-15", 0.0)
        );
        assert!(p.source.contains("0.1.0") && p.caveats.is_empty());
    }
    let mut request = QuoteRequest {
        hours: 1.5,
        option: PurchaseOption::OneYearNoUpfront,
        start_date: "2027-01-01".into(),
        storage_gb_months: 100.0,
        ..on_demand("old.h100x8", "old-1")
    };
    let q = c.quote(&request).unwrap();
    assert_eq!(q.currency, "USD");
    let categories: Vec<_> = q.lines.iter().map(|l| l.category).collect();
    assert_eq!(categories, [LineCategory::Compute, LineCategory::Storage]);
    assert!(
        (q.total - (2.0 * 1.5 * 12.0 + 10.0)).abs() < 1e-9,
        "{}",
        q.total
    );
    // It lists no spot price: the host does not ask.
    request.option = PurchaseOption::Spot;
    assert!(matches!(
        c.quote(&request).unwrap_err().failure,
        Failure::NotAsked(m) if m.contains("no spot price for instance 'old.h100x8' in region 'old-1'")
    ));
}

#[test]
fn a_0_1_precision_policy_plans_per_operand_and_its_actions_gain_targets() {
    let mut pp = plugin::load(&program("contract_v01_precision.wasm"))
        .unwrap()
        .precision(Limits::default())
        .unwrap();
    let site = |name: &str| GemmSite {
        layer: 0,
        name: name.into(),
        role: GemmRole::Forward,
        m: 64,
        n: 64,
        k: 64,
    };
    let request = PlanRequest {
        model: "m".into(),
        layers: 2,
        device: device_capabilities("B200"),
        sites: vec![site("layers.0.up"), site("layers.0.mx")],
        state: Vec::new(),
    };
    let plan = pp.plan(&request).unwrap();
    let (fp8, mx) = (&plan.sites[0], &plan.sites[1]);
    assert_eq!(
        (
            fp8.activation.format,
            fp8.weight.format,
            fp8.gradient.format
        ),
        (Dtype::Fp8E4m3, Dtype::Fp8E4m3, Dtype::Fp8E5m2)
    );
    assert_eq!(
        (
            fp8.activation.recipe,
            fp8.activation.amax_history,
            fp8.output
        ),
        (ScalingRecipe::Delayed, 16, Dtype::Bf16)
    );
    assert_eq!(
        (
            mx.weight.block.rows,
            mx.weight.block.cols,
            mx.weight.scale_format
        ),
        (1, 32, ScaleFormat::E8m0)
    );

    let metrics = healthy_step(5, plan.sites.clone(), Vec::new());
    let r = pp.on_step(&metrics).unwrap();
    assert_eq!(r.actions.len(), 7);
    assert!(
        matches!(&r.actions[0], Action::Fallback(f) if f.scope == FallbackScope::BackwardOnly && f.to == Dtype::Bf16)
    );
    assert!(
        matches!(&r.actions[1], Action::FallbackGlobal(g) if g.scope == FallbackScope::AllGemms && g.to == Dtype::Bf16)
    );
    assert!(
        matches!(&r.actions[2], Action::ChangeRecipe(c) if c.recipe == ScalingRecipe::Current && c.margin == 1)
    );
    assert!(matches!(r.actions[3], Action::SkipStep));
    assert!(matches!(&r.actions[4], Action::Rollback(rb) if (rb.steps, rb.skip_batches) == (2, 3)));
    assert!(
        matches!(&r.actions[5], Action::Repromote(p) if p.to == Dtype::Fp8E4m3 && p.sites.names == ["*.up"])
    );
    assert!(matches!(&r.actions[6], Action::Alert(m) if m == "step 5 amax None"));

    // A NaN amax of its weight reaches the policy (which alerts the first site's amax):
    // a 0.1 site's one signal of an overflow.
    let operand = |operand, amax| OperandMetrics {
        operand,
        amax,
        scale: 1.0,
        saturation_rate: 0.0,
        underflow_rate: 0.0,
        nonfinite: amax.is_nan(),
    };
    let overflow = runner::plugin::precision::StepMetrics {
        sites: vec![SiteMetrics {
            site: 0,
            operands: vec![operand(Operand::Activation, 2.0), operand(Operand::Weight, f64::NAN)],
        }],
        ..healthy_step(6, plan.sites.clone(), Vec::new())
    };
    let r = pp.on_step(&overflow).unwrap();
    assert!(matches!(&r.actions[6], Action::Alert(m) if m == "step 6 amax Some(NaN)"), "{:?}", r.actions[6]);
}

#[test]
fn a_run_of_0_1_plugins_goes_end_to_end_and_names_them_adapted() {
    let (model, policy, cloud) = (
        program("contract_v01_workload.wasm"),
        program("contract_v01_precision.wasm"),
        program("contract_v01_cost.wasm"),
    );
    let text = format!(
        "[model]\nplugin = {model:?}\n[cluster]\ngpus = [8, 16]\n[precision]\nplugin = {policy:?}\nformat = \"fp8\"\n\
         [cost]\nplugins = [{cloud:?}]\n[measure]\nrepeats = 1\n"
    );
    let run = runfile::parse(&text, "v0.1").unwrap();
    let outcome = explore::run(&run, &|_, _, _| {}).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(outcome.clouds, ["oldcloud"]);
    let cost = outcome.series[0].rows[1].costs[0]
        .quote()
        .expect("oldcloud sells H100");
    assert_eq!(cost.nodes, 2);
    assert_eq!(outcome.plugins.len(), 3);
    assert!(outcome.plugins.iter().all(|p| p.contract == "0.1.0"));
    let adapted = outcome
        .notes
        .iter()
        .filter(|n| n.starts_with("plugin: ") && n.contains("adapted"))
        .count();
    assert_eq!(adapted, 3, "{:#?}", outcome.notes);
    assert!(
        outcome
            .notes
            .iter()
            .any(|n| n.contains("GEMM FLOPs fp8 100.0 %")),
        "{:#?}",
        outcome.notes
    );
}

#[test]
fn a_0_2_workload_is_described_with_0_3_defaults_and_keeps_its_0_2_fields() {
    let p = plugin::load(&program("contract_v02_workload.wasm")).unwrap();
    assert_eq!(
        (p.info.kind, p.info.contract.as_str()),
        (Kind::Workload, "0.2.0")
    );
    assert!(
        p.info.provenance().contains("contract 0.2.0, adapted"),
        "{}",
        p.info.provenance()
    );
    let mut w = p.workload(Limits::default()).unwrap();
    let info = w.describe().unwrap();
    let v = &info.variants[0];
    // What 0.2 cannot say: no Mamba mixer, no layer pattern, experts at hidden width.
    assert!(v.hyper.mamba.is_none());
    assert_eq!(v.hyper.layer_pattern, "");
    let moe = v
        .hyper
        .moe
        .as_ref()
        .expect("the 0.2 MoE config comes through");
    assert_eq!(
        (
            moe.experts,
            moe.top_k,
            moe.expert_ffn,
            moe.dense_layers,
            moe.latent
        ),
        (4, 2, 16, 1, 0)
    );
    // What 0.2 said, unchanged.
    let (fp8, bf16) = (&v.layouts[0], &v.layouts[1]);
    assert_eq!(
        (fp8.precision, bf16.precision),
        (TrainingPrecision::Fp8Current, TrainingPrecision::Bf16)
    );
    assert_eq!(
        (
            fp8.sequence_parallel,
            bf16.sequence_parallel,
            fp8.seq_len,
            fp8.ep
        ),
        (true, false, 128, 2)
    );
    assert_eq!(fp8.recompute, RecomputeGranularity::Selective);
    assert!(fp8.distributed_optimizer && fp8.overlap_grad_reduce && !fp8.overlap_param_gather);
    let measured = fp8
        .measured
        .as_ref()
        .expect("the published measurement comes through");
    assert_eq!(
        (
            measured.step_time_s,
            measured.tokens_per_s_per_gpu,
            measured.gpus
        ),
        (1.5, 1000.0, 8)
    );
    assert!(measured.source.ends_with("table 1") && bf16.measured.is_none());

    // The same graph as the 0.1 program builds, through one more adapter step.
    let request = GraphRequest::training("old-tiny", 16, 2, 0);
    let g = w.graph(&request).unwrap();
    let old = plugin::load(&program("contract_v01_workload.wasm"))
        .unwrap()
        .workload(Limits::default())
        .unwrap()
        .graph(&request)
        .unwrap();
    assert_eq!(g.ops.len(), old.ops.len());
    assert_eq!(
        runner_graph::count::params(&g),
        runner_graph::count::params(&old)
    );
    // 0.2 has phases: an inference request goes down unchanged and the plugin answers it.
    let mut decode = request.clone();
    decode.phase = Phase::Decode(InferenceShape {
        kv_len: 24,
        concurrency: 3,
    });
    let err = w.graph(&decode).unwrap_err();
    assert!(
        matches!(err.failure, Failure::Refused(_))
            && err.to_string().contains("kv-len 24, concurrency 3"),
        "{err}"
    );
}

#[test]
fn a_0_2_cost_plugin_is_called_with_0_3_types_and_prices_as_it_says() {
    let p = plugin::load(&program("contract_v02_cost.wasm")).unwrap();
    assert_eq!(
        (p.info.kind, p.info.contract.as_str()),
        (Kind::Cost, "0.2.0")
    );
    let mut c = p.cost(Limits::default()).unwrap();
    assert_eq!(c.provider().unwrap().name, "oldcloud2");
    let offerings = c.offerings().unwrap();
    let o = &offerings[0];
    assert_eq!((o.node_multiple, o.gpus_per_node), (2, 8));
    let options: Vec<_> = o.prices.iter().map(|p| p.option).collect();
    assert_eq!(
        options,
        [
            PurchaseOption::OnDemand,
            PurchaseOption::OneYearPartialUpfront
        ]
    );
    let upfront = &o.prices[1];
    assert_eq!(
        (upfront.upfront_usd_per_node, upfront.caveats.as_slice()),
        (40_000.0, [PriceCaveat::LowerBound].as_slice())
    );
    let request = QuoteRequest {
        hours: 1.5,
        option: PurchaseOption::OneYearPartialUpfront,
        storage_gb_months: 100.0,
        ..on_demand("old.h100x8", "old-1")
    };
    let q = c.quote(&request).unwrap();
    let categories: Vec<_> = q.lines.iter().map(|l| l.category).collect();
    assert_eq!(
        categories,
        [
            LineCategory::Compute,
            LineCategory::Upfront,
            LineCategory::Storage
        ]
    );
    assert!(
        (q.total - (2.0 * 1.5 * 10.0 + 2.0 * 40_000.0 + 10.0)).abs() < 1e-9,
        "{}",
        q.total
    );
    assert_eq!(q.warnings, ["a 0.2.0 warning"]);
    assert_eq!(q.lines[0].caveats, [PriceCaveat::LowerBound]);
    let spot = QuoteRequest {
        option: PurchaseOption::Spot,
        ..request
    };
    // It lists no spot price: the host does not ask.
    assert!(matches!(
        c.quote(&spot).unwrap_err().failure,
        Failure::NotAsked(m) if m.contains("no spot price for instance 'old.h100x8' in region 'old-1'")
    ));
}

#[test]
fn a_0_2_precision_policy_is_called_with_0_3_types_and_plans_as_it_says() {
    use runner::plugin::precision::ValueRounding;
    let p = plugin::load(&program("contract_v02_precision.wasm")).unwrap();
    assert_eq!((p.info.kind, p.info.contract.as_str()), (Kind::Precision, "0.2.0"));
    let mut pp = p.precision(Limits::default()).unwrap();
    assert_eq!(pp.name().unwrap(), "old-nvfp4 (contract 0.2.0)");
    let site = |layer: i32, name: &str| GemmSite { layer, name: name.into(), role: GemmRole::Forward, m: 64, n: 64, k: 64 };
    let request = PlanRequest {
        model: "m".into(),
        layers: 2,
        device: device_capabilities("B200"),
        sites: vec![site(0, "layers.0.up"), site(1, "layers.1.down")],
        state: vec![1, 2],
    };
    // Every field of the 0.2 plan arrives as the plugin wrote it: the 16-wide E4M3 blocks
    // under an FP32 tensor scale, stochastic rounding and the Hadamard transform on the
    // gradient only.
    let plan = pp.plan(&request).unwrap();
    assert_eq!(plan.sites.len(), 2);
    let s = &plan.sites[1];
    assert_eq!((s.weight.format, s.weight.scale_format, s.weight.tensor_scale), (Dtype::Nvfp4, ScaleFormat::E4m3, Some(ScaleFormat::Fp32)));
    assert_eq!((s.weight.block.rows, s.weight.block.cols, s.weight.hadamard), (1, 16, 0));
    assert_eq!((s.gradient.value_rounding, s.gradient.hadamard), (ValueRounding::Stochastic, 16));
    assert_eq!((s.activation.value_rounding, s.output), (ValueRounding::NearestEven, Dtype::Bf16));

    let r = pp.on_step(&healthy_step(9, plan.sites.clone(), vec![3])).unwrap();
    assert_eq!(r.state, [3, 7]);
    assert_eq!(r.actions.len(), 4);
    assert!(matches!(&r.actions[0], Action::Fallback(f)
        if f.scope == FallbackScope::ForwardOnly && f.to == Dtype::Fp16 && f.sites.layers == [1] && f.sites.roles == [GemmRole::InputGradient]));
    assert!(matches!(&r.actions[1], Action::ChangeRecipe(c)
        if c.recipe == ScalingRecipe::Current && (c.margin, c.amax_history) == (2, 4)));
    assert!(matches!(&r.actions[2], Action::ResetAmax(sel) if sel.names == ["*.down"]));
    assert!(matches!(&r.actions[3], Action::Alert(m) if m == "step 9 of a 0.2 policy"));
}
