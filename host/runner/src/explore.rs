//! The explorer: time and cost to train against GPU count, GPU type, precision and cloud.
//!
//! One run, end to end: load the workload, plan each precision, measure a training step
//! on the local device, and for every (GPU type, precision) series project the model onto
//! each GPU count (`runner_project`: the best layout that fits, its step time, memory and
//! breakdown), then price every cloud ([`crate::pricing`]). From the rows it derives the
//! sweet spot of each series (with its rule), FP8-against-BF16 comparisons with the plan's
//! coverage, and the answer to a goal (`--target-days`, `--budget`).
//!
//! Each finished row is handed to a [`Journal`] as it is computed, so a run stored in the
//! history resumes where it stopped. A plugin that fails is named with its error; a cost
//! plugin's failure drops that cloud, a workload plugin's failure stops the run.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use runner_graph::count::{self, AttentionFlops, Convention, Recompute};
use runner_project::precision::{Plan, Recipe};
use runner_project::profile::GpuProfile;
use runner_project::project::Projector;
use runner_project::search;
use runner_project::step::Projection;

use crate::measure::{self, LocalMeasurement};
use crate::plugin::cost::Offering;
use crate::plugin::workload::{GraphRequest, Variant};
use crate::plugin::{self, Kind, PluginInfo};
use crate::pricing::{self, Ask, Assumptions, CloudPrice, QuoteNotes};
use crate::project;
use crate::runfile::{RunFile, parse_option};

#[derive(Clone, Debug, Serialize)]
pub struct ModelSummary {
    pub plugin: String,
    pub variant: String,
    pub family: String,
    pub params_total: u64,
    pub params_active: u64,
    pub seq_len: u32,
    pub tokens: f64,
    pub flops_per_token: f64,
    pub flop_convention: String,
}

/// One GPU count of one series.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// GPUs asked for, and used: rounded up to whole nodes, so time and billing agree.
    pub requested_gpus: u32,
    pub gpus: u32,
    pub global_batch: u32,
    /// The fastest layout that fits; `None` when none does (`why_not` says why).
    pub projection: Option<Projection>,
    pub why_not: Option<String>,
    pub days: Option<f64>,
    /// One entry per cloud in [`Outcome::clouds`].
    pub costs: Vec<CloudPrice>,
    /// Against the series' first row that fits.
    #[serde(default)]
    pub speedup: Option<f64>,
    /// The cheapest quote against the series' first priced row: money, not GPU-hours
    /// (whole nodes, billing increments and spot inflation make them differ).
    #[serde(default)]
    pub relative_cost: Option<f64>,
    /// Index into `costs` of the cheapest quote (a clean price when any cloud has one).
    #[serde(default)]
    pub cheapest: Option<usize>,
    /// The series' sweet spot.
    #[serde(default)]
    pub sweet: bool,
}

/// How a row's `why_not` begins when no layout divides the model and the batch at its
/// count (rather than none fitting): [`nothing_fits`] writes it, [`Row::undivided`] reads it.
const NO_LAYOUT_DIVIDES: &str = "no layout divides";

impl Row {
    /// No layout divides the model and the batch at this count: a rule stood in the way,
    /// not memory.
    pub fn undivided(&self) -> bool {
        self.why_not.as_deref().is_some_and(|w| w.starts_with(NO_LAYOUT_DIVIDES))
    }

    /// The cheapest quote, if any cloud priced the row.
    pub fn cheapest_cost(&self) -> Option<&pricing::CloudCost> {
        self.cheapest.and_then(|i| self.costs[i].quote())
    }

    /// The wall-clock days at the cheapest quote ([`pricing::CloudCost::days`]: on spot,
    /// interruptions included); the projection's days where nothing is priced.
    pub fn quoted_days(&self) -> Option<f64> {
        let days = self.days?;
        Some(self.cheapest_cost().map_or(days, |c| c.days(days)))
    }
}

/// Every row of one GPU type under one precision.
#[derive(Clone, Debug, Serialize)]
pub struct Series {
    pub gpu: GpuProfile,
    pub precision: String,
    /// The precision plan in one line: where it came from and its GEMM FLOPs per format.
    pub plan: String,
    /// Share of GEMM FLOPs in a format other than BF16 (the plan's coverage).
    pub low_precision_share: f64,
    pub rows: Vec<Row>,
    /// GPUs of the sweet spot, and how the rule decided.
    pub sweet_spot: Option<u32>,
    pub sweet_spot_why: String,
}

impl Series {
    /// "H100 fp8".
    pub fn label(&self) -> String {
        format!("{} {}", self.gpu.name, self.precision)
    }
}

/// A low-precision series against BF16 on the same GPU type and count.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub gpu: String,
    pub precision: String,
    pub gpus: u32,
    pub days_bf16: f64,
    pub days: f64,
    /// BF16 days over these days.
    pub speedup: f64,
    /// The cheapest quotes, where priced.
    pub usd_bf16: Option<f64>,
    pub usd: Option<f64>,
    /// Share of GEMM FLOPs the plan runs in the low-precision format.
    pub coverage: f64,
}

/// One candidate answer to a goal: a series, a count and a cloud's cheapest quote.
#[derive(Clone, Debug, Serialize)]
pub struct Choice {
    pub gpu: String,
    pub precision: String,
    pub gpus: u32,
    pub layout: String,
    /// Wall-clock days as the quote assumes them (spot: interruptions included): the days
    /// a goal compares.
    pub days: f64,
    /// The projection's days, where the quote's differ (spot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub days_without_interruptions: Option<f64>,
    pub usd: Option<f64>,
    pub cloud: Option<String>,
    /// The price row: instance, region, option, date.
    pub price_row: Option<String>,
    /// The quote prices no storage (the cloud lists none), so the run costs more than `usd`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub storage_not_costed: bool,
}

impl Choice {
    pub fn describe(&self) -> String {
        let money = match (&self.usd, &self.cloud, &self.price_row) {
            (Some(u), Some(c), Some(r)) if self.storage_not_costed => {
                format!("{} on {c} ({r}; storage not costed)", crate::report::usd(*u))
            }
            (Some(u), Some(c), Some(r)) => format!("{} on {c} ({r})", crate::report::usd(*u)),
            _ => "not priced".into(),
        };
        let days = crate::report::explore::days_said(&crate::report::explore::days_cell(self.days));
        let days = match self.days_without_interruptions {
            Some(d) => format!("{days} wall clock with spot interruptions ({} without)", crate::report::explore::days_cell(d)),
            None => days,
        };
        format!("{} x {} {} ({}): {days}, {money}", self.gpus, self.gpu, self.precision, self.layout)
    }
}

/// What the user asked the explorer to find.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub enum Goal {
    /// The cheapest run that finishes within this many days.
    TargetDays(f64),
    /// The fastest run that costs at most this many US dollars.
    Budget(f64),
}

#[derive(Clone, Debug, Serialize)]
pub struct GoalAnswer {
    pub goal: Goal,
    /// Whether any priced row meets the goal.
    pub met: bool,
    /// The answer, or (goal not met) the nearest feasible alternative.
    pub best: Option<Choice>,
    /// The next best configurations (each GPU type, precision and count once).
    pub runners_up: Vec<Choice>,
    pub why: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub model: ModelSummary,
    pub series: Vec<Series>,
    /// Every cloud priced, clean prices before caveated ones, each cheapest first (as the
    /// tables rank them: `pricing::rank_clouds`); each row's `costs` follows this order.
    pub clouds: Vec<String>,
    /// None where nothing could be measured here (the reason is in the notes).
    pub measurement: Option<LocalMeasurement>,
    pub comparisons: Vec<Comparison>,
    pub goal: Option<GoalAnswer>,
    /// The sweet-spot rule, in words.
    pub sweet_spot_rule: String,
    pub assumptions: Assumptions,
    /// Every plugin the run used: name, kind, contract, path (or embedded) and sha256.
    pub plugins: Vec<PluginInfo>,
    pub notes: Vec<String>,
}

/// Where a run's finished pieces are kept as they are computed, so a killed run resumes.
pub trait Journal {
    /// The run's inputs are known (the run file as resolved, and the plugins with their
    /// sha256): open or resume the record.
    ///
    /// # Errors
    /// The record cannot be written.
    fn begin(&mut self, inputs: &Value, plugins: &[PluginInfo]) -> anyhow::Result<()>;
    /// A piece kept by an earlier, unfinished run with the same inputs.
    fn recall(&mut self, key: &str) -> Option<Value>;
    /// Keep a finished piece.
    ///
    /// # Errors
    /// The record cannot be written.
    fn record(&mut self, key: &str, value: &Value) -> anyhow::Result<()>;
}

/// A journal that keeps nothing.
pub struct NoJournal;

impl Journal for NoJournal {
    fn begin(&mut self, _: &Value, _: &[PluginInfo]) -> anyhow::Result<()> {
        Ok(())
    }
    fn recall(&mut self, _: &str) -> Option<Value> {
        None
    }
    fn record(&mut self, _: &str, _: &Value) -> anyhow::Result<()> {
        Ok(())
    }
}

/// Progress: what the run is doing, and how many rows of how many are done.
pub type Progress<'a> = &'a dyn Fn(&str, usize, usize);

/// Record a plugin the run used, in the outcome and as a note (so every output format
/// names it with its path and sha256).
fn record_plugin(plugins: &mut Vec<PluginInfo>, notes: &mut Vec<String>, info: &PluginInfo) {
    notes.push(format!("plugin: {}", info.provenance()));
    plugins.push(info.clone());
}

/// The name of the generic pricing plugin, which prices a user's `--price-file` and
/// nothing without one (so it is not among the clouds priced by default).
pub const PRICE_FILE_PLUGIN: &str = "price_file";

/// GPU counts asked for by a goal when the run names none: up to 16,384 GPUs.
pub const GOAL_COUNTS: [u32; 12] = [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];

/// One (GPU type, precision) series to project.
struct Plan1 {
    gpu: GpuProfile,
    recipe: Recipe,
    plan: Plan,
}

/// Run the explorer without a history.
///
/// # Errors
/// As [`run_with`].
pub fn run(run: &RunFile, progress: Progress<'_>) -> anyhow::Result<Outcome> {
    run_with(run, progress, &mut NoJournal)
}

