//! Generated bindings, one module per world, each behind its feature. Plugin authors use
//! the re-exports in `workload`, `precision` and `cost` instead of these paths.

#[cfg(feature = "workload")]
pub mod workload {
    wit_bindgen::generate!({
        world: "workload-plugin",
        path: "../../wit",
        default_bindings_module: "runner_plugin_sdk::bindings::workload",
        pub_export_macro: true,
        export_macro_name: "export_workload",
    });
}

#[cfg(feature = "precision")]
pub mod precision {
    wit_bindgen::generate!({
        world: "precision-plugin",
        path: "../../wit",
        default_bindings_module: "runner_plugin_sdk::bindings::precision",
        pub_export_macro: true,
        export_macro_name: "export_precision",
    });
}

#[cfg(feature = "cost")]
pub mod cost {
    wit_bindgen::generate!({
        world: "cost-plugin",
        path: "../../wit",
        default_bindings_module: "runner_plugin_sdk::bindings::cost",
        pub_export_macro: true,
        export_macro_name: "export_cost",
    });
}
