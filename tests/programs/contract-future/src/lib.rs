//! Test program: a cost plugin built from a copy of the contracts whose package version
//! is 0.4.0 (see `wit/` beside this crate), newer than any this host binds. It must be refused at load, naming
//! both versions.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

wit_bindgen::generate!({ world: "cost-plugin", path: "wit" });

use exports::runner::plugin::cost_model::*;

struct Future;

impl Guest for Future {
    fn provider() -> ProviderInfo {
        ProviderInfo { name: "future".into(), display_name: "From the future".into() }
    }
    fn offerings() -> Vec<Offering> {
        Vec::new()
    }
    fn quote(_request: QuoteRequest) -> Result<ItemisedQuote, String> {
        Err("nothing to quote".into())
    }
}

#[cfg(target_arch = "wasm32")]
export!(Future);
