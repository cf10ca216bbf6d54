//! Nebius cost model: HGX H100, H200, B200 and B300 nodes from two sources that disagree,
//! and quotes.
//!
//! nebius.com/prices (read 2026-10-07, per-GPU rates x 8, no region) lists each HGX price
//! and a higher one "effective October 1, 2026"; the later price is the one in effect and is
//! listed, dated 2026-10-01, with the page's "from" preemptible price as a lower bound. The
//! SkyPilot catalog (undated, real instance names, per region, with spot) is cheaper than
//! both page prices, so its on-demand prices are flagged SUSPECT; both are listed under their
//! own names, so a comparison shows the spread instead of hiding it.
//!
//! Published as of 2026-12-01: on-demand, and spot (the catalog's, and the page's floor).
//! Not found: any 1-year or 3-year rate (commitments are "up to 35% less"), GB200 and GB300
//! NVL72 prices ("Contact us"), and Nebius' billing increment.

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");
/// Parsed once per instance: every quote reads it.
static LIST: PriceList = PriceList::new(PRICES, BILLING);

const BILLING: Billing = Billing {
    increment_s: 1,
    minimum_s: 0,
    note: "billing: increment and minimum unknown (not found; the $25 minimum first payment is \
           per account); quoted pro rata per second; spot prices may change every 15 minutes",
    per_option: &[],
};

/// The Nebius cost model.
pub struct Nebius;

impl PriceListCloud for Nebius {
    // Object-storage egress ($0.015/GiB) is not what a training run's egress pays.
    const EXTRAS: ExtraRates = ExtraRates {
        storage: Some(ExtraRate::list(
            0.08 / GB_PER_GIB,
            "Shared Filesystem at 0.08 USD/GiB-month (nebius.com/prices via api-evangelist/nebius@37bdedf3, \
             read 2026-10-07)",
        )),
        egress: Some(ExtraRate::list(
            0.0,
            "free ('Networking: Egress/Ingress traffic: Free', nebius.com/prices, read 2026-10-07)",
        )),
    };

    fn cloud() -> Provider {
        Provider { name: "nebius".into(), display_name: "Nebius AI Cloud".into() }
    }

    fn list() -> &'static PriceList {
        &LIST
    }
}

runner_plugin_sdk::export_cost!(Nebius);
