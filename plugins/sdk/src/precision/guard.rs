//! Fallback rules for precision policies: triggers on each step's numerics and the
//! actions they take, with the policy's memory kept in its state blob.
//!
//! The rule set is the runner's proposal (docs/PLUGINS.md, "Fallback rules"), built
//! from what Transformer Engine, Megatron-LM and the FP8 literature report:
//!
//! | trigger | fires when | action |
//! |---|---|---|
//! | non-finite | NaN/Inf in the loss, the gradients, or any operand of a layer | skip the step; the low-precision layer the NaN starts in (the first whose forward operands hold one, else the last whose gradients do) falls back to BF16 |
//! | amax jump | after the warm-up, an FP8 activation or weight's amax exceeds `amax_jump` x its previous one | skip the step, forget that layer's amax history (a delayed scale would carry the outlier for the history's length); a second jump demotes the layer |
//! | saturation | more than `saturation_rate` of an operand clips for `saturation_steps` steps in a row, after the warm-up (amaxes grow fast in the first steps) | delayed scaling switches to current scaling with one binade of margin; already current: the layer falls back |
//! | underflow | more than `underflow_rate` of a gradient operand flushes to zero, in a layer without an amax jump this step | the layer's backward falls back to BF16 |
//! | loss spike | z-score of the loss against its EMA above `loss_z` for `loss_z_steps` steps, above `loss_z_now` once, or above `loss_spike_factor` x the largest loss (Megatron) | roll back to the last known-good checkpoint and skip batches; a second spike within `rollback_cooldown` steps falls back globally |
//! | gradient-norm spike | the gradient norm above `grad_norm_ratio` x its EMA | skip the step |
//!
//! A demoted layer is re-promoted after `promote_after` clean steps, doubled after each
//! relapse; after `max_demotions` demotions it is pinned to BF16 for the rest of the run.
//! At most `max_bf16_share` of the layers the plan put in low precision may be demoted
//! at once (so a policy cannot quietly become a BF16 run); past it the step is skipped
//! instead and an alert says so. A global fallback returns after `promote_after` steps.

use super::*;
// One rule for naming layers, shared with the host's decisions table.
use runner_contract::precision::{layer_name, layers_named};

/// Thresholds and schedules of the rules.
#[derive(Clone, Debug, PartialEq)]
pub struct Rules {
    /// Clean steps before the loss and gradient-norm statistics are trusted.
    pub warmup_steps: u64,
    /// EMA weight of a new step.
    pub ema_alpha: f64,
    pub loss_z: f64,
    pub loss_z_steps: u32,
    pub loss_z_now: f64,
    pub loss_spike_factor: f64,
    pub grad_norm_ratio: f64,
    pub saturation_rate: f64,
    pub saturation_steps: u32,
    pub amax_jump: f64,
    pub underflow_rate: f64,
    pub promote_after: u64,
    pub max_demotions: u32,
    pub max_bf16_share: f64,
    pub rollback_steps: u32,
    pub skip_batches: u32,
    pub rollback_cooldown: u64,
}

impl Default for Rules {
    /// Defaults sized for benchmark-length runs (hundreds to thousands of steps); the
    /// notes' production values (warm-up of hundreds of steps, re-promotion after
    /// 500-2000) are a `Rules { .. }` away.
    fn default() -> Rules {
        Rules {
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
        }
    }
}

const TAG: &[u8; 4] = b"grd1";
const NONE: u64 = u64::MAX;

/// A layer's fallback state.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Layer {
    layer: i32,
    /// 0 in low precision, else the fallback scope + 1.
    scope: u8,
    clean: u64,
    need: u64,
    demotions: u32,
    jumps: u32,
    /// Consecutive steps with saturation.
    sat_run: u32,
    pinned: bool,
}

/// What the rules remember between steps (encoded into the policy's state blob).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Memory {
    /// Per planned site: its layer and role (0, 1, 2).
    sites: Vec<(i32, u8)>,
    layers: Vec<Layer>,
    seen: u64,
    loss_mean: f64,
    loss_var: f64,
    gnorm_mean: f64,
    max_loss: f64,
    z_run: u32,
    last_rollback: u64,
    global_since: u64,
    /// Per site and operand: the last amax seen.
    amax: Vec<f32>,
}

