//! The history as the runner uses it: an explorer run kept in the store as it goes (a
//! [`Journal`] over `runner_store`), its result with every rendering so `runner show ID`
//! reprints it in any format, and what changed between two runs for `runner compare`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use runner_store::{Change, RunId, Store};

use crate::explore::{Journal, Outcome};
use crate::plugin::PluginInfo;

pub use runner_store::{Run, Summary, default_path};

/// An explorer run kept in the history as it goes.
///
/// A history that cannot be written (a full disk, a file made read-only, any failed write)
/// never fails the run: the first error is kept ([`StoreJournal::lost`]), nothing more is
/// written, and the run goes on to print its result.
pub struct StoreJournal {
    store: Store,
    kind: String,
    command: String,
    run: Option<RunId>,
    kept: HashMap<String, Value>,
    lost: Option<String>,
    /// Whether `begin` found an unfinished run with the same inputs.
    pub resumed: bool,
}

impl StoreJournal {
    /// Open the history at `path` for a run of `kind` started by `command`.
    ///
    /// # Errors
    /// The database cannot be opened or created.
    pub fn open(path: &Path, kind: &str, command: &str) -> anyhow::Result<StoreJournal> {
        Ok(StoreJournal {
            store: Store::open(path)?,
            kind: kind.into(),
            command: command.into(),
            run: None,
            kept: HashMap::new(),
            lost: None,
            resumed: false,
        })
    }

    /// The run's id once it has begun (none once a write has failed: it is not kept).
    pub fn id(&self) -> Option<RunId> {
        self.run
    }

    /// Pieces recalled from the unfinished run this one resumed.
    pub fn recalled(&self) -> usize {
        self.kept.len()
    }

    /// The first write to the history that failed (it names the file and the error):
    /// from then on the run is not kept.
    pub fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    /// A write failed: keep its error and write nothing more.
    fn lose(&mut self, e: &dyn std::fmt::Display) {
        if self.lost.is_none() {
            self.lost = Some(e.to_string());
        }
        self.run = None;
    }

    /// Close the run with its result: the outcome and its renderings in every format. A
    /// failed write is kept in [`StoreJournal::lost`].
    pub fn finish(&mut self, result: &Value) {
        if let Some(id) = self.run
            && let Err(e) = self.store.finish(id, "done", result)
        {
            self.lose(&e);
        }
    }

    /// Close the run as failed, with the error.
    pub fn fail(&mut self, error: &str) {
        if let Some(id) = self.run
            && let Err(e) = self.store.finish(id, "failed", &json!({ "error": error }))
        {
            self.lose(&e);
        }
    }
}

/// The rules this runner's journalled pieces were computed by, part of what a run is
/// resumed by ([`Store::begin`]): the version number has stayed 0.1.0 while the pieces
/// changed, so a run an older build left unfinished (its rows quoting offerings on another
/// node than the GPU's profile, before that rule) was resumed by a newer one and its rows
/// shown beside the newer rows. Change it whenever what a kept row, measurement or other
/// piece holds, or how it is computed, changes.
const PIECES: &str = "2 (quotes on the profile's node only)";

impl Journal for StoreJournal {
    /// Never fails: a history that cannot be written is kept in [`StoreJournal::lost`].
    fn begin(&mut self, inputs: &Value, plugins: &[PluginInfo]) -> anyhow::Result<()> {
        // A journal that lost a write writes nothing more, a new run included.
        if self.lost.is_some() {
            return Ok(());
        }
        let plugins: Vec<Value> = plugins
            .iter()
            .map(|p| json!({ "name": p.name, "kind": p.kind, "contract": p.contract, "source": p.source.to_string(), "sha256": p.sha256 }))
            .collect();
        match self.store.begin(&self.kind, &self.command, inputs, &Value::Array(plugins), env!("CARGO_PKG_VERSION"), PIECES) {
            Ok((id, resumed)) => {
                self.run = Some(id);
                self.resumed = resumed;
                if resumed {
                    match self.store.items(id) {
                        Ok(items) => self.kept = items.into_iter().collect(),
                        // Nothing recalled: the pieces are computed again.
                        Err(e) => self.lose(&e),
                    }
                }
            }
            Err(e) => self.lose(&e),
        }
        Ok(())
    }

