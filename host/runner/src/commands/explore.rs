//! The explorer's commands: the default run (`runner --plugin llama3.wasm`), `runner
//! explore`, `runner run FILE`, and the history: `runner history`, `show`, `compare`.
//! Flags become a [`RunFile`] checked exactly as a run file is, so both spell the same run.


use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::json;

use runner::explore::{self, GOAL_COUNTS, Outcome};
use runner::history::{self, StoreJournal};
use runner::plugin::Limits;
use runner::report::{self, OutputFormat, Table};
use runner::runfile::{self, RunFile};
use runner_graph::recompute::RecomputePolicy;

use crate::commands::{output_format, print_stdout, stdout_format, write_output};
use crate::{Global, QuickRun};

/// Why `--precision` does not take `value` when it names a plugin (a `.wasm` file or a
/// path) rather than a format: a precision plugin plans one format, and only a run file
/// pairs the two. "unknown precision 'x.wasm'" never said where a plugin goes.
fn precision_plugin_refusal(value: &str) -> Option<String> {
    let plugin = value.to_ascii_lowercase().ends_with(".wasm") || value.contains('/') || value.contains('\\');
    if !plugin {
        return None;
    }
    let shown = runner_contract::text::escape(value, 256);
    let stem = std::path::Path::new(value).file_stem().and_then(|s| s.to_str()).unwrap_or_default();
    let format = runner_project::precision::Recipe::parse(stem).map_or("fp8", |r| r.name());
    let own = match runner_project::precision::Recipe::parse(stem) {
        // The first-party policy of a format is the one its name already picks.
        Ok(r) if !value.contains('/') && !value.contains('\\') => {
            format!("; --precision {} already uses {shown} (an installed one, else the embedded one)", r.name())
        }
        _ => String::new(),
    };
    Some(format!(
        "--precision {shown}: a precision plugin is not a format; name it in a run file, [precision] format = \"{format}\" \
         (the format it plans) and plugin = \"{shown}\", and run that with `runner run FILE`{own}. --precision takes bf16, \
         fp8, fp8-cs, mxfp8 or nvfp4"
    ))
}

/// Apply the command line's flags over a run (from a file or the defaults) and check the
/// result as a run file is checked.
fn apply_overrides(run: &mut RunFile, quick: &QuickRun, global: &Global) -> Result<()> {
    let before = toml::Value::try_from(&*run).context("serialising the run")?;
    if let Some(p) = &global.profile {
        run.cluster.profile = Some(utf8_path("--profile", p)?.to_string());
    }
    if let Some(p) = &quick.plugin {
        run.model.plugin = p.clone();
    }
    if let Some(name) = &quick.model {
        let found = runner::project::find_model(name, Limits::default())?;
        run.model.plugin = found.spec;
        // As the plugin spells it: --model finds a variant in any case.
        run.model.variant = Some(found.variant.name);
    }
    if let Some(v) = &quick.variant {
        run.model.variant = Some(v.clone());
    }
    if let Some(g) = &quick.gpu {
        run.cluster.gpu = g.clone();
    }
    let goal = quick.target_days.is_some() || quick.budget.is_some();
    match &quick.gpus {
        Some(g) => run.cluster.gpus = g.clone(),
        None if goal && run.cluster.gpus == runfile::ClusterSection::default().gpus => run.cluster.gpus = GOAL_COUNTS.to_vec(),
        None => {}
    }
    if let Some(p) = &quick.precision {
        if let Some(m) = p.iter().find_map(|f| precision_plugin_refusal(f)) {
            anyhow::bail!(m);
        }
        run.precision.format = p.clone();
    }
    if quick.gbs.is_some() {
        run.cluster.gbs = quick.gbs;
    }
    quick.cloud.apply(&mut run.cost)?;
    if quick.tokens.is_some() {
        run.model.tokens = quick.tokens;
    }
    if quick.seq_len.is_some() {
        run.model.seq_len = quick.seq_len;
    }
    for (slot, v) in [
        (&mut run.layout.tp, quick.tp),
        (&mut run.layout.pp, quick.pp),
        (&mut run.layout.cp, quick.cp),
        (&mut run.layout.vp, quick.vp),
        (&mut run.layout.ep, quick.ep),
        (&mut run.layout.etp, quick.etp),
        (&mut run.layout.mbs, quick.mbs),
    ] {
        if v.is_some() {
            *slot = v;
        }
    }
    if quick.pipeline_split.is_some() {
        run.layout.pipeline_split = quick.pipeline_split;
    }
    if quick.optimizer.is_some() {
        run.layout.optimizer = quick.optimizer;
    }
    if quick.pipeline_schedule.is_some() {
        run.layout.pipeline_schedule = quick.pipeline_schedule;
    }
    // The two goals exclude each other on the command line, so the one given replaces the
    // file's other: a --budget over a file's target_days was answered with the target and
    // a note that the budget was ignored.
    if quick.target_days.is_some() {
        run.explore.target_days = quick.target_days;
        run.explore.budget_usd = None;
    }
    if quick.budget.is_some() {
        run.explore.budget_usd = quick.budget;
        run.explore.target_days = None;
    }
    if quick.max_usd_per_day_saved.is_some() {
        run.explore.max_usd_per_day_saved = quick.max_usd_per_day_saved;
    }
    if let Some(r) = quick.repeats {
        run.measure.repeats = r;
    }
    if let Some(r) = &quick.recompute {
        run.measure.recompute = match r.as_str() {
            "selective" => RecomputePolicy::Selective,
            "full" => RecomputePolicy::Full,
            _ => RecomputePolicy::None,
        };
    }
    // Re-check the merged run exactly as a run file would be checked.
    let text = toml::to_string(run).context("serialising the run")?;
    match runfile::parse_flags(&text) {
        Ok(checked) => {
            *run = checked;
            Ok(())
        }
        Err(e) => {
            let after = toml::Value::try_from(&*run).context("serialising the run")?;
            Err(anyhow::Error::msg(name_the_flag(&e, &before, &after)))
        }
    }
}

