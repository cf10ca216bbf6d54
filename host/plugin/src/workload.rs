//! Workload plugins seen from the host: `describe` (validated model info) and `graph`
//! (converted into the host's graph IR and validated, so a plugin can never hand the
//! executor or the FLOP counter an inconsistent graph). Both are checked on every call:
//! a plugin may answer each call differently.

use runner_graph::Graph;

use crate::bindings::v2::workload::exports::runner::plugin::workload as wit;
use crate::bindings::{v1, v2};
use crate::sandbox::{Limits, Sandboxed};
use crate::{Failure, Kind, Plugin, PluginError, PluginInfo, Pre, adapt};

pub use wit::{
    ActivationKind, AttentionKind, GraphRequest, Hyperparameters, InferenceShape, MlaConfig,
    ModelInfo, MoeConfig, NormKind, Phase, PositionScheme, PublishedMeasurement,
    RecomputeGranularity, ReferenceLayout, RouterScore, TrainingDefaults, TrainingPrecision,
    Variant,
};

/// The contract's rules for workload answers and graphs (`runner_contract`), expanded
/// over the host's 0.2 bindings: the same code the SDK and the testkit run.
mod rules {
    use super::wit::*;
    use crate::bindings::v2::Dtype;
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
            Instance::V2(s) => s.call("describe", |s, p| {
                p.runner_plugin_workload().call_describe(s)
            })?,
            Instance::V1(s) => {
                let old = s.call("describe", |s, p| {
                    p.runner_plugin_workload().call_describe(s)
                })?;
                adapt::model_info(old).map_err(|m| self.invalid("describe", m))?
            }
        };
        validate_model_info(&info).map_err(|m| self.invalid("describe", m))?;
        Ok(info)
    }

    /// The logical forward graph of one variant, as host IR, validated.
    pub fn graph(&mut self, request: &GraphRequest) -> Result<Graph, PluginError> {
        let result = match &mut self.instance {
            Instance::V2(s) => s.call("graph", |s, p| {
                p.runner_plugin_workload().call_graph(s, request)
            })?,
            Instance::V1(s) => {
                let old = adapt::graph_request(request).map_err(|m| {
                    PluginError::new(&self.info.name, "graph", Failure::Contract(m))
                })?;
                s.call("graph", |s, p| {
                    p.runner_plugin_workload().call_graph(s, &old)
                })?
                .map(adapt::model_graph)
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