    fn recall(&mut self, key: &str) -> Option<Value> {
        self.kept.get(key).cloned()
    }

    /// Never fails: a history that cannot be written is kept in [`StoreJournal::lost`].
    fn record(&mut self, key: &str, value: &Value) -> anyhow::Result<()> {
        if let Some(id) = self.run
            && let Err(e) = self.store.put_item(id, key, value)
        {
            self.lose(&e);
        }
        Ok(())
    }
}

/// The history database: `--history FILE`, else the default (`$RUNNER_HISTORY`, else
/// under the user's data directory).
///
/// # Errors
/// No path is given and no home or data directory is known (or `$HOME` is relative).
pub fn path(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    match given {
        Some(p) => Ok(p.to_path_buf()),
        None => default_path().ok_or_else(|| anyhow::anyhow!("{}", no_default(std::env::var_os("HOME")))),
    }
}

/// Why there is no default history, given `$HOME`.
fn no_default(home: Option<std::ffi::OsString>) -> String {
    match home {
        Some(h) if !h.is_empty() => format!(
            "no history database: HOME ({}) is not an absolute path, so it is ignored; set an absolute HOME or RUNNER_HISTORY, or give --history FILE",
            h.to_string_lossy().escape_debug()
        ),
        _ => "no history database: set RUNNER_HISTORY or HOME, or give --history FILE".into(),
    }
}

/// The figures a comparison looks at: per series and GPU count, the layout, days and the
/// cheapest quote with its cloud.
pub fn figures(o: &Outcome) -> Value {
    let mut series = serde_json::Map::new();
    for s in &o.series {
        let mut rows = serde_json::Map::new();
        for r in &s.rows {
            let cheapest = r.cheapest_cost();
            rows.insert(
                r.gpus.to_string(),
                json!({
                    "layout": r.projection.as_ref().map(|p| p.layout.short()),
                    "days": r.days,
                    "tokens_per_sec_per_gpu": r.projection.as_ref().map(|p| p.tokens_per_sec_per_gpu),
                    "usd": cheapest.map(|c| c.usd),
                    "cloud": cheapest.map(|c| c.cloud.clone()),
                    "price_row": cheapest.map(crate::pricing::CloudCost::row),
                }),
            );
        }
        rows.insert("sweet_spot".into(), json!(s.sweet_spot));
        series.insert(s.label(), Value::Object(rows));
    }
    json!({ "model": o.model.variant, "tokens": o.model.tokens, "series": series })
}

