//! Builds every plugin crate for `wasm32-wasip2` so that `cargo build` and `cargo test`
//! need nothing else, then writes `plugins.rs` into OUT_DIR: the first-party plugins to
//! embed in the binary, and the paths of the test programs (misbehaving plugins).
//!
//! Plugins are found by `[package.metadata.runner] kind = "..."` in `plugins/*/Cargo.toml`
//! (first-party, embedded) and `tests/programs/*/Cargo.toml` (test programs, not embedded).
//! Each kind builds in its own nested cargo invocation: plugins of one kind share SDK
//! features, and features must not unify across kinds (one world per plugin). The nested
//! cargo gets its own target dir (no lock contention with this build) and none of the
//! outer build's flags.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

struct PluginCrate {
    package: String,
    lib: String,
    /// The file name it is embedded as: `[package.metadata.runner] file`, else `<lib>.wasm`
    /// (a lib name cannot hold the `-` of `fp8-cs.wasm`).
    file: String,
    kind: String,
    test_program: bool,
}

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());

    println!("cargo:rerun-if-changed={}", root.join("wit").display());

    let mut crates = Vec::new();
    for (dir, test_program) in [
        (root.join("plugins"), false),
        (root.join("tests/programs"), true),
    ] {
        // The directory itself too, so a newly added plugin crate is discovered.
        println!("cargo:rerun-if-changed={}", dir.display());
        crates.extend(discover(&dir, test_program));
    }
    // The contract's rules build into every plugin (through the SDK), outside plugins/.
    println!("cargo:rerun-if-changed={}", root.join("host/contract").display());
    // Source the test programs share (`include!`d, not a crate of its own).
    println!("cargo:rerun-if-changed={}", root.join("tests/programs/shared").display());
    // The SDK links the contract's rules (its escape among them) into every plugin: a
    // change there alone left the embedded plugins built from the old rules.
    println!("cargo:rerun-if-changed={}", root.join("host/contract/src").display());

    let target_dir = out_dir.join("wasm-target");
    let mut kinds: Vec<(String, bool)> = crates
        .iter()
        .map(|c| (c.kind.clone(), c.test_program))
        .collect();
    kinds.sort();
    kinds.dedup();
    for (kind, test_program) in &kinds {
        let mut cmd = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.current_dir(&root)
            .args([
                "build",
                "--quiet",
                "--target",
                "wasm32-wasip2",
                "--profile",
                "plugin",
            ])
            .env("CARGO_TARGET_DIR", &target_dir)
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_BUILD_TARGET")
            .env_remove("CARGO_BUILD_RUSTFLAGS")
            .env_remove("RUSTC_WORKSPACE_WRAPPER");
        for c in crates
            .iter()
            .filter(|c| &c.kind == kind && c.test_program == *test_program)
        {
            cmd.args(["-p", &c.package]);
        }
        // stdout must stay clean: cargo reads this script's stdout for directives.
        let status = cmd
            .stdout(Stdio::null())
            .status()
            .expect("failed to run cargo for the wasm plugins");
        if !status.success() {
            panic!(
                "building the {kind} plugins for wasm32-wasip2 failed (see above). If the error says \
                 the target may not be installed, run: rustup target add wasm32-wasip2"
            );
        }
    }

    let wasm_dir = target_dir.join("wasm32-wasip2").join("plugin");
    let mut code = String::new();
    code.push_str("/// First-party plugins embedded in the binary: (file name, kind, bytes).\n");
    code.push_str("pub static EMBEDDED: &[(&str, &str, &[u8])] = &[\n");
    for c in crates.iter().filter(|c| !c.test_program) {
        let path = wasm_dir.join(format!("{}.wasm", c.lib));
        writeln!(
            code,
            "    (\"{}\", \"{}\", include_bytes!({:?})),",
            c.file, c.kind, path
        )
        .unwrap();
    }
    code.push_str("];\n\n/// Test programs (misbehaving plugins): (file name, path).\n");
    code.push_str("pub static TEST_PROGRAMS: &[(&str, &str)] = &[\n");
    for c in crates.iter().filter(|c| c.test_program) {
        let path = wasm_dir.join(format!("{}.wasm", c.lib));
        writeln!(
            code,
            "    (\"{}.wasm\", {:?}),",
            c.lib,
            path.display().to_string()
        )
        .unwrap();
    }
    code.push_str("];\n");
    fs::write(out_dir.join("plugins.rs"), code).unwrap();
}

fn discover(dir: &Path, test_program: bool) -> Vec<PluginCrate> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return found;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let manifest = path.join("Cargo.toml");
        let Ok(text) = fs::read_to_string(&manifest) else {
            continue;
        };
        // Watch each crate (not all of plugins/, which also holds plugins/dist).
        println!("cargo:rerun-if-changed={}", path.join("src").display());
        println!("cargo:rerun-if-changed={}", manifest.display());
        let value: toml::Table =
            toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
        let package = value.get("package").and_then(|p| p.as_table());
        let kind = package
            .and_then(|p| p.get("metadata"))
            .and_then(|m| m.get("runner"))
            .and_then(|r| r.get("kind"))
            .and_then(|k| k.as_str());
        let (Some(package), Some(kind)) = (package, kind) else {
            continue;
        };
        let file = package
            .get("metadata")
            .and_then(|m| m.get("runner"))
            .and_then(|r| r.get("file"))
            .and_then(|f| f.as_str())
            .map(str::to_string);
        let name = package
            .get("name")
            .and_then(|n| n.as_str())
            .unwrap()
            .to_string();
        let lib = value
            .get("lib")
            .and_then(|l| l.get("name"))
            .and_then(|n| n.as_str())
            .map(str::to_string)
            .unwrap_or_else(|| name.replace('-', "_"));
        found.push(PluginCrate {
            package: name,
            file: file.unwrap_or_else(|| format!("{lib}.wasm")),
            lib,
            kind: kind.to_string(),
            test_program,
        });
    }
    found
}
