//! Cost-model plugins: a cloud's offerings and itemised quotes.
//!
//! Most clouds bill node-hours rounded up to a billing increment, with a minimum charge;
//! [`standard_quote`] implements exactly that, plus storage and egress lines, so a price
//! list plugin only has to list its offerings. [`offerings_from_csv`] turns a price list
//! kept as CSV beside the plugin (one row per instance and region) into those offerings,
//! and [`validate_offerings`] / [`validate_quote`] are the host's own rules (one definition,
//! in `runner_contract`), so a plugin's tests catch what the host would refuse;
//! [`audit_price_list`] adds this project's provenance rules (every price sourced, undated
//! and caveated prices explained).

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
    PURCHASE_OPTIONS, check_request, find_price, has_upfront, list_price_floor, nodes_for, option_name,
    parse_option, term_hours, validate_offerings, validate_provider, validate_quote,
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

impl QuoteRequest {
    /// `nodes` nodes for `gpus` GPUs of `instance` for `hours` in `region` under `option`,
    /// with no start date, storage or egress: the request a plugin's tests ask; set what
    /// differs with struct-update syntax.
    pub fn new(instance: &str, region: &str, option: PurchaseOption, gpus: u32, nodes: u32, hours: f64) -> QuoteRequest {
        QuoteRequest {
            instance: instance.into(),
            gpus,
            nodes,
            hours,
            region: region.into(),
            option,
            start_date: String::new(),
            storage_gb_months: 0.0,
            egress_gb: 0.0,
        }
    }
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

/// One storage or egress rate and where it was read.
#[derive(Clone, Copy, Debug)]
pub struct ExtraRate {
    /// USD per GB-month (storage) or per GB (egress).
    pub usd_per_gb: f64,
    /// Whether this is the provider's own published price for what a training run uses.
    /// A secondary source, an example bill, or a first tier standing for a tiered price is
    /// not: the quote marks such a line as an estimate.
    pub list_price: bool,
    /// What the rate is and where it was read (page and date, or repository at a commit);
    /// the quote line shows it.
    pub source: &'static str,
}

impl ExtraRate {
    /// The provider's published list price.
    pub const fn list(usd_per_gb: f64, source: &'static str) -> ExtraRate {
        ExtraRate { usd_per_gb, list_price: true, source }
    }

