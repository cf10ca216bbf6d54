//! Workload plugins seen from the host: `describe` (validated model info) and `graph`
//! (converted into the host's graph IR and validated, so a plugin can never hand the
//! executor or the FLOP counter an inconsistent graph). Both are checked on every call:
//! a plugin may answer each call differently.

use runner_graph::Graph;

use crate::bindings::v3::workload::exports::runner::plugin::workload as wit;
use crate::bindings::{v1, v2, v3};
use crate::sandbox::{Limits, Sandboxed};
use crate::{Failure, Kind, Plugin, PluginError, PluginInfo, Pre, adapt};

pub use wit::{
    ActivationKind, AttentionKind, GraphRequest, Hyperparameters, InferenceShape, MambaConfig,
    MlaConfig, ModelInfo, MoeConfig, NormKind, Phase, PositionScheme, PublishedMeasurement,
    RecomputeGranularity, ReferenceLayout, RouterScore, TrainingDefaults, TrainingPrecision,
    Variant,
};

/// The contract's rules for workload answers and graphs (`runner_contract`), expanded
/// over the host's 0.3 bindings: the same code the SDK and the testkit run.
mod rules {
    use super::wit::*;
    use crate::bindings::v3::Dtype;
    runner_contract::workload_rules!();
    runner_contract::graph_to_ir!();
}
pub use rules::{
    dtype_to_ir, graph_to_ir, training_precision, training_precision_name,
    validate_hyperparameters, validate_layout, validate_model_info, validate_variant,
};

impl GraphRequest {
    /// A training graph request (the only phase the host builds so far).
    pub fn training(variant: &str, seq_len: u32, micro_batch: u32, layers: u32) -> GraphRequest {
        GraphRequest {
            variant: variant.to_string(),
            seq_len,
            micro_batch,
            layers,
            phase: Phase::Training,
        }
    }
}

enum Instance {
    V3(Sandboxed<v3::workload::WorkloadPlugin>),
    V2(Sandboxed<v2::workload::WorkloadPlugin>),
    V1(Sandboxed<v1::workload::WorkloadPlugin>),
}

/// A live, sandboxed workload plugin.
pub struct Workload {
    pub info: PluginInfo,
    instance: Instance,
}

impl Plugin {
    /// Instantiate as a workload plugin.
    pub fn workload(&self, limits: Limits) -> Result<Workload, PluginError> {
        self.expect_kind(Kind::Workload)?;
        let name = &self.info.name;
        let instance = match &self.pre {
            Pre::WorkloadV3(pre) => Instance::V3(Sandboxed::new(name, pre.clone(), limits)),
            Pre::WorkloadV2(pre) => Instance::V2(Sandboxed::new(name, pre.clone(), limits)),
            Pre::WorkloadV1(pre) => Instance::V1(Sandboxed::new(name, pre.clone(), limits)),
            _ => unreachable!("the kind was checked against the pre-instantiation"),
        };
        Ok(Workload {
            info: self.info.clone(),
            instance,
        })
    }
}

impl Workload {
    /// Every family and variant, validated.
    pub fn describe(&mut self) -> Result<ModelInfo, PluginError> {
        let info = match &mut self.instance {
            Instance::V3(s) => s.call("describe", |s, p| {
                p.runner_plugin_workload().call_describe(s)
            })?,
            Instance::V2(s) => adapt::v2::model_info(s.call("describe", |s, p| {
                p.runner_plugin_workload().call_describe(s)
            })?),
            Instance::V1(s) => {
                let old = s.call("describe", |s, p| {
                    p.runner_plugin_workload().call_describe(s)
                })?;
                let v2 = adapt::v1::model_info(old).map_err(|m| self.invalid("describe", m))?;
                adapt::v2::model_info(v2)
            }
        };
        validate_model_info(&info).map_err(|m| self.invalid("describe", m))?;
        Ok(info)
    }

    /// The logical forward graph of one variant, as host IR, validated.
    pub fn graph(&mut self, request: &GraphRequest) -> Result<Graph, PluginError> {
        let result = match &mut self.instance {
            Instance::V3(s) => s.call("graph", |s, p| {
                p.runner_plugin_workload().call_graph(s, request)
            })?,
            Instance::V2(s) => {
                let old = adapt::v2::graph_request(request);
                s.call("graph", |s, p| {
                    p.runner_plugin_workload().call_graph(s, &old)
                })?
                .map(adapt::v2::model_graph)
            }
            Instance::V1(s) => {
                let old =
                    adapt::v1::graph_request(&adapt::v2::graph_request(request)).map_err(|m| {
                        PluginError::new(&self.info.name, "graph", Failure::Contract(m))
                    })?;
                s.call("graph", |s, p| {
                    p.runner_plugin_workload().call_graph(s, &old)
                })?
                .map(|g| adapt::v2::model_graph(adapt::v1::model_graph(g)))
            }
        };
        let graph =
            result.map_err(|m| PluginError::new(&self.info.name, "graph", Failure::Refused(m)))?;
        let graph = graph_to_ir(&graph).map_err(|m| self.invalid("graph", m))?;
        runner_graph::validate::validate(&graph)
            .map_err(|e| self.invalid("graph", e.to_string()))?;
        Ok(graph)
    }

