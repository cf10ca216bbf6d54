//! The plugin host: find a plugin, check its contract, compile it (through the verified
//! on-disk cache), and run it in a sandbox behind a typed, validating wrapper.
//!
//! ```text
//! spec ("llama3.wasm") --resolve--> bytes --compile (cache.rs, HMAC-verified)--> Component
//!      --contract check (world, version, imports)--> pre-instantiation (once)--> Plugin
//!      --instantiate--> Workload | PrecisionPolicy | CostModel
//! ```
//!
//! Every supported contract version is bound separately (`bindings.rs`): a plugin built
//! against 0.3.0 is called directly, one built against 0.2.0 or 0.1.0 through `adapt`,
//! which gives the rest of the runner 0.3 values with defaults for what an older contract
//! cannot say (0.1 -> 0.2 -> 0.3, one step at a time). Every
//! value a plugin returns is validated (the rules of `runner_contract`) before the rest of
//! the runner sees it, and every string it returns is printable or refused.

/// Match `$instance`, running `$body` with `$s` bound to the sandbox in each of the
/// `Instance::$alike` variants (worlds called alike: the 0.3 bindings, and the 0.2 ones
/// bound with 0.3 types), then the remaining `$arm`s.
macro_rules! alike {
    ($instance:expr, [$($alike:ident),+] |$s:ident| $body:expr, $($arm:tt)*) => {
        match $instance {
            $(Instance::$alike($s) => $body,)+
            $($arm)*
        }
    };
}

mod adapt;
mod bindings;
pub mod cache;
pub mod cost;
mod engine;
mod error;
pub mod precision;
mod resolve;
mod sandbox;
pub mod workload;

#[cfg(test)]
mod properties;

use serde::Serialize;
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

use bindings::{v1, v2, v3};
pub use cache::CacheOutcome;
pub use engine::{compile_with, sha256_hex};
pub use error::{Failure, PluginError};
pub use resolve::{Source, embedded, installed_files, locate, plugin_dirs, resolve, test_programs, user_data_dir};
pub use sandbox::{HostState, Limits, MemoryCapExceeded};

/// The contract version this host speaks natively (the WIT package version in `wit/`).
pub const CONTRACT_VERSION: &str = "0.3.0";
/// Every contract version this host binds: the current one, and 0.1.0 and 0.2.0 through
/// the adapter.
pub const CONTRACT_VERSIONS: [&str; 3] = ["0.1.0", "0.2.0", "0.3.0"];
const PACKAGE: &str = "runner:plugin";

/// The compiled-component cache directory in use (see [`cache::default_dir`]).
pub fn cache_dir() -> Option<std::path::PathBuf> {
    cache::default_dir()
}

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

/// What `plugins list` shows about a plugin, and what every output records about each
/// plugin a run used.
#[derive(Clone, Debug, Serialize)]
pub struct PluginInfo {
    pub name: String,
    pub kind: Kind,
    /// The contract version it was built against (an older one runs through the adapter).
    pub contract: String,
    pub source: Source,
    pub sha256: String,
    pub bytes: usize,
    /// A plugin file found in the working directory or a plugin directory that carries
    /// the name of an embedded plugin, and so is used instead of it.
    pub shadows_embedded: bool,
}

impl PluginInfo {
    /// Where it was read from, if it shadows an embedded plugin of its name (for its errors).
    pub fn shadowing(&self) -> Option<String> {
        self.shadows_embedded.then(|| self.source.to_string())
    }

    /// One line for the notes of an output: name, kind, contract, where from, sha256.
    pub fn provenance(&self) -> String {
        format!(
            "{} plugin {} (contract {}{}): {}{}, sha256 {}",
            self.kind.name(),
            self.name,
            self.contract,
            if self.contract == CONTRACT_VERSION {
                ""
            } else {
                ", adapted"
            },
            self.source,
            if self.shadows_embedded {
                ", shadowing the embedded plugin of that name"
            } else {
                ""
            },
            self.sha256
        )
    }
}

