//! Host-side bindings generated from the contracts, one module per supported version:
//! `v3` from `wit/` (runner:plugin@0.3.0, what the rest of the runner speaks), `v2` from
//! the frozen `wit/0.2.0/` and `v1` from the frozen `wit/0.1.0/` (what plugins built with
//! SDK 0.2 and 0.1 export; `adapt` turns their answers into 0.3 values).
//!
//! Within a version, the `log` and `types` interfaces are generated once (in `workload`)
//! and shared by the other worlds, so the host implements each version's log import once.
//!
//! # What 0.2 shares with 0.3
//!
//! 0.3 changed only the workload interface; `types`, `log`, `cost-model` and
//! `precision-policy` are word for word those of 0.2 under another package version. The
//! component model compares value types structurally (records by field names and types,
//! enums by case names), never by package, so a 0.3 Rust type lifts and lowers a 0.2
//! component's value of the same shape. `v2` uses that to write no conversion for what did
//! not change:
//!
//! - `types` (imported, types only): `bindgen!`'s `with:` maps the 0.2 interface onto the
//!   0.3 module, so `v2::Dtype` *is* `v3::Dtype`. A types-only import needs no linker
//!   definition (wasmtime skips type exports when it checks an imported instance).
//! - `log` (imported, one function): `with:` would map the Rust types too, but the
//!   generated `add_to_linker` registers the import under the name of the module it maps
//!   to (`runner:plugin/log@0.3.0`), and a 0.2 plugin imports `log@0.2.0`; wasmtime's
//!   semver matching joins 0.2.x with 0.2.y, not 0.2 with 0.3. So each version keeps its
//!   generated log module, and `sandbox.rs` implements all three with one macro.
//! - `cost-model` and `precision-policy` (exported): `with:` cannot help, because
//!   `bindgen!` defines an exported interface's types in its own module whatever `with:`
//!   says (wasmtime 48: the export's functions name the local types). Instead
//!   [`exported_as_v3!`] binds a 0.2 component's export by its 0.2 name with the *0.3*
//!   generated types: the same pre-instantiation, typed functions and `call_*` methods
//!   `bindgen!` generates, so a 0.2 cost or precision plugin is called exactly like a 0.3
//!   one, and `wasmtime` type-checks every function against the 0.3 types when an instance
//!   is created. No value is converted.
//! - `workload` (exported, changed): generated from `wit/0.2.0/`, converted by
//!   `adapt::v2`.

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

/// Bind a world of an older contract whose exported interface `$export` is word for word
/// the current one, with the current generated types: `$pre` (looks the functions up when
/// a plugin is loaded) and `$world` (one instance, its functions type-checked against the
/// current types when it is created), with the `$getter()` and `call_*` methods
/// `bindgen!` would generate. See the module docs for why this is sound.
macro_rules! exported_as_v3 {
    (
        $world:ident, $pre:ident, $export:literal, $getter:ident {
            $($call:ident = $func:literal ($($arg:ident: $ty:ty),*) -> $ret:ty;)*
        }
    ) => {
        use wasmtime::component::{ComponentExportIndex, Func, InstancePre};
        use wasmtime::AsContextMut;

        pub struct $pre<T: 'static> {
            pre: InstancePre<T>,
            $($call: ComponentExportIndex,)*
        }

        // Not derived: a derive would ask `T: Clone` of the store data.
        impl<T: 'static> Clone for $pre<T> {
            fn clone(&self) -> Self {
                $pre { pre: self.pre.clone(), $($call: self.$call,)* }
            }
        }

        impl<T: 'static> $pre<T> {
            pub fn new(pre: InstancePre<T>) -> wasmtime::Result<Self> {
                let component = pre.component();
                let export = component
                    .get_export_index(None, $export)
                    .ok_or_else(|| wasmtime::format_err!("no exported instance named `{}`", $export))?;
                $(let $call = component.get_export_index(Some(&export), $func).ok_or_else(|| {
                    wasmtime::format_err!("instance export `{}` does not have export `{}`", $export, $func)
                })?;)*
                Ok($pre { pre, $($call),* })
            }

            pub fn instantiate(&self, mut store: impl AsContextMut<Data = T>) -> wasmtime::Result<$world> {
                let instance = self.pre.instantiate(&mut store)?;
                Ok($world {
                    $($call: *instance
                        .get_typed_func::<($($ty,)*), ($ret,)>(&mut store, &self.$call)?
                        .func(),)*
                })
            }
        }

        pub struct $world {
            $($call: Func,)*
        }

        impl $world {
            /// The exported interface (this world exports only it).
            pub fn $getter(&self) -> &$world {
                self
            }

            $(pub fn $call<S: AsContextMut>(&self, mut store: S, $($arg: $ty),*) -> wasmtime::Result<$ret> {
                let func = self.$call.typed::<($($ty,)*), ($ret,)>(&store)?;
                let (ret,) = func.call(store.as_context_mut(), ($($arg,)*))?;
                Ok(ret)
            })*
        }
    };
}

pub mod v3 {
    contract!("../../wit");
}

pub mod v2 {
    pub mod workload {
        wasmtime::component::bindgen!({
            world: "workload-plugin",
            path: "../../wit/0.2.0",
            with: {
                "runner:plugin/types": crate::bindings::v3::workload::runner::plugin::types,
            },
        });
    }

    pub mod precision {
        use crate::bindings::v3::precision::exports::runner::plugin::precision_policy::*;
        exported_as_v3!(PrecisionPlugin, PrecisionPluginPre, "runner:plugin/precision-policy@0.2.0",
            runner_plugin_precision_policy {
                call_name = "name"() -> String;
                call_plan = "plan"(request: &PlanRequest) -> Result<PlanResponse, String>;
                call_on_step = "on-step"(metrics: &StepMetrics) -> Result<StepResponse, String>;
            }
        );
    }

    pub mod cost {
        use crate::bindings::v3::cost::exports::runner::plugin::cost_model::*;
        exported_as_v3!(CostPlugin, CostPluginPre, "runner:plugin/cost-model@0.2.0",
            runner_plugin_cost_model {
                call_provider = "provider"() -> ProviderInfo;
                call_offerings = "offerings"() -> Vec<Offering>;
                call_quote = "quote"(request: &QuoteRequest) -> Result<ItemisedQuote, String>;
            }
        );
    }

    pub use workload::runner::plugin::log::Level as LogLevel;
}

pub mod v1 {
    contract!("../../wit/0.1.0");
}