/// What changed between runs `a` and `b`: inputs, plugins (by name: sha256 and source),
/// the outcome (status, and a failed run's error) and the figures.
pub fn compare(a: &Run, b: &Run) -> Vec<(String, Change)> {
    let mut out = Vec::new();
    for c in runner_store::diff(&a.inputs, &b.inputs) {
        out.push(("inputs".to_string(), c));
    }
    // Keyed by name; a name two plugins of a run share (a workload and a price file both
    // called "ours") gets its kind, and then its place, so neither hides the other's change.
    let by_name = |v: &Value| -> Value {
        let list: Vec<&Value> = v.as_array().into_iter().flatten().collect();
        let name = |p: &Value| p["name"].as_str().unwrap_or("?").to_string();
        let mut m = serde_json::Map::new();
        for (i, p) in list.iter().enumerate() {
            let mut key = name(p);
            let same_kind = |q: &&&Value| name(q) == name(p) && q["kind"] == p["kind"];
            if list.iter().filter(|q| name(q) == key).count() > 1 {
                key = format!("{key} ({})", p["kind"].as_str().unwrap_or("?"));
                if list.iter().filter(same_kind).count() > 1 {
                    key = format!("{key} #{}", list[..=i].iter().filter(same_kind).count());
                }
            }
            m.insert(key, json!({ "sha256": p["sha256"], "source": p["source"] }));
        }
        Value::Object(m)
    };
    for c in runner_store::diff(&by_name(&a.plugins), &by_name(&b.plugins)) {
        out.push(("plugins".to_string(), c));
    }
    // Two failed runs have no figures: without this, different errors read as no change.
    let outcome = |r: &Run| json!({ "status": r.status, "error": r.result.as_ref().map_or(Value::Null, |v| v["error"].clone()) });
    for c in runner_store::diff(&outcome(a), &outcome(b)) {
        out.push(("outcome".to_string(), c));
    }
    let figures = |r: &Run| r.result.as_ref().map_or(Value::Null, |v| v["figures"].clone());
    for c in runner_store::diff(&figures(a), &figures(b)) {
        out.push(("results".to_string(), c));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::explore::tests::{outcome, priced, row};

    /// A history path in a scratch directory removed when the guard goes, also when the
    /// test fails.
    pub(super) fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::Builder::new().prefix(&format!("runner-history-unit-{name}-")).tempdir().unwrap();
        let path = tmp.path().join("h.sqlite");
        (tmp, path)
    }

    /// A run left unfinished is resumed by the next with the same inputs, which recalls
    /// its pieces and closes it; a failed run keeps its error.
    #[test]
    fn an_unfinished_run_is_resumed_with_its_pieces_and_closed() {
        let (_tmp, path) = scratch("resume");
        let mut a = StoreJournal::open(&path, "explore", "runner run a.toml").unwrap();
        a.begin(&json!({ "gpus": 8 }), &[]).unwrap();
        assert!(!a.resumed);
        let id = a.id().unwrap();
        a.record("row 8", &json!({ "days": 3 })).unwrap();
        let mut b = StoreJournal::open(&path, "explore", "runner run a.toml").unwrap();
        b.begin(&json!({ "gpus": 8 }), &[]).unwrap();
        assert!(b.resumed);
        assert_eq!((b.id(), b.recalled()), (Some(id), 1));
        assert_eq!((b.recall("row 8"), b.recall("row 16")), (Some(json!({ "days": 3 })), None));
        b.finish(&json!({ "figures": 1 }));
        let mut c = StoreJournal::open(&path, "explore", "runner run b.toml").unwrap();
        c.begin(&json!({ "gpus": 16 }), &[]).unwrap();
        c.fail("no plugin");
        let store = Store::open(&path).unwrap();
        let run = store.get(id).unwrap();
        assert_eq!((run.status.as_str(), run.result), ("done", Some(json!({ "figures": 1 }))));
        let run = store.get(c.id().unwrap()).unwrap();
        assert_eq!((run.status.as_str(), run.result), ("failed", Some(json!({ "error": "no plugin" }))));
        assert!(a.lost().is_none() && b.lost().is_none() && c.lost().is_none());
    }

    /// A run an older build of this version left unfinished (begun without [`PIECES`],
    /// as every build before them was) is not resumed: its pieces may follow older rules.
    #[test]
    fn a_run_of_an_older_build_is_not_resumed() {
        let (_tmp, path) = scratch("older");
        let inputs = json!({ "gpus": 8 });
        let mut store = Store::open(&path).unwrap();
        let (old, _) = store.begin("explore", "runner run a.toml", &inputs, &json!([]), env!("CARGO_PKG_VERSION"), "").unwrap();
        store.put_item(old, "row 8", &json!({ "days": 3 })).unwrap();
        let mut j = StoreJournal::open(&path, "explore", "runner run a.toml").unwrap();
        j.begin(&inputs, &[]).unwrap();
        assert!(!j.resumed && j.id() != Some(old) && j.recall("row 8").is_none());
    }

    /// A write that fails is kept as the reason the run is lost, never as an error of the
    /// run, and nothing more is written, even once writes would work again.
    #[test]
    fn a_failed_write_loses_the_run_and_writes_nothing_more() {
        let (_tmp, path) = scratch("lost");
        let mut j = StoreJournal::open(&path, "explore", "runner run a.toml").unwrap();
        j.begin(&json!({ "gpus": 8 }), &[]).unwrap();
        let id = j.id().unwrap();
        j.record("a", &json!(1)).unwrap();
        let sql = rusqlite::Connection::open(&path).unwrap();
        sql.execute_batch("CREATE TRIGGER boom BEFORE INSERT ON items BEGIN SELECT RAISE(FAIL, 'boom'); END;").unwrap();
        j.record("b", &json!(2)).unwrap();
        assert!(j.lost().is_some_and(|e| e.contains("boom")), "{:?}", j.lost());
        assert_eq!(j.id(), None);
        sql.execute_batch("DROP TRIGGER boom;").unwrap();
        j.record("c", &json!(3)).unwrap();
        j.finish(&json!({}));
        j.begin(&json!({ "gpus": 16 }), &[]).unwrap();
        assert_eq!(j.id(), None, "no new run either");
        let run = Store::open(&path).unwrap().get(id).unwrap();
        assert_eq!(run.items, vec![("a".to_string(), json!(1))]);
        assert_eq!(run.status, "running");
        assert_eq!(Store::open(&path).unwrap().list(10).unwrap().len(), 1, "one run in the history");
        drop(sql);
    }

    /// A stored explore run: done with `result`, or running without one.
    pub(super) fn stored(inputs: Value, plugins: Value, result: Option<Value>) -> Run {
        Run {
            id: 1,
            kind: "explore".into(),
            command: String::new(),
            started: String::new(),
            finished: None,
            status: if result.is_some() { "done" } else { "running" }.into(),
            inputs,
            plugins,
            result,
            items: Vec::new(),
            runner_version: "0".into(),
            owner_pid: 0,
        }
    }

    /// Inputs, plugins by name (their sha256 and where they were loaded from, in any
    /// order) and the figures are compared; renderings are not.
    #[test]
    fn compare_reads_inputs_plugins_by_name_and_figures() {
        let a = stored(
            json!({ "gpus": 8 }),
            json!([{ "name": "llama3", "kind": "workload", "sha256": "aa", "source": "builtin" }, { "name": "aws", "sha256": "bb", "source": "/x/aws.wasm" }]),
            Some(json!({ "figures": { "x": 1 }, "renderings": { "table": "A" } })),
        );
        let b = stored(
            json!({ "gpus": 16 }),
            json!([{ "name": "aws", "sha256": "cc", "source": "/x/aws.wasm" }, { "name": "llama3", "kind": "other", "sha256": "aa", "source": "/y/llama3.wasm" }]),
            Some(json!({ "figures": { "x": 2 }, "renderings": { "table": "B" } })),
        );
        let change = |what: &str, path: &str, a: Value, b: Value| (what.to_string(), Change { path: path.into(), a, b });
        assert_eq!(
            compare(&a, &b),
            vec![
                change("inputs", "gpus", json!(8), json!(16)),
                change("plugins", "aws.sha256", json!("bb"), json!("cc")),
                change("plugins", "llama3.source", json!("builtin"), json!("/y/llama3.wasm")),
                change("results", "x", json!(1), json!(2)),
            ]
        );
        let dir = std::env::temp_dir();
        assert_eq!(path(Some(&dir.join("given.sqlite"))).unwrap(), dir.join("given.sqlite"));
    }

    /// A comparison's figures: per series and GPU count the days and the cheapest quote
    /// (not the first cloud's), and the series' sweet spot.
    #[test]
    fn figures_take_the_cheapest_quote_and_the_sweet_spot() {
        let mut eight = row(8, Some(10.0), vec![priced("a", 10.0, &[], "s"), priced("b", 5.0, &[], "s")]);
        eight.cheapest = Some(1);
        let mut o = outcome("bf16", vec![eight], &["a", "b"]);
        o.series[0].sweet_spot = Some(8);
        let f = figures(&o);
        assert_eq!((&f["model"], &f["tokens"]), (&json!("llama3-8b"), &json!(1e12)));
        let s = &f["series"]["H100 bf16"];
        assert_eq!((&s["8"]["usd"], &s["8"]["cloud"], &s["8"]["days"]), (&json!(5.0), &json!("b"), &json!(10.0)));
        assert_eq!(s["sweet_spot"], json!(8));
    }
}

