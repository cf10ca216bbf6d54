//! The explorer's outcome for people and machines: a terminal page whose notes wrap at 100
//! columns (one block per GPU type and precision, the two cheapest clouds), a long-format CSV
//! (one line per row and cloud, every figure with its plugin and price row), and a
//! self-contained HTML page with charts (days and cost against GPU count, the sweet spot,
//! the step-time breakdown) and every cloud. JSON is the outcome itself.

use std::fmt::Write as _;

use crate::explore::{Choice, Goal, Outcome, Row, Series};
use crate::pricing::{CloudCost, CloudPrice, rank_clouds};
use crate::report::chart::{self, LineChart, Mark, StackedBars};
use crate::report::{OutputFormat, Table, columns, fit, si, usd, visible};

/// Clouds shown per series in the terminal.
const TERMINAL_CLOUDS: usize = 2;

/// The terminal page's width: notes are wrapped to it.
const WIDTH: usize = 100;

/// `word` cut after `room` terminal columns, at least one character kept (a wide
/// character at the margin goes whole to the next line).
fn cut(word: &str, room: usize) -> (&str, &str) {
    let head = fit(word, room);
    let at = if head.is_empty() { word.chars().next().map_or(0, char::len_utf8) } else { head.len() };
    word.split_at(at)
}

/// `text` after `lead`, wrapped at word boundaries to [`WIDTH`] columns, continuation
/// lines indented by two spaces; a word longer than a line (a catalog path at a commit)
/// is cut at the margin. Control characters print as [`visible`] escapes, as in a table
/// (a note carries the price file's path from the user's run file).
fn wrapped(lead: &str, text: &str) -> String {
    let text = visible(text);
    let mut out = String::new();
    let mut line = lead.to_string();
    let mut fresh = true;
    let mut words: Vec<String> = text.split_whitespace().rev().map(str::to_string).collect();
    while let Some(word) = words.pop() {
        let len = columns(&line);
        let wlen = columns(&word);
        if !fresh && len + 1 + wlen > WIDTH {
            if wlen > WIDTH - 2 && len + 2 < WIDTH {
                // Too long for any line: fill this one and carry the rest.
                let room = WIDTH - len - 1;
                line.push(' ');
                let (head, rest) = cut(&word, room);
                line.push_str(head);
                words.push(rest.to_string());
            } else {
                words.push(word);
            }
            out.push_str(line.trim_end());
            out.push('\n');
            line = "  ".to_string();
            fresh = true;
            continue;
        }
        if !fresh {
            line.push(' ');
        }
        if len + wlen > WIDTH && fresh {
            let room = WIDTH.saturating_sub(len).max(1);
            let (head, rest) = cut(&word, room);
            line.push_str(head);
            words.push(rest.to_string());
            out.push_str(line.trim_end());
            out.push('\n');
            line = "  ".to_string();
            continue;
        }
        line.push_str(&word);
        fresh = false;
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

/// The outcome in `format`.
pub fn render(o: &Outcome, format: OutputFormat) -> String {
    match format {
        OutputFormat::Table => text(o),
        OutputFormat::Csv => csv(o),
        OutputFormat::Html => html(o),
        OutputFormat::Json => serde_json::to_string_pretty(o).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}")) + "\n",
    }
}

fn title(o: &Outcome) -> String {
    let m = &o.model;
    format!(
        "{} ({} params, {} active), {} tokens at seq {}",
        m.variant,
        si(m.params_total as f64),
        si(m.params_active as f64),
        si(m.tokens),
        m.seq_len
    )
}

/// The layout without micro-batch (in the files) and global batch (its own column): it
/// keeps the terminal table narrow.
fn layout_cell(r: &Row) -> String {
    match &r.projection {
        Some(p) => p
            .layout
            .compact()
            .split(' ')
            .filter(|t| !t.starts_with("MBS") && !t.starts_with("GBS"))
            .collect::<Vec<_>>()
            .join(" "),
        // As search's table: a count no layout divides is not one memory rules out (the
        // notes say which it was).
        None if r.undivided() => "no valid layout".into(),
        None => "nothing fits".into(),
    }
}

/// A cost cell: the amount, '+' when it leaves storage out (the run costs more), '!' when
/// the price is caveated (lower bound, resale, suspect).
fn cost_cell(c: &CloudPrice) -> String {
    match c {
        CloudPrice::Quoted(q) => {
            let storage = if q.storage_not_costed { "+" } else { "" };
            let caveat = if q.caveats.is_empty() { "" } else { "!" };
            format!("{}{storage}{caveat}", usd(q.usd))
        }
        CloudPrice::NotSold => "n/a".into(),
        CloudPrice::QuoteFailed { .. } => "failed".into(),
    }
}

/// The clouds of a series cheapest first at its sweet spot (else its first priced row),
/// clean prices before caveated ones, then clouds whose quotes failed (a failure must show, not vanish); clouds that do not
/// sell the GPU are left out.
fn ranked_clouds(s: &Series) -> Vec<usize> {
    let Some(first) = s.rows.first() else { return Vec::new() };
    let anchor = s.rows.iter().find(|r| r.sweet).or_else(|| s.rows.iter().find(|r| r.cheapest.is_some()));
    let priced = |i: usize| s.rows.iter().any(|r| r.costs[i].quote().is_some());
    let failed = |i: usize| s.rows.iter().any(|r| matches!(r.costs[i], CloudPrice::QuoteFailed { .. }));
    let mut idx = rank_clouds((0..first.costs.len()).filter(|&i| priced(i)), |i| anchor.and_then(|a| a.costs[i].quote()));
    idx.extend((0..first.costs.len()).filter(|&i| !priced(i) && failed(i)));
    idx
}

/// Days to a useful precision: 115.5, 3.57, 0.021, 0.00034; the precision is chosen on
/// the figure as rounded, so 9.996 days reads 10.0 as 10 days does, not 10.00.
pub(crate) fn days_cell(d: f64) -> String {
    let reaches = |decimals: usize, at: f64| d >= at || format!("{d:.decimals$}").parse::<f64>().is_ok_and(|x| x >= at);
    if reaches(2, 10.0) {
        format!("{d:.1}")
    } else if reaches(3, 0.1) {
        format!("{d:.2}")
    } else {
        fixed_or_significant(d, 3)
    }
}

/// "4.57 days", "1 day": a figure as printed and its unit, singular only for exactly 1.
pub(crate) fn days_said(figure: &str) -> String {
    if figure == "1" { "1 day".into() } else { format!("{figure} days") }
}

/// `x` with `decimals` decimals, or two significant digits where those would show none
/// (a CPU proxy's 0.0042 s step printed as 0.00).
pub fn fixed_or_significant(x: f64, decimals: usize) -> String {
    let shown = 10f64.powi(-(decimals as i32));
    if x == 0.0 || !x.is_finite() || x.abs() >= shown {
        return format!("{x:.decimals$}");
    }
    let digits = (1 - x.abs().log10().floor() as i32).max(0) as usize;
    format!("{x:.digits$}")
}

/// Longest cloud name a terminal column header shows whole.
const CLOUD_HEADER: usize = 16;

/// A cloud's terminal column header: its name, or one cut short with a visible "~" so a
/// cut name does not pass for another cloud's (the notes and the other formats give it whole).
fn cloud_header(name: &str) -> String {
    if columns(name) <= CLOUD_HEADER {
        return name.to_string();
    }
    format!("{}~", fit(name, CLOUD_HEADER - 1))
}

/// The column of a series whose cheapest quotes are on spot: the days they bill.
const SPOT_DAYS: &str = "spot days";

/// Whether a row's cheapest quote takes other days than the projection (spot).
fn interrupted(s: &Series) -> bool {
    s.rows.iter().any(|r| r.quoted_days() != r.days)
}

/// One series as a table: `clouds` are the columns priced (indices into the row costs).
fn series_table(o: &Outcome, s: &Series, clouds: &[usize], wide: bool) -> Table {
    // The global batch on every page, the terminal's too: by default it grows with the
    // GPUs (docs/EXPLORER.md), and without it a weak-scaling series reads as strong scaling.
    let mut headers: Vec<String> =
        ["GPUs", "layout", "GBS", "step s", "GiB", "days", "speedup", "rel.cost", "tok/s/GPU", "MFU"].iter().map(|h| h.to_string()).collect();
    let spot = interrupted(s);
    if spot {
        headers.insert(6, SPOT_DAYS.to_string());
    }
    headers.extend(clouds.iter().map(|&i| if wide { o.clouds[i].clone() } else { cloud_header(&o.clouds[i]) }));
    let mut t = Table { title: format!("{} - {}", s.label(), s.plan), headers, ..Table::default() };
    for r in &s.rows {
        let mark = if r.sweet { "*" } else { "" };
        let mut row = vec![format!("{}{mark}", r.gpus), layout_cell(r), r.global_batch.to_string()];
        row.push(r.projection.as_ref().map_or("-".into(), |p| fixed_or_significant(p.step_time_s, 2)));
        row.push(r.projection.as_ref().map_or("-".into(), |p| fixed_or_significant(p.memory_per_gpu_gib, 0)));
        match (&r.projection, r.days) {
            (Some(p), Some(days)) => row.extend([days_cell(days)].into_iter().chain(spot.then(|| r.quoted_days().map_or("-".into(), days_cell))).chain([
                r.speedup.map_or("-".into(), |x| format!("{x:.2}x")),
                r.relative_cost.map_or("-".into(), |x| format!("{x:.3}")),
                format!("{:.0}", p.tokens_per_sec_per_gpu),
                format!("{:.1}%", 100.0 * p.mfu),
            ])),
            _ => row.extend(std::iter::repeat_n("-".to_string(), 5 + usize::from(spot))),
        }
        row.extend(clouds.iter().map(|&i| cost_cell(&r.costs[i])));
        t.rows.push(row);
    }
    t
}

fn choice_line(c: &Choice) -> String {
    c.describe()
}

fn goal_lines(o: &Outcome) -> Vec<String> {
    let Some(g) = &o.goal else { return Vec::new() };
    let asked = match g.goal {
        Goal::TargetDays(d) => format!("finish within {} at the lowest cost", days_said(&d.to_string())),
        Goal::Budget(b) => format!("finish soonest for at most {}", usd(b)),
    };
    let mut out = vec![format!("Goal: {asked}")];
    match (&g.best, g.met) {
        (Some(b), true) => out.push(format!("  answer: {}", choice_line(b))),
        (Some(b), false) => {
            out.push(format!("  not met: {}", g.why));
            out.push(format!("  nearest: {}", choice_line(b)));
        }
        (None, _) => out.push(format!("  not met: {}", g.why)),
    }
    for (i, r) in g.runners_up.iter().enumerate() {
        out.push(format!("  runner-up {}: {}", i + 1, choice_line(r)));
    }
    out
}

/// '+' where the cheapest quote of a series' row leaves storage out, as its price cell says.
fn storage_mark(o: &Outcome, gpu: &str, precision: &str, gpus: u32) -> &'static str {
    let rows = o.series.iter().filter(|s| s.gpu.name == gpu && s.precision == precision).flat_map(|s| &s.rows);
    if rows.filter(|r| r.gpus == gpus).any(|r| r.cheapest_cost().is_some_and(|q| q.storage_not_costed)) { "+" } else { "" }
}

