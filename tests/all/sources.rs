//! The repository cites public sources only: a paper, a repository at a commit, a page and
//! its date. The engineers' private research notes are not shipped, so a comment, a doc or
//! a plugin's layout source (printed by `runner project`) that points a user at them points
//! at nothing.

use std::path::{Path, PathBuf};

/// Names of the private notes, split so this file does not match itself.
const PRIVATE: [&str; 7] = [
    concat!("shared/", "notes"),
    concat!("shared/", "data"),
    concat!("dgxc", ".md"),
    concat!("modeling", ".md"),
    concat!("fp8", ".md"),
    concat!("pricing", ".md"),
    concat!("rust-stack", ".md"),
];

fn texts(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" || name == "dist" {
            continue;
        }
        if path.is_dir() {
            texts(&path, out);
        } else if ["rs", "md", "toml", "py", "sh", "yaml", "cu", "cuh", "cpp", "wit", "csv", "sbatch"]
            .iter()
            .any(|ext| path.extension().is_some_and(|e| e == *ext))
        {
            out.push(path);
        }
    }
}

#[test]
fn no_file_cites_the_private_notes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    for top in ["host", "plugins", "kernels", "tests", "docs", "scripts", "workloads", "wit", "README.md"] {
        let p = root.join(top);
        if p.is_file() {
            files.push(p);
        } else {
            texts(&p, &mut files);
        }
    }
    assert!(files.len() > 100, "walked only {} files from {}", files.len(), root.display());
    let mut found = Vec::new();
    for f in &files {
        let Ok(text) = std::fs::read_to_string(f) else { continue };
        for (n, line) in text.lines().enumerate() {
            if let Some(name) = PRIVATE.iter().find(|p| cites(line, p)) {
                found.push(format!("{}:{}: {name}", f.strip_prefix(root).unwrap().display(), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "cite the public source instead:\n{}", found.join("\n"));
}

/// `line` names `note` as a file of its own (not as the end of a longer name).
fn cites(line: &str, note: &str) -> bool {
    line.match_indices(note).any(|(i, _)| {
        !line[..i].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_')
    })
}
