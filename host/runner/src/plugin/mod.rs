//! The plugin host: find a plugin, check its contract, compile it (through the on-disk
//! cache), and run it in a sandbox behind a typed, validating wrapper.
//!
//! ```text
//! spec ("llama3.wasm") --resolve--> bytes --compile (cache)--> Component
//!      --contract check (exports, version, imports)--> Plugin --instantiate--> Workload | Precision | Cost
//! ```
//!
//! Every value a plugin returns is validated before the rest of the runner sees it; see
//! the `validate` functions in each wrapper module.

mod bindings;
pub mod cost;
mod engine;
mod error;
pub mod precision;
mod resolve;
mod sandbox;
pub mod workload;

use serde::Serialize;
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

pub use engine::{CacheOutcome, cache_dir, sha256_hex};
pub use error::{Failure, PluginError};
pub use resolve::{Source, embedded, installed_files, plugin_dirs, test_programs, user_data_dir};
pub use sandbox::Limits;

/// The contract version this host speaks (the WIT package version in `wit/worlds.wit`).
pub const CONTRACT_VERSION: &str = "0.1.0";
const PACKAGE: &str = "runner:plugin";

/// The three plugin kinds, one per WIT world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Workload,
    Precision,
    Cost,
}

impl Kind {
    fn interface(self) -> &'static str {
        match self {
            Kind::Workload => "workload",
            Kind::Precision => "precision-policy",
            Kind::Cost => "cost-model",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Workload => "workload",
            Kind::Precision => "precision",
            Kind::Cost => "cost",
        }
    }
}

/// What `plugins list` shows about a plugin.
#[derive(Clone, Debug, Serialize)]
pub struct PluginInfo {
    pub name: String,
    pub kind: Kind,
    pub contract: String,
    pub source: Source,
    pub sha256: String,
    pub bytes: usize,
}

/// A compiled plugin whose contract has been checked, ready to instantiate.
pub struct Plugin {
    pub info: PluginInfo,
    component: Component,
}

/// Imports a plugin may have: the host's log, and what Rust's std pulls in on
/// wasm32-wasip2 (streams, the empty environment, exit, captured stdio, seeded random).
/// No filesystem, sockets, clocks or HTTP.
const ALLOWED_IMPORTS: &[&str] = &[
    "runner:plugin/log",
    "runner:plugin/types",
    "wasi:io/",
    "wasi:cli/",
    "wasi:random/",
];

/// Resolve, compile and contract-check a plugin.
pub fn load(spec: &str) -> Result<Plugin, PluginError> {
    let (name, source, bytes) =
        resolve::resolve(spec).map_err(|m| PluginError::new(spec, "load", Failure::Load(m)))?;
    load_bytes(&name, source, &bytes)
}

/// Compile and contract-check plugin bytes obtained elsewhere.
pub fn load_bytes(name: &str, source: Source, bytes: &[u8]) -> Result<Plugin, PluginError> {
    let sha256 = sha256_hex(bytes);
    let (component, _) = engine::compile(bytes, &sha256).map_err(|m| {
        PluginError::new(
            name,
            "load",
            Failure::Load(format!("not a valid WebAssembly component: {m}")),
        )
    })?;
    let (kind, contract) = check_contract(name, &component)?;
    Ok(Plugin {
        info: PluginInfo {
            name: name.to_string(),
            kind,
            contract,
            source,
            sha256,
            bytes: bytes.len(),
        },
        component,
    })
}

