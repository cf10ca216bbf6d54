//! Test program: a cost plugin whose `offerings` answers one nonsense price list per call,
//! in this order: a zero scale-up domain, a scale-up domain of 7 over nodes of 8, a
//! billing increment of 0 s, one region priced twice for one option, an upfront payment on
//! an on-demand price, an effective date of 2026-13-45, three thousand more offerings than
//! the host accepts; then a sound list from the eighth call on.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

use std::sync::atomic::{AtomicU32, Ordering};

use runner_plugin_sdk::cost::*;

struct Nonsense;

static CALLS: AtomicU32 = AtomicU32::new(0);

fn offering(name: &str) -> Offering {
    let prices = vec![Price::hourly("r", PurchaseOption::OnDemand, 10.0)];
    Offering { interconnect_gbps: 3200.0, ..Offering::nodes(name, "H100", 8, prices) }
}

impl Guest for Nonsense {
    fn provider() -> Provider {
        Provider { name: "nonsense".into(), display_name: "Nonsense prices".into() }
    }

    fn offerings() -> Vec<Offering> {
        let mut o = offering("n1");
        match CALLS.fetch_add(1, Ordering::Relaxed) {
            0 => o.scale_up_domain = 0,
            1 => o.scale_up_domain = 7,
            2 => o.prices[0].billing_increment_s = 0,
            3 => o.prices.push(Price::hourly("r", PurchaseOption::OnDemand, 11.0)),
            4 => o.prices[0].upfront_usd_per_node = 1000.0,
            5 => o.prices[0].effective_date = "2026-13-45".into(),
            6 => return (0..7000).map(|i| offering(&format!("n{i}"))).collect(),
            _ => {}
        }
        vec![o]
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        standard_quote(&Self::offerings(), &request)
    }
}

runner_plugin_sdk::export_cost!(Nonsense);