fn role_code(r: GemmRole) -> u8 {
    match r {
        GemmRole::Forward => 0,
        GemmRole::InputGradient => 1,
        GemmRole::WeightGradient => 2,
    }
}

fn scope_code(s: FallbackScope) -> u8 {
    match s {
        FallbackScope::AllGemms => 1,
        FallbackScope::ForwardOnly => 2,
        FallbackScope::BackwardOnly => 3,
        FallbackScope::WeightGradientOnly => 4,
    }
}

fn operand_index(o: Operand) -> usize {
    match o {
        Operand::Activation => 0,
        Operand::Weight => 1,
        Operand::Gradient => 2,
    }
}

impl Memory {
    /// The memory of a fresh plan: the sites' layers and which layers run low precision.
    pub fn for_plan(sites: &[GemmSite], plans: &[SitePlan]) -> Memory {
        let mut layers: Vec<Layer> = Vec::new();
        for (s, p) in sites.iter().zip(plans) {
            if is_low_precision(p.activation.format) && !layers.iter().any(|l| l.layer == s.layer) {
                layers.push(Layer { layer: s.layer, ..Layer::default() });
            }
        }
        Memory {
            sites: sites.iter().map(|s| (s.layer, role_code(s.role))).collect(),
            layers,
            last_rollback: NONE,
            global_since: NONE,
            amax: vec![0.0; sites.len() * 3],
            ..Memory::default()
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = TAG.to_vec();
        let u64s = |b: &mut Vec<u8>, v: u64| b.extend_from_slice(&v.to_le_bytes());
        u64s(&mut b, self.sites.len() as u64);
        for &(l, r) in &self.sites {
            b.extend_from_slice(&l.to_le_bytes());
            b.push(r);
        }
        u64s(&mut b, self.layers.len() as u64);
        for l in &self.layers {
            b.extend_from_slice(&l.layer.to_le_bytes());
            b.push(l.scope);
            u64s(&mut b, l.clean);
            u64s(&mut b, l.need);
            b.extend_from_slice(&l.demotions.to_le_bytes());
            b.extend_from_slice(&l.jumps.to_le_bytes());
            b.extend_from_slice(&l.sat_run.to_le_bytes());
            b.push(u8::from(l.pinned));
        }
        u64s(&mut b, self.seen);
        for f in [self.loss_mean, self.loss_var, self.gnorm_mean, self.max_loss] {
            b.extend_from_slice(&f.to_le_bytes());
        }
        b.extend_from_slice(&self.z_run.to_le_bytes());
        u64s(&mut b, self.last_rollback);
        u64s(&mut b, self.global_since);
        u64s(&mut b, self.amax.len() as u64);
        for a in &self.amax {
            b.extend_from_slice(&a.to_le_bytes());
        }
        b
    }

    /// Decode a blob [`Memory::encode`] wrote.
    ///
    /// # Errors
    /// A blob of another policy, or cut short.
    pub fn decode(b: &[u8]) -> Result<Memory, String> {
        let mut r = Reader { b, at: 0 };
        if r.take(4)? != TAG {
            return Err(format!("policy state: {} bytes without the '{}' tag (state from another policy?)", b.len(), "grd1"));
        }
        let mut m = Memory::default();
        let n = r.len()?;
        for _ in 0..n {
            m.sites.push((r.i32()?, r.u8()?));
        }
        let n = r.len()?;
        for _ in 0..n {
            m.layers.push(Layer {
                layer: r.i32()?,
                scope: r.u8()?,
                clean: r.u64()?,
                need: r.u64()?,
                demotions: r.u32()?,
                jumps: r.u32()?,
                sat_run: r.u32()?,
                pinned: r.u8()? != 0,
            });
        }
        m.seen = r.u64()?;
        m.loss_mean = r.f64()?;
        m.loss_var = r.f64()?;
        m.gnorm_mean = r.f64()?;
        m.max_loss = r.f64()?;
        m.z_run = r.u32()?;
        m.last_rollback = r.u64()?;
        m.global_since = r.u64()?;
        let n = r.len()?;
        for _ in 0..n {
            m.amax.push(f32::from_le_bytes(r.take(4)?.try_into().map_err(|_| "policy state: cut short".to_string())?));
        }
        if r.at != b.len() {
            return Err(format!("policy state: {} trailing bytes", b.len() - r.at));
        }
        Ok(m)
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let s = self.b.get(self.at..self.at + n).ok_or_else(|| format!("policy state: cut short at byte {}", self.at))?;
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], String> {
        self.take(N)?.try_into().map_err(|_| "policy state: cut short".to_string())
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn f64(&mut self) -> Result<f64, String> {
        Ok(f64::from_le_bytes(self.arr()?))
    }
    /// A length, bounded by what the blob can still hold (no huge allocation on junk).
    fn len(&mut self) -> Result<usize, String> {
        let n = self.u64()?;
        if n > self.b.len() as u64 {
            return Err(format!("policy state: a list of {n} entries in {} bytes", self.b.len()));
        }
        Ok(n as usize)
    }
}

fn plan_role(i: usize, sites: &[(i32, u8)]) -> &'static str {
    match sites.get(i).map(|s| s.1) {
        Some(0) => "forward",
        Some(1) => "input-gradient",
        _ => "weight-gradient",
    }
}

fn layer_selector(layers: Vec<i32>) -> SiteSelector {
    SiteSelector { layers, names: Vec::new(), roles: Vec::new() }
}

/// The rules applied to one step.
struct Step<'a> {
    rules: &'a Rules,
    mem: &'a mut Memory,
    step: u64,
    actions: Vec<Action>,
    skip: bool,
    implicated: Vec<i32>,
}

