//! The generic pricing plugin: a team's own prices (a negotiated contract, an on-premises
//! chargeback rate) as a CSV in SkyPilot's catalog shape, which the host hands it on
//! standard input (`runner explore --price-file FILE`). The plugin, like every plugin,
//! sees no file: the bytes arrive on stdin and the plugin is a pure function of them.
//!
//! Columns are found by name in the header, in any order (SkyPilot's clouds order them
//! differently; a name given twice is refused): `InstanceType`, `AcceleratorName` (the GPU: H100, A100-80GB, GB200...),
//! `AcceleratorCount` (GPUs per node) and `Region` are required; `Price` (on-demand USD
//! per node-hour) and `SpotPrice` are SkyPilot's; `AvailabilityZone`, `vCPUs`,
//! `MemoryGiB`, `GpuInfo`, `Arch`, `Generation` are read and ignored. Extensions a
//! contract needs: `Reserved1yPrice`, `Reserved3yPrice` (no-upfront committed terms),
//! `ScaleUpDomain` (GPUs per NVLink domain; default the node), `NodeMultiple`,
//! `EffectiveDate` (YYYY-MM-DD), `Source`, `BillingIncrementS`, `MinimumChargeS`
//! (defaults: per second, 60 s minimum), `Caveats` (`lower-bound`, `resale`, `suspect`,
//! separated by `;`: the host then prefers other prices and marks these). Rows of one instance and region in several
//! zones (`AvailabilityZone`) keep the lowest spot price; two rows of one instance, region
//! and zone are refused. A row with an empty `InstanceType` (SkyPilot's GCP
//! GPU-only rows, to be added to a host row) is refused: give the all-in node price. So is
//! `A100` (SkyPilot's name for the 40 GB part): write `A100-40GB` or `A100-80GB`. SkyPilot's
//! `H100-MEGA` (GCP's a3-megagpu-8g) is priced as H100 and `A100-80GB-SXM` as A100-80GB.
//!
//! Every bad row is named by its line, with how to write it; the plugin then stops (a trap
//! whose message the host shows), so a price file never prices with rows silently dropped.
//! Reading stops early at the first row past the contract's limits (4096 instances, 1024
//! prices an instance) or after 1000 problems; the parse is linear in the file's size.

use std::collections::HashMap;
use std::sync::OnceLock;

use runner_plugin_sdk::cost::*;

/// The parsed price list, or every problem with it (one line each).
fn parsed() -> &'static Result<Vec<Offering>, String> {
    static LIST: OnceLock<Result<Vec<Offering>, String>> = OnceLock::new();
    LIST.get_or_init(|| {
        let mut text = String::new();
        use std::io::Read as _;
        match std::io::stdin().read_to_string(&mut text) {
            Ok(_) => parse(&text),
            Err(e) => Err(format!("price file: not UTF-8 text ({e}): save it as UTF-8 (Excel: CSV UTF-8)")),
        }
    })
}

fn offerings_or_stop() -> &'static [Offering] {
    match parsed() {
        Ok(o) => o,
        // The contract's `offerings` cannot return an error: stop with the message, which
        // the host reports naming this plugin and the call.
        Err(e) => panic!("{e}"),
    }
}

/// The file's records with the line each starts on: physical lines, but a quoted cell
/// may hold line breaks (RFC 4180), which join its lines into one record. Blank lines
/// and `#` comment lines between records are skipped.
fn records(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        // An odd count of quotes leaves a quoted cell open ("" inside one counts two), and
        // a line with an odd count closes it. Counted per line, not over the record so far:
        // a quote never closed would rescan the rest of the file at each line.
        let odd = line.matches('"').count() % 2 == 1;
        match open.take() {
            Some((start, mut r)) => {
                r.push('\n');
                r.push_str(line);
                if odd {
                    out.push((start, r));
                } else {
                    open = Some((start, r));
                }
            }
            None if line.trim().is_empty() || line.trim_start().starts_with('#') => {}
            None if odd => open = Some((i + 1, line.to_string())),
            None => out.push((i + 1, line.to_string())),
        }
    }
    out.extend(open);
    out
}

/// Split one CSV record (double quotes may hold commas and line breaks; a line break in
/// a cell reads as a space). A quote left open runs to the record's end: [`records`]
/// closes a record only where its quotes balance, so only the file's last one can be open.
fn cells(line: &str) -> Vec<String> {
    let (cells, _open) = csv_record_cells(line);
    cells.into_iter().map(|c| c.replace(['\r', '\n'], " ").trim().to_string()).collect()
}

