//! Property tests: random plugin answers (graphs, model descriptions, price lists, quotes,
//! plans, actions), built from values chosen to hit the edges (0, 1, u32/u64 maxima, NaN,
//! infinities, control characters, huge lists), go through the host's whole checking path.
//! Never a panic; every rejection a message that names what is wrong and is safe to print.

use proptest::prelude::*;

use crate::bindings::v3::Dtype;
use crate::bindings::v3::cost::exports::runner::plugin::cost_model as c;
use crate::bindings::v3::precision::exports::runner::plugin::precision_policy as p;
use crate::bindings::v3::workload::exports::runner::plugin::workload as w;

fn count() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(0u32),
        Just(1),
        Just(2),
        Just(3),
        Just(8),
        Just(64),
        Just(u32::MAX),
        0u32..200,
        any::<u32>()
    ]
}

fn dim() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(8),
        Just(1 << 20),
        Just(1 << 32),
        Just(u64::MAX),
        1u64..64
    ]
}

fn real() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(-1.0),
        Just(0.0),
        Just(1e300),
        0.0f64..1e4,
        any::<f64>()
    ]
}

/// Names from a small pool (so references resolve often), or hostile text.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["x", "w", "h", "y", "loss", "t", "targets"]).prop_map(String::from),
        1 => Just("\u{1b}[2Jx".to_string()),
        1 => Just(String::new()),
        1 => Just("a\nb".to_string()),
        1 => "[a-z]{1,12}",
    ]
}

const DTYPES: [Dtype; 8] = [
    Dtype::Fp32,
    Dtype::Bf16,
    Dtype::Fp16,
    Dtype::Fp8E4m3,
    Dtype::Fp8E5m2,
    Dtype::Mxfp8,
    Dtype::Nvfp4,
    Dtype::Int32,
];

fn dtype() -> impl Strategy<Value = Dtype> {
    prop::sample::select(DTYPES.to_vec())
}

fn tensor() -> impl Strategy<Value = w::Tensor> {
    (
        name(),
        prop::collection::vec(dim(), 0..5),
        dtype(),
        prop::sample::select(vec![
            w::TensorKind::Weight,
            w::TensorKind::Activation,
            w::TensorKind::Input,
        ]),
    )
        .prop_map(|(name, shape, dtype, kind)| w::Tensor {
            name,
            shape,
            dtype,
            kind,
        })
}

fn attr() -> impl Strategy<Value = w::Attribute> {
    let value = prop_oneof![
        any::<i64>().prop_map(w::AttrValue::Int),
        real().prop_map(w::AttrValue::Float),
        any::<bool>().prop_map(w::AttrValue::Flag),
        name().prop_map(w::AttrValue::Text),
    ];
    (
        prop::sample::select(vec![
            "eps", "theta", "rot-dim", "causal", "window", "scale", "top-k", "score", "experts",
            "chunk",
        ]),
        value,
    )
        .prop_map(|(key, value)| w::Attribute {
            key: key.into(),
            value,
        })
}

fn operation() -> impl Strategy<Value = w::Operation> {
    use w::OpKind as K;
    let kind = prop::sample::select(vec![
        K::Linear,
        K::Embedding,
        K::RmsNorm,
        K::LayerNorm,
        K::Rotary,
        K::Attention,
        K::Swiglu,
        K::Geglu,
        K::Gelu,
        K::SquaredRelu,
        K::Add,
        K::Concat,
        K::CrossEntropy,
        K::Router,
        K::MoeDispatch,
        K::GroupedLinear,
        K::MoeCombine,
        K::CausalConv1d,
        K::SsmScan,
    ]);
    let role = prop::sample::select(vec![
        w::ParallelRole::Replicated,
        w::ParallelRole::ColumnParallel,
        w::ParallelRole::RowParallel,
        w::ParallelRole::HeadParallel,
        w::ParallelRole::Sequence,
        w::ParallelRole::Expert,
        w::ParallelRole::VocabParallel,
    ]);
    (
        name(),
        kind,
        prop::collection::vec(name(), 0..4),
        prop::collection::vec(name(), 0..3),
        prop::collection::vec(attr(), 0..4),
        -2i32..4,
        role,
    )
        .prop_map(
            |(name, kind, inputs, outputs, attrs, layer, role)| w::Operation {
                name,
                kind,
                inputs,
                outputs,
                attrs,
                layer,
                role,
            },
        )
}

