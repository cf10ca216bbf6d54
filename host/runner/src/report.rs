//! Output: aligned terminal tables, CSV, JSON and HTML. Every command builds a [`Table`] for
//! people and hands its serialisable value for machines, so the three formats never drift.

use std::fmt::Write as _;

pub mod chart;
pub mod explore;
pub mod validation;

pub use explore::fixed_or_significant;

use serde::Serialize;


/// Output format, as `--format` spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
    Csv,
    /// A self-contained HTML page (no external assets).
    Html,
}

/// A titled table with notes underneath.
#[derive(Clone, Debug, Default)]
pub struct Table {
    pub title: String,
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

impl Table {
    pub fn new(title: impl Into<String>, headers: &[&str]) -> Table {
        Table {
            title: title.into(),
            headers: headers.iter().map(|h| h.to_string()).collect(),
            ..Table::default()
        }
    }

    /// Aligned text: numbers (cells starting with a digit, '$', '+', '-' or '~') right-aligned.
    /// Control characters in any text (a model name from a user's file, a run file's path)
    /// print as visible escapes, never as terminal sequences.
    pub fn render(&self) -> String {
        let cols = self.headers.len();
        let headers: Vec<String> = self.headers.iter().map(|h| visible(h)).collect();
        let rows: Vec<Vec<String>> = self.rows.iter().map(|r| r.iter().map(|c| visible(c)).collect()).collect();
        let mut width: Vec<usize> = headers.iter().map(|h| columns(h)).collect();
        for row in &rows {
            for (i, cell) in row.iter().enumerate().take(cols) {
                width[i] = width[i].max(columns(cell));
            }
        }
        let mut out = String::new();
        if !self.title.is_empty() {
            let _ = writeln!(out, "{}", visible(&self.title));
        }
        let line = |cells: &[String], out: &mut String| {
            let mut parts = Vec::with_capacity(cols);
            for (i, cell) in cells.iter().enumerate().take(cols) {
                let numeric = numeric(cell);
                let pad = width[i] - columns(cell);
                parts.push(if numeric && i > 0 {
                    format!("{}{cell}", " ".repeat(pad))
                } else {
                    format!("{cell}{}", " ".repeat(pad))
                });
            }
            let _ = writeln!(out, "{}", parts.join("  ").trim_end());
        };
        line(&headers, &mut out);
        let _ = writeln!(
            out,
            "{}",
            width
                .iter()
                .map(|w| "-".repeat(*w))
                .collect::<Vec<_>>()
                .join("  ")
        );
        for row in &rows {
            line(row, &mut out);
        }
        for note in &self.notes {
            let _ = writeln!(out, "note: {}", visible(note));
        }
        out
    }

    /// A self-contained HTML page: the title, the table (numbers right-aligned) and the
    /// notes, with inline CSS only, so it can be mailed or archived as one file.
    pub fn html(&self) -> String {
        html_page(self.title.lines().next().unwrap_or("runner report"), &self.html_fragment())
    }

