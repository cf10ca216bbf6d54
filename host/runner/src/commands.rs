//! The commands behind the CLI. Each builds a [`Table`] for people and a serialisable value
//! for machines, and hands both to [`emit`].

use std::io::IsTerminal;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::json;

use runner::plugin::{self, Kind, Limits, PluginInfo};
use runner::report::{self, OutputFormat, Table, si};


use crate::{BenchCommand, Global, PluginsCommand};

pub mod explore;
pub mod prices;
pub mod project;

/// Print in the chosen format; also write to --output when given.
pub fn emit<T: Serialize>(global: &Global, table: &Table, value: &T) -> Result<()> {
    emit_page(global, table, value, None)
}

/// [`emit`], with `page` building the HTML rendering instead of the table's (a page with
/// charts), only when HTML is asked for.
pub fn emit_page<T: Serialize>(global: &Global, table: &Table, value: &T, page: Option<&dyn Fn() -> String>) -> Result<()> {
    let render = |format: OutputFormat| match (format, page) {
        (OutputFormat::Html, Some(p)) => p(),
        _ => report::render(format, table, value),
    };
    emit_rendered(global, &render)
}

/// [`emit`], with `csv` for the CSV instead of the table: the table's cells are rounded
/// and carry units for people, a CSV is for scripts (raw figures under the JSON's names,
/// [`report::records`]). The table's notes follow as `#` lines when `csv` has none.
pub fn emit_csv<T: Serialize>(global: &Global, table: &Table, value: &T, csv: &Table) -> Result<()> {
    emit_rendered(global, &|f| match f {
        OutputFormat::Csv if csv.notes.is_empty() => Table { notes: table.notes.clone(), ..csv.clone() }.csv(),
        OutputFormat::Csv => csv.csv(),
        f => report::render(f, table, value),
    })
}

/// Print `render`'s output in the chosen format, after writing --output when given.
pub fn emit_rendered(global: &Global, render: &dyn Fn(OutputFormat) -> String) -> Result<()> {
    write_output(global, render)?;
    print_stdout(&render(stdout_format(global)))
}

/// The format printed on stdout: --format, or the table when -o is given, since the file
/// then takes --format (`--format html -o r.html` put 85 KB of HTML on the terminal beside
/// the file that held it). Results go to the terminal as tables, to files as JSON, CSV and
/// HTML; `--format json` without -o still prints JSON for a pipe.
pub fn stdout_format(global: &Global) -> OutputFormat {
    match &global.output {
        Some(_) => OutputFormat::Table,
        None => global.format.unwrap_or(OutputFormat::Table),
    }
}

/// Print a command's result on stdout. The `-o` file is written first ([`write_output`]),
/// so a stdout that fails loses nothing. A closed pipe (`runner ... | head`) ends quietly,
/// as `head` users expect; any other failure (`>/dev/full`) is an error, never a panic.
///
/// # Errors
/// Stdout cannot be written (but for a closed pipe).
pub fn print_stdout(text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(anyhow::anyhow!("cannot write the result to stdout: {e}")),
    }
}

