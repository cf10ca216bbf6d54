//! Contract 0.1.0 plugins, adapted to 0.2.0: requests go down (what 0.1 cannot hear is
//! dropped), answers come up with defaults for what 0.1 cannot say. The rest of the runner
//! only ever sees 0.2 values, and validates them by the 0.2 rules.
//!
//! Defaults, each the reading a 0.1 plugin's author meant:
//! - workload: a layout's precision string is parsed by the shared name table (`FP8` is
//!   FP8 with no stated recipe; an unknown name is refused); no sequence parallelism,
//!   recompute, distributed optimizer or overlap, the variant's sequence length, no
//!   published measurement. Graph requests other than training are refused (0.1 has no
//!   phase).
//! - cost: each price gets its offering's billing increment, minimum, date and source, no
//!   upfront payment and no caveats; `reserved-one-year` / `-three-year` become the
//!   no-upfront terms; nodes are sold one at a time. Quote lines are in USD, with the
//!   category their unit implies (node-hour: compute, GB-month: storage, GB: egress).
//! - precision: a site's `format` plans the activation and weight, `grad-format` the
//!   gradient; `block-size` becomes a 1 x block-size block (MXFP8: E8M0 scales rounded up
//!   to a power of two; NVFP4: E4M3 block scales under an FP32 tensor scale); the output is
//!   FP32 for FP32 sites and BF16 otherwise. Step metrics go down with one amax per site
//!   (the largest over its operands) and come back with `fallback-global` to BF16 and
//!   `repromote` to FP8 E4M3.

use crate::bindings::{v1, v2};

use v1::cost::exports::runner::plugin::cost_model as c1;
use v1::precision::exports::runner::plugin::precision_policy as p1;
use v1::workload::exports::runner::plugin::workload as w1;
use v2::cost::exports::runner::plugin::cost_model as c2;
use v2::precision::exports::runner::plugin::precision_policy as p2;
use v2::workload::exports::runner::plugin::workload as w2;

/// `From` between two generated enums with the same cases.
macro_rules! same_enum {
    ($from:path => $to:path { $($case:ident),* $(,)? }) => {
        impl From<$from> for $to {
            fn from(x: $from) -> $to {
                use $from as F;
                use $to as T;
                match x { $(F::$case => T::$case),* }
            }
        }
    };
}

same_enum!(v1::Dtype => v2::Dtype { Fp32, Bf16, Fp16, Fp8E4m3, Fp8E5m2, Mxfp8, Nvfp4, Int32 });
same_enum!(w1::PositionScheme => w2::PositionScheme { Rope, Learned, None });
same_enum!(w1::NormKind => w2::NormKind { RmsNorm, LayerNorm });
same_enum!(w1::ActivationKind => w2::ActivationKind { Swiglu, Gelu, SquaredRelu, Geglu });
same_enum!(w1::AttentionKind => w2::AttentionKind { Mha, Gqa, Mla });
same_enum!(w1::RouterScore => w2::RouterScore { Softmax, Sigmoid });
same_enum!(w1::TensorKind => w2::TensorKind { Weight, Activation, Input });
same_enum!(w1::OpKind => w2::OpKind {
    Linear, Embedding, RmsNorm, LayerNorm, Rotary, Attention, Swiglu, Geglu, Gelu, SquaredRelu,
    Add, Concat, CrossEntropy, Router, MoeDispatch, GroupedLinear, MoeCombine,
});
same_enum!(w1::ParallelRole => w2::ParallelRole {
    Replicated, ColumnParallel, RowParallel, HeadParallel, Sequence, Expert, VocabParallel,
});
same_enum!(p2::GemmRole => p1::GemmRole { Forward, InputGradient, WeightGradient });
same_enum!(p1::GemmRole => p2::GemmRole { Forward, InputGradient, WeightGradient });
same_enum!(p1::ScalingRecipe => p2::ScalingRecipe { None, Delayed, Current, Block });
same_enum!(p1::AmaxReduction => p2::AmaxReduction { MostRecent, Max });
same_enum!(p1::FallbackScope => p2::FallbackScope { AllGemms, BackwardOnly, WeightGradientOnly });

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
    let h = v.hyper;
    let hyper = w2::Hyperparameters {
        layers: h.layers,
        hidden: h.hidden,
        ffn: h.ffn,
        heads: h.heads,
        kv_heads: h.kv_heads,
        head_dim: h.head_dim,
        vocab: h.vocab,
        tied_embeddings: h.tied_embeddings,
        position: h.position.into(),
        rope_theta: h.rope_theta,
        max_position: h.max_position,
        norm: h.norm.into(),
        norm_eps: h.norm_eps,
        activation: h.activation.into(),
        attention: h.attention.into(),
        mla: h.mla.map(|m| w2::MlaConfig {
            q_lora_rank: m.q_lora_rank,
            kv_lora_rank: m.kv_lora_rank,
            qk_nope_head_dim: m.qk_nope_head_dim,
            qk_rope_head_dim: m.qk_rope_head_dim,
            v_head_dim: m.v_head_dim,
        }),
        moe: h.moe.map(|m| w2::MoeConfig {
            experts: m.experts,
            top_k: m.top_k,
            shared_experts: m.shared_experts,
            expert_ffn: m.expert_ffn,
            shared_ffn: m.shared_ffn,
            dense_layers: m.dense_layers,
            layer_frequency: m.layer_frequency,
            score: m.score.into(),
            normalize_top_k: m.normalize_top_k,
        }),
        attention_window: h.attention_window,
        window_every: h.window_every,
        bias: h.bias,
        mtp_depth: h.mtp_depth,
    };
    let d = v.defaults;
    Ok(w2::Variant {
        name: v.name,
        family: v.family,
        citation: v.citation,
        hyper,
        defaults: w2::TrainingDefaults {
            seq_len: d.seq_len,
            tokens: d.tokens,
            optimizer: d.optimizer,
            learning_rate: d.learning_rate,
            weight_decay: d.weight_decay,
        },
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
        precision,
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
        return Err("a contract 0.1.0 plugin builds training graphs only; rebuild it against 0.2.0 for inference".into());
    }
    Ok(w1::GraphRequest {
        variant: r.variant.clone(),
        seq_len: r.seq_len,
        micro_batch: r.micro_batch,
        layers: r.layers,
    })
}