/// Run the explorer, keeping each finished row in `journal`.
///
/// # Errors
/// A workload that cannot be loaded or described, an unknown variant, a graph that fails
/// validation, an unknown GPU, no (GPU, precision) pair the GPUs and policies can run,
/// or a price file that cannot be read or priced: the message names the plugin or file
/// and what to fix.
pub fn run_with(run: &RunFile, progress: Progress<'_>, journal: &mut dyn Journal) -> anyhow::Result<Outcome> {
    let limits = run.limits;
    let profiles = project::profiles(run.cluster.profile.as_deref().map(std::path::Path::new))?;
    // A name two boards share (a100) is said as the choice it was, before names are
    // replaced by the profiles' own.
    let mut notes: Vec<String> = run.cluster.gpu.iter().filter_map(|g| profiles.taken_as(g)).collect();
    let run = &by_profile_name(run, &profiles)?;
    let mut plugins = Vec::new();

    progress(&format!("loading {}", run.model.plugin), 0, 0);
    let plugin = plugin::load(&run.model.plugin)?;
    record_plugin(&mut plugins, &mut notes, &plugin.info);
    let mut workload = plugin.workload(limits)?;
    let info = workload.describe()?;
    let variant: &Variant = match &run.model.variant {
        Some(name) => project::variant_named(&info.variants, name).ok_or_else(|| {
            let names: Vec<&str> = info.variants.iter().map(|v| v.name.as_str()).collect();
            anyhow::anyhow!("{} has no variant '{name}'; it provides: {}", plugin.info.name, names.join(", "))
        })?,
        None => &info.variants[0],
    };
    let seq_len = run.model.seq_len.unwrap_or(variant.defaults.seq_len);
    let tokens = run.model.tokens.unwrap_or(variant.defaults.tokens);

    progress(&format!("building the {} graph (seq {seq_len})", variant.name), 0, 0);
    let found = project::Found {
        info: plugin.info.clone(),
        spec: run.model.plugin.clone(),
        family: variant.family.clone(),
        variant: variant.clone(),
    };
    let (model, source) = project::model(&found, seq_len, limits)?;
    project::refuse_moe_settings_without_experts(
        &[("[layout] fused_grouped_mlp", run.layout.fused_grouped_mlp == Some(true)), ("[layout] dispatcher", run.layout.dispatcher.is_some())],
        &variant.name,
        model.shape.experts,
    )?;
    let convention = Convention { attention: AttentionFlops::CausalHalved, recompute: Recompute::None };
    let flops_per_token = count::model_flops_per_step(&model.graph, &convention) / f64::from(seq_len);
    // NVIDIA's DGX Cloud benchmark READMEs count attention over all keys: the same run
    // reads that much higher in MFU there.
    let full_ratio = project::all_keys_ratio(&model.graph);
    let params = main_model_params(&mut workload, variant)?;

    // Every (GPU, precision) pair the GPU and the policy can run.
    progress("planning precision", 0, 0);
    let mut plans: Vec<Plan1> = Vec::new();
    let mut skipped = Vec::new();
    for name in &run.cluster.gpu {
        let gpu = profiles.get(name).map_err(anyhow::Error::msg)?.clone();
        for recipe in run.precision.recipes() {
            if let Err(e) = gpu.peak_flops(recipe.format()) {
                skipped.push(format!("{} {recipe}: {e}", gpu.name));
                continue;
            }
            let planned = match &run.precision.plugin {
                Some(spec) => project::plan_from_plugin(recipe, spec, variant, &gpu, &model.graph, limits).map(|(p, i)| (p, Some(i))),
                None => project::plan(recipe, variant, &gpu, &model.graph, limits),
            };
            match planned {
                Ok((plan, policy)) => {
                    if let Some(info) = policy
                        && !plugins.iter().any(|p: &PluginInfo| p.sha256 == info.sha256)
                    {
                        record_plugin(&mut plugins, &mut notes, &info);
                    }
                    plans.push(Plan1 { gpu: gpu.clone(), recipe, plan });
                }
                Err(e) => skipped.push(format!("{} {recipe}: {e:#}", gpu.name)),
            }
        }
    }
    if plans.is_empty() {
        anyhow::bail!(
            "no GPU type and precision asked for can run: {}; choose another [precision] format or GPU",
            skipped.join("; ")
        );
    }
    for s in skipped {
        notes.push(format!("not explored: {s}"));
    }
    let mut seen_plans = BTreeSet::new();
    for p in &plans {
        if seen_plans.insert(p.plan.summary()) {
            notes.push(format!("precision plan: {}", p.plan.summary()));
        }
        if p.plan.source != "built-in" || !seen_plans.insert(format!("builtin {}", p.recipe)) {
            continue;
        }
        // A file of the recipe's name that is there but cannot be used is said, with
        // the fix: "not installed" would send the user looking for the wrong thing.
        if let Some(why) = project::unusable(&format!("{}.wasm", p.recipe.name()), Kind::Precision) {
            notes.push(format!(
                "the {r} precision plugin cannot be used, so the built-in {r} plan is used instead: {why}",
                r = p.recipe
            ));
        } else if p.recipe != Recipe::Bf16 {
            notes.push(format!(
                "no {r}.wasm precision plugin is installed: the built-in {r} plan is used (linears of the \
                 transformer layers in {}, embedding, head and routers in BF16)",
                p.recipe.format(),
                r = p.recipe
            ));
        }
    }

    // Clouds: the named ones or every installed cloud, and the user's price file.
    let option = parse_option(&run.cost.option).map_err(anyhow::Error::msg)?;
    let mut clouds = load_clouds(&run.cost, &profiles, limits, progress, &mut plugins, &mut notes)?;

    journal.begin(&inputs(run, &profiles), &plugins)?;

    progress("measuring a training step on the local device", 0, 0);
    let measurement = match journal.recall("measurement").and_then(|v| serde_json::from_value::<LocalMeasurement>(v).ok()) {
        Some(m) => Some(m),
        None => match measure::measure(&mut workload, &info, variant, &run.measure) {
            Ok(m) => {
                journal.record("measurement", &serde_json::to_value(&m)?)?;
                Some(m)
            }
            Err(e) => {
                notes.push(format!("not measured on this device: {e:#}"));
                None
            }
        },
    };
    if let Some(m) = &measurement {
        notes.push(m.summary());
    }

    let goal = match (run.explore.target_days, run.explore.budget_usd) {
        (Some(d), _) => Some(Goal::TargetDays(d)),
        (None, Some(b)) => Some(Goal::Budget(b)),
        (None, None) => None,
    };
    if run.explore.target_days.is_some() && run.explore.budget_usd.is_some() {
        notes.push("both a target and a budget were given: the target is answered, the budget ignored".into());
    }

    let assumptions = run.assumptions;
    let (storage_gb, egress_gb) = storage_and_egress_gb(&assumptions, &params, tokens);

    let mut space = run.layout.space();
    space.optimizer = project::optimizer(run.layout.optimizer, variant, &mut notes);
    let fixed = run.layout.describe();
    if !fixed.is_empty() {
        notes.push(format!("layouts searched with {fixed} fixed by the run"));
    }
    let mut projector = Projector::new(model, Box::new(source), plans[0].gpu.clone(), plans[0].plan.clone());
    let mut series = Vec::new();
    // In the order the rows meet them (GPU counts upward), each once: sorted as text they
    // read 1024, 128, 16, ...
    let mut gbs_notes: Vec<String> = Vec::new();
    let mut gbs_note = |n: String| {
        if !gbs_notes.contains(&n) {
            gbs_notes.push(n);
        }
    };
    let mut dup_notes = BTreeSet::new();
    let job = project::Job::new(&projector.model, tokens);
    let mut quote_notes = QuoteNotes::default();
    // Rows walk up the GPU counts whatever order they were asked in: the speedup, the
    // relative cost and the sweet spot all read a series from its smallest count.
    let mut counts = run.cluster.gpus.clone();
    counts.sort_unstable();
    // Why the search found nothing at the first row, every family's reason as `project`
    // words it: said if the fixed layout divides no count.
    let mut first_refused: Option<String> = None;
    let total = plans.len() * counts.len();
    let mut done = 0;
    for p in &plans {
        projector.set_gpu(p.gpu.clone());
        projector.set_plan(p.plan.clone());
        let node = p.gpu.gpus_per_node.max(1);
        let mut rows = Vec::new();
        let mut counted: Vec<(u32, u32)> = Vec::new();
        for &asked in &counts {
            let n = whole_nodes(asked, node);
            // Two asked counts that round to one whole-node count would be two equal rows
            // (and a sweet spot "no faster" than itself). A count asked twice is refused
            // by the run file's rule (runner::input::refuse_repeated_gpu_counts).
            if let Some(&(first, _)) = counted.iter().find(|&&(_, m)| m == n) {
                dup_notes.insert(if asked == n {
                    format!("{asked} GPUs are already the row for {first} rounded up to whole nodes of {node} on {}: one row", p.gpu.name)
                } else {
                    format!("{asked} GPUs round up to {n} (whole nodes of {node} on {}), already the row for {first}: one row", p.gpu.name)
                });
                done += 1;
                continue;
            }
            counted.push((asked, n));
            let key = format!("row/{}/{}/{asked}", p.gpu.name, p.recipe);
            let (gbs, why) = match run.cluster.gbs {
                Some(g) => (g, format!("GBS {g} from the run")),
                None => {
                    // Every precision on a GPU trains with one batch, so that FP8 against
                    // BF16 compares the same job: BF16's rule where it runs, else the
                    // first precision's. Published rules can differ by precision (taken
                    // from different releases of a table).
                    let base = plans.iter().filter(|q| q.gpu.name == p.gpu.name).map(|q| q.recipe).find(|&r| r == Recipe::Bf16);
                    let base = base.unwrap_or_else(|| plans.iter().find(|q| q.gpu.name == p.gpu.name).map_or(p.recipe, |q| q.recipe));
                    let (g, why) = project::default_gbs(variant, &p.gpu, base, n, job);
                    let own = project::default_gbs(variant, &p.gpu, p.recipe, n, job).0;
                    if own != g {
                        gbs_note(format!(
                            "{} {} at {n} GPUs trains with {base}'s GBS {g}, to compare one job (its own rule gives {own})",
                            p.gpu.name, p.recipe
                        ));
                    }
                    (g, why)
                }
            };
            // A run shorter than one step has no days to speak of (it printed 1e-10 days,
            // less than the one step it takes).
            let step_tokens = f64::from(gbs) * f64::from(seq_len);
            if step_tokens > tokens {
                // Whole counts in full: 1.048576e6 read worse than 1048576, and SI's 1.0K
                // made 1000 tokens "fewer than" a step of 1.0K.
                let count = |v: f64| if v.fract() == 0.0 && v.abs() < 1e15 { format!("{v:.0}") } else { runner_contract::text::number(v) };
                anyhow::bail!(
                    "{} tokens to train are fewer than one step's {} (GBS {gbs} x sequence {seq_len}): train on more tokens \
                     (--tokens) or take a smaller batch (--gbs)",
                    count(tokens),
                    count(step_tokens)
                );
            }
            gbs_note(why);
            if let Some(row) = journal.recall(&key).and_then(|v| serde_json::from_value::<Row>(v).ok())
                && row.costs.len() == clouds.len()
                && quoted_on_profile_node(&row, &clouds, &p.gpu)
            {
                rows.push(row);
                done += 1;
                continue;
            }
            progress(&format!("{n} {} {}: searching layouts", p.gpu.name, p.recipe), done, total);
            let found = search::search(&mut projector, n, gbs, &space, 1);
            let best = found.best.into_iter().next();
            let why_not = best.is_none().then(|| nothing_fits(&found.families));
            if best.is_none() && series.is_empty() && rows.is_empty() {
                first_refused = Some(fixed_layout_refusal(&found.families, run.layout.tp.is_none() && run.layout.cp.is_none()));
            }
            let days = best.as_ref().map(|b| days_to_train(tokens, b.tokens_per_sec_per_gpu, n));
            let mut costs = Vec::with_capacity(clouds.len());
            for cloud in clouds.iter_mut() {
                costs.push(match days {
                    Some(d) => {
                        progress(&format!("{n} {} {}: pricing on {}", p.gpu.name, p.recipe, cloud.name), done, total);
                        let ask = Ask {
                            gpu: &p.gpu,
                            gpus: n,
                            hours: d * 24.0,
                            region: &run.cost.region,
                            option,
                            storage_gb_months: gb_months(storage_gb, d),
                            egress_gb,
                        };
                        cloud.cheapest(&ask, &assumptions, &mut quote_notes)
                    }
                    None => CloudPrice::NotSold,
                });
            }
            let row = Row {
                requested_gpus: asked,
                gpus: n,
                global_batch: gbs,
                projection: best,
                why_not,
                days,
                costs,
                speedup: None,
                relative_cost: None,
                cheapest: None,
                sweet: false,
            };
            journal.record(&key, &serde_json::to_value(&row)?)?;
            rows.push(row);
            done += 1;
        }
        series.push(Series {
            gpu: p.gpu.clone(),
            precision: p.recipe.name().into(),
            // + 0.0: an empty f64 sum is -0.0, which JSON would print.
            low_precision_share: p.plan.low_precision_share() + 0.0,
            plan: p.plan.summary(),
            rows,
            sweet_spot: None,
            sweet_spot_why: String::new(),
        });
    }
    progress("comparing", total, total);

    let order = cloud_order(&series, clouds.len());
    for s in &mut series {
        for row in &mut s.rows {
            let mut costs = std::mem::take(&mut row.costs);
            row.costs = order.iter().map(|&i| std::mem::replace(&mut costs[i], CloudPrice::NotSold)).collect();
        }
    }
    let cloud_names: Vec<String> = order.iter().map(|&i| clouds[i].name.clone()).collect();

    let rule = SweetSpotRule { max_usd_per_day_saved: run.explore.max_usd_per_day_saved };
    for s in &mut series {
        derive(s, &rule);
        // A GPU no cloud here sells (GH200 and H20 are in no shipped price list) is
        // projected but priced nowhere: said where its sweet spot would be (under its
        // table, in every format), with the way to price it.
        let sales: Vec<Sale> = order
            .iter()
            .map(|&i| {
                let (options, other_node) = pricing::sold_as(clouds[i].offerings(), &s.gpu, &run.cost.region);
                Sale { cloud: clouds[i].name.clone(), options, other_node }
            })
            .collect();
        if let Some(why) = sold_nowhere(s, &sales, option) {
            s.sweet_spot_why = format!("none: {why}");
        }
    }
    // Layout flags that no count can divide are a mistake to say, not a table of "nothing
    // fits" (--tp 3 on 8-GPU nodes).
    let rows = || series.iter().flat_map(|s| &s.rows);
    // Said as `project` says it: the fixed degrees' product first, else every family's
    // reason at the first count (one family's, the most given, named a flag the run left
    // free: "CP: tp·cp = 16 does not divide 8 GPUs" for a fixed pp of 64).
    if !fixed.is_empty() && rows().all(Row::undivided) {
        let first = rows().next();
        let l = &run.layout;
        let why = first
            .and_then(|r| project::fixed_degrees_refusal([l.tp, l.pp, l.cp], r.gpus, "fixed by the run"))
            .or(first_refused)
            .or_else(|| first.and_then(|r| r.why_not.clone()))
            .unwrap_or_default();
        anyhow::bail!("the layout fixed by the run ({fixed}) divides none of the GPU counts: {why}");
    }
    let comparisons = compare(&series);
    let goal = goal.map(|g| answer(g, &series, &cloud_names, &run.cluster.gpus));

    notes.extend(gbs_notes);
    notes.extend(dup_notes);
    notes.extend(quote_notes.finish());
    notes.extend(price_provenance(&series, &cloud_names));
    notes.extend(layout_string_notes(&series));
    notes.extend(rounding_note(&series));
    // The straggler wait is fitted to runs of at most this many GPUs; past it, say so.
    let widest = series
        .iter()
        .flat_map(|s| &s.rows)
        .filter(|r| u64::from(r.gpus) > runner_project::step::STRAGGLER_FITTED_UP_TO)
        .filter_map(|r| r.projection.as_ref())
        .max_by_key(|p| p.gpus);
    if let Some(p) = widest {
        notes.push(format!(
            "beyond {} GPUs, the largest published runs the straggler spread was fitted to, the wait for the slowest \
             rank follows its law without data: {:.1} % of the step at {} GPUs",
            runner_project::step::STRAGGLER_FITTED_UP_TO,
            100.0 * p.breakdown.straggler / p.step_time_s,
            p.gpus
        ));
    }
    let gpus_used: BTreeSet<String> = series.iter().map(|s| format!("{} ({})", s.gpu.name, s.gpu.efficiency.fitted)).collect();
    notes.push(format!(
        "modelled: the best layout per GPU count from the layout search over the sharded per-rank graph \
         (runner_project); GPU profiles {} from {}",
        gpus_used.into_iter().collect::<Vec<_>>().join(", "),
        profiles.origin.join(" + ")
    ));
    notes.push(project::flops_note(&convention, full_ratio, seq_len));
    notes.push(pricing_note(option, &run.cost.region, &assumptions));

    Ok(Outcome {
        model: ModelSummary {
            plugin: plugin.info.name.clone(),
            variant: variant.name.clone(),
            family: variant.family.clone(),
            params_total: params.total,
            params_active: params.active,
            seq_len,
            tokens,
            flops_per_token,
            flop_convention: convention.to_string(),
        },
        series,
        clouds: cloud_names,
        measurement,
        comparisons,
        goal,
        sweet_spot_rule: rule.describe(),
        assumptions,
        plugins,
        notes,
    })
}

/// A note for each row whose split Megatron's flags cannot build (E1L3): the layout
/// string it runs from.
fn layout_string_notes(series: &[Series]) -> Vec<String> {
    let mut notes = Vec::new();
    for s in series {
        for r in &s.rows {
            if let Some(p) = &r.projection
                && let Some(text) = &p.pipeline_model_parallel_layout
            {
                notes.push(format!("{}, {} GPUs, {}", s.label(), r.gpus, crate::project::layout_string_note(&p.layout, text)));
            }
        }
    }
    notes
}

/// How one cloud sells a series' GPU in the region asked: the purchase options it prices
/// it under on the profile's node, and whether it sells it on another node only
/// ([`pricing::sold_as`]).
struct Sale {
    cloud: String,
    options: Vec<crate::plugin::cost::PurchaseOption>,
    other_node: bool,
}

/// Why a series has no price, where no cloud here quotes its GPU (every row's every cloud
/// `NotSold`) though some row was projected: the clouds asked (`sales`, in the table's
/// order), and how to price the GPU. Where a cloud sells it under other purchase options
/// than `option`, those (the fix is another --option, not a price file); where only on
/// another node than the profile's, that (a note names the offerings and the --profile
/// that prices them); else a price file or a cost plugin that sells it. `None` where
/// anything was quoted or a quote failed (the failure has its own note), or nothing fits.
fn sold_nowhere(s: &Series, sales: &[Sale], option: crate::plugin::cost::PurchaseOption) -> Option<String> {
    use crate::plugin::cost::{PURCHASE_OPTIONS, option_name};
    let projected = s.rows.iter().any(|r| r.days.is_some());
    let unsold = s.rows.iter().all(|r| r.costs.iter().all(|c| matches!(c, CloudPrice::NotSold)));
    if !projected || !unsold {
        return None;
    }
    let gpu = &s.gpu.name;
    let names: Vec<&str> = sales.iter().map(|c| c.cloud.as_str()).collect();
    let listed = format!("{} asked: {}", names.len(), names.join(", "));
    let asked_option = option_name(option);
    // The option asked is left out: a cloud that prices it but could not quote (a node
    // count its multiples cannot make) is not one to send back to the same option.
    let sellers: Vec<String> = sales
        .iter()
        .filter_map(|c| {
            let others: Vec<&str> = c.options.iter().filter(|&&o| o != option).map(|&o| option_name(o)).collect();
            (!others.is_empty()).then(|| format!("{} sells it {}", c.cloud, others.join(" or ")))
        })
        .collect();
    if !sellers.is_empty() {
        let all: Vec<&str> = PURCHASE_OPTIONS
            .iter()
            .filter(|&&o| o != option && sales.iter().any(|c| c.options.contains(&o)))
            .map(|&o| option_name(o))
            .collect();
        return Some(format!(
            "no cloud here sells {gpu} as {asked_option} ({listed}), but {}; its rows are projected, not priced: try \
             --option {} (or give your own {asked_option} prices with --price-file FILE, docs/EXPLORER.md)",
            sellers.join("; "),
            all.join(" or --option ")
        ));
    }
    let elsewhere: Vec<&str> = sales.iter().filter(|c| c.other_node).map(|c| c.cloud.as_str()).collect();
    if !elsewhere.is_empty() {
        return Some(format!(
            "no cloud here sells {gpu} on its profile's node ({} per node, scale-up domain {}) ({listed}): {} sell{} it on \
             other nodes only, never quoted against this node's projection; its rows are projected, not priced: a note \
             names those offerings and the --profile FILE that projects their node",
            crate::report::plural(s.gpu.gpus_per_node, "GPU"),
            s.gpu.scale_up_domain,
            elsewhere.join(", "),
            if elsewhere.len() == 1 { "s" } else { "" }
        ));
    }
    let asked = if sales.is_empty() {
        format!("no cloud prices {gpu} (none was loaded)")
    } else {
        format!("no cloud here sells {gpu} ({listed})")
    };
    Some(format!(
        "{asked}; its rows are projected, not priced: give your own prices with --price-file FILE (a CSV in SkyPilot's \
         catalog shape with AcceleratorName {gpu}, docs/EXPLORER.md) or a cost plugin that sells it with --cloud FILE.wasm"
    ))
}

/// Which asked GPU count became which row, per GPU type ("12 -> 16, 3 -> 8 GPUs on H100
/// (whole nodes of 8)"): the rows showed 16 and 8 with no word of the 12 and 3 asked.
fn rounding_note(series: &[Series]) -> Option<String> {
    // Per GPU type: its name, its node size, and each (asked, used) pair.
    type Moved = (String, u32, Vec<(u32, u32)>);
    let mut per_gpu: Vec<Moved> = Vec::new();
    for s in series {
        let node = s.gpu.gpus_per_node.max(1);
        let at = match per_gpu.iter().position(|(g, _, _)| *g == s.gpu.name) {
            Some(i) => i,
            None => {
                per_gpu.push((s.gpu.name.clone(), node, Vec::new()));
                per_gpu.len() - 1
            }
        };
        for r in s.rows.iter().filter(|r| r.gpus != r.requested_gpus) {
            let pair = (r.requested_gpus, r.gpus);
            if !per_gpu[at].2.contains(&pair) {
                per_gpu[at].2.push(pair);
            }
        }
    }
    let parts: Vec<String> = per_gpu
        .iter()
        .filter(|(_, _, pairs)| !pairs.is_empty())
        .map(|(gpu, node, pairs)| {
            let moved: Vec<String> = pairs.iter().map(|(a, n)| format!("{a} -> {n}")).collect();
            format!("{} GPUs on {gpu} (whole nodes of {node})", moved.join(", "))
        })
        .collect();
    (!parts.is_empty()).then(|| format!("GPU counts rounded up to whole nodes, as they are billed: {}", parts.join("; ")))
}

