//! FP8 with guard rails: Transformer Engine's delayed-scaling defaults (HYBRID, amax
//! history 1024, max, margin 0) in the middle transformer layers; the first and last
//! transformer layers, the embedding and the head in BF16 (Megatron's
//! `--first-last-layers-bf16`, NeMo's `first_last_layers_bf16`); and the fallback rules
//! of `runner_plugin_sdk::precision::guard` with their defaults on every step: skip
//! non-finite steps and demote the layer holding the NaN, reset the amax history after
//! an amax jump, switch to current scaling on saturation, demote the backward on
//! gradient underflow, roll back on a loss spike (twice: global BF16), skip gradient-norm
//! spikes, re-promote after clean steps with backoff, pin after repeated failures,
//! never more than half of the FP8 layers in BF16.

use runner_plugin_sdk::precision::guard::{Memory, Rules};
use runner_plugin_sdk::precision::recipe::{delayed, hybrid, plan_with};
use runner_plugin_sdk::precision::*;

pub struct Fp8Safe;

impl Guest for Fp8Safe {
    fn name() -> String {
        "fp8-safe: FP8 delayed scaling, first/last layers and embedding/head in BF16, with fallback rules".into()
    }

    fn plan(request: PlanRequest) -> Result<PlanResponse, String> {
        let last = i64::from(request.layers) - 1;
        let sites = plan_with(&request, "fp8-safe", |s| hybrid(s, delayed), |s| s.layer == 0 || i64::from(s.layer) == last)?;
        let state = Memory::for_plan(&request.sites, &sites).encode();
        Ok(PlanResponse { sites, state })
    }

    fn on_step(metrics: StepMetrics) -> Result<StepResponse, String> {
        guard::on_step(&Rules::default(), &metrics)
    }
}

runner_plugin_sdk::export_precision!(Fp8Safe);

#[cfg(test)]
mod tests {
    use super::*;
    use runner_plugin_sdk::precision::recipe::sample_request;

    #[test]
    fn first_and_last_layers_stay_bf16_and_the_rules_run() {
        let req = sample_request("cpu", 4);
        let r = Fp8Safe::plan(req.clone()).unwrap();
        validate_plan(&req, &r).unwrap();
        for (s, p) in req.sites.iter().zip(&r.sites) {
            assert_eq!(p.activation.format == Dtype::Fp8E4m3, s.layer == 1 || s.layer == 2, "{s:?}");
        }
        let m = StepMetrics {
            step: 1,
            tokens: 1,
            loss: f64::NAN,
            grad_norm: 1.0,
            learning_rate: 1e-3,
            loss_finite: false,
            grads_finite: true,
            layers: vec![],
            sites: vec![],
            plan: r.sites.clone(),
            state: r.state.clone(),
        };
        let a = Fp8Safe::on_step(m).unwrap();
        assert!(matches!(a.actions[0], Action::SkipStep));
        assert!(Fp8Safe::on_step(StepMetrics { state: b"junk".to_vec(), ..healthy() }).is_err());
    }

    fn healthy() -> StepMetrics {
        StepMetrics { step: 1, tokens: 1, loss: 3.0, grad_norm: 1.0, learning_rate: 1e-3, loss_finite: true, grads_finite: true, layers: vec![], sites: vec![], plan: vec![], state: vec![] }
    }
}
