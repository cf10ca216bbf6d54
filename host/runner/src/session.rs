//! One run, end to end: load the workload, plan its precision, measure a training step
//! on the local device, project the model onto each GPU count with the performance
//! model (`runner_project`: the best layout that fits, its step time, memory and
//! breakdown), and price every cloud. Returns an [`Outcome`] the report prints.
//!
//! A plugin that fails is named with its error; a cost plugin's failure drops that
//! cloud, a workload plugin's failure stops the run.

use serde::Serialize;

use runner_graph::count::{self, AttentionFlops, Convention, Recompute};
use runner_project::precision::Plan;
use runner_project::profile::GpuProfile;
use runner_project::project::Projector;
use runner_project::search::{self, Space};
use runner_project::step::Projection;

use crate::measure::{self, LocalMeasurement};
use crate::plugin::workload::{GraphRequest, Variant};
use crate::plugin::{self, Kind};
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

#[derive(Clone, Debug, Serialize)]
pub struct CloudCost {
    pub cloud: String,
    pub instance: String,
    pub region: String,
    pub nodes: u32,
    pub usd: f64,
}

/// What one cloud charges for one row: its cheapest quote, or why there is none. A cloud
/// whose quotes all failed is not reported as one that does not sell the GPU.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum CloudPrice {
    Quoted(CloudCost),
    NotSold,
    QuoteFailed { reason: String },
}

impl CloudPrice {
    pub fn quote(&self) -> Option<&CloudCost> {
        match self {
            CloudPrice::Quoted(c) => Some(c),
            _ => None,
        }
    }
}

/// One GPU count.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// GPUs asked for, and used: rounded up to whole nodes, so time and billing agree.
    pub requested_gpus: u32,
    pub gpus: u32,
    pub global_batch: u32,
    /// The fastest layout that fits; `None` when none does (`why_not` says why).
    pub projection: Option<Projection>,
    pub why_not: Option<String>,
    pub days: Option<f64>,
    /// Against the first row that fits.
    pub speedup: Option<f64>,
    /// GPU-hours against the first row that fits (equal to money at one price).
    pub relative_cost: Option<f64>,
    /// One entry per cloud in [`Outcome::clouds`] (not sold: nothing fits, or the cloud
    /// lists no such GPU).
    pub costs: Vec<CloudPrice>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub model: ModelSummary,
    pub gpu: GpuProfile,
    pub precision: String,
    pub plan: Plan,
    /// None where nothing could be measured here (the reason is in the notes).
    pub measurement: Option<LocalMeasurement>,
    pub clouds: Vec<String>,
    pub rows: Vec<Row>,
    /// Every plugin the run used: name, kind, contract, path (or embedded) and sha256.
    pub plugins: Vec<plugin::PluginInfo>,
    pub notes: Vec<String>,
}

/// Record a plugin the run used, in the outcome and as a note (so every output format
/// names it with its path and sha256).
fn record_plugin(plugins: &mut Vec<plugin::PluginInfo>, notes: &mut Vec<String>, info: &plugin::PluginInfo) {
    notes.push(format!("plugin: {}", info.provenance()));
    plugins.push(info.clone());
}

/// Progress callback: a short line saying what the session is doing.
pub type Progress<'a> = &'a dyn Fn(&str);