pub fn model_graph(g: w1::ModelGraph) -> w2::ModelGraph {
    w2::ModelGraph {
        tensors: g
            .tensors
            .into_iter()
            .map(|t| w2::Tensor {
                name: t.name,
                shape: t.shape,
                dtype: t.dtype.into(),
                kind: t.kind.into(),
            })
            .collect(),
        operations: g
            .operations
            .into_iter()
            .map(|o| w2::Operation {
                name: o.name,
                kind: o.kind.into(),
                inputs: o.inputs,
                outputs: o.outputs,
                attrs: o
                    .attrs
                    .into_iter()
                    .map(|a| w2::Attribute {
                        key: a.key,
                        value: match a.value {
                            w1::AttrValue::Int(v) => w2::AttrValue::Int(v),
                            w1::AttrValue::Float(v) => w2::AttrValue::Float(v),
                            w1::AttrValue::Flag(v) => w2::AttrValue::Flag(v),
                            w1::AttrValue::Text(v) => w2::AttrValue::Text(v),
                        },
                    })
                    .collect(),
                layer: o.layer,
                role: o.role.into(),
            })
            .collect(),
        loss: g.loss,
    }
}

// -------------------------------------------------------------------------------- cost

pub fn provider(p: c1::ProviderInfo) -> c2::ProviderInfo {
    c2::ProviderInfo {
        name: p.name,
        display_name: p.display_name,
    }
}

fn option_up(o: c1::PurchaseOption) -> c2::PurchaseOption {
    match o {
        c1::PurchaseOption::OnDemand => c2::PurchaseOption::OnDemand,
        c1::PurchaseOption::Spot => c2::PurchaseOption::Spot,
        c1::PurchaseOption::ReservedOneYear => c2::PurchaseOption::OneYearNoUpfront,
        c1::PurchaseOption::ReservedThreeYear => c2::PurchaseOption::ThreeYearNoUpfront,
        c1::PurchaseOption::CapacityBlock => c2::PurchaseOption::CapacityBlock,
    }
}

