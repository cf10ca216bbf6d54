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
            "layout precision {} is not one the contract knows ({})",
            runner_contract::text::shown(&l.precision),
            runner_contract::workload::TRAINING_PRECISION_NAMES
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

/// The largest of `values` (0 for none), NaN where any is NaN: `f64::max` drops a NaN, and
/// a folded NaN would read as a small amax.
fn largest(values: impl Iterator<Item = f64>) -> f64 {
    values.fold(0.0, |a, b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) })
}

/// A 0.1 site hears one amax for all its operands, and 0.1 has no flag for NaN or Inf: its
/// only signal of an overflow is an amax that is not finite. So the largest operand amax:
/// NaN where an operand's amax is NaN, or finite on an operand that saw NaN or Inf
/// (`nonfinite`; the device's amax skips NaN elements), else Inf where one is Inf.
pub fn step_metrics(m: &p3::StepMetrics) -> p1::StepMetrics {
    let sites = m
        .sites
        .iter()
        .map(|s| {
            let max = |f: fn(&p3::OperandMetrics) -> f64| largest(s.operands.iter().map(f));
            p1::SiteMetrics {
                site: s.site,
                amax: max(|o| if o.nonfinite && o.amax.is_finite() { f64::NAN } else { o.amax }),
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

/// Each default and mapping of the 0.1 adapter at the values the 0.1 test programs never
/// send (three-year and spot prices, egress lines, NVFP4 and MXFP8 operands, per-operand
/// metrics, layouts with a fixed batch): a hand mutation audit changed each with every
/// test passing.
#[cfg(test)]
mod tests {
    use super::*;

    fn old_offering() -> c1::Offering {
        let price = |option| c1::Price { region: "r".into(), option, usd_per_node_hour: 10.0 };
        c1::Offering {
            instance: "i".into(),
            gpu: "H100".into(),
            gpus_per_node: 8,
            scale_up_domain: 8,
            interconnect_gbps: 3200.0,
            prices: vec![
                price(c1::PurchaseOption::Spot),
                price(c1::PurchaseOption::ReservedThreeYear),
                price(c1::PurchaseOption::CapacityBlock),
            ],
            billing_increment_s: 60,
            minimum_charge_s: 600,
            effective_date: "2026-01-15".into(),
            source: "s".into(),
        }
    }

    #[test]
    fn every_0_1_purchase_option_goes_up_and_down_to_its_term() {
        let options: Vec<_> = offering(old_offering()).prices.iter().map(|p| p.option).collect();
        use c3::PurchaseOption as P;
        assert_eq!(options, [P::Spot, P::ThreeYearNoUpfront, P::CapacityBlock]);
        let request = |option| c3::QuoteRequest {
            instance: "i".into(),
            gpus: 16,
            nodes: 2,
            hours: 1.5,
            region: "r".into(),
            option,
            start_date: String::new(),
            storage_gb_months: 3.0,
            egress_gb: 4.0,
        };
        let down = |option| quote_request(&request(option)).option;
        use c1::PurchaseOption as O;
        assert_eq!(
            [P::Spot, P::ThreeYearAllUpfront, P::ThreeYearPartialUpfront, P::OneYearAllUpfront, P::CapacityBlock].map(down),
            [O::Spot, O::ReservedThreeYear, O::ReservedThreeYear, O::ReservedOneYear, O::CapacityBlock]
        );
        let r = quote_request(&request(P::OnDemand));
        assert_eq!((r.nodes, r.hours, r.storage_gb_months, r.egress_gb), (2, 1.5, 3.0, 4.0));
    }

    #[test]
    fn a_0_1_quote_line_gets_the_category_of_its_unit_and_keeps_its_sign() {
        let line = |unit: &str, usd| c1::QuoteLine { item: "x".into(), quantity: 1.0, unit: unit.into(), usd, estimate: false };
        let q = quote(c1::ItemisedQuote {
            lines: vec![line("node-hour", 5.0), line("GB-month", 1.0), line("GB", 2.0), line("kWh", -1.0)],
            total_usd: 7.0,
        });
        let got: Vec<_> = q.lines.iter().map(|l| (l.category, l.amount)).collect();
        use c3::LineCategory as L;
        assert_eq!(got, [(L::Compute, 5.0), (L::Storage, 1.0), (L::Egress, 2.0), (L::Other, -1.0)]);
        assert_eq!((q.currency.as_str(), q.total), ("USD", 7.0));
    }

    fn site_plan(format: v1::Dtype, recipe: p1::ScalingRecipe) -> p1::SitePlan {
        p1::SitePlan {
            format,
            grad_format: v1::Dtype::Bf16,
            recipe,
            block_size: 32,
            amax_history: 4,
            amax_reduction: p1::AmaxReduction::MostRecent,
            margin: 2,
            saturate: false,
        }
    }

    #[test]
    fn block_formats_get_their_scales_and_every_field_comes_through() {
        let plan = |format, recipe| {
            let r = plan_response(p1::PlanResponse { sites: vec![site_plan(format, recipe)], state: vec![9] });
            assert_eq!(r.state, [9]);
            r.sites.into_iter().next().unwrap()
        };
        let nv = plan(v1::Dtype::Nvfp4, p1::ScalingRecipe::Block).weight;
        assert_eq!((nv.scale_format, nv.scale_rounding, nv.tensor_scale), (p3::ScaleFormat::E4m3, p3::ScaleRounding::Exact, Some(p3::ScaleFormat::Fp32)));
        assert_eq!((nv.block.rows, nv.block.cols), (1, 32));
        let mx = plan(v1::Dtype::Mxfp8, p1::ScalingRecipe::Block).activation;
        assert_eq!((mx.scale_format, mx.scale_rounding, mx.tensor_scale), (p3::ScaleFormat::E8m0, p3::ScaleRounding::PowerOfTwoUp, None));
        let fp8 = plan(v1::Dtype::Fp8E4m3, p1::ScalingRecipe::Current);
        let a = fp8.activation;
        assert_eq!((a.block.rows, a.block.cols, a.scale_format, a.scale_rounding), (0, 0, p3::ScaleFormat::Fp32, p3::ScaleRounding::Exact));
        assert_eq!((a.amax_history, a.amax_reduction, a.margin, a.saturate, a.hadamard), (4, p3::AmaxReduction::MostRecent, 2, false, 0));
        assert_eq!((fp8.gradient.format, fp8.output), (v3::Dtype::Bf16, v3::Dtype::Bf16));
        assert_eq!(plan(v1::Dtype::Fp32, p1::ScalingRecipe::None).output, v3::Dtype::Fp32);
    }

    #[test]
    fn a_0_1_site_hears_the_largest_amax_and_rates_of_its_operands() {
        let operand = |operand, amax, scale, saturation_rate, underflow_rate| p3::OperandMetrics {
            operand,
            amax,
            scale,
            saturation_rate,
            underflow_rate,
            nonfinite: false,
        };
        let sites = vec![
            p3::SiteMetrics {
                site: 3,
                operands: vec![
                    operand(p3::Operand::Activation, 1.0, 0.5, 0.1, 0.4),
                    operand(p3::Operand::Weight, 8.0, 0.25, 0.3, 0.2),
                ],
            },
            p3::SiteMetrics { site: 4, operands: Vec::new() },
        ];
        let metrics = p3::StepMetrics {
            step: 7,
            tokens: 0,
            loss: 2.0,
            grad_norm: 1.0,
            learning_rate: 1e-4,
            loss_finite: true,
            grads_finite: false,
            layers: Vec::new(),
            sites,
            plan: Vec::new(),
            state: vec![1],
        };
        let old = step_metrics(&metrics);
        let s = &old.sites[0];
        assert_eq!((s.site, s.amax, s.scale, s.saturation_rate, s.underflow_rate), (3, 8.0, 0.5, 0.3, 0.4));
        let none = &old.sites[1];
        assert_eq!((none.site, none.amax, none.scale, none.saturation_rate, none.underflow_rate), (4, 0.0, 1.0, 0.0, 0.0));
        assert_eq!((old.step, old.grads_finite, old.state.as_slice()), (7, false, [1].as_slice()));
    }

    /// An overflow in any operand reaches a 0.1 site as an amax that is not finite, its
    /// only signal: NaN in any operand's amax, in any place (a fold through `f64::max`
    /// kept the other operands' 8), or an operand flagged non-finite whose amax skipped
    /// its NaN elements; Inf where an operand's amax is Inf and none is NaN.
    #[test]
    fn a_0_1_site_hears_a_non_finite_amax_of_any_operand() {
        let operand = |operand, amax, nonfinite| p3::OperandMetrics {
            operand,
            amax,
            scale: 1.0,
            saturation_rate: 0.0,
            underflow_rate: 0.0,
            nonfinite,
        };
        let amax = |operands: Vec<p3::OperandMetrics>| {
            let metrics = p3::StepMetrics {
                sites: vec![p3::SiteMetrics { site: 0, operands }],
                ..crate::precision::healthy_step(1, Vec::new(), Vec::new())
            };
            step_metrics(&metrics).sites[0].amax
        };
        use p3::Operand::{Activation as A, Gradient as G, Weight as W};
        for nan_at in 0..3 {
            let mut operands = vec![operand(A, 8.0, false), operand(W, 1.0, false), operand(G, 2.0, false)];
            operands[nan_at].amax = f64::NAN;
            assert!(amax(operands).is_nan(), "NaN in operand {nan_at}");
        }
        assert!(amax(vec![operand(A, f64::NAN, true), operand(W, f64::INFINITY, true)]).is_nan());
        assert!(amax(vec![operand(A, 8.0, false), operand(W, 3.0, true)]).is_nan());
        assert_eq!(amax(vec![operand(A, 8.0, false), operand(W, f64::INFINITY, true)]), f64::INFINITY);
        assert_eq!(amax(vec![operand(A, 8.0, false), operand(W, 3.0, false)]), 8.0);
    }

    #[test]
    fn selectors_keep_their_roles_and_global_fallbacks_their_scope() {
        let r = step_response(p1::StepResponse {
            actions: vec![
                p1::Action::FallbackGlobal(p1::FallbackScope::WeightGradientOnly),
                p1::Action::Repromote(p1::SiteSelector { layers: vec![1], names: vec!["n".into()], roles: vec![p1::GemmRole::WeightGradient] }),
            ],
            state: Vec::new(),
        });
        assert!(matches!(&r.actions[0], p3::Action::FallbackGlobal(g) if g.scope == p3::FallbackScope::WeightGradientOnly));
        assert!(matches!(&r.actions[1], p3::Action::Repromote(p) if p.sites.roles == [p3::GemmRole::WeightGradient] && p.sites.layers == [1]));
    }

    #[test]
    fn a_0_1_layout_keeps_its_batch_and_a_request_its_layers() {
        let l = w1::ReferenceLayout {
            gpu: "H100".into(),
            gpus_min: 8,
            gpus_max: 16,
            precision: "BF16".into(),
            tp: 1,
            pp: 1,
            cp: 1,
            vp: 1,
            ep: 1,
            etp: 1,
            fsdp: 0,
            mbs: 2,
            gbs_per_gpu: 0.0,
            gbs_fixed: 512,
            source: "s".into(),
        };
        let up = layout(l).unwrap();
        assert_eq!((up.mbs, up.gbs_per_gpu, up.gbs_fixed, up.gpus_max), (2, 0.0, 512, 16));
        let r = graph_request(&w2::GraphRequest { variant: "v".into(), seq_len: 8, micro_batch: 2, layers: 3, phase: w2::Phase::Training }).unwrap();
        assert_eq!((r.seq_len, r.micro_batch, r.layers), (8, 2, 3));
    }
}
