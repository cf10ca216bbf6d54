//! Oracle Cloud cost model: bare-metal GPU shapes (H100, H200, B200, B300, GB200, GB300,
//! A100, MI300X, MI355X), one on-demand price that holds in every region, and quotes.
//!
//! OCI publishes a flat global price list, so each shape has a single `*` (any region)
//! price; there is no spot for bare-metal GPU shapes. GB200 and GB300 are 4-GPU trays in
//! 72-GPU NVLink domains, sold a tray at a time as far as OCI's docs say.
//!
//! Published as of 2026-12-01: on-demand only, undated (SkyPilot's catalog). Not found: any
//! dated OCI price, any 1-year or 3-year rate, OCI's billing increment and minimum, and any
//! storage or egress price.

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");
/// Parsed once per instance: every quote reads it. No source for OCI's billing granularity
/// was found; pro rata per second adds nothing the price list does not say, and the note
/// of `UNKNOWN_BILLING` keeps the gap visible in every report.
static LIST: PriceList = PriceList::new(PRICES, UNKNOWN_BILLING);

/// The Oracle Cloud cost model.
pub struct Oci;

impl PriceListCloud for Oci {
    // No OCI storage or egress prices were found.
    const EXTRAS: ExtraRates = UNKNOWN_EXTRAS;

    fn cloud() -> Provider {
        Provider { name: "oci".into(), display_name: "Oracle Cloud Infrastructure".into() }
    }

    fn list() -> &'static PriceList {
        &LIST
    }
}

runner_plugin_sdk::export_cost!(Oci);
