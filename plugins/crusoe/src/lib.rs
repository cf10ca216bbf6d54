//! Crusoe cost model: HGX H100, H200 and A100 nodes priced at 8 x the per-GPU list rate,
//! and quotes.
//!
//! The page states no region, so each price is listed for every region (`*`). B200 and
//! GB200 NVL72 are "contact sales" and are not listed.
//!
//! Published as of 2026-12-01: on-demand only (dated 2026-09-20). Not found: spot ("contact
//! sales"), any 1-year or 3-year rate, and an egress price.

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");
/// Parsed once per instance: every quote reads it.
static LIST: PriceList = PriceList::new(PRICES, UNKNOWN_BILLING);

/// The Crusoe cost model.
pub struct Crusoe;

impl PriceListCloud for Crusoe {
    // No egress price was found, so egress is not costed.
    const EXTRAS: ExtraRates = ExtraRates {
        storage: Some(ExtraRate::list(
            0.07 / GB_PER_GIB,
            "shared disks at 0.07 USD/GiB-month (crusoe.ai/cloud/pricing via api-evangelist/crusoe@39cd780e, \
             read 2026-09-20)",
        )),
        egress: None,
    };

    fn cloud() -> Provider {
        Provider { name: "crusoe".into(), display_name: "Crusoe Cloud".into() }
    }

    fn list() -> &'static PriceList {
        &LIST
    }
}

runner_plugin_sdk::export_cost!(Crusoe);
