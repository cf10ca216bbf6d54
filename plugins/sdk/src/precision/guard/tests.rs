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
    // Then a NaN starts in layer 0's forward (still FP8): the layer widens to all GEMMs,
    // where it stayed backward-only and every such step was skipped.
    let nan = |l: i32, o: Operand, m: &mut OperandMetrics| m.nonfinite = o == Operand::Gradient || (l >= 0 && o == Operand::Activation);
    let r = on_step(&rules, &metrics(3, f64::NAN, f64::NAN, r.state, nan)).unwrap();
    assert!(matches!(r.actions[0], Action::SkipStep));
    assert!(has_fallback(&r.actions, 0, FallbackScope::AllGemms), "{:?}", r.actions);
    // Already in BF16 for every GEMM: nothing left to widen, the step is skipped alone.
    let r = on_step(&rules, &metrics(4, f64::NAN, f64::NAN, r.state, nan)).unwrap();
    assert!(matches!(r.actions[0], Action::SkipStep) && !r.actions.iter().any(|a| matches!(a, Action::Fallback(_))), "{:?}", r.actions);
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

/// The defaults are the numbers docs/PLUGINS.md ("Fallback rules") documents: warm-up 20
/// steps, loss EMA alpha 0.1, z > 6 for 2 steps or > 10 once, 10x the largest loss, 5x the
/// gradient-norm EMA, 0.1 % saturated for 3 steps, amax x16, 25 % underflow, 50 clean steps
/// to return, the third demotion pins, at most half the layers demoted, roll back 1 step
/// and skip 2 batches, a second spike within 50 steps goes global.
#[test]
fn the_defaults_are_the_documented_ones() {
    let want = Rules {
        warmup_steps: 20,
        ema_alpha: 0.1,
        loss_z: 6.0,
        loss_z_steps: 2,
        loss_z_now: 10.0,
        loss_spike_factor: 10.0,
        grad_norm_ratio: 5.0,
        saturation_rate: 1e-3,
        saturation_steps: 3,
        amax_jump: 16.0,
        underflow_rate: 0.25,
        promote_after: 50,
        max_demotions: 3,
        max_bf16_share: 0.5,
        rollback_steps: 1,
        skip_batches: 2,
        rollback_cooldown: 50,
    };
    assert_eq!(Rules::default(), want);
}

fn skipped(r: &StepResponse) -> bool {
    matches!(r.actions.first(), Some(Action::SkipStep))
}

/// Each non-finite signal alone skips the step: the loss flag (a finite value with the
/// flag down), the gradients flag, one operand's flag, and a layer's flag; the origin
/// skips the BF16 head (layer -1), a NaN in the input-gradient GEMM's weight counts as
/// backward (the last such layer is blamed), a layer flag alone blames the first flagged,
/// and the alert lists the layers, the head as words.
#[test]
fn each_non_finite_signal_skips_and_blames_its_origin() {
    let rules = Rules::default();
    let state = healthy(&rules, fresh(), 0, 3);
    let mut m = metrics(3, 3.0, 1.0, state.clone(), |_, _, _| {});
    m.loss_finite = false;
    assert!(skipped(&on_step(&rules, &m).unwrap()));
    let mut m = metrics(3, 3.0, 1.0, state.clone(), |_, _, _| {});
    m.grads_finite = false;
    assert!(skipped(&on_step(&rules, &m).unwrap()));
    // Forward operands in layers -1 and 2: layer 2 is the low-precision origin.
    let r = on_step(&rules, &metrics(3, 3.0, 1.0, state.clone(), |l, o, m| m.nonfinite = (l == -1 || l == 2) && o == Operand::Activation)).unwrap();
    assert!(skipped(&r));
    assert!(has_fallback(&r.actions, 2, FallbackScope::AllGemms), "{:?}", r.actions);
    assert!(r.actions.iter().any(|a| matches!(a, Action::Alert(m) if m.contains("(the embedding/head and layers [2])"))), "{:?}", r.actions);
    // The weight operand of the input-gradient GEMMs (site role 1) of layers 1 and 2.
    let mut m = metrics(3, 3.0, 1.0, state.clone(), |l, o, m| m.nonfinite = (l == 1 || l == 2) && o == Operand::Weight);
    for (i, s) in m.sites.iter_mut().enumerate() {
        if i % 3 != 1 {
            s.operands.iter_mut().for_each(|o| o.nonfinite = false);
        }
    }
    let r = on_step(&rules, &m).unwrap();
    assert!(has_fallback(&r.actions, 2, FallbackScope::AllGemms), "{:?}", r.actions);
    // Only layer flags.
    let mut m = metrics(3, 3.0, 1.0, state, |_, _, _| {});
    for l in &mut m.layers {
        l.nonfinite = l.layer >= 1;
    }
    let r = on_step(&rules, &m).unwrap();
    assert!(skipped(&r));
    assert!(has_fallback(&r.actions, 1, FallbackScope::AllGemms), "{:?}", r.actions);
}

