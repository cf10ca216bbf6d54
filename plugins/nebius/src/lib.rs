//! Nebius cost model: HGX H100, H200 and B200 nodes from two sources that disagree, and
//! quotes.
//!
//! The SkyPilot catalog (undated, real instance names, per region, with spot) is cheaper
//! than nebius.com/prices (read 2026-10-07, per-GPU rates x 8, no region). Both are listed,
//! under their own names, so a comparison can show the spread instead of hiding it; the
//! page rows are flagged because the page already lists higher prices effective 2026-10-01.

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");

const BILLING: Billing = Billing {
    increment_s: 1,
    minimum_s: 0,
    note: "billing: increment and minimum unknown (not found; the $25 minimum first payment is \
           per account); quoted pro rata per second; spot prices may change every 15 minutes",
};

// Shared Filesystem at $0.08/GiB-month; network egress is free (nebius.com/prices,
// 2026-10-07). Object-storage egress ($0.015/GiB) is not what a training run pays.
const EXTRAS: ExtraRates =
    ExtraRates { storage_usd_per_gb_month: Some(0.08 / GB_PER_GIB), egress_usd_per_gb: Some(0.0) };

/// The Nebius cost model.
pub struct Nebius;

impl Guest for Nebius {
    fn provider() -> Provider {
        Provider { name: "nebius".into(), display_name: "Nebius AI Cloud".into() }
    }

    fn offerings() -> Vec<Offering> {
        offerings_from_csv(PRICES, BILLING).expect("prices.csv parses (checked by the tests)")
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        standard_quote_with(&offerings_from_csv(PRICES, BILLING)?, &request, EXTRAS)
    }
}

runner_plugin_sdk::export_cost!(Nebius);