    /// An estimate: a secondary source, an example, or one tier of a tiered price.
    pub const fn estimate(usd_per_gb: f64, source: &'static str) -> ExtraRate {
        ExtraRate { usd_per_gb, list_price: false, source }
    }
}

/// The storage (checkpoints and data) and egress rates a standard quote uses. `None` means
/// the plugin knows no price: the quote still shows the line, costs it at zero and says so,
/// rather than pass off "unknown" as "free".
#[derive(Clone, Copy, Debug)]
pub struct ExtraRates {
    pub storage: Option<ExtraRate>,
    pub egress: Option<ExtraRate>,
}

/// No storage or egress charges (for clouds whose node price includes them).
pub const NO_EXTRAS: ExtraRates = ExtraRates {
    storage: Some(ExtraRate::list(0.0, "included in the node price")),
    egress: Some(ExtraRate::list(0.0, "included in the node price")),
};

/// No known storage or egress prices (for clouds that publish none we could find).
pub const UNKNOWN_EXTRAS: ExtraRates = ExtraRates { storage: None, egress: None };

/// Billing for a cloud whose increment and minimum charge no source states: pro rata per
/// second, no minimum, and a note that keeps the gap visible in every report.
pub const UNKNOWN_BILLING: Billing = Billing {
    increment_s: 1,
    minimum_s: 0,
    note: "billing: increment and minimum unknown (not found); quoted pro rata per second, no minimum",
    per_option: &[],
};

/// Bytes per GiB over bytes per GB: divide a $/GiB list price by this for $/GB.
pub const GB_PER_GIB: f64 = 1.073_741_824;

/// How a cloud bills node time: one rule for every purchase option but those listed in
/// `per_option` (AWS Capacity Blocks are bought by the day). Whatever the rule, a committed
/// term bills whole terms ([`term_hours`], the contract's rule): a run of 13 months on
/// 1-year terms pays for two years.
#[derive(Clone, Copy, Debug)]
pub struct Billing {
    pub increment_s: u32,
    pub minimum_s: u32,
    /// Appended to every offering's `source`: where the billing rule comes from (or that
    /// it is unknown), and any caveat that holds for the whole price list.
    pub note: &'static str,
    /// Purchase options billed by a rule of their own.
    pub per_option: &'static [OptionBilling],
}

/// The billing rule of one purchase option where it differs from the cloud's.
#[derive(Clone, Copy, Debug)]
pub struct OptionBilling {
    pub option: PurchaseOption,
    pub increment_s: u32,
    pub minimum_s: u32,
    /// Appended to the source of this option's prices, after the cloud's note.
    pub note: &'static str,
}

impl Billing {
    /// Increment and minimum (seconds) of a price for `option`, and the note its source
    /// carries.
    fn rule(&self, option: PurchaseOption) -> (u32, u32, String) {
        let (increment, minimum, note) = match self.per_option.iter().find(|r| r.option == option) {
            Some(r) if self.note.is_empty() => (r.increment_s, r.minimum_s, r.note.to_string()),
            Some(r) => (r.increment_s, r.minimum_s, format!("{}; {}", self.note, r.note)),
            None => (self.increment_s, self.minimum_s, self.note.to_string()),
        };
        // A committed term is billed whole, used or not, and a run longer than one term
        // takes another (a term cannot be bought in part).
        match term_hours(option) {
            Some(h) => ((h * 3600.0) as u32, (h * 3600.0) as u32, note),
            None => (increment, minimum, note),
        }
    }
}

/// Quote `request` against `offerings` with no storage or egress charges.
pub fn standard_quote(offerings: &[Offering], request: &QuoteRequest) -> Result<Quote, String> {
    standard_quote_with(offerings, request, NO_EXTRAS)
}

/// Quote `request`: compute = nodes x billed hours x node price, where billed time is the
/// run's time rounded up to the price's billing increment and at least its minimum charge
/// (both per node; [`billed_seconds`]), plus the upfront part of a committed term, plus
/// storage and egress lines, each naming its rate's source. An empty request region takes
/// the first region priced for the option. The compute line names the price's date; lines
/// priced from a lower-bound or suspect price, or from an extra rate that is not a list
/// price, are estimates; the quote warns about caveats, an undated price, and a price that
/// took effect after the run's start date.
///
/// # Errors
/// The request's broken rule ([`check_request`], the contract's, which the host applies
/// before it asks): an unknown instance, or a region/option without a price (naming what
/// exists); too few nodes for the GPUs asked for, or nodes outside the offering's multiple;
/// negative or non-finite hours, storage and egress; a start date that is not ISO.
pub fn standard_quote_with(
    offerings: &[Offering],
    request: &QuoteRequest,
    extras: ExtraRates,
) -> Result<Quote, String> {
    let (offering, price) = check_request(request, offerings)?;
    let billed_h =
        billed_seconds(request.hours, price.billing_increment_s, price.minimum_charge_s) / 3600.0;
    let region = if price.region == ANY_REGION && !request.region.is_empty() {
        request.region.as_str()
    } else {
        price.region.as_str()
    };
    let dated = match price.effective_date.as_str() {
        "" => "undated price".to_string(),
        date => format!("price dated {date}"),
    };
    // A floor or a doubted number is not the price the cloud will bill.
    let guessed = price.caveats.iter().any(|c| matches!(c, PriceCaveat::LowerBound | PriceCaveat::Suspect));
    let nodes = f64::from(request.nodes);
    let mut lines = vec![QuoteLine {
        item: format!(
            "{} x {} ({}, {}, {}, {dated})",
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
        estimate: guessed,
        caveats: price.caveats.clone(),
    }];
    if price.upfront_usd_per_node > 0.0 {
        // Each term bought is paid up front: a run over two terms pays twice.
        let terms = term_hours(request.option).map_or(1.0, |t| (billed_h / t - 1e-9).ceil().max(1.0));
        lines.push(QuoteLine {
            item: format!("upfront payment for {} x {} ({})", request.nodes, offering.instance, option_name(request.option)),
            category: LineCategory::Upfront,
            quantity: nodes * terms,
            unit: "node-term".into(),
            amount: nodes * terms * price.upfront_usd_per_node,
            estimate: guessed,
            caveats: price.caveats.clone(),
        });
    }
    let extra_lines = [
        ("storage", LineCategory::Storage, request.storage_gb_months, "GB-month", extras.storage),
        ("egress", LineCategory::Egress, request.egress_gb, "GB", extras.egress),
    ];
    for (item, category, quantity, unit, rate) in extra_lines {
        if quantity > 0.0 {
            lines.push(QuoteLine {
                item: match rate {
                    Some(r) => format!("{item}: {}", r.source),
                    None => format!("{item} (no list price known; not costed)"),
                },
                category,
                quantity,
                unit: unit.into(),
                amount: quantity * rate.map_or(0.0, |r| r.usd_per_gb),
                estimate: rate.is_none_or(|r| !r.list_price),
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
    if price.effective_date.is_empty() {
        warnings.push("the node price is undated (a catalog snapshot); check it against the provider's current price list".to_string());
    } else if !request.start_date.is_empty() && request.start_date < price.effective_date {
        warnings.push(format!(
            "the node price took effect on {}, after the run starts ({}); this price list has no earlier price",
            price.effective_date, request.start_date
        ));
    }
    let total = lines.iter().map(|l| l.amount).sum();
    Ok(Quote { currency: "USD".into(), lines, total, warnings })
}

/// The price columns a price-list CSV may have, USD per node-hour; an empty cell means
/// "not sold that way there". Reserved columns are committed terms with no upfront payment,
/// billed (as such terms are) in whole terms.
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

/// A price list parsed once per plugin instance, for a `static`: `offerings` and every
/// `quote` read it from there. Parsing the CSV on each quote was nearly all of a quote's
/// time (about 125 us of AWS's, native), and a run asks for one quote per row, cloud and
/// purchase option.
///
/// ```ignore
/// static LIST: PriceList = PriceList::new(include_str!("prices.csv"), BILLING);
/// fn quote(request: QuoteRequest) -> Result<Quote, String> {
///     standard_quote_with(LIST.offerings()?, &request, EXTRAS)
/// }
/// ```
pub struct PriceList {
    csv: &'static str,
    billing: Billing,
    parsed: std::sync::OnceLock<Result<Vec<Offering>, String>>,
}

impl PriceList {
    /// The list in `csv` under `billing`, parsed on first use.
    pub const fn new(csv: &'static str, billing: Billing) -> PriceList {
        PriceList { csv, billing, parsed: std::sync::OnceLock::new() }
    }

    /// The offerings, as [`offerings_from_csv`] gives them.
    ///
    /// # Errors
    /// What [`offerings_from_csv`] says of the list (the same message on every call).
    pub fn offerings(&self) -> Result<&[Offering], String> {
        self.parsed.get_or_init(|| offerings_from_csv(self.csv, self.billing)).as_deref().map_err(Clone::clone)
    }
}

/// A cloud whose cost model is its price list and the standard quote ([`standard_quote_with`]
/// with its storage and egress rates): it says who it is, where its list is and what its
/// extras cost, and [`Guest`] follows, so the plugin is its data. A cloud that bills
/// otherwise implements [`Guest`] itself (`plugins/aws`).
///
/// ```ignore
/// static LIST: PriceList = PriceList::new(include_str!("prices.csv"), UNKNOWN_BILLING);
///
/// pub struct MyCloud;
///
/// impl PriceListCloud for MyCloud {
///     const EXTRAS: ExtraRates = UNKNOWN_EXTRAS;
///     fn cloud() -> Provider {
///         Provider { name: "mycloud".into(), display_name: "My Cloud".into() }
///     }
///     fn list() -> &'static PriceList {
///         &LIST
///     }
/// }
///
/// runner_plugin_sdk::export_cost!(MyCloud);
/// ```
pub trait PriceListCloud {
    /// Storage and egress rates ([`UNKNOWN_EXTRAS`] where none were found).
    const EXTRAS: ExtraRates;
    /// Who the cloud is: [`Guest::provider`]'s answer (named apart, so a plugin's tests
    /// can call `provider` with both traits in scope).
    fn cloud() -> Provider;
    /// The price list, kept in a `static` so it is parsed once.
    fn list() -> &'static PriceList;
}

impl<T: PriceListCloud> Guest for T {
    fn provider() -> Provider {
        T::cloud()
    }

    /// The list's offerings. `offerings` cannot return an error: a list that does not
    /// parse stops the plugin with the parser's message (the plugin's tests parse it first).
    fn offerings() -> Vec<Offering> {
        T::list().offerings().expect("prices.csv parses (checked by the tests)").to_vec()
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        standard_quote_with(T::list().offerings()?, &request, T::EXTRAS)
    }
}

/// Parse a price list: one row per instance and region (or per instance, region and set of
/// options, where options differ in date or source), grouped into one offering per instance
/// (in first-seen order). Each price carries its row's date, source and caveats, and the
/// billing rule of its option (whose note is appended to the source); committed terms bill
/// whole terms.
///
/// The first non-comment line names the columns, in any order: `instance`, `gpu`,
/// `gpus_per_node`, `region` and `source` are required; `scale_up_domain` (default: the
/// node's GPU count), `node_multiple` (default 1), `interconnect_gbps` (default 0, unknown),
/// `effective_date` (ISO; empty when undated), `caveats` (any of `lower-bound`, `resale`,
/// `suspect`, separated by `;`), and the price columns `on_demand`, `spot`, `reserved_1y`,
/// `reserved_3y`, `capacity_block` are optional. Lines starting with `#` are comments;
/// cells may be double-quoted to hold commas (no line breaks inside cells). A region of
/// [`ANY_REGION`] means the price holds everywhere.
///
/// # Errors
/// Names the line and column of an unknown column, a malformed number or date, a price
/// that is not finite and positive, an empty source, or rows of one instance that disagree
/// on its hardware.
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
    for required in ["instance", "gpu", "gpus_per_node", "region", "source"] {
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
        if cell("source").is_empty() {
            return Err(format!(
                "price list line {line}: the source is empty; name where the price was read \
                 (a page and the date, or a catalog at a commit)"
            ));
        }
        runner_contract::text::date("effective_date", cell("effective_date"))
            .map_err(|e| format!("price list line {line}: {e}"))?;
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
                let (billing_increment_s, minimum_charge_s, note) = billing.rule(option);
                offerings[at].prices.push(Price {
                    region: cell("region").to_string(),
                    option,
                    usd_per_node_hour: usd,
                    upfront_usd_per_node: 0.0,
                    billing_increment_s,
                    minimum_charge_s,
                    effective_date: cell("effective_date").to_string(),
                    source: if note.is_empty() {
                        cell("source").to_string()
                    } else {
                        format!("{} | {note}", cell("source"))
                    },
                    caveats: caveats.clone(),
                });
            }
        }
    }
    Ok(offerings)
}

/// The words a caveated price's source must carry to say why (`[SUSPECT: ...]`).
const CAVEAT_TAGS: [(PriceCaveat, &str); 3] = [
    (PriceCaveat::LowerBound, "LOWER BOUND"),
    (PriceCaveat::Resale, "RESALE"),
    (PriceCaveat::Suspect, "SUSPECT"),
];

/// This project's rules for a price list, on top of the host's ([`validate_offerings`]):
/// every price names its source, and an undated one says "undated" there (a catalog
/// snapshot at a commit); a caveated price says why in its source (`[SUSPECT: ...]`,
/// `[LOWER BOUND: ...]`, `[RESALE: ...]`); GB200 and GB300 are sold as 4-GPU trays in a
/// 72-GPU NVLink domain. A plugin's tests run it, so a price added without its provenance
/// fails them.
///
/// # Errors
/// The first broken rule, naming the instance, region and option.
pub fn audit_price_list(offerings: &[Offering]) -> Result<(), String> {
    validate_offerings(offerings)?;
    for o in offerings {
        if (o.gpu.starts_with("GB200") || o.gpu.starts_with("GB300"))
            && (o.gpus_per_node, o.scale_up_domain) != (4, 72)
        {
            return Err(format!(
                "{}: a {} node is a 4-GPU tray in a 72-GPU NVL72 domain, not {} GPUs in {}",
                o.instance, o.gpu, o.gpus_per_node, o.scale_up_domain
            ));
        }
        for p in &o.prices {
            let what = format!("{} in {} ({})", o.instance, p.region, option_name(p.option));
            if p.source.trim().is_empty() {
                return Err(format!("{what}: no source"));
            }
            if p.effective_date.is_empty() && !p.source.contains("undated") {
                return Err(format!("{what}: undated, and the source does not say so ('undated ...')"));
            }
            for (caveat, tag) in CAVEAT_TAGS {
                if p.caveats.contains(&caveat) && !p.source.contains(tag) {
                    return Err(format!("{what}: caveated {tag}, but the source does not say why ([{tag}: ...])"));
                }
            }
        }
    }
    Ok(())
}

/// One CSV record's cells, as written (untrimmed), and whether a quote is left open at its
/// end: double quotes protect commas (and line breaks), `""` inside them is a quote
/// (RFC 4180). The one splitter of the SDK's price lists and the price-file plugin's
/// SkyPilot catalogs; each decides what an open quote means.
pub fn csv_record_cells(record: &str) -> (Vec<String>, bool) {
    let mut cells = vec![String::new()];
    let mut quoted = false;
    let mut chars = record.chars().peekable();
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
    (cells, quoted)
}

/// Split one CSV line into trimmed cells; double quotes protect commas, `""` is a quote.
fn split_csv_line(line: &str) -> Result<Vec<String>, String> {
    let (cells, open) = csv_record_cells(line);
    if open {
        return Err("unterminated quote".into());
    }
    Ok(cells.into_iter().map(|c| c.trim().to_string()).collect())
}


#[cfg(test)]
mod tests {
    use super::*;

    const BY_THE_DAY: [OptionBilling; 1] = [OptionBilling {
        option: PurchaseOption::CapacityBlock,
        increment_s: 86_400,
        minimum_s: 86_400,
        note: "capacity blocks: whole days",
    }];
    const BILLING: Billing =
        Billing { increment_s: 60, minimum_s: 600, note: "billing: test", per_option: &BY_THE_DAY };

    const LIST: &str = "\
# a comment line, then the header
instance,gpu,gpus_per_node,scale_up_domain,node_multiple,region,on_demand,spot,reserved_1y,capacity_block,effective_date,source,caveats
big,H100,8,,,east,10,4,,,2026-09-20,\"page, read by hand\",
big,H100,8,,,west,12,,9,,,undated page [LOWER BOUND: a from price],lower-bound
big,H100,8,,,east,,,,7,,undated capacity-block page,
small,A100,4,,,*,3,,,,2026-01-01,catalog,
rack,GB200,4,72,18,*,40,,,,2026-01-01,rack seller (racks only),
";

    /// 2 nodes, 8 GPUs (whole nodes of 8 or of 4 GPUs), on demand.
    fn request(instance: &str, region: &str, hours: f64) -> QuoteRequest {
        QuoteRequest::new(instance, region, PurchaseOption::OnDemand, 8, 2, hours)
    }

    fn offerings() -> Vec<Offering> {
        offerings_from_csv(LIST, BILLING).unwrap()
    }

    /// A `PriceList` gives what parsing its CSV under its billing gives, on every call,
    /// and a list that does not parse gives the parser's error each time.
    #[test]
    fn a_price_list_is_its_csv_parsed_once() {
        static PARSED: PriceList = PriceList::new(LIST, BILLING);
        for _ in 0..2 {
            assert_eq!(format!("{:?}", PARSED.offerings().unwrap()), format!("{:?}", offerings()));
        }
        static BAD: PriceList = PriceList::new("instance,gpu,colour\nx,H100,red\n", BILLING);
        let want = offerings_from_csv("instance,gpu,colour\nx,H100,red\n", BILLING).unwrap_err();
        assert!(want.contains("unknown column 'colour'"), "{want}");
        for _ in 0..2 {
            assert_eq!(BAD.offerings().unwrap_err(), want);
        }
    }

    #[test]
    fn csv_groups_rows_by_instance_and_dates_each_price() {
        let offerings = offerings();
        assert_eq!(offerings.len(), 3);
        let big = &offerings[0];
        assert_eq!(big.prices.len(), 5);
        assert_eq!((big.scale_up_domain, big.node_multiple), (8, 1));
        assert_eq!((offerings[2].scale_up_domain, offerings[2].node_multiple), (72, 18));
        assert_eq!(big.prices[0].effective_date, "2026-09-20");
        assert_eq!(big.prices[2].effective_date, "", "an undated row stays undated");
        assert_eq!(big.prices[0].source, "page, read by hand | billing: test");
        assert_eq!(big.prices[2].caveats, vec![PriceCaveat::LowerBound]);
        let reserved = &big.prices[3];
        assert_eq!(reserved.option, PurchaseOption::OneYearNoUpfront);
        assert_eq!((reserved.billing_increment_s, reserved.minimum_charge_s), (8760 * 3600, 8760 * 3600), "a 1-year term bills whole years");
        let block = &big.prices[4];
        assert_eq!(block.option, PurchaseOption::CapacityBlock);
        assert_eq!((block.billing_increment_s, block.minimum_charge_s), (86_400, 86_400));
        assert!(block.source.ends_with("billing: test; capacity blocks: whole days"), "{}", block.source);
        assert_eq!((big.prices[0].billing_increment_s, big.prices[0].minimum_charge_s), (60, 600));
        audit_price_list(&offerings).unwrap();
    }

    #[test]
    fn csv_errors_name_the_line_and_column() {
        let bad = "instance,gpu,gpus_per_node,region,on_demand,source\nx,H100,8,east,ten,page\n";
        let err = offerings_from_csv(bad, BILLING).unwrap_err();
        assert!(
            err.contains("line 2") && err.contains("on_demand") && err.contains("'ten'"),
            "{err}"
        );
        let err = offerings_from_csv("instance,gpu,gpus_per_node,region,source,ondemand\n", BILLING)
            .unwrap_err();
        assert!(err.contains("unknown column 'ondemand'"), "{err}");
        let bad = "instance,gpu,gpus_per_node,region,on_demand,source\nx,H100,8,east,-1,page\n";
        assert!(offerings_from_csv(bad, BILLING).unwrap_err().contains("must be positive"));
        let free = "instance,gpu,gpus_per_node,region,on_demand,source\nx,H100,8,east,0,page\n";
        let err = offerings_from_csv(free, BILLING).unwrap_err();
        assert!(err.contains("line 2, column on_demand: price 0 must be positive"), "{err}");
        let bad = "instance,gpu,gpus_per_node,region,on_demand,source,caveats\nx,H100,8,east,1,page,cheap\n";
        assert!(offerings_from_csv(bad, BILLING).unwrap_err().contains("'cheap'"));
    }

    #[test]
    fn every_row_names_its_source_and_a_real_date() {
        let err = offerings_from_csv("instance,gpu,gpus_per_node,region,on_demand\n", BILLING)
            .unwrap_err();
        assert!(err.contains("missing column 'source'"), "{err}");
        let bad = "instance,gpu,gpus_per_node,region,on_demand,source\nx,H100,8,east,1,\n";
        let err = offerings_from_csv(bad, BILLING).unwrap_err();
        assert!(err.contains("line 2") && err.contains("source is empty"), "{err}");
        let bad = "instance,gpu,gpus_per_node,region,on_demand,source,effective_date\nx,H100,8,east,1,page,2026-02-30\n";
        let err = offerings_from_csv(bad, BILLING).unwrap_err();
        assert!(err.contains("line 2") && err.contains("2026-02-30"), "{err}");
    }

    #[test]
    fn quote_rounds_up_to_the_increment_and_the_minimum() {
        let offerings = offerings();
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
    fn capacity_blocks_bill_whole_days_and_terms_the_whole_term() {
        let offerings = offerings();
        let mut r = request("big", "east", 25.0);
        r.option = PurchaseOption::CapacityBlock;
        let q = standard_quote(&offerings, &r).unwrap();
        assert!((q.lines[0].quantity - 2.0 * 48.0).abs() < 1e-9, "25 h buys two days");
        assert!((q.total - 2.0 * 48.0 * 7.0).abs() < 1e-9, "{}", q.total);
        validate_quote(&r, &q, &offerings).unwrap();
        let mut r = request("big", "west", 1.0);
        r.option = PurchaseOption::OneYearNoUpfront;
        let q = standard_quote(&offerings, &r).unwrap();
        assert!((q.total - 2.0 * 8760.0 * 9.0).abs() < 1e-6, "{}", q.total);
        // 13 months on 1-year terms buys two years (a term cannot be bought in part).
        r.hours = 8760.0 * 13.0 / 12.0;
        let q = standard_quote(&offerings, &r).unwrap();
        assert!((q.total - 2.0 * 2.0 * 8760.0 * 9.0).abs() < 1e-6, "{}", q.total);
        validate_quote(&r, &q, &offerings).unwrap();
        // Each of those terms is paid up front where the option has an upfront part.
        let term = |option, usd, upfront| Price { upfront_usd_per_node: upfront, ..Price::hourly("r", option, usd) };
        let partial = vec![Offering::nodes(
            "u",
            "H100",
            8,
            vec![term(PurchaseOption::OnDemand, 10.0, 0.0), term(PurchaseOption::OneYearPartialUpfront, 4.0, 1000.0)],
        )];
        let mut r = request("u", "r", 8760.0 * 13.0 / 12.0);
        r.option = PurchaseOption::OneYearPartialUpfront;
        let q = standard_quote(&partial, &r).unwrap();
        assert_eq!((q.lines[1].quantity, q.lines[1].amount), (4.0, 4000.0), "2 nodes x 2 terms");
    }

    #[test]
    fn nodes_cover_the_gpus_in_the_offerings_multiple() {
        let offerings = offerings();
        let (small, rack) = (&offerings[1], &offerings[2]);
        assert_eq!(nodes_for(small, 5), Some(2), "5 GPUs on 4-GPU nodes take 2 nodes");
        assert_eq!(nodes_for(rack, 5), Some(18), "trays sold by the rack: a whole rack");
        assert_eq!(nodes_for(rack, 73), Some(36));
        let mut r = request("rack", "", 1.0);
        r.gpus = 5;
        let err = standard_quote(&offerings, &r).unwrap_err();
        assert!(err.contains("multiples of 18") && err.contains("ask for 18 nodes"), "{err}");
        r.nodes = 18;
        let q = standard_quote(&offerings, &r).unwrap();
        assert!((q.total - 18.0 * 40.0).abs() < 1e-9, "{}", q.total);
        let mut r = request("small", "", 1.0);
        r.gpus = 9;
        assert!(standard_quote(&offerings, &r).unwrap_err().contains("ask for 3 nodes"));
        r.gpus = 0;
        r.nodes = 0;
        assert!(standard_quote(&offerings, &r).is_err(), "a quote for no node is refused");
    }

    #[test]
    fn quotes_say_when_their_price_dates_from_and_warn_about_caveats() {
        let offerings = offerings();
        let q = standard_quote(&offerings, &request("big", "east", 1.0)).unwrap();
        assert!(q.lines[0].item.contains("price dated 2026-09-20"), "{}", q.lines[0].item);
        assert!(q.warnings.is_empty() && !q.lines[0].estimate, "{:?}", q.warnings);
        let q = standard_quote(&offerings, &request("big", "west", 1.0)).unwrap();
        assert!(q.lines[0].item.contains("undated price"), "{}", q.lines[0].item);
        assert!(q.warnings[0].contains("lower bound"), "{:?}", q.warnings);
        assert!(q.warnings[1].contains("undated"), "{:?}", q.warnings);
        assert_eq!(q.lines[0].caveats, vec![PriceCaveat::LowerBound]);
        assert!(q.lines[0].estimate, "a lower bound is not the price billed");
        let mut r = request("big", "east", 1.0);
        r.start_date = "2026-09-01".into();
        let q = standard_quote(&offerings, &r).unwrap();
        assert!(q.warnings[0].contains("took effect on 2026-09-20"), "{:?}", q.warnings);
        r.start_date = "next week".into();
        assert!(standard_quote(&offerings, &r).unwrap_err().contains("start-date"));
    }

    #[test]
    fn any_region_prices_match_every_region() {
        let offerings = offerings();
        let q = standard_quote(&offerings, &request("small", "mars-1", 10.0)).unwrap();
        assert!((q.total - 60.0).abs() < 1e-9);
        assert!(q.lines[0].item.contains("mars-1"), "{}", q.lines[0].item);
    }

    #[test]
    fn extra_lines_cite_their_rate_and_mark_estimates() {
        let offerings = offerings();
        let mut r = request("big", "east", 1.0);
        r.storage_gb_months = 1000.0;
        r.egress_gb = 100.0;
        let extras = ExtraRates {
            storage: Some(ExtraRate::list(0.07, "file storage 0.07 USD/GB-month (page, 2026-09-20)")),
            egress: Some(ExtraRate::estimate(0.09, "first internet tier (blog)")),
        };
        let q = standard_quote_with(&offerings, &r, extras).unwrap();
        assert_eq!((q.lines[1].category, q.lines[2].category), (LineCategory::Storage, LineCategory::Egress));
        assert!(q.lines[1].item.contains("(page, 2026-09-20)") && !q.lines[1].estimate);
        assert!(q.lines[2].item.contains("blog") && q.lines[2].estimate);
        assert!((q.total - (20.0 + 70.0 + 9.0)).abs() < 1e-9, "{}", q.total);
        let q = standard_quote_with(&offerings, &r, UNKNOWN_EXTRAS).unwrap();
        assert!(q.lines[2].item.contains("no list price") && q.lines[2].estimate);
        assert!((q.total - 20.0).abs() < 1e-9);
        r.egress_gb = -1.0;
        assert!(standard_quote(&offerings, &r).unwrap_err().contains("egress"));
    }

    #[test]
    fn the_audit_wants_provenance_and_whole_nvl72_trays() {
        let list = |rows: &str| {
            offerings_from_csv(
                &format!("instance,gpu,gpus_per_node,scale_up_domain,region,on_demand,effective_date,source,caveats\n{rows}"),
                BILLING,
            )
            .unwrap()
        };
        audit_price_list(&list("x,H100,8,8,east,1,,undated catalog at abc,\n")).unwrap();
        let err = audit_price_list(&list("x,H100,8,8,east,1,,catalog at abc,\n")).unwrap_err();
        assert!(err.contains("x in east (on-demand)") && err.contains("undated"), "{err}");
        let err = audit_price_list(&list("x,H100,8,8,east,1,2026-01-01,page,suspect\n")).unwrap_err();
        assert!(err.contains("SUSPECT"), "{err}");
        let err = audit_price_list(&list("x,GB200,4,4,east,1,2026-01-01,page,\n")).unwrap_err();
        assert!(err.contains("4-GPU tray in a 72-GPU"), "{err}");
    }

    #[test]
    fn validation_catches_spot_above_on_demand() {
        let list = "instance,gpu,gpus_per_node,region,on_demand,spot,source\nx,A100,8,central,10,11,page\n";
        let err = validate_offerings(&offerings_from_csv(list, BILLING).unwrap()).unwrap_err();
        assert!(err.contains("spot costs 11") && err.contains("more than on-demand (10)"), "{err}");
    }

    #[test]
    fn a_suspect_price_is_an_estimate_like_a_lower_bound_but_a_resale_one_is_not() {
        let priced = |caveat| {
            let p = Price { caveats: vec![caveat], ..Price::hourly("r", PurchaseOption::OnDemand, 10.0) };
            let q = standard_quote(&[Offering::nodes("x", "H100", 8, vec![p])], &request("x", "r", 1.0)).unwrap();
            q.lines[0].estimate
        };
        assert!(priced(PriceCaveat::Suspect), "a doubted number is not the price billed");
        assert!(priced(PriceCaveat::LowerBound));
        assert!(!priced(PriceCaveat::Resale), "a resale listing is billed as listed");
    }

    /// The host refuses a quote below the list price of what was asked for, the upfront
    /// part of a term included: 2 nodes on a 1-year partial-upfront term at 4 USD/node-hour
    /// and 1000 USD up front cost at least 2 x (8760 x 4 + 1000) = 72,080 USD.
    #[test]
    fn a_quote_that_leaves_out_the_upfront_payment_is_below_the_list_price() {
        // Billed in whole years, as offerings_from_csv and the price-file plugin bill terms.
        let year = 8760 * 3600;
        let term = |option, usd, upfront| Price {
            upfront_usd_per_node: upfront,
            billing_increment_s: year,
            minimum_charge_s: year,
            ..Price::hourly("r", option, usd)
        };
        let offerings = vec![Offering::nodes(
            "u",
            "H100",
            8,
            vec![term(PurchaseOption::OnDemand, 10.0, 0.0), term(PurchaseOption::OneYearPartialUpfront, 4.0, 1000.0)],
        )];
        let mut r = request("u", "r", 100.0);
        r.option = PurchaseOption::OneYearPartialUpfront;
        let mut q = standard_quote(&offerings, &r).unwrap();
        assert_eq!(q.total, 72_080.0);
        validate_quote(&r, &q, &offerings).unwrap();
        q.lines.truncate(1);
        q.total = q.lines[0].amount;
        assert_eq!(q.total, 70_080.0);
        let err = validate_quote(&r, &q, &offerings).unwrap_err();
        assert!(err.contains("below the list price") && err.contains("72080.00 USD"), "{err}");
    }

    #[test]
    fn a_quote_line_of_infinite_quantity_is_refused() {
        let offerings = offerings();
        let r = request("big", "east", 1.0);
        let mut q = standard_quote(&offerings, &r).unwrap();
        q.lines[0].quantity = f64::INFINITY;
        let err = validate_quote(&r, &q, &offerings).unwrap_err();
        assert!(err.contains("non-finite or negative quantity"), "{err}");
    }

    /// The CSV reader's cell rules: `""` inside quotes is a quote, an unterminated quote
    /// and a row short of the header's columns are errors at their line, cells are
    /// trimmed, every `;`-separated caveat counts, an empty region is refused, and rows of
    /// one instance that disagree on the interconnect are refused like other hardware.
    #[test]
    fn csv_cells_quotes_caveats_and_rows() {
        let head = "instance,gpu,gpus_per_node,region,on_demand,source,caveats,interconnect_gbps\n";
        let one = |row: &str| offerings_from_csv(&format!("{head}{row}\n"), BILLING);
        let o = one(" x , H100 ,8,east,1,\"page \"\"A\"\", [SUSPECT: odd] [LOWER BOUND: from]\",lower-bound; suspect,400").unwrap();
        assert_eq!((o[0].instance.as_str(), o[0].gpu.as_str()), ("x", "H100"));
        assert_eq!(o[0].prices[0].source, "page \"A\", [SUSPECT: odd] [LOWER BOUND: from] | billing: test");
        assert_eq!(o[0].prices[0].caveats, [PriceCaveat::LowerBound, PriceCaveat::Suspect]);
        assert_eq!(o[0].interconnect_gbps, 400.0);
        assert_eq!(one("x,H100,8,east,1,\"page,").unwrap_err(), "price list line 2: unterminated quote");
        assert_eq!(one("x,H100,8,east,1,page").unwrap_err(), "price list line 2: 6 cells, but the header names 8 columns");
        assert!(one("x,H100,8,,1,page,,").unwrap_err().contains("line 2: instance and region must not be empty"));
        let two = format!("{head}x,H100,8,east,1,page,,400\nx,H100,8,west,1,page,,200\n");
        assert!(offerings_from_csv(&two, BILLING).unwrap_err().contains("line 3: x differs in hardware"));
    }

    /// The shorthands' defaults (a node is its own NVLink domain, sold one at a time; a
    /// price billed per second without minimum), an option's own minimum under a cloud
    /// without a note, and the audit: it runs the host's rules first, wants a source on
    /// every price and a reason for a resale one, and sizes GB300 trays like GB200's.
    #[test]
    fn shorthand_defaults_option_rules_and_the_audit() {
        let p = Price::hourly("r", PurchaseOption::OnDemand, 10.0);
        assert_eq!((p.billing_increment_s, p.minimum_charge_s, p.upfront_usd_per_node), (1, 0, 0.0));
        let o = Offering::nodes("x", "H100", 8, vec![p.clone()]);
        assert_eq!((o.scale_up_domain, o.node_multiple), (8, 1));
        let quiet = Billing { note: "", ..BILLING };
        let csv = "instance,gpu,gpus_per_node,region,capacity_block,source\nx,H100,8,east,7,page\n";
        let block = &offerings_from_csv(csv, quiet).unwrap()[0].prices[0];
        assert_eq!((block.billing_increment_s, block.minimum_charge_s, block.source.as_str()), (86_400, 86_400, "page | capacity blocks: whole days"));
        let dated = |source: &str, caveats: Vec<PriceCaveat>| Price { effective_date: "2026-01-01".into(), source: source.into(), caveats, ..p.clone() };
        let audit = |gpu: &str, per_node: u32, domain: u32, price: Price| {
            audit_price_list(&[Offering { scale_up_domain: domain, ..Offering::nodes("x", gpu, per_node, vec![price]) }])
        };
        assert!(audit("H100", 8, 8, dated(" ", vec![])).unwrap_err().contains("x in r (on-demand): no source"));
        assert!(audit("H100", 8, 8, dated("page", vec![PriceCaveat::Resale])).unwrap_err().contains("caveated RESALE"));
        audit("H100", 8, 8, dated("page [RESALE: a marketplace]", vec![PriceCaveat::Resale])).unwrap();
        assert!(audit("GB300", 8, 8, dated("page", vec![])).unwrap_err().contains("4-GPU tray in a 72-GPU"));
        audit("GB300", 4, 72, dated("page", vec![])).unwrap();
        let free = Price { usd_per_node_hour: 0.0, ..dated("page", vec![]) };
        assert!(audit("H100", 8, 8, free).unwrap_err().contains("the price is zero"));
    }

    /// A quote's edges: infinite hours are refused, the upfront line of a caveated price
    /// is an estimate carrying the caveats, a run starting on the price's own date gets no
    /// "took effect after" warning, and storage or egress not asked for get no line.
    #[test]
    fn quote_edges_hours_upfront_caveats_and_start_date() {
        let offerings = offerings();
        assert!(standard_quote(&offerings, &request("big", "east", f64::INFINITY)).unwrap_err().contains("hours must be a finite"));
        let mut r = request("big", "east", 1.0);
        r.start_date = "2026-09-20".into();
        let q = standard_quote(&offerings, &r).unwrap();
        assert!(q.warnings.is_empty());
        assert_eq!(q.lines.len(), 1, "no storage or egress asked: no line for them");
        let term = |option, usd, upfront| Price { upfront_usd_per_node: upfront, caveats: vec![PriceCaveat::LowerBound], ..Price::hourly("r", option, usd) };
        let partial = vec![Offering::nodes(
            "u",
            "H100",
            8,
            vec![term(PurchaseOption::OnDemand, 10.0, 0.0), term(PurchaseOption::OneYearPartialUpfront, 4.0, 1000.0)],
        )];
        let mut r = request("u", "r", 10.0);
        r.option = PurchaseOption::OneYearPartialUpfront;
        let q = standard_quote(&partial, &r).unwrap();
        assert_eq!(q.lines[1].category, LineCategory::Upfront);
        assert!(q.lines[1].estimate);
        assert_eq!(q.lines[1].caveats, [PriceCaveat::LowerBound]);
    }
}