/// 0.2 options a 0.1 plugin never lists (upfront terms) go down as the term they belong to.
fn option_down(o: c2::PurchaseOption) -> c1::PurchaseOption {
    use c2::PurchaseOption as P;
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

pub fn offering(o: c1::Offering) -> c2::Offering {
    let prices = o
        .prices
        .into_iter()
        .map(|p| c2::Price {
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
    c2::Offering {
        instance: o.instance,
        gpu: o.gpu,
        gpus_per_node: o.gpus_per_node,
        scale_up_domain: o.scale_up_domain,
        node_multiple: 1,
        interconnect_gbps: o.interconnect_gbps,
        prices,
    }
}

pub fn quote_request(r: &c2::QuoteRequest) -> c1::QuoteRequest {
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

pub fn quote(q: c1::ItemisedQuote) -> c2::ItemisedQuote {
    let lines = q
        .lines
        .into_iter()
        .map(|l| c2::QuoteLine {
            category: match l.unit.as_str() {
                "node-hour" => c2::LineCategory::Compute,
                "GB-month" => c2::LineCategory::Storage,
                "GB" => c2::LineCategory::Egress,
                _ => c2::LineCategory::Other,
            },
            item: l.item,
            quantity: l.quantity,
            unit: l.unit,
            amount: l.usd,
            estimate: l.estimate,
            caveats: Vec::new(),
        })
        .collect();
    c2::ItemisedQuote {
        currency: "USD".into(),
        lines,
        total: q.total_usd,
        warnings: Vec::new(),
    }
}

// --------------------------------------------------------------------------- precision

pub fn plan_request(r: &p2::PlanRequest) -> p1::PlanRequest {
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

fn operand(p: &p1::SitePlan, format: v1::Dtype) -> p2::OperandPlan {
    let format: v2::Dtype = format.into();
    let recipe: p2::ScalingRecipe = p.recipe.into();
    let block = if recipe == p2::ScalingRecipe::Block {
        p2::BlockShape {
            rows: 1,
            cols: p.block_size,
        }
    } else {
        p2::BlockShape { rows: 0, cols: 0 }
    };
    let (scale_format, scale_rounding, tensor_scale) = match format {
        v2::Dtype::Mxfp8 => (p2::ScaleFormat::E8m0, p2::ScaleRounding::PowerOfTwoUp, None),
        v2::Dtype::Nvfp4 => (
            p2::ScaleFormat::E4m3,
            p2::ScaleRounding::Exact,
            Some(p2::ScaleFormat::Fp32),
        ),
        _ => (p2::ScaleFormat::Fp32, p2::ScaleRounding::Exact, None),
    };
    p2::OperandPlan {
        format,
        recipe,
        block,
        scale_format,
        scale_rounding,
        tensor_scale,
        value_rounding: p2::ValueRounding::NearestEven,
        amax_history: p.amax_history,
        amax_reduction: p.amax_reduction.into(),
        margin: p.margin,
        saturate: p.saturate,
        hadamard: 0,
    }
}

pub fn plan_response(r: p1::PlanResponse) -> p2::PlanResponse {
    let sites = r
        .sites
        .iter()
        .map(|p| {
            let activation = operand(p, p.format);
            p2::SitePlan {
                weight: activation,
                activation,
                gradient: operand(p, p.grad_format),
                output: if v2::Dtype::from(p.format) == v2::Dtype::Fp32 {
                    v2::Dtype::Fp32
                } else {
                    v2::Dtype::Bf16
                },
            }
        })
        .collect();
    p2::PlanResponse {
        sites,
        state: r.state,
    }
}

pub fn step_metrics(m: &p2::StepMetrics) -> p1::StepMetrics {
    let sites = m
        .sites
        .iter()
        .map(|s| {
            let max =
                |f: fn(&p2::OperandMetrics) -> f64| s.operands.iter().map(f).fold(0.0, f64::max);
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

fn selector(s: p1::SiteSelector) -> p2::SiteSelector {
    p2::SiteSelector {
        layers: s.layers,
        names: s.names,
        roles: s.roles.into_iter().map(Into::into).collect(),
    }
}

pub fn step_response(r: p1::StepResponse) -> p2::StepResponse {
    let actions = r
        .actions
        .into_iter()
        .map(|a| match a {
            p1::Action::Fallback(f) => p2::Action::Fallback(p2::Fallback {
                sites: selector(f.sites),
                scope: f.scope.into(),
                to: f.to.into(),
            }),
            p1::Action::FallbackGlobal(scope) => p2::Action::FallbackGlobal(p2::GlobalFallback {
                scope: scope.into(),
                to: v2::Dtype::Bf16,
            }),
            p1::Action::ChangeRecipe(c) => p2::Action::ChangeRecipe(p2::RecipeChange {
                sites: selector(c.sites),
                recipe: c.recipe.into(),
                margin: c.margin,
                amax_history: c.amax_history,
            }),
            p1::Action::SkipStep => p2::Action::SkipStep,
            p1::Action::Rollback(rb) => p2::Action::Rollback(p2::Rollback {
                steps: rb.steps,
                skip_batches: rb.skip_batches,
            }),
            p1::Action::Repromote(s) => p2::Action::Repromote(p2::Repromotion {
                sites: selector(s),
                to: v2::Dtype::Fp8E4m3,
            }),
            p1::Action::Alert(m) => p2::Action::Alert(m),
        })
        .collect();
    p2::StepResponse {
        actions,
        state: r.state,
    }
}