/// The GPUs a row of `asked` GPUs uses: whole nodes of `node` GPUs, as they are billed.
fn whole_nodes(asked: u32, node: u32) -> u32 {
    asked.div_ceil(node).saturating_mul(node)
}

/// Days to train on `tokens` tokens at `tokens_per_sec_per_gpu` on each of `gpus` GPUs.
fn days_to_train(tokens: f64, tokens_per_sec_per_gpu: f64, gpus: u32) -> f64 {
    tokens / (tokens_per_sec_per_gpu * f64::from(gpus)) / 86_400.0
}

/// What a run asks of a cloud beside GPU time, under `a`: the storage it keeps for as long
/// as it runs (GB: `checkpoints_kept` checkpoints of every parameter, and the tokenised data
/// set), and the egress of the trained weights once (GB).
fn storage_and_egress_gb(a: &Assumptions, params: &count::ParamCount, tokens: f64) -> (f64, f64) {
    let storage_gb = a.checkpoint_bytes_per_param * params.total as f64 * f64::from(a.checkpoints_kept) / 1e9
        + a.data_bytes_per_token * tokens / 1e9;
    let egress_gb = a.egress_bytes_per_param * params.total as f64 / 1e9;
    (storage_gb, egress_gb)
}

/// GB-months of `storage_gb` kept for `days` (a month: a twelfth of a 365.25-day year).
fn gb_months(storage_gb: f64, days: f64) -> f64 {
    storage_gb * days / (365.25 / 12.0)
}

/// "aws" from "aws.wasm", "/x/y/aws.wasm" or "aws".
fn plugin_stem(spec: &str) -> &str {
    let file = spec.rsplit(['/', '\\']).next().unwrap_or(spec);
    file.strip_suffix(".wasm").unwrap_or(file)
}

/// `run` with each GPU named as its profile is: an alias (`h100-sxm`) or another case
/// (`h100`) names the same GPU as `H100`, so it runs one series, not two, and resumes and
/// compares as the default does.
///
/// # Errors
/// An unknown GPU, or two names of one GPU.
fn by_profile_name(run: &RunFile, profiles: &runner_project::profile::Profiles) -> anyhow::Result<RunFile> {
    let mut out = run.clone();
    out.cluster.gpu.clear();
    for name in &run.cluster.gpu {
        let gpu = profiles.get(name).map_err(anyhow::Error::msg)?;
        if let Some(i) = out.cluster.gpu.iter().position(|n| n == &gpu.name) {
            anyhow::bail!(
                "[cluster] gpu names {} twice: '{}' and '{name}' are the same GPU; list it once",
                gpu.name,
                run.cluster.gpu[i]
            );
        }
        out.cluster.gpu.push(gpu.name.clone());
    }
    Ok(out)
}

/// The run's inputs as they decide its results: the resolved run file and the GPU profiles
/// of the GPUs asked for (a `--profile` file changes results).
fn inputs(run: &RunFile, profiles: &runner_project::profile::Profiles) -> Value {
    let gpus: Vec<Value> = run
        .cluster
        .gpu
        .iter()
        .filter_map(|g| profiles.get(g).ok())
        .map(|p| serde_json::to_value(p).unwrap_or(Value::Null))
        .collect();
    let price_file = run.cost.price_file.as_ref().and_then(|f| std::fs::read(f).ok()).map(|b| plugin::sha256_hex(b.as_slice()));
    serde_json::json!({
        "run": run,
        "profiles": gpus,
        "price_file_sha256": price_file,
    })
}

fn pricing_note(option: crate::plugin::cost::PurchaseOption, region: &str, a: &Assumptions) -> String {
    let region = if region.is_empty() { "each cloud's cheapest region".to_string() } else { format!("region {region}") };
    format!(
        "prices: {} in {region}, whole nodes as each offering sells them; per cloud the cheapest offering, clean \
         prices before ones their source marks lower-bound, resale or suspect (a cell priced from such a row says so \
         in its notes); {}",
        crate::plugin::cost::option_name(option),
        a.describe()
    )
}

/// Where each cloud's prices came from: every distinct price row used, with its plugin.
fn price_provenance(series: &[Series], clouds: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, cloud) in clouds.iter().enumerate() {
        let mut rows = BTreeSet::new();
        let mut plugin = None;
        for s in series {
            for r in &s.rows {
                if let Some(c) = r.costs[i].quote() {
                    plugin.get_or_insert_with(|| format!("{} sha256 {}", c.plugin, c.plugin_sha256));
                    let mut row = format!("{} {}: {}", s.gpu.name, c.row(), c.price_source);
                    if !c.caveats.is_empty() {
                        row = format!("{row} [{}: no clean price for this GPU]", c.caveats.join(", "));
                    }
                    rows.insert(row);
                }
            }
        }
        if let Some(plugin) = plugin {
            out.push(format!("{cloud} prices from {plugin}: {}", rows.into_iter().collect::<Vec<_>>().join("; ")));
        }
    }
    out
}

/// The sweet-spot rule: of the counts no other beats on both days and cost (a count a
/// larger one beats is never worth its money), walking from the cheapest to faster ones,
/// the fastest reached while each step's extra cost per day saved stays under a threshold.
pub struct SweetSpotRule {
    /// USD per day saved; `None`: 1 % of the series' cheapest run.
    pub max_usd_per_day_saved: Option<f64>,
}

impl SweetSpotRule {
    pub const DEFAULT_SHARE: f64 = 0.01;

    pub fn describe(&self) -> String {
        let threshold = match self.max_usd_per_day_saved {
            Some(t) => crate::report::usd(t),
            None => format!("{:.0} % of the series' cheapest run", 100.0 * Self::DEFAULT_SHARE),
        };
        format!(
            "sweet spot: of the GPU counts no other beats on both time and cost (cheapest quote; on spot, days with \
             its interruptions), walking from the cheapest to faster ones, the fastest reached while each step's extra \
             cost per day saved stays under {threshold} per day (--max-usd-per-day-saved)"
        )
    }
}

/// Speedup, relative cost, the cheapest quote and the sweet spot of a series.
fn derive(s: &mut Series, rule: &SweetSpotRule) {
    for r in &mut s.rows {
        r.cheapest = cheapest(&r.costs);
    }
    let first_fit = s.rows.iter().find_map(|r| r.days.map(|d| (d, r.gpus)));
    let first_usd = s.rows.iter().find_map(|r| r.cheapest_cost().map(|c| c.usd));
    for r in &mut s.rows {
        r.speedup = match (first_fit, r.days) {
            (Some((d0, _)), Some(d)) => Some(d0 / d),
            _ => None,
        };
        r.relative_cost = match (first_usd, r.cheapest_cost()) {
            (Some(u0), Some(c)) => Some(c.usd / u0),
            _ => None,
        };
        r.sweet = false;
    }
    // Days as quoted: a spot run is weighed on the days it is billed for.
    let priced: Vec<Priced> = s
        .rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| Some((i, r.quoted_days()?, r.cheapest_cost()?.usd)))
        .collect();
    if priced.is_empty() {
        s.sweet_spot = None;
        s.sweet_spot_why = "no row is priced, so no sweet spot".into();
        return;
    }
    let cheapest_run = priced.iter().map(|p| p.2).fold(f64::INFINITY, f64::min);
    let threshold = rule.max_usd_per_day_saved.unwrap_or(SweetSpotRule::DEFAULT_SHARE * cheapest_run);
    let gpus = |i: usize| s.rows[i].gpus;
    let (frontier, beaten) = frontier(&priced);
    let at = walk(&frontier, threshold);
    let (i0, _, _) = frontier[at];
    let mut why = match frontier.get(at + 1) {
        Some(&(i1, d1, u1)) => {
            let (_, d0, u0) = frontier[at];
            format!(
                "{} GPUs: going to {} saves {} for {} more, {} per day saved, over the {} threshold",
                gpus(i0),
                gpus(i1),
                crate::report::explore::days_said(&crate::report::explore::days_cell(d0 - d1)),
                crate::report::usd(u1 - u0),
                crate::report::usd((u1 - u0) / (d0 - d1)),
                crate::report::usd(threshold)
            )
        }
        None if priced.len() == 1 => format!("{} GPUs: the smallest count priced", gpus(i0)),
        None if frontier.len() == 1 => format!("{} GPUs: no other count priced is faster or cheaper", gpus(i0)),
        None => format!(
            "{} GPUs: every step up to it costs at most {} per day saved; none {} was asked for",
            gpus(i0),
            crate::report::usd(threshold),
            if Some(i0) == priced.last().map(|p| p.0) { "larger" } else { "faster" }
        ),
    };
    if !beaten.is_empty() {
        let skipped: Vec<String> = beaten.iter().map(|&(i, by)| format!("{} (by {})", gpus(i), gpus(by))).collect();
        why.push_str(&format!("; passed over as beaten on both time and cost: {}", skipped.join(", ")));
    }
    let at = i0;
    s.rows[at].sweet = true;
    s.sweet_spot = Some(s.rows[at].gpus);
    s.sweet_spot_why = why;
}

/// A priced row: its index in the series, its days as quoted and its cheapest cost.
type Priced = (usize, f64, f64);

/// The rows (index, days, cost) no other row beats on both: none is as fast and as cheap
/// with one of the two strictly better; of identical rows the first (fewest GPUs) stays.
/// Returned slowest (so cheapest) first, with each beaten row and one row that beats it.
fn frontier(priced: &[Priced]) -> (Vec<Priced>, Vec<(usize, usize)>) {
    let beats = |a: &Priced, b: &Priced| {
        a.1 <= b.1 && a.2 <= b.2 && (a.1 < b.1 || a.2 < b.2 || a.0 < b.0)
    };
    let mut kept = Vec::new();
    let mut beaten = Vec::new();
    for p in priced {
        match priced.iter().find(|q| q.0 != p.0 && beats(q, p)) {
            Some(q) => beaten.push((p.0, q.0)),
            None => kept.push(*p),
        }
    }
    kept.sort_by(|a, b| b.1.total_cmp(&a.1));
    (kept, beaten)
}

/// Along a frontier (slowest first: each step faster and dearer), the index of the last
/// point reached while each step's extra cost per day saved is at most `threshold`.
fn walk(frontier: &[Priced], threshold: f64) -> usize {
    frontier.windows(2).take_while(|w| (w[1].2 - w[0].2) / (w[0].1 - w[1].1) <= threshold).count()
}

/// The cheapest quote among clean prices, else among caveated ones.
fn cheapest(costs: &[CloudPrice]) -> Option<usize> {
    let pick = |clean: bool| {
        costs
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.quote().map(|q| (i, q)))
            .filter(|(_, q)| q.caveats.is_empty() == clean)
            .min_by(|a, b| a.1.usd.total_cmp(&b.1.usd))
            .map(|(i, _)| i)
    };
    pick(true).or_else(|| pick(false))
}

/// Each low-precision series against the BF16 series of the same GPU, count by count.
fn compare(series: &[Series]) -> Vec<Comparison> {
    let mut out = Vec::new();
    for s in series.iter().filter(|s| s.precision != "bf16") {
        let Some(base) = series.iter().find(|b| b.precision == "bf16" && b.gpu.name == s.gpu.name) else {
            continue;
        };
        for (r, b) in s.rows.iter().zip(&base.rows) {
            if let (Some(d), Some(d0)) = (r.days, b.days) {
                out.push(Comparison {
                    gpu: s.gpu.name.clone(),
                    precision: s.precision.clone(),
                    gpus: r.gpus,
                    days_bf16: d0,
                    days: d,
                    speedup: d0 / d,
                    usd_bf16: b.cheapest_cost().map(|c| c.usd),
                    usd: r.cheapest_cost().map(|c| c.usd),
                    coverage: s.low_precision_share,
                });
            }
        }
    }
    out
}

/// Every row that fits, as a choice at each quote a row may be taken at: every cloud's
/// (clean prices only, where any cloud has one, as [`cheapest`] chooses). A spot quote's
/// days depend on its node count (each node is interrupted on its own), so the cheapest
/// quote need not be the fastest: a goal weighs them all. An unpriced row is one choice
/// without a quote.
fn choices(series: &[Series], clouds: &[String]) -> Vec<Choice> {
    let mut out = Vec::new();
    for s in series {
        for r in &s.rows {
            let Some(run_days) = r.days else { continue };
            let layout = r.projection.as_ref().map_or_else(|| "-".into(), |p| p.layout.compact());
            let choice = |cloud: Option<usize>| {
                let c = cloud.and_then(|i| r.costs[i].quote());
                let days = c.map_or(run_days, |c| c.days(run_days));
                Choice {
                    gpu: s.gpu.name.clone(),
                    precision: s.precision.clone(),
                    gpus: r.gpus,
                    layout: layout.clone(),
                    days,
                    days_without_interruptions: (days != run_days).then_some(run_days),
                    usd: c.map(|c| c.usd),
                    cloud: cloud.map(|i| clouds[i].clone()),
                    price_row: c.map(pricing::CloudCost::row),
                    storage_not_costed: c.is_some_and(|c| c.storage_not_costed),
                }
            };
            let clean = r.costs.iter().any(|c| c.quote().is_some_and(|q| q.caveats.is_empty()));
            let quoted: Vec<usize> = (0..r.costs.len())
                .filter(|&i| r.costs[i].quote().is_some_and(|q| q.caveats.is_empty() == clean))
                .collect();
            if quoted.is_empty() {
                out.push(choice(None));
            }
            out.extend(quoted.into_iter().map(|i| choice(Some(i))));
        }
    }
    out
}

/// The answer to a goal, its runners-up, or the nearest feasible alternative.
fn answer(goal: Goal, series: &[Series], clouds: &[String], counts: &[u32]) -> GoalAnswer {
    let all = choices(series, clouds);
    let priced: Vec<&Choice> = all.iter().filter(|c| c.usd.is_some()).collect();
    let usd = |c: &Choice| c.usd.unwrap_or(f64::INFINITY);
    let (mut meeting, nearest): (Vec<&Choice>, Option<&Choice>) = match goal {
        Goal::TargetDays(d) => {
            let mut m: Vec<&Choice> = priced.iter().copied().filter(|c| c.days <= d).collect();
            m.sort_by(|a, b| usd(a).total_cmp(&usd(b)).then(a.days.total_cmp(&b.days)));
            let fastest = priced.iter().copied().min_by(|a, b| a.days.total_cmp(&b.days).then(usd(a).total_cmp(&usd(b))));
            (m, fastest)
        }
        Goal::Budget(b) => {
            let mut m: Vec<&Choice> = priced.iter().copied().filter(|c| usd(c) <= b).collect();
            m.sort_by(|a, b| a.days.total_cmp(&b.days).then(usd(a).total_cmp(&usd(b))));
            let cheapest = priced.iter().copied().min_by(|a, b| usd(a).total_cmp(&usd(b)).then(a.days.total_cmp(&b.days)));
            (m, cheapest)
        }
    };
    let mut seen = BTreeSet::new();
    meeting.retain(|c| seen.insert((c.gpu.clone(), c.precision.clone(), c.gpus)));
    let largest = counts.iter().max().copied().unwrap_or(0);
    match (meeting.first(), goal) {
        (Some(best), _) => GoalAnswer {
            goal,
            met: true,
            best: Some((*best).clone()),
            runners_up: meeting.iter().skip(1).take(4).map(|c| (*c).clone()).collect(),
            why: match goal {
                Goal::TargetDays(d) => {
                    format!("the cheapest run that finishes within {}", crate::report::explore::days_said(&d.to_string()))
                }
                Goal::Budget(b) => format!("the fastest run that costs at most {}", crate::report::usd(b)),
            },
        },
        (None, Goal::TargetDays(d)) => GoalAnswer {
            goal,
            met: false,
            best: nearest.cloned(),
            runners_up: Vec::new(),
            why: match nearest {
                Some(n) => format!(
                    "no priced run finishes within {}; the fastest takes {}. The largest count asked was {largest}: \
                     try more GPUs (--gpus), a faster GPU or precision, or a later date",
                    crate::report::explore::days_said(&d.to_string()),
                    crate::report::explore::days_said(&crate::report::explore::days_cell(n.days))
                ),
                None => "no row fits and is priced, so the target cannot be answered".into(),
            },
        },
        (None, Goal::Budget(b)) => GoalAnswer {
            goal,
            met: false,
            best: nearest.cloned(),
            runners_up: Vec::new(),
            why: match nearest {
                Some(n) => format!(
                    "no priced run costs {} or less; the cheapest costs {}",
                    crate::report::usd(b),
                    crate::report::usd(usd(n))
                ),
                None => "no row fits and is priced, so the budget cannot be answered".into(),
            },
        },
    }
}