/// The pre-instantiation of a plugin: its component linked against the host's imports,
/// built once at load, instantiated per sandboxed instance.
#[derive(Clone)]
enum Pre {
    WorkloadV3(v3::workload::WorkloadPluginPre<HostState>),
    WorkloadV2(v2::workload::WorkloadPluginPre<HostState>),
    WorkloadV1(v1::workload::WorkloadPluginPre<HostState>),
    PrecisionV3(v3::precision::PrecisionPluginPre<HostState>),
    PrecisionV2(v2::precision::PrecisionPluginPre<HostState>),
    PrecisionV1(v1::precision::PrecisionPluginPre<HostState>),
    CostV3(v3::cost::CostPluginPre<HostState>),
    CostV2(v2::cost::CostPluginPre<HostState>),
    CostV1(v1::cost::CostPluginPre<HostState>),
}

/// A compiled plugin whose contract has been checked, ready to instantiate.
pub struct Plugin {
    pub info: PluginInfo,
    pre: Pre,
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

/// Resolve, compile and contract-check a plugin. A plugin file that shadows an embedded
/// plugin of the same name is announced (a warning, and `shadows_embedded` in its info).
pub fn load(spec: &str) -> Result<Plugin, PluginError> {
    let (name, source, bytes) =
        resolve::resolve(spec).map_err(|m| PluginError::new(spec, "load", Failure::Load(m)))?;
    let plugin = load_bytes(&name, source, &bytes)?;
    // Once per file and process: a run loads its workload more than once.
    static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let first = |source: &str| {
        let mut warned = WARNED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let new = !warned.iter().any(|s| s == source);
        if new {
            warned.push(source.to_string());
        }
        new
    };
    if plugin.info.shadows_embedded && first(&plugin.info.source.to_string()) {
        tracing::warn!(
            "{} from {} shadows the embedded plugin of that name",
            plugin.info.name,
            plugin.info.source
        );
    }
    Ok(plugin)
}

/// What `bytes` are, if not a WebAssembly component: a file of another kind (text, an
/// archive) or a core module (built for wasm32-unknown-unknown, or never componentised).
/// Said before compiling, whose errors for these are a byte dump or a parser's jargon.
fn not_a_component(bytes: &[u8]) -> Option<String> {
    const MAGIC: &[u8; 4] = b"\0asm";
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        let start: String = bytes.iter().take(8).map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '.' }).collect();
        return Some(format!(
            "not a WebAssembly file (it begins '{start}'): a plugin is a WebAssembly component (.wasm) built for wasm32-wasip2"
        ));
    }
    // The version field: 1 for a core module; components use another (0x0d, layer 1).
    (bytes[4..8] == [1, 0, 0, 0]).then(|| {
        "a core WebAssembly module, not a component: build it for wasm32-wasip2 (`cargo build --target wasm32-wasip2`), \
         or wrap it with `wasm-tools component new`"
            .to_string()
    })
}

/// Compile and contract-check plugin bytes obtained elsewhere.
pub fn load_bytes(name: &str, source: Source, bytes: &[u8]) -> Result<Plugin, PluginError> {
    if let Some(what) = not_a_component(bytes) {
        return Err(PluginError::new(name, "load", Failure::Load(what)));
    }
    let sha256 = sha256_hex(bytes);
    let (component, _) = engine::compile(bytes, &sha256).map_err(|m| {
        PluginError::new(
            name,
            "load",
            Failure::Load(format!("not a valid WebAssembly component: {m}")),
        )
    })?;
    from_component(name, source, sha256, bytes.len(), &component)
}

/// Contract-check a compiled component and pre-instantiate it.
fn from_component(
    name: &str,
    source: Source,
    sha256: String,
    bytes: usize,
    component: &Component,
) -> Result<Plugin, PluginError> {
    let (kind, contract) = check_contract(name, component)?;
    let pre = pre_instantiate(name, kind, &contract, component)?;
    let shadows_embedded =
        matches!(source, Source::Path(_)) && embedded().iter().any(|(n, _, _)| *n == name);
    Ok(Plugin {
        info: PluginInfo {
            name: name.to_string(),
            kind,
            contract,
            source,
            sha256,
            bytes,
            shadows_embedded,
        },
        pre,
    })
}

