//! Test program: a cost plugin whose text is hostile. `provider` answers a display name
//! with a terminal title sequence from its second call on; `offerings` lists an instance
//! whose name forges a new output line from its second call on; `quote` for `escape`
//! refuses with colour codes and a forged line, for `megabytes` with 5 MB of text, for
//! `log` writes 5,000 escaped log lines first, and for `stderr` prints escapes to stderr
//! and panics. Nothing of it may reach a terminal raw or unbounded.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

use std::sync::atomic::{AtomicU32, Ordering};

use runner_plugin_sdk::cost::*;

struct Hostile;

static PROVIDER_CALLS: AtomicU32 = AtomicU32::new(0);
static OFFERING_CALLS: AtomicU32 = AtomicU32::new(0);

fn offering(name: &str) -> Offering {
    Offering::nodes(name, "H100", 8, vec![Price::hourly("r", PurchaseOption::OnDemand, 10.0)])
}

impl Guest for Hostile {
    fn provider() -> Provider {
        let display_name = if PROVIDER_CALLS.fetch_add(1, Ordering::Relaxed) == 0 {
            "Hostile strings".into()
        } else {
            "\u{1b}]0;pwned\u{7}Hostile".into()
        };
        Provider { name: "hostile-strings".into(), display_name }
    }

    fn offerings() -> Vec<Offering> {
        let mut list: Vec<Offering> = ["good", "escape", "megabytes", "log", "stderr"].into_iter().map(offering).collect();
        if OFFERING_CALLS.fetch_add(1, Ordering::Relaxed) > 0 {
            list.push(offering("x\nGPUs  days  forged row"));
        }
        list
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        match request.instance.as_str() {
            "escape" => Err("\u{1b}[31mred alert\u{1b}[0m\nnote: forged line".into()),
            "megabytes" => Err("x".repeat(5 << 20)),
            "log" => {
                for i in 0..5000 {
                    runner_plugin_sdk::log::warn(&format!("line {i}\u{1b}[2K\rforged"));
                }
                standard_quote(&Self::offerings(), &request)
            }
            "stderr" => {
                eprintln!("\u{1b}[2J\u{1b}[Hcleared your screen");
                panic!("\u{1b}[31mpanic with colour\u{1b}[0m");
            }
            _ => standard_quote(&Self::offerings(), &request),
        }
    }
}

runner_plugin_sdk::export_cost!(Hostile);
