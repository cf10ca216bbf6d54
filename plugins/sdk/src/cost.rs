//! Cost-model plugins: a cloud's offerings and itemised quotes.
//!
//! Most clouds bill node-hours rounded up to a billing increment, with a minimum charge;
//! [`standard_quote`] implements exactly that, plus storage and egress lines, so a price
//! list plugin only has to list its offerings. [`offerings_from_csv`] turns a price list
//! kept as CSV beside the plugin (one row per instance and region) into those offerings,
//! and [`validate_offerings`] / [`validate_quote`] are the host's own rules (one definition,
//! in `runner_contract`), so a plugin's tests catch what the host would refuse.

/// An itemised quote (WIT `itemised-quote`, named apart from the `quote` function).
pub use crate::bindings::cost::exports::runner::plugin::cost_model::ItemisedQuote as Quote;
/// Who the cloud is (WIT `provider-info`; WIT cannot name a record and the `provider`
/// function alike).
pub use crate::bindings::cost::exports::runner::plugin::cost_model::ProviderInfo as Provider;
pub use crate::bindings::cost::exports::runner::plugin::cost_model::{
    Guest, LineCategory, Offering, Price, PriceCaveat, PurchaseOption, QuoteLine, QuoteRequest,
};
pub use runner_contract::cost::{ANY_REGION, billed_seconds};

/// The rules the host applies to price lists and quotes (the same code: `runner_contract`),
/// so a plugin's own tests catch what the host would refuse.
pub mod rules {
    use super::*;
    use crate::bindings::cost::exports::runner::plugin::cost_model::{ItemisedQuote, ProviderInfo};
    runner_contract::cost_rules!();
}
pub use rules::{
    PURCHASE_OPTIONS, find_price, has_upfront, list_price_floor, option_name, parse_option,
    term_hours, validate_offerings, validate_provider, validate_quote,
};

/// Export `$ty` (an implementation of [`Guest`]) as the plugin's cost model:
/// `runner_plugin_sdk::export_cost!(MyCloud);`.
///
/// Only a wasm build exports anything: the export names (`runner:plugin/cost-model@...#quote`)
/// are not valid native linker symbols, so a native cdylib would not link, and native builds
/// exist only to run unit tests, which call the `Guest` functions directly.
#[macro_export]
macro_rules! export_cost {
    ($ty:ident) => {
        #[cfg(target_arch = "wasm32")]
        $crate::bindings::cost::export_cost!($ty);
    };
}

impl Offering {
    /// Whole nodes of `gpus_per_node` GPUs, one NVLink domain each, sold one at a time,
    /// interconnect unknown: set what differs with struct-update syntax.
    pub fn nodes(instance: &str, gpu: &str, gpus_per_node: u32, prices: Vec<Price>) -> Offering {
        Offering {
            instance: instance.into(),
            gpu: gpu.into(),
            gpus_per_node,
            scale_up_domain: gpus_per_node,
            node_multiple: 1,
            interconnect_gbps: 0.0,
            prices,
        }
    }
}

impl Price {
    /// A price of `usd_per_node_hour` for `option` in `region`, billed per second with no
    /// minimum, no upfront payment, undated, unsourced and without caveats: set what your
    /// cloud says with struct-update syntax (`Price { minimum_charge_s: 60, ..Price::hourly(..) }`).
    pub fn hourly(region: &str, option: PurchaseOption, usd_per_node_hour: f64) -> Price {
        Price {
            region: region.into(),
            option,
            usd_per_node_hour,
            upfront_usd_per_node: 0.0,
            billing_increment_s: 1,
            minimum_charge_s: 0,
            effective_date: String::new(),
            source: String::new(),
            caveats: Vec::new(),
        }
    }
}

/// Storage and egress list prices a standard quote uses (USD). `None` means the plugin
/// knows no price: the quote still shows the line, costs it at zero and says so, rather
/// than pass off "unknown" as "free".
#[derive(Clone, Copy, Debug)]
pub struct ExtraRates {
    pub storage_usd_per_gb_month: Option<f64>,
    pub egress_usd_per_gb: Option<f64>,
}

/// No storage or egress charges (for clouds that include them).
pub const NO_EXTRAS: ExtraRates =
    ExtraRates { storage_usd_per_gb_month: Some(0.0), egress_usd_per_gb: Some(0.0) };

/// No known storage or egress prices (for clouds that publish none we could find).
pub const UNKNOWN_EXTRAS: ExtraRates =
    ExtraRates { storage_usd_per_gb_month: None, egress_usd_per_gb: None };