/// Write `render`'s output to --output when given, in --format or else the format the
/// file's extension names (.json, .csv, .html, in any case; a table for .txt or none;
/// another is refused before the command runs, [`unknown_output_extension`]).
pub fn write_output(global: &Global, render: &dyn Fn(OutputFormat) -> String) -> Result<()> {
    if let (Some(path), Some(format)) = (&global.output, output_format(global)) {
        write_atomic(path, render(format).as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
        if !global.quiet {
            // The name as typed may hold a terminal sequence: shown escaped, as errors are.
            elog!("wrote {}", report::visible(&path.display().to_string()));
        }
    }
    Ok(())
}

/// Write `bytes` to `path` whole or not at all: into a temporary file beside it, then
/// renamed over it, so a run stopped mid-write (Ctrl-C, a full disk) or a reader at the
/// same moment never sees half a report, and an older report stays as it was until the
/// new one is complete. A path that is not a regular file (`/dev/stdout`, a FIFO) is
/// written in place; a symbolic link's target is replaced (or created), not the link.
///
/// # Errors
/// The file or its temporary sibling cannot be written or renamed.
pub fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let target = if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        // A link to a file not written yet (`latest.json -> reports/today.json`) is
        // resolved by hand: its target is created, as `>` in a shell would, and the link
        // stays.
        std::fs::canonicalize(path).unwrap_or_else(|_| match std::fs::read_link(path) {
            Ok(to) => match path.parent() {
                Some(dir) => dir.join(to),
                None => to,
            },
            Err(_) => path.to_path_buf(),
        })
    } else {
        path.to_path_buf()
    };
    let existing = std::fs::metadata(&target).ok();
    if existing.as_ref().is_some_and(|m| !m.is_file()) {
        return std::fs::write(&target, bytes);
    }
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = target.file_name().map_or_else(|| "output".into(), |n| n.to_string_lossy().into_owned());
    // A file that may be written in a directory that may not (no room for the
    // temporary sibling) is written in place, as `writable` promised it could be.
    let (tmp, mut f) = match runner::report::create_new_beside(&dir, &name) {
        Ok(made) => made,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && existing.is_some() => return std::fs::write(&target, bytes),
        Err(e) => return Err(e),
    };
    let written = (|| {
        f.write_all(bytes)?;
        f.sync_all()?;
        if let Some(m) = &existing {
            std::fs::set_permissions(&tmp, m.permissions())?;
        }
        std::fs::rename(&tmp, &target)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The format --output is written in (none without --output): --format, else the one
/// the file's extension names, else a table.
pub fn output_format(global: &Global) -> Option<OutputFormat> {
    let path = global.output.as_ref()?;
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    Some(global.format.unwrap_or(match ext.as_deref() {
        Some("json") => OutputFormat::Json,
        Some("csv") => OutputFormat::Csv,
        Some("html" | "htm") => OutputFormat::Html,
        _ => OutputFormat::Table,
    }))
}

/// Why --output cannot be written as asked: an extension that names no format (`-o
/// out.xyz` was written as a table without a word), unless --format names one. A name
/// without an extension is a table. `toml`: the command writes a fitted profile to a
/// .toml name (`runner calibrate`).
pub fn unknown_output_extension(global: &Global, toml: bool) -> Option<String> {
    if global.format.is_some() {
        return None;
    }
    let path = global.output.as_ref()?;
    let ext = path.extension()?.to_string_lossy().to_ascii_lowercase();
    match ext.as_str() {
        "json" | "csv" | "html" | "htm" | "txt" => None,
        "toml" if toml => None,
        _ => Some(format!(
            "-o {}: unknown extension .{}: use .json, .csv, .html or .txt{} (or --format)",
            report::visible(&path.display().to_string()),
            report::visible(&path.extension()?.to_string_lossy()),
            if toml { ", or .toml for the fitted profile" } else { "" }
        )),
    }
}

/// The warning for an --output whose extension names another format than --format asks
/// (`-o x.json --format csv` wrote CSV into x.json without a word): the file still takes
/// --format, but its name will mislead whoever opens it. None when they agree, when the
/// extension names no format, or for calibrate's `.toml` (the fitted profile).
pub fn format_against_extension(global: &Global) -> Option<String> {
    let (path, format) = (global.output.as_ref()?, global.format?);
    let ext = path.extension()?.to_string_lossy().to_ascii_lowercase();
    let named = match ext.as_str() {
        "json" => OutputFormat::Json,
        "csv" => OutputFormat::Csv,
        "html" | "htm" => OutputFormat::Html,
        "txt" => OutputFormat::Table,
        _ => return None,
    };
    let word = |f: OutputFormat| match f {
        OutputFormat::Json => "JSON",
        OutputFormat::Csv => "CSV",
        OutputFormat::Html => "HTML",
        OutputFormat::Table => "a table",
    };
    (named != format).then(|| {
        format!(
            "-o {} is written as {} (--format), not the {} its extension names",
            report::visible(&path.display().to_string()),
            word(format),
            word(named).trim_start_matches("a "),
        )
    })
}

/// Whether `path`, given to -o, is this process's stdout: `-`, or a name for the file
/// descriptor 1 is open on (`/dev/stdout`, `/proc/self/fd/1`, or the file `>` redirected
/// stdout to), compared by device and inode. Such an -o prints the file's format on
/// stdout, once, instead of the table: `-o /dev/stdout --format json` printed the JSON,
/// then the table after it on the same stream.
pub fn is_stdout(path: &std::path::Path) -> bool {
    if path.as_os_str() == "-" {
        return true;
    }
    #[cfg(unix)]
    {
        use std::os::fd::AsFd as _;
        use std::os::unix::fs::MetadataExt as _;
        // fstat of a duplicate of fd 1: std has no fstat on a borrowed descriptor.
        let Ok(fd) = std::io::stdout().as_fd().try_clone_to_owned() else { return false };
        match (std::fs::File::from(fd).metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        false
    }
}

/// A progress line on stderr (never with -q): long commands say what they are doing.
pub fn progress_line(global: &Global, msg: &str) {
    if !global.quiet {
        // Plugin names and other text from outside reach these lines: escaped either way.
        let msg = runner::report::visible(msg);
        if std::io::stderr().is_terminal() {
            let _ = std::io::Write::write_fmt(&mut std::io::stderr(), format_args!("\r\x1b[2K{msg}"));
        } else if !msg.is_empty() {
            // A log (CI, nohup, a pipe) gets a line at most every PROGRESS_EVERY, so a
            // run of minutes is seen to move without a line per step.
            static LAST: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
            let mut last = LAST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if last.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
                *last = Some(std::time::Instant::now());
                elog!("{msg}");
            } else {
                tracing::info!("{msg}");
            }
        }
    }
}

/// How often progress reaches a non-terminal stderr.
const PROGRESS_EVERY: Duration = Duration::from_secs(15);

/// Progress through a known number of steps of unknown length (`runner measure`'s
/// GEMMs: a CPU's lm_head of a full-size vocabulary runs a minute). On a terminal a bar
/// with the elapsed time; on a log the step when it starts, at most every
/// [`PROGRESS_EVERY`], and while one step runs longer the step again with the seconds
/// so far every [`PROGRESS_EVERY`], so the log is never silent longer; nothing with -q.
/// Dropping it clears the bar and ends the log's clock.
pub struct Steps {
    bar: Option<indicatif::ProgressBar>,
    log: Option<(std::sync::Arc<Shared>, std::thread::JoinHandle<()>)>,
}

/// A log's state, and the signal that a step began or the steps ended.
type Shared = (std::sync::Mutex<StepsLog>, std::sync::Condvar);

/// A log's progress: the steps begun, the current one's name and start, the last line's
/// time and the step it named.
struct StepsLog {
    len: usize,
    every: Duration,
    sink: Box<dyn std::io::Write + Send>,
    pos: usize,
    msg: String,
    began: Instant,
    last: Option<Instant>,
    shown: usize,
    done: bool,
}

impl StepsLog {
    /// A line if none was written for `every`: the step, and its seconds so far where
    /// the last line named it already.
    fn line_if_due(&mut self) {
        use std::io::Write as _;
        if self.pos == 0 || self.last.is_some_and(|t| t.elapsed() < self.every) {
            return;
        }
        let (pos, len, msg) = (self.pos, self.len, &self.msg);
        let line = if pos == self.shown { format!("{pos}/{len} {msg} ({} s so far)", self.began.elapsed().as_secs()) } else { format!("{pos}/{len} {msg}") };
        let _ = writeln!(self.sink, "{}", runner::report::visible(&line));
        self.shown = pos;
        self.last = Some(Instant::now());
    }
}

impl Steps {
    pub fn new(global: &Global, len: usize) -> Steps {
        if global.quiet {
            return Steps { bar: None, log: None };
        }
        if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(len as u64);
            if let Ok(style) = indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]") {
                bar.set_style(style);
            }
            // Ticks keep the elapsed time moving through a long step.
            bar.enable_steady_tick(Duration::from_millis(200));
            return Steps { bar: Some(bar), log: None };
        }
        Steps::log(len, PROGRESS_EVERY, Box::new(std::io::stderr()))
    }

    /// The log form, writing to `sink` at most and at least every `every`.
    fn log(len: usize, every: Duration, sink: Box<dyn std::io::Write + Send>) -> Steps {
        let state = StepsLog { len, every, sink, pos: 0, msg: String::new(), began: Instant::now(), last: None, shown: 0, done: false };
        let shared: std::sync::Arc<Shared> = std::sync::Arc::new((std::sync::Mutex::new(state), std::sync::Condvar::new()));
        let clock = {
            let shared = std::sync::Arc::clone(&shared);
            std::thread::spawn(move || {
                let (lock, changed) = &*shared;
                let mut g = lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                while !g.done {
                    g.line_if_due();
                    let wait = g.last.map_or(every, |t| every.saturating_sub(t.elapsed()).max(Duration::from_millis(1)));
                    g = changed.wait_timeout(g, wait).unwrap_or_else(std::sync::PoisonError::into_inner).0;
                }
            })
        };
        Steps { bar: None, log: Some((shared, clock)) }
    }

    /// The next step begins.
    pub fn step(&self, msg: &str) {
        if let Some(bar) = &self.bar {
            if bar.position() > 0 || !bar.message().is_empty() {
                bar.inc(1);
            }
            bar.set_message(runner::report::visible(msg));
        }
        self.log_begins(None, msg);
    }

    /// Step `pos` (from 1) begins, where the caller counts the steps: `runner train`
    /// redoes steps after a rollback.
    pub fn at(&self, pos: usize, msg: &str) {
        if let Some(bar) = &self.bar {
            bar.set_position(pos.saturating_sub(1) as u64);
            bar.set_message(runner::report::visible(msg));
        }
        self.log_begins(Some(pos), msg);
    }

    /// The log's side of a step beginning: step `pos`, or the next.
    fn log_begins(&self, pos: Option<usize>, msg: &str) {
        if let Some((shared, _)) = &self.log {
            let mut g = shared.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            g.pos = pos.unwrap_or(g.pos + 1);
            g.msg = msg.to_string();
            g.began = Instant::now();
            // A step redone is a new step to the clock: its seconds so far count from now.
            g.shown = 0;
            g.line_if_due();
            shared.1.notify_all();
        }
    }
}

impl Drop for Steps {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if let Some((shared, clock)) = self.log.take() {
            shared.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).done = true;
            shared.1.notify_all();
            let _ = clock.join();
        }
    }
}

/// A spinner with `msg` while one long call runs that cannot report its own progress.
pub fn busy(global: &Global, msg: &str) -> Option<indicatif::ProgressBar> {
    let Some(bar) = spinner(global) else {
        // No terminal to spin on: the log says once what the wait is for.
        if !global.quiet {
            elog!("{}...", runner::report::visible(msg));
        }
        return None;
    };
    bar.set_message(runner::report::visible(msg));
    Some(bar)
}

/// A spinner on stderr while a session works (only on a terminal, never with -q).
pub fn spinner(global: &Global) -> Option<indicatif::ProgressBar> {
    if global.quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.enable_steady_tick(Duration::from_millis(100));
    Some(bar)
}

#[derive(Serialize)]
struct ListEntry {
    #[serde(flatten)]
    info: Option<PluginInfo>,
    shadowed: bool,
    error: Option<String>,
}

