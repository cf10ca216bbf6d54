//! Test program: a valid cost plugin, except that `quote` misbehaves when the requested
//! instance names a behaviour: `trap` panics, `spin` loops forever, `hog` allocates
//! without end, `nan` returns a non-finite total, `wrong-total` returns lines that do
//! not add up. Any other instance is quoted normally. The host must survive every one.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

use runner_plugin_sdk::cost::*;

struct Misbehave;

fn offering(name: &str) -> Offering {
    Offering {
        instance: name.into(),
        gpu: "H100".into(),
        gpus_per_node: 8,
        scale_up_domain: 8,
        interconnect_gbps: 3200.0,
        prices: vec![Price { region: "test-1".into(), option: PurchaseOption::OnDemand, usd_per_node_hour: 10.0 }],
        billing_increment_s: 1,
        minimum_charge_s: 0,
        effective_date: "2026-01-01".into(),
        source: "test".into(),
    }
}

impl Guest for Misbehave {
    fn provider() -> Provider {
        Provider { name: "misbehave".into(), display_name: "Misbehaving test cloud".into() }
    }

    fn offerings() -> Vec<Offering> {
        ["good", "trap", "spin", "hog", "nan", "wrong-total"].into_iter().map(offering).collect()
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        match request.instance.as_str() {
            "trap" => panic!("guest panicked on purpose"),
            "spin" => {
                let mut x: u64 = 1;
                loop {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
            "hog" => {
                let mut blocks: Vec<Vec<u8>> = Vec::new();
                loop {
                    blocks.push(vec![1u8; 16 << 20]);
                    std::hint::black_box(&blocks);
                }
            }
            "nan" => Ok(Quote { lines: vec![], total_usd: f64::NAN }),
            "wrong-total" => Ok(Quote {
                lines: vec![QuoteLine { item: "x".into(), quantity: 1.0, unit: "node-hour".into(), usd: 5.0, estimate: false }],
                total_usd: 50.0,
            }),
            _ => standard_quote(&Self::offerings(), &request),
        }
    }
}

runner_plugin_sdk::export_cost!(Misbehave);
