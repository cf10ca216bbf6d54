//! AWS cost model: EC2 GPU instances, their on-demand, spot, 1-year reserved and Capacity
//! Block prices per region, and quotes billed per second (Capacity Blocks by the day).
//!
//! The price list is `prices.csv` beside this file, one row per instance, region and source,
//! so a price update is a data change a reviewer can diff against the source named in each
//! row. It is compiled in: plugins see no files and no network.
//!
//! Published as of 2026-12-01: on-demand and spot for every instance; a 1-year no-upfront
//! Standard RI rate for p4d and p4de only; Capacity Block rates from late 2024 only (flagged
//! suspect). Not found: any 3-year or partial/all-upfront rate, Savings Plan rates, any
//! committed price for p5, p5e, p5en or p6, and any price for p6e-gb200 UltraServers.

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");
/// Parsed once per instance: every quote reads it.
static LIST: PriceList = PriceList::new(PRICES, BILLING);

// Linux instances bill per second after the first minute. The source is secondary (study
// notes), so the note says so rather than sound official. Capacity Blocks are bought by the
// day and paid up front.
const BILLING: Billing = Billing {
    increment_s: 1,
    minimum_s: 60,
    note: "billing: per second, 60 s minimum (secondary source; verify against AWS docs)",
    per_option: &[OptionBilling {
        option: PurchaseOption::CapacityBlock,
        increment_s: 86_400,
        minimum_s: 86_400,
        note: "capacity blocks: reserved in 1-day steps up to 14 days and 7-day steps up to 182 \
               days, paid up front at booking (AWS EC2 User Guide, 'Find and purchase Capacity \
               Blocks', read 2026-12-01); a run's whole days are quoted as consecutive blocks of \
               lengths sold: 182-day blocks, then one in 7-day steps, then one of 1 to 14 days; \
               at most 64 instances a block (more are bought as blocks side by side) and 256 \
               across an account's Capacity Blocks (same page, read 2026-12-05)",
    }],
};

/// The longest Capacity Block AWS sells, and the longest sold in 1-day steps (longer ones
/// come in 7-day steps), in days.
const BLOCK_MAX_DAYS: f64 = 182.0;
const BLOCK_DAILY_DAYS: f64 = 14.0;

/// The most instances one Capacity Block holds, and the most an account may hold across
/// its Capacity Blocks (AWS EC2 User Guide, 'Find and purchase Capacity Blocks': "Each
/// Capacity Block can have up to 64 instances, and you can have up to 256 instances across
/// Capacity Blocks", read 2026-12-05).
pub const BLOCK_MAX_INSTANCES: u32 = 64;
pub const ACCOUNT_MAX_INSTANCES: u32 = 256;

/// The instance counts of the blocks bought side by side for `nodes` instances: as many
/// blocks of 64 as fit, then one of the rest.
pub fn blocks_side_by_side(nodes: u32) -> Vec<u32> {
    let mut counts = vec![BLOCK_MAX_INSTANCES; (nodes / BLOCK_MAX_INSTANCES) as usize];
    if !nodes.is_multiple_of(BLOCK_MAX_INSTANCES) {
        counts.push(nodes % BLOCK_MAX_INSTANCES);
    }
    counts
}

/// The consecutive Capacity Blocks that buy `days` whole days, as (how many, days each):
/// as many 182-day blocks as fit, then the rest in whole weeks (14 to 175 days; a block
/// over 14 days comes in 7-day steps), then the last 1 to 6 days (or all of a rest of at
/// most 14 days in one block). They add up to `days` exactly: a run pays for no day it does
/// not use, and no block is one AWS does not sell.
pub fn capacity_blocks(days: f64) -> Vec<(f64, f64)> {
    let mut blocks = Vec::new();
    let full = (days / BLOCK_MAX_DAYS).floor();
    if full > 0.0 {
        blocks.push((full, BLOCK_MAX_DAYS));
    }
    let rest = days - full * BLOCK_MAX_DAYS;
    let weeks = if rest > BLOCK_DAILY_DAYS { (rest / 7.0).floor() * 7.0 } else { 0.0 };
    for length in [weeks, rest - weeks] {
        if length > 0.0 {
            blocks.push((1.0, length));
        }
    }
    blocks
}

