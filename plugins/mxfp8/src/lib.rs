//! MXFP8 (OCP Microscaling v1.0; TE's MXFP8BlockScaling): E4M3 elements, one E8M0
//! scale per 32 elements along each GEMM's reduction axis, rounded up to a power of two
//! (RCEIL, as cuBLAS does, so no block overflows). Blackwell runs it natively; elsewhere
//! only an emulating device (the CPU) does, and the plan is refused otherwise. No
//! fallback rules.

use runner_plugin_sdk::precision::recipe::{mxfp8, plan_with};
use runner_plugin_sdk::precision::*;

pub struct Mxfp8;

impl Guest for Mxfp8 {
    fn name() -> String {
        "mxfp8: E4M3 in 1x32 blocks with E8M0 scales (RCEIL), no fallback rules".into()
    }

    fn plan(request: PlanRequest) -> Result<PlanResponse, String> {
        let sites = plan_with(&request, "mxfp8", mxfp8, |_| false)?;
        Ok(PlanResponse { sites, state: Vec::new() })
    }

    fn on_step(metrics: StepMetrics) -> Result<StepResponse, String> {
        Ok(guard::no_fallback("mxfp8", &metrics))
    }
}

runner_plugin_sdk::export_precision!(Mxfp8);

#[cfg(test)]
mod tests {
    use super::*;
    use runner_plugin_sdk::precision::recipe::sample_request;

    #[test]
    fn plans_mxfp8_on_blackwell_and_the_cpu_and_refuses_hopper() {
        for dev in ["cpu", "B200"] {
            let req = sample_request(dev, 2);
            let r = Mxfp8::plan(req.clone()).unwrap();
            validate_plan(&req, &r).unwrap();
        }
        let e = Mxfp8::plan(sample_request("H100", 2)).unwrap_err();
        assert!(e.contains("H100"), "{e}");
    }
}