pub fn plugins(cmd: PluginsCommand, global: &Global) -> Result<()> {
    match cmd {
        PluginsCommand::List => {
            let mut table = Table::new("", &["name", "kind", "contract", "source", "sha256"]);
            let mut entries = Vec::new();
            for (info, shadowed) in plugin::list() {
                match info {
                    Ok(info) => {
                        table.rows.push(vec![
                            info.name.clone(),
                            info.kind.name().into(),
                            if info.contract == plugin::CONTRACT_VERSION {
                                info.contract.clone()
                            } else {
                                format!("{} (adapted)", info.contract)
                            },
                            format!(
                                "{}{}",
                                info.source,
                                if shadowed { " (shadowed)" } else { "" }
                            ),
                            info.sha256.clone(),
                        ]);
                        entries.push(ListEntry {
                            info: Some(info),
                            shadowed,
                            error: None,
                        });
                    }
                    Err(e) => {
                        table.rows.push(vec![
                            e.plugin.clone(),
                            "?".into(),
                            "?".into(),
                            "error".into(),
                            String::new(),
                        ]);
                        table.notes.push(e.to_string());
                        entries.push(ListEntry {
                            info: None,
                            shadowed,
                            error: Some(e.to_string()),
                        });
                    }
                }
            }
            let dirs: Vec<String> = plugin::plugin_dirs()
                .iter()
                .map(|d| d.display().to_string())
                .collect();
            table.notes.push(format!(
                "plugin directories, searched in order before the embedded set: {}",
                dirs.join(", ")
            ));
            // On a terminal a hash's first 12 digits tell plugins apart; CSV and HTML carry
            // it whole, as JSON does (they gave the 12 digits under a column named sha256).
            let mut terminal = table.clone();
            for row in &mut terminal.rows {
                row[4].truncate(12);
            }
            // The CSV: each plugin's fields under the JSON's names, the contract and the
            // source bare (the table's "0.2.0 (adapted)" and "(shadowed)" are columns).
            let rows: Vec<report::Record> = entries
                .iter()
                .map(|e| match &e.info {
                    Some(i) => report::record([("name", json!(i.name)), ("kind", json!(i.kind.name())), ("contract", json!(i.contract)), ("source", json!(i.source.to_string())), ("sha256", json!(i.sha256)), ("bytes", json!(i.bytes)), ("shadows_embedded", json!(i.shadows_embedded)), ("shadowed", json!(e.shadowed)), ("error", json!(e.error))]),
                    None => report::record([("shadowed", json!(e.shadowed)), ("error", json!(e.error))]),
                })
                .collect();
            let mut csv = report::records_of(&rows);
            csv.notes = table.notes.clone();
            emit_rendered(global, &|f| match f {
                OutputFormat::Csv => csv.csv(),
                f => report::render(f, if f == OutputFormat::Table { &terminal } else { &table }, &entries),
            })
        }
        PluginsCommand::Inspect { name } => inspect(&name, global),
        PluginsCommand::Validate { path } => validate(&path, global),
    }
}

fn inspect(name: &str, global: &Global) -> Result<()> {
    let p = plugin::load(name)?;
    let limits = Limits::default();
    let title = format!(
        "{} ({} plugin, contract {}, {}, sha256 {})",
        p.info.name,
        p.info.kind.name(),
        p.info.contract,
        p.info.source,
        p.info.sha256
    );
    match p.info.kind {
        Kind::Workload => {
            let info = p.workload(limits)?.describe()?;
            let mut t = Table::new(
                title,
                &[
                    "variant", "layers", "hidden", "heads", "kv", "vocab", "moe", "seq", "layouts",
                ],
            );
            for v in &info.variants {
                let h = &v.hyper;
                t.rows.push(vec![
                    v.name.clone(),
                    h.layers.to_string(),
                    h.hidden.to_string(),
                    h.heads.to_string(),
                    h.kv_heads.to_string(),
                    h.vocab.to_string(),
                    h.moe
                        .as_ref()
                        .map(|m| format!("{}e top-{}", m.experts, m.top_k))
                        .unwrap_or_else(|| "-".into()),
                    v.defaults.seq_len.to_string(),
                    v.layouts.len().to_string(),
                ]);
            }
            // The CSV: a row per variant, its figures under the JSON's names (the table's
            // "8e top-2" as moe_experts and moe_top_k, layouts counted).
            let rows: Vec<report::Record> = info
                .variants
                .iter()
                .map(|v| {
                    let h = &v.hyper;
                    report::record([("name", json!(v.name)), ("layers", json!(h.layers)), ("hidden", json!(h.hidden)), ("heads", json!(h.heads)), ("kv_heads", json!(h.kv_heads)), ("vocab", json!(h.vocab)), ("moe_experts", json!(h.moe.as_ref().map(|m| m.experts))), ("moe_top_k", json!(h.moe.as_ref().map(|m| m.top_k))), ("seq_len", json!(v.defaults.seq_len)), ("layouts", json!(v.layouts.len()))])
                })
                .collect();
            emit_csv(global, &t, &info, &report::records_of(&rows))
        }
        Kind::Cost => {
            let mut c = p.cost(limits)?;
            let provider = c.provider()?;
            let offerings = c.offerings()?;
            let mut t = Table::new(
                format!("{title}\n{}", provider.display_name),
                &[
                    "instance",
                    "gpu",
                    "gpus/node",
                    "Gbps",
                    "prices",
                    "billing",
                    "effective",
                ],
            );
            // An offering on another node than its GPU's profile is never quoted: said per
            // offering, by the rule explore and prices apply.
            let profiles = runner::project::profiles(global.profile.as_deref())?;
            t.notes.extend(runner::explore::other_node_offering_notes(&offerings, &profiles.gpus));
            for o in &offerings {
                t.rows.push(vec![
                    o.instance.clone(),
                    o.gpu.clone(),
                    o.gpus_per_node.to_string(),
                    format!("{}", o.interconnect_gbps),
                    o.prices.len().to_string(),
                    o.prices.first().map_or(String::new(), |p| {
                        runner::prices::billing(p.billing_increment_s, p.minimum_charge_s)
                    }),
                    o.prices
                        .first()
                        .map_or(String::new(), |p| p.effective_date.clone()),
                ]);
            }
            // The CSV: a row per offering under the JSON's names, the first price's billing
            // as its two numbers (the table's "1 s, min 1 min").
            let rows: Vec<report::Record> = offerings
                .iter()
                .map(|o| {
                    let p = o.prices.first();
                    report::record([("instance", json!(o.instance)), ("gpu", json!(o.gpu)), ("gpus_per_node", json!(o.gpus_per_node)), ("interconnect_gbps", json!(o.interconnect_gbps)), ("prices", json!(o.prices.len())), ("billing_increment_s", json!(p.map(|p| p.billing_increment_s))), ("minimum_charge_s", json!(p.map(|p| p.minimum_charge_s))), ("effective_date", json!(p.map(|p| p.effective_date.clone())))])
                })
                .collect();
            emit_csv(global, &t, &offerings, &report::records_of(&rows))
        }
        Kind::Precision => {
            let name = p.precision(limits)?.name()?;
            // A labelled row: the name alone as a note printed a header of nothing and
            // `note: <name>` (a bare `note: ` for an empty name).
            let mut t = Table::new(title, &["policy name"]);
            t.rows.push(vec![if name.is_empty() { "(empty)".to_string() } else { name.clone() }]);
            emit(
                global,
                &t,
                &serde_json::json!({ "plugin": p.info, "policy": name }),
            )
        }
    }
}

