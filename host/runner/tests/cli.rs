//! The command-line surface: the default run, run files, plugin resolution through the
//! plugin directories, output formats and the error messages a user sees.

mod common;

use std::path::Path;
use std::process::{Command, Output};

/// The runner binary in `dir`, with the user's plugin path and history out of reach.
fn command(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runner"));
    c.current_dir(dir).args(args).env("XDG_DATA_HOME", dir.join("data")).env_remove("RUNNER_PLUGIN_PATH").env_remove("RUNNER_HISTORY");
    c
}

fn runner(dir: &Path, args: &[&str]) -> Output {
    command(dir, args).output().expect("runner starts")
}

fn scratch(name: &str) -> common::Scratch {
    common::scratch("cli", name)
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// One CSV line's cells (RFC 4180 quoting).
fn csv_cells(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// A command's CSV read as a script reads it: one header row, every other row as many
/// cells (RFC 4180), the `#` notes left out.
fn csv_of(text: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let (header, rows, _) = runner::report::parse_csv(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (header, rows)
}

/// The cell under `name` as a figure: a unit, a % or an SI suffix fails to parse.
fn figure(header: &[String], row: &[String], name: &str) -> f64 {
    let i = header.iter().position(|h| h == name).unwrap_or_else(|| panic!("no column {name}: {header:?}"));
    row[i].parse().unwrap_or_else(|e| panic!("{name} = {:?}: {e}", row[i]))
}

/// Whether `a` and `b` agree to the last bits (a figure rounded for people does not;
/// serde_json reads a float back from JSON text up to an ulp off).
fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

fn embedded_wasm(name: &str) -> Vec<u8> {
    runner::plugin::embedded()
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, _, b)| b.to_vec())
        .unwrap()
}

/// `runner prices --gpu h100`: every cloud's H100 row per instance and option, clean
/// prices before caveated ones and each cheapest first, per GPU-hour = per node-hour over
/// the node's GPUs (AWS's p5.48xlarge: $55.04 a node-hour, $6.88 a GPU-hour, as its
/// source lists it); a price file's rows beside them, its resale row after every clean
/// one; the CSV's figures the JSON's, unrounded. Kills: sorting on price alone, the
/// per-GPU division dropped or taken twice, a CSV cell rounded.
#[test]
fn prices_list_every_clouds_rows_per_gpu_hour_cheapest_first() {
    let dir = scratch("prices");
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../workloads/our-contract.csv");
    let args = ["prices", "--gpu", "h100", "--price-file", file.to_str().unwrap()];
    let o = runner(&dir, &[&args[..], &["--format", "json"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = v["prices"].as_array().unwrap();
    assert!(rows.len() >= 10 && rows.iter().all(|r| r["gpu"] == "H100"), "{out}");
    let key = |r: &serde_json::Value| (!r["caveats"].as_array().unwrap().is_empty(), r["usd_per_gpu_hour"].as_f64().unwrap());
    assert!(rows.windows(2).all(|w| key(&w[0]) <= key(&w[1])), "clean first, each cheapest first: {out}");
    for r in rows {
        let (node, gpus) = (r["usd_per_node_hour"].as_f64().unwrap(), r["gpus_per_node"].as_f64().unwrap());
        assert!(r["upfront_usd_per_node"] != 0.0 || (r["usd_per_gpu_hour"].as_f64().unwrap() - node / gpus).abs() < 1e-12, "{r}");
    }
    let p5 = rows.iter().find(|r| r["instance"] == "p5.48xlarge").unwrap();
    assert_eq!((p5["cloud"].as_str(), p5["region"].as_str(), p5["usd_per_gpu_hour"].as_f64()), (Some("aws"), Some("us-east-1"), Some(6.88)));
    let ours: Vec<_> = rows.iter().filter(|r| r["cloud"] == "our-contract").collect();
    assert_eq!(ours.len(), 2, "{out}");
    assert_eq!(ours[0]["usd_per_gpu_hour"].as_f64(), Some(2.3), "18.40 a node of 8");
    let resale = rows.iter().position(|r| r["instance"] == "broker-8xh100").unwrap();
    assert!(rows[..resale].iter().all(|r| r["caveats"].as_array().unwrap().is_empty()), "{out}");
    assert!(rows[resale]["usd_per_gpu_hour"].as_f64() == Some(1.9), "15.20 / 8");
    // The CSV: the JSON's names and unrounded figures, one row per price.
    let o = runner(&dir, &[&args[..], &["--format", "csv"]].concat());
    let csv = text(&o).0;
    let lines: Vec<Vec<String>> = csv.lines().filter(|l| !l.starts_with('#')).map(csv_cells).collect();
    let col = |name: &str| lines[0].iter().position(|h| h == name).unwrap();
    assert_eq!(lines.len(), rows.len() + 1, "{csv}");
    for (cells, r) in lines[1..].iter().zip(rows) {
        assert_eq!(cells.len(), lines[0].len());
        assert_eq!(cells[col("usd_per_gpu_hour")].parse::<f64>().ok(), r["usd_per_gpu_hour"].as_f64(), "{csv}");
        assert_eq!(cells[col("instance")], r["instance"].as_str().unwrap());
    }
}

/// `runner prices` without --gpu: per GPU type the clouds selling it and its cheapest
/// clean price, which is the first row of that GPU's listing; errors name the fix.
/// Kills: the summary's cheapest taken from a caveated row or another GPU's rows.
#[test]
fn prices_summarise_each_gpu_and_refuse_what_they_cannot_list() {
    let dir = scratch("prices-summary");
    let o = runner(&dir, &["prices", "--format", "json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = v["prices"].as_array().unwrap();
    let summary = v["summary"].as_array().unwrap();
    assert!(summary.iter().any(|s| s["gpu"] == "H100") && summary.iter().any(|s| s["gpu"] == "B200"), "{out}");
    for s in summary {
        let mine: Vec<_> = rows.iter().filter(|r| r["gpu"] == s["gpu"]).collect();
        let clean: Vec<f64> = mine.iter().filter(|r| r["caveats"].as_array().unwrap().is_empty()).map(|r| r["usd_per_gpu_hour"].as_f64().unwrap()).collect();
        let least = clean.iter().copied().fold(f64::INFINITY, f64::min);
        assert_eq!(s["cheapest"]["usd_per_gpu_hour"].as_f64(), Some(least), "{s}");
        let clouds: std::collections::BTreeSet<&str> = mine.iter().map(|r| r["cloud"].as_str().unwrap()).collect();
        assert_eq!(s["clouds"].as_u64(), Some(clouds.len() as u64), "{s}");
    }
    for (args, want) in [
        (&["prices", "--gpu", "h100", "--region", "us-eest-1"][..], "did you mean us-east-1?"),
        (&["prices", "--gpu", "h100,H100"][..], "--gpu names H100 twice"),
        (&["prices", "--option", "weekly"][..], "--option 'weekly' is not one of on-demand"),
    ] {
        let o = runner(&dir, args);
        let err = text(&o).1;
        assert!(!o.status.success() && err.contains(want), "{args:?}: {err}");
    }
    let o = runner(&dir, &["prices", "--gpu", "h800"]);
    let out = text(&o).0;
    assert!(o.status.success() && out.contains("no cloud here lists H800 on-demand: a price file of your own (--price-file) can"), "{out}");
    // With nothing listed the CSV still names its columns, as a listing with rows does.
    let header = |args: &[&str]| text(&runner(&dir, args)).0.lines().next().unwrap_or_default().to_string();
    assert_eq!(header(&["prices", "--gpu", "h800", "--format", "csv"]), header(&["prices", "--gpu", "h100", "--format", "csv"]));
}

/// Under an address-space limit (`ulimit -v`, as on many HPC login nodes) plugins still
/// run: each sandbox reserves what its memory needs, not wasmtime's default 4 GiB. Kills:
/// the default reservation kept (the first plugin call failed to mmap 4 GiB).
#[test]
fn plugins_run_under_an_address_space_limit() {
    let dir = scratch("ulimit");
    let o = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 3000000 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_runner"))
        .args(["project", "--model", "llama3-tiny", "--gpu", "h100", "--gpus", "8", "--format", "json"])
        .current_dir(&*dir)
        .env("XDG_DATA_HOME", dir.join("data"))
        .env_remove("RUNNER_PLUGIN_PATH")
        .output()
        .expect("sh starts");
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["step_time_s"].as_f64().is_some_and(|s| s > 0.0), "{out}");
}

#[test]
fn default_run_prints_the_time_and_cost_table_in_100_columns() {
    let dir = scratch("default");
    let o = runner(&dir, &["--plugin", "llama3.wasm", "--gpus", "8,64", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        ["GPUs", "layout", "GBS", "step s", "GiB", "days", "speedup", "rel.cost", "tok/s/GPU", "MFU"].iter().all(|h| out.contains(h)),
        "{out}"
    );
    // BF16 and FP8 by default, each a block, then the two side by side.
    assert!(out.contains("H100 bf16 - ") && out.contains("H100 fp8 - "), "{out}");
    assert!(out.contains("Low precision against BF16"), "{out}");
    assert!(out.contains("more clouds price H100: every cloud is in --format json"), "{out}");
    assert!(out.contains("measured:") && out.contains("modelled:"), "says what was measured and what modelled: {out}");
    let wide: Vec<&str> = out.lines().filter(|l| l.chars().count() > 100).collect();
    assert!(wide.is_empty(), "lines over 100 columns: {wide:#?}");
    let rows: Vec<&str> = out.lines().filter(|l| (l.starts_with("8 ") || l.starts_with("64")) && l.contains(" TP")).collect();
    assert_eq!(rows.len(), 4, "two counts in two precisions: {out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("64*")).count(), 2, "the sweet spot is marked: {out}");
}

/// A run whose history has no place (no usable HOME: here a relative one, which is
/// ignored as a relative XDG directory is; with no HOME and no passwd entry, as in a
/// container under an arbitrary uid, the same) says so once and goes on, as one whose
/// history cannot be written does; the plugin cache is off, and nothing is written under
/// the working directory. Kills: the missing path an error again (exit 1), a relative
/// HOME taken as it is (`relh/` made here).
#[test]
fn a_run_with_no_place_for_its_history_warns_once_and_goes_on() {
    let dir = scratch("no-home");
    let o = Command::new(env!("CARGO_BIN_EXE_runner"))
        .current_dir(&dir)
        .args(["explore", "--model", "llama3-tiny", "--gpus", "8", "--precision", "bf16"])
        .env("HOME", "relh")
        .env_remove("RUNNER_HISTORY")
        .env_remove("RUNNER_CACHE_DIR")
        .env_remove("RUNNER_PLUGIN_PATH")
        .env_remove("XDG_DATA_HOME")
        .env_remove("XDG_CACHE_HOME")
        .output()
        .expect("runner starts");
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("H100 bf16 - "), "{out}");
    let warned = "warning: not kept in the history: no history database: HOME (relh) is not an absolute path";
    assert_eq!(err.matches(warned).count(), 1, "{err}");
    assert!(err.contains("compiled plugins are not cached: HOME (relh) is not an absolute path"), "{err}");
    assert!(!dir.join("relh").exists(), "a cache or history under the working directory");
}

#[test]
fn json_csv_and_html_carry_every_cloud_with_its_plugin_and_price_row() {
    let dir = scratch("formats");
    let o = runner(
        &dir,
        &["--plugin", "llama3", "--gpus", "16,32", "--precision", "bf16", "--cloud", "aws.wasm,lambda", "--format", "json", "-o", "run.csv", "-q"],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    // --format json governs the file whatever its extension; the terminal shows the table.
    assert!(out.contains("tok/s/GPU") && !out.contains("\"series\""), "{out}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("run.csv")).unwrap()).unwrap();
    let rows = v["series"][0]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows[0]["days"].as_f64().unwrap() > rows[1]["days"].as_f64().unwrap());
    let clouds: Vec<&str> = v["clouds"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    assert_eq!(clouds.len(), 2);
    // Every quote names its plugin (with sha256) and its price row.
    for r in rows {
        for c in r["costs"].as_array().unwrap() {
            assert_eq!(c["status"], "quoted", "{c}");
            assert_eq!(c["plugin_sha256"].as_str().unwrap().len(), 64, "{c}");
            assert!(!c["instance"].as_str().unwrap().is_empty() && !c["price_source"].as_str().unwrap().is_empty(), "{c}");
        }
    }
    let sha = |name: &str| {
        v["plugins"].as_array().unwrap().iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("{name}: {v}"))["sha256"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // Without --format the extension decides.
    let o = runner(&dir, &["--plugin", "llama3", "--gpus", "16,32", "--precision", "bf16", "--cloud", "aws.wasm,lambda", "-o", "run.csv", "-q"]);
    assert!(o.status.success());
    let csv = std::fs::read_to_string(dir.join("run.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    for h in ["gpu", "precision", "gpus", "layout", "days", "cloud", "usd", "instance", "region", "option", "price_date", "price_source", "cost_plugin_sha256"] {
        assert!(header.contains(&h), "{h}: {header:?}");
    }
    let data: Vec<&str> = csv.lines().filter(|l| !l.starts_with("# ")).skip(1).collect();
    assert_eq!(data.len(), 4, "one line per count and cloud: {csv}");
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    for line in &data {
        let cells = csv_cells(line);
        assert_eq!(cells.len(), header.len(), "{line}");
        let plugin = &cells[col("cost_plugin")];
        assert_eq!(cells[col("cost_plugin_sha256")], sha(plugin), "{line}");
        // The numbers as computed, as JSON has them, not as the table rounds them.
        let gpus: u64 = cells[col("gpus")].parse().unwrap();
        let row = rows.iter().find(|r| r["gpus"].as_u64() == Some(gpus)).unwrap();
        // Within an ulp: serde_json reads floats without correct rounding (its
        // float_roundtrip feature is off), so 1052.0514013216819 in the CSV came back
        // from the JSON text as its neighbour 1052.051401321682.
        let (csv_days, json_days) = (cells[col("days")].parse::<f64>().unwrap(), row["days"].as_f64().unwrap());
        assert!((csv_days - json_days).abs() <= 4.0 * f64::EPSILON * json_days.abs(), "{csv_days} vs {json_days}: {line}");
    }
    for name in ["llama3.wasm", "bf16.wasm", "aws.wasm"] {
        let line = format!("{name} (contract 0.3.0): embedded, sha256 {}", sha(name));
        assert!(csv.lines().any(|l| l.starts_with("# plugin: ") && l.ends_with(&line)), "{line}\n{csv}");
    }
    // .html: one self-contained page with the charts, every cloud and each price's source.
    let o = runner(&dir, &["--plugin", "llama3", "--gpus", "16,32", "--cloud", "aws.wasm,lambda", "-o", "run.html", "-q"]);
    assert!(o.status.success());
    let html = std::fs::read_to_string(dir.join("run.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("<svg") && html.contains("Days to train"), "{html}");
    assert!(html.contains(&format!("aws.wasm sha256 {}", sha("aws.wasm"))), "price provenance in the page");
    assert!(!html.contains("src=") && !html.contains("href=") && !html.contains("<script"), "self-contained");
}

/// Clouds asked for by mistake are refused before anything runs: a region no cloud sells
/// in (it priced nothing, silently), the price-file reader as a cloud of its own (it
/// trapped), one cloud named twice (two equal columns); a run file's relative paths are
/// its directory's.
/// `-o -` and `-o /dev/stdout` print the file's format alone on stdout, valid JSON for a
/// pipe (the table followed it), with no file named `-` and no "wrote" line; a --format
/// that disagrees with the extension warns. Kills: `-` written as a file, /dev/stdout not
/// recognised as stdout, the warning dropped.
#[test]
fn an_output_that_is_stdout_prints_the_format_alone() {
    let dir = scratch("stdout");
    let explore = ["explore", "--model", "llama3-tiny", "--gpus", "8", "--precision", "bf16", "--no-history", "--format", "json"];
    for out in ["-", "/dev/stdout"] {
        let o = runner(&dir, &[&explore[..], &["-o", out]].concat());
        let (text, err) = text(&o);
        assert!(o.status.success(), "{err}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("-o {out}: {e}: {text}"));
        assert!(v["series"].is_array(), "-o {out}: {text}");
        assert!(!err.contains("wrote"), "-o {out}: {err}");
    }
    assert!(!dir.join("-").exists(), "a file named -");
    let o = runner(&dir, &[&explore[..], &["-q", "-o", "x.csv"]].concat());
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("warning: -o x.csv is written as JSON (--format), not the CSV its extension names"), "{err}");
    assert!(std::fs::read_to_string(dir.join("x.csv")).unwrap().starts_with('{'));
}

#[test]
fn clouds_and_regions_asked_for_by_mistake_are_refused() {
    let dir = scratch("clouds");
    let explore = ["explore", "--plugin", "llama3", "--variant", "llama3-tiny", "--gpus", "8", "--precision", "bf16", "--no-history", "-q"];
    for (extra, want) in [
        (vec!["--cloud", "aws", "--region", "us-east1"], "no cloud names region 'us-east1'; did you mean us-east-1?"),
        (vec!["--cloud", "aws", "--region", "antarctica"], "no cloud sells in region 'antarctica'; the regions are:\n  aws: "),
        // With every-region prices installed too (the default clouds), a typo is still one.
        (vec!["--region", "us-east1"], "no cloud names region 'us-east1'; did you mean us-east-1, us-east4 or us-east5?"),
        (vec!["--cloud", "price_file"], "pass the file with --price-file FILE"),
        (vec!["--cloud", "lambda,aws,lambda.wasm"], "the cloud lambda is named twice"),
        (vec!["--cloud", "lambda", "--tokens", "1000"], "1000 tokens to train are fewer than one step's 1024 (GBS 4 x sequence 256)"),
        (vec!["--cloud", "lambda", "--tokens", "1e6", "--gbs", "4096"], "1000000 tokens to train are fewer than one step's 1048576 (GBS 4096 x"),
        (vec!["--cloud", "aws", "--tp", "3"], "the layout fixed by the run (TP3) divides none of the GPU counts"),
    ] {
        let mut a = explore.to_vec();
        a.extend(extra);
        let o = runner(&dir, &a);
        assert!(!o.status.success() && text(&o).1.contains(want), "{a:?}: {}", text(&o).1);
    }
    // Lambda's one price holds in every region (`*`): a region AWS names prices both, in
    // any case.
    let mut a = explore.to_vec();
    a.extend(["--cloud", "lambda,aws", "--region", "US-East-1", "--format", "json"]);
    let o = runner(&dir, &a);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let costs = v["series"][0]["rows"][0]["costs"].as_array().unwrap();
    assert_eq!(costs.len(), 2, "{out}");
    assert!(costs.iter().all(|c| c.get("Quoted").is_some() || c["usd"].is_number()), "{costs:?}");
    assert!(costs.iter().any(|c| c["region"] == "us-east-1"), "{costs:?}");
    assert!(!out.contains("no cloud names it"), "{out}");
    // A region far from every named one, which only the every-region price answers, is
    // taken as meant: priced, and said so.
    let mut a = explore.to_vec();
    a.extend(["--cloud", "lambda,aws", "--region", "antarctica", "--format", "json"]);
    let o = runner(&dir, &a);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("region antarctica: no cloud names it, so only the every-region prices of lambda apply; the named regions are "), "{out}");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/run.toml"), "[model]\nplugin = \"llama3.wasm\"\n[cost]\nprice_file = \"ours.csv\"\n").unwrap();
    let o = runner(&dir, &["run", "sub/run.toml", "--no-history", "-q"]);
    assert!(!o.status.success() && text(&o).1.contains("price file sub/ours.csv"), "{}", text(&o).1);
}

/// Global flags mean the same to every command: a missing --profile is an error for
/// `models` too (it was ignored), as an explicit --device cuda without a GPU is
/// (tests/device.rs).
#[test]
fn a_missing_profile_is_an_error_for_every_command() {
    let dir = scratch("globals");
    let o = runner(&dir, &["models", "--profile", "missing.toml"]);
    assert!(!o.status.success() && text(&o).1.contains("--profile missing.toml: no such file"), "{}", text(&o).1);
    let o = runner(&dir, &["--device", "cpu", "plugins", "list"]);
    assert!(o.status.success(), "{}", text(&o).1);
}

#[test]
fn run_files_are_parsed_strictly() {
    let dir = scratch("runfile");
    std::fs::write(dir.join("ok.toml"), "[model]\nplugin = \"llama3.wasm\"\nvariant = \"llama3-tiny\"\n[cluster]\ngpus = [8]\n[cost]\nplugins = [\"aws\"]\n").unwrap();
    let o = runner(&dir, &["run", "ok.toml", "-q"]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(text(&o).0.contains("llama3-tiny"));

    std::fs::write(
        dir.join("typo.toml"),
        "[model]\nplugin = \"llama3.wasm\"\n[clustr]\ngpus = [8]\n",
    )
    .unwrap();
    let o = runner(&dir, &["run", "typo.toml"]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("clustr") && err.contains("line 3"), "{err}");

    std::fs::write(
        dir.join("variant.toml"),
        "[model]\nplugin = \"llama3.wasm\"\nvariant = \"llama9\"\n",
    )
    .unwrap();
    let o = runner(&dir, &["run", "variant.toml"]);
    let (_, err) = text(&o);
    assert!(
        err.contains("no variant 'llama9'") && err.contains("llama3.1-70b"),
        "{err}"
    );
}

#[test]
fn a_plugin_dropped_into_a_plugin_directory_is_found_and_shadows_the_embedded_one() {
    let dir = scratch("dropin");
    std::fs::create_dir_all(dir.join("plugins/dist")).unwrap();
    // The AWS price list, dropped in under a new name: available with no rebuild.
    std::fs::write(
        dir.join("plugins/dist/mycloud.wasm"),
        embedded_wasm("aws.wasm"),
    )
    .unwrap();
    std::fs::write(dir.join("plugins/dist/gcp.wasm"), embedded_wasm("aws.wasm")).unwrap();
    let o = runner(&dir, &["plugins", "list", "--format", "json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let entries = list.as_array().unwrap();
    let find = |name: &str, shadowed: bool| {
        entries
            .iter()
            .find(|e| e["name"] == name && e["shadowed"] == shadowed)
            .cloned()
    };
    let mine = find("mycloud.wasm", false).expect("dropped-in plugin is listed");
    assert_eq!(mine["kind"], "cost");
    assert!(
        mine["source"]["path"]
            .as_str()
            .unwrap()
            .ends_with("plugins/dist/mycloud.wasm"),
        "{mine}"
    );
    assert_eq!(mine["sha256"].as_str().unwrap().len(), 64);
    assert!(
        find("gcp.wasm", true).is_some(),
        "the embedded gcp is shadowed by the dropped-in one"
    );

    // $RUNNER_PLUGIN_PATH is searched too, after ./plugins/dist.
    let other = scratch("dropin-path");
    std::fs::write(other.join("extra.wasm"), embedded_wasm("lambda.wasm")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_runner"))
        .current_dir(&dir)
        .args(["plugins", "inspect", "extra"])
        .env("RUNNER_PLUGIN_PATH", &other)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(text(&o).0.contains("extra.wasm"));
}

/// A precision policy is planned for a B200 and for an H100: one that plans NVFP4 on every
/// GPU passed on the B200 alone and was then refused on every H100 in a run. `inspect`
/// labels the policy's name (it printed a header of nothing and `note: <name>`). Kills:
/// the H100 plan left out; the name back in a note.
#[test]
fn plugins_validate_plans_a_policy_for_an_h100_too_and_inspect_labels_its_name() {
    let dir = scratch("validate-h100");
    let o = runner(&dir, &["plugins", "validate", "bf16"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    for gpu in ["B200: every format native", "H100: no FP4 tensor cores"] {
        let row = out.lines().find(|l| l.contains(gpu)).unwrap_or_else(|| panic!("{gpu}: {out}"));
        assert!(row.contains("ok: weights in bf16"), "{row}");
    }
    // NVFP4 at every site: fine on a B200, a plan an H100 cannot run.
    let o = runner(&dir, &["plugins", "validate", test_program("contract_v02_precision.wasm")]);
    let (out, _) = text(&o);
    assert!(!o.status.success(), "{out}");
    let row = |gpu: &str| out.lines().find(|l| l.contains(gpu)).unwrap_or_else(|| panic!("{gpu}: {out}")).to_string();
    assert!(row("B200: every format native").contains("ok: weights in nvfp4"), "{out}");
    assert!(row("H100: no FP4 tensor cores").contains("FAILED"), "{out}");
    assert!(out.contains("nvfp4 is neither native nor emulated on H100"), "{out}");
    let o = runner(&dir, &["plugins", "inspect", "fp8"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[1].trim_end(), "policy name", "{out}");
    assert!(lines[3].starts_with("fp8"), "{out}");
    assert!(!out.contains("note:"), "{out}");
}

#[test]
fn plugins_validate_reports_each_call() {
    let dir = scratch("validate");
    std::fs::write(dir.join("cloud.wasm"), embedded_wasm("aws.wasm")).unwrap();
    let o = runner(&dir, &["plugins", "validate", "cloud.wasm"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    for call in ["provider", "offerings", "quote"] {
        assert!(out.contains(call), "{out}");
    }
    assert!(!out.contains("FAILED"), "{out}");
    let o = runner(&dir, &["plugins", "validate", "llama3"]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(text(&o).0.contains("graph llama3.1-405b"));
    // An offering on a GPU no profile describes is valid, but never quoted: said.
    let misbehave = runner::plugin::test_programs().iter().find(|(n, _)| *n == "misbehave_cost.wasm").map(|(_, p)| *p).unwrap();
    let o = runner(&dir, &["plugins", "validate", misbehave]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("ok: 12 instances, 1 never quoted, on GPUs no profile describes: exotic (H1000)"), "{out}");
    assert!(!runner(&dir, &["plugins", "validate", "cloud.wasm"]).stdout.windows(5).any(|w| w == b"never"));
}

/// A model plugin that fails (here: its first `describe` answers a TP of 3 on 8 GPUs) is
/// left out with its error, and every other plugin's models stay usable.
#[test]
fn a_broken_model_plugin_hides_no_other_model() {
    let dir = scratch("broken-model");
    std::fs::create_dir_all(dir.join("plugins/dist")).unwrap();
    let nonsense = runner::plugin::test_programs().iter().find(|(n, _)| *n == "nonsense_workload.wasm").map(|(_, p)| *p).unwrap();
    std::fs::copy(nonsense, dir.join("plugins/dist/nonsense_workload.wasm")).unwrap();
    let o = runner(&dir, &["models"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("llama3-tiny") && out.contains("left out nonsense_workload.wasm: ") && out.contains("tp"), "{out}");
    let o = runner(&dir, &["project", "--model", "llama3-tiny", "--gpus", "8", "--format", "json", "-q"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let o = runner(&dir, &["project", "--model", "no-such-model", "--gpus", "8"]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("llama3-tiny") && err.contains("which failed: plugin 'nonsense_workload.wasm'"), "{err}");
}

/// `models --format csv` carries the figures whole, as JSON does (a spreadsheet cannot
/// read 671.03B); the table rounds them.
#[test]
fn models_csv_carries_the_figures_json_does() {
    let dir = scratch("models-csv");
    let o = runner(&dir, &["models", "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    let json = v.as_array().unwrap().iter().find(|m| m["name"] == "llama3.1-8b").unwrap().clone();
    let o = runner(&dir, &["models", "--format", "csv"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let row = csv_cells(out.lines().find(|l| l.starts_with("llama3.1-8b,")).unwrap());
    assert_eq!(row[3], json["params_total"].to_string(), "{out}");
    assert_eq!(row[4], json["params_active"].to_string(), "{out}");
    assert_eq!(row[6].parse::<f64>().unwrap(), json["flops_per_token"].as_f64().unwrap(), "{out}");
    let o = runner(&dir, &["models"]);
    assert!(text(&o).0.contains("8.03B"), "{}", text(&o).0);
}

#[test]
fn leave_out_names_runs_it_cannot_take() {
    let dir = scratch("leave-out");
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../host/project/data/calibration.toml");
    for (spec, want) in [
        ("9999", "run 9999 is past the file's last run (117)"),
        ("5-3", "the range 5-3 runs backwards"),
        ("x", "'x' is not a run number"),
        ("0-117", "--leave-out 0-117 leaves none of the 118 runs of"),
    ] {
        let o = runner(&dir, &["calibrate", file.to_str().unwrap(), "--leave-out", spec]);
        assert!(!o.status.success() && text(&o).1.contains(want), "{spec}: {}", text(&o).1);
    }
}

/// A calibration file with no run to fit says where each run's reason is (`runner
/// validate`), with --gpu and without: it said only "has no supported run to fit". An
/// unknown --gpu is refused as unknown.
#[test]
fn calibrate_with_no_run_to_fit_points_at_validate() {
    let dir = scratch("calibrate-none");
    std::fs::write(
        dir.join("runs.toml"),
        "[[point]]\nsource = \"s\"\nmodel = \"llama3.1-8b\"\ngpu = \"H100\"\nnum_gpus = 64\nprecision = \"BF16\"\nseq_len = 8192\ngbs = 1024\nmbs = 1\ntp = 1\npp = 1\ncp = 2\nstep_time_s = 0\n",
    )
    .unwrap();
    for (args, want) in [
        (&[][..], "runs.toml has no supported run to fit; `runner validate runs.toml` gives each run's reason"),
        (&["--gpu", "b200"], "runs.toml: the file has no supported run on B200; `runner validate runs.toml` gives each run's reason"),
        (&["--gpu", "h999"], "--gpu: unknown GPU 'h999'"),
    ] {
        let o = runner(&dir, &[&["calibrate", "runs.toml", "-q"][..], args].concat());
        let err = text(&o).1;
        assert!(o.status.code() == Some(1) && err.contains(want), "{args:?}: {err}");
    }
}

/// A run file given to validate or calibrate says what they take and where a run file
/// goes: it said only "missing field `point`".
#[test]
fn a_run_file_given_to_validate_says_what_validate_takes() {
    let dir = scratch("validate-run-file");
    let run_file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../workloads/llama3-tiny-cpu.toml");
    for cmd in ["validate", "calibrate"] {
        let o = runner(&dir, &[cmd, run_file.to_str().unwrap(), "-q"]);
        let err = text(&o).1;
        assert!(
            o.status.code() == Some(1) && err.contains("missing field `point`\nhelp: a calibration file lists published runs as [[point]] tables") && err.contains("a run file ([model], [cluster]) goes to `runner run`"),
            "{cmd}: {err}"
        );
    }
}

/// calibrate's flags that the fit of FILE would drop are refused: --tier is a
/// --collectives run's (beside FILE it passed and was ignored), --leave-out a single
/// fit's (--holdout leaves out whole families).
#[test]
fn calibrate_refuses_flags_its_fit_would_drop() {
    let dir = scratch("calibrate-dropped");
    for (args, want) in [
        (&["--tier", "scale-up"][..], "'[FILE]' cannot be used with '--tier <TIER>'"),
        (&["--holdout", "--leave-out", "1"], "'--holdout' cannot be used with '--leave-out <RUNS>'"),
        (&["--holdout", "--precision", "fp8"], "the following required arguments were not provided:\n  --gpu <GPU>"),
    ] {
        let o = runner(&dir, &[&["calibrate", "runs.toml"][..], args].concat());
        let err = text(&o).1;
        assert!(o.status.code() == Some(2) && err.contains(want), "{args:?}: {err}");
    }
}

/// `measure --gbs` is refused: the rank graph it times is one micro-batch's, and the global
/// batch was taken and dropped without a word.
#[test]
fn measure_refuses_a_global_batch() {
    let dir = scratch("measure-gbs");
    let o = runner(&dir, &["--device", "cpu", "measure", "--model", "llama3-tiny", "--gpu", "h100", "--gbs", "7"]);
    let err = text(&o).1;
    assert!(!o.status.success() && err.contains("--gbs 7: measure times one micro-batch of the rank graph (--mbs)"), "{err}");
}

/// A GPU count given twice is refused, by one rule, on `search`, `explore` and in a run
/// file, before anything is projected: search searched it once and explore and run files
/// merged it into one row with a note, where other list flags (--gpu, --precision, bench
/// --sizes) refuse a repeat.
#[test]
fn a_repeated_gpu_count_is_refused_everywhere() {
    let dir = scratch("gpus-repeat");
    std::fs::write(dir.join("run.toml"), "[model]\nplugin = \"llama3.wasm\"\nvariant = \"llama3-tiny\"\n[cluster]\ngpus = [8, 16, 8]\n").unwrap();
    for (args, want) in [
        (&["search", "--model", "llama3-tiny", "--gpu", "h100", "--gpus", "8,16,8", "-q"][..], "--gpus gives 8 twice: each GPU count is one row; list it once"),
        (&["explore", "--model", "llama3-tiny", "--gpus", "8,8", "--no-history", "-q"], "error: --gpus gives 8 twice: each GPU count is one row; list it once"),
        (&["run", "run.toml", "--no-history", "-q"], "[cluster] gpus gives 8 twice"),
    ] {
        let o = runner(&dir, args);
        let (out, err) = text(&o);
        assert!(o.status.code() == Some(1) && err.contains(want) && out.is_empty(), "{args:?}: {err}");
    }
}

/// A value clap refuses is echoed with its terminal sequences escaped, as the run's own
/// errors echo it: clap printed it as typed (run by a terminal) or, on a pipe, stripped
/// it, so `show $'1\e[31m'` read as "invalid value '1'". A zero-width space or a bidi mark
/// alone is echoed escaped too (it was left as typed, the value reading as a valid one).
#[test]
fn a_refused_argument_echoes_its_escape_sequences_visibly() {
    let dir = scratch("clap-escape");
    for (args, want) in [
        (&["show", "1\u{1b}[31m"][..], "invalid value '1\\u{1b}[31m' for '<ID>'"),
        (&["project", "--model", "llama3-tiny", "--gpus", "8\u{1b}[2J"], "'8\\u{1b}[2J' is not a GPU count"),
        (&["explore", "--tokens", "x\u{9b}31m"], "'x\\u{9b}31m' is not a number"),
        (&["project", "--model", "llama3-tiny", "--gpus", "8\u{200b}"], "'8\\u{200b}' is not a GPU count"),
        (&["explore", "--tokens", "1e9\u{200f}"], "'1e9\\u{200f}' is not a number"),
    ] {
        let o = runner(&dir, args);
        let err = text(&o).1;
        assert!(
            o.status.code() == Some(2) && err.contains(want) && !err.contains(['\u{1b}', '\u{9b}', '\u{200b}', '\u{200f}']),
            "{args:?}: {err}"
        );
    }
}

/// -q with -v asks for no logging and more logging at once: refused (-q silently won),
/// wherever on the line either is given.
#[test]
fn quiet_and_verbose_together_are_refused() {
    let dir = scratch("quiet-verbose");
    for args in [&["-q", "-v", "models"][..], &["models", "-vv", "--quiet"]] {
        let o = runner(&dir, args);
        let err = text(&o).1;
        assert!(o.status.code() == Some(2) && err.contains("cannot be used with"), "{args:?}: {err}");
    }
}

/// The default run's flags before a subcommand are refused, not dropped.
#[test]
fn run_flags_before_a_subcommand_are_refused() {
    let dir = scratch("flag-before");
    for (args, want) in [
        (&["--plugin", "llama3.wasm", "models"][..], "--plugin before `models` is an option of the default run, not of `models`: `runner models` finds models among the installed plugins"),
        (&["--gpus", "8", "project", "--model", "llama3-tiny", "--gpus", "8"][..], "--gpus before `project`"),
        (&["--variant", "llama3-tiny", "explore"][..], "put it after `explore`: `runner explore --variant ...`"),
    ] {
        let o = runner(&dir, args);
        assert!(!o.status.success() && text(&o).1.contains(want), "{args:?}: {}", text(&o).1);
    }
    // Global flags are not the run's: they go anywhere.
    assert!(runner(&dir, &["-q", "models", "llama3-tiny"]).status.success());
}

/// --model names a variant, so --variant beside it is refused (the second silently won:
/// `--model llama3.1-8b --variant llama3.1-70b` projected the 70B); --variant over a run
/// file's plugin still replaces the file's variant.
#[test]
fn variant_beside_model_is_refused() {
    let dir = scratch("model-variant");
    let o = runner(&dir, &["explore", "--model", "llama3-tiny", "--variant", "llama3.1-70b", "--no-history", "-q"]);
    let err = text(&o).1;
    assert!(o.status.code() == Some(2) && err.contains("'--model <MODEL>' cannot be used with '--variant <VARIANT>'"), "{err}");
    std::fs::write(dir.join("r.toml"), "[model]\nplugin = \"llama3.wasm\"\nvariant = \"llama3.1-70b\"\n[cluster]\ngpus = [8]\n[precision]\nformat = \"bf16\"\n[cost]\nplugins = [\"aws\"]\n").unwrap();
    let o = runner(&dir, &["run", "r.toml", "--variant", "llama3-tiny", "--no-history", "-q"]);
    assert!(o.status.success() && text(&o).0.starts_with("llama3-tiny "), "{}", text(&o).1);
}

/// The shipped efficiency tables are what the command their header names writes: a change
/// to the model or the data that moves the fit fails here until the tables are refitted.
#[test]
fn the_shipped_efficiencies_are_the_fit_their_header_names() {
    let dir = scratch("refit");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let shipped_text = std::fs::read_to_string(root.join("host/project/data/efficiency.toml")).unwrap();
    assert!(shipped_text.contains("runner calibrate host/project/data/calibration.toml --leave-out 40,54,104-108"), "{shipped_text}");
    let o = runner(
        &root,
        &["calibrate", "host/project/data/calibration.toml", "--leave-out", "40,54,104-108", "-o", dir.join("fit.toml").to_str().unwrap(), "-q"],
    );
    assert!(o.status.success(), "{}", text(&o).1);
    let shipped: toml::Table = shipped_text.parse().unwrap();
    let fitted: toml::Table = std::fs::read_to_string(dir.join("fit.toml")).unwrap().parse().unwrap();
    // Every number alike to 1e-4 (another CPU's SIMD may move the last bits), the
    // labels aside.
    fn same(a: &toml::Value, b: &toml::Value, at: &str) {
        match (a, b) {
            (toml::Value::Table(x), toml::Value::Table(y)) => {
                let (kx, ky): (Vec<_>, Vec<_>) = (x.keys().filter(|k| *k != "fitted").collect(), y.keys().filter(|k| *k != "fitted").collect());
                assert_eq!(kx, ky, "{at}");
                for k in kx {
                    same(&x[k], &y[k], &format!("{at}.{k}"));
                }
            }
            (toml::Value::Array(x), toml::Value::Array(y)) => {
                assert_eq!(x.len(), y.len(), "{at}");
                for (i, (p, q)) in x.iter().zip(y).enumerate() {
                    same(p, q, &format!("{at}[{i}]"));
                }
            }
            (toml::Value::Float(x), toml::Value::Float(y)) => assert!((x - y).abs() <= 1e-4 * x.abs().max(1e-9), "{at}: shipped {x}, refitted {y}"),
            _ => assert_eq!(a, b, "{at}"),
        }
    }
    same(&toml::Value::Table(shipped), &toml::Value::Table(fitted), "efficiency.toml");
}

/// A plugin that calls itself another cloud is not shown as a second column of that cloud.
#[test]
fn two_cost_plugins_under_one_provider_name_are_refused() {
    let dir = scratch("impostor");
    std::fs::create_dir_all(dir.join("plugins/dist")).unwrap();
    std::fs::write(dir.join("plugins/dist/cheapaws.wasm"), embedded_wasm("aws.wasm")).unwrap();
    let explore = ["explore", "--plugin", "llama3", "--variant", "llama3-tiny", "--gpus", "8", "--precision", "bf16", "--no-history", "-q"];
    let mut a = explore.to_vec();
    a.extend(["--cloud", "aws,cheapaws"]);
    let o = runner(&dir, &a);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("the cost plugins aws.wasm and cheapaws.wasm both call themselves 'aws'"), "{err}");
    // Among the installed clouds, the second is skipped with a note.
    let mut a = explore.to_vec();
    a.extend(["--format", "json"]);
    let o = runner(&dir, &a);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    // The embedded aws.wasm keeps the name, though the plugin directory's file loads first.
    assert!(out.contains("skipped a cloud: the cost plugins aws.wasm and cheapaws.wasm both call themselves 'aws': aws.wasm prices it, and cheapaws.wasm is left out"), "{out}");
    assert!(!out.contains("\"plugin\": \"cheapaws.wasm\""), "{out}");
}

#[test]
fn unknown_plugin_says_where_it_looked() {
    let dir = scratch("unknown");
    let o = runner(&dir, &["--plugin", "nosuch.wasm"]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("no plugin 'nosuch.wasm'")
            && err.contains("plugins/dist")
            && err.contains("llama3.wasm"),
        "{err}"
    );
    // A broken file that hides the embedded plugin of its name is named where the model
    // it should have provided is not found.
    std::fs::create_dir_all(dir.join("plugins/dist")).unwrap();
    std::fs::write(dir.join("plugins/dist/llama3.wasm"), b"not a component").unwrap();
    let o = runner(&dir, &["project", "--model", "llama3.1-8b", "--gpus", "8"]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("failed to load and hide") && err.contains("'llama3.wasm'"), "{err}");
}

#[test]
fn models_lists_every_variant_with_counts() {
    let dir = scratch("models");
    let o = runner(&dir, &["models", "--format", "json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = rows.as_array().unwrap();
    for name in [
        "llama3.1-405b",
        "gpt3-175b",
        "mixtral-8x7b",
        "deepseek-v3-671b",
        "qwen3-30b-a3b",
        "gpt-oss-120b",
        "grok1-314b",
        "llama4-maverick-400b",
        "nemotron4-340b",
        "nemotron-h-56b",
        "nemotron-3-nano-30b",
        "nemotron-3-super-120b",
        "llama3-tiny",
    ] {
        let r = rows
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert!(r["params_total"].as_u64().unwrap() >= r["params_active"].as_u64().unwrap());
        assert!(r["flops_per_token"].as_f64().unwrap() > 0.0);
    }
    let o = runner(&dir, &["models", "llama3.1-70b"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("H100") && out.contains("tp"), "{out}");
    assert!(
        out.contains(
            "note: plugin: workload plugin llama3.wasm (contract 0.3.0): embedded, sha256 "
        ),
        "{out}"
    );
}

#[test]
fn every_subcommand_has_help_with_examples() {
    // Walked from the binary's own help, so a subcommand added later is covered too.
    let dir = scratch("help");
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    let mut seen = 0;
    while let Some(path) = todo.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let o = runner(&dir, &args);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args:?}: {err}");
        assert!(out.contains("Examples:"), "{args:?} has no examples");
        // Each example on one line of clap's help (100 columns at most), to be copied
        // whole: one cut there (`... -o` / `  report.html`, indented like an example)
        // copied as `-o` with no value. Every example runs the runner; only a note after
        // a command ("   (...)") may wrap.
        let examples = out[out.find("Examples:").unwrap()..].lines().skip(1).take_while(|l| !l.trim().is_empty());
        let mut prev = "";
        for line in examples {
            let note = line.trim_start().starts_with('(') || prev.contains("   (");
            assert!(line.contains("runner") || note, "{args:?}: an example wraps after '{prev}': '{line}'");
            prev = line;
        }
        seen += 1;
        let Some(start) = out.find("\nCommands:\n") else { continue };
        for line in out[start + 11..].lines().take_while(|l| !l.trim().is_empty()) {
            // A command's line starts two spaces in; its description's wrapped lines further.
            if let Some(name) = line.strip_prefix("  ").filter(|l| !l.starts_with(' ')).and_then(|l| l.split_whitespace().next())
                && name != "help"
            {
                let mut next = path.clone();
                next.push(name.to_string());
                todo.push(next);
            }
        }
    }
    assert!(seen >= 25, "only {seen} commands walked");
}

/// On a dense model the expert flags changed nothing, unsaid (--fused-grouped-mlp even
/// labelled the layout FUSED-MLP): refused, as --etp is, by project, search and run files.
#[test]
fn expert_flags_on_a_dense_model_are_refused() {
    let dir = scratch("dense-moe-flags");
    for (cmd, flag) in [("project", &["--fused-grouped-mlp"][..]), ("project", &["--dispatcher", "flex"]), ("search", &["--no-ep-overlap"])] {
        let o = runner(&dir, &[&[cmd, "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "-q"][..], flag].concat());
        let err = text(&o).1;
        assert!(!o.status.success() && err.contains(&format!("{} applies to the routed experts of a mixture-of-experts model; llama3.1-8b has none", flag[0])), "{cmd} {flag:?}: {err}");
    }
    // And a run file's [layout] keys, which the explorer's layouts showed as FUSED-MLP.
    for key in ["fused_grouped_mlp = true", "dispatcher = \"alltoall\""] {
        std::fs::write(dir.join("r.toml"), format!("[model]\nplugin = \"llama3.wasm\"\nvariant = \"llama3-tiny\"\n[cluster]\ngpus = [8]\n[precision]\nformat = \"bf16\"\n[cost]\nplugins = [\"aws\"]\n[layout]\n{key}\n")).unwrap();
        let o = runner(&dir, &["run", "r.toml", "--no-history", "-q"]);
        let err = text(&o).1;
        let name = key.split(' ').next().unwrap();
        assert!(!o.status.success() && err.contains(&format!("[layout] {name} applies to the routed experts of a mixture-of-experts model; llama3-tiny has none")), "{key}: {err}");
    }
}

/// `runner project` says how its MFU counts (F5): the convention (in JSON and in the one
/// note `explore` prints too), the peak it divides by (FP8's for an FP8 plan), and the MFU
/// NVIDIA's DGX Cloud READMEs would print for the same speed, attention over all keys. By
/// hand for Llama 3.1 70B at seq 8192 (80 layers, h 8192, 128,256-token vocabulary, the
/// input table a lookup): 6·(70.554e9 − 1.0507e9) + 6·80·8192·8192 = 449.2 GFLOP a token
/// causal, plus as much attention again over all keys: 481.4, a factor of 1.0717 (the
/// READMEs' 3.94e15 a sequence is 481 GFLOP a token).
#[test]
fn project_says_its_flop_convention_and_nvidias_mfu() {
    let dir = scratch("project-mfu");
    let args = |precision: &'static str| {
        ["project", "--model", "llama3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--gbs", "128", "--precision", precision]
    };
    let o = runner(&dir, &[&args("bf16")[..], &["--format", "json", "-q"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let (mfu, all) = (v["mfu"].as_f64().unwrap(), v["mfu_all_keys"].as_f64().unwrap());
    let (embedding, params) = (128_256.0 * 8192.0, 70.554e9);
    let attention = 6.0 * 80.0 * 8192.0 * 8192.0;
    let causal = 6.0 * (params - embedding) + attention;
    let by_hand = (causal + attention) / causal;
    assert!((all / mfu / by_hand - 1.0).abs() < 1e-3, "{all} / {mfu} against {by_hand} by hand");
    assert!(v["flop_convention"].as_str().unwrap().contains("causal T/2"), "{out}");
    assert_eq!((v["mfu_peak_format"].as_str(), v["mfu_peak_tflops"].as_f64()), (Some("BF16"), Some(989.0)));
    let note = v["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).find(|n| n.starts_with("FLOPs: ")).unwrap_or_else(|| panic!("{out}"));
    assert!(note.contains("7.2 % higher at seq 8192"), "{note}");
    // An FP8 plan's MFU is against the FP8 peak, and the table says so beside the figure.
    let o = runner(&dir, &[&args("fp8")[..], &["--format", "json", "-q"]].concat());
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!((v["mfu_peak_format"].as_str(), v["mfu_peak_tflops"].as_f64()), (Some("FP8"), Some(1979.0)));
    let o = runner(&dir, &[&args("fp8")[..], &["-q"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.lines().any(|l| l.starts_with("  of the dense peak") && l.ends_with("FP8 1979 TFLOP/s")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("  attention over all keys") && l.trim_end().ends_with(&format!("{:.1} %", 100.0 * v["mfu_all_keys"].as_f64().unwrap()))), "{out}");
}

/// `runner project`'s JSON object carries the fields scripts read, fills omitted layout
/// flags from the published layout, and refuses what cannot run with the reason.
#[test]
fn project_prints_one_object_and_refuses_what_cannot_run() {
    let dir = scratch("project");
    let o = runner(
        &dir,
        &["project", "--model", "llama3.1-70b", "--gpu", "H100", "--gpus", "64", "--precision", "fp8", "--format", "json", "-q"],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for field in ["step_time_s", "tokens_per_sec_per_gpu", "model_tflops_per_gpu", "mfu", "memory_per_gpu_gib", "fits", "layout", "breakdown"] {
        assert!(!v[field].is_null(), "{field} missing: {out}");
    }
    assert_eq!((v["layout"]["tp"].as_u64(), v["layout"]["pp"].as_u64(), v["layout"]["cp"].as_u64()), (Some(4), Some(4), Some(2)));
    for part in ["compute", "tp", "cp", "ep", "pp", "dp", "bubble", "optimizer", "recompute"] {
        assert!(v["breakdown"][part].is_number(), "breakdown.{part}: {out}");
    }
    let sum: f64 = v["breakdown"].as_object().unwrap().values().filter_map(|x| x.as_f64()).sum();
    assert!((sum - v["step_time_s"].as_f64().unwrap()).abs() < 1e-9);
    let parts = &v["breakdown"]["compute_parts"];
    let inside = parts["gemm"].as_f64().unwrap() + parts["attention"].as_f64().unwrap();
    assert_eq!(parts["scan"].as_f64(), Some(0.0), "Llama has no Mamba scans: {out}");
    assert!(inside > 0.0 && inside <= v["breakdown"]["compute"].as_f64().unwrap(), "compute_parts: {out}");
    // Explicit flags win; GPU names are case-insensitive.
    let o = runner(&dir, &["project", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "16", "--tp", "2", "--pp", "1", "--gbs", "64", "--format", "json", "-q"]);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(v["layout"]["tp"].as_u64(), Some(2));
    assert_eq!(v["layout"]["gbs"].as_u64(), Some(64));
    // A published layout that cannot hold the batch asked for gives way to the search,
    // which says so (it was refused with the published layout's reason).
    let o = runner(&dir, &["project", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "64", "--gbs", "1", "--format", "json", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["layout"]["dp"].as_u64(), Some(1), "{out}");
    assert!(v["layout_from"].as_str().unwrap().contains("search"), "{out}");
    assert!(v["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("does not apply: GBS 1")), "{out}");
    // Flags that make the published layout not fit are named as the user's, not as the
    // published layout (TP1 PP1 of Llama 70B on 80 GB needs some 367 GiB).
    let o = runner(&dir, &["project", "--model", "llama3.1-70b", "--gpu", "h100", "--gpus", "64", "--tp", "1", "--pp", "1", "--format", "json", "-q"]);
    let out = text(&o).0;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().starts_with("the published layout with the flags given (TP1 PP1")), "{out}");
    // So is any other flag that stops it fitting: `--recompute none` keeps the layernorm
    // recompute the 405B's published layout needs at 256 H100s from being added (the flags
    // were once listed by hand, without --recompute).
    let o = runner(&dir, &["project", "--model", "llama3.1-405b", "--gpu", "h100", "--gpus", "256", "--recompute", "none", "--format", "json", "-q"]);
    let out = text(&o).0;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().starts_with("the published layout with the flags given (TP8 PP8 CP2 VP8")), "{out}");
    // At 16x the published sequence the published layout (measured at 8192) is not taken
    // and its batch rule keeps its tokens per step: 1024 sequences become 64.
    let o = runner(&dir, &["project", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "64", "--seq-len", "131072", "--format", "json", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["layout"]["gbs"].as_u64(), Some(64), "{out}");
    assert!(v["fits"].as_bool().unwrap() && v["layout_from"].as_str().unwrap().contains("another sequence length"), "{out}");
    // A published layout that does not fit gives way to a search that finds one.
    let o = runner(&dir, &["project", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "262144", "--format", "json", "-q"]);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert!(v["fits"].as_bool().unwrap(), "{}", text(&o).0);
    // Selective recompute of the modules named as Megatron names them: their forward is
    // repeated in the backward.
    let o = runner(
        &dir,
        &["project", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "1", "--pp", "1", "--gbs", "64", "--recompute", "selective", "--recompute-modules", "mlp,layernorm", "--format", "json", "-q"],
    );
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(v["layout"]["recompute_modules"], serde_json::json!(["layernorm", "mlp"]));
    assert!(v["breakdown"]["recompute"].as_f64().unwrap() > 0.0, "{v}");
    // A published layout's own recompute is projected (the 2022 Megatron runs' selective
    // recompute of the attention core); `--recompute none` drops it.
    let a100 = ["project", "--model", "megatron-gpt-22b", "--gpu", "a100-80gb", "--gpus", "8", "--format", "json", "-q"];
    let v: serde_json::Value = serde_json::from_str(&text(&runner(&dir, &a100)).0).unwrap();
    assert_eq!((v["layout"]["recompute"].as_str(), &v["layout"]["recompute_modules"]), (Some("selective"), &serde_json::json!(["core_attn"])), "{v}");
    assert!(v["breakdown"]["recompute"].as_f64().unwrap() > 0.0, "{v}");
    let v: serde_json::Value = serde_json::from_str(&text(&runner(&dir, &[&a100[..], &["--recompute", "none"]].concat())).0).unwrap();
    assert_eq!((v["layout"]["recompute"].as_str(), v["breakdown"]["recompute"].as_f64()), (Some("none"), Some(0.0)), "{v}");
    // A LoRA fine-tune of the same layout: faster, no optimizer state for the frozen
    // base, and said so.
    let base = ["project", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "1", "--pp", "1", "--gbs", "64", "--format", "json", "-q"];
    let full: serde_json::Value = serde_json::from_str(&text(&runner(&dir, &base)).0).unwrap();
    let o = runner(&dir, &[&base[..], &["--peft", "lora", "--lora-rank", "16"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let lora: serde_json::Value = serde_json::from_str(&out).unwrap();
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    assert!(f(&lora, "step_time_s") < f(&full, "step_time_s"), "{out}");
    assert!(lora["memory"]["optimizer"].as_f64().unwrap() < 0.02 * full["memory"]["optimizer"].as_f64().unwrap(), "{out}");
    assert!(lora["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("rank-16 adapters")), "{out}");
    // Adapters on q, k and v alone (NVIDIA's LoRA performance configs): faster still.
    let o = runner(&dir, &[&base[..], &["--peft", "lora", "--lora-rank", "16", "--lora-targets", "qkv"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let qkv: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(f(&qkv, "step_time_s") < f(&lora, "step_time_s"), "{out}");
    assert!(qkv["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("the q, k and v linears")), "{out}");
    // Activation offload: less activation memory, the copies in the breakdown.
    let o = runner(&dir, &[&base[..], &["--offload-layers", "8"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let off: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(off["layout"]["offload_layers"].as_u64(), Some(8), "{out}");
    assert!(off["breakdown"]["offload"].as_f64().unwrap() > 0.0, "{out}");
    assert!(off["memory"]["activations"].as_f64().unwrap() < 0.8 * full["memory"]["activations"].as_f64().unwrap(), "{out}");
    // Muon: 8 B of state a layer weight for AdamW's 12, the embedding and the output
    // layer (2 x 128256 x 4096, and the final norm) left on AdamW; said in the layout.
    let o = runner(&dir, &[&base[..], &["--optimizer", "muon"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let muon: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(muon["layout"]["optimizer"].as_str(), Some("muon"), "{out}");
    let opt = |v: &serde_json::Value| v["memory"]["optimizer"].as_f64().unwrap();
    let layers = 32.0 * (2.0 * 4096.0 * 4096.0 + 2.0 * 1024.0 * 4096.0 + 3.0 * 14336.0 * 4096.0 + 2.0 * 4096.0);
    let side = 2.0 * 128256.0 * 4096.0 + 4096.0;
    let ratio = (8.0 * layers + 12.0 * side) / (12.0 * (layers + side));
    assert!((opt(&muon) / opt(&full) / ratio - 1.0).abs() < 1e-6, "{ratio}: {out}");
    // The routed experts' MLP fused (NVIDIA's 26.06 MoE presets): faster, said in the layout.
    let moe = ["project", "--model", "qwen3-30b-a3b", "--gpu", "b200", "--gpus", "8", "--tp", "1", "--pp", "1", "--ep", "8", "--precision", "mxfp8", "--format", "json", "-q"];
    let unfused: serde_json::Value = serde_json::from_str(&text(&runner(&dir, &moe)).0).unwrap();
    let o = runner(&dir, &[&moe[..], &["--fused-grouped-mlp"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let fused: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(fused["layout"]["fused_grouped_mlp"].as_bool(), Some(true), "{out}");
    assert_eq!(unfused["layout"]["fused_grouped_mlp"].as_bool(), Some(false));
    assert!(f(&fused, "step_time_s") < f(&unfused, "step_time_s"), "{out}");
    // The expert dispatcher: across nodes, Megatron's plain alltoall sends a copy per
    // expert (slower than flex), said in the layout.
    let across = ["project", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--gpus", "16", "--tp", "1", "--pp", "1", "--ep", "16", "--precision", "fp8", "--format", "json", "-q"];
    let flex: serde_json::Value = serde_json::from_str(&text(&runner(&dir, &across)).0).unwrap();
    let o = runner(&dir, &[&across[..], &["--dispatcher", "alltoall"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let plain: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plain["layout"]["dispatcher"].as_str(), Some("alltoall"), "{out}");
    assert_eq!(flex["layout"]["dispatcher"].as_str(), Some("flex"));
    assert!(f(&plain, "step_time_s") > f(&flex, "step_time_s"), "{out}");
    // The all-to-all exposed (Megatron's default, which project could not ask for) is
    // slower than overlapped, in project and in the search alike.
    let o = runner(&dir, &[&across[..], &["--no-ep-overlap"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let exposed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((exposed["layout"]["ep_overlap"].as_bool(), flex["layout"]["ep_overlap"].as_bool()), (Some(false), Some(true)), "{out}");
    assert!(f(&exposed, "step_time_s") > f(&flex, "step_time_s"), "{out}");
    let o = runner(&dir, &["search", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--gpus", "16", "--ep", "16", "--no-ep-overlap", "--top", "3", "--format", "json", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let found: serde_json::Value = serde_json::from_str(&out).unwrap();
    let best = found[0]["best"].as_array().unwrap();
    assert!(!best.is_empty() && best.iter().all(|p| p["layout"]["ep_overlap"] == false), "{out}");
    // NeMo 25.04's DeepSeek-V3 run on 1024 H100s (calibration row 36): its published layout
    // alone is priced with flex and the overlap, and says so; with the run's dispatcher,
    // overlap and split given, project gives the step `runner validate` projects for it.
    let dsv3 = ["project", "--model", "deepseek-v3-671b", "--gpu", "h100", "--gpus", "1024", "--format", "json", "-q"];
    let (out, _) = text(&runner(&dir, &dsv3));
    assert!(out.contains("gives no token dispatcher or expert all-to-all overlap"), "{out}");
    let o = runner(&dir, &[&dsv3[..], &["--dispatcher", "alltoall", "--no-ep-overlap", "--pp", "16", "--pipeline-layout", "Et*3|(t*4|)*14t*2mL"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let run: serde_json::Value = serde_json::from_str(&out).unwrap();
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../host/project/data/calibration.toml");
    let (out, err) = text(&runner(&dir, &["validate", file.to_str().unwrap(), "--format", "json", "-q"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {err}"));
    let row = v["checked"].as_array().unwrap().iter().find(|c| c["index"] == 36).expect("row 36 projected");
    let (a, b) = (f(&run, "step_time_s"), f(row, "predicted_step_s"));
    assert!((a / b - 1.0).abs() < 1e-9, "project {a} s, validate {b} s");
    // FP8 asked for on 64 H100s takes Llama 3 70B's published Megatron-Bridge layout,
    // which those tables call FP8 and which runs current scaling (TP4 PP8 VP5), over a
    // delayed-scaling layout published for another GPU count.
    let o = runner(&dir, &["project", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--precision", "fp8", "--format", "json", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let l: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((l["layout"]["tp"].as_u64(), l["layout"]["pp"].as_u64(), l["layout"]["vp"].as_u64()), (Some(4), Some(8), Some(5)), "{out}");
    for (args, want) in [
        (vec!["--model", "llama3.1-8b", "--gpus", "8", "--peft", "qlora"], "invalid value 'qlora'"),
        (vec!["--model", "llama3.1-8b", "--gpus", "8", "--peft", "lora", "--lora-rank", "0"], "--lora-rank"),
        (vec!["--model", "llama3.1-8b", "--gpus", "8", "--lora-rank", "8"], "add --peft lora"),
        (vec!["--model", "llama3.1-8b", "--gpus", "8", "--lora-targets", "qkv"], "add --peft lora"),
        (vec!["--model", "llama3.1-8b", "--gpus", "8", "--optimizer", "sgd"], "invalid value 'sgd'"),
        (vec!["--model", "llama3.1-8b", "--gpus", "8", "--tp", "1", "--pp", "1", "--fsdp", "--optimizer", "muon"], "layer-wise"),
        (vec!["--model", "llama3.1-8b", "--gpus", "8", "--peft", "lora", "--lora-targets", "mlp"], "invalid value 'mlp'"),
        (vec!["--model", "llama3.1-8b", "--gpus", "8", "--peft", "lora", "--lora-rank", "5000"], "use a rank of at most 1024"),
        (vec!["--model", "llama3.1-8b", "--gpus", "8", "--recompute-modules", "mlp"], "add --recompute selective"),
        (vec!["--model", "llama3.1-8b", "--gpus", "8", "--recompute-layers", "2"], "add --recompute full"),
        (vec!["--model", "llama3.1-8b", "--gpus", "8", "--recompute", "selective", "--recompute-layers", "2"], "add --recompute full"),
        (vec!["--model", "llama3.1-8b", "--gpus", "8", "--recompute", "selective", "--recompute-modules", "experts"], "unknown recompute module 'experts'"),
        (vec!["--model", "llama3.1-70b", "--gpu", "h100", "--gpus", "64", "--precision", "nvfp4"], "no nvfp4"),
        (vec!["--model", "llama3.1-70b", "--gpu", "v100", "--gpus", "64"], "unknown GPU 'v100'"),
        (vec!["--model", "llama9", "--gpus", "64"], "no installed workload plugin provides 'llama9'"),
        (vec!["--model", "llama3.1-70b", "--gpus", "64", "--precision", "int8"], "unknown precision 'int8'"),
        (vec!["--model", "llama3.1-70b", "--gpus", "48", "--tp", "4", "--pp", "4", "--cp", "2"], "does not divide"),
        (vec!["--model", "llama3.1-8b", "--gpus", "64", "--pipeline-layout", "Ett|ttL"], "give --pp"),
        (vec!["--model", "llama3.1-8b", "--gpus", "64", "--pp", "4", "--pipeline-layout", "Et*4|(t*4|)*14tmL"], "places 61 transformer layers; the model has 32"),
        (vec!["--model", "llama3.1-8b", "--gpus", "64", "--pp", "3", "--pipeline-layout", "Et*8|(t*8|)*2t*8L"], "not a multiple of --pp 3"),
        (vec!["--model", "llama3.1-8b", "--gpus", "64", "--pp", "2", "--vp", "4", "--pipeline-layout", "Et*16|t*16L"], "that is --vp 1, not 4"),
        (vec!["--model", "llama3.1-8b", "--gpus", "64", "--pp", "4", "--pipeline-layout", "Et*8|t*10|t*6|t*8L"], "not an even split"),
        (vec!["--model", "llama3.1-8b", "--gpus", "64", "--pp", "2", "--pipeline-layout", "Et*16|t*16L", "--account-for-loss-in-pipeline-split"], "cannot be used with"),
    ] {
        let mut a = vec!["project"];
        a.extend(args);
        let o = runner(&dir, &a);
        let (_, err) = text(&o);
        assert!(!o.status.success() && err.contains(want), "{a:?}: {err}");
    }
    // 128 chunks of the 405B's 126 layers: without a split given, the one Megatron's
    // flags build (the embedding and the loss counted as a layer each, as Megatron-Bridge's
    // recipe), so no layout string is needed.
    let o = runner(&dir, &["project", "--model", "llama3.1-405b", "--gpu", "gb200", "--gpus", "256", "--tp", "4", "--pp", "16", "--vp", "8", "--mbs", "1", "--gbs", "1536", "--format", "json", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let split = (v["layout"]["split"]["embedding"].as_u64(), v["layout"]["split"]["loss"].as_u64());
    assert_eq!((v["layout"]["pp"].as_u64(), v["layout"]["vp"].as_u64(), split), (Some(16), Some(8), (Some(1), Some(1))), "{out}");
    assert!(v.get("pipeline_model_parallel_layout").is_none(), "{out}");
    // 80 layers over PP2 VP12 (24 chunks, uneven): priced as asked, with the layout
    // string Megatron needs for it, which reads back as the same split.
    let o = runner(&dir, &["project", "--model", "llama3.1-70b", "--gpu", "h100", "--gpus", "64", "--tp", "4", "--pp", "2", "--vp", "12", "--format", "json", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let layout = v["pipeline_model_parallel_layout"].as_str().unwrap_or_else(|| panic!("no layout string: {out}"));
    assert_eq!(layout, "Et*4|(t*4|)*7(t*3|)*15t*3L");
    assert!(v["notes"].to_string().contains("pipeline_model_parallel_layout"), "{out}");
    // tp 8 over Qwen3-30B-A3B's 4 kv heads: priced as asked (kv heads replicated), with a
    // note that Megatron-Core cannot build it; tp 4 gets no such note.
    for (tp, warned) in [("8", true), ("4", false)] {
        let o = runner(&dir, &["project", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--gpus", "64", "--tp", tp, "--ep", "8", "--gbs", "256", "--format", "json", "-q"]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{err}");
        let notes = serde_json::from_str::<serde_json::Value>(&out).unwrap()["notes"].to_string();
        assert_eq!(notes.contains("exceeds the 4 kv heads") && notes.contains("replicated on 2 tp ranks"), warned, "tp={tp}: {notes}");
    }
}

/// Megatron's pipeline split options: Llama 3.1 405B's 126 layers over PP16 VP8 run
/// only with the embedding and the loss counted as layers (Megatron-Bridge's 405B
/// recipe), and DeepSeek-V3's layout string sets vp and takes layers off the last stage.
#[test]
fn a_tiny_models_table_shows_its_figures_not_zeros() {
    // A tiny model's step is a fraction of a millisecond and its weights a few MiB: fixed
    // decimals would print every row as 0.000 s and 0.0 GiB.
    let dir = scratch("project-tiny");
    let o = runner(&dir, &["project", "--model", "llama3-tiny", "--gpu", "b300", "--gpus", "8"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let row = |name: &str| out.lines().find(|l| l.trim_start().starts_with(name)).unwrap_or_else(|| panic!("no {name} row in {out}")).to_string();
    for name in ["step time", "weights / grads / optimizer", "compute", "GEMMs"] {
        let r = row(name);
        let shown: Vec<f64> = r.split(|c: char| !(c.is_ascii_digit() || c == '.')).filter_map(|w| w.parse().ok()).collect();
        assert!(!shown.is_empty() && shown.iter().all(|&x| x > 0.0), "{name}: {r}");
    }
}

#[test]
fn project_takes_megatrons_pipeline_split() {
    let dir = scratch("pipeline-split");
    let base = ["project", "--model", "llama3.1-405b", "--gpu", "gb200", "--gpus", "256", "--precision", "mxfp8", "--tp", "4", "--pp", "16", "--vp", "8", "--mbs", "1", "--gbs", "1536", "--format", "json", "-q"];
    let o = runner(&dir, &[&base[..], &["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["layout"]["split"], serde_json::json!({"embedding": 1, "loss": 1}), "{out}");
    let o = runner(&dir, &["project", "--model", "deepseek-v3-671b", "--gpu", "gb300", "--gpus", "256", "--precision", "mxfp8", "--tp", "1", "--pp", "4", "--ep", "64", "--mbs", "1", "--gbs", "4096", "--pipeline-layout", "Et*4|(t*4|)*14tmL", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("PP4 VP4") && out.contains("E0L3"), "{out}");
    // The search keeps a split given in the labels' notation, and tries both otherwise.
    let o = runner(&dir, &["search", "--model", "llama3.1-70b", "--gpus", "64", "--pp", "4", "--pipeline-split", "E1L1", "--top", "3", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let rows: Vec<&str> = out.lines().filter(|l| l.trim_start().starts_with("64")).collect();
    assert!(!rows.is_empty() && rows.iter().all(|l| l.contains("E1L1")), "{out}");
    let o = runner(&dir, &["explore", "--model", "llama3.1-70b", "--gpus", "64", "--tp", "4", "--pp", "4", "--cp", "2", "--vp", "5", "--pipeline-split", "even", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success() && out.contains("TP4 PP4 CP2 VP5 ") && !out.contains("E1L1"), "{out}{err}");
    // An absurd split is refused per layout, not a u32 overflow in the search.
    let o = runner(&dir, &["search", "--model", "llama3.1-8b", "--gpus", "64", "--pipeline-split", "E4294967295L4294967295", "-q"]);
    assert!(o.status.success() && text(&o).0.contains("counts as 4294967295 layers"), "{}{}", text(&o).0, text(&o).1);
    let o = runner(&dir, &["explore", "--model", "llama3.1-70b", "--gpus", "64", "--pipeline-split", "balanced", "-q"]);
    assert!(!o.status.success() && text(&o).1.contains("use even or E<n>L<m>"), "{}", text(&o).1);
}

/// `--pipeline-schedule dualpipe` reaches the projection and the search: DeepSeek-V3's
/// own layout on H800 runs under DualPipe (said in the layout and the JSON), a virtual
/// pipeline is refused by name, and the search keeps the schedule in every layout it ranks.
#[test]
fn project_and_search_take_the_dualpipe_schedule() {
    let dir = scratch("dualpipe");
    let base = ["project", "--model", "deepseek-v3-671b", "--gpu", "h800", "--gpus", "2048", "--precision", "fp8", "--tp", "1", "--pp", "16", "--cp", "1", "--ep", "64", "--mbs", "1", "--gbs", "15360", "--seq-len", "4096", "--fused-grouped-mlp", "--no-fsdp", "-q"];
    let o = runner(&dir, &[&base[..], &["--pipeline-schedule", "dualpipe", "--format", "json"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["layout"]["pipeline"], "dualpipe", "{out}");
    let o = runner(&dir, &[&base[..], &["--format", "json"]].concat());
    let one: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert!(one["layout"].get("pipeline").is_none(), "1F1B is the default, left out");
    let (dual, megatron) = (v["step_time_s"].as_f64().unwrap(), one["step_time_s"].as_f64().unwrap());
    assert!(dual < 0.75 * megatron, "DualPipe {dual} s, 1F1B {megatron} s");
    let o = runner(&dir, &[&base[..], &["--pipeline-schedule", "DualPipe", "--vp", "2"]].concat());
    assert!(!o.status.success() && text(&o).1.contains("no virtual pipeline: pp = 16, vp = 2"), "{}", text(&o).1);
    let o = runner(&dir, &[&base[..1], &["--model", "deepseek-v3-671b", "--pipeline-schedule", "zb-v"]].concat());
    assert!(!o.status.success() && text(&o).1.contains("use 1f1b"), "{}", text(&o).1);
    let o = runner(&dir, &["search", "--model", "deepseek-v3-671b", "--gpu", "h800", "--gpus", "2048", "--precision", "fp8", "--pipeline-schedule", "dualpipe", "--top", "3", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let rows: Vec<&str> = out.lines().filter(|l| l.trim_start().starts_with("2048")).collect();
    assert!(!rows.is_empty() && rows.iter().all(|l| l.contains("DualPipe")), "{out}");
}

/// `--pipeline-schedule dualpipev` reaches the projection and the search: DeepSeek-V3
/// on 2,048 H800 at PP8 runs DualPipe's 16 stages as a V over 8 ranks (said in the
/// layout and the JSON), each rank holding about half DualPipe's PP8 weights; a virtual
/// pipeline is refused by name; a search keeps the schedule in every layout it ranks.
#[test]
fn project_and_search_take_the_dualpipev_schedule() {
    let dir = scratch("dualpipev");
    let base = ["project", "--model", "deepseek-v3-671b", "--gpu", "h800", "--gpus", "2048", "--precision", "fp8", "--tp", "1", "--pp", "8", "--cp", "1", "--ep", "64", "--mbs", "1", "--gbs", "15360", "--seq-len", "4096", "--fused-grouped-mlp", "--no-fsdp", "-q"];
    let json = |schedule: &str| {
        let o = runner(&dir, &[&base[..], &["--pipeline-schedule", schedule, "--format", "json"]].concat());
        let (out, err) = text(&o);
        assert!(o.status.success(), "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let (v, d) = (json("dualpipev"), json("dualpipe"));
    assert_eq!(v["layout"]["pipeline"], "dualpipev", "{v}");
    let (wv, wd) = (v["memory"]["weights"].as_f64().unwrap(), d["memory"]["weights"].as_f64().unwrap());
    assert!(wv < 0.6 * wd, "weights per GPU: DualPipeV {wv} GiB, DualPipe {wd} GiB");
    let o = runner(&dir, &base);
    assert!(o.status.success() && text(&o).0.contains("TP1 PP8") && !text(&o).0.contains("DualPipeV"), "{}", text(&o).0);
    let o = runner(&dir, &[&base[..], &["--pipeline-schedule", "dualpipev"]].concat());
    let out = text(&o).0;
    assert!(o.status.success() && out.contains("DualPipeV"), "{out}");
    // The breakdown counts the V's ranks and stages apart, and names a rank's two stages.
    let names_its_stages = (0..8).any(|r| out.contains(&format!("(rank {r}: stages {r} and {})", 15 - r)));
    assert!(out.contains("PP (8 ranks, 16 stages)") && names_its_stages, "{out}");
    // A layout string under DualPipeV writes its 2·pp stages: 16 chunks at PP8 build E0L3,
    // 8 (a PP8 1F1B string) are refused naming the V's count.
    let laid = |text: &str| runner(&dir, &[&base[..], &["--pipeline-schedule", "dualpipev", "--pipeline-layout", text]].concat());
    let o = laid("Et*4|(t*4|)*14tmL");
    assert!(o.status.success() && text(&o).0.contains("TP1 PP8 EP64 DP256 E0L3"), "{}{}", text(&o).0, text(&o).1);
    let o = laid("Et*7|(t*8|)*6t*6mL");
    assert!(!o.status.success() && text(&o).1.contains("under DualPipeV lists 8 chunks; with --pp 8 the V has 2·pp = 16 stages, one chunk each"), "{}", text(&o).1);
    let o = runner(&dir, &[&base[..], &["--pipeline-schedule", "DualPipeV", "--vp", "2"]].concat());
    assert!(!o.status.success() && text(&o).1.contains("no virtual pipeline (its two stages a rank are the V's): pp = 8, vp = 2"), "{}", text(&o).1);
    let o = runner(&dir, &["search", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "24", "--tp", "1", "--cp", "1", "--pipeline-schedule", "dualpipev", "--top", "3", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let rows: Vec<&str> = out.lines().filter(|l| l.trim_start().starts_with("24")).collect();
    assert!(!rows.is_empty() && rows.iter().all(|l| l.contains("DualPipeV")), "{out}");
    // At pp 1 every family breaks the rule the published layout breaks: said once.
    let o = runner(&dir, &["project", "--model", "llama3.1-8b", "--gpus", "64", "--pipeline-schedule", "dualpipev", "--pp", "1", "-q"]);
    let err = text(&o).1;
    assert!(!o.status.success() && err.matches("DualPipeV needs pp ≥ 2").count() == 1, "{err}");
    assert!(err.contains("the search's 9 layout families are refused for the same reason"), "{err}");
}

/// Degrees and GPU counts at the top of u32 get an answer or an error naming the flag,
/// never an overflow panic (these tests run unoptimised, with overflow checks) nor a
/// loop counting to four billion: the divisor lists took 51 s per search in a release
/// build before they went by √n, so the ten minutes allowed here only catch a hang.
#[test]
fn absurd_degrees_and_gpu_counts_are_answered_not_hung() {
    let dir = scratch("absurd");
    let in_time = |args: &[&str]| -> Output {
        let mut child = command(&dir, args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("runner starts");
        let start = std::time::Instant::now();
        while child.try_wait().expect("runner waits").is_none() {
            if start.elapsed() > std::time::Duration::from_secs(600) {
                let _ = child.kill();
                panic!("runner {args:?} still running after 10 minutes");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        child.wait_with_output().expect("runner output")
    };
    let o = in_time(&["search", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "4294967295", "--precision", "bf16", "-q"]);
    let (out, err) = text(&o);
    assert!(!err.contains("panicked") && (out.contains("4294967295") || err.contains("4294967295")), "{out}{err}");
    // A degree past the run file's ceiling is refused by the flag's parser; one within it
    // that cannot split the model, by the layout's rules.
    let o = in_time(&["project", "--model", "deepseek-v3-671b", "--gpu", "h100", "--gpus", "1024", "--precision", "fp8", "--ep", "4294967295", "-q"]);
    let err = text(&o).1;
    assert!(!o.status.success() && !err.contains("panicked") && err.contains("4294967295 is not in 1..=1048576"), "{err}");
    let o = in_time(&["project", "--model", "deepseek-v3-671b", "--gpu", "h100", "--gpus", "1024", "--precision", "fp8", "--ep", "1048576", "-q"]);
    let err = text(&o).1;
    assert!(!o.status.success() && !err.contains("panicked") && err.contains("ep=1048576 does not divide 256 experts"), "{err}");
    let o = in_time(&["project", "--model", "deepseek-v3-671b", "--gpu", "h100", "--gpus", "1024", "--precision", "fp8", "--ep", "65536", "--etp", "65536", "-q"]);
    let err = text(&o).1;
    assert!(!o.status.success() && !err.contains("panicked") && err.contains("ep·etp = 4294967296"), "{err}");
    let o = in_time(&["project", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "64", "--precision", "bf16", "--tp", "65536", "--pp", "65536", "-q"]);
    let err = text(&o).1;
    assert!(!o.status.success() && !err.contains("panicked") && err.contains("does not divide"), "{err}");
    for (flag, args) in [("--top", &["search", "--model", "llama3.1-8b", "--gpus", "8", "--top", "0"][..]), ("--tp", &["project", "--model", "llama3.1-8b", "--gpus", "8", "--tp", "0"][..])] {
        let o = in_time(args);
        let err = text(&o).1;
        assert!(!o.status.success() && err.contains(&format!("for '{flag}")) && err.contains("0 is not in 1.."), "{err}");
    }
}

#[test]
fn search_lists_the_best_layouts_and_why_families_lost() {
    let dir = scratch("search");
    let o = runner(&dir, &["search", "--model", "gpt3-175b", "--gpu", "h100", "--gpus", "256,1024", "--top", "3", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("256") && out.contains("1024") && out.contains("TP"), "{out}");
    assert!(out.contains("lost on memory") && out.contains("lost on speed"), "{out}");
    assert!(out.contains("layouts evaluated"), "{out}");
    // A tp that divides no layout of 64 GPUs: the row says so (not "nothing fits") and the
    // notes name the reason.
    let o = runner(&dir, &["search", "--model", "llama3.1-8b", "--gpus", "64", "--tp", "3", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("no valid layout") && !out.contains("nothing fits") && out.contains("tp·cp = 3 does not divide 64 GPUs"), "{out}");
    // --no-fsdp keeps the search to Megatron's distributed optimizer (Llama 3 8B's best
    // layouts at 2048 GPUs shard with FSDP otherwise); with --fsdp it is refused.
    let fsdp = |extra: &[&str]| -> Vec<bool> {
        let o = runner(&dir, &[&["search", "--model", "llama3-8b", "--gpus", "2048", "--format", "json", "-q"][..], extra].concat());
        let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
        v[0]["best"].as_array().unwrap().iter().map(|b| b["layout"]["fsdp"].as_bool().unwrap()).collect()
    };
    assert!(fsdp(&[])[0], "FSDP wins by default");
    assert!(fsdp(&["--no-fsdp"]).iter().all(|&f| !f));
    let o = runner(&dir, &["search", "--model", "llama3-8b", "--gpus", "64", "--fsdp", "--no-fsdp"]);
    assert!(!o.status.success() && text(&o).1.contains("cannot be used with"), "{}", text(&o).1);
}

/// `runner validate` projects a calibration-shaped file and lists what it cannot
/// project with the reason; `runner calibrate -o` writes a profile `--profile` reads.
#[test]
fn validate_and_calibrate_on_a_small_file() {
    let dir = scratch("validate");
    let runs = r#"
[[point]]
source = "test"
model = "llama3.1-70b"
gpu = "H100"
num_gpus = 64
precision = "FP8"
seq_len = 8192
gbs = 128
mbs = 1
tp = 4
pp = 4
cp = 2
vp = 5
step_time_s = 10.46

[[point]]
source = "test"
model = "llama3.1-8b"
gpu = "H100"
num_gpus = 8
precision = "BF16"
seq_len = 8192
gbs = 128
mbs = 1
tp = 1
pp = 1
cp = 2
step_time_s = 12.78

[[point]]
source = "test"
model = "nosuch-7b"
gpu = "H100"
num_gpus = 8
precision = "BF16"
seq_len = 4096
gbs = 64
tp = 1
step_time_s = 3.0
"#;
    std::fs::write(dir.join("runs.toml"), runs).unwrap();
    let o = runner(&dir, &["validate", "runs.toml", "--format", "json", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["checked"].as_array().unwrap().len(), 2, "{out}");
    assert_eq!(v["unsupported"][0]["index"], 2);
    assert!(v["unsupported"][0]["reason"].as_str().unwrap().contains("nosuch-7b"));
    assert!(v["overall"]["median"].as_f64().unwrap() < 0.2);
    // The HTML page charts predicted against published step time before the table.
    let o = runner(&dir, &["validate", "runs.toml", "--format", "html", "-q"]);
    let (page, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(page.contains("Predicted against published step time") && page.contains("<table>"), "{page}");
    assert!(page.find("<svg").unwrap() < page.find("<table>").unwrap());
    // Each projected run carries where its predicted step goes.
    let c = &v["checked"][0];
    assert!(c["breakdown"]["compute_parts"]["gemm"].as_f64().unwrap() > 0.0, "{out}");
    assert!(c["breakdown"]["compute"].as_f64().unwrap() <= c["predicted_step_s"].as_f64().unwrap(), "{out}");
    // Two runs of two formats fit nothing: refused, and no profile of priors is written
    // (with --profile it would have put them over the shipped fit).
    let o = runner(&dir, &["calibrate", "runs.toml", "--gpu", "h100", "-o", "fitted.toml", "-q"]);
    assert!(!o.status.success() && text(&o).1.contains("too few runs to fit any parameter"), "{}", text(&o).1);
    // The count beside the file's own: "H100 2" read as "2 found" in a file of 3.
    assert!(text(&o).1.contains("per GPU type: H100: 0 of its 3 runs)"), "{}", text(&o).1);
    assert!(!dir.join("fitted.toml").exists());
    // Held out, one family leaves nothing to fit the rest on: refused, not "0 points,
    // median 0.0 %".
    let o = runner(&dir, &["calibrate", "runs.toml", "--holdout", "-q"]);
    assert!(!o.status.success() && text(&o).1.contains("no model family could be held out"), "{}", text(&o).1);
    // Three BF16 runs of three families on H100 fit its BF16 GEMM efficiency and nothing
    // else; the written profile holds only that, and leaves out GB200, whose one run fits
    // nothing of its own.
    let shipped = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../project/data/calibration.toml")).unwrap();
    let points: Vec<&str> = shipped.split("\n[[point]]\n").skip(1).collect();
    let pick: Vec<String> = [0, 1, 7, 16].iter().map(|&i| format!("[[point]]\n{}\n", points[i])).collect();
    assert!(pick[3].contains("gpu = \"GB200\"") && pick.iter().all(|p| p.contains("precision = \"BF16\"")), "{pick:?}");
    std::fs::write(dir.join("fit.toml"), pick.concat()).unwrap();
    let o = runner(&dir, &["calibrate", "fit.toml", "-o", "fitted.toml", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("GB200: its runs fit nothing of its own"), "{out}");
    // Held out on one GPU (--holdout --gpu): that GPU's families alone, each fitted on the
    // others of its runs; a GPU with one family, or none, in the file is refused by name.
    let o = runner(&dir, &["calibrate", "fit.toml", "--holdout", "--gpu", "h100", "--format", "json", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let held: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows: Vec<(&str, &str, usize)> = held
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["gpu"].as_str().unwrap(), h["family"].as_str().unwrap(), h["errors"].as_array().unwrap().len()))
        .collect();
    assert_eq!(rows, [("H100", "llama3", 2), ("H100", "nemotron4", 1)], "{out}");
    let o = runner(&dir, &["calibrate", "fit.toml", "--holdout", "--gpu", "gb200", "-q"]);
    assert!(!o.status.success() && text(&o).1.contains("no model family of GB200's runs could be held out"), "{}", text(&o).1);
    let o = runner(&dir, &["calibrate", "fit.toml", "--holdout", "--gpu", "b200", "-q"]);
    assert!(!o.status.success() && text(&o).1.contains("fit.toml: the file has no supported run on B200 to hold out; `runner validate fit.toml`"), "{}", text(&o).1);
    let o = runner(&dir, &["calibrate", "fit.toml", "--holdout", "--gpu", "h100", "--precision", "fp8", "-q"]);
    assert!(!o.status.success() && text(&o).1.contains("no supported FP8 run on H100 to hold out"), "{}", text(&o).1);
    let o = runner(&dir, &["calibrate", "fit.toml", "--holdout", "--gpu", "h1000", "-q"]);
    assert!(!o.status.success() && text(&o).1.contains("--gpu: unknown GPU 'h1000'"), "{}", text(&o).1);
    let fitted = std::fs::read_to_string(dir.join("fitted.toml")).unwrap();
    assert!(fitted.contains("name = \"H100\"") && fitted.contains("[gpu.efficiency.gemm]\nbf16 = "), "{fitted}");
    assert!(!fitted.contains("GB200") && !fitted.contains("fp8") && !fitted.contains("attention"), "{fitted}");
    let o = runner(&dir, &["validate", "runs.toml", "--profile", "fitted.toml", "-q"]);
    assert!(o.status.success(), "{}", text(&o).1);
    // -o naming the command's own input is refused before anything is written.
    let o = runner(&dir, &["validate", "runs.toml", "-o", "./runs.toml", "-q"]);
    assert!(!o.status.success() && text(&o).1.contains("also an input of this command"), "{}", text(&o).1);
    assert_eq!(std::fs::read_to_string(dir.join("runs.toml")).unwrap(), runs);
    let o = runner(&dir, &["validate", "runs.toml", "--profile=fitted.toml", "-ofitted.toml", "-q"]);
    assert!(!o.status.success() && text(&o).1.contains("(fitted.toml)"), "{}", text(&o).1);
    // A hard link is the same file under another name.
    #[cfg(unix)]
    {
        std::fs::hard_link(dir.join("runs.toml"), dir.join("linked.json")).unwrap();
        let o = runner(&dir, &["validate", "runs.toml", "-o", "linked.json", "-q"]);
        assert!(!o.status.success() && text(&o).1.contains("also an input"), "{}", text(&o).1);
        assert_eq!(std::fs::read_to_string(dir.join("runs.toml")).unwrap(), runs);
    }
    // A file named like a flag's value is not an input: `--format json -o json` writes it.
    std::fs::write(dir.join("json"), "old").unwrap();
    let o = runner(&dir, &["validate", "runs.toml", "--format", "json", "-o", "json", "-q"]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(std::fs::read_to_string(dir.join("json")).unwrap().contains("\"checked\""));
    // A figure that would print as infinities is refused by name, not projected.
    let slipped = runs.replace("step_time_s = 3.0", "step_time_s = 3e-9");
    std::fs::write(dir.join("slipped.toml"), &slipped).unwrap();
    let o = runner(&dir, &["validate", "slipped.toml", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("step_time_s = 3.0000e-9 gives a step of") && out.contains("check its units"), "{out}");
    assert!(!out.contains("inf"), "{out}");
    // A row past the model's context is a typo, refused by name; a projection there is a
    // context-extension run's, projected with a note.
    let long = runs.replacen("seq_len = 8192\ngbs = 128\nmbs = 1\ntp = 1", "seq_len = 1048576\ngbs = 128\nmbs = 1\ntp = 1", 1);
    assert_ne!(long, runs);
    std::fs::write(dir.join("long.toml"), &long).unwrap();
    let o = runner(&dir, &["validate", "long.toml", "--format", "json", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["checked"].as_array().unwrap().len(), 1, "{out}");
    assert!(v["unsupported"][0]["reason"].as_str().unwrap().contains("past llama3.1-8b's context of 131072 tokens"), "{out}");
    // The extension names the format in any case.
    let o = runner(&dir, &["validate", "runs.toml", "-o", "OUT.JSON", "-q"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("OUT.JSON")).unwrap()).unwrap();
    assert_eq!(written["checked"].as_array().unwrap().len(), 2);
    // A file of which no point projects prints every reason and exits non-zero.
    std::fs::write(dir.join("none.toml"), &runs[runs.rfind("[[point]]").unwrap()..]).unwrap();
    let o = runner(&dir, &["validate", "none.toml", "-q"]);
    let (out, err) = text(&o);
    assert!(!o.status.success() && out.contains("nosuch-7b") && err.contains("no point of none.toml could be projected"), "{out}{err}");
    let o = runner(&dir, &["project", "--model", "llama3-8b", "--gpus", "8", "--seq-len", "16384", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(format!("{out}{err}").contains("past llama3-8b's context of 8192 tokens"), "{out}{err}");
    // Bad input is named.
    std::fs::write(dir.join("bad.toml"), "[[point]]\nmodel = 3\n").unwrap();
    let o = runner(&dir, &["validate", "bad.toml"]);
    assert!(!o.status.success() && text(&o).1.contains("bad.toml"), "{}", text(&o).1);
    let o = runner(&dir, &["project", "--model", "llama3.1-8b", "--gpus", "8", "--profile", "bad.toml"]);
    assert!(!o.status.success() && text(&o).1.contains("bad.toml"), "{}", text(&o).1);
    // A GPU a profile adds with an FP8 peak projects in FP8 (its formats are its peaks').
    std::fs::write(
        dir.join("x1.toml"),
        "[[gpu]]\nname = \"X1\"\ndescription = \"new\"\nmemory_gib = 192.0\nhbm_gbs = 5300.0\ngpus_per_node = 8\nscale_up_domain = 8\n\
         scale_up_gbs = 448.0\nscale_out_gbs = 50.0\n[gpu.peak_tflops]\nbf16 = 1300.0\nfp8 = 2600.0\n",
    )
    .unwrap();
    let o = runner(&dir, &["--profile", "x1.toml", "project", "--model", "llama3.1-8b", "--gpu", "X1", "--gpus", "8", "--precision", "fp8", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success() && out.starts_with("llama3.1-8b on 8 X1, fp8:"), "{out}{err}");
}

#[test]
fn plugins_list_shows_contract_versions_and_shadowing_is_announced() {
    let dir = scratch("versions");
    let dist = dir.join("plugins/dist");
    std::fs::create_dir_all(&dist).unwrap();
    let old = runner::plugin::test_programs()
        .iter()
        .find(|(n, _)| *n == "contract_v01_cost.wasm")
        .map(|(_, p)| *p)
        .unwrap();
    std::fs::copy(old, dist.join("oldcloud.wasm")).unwrap();
    std::fs::write(dist.join("aws.wasm"), embedded_wasm("aws.wasm")).unwrap();

    let o = runner(&dir, &["plugins", "list", "--format", "json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let entry = |name: &str, embedded: bool| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name && (e["source"] == "embedded") == embedded)
            .unwrap_or_else(|| panic!("{name}: {out}"))
            .clone()
    };
    assert_eq!(entry("oldcloud.wasm", false)["contract"], "0.1.0");
    assert_eq!(entry("llama3.wasm", true)["contract"], "0.3.0");
    assert_eq!(entry("aws.wasm", false)["shadows_embedded"], true);
    assert_eq!(entry("aws.wasm", true)["shadowed"], true);
    // CSV carries each sha256 whole, as JSON does (it gave 12 digits); the table 12.
    let sha = entry("llama3.wasm", true)["sha256"].as_str().unwrap().to_string();
    let (csv, _) = text(&runner(&dir, &["plugins", "list", "--format", "csv"]));
    assert!(csv.starts_with("name,kind,contract,source,sha256,bytes,shadows_embedded,shadowed,error\n"), "{csv}");
    assert!(csv.lines().any(|l| l.starts_with(&format!("llama3.wasm,workload,0.3.0,embedded,{sha},"))), "{csv}");
    // The contract and the source are bare ("0.1.0 (adapted)" and "(shadowed)" were
    // in the cells), whether shadowed a column of its own.
    let (header, rows) = csv_of(&csv);
    let old = rows.iter().find(|r| r[0] == "oldcloud.wasm").unwrap();
    assert_eq!(old[header.iter().position(|h| h == "contract").unwrap()], "0.1.0", "{csv}");
    assert!(rows.iter().any(|r| r[0] == "aws.wasm" && r[3] == "embedded" && r[7] == "true"), "{csv}");
    let o = runner(&dir, &["plugins", "list"]);
    let (out, _) = text(&o);
    assert!(out.lines().any(|l| l.starts_with("llama3.wasm") && l.ends_with(&format!(" {}", &sha[..12]))), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("oldcloud.wasm") && l.contains("0.1.0 (adapted)")),
        "{out}"
    );

    // A run that resolves the shadowing file says so, in its output and on stderr.
    let o = runner(
        &dir,
        &[
            "--plugin",
            "llama3",
            "--variant",
            "llama3-tiny",
            "--gpus",
            "8",
            "--cloud",
            "aws.wasm",
            "--repeats",
            "1",
        ],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let out = out.replace("\n  ", " ");
    assert!(
        out.contains("cost plugin aws.wasm (contract 0.3.0): plugins/dist/aws.wasm, shadowing the embedded plugin"),
        "{out}"
    );
    assert!(err.contains("shadows the embedded plugin"), "{err}");
}

/// A GPU profile for this machine, so the CPU's measurements have a GPU to stand for.
const CPU_PROFILE: &str = r#"
[[gpu]]
name = "cpu-box"
description = "the test machine as a stand-in GPU"
memory_gib = 16.0
hbm_gbs = 100.0
gpus_per_node = 8
scale_up_domain = 8
scale_up_gbs = 100.0
scale_out_gbs = 10.0
[gpu.peak_tflops]
bf16 = 1.0
fp8 = 2.0
"#;

/// `runner measure` times the projection's own rank graph on the CPU and writes a file
/// `project --measured` applies (refusing another sharding, GPU or precision) and
/// `calibrate --ops` fits; a `bench collectives -g 4` sweep is fitted by
/// `calibrate --collectives`; every fitted file works alone with `--profile`.
#[test]
fn measured_ops_and_collectives_feed_the_projection_and_the_profile() {
    let dir = scratch("measured");
    std::fs::write(dir.join("cpu.toml"), CPU_PROFILE).unwrap();
    let base = ["--device", "cpu", "--profile", "cpu.toml"];
    let run = |args: &[&str]| {
        let mut a = base.to_vec();
        a.extend(args);
        runner(&dir, &a)
    };
    let o = run(&["measure", "--model", "llama3-tiny", "--gpu", "cpu-box", "--repeats", "2", "-o", "ops.json", "-q"]);
    assert!(o.status.success(), "{}", text(&o).1);
    // -q: no step of the GEMMs' progress.
    assert!(!text(&o).1.lines().any(|l| l.starts_with("1/")), "{}", text(&o).1);
    let ops: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("ops.json")).unwrap()).unwrap();
    assert_eq!((ops["format"].as_str(), ops["gpu"].as_str(), ops["shard"]["tp"].as_u64()), (Some("runner-measured-ops"), Some("cpu-box"), Some(1)));
    let kind_of = |name: &str| ops["ops"].as_array().unwrap().iter().find(|o| o["name"] == name).map(|o| o["kind"].clone());
    assert_eq!(kind_of("layers.0.mlp.gate"), Some("gemm".into()));
    assert_eq!(kind_of("layers.0.attn_norm"), Some("memory".into()));
    assert_eq!(kind_of("layers.0.attn.core"), None, "attention is not measured");

    let step = |args: &[&str]| -> serde_json::Value {
        let mut a = vec!["project", "--model", "llama3-tiny", "--gpu", "cpu-box", "--gpus", "1", "--mbs", "1", "--gbs", "4"];
        a.extend(["--recompute", "none", "--format", "json", "-q"]);
        a.extend(args);
        let o = run(&a);
        assert!(o.status.success(), "{a:?}: {}", text(&o).1);
        serde_json::from_str(&text(&o).0).unwrap()
    };
    let roofline = step(&[]);
    let measured = step(&["--measured", "ops.json"]);
    assert!(measured["notes"].to_string().contains("replace the roofline"), "{}", measured["notes"]);
    assert!(!measured["notes"].to_string().contains(" lacks "), "a whole measurement leaves out nothing: {}", measured["notes"]);
    assert!(roofline.get("measured").is_none());
    // An op taken out of the file keeps the roofline, and the projection says which.
    let mut trimmed = ops.clone();
    trimmed["ops"].as_array_mut().unwrap().retain(|o| o["name"] != "layers.0.mlp.gate");
    std::fs::write(dir.join("ops-trimmed.json"), serde_json::to_string(&trimmed).unwrap()).unwrap();
    let notes = step(&["--measured", "ops-trimmed.json"])["notes"].to_string();
    assert!(notes.contains("ops-trimmed.json lacks 1 op of the rank graph that `runner measure` times: layers.0.mlp.gate;"), "{notes}");
    let names: Vec<&str> = measured["measured"]["ops"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    assert_eq!(names.len(), ops["ops"].as_array().unwrap().len());
    assert!(names.contains(&"layers.0.mlp.gate") && !names.contains(&"layers.0.attn.core"), "{names:?}");
    assert_eq!(measured["measured"]["device"], ops["device"]);
    assert!(measured["step_time_s"] != roofline["step_time_s"]);
    // The CPU's measured times, through the file, by hand: with every op's time doubled
    // the step grows by exactly the file's times, once per micro-batch, the layer-0 ops
    // once per layer (llama3-tiny: 4 alike layers) and the ops outside the stack once.
    let mut doubled = ops.clone();
    let mut per_micro_batch = 0.0;
    for o in doubled["ops"].as_array_mut().unwrap() {
        let (f, b) = (o["fwd_s"].as_f64().unwrap(), o["bwd_s"].as_f64().unwrap());
        per_micro_batch += (f + b) * if o["layer"].as_i64() == Some(-1) { 1.0 } else { 4.0 };
        o["fwd_s"] = (2.0 * f).into();
        o["bwd_s"] = (2.0 * b).into();
        // The details the times are made of double with them (a file whose times
        // disagree with its details is refused).
        let double = |v: &mut serde_json::Value| *v = (2.0 * v.as_f64().unwrap()).into();
        if let Some(k) = o.get_mut("gemm").and_then(|g| g.get_mut("kernel_s")).and_then(serde_json::Value::as_array_mut) {
            k.iter_mut().for_each(double);
        }
        if o["memory"].is_object() {
            double(&mut o["memory"]["run_fwd_s"]);
            double(&mut o["memory"]["run_bwd_s"]);
        }
    }
    // Only the times doubled, the file contradicts itself.
    let mut contradicts = ops.clone();
    for o in contradicts["ops"].as_array_mut().unwrap() {
        o["fwd_s"] = (0.5 * o["fwd_s"].as_f64().unwrap()).into();
    }
    std::fs::write(dir.join("ops-halved.json"), serde_json::to_string(&contradicts).unwrap()).unwrap();
    let o = run(&["project", "--model", "llama3-tiny", "--gpu", "cpu-box", "--gpus", "1", "--measured", "ops-halved.json"]);
    assert!(!o.status.success() && text(&o).1.contains("disagree with each other"), "{}", text(&o).1);
    std::fs::write(dir.join("ops2.json"), serde_json::to_string(&doubled).unwrap()).unwrap();
    let twice = step(&["--measured", "ops2.json"]);
    let mb = twice["micro_batches"].as_f64().unwrap();
    assert_eq!((mb, twice["layout"]["pp"].as_u64()), (4.0, Some(1)));
    let grew = twice["step_time_s"].as_f64().unwrap() - measured["step_time_s"].as_f64().unwrap();
    let want = mb * per_micro_batch;
    assert!((grew - want).abs() <= 1e-9 * want, "the step grew by {grew} s, the file's times make {want} s");
    // cpu-box's tensor cores (a custom GPU's) run no FP8, so the plan refuses fp8 before
    // the file is read: a file claiming fp8 stands in for the precision mismatch.
    let fp8 = std::fs::read_to_string(dir.join("ops.json")).unwrap().replacen("\"precision\": \"bf16\"", "\"precision\": \"fp8\"", 1);
    assert!(fp8.contains("\"precision\": \"fp8\""));
    std::fs::write(dir.join("ops-fp8.json"), fp8).unwrap();
    for (args, want) in [
        (vec!["--measured", "ops.json", "--tp", "2", "--gpus", "2"], "--tp 1"),
        (vec!["--measured", "ops-fp8.json", "--gpus", "1"], "--precision fp8"),
        (vec!["--measured", "ops.json", "--seq-len", "128", "--gpus", "1"], "--seq-len 256"),
    ] {
        let mut a = vec!["project", "--model", "llama3-tiny", "--gpu", "cpu-box"];
        a.extend(args);
        let o = run(&a);
        assert!(!o.status.success() && text(&o).1.contains(want), "{a:?}: {}", text(&o).1);
    }
    let o = runner(&dir, &["project", "--model", "llama3-tiny", "--gpu", "h100", "--gpus", "1", "--measured", "ops.json"]);
    assert!(!o.status.success() && text(&o).1.contains("stands for cpu-box"), "{}", text(&o).1);
    // The CPU cannot stand for a built-in GPU.
    let o = run(&["measure", "--model", "llama3-tiny", "--gpu", "h100"]);
    assert!(!o.status.success() && text(&o).1.contains("cannot stand for the built-in H100"), "{}", text(&o).1);

    let o = run(&["calibrate", "--ops", "ops.json", "-o", "fitted.toml", "-q"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let fitted = std::fs::read_to_string(dir.join("fitted.toml")).unwrap();
    assert!(fitted.contains("name = \"cpu-box\"") && fitted.contains("runner calibrate --ops ops.json"), "{fitted}");
    let o = runner(&dir, &["--profile", "fitted.toml", "project", "--model", "llama3-tiny", "--gpu", "cpu-box", "--gpus", "1", "-q"]);
    assert!(o.status.success(), "the fitted file alone is a profile: {}", text(&o).1);

    let o = run(&["bench", "collectives", "-g", "4", "-b", "4K", "-e", "256K", "-f", "4", "-n", "2", "-w", "1", "--ops", "all_reduce,all_gather", "-o", "coll.json", "-q"]);
    assert!(o.status.success(), "{}", text(&o).1);
    // One average per collective, as nccl-tests prints one per binary.
    let out = text(&o).0;
    let averages: Vec<&str> = out.lines().filter(|l| l.contains("Avg bus bandwidth")).collect();
    assert!(averages.len() == 2 && averages[0].ends_with(" (all_reduce)") && averages[1].ends_with(" (all_gather)"), "{out}");
    let rows: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("coll.json")).unwrap()).unwrap();
    assert_eq!((rows[0]["nodes"].as_u64(), rows[0]["ranks"].as_u64()), (Some(1), Some(4)));
    let o = run(&["calibrate", "--collectives", "coll.json", "--gpu", "cpu-box", "-o", "net.toml", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("scale_up") && out.contains("scale-up tier from 4 ranks on 1 node"), "{out}");
    let net = std::fs::read_to_string(dir.join("net.toml")).unwrap();
    assert!(net.contains("scale_up_latency_us") && net.contains("--collectives coll.json"), "{net}");
    // The fitted tier is what the projection reads: a TP=2 layout's exposed TP
    // communication follows the loopback sockets' fit, not the prior.
    let tp_comm = |profile: &str| {
        let o = runner(&dir, &["--profile", profile, "project", "--model", "llama3-tiny", "--gpu", "cpu-box", "--gpus", "2", "--tp", "2", "--format", "json", "-q"]);
        assert!(o.status.success(), "{profile}: {}", text(&o).1);
        let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
        v["breakdown"]["tp"].as_f64().unwrap()
    };
    let (prior, fitted) = (tp_comm("cpu.toml"), tp_comm("net.toml"));
    assert!(fitted > 2.0 * prior && prior > 0.0, "TP comm {prior} s with the prior, {fitted} s with the fit");

    // Bad input names the file and the problem.
    std::fs::write(dir.join("bad.json"), "{\"format\": \"runner-measured-ops\",\n \"version\": 1,\n \"ops\": [}").unwrap();
    for (args, want) in [
        (vec!["calibrate", "--ops", "bad.json"], "bad.json: line 3"),
        (vec!["calibrate", "--collectives", "ops.json", "--gpu", "cpu-box"], "fit a profile to it with `runner calibrate --ops ops.json"),
        (vec!["calibrate", "--ops", "coll.json"], "`runner calibrate --collectives coll.json --gpu NAME`"),
        // One command's output given to another reader names the command that reads it
        // (a raw TOML parse error, and "a bench collectives file?" for a profile, before).
        (vec!["validate", "ops.json"], "ops.json: this is a `runner measure` file, not a calibration file"),
        (vec!["calibrate", "ops.json"], "ops.json: this is a `runner measure` file, not a calibration file"),
        (vec!["calibrate", "--ops", "net.toml", "--gpu", "cpu-box"], "net.toml: this is a GPU profile ([[gpu]] tables"),
        (vec!["calibrate", "--collectives", "coll.json"], "--gpu NAME"),
        (vec!["calibrate", "--collectives", "coll.json", "--gpu", "cpu-box", "--tier", "scale-out"], "never left NVLink"),
        (vec!["calibrate", "--collectives", "coll.json", "--gpu", "h100"], "cannot stand for the built-in H100"),
        // A full-size model's GEMMs would take the CPU over an hour: refused up front.
        (vec!["measure", "--model", "llama3.1-8b", "--gpu", "cpu-box"], "measure on a GPU (--device cuda)"),
    ] {
        let o = run(&args);
        assert!(!o.status.success() && text(&o).1.contains(want), "{args:?}: {}", text(&o).1);
    }
    let o = runner(&dir, &["calibrate", "--ops", "ops.json"]);
    assert!(!o.status.success() && text(&o).1.contains("ops.json stands for GPU 'cpu-box'") && text(&o).1.contains("pass the --profile FILE"), "{}", text(&o).1);
}

/// nccl-tests' own logs, one per test binary, fit the profile as `bench collectives`
/// JSON does: a cluster team's existing sweep of 8 H100s at 360 GB/s bus bandwidth and
/// 12 us per step gives NVLink's efficiency 360/450 and that latency.
#[test]
fn nccl_tests_logs_fit_the_nvlink_tier() {
    let dir = scratch("nccl-tests");
    let log = |op: &str, factor: f64, nodes: usize, rate: f64| {
        let mut s = format!("# nccl-tests version 2.18.3 nccl-headers=22703 nccl-library=22703\n# Collective test starting: {op}_perf\n");
        s += "# nThread 1 nGpus 1 minBytes 1048576 maxBytes 1073741824 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n";
        for r in 0..8 {
            s += &format!("#  Rank {r:2} Group  0 Pid {:6} on node-{} device {r:2} [0000:1b:00] NVIDIA H100 80GB HBM3\n", 100 + r, r % nodes);
        }
        s += "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n";
        for k in 0..6 {
            let size = 1u64 << (20 + 2 * k);
            // ring steps: log2(8) = 3 latencies; the bus bytes at 360 GB/s.
            let t = 3.0 * 12.0 + size as f64 * factor / rate;
            let algbw = size as f64 / t / 1e3;
            let row = format!("{t:8.2} {algbw:7.2} {:7.2} {:6}", algbw * factor, 0);
            s += &format!("{size:12} {:13} {:>9} {:>7} {:7} {row} {row}\n", size / 4, "float", "sum", -1);
        }
        s + "# Avg bus bandwidth    : 300.0\n"
    };
    std::fs::write(dir.join("all_reduce_perf.log"), log("all_reduce", 1.75, 1, 360e3)).unwrap();
    std::fs::write(dir.join("all_gather_perf.log"), log("all_gather", 0.875, 1, 360e3)).unwrap();
    std::fs::write(dir.join("all_gather_2n.log"), log("all_gather", 0.875, 2, 360e3)).unwrap();
    // NVLink SHARP's all-reduce (NCCL's default on NVSwitch nodes): busbw near 485 GB/s,
    // past NVLink's 450. Alone it is refused naming NVLS and the fix, not scale_up_gbs;
    // beside all_gather it is left out and all_gather alone sets the efficiency.
    std::fs::create_dir_all(dir.join("nvls")).unwrap();
    std::fs::write(dir.join("nvls/all_reduce_perf.log"), log("all_reduce", 1.75, 1, 485e3)).unwrap();
    let o = runner(&dir, &["calibrate", "--collectives", "nvls/all_reduce_perf.log", "--gpu", "h100"]);
    let err = text(&o).1;
    assert!(!o.status.success() && err.contains("NVLink SHARP (NVLS") && err.contains("NCCL_NVLS_ENABLE=0"), "{err}");
    assert!(!err.contains("the profile's scale_up_gbs is wrong"), "{err}");
    let o = runner(&dir, &["calibrate", "--collectives", "nvls/all_reduce_perf.log,all_gather_perf.log", "--gpu", "h100", "-o", "nvls.toml", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("all_reduce rows left out"), "{out}");
    let net: toml::Value = toml::from_str(&std::fs::read_to_string(dir.join("nvls.toml")).unwrap()).unwrap();
    let eff = net["gpu"][0]["efficiency"]["scale_up"].as_float().unwrap();
    assert!((eff - 0.8).abs() < 0.002, "scale_up {eff} from all_gather alone");
    // Over two nodes the network can reduce (NVLink SHARP across nodes, IB SHARP through
    // CollNet): an all-reduce whose NIC share (busbw 240 GB/s over 4 ranks a node: 60)
    // passes H100's 50 GB/s NIC is refused alone naming both switches, not a wrong
    // scale_out_gbs; beside all_gather (30 GB/s a NIC) it is left out.
    std::fs::write(dir.join("nvls/all_reduce_2n.log"), log("all_reduce", 1.75, 2, 240e3)).unwrap();
    std::fs::write(dir.join("nvls/all_gather_2n.log"), log("all_gather", 0.875, 2, 120e3)).unwrap();
    let o = runner(&dir, &["calibrate", "--collectives", "nvls/all_reduce_2n.log", "--gpu", "h100"]);
    let err = text(&o).1;
    assert!(!o.status.success() && err.contains("InfiniBand SHARP") && err.contains("rerun all_reduce_perf with NCCL_NVLS_ENABLE=0 NCCL_COLLNET_ENABLE=0"), "{err}");
    assert!(!err.contains("scale_out_gbs is wrong"), "{err}");
    let o = runner(&dir, &["calibrate", "--collectives", "nvls/all_reduce_2n.log,nvls/all_gather_2n.log", "--gpu", "h100", "-o", "sharp.toml", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("scale-out tier from 8 ranks on 2 nodes") && out.contains("all_reduce rows left out"), "{out}");
    let net: toml::Value = toml::from_str(&std::fs::read_to_string(dir.join("sharp.toml")).unwrap()).unwrap();
    let eff = net["gpu"][0]["efficiency"]["scale_out"].as_float().unwrap();
    assert!((eff - 0.6).abs() < 0.002, "scale_out {eff} from all_gather alone");
    let o = runner(&dir, &["calibrate", "--collectives", "all_reduce_perf.log,all_gather_perf.log", "--gpu", "h100", "-o", "net.toml", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("scale-up tier from 8 ranks on 1 node"), "{out}");
    let net: toml::Value = toml::from_str(&std::fs::read_to_string(dir.join("net.toml")).unwrap()).unwrap();
    let e = &net["gpu"][0]["efficiency"];
    let (eff, lat) = (e["scale_up"].as_float().unwrap(), e["scale_up_latency_us"].as_float().unwrap());
    assert!((eff - 0.8).abs() < 0.002 && (lat - 12.0).abs() < 0.1, "scale_up {eff}, latency {lat} us");
    // Logs of two runs (one node, two nodes) are not one sweep.
    let o = runner(&dir, &["calibrate", "--collectives", "all_reduce_perf.log,all_gather_2n.log", "--gpu", "h100"]);
    assert!(!o.status.success() && text(&o).1.contains("all_gather_2n.log: nodes is 2 but all_reduce_perf.log's is 1"), "{}", text(&o).1);
}

/// `bench collectives -c 0` checks nothing and says so (the table's #wrong N/A, JSON
/// null, no "0 OK"), and `calibrate --collectives` reads that file. On a profile of one
/// GPU per node without NVLink, a run of 2 ranks on one machine gets one answer from both
/// tiers: no tier by default, with the profile's fields and --tier named; --tier
/// scale-out fits it (it said "never left NVLink" after "fit it as scale-out").
#[test]
fn unchecked_collectives_and_a_one_gpu_node_profile() {
    let dir = scratch("coll-c0");
    let one = CPU_PROFILE.replace("cpu-box", "one-gpu").replace("gpus_per_node = 8", "gpus_per_node = 1").replace("scale_up_domain = 8", "scale_up_domain = 1");
    std::fs::write(dir.join("one.toml"), one).unwrap();
    let sweep = ["--device", "cpu", "bench", "collectives", "-g", "2", "-b", "4K", "-e", "256K", "-f", "4", "-n", "2", "-w", "1", "--ops", "all_reduce,all_gather"];
    let o = runner(&dir, &[&sweep[..], &["-c", "0", "-o", "coll.json", "-q"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("Out of bounds values : N/A, not checked (-c 0)") && !out.contains("Out of bounds values : 0"), "{out}");
    let table: Vec<&str> = out.lines().filter(|l| l.starts_with("all_reduce ") || l.starts_with("all_gather ")).collect();
    assert!(table.len() == 8 && table.iter().all(|l| l.trim_end().ends_with(" N/A")), "{out}");
    let rows: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("coll.json")).unwrap()).unwrap();
    assert!(rows.as_array().unwrap().iter().all(|r| r.get("wrong") == Some(&serde_json::Value::Null)), "{rows}");
    // Checked (-c 1, the default): counted, and "0 OK".
    let o = runner(&dir, &[&sweep[..], &["--format", "json", "-q"]].concat());
    let checked: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert!(checked.as_array().unwrap().iter().all(|r| r["wrong"] == 0), "{checked}");

    let calibrate = |tier: &[&str]| {
        let mut a = vec!["--profile", "one.toml", "calibrate", "--collectives", "coll.json", "--gpu", "one-gpu", "-o", "net.toml"];
        a.extend(tier);
        runner(&dir, &a)
    };
    let o = calibrate(&[]);
    let err = text(&o).1;
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("2 ranks ran on one node, where one-gpu's node has 1 GPU(s) (gpus_per_node) and its NVLink domain 1 (scale_up_domain)"), "{err}");
    assert!(err.contains("pass --tier scale-out"), "{err}");
    let o = calibrate(&["--tier", "scale-up"]);
    assert!(!o.status.success() && text(&o).1.contains("fit it as scale-out (--tier scale-out)"), "{}", text(&o).1);
    let o = calibrate(&["--tier", "scale-out"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "the -c 0 file is read and fitted: {err}");
    assert!(out.contains("scale-out tier from 2 ranks on 1 node"), "{out}");
}

/// A run file finds its variant in any case, as --model does, and a GPU name two boards
/// share is said as the choice it was.
#[test]
fn a_run_file_finds_its_variant_in_any_case_and_says_a_bare_a100() {
    let dir = scratch("runfile-case");
    std::fs::write(dir.join("run.toml"), "[model]\nplugin = \"llama3.wasm\"\nvariant = \"LLAMA3-TINY\"\n[cluster]\ngpu = [\"a100\"]\ngpus = [8]\n[precision]\nformat = \"bf16\"\n[cost]\nplugins = [\"lambda\"]\n").unwrap();
    let o = runner(&dir, &["run", "run.toml", "--no-history", "-q", "--format", "json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let notes: Vec<&str> = v["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).collect();
    assert!(notes.contains(&"--gpu a100 taken as A100-80GB; --gpu a100-40gb for the A100-40GB"), "{notes:?}");
    assert_eq!(v["series"][0]["gpu"]["name"].as_str(), Some("A100-80GB"), "{out}");
}

/// One rank alone (a single-GPU check machine) runs every collective, send/recv to
/// itself as nccl-tests does on one GPU, with every value checked.
#[test]
fn collectives_on_one_rank_include_sendrecv_to_itself() {
    let dir = scratch("coll1");
    let o = runner(&dir, &["--device", "cpu", "bench", "collectives", "-b", "4K", "-e", "4K", "-n", "1", "-w", "1", "--format", "json", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = rows.as_array().unwrap();
    for op in ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "sendrecv"] {
        let r = rows.iter().find(|r| r["op"] == op).unwrap_or_else(|| panic!("{op} missing: {out}"));
        assert_eq!(r["wrong"], 0, "{op}: {r}");
    }
    // Two ranks: nccl-tests' count is each rank's own for all-gather, reduce-scatter and
    // all-to-all (half the 4 KiB's 1024 floats), the buffer's for all-reduce.
    let o = runner(&dir, &["--device", "cpu", "bench", "collectives", "-g", "2", "-b", "4K", "-e", "4K", "-n", "1", "-w", "1", "--format", "json", "-q"]);
    let rows: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    let count = |op: &str| rows.as_array().unwrap().iter().find(|r| r["op"] == op).unwrap()["count"].as_u64();
    assert_eq!((count("all_reduce"), count("all_gather"), count("reduce_scatter"), count("alltoall")), (Some(1024), Some(512), Some(512), Some(512)));
    // What the host transport cannot run, and a sweep with nothing in it, are refused.
    for (args, want) in [(["-d", "bfloat16", "-b", "4K"], "bfloat16 and half need NCCL"), (["-b", "0", "-e", "0"], "raise -b")] {
        let mut a = vec!["--device", "cpu", "bench", "collectives", "-g", "2", "-n", "1", "-w", "1", "-q"];
        a.extend(args);
        if !a.contains(&"-e") {
            a.extend(["-e", "4K"]);
        }
        let o = runner(&dir, &a);
        assert!(!o.status.success() && text(&o).1.contains(want), "{a:?}: {}", text(&o).1);
    }
    // A zero -i never reaches -e: refused, not a sweep of one-byte steps.
    let o = runner(&dir, &["--device", "cpu", "bench", "collectives", "-b", "1K", "-e", "4K", "-i", "0", "-q"]);
    assert!(!o.status.success() && text(&o).1.contains("-i 0"), "{}", text(&o).1);
}

/// The device benches' flags at their edges, refused before anything runs (device_bench.rs):
/// GEMM sizes in 1..=32768, a layer's --seq in 1..=131072 with a positive --batch (its
/// --repeats clap keeps in 1..=1000), a collectives sweep whose -e is at least -b and at most 64G, a -d and
/// --ops it knows.
#[test]
fn device_bench_flags_are_refused_at_their_edges() {
    let dir = scratch("bench-edges");
    let layer = "--seq (1..=131072), --batch and --repeats must be positive";
    let sweep = "-e must be at least -b and at most 64G";
    for (args, want) in [
        (&["gemm", "--dtype", "bf16", "--sizes", "0"][..], "--sizes: 0 is outside 1..=32768"),
        (&["gemm", "--dtype", "bf16", "--sizes", "64,32769"], "--sizes: 32769 is outside 1..=32768"),
        (&["layer", "--seq", "0"], layer),
        (&["layer", "--seq", "131073"], layer),
        (&["layer", "--seq", "8", "--batch", "0"], layer),
        (&["collectives", "-b", "8K", "-e", "4K"], sweep),
        (&["collectives", "-b", "8K", "-e", "65G"], sweep),
        (&["collectives", "-d", "int8"], "-d int8: use float, bfloat16 or half"),
        (&["collectives", "-b", "1e3"], "-b: size '1e3': a number of bytes"),
        (&["collectives", "-e", "8X"], "-e: size '8X': a number of bytes"),
        (&["collectives", "-i", "1.5K"], "-i: size '1.5K': a number of bytes"),
        (&["collectives", "--ops", "all_reduce,gather"], "--ops gather: use all_reduce"),
    ] {
        let o = runner(&dir, &[&["--device", "cpu", "bench"][..], args, &["-q"]].concat());
        let err = text(&o).1;
        assert!(!o.status.success() && err.contains(want) && !err.contains("panicked"), "{args:?}: {err}");
    }
}

/// The counts of the benches whose ranks meet, refused before a rank starts: a --timeout
/// past the clock's range panicked every rank (0 was taken as 1), a -w or -c of
/// 18446744073709551615 ran for ever without a line, and a sweep of 2^36 sizes (-i 1 up
/// to 64G) took every byte of memory.
#[test]
fn rank_bench_counts_that_never_end_are_refused() {
    let dir = scratch("bench-never-ends");
    let wait = "a rank waits for the others 1 to 86400 seconds (a day), e.g. --timeout 300";
    for (args, code, want) in [
        (&["collectives", "-b", "8", "-e", "8", "--timeout", "18446744073709551615"][..], 2, wait),
        (&["collectives", "-b", "8", "-e", "8", "--timeout", "0"], 2, wait),
        (&["step", "--in-process", "--layout", "dp=2", "--timeout", "18446744073709551615"], 2, wait),
        (&["collectives", "-b", "8", "-e", "8", "-w", "18446744073709551615"], 2, "18446744073709551615 is not in 0..=1000000"),
        (&["collectives", "-b", "8", "-e", "8", "-c", "1000001"], 2, "1000001 is not in 0..=1000000"),
        (&["collectives", "-b", "1", "-e", "64G", "-i", "1"], 1, "is more than 4096 sizes: raise -i (or -b)"),
    ] {
        let o = runner(&dir, &[&["--device", "cpu", "bench"][..], args, &["-q"]].concat());
        let err = text(&o).1;
        assert!(o.status.code() == Some(code) && err.contains(want) && !err.contains("panicked"), "{args:?}: {err}");
    }
}

/// `bench plugins --calls` is at most 10^7 (a few seconds): near 2^32 it ran for hours
/// without a line.
#[test]
fn bench_plugins_calls_past_what_it_times_are_refused() {
    let dir = scratch("bench-plugins-calls");
    let o = runner(&dir, &["bench", "plugins", "--calls", "4294967295", "-q"]);
    let err = text(&o).1;
    assert!(o.status.code() == Some(2) && err.contains("4294967295 is not in 1..=10000000"), "{err}");
}

/// A bench list flag that names one item twice is refused before anything runs, on the
/// CPU's GEMM bench and the device one (`--dtype bf16`) alike, and for two spellings of
/// one collective: each was measured twice, in two rows.
#[test]
fn bench_lists_refuse_an_item_given_twice() {
    let dir = scratch("bench-twice");
    for (args, want) in [
        (&["gemm", "--sizes", "8,8"][..], "--sizes gives 8 twice: each is measured once, in one row; list it once"),
        (&["gemm", "--dtype", "bf16", "--sizes", "64,8,64"], "--sizes gives 64 twice"),
        (&["collectives", "--ops", "all_reduce,all_reduce"], "--ops gives all_reduce twice"),
        (&["collectives", "--ops", "sendrecv,all_reduce,allreduce"], "--ops gives all_reduce (as all_reduce and allreduce) twice"),
    ] {
        let o = runner(&dir, &[&["--device", "cpu", "bench"][..], args, &["-q"]].concat());
        let (out, err) = text(&o);
        assert!(!o.status.success() && err.contains(want) && out.is_empty(), "{args:?}: {err}");
    }
}

/// `train` with stdout full: an error, not a panic of `print!`, and the -o file written
/// (it printed first and panicked "failed printing to stdout" before writing -o). A
/// policy named twice, or an empty one, is refused before the run.
#[test]
fn train_with_a_full_stdout_writes_its_file_and_refuses_odd_policy_lists() {
    let dir = scratch("trainfull");
    let kjv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../workloads/text/kjv.txt");
    let text_file = dir.join("t.txt");
    std::fs::write(&text_file, &std::fs::read(kjv).unwrap()[..200_000]).unwrap();
    let t = text_file.to_str().unwrap();
    let base = ["--device", "cpu", "train", "--steps", "1", "--seq-len", "16", "--micro-batch", "2", "--text", t];
    if Path::new("/dev/full").exists() {
        let args = [&base[..], &["--precision", "bf16", "-q", "-o", "t.json"]].concat();
        let o = command(&dir, &args).stdout(std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap()).output().unwrap();
        let (_, err) = text(&o);
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("cannot write the result to stdout"), "{err}");
        assert!(std::fs::metadata(dir.join("t.json")).unwrap().len() > 0, "{err}");
    }
    for (extra, want) in [
        (&["--compare", "bf16,bf16"][..], "bf16 twice"),
        (&["--compare", "bf16,"][..], "empty policy name"),
        (&["--precision", "bf16", "--plan-for", "H1000"][..], "--plan-for H1000: no such device"),
        (&["--precision", "bf16", "--checkpoint-every", "0"][..], "0 steps: rollbacks return to a checkpoint"),
    ] {
        let o = runner(&dir, &[&base[..], extra].concat());
        assert!(!o.status.success() && text(&o).1.contains(want), "{extra:?}: {}", text(&o).1);
    }
}

/// `train`'s output in each format: the tables by default (and a -o file in its
/// extension's format; its JSON's training points with their learning rates), the
/// summary as CSV, the page with the curves as HTML.
#[test]
fn train_prints_each_format() {
    let dir = scratch("trainformats");
    let kjv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../workloads/text/kjv.txt");
    let text_file = dir.join("t.txt");
    std::fs::write(&text_file, &std::fs::read(kjv).unwrap()[..200_000]).unwrap();
    let base = ["--device", "cpu", "train", "--steps", "1", "--seq-len", "16", "--micro-batch", "2", "--precision", "bf16", "-q", "--text"];
    let run = |extra: &[&str]| {
        let o = runner(&dir, &[&base[..], &[text_file.to_str().unwrap()], extra].concat());
        let (out, err) = text(&o);
        assert!(o.status.success(), "{extra:?}: {err}");
        out
    };
    let table = run(&["-o", "t.json"]);
    assert!(table.contains("held-out loss") && table.contains("precision decisions"), "{table}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("t.json")).unwrap()).unwrap();
    assert_eq!(json["runs"][0]["policy"], "bf16", "{json}");
    // Each training point carries its step's learning rate (one step: the peak); a
    // held-out point has none.
    let point = |curve: &str| json["runs"][0][curve][0].as_object().unwrap().clone();
    assert!(point("train")["learning_rate"].as_f64().is_some_and(|lr| lr > 0.0), "{json}");
    assert!(!point("eval").contains_key("learning_rate"), "{json}");
    // The CSV is the report in long form for scripts, one header: a summary row per
    // policy and a row per point of each curve, the JSON's figures unrounded.
    let csv = run(&["--format", "csv"]);
    let (header, rows) = csv_of(&csv);
    assert_eq!(header[..2], ["kind", "policy"], "{csv}");
    let col = |name: &str| header.iter().position(|h| h == name).unwrap_or_else(|| panic!("{name}: {csv}"));
    let summary = rows.iter().find(|r| r[0] == "summary").unwrap();
    // Seeded: the same losses as the JSON's run.
    // (serde_json reads a float back from its text up to an ulp off: equal to 1e-12.)
    assert!(same(summary[col("final_eval_loss")].parse().unwrap(), json["runs"][0]["final_eval_loss"].as_f64().unwrap()), "{csv}");
    assert!(same(summary[col("planned_coverage")].parse().unwrap(), json["runs"][0]["planned_coverage"].as_f64().unwrap()), "{csv}");
    let eval: Vec<f64> = rows.iter().filter(|r| r[0] == "eval").map(|r| r[col("loss")].parse().unwrap()).collect();
    let want: Vec<f64> = json["runs"][0]["eval"].as_array().unwrap().iter().map(|p| p["loss"].as_f64().unwrap()).collect();
    assert!(eval.len() == want.len() && eval.iter().zip(&want).all(|(a, b)| same(*a, *b)), "{csv}");
    assert_eq!(rows.iter().filter(|r| r[0] == "train").count(), json["runs"][0]["train"].as_array().unwrap().len(), "{csv}");
    assert!(!csv.lines().filter(|l| !l.starts_with('#')).any(|l| l.contains('%')), "{csv}");
    let html = run(&["--format", "html"]);
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("<svg"), "{html}");
    // --format beside -o is the file's format; the terminal keeps the tables.
    let table = run(&["--format", "html", "-o", "t.page"]);
    assert!(table.contains("held-out loss") && !table.contains("<svg"), "{table}");
    assert!(std::fs::read_to_string(dir.join("t.page")).unwrap().starts_with("<!DOCTYPE html>"));
}

/// `train --optimizer muon` trains with Muon and says so in the JSON and the notes;
/// left out, the tiny variant's plugin default (AdamW) as before. Two steps each: the
/// held-out losses differ, so the flag reached the executor.
#[test]
fn train_with_muon_names_it_and_trains_differently() {
    let dir = scratch("trainmuon");
    let kjv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../workloads/text/kjv.txt");
    let text_file = dir.join("t.txt");
    std::fs::write(&text_file, &std::fs::read(kjv).unwrap()[..200_000]).unwrap();
    let base = ["--device", "cpu", "train", "--steps", "2", "--seq-len", "16", "--micro-batch", "2", "--precision", "bf16", "-q", "--format", "json", "--text", text_file.to_str().unwrap()];
    let run = |extra: &[&str]| {
        let o = runner(&dir, &[&base[..], extra].concat());
        let (out, err) = text(&o);
        assert!(o.status.success(), "{extra:?}: {err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let (muon, adamw) = (run(&["--optimizer", "muon"]), run(&[]));
    assert_eq!((muon["optimizer"].as_str(), adamw["optimizer"].as_str()), (Some("muon"), Some("adamw")));
    let notes = |v: &serde_json::Value| v["notes"].to_string();
    assert!(notes(&muon).contains("Muon on the hidden matrices") && !notes(&muon).contains("does not implement"), "{}", notes(&muon));
    assert!(notes(&adamw).contains("AdamW (beta2"), "{}", notes(&adamw));
    let eval = |v: &serde_json::Value| v["runs"][0]["final_eval_loss"].as_f64().unwrap();
    assert!(eval(&muon).is_finite() && eval(&muon) != eval(&adamw), "{} vs {}", eval(&muon), eval(&adamw));
    let o = runner(&dir, &[&base[..], &["--optimizer", "sgd"]].concat());
    assert!(!o.status.success() && text(&o).1.contains("sgd") && !text(&o).1.contains("panicked"), "{}", text(&o).1);
}

/// `--muon-tp-mode` beside `--optimizer muon`: `train` names the mode in its JSON and
/// notes (one device: the same update either way), `bench step` in its table's flags and
/// each rank's JSON; beside AdamW (given, or `bench step`'s default), or misspelt, it is
/// refused before anything runs, naming `--optimizer muon`.
#[test]
fn the_muon_tp_mode_flag_is_shown_with_muon_and_refused_without_it() {
    let dir = scratch("muontpmode");
    let kjv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../workloads/text/kjv.txt");
    let text_file = dir.join("t.txt");
    std::fs::write(&text_file, &std::fs::read(kjv).unwrap()[..200_000]).unwrap();
    let base = ["--device", "cpu", "train", "--steps", "2", "--seq-len", "16", "--micro-batch", "2", "--precision", "bf16", "-q", "--format", "json", "--text", text_file.to_str().unwrap()];
    let o = runner(&dir, &[&base[..], &["--optimizer", "muon", "--muon-tp-mode", "blockwise"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["optimizer"].as_str(), v["muon_tp_mode"].as_str()), (Some("muon"), Some("blockwise")), "{out}");
    assert!(v["notes"].to_string().contains("tensor-parallel mode blockwise"), "{}", v["notes"]);
    // AdamW's JSON has no mode.
    let o = runner(&dir, &[&base[..], &["--optimizer", "adamw"]].concat());
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert!(v.get("muon_tp_mode").is_none(), "{v}");
    for (args, want) in [
        (vec!["--optimizer", "adamw", "--muon-tp-mode", "blockwise"], "--muon-tp-mode blockwise: it sets how Muon orthogonalises tensor-parallel blocks"),
        (vec!["--optimizer", "muon", "--muon-tp-mode", "rowwise"], "invalid value 'rowwise'"),
    ] {
        let o = runner(&dir, &[&base[..], &args[..]].concat());
        let err = text(&o).1;
        assert!(!o.status.success() && err.contains(want) && !err.contains("panicked"), "{args:?}: {err}");
    }
    // bench step: the mode in the flags its table's title shows.
    let step = ["--device", "cpu", "bench", "step", "--layout", "tp=2", "--steps", "1", "--in-process"];
    let o = runner(&dir, &[&step[..], &["--optimizer", "muon", "--muon-tp-mode", "blockwise"]].concat());
    let (out, err) = text(&o);
    assert!(o.status.success() && out.contains("--optimizer muon --muon-tp-mode blockwise") && out.contains("orthogonalises its own block"), "{out}\n{err}");
    let o = runner(&dir, &[&step[..], &["--muon-tp-mode", "blockwise"]].concat());
    let err = text(&o).1;
    assert!(!o.status.success() && err.contains("this run's optimizer is adamw; give --optimizer muon with it"), "{err}");
}

/// `train` on a log (stderr not a terminal) names each step as it begins, with where the
/// run stands, so a step of minutes is seen running; it printed a step once it ended,
/// and nothing at all while the first ran.
#[test]
fn train_on_a_log_names_the_step_it_begins() {
    let dir = scratch("trainsteps");
    let kjv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../workloads/text/kjv.txt");
    let text_file = dir.join("t.txt");
    std::fs::write(&text_file, &std::fs::read(kjv).unwrap()[..200_000]).unwrap();
    let args = ["--device", "cpu", "train", "--steps", "2", "--seq-len", "16", "--micro-batch", "2", "--precision", "bf16", "--text", text_file.to_str().unwrap()];
    let o = runner(&dir, &args);
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.lines().any(|l| l.starts_with("1/2 bf16.wasm: held-out loss ")), "{err}");
    let o = runner(&dir, &[&args[..], &["-q"]].concat());
    assert_eq!(text(&o).1, "", "-q");
}

/// A small, fast explorer run (one precision, two counts, one cloud, one measured step).
const HIST_RUN: [&str; 13] =
    ["explore", "--plugin", "llama3", "--variant", "llama3-tiny", "--gpus", "8,16", "--precision", "bf16", "--repeats", "1", "--cloud", "lambda"];

/// `--device` reaches the measured step through `local_device` (set once by the command
/// line, read where the step is measured): the emulated device is refused there, so the
/// run goes on unmeasured and says why; `cpu` measures on the CPU without the note an
/// `auto` that found no GPU adds. Left at `auto` (the flag not recorded), both read
/// alike on a machine without a GPU: the CPU, with "no usable GPU".
#[test]
fn the_device_flag_reaches_the_measured_step() {
    let run = |device: &str, variant: &str| {
        let mut args = vec!["--device", device];
        args.extend(HIST_RUN);
        args[6] = variant;
        args.extend(["--format", "json", "-q"]);
        let o = runner(&scratch(&format!("measure-{device}-{variant}")), &args);
        assert!(o.status.success(), "{}", text(&o).1);
        serde_json::from_str::<serde_json::Value>(&text(&o).0).unwrap()
    };
    let notes = |v: &serde_json::Value| v["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str().map(String::from)).collect::<Vec<String>>();
    let emulated = notes(&run("cuda-emulated", "llama3-tiny"));
    assert!(
        emulated.iter().any(|n| n.starts_with("not measured on this device: --device cuda-emulated computes what a GPU would")),
        "{emulated:#?}"
    );
    let cpu = run("cpu", "llama3-tiny");
    let measured: Vec<String> = notes(&cpu).into_iter().filter(|n| n.starts_with("measured: ")).collect();
    assert!(measured.len() == 1 && !measured[0].contains("Device: "), "{measured:#?}");
    // The CPU's size (measure.rs): the variant itself where its two layers fit the 1 GiB
    // budget, at its sequence (at most 256) and 2048 tokens a step, composed to its depth.
    let m = &cpu["measurement"];
    let size = |m: &serde_json::Value| [&m["variant"], &m["layers_run"], &m["full_layers"], &m["seq_len"], &m["micro_batch"]].map(|x| x.to_string());
    assert_eq!(size(m), ["\"llama3-tiny\"", "2", "4", "256", "8"], "{m}");
    assert_eq!(m["why_this_size"], "llama3-tiny itself (2 layers fit the 1 GiB budget)");
    // A variant whose two layers do not fit: the family's smallest that does, said why.
    let big = run("cpu", "llama3.1-70b");
    let m = &big["measurement"];
    assert_eq!(size(m), ["\"llama3-tiny\"", "2", "4", "256", "8"], "{m}");
    let why = m["why_this_size"].as_str().unwrap();
    // 2 layers and the 128256 x 8192 embedding and head: 3.81B parameters at 16 bytes.
    assert_eq!(
        why,
        "llama3.1-70b's 2 layers need 56.8 GiB of f32 weights and optimizer state, beyond the CPU budget, so the family's \
         proxy llama3-tiny was run"
    );
}

/// The batch notes follow the rows, GPU counts upward (sorted as text they read 128,
/// 16, 8).
#[test]
fn batch_notes_follow_the_gpu_counts() {
    let dir = scratch("gbs-notes");
    let mut args = HIST_RUN.to_vec();
    args[6] = "128,8,16";
    args.extend(["--format", "json", "-q"]);
    let o = runner(&dir, &args);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    let gbs: Vec<&str> = v["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).filter(|n| n.starts_with("GBS ")).collect();
    let at: Vec<&str> = gbs.iter().map(|n| n.split(" GPUs").next().unwrap().rsplit(' ').next().unwrap()).collect();
    assert_eq!(at, ["8", "16", "128"], "{gbs:?}");
}

/// `args` with `--history FILE` in front.
/// Run `statement` on a history database (created by the store first, so its schema
/// exists): what a crash, an old runner or a full disk leaves behind.
fn sql(history: &Path, statement: &str) {
    drop(runner_store::Store::open(history).unwrap());
    rusqlite::Connection::open(history).unwrap().execute_batch(statement).unwrap();
}

fn with_history<'a>(history: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--history", history];
    v.extend_from_slice(args);
    v
}

/// A history that cannot be written (an item insert, the run's insert or its closing
/// update fails, as on a full disk) does not cost the run: one warning naming the file
/// and the error, and the result is printed and written to -o. It used to fail with only
/// "error: history database ...".
#[test]
fn a_history_that_cannot_be_written_warns_once_and_the_run_goes_on() {
    for (case, trigger) in [
        ("items", "CREATE TRIGGER boom BEFORE INSERT ON items BEGIN SELECT RAISE(FAIL, 'boom'); END;"),
        ("begin", "CREATE TRIGGER boom BEFORE INSERT ON runs BEGIN SELECT RAISE(FAIL, 'boom'); END;"),
        ("finish", "CREATE TRIGGER boom BEFORE UPDATE OF result ON runs BEGIN SELECT RAISE(FAIL, 'boom'); END;"),
    ] {
        let dir = scratch(&format!("histfail-{case}"));
        let history = dir.join("h.sqlite");
        sql(&history, trigger);
        let h = history.to_str().unwrap();
        let mut args = with_history(h, &HIST_RUN);
        args.extend(["-o", "out.json"]);
        let o = runner(&dir, &args);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{case}: {err}");
        assert!(out.contains("llama3-tiny") && out.contains("H100 bf16"), "{case}: the result is printed: {out}");
        let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("out.json")).unwrap()).unwrap();
        assert_eq!(file["series"][0]["rows"].as_array().unwrap().len(), 2, "{case}");
        let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("warning:")).collect();
        assert_eq!(warnings.len(), 1, "{case}: one warning: {err}");
        assert!(warnings[0].contains(h) && warnings[0].contains("boom") && warnings[0].contains("not kept"), "{case}: {err}");
        assert!(!err.contains("error:") && !err.contains("kept as run"), "{case}: {err}");
    }
}

/// The paths a user typed reach stderr escaped, as in every error: the -o file's "wrote"
/// line and the warning of a history that cannot be opened printed a terminal sequence
/// in the name raw.
#[test]
fn typed_paths_reach_stderr_escaped() {
    let dir = scratch("typed-paths");
    std::fs::write(dir.join("plain"), "").unwrap();
    let mut args = with_history("plain/\u{1b}[2Jh.sqlite", &HIST_RUN);
    args.extend(["-o", "\u{1b}[2Jout.json"]);
    let o = runner(&dir, &args);
    let err = text(&o).1;
    assert!(o.status.success(), "{err}");
    assert!(err.contains("warning: not kept in the history: history database plain/\\u{1b}[2Jh.sqlite"), "{err}");
    assert!(err.contains("wrote \\u{1b}[2Jout.json"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err:?}");
    assert!(dir.join("\u{1b}[2Jout.json").is_file());
}

/// A history written before `owner_pid` was recorded (the runs table without it) is
/// migrated: explore keeps its run there and `history` lists the old runs. It failed
/// "no such column: owner_pid".
#[test]
fn a_history_from_an_older_schema_is_migrated() {
    let dir = scratch("histold");
    let history = dir.join("h.sqlite");
    let h = history.to_str().unwrap();
    let o = runner(&dir, &with_history(h, &[&HIST_RUN[..], &["-q"]].concat()));
    assert!(o.status.success(), "{}", text(&o).1);
    // What an older runner's file looks like: the runs table without owner_pid (dropped
    // here through a handle that is then closed; opening the file is what migrates it).
    sql(&history, "ALTER TABLE runs DROP COLUMN owner_pid");
    let mut args = with_history(h, &HIST_RUN);
    assert_eq!(args[8], "8,16");
    args[8] = "8,32";
    let o = runner(&dir, &args);
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("owner_pid") && !err.contains("warning"), "{err}");
    assert!(err.contains("kept as run 2"), "{err}");
    let o = runner(&dir, &["--history", h, "history", "--format", "json"]);
    let runs: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 2, "{runs}");
}

/// An interrupted run is resumed only with the same plugins: the cost plugin at the same
/// path swapped for another between the runs starts a fresh run, priced by the new
/// plugin. The resume key held the run file, profiles and price file but not the
/// plugins' sha256, so the rows priced by the old plugin were reused.
#[test]
fn an_interrupted_run_is_not_resumed_with_another_cost_plugin() {
    let dir = scratch("histplugin");
    let history = dir.join("h.sqlite");
    let (h, cloud) = (history.to_str().unwrap().to_string(), dir.join("cloud.wasm"));
    let mut args = with_history(&h, &HIST_RUN);
    let cloud_arg = cloud.to_str().unwrap().to_string();
    *args.last_mut().unwrap() = &cloud_arg;
    args.extend(["--format", "json"]);
    let usd = |out: &str| -> Vec<f64> {
        let v: serde_json::Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"));
        v["series"][0]["rows"].as_array().unwrap().iter().map(|r| r["costs"][0]["usd"].as_f64().unwrap()).collect()
    };
    std::fs::write(&cloud, embedded_wasm("aws.wasm")).unwrap();
    let o = runner(&dir, &args);
    let (out, err) = text(&o);
    assert!(o.status.success() && err.contains("kept as run 1"), "{err}");
    let aws = usd(&out);
    // Interrupted as a killed runner leaves it.
    sql(&history, "UPDATE runs SET status = 'running', owner_pid = 0, result = NULL, finished = NULL");
    std::fs::write(&cloud, embedded_wasm("lambda.wasm")).unwrap();
    let o = runner(&dir, &args);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("resumed") && err.contains("kept as run 2"), "a fresh run: {err}");
    let lambda = usd(&out);
    let o = runner(&dir, &[&args[..], &["--no-history"]].concat());
    assert_eq!(lambda, usd(&text(&o).0), "priced by the plugin now at the path");
    assert_ne!(lambda, aws, "the two plugins price differently");
    // The same plugin again resumes the interrupted run it matches.
    sql(&history, "UPDATE runs SET status = 'running', owner_pid = 0, result = NULL WHERE id = 2");
    let o = runner(&dir, &args);
    let (out, err) = text(&o);
    assert!(err.contains("kept as run 2, resumed"), "{err}");
    assert_eq!(usd(&out), lambda);
}

/// stdout closed (`runner show 1 -o y.json | head -c 10`), with stderr or alone, or full (`>/dev/full`): no
/// panic, and the -o file is written. A closed pipe ends quietly (exit 0); a full disk
/// is an error with a message. It panicked "failed printing to stdout" and never wrote
/// the file.
#[test]
fn a_closed_or_full_stdout_neither_panics_nor_loses_the_output_file() {
    let dir = scratch("histpipe");
    let history = dir.join("h.sqlite");
    let h = history.to_str().unwrap();
    let o = runner(&dir, &with_history(h, &[&HIST_RUN[..], &["-q"]].concat()));
    assert!(o.status.success(), "{}", text(&o).1);
    let closed = |args: &[&str]| -> Output {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        command(&dir, args).stdout(writer).output().unwrap()
    };
    let cases: [(&str, Vec<&str>); 4] = [
        ("y.json", vec!["--history", h, "show", "1", "--format", "json", "-o", "y.json"]),
        ("y.html", vec!["--history", h, "show", "1", "-o", "y.html"]),
        ("list.csv", vec!["--history", h, "history", "-o", "list.csv"]),
        ("run.csv", with_history(h, &[&HIST_RUN[..], &["-o", "run.csv"]].concat())),
    ];
    for (file, args) in &cases {
        let _ = std::fs::remove_file(dir.join(file));
        let o = closed(args);
        let (_, err) = text(&o);
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
        assert!(std::fs::metadata(dir.join(file)).unwrap().len() > 0, "{file} written: {err}");
    }
    // stderr closed too (`runner ... 2>&1 | head`): its lines ("wrote FILE", the notes) are
    // lost, not the run; eprintln! panicked there (exit 101).
    for (file, args) in &cases {
        let _ = std::fs::remove_file(dir.join(file));
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = command(&dir, args).stdout(writer.try_clone().unwrap()).stderr(writer).output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{args:?}");
        assert!(std::fs::metadata(dir.join(file)).unwrap().len() > 0, "{file} written");
    }
    if Path::new("/dev/full").exists() {
        for (file, args) in &cases {
            let _ = std::fs::remove_file(dir.join(file));
            let o = command(&dir, args).stdout(std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap()).output().unwrap();
            let (_, err) = text(&o);
            assert!(!err.contains("panicked"), "{args:?}: {err}");
            assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
            assert!(err.contains("error: cannot write the result to stdout"), "{args:?}: {err}");
            assert!(std::fs::metadata(dir.join(file)).unwrap().len() > 0, "{file} written: {err}");
        }
    }
}

/// `show` answers in the format asked for a failed run too (JSON an object, CSV a row,
/// HTML escaped), and refuses a stored result it cannot render, naming the run and what
/// is missing. It printed `run 1 failed: boom <script>` raw in every format (into an
/// .html file too), and nothing (or `null`) with exit 0 for a result without renderings.
#[test]
fn show_renders_failed_and_odd_runs_in_the_format_asked_for() {
    let dir = scratch("histshow");
    let history = dir.join("h.sqlite");
    let h = history.to_str().unwrap();
    let insert = |status: &str, result: &str| {
        sql(
            &history,
            &format!(
                "INSERT INTO runs (kind, command, inputs, inputs_sha256, plugins, started, finished, status, result, runner_version)
                 VALUES ('explore', 'runner explore', '{{}}', 'k', '[]', '2026-01-01T00:00:00Z', '2026-01-01T00:01:00Z', '{status}', '{result}', '0')"
            ),
        );
    };
    insert("failed", r#"{"error": "boom <script>, \"x\""}"#);
    insert("done", "[1, 2]");
    insert("done", r#"{"outcome": {"series": []}}"#);
    insert("done", r#"{"renderings": {"table": "t"}}"#);
    let show = |args: &[&str]| runner(&dir, &[&["--history", h, "show"][..], args].concat());

    let o = show(&["1", "--format", "json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!((v["id"].clone(), v["status"].clone(), v["error"].clone()), (1.into(), "failed".into(), r#"boom <script>, "x""#.into()));
    let o = show(&["1", "--format", "csv"]);
    let out = text(&o).0;
    let header = csv_cells(out.lines().next().unwrap());
    let row = csv_cells(out.lines().nth(1).unwrap());
    let error = header.iter().position(|c| c == "error").unwrap();
    assert_eq!(row[error], r#"boom <script>, "x""#, "{out}");
    assert_eq!(row[header.iter().position(|c| c == "status").unwrap()], "failed");
    let o = show(&["1", "-o", "x.html"]);
    assert!(o.status.success());
    let html = std::fs::read_to_string(dir.join("x.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("boom &lt;script&gt;") && !html.contains("<script>"), "{html}");
    assert!(text(&o).0.contains("run 1 failed: boom <script>"), "the terminal still reads a sentence");
    // --format names the file's format beside -o: the terminal keeps the sentence.
    let o = show(&["1", "--format", "json", "-o", "x.json"]);
    assert!(o.status.success() && text(&o).0.starts_with("run 1 failed: boom"), "{}", text(&o).0);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("x.json")).unwrap()).unwrap();
    assert_eq!(v["status"], "failed", "{v}");

    for (id, format, want) in [
        ("2", "table", "run 2's stored result is not an object"),
        ("2", "json", "run 2's stored result is not an object"),
        ("3", "table", "run 3's stored result has no renderings.table"),
        ("3", "html", "run 3's stored result has no renderings.html"),
        ("4", "json", "run 4's stored result has no outcome"),
    ] {
        let o = show(&[id, "--format", format]);
        let (out, err) = text(&o);
        assert!(!o.status.success() && out.is_empty(), "{id} {format}: {out}");
        assert!(err.contains(want), "{id} {format}: {err}");
    }
    // A result that renders in the format shown but not in the -o file's: an error, and
    // no file.
    let o = show(&["4", "-o", "four.json"]);
    assert!(!o.status.success() && text(&o).1.contains("has no outcome"), "{}", text(&o).1);
    assert!(!dir.join("four.json").exists());
    // A history handed over may carry terminal sequences in its renderings: reprinted
    // escaped (raw before), the JSON's as \u escapes of the same strings, a zero-width
    // space's too.
    insert("done", r#"{"renderings": {"table": "t\u001b[2J\n", "json": "{\"a\": \"\u001b[2J\u202e\u200b\"}"}}"#);
    let o = show(&["5"]);
    assert_eq!(text(&o).0, "t\\u{1b}[2J\n");
    let o = show(&["5", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap_or_else(|e| panic!("{e}: {:?}", text(&o).0));
    assert_eq!(v["a"], "\u{1b}[2J\u{202e}\u{200b}");
    assert!(!text(&o).0.contains(['\u{1b}', '\u{202e}', '\u{200b}']), "{:?}", text(&o).0);
}

/// `history --limit 0` is refused (it said "no runs yet"); a missing id names the ids
/// there, gaps included (it said "runs are numbered 1 to N"); a run marked running whose
/// process is gone reads "interrupted" in `history`, `show` and `compare` (it read "running").
#[test]
fn history_wording_limit_missing_ids_and_interrupted_runs() {
    let dir = scratch("histwords");
    let history = dir.join("h.sqlite");
    let h = history.to_str().unwrap();
    for (id, status, pid) in [(3, "done", 0), (5, "running", 0), (7, "running", std::process::id())] {
        sql(
            &history,
            &format!(
                "INSERT INTO runs (id, kind, command, inputs, inputs_sha256, plugins, started, status, runner_version, owner_pid)
                 VALUES ({id}, 'explore', 'runner explore', '{{}}', 'k{id}', '[]', '2026-01-01T00:00:00Z', '{status}', '0', {pid})"
            ),
        );
    }
    let o = runner(&dir, &["--history", h, "history", "--limit", "0"]);
    let (out, err) = text(&o);
    assert!(!o.status.success() && out.is_empty() && err.contains("--limit 0"), "{out}{err}");
    assert!(!err.contains("no runs yet"));

    let o = runner(&dir, &["--history", h, "show", "57"]);
    let err = text(&o).1;
    assert!(!o.status.success() && err.contains("no run 57") && err.contains("lowest 3") && err.contains("highest 7"), "{err}");
    assert!(!err.contains("1 to"), "{err}");

    let o = runner(&dir, &["--history", h, "history", "--format", "json"]);
    let runs: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    let status = |id: i64| runs.as_array().unwrap().iter().find(|r| r["id"] == id).unwrap()["status"].as_str().unwrap().to_string();
    assert_eq!((status(3), status(5), status(7)), ("done".into(), "interrupted".into(), "running".into()), "{runs}");
    let o = runner(&dir, &["--history", h, "history"]);
    assert!(text(&o).0.lines().any(|l| l.starts_with("5 ") && l.contains("interrupted")), "{}", text(&o).0);
    let o = runner(&dir, &["--history", h, "show", "5"]);
    assert!(text(&o).0.contains("is interrupted"), "{}", text(&o).0);
    // compare too, in its outcome and its notes (it said running).
    let o = runner(&dir, &["--history", h, "compare", "5", "7", "--format", "csv"]);
    let out = text(&o).0;
    assert!(out.contains("outcome,status,interrupted,running\n") && out.contains("runner explore` (2026-01-01T00:00:00Z, interrupted)"), "{out}");

    // Pruning: --keep 0 is refused; --keep 1 deletes 3 and the interrupted 5 but not the
    // newest, and --prune-before never deletes 7, whose process (this test) still runs.
    let o = runner(&dir, &["--history", h, "history", "--keep", "0"]);
    assert!(!o.status.success() && text(&o).1.contains("--keep 0 would delete every run"), "{}", text(&o).1);
    let o = runner(&dir, &["--history", h, "history", "--keep", "1"]);
    let out = text(&o).0;
    assert!(o.status.success() && out.contains("pruned: 2 run(s) past the newest 1 deleted with their 0 row(s)"), "{out}{}", text(&o).1);
    let o = runner(&dir, &["--history", h, "history", "--prune-before", "2027-01-01", "--format", "json"]);
    let runs: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(runs.as_array().unwrap().iter().map(|r| r["id"].as_i64().unwrap()).collect::<Vec<_>>(), [7], "{runs}");
}

/// Mistakes a long run would only find at its end are refused at its start: an output in
/// a directory that does not exist, a cloud named that is not installed (a typo once gave
/// a table without prices and a note among thirty). Neither leaves a file behind, and a
/// control character in a name reaches the terminal escaped.
#[test]
fn an_unwritable_output_or_an_unknown_cloud_is_refused_before_the_run() {
    let dir = scratch("refused-early");
    let started = std::time::Instant::now();
    let o = runner(&dir, &["explore", "--model", "llama3.1-8b", "--gpus", "8", "--no-history", "-q", "-o", "missing/x.json"]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("the directory missing does not exist"), "{err}");
    let o = runner(&dir, &["explore", "--model", "llama3.1-8b", "--gpus", "8", "--no-history", "-q", "-o", "."]);
    assert!(!o.status.success() && text(&o).1.contains("is a directory"), "{}", text(&o).1);
    let o = runner(&dir, &["explore", "--model", "llama3.1-8b", "--gpus", "8", "--no-history", "-q", "--cloud", "aws,nosuch\u{1b}[2J"]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("the cloud nosuch\\u{1b}[2J cannot be used") && err.contains("no plugin"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err:?}");
    assert!(started.elapsed().as_secs() < 60, "refused before measuring");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.iter().all(|n| n == "data"), "{left:?}");
}

/// A file name that is not UTF-8 (a Latin-1 name, say) is a path like any other: a run
/// file so named runs and is kept in the history (the history's command line panicked on
/// it), and a --price-file so named is refused by name (it became another file's name).
#[cfg(unix)]
#[test]
fn a_file_name_that_is_not_utf8_neither_panics_nor_names_another_file() {
    use std::os::unix::ffi::OsStrExt as _;
    let dir = scratch("not-utf8");
    let name = std::ffi::OsStr::from_bytes(b"caf\xe9.toml");
    std::fs::write(dir.join(name), "[model]\nplugin = \"llama3.wasm\"\nvariant = \"llama3-tiny\"\n[cluster]\ngpus = [8]\n[precision]\nformat = \"bf16\"\n[cost]\nplugins = [\"aws\"]\n").unwrap();
    let o = command(&dir, &["run"]).arg(name).arg("-q").output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success() && out.contains("llama3-tiny"), "{err}");
    let o = runner(&dir, &["history", "--format", "json"]);
    let runs: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(runs[0]["command"].as_str().unwrap().rsplit('/').next().unwrap(), "runner run caf\u{fffd}.toml -q", "{runs}");
    let prices = std::ffi::OsStr::from_bytes(b"pr\xe9.csv");
    std::fs::write(dir.join(prices), "InstanceType,AcceleratorName,AcceleratorCount,Region,Price,SpotPrice\nours,H100,8,eu,10,\n").unwrap();
    let o = command(&dir, &["explore", "--plugin", "llama3", "--variant", "llama3-tiny", "--gpus", "8", "--no-history", "-q", "--price-file"])
        .arg(prices)
        .output()
        .unwrap();
    let err = text(&o).1;
    assert!(!o.status.success() && err.contains("--price-file pr\u{fffd}.csv: the file name is not UTF-8"), "{err}");
}

/// -o over a file the command reads though no argument names it is refused, the file kept:
/// the history at its default path (any command's report replaced the database), and a
/// run file's price file (`runner run r.toml -o ours.csv` replaced the prices with the report).
#[test]
fn output_over_the_history_or_a_run_files_price_file_is_refused() {
    let dir = scratch("output-inputs");
    let prices = "InstanceType,AcceleratorName,AcceleratorCount,Region,Price,SpotPrice\nours,H100,8,eu,10,\n";
    std::fs::write(dir.join("ours.csv"), prices).unwrap();
    std::fs::write(
        dir.join("r.toml"),
        "[model]\nplugin = \"llama3.wasm\"\nvariant = \"llama3-tiny\"\n[cluster]\ngpus = [8]\n[precision]\nformat = \"bf16\"\n[cost]\nplugins = [\"aws\"]\nprice_file = \"ours.csv\"\n",
    )
    .unwrap();
    let o = runner(&dir, &["run", "r.toml", "-q", "-o", "ours.csv"]);
    let err = text(&o).1;
    assert!(!o.status.success() && err.contains("-o ours.csv is also an input of this run (ours.csv)"), "{err}");
    assert_eq!(std::fs::read_to_string(dir.join("ours.csv")).unwrap(), prices);
    let o = runner(&dir, &["run", "r.toml", "-q"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let history = dir.join("data/runner/history.sqlite");
    let kept = std::fs::read(&history).unwrap();
    for args in [&["history", "-o", "data/runner/history.sqlite"][..], &["models", "-o", "data/runner/history.sqlite"]] {
        let o = runner(&dir, args);
        let err = text(&o).1;
        assert!(!o.status.success() && err.contains("is the history database"), "{args:?}: {err}");
    }
    assert_eq!(std::fs::read(&history).unwrap(), kept);
    let o = runner(&dir, &["show", "1", "-q"]);
    assert!(o.status.success() && text(&o).0.contains("llama3-tiny"), "{}", text(&o).1);
}

/// The goal and sweet-spot flags reach the run: --max-usd-per-day-saved is the threshold the
/// report states, --target-days the goal it answers, and a goal without --gpus walks the
/// goal's GPU counts (8 to 16,384).
#[test]
fn goal_and_sweet_spot_flags_reach_the_run() {
    let dir = scratch("goal-flags");
    let base = ["explore", "--plugin", "llama3", "--variant", "llama3-tiny", "--precision", "bf16", "--cloud", "aws", "--no-history", "--format", "json", "-q"];
    let json = |extra: &[&str]| {
        let o = runner(&dir, &[&base[..], extra].concat());
        let (out, err) = text(&o);
        assert!(o.status.success(), "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let v = json(&["--gpus", "8,16", "--max-usd-per-day-saved", "1234", "--target-days", "1000"]);
    assert!(v["sweet_spot_rule"].as_str().unwrap().contains("stays under $1.2K per day"), "{}", v["sweet_spot_rule"]);
    assert_eq!(v["goal"]["goal"], serde_json::json!({"target-days": 1000.0}));
    let v = json(&["--budget", "1e9"]);
    let counts: Vec<u64> = v["series"][0]["rows"].as_array().unwrap().iter().map(|r| r["requested_gpus"].as_u64().unwrap()).collect();
    assert_eq!(counts, [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]);
}

/// The explorer's `--optimizer` reaches every layout it searches (Muon's layouts say so in
/// their name; the flag was project's and search's alone), and two names of one GPU are
/// one GPU: refused, where they ran its series twice.
#[test]
fn the_explorers_optimizer_and_gpu_aliases_reach_the_run() {
    let dir = scratch("optimizer");
    let base = ["explore", "--plugin", "llama3", "--variant", "llama3-tiny", "--precision", "bf16", "--cloud", "aws", "--gpus", "8", "--no-history", "-q"];
    let layout = |extra: &[&str]| {
        let o = runner(&dir, &[&base[..], &["--format", "json"], extra].concat());
        let (out, err) = text(&o);
        assert!(o.status.success(), "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["series"][0]["rows"][0]["projection"]["layout"].clone()
    };
    assert_eq!(layout(&["--optimizer", "muon"])["optimizer"], "muon");
    assert_eq!(layout(&[])["optimizer"], "adamw");
    let o = runner(&dir, &[&base[..], &["--gpu", "h100,H100-SXM5"]].concat());
    assert!(!o.status.success());
    assert!(text(&o).1.contains("[cluster] gpu names H100 twice: 'h100' and 'H100-SXM5' are the same GPU; list it once"), "{}", text(&o).1);
}

/// An empty `$XDG_DATA_HOME` or `$XDG_CACHE_HOME` is unset and a relative one is ignored
/// (the XDG base directory rule): the history and the compiled-plugin cache go under
/// `$HOME`, never under the working directory, where the empty value put `runner/`.
#[test]
fn empty_or_relative_xdg_directories_fall_back_to_home_not_the_working_directory() {
    let dir = scratch("xdg");
    let home = dir.join("home");
    let explore = ["explore", "--plugin", "llama3", "--variant", "llama3-tiny", "--gpus", "8", "--precision", "bf16", "--cloud", "lambda", "-q"];
    // One run (each compiles the plugins into a fresh cache): an empty data home, a
    // relative cache home.
    let o = command(&dir, &explore)
        .env("HOME", &home)
        .env("XDG_DATA_HOME", "")
        .env("XDG_CACHE_HOME", "rel")
        .env_remove("RUNNER_CACHE_DIR")
        .output()
        .expect("runner starts");
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(home.join(".local/share/runner/history.sqlite").is_file(), "an empty XDG_DATA_HOME: the history is under HOME");
    assert!(home.join(".cache/runner/components").is_dir(), "a relative XDG_CACHE_HOME: the cache is under HOME");
    assert!(!dir.join("runner").exists() && !dir.join("rel").exists(), "nothing under the working directory");
}

fn test_program(name: &str) -> &'static str {
    runner::plugin::test_programs().iter().find(|(n, _)| *n == name).map(|(_, p)| *p).unwrap_or_else(|| panic!("{name}"))
}

/// `plugins list` as a table: a shadowed plugin is marked, a file that fails to load is a
/// row with its error as a note, and the directories searched are named. `plugins
/// validate` of a plugin whose call fails marks the call, prints the table and exits 1
/// with the count; a plugin of several variants says how many; an offering on a GPU that
/// only --profile describes is one it knows.
#[test]
fn plugins_list_notes_and_validate_fails_with_the_count() {
    let dir = scratch("list-notes");
    std::fs::create_dir_all(dir.join("plugins/dist")).unwrap();
    std::fs::write(dir.join("plugins/dist/aws.wasm"), embedded_wasm("aws.wasm")).unwrap();
    std::fs::write(dir.join("plugins/dist/broken.wasm"), b"not a component").unwrap();
    let o = runner(&dir, &["plugins", "list"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.lines().any(|l| l.starts_with("aws.wasm") && l.contains("embedded (shadowed)")), "{out}");
    assert!(!out.lines().any(|l| l.starts_with("aws.wasm") && l.contains("plugins/dist/aws.wasm (shadowed)")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("broken.wasm") && l.contains(" error")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("note: ") && l.contains("broken.wasm")), "{out}");
    assert!(out.contains("note: plugin directories, searched in order before the embedded set: "), "{out}");

    let o = runner(&dir, &["plugins", "validate", test_program("nonsense_workload.wasm")]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.lines().any(|l| l.starts_with("describe") && l.contains("FAILED")), "{out}");
    assert!(err.contains("1 call failed validation"), "{err}");
    let o = runner(&dir, &["plugins", "validate", "llama3"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.lines().any(|l| l.starts_with("describe") && l.contains("ok: ") && l.contains(" variants of ")), "{out}");
    // A GPU --profile describes is one an offering may name.
    std::fs::write(dir.join("h1000.toml"), CPU_PROFILE.replace("cpu-box", "H1000")).unwrap();
    let o = runner(&dir, &["--profile", "h1000.toml", "plugins", "validate", test_program("misbehave_cost.wasm")]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("ok: 12 instances") && !out.contains("never quoted"), "{out}");
}

/// `models` with a plugin shadowed (a copy of llama3.wasm in ./plugins/dist): each variant
/// once, no plugin left out, each plugin in the notes once, FLOPs per token (not per
/// sequence), a variant's own title and layouts, and an unknown name answered with the
/// names there are.
#[test]
fn models_counts_each_variant_once_and_names_them_when_one_is_missing() {
    let dir = scratch("models-shadow");
    std::fs::create_dir_all(dir.join("plugins/dist")).unwrap();
    std::fs::write(dir.join("plugins/dist/llama3.wasm"), embedded_wasm("llama3.wasm")).unwrap();
    let o = runner(&dir, &["models", "-o", "models.json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(!out.contains("note: left out"), "{out}");
    let notes: Vec<&str> = out.lines().filter(|l| l.starts_with("note: plugin: workload plugin ")).collect();
    let mut plugins: Vec<&str> = notes.iter().map(|l| l.split_whitespace().nth(4).unwrap()).collect();
    plugins.sort_unstable();
    let n = plugins.len();
    plugins.dedup();
    assert!(n >= 2 && plugins.len() == n, "each workload plugin once: {notes:?}");
    assert!(notes.iter().any(|l| l.contains("llama3.wasm (contract 0.3.0): ") && l.contains("plugins/dist/llama3.wasm")), "{notes:?}");
    let rows: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("models.json")).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.iter().filter(|r| r["name"] == "llama3-tiny").count(), 1, "{rows:?}");
    let r8 = rows.iter().find(|r| r["name"] == "llama3.1-8b").unwrap();
    // About 6 per parameter (the embedding's none, the attention's some more): 6.41.
    let per_param = r8["flops_per_token"].as_f64().unwrap() / r8["params_active"].as_f64().unwrap();
    assert!((6.0..7.0).contains(&per_param), "{r8}");

    let o = runner(&dir, &["models", "llama3.1-70b"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.starts_with("llama3.1-70b (llama3, llama3.wasm): "), "{out}");
    assert!(out.contains(" x GPUs") && !out.contains(" x GPUs + 0"), "{out}");
    let o = runner(&dir, &["models", "llama3.1-7b"]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("no installed variant is called 'llama3.1-7b' (") && err.contains("llama3.1-70b") && err.contains("gpt3-175b"), "{err}");
}

/// The CPU benches' flags at their edges, each refused with the value that is out of
/// range (the first of a list); -q keeps stderr empty, and without it the wait and the
/// file written are said.
#[test]
fn cpu_bench_flags_are_refused_at_their_edges_and_quiet_is_quiet() {
    let dir = scratch("cpu-bench");
    for (args, want) in [
        (&["gemm", "--sizes", "16385,0"][..], "--sizes: 16385 is outside 1..=16384"),
        (&["gemm", "--sizes", "0,16385"], "--sizes: 0 is outside 1..=16384"),
        (&["quantize", "--rows", "0", "--cols", "4"], "--rows x --cols: 0 x 4 is outside 1..=2^28 elements"),
        (&["quantize", "--rows", "4", "--cols", "0"], "--rows x --cols: 4 x 0 is outside 1..=2^28 elements"),
        (&["quantize", "--rows", "1", "--cols", "268435457"], "--rows x --cols: 1 x 268435457 is outside"),
        (&["layer", "--seq", "128", "--batch", "8193"], "--seq x --batch = 128 x 8193: at most 2^20 tokens a step"),
        (&["layer", "--batch", "18446744073709551615"], "--seq x --batch = 2048 x 18446744073709551615: at most 2^20"),
        (&["step", "--layout", "dp=4097", "--in-process"], "--layout tp=1,pp=1,dp=4097 is 4097 ranks: a run in one process takes at most 4096"),
    ] {
        let o = runner(&dir, &[&["--device", "cpu", "bench"][..], args, &["-q"]].concat());
        let err = text(&o).1;
        assert!(!o.status.success() && err.contains(want) && !err.contains("panicked"), "{args:?}: {err}");
    }
    let o = runner(&dir, &["--device", "cpu", "bench", "quantize", "--rows", "64", "--cols", "64", "-q", "-o", "q.csv"]);
    let (out, err) = text(&o);
    assert!(o.status.success() && err.is_empty(), "{err}");
    assert!(out.contains("recipe"), "{out}");
    assert!(std::fs::read_to_string(dir.join("q.csv")).unwrap().starts_with("recipe,"));
    let o = runner(&dir, &["--device", "cpu", "bench", "quantize", "--rows", "64", "--cols", "64", "-o", "q.json"]);
    let err = text(&o).1;
    assert!(o.status.success(), "{err}");
    assert!(err.contains("quantising a 64 x 64 operand under each recipe, 7 passes each...") && err.contains("wrote q.json"), "{err}");
    let rows: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("q.json")).unwrap()).unwrap();
    assert!(!rows.as_array().unwrap().is_empty());
}

/// `bench plugins` with fewer calls than a batch still times one batch of each.
#[test]
fn bench_plugins_times_one_batch_at_least() {
    let dir = scratch("bench-plugins");
    let o = runner(&dir, &["bench", "plugins", "--calls", "1", "--format", "json", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    let samples: Vec<u64> = rows.as_array().unwrap().iter().map(|r| r["samples"].as_u64().unwrap()).collect();
    assert_eq!(samples, [20, 5, 50, 1, 1], "{out}");
}

/// A collectives sweep on a log (stderr not a terminal): the first progress line at once,
/// the next not before 15 s (a sweep of seconds shows one); none with -q.
#[test]
fn collectives_progress_reaches_a_log_once_per_interval() {
    let dir = scratch("coll-progress");
    let args = ["--device", "cpu", "bench", "collectives", "-b", "4K", "-e", "4K", "-n", "1", "-w", "1", "--format", "json"];
    let o = runner(&dir, &args);
    let err = text(&o).1;
    assert!(o.status.success(), "{err}");
    let progress: Vec<&str> = err.lines().filter(|l| l.contains("/6: ")).collect();
    assert_eq!(progress.len(), 1, "{err}");
    assert!(progress[0].starts_with("1/6: all_reduce 4096 B: "), "{err}");
    let o = runner(&dir, &[&args[..], &["-q"]].concat());
    assert!(o.status.success() && text(&o).1.is_empty(), "{}", text(&o).1);
}

/// nccl-tests logs where they go and where they do not: given as a calibration file or a
/// measure file, a log is named as one with the flag it goes to (not a TOML or JSON parse
/// error); the same log twice is refused (it counted each size twice); a `-d all` log (a
/// row per size and data type) fits its half rows, as the same log of one type does.
/// Kills: the nccl-tests check in published::parse or OpsFile::parse dropped, the
/// canonical-path check dropped, the (op, size, type) key back to (op, size).
#[test]
fn nccl_tests_logs_are_recognised_and_read_once() {
    let dir = scratch("nccl-logs");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    for f in ["all_reduce_perf.log", "all_reduce_dall.log"] {
        std::fs::copy(data.join(f), dir.join(f)).unwrap();
    }
    for args in [
        &["calibrate", "all_reduce_perf.log", "--gpu", "h100", "-q"][..],
        &["validate", "all_reduce_perf.log", "--no-history", "-q"][..],
        &["calibrate", "--ops", "all_reduce_perf.log", "--gpu", "h100", "-q"][..],
    ] {
        let o = runner(&dir, args);
        let err = text(&o).1;
        assert!(!o.status.success(), "{args:?}");
        assert!(err.contains("all_reduce_perf.log: this is nccl-tests output, not a"), "{args:?}: {err}");
        assert!(err.contains("pass it with `runner calibrate --collectives all_reduce_perf.log --gpu NAME`") && !err.contains("parse error"), "{args:?}: {err}");
    }
    for (twice, named) in [("all_reduce_perf.log,all_reduce_perf.log", "all_reduce_perf.log twice"), ("all_reduce_perf.log,./all_reduce_perf.log", "one file twice (all_reduce_perf.log and ./all_reduce_perf.log)")] {
        let o = runner(&dir, &["calibrate", "--collectives", twice, "--gpu", "h100", "-q"]);
        let err = text(&o).1;
        assert!(!o.status.success() && err.contains(&format!("--collectives names {named}: give each test's log once")), "{err}");
    }
    let fit = |file: &str| {
        let o = runner(&dir, &["calibrate", "--collectives", file, "--gpu", "h100", "-q"]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{file}: {err}");
        out.replace(file, "LOG")
    };
    // Names of one length: the table's column is as wide as the file's name.
    let (one, all) = (fit("all_reduce_perf.log"), fit("all_reduce_dall.log"));
    let note = "LOG: all_reduce measured in 2 data types (nccl-tests -d all): fitted its half sum rows only (bfloat16, the projection's gradient type, where the log has it, else half";
    assert!(all.contains(note), "{all}");
    let without: String = all.lines().filter(|l| !l.contains("measured in 2 data types")).map(|l| format!("{l}\n")).collect();
    assert_eq!(without.trim_end(), one.trim_end(), "the half rows fit as the one-type log does");
}

/// A price file's own name (its column's) in --cloud lists it alone: it was "no plugin
/// 'quoted'", with no way to see only the file's prices. Kills: names_price_file false.
#[test]
fn the_price_files_name_in_cloud_lists_it_alone() {
    let dir = scratch("price-file-name");
    std::fs::write(dir.join("quoted.csv"), "InstanceType,AcceleratorName,AcceleratorCount,Region,Price\nmy-8xh100,H100,8,eu-1,18.40\n").unwrap();
    for name in ["quoted", "quoted.csv"] {
        let o = runner(&dir, &["prices", "--gpu", "h100", "--cloud", name, "--price-file", "quoted.csv", "--format", "json"]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{name}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let clouds: Vec<&str> = v["prices"].as_array().unwrap().iter().map(|r| r["cloud"].as_str().unwrap()).collect();
        assert_eq!(clouds, ["quoted"], "{out}");
    }
    // Beside a cloud, both; a name that is neither still stops the run.
    let o = runner(&dir, &["prices", "--gpu", "h100", "--cloud", "quoted,lambda", "--price-file", "quoted.csv", "--format", "json"]);
    let out = text(&o).0;
    assert!(o.status.success() && out.contains("\"lambda\"") && out.contains("\"quoted\""), "{out}");
    let o = runner(&dir, &["prices", "--gpu", "h100", "--cloud", "quote", "--price-file", "quoted.csv"]);
    assert!(!o.status.success() && text(&o).1.contains("the cloud quote cannot be used"), "{}", text(&o).1);
}

/// An offering on another node than its GPU's profile (a 1-GPU or 3-GPU H100 node, GB200
/// sold as 8-GPU nodes of domain 8) is never quoted against the profile's projection (8
/// H100 on NVLink; NVL72 trays of 4): a note names it, its node, the profile's and the
/// --profile that projects its node; with that profile the 1-GPU node is quoted, on as many
/// nodes as GPUs, and the 8-GPU cloud's node is the one left out.
#[test]
fn an_offering_on_another_node_than_the_profile_is_not_quoted_against_it() {
    let dir = scratch("other-node");
    std::fs::write(
        dir.join("mine.csv"),
        "InstanceType,AcceleratorName,AcceleratorCount,Region,Price\ngpu_1x_h100_pcie,H100,1,us-1,0.10\n\
         three,H100,3,us-1,0.30\ngb8,GB200,8,us-1,1.00\n",
    )
    .unwrap();
    let explore =
        ["explore", "--plugin", "llama3", "--variant", "llama3-tiny", "--gpu", "h100", "--gpus", "8", "--precision", "bf16", "--cloud", "lambda", "--price-file", "mine.csv", "--no-history", "-q", "--format", "json"];
    let o = runner(&dir, &explore);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let costs = v["series"][0]["rows"][0]["costs"].as_array().unwrap();
    let quoted: Vec<&str> = costs.iter().filter(|c| c["status"] == "quoted").map(|c| c["cloud"].as_str().unwrap()).collect();
    assert_eq!(quoted, ["lambda"], "{out}");
    let notes: Vec<&str> = v["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    let h100 = notes.iter().find(|n| n.starts_with("mine: gpu_1x_h100_pcie")).unwrap_or_else(|| panic!("{notes:?}"));
    assert!(
        h100.starts_with(
            "mine: gpu_1x_h100_pcie (1 GPU per node, scale-up domain 1), three (3 GPUs per node, scale-up domain 3) sell \
             H100 on another node than its profile's (8 GPUs per node, scale-up domain 8)"
        ) && h100.contains("--profile FILE holding [[gpu]] name = \"H100\", gpus_per_node = 1, scale_up_domain = 1"),
        "{h100}"
    );
    assert!(notes.iter().any(|n| n.starts_with("mine: gb8 (8 GPUs per node, scale-up domain 8) sells GB200 on another node than its profile's (4 GPUs per node, scale-up domain 72)")), "{notes:?}");
    // The fix the note names: a profile of that node prices it, and the 8-GPU nodes are
    // now the ones on another node.
    std::fs::write(dir.join("pcie.toml"), "[[gpu]]\nname = \"H100\"\ngpus_per_node = 1\nscale_up_domain = 1\n").unwrap();
    let mut fixed = explore.to_vec();
    fixed.extend(["--profile", "pcie.toml"]);
    let o = runner(&dir, &fixed);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let costs = v["series"][0]["rows"][0]["costs"].as_array().unwrap();
    let quoted: Vec<(&str, &str, u64)> = costs
        .iter()
        .filter(|c| c["status"] == "quoted")
        .map(|c| (c["cloud"].as_str().unwrap(), c["instance"].as_str().unwrap(), c["nodes"].as_u64().unwrap()))
        .collect();
    assert_eq!(quoted, [("mine", "gpu_1x_h100_pcie", 8)], "{out}");
    // Lambda's 8-GPU nodes are the built-in H100 profile's: leaving --profile out prices
    // them (a profile of their node would be the built-in one again).
    let notes: Vec<&str> = v["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    let lambda = notes.iter().find(|n| n.starts_with("lambda: ")).unwrap_or_else(|| panic!("{out}"));
    assert!(lambda.ends_with("leave --profile out: the built-in H100 profile has that node (or set gpus_per_node = 8, scale_up_domain = 8 for H100 in your profile file)"), "{lambda}");
    assert!(notes.iter().any(|n| n.starts_with("mine: gb8 ") && n.contains("project that node with --profile FILE")), "{notes:?}");
    // `plugins inspect` says it of each such offering, under the same --profile, and of
    // none without it.
    let words = |o: &std::process::Output| text(o).0.split_whitespace().collect::<Vec<_>>().join(" ");
    let o = runner(&dir, &["plugins", "inspect", "lambda", "--profile", "pcie.toml"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let table = words(&o);
    let said = "H100 on another node (8 GPUs per node, scale-up domain 8) than its profile's (1 GPU per node, scale-up domain 1): \
                explore and prices never quote it; to price it, leave --profile out";
    assert!(table.contains(&format!("gpu_8x_h100_sxm5: {said}")), "{table}");
    let o = runner(&dir, &["plugins", "inspect", "lambda"]);
    assert!(o.status.success() && !words(&o).contains("on another node"), "{}", words(&o));
}

/// A GPU the clouds sell, only not under the --option asked, is not "sold by no cloud":
/// the table says which options they sell it under and that --option is the fix; a
/// price-file row with no price for the option asked is named in a note, not dropped.
#[test]
fn a_gpu_sold_under_other_options_names_them_and_a_row_without_the_option_is_noted() {
    let dir = scratch("other-option");
    let explore =
        ["explore", "--plugin", "llama3", "--variant", "llama3-tiny", "--gpu", "h100", "--gpus", "8", "--precision", "bf16", "--cloud", "lambda", "--no-history", "-q", "--format", "json"];
    let mut spot = explore.to_vec();
    spot.extend(["--option", "spot"]);
    let o = runner(&dir, &spot);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let why = v["series"][0]["sweet_spot_why"].as_str().unwrap();
    assert!(why.starts_with("none: no cloud here sells H100 as spot (1 asked: lambda), but lambda sells it on-demand;"), "{why}");
    assert!(why.contains("try --option on-demand"), "{why}");
    std::fs::write(
        dir.join("spotonly.csv"),
        "InstanceType,AcceleratorName,AcceleratorCount,Region,Price,SpotPrice\nx,H100,8,eu-1,,7.20\n",
    )
    .unwrap();
    let mut file = explore.to_vec();
    file.extend(["--price-file", "spotonly.csv"]);
    let o = runner(&dir, &file);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let notes: Vec<&str> = v["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(
        notes.contains(&"price file spotonly.csv: x (spot) has no on-demand price, so --option on-demand never quotes it; try --option spot"),
        "{notes:?}"
    );
}

/// GH200, which no shipped cloud sells, is projected in whole quad nodes (10 GPUs are
/// three nodes, 12; 8-GPU nodes would make them 16) and its table says that no cloud here sells it and how to price it; a price
/// file in SkyPilot's catalog shape (docs/EXPLORER.md) with a GH200 row prices it.
#[test]
fn gh200_explore_says_no_cloud_sells_it_and_a_price_file_prices_it() {
    let dir = scratch("gh200-prices");
    let explore = ["explore", "--plugin", "llama3", "--variant", "llama3-tiny", "--gpu", "gh200", "--gpus", "10", "--precision", "bf16", "--no-history", "-q"];
    let o = runner(&dir, &explore);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("sweet spot (*): none: no cloud here sells GH200 ("), "{out}");
    assert!(out.contains("--price-file FILE"), "{out}");
    assert!(out.contains("GPU counts rounded up to whole nodes"), "{out}");
    let mut json = explore.to_vec();
    json.extend(["--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&text(&runner(&dir, &json)).0).unwrap();
    let row = &v["series"][0]["rows"][0];
    assert_eq!((row["requested_gpus"].as_u64(), row["gpus"].as_u64()), (Some(10), Some(12)), "{row}");
    assert!(row["costs"].as_array().unwrap().iter().all(|c| c["status"] == "not-sold"), "{row}");
    std::fs::write(
        dir.join("alps.csv"),
        "InstanceType,AcceleratorName,AcceleratorCount,Region,Price,SpotPrice,EffectiveDate,Source\nquad-gh200,GH200,4,ch-1,20.00,,2026-12-01,a test's made-up rate\n",
    )
    .unwrap();
    json.extend(["--price-file", "alps.csv"]);
    let o = runner(&dir, &json);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let quoted: Vec<&serde_json::Value> =
        v["series"][0]["rows"][0]["costs"].as_array().unwrap().iter().filter(|c| c["status"] == "quoted").collect();
    assert_eq!(quoted.len(), 1, "{out}");
    assert_eq!((quoted[0]["cloud"].as_str(), quoted[0]["instance"].as_str(), quoted[0]["nodes"].as_u64()), (Some("alps"), Some("quad-gh200"), Some(3)), "{out}");
    assert!(!out.contains("no cloud here sells"), "{out}");
}

/// The AMD boards OCI sells (BM.GPU.MI300X.8, BM.GPU.MI355X.8: `MI300X` and `MI355X` in
/// its price list) have profiles, so explore projects them and prices them at OCI, by a
/// profile's name in any case; Crusoe's page lists MI300X without a node size, so Crusoe's
/// list has no MI300X row and does not price it. The GPU profiles note says whose table
/// they take.
#[test]
fn amd_boards_are_projected_and_priced_at_oci() {
    let dir = scratch("amd-oci");
    for (gpu, instance) in [("mi300x", "BM.GPU.MI300X.8"), ("MI355X", "BM.GPU.MI355X.8")] {
        let o = runner(&dir, &["explore", "--gpu", gpu, "--model", "llama3.1-8b", "--gpus", "8,64", "--no-history", "--format", "json", "-q"]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{gpu}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let series = v["series"].as_array().unwrap();
        assert!(!series.is_empty(), "{out}");
        for s in series {
            let rows = s["rows"].as_array().unwrap();
            assert_eq!(rows.iter().map(|r| r["gpus"].as_u64().unwrap()).collect::<Vec<_>>(), [8, 64], "{gpu}: {s}");
            for row in rows {
                let costs = row["costs"].as_array().unwrap();
                let oci: Vec<&serde_json::Value> = costs.iter().filter(|c| c["cloud"] == "oci" && c["status"] == "quoted").collect();
                assert_eq!(oci.len(), 1, "{gpu}: {row}");
                assert_eq!(oci[0]["instance"].as_str(), Some(instance), "{gpu}: {row}");
                assert!(!costs.iter().any(|c| c["cloud"] == "crusoe" && c["status"] == "quoted"), "{gpu}: {row}");
            }
        }
        assert!(!out.contains("no cloud here sells"), "{gpu}: {out}");
        let o = runner(&dir, &["explore", "--gpu", gpu, "--model", "llama3.1-8b", "--gpus", "8", "--no-history"]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{gpu}: {err}");
        assert!(out.contains("H100's, GEMMs x0."), "{gpu}: {out}");
    }
}

/// `project --format csv` is a `field,value` row per value of the JSON, under its path
/// there, and `search --format csv` a row per layout under the JSON's names: one header
/// row of names, the figures as the JSON writes them (no "12.7 s", no "53.7 %", no
/// indented labels); the notes stay `#` lines.
#[test]
fn project_and_search_csv_carry_the_jsons_figures() {
    let dir = scratch("project-csv");
    // serde_json reads a float to within an ulp (it has no float_roundtrip here): the cell
    // is held to that, and to being a number at all.
    let same = |cell: &str, n: &serde_json::Number| {
        let j = n.as_f64().unwrap();
        cell.parse::<f64>().is_ok_and(|c| (c - j).abs() <= 1e-15 * j.abs().max(1.0))
    };
    let out = |args: &[&str]| {
        let o = runner(&dir, args);
        assert!(o.status.success(), "{args:?}: {}", text(&o).1);
        text(&o).0
    };
    let project = ["project", "--model", "llama3.1-8b", "--gpus", "16", "-q", "--format"];
    let json: serde_json::Value = serde_json::from_str(&out(&[&project[..], &["json"]].concat())).unwrap();
    let csv = out(&[&project[..], &["csv"]].concat());
    let mut lines = csv.lines().filter(|l| !l.starts_with('#'));
    assert_eq!(lines.next(), Some("field,value"), "{csv}");
    let mut numbers = 0;
    for line in lines {
        let cells = csv_cells(line);
        assert_eq!(cells.len(), 2, "{line}");
        let at = json.pointer(&format!("/{}", cells[0].replace('.', "/"))).unwrap_or_else(|| panic!("{line}: not in the JSON"));
        match at {
            serde_json::Value::Number(n) => {
                assert!(same(&cells[1], n), "{line}: {n}");
                numbers += 1;
            }
            serde_json::Value::String(s) => assert_eq!(&cells[1], s, "{line}"),
            v => assert_eq!(cells[1], v.to_string(), "{line}"),
        }
    }
    assert!(numbers > 40 && csv.contains("\nstep_time_s,") && csv.contains("\nmemory.weights,"), "{csv}");
    assert!(csv.lines().any(|l| l.starts_with("# plugin: workload plugin llama3.wasm")), "{csv}");

    let search = ["search", "--model", "llama3.1-8b", "--gpus", "8,16", "--top", "2", "-q", "--format"];
    let json: serde_json::Value = serde_json::from_str(&out(&[&search[..], &["json"]].concat())).unwrap();
    let csv = out(&[&search[..], &["csv"]].concat());
    let mut lines = csv.lines().filter(|l| !l.starts_with('#'));
    let header = csv_cells(lines.next().unwrap());
    assert_eq!(
        header,
        ["gpus", "global_batch", "rank", "layout", "step_time_s", "tokens_per_sec_per_gpu", "model_tflops_per_gpu", "mfu", "memory_per_gpu_gib", "fits"]
    );
    let rows: Vec<Vec<String>> = lines.map(csv_cells).collect();
    assert_eq!(rows.len(), 4, "{csv}");
    for row in &rows {
        let count = json.as_array().unwrap().iter().find(|f| f["gpus"].as_u64() == row[0].parse().ok()).unwrap();
        let best = &count["best"][row[2].parse::<usize>().unwrap() - 1];
        assert_eq!(row[1], count["global_batch"].to_string(), "{row:?}");
        for (name, cell) in header.iter().zip(row).skip(4) {
            match &best[name.as_str()] {
                serde_json::Value::Number(n) => assert!(same(cell, n), "{name}: {row:?}: {n}"),
                v => assert_eq!(cell, &v.to_string(), "{name}: {row:?}"),
            }
        }
    }
}

/// A layout flag no count divides is refused with the reason every count shares: `--ep 8`
/// on a dense model said 8 GPUs' "tp·cp = 16 does not divide 8 GPUs" and hid "no routed
/// experts", which 64 GPUs gave.
#[test]
fn explore_names_the_reason_every_count_shares() {
    let dir = scratch("explore-dense-ep");
    let o = runner(&dir, &["explore", "--model", "llama3.1-8b", "--gpus", "8,64", "--ep", "8", "--cloud", "aws", "--no-history", "-q"]);
    let err = text(&o).1;
    assert!(!o.status.success() && err.contains("divides none of the GPU counts") && err.contains("the graph has no routed experts; set ep = etp = 1"), "{err}");
    assert!(!err.contains("does not divide 8 GPUs"), "{err}");
}

/// Model names are one in any case, as GPU and precision names are, and reported as the
/// plugin spells them; a miss suggests the near names before the list, and shows a name's
/// invisible characters escaped (it looked like the known name it is not).
#[test]
fn model_names_are_found_in_any_case_and_a_miss_suggests() {
    let dir = scratch("model-names");
    let o = runner(&dir, &["project", "--model", "LLAMA3.1-8B", "--gpus", "8", "--format", "json", "-q"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(v["model"], "llama3.1-8b");
    for (model, want) in [
        ("llama3.1-8x", "provides 'llama3.1-8x' (did you mean llama3.1-8b?); installed models: "),
        ("Llama3.1", "provides 'Llama3.1' (did you mean llama3.1-8b or llama3.1-70b or llama3.1-405b?); installed models: "),
        ("llama3.1-8b\u{200b}", "provides 'llama3.1-8b\\u{200b}' (did you mean llama3.1-8b?); installed models: "),
        ("zzzz", "provides 'zzzz'; installed models: "),
    ] {
        let o = runner(&dir, &["search", "--model", model, "--gpus", "8", "-q"]);
        let err = text(&o).1;
        assert!(!o.status.success() && err.contains(want) && err.contains("llama3.1-405b, llama3-tiny"), "{model:?}: {err}");
    }
}

/// `measure` without --gpu names its default as one: "--gpu h100" quoted a flag the user
/// never typed.
#[test]
fn measure_names_a_defaulted_gpu_as_the_default() {
    let dir = scratch("measure-default-gpu");
    let o = runner(&dir, &["--device", "cpu", "measure", "--model", "llama3-tiny"]);
    let err = text(&o).1;
    assert!(!o.status.success() && err.contains("error: the default --gpu h100 (no --gpu was given): a run on the CPU"), "{err}");
    assert!(err.contains("name it with --gpu"), "{err}");
    let o = runner(&dir, &["--device", "cpu", "measure", "--model", "llama3-tiny", "--gpu", "h100"]);
    let err = text(&o).1;
    assert!(!o.status.success() && err.contains("error: --gpu h100: a run on the CPU"), "{err}");
}

/// A bare `a100` is the 80 GB part (a price file's bare A100 is refused as ambiguous):
/// project and search say which it was taken as, and how to name the other.
#[test]
fn a_bare_a100_is_said_as_a_choice() {
    let dir = scratch("bare-a100");
    for cmd in ["project", "search"] {
        let o = runner(&dir, &[cmd, "--model", "llama3.1-8b", "--gpu", "a100", "--gpus", "8"]);
        let out = text(&o).0;
        assert!(o.status.success() && out.contains("--gpu a100 taken as A100-80GB; --gpu a100-40gb for the A100-40GB"), "{cmd}: {out}");
    }
}

/// The benchmarks' CSVs carry the figures unrounded under the JSON's names, the units
/// in the names (`time.*` in seconds, a note says): each rate is its bytes or FLOPs over
/// its median time to the last bits, which "0.02 ms", "71%" or "536.9M" are not.
#[test]
fn bench_csvs_are_the_json_figures_unrounded() {
    let dir = scratch("bench-csv");
    let csv = |args: &[&str]| {
        let o = runner(&dir, &[&["--device", "cpu", "bench"][..], args, &["-q", "--format", "csv"]].concat());
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args:?}: {err}");
        assert!(out.lines().any(|l| l.starts_with("# time.*: seconds")), "{out}");
        out
    };
    let out = csv(&["quantize", "--rows", "64", "--cols", "64"]);
    let (header, rows) = csv_of(&out);
    assert_eq!(header[..4], ["recipe", "elements", "threads", "time.median"], "{out}");
    for r in &rows {
        assert_eq!(figure(&header, r, "elements"), 4096.0);
        assert!(same(figure(&header, r, "gbps"), 4.0 * 4096.0 / figure(&header, r, "time.median") / 1e9), "{out}");
    }
    let out = csv(&["gemm", "--sizes", "32,48"]);
    let (header, rows) = csv_of(&out);
    assert_eq!(rows.len(), 2, "{out}");
    for r in &rows {
        let m = figure(&header, r, "m");
        assert!(same(figure(&header, r, "gflops"), 2.0 * m * m * m / figure(&header, r, "time.median") / 1e9), "{out}");
        assert!(figure(&header, r, "theoretical_gflops") > 0.0, "{out}");
    }
    let out = csv(&["memory"]);
    let (header, rows) = csv_of(&out);
    assert_eq!(header[..2], ["kernel", "bytes"], "{out}");
    for r in &rows {
        let bytes = figure(&header, r, "bytes");
        assert!(bytes >= 2.0 * 4.0 * f64::from(1u32 << 26) && bytes.fract() == 0.0, "{out}");
        assert!(same(figure(&header, r, "gbps"), bytes / figure(&header, r, "time.median") / 1e9), "{out}");
    }
}

/// `bench collectives --format csv`: nccl-tests' columns under the JSON's names
/// (`size_bytes`, `time_us`, `algbw_gbps`, `busbw_gbps`), unrounded: algbw is the size
/// over the time to the last bits (the table's two decimals are not).
#[test]
fn collectives_csv_is_the_json_figures_unrounded() {
    let dir = scratch("coll-csv");
    let o = runner(&dir, &["--device", "cpu", "bench", "collectives", "-b", "1K", "-e", "4K", "-f", "4", "--ops", "all_reduce", "-n", "2", "-w", "1", "-q", "--format", "csv"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let (header, rows) = csv_of(&out);
    for name in ["op", "size_bytes", "time_us", "algbw_gbps", "busbw_gbps", "wrong"] {
        assert!(header.iter().any(|h| h == name), "{name}: {out}");
    }
    assert_eq!(rows.len(), 2, "{out}");
    for r in &rows {
        let (size, time) = (figure(&header, r, "size_bytes"), figure(&header, r, "time_us"));
        assert!(same(figure(&header, r, "algbw_gbps"), size / time / 1e3), "{out}");
    }
    assert!(out.lines().any(|l| l.starts_with("# Out of bounds values")), "{out}");
}

/// `models NAME --format csv`: a row per layout under the JSON's names, the global batch
/// as its two numbers; the title stays out of the header (it read "layout: gpu").
#[test]
fn a_models_layouts_csv_is_the_json_layouts() {
    let dir = scratch("model-layouts-csv");
    let o = runner(&dir, &["models", "llama3.1-70b", "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    let layouts = v["variant"]["layouts"].as_array().unwrap();
    let o = runner(&dir, &["models", "llama3.1-70b", "--format", "csv"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let (header, rows) = csv_of(&out);
    assert_eq!(header[0], "gpu", "{out}");
    assert_eq!(rows.len(), layouts.len(), "{out}");
    for (r, l) in rows.iter().zip(layouts) {
        assert_eq!(r[0], l["gpu"].as_str().unwrap());
        for name in ["gbs_per_gpu", "gbs_fixed", "tp", "pp", "mbs"] {
            assert!(same(figure(&header, r, name), l[name].as_f64().unwrap()), "{name}: {out}");
        }
    }
}

/// `plugins inspect --format csv`: a workload's variants and a cost plugin's offerings
/// under the JSON's names, figures bare (the table's "8e top-2", "1 s, min 1 min").
#[test]
fn plugins_inspect_csv_is_the_json_figures() {
    let dir = scratch("inspect-csv");
    let both = |name: &str| {
        let o = runner(&dir, &["plugins", "inspect", name, "--format", "json"]);
        assert!(o.status.success(), "{}", text(&o).1);
        let json: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
        let o = runner(&dir, &["plugins", "inspect", name, "--format", "csv"]);
        assert!(o.status.success(), "{}", text(&o).1);
        (json, text(&o).0)
    };
    let (json, out) = both("deepseek");
    let (header, rows) = csv_of(&out);
    for (r, v) in rows.iter().zip(json["variants"].as_array().unwrap()) {
        assert_eq!(r[0], v["name"].as_str().unwrap());
        assert!(same(figure(&header, r, "hidden"), v["hyper"]["hidden"].as_f64().unwrap()), "{out}");
        assert!(same(figure(&header, r, "moe_experts"), v["hyper"]["moe"]["experts"].as_f64().unwrap()), "{out}");
        assert!(same(figure(&header, r, "seq_len"), v["defaults"]["seq_len"].as_f64().unwrap()), "{out}");
    }
    let (json, out) = both("aws");
    let (header, rows) = csv_of(&out);
    let offerings = json.as_array().unwrap();
    assert_eq!(rows.len(), offerings.len(), "{out}");
    for (r, o) in rows.iter().zip(offerings) {
        assert!(same(figure(&header, r, "interconnect_gbps"), o["interconnect_gbps"].as_f64().unwrap()), "{out}");
        assert!(same(figure(&header, r, "minimum_charge_s"), o["prices"][0]["minimum_charge_s"].as_f64().unwrap()), "{out}");
    }
    // The table words each offering's billing as `runner prices` does (AWS: per second, a
    // minute's minimum), not as its two raw numbers.
    let o = runner(&dir, &["plugins", "inspect", "aws"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let table = text(&o).0;
    for o in offerings {
        let p = &o["prices"][0];
        let words = runner::prices::billing(p["billing_increment_s"].as_u64().unwrap() as u32, p["minimum_charge_s"].as_u64().unwrap() as u32);
        let row = table.lines().find(|l| l.starts_with(&format!("{} ", o["instance"].as_str().unwrap()))).unwrap_or_else(|| panic!("{o}: {table}"));
        // The last column (the date) may be empty, and the table trims what trails.
        assert!(format!("{row}  ").contains(&format!("  {words}  ")), "{words:?} not in {row:?}");
    }
    assert!(table.lines().any(|l| l.starts_with("p5.48xlarge ") && l.contains("  1 s, min 1 min  ")), "{table}");
}

/// `validate --format csv`: a row per projected point under the JSON's names (`checked`),
/// the error a fraction as JSON has it, not "+2.0%".
#[test]
fn validate_csv_is_the_json_points() {
    let dir = scratch("validate-csv");
    // The shipped file's first two points (the whole file takes minutes on two cores).
    let whole = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../host/project/data/calibration.toml")).unwrap();
    let third = whole.match_indices("[[point]]").nth(2).unwrap().0;
    std::fs::write(dir.join("two.toml"), &whole[..third]).unwrap();
    let file = "two.toml";
    let o = runner(&dir, &["validate", file, "--format", "json", "--no-history", "-q"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let json: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    let o = runner(&dir, &["validate", file, "--format", "csv", "--no-history", "-q"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let (header, rows) = csv_of(&out);
    let checked = json["checked"].as_array().unwrap();
    assert_eq!((rows.len(), checked.len()), (2, 2), "{out}");
    for (r, c) in rows.iter().zip(checked) {
        for name in ["published_step_s", "predicted_step_s", "error"] {
            assert!(same(figure(&header, r, name), c[name].as_f64().unwrap()), "{name}: {out}");
        }
    }
}

/// A plugin file that fails to load (a truncated download, a text file named .wasm) is
/// named wherever the installed set is used, with its path, its error and the fix:
/// explore's installed clouds (one named after an embedded cloud hides it), the precision
/// plan it would have given (not "no fp8.wasm is installed"), and `models`. One that hides
/// an embedded plugin of another kind is left to that kind's users; named explicitly, a
/// broken plugin stays an error.
#[test]
fn a_plugin_file_that_fails_to_load_is_named_wherever_it_would_be_used() {
    let dir = scratch("broken-installed");
    let dist = dir.join("plugins/dist");
    std::fs::create_dir_all(&dist).unwrap();
    let truncated = |name: &str| embedded_wasm(name)[..3000].to_vec();
    std::fs::write(dist.join("mycloud.wasm"), truncated("aws.wasm")).unwrap();
    std::fs::write(dist.join("lambda.wasm"), b"not a component").unwrap();
    std::fs::write(dist.join("fp8.wasm"), truncated("fp8.wasm")).unwrap();
    std::fs::write(dist.join("llama2.wasm"), truncated("llama2.wasm")).unwrap();
    let explore = ["explore", "--model", "llama3-tiny", "--gpus", "8", "--precision", "fp8", "--no-history", "-q", "--format", "json"];
    let o = runner(&dir, &explore);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    for said in [
        "skipped a cloud: plugins/dist/mycloud.wasm, a plugin file that cannot be loaded: plugin 'mycloud.wasm' could not be loaded: ",
        "; fix or remove plugins/dist/mycloud.wasm",
        "skipped a cloud: plugins/dist/lambda.wasm, a plugin file that cannot be loaded (it hides the embedded lambda.wasm): plugin 'lambda.wasm' could not be loaded: not a WebAssembly file",
        "the fp8 precision plugin cannot be used, so the built-in fp8 plan is used instead: the plugin file plugins/dist/fp8.wasm cannot be loaded: ",
        "; fix or remove plugins/dist/fp8.wasm",
    ] {
        assert!(out.contains(said), "{said:?} not in {out}");
    }
    assert!(!out.contains("no fp8.wasm precision plugin is installed") && !out.contains("llama2.wasm"), "{out}");

    let o = runner(&dir, &["models"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("left out plugins/dist/llama2.wasm, a plugin file that cannot be loaded (it hides the embedded llama2.wasm): "), "{out}");
    assert!(out.contains("left out plugins/dist/mycloud.wasm, a plugin file that cannot be loaded: "), "{out}");
    assert!(!out.contains("fp8.wasm") && !out.contains("lambda.wasm"), "{out}");

    // Asked for by name, a broken plugin is an error, as before.
    let o = runner(&dir, &["explore", "--model", "llama3-tiny", "--gpus", "8", "--precision", "bf16", "--cloud", "lambda", "--no-history", "-q"]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("the cloud lambda cannot be used: plugin 'lambda.wasm' could not be loaded"), "{err}");
    let o = runner(&dir, &["explore", "--plugin", "plugins/dist/llama2.wasm", "--gpus", "8", "--no-history", "-q"]);
    assert!(!o.status.success() && text(&o).1.contains("plugin 'llama2.wasm' could not be loaded"), "{}", text(&o).1);
}

/// A fixed layout that divides none of the GPU counts is refused for what the user fixed,
/// as `project` refuses it: the fixed degrees' product, else every family's reason (the
/// one reason most families gave named CP, which the user left free).
#[test]
fn a_fixed_layout_that_divides_no_count_is_refused_for_what_was_fixed() {
    let dir = scratch("fixed-undivided");
    let o = runner(&dir, &["explore", "--model", "llama3.1-8b", "--gpus", "8", "--precision", "bf16", "--pp", "64", "--cloud", "aws", "--no-history", "-q"]);
    let (_, err) = text(&o);
    assert!(
        !o.status.success()
            && err.contains("the layout fixed by the run (PP64) divides none of the GPU counts: tp·pp·cp = 64 (fixed by the run) does not divide the 8 GPUs")
            && !err.contains("tp·cp = 16"),
        "{err}"
    );
    std::fs::write(
        dir.join("offload.toml"),
        "[model]\nplugin = \"llama3\"\nvariant = \"llama3.1-8b\"\n[cluster]\ngpu = [\"H100\"]\ngpus = [8]\n[precision]\nformat = \"bf16\"\n\
         [cost]\nplugins = [\"aws\"]\n[layout]\noffload_layers = 1000\n",
    )
    .unwrap();
    let o = runner(&dir, &["run", "offload.toml", "--no-history", "-q"]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("(1000 layers' activations offloaded per chunk) divides none of the GPU counts: "), "{err}");
    // Every family's reason is the offload's, each family's at its own pipeline.
    assert!(err.contains("PP: divisibility: offload of 1000 layers per chunk is more than") && !err.contains("tp·cp"), "{err}");
}

/// 0 layers or a held-out loss every 0 steps is refused, as 0 steps is: it silently meant
/// the variant's layers and a tenth of the steps.
#[test]
fn train_refuses_zero_layers_and_zero_eval_interval() {
    let dir = scratch("train-zeros");
    for (flag, said) in [("--layers", "--layers 0: a model needs at least one transformer layer"), ("--eval-every", "--eval-every 0: the held-out loss is taken every N steps, N at least 1")] {
        let o = runner(&dir, &["train", "--precision", "bf16", flag, "0"]);
        let (_, err) = text(&o);
        assert!(!o.status.success() && err.contains(said), "{flag}: {err}");
    }
}

/// A JSON input's error names its line and column once ("line 1 column 2: missing field
/// `format` at line 1 column 2" said it twice).
#[test]
fn a_json_input_error_names_its_location_once() {
    let dir = scratch("json-location");
    std::fs::write(dir.join("m.json"), "{}").unwrap();
    let o = runner(&dir, &["project", "--model", "llama3-tiny", "--gpus", "8", "--measured", "m.json"]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("m.json: line 1 column 2: missing field `format`; write the file"), "{err}");
    std::fs::write(dir.join("c.json"), "[{}]").unwrap();
    let o = runner(&dir, &["calibrate", "--collectives", "c.json", "--gpu", "h100"]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("c.json: line 1 column 3: missing field `op`; write the file"), "{err}");
}

/// Log lines written to a file or a pipe carry no colour codes (they were kept raw in a
/// redirected stderr: `^[[33m WARN^[[0m`).
#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    let dir = scratch("log-colour");
    let o = command(&dir, &["models"]).env("RUST_LOG", "debug").output().expect("runner starts");
    let (_, err) = text(&o);
    assert!(o.status.success() && err.contains("DEBUG"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err:?}");
}

/// `compare`: its CSV names its header with nothing changed (it began with an empty
/// line), and its table shows an object's first whole fields and how many more, not JSON
/// text cut mid-field; `history`'s table names its column as the JSON does (`items`, not
/// `pieces`); an -o extension that names no format is refused before the work (`models
/// -o out.xyz` wrote a table without a word).
#[test]
fn compare_history_and_output_extensions_read_plainly() {
    let dir = scratch("compare-plain");
    let history = dir.join("h.sqlite");
    let h = history.to_str().unwrap();
    let quote = r#"{"cloud": "aws", "region": "us-east-1", "days": 12.3456789, "usd": 2869701.3375347964, "gpus": 16}"#;
    for figures in [format!(r#"{{"x": {quote}}}"#), "{}".to_string()] {
        sql(
            &history,
            &format!(
                "INSERT INTO runs (kind, command, inputs, inputs_sha256, plugins, started, finished, status, result, runner_version)
                 VALUES ('explore', 'runner explore', '{{}}', 'k', '[]', '2026-01-01T00:00:00Z', '2026-01-01T00:01:00Z', 'done', '{{\"figures\": {figures}}}', '0')"
            ),
        );
    }
    let o = runner(&dir, &["--history", h, "compare", "1", "1", "--format", "csv"]);
    let out = text(&o).0;
    assert!(o.status.success() && out.starts_with("what,where,a,b\n"), "{out:?}");
    let o = runner(&dir, &["--history", h, "compare", "1", "2"]);
    let out = text(&o).0;
    let row = out.lines().find(|l| l.starts_with("results")).unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("{cloud: aws, days: 12.3457, gpus: 16, +2 more}") && !row.contains('"'), "{row}");
    // The CSV and JSON keep the whole value.
    let o = runner(&dir, &["--history", h, "compare", "1", "2", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(v[0]["a"]["usd"], 2869701.3375347964, "{v}");
    let o = runner(&dir, &["--history", h, "history"]);
    let out = text(&o).0;
    let header = out.lines().find(|l| l.starts_with("id")).unwrap_or_else(|| panic!("{out}"));
    assert!(header.contains("items") && !header.contains("pieces"), "{header}");

    let o = runner(&dir, &["models", "-o", "out.xyz"]);
    let err = text(&o).1;
    assert!(!o.status.success() && err.contains("-o out.xyz: unknown extension .xyz: use .json, .csv, .html or .txt (or --format)"), "{err}");
    assert!(!dir.join("out.xyz").exists());
    let o = runner(&dir, &["models", "-o", "out.xyz", "--format", "csv", "-q"]);
    assert!(o.status.success() && std::fs::read_to_string(dir.join("out.xyz")).unwrap().starts_with("name,"), "{}", text(&o).1);
}

/// `bench step`: a pipeline stage without the loss shows "-" and JSON null (it showed a
/// loss of 0.000000); the last stage its losses.
#[test]
fn a_stage_without_the_loss_reports_none() {
    let dir = scratch("step-noloss");
    let args = ["--device", "cpu", "bench", "step", "--layout", "pp=2", "--micro-batches", "2", "--steps", "2", "--in-process", "--no-history"];
    let o = runner(&dir, &[&args[..], &["--format", "json"]].concat());
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap_or_else(|e| panic!("{e}: {}", text(&o).1));
    assert_eq!(v[0]["losses"], serde_json::json!([null, null]), "{v}");
    assert!(v[1]["losses"].as_array().unwrap().iter().all(|l| l.as_f64().is_some_and(|l| l > 0.0)), "{v}");
    let o = runner(&dir, &args);
    let out = text(&o).0;
    let rank0 = out.lines().find(|l| l.starts_with("0 ")).unwrap_or_else(|| panic!("{out}"));
    assert!(rank0.contains(" - - ") && !rank0.contains("0.000000"), "{rank0}");
    assert!(out.contains("2 ranks; a stage without the loss shows \"-\""), "{out}");
}

/// `train --inject nan@1` names the fault as the flag spells it and in words ("Nan" was
/// Rust's name of the variant).
#[test]
fn an_injected_fault_is_named_plainly() {
    let dir = scratch("inject-name");
    let kjv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../workloads/text/kjv.txt");
    let text_file = dir.join("t.txt");
    std::fs::write(&text_file, &std::fs::read(kjv).unwrap()[..200_000]).unwrap();
    let o = runner(
        &dir,
        &["--device", "cpu", "train", "--steps", "2", "--seq-len", "16", "--micro-batch", "2", "--precision", "bf16", "--layers", "1", "--inject", "nan@1", "--no-history", "--text", text_file.to_str().unwrap()],
    );
    let (out, err) = text(&o);
    assert!(out.contains("fault injected: NaN at step 1 (--inject nan@1)"), "{out}\n{err}");
    assert!(out.contains("graph (1 layer, "), "{out}");
}
