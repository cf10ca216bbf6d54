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
pub use rules::{dtype_name, is_low_precision, validate_operand, validate_plan, validate_step};

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

/// An operand kept in `format` with no scaling (BF16 or FP32 training).
pub fn unscaled_operand(format: Dtype) -> OperandPlan {
    OperandPlan {
        format,
        recipe: ScalingRecipe::None,
        block: BlockShape { rows: 0, cols: 0 },
        scale_format: ScaleFormat::Fp32,
        scale_rounding: ScaleRounding::Exact,
        tensor_scale: None,
        value_rounding: ValueRounding::NearestEven,
        amax_history: 0,
        amax_reduction: AmaxReduction::MostRecent,
        margin: 0,
        saturate: true,
        hadamard: 0,
    }
}

/// A plan that keeps a site in `format` with no scaling (BF16 or FP32 training): every
/// operand and the output.
pub fn unscaled(format: Dtype) -> SitePlan {
    let operand = unscaled_operand(format);
    SitePlan { activation: operand, weight: operand, gradient: operand, output: format }
}

/// Does `selector` pick `site`? Empty selector lists match anything; name patterns are
/// globs where `*` matches any run of characters.
pub fn selects(selector: &SiteSelector, site: &GemmSite) -> bool {
    (selector.layers.is_empty() || selector.layers.contains(&site.layer))
        && (selector.roles.is_empty() || selector.roles.contains(&site.role))
        && (selector.names.is_empty() || selector.names.iter().any(|p| glob(p, &site.name)))
}

fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let mut rest = text;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else if let Some(pos) = rest.find(part) {
            rest = &rest[pos + part.len()..];
        } else {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn glob_matches_prefix_suffix_and_middle() {
        assert!(glob("layers.*.mlp.*", "layers.3.mlp.up"));
        assert!(!glob("layers.*.mlp.*", "layers.3.attn.qkv"));
        assert!(glob("*head", "lm_head"));
        assert!(glob("exact", "exact"));
        assert!(!glob("exact", "exactly"));
    }
}
