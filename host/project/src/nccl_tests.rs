//! nccl-tests' own output read as collective rows ([`CollRow`]), so a sweep a cluster
//! team already ran (`all_reduce_perf -b 8 -e 8G -f 2 -g 8 > ar.log`, one test or several
//! tests' logs in one file, launcher and NCCL lines around them) fits a profile as
//! `runner bench collectives` output does.
//!
//! Per test: the op from its `# Collective test starting: all_reduce_perf` line (older
//! nccl-tests print none; then from the file's name), the ranks from its `#  Rank N ...
//! on HOST device D [bus] NAME` lines, the nodes as their distinct hosts, rank 0's device
//! name, and one row per size. The column read is the one `bench collectives` measures:
//! in place for all_reduce and broadcast, out of place for the others (nccl-tests 2.10
//! and later: size, count, type, redop, root, then time, algbw, busbw, #wrong out of
//! place and, where printed, in place). `#wrong` "N/A" (not checked) counts as none;
//! a size-0 row carries no bandwidth and is skipped. Each row's printed algbw must be
//! its size / time and its busbw algbw x the op's bus factor, within what printing
//! rounded (`printed_figures_agree`): a figure that is neither is an edited or corrupt log.

use std::collections::BTreeSet;

use crate::collectives::CollRow;

/// Whether `text` is nccl-tests output rather than a JSON file (whose lines never start
/// with `#`; an nccl-tests log may start with `[`, as mpirun's `[host:pid]` lines do).
pub(crate) fn looks_like(text: &str) -> bool {
    text.lines().any(|l| header(l).is_some_and(|h| h.starts_with("nThread") || h.starts_with("Collective test starting:")))
}

/// Whether `text` is nccl-tests output, tagged by a launcher or not: for a file given
/// where another format goes, whose parse error would not say what it is.
pub(crate) fn is_log(text: &str) -> bool {
    looks_like(text) || untagged(text).is_some_and(|t| looks_like(&t))
}

/// The message for an nccl-tests log given as `what` (its parse failed).
pub(crate) fn misplaced(origin: &str, what: &str) -> String {
    format!("{origin}: this is nccl-tests output, not {what}: pass it with `runner calibrate --collectives {origin} --gpu NAME`")
}

/// `text` with the launcher's tag taken off each line that carries one, where half or
/// more of its lines carry one of one style: `srun -l`'s rank (`0: `, padded as ` 0: `
/// for wide ranks) or `mpirun --tag-output`'s `[1,0]<stdout>:`; `None` where they do
/// not. Lines keep their numbers. mpirun's own `[host:pid]` lines are no tag.
pub(crate) fn untagged(text: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let written = lines.iter().filter(|l| !l.trim().is_empty()).count();
    [srun_tag as fn(&str) -> Option<usize>, mpirun_tag].into_iter().find_map(|tag| {
        let tagged = lines.iter().filter(|l| tag(l).is_some()).count();
        (tagged > 0 && 2 * tagged >= written)
            .then(|| lines.iter().map(|l| tag(l).map_or(*l, |n| &l[n..])).collect::<Vec<_>>().join("\n"))
    })
}

/// The length of `srun -l`'s tag on `line`: spaces, a rank, `:` and a space (or the
/// line's end). An nccl-tests row (spaces, a size, spaces) has no colon after its number.
fn srun_tag(line: &str) -> Option<usize> {
    let lead = line.len() - line.trim_start_matches(' ').len();
    let digits = line[lead..].bytes().take_while(u8::is_ascii_digit).count();
    let rest = &line[lead + digits..];
    if digits == 0 {
        None
    } else if rest.starts_with(": ") {
        Some(lead + digits + 2)
    } else {
        (rest == ":").then_some(lead + digits + 1)
    }
}

