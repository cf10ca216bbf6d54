//! Test program: a cost plugin that reads its prices from a file. Reading a file makes
//! the component import `wasi:filesystem`, which the sandbox does not grant: the host
//! must refuse the plugin at load time, naming the import.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

use runner_plugin_sdk::cost::*;

struct ReadsFiles;

impl Guest for ReadsFiles {
    fn provider() -> Provider {
        let name = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        Provider { name, display_name: "reads files".into() }
    }
    fn offerings() -> Vec<Offering> {
        Vec::new()
    }
    fn quote(request: QuoteRequest) -> Result<Quote, String> {
        standard_quote(&Self::offerings(), &request)
    }
}

runner_plugin_sdk::export_cost!(ReadsFiles);
