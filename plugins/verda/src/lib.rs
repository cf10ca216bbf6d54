//! Verda (formerly DataCrunch) cost model: 8-GPU H100, H200 and B200 instances, and quotes.
//!
//! The H100 and H200 prices are Verda capacity as listed on the Prime Intellect marketplace,
//! which resells other clouds at its own prices, so Verda's direct price may differ: they
//! carry the `resale` caveat. The B200 row is Verda's own catalog, spot only.
//!
//! Published as of 2026-12-01 (as far as found): undated catalog prices only. Not found: a
//! dated price, Verda's direct 8-GPU prices, any 1-year or 3-year rate, storage and egress.

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

/// The Verda cost model.
pub struct Verda;

impl Guest for Verda {
    fn provider() -> Provider {
        Provider { name: "verda".into(), display_name: "Verda (formerly DataCrunch)".into() }
    }

    fn offerings() -> Vec<Offering> {
        LIST.offerings().expect("prices.csv parses (checked by the tests)").to_vec()
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        // No Verda storage or egress prices were found.
        standard_quote_with(LIST.offerings()?, &request, UNKNOWN_EXTRAS)
    }
}

runner_plugin_sdk::export_cost!(Verda);
