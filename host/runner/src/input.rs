//! Reading the files a user names (run files, calibration and profile files, measured
//! times, price lists), each with a size limit: a wrong path such as `/dev/zero` or a
//! multi-gigabyte log must give an error naming the file, not take the machine's memory.

use std::io::Read;
use std::path::Path;

/// Run files, profiles, calibration and measurement files: a few kB to a few MB.
pub const TEXT_LIMIT: u64 = 16 << 20;

/// A training text for `runner train` (a small model on the CPU: tens of MB is a lot).
pub const CORPUS_LIMIT: u64 = 256 << 20;

/// A price list of every cloud's every zone is a few MB.
pub const PRICE_LIMIT: u64 = 64 << 20;

/// The whole of `path` as bytes; `what` names the file in errors ("run file").
///
/// # Errors
/// The file cannot be read, or holds more than `limit` bytes (it reads at most one byte
/// past the limit, so a device or a pipe that never ends is refused too).
pub fn read_bytes(path: &Path, what: &str, limit: u64) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
    if bytes.len() as u64 > limit {
        return Err(format!(
            "{what} {} is larger than {} MiB, more than any {what} holds: is it the right file?",
            path.display(),
            limit >> 20
        ));
    }
    Ok(bytes)
}

/// The whole of `path` as UTF-8 text, limited as [`read_bytes`].
///
/// # Errors
/// As [`read_bytes`], or the file is not UTF-8.
pub fn read_text(path: &Path, what: &str, limit: u64) -> Result<String, String> {
    String::from_utf8(read_bytes(path, what, limit)?)
        .map_err(|e| format!("{what} {} is not UTF-8 text (first bad byte at offset {})", path.display(), e.utf8_error().valid_up_to()))
}

/// Refuses a list that names one item twice (`bench gemm --sizes 8,8`, `search --gpus
/// 8,16,8`, a run file's `gpus = [8, 8]`): the item would run twice, in two rows, or be
/// dropped without a word. The one rule for every list flag and run-file list of counts
/// and names whose items each make a row. `items` are (as typed, what it names): two
/// spellings of one item are one item, and the message gives both; `why` says what one
/// item is ("each is measured once, in one row").
///
/// # Errors
/// Names the list, the item and both spellings, and says to list it once.
pub fn refuse_repeats<K: PartialEq + std::fmt::Display>(what: &str, items: &[(String, K)], why: &str) -> Result<(), String> {
    for (i, (typed, key)) in items.iter().enumerate() {
        if let Some((first, _)) = items[..i].iter().find(|(_, k)| k == key) {
            let spelled = if first == typed { String::new() } else { format!(" (as {first} and {typed})") };
            return Err(format!("{what} gives {key}{spelled} twice: {why}; list it once"));
        }
    }
    Ok(())
}

/// [`refuse_repeats`] for GPU counts (`--gpus`, a run file's `[cluster] gpus`): each count
/// is one row of every series, so a count given twice is refused, not merged.
///
/// # Errors
/// As [`refuse_repeats`].
pub fn refuse_repeated_gpu_counts(what: &str, counts: &[u32]) -> Result<(), String> {
    refuse_repeats(what, &counts.iter().map(|&n| (n.to_string(), n)).collect::<Vec<_>>(), "each GPU count is one row")
}

// "Did you mean": the one rule, shared with the calibration-file reader of runner-project.
pub use runner_project::spelling::{edit_distance, nearest};