/// A run-file check's message as the command line's: `[model] seq_len must be ...`
/// becomes `--seq-len must be ...` where a flag set that key (its value differs from the
/// file's or the default's), since that is what the user typed; a key the flags left
/// alone keeps its run-file name.
fn name_the_flag(message: &str, before: &toml::Value, after: &toml::Value) -> String {
    // Keys whose flag is not the key with dashes.
    const FLAGS: &[(&str, &str, &str)] = &[
        ("explore", "budget_usd", "--budget"),
        ("precision", "format", "--precision"),
        ("cost", "plugins", "--cloud"),
        ("model", "variant", "--model or --variant"),
    ];
    let Some((section, rest)) = message.strip_prefix("command line: [").and_then(|m| m.split_once("] ")) else {
        return message.to_string();
    };
    let key: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    let value = |v: &toml::Value| v.get(section).and_then(|t| t.get(&key)).cloned();
    if key.is_empty() || value(before) == value(after) {
        return message.to_string();
    }
    let flag = FLAGS
        .iter()
        .find(|(s, k, _)| *s == section && *k == key)
        .map_or_else(|| format!("--{}", key.replace('_', "-")), |(_, _, f)| (*f).to_string());
    format!("{flag}{}", &rest[key.len()..])
}

/// A path flag as the run keeps it: a run (a run file, the history's copy) holds paths as
/// text, so a name that is not UTF-8 is refused by name; shown lossily it named another
/// file, which the run then could not find.
pub(crate) fn utf8_path<'a>(flag: &str, path: &'a Path) -> Result<&'a str> {
    path.to_str().ok_or_else(|| {
        anyhow::anyhow!(
            "{flag} {}: the file name is not UTF-8 text, which a run keeps its paths as; rename the file \
             (or link to it under a UTF-8 name)",
            path.display()
        )
    })
}

/// The command line as typed, for the history. An argument that is not UTF-8 (a file
/// name from another system's encoding) is kept lossily: `env::args` panicked on it.
fn command_line() -> String {
    std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .map(|a| if a.contains([' ', '"', '\'']) { format!("{a:?}") } else { a })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Run the explorer on `run`, keeping it in the history, and print it.
fn execute(run: &RunFile, global: &Global) -> Result<()> {
    refuse_output_over_inputs(run, global)?;
    let mut journal = if global.no_history {
        None
    } else {
        match history::path(global.history.as_deref()).and_then(|path| StoreJournal::open(&path, "explore", &command_line())) {
            Ok(j) => Some(j),
            Err(e) => {
                // A history that cannot be written, or has no place (no HOME: a container
                // under an arbitrary uid, `env -i`), must not cost the user the run.
                // Its path may be the user's --history, a terminal sequence and all.
                elog!("warning: not kept in the history: {} (--history FILE or --no-history)", runner::report::visible(&format!("{e:#}")));
                None
            }
        }
    };
    interrupt::catch(journal.is_some());
    let bar = crate::commands::spinner(global);
    let tty = bar.is_some();
    let last = std::cell::Cell::new(usize::MAX);
    let progress = |msg: &str, done: usize, total: usize| {
        let msg = runner::report::visible(msg);
        if let Some(b) = &bar {
            if total > 0 {
                b.set_message(format!("[{done}/{total}] {msg}"));
            } else {
                b.set_message(msg);
            }
        } else if !global.quiet && !tty && total > 0 && last.get() != done {
            // Periodic lines when stderr is not a terminal (CI logs, pipes).
            last.set(done);
            elog!("[{done}/{total}] {msg}");
        }
    };
    let outcome = match journal.as_mut() {
        Some(j) => explore::run_with(run, &progress, j),
        None => explore::run(run, &progress),
    };
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            interrupt::release();
            if let Some(j) = &mut journal {
                j.fail(&format!("{e:#}"));
                warn_lost(j);
            }
            return Err(e);
        }
    };
    if let Some(j) = &mut journal {
        keep(j, &outcome, global);
        warn_lost(j);
    }
    // Kept whole: from here a rerun starts afresh, so "rerun to resume" would mislead.
    interrupt::release();
    // The file first: a stdout that fails (a closed pipe) must not lose it.
    write_output(global, &|f| report::explore::render(&outcome, f))?;
    print_stdout(&report::explore::render(&outcome, stdout_format(global)))
}

