//! One run, end to end: load the workload, measure locally, project onto each GPU count,
//! price every cloud, and return an [`Outcome`] the report prints.
//!
//! The projection here is the simple, honest placeholder the Foundation issue allows:
//! training FLOPs (from the host's FLOP counter over the plugin's graph) over an assumed
//! fraction of the GPU's dense peak. It is labelled as such in every output. A plugin that
//! fails is named with its error; a cost plugin's failure drops that cloud, a workload
//! plugin's failure stops the run.

use serde::Serialize;

use runner_graph::count::{self, AttentionFlops, Convention, Recompute};

use crate::gpus::{self, GpuProfile};
use crate::measure::{self, LocalMeasurement};
use crate::plugin::workload::{GraphRequest, Variant};
use crate::plugin::{self, Kind};
use crate::runfile::{Format, RunFile, parse_option};

/// Assumed model-FLOPs utilisation of dense peak, per precision. Placeholder constants
/// near the published H100 reference runs (BF16 MFU 0.5-0.59, FP8 0.37-0.43 against the
/// FP8 peak; data/calibration.toml), used until the projection model lands.
const ASSUMED_MFU_BF16: f64 = 0.50;
const ASSUMED_MFU_FP8: f64 = 0.38;

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

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub gpus: u32,
    pub days: f64,
    pub speedup: f64,
    /// GPU-hours relative to the first row (equal to cost relative at a fixed price).
    pub relative_cost: f64,
    /// One entry per cloud in [`Outcome::clouds`].
    pub costs: Vec<CloudPrice>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub model: ModelSummary,
    pub gpu: GpuProfile,
    pub precision: String,
    pub assumed_mfu: f64,
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
fn record_plugin(
    plugins: &mut Vec<plugin::PluginInfo>,
    notes: &mut Vec<String>,
    info: &plugin::PluginInfo,
) {
    notes.push(format!("plugin: {}", info.provenance()));
    plugins.push(info.clone());
}

/// Progress callback: a short line saying what the session is doing.
pub type Progress<'a> = &'a dyn Fn(&str);