/// Which world the component exports, at which contract version; and that it imports
/// nothing the sandbox does not grant.
fn check_contract(name: &str, component: &Component) -> Result<(Kind, String), PluginError> {
    let engine = engine::engine();
    let ty = component.component_type();
    let err = |m: String| PluginError::new(name, "load", Failure::Contract(m));
    let mut found = Vec::new();
    for (export, item) in ty.exports(engine) {
        if !matches!(item.ty, ComponentItem::ComponentInstance(_)) {
            continue;
        }
        let Some(rest) = export
            .strip_prefix(PACKAGE)
            .and_then(|r| r.strip_prefix('/'))
        else {
            continue;
        };
        let (iface, version) = rest.split_once('@').unwrap_or((rest, "unversioned"));
        for kind in [Kind::Workload, Kind::Precision, Kind::Cost] {
            if kind.interface() == iface {
                found.push((kind, version.to_string()));
            }
        }
    }
    let (kind, version) = match found.as_slice() {
        [one] => one.clone(),
        [] => {
            let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
            return Err(err(format!(
                "it exports none of {PACKAGE}/workload, /precision-policy or /cost-model (it exports: {}); \
                 build it with runner-plugin-sdk and one of its features",
                if exports.is_empty() {
                    "nothing".into()
                } else {
                    exports.join(", ")
                }
            )));
        }
        _ => {
            return Err(err(
                "it exports more than one plugin world; a plugin must be exactly one kind".into(),
            ));
        }
    };
    if !compatible(&version, CONTRACT_VERSION) {
        return Err(err(format!(
            "it was built against contract {PACKAGE}@{version}, but this runner speaks {PACKAGE}@{CONTRACT_VERSION}; \
             rebuild the plugin with runner-plugin-sdk {CONTRACT_VERSION}, or use a runner that speaks {version}"
        )));
    }
    let refused: Vec<String> = ty
        .imports(engine)
        .map(|(import, _)| import.to_string())
        .filter(|import| !ALLOWED_IMPORTS.iter().any(|a| import.starts_with(a)))
        .collect();
    if !refused.is_empty() {
        return Err(err(format!(
            "it imports {}, which the sandbox does not grant (plugins get no files, sockets, clocks or \
             environment); remove the code that needs them",
            refused
                .iter()
                .map(|i| format!("`{i}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok((kind, version))
}

/// Semver compatibility in Cargo's sense: same major, and same minor while major is 0.
fn compatible(have: &str, want: &str) -> bool {
    let parse = |v: &str| -> Option<(u64, u64)> {
        let mut it = v.split('.');
        Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
    };
    match (parse(have), parse(want)) {
        (Some((0, a)), Some((0, b))) => a == b,
        (Some((a, _)), Some((b, _))) => a == b,
        _ => false,
    }
}

impl Plugin {
    fn expect_kind(&self, kind: Kind) -> Result<(), PluginError> {
        if self.info.kind == kind {
            Ok(())
        } else {
            Err(PluginError::new(
                &self.info.name,
                "load",
                Failure::Contract(format!(
                    "it is a {} plugin, but a {} plugin is needed here",
                    self.info.kind.name(),
                    kind.name()
                )),
            ))
        }
    }
}

/// Everything installed: plugins in the plugin directories (in search order), then the
/// embedded ones; `shadowed` is true where an earlier plugin of the same name wins.
pub fn list() -> Vec<(Result<PluginInfo, PluginError>, bool)> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for path in installed_files() {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let shadowed = !seen.insert(name.clone());
        let info = std::fs::read(&path)
            .map_err(|e| {
                PluginError::new(
                    &name,
                    "load",
                    Failure::Load(format!("cannot read {}: {e}", path.display())),
                )
            })
            .and_then(|bytes| load_bytes(&name, Source::Path(path.clone()), &bytes))
            .map(|p| p.info);
        out.push((info, shadowed));
    }
    for (name, _, bytes) in embedded() {
        let shadowed = !seen.insert(name.to_string());
        out.push((
            load_bytes(name, Source::Embedded, bytes).map(|p| p.info),
            shadowed,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::compatible;

    #[test]
    fn contract_versions_follow_cargo_semver() {
        assert!(compatible("0.1.0", "0.1.0"));
        assert!(compatible("0.1.3", "0.1.0"));
        assert!(!compatible("0.2.0", "0.1.0"));
        assert!(compatible("1.4.0", "1.0.0"));
        assert!(!compatible("2.0.0", "1.0.0"));
        assert!(!compatible("garbage", "0.1.0"));
    }
}
