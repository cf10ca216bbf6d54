//! Workload plugins seen from the host: `describe` (validated model info) and `graph`
//! (converted into the host's graph IR and validated, so a plugin can never hand the
//! executor or the FLOP counter an inconsistent graph).

use std::collections::{BTreeMap, HashSet};

use runner_graph::{Attr, DType, Graph, NamedOp, OpKind, Role, Tensor, TensorKind};

use super::bindings::workload::WorkloadPlugin;
use super::bindings::workload::exports::runner::plugin::workload as wit;
use super::sandbox::{Limits, Sandboxed, linker};
use super::{Failure, Kind, Plugin, PluginError, PluginInfo};

pub use wit::{
    ActivationKind, AttentionKind, GraphRequest, Hyperparameters, MlaConfig, ModelInfo, MoeConfig,
    NormKind, PositionScheme, ReferenceLayout, RouterScore, TrainingDefaults, Variant,
};

/// A live, sandboxed workload plugin.
pub struct Workload {
    pub info: PluginInfo,
    sandbox: Sandboxed<WorkloadPlugin>,
}

impl Plugin {
    /// Instantiate as a workload plugin.
    pub fn workload(&self, limits: Limits) -> Result<Workload, PluginError> {
        self.expect_kind(Kind::Workload)?;
        let pre = linker()
            .and_then(|l| l.instantiate_pre(&self.component))
            .and_then(super::bindings::workload::WorkloadPluginPre::new)
            .map_err(|e| {
                PluginError::new(&self.info.name, "load", Failure::Load(format!("{e:#}")))
            })?;
        Ok(Workload {
            info: self.info.clone(),
            sandbox: Sandboxed::new(&self.info.name, pre, limits),
        })
    }
}

impl Workload {
    /// Every family and variant, validated.
    pub fn describe(&mut self) -> Result<ModelInfo, PluginError> {
        let info = self.sandbox.call("describe", |s, p| {
            p.runner_plugin_workload().call_describe(s)
        })?;
        validate_model_info(&info).map_err(|m| self.invalid("describe", m))?;
        Ok(info)
    }

    /// The logical forward graph of one variant, as host IR, validated.
    pub fn graph(&mut self, request: &GraphRequest) -> Result<Graph, PluginError> {
        let result = self.sandbox.call("graph", |s, p| {
            p.runner_plugin_workload().call_graph(s, request)
        })?;
        let graph =
            result.map_err(|m| PluginError::new(&self.info.name, "graph", Failure::Refused(m)))?;
        let graph = convert_graph(graph).map_err(|m| self.invalid("graph", m))?;
        runner_graph::validate::validate(&graph)
            .map_err(|e| self.invalid("graph", e.to_string()))?;
        Ok(graph)
    }

    fn invalid(&self, call: &str, rule: String) -> PluginError {
        PluginError::new(&self.info.name, call, Failure::Invalid(rule))
    }
}

fn finite_positive(what: &str, v: f64) -> Result<(), String> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(format!("{what} must be finite and > 0, got {v}"))
    }
}

fn at_least_one(what: &str, v: u32) -> Result<(), String> {
    if v >= 1 {
        Ok(())
    } else {
        Err(format!("{what} must be at least 1, got {v}"))
    }
}

/// The rules `describe` output must follow.
pub fn validate_model_info(info: &ModelInfo) -> Result<(), String> {
    if info.family.trim().is_empty() {
        return Err("family name is empty".into());
    }
    if info.variants.is_empty() {
        return Err(format!("family '{}' has no variants", info.family));
    }
    let mut names = HashSet::new();
    for v in &info.variants {
        if v.name.trim().is_empty() {
            return Err("a variant has an empty name".into());
        }
        if !names.insert(v.name.as_str()) {
            return Err(format!("variant name '{}' appears twice", v.name));
        }
        validate_variant(v).map_err(|m| format!("variant '{}': {m}", v.name))?;
    }
    Ok(())
}