const KNOWN: [&str; 21] = [
    "InstanceType",
    "AcceleratorName",
    "AcceleratorCount",
    "vCPUs",
    "MemoryGiB",
    "GpuInfo",
    "Price",
    "SpotPrice",
    "Region",
    "AvailabilityZone",
    "Arch",
    "Generation",
    "Reserved1yPrice",
    "Reserved3yPrice",
    "ScaleUpDomain",
    "NodeMultiple",
    "EffectiveDate",
    "Source",
    "BillingIncrementS",
    "MinimumChargeS",
    "Caveats",
];

/// Parse a SkyPilot-shaped catalog. Every problem is collected, each naming its line.
pub fn parse(text: &str) -> Result<Vec<Offering>, String> {
    // Excel's "CSV UTF-8" starts with a byte-order mark, which would read as part of the
    // first column's name.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = records(text).into_iter();
    let Some((hl, header)) = lines.next() else {
        return Err("price file is empty: it needs a header row (InstanceType,AcceleratorName,AcceleratorCount,Price,SpotPrice,Region,...)".into());
    };
    let cols = cells(&header);
    let mut problems = Vec::new();
    if cols.len() == 1 && (header.contains(';') || header.contains('\t')) {
        return Err(format!(
            "line {hl}: the header is one column, as if separated by {}: save it with commas (Excel: CSV UTF-8)",
            if header.contains(';') { "semicolons" } else { "tabs" }
        ));
    }
    let mut unknown = false;
    for c in &cols {
        if KNOWN.contains(&c.as_str()) {
            continue;
        }
        unknown = true;
        match KNOWN.iter().find(|k| k.eq_ignore_ascii_case(c)) {
            Some(k) => problems.push(format!("line {hl}: unknown column '{c}': write '{k}' (column names are case-sensitive)")),
            None => problems.push(format!("line {hl}: unknown column '{c}'")),
        }
    }
    if unknown {
        problems.push(format!("the known columns are {}", KNOWN.join(", ")));
    }
    // Cells are found by the column's name: a repeated name would read the first column
    // and drop the other's values without a word.
    // One pass (a header may be long): each name's first column and how often it came.
    let mut seen: HashMap<&str, (usize, usize)> = HashMap::new();
    for (i, c) in cols.iter().enumerate().filter(|(_, c)| !c.is_empty()) {
        let (first, times) = seen.entry(c.as_str()).or_insert((i, 0));
        *times += 1;
        // Named at its second appearance only, however many there are.
        if *times == 2 {
            problems.push(format!("line {hl}: column '{c}' appears twice (columns {} and {}): keep one", *first + 1, i + 1));
        }
    }
    for required in ["InstanceType", "AcceleratorName", "AcceleratorCount", "Region"] {
        if !cols.iter().any(|c| c == required) {
            problems.push(format!("line {hl}: the header has no '{required}' column"));
        }
    }
    if !cols.iter().any(|c| c == "Price" || c == "SpotPrice" || c == "Reserved1yPrice" || c == "Reserved3yPrice") {
        problems.push(format!("line {hl}: the header has no price column (Price, SpotPrice, Reserved1yPrice, Reserved3yPrice)"));
    }
    if !problems.is_empty() {
        return Err(format!("price file: {}", problems.join("; ")));
    }
    let at = |name: &str| cols.iter().position(|c| c == name);
    let mut offerings: Vec<Offering> = Vec::new();
    // The line each (instance, region, zone) was priced on: a second row for one of them
    // is a mistake to name, not a price to drop in silence.
    let mut seen: HashMap<(String, String, String), usize> = HashMap::new();
    // Where each instance's offering sits, and each (offering, region, option)'s price
    // with the line it was first priced on: found by a scan, a file of many instances or
    // regions took quadratic time (40,000 rows: 15 s natively, past the plugin's call
    // deadline in the sandbox).
    let mut offering_at: HashMap<String, usize> = HashMap::new();
    let mut price_at: HashMap<(usize, String, &'static str), (usize, usize)> = HashMap::new();
    let mut rows_read = 0;
    'rows: for (line, text) in lines {
        // A file broken throughout (a wrong file) stops here: reading on would only take
        // time, and memory for each problem.
        if problems.len() >= MAX_PROBLEMS {
            problems.push(format!("stopped reading at line {line} after {MAX_PROBLEMS} problems"));
            break;
        }
        rows_read += 1;
        if text.matches('"').count() % 2 == 1 {
            problems.push(format!("line {line}: a quoted cell opens here and is never closed: add the closing \""));
            continue;
        }
        let row = cells(&text);
        if row.len() != cols.len() {
            let hint = if row.len() > cols.len() { " (a cell that holds a comma must be in double quotes: \"3,50\" is not a price; write 3.50)" } else { "" };
            problems.push(format!("line {line}: {} cells but the header has {} columns{hint}", row.len(), cols.len()));
            continue;
        }
        let cell = |name: &str| at(name).map_or("", |i| row[i].as_str());
        let mut bad_money = false;
        let mut bad = |what: String| problems.push(format!("line {line}: {what}"));
        let mut money = |name: &str, bad: &mut dyn FnMut(String)| -> Option<f64> {
            let s = cell(name);
            // SkyPilot's catalogs write NaN where an instance is not sold that way.
            if s.is_empty() || s.eq_ignore_ascii_case("nan") {
                return None;
            }
            let problem = match s.parse::<f64>() {
                Ok(v) if v.is_finite() && v > 0.0 && v <= MAX_PRICE => return Some(v),
                Ok(v) if v.is_finite() && v > MAX_PRICE => {
                    format!("is above {MAX_PRICE:e} USD per node-hour: give the price of one node for one hour")
                }
                Ok(v) if v.is_finite() => "is not above zero: a price is above zero; leave the cell empty where the instance is not sold that way".to_string(),
                Ok(_) => "is not a finite number: write the price of one node for one hour, e.g. 24.50".to_string(),
                Err(_) => money_fix(s),
            };
            bad_money = true;
            bad(format!("{name} '{s}' {problem}"));
            None
        };
        let whole = |name: &str, default: u32, bad: &mut dyn FnMut(String)| -> u32 {
            match cell(name) {
                "" => default,
                s => s.parse::<u32>().ok().filter(|v| *v > 0).unwrap_or_else(|| {
                    bad(format!("{name} '{s}' is not a whole number above zero"));
                    default
                }),
            }
        };
        let instance = cell("InstanceType");
        if instance.is_empty() {
            bad("InstanceType is empty (a GPU-only row, as in SkyPilot's GCP catalog); give the all-in node price on the instance's own row".into());
            continue;
        }
        let gpu = cell("AcceleratorName");
        if gpu.is_empty() {
            bad(format!("instance '{instance}' has no AcceleratorName (a CPU-only instance cannot train)"));
            continue;
        }
        // SkyPilot's catalogs call the 40 GB part "A100" (p4d.24xlarge, a2-highgpu); the
        // runner's "a100" alias is the 80 GB one. Either guess prices some rows wrong.
        if gpu.eq_ignore_ascii_case("A100") {
            bad(format!("AcceleratorName '{gpu}' of '{instance}' does not say which A100: write A100-40GB or A100-80GB (SkyPilot's catalogs mean the 40 GB one by A100)"));
            continue;
        }
        let gpu = runner_gpu(gpu);
        let region = cell("Region");
        if region.is_empty() {
            bad(format!("instance '{instance}' has no Region"));
            continue;
        }
        // AcceleratorCount is a float in SkyPilot's files ("8.0").
        let gpus = match cell("AcceleratorCount").parse::<f64>() {
            Ok(v) if v >= 1.0 && v.fract() == 0.0 && v <= 1024.0 => v as u32,
            _ => {
                bad(format!("AcceleratorCount '{}' is not a whole number of GPUs", cell("AcceleratorCount")));
                continue;
            }
        };
        let mut date = cell("EffectiveDate");
        if runner_contract::text::date("EffectiveDate", date).is_err() {
            bad(format!("EffectiveDate '{date}' is not a date written YYYY-MM-DD (e.g. 2026-11-15)"));
            // Said once: the contract's check below would refuse the same cell again.
            date = "";
        }
        let increment = whole("BillingIncrementS", 1, &mut bad);
        let minimum = match cell("MinimumChargeS") {
            "" => 60,
            s => s.parse::<u32>().unwrap_or_else(|_| {
                bad(format!("MinimumChargeS '{s}' is not a whole number of seconds"));
                60
            }),
        };
        let scale_up = whole("ScaleUpDomain", gpus, &mut bad);
        let multiple = whole("NodeMultiple", 1, &mut bad);
        let source = match cell("Source") {
            "" => format!("the user's price file, line {line}"),
            s => format!("{s} (the user's price file, line {line})"),
        };
        let mut caveats = Vec::new();
        for c in cell("Caveats").split(';').map(str::trim).filter(|c| !c.is_empty()) {
            match c {
                "lower-bound" => caveats.push(PriceCaveat::LowerBound),
                "resale" => caveats.push(PriceCaveat::Resale),
                "suspect" => caveats.push(PriceCaveat::Suspect),
                other => bad(format!("Caveats '{other}' is not one of lower-bound, resale, suspect")),
            }
        }
        let mut prices = Vec::new();
        for (col, option) in [
            ("Price", PurchaseOption::OnDemand),
            ("SpotPrice", PurchaseOption::Spot),
            ("Reserved1yPrice", PurchaseOption::OneYearNoUpfront),
            ("Reserved3yPrice", PurchaseOption::ThreeYearNoUpfront),
        ] {
            if let Some(usd) = money(col, &mut bad) {
                // A committed term is billed in whole terms, whatever the file's increment.
                let term = term_hours(option).map(|h| (h * 3600.0) as u32);
                prices.push(Price {
                    billing_increment_s: term.unwrap_or(increment),
                    minimum_charge_s: term.unwrap_or(minimum),
                    effective_date: date.to_string(),
                    source: source.clone(),
                    caveats: caveats.clone(),
                    ..Price::hourly(region, option, usd)
                });
            }
        }
        if bad_money {
            continue;
        }
        if prices.is_empty() {
            bad(format!("instance '{instance}' in {region} has no price (every price column is empty or NaN)"));
            continue;
        }
        // The contract's rules for one offering and one price (names, the price floor, the
        // scale-up domain), row by row, so a row they refuse is named by its line; what
        // spans rows or prices is checked below and for the whole list at the end.
        let refused = prices.iter().find_map(|p| {
            let one = Offering { scale_up_domain: scale_up, node_multiple: multiple, ..Offering::nodes(instance, gpu, gpus, vec![p.clone()]) };
            validate_offerings(&[one]).err()
        });
        if let Some(e) = refused {
            bad(e);
            continue;
        }
        let zone = cell("AvailabilityZone").to_string();
        if let Some(first) = seen.insert((instance.to_string(), region.to_string(), zone.clone()), line) {
            let zone = if zone.is_empty() { String::new() } else { format!(", zone {zone}") };
            bad(format!(
                "instance '{instance}' in {region}{zone} is already priced on line {first}: keep one row (rows of one region differ by AvailabilityZone)"
            ));
            continue;
        }
        let k = match offering_at.get(instance) {
            Some(&k) => {
                let o = &offerings[k];
                if o.gpu != gpu || o.gpus_per_node != gpus {
                    bad(format!(
                        "instance '{instance}' is {gpus}x {gpu} here but {}x {} on an earlier line",
                        o.gpus_per_node, o.gpu
                    ));
                    continue;
                }
                k
            }
            None if offerings.len() == runner_contract::limits::OFFERINGS => {
                bad(format!(
                    "instance '{instance}' is one more than the {} instances a price list holds: keep the instances you would run on",
                    runner_contract::limits::OFFERINGS
                ));
                break;
            }
            None => {
                offering_at.insert(instance.to_string(), offerings.len());
                offerings.push(Offering {
                    scale_up_domain: scale_up,
                    node_multiple: multiple,
                    ..Offering::nodes(instance, gpu, gpus, Vec::new())
                });
                offerings.len() - 1
            }
        };
        let o = &mut offerings[k];
        for p in prices {
            // Several zones of one region: keep the lowest price per option.
            match price_at.get(&(k, p.region.clone(), option_name(p.option))) {
                Some(&(i, _)) if p.usd_per_node_hour < o.prices[i].usd_per_node_hour => o.prices[i] = p,
                Some(_) => {}
                None if o.prices.len() == runner_contract::limits::PRICES => {
                    bad(format!(
                        "instance '{instance}' in {region} is one price more than the {} an instance holds (a region and purchase option each): keep the regions you would run in",
                        runner_contract::limits::PRICES
                    ));
                    break 'rows;
                }
                None => {
                    price_at.insert((k, p.region.clone(), option_name(p.option)), (o.prices.len(), line));
                    o.prices.push(p);
                }
            }
        }
    }
    // A spot or committed price above on-demand is a swapped column or a typo, on its line.
    for (k, o) in offerings.iter().enumerate() {
        for p in o.prices.iter().filter(|p| p.option != PurchaseOption::OnDemand) {
            if let Some(od) = find_price(o, &p.region, PurchaseOption::OnDemand)
                && p.usd_per_node_hour > od.usd_per_node_hour
            {
                let line = price_at.get(&(k, p.region.clone(), option_name(p.option))).map_or(0, |&(_, line)| line);
                let column = match p.option {
                    PurchaseOption::Spot => "SpotPrice",
                    PurchaseOption::OneYearNoUpfront => "Reserved1yPrice",
                    _ => "Reserved3yPrice",
                };
                problems.push(format!(
                    "line {line}: {column} {} is above the on-demand Price {} of '{}' in {}: a spot or committed price is at most on-demand (are the columns swapped?)",
                    p.usd_per_node_hour, od.usd_per_node_hour, o.instance, p.region
                ));
            }
        }
    }
    if !problems.is_empty() {
        let n = problems.len();
        problems.truncate(20);
        let more = if n > 20 { format!("; and {} more", n - 20) } else { String::new() };
        return Err(format!("price file: {}{more}", problems.join("; ")));
    }
    if offerings.is_empty() {
        let why = if rows_read == 0 { "the file has a header and no rows: add one row per instance and region" } else { "no priced rows" };
        return Err(format!("price file: line {hl}: {why}"));
    }
    validate_offerings(&offerings).map_err(|e| format!("price file: {e}"))?;
    Ok(offerings)
}

