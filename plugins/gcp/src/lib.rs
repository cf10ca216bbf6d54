//! Google Cloud cost model: A2, A3 and A4 GPU VMs, their on-demand and spot prices per
//! region, and quotes billed per second after the first minute.
//!
//! GCP prices a GPU VM as two catalog rows, the machine type (host vCPU and memory) and the
//! attached GPUs; `prices.csv` holds their sum per node and names both parts in `source`.
//! Two rows are flagged SUSPECT (a GPU row from the catalog's far cheaper tier, a host row of
//! 0.0); the cheap-tier a3-highgpu-8g price in us-central1 is replaced by a dated read of the
//! Cloud Billing catalog (tgarg01/silybench-data, 2026-09-26).
//!
//! Published as of 2026-12-01: on-demand and Spot. Not found: any 1-year or 3-year committed
//! use discount rate for A2/A3/A4, an authoritative A4 host price, and any A4X (GB200) price.

use runner_plugin_sdk::cost::*;

const PRICES: &str = include_str!("prices.csv");
/// Parsed once per instance: every quote reads it.
static LIST: PriceList = PriceList::new(PRICES, BILLING);

// The bundled Local SSD of a3/a2-ultra shapes is billed but absent from the catalog's
// rows (SkyPilot issue #3281), so every node price here is low by that much.
const BILLING: Billing = Billing {
    increment_s: 1,
    minimum_s: 60,
    note: "billing: 60 s minimum, then per second (GCP pricing page, via a mirror); \
           node price = host row + GPU row, without the bundled Local SSD",
    per_option: &[],
};

/// The Google Cloud cost model.
pub struct Gcp;

impl PriceListCloud for Gcp {
    // No GCS, Filestore or Managed Lustre price was found, so storage is not costed.
    const EXTRAS: ExtraRates = ExtraRates {
        storage: None,
        egress: Some(ExtraRate::estimate(
            0.12 / GB_PER_GIB,
            "Premium-tier internet egress at the first tier, 0.12 USD/GiB (dev.to and \
             cloudtoolstack, secondary; they disagree on where the tier ends)",
        )),
    };

    fn cloud() -> Provider {
        Provider { name: "gcp".into(), display_name: "Google Cloud (Compute Engine)".into() }
    }

    fn list() -> &'static PriceList {
        &LIST
    }
}

runner_plugin_sdk::export_cost!(Gcp);
