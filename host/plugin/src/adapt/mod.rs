//! Plugins of older contracts, adapted to 0.3.0 one version at a time: a 0.1 plugin's
//! answer goes up 0.1 -> 0.2 (`v1`) -> 0.3 (`v2`), a request goes down the same steps in
//! reverse; what an older contract cannot hear is dropped, what it cannot say gets the
//! default below. The rest of the runner only ever sees 0.3 values, and validates them by
//! the 0.3 rules. Cost and precision did not change from 0.2 to 0.3, so a 0.2 plugin of
//! those kinds is called with the 0.3 types directly (`bindings.rs`) and a 0.1 one is
//! adapted straight to them.
//!
//! Defaults, each the reading an older plugin's author meant:
//! - 0.2 workload: no Mamba mixer (`mamba: none`), an empty `layer-pattern` (every layer
//!   attention then MLP or MoE, as `moe` says: what 0.2 could describe), and `latent: 0` in
//!   a MoE config (experts run at hidden width). Graph requests go down unchanged; a 0.2
//!   graph has none of 0.3's new operations.
//! - 0.1 workload: a layout's precision string is parsed by the shared name table (`FP8`
//!   is FP8 with no stated recipe; an unknown name is refused); no sequence parallelism,
//!   recompute, distributed optimizer or overlap, the variant's sequence length, no
//!   published measurement; then the 0.2 defaults. Graph requests other than training are
//!   refused (0.1 has no phase).
//! - 0.1 cost: each price gets its offering's billing increment, minimum, date and source,
//!   no upfront payment and no caveats; `reserved-one-year` / `-three-year` become the
//!   no-upfront terms; nodes are sold one at a time. Quote lines are in USD, with the
//!   category their unit implies (node-hour: compute, GB-month: storage, GB: egress).
//! - 0.1 precision: a site's `format` plans the activation and weight, `grad-format` the
//!   gradient; `block-size` becomes a 1 x block-size block (MXFP8: E8M0 scales rounded up
//!   to a power of two; NVFP4: E4M3 block scales under an FP32 tensor scale); the output is
//!   FP32 for FP32 sites and BF16 otherwise. Step metrics go down with one amax per site
//!   (the largest over its operands) and come back with `fallback-global` to BF16 and
//!   `repromote` to FP8 E4M3.

pub mod v1;
pub mod v2;

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

/// What a workload answer keeps from one contract version to the next, from the workload
/// module `$from` to `$to`: the same enum cases at each step (0.3's two new operations are
/// cases no older graph holds), the same graphs, and hyperparameters that gain the fields
/// given with their defaults (`hyperparameters { .. }`, `moe { .. }`).
macro_rules! workload_up {
    (
        $from:ident => $to:ident,
        hyperparameters { $($hf:ident: $hv:expr),* $(,)? },
        moe { $($mf:ident: $mv:expr),* $(,)? } $(,)?
    ) => {
        same_enum!($from::PositionScheme => $to::PositionScheme { Rope, Learned, None });
        same_enum!($from::NormKind => $to::NormKind { RmsNorm, LayerNorm });
        same_enum!($from::ActivationKind => $to::ActivationKind { Swiglu, Gelu, SquaredRelu, Geglu });
        same_enum!($from::AttentionKind => $to::AttentionKind { Mha, Gqa, Mla });
        same_enum!($from::RouterScore => $to::RouterScore { Softmax, Sigmoid });
        same_enum!($from::TensorKind => $to::TensorKind { Weight, Activation, Input });
        same_enum!($from::OpKind => $to::OpKind {
            Linear, Embedding, RmsNorm, LayerNorm, Rotary, Attention, Swiglu, Geglu, Gelu,
            SquaredRelu, Add, Concat, CrossEntropy, Router, MoeDispatch, GroupedLinear, MoeCombine,
        });
        same_enum!($from::ParallelRole => $to::ParallelRole {
            Replicated, ColumnParallel, RowParallel, HeadParallel, Sequence, Expert, VocabParallel,
        });

        /// A graph one version up: the same tensors and operations.
        pub fn model_graph(g: $from::ModelGraph) -> $to::ModelGraph {
            $to::ModelGraph {
                tensors: g
                    .tensors
                    .into_iter()
                    .map(|t| $to::Tensor {
                        name: t.name,
                        shape: t.shape,
                        dtype: t.dtype.into(),
                        kind: t.kind.into(),
                    })
                    .collect(),
                operations: g
                    .operations
                    .into_iter()
                    .map(|o| $to::Operation {
                        name: o.name,
                        kind: o.kind.into(),
                        inputs: o.inputs,
                        outputs: o.outputs,
                        attrs: o
                            .attrs
                            .into_iter()
                            .map(|a| $to::Attribute {
                                key: a.key,
                                value: match a.value {
                                    $from::AttrValue::Int(v) => $to::AttrValue::Int(v),
                                    $from::AttrValue::Float(v) => $to::AttrValue::Float(v),
                                    $from::AttrValue::Flag(v) => $to::AttrValue::Flag(v),
                                    $from::AttrValue::Text(v) => $to::AttrValue::Text(v),
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

        fn hyperparameters(h: $from::Hyperparameters) -> $to::Hyperparameters {
            $to::Hyperparameters {
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
                mla: h.mla.map(|m| $to::MlaConfig {
                    q_lora_rank: m.q_lora_rank,
                    kv_lora_rank: m.kv_lora_rank,
                    qk_nope_head_dim: m.qk_nope_head_dim,
                    qk_rope_head_dim: m.qk_rope_head_dim,
                    v_head_dim: m.v_head_dim,
                }),
                moe: h.moe.map(|m| $to::MoeConfig {
                    experts: m.experts,
                    top_k: m.top_k,
                    shared_experts: m.shared_experts,
                    expert_ffn: m.expert_ffn,
                    shared_ffn: m.shared_ffn,
                    dense_layers: m.dense_layers,
                    layer_frequency: m.layer_frequency,
                    score: m.score.into(),
                    normalize_top_k: m.normalize_top_k,
                    $($mf: $mv,)*
                }),
                attention_window: h.attention_window,
                window_every: h.window_every,
                bias: h.bias,
                mtp_depth: h.mtp_depth,
                $($hf: $hv,)*
            }
        }

        fn defaults(d: $from::TrainingDefaults) -> $to::TrainingDefaults {
            $to::TrainingDefaults {
                seq_len: d.seq_len,
                tokens: d.tokens,
                optimizer: d.optimizer,
                learning_rate: d.learning_rate,
                weight_decay: d.weight_decay,
            }
        }
    };
}

use {same_enum, workload_up};