/// FP8 (and other low-precision) series against BF16, one table for all.
fn comparison_table(o: &Outcome) -> Option<Table> {
    if o.comparisons.is_empty() {
        return None;
    }
    let mut t = Table::new(
        "Low precision against BF16: days, cheapest quote, share of GEMM FLOPs in the low format",
        &["GPU", "prec", "GPUs", "bf16 days", "days", "speedup", "bf16 cost", "cost", "saving", "coverage"],
    );
    for c in &o.comparisons {
        let saving = match (c.usd_bf16, c.usd) {
            (Some(a), Some(b)) => format!("{:.1}%", 100.0 * (1.0 - b / a)),
            _ => "-".into(),
        };
        t.rows.push(vec![
            c.gpu.clone(),
            c.precision.clone(),
            c.gpus.to_string(),
            days_cell(c.days_bf16),
            days_cell(c.days),
            format!("{:.2}x", c.speedup),
            c.usd_bf16.map_or("-".into(), |u| usd(u) + storage_mark(o, &c.gpu, "bf16", c.gpus)),
            c.usd.map_or("-".into(), |u| usd(u) + storage_mark(o, &c.gpu, &c.precision, c.gpus)),
            saving,
            format!("{:.1}%", 100.0 * c.coverage),
        ]);
    }
    Some(t)
}

/// What '+' after a price means, wherever one is shown.
const STORAGE_LEGEND: &str = "'+' after a price: the cloud lists no storage price, so the quote leaves out the checkpoints and \
     data set other quotes include; the run costs more than shown, and clouds are still ranked on the figures shown";

/// What the spot-days column is, where one is shown.
const SPOT_LEGEND: &str = "days: the projection's, without interruptions; spot days: the wall-clock days the cheapest quote \
     bills, spot interruptions included (the days the sweet spot weighs; a goal weighs each cloud's own)";

/// The legends of the marks and columns a page shows only where they occur.
fn legends(o: &Outcome) -> Vec<&'static str> {
    let unstored = o.series.iter().flat_map(|s| &s.rows).flat_map(|r| &r.costs).filter_map(CloudPrice::quote).any(|q| q.storage_not_costed);
    [(unstored, STORAGE_LEGEND), (o.series.iter().any(interrupted), SPOT_LEGEND)].into_iter().filter(|l| l.0).map(|l| l.1).collect()
}

/// The terminal page.
pub fn text(o: &Outcome) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}\n", visible(&title(o)));
    for s in &o.series {
        let ranked = ranked_clouds(s);
        let mut shown: Vec<usize> = ranked.iter().copied().take(TERMINAL_CLOUDS).collect();
        let mut table = series_table(o, s, &shown, false).render();
        // The page is WIDTH columns: a cloud that would push the table past them is left
        // to the files, as the clouds past TERMINAL_CLOUDS are (the cheapest stays).
        while shown.len() > 1 && table.lines().any(|l| l.chars().count() > WIDTH) {
            shown.pop();
            table = series_table(o, s, &shown, false).render();
        }
        out.push_str(&table);
        out.push_str(&wrapped("sweet spot (*): ", &s.sweet_spot_why));
        if ranked.len() > shown.len() {
            out.push_str(&wrapped(
                "",
                &format!("{} more clouds price {}: every cloud is in --format json, csv or html", ranked.len() - shown.len(), s.gpu.name),
            ));
        }
        out.push('\n');
    }
    if let Some(t) = comparison_table(o) {
        out.push_str(&t.render());
        out.push('\n');
    }
    for line in goal_lines(o) {
        let text = line.trim_start();
        out.push_str(&wrapped(&line[..line.len() - text.len()], text));
    }
    if o.goal.is_some() {
        out.push('\n');
    }
    out.push_str(&wrapped("note: ", &o.sweet_spot_rule));
    out.push_str(&wrapped(
        "note: ",
        "rel.cost is the cheapest quote against the series' first priced row (money, whole nodes and billing \
         included); '!' marks a price its source calls a lower bound, resale or suspect; n/a: the cloud does not sell \
         the GPU; failed: its quotes were refused (see the notes)",
    ));
    for l in legends(o) {
        out.push_str(&wrapped("note: ", l));
    }
    for r in o.series.iter().flat_map(|s| s.rows.iter().filter_map(move |r| r.why_not.as_ref().map(|w| (s, r, w)))) {
        out.push_str(&wrapped("note: ", &format!("{} {} GPUs: {}", r.0.label(), r.1.gpus, r.2)));
    }
    for n in &o.notes {
        out.push_str(&wrapped("note: ", n));
    }
    out
}