fn graph() -> impl Strategy<Value = w::ModelGraph> {
    (
        prop::collection::vec(tensor(), 0..10),
        prop::collection::vec(operation(), 0..8),
        name(),
    )
        .prop_map(|(tensors, operations, loss)| w::ModelGraph {
            tensors,
            operations,
            loss,
        })
}

/// A consistent embedding -> linear -> cross-entropy graph over random sizes: it passes
/// validation often, so counting and differentiation see extreme but valid graphs.
fn consistent_graph() -> impl Strategy<Value = w::ModelGraph> {
    (dim(), dim(), dim(), dim(), dtype()).prop_map(|(b, t, c, v, dtype)| {
        let tensor = |name: &str, shape: &[u64], dtype, kind| w::Tensor {
            name: name.into(),
            shape: shape.to_vec(),
            dtype,
            kind,
        };
        let op = |name: &str, kind, inputs: &[&str], output: &str| w::Operation {
            name: name.into(),
            kind,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: vec![output.into()],
            attrs: Vec::new(),
            layer: -1,
            role: w::ParallelRole::Replicated,
        };
        w::ModelGraph {
            tensors: vec![
                tensor("tokens", &[b, t], Dtype::Int32, w::TensorKind::Input),
                tensor("targets", &[b, t], Dtype::Int32, w::TensorKind::Input),
                tensor("embed.weight", &[v, c], dtype, w::TensorKind::Weight),
                tensor("h", &[b, t, c], dtype, w::TensorKind::Activation),
                tensor("head.weight", &[v, c], dtype, w::TensorKind::Weight),
                tensor("logits", &[b, t, v], dtype, w::TensorKind::Activation),
                tensor("loss", &[], Dtype::Fp32, w::TensorKind::Activation),
            ],
            operations: vec![
                op(
                    "embed",
                    w::OpKind::Embedding,
                    &["tokens", "embed.weight"],
                    "h",
                ),
                op(
                    "lm_head",
                    w::OpKind::Linear,
                    &["h", "head.weight"],
                    "logits",
                ),
                op(
                    "loss",
                    w::OpKind::CrossEntropy,
                    &["logits", "targets"],
                    "loss",
                ),
            ],
            loss: "loss".into(),
        }
    })
}

fn hyperparameters() -> BoxedStrategy<w::Hyperparameters> {
    (
        (
            count(),
            count(),
            count(),
            count(),
            count(),
            count(),
            count(),
        ),
        (real(), real(), any::<bool>(), any::<bool>()),
        (count(), count(), count(), count(), count()),
        (mamba(), layer_pattern(), any::<bool>()),
    )
        .prop_map(
            |(
                (layers, hidden, ffn, heads, kv_heads, head_dim, vocab),
                (rope_theta, norm_eps, tied, moe),
                (experts, top_k, dense, freq, latent),
                (mamba, pattern, fit),
            )| {
                // Often one character per layer, so the rules past the length are reached.
                let layer_pattern = if fit && layers <= 64 && !pattern.is_empty() {
                    pattern.chars().cycle().take(layers as usize).collect()
                } else {
                    pattern
                };
                w::Hyperparameters {
                    layers,
                    hidden,
                    ffn,
                    heads,
                    kv_heads,
                    head_dim,
                    vocab,
                    tied_embeddings: tied,
                    position: w::PositionScheme::Rope,
                    rope_theta,
                    max_position: 4096,
                    norm: w::NormKind::RmsNorm,
                    norm_eps,
                    activation: w::ActivationKind::Swiglu,
                    attention: w::AttentionKind::Gqa,
                    mla: None,
                    moe: moe.then_some(w::MoeConfig {
                        experts,
                        top_k,
                        shared_experts: 0,
                        expert_ffn: ffn,
                        shared_ffn: 0,
                        dense_layers: dense,
                        layer_frequency: freq,
                        score: w::RouterScore::Softmax,
                        normalize_top_k: true,
                        latent,
                    }),
                    attention_window: 0,
                    window_every: 0,
                    bias: false,
                    mtp_depth: 0,
                    mamba,
                    layer_pattern,
                }
            },
        )
        .boxed()
}

/// Mamba-2 mixer sizes, or none. Boxed, as is `hyperparameters`: the nested strategy
/// types otherwise overflow a test thread's stack in debug builds.
fn mamba() -> BoxedStrategy<Option<w::MambaConfig>> {
    prop::option::of((count(), count(), count(), count(), count(), count()))
        .prop_map(|m| {
            m.map(
                |(heads, head_dim, state, groups, conv_kernel, chunk)| w::MambaConfig {
                    heads,
                    head_dim,
                    state,
                    groups,
                    conv_kernel,
                    chunk,
                },
            )
        })
        .boxed()
}

