//! Host-side bindings generated from the contracts, one module per supported version and
//! world: `v2` from `wit/` (runner:plugin@0.2.0, what the rest of the runner speaks) and
//! `v1` from the frozen `wit/0.1.0/` (what plugins built with SDK 0.1 export; `adapt.rs`
//! turns their answers into 0.2 values). Within a version, the `log` and `types`
//! interfaces are generated once (in `workload`) and shared by the other worlds, so the
//! host implements each version's log import once.

#![allow(missing_docs, reason = "generated code")]

/// The three worlds of one contract version, from the WIT package at `$path`.
macro_rules! contract {
    ($path:literal) => {
        pub mod workload {
            wasmtime::component::bindgen!({
                world: "workload-plugin",
                path: $path,
                additional_derives: [serde::Serialize],
            });
        }

        pub mod precision {
            wasmtime::component::bindgen!({
                world: "precision-plugin",
                path: $path,
                additional_derives: [serde::Serialize],
                with: {
                    "runner:plugin/log": super::workload::runner::plugin::log,
                    "runner:plugin/types": super::workload::runner::plugin::types,
                },
            });
        }

        pub mod cost {
            wasmtime::component::bindgen!({
                world: "cost-plugin",
                path: $path,
                additional_derives: [serde::Serialize],
                with: {
                    "runner:plugin/log": super::workload::runner::plugin::log,
                },
            });
        }

        pub use workload::runner::plugin::log::Level as LogLevel;
        pub use workload::runner::plugin::types::Dtype;
    };
}

pub mod v2 {
    contract!("../../wit");
}

pub mod v1 {
    contract!("../../wit/0.1.0");
}