/// What a hand mutation audit of this file let through (16 of 29 mutations survived the
/// tests above): a failed closing write, a history that cannot begin or be read back, the
/// run's record of its plugins and version, a run resumed twice, the figures of a fitted
/// row, and the order and edges of a comparison.
#[cfg(test)]
mod journal_tests {
    use super::*;
    use super::tests::{scratch, stored};
    use crate::plugin::{Kind, Source};
    use crate::report::explore::tests::{outcome, priced, row};

    fn trigger(path: &Path, sql: &str) {
        rusqlite::Connection::open(path).unwrap().execute_batch(sql).unwrap();
    }

    /// A run whose closing write fails (finish or fail) is lost with that error and its id
    /// forgotten; a later error never replaces the first. Kills: finish's and fail's
    /// failed writes ignored, a later error kept instead of the first.
    #[test]
    fn a_failed_closing_write_loses_the_run_and_the_first_error_stays() {
        let (_dir, db) = scratch("close");
        let mut done = StoreJournal::open(&db, "explore", "a").unwrap();
        done.begin(&json!({ "gpus": 8 }), &[]).unwrap();
        let id = done.id().unwrap();
        let mut failed = StoreJournal::open(&db, "explore", "b").unwrap();
        failed.begin(&json!({ "gpus": 16 }), &[]).unwrap();
        trigger(&db, "CREATE TRIGGER boom BEFORE UPDATE ON runs BEGIN SELECT RAISE(FAIL, 'closing boom'); END;");
        done.finish(&json!({ "figures": 1 }));
        failed.fail("no plugin");
        for j in [&done, &failed] {
            assert!(j.lost().is_some_and(|e| e.contains("closing boom")), "{:?}", j.lost());
            assert_eq!(j.id(), None);
        }
        assert_eq!(Store::open(&db).unwrap().get(id).unwrap().status, "running");
        done.lose(&"a later error");
        assert!(done.lost().is_some_and(|e| e.contains("closing boom")), "{:?}", done.lost());
    }

