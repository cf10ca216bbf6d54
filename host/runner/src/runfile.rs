//! The run file: what to run, on which cluster, priced by which clouds. Parsed strictly:
//! a TOML syntax error points at its line and column, and an unknown key is an error
//! (a typo must never be silently ignored).
//!
//! ```toml
//! [model]
//! plugin = "llama3.wasm"
//! variant = "llama3.1-70b"
//! tokens = "15T"         # or 1.5e13; default: the variant's
//!
//! [cluster]
//! gpu = "H100"            # or several: ["H100", "H200", "B200"]
//! gpus = [64, 128, 256, 512, 1024, 2048]
//! gbs = 128              # global batch; default: the variant's published rule, capped off its range (docs/EXPLORER.md)
//! profile = "mine.toml"  # GPU profile overrides (as --profile)
//!
//! [precision]
//! format = "fp8"          # bf16 | fp8 | fp8-cs | mxfp8 | nvfp4, or several: ["bf16", "fp8"]
//! plugin = "fp8.wasm"     # one format only; default: the plugin named after the format, else built in
//!
//! [cost]
//! plugins = ["aws.wasm", "gcp.wasm"]   # default: every installed cloud
//! option = "on-demand"   # spot, reserved-1y, reserved-3y, one-year-all-upfront, ...
//! region = "us-east-1"   # default: the cheapest region of each cloud
//! price_file = "our-contract.csv"     # negotiated prices, SkyPilot catalog shape
//!
//! [layout]                     # fix what the layout search may choose (default: all free)
//! tp = 4
//! pp = 4
//! cp = 2
//! vp = 5
//!
//! [explore]
//! target_days = 30               # the cheapest run that finishes in 30 days
//! budget_usd = 2e6               # the fastest run within $2M (or "2M")
//! max_usd_per_day_saved = 50000  # sweet-spot rule; default 1 % of the cheapest run's cost
//!
//! [assumptions]                  # what quotes assume beyond the price lists
//! spot_interruptions_per_node_day = 0.033
//! checkpoint_interval_h = 1.0
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

use runner_contract::text::number;
use runner_graph::pipeline::PipelineSplit;
use runner_graph::recompute::RecomputePolicy;
use runner_project::precision::Recipe;
use runner_project::template::Dispatcher;
use serde::{Deserialize, Serialize};

use crate::plugin::Limits;
use crate::pricing::Assumptions;

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
    #[serde(default)]
    pub layout: LayoutSection,
    #[serde(default)]
    pub explore: ExploreSection,
    #[serde(default)]
    pub assumptions: Assumptions,
}

/// Parallel dimensions the layout search must keep (a published layout to reproduce, or
/// what a cluster's software supports); what is left out is searched.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LayoutSection {
    pub tp: Option<u32>,
    pub pp: Option<u32>,
    pub cp: Option<u32>,
    /// Virtual pipeline chunks per stage (interleaved 1F1B).
    pub vp: Option<u32>,
    pub ep: Option<u32>,
    pub etp: Option<u32>,
    /// Micro-batch, sequences.
    pub mbs: Option<u32>,
    /// Shard parameters, gradients and optimizer state (FSDP / ZeRO-3): true or false.
    pub fsdp: Option<bool>,
    /// Activation recompute: none, selective or full.
    pub recompute: Option<RecomputePolicy>,
    /// How the layers split over pipeline chunks: `{ embedding = 1, loss = 1 }` counts
    /// the embedding and the loss as a layer each (Megatron's
    /// `account_for_*_in_pipeline_split`), `{ embedding = 0, loss = 0 }` splits evenly;
    /// absent, the search tries both.
    pub pipeline_split: Option<PipelineSplit>,
    /// Layers per pipeline chunk whose activations go to host memory between forward and
    /// backward (Megatron's `cpu_offloading_num_layers`); absent: none.
    pub offload_layers: Option<u32>,
    /// The routed experts' MLP as fused grouped GEMMs (Megatron-Bridge's
    /// `cutedsl_fused_grouped_mlp`); absent: false, Megatron's default.
    pub fused_grouped_mlp: Option<bool>,
    /// The expert token dispatcher, Megatron's `moe_token_dispatcher_type`: `flex`
    /// (DeepEP or HybridEP) or `alltoall`; absent: flex.
    pub dispatcher: Option<Dispatcher>,
    /// The optimizer: `adamw` or `muon` (Megatron's dist_muon); absent: the one the
    /// workload plugin names, where the projection models it, else adamw.
    pub optimizer: Option<runner_project::step::Optimizer>,
}

impl LayoutSection {
    /// The search space these constraints leave.
    pub fn space(&self) -> runner_project::search::Space {
        runner_project::search::Space {
            tp: self.tp,
            pp: self.pp,
            cp: self.cp,
            vp: self.vp,
            ep: self.ep,
            etp: self.etp,
            mbs: self.mbs,
            fsdp: self.fsdp,
            recompute: self.recompute,
            recompute_layers: None,
            recompute_modules: None,
            ep_overlap: None,
            split: self.pipeline_split,
            offload_layers: self.offload_layers,
            optimizer: self.optimizer.unwrap_or_default(),
            kernels: runner_project::template::Kernels {
                fused_grouped_mlp: self.fused_grouped_mlp.unwrap_or(false),
                dispatcher: self.dispatcher.unwrap_or_default(),
            },
            pipeline: runner_project::step::PipelineKind::default(),
        }
    }

    /// "TP4 PP4 CP2 VP5" for notes; empty when nothing is fixed.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (name, v) in [("TP", self.tp), ("PP", self.pp), ("CP", self.cp), ("VP", self.vp), ("EP", self.ep), ("ETP", self.etp), ("MBS", self.mbs)] {
            if let Some(v) = v {
                parts.push(format!("{name}{v}"));
            }
        }
        if let Some(f) = self.fsdp {
            parts.push(if f { "FSDP".into() } else { "no FSDP".into() });
        }
        if let Some(r) = self.recompute {
            parts.push(format!("recompute {r:?}").to_lowercase());
        }
        if let Some(s) = self.pipeline_split {
            parts.push(if s.is_even() { "even pipeline split".into() } else { format!("pipeline split {}", s.label()) });
        }
        if let Some(n) = self.offload_layers {
            parts.push(format!("{n} layers' activations offloaded per chunk"));
        }
        if self.fused_grouped_mlp == Some(true) {
            parts.push("fused grouped MLP".into());
        }
        if self.dispatcher == Some(Dispatcher::AllToAll) {
            parts.push("alltoall dispatcher".into());
        }
        if let Some(o) = self.optimizer {
            parts.push(format!("optimizer {o:?}").to_lowercase());
        }
        parts.join(" ")
    }
}