    /// The title, the table and the notes as HTML, for a page of several parts.
    pub fn html_fragment(&self) -> String {
        let mut out = String::new();
        for line in self.title.lines() {
            let _ = writeln!(out, "<h2>{}</h2>", html_escape(line));
        }
        out.push_str("<table>\n<tr>");
        for h in &self.headers {
            let _ = write!(out, "<th>{}</th>", html_escape(h));
        }
        out.push_str("</tr>\n");
        for row in &self.rows {
            out.push_str("<tr>");
            for cell in row {
                let class = if numeric(cell) { " class=\"n\"" } else { "" };
                let _ = write!(out, "<td{class}>{}</td>", html_escape(cell));
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</table>\n<ul>\n");
        for note in &self.notes {
            let _ = writeln!(out, "<li>{}</li>", html_escape(note));
        }
        out.push_str("</ul>\n");
        out
    }

    /// RFC 4180 CSV of the headers and rows, then each note as a `# ` comment line (what
    /// was measured, modelled, and every plugin used with its sha256; readers such as
    /// pandas skip them with `comment='#'`).
    pub fn csv(&self) -> String {
        let mut out = String::new();
        let esc = |s: &str| {
            let mut s = visible(s);
            // A spreadsheet runs a cell that starts with = or @, or with + or - and more
            // than a figure, as a formula: a price file's instance name must not. A figure
            // ("-23.1 %", "+4.2", "-$1.5K", "1.48x") keeps its sign; "-2+3+cmd|'/C calc'!A0"
            // (OWASP's CSV injection), whose sign a digit follows, does not pass for one;
            // nor do "+B1" and "-$E$1", cell references: a figure's letters (a unit, an
            // exponent, the x of a ratio) come after a digit.
            // A number as Rust or JSON writes it ("-1.5e-7", whose exponent has a sign) is
            // a figure too: a script's CSV of raw values keeps its negative small numbers.
            let figure = |rest: &str| {
                let letter = rest.find(|c: char| c.is_ascii_alphabetic());
                (rest.chars().all(|c| c.is_ascii_digit() || " .,%$~xKMBTeE".contains(c))
                    && letter.is_none_or(|l| rest[..l].contains(|c: char| c.is_ascii_digit())))
                    || (rest.starts_with(|c: char| c.is_ascii_digit() || c == '.') && rest.parse::<f64>().is_ok())
            };
            let formula = match s.chars().next() {
                Some('=' | '@') => true,
                Some('+' | '-') => !figure(&s[1..]),
                _ => false,
            };
            if formula {
                s.insert(0, '\'');
            }
            // Quoted: separators, and any # (the notes' comment lines start with one; a
            // reader told comment='#', as pandas, drops the rest of the line from an
            // unquoted # on: a price source's URL#fragment lost its row's other cells).
            if s.contains([',', '"', '\n', '#']) {
                format!("\"{}\"", s.replace('"', "\"\""))
            } else {
                s
            }
        };
        let _ = writeln!(
            out,
            "{}",
            self.headers
                .iter()
                .map(|h| esc(h))
                .collect::<Vec<_>>()
                .join(",")
        );
        for row in &self.rows {
            let _ = writeln!(
                out,
                "{}",
                row.iter().map(|c| esc(c)).collect::<Vec<_>>().join(",")
            );
        }
        for note in &self.notes {
            let _ = writeln!(out, "# {}", visible(&note.replace(['\n', '\r'], " ")));
        }
        out
    }
}

/// One CSV row: (column, value) pairs, in order.
pub type Record = Vec<(String, serde_json::Value)>;

/// A [`Record`] of named values, in the order given (`json!` objects sort their keys).
pub fn record<'a>(pairs: impl IntoIterator<Item = (&'a str, serde_json::Value)>) -> Record {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// `value`'s scalar fields as its JSON has them, in the order its type writes them
/// (serde_json's maps sort their keys: read back from the JSON text instead), a nested
/// object's fields named by their path (`time.median`); a list is one field.
pub fn fields<T: Serialize + ?Sized>(value: &T) -> Record {
    use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
    use serde_json::Value;
    enum Ordered {
        Map(Vec<(String, Ordered)>),
        Leaf,
    }
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Ordered;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Ordered, E> {
            Ok(Ordered::Leaf)
        }
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Ordered, E> {
            Ok(Ordered::Leaf)
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Ordered, E> {
            Ok(Ordered::Leaf)
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Ordered, E> {
            Ok(Ordered::Leaf)
        }
        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Ordered, E> {
            Ok(Ordered::Leaf)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Ordered, E> {
            Ok(Ordered::Leaf)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ordered, A::Error> {
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok(Ordered::Leaf)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
            let mut out = Vec::new();
            while let Some((k, v)) = map.next_entry::<String, Ordered>()? {
                out.push((k, v));
            }
            Ok(Ordered::Map(out))
        }
    }
    impl<'de> Deserialize<'de> for Ordered {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ordered, D::Error> {
            d.deserialize_any(V)
        }
    }
    // The order from the text, each value from `to_value` (serde_json reads a float back
    // from its text a bit off at times: 9.034399032592773 came back ...772).
    fn flatten(path: &str, order: Ordered, exact: &Value, out: &mut Record) {
        match order {
            Ordered::Map(m) => {
                for (k, v) in m {
                    let value = exact.get(&k).unwrap_or(&Value::Null);
                    flatten(&if path.is_empty() { k } else { format!("{path}.{k}") }, v, value, out);
                }
            }
            Ordered::Leaf => out.push((if path.is_empty() { "value".into() } else { path.into() }, exact.clone())),
        }
    }
    let mut out = Vec::new();
    let order = serde_json::to_string(value).ok().and_then(|text| serde_json::from_str::<Ordered>(&text).ok());
    if let (Some(order), Ok(exact)) = (order, serde_json::to_value(value)) {
        flatten("", order, &exact, &mut out);
    }
    out
}

/// A table for CSV of `rows` as their JSON writes them, for scripts: a column per scalar
/// field ([`fields`]: named by its path in the JSON, in the order written), the columns
/// in the order first met; a cell is the JSON's value (a number as JSON writes it, full
/// precision and no unit; a string bare; null, or a field a row lacks, empty; a list as
/// its compact JSON, in one cell). Tables for people round and add units; this is the
/// CSV's source where the table's cells do.
pub fn records<T: Serialize>(rows: &[T]) -> Table {
    records_of(&rows.iter().map(|r| fields(r)).collect::<Vec<_>>())
}

/// [`records`] of rows built field by field ([`record`], [`fields`]).
pub fn records_of(rows: &[Record]) -> Table {
    let mut headers: Vec<String> = Vec::new();
    for (k, _) in rows.iter().flatten() {
        if !headers.contains(k) {
            headers.push(k.clone());
        }
    }
    let cell = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    };
    let rows = rows
        .iter()
        .map(|r| headers.iter().map(|h| r.iter().find(|(k, _)| k == h).map(|(_, v)| cell(v)).unwrap_or_default()).collect())
        .collect();
    Table { headers, rows, ..Table::default() }
}

/// A CSV read back: its header, its rows, its notes.
pub type ParsedCsv = (Vec<String>, Vec<Vec<String>>, Vec<String>);

/// A CSV as [`Table::csv`] writes it, read back: the header, the rows, the notes (the
/// `# ` lines). RFC 4180 quoting, a quoted field may hold line breaks. A row whose cells
/// are not as many as the header's is an error, naming the row. What the tests read the
/// commands' CSVs with, as a script would.
///
/// # Errors
/// No header, a row of another width, a quote left open.
pub fn parse_csv(text: &str) -> Result<ParsedCsv, String> {
    let (mut records, mut notes) = (Vec::new(), Vec::new());
    let (mut record, mut cell, mut quoted, mut start) = (Vec::new(), String::new(), false, true);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if start && !quoted && c == '#' {
            let note: String = std::iter::from_fn(|| chars.next_if(|&c| c != '\n')).collect();
            chars.next();
            notes.push(note.strip_prefix(' ').unwrap_or(&note).to_string());
            continue;
        }
        start = false;
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cell.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => record.push(std::mem::take(&mut cell)),
            '\n' if !quoted => {
                record.push(std::mem::take(&mut cell));
                records.push(std::mem::take(&mut record));
                start = true;
            }
            c => cell.push(c),
        }
    }
    if quoted {
        return Err("a quoted field is not closed".into());
    }
    if !start {
        record.push(cell);
        records.push(record);
    }
    let mut records = records.into_iter();
    let header = records.next().ok_or("no header row")?;
    let rows: Vec<Vec<String>> = records.collect();
    if let Some((i, r)) = rows.iter().enumerate().find(|(_, r)| r.len() != header.len()) {
        return Err(format!("row {} has {} cells, the header {}: {r:?}", i + 1, r.len(), header.len()));
    }
    Ok((header, rows, notes))
}

/// Whether a cell is a figure, right-aligned: it starts with a digit, '$', a sign (an
/// error of "+12.3%" as much as one of "-25.0%") or '~', and is one word, or one and a
/// short unit ("12.3 s"). A sentence that begins with a count ("1 step(s) back to the
/// last known-good checkpoint") is text, left-aligned. So is a name that starts with a
/// digit (Verda's instance "8H100.80S.176V"): a digit after a letter other than an
/// exponent's `e` is no figure's ("1.5e6", "$1.8K", "12.3x" are).
fn numeric(cell: &str) -> bool {
    let mut words = cell.split_whitespace();
    let name = |w: &str| w.as_bytes().windows(2).any(|p| p[0].is_ascii_alphabetic() && !matches!(p[0], b'e' | b'E') && p[1].is_ascii_digit());
    let figure = words.next().is_some_and(|w| w.starts_with(|c: char| c.is_ascii_digit() || matches!(c, '$' | '+' | '-' | '~')) && !name(w));
    figure && words.next().is_none_or(|unit| unit.chars().count() <= 5) && words.next().is_none()
}

/// `x` with its sign and `decimals` places ("+12.3", "-4.0"), and one that rounds to
/// nothing unsigned ("0.0"): `{:+.1}` printed a small negative error as "-0.0".
pub fn signed(x: f64, decimals: usize) -> String {
    let shown = format!("{x:+.decimals$}");
    match shown.strip_prefix(['-', '+']) {
        Some(digits) if digits.bytes().all(|b| b == b'0' || b == b'.') => digits.to_string(),
        _ => shown,
    }
}

/// "1 GPU", "8 GPUs": a count and its noun, plural unless the count is 1.
pub fn plural(n: impl std::fmt::Display, noun: &str) -> String {
    let n = n.to_string();
    format!("{n} {noun}{}", if n == "1" { "" } else { "s" })
}

/// The terminal columns `s` takes: two for a wide character (CJK, most emoji), none for a
/// combining mark. Counting characters instead misaligned a table whose cells held a
/// plugin's CJK instance names.
pub fn columns(s: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(s)
}

/// The terminal columns one character takes (a control character, which [`visible`]
/// escapes before anything is printed, counts none).
pub fn char_columns(c: char) -> usize {
    unicode_width::UnicodeWidthChar::width(c).unwrap_or(0)
}

/// The longest start of `s` that fits in `cols` terminal columns (a wide character that
/// would straddle the edge is left out).
pub fn fit(s: &str, cols: usize) -> &str {
    let mut used = 0;
    for (i, c) in s.char_indices() {
        used += char_columns(c);
        if used > cols {
            return &s[..i];
        }
    }
    s
}

/// The longest end of `s` that fits in `cols` terminal columns.
pub fn fit_end(s: &str, cols: usize) -> &str {
    let mut used = 0;
    for (i, c) in s.char_indices().rev() {
        used += char_columns(c);
        if used > cols {
            return &s[i + c.len_utf8()..];
        }
    }
    s
}

/// `s` with every character that changes how a terminal shows text (ESC, CR, BEL, the
/// bidirectional overrides, ...) or shows as nothing (a zero-width space, a BOM: the
/// contract's `is_invisible`; `--model` "llama3.1-8b" with a zero-width space in it was
/// refused as unknown beside the same-looking known name) written as a visible escape
/// (`\u{1b}`, `\u{200b}`); line breaks kept. The contract's [`escape`] is the one rule, so
/// what a plugin logs reads as this does.
///
/// [`escape`]: runner_contract::text::escape
pub fn visible(s: &str) -> String {
    if !s.chars().any(|c| c != '\n' && runner_contract::text::is_escaped(c)) {
        return s.to_string();
    }
    s.split('\n').map(|line| runner_contract::text::escape(line, usize::MAX)).collect::<Vec<_>>().join("\n")
}

/// Text escaped for HTML, in an element or an attribute of either quote; control
/// characters (a device name with ESC from a measured-ops file) shown as [`visible`]
/// escapes, as on a terminal.
pub fn html_escape(s: &str) -> String {
    visible(s).replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

/// A self-contained page (inline CSS only) around `body`.
pub fn html_page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\n<style>\
         body{{font-family:system-ui,sans-serif;margin:2rem;color:#222}}\
         table{{border-collapse:collapse;font-variant-numeric:tabular-nums}}\
         th,td{{padding:.3rem .7rem;border-bottom:1px solid #ddd}}th{{background:#f4f4f4;text-align:left}}\
         td.n{{text-align:right}}tr:hover td{{background:#fafafa}}\
         ul{{color:#555;font-size:.9rem;max-width:60rem}}</style></head><body>\n{body}</body></html>\n",
        html_escape(title)
    )
}

/// Render `table`/`value` in `format`.
pub fn render<T: Serialize>(format: OutputFormat, table: &Table, value: &T) -> String {
    match format {
        OutputFormat::Table => table.render(),
        OutputFormat::Csv => table.csv(),
        OutputFormat::Html => table.html(),
        OutputFormat::Json => {
            serde_json::to_string_pretty(value)
                .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }).to_string())
                + "\n"
        }
    }
}

/// Whether `path` can be written: its directory exists and takes a new file, and the path
/// is not a directory or a read-only file. Checked before a long run, not after it.
pub fn writable(path: &std::path::Path) -> Result<(), String> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let shown = path.display();
    if !dir.is_dir() {
        return Err(format!("-o {shown}: the directory {} does not exist; create it or write elsewhere", dir.display()));
    }
    if path.is_dir() {
        return Err(format!("-o {shown} is a directory; name a file in it"));
    }
    if path.exists() {
        return std::fs::OpenOptions::new().append(true).open(path).map(drop).map_err(|e| format!("-o {shown} cannot be written: {e}"));
    }
    match create_new_beside(dir, "runner-write-check") {
        Ok((probe, _)) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(format!("-o {shown}: cannot create a file in {}: {e}", dir.display())),
    }
}

/// Create a new file in `dir` named `.{name}.{pid}.{nanos}.{n}.tmp`, for a write that is
/// renamed over its target or a probe removed at once. Opened with `create_new` (O_EXCL):
/// an existing file or a symbolic link planted at the name is refused, never followed or
/// truncated, so anyone who may write to `dir` (a shared results directory, /tmp) cannot
/// make this user's `-o` write into another file; the name, not guessable from the pid
/// alone, is drawn again on a collision, a few times.
///
/// # Errors
/// The file cannot be created (the directory refuses it, or every name drawn was taken).
pub fn create_new_beside(dir: &std::path::Path, name: &str) -> std::io::Result<(std::path::PathBuf, std::fs::File)> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    create_new_named(dir, name, &mut || {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{}.{nanos:08x}.{n}", std::process::id())
    })
}

/// [`create_new_beside`] with the names' varying part drawn by `suffix`.
fn create_new_named(dir: &std::path::Path, name: &str, suffix: &mut dyn FnMut() -> String) -> std::io::Result<(std::path::PathBuf, std::fs::File)> {
    const TRIES: usize = 8;
    let mut last = None;
    for _ in 0..TRIES {
        let path = dir.join(format!(".{name}.{}.tmp", suffix()));
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => return Ok((path, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no temporary name left")))
}

/// Human number with SI suffix: 8.03B, 4.74e14 stays scientific for FLOPs. Rounding that
/// reaches the next unit reads in it, as [`usd`] does: 999.96M parameters are 1.00B, not
/// 1000.0M.
pub fn si(v: f64) -> String {
    let a = v.abs();
    let units = [(1e12, "T", 2), (1e9, "B", 2), (1e6, "M", 1), (1e3, "K", 1), (1.0, "", 0)];
    for (i, &(scale, unit, decimals)) in units.iter().enumerate() {
        let below = |&(s, _, d): &(f64, &str, usize)| format!("{:.d$}", a / s).parse::<f64>().is_ok_and(|x| x >= 1000.0);
        if a >= scale || units.get(i + 1).is_some_and(below) {
            return format!("{:.decimals$}{unit}", v / scale);
        }
    }
    format!("{v:.0}")
}

/// US dollars, rounded to what matters at the scale; "n/a" for a value that is no amount
/// (the host refuses non-finite quotes, so none should reach here: this keeps "$NaN" and
/// "$inf" out of a table if one ever did).
pub fn usd(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    // The largest unit the value still reads at least 1 in once rounded: $999,960 is
    // $1.00M, not $1000.0K.
    let shown = |scale: f64, decimals: usize| format!("{:.decimals$}", v / scale);
    if v >= 1e15 || shown(1e12, 2).parse::<f64>().is_ok_and(|x| x >= 1000.0) {
        return format!("${v:.2e}");
    }
    for (scale, unit, decimals) in [(1e12, "T", 2), (1e9, "B", 2), (1e6, "M", 2), (1e3, "K", 1)] {
        let x = shown(scale, decimals);
        if x.parse::<f64>().is_ok_and(|x| x >= 1.0) {
            return format!("${x}{unit}");
        }
    }
    format!("${v:.2}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A signed figure that rounds to nothing has no sign ("-0.0" was printed for a
    /// validation error of -0.04 %); others keep theirs.
    #[test]
    fn a_signed_figure_rounding_to_zero_is_unsigned() {
        assert_eq!(signed(-0.04, 1), "0.0");
        assert_eq!(signed(0.04, 1), "0.0");
        assert_eq!(signed(-0.0, 2), "0.00");
        assert_eq!(signed(-0.4, 0), "0");
        assert_eq!(signed(-0.05001, 1), "-0.1");
        assert_eq!(signed(12.34, 1), "+12.3");
        assert_eq!(signed(-25.0, 0), "-25");
        assert_eq!(signed(f64::NAN, 1), "NaN");
    }

    #[test]
    fn table_aligns_and_csv_escapes() {
        let mut t = Table::new("T", &["name", "value"]);
        t.rows.push(vec!["a,b".into(), "1".into()]);
        t.rows.push(vec!["long name".into(), "123".into()]);
        let text = t.render();
        assert!(text.contains("long name    123\n"), "{text}");
        assert!(
            text.contains("a,b            1\n"),
            "numbers right-aligned: {text}"
        );
        assert_eq!(t.csv(), "name,value\n\"a,b\",1\nlong name,123\n");
        let html = t.html();
        assert!(
            html.starts_with("<!DOCTYPE html>") && html.contains("<td class=\"n\">123</td>"),
            "{html}"
        );
        t.notes.push("<script>".into());
        assert!(t.html().contains("&lt;script&gt;"), "notes are escaped");
    }

    /// A figure is right-aligned, bare or with a short unit; a sentence that begins with a
    /// count (a training alert's "1 step(s) back to ...") is text, left-aligned.
    #[test]
    fn only_figures_are_numeric() {
        for figure in ["13.46", "$547.7K+", "55.3%", "1.00x", "2048*", "-", "~3", "1e12", "8-16", "+12.3%", "12.3 s"] {
            assert!(numeric(figure), "{figure}");
        }
        for text in ["1 step(s) back to the last known-good checkpoint, 0 batch(es) skipped", "3 layers fall back to BF16", "TP8 PP2", "n/a", ""] {
            assert!(!numeric(text), "{text:?}");
        }
        let mut t = Table::new("", &["step", "event", "detail"]);
        t.rows.push(vec!["7".into(), "rollback".into(), "1 step(s) back to the last known-good checkpoint".into()]);
        t.rows.push(vec!["12".into(), "fallback".into(), "a much longer detail than the rollback's, to pad the column".into()]);
        let text = t.render();
        assert!(text.lines().any(|l| l.ends_with("rollback  1 step(s) back to the last known-good checkpoint")), "{text}");
    }

    /// A cell of wide characters (a plugin's CJK instance name) pads by the columns it
    /// takes on a terminal, so the next column still lines up; `fit` and `fit_end` never
    /// split a wide character across the edge.
    #[test]
    fn wide_characters_align_by_terminal_columns() {
        let mut t = Table::new("", &["instance", "usd"]);
        t.rows.push(vec!["東京-8x".into(), "1".into()]);
        t.rows.push(vec!["plain-name".into(), "22".into()]);
        let text = t.render();
        let ends: Vec<usize> = text.lines().filter(|l| l.ends_with('1') || l.ends_with("22")).map(columns).collect();
        assert_eq!(ends, vec![15, 15], "{text}");
        assert_eq!((fit("東京x", 3), fit("東京x", 4), fit_end("x東京", 3), fit_end("x東京", 5)), ("東", "東京", "京", "x東京"));
    }

    /// A model name or path from a user's file carries no terminal sequence to the
    /// screen: ESC, BEL and CR print as escapes in the table and the CSV, line breaks of
    /// multi-line titles stay.
    #[test]
    fn control_characters_print_as_escapes() {
        let mut t = Table::new("runs\nof \u{1b}]0;pwned\u{7}", &["model", "value"]);
        t.rows.push(vec!["llama\u{1b}[31m".into(), "1".into()]);
        t.notes.push("#3 x\u{1b}[2J: not projected\r".into());
        for out in [t.render(), t.csv()] {
            assert!(!out.contains('\u{1b}') && !out.contains('\u{7}') && !out.contains('\r'), "{out:?}");
        }
        let text = t.render();
        assert!(text.starts_with("runs\nof \\u{1b}]0;pwned\\u{7}\n") && text.contains("llama\\u{1b}[31m"), "{text}");
        assert_eq!(visible("plain\ntext"), "plain\ntext");
        assert!(!t.html().contains('\u{1b}'), "HTML too");
        assert_eq!(html_escape("it's \"x\""), "it&#39;s &quot;x&quot;");
        // Characters that show as nothing, in the contract's notation, beside its escapes.
        assert_eq!(visible("llama3.1-8b\u{200b}\u{feff}\u{1b}\nx\u{2060}"), "llama3.1-8b\\u{200b}\\u{feff}\\u{1b}\nx\\u{2060}");
        assert_eq!(visible("naïve – 80 GiB"), "naïve – 80 GiB");
        assert_eq!(visible("llama3.1-8b\u{200b}"), "llama3.1-8b\\u{200b}");
    }

    /// A CSV cell a spreadsheet would run as a formula is neutralised; numbers, negative
    /// ones included, stay numbers; a cell with a # anywhere is quoted so a comment-aware
    /// reader keeps the row whole.
    #[test]
    fn csv_cells_are_not_formulas_nor_comments() {
        let mut t = Table::new("", &["instance", "error"]);
        for (cell, n) in [("=HYPERLINK(\"x\")", "-23.1 %"), ("@SUM(A1)", "+4.2"), ("-cmd", "-"), ("#box", "-.5"), ("-2+3+cmd|' /C calc'!A0", "-$1.5K"), ("+A1", "- 2.0 %"), ("aws.amazon.com/ec2/pricing/#p5", "1")] {
            t.rows.push(vec![cell.into(), n.into()]);
        }
        assert_eq!(
            t.csv(),
            "instance,error\n\"'=HYPERLINK(\"\"x\"\")\",-23.1 %\n'@SUM(A1),+4.2\n'-cmd,-\n\"#box\",-.5\n'-2+3+cmd|' /C calc'!A0,-$1.5K\n'+A1,- 2.0 %\n\"aws.amazon.com/ec2/pricing/#p5\",1\n"
        );
    }

    /// A signed cell whose letters come before any digit is a cell reference, not a
    /// figure: "+B1", "-$E$1" and "-x" are neutralised; "-1.5e3", "+2.0x", "-$1.5K" and
    /// "-4.2 %" stay figures.
    #[test]
    fn csv_cell_references_are_not_figures() {
        let mut t = Table::new("", &["a"]);
        for cell in ["+B1", "-$E$1", "+K2%", "-x", "-1.5e3", "+2.0x", "-$1.5K", "-4.2 %"] {
            t.rows.push(vec![cell.into()]);
        }
        assert_eq!(t.csv(), "a\n'+B1\n'-$E$1\n'+K2%\n'-x\n-1.5e3\n+2.0x\n-$1.5K\n-4.2 %\n");
    }

    /// A signed column (the error of `runner validate`, the gap of a training report)
    /// aligns its positive figures with its negative ones, in the terminal and in HTML.
    #[test]
    fn positive_and_negative_figures_align_alike() {
        let mut t = Table::new("", &["#", "error"]);
        for (i, e) in ["+2.0%", "-25.0%", "0.0%"].iter().enumerate() {
            t.rows.push(vec![i.to_string(), e.to_string()]);
        }
        assert_eq!(t.render(), "#  error\n-  ------\n0   +2.0%\n1  -25.0%\n2    0.0%\n");
        assert!(t.html_fragment().contains("<td class=\"n\">+2.0%</td>"), "{}", t.html_fragment());
    }

    /// Numbers (digits, '$', '-', '~' first) are right-aligned in every column but the
    /// first; widths count characters, not bytes; no line ends in padding.
    #[test]
    fn numbers_right_align_by_characters_and_lines_carry_no_trailing_spaces() {
        let mut t = Table::new("", &["name", "delta", "approx", "note"]);
        t.rows.push(vec!["é".into(), "-5".into(), "~3".into(), "x".into()]);
        t.rows.push(vec!["Zürich".into(), "-123".into(), "~100".into(), "".into()]);
        t.rows.push(vec!["-1".into(), "1".into(), "".into(), "".into()]);
        // A name that starts with a digit is text (Verda's instance sat right-aligned in
        // its column, as if indented); an exponent or a unit keeps a figure one.
        t.rows.push(vec!["x".into(), "8H100.80S.176V".into(), "1.5e6".into(), "$1.8K".into()]);
        // Widths: name 6 ("Zürich" is 6 characters, 7 bytes), delta 14, approx 6, note 5.
        assert_eq!(
            t.render(),
            "name    delta           approx  note\n------  --------------  ------  -----\né                   -5      ~3  x\nZürich            -123    ~100\n-1                   1\nx       8H100.80S.176V   1.5e6  $1.8K\n"
        );
        let html = t.html_fragment();
        assert!(html.contains("<td class=\"n\">~3</td>") && html.contains("<td class=\"n\">-123</td>") && html.contains("<td>x</td>"), "{html}");
        assert!(html.contains("<td>8H100.80S.176V</td>") && html.contains("<td class=\"n\">1.5e6</td>"), "{html}");
    }

    /// Every piece of text that reaches an HTML page is escaped: title, headers, cells,
    /// notes and the page's <title>.
    #[test]
    fn html_escapes_title_headers_cells_and_notes() {
        let mut t = Table::new("<i>a</i> & b\nsecond <line>", &["<h>"]);
        t.rows.push(vec!["<td>".into()]);
        t.notes.push("<n>".into());
        let page = t.html();
        assert!(page.contains("<title>&lt;i&gt;a&lt;/i&gt; &amp; b</title>"), "the first line: {page}");
        assert!(page.contains("<h2>second &lt;line&gt;</h2>"), "{page}");
        for raw in ["<i>", "<h>", "<td><td>", "<n>", "<line>"] {
            assert!(!page.contains(raw), "{raw} unescaped: {page}");
        }
        assert!(html_page("x</title><script>", "").contains("<title>x&lt;/title&gt;&lt;script&gt;</title>"));
    }

    /// A note with a line break stays one comment line: a reader skipping '#' lines must
    /// not take its second line for a row.
    #[test]
    fn a_csv_note_with_line_breaks_stays_one_comment_line() {
        let mut t = Table::new("", &["a"]);
        t.rows.push(vec!["x\ny".into()]);
        t.notes.push("first\nsecond,1\r\nthird".into());
        assert_eq!(t.csv(), "a\n\"x\ny\"\n# first second,1  third\n");
    }

    /// A name already taken, by a file or by a symbolic link planted there, is refused and
    /// another drawn: the link's target is neither written nor truncated. Kills: the file
    /// opened with `create(true)` (follows the link, truncates), no retry on a collision.
    #[test]
    fn a_temporary_file_never_opens_what_is_at_its_name() {
        let tmp = tempfile::Builder::new().prefix("runner-create-new-").tempdir().unwrap();
        let dir = tmp.path();
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join(".out.a.tmp")).unwrap();
        std::fs::write(dir.join(".out.b.tmp"), "someone's").unwrap();
        let mut names = ["a", "b", "c"].into_iter();
        let (path, mut f) = create_new_named(dir, "out", &mut || names.next().unwrap_or("z").to_string()).unwrap();
        std::io::Write::write_all(&mut f, b"mine").unwrap();
        assert_eq!(path, dir.join(".out.c.tmp"));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read_to_string(dir.join(".out.b.tmp")).unwrap(), "someone's");
        let e = create_new_named(dir, "out", &mut || "a".to_string()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "every name taken: an error, not a loop");
    }

    /// `-o` is checked before a long run: a missing directory and a directory are named;
    /// a bare file name is in the working directory; the check leaves no file behind and
    /// an existing file as it was.
    #[test]
    fn writable_names_what_is_wrong_and_leaves_nothing_behind() {
        let tmp = tempfile::Builder::new().prefix("runner-writable-").tempdir().unwrap();
        let dir = tmp.path();
        let e = writable(&dir.join("no/such/out.csv")).unwrap_err();
        assert!(e.contains("the directory") && e.contains("does not exist"), "{e}");
        let e = writable(dir).unwrap_err();
        assert!(e.ends_with("is a directory; name a file in it"), "{e}");
        assert_eq!(writable(&dir.join("new.csv")), Ok(()));
        std::fs::write(dir.join("old.csv"), "kept").unwrap();
        assert_eq!(writable(&dir.join("old.csv")), Ok(()));
        let left: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("old.csv")], "no probe left, no new.csv made");
        assert_eq!(std::fs::read_to_string(dir.join("old.csv")).unwrap(), "kept");
        // A bare name: its directory is the working one (Path::parent gives "").
        assert_eq!(writable(Path::new("runner-writable-bare-name.csv")), Ok(()));
    }

    #[test]
    fn si_switches_unit_at_each_thousand() {
        assert_eq!(si(999.0), "999");
        assert_eq!(si(1e3), "1.0K");
        assert_eq!(si(2.5e6), "2.5M");
        assert_eq!(si(1e9), "1.00B");
        assert_eq!(si(2e12), "2.00T");
        assert_eq!(si(1e12), "1.00T");
        assert_eq!(si(-2e12), "-2.00T");
        assert_eq!(si(-1.5e6), "-1.5M");
        // Rounding that reaches the next unit reads in it.
        assert_eq!([si(999_960_000.0), si(999_950.0), si(-999_960.0), si(999.6), si(999_940.0)], ["1.00B", "1.0M", "-1.0M", "1.0K", "999.9K"]);
    }

    #[test]
    fn money_and_si() {
        assert_eq!(usd(1_234_567.0), "$1.23M");
        assert_eq!(usd(1.36708579e12), "$1.37T");
        assert_eq!(usd(4.2e9), "$4.20B");
        assert_eq!(usd(3.1e18), "$3.10e18");
        assert_eq!(usd(12.5), "$12.50");
        // Rounding that reaches the next unit reads in it.
        assert_eq!(usd(999_960.0), "$1.00M");
        assert_eq!(usd(999.996), "$1.0K");
        assert_eq!(usd(999_995_000.0), "$1.00B");
        assert_eq!(usd(999_996e6), "$1.00T");
        assert_eq!(usd(999.999e12), "$1.00e15");
        assert_eq!(usd(994_000.0), "$994.0K");
        assert_eq!([usd(f64::NAN), usd(f64::INFINITY), usd(f64::NEG_INFINITY)], ["n/a"; 3]);
        assert_eq!(si(8.03e9), "8.03B");
    }

    /// The format asked for is the one written. Kills: CSV written as the text table.
    #[test]
    fn render_writes_the_format_asked_for() {
        let mut t = Table::new("T", &["name", "value"]);
        t.rows.push(vec!["a".into(), "1".into()]);
        let value = serde_json::json!({"a": [1, 2]});
        assert_eq!(render(OutputFormat::Csv, &t, &value), t.csv());
        assert_eq!(render(OutputFormat::Table, &t, &value), t.render());
        assert_eq!(render(OutputFormat::Html, &t, &value), t.html());
        assert_eq!(render(OutputFormat::Json, &t, &value), "{\n  \"a\": [\n    1,\n    2\n  ]\n}\n");
        // A value that cannot be serialised still gives JSON, its error quoted as a string
        // (the message was pasted between quotes: one holding a quote broke the document).
        struct Refuses;
        impl Serialize for Refuses {
            fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("key \"x\" is not a string"))
            }
        }
        let out = render(OutputFormat::Json, &t, &Refuses);
        let back: serde_json::Value = serde_json::from_str(&out).expect(&out);
        assert_eq!(back["error"], "key \"x\" is not a string");
    }

    /// `records` writes each row's JSON fields as columns, named by their path, each cell
    /// the JSON's value whole; the CSV reads back to the same numbers, a negative small
    /// one ("-1.5e-7") included, not taken for a formula. Kills: a rounded cell, a unit
    /// in a cell, a nested field left out, a missing field shifting the row.
    #[test]
    fn records_are_the_json_values_whole_and_read_back() {
        #[derive(Serialize)]
        struct Stat {
            median: f64,
            n: usize,
        }
        #[derive(Serialize)]
        struct Row {
            kernel: &'static str,
            bytes: u64,
            gbps: f64,
            time: Stat,
            peak: Option<f64>,
        }
        let rows = [
            Row { kernel: "copy, fast", bytes: 536_870_912, gbps: 12.345_678_901_234_5, time: Stat { median: 0.043_210_987_654_321, n: 7 }, peak: None },
            Row { kernel: "triad \"x\"", bytes: 805_306_368, gbps: -1.5e-7, time: Stat { median: 1e-3, n: 7 }, peak: Some(71.0) },
        ];
        let mut t = records(&rows);
        t.notes.push("time.*: seconds".into());
        let text = t.csv();
        let (header, cells, notes) = parse_csv(&text).unwrap();
        assert_eq!(header, ["kernel", "bytes", "gbps", "time.median", "time.n", "peak"], "{text}");
        assert_eq!(notes, ["time.*: seconds"]);
        let json = serde_json::to_value(&rows).unwrap();
        for (row, want) in cells.iter().zip(json.as_array().unwrap()) {
            assert_eq!(row[0], want["kernel"].as_str().unwrap());
            for (i, path) in [(1, "/bytes"), (2, "/gbps"), (3, "/time/median"), (4, "/time/n")] {
                let got: f64 = row[i].parse().unwrap_or_else(|e| panic!("{:?}: {e}: {text}", row[i]));
                assert_eq!(got, want.pointer(path).unwrap().as_f64().unwrap(), "{path}: {text}");
            }
        }
        assert_eq!((cells[0][5].as_str(), cells[1][5].as_str()), ("", "71.0"), "null is empty; {text}");
        assert!(text.contains(",-1.5e-7,"), "a negative figure with a signed exponent stays a figure: {text}");
        // Rows of other shapes: a field one lacks is an empty cell, in its column; fields
        // keep the order given (json! would sort them).
        let t = records_of(&[record([("z", serde_json::json!(1)), ("list", serde_json::json!([1, 2]))]), record([("b", serde_json::json!("x"))])]);
        assert_eq!(t.csv(), "z,list,b\n1,\"[1,2]\",\n,,x\n");
        assert!(parse_csv("a,b\n1\n").unwrap_err().starts_with("row 1 has 1 cells, the header 2"));
        assert_eq!(parse_csv("a\n\"x\ny\"\n# n\n").unwrap(), (vec!["a".to_string()], vec![vec!["x\ny".to_string()]], vec!["n".to_string()]));
    }

    /// A header prints its control characters as escapes too. Kills: headers not made visible.
    #[test]
    fn headers_print_control_characters_as_escapes() {
        let t = Table::new("", &["mo\u{1b}[8mdel"]);
        assert_eq!(t.render(), "mo\\u{1b}[8mdel\n--------------\n");
        assert_eq!(t.csv(), "mo\\u{1b}[8mdel\n");
    }
}
