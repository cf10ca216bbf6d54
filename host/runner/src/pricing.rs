//! Pricing a projected run on the clouds: which offering and price row each cloud's
//! cheapest quote came from, itemised (GPU time, checkpoint and data storage, egress),
//! with spot time inflated by a stated interruption assumption, and every figure tied to
//! the plugin (name, sha256) and the price row (instance, region, option, date, source)
//! it came from.
//!
//! Prices a source marks as lower bounds, resale or suspect are quoted but only chosen
//! when a cloud has no clean price for the GPU, and then the quote says so in its caveats.

use serde::{Deserialize, Serialize};

use crate::plugin::cost::{CostModel, LineCategory, Offering, PriceCaveat, PurchaseOption, QuoteRequest};
use crate::plugin::{self, Limits, PluginInfo};
use runner_project::profile::GpuProfile;

/// One line of a quote.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Line {
    pub item: String,
    pub category: String,
    pub quantity: f64,
    pub unit: String,
    pub amount: f64,
    /// An estimate rather than a list price.
    pub estimate: bool,
}

/// A cloud's cheapest quote for one row, and where every number came from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CloudCost {
    pub cloud: String,
    /// The cost plugin and its sha256.
    pub plugin: String,
    pub plugin_sha256: String,
    pub instance: String,
    pub region: String,
    pub option: String,
    pub nodes: u32,
    /// The price row: its effective date (empty: the source gives none) and source.
    pub price_date: String,
    pub price_source: String,
    /// lower-bound, resale, suspect: why the price must not be taken at face value.
    pub caveats: Vec<String>,
    pub currency: String,
    pub usd: f64,
    /// Hours of use the quote was asked for: the run's (spot: inflated by the interruption
    /// assumption), before the cloud's billing rounds them.
    pub hours: f64,
    /// Hours billed per node, from the quote's compute lines: rounded to the billing
    /// increment, at least the minimum, whole days of capacity blocks, whole terms of a
    /// commitment. None where the lines do not say (a unit other than node- or GPU-hours).
    #[serde(default)]
    pub billed_hours: Option<f64>,
    /// Storage was asked for but the cloud prices none (no list price known): the quote
    /// leaves out a cost other quotes include, so it reads cheaper than the run is.
    #[serde(default)]
    pub storage_not_costed: bool,
    pub lines: Vec<Line>,
    pub warnings: Vec<String>,
}

impl CloudCost {
    /// "p5.48xlarge us-east-1 on-demand 2026-11-09": the price row, for notes and cells.
    pub fn row(&self) -> String {
        let date = if self.price_date.is_empty() { "undated" } else { &self.price_date };
        format!("{} {} {} {date}", self.instance, self.region, self.option)
    }

    /// The wall-clock days the run takes as this quote bills it: the projection's
    /// `run_days`, or on spot the hours the quote assumes, interruptions included. Goals,
    /// the sweet spot and the tables all read a quote's days here, so a spot run is never
    /// compared on days it does not take while billed for the longer ones.
    pub fn days(&self, run_days: f64) -> f64 {
        // Only spot stretches `hours`; elsewhere the projection's figure is kept as is
        // (hours / 24 may differ from it in the last bit).
        if self.option == crate::plugin::cost::option_name(PurchaseOption::Spot) { self.hours / 24.0 } else { run_days }
    }
}

/// What one cloud charges for one row: its cheapest quote, or why there is none. A cloud
/// whose quotes all failed is not reported as one that does not sell the GPU.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
#[allow(clippy::large_enum_variant, reason = "one per row and cloud; boxing would only add an indirection to every read")]
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

/// What the quotes assume beyond the price lists, stated in every report (the run file's
/// `[assumptions]`).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Assumptions {
    /// Spot: interruptions per node per day, hours between checkpoints, hours to restart.
    pub spot_interruptions_per_node_day: f64,
    pub checkpoint_interval_h: f64,
    pub restart_h: f64,
    /// Checkpoints kept in storage at once.
    pub checkpoints_kept: u32,
    /// Bytes per parameter of a training checkpoint (BF16 weights, fp32 master weights and
    /// two AdamW moments: 2 + 4 + 8).
    pub checkpoint_bytes_per_param: f64,
    /// Bytes per training token of the tokenised data set (int32 token ids).
    pub data_bytes_per_token: f64,
    /// The trained weights (BF16) copied out of the cloud once.
    pub egress_bytes_per_param: f64,
}

impl Default for Assumptions {
    fn default() -> Assumptions {
        Assumptions {
            spot_interruptions_per_node_day: 1.0 / 30.0,
            checkpoint_interval_h: 1.0,
            restart_h: 0.25,
            checkpoints_kept: 2,
            checkpoint_bytes_per_param: 14.0,
            data_bytes_per_token: 4.0,
            egress_bytes_per_param: 2.0,
        }
    }
}

impl Assumptions {
    /// Every figure finite and in a range that means something.
    ///
    /// # Errors
    /// Names the field, its value and the range.
    pub fn check(&self) -> Result<(), String> {
        let fields = [
            ("spot_interruptions_per_node_day", self.spot_interruptions_per_node_day, 0.0, 24.0, true),
            ("checkpoint_interval_h", self.checkpoint_interval_h, 0.0, 1e4, false),
            ("restart_h", self.restart_h, 0.0, 1e4, true),
            ("checkpoint_bytes_per_param", self.checkpoint_bytes_per_param, 0.0, 1e3, true),
            ("data_bytes_per_token", self.data_bytes_per_token, 0.0, 1e3, true),
            ("egress_bytes_per_param", self.egress_bytes_per_param, 0.0, 1e3, true),
        ];
        for (name, v, lo, hi, zero_ok) in fields {
            let ok = v.is_finite() && v <= hi && (v > lo || (zero_ok && v == lo));
            if !ok {
                let low = if zero_ok { "at least" } else { "above" };
                return Err(format!("{name} is {}; it must be {low} {lo} and at most {hi}", runner_contract::text::number(v)));
            }
        }
        if self.checkpoints_kept > 1000 {
            return Err(format!("checkpoints_kept is {}; at most 1000", self.checkpoints_kept));
        }
        Ok(())
    }

    /// Wall-clock hours a spot run of `hours` needs on `nodes` nodes: each interruption
    /// (any node's) loses half a checkpoint interval plus the restart; interruptions
    /// arrive at nodes x the per-node rate. `None` when the interruptions take nine tenths
    /// of the time or more: a run ten times as long as its work, or one that never finishes
    /// (all of it lost), is not quoted.
    pub fn spot_hours(&self, hours: f64, nodes: u32) -> Option<f64> {
        let rate = f64::from(nodes) * self.spot_interruptions_per_node_day / 24.0;
        let lost = rate * (self.checkpoint_interval_h / 2.0 + self.restart_h);
        (lost < 0.9).then(|| hours / (1.0 - lost))
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        format!(
            "quotes assume: spot capacity interrupted {:.3} times per node-day, each interruption losing half a \
             {:.1} h checkpoint interval plus a {:.2} h restart (spot hours inflated accordingly); storage for {} \
             checkpoints of {:.0} bytes per parameter and the data set at {:.0} bytes per token, for the length of \
             the run; egress of the trained weights ({:.0} bytes per parameter) once",
            self.spot_interruptions_per_node_day,
            self.checkpoint_interval_h,
            self.restart_h,
            self.checkpoints_kept,
            self.checkpoint_bytes_per_param,
            self.data_bytes_per_token,
            self.egress_bytes_per_param
        )
    }
}

/// A cloud loaded for pricing.
pub struct Cloud {
    pub name: String,
    pub info: PluginInfo,
    model: CostModel,
    offerings: Vec<Offering>,
    /// Why it is not asked again: its first quote that ran past the deadline, trapped or
    /// ran out of memory. Such a plugin would cost the deadline again for every quote of
    /// every row (a hanging one 10 s each), as `offerings` failing leaves a cloud out.
    given_up: Option<String>,
}

/// A price's region for "the same price in every region" (Lambda's list).
pub const ANY_REGION: &str = "*";

/// Whether a price in `priced` applies to a run asked in `asked` (empty: any region).
/// Case is ignored: clouds spell regions in lower case, users may not.
pub(crate) fn in_region(priced: &str, asked: &str) -> bool {
    asked.is_empty() || priced.eq_ignore_ascii_case(asked) || priced == ANY_REGION
}

impl Cloud {
    /// The regions its offerings are priced in ([`ANY_REGION`] among them when a price
    /// holds in all).
    pub fn regions(&self) -> std::collections::BTreeSet<&str> {
        self.offerings.iter().flat_map(|o| o.prices.iter().map(|p| p.region.as_str())).collect()
    }

