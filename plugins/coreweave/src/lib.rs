//! CoreWeave cost model: HGX (H100, H200, B200, A100) and GB200 NVL72 instances, their
//! on-demand and spot prices, and quotes billed per minute with no minimum.
//!
//! Prices are the public page (coreweave.com/pricing) as transcribed on 2026-09-20; a node
//! price includes the host's vCPUs, memory and ephemeral storage.

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");

const BILLING: Billing = Billing {
    increment_s: 60,
    minimum_s: 0,
    note: "billing: per minute, no minimum (CoreWeave billing docs); price includes host vCPU, \
           RAM and ephemeral storage",
};

// Distributed File Storage at $0.07/GB-month is where training data and checkpoints live;
// egress is free (both from the pricing page, 2026-09-20).
const EXTRAS: ExtraRates =
    ExtraRates { storage_usd_per_gb_month: Some(0.07), egress_usd_per_gb: Some(0.0) };

/// The CoreWeave cost model.
pub struct CoreWeave;

impl Guest for CoreWeave {
    fn provider() -> Provider {
        Provider { name: "coreweave".into(), display_name: "CoreWeave".into() }
    }

    fn offerings() -> Vec<Offering> {
        offerings_from_csv(PRICES, BILLING).expect("prices.csv parses (checked by the tests)")
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        standard_quote_with(&offerings_from_csv(PRICES, BILLING)?, &request, EXTRAS)
    }
}

runner_plugin_sdk::export_cost!(CoreWeave);
