//! `runner prices`: the list prices behind every quote, per GPU-hour across the clouds,
//! cheapest first (SkyPilot's `sky show-gpus`, with each price's source and date).

use anyhow::Result;
use clap::Args;
use serde::Serialize;

use runner::prices::{self, GpuSummary, ListedPrice, Seller};
use runner::report::{self, Table};
use runner::runfile::CostSection;

use crate::commands::emit_csv;
use crate::{CloudArgs, Global};

/// What `runner prices` lists.
// The option's default is on-demand here and the run file's in explore, and only a listing
// takes `all`: its help is its own, the default applied in `prices` (not by clap).
#[derive(Args, Debug, Clone)]
#[command(mut_arg("option", |a| a.help("Purchase option: on-demand (the default), spot, capacity-block, 1y-no-upfront, ..., or all")))]
#[command(mut_arg("region", |a| a.help("Only this region (default: every region)")))]
pub struct PricesArgs {
    /// GPU types, comma-separated: every price of each, cheapest first (default: a
    /// summary of every GPU type a cloud sells)
    #[arg(long, value_delimiter = ',')]
    pub gpu: Vec<String>,
    #[command(flatten)]
    pub cloud: CloudArgs,
}

#[derive(Serialize)]
struct Listing<'a> {
    option: &'a str,
    region: &'a str,
    /// Per GPU type: the clouds selling it, its cheapest and dearest price.
    summary: Vec<SummaryRow<'a>>,
    prices: &'a [ListedPrice],
    notes: &'a [String],
}

#[derive(Serialize)]
struct SummaryRow<'a> {
    gpu: &'a str,
    clouds: usize,
    cheapest: &'a ListedPrice,
    dearest: &'a ListedPrice,
}

/// `runner prices`.
///
/// # Errors
/// A GPU no profile describes, an unknown purchase option, a cloud or price file that
/// cannot be used, or a region no cloud sells in.
pub fn prices(args: &PricesArgs, global: &Global) -> Result<()> {
    let profiles = runner::project::profiles(global.profile.as_deref())?;
    // On-demand in every region unless the flags say otherwise.
    let mut cost = CostSection::default();
    args.cloud.apply(&mut cost)?;
    let option = match cost.option.as_str() {
        "all" => None,
        o => Some(runner::runfile::parse_option(o).map_err(|e| anyhow::anyhow!("{}, or all", e.replacen("[cost] option", "--option", 1)))?),
    };
    let mut notes = Vec::new();
    // Loading takes well under a second from the compile cache: no progress to show.
    let quiet = |_: &str, _: usize, _: usize| {};
    let clouds = runner::explore::load_clouds(&cost, &profiles, runner::plugin::Limits::default(), &quiet, &mut Vec::new(), &mut notes)?;
    let gpus = if args.gpu.is_empty() {
        profiles.gpus.clone()
    } else {
        let mut gpus = Vec::new();
        for name in &args.gpu {
            let gpu = profiles.get(name).map_err(anyhow::Error::msg)?.clone();
            if gpus.iter().any(|g: &runner_project::profile::GpuProfile| g.name == gpu.name) {
                anyhow::bail!("--gpu names {} twice: name each GPU type once", gpu.name);
            }
            gpus.push(gpu);
        }
        gpus
    };
    let sellers: Vec<Seller<'_>> = clouds.iter().map(Seller::from).collect();
    let listed = prices::list(&sellers, &gpus, option, &cost.region);
    let unsold: Vec<&str> = gpus.iter().filter(|g| !listed.iter().any(|p| p.gpu == g.name)).map(|g| g.name.as_str()).collect();
    if !args.gpu.is_empty() && !unsold.is_empty() {
        notes.push(format!(
            "no cloud here lists {} {}{}: a price file of your own (--price-file) can",
            unsold.join(", "),
            if option.is_some() { cost.option.as_str() } else { "at any option" },
            if cost.region.is_empty() { String::new() } else { format!(" in {}", cost.region) }
        ));
    }
    notes.push(
        "a list price is a price row, not a quote: no storage, egress or spot interruptions, and no rounding \
         to whole nodes or billing increments (runner explore prices a run); a committed term's upfront part is \
         spread over the term's hours"
            .into(),
    );
    let summary = prices::summarise(&listed);
    let detailed = !args.gpu.is_empty();
    let table = if detailed { detail_table(&listed, &cost.option, &notes) } else { summary_table(&listed, &summary, &cost.option, &notes) };
    let value = Listing {
        option: &cost.option,
        region: &cost.region,
        summary: summary.iter().map(|s| summary_row(&listed, s)).collect(),
        prices: &listed,
        notes: &notes,
    };
    // The CSV: a row per listed price under the JSON's names (named with none listed too).
    let mut csv = report::records(&listed);
    if listed.is_empty() {
        csv.headers = [
            "gpu",
            "cloud",
            "plugin",
            "plugin_sha256",
            "instance",
            "gpus_per_node",
            "scale_up_domain",
            "node_multiple",
            "option",
            "region",
            "regions",
            "usd_per_node_hour",
            "upfront_usd_per_node",
            "usd_per_gpu_hour",
            "billing_increment_s",
            "minimum_charge_s",
            "effective_date",
            "source",
            "caveats",
        ]
        .map(String::from)
        .to_vec();
    }
    csv.notes = notes.clone();
    emit_csv(global, &table, &value, &csv)
}

