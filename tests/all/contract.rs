//! Contract checks at load time: version, kind, imports; and plugin resolution.

use runner::plugin::{self, Failure, Kind, Limits, Source};

use crate::util::program;

#[test]
fn a_plugin_built_against_another_contract_version_is_refused_naming_both() {
    let err = plugin::load(&program("contract_future.wasm"))
        .err()
        .expect("must be refused");
    assert!(matches!(err.failure, Failure::Contract(_)), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("runner:plugin@0.4.0"), "{msg}");
    // It names every version this runner speaks.
    for version in plugin::CONTRACT_VERSIONS {
        assert!(msg.contains(&format!("runner:plugin@{version}")), "{msg}");
    }
}

#[test]
fn a_plugin_that_imports_the_filesystem_is_refused() {
    let err = plugin::load(&program("contract_fs.wasm"))
        .err()
        .expect("must be refused");
    let msg = err.to_string();
    assert!(msg.contains("wasi:filesystem"), "{msg}");
    assert!(msg.contains("does not grant"), "{msg}");
}

#[test]
fn a_plugin_of_the_wrong_kind_is_refused_where_another_kind_is_needed() {
    let p = plugin::load("aws.wasm").unwrap();
    let err = p
        .workload(Limits::default())
        .err()
        .expect("aws is a cost plugin");
    assert!(
        err.to_string()
            .contains("is a cost plugin, but a workload plugin is needed"),
        "{err}"
    );
}

#[test]
fn not_a_component_is_a_load_error() {
    let tmp = tempfile::Builder::new().prefix("runner-test-").tempdir().unwrap();
    let dir = tmp.path();
    let path = dir.join("junk.wasm");
    std::fs::write(&path, b"this is not wasm").unwrap();
    let err = plugin::load(path.to_str().unwrap())
        .err()
        .expect("junk must not load");
    assert!(matches!(err.failure, Failure::Load(_)), "{err}");
    assert!(err.to_string().contains("not a WebAssembly file (it begins 'this is '): a plugin is a WebAssembly component"), "{err}");
    // A core module (the header of an empty one) is named as such, with the build that
    // makes a component; a truncated component gets the compiler's reason.
    std::fs::write(&path, b"\0asm\x01\0\0\0").unwrap();
    let err = plugin::load(path.to_str().unwrap()).err().expect("a core module must not load");
    assert!(matches!(err.failure, Failure::Load(_)) && err.to_string().contains("a core WebAssembly module, not a component"), "{err}");
    std::fs::write(&path, b"\0asm\x0d\0\x01\0\x01").unwrap();
    let err = plugin::load(path.to_str().unwrap()).err().expect("a truncated component must not load");
    assert!(err.to_string().contains("not a valid WebAssembly component"), "{err}");
    // A directory, or a device, at the path: said so (no plugin has these names).
    let sub = dir.join("sub.wasm");
    std::fs::create_dir_all(&sub).unwrap();
    let err = plugin::load(sub.to_str().unwrap()).err().expect("a directory must not load");
    assert!(err.to_string().contains("is a directory, not a plugin file"), "{err}");
    #[cfg(unix)]
    {
        let err = plugin::load("/dev/null").err().expect("a device must not load");
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }
}

#[test]
fn embedded_plugins_resolve_with_or_without_the_extension() {
    for spec in ["llama3.wasm", "llama3"] {
        let p = plugin::load(spec).unwrap();
        assert_eq!(p.info.kind, Kind::Workload);
        assert_eq!(p.info.source, Source::Embedded);
        assert_eq!(p.info.contract, plugin::CONTRACT_VERSION);
        assert_eq!(p.info.sha256.len(), 64);
    }
    let err = plugin::load("no-such-plugin").err().unwrap();
    assert!(err.to_string().contains("plugin directories"), "{err}");
    assert!(
        err.to_string().contains("llama3.wasm"),
        "the error lists what exists: {err}"
    );
}

#[test]
fn a_path_wins_over_everything() {
    let p = plugin::load(&program("misbehave_cost.wasm")).unwrap();
    assert!(matches!(p.info.source, Source::Path(_)));
    assert_eq!(p.info.kind, Kind::Cost);
}

#[test]
fn every_first_party_plugin_loads_and_answers() {
    for (name, kind, _) in plugin::embedded() {
        let p = plugin::load(name).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.info.kind.name(), *kind, "{name}");
        match p.info.kind {
            Kind::Workload => {
                let info = p
                    .workload(Limits::default())
                    .unwrap()
                    .describe()
                    .unwrap_or_else(|e| panic!("{e}"));
                assert!(!info.variants.is_empty(), "{name}");
            }
            Kind::Cost => {
                // The generic price-file plugin prices what it is given on stdin.
                let mut c = if *name == "price_file.wasm" {
                    let csv = "InstanceType,AcceleratorName,AcceleratorCount,Region,Price\nours,H100,8,eu-1,20\n";
                    p.cost_with_input(Limits::default(), csv.as_bytes().to_vec()).unwrap()
                } else {
                    p.cost(Limits::default()).unwrap()
                };
                c.provider().unwrap_or_else(|e| panic!("{e}"));
                assert!(
                    !c.offerings().unwrap_or_else(|e| panic!("{e}")).is_empty(),
                    "{name}"
                );
            }
            Kind::Precision => {
                p.precision(Limits::default())
                    .unwrap()
                    .name()
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}