/// The runner's GPU name for a SkyPilot catalog's `AcceleratorName` that names the same
/// chip as one of the runner's GPU types under another name: `H100-MEGA` (GCP's
/// a3-megagpu-8g, eight H100 SXM 80 GB with more network bandwidth) and `A100-80GB-SXM`
/// (RunPod's A100 SXM4 80 GB). Other names pass unchanged: `H100-SXM` is an alias already,
/// and `H100-NVL` (a 94 GB PCIe part) is another GPU, as are the ones no profile describes.
fn runner_gpu(name: &str) -> &str {
    const SKYPILOT: [(&str, &str); 2] = [("H100-MEGA", "H100"), ("A100-80GB-SXM", "A100-80GB")];
    SKYPILOT.iter().find(|(sky, _)| sky.eq_ignore_ascii_case(name)).map_or(name, |(_, ours)| ours)
}

/// Problems collected before the file is read no further (20 are shown).
const MAX_PROBLEMS: usize = 1000;

/// The highest price a price list may hold, USD per node-hour (the contract's limit).
const MAX_PRICE: f64 = 1e9;

/// How to write a price cell that is not a number ("$3.50", "3,50", "24 USD").
fn money_fix(s: &str) -> String {
    // A letter other than a currency code's ("0x10", "1e3k") leaves no plain number to
    // suggest: dropping it would change the value.
    let letters = s.to_ascii_uppercase().replace("USD", "");
    if letters.chars().any(|c| c.is_ascii_alphabetic()) {
        return "is not a number: write the price of one node for one hour in USD, e.g. 24.50".to_string();
    }
    let digits: String = s.chars().filter(|c| c.is_ascii_digit() || matches!(c, '.' | ',')).collect();
    let plain = match (digits.matches(',').count(), digits.contains('.')) {
        // "3,50": a decimal comma.
        (1, false) if digits.len() - digits.find(',').unwrap_or(0) <= 3 => digits.replace(',', "."),
        // "1,234.50" or "1,234": thousands separators.
        _ => digits.replace(',', ""),
    };
    match plain.parse::<f64>() {
        Ok(v) if !plain.is_empty() && v > 0.0 => {
            format!("is not a plain number: write {plain} (USD per node-hour, a decimal point, no currency sign or thousands separator)")
        }
        _ => "is not a number: write the price of one node for one hour in USD, e.g. 24.50".to_string(),
    }
}

/// The generic pricing plugin.
pub struct PriceFile;

impl Guest for PriceFile {
    fn provider() -> Provider {
        Provider { name: "price-file".into(), display_name: "the user's price file".into() }
    }

    fn offerings() -> Vec<Offering> {
        offerings_or_stop().to_vec()
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        let offerings = parsed().as_ref().map_err(Clone::clone)?;
        standard_quote_with(offerings, &request, UNKNOWN_EXTRAS)
    }
}

runner_plugin_sdk::export_cost!(PriceFile);