    fn invalid(&self, call: &str, rule: String) -> PluginError {
        PluginError::new(&self.info.name, call, Failure::Invalid(rule))
    }
}

/// The 0.3 rules for hybrid models (`runner_contract::workload_rules!`, as the host expands
/// them): each refused with a message naming the field, and a valid hybrid accepted.
#[cfg(test)]
mod tests {
    use super::*;

    /// A small Nemotron-H-like hybrid: Mamba-2 mixers, attention, dense MLPs and MoE.
    fn hybrid() -> Hyperparameters {
        Hyperparameters {
            layers: 8,
            hidden: 64,
            ffn: 128,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            vocab: 256,
            tied_embeddings: false,
            position: PositionScheme::None,
            rope_theta: 0.0,
            max_position: 4096,
            norm: NormKind::RmsNorm,
            norm_eps: 1e-5,
            activation: ActivationKind::SquaredRelu,
            attention: AttentionKind::Gqa,
            mla: None,
            moe: Some(MoeConfig {
                experts: 8,
                top_k: 2,
                shared_experts: 1,
                expert_ffn: 32,
                shared_ffn: 32,
                dense_layers: 0,
                layer_frequency: 1,
                score: RouterScore::Sigmoid,
                normalize_top_k: true,
                latent: 32,
            }),
            attention_window: 0,
            window_every: 0,
            bias: false,
            mtp_depth: 0,
            mamba: Some(MambaConfig {
                heads: 8,
                head_dim: 16,
                state: 64,
                groups: 2,
                conv_kernel: 4,
                chunk: 128,
            }),
            layer_pattern: "M*M-MEM-".into(),
        }
    }

    fn layout(tp: u32) -> ReferenceLayout {
        ReferenceLayout {
            gpu: "H100".into(),
            gpus_min: 8,
            gpus_max: 8,
            precision: TrainingPrecision::Bf16,
            tp,
            pp: 1,
            cp: 1,
            vp: 1,
            ep: 1,
            etp: 1,
            fsdp: 0,
            sequence_parallel: false,
            recompute: RecomputeGranularity::None,
            recompute_layers: 0,
            distributed_optimizer: false,
            overlap_grad_reduce: false,
            overlap_param_gather: false,
            tp_comm_overlap: false,
            seq_len: 0,
            mbs: 1,
            gbs_per_gpu: 1.0,
            gbs_fixed: 0,
            measured: None,
            source: "test".into(),
        }
    }

    /// The rules refuse `h`, with a message that holds every one of `words`.
    #[track_caller]
    fn refused(h: &Hyperparameters, words: &[&str]) {
        let m = validate_hyperparameters(h).expect_err("must be refused");
        for w in words {
            assert!(m.contains(w), "{w:?} not in: {m}");
        }
    }

    #[test]
    fn a_valid_hybrid_and_a_classic_transformer_are_accepted() {
        let h = hybrid();
        assert_eq!(validate_hyperparameters(&h), Ok(()));
        assert_eq!(validate_layout(&layout(2), &h), Ok(()));
        let classic = Hyperparameters {
            mamba: None,
            layer_pattern: String::new(),
            ..hybrid()
        };
        assert_eq!(validate_hyperparameters(&classic), Ok(()));
        // Without a pattern, moe may place its blocks itself.
        let mut interleaved = classic;
        interleaved.moe.as_mut().unwrap().layer_frequency = 2;
        assert_eq!(validate_hyperparameters(&interleaved), Ok(()));
    }

    #[test]
    fn a_layer_pattern_holds_only_the_four_block_kinds_shown_escaped() {
        let mut h = hybrid();
        h.layer_pattern = "M*M-MxM-".into();
        refused(&h, &["layer-pattern", "'x'", "M (Mamba-2 mixer)"]);
        h.layer_pattern = "M*M-M\u{1b}[2J".into();
        let m = validate_hyperparameters(&h).unwrap_err();
        assert!(
            m.contains("layer-pattern") && !m.contains('\u{1b}'),
            "{m:?}"
        );
    }

    #[test]
    fn a_layer_pattern_has_one_character_per_layer() {
        let mut h = hybrid();
        h.layer_pattern = "M*M-MEM".into();
        refused(&h, &["layer-pattern has 7 characters", "layers is 8"]);
    }

