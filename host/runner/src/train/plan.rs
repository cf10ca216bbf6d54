//! A precision policy at work in a training run: its plan in the executor's terms, the
//! host's checks at load (known-bad combinations), and its actions carried out with the
//! host's guardrails, each recorded in the decision log.
//!
//! The plan in effect is kept as the contract's site plans (what `on-step` is shown);
//! every change goes to the executor as a whole new plan
//! (`Executor::set_precision`, which keeps the amax history of an operand whose format
//! and scaling stay).

use serde::Serialize;

use crate::report::plural;

use runner_exec::precision as ex;
use runner_graph::DType;
use runner_kernels::cpu::quant::{ScaleFormat as KScaleFormat, ScaleRounding as KScaleRounding};

use crate::plugin::precision::{
    Action, AmaxReduction, Dtype, FallbackScope, GemmRole, GemmSite, OperandPlan, ScaleFormat, ScaleRounding,
    ScalingRecipe, SitePlan, ValueRounding, dtype_name, is_low_precision, selects, unscaled_operand,
};

/// One decision: what a policy asked at a step and what the host did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Decision {
    /// Training iteration (steps taken or skipped).
    pub iteration: u64,
    /// Optimizer steps applied before it.
    pub step: u64,
    /// `alert`, `skip-step`, `rollback`, `fallback`, `fallback-global`, `change-recipe`,
    /// `repromote`, `reset-amax`, `replan`, `checkpoint-now`, `abort`, or `inject`.
    pub action: String,
    pub detail: String,
    /// Whether the host carried it out (`false`: refused by a guardrail, said why).
    pub applied: bool,
}

/// What the actions of one step ask of the training loop.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub skip: bool,
    /// (steps back, batches to skip).
    pub rollback: Option<(u32, u32)>,
    pub abort: Option<String>,
    /// Sites (indices) whose amax histories to forget.
    pub reset: Vec<usize>,
    pub replan: bool,
    pub checkpoint: bool,
    /// The plan changed: hand it to the executor.
    pub changed: bool,
}

/// "1 batch", "3 batches": [`plural`]'s "es" case.
fn batches(n: impl std::fmt::Display) -> String {
    let n = n.to_string();
    if n == "1" { "1 batch".into() } else { format!("{n} batches") }
}

/// A GEMM format as the IR's: the contract's one map (`dtype_to_ir`), int32 refused.
fn dtype(d: Dtype) -> Result<DType, String> {
    match d {
        Dtype::Int32 => Err("int32 is not a GEMM format".into()),
        d => Ok(crate::plugin::workload::dtype_to_ir(d)),
    }
}

/// A contract operand plan as the executor runs it.
pub fn operand(p: &OperandPlan) -> Result<ex::OperandPlan, String> {
    let scaling = match p.recipe {
        ScalingRecipe::None => ex::Scaling::None,
        ScalingRecipe::Delayed => ex::Scaling::Delayed {
            history: p.amax_history,
            reduction: match p.amax_reduction {
                AmaxReduction::MostRecent => ex::AmaxReduction::MostRecent,
                AmaxReduction::Max => ex::AmaxReduction::Max,
            },
            margin: p.margin,
        },
        ScalingRecipe::Current => ex::Scaling::Current { margin: p.margin },
        ScalingRecipe::Block => ex::Scaling::Block {
            rows: p.block.rows,
            cols: p.block.cols,
            scale_format: match p.scale_format {
                ScaleFormat::Fp32 => KScaleFormat::Fp32,
                ScaleFormat::E8m0 => KScaleFormat::E8M0,
                ScaleFormat::E4m3 => KScaleFormat::E4M3,
            },
            scale_rounding: match p.scale_rounding {
                ScaleRounding::Exact => KScaleRounding::Exact,
                ScaleRounding::PowerOfTwoDown => KScaleRounding::Pow2Down,
                ScaleRounding::PowerOfTwoUp => KScaleRounding::Pow2Up,
            },
            tensor_scale: p.tensor_scale.is_some(),
        },
    };
    Ok(ex::OperandPlan {
        format: dtype(p.format)?,
        scaling,
        saturate: p.saturate,
        stochastic: p.value_rounding == ValueRounding::Stochastic,
        hadamard: p.hadamard,
    })
}

