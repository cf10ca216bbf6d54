//! The run file: what to run, on which cluster, priced by which clouds. Parsed strictly:
//! a TOML syntax error points at its line and column, and an unknown key is an error
//! (a typo must never be silently ignored).
//!
//! ```toml
//! [model]
//! plugin = "llama3.wasm"
//! variant = "llama3.1-70b"
//!
//! [cluster]
//! gpu = "H100"
//! gpus = [64, 128, 256, 512, 1024, 2048]
//! gbs = 128              # global batch; default: the variant's published rule
//! profile = "mine.toml"  # GPU profile overrides (as --profile)
//!
//! [precision]
//! format = "fp8"          # bf16 | fp8 | fp8-cs | mxfp8 | nvfp4
//! plugin = "fp8.wasm"     # default: the plugin named after the format, else built in
//!
//! [cost]
//! plugins = ["aws.wasm", "gcp.wasm"]   # default: every installed cost plugin
//! option = "on-demand"
//!
//! [measure]
//! repeats = 3          # timed CPU training steps after one warm-up
//! recompute = "none"   # activation recompute of the measured step: none | selective | full
//!
//! [limits]
//! memory_mib = 256
//! call_timeout_ms = 10000
//! ```

use std::path::Path;

use runner_graph::recompute::RecomputePolicy;
use runner_project::precision::Recipe;
use serde::{Deserialize, Serialize};

use crate::plugin::Limits;

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunFile {
    pub model: ModelSection,
    #[serde(default)]
    pub cluster: ClusterSection,
    #[serde(default)]
    pub precision: PrecisionSection,
    #[serde(default)]
    pub cost: CostSection,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub measure: MeasureSection,
}

/// How long to spend measuring on the local device.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MeasureSection {
    /// Timed training steps after one warm-up; more gives tighter figures.
    pub repeats: usize,
    /// Activation recomputation of the measured step (Megatron's
    /// `--recompute-granularity`): `none`, `selective` (attention cores) or `full`
    /// (every layer's forward re-run in the backward).
    pub recompute: RecomputePolicy,
}