/// A number as people write token counts and budgets: 1.5e12, 15T, 300B, 2M, $500K
/// (K, M, B or G, T: thousand, million, billion, trillion; a leading $ ignored): the
/// command line's --tokens and --budget and a run file's tokens and budget_usd.
///
/// # Errors
/// Says how to write one.
pub fn quantity(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let t = t.strip_prefix('$').unwrap_or(t);
    if let Ok(v) = t.parse::<f64>() {
        return Ok(v);
    }
    let scale = |c: char| match c.to_ascii_uppercase() {
        'K' => Some(1e3),
        'M' => Some(1e6),
        'B' | 'G' => Some(1e9),
        'T' => Some(1e12),
        _ => None,
    };
    let parsed = t.chars().next_back().and_then(|c| Some((scale(c)?, t[..t.len() - c.len_utf8()].trim().parse::<f64>().ok()?)));
    match parsed {
        Some((k, v)) => Ok(v * k),
        None => Err(format!("'{s}' is not a number: write it as 1.5e12, or with a suffix K, M, B (or G) or T, e.g. 15T (tokens) or $2M (a budget)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names at the least distance, when it is a slip's (at most 2, or a third of the
    /// name), in any case; none when the nearest is farther.
    #[test]
    fn nearest_names_are_a_slip_away() {
        let known = ["gpu", "gpus", "gbs", "llama3.1-8b", "llama3.1-70b"];
        assert_eq!(nearest("gpuz", &known), ["gpu", "gpus"]);
        assert_eq!(nearest("LLAMA3.1-8X", &known), ["llama3.1-8b"]);
        // A long name takes a third of its length: three slips in thirteen characters.
        assert_eq!(nearest("llama3.1-8xyz", &known), ["llama3.1-8b"]);
        assert_eq!(nearest("llama3.1-8b\u{200b}", &known), ["llama3.1-8b"]);
        assert!(nearest("zzzz", &known).is_empty());
        assert!(nearest("x", &[]).is_empty());
    }

    #[test]
    fn a_file_past_the_limit_is_refused_by_name_and_one_at_it_is_read() {
        let tmp = tempfile::Builder::new().prefix("runner-input-").tempdir().unwrap();
        let dir = tmp.path();
        let f = dir.join("run.toml");
        std::fs::write(&f, vec![b'#'; 2 << 20]).unwrap();
        assert_eq!(read_text(&f, "run file", 2 << 20).unwrap().len(), 2 << 20);
        let err = read_text(&f, "run file", 1 << 20).unwrap_err();
        assert!(err.contains("run file") && err.contains("run.toml") && err.contains("larger than 1 MiB"), "{err}");
        std::fs::write(&f, [b'a', 0xff, b'b']).unwrap();
        let err = read_text(&f, "run file", 1 << 20).unwrap_err();
        assert!(err.contains("not UTF-8") && err.contains("offset 1"), "{err}");
    }

    #[test]
    fn quantities_take_the_suffixes_people_write() {
        for (s, v) in [("1.5e12", 1.5e12), ("15T", 15e12), ("15t", 15e12), ("300B", 300e9), ("300G", 300e9), ("300g", 300e9), ("2M", 2e6), ("$500K", 5e5), ("2k", 2e3), (" 1.5 T", 1.5e12), ("-1", -1.0)] {
            assert_eq!(quantity(s), Ok(v), "{s}");
        }
        for s in ["15X", "T", "", "1e12T12", "$", "15€"] {
            let e = quantity(s).unwrap_err();
            assert!(e.contains("is not a number") && e.contains("e.g. 15T (tokens) or $2M (a budget)"), "{s}: {e}");
        }
    }

    #[test]
    fn a_list_naming_one_item_twice_is_refused_with_both_spellings() {
        let items = |v: &[(&str, u32)]| v.iter().map(|&(t, k)| (t.to_string(), k)).collect::<Vec<_>>();
        assert_eq!(refuse_repeats("--sizes", &items(&[("8", 8), ("16", 16)]), "w"), Ok(()));
        assert_eq!(refuse_repeats("--sizes", &items(&[("8", 8), ("16", 16), ("8", 8)]), "w"), Err("--sizes gives 8 twice: w; list it once".into()));
        assert_eq!(refuse_repeats("--ops", &items(&[("a", 1), ("A", 1)]), "w"), Err("--ops gives 1 (as a and A) twice: w; list it once".into()));
        assert_eq!(refuse_repeated_gpu_counts("--gpus", &[8, 16, 8]), Err("--gpus gives 8 twice: each GPU count is one row; list it once".into()));
        assert_eq!(refuse_repeated_gpu_counts("--gpus", &[16, 8]), Ok(()));
    }

    /// A device that never ends is read to the limit and refused, not to the end of memory.
    #[cfg(unix)]
    #[test]
    fn an_endless_device_is_refused() {
        let err = read_bytes(Path::new("/dev/zero"), "run file", 1 << 20).unwrap_err();
        assert!(err.contains("larger than 1 MiB"), "{err}");
    }
}