/// Call every export on sample input; report each call's outcome.
fn validate(path: &str, global: &Global) -> Result<()> {
    let p = plugin::load(path)?;
    let limits = Limits::default();
    let mut t = Table::new(
        format!(
            "{}: {} plugin, contract {} ({}), imports allowed",
            p.info.name,
            p.info.kind.name(),
            p.info.contract,
            if p.info.contract == plugin::CONTRACT_VERSION {
                "current"
            } else {
                "adapted to the current one"
            }
        ),
        &["call", "result"],
    );
    let mut failures = 0;
    let mut check = |call: &str, r: Result<String, plugin::PluginError>| match r {
        Ok(s) => t.rows.push(vec![call.into(), format!("ok: {s}")]),
        Err(e) => {
            failures += 1;
            t.rows.push(vec![call.into(), "FAILED".into()]);
            t.notes.push(e.to_string());
        }
    };
    match p.info.kind {
        Kind::Workload => {
            let mut w = p.workload(limits)?;
            let info = w.describe();
            check(
                "describe",
                info.as_ref()
                    .map(|i| format!("{} variant{} of {}", i.variants.len(), if i.variants.len() == 1 { "" } else { "s" }, i.family))
                    .map_err(Clone::clone),
            );
            if let Ok(info) = info {
                for v in &info.variants {
                    let req = plugin::workload::GraphRequest::training(&v.name, 128, 1, 1);
                    check(
                        &format!("graph {} (seq 128, 1 layer)", v.name),
                        w.graph(&req).map(|g| {
                            format!("{} tensors, {} operations", g.tensors.len(), g.ops.len())
                        }),
                    );
                }
            }
        }
        Kind::Cost => {
            let mut c = p.cost(limits)?;
            check("provider", c.provider().map(|p| p.display_name));
            let offerings = c.offerings();
            // An offering on a GPU no profile describes is valid but never quoted.
            let profiles = runner::project::profiles(global.profile.as_deref())?;
            check(
                "offerings",
                offerings
                    .as_ref()
                    .map(|o| {
                        let known: Vec<&str> = profiles.gpus.iter().map(|g| g.name.as_str()).collect();
                        offerings_outcome(o.len(), &runner::pricing::unknown_gpus(o, &profiles.gpus), &known)
                    })
                    .map_err(Clone::clone),
            );
            if let Some(o) = offerings.ok().and_then(|o| o.into_iter().next())
                && let Some(price) = o.prices.first()
            {
                let nodes = plugin::cost::nodes_for(&o, o.gpus_per_node).unwrap_or(1);
                let req = plugin::cost::QuoteRequest {
                    instance: o.instance.clone(),
                    gpus: o.gpus_per_node,
                    start_date: String::new(),
                    nodes,
                    hours: 1.0,
                    region: price.region.clone(),
                    option: price.option,
                    storage_gb_months: 0.0,
                    egress_gb: 0.0,
                };
                check(
                    &format!("quote ({}, 1 hour)", report::plural(nodes, "node")),
                    c.quote(&req)
                        .map(|q| format!("{:.2} {}", q.total, q.currency)),
                );
            }
        }
        Kind::Precision => {
            use plugin::precision::*;
            let mut pp = p.precision(limits)?;
            check("name", pp.name());
            let sites: Vec<GemmSite> = [
                GemmRole::Forward,
                GemmRole::InputGradient,
                GemmRole::WeightGradient,
            ]
            .into_iter()
            .map(|role| GemmSite {
                layer: 0,
                name: "layers.0.mlp.up".into(),
                role,
                m: 4096,
                n: 14336,
                k: 4096,
            })
            .collect();
            // Planned for a B200 (every format native) and for an H100 (no FP4 path), the
            // commonest GPU: a policy that plans NVFP4 everywhere passed on a B200 alone
            // and was then refused on every H100 in a run.
            let plans = ["B200", "H100"].map(|gpu| {
                let plan = pp.plan(&PlanRequest {
                    model: "sample".into(),
                    layers: 1,
                    device: device_capabilities(gpu),
                    sites: sites.clone(),
                    state: Vec::new(),
                });
                let what = if gpu == "B200" { "every format native" } else { "no FP4 tensor cores" };
                let outcome = match &plan {
                    Ok(r) => Ok(r.sites.first().map_or(String::new(), |s| format!("weights in {}", dtype_name(s.weight.format)))),
                    // A policy may decline a GPU (a Blackwell-only recipe on Hopper): its
                    // runs leave that GPU out with its reason. A plan the GPU cannot run
                    // is the policy's bug: every run on it is refused.
                    Err(plugin::PluginError { failure: plugin::Failure::Refused(m), .. }) if gpu != "B200" => {
                        Ok(format!("declines this GPU: {}", runner_contract::text::escape(m, 200)))
                    }
                    Err(e) => Err(e.clone()),
                };
                check(&format!("plan (3 sites, {gpu}: {what})"), outcome);
                plan
            });
            // The step is checked on the B200's plan.
            let [plan, _] = plans;
            let (plan, state) = plan.map(|p| (p.sites, p.state)).unwrap_or_default();
            let metrics = healthy_step(1, plan, state);
            check(
                "on-step",
                pp.on_step(&metrics)
                    .map(|r| format!("{} actions", r.actions.len())),
            );
        }
    }
    emit(
        global,
        &t,
        &serde_json::json!({ "plugin": p.info, "failures": failures }),
    )?;
    if failures > 0 {
        anyhow::bail!("{} failed validation", report::plural(failures, "call"));
    }
    Ok(())
}

/// `plugins validate`'s line for a cost plugin's `offerings`: how many instances, and those
/// on a GPU no profile describes (valid, but never quoted), the first 8 named.
fn offerings_outcome(instances: usize, unknown: &[(&str, &str)], known: &[&str]) -> String {
    if unknown.is_empty() {
        return report::plural(instances, "instance");
    }
    let shown: Vec<String> = unknown.iter().take(8).map(|(i, g)| format!("{i} ({g})")).collect();
    format!(
        "{}, {} never quoted, on GPUs no profile describes: {}{} (an offering's gpu must be one of {}, or an alias)",
        report::plural(instances, "instance"),
        unknown.len(),
        shown.join(", "),
        if unknown.len() > 8 { ", ..." } else { "" },
        known.join(", ")
    )
}

#[derive(Serialize)]
struct ModelRow {
    name: String,
    family: String,
    plugin: String,
    params_total: u64,
    params_active: u64,
    default_seq_len: u32,
    flops_per_token: f64,
}