/// Layer patterns: empty (a classic transformer), hybrids of the four block kinds, and
/// hostile text.
fn layer_pattern() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => Just(String::new()),
        4 => "[M*E-]{1,12}",
        1 => "[M*x\u{1b}\u{e9}-]{1,8}",
    ]
}

/// The contract's layout defaults, over the 0.3 bindings.
mod layouts {
    use super::w::*;
    runner_contract::reference_layout!(pub(super));
}

fn layout() -> impl Strategy<Value = w::ReferenceLayout> {
    (
        (count(), count(), count(), count(), count()),
        (count(), count(), count(), count()),
        (real(), count(), name()),
    )
        .prop_map(
            |((gpus_min, gpus_max, tp, pp, cp), (vp, ep, etp, fsdp), (gbs_per_gpu, mbs, gpu))| {
                let defaults = layouts::reference_layout(&gpu, gpus_min, gpus_max, w::TrainingPrecision::Fp8);
                w::ReferenceLayout { tp, pp, cp, vp, ep, etp, fsdp, mbs, gbs_per_gpu, ..defaults }
            },
        )
}

fn price() -> impl Strategy<Value = c::Price> {
    let option = prop::sample::select(crate::cost::PURCHASE_OPTIONS.to_vec());
    (
        name(),
        option,
        real(),
        real(),
        count(),
        count(),
        prop::sample::select(vec!["", "2026-02-29", "2024-02-29", "x"]),
    )
        .prop_map(
            |(region, option, hourly, upfront, increment, minimum, date)| c::Price {
                region,
                option,
                usd_per_node_hour: hourly,
                upfront_usd_per_node: upfront,
                billing_increment_s: increment,
                minimum_charge_s: minimum,
                effective_date: date.into(),
                source: String::new(),
                caveats: Vec::new(),
            },
        )
}

fn offering() -> impl Strategy<Value = c::Offering> {
    (
        name(),
        count(),
        count(),
        count(),
        real(),
        prop::collection::vec(price(), 0..4),
    )
        .prop_map(
            |(
                instance,
                gpus_per_node,
                scale_up_domain,
                node_multiple,
                interconnect_gbps,
                prices,
            )| c::Offering {
                instance,
                gpu: "H100".into(),
                gpus_per_node,
                scale_up_domain,
                node_multiple,
                interconnect_gbps,
                prices,
            },
        )
}

fn quote() -> impl Strategy<Value = c::ItemisedQuote> {
    let category = prop::sample::select(vec![
        c::LineCategory::Compute,
        c::LineCategory::Discount,
        c::LineCategory::Storage,
    ]);
    let line = (name(), category, real(), real()).prop_map(|(item, category, quantity, amount)| {
        c::QuoteLine {
            item,
            category,
            quantity,
            unit: "node-hour".into(),
            amount,
            estimate: false,
            caveats: Vec::new(),
        }
    });
    (
        prop::sample::select(vec!["USD", "usd", "EUR", ""]),
        prop::collection::vec(line, 0..4),
        real(),
    )
        .prop_map(|(currency, lines, total)| c::ItemisedQuote {
            currency: currency.into(),
            lines,
            total,
            warnings: Vec::new(),
        })
}

fn operand() -> impl Strategy<Value = p::OperandPlan> {
    let recipe = prop::sample::select(vec![
        p::ScalingRecipe::None,
        p::ScalingRecipe::Delayed,
        p::ScalingRecipe::Current,
        p::ScalingRecipe::Block,
    ]);
    let scale = prop::sample::select(vec![
        p::ScaleFormat::Fp32,
        p::ScaleFormat::E8m0,
        p::ScaleFormat::E4m3,
    ]);
    (
        dtype(),
        recipe,
        count(),
        count(),
        scale.clone(),
        prop::option::of(scale),
        count(),
        any::<i32>(),
        count(),
    )
        .prop_map(
            |(
                format,
                recipe,
                rows,
                cols,
                scale_format,
                tensor_scale,
                amax_history,
                margin,
                hadamard,
            )| p::OperandPlan {
                format,
                recipe,
                block: p::BlockShape {
                    rows: rows % 300,
                    cols,
                },
                scale_format,
                scale_rounding: p::ScaleRounding::PowerOfTwoUp,
                tensor_scale,
                value_rounding: p::ValueRounding::NearestEven,
                amax_history,
                amax_reduction: p::AmaxReduction::Max,
                margin,
                saturate: true,
                hadamard,
            },
        )
}

