//! One test per trigger and per action of the rules.

use super::*;
use crate::precision::recipe::{delayed, hybrid};

/// Layers -1 (BF16) and 0..=3 (FP8, delayed), one linear each.
fn setup() -> (Vec<GemmSite>, Vec<SitePlan>) {
    let mut sites = Vec::new();
    let mut plans = Vec::new();
    for layer in -1..4 {
        for role in [GemmRole::Forward, GemmRole::InputGradient, GemmRole::WeightGradient] {
            let site = GemmSite { layer, name: format!("layers.{layer}.mlp.up"), role, m: 64, n: 64, k: 64 };
            plans.push(if layer < 0 { unscaled(Dtype::Bf16) } else { hybrid(&site, delayed) });
            sites.push(site);
        }
    }
    (sites, plans)
}

/// A step's metrics: every low-precision operand with amax 1 unless `tweak` changes it.
fn metrics(step: u64, loss: f64, gnorm: f64, state: Vec<u8>, tweak: impl Fn(i32, Operand, &mut OperandMetrics)) -> StepMetrics {
    let (sites, plans) = setup();
    let site_metrics = sites
        .iter()
        .enumerate()
        .map(|(i, s)| SiteMetrics {
            site: i as u32,
            operands: [Operand::Activation, Operand::Weight, Operand::Gradient]
                .into_iter()
                .map(|operand| {
                    let mut m = OperandMetrics { operand, amax: 1.0, scale: 448.0, saturation_rate: 0.0, underflow_rate: 0.0, nonfinite: false };
                    tweak(s.layer, operand, &mut m);
                    m
                })
                .collect(),
        })
        .collect();
    StepMetrics {
        step,
        tokens: step * 1024,
        loss,
        grad_norm: gnorm,
        learning_rate: 1e-3,
        loss_finite: loss.is_finite(),
        grads_finite: gnorm.is_finite(),
        layers: (-1..4).map(|layer| LayerMetrics { layer, grad_norm: 0.1, nonfinite: false }).collect(),
        sites: site_metrics,
        plan: plans,
        state,
    }
}

fn fresh() -> Vec<u8> {
    let (sites, plans) = setup();
    Memory::for_plan(&sites, &plans).encode()
}

/// `n` healthy steps from `state`, loss wobbling around 3.
fn healthy(rules: &Rules, mut state: Vec<u8>, from: u64, n: u64) -> Vec<u8> {
    for step in from..from + n {
        let loss = 3.0 + 0.01 * ((step % 5) as f64 - 2.0);
        let r = on_step(rules, &metrics(step, loss, 1.0, state, |_, _, _| {})).unwrap();
        assert!(r.actions.iter().all(|a| matches!(a, Action::Repromote(_) | Action::Alert(_))), "step {step}: {:?}", r.actions);
        state = r.state;
    }
    state
}

fn has_fallback(actions: &[Action], layer: i32, scope: FallbackScope) -> bool {
    actions.iter().any(|a| matches!(a, Action::Fallback(f) if f.sites.layers == [layer] && f.scope == scope && f.to == Dtype::Bf16))
}

#[test]
fn healthy_steps_take_no_action() {
    let rules = Rules::default();
    healthy(&rules, fresh(), 0, 60);
}

#[test]
fn non_finite_loss_skips_the_step() {
    let rules = Rules::default();
    let r = on_step(&rules, &metrics(3, f64::NAN, 1.0, fresh(), |_, _, _| {})).unwrap();
    assert!(matches!(r.actions[0], Action::SkipStep));
    assert!(r.actions.iter().any(|a| matches!(a, Action::Alert(m) if m.contains("non-finite"))));
    assert!(!r.actions.iter().any(|a| matches!(a, Action::Fallback(_))), "no layer to blame");
}

