//! Test program: a cost plugin built against the released contract 0.2.0 (no SDK): one
//! H100 node type sold in pairs, with on-demand and one-year partial-upfront prices billed
//! per minute with a ten-minute minimum, and a quote with compute, upfront and storage
//! lines. 0.3 kept the cost contract word for word: the host binds this plugin by its 0.2
//! export name and calls it with its 0.3 types, converting nothing.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

wit_bindgen::generate!({ world: "cost-plugin", path: "../../wit-0.2.0" });

use exports::runner::plugin::cost_model::*;

struct Old;

fn offering() -> Offering {
    let price = |option, usd_per_node_hour, upfront_usd_per_node, caveats| Price {
        region: "old-1".into(),
        option,
        usd_per_node_hour,
        upfront_usd_per_node,
        billing_increment_s: 60,
        minimum_charge_s: 600,
        effective_date: "2026-06-01".into(),
        source: "contract 0.2.0 test program".into(),
        caveats,
    };
    Offering {
        instance: "old.h100x8".into(),
        gpu: "H100".into(),
        gpus_per_node: 8,
        scale_up_domain: 8,
        node_multiple: 2,
        interconnect_gbps: 3200.0,
        prices: vec![
            price(PurchaseOption::OnDemand, 20.0, 0.0, Vec::new()),
            price(PurchaseOption::OneYearPartialUpfront, 10.0, 40_000.0, vec![PriceCaveat::LowerBound]),
        ],
    }
}

impl Guest for Old {
    fn provider() -> ProviderInfo {
        ProviderInfo { name: "oldcloud2".into(), display_name: "A cloud priced by a 0.2.0 plugin".into() }
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
            category: LineCategory::Compute,
            quantity: node_hours,
            unit: "node-hour".into(),
            amount: node_hours * price.usd_per_node_hour,
            estimate: false,
            caveats: price.caveats.clone(),
        }];
        if price.upfront_usd_per_node > 0.0 {
            lines.push(QuoteLine {
                item: "upfront".into(),
                category: LineCategory::Upfront,
                quantity: f64::from(request.nodes),
                unit: "node".into(),
                amount: f64::from(request.nodes) * price.upfront_usd_per_node,
                estimate: false,
                caveats: Vec::new(),
            });
        }
        if request.storage_gb_months > 0.0 {
            lines.push(QuoteLine {
                item: "storage".into(),
                category: LineCategory::Storage,
                quantity: request.storage_gb_months,
                unit: "GB-month".into(),
                amount: request.storage_gb_months * 0.1,
                estimate: true,
                caveats: Vec::new(),
            });
        }
        let total = lines.iter().map(|l| l.amount).sum();
        Ok(ItemisedQuote { currency: "USD".into(), lines, total, warnings: vec!["a 0.2.0 warning".into()] })
    }
}

#[cfg(target_arch = "wasm32")]
export!(Old);
