//! Google Cloud cost model: A2, A3 and A4 GPU VMs, their on-demand and spot prices per
//! region, and quotes billed per second after the first minute.
//!
//! GCP prices a GPU VM as two catalog rows, the machine type (host vCPU and memory) and the
//! attached GPUs; `prices.csv` holds their sum per node and names both parts in `source`.
//! Three rows come from the catalog's suspiciously cheap tier and are flagged SUSPECT
//! (shared/notes/pricing.md §2.3).

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");

// The bundled Local SSD of a3/a2-ultra shapes is billed but absent from the catalog's
// rows (SkyPilot issue #3281), so every node price here is low by that much.
const BILLING: Billing = Billing {
    increment_s: 1,
    minimum_s: 60,
    note: "billing: 60 s minimum, then per second (GCP pricing page, via a mirror); \
           node price = host row + GPU row, without the bundled Local SSD",
};

// Premium-tier internet egress, first tier: $0.12 per GiB (sources disagree on where the
// tier ends). No GCS/Filestore/Managed Lustre price was found, so storage is not costed.
const EXTRAS: ExtraRates =
    ExtraRates { storage_usd_per_gb_month: None, egress_usd_per_gb: Some(0.12 / GB_PER_GIB) };

/// The Google Cloud cost model.
pub struct Gcp;

impl Guest for Gcp {
    fn provider() -> Provider {
        Provider { name: "gcp".into(), display_name: "Google Cloud (Compute Engine)".into() }
    }

    fn offerings() -> Vec<Offering> {
        offerings_from_csv(PRICES, BILLING).expect("prices.csv parses (checked by the tests)")
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        standard_quote_with(&offerings_from_csv(PRICES, BILLING)?, &request, EXTRAS)
    }
}

runner_plugin_sdk::export_cost!(Gcp);