/// -o naming a file the run reads: the command line's are refused before any command
/// runs, but a run file names its own (a price file, a profile, plugins as paths), which
/// the report then replaced (`runner run r.toml -o ours.csv` lost the price file).
fn refuse_output_over_inputs(run: &RunFile, global: &Global) -> Result<()> {
    let Some(out) = &global.output else { return Ok(()) };
    let read = [run.cost.price_file.as_ref(), run.cluster.profile.as_ref(), Some(&run.model.plugin), run.precision.plugin.as_ref()]
        .into_iter()
        .flatten()
        .chain(&run.cost.plugins);
    for input in read {
        if crate::is_same_file(out, Path::new(input)) {
            anyhow::bail!(
                "-o {} is also an input of this run ({input}): writing it would destroy it; choose another output file",
                out.display()
            );
        }
    }
    Ok(())
}

/// Say once, on stderr, that the history could not be written and the run is not kept.
fn warn_lost(j: &StoreJournal) {
    if let Some(e) = j.lost() {
        elog!(
            "warning: {}; this run is not kept in the history (--history FILE keeps it elsewhere, --no-history keeps nothing)",
            runner::report::visible(e)
        );
    }
}

/// Close the run in the history with its outcome, figures and every rendering (a failed
/// write is left in the journal for [`warn_lost`]).
fn keep(j: &mut StoreJournal, o: &Outcome, global: &Global) {
    let result = json!({
        "outcome": o,
        "figures": history::figures(o),
        // JSON too, as printed: the outcome read back from the store has its keys sorted
        // and its floats parsed to the nearest 17 digits, not the run's own.
        "renderings": {
            "json": report::explore::render(o, OutputFormat::Json),
            "table": report::explore::render(o, OutputFormat::Table),
            "csv": report::explore::render(o, OutputFormat::Csv),
            "html": report::explore::render(o, OutputFormat::Html),
        },
    });
    j.finish(&result);
    if !global.quiet
        && let Some(id) = j.id()
    {
        let resumed = if j.resumed { format!(", resumed with {} pieces already done", j.recalled()) } else { String::new() };
        elog!("kept as run {id}{resumed} (`runner show {id}`)");
    }
}

/// `runner` with no command, and `runner explore`: a run from flags over the defaults.
pub fn quick_run(quick: &QuickRun, global: &Global) -> Result<()> {
    let mut run = RunFile::default();
    run.model.plugin = "llama3.wasm".into();
    apply_overrides(&mut run, quick, global)?;
    execute(&run, global)
}

/// `runner run FILE`.
pub fn run_file(path: &Path, quick: &QuickRun, global: &Global) -> Result<()> {
    let file = runfile::load(path).map_err(anyhow::Error::msg)?;
    let mut run = file.clone();
    apply_overrides(&mut run, quick, global)?;
    runfile::check_plugins(path, &file, &run).map_err(anyhow::Error::msg)?;
    execute(&run, global)
}

fn open_store(global: &Global) -> Result<(runner_store::Store, PathBuf)> {
    let path = history::path(global.history.as_deref())?;
    if !path.exists() {
        anyhow::bail!("no history at {} yet: runs are kept there as they run (or give --history FILE)", path.display());
    }
    // A history this user may read but not write (another user's, a read-only mount) is
    // still listed, shown and compared; where it cannot be read either, the first error.
    let store = runner_store::Store::open(&path).or_else(|e| runner_store::Store::open_read_only(&path).map_err(|_| e))?;
    Ok((store, path))
}

/// `--prune-before DATE`: a UTC date (`2026-11-01`, midnight) or time as the history
/// writes it (`2026-11-01T12:00:00Z`), as that RFC 3339 text (which sorts as time does).
fn prune_date(s: &str) -> Result<String> {
    let full = if s.len() == 10 { format!("{s}T00:00:00Z") } else { s.to_string() };
    let shape = full.len() == 20
        && full.bytes().enumerate().all(|(i, c)| match i {
            4 | 7 => c == b'-',
            10 => c == b'T',
            13 | 16 => c == b':',
            19 => c == b'Z',
            _ => c.is_ascii_digit(),
        });
    // All ASCII once the shape holds, so the slices are on character boundaries.
    let num = |r: std::ops::Range<usize>| full[r].parse::<u32>().unwrap_or(99);
    if !(shape && (1..=12).contains(&num(5..7)) && (1..=31).contains(&num(8..10)) && num(11..13) < 24 && num(14..16) < 60 && num(17..19) < 60) {
        anyhow::bail!(
            "--prune-before '{}': not a UTC date: give YYYY-MM-DD (2026-11-01, from midnight) or the time as `runner history` \
             shows it (2026-11-01T12:00:00Z)",
            runner::report::visible(s)
        );
    }
    Ok(full)
}