/// Bytes per GiB over bytes per GB: divide a $/GiB list price by this for $/GB.
pub const GB_PER_GIB: f64 = 1.073_741_824;

/// How a cloud bills node time, shared by all its offerings.
#[derive(Clone, Copy, Debug)]
pub struct Billing {
    pub increment_s: u32,
    pub minimum_s: u32,
    /// Appended to every offering's `source`: where the billing rule comes from (or that
    /// it is unknown), and any caveat that holds for the whole price list.
    pub note: &'static str,
}

/// Quote `request` against `offerings` with no storage or egress charges.
pub fn standard_quote(offerings: &[Offering], request: &QuoteRequest) -> Result<Quote, String> {
    standard_quote_with(offerings, request, NO_EXTRAS)
}

/// Quote `request`: compute = nodes x billed hours x node price, where billed time is the
/// run's time rounded up to the price's billing increment and at least its minimum charge
/// (both per node; [`billed_seconds`]), plus the upfront part of a committed term, plus
/// storage and egress lines. An empty request region takes the first region priced for the
/// option. The lines carry the price's caveats, and the quote warns about them.
///
/// # Errors
/// Names the unknown instance, or the region/option without a price, and lists what exists;
/// rejects negative or non-finite hours, storage and egress.
pub fn standard_quote_with(
    offerings: &[Offering],
    request: &QuoteRequest,
    extras: ExtraRates,
) -> Result<Quote, String> {
    let offering = offerings.iter().find(|o| o.instance == request.instance).ok_or_else(|| {
        let names: Vec<&str> = offerings.iter().map(|o| o.instance.as_str()).collect();
        format!("unknown instance '{}'; this cloud offers: {}", request.instance, names.join(", "))
    })?;
    let price = find_price(offering, &request.region, request.option).ok_or_else(|| {
        let have: Vec<String> = offering
            .prices
            .iter()
            .map(|p| format!("{} {}", p.region, option_name(p.option)))
            .collect();
        format!(
            "no {} price for {} in region '{}'; priced: {}",
            option_name(request.option),
            offering.instance,
            request.region,
            have.join(", ")
        )
    })?;
    for (what, value) in [
        ("hours", request.hours),
        ("storage GB-months", request.storage_gb_months),
        ("egress GB", request.egress_gb),
    ] {
        if !(value.is_finite() && value >= 0.0) {
            return Err(format!("{what} must be a finite, non-negative number, got {value}"));
        }
    }
    let billed_h =
        billed_seconds(request.hours, price.billing_increment_s, price.minimum_charge_s) / 3600.0;
    let region = if price.region == ANY_REGION && !request.region.is_empty() {
        request.region.as_str()
    } else {
        price.region.as_str()
    };
    let nodes = f64::from(request.nodes);
    let mut lines = vec![QuoteLine {
        item: format!(
            "{} x {} ({}, {}, {})",
            request.nodes,
            offering.instance,
            offering.gpu,
            option_name(request.option),
            region
        ),
        category: LineCategory::Compute,
        quantity: nodes * billed_h,
        unit: "node-hour".into(),
        amount: nodes * billed_h * price.usd_per_node_hour,
        estimate: false,
        caveats: price.caveats.clone(),
    }];
    if price.upfront_usd_per_node > 0.0 {
        lines.push(QuoteLine {
            item: format!("upfront payment for {} x {} ({})", request.nodes, offering.instance, option_name(request.option)),
            category: LineCategory::Upfront,
            quantity: nodes,
            unit: "node".into(),
            amount: nodes * price.upfront_usd_per_node,
            estimate: false,
            caveats: price.caveats.clone(),
        });
    }
    let extra_lines = [
        ("storage", LineCategory::Storage, request.storage_gb_months, "GB-month", extras.storage_usd_per_gb_month),
        ("egress", LineCategory::Egress, request.egress_gb, "GB", extras.egress_usd_per_gb),
    ];
    for (item, category, quantity, unit, rate) in extra_lines {
        if quantity > 0.0 {
            lines.push(QuoteLine {
                item: match rate {
                    Some(_) => item.to_string(),
                    None => format!("{item} (no list price known; not costed)"),
                },
                category,
                quantity,
                unit: unit.into(),
                amount: quantity * rate.unwrap_or(0.0),
                estimate: true,
                caveats: Vec::new(),
            });
        }
    }
    let mut warnings = Vec::new();
    for caveat in &price.caveats {
        warnings.push(match caveat {
            PriceCaveat::LowerBound => "the node price is a lower bound (\"from\" price); the real price is at least this".to_string(),
            PriceCaveat::Resale => "the node price is a marketplace resale listing, not the provider's own".to_string(),
            PriceCaveat::Suspect => "the source flags the node price as suspect".to_string(),
        });
    }
    let total = lines.iter().map(|l| l.amount).sum();
    Ok(Quote { currency: "USD".into(), lines, total, warnings })
}

