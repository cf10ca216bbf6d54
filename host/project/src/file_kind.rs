//! What a file handed to the wrong reader is, so that the refusal names the command that
//! reads it instead of a parser's error: one command's output fed to another (a
//! `runner measure` file given as a calibration file, a fitted profile given to `--ops`,
//! a JSON report given as input). nccl-tests' logs are told apart as before
//! (`nccl_tests::is_log`), through the same door.

use crate::nccl_tests;

/// The reader a file was given to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reader {
    /// `runner calibrate FILE`, `runner validate FILE`: published runs as `[[point]]` TOML.
    Calibration,
    /// `--ops`, `--measured`: a `runner measure` file (JSON).
    Measurement,
    /// `--collectives`: a `bench collectives` file (JSON) or nccl-tests' output.
    Collectives,
}

impl Reader {
    fn what(self) -> &'static str {
        match self {
            Reader::Calibration => "a calibration file",
            Reader::Measurement => "a `runner measure` file",
            Reader::Collectives => "a collective sweep",
        }
    }
}

/// The kinds of file runner reads or writes that a reader can tell from their text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    NcclLog,
    /// `runner measure -o FILE.json`.
    Measurement,
    /// A JSON array: `runner bench collectives -o FILE.json`.
    JsonArray,
    /// Any other JSON object: a report one of runner's commands wrote with
    /// `--format json` (`run`, `explore`, `train`, `project`, ...), output, not input.
    Report,
    /// TOML with `[[gpu]]` tables: a GPU profile (`calibrate -o` writes one).
    Profile,
    /// TOML with `[[point]]` tables: published runs.
    Calibration,
}

fn kind(text: &str) -> Option<Kind> {
    if nccl_tests::is_log(text) {
        return Some(Kind::NcclLog);
    }
    let start = text.trim_start();
    if start.starts_with('{') || start.starts_with('[') {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Array(_)) => return Some(Kind::JsonArray),
            Ok(serde_json::Value::Object(o)) => {
                let measured = o.get("format").and_then(|f| f.as_str()) == Some(crate::measured::FORMAT);
                // An empty object, or one with a `format` of its own, is a measurement
                // file gone wrong: its parser's error says what is missing or odd.
                return if measured {
                    Some(Kind::Measurement)
                } else if o.is_empty() || o.contains_key("format") {
                    None
                } else {
                    Some(Kind::Report)
                };
            }
            // Broken JSON: its parser's error says where. A TOML profile's first line,
            // `[[gpu]]`, starts as a JSON array would: read on as TOML.
            _ if start.starts_with('{') => return None,
            _ => {}
        }
    }
    let table: toml::Table = toml::from_str(text).ok()?;
    let tables = |key: &str| table.get(key).and_then(|v| v.as_array()).is_some_and(|a| !a.is_empty() && a.iter().all(|t| t.is_table()));
    if tables("gpu") {
        Some(Kind::Profile)
    } else if tables("point") {
        Some(Kind::Calibration)
    } else {
        None
    }
}

