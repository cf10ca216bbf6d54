//! The BF16 precision policy: every GEMM in BF16 with no scaling, the baseline that FP8
//! recipes are measured against.
//!
//! Its step rules are the coarse ones a baseline needs: a step with non-finite loss or
//! gradients is skipped, and a finite loss above 10x the largest loss seen so far (Megatron's
//! rule) rolls back one step and skips the batch. The largest loss is the only state.

use runner_plugin_sdk::precision::*;

/// A loss above this multiple of the largest loss so far is a spike (Megatron's rule).
const SPIKE_FACTOR: f64 = 10.0;

/// The state blob: this tag, then the largest finite loss so far as little-endian f64. The
/// tag makes a blob left by another policy (a resumed run that switched policy) an error
/// instead of a nonsense threshold.
const STATE_TAG: &[u8; 4] = b"bf16";

/// The BF16 policy.
pub struct Bf16;

impl Guest for Bf16 {
    fn name() -> String {
        "bf16: every GEMM in BF16, no scaling (the baseline recipe)".into()
    }

    fn plan(request: PlanRequest) -> Result<PlanResponse, String> {
        decode(&request.state)?;
        let sites = request.sites.iter().map(|_| unscaled(Dtype::Bf16)).collect();
        Ok(PlanResponse { sites, state: request.state })
    }

    fn on_step(metrics: StepMetrics) -> Result<StepResponse, String> {
        let max_loss = decode(&metrics.state)?;
        let step = metrics.step;
        let loss = metrics.loss;
        let loss_finite = metrics.loss_finite && loss.is_finite();
        if !loss_finite || !metrics.grads_finite {
            let what = match (loss_finite, metrics.grads_finite) {
                (false, false) => "loss and gradients",
                (false, true) => "loss",
                _ => "gradients",
            };
            let alert = format!("non-finite {what} at step {step} (loss {loss}); step skipped");
            // The max is left alone: a skipped step's loss is no evidence about the run.
            return Ok(StepResponse {
                actions: vec![Action::SkipStep, Action::Alert(alert)],
                state: metrics.state,
            });
        }
        // The rule assumes a positive loss (cross-entropy); with no positive max yet there is
        // nothing to compare against.
        if let Some(max) = max_loss.filter(|m| *m > 0.0)
            && loss > SPIKE_FACTOR * max
        {
            let alert = format!(
                "loss spike at step {step}: {loss} > {SPIKE_FACTOR} x max loss so far {max}; \
                 rolling back 1 step and skipping 1 batch"
            );
            // The spike is not recorded, or it would raise the bar for the next one.
            let actions = vec![
                Action::Rollback(Rollback { steps: 1, skip_batches: 1 }),
                Action::Alert(alert),
            ];
            return Ok(StepResponse { actions, state: metrics.state });
        }
        let max = max_loss.map_or(loss, |m| m.max(loss));
        Ok(StepResponse { actions: Vec::new(), state: encode(max) })
    }
}

runner_plugin_sdk::export_precision!(Bf16);

fn encode(max_loss: f64) -> Vec<u8> {
    let mut state = STATE_TAG.to_vec();
    state.extend_from_slice(&max_loss.to_le_bytes());
    state
}