/// Layer -1 (the embedding, final norm and head) is named in words, never "-1", alone,
/// beside layers, and in the alerts naming one layer (a policy that plans the head in FP8
/// gets those too).
#[test]
fn alerts_name_the_layer_outside_the_transformer_in_words() {
    assert_eq!(layers_named(&[-1]), "the embedding/head");
    assert_eq!(layers_named(&[0, 2]), "layers [0, 2]");
    assert_eq!(layers_named(&[-1, 0, 2]), "the embedding/head and layers [0, 2]");
    assert_eq!((layer_name(-1).as_str(), layer_name(3).as_str()), ("the embedding/head", "layer 3"));
    // Only -1 is the embedding/head: a selector's -7 is no layer, and said to be none.
    assert_eq!(layer_name(-7), "layer -7 (no such layer)");
    assert_eq!(layers_named(&[1_000_000, -7]), "layers [1000000, -7] (no layer -7)");
    assert_eq!(layers_named(&[-1, -7, 2, -3]), "the embedding/head and layers [-7, 2, -3] (no layers -7, -3)");
    let rules = Rules::default();
    let alerts = |r: &StepResponse| r.actions.iter().filter_map(|a| if let Action::Alert(m) = a { Some(m.clone()) } else { None }).collect::<Vec<_>>();
    let state = healthy(&rules, fresh(), 0, 3);
    let r = on_step(&rules, &metrics(3, 3.0, 1.0, state, |l, o, m| m.nonfinite = l == -1 && o == Operand::Activation)).unwrap();
    assert_eq!(alerts(&r), ["step 3: non-finite loss or gradients (the embedding/head); step skipped"]);
    // The head planned in FP8: its gradients' underflow demotes it, in words.
    let (sites, mut plans) = setup();
    for (s, p) in sites.iter().zip(plans.iter_mut()) {
        if s.layer < 0 {
            *p = hybrid(s, delayed);
        }
    }
    let mut m = metrics(3, 3.0, 1.0, Memory::for_plan(&sites, &plans).encode(), |l, o, m| {
        if l == -1 && o == Operand::Gradient {
            m.underflow_rate = 0.9;
        }
    });
    m.plan = plans;
    let got = alerts(&on_step(&rules, &m).unwrap());
    assert!(got.iter().any(|a| a.starts_with("step 3: the embedding/head falls back to BF16 (backward only)")), "{got:?}");
    assert!(!got.iter().any(|a| a.contains("-1")), "{got:?}");
}

