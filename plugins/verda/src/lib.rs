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
static LIST: PriceList = PriceList::new(PRICES, UNKNOWN_BILLING);

/// The Verda cost model.
pub struct Verda;

impl PriceListCloud for Verda {
    // No Verda storage or egress prices were found.
    const EXTRAS: ExtraRates = UNKNOWN_EXTRAS;

    fn cloud() -> Provider {
        Provider { name: "verda".into(), display_name: "Verda (formerly DataCrunch)".into() }
    }

    fn list() -> &'static PriceList {
        &LIST
    }
}

runner_plugin_sdk::export_cost!(Verda);
