//! Precision-policy plugins: per-GEMM number formats, and actions on each step's numerics.

pub use crate::bindings::precision::exports::runner::plugin::precision_policy::{
    Action, AmaxReduction, BlockShape, DeviceCapabilities, Fallback, FallbackScope,
    GemmRole, GemmSite, GlobalFallback, Guest, LayerMetrics, Operand, OperandMetrics,
    OperandPlan, PlanRequest, PlanResponse, RecipeChange, Repromotion, Rollback,
    ScaleFormat, ScaleRounding, ScalingRecipe, SiteMetrics, SitePlan, SiteSelector,
    StepMetrics, StepResponse, ValueRounding,
};
pub use crate::bindings::precision::runner::plugin::types::Dtype;

pub mod guard;
pub mod recipe;

/// The rules the host applies to plans and actions (the same code: `runner_contract`).
pub mod rules {
    use super::*;
    runner_contract::precision_rules!();
}
pub use rules::{
    dtype_name, is_low_precision, selects, unscaled, unscaled_operand, validate_operand, validate_plan,
    validate_step,
};

/// Export `$ty` (an implementation of [`Guest`]) as the plugin's precision policy:
/// `runner_plugin_sdk::export_precision!(MyPolicy);`.
///
/// Only a wasm build exports anything: the export names (`runner:plugin/precision-policy@...`)
/// are not valid native linker symbols, so a native cdylib would not link, and native builds
/// exist only to run unit tests, which call the `Guest` functions directly.
#[macro_export]
macro_rules! export_precision {
    ($ty:ident) => {
        #[cfg(target_arch = "wasm32")]
        $crate::bindings::precision::export_precision!($ty);
    };
}

