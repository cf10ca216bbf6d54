//! Hyperstack cost model: the 8x H100 SXM5 node in its two catalog regions, and quotes.
//!
//! Published as of 2026-12-01 (as far as found): on-demand only, undated (SkyPilot's
//! catalog). Not found: a dated price, spot, any 1-year or 3-year rate, storage and egress.

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");
/// Parsed once per instance: every quote reads it.
static LIST: PriceList = PriceList::new(PRICES, BILLING);

const BILLING: Billing = Billing {
    increment_s: 1,
    minimum_s: 0,
    note: "billing: increment and minimum unknown (not found); \
           quoted pro rata per second, no minimum",
    per_option: &[],
};

/// The Hyperstack cost model.
pub struct Hyperstack;

impl Guest for Hyperstack {
    fn provider() -> Provider {
        Provider { name: "hyperstack".into(), display_name: "Hyperstack".into() }
    }

    fn offerings() -> Vec<Offering> {
        LIST.offerings().expect("prices.csv parses (checked by the tests)").to_vec()
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        // No Hyperstack storage or egress prices were found.
        standard_quote_with(LIST.offerings()?, &request, UNKNOWN_EXTRAS)
    }
}

runner_plugin_sdk::export_cost!(Hyperstack);