fn pre_instantiate(
    name: &str,
    kind: Kind,
    contract: &str,
    component: &Component,
) -> Result<Pre, PluginError> {
    let err = |e: wasmtime::Error| {
        PluginError::new(
            name,
            "load",
            Failure::Contract(format!(
                "its exports do not match contract {PACKAGE}@{contract} ({}); rebuild it with the matching SDK",
                runner_contract::text::escape(&format!("{e:#}"), 512)
            )),
        )
    };
    let pre = engine::linker().instantiate_pre(component).map_err(err)?;
    // `check_contract` admitted only the versions in CONTRACT_VERSIONS.
    Ok(match (kind, contract) {
        (Kind::Workload, "0.3.0") => {
            Pre::WorkloadV3(v3::workload::WorkloadPluginPre::new(pre).map_err(err)?)
        }
        (Kind::Workload, "0.2.0") => {
            Pre::WorkloadV2(v2::workload::WorkloadPluginPre::new(pre).map_err(err)?)
        }
        (Kind::Workload, _) => {
            Pre::WorkloadV1(v1::workload::WorkloadPluginPre::new(pre).map_err(err)?)
        }
        (Kind::Precision, "0.3.0") => {
            Pre::PrecisionV3(v3::precision::PrecisionPluginPre::new(pre).map_err(err)?)
        }
        (Kind::Precision, "0.2.0") => {
            Pre::PrecisionV2(v2::precision::PrecisionPluginPre::new(pre).map_err(err)?)
        }
        (Kind::Precision, _) => {
            Pre::PrecisionV1(v1::precision::PrecisionPluginPre::new(pre).map_err(err)?)
        }
        (Kind::Cost, "0.3.0") => Pre::CostV3(v3::cost::CostPluginPre::new(pre).map_err(err)?),
        (Kind::Cost, "0.2.0") => Pre::CostV2(v2::cost::CostPluginPre::new(pre).map_err(err)?),
        (Kind::Cost, _) => Pre::CostV1(v1::cost::CostPluginPre::new(pre).map_err(err)?),
    })
}

