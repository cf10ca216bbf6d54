//! Test program: a precision policy built against the published contract 0.1.0 (no SDK):
//! FP8 with delayed scaling (E4M3 forward, E5M2 gradients, MXFP8 where asked by name), and
//! an `on-step` that answers every 0.1 action once, so the test sees each one adapted.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

wit_bindgen::generate!({ world: "precision-plugin", path: "../../wit-0.1.0" });

use exports::runner::plugin::precision_policy::*;
use runner::plugin::types::Dtype;

struct Old;

impl Guest for Old {
    fn name() -> String {
        "old-fp8: delayed scaling, HYBRID (contract 0.1.0)".into()
    }

    fn plan(request: PlanRequest) -> Result<PlanResponse, String> {
        let sites = request
            .sites
            .iter()
            .map(|s| {
                let mx = s.name.contains("mx");
                SitePlan {
                    format: if mx { Dtype::Mxfp8 } else { Dtype::Fp8E4m3 },
                    grad_format: if mx { Dtype::Mxfp8 } else { Dtype::Fp8E5m2 },
                    recipe: if mx { ScalingRecipe::Block } else { ScalingRecipe::Delayed },
                    block_size: if mx { 32 } else { 0 },
                    amax_history: if mx { 0 } else { 16 },
                    amax_reduction: AmaxReduction::Max,
                    margin: 0,
                    saturate: true,
                }
            })
            .collect();
        Ok(PlanResponse { sites, state: request.state })
    }

    fn on_step(metrics: StepMetrics) -> Result<StepResponse, String> {
        let any = SiteSelector { layers: vec![0], names: vec!["*.up".into()], roles: vec![GemmRole::WeightGradient] };
        let actions = vec![
            Action::Fallback(Fallback { sites: any.clone(), scope: FallbackScope::BackwardOnly, to: Dtype::Bf16 }),
            Action::FallbackGlobal(FallbackScope::AllGemms),
            Action::ChangeRecipe(RecipeChange { sites: any.clone(), recipe: ScalingRecipe::Current, margin: 1, amax_history: 0 }),
            Action::SkipStep,
            Action::Rollback(Rollback { steps: 2, skip_batches: 3 }),
            Action::Repromote(any),
            Action::Alert(format!("step {} amax {:?}", metrics.step, metrics.sites.first().map(|s| s.amax))),
        ];
        Ok(StepResponse { actions, state: metrics.state })
    }
}

#[cfg(target_arch = "wasm32")]
export!(Old);
