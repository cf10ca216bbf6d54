//! Lambda cost model: 8-GPU instances (H100, B200, A100), one on-demand price in every
//! region, and quotes billed per minute with no egress fees.
//!
//! Lambda's per-GPU rate falls with node size (1x > 2x > 4x > 8x); only the 8-GPU nodes a
//! training run would use are listed, so their price must not be scaled down to fewer GPUs.

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");

const BILLING: Billing = Billing {
    increment_s: 60,
    minimum_s: 0,
    note: "billing: per minute (\"pay by the minute\", lambda.ai), no minimum stated",
};

// "No egress fees" (lambda.ai, 2026-09-20); no filesystem price was found.
const EXTRAS: ExtraRates =
    ExtraRates { storage_usd_per_gb_month: None, egress_usd_per_gb: Some(0.0) };

/// The Lambda cost model.
pub struct Lambda;

impl Guest for Lambda {
    fn provider() -> Provider {
        Provider { name: "lambda".into(), display_name: "Lambda".into() }
    }

    fn offerings() -> Vec<Offering> {
        offerings_from_csv(PRICES, BILLING).expect("prices.csv parses (checked by the tests)")
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        standard_quote_with(&offerings_from_csv(PRICES, BILLING)?, &request, EXTRAS)
    }
}

runner_plugin_sdk::export_cost!(Lambda);