    /// Its instances whose GPU is none of `gpus` (by name or alias): never priced.
    pub fn unknown_gpus<'a>(&'a self, gpus: &[GpuProfile]) -> Vec<(&'a str, &'a str)> {
        unknown_gpus(&self.offerings, gpus)
    }

    /// Its offerings of a GPU in `gpus` on another node than that GPU's profile: never
    /// quoted.
    pub fn other_nodes<'a>(&'a self, gpus: &'a [GpuProfile]) -> Vec<(&'a Offering, &'a GpuProfile)> {
        other_nodes(&self.offerings, gpus)
    }

    /// How many instances it offers.
    pub fn offering_count(&self) -> usize {
        self.offerings.len()
    }

    /// What it sells, at which prices.
    pub fn offerings(&self) -> &[Offering] {
        &self.offerings
    }

    /// Whether it sells in `region`.
    pub fn sells_in(&self, region: &str) -> bool {
        self.offerings.iter().flat_map(|o| &o.prices).any(|p| in_region(&p.region, region))
    }
}

/// Load the cost plugin `spec` (with `input` on its stdin: a user's price file).
///
/// # Errors
/// The plugin cannot be loaded, or its provider or offerings call fails (a price file's
/// bad rows are named in the message).
pub fn load(spec: &str, input: Option<Vec<u8>>, limits: Limits) -> Result<Cloud, plugin::PluginError> {
    let p = plugin::load(spec)?;
    let info = p.info.clone();
    let mut model = match input {
        Some(data) => p.cost_with_input(limits, data)?,
        None => p.cost(limits)?,
    };
    let provider = model.provider()?;
    let offerings = model.offerings()?;
    Ok(Cloud { name: provider.name, info, model, offerings, given_up: None })
}

/// Quote failures, said once each and at most [`QuoteNotes::MAX`] times in all: a plugin
/// that refuses every quote must not flood the notes (nor make collecting them quadratic).
#[derive(Default)]
pub struct QuoteNotes {
    seen: std::collections::HashSet<String>,
    lines: Vec<String>,
    dropped: usize,
}

impl QuoteNotes {
    const MAX: usize = 20;

    pub fn push(&mut self, line: String) {
        if self.seen.contains(&line) {
            return;
        }
        if self.lines.len() < Self::MAX {
            self.lines.push(line.clone());
        } else {
            // Counted once too: one failure said again for every row is one more, not many.
            self.dropped += 1;
        }
        self.seen.insert(line);
    }

    pub fn finish(mut self) -> Vec<String> {
        if self.dropped > 0 {
            self.lines.push(format!("... and {} more quote failures", self.dropped));
        }
        self.lines
    }
}

/// Quotes asked of one cloud for one row, at most: a price list with thousands of
/// matching offerings and regions costs bounded time.
const MAX_QUOTES: usize = 256;

/// What a row asks of a cloud.
pub struct Ask<'a> {
    pub gpu: &'a GpuProfile,
    pub gpus: u32,
    pub hours: f64,
    pub region: &'a str,
    pub option: PurchaseOption,
    pub storage_gb_months: f64,
    pub egress_gb: f64,
}

pub(crate) fn caveat_name(c: PriceCaveat) -> &'static str {
    match c {
        PriceCaveat::LowerBound => "lower-bound",
        PriceCaveat::Resale => "resale",
        PriceCaveat::Suspect => "suspect",
    }
}

fn category(c: LineCategory) -> &'static str {
    match c {
        LineCategory::Compute => "compute",
        LineCategory::Upfront => "upfront",
        LineCategory::Storage => "storage",
        LineCategory::Egress => "egress",
        LineCategory::Network => "network",
        LineCategory::Support => "support",
        LineCategory::Discount => "discount",
        LineCategory::Other => "other",
    }
}

impl Cloud {
    /// The cheapest quote for `ask`: among clean prices first; among caveated ones (the
    /// quote then carries the caveats) only when there is no clean one.
    ///
    /// After a quote that hung, trapped or ran out of memory the cloud is not asked again
    /// in this run: each later row fails at once with that first failure (said once in the
    /// notes).
    pub fn cheapest(&mut self, ask: &Ask<'_>, assumptions: &Assumptions, notes: &mut QuoteNotes) -> CloudPrice {
        let Cloud { name, info, model, offerings, given_up } = self;
        cheapest_unless_given_up(name, info, offerings, given_up, ask, assumptions, notes, |request| model.quote(request))
    }
}

/// [`cheapest_of`], unless `given_up` says why the cloud is not asked again; sets it on a
/// quote that hung, trapped or ran out of memory.
#[allow(clippy::too_many_arguments, reason = "Cloud::cheapest's fields, apart so that a test can stand in for the plugin")]
fn cheapest_unless_given_up(
    name: &str,
    info: &PluginInfo,
    offerings: &[Offering],
    given_up: &mut Option<String>,
    ask: &Ask<'_>,
    assumptions: &Assumptions,
    notes: &mut QuoteNotes,
    mut quote: impl FnMut(&QuoteRequest) -> Result<crate::plugin::cost::Quote, plugin::PluginError>,
) -> CloudPrice {
    if let Some(reason) = given_up {
        return CloudPrice::QuoteFailed { reason: reason.clone() };
    }
    let mut broken: Option<plugin::PluginError> = None;
    let price = cheapest_of(name, info, offerings, ask, assumptions, notes, |request| give_up_after(&mut broken, || quote(request)));
    if let Some(e) = broken {
        // The row's reason is the failure's note, which the notes say once.
        *given_up = Some(format!("skipped a quote: {e}"));
        notes.push(format!("{name}: not asked for quotes again in this run after that failure: its later rows say failed"));
    }
    price
}

/// `quote()`, unless an earlier call of the same cloud hung, trapped or ran out of memory:
/// then that failure again, without calling the plugin. The first such failure is kept in
/// `broken`.
fn give_up_after(
    broken: &mut Option<plugin::PluginError>,
    quote: impl FnOnce() -> Result<crate::plugin::cost::Quote, plugin::PluginError>,
) -> Result<crate::plugin::cost::Quote, plugin::PluginError> {
    if let Some(e) = broken {
        return Err(e.clone());
    }
    let got = quote();
    if let Err(e) = &got
        && matches!(e.failure, plugin::Failure::Timeout { .. } | plugin::Failure::Trap { .. } | plugin::Failure::OutOfMemory { .. })
    {
        *broken = Some(e.clone());
    }
    got
}

