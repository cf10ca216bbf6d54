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
               Blocks', read 2026-12-01); quoted in 1-day steps, so a block over 14 days comes \
               out low by up to 6 days",
    }],
};

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
        offerings_from_csv(PRICES, BILLING).expect("prices.csv parses (checked by the tests)")
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        standard_quote_with(&offerings_from_csv(PRICES, BILLING)?, &request, EXTRAS)
    }
}

runner_plugin_sdk::export_cost!(Aws);
