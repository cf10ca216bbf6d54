//! Hyperstack cost model: the 8x H100 SXM5 node in its two catalog regions, and quotes.
//!
//! Published as of 2026-12-01 (as far as found): on-demand only, undated (SkyPilot's
//! catalog). Not found: a dated price, spot, any 1-year or 3-year rate, storage and egress.

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");
/// Parsed once per instance: every quote reads it.
static LIST: PriceList = PriceList::new(PRICES, UNKNOWN_BILLING);

/// The Hyperstack cost model.
pub struct Hyperstack;

impl PriceListCloud for Hyperstack {
    // No Hyperstack storage or egress prices were found.
    const EXTRAS: ExtraRates = UNKNOWN_EXTRAS;

    fn cloud() -> Provider {
        Provider { name: "hyperstack".into(), display_name: "Hyperstack".into() }
    }

    fn list() -> &'static PriceList {
        &LIST
    }
}

runner_plugin_sdk::export_cost!(Hyperstack);
