//! Workload plugins: model families, exact hyperparameters, reference layouts, and the
//! logical forward graph of a variant. [`builder`] holds the shared transformer building
//! blocks, so a family plugin is mostly a table of published configurations.

pub use crate::bindings::workload::exports::runner::plugin::workload::{
    ActivationKind, AttrValue, Attribute, AttentionKind, GraphRequest, Guest,
    Hyperparameters, InferenceShape, MambaConfig, MlaConfig, ModelInfo, MoeConfig, NormKind, OpKind,
    Operation, ParallelRole, Phase, PositionScheme, PublishedMeasurement,
    RecomputeGranularity, ReferenceLayout, RouterScore, Tensor, TensorKind,
    TrainingDefaults, TrainingPrecision, Variant,
};
/// The forward graph a plugin returns (WIT `model-graph`; WIT cannot name a record and the
/// `graph` function alike).
pub use crate::bindings::workload::exports::runner::plugin::workload::ModelGraph as Graph;
pub use crate::bindings::workload::runner::plugin::types::Dtype;

/// The rules the host applies to `describe` (the same code: `runner_contract`), so a
/// plugin's own tests catch what the host would refuse.
pub mod rules {
    use super::*;
    runner_contract::workload_rules!();
}
pub use rules::{
    training_precision, training_precision_name, validate_hyperparameters, validate_layout,
    validate_model_info, validate_variant,
};

/// The rules at their edges, over these bindings (the host's tests cover the hybrid ones).
#[cfg(test)]
#[path = "workload_rules_tests.rs"]
mod rules_tests;

// The builder lives at src/builder.rs (beside the other SDK modules), not src/workload/.
#[path = "builder.rs"]
pub mod builder;

/// Export `$ty` (an implementation of [`Guest`]) as the plugin's workload:
/// `runner_plugin_sdk::export_workload!(MyModel);`.
///
/// Only a wasm build exports anything: the export names (`runner:plugin/workload@...#graph`)
/// are not valid native linker symbols, and native builds exist only for unit tests, which
/// call the `Guest` functions directly.
#[macro_export]
macro_rules! export_workload {
    ($ty:ident) => {
        #[cfg(target_arch = "wasm32")]
        $crate::bindings::workload::export_workload!($ty);
    };
}