/// The amax-jump rule's edges: it counts from the step the warm-up ends (seen ==
/// warmup_steps), ignores BF16 operands (the head) and gradients, keeps the amax from
/// before the outlier (the same outlier next step is a second jump, which demotes),
/// reports the largest ratio of the layer, and names the GEMM's role.
#[test]
fn amax_jump_edges() {
    let rules = Rules::default();
    let at_warm = healthy(&rules, fresh(), 0, rules.warmup_steps);
    let act = |layer: i32, amax: f64| move |l: i32, o: Operand, m: &mut OperandMetrics| {
        if l == layer && o == Operand::Activation {
            m.amax = amax;
        }
    };
    let r = on_step(&rules, &metrics(20, 3.0, 1.0, at_warm.clone(), act(1, 1000.0))).unwrap();
    assert!(r.actions.iter().any(|a| matches!(a, Action::ResetAmax(s) if s.layers == [1])), "{:?}", r.actions);
    let r2 = on_step(&rules, &metrics(21, 3.0, 1.0, r.state, act(1, 1000.0))).unwrap();
    assert!(has_fallback(&r2.actions, 1, FallbackScope::AllGemms), "the outlier again is a second jump: {:?}", r2.actions);
    // BF16 operands (layer -1) and gradients do not jump.
    let r = on_step(&rules, &metrics(20, 3.0, 1.0, at_warm.clone(), act(-1, 1000.0))).unwrap();
    assert!(r.actions.is_empty(), "{:?}", r.actions);
    let grad = |l: i32, o: Operand, m: &mut OperandMetrics| {
        if l == 1 && o == Operand::Gradient {
            m.amax = 1000.0;
        }
    };
    assert!(on_step(&rules, &metrics(20, 3.0, 1.0, at_warm.clone(), grad)).unwrap().actions.is_empty());
    // Two operands jump x100 and x20: the alert reports x100, in the input-gradient GEMM.
    let mut m = metrics(20, 3.0, 1.0, at_warm, |_, _, _| {});
    m.sites[2 * 3 + 1].operands[1].amax = 100.0; // layer 1's input-gradient weight
    m.sites[2 * 3].operands[0].amax = 20.0; // layer 1's forward activation
    let r = on_step(&rules, &m).unwrap();
    assert!(
        r.actions.iter().any(|a| matches!(a, Action::Alert(s) if s.contains("x100 in layer 1 (weight of the input-gradient GEMM"))),
        "{:?}",
        r.actions
    );
}

/// Saturation acts on a run of saturated steps only: a clean step restarts the count, the
/// warm-up never acts however long the run, and a layer whose amax jumps that step is
/// left to the jump's rule.
#[test]
fn saturation_counts_runs_after_the_warm_up_outside_jumps() {
    let rules = Rules::default();
    let sat = |l: i32, o: Operand, m: &mut OperandMetrics| {
        if l == 3 && o == Operand::Gradient {
            m.saturation_rate = 0.01;
        }
    };
    let changed = |r: &StepResponse| r.actions.iter().any(|a| matches!(a, Action::ChangeRecipe(_)));
    let mut state = fresh();
    for step in 0..5 {
        let r = on_step(&rules, &metrics(step, 3.0, 1.0, state, sat)).unwrap();
        assert!(r.actions.is_empty(), "warm-up step {step}: {:?}", r.actions);
        state = r.state;
    }
    let warm = healthy(&rules, fresh(), 0, 25);
    let mut state = warm.clone();
    for (step, saturated) in [(25, true), (26, true), (27, false), (28, true), (29, true)] {
        let r = on_step(&rules, &metrics(step, 3.0, 1.0, state, if saturated { sat } else { |_: i32, _: Operand, _: &mut OperandMetrics| {} })).unwrap();
        assert!(!changed(&r), "step {step}: {:?}", r.actions);
        state = r.state;
    }
    assert!(changed(&on_step(&rules, &metrics(30, 3.0, 1.0, state, sat)).unwrap()));
    // The third saturated step brings an amax jump in the same layer: only the jump's rule.
    let mut state = warm;
    for step in 25..27 {
        state = on_step(&rules, &metrics(step, 3.0, 1.0, state, sat)).unwrap().state;
    }
    let both = |l: i32, o: Operand, m: &mut OperandMetrics| {
        sat(l, o, m);
        if l == 3 && o == Operand::Activation {
            m.amax = 1000.0;
        }
    };
    let r = on_step(&rules, &metrics(27, 3.0, 1.0, state, both)).unwrap();
    assert!(r.actions.iter().any(|a| matches!(a, Action::ResetAmax(s) if s.layers == [3])), "{:?}", r.actions);
    assert!(!changed(&r), "{:?}", r.actions);
}