    /// A history that cannot start the run, or whose unfinished run holds an item that is
    /// not JSON, loses the run without failing it: `begin` answers Ok, nothing is recalled
    /// and nothing written. Kills: begin's failed write returned as an error, an unreadable
    /// item ignored (the run kept on).
    #[test]
    fn a_history_that_cannot_begin_or_be_read_back_loses_the_run_not_the_run() {
        let (_dir, db) = scratch("begin");
        drop(Store::open(&db).unwrap());
        trigger(&db, "CREATE TRIGGER boom BEFORE INSERT ON runs BEGIN SELECT RAISE(FAIL, 'begin boom'); END;");
        let mut j = StoreJournal::open(&db, "explore", "a").unwrap();
        assert!(j.begin(&json!({ "gpus": 8 }), &[]).is_ok());
        assert!(j.lost().is_some_and(|e| e.contains("begin boom")), "{:?}", j.lost());
        assert_eq!((j.id(), j.recalled(), j.resumed), (None, 0, false));
        trigger(&db, "DROP TRIGGER boom;");

        let mut a = StoreJournal::open(&db, "explore", "a").unwrap();
        a.begin(&json!({ "gpus": 16 }), &[]).unwrap();
        let id = a.id().unwrap();
        a.record("row 8", &json!(1)).unwrap();
        trigger(&db, &format!("UPDATE items SET value = 'not json' WHERE run_id = {id};"));
        let mut b = StoreJournal::open(&db, "explore", "a").unwrap();
        assert!(b.begin(&json!({ "gpus": 16 }), &[]).is_ok());
        assert!(b.resumed);
        assert!(b.lost().is_some_and(|e| e.contains("item row 8")), "{:?}", b.lost());
        assert_eq!((b.id(), b.recalled()), (None, 0));
        b.record("row 16", &json!(2)).unwrap();
        let sql = rusqlite::Connection::open(&db).unwrap();
        let keys: Vec<String> = sql.prepare("SELECT key FROM items").unwrap().query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
        assert_eq!(keys, ["row 8"], "nothing more written");
    }

