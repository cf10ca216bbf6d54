//! Test program: a precision policy whose name is drawn at random, from both WASI random
//! generators (secure and insecure), the insecure seed, and the iteration order of a std
//! `HashMap` (whose keys std seeds from WASI random). The host seeds every generator, so two
//! instances must name themselves alike. `plan` of a model named "draw N" draws N random
//! bytes in one call, for the host's cap on a draw.

#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code, reason = "only the wasm build exports the plugin"))]

use std::fmt::Write as _;

use runner_plugin_sdk::precision::*;

struct Draws;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

impl Guest for Draws {
    fn name() -> String {
        #[cfg(target_arch = "wasm32")]
        let (secure, insecure, seed) = (
            wasip2::random::random::get_random_bytes(16),
            wasip2::random::insecure::get_insecure_random_bytes(16),
            wasip2::random::insecure_seed::insecure_seed(),
        );
        #[cfg(not(target_arch = "wasm32"))]
        let (secure, insecure, seed) = (vec![0u8; 16], vec![0u8; 16], (0u64, 0u64));
        let map: std::collections::HashMap<u32, ()> = (0..16).map(|i| (i, ())).collect();
        let order: Vec<String> = map.keys().map(|k| k.to_string()).collect();
        format!(
            "secure {} insecure {} seed {:x}{:x} map {}",
            hex(&secure),
            hex(&insecure),
            seed.0,
            seed.1,
            order.join(",")
        )
    }

    fn plan(request: PlanRequest) -> Result<PlanResponse, String> {
        // A model named "draw N" draws N secure random bytes first (past the host's cap of
        // a draw, the call must trap, not allocate).
        if let Some(n) = request.model.strip_prefix("draw ").and_then(|n| n.parse::<u64>().ok()) {
            #[cfg(target_arch = "wasm32")]
            let got = wasip2::random::random::get_random_bytes(n).len() as u64;
            #[cfg(not(target_arch = "wasm32"))]
            let got = n;
            if got != n {
                return Err(format!("asked for {n} random bytes, got {got}"));
            }
        }
        Ok(PlanResponse { sites: request.sites.iter().map(|_| unscaled(Dtype::Bf16)).collect(), state: request.state })
    }

    fn on_step(metrics: StepMetrics) -> Result<StepResponse, String> {
        Ok(StepResponse { actions: Vec::new(), state: metrics.state })
    }
}

runner_plugin_sdk::export_precision!(Draws);