/// [`Cloud::cheapest`] over `offerings`, each quote asked of `quote` (the cloud's plugin; a
/// test's stand-in).
fn cheapest_of(
    name: &str,
    info: &PluginInfo,
    offerings: &[Offering],
    ask: &Ask<'_>,
    assumptions: &Assumptions,
    notes: &mut QuoteNotes,
    mut quote: impl FnMut(&QuoteRequest) -> Result<crate::plugin::cost::Quote, plugin::PluginError>,
) -> CloudPrice {
    // Every price that could answer the row, with its list-price floor: the contract
    // refuses a USD quote below the list price of what was asked (`validate_quote`, checked
    // on every quote the host takes), so no quote of a price can beat its floor. Quoting
    // in the order of the floors and stopping at the first floor above the best quote
    // finds the quote the exhaustive loop would, in a call or two for honest plugins,
    // where a list of 4096 offerings in 64 regions took 256 calls a row (52 s).
    struct Candidate<'a> {
        offering: &'a Offering,
        price: &'a crate::plugin::cost::Price,
        nodes: u32,
        hours: f64,
        floor: f64,
        /// Clean prices (0) before caveated ones (1).
        slot: usize,
        /// Its place in the list's order.
        met: usize,
    }
    let mut candidates = Vec::new();
    let mut any = false;
    for o in offerings.iter().filter(|o| matches_gpu(o, ask.gpu) && same_node(o, ask.gpu)) {
        let Some(nodes) = crate::plugin::cost::nodes_for(o, ask.gpus) else {
            continue;
        };
        for p in o.prices.iter().filter(|p| p.option == ask.option && in_region(&p.region, ask.region)) {
            any = true;
            let hours = if ask.option == PurchaseOption::Spot {
                match assumptions.spot_hours(ask.hours, nodes) {
                    Some(h) => h,
                    None => {
                        notes.push(format!(
                            "{name}: spot on {nodes} nodes is interrupted faster than it checkpoints; not quoted"
                        ));
                        continue;
                    }
                }
            } else {
                ask.hours
            };
            // `list_price_floor` of the request, without its search of the list by name.
            let billed_h = runner_contract::cost::billed_seconds(hours, p.billing_increment_s, p.minimum_charge_s) / 3600.0;
            let floor = f64::from(nodes) * (billed_h * p.usd_per_node_hour + p.upfront_usd_per_node);
            candidates.push(Candidate { offering: o, price: p, nodes, hours, floor, slot: usize::from(!p.caveats.is_empty()), met: candidates.len() });
        }
    }
    // Stable: among equal floors the list's order, as the exhaustive loop met them.
    candidates.sort_by(|a, b| a.slot.cmp(&b.slot).then(a.floor.total_cmp(&b.floor)));
    // With each best, the candidate's place in the list's order: of equal totals the one
    // met first is kept, as the exhaustive loop kept it.
    let mut best: [Option<(CloudCost, usize)>; 2] = [None, None];
    let mut asked = 0;
    let mut failure = None;
    // Currencies other than USD that quotes came back in: a cloud that quotes only in
    // them is not one whose quotes failed for no reason.
    let mut currencies = std::collections::BTreeSet::new();
    for c in &candidates {
        // A clean quote is taken over any caveated one: those are not asked.
        if c.slot == 1 && best[0].is_some() {
            break;
        }
        // The contract's own tolerance (`validate_quote`): a quote may fall short of the
        // floor by a part in 1e9.
        if best[c.slot].as_ref().is_some_and(|(b, _)| c.floor * (1.0 - 1e-9) - 1e-9 > b.usd) {
            if c.slot == 0 {
                break;
            }
            continue;
        }
        if asked == MAX_QUOTES {
            notes.push(format!("{name}: stopped after {MAX_QUOTES} quotes for {} GPUs", ask.gpus));
            break;
        }
        asked += 1;
        let (o, p, nodes, hours) = (c.offering, c.price, c.nodes, c.hours);
        // Checkpoints and data are kept for as long as the run takes: a spot run's
        // interruptions lengthen it, and its storage with it.
        let storage_gb_months = if ask.hours > 0.0 { ask.storage_gb_months * hours / ask.hours } else { ask.storage_gb_months };
        let request = QuoteRequest {
            instance: o.instance.clone(),
            gpus: ask.gpus,
            nodes,
            hours,
            region: p.region.clone(),
            option: ask.option,
            start_date: String::new(),
            storage_gb_months,
            egress_gb: ask.egress_gb,
        };
        match quote(&request) {
            Ok(q) if q.currency != "USD" => {
                notes.push(format!("{name}: a quote in {} is not compared with USD quotes", q.currency));
                currencies.insert(q.currency);
            }
            Ok(q) => {
                let caveats: Vec<String> = p.caveats.iter().map(|c| caveat_name(*c).to_string()).collect();
                let slot = c.slot;
                let met = c.met;
                if best[slot].as_ref().is_none_or(|(b, first)| q.total < b.usd || (q.total == b.usd && met < *first)) {
                    best[slot] = Some((
                        CloudCost {
                            cloud: name.to_string(),
                            plugin: info.name.clone(),
                            plugin_sha256: info.sha256.clone(),
                            instance: o.instance.clone(),
                            region: p.region.clone(),
                            option: crate::plugin::cost::option_name(ask.option).to_string(),
                            nodes,
                            price_date: p.effective_date.clone(),
                            price_source: p.source.clone(),
                            caveats,
                            currency: q.currency.clone(),
                            usd: q.total,
                            hours,
                            billed_hours: billed_hours(&q.lines, nodes, ask.gpus),
                            storage_not_costed: storage_gb_months > 0.0
                                && !q.lines.iter().any(|l| l.category == LineCategory::Storage && l.amount > 0.0),
                            lines: q
                                .lines
                                .iter()
                                .map(|l| Line {
                                    item: l.item.clone(),
                                    category: category(l.category).into(),
                                    quantity: l.quantity,
                                    unit: l.unit.clone(),
                                    amount: l.amount,
                                    estimate: l.estimate,
                                })
                                .collect(),
                            warnings: q.warnings.clone(),
                        },
                        met,
                    ));
                }
            }
            Err(e) => {
                let line = format!("skipped a quote: {e}");
                failure.get_or_insert_with(|| line.clone());
                notes.push(line);
            }
        }
    }
    let best = best.map(|b| b.map(|(c, _)| c));
    let [clean, caveated] = best;
    match (clean.or(caveated), failure) {
        (Some(c), _) => CloudPrice::Quoted(c),
        (None, failure) if !currencies.is_empty() => {
            let other = failure.map_or(String::new(), |f| format!("; another was refused: {f}"));
            CloudPrice::QuoteFailed { reason: foreign_currency(name, &currencies) + &other }
        }
        (None, Some(reason)) => CloudPrice::QuoteFailed { reason },
        (None, None) if any => CloudPrice::QuoteFailed { reason: format!("{name}: no quote came back") },
        (None, None) => CloudPrice::NotSold,
    }
}

/// Why a cloud whose quotes all came back in other currencies has no price in the table.
fn foreign_currency(cloud: &str, currencies: &std::collections::BTreeSet<String>) -> String {
    let list: Vec<&str> = currencies.iter().map(String::as_str).collect();
    format!(
        "{cloud}: its quotes were in {}, and the table compares USD (no exchange rate is applied)",
        list.join(" and ")
    )
}

/// Hours billed per node by a quote's compute lines: node-hours over the nodes, GPU-hours
/// over the GPUs, summed over the lines (a run bought as several blocks has a line each).
/// None where there is no compute line or one is in another unit.
fn billed_hours(lines: &[crate::plugin::cost::QuoteLine], nodes: u32, gpus: u32) -> Option<f64> {
    let mut hours = None;
    for l in lines.iter().filter(|l| l.category == LineCategory::Compute) {
        let per = match l.unit.to_ascii_lowercase().as_str() {
            "node-hour" | "node-hours" => f64::from(nodes),
            "gpu-hour" | "gpu-hours" => f64::from(gpus),
            _ => return None,
        };
        *hours.get_or_insert(0.0) += l.quantity / per.max(1.0);
    }
    hours
}

/// The order clouds are listed in, wherever they are (the terminal's columns, JSON's
/// `clouds` and with it the CSV's lines, the HTML's columns): clean prices before ones their
/// source marks lower-bound, resale or suspect, each cheapest first, then clouds without a
/// quote (in the order given). `quote(i)` is the quote that stands for cloud `i`. The first
/// is the price relative cost and the goals use.
pub fn rank_clouds<'a>(clouds: impl IntoIterator<Item = usize>, quote: impl Fn(usize) -> Option<&'a CloudCost>) -> Vec<usize> {
    let key = |i: usize| quote(i).map_or((2, f64::INFINITY), |q| (u8::from(!q.caveats.is_empty()), q.usd));
    let mut order: Vec<usize> = clouds.into_iter().collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (key(a), key(b));
        x.0.cmp(&y.0).then(x.1.total_cmp(&y.1))
    });
    order
}

/// The instances (and their GPU) of `offerings` whose GPU is none of `gpus` (by name or
/// alias): never priced.
pub fn unknown_gpus<'a>(offerings: &'a [Offering], gpus: &[GpuProfile]) -> Vec<(&'a str, &'a str)> {
    offerings.iter().filter(|o| !gpus.iter().any(|g| matches_gpu(o, g))).map(|o| (o.instance.as_str(), o.gpu.as_str())).collect()
}

pub(crate) fn matches_gpu(o: &Offering, gpu: &GpuProfile) -> bool {
    o.gpu.eq_ignore_ascii_case(&gpu.name) || gpu.aliases.iter().any(|a| a.eq_ignore_ascii_case(&o.gpu))
}

/// Whether `o` sells its GPU on the node `gpu`'s profile describes: as many GPUs per node,
/// in as large a scale-up (NVLink) domain. A projection's step time is that node's (whole
/// nodes of `gpus_per_node`, collectives inside `scale_up_domain` at NVLink rates), so an
/// offering on another node (a 1-GPU PCIe H100, GB200 sold as 8-GPU nodes of domain 8)
/// quoted against it would bill one machine at another's speed: it is never quoted.
pub(crate) fn same_node(o: &Offering, gpu: &GpuProfile) -> bool {
    o.gpus_per_node == gpu.gpus_per_node && o.scale_up_domain == gpu.scale_up_domain
}

/// The offerings of a GPU in `gpus` (by name or alias) on another node than its profile's,
/// each with that profile: never quoted (see [`same_node`]).
pub fn other_nodes<'a>(offerings: &'a [Offering], gpus: &'a [GpuProfile]) -> Vec<(&'a Offering, &'a GpuProfile)> {
    offerings
        .iter()
        .filter_map(|o| gpus.iter().find(|g| matches_gpu(o, g)).filter(|g| !same_node(o, g)).map(|g| (o, g)))
        .collect()
}