    /// A run records its kind, command line, runner version and each plugin's name, kind,
    /// contract, source and sha256; resumed twice (two runs stopped before the third)
    /// it is the same run, recalling what both wrote. Kills: any plugin field left out,
    /// the version left out, kind and command swapped.
    #[test]
    fn a_run_records_its_plugins_and_version_and_resumes_twice() {
        let (_dir, db) = scratch("twice");
        let plugin = |name: &str, kind: Kind, source: Source, sha256: &str| PluginInfo {
            name: name.into(),
            kind,
            contract: "1.2.0".into(),
            source,
            sha256: sha256.into(),
            bytes: 10,
            shadows_embedded: false,
        };
        let plugins = [plugin("llama3", Kind::Workload, Source::Embedded, "aa"), plugin("aws", Kind::Cost, Source::Path("/x/aws.wasm".into()), "bb")];
        let inputs = json!({ "gpus": [8, 16] });
        let mut ids = Vec::new();
        for (n, key) in ["row 8", "row 16", "done"].into_iter().enumerate() {
            let mut j = StoreJournal::open(&db, "explore", "runner run a.toml").unwrap();
            j.begin(&inputs, &plugins).unwrap();
            assert_eq!((j.resumed, j.recalled()), (n > 0, n));
            ids.push(j.id().unwrap());
            if n < 2 {
                j.record(key, &json!(n)).unwrap();
            } else {
                assert_eq!((j.recall("row 8"), j.recall("row 16")), (Some(json!(0)), Some(json!(1))));
                j.finish(&json!({ "figures": {} }));
            }
        }
        assert_eq!(ids, [ids[0]; 3]);
        let store = Store::open(&db).unwrap();
        assert_eq!(store.list(10).unwrap().len(), 1);
        let run = store.get(ids[0]).unwrap();
        assert_eq!((run.kind.as_str(), run.command.as_str(), run.status.as_str()), ("explore", "runner run a.toml", "done"));
        assert_eq!(run.runner_version, env!("CARGO_PKG_VERSION"));
        assert_eq!(
            run.plugins,
            json!([
                { "name": "llama3", "kind": "workload", "contract": "1.2.0", "source": "embedded", "sha256": "aa" },
                { "name": "aws", "kind": "cost", "contract": "1.2.0", "source": "/x/aws.wasm", "sha256": "bb" },
            ])
        );
    }

    /// A fitted row's figures, under the GPU count it used (6 asked for, rounded up to a
    /// node of 8): its layout, tokens per second per GPU and the cheapest quote's price
    /// row. Kills: each of them left out, the row keyed by the count asked for.
    #[test]
    fn a_fitted_row_s_figures_carry_its_layout_speed_and_price_row() {
        let projection = serde_json::from_value(json!({
            "layout": {
                "tp": 8, "pp": 1, "cp": 1, "vp": 1, "ep": 1, "etp": 1, "dp": 1, "mbs": 1, "gbs": 64,
                "sequence_parallel": true, "fsdp": false, "recompute": "none", "recompute_layers": 0,
                "distributed_optimizer": true, "tp_overlap": false, "ep_overlap": false, "dp_overlap": false, "grad_fp32": false
            },
            "gpus": 8, "step_time_s": 2.5, "tokens_per_sec_per_gpu": 1234.5, "model_tflops_per_gpu": 400.0, "mfu": 0.4,
            "memory_per_gpu_gib": 40.2, "fits": true,
            "memory": serde_json::to_value(runner_project::step::Memory::default()).unwrap(),
            "breakdown": serde_json::to_value(runner_project::step::Breakdown::default()).unwrap(), "micro_batches": 64
        }))
        .unwrap();
        let mut eight = row(8, Some(10.0), vec![priced("a", 10.0, &[], "s"), priced("b", 5.0, &[], "s")]);
        (eight.cheapest, eight.requested_gpus) = (Some(1), 6);
        eight.projection = Some(projection);
        let layout = eight.projection.as_ref().unwrap().layout.short();
        let price_row = eight.costs[1].quote().unwrap().row();
        let f = figures(&outcome("bf16", vec![eight], &["a", "b"]));
        let r = &f["series"]["H100 bf16"]["8"];
        assert!(layout.starts_with("TP8"), "{layout}");
        assert_eq!((&r["layout"], &r["tokens_per_sec_per_gpu"]), (&json!(layout), &json!(1234.5)));
        assert_eq!(r["price_row"], json!(price_row));
        assert_eq!(r["price_row"], json!("i r on-demand undated"));
    }