fn summary_row<'a>(listed: &'a [ListedPrice], s: &'a GpuSummary) -> SummaryRow<'a> {
    SummaryRow { gpu: &s.gpu, clouds: s.clouds, cheapest: &listed[s.cheapest], dearest: &listed[s.dearest] }
}

/// "$2.10/GPU-h" cells: per-hour prices are small, so cents always show.
fn per_hour(v: f64) -> String {
    if v < 1000.0 { format!("${v:.2}") } else { report::usd(v) }
}

/// A price's marks: `!` for a caveated one.
fn marked(p: &ListedPrice) -> String {
    let mark = if p.caveats.is_empty() { "" } else { "!" };
    format!("{}{mark}", per_hour(p.usd_per_gpu_hour))
}

fn where_sold(p: &ListedPrice) -> String {
    format!("{} {} {}", p.cloud, p.instance, region(p))
}

fn region(p: &ListedPrice) -> &str {
    if p.region == runner::pricing::ANY_REGION { "any region" } else { &p.region }
}

fn options(option: &str) -> &str {
    if option == "all" { "every purchase option" } else { option }
}

fn summary_table(listed: &[ListedPrice], summary: &[GpuSummary], option: &str, notes: &[String]) -> Table {
    let mut t = Table::new(
        format!("List prices per GPU-hour, {}: the cheapest and dearest of each GPU type (runner prices --gpu NAME lists all)", options(option)),
        &["gpu", "clouds", "cheapest", "cheapest at", "dearest", "dearest at"],
    );
    for s in summary {
        let (c, d) = (&listed[s.cheapest], &listed[s.dearest]);
        t.rows.push(vec![s.gpu.clone(), s.clouds.to_string(), marked(c), where_sold(c), marked(d), where_sold(d)]);
    }
    if summary.iter().any(|s| !listed[s.cheapest].caveats.is_empty()) {
        t.notes.push("'!': a price its source calls a lower bound, resale or suspect: listed after every clean price".into());
    }
    t.notes.extend(notes.iter().cloned());
    t
}

fn detail_table(listed: &[ListedPrice], option: &str, notes: &[String]) -> Table {
    let mut t = Table::new(
        format!("List prices per GPU-hour, {}, cheapest first (clean prices before caveated ones)", options(option)),
        &["gpu", "cloud", "instance", "GPUs/node", "option", "region", "regions", "$/GPU-h", "$/node-h", "billing", "date", "caveats"],
    );
    for p in listed {
        t.rows.push(vec![
            p.gpu.clone(),
            p.cloud.clone(),
            p.instance.clone(),
            p.gpus_per_node.to_string(),
            p.option.clone(),
            region(p).to_string(),
            p.regions.to_string(),
            marked(p),
            per_hour(p.usd_per_node_hour),
            prices::billing(p.billing_increment_s, p.minimum_charge_s),
            if p.effective_date.is_empty() { "undated".into() } else { p.effective_date.clone() },
            p.caveats.join(" "),
        ]);
        if p.upfront_usd_per_node > 0.0 {
            t.notes.push(format!(
                "{} {} {}: {} per node up front, spread over the term in $/GPU-h",
                p.cloud,
                p.instance,
                p.option,
                report::usd(p.upfront_usd_per_node)
            ));
        }
    }
    if listed.iter().any(|p| !p.caveats.is_empty()) {
        t.notes.push("'!': a price its source calls a lower bound, resale or suspect (its caveats column says which): listed after every clean price".into());
    }
    for p in listed {
        t.notes.push(format!("source of {} {} {} {}: {}", p.cloud, p.instance, p.option, p.region, p.source));
    }
    t.notes.extend(notes.iter().cloned());
    t
}