pub fn models(name: Option<&str>, global: &Global) -> Result<()> {
    use runner_graph::count::{self, AttentionFlops, Convention, Recompute};
    let convention = Convention {
        attention: AttentionFlops::CausalHalved,
        recompute: Recompute::None,
    };
    let limits = Limits::default();
    let mut rows = Vec::new();
    let mut found = Vec::new();
    // Every variant's name, for the error when `name` is none of them (`rows` holds only
    // the one asked for).
    let mut names: Vec<String> = Vec::new();
    let mut used: Vec<PluginInfo> = Vec::new();
    // A plugin that fails is left out with a note: one broken file must not hide the rest.
    let mut skipped: Vec<String> = Vec::new();
    for (path, info, shadowed) in plugin::list_with_files() {
        if shadowed {
            continue;
        }
        let info = match info {
            Ok(info) if info.kind == Kind::Workload => info,
            Ok(_) => continue,
            // A file that fails to load may be a model plugin: left out with its fix.
            Err(e) => {
                skipped.extend(runner::project::Broken::of(path, &e, Kind::Workload).map(|b| format!("left out {}", b.text())));
                continue;
            }
        };
        let spec = match &info.source {
            plugin::Source::Path(p) => p.display().to_string(),
            plugin::Source::Embedded => info.name.clone(),
        };
        let mut list = || -> Result<()> {
            let mut w = plugin::load(&spec)?.workload(limits)?;
            let described = w.describe()?;
            for v in described.variants {
                names.push(v.name.clone());
                if name.is_some_and(|n| n != v.name) {
                    continue;
                }
                let seq = v.defaults.seq_len;
                let graph = w.graph(&plugin::workload::GraphRequest::training(
                    &v.name, seq, 1, 0,
                ))?;
                let params = runner::explore::main_model_params(&mut w, &v)?;
                rows.push(ModelRow {
                    name: v.name.clone(),
                    family: v.family.clone(),
                    plugin: info.name.clone(),
                    params_total: params.total,
                    params_active: params.active,
                    default_seq_len: seq,
                    flops_per_token: count::model_flops_per_step(&graph, &convention) / f64::from(seq),
                });
                found.push(v);
                if used.last().is_none_or(|u| u.sha256 != info.sha256) {
                    used.push(info.clone());
                }
            }
            Ok(())
        };
        if let Err(e) = list() {
            skipped.push(format!("left out {}: {e:#}", info.name));
        }
    }
    let provenance: Vec<String> = used.iter().map(|i| format!("plugin: {}", i.provenance())).chain(skipped.iter().cloned()).collect();
    if let Some(n) = name {
        let Some(v) = found.first() else {
            anyhow::bail!(
                "no installed variant is called '{n}'{}; run `runner models` to list them{}",
                if names.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", names.join(", "))
                },
                skipped.iter().map(|s| format!("\n  {s}")).collect::<String>()
            );
        };
        let r = &rows[0];
        let mut t = Table::new(
            format!("{} ({}, {}): {}", v.name, v.family, r.plugin, v.citation),
            &[
                "layout: gpu",
                "gpus",
                "precision",
                "tp",
                "pp",
                "cp",
                "vp",
                "ep",
                "etp",
                "fsdp",
                "mbs",
                "gbs",
            ],
        );
        for l in &v.layouts {
            t.rows.push(vec![
                l.gpu.clone(),
                format!("{}-{}", l.gpus_min, l.gpus_max),
                plugin::workload::training_precision_name(l.precision).into(),
                l.tp.to_string(),
                l.pp.to_string(),
                l.cp.to_string(),
                l.vp.to_string(),
                l.ep.to_string(),
                l.etp.to_string(),
                l.fsdp.to_string(),
                l.mbs.to_string(),
                match (l.gbs_per_gpu, l.gbs_fixed) {
                    (x, 0) => format!("{x} x GPUs"),
                    (0.0, f) => f.to_string(),
                    (x, f) => format!("{x} x GPUs + {f}"),
                },
            ]);
        }
        t.notes.push(format!(
            "hyperparameters: {}",
            serde_json::to_string(&v.hyper)?
        ));
        t.notes.push(format!(
            "params {} total, {} active; {:.4e} model FLOPs per token at seq {} ({convention})",
            si(r.params_total as f64),
            si(r.params_active as f64),
            r.flops_per_token,
            r.default_seq_len
        ));
        t.notes.extend(provenance);
        // The CSV: a row per layout under the JSON's names (`variant.layouts`), gbs as its
        // two numbers (the table's "2 x GPUs"); the title, which the table's first header
        // carried ("layout: gpu"), is left to the JSON.
        let mut csv = report::records(&v.layouts);
        csv.notes = t.notes.clone();
        return emit_csv(
            global,
            &t,
            &serde_json::json!({ "variant": v, "params_total": r.params_total, "params_active": r.params_active, "flops_per_token": r.flops_per_token }),
            &csv,
        );
    }
    let mut t = Table::new(
        "",
        &[
            "name",
            "family",
            "plugin",
            "params_total",
            "params_active",
            "default_seq_len",
            "flops_per_token",
        ],
    );
    // The CSV's cells are the figures themselves, as JSON's are (a spreadsheet reads
    // 671026404352, not 671.03B); the table shows them rounded.
    let mut csv = t.clone();
    for r in &rows {
        let cells = |params_total: String, params_active: String, flops: String| {
            vec![r.name.clone(), r.family.clone(), r.plugin.clone(), params_total, params_active, r.default_seq_len.to_string(), flops]
        };
        t.rows.push(cells(si(r.params_total as f64), si(r.params_active as f64), format!("{:.3e}", r.flops_per_token)));
        csv.rows.push(cells(r.params_total.to_string(), r.params_active.to_string(), r.flops_per_token.to_string()));
    }
    t.notes.push(format!("flops_per_token: model FLOPs of forward and backward per token at the default sequence length, multi-token-prediction modules included; {convention}"));
    t.notes.push("params: the main model, as published counts give it (multi-token-prediction modules left out); active: routed experts counted at top-k of E".into());
    t.notes.extend(provenance);
    csv.notes = t.notes.clone();
    emit_rendered(global, &|format| match format {
        OutputFormat::Csv => report::render(format, &csv, &rows),
        _ => report::render(format, &t, &rows),
    })
}

#[derive(Serialize)]
struct BenchRow {
    what: String,
    median_us: f64,
    p10_us: f64,
    p90_us: f64,
    samples: usize,
}

fn percentiles(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.1), at(0.9))
}