impl Default for MeasureSection {
    fn default() -> Self {
        MeasureSection {
            repeats: 3,
            recompute: RecomputePolicy::None,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// Workload plugin: a path, or a name found in the plugin directories or embedded.
    pub plugin: String,
    /// Variant name; default: the plugin's first variant.
    pub variant: Option<String>,
    /// Sequence length; default: the variant's training default.
    pub seq_len: Option<u32>,
    /// Tokens to train; default: the variant's training default.
    pub tokens: Option<f64>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    pub gpu: String,
    /// GPU counts; each is rounded up to whole nodes of the GPU's node size.
    pub gpus: Vec<u32>,
    /// Global batch in sequences; default: the variant's published rule.
    pub gbs: Option<u32>,
    /// A GPU profile file merged over the built-in profiles.
    pub profile: Option<String>,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            gpu: "H100".into(),
            gpus: vec![8, 16, 32, 64, 128, 256, 512, 1024, 2048],
            gbs: None,
            profile: None,
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PrecisionSection {
    /// bf16, fp8, fp8-cs, mxfp8 or nvfp4.
    pub format: String,
    /// A precision plugin; default: the one named after the format if installed, else
    /// the built-in plan of that name.
    pub plugin: Option<String>,
}

impl Default for PrecisionSection {
    fn default() -> Self {
        PrecisionSection {
            format: "bf16".into(),
            plugin: None,
        }
    }
}

impl PrecisionSection {
    /// The format as a recipe (checked when the file is parsed).
    pub fn recipe(&self) -> Recipe {
        Recipe::parse(&self.format).unwrap_or(Recipe::Bf16)
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CostSection {
    /// Cost plugins to price with; empty: every installed cost plugin.
    pub plugins: Vec<String>,
    /// Region; empty: the cheapest region each cloud prices.
    pub region: String,
    /// on-demand, spot, reserved-1y, reserved-3y.
    pub option: String,
}

impl Default for CostSection {
    fn default() -> Self {
        CostSection {
            plugins: Vec::new(),
            region: String::new(),
            option: "on-demand".into(),
        }
    }
}

/// Parse a run file's text. `origin` names it in errors.
///
/// # Errors
/// The TOML error (with line and column) or the rule the file breaks, and how to fix it.
pub fn parse(text: &str, origin: &str) -> Result<RunFile, String> {
    let run: RunFile = toml::from_str(text).map_err(|e| format!("{origin}: {e}"))?;
    check(&run).map_err(|m| format!("{origin}: {m}"))?;
    Ok(run)
}

/// Read and parse a run file.
pub fn load(path: &Path) -> Result<RunFile, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read run file {}: {e}", path.display()))?;
    parse(&text, &path.display().to_string())
}

fn check(run: &RunFile) -> Result<(), String> {
    if run.model.plugin.trim().is_empty() {
        return Err(
            "[model] plugin is empty; name a workload plugin, e.g. plugin = \"llama3.wasm\"".into(),
        );
    }
    if run.cluster.gpus.is_empty() {
        return Err("[cluster] gpus is empty; list GPU counts, e.g. gpus = [64, 128, 256]".into());
    }
    use runner_contract::limits::{GPUS, SEQ_LEN, TOKENS};
    if let Some(&bad) = run.cluster.gpus.iter().find(|&&g| g == 0 || g > GPUS) {
        return Err(format!(
            "[cluster] gpus contains {bad}; every GPU count must be in 1..={GPUS}"
        ));
    }
    if run.cluster.profile.is_none() {
        runner_project::profile::Profiles::builtin()
            .get(&run.cluster.gpu)
            .map_err(|m| format!("[cluster] gpu: {m}"))?;
    }
    if run.cluster.gbs == Some(0) {
        return Err("[cluster] gbs must be at least 1".into());
    }
    Recipe::parse(&run.precision.format).map_err(|m| format!("[precision] format: {m}"))?;
    if let Some(t) = run.model.tokens
        && !(t.is_finite() && t > 0.0 && t <= TOKENS)
    {
        return Err(format!(
            "[model] tokens must be a positive number up to {TOKENS:e}, got {t}"
        ));
    }
    if let Some(s) = run.model.seq_len
        && !(1..=SEQ_LEN).contains(&s)
    {
        return Err(format!("[model] seq_len must be in 1..={SEQ_LEN}, got {s}"));
    }
    parse_option(&run.cost.option)?;
    if run.measure.repeats < 1 || run.measure.repeats > 1000 {
        return Err(format!(
            "[measure] repeats must be in 1..=1000, got {}",
            run.measure.repeats
        ));
    }
    if run.limits.memory_mib < 1 || run.limits.call_timeout_ms < 1 {
        return Err("[limits] memory_mib and call_timeout_ms must be at least 1".into());
    }
    Ok(())
}

/// Parse a purchase option as run files write it.
pub fn parse_option(s: &str) -> Result<crate::plugin::cost::PurchaseOption, String> {
    use crate::plugin::cost::{PURCHASE_OPTIONS, option_name};
    crate::plugin::cost::parse_option(s).ok_or_else(|| {
        let names: Vec<&str> = PURCHASE_OPTIONS.iter().map(|&o| option_name(o)).collect();
        format!(
            "[cost] option '{s}' is not one of {} (reserved-1y and reserved-3y also name the no-upfront terms)",
            names.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_file_gets_defaults() {
        let run = parse("[model]\nplugin = \"llama3.wasm\"\n", "t.toml").unwrap();
        assert_eq!(run.cluster.gpu, "H100");
        assert_eq!(run.precision.recipe(), Recipe::Bf16);
        assert_eq!(run.limits, Limits::default());
    }

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        let err = parse("[model]\nplugin = \"x\"\nvarient = \"y\"\n", "t.toml").unwrap_err();
        assert!(err.contains("varient"), "{err}");
        assert!(err.contains("line 3"), "{err}");
    }

    #[test]
    fn recompute_policy_is_read_and_checked() {
        let run = parse(
            "[model]\nplugin = \"x\"\n[measure]\nrecompute = \"full\"\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(run.measure.recompute, RecomputePolicy::Full);
        let err = parse(
            "[model]\nplugin = \"x\"\n[measure]\nrecompute = \"partial\"\n",
            "t.toml",
        )
        .unwrap_err();
        assert!(
            err.contains("partial") && err.contains("selective") && err.contains("line 4"),
            "{err}"
        );
    }

    #[test]
    fn syntax_error_points_at_line_and_column() {
        let err = parse("[model]\nplugin = \"x\n", "t.toml").unwrap_err();
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("column"), "{err}");
    }

    #[test]
    fn bad_values_name_the_fix() {
        let err = parse(
            "[model]\nplugin = \"x\"\n[cluster]\ngpus = [8, 0]\n",
            "t.toml",
        )
        .unwrap_err();
        assert!(err.contains("in 1..=1048576"), "{err}");
        let err = parse(
            "[model]\nplugin = \"x\"\n[cluster]\ngpu = \"H999\"\n",
            "t.toml",
        )
        .unwrap_err();
        assert!(err.contains("known: a100-40gb"), "{err}");
        let err = parse("[model]\nplugin = \"x\"\n[precision]\nformat = \"int8\"\n", "t.toml").unwrap_err();
        assert!(err.contains("[precision] format") && err.contains("nvfp4"), "{err}");
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::parse;

        /// A value as TOML writes it, chosen to hit the edges.
        fn value() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("0".to_string()),
                Just("-1".to_string()),
                Just("4294967296".to_string()),
                Just("18446744073709551616".to_string()),
                Just("nan".to_string()),
                Just("inf".to_string()),
                Just("1e300".to_string()),
                Just("\"llama3.wasm\"".to_string()),
                Just("\"\\u001b[2J\"".to_string()),
                Just("\"on-demand\"".to_string()),
                Just("\"reserved-3y\"".to_string()),
                Just("\"fp8\"".to_string()),
                Just("\"full\"".to_string()),
                Just("[8, 64]".to_string()),
                Just("[0]".to_string()),
                Just("[]".to_string()),
                Just("[\"aws\", 3]".to_string()),
                any::<i64>().prop_map(|v| v.to_string()),
                "\"[ -~]{0,12}\"",
            ]
        }

        /// A run file: sections and keys from the real set and beyond, random values.
        fn run_file() -> impl Strategy<Value = String> {
            let section = prop::sample::select(vec![
                "model",
                "cluster",
                "precision",
                "cost",
                "limits",
                "measure",
                "clustr",
            ]);
            let key = prop::sample::select(vec![
                "plugin",
                "variant",
                "seq_len",
                "tokens",
                "gpu",
                "gpus",
                "format",
                "plugins",
                "option",
                "region",
                "memory_mib",
                "call_timeout_ms",
                "repeats",
                "recompute",
                "varient",
            ]);
            prop::collection::vec((section, prop::collection::vec((key, value()), 0..4)), 0..5)
                .prop_map(|sections| {
                    let mut text = String::from("[model]\nplugin = \"llama3.wasm\"\n");
                    for (section, pairs) in sections {
                        text.push_str(&format!("[{section}]\n"));
                        for (k, v) in pairs {
                            text.push_str(&format!("{k} = {v}\n"));
                        }
                    }
                    text
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

            #[test]
            fn random_run_files_parse_or_say_why(text in run_file()) {
                match parse(&text, "p.toml") {
                    Ok(run) => {
                        // What parses must survive the re-check the command line does.
                        let again = toml::to_string(&run).unwrap();
                        prop_assert_eq!(parse(&again, "again").unwrap(), run);
                    }
                    Err(e) => {
                        prop_assert!(e.starts_with("p.toml: ") && e.len() > "p.toml: ".len() + 10, "{}", e);
                    }
                }
            }

            #[test]
            fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
                if let Err(e) = parse(&text, "p.toml") {
                    prop_assert!(e.starts_with("p.toml: "), "{}", e);
                }
            }
        }
    }
}