/// A standard quote, its compute line split into the Capacity Blocks that buy the time
/// (a line per block length), so no line stands for a block AWS does not sell; more than
/// 64 instances are blocks side by side (the line says how many), and more than an
/// account may hold are refused.
fn capacity_block_quote(mut q: Quote, offering: &Offering, nodes: u32) -> Result<Quote, String> {
    if nodes > ACCOUNT_MAX_INSTANCES {
        return Err(format!(
            "{nodes} {} instances cannot be bought as Capacity Blocks: AWS lets an account hold at most \
             {ACCOUNT_MAX_INSTANCES} instances across its Capacity Blocks (EC2 User Guide, 'Find and purchase Capacity \
             Blocks'); price the run on-demand or reserved, or on at most {} GPUs",
            offering.instance,
            ACCOUNT_MAX_INSTANCES * offering.gpus_per_node
        ));
    }
    let Some(at) = q.lines.iter().position(|l| l.category == LineCategory::Compute) else { return Ok(q) };
    let line = q.lines.remove(at);
    let side = blocks_side_by_side(nodes.max(1));
    let side_by_side = match side.as_slice() {
        [_] => String::new(),
        counts => {
            let list: Vec<String> = counts.iter().map(u32::to_string).collect();
            format!(", as {} blocks side by side ({} instances)", counts.len(), list.join(" + "))
        }
    };
    let nodes = f64::from(nodes.max(1));
    // Whole days: the price's 1-day increment billed them.
    let days = (line.quantity / nodes / 24.0).round();
    let rate = if line.quantity > 0.0 { line.amount / line.quantity } else { 0.0 };
    for (i, (count, length)) in capacity_blocks(days).into_iter().enumerate() {
        let quantity = nodes * count * length * 24.0;
        let blocks = if count == 1.0 { format!("1 block of {length} days") } else { format!("{count} blocks of {length} days") };
        q.lines.insert(at + i, QuoteLine { item: format!("{}: {blocks}{side_by_side}", line.item), quantity, amount: quantity * rate, ..line.clone() });
    }
    q.total = q.lines.iter().map(|l| l.amount).sum();
    Ok(q)
}

// Neither rate is AWS's own page: both are estimates.
const EXTRAS: ExtraRates = ExtraRates {
    storage: Some(ExtraRate::estimate(
        0.14,
        "FSx for Lustre Scratch-2 at 0.14 USD/GB-month (an undated third-party example bill: \
         1.2 TB for 168 USD/month; FSx sells 1.2 TB at least, then 2.4 TB steps)",
    )),
    egress: Some(ExtraRate::estimate(
        0.09,
        "internet egress at the first tier, 0.09 USD/GB up to 10 TB (egresscost.com and \
         wring.co, 2026 blogs; the first 100 GB are free and later tiers cheaper)",
    )),
};

/// The AWS cost model.
pub struct Aws;

impl Guest for Aws {
    fn provider() -> Provider {
        Provider { name: "aws".into(), display_name: "Amazon Web Services (EC2)".into() }
    }

    fn offerings() -> Vec<Offering> {
        LIST.offerings().expect("prices.csv parses (checked by the tests)").to_vec()
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        let offerings = LIST.offerings()?;
        let q = standard_quote_with(offerings, &request, EXTRAS)?;
        match (request.option, offerings.iter().find(|o| o.instance == request.instance)) {
            (PurchaseOption::CapacityBlock, Some(o)) => capacity_block_quote(q, o, request.nodes),
            _ => Ok(q),
        }
    }
}

runner_plugin_sdk::export_cost!(Aws);