/// The clouds a run prices with: those `cost` names (a name that cannot be used stops the
/// run) or every installed one (one that cannot be used is skipped with a note), and the
/// user's price file; a region no cloud sells in (or a near miss of a named one) refused.
/// Each cloud's plugin is recorded in `plugins` and `notes`.
///
/// # Errors
/// A cloud named twice or unusable, the price-file reader named as a cloud, a price file
/// that cannot be used, or a region no cloud sells in.
pub fn load_clouds(
    cost: &crate::runfile::CostSection,
    profiles: &runner_project::profile::Profiles,
    limits: crate::plugin::Limits,
    progress: Progress<'_>,
    plugins: &mut Vec<PluginInfo>,
    notes: &mut Vec<String>,
) -> anyhow::Result<Vec<pricing::Cloud>> {
    let mut clouds: Vec<pricing::Cloud> = Vec::new();
    let cost_specs: Vec<String> = if cost.plugins.is_empty() {
        // A file that fails to load may be a cloud (its kind is in the bytes that could
        // not be read): skipped with a note, as an installed cloud that fails later is.
        let installed = project::installed(Kind::Cost);
        notes.extend(installed.broken.iter().map(|b| format!("skipped a cloud: {}", b.text())));
        installed.specs.into_iter().filter(|s| plugin_stem(s) != PRICE_FILE_PLUGIN).collect()
    } else {
        cost.plugins.clone()
    };
    let mut stems = BTreeSet::new();
    for spec in &cost_specs {
        let stem = plugin_stem(spec);
        if stem == PRICE_FILE_PLUGIN || stem == "price-file" {
            // Given beside the file, the file is priced already: only the listing is wrong.
            if cost.price_file.is_some() {
                anyhow::bail!(
                    "{PRICE_FILE_PLUGIN} is not a cloud to list (--cloud or [cost] plugins): the price file given prices \
                     itself beside the clouds listed; leave {PRICE_FILE_PLUGIN} out of the list"
                );
            }
            anyhow::bail!(
                "{PRICE_FILE_PLUGIN} is the reader of a price file, with no prices of its own: pass the file with \
                 --price-file FILE (or [cost] price_file = \"FILE\" in a run file)"
            );
        }
        if !stems.insert(stem) {
            anyhow::bail!("the cloud {stem} is named twice (--cloud or [cost] plugins): name each cloud once");
        }
    }
    for spec in &cost_specs {
        progress(&format!("loading prices from {spec}"), 0, 0);
        match pricing::load(spec, None, limits) {
            // Two files under one provider name would show as two columns of one cloud (a
            // plugin passing itself off as another): the file named after the provider keeps
            // it (a user's aws.wasm shadows the embedded one), else the first loaded.
            Ok(cloud) if let Some(at) = clouds.iter().position(|c| c.name == cloud.name) => {
                let owns = |c: &pricing::Cloud| plugin_stem(&c.info.name) == c.name;
                let (kept, dropped) = if owns(&cloud) && !owns(&clouds[at]) {
                    let dropped = std::mem::replace(&mut clouds[at], cloud);
                    (&clouds[at], dropped)
                } else {
                    (&clouds[at], cloud)
                };
                let why = format!(
                    "the cost plugins {} and {} both call themselves '{}': {} prices it, and {} is left out \
                     (a cloud is priced by one plugin: to replace a cloud's prices, give your file its plugin's name)",
                    kept.info.name,
                    dropped.info.name,
                    crate::report::visible(&kept.name),
                    kept.info.name,
                    dropped.info.name
                );
                if cost.plugins.is_empty() {
                    notes.push(format!("skipped a cloud: {why}"));
                } else {
                    anyhow::bail!("{why}");
                }
            }
            Ok(cloud) => {
                // An offering on a GPU with no profile is never quoted: a cloud that sells
                // only such GPUs would vanish from the table without a word.
                let known: Vec<&str> = profiles.gpus.iter().map(|g| g.name.as_str()).collect();
                notes.extend(never_priced(&cloud.name, &cloud.info.name, &cloud.unknown_gpus(&profiles.gpus), cloud.offering_count(), &known));
                notes.extend(other_node_notes(&cloud.name, cloud.offerings(), &profiles.gpus));
                record_plugin(plugins, notes, &cloud.info);
                clouds.push(cloud);
            }
            // The price file's own name (its column's, `our-contract` or `our-contract.csv`)
            // where no plugin has it: the file is priced whatever --cloud lists, so its name
            // alone lists it alone.
            Err(_) if cost.price_file.as_deref().is_some_and(|f| names_price_file(spec, f)) => {}
            // A cloud asked for by name that cannot be used stops the run (a typo must not
            // leave a table without prices); one of the installed set is skipped.
            Err(e) if !cost.plugins.is_empty() => anyhow::bail!("the cloud {spec} cannot be used: {e}"),
            Err(e) => notes.push(format!("skipped a cloud: {e}")),
        }
    }
    if let Some(file) = &cost.price_file {
        let path = std::path::Path::new(file);
        let bytes = crate::input::read_bytes(path, "price file", crate::input::PRICE_LIMIT).map_err(anyhow::Error::msg)?;
        let mut cloud = pricing::load(&format!("{PRICE_FILE_PLUGIN}.wasm"), Some(bytes), limits).map_err(|e| match price_file_problems(&e) {
            Some(lines) => anyhow::anyhow!("the price file {file} cannot be used:\n  {}", lines.join("\n  ")),
            None => anyhow::anyhow!("the price file {file} cannot be used: {e}"),
        })?;
        let taken: Vec<&str> = clouds.iter().map(|c| c.name.as_str()).collect();
        cloud.name = price_file_cloud_name(path, &taken);
        notes.push(format!("prices of '{}' read from {file} by the {} plugin", cloud.name, cloud.info.name));
        // Its rows are the user's own: one that can never be priced is said, not dropped.
        let unknown = cloud.unknown_gpus(&profiles.gpus);
        if !unknown.is_empty() {
            let known: Vec<&str> = profiles.gpus.iter().map(|g| g.name.as_str()).collect();
            let rows: Vec<String> = unknown.iter().map(|(i, g)| format!("{i} ({g})")).collect();
            notes.push(format!(
                "price file {file}: {} match no GPU type and are never priced (AcceleratorName must be one of {}, or an alias)",
                first_eight(&rows),
                known.join(", ")
            ));
        }
        notes.extend(other_node_notes(&cloud.name, cloud.offerings(), &profiles.gpus));
        // A row with no price for the option asked is never quoted: said, as a row of an
        // unknown GPU is (the row has prices, only under other options).
        if let Some(option) = crate::plugin::cost::parse_option(&cost.option) {
            notes.extend(unpriced_option_note(file, cloud.offerings(), &profiles.gpus, option));
        }
        record_plugin(plugins, notes, &cloud.info);
        clouds.push(cloud);
    }
    // A region no cloud sells in prices nothing: a typo, refused with the regions there are.
    let region = cost.region.as_str();
    if !region.is_empty() && !clouds.is_empty() {
        let (selling, not): (Vec<&pricing::Cloud>, Vec<&pricing::Cloud>) = clouds.iter().partition(|c| c.sells_in(region));
        let named: std::collections::BTreeSet<&str> =
            clouds.iter().flat_map(|c| c.regions()).filter(|&r| r != pricing::ANY_REGION).collect();
        let unnamed = !named.iter().any(|n| n.eq_ignore_ascii_case(region));
        // A region no cloud names but close to one that is, is a typo even where the
        // every-region prices would answer it: pricing only those, silently, would
        // surprise more than a refusal. A name far from all is taken as meant.
        if let Some(near) = unnamed.then(|| near_regions(region, &named)).flatten() {
            anyhow::bail!(
                "no cloud names region '{}'; did you mean {}? (a region no cloud names is priced only by every-region \
                 prices, and only when no named region is this close to it)",
                crate::report::visible(region),
                match near.split_last() {
                    Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
                    _ => near.join(""),
                }
            );
        }
        if selling.is_empty() {
            let listed: Vec<String> = clouds
                .iter()
                .map(|c| {
                    let r: Vec<&str> = c.regions().into_iter().map(|r| if r == pricing::ANY_REGION { "* (every region)" } else { r }).collect();
                    let more = if r.len() > 8 { format!(", ... ({} in all)", r.len()) } else { String::new() };
                    format!("{}: {}{more}", c.name, r[..r.len().min(8)].join(", "))
                })
                .collect();
            anyhow::bail!("no cloud sells in region '{}'; the regions are:\n  {}", crate::report::visible(region), listed.join("\n  "));
        }
        // A region only the every-region prices answer may be a typo: say which named ones exist.
        if !named.is_empty() && unnamed {
            let shown: Vec<&str> = named.iter().take(8).copied().collect();
            let more = if named.len() > 8 { format!(", ... ({} in all)", named.len()) } else { String::new() };
            notes.push(format!(
                "region {}: no cloud names it, so only the every-region prices of {} apply; the named regions are {}{more}",
                crate::report::visible(region),
                selling.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", "),
                shown.join(", ")
            ));
        }
        if !not.is_empty() {
            notes.push(format!(
                "region {}: {} sell{} nothing there",
                crate::report::visible(region),
                not.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", "),
                if not.len() == 1 { "s" } else { "" }
            ));
        }
    }
    Ok(clouds)
}

/// Whether every quote of a row recalled from a journal is of an offering the cloud in
/// its place sells on `gpu`'s profile's node ([`pricing::same_node`]): a row an older
/// runner kept may hold a quote on another node, made before that rule, and is then
/// computed again rather than shown beside this runner's.
fn quoted_on_profile_node(row: &Row, clouds: &[pricing::Cloud], gpu: &GpuProfile) -> bool {
    row.costs.iter().zip(clouds).all(|(cost, cloud)| {
        cost.quote().is_none_or(|q| {
            q.cloud == cloud.name
                && cloud.offerings().iter().any(|o| o.instance == q.instance && pricing::matches_gpu(o, gpu) && pricing::same_node(o, gpu))
        })
    })
}

/// Clouds in the tables' order ([`pricing::rank_clouds`]: clean prices first, each
/// cheapest first), each by its quote of the first row it prices (the smallest count of
/// the first series: the row relative cost starts from); clouds that price nothing last.
fn cloud_order(series: &[Series], clouds: usize) -> Vec<usize> {
    pricing::rank_clouds(0..clouds, |i| series.iter().flat_map(|s| &s.rows).find_map(|r| r.costs[i].quote()))
}

/// The named regions within a typo of `region` (edit distance at most 2, case ignored),
/// nearest first; `None` when none is.
fn near_regions<'a>(region: &str, named: &std::collections::BTreeSet<&'a str>) -> Option<Vec<&'a str>> {
    let best = named.iter().map(|n| crate::input::edit_distance(region, n)).min().filter(|&d| d <= 2)?;
    Some(named.iter().copied().filter(|n| crate::input::edit_distance(region, n) == best).collect())
}

/// Notes for a cloud's offerings on another node than their GPU's profile, one per GPU:
/// never quoted (a projection's step time is the profile's node's, [`pricing::same_node`]).
/// Each names the instances and their nodes, the profile's node, and the fix
/// ([`other_node_fix`]), so that the projection is of the machine billed.
fn other_node_notes(cloud: &str, offerings: &[Offering], gpus: &[GpuProfile]) -> Vec<String> {
    let others = pricing::other_nodes(offerings, gpus);
    if others.is_empty() {
        return Vec::new();
    }
    let shipped = runner_project::profile::Profiles::builtin();
    // The offerings by GPU, in the order the cloud lists them.
    let mut by_gpu: Vec<(&GpuProfile, Vec<&Offering>)> = Vec::new();
    for (o, g) in others {
        match by_gpu.iter_mut().find(|(h, _)| h.name == g.name) {
            Some((_, these)) => these.push(o),
            None => by_gpu.push((g, vec![o])),
        }
    }
    by_gpu
        .into_iter()
        .map(|(gpu, these)| {
            let shown: Vec<String> = these.iter().map(|o| format!("{} ({})", o.instance, node(o.gpus_per_node, o.scale_up_domain))).collect();
            let one = these.len() == 1;
            format!(
                "{cloud}: {} sell{} {} on another node than its profile's ({}): explore and run never quote {} against \
                 a projection of the profile's node; to price {}, {}",
                first_eight(&shown),
                if one { "s" } else { "" },
                gpu.name,
                node(gpu.gpus_per_node, gpu.scale_up_domain),
                if one { "it" } else { "them" },
                if one { "it" } else { "one" },
                other_node_fix(these[0], gpu, &shipped.gpus)
            )
        })
        .collect()
}

/// A node in words: "8 GPUs per node, scale-up domain 8".
fn node(per: u32, domain: u32) -> String {
    format!("{} per node, scale-up domain {domain}", crate::report::plural(per, "GPU"))
}

/// How to price `o`, an offering of `gpu` on another node than `gpu`'s profile: where
/// the shipped profile of that GPU (in `shipped`) has the offering's node (a --profile
/// changed it), leave --profile out; otherwise project that node with a --profile.
fn other_node_fix(o: &Offering, gpu: &GpuProfile, shipped: &[GpuProfile]) -> String {
    let (per, domain) = (o.gpus_per_node, o.scale_up_domain);
    let name = &gpu.name;
    if shipped.iter().any(|g| g.name == *name && pricing::same_node(o, g)) {
        format!(
            "leave --profile out: the built-in {name} profile has that node (or set gpus_per_node = {per}, \
             scale_up_domain = {domain} for {name} in your profile file)"
        )
    } else {
        format!(
            "project that node with --profile FILE holding [[gpu]] name = \"{name}\", gpus_per_node = {per}, \
             scale_up_domain = {domain} (docs/EXPLORER.md)"
        )
    }
}

/// A note per offering of `offerings` on another node than its GPU's profile in `gpus`
/// ([`pricing::other_nodes`]): `runner plugins inspect` says which of a cost plugin's
/// offerings explore and prices never quote, and how to price each.
pub fn other_node_offering_notes(offerings: &[Offering], gpus: &[GpuProfile]) -> Vec<String> {
    let others = pricing::other_nodes(offerings, gpus);
    if others.is_empty() {
        return Vec::new();
    }
    let shipped = runner_project::profile::Profiles::builtin();
    others
        .into_iter()
        .map(|(o, gpu)| {
            format!(
                "{}: {} on another node ({}) than its profile's ({}): explore and prices never quote it; to price it, {}",
                o.instance,
                gpu.name,
                node(o.gpus_per_node, o.scale_up_domain),
                node(gpu.gpus_per_node, gpu.scale_up_domain),
                other_node_fix(o, gpu, &shipped.gpus)
            )
        })
        .collect()
}