/// The message for `text` (from `origin`) given to `reader`, whose parse failed, where
/// the text is a file of another kind; `None` where it is not (the parser's own error
/// stands) or is of the reader's own kind.
pub(crate) fn misplaced(text: &str, origin: &str, reader: Reader) -> Option<String> {
    let what = reader.what();
    let found = kind(text)?;
    let fix = match (found, reader) {
        (Kind::NcclLog, Reader::Collectives)
        | (Kind::Measurement, Reader::Measurement)
        | (Kind::JsonArray, Reader::Collectives)
        | (Kind::Calibration, Reader::Calibration) => return None,
        (Kind::NcclLog, _) => return Some(nccl_tests::misplaced(origin, what)),
        (Kind::Measurement, _) => format!(
            "this is a `runner measure` file, not {what}: fit a profile to it with `runner calibrate --ops {origin} --gpu NAME \
             -o FILE.toml`, or project with its times with `runner project ... --measured {origin}`"
        ),
        (Kind::JsonArray, _) => format!(
            "this is a JSON array (a `runner bench collectives` file?), not {what}: fit a profile's collectives to it with \
             `runner calibrate --collectives {origin} --gpu NAME`"
        ),
        (Kind::Report, _) => format!(
            "this is a JSON report (the output of a runner command's `--format json`: run, explore, train, project, ...), \
             not {what}: reports are output, not input; {}",
            match reader {
                Reader::Calibration => "a calibration file lists published runs as [[point]] tables in TOML, as \
                                        host/project/data/calibration.toml does",
                Reader::Measurement => "write a measurement with `runner measure ... -o FILE.json`",
                Reader::Collectives => "write a sweep with `runner bench collectives ... -o FILE.json`, or give nccl-tests' own output",
            }
        ),
        (Kind::Profile, _) => format!(
            "this is a GPU profile ([[gpu]] tables, as `runner calibrate ... -o FILE.toml` writes), not {what}: use it with \
             `--profile {origin}` (runner --profile {origin} project ...)"
        ),
        (Kind::Calibration, _) => format!(
            "this is a calibration file of published runs ([[point]] tables), not {what}: check a profile against it with \
             `runner validate {origin}`, or fit one with `runner calibrate {origin}`"
        ),
    };
    Some(format!("{origin}: {fix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEASURE: &str = r#"{"format": "runner-measured-ops", "version": 1, "ops": []}"#;
    const REPORT: &str = "{\n  \"model\": \"llama3\",\n  \"series\": []\n}\n";
    const PROFILE: &str = "[[gpu]]\nname = \"cpu-box\"\nmemory_gib = 16.0\n\n[gpu.peak_tflops]\nbf16 = 1.0\n";
    const POINTS: &str = "[[point]]\nsource = \"s\"\nmodel = \"m\"\n";
    const SWEEP: &str = r#"[{"op": "all_reduce", "size_bytes": 1024}]"#;

    /// Each kind given to each other reader names the command that reads it; a file of
    /// the reader's own kind, or of no kind told, is left to the parser's own error.
    /// Kills: any kind's detection dropped (the parser's error comes back: `None`), a
    /// kind's own reader intercepted, the JSON array read as a report.
    #[test]
    fn each_kind_given_to_another_reader_names_its_own_command() {
        let m = |t: &str, r: Reader| misplaced(t, "f", r);
        let e = m(MEASURE, Reader::Calibration).unwrap();
        assert!(e.starts_with("f: this is a `runner measure` file, not a calibration file: fit a profile to it with `runner calibrate --ops f"), "{e}");
        assert!(m(MEASURE, Reader::Collectives).unwrap().contains("--ops f"));
        assert_eq!(m(MEASURE, Reader::Measurement), None);
        assert_eq!(m("{}", Reader::Measurement), None, "an empty object is a measurement missing its fields");
        assert_eq!(m(r#"{"format": "other"}"#, Reader::Measurement), None);
        let e = m(REPORT, Reader::Calibration).unwrap();
        assert!(e.starts_with("f: this is a JSON report") && e.contains("reports are output, not input; a calibration file lists published runs as [[point]]"), "{e}");
        assert!(m(REPORT, Reader::Measurement).unwrap().ends_with("write a measurement with `runner measure ... -o FILE.json`"));
        let e = m(PROFILE, Reader::Measurement).unwrap();
        assert!(e.starts_with("f: this is a GPU profile ([[gpu]] tables") && e.contains("not a `runner measure` file: use it with `--profile f`"), "{e}");
        assert!(m(PROFILE, Reader::Calibration).unwrap().contains("use it with `--profile f`"));
        assert!(m(PROFILE, Reader::Collectives).unwrap().contains("use it with `--profile f`"));
        let e = m(POINTS, Reader::Measurement).unwrap();
        assert!(e.contains("this is a calibration file of published runs ([[point]] tables), not a `runner measure` file: check"), "{e}");
        assert_eq!(m(POINTS, Reader::Calibration), None);
        assert!(m(SWEEP, Reader::Calibration).unwrap().contains("`runner calibrate --collectives f --gpu NAME`"));
        assert_eq!(m(SWEEP, Reader::Collectives), None);
        // Broken JSON, or TOML of no kind told: the parser's error.
        assert_eq!(m("{\"model\": ", Reader::Calibration), None);
        assert_eq!(m("[model]\nname = \"x\"\n", Reader::Measurement), None);
    }
}
