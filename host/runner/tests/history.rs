//! The history from the command line: a run killed with SIGKILL keeps what it wrote and
//! resumes where it stopped; two runners writing at once both land; `show` reprints a run
//! and `compare` names what changed.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn scratch(name: &str) -> common::Scratch {
    common::scratch("history", name)
}

fn command(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runner"));
    c.current_dir(dir)
        .args(args)
        .env("RUNNER_HISTORY", dir.join("history.sqlite"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .env_remove("RUNNER_PLUGIN_PATH");
    c
}

fn run(dir: &Path, args: &[&str]) -> Output {
    command(dir, args).output().expect("runner starts")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn program(file: &str) -> String {
    runner::plugin::test_programs()
        .iter()
        .find(|(n, _)| *n == file)
        .map(|(_, p)| p.to_string())
        .unwrap_or_else(|| panic!("test program {file} was not built"))
}

/// A run that takes seconds: its cloud's cheapest offering, `slow`, computes about 150 ms in every
/// quote, so each row costs that. (A quote that hung would cost the deadline once: the
/// cloud is not asked again.)
fn slow_run_file(dir: &Path) -> PathBuf {
    let path = dir.join("slow.toml");
    std::fs::write(
        &path,
        format!(
            "[model]\nplugin = \"llama3\"\nvariant = \"llama3-tiny\"\n[cluster]\ngpus = [8, 16, 24, 32, 40, 48, 56, 64, 72, 80]\n\
             [precision]\nformat = \"bf16\"\n[cost]\nplugins = [{:?}]\n[limits]\ncall_timeout_ms = 2000\n[measure]\nrepeats = 1\n",
            program("misbehave_cost.wasm")
        ),
    )
    .unwrap();
    path
}

fn store(dir: &Path) -> runner_store::Store {
    runner_store::Store::open(&dir.join("history.sqlite")).unwrap()
}

/// Ctrl-C (SIGINT) during a run ends the progress line and says how to go on, then the
/// run dies of the signal as before (the shell's 130), its rows kept. Kills: no handler
/// (nothing said), a handler that exits normally instead of dying of the signal.
#[test]
fn an_interrupted_run_says_how_to_resume_and_dies_of_the_signal() {
    use std::os::unix::process::ExitStatusExt as _;
    let dir = scratch("sigint");
    let file = slow_run_file(&dir);
    let mut child = command(&dir, &["run", file.to_str().unwrap()]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        assert!(child.try_wait().unwrap().is_none(), "the run finished before it could be interrupted");
        assert!(start.elapsed() < Duration::from_secs(120), "no rows were kept");
        if dir.join("history.sqlite").exists() && store(&dir).list(1).unwrap().first().is_some_and(|r| r.items >= 2) {
            break;
        }
    }
    assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.signal(), Some(2), "{:?} {err}", o.status);
    assert!(err.contains("\ninterrupted; rerun the same command to resume\n"), "{err}");
    assert_eq!(store(&dir).list(1).unwrap()[0].status, "running", "left to be resumed");
}

#[test]
fn a_run_killed_with_sigkill_keeps_its_rows_and_resumes_where_it_stopped() {
    let dir = scratch("kill");
    let file = slow_run_file(&dir);
    let file = file.to_str().unwrap();
    let mut child = command(&dir, &["run", file, "-q"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    // Wait until the measurement and at least two rows are kept, then kill -9.
    let start = Instant::now();
    let kept = loop {
        std::thread::sleep(Duration::from_millis(20));
        assert!(child.try_wait().unwrap().is_none(), "the run finished before it could be killed");
        assert!(start.elapsed() < Duration::from_secs(120), "no rows were kept");
        if !dir.join("history.sqlite").exists() {
            continue;
        }
        let s = store(&dir);
        if let Some(r) = s.list(1).unwrap().first()
            && r.items >= 3
        {
            break r.items;
        }
    };
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
    let s = store(&dir);
    let killed = s.list(1).unwrap()[0].clone();
    assert_eq!(killed.status, "running");
    assert!(killed.items >= kept, "nothing already written is lost");
    assert_eq!(s.integrity().unwrap(), "ok");
    drop(s);

    // Started again with the same inputs: it resumes that run and finishes it.
    let o = run(&dir, &["run", file, "--format", "json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains(&format!("kept as run {}, resumed with", killed.id)), "{err}");
    let resumed: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = store(&dir);
    let done = s.get(killed.id).unwrap();
    assert_eq!(done.status, "done");
    assert_eq!(s.list(10).unwrap().len(), 1, "no second run was started");

    // The same figures as a run from scratch (not kept).
    let o = run(&dir, &["run", file, "--format", "json", "--no-history"]);
    let fresh: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    let days = |v: &serde_json::Value| -> Vec<f64> {
        v["series"][0]["rows"].as_array().unwrap().iter().map(|r| r["days"].as_f64().unwrap()).collect()
    };
    assert_eq!(days(&resumed).len(), 10);
    assert_eq!(days(&resumed), days(&fresh));
    assert_eq!(store(&dir).list(10).unwrap().len(), 1, "--no-history keeps nothing");
}

#[test]
fn two_runners_writing_at_once_both_land_and_show_and_compare_read_them() {
    let dir = scratch("concurrent");
    let args = |gpus: &'static str| ["--plugin", "llama3", "--variant", "llama3-tiny", "--gpus", gpus, "--cloud", "aws", "--repeats", "1", "-q"];
    // Same inputs at once: the second must not resume the first's live run.
    let a = command(&dir, &args("8,16")).stdout(Stdio::piped()).spawn().unwrap();
    let b = command(&dir, &args("8,16")).stdout(Stdio::piped()).spawn().unwrap();
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(a.status.success() && b.status.success());
    let o = run(&dir, &[&args("8,32")[..], &["--format", "json"]].concat());
    assert!(o.status.success());
    let printed_json = text(&o).0;
    let s = store(&dir);
    let runs = s.list(10).unwrap();
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert!(runs.iter().all(|r| r.status == "done"), "{runs:?}");
    assert_eq!(s.integrity().unwrap(), "ok");
    let ids: Vec<i64> = runs.iter().map(|r| r.id).rev().collect();
    for id in &ids[..2] {
        assert_eq!(s.get(*id).unwrap().items.len(), 5, "measurement and two rows in two precisions");
    }

    // `history` lists them; `show` reprints one as it was printed.
    let o = run(&dir, &["history"]);
    let (out, _) = text(&o);
    assert_eq!(out.lines().filter(|l| l.contains(" done ")).count(), 3, "{out}");
    // The two racing runners take their ids in either order: each shown run is one of
    // the two printed tables, exactly.
    let printed = [String::from_utf8_lossy(&a.stdout).into_owned(), String::from_utf8_lossy(&b.stdout).into_owned()];
    let shown: Vec<String> = ids[..2].iter().map(|id| text(&run(&dir, &["show", &id.to_string()])).0).collect();
    assert!(shown.iter().all(|s| printed.contains(s)), "show reprints the table exactly");
    let o = run(&dir, &["show", &ids[0].to_string(), "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(v["series"][0]["rows"].as_array().unwrap().len(), 2);
    // JSON as printed, byte for byte: keys in the run's order, every float's digits (the
    // outcome read back from the store had its keys sorted and 0.4435644958 for
    // 0.44356449579999996).
    let o = run(&dir, &["show", &ids[2].to_string(), "--format", "json"]);
    assert!(text(&o).0 == printed_json, "show reprints the JSON exactly");
    let o = run(&dir, &["show", &ids[0].to_string(), "-o", "again.html"]);
    assert!(o.status.success());
    assert!(std::fs::read_to_string(dir.join("again.html")).unwrap().contains("<svg"));

    // `compare`: the same inputs differ in nothing but the timing of the measurement;
    // other GPU counts show in the inputs and the results.
    let o = run(&dir, &["compare", &ids[1].to_string(), &ids[2].to_string(), "--format", "json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let changes: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let at = |what: &str, path: &str| changes.iter().any(|c| c["what"] == what && c["where"].as_str().unwrap().contains(path));
    assert!(at("inputs", "run.cluster.gpus[1]"), "{out}");
    assert!(at("results", "series.H100 bf16.32"), "{out}");
    assert!(!at("plugins", ""), "the same plugins: {out}");
    let o = run(&dir, &["show", "99"]);
    assert!(text(&o).1.contains("no run 99"), "{}", text(&o).1);
}

/// A history the user may read but not write (another user's, in a directory they cannot
/// write, so SQLite cannot make the -shm it reads a WAL file with): `history`, `show` and
/// `compare` read it and change nothing. They failed "attempt to write a readonly
/// database". As root (whom permissions do not stop) the commands run as `nobody`.
#[cfg(unix)]
#[test]
fn a_history_that_cannot_be_written_is_still_listed_shown_and_compared() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("readonly");
    let shared = dir.join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let path = shared.join("h.sqlite");
    {
        let mut s = runner_store::Store::open(&path).unwrap();
        for gpus in [8, 16] {
            let (id, _) = s.begin("explore", "runner explore", &serde_json::json!({ "gpus": gpus }), &serde_json::json!([]), "0", "").unwrap();
            let table = format!("the table of run {id}\n");
            s.finish(id, "done", &serde_json::json!({ "renderings": { "table": table }, "figures": { "gpus": gpus } })).unwrap();
        }
    }
    assert!(!shared.join("h.sqlite-wal").exists(), "closed cleanly");
    let before = std::fs::read(&path).unwrap();
    for (p, mode) in [(&*dir, 0o755), (shared.as_path(), 0o555), (path.as_path(), 0o444)] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let as_user = |args: &[&str]| -> Output {
        let history = path.to_str().unwrap();
        let mut c = if root {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_runner")]);
            c
        } else {
            Command::new(env!("CARGO_BIN_EXE_runner"))
        };
        c.current_dir(&dir).args(["--history", history]).args(args).env("HOME", &dir).env_remove("RUNNER_HISTORY");
        c.output().expect("runner starts (as root: setpriv, from util-linux)")
    };
    let o = as_user(&["history"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(out.lines().filter(|l| l.contains(" done ")).count(), 2, "{out}");
    let o = as_user(&["show", "2"]);
    assert_eq!(text(&o), ("the table of run 2\n".to_string(), String::new()));
    let o = as_user(&["compare", "1", "2", "--format", "json"]);
    let changes: Vec<serde_json::Value> = serde_json::from_str(&text(&o).0).unwrap_or_else(|e| panic!("{e}: {:?}", text(&o)));
    assert_eq!(changes, [serde_json::json!({"what": "inputs", "where": "gpus", "a": 8, "b": 16}), serde_json::json!({"what": "results", "where": "gpus", "a": 8, "b": 16})]);
    assert_eq!(std::fs::read(&path).unwrap(), before, "the file is left as it was");
    assert!(!shared.join("h.sqlite-wal").exists() && !shared.join("h.sqlite-shm").exists());
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
}