/// Underflow counts on gradients only; it never narrows a layer already in BF16 for all
/// GEMMs to its backward; and a demoted layer that underflows again starts its clean count
/// over.
#[test]
fn underflow_edges() {
    let rules = Rules { promote_after: 4, ..Rules::default() };
    let under = |o_want: Operand| move |l: i32, o: Operand, m: &mut OperandMetrics| {
        if l == 0 && o == o_want {
            m.underflow_rate = 0.9;
        }
    };
    assert!(on_step(&rules, &metrics(2, 3.0, 1.0, fresh(), under(Operand::Activation))).unwrap().actions.is_empty());
    let nan = on_step(&rules, &metrics(2, f64::NAN, 1.0, fresh(), |l, o, m| m.nonfinite = l == 0 && o == Operand::Weight)).unwrap();
    assert!(has_fallback(&nan.actions, 0, FallbackScope::AllGemms));
    let r = on_step(&rules, &metrics(3, 3.0, 1.0, nan.state, under(Operand::Gradient))).unwrap();
    assert!(!r.actions.iter().any(|a| matches!(a, Action::Fallback(_))), "{:?}", r.actions);
    // Backward demoted at step 0; clean 1..=3; underflow again at 4; back 4 clean steps later.
    let mut state = on_step(&rules, &metrics(0, 3.0, 1.0, fresh(), under(Operand::Gradient))).unwrap().state;
    let mut back = Vec::new();
    for step in 1..10 {
        let r = if step == 4 {
            on_step(&rules, &metrics(step, 3.0, 1.0, state, under(Operand::Gradient))).unwrap()
        } else {
            on_step(&rules, &metrics(step, 3.0, 1.0, state, |_, _, _| {})).unwrap()
        };
        if r.actions.iter().any(|a| matches!(a, Action::Repromote(p) if p.sites.layers == [0])) {
            back.push(step);
        }
        state = r.state;
    }
    assert_eq!(back, [8]);
}

/// The loss-spike rule's parts, each alone: z above `loss_z` on the second step in a row
/// (not the first; the run restarts after a rollback), above the largest loss times
/// `loss_spike_factor` (not the mean's), no rollback on a step already skipped, a second
/// spike 50 steps after the first (the cooldown) only rolls back, and a third within the
/// cooldown does not start a second global fallback.
#[test]
fn loss_spike_edges() {
    let rules = Rules::default();
    let base = healthy(&rules, fresh(), 0, 30);
    let rolled = |r: &StepResponse| r.actions.iter().any(|a| matches!(a, Action::Rollback(_)));
    let global = |r: &StepResponse| r.actions.iter().any(|a| matches!(a, Action::FallbackGlobal(_)));
    let z8 = |state: &[u8]| {
        let m = Memory::decode(state).unwrap();
        m.loss_mean + 8.0 * m.loss_var.sqrt()
    };
    let r30 = on_step(&rules, &metrics(30, z8(&base), 1.0, base.clone(), |_, _, _| {})).unwrap();
    assert!(!rolled(&r30), "one step at z 8: {:?}", r30.actions);
    let r31 = on_step(&rules, &metrics(31, z8(&r30.state), 1.0, r30.state.clone(), |_, _, _| {})).unwrap();
    assert!(rolled(&r31), "two steps at z 8: {:?}", r31.actions);
    let r32 = on_step(&rules, &metrics(32, z8(&r31.state), 1.0, r31.state, |_, _, _| {})).unwrap();
    assert!(!rolled(&r32), "the run restarts after a rollback: {:?}", r32.actions);
    // The factor rule alone (z rules off): above 10x the largest loss, not 10x the mean.
    let factor = Rules { loss_z: 1e9, loss_z_now: 1e9, ..Rules::default() };
    let state = healthy(&factor, fresh(), 0, 30);
    let m = Memory::decode(&state).unwrap();
    let between = 10.0 * m.max_loss - 0.05;
    assert!(between > 10.0 * m.loss_mean, "max {} mean {}", m.max_loss, m.loss_mean);
    assert!(!rolled(&on_step(&factor, &metrics(30, between, 1.0, state.clone(), |_, _, _| {})).unwrap()));
    assert!(rolled(&on_step(&factor, &metrics(30, 10.0 * m.max_loss + 0.05, 1.0, state, |_, _, _| {})).unwrap()));
    // A spike on a step an amax jump already skips: no rollback.
    let jump = |l: i32, o: Operand, m: &mut OperandMetrics| {
        if l == 1 && o == Operand::Activation {
            m.amax = 1000.0;
        }
    };
    let r = on_step(&rules, &metrics(30, 3.5, 1.0, base.clone(), jump)).unwrap();
    assert!(skipped(&r) && !rolled(&r), "{:?}", r.actions);
    // Spikes at 30 and 80 (50 steps apart): two rollbacks, no global fallback.
    let first = on_step(&rules, &metrics(30, 3.5, 1.0, base.clone(), |_, _, _| {})).unwrap();
    let state = healthy(&rules, first.state.clone(), 31, 49);
    let r = on_step(&rules, &metrics(80, 3.5, 1.0, state, |_, _, _| {})).unwrap();
    assert!(rolled(&r) && !global(&r), "{:?}", r.actions);
    // Spikes at 30, 36 (global) and 38: the third rolls back without a second global.
    let state = healthy(&rules, first.state, 31, 5);
    let second = on_step(&rules, &metrics(36, 4.0, 1.0, state, |_, _, _| {})).unwrap();
    assert!(global(&second));
    let state = healthy(&rules, second.state, 37, 1);
    let third = on_step(&rules, &metrics(38, 4.0, 1.0, state, |_, _, _| {})).unwrap();
    assert!(rolled(&third) && !global(&third), "{:?}", third.actions);
}