/// The explorer's questions beyond the table.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ExploreSection {
    /// The cheapest run (GPU type, count, layout, precision, cloud) finishing within this many days.
    pub target_days: Option<f64>,
    /// The fastest run costing at most this many US dollars (a number, or a string such as "2M").
    #[serde(deserialize_with = "quantity")]
    pub budget_usd: Option<f64>,
    /// Sweet spot: the largest GPU count whose extra cost per day saved (against the next
    /// smaller count) stays under this; default 1 % of the series' cheapest run per day.
    pub max_usd_per_day_saved: Option<f64>,
}

/// A string or a list of strings, read as a list (`gpu = "H100"` or `gpu = ["H100", "B200"]`).
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    match OneOrMany::deserialize(d) {
        Ok(OneOrMany::One(s)) => Ok(vec![s]),
        Ok(OneOrMany::Many(v)) => Ok(v),
        Err(_) => Err(serde::de::Error::custom("expected a name or a list of names, e.g. \"H100\" or [\"H100\", \"B200\"]")),
    }
}

/// A number, or a string with a suffix as [`crate::input::quantity`] reads it ("15T").
fn quantity<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Quantity {
        Float(f64),
        Int(i64),
        Text(String),
    }
    match Quantity::deserialize(d) {
        Ok(Quantity::Float(v)) => Ok(Some(v)),
        Ok(Quantity::Int(v)) => Ok(Some(v as f64)),
        Ok(Quantity::Text(s)) => crate::input::quantity(&s).map(Some).map_err(serde::de::Error::custom),
        Err(_) => Err(serde::de::Error::custom("expected a number, e.g. 1.5e12, or a string with a suffix, e.g. \"15T\"")),
    }
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
    /// Tokens to train (a number, or a string such as "15T"); default: the variant's
    /// training default.
    #[serde(default, deserialize_with = "quantity")]
    pub tokens: Option<f64>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    /// GPU types: one series of rows each.
    #[serde(deserialize_with = "one_or_many")]
    pub gpu: Vec<String>,
    /// GPU counts; each is rounded up to whole nodes of the GPU's node size.
    pub gpus: Vec<u32>,
    /// Global batch in sequences; default: the variant's published rule, off its GPU range scaled per GPU up to the job's compute-optimal batch.
    pub gbs: Option<u32>,
    /// A GPU profile file merged over the built-in profiles.
    pub profile: Option<String>,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            gpu: vec!["H100".into()],
            gpus: vec![8, 16, 32, 64, 128, 256, 512, 1024, 2048],
            gbs: None,
            profile: None,
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PrecisionSection {
    /// bf16, fp8, fp8-cs, mxfp8 or nvfp4; several: one series of rows each.
    #[serde(deserialize_with = "one_or_many")]
    pub format: Vec<String>,
    /// A precision plugin (with one format only); default: the one named after each
    /// format if installed, else the built-in plan of that name.
    pub plugin: Option<String>,
}

impl Default for PrecisionSection {
    fn default() -> Self {
        PrecisionSection {
            format: vec!["bf16".into(), "fp8".into()],
            plugin: None,
        }
    }
}

