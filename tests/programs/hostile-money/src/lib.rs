//! Test program: a cost plugin whose money is hostile. Quotes, by instance: `nan` (a NaN
//! total), `inf` (an infinite line), `zero` (a $0 quote with no lines), `negative` (a
//! negative compute line), `below-list` (half its own list price), `lowercase` (currency
//! "usd"), `euro` (a well-formed quote in EUR). `euro-b200`, its only B200 offering, quotes
//! in EUR too: a cloud that quotes B200 only in EUR. `offerings` lists them all with honest
//! prices on its first call, then a $0 price, a negative price, and a NaN price on the
//! next three calls. `hidden`, which it never lists, it quotes at 1e-300 USD; `below-list`
//! it quotes at half its list price in any region, the one it lists (`r`) or another.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

use std::sync::atomic::{AtomicU32, Ordering};

use runner_plugin_sdk::cost::*;

struct Hostile;

static OFFERING_CALLS: AtomicU32 = AtomicU32::new(0);

const CASES: [&str; 7] = ["nan", "inf", "zero", "negative", "below-list", "lowercase", "euro"];

fn offering(name: &str, usd: f64) -> Offering {
    Offering::nodes(name, "H100", 8, vec![Price::hourly("r", PurchaseOption::OnDemand, usd)])
}

fn line(amount: f64) -> QuoteLine {
    QuoteLine {
        item: "compute".into(),
        category: LineCategory::Compute,
        quantity: 1.0,
        unit: "node-hour".into(),
        amount,
        estimate: false,
        caveats: Vec::new(),
    }
}

fn quote(currency: &str, lines: Vec<QuoteLine>, total: f64) -> Quote {
    Quote { currency: currency.into(), lines, total, warnings: Vec::new() }
}

impl Guest for Hostile {
    fn provider() -> Provider {
        Provider { name: "hostile-money".into(), display_name: "Hostile money".into() }
    }

    fn offerings() -> Vec<Offering> {
        let price = match OFFERING_CALLS.fetch_add(1, Ordering::Relaxed) {
            0 => 10.0,
            1 => 0.0,
            2 => -1.0,
            3 => f64::NAN,
            _ => 10.0,
        };
        let mut all: Vec<Offering> = CASES.into_iter().map(|c| offering(c, price)).collect();
        all.push(Offering { gpu: "B200".into(), ..offering("euro-b200", price) });
        all
    }

    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        let list = f64::from(request.nodes) * request.hours * 10.0;
        Ok(match request.instance.as_str() {
            "nan" => quote("USD", vec![line(list)], f64::NAN),
            "inf" => quote("USD", vec![line(f64::INFINITY)], f64::INFINITY),
            "zero" => quote("USD", Vec::new(), 0.0),
            "negative" => quote("USD", vec![line(-5.0)], -5.0),
            "below-list" => quote("USD", vec![line(list / 2.0)], list / 2.0),
            "lowercase" => quote("usd", vec![line(list)], list),
            "euro" | "euro-b200" => quote("EUR", vec![line(list)], list),
            "hidden" => quote("USD", vec![line(1e-300)], 1e-300),
            other => return Err(format!("unknown instance '{other}'")),
        })
    }
}

runner_plugin_sdk::export_cost!(Hostile);