    #[test]
    fn each_block_kind_needs_its_sizes() {
        let mut h = hybrid();
        h.mamba = None;
        refused(&h, &["layer-pattern", "(M)", "mamba"]);
        let mut h = hybrid();
        h.moe = None;
        refused(&h, &["layer-pattern", "(E)", "moe"]);
        let mut h = hybrid();
        h.ffn = 0;
        refused(&h, &["ffn", "got 0", "dense MLP"]);
        // No `-` layer: no dense MLP, and ffn may be 0.
        h.layer_pattern = "M*M*MEME".into();
        assert_eq!(validate_hyperparameters(&h), Ok(()));
    }

    #[test]
    fn sizes_no_layer_uses_are_refused() {
        let mut h = hybrid();
        h.layer_pattern = "-*-*-E-E".into();
        refused(&h, &["mamba", "no Mamba layer"]);
        let mut h = hybrid();
        h.layer_pattern = "M*M-M-M-".into();
        refused(&h, &["moe", "no MoE layer"]);
        let mut h = hybrid();
        h.layer_pattern.clear();
        refused(&h, &["mamba", "no Mamba layer"]);
    }

    #[test]
    fn with_a_pattern_moe_places_no_blocks_of_its_own() {
        let mut h = hybrid();
        h.moe.as_mut().unwrap().dense_layers = 1;
        refused(&h, &["moe.dense-layers", "got 1 and 1"]);
        let mut h = hybrid();
        h.moe.as_mut().unwrap().layer_frequency = 2;
        refused(&h, &["moe.layer-frequency", "got 0 and 2"]);
    }

    #[test]
    fn mamba_sizes_are_in_range_and_groups_divide_heads() {
        type Set = fn(&mut MambaConfig, u32);
        let fields: [(&str, Set, u32); 6] = [
            ("mamba.heads", |m, v| m.heads = v, 1 << 16),
            ("mamba.head-dim", |m, v| m.head_dim = v, 1 << 20),
            ("mamba.state", |m, v| m.state = v, 4096),
            ("mamba.groups", |m, v| m.groups = v, 1 << 16),
            ("mamba.conv-kernel", |m, v| m.conv_kernel = v, 64),
            ("mamba.chunk", |m, v| m.chunk = v, 4096),
        ];
        for (name, set, max) in fields {
            for bad in [0, max + 1] {
                let mut h = hybrid();
                set(h.mamba.as_mut().unwrap(), bad);
                refused(&h, &[name, &format!("got {bad}")]);
            }
        }
        let mut h = hybrid();
        h.mamba.as_mut().unwrap().groups = 3;
        refused(&h, &["mamba.groups (3) must divide mamba.heads (8)"]);
        let mut h = hybrid();
        let m = h.mamba.as_mut().unwrap();
        (m.heads, m.head_dim) = (1024, 2048);
        refused(&h, &["mamba.heads x mamba.head-dim", "1024 x 2048"]);
    }

    #[test]
    fn a_latent_moe_width_is_bounded() {
        let mut h = hybrid();
        h.moe.as_mut().unwrap().latent = (1 << 20) + 1;
        refused(&h, &["moe.latent", "got 1048577"]);
    }

    #[test]
    fn tp_splits_whole_mamba_groups_and_attention_heads_only_where_there_is_attention() {
        let h = hybrid();
        let m = validate_layout(&layout(4), &h).unwrap_err();
        assert!(
            m.contains("tp 4") && m.contains("2 groups") && m.contains("mamba.groups"),
            "{m}"
        );
        // 6 attention heads: tp 4 does not divide them; without attention layers, no matter.
        let mut h = hybrid();
        (h.heads, h.kv_heads) = (6, 6);
        h.mamba.as_mut().unwrap().groups = 4;
        let m = validate_layout(&layout(4), &h).unwrap_err();
        assert!(m.contains("6 attention heads"), "{m}");
        h.layer_pattern = "M-M-MEM-".into();
        assert_eq!(validate_layout(&layout(4), &h), Ok(()));
    }

    #[test]
    fn the_mamba_operations_map_to_the_ir() {
        use runner_graph::OpKind as K;
        let op = |kind| wit::Operation {
            name: "op".into(),
            kind,
            inputs: Vec::new(),
            outputs: vec!["y".into()],
            attrs: Vec::new(),
            layer: 0,
            role: wit::ParallelRole::Replicated,
        };
        for (kind, ir) in [
            (wit::OpKind::CausalConv1d, K::CausalConv1d),
            (wit::OpKind::SsmScan, K::SsmScan),
        ] {
            let g = wit::ModelGraph {
                tensors: vec![wit::Tensor {
                    name: "y".into(),
                    shape: Vec::new(),
                    dtype: crate::bindings::v3::Dtype::Fp32,
                    kind: wit::TensorKind::Activation,
                }],
                operations: vec![op(kind)],
                loss: "y".into(),
            };
            let g = graph_to_ir(&g).unwrap();
            assert_eq!(g.ops[0].kind, ir);
        }
    }
}
