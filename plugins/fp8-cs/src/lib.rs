//! FP8 with Transformer Engine's Float8CurrentScaling: HYBRID formats, one FP32 scale
//! per tensor from that tensor's own amax (read once for the amax, once to cast), margin
//! 0. Linears of the transformer layers in FP8; embedding, head and routers BF16. No
//! fallback rules.

use runner_plugin_sdk::precision::recipe::{current, hybrid, plan_with};
use runner_plugin_sdk::precision::*;

pub struct Fp8Cs;

impl Guest for Fp8Cs {
    fn name() -> String {
        "fp8-cs: FP8 current scaling (HYBRID E4M3/E5M2, per-tensor amax of each tensor), no fallback rules".into()
    }

    fn plan(request: PlanRequest) -> Result<PlanResponse, String> {
        let sites = plan_with(&request, "fp8-cs", |s| hybrid(s, current), |_| false)?;
        Ok(PlanResponse { sites, state: Vec::new() })
    }

    fn on_step(metrics: StepMetrics) -> Result<StepResponse, String> {
        Ok(guard::no_fallback("fp8-cs", &metrics))
    }
}

runner_plugin_sdk::export_precision!(Fp8Cs);

#[cfg(test)]
mod tests {
    use super::*;
    use runner_plugin_sdk::precision::recipe::sample_request;

    #[test]
    fn plans_current_scaling() {
        let req = sample_request("H100", 2);
        let r = Fp8Cs::plan(req.clone()).unwrap();
        validate_plan(&req, &r).unwrap();
        assert!(r.sites.iter().zip(&req.sites).all(|(p, s)| (s.layer < 0) == (p.weight.recipe == ScalingRecipe::None)));
        assert!(r.sites.iter().filter(|p| p.weight.recipe != ScalingRecipe::None).all(|p| p.weight.recipe == ScalingRecipe::Current));
    }
}