/// `runner history`: the newest runs first; with `keep` or `prune_before`, old runs
/// deleted first (`Store::prune`) and the listing says how many.
pub fn list(limit: usize, keep: Option<usize>, prune_before: Option<&str>, global: &Global) -> Result<()> {
    if limit == 0 {
        anyhow::bail!("--limit 0 lists no runs: give 1 or more (the newest runs first; 20 when not given)");
    }
    if keep == Some(0) {
        anyhow::bail!(
            "--keep 0 would delete every run: give 1 or more (the newest runs kept); to drop the whole history, delete its file"
        );
    }
    let before = prune_before.map(prune_date).transpose()?;
    let (mut store, path) = open_store(global)?;
    let mut pruned = None;
    if keep.is_some() || before.is_some() {
        pruned = Some(store.prune(keep, before.as_deref())?);
    }
    let mut runs = store.list(limit)?;
    // A run still marked running whose process is gone was interrupted (it resumes when
    // started again with the same inputs).
    for r in &mut runs {
        r.status = r.state().to_string();
    }
    let mut t = Table::new(format!("history: {}", path.display()), &["id", "kind", "started", "status", "items", "command"]);
    for r in &runs {
        t.rows.push(vec![r.id.to_string(), r.kind.clone(), r.started.clone(), r.status.clone(), r.items.to_string(), r.command.clone()]);
    }
    if let Some((n, items)) = pruned {
        let why = [keep.map(|k| format!("past the newest {k}")), before.map(|b| format!("started before {b}"))];
        t.notes.push(format!(
            "pruned: {n} run(s) {} deleted with their {items} row(s), and the file compacted (a run still running is kept)",
            why.into_iter().flatten().collect::<Vec<_>>().join(" or ")
        ));
    }
    if runs.is_empty() {
        t.notes.push("no runs yet".into());
    }
    // The CSV: each run's fields under the JSON's names (named without a run too).
    let mut csv = report::records(&runs);
    if runs.is_empty() {
        csv.headers = ["id", "kind", "command", "started", "status", "items"].map(String::from).to_vec();
    }
    csv.notes = t.notes.clone();
    crate::commands::emit_csv(global, &t, &runs, &csv)
}

/// `runner show ID`: a stored run reprinted in any format. A run without a result (still
/// running, interrupted) or failed is shown in the format asked for too: JSON an object,
/// CSV a row, HTML escaped. A result that lacks what the format needs is an error.
pub fn show(id: i64, global: &Global) -> Result<()> {
    let (store, _) = open_store(global)?;
    let mut run = store.get(id)?;
    run.status = run.state().to_string();
    let format = stdout_format(global);
    let error = run.result.as_ref().and_then(|r| r.get("error")).map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_string));
    if run.result.is_none() || error.is_some() {
        // No outcome to reprint: the run's record, in the format asked for.
        let mut t = Table::new(format!("run {} ({})", run.id, run.kind), &["id", "kind", "status", "started", "finished", "items", "error", "command"]);
        t.rows.push(vec![
            run.id.to_string(),
            run.kind.clone(),
            run.status.clone(),
            run.started.clone(),
            run.finished.clone().unwrap_or_default(),
            run.items.len().to_string(),
            error.clone().unwrap_or_default(),
            run.command.clone(),
        ]);
        let value = match &error {
            Some(e) => json!({
                "id": run.id, "kind": run.kind, "status": run.status, "error": e,
                "started": run.started, "finished": run.finished, "command": run.command,
            }),
            None => serde_json::to_value(&run)?,
        };
        let sentence = match &error {
            Some(e) => format!("run {} failed: {e}\n", run.id),
            None => format!(
                "run {} ({}) is {}: {} kept; started {} by `{}`\n",
                run.id,
                run.kind,
                run.status,
                runner::report::plural(run.items.len(), "item"),
                run.started,
                run.command
            ),
        };
        let render = |f: OutputFormat| match f {
            OutputFormat::Table => report::visible(&sentence),
            _ => report::render(f, &t, &value),
        };
        write_output(global, &render)?;
        return print_stdout(&render(format));
    }
    let result = run.result.as_ref().filter(|r| r.is_object());
    // What each format reprints, or what the stored result lacks.
    let render = |f: OutputFormat| -> Result<String> {
        let Some(result) = result else {
            anyhow::bail!("run {id}'s stored result is not an object: it cannot be shown (`runner history` lists the runs)");
        };
        let (field, name) = match f {
            // A run kept before its JSON was: the stored outcome, keys sorted.
            OutputFormat::Json if result.get("renderings").and_then(|r| r.get("json")).is_none() => {
                return match result.get("outcome") {
                    Some(o) if !o.is_null() => Ok(serde_json::to_string_pretty(o)? + "\n"),
                    _ => anyhow::bail!("run {id}'s stored result has no outcome: it cannot be shown as JSON"),
                };
            }
            OutputFormat::Json => ("json", "JSON"),
            OutputFormat::Table => ("table", "a table"),
            OutputFormat::Csv => ("csv", "CSV"),
            OutputFormat::Html => ("html", "HTML"),
        };
        match result.get("renderings").and_then(|r| r.get(field)).and_then(|v| v.as_str()) {
            Some(text) => Ok(defused(f, text)),
            None => anyhow::bail!("run {id}'s stored result has no renderings.{field}: it cannot be shown as {name}"),
        }
    };
    // Render both first, so an error leaves neither the file nor stdout half done.
    let shown = render(format)?;
    if let Some(f) = output_format(global) {
        let text = render(f)?;
        write_output(global, &|_| text.clone())?;
    }
    print_stdout(&shown)
}