/// The length of `mpirun --tag-output`'s tag on `line` (Open MPI): `[job,rank]<stdout>:`
/// or `<stderr>:`.
fn mpirun_tag(line: &str) -> Option<usize> {
    let rest = line.strip_prefix('[')?;
    let (inside, after) = rest.split_once(']')?;
    let (job, rank) = inside.split_once(',')?;
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !(number(job) && number(rank)) {
        return None;
    }
    let past = after.strip_prefix("<stdout>:").or_else(|| after.strip_prefix("<stderr>:"))?;
    Some(line.len() - past.len())
}

/// A `#` line's text past the `#` and spaces.
fn header(line: &str) -> Option<&str> {
    line.trim().strip_prefix('#').map(str::trim)
}

/// One test's lines.
struct Test {
    /// From its "starting" line; `None` for an nccl-tests that prints none.
    op: Option<String>,
    /// 1-based line of its first header line.
    line: usize,
    /// Whether its `# nThread` line was read (an older nccl-tests opens a test with it).
    opened: bool,
    /// (rank, host, device name)
    ranks: Vec<(usize, String, String)>,
    /// (line, the row's columns)
    rows: Vec<(usize, Vec<String>)>,
}

impl Test {
    fn new(op: Option<String>, line: usize) -> Test {
        Test { op, line, opened: false, ranks: Vec::new(), rows: Vec::new() }
    }
}

/// The ops `runner calibrate --collectives` reads: the first four fitted, the last two
/// shown ([`crate::collectives::kind_of`]).
const READ: [&str; 6] = ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "sendrecv"];

/// nccl-tests' other test binaries (its Makefile's list, less [`READ`]).
const OTHERS: [&str; 4] = ["reduce", "gather", "scatter", "hypercube"];

/// The test a file's name names (`all_reduce_perf.log`, `ar-alltoall_perf-16n.txt`,
/// `reduce_perf.log`), for an nccl-tests that does not print it: the word before
/// `_perf`, as one of nccl-tests' test names where it ends with one (`my_all_gather_perf`
/// is all_gather; `reduce_perf` is reduce, which the fit does not read).
fn op_in_name(origin: &str) -> Option<String> {
    let file = origin.rsplit(['/', '\\']).next().unwrap_or(origin);
    file.match_indices("_perf").find_map(|(at, _)| {
        let before = &file[..at];
        let start = before.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
        let word = &before[start..];
        let ends = |op: &str| word == op || word.ends_with(&format!("_{op}"));
        let named = READ.into_iter().chain(OTHERS).find(|op| ends(op)).unwrap_or(word);
        (!named.is_empty()).then(|| named.to_string())
    })
}

/// `#  Rank  3 Group  0 Pid 1234 on node07 device  3 [0000:1b:00] NVIDIA H100 80GB HBM3`
/// as (3, "node07", "NVIDIA H100 80GB HBM3"); older versions print no Group.
fn rank_line(h: &str) -> Option<(usize, String, String)> {
    let words: Vec<&str> = h.split_whitespace().collect();
    if words.first() != Some(&"Rank") {
        return None;
    }
    let rank = words.get(1)?.parse().ok()?;
    let on = words.iter().position(|w| *w == "on")?;
    let host = words.get(on + 1)?.to_string();
    let device = words.iter().position(|w| *w == "device")?;
    let name = h.split_once(']').map_or("", |(_, n)| n.trim());
    let name = if name.is_empty() { words.get(device + 2..).map(|w| w.join(" ")).unwrap_or_default() } else { name.to_string() };
    Some((rank, host, name))
}