/// Which world the component exports, at which contract version (one this host binds);
/// and that it imports nothing the sandbox does not grant.
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
            let exports: Vec<String> = ty
                .exports(engine)
                .map(|(n, _)| runner_contract::text::escape(n, 128))
                .collect();
            return Err(err(format!(
                "it exports none of {PACKAGE}/workload, /precision-policy or /cost-model (it exports: {}); \
                 build it with runner-plugin-sdk and one of its features, and end the crate with that \
                 feature's export macro (`runner_plugin_sdk::export_workload!(MyModel);`, `export_precision!`, \
                 `export_cost!`)",
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
    if !CONTRACT_VERSIONS.contains(&version.as_str()) {
        let version = runner_contract::text::escape(&version, 32);
        let older: Vec<String> = CONTRACT_VERSIONS
            .iter()
            .filter(|v| **v != CONTRACT_VERSION)
            .map(|v| format!("{PACKAGE}@{v}"))
            .collect();
        return Err(err(format!(
            "it was built against contract {PACKAGE}@{version}, but this runner speaks {PACKAGE}@{CONTRACT_VERSION} \
             (and {} through an adapter); rebuild the plugin against this runner's own SDK \
             (`plugins/sdk` of its source, which speaks {CONTRACT_VERSION}), or use a runner that speaks {version}",
            older.join(" and ")
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
                .map(|i| format!("`{}`", runner_contract::text::escape(i, 128)))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok((kind, version))
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
    list_of(installed_files(), embedded())
}

/// [`list`] with the file each entry was read from (`None` for an embedded plugin): a
/// file that fails to load has no info to say where it is.
pub fn list_with_files() -> Vec<(Option<std::path::PathBuf>, Result<PluginInfo, PluginError>, bool)> {
    let files = installed_files();
    let paths: Vec<Option<std::path::PathBuf>> = files.iter().cloned().map(Some).chain(embedded().iter().map(|_| None)).collect();
    paths.into_iter().zip(list_of(files, embedded())).map(|(path, (info, shadowed))| (path, info, shadowed)).collect()
}

/// [`list`] of the plugin files `files` and the embedded plugins `embedded`. A file is
/// read as `resolve` reads it: a file past [`resolve::MAX_PLUGIN_BYTES`] is refused
/// unread, not read whole into memory.
fn list_of(
    files: Vec<std::path::PathBuf>,
    embedded: &[(&str, &str, &[u8])],
) -> Vec<(Result<PluginInfo, PluginError>, bool)> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for path in files {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let shadowed = !seen.insert(name.clone());
        let info = resolve::read_plugin(&path)
            .map_err(|m| PluginError::new(&name, "load", Failure::Load(m)))
            .and_then(|bytes| load_bytes(&name, Source::Path(path.clone()), &bytes))
            .map(|p| p.info);
        out.push((info, shadowed));
    }
    for (name, _, bytes) in embedded {
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
    use super::*;

    /// Files too short to hold a component's header (a truncated download: the magic and
    /// part of the version) are not WebAssembly, never indexed past their end; bytes that
    /// are not printable are shown as dots.
    #[test]
    fn short_and_binary_files_are_named_without_a_panic_or_raw_bytes() {
        let header = b"\0asm\x0d\0\x01\0";
        for n in 0..8 {
            let m = not_a_component(&header[..n]).expect("too short to be a component");
            assert!(m.starts_with("not a WebAssembly file"), "{n}: {m}");
        }
        assert_eq!(not_a_component(header), None);
        let m = not_a_component(b"\x1b[2J\x07a b\xffz").unwrap();
        assert!(m.contains("(it begins '.[2J.a b')"), "{m}");
    }

    /// A plugin file shadows an embedded plugin when it has its name (and only then); the
    /// embedded plugin shadows nothing; `list` marks every later plugin of a name seen
    /// before as shadowed, and refuses a file past the size bound without reading it.
    #[test]
    fn a_file_of_an_embedded_name_shadows_it_and_is_listed_first() {
        let tmp = tempfile::Builder::new().prefix("runner-list-").tempdir().unwrap();
        let dir = tmp.path();
        let (_, kind, bytes) = *embedded().iter().find(|(n, _, _)| *n == "bf16.wasm").unwrap();
        let (copy, other) = (dir.join("bf16.wasm"), dir.join("mine.wasm"));
        std::fs::write(&copy, bytes).unwrap();
        std::fs::write(&other, bytes).unwrap();
        let huge = dir.join("huge.wasm");
        // Sparse: no disk is written for the hole.
        std::fs::File::create(&huge).unwrap().set_len(resolve::MAX_PLUGIN_BYTES + 1).unwrap();

        let listed = list_of(vec![copy.clone(), other.clone(), huge], &[("bf16.wasm", kind, bytes)]);
        let shown: Vec<_> = listed
            .iter()
            .map(|(info, shadowed)| (info.as_ref().map(|i| (i.source.clone(), i.shadows_embedded)).map_err(|e| e.to_string()), *shadowed))
            .collect();
        assert_eq!(shown[0], (Ok((Source::Path(copy), true)), false));
        assert_eq!(shown[1], (Ok((Source::Path(other), false)), false));
        assert!(matches!(&shown[2], (Err(m), false) if m.contains("larger than 256 MiB")), "{:?}", shown[2]);
        assert_eq!(shown[3], (Ok((Source::Embedded, false)), true));
        assert_eq!(shown.len(), 4);
        let info = listed[0].0.as_ref().unwrap();
        assert!(info.provenance().contains("shadowing the embedded plugin"), "{}", info.provenance());
    }
}
