//! Contract 0.1.0 up to 0.2.0 (workload, then `v2` takes it to 0.3) and straight to 0.3.0
//! (cost and precision, which 0.3 kept from 0.2). The defaults are listed in `adapt`.

use super::{same_enum, workload_up};
use crate::bindings::{v1, v2, v3};

use v1::cost::exports::runner::plugin::cost_model as c1;
use v1::precision::exports::runner::plugin::precision_policy as p1;
use v1::workload::exports::runner::plugin::workload as w1;
use v2::workload::exports::runner::plugin::workload as w2;
use v3::cost::exports::runner::plugin::cost_model as c3;
use v3::precision::exports::runner::plugin::precision_policy as p3;
use v3::workload::exports::runner::plugin::workload as w3;

same_enum!(v1::Dtype => v3::Dtype { Fp32, Bf16, Fp16, Fp8E4m3, Fp8E5m2, Mxfp8, Nvfp4, Int32 });
workload_up!(w1 => w2, hyperparameters {}, moe {});
// The name table is the host's rules, expanded over the 0.3 types; 0.2 has the same cases.
same_enum!(w3::TrainingPrecision => w2::TrainingPrecision {
    Bf16, Fp16, Fp8, Fp8Delayed, Fp8Current, Fp8Blockwise, Mxfp8, Nvfp4,
});
same_enum!(p3::GemmRole => p1::GemmRole { Forward, InputGradient, WeightGradient });
same_enum!(p1::GemmRole => p3::GemmRole { Forward, InputGradient, WeightGradient });
same_enum!(p1::ScalingRecipe => p3::ScalingRecipe { None, Delayed, Current, Block });
same_enum!(p1::AmaxReduction => p3::AmaxReduction { MostRecent, Max });
same_enum!(p1::FallbackScope => p3::FallbackScope { AllGemms, BackwardOnly, WeightGradientOnly });

// ---------------------------------------------------------------------------- workload

pub fn model_info(m: w1::ModelInfo) -> Result<w2::ModelInfo, String> {
    let variants = m
        .variants
        .into_iter()
        .map(variant)
        .collect::<Result<_, _>>()?;
    Ok(w2::ModelInfo {
        family: m.family,
        variants,
    })
}

fn variant(v: w1::Variant) -> Result<w2::Variant, String> {
    let layouts = v
        .layouts
        .into_iter()
        .map(layout)
        .collect::<Result<_, _>>()?;
    Ok(w2::Variant {
        name: v.name,
        family: v.family,
        citation: v.citation,
        hyper: hyperparameters(v.hyper),
        defaults: defaults(v.defaults),
        layouts,
    })
}

fn layout(l: w1::ReferenceLayout) -> Result<w2::ReferenceLayout, String> {
    let precision = crate::workload::training_precision(&l.precision).ok_or_else(|| {
        format!(
            "layout precision {} is not one the contract knows (BF16, FP16, FP8, FP8-CS, FP8-DS, FP8-BS, MXFP8, NVFP4)",
            runner_contract::text::shown(&l.precision)
        )
    })?;
    Ok(w2::ReferenceLayout {
        gpu: l.gpu,
        gpus_min: l.gpus_min,
        gpus_max: l.gpus_max,
        precision: precision.into(),
        tp: l.tp,
        pp: l.pp,
        cp: l.cp,
        vp: l.vp,
        ep: l.ep,
        etp: l.etp,
        fsdp: l.fsdp,
        sequence_parallel: false,
        recompute: w2::RecomputeGranularity::None,
        recompute_layers: 0,
        distributed_optimizer: false,
        overlap_grad_reduce: false,
        overlap_param_gather: false,
        tp_comm_overlap: false,
        seq_len: 0,
        mbs: l.mbs,
        gbs_per_gpu: l.gbs_per_gpu,
        gbs_fixed: l.gbs_fixed,
        measured: None,
        source: l.source,
    })
}

pub fn graph_request(r: &w2::GraphRequest) -> Result<w1::GraphRequest, String> {
    if !matches!(r.phase, w2::Phase::Training) {
        return Err("a contract 0.1.0 plugin builds training graphs only; rebuild it against 0.3.0 for inference".into());
    }
    Ok(w1::GraphRequest {
        variant: r.variant.clone(),
        seq_len: r.seq_len,
        micro_batch: r.micro_batch,
        layers: r.layers,
    })
}