/// Run a session.
///
/// # Errors
/// A workload that cannot be loaded or described, an unknown variant, a graph that fails
/// validation: the message names the plugin and what to fix.
pub fn run(run: &RunFile, progress: Progress<'_>) -> anyhow::Result<Outcome> {
    let limits = run.limits;
    let gpu = gpus::profile(&run.cluster.gpu).map_err(anyhow::Error::msg)?;
    let mut notes = Vec::new();
    let mut plugins = Vec::new();

    progress(&format!("loading {}", run.model.plugin));
    let plugin = plugin::load(&run.model.plugin)?;
    record_plugin(&mut plugins, &mut notes, &plugin.info);
    let mut workload = plugin.workload(limits)?;
    let info = workload.describe()?;
    let variant: &Variant = match &run.model.variant {
        Some(name) => info
            .variants
            .iter()
            .find(|v| &v.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = info.variants.iter().map(|v| v.name.as_str()).collect();
                anyhow::anyhow!(
                    "{} has no variant '{name}'; it provides: {}",
                    plugin.info.name,
                    names.join(", ")
                )
            })?,
        None => &info.variants[0],
    };
    let seq_len = run.model.seq_len.unwrap_or(variant.defaults.seq_len);
    let tokens = run.model.tokens.unwrap_or(variant.defaults.tokens);

    progress(&format!(
        "building the {} graph (seq {seq_len})",
        variant.name
    ));
    let graph = workload.graph(&GraphRequest::training(&variant.name, seq_len, 1, 0))?;
    let convention = Convention {
        attention: AttentionFlops::CausalHalved,
        recompute: Recompute::None,
    };
    let flops_per_token = count::model_flops_per_step(&graph, &convention) / f64::from(seq_len);
    let params = main_model_params(&mut workload, variant)?;

    progress(&format!("planning precision with {}", run.precision.plugin));
    let (plan_summary, planned_fp8, policy_info) =
        plan_precision(&run.precision.plugin, limits, variant, gpu.name, &graph)?;
    record_plugin(&mut plugins, &mut notes, &policy_info);
    notes.push(plan_summary);
    if run.precision.format == Format::Fp8 && !planned_fp8 {
        notes.push(format!(
            "[precision] format = \"fp8\" projects with the FP8 peak, but {} planned no FP8 GEMM",
            run.precision.plugin
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

    let (peak_tflops, assumed_mfu, precision) = match run.precision.format {
        Format::Bf16 => (gpu.bf16_tflops, ASSUMED_MFU_BF16, "BF16"),
        Format::Fp8 if gpu.fp8_tflops > 0.0 => (gpu.fp8_tflops, ASSUMED_MFU_FP8, "FP8"),
        Format::Fp8 => anyhow::bail!(
            "{} has no FP8 peak; use format = \"bf16\" under [precision]",
            gpu.name
        ),
    };
    notes.push(format!(
        "modelled: time = training FLOPs / (GPUs x {peak_tflops} TFLOP/s {precision} dense peak x assumed MFU {assumed_mfu:.2}); \
         a placeholder with perfect scaling until the projection model lands (the local measurement does not feed it yet)"
    ));
    notes.push(format!("FLOPs: {convention}"));

    let option = parse_option(&run.cost.option).map_err(anyhow::Error::msg)?;
    let mut clouds: Vec<(String, plugin::cost::CostModel, Vec<plugin::cost::Offering>)> =
        Vec::new();
    let cost_specs: Vec<String> = if run.cost.plugins.is_empty() {
        installed_cost_plugins()
    } else {
        run.cost.plugins.clone()
    };
    for spec in &cost_specs {
        progress(&format!("loading prices from {spec}"));
        let loaded = plugin::load(spec)
            .inspect(|p| record_plugin(&mut plugins, &mut notes, &p.info))
            .and_then(|p| p.cost(limits))
            .and_then(|mut c| {
                let provider = c.provider()?;
                let offerings = c.offerings()?;
                Ok((provider.name, c, offerings))
            });
        match loaded {
            Ok(cloud) => clouds.push(cloud),
            Err(e) => notes.push(format!("skipped a cloud: {e}")),
        }
    }

    let total_flops = flops_per_token * tokens;
    let mut quote_notes = QuoteNotes::default();
    let mut rows = Vec::new();
    let mut first: Option<(f64, u32)> = None;
    for &n in &run.cluster.gpus {
        let seconds = total_flops / (f64::from(n) * peak_tflops * 1e12 * assumed_mfu);
        let days = seconds / 86_400.0;
        let (d0, n0) = *first.get_or_insert((days, n));
        let mut costs = Vec::new();
        for (name, model, offerings) in clouds.iter_mut() {
            progress(&format!("pricing {n} GPUs on {name}"));
            costs.push(cheapest(
                name,
                model,
                offerings,
                &gpu,
                n,
                days * 24.0,
                &run.cost.region,
                option,
                &mut quote_notes,
            ));
        }
        rows.push(Row {
            gpus: n,
            days,
            speedup: d0 / days,
            relative_cost: (days * f64::from(n)) / (d0 * f64::from(n0)),
            costs,
        });
    }

    notes.extend(quote_notes.finish());

    // Cheapest cloud first (by the first row's quote; clouds without the GPU last), so the
    // table reads left to right from the best offer.
    let mut order: Vec<usize> = (0..clouds.len()).collect();
    let first_cost = |i: usize| {
        rows.first()
            .and_then(|r| r.costs[i].quote())
            .map_or(f64::INFINITY, |c| c.usd)
    };
    order.sort_by(|&a, &b| first_cost(a).total_cmp(&first_cost(b)));
    for row in &mut rows {
        let mut costs = std::mem::take(&mut row.costs);
        row.costs = order
            .iter()
            .map(|&i| std::mem::replace(&mut costs[i], CloudPrice::NotSold))
            .collect();
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
        precision: precision.into(),
        assumed_mfu,
        measurement,
        clouds: cloud_names,
        rows,
        plugins,
        notes,
    })
}

/// Parameters of the main model: a graph asked for with all its layers carries no
/// multi-token-prediction modules, which published parameter counts leave out (DeepSeek-V3's
/// 671B). FLOPs still come from the full training graph, MTP included.
pub fn main_model_params(
    workload: &mut plugin::workload::Workload,
    variant: &Variant,
) -> anyhow::Result<count::ParamCount> {
    let g = workload.graph(&GraphRequest::training(
        &variant.name,
        1,
        1,
        variant.hyper.layers,
    ))?;
    Ok(count::params(&g))
}

/// Ask the precision policy for a plan over every GEMM site of the graph (forward,
/// input-gradient and weight-gradient per linear), for the GPU the run projects onto, and
/// summarise the formats it chose for the weights.
fn plan_precision(
    spec: &str,
    limits: plugin::Limits,
    variant: &Variant,
    gpu: &str,
    graph: &runner_graph::Graph,
) -> anyhow::Result<(String, bool, plugin::PluginInfo)> {
    use plugin::precision::{GemmRole, GemmSite, PlanRequest};
    use runner_graph::OpKind;
    let mut policy = plugin::load(spec)?.precision(limits)?;
    let mut sites = Vec::new();
    for op in graph
        .ops
        .iter()
        .filter(|o| matches!(o.kind, OpKind::Linear | OpKind::GroupedLinear))
    {
        let w = graph.tensor(op.inputs[1]);
        let (n, k) = (w.shape[w.shape.len() - 2], w.shape[w.shape.len() - 1]);
        let m = graph.tensor(op.inputs[0]).numel() / k.max(1);
        for role in [
            GemmRole::Forward,
            GemmRole::InputGradient,
            GemmRole::WeightGradient,
        ] {
            sites.push(GemmSite {
                layer: op.layer,
                name: op.name.clone(),
                role,
                m,
                n,
                k,
            });
        }
    }
    let count = sites.len();
    let plan = policy.plan(&PlanRequest {
        model: variant.name.clone(),
        layers: variant.hyper.layers,
        device: plugin::precision::device_capabilities(gpu),
        sites,
        state: Vec::new(),
    })?;
    let mut formats: Vec<(String, usize)> = Vec::new();
    for site in &plan.sites {
        let name = plugin::precision::dtype_name(site.weight.format).to_string();
        match formats.iter_mut().find(|(f, _)| *f == name) {
            Some((_, c)) => *c += 1,
            None => formats.push((name, 1)),
        }
    }
    let parts: Vec<String> = formats
        .iter()
        .map(|(f, c)| format!("{f} {:.0}%", 100.0 * *c as f64 / count.max(1) as f64))
        .collect();
    let fp8 = plan
        .sites
        .iter()
        .any(|s| plugin::precision::is_low_precision(s.weight.format));
    Ok((
        format!(
            "precision plan from {}: {count} GEMM sites, {}",
            policy.info.name,
            parts.join(", ")
        ),
        fp8,
        policy.info,
    ))
}

/// Every cost plugin installed (plugin directories first, then embedded), one per name.
fn installed_cost_plugins() -> Vec<String> {
    let mut names = Vec::new();
    for (info, shadowed) in plugin::list() {
        if let (Ok(info), false) = (info, shadowed)
            && info.kind == Kind::Cost
        {
            names.push(match &info.source {
                plugin::Source::Path(p) => p.display().to_string(),
                plugin::Source::Embedded => info.name.clone(),
            });
        }
    }
    names
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
        .filter(|o| o.gpu.eq_ignore_ascii_case(gpu.name))
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