/// Read nccl-tests output; `origin` names the file in messages (and, for an nccl-tests
/// that prints no test name, gives the op).
///
/// # Errors
/// A test with no name, no rank lines or no rows, a rank listed twice (nccl-tests built
/// without MPI, each process its own one-GPU test), a row of the wrong shape or with a
/// value that is not a number, or one op and size measured twice; each names the line
/// and the fix.
pub(crate) fn rows(text: &str, origin: &str) -> Result<Vec<CollRow>, String> {
    let mut tests: Vec<Test> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let at = i + 1;
        if let Some(h) = header(line) {
            if let Some(name) = h.strip_prefix("Collective test starting:") {
                let name = name.trim();
                tests.push(Test::new(Some(name.strip_suffix("_perf").unwrap_or(name).to_string()), at));
            } else if h.starts_with("nThread") {
                if tests.last().is_none_or(|t| t.opened) {
                    tests.push(Test::new(None, at));
                }
                if let Some(t) = tests.last_mut() {
                    t.opened = true;
                }
            } else if let Some(r) = rank_line(h) {
                let Some(t) = tests.last_mut() else {
                    return Err(format!("{origin}: line {at}: a rank line before any test's header: keep nccl-tests' whole output"));
                };
                t.ranks.push(r);
            }
            continue;
        }
        let cols: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        // A row starts with two whole numbers (size, count); launcher and NCCL lines do not.
        if cols.len() < 2 || cols[0].parse::<u64>().is_err() || cols[1].parse::<u64>().is_err() {
            continue;
        }
        let Some(t) = tests.last_mut() else {
            return Err(format!("{origin}: line {at}: a row before any test's header: keep nccl-tests' whole output"));
        };
        t.rows.push((at, cols));
    }
    if tests.is_empty() {
        return Err(format!("{origin}: no nccl-tests header (`# nThread ...`): not an nccl-tests log"));
    }
    // A killed run's log ends mid-row: its last line is the one to blame, not the version.
    let last = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).last().map_or(0, |(i, _)| i + 1);
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for t in tests {
        out.extend(test_rows(t, origin, last, &mut seen)?);
    }
    Ok(out)
}