/// A stored rendering as it is reprinted. One the runner kept holds no character that
/// moves a terminal (its text was escaped as it was rendered), so it comes back byte for
/// byte; but a history is a file one may be handed (`--history` on a teammate's), and
/// such characters in it reached the terminal raw. In JSON they, and those that show as
/// nothing (the contract's `is_escaped`, the rule every escape follows), become \u
/// escapes, the same strings.
fn defused(format: OutputFormat, text: &str) -> String {
    match format {
        OutputFormat::Json => text
            .chars()
            .map(|c| if c != '\n' && runner_contract::text::is_escaped(c) { format!("\\u{:04x}", u32::from(c)) } else { c.to_string() })
            .collect(),
        _ => report::visible(text),
    }
}

/// Columns a compared value takes on a terminal; CSV, JSON and HTML carry it whole.
const COMPARE_CELL: usize = 48;

/// A figure as `compare`'s table shows it: to 1e-4.
fn compare_number(n: &serde_json::Number) -> String {
    n.as_f64().map_or(n.to_string(), |x| format!("{}", (x * 1e4).round() / 1e4))
}

/// A compared value on a terminal, at most [`COMPARE_CELL`] columns: a long text keeps
/// its two ends (two plugin paths differ at the end, two hashes at either); an object or
/// list (a series one run has and the other not) its first whole fields and how many
/// more, never a cut through the middle of a field as the JSON text cut short was.
fn terminal_cell(v: &serde_json::Value) -> String {
    use serde_json::Value;
    let scalar = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => compare_number(n),
        Value::Null => "-".into(),
        Value::Bool(b) => b.to_string(),
        Value::Array(a) => report::plural(a.len(), "item"),
        Value::Object(o) => report::plural(o.len(), "field"),
    };
    let (items, open, close): (Vec<String>, &str, &str) = match v {
        Value::Object(o) => (o.iter().map(|(k, x)| format!("{k}: {}", scalar(x))).collect(), "{", "}"),
        Value::Array(a) => (a.iter().map(scalar).collect(), "[", "]"),
        other => {
            let s = scalar(other);
            return if report::columns(&s) > COMPARE_CELL {
                let half = (COMPARE_CELL - 3) / 2;
                format!("{}...{}", report::fit(&s, half), report::fit_end(&s, COMPARE_CELL - 3 - half))
            } else {
                s
            };
        }
    };
    let mut shown = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let left = items.len() - i - 1;
        let more = if left > 0 { format!(", +{left} more") } else { String::new() };
        let next = format!("{open}{}{more}{close}", shown.iter().chain([item]).cloned().collect::<Vec<_>>().join(", "));
        if report::columns(&next) > COMPARE_CELL && !shown.is_empty() {
            break;
        }
        shown.push(item.clone());
    }
    let left = items.len() - shown.len();
    let body = shown.iter().map(|s| if report::columns(s) > COMPARE_CELL { format!("{}...", report::fit(s, COMPARE_CELL - 5)) } else { s.clone() });
    let body = body.collect::<Vec<_>>().join(", ");
    if left > 0 { format!("{open}{body}, +{left} more{close}") } else { format!("{open}{body}{close}") }
}