#[test]
fn non_finite_operands_demote_the_layer_they_start_in() {
    let rules = Rules::default();
    // A NaN in layer 2's forward spreads into layer 3's forward and every gradient.
    let spread = |l: i32, o: Operand, m: &mut OperandMetrics| m.nonfinite = (l >= 2 && o == Operand::Activation) || o == Operand::Gradient;
    let r = on_step(&rules, &metrics(3, f64::NAN, f64::NAN, fresh(), spread)).unwrap();
    assert!(matches!(r.actions[0], Action::SkipStep));
    assert!(has_fallback(&r.actions, 2, FallbackScope::AllGemms), "{:?}", r.actions);
    assert_eq!(r.actions.iter().filter(|a| matches!(a, Action::Fallback(_))).count(), 1);
    // Only gradients: the last layer holding one (the backward starts at the top).
    let grads = |l: i32, o: Operand, m: &mut OperandMetrics| m.nonfinite = l <= 1 && o == Operand::Gradient;
    let r = on_step(&rules, &metrics(3, 3.0, f64::NAN, fresh(), grads)).unwrap();
    assert!(has_fallback(&r.actions, 1, FallbackScope::AllGemms), "{:?}", r.actions);
}

#[test]
fn an_amax_jump_skips_and_resets_then_demotes_on_the_second() {
    let rules = Rules::default();
    let jump = |l: i32, o: Operand, m: &mut OperandMetrics| {
        if l == 1 && o == Operand::Activation {
            m.amax = 1000.0;
        }
    };
    // Amaxes grow fast in the warm-up: no action then.
    let r = on_step(&rules, &metrics(3, 3.0, 1.0, healthy(&rules, fresh(), 0, 3), jump)).unwrap();
    assert!(r.actions.is_empty(), "{:?}", r.actions);
    let state = healthy(&rules, fresh(), 0, 25);
    let jump = |l: i32, o: Operand, m: &mut OperandMetrics| {
        if l == 1 && o == Operand::Activation {
            m.amax = 1000.0;
        }
    };
    let r = on_step(&rules, &metrics(25, 3.0, 1.0, state, jump)).unwrap();
    assert!(matches!(r.actions[0], Action::SkipStep));
    assert!(r.actions.iter().any(|a| matches!(a, Action::ResetAmax(s) if s.layers == [1])), "{:?}", r.actions);
    let state = healthy(&rules, r.state, 26, 3);
    let r = on_step(&rules, &metrics(29, 3.0, 1.0, state, jump)).unwrap();
    assert!(has_fallback(&r.actions, 1, FallbackScope::AllGemms), "{:?}", r.actions);
}

/// One outlier raises a layer's activation amax and, through the scale it sets, flushes
/// most of that layer's gradients: the jump's rule answers (skip, reset the history), not
/// the underflow rule, so a single spike does not demote the layer (`runner train
/// --inject amax-spike@30` demoted layer 2's backward at step 30: "32% of a gradient
/// operand flushed to zero").
#[test]
fn an_amax_jump_with_underflow_in_its_layer_only_resets() {
    let rules = Rules::default();
    let state = healthy(&rules, fresh(), 0, 25);
    let spike = |l: i32, o: Operand, m: &mut OperandMetrics| {
        if l == 1 && o == Operand::Activation {
            m.amax = 1000.0;
        }
        if l == 1 && o == Operand::Gradient {
            m.underflow_rate = 0.4;
        }
    };
    let r = on_step(&rules, &metrics(25, 3.0, 1.0, state, spike)).unwrap();
    assert!(matches!(r.actions[0], Action::SkipStep));
    assert!(r.actions.iter().any(|a| matches!(a, Action::ResetAmax(s) if s.layers == [1])), "{:?}", r.actions);
    assert!(!r.actions.iter().any(|a| matches!(a, Action::Fallback(_))), "{:?}", r.actions);
}