impl Step<'_> {
    fn alert(&mut self, m: String) {
        self.actions.push(Action::Alert(m));
    }

    fn demoted(&self) -> usize {
        self.mem.layers.iter().filter(|l| l.scope != 0).count()
    }

    /// Fall layer `layer` back to BF16 over `scope`, within the budget.
    fn demote(&mut self, layer: i32, scope: FallbackScope, why: &str) {
        self.implicated.push(layer);
        let budget = (self.rules.max_bf16_share * self.mem.layers.len() as f64).floor() as usize;
        let demoted = self.demoted();
        let step = self.step;
        let Some(i) = self.mem.layers.iter().position(|l| l.layer == layer) else { return };
        let l = self.mem.layers[i];
        if l.scope == 1 || l.scope == scope_code(scope) {
            return;
        }
        if l.scope == 0 && demoted + 1 > budget {
            self.skip = true;
            self.alert(format!(
                "step {step}: {} ({why}) stays in low precision: {demoted} of {} low-precision layers are \
                 in BF16 already, the most this policy allows ({:.0}%); step skipped instead",
                layer_name(layer),
                self.mem.layers.len(),
                100.0 * self.rules.max_bf16_share
            ));
            return;
        }
        let demotions = l.demotions + 1;
        let pinned = demotions >= self.rules.max_demotions;
        let need = self.rules.promote_after.saturating_mul(1 << (demotions - 1).min(20));
        self.mem.layers[i] = Layer { scope: scope_code(scope), clean: 0, need, demotions, pinned, ..l };
        self.actions.push(Action::Fallback(Fallback { sites: layer_selector(vec![layer]), scope, to: Dtype::Bf16 }));
        let after = if pinned {
            format!("pinned to BF16 for the rest of the run after {demotions} demotions")
        } else {
            format!("re-promoted after {need} clean steps")
        };
        let scope = match scope {
            FallbackScope::AllGemms => "all GEMMs",
            FallbackScope::ForwardOnly => "forward only",
            FallbackScope::BackwardOnly => "backward only",
            FallbackScope::WeightGradientOnly => "weight gradient only",
        };
        self.alert(format!("step {step}: {} falls back to BF16 ({scope}): {why}; {after}", layer_name(layer)));
    }
}