/// One test's rows; `seen` holds the (op, size, type, reduction) of the tests before it
/// (`-d all` and `-o all` measure each size once per data type and reduction op), and
/// `last` is the file's last written line.
fn test_rows(mut t: Test, origin: &str, last: usize, seen: &mut BTreeSet<(String, u64, String, String)>) -> Result<Vec<CollRow>, String> {
    let from = format!("{origin}: the test at line {}", t.line);
    let op = match t.op.take().or_else(|| op_in_name(origin)) {
        Some(op) => op,
        None => {
            return Err(format!(
                "{from} does not say which collective it ran (this nccl-tests prints no `# Collective test starting:` \
                 line): name the file after the test binary, e.g. all_reduce_perf.log"
            ));
        }
    };
    if !READ.contains(&op.as_str()) {
        return Err(format!(
            "{from}: {op}_perf is not an op the network fit reads: it fits all_reduce, all_gather, reduce_scatter and \
             alltoall and shows broadcast and sendrecv (the *_perf binaries of those names); leave {op}_perf's log out"
        ));
    }
    if t.ranks.is_empty() {
        return Err(format!("{from} ({op}) has no `#  Rank N ... on HOST device ...` lines: keep nccl-tests' whole header"));
    }
    t.ranks.sort_by_key(|r| r.0);
    for (k, r) in t.ranks.iter().enumerate() {
        if r.0 != k {
            let why = if t.ranks.iter().filter(|x| x.0 == r.0).count() > 1 {
                format!(
                    "rank {} is listed twice: nccl-tests built without MPI runs each process as its own one-GPU test; \
                     rebuild it with MPI=1",
                    r.0
                )
            } else {
                format!("rank {k} is missing: keep every rank line")
            };
            return Err(format!("{from} ({op}): {why}"));
        }
    }
    if t.rows.is_empty() {
        return Err(format!("{from} ({op}) has no rows: the test failed or was stopped; run it again"));
    }
    let ranks = t.ranks.len();
    let nodes = t.ranks.iter().map(|r| r.1.as_str()).collect::<BTreeSet<_>>().len();
    let device = t.ranks[0].2.clone();
    let in_place = matches!(op.as_str(), "all_reduce" | "broadcast");
    let factor = crate::collectives::bus_factor_of(&op, ranks).map_err(|e| format!("{from} ({op}): {e}"))?;
    let mut out = Vec::new();
    for (at, cols) in &t.rows {
        let line = format!("{origin}: line {at} ({op})");
        if cols.len() != 9 && cols.len() != 13 {
            if *at == last && cols.len() < 13 {
                return Err(format!(
                    "{line}: the log ends in the middle of this row ({} columns of 9 or 13): was the run killed? Delete \
                     the line to fit the complete rows, or run the sweep again",
                    cols.len()
                ));
            }
            return Err(format!(
                "{line}: {} columns where nccl-tests 2.10 and later print 9 (out of place) or 13 (and in place): size, count, \
                 type, redop, root, time, algbw, busbw, #wrong; an older nccl-tests' log cannot be read, run a newer one",
                cols.len()
            ));
        }
        let pick = if in_place && cols.len() == 13 { 9 } else { 5 };
        let num = |k: usize, what: &str| -> Result<f64, String> {
            cols[k].parse::<f64>().map_err(|_| format!("{line}: {what} '{}' is not a number", cols[k]))
        };
        let size_bytes: u64 = cols[0].parse().map_err(|_| format!("{line}: size '{}' is not a whole number", cols[0]))?;
        if size_bytes == 0 {
            continue;
        }
        if !seen.insert((op.clone(), size_bytes, cols[2].clone(), cols[3].clone())) {
            return Err(format!(
                "{line}: {op} of {size_bytes} B is measured twice in the sweep (a log of several runs of one test): keep one \
                 run per test, or fit each run on its own"
            ));
        }
        // Both the out-of-place and the in-place figures, where printed: one edited
        // column is as much a corrupt log as the other.
        for at in [5, 9].into_iter().filter(|&k| k + 2 < cols.len()) {
            printed_figures_agree(&cols[at..at + 3], size_bytes, factor).map_err(|e| format!("{line}: {e}"))?;
        }
        let wrong = match cols[pick + 3].as_str() {
            "N/A" => None,
            w => Some(w.parse::<u64>().map_err(|_| format!("{line}: #wrong '{w}' is not a whole number or N/A"))?),
        };
        out.push(CollRow {
            op: op.clone(),
            size_bytes,
            count: cols[1].parse().map_err(|_| format!("{line}: count '{}' is not a whole number", cols[1]))?,
            dtype: cols[2].clone(),
            redop: cols[3].clone(),
            root: cols[4].parse().map_err(|_| format!("{line}: root '{}' is not a whole number", cols[4]))?,
            time_us: num(pick, "time")?,
            algbw_gbps: num(pick + 1, "algbw")?,
            busbw_gbps: num(pick + 2, "busbw")?,
            wrong,
            ranks,
            nodes,
            transport: "nccl".into(),
            device: device.clone(),
        });
    }
    Ok(out)
}

/// Half the last printed digit of `figure` (nccl-tests prints time with 2 decimals below
/// 100 us, 1 below 10 ms and none above, bandwidths with 2): what rounding may have moved it.
fn half_unit(figure: &str) -> f64 {
    let (mantissa, exponent) = figure.split_once(['e', 'E']).map_or((figure, 0), |(m, e)| (m, e.parse::<i32>().unwrap_or(0)));
    let decimals = mantissa.split_once('.').map_or(0, |(_, d)| d.len());
    0.5 * 10f64.powi(exponent.saturating_sub(i32::try_from(decimals).unwrap_or(i32::MAX)))
}