/// Long-format CSV: one line per series, GPU count and cloud (a row nothing fits, or no
/// cloud prices, has one line with empty cloud fields); notes as `# ` lines after the data
/// (pandas: `read_csv(f, comment="#")`).
pub fn csv(o: &Outcome) -> String {
    let mut t = Table::new(
        "",
        &[
            "gpu", "precision", "gpus", "requested_gpus", "layout", "global_batch", "step_s", "tokens_per_s_per_gpu",
            "mfu", "memory_gib", "days", "speedup", "relative_cost", "sweet_spot", "cloud", "cheapest", "usd",
            "currency", "instance", "region", "option", "nodes", "run_hours", "billed_hours", "price_date", "price_source",
            "caveats", "storage_not_costed", "cost_plugin", "cost_plugin_sha256", "workload_plugin", "workload_sha256", "plan",
        ],
    );
    let workload = o.plugins.first();
    // Numbers as computed (shortest round-trip form), not as the table rounds them: a
    // tiny model's 0.00004 days must not read 0.0000 in a spreadsheet.
    for s in &o.series {
        for r in &s.rows {
            let p = r.projection.as_ref();
            let base = vec![
                s.gpu.name.clone(),
                s.precision.clone(),
                r.gpus.to_string(),
                r.requested_gpus.to_string(),
                p.map_or(String::new(), |p| p.layout.short()),
                r.global_batch.to_string(),
                p.map_or(String::new(), |p| p.step_time_s.to_string()),
                p.map_or(String::new(), |p| p.tokens_per_sec_per_gpu.to_string()),
                p.map_or(String::new(), |p| p.mfu.to_string()),
                p.map_or(String::new(), |p| p.memory_per_gpu_gib.to_string()),
                r.days.map_or(String::new(), |d| d.to_string()),
                r.speedup.map_or(String::new(), |x| x.to_string()),
                r.relative_cost.map_or(String::new(), |x| x.to_string()),
                r.sweet.to_string(),
            ];
            let tail = [
                workload.map_or(String::new(), |w| w.name.clone()),
                workload.map_or(String::new(), |w| w.sha256.clone()),
                s.plan.clone(),
            ];
            let mut any = false;
            for (i, c) in r.costs.iter().enumerate() {
                let mut line = base.clone();
                line.push(o.clouds[i].clone());
                line.push((r.cheapest == Some(i)).to_string());
                match c {
                    CloudPrice::Quoted(q) => line.extend([
                        q.usd.to_string(),
                        q.currency.clone(),
                        q.instance.clone(),
                        q.region.clone(),
                        q.option.clone(),
                        q.nodes.to_string(),
                        q.hours.to_string(),
                        q.billed_hours.map_or(String::new(), |h| h.to_string()),
                        q.price_date.clone(),
                        q.price_source.clone(),
                        q.caveats.join(";"),
                        q.storage_not_costed.to_string(),
                        q.plugin.clone(),
                        q.plugin_sha256.clone(),
                    ]),
                    CloudPrice::NotSold => {
                        if r.days.is_none() {
                            continue;
                        }
                        line.extend(["not-sold".to_string()].into_iter().chain(std::iter::repeat_n(String::new(), 13)));
                    }
                    CloudPrice::QuoteFailed { reason } => {
                        line.extend(["failed".to_string()].into_iter().chain(std::iter::repeat_n(String::new(), 8)));
                        line.extend([String::new(), reason.clone(), String::new(), String::new(), String::new()]);
                    }
                }
                line.extend(tail.iter().cloned());
                t.rows.push(line);
                any = true;
            }
            if !any {
                let mut line = base;
                line.extend(std::iter::repeat_n(String::new(), 16));
                line.extend(tail.iter().cloned());
                t.rows.push(line);
            }
        }
    }
    t.notes.push(o.sweet_spot_rule.clone());
    t.notes.extend(legends(o).into_iter().map(String::from));
    for s in &o.series {
        t.notes.push(format!("{}: sweet spot {}", s.label(), s.sweet_spot_why));
    }
    t.notes.extend(goal_lines(o));
    t.notes.extend(o.notes.iter().cloned());
    t.csv()
}

use crate::report::html_escape as esc;

/// The charts: days and cost against GPU count per series, cost per cloud for each
/// series, and the step-time breakdown of each series.
fn charts(o: &Outcome) -> Vec<String> {
    let mut out = Vec::new();
    let many = o.series.len() > 1;
    let marks = |value: &dyn Fn(&Row) -> Option<f64>| -> Vec<Mark> {
        o.series
            .iter()
            .filter_map(|s| {
                let r = s.rows.iter().find(|r| r.sweet)?;
                Some(Mark { x: f64::from(r.gpus), y: value(r)?, label: if many { format!("sweet spot {}", s.label()) } else { "sweet spot".into() } })
            })
            .collect()
    };
    let line = |s: &Series, value: &dyn Fn(&Row) -> Option<f64>| chart::Series {
        name: s.label(),
        points: s.rows.iter().filter_map(|r| Some((f64::from(r.gpus), value(r)?))).collect(),
        dashed: s.precision == "bf16" && many,
        ..chart::Series::default()
    };
    // As quoted: a spot run is charted on the days it is billed for, as its sweet spot is chosen.
    let days = |r: &Row| r.quoted_days();
    let cost = |r: &Row| r.cheapest_cost().map(|c| c.usd);
    out.push(
        LineChart {
            title: "Days to train against GPU count".into(),
            x_label: "GPUs".into(),
            y_label: "days".into(),
            log_x: true,
            log_y: true,
            series: o.series.iter().map(|s| line(s, &days)).collect(),
            marks: marks(&days),
        }
        .svg(),
    );
    out.push(
        LineChart {
            title: "Cost to train (cheapest quote) against GPU count".into(),
            x_label: "GPUs".into(),
            y_label: "USD".into(),
            log_x: true,
            log_y: false,
            series: o.series.iter().map(|s| line(s, &cost)).collect(),
            marks: marks(&cost),
        }
        .svg(),
    );
    for s in &o.series {
        let clouds = ranked_clouds(s);
        if clouds.len() > 1 {
            out.push(
                LineChart {
                    title: format!("Cost per cloud, {}", s.label()),
                    x_label: "GPUs".into(),
                    y_label: "USD".into(),
                    log_x: true,
                    log_y: false,
                    series: clouds
                        .iter()
                        .take(8)
                        .map(|&i| chart::Series {
                            name: o.clouds[i].clone(),
                            points: s.rows.iter().filter_map(|r| Some((f64::from(r.gpus), r.costs[i].quote()?.usd))).collect(),
                            ..chart::Series::default()
                        })
                        .collect(),
                    marks: Vec::new(),
                }
                .svg(),
            );
        }
        let fitted: Vec<&Row> = s.rows.iter().filter(|r| r.projection.is_some()).collect();
        let part = |f: &dyn Fn(&runner_project::step::Breakdown) -> f64| -> Vec<f64> {
            fitted.iter().map(|r| r.projection.as_ref().map_or(0.0, |p| f(&p.breakdown))).collect()
        };
        out.push(
            StackedBars {
                title: format!("Step time breakdown, {}", s.label()),
                y_label: "seconds per step".into(),
                categories: fitted.iter().map(|r| r.gpus.to_string()).collect(),
                parts: [
                    ("compute".into(), part(&|b| b.compute)),
                    ("recompute".into(), part(&|b| b.recompute)),
                    ("TP comm".into(), part(&|b| b.tp)),
                    ("CP comm".into(), part(&|b| b.cp)),
                    ("EP comm".into(), part(&|b| b.ep)),
                    ("PP comm".into(), part(&|b| b.pp)),
                    ("DP comm".into(), part(&|b| b.dp)),
                    ("bubble".into(), part(&|b| b.bubble)),
                    ("optimizer".into(), part(&|b| b.optimizer)),
                    ("offload".into(), part(&|b| b.offload)),
                    ("stragglers".into(), part(&|b| b.straggler)),
                ]
                .into_iter()
                // Only what takes time somewhere: eight colours, eleven parts.
                .filter(|(_, v): &(String, Vec<f64>)| v.iter().any(|x| *x > 0.0))
                .collect(),
            }
            .svg(),
        );
    }
    out
}

