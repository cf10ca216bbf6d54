//! FP8 with Transformer Engine's DelayedScaling defaults: HYBRID formats (E4M3
//! activations and weights, E5M2 gradients), one FP32 scale per tensor from an amax
//! history of 1024 steps reduced by max, margin 0 (`transformer_engine/common/recipe/
//! __init__.py`, TE 1.x). The linears of the transformer layers run in FP8; embedding,
//! head and routers stay BF16. Like TE itself it has no fallback rules: a step's
//! numerics never change the plan (`fp8-safe` adds them).

use runner_plugin_sdk::precision::recipe::{delayed, hybrid, plan_with};
use runner_plugin_sdk::precision::*;

pub struct Fp8;

impl Guest for Fp8 {
    fn name() -> String {
        "fp8: FP8 delayed scaling (HYBRID E4M3/E5M2, amax history 1024, max, margin 0), no fallback rules".into()
    }

    fn plan(request: PlanRequest) -> Result<PlanResponse, String> {
        let sites = plan_with(&request, "fp8", |s| hybrid(s, delayed), |_| false)?;
        Ok(PlanResponse { sites, state: Vec::new() })
    }

    fn on_step(metrics: StepMetrics) -> Result<StepResponse, String> {
        Ok(guard::no_fallback("fp8", &metrics))
    }
}

runner_plugin_sdk::export_precision!(Fp8);

#[cfg(test)]
mod tests {
    use super::*;
    use runner_plugin_sdk::precision::recipe::sample_request;

    #[test]
    fn plans_hybrid_delayed_fp8_inside_the_layers() {
        for dev in ["cpu", "H100"] {
            let req = sample_request(dev, 4);
            let r = Fp8::plan(req.clone()).unwrap();
            validate_plan(&req, &r).unwrap();
            for (s, p) in req.sites.iter().zip(&r.sites) {
                let want = if s.layer < 0 { Dtype::Bf16 } else { Dtype::Fp8E4m3 };
                assert_eq!(p.activation.format, want, "{s:?}");
                if s.layer >= 0 {
                    assert_eq!((p.gradient.format, p.weight.recipe, p.weight.amax_history, p.weight.margin), (Dtype::Fp8E5m2, ScalingRecipe::Delayed, 1024, 0));
                }
            }
        }
        let m = StepMetrics { step: 1, tokens: 1, loss: f64::NAN, grad_norm: 1.0, learning_rate: 1e-3, loss_finite: false, grads_finite: true, layers: vec![], sites: vec![], plan: vec![], state: vec![] };
        let r = Fp8::on_step(m.clone()).unwrap();
        assert!(matches!(r.actions.as_slice(), [Action::Alert(a)] if a.contains("no fallback")));
        let again = Fp8::on_step(StepMetrics { state: r.state, ..m }).unwrap();
        assert!(again.actions.is_empty(), "one alert per run of non-finite steps");
    }
}