impl PrecisionSection {
    /// The formats as recipes (checked when the file is parsed).
    pub fn recipes(&self) -> Vec<Recipe> {
        self.format.iter().filter_map(|f| Recipe::parse(f).ok()).collect()
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CostSection {
    /// Cost plugins to price with; empty: every installed cost plugin.
    pub plugins: Vec<String>,
    /// Region; empty: the cheapest region each cloud prices.
    pub region: String,
    /// on-demand, spot, reserved-1y, reserved-3y, capacity-block, one-year-all-upfront, ...
    pub option: String,
    /// A price list of the user's own (SkyPilot catalog CSV), priced by the generic
    /// price-file plugin alongside the clouds.
    pub price_file: Option<String>,
}

impl Default for CostSection {
    fn default() -> Self {
        CostSection {
            plugins: Vec::new(),
            region: String::new(),
            option: "on-demand".into(),
            price_file: None,
        }
    }
}

/// Parse a run file's text. `origin` names it in errors.
///
/// # Errors
/// The TOML error (with line and column) or the rule the file breaks, and how to fix it.
pub fn parse(text: &str, origin: &str) -> Result<RunFile, String> {
    if let Some(m) = section_as_list(text) {
        return Err(format!("{origin}: {}{m}", snippet(text, &m)));
    }
    let run: RunFile = toml::from_str(text).map_err(|e| match hint(e.message()) {
        Some(h) => format!("{origin}: {}\nhelp: {h}", e.to_string().trim_end()),
        None => format!("{origin}: {e}"),
    })?;
    check(&run).map_err(|m| format!("{origin}: {}{m}", snippet(text, &m)))?;
    Ok(run)
}

/// The run the command line's flags make (a run file's values with the flags over them,
/// as TOML), checked as a run file is; its errors name the key, not a line of a file the
/// user never wrote.
pub fn parse_flags(text: &str) -> Result<RunFile, String> {
    let run: RunFile = toml::from_str(text).map_err(|e| format!("command line: {e}"))?;
    check(&run).map_err(|m| format!("command line: {m}"))?;
    Ok(run)
}

/// Where a rule [`check`] found broken sits in the file, as TOML's own errors show it
/// (line, column, the line and a caret), or nothing when the key is not in the text.
/// Every message of `check` starts with `[section] key`, which is what is looked up; a key
/// left at its default (not in the file) points at its section's header.
fn snippet(text: &str, message: &str) -> String {
    let Some((section, rest)) = message.strip_prefix('[').and_then(|m| m.split_once("] ")) else {
        return String::new();
    };
    let key: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    let Ok(doc) = toml::de::DeTable::parse(text) else {
        return String::new();
    };
    let Some((name, value)) = doc.get_ref().iter().find(|(k, _)| k.get_ref() == section) else {
        return String::new();
    };
    let span = match value.get_ref() {
        toml::de::DeValue::Table(t) => t.iter().find(|(k, _)| k.get_ref() == key.as_str()).map_or(name.span(), |(_, v)| v.span()),
        _ => name.span(),
    };
    let start = span.start.min(text.len());
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let line = text[line_start..line_end].trim_end_matches('\r');
    let number = text[..start].matches('\n').count() + 1;
    let column = text[line_start..start].chars().count();
    let width = text[start..span.end.clamp(start, line_end)].chars().count().max(1);
    let gutter = " ".repeat(number.to_string().len());
    format!(
        "line {number}, column {}\n{gutter} |\n{number} | {}\n{gutter} | {}{}\n",
        column + 1,
        crate::report::visible(line),
        " ".repeat(column),
        "^".repeat(width)
    )
}

/// What to do about a TOML error a user can fix by spelling: an unknown key gets the
/// nearest known keys of its table (`gpuz`: `gpu` or `gpus`), or the section it belongs in
/// (`gpus` under `[model]`: `[cluster]`); a file without `[model]` gets the lines to start
/// with.
fn hint(error: &str) -> Option<String> {
    if error.contains("missing field `model`") || error.contains("missing field `plugin`") {
        return Some("a run file names its workload plugin first:\n[model]\nplugin = \"llama3.wasm\"\n(workloads/*.toml are examples)".into());
    }
    let unknown = error.split("unknown field `").nth(1)?.split('`').next()?.to_string();
    if unknown == "point" {
        return Some(
            "this is a calibration file of published runs ([[point]] tables): `runner validate FILE` projects them, \
             `runner calibrate FILE` fits to them; a run file starts with [model]"
                .into(),
        );
    }
    let expected: Vec<&str> = error.split("expected").nth(1)?.split('`').skip(1).step_by(2).collect();
    let distance = |a: &str, b: &str| -> usize {
        let (a, b): (Vec<char>, Vec<char>) = (a.to_lowercase().chars().collect(), b.to_lowercase().chars().collect());
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for i in 1..=a.len() {
            let mut diagonal = row[0];
            row[0] = i;
            for j in 1..=b.len() {
                let next = (row[j] + 1).min(row[j - 1] + 1).min(diagonal + usize::from(a[i - 1] != b[j - 1]));
                diagonal = row[j];
                row[j] = next;
            }
        }
        row[b.len()]
    };
    let best = expected.iter().map(|k| distance(&unknown, k)).min()?;
    if best <= 2.max(unknown.chars().count() / 3) {
        let near: Vec<String> = expected.iter().filter(|k| distance(&unknown, k) == best).map(|k| format!("`{k}`")).collect();
        return Some(format!("did you mean {}?", near.join(" or ")));
    }
    // A key of another section: where it goes.
    let home = SECTIONS.iter().find(|(_, keys)| keys().contains(&unknown))?;
    Some(format!("`{unknown}` goes in [{}]", home.0))
}

/// A section written as a list (`[[cluster]]`, `measure = [3]`), refused: serde reads a
/// list as the section's fields in order, so `measure = [3]` ran with repeats = 3 without
/// a word, and `[[cluster]]` was answered "expected a name or a list of names", about a
/// key the file never wrote.
fn section_as_list(text: &str) -> Option<String> {
    let doc = toml::de::DeTable::parse(text).ok()?;
    let (name, _) = doc
        .get_ref()
        .iter()
        .find(|(k, v)| SECTIONS.iter().any(|(s, _)| k.get_ref() == *s) && matches!(v.get_ref(), toml::de::DeValue::Array(_)))?;
    Some(format!("[{0}] is one table, not a list: write [{0}] with its keys under it (not [[{0}]] or {0} = [...])", name.get_ref()))
}

/// A section's keys.
type Keys = fn() -> Vec<String>;

/// Each section and its keys, for [`hint`] and [`section_as_list`].
const SECTIONS: &[(&str, Keys)] = &[
    ("model", keys::<ModelSection>),
    ("cluster", keys::<ClusterSection>),
    ("precision", keys::<PrecisionSection>),
    ("cost", keys::<CostSection>),
    ("limits", keys::<Limits>),
    ("measure", keys::<MeasureSection>),
    ("layout", keys::<LayoutSection>),
    ("explore", keys::<ExploreSection>),
    ("assumptions", keys::<Assumptions>),
];

/// A section's keys, as its deserializer lists them when it meets one it does not know
/// (every section denies unknown keys), so the list never drifts from the struct.
fn keys<T: serde::de::DeserializeOwned>() -> Vec<String> {
    match toml::from_str::<T>("zz_not_a_key = 0") {
        Err(e) => e.message().split("expected").nth(1).unwrap_or("").split('`').skip(1).step_by(2).map(str::to_string).collect(),
        Ok(_) => Vec::new(),
    }
}

/// Read and parse a run file.
///
/// Relative paths in it (`[cost] price_file`, `[cluster] profile`, and plugins given as
/// paths, `dir/x.wasm`) are taken from the run file's directory, so a run file runs the
/// same from anywhere; plugins named bare (`llama3.wasm`) are found as everywhere else.
pub fn load(path: &Path) -> Result<RunFile, String> {
    let text = crate::input::read_text(path, "run file", crate::input::TEXT_LIMIT)?;
    let mut run = parse(&text, &path.display().to_string())?;
    let dir = path.parent().unwrap_or(Path::new(""));
    // A run keeps its paths as text: in a directory whose name is not UTF-8, the lossy
    // name (U+FFFD for the odd bytes) was another file's, which the run could not find.
    let beside = |p: &mut String| -> Result<(), String> {
        if !p.is_empty() && Path::new(p.as_str()).is_relative() {
            let joined = dir.join(p.as_str());
            *p = joined
                .to_str()
                .ok_or_else(|| {
                    format!(
                        "{}: the name of the run file's directory is not UTF-8 text, so '{p}' beside it cannot be kept as \
                         text; move the run file and what it names to a directory with a UTF-8 name",
                        path.display()
                    )
                })?
                .to_string();
        }
        Ok(())
    };
    let is_path = |spec: &str| spec.contains(['/', '\\']);
    if let Some(p) = run.cost.price_file.as_mut() {
        beside(p)?;
    }
    if let Some(p) = run.cluster.profile.as_mut() {
        beside(p)?;
    }
    if is_path(&run.model.plugin) {
        beside(&mut run.model.plugin)?;
    }
    if let Some(p) = run.precision.plugin.as_mut().filter(|p| is_path(p)) {
        beside(p)?;
    }
    for p in run.cost.plugins.iter_mut().filter(|p| is_path(p)) {
        beside(p)?;
    }
    Ok(run)
}

/// The plugins the run file at `path` names (as loaded) that are not installed: each
/// refused with its line, before anything loads. `run` is the run after the command
/// line's flags: a plugin a flag replaced is not the file's to answer for.
///
/// # Errors
/// The first plugin no directory, path or embedded plugin provides, where the file
/// names it, and what was searched.
pub fn check_plugins(path: &Path, file: &RunFile, run: &RunFile) -> Result<(), String> {
    let model = [("model", "plugin", &file.model.plugin, run.model.plugin == file.model.plugin)];
    let precision = file.precision.plugin.iter().map(|p| ("precision", "plugin", p, run.precision.plugin.as_ref() == Some(p)));
    let cost = file.cost.plugins.iter().map(|p| ("cost", "plugins", p, run.cost.plugins.contains(p)));
    for (section, key, spec, kept) in model.into_iter().chain(precision).chain(cost) {
        if let (true, Err(m)) = (kept, crate::plugin::locate(spec)) {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let at = format!("[{section}] {key}");
            return Err(format!("{}: {}{at}: {m}", path.display(), snippet(&text, &at)));
        }
    }
    Ok(())
}

/// The most GPU counts one run lists (the goal searches' own list is 12).
pub const MAX_GPU_COUNTS: usize = 64;

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
    // Each count is a row of every series, searched in turn: 100 000 counts ran for
    // minutes in the repeat check alone before the first row, with no word.
    if run.cluster.gpus.len() > MAX_GPU_COUNTS {
        return Err(format!(
            "[cluster] gpus lists {} GPU counts; at most {MAX_GPU_COUNTS} (each is one row of every series)",
            run.cluster.gpus.len()
        ));
    }
    if let Some(&bad) = run.cluster.gpus.iter().find(|&&g| !within_gpu_ceiling(g)) {
        return Err(format!(
            "[cluster] gpus contains {bad}; every GPU count must be in 1..={GPUS}"
        ));
    }
    crate::input::refuse_repeated_gpu_counts("[cluster] gpus", &run.cluster.gpus)?;
    check_names("[cluster] gpu", &run.cluster.gpu)?;
    if run.cluster.profile.is_none() {
        for gpu in &run.cluster.gpu {
            runner_project::profile::Profiles::builtin().get(gpu).map_err(|m| format!("[cluster] gpu: {m}"))?;
        }
    }
    if run.cluster.gbs == Some(0) {
        return Err("[cluster] gbs must be at least 1".into());
    }
    check_names("[precision] format", &run.precision.format)?;
    for f in &run.precision.format {
        Recipe::parse(f).map_err(|m| format!("[precision] format: {m}"))?;
    }
    if run.precision.plugin.is_some() && run.precision.format.len() > 1 {
        return Err(format!(
            "[precision] plugin names one policy but format lists {}; give one format with a plugin, or drop the plugin \
             (each format then uses its own installed or built-in policy)",
            run.precision.format.len()
        ));
    }
    // Goals far outside what a training run is (a budget of $1e300, a deadline of 1e-300
    // days) are slips of the keyboard; refused, they cannot print as hundreds of digits.
    let within = |name: &str, v: Option<f64>, lo: f64, hi: f64| match v {
        Some(x) if !(x.is_finite() && (lo..=hi).contains(&x)) => {
            Err(format!("{name} must be a positive number from {} to {}, got {}", number(lo), number(hi), number(x)))
        }
        _ => Ok(()),
    };
    use runner_contract::limits::GPUS as MAX_WAY;
    for (name, v) in [
        ("tp", run.layout.tp),
        ("pp", run.layout.pp),
        ("cp", run.layout.cp),
        ("vp", run.layout.vp),
        ("ep", run.layout.ep),
        ("etp", run.layout.etp),
        ("mbs", run.layout.mbs),
    ] {
        if let Some(v) = v
            && !within_gpu_ceiling(v)
        {
            return Err(format!("[layout] {name} must be in 1..={MAX_WAY}, got {v}"));
        }
    }
    within("[explore] target_days", run.explore.target_days, 1e-3, 1e5)?;
    within("[explore] budget_usd", run.explore.budget_usd, 1.0, 1e12)?;
    within("[explore] max_usd_per_day_saved", run.explore.max_usd_per_day_saved, 0.01, 1e12)?;
    run.assumptions.check().map_err(|m| format!("[assumptions] {m}"))?;
    if run.cost.price_file.as_deref().is_some_and(|f| f.trim().is_empty()) {
        return Err("[cost] price_file is empty; name a CSV file or leave the key out".into());
    }
    // It read as "cannot read profile file : No such file or directory".
    if run.cluster.profile.as_deref().is_some_and(|f| f.trim().is_empty()) {
        return Err("[cluster] profile is empty; name a GPU profile TOML (as `runner calibrate -o` writes) or leave the key out".into());
    }
    if let Some(t) = run.model.tokens
        && !(t.is_finite() && t > 0.0 && t <= TOKENS)
    {
        return Err(format!(
            "[model] tokens must be a positive number up to {TOKENS:e}, got {}",
            number(t)
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
/// A non-empty list of distinct names.
fn check_names(what: &str, names: &[String]) -> Result<(), String> {
    if names.is_empty() {
        return Err(format!("{what} is an empty list; name at least one"));
    }
    if names.len() > 16 {
        return Err(format!("{what} lists {} names; at most 16", names.len()));
    }
    // Names are one in any case (h100, H100): the shared rule of list repeats, which says
    // to list it once (this said only "names 'H100' twice").
    let keyed: Vec<(String, String)> = names.iter().map(|n| (n.clone(), n.to_ascii_lowercase())).collect();
    crate::input::refuse_repeats(what, &keyed, "each is one series of rows")
}

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

/// The rule for a GPU count, a layout degree (tp, pp, cp, vp, ep, etp) and the micro-batch,
/// in a run file and on every command's flags: 1 to the contract's GPU ceiling (0 would
/// run nothing; past it, sizes stop being checked numbers).
pub fn within_gpu_ceiling(n: u32) -> bool {
    (1..=runner_contract::limits::GPUS).contains(&n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_file_gets_defaults() {
        let run = parse("[model]\nplugin = \"llama3.wasm\"\n", "t.toml").unwrap();
        assert_eq!(run.cluster.gpu, ["H100"]);
        assert_eq!(run.precision.recipes(), [Recipe::Bf16, Recipe::Fp8]);
        assert_eq!(run.limits, Limits::default());
    }

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        let err = parse("[model]\nplugin = \"x\"\nvarient = \"y\"\n", "t.toml").unwrap_err();
        assert!(err.contains("varient"), "{err}");
        assert!(err.contains("line 3"), "{err}");
    }

    /// A misspelt key is answered with the nearest keys of its table, a key in the wrong
    /// table with the one it goes in, a file without [model] with the lines to start with.
    /// Each said only which keys the table has.
    #[test]
    fn unknown_keys_name_the_nearest_key_or_their_section() {
        let err = parse("[model]\nplugin = \"x\"\n[cluster]\ngpuz = [8]\n", "t.toml").unwrap_err();
        assert!(err.contains("line 4") && err.ends_with("help: did you mean `gpu` or `gpus`?"), "{err}");
        let err = parse("[model]\nplugin = \"x\"\n[clustr]\ngpus = [8]\n", "t.toml").unwrap_err();
        assert!(err.ends_with("help: did you mean `cluster`?"), "{err}");
        let err = parse("[model]\nplugin = \"x\"\n[limits]\nmemory_mb = 3\n", "t.toml").unwrap_err();
        assert!(err.ends_with("help: did you mean `memory_mib`?"), "{err}");
        let err = parse("[model]\nplugin = \"x\"\ngpus = [8]\n", "t.toml").unwrap_err();
        assert!(err.ends_with("help: `gpus` goes in [cluster]"), "{err}");
        let err = parse("[model]\nplugin = \"x\"\n[cluster]\nnodes = 4\n", "t.toml").unwrap_err();
        assert!(!err.contains("help:"), "nothing near: {err}");
        let err = parse("[[point]]\nsource = \"s\"\n", "t.toml").unwrap_err();
        assert!(err.ends_with("help: this is a calibration file of published runs ([[point]] tables): `runner validate FILE` projects them, `runner calibrate FILE` fits to them; a run file starts with [model]"), "{err}");
        for text in ["", "[cluster]\ngpus = [8]\n", "[model]\nvariant = \"x\"\n"] {
            let err = parse(text, "t.toml").unwrap_err();
            assert!(err.contains("help: a run file names its workload plugin first:\n[model]\nplugin = \"llama3.wasm\""), "{err}");
        }
    }

    /// A value TOML reads but the run refuses (out of range, unknown name) points at its
    /// line and column as TOML's own errors do; a rule broken by a default points at the
    /// section. They named the key only.
    #[test]
    fn a_refused_value_names_its_line() {
        let err = parse("[model]\nplugin = \"x\"\n\n[measure]\nrepeats =  0\n", "t.toml").unwrap_err();
        assert_eq!(err, "t.toml: line 5, column 12\n  |\n5 | repeats =  0\n  |            ^\n[measure] repeats must be in 1..=1000, got 0");
        let err = parse("[model]\nplugin = \"x\"\n[cluster]\ngpu = \"H100\"\ngpus = [8, 0]\n", "t.toml").unwrap_err();
        assert!(err.starts_with("t.toml: line 5, column 8\n") && err.contains("5 | gpus = [8, 0]\n  |        ^^^^^^\n"), "{err}");
        let err = parse("[model]\nplugin = \"x\"\n[cost]\noption = \"spotty\"\n", "t.toml").unwrap_err();
        assert!(err.starts_with("t.toml: line 4, column 10\n") && err.contains("[cost] option 'spotty'"), "{err}");
        // Set in an inline table, and a rule no key of the file breaks: the section.
        let err = parse("model = { plugin = \"x\", seq_len = 0 }\n", "t.toml").unwrap_err();
        assert!(err.starts_with("t.toml: line 1, column 35\n"), "{err}");
        let err = parse("[model]\nplugin = \"x\"\n[precision]\nplugin = \"p.wasm\"\n", "t.toml").unwrap_err();
        assert!(err.starts_with("t.toml: line 4, column 10\n") && err.contains("one format with a plugin"), "{err}");
        // The flags' run has no file: the key is named, no line.
        let err = parse_flags("[model]\nplugin = \"x\"\n[measure]\nrepeats = 0\n").unwrap_err();
        assert_eq!(err, "command line: [measure] repeats must be in 1..=1000, got 0");
    }

    /// Tokens and budgets as people write them, in the file as on the command line.
    #[test]
    fn tokens_and_budget_take_suffixes() {
        let tmp = tempfile::Builder::new().prefix("runfile-quantity-").tempdir().unwrap();
        let dir = tmp.path();
        let path = dir.join("run.toml");
        std::fs::write(&path, "[model]\nplugin = \"llama3.wasm\"\ntokens = \"15T\"\n\n[explore]\nbudget_usd = \"$2M\"\n").unwrap();
        let file = load(&path).unwrap();
        assert_eq!((file.model.tokens, file.explore.budget_usd), (Some(15e12), Some(2e6)));
        std::fs::write(&path, "[model]\nplugin = \"llama3.wasm\"\ntokens = 1000000\n").unwrap();
        assert_eq!(load(&path).unwrap().model.tokens, Some(1e6));
        std::fs::write(&path, "[model]\nplugin = \"llama3.wasm\"\ntokens = \"15 trillion\"\n").unwrap();
        let err = load(&path).unwrap_err();
        assert!(err.contains("line 3") && err.contains("'15 trillion' is not a number") && err.contains("e.g. 15T"), "{err}");
    }

    /// A plugin the file names that is not installed is refused at its line before
    /// anything loads; one a flag replaced is not the file's error.
    #[test]
    fn a_missing_plugin_names_its_line() {
        let tmp = tempfile::Builder::new().prefix("runfile-plugins-").tempdir().unwrap();
        let dir = tmp.path();
        let path = dir.join("run.toml");
        std::fs::write(&path, "[model]\nplugin = \"llama3.wasm\"\n\n[cost]\nplugins = [\"lambda\", \"acme-cloud\"]\n").unwrap();
        let file = load(&path).unwrap();
        let err = check_plugins(&path, &file, &file).unwrap_err();
        assert!(err.contains("line 5, column 11\n") && err.contains("5 | plugins = [\"lambda\", \"acme-cloud\"]"), "{err}");
        assert!(err.contains("[cost] plugins: no plugin 'acme-cloud'"), "{err}");
        let mut flags = file.clone();
        flags.cost.plugins = vec!["lambda".into()];
        assert_eq!(check_plugins(&path, &file, &flags), Ok(()));
        std::fs::write(&path, "[model]\nplugin = \"llama9\"\n").unwrap();
        let file = load(&path).unwrap();
        let err = check_plugins(&path, &file, &file).unwrap_err();
        assert!(err.contains("line 2, column 10\n") && err.contains("[model] plugin: no plugin 'llama9'"), "{err}");
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

    /// `[layout] pipeline_split` fixes the split for the search, and a bad one names
    /// the field.
    #[test]
    fn pipeline_split_is_read() {
        let run = parse("[model]\nplugin = \"x\"\n[layout]\npipeline_split = { embedding = 1, loss = 1 }\n", "t.toml").unwrap();
        assert_eq!(run.layout.space().split, Some(PipelineSplit::megatron(true, true)));
        assert!(run.layout.describe().contains("pipeline split E1L1"));
        let err = parse("[model]\nplugin = \"x\"\n[layout]\npipeline_split = { embedding = 1, los = 1 }\n", "t.toml").unwrap_err();
        assert!(err.contains("los"), "{err}");
    }

    /// `[layout] offload_layers` fixes the offload for the search (absent: the search may
    /// offload to fit).
    #[test]
    fn offload_layers_are_read() {
        let run = parse("[model]\nplugin = \"x\"\n[layout]\noffload_layers = 20\n", "t.toml").unwrap();
        assert_eq!(run.layout.space().offload_layers, Some(20));
        assert!(run.layout.describe().contains("20 layers' activations offloaded"));
        let run = parse("[model]\nplugin = \"x\"\n", "t.toml").unwrap();
        assert_eq!(run.layout.space().offload_layers, None);
    }

    /// `[layout] fused_grouped_mlp` picks the fused routed-expert kernels for every
    /// layout the search tries (absent: Megatron's default, unfused).
    #[test]
    fn fused_grouped_mlp_is_read() {
        let run = parse("[model]\nplugin = \"x\"\n[layout]\nfused_grouped_mlp = true\n", "t.toml").unwrap();
        assert!(run.layout.space().kernels.fused_grouped_mlp);
        assert!(run.layout.describe().contains("fused grouped MLP"));
        let run = parse("[model]\nplugin = \"x\"\n", "t.toml").unwrap();
        assert!(!run.layout.space().kernels.fused_grouped_mlp);
    }

    /// `[layout] optimizer` picks the optimizer every layout trains with, by the names the
    /// `--optimizer` flag takes; absent, the run leaves it to the plugin (`space()` holds
    /// AdamW until the explorer asks the plugin). Another name is refused with the two.
    #[test]
    fn optimizer_is_read() {
        use runner_project::step::Optimizer;
        let run = parse("[model]\nplugin = \"x\"\n[layout]\noptimizer = \"dist_muon\"\n", "t.toml").unwrap();
        assert_eq!((run.layout.optimizer, run.layout.space().optimizer), (Some(Optimizer::Muon), Optimizer::Muon));
        assert!(run.layout.describe().contains("optimizer muon"), "{}", run.layout.describe());
        let run = parse("[model]\nplugin = \"x\"\n", "t.toml").unwrap();
        assert_eq!((run.layout.optimizer, run.layout.space().optimizer), (None, Optimizer::AdamW));
        let e = parse("[model]\nplugin = \"x\"\n[layout]\noptimizer = \"lion\"\n", "t.toml").unwrap_err();
        assert!(e.contains("unknown optimizer 'lion': use adamw or muon"), "{e}");
    }

    /// `[layout] dispatcher` picks the expert token dispatcher (absent: flex); a name
    /// Megatron does not have is refused with the ones it takes.
    #[test]
    fn dispatcher_is_read() {
        let run = parse("[model]\nplugin = \"x\"\n[layout]\ndispatcher = \"alltoall\"\n", "t.toml").unwrap();
        assert_eq!(run.layout.space().kernels.dispatcher, Dispatcher::AllToAll);
        assert!(run.layout.describe().contains("alltoall dispatcher"));
        let run = parse("[model]\nplugin = \"x\"\n", "t.toml").unwrap();
        assert_eq!(run.layout.space().kernels.dispatcher, Dispatcher::Flex);
        let e = parse("[model]\nplugin = \"x\"\n[layout]\ndispatcher = \"allgather\"\n", "t.toml").unwrap_err();
        assert!(e.contains("alltoall") && e.contains("flex"), "{e}");
        // The flex backends' names, as Megatron-Bridge's presets spell them.
        let run = parse("[model]\nplugin = \"x\"\n[layout]\ndispatcher = \"hybridep\"\n", "t.toml").unwrap();
        assert_eq!(run.layout.space().kernels.dispatcher, Dispatcher::Flex);
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
        let err = parse("[model]\nplugin = \"x\"\n[precision]\nformat = [\"fp8\", \"bf16\"]\nplugin = \"p\"\n", "t.toml")
            .unwrap_err();
        assert!(err.contains("one format with a plugin"), "{err}");
        let err = parse("[model]\nplugin = \"x\"\n[cluster]\ngpu = [\"h100\", \"H100\"]\n", "t.toml").unwrap_err();
        assert!(err.ends_with("[cluster] gpu gives h100 (as h100 and H100) twice: each is one series of rows; list it once"), "{err}");
        let err = parse("[model]\nplugin = \"x\"\n[precision]\nformat = [\"fp8\", \"bf16\", \"fp8\"]\n", "t.toml").unwrap_err();
        assert!(err.ends_with("[precision] format gives fp8 twice: each is one series of rows; list it once"), "{err}");
        let err = parse("[model]\nplugin = \"x\"\n[explore]\ntarget_days = -3\n", "t.toml").unwrap_err();
        assert!(err.contains("target_days must be a positive number"), "{err}");
        let err = parse("[model]\nplugin = \"x\"\n[explore]\nbudget_usd = 1e300\n", "t.toml").unwrap_err();
        assert!(err.contains("budget_usd must be a positive number from 1 to 1e12, got 1e300"), "{err}");
        let err = parse("[model]\nplugin = \"x\"\n[explore]\ntarget_days = 1e-300\n", "t.toml").unwrap_err();
        assert!(err.contains("from 0.001 to 100000, got 1e-300"), "{err}");
        let err = parse("[model]\nplugin = \"x\"\n[assumptions]\ncheckpoint_interval_h = 0\n", "t.toml").unwrap_err();
        assert!(err.contains("[assumptions] checkpoint_interval_h"), "{err}");
    }

    /// Every range and rule of `check` at its edge, each one a hand mutation audit could
    /// move or delete with the other tests passing (26 of 40 mutations of this file
    /// passed the crate's unit tests): the last value in range passes, the next is
    /// refused naming its key.
    #[test]
    fn every_rule_holds_at_its_edge() {
        let refused = |body: &str, words: &str| {
            let e = parse(&format!("[model]\nplugin = \"x\"\n{body}\n"), "t.toml").expect_err(body);
            assert!(e.contains(words), "{body}: {words:?} not in: {e}");
        };
        let accepted = |body: &str| {
            if let Err(e) = parse(&format!("[model]\nplugin = \"x\"\n{body}\n"), "t.toml") {
                panic!("{body}: {e}");
            }
        };
        let e = parse("[model]\nplugin = \"  \"\n", "t.toml").unwrap_err();
        assert!(e.contains("[model] plugin is empty"), "{e}");
        accepted("[cluster]\ngpus = [1048576]");
        refused("[cluster]\ngpus = [1048577]", "[cluster] gpus contains 1048577");
        // A count given twice was one row and a note; refused as --gpus is on every command.
        accepted("[cluster]\ngpus = [16, 8]");
        refused("[cluster]\ngpus = [8, 16, 8]", "[cluster] gpus gives 8 twice: each GPU count is one row; list it once");
        refused("[cluster]\ngbs = 0", "[cluster] gbs must be at least 1");
        for key in ["tp", "pp", "cp", "vp", "ep", "etp", "mbs"] {
            accepted(&format!("[layout]\n{key} = 1048576"));
            refused(&format!("[layout]\n{key} = 1048577"), &format!("[layout] {key} must be in 1..=1048576, got 1048577"));
            refused(&format!("[layout]\n{key} = 0"), &format!("[layout] {key} must be in 1..=1048576, got 0"));
        }
        refused("[explore]\nbudget_usd = inf", "budget_usd must be a positive number from 1 to 1e12");
        refused("[explore]\ntarget_days = nan", "target_days must be a positive number");
        accepted("[explore]\nmax_usd_per_day_saved = 0.01");
        refused("[explore]\nmax_usd_per_day_saved = 0.009", "max_usd_per_day_saved must be a positive number from 0.01");
        refused("[cost]\nprice_file = \" \"", "[cost] price_file is empty");
        refused("[cluster]\nprofile = \"\"", "[cluster] profile is empty; name a GPU profile TOML");
        accepted("tokens = 1e16");
        for t in ["1.0000001e16", "0", "-1"] {
            refused(&format!("tokens = {t}"), "[model] tokens must be a positive number up to 1e16");
        }
        accepted("seq_len = 16777216");
        refused("seq_len = 16777217", "[model] seq_len must be in 1..=16777216, got 16777217");
        accepted("[measure]\nrepeats = 1000");
        refused("[measure]\nrepeats = 1001", "[measure] repeats must be in 1..=1000");
        refused("[limits]\nmemory_mib = 0", "[limits] memory_mib and call_timeout_ms must be at least 1");
        refused("[limits]\ncall_timeout_ms = 0", "[limits] memory_mib and call_timeout_ms must be at least 1");
        let names = |n: usize| (1..=n).map(|i| format!("\"g{i}\"")).collect::<Vec<_>>().join(", ");
        refused(&format!("[cluster]\ngpu = [{}]", names(17)), "[cluster] gpu lists 17 names; at most 16");
        let e = parse(&format!("[model]\nplugin = \"x\"\n[cluster]\ngpu = [{}]\n", names(16)), "t.toml").unwrap_err();
        assert!(!e.contains("at most 16") && e.contains("g1"), "16 names pass the count: {e}");
        // A key two edits from a short one still gets the suggestion (the bound is 2, or
        // a third of the key's length when longer).
        refused("[cluster]\ngsb = 8", "did you mean `gpu` or `gbs`?");
        let d = |l: LayoutSection| l.describe();
        assert_eq!(d(LayoutSection { fsdp: Some(false), ..Default::default() }), "no FSDP");
        assert_eq!(d(LayoutSection { pipeline_split: Some(PipelineSplit::default()), ..Default::default() }), "even pipeline split");
    }

    /// Paths in a run file are taken from its directory: the price file, the profile, and
    /// plugins given as paths (a bare name is found as everywhere else; an absolute path
    /// stays). Deleting any one of these went unnoticed by the unit tests.
    #[test]
    fn relative_paths_are_taken_from_the_run_files_directory() {
        let tmp = tempfile::Builder::new().prefix("runfile-paths-").tempdir().unwrap();
        let dir = tmp.path();
        let path = dir.join("run.toml");
        let absolute = std::env::temp_dir().join("elsewhere.csv").display().to_string();
        std::fs::write(
            &path,
            "[model]\nplugin = \"llama3.wasm\"\n[cluster]\nprofile = \"gpus.toml\"\n[precision]\nformat = \"fp8\"\nplugin = \"p/fp8.wasm\"\n\
             [cost]\nplugins = [\"c/aws.wasm\", \"gcp.wasm\"]\nprice_file = \"ours.csv\"\n",
        )
        .unwrap();
        let run = load(&path).unwrap();
        let at = |p: &str| dir.join(p).display().to_string();
        assert_eq!(run.model.plugin, "llama3.wasm");
        assert_eq!(run.cluster.profile, Some(at("gpus.toml")));
        assert_eq!(run.precision.plugin, Some(at("p/fp8.wasm")));
        assert_eq!(run.cost.plugins, [at("c/aws.wasm"), "gcp.wasm".to_string()]);
        assert_eq!(run.cost.price_file, Some(at("ours.csv")));
        std::fs::write(&path, format!("[model]\nplugin = \"llama3.wasm\"\n[cost]\nprice_file = \"{absolute}\"\n")).unwrap();
        let run = load(&path).unwrap();
        assert_eq!(run.cost.price_file, Some(absolute));
    }

    /// A run file in a directory whose name is not UTF-8 runs while it names no file
    /// beside it; one it does name is refused by what to do, not read under a lossy name.
    #[cfg(unix)]
    #[test]
    fn a_path_beside_a_run_file_in_a_directory_not_named_in_utf8_is_refused() {
        use std::os::unix::ffi::OsStrExt as _;
        let tmp = tempfile::Builder::new().prefix("runfile-latin1-").tempdir().unwrap();
        let dir = tmp.path().join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("run.toml");
        std::fs::write(&path, "[model]\nplugin = \"llama3.wasm\"\n").unwrap();
        assert!(load(&path).is_ok());
        std::fs::write(&path, "[model]\nplugin = \"llama3.wasm\"\n[cost]\nprice_file = \"ours.csv\"\n").unwrap();
        let e = load(&path).unwrap_err();
        assert!(e.contains("the name of the run file's directory is not UTF-8 text, so 'ours.csv' beside it"), "{e}");
    }

    /// Survivors of a hand mutation audit: each of these rules or defaults could be
    /// dropped or moved with every other test passing.
    #[test]
    fn rules_and_defaults_the_edge_tests_missed() {
        let run = |body: &str| parse(&format!("[model]\nplugin = \"x\"\n{body}\n"), "t.toml");
        let e = run("[cluster]\ngpus = []").unwrap_err();
        assert!(e.ends_with("[cluster] gpus is empty; list GPU counts, e.g. gpus = [64, 128, 256]"), "{e}");
        // The top of each goal's range is in it.
        for body in ["[explore]\nbudget_usd = 1e12", "[explore]\ntarget_days = 1e5", "[explore]\nmax_usd_per_day_saved = 1e12"] {
            assert!(run(body).is_ok(), "{body}: {:?}", run(body));
        }
        assert!(run("[explore]\ntarget_days = 100001").unwrap_err().contains("from 0.001 to 100000, got 100001"));
        assert_eq!(run("[measure]\nrepeats = 1").unwrap().measure.repeats, 1);
        let defaults = run("").unwrap();
        assert_eq!((defaults.measure.repeats, defaults.cost.option.as_str()), (3, "on-demand"));
        assert_eq!(defaults.cluster.gpus, [8, 16, 32, 64, 128, 256, 512, 1024, 2048]);
        assert_eq!(run("[layout]\netp = 2").unwrap().layout.space().etp, Some(2));
    }

    /// A list of GPU counts long enough to take minutes before the first row is refused
    /// at once, naming the cap.
    #[test]
    fn a_list_of_too_many_gpu_counts_is_refused_at_once() {
        let counts = |n: u32| (1..=n).map(|i| (i * 8).to_string()).collect::<Vec<_>>().join(", ");
        let run = |n: u32| parse(&format!("[model]\nplugin = \"x\"\n[cluster]\ngpus = [{}]\n", counts(n)), "t.toml");
        assert!(run(MAX_GPU_COUNTS as u32).is_ok());
        let e = run(MAX_GPU_COUNTS as u32 + 1).unwrap_err();
        assert!(e.ends_with("[cluster] gpus lists 65 GPU counts; at most 64 (each is one row of every series)"), "{e}");
        let started = std::time::Instant::now();
        assert!(run(100_000).unwrap_err().contains("[cluster] gpus lists 100000 GPU counts"));
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    }

    /// The line a refused value is on is shown with its bidi overrides escaped (TOML takes
    /// them raw in a string), so the snippet cannot reorder what the terminal shows; the
    /// rest of the message is escaped where it is printed.
    #[test]
    fn a_refused_line_shows_bidi_controls_escaped() {
        let e = parse("[model]\nplugin = \"x\"\n[cost]\noption = \"\u{202e}spot\"\n", "t.toml").unwrap_err();
        let shown = e.lines().find(|l| l.starts_with("4 | ")).unwrap_or_default();
        assert_eq!(shown, "4 | option = \"\\u{202e}spot\"", "{e}");
    }

    /// A plugin the file names is checked while the run keeps it: the file's precision
    /// plugin when missing, and not the file's model plugin once a flag replaced it.
    #[test]
    fn check_plugins_answers_for_the_plugins_the_run_keeps() {
        let tmp = tempfile::Builder::new().prefix("runfile-kept-").tempdir().unwrap();
        let path = tmp.path().join("run.toml");
        std::fs::write(&path, "[model]\nplugin = \"llama3.wasm\"\n[precision]\nformat = \"fp8\"\nplugin = \"nofp8\"\n").unwrap();
        let file = load(&path).unwrap();
        let e = check_plugins(&path, &file, &file).unwrap_err();
        assert!(e.contains("line 5, column 10\n") && e.contains("[precision] plugin: no plugin 'nofp8'"), "{e}");
        std::fs::write(&path, "[model]\nplugin = \"llama9\"\n").unwrap();
        let file = load(&path).unwrap();
        let mut flags = file.clone();
        flags.model.plugin = "llama3.wasm".into();
        assert_eq!(check_plugins(&path, &file, &flags), Ok(()));
    }

    /// A section written as a list is refused at its line: `measure = [3]` ran as
    /// repeats = 3 (serde reads a list as the fields in order), and `[[cluster]]` was
    /// answered about a key the file never wrote.
    #[test]
    fn a_section_written_as_a_list_is_refused() {
        let e = parse("measure = [3]\n[model]\nplugin = \"x\"\n", "t.toml").unwrap_err();
        assert!(e.starts_with("t.toml: line 1, column 1\n") && e.ends_with("[measure] is one table, not a list: write [measure] with its keys under it (not [[measure]] or measure = [...])"), "{e}");
        let e = parse("[model]\nplugin = \"x\"\n[[cluster]]\ngpus = [8]\n", "t.toml").unwrap_err();
        assert!(e.starts_with("t.toml: line 3, column 3\n") && e.contains("[cluster] is one table, not a list"), "{e}");
        assert!(parse("[model]\nplugin = \"x\"\n[limits]\nmemory_mib = 64\n", "t.toml").is_ok());
    }

    #[test]
    fn one_name_or_a_list() {
        let run = parse("[model]\nplugin = \"x\"\n[cluster]\ngpu = [\"H100\", \"B200\"]\n[precision]\nformat = \"fp8\"\n", "t.toml").unwrap();
        assert_eq!(run.cluster.gpu, ["H100", "B200"]);
        assert_eq!(run.precision.recipes(), [Recipe::Fp8]);
        let err = parse("[model]\nplugin = \"x\"\n[cluster]\ngpu = 3\n", "t.toml").unwrap_err();
        assert!(err.contains("a name or a list of names"), "{err}");
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
                "explore",
                "assumptions",
                "layout",
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
                "price_file",
                "target_days",
                "budget_usd",
                "checkpoint_interval_h",
                "tp",
                "vp",
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