/// The price columns a price-list CSV may have, USD per node-hour; an empty cell means
/// "not sold that way there". Reserved columns are committed terms with no upfront payment,
/// billed (as such terms are) for the whole term at least.
const PRICE_COLUMNS: [(&str, PurchaseOption); 5] = [
    ("on_demand", PurchaseOption::OnDemand),
    ("spot", PurchaseOption::Spot),
    ("reserved_1y", PurchaseOption::OneYearNoUpfront),
    ("reserved_3y", PurchaseOption::ThreeYearNoUpfront),
    ("capacity_block", PurchaseOption::CapacityBlock),
];

const OTHER_COLUMNS: [&str; 10] = [
    "instance",
    "gpu",
    "gpus_per_node",
    "scale_up_domain",
    "node_multiple",
    "interconnect_gbps",
    "region",
    "effective_date",
    "source",
    "caveats",
];

/// Parse a price list: one row per instance and region, grouped into one offering per
/// instance (in first-seen order). Each price carries its row's date, source and caveats,
/// and `billing` (whose note is appended to the source); committed terms bill the whole
/// term at least.
///
/// The first non-comment line names the columns, in any order: `instance`, `gpu`,
/// `gpus_per_node` and `region` are required; `scale_up_domain` (default: the node's GPU
/// count), `node_multiple` (default 1), `interconnect_gbps` (default 0, unknown),
/// `effective_date` (ISO; empty when undated), `source`, `caveats` (any of `lower-bound`,
/// `resale`, `suspect`, separated by `;`), and the price columns `on_demand`, `spot`,
/// `reserved_1y`, `reserved_3y`, `capacity_block` are optional. Lines starting with `#` are
/// comments; cells may be double-quoted to hold commas (no line breaks inside cells). A
/// region of [`ANY_REGION`] means the price holds everywhere.
///
/// # Errors
/// Names the line and column of an unknown column, a malformed number, a price that is
/// not finite and positive, or rows of one instance that disagree on its hardware.
pub fn offerings_from_csv(csv: &str, billing: Billing) -> Result<Vec<Offering>, String> {
    let mut rows = csv
        .lines()
        .enumerate()
        .map(|(i, line)| (i + 1, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'));
    let (header_line, header) = rows.next().ok_or("price list: no header row")?;
    let columns =
        split_csv_line(header).map_err(|e| format!("price list line {header_line}: {e}"))?;
    for column in &columns {
        if !OTHER_COLUMNS.contains(&column.as_str())
            && !PRICE_COLUMNS.iter().any(|(c, _)| c == column)
        {
            return Err(format!("price list line {header_line}: unknown column '{column}'"));
        }
    }
    for required in ["instance", "gpu", "gpus_per_node", "region"] {
        if !columns.iter().any(|c| c == required) {
            return Err(format!("price list line {header_line}: missing column '{required}'"));
        }
    }

    let mut offerings: Vec<Offering> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (line, text) in rows {
        let cells = split_csv_line(text).map_err(|e| format!("price list line {line}: {e}"))?;
        if cells.len() != columns.len() {
            return Err(format!(
                "price list line {line}: {} cells, but the header names {} columns",
                cells.len(),
                columns.len()
            ));
        }
        let cell =
            |name: &str| columns.iter().position(|c| c == name).map_or("", |i| cells[i].as_str());
        let number = |name: &str| -> Result<Option<f64>, String> {
            match cell(name) {
                "" => Ok(None),
                s => s.parse::<f64>().map(Some).map_err(|_| {
                    format!("price list line {line}, column {name}: '{s}' is not a number")
                }),
            }
        };
        let count = |name: &str| -> Result<Option<u32>, String> {
            match cell(name) {
                "" => Ok(None),
                s => s.parse::<u32>().map(Some).map_err(|_| {
                    format!("price list line {line}, column {name}: '{s}' is not a whole number")
                }),
            }
        };

        let instance = cell("instance");
        if instance.is_empty() || cell("region").is_empty() {
            return Err(format!("price list line {line}: instance and region must not be empty"));
        }
        let gpus_per_node = count("gpus_per_node")?
            .ok_or_else(|| format!("price list line {line}: gpus_per_node is empty"))?;
        let row = Offering {
            instance: instance.to_string(),
            gpu: cell("gpu").to_string(),
            gpus_per_node,
            scale_up_domain: count("scale_up_domain")?.unwrap_or(gpus_per_node),
            node_multiple: count("node_multiple")?.unwrap_or(1),
            interconnect_gbps: number("interconnect_gbps")?.unwrap_or(0.0),
            prices: Vec::new(),
        };
        let mut caveats = Vec::new();
        for c in cell("caveats").split(';').map(str::trim).filter(|c| !c.is_empty()) {
            caveats.push(match c {
                "lower-bound" => PriceCaveat::LowerBound,
                "resale" => PriceCaveat::Resale,
                "suspect" => PriceCaveat::Suspect,
                other => {
                    return Err(format!(
                        "price list line {line}, column caveats: '{other}' is not lower-bound, resale or suspect"
                    ));
                }
            });
        }
        let source = if billing.note.is_empty() {
            cell("source").to_string()
        } else {
            format!("{} | {}", cell("source"), billing.note)
        };

        let at = match index.get(instance) {
            Some(&at) => {
                let seen = &offerings[at];
                if (&seen.gpu, seen.gpus_per_node, seen.scale_up_domain, seen.node_multiple)
                    != (&row.gpu, row.gpus_per_node, row.scale_up_domain, row.node_multiple)
                    || seen.interconnect_gbps != row.interconnect_gbps
                {
                    return Err(format!(
                        "price list line {line}: {instance} differs in hardware from an earlier row"
                    ));
                }
                at
            }
            None => {
                index.insert(instance.to_string(), offerings.len());
                offerings.push(row);
                offerings.len() - 1
            }
        };
        for (column, option) in PRICE_COLUMNS {
            if let Some(usd) = number(column)? {
                if !(usd.is_finite() && usd > 0.0) {
                    return Err(format!(
                        "price list line {line}, column {column}: price {usd} must be positive"
                    ));
                }
                // A committed term is billed for the whole term, used or not.
                let minimum_charge_s = term_hours(option)
                    .map_or(billing.minimum_s, |h| (h * 3600.0) as u32);
                offerings[at].prices.push(Price {
                    region: cell("region").to_string(),
                    option,
                    usd_per_node_hour: usd,
                    upfront_usd_per_node: 0.0,
                    billing_increment_s: billing.increment_s,
                    minimum_charge_s,
                    effective_date: cell("effective_date").to_string(),
                    source: source.clone(),
                    caveats: caveats.clone(),
                });
            }
        }
    }
    Ok(offerings)
}

/// Split one CSV line into trimmed cells; double quotes protect commas, `""` is a quote.
fn split_csv_line(line: &str) -> Result<Vec<String>, String> {
    let mut cells = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        let cell = cells.last_mut().expect("cells starts non-empty");
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                cell.push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => cells.push(String::new()),
            _ => cell.push(c),
        }
    }
    if quoted {
        return Err("unterminated quote".into());
    }
    Ok(cells.into_iter().map(|c| c.trim().to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BILLING: Billing = Billing { increment_s: 60, minimum_s: 600, note: "billing: test" };

    const LIST: &str = "\
# a comment line, then the header
instance,gpu,gpus_per_node,region,on_demand,spot,reserved_1y,effective_date,source,caveats
big,H100,8,east,10,4,,2026-09-20,\"page, read by hand\",
big,H100,8,west,12,,9,,page,lower-bound
small,A100,4,*,3,,,2026-01-01,catalog,
";

    fn request(instance: &str, region: &str, hours: f64) -> QuoteRequest {
        QuoteRequest {
            instance: instance.into(),
            gpus: 16,
            nodes: 2,
            hours,
            region: region.into(),
            option: PurchaseOption::OnDemand,
            start_date: String::new(),
            storage_gb_months: 0.0,
            egress_gb: 0.0,
        }
    }

    #[test]
    fn csv_groups_rows_by_instance_and_dates_each_price() {
        let offerings = offerings_from_csv(LIST, BILLING).unwrap();
        assert_eq!(offerings.len(), 2);
        let big = &offerings[0];
        assert_eq!(big.prices.len(), 4);
        assert_eq!(big.scale_up_domain, 8);
        assert_eq!(big.node_multiple, 1);
        assert_eq!(big.prices[0].effective_date, "2026-09-20");
        assert_eq!(big.prices[2].effective_date, "", "an undated row stays undated");
        assert_eq!(big.prices[0].source, "page, read by hand | billing: test");
        assert_eq!(big.prices[2].caveats, vec![PriceCaveat::LowerBound]);
        let reserved = &big.prices[3];
        assert_eq!(reserved.option, PurchaseOption::OneYearNoUpfront);
        assert_eq!(reserved.minimum_charge_s, 8760 * 3600, "a 1-year term bills the year");
        validate_offerings(&offerings).unwrap();
    }

    #[test]
    fn csv_errors_name_the_line_and_column() {
        let bad = "instance,gpu,gpus_per_node,region,on_demand\nx,H100,8,east,ten\n";
        let err = offerings_from_csv(bad, BILLING).unwrap_err();
        assert!(
            err.contains("line 2") && err.contains("on_demand") && err.contains("'ten'"),
            "{err}"
        );
        let err = offerings_from_csv("instance,gpu,gpus_per_node,region,ondemand\n", BILLING)
            .unwrap_err();
        assert!(err.contains("unknown column 'ondemand'"), "{err}");
        let bad = "instance,gpu,gpus_per_node,region,on_demand\nx,H100,8,east,-1\n";
        assert!(offerings_from_csv(bad, BILLING).unwrap_err().contains("must be positive"));
        let bad = "instance,gpu,gpus_per_node,region,on_demand,caveats\nx,H100,8,east,1,cheap\n";
        assert!(offerings_from_csv(bad, BILLING).unwrap_err().contains("'cheap'"));
    }

    #[test]
    fn quote_rounds_up_to_the_increment_and_the_minimum() {
        let offerings = offerings_from_csv(LIST, BILLING).unwrap();
        // 601 s bills eleven minutes; 1 s bills the 600 s minimum.
        let q = standard_quote(&offerings, &request("big", "east", 601.0 / 3600.0)).unwrap();
        assert!((q.total - 2.0 * (660.0 / 3600.0) * 10.0).abs() < 1e-9);
        let q = standard_quote(&offerings, &request("big", "east", 1.0 / 3600.0)).unwrap();
        assert!((q.total - 2.0 * (600.0 / 3600.0) * 10.0).abs() < 1e-9);
        // 1.1 h is 3960.0000000000005 s in binary; it must bill 66 minutes, not 67.
        let q = standard_quote(&offerings, &request("big", "east", 1.1)).unwrap();
        assert!((q.lines[0].quantity - 2.0 * 1.1).abs() < 1e-9, "{}", q.lines[0].quantity);
        // The SDK's own quote passes the host's rules.
        validate_quote(&request("big", "east", 1.1), &q, &offerings).unwrap();
    }

    #[test]
    fn caveated_prices_warn_and_committed_terms_bill_the_term() {
        let offerings = offerings_from_csv(LIST, BILLING).unwrap();
        let q = standard_quote(&offerings, &request("big", "west", 1.0)).unwrap();
        assert!(q.warnings[0].contains("lower bound"), "{:?}", q.warnings);
        assert_eq!(q.lines[0].caveats, vec![PriceCaveat::LowerBound]);
        let mut r = request("big", "west", 1.0);
        r.option = PurchaseOption::OneYearNoUpfront;
        let q = standard_quote(&offerings, &r).unwrap();
        assert!((q.total - 2.0 * 8760.0 * 9.0).abs() < 1e-6, "{}", q.total);
    }

    #[test]
    fn any_region_prices_match_every_region() {
        let offerings = offerings_from_csv(LIST, BILLING).unwrap();
        let q = standard_quote(&offerings, &request("small", "mars-1", 10.0)).unwrap();
        assert!((q.total - 60.0).abs() < 1e-9);
        assert!(q.lines[0].item.contains("mars-1"), "{}", q.lines[0].item);
    }

    #[test]
    fn unknown_extras_are_shown_but_not_costed() {
        let offerings = offerings_from_csv(LIST, BILLING).unwrap();
        let mut r = request("big", "east", 1.0);
        r.egress_gb = 100.0;
        let q = standard_quote_with(&offerings, &r, UNKNOWN_EXTRAS).unwrap();
        assert_eq!(q.lines.len(), 2);
        assert!(q.lines[1].item.contains("no list price") && q.lines[1].estimate);
        assert_eq!(q.lines[1].category, LineCategory::Egress);
        assert!((q.total - 20.0).abs() < 1e-9);
        r.egress_gb = -1.0;
        assert!(standard_quote(&offerings, &r).unwrap_err().contains("egress"));
    }

    #[test]
    fn validation_catches_spot_above_on_demand() {
        let list = "instance,gpu,gpus_per_node,region,on_demand,spot\nx,A100,8,central,10,11\n";
        let err = validate_offerings(&offerings_from_csv(list, BILLING).unwrap()).unwrap_err();
        assert!(err.contains("spot costs 11") && err.contains("more than on-demand (10)"), "{err}");
    }
}