#[test]
fn saturation_switches_delayed_to_current_scaling() {
    let rules = Rules::default();
    let sat = |l: i32, o: Operand, m: &mut OperandMetrics| {
        if l == 3 && o == Operand::Gradient {
            m.saturation_rate = 0.01;
        }
    };
    // In the warm-up amaxes grow and delayed scales clip: no action.
    let r = on_step(&rules, &metrics(2, 3.0, 1.0, fresh(), sat)).unwrap();
    assert!(r.actions.is_empty(), "{:?}", r.actions);
    let mut state = healthy(&rules, fresh(), 0, 25);
    let mut acted = None;
    for step in 25..28 {
        let r = on_step(&rules, &metrics(step, 3.0, 1.0, state, sat)).unwrap();
        if !r.actions.is_empty() {
            acted.get_or_insert((step, r.actions.clone()));
        }
        state = r.state;
    }
    let (step, actions) = acted.unwrap();
    assert_eq!(step, 27, "after {} saturated steps in a row", rules.saturation_steps);
    assert!(actions.iter().any(|a| matches!(a, Action::ChangeRecipe(c) if c.sites.layers == [3] && c.recipe == ScalingRecipe::Current && c.margin == 1)), "{actions:?}");
    // Under current scaling already: the layer falls back.
    let mut last = Vec::new();
    for step in 28..31 {
        let mut m = metrics(step, 3.0, 1.0, state, sat);
        for (i, p) in m.plan.iter_mut().enumerate() {
            if i / 3 == 4 {
                p.gradient.recipe = ScalingRecipe::Current;
            }
        }
        let r = on_step(&rules, &m).unwrap();
        state = r.state;
        last = r.actions;
    }
    assert!(has_fallback(&last, 3, FallbackScope::AllGemms), "{last:?}");
}

#[test]
fn gradient_underflow_demotes_the_backward() {
    let rules = Rules::default();
    let r = on_step(&rules, &metrics(2, 3.0, 1.0, fresh(), |l, o, m| {
        if l == 0 && o == Operand::Gradient {
            m.underflow_rate = 0.6;
        }
    }))
    .unwrap();
    assert!(has_fallback(&r.actions, 0, FallbackScope::BackwardOnly), "{:?}", r.actions);
}

#[test]
fn a_loss_spike_rolls_back_and_a_second_falls_back_globally() {
    let rules = Rules::default();
    let state = healthy(&rules, fresh(), 0, 30);
    let r = on_step(&rules, &metrics(30, 3.5, 1.0, state.clone(), |_, _, _| {})).unwrap();
    assert!(r.actions.iter().any(|a| matches!(a, Action::Rollback(Rollback { steps: 1, skip_batches: 2 }))), "{:?}", r.actions);
    assert!(!r.actions.iter().any(|a| matches!(a, Action::FallbackGlobal(_))));
    let state = healthy(&rules, r.state, 31, 5);
    let r = on_step(&rules, &metrics(36, 4.0, 1.0, state, |_, _, _| {})).unwrap();
    assert!(r.actions.iter().any(|a| matches!(a, Action::FallbackGlobal(GlobalFallback { scope: FallbackScope::AllGemms, to: Dtype::Bf16 }))));
    assert!(r.actions.iter().any(|a| matches!(a, Action::Rollback(_))));
    // The global fallback ends after `promote_after` steps.
    let mut state = r.state;
    let mut ended = false;
    for step in 37..37 + rules.promote_after + 1 {
        let r = on_step(&rules, &metrics(step, 3.0, 1.0, state, |_, _, _| {})).unwrap();
        ended |= r.actions.iter().any(|a| matches!(a, Action::Repromote(p) if p.sites.layers.len() == 4));
        state = r.state;
    }
    assert!(ended);
    // Before the warm-up nothing counts as a spike; Megatron's 10x rule after it.
    let r = on_step(&rules, &metrics(2, 50.0, 1.0, healthy(&rules, fresh(), 0, 2), |_, _, _| {})).unwrap();
    assert!(r.actions.is_empty(), "{:?}", r.actions);
}

#[test]
fn a_gradient_norm_spike_skips_the_step() {
    let rules = Rules::default();
    let state = healthy(&rules, fresh(), 0, 25);
    let r = on_step(&rules, &metrics(25, 3.0, 100.0, state, |_, _, _| {})).unwrap();
    assert!(matches!(r.actions[0], Action::SkipStep));
    assert!(r.actions.iter().any(|a| matches!(a, Action::Alert(m) if m.contains("gradient norm"))));
}