/// How a cloud sells `gpu` in `region` (empty: any), for saying why it has no quote: the
/// purchase options it prices the GPU under on the profile's node (in
/// [`PURCHASE_OPTIONS`](crate::plugin::cost::PURCHASE_OPTIONS) order), and whether it sells
/// the GPU on another node only.
pub fn sold_as(offerings: &[Offering], gpu: &GpuProfile, region: &str) -> (Vec<PurchaseOption>, bool) {
    let mine = || offerings.iter().filter(|o| matches_gpu(o, gpu));
    let options = crate::plugin::cost::PURCHASE_OPTIONS
        .iter()
        .copied()
        .filter(|&option| {
            mine().filter(|o| same_node(o, gpu)).flat_map(|o| &o.prices).any(|p| p.option == option && in_region(&p.region, region))
        })
        .collect();
    let other_node = mine().any(|o| !same_node(o, gpu) && o.prices.iter().any(|p| in_region(&p.region, region)));
    (options, other_node)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn spot_hours_grow_with_nodes_and_refuse_a_run_that_never_finishes() {
        let a = Assumptions::default();
        let one = a.spot_hours(100.0, 1).unwrap();
        let many = a.spot_hours(100.0, 256).unwrap();
        assert!(one > 100.0 && one < 101.0, "{one}");
        // 256 nodes: 256/30 interruptions a day = 0.356 an hour, each losing 0.75 h.
        let lost = 256.0 / 30.0 / 24.0 * 0.75;
        assert!((many - 100.0 / (1.0 - lost)).abs() < 1e-9, "{many}");
        assert!(a.spot_hours(100.0, 2000).is_none());
    }

    #[test]
    fn billed_hours_come_from_the_compute_lines_in_node_or_gpu_hours() {
        use crate::plugin::cost::QuoteLine;
        let line = |category, quantity, unit: &str| QuoteLine {
            item: "x".into(),
            category,
            quantity,
            unit: unit.into(),
            amount: 1.0,
            estimate: false,
            caveats: Vec::new(),
        };
        // Two blocks on 4 nodes (32 GPUs), and a storage line that is not time.
        let blocks = [line(LineCategory::Compute, 4.0 * 182.0 * 24.0, "node-hour"), line(LineCategory::Compute, 4.0 * 48.0, "node-hour"), line(LineCategory::Storage, 9e9, "GB-month")];
        assert_eq!(billed_hours(&blocks, 4, 32), Some(182.0 * 24.0 + 48.0));
        assert_eq!(billed_hours(&[line(LineCategory::Compute, 32.0 * 10.0, "GPU-hour")], 4, 32), Some(10.0));
        assert_eq!(billed_hours(&[line(LineCategory::Compute, 5.0, "node-month")], 4, 32), None, "a unit it cannot read");
        assert_eq!(billed_hours(&blocks[2..], 4, 32), None, "no compute line");
    }

    /// A one-node, one-hour USD quote of `usd` with `caveats`.
    pub(crate) fn quote(usd: f64, caveats: &[&str]) -> CloudCost {
        CloudCost {
            cloud: "c".into(),
            plugin: "c.wasm".into(),
            plugin_sha256: "00".into(),
            instance: "i".into(),
            region: "r".into(),
            option: "on-demand".into(),
            nodes: 1,
            price_date: String::new(),
            price_source: "s".into(),
            caveats: caveats.iter().map(|c| c.to_string()).collect(),
            currency: "USD".into(),
            usd,
            hours: 1.0,
            billed_hours: Some(1.0),
            storage_not_costed: false,
            lines: Vec::new(),
            warnings: Vec::new(),
        }
    }

    #[test]
    fn clouds_rank_clean_prices_first_each_cheapest_first_then_the_unpriced() {
        let cost = |usd: f64, caveat: bool| quote(usd, if caveat { &["resale"] } else { &[] });
        let quotes = [None, Some(cost(5.0, true)), Some(cost(30.0, false)), Some(cost(20.0, false)), Some(cost(1.0, true)), None];
        assert_eq!(rank_clouds(0..quotes.len(), |i| quotes[i].as_ref()), [3, 2, 4, 1, 0, 5]);
    }

    #[test]
    fn billed_hours_are_unknown_when_one_compute_line_is_in_a_unit_it_cannot_read() {
        use crate::plugin::cost::QuoteLine;
        let line = |quantity, unit: &str| QuoteLine {
            item: "x".into(),
            category: LineCategory::Compute,
            quantity,
            unit: unit.into(),
            amount: 1.0,
            estimate: false,
            caveats: Vec::new(),
        };
        // 4 nodes for 10 h, and a month more on a line it cannot read: not 10 h.
        assert_eq!(billed_hours(&[line(40.0, "node-hour"), line(4.0, "node-month")], 4, 32), None);
        assert_eq!(billed_hours(&[line(4.0, "node-month"), line(40.0, "node-hours")], 4, 32), None);
    }

    /// A price for every region ("*", Lambda's flat list) applies to a run asked in any
    /// region; a named region's price only to that region.
    #[test]
    fn an_every_region_price_applies_in_the_region_asked() {
        assert!(in_region(ANY_REGION, "us-east-1"));
        assert!(in_region("us-east-1", "us-east-1") && in_region("us-east-1", ""));
        assert!(!in_region("us-west-2", "us-east-1"));
    }

    use crate::plugin::cost::{Price, Quote, QuoteLine};

    fn h100() -> GpuProfile {
        runner_project::profile::Profiles::builtin().get("H100").unwrap().clone()
    }

    pub(crate) fn price(region: &str, option: PurchaseOption, usd_per_node_hour: f64, caveats: &[PriceCaveat]) -> Price {
        Price {
            region: region.into(),
            option,
            usd_per_node_hour,
            upfront_usd_per_node: 0.0,
            billing_increment_s: 1,
            minimum_charge_s: 0,
            effective_date: "2026-11-01".into(),
            source: format!("list of {usd_per_node_hour}"),
            caveats: caveats.to_vec(),
        }
    }

    /// An 8-GPU node of `gpu` sold at one price.
    pub(crate) fn offering(instance: &str, gpu: &str, price: Price) -> Offering {
        Offering {
            instance: instance.into(),
            gpu: gpu.into(),
            gpus_per_node: 8,
            scale_up_domain: 8,
            node_multiple: 1,
            interconnect_gbps: 0.0,
            prices: vec![price],
        }
    }

    fn ask<'a>(gpu: &'a GpuProfile, gpus: u32, hours: f64, region: &'a str, option: PurchaseOption) -> Ask<'a> {
        Ask { gpu, gpus, hours, region, option, storage_gb_months: 3.0, egress_gb: 7.0 }
    }

    /// `ask` priced over `offerings` by a stand-in for the plugin that answers `answer`
    /// (None: the list price of the offering's price, node-hours billed as asked, $0.10
    /// per GB-month stored and $0.05 per GB out, in USD): the price, the requests it was
    /// asked, and the notes.
    /// An embedded cost plugin's facts, for the quotes a test asks.
    fn test_info() -> PluginInfo {
        PluginInfo {
            name: "c.wasm".into(),
            kind: plugin::Kind::Cost,
            contract: "0.3.0".into(),
            source: plugin::Source::Embedded,
            sha256: "00".into(),
            bytes: 0,
            shadows_embedded: false,
        }
    }

    fn priced(
        offerings: &[Offering],
        ask: &Ask<'_>,
        assumptions: &Assumptions,
        answer: impl Fn(&QuoteRequest) -> Option<Result<Quote, plugin::PluginError>>,
    ) -> (CloudPrice, Vec<QuoteRequest>, Vec<String>) {
        let info = test_info();
        let mut requests = Vec::new();
        let mut notes = QuoteNotes::default();
        let got = cheapest_of("c", &info, offerings, ask, assumptions, &mut notes, |r| {
            requests.push(r.clone());
            answer(r).unwrap_or_else(|| {
                let o = offerings.iter().find(|o| o.instance == r.instance).unwrap();
                let line = |category, quantity, unit: &str, rate: f64| QuoteLine {
                    item: unit.into(),
                    category,
                    quantity,
                    unit: unit.into(),
                    amount: quantity * rate,
                    estimate: false,
                    caveats: Vec::new(),
                };
                let lines = vec![
                    line(LineCategory::Compute, f64::from(r.nodes) * r.hours, "node-hour", o.prices[0].usd_per_node_hour),
                    line(LineCategory::Storage, r.storage_gb_months, "GB-month", 0.10),
                    line(LineCategory::Egress, r.egress_gb, "GB", 0.05),
                ];
                let total = lines.iter().map(|l| l.amount).sum();
                Ok(Quote { currency: "USD".into(), lines, total, warnings: Vec::new() })
            })
        });
        (got, requests, notes.finish())
    }

    /// A quote whose storage lines cost nothing while storage was asked for leaves it out;
    /// one that prices it, or one asked for no storage, does not. A spot quote's days are its
    /// stretched hours, an on-demand one's the run's. Regions match in any case. Kills: the
    /// flag from the line's presence rather than its amount, or set with nothing asked;
    /// `days` ignoring spot; a case-sensitive region.
    #[test]
    fn a_quote_says_whether_it_costs_storage_and_how_many_days_it_bills() {
        let gpu = h100();
        let offerings = [offering("s", "H100", price("r", PurchaseOption::Spot, 10.0, &[]))];
        let a = Assumptions { spot_interruptions_per_node_day: 2.4, checkpoint_interval_h: 2.0, restart_h: 0.5, ..Assumptions::default() };
        let (got, _, _) = priced(&offerings, &ask(&gpu, 40, 10.0, "R", PurchaseOption::Spot), &a, |_| None);
        let q = got.quote().unwrap();
        assert!(!q.storage_not_costed, "{q:?}");
        assert!((q.days(10.0 / 24.0) - 40.0 / 24.0).abs() < 1e-12);
        let on_demand = CloudCost { option: "on-demand".into(), ..q.clone() };
        assert_eq!(on_demand.days(0.5), 0.5);
        let unpriced = |r: &QuoteRequest| {
            let line = |category, amount: f64| QuoteLine {
                item: "x".into(),
                category,
                quantity: 1.0,
                unit: "u".into(),
                amount,
                estimate: true,
                caveats: Vec::new(),
            };
            let lines = vec![line(LineCategory::Compute, 100.0 * r.hours), line(LineCategory::Storage, 0.0)];
            Some(Ok(Quote { currency: "USD".into(), total: 100.0 * r.hours, lines, warnings: Vec::new() }))
        };
        let (got, _, _) = priced(&offerings, &ask(&gpu, 40, 10.0, "r", PurchaseOption::Spot), &a, unpriced);
        assert!(got.quote().unwrap().storage_not_costed);
        let nothing = Ask { storage_gb_months: 0.0, ..ask(&gpu, 40, 10.0, "r", PurchaseOption::Spot) };
        let (got, _, _) = priced(&offerings, &nothing, &a, unpriced);
        assert!(!got.quote().unwrap().storage_not_costed, "no storage asked, none left out");
    }

    fn refused(message: &str) -> Option<Result<Quote, plugin::PluginError>> {
        Some(Err(plugin::PluginError::new("c.wasm", "quote", plugin::Failure::Refused(message.into()))))
    }

    /// Each cloud's cheapest quote is among its clean prices in the region and option
    /// asked (a price for every region counts in any); a price its source marks lower-bound,
    /// resale or suspect is taken only when no clean one is quoted, and then says so.
    #[test]
    fn a_cloud_quotes_its_cheapest_clean_price_in_the_region_and_option_asked() {
        use PurchaseOption::{OnDemand, Spot};
        let gpu = h100();
        let offerings = [
            offering("dear", "H100", price("us-east-1", OnDemand, 100.0, &[])),
            offering("resale", "H100", price("us-east-1", OnDemand, 60.0, &[PriceCaveat::Resale])),
            offering("flat", "H100", price(ANY_REGION, OnDemand, 80.0, &[])),
            offering("spot", "H100", price("us-east-1", Spot, 10.0, &[])),
            offering("elsewhere", "H100", price("eu-west-1", OnDemand, 50.0, &[])),
            offering("alias", "nvidia-h100-80gb", price("us-east-1", OnDemand, 90.0, &[])),
            offering("a100", "A100-80GB", price("us-east-1", OnDemand, 1.0, &[])),
        ];
        // 16 GPUs: 2 nodes for 10 h, 3 GB-months stored and 7 GB out.
        let (got, requests, _) = priced(&offerings, &ask(&gpu, 16, 10.0, "us-east-1", OnDemand), &Assumptions::default(), |_| None);
        let asked: Vec<(&str, &str)> = requests.iter().map(|r| (r.instance.as_str(), r.region.as_str())).collect();
        // Asked cheapest list price first, and no further: alias's floor ($1800) is above
        // flat's quote, and the caveated resale is not asked with a clean quote in hand.
        assert_eq!(asked, [("flat", "*")]);
        assert!(requests.iter().all(|r| (r.nodes, r.hours, r.storage_gb_months, r.egress_gb) == (2, 10.0, 3.0, 7.0)), "{requests:?}");
        let CloudPrice::Quoted(q) = got else { panic!("{got:?}") };
        // 2 nodes x 10 h x $80, $0.30 stored, $0.35 out.
        assert_eq!((q.instance.as_str(), q.region.as_str(), q.nodes, q.hours), ("flat", "*", 2, 10.0));
        assert!((q.usd - 1600.65).abs() < 1e-9, "{}", q.usd);
        assert!(q.caveats.is_empty() && q.price_source == "list of 80" && q.cloud == "c" && q.plugin == "c.wasm");
        assert_eq!(q.billed_hours, Some(10.0), "node-hours over the nodes");
        // Asked in no region, every region's prices count.
        let (got, _, _) = priced(&offerings, &ask(&gpu, 16, 10.0, "", OnDemand), &Assumptions::default(), |_| None);
        assert_eq!(got.quote().map(|q| q.instance.as_str()), Some("elsewhere"));
        // Only caveated prices: the cheapest of them, carrying its caveat.
        let caveated = [
            offering("resale", "H100", price("us-east-1", OnDemand, 60.0, &[PriceCaveat::Resale])),
            offering("guess", "H100", price("us-east-1", OnDemand, 70.0, &[PriceCaveat::LowerBound])),
        ];
        let (got, _, _) = priced(&caveated, &ask(&gpu, 16, 10.0, "us-east-1", OnDemand), &Assumptions::default(), |_| None);
        let q = got.quote().unwrap();
        assert_eq!((q.instance.as_str(), q.caveats.as_slice()), ("resale", ["resale".to_string()].as_slice()));
    }

    /// Spot hours are the run's hours stretched by the interruptions (each losing half a
    /// checkpoint interval and a restart), and the storage with them; egress is once.
    #[test]
    fn a_spot_quote_asks_for_the_stretched_hours_and_storage() {
        let gpu = h100();
        let offerings = [offering("s", "H100", price("r", PurchaseOption::Spot, 10.0, &[]))];
        // 5 nodes at 2.4 interruptions per node-day: one every 2 h, each losing 1 h of a
        // 2 h interval and a 0.5 h restart, so a quarter of each hour does work: 10 h -> 40 h.
        let a = Assumptions { spot_interruptions_per_node_day: 2.4, checkpoint_interval_h: 2.0, restart_h: 0.5, ..Assumptions::default() };
        assert!((a.spot_hours(10.0, 5).unwrap() - 40.0).abs() < 1e-9);
        let (got, requests, _) = priced(&offerings, &ask(&gpu, 40, 10.0, "r", PurchaseOption::Spot), &a, |_| None);
        let r = &requests[0];
        assert_eq!(r.nodes, 5);
        assert!((r.hours - 40.0).abs() < 1e-9 && (r.storage_gb_months - 12.0).abs() < 1e-9 && r.egress_gb == 7.0, "{r:?}");
        let q = got.quote().unwrap();
        assert!((q.hours - 40.0).abs() < 1e-9 && q.option == "spot", "{q:?}");
        // 8 nodes: interrupted every 1.25 h, losing 1.5 h each time: never finishes.
        assert!(a.spot_hours(10.0, 8).is_none());
        let (got, requests, notes) = priced(&offerings, &ask(&gpu, 64, 10.0, "r", PurchaseOption::Spot), &a, |_| None);
        assert!(requests.is_empty());
        assert!(matches!(&got, CloudPrice::QuoteFailed { reason } if reason == "c: no quote came back"), "{got:?}");
        assert_eq!(notes, ["c: spot on 8 nodes is interrupted faster than it checkpoints; not quoted"]);
        // Refused from nine tenths of the time lost: 19 nodes at 2.4 a day, each interruption
        // losing half of a 1 h interval, lose 0.95 of every hour; 17 lose 0.85, and 10 h of
        // work take 10 / 0.15 h.
        let b = Assumptions { checkpoint_interval_h: 1.0, restart_h: 0.0, ..a };
        assert!(b.spot_hours(10.0, 19).is_none());
        assert!((b.spot_hours(10.0, 17).unwrap() - 10.0 / 0.15).abs() < 1e-9);
    }

    /// Nodes are whole and sold in the offering's multiples: 20 GPUs on 8-GPU nodes sold
    /// in pairs are 4 nodes, quoted and reported as such.
    #[test]
    fn a_quote_is_for_whole_nodes_in_the_offerings_multiples() {
        let gpu = h100();
        let mut rack = offering("pair", "H100", price("r", PurchaseOption::OnDemand, 10.0, &[]));
        rack.node_multiple = 2;
        let (got, requests, _) = priced(&[rack], &ask(&gpu, 20, 1.0, "r", PurchaseOption::OnDemand), &Assumptions::default(), |_| None);
        assert_eq!((requests[0].nodes, requests[0].gpus), (4, 20));
        assert_eq!(got.quote().map(|q| q.nodes), Some(4));
    }

    /// A cloud that does not sell the GPU there is not one whose quotes failed: refused
    /// quotes give the first refusal, quotes only in other currencies say so, and a quote
    /// in USD is taken over a cheaper-looking one in another currency.
    #[test]
    fn no_price_says_whether_the_gpu_is_not_sold_or_its_quotes_failed() {
        use PurchaseOption::OnDemand;
        let gpu = h100();
        let offerings = [
            offering("a", "H100", price("r", OnDemand, 10.0, &[])),
            offering("b", "H100", price("r", OnDemand, 20.0, &[])),
        ];
        let on = |region| ask(&gpu, 8, 1.0, region, OnDemand);
        let (got, _, _) = priced(&offerings, &on("elsewhere"), &Assumptions::default(), |_| None);
        assert!(matches!(got, CloudPrice::NotSold), "{got:?}");
        let (got, _, _) = priced(&offerings[..0], &on("r"), &Assumptions::default(), |_| None);
        assert!(matches!(got, CloudPrice::NotSold), "{got:?}");
        let (got, _, notes) = priced(&offerings, &on("r"), &Assumptions::default(), |r| refused(&format!("no {}", r.instance)));
        let CloudPrice::QuoteFailed { reason } = got else { panic!("{got:?}") };
        assert!(reason.starts_with("skipped a quote: ") && reason.ends_with("no a"), "{reason}");
        assert_eq!(notes.len(), 2, "{notes:?}");
        let euros = |r: &QuoteRequest| {
            (r.instance == "a").then(|| Ok(Quote { currency: "EUR".into(), lines: Vec::new(), total: 1.0, warnings: Vec::new() }))
        };
        let (got, _, _) = priced(&offerings, &on("r"), &Assumptions::default(), euros);
        assert_eq!(got.quote().map(|q| (q.instance.as_str(), q.currency.as_str())), Some(("b", "USD")));
        let (got, _, _) = priced(&offerings[..1], &on("r"), &Assumptions::default(), euros);
        let CloudPrice::QuoteFailed { reason } = got else { panic!("{got:?}") };
        assert_eq!(reason, "c: its quotes were in EUR, and the table compares USD (no exchange rate is applied)");
    }

    /// At most 256 quotes per cloud and row, and the notes say where it stopped.
    #[test]
    fn a_cloud_is_asked_at_most_256_quotes_for_a_row() {
        let gpu = h100();
        let mut many = offering("m", "H100", price("r0", PurchaseOption::OnDemand, 10.0, &[]));
        many.prices = (0..300).map(|i| price(&format!("r{i}"), PurchaseOption::OnDemand, 10.0, &[])).collect();
        let (got, requests, notes) = priced(&[many], &ask(&gpu, 8, 1.0, "", PurchaseOption::OnDemand), &Assumptions::default(), |_| None);
        assert_eq!(requests.len(), 256);
        assert!(got.quote().is_some());
        assert_eq!(notes, ["c: stopped after 256 quotes for 8 GPUs"]);
    }

    /// Quotes are asked in the order of their list-price floors and stop at the first floor
    /// above the best quote: over a generated list (several regions, options, caveats,
    /// billing increments, minimums and upfront payments, honest quotes at or above the list
    /// price) the cheapest quote is the exhaustive loop's, to the instance, region and cent,
    /// for a fraction of the calls. Kills: stopping at the first quote; no stopping (the
    /// count); floors without the billing increment or the upfront part; ties not kept in
    /// the list's order.
    #[test]
    fn the_cheapest_quote_is_the_exhaustive_ones_for_a_few_calls() {
        use PurchaseOption::{CapacityBlock, OnDemand, Spot};
        let gpu = h100();
        // A small deterministic generator (xorshift): the same list every run.
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut offerings = Vec::new();
        for i in 0..60 {
            let mut o = offering(&format!("i{i}"), "H100", price("r0", OnDemand, 10.0, &[]));
            o.prices = (0..12)
                .map(|r| {
                    let option = [OnDemand, Spot, CapacityBlock][usize::try_from(next(3)).unwrap()];
                    let caveats: &[PriceCaveat] = if next(5) == 0 { &[PriceCaveat::Resale] } else { &[] };
                    let mut p = price(&format!("r{r}"), option, 20.0 + next(400) as f64 / 10.0, caveats);
                    p.billing_increment_s = [1, 60, 3600][usize::try_from(next(3)).unwrap()];
                    p.minimum_charge_s = [0, 3600, 86_400][usize::try_from(next(3)).unwrap()];
                    p.upfront_usd_per_node = [0.0, 50.0][usize::try_from(next(2)).unwrap()];
                    p
                })
                .collect();
            offerings.push(o);
        }
        // Two equal offerings, the cheapest on demand: of equal totals the first in the list
        // is kept.
        for p in offerings[3].prices.iter_mut().filter(|p| p.option == OnDemand) {
            p.usd_per_node_hour = 5.0;
            p.caveats.clear();
        }
        let mut twin = offerings[3].clone();
        twin.instance = "twin".into();
        offerings.insert(2, twin);
        // Honest: the list price of what was asked, a surcharge of up to 5 % by region,
        // and storage and egress.
        let honest = |r: &QuoteRequest| {
            let floor = crate::plugin::cost::list_price_floor(r, &offerings).unwrap();
            let surcharge = 1.0 + r.region.bytes().map(u64::from).sum::<u64>() as f64 % 6.0 / 100.0;
            let compute = floor * surcharge;
            let lines = vec![QuoteLine {
                item: "compute".into(),
                category: LineCategory::Compute,
                quantity: 1.0,
                unit: "run".into(),
                amount: compute,
                estimate: false,
                caveats: Vec::new(),
            }];
            let total = compute + 0.1 * r.storage_gb_months + 0.05 * r.egress_gb;
            Some(Ok(Quote { currency: "USD".into(), lines, total, warnings: Vec::new() }))
        };
        for (region, option, gpus, hours) in
            [("", OnDemand, 16, 10.0), ("r3", OnDemand, 8, 0.3), ("", Spot, 64, 100.0), ("", CapacityBlock, 8, 2.0), ("r5", Spot, 8, 30.0)]
        {
            let ask = ask(&gpu, gpus, hours, region, option);
            let (got, requests, _) = priced(&offerings, &ask, &Assumptions::default(), honest);
            // The exhaustive loop: every price quoted, the cheapest clean one kept (the first
            // met of equal totals), else the cheapest caveated one.
            let mut all: Vec<(usize, f64, &str, &str)> = Vec::new();
            for o in &offerings {
                let nodes = crate::plugin::cost::nodes_for(o, gpus).unwrap();
                for p in o.prices.iter().filter(|p| p.option == option && in_region(&p.region, region)) {
                    let h = if option == Spot { Assumptions::default().spot_hours(hours, nodes).unwrap() } else { hours };
                    let s = ask.storage_gb_months * h / hours;
                    let r = QuoteRequest {
                        instance: o.instance.clone(),
                        gpus,
                        nodes,
                        hours: h,
                        region: p.region.clone(),
                        option,
                        start_date: String::new(),
                        storage_gb_months: s,
                        egress_gb: ask.egress_gb,
                    };
                    let total = honest(&r).unwrap().unwrap().total;
                    all.push((usize::from(!p.caveats.is_empty()), total, o.instance.as_str(), p.region.as_str()));
                }
            }
            let slot = all.iter().map(|a| a.0).min().unwrap();
            let mut want = None::<(usize, f64, &str, &str)>;
            for a in all.iter().filter(|a| a.0 == slot) {
                if want.is_none_or(|w| a.1 < w.1) {
                    want = Some(*a);
                }
            }
            let want = want.unwrap();
            let q = got.quote().unwrap_or_else(|| panic!("{got:?}"));
            assert_eq!((q.instance.as_str(), q.region.as_str(), q.usd), (want.2, want.3, want.1), "{region} {option:?} {gpus}");
            assert!(requests.len() * 4 <= all.len(), "{} quotes of {} prices", requests.len(), all.len());
        }
    }

    /// A quote that hangs, traps or runs out of memory is the cloud's last: the rest of that
    /// row's quotes and every later row fail with it without calling the plugin (a hanging
    /// plugin cost its 10 s deadline for every quote of every row), said once in the
    /// notes. A plugin's refusal of one quote is not. Kills: the cloud asked again on the
    /// next row; the rest of the row asked; a refusal taken for a hang.
    #[test]
    fn a_cloud_whose_quote_hangs_or_traps_is_not_asked_again() {
        use PurchaseOption::OnDemand;
        let gpu = h100();
        let info = test_info();
        let offerings = [
            offering("a", "H100", price("r", OnDemand, 10.0, &[])),
            offering("b", "H100", price("r", OnDemand, 10.0, &[])),
        ];
        let hang = || plugin::Failure::Timeout { limit_ms: 10_000 };
        let trap = || plugin::Failure::Trap { message: "unreachable".into(), stderr: String::new() };
        let refuse = || plugin::Failure::Refused("sold out".into());
        for (failure, gives_up) in [(hang as fn() -> plugin::Failure, true), (trap, true), (refuse, false)] {
            let mut calls = 0;
            let mut given_up = None;
            let mut notes = QuoteNotes::default();
            for gpus in [8, 16, 24] {
                let got = cheapest_unless_given_up("c", &info, &offerings, &mut given_up, &ask(&gpu, gpus, 1.0, "r", OnDemand), &Assumptions::default(), &mut notes, |_| {
                    calls += 1;
                    Err(plugin::PluginError::new("c.wasm", "quote", failure()))
                });
                assert!(matches!(&got, CloudPrice::QuoteFailed { reason } if reason.starts_with("skipped a quote: plugin 'c.wasm'")), "{got:?}");
            }
            let notes = notes.finish();
            if gives_up {
                assert_eq!(calls, 1, "{failure:?}", failure = failure());
                assert_eq!(notes.len(), 2, "{notes:?}");
                assert!(notes[1].starts_with("c: not asked for quotes again in this run"), "{notes:?}");
            } else {
                assert_eq!(calls, 6, "a refusal is one quote's: each is asked");
                assert_eq!(notes.len(), 1, "{notes:?}");
            }
        }
    }

    /// A note is said once, and past 20 the rest are counted, each once.
    #[test]
    fn quote_notes_are_said_once_and_at_most_twenty() {
        let mut notes = QuoteNotes::default();
        notes.push("x".into());
        notes.push("x".into());
        assert_eq!(notes.finish(), ["x"]);
        let mut notes = QuoteNotes::default();
        for i in 0..25 {
            notes.push(format!("n{i}"));
        }
        let lines = notes.finish();
        assert_eq!((lines.len(), lines[19].as_str(), lines[20].as_str()), (21, "n19", "... and 5 more quote failures"));
        // Past 20, a note said again (one failure repeated for every row) is counted once.
        let mut notes = QuoteNotes::default();
        for i in 0..20 {
            notes.push(format!("n{i}"));
        }
        for line in ["again", "other", "again", "again", "n3"] {
            notes.push(line.into());
        }
        assert_eq!(notes.finish().last().map(String::as_str), Some("... and 2 more quote failures"));
    }

    /// The ranges `check` states are inclusive at "at most".
    #[test]
    fn assumptions_are_checked_against_their_stated_ranges() {
        let ok = |a: Assumptions| a.check();
        assert_eq!(ok(Assumptions { spot_interruptions_per_node_day: 24.0, ..Assumptions::default() }), Ok(()));
        assert_eq!(ok(Assumptions { checkpoints_kept: 1000, ..Assumptions::default() }), Ok(()));
        assert_eq!(ok(Assumptions { restart_h: 0.0, ..Assumptions::default() }), Ok(()));
        let err = ok(Assumptions { spot_interruptions_per_node_day: 24.5, ..Assumptions::default() }).unwrap_err();
        assert_eq!(err, "spot_interruptions_per_node_day is 24.5; it must be at least 0 and at most 24");
        assert!(ok(Assumptions { checkpoints_kept: 1001, ..Assumptions::default() }).is_err());
        assert!(ok(Assumptions { checkpoint_interval_h: 0.0, ..Assumptions::default() }).unwrap_err().contains("above 0"));
        // A refused figure is echoed short: `{}` of 1e300 is 301 digits.
        let err = ok(Assumptions { checkpoint_interval_h: 1e300, ..Assumptions::default() }).unwrap_err();
        assert_eq!(err, "checkpoint_interval_h is 1e300; it must be above 0 and at most 10000");
    }

    /// Interruptions that take exactly nine tenths of the time are refused, as the doc
    /// says ("nine tenths of the time or more"): one node at 24 a day, each losing half of
    /// a 1.8 h interval, loses 0.9 of every hour.
    #[test]
    fn spot_losing_exactly_nine_tenths_of_the_time_is_not_quoted() {
        let a = Assumptions { spot_interruptions_per_node_day: 24.0, checkpoint_interval_h: 1.8, restart_h: 0.0, ..Assumptions::default() };
        assert_eq!(a.spot_hours(10.0, 1), None);
        let b = Assumptions { checkpoint_interval_h: 1.6, ..a };
        assert!((b.spot_hours(10.0, 1).unwrap() - 50.0).abs() < 1e-9);
    }

    /// Every figure's range, at both ends: "at most" is inclusive, "at least 0" takes 0,
    /// "above 0" does not, and nothing out of range (nor NaN, nor infinite) passes; the
    /// error names the field.
    #[test]
    fn every_assumption_is_checked_at_both_ends_of_its_range() {
        type Set = fn(&mut Assumptions, f64);
        let fields: [(&str, Set, f64, bool); 6] = [
            ("spot_interruptions_per_node_day", |a, v| a.spot_interruptions_per_node_day = v, 24.0, true),
            ("checkpoint_interval_h", |a, v| a.checkpoint_interval_h = v, 1e4, false),
            ("restart_h", |a, v| a.restart_h = v, 1e4, true),
            ("checkpoint_bytes_per_param", |a, v| a.checkpoint_bytes_per_param = v, 1e3, true),
            ("data_bytes_per_token", |a, v| a.data_bytes_per_token = v, 1e3, true),
            ("egress_bytes_per_param", |a, v| a.egress_bytes_per_param = v, 1e3, true),
        ];
        let with = |set: Set, v: f64| {
            let mut a = Assumptions::default();
            set(&mut a, v);
            a.check()
        };
        for (name, set, hi, zero_ok) in fields {
            assert_eq!(with(set, hi), Ok(()), "{name} at {hi}");
            assert_eq!(with(set, hi / 2.0), Ok(()), "{name} at {}", hi / 2.0);
            assert_eq!(with(set, 0.0).is_ok(), zero_ok, "{name} at 0");
            for bad in [hi * 1.001, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
                let err = with(set, bad).unwrap_err();
                assert!(err.starts_with(&format!("{name} is ")), "{name} at {bad}: {err}");
            }
        }
        assert_eq!(Assumptions { checkpoints_kept: 0, ..Assumptions::default() }.check(), Ok(()));
        assert_eq!(Assumptions::default().check(), Ok(()));
    }

    /// The line reports print states each assumption's own figure.
    #[test]
    fn the_assumptions_line_states_each_figure_in_its_place() {
        let a = Assumptions {
            spot_interruptions_per_node_day: 0.125,
            checkpoint_interval_h: 3.0,
            restart_h: 0.5,
            checkpoints_kept: 7,
            checkpoint_bytes_per_param: 16.0,
            data_bytes_per_token: 2.0,
            egress_bytes_per_param: 4.0,
        };
        let d = a.describe();
        for part in [
            "interrupted 0.125 times per node-day",
            "half a 3.0 h checkpoint interval plus a 0.50 h restart",
            "storage for 7 checkpoints of 16 bytes per parameter and the data set at 2 bytes per token",
            "egress of the trained weights (4 bytes per parameter) once",
        ] {
            assert!(d.contains(part), "{part:?} not in {d:?}");
        }
    }

    /// Billed hours read the plural units and any case as the singular.
    #[test]
    fn billed_hours_read_plural_units_in_any_case() {
        use crate::plugin::cost::QuoteLine;
        let line = |quantity, unit: &str| QuoteLine {
            item: "x".into(),
            category: LineCategory::Compute,
            quantity,
            unit: unit.into(),
            amount: 1.0,
            estimate: false,
            caveats: Vec::new(),
        };
        assert_eq!(billed_hours(&[line(40.0, "node-hours")], 4, 32), Some(10.0));
        assert_eq!(billed_hours(&[line(320.0, "gpu-hours")], 4, 32), Some(10.0));
        assert_eq!(billed_hours(&[line(40.0, "Node-Hour"), line(64.0, "GPU-Hours")], 4, 32), Some(12.0));
    }

    /// A quote carries its price row (date, source), the plugin's name and hash, the
    /// option asked, the currency, and every line of the plugin's answer with its
    /// category, estimate flag and the quote's warnings; `row` names it, "undated" where
    /// the source gives no date.
    #[test]
    fn a_quote_carries_its_price_row_plugin_lines_and_warnings() {
        use PurchaseOption::CapacityBlock;
        let gpu = h100();
        let mut p = price("r", CapacityBlock, 10.0, &[]);
        p.effective_date = "2026-10-31".into();
        let offerings = [offering("blk", "H100", p)];
        let categories = [
            (LineCategory::Compute, "compute"),
            (LineCategory::Upfront, "upfront"),
            (LineCategory::Storage, "storage"),
            (LineCategory::Egress, "egress"),
            (LineCategory::Network, "network"),
            (LineCategory::Support, "support"),
            (LineCategory::Discount, "discount"),
            (LineCategory::Other, "other"),
        ];
        let answer = |r: &QuoteRequest| {
            let lines: Vec<QuoteLine> = categories
                .iter()
                .enumerate()
                .map(|(i, (c, name))| QuoteLine {
                    item: format!("item {name}"),
                    category: *c,
                    quantity: if i == 0 { f64::from(r.gpus) * r.hours } else { i as f64 },
                    unit: if i == 0 { "gpu-hour".into() } else { format!("u{i}") },
                    amount: 10.0 * i as f64,
                    estimate: i % 2 == 1,
                    caveats: Vec::new(),
                })
                .collect();
            Some(Ok(Quote { currency: "USD".into(), lines, total: 280.0, warnings: vec!["w1".into(), "w2".into()] }))
        };
        let (got, _, _) = priced(&offerings, &ask(&gpu, 16, 6.0, "r", CapacityBlock), &Assumptions::default(), answer);
        let q = got.quote().unwrap();
        assert_eq!((q.option.as_str(), q.currency.as_str(), q.usd), ("capacity-block", "USD", 280.0));
        assert_eq!((q.plugin.as_str(), q.plugin_sha256.as_str()), ("c.wasm", "00"));
        assert_eq!((q.price_date.as_str(), q.price_source.as_str()), ("2026-10-31", "list of 10"));
        assert_eq!(q.row(), "blk r capacity-block 2026-10-31");
        assert_eq!(q.billed_hours, Some(6.0), "GPU-hours over the 16 GPUs");
        let got: Vec<(&str, &str, f64, &str, f64, bool)> =
            q.lines.iter().map(|l| (l.item.as_str(), l.category.as_str(), l.quantity, l.unit.as_str(), l.amount, l.estimate)).collect();
        let want: Vec<(String, &str, f64, String, f64, bool)> = categories
            .iter()
            .enumerate()
            .map(|(i, (_, name))| {
                let (quantity, unit) = if i == 0 { (96.0, "gpu-hour".to_string()) } else { (i as f64, format!("u{i}")) };
                (format!("item {name}"), *name, quantity, unit, 10.0 * i as f64, i % 2 == 1)
            })
            .collect();
        let want: Vec<(&str, &str, f64, &str, f64, bool)> = want.iter().map(|(a, b, c, d, e, f)| (a.as_str(), *b, *c, d.as_str(), *e, *f)).collect();
        assert_eq!(got, want);
        assert_eq!(q.warnings, ["w1", "w2"]);
        let undated = CloudCost { price_date: String::new(), ..q.clone() };
        assert_eq!(undated.row(), "blk r capacity-block undated");
    }

    /// Each caveat keeps its own name on the quote.
    #[test]
    fn each_caveat_is_named_on_the_quote() {
        use PurchaseOption::OnDemand;
        let gpu = h100();
        for (c, name) in [(PriceCaveat::LowerBound, "lower-bound"), (PriceCaveat::Resale, "resale"), (PriceCaveat::Suspect, "suspect")] {
            let offerings = [offering("x", "H100", price("r", OnDemand, 1.0, &[c]))];
            let (got, _, _) = priced(&offerings, &ask(&gpu, 8, 1.0, "r", OnDemand), &Assumptions::default(), |_| None);
            assert_eq!(got.quote().unwrap().caveats, [name]);
        }
    }

    /// Equal quotes: the first offering listed is the one quoted, whatever follows.
    #[test]
    fn of_equal_quotes_the_first_listed_is_taken() {
        use PurchaseOption::OnDemand;
        let gpu = h100();
        let offerings = [
            offering("first", "H100", price("r", OnDemand, 10.0, &[])),
            offering("second", "H100", price("r", OnDemand, 10.0, &[])),
            offering("third", "H100", price("r", OnDemand, 10.0, &[])),
        ];
        let (got, requests, _) = priced(&offerings, &ask(&gpu, 8, 1.0, "r", OnDemand), &Assumptions::default(), |_| None);
        assert_eq!(requests.len(), 3);
        assert_eq!(got.quote().map(|q| q.instance.as_str()), Some("first"));
    }

    /// A GPU's name matches an offering's in any case (and so does an alias).
    #[test]
    fn an_offering_matches_the_gpu_by_name_or_alias_in_any_case() {
        use PurchaseOption::OnDemand;
        let gpu = h100();
        let offerings = [
            offering("lower", "h100", price("r", OnDemand, 10.0, &[])),
            // The same list price: quotes stop at the first floor above the best quote.
            offering("alias", "NVIDIA-H100-80GB", price("r", OnDemand, 10.0, &[])),
            offering("other", "H200", price("r", OnDemand, 1.0, &[])),
        ];
        let (_, requests, _) = priced(&offerings, &ask(&gpu, 8, 1.0, "r", OnDemand), &Assumptions::default(), |_| None);
        let asked: Vec<&str> = requests.iter().map(|r| r.instance.as_str()).collect();
        assert_eq!(asked, ["lower", "alias"]);
        let h200 = runner_project::profile::Profiles::builtin().get("H200").unwrap().clone();
        assert_eq!(unknown_gpus(&offerings, std::slice::from_ref(&gpu)), [("other", "H200")]);
        assert!(unknown_gpus(&offerings, &[gpu, h200]).is_empty());
        // A profile without aliases (a user's --profile GPU) matches by its name alone.
        let bare = GpuProfile { name: "MI300X".into(), aliases: Vec::new(), ..h100() };
        let offerings = [offering("amd", "mi300x", price("r", OnDemand, 10.0, &[]))];
        let (got, _, _) = priced(&offerings, &ask(&bare, 8, 1.0, "r", OnDemand), &Assumptions::default(), |_| None);
        assert_eq!(got.quote().map(|q| q.instance.as_str()), Some("amd"));
    }

    /// A cloud whose quotes came back in other currencies and were refused says both: the
    /// currencies (each once, in order) and the first refusal.
    #[test]
    fn foreign_currencies_and_a_refusal_are_both_said() {
        use PurchaseOption::OnDemand;
        let gpu = h100();
        let offerings = [
            offering("a", "H100", price("r", OnDemand, 10.0, &[])),
            offering("b", "H100", price("r", OnDemand, 20.0, &[])),
            offering("c", "H100", price("r", OnDemand, 30.0, &[])),
            offering("d", "H100", price("r", OnDemand, 40.0, &[])),
        ];
        let answer = |r: &QuoteRequest| {
            let money = |cur: &str| Some(Ok(Quote { currency: cur.into(), lines: Vec::new(), total: 1.0, warnings: Vec::new() }));
            match r.instance.as_str() {
                "a" => money("GBP"),
                "b" => refused("no b"),
                "c" => money("EUR"),
                _ => refused("no d"),
            }
        };
        let (got, _, _) = priced(&offerings, &ask(&gpu, 8, 1.0, "r", OnDemand), &Assumptions::default(), answer);
        let CloudPrice::QuoteFailed { reason } = got else { panic!("{got:?}") };
        assert!(
            reason.starts_with(
                "c: its quotes were in EUR and GBP, and the table compares USD (no exchange rate is applied); another was refused: skipped a quote: "
            ) && reason.ends_with("no b"),
            "{reason}"
        );
    }

    /// A spot run of no hours keeps the storage asked (no 0/0).
    #[test]
    fn a_spot_run_of_no_hours_keeps_the_storage_asked() {
        let gpu = h100();
        let offerings = [offering("s", "H100", price("r", PurchaseOption::Spot, 10.0, &[]))];
        let (_, requests, _) = priced(&offerings, &ask(&gpu, 8, 0.0, "r", PurchaseOption::Spot), &Assumptions::default(), |_| None);
        assert_eq!((requests[0].hours, requests[0].storage_gb_months), (0.0, 3.0));
    }

    /// An offering on another node than the profile's (1 GPU, or 8 GPUs in a domain of 3)
    /// is never quoted against the profile's projection, however cheap; how a cloud sells
    /// a GPU says which options it prices on the profile's node and whether it sells it
    /// elsewhere only.
    #[test]
    fn an_offering_on_another_node_than_the_profile_is_never_quoted() {
        use PurchaseOption::{OnDemand, Spot};
        let gpu = h100();
        let one = Offering { gpus_per_node: 1, scale_up_domain: 1, ..offering("one", "H100", price("r", OnDemand, 1.0, &[])) };
        let narrow = Offering { scale_up_domain: 4, ..offering("narrow", "H100", price("r", OnDemand, 2.0, &[])) };
        let full = offering("full", "H100", price("r", OnDemand, 20.0, &[]));
        let on = ask(&gpu, 8, 1.0, "r", OnDemand);
        let (got, requests, _) = priced(&[one.clone(), narrow.clone(), full.clone()], &on, &Assumptions::default(), |_| None);
        assert_eq!(got.quote().map(|q| q.instance.as_str()), Some("full"));
        assert!(requests.iter().all(|r| r.instance == "full"), "{requests:?}");
        let (got, requests, _) = priced(&[one.clone(), narrow.clone()], &on, &Assumptions::default(), |_| None);
        assert!(matches!(got, CloudPrice::NotSold) && requests.is_empty(), "{got:?}");
        let all = [one.clone(), narrow.clone(), full.clone()];
        let others: Vec<&str> = other_nodes(&all, std::slice::from_ref(&gpu)).iter().map(|(o, _)| o.instance.as_str()).collect();
        assert_eq!(others, ["one", "narrow"]);
        assert_eq!(sold_as(&all, &gpu, ""), (vec![OnDemand], true));
        assert_eq!(sold_as(std::slice::from_ref(&one), &gpu, ""), (vec![], true));
        assert_eq!(sold_as(&[one], &gpu, "elsewhere"), (vec![], false));
        let spot = offering("s", "H100", price("r", Spot, 5.0, &[]));
        assert_eq!(sold_as(&[spot, full], &gpu, "r"), (vec![OnDemand, Spot], false));
    }
}