/// The largest loss so far, or `None` on the first call (empty state).
fn decode(state: &[u8]) -> Result<Option<f64>, String> {
    if state.is_empty() {
        return Ok(None);
    }
    match state.split_first_chunk::<4>() {
        Some((tag, rest)) if tag == STATE_TAG => {
            let bytes: [u8; 8] = rest.try_into().map_err(|_| {
                format!("bf16 policy state: expected 12 bytes, got {}", state.len())
            })?;
            Ok(Some(f64::from_le_bytes(bytes)))
        }
        _ => Err(format!(
            "bf16 policy state: {} bytes without the 'bf16' tag (state from another policy?)",
            state.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(loss: f64, grads_finite: bool, state: Vec<u8>) -> StepResponse {
        Bf16::on_step(StepMetrics {
            step: 7,
            loss,
            grad_norm: 1.0,
            learning_rate: 3e-4,
            loss_finite: loss.is_finite(),
            grads_finite,
            tokens: 7 * 4096,
            layers: Vec::new(),
            sites: Vec::new(),
            plan: Vec::new(),
            state,
        })
        .unwrap()
    }

    fn request(sites: Vec<GemmSite>, state: Vec<u8>) -> PlanRequest {
        let device = DeviceCapabilities {
            name: "H100".into(),
            compute_capability: 90,
            native_formats: vec![Dtype::Fp32, Dtype::Bf16, Dtype::Fp16, Dtype::Fp8E4m3, Dtype::Fp8E5m2],
            emulated_formats: Vec::new(),
        };
        PlanRequest { model: "m".into(), layers: 2, device, sites, state }
    }

    fn site(layer: i32, role: GemmRole) -> GemmSite {
        GemmSite { layer, name: format!("layers.{layer}.mlp.up"), role, m: 4096, n: 11008, k: 4096 }
    }

    #[test]
    fn plans_every_site_in_bf16_and_passes_state_through() {
        let sites = vec![
            site(0, GemmRole::Forward),
            site(0, GemmRole::WeightGradient),
            site(1, GemmRole::InputGradient),
        ];
        let state = encode(2.5);
        let req = request(sites, state.clone());
        let plan = Bf16::plan(req.clone()).unwrap();
        assert_eq!(plan.sites.len(), 3);
        for p in &plan.sites {
            for o in [&p.activation, &p.weight, &p.gradient] {
                assert_eq!((o.format, o.recipe), (Dtype::Bf16, ScalingRecipe::None));
            }
            assert_eq!(p.output, Dtype::Bf16);
        }
        validate_plan(&req, &plan).unwrap();
        assert_eq!(plan.state, state);
        assert!(Bf16::name().starts_with("bf16: "));
    }

    #[test]
    fn finite_steps_track_the_max_loss_and_act_on_nothing() {
        let r = step(3.0, true, Vec::new());
        assert!(r.actions.is_empty());
        assert_eq!(decode(&r.state).unwrap(), Some(3.0));
        let r = step(2.0, true, r.state);
        assert!(r.actions.is_empty());
        assert_eq!(decode(&r.state).unwrap(), Some(3.0), "the max never falls");
        let r = step(29.0, true, r.state);
        assert!(r.actions.is_empty(), "29 is under 10 x 3");
        assert_eq!(decode(&r.state).unwrap(), Some(29.0));
    }

    #[test]
    fn non_finite_loss_or_gradients_skip_the_step() {
        for (loss, grads_finite, what) in [
            (f64::NAN, true, "loss"),
            (1.0, false, "gradients"),
            (f64::INFINITY, false, "loss and gradients"),
        ] {
            let state = encode(3.0);
            let r = step(loss, grads_finite, state.clone());
            assert_eq!(r.actions.len(), 2);
            assert!(matches!(r.actions[0], Action::SkipStep));
            let Action::Alert(text) = &r.actions[1] else {
                panic!("expected an alert, got {:?}", r.actions[1])
            };
            assert!(text.starts_with(&format!("non-finite {what} ")), "{text}");
            assert_eq!(r.state, state);
        }
    }

    #[test]
    fn a_tenfold_loss_spike_rolls_back_one_step() {
        let state = encode(3.0);
        let r = step(30.5, true, state.clone());
        assert!(matches!(r.actions[0], Action::Rollback(Rollback { steps: 1, skip_batches: 1 })));
        assert!(matches!(&r.actions[1], Action::Alert(t) if t.contains("loss spike at step 7")));
        assert_eq!(r.state, state, "the spike is not recorded as the new max");
    }

    #[test]
    fn state_round_trips_and_rejects_foreign_blobs() {
        for x in [0.0, 1.5, 1e300, f64::MIN_POSITIVE] {
            assert_eq!(decode(&encode(x)).unwrap(), Some(x));
        }
        assert_eq!(encode(1.0).len(), 12);
        assert_eq!(decode(&[]).unwrap(), None);
        assert!(decode(b"fp8!\0\0\0\0\0\0\0\0").unwrap_err().contains("tag"));
        assert!(decode(b"bf16\0\0").unwrap_err().contains("12 bytes"));
        assert!(
            Bf16::plan(request(Vec::new(), vec![1])).is_err()
        );
    }
}