#[test]
fn demoted_layers_return_after_clean_steps_with_backoff_then_pin() {
    let rules = Rules { promote_after: 4, ..Rules::default() };
    let nan_in_0 = |l: i32, o: Operand, m: &mut OperandMetrics| m.nonfinite = l == 0 && o == Operand::Weight;
    let mut state = fresh();
    let mut step = 0;
    for (round, wait) in [(1, 4u64), (2, 8)] {
        let r = on_step(&rules, &metrics(step, f64::NAN, 1.0, state, nan_in_0)).unwrap();
        assert!(has_fallback(&r.actions, 0, FallbackScope::AllGemms), "round {round}: {:?}", r.actions);
        state = r.state;
        step += 1;
        let mut back = None;
        for i in 0..wait + 1 {
            let r = on_step(&rules, &metrics(step, 3.0, 1.0, state, |_, _, _| {})).unwrap();
            if r.actions.iter().any(|a| matches!(a, Action::Repromote(p) if p.sites.layers == [0] && p.to == Dtype::Fp8E4m3)) {
                back.get_or_insert(i + 1);
            }
            state = r.state;
            step += 1;
        }
        assert_eq!(back, Some(wait), "round {round}: re-promoted after {wait} clean steps");
    }
    let r = on_step(&rules, &metrics(step, f64::NAN, 1.0, state, nan_in_0)).unwrap();
    assert!(r.actions.iter().any(|a| matches!(a, Action::Alert(m) if m.contains("pinned"))), "{:?}", r.actions);
    let mut state = r.state;
    for s in step + 1..step + 40 {
        let r = on_step(&rules, &metrics(s, 3.0, 1.0, state, |_, _, _| {})).unwrap();
        assert!(!r.actions.iter().any(|a| matches!(a, Action::Repromote(_))), "a pinned layer stays in BF16");
        state = r.state;
    }
}

#[test]
fn the_bf16_budget_caps_demotions() {
    let rules = Rules::default(); // half of the 4 FP8 layers at most
    let mut state = fresh();
    let mut demoted = 0;
    let mut capped = false;
    for (step, layer) in [(1, 0), (2, 1), (3, 2)] {
        let r = on_step(&rules, &metrics(step, f64::NAN, 1.0, state, |l, o, m| m.nonfinite = l == layer && o == Operand::Weight)).unwrap();
        demoted += r.actions.iter().filter(|a| matches!(a, Action::Fallback(_))).count();
        capped |= r.actions.iter().any(|a| matches!(a, Action::Alert(m) if m.contains("the most this policy allows")));
        assert!(matches!(r.actions[0], Action::SkipStep));
        state = r.state;
    }
    assert_eq!(demoted, 2);
    assert!(capped);
}

#[test]
fn memory_round_trips_and_refuses_foreign_or_short_blobs() {
    let state = healthy(&Rules::default(), fresh(), 0, 3);
    assert_eq!(Memory::decode(&state).unwrap().encode(), state);
    assert!(Memory::decode(b"bf16\0\0\0\0").unwrap_err().contains("tag"));
    assert!(Memory::decode(&state[..state.len() - 3]).is_err());
    let mut huge = TAG.to_vec();
    huge.extend_from_slice(&u64::MAX.to_le_bytes());
    assert!(Memory::decode(&huge).unwrap_err().contains("entries"));
    let mut longer = state.clone();
    longer.push(0);
    assert!(Memory::decode(&longer).unwrap_err().contains("trailing"));
}

/// The global fallback ends while every low-precision layer is pinned in BF16: nothing
/// returns to FP8 (an empty selector would have matched every site, the pinned layers
/// and the plan's BF16 ones with them).
#[test]
fn the_global_fallback_ending_with_every_layer_pinned_promotes_nothing() {
    let rules = Rules { max_bf16_share: 1.0, ..Rules::default() };
    let (sites, plans) = setup();
    let mut mem = Memory::for_plan(&sites, &plans);
    for l in &mut mem.layers {
        l.scope = scope_code(FallbackScope::AllGemms);
        l.pinned = true;
    }
    mem.global_since = 100;
    let r = on_step(&rules, &metrics(100 + rules.promote_after, 3.0, 1.0, mem.encode(), |_, _, _| {})).unwrap();
    assert!(!r.actions.iter().any(|a| matches!(a, Action::Repromote(_))), "{:?}", r.actions);
    assert!(r.actions.iter().any(|a| matches!(a, Action::Alert(m) if m.contains("global BF16 fallback ends"))), "{:?}", r.actions);
}
