//! Strings from a plugin. Names (instances, regions, variants, tensors) must be short and
//! printable, or they are refused; free text (citations, sources, warnings) must be
//! printable and bounded; text that cannot be refused (a plugin's own error message, its
//! stderr, a log line) is escaped with [`escape`] before anyone prints it.
//!
//! "Printable" excludes every Unicode control character (ESC starts terminal sequences, CR
//! and LF forge lines) and the bidirectional overrides that reorder what a reader sees.
//! [`escape`] also writes the characters that show as nothing ([`is_invisible`]), which
//! names and free text may hold.

/// Longest name, and longest free text, in bytes.
pub const MAX_NAME: usize = 256;
pub const MAX_TEXT: usize = 4096;

/// Characters that change how a terminal shows the text around them.
pub fn is_unsafe(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Characters that show as nothing: the zero-width space, non-joiner and joiner
/// (U+200B..U+200D), the bidirectional marks (LRM and RLM U+200E..U+200F, the Arabic letter
/// mark U+061C), the word joiner and invisible operators (U+2060..U+2064), a BOM inside
/// text (U+FEFF), the soft hyphen (U+00AD) and the Mongolian vowel separator (U+180E).
/// Harmless to a terminal, but text holding one reads as other text: a name as a known
/// name, a log line hiding what it says (the marks also move neutral characters; Boucher
/// and Anderson, "Trojan Source: Invisible Vulnerabilities", arXiv:2111.00169,
/// CVE-2021-42574). Not [`is_unsafe`]: a ZWJ joins emoji and a ZWNJ spells Persian, so
/// text holding one is not refused; it is shown escaped.
pub fn is_invisible(c: char) -> bool {
    matches!(c, '\u{ad}' | '\u{61c}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{2060}'..='\u{2064}' | '\u{feff}')
}

/// Whether [`escape`] writes `c` as an escape: [`is_unsafe`] or [`is_invisible`].
pub fn is_escaped(c: char) -> bool {
    is_unsafe(c) || is_invisible(c)
}

/// `s` with every unsafe or invisible character ([`is_escaped`]) written as a visible
/// escape (`\n`, `\u{1b}`, `\u{200b}`) and cut to `max` bytes (on a character boundary)
/// with the number of bytes left out.
pub fn escape(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max) + 16);
    for (i, c) in s.char_indices() {
        if out.len() >= max {
            out.push_str(&format!(" [{} more bytes]", s.len() - i));
            return out;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if is_escaped(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// A value quoted for an error message: escaped, at most 64 bytes.
pub fn shown(s: &str) -> String {
    format!("'{}'", escape(s, 64))
}

/// A number for an error message: plain where that is short, else in scientific notation
/// (`{}` of 1e300 is 301 digits: a slipped unit or a hostile value would fill the screen).
pub fn number(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-3..1e6).contains(&v.abs()) { format!("{v:e}") } else { format!("{v}") }
}

/// "1 node", "2 nodes": a count and its noun, plural unless the count is 1 (the
/// runner's `report::plural`; the contract cannot link the runner).
pub fn count(n: impl std::fmt::Display, noun: &str) -> String {
    let n = n.to_string();
    format!("{n} {noun}{}", if n == "1" { "" } else { "s" })
}

/// A name: non-empty, at most [`MAX_NAME`] bytes, printable.
///
/// # Errors
/// Names `field` and shows the value escaped.
pub fn name(field: &str, value: &str) -> Result<(), String> {
    if value.trim().is_empty() {
        return Err(format!("{field} is empty"));
    }
    printable(field, value, MAX_NAME)
}

/// Free text: at most [`MAX_TEXT`] bytes, printable (may be empty).
///
/// # Errors
/// Names `field`, its length or the first unsafe character.
pub fn free(field: &str, value: &str) -> Result<(), String> {
    printable(field, value, MAX_TEXT)
}

fn printable(field: &str, value: &str, max: usize) -> Result<(), String> {
    if value.len() > max {
        return Err(format!(
            "{field} is {} bytes long (at most {max}): {}",
            value.len(),
            shown(value)
        ));
    }
    if let Some(c) = value.chars().find(|&c| is_unsafe(c)) {
        return Err(format!(
            "{field} {} contains the control character U+{:04X}; plugin text must be printable",
            shown(value),
            c as u32
        ));
    }
    Ok(())
}

/// An ISO date `YYYY-MM-DD` (a real calendar day), or empty for "undated".
///
/// # Errors
/// Names `field` and the value.
pub fn date(field: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    let bad = || format!("{field} {} is not an ISO date (YYYY-MM-DD)", shown(value));
    let b = value.as_bytes();
    if !value.is_ascii() || b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| {
        let part = &value[r];
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse::<u32>().ok())
            .flatten()
    };
    let (Some(y), Some(m), Some(d)) = (num(0..4), num(5..7), num(8..10)) else {
        return Err(bad());
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return Err(bad()),
    };
    if d == 0 || d > days || y < 1970 {
        return Err(bad());
    }
    Ok(())
}

/// An ISO 4217 currency code: three upper-case ASCII letters.
///
/// # Errors
/// Names the value.
pub fn currency(value: &str) -> Result<(), String> {
    if value.len() == 3 && value.bytes().all(|b| b.is_ascii_uppercase()) {
        Ok(())
    } else {
        Err(format!(
            "currency {} is not an ISO 4217 code such as \"USD\"",
            shown(value)
        ))
    }
}

/// A list no longer than `max`.
///
/// # Errors
/// Names `what` and both lengths.
pub fn at_most(what: &str, len: usize, max: usize) -> Result<(), String> {
    if len > max {
        Err(format!("{len} {what} (at most {max})"))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_terminal_sequences_and_cuts() {
        assert_eq!(escape("a\x1b[2Jb\nc", 100), "a\\u{1b}[2Jb\\nc");
        assert_eq!(escape("\u{202e}x", 100), "\\u{202e}x");
        let long = "x".repeat(100);
        assert_eq!(escape(&long, 10), "xxxxxxxxxx [90 more bytes]");
    }

    #[test]
    fn names_are_refused_with_the_field() {
        assert!(name("instance", "p5.48xlarge").is_ok());
        let e = name("instance", "p5\x1b[31m").unwrap_err();
        assert!(
            e.contains("instance") && e.contains("\\u{1b}") && e.contains("U+001B"),
            "{e}"
        );
        assert!(
            name("region", "  ")
                .unwrap_err()
                .contains("region is empty")
        );
        assert!(
            name("gpu", &"H".repeat(300))
                .unwrap_err()
                .contains("300 bytes")
        );
        assert!(free("source", "line\nforged").is_err());
        assert!(free("source", "").is_ok());
    }

    #[test]
    fn dates_are_real_days() {
        for ok in ["", "2026-11-29", "2024-02-29"] {
            assert!(date("d", ok).is_ok(), "{ok}");
        }
        for bad in [
            "2026-13-01",
            "2025-02-29",
            "26-11-29",
            "2026/11/29",
            "2026-11-2x",
            "yesterday",
            "2026-+1-29",
            "202\u{e9}-11-29",
        ] {
            assert!(date("d", bad).is_err(), "{bad}");
        }
        assert!(currency("USD").is_ok() && currency("usd").is_err() && currency("US$").is_err());
    }

    /// A count reads "1 node", else "N nodes" (the contract's quote refusal said
    /// "node(s)"). Kills: the singular for every count, or for none.
    #[test]
    fn counts_are_singular_only_for_one() {
        assert_eq!(count(1, "node"), "1 node");
        assert_eq!(count(0, "node"), "0 nodes");
        assert_eq!(count(18, "GPU"), "18 GPUs");
    }

    /// The bounds themselves (a mutation audit found each could move unnoticed): a name of
    /// exactly MAX_NAME bytes passes and one byte more does not; a day 00, a year before
    /// 1970 and a 29 February of a century that is not a leap year are no dates; a currency
    /// is three letters, not four.
    #[test]
    fn bounds_hold_at_the_edge() {
        assert!(name("gpu", &"H".repeat(MAX_NAME)).is_ok());
        assert!(name("gpu", &"H".repeat(MAX_NAME + 1)).unwrap_err().contains("257 bytes"));
        assert!(free("source", &"s".repeat(MAX_TEXT)).is_ok());
        assert!(free("source", &"s".repeat(MAX_TEXT + 1)).is_err());
        for bad in ["2026-11-00", "1969-12-31", "2100-02-29", "1900-02-29"] {
            assert!(date("d", bad).is_err(), "{bad}");
        }
        for ok in ["1970-01-01", "2000-02-29", "2026-12-31"] {
            assert!(date("d", ok).is_ok(), "{ok}");
        }
        assert!(currency("USDX").is_err() && currency("EU").is_err());
    }

    /// The bidirectional isolates (U+2066..U+2069) reorder text as the overrides do.
    #[test]
    fn bidi_isolates_are_unsafe_too() {
        for c in ['\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}', '\u{202a}', '\u{202e}'] {
            assert!(is_unsafe(c), "{c:?}");
            assert!(name("region", &format!("us{c}east")).is_err(), "{c:?}");
        }
        assert_eq!(escape("a\u{2067}b", 100), "a\\u{2067}b");
        assert!(!is_unsafe('\u{2065}') && !is_unsafe('\u{202f}'));
    }

    /// Each class of character that shows as nothing is escaped, at both ends of its range
    /// (zero-width space and joiners, the bidi marks, the word joiner and invisible
    /// operators, the BOM, the soft hyphen and the Mongolian vowel separator), beside the
    /// control characters and bidi overrides, in the same notation; its neighbours are not;
    /// names and free text holding one still pass (a ZWJ joins emoji).
    #[test]
    fn invisible_characters_are_escaped_not_refused() {
        for c in ['\u{200b}', '\u{200c}', '\u{200d}', '\u{200e}', '\u{200f}', '\u{61c}', '\u{2060}', '\u{2064}', '\u{feff}', '\u{ad}', '\u{180e}'] {
            assert!(is_invisible(c) && is_escaped(c) && !is_unsafe(c), "{c:?}");
            assert_eq!(escape(&format!("a{c}b"), 100), format!("a\\u{{{:x}}}b", c as u32), "{c:?}");
            assert!(name("region", &format!("us{c}east")).is_ok(), "{c:?}");
        }
        assert_eq!(escape("ab\u{200b}\u{202e}\u{1b}c", 100), "ab\\u{200b}\\u{202e}\\u{1b}c");
        for c in ['\u{200a}', '\u{2010}', '\u{2065}', '\u{fefe}', '\u{fe0f}', 'é'] {
            assert!(!is_escaped(c), "{c:?}");
            assert_eq!(escape(&format!("a{c}b"), 100), format!("a{c}b"), "{c:?}");
        }
    }
}

/// Whether `text` matches `pattern`, a glob where `*` matches any run of characters
/// (site selectors: `layers.*.mlp.*`).
pub fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let mut rest = text;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else if let Some(pos) = rest.find(part) {
            rest = &rest[pos + part.len()..];
        } else {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod glob_tests {
    use super::glob;

    #[test]
    fn glob_matches_prefix_suffix_and_middle() {
        assert!(glob("layers.*.mlp.*", "layers.3.mlp.up"));
        assert!(!glob("layers.*.mlp.*", "layers.3.attn.qkv"));
        assert!(glob("*head", "lm_head"));
        assert!(glob("exact", "exact"));
        assert!(!glob("exact", "exactly"));
        assert!(!glob("a*b*c", "acb"));
    }
}