fn role(r: GemmRole) -> ex::GemmRole {
    match r {
        GemmRole::Forward => ex::GemmRole::Forward,
        GemmRole::InputGradient => ex::GemmRole::InputGradient,
        GemmRole::WeightGradient => ex::GemmRole::WeightGradient,
    }
}

/// The plan in the executor's terms: (op name, role, site plan) per site.
///
/// # Errors
/// A format the executor does not take (named with the site).
pub fn executor_plan(sites: &[GemmSite], plans: &[SitePlan]) -> Result<Vec<(String, ex::GemmRole, ex::SitePlan)>, String> {
    sites
        .iter()
        .zip(plans)
        .map(|(s, p)| {
            let ctx = |m: String| format!("site {} ({:?}): {m}", s.name, s.role);
            Ok((
                s.name.clone(),
                role(s.role),
                ex::SitePlan {
                    activation: operand(&p.activation).map_err(ctx)?,
                    weight: operand(&p.weight).map_err(ctx)?,
                    gradient: operand(&p.gradient).map_err(ctx)?,
                    output: dtype(p.output).map_err(ctx)?,
                },
            ))
        })
        .collect()
}

/// Whether the GEMM of `site` runs in low precision under `p` (both operands it reads).
pub fn low_precision(site: &GemmSite, p: &SitePlan) -> bool {
    let (a, b) = match site.role {
        GemmRole::Forward => (&p.activation, &p.weight),
        GemmRole::InputGradient => (&p.gradient, &p.weight),
        GemmRole::WeightGradient => (&p.gradient, &p.activation),
    };
    is_low_precision(a.format) && is_low_precision(b.format)
}

/// Share of GEMM FLOPs (2·m·n·k per site) that runs in low precision.
pub fn coverage(sites: &[GemmSite], plans: &[SitePlan]) -> f64 {
    let flops = |s: &GemmSite| 2.0 * s.m as f64 * s.n as f64 * s.k as f64;
    let total: f64 = sites.iter().map(flops).sum();
    let low: f64 = sites.iter().zip(plans).filter(|(s, p)| low_precision(s, p)).map(|(s, _)| flops(s)).sum();
    // `+ 0.0`: an empty f64 sum is -0.0, which would print as "-0.0%".
    if total > 0.0 { low / total + 0.0 } else { 0.0 }
}

/// Combinations refused when a plan is loaded, beyond the contract's rules (which already
/// refuse formats the device cannot run, e.g. NVFP4 on Hopper, and 2-D x 2-D block
/// GEMMs): a forward GEMM with both operands in E5M2 (Transformer Engine asserts against
/// pure E5M2 training: its 2 mantissa bits are for gradients), and a Hadamard transform
/// anywhere but on both inputs of a weight-gradient GEMM.
///
/// # Errors
/// The first such site, named.
pub fn known_bad(sites: &[GemmSite], plans: &[SitePlan]) -> Result<(), String> {
    for (s, p) in sites.iter().zip(plans) {
        if s.role == GemmRole::Forward && p.activation.format == Dtype::Fp8E5m2 && p.weight.format == Dtype::Fp8E5m2 {
            return Err(format!(
                "site {} (forward): both operands in fp8-e5m2 (pure E5M2 training is refused, as Transformer Engine \
                 does); plan activations and weights in fp8-e4m3",
                s.name
            ));
        }
        let h = [p.activation.hadamard, p.weight.hadamard, p.gradient.hadamard];
        let ok = match s.role {
            GemmRole::WeightGradient => h[1] == 0 && h[0] == h[2],
            _ => h == [0, 0, 0],
        };
        if !ok {
            return Err(format!(
                "site {} ({:?}): a Hadamard transform must be planned on both inputs of the weight-gradient GEMM alike \
                 and nowhere else, got activation {}, weight {}, gradient {}",
                s.name, s.role, h[0], h[1], h[2]
            ));
        }
    }
    Ok(())
}

fn scope_name(s: FallbackScope) -> &'static str {
    match s {
        FallbackScope::AllGemms => "all GEMMs",
        FallbackScope::ForwardOnly => "forward only",
        FallbackScope::BackwardOnly => "backward only",
        FallbackScope::WeightGradientOnly => "weight gradient only",
    }
}

