//! Test program: a precision policy built against the released contract 0.2.0 (no SDK):
//! NVFP4 with 16-element E4M3 block scales under an FP32 tensor scale, stochastic rounding
//! and a 16-wide Hadamard transform on the gradient, BF16 output; `on-step` answers with
//! one action of every shape that carries data (a fallback, a recipe change, a reset of
//! the amax history, an alert) and hands its state back grown by one byte. 0.3 kept the
//! precision contract word for word: the host binds this plugin by its 0.2 export name
//! and calls it with its 0.3 types, converting nothing.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

wit_bindgen::generate!({ world: "precision-plugin", path: "../../wit-0.2.0" });

use exports::runner::plugin::precision_policy::*;
use runner::plugin::types::Dtype;

struct Old;

fn operand(gradient: bool) -> OperandPlan {
    OperandPlan {
        format: Dtype::Nvfp4,
        recipe: ScalingRecipe::Block,
        block: BlockShape { rows: 1, cols: 16 },
        scale_format: ScaleFormat::E4m3,
        scale_rounding: ScaleRounding::Exact,
        tensor_scale: Some(ScaleFormat::Fp32),
        value_rounding: if gradient { ValueRounding::Stochastic } else { ValueRounding::NearestEven },
        amax_history: 0,
        amax_reduction: AmaxReduction::MostRecent,
        margin: 0,
        saturate: true,
        hadamard: if gradient { 16 } else { 0 },
    }
}

impl Guest for Old {
    fn name() -> String {
        "old-nvfp4 (contract 0.2.0)".into()
    }

    fn plan(request: PlanRequest) -> Result<PlanResponse, String> {
        let sites = request
            .sites
            .iter()
            .map(|_| SitePlan { activation: operand(false), weight: operand(false), gradient: operand(true), output: Dtype::Bf16 })
            .collect();
        Ok(PlanResponse { sites, state: request.state })
    }

    fn on_step(metrics: StepMetrics) -> Result<StepResponse, String> {
        let sites = SiteSelector { layers: vec![1], names: vec!["*.down".into()], roles: vec![GemmRole::InputGradient] };
        let actions = vec![
            Action::Fallback(Fallback { sites: sites.clone(), scope: FallbackScope::ForwardOnly, to: Dtype::Fp16 }),
            Action::ChangeRecipe(RecipeChange { sites: sites.clone(), recipe: ScalingRecipe::Current, margin: 2, amax_history: 4 }),
            Action::ResetAmax(sites),
            Action::Alert(format!("step {} of a 0.2 policy", metrics.step)),
        ];
        let mut state = metrics.state;
        state.push(7);
        Ok(StepResponse { actions, state })
    }
}

#[cfg(target_arch = "wasm32")]
export!(Old);