/// A note for a price file's rows (of known GPUs in `offerings`) with no price under
/// `option`: never quoted under it, each named with the options it does price and those
/// options offered instead, so that a spot-only row does not vanish from an on-demand
/// run without a word. One sentence: "price file F: x (on-demand, reserved-1y) has no
/// spot price, so --option spot never quotes it; try --option on-demand or reserved-1y".
fn unpriced_option_note(file: &str, offerings: &[Offering], gpus: &[GpuProfile], option: crate::plugin::cost::PurchaseOption) -> Option<String> {
    use crate::plugin::cost::{PURCHASE_OPTIONS, option_name};
    let unpriced: Vec<&Offering> = offerings
        .iter()
        .filter(|o| gpus.iter().any(|g| pricing::matches_gpu(o, g)) && !o.prices.iter().any(|p| p.option == option))
        .collect();
    if unpriced.is_empty() {
        return None;
    }
    let priced = |o: &Offering, x| o.prices.iter().any(|p| p.option == x);
    let rows: Vec<String> = unpriced
        .iter()
        .map(|o| {
            let has: Vec<&str> = PURCHASE_OPTIONS.iter().filter(|&&x| priced(o, x)).map(|&x| option_name(x)).collect();
            format!("{} ({})", o.instance, has.join(", "))
        })
        .collect();
    let instead: Vec<&str> =
        PURCHASE_OPTIONS.iter().filter(|&&x| unpriced.iter().any(|o| priced(o, x))).map(|&x| option_name(x)).collect();
    let asked = option_name(option);
    let one = rows.len() == 1;
    let try_instead = match instead.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("; try --option {} or {last}", rest.join(", ")),
        Some((last, _)) => format!("; try --option {last}"),
        None => String::new(),
    };
    Some(format!(
        "price file {file}: {} {} no {asked} price, so --option {asked} never quotes {}{try_instead}",
        first_eight(&rows),
        if one { "has" } else { "have" },
        if one { "it" } else { "them" },
    ))
}

/// A note for a cloud (`name`, from `plugin`) whose every one of its `offered` instances is
/// on a GPU no profile describes (`unknown`: instance and GPU; `known`: the profiles), so
/// that it is never priced; none while one instance can be.
fn never_priced(name: &str, plugin: &str, unknown: &[(&str, &str)], offered: usize, known: &[&str]) -> Option<String> {
    if unknown.is_empty() || unknown.len() < offered {
        return None;
    }
    let gpus: BTreeSet<&str> = unknown.iter().map(|&(_, g)| g).collect();
    Some(format!(
        "{name} ({plugin}) sells only GPUs no profile describes ({}): never priced (an offering's gpu must be one of {}, or an alias)",
        gpus.into_iter().take(8).collect::<Vec<_>>().join(", "),
        known.join(", ")
    ))
}

/// Why no layout fits: the family that came closest.
fn nothing_fits(families: &[search::Family]) -> String {
    use search::Verdict;
    // The family needing the least (GPU memory, or host memory for what it offloads).
    let least = |host: bool| {
        families
            .iter()
            .filter_map(|f| match &f.verdict {
                Verdict::Memory { layout, need_gib, have_gib } if !host => Some((need_gib, have_gib, layout, &f.name)),
                Verdict::HostMemory { layout, need_gib, have_gib } if host => Some((need_gib, have_gib, layout, &f.name)),
                _ => None,
            })
            .min_by(|a, b| a.0.total_cmp(b.0))
    };
    let closest = least(false);
    // A family that fits the GPU by offloading came closer than any that does not.
    let host = least(true);
    if let Some((need, have, layout, fam)) = host {
        return format!(
            "nothing fits: the GPU holds a layout only by offloading activations, and the least host memory that takes is {need:.0} GiB per GPU ({fam}: {layout}) of {have:.0} GiB"
        );
    }
    match closest {
        Some((need, have, layout, fam)) => format!(
            "nothing fits: the least memory any layout needs is {need:.0} GiB per GPU ({fam}: {layout}) of {have:.0} GiB"
        ),
        None => {
            // Say what stood in the way: the reason most families give, the first on a tie.
            // One no GPU count changes (--ep on a dense model) is every family's that gets
            // that far, and was hidden behind the first family's count-bound one ("tp·cp =
            // 16 does not divide 8 GPUs").
            let reasons: Vec<(&str, &str)> = families
                .iter()
                .filter_map(|f| match &f.verdict {
                    Verdict::Divisibility { reason, .. } => Some((f.name.as_str(), reason.as_str())),
                    _ => None,
                })
                .collect();
            let given = |r: &str| reasons.iter().filter(|(_, q)| *q == r).count();
            let reason = reasons
                .iter()
                .enumerate()
                .max_by_key(|&(i, &(_, r))| (given(r), std::cmp::Reverse(i)))
                .map(|(_, (name, r))| format!(" ({name}: {r})"));
            format!("{NO_LAYOUT_DIVIDES} the model and the batch at this GPU count{}", reason.unwrap_or_default())
        }
    }
}

/// Why a fixed layout is refused at a count, as `project` words it: the search's closest
/// families, less those refused because a tp·cp the search chose itself does not divide
/// the count ([`search::Refusal::StageCount`]) where the user left tp and cp free: no
/// reason they can act on (`--ep 8` on a dense model hid "no routed experts" behind it).
/// All of them where nothing else remains.
fn fixed_layout_refusal(families: &[search::Family], tp_cp_free: bool) -> String {
    let stage = |f: &&search::Family| matches!(f.verdict, search::Verdict::Divisibility { kind: search::Refusal::StageCount, .. });
    let kept: Vec<search::Family> = families.iter().filter(|f| !(tp_cp_free && stage(f))).cloned().collect();
    project::closest_families(if kept.is_empty() { families } else { &kept })
}

/// Parameters of the main model: a graph asked for with all its layers carries no
/// multi-token-prediction modules, which published parameter counts leave out (DeepSeek-V3's
/// 671B). FLOPs still come from the full training graph, MTP included.
pub fn main_model_params(
    workload: &mut plugin::workload::Workload,
    variant: &Variant,
) -> anyhow::Result<count::ParamCount> {
    let g = workload.graph(&GraphRequest::training(&variant.name, 1, 1, variant.hyper.layers))?;
    Ok(count::params(&g))
}

/// A note's list: its first eight items, and how many more there are.
fn first_eight(items: &[String]) -> String {
    const SHOWN: usize = 8;
    let more = if items.len() > SHOWN { format!(" and {} more", items.len() - SHOWN) } else { String::new() };
    format!("{}{more}", items[..items.len().min(SHOWN)].join(", "))
}

/// Whether `spec` (a `--cloud` name) is the price file `file`'s name, with its extension
/// or without, as [`price_file_cloud_name`] shows it.
fn names_price_file(spec: &str, file: &str) -> bool {
    let path = std::path::Path::new(file);
    [path.file_stem(), path.file_name()].into_iter().flatten().any(|n| n.to_str() == Some(spec))
}

/// The cloud name a price file is priced under: its file stem ("our-contract"), or, where a
/// cloud already has that name, its file name ("aws.csv"): short enough for a table's
/// column header, which cut "aws (price file)" to "aws (price f". Control characters in a
/// file name must not reach a terminal.
fn price_file_cloud_name(path: &std::path::Path, taken: &[&str]) -> String {
    let clean = |s: &std::ffi::OsStr| -> String { s.to_string_lossy().chars().map(|c| if c.is_control() { '?' } else { c }).collect() };
    let stem = path.file_stem().map_or_else(|| "price-file".to_string(), clean);
    let candidates = [stem.clone(), path.file_name().map_or_else(String::new, clean), format!("{stem}-price-file")];
    let free = |n: &&String| !n.is_empty() && !taken.contains(&n.as_str());
    candidates.iter().find(free).cloned().unwrap_or_else(|| format!("{stem}-price-file-{}", taken.len()))
}

