//! Test program: a cost plugin built against the published contract 0.1.0 (no SDK): one
//! H100 node type with on-demand and one-year reserved prices, billed per minute with a
//! ten-minute minimum, and a quote with a compute and a storage line. The host must run it
//! through its adapter.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

wit_bindgen::generate!({ world: "cost-plugin", path: "../../wit-0.1.0" });

use exports::runner::plugin::cost_model::*;

struct Old;

fn offering() -> Offering {
    let price = |option, usd_per_node_hour| Price { region: "old-1".into(), option, usd_per_node_hour };
    Offering {
        instance: "old.h100x8".into(),
        gpu: "H100".into(),
        gpus_per_node: 8,
        scale_up_domain: 8,
        interconnect_gbps: 3200.0,
        prices: vec![price(PurchaseOption::OnDemand, 20.0), price(PurchaseOption::ReservedOneYear, 12.0)],
        billing_increment_s: 60,
        minimum_charge_s: 600,
        effective_date: "2026-01-15".into(),
        source: "contract 0.1.0 test program".into(),
    }
}

impl Guest for Old {
    fn provider() -> ProviderInfo {
        ProviderInfo { name: "oldcloud".into(), display_name: "A cloud priced by a 0.1.0 plugin".into() }
    }

    fn offerings() -> Vec<Offering> {
        vec![offering()]
    }

    fn quote(request: QuoteRequest) -> Result<ItemisedQuote, String> {
        let o = offering();
        if request.instance != o.instance {
            return Err(format!("unknown instance '{}'", request.instance));
        }
        let price = o
            .prices
            .iter()
            .find(|p| p.option == request.option)
            .ok_or("no such purchase option")?;
        let minutes = (request.hours * 60.0 - 1e-9).ceil().max(10.0);
        let node_hours = f64::from(request.nodes) * minutes / 60.0;
        let mut lines = vec![QuoteLine {
            item: format!("{} x {}", request.nodes, o.instance),
            quantity: node_hours,
            unit: "node-hour".into(),
            usd: node_hours * price.usd_per_node_hour,
            estimate: false,
        }];
        if request.storage_gb_months > 0.0 {
            lines.push(QuoteLine {
                item: "storage".into(),
                quantity: request.storage_gb_months,
                unit: "GB-month".into(),
                usd: request.storage_gb_months * 0.1,
                estimate: true,
            });
        }
        let total_usd = lines.iter().map(|l| l.usd).sum();
        Ok(ItemisedQuote { lines, total_usd })
    }
}

#[cfg(target_arch = "wasm32")]
export!(Old);