pub fn bench(cmd: BenchCommand, global: &Global) -> Result<()> {
    match cmd {
        BenchCommand::Gemm { sizes, .. } => {
            if let Some(&bad) = sizes.iter().find(|&&n| n == 0 || n > 16_384) {
                anyhow::bail!("--sizes: {bad} is outside 1..=16384");
            }
            let bar = busy(global, "measuring the FMA peak");
            let peak = runner_exec::bench::peak_gflops();
            // One size at a time, so a 16384-cube (minutes on two cores) says what it is doing.
            let mut rows = Vec::new();
            for (i, &n) in sizes.iter().enumerate() {
                if let Some(b) = &bar {
                    b.set_message(format!("GEMM {}/{}: {n}^3", i + 1, sizes.len()));
                }
                rows.extend(runner_exec::bench::gemm_bench(&[n]));
            }
            bar.inspect(indicatif::ProgressBar::finish_and_clear);
            let mut t = Table::new(
                format!(
                    "f32 GEMM on {} ({} threads)",
                    peak.model,
                    rayon::current_num_threads()
                ),
                &[
                    "M=N=K",
                    "median GFLOP/s",
                    "best GFLOP/s",
                    "median % of theoretical",
                    "peak in window GFLOP/s",
                    "median % of peak (paired)",
                    "best % of window peak",
                ],
            );
            for r in &rows {
                t.rows.push(vec![
                    r.m.to_string(),
                    format!("{:.1}", r.gflops),
                    format!("{:.1}", r.best_gflops),
                    format!("{:.0}%", 100.0 * r.gflops / peak.theoretical_gflops),
                    r.window_peak_gflops
                        .map(|p| format!("{p:.1}"))
                        .unwrap_or_else(|| "n/a".into()),
                    r.paired_fraction_of_peak
                        .map(|f| format!("{:.0}%", 100.0 * f))
                        .unwrap_or_else(|| "n/a".into()),
                    r.window_peak_gflops
                        .map(|p| format!("{:.0}%", 100.0 * r.best_gflops / p))
                        .unwrap_or_else(|| "n/a".into()),
                ]);
            }
            t.notes.push(format!(
                "theoretical peak {:.1} GFLOP/s = {} lanes x 2 (FMA) x {} FMA units x {} CPUs x {:.2} GHz ({}; clock from {})",
                peak.theoretical_gflops, peak.lanes, peak.fma_units, peak.cpus, peak.ghz, peak.isa, peak.clock_source
            ));
            if let Some(m) = peak.measured_fma_gflops {
                t.notes.push(format!(
                    "measured peak {m:.1} GFLOP/s before the sizes: {}",
                    peak.measured_method
                ));
                t.notes.push(
                    "each GEMM sample (>= 50 ms) runs right after a short FMA-loop run; \"% of peak (paired)\" is the median of \
                     GEMM/FMA-loop over those pairs, \"window peak\" the fastest FMA-loop run among them, so a machine whose \
                     speed drifts compares each sample with the peak of the same moment"
                        .into(),
                );
            }
            t.notes.extend(boost_note(&peak, &rows));
            let over: Vec<String> = rows
                .iter()
                .filter(|r| r.paired_fraction_of_peak.is_some_and(|f| f > 1.0) || r.window_peak_gflops.is_some_and(|p| r.best_gflops > p))
                .map(|r| r.m.to_string())
                .collect();
            if !over.is_empty() {
                t.notes.push(format!(
                    "over 100 % at {}: the FMA loop of those moments ran slower than the GEMM beside it (another job took the \
                     cores in between), so those pairs measure the machine's noise, not a GEMM past the chip's peak; rerun on \
                     a quiet machine",
                    over.join(", ")
                ));
            }
            // The CSV: a row per size under the JSON's names (`time.*` in seconds), with the
            // theoretical peak it was compared with (the table's "71%" is gflops over it).
            let csv_rows: Vec<report::Record> = rows
                .iter()
                .map(|r| {
                    let mut fields = report::fields(r);
                    fields.push(("theoretical_gflops".into(), serde_json::json!(peak.theoretical_gflops)));
                    fields
                })
                .collect();
            let mut csv = report::records_of(&csv_rows);
            csv.notes = t.notes.clone();
            csv.notes.push("time.*: seconds per GEMM".into());
            emit_csv(
                global,
                &t,
                &serde_json::json!({ "peak": peak, "gemm": rows }),
                &csv,
            )
        }
        BenchCommand::Quantize { rows, cols } => {
            if rows == 0 || cols == 0 || rows.saturating_mul(cols) > 1 << 28 {
                anyhow::bail!("--rows x --cols: {rows} x {cols} is outside 1..=2^28 elements");
            }
            let bar = busy(global, &format!("quantising a {rows} x {cols} operand under each recipe, 7 passes each"));
            let rows_out = runner_exec::bench::quant_bench(rows, cols, 7);
            bar.inspect(indicatif::ProgressBar::finish_and_clear);
            let mut t = Table::new(
                format!("scaled quantisation of a {rows} x {cols} f32 operand, one thread"),
                &["recipe", "median GB/s", "best GB/s", "G elements/s", "median time"],
            );
            for r in &rows_out {
                t.rows.push(vec![
                    r.recipe.clone(),
                    format!("{:.2}", r.gbps),
                    format!("{:.2}", r.best_gbps),
                    format!("{:.2}", r.gbps / 4.0),
                    format!("{:.2} ms", r.time.median * 1e3),
                ]);
            }
            t.notes.push(
                "GB/s = f32 input bytes read per second on one core (target >= 1 GB/s). Each pass quantises and \
                 dequantises in place with the statistics a GEMM site reports (amax, saturation, underflow, \
                 non-finite), as the executor runs it, on the operand refilled (untimed) before each pass; the last \
                 row writes FP8 codes"
                    .into(),
            );
            let mut csv = report::records(&rows_out);
            csv.notes = t.notes.clone();
            csv.notes.push("time.*: seconds per pass".into());
            emit_csv(global, &t, &rows_out, &csv)
        }
        BenchCommand::Memory => {
            let rows = runner_exec::bench::memory_bench();
            let mut t = Table::new(
                format!(
                    "memory bandwidth ({} threads)",
                    rayon::current_num_threads()
                ),
                &["kernel", "median GB/s", "best GB/s", "bytes per pass"],
            );
            for r in &rows {
                t.rows.push(vec![
                    r.kernel.clone(),
                    format!("{:.1}", r.gbps),
                    format!("{:.1}", r.best_gbps),
                    si(r.bytes as f64),
                ]);
            }
            t.notes.push("STREAM convention: bytes = reads + writes per pass, no write-allocate traffic counted".into());
            let mut csv = report::records(&rows);
            csv.notes = t.notes.clone();
            csv.notes.push("time.*: seconds per pass".into());
            emit_csv(global, &t, &rows, &csv)
        }
        BenchCommand::Search { model, gpu, gpus, precision, repeats } => {
            project::bench_search(&model, &gpu, gpus, &precision, repeats, global)
        }
        BenchCommand::Plugins { calls } => {
            let mut rows = Vec::new();
            let mut push = |what: &str, samples: Vec<f64>| {
                let n = samples.len();
                let (median_us, p10_us, p90_us) = percentiles(samples);
                rows.push(BenchRow {
                    what: what.into(),
                    median_us,
                    p10_us,
                    p90_us,
                    samples: n,
                });
            };
            // Warm the cache once, then time warm loads.
            let spec = plugin::embedded()
                .iter()
                .find(|(_, k, _)| *k == "cost")
                .map(|(n, _, _)| *n)
                .context("no embedded cost plugin to benchmark")?;
            plugin::load(spec)?;
            let loads: Vec<f64> = (0..20)
                .map(|_| {
                    let t = Instant::now();
                    let _ = plugin::load(spec);
                    t.elapsed().as_secs_f64() * 1e6
                })
                .collect();
            push(
                &format!("load {spec} (warm cache: read, hash, deserialize, contract check)"),
                loads,
            );
            let lists: Vec<f64> = (0..5)
                .map(|_| {
                    let t = Instant::now();
                    let _ = plugin::list();
                    t.elapsed().as_secs_f64() * 1e6
                })
                .collect();
            push(
                &format!(
                    "plugins list, in process ({} plugins)",
                    plugin::list().len()
                ),
                lists,
            );
            let p = plugin::load(spec)?;
            let inst: Vec<f64> = (0..50)
                .map(|_| {
                    let t = Instant::now();
                    let mut c = p.cost(Limits::default()).expect("instantiates");
                    let _ = c.provider();
                    t.elapsed().as_secs_f64() * 1e6
                })
                .collect();
            push(
                "instantiate + first call (fresh store, WASI context, instance)",
                inst,
            );
            let mut c = p.cost(Limits::default())?;
            c.provider()?;
            let batch = 100u32;
            let mut per_call = Vec::new();
            for _ in 0..(calls / batch).max(1) {
                let t = Instant::now();
                for _ in 0..batch {
                    let _ = c.provider()?;
                }
                per_call.push(t.elapsed().as_secs_f64() * 1e6 / f64::from(batch));
            }
            push(
                "call provider() -> small record (2 strings), warm instance",
                per_call,
            );
            let req = {
                let offerings = c.offerings()?;
                let o = &offerings[0];
                plugin::cost::QuoteRequest {
                    instance: o.instance.clone(),
                    gpus: 4 * o.gpus_per_node,
                    start_date: String::new(),
                    nodes: plugin::cost::nodes_for(o, 4 * o.gpus_per_node).unwrap_or(4),
                    hours: 10.0,
                    region: o.prices[0].region.clone(),
                    option: o.prices[0].option,
                    storage_gb_months: 0.0,
                    egress_gb: 0.0,
                }
            };
            let mut quotes = Vec::new();
            for _ in 0..(calls / batch / 10).max(1) {
                let t = Instant::now();
                for _ in 0..batch {
                    let _ = c.quote(&req)?;
                }
                quotes.push(t.elapsed().as_secs_f64() * 1e6 / f64::from(batch));
            }
            push("call quote(request) -> itemised quote, validated", quotes);
            let mut t = Table::new(
                "plugin host overhead (microseconds)",
                &["what", "median", "p10", "p90", "samples"],
            );
            for r in &rows {
                t.rows.push(vec![
                    r.what.clone(),
                    format!("{:.2}", r.median_us),
                    format!("{:.2}", r.p10_us),
                    format!("{:.2}", r.p90_us),
                    r.samples.to_string(),
                ]);
            }
            t.notes.push(format!(
                "cache dir: {}",
                plugin::cache_dir()
                    .map(|d| d.display().to_string())
                    .unwrap_or_else(|| "disabled".into())
            ));
            emit_csv(global, &t, &rows, &report::records(&rows))
        }
        other => anyhow::bail!("bench {other:?} runs on a device (device_bench.rs)"),
    }
}