// -------------------------------------------------------------------------------- cost

pub fn provider(p: c1::ProviderInfo) -> c3::ProviderInfo {
    c3::ProviderInfo {
        name: p.name,
        display_name: p.display_name,
    }
}

fn option_up(o: c1::PurchaseOption) -> c3::PurchaseOption {
    match o {
        c1::PurchaseOption::OnDemand => c3::PurchaseOption::OnDemand,
        c1::PurchaseOption::Spot => c3::PurchaseOption::Spot,
        c1::PurchaseOption::ReservedOneYear => c3::PurchaseOption::OneYearNoUpfront,
        c1::PurchaseOption::ReservedThreeYear => c3::PurchaseOption::ThreeYearNoUpfront,
        c1::PurchaseOption::CapacityBlock => c3::PurchaseOption::CapacityBlock,
    }
}

/// 0.2 options a 0.1 plugin never lists (upfront terms) go down as the term they belong to.
fn option_down(o: c3::PurchaseOption) -> c1::PurchaseOption {
    use c3::PurchaseOption as P;
    match o {
        P::OnDemand => c1::PurchaseOption::OnDemand,
        P::Spot => c1::PurchaseOption::Spot,
        P::CapacityBlock => c1::PurchaseOption::CapacityBlock,
        P::OneYearNoUpfront | P::OneYearPartialUpfront | P::OneYearAllUpfront => {
            c1::PurchaseOption::ReservedOneYear
        }
        P::ThreeYearNoUpfront | P::ThreeYearPartialUpfront | P::ThreeYearAllUpfront => {
            c1::PurchaseOption::ReservedThreeYear
        }
    }
}

pub fn offering(o: c1::Offering) -> c3::Offering {
    let prices = o
        .prices
        .into_iter()
        .map(|p| c3::Price {
            region: p.region,
            option: option_up(p.option),
            usd_per_node_hour: p.usd_per_node_hour,
            upfront_usd_per_node: 0.0,
            billing_increment_s: o.billing_increment_s,
            minimum_charge_s: o.minimum_charge_s,
            effective_date: o.effective_date.clone(),
            source: o.source.clone(),
            caveats: Vec::new(),
        })
        .collect();
    c3::Offering {
        instance: o.instance,
        gpu: o.gpu,
        gpus_per_node: o.gpus_per_node,
        scale_up_domain: o.scale_up_domain,
        node_multiple: 1,
        interconnect_gbps: o.interconnect_gbps,
        prices,
    }
}

pub fn quote_request(r: &c3::QuoteRequest) -> c1::QuoteRequest {
    c1::QuoteRequest {
        instance: r.instance.clone(),
        nodes: r.nodes,
        hours: r.hours,
        region: r.region.clone(),
        option: option_down(r.option),
        storage_gb_months: r.storage_gb_months,
        egress_gb: r.egress_gb,
    }
}

pub fn quote(q: c1::ItemisedQuote) -> c3::ItemisedQuote {
    let lines = q
        .lines
        .into_iter()
        .map(|l| c3::QuoteLine {
            category: match l.unit.as_str() {
                "node-hour" => c3::LineCategory::Compute,
                "GB-month" => c3::LineCategory::Storage,
                "GB" => c3::LineCategory::Egress,
                _ => c3::LineCategory::Other,
            },
            item: l.item,
            quantity: l.quantity,
            unit: l.unit,
            amount: l.usd,
            estimate: l.estimate,
            caveats: Vec::new(),
        })
        .collect();
    c3::ItemisedQuote {
        currency: "USD".into(),
        lines,
        total: q.total_usd,
        warnings: Vec::new(),
    }
}

// --------------------------------------------------------------------------- precision

pub fn plan_request(r: &p3::PlanRequest) -> p1::PlanRequest {
    p1::PlanRequest {
        model: r.model.clone(),
        sites: r
            .sites
            .iter()
            .map(|s| p1::GemmSite {
                layer: s.layer,
                name: s.name.clone(),
                role: s.role.into(),
                m: s.m,
                n: s.n,
                k: s.k,
            })
            .collect(),
        state: r.state.clone(),
    }
}

