//! Test program: a valid cost plugin, except that `quote` misbehaves when the requested
//! instance names a behaviour: `trap` panics, `spin` loops forever, `hog` allocates
//! without end, `nan` returns a non-finite total, `wrong-total` returns lines that do
//! not add up, `leak` leaks 8 MiB per call, `chatty` prints a 230-byte line per
//! call (the host's capture of stdout fills after some hundreds), `later` quotes honestly three times and then
//! answers $0, `refuse` refuses every quote (sold out), `slow` (the cheapest, at $5 a
//! node-hour) computes for about 150 ms and then quotes honestly: a run priced on this cloud spends
//! that on every row. `exotic` is on a GPU no profile describes (H1000). Any other instance is quoted
//! normally. The host must survive every one.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

use std::sync::atomic::{AtomicU32, Ordering};

use runner_plugin_sdk::cost::*;

struct Misbehave;

static LATER_CALLS: AtomicU32 = AtomicU32::new(0);

fn offering(name: &str) -> Offering {
    let price = Price {
        effective_date: "2026-01-01".into(),
        source: "test".into(),
        ..Price::hourly("test-1", PurchaseOption::OnDemand, 10.0)
    };
    Offering { interconnect_gbps: 3200.0, ..Offering::nodes(name, "H100", 8, vec![price]) }
}

impl Guest for Misbehave {
    fn provider() -> Provider {
        Provider { name: "misbehave".into(), display_name: "Misbehaving test cloud".into() }
    }

    fn offerings() -> Vec<Offering> {
        let mut all: Vec<Offering> =
            ["good", "trap", "spin", "hog", "nan", "wrong-total", "leak", "chatty", "later", "refuse"].into_iter().map(offering).collect();
        all.push(Offering { gpu: "H1000".into(), ..offering("exotic") });
        let mut slow = offering("slow");
        slow.prices[0].usd_per_node_hour = 5.0;
        all.push(slow);
        all
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
            "slow" => {
                // Busy work, not a sleep: the sandbox grants no clock, so a plugin
                // that sleeps is refused at load. About 0.1-0.3 s of compute.
                let mut x = 1u64;
                for i in 0..150_000_000u64 {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
                }
                std::hint::black_box(x);
                standard_quote(&Self::offerings(), &request)
            }
            "refuse" => Err("sold out in test-1 until 2027-01-01".into()),
            "nan" => Ok(Quote { currency: "USD".into(), lines: vec![], total: f64::NAN, warnings: vec![] }),
            "wrong-total" => Ok(Quote {
                currency: "USD".into(),
                lines: vec![QuoteLine {
                    item: "x".into(),
                    category: LineCategory::Compute,
                    quantity: 1.0,
                    unit: "node-hour".into(),
                    amount: 5.0,
                    estimate: false,
                    caveats: vec![],
                }],
                total: 50.0,
                warnings: vec![],
            }),
            "leak" => {
                std::mem::forget(std::hint::black_box(vec![1u8; 8 << 20]));
                standard_quote(&Self::offerings(), &request)
            }
            "chatty" => {
                println!("quoting {} in {}: {}", request.instance, request.region, "-".repeat(200));
                standard_quote(&Self::offerings(), &request)
            }
            "later" if LATER_CALLS.fetch_add(1, Ordering::Relaxed) >= 3 => {
                Ok(Quote { currency: "USD".into(), lines: vec![], total: 0.0, warnings: vec![] })
            }
            _ => standard_quote(&Self::offerings(), &request),
        }
    }
}

runner_plugin_sdk::export_cost!(Misbehave);