/// Where a GEMM or FMA-loop run beat the "theoretical" peak: a clock read as the current
/// one (no cpufreq in many VMs) is a floor, cores boost past it, and such a run is that,
/// not a GEMM past the chip's peak. Says which clock would give the fastest run.
fn boost_note(peak: &runner_exec::bench::PeakEstimate, rows: &[runner_exec::bench::GemmRow]) -> Option<String> {
    let fastest = rows
        .iter()
        .flat_map(|r| [Some(r.best_gflops), r.window_peak_gflops])
        .chain([peak.measured_fma_gflops])
        .flatten()
        .fold(0.0_f64, f64::max);
    (peak.theoretical_gflops > 0.0 && fastest > 1.01 * peak.theoretical_gflops).then(|| {
        format!(
            "runs reached {fastest:.1} GFLOP/s, above the theoretical {:.1}: the cores ran faster than the {:.2} GHz read from {} \
             ({:.2} GHz would give it), so \"% of theoretical\" overstates; the paired columns compare with the measured FMA loop",
            peak.theoretical_gflops,
            peak.ghz,
            peak.clock_source,
            peak.ghz * fastest / peak.theoretical_gflops
        )
    })
}

#[cfg(test)]
mod tests {
    use super::write_atomic;

    /// A run past the theoretical peak of a clock read as the current one is explained
    /// with the clock that would give it; runs under it get no note.
    #[test]
    fn runs_past_the_theoretical_peak_name_the_clock_that_gives_them() {
        use runner_exec::bench::{GemmRow, PeakEstimate};
        let peak = PeakEstimate {
            model: "AMD EPYC".into(),
            isa: "avx512".into(),
            lanes: 16,
            fma_units: 2,
            cpus: 2,
            ghz: 2.6,
            clock_source: "/proc/cpuinfo cpu MHz (current clock; no cpufreq)".into(),
            theoretical_gflops: 332.8,
            measured_fma_gflops: Some(300.0),
            measured_method: String::new(),
        };
        let row = |best: f64, window: f64| GemmRow {
            m: 1024,
            n: 1024,
            k: 1024,
            threads: 2,
            time: runner_exec::timing::Stat::of(&[0.01]),
            gflops: best * 0.9,
            best_gflops: best,
            window_peak_gflops: Some(window),
            paired_fraction_of_peak: Some(0.9),
        };
        assert_eq!(super::boost_note(&peak, &[row(250.0, 320.0)]), None);
        let note = super::boost_note(&peak, &[row(250.0, 320.0), row(359.4, 534.0)]).unwrap();
        assert!(note.starts_with("runs reached 534.0 GFLOP/s, above the theoretical 332.8") && note.contains("(4.17 GHz would give it)"), "{note}");
    }
    use runner::report::OutputFormat;

