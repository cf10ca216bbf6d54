//! `runner prices`: the list prices the quotes are priced from, per GPU-hour, cheapest
//! first, each with its instance, region, purchase option, billing, date, caveats and
//! source (SkyPilot's `sky show-gpus`, with every figure's provenance).
//!
//! A listed price is one price row of a cloud's offerings, not a quote: no storage, egress
//! or spot interruptions, and no rounding to whole nodes or billing increments (what a run
//! pays is `runner explore`'s to say).

use serde::Serialize;

use crate::plugin::PluginInfo;
use crate::plugin::cost::{Offering, Price, PurchaseOption, hourly_per_node};
use crate::pricing;
use runner_project::profile::GpuProfile;

/// What a listing reads of a cloud: its name, its plugin and its offerings.
pub struct Seller<'a> {
    pub cloud: &'a str,
    pub plugin: &'a PluginInfo,
    pub offerings: &'a [Offering],
}

impl<'a> From<&'a pricing::Cloud> for Seller<'a> {
    fn from(c: &'a pricing::Cloud) -> Seller<'a> {
        Seller { cloud: &c.name, plugin: &c.info, offerings: c.offerings() }
    }
}

/// One instance's price for one purchase option: its cheapest region's row.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ListedPrice {
    /// The GPU profile the instance's GPU is (its name, not the cloud's spelling).
    pub gpu: String,
    pub cloud: String,
    /// The cost plugin and its sha256.
    pub plugin: String,
    pub plugin_sha256: String,
    pub instance: String,
    pub gpus_per_node: u32,
    /// GPUs sharing the scale-up (NVLink) domain, and the nodes sold at once (18 trays of
    /// an NVL72 rack).
    pub scale_up_domain: u32,
    pub node_multiple: u32,
    pub option: String,
    /// The cheapest region's row (`*`: one price in every region).
    pub region: String,
    /// Regions the instance is priced in for this option (those matching `--region`).
    pub regions: usize,
    pub usd_per_node_hour: f64,
    /// Paid once per node for a committed term (partial and all upfront).
    pub upfront_usd_per_node: f64,
    /// Per GPU-hour, a committed term's upfront part spread over the term's hours.
    pub usd_per_gpu_hour: f64,
    pub billing_increment_s: u32,
    pub minimum_charge_s: u32,
    /// ISO date the price took effect or was read; empty when undated.
    pub effective_date: String,
    pub source: String,
    /// lower-bound, resale, suspect: why the price must not be taken at face value.
    pub caveats: Vec<String>,
}

/// A GPU type across the clouds: how many sell it and the cheapest and dearest price.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GpuSummary {
    pub gpu: String,
    pub clouds: usize,
    /// Indexes into the listing (clean prices first, as the quotes choose them).
    pub cheapest: usize,
    pub dearest: usize,
}

