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
/// Parsed once per instance: every quote reads it.
static LIST: PriceList = PriceList::new(PRICES, BILLING);

// No source for OCI's billing granularity was found; pro rata per second adds nothing the
// price list does not say, and the note keeps the gap visible in every report.
const BILLING: Billing = Billing {
    increment_s: 1,
    minimum_s: 0,
    note: "billing: increment and minimum unknown (not found); \
           quoted pro rata per second, no minimum",
    per_option: &[],
};

/// The Oracle Cloud cost model.
pub struct Oci;

impl Guest for Oci {
    fn provider() -> Provider {
        Provider { name: "oci".into(), display_name: "Oracle Cloud Infrastructure".into() }
    }

    fn offerings() -> Vec<Offering> {
        LIST.offerings().expect("prices.csv parses (checked by the tests)").to_vec()
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        // No OCI storage or egress prices were found.
        standard_quote_with(LIST.offerings()?, &request, UNKNOWN_EXTRAS)
    }
}

runner_plugin_sdk::export_cost!(Oci);
