//! NVFP4 as NVIDIA pretrains with it ("Pretraining Large Language Models with NVFP4",
//! arXiv 2509.25149; TE's NVFP4BlockScaling): E2M1 values, one E4M3 scale per 16
//! elements under an FP32 per-tensor scale, 16x16 weight tiles, stochastic rounding of
//! gradients, a 16-point random Hadamard transform on the weight-gradient inputs. The
//! last transformer layers stay BF16 (Megatron-Bridge's recipe keeps four; a model of
//! fewer than 16 layers keeps a quarter of them). Blackwell only: a Hopper plan is
//! refused at load, naming the device. No fallback rules.

use runner_plugin_sdk::precision::recipe::{nvfp4, plan_with};
use runner_plugin_sdk::precision::*;

pub struct Nvfp4;

/// Trailing transformer layers kept in BF16 for a model of `layers`.
pub fn bf16_tail(layers: u32) -> u32 {
    (layers / 4).clamp(u32::from(layers > 1), 4)
}

impl Guest for Nvfp4 {
    fn name() -> String {
        "nvfp4: E2M1 in 1x16 blocks (16x16 weights), E4M3 block + FP32 tensor scales, stochastic rounding, \
         Hadamard on wgrad, last layers BF16, no fallback rules"
            .into()
    }

    fn plan(request: PlanRequest) -> Result<PlanResponse, String> {
        let first_high = request.layers.saturating_sub(bf16_tail(request.layers)) as i64;
        let sites = plan_with(&request, "nvfp4", nvfp4, |s| i64::from(s.layer) >= first_high)?;
        Ok(PlanResponse { sites, state: Vec::new() })
    }

    fn on_step(metrics: StepMetrics) -> Result<StepResponse, String> {
        Ok(guard::no_fallback("nvfp4", &metrics))
    }
}

runner_plugin_sdk::export_precision!(Nvfp4);

#[cfg(test)]
mod tests {
    use super::*;
    use runner_plugin_sdk::precision::recipe::sample_request;

    #[test]
    fn plans_nvfp4_with_a_bf16_tail_and_refuses_hopper() {
        let req = sample_request("B200", 8);
        let r = Nvfp4::plan(req.clone()).unwrap();
        validate_plan(&req, &r).unwrap();
        for (s, p) in req.sites.iter().zip(&r.sites) {
            let low = s.layer >= 0 && s.layer < 6;
            assert_eq!(p.activation.format == Dtype::Nvfp4, low, "{s:?}");
        }
        assert_eq!((bf16_tail(4), bf16_tail(8), bf16_tail(32), bf16_tail(126)), (1, 2, 4, 4));
        let e = Nvfp4::plan(sample_request("H100", 8)).unwrap_err();
        assert!(e.contains("H100") && e.contains("compute capability 90"), "{e}");
    }
}
