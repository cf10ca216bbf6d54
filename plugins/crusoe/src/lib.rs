//! Crusoe cost model: HGX H100, H200 and A100 nodes priced at 8 x the per-GPU list rate,
//! and quotes.
//!
//! The page states no region, so each price is listed for every region (`*`). B200 and
//! GB200 NVL72 are "contact sales" and are not listed.

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");

const BILLING: Billing = Billing {
    increment_s: 1,
    minimum_s: 0,
    note: "billing: increment and minimum unknown (not found); \
           quoted pro rata per second, no minimum",
};

// Shared disk at $0.07/GiB-month (crusoe.ai, 2026-09-20); no egress price was found.
const EXTRAS: ExtraRates =
    ExtraRates { storage_usd_per_gb_month: Some(0.07 / GB_PER_GIB), egress_usd_per_gb: None };

/// The Crusoe cost model.
pub struct Crusoe;

impl Guest for Crusoe {
    fn provider() -> Provider {
        Provider { name: "crusoe".into(), display_name: "Crusoe Cloud".into() }
    }

    fn offerings() -> Vec<Offering> {
        offerings_from_csv(PRICES, BILLING).expect("prices.csv parses (checked by the tests)")
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        standard_quote_with(&offerings_from_csv(PRICES, BILLING)?, &request, EXTRAS)
    }
}

runner_plugin_sdk::export_cost!(Crusoe);
