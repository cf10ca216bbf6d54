//! A complete cost plugin for a new cloud: its instances, prices and billing rules.

use runner_plugin_sdk::cost::*;

pub struct MyCloud;

fn h100_node(region: &str, on_demand: f64, spot: f64) -> Vec<Price> {
    let price = |option, usd| Price {
        billing_increment_s: 60, // per minute
        minimum_charge_s: 600,   // ten minutes at least
        effective_date: "2026-11-01".into(),
        source: "mycloud.example/pricing".into(),
        ..Price::hourly(region, option, usd)
    };
    vec![price(PurchaseOption::OnDemand, on_demand), price(PurchaseOption::Spot, spot)]
}

impl Guest for MyCloud {
    fn provider() -> Provider {
        Provider { name: "mycloud".into(), display_name: "My Cloud".into() }
    }

    fn offerings() -> Vec<Offering> {
        vec![Offering {
            instance: "gpu-h100-8x".into(),
            gpu: "H100".into(),
            gpus_per_node: 8,
            scale_up_domain: 8,
            node_multiple: 1,
            interconnect_gbps: 3200.0,
            prices: [h100_node("eu-west", 24.0, 12.0), h100_node("us-east", 22.0, 11.0)].concat(),
        }]
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        // Node-hours rounded up to the billing increment, plus storage and egress lines.
        let extras = ExtraRates {
            storage: Some(ExtraRate::list(0.05, "file storage, mycloud.example/pricing (2026-11-01)")),
            egress: Some(ExtraRate::list(0.0, "free, mycloud.example/pricing (2026-11-01)")),
        };
        standard_quote_with(&Self::offerings(), &request, extras)
    }
}

runner_plugin_sdk::export_cost!(MyCloud);