fn operand(p: &p1::SitePlan, format: v1::Dtype) -> p3::OperandPlan {
    let format: v3::Dtype = format.into();
    let recipe: p3::ScalingRecipe = p.recipe.into();
    let block = if recipe == p3::ScalingRecipe::Block {
        p3::BlockShape {
            rows: 1,
            cols: p.block_size,
        }
    } else {
        p3::BlockShape { rows: 0, cols: 0 }
    };
    let (scale_format, scale_rounding, tensor_scale) = match format {
        v3::Dtype::Mxfp8 => (p3::ScaleFormat::E8m0, p3::ScaleRounding::PowerOfTwoUp, None),
        v3::Dtype::Nvfp4 => (
            p3::ScaleFormat::E4m3,
            p3::ScaleRounding::Exact,
            Some(p3::ScaleFormat::Fp32),
        ),
        _ => (p3::ScaleFormat::Fp32, p3::ScaleRounding::Exact, None),
    };
    p3::OperandPlan {
        format,
        recipe,
        block,
        scale_format,
        scale_rounding,
        tensor_scale,
        value_rounding: p3::ValueRounding::NearestEven,
        amax_history: p.amax_history,
        amax_reduction: p.amax_reduction.into(),
        margin: p.margin,
        saturate: p.saturate,
        hadamard: 0,
    }
}

pub fn plan_response(r: p1::PlanResponse) -> p3::PlanResponse {
    let sites = r
        .sites
        .iter()
        .map(|p| {
            let activation = operand(p, p.format);
            p3::SitePlan {
                weight: activation,
                activation,
                gradient: operand(p, p.grad_format),
                output: if v3::Dtype::from(p.format) == v3::Dtype::Fp32 {
                    v3::Dtype::Fp32
                } else {
                    v3::Dtype::Bf16
                },
            }
        })
        .collect();
    p3::PlanResponse {
        sites,
        state: r.state,
    }
}

pub fn step_metrics(m: &p3::StepMetrics) -> p1::StepMetrics {
    let sites = m
        .sites
        .iter()
        .map(|s| {
            let max =
                |f: fn(&p3::OperandMetrics) -> f64| s.operands.iter().map(f).fold(0.0, f64::max);
            p1::SiteMetrics {
                site: s.site,
                amax: max(|o| o.amax),
                scale: s.operands.first().map_or(1.0, |o| o.scale),
                saturation_rate: max(|o| o.saturation_rate),
                underflow_rate: max(|o| o.underflow_rate),
            }
        })
        .collect();
    p1::StepMetrics {
        step: m.step,
        loss: m.loss,
        grad_norm: m.grad_norm,
        learning_rate: m.learning_rate,
        loss_finite: m.loss_finite,
        grads_finite: m.grads_finite,
        sites,
        state: m.state.clone(),
    }
}

fn selector(s: p1::SiteSelector) -> p3::SiteSelector {
    p3::SiteSelector {
        layers: s.layers,
        names: s.names,
        roles: s.roles.into_iter().map(Into::into).collect(),
    }
}

pub fn step_response(r: p1::StepResponse) -> p3::StepResponse {
    let actions = r
        .actions
        .into_iter()
        .map(|a| match a {
            p1::Action::Fallback(f) => p3::Action::Fallback(p3::Fallback {
                sites: selector(f.sites),
                scope: f.scope.into(),
                to: f.to.into(),
            }),
            p1::Action::FallbackGlobal(scope) => p3::Action::FallbackGlobal(p3::GlobalFallback {
                scope: scope.into(),
                to: v3::Dtype::Bf16,
            }),
            p1::Action::ChangeRecipe(c) => p3::Action::ChangeRecipe(p3::RecipeChange {
                sites: selector(c.sites),
                recipe: c.recipe.into(),
                margin: c.margin,
                amax_history: c.amax_history,
            }),
            p1::Action::SkipStep => p3::Action::SkipStep,
            p1::Action::Rollback(rb) => p3::Action::Rollback(p3::Rollback {
                steps: rb.steps,
                skip_batches: rb.skip_batches,
            }),
            p1::Action::Repromote(s) => p3::Action::Repromote(p3::Repromotion {
                sites: selector(s),
                to: v3::Dtype::Fp8E4m3,
            }),
            p1::Action::Alert(m) => p3::Action::Alert(m),
        })
        .collect();
    p3::StepResponse {
        actions,
        state: r.state,
    }
}