/// A row's printed time, algbw and busbw (`figures`, as printed) agree as nccl-tests
/// computes them: algbw = size / time (bytes / us / 1e3 = GB/s) and busbw = algbw x the
/// op's bus `factor`, each within what printing rounded. The printed time is rounded
/// too, so size / time may miss the true algbw by its relative rounding: at a tiny size
/// (time 10.00 us, algbw 0.00) that is a few thousandths of almost nothing, and at 2
/// decimals below 100 us never more than 0.05 %.
fn printed_figures_agree(figures: &[String], size_bytes: u64, factor: f64) -> Result<(), String> {
    let [time, algbw, busbw] = figures else { return Ok(()) };
    let read = |f: &String| f.parse::<f64>().ok();
    let (Some(t), Some(a), Some(b)) = (read(time), read(algbw), read(busbw)) else {
        // A figure that is not a number: named where its column is read.
        return Ok(());
    };
    // A time rounded to nothing bounds no bandwidth; the row check refuses a time of 0.
    // A figure of "nan" or "inf" parses, and agrees with nothing.
    let slack = half_unit(time) / t;
    if t.is_finite() && (0.0..1.0).contains(&slack) {
        let computed = size_bytes as f64 / t / 1e3;
        if !a.is_finite() || (a - computed).abs() > half_unit(algbw) + computed * slack / (1.0 - slack) + 1e-9 * computed {
            return Err(format!(
                "algbw {algbw} GB/s is not size / time ({size_bytes} B in {time} us is {} GB/s): the log was edited or is \
                 corrupt; fix the row or run the sweep again",
                runner_contract::text::number((computed * 1e3).round() / 1e3)
            ));
        }
    }
    if !b.is_finite() || (b - a * factor).abs() > half_unit(busbw) + half_unit(algbw) * factor + 1e-9 * b.abs() {
        return Err(format!(
            "busbw {busbw} GB/s is not algbw x the bus factor ({algbw} x {} is {} GB/s): the log was edited or is corrupt; \
             fix the row or run the sweep again",
            runner_contract::text::number(factor),
            runner_contract::text::number((a * factor * 1e3).round() / 1e3)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::collectives::parse;

    /// One all_gather test on `ranks` (rank, host) pairs, as an nccl-tests that prints
    /// no "starting" line writes it (`starting` adds one), with `rows` after the header.
    fn log(starting: bool, ranks: &[(usize, &str)], rows: &str) -> String {
        let mut s = String::new();
        if starting {
            s += "# Collective test starting: all_gather_perf\n";
        }
        s += "# nThread 1 nGpus 1 minBytes 0 maxBytes 2097152 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n";
        for (r, h) in ranks {
            s += &format!("#  Rank {r:2} Group  0 Pid  1{r:03} on {h} device  {} [0000:1b:00] NVIDIA H100 80GB HBM3\n", r % 8);
        }
        s + "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n" + rows
    }

    /// Two all_gather rows on 2 ranks (bus factor 1/2): 1 MiB in 20 us, 2 MiB in 30 us.
    const ROWS: &str = "           0             0     float    none      -1     5.10    0.00    0.00      0     5.00    0.00    0.00    N/A\n\
                        \x20    1048576        131072     float    none      -1    20.00   52.43   26.21      0    21.00   49.93   24.97    N/A\n\
                        \x20    2097152        262144     float    none      -1    30.00   69.91   34.95    N/A    31.00   67.65   33.83    N/A\n";

    /// A launcher's tags are taken off where half the written lines or more carry one:
    /// exactly half is enough, fewer is not (blank lines do not count).
    #[test]
    fn tags_on_half_the_lines_are_taken_off() {
        assert_eq!(super::untagged("0: a\nb").as_deref(), Some("a\nb"));
        assert_eq!(super::untagged("0: a\n\nb\n").as_deref(), Some("a\n\nb"));
        assert_eq!(super::untagged("0: a\nb\nc"), None);
    }

    /// `-d all`: each size once per data type, one run (not "measured twice"); the same
    /// type twice still is.
    #[test]
    fn rows_of_several_data_types_are_one_run() {
        let two = [(0, "n"), (1, "n")];
        let rows: String = ROWS.lines().flat_map(|l| [l.to_string(), l.replace("float", "bfloat16")]).map(|l| l + "\n").collect();
        let r = parse(&log(true, &two, &rows), "ag.log").unwrap();
        assert_eq!(r.iter().map(|r| r.dtype.as_str()).collect::<Vec<_>>(), ["float", "bfloat16", "float", "bfloat16"]);
        assert!(parse(&log(true, &two, &(rows.clone() + &rows)), "ag.log").unwrap_err().contains("measured twice"));
    }

    /// A log given where a calibration file or a `runner measure` file goes is named as
    /// nccl-tests output, with the flag it goes to (not a TOML or JSON syntax error).
    #[test]
    fn a_log_given_as_another_file_says_where_it_goes() {
        let text = log(true, &[(0, "n"), (1, "n")], ROWS);
        let want = "ar.log: this is nccl-tests output, not a calibration file: pass it with `runner calibrate --collectives ar.log --gpu NAME`";
        assert_eq!(crate::published::parse(&text, "ar.log").unwrap_err(), want);
        let tagged: String = text.lines().map(|l| format!("0: {l}\n")).collect();
        assert_eq!(crate::published::parse(&tagged, "ar.log").unwrap_err(), want);
        let e = crate::measured::OpsFile::parse(&text, "ar.log").map(|_| ()).unwrap_err();
        assert!(e.starts_with("ar.log: this is nccl-tests output, not a `runner measure` file: pass it with `runner calibrate --collectives ar.log"), "{e}");
    }

    #[test]
    fn a_log_gives_its_ranks_nodes_device_and_rows() {
        let two = [(0, "node-a"), (1, "node-b")];
        let r = parse(&log(true, &two, ROWS), "sweep.txt").unwrap();
        // The size-0 row is skipped; N/A counts as no wrong values.
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].op.as_str(), r[0].ranks, r[0].nodes, r[0].device.as_str()), ("all_gather", 2, 2, "NVIDIA H100 80GB HBM3"));
        assert_eq!((r[1].size_bytes, r[1].count, r[1].time_us, r[1].busbw_gbps, r[1].wrong), (2_097_152, 262_144, 30.0, 34.95, None));
        assert_eq!(r[0].wrong, Some(0));
        let one = [(1, "node-a"), (0, "node-a")];
        assert_eq!(parse(&log(true, &one, ROWS), "sweep.txt").unwrap()[0].nodes, 1);
    }

    #[test]
    fn a_test_without_a_name_takes_the_files() {
        let two = [(0, "n"), (1, "n")];
        assert_eq!(parse(&log(false, &two, ROWS), "logs/all_gather_perf-2x1.log").unwrap()[0].op, "all_gather");
        let e = parse(&log(false, &two, ROWS), "logs/sweep.log").unwrap_err();
        assert!(e.contains("logs/sweep.log: the test at line 1 does not say which collective") && e.contains("all_reduce_perf.log"), "{e}");
        // The binary's name, whole: all_reduce_perf is no reduce_perf, my_all_gather_perf an all_gather.
        assert_eq!(super::op_in_name("logs/all_reduce_perf.log").as_deref(), Some("all_reduce"));
        for (file, op) in [("x/my_all_gather_perf-8g.txt", "all_gather"), ("ar-alltoall_perf-16n.txt", "alltoall"), ("reduce_scatter_perf.log", "reduce_scatter")] {
            assert_eq!(parse(&log(false, &two, ROWS), file).unwrap()[0].op, op, "{file}");
        }
    }

    /// A log of an nccl-tests binary the fit does not read (reduce_perf, gather_perf ...),
    /// by its file's name or its "starting" line, is said to be one, not to be named
    /// after a binary it is already named after.
    #[test]
    fn a_test_the_fit_does_not_read_is_named_so() {
        let two = [(0, "n"), (1, "n")];
        for (file, bin) in [("logs/reduce_perf.log", "reduce_perf"), ("gather_perf-2g.txt", "gather_perf"), ("run3_scatter_perf.out", "scatter_perf"), ("hypercube_perf.log", "hypercube_perf")] {
            let e = parse(&log(false, &two, ROWS), file).unwrap_err();
            assert!(e.starts_with(&format!("{file}: the test at line 1: {bin} is not an op the network fit reads")), "{e}");
            assert!(e.contains("all_reduce, all_gather, reduce_scatter and alltoall") && !e.contains("name the file after"), "{e}");
        }
        let e = parse(&log(true, &two, ROWS).replace("all_gather_perf", "reduce_perf"), "sweep.log").unwrap_err();
        assert!(e.contains("reduce_perf is not an op the network fit reads"), "{e}");
    }

    /// A row's algbw is size / time and its busbw algbw x the bus factor, within what
    /// printing rounded: time to 2, 1 or 0 decimals as nccl-tests prints it, at tiny
    /// sizes too; an edited figure is refused, naming the line and both figures, also
    /// one (busbw 26.30 for 26.21) the 1 % the row check allows would let through.
    #[test]
    fn printed_figures_are_checked_within_their_rounding() {
        let two = [(0, "n"), (1, "n")];
        let row = |size: u64, time: &str, algbw: &str, busbw: &str| {
            format!("{size:>12} {:>13}     float    none      -1 {time:>8} {algbw:>7} {busbw:>7}      0 {time:>8} {algbw:>7} {busbw:>7}    N/A\n", size / 8)
        };
        // 8 B in 10.00 us; 16 MiB in 101.56 us printed as 101.6 (algbw 165.20 from the
        // time nccl-tests measured, 165.13 from the printed one); 2 GiB in 10000.4 us
        // printed as 10000 (214.74 against 214.75).
        let fine = [row(8, "10.00", "0.00", "0.00"), row(16_777_216, "101.6", "165.20", "82.60"), row(2_147_483_648, "10000", "214.74", "107.37")];
        let r = parse(&log(true, &two, &fine.concat()), "ag.log").unwrap();
        assert_eq!(r.iter().map(|r| r.algbw_gbps).collect::<Vec<_>>(), [0.0, 165.2, 214.74]);
        let bad = |rows: &str, want: &str| {
            let e = parse(&log(true, &two, rows), "ag.log").unwrap_err();
            assert!(e.contains(want), "want '{want}': {e}");
        };
        bad(&ROWS.replace("52.43", "60.00"), "ag.log: line 9 (all_gather): algbw 60.00 GB/s is not size / time (1048576 B in 20.00 us is 52.429 GB/s)");
        bad(&ROWS.replace("49.93", "50.93"), "line 9 (all_gather): algbw 50.93 GB/s is not size / time (1048576 B in 21.00 us is 49.932 GB/s)");
        bad(&ROWS.replace("26.21", "26.30"), "line 9 (all_gather): busbw 26.30 GB/s is not algbw x the bus factor (52.43 x 0.5 is 26.215 GB/s)");
        bad(&row(8, "10.00", "0.01", "0.00"), "algbw 0.01 GB/s is not size / time (8 B in 10.00 us is 0.001 GB/s)");
        bad(&row(16_777_216, "101.6", "165.40", "82.70"), "algbw 165.40 GB/s is not size / time");
        bad(&row(8, "10.00", "nan", "0.00"), "algbw nan GB/s is not size / time");
        for (figure, half) in [("20.00", 0.005), ("101.6", 0.05), ("10000", 0.5), ("1.5e+01", 0.5), ("1e-2147483648", 0.0)] {
            assert!((super::half_unit(figure) - half).abs() < 1e-12, "{figure}");
        }
    }

    /// Rows of a real log pass, as nccl-tests printed them: all_reduce_perf -b 8 -e 8G
    /// on 16 H100s over 2 nodes (lessizzmore/create-a3mega-ztan-fork at 02dd8f455c43,
    /// ztan-NCCL-test-result), time to 1 decimal from 100 us and none from 10 ms, and at
    /// 512 B an algbw of 0.00 beside a busbw of 0.01 (0.0040 x 1.875 = 0.0076).
    #[test]
    fn a_real_logs_rows_pass() {
        let mut s = String::from(
            "# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n",
        );
        for r in 0..16 {
            s += &format!("#  Rank {r:2} Group  0 Pid   {} on {} device  {} [0000:04:00] NVIDIA H100 80GB HBM3\n", 6000 + r, ["ztan-mig-235z", "ztan-mig-gq73"][r / 8], r % 8);
        }
        s += "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n\
              \x20          8             2     float     sum      -1    135.8    0.00    0.00      0    123.5    0.00    0.00      0\n\
              \x20        512           128     float     sum      -1    126.6    0.00    0.01      0    123.4    0.00    0.01      0\n\
              \x20       1024           256     float     sum      -1    147.1    0.01    0.01      0    123.1    0.01    0.02      0\n\
              \x20    1048576        262144     float     sum      -1    203.2    5.16    9.68      0    207.2    5.06    9.49      0\n\
              \x20 2147483648     536870912     float     sum      -1    12646  169.81  318.40      0    12641  169.88  318.52      0\n\
              \x20 8589934592    2147483648     float     sum      -1    47535  180.71  338.82      0    47743  179.92  337.35      0\n";
        let r = parse(&s, "all_reduce_perf.log").unwrap();
        assert_eq!((r.len(), r[0].ranks, r[0].nodes), (6, 16, 2));
        // One figure off by a hundredth past its rounding is not.
        let e = parse(&s.replace("169.81  318.40", "169.83  318.40"), "all_reduce_perf.log").unwrap_err();
        assert!(e.contains("algbw 169.83 GB/s is not size / time (2147483648 B in 12646 us is 169.815 GB/s)"), "{e}");
    }

    /// Each log nccl-tests writes that cannot be one run's sweep is refused with the fix.
    #[test]
    fn logs_that_are_not_one_sweep_are_refused() {
        let two = [(0, "n"), (1, "n")];
        let bad = |text: &str, want: &str| {
            let e = parse(text, "s.log").unwrap_err();
            assert!(e.starts_with("s.log: ") && e.contains(want), "want '{want}': {e}");
        };
        // nccl-tests built without MPI: every process its own test of rank 0.
        bad(&log(true, &[(0, "n"), (0, "n")], ROWS), "rank 0 is listed twice");
        bad(&log(true, &[(0, "n"), (2, "n")], ROWS), "rank 1 is missing");
        bad(&log(true, &[], ROWS), "has no `#  Rank N");
        bad(&log(true, &two, ""), "has no rows");
        // The same test twice (two runs under other NCCL settings in one log).
        bad(&(log(true, &two, ROWS) + &log(true, &two, ROWS)), "all_gather of 1048576 B is measured twice");
        bad(&log(true, &two, "     1048576        131072     float    none    20.00   52.43   26.21  0e+00\n"), "8 columns");
        bad(&log(true, &two, &ROWS.replace("20.00   52.43", "fast   52.43")), "time 'fast' is not a number");
        bad(&log(true, &two, &ROWS.replacen("26.21      0", "26.21      3", 1)), "3 wrong values");
        bad(&log(true, &two, &ROWS.replace("26.21", "40.00")), "line 9 (all_gather): busbw 40.00 GB/s is not algbw x the bus factor (52.43 x 0.5 is 26.215 GB/s)");
        bad(&log(true, &[(0, "n"), (1, "n")], ROWS).replace("all_gather", "hypercube"), "hypercube_perf is not an op the network fit reads");
        // A run killed mid-row: the cut line is named, not the nccl-tests version.
        let cut = log(true, &two, &(ROWS.to_string() + "     4194304        524288     fl\n\n"));
        bad(&cut, "line 11 (all_gather): the log ends in the middle of this row (3 columns of 9 or 13): was the run killed?");
        bad(&log(true, &two, &(ROWS.to_string() + "     4194304        524288     float    none      -1    40.00  104.86   52.43      0    41.00\n")), "10 columns of 9 or 13");
        // A short row that is not the last is a format this reader does not know.
        bad(&log(true, &two, &format!("     4194304        524288     fl\n{ROWS}")), "an older nccl-tests' log cannot be read");
        // Not nccl-tests and not JSON: the JSON reader's error, which names both.
        let e = parse("hello", "s.log").unwrap_err();
        assert!(e.contains("or give nccl-tests' own output"), "{e}");
    }
}