fn validate_variant(v: &Variant) -> Result<(), String> {
    let h = &v.hyper;
    for (what, value) in [
        ("layers", h.layers),
        ("hidden", h.hidden),
        ("heads", h.heads),
        ("kv-heads", h.kv_heads),
        ("head-dim", h.head_dim),
        ("vocab", h.vocab),
    ] {
        at_least_one(what, value)?;
    }
    if !h.heads.is_multiple_of(h.kv_heads) {
        return Err(format!(
            "heads ({}) must be a multiple of kv-heads ({})",
            h.heads, h.kv_heads
        ));
    }
    finite_positive("norm-eps", h.norm_eps)?;
    if h.position == PositionScheme::Rope {
        finite_positive("rope-theta", h.rope_theta)?;
    }
    if h.moe.is_none() || h.moe.as_ref().is_some_and(|m| m.dense_layers > 0) {
        at_least_one("ffn", h.ffn)?;
    }
    if let Some(m) = &h.moe {
        at_least_one("moe.experts", m.experts)?;
        at_least_one("moe.expert-ffn", m.expert_ffn)?;
        at_least_one("moe.layer-frequency", m.layer_frequency)?;
        if m.top_k < 1 || m.top_k > m.experts {
            return Err(format!(
                "moe.top-k must be in 1..={}, got {}",
                m.experts, m.top_k
            ));
        }
        if m.dense_layers > h.layers {
            return Err(format!(
                "moe.dense-layers ({}) exceeds layers ({})",
                m.dense_layers, h.layers
            ));
        }
    }
    if h.attention == AttentionKind::Mla && h.mla.is_none() {
        return Err("attention is mla but no mla ranks are given".into());
    }
    let d = &v.defaults;
    at_least_one("defaults.seq-len", d.seq_len)?;
    finite_positive("defaults.tokens", d.tokens)?;
    if !(d.learning_rate.is_finite() && d.learning_rate >= 0.0) {
        return Err(format!(
            "defaults.learning-rate must be finite and >= 0, got {}",
            d.learning_rate
        ));
    }
    for (i, l) in v.layouts.iter().enumerate() {
        let ctx = |m: String| format!("layout #{i} ({} {}): {m}", l.gpu, l.precision);
        for (what, value) in [
            ("tp", l.tp),
            ("pp", l.pp),
            ("cp", l.cp),
            ("vp", l.vp),
            ("ep", l.ep),
            ("etp", l.etp),
            ("mbs", l.mbs),
            ("gpus-min", l.gpus_min),
        ] {
            at_least_one(what, value).map_err(ctx)?;
        }
        if l.gpus_min > l.gpus_max {
            return Err(ctx(format!(
                "gpus-min {} > gpus-max {}",
                l.gpus_min, l.gpus_max
            )));
        }
        if !(l.gbs_per_gpu.is_finite() && l.gbs_per_gpu >= 0.0)
            || (l.gbs_per_gpu == 0.0 && l.gbs_fixed == 0)
        {
            return Err(ctx(
                "the global batch rule gives no batch (gbs-per-gpu and gbs-fixed are both 0)"
                    .into(),
            ));
        }
    }
    Ok(())
}

fn dtype(d: super::bindings::Dtype) -> DType {
    use super::bindings::Dtype as W;
    match d {
        W::Fp32 => DType::F32,
        W::Bf16 => DType::BF16,
        W::Fp16 => DType::F16,
        W::Fp8E4m3 => DType::Fp8E4M3,
        W::Fp8E5m2 => DType::Fp8E5M2,
        W::Mxfp8 => DType::MxFp8,
        W::Nvfp4 => DType::NvFp4,
        W::Int32 => DType::I32,
    }
}

fn op_kind(k: wit::OpKind) -> OpKind {
    use wit::OpKind as W;
    match k {
        W::Linear => OpKind::Linear,
        W::Embedding => OpKind::Embedding,
        W::RmsNorm => OpKind::RmsNorm,
        W::LayerNorm => OpKind::LayerNorm,
        W::Rotary => OpKind::Rotary,
        W::Attention => OpKind::Attention,
        W::Swiglu => OpKind::SwiGlu,
        W::Geglu => OpKind::GeGlu,
        W::Gelu => OpKind::Gelu,
        W::SquaredRelu => OpKind::SquaredRelu,
        W::Add => OpKind::Add,
        W::Concat => OpKind::Concat,
        W::CrossEntropy => OpKind::CrossEntropy,
        W::Router => OpKind::Router,
        W::MoeDispatch => OpKind::MoeDispatch,
        W::GroupedLinear => OpKind::GroupedLinear,
        W::MoeCombine => OpKind::MoeCombine,
    }
}

fn role(r: wit::ParallelRole) -> Role {
    use wit::ParallelRole as W;
    match r {
        W::Replicated => Role::Replicated,
        W::ColumnParallel => Role::ColumnParallel,
        W::RowParallel => Role::RowParallel,
        W::HeadParallel => Role::HeadParallel,
        W::Sequence => Role::Sequence,
        W::Expert => Role::Expert,
        W::VocabParallel => Role::VocabParallel,
    }
}

/// WIT graph -> host IR. Rejects non-finite attributes and duplicate names on the way.
fn convert_graph(g: wit::ModelGraph) -> Result<Graph, String> {
    let tensors = g
        .tensors
        .into_iter()
        .map(|t| Tensor {
            name: t.name,
            shape: t.shape,
            dtype: dtype(t.dtype),
            kind: match t.kind {
                wit::TensorKind::Weight => TensorKind::Weight,
                wit::TensorKind::Activation => TensorKind::Activation,
                wit::TensorKind::Input => TensorKind::Input,
            },
        })
        .collect();
    let mut op_names = HashSet::new();
    let mut ops = Vec::with_capacity(g.operations.len());
    for op in g.operations {
        if !op_names.insert(op.name.clone()) {
            return Err(format!("operation name '{}' appears twice", op.name));
        }
        let mut attrs = BTreeMap::new();
        for a in op.attrs {
            let value = match a.value {
                wit::AttrValue::Int(v) => Attr::Int(v),
                wit::AttrValue::Float(v) if v.is_finite() => Attr::Float(v),
                wit::AttrValue::Float(v) => {
                    return Err(format!(
                        "operation '{}': attribute '{}' is not finite ({v})",
                        op.name, a.key
                    ));
                }
                wit::AttrValue::Flag(v) => Attr::Flag(v),
                wit::AttrValue::Text(v) => Attr::Text(v),
            };
            if attrs.insert(a.key.clone(), value).is_some() {
                return Err(format!(
                    "operation '{}': attribute '{}' given twice",
                    op.name, a.key
                ));
            }
        }
        ops.push(NamedOp {
            name: op.name,
            kind: op_kind(op.kind),
            inputs: op.inputs,
            outputs: op.outputs,
            attrs,
            layer: op.layer,
            role: role(op.role),
        });
    }
    Graph::new(tensors, ops, &g.loss).map_err(|e| e.to_string())
}