/// Run a session.
///
/// # Errors
/// A workload that cannot be loaded or described, an unknown variant, a graph that fails
/// validation, an unknown GPU or a precision the GPU or the policy cannot run: the
/// message names the plugin and what to fix.
pub fn run(run: &RunFile, progress: Progress<'_>) -> anyhow::Result<Outcome> {
    let limits = run.limits;
    let profiles = project::profiles(run.cluster.profile.as_deref().map(std::path::Path::new))?;
    let gpu = profiles.get(&run.cluster.gpu).map_err(anyhow::Error::msg)?.clone();
    let recipe = run.precision.recipe();
    gpu.peak_flops(recipe.format()).map_err(|e| anyhow::anyhow!("{e}; choose another [precision] format or GPU"))?;
    let mut notes = Vec::new();
    let mut plugins = Vec::new();

    progress(&format!("loading {}", run.model.plugin));
    let plugin = plugin::load(&run.model.plugin)?;
    record_plugin(&mut plugins, &mut notes, &plugin.info);
    let mut workload = plugin.workload(limits)?;
    let info = workload.describe()?;
    let variant: &Variant = match &run.model.variant {
        Some(name) => info.variants.iter().find(|v| &v.name == name).ok_or_else(|| {
            let names: Vec<&str> = info.variants.iter().map(|v| v.name.as_str()).collect();
            anyhow::anyhow!("{} has no variant '{name}'; it provides: {}", plugin.info.name, names.join(", "))
        })?,
        None => &info.variants[0],
    };
    let seq_len = run.model.seq_len.unwrap_or(variant.defaults.seq_len);
    let tokens = run.model.tokens.unwrap_or(variant.defaults.tokens);

    progress(&format!("building the {} graph (seq {seq_len})", variant.name));
    let found = project::Found {
        info: plugin.info.clone(),
        spec: run.model.plugin.clone(),
        family: variant.family.clone(),
        variant: variant.clone(),
    };
    let (model, source) = project::model(&found, seq_len, limits)?;
    let convention = Convention { attention: AttentionFlops::CausalHalved, recompute: Recompute::None };
    let flops_per_token = count::model_flops_per_step(&model.graph, &convention) / f64::from(seq_len);
    let params = main_model_params(&mut workload, variant)?;

    progress("planning precision");
    let (plan, policy) = match &run.precision.plugin {
        Some(spec) => project::plan_from_plugin(recipe, spec, variant, &gpu, &model.graph, limits).map(|(p, i)| (p, Some(i)))?,
        None => project::plan(recipe, variant, &gpu, &model.graph, limits)?,
    };
    if let Some(info) = &policy {
        record_plugin(&mut plugins, &mut notes, info);
    }
    notes.push(format!("precision plan: {}", plan.summary()));
    if plan.source == "built-in" {
        notes.push(format!(
            "no {recipe}.wasm precision plugin is installed: the built-in {recipe} plan is used (linears of the \
             transformer layers in {}, embedding, head and routers in BF16)",
            recipe.format()
        ));
    }

    progress("measuring a training step on the local device");
    let measurement = match measure::measure(&mut workload, &info, variant, &run.measure) {
        Ok(m) => {
            notes.push(m.summary());
            Some(m)
        }
        Err(e) => {
            notes.push(format!("not measured on this device: {e:#}"));
            None
        }
    };

    let option = parse_option(&run.cost.option).map_err(anyhow::Error::msg)?;
    let mut clouds: Vec<(String, plugin::cost::CostModel, Vec<plugin::cost::Offering>)> = Vec::new();
    let cost_specs: Vec<String> =
        if run.cost.plugins.is_empty() { project::installed_specs(Kind::Cost) } else { run.cost.plugins.clone() };
    for spec in &cost_specs {
        progress(&format!("loading prices from {spec}"));
        let loaded = plugin::load(spec).inspect(|p| record_plugin(&mut plugins, &mut notes, &p.info)).and_then(|p| p.cost(limits)).and_then(|mut c| {
            let provider = c.provider()?;
            let offerings = c.offerings()?;
            Ok((provider.name, c, offerings))
        });
        match loaded {
            Ok(cloud) => clouds.push(cloud),
            Err(e) => notes.push(format!("skipped a cloud: {e}")),
        }
    }

    let mut projector = Projector::new(model, Box::new(source), gpu.clone(), plan.clone());
    let node = gpu.gpus_per_node.max(1);
    let mut rows = Vec::new();
    let mut first: Option<(f64, u32)> = None;
    let mut gbs_notes: Vec<String> = Vec::new();
    let mut quote_notes = QuoteNotes::default();
    for &asked in &run.cluster.gpus {
        let n = asked.div_ceil(node) * node;
        let (gbs, why) = match run.cluster.gbs {
            Some(g) => (g, format!("GBS {g} from the run")),
            None => project::default_gbs(variant, &gpu, recipe, n),
        };
        gbs_notes.push(why);
        progress(&format!("searching layouts for {n} {}", gpu.name));
        let found = search::search(&mut projector, n, gbs, &Space::default(), 1);
        let best = found.best.into_iter().next();
        let why_not = match &best {
            Some(_) => None,
            None => Some(nothing_fits(&found.families)),
        };
        let days = best.as_ref().map(|p| tokens / (p.tokens_per_sec_per_gpu * f64::from(n)) / 86_400.0);
        let (speedup, relative_cost) = match days {
            Some(d) => {
                let (d0, n0) = *first.get_or_insert((d, n));
                (Some(d0 / d), Some((d * f64::from(n)) / (d0 * f64::from(n0))))
            }
            None => (None, None),
        };
        let mut costs = Vec::new();
        for (name, model, offerings) in clouds.iter_mut() {
            costs.push(match days {
                Some(d) => {
                    progress(&format!("pricing {n} GPUs on {name}"));
                    cheapest(name, model, offerings, &gpu, n, d * 24.0, &run.cost.region, option, &mut quote_notes)
                }
                None => CloudPrice::NotSold,
            });
        }
        rows.push(Row {
            requested_gpus: asked,
            gpus: n,
            global_batch: gbs,
            projection: best,
            why_not,
            days,
            speedup,
            relative_cost,
            costs,
        });
    }
    notes.extend(gbs_notes);
    notes.extend(quote_notes.finish());
    if rows.iter().any(|r| r.gpus != r.requested_gpus) {
        notes.push(format!("GPU counts rounded up to whole {}-GPU nodes of {}, as they are billed", node, gpu.name));
    }
    notes.push(format!(
        "modelled: the best layout per GPU count from the layout search over the sharded per-rank graph \
         (runner_project); GPU profile {} ({}; efficiencies {})",
        gpu.name,
        profiles.origin.join(" + "),
        gpu.efficiency.fitted
    ));
    notes.push(format!("FLOPs: {convention}; MFU against the {} dense peak", recipe.format()));

    // Cheapest cloud first (by the first priced row; clouds without the GPU last), so
    // the table reads left to right from the best offer.
    let mut order: Vec<usize> = (0..clouds.len()).collect();
    let first_cost = |i: usize| rows.iter().find_map(|r| r.costs[i].quote()).map_or(f64::INFINITY, |c| c.usd);
    order.sort_by(|&a, &b| first_cost(a).total_cmp(&first_cost(b)));
    for row in &mut rows {
        let mut costs = std::mem::take(&mut row.costs);
        row.costs = order.iter().map(|&i| std::mem::replace(&mut costs[i], CloudPrice::NotSold)).collect();
    }
    let cloud_names: Vec<String> = order.iter().map(|&i| clouds[i].0.clone()).collect();

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
        gpu,
        precision: recipe.name().into(),
        plan,
        measurement,
        clouds: cloud_names,
        rows,
        plugins,
        notes,
    })
}

