//! CoreWeave cost model: HGX (H100, H200, B200, B300, A100) and GB200 NVL72 instances, their
//! on-demand and spot prices, and quotes billed per minute with no minimum.
//!
//! Prices are the public page (coreweave.com/pricing) as transcribed on 2026-09-20; a node
//! price includes the host's vCPUs, memory and ephemeral storage. HGX B300 is sold spot only.
//!
//! Published as of 2026-12-01: on-demand and spot. Not found: any 1-year or 3-year rate (the
//! page says only "up to 60% discounts" for committed usage), GB300 NVL72 and HGX B300
//! on-demand prices ("Contact sales").

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");
/// Parsed once per instance: every quote reads it.
static LIST: PriceList = PriceList::new(PRICES, BILLING);

const BILLING: Billing = Billing {
    increment_s: 60,
    minimum_s: 0,
    note: "billing: per minute, no minimum (CoreWeave billing docs); price includes host vCPU, \
           RAM and ephemeral storage",
    per_option: &[],
};

/// The CoreWeave cost model.
pub struct CoreWeave;

impl PriceListCloud for CoreWeave {
    // Distributed File Storage is where training data and checkpoints live. Both are list prices.
    const EXTRAS: ExtraRates = ExtraRates {
        storage: Some(ExtraRate::list(
            0.07,
            "Distributed File Storage at 0.070 USD/GB-month (coreweave.com/pricing via \
             api-evangelist/coreweave@27bcc25e, read 2026-09-20)",
        )),
        egress: Some(ExtraRate::list(
            0.0,
            "free ('Egress and IOPS: Free', coreweave.com/pricing, read 2026-09-20)",
        )),
    };

    fn cloud() -> Provider {
        Provider { name: "coreweave".into(), display_name: "CoreWeave".into() }
    }

    fn list() -> &'static PriceList {
        &LIST
    }
}

runner_plugin_sdk::export_cost!(CoreWeave);
