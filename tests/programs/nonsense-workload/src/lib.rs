//! Test program: a workload plugin whose `describe` answers one nonsense model per call, in
//! this order: a tp of 3 on 8 GPUs, expert parallelism on a dense model, 32 heads over 5
//! kv-heads, four billion layers, a top-k above the expert count, virtual pipeline stages
//! without a pipeline, a NaN token count; then a sound model from the eighth call on. The
//! host must refuse each call's answer, naming the rule, however the earlier ones went.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

use std::sync::atomic::{AtomicU32, Ordering};

use runner_plugin_sdk::workload::builder::{decoder, defaults, graph_for, moe, variant, Layout};
use runner_plugin_sdk::workload::*;

struct Nonsense;

static CALLS: AtomicU32 = AtomicU32::new(0);

impl Guest for Nonsense {
    fn describe() -> ModelInfo {
        let mut hyper = decoder(4, 64, 128, 4, 4, 256);
        let mut d = defaults(64, 1e9, 1e-3);
        let mut layout = Layout::new("H100", 8, 64, "BF16").source("test");
        match CALLS.fetch_add(1, Ordering::Relaxed) {
            0 => layout = layout.tp(3),
            1 => layout = layout.ep(4),
            2 => (hyper.heads, hyper.kv_heads) = (32, 5),
            3 => hyper.layers = 4_000_000_000,
            4 => hyper.moe = Some(moe(8, 9, 64)),
            5 => layout = layout.vp(2),
            6 => d.tokens = f64::NAN,
            _ => {}
        }
        ModelInfo { family: "nonsense".into(), variants: vec![variant("nonsense-1", "nonsense", "test", hyper, d, [layout])] }
    }

    fn graph(request: GraphRequest) -> Result<Graph, String> {
        graph_for(&Self::describe(), &request)
    }
}

runner_plugin_sdk::export_workload!(Nonsense);