/// Why no layout fits: the family that came closest.
fn nothing_fits(families: &[search::Family]) -> String {
    use search::Verdict;
    let closest = families
        .iter()
        .filter_map(|f| match &f.verdict {
            Verdict::Memory { layout, need_gib, have_gib } => Some((need_gib, have_gib, layout, &f.name)),
            _ => None,
        })
        .min_by(|a, b| a.0.total_cmp(b.0));
    match closest {
        Some((need, have, layout, fam)) => format!(
            "nothing fits: the least memory any layout needs is {need:.0} GiB per GPU ({fam}: {layout}) of {have:.0} GiB"
        ),
        None => "no layout divides the model and the batch at this GPU count".into(),
    }
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

/// Quote failures, said once each and at most [`QuoteNotes::MAX`] times in all: a plugin
/// that refuses every quote must not flood the notes (nor make collecting them quadratic).
#[derive(Default)]
struct QuoteNotes {
    seen: std::collections::HashSet<String>,
    lines: Vec<String>,
    dropped: usize,
}

impl QuoteNotes {
    const MAX: usize = 20;

    fn push(&mut self, line: String) {
        if self.seen.contains(&line) {
            return;
        }
        if self.lines.len() < Self::MAX {
            self.seen.insert(line.clone());
            self.lines.push(line);
        } else {
            self.dropped += 1;
        }
    }

    fn finish(mut self) -> Vec<String> {
        if self.dropped > 0 {
            self.lines
                .push(format!("... and {} more quote failures", self.dropped));
        }
        self.lines
    }
}

/// Quotes asked of one cloud for one GPU count, at most: a price list with thousands of
/// matching offerings and regions costs bounded time.
const MAX_QUOTES: usize = 256;

/// The cheapest quote `model` gives for `gpus` GPUs of `gpu` over `hours`, among its
/// offerings of that GPU and their prices for `option` (in `region`, if one is given).
/// `NotSold` when it lists no such offering and price; `QuoteFailed` when it lists some but
/// no quote came back (each failure is noted).
#[allow(
    clippy::too_many_arguments,
    reason = "one call site; a struct would only rename the arguments"
)]
fn cheapest(
    cloud: &str,
    model: &mut plugin::cost::CostModel,
    offerings: &[plugin::cost::Offering],
    gpu: &GpuProfile,
    gpus: u32,
    hours: f64,
    region: &str,
    option: plugin::cost::PurchaseOption,
    notes: &mut QuoteNotes,
) -> CloudPrice {
    let mut best: Option<CloudCost> = None;
    let mut asked = 0;
    let mut failure = None;
    for o in offerings
        .iter()
        .filter(|o| o.gpu.eq_ignore_ascii_case(&gpu.name) || gpu.aliases.iter().any(|a| a.eq_ignore_ascii_case(&o.gpu)))
    {
        // Whole nodes, bought in the offering's multiples (validated non-zero).
        let Some(nodes) = gpus
            .div_ceil(o.gpus_per_node)
            .checked_next_multiple_of(o.node_multiple)
        else {
            continue;
        };
        for p in o
            .prices
            .iter()
            .filter(|p| p.option == option && (region.is_empty() || p.region == region))
        {
            if asked == MAX_QUOTES {
                notes.push(format!(
                    "{cloud}: stopped after {MAX_QUOTES} quotes for {gpus} GPUs"
                ));
                break;
            }
            asked += 1;
            let request = plugin::cost::QuoteRequest {
                instance: o.instance.clone(),
                gpus,
                nodes,
                hours,
                region: p.region.clone(),
                option,
                start_date: String::new(),
                storage_gb_months: 0.0,
                egress_gb: 0.0,
            };
            match model.quote(&request) {
                Ok(q) if q.currency != "USD" => {
                    notes.push(format!(
                        "{cloud}: a quote in {} is not compared with USD quotes",
                        q.currency
                    ));
                }
                Ok(q) => {
                    if best.as_ref().is_none_or(|b| q.total < b.usd) {
                        best = Some(CloudCost {
                            cloud: cloud.to_string(),
                            instance: o.instance.clone(),
                            region: p.region.clone(),
                            nodes,
                            usd: q.total,
                        });
                    }
                }
                Err(e) => {
                    let line = format!("skipped a quote: {e}");
                    failure.get_or_insert_with(|| line.clone());
                    notes.push(line);
                }
            }
        }
    }
    match (best, failure) {
        (Some(c), _) => CloudPrice::Quoted(c),
        (None, Some(reason)) => CloudPrice::QuoteFailed { reason },
        (None, None) => CloudPrice::NotSold,
    }
}