/// The prices of `gpus` on `clouds` for `option` (`None`: every option) in `region`
/// (empty: any): per cloud, instance and option the cheapest region's row. Listed per GPU
/// in `gpus`' order, clean prices before caveated ones (as a quote chooses them), each
/// cheapest first per GPU-hour.
pub fn list(sellers: &[Seller<'_>], gpus: &[GpuProfile], option: Option<PurchaseOption>, region: &str) -> Vec<ListedPrice> {
    let mut out = Vec::new();
    for gpu in gpus {
        let mut rows: Vec<ListedPrice> = Vec::new();
        for seller in sellers {
            for o in seller.offerings.iter().filter(|o| pricing::matches_gpu(o, gpu)) {
                rows.extend(instance_prices(seller, o, gpu, option, region));
            }
        }
        rows.sort_by(|a, b| {
            (!a.caveats.is_empty())
                .cmp(&!b.caveats.is_empty())
                .then(a.usd_per_gpu_hour.total_cmp(&b.usd_per_gpu_hour))
                .then_with(|| (&a.cloud, &a.instance, &a.option).cmp(&(&b.cloud, &b.instance, &b.option)))
        });
        out.extend(rows);
    }
    out
}

/// One offering's rows: per purchase option asked, its cheapest region's price.
fn instance_prices(seller: &Seller<'_>, o: &Offering, gpu: &GpuProfile, option: Option<PurchaseOption>, region: &str) -> Vec<ListedPrice> {
    let mut by_option: Vec<(PurchaseOption, &Price, usize)> = Vec::new();
    for p in o.prices.iter().filter(|p| option.is_none_or(|x| x == p.option) && pricing::in_region(&p.region, region)) {
        match by_option.iter_mut().find(|(x, _, _)| *x == p.option) {
            Some((_, best, n)) => {
                *n += 1;
                if hourly_per_node(p) < hourly_per_node(best) {
                    *best = p;
                }
            }
            None => by_option.push((p.option, p, 1)),
        }
    }
    let node = f64::from(o.gpus_per_node.max(1));
    by_option
        .into_iter()
        .map(|(option, p, regions)| ListedPrice {
            gpu: gpu.name.clone(),
            cloud: seller.cloud.to_string(),
            plugin: seller.plugin.name.clone(),
            plugin_sha256: seller.plugin.sha256.clone(),
            instance: o.instance.clone(),
            gpus_per_node: o.gpus_per_node,
            scale_up_domain: o.scale_up_domain,
            node_multiple: o.node_multiple,
            option: crate::plugin::cost::option_name(option).into(),
            region: p.region.clone(),
            regions,
            usd_per_node_hour: p.usd_per_node_hour,
            upfront_usd_per_node: p.upfront_usd_per_node,
            usd_per_gpu_hour: hourly_per_node(p) / node,
            billing_increment_s: p.billing_increment_s,
            minimum_charge_s: p.minimum_charge_s,
            effective_date: p.effective_date.clone(),
            source: p.source.clone(),
            caveats: p.caveats.iter().map(|&c| pricing::caveat_name(c).to_string()).collect(),
        })
        .collect()
}

/// Per GPU in the listing, the clouds that sell it and its cheapest and dearest prices
/// (the cheapest among clean prices where any is, as a quote would choose).
pub fn summarise(listed: &[ListedPrice]) -> Vec<GpuSummary> {
    let mut out: Vec<GpuSummary> = Vec::new();
    let mut start = 0;
    while start < listed.len() {
        let gpu = &listed[start].gpu;
        let end = start + listed[start..].iter().take_while(|p| &p.gpu == gpu).count();
        let rows = &listed[start..end];
        let clouds: std::collections::BTreeSet<&str> = rows.iter().map(|p| p.cloud.as_str()).collect();
        // Sorted clean first, each cheapest first: the first row is the cheapest a quote
        // would take; the dearest is the dearest of the same kind.
        let clean = rows[0].caveats.is_empty();
        let same: Vec<usize> = (start..end).filter(|&i| listed[i].caveats.is_empty() == clean).collect();
        out.push(GpuSummary { gpu: gpu.clone(), clouds: clouds.len(), cheapest: start, dearest: *same.last().unwrap_or(&start) });
        start = end;
    }
    out
}

/// A billing rule in words, as `runner prices` and `runner plugins inspect` print it: "1 s",
/// "1 s, min 1 min", "1 h, min 24 h", "8760 h" (a term billed whole).
pub fn billing(increment_s: u32, minimum_s: u32) -> String {
    let span = |s: u32| match s {
        s if s >= 3600 && s % 3600 == 0 => format!("{} h", s / 3600),
        s if s >= 60 && s % 60 == 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    };
    if minimum_s > increment_s { format!("{}, min {}", span(increment_s), span(minimum_s)) } else { span(increment_s) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> PluginInfo {
        PluginInfo {
            name: "c.wasm".into(),
            kind: crate::plugin::Kind::Cost,
            contract: "0.3.0".into(),
            source: crate::plugin::Source::Embedded,
            sha256: "0".repeat(64),
            bytes: 0,
            shadows_embedded: false,
        }
    }

    use crate::plugin::cost::test_price as price;

    /// Per GPU-hour is per node-hour over the node's GPUs, a term's upfront part spread
    /// over the term's hours (1 year: 8760 h); per instance and option the cheapest
    /// region stands for the rest, which are counted. Kills: the upfront left out, a
    /// region other than the cheapest kept, options merged.
    #[test]
    fn a_rows_gpu_hour_spreads_the_upfront_and_keeps_the_cheapest_region() {
        let o = Offering {
            instance: "i8".into(),
            gpu: "H100".into(),
            gpus_per_node: 8,
            scale_up_domain: 8,
            node_multiple: 1,
            interconnect_gbps: 3200.0,
            prices: vec![
                price("east", PurchaseOption::OnDemand, 40.0, 0.0),
                price("west", PurchaseOption::OnDemand, 32.0, 0.0),
                price("west", PurchaseOption::OneYearPartialUpfront, 16.0, 8760.0 * 8.0),
            ],
        };
        let gpu = runner_project::profile::Profiles::builtin().get("h100").unwrap().clone();
        let info = info();
        let offerings = [o.clone()];
        let c = Seller { cloud: "c", plugin: &info, offerings: &offerings };
        let rows = instance_prices(&c, &o, &gpu, None, "");
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].region.as_str(), rows[0].regions, rows[0].usd_per_gpu_hour), ("west", 2, 4.0));
        // 16 + 8 x 8760 / 8760 = 24 per node-hour, 3 per GPU-hour.
        assert_eq!((rows[1].option.as_str(), rows[1].usd_per_gpu_hour), ("1y-partial-upfront", 3.0));
        // A region asked keeps only its rows; an option asked, only its.
        let east = instance_prices(&c, &o, &gpu, Some(PurchaseOption::OnDemand), "EAST");
        assert_eq!((east.len(), east[0].usd_per_gpu_hour, east[0].regions), (1, 5.0, 1));
    }

    /// Clean prices list before caveated ones, each cheapest first, and the summary's
    /// cheapest is the first clean one. Kills: sorting on price alone (the resale $1 row
    /// first), the summary reading a caveated row as the cheapest.
    #[test]
    fn clean_prices_come_first_and_the_summary_takes_its_cheapest_from_them() {
        let mut o = Offering {
            instance: "i8".into(),
            gpu: "h100".into(),
            gpus_per_node: 8,
            scale_up_domain: 8,
            node_multiple: 1,
            interconnect_gbps: 0.0,
            prices: vec![price("r", PurchaseOption::OnDemand, 24.0, 0.0)],
        };
        let a = [o.clone()];
        o.prices[0].usd_per_node_hour = 8.0;
        o.prices[0].caveats = vec![crate::plugin::cost::PriceCaveat::Resale];
        let b = [o.clone()];
        o.prices[0].usd_per_node_hour = 16.0;
        o.prices[0].caveats.clear();
        let c = [o];
        let info = info();
        let sellers = [
            Seller { cloud: "a", plugin: &info, offerings: &a },
            Seller { cloud: "b", plugin: &info, offerings: &b },
            Seller { cloud: "c", plugin: &info, offerings: &c },
        ];
        let gpus = vec![runner_project::profile::Profiles::builtin().get("h100").unwrap().clone()];
        let listed = list(&sellers, &gpus, Some(PurchaseOption::OnDemand), "");
        let order: Vec<(&str, f64)> = listed.iter().map(|p| (p.cloud.as_str(), p.usd_per_gpu_hour)).collect();
        assert_eq!(order, [("c", 2.0), ("a", 3.0), ("b", 1.0)]);
        assert_eq!(listed[2].caveats, ["resale"]);
        let s = summarise(&listed);
        assert_eq!(s, [GpuSummary { gpu: "H100".into(), clouds: 3, cheapest: 0, dearest: 1 }]);
    }

    #[test]
    fn billing_rules_read_in_their_units() {
        assert_eq!(billing(1, 0), "1 s");
        assert_eq!(billing(60, 60), "1 min");
        assert_eq!(billing(1, 60), "1 s, min 1 min");
        assert_eq!(billing(3600, 86400), "1 h, min 24 h");
        assert_eq!(billing(8760 * 3600, 8760 * 3600), "8760 h");
    }
}
