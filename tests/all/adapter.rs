//! Plugins built against the published contract 0.1.0 (tests/programs/contract-v01-*,
//! built from tests/wit-0.1.0 with no SDK) keep working: the host binds 0.1.0 beside 0.2.0
//! and adapts their answers, with 0.2 defaults for what 0.1 cannot say.

use runner::plugin::cost::{LineCategory, PurchaseOption, QuoteRequest};
use runner::plugin::precision::{
    Action, Dtype, FallbackScope, GemmRole, GemmSite, PlanRequest, ScaleFormat, ScalingRecipe,
    device_capabilities, healthy_step,
};
use runner::plugin::workload::{
    GraphRequest, InferenceShape, Phase, RecomputeGranularity, TrainingPrecision,
};
use runner::plugin::{self, Failure, Kind, Limits};
use runner::{explore, runfile};

use crate::util::{on_demand, program};

#[test]
fn a_0_1_workload_is_described_and_built_with_0_2_defaults() {
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
    request.option = PurchaseOption::Spot;
    assert!(matches!(
        c.quote(&request).unwrap_err().failure,
        Failure::Refused(_)
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
    assert!(matches!(&r.actions[6], Action::Alert(m) if m.starts_with("step 5")));
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
        outcome.notes.iter().any(|n| n.contains("GEMM FLOPs fp8 100.0 %")),
        "{:#?}",
        outcome.notes
    );
}