    /// Two plugins of a run with one name (a workload and a price file both called
    /// "ours", or two price files) are told apart by kind and then by place: keyed by name
    /// alone, the second hid the first's change.
    #[test]
    fn compare_keeps_plugins_that_share_a_name_apart() {
        let p = |kind: &str, sha: &str| json!({ "name": "ours", "kind": kind, "sha256": sha, "source": "/x" });
        let a = stored(json!({}), json!([p("workload", "aa"), p("cost", "bb"), p("cost", "cc")]), None);
        let b = stored(json!({}), json!([p("workload", "a2"), p("cost", "bb"), p("cost", "c2")]), None);
        let change = |what: &str, path: &str, a: Value, b: Value| (what.to_string(), Change { path: path.into(), a, b });
        assert_eq!(
            compare(&a, &b),
            vec![
                change("plugins", "ours (cost) #2.sha256", json!("cc"), json!("c2")),
                change("plugins", "ours (workload).sha256", json!("aa"), json!("a2")),
            ]
        );
    }

    /// A comparison lists inputs, then plugins, then the outcome, then results, each by
    /// path in key order; a run against itself has no changes; an unfinished run (no
    /// result) has no figures, so its whole figures are one change at the root of the
    /// results, after its status. Two failed runs differ by their errors. Kills: the
    /// inputs' changes out of order.
    #[test]
    fn compare_orders_its_changes_and_reads_an_unfinished_run_as_no_figures() {
        let plugins = json!([{ "name": "aws", "sha256": "bb", "source": "/x/aws.wasm" }]);
        let done = stored(json!({ "gpus": [8, 16], "model": "a" }), plugins.clone(), Some(json!({ "figures": { "16": 2, "8": 1 } })));
        assert!(compare(&done, &done.clone()).is_empty(), "a run against itself");
        let mut other = done.clone();
        other.inputs = json!({ "model": "b", "gpus": [8, 16, 32] });
        other.plugins = json!([{ "name": "aws", "sha256": "cc", "source": "/x/aws.wasm" }]);
        other.result = Some(json!({ "figures": { "8": 3, "16": 4 } }));
        let change = |what: &str, path: &str, a: Value, b: Value| (what.to_string(), Change { path: path.into(), a, b });
        assert_eq!(
            compare(&done, &other),
            vec![
                change("inputs", "gpus[2]", Value::Null, json!(32)),
                change("inputs", "model", json!("a"), json!("b")),
                change("plugins", "aws.sha256", json!("bb"), json!("cc")),
                change("results", "16", json!(2), json!(4)),
                change("results", "8", json!(1), json!(3)),
            ]
        );
        let unfinished = stored(done.inputs.clone(), plugins, None);
        assert_eq!(
            compare(&done, &unfinished),
            vec![
                change("outcome", "status", json!("done"), json!("running")),
                change("results", "", json!({ "16": 2, "8": 1 }), Value::Null),
            ]
        );
        let failed = |error: &str| Run { status: "failed".into(), result: Some(json!({ "error": error })), ..unfinished.clone() };
        assert!(compare(&failed("no plugin"), &failed("no plugin")).is_empty());
        assert_eq!(
            compare(&failed("no plugin"), &failed("plugin 'aws' trapped")),
            vec![change("outcome", "error", json!("no plugin"), json!("plugin 'aws' trapped"))]
        );
        assert_eq!(
            compare(&failed("no plugin"), &done)[..2],
            [change("outcome", "error", json!("no plugin"), Value::Null), change("outcome", "status", json!("failed"), json!("done"))]
        );
    }
}