/// A rule's message: present, printable, bounded.
fn clear(message: &str) -> Result<(), TestCaseError> {
    prop_assert!(!message.trim().is_empty());
    prop_assert!(message.len() < 16 << 10, "{} bytes", message.len());
    prop_assert!(
        !message.chars().any(runner_contract::text::is_unsafe),
        "unsafe text: {message:?}"
    );
    // A plugin's 1e300 is shown as 1e300, not as 301 digits.
    let longest = message.split(|c: char| !c.is_ascii_digit()).map(str::len).max().unwrap_or(0);
    prop_assert!(longest <= 24, "a {longest}-digit number: {message:?}");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_graphs_are_converted_validated_and_counted_without_panics(
        g in prop_oneof![graph(), consistent_graph()],
    ) {
        use runner_graph::count::{self, Convention};
        match crate::workload::graph_to_ir(g) {
            Err(m) => clear(&m)?,
            Ok(ir) => match runner_graph::validate::validate(&ir) {
                Err(e) => clear(&e.to_string())?,
                Ok(()) => {
                    // What the host does with a valid graph must not panic either.
                    let _ = count::params(&ir);
                    let _ = count::model_flops_per_step(&ir, &Convention::FULL);
                    let _ = runner_graph::autodiff::backward_plan(&ir);
                }
            },
        }
    }

    #[test]
    fn random_model_descriptions_are_checked_without_panics(
        hyper in hyperparameters(),
        layouts in prop::collection::vec(layout(), 0..3),
        tokens in real(),
    ) {
        let info = w::ModelInfo {
            family: "f".into(),
            variants: vec![w::Variant {
                name: "v".into(),
                family: "f".into(),
                citation: String::new(),
                hyper,
                defaults: w::TrainingDefaults { seq_len: 8, tokens, optimizer: "adamw".into(), learning_rate: 1e-3, weight_decay: 0.1 },
                layouts,
            }],
        };
        if let Err(m) = crate::workload::validate_model_info(&info) {
            clear(&m)?;
        }
    }

    #[test]
    fn random_price_lists_and_quotes_are_checked_without_panics(
        offerings in prop::collection::vec(offering(), 0..4),
        q in quote(),
        nodes in count(),
        hours in real(),
    ) {
        if let Err(m) = crate::cost::validate_offerings(&offerings) {
            clear(&m)?;
        }
        let request = c::QuoteRequest {
            instance: offerings.first().map_or_else(String::new, |o| o.instance.clone()),
            gpus: nodes,
            nodes,
            hours,
            region: String::new(),
            option: c::PurchaseOption::OnDemand,
            start_date: String::new(),
            storage_gb_months: 0.0,
            egress_gb: 0.0,
        };
        if let Err(m) = crate::cost::validate_quote(&request, &q, &offerings) {
            clear(&m)?;
        }
    }

    #[test]
    fn random_plans_are_checked_without_panics(
        plans in prop::collection::vec((operand(), operand(), operand(), dtype()), 0..4),
        sites in 0usize..4,
        device in prop::sample::select(vec!["H100", "B200", "cpu", "\u{1b}]0;x\u{7}"]),
    ) {
        let request = p::PlanRequest {
            model: "m".into(),
            layers: 2,
            device: crate::precision::device_capabilities(device),
            sites: (0..sites)
                .map(|i| p::GemmSite { layer: 0, name: format!("s{i}"), role: p::GemmRole::Forward, m: 1, n: 1, k: 1 })
                .collect(),
            state: Vec::new(),
        };
        let response = p::PlanResponse {
            sites: plans
                .into_iter()
                .map(|(activation, weight, gradient, output)| p::SitePlan { activation, weight, gradient, output })
                .collect(),
            state: Vec::new(),
        };
        if let Err(m) = crate::precision::validate_plan(&request, &response) {
            clear(&m)?;
        }
    }
}

/// The contract's format names and the IR's are one map seen from two enums: they agree.
#[test]
fn contract_and_ir_name_every_format_alike() {
    for d in DTYPES {
        assert_eq!(
            crate::precision::dtype_name(d),
            crate::workload::dtype_to_ir(d).name()
        );
    }
}