/// The bad lines of a price file, from the price-file plugin's stop: `offerings` cannot
/// return an error, so the plugin panics with every problem named by its line, and the
/// host shows those lines, not the trap around them (a typo in a price is the user's to
/// fix, not the plugin's).
fn price_file_problems(err: &plugin::PluginError) -> Option<Vec<String>> {
    let plugin::Failure::Trap { stderr, .. } = &err.failure else { return None };
    // The plugin's stderr arrives escaped: its line breaks are the two characters `\n`,
    // and the panic's message is the line after "panicked at FILE:LINE:COL:".
    let panic = &stderr[stderr.find("panicked at ")?..];
    let message = &panic[panic.find("\\n")? + 2..];
    let message = &message[..message.find("\\n").unwrap_or(message.len())];
    let message = message.strip_prefix("price file: ").unwrap_or(message);
    Some(message.split("; ").map(str::to_string).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The note names which asked count became which row (`--gpus 12,3` showed rows 16
    /// and 8 without a word of 12 and 3), once per pair, and nothing when none moved.
    /// Kills: the pairs left out, a count that did not move listed.
    #[test]
    fn the_rounding_note_says_which_count_became_which() {
        use crate::report::explore::tests::{outcome, row};
        let moved = |asked: u32, gpus: u32| Row { requested_gpus: asked, ..row(gpus, Some(1.0), Vec::new()) };
        let mut o = outcome("bf16", vec![moved(3, 8), moved(12, 16), row(32, Some(1.0), Vec::new())], &[]);
        assert_eq!(rounding_note(&o.series[..0]), None);
        let fp8 = Series { precision: "fp8".into(), ..o.series[0].clone() };
        o.series.push(fp8);
        assert_eq!(
            rounding_note(&o.series).as_deref(),
            Some("GPU counts rounded up to whole nodes, as they are billed: 3 -> 8, 12 -> 16 GPUs on H100 (whole nodes of 8)")
        );
        o.series.iter_mut().for_each(|s| s.rows.retain(|r| r.gpus == r.requested_gpus));
        assert_eq!(rounding_note(&o.series), None);
    }

    /// Two names of one GPU type are one type named twice, as two spellings of one name
    /// are (the series ran twice); the profile's name says which.
    #[test]
    fn two_aliases_of_one_gpu_are_refused_as_a_name_given_twice() {
        let mut r = RunFile::default();
        r.model.plugin = "llama3.wasm".into();
        r.cluster.gpu = vec!["b200".into(), "h100".into(), "H100-SXM".into()];
        let e = run(&r, &|_, _, _| {}).unwrap_err().to_string();
        assert_eq!(e, "[cluster] gpu names H100 twice: 'h100' and 'H100-SXM' are the same GPU; list it once");
    }

    /// The price-file reader listed as a cloud is refused, and the fix depends on whether a
    /// price file was given: with one, leave the reader out (it told the user to pass the
    /// file they had passed); without, pass the file.
    #[test]
    fn the_price_file_reader_listed_as_a_cloud_says_what_to_do() {
        let mut r = RunFile::default();
        r.model.plugin = "llama3.wasm".into();
        r.model.variant = Some("llama3-tiny".into());
        r.cost.plugins = vec!["price_file".into()];
        let e = run(&r, &|_, _, _| {}).unwrap_err().to_string();
        assert!(e.contains("pass the file with --price-file FILE"), "{e}");
        r.cost.price_file = Some("ours.csv".into());
        let e = run(&r, &|_, _, _| {}).unwrap_err().to_string();
        assert!(e.ends_with("leave price_file out of the list"), "{e}");
    }

    /// A GPU count nothing fits says why: the closest family's memory, or else the rule
    /// that stood in the way.
    #[test]
    fn a_cloud_is_said_never_priced_only_when_no_instance_can_be() {
        let known = ["H100", "B200"];
        assert_eq!(never_priced("acme", "acme.wasm", &[], 3, &known), None);
        assert_eq!(never_priced("acme", "acme.wasm", &[("x1", "H1000")], 2, &known), None);
        let note = never_priced("acme", "acme.wasm", &[("x1", "H1000"), ("x2", "H1000"), ("x3", "MI300X")], 3, &known).unwrap();
        assert_eq!(
            note,
            "acme (acme.wasm) sells only GPUs no profile describes (H1000, MI300X): never priced (an offering's gpu must be one of H100, B200, or an alias)"
        );
    }

    /// An offering on another node than its GPU's profile is noted, by cloud and GPU for
    /// explore and one by one for `plugins inspect`, with the fix: a --profile of its
    /// node, or, where a --profile moved the GPU off the shipped profile's node and the
    /// offering is on that node, leaving --profile out.
    #[test]
    fn other_node_offerings_are_noted_with_the_fix() {
        use crate::plugin::cost::{Offering, PurchaseOption::OnDemand};
        use crate::pricing::tests::{offering, price};
        let shipped = runner_project::profile::Profiles::builtin();
        let h100 = shipped.get("H100").unwrap().clone();
        let full = offering("p5.48xlarge", "H100", price("r", OnDemand, 20.0, &[]));
        let one = Offering { gpus_per_node: 1, scale_up_domain: 1, ..offering("one", "h100", price("r", OnDemand, 2.0, &[])) };
        let both = [full.clone(), one.clone()];
        let pcie = "project that node with --profile FILE holding [[gpu]] name = \"H100\", gpus_per_node = 1, scale_up_domain = 1 (docs/EXPLORER.md)";
        assert_eq!(
            other_node_offering_notes(&both, std::slice::from_ref(&h100)),
            [format!(
                "one: H100 on another node (1 GPU per node, scale-up domain 1) than its profile's (8 GPUs per node, scale-up \
                 domain 8): explore and prices never quote it; to price it, {pcie}"
            )]
        );
        assert_eq!(
            other_node_notes("acme", &both, std::slice::from_ref(&h100)),
            [format!(
                "acme: one (1 GPU per node, scale-up domain 1) sells H100 on another node than its profile's (8 GPUs per \
                 node, scale-up domain 8): explore and run never quote it against a projection of the profile's node; to \
                 price it, {pcie}"
            )]
        );
        // A --profile of 4-GPU H100 nodes: the shipped 8/8 offering is the built-in
        // profile's node, so leaving --profile out prices it.
        let quad = GpuProfile { gpus_per_node: 4, scale_up_domain: 4, ..h100.clone() };
        let out = "leave --profile out: the built-in H100 profile has that node (or set gpus_per_node = 8, scale_up_domain = 8 \
                   for H100 in your profile file)";
        assert_eq!(
            other_node_offering_notes(&both, std::slice::from_ref(&quad)),
            [
                format!(
                    "p5.48xlarge: H100 on another node (8 GPUs per node, scale-up domain 8) than its profile's (4 GPUs per \
                     node, scale-up domain 4): explore and prices never quote it; to price it, {out}"
                ),
                format!(
                    "one: H100 on another node (1 GPU per node, scale-up domain 1) than its profile's (4 GPUs per node, \
                     scale-up domain 4): explore and prices never quote it; to price it, {pcie}"
                ),
            ]
        );
        let notes = other_node_notes("aws", &[full], std::slice::from_ref(&quad));
        assert_eq!(notes.len(), 1);
        assert!(notes[0].ends_with(&format!("to price it, {out}")), "{notes:?}");
        assert!(other_node_offering_notes(&[one], &[]).is_empty(), "a GPU no profile describes is another note's");
    }

    /// A price file's rows without the option asked: one plain sentence per file, each row
    /// with the options it prices and those options to try.
    #[test]
    fn rows_without_the_option_asked_are_one_sentence() {
        use crate::plugin::cost::PurchaseOption::{OnDemand, OneYearNoUpfront, Spot};
        use crate::pricing::tests::{offering, price};
        let gpus = [runner_project::profile::Profiles::builtin().get("H100").unwrap().clone()];
        let mut two = offering("x", "H100", price("r", OnDemand, 20.0, &[]));
        two.prices.push(price("r", OneYearNoUpfront, 12.0, &[]));
        let spot = offering("s", "H100", price("r", Spot, 5.0, &[]));
        let unknown = offering("u", "H1000", price("r", OnDemand, 5.0, &[]));
        assert_eq!(
            unpriced_option_note("f.csv", &[two.clone(), spot.clone(), unknown.clone()], &gpus, Spot).as_deref(),
            Some("price file f.csv: x (on-demand, 1y-no-upfront) has no spot price, so --option spot never quotes it; try --option on-demand or 1y-no-upfront")
        );
        assert_eq!(
            unpriced_option_note("f.csv", &[two, spot, unknown], &gpus, OneYearNoUpfront).as_deref(),
            Some("price file f.csv: s (spot) has no 1y-no-upfront price, so --option 1y-no-upfront never quotes it; try --option spot")
        );
        let spot2 = offering("t", "H100", price("r", Spot, 6.0, &[]));
        let other = offering("o", "H100", price("r", OneYearNoUpfront, 6.0, &[]));
        assert_eq!(
            unpriced_option_note("f.csv", &[offering("s", "H100", price("r", Spot, 5.0, &[])), spot2, other], &gpus, OnDemand).as_deref(),
            Some("price file f.csv: s (spot), t (spot), o (1y-no-upfront) have no on-demand price, so --option on-demand never quotes them; try --option spot or 1y-no-upfront")
        );
        assert_eq!(unpriced_option_note("f.csv", &[offering("s", "H100", price("r", Spot, 5.0, &[]))], &gpus, Spot), None);
    }

    /// GPUs are named as their profiles are, whatever case or alias the run used; two
    /// names of one GPU are refused, naming both (they ran the same series twice).
    #[test]
    fn gpus_go_by_their_profile_name_and_one_named_twice_is_refused() {
        let profiles = runner_project::profile::Profiles::builtin();
        let mut run = RunFile::default();
        run.cluster.gpu = vec!["h100".into(), "B200".into(), "nvidia-h200-141gb".into()];
        assert_eq!(by_profile_name(&run, &profiles).unwrap().cluster.gpu, ["H100", "B200", "H200"]);
        run.cluster.gpu = vec!["h100".into(), "b200".into(), "H100-SXM".into()];
        let e = by_profile_name(&run, &profiles).unwrap_err().to_string();
        assert_eq!(e, "[cluster] gpu names H100 twice: 'h100' and 'H100-SXM' are the same GPU; list it once");
        run.cluster.gpu = vec!["h1000".into()];
        assert!(by_profile_name(&run, &profiles).unwrap_err().to_string().starts_with("unknown GPU 'h1000'"));
    }

    #[test]
    fn nothing_fits_names_the_reason() {
        use search::{Family, Verdict};
        let divides =
            |name: &str, reason: &str| Family { name: name.into(), verdict: Verdict::Divisibility { reason: reason.into(), kind: search::Refusal::Other } };
        let why = nothing_fits(&[divides("TP", "tp·cp = 65536 does not divide 64 GPUs"), divides("PP", "pp too large")]);
        assert_eq!(why, "no layout divides the model and the batch at this GPU count (TP: tp·cp = 65536 does not divide 64 GPUs)");
        // The reason most families share comes first, not the first family's.
        let dense = "ep=8, etp=1 but the graph has no routed experts; set ep = etp = 1";
        let why = nothing_fits(&[divides("CP", "tp·cp = 16 does not divide 8 GPUs"), divides("CP+EP", dense), divides("EP+DP", dense)]);
        assert_eq!(why, format!("no layout divides the model and the batch at this GPU count (CP+EP: {dense})"));
        let memory = Family { name: "TP+PP".into(), verdict: Verdict::Memory { layout: "TP8 PP2".into(), need_gib: 95.0, have_gib: 80.0 } };
        let why = nothing_fits(&[divides("TP", "x"), memory.clone()]);
        assert!(why.starts_with("nothing fits: the least memory any layout needs is 95 GiB per GPU (TP+PP: TP8 PP2)"), "{why}");
        let host = Family { name: "TP".into(), verdict: Verdict::HostMemory { layout: "TP1 OFFLOAD:32".into(), need_gib: 580.0, have_gib: 256.0 } };
        let why = nothing_fits(&[memory, host]);
        assert!(why.contains("least host memory that takes is 580 GiB per GPU (TP: TP1 OFFLOAD:32) of 256 GiB"), "{why}");
    }

    /// A fixed layout's refusal leaves out the families whose tp·cp, chosen by the search,
    /// does not divide the count, by their kind and not their words: where tp and cp were
    /// free, and only while another family remains.
    #[test]
    fn a_fixed_layout_refusal_leaves_out_stage_count_families_by_kind() {
        use search::{Family, Refusal, Verdict};
        let refused = |name: &str, reason: &str, kind: Refusal| Family { name: name.into(), verdict: Verdict::Divisibility { reason: reason.into(), kind } };
        let dense = "ep=8, etp=1 but the graph has no routed experts; set ep = etp = 1";
        let stage = refused("CP", "tp·cp = 16 does not divide 8 GPUs", Refusal::StageCount);
        let families = [stage.clone(), refused("CP+EP", dense, Refusal::Other), refused("EP+DP", dense, Refusal::Other)];
        assert_eq!(fixed_layout_refusal(&families, true), format!("CP+EP, EP+DP: divisibility: {dense}"));
        // tp or cp fixed: the user's own product, kept.
        assert_eq!(
            fixed_layout_refusal(&families, false),
            format!("CP: divisibility: tp·cp = 16 does not divide 8 GPUs; CP+EP, EP+DP: divisibility: {dense}")
        );
        // Nothing else left: said rather than nothing.
        assert_eq!(fixed_layout_refusal(std::slice::from_ref(&stage), true), "CP: divisibility: tp·cp = 16 does not divide 8 GPUs");
        // The words alone do not make the kind: a reason worded alike but of another kind stays.
        let alike = refused("TP", "tp·cp = 3 does not divide 8 GPUs", Refusal::Other);
        assert_eq!(fixed_layout_refusal(&[alike, families[1].clone()], true), format!("TP: divisibility: tp·cp = 3 does not divide 8 GPUs; CP+EP: divisibility: {dense}"));
    }

    fn quote(usd: f64, caveats: &[&str]) -> CloudPrice {
        CloudPrice::Quoted(crate::pricing::tests::quote(usd, caveats))
    }

    fn row(gpus: u32, days: f64, usd: f64) -> Row {
        Row {
            requested_gpus: gpus,
            gpus,
            global_batch: gpus,
            projection: None,
            why_not: None,
            days: Some(days),
            costs: vec![quote(usd, &[])],
            speedup: None,
            relative_cost: None,
            cheapest: None,
            sweet: false,
        }
    }

    fn series(rows: Vec<Row>) -> Series {
        let profiles = runner_project::profile::Profiles::builtin();
        Series {
            gpu: profiles.get("H100").unwrap().clone(),
            precision: "bf16".into(),
            plan: "bf16".into(),
            low_precision_share: 0.0,
            rows,
            sweet_spot: None,
            sweet_spot_why: String::new(),
        }
    }

    #[test]
    fn the_sweet_spot_stops_where_a_day_saved_costs_more_than_the_threshold() {
        // 64 -> 128 saves 50 days for $10K ($200/day); 128 -> 256 saves 25 days for $20K
        // ($800/day); 256 -> 512 saves 12.5 days for $100K ($8,000/day).
        let mut s = series(vec![row(64, 100.0, 1.0e6), row(128, 50.0, 1.01e6), row(256, 25.0, 1.03e6), row(512, 12.5, 1.13e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: Some(1000.0) });
        assert_eq!(s.sweet_spot, Some(256), "{}", s.sweet_spot_why);
        assert!(s.rows[2].sweet && !s.rows[3].sweet);
        assert!(s.sweet_spot_why.contains("$8.0K per day saved"), "{}", s.sweet_spot_why);
        // A threshold above $8,000 takes the last step too; the default (1 % of $1M =
        // $10,000 per day) does as well.
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: Some(9000.0) });
        assert_eq!(s.sweet_spot, Some(512));
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        assert_eq!(s.sweet_spot, Some(512));
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: Some(100.0) });
        assert_eq!(s.sweet_spot, Some(64));
        // Relative cost is money against the first priced row.
        assert!((s.rows[3].relative_cost.unwrap() - 1.13).abs() < 1e-12);
        assert!((s.rows[3].speedup.unwrap() - 8.0).abs() < 1e-12);
    }

    /// A count a later one beats on both time and cost is passed over, and the walk goes on
    /// past it: 128 (as slow as 64, dearer) and 64 (slower than 256 at the same cost) are
    /// beaten, so 256 is the sweet spot, the sentence saying why. Kills: the walk stopping
    /// at the first count that is no faster (the old rule chose 64).
    #[test]
    fn a_count_beaten_on_time_and_cost_is_never_the_sweet_spot() {
        let mut s = series(vec![row(64, 100.0, 1.0e6), row(128, 100.0, 1.1e6), row(256, 20.0, 1.0e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        assert_eq!(s.sweet_spot, Some(256), "{}", s.sweet_spot_why);
        assert_eq!(
            s.sweet_spot_why,
            "256 GPUs: no other count priced is faster or cheaper; passed over as beaten on both time and cost: 64 (by 256), \
             128 (by 64)"
        );
        // The audit's case (llama3.1-70b, 1e12 tokens, fp8, $10 per day saved): 64 GPUs at
        // $384.2K in 104.2 days, 512 at $372.5K in 13.2, 2048 at $379.4K in 3.22. 64 is
        // beaten by 512; 512 -> 2048 costs $6.9K for 9.98 days, $690 a day, over $10.
        let mut s = series(vec![row(64, 104.2, 384.2e3), row(512, 13.2, 372.5e3), row(2048, 3.22, 379.4e3)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: Some(10.0) });
        assert_eq!(s.sweet_spot, Some(512), "{}", s.sweet_spot_why);
        assert!(s.sweet_spot_why.starts_with("512 GPUs: going to 2048 saves 9.98 days for $6.9K more"), "{}", s.sweet_spot_why);
        assert!(s.sweet_spot_why.ends_with("; passed over as beaten on both time and cost: 64 (by 512)"), "{}", s.sweet_spot_why);
        // Identical rows: the fewer GPUs stay, and no count is a sweet spot twice.
        let mut s = series(vec![row(64, 50.0, 1.0e6), row(128, 50.0, 1.0e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        assert_eq!(s.sweet_spot, Some(64), "{}", s.sweet_spot_why);
    }

    /// The frontier is walked slowest first, whatever the order of the counts: a larger
    /// count that is slower and cheaper starts the walk. Kills: walking in count order.
    #[test]
    fn the_frontier_is_walked_from_the_cheapest_run() {
        let mut s = series(vec![row(64, 50.0, 1.2e6), row(128, 100.0, 1.0e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: Some(1000.0) });
        assert_eq!(s.sweet_spot, Some(128), "{}", s.sweet_spot_why);
        assert!(s.sweet_spot_why.starts_with("128 GPUs: going to 64 saves 50.0 days for $200.0K more"), "{}", s.sweet_spot_why);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: Some(4000.0) });
        assert_eq!(s.sweet_spot, Some(64), "{}", s.sweet_spot_why);
        assert!(s.sweet_spot_why.ends_with("none faster was asked for"), "{}", s.sweet_spot_why);
    }

    /// A spot row priced for `hours` of wall clock (the projection said `days`).
    fn spot(gpus: u32, days: f64, hours: f64, usd: f64) -> Row {
        let mut r = row(gpus, days, usd);
        let q = pricing::tests::quote(usd, &[]);
        r.costs = vec![CloudPrice::Quoted(pricing::CloudCost { option: "spot".into(), hours, ..q })];
        r
    }

    /// On spot the sweet spot and the goals weigh the days the quote bills (interruptions
    /// included), and the answer says both. The audit's case: 4096 GPUs projected at 4.57
    /// days but billed 235 hours (9.79 days) does not finish within 5 days. Kills: goals or
    /// the sweet spot reading the projection's days.
    #[test]
    fn on_spot_goals_and_the_sweet_spot_weigh_the_days_the_quote_bills() {
        let clouds = ["c".to_string()];
        let mut s = series(vec![spot(2048, 8.84, 8.84 * 24.0 * 1.1, 742.3e3), spot(4096, 4.5686, 235.0, 1.2e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        assert!((s.rows[1].quoted_days().unwrap() - 235.0 / 24.0).abs() < 1e-12);
        // 9.724 -> 9.792 days: 4096 is slower and dearer, so 2048 beats it.
        assert_eq!(s.sweet_spot, Some(2048), "{}", s.sweet_spot_why);
        assert!(s.sweet_spot_why.contains("4096 (by 2048)"), "{}", s.sweet_spot_why);
        let s = [s];
        let a = answer(Goal::TargetDays(5.0), &s, &clouds, &[2048, 4096]);
        assert!(!a.met, "{a:?}");
        assert!(a.why.starts_with("no priced run finishes within 5 days; the fastest takes 9.72 days"), "{}", a.why);
        let a = answer(Goal::TargetDays(10.0), &s, &clouds, &[2048, 4096]);
        let best = a.best.unwrap();
        assert_eq!((best.gpus, best.days_without_interruptions), (2048, Some(8.84)));
        assert_eq!(
            best.describe(),
            "2048 x H100 bf16 (-): 9.72 days wall clock with spot interruptions (8.84 without), $742.3K on c (i r spot undated)"
        );
        // On demand the projection's days stand, and nothing more is said.
        let mut on_demand = series(vec![row(64, 4.0, 1.0e6)]);
        derive(&mut on_demand, &SweetSpotRule { max_usd_per_day_saved: None });
        let a = answer(Goal::TargetDays(1.0), &[on_demand], &clouds, &[64]);
        assert!(a.why.starts_with("no priced run finishes within 1 day; the fastest takes 4.00 days"), "{}", a.why);
        let best = a.best.unwrap();
        assert_eq!(best.days_without_interruptions, None);
        assert_eq!(best.describe(), "64 x H100 bf16 (-): 4.00 days, $1.00M on c (i r on-demand undated)");
    }

    /// On spot a dearer cloud can finish sooner (fewer, larger nodes are interrupted less
    /// often), so a goal weighs every cloud's quote, not only each row's cheapest: the
    /// cheapest cloud here bills 6.25 days, the other 4.79. A caveated quote is still
    /// passed over while a clean one exists. Kills: goals reading only the cheapest quote
    /// (then 5 days is not met and the budget answer is the slower run).
    #[test]
    fn on_spot_a_goal_weighs_every_clouds_quote() {
        let clouds = ["small-nodes".to_string(), "big-nodes".to_string(), "resale".to_string()];
        let at = |usd: f64, hours: f64, caveats: &[&str]| {
            CloudPrice::Quoted(pricing::CloudCost { option: "spot".into(), hours, ..pricing::tests::quote(usd, caveats) })
        };
        let mut r = row(512, 4.5, 1.0e6);
        r.costs = vec![at(1.0e6, 150.0, &[]), at(1.1e6, 115.0, &[]), at(0.5e6, 110.0, &["resale"])];
        let mut s = series(vec![r]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        assert_eq!(s.rows[0].cheapest, Some(0));
        let s = [s];
        let a = answer(Goal::TargetDays(5.0), &s, &clouds, &[512]);
        assert!(a.met, "{a:?}");
        let best = a.best.unwrap();
        assert_eq!((best.cloud.as_deref(), best.usd), (Some("big-nodes"), Some(1.1e6)));
        assert!((best.days - 115.0 / 24.0).abs() < 1e-12 && best.days_without_interruptions == Some(4.5));
        // Within 7 days both clouds finish: the cheaper one, and the answer lists one run
        // per configuration (no runner-up repeats the count on the other cloud).
        let a = answer(Goal::TargetDays(7.0), &s, &clouds, &[512]);
        assert_eq!(a.best.unwrap().cloud.as_deref(), Some("small-nodes"));
        assert!(a.runners_up.is_empty(), "{:?}", a.runners_up);
        // The fastest within $1.2M is the dearer cloud; within $1.05M only the cheaper one.
        let a = answer(Goal::Budget(1.2e6), &s, &clouds, &[512]);
        assert_eq!(a.best.unwrap().cloud.as_deref(), Some("big-nodes"));
        let a = answer(Goal::Budget(1.05e6), &s, &clouds, &[512]);
        assert_eq!(a.best.unwrap().cloud.as_deref(), Some("small-nodes"));
        // Nothing within 4 days: the nearest is the fastest clean quote, not the resale one.
        let a = answer(Goal::TargetDays(4.0), &s, &clouds, &[512]);
        assert!(!a.met);
        assert_eq!(a.best.unwrap().cloud.as_deref(), Some("big-nodes"));
    }

    /// Clouds are ordered by their quote of the first row they price, not a later one:
    /// cloud 1 is cheaper at 64 GPUs and dearer at 128 (a minimum charge that only the
    /// small run pays more for, say), and a cloud that prices nothing comes last. Kills:
    /// ranking by the last priced row (the order flips), unpriced clouds ranked first.
    #[test]
    fn clouds_are_ordered_by_their_first_priced_row() {
        let priced = |gpus: u32, a: f64, b: f64| Row { costs: vec![quote(a, &[]), quote(b, &[]), CloudPrice::NotSold], ..row(gpus, 10.0, a) };
        let s = series(vec![priced(64, 2.0e6, 1.0e6), priced(128, 1.0e6, 3.0e6)]);
        assert_eq!(cloud_order(&[s], 3), [1, 0, 2]);
        // Unpriced at the first row, cloud 0 is ranked by the first row it prices.
        let mut first = priced(64, 0.0, 1.0e6);
        first.costs[0] = CloudPrice::NotSold;
        let s = series(vec![first, priced(128, 0.5e6, 3.0e6)]);
        assert_eq!(cloud_order(&[s], 3), [0, 1, 2]);
    }

    /// A quote that leaves storage out says so in the goal's answer. Kills: the flag dropped
    /// from the choice.
    #[test]
    fn an_answer_whose_quote_leaves_storage_out_says_so() {
        let mut r = row(64, 4.0, 1.0e6);
        r.costs = vec![CloudPrice::Quoted(pricing::CloudCost { storage_not_costed: true, ..pricing::tests::quote(1.0e6, &[]) })];
        let mut s = series(vec![r]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        let a = answer(Goal::Budget(2e6), &[s], &["c".to_string()], &[64]);
        assert_eq!(a.best.unwrap().describe(), "64 x H100 bf16 (-): 4.00 days, $1.00M on c (i r on-demand undated; storage not costed)");
    }

    /// A typed region within two edits of a named one (case ignored) is a typo; one far
    /// from all is not. Kills: the distance bound loosened or case counted.
    #[test]
    fn a_region_near_a_named_one_is_taken_for_a_typo() {
        let named: BTreeSet<&str> = ["us-east-1", "us-east-2", "us-west-2", "eu-north1"].into_iter().collect();
        assert_eq!(near_regions("us-east1", &named), Some(vec!["us-east-1"]));
        assert_eq!(near_regions("EU-NORTH-1", &named), Some(vec!["eu-north1"]));
        assert_eq!(near_regions("us-wst", &named), None, "three edits");
        assert_eq!(near_regions("antarctica", &named), None);
    }

    #[test]
    fn a_caveated_price_is_cheapest_only_when_nothing_clean_is_quoted() {
        let costs = vec![quote(10.0, &[]), quote(5.0, &["suspect"]), CloudPrice::NotSold, quote(8.0, &[])];
        assert_eq!(cheapest(&costs), Some(3));
        let costs = vec![CloudPrice::NotSold, quote(5.0, &["lower-bound"]), quote(4.0, &["resale"])];
        assert_eq!(cheapest(&costs), Some(2));
        assert_eq!(cheapest(&[CloudPrice::NotSold]), None);
    }

    #[test]
    fn goals_pick_the_cheapest_in_time_or_the_fastest_in_budget_or_the_nearest() {
        let mut s = series(vec![row(64, 100.0, 1.0e6), row(128, 50.0, 1.1e6), row(256, 25.0, 1.3e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        let series = [s];
        let clouds = ["c".to_string()];
        let a = answer(Goal::TargetDays(60.0), &series, &clouds, &[64, 128, 256]);
        assert!(a.met);
        assert_eq!(a.best.as_ref().unwrap().gpus, 128);
        assert_eq!(a.runners_up.iter().map(|c| c.gpus).collect::<Vec<_>>(), [256]);
        let a = answer(Goal::Budget(1.2e6), &series, &clouds, &[64, 128, 256]);
        assert_eq!(a.best.as_ref().unwrap().gpus, 128);
        let a = answer(Goal::TargetDays(10.0), &series, &clouds, &[64, 128, 256]);
        assert!(!a.met);
        assert_eq!(a.best.as_ref().unwrap().gpus, 256, "the fastest is the nearest feasible");
        assert!(a.why.contains("largest count asked was 256"), "{}", a.why);
        let a = answer(Goal::Budget(5e5), &series, &clouds, &[64, 128, 256]);
        assert!(!a.met);
        assert_eq!(a.best.as_ref().unwrap().gpus, 64, "the cheapest is the nearest feasible");
    }

    #[test]
    fn a_price_file_is_named_after_its_file_and_readably_apart_from_a_cloud_of_that_name() {
        let p = std::path::Path::new;
        assert_eq!(price_file_cloud_name(p("/x/our-contract.csv"), &["aws", "lambda"]), "our-contract");
        // Named like an installed cloud: the file name, not "acme (price file)", which a
        // 12-character column header showed as "acme (price".
        assert_eq!(price_file_cloud_name(p("/x/acme.csv"), &["acme", "aws"]), "acme.csv");
        assert_eq!(price_file_cloud_name(p("acme"), &["acme"]), "acme-price-file");
        assert_eq!(price_file_cloud_name(p("a\x1b.csv"), &[]), "a?");
    }

    #[test]
    fn plugin_stems() {
        assert_eq!(plugin_stem("/a/b/price_file.wasm"), PRICE_FILE_PLUGIN);
        assert_eq!(plugin_stem("price_file"), PRICE_FILE_PLUGIN);
        assert_eq!(plugin_stem("aws.wasm"), "aws");
    }

    /// The default threshold is 1 % of the series' cheapest run, not of its dearest: a step
    /// costing $12,000 per day saved is over 1 % of $1.0M, though under 1 % of $1.6M.
    #[test]
    fn the_default_threshold_is_a_share_of_the_cheapest_run() {
        let mut s = series(vec![row(64, 100.0, 1.0e6), row(128, 50.0, 1.6e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        assert_eq!(s.sweet_spot, Some(64), "{}", s.sweet_spot_why);
        assert!(s.sweet_spot_why.contains("$12.0K per day saved, over the $10.0K threshold"), "{}", s.sweet_spot_why);
    }

    /// A row's cheapest quote is the cheapest cloud's, whichever column it is in; the
    /// relative cost and a goal's answer (and the cloud it names) follow it.
    #[test]
    fn a_rows_cheapest_quote_is_found_in_any_column_and_named_by_the_goal() {
        let two = |gpus: u32, days: f64, a: f64, b: f64| Row { costs: vec![quote(a, &[]), quote(b, &[])], ..row(gpus, days, a) };
        let mut s = series(vec![two(64, 100.0, 1.0e6, 0.8e6), two(128, 50.0, 1.2e6, 1.0e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        assert_eq!(s.rows.iter().map(|r| r.cheapest).collect::<Vec<_>>(), [Some(1), Some(1)]);
        assert!((s.rows[1].relative_cost.unwrap() - 1.25).abs() < 1e-12, "$1.0M against $0.8M");
        let clouds = ["a".to_string(), "b".to_string()];
        let a = answer(Goal::TargetDays(60.0), &[s], &clouds, &[64, 128]);
        let best = a.best.unwrap();
        assert_eq!((best.gpus, best.usd, best.cloud.as_deref()), (128, Some(1.0e6), Some("b")));
    }

    /// A budget nothing meets answers with the cheapest run wherever it stands in the
    /// series (here not the smallest count); a goal many runs meet lists four runners-up
    /// (EXPLORER.md), in the goal's order.
    #[test]
    fn the_nearest_run_to_a_budget_is_the_cheapest_and_four_runners_up_follow_the_best() {
        let mut s = series(vec![row(64, 100.0, 1.2e6), row(128, 50.0, 1.1e6), row(256, 25.0, 1.3e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        let clouds = ["c".to_string()];
        let a = answer(Goal::Budget(5e5), &[s], &clouds, &[64, 128, 256]);
        assert!(!a.met);
        assert_eq!(a.best.as_ref().unwrap().gpus, 128, "{}", a.why);
        assert!(a.why.ends_with("the cheapest costs $1.10M"), "{}", a.why);
        let counts = [8, 16, 32, 64, 128, 256];
        let usd = [6.0e5, 5.0e5, 4.0e5, 3.0e5, 2.0e5, 1.0e5];
        let mut s = series(counts.iter().zip(usd).map(|(&n, u)| row(n, 800.0 / f64::from(n), u)).collect());
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        let a = answer(Goal::TargetDays(1000.0), &[s], &clouds, &counts);
        assert_eq!(a.best.as_ref().unwrap().gpus, 256);
        assert_eq!(a.runners_up.iter().map(|c| c.gpus).collect::<Vec<_>>(), [128, 64, 32, 16]);
    }

    /// A row whose split only a layout string builds gets a note with that string; a
    /// row without one, or without a layout, gets none.
    #[test]
    fn a_split_only_a_layout_string_builds_is_noted_with_it() {
        let mut p = crate::report::explore::tests::projected(9.44, 0.39, 0.0);
        p.layout.pp = 4;
        p.layout.vp = 7;
        p.layout.split = runner_graph::pipeline::PipelineSplit { embedding: 1, loss: 3 };
        p.pipeline_model_parallel_layout = Some("Et*2|(t*3|)*26L".into());
        let even = crate::report::explore::tests::projected(9.7, 0.38, 0.0);
        let rows = vec![Row { projection: Some(p), ..row(64, 104.2, 1.0) }, Row { projection: Some(even), ..row(128, 52.0, 1.0) }, unfit(256)];
        let notes = layout_string_notes(&[labelled("H100", "fp8", 0.98, rows)]);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].starts_with("H100 fp8, 64 GPUs, TP8 PP4 VP7 DP1 E1L3 MBS1"), "{}", notes[0]);
        assert!(notes[0].contains("pp·vp = 28 chunks only from pipeline_model_parallel_layout = \"Et*2|(t*3|)*26L\""), "{}", notes[0]);
        // Under DualPipeV the string writes the V's 2·pp stages, and the note says the
        // flags do not build it rather than that Megatron-Core builds it from the string.
        let mut v = crate::report::explore::tests::projected(9.44, 0.39, 0.0);
        v.layout.pp = 4;
        v.layout.pipeline = runner_project::step::PipelineKind::DualPipeV;
        let note = crate::project::layout_string_note(&v.layout, "Et|(t*2|)*6L");
        assert!(note.contains("over 2·pp = 8 stages, in a pipeline_model_parallel_layout's notation: \"Et|(t*2|)*6L\""), "{note}");
        assert!(!note.contains("Megatron-Core builds"), "{note}");
    }

    fn unpriced(mut r: Row) -> Row {
        r.costs = vec![CloudPrice::NotSold];
        r
    }

    fn unfit(gpus: u32) -> Row {
        Row { days: None, why_not: Some("nothing fits".into()), ..unpriced(row(gpus, 0.0, 0.0)) }
    }

    fn labelled(gpu: &str, precision: &str, share: f64, rows: Vec<Row>) -> Series {
        let profiles = runner_project::profile::Profiles::builtin();
        Series { gpu: profiles.get(gpu).unwrap().clone(), precision: precision.into(), low_precision_share: share, ..series(rows) }
    }

    /// A GPU no cloud here sells is said with the way to price it (a price file, or a
    /// plugin that sells it), once something was projected; a series with a quote, a
    /// failed quote (its own note says why) or nothing that fits gets no such line.
    #[test]
    fn a_gpu_no_cloud_sells_points_at_the_price_file() {
        use crate::plugin::cost::PurchaseOption::OnDemand;
        let gh200 = |rows: Vec<Row>| labelled("gh200", "fp8", 0.9, rows);
        let none = |cloud: &str| Sale { cloud: cloud.into(), options: Vec::new(), other_node: false };
        let why = sold_nowhere(&gh200(vec![unfit(4), unpriced(row(8, 10.0, 0.0))]), &[none("aws"), none("gcp")], OnDemand).unwrap();
        assert!(why.starts_with("no cloud here sells GH200 (2 asked: aws, gcp); its rows are projected, not priced"), "{why}");
        assert!(why.contains("--price-file FILE") && why.contains("AcceleratorName GH200") && why.contains("--cloud FILE.wasm"), "{why}");
        assert!(sold_nowhere(&gh200(vec![unpriced(row(8, 10.0, 0.0))]), &[], OnDemand).unwrap().starts_with("no cloud prices GH200 (none was loaded)"));
        assert_eq!(sold_nowhere(&gh200(vec![unpriced(row(8, 10.0, 0.0)), row(16, 5.0, 1e6)]), &[none("aws")], OnDemand), None);
        let failed = Row { costs: vec![CloudPrice::QuoteFailed { reason: "x".into() }], ..row(8, 10.0, 0.0) };
        assert_eq!(sold_nowhere(&gh200(vec![failed]), &[none("aws")], OnDemand), None);
        assert_eq!(sold_nowhere(&gh200(vec![unfit(4)]), &[none("aws")], OnDemand), None);
    }

    /// Clouds that sell the GPU, only not under the option asked, are not "no cloud here
    /// sells it": the options they do sell it under are named, and --option is the fix.
    /// Clouds that sell it only on other nodes than the profile's say that instead.
    #[test]
    fn a_gpu_sold_under_other_options_or_nodes_says_so() {
        use crate::plugin::cost::PurchaseOption::{CapacityBlock, OnDemand, Spot, ThreeYearAllUpfront};
        let h100 = labelled("h100", "bf16", 0.0, vec![unpriced(row(8, 10.0, 0.0))]);
        let sale = |cloud: &str, options: Vec<_>, other_node| Sale { cloud: cloud.into(), options, other_node };
        let sales = [sale("aws", vec![OnDemand, Spot, CapacityBlock], false), sale("lambda", vec![OnDemand], false)];
        let why = sold_nowhere(&h100, &sales, ThreeYearAllUpfront).unwrap();
        assert_eq!(
            why,
            "no cloud here sells H100 as 3y-all-upfront (2 asked: aws, lambda), but aws sells it on-demand or spot or \
             capacity-block; lambda sells it on-demand; its rows are projected, not priced: try --option on-demand or \
             --option spot or --option capacity-block (or give your own 3y-all-upfront prices with --price-file FILE, \
             docs/EXPLORER.md)"
        );
        let why = sold_nowhere(&h100, &[sale("lambda", vec![OnDemand], false)], Spot).unwrap();
        assert!(why.starts_with("no cloud here sells H100 as spot (1 asked: lambda), but lambda sells it on-demand;"), "{why}");
        let why = sold_nowhere(&h100, &[sale("lambda", vec![], false), sale("mine", vec![], true)], OnDemand).unwrap();
        assert!(
            why.starts_with(
                "no cloud here sells H100 on its profile's node (8 GPUs per node, scale-up domain 8) (2 asked: lambda, mine): \
                 mine sells it on other nodes only"
            ),
            "{why}"
        );
    }

    /// Speedup is against the series' first row that fits, relative cost against its first
    /// row that is priced, and the sweet-spot walk starts at the first priced row.
    #[test]
    fn speedup_counts_from_the_first_row_that_fits_and_cost_from_the_first_priced() {
        let rows = vec![unfit(32), unpriced(row(64, 100.0, 0.0)), row(128, 50.0, 1.0e6), row(256, 25.0, 1.5e6)];
        let mut s = series(rows);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        assert_eq!(s.rows.iter().map(|r| r.speedup).collect::<Vec<_>>(), [None, Some(1.0), Some(2.0), Some(4.0)]);
        assert_eq!(s.rows.iter().map(|r| r.relative_cost).collect::<Vec<_>>(), [None, None, Some(1.0), Some(1.5)]);
        // 128 -> 256 saves 25 days for $0.5M: $20K per day, over 1 % of $1.0M.
        assert_eq!(s.sweet_spot, Some(128), "{}", s.sweet_spot_why);
        assert!(s.sweet_spot_why.starts_with("128 GPUs: going to 256 saves 25.0 days"), "{}", s.sweet_spot_why);
        let mut s = series(vec![unfit(32), unpriced(row(64, 100.0, 0.0)), row(128, 50.0, 1.0e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        assert_eq!(s.sweet_spot_why, "128 GPUs: the smallest count priced");
        assert_eq!(s.rows.iter().filter(|r| r.sweet).map(|r| r.gpus).collect::<Vec<_>>(), [128]);
    }

    /// Each step is weighed on its own (extra money over days saved against the count
    /// before it), not averaged from the first row: a free step does not pay for a dear one.
    /// A step costing exactly the threshold is taken (at most, as the reason says), and
    /// deriving again marks one sweet spot only.
    #[test]
    fn the_sweet_spot_weighs_each_step_against_the_one_before() {
        // 64 -> 128 is free; 128 -> 256 saves 25 days for $0.3M: $12K per day, over the
        // $10K threshold (from 64 it would average $4K per day).
        let mut s = series(vec![row(64, 100.0, 1.0e6), row(128, 50.0, 1.0e6), row(256, 25.0, 1.3e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        assert_eq!(s.sweet_spot, Some(128), "{}", s.sweet_spot_why);
        // $0.25M for 25 days: $10K per day, exactly the threshold.
        let mut s = series(vec![row(64, 100.0, 1.0e6), row(128, 50.0, 1.0e6), row(256, 25.0, 1.25e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: Some(10_000.0) });
        assert_eq!(s.sweet_spot, Some(256), "{}", s.sweet_spot_why);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: Some(100.0) });
        assert_eq!(s.rows.iter().filter(|r| r.sweet).map(|r| r.gpus).collect::<Vec<_>>(), [128]);
    }

    /// The default threshold is 1 % of the cheapest run, wherever it stands: here the second
    /// row ($1.0M, so $10K), not the first ($1.2M) nor the dearest ($1.275M).
    #[test]
    fn the_default_threshold_follows_the_cheapest_run_wherever_it_is() {
        // 64 -> 128 is faster and cheaper; 128 -> 256 saves 25 days for $275K: $11K per day.
        let mut s = series(vec![row(64, 100.0, 1.2e6), row(128, 50.0, 1.0e6), row(256, 25.0, 1.275e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        assert_eq!(s.sweet_spot, Some(128), "{}", s.sweet_spot_why);
        assert!(
            s.sweet_spot_why.ends_with("$11.0K per day saved, over the $10.0K threshold; passed over as beaten on both time and cost: 64 (by 128)"),
            "{}",
            s.sweet_spot_why
        );
    }

    /// FP8 against BF16 on the same GPU type, count by count where both fit: BF16 days
    /// over FP8 days, each side's own cheapest quote, and the FP8 plan's coverage.
    #[test]
    fn low_precision_is_compared_with_bf16_of_the_same_gpu_at_each_count_both_fit() {
        let mut series = [
            labelled("B200", "bf16", 0.0, vec![row(64, 30.0, 0.5e6), row(128, 15.0, 0.5e6)]),
            labelled("H100", "bf16", 0.0, vec![row(64, 100.0, 1.0e6), unfit(128)]),
            labelled("H100", "fp8", 0.8, vec![row(64, 80.0, 0.9e6), row(128, 40.0, 0.95e6)]),
        ];
        for s in &mut series {
            derive(s, &SweetSpotRule { max_usd_per_day_saved: None });
        }
        let c = compare(&series);
        assert_eq!(c.len(), 1, "{c:#?}");
        let c = &c[0];
        assert_eq!((c.gpu.as_str(), c.precision.as_str(), c.gpus), ("H100", "fp8", 64));
        assert_eq!((c.days_bf16, c.days, c.speedup), (100.0, 80.0, 1.25));
        assert_eq!((c.usd_bf16, c.usd, c.coverage), (Some(1.0e6), Some(0.9e6), 0.8));
    }

    /// A goal's bounds are inclusive ("within" so many days, "at most" so many dollars);
    /// ties go to the faster (target) or the cheaper (budget) run; a row no cloud prices
    /// is no answer; and the largest count asked is said whatever order they were asked in.
    #[test]
    fn goals_are_inclusive_break_ties_and_answer_only_with_priced_rows() {
        let clouds = ["c".to_string()];
        let mut s = series(vec![row(64, 100.0, 1.0e6), row(128, 50.0, 1.1e6), row(256, 25.0, 1.3e6), unpriced(row(512, 10.0, 0.0))]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        let s = [s];
        let a = answer(Goal::TargetDays(50.0), &s, &clouds, &[256, 64, 512, 128]);
        assert_eq!(a.best.as_ref().unwrap().gpus, 128);
        assert_eq!(a.runners_up.iter().map(|c| c.gpus).collect::<Vec<_>>(), [256]);
        let a = answer(Goal::Budget(1.1e6), &s, &clouds, &[256, 64, 512, 128]);
        assert_eq!(a.best.as_ref().unwrap().gpus, 128);
        let a = answer(Goal::TargetDays(5.0), &s, &clouds, &[256, 64, 512, 128]);
        assert!(!a.met);
        let best = a.best.unwrap();
        assert_eq!((best.gpus, best.usd), (256, Some(1.3e6)), "the fastest priced run");
        assert!(a.why.contains("the fastest takes 25.0 days. The largest count asked was 512"), "{}", a.why);
        // Equal cost: the faster; equal days: the cheaper (here on another GPU type).
        let mut same = series(vec![row(64, 100.0, 1.0e6), row(128, 50.0, 1.0e6)]);
        derive(&mut same, &SweetSpotRule { max_usd_per_day_saved: None });
        let mut b200 = labelled("B200", "bf16", 0.0, vec![row(64, 50.0, 0.9e6)]);
        derive(&mut b200, &SweetSpotRule { max_usd_per_day_saved: None });
        let both = [same, b200];
        let a = answer(Goal::TargetDays(200.0), &both[..1], &clouds, &[64, 128]);
        assert_eq!(a.best.as_ref().unwrap().gpus, 128);
        let a = answer(Goal::Budget(2e6), &both, &clouds, &[64, 128]);
        let best = a.best.unwrap();
        assert_eq!((best.gpu.as_str(), best.gpus), ("B200", 64));
    }

    /// Each cloud's price rows, once each, under that cloud; a caveated row says so.
    #[test]
    fn price_provenance_names_each_clouds_rows_and_their_caveats() {
        let mut clean = crate::pricing::tests::quote(1.0, &[]);
        clean.instance = "p5".into();
        let mut resale = crate::pricing::tests::quote(2.0, &["resale"]);
        (resale.cloud, resale.plugin, resale.instance) = ("b".into(), "b.wasm".into(), "x8".into());
        let r = |gpus| Row { costs: vec![CloudPrice::Quoted(clean.clone()), CloudPrice::Quoted(resale.clone())], ..row(gpus, 1.0, 1.0) };
        let s = series(vec![r(8), r(16)]);
        let notes = price_provenance(&[s], &["a".to_string(), "b".to_string()]);
        assert_eq!(
            notes,
            [
                "a prices from c.wasm sha256 00: H100 p5 r on-demand undated: s",
                "b prices from b.wasm sha256 00: H100 x8 r on-demand undated: s [resale: no clean price for this GPU]"
            ]
        );
    }

    /// What a row asks of a cloud, worked by hand (a hand mutation audit of the explorer's
    /// arithmetic found each of these could change with every test passing):
    /// - GPUs round up to whole nodes, as they are billed: 20 on 8-GPU nodes are 24, 16
    ///   stay 16, 1 is a node of 8; 73 on 72-GPU racks are two racks.
    /// - days = tokens / (tokens/s/GPU x GPUs) / 86,400 s: 8.64T tokens at 1,000 tokens/s
    ///   on each of 1,000 GPUs take 8.64M s, 100 days.
    /// - storage: the checkpoints kept, each of every parameter (14 B: BF16 weights, fp32
    ///   master weights and two AdamW moments), and the tokenised data (4 B a token id);
    ///   egress: the BF16 weights once. A mixture of experts checkpoints all its experts,
    ///   not the share a token uses: DeepSeek-V3's 671B parameters (37B active) on 14.8T
    ///   tokens keep 2 x 14 x 671e9 B = 18,788 GB of checkpoints and 59,200 GB of data, and
    ///   send 1,342 GB out.
    /// - GB-months: a month is a twelfth of a 365.25-day year, 30.4375 days, and storage is
    ///   paid for as long as the run lasts: 77,988 GB for two such months is 155,976.
    #[test]
    fn a_rows_nodes_days_storage_and_egress_by_hand() {
        assert_eq!([whole_nodes(20, 8), whole_nodes(16, 8), whole_nodes(1, 8), whole_nodes(73, 72)], [24, 16, 8, 144]);
        let days = days_to_train(8.64e12, 1000.0, 1000);
        assert!((days - 100.0).abs() < 1e-9, "{days}");
        let params = count::ParamCount { total: 671_000_000_000, active: 37_000_000_000, embedding: 0, trainable: 671_000_000_000 };
        let (storage, egress) = storage_and_egress_gb(&Assumptions::default(), &params, 14.8e12);
        assert!((storage - (18_788.0 + 59_200.0)).abs() < 1e-6, "{storage}");
        assert!((egress - 1_342.0).abs() < 1e-9, "{egress}");
        let none_kept = Assumptions { checkpoints_kept: 0, ..Assumptions::default() };
        assert!((storage_and_egress_gb(&none_kept, &params, 14.8e12).0 - 59_200.0).abs() < 1e-6);
        assert!((gb_months(77_988.0, 2.0 * 30.4375) - 155_976.0).abs() < 1e-6);
    }

    /// A target no run meets answers with the fastest run, and of runs equally fast the
    /// cheaper, whichever column its cloud is in: one row quoted on demand by two clouds
    /// takes the projection's 10 days on both, and the second cloud's $1.0M is nearer than
    /// the first's $1.2M. Kills: the nearest run to a target chosen by days alone (the first
    /// column's dearer quote).
    #[test]
    fn the_nearest_run_to_a_target_is_the_cheapest_of_the_fastest() {
        let two = Row { costs: vec![quote(1.2e6, &[]), quote(1.0e6, &[])], ..row(64, 10.0, 1.2e6) };
        let mut s = series(vec![two]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        let a = answer(Goal::TargetDays(5.0), &[s], &["a".to_string(), "b".to_string()], &[64]);
        assert!(!a.met, "{a:?}");
        let best = a.best.unwrap();
        assert_eq!((best.cloud.as_deref(), best.usd, best.days), (Some("b"), Some(1.0e6), 10.0));
        assert!(a.why.starts_with("no priced run finishes within 5 days; the fastest takes 10.0 days"), "{}", a.why);
    }

    /// A budget no run meets answers with the cheapest run, and of runs equally cheap the
    /// faster: 64 GPUs for 100 days and 128 for 50 days both cost $1.0M, so over a $0.5M
    /// budget the nearest is 128. Kills: the nearest run to a budget chosen by cost alone
    /// (the slower 64, listed first).
    #[test]
    fn the_nearest_run_to_a_budget_is_the_fastest_of_the_cheapest() {
        let mut s = series(vec![row(64, 100.0, 1.0e6), row(128, 50.0, 1.0e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        let a = answer(Goal::Budget(5e5), &[s], &["c".to_string()], &[64, 128]);
        assert!(!a.met, "{a:?}");
        let best = a.best.unwrap();
        assert_eq!((best.gpus, best.days, best.usd), (128, 50.0, Some(1.0e6)));
        assert!(a.why.ends_with("the cheapest costs $1.00M"), "{}", a.why);
    }

    /// Of two counts with identical days and cost the fewer GPUs stay on the frontier and
    /// the other is passed over, so the reason names no step between them (a step that
    /// saves 0 days for $0 more is 0/0 per day saved). Kills: the tie-break on the row's
    /// index dropped from `frontier`'s `beats` (both rows kept; the sweet spot is still 64,
    /// but the reason read "going to 128 saves 0 days ... NaN per day saved").
    #[test]
    fn identical_counts_keep_the_fewer_gpus_and_name_no_step_between_them() {
        let mut s = series(vec![row(64, 50.0, 1.0e6), row(128, 50.0, 1.0e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        assert_eq!(s.sweet_spot, Some(64));
        assert_eq!(
            s.sweet_spot_why,
            "64 GPUs: no other count priced is faster or cheaper; passed over as beaten on both time and cost: 128 (by 64)"
        );
        let (kept, beaten) = frontier(&[(0, 50.0, 1.0e6), (1, 50.0, 1.0e6)]);
        assert_eq!((kept.len(), beaten.as_slice()), (1, [(1, 0)].as_slice()));
    }

    /// A row no cloud prices cleanly is still an answer, at its caveated quotes (the
    /// cheapest of them, as `cheapest` takes it): one row quoted only at resale ($0.5M)
    /// and at a lower bound ($0.4M) meets a $1M budget at the $0.4M quote. Kills: a row
    /// with any quote taken to have a clean one, which left no choice priced ("no row fits
    /// and is priced").
    #[test]
    fn a_row_quoted_only_at_caveated_prices_answers_a_goal() {
        let mut r = row(64, 10.0, 0.5e6);
        r.costs = vec![quote(0.5e6, &["resale"]), quote(0.4e6, &["lower-bound"])];
        let mut s = series(vec![r]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: None });
        assert_eq!(s.rows[0].cheapest, Some(1));
        let a = answer(Goal::Budget(1e6), &[s], &["a".to_string(), "b".to_string()], &[64]);
        assert!(a.met, "{a:?}");
        let best = a.best.unwrap();
        assert_eq!((best.cloud.as_deref(), best.usd, best.days), (Some("b"), Some(0.4e6), 10.0));
    }

    /// The sweet spot weighs each row at its cheapest quote, whichever column it is in:
    /// 64 GPUs for 100 days cost $1.0M on cloud a and $0.8M on b, 128 GPUs for 50 days
    /// $1.05M on a and $1.2M on b. Cheapest to cheapest, 64 -> 128 saves 50 days for
    /// $0.25M, $5,000 per day saved, over a $2,000 threshold: 64. Kills: the walk reading
    /// the first column's quotes ($50K for 50 days, $1,000 a day: 128).
    #[test]
    fn the_sweet_spot_weighs_each_rows_cheapest_quote() {
        let two = |gpus: u32, days: f64, a: f64, b: f64| Row { costs: vec![quote(a, &[]), quote(b, &[])], ..row(gpus, days, a) };
        let mut s = series(vec![two(64, 100.0, 1.0e6, 0.8e6), two(128, 50.0, 1.05e6, 1.2e6)]);
        derive(&mut s, &SweetSpotRule { max_usd_per_day_saved: Some(2000.0) });
        assert_eq!(s.sweet_spot, Some(64), "{}", s.sweet_spot_why);
        assert!(s.sweet_spot_why.starts_with("64 GPUs: going to 128 saves 50.0 days for $250.0K more, $5.0K per day saved"), "{}", s.sweet_spot_why);
    }

    /// What `run` asks each cloud for, end to end (llama3-tiny on H100, priced from a price
    /// file of one 8-GPU node at $80 an hour, billed by the second, on 1e12 tokens): the row's days x 24
    /// hours; storage for the run's length, (2 checkpoints x 14 B x every parameter + 4 B
    /// a token) x days / 30.4375 GB-months (a twelfth of a 365.25-day year); egress of the
    /// BF16 weights once, 2 B x every parameter; one node's node-hours billed. 4 and 8 GPUs
    /// round up to one whole-node count, 8: one row, said so. Kills: the run's days passed
    /// as hours, storage asked as GB rather than GB-months, egress left out of the ask, two
    /// asked counts that round to one kept as two rows.
    #[test]
    fn a_run_asks_each_cloud_for_its_hours_storage_and_egress() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("ours.csv");
        std::fs::write(
            &csv,
            "InstanceType,AcceleratorName,AcceleratorCount,Region,Price,SpotPrice,EffectiveDate,Source\n\
             h8,H100,8,r-1,80.00,,2026-12-01,a test's made-up rate\n",
        )
        .unwrap();
        let mut r = RunFile::default();
        r.model.plugin = "llama3.wasm".into();
        r.model.variant = Some("llama3-tiny".into());
        // Enough tokens that the run is billed well past the price file's 60 s minimum.
        r.model.tokens = Some(1e12);
        r.cluster.gpus = vec![4, 8];
        r.precision.format = vec!["bf16".into()];
        r.cost.plugins = vec!["lambda".into()];
        r.cost.price_file = Some(csv.to_string_lossy().into_owned());
        r.measure.repeats = 1;
        let o = run(&r, &|_, _, _| {}).unwrap();
        let rows = &o.series[0].rows;
        assert_eq!(rows.iter().map(|r| (r.requested_gpus, r.gpus)).collect::<Vec<_>>(), [(4, 8)]);
        assert!(o.notes.iter().any(|n| n == "8 GPUs are already the row for 4 rounded up to whole nodes of 8 on H100: one row"), "{:#?}", o.notes);
        let days = rows[0].days.unwrap();
        let at = o.clouds.iter().position(|c| c == "ours").unwrap();
        let q = rows[0].costs[at].quote().unwrap();
        assert_eq!((q.instance.as_str(), q.nodes, q.option.as_str()), ("h8", 1, "on-demand"));
        assert!((q.hours - days * 24.0).abs() <= 1e-12 * q.hours, "{} h for {days} days", q.hours);
        let (params, tokens) = (o.model.params_total as f64, o.model.tokens);
        let line = |category: &str| q.lines.iter().find(|l| l.category == category).unwrap_or_else(|| panic!("no {category} line: {q:?}"));
        let storage_gb = (2.0 * 14.0 * params + 4.0 * tokens) / 1e9;
        let want = storage_gb * days / 30.4375;
        assert!((line("storage").quantity - want).abs() <= 1e-9 * want, "{} GB-months, want {want}", line("storage").quantity);
        let egress = 2.0 * params / 1e9;
        assert!((line("egress").quantity - egress).abs() <= 1e-9 * egress, "{} GB, want {egress}", line("egress").quantity);
        let compute = line("compute");
        assert!(compute.unit == "node-hour" && compute.quantity >= q.hours && compute.quantity - q.hours < 1.0 / 3600.0, "{compute:?}");
    }
}
