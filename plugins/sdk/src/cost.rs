//! Cost-model plugins: a cloud's offerings and itemised quotes.
//!
//! Most clouds bill node-hours rounded up to a billing increment, with a minimum charge;
//! [`standard_quote`] implements exactly that, plus storage and egress lines, so a price
//! list plugin only has to list its offerings. [`offerings_from_csv`] turns a price list
//! kept as CSV beside the plugin (one row per instance and region) into those offerings,
//! and [`validate_offerings`] holds the sanity checks every price list should pass.

/// An itemised quote (WIT `itemised-quote`, named apart from the `quote` function).
pub use crate::bindings::cost::exports::runner::plugin::cost_model::ItemisedQuote as Quote;
/// Who the cloud is (WIT `provider-info`; WIT cannot name a record and the `provider`
/// function alike).
pub use crate::bindings::cost::exports::runner::plugin::cost_model::ProviderInfo as Provider;
pub use crate::bindings::cost::exports::runner::plugin::cost_model::{
    Guest, Offering, Price, PurchaseOption, QuoteLine, QuoteRequest,
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

/// A price whose region is this applies in every region (flat global price lists such
/// as OCI's); a quote for any region, or for none, finds it.
pub const ANY_REGION: &str = "*";

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

/// The human name of a purchase option, as quote lines print it.
pub fn option_name(option: PurchaseOption) -> &'static str {
    match option {
        PurchaseOption::OnDemand => "on-demand",
        PurchaseOption::Spot => "spot",
        PurchaseOption::ReservedOneYear => "reserved-1y",
        PurchaseOption::ReservedThreeYear => "reserved-3y",
        PurchaseOption::CapacityBlock => "capacity-block",
    }
}

/// Quote `request` against `offerings` with no storage or egress charges.
pub fn standard_quote(offerings: &[Offering], request: &QuoteRequest) -> Result<Quote, String> {
    standard_quote_with(offerings, request, NO_EXTRAS)
}

/// Quote `request`: compute = nodes x billed hours x node price, where billed time is the
/// run's time rounded up to the billing increment and at least the minimum charge (both
/// per node). An empty request region takes the first region priced for the option.
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
    let price = offering
        .prices
        .iter()
        .find(|p| {
            p.option == request.option
                && (request.region.is_empty()
                    || p.region == request.region
                    || p.region == ANY_REGION)
        })
        .ok_or_else(|| {
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
    let seconds = request.hours * 3600.0;
    let increment = f64::from(offering.billing_increment_s.max(1));
    // The tolerance keeps binary noise (1.1 h is 3960.0000000000005 s) from billing one more
    // increment; it is far below a second, so no real run is rounded down.
    let increments = (seconds / increment - 1e-9).ceil().max(0.0);
    let billed_s = (increments * increment).max(f64::from(offering.minimum_charge_s));
    let billed_h = billed_s / 3600.0;
    let region = if price.region == ANY_REGION && !request.region.is_empty() {
        request.region.as_str()
    } else {
        price.region.as_str()
    };
    let mut lines = vec![QuoteLine {
        item: format!(
            "{} x {} ({}, {}, {})",
            request.nodes,
            offering.instance,
            offering.gpu,
            option_name(request.option),
            region
        ),
        quantity: f64::from(request.nodes) * billed_h,
        unit: "node-hour".into(),
        usd: f64::from(request.nodes) * billed_h * price.usd_per_node_hour,
        estimate: false,
    }];
    let extra_lines = [
        ("storage", request.storage_gb_months, "GB-month", extras.storage_usd_per_gb_month),
        ("egress", request.egress_gb, "GB", extras.egress_usd_per_gb),
    ];
    for (item, quantity, unit, rate) in extra_lines {
        if quantity > 0.0 {
            lines.push(QuoteLine {
                item: match rate {
                    Some(_) => item.to_string(),
                    None => format!("{item} (no list price known; not costed)"),
                },
                quantity,
                unit: unit.into(),
                usd: quantity * rate.unwrap_or(0.0),
                estimate: true,
            });
        }
    }
    let total_usd = lines.iter().map(|l| l.usd).sum();
    Ok(Quote { lines, total_usd })
}

/// The price columns a price-list CSV may have, USD per node-hour; an empty cell means
/// "not sold that way there".
const PRICE_COLUMNS: [(&str, PurchaseOption); 5] = [
    ("on_demand", PurchaseOption::OnDemand),
    ("spot", PurchaseOption::Spot),
    ("reserved_1y", PurchaseOption::ReservedOneYear),
    ("reserved_3y", PurchaseOption::ReservedThreeYear),
    ("capacity_block", PurchaseOption::CapacityBlock),
];

const OTHER_COLUMNS: [&str; 8] = [
    "instance",
    "gpu",
    "gpus_per_node",
    "scale_up_domain",
    "interconnect_gbps",
    "region",
    "effective_date",
    "source",
];

/// Parse a price list: one row per instance and region, grouped into one offering per
/// instance (in first-seen order), with `billing` applied to all.
///
/// The first non-comment line names the columns, in any order: `instance`, `gpu`,
/// `gpus_per_node` and `region` are required; `scale_up_domain` (default: the node's GPU
/// count), `interconnect_gbps` (default 0, unknown), `effective_date` (ISO; empty when
/// undated), `source`, and the price columns `on_demand`, `spot`, `reserved_1y`,
/// `reserved_3y`, `capacity_block` are optional. Lines starting with `#` are comments;
/// cells may be double-quoted to hold commas (no line breaks inside cells). A region of
/// [`ANY_REGION`] means the price holds everywhere.
///
/// An offering's `source` is its rows' sources, each fact (separated by "; ") said once,
/// then " | " and the billing note. Its `effective_date` is its rows' oldest date: an
/// offering is only as fresh as its stalest price, so one undated row makes it empty.
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
            interconnect_gbps: number("interconnect_gbps")?.unwrap_or(0.0),
            prices: Vec::new(),
            billing_increment_s: billing.increment_s,
            minimum_charge_s: billing.minimum_s,
            effective_date: cell("effective_date").to_string(),
            source: cell("source").to_string(),
        };

        let at = match offerings.iter().position(|o| o.instance == instance) {
            Some(at) => {
                let seen = &mut offerings[at];
                if (&seen.gpu, seen.gpus_per_node, seen.scale_up_domain)
                    != (&row.gpu, row.gpus_per_node, row.scale_up_domain)
                    || seen.interconnect_gbps != row.interconnect_gbps
                {
                    return Err(format!(
                        "price list line {line}: {instance} differs in hardware from an earlier row"
                    ));
                }
                seen.effective_date =
                    older_date(&seen.effective_date, &row.effective_date).to_string();
                seen.source = merge_sources(&seen.source, &row.source);
                at
            }
            None => {
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
                let region = cell("region").to_string();
                offerings[at].prices.push(Price { region, option, usd_per_node_hour: usd });
            }
        }
    }
    if !billing.note.is_empty() {
        for offering in &mut offerings {
            offering.source = format!("{} | {}", offering.source, billing.note);
        }
    }
    Ok(offerings)
}

