//! Azure cost model: ND-series GPU VMs (H100 and A100), their on-demand and spot prices
//! per region, and quotes.
//!
//! The prices come from the newest Azure catalog found, SkyPilot's v6 file (Azure has no
//! catalog updater since), which is stale for some SKUs; one row is confirmed by a 2026 read.
//!
//! Published as of 2026-12-01: on-demand, and spot for the A100 VMs (not for ND H100 v5).
//! Not found: any 1-year or 3-year reservation or savings-plan rate, and any price for
//! ND96isr_H200_v5 or ND GB200 v6.

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");
/// Parsed once per instance: every quote reads it.
static LIST: PriceList = PriceList::new(PRICES, BILLING);

// Secondary sources disagree on per-second versus per-minute billing. Per minute is the
// costlier reading, so a quote errs high by under a minute per node rather than low.
const BILLING: Billing = Billing {
    increment_s: 60,
    minimum_s: 0,
    note: "billing: unknown (secondary sources conflict: per second vs per minute); \
           quoted per minute, no minimum",
    per_option: &[],
};

/// The Azure cost model.
pub struct Azure;

impl PriceListCloud for Azure {
    // No Azure Blob or Managed Lustre price was found, so storage is not costed.
    const EXTRAS: ExtraRates = ExtraRates {
        storage: None,
        egress: Some(ExtraRate::estimate(
            0.087,
            "internet egress at the first tier, 0.087 USD/GB up to 10 TB (cloudtoolstack and \
             dev.to, secondary)",
        )),
    };

    fn cloud() -> Provider {
        Provider { name: "azure".into(), display_name: "Microsoft Azure".into() }
    }

    fn list() -> &'static PriceList {
        &LIST
    }
}

runner_plugin_sdk::export_cost!(Azure);
