//! AWS cost model: EC2 GPU instances, their on-demand and spot prices per region, and
//! quotes billed per second.
//!
//! The price list is `prices.csv` beside this file, one row per instance and region, so a
//! price update is a data change a reviewer can diff against the source named in each row.
//! It is compiled in: plugins see no files and no network.

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");

// Linux instances bill per second after the first minute. The source is secondary (study
// notes, shared/notes/pricing.md §5), so the note says so rather than sound official.
const BILLING: Billing = Billing {
    increment_s: 1,
    minimum_s: 60,
    note: "billing: per second, 60 s minimum (secondary source; verify against AWS docs); \
           spot: lowest standard-AZ price in the snapshot, other AZs cost up to on-demand",
};

// Storage is FSx for Lustre Scratch-2 ($140 per TB-month; an undated example, and FSx sells
// 1.2 TB minimum). Egress is the first internet tier ($0.09/GB up to 10 TB), so large
// transfers come out a little high and the free first 100 GB is ignored. Both are estimates.
const EXTRAS: ExtraRates =
    ExtraRates { storage_usd_per_gb_month: Some(0.14), egress_usd_per_gb: Some(0.09) };

/// The AWS cost model.
pub struct Aws;

impl Guest for Aws {
    fn provider() -> Provider {
        Provider { name: "aws".into(), display_name: "Amazon Web Services (EC2)".into() }
    }

    fn offerings() -> Vec<Offering> {
        offerings_from_csv(PRICES, BILLING).expect("prices.csv parses (checked by the tests)")
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        standard_quote_with(&offerings_from_csv(PRICES, BILLING)?, &request, EXTRAS)
    }
}

runner_plugin_sdk::export_cost!(Aws);
