//! Host-side bindings generated from `wit/`, one module per world. The `log` and `types`
//! interfaces are generated once (in `workload`) and shared by the other worlds, so the
//! host implements the log import once.

#![allow(missing_docs, reason = "generated code")]

pub mod workload {
    wasmtime::component::bindgen!({
        world: "workload-plugin",
        path: "../../wit",
        additional_derives: [serde::Serialize],
    });
}

pub mod precision {
    wasmtime::component::bindgen!({
        world: "precision-plugin",
        path: "../../wit",
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
        path: "../../wit",
        additional_derives: [serde::Serialize],
        with: {
            "runner:plugin/log": super::workload::runner::plugin::log,
        },
    });
}

pub use workload::runner::plugin::log::Level as LogLevel;
pub use workload::runner::plugin::types::Dtype;