/// Check a price list for the mistakes public catalogs are known to make (see
/// shared/notes/pricing.md §2.3 and §8.5): missing or non-positive prices, spot or reserved
/// above on-demand, duplicate names or prices, zero GPUs.
///
/// # Errors
/// Every problem found, one per line.
pub fn validate_offerings(offerings: &[Offering]) -> Result<(), String> {
    let mut problems = Vec::new();
    if offerings.is_empty() {
        problems.push("no offerings".to_string());
    }
    for (i, o) in offerings.iter().enumerate() {
        let name = &o.instance;
        if name.is_empty() || o.gpu.is_empty() {
            problems.push(format!("offering {i}: empty instance or GPU name"));
        }
        if offerings[..i].iter().any(|p| &p.instance == name) {
            problems.push(format!("{name}: listed twice"));
        }
        if o.gpus_per_node == 0 || o.scale_up_domain < o.gpus_per_node {
            problems.push(format!(
                "{name}: {} GPUs per node in a scale-up domain of {}",
                o.gpus_per_node, o.scale_up_domain
            ));
        }
        if !(o.interconnect_gbps.is_finite() && o.interconnect_gbps >= 0.0) {
            problems.push(format!("{name}: interconnect {} Gbps", o.interconnect_gbps));
        }
        if o.billing_increment_s == 0 {
            problems.push(format!("{name}: billing increment of 0 s"));
        }
        if o.prices.is_empty() {
            problems.push(format!("{name}: no prices"));
        }
        for (j, p) in o.prices.iter().enumerate() {
            let what = format!("{name} {} {}", p.region, option_name(p.option));
            if !(p.usd_per_node_hour.is_finite() && p.usd_per_node_hour > 0.0) {
                problems.push(format!("{what}: price {}", p.usd_per_node_hour));
            }
            if p.region.is_empty() {
                problems.push(format!("{what}: empty region"));
            }
            if o.prices[..j].iter().any(|q| q.region == p.region && q.option == p.option) {
                problems.push(format!("{what}: priced twice"));
            }
            let discounted = matches!(
                p.option,
                PurchaseOption::Spot
                    | PurchaseOption::ReservedOneYear
                    | PurchaseOption::ReservedThreeYear
            );
            let on_demand = o.prices.iter().find(|q| {
                q.option == PurchaseOption::OnDemand
                    && (q.region == p.region || q.region == ANY_REGION)
            });
            if let (true, Some(od)) = (discounted, on_demand)
                && p.usd_per_node_hour > od.usd_per_node_hour
            {
                problems.push(format!(
                    "{what}: {} above on-demand {}",
                    p.usd_per_node_hour, od.usd_per_node_hour
                ));
            }
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(problems.join("\n")) }
}

/// The older of two ISO dates, where empty (undated) counts as oldest.
fn older_date<'a>(a: &'a str, b: &'a str) -> &'a str {
    if a.is_empty() || b.is_empty() { "" } else { a.min(b) }
}

/// The facts of `a` (separated by "; ") followed by those of `b` that `a` does not already
/// state, so rows that repeat a catalog path with or without an extra remark read once.
fn merge_sources(a: &str, b: &str) -> String {
    let mut facts: Vec<&str> = Vec::new();
    for fact in a.split("; ").chain(b.split("; ")).map(str::trim).filter(|f| !f.is_empty()) {
        if let Some(i) = facts.iter().position(|f| fact.contains(f)) {
            facts[i] = fact; // a longer statement of the same fact wins
        } else if !facts.iter().any(|f| f.contains(fact)) {
            facts.push(fact);
        }
    }
    facts.join("; ")
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
instance,gpu,gpus_per_node,region,on_demand,spot,effective_date,source
big,H100,8,east,10,4,2026-09-20,\"page, read by hand\"
big,H100,8,west,12,,,page
small,A100,4,*,3,,2026-01-01,catalog
";

    fn request(instance: &str, region: &str, hours: f64) -> QuoteRequest {
        QuoteRequest {
            instance: instance.into(),
            nodes: 2,
            hours,
            region: region.into(),
            option: PurchaseOption::OnDemand,
            storage_gb_months: 0.0,
            egress_gb: 0.0,
        }
    }

    #[test]
    fn csv_groups_rows_by_instance() {
        let offerings = offerings_from_csv(LIST, BILLING).unwrap();
        assert_eq!(offerings.len(), 2);
        let big = &offerings[0];
        assert_eq!(big.prices.len(), 3);
        assert_eq!(big.scale_up_domain, 8);
        assert_eq!(big.effective_date, "", "an undated row makes the offering undated");
        assert_eq!(big.source, "page, read by hand | billing: test");
        assert_eq!(offerings[1].effective_date, "2026-01-01");
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
    }

    #[test]
    fn quote_rounds_up_to_the_increment_and_the_minimum() {
        let offerings = offerings_from_csv(LIST, BILLING).unwrap();
        // 601 s bills eleven minutes; 1 s bills the 600 s minimum.
        let q = standard_quote(&offerings, &request("big", "east", 601.0 / 3600.0)).unwrap();
        assert!((q.total_usd - 2.0 * (660.0 / 3600.0) * 10.0).abs() < 1e-9);
        let q = standard_quote(&offerings, &request("big", "east", 1.0 / 3600.0)).unwrap();
        assert!((q.total_usd - 2.0 * (600.0 / 3600.0) * 10.0).abs() < 1e-9);
        // 1.1 h is 3960.0000000000005 s in binary; it must bill 66 minutes, not 67.
        let q = standard_quote(&offerings, &request("big", "east", 1.1)).unwrap();
        assert!((q.lines[0].quantity - 2.0 * 1.1).abs() < 1e-9, "{}", q.lines[0].quantity);
    }

    #[test]
    fn any_region_prices_match_every_region() {
        let offerings = offerings_from_csv(LIST, BILLING).unwrap();
        let q = standard_quote(&offerings, &request("small", "mars-1", 10.0)).unwrap();
        assert!((q.total_usd - 60.0).abs() < 1e-9);
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
        assert!((q.total_usd - 20.0).abs() < 1e-9);
        r.egress_gb = -1.0;
        assert!(standard_quote(&offerings, &r).unwrap_err().contains("egress"));
    }

    #[test]
    fn repeated_sources_read_once() {
        assert_eq!(merge_sources("catalog@1; EFA 3200", "catalog@1"), "catalog@1; EFA 3200");
        assert_eq!(
            merge_sources("catalog@1; east: 2 + 3", "catalog@1; west: 2 + 1 [SUSPECT]"),
            "catalog@1; east: 2 + 3; west: 2 + 1 [SUSPECT]"
        );
        assert_eq!(merge_sources("", "page"), "page");
    }

    #[test]
    fn validation_catches_spot_above_on_demand() {
        let list = "instance,gpu,gpus_per_node,region,on_demand,spot\nx,A100,8,central,10,11\n";
        let err = validate_offerings(&offerings_from_csv(list, BILLING).unwrap()).unwrap_err();
        assert!(err.contains("x central spot: 11 above on-demand 10"), "{err}");
    }
}