/// `runner compare A B`: what changed between two runs.
pub fn compare(a: i64, b: i64, global: &Global) -> Result<()> {
    let (store, _) = open_store(global)?;
    let (mut ra, mut rb) = (store.get(a)?, store.get(b)?);
    // As `history` and `show` say it: a run whose process is gone is interrupted, not
    // running (its outcome row and note said running).
    for r in [&mut ra, &mut rb] {
        r.status = r.state().to_string();
    }
    let changes = history::compare(&ra, &rb);
    let cell = |v: &serde_json::Value| -> String {
        match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => compare_number(n),
            serde_json::Value::Null => "-".into(),
            other => other.to_string(),
        }
    };
    let table = |shorten: bool| {
        let fit = |v: &serde_json::Value| if shorten { terminal_cell(v) } else { cell(v) };
        let mut t = Table::new(format!("run {a} against run {b}"), &["what", "where", &format!("run {a}"), &format!("run {b}")]);
        for (section, c) in &changes {
            t.rows.push(vec![section.clone(), c.path.clone(), fit(&c.a), fit(&c.b)]);
        }
        if changes.is_empty() {
            t.notes.push("same inputs, plugins, outcome and results".into());
        }
        t.notes.push(format!("run {a}: `{}` ({}, {})", ra.command, ra.started, ra.status));
        t.notes.push(format!("run {b}: `{}` ({}, {})", rb.command, rb.started, rb.status));
        t
    };
    let value: Vec<serde_json::Value> =
        changes.iter().map(|(s, c)| json!({"what": s, "where": c.path, "a": c.a, "b": c.b})).collect();
    let (terminal, whole) = (table(true), table(false));
    // The CSV: the JSON's rows (`what`, `where`, `a`, `b`), each value as JSON has it
    // (the table's figures rounded to 1e-4, "-" for none).
    let rows: Vec<report::Record> = changes.iter().map(|(s, c)| report::record([("what", json!(s)), ("where", json!(c.path)), ("a", c.a.clone()), ("b", c.b.clone())])).collect();
    let mut csv = report::records_of(&rows);
    // Named without a change too (a header, not an empty line).
    csv.headers = ["what", "where", "a", "b"].map(String::from).to_vec();
    csv.notes = whole.notes.clone();
    crate::commands::emit_rendered(global, &|format| match format {
        OutputFormat::Csv => csv.csv(),
        format => report::render(format, if format == OutputFormat::Table { &terminal } else { &whole }, &value),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CloudArgs;

    fn global() -> Global {
        Global { quiet: true, no_history: true, ..Default::default() }
    }

    /// `--prune-before` takes a date (from its midnight) or the history's own time, and
    /// refuses anything else naming both forms: a time compared as text must have the
    /// history's shape, or "2026-1-5" would sort after every December run. Kills a shape,
    /// month or hour check dropped, or the date not padded to midnight.
    #[test]
    fn prune_before_takes_a_date_or_the_historys_time_and_nothing_else() {
        assert_eq!(prune_date("2026-11-01").unwrap(), "2026-11-01T00:00:00Z");
        assert_eq!(prune_date("2026-11-01T12:30:00Z").unwrap(), "2026-11-01T12:30:00Z");
        for bad in ["2026-1-5", "2026-13-01", "2026-11-32", "2026-11-01T24:00:00Z", "2026-11-01 12:00:00", "yesterday", "", "2026-11-01T12:00:00+01:00", "２０２６-11-01"] {
            let e = format!("{:#}", prune_date(bad).unwrap_err());
            assert!(e.contains("not a UTC date: give YYYY-MM-DD (2026-11-01, from midnight)"), "{bad}: {e}");
        }
    }

    /// A run file's layout, batch, tokens, goals and GPU counts.
    fn file_run() -> RunFile {
        let mut run = RunFile::default();
        run.model.plugin = "llama3.wasm".into();
        run.model.tokens = Some(1e12);
        run.model.seq_len = Some(4096);
        run.cluster.gbs = Some(64);
        run.cluster.gpus = vec![16, 32];
        run.layout.tp = Some(2);
        run.layout.pp = Some(4);
        run.layout.cp = Some(2);
        run.layout.vp = Some(3);
        run.layout.ep = Some(1);
        run.layout.mbs = Some(1);
        run.explore.target_days = Some(30.0);
        run.explore.max_usd_per_day_saved = Some(500.0);
        run.measure.repeats = 3;
        run
    }

    /// Flags left out keep what the run file says (a flag not given is not a flag that
    /// clears the file's value), and a goal does not replace GPU counts the file gives.
    #[test]
    fn flags_left_out_keep_the_run_files_values() {
        let mut run = file_run();
        apply_overrides(&mut run, &QuickRun::default(), &global()).unwrap();
        let l = &run.layout;
        assert_eq!((l.tp, l.pp, l.cp, l.vp, l.ep, l.mbs), (Some(2), Some(4), Some(2), Some(3), Some(1), Some(1)));
        assert_eq!((run.model.tokens, run.model.seq_len, run.cluster.gbs), (Some(1e12), Some(4096), Some(64)));
        assert_eq!((run.explore.target_days, run.explore.max_usd_per_day_saved), (Some(30.0), Some(500.0)));
        assert_eq!((run.cluster.gpus.as_slice(), run.measure.repeats), (&[16, 32][..], 3));
    }

    /// A plugin given to `--precision` is refused with where a precision plugin goes (a run
    /// file's [precision] plugin, with its format), and a first-party one's format named;
    /// formats, and spellings `Recipe::parse` takes or refuses, are as before. Kills: the
    /// refusal left out (the old "unknown precision 'x.wasm'"); a format taken for a plugin.
    #[test]
    fn a_precision_plugin_on_the_command_line_says_where_it_goes() {
        let refused = |p: &str| {
            let quick = QuickRun { precision: Some(vec!["bf16".into(), p.into()]), ..QuickRun::default() };
            apply_overrides(&mut file_run(), &quick, &global()).unwrap_err().to_string()
        };
        let e = refused("/tmp/x/hp-fp4all.wasm");
        assert!(e.starts_with("--precision /tmp/x/hp-fp4all.wasm: a precision plugin is not a format; name it in a run file, \
            [precision] format = \"fp8\" (the format it plans) and plugin = \"/tmp/x/hp-fp4all.wasm\", and run that with `runner run FILE`. "), "{e}");
        let e = refused("FP8.wasm");
        assert!(e.contains("[precision] format = \"fp8\"") && e.contains("; --precision fp8 already uses FP8.wasm"), "{e}");
        assert!(refused("int8").contains("unknown precision 'int8'"));
        for p in [vec!["fp8-cs".to_string()], vec!["NVFP4".into(), "bf16".into()]] {
            let quick = QuickRun { precision: Some(p.clone()), ..QuickRun::default() };
            assert!(precision_plugin_refusal(&p[0]).is_none());
            let mut run = file_run();
            run.cluster.gpu = vec!["B200".into()];
            apply_overrides(&mut run, &quick, &global()).unwrap_or_else(|e| panic!("{p:?}: {e}"));
        }
    }

    /// A refused flag is named as typed (`--seq-len`, not `[model] seq_len`); a key no
    /// flag changed keeps its run-file name.
    #[test]
    fn a_refused_flag_is_named_as_typed() {
        let cases = [
            (QuickRun { seq_len: Some(0), ..QuickRun::default() }, "--seq-len must be"),
            (QuickRun { budget: Some(-5.0), ..QuickRun::default() }, "--budget must be"),
            (QuickRun { tokens: Some(0.0), ..QuickRun::default() }, "--tokens must be"),
            (QuickRun { repeats: Some(0), ..QuickRun::default() }, "--repeats must be"),
            (QuickRun { max_usd_per_day_saved: Some(-1.0), ..QuickRun::default() }, "--max-usd-per-day-saved must be"),
        ];
        for (quick, named) in cases {
            let e = apply_overrides(&mut file_run(), &quick, &global()).unwrap_err().to_string();
            assert!(e.starts_with(named), "{e}");
        }
        let before: toml::Value = toml::from_str("[model]\nseq_len = 0\n").unwrap();
        let kept = "command line: [model] seq_len must be in 1..=16777216, got 0";
        assert_eq!(name_the_flag(kept, &before, &before), kept);
    }

    /// Each layout flag lands in its own field, and the rest of the flags in theirs.
    #[test]
    fn each_flag_lands_in_its_own_field() {
        let mut run = file_run();
        let quick = QuickRun {
            tp: Some(8),
            pp: Some(5),
            cp: Some(4),
            vp: Some(6),
            ep: Some(7),
            etp: Some(2),
            mbs: Some(9),
            gbs: Some(128),
            tokens: Some(2e12),
            seq_len: Some(8192),
            budget: Some(1e6),
            max_usd_per_day_saved: Some(42.0),
            repeats: Some(5),
            recompute: Some("full".into()),
            cloud: CloudArgs { region: Some("us-east-1".into()), option: Some("spot".into()), clouds: vec!["aws".into()], price_file: None },
            ..QuickRun::default()
        };
        run.explore.target_days = None;
        apply_overrides(&mut run, &quick, &global()).unwrap();
        let l = &run.layout;
        assert_eq!((l.tp, l.pp, l.cp, l.vp, l.ep, l.etp, l.mbs), (Some(8), Some(5), Some(4), Some(6), Some(7), Some(2), Some(9)));
        assert_eq!((run.model.tokens, run.model.seq_len, run.cluster.gbs), (Some(2e12), Some(8192), Some(128)));
        assert_eq!((run.explore.budget_usd, run.explore.max_usd_per_day_saved), (Some(1e6), Some(42.0)));
        assert_eq!((run.measure.repeats, run.measure.recompute), (5, RecomputePolicy::Full));
        assert_eq!((run.cost.region.as_str(), run.cost.option.as_str(), run.cost.plugins.as_slice()), ("us-east-1", "spot", &["aws".to_string()][..]));
        // A goal with the file's own counts keeps them.
        assert_eq!(run.cluster.gpus, [16, 32]);
        for (flag, policy) in [("selective", RecomputePolicy::Selective), ("none", RecomputePolicy::None)] {
            let mut run = file_run();
            apply_overrides(&mut run, &QuickRun { recompute: Some(flag.into()), ..QuickRun::default() }, &global()).unwrap();
            assert_eq!(run.measure.recompute, policy, "{flag}");
        }
    }

    /// A goal flag replaces the run file's other goal, as any flag replaces the file's
    /// value: --budget over target_days is a budget run, --target-days over budget_usd a
    /// target run (the file's goal won, the flag noted as ignored).
    #[test]
    fn a_goal_flag_replaces_the_files_other_goal() {
        let mut run = file_run();
        apply_overrides(&mut run, &QuickRun { budget: Some(1e6), ..QuickRun::default() }, &global()).unwrap();
        assert_eq!((run.explore.target_days, run.explore.budget_usd), (None, Some(1e6)));
        let mut run = file_run();
        run.explore = runfile::ExploreSection { target_days: None, budget_usd: Some(2e6), max_usd_per_day_saved: None };
        apply_overrides(&mut run, &QuickRun { target_days: Some(10.0), ..QuickRun::default() }, &global()).unwrap();
        assert_eq!((run.explore.target_days, run.explore.budget_usd), (Some(10.0), None));
    }

    /// A goal without GPU counts walks the goal's counts; without a goal, or with counts
    /// given, the counts are the run's.
    #[test]
    fn a_goal_without_gpu_counts_walks_the_goal_counts() {
        let defaults = || {
            let mut run = RunFile::default();
            run.model.plugin = "llama3.wasm".into();
            run
        };
        let mut run = defaults();
        apply_overrides(&mut run, &QuickRun { target_days: Some(10.0), ..QuickRun::default() }, &global()).unwrap();
        assert_eq!(run.cluster.gpus, GOAL_COUNTS);
        let mut run = defaults();
        apply_overrides(&mut run, &QuickRun { budget: Some(1e6), ..QuickRun::default() }, &global()).unwrap();
        assert_eq!(run.cluster.gpus, GOAL_COUNTS);
        let mut run = defaults();
        apply_overrides(&mut run, &QuickRun::default(), &global()).unwrap();
        assert_eq!(run.cluster.gpus, runfile::ClusterSection::default().gpus);
        let mut run = defaults();
        apply_overrides(&mut run, &QuickRun { budget: Some(1e6), gpus: Some(vec![64]), ..QuickRun::default() }, &global()).unwrap();
        assert_eq!(run.cluster.gpus, [64]);
    }
}

/// A run stopped by SIGINT (Ctrl-C) or SIGTERM says so on stderr, after a newline that
/// ends the progress line, and how to go on; then it dies of the signal as it did before
/// (the shell's 130 or 143). Nothing else changes: the history is left exactly as any
/// kill leaves it (every finished row committed, the run resumed by the next with the
/// same inputs, as a SIGKILL'd one is), since the handler touches no Rust state and ends
/// the process the same way.
mod interrupt {
    use std::sync::atomic::{AtomicBool, Ordering};

    static RESUMABLE: AtomicBool = AtomicBool::new(false);
    const SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

    extern "C" fn on_signal(sig: libc::c_int) {
        let msg: &[u8] = if RESUMABLE.load(Ordering::Relaxed) {
            b"\ninterrupted; rerun the same command to resume\n"
        } else {
            b"\ninterrupted (--no-history: nothing kept to resume)\n"
        };
        // SAFETY: write, signal and raise are async-signal-safe; `msg` is static.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }

    /// Say a word on SIGINT/SIGTERM from now on (`resumable`: the run is in the history).
    /// A signal the runner was started ignoring (`nohup`, a background job) stays ignored.
    pub(super) fn catch(resumable: bool) {
        RESUMABLE.store(resumable, Ordering::Relaxed);
        for sig in SIGNALS {
            // SAFETY: installs a handler that makes only async-signal-safe calls.
            let before = unsafe { libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
            if before == libc::SIG_IGN {
                // SAFETY: restores the disposition the process was started with.
                unsafe { libc::signal(sig, libc::SIG_IGN) };
            }
        }
    }

    /// Back to dying of the signal without a word (an ignored signal stays ignored).
    pub(super) fn release() {
        for sig in SIGNALS {
            // SAFETY: reads and sets the disposition; no handler of ours stays behind.
            unsafe {
                let before = libc::signal(sig, libc::SIG_DFL);
                if before == libc::SIG_IGN {
                    libc::signal(sig, libc::SIG_IGN);
                }
            }
        }
    }
}