    /// A log kept in memory.
    #[derive(Clone, Default)]
    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A log hears of a step when it starts and, while it runs, every interval: a step
    /// longer than the interval is never silent (`runner measure` printed nothing for the
    /// 65 s of one CPU GEMM), and steps quicker than it are not each printed.
    #[test]
    fn a_log_hears_of_a_long_step_every_interval() {
        let sink = Sink::default();
        let every = std::time::Duration::from_millis(200);
        let steps = super::Steps::log(3, every, Box::new(sink.clone()));
        steps.step("quick");
        steps.step("long");
        std::thread::sleep(every * 7 / 2);
        steps.step("last");
        drop(steps);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.first(), Some(&"1/3 quick"), "{text}");
        // "2/3 long" at 200 ms, then "(0 s so far)" at 400 and 600 (fewer on a loaded machine).
        let long = lines.iter().filter(|l| l.starts_with("2/3 long")).count();
        assert!((2..=4).contains(&long), "the long step, about every 200 ms of its 700: {text}");
        assert!(lines.iter().any(|l| l.contains("long (0 s so far)")), "{text}");
        assert!(lines.len() <= 5, "steps quicker than the interval are not each printed: {text}");
    }

    /// A step the caller numbers (`runner train` redoes one after a rollback) is logged
    /// as it begins, and a step redone starts its seconds so far again.
    #[test]
    fn a_log_hears_of_steps_numbered_by_the_caller() {
        let sink = Sink::default();
        let every = std::time::Duration::from_millis(200);
        let steps = super::Steps::log(4, every, Box::new(sink.clone()));
        steps.at(1, "first");
        std::thread::sleep(every * 3 / 2);
        steps.at(1, "again");
        std::thread::sleep(every * 3 / 2);
        drop(steps);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.first(), Some(&"1/4 first"), "{text}");
        assert!(lines.contains(&"1/4 first (0 s so far)"), "{text}");
        // The redone step is named afresh before its seconds so far.
        let again = lines.iter().position(|l| l.starts_with("1/4 again")).unwrap_or_else(|| panic!("{text}"));
        assert_eq!(lines[again], "1/4 again", "{text}");
    }

    /// A terminal's bar shows text from outside (a plugin's model or op name) with its
    /// control characters escaped, as the log does: an ESC in a name cleared the screen
    /// or retitled the terminal.
    #[test]
    fn a_bar_shows_control_characters_escaped() {
        let bar = indicatif::ProgressBar::hidden();
        let steps = super::Steps { bar: Some(bar.clone()), log: None };
        steps.step("llama\u{1b}[2J");
        assert_eq!(bar.message(), "llama\\u{1b}[2J");
        steps.at(2, "op\u{7}\u{202e}");
        assert_eq!(bar.message(), "op\\u{7}\\u{202e}");
    }

    /// The report replaces the old one whole, keeps its permissions, leaves no temporary
    /// file behind, writes through a symbolic link to its target (created when it is not
    /// there yet), and writes a non-file (`/dev/null`) in place.
    #[test]
    fn reports_are_written_whole_through_a_rename() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::Builder::new().prefix("runner-atomic-").tempdir().unwrap();
        let dir = tmp.path();
        let f = dir.join("r.json");
        std::fs::write(&f, "old, and longer than the new one").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_atomic(&f, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "new");
        assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o640);
        let link = dir.join("link.json");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        write_atomic(&link, b"via link").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "via link");
        let names: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        // A link to a file not there yet: the file is created, the link kept.
        let dangling = dir.join("latest.json");
        std::os::unix::fs::symlink("sub/today.json", &dangling).unwrap();
        assert!(write_atomic(&dangling, b"x").is_err(), "no sub/: as a shell's > fails");
        std::fs::create_dir(dir.join("sub")).unwrap();
        write_atomic(&dangling, b"today").unwrap();
        assert!(std::fs::symlink_metadata(&dangling).unwrap().file_type().is_symlink(), "the link is kept");
        assert_eq!(std::fs::read_to_string(dir.join("sub/today.json")).unwrap(), "today");
        assert!(write_atomic(&dir.join("missing/r.json"), b"x").is_err());
    }

    /// A symbolic link planted at the temporary name the report used to be written to
    /// (`.r.json.{pid}.tmp`, guessable) is not followed: its target keeps its content, the
    /// report lands in r.json, a regular file, and the planted link is left alone. Kills:
    /// the temporary file named from the pid alone, or opened with `File::create` (which
    /// follows the link and truncates its target).
    #[test]
    fn a_link_planted_at_the_temporary_name_is_not_followed() {
        let tmp = tempfile::Builder::new().prefix("runner-planted-").tempdir().unwrap();
        let dir = tmp.path();
        let victim = dir.join("victim.txt");
        std::fs::write(&victim, "precious").unwrap();
        let planted = dir.join(format!(".r.json.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let out = dir.join("r.json");
        write_atomic(&out, b"the report").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(std::fs::symlink_metadata(&out).unwrap().file_type().is_file(), "r.json is the planted link");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "the report");
        assert!(std::fs::symlink_metadata(&planted).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_dir(dir).unwrap().count(), 3, "no temporary file left");
    }

    /// A named pipe (`-o fifo` read by another program) is written in place: a rename would
    /// put a regular file where the pipe was and leave its reader waiting. (This stands for
    /// every file that is not a regular one, /dev/null included: a test wrote the real
    /// /dev/null through `write_atomic`, and under a mutation that renamed over it, as root,
    /// it replaced the machine's /dev/null with a regular file.)
    #[test]
    fn a_named_pipe_is_written_in_place() {
        use std::os::unix::fs::FileTypeExt as _;
        let tmp = tempfile::Builder::new().prefix("runner-fifo-").tempdir().unwrap();
        let dir = tmp.path();
        let fifo = dir.join("out.json");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        write_atomic(&fifo, b"through the pipe").unwrap();
        // Checked before the join: a rename would leave the reader waiting for ever.
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the pipe was replaced");
        assert_eq!(reader.join().unwrap(), b"through the pipe");
        assert_eq!(std::fs::read_dir(dir).unwrap().count(), 1, "no temporary file left");
    }

    fn global(format: Option<OutputFormat>, output: Option<&str>) -> crate::Global {
        crate::Global { format, output: output.map(std::path::PathBuf::from), quiet: true, no_history: true, ..Default::default() }
    }

    /// -o's format: --format when given, else the extension's (any case; .htm too), else a
    /// table; none without -o.
    #[test]
    fn the_output_format_is_the_flag_else_the_extension() {
        let f = |format, output| super::output_format(&global(format, output));
        assert_eq!(f(None, None), None);
        assert_eq!(f(Some(OutputFormat::Json), None), None);
        assert_eq!(f(None, Some("r.json")), Some(OutputFormat::Json));
        assert_eq!(f(None, Some("R.JSON")), Some(OutputFormat::Json));
        assert_eq!(f(None, Some("r.csv")), Some(OutputFormat::Csv));
        assert_eq!(f(None, Some("r.Csv")), Some(OutputFormat::Csv));
        assert_eq!(f(None, Some("r.html")), Some(OutputFormat::Html));
        assert_eq!(f(None, Some("r.htm")), Some(OutputFormat::Html));
        assert_eq!(f(None, Some("r.txt")), Some(OutputFormat::Table));
        assert_eq!(f(None, Some("report")), Some(OutputFormat::Table));
        assert_eq!(f(Some(OutputFormat::Csv), Some("r.json")), Some(OutputFormat::Csv));
        assert_eq!(f(Some(OutputFormat::Json), Some("r.html")), Some(OutputFormat::Json));
    }

    /// --format against -o's extension warns, naming both; agreeing (any case, .htm), an
    /// extension that names nothing, or no --format says nothing. Kills: the comparison
    /// inverted or dropped, the extension's case kept.
    #[test]
    fn a_format_against_the_extension_is_named() {
        let why = |format, output| super::format_against_extension(&global(format, output));
        assert_eq!(
            why(Some(OutputFormat::Csv), Some("x.json")).as_deref(),
            Some("-o x.json is written as CSV (--format), not the JSON its extension names")
        );
        assert_eq!(
            why(Some(OutputFormat::Json), Some("r.txt")).as_deref(),
            Some("-o r.txt is written as JSON (--format), not the table its extension names")
        );
        assert!(why(Some(OutputFormat::Table), Some("r.HTM")).is_some());
        for (format, ok) in [(OutputFormat::Json, "R.JSON"), (OutputFormat::Html, "r.htm"), (OutputFormat::Table, "r.txt"), (OutputFormat::Csv, "out.xyz"), (OutputFormat::Json, "fit.toml"), (OutputFormat::Csv, "report")] {
            assert_eq!(why(Some(format), Some(ok)), None, "{ok}");
        }
        assert_eq!(why(None, Some("x.json")), None);
        assert_eq!(why(Some(OutputFormat::Csv), None), None);
    }

    /// `-` and a name for the file fd 1 is open on are stdout; another file, a missing one,
    /// are not. (Under `cargo test` fd 1 is whatever the harness gave: compared through
    /// /proc/self/fd/1, which names it whatever it is.) Kills: `-` not recognised, every
    /// existing path taken for stdout.
    #[test]
    fn stdout_is_recognised_by_name_and_by_inode() {
        assert!(super::is_stdout(std::path::Path::new("-")));
        assert!(super::is_stdout(std::path::Path::new("/proc/self/fd/1")));
        let tmp = tempfile::Builder::new().prefix("runner-stdout-").tempdir().unwrap();
        let other = tmp.path().join("r.json");
        std::fs::write(&other, "x").unwrap();
        assert!(!super::is_stdout(&other));
        assert!(!super::is_stdout(&tmp.path().join("missing.json")));
    }

    /// -o with an extension that names no format is refused (it was written as a table
    /// without a word), unless --format names one; .toml only where a profile is written.
    #[test]
    fn an_unknown_output_extension_is_refused() {
        let why = |format, output, toml| super::unknown_output_extension(&global(format, output), toml);
        for ok in ["r.json", "R.CSV", "r.html", "r.htm", "r.txt", "report"] {
            assert_eq!(why(None, Some(ok), false), None, "{ok}");
        }
        assert_eq!(why(None, None, false), None);
        assert_eq!(
            why(None, Some("out.xyz"), false).as_deref(),
            Some("-o out.xyz: unknown extension .xyz: use .json, .csv, .html or .txt (or --format)")
        );
        assert_eq!(why(Some(OutputFormat::Csv), Some("out.xyz"), false), None);
        assert!(why(None, Some("fit.toml"), false).is_some());
        assert_eq!(why(None, Some("fit.toml"), true), None);
    }

    /// Stdout's format: --format without -o; the table with -o, whatever the file takes.
    #[test]
    fn stdout_shows_the_table_when_a_file_takes_the_format() {
        let f = |format, output| super::stdout_format(&global(format, output));
        assert_eq!(f(None, None), OutputFormat::Table);
        assert_eq!(f(Some(OutputFormat::Json), None), OutputFormat::Json);
        assert_eq!(f(Some(OutputFormat::Html), None), OutputFormat::Html);
        assert_eq!(f(Some(OutputFormat::Html), Some("r.html")), OutputFormat::Table);
        assert_eq!(f(Some(OutputFormat::Csv), Some("r")), OutputFormat::Table);
        assert_eq!(f(None, Some("r.json")), OutputFormat::Table);
    }

    /// `bench plugins`' median, p10 and p90: the samples' 6th, 2nd and 10th of 11.
    #[test]
    fn percentiles_are_read_at_their_rank() {
        let v: Vec<f64> = (0..=10).rev().map(f64::from).collect();
        assert_eq!(super::percentiles(v), (5.0, 1.0, 9.0));
        assert_eq!(super::percentiles(vec![7.0]), (7.0, 7.0, 7.0));
    }

    /// `plugins validate` names the first 8 offerings on GPUs no profile describes, and says
    /// when there are more.
    #[test]
    fn offerings_on_unknown_gpus_are_named_up_to_eight() {
        let names: Vec<(String, String)> = (1..=9).map(|i| (format!("i{i}"), format!("G{i}"))).collect();
        let unknown: Vec<(&str, &str)> = names.iter().map(|(i, g)| (i.as_str(), g.as_str())).collect();
        let known = ["H100", "B200"];
        assert_eq!(super::offerings_outcome(12, &[], &known), "12 instances");
        let eight = super::offerings_outcome(12, &unknown[..8], &known);
        assert_eq!(
            eight,
            "12 instances, 8 never quoted, on GPUs no profile describes: i1 (G1), i2 (G2), i3 (G3), i4 (G4), i5 (G5), \
             i6 (G6), i7 (G7), i8 (G8) (an offering's gpu must be one of H100, B200, or an alias)"
        );
        let nine = super::offerings_outcome(12, &unknown, &known);
        assert!(nine.starts_with("12 instances, 9 never quoted, on GPUs no profile describes: i1 (G1), "), "{nine}");
        assert!(nine.contains("i8 (G8), ... (an offering's") && !nine.contains("i9"), "{nine}");
    }
}
