//! Lambda cost model: 8-GPU instances (H100, B200, A100), one on-demand price in every
//! region, and quotes billed per minute with no egress fees.
//!
//! Lambda's per-GPU rate falls with node size (1x > 2x > 4x > 8x); only the 8-GPU nodes a
//! training run would use are listed, so their price must not be scaled down to fewer GPUs.
//!
//! Published as of 2026-12-01: on-demand only. Not found: spot, any 1-year or 3-year rate,
//! and a filesystem price.

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");
/// Parsed once per instance: every quote reads it.
static LIST: PriceList = PriceList::new(PRICES, BILLING);

const BILLING: Billing = Billing {
    increment_s: 60,
    minimum_s: 0,
    note: "billing: per minute (\"pay by the minute\", lambda.ai), no minimum stated",
    per_option: &[],
};

/// The Lambda cost model.
pub struct Lambda;

impl PriceListCloud for Lambda {
    // No filesystem price was found, so storage is not costed.
    const EXTRAS: ExtraRates = ExtraRates {
        storage: None,
        egress: Some(ExtraRate::list(
            0.0,
            "free ('no egress fees', lambda.ai/instances via api-evangelist/lambda-labs@1929382e, \
             read 2026-09-20)",
        )),
    };

    fn cloud() -> Provider {
        Provider { name: "lambda".into(), display_name: "Lambda".into() }
    }

    fn list() -> &'static PriceList {
        &LIST
    }
}

runner_plugin_sdk::export_cost!(Lambda);