/// A list length just past what the blob holds is refused as such (before reading it),
/// and a policy without rules alerts on non-finite gradients as on a non-finite loss.
#[test]
fn short_lists_and_no_fallback_gradients() {
    let mut short = TAG.to_vec();
    short.extend_from_slice(&13u64.to_le_bytes());
    assert!(Memory::decode(&short).unwrap_err().contains("a list of 13 entries in 12 bytes"));
    let r = no_fallback("fp8", &metrics(5, 3.0, f64::NAN, vec![0], |_, _, _| {}));
    assert_eq!(r.state, [1]);
    assert!(matches!(&r.actions[..], [Action::Alert(m)] if m.contains("fp8 has no fallback rules")), "{:?}", r.actions);
    // The next non-finite step of the run: no second alert.
    let r = no_fallback("fp8", &metrics(6, f64::NAN, 1.0, r.state, |_, _, _| {}));
    assert_eq!((r.actions.len(), r.state), (0, vec![1]));
}

/// A demoted layer's clean count restarts when saturation in its low-precision part
/// changes its recipe (it was implicated that step): backward demoted at step 25 with
/// re-promotion after 4 clean steps, its forward activation saturated at 26..=28 (recipe
/// changed at 28): back at 32, not 29.
#[test]
fn saturation_in_a_demoted_layer_restarts_its_clean_count() {
    let rules = Rules { promote_after: 4, ..Rules::default() };
    let mut state = healthy(&rules, fresh(), 0, 25);
    let mut back = Vec::new();
    let mut changed = Vec::new();
    for step in 25..34 {
        let r = on_step(&rules, &metrics(step, 3.0, 1.0, state, |l, o, m| {
            if l == 3 && o == Operand::Gradient && step == 25 {
                m.underflow_rate = 0.9;
            }
            if l == 3 && o == Operand::Activation && (26..=28).contains(&step) {
                m.saturation_rate = 0.01;
            }
        }))
        .unwrap();
        if step == 25 {
            assert!(has_fallback(&r.actions, 3, FallbackScope::BackwardOnly), "{:?}", r.actions);
        }
        if r.actions.iter().any(|a| matches!(a, Action::ChangeRecipe(c) if c.sites.layers == [3])) {
            changed.push(step);
        }
        if r.actions.iter().any(|a| matches!(a, Action::Repromote(p) if p.sites.layers == [3])) {
            back.push(step);
        }
        state = r.state;
    }
    assert_eq!((changed, back), (vec![28], vec![32]));
}