fn recipe_name(r: ScalingRecipe) -> &'static str {
    match r {
        ScalingRecipe::None => "no",
        ScalingRecipe::Delayed => "delayed",
        ScalingRecipe::Current => "current",
        ScalingRecipe::Block => "block",
    }
}

/// The roles a fallback scope covers.
fn in_scope(scope: FallbackScope, r: GemmRole) -> bool {
    match scope {
        FallbackScope::AllGemms => true,
        FallbackScope::ForwardOnly => r == GemmRole::Forward,
        FallbackScope::BackwardOnly => r != GemmRole::Forward,
        FallbackScope::WeightGradientOnly => r == GemmRole::WeightGradient,
    }
}

/// The plan a policy made, the plan in effect, and the host's guardrail.
#[derive(Clone, Debug)]
pub struct PlanState {
    pub sites: Vec<GemmSite>,
    pub original: Vec<SitePlan>,
    pub current: Vec<SitePlan>,
    /// Most of the layers the policy planned in low precision that may run in BF16 at
    /// once through per-layer fallbacks (a global fallback is explicit and exempt).
    pub max_bf16_share: f64,
}

impl PlanState {
    pub fn new(sites: Vec<GemmSite>, plans: Vec<SitePlan>, max_bf16_share: f64) -> PlanState {
        PlanState { sites, original: plans.clone(), current: plans, max_bf16_share }
    }