/// An HTML table whose cost cells carry their provenance (plugin, sha256, price row) in
/// a tooltip and a numbered footnote.
fn series_html(o: &Outcome, s: &Series, footnotes: &mut Vec<String>) -> String {
    let clouds = ranked_clouds(s);
    let t = series_table(o, s, &clouds, true);
    let mut out = String::new();
    let _ = write!(out, "<h3>{}</h3>\n<table>\n<tr>", esc(&t.title));
    for h in &t.headers {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr>\n");
    let fixed = t.headers.len() - clouds.len();
    for (row, r) in t.rows.iter().zip(&s.rows) {
        let class = if r.sweet { " class=\"sweet\"" } else { "" };
        let _ = write!(out, "<tr{class}>");
        for (j, cell) in row.iter().enumerate() {
            if j < fixed {
                let _ = write!(out, "<td{}>{}</td>", if j == 1 { "" } else { " class=\"n\"" }, esc(cell));
                continue;
            }
            let i = clouds[j - fixed];
            match &r.costs[i] {
                CloudPrice::Quoted(q) => {
                    let source = format!(
                        "{} sha256 {}; {}; {}, {}; source: {}{}",
                        q.plugin,
                        q.plugin_sha256,
                        q.row(),
                        super::plural(q.nodes, "node"),
                        hours_text(q),
                        q.price_source,
                        if q.caveats.is_empty() { String::new() } else { format!("; caveats: {}", q.caveats.join(", ")) }
                    ) + if q.storage_not_costed { "; storage not costed" } else { "" };
                    let n = match footnotes.iter().position(|f| *f == source) {
                        Some(n) => n + 1,
                        None => {
                            footnotes.push(source.clone());
                            footnotes.len()
                        }
                    };
                    let best = if r.cheapest == Some(i) { " best" } else { "" };
                    let _ = write!(
                        out,
                        "<td class=\"n{best}\" title=\"{}\">{}<sup>{n}</sup></td>",
                        esc(&source),
                        esc(cell)
                    );
                }
                CloudPrice::QuoteFailed { reason } => {
                    let _ = write!(out, "<td class=\"n\" title=\"{}\">failed</td>", esc(reason));
                }
                CloudPrice::NotSold => out.push_str("<td class=\"n\">n/a</td>"),
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
    let _ = writeln!(out, "<p class=\"rule\">Sweet spot (highlighted): {}</p>", esc(&s.sweet_spot_why));
    out
}

/// A quote's hours: the run's as asked (spot: inflated), and the hours billed per node where
/// its compute lines say (increments, minimums, whole days or terms round them up).
fn hours_text(q: &CloudCost) -> String {
    match q.billed_hours {
        Some(b) => format!("{} h run, {} h billed per node", fixed_or_significant(q.hours, 1), fixed_or_significant(b, 1)),
        None => format!("{} h run (the quote does not say the hours billed)", fixed_or_significant(q.hours, 1)),
    }
}

/// Each series' cheapest quote at its sweet spot, line by line: what is a list price and
/// what an estimate, in which currency, from which dated price row.
fn quotes_html(o: &Outcome) -> String {
    let mut out = String::from("<h3>Quotes at the sweet spots, itemised</h3>\n");
    for s in &o.series {
        let Some((r, q)) = s.rows.iter().find(|r| r.sweet).and_then(|r| Some((r, r.cheapest_cost()?))) else { continue };
        let _ = writeln!(
            out,
            "<h4>{} at {} GPUs: {} on {} ({}; {}; {}; {})</h4>",
            esc(&s.label()),
            r.gpus,
            esc(&usd(q.usd)),
            esc(&q.cloud),
            esc(&q.row()),
            super::plural(q.nodes, "node"),
            esc(&hours_text(q)),
            esc(&q.currency)
        );
        let mut t = Table::new("", &["item", "category", "quantity", "unit", "amount", "kind"]);
        for l in &q.lines {
            t.rows.push(vec![
                l.item.clone(),
                l.category.clone(),
                format!("{:.1}", l.quantity),
                l.unit.clone(),
                format!("{:.2} {}", l.amount, q.currency),
                if l.estimate { "estimate".into() } else { "list price".into() },
            ]);
        }
        t.notes.extend(q.warnings.iter().cloned());
        if !q.caveats.is_empty() {
            t.notes.push(format!("the price row is marked {}: no clean price was quoted for this GPU", q.caveats.join(", ")));
        }
        out.push_str(&t.html_fragment());
    }
    out
}

/// The self-contained HTML page: no script, no fonts, no fetches.
pub fn html(o: &Outcome) -> String {
    let mut out = String::new();
    let t = esc(&title(o));
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\n<style>\
         body{{font-family:system-ui,sans-serif;margin:2rem;color:#222;max-width:100rem}}\
         table{{border-collapse:collapse;font-variant-numeric:tabular-nums;margin:.5rem 0 1rem}}\
         th,td{{padding:.25rem .6rem;border-bottom:1px solid #ddd}}th{{background:#f4f4f4;text-align:left}}\
         td.n{{text-align:right}}td.best{{font-weight:bold}}tr.sweet td{{background:#fff3e0}}\
         sup{{color:#888;font-size:.65rem}}.charts{{display:flex;flex-wrap:wrap;gap:1rem}}\
         .goal{{border-left:4px solid #0072B2;padding:.4rem 1rem;background:#f3f8fc}}\
         ol,ul{{color:#555;font-size:.85rem}}p.rule{{color:#555;font-size:.9rem}}</style></head><body>\n<h1>{t}</h1>\n"
    );
    let goal = goal_lines(o);
    if !goal.is_empty() {
        out.push_str("<div class=\"goal\">");
        for l in goal {
            let _ = write!(out, "<p>{}</p>", esc(l.trim()));
        }
        out.push_str("</div>\n");
    }
    out.push_str("<div class=\"charts\">\n");
    for svg in charts(o) {
        out.push_str(&svg);
        out.push('\n');
    }
    out.push_str("</div>\n");
    let mut footnotes = Vec::new();
    for s in &o.series {
        out.push_str(&series_html(o, s, &mut footnotes));
    }
    if let Some(c) = comparison_table(o) {
        out.push_str(&c.html_fragment());
    }
    out.push_str(&quotes_html(o));
    let _ = writeln!(out, "<h3>Where each price came from</h3>\n<ol>");
    for f in &footnotes {
        let _ = writeln!(out, "<li>{}</li>", esc(f));
    }
    out.push_str("</ol>\n<h3>Notes</h3>\n<ul>\n");
    let _ = writeln!(out, "<li>{}</li>", esc(&o.sweet_spot_rule));
    for l in legends(o) {
        let _ = writeln!(out, "<li>{}</li>", esc(l));
    }
    for r in o.series.iter().flat_map(|s| s.rows.iter().filter_map(move |r| r.why_not.as_ref().map(|w| (s, r, w)))) {
        let _ = writeln!(out, "<li>{} {} GPUs: {}</li>", esc(&r.0.label()), r.1.gpus, esc(r.2));
    }
    for n in &o.notes {
        let _ = writeln!(out, "<li>{}</li>", esc(n));
    }
    out.push_str("</ul>\n</body></html>\n");
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::explore::{Comparison, GoalAnswer, ModelSummary};
    use crate::pricing::Assumptions;

    /// A one-node USD quote of `usd` by `cloud`, its price row from `source`.
    pub(crate) fn priced(cloud: &str, usd: f64, caveats: &[&str], source: &str) -> CloudPrice {
        let mut q = crate::pricing::tests::quote(usd, caveats);
        q.cloud = cloud.into();
        q.price_source = source.into();
        CloudPrice::Quoted(q)
    }

    /// A row of `gpus` GPUs that nothing was projected for but `days`, priced `costs`.
    pub(crate) fn row(gpus: u32, days: Option<f64>, costs: Vec<CloudPrice>) -> Row {
        Row { requested_gpus: gpus, gpus, global_batch: gpus, projection: None, why_not: None, days, costs, speedup: None, relative_cost: None, cheapest: None, sweet: false }
    }

    pub(crate) fn outcome(precision: &str, rows: Vec<Row>, clouds: &[&str]) -> Outcome {
        let gpu = runner_project::profile::Profiles::builtin().get("H100").unwrap().clone();
        let series = Series { gpu, precision: precision.into(), plan: precision.into(), low_precision_share: 0.0, rows, sweet_spot: None, sweet_spot_why: "why".into() };
        Outcome {
            model: ModelSummary {
                plugin: "llama3".into(),
                variant: "llama3-8b".into(),
                family: "llama3".into(),
                params_total: 8_000_000_000,
                params_active: 8_000_000_000,
                seq_len: 8192,
                tokens: 1e12,
                flops_per_token: 4.8e10,
                flop_convention: "causal".into(),
            },
            series: vec![series],
            clouds: clouds.iter().map(|c| c.to_string()).collect(),
            measurement: None,
            comparisons: Vec::new(),
            goal: None,
            sweet_spot_rule: "rule".into(),
            assumptions: Assumptions::default(),
            plugins: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Three clouds at 8 GPUs (a clean quote, a cheaper caveated one, a refused one, the
    /// first the cheapest and the sweet spot), and 16 GPUs where nothing fits and no
    /// cloud sells the GPU.
    fn three_clouds(clouds: &[&str]) -> Outcome {
        let mut eight = row(8, Some(10.0), vec![priced(clouds[0], 10.0, &[], "s"), priced(clouds[1], 5.0, &["resale", "suspect"], "s"), CloudPrice::QuoteFailed { reason: "refused".into() }]);
        eight.cheapest = Some(0);
        eight.sweet = true;
        let sixteen = row(16, None, vec![CloudPrice::NotSold, CloudPrice::NotSold, CloudPrice::NotSold]);
        outcome("bf16", vec![eight, sixteen], clouds)
    }

    /// The terminal shows the two best clouds (a caveated price marked '!'), counts the
    /// refused one among the rest, marks the sweet spot, keeps a 16-character name whole
    /// whatever its bytes, numbers the runners-up from 1 and says what FP8 saves.
    #[test]
    fn the_terminal_page_shows_two_clouds_and_counts_the_rest() {
        let mut o = three_clouds(&["zürich-cloud-ünï", "b-cloud", "c-cloud"]);
        let choice = |gpus: u32| crate::explore::Choice { gpu: "H100".into(), precision: "bf16".into(), gpus, layout: "TP8".into(), days: 10.0, days_without_interruptions: None, usd: None, cloud: None, price_row: None, storage_not_costed: false };
        o.goal = Some(GoalAnswer { goal: Goal::Budget(1e6), met: true, best: Some(choice(8)), runners_up: vec![choice(16)], why: String::new() });
        o.comparisons.push(Comparison { gpu: "H100".into(), precision: "fp8".into(), gpus: 8, days_bf16: 10.0, days: 8.0, speedup: 1.25, usd_bf16: Some(100.0), usd: Some(80.0), coverage: 0.9 });
        let page = text(&o);
        // A second cloud would take this table past 100 columns: the cheapest alone.
        assert!(page.contains("zürich-cloud-ünï\n") && !page.contains("b-cloud") && page.contains("$10.00"), "{page}");
        assert!(page.contains("2 more clouds price H100"), "{page}");
        assert!(page.lines().all(|l| l.chars().count() <= 100), "{page}");
        let short = text(&three_clouds(&["a-cloud", "b-cloud", "c-cloud"]));
        assert!(short.contains("a-cloud  b-cloud") && short.contains("$5.00!") && short.contains("1 more clouds price H100"), "{short}");
        assert!(page.contains("\n8*  "), "{page}");
        assert!(page.contains("  runner-up 1: 16 x H100 bf16"), "{page}");
        assert!(page.contains("$80.00   20.0%"), "{page}");
    }

    /// Every CSV line has the header's 33 fields; a row nothing fits that no cloud sells
    /// is one line; the cheapest cloud is flagged; caveats are joined by ';'.
    #[test]
    fn csv_lines_keep_their_columns() {
        let out = csv(&three_clouds(&["a", "b", "c"]));
        let lines: Vec<Vec<&str>> = out.lines().filter(|l| !l.starts_with('#')).map(|l| l.split(',').collect()).collect();
        assert!(lines.iter().all(|l| l.len() == 33), "{out}");
        let field = |gpus: &str, cloud: &str, col: usize| lines.iter().find(|l| l[2] == gpus && l[14] == cloud).map(|l| l[col].to_string());
        assert_eq!(lines.len(), 1 + 3 + 1, "{out}");
        assert_eq!(field("16", "", 16).as_deref(), Some(""), "{out}");
        assert_eq!((field("8", "a", 15), field("8", "b", 15), field("8", "c", 15)), (Some("true".into()), Some("false".into()), Some("false".into())));
        assert_eq!(field("8", "b", 26).as_deref(), Some("resale;suspect"));
        assert_eq!((field("8", "c", 16), field("8", "c", 26)), (Some("failed".into()), Some("refused".into())));
        assert_eq!((field("8", "a", 27), field("8", "c", 27)), (Some("false".into()), Some(String::new())));
    }

    /// A quote that leaves storage out is marked '+' after its price (before a caveat's
    /// '!'), in the CSV as `storage_not_costed` and in the HTML's cell and provenance, with
    /// the legend once; a page with no such quote has neither. Kills: the mark, the
    /// column or the legend dropped.
    #[test]
    fn a_quote_without_storage_is_marked_in_every_format() {
        let plain = three_clouds(&["a", "b", "c"]);
        assert!(!text(&plain).contains("'+' after a price") && !csv(&plain).contains("'+' after a price"));
        let mut o = plain;
        for c in &mut o.series[0].rows[0].costs {
            if let CloudPrice::Quoted(q) = c {
                q.storage_not_costed = true;
            }
        }
        o.comparisons.push(Comparison { gpu: "H100".into(), precision: "fp8".into(), gpus: 8, days_bf16: 10.0, days: 8.0, speedup: 1.25, usd_bf16: Some(10.0), usd: Some(8.0), coverage: 0.9 });
        let page = text(&o);
        assert!(page.contains("$10.00+") && page.contains("$5.00+!"), "{page}");
        // The comparison's BF16 cost is that quote; its FP8 one (no such series here) is not.
        assert!(page.contains("  $10.00+  $8.00   20.0%"), "{page}");
        assert_eq!(page.matches("note: '+' after a price: the cloud lists no storage price").count(), 1, "{page}");
        let out = csv(&o);
        let a = out.lines().find(|l| l.starts_with("H100,bf16,8,") && l.contains(",a,")).unwrap();
        assert_eq!(a.split(',').nth(27), Some("true"), "{out}");
        assert!(out.contains("\n# '+' after a price"), "{out}");
        let page = html(&o);
        assert!(page.contains(">$10.00+<sup>") && page.contains("; storage not costed\""), "{page}");
        assert!(page.contains("<li>&#39;+&#39; after a price") || page.contains("<li>'+' after a price"), "{page}");
    }

    /// A series priced on spot shows the days each row's cheapest quote bills beside the
    /// projection's, with the legend; one on demand has no such column. Kills: the column
    /// showing the projection's days, or shown on demand.
    #[test]
    fn a_spot_series_shows_the_days_its_quotes_bill() {
        let mut o = three_clouds(&["a", "b", "c"]);
        assert!(!text(&o).contains("spot days"));
        if let CloudPrice::Quoted(q) = &mut o.series[0].rows[0].costs[0] {
            (q.option, q.hours) = ("spot".into(), 264.0);
        }
        o.series[0].rows[0].projection = Some(projected(1.0, 0.4, 0.0));
        let page = text(&o);
        let head = page.lines().find(|l| l.starts_with("GPUs")).unwrap();
        assert!(head.contains(" days  spot days  speedup "), "{page}");
        let eight = page.lines().find(|l| l.starts_with("8*")).unwrap();
        assert!(eight.contains(" 10.0       11.0 "), "{page}");
        assert!(page.contains("note: days: the projection's, without interruptions; spot days:"), "{page}");
    }

    /// Plugin-supplied text (a price source, a refusal, a note, the model's name, a goal's
    /// reason) is escaped; one source is one footnote; the cheapest cell is bold; a lone
    /// BF16 series is drawn solid.
    #[test]
    fn the_html_page_escapes_plugin_text_and_numbers_each_source_once() {
        let mut eight = row(8, Some(10.0), vec![priced("a", 10.0, &[], "\"<src>\""), CloudPrice::QuoteFailed { reason: "<refused>".into() }]);
        eight.cheapest = Some(0);
        let sixteen = row(16, Some(6.0), vec![priced("a", 12.0, &[], "\"<src>\""), CloudPrice::NotSold]);
        let mut o = outcome("bf16", vec![eight, sixteen], &["a", "b"]);
        o.model.variant = "<v>".into();
        o.notes.push("<note>".into());
        o.goal = Some(GoalAnswer { goal: Goal::TargetDays(5.0), met: false, best: None, runners_up: Vec::new(), why: "<why>".into() });
        let page = html(&o);
        for raw in ["<src>", "\"<src", "<refused>", "<note>", "<v>", "<why>"] {
            assert!(!page.contains(raw), "{raw}: {page}");
        }
        assert!(page.contains("<title>&lt;v&gt; (8.00B params"), "{page}");
        assert_eq!(page.matches("<sup>1</sup>").count(), 2, "{page}");
        assert!(!page.contains("<sup>2</sup>"), "{page}");
        assert_eq!(page.matches("class=\"n best\"").count(), 1, "{page}");
        let best = page.split("class=\"n best\"").nth(1).unwrap();
        assert!(best.split("</td>").next().unwrap().ends_with(">$10.00<sup>1</sup>"), "the 8-GPU row's quote: {page}");
        assert!(!page.contains("stroke-dasharray"), "{page}");
    }

    #[test]
    fn notes_fill_the_line_to_the_margin_exactly() {
        let fits = format!("a {}", "x".repeat(92));
        assert_eq!(wrapped("note: ", &fits), format!("note: {fits}\n"), "100 columns fit");
        let over = format!("a {}", "x".repeat(99));
        assert_eq!(wrapped("note: ", &over), format!("note: a {}\n  {}\n", "x".repeat(92), "x".repeat(7)));
        assert_eq!(days_cell(10.0), "10.0");
        assert_eq!(days_cell(0.5), "0.50");
        assert_eq!(fixed_or_significant(-12.5, 2), "-12.50");
        assert_eq!(fixed_or_significant(-0.0042, 2), "-0.0042");
    }

    /// Figures too small for their column's decimals keep two significant digits
    /// instead of printing as zero; the rest keep the column's decimals.
    #[test]
    fn small_figures_are_not_printed_as_zero() {
        assert_eq!(fixed_or_significant(0.0042, 2), "0.0042");
        assert_eq!(fixed_or_significant(12.345, 2), "12.35");
        assert_eq!(fixed_or_significant(0.042, 2), "0.04");
        assert_eq!(fixed_or_significant(0.3, 0), "0.30");
        assert_eq!(fixed_or_significant(74.6, 0), "75");
        assert_eq!(fixed_or_significant(0.0, 2), "0.00");
        assert_eq!(days_cell(0.000_34), "0.00034");
        assert_eq!(days_cell(3.571), "3.57");
    }

    #[test]
    fn cloud_headers_keep_names_whole_up_to_sixteen_characters() {
        assert_eq!(cloud_header("hyperstack"), "hyperstack");
        assert_eq!(cloud_header("our-contract.csv"), "our-contract.csv");
        assert_eq!(cloud_header("negotiated-2027-contract"), "negotiated-2027~");
        // Wide characters take two columns: eight of them fill the sixteen.
        assert_eq!(cloud_header("東京クラウド計算"), "東京クラウド計算");
        assert_eq!(cloud_header("東京クラウド計算所"), "東京クラウド計~");
    }

    /// Wide characters (CJK, emoji) take two terminal columns: a note of them wraps
    /// within the margin, and a long run of them is cut without losing one.
    #[test]
    fn notes_of_wide_characters_wrap_by_terminal_columns() {
        let long = "東".repeat(120);
        let out = wrapped("note: ", &format!("価格 {long} 終わり"));
        assert!(out.lines().all(|l| columns(l) <= WIDTH), "{out}");
        assert!(out.lines().any(|l| columns(l) >= WIDTH - 1), "lines are filled: {out}");
        assert_eq!(out.matches('東').count(), 120, "nothing lost: {out}");
    }

    #[test]
    fn notes_wrap_at_the_margin_and_long_words_are_cut() {
        let long = "x".repeat(250);
        let text = format!("a short start {long} and an end that goes on for a while so that it needs a line of its own");
        let out = wrapped("note: ", &text);
        assert!(out.lines().all(|l| columns(l) <= WIDTH), "{out}");
        assert_eq!(out.matches('x').count(), 250, "nothing lost: {out}");
        assert!(out.starts_with("note: a short start x"), "{out}");
        assert!(out.lines().skip(1).all(|l| l.starts_with("  ")), "{out}");
        let joined: String = out.lines().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
        assert!(joined.ends_with("needs a line of its own"), "{joined}");
    }

    /// A projection of `step_s` seconds per step on TP8 MBS1 GBS64, `mfu` of peak, all of
    /// its step compute but `bubble` seconds of pipeline bubble.
    pub(crate) fn projected(step_s: f64, mfu: f64, bubble: f64) -> runner_project::step::Projection {
        use runner_project::step::{Breakdown, Memory};
        let breakdown = Breakdown { compute: step_s - bubble, bubble, ..Breakdown::default() };
        serde_json::from_value(serde_json::json!({
            "layout": {
                "tp": 8, "pp": 1, "cp": 1, "vp": 1, "ep": 1, "etp": 1, "dp": 1, "mbs": 1, "gbs": 64,
                "sequence_parallel": true, "fsdp": false, "recompute": "none", "recompute_layers": 0,
                "distributed_optimizer": true, "tp_overlap": false, "ep_overlap": false, "dp_overlap": false, "grad_fp32": false
            },
            "gpus": 8, "step_time_s": step_s, "tokens_per_sec_per_gpu": 1234.4, "model_tflops_per_gpu": 400.0, "mfu": mfu,
            "memory_per_gpu_gib": 40.2, "fits": true, "memory": serde_json::to_value(Memory::default()).unwrap(),
            "breakdown": serde_json::to_value(breakdown).unwrap(), "micro_batches": 64
        }))
        .unwrap()
    }

    /// A fitted row's figures: the layout without micro-batch and global batch (every
    /// page has a GBS column after it, the terminal's too, F3), speedup to two decimals,
    /// relative cost to three, MFU in per cent; the breakdown chart draws only the parts
    /// that take time. Kills: the MBS/GBS filter dropped, speedup at one decimal, relative
    /// cost at two, MFU not in per cent, no GBS column (terminal or HTML), every breakdown
    /// part drawn.
    #[test]
    fn a_fitted_row_shows_its_layout_and_figures_in_each_format() {
        let mut eight = row(8, Some(12.345), vec![priced("a", 10.0, &[], "s")]);
        eight.projection = Some(projected(2.5, 0.41234, 0.0));
        (eight.speedup, eight.relative_cost, eight.global_batch) = (Some(1.5), Some(1.25), 64);
        let o = outcome("bf16", vec![eight], &["a"]);
        let page = text(&o);
        let line = page.lines().find(|l| l.starts_with("8 ")).unwrap_or_else(|| panic!("{page}"));
        assert!(line.contains("TP8") && !line.contains("MBS") && !line.contains("GBS"), "{line}");
        for cell in ["2.50", "40", "12.3", "1.50x", "1.250", "1234", "41.2%", "$10.00"] {
            assert!(line.split_whitespace().any(|c| c == cell), "{cell}: {line}");
        }
        let header = page.lines().find(|l| l.starts_with("GPUs ")).unwrap_or_else(|| panic!("{page}"));
        let at = |l: &str, w: &str| l.split_whitespace().position(|c| c == w);
        // The layout "TP8 PP1" is two words of the row.
        assert_eq!((at(header, "GBS"), at(line, "64")), (Some(2), Some(3)), "{header}\n{line}");
        let html = html(&o);
        assert!(html.contains("<th>GPUs</th><th>layout</th><th>GBS</th>") && html.contains("<td class=\"n\">64</td>"), "{html}");
        assert!(html.contains(">compute</text>") && !html.contains(">bubble</text>"), "{html}");
    }

    /// The clouds are ranked at the sweet spot, not at the first priced row; a cloud whose
    /// quotes failed shows "failed" in its column; with every priced cloud shown there is
    /// no "more clouds" line. Kills: the anchor ignoring the sweet spot, a failed cell
    /// shown as "n/a", the "more clouds" line when none are left out.
    #[test]
    fn clouds_rank_at_the_sweet_spot_and_a_failed_one_says_so() {
        let eight = row(8, Some(10.0), vec![priced("a", 10.0, &[], "s"), priced("b", 20.0, &[], "s"), CloudPrice::QuoteFailed { reason: "x".into() }]);
        let mut sixteen = row(16, Some(5.0), vec![priced("a", 30.0, &[], "s"), priced("b", 15.0, &[], "s"), CloudPrice::QuoteFailed { reason: "x".into() }]);
        sixteen.sweet = true;
        let o = outcome("bf16", vec![eight, sixteen], &["a", "b", "c"]);
        assert_eq!(ranked_clouds(&o.series[0]), vec![1, 0, 2]);
        let two = outcome("bf16", vec![row(8, Some(10.0), vec![priced("a", 10.0, &[], "s"), CloudPrice::QuoteFailed { reason: "x".into() }])], &["a", "c"]);
        let page = text(&two);
        assert!(page.lines().any(|l| l.starts_with("8 ") && l.ends_with("$10.00  failed")), "{page}");
        assert!(!page.contains("more clouds"), "{page}");
    }

    /// The terminal page gives a goal's nearest answer when it is not met, the reason
    /// nothing fits at a GPU count and the outcome's notes. Kills: each of the three left out.
    #[test]
    fn the_terminal_page_keeps_the_nearest_answer_the_reasons_and_the_notes() {
        let mut o = three_clouds(&["a", "b", "c"]);
        o.series[0].rows[1].why_not = Some("no layout holds 405B".into());
        o.notes.push("plugin: llama3 sha256 00".into());
        let choice = crate::explore::Choice { gpu: "H100".into(), precision: "bf16".into(), gpus: 8, layout: "TP8".into(), days: 10.0, days_without_interruptions: None, usd: None, cloud: None, price_row: None, storage_not_costed: false };
        o.goal = Some(GoalAnswer { goal: Goal::TargetDays(5.0), met: false, best: Some(choice), runners_up: Vec::new(), why: "too slow".into() });
        let page = text(&o);
        assert!(page.contains("  not met: too slow\n  nearest: 8 x H100 bf16 (TP8): 10.0 days, not priced\n"), "{page}");
        assert!(page.contains("note: H100 bf16 16 GPUs: no layout holds 405B\n"), "{page}");
        assert!(page.contains("note: plugin: llama3 sha256 00\n"), "{page}");
        let csv = csv(&o);
        assert!(csv.contains("\n# Goal: finish within 5 days at the lowest cost\n#   not met: too slow\n"), "{csv}");
    }

    /// Text that reaches the terminal page prints control characters as escapes: a note
    /// carrying a price file's path from the user's run file, the model's name, a reason.
    #[test]
    fn the_terminal_page_prints_control_characters_as_escapes() {
        let mut o = three_clouds(&["a", "b", "c"]);
        o.model.variant = "tiny\u{1b}]0;x\u{7}".into();
        o.notes.push("prices of 'ours' read from ours\u{1b}[2J.csv".into());
        o.series[0].rows[1].why_not = Some("bad\u{202e}txt".into());
        o.series[0].sweet_spot_why = "why\u{9b}31m".into();
        let page = text(&o);
        assert!(!page.chars().any(|c| c != '\n' && runner_contract::text::is_unsafe(c)), "{page:?}");
        assert!(page.starts_with("tiny\\u{1b}]0;x\\u{7} (") && page.contains("ours\\u{1b}[2J.csv") && page.contains("bad\\u{202e}txt"), "{page}");
    }

    /// The CSV keeps each figure as computed: 0.00004 days is not 0.00. Kills: days rounded.
    #[test]
    fn csv_figures_are_not_rounded() {
        let out = csv(&outcome("bf16", vec![row(8, Some(0.00004), vec![priced("a", 10.5, &[], "s")])], &["a"]));
        let line = out.lines().nth(1).unwrap();
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!((cells[10], cells[16]), ("0.00004", "10.5"), "{line}");
    }

    /// Two series: each sweet spot's mark names its series, BF16 is dashed against the
    /// other; a series priced by two clouds has a cost-per-cloud chart; the sweet row is
    /// highlighted and only the layout cell is not a number. Kills: the mark's label
    /// without its series, the per-cloud chart only past two clouds, no highlight, the
    /// GPU count's cell taken for text.
    #[test]
    fn the_html_page_marks_each_series_sweet_spot_and_charts_each_cloud() {
        let mut eight = row(8, Some(10.0), vec![priced("a", 10.0, &[], "s"), priced("b", 12.0, &[], "s")]);
        (eight.sweet, eight.cheapest) = (true, Some(0));
        let mut o = outcome("bf16", vec![eight, row(16, Some(6.0), vec![priced("a", 11.0, &[], "s"), priced("b", 13.0, &[], "s")])], &["a", "b"]);
        let mut fp8 = o.series[0].clone();
        fp8.precision = "fp8".into();
        o.series.push(fp8);
        let page = html(&o);
        assert!(page.contains(">sweet spot H100 bf16</text>") && page.contains(">sweet spot H100 fp8</text>"), "{page}");
        assert_eq!(page.matches("Cost per cloud, H100").count(), 4, "a chart per series, each titled twice: {page}");
        assert!(page.contains("<tr class=\"sweet\"><td class=\"n\">8*</td><td>nothing fits</td>"), "{page}");
        assert!(page.contains("<tr><td class=\"n\">16</td><td>nothing fits</td>"), "{page}");
    }

    /// The itemised quote at a sweet spot: the hours billed, each line as a list price or
    /// an estimate, the caveats of its price row, and the cloud's name escaped. Kills: the
    /// billed hours left out, estimate and list price swapped, the caveat note left out,
    /// the cloud's name unescaped.
    #[test]
    fn the_sweet_spot_quote_is_itemised() {
        let line = |item: &str, estimate| crate::pricing::Line { item: item.into(), category: "compute".into(), quantity: 8.0, unit: "gpu-hour".into(), amount: 9.5, estimate };
        let mut q = crate::pricing::tests::quote(19.0, &["resale"]);
        q.cloud = "<c&d>".into();
        (q.hours, q.billed_hours) = (1.5, Some(2.0));
        q.lines = vec![line("gpus", false), line("egress", true)];
        let mut eight = row(8, Some(10.0), vec![CloudPrice::Quoted(q)]);
        (eight.sweet, eight.cheapest) = (true, Some(0));
        let page = html(&outcome("bf16", vec![eight], &["<c&d>"]));
        let quotes = &page[page.find("<h3>Quotes at the sweet spots").unwrap()..];
        assert!(quotes.contains("on &lt;c&amp;d&gt; (") && !page.contains("<c&d>"), "{quotes}");
        assert!(quotes.contains("1.5 h run, 2.0 h billed per node"), "{quotes}");
        assert!(quotes.contains("<td>gpus</td><td>compute</td><td class=\"n\">8.0</td><td>gpu-hour</td><td class=\"n\">9.50 USD</td><td>list price</td>"), "{quotes}");
        assert!(quotes.contains("<td>egress</td>") && quotes.contains("<td>estimate</td>"), "{quotes}");
        assert!(quotes.contains("<li>the price row is marked resale: no clean price was quoted for this GPU</li>"), "{quotes}");
    }

    /// A count no layout divides reads "no valid layout" in the table, one memory rules
    /// out "nothing fits" (both read "nothing fits", the notes saying no layout divided).
    #[test]
    fn a_count_no_layout_divides_is_not_said_to_not_fit() {
        let mut o = three_clouds(&["a", "b", "c"]);
        o.series[0].rows[1].why_not = Some("no layout divides the model and the batch at this GPU count (TP: x)".into());
        assert!(text(&o).lines().any(|l| l.starts_with("16 ") && l.contains(" no valid layout ")), "{}", text(&o));
        o.series[0].rows[1].why_not = Some("nothing fits: the least memory any layout needs is 95 GiB per GPU".into());
        assert!(text(&o).lines().any(|l| l.starts_with("16 ") && l.contains(" nothing fits ")), "{}", text(&o));
    }

    /// Why nothing fits at a GPU count reaches the page escaped. Kills: it unescaped.
    #[test]
    fn the_html_page_escapes_why_nothing_fits() {
        let mut o = three_clouds(&["a", "b", "c"]);
        o.series[0].rows[1].why_not = Some("<b>too big</b>".into());
        let page = html(&o);
        assert!(page.contains("<li>H100 bf16 16 GPUs: &lt;b&gt;too big&lt;/b&gt;</li>") && !page.contains("<b>"), "{page}");
    }

    /// The edges of the figures' formats: 0.1 days has two decimals, 0.01 at two decimals
    /// is 0.01. Kills: `>=` made `>` in `days_cell` and `fixed_or_significant`.
    #[test]
    fn figures_at_their_format_edges() {
        assert_eq!(days_cell(0.1), "0.10");
        // Chosen on the figure as rounded: 10 days and 9.996 days read alike.
        assert_eq!([days_cell(9.996), days_cell(9.994), days_cell(0.09996), days_cell(0.0994)], ["10.0", "9.99", "0.10", "0.099"]);
        assert_eq!(fixed_or_significant(0.01, 2), "0.01");
        assert_eq!(fixed_or_significant(-0.01, 2), "-0.01");
    }

    /// The page is self-contained: no script, no fetched file or style; the only URLs are
    /// the SVG namespace (an identifier, never fetched) and a price source's, as text.
    #[test]
    fn the_html_page_fetches_nothing() {
        let mut eight = row(8, Some(10.0), vec![priced("a", 10.0, &[], "https://aws.amazon.com/ec2/pricing/"), priced("b", 12.0, &[], "s")]);
        (eight.sweet, eight.cheapest) = (true, Some(0));
        eight.projection = Some(projected(2.5, 0.4, 0.5));
        let page = html(&outcome("bf16", vec![eight], &["a", "b"]));
        for fetch in ["<script", "src=", "href=", "url(", "@import", "<link", "<img", "<iframe"] {
            assert!(!page.contains(fetch), "{fetch}: {page}");
        }
        let urls = page.matches("http").count();
        assert_eq!(urls, page.matches("xmlns=\"http://www.w3.org/2000/svg\"").count() + 2, "the price source, in a tooltip and a footnote: {page}");
    }

    /// The terminal page states the budget asked in dollars, the sweet-spot rule and what
    /// rel.cost means, and FP8's coverage in per cent. Kills: the budget unformatted, each
    /// note left out, the coverage not in per cent.
    #[test]
    fn the_terminal_page_states_the_budget_the_rules_and_the_coverage() {
        let mut o = three_clouds(&["a", "b", "c"]);
        o.goal = Some(GoalAnswer { goal: Goal::Budget(1.5e6), met: false, best: None, runners_up: Vec::new(), why: "x".into() });
        o.comparisons.push(Comparison { gpu: "H100".into(), precision: "fp8".into(), gpus: 8, days_bf16: 10.0, days: 8.0, speedup: 1.25, usd_bf16: Some(100.0), usd: Some(80.0), coverage: 0.9 });
        let page = text(&o);
        assert!(page.contains("Goal: finish soonest for at most $1.50M\n"), "{page}");
        assert!(page.contains("\nnote: rule\nnote: rel.cost is the cheapest quote"), "{page}");
        assert!(page.contains(" 20.0%     90.0%\n"), "{page}");
    }

    /// The CSV names each series' sweet spot in its notes and the workload plugin with its
    /// sha256 on every line. Kills: the sweet-spot notes left out, the workload columns empty.
    #[test]
    fn csv_lines_name_the_workload_plugin_and_notes_the_sweet_spots() {
        let mut o = three_clouds(&["a", "b", "c"]);
        let source = crate::plugin::Source::Embedded;
        o.plugins.push(crate::plugin::PluginInfo { name: "llama3".into(), kind: crate::plugin::Kind::Workload, contract: "0.2.0".into(), source, sha256: "ab12".into(), bytes: 1, shadows_embedded: false });
        let out = csv(&o);
        let data: Vec<&str> = out.lines().skip(1).filter(|l| !l.starts_with('#')).collect();
        assert!(!data.is_empty() && data.iter().all(|l| l.ends_with(",llama3,ab12,bf16")), "{out}");
        assert!(out.contains("\n# H100 bf16: sweet spot why\n"), "{out}");
    }

    /// The page: the goal in its box, the sweet spot marked on the days chart and the
    /// cost chart, its reason escaped, the quote's warnings under it, the FP8 comparison.
    /// Kills: the goal box, either mark, the reason unescaped, the warnings and the
    /// comparison table each left out.
    #[test]
    fn the_html_page_has_the_goal_the_marks_the_warnings_and_the_comparison() {
        let mut q = crate::pricing::tests::quote(10.0, &[]);
        q.warnings = vec!["<warn>".into()];
        let mut eight = row(8, Some(10.0), vec![CloudPrice::Quoted(q)]);
        (eight.sweet, eight.cheapest) = (true, Some(0));
        let mut o = outcome("bf16", vec![eight, row(16, Some(6.0), vec![priced("a", 12.0, &[], "s")])], &["a"]);
        o.series[0].sweet_spot_why = "<why>".into();
        o.goal = Some(GoalAnswer { goal: Goal::TargetDays(5.0), met: false, best: None, runners_up: Vec::new(), why: "slow".into() });
        o.comparisons.push(Comparison { gpu: "H100".into(), precision: "fp8".into(), gpus: 8, days_bf16: 10.0, days: 8.0, speedup: 1.25, usd_bf16: Some(100.0), usd: Some(80.0), coverage: 0.9 });
        let page = html(&o);
        assert!(page.contains("<div class=\"goal\"><p>Goal: finish within 5 days at the lowest cost</p><p>not met: slow</p></div>"), "{page}");
        assert_eq!(page.matches("<g class=\"mark\">").count(), 2, "days and cost: {page}");
        assert!(page.contains("<p class=\"rule\">Sweet spot (highlighted): &lt;why&gt;</p>"), "{page}");
        assert!(page.contains("<li>&lt;warn&gt;</li>"), "{page}");
        assert!(page.contains("<h2>Low precision against BF16") && page.contains("<td class=\"n\">90.0%</td>"), "{page}");
    }
}