/// Apply `rules` to a step's metrics with the memory in `metrics.state`; the actions
/// and the new state.
///
/// # Errors
/// A state blob the rules did not write.
pub fn on_step(rules: &Rules, metrics: &StepMetrics) -> Result<StepResponse, String> {
    let mut mem = Memory::decode(&metrics.state)?;
    let step = metrics.step;
    let mut s = Step { rules, mem: &mut mem, step, actions: Vec::new(), skip: false, implicated: Vec::new() };

    // Non-finite values: skip; demote the low-precision layer they start in. A NaN
    // spreads forward through the later layers and backward into every gradient, so the
    // origin is the first layer whose forward operands hold one, else the last layer
    // whose gradients do, else the first layer flagged. A layer already partly in BF16
    // (its backward after underflow, say) widens to all GEMMs: left as it was, each such
    // step was skipped and its clean count never moved, so it stayed stuck.
    let mut forward_bad: Vec<i32> = Vec::new();
    let mut backward_bad: Vec<i32> = Vec::new();
    for sm in &metrics.sites {
        let Some(&(layer, role)) = s.mem.sites.get(sm.site as usize) else { continue };
        for o in sm.operands.iter().filter(|o| o.nonfinite) {
            if role == 0 && o.operand != Operand::Gradient {
                forward_bad.push(layer);
            } else {
                backward_bad.push(layer);
            }
        }
    }
    let flagged: Vec<i32> = metrics.layers.iter().filter(|l| l.nonfinite).map(|l| l.layer).collect();
    let in_layers = |v: &[i32]| v.iter().copied().filter(|l| *l >= 0).collect::<Vec<i32>>();
    let origin = in_layers(&forward_bad)
        .into_iter()
        .min()
        .or_else(|| in_layers(&backward_bad).into_iter().max())
        .or_else(|| in_layers(&flagged).into_iter().min());
    let mut bad_layers: Vec<i32> = forward_bad.iter().chain(&backward_bad).chain(&flagged).copied().collect();
    bad_layers.sort_unstable();
    bad_layers.dedup();
    let loss_ok = metrics.loss_finite && metrics.loss.is_finite();
    if !loss_ok || !metrics.grads_finite || !bad_layers.is_empty() {
        s.skip = true;
        if let Some(l) = origin
            && s.mem.layers.iter().any(|x| x.layer == l && x.scope != scope_code(FallbackScope::AllGemms))
        {
            s.demote(l, FallbackScope::AllGemms, "non-finite values start in its GEMM operands");
        }
        let where_ = if bad_layers.is_empty() { String::new() } else { format!(" ({})", layers_named(&bad_layers)) };
        s.alert(format!("step {step}: non-finite loss or gradients{where_}; step skipped"));
        let mut actions = std::mem::take(&mut s.actions);
        actions.insert(0, Action::SkipStep);
        return Ok(StepResponse { actions, state: mem.encode() });
    }

    // Per-operand numerics of low-precision sites: amax jumps, saturation, underflow.
    let warm = s.mem.seen >= rules.warmup_steps;
    let (mut jumps, mut saturated, mut underflow) = (Vec::new(), Vec::new(), Vec::new());
    for sm in &metrics.sites {
        let i = sm.site as usize;
        let (Some(&(layer, _)), Some(plan)) = (s.mem.sites.get(i), metrics.plan.get(i)) else { continue };
        for o in &sm.operands {
            let op_plan = match o.operand {
                Operand::Activation => &plan.activation,
                Operand::Weight => &plan.weight,
                Operand::Gradient => &plan.gradient,
            };
            if !is_low_precision(op_plan.format) {
                continue;
            }
            let k = i * 3 + operand_index(o.operand);
            let prev = s.mem.amax.get(k).copied().unwrap_or(0.0);
            // Amaxes grow fast while the warm-up's learning rate climbs: jumps count after it.
            // Only activations and weights: gradient amaxes swing by 10-100x from batch to
            // batch in healthy training (E5M2's range is for that); their trouble shows as
            // saturation or underflow.
            let jump = warm && o.operand != Operand::Gradient && prev > 0.0 && o.amax > rules.amax_jump * f64::from(prev);
            if jump {
                jumps.push((layer, o.amax / f64::from(prev), format!(
                    "{} of the {} GEMM {:.3e} -> {:.3e}",
                    if o.operand == Operand::Activation { "activation" } else { "weight" },
                    plan_role(i, &s.mem.sites),
                    prev,
                    o.amax
                )));
            } else if let Some(a) = s.mem.amax.get_mut(k) {
                *a = o.amax as f32;
            }
            if o.saturation_rate > rules.saturation_rate {
                saturated.push((layer, op_plan.recipe));
            }
            if o.operand == Operand::Gradient && o.underflow_rate > rules.underflow_rate {
                underflow.push((layer, o.underflow_rate));
            }
        }
    }
    let mut jump_layers: Vec<i32> = jumps.iter().map(|j| j.0).collect();
    jump_layers.sort_unstable();
    jump_layers.dedup();
    for &l in &jump_layers {
        let ratio = jumps.iter().filter(|j| j.0 == l).map(|j| j.1).fold(0.0, f64::max);
        let what = jumps.iter().find(|j| j.0 == l && j.1 == ratio).map_or(String::new(), |j| j.2.clone());
        s.skip = true;
        s.implicated.push(l);
        let Some(i) = s.mem.layers.iter().position(|x| x.layer == l) else { continue };
        s.mem.layers[i].jumps += 1;
        if s.mem.layers[i].jumps >= 2 {
            s.demote(l, FallbackScope::AllGemms, &format!("a second amax jump (x{ratio:.0})"));
        } else {
            s.actions.push(Action::ResetAmax(layer_selector(vec![l])));
            s.alert(format!("step {step}: amax jump x{ratio:.0} in {} ({what}); step skipped, its amax history reset", layer_name(l)));
        }
    }
    saturated.sort_by_key(|x| x.0);
    saturated.dedup_by_key(|x| x.0);
    for l in s.mem.layers.iter_mut() {
        l.sat_run = if saturated.iter().any(|x| x.0 == l.layer) { l.sat_run + 1 } else { 0 };
    }
    for (l, recipe) in saturated {
        let run = s.mem.layers.iter().find(|x| x.layer == l).map_or(0, |x| x.sat_run);
        if jump_layers.contains(&l) || !warm || run < rules.saturation_steps {
            continue;
        }
        if let Some(x) = s.mem.layers.iter_mut().find(|x| x.layer == l) {
            x.sat_run = 0;
        }
        s.implicated.push(l);
        if recipe == ScalingRecipe::Delayed {
            s.actions.push(Action::ChangeRecipe(RecipeChange {
                sites: layer_selector(vec![l]),
                recipe: ScalingRecipe::Current,
                margin: 1,
                amax_history: 0,
            }));
            s.alert(format!(
                "step {step}: saturation above {} in {} for {} steps; delayed -> current scaling, margin 1",
                rules.saturation_rate,
                layer_name(l),
                rules.saturation_steps
            ));
        } else {
            s.demote(l, FallbackScope::AllGemms, "saturation under current scaling");
        }
    }
    underflow.sort_by_key(|x| x.0);
    underflow.dedup_by_key(|x| x.0);
    for (l, rate) in underflow {
        // An amax jump's outlier sets a scale that flushes the rest of the layer's
        // gradients: the jump's rule (skip, reset; demote on the second) answers it, as
        // it does saturation. Demoting here made one spike demote the layer.
        if jump_layers.contains(&l) {
            continue;
        }
        s.demote(l, FallbackScope::BackwardOnly, &format!("{:.0}% of a gradient operand flushed to zero", 100.0 * rate));
    }

    // Loss spike (after warm-up): roll back and skip batches; twice in a row: global.
    let z = (metrics.loss - s.mem.loss_mean) / (s.mem.loss_var + 1e-12).sqrt();
    let high = warm && z > rules.loss_z;
    let spike = warm
        && (z > rules.loss_z_now
            || (high && s.mem.z_run + 1 >= rules.loss_z_steps)
            || (s.mem.max_loss > 0.0 && metrics.loss > rules.loss_spike_factor * s.mem.max_loss));
    s.mem.z_run = if high { s.mem.z_run + 1 } else { 0 };
    if spike && !s.skip {
        let again = s.mem.last_rollback != NONE && step.saturating_sub(s.mem.last_rollback) < rules.rollback_cooldown;
        if again && s.mem.global_since == NONE {
            s.mem.global_since = step;
            s.actions.push(Action::FallbackGlobal(GlobalFallback { scope: FallbackScope::AllGemms, to: Dtype::Bf16 }));
            s.alert(format!("step {step}: a second loss spike within {} steps; every GEMM falls back to BF16 for {} steps", rules.rollback_cooldown, rules.promote_after));
        }
        s.mem.last_rollback = step;
        s.mem.z_run = 0;
        s.actions.push(Action::Rollback(Rollback { steps: rules.rollback_steps, skip_batches: rules.skip_batches }));
        s.alert(format!(
            "step {step}: loss spike {:.4} (z {z:.1} against EMA {:.4}); rolled back to the last known-good checkpoint, \
             {} batches skipped",
            metrics.loss, s.mem.loss_mean, rules.skip_batches
        ));
        let actions = std::mem::take(&mut s.actions);
        return Ok(StepResponse { actions, state: mem.encode() });
    }

    // Gradient-norm spike: skip the update.
    if warm && metrics.grad_norm > rules.grad_norm_ratio * s.mem.gnorm_mean && !s.skip {
        s.skip = true;
        s.alert(format!(
            "step {step}: gradient norm {:.3e} is {:.1}x its EMA {:.3e}; step skipped",
            metrics.grad_norm,
            metrics.grad_norm / s.mem.gnorm_mean,
            s.mem.gnorm_mean
        ));
    }

    if !s.skip {
        let a = if s.mem.seen == 0 { 1.0 } else { rules.ema_alpha };
        let d = metrics.loss - s.mem.loss_mean;
        s.mem.loss_mean += a * d;
        s.mem.loss_var = (1.0 - a) * (s.mem.loss_var + a * d * d);
        s.mem.gnorm_mean += a * (metrics.grad_norm - s.mem.gnorm_mean);
        s.mem.max_loss = s.mem.max_loss.max(metrics.loss);
        s.mem.seen += 1;
    }

    // Re-promotion after clean steps (with the backoff set at demotion).
    let implicated = std::mem::take(&mut s.implicated);
    let mut promote = Vec::new();
    for l in s.mem.layers.iter_mut() {
        if l.scope == 0 || l.pinned {
            continue;
        }
        if implicated.contains(&l.layer) {
            l.clean = 0;
            continue;
        }
        l.clean += 1;
        if l.clean >= l.need {
            l.scope = 0;
            l.clean = 0;
            promote.push(l.layer);
        }
    }
    if !promote.is_empty() {
        s.actions.push(Action::Repromote(Repromotion { sites: layer_selector(promote.clone()), to: Dtype::Fp8E4m3 }));
        s.alert(format!("step {step}: {} re-promoted to low precision after clean steps", layers_named(&promote)));
    }
    if s.mem.global_since != NONE && step.saturating_sub(s.mem.global_since) >= rules.promote_after {
        s.mem.global_since = NONE;
        let layers: Vec<i32> = s.mem.layers.iter().filter(|l| l.scope == 0).map(|l| l.layer).collect();
        // Every layer still demoted: nothing returns (an empty selector matches every site).
        if !layers.is_empty() {
            s.actions.push(Action::Repromote(Repromotion { sites: layer_selector(layers), to: Dtype::Fp8E4m3 }));
        }
        s.alert(format!("step {step}: the global BF16 fallback ends"));
    }
    let mut actions = std::mem::take(&mut s.actions);
    if s.skip {
        actions.insert(0, Action::SkipStep);
    }
    Ok(StepResponse { actions, state: mem.encode() })
}

/// The answer of a policy without fallback rules (a recipe as its library ships it): no
/// action, and an alert on the first of a run of non-finite steps, so the report shows
/// what happened without a line per step. Its state is one byte: whether the last step
/// was non-finite.
pub fn no_fallback(policy: &str, metrics: &StepMetrics) -> StepResponse {
    let bad = !(metrics.loss_finite && metrics.loss.is_finite() && metrics.grads_finite);
    let mut actions = Vec::new();
    if bad && metrics.state.first() != Some(&1) {
        actions.push(Action::Alert(format!(
            "step {}: non-finite loss or gradients; {policy} has no fallback rules, the update is applied (and again \
             until the loss is finite)",
            metrics.step
        )));
    }
    StepResponse { actions, state: vec![u8::from(bad)] }
}

#[cfg(test)]
mod tests;