    /// Layers the original plan runs in low precision.
    fn low_layers(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.sites.iter().zip(&self.original).filter(|(s, p)| low_precision(s, p)).map(|(s, _)| s.layer).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Share of [`PlanState::low_layers`] with a site no longer in low precision under `plans`.
    fn demoted_share(&self, plans: &[SitePlan]) -> f64 {
        let low = self.low_layers();
        if low.is_empty() {
            return 0.0;
        }
        let demoted = low
            .iter()
            .filter(|&&l| {
                self.sites.iter().zip(&self.original).zip(plans).any(|((s, o), p)| s.layer == l && low_precision(s, o) && !low_precision(s, p))
            })
            .count();
        demoted as f64 / low.len() as f64
    }

    /// Carry out a step's actions; `log` receives a decision per action.
    pub fn apply(&mut self, actions: &[Action], mut log: impl FnMut(&str, String, bool)) -> Outcome {
        let mut out = Outcome::default();
        for a in actions {
            match a {
                Action::Alert(m) => log("alert", m.clone(), true),
                Action::SkipStep => {
                    out.skip = true;
                    log("skip-step", "the update is discarded".into(), true);
                }
                Action::Rollback(r) => {
                    out.rollback = Some((r.steps, r.skip_batches));
                    log("rollback", format!("{} back to the last known-good checkpoint, {} skipped", plural(r.steps, "step"), batches(r.skip_batches)), true);
                }
                Action::Abort(m) => {
                    out.abort = Some(m.clone());
                    log("abort", m.clone(), true);
                }
                Action::Replan => {
                    out.replan = true;
                    log("replan", "the policy is asked for a new plan".into(), true);
                }
                Action::CheckpointNow => {
                    out.checkpoint = true;
                    log("checkpoint-now", "a known-good checkpoint is taken".into(), true);
                }
                Action::ResetAmax(sel) => {
                    let hit: Vec<usize> = (0..self.sites.len()).filter(|&i| selects(sel, &self.sites[i])).collect();
                    // Selector first, as the other actions' details: a detail that starts with
                    // a digit is right-aligned by the table.
                    log("reset-amax", format!("{}: {}", describe(sel), plural(hit.len(), "site")), !hit.is_empty());
                    out.reset.extend(hit);
                }
                Action::Fallback(f) => {
                    let mut next = self.current.clone();
                    let mut n = 0;
                    for (i, s) in self.sites.iter().enumerate() {
                        if selects(&f.sites, s) && in_scope(f.scope, s.role) && low_precision(s, &next[i]) {
                            let o = unscaled_operand(f.to);
                            next[i] = SitePlan { activation: o, weight: o, gradient: o, output: next[i].output };
                            n += 1;
                        }
                    }
                    let share = self.demoted_share(&next);
                    let what = format!("{} ({}) to {}: {}", describe(&f.sites), scope_name(f.scope), dtype_name(f.to), plural(n, "site"));
                    if share > self.max_bf16_share + 1e-9 {
                        log(
                            "fallback",
                            format!(
                                "{what}; refused: {:.0}% of the low-precision layers would run in BF16, over the host's cap of {:.0}% \
                                 (--max-bf16-share)",
                                100.0 * share,
                                100.0 * self.max_bf16_share
                            ),
                            false,
                        );
                    } else {
                        out.changed |= n > 0;
                        self.current = next;
                        log("fallback", what, n > 0);
                    }
                }
                Action::FallbackGlobal(f) => {
                    let mut n = 0;
                    for (i, s) in self.sites.iter().enumerate() {
                        if in_scope(f.scope, s.role) && low_precision(s, &self.current[i]) {
                            let o = unscaled_operand(f.to);
                            self.current[i] = SitePlan { activation: o, weight: o, gradient: o, output: self.current[i].output };
                            n += 1;
                        }
                    }
                    out.changed |= n > 0;
                    log("fallback-global", format!("every GEMM ({}) to {}: {}", scope_name(f.scope), dtype_name(f.to), plural(n, "site")), n > 0);
                }
                Action::ChangeRecipe(c) => {
                    let mut n = 0;
                    let mut refused = 0;
                    for (i, s) in self.sites.iter().enumerate() {
                        if !selects(&c.sites, s) {
                            continue;
                        }
                        let p = &mut self.current[i];
                        for o in [&mut p.activation, &mut p.weight, &mut p.gradient] {
                            let per_tensor = matches!(o.recipe, ScalingRecipe::Delayed | ScalingRecipe::Current);
                            if !is_low_precision(o.format) {
                                continue;
                            }
                            if !per_tensor || c.recipe == ScalingRecipe::Block || c.recipe == ScalingRecipe::None {
                                refused += 1;
                                continue;
                            }
                            o.recipe = c.recipe;
                            o.margin = c.margin;
                            if c.recipe == ScalingRecipe::Delayed {
                                o.amax_history = if c.amax_history > 0 { c.amax_history } else { o.amax_history.max(1) };
                            }
                            n += 1;
                        }
                    }
                    out.changed |= n > 0;
                    let mut d = format!("{}: {} scaling, margin {}: {}", describe(&c.sites), recipe_name(c.recipe), c.margin, plural(n, "operand"));
                    if refused > 0 {
                        d += &format!("; {} left alone (a per-tensor recipe switches only to another per-tensor one)", plural(refused, "operand"));
                    }
                    log("change-recipe", d, n > 0);
                }
                Action::Repromote(r) => {
                    let mut n = 0;
                    for (i, s) in self.sites.iter().enumerate() {
                        if selects(&r.sites, s) && low_precision(s, &self.original[i]) && !same(&self.current[i], &self.original[i]) {
                            self.current[i] = self.original[i];
                            n += 1;
                        }
                    }
                    out.changed |= n > 0;
                    log("repromote", format!("{} back to the policy's plan: {}", describe(&r.sites), plural(n, "site")), n > 0);
                }
            }
        }
        out
    }
}

/// Whether two site plans run alike (formats, recipes, margins, blocks of each operand).
fn same(a: &SitePlan, b: &SitePlan) -> bool {
    let key = |o: &OperandPlan| (o.format, o.recipe, o.margin, o.amax_history, o.block.rows, o.block.cols);
    [(&a.activation, &b.activation), (&a.weight, &b.weight), (&a.gradient, &b.gradient)].iter().all(|(x, y)| key(x) == key(y))
        && a.output == b.output
}

/// A selector in words.
fn describe(s: &crate::plugin::precision::SiteSelector) -> String {
    let mut parts = Vec::new();
    if !s.layers.is_empty() {
        // The policies' alerts' words: layer -1 is the embedding/head, never "[-1, ...]".
        parts.push(runner_contract::precision::layers_named(&s.layers));
    }
    if !s.names.is_empty() {
        parts.push(format!("names {:?}", s.names));
    }
    if !s.roles.is_empty() {
        parts.push(format!("roles {:?}", s.roles));
    }
    if parts.is_empty() { "every site".into() } else { parts.join(", ") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::precision::{Fallback, GlobalFallback, RecipeChange, Repromotion, SiteSelector, unscaled};

    fn fp8() -> SitePlan {
        let d = |f| OperandPlan { recipe: ScalingRecipe::Delayed, amax_history: 16, ..unscaled_operand(f) };
        SitePlan { activation: d(Dtype::Fp8E4m3), weight: d(Dtype::Fp8E4m3), gradient: d(Dtype::Fp8E5m2), output: Dtype::Bf16 }
    }

    /// Layers 0..4, one linear, three roles; layer 0 BF16.
    fn state(cap: f64) -> PlanState {
        let mut sites = Vec::new();
        let mut plans = Vec::new();
        for layer in 0..4 {
            for role in [GemmRole::Forward, GemmRole::InputGradient, GemmRole::WeightGradient] {
                sites.push(GemmSite { layer, name: format!("layers.{layer}.mlp.up"), role, m: 8, n: 8, k: 8 });
                plans.push(if layer == 0 { unscaled(Dtype::Bf16) } else { fp8() });
            }
        }
        PlanState::new(sites, plans, cap)
    }

    fn layer(l: i32) -> SiteSelector {
        SiteSelector { layers: vec![l], names: vec![], roles: vec![] }
    }

    #[test]
    fn fallback_scopes_pick_their_roles_and_repromotion_restores() {
        let mut st = state(1.0);
        let mut log = Vec::new();
        let o = st.apply(&[Action::Fallback(Fallback { sites: layer(2), scope: FallbackScope::WeightGradientOnly, to: Dtype::Bf16 })], |a, d, ok| log.push((a.to_string(), d, ok)));
        assert!(o.changed && !o.skip);
        let low: Vec<bool> = st.sites.iter().zip(&st.current).filter(|(s, _)| s.layer == 2).map(|(s, p)| low_precision(s, p)).collect();
        assert_eq!(low, [true, true, false]);
        assert!((coverage(&st.sites, &st.current) - 8.0 / 12.0).abs() < 1e-12);
        st.apply(&[Action::Fallback(Fallback { sites: layer(3), scope: FallbackScope::BackwardOnly, to: Dtype::Bf16 })], |_, _, _| {});
        let low3: Vec<bool> = st.sites.iter().zip(&st.current).filter(|(s, _)| s.layer == 3).map(|(s, p)| low_precision(s, p)).collect();
        assert_eq!(low3, [true, false, false]);
        st.apply(&[Action::Repromote(Repromotion { sites: layer(2), to: Dtype::Fp8E4m3 })], |_, _, _| {});
        assert!(st.current[6..9].iter().zip(&st.original[6..9]).all(|(a, b)| same(a, b)));
        assert!(log[0].2 && log[0].0 == "fallback");
    }

    /// A MoE model's plan: its expert linears are GEMM sites over all dispatched rows
    /// (tokens x top-k), the executor takes their FP8 plans, and the coverage counts
    /// their FLOPs (routers in BF16 the only high-precision GEMMs here).
    #[test]
    fn moe_expert_linears_are_planned_run_and_counted() {
        use runner_exec::toy::{ToyConfig, llama};
        let g = llama(&ToyConfig { layers: 1, moe: Some((4, 2, 32)), ..ToyConfig::tiny() });
        let sites: Vec<GemmSite> = crate::project::gemm_sites(&g).into_iter().map(|(_, s)| s).collect();
        let tokens = g.tensors[g.tensor_id("tokens").unwrap()].numel();
        let experts: Vec<&GemmSite> = sites.iter().filter(|s| s.name.contains(".moe.experts.")).collect();
        assert_eq!(experts.len(), 9, "gate, up and down in three roles");
        assert!(experts.iter().all(|s| s.m == 2 * tokens), "every token's top-2 copies");
        let plans: Vec<SitePlan> =
            sites.iter().map(|s| if s.name.contains("router") { unscaled(Dtype::Bf16) } else { fp8() }).collect();
        let mut exec = runner_exec::Executor::new(&g, runner_exec::cpu::Cpu::new(), runner_exec::ExecOptions::default()).unwrap();
        exec.set_precision(&executor_plan(&sites, &plans).unwrap()).unwrap();
        let flops = |s: &GemmSite| 2.0 * (s.m * s.n * s.k) as f64;
        let total: f64 = sites.iter().map(flops).sum();
        let router: f64 = sites.iter().filter(|s| s.name.contains("router")).map(flops).sum();
        let expert: f64 = experts.iter().map(|s| flops(s)).sum();
        assert!((coverage(&sites, &plans) - (total - router) / total).abs() < 1e-12);
        assert!(expert > 0.2 * total, "the experts carry a large share of the FLOPs: {expert} of {total}");
    }

    #[test]
    fn the_host_caps_per_layer_fallbacks_but_not_a_global_one() {
        let mut st = state(0.34); // one of the three FP8 layers
        let mut refused = Vec::new();
        let fb = |l| Action::Fallback(Fallback { sites: layer(l), scope: FallbackScope::AllGemms, to: Dtype::Bf16 });
        st.apply(&[fb(1), fb(2)], |a, d, ok| {
            if !ok {
                refused.push((a.to_string(), d));
            }
        });
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(refused[0].1.contains("--max-bf16-share"));
        assert!(low_precision(&st.sites[6], &st.current[6]), "layer 2 stays FP8");
        let o = st.apply(&[Action::FallbackGlobal(GlobalFallback { scope: FallbackScope::AllGemms, to: Dtype::Bf16 })], |_, _, _| {});
        assert!(o.changed);
        assert_eq!(coverage(&st.sites, &st.current), 0.0);
        assert!(coverage(&st.sites, &st.current).is_sign_positive(), "not printed as -0.0 %");
    }

    #[test]
    fn recipe_changes_switch_per_tensor_scaling_only() {
        let mut st = state(1.0);
        let mut log = Vec::new();
        st.apply(
            &[Action::ChangeRecipe(RecipeChange { sites: layer(1), recipe: ScalingRecipe::Current, margin: 1, amax_history: 0 })],
            |a, d, ok| log.push((a.to_string(), d, ok)),
        );
        assert!(st.current[3..6].iter().all(|p| p.weight.recipe == ScalingRecipe::Current && p.weight.margin == 1));
        assert!(st.current[6].weight.recipe == ScalingRecipe::Delayed);
        st.apply(&[Action::ChangeRecipe(RecipeChange { sites: layer(2), recipe: ScalingRecipe::Block, margin: 0, amax_history: 0 })], |a, d, ok| log.push((a.to_string(), d, ok)));
        assert!(!log[1].2 && log[1].1.contains("left alone"), "{log:?}");
    }

    #[test]
    fn control_actions_reach_the_loop() {
        let mut st = state(1.0);
        let o = st.apply(
            &[
                Action::SkipStep,
                Action::Rollback(crate::plugin::precision::Rollback { steps: 2, skip_batches: 3 }),
                Action::ResetAmax(layer(1)),
                Action::CheckpointNow,
                Action::Replan,
                Action::Abort("stop".into()),
                Action::Alert("hello".into()),
            ],
            |_, _, _| {},
        );
        assert!(o.skip && o.checkpoint && o.replan && !o.changed);
        assert_eq!(o.rollback, Some((2, 3)));
        assert_eq!(o.reset, [3, 4, 5]);
        let mut details = Vec::new();
        st.apply(&[Action::ResetAmax(layer(2))], |_, d, _| details.push(d));
        assert_eq!(details, ["layers [2]: 3 sites"], "left-aligned in the decisions table, like the other details");
        assert_eq!(o.abort.as_deref(), Some("stop"));
    }

    /// The decisions table names layer -1 as the policies' alerts do (the contract's
    /// `layers_named`), never "layers [-1, 0, ...]", and a layer below -1 as none. Kills:
    /// `describe` back to `{:?}` of the layers; any negative layer taken for -1.
    #[test]
    fn the_embedding_head_is_named_in_words() {
        let mut st = state(1.0);
        let mut details = Vec::new();
        let sel = SiteSelector { layers: vec![-1, 1, 2], names: vec![], roles: vec![] };
        st.apply(&[Action::ResetAmax(sel), Action::ResetAmax(layer(-1))], |_, d, _| details.push(d));
        assert_eq!(details, ["the embedding/head and layers [1, 2]: 6 sites", "the embedding/head: 0 sites"]);
        // Only -1 is the embedding/head: -7 is no layer, and said to be none (it read as
        // the embedding/head).
        let ghost = SiteSelector { layers: vec![1_000_000, -7], names: vec![], roles: vec![] };
        details.clear();
        st.apply(&[Action::ResetAmax(ghost)], |_, d, _| details.push(d));
        assert_eq!(details, ["layers [1000000, -7] (no layer -7): 0 sites"]);
    }

    #[test]
    fn known_bad_plans_are_refused_at_load() {
        let st = state(1.0);
        assert!(known_bad(&st.sites, &st.original).is_ok());
        let mut bad = st.original.clone();
        bad[3].activation.format = Dtype::Fp8E5m2;
        bad[3].weight.format = Dtype::Fp8E5m2;
        assert!(known_bad(&st.sites, &bad).unwrap_err().contains("pure E5M2"));
        let mut bad = st.original.clone();
        bad[5].gradient.hadamard = 16;
        assert!(known_bad(&st.sites, &bad).unwrap_err().contains("Hadamard"));
        bad[5].activation.hadamard = 16;
        assert!(known_bad(&st.sites, &bad).is_ok());
        let plans = executor_plan(&st.sites, &st.original).unwrap();
        assert_eq!(plans.len(), 12);
        assert!(matches!(plans[3].2.weight.scaling, ex::Scaling::Delayed { history: 16, .. }));
        // One E5M2 operand of a forward GEMM is fine; a Hadamard on the weight of the
        // weight-gradient GEMM is not (it reads no weight).
        let mut ok = st.original.clone();
        ok[3].activation.format = Dtype::Fp8E5m2;
        assert!(known_bad(&st.sites, &ok).is_ok());
        let mut bad = st.original.clone();
        bad[5].weight.hadamard = 16;
        assert!(known_bad(&st.sites, &bad).unwrap_err().contains("weight 16"));
        assert_eq!(plans[4].1, ex::GemmRole::InputGradient);
        assert_eq!(plans[5].1, ex::GemmRole::WeightGradient);
        assert_eq!(plans[5].0, "layers.1.mlp.up");
    }

    /// Each role's GEMM reads two operands: forward activation x weight, input gradient
    /// gradient x weight, weight gradient gradient x activation.
    #[test]
    fn a_gemm_is_low_precision_when_both_its_operands_are() {
        let site = |role| GemmSite { layer: 1, name: "l".into(), role, m: 1, n: 1, k: 1 };
        let bf = unscaled_operand(Dtype::Bf16);
        let roles = [GemmRole::Forward, GemmRole::InputGradient, GemmRole::WeightGradient];
        let low = |p: SitePlan| roles.map(|r| low_precision(&site(r), &p));
        assert_eq!(low(SitePlan { gradient: bf, ..fp8() }), [true, false, false]);
        assert_eq!(low(SitePlan { weight: bf, ..fp8() }), [false, false, true]);
        assert_eq!(low(SitePlan { activation: bf, ..fp8() }), [false, true, false]);
        assert_eq!(low(fp8()), [true, true, true]);
    }

    /// Coverage weighs sites by their FLOPs, 2 m n k, not by their number.
    #[test]
    fn coverage_counts_flops() {
        let sites = vec![
            GemmSite { layer: 0, name: "a".into(), role: GemmRole::Forward, m: 2, n: 3, k: 4 },
            GemmSite { layer: 1, name: "b".into(), role: GemmRole::Forward, m: 4, n: 3, k: 4 },
        ];
        assert!((coverage(&sites, &[fp8(), unscaled(Dtype::Bf16)]) - 1.0 / 3.0).abs() < 1e-12);
        assert!((coverage(&sites, &[unscaled(Dtype::Bf16), fp8()]) - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(coverage(&[], &[]), 0.0);
    }

    /// The cap is inclusive: reaching it exactly is allowed (half the FP8 layers under
    /// the default 0.5); a forward-only fallback leaves the backward; a global one
    /// honours its scope too.
    #[test]
    fn the_cap_is_reached_not_passed_and_scopes_hold() {
        let mut st = state(1.0 / 3.0);
        let mut log = Vec::new();
        let o = st.apply(&[Action::Fallback(Fallback { sites: layer(1), scope: FallbackScope::ForwardOnly, to: Dtype::Bf16 })], |a, d, ok| {
            log.push((a.to_string(), d, ok))
        });
        assert!(o.changed && log[0].2, "{log:?}");
        assert!(log[0].1.ends_with("(forward only) to bf16: 1 site"), "{log:?}");
        let low: Vec<bool> = (3..6).map(|i| low_precision(&st.sites[i], &st.current[i])).collect();
        assert_eq!(low, [false, true, true]);
        assert!((st.demoted_share(&st.current) - 1.0 / 3.0).abs() < 1e-12);
        let mut st = state(1.0);
        let o = st.apply(&[Action::FallbackGlobal(GlobalFallback { scope: FallbackScope::WeightGradientOnly, to: Dtype::Bf16 })], |_, _, _| {});
        assert!(o.changed);
        let low: Vec<bool> = (3..12).map(|i| low_precision(&st.sites[i], &st.current[i])).collect();
        assert_eq!(low, [true, true, false].repeat(3));
        // Repromotion counts only the sites it changes back.
        let mut n = Vec::new();
        st.apply(&[Action::Repromote(Repromotion { sites: layer(2), to: Dtype::Fp8E4m3 })], |_, d, _| n.push(d));
        assert_eq!(n, ["layers [2] back to the policy's plan: 1 site"]);
        assert!(st.current[6..9].iter().zip(&st.original[6..9]).all(|(a, b)| same(a, b)));
    }

    /// Delayed scaling takes the history asked for, or keeps the operand's (at least 1);
    /// `same` tells plans apart by margin and history.
    #[test]
    fn a_recipe_change_sets_margin_and_history() {
        let mut st = state(1.0);
        let delayed = |l, h| Action::ChangeRecipe(RecipeChange { sites: layer(l), recipe: ScalingRecipe::Delayed, margin: 2, amax_history: h });
        st.apply(&[delayed(1, 0), delayed(2, 4)], |_, _, _| {});
        assert!(st.current[3..6].iter().all(|p| p.weight.amax_history == 16 && p.weight.margin == 2));
        assert!(st.current[6..9].iter().all(|p| p.activation.amax_history == 4 && p.gradient.amax_history == 4));
        assert!(!same(&st.current[3], &st.original[3]) && !same(&st.current[6], &st.original[6]));
        let mut m = st.original[3];
        m.weight.amax_history = 1024;
        assert!(!same(&m, &st.original[3]));
    }

    /// The contract's block recipes and rounding map one to one onto the executor's.
    #[test]
    fn block_scaled_operands_map_onto_the_executor() {
        let mx = OperandPlan {
            recipe: ScalingRecipe::Block,
            block: crate::plugin::precision::BlockShape { rows: 1, cols: 32 },
            scale_format: ScaleFormat::E8m0,
            scale_rounding: ScaleRounding::PowerOfTwoUp,
            value_rounding: ValueRounding::Stochastic,
            ..unscaled_operand(Dtype::Mxfp8)
        };
        let want = ex::OperandPlan {
            format: DType::MxFp8,
            scaling: ex::Scaling::Block { rows: 1, cols: 32, scale_format: KScaleFormat::E8M0, scale_rounding: KScaleRounding::Pow2Up, tensor_scale: false },
            saturate: true,
            stochastic: true,
            hadamard: 0,
        };
        assert_eq!(operand(&mx).unwrap(), want);
        let nv = OperandPlan {
            scale_format: ScaleFormat::E4m3,
            scale_rounding: ScaleRounding::PowerOfTwoDown,
            tensor_scale: Some(ScaleFormat::Fp32),
            value_rounding: ValueRounding::NearestEven,
            hadamard: 16,
            saturate: false,
            ..mx
        };
        let ex::OperandPlan { scaling, stochastic, hadamard, saturate, .. } = operand(&nv).unwrap();
        assert_eq!(
            scaling,
            ex::Scaling::Block { rows: 1, cols: 32, scale_format: KScaleFormat::E4M3, scale_rounding: KScaleRounding::Pow2Down, tensor_scale: true }
        );
        assert_eq!((stochastic, hadamard, saturate), (false, 16, false));
        let cur = OperandPlan { recipe: ScalingRecipe::Current, margin: 3, ..unscaled_operand(Dtype::Fp8E4m3) };
        assert_eq!(operand(&cur).unwrap().scaling, ex::Scaling::Current { margin: 3 });
        let max = OperandPlan { recipe: ScalingRecipe::Delayed, amax_history: 8, amax_reduction: AmaxReduction::Max, ..cur };
        assert_eq!(operand(&max).unwrap().scaling, ex::Scaling::Delayed { history: 8, reduction: ex::AmaxReduction::Max, margin: 3 });
        assert!(operand(&unscaled_operand(Dtype::Int32)).unwrap_err().contains("int32"));
    }
}
