//! Published, measured training runs (the shape of `data/calibration.toml`: one
//! `[[point]]` per run with its model, GPU, precision, layout and measured step time or
//! throughput) and the check of the projection against them ([`validate`]).
//!
//! Every point comes back: projected with its error, or unsupported with the reason
//! (a model no installed plugin provides, a workload the model does not cover, a GPU or
//! precision without a profile, a layout the model cannot take, nothing measured to
//! compare with). None is dropped silently.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use runner_graph::modules::{Module, Modules};
use runner_graph::recompute::RecomputePolicy;

use runner_graph::peft::{Lora, LoraTargets};

use crate::model::{GraphSource, Model, TrainedSource, Training};
use crate::precision::{Plan, Recipe};
use crate::profile::Profiles;
use crate::project::Projector;
use crate::search;
use runner_graph::pipeline::PipelineSplit;

use crate::step::{LayoutSpec, Optimizer, PipelineKind, Projection};
use crate::template::{Dispatcher, Kernels};

/// One published run. Absent fields were not stated by the source.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Point {
    pub source: String,
    pub model: String,
    pub gpu: String,
    pub num_gpus: Option<u32>,
    pub precision: String,
    #[serde(default)]
    pub workload: String,
    #[serde(default)]
    pub framework: String,
    pub seq_len: Option<u32>,
    pub gbs: Option<u32>,
    pub mbs: Option<u32>,
    pub tp: Option<u32>,
    pub pp: Option<u32>,
    pub cp: Option<u32>,
    pub vp: Option<u32>,
    pub ep: Option<u32>,
    pub etp: Option<u32>,
    /// Above 0: FSDP; above 1 the sharding group size, 1 the flag of the tables that mark FSDP
    /// on (NeMo 25.07's "FSDP: 1" where 25.09 gives the group of the same run, 64); 0 or
    /// absent: DDP with the distributed optimizer.
    pub fsdp: Option<u32>,
    /// Whether the run overlapped the expert all-to-all with another micro-batch's compute
    /// (Megatron's `overlap_moe_expert_parallel_comm`, set by Megatron-Bridge's
    /// `moe_a2a_overlap`). Read from the run's recipe config where it is found; absent:
    /// overlapped, as a performance recipe would run it.
    pub ep_overlap: Option<bool>,
    /// Whether the run overlapped its tensor-parallel communication with GEMMs
    /// (Megatron's `tp_comm_overlap`, Transformer Engine's userbuffers); absent: where
    /// tp > 1, as today's recipes run. Megatron-LM of 2022 had no such overlap.
    pub tp_comm_overlap: Option<bool>,
    /// Megatron's `recompute_modules` where the run's recipe sets them (selective
    /// recompute of those modules); absent: none, unless the layout needs recompute to
    /// fit ([`project_fitting`]).
    pub recompute_modules: Option<Vec<String>>,
    /// Full recompute of this many layers per pipeline chunk (Megatron's
    /// `recompute_granularity = "full"` with `recompute_num_layers`; a PyTorch run that
    /// checkpoints every layer gives them all, one that checkpoints every other layer
    /// half); absent: none. Not with `recompute_modules`.
    pub recompute_num_layers: Option<u32>,
    /// Megatron's `account_for_embedding_in_pipeline_split` and
    /// `account_for_loss_in_pipeline_split` where the run's recipe sets them (the
    /// embedding and the loss each count as a layer in the pipeline split).
    pub account_for_embedding_in_pipeline_split: Option<bool>,
    pub account_for_loss_in_pipeline_split: Option<bool>,
    /// Megatron's `pipeline_model_parallel_layout` where the run's recipe sets one
    /// (for example `Et*4|(t*4|)*14tmL`); it replaces the two flags above.
    pub pipeline_layout: Option<String>,
    /// Transformer layers the run kept in BF16 at the start and the end of the model
    /// (Megatron's `num_layers_at_start_in_bf16` / `num_layers_at_end_in_bf16` under
    /// `first_last_layers_bf16`); absent: the precision's built-in default (NVFP4 keeps
    /// the last four).
    pub num_layers_at_start_in_bf16: Option<u32>,
    pub num_layers_at_end_in_bf16: Option<u32>,
    /// A LoRA run's Megatron-Bridge `peft.target_modules` (`["linear_qkv"]`, or the four
    /// defaults); absent: the defaults.
    pub lora_target_modules: Option<Vec<String>>,
    /// Megatron's `cpu_offloading_num_layers` where the run's recipe sets it: layers whose
    /// activations go to host memory between forward and backward.
    pub cpu_offloading_num_layers: Option<u32>,
    /// The optimizer (`adamw`, the default, or `muon`).
    pub optimizer: Option<String>,
    /// Megatron-Bridge's `cutedsl_fused_grouped_mlp` where the run's preset sets it: the
    /// routed experts' MLP as fused grouped GEMMs; absent: Megatron's default, unfused.
    pub cutedsl_fused_grouped_mlp: Option<bool>,
    /// Megatron's `moe_token_dispatcher_type` where the run's recipe sets it (`flex`,
    /// with DeepEP or HybridEP, or `alltoall`); absent: `flex`, what NVIDIA's MoE presets
    /// run.
    pub ep_dispatcher: Option<Dispatcher>,
    /// The pipeline schedule where the run used another than Megatron's 1F1B
    /// (`dualpipe`: DeepSeek's; `dualpipev`: DualPipe cut in half).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline_schedule: Option<PipelineKind>,
    pub step_time_s: Option<f64>,
    pub tokens_per_sec_per_gpu: Option<f64>,
    pub tokens_per_sec_total: Option<f64>,
}

#[derive(Deserialize)]
struct File {
    point: Vec<Point>,
}

/// Parse a calibration-shaped file.
///
/// # Errors
/// TOML syntax or a field of the wrong type, with the position.
pub fn parse(text: &str, origin: &str) -> Result<Vec<Point>, String> {
    let f: File = toml::from_str(text).map_err(|e| {
        if let Some(m) = crate::file_kind::misplaced(text, origin, crate::file_kind::Reader::Calibration) {
            return m;
        }
        // A run file (or any file without runs) said only "missing field `point`".
        if e.message().contains("missing field `point`") {
            format!(
                "{origin}: {}\nhelp: a calibration file lists published runs as [[point]] tables (source, model, gpu, \
                 num_gpus, precision, the layout, step_time_s), as host/project/data/calibration.toml does; a run file \
                 ([model], [cluster]) goes to `runner run`",
                e.to_string().trim_end()
            )
        } else {
            format!("{origin}: {e}")
        }
    })?;
    // A blank source parses, but a point that names no publication cannot be checked
    // against it: refused like a missing one.
    if let Some((i, p)) = f.point.iter().enumerate().find(|(_, p)| p.source.trim().is_empty()) {
        return Err(format!(
            "{origin}: point #{i} ({}): source is empty; name where the run was published (a paper, a benchmark \
             README's URL)",
            p.label()
        ));
    }
    check_keys(text, origin, &f.point)?;
    refuse_repeated_points(&f.point, origin)?;
    Ok(f.point)
}

/// Keys a point may carry only to document its run: the source's own figures and
/// wording (MFU, TFLOP/s per GPU, days to train, the model's shape as the source states
/// it, notes), kept beside the figures the projection reads so a reader can check them
/// against the publication; any key ending in `_source` names where a field came from.
/// `dp` and `ga` are read only to check them ([`check_counts`]).
const DOCUMENTING: &[&str] = &[
    "aggregate_pflops",
    "container",
    "days_to_train_1t_tokens",
    "derived",
    "dp",
    "est_days_10t_tokens_1k_gpus",
    "ga",
    "hidden_size",
    "mfu",
    "mlperf_round",
    "model_flops_per_sample_used_by_source",
    "model_raw",
    "model_tflops_per_gpu",
    "notes",
    "num_attention_heads",
    "num_layers",
    "source_kind",
    "time_to_train_min",
    "vocab_size",
];

/// Refuses a key a point neither reads nor documents: a misspelt layout key (`tp_size`
/// for `tp`, `micro_batch` for `mbs`) would otherwise leave the layout at its default
/// and check the projection against a run that never happened, without a word. Run
/// files and profiles deny unknown keys the same way.
fn check_keys(text: &str, origin: &str, typed: &[Point]) -> Result<(), String> {
    // A second, untyped parse (linear, like the first): deserializing the points from this
    // table instead would lose the line and column that the typed parse's errors give.
    let Ok(table) = toml::from_str::<toml::Table>(text) else {
        return Ok(()); // The typed parse has already accepted it; nothing to add.
    };
    let fields = point_fields();
    let points = table.get("point").and_then(toml::Value::as_array).map(Vec::as_slice).unwrap_or_default();
    for (i, (point, p)) in points.iter().zip(typed).enumerate() {
        let Some(keys) = point.as_table() else { continue };
        check_counts(p, keys).map_err(|e| format!("{origin}: point #{i} ({}): {e}", p.label()))?;
        for key in keys.keys() {
            if fields.contains(&key.as_str()) || DOCUMENTING.contains(&key.as_str()) || key.ends_with("_source") {
                continue;
            }
            let mut near = crate::spelling::nearest(key, fields);
            if near.is_empty() {
                // Megatron's spelling of a field (`tp_size`, `pp_size`) begins with ours.
                near = fields.iter().copied().filter(|f| key.strip_prefix(f).is_some_and(|rest| rest.starts_with('_'))).collect();
            }
            let hint = if near.is_empty() {
                format!(
                    "a point reads {}; keys that only document the run are {} or end in `_source`",
                    fields.join(", "),
                    DOCUMENTING.join(", ")
                )
            } else {
                format!("did you mean {}?", near.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(" or "))
            };
            return Err(format!("{origin}: point #{i} ({}): unknown key `{key}`\nhelp: {hint}", p.label()));
        }
    }
    Ok(())
}

/// The keys [`Point`] reads, as its deserializer asks for them, so the list never drifts
/// from the struct.
fn point_fields() -> &'static [&'static str] {
    use serde::de::{self, Visitor};
    /// A deserializer that only records the field names a struct asks for.
    struct Fields(&'static [&'static str]);
    impl<'de> de::Deserializer<'de> for &mut Fields {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("field names only"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = fields;
            Err(de::Error::custom("field names only"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields = Fields(&[]);
    let _ = Point::deserialize(&mut fields);
    fields.0
}

/// Refuses a point given twice (the same run, layout and figures, whatever its
/// source): it would count twice in the statistics and weigh twice in a fit.
fn refuse_repeated_points(points: &[Point], origin: &str) -> Result<(), String> {
    // One pass with a map, not a comparison of every pair: a 16 MiB file holds about 10^5
    // points. The key is the point as JSON with its source blank and -0.0 written as 0.0,
    // so two keys are equal exactly when the points are (`PartialEq`): serde_json writes
    // each f64 as the shortest text that reads back to it. A point holding NaN equals
    // nothing, so it has no key.
    let key = |p: &Point| -> Option<String> {
        let figures = [p.step_time_s, p.tokens_per_sec_per_gpu, p.tokens_per_sec_total];
        if figures.iter().flatten().any(|v| v.is_nan()) {
            return None;
        }
        let plus_zero = |v: Option<f64>| v.map(|v| v + 0.0);
        let blank = Point {
            source: String::new(),
            step_time_s: plus_zero(p.step_time_s),
            tokens_per_sec_per_gpu: plus_zero(p.tokens_per_sec_per_gpu),
            tokens_per_sec_total: plus_zero(p.tokens_per_sec_total),
            ..p.clone()
        };
        serde_json::to_string(&blank).ok()
    };
    let mut first: HashMap<String, usize> = HashMap::with_capacity(points.len());
    for (j, p) in points.iter().enumerate() {
        let Some(k) = key(p) else { continue };
        if let Some(&i) = first.get(&k) {
            return Err(format!(
                "{origin}: point #{j} ({}) repeats point #{i}: the same run would count twice in the errors and weigh twice in a \
                 fit; remove one (two publications of one run are one point, its source naming both)",
                p.label()
            ));
        }
        first.insert(k, j);
    }
    Ok(())
}

/// Checks a point's documenting `dp` and `ga` against the figures it reads: a `dp` other
/// than num_gpus / (tp·pp·cp), or a `ga` other than gbs / (mbs·dp), says one of them is
/// mistyped.
fn check_counts(p: &Point, raw: &toml::Table) -> Result<(), String> {
    let count = |key: &str| raw.get(key).and_then(toml::Value::as_integer);
    let Some(n) = p.num_gpus else { return Ok(()) };
    let per = u64::from(p.tp.unwrap_or(1)) * u64::from(p.pp.unwrap_or(1)) * u64::from(p.cp.unwrap_or(1));
    if per == 0 || !u64::from(n).is_multiple_of(per) {
        return Ok(()); // The layout's own check names this.
    }
    let dp = u64::from(n) / per;
    if let Some(given) = count("dp")
        && u64::try_from(given).ok() != Some(dp)
    {
        return Err(format!(
            "dp = {given}, but num_gpus / (tp·pp·cp) = {n} / {per} = {dp}: correct whichever figure is mistyped"
        ));
    }
    if let (Some(given), Some(gbs), Some(mbs)) = (count("ga"), p.gbs, p.mbs) {
        let micro = u64::from(mbs) * dp;
        if micro > 0 && (u64::try_from(given).ok().map(|ga| ga * micro) != Some(u64::from(gbs))) {
            return Err(format!(
                "ga = {given}, but gbs / (mbs·dp) = {gbs} / ({mbs}·{dp}) = {}: correct whichever figure is mistyped",
                f64::from(gbs) / micro as f64
            ));
        }
    }
    Ok(())
}

impl Point {
    /// The measured step time: stated, or derived from throughput as the sources define
    /// it (tokens/s = seq·GBS / step time); `None` when the point gives none or a
    /// figure [`Point::measured`] refuses.
    pub fn measured_step(&self) -> Option<f64> {
        self.measured().ok()
    }

    /// The measured step time, or why the point has none to compare with: no figure, or
    /// one that is not a positive number or gives a step outside [`STEP_RANGE_S`] (a
    /// unit slip, a typo), which would print as infinities and astronomical errors.
    ///
    /// # Errors
    /// Names the field and the fix.
    pub fn measured(&self) -> Result<f64, String> {
        let (lo, hi) = STEP_RANGE_S;
        let check = |what: String, step: f64| {
            if step.is_finite() && (lo..=hi).contains(&step) {
                Ok(step)
            } else {
                Err(format!("{what} gives a step of {} s, outside the {lo:e} to {hi:e} s a training step takes: check its units", num(step)))
            }
        };
        let positive = |field: &str, v: f64| {
            if v.is_finite() && v > 0.0 { Ok(v) } else { Err(format!("{field} = {} is not a positive number: give the measured figure or leave the field out", num(v))) }
        };
        let throughput = [("tokens_per_sec_per_gpu", self.tokens_per_sec_per_gpu, true), ("tokens_per_sec_total", self.tokens_per_sec_total, false)];
        let given = throughput.into_iter().find_map(|(f, t, g)| t.map(|t| (f, t, g)));
        // The step a throughput figure gives, where the point has what it takes.
        let from_throughput = |(field, t, per_gpu): (&str, f64, bool)| -> Result<f64, String> {
            let t = positive(field, t)?;
            let (Some(seq), Some(gbs), Some(n)) = (self.seq_len, self.gbs, self.num_gpus) else {
                return Err(format!("{field} needs seq_len, gbs and num_gpus to give a step time"));
            };
            let tokens = f64::from(seq) * f64::from(gbs);
            Ok(if per_gpu { tokens / (t * f64::from(n)) } else { tokens / t })
        };
        if let Some(s) = self.step_time_s {
            let s = check(format!("step_time_s = {}", num(s)), positive("step_time_s", s)?)?;
            // Both figures given: published ones agree to rounding (the 118 runs shipped
            // to 0.05 %); a disagreement is a typo in one of them or in seq_len, gbs or
            // num_gpus, and the comparison would be with a run that never happened.
            if let Some((field, t, per_gpu)) = given
                && let Ok(other) = from_throughput((field, t, per_gpu))
                && (other / s - 1.0).abs() > STEP_AGREEMENT
            {
                return Err(format!(
                    "step_time_s = {} and {field} = {} disagree: with seq_len, gbs and num_gpus the throughput gives a step of {} s; correct whichever figure is wrong",
                    num(s),
                    num(t),
                    derived(other)
                ));
            }
            return Ok(s);
        }
        let Some((field, t, per_gpu)) = given else {
            return Err("the source gives neither a step time nor a throughput to compare with".into());
        };
        check(format!("{field} = {}", num(t)), from_throughput((field, t, per_gpu))?)
    }

    /// One line naming the run.
    pub fn label(&self) -> String {
        format!(
            "{} {} x{} {}",
            self.model,
            self.gpu,
            self.num_gpus.map_or("?".into(), |n| n.to_string()),
            self.precision
        )
    }

    /// The layout as the runner spells it: sequence parallelism with TP, the distributed
    /// optimizer and the TP and DP overlaps on (NeMo and Megatron-Bridge performance
    /// recipes), the EP overlap as the point records it (on where it does not), the
    /// recipe's selective recompute where the point records its `recompute_modules`,
    /// otherwise none unless it is needed to fit (see [`project_fitting`]).
    ///
    /// # Errors
    /// What the source leaves out, or degrees that do not multiply to the GPU count.
    pub fn layout(&self) -> Result<LayoutSpec, String> {
        let n = self.num_gpus.ok_or("the source gives no GPU count")?;
        let seq = self.seq_len.ok_or("the source gives no sequence length")?;
        let gbs = self.gbs.ok_or("the source gives no global batch size")?;
        for (field, v) in [("num_gpus", n), ("seq_len", seq), ("gbs", gbs)] {
            if v == 0 {
                return Err(format!("{field} = 0: give the run's figure (at least 1)"));
            }
        }
        let (tp, pp, cp) = (self.tp.unwrap_or(1), self.pp.unwrap_or(1), self.cp.unwrap_or(1));
        if self.tp.is_none() && self.fsdp.unwrap_or(0) == 0 && self.pp.is_none() {
            return Err("the source gives no parallel layout".into());
        }
        let per = u64::from(tp) * u64::from(pp) * u64::from(cp);
        if per == 0 || !u64::from(n).is_multiple_of(per) {
            return Err(format!("tp·pp·cp = {per} does not divide the {n} GPUs"));
        }
        let dp = (u64::from(n) / per) as u32;
        let fsdp = self.fsdp.unwrap_or(0) > 0;
        let mut modules = Modules::EMPTY;
        for m in self.recompute_modules.iter().flatten() {
            modules = modules.with(Module::parse(m).map_err(|e| format!("recompute_modules: {e}"))?);
        }
        let selective = modules != Modules::EMPTY;
        let full = match self.recompute_num_layers {
            Some(_) if selective => {
                return Err("recompute_modules (selective) and recompute_num_layers (full) are both given: a run recomputes one way; keep the one its recipe sets".into());
            }
            Some(0) => return Err("recompute_num_layers = 0: give the layers per chunk recomputed in full (at least 1), or leave it out".into()),
            n => n,
        };
        let vp = self.vp.unwrap_or(1).max(1);
        let split = match &self.pipeline_layout {
            // Its chunk and layer counts are checked with the model ([`prepare`]).
            Some(text) => PipelineSplit::from_megatron_layout(text)?.split,
            None => PipelineSplit::megatron(
                self.account_for_embedding_in_pipeline_split.unwrap_or(false),
                self.account_for_loss_in_pipeline_split.unwrap_or(false),
            ),
        };
        Ok(LayoutSpec {
            tp,
            pp,
            cp,
            vp,
            ep: self.ep.unwrap_or(1).max(1),
            etp: self.etp.unwrap_or(1).max(1),
            dp,
            mbs: self.mbs.unwrap_or(1).max(1),
            gbs,
            sequence_parallel: tp > 1,
            fsdp,
            recompute: match (selective, full) {
                (true, _) => RecomputePolicy::Selective,
                (false, Some(_)) => RecomputePolicy::Full,
                (false, None) => RecomputePolicy::None,
            },
            recompute_layers: full.unwrap_or(0),
            recompute_modules: if selective { modules } else { Modules::default() },
            distributed_optimizer: !fsdp,
            tp_overlap: tp > 1 && self.tp_comm_overlap.unwrap_or(true),
            ep_overlap: self.ep.unwrap_or(1) > 1 && self.ep_overlap.unwrap_or(true),
            dp_overlap: true,
            grad_fp32: false,
            split,
            offload_layers: self.cpu_offloading_num_layers.unwrap_or(0),
            optimizer: match &self.optimizer {
                Some(o) => Optimizer::parse(o)?,
                None => Optimizer::AdamW,
            },
            kernels: Kernels {
                fused_grouped_mlp: self.cutedsl_fused_grouped_mlp.unwrap_or(false),
                dispatcher: self.ep_dispatcher.unwrap_or_default(),
            },
            pipeline: self.pipeline_schedule.unwrap_or_default(),
        })
    }

    /// Check the point's `pipeline_layout`, if it has one, against a model of `layers`
    /// layers run on `chunks` = pp·vp chunks.
    ///
    /// # Errors
    /// The layout does not parse, or places another number of layers or chunks.
    pub fn check_pipeline_layout(&self, layers: usize, chunks: usize) -> Result<(), String> {
        match self.pipeline_layout.as_deref() {
            Some(text) => PipelineSplit::from_megatron_layout(text)?.check(layers, chunks),
            None => Ok(()),
        }
    }
}

/// Finds the plugin that provides a model and returns its graphs.
pub trait Resolver {
    /// The model's family and a graph source at `seq_len`, or why it is not available.
    ///
    /// # Errors
    /// No installed plugin provides `model` (the message says so).
    fn resolve(&mut self, model: &str, seq_len: u32) -> Result<(String, Box<dyn GraphSource>), String>;
}

/// `v` short: plain where that is short, else in scientific notation (a slipped unit can
/// make a figure hundreds of digits long).
fn num(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-3..1e6).contains(&v.abs()) { format!("{v:.4e}") } else { format!("{v}") }
}

/// A derived figure: [`num`] at five significant digits.
fn derived(v: f64) -> String {
    if v != 0.0 && v.is_finite() && (1e-3..1e6).contains(&v.abs()) { format!("{}", format!("{v:.4e}").parse::<f64>().unwrap_or(v)) } else { num(v) }
}

/// Seconds a measured training step may take: anything outside is a unit slip or a typo
/// (a tenth of a millisecond is below one kernel launch per layer; a million seconds is
/// eleven days).
pub const STEP_RANGE_S: (f64, f64) = (1e-4, 1e6);

/// How far a point's step time and the step its throughput gives may differ (a share):
/// rounding in the published tables is well under it.
const STEP_AGREEMENT: f64 = 0.05;

/// One point's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Checked {
    pub index: usize,
    pub model: String,
    pub family: String,
    pub gpu: String,
    pub precision: String,
    pub gpus: u32,
    pub layout: String,
    pub published_step_s: f64,
    pub predicted_step_s: f64,
    pub published_tokens_per_sec_per_gpu: f64,
    pub predicted_tokens_per_sec_per_gpu: f64,
    /// predicted / published − 1 of the step time.
    pub error: f64,
    pub memory_gib: f64,
    pub fits: bool,
    /// Where the predicted step goes (the `runner project` breakdown), to see which part
    /// of the model a large error sits in.
    pub breakdown: crate::step::Breakdown,
    /// Adjustments made to run it (recompute to fit, FSDP group size differences).
    pub note: String,
    pub source: String,
}

/// A point the projection cannot take, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Unsupported {
    pub index: usize,
    pub label: String,
    pub reason: String,
    pub source: String,
}

/// Absolute step-time error statistics of a group of points.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Stats {
    pub points: usize,
    pub median: f64,
    pub p90: f64,
    pub max: f64,
}

impl Stats {
    pub fn of(errors: impl Iterator<Item = f64>) -> Stats {
        let mut v: Vec<f64> = errors.map(f64::abs).collect();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return Stats::default();
        }
        // Nearest-rank percentiles.
        let rank = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        let median = if v.len() % 2 == 1 { v[v.len() / 2] } else { 0.5 * (v[v.len() / 2 - 1] + v[v.len() / 2]) };
        Stats { points: v.len(), median, p90: rank(0.9), max: v[v.len() - 1] }
    }
}

/// The whole check.
#[derive(Clone, Debug, Serialize)]
pub struct Validation {
    pub checked: Vec<Checked>,
    pub unsupported: Vec<Unsupported>,
    pub overall: Stats,
    /// By "GPU / precision / family".
    pub groups: BTreeMap<String, Stats>,
}

/// Set up a projector and layout per supported point (shared by [`validate`] and the
/// calibration fit): everything but the timing.
pub struct Prepared<'s> {
    pub projectors: Vec<Projector<'s>>,
    /// (point index, projector index, layout, family, note).
    pub runs: Vec<(usize, usize, LayoutSpec, String, String)>,
    pub unsupported: Vec<Unsupported>,
}

/// Resolve models, GPUs, precisions and layouts for `points`.
pub fn prepare<'s>(points: &[Point], profiles: &Profiles, resolver: &mut dyn Resolver, progress: &dyn Fn(&str)) -> Prepared<'s> {
    let mut out = Prepared { projectors: Vec::new(), runs: Vec::new(), unsupported: Vec::new() };
    type Key = (String, u32, String, String, Training, Option<(usize, usize)>);
    let mut by_key: HashMap<Key, usize> = HashMap::new();
    let mut families: BTreeMap<String, String> = BTreeMap::new();
    for (i, p) in points.iter().enumerate() {
        let refuse = |reason: String| Unsupported { index: i, label: p.label(), reason, source: p.source.clone() };
        let workload = p.workload.to_ascii_lowercase();
        // LoRA rows: NeMo's and Megatron-Bridge's default adapters (rank 32 on the
        // attention and MLP linears) unless the row names its target modules.
        let training = if workload.contains("lora") {
            let targets = match p.lora_target_modules.as_deref().map(LoraTargets::from_modules).transpose() {
                Ok(t) => t.unwrap_or_default(),
                Err(e) => {
                    out.unsupported.push(refuse(e));
                    continue;
                }
            };
            Training::Lora(Lora { targets, ..Lora::default() })
        } else {
            if p.lora_target_modules.is_some() {
                out.unsupported.push(refuse("lora_target_modules is set on a run that is not a LoRA fine-tune (workload \"finetune_lora\")".into()));
                continue;
            }
            Training::Full
        };
        if training == Training::Full
            && !workload.is_empty()
            && !workload.starts_with("pretrain")
            && !workload.starts_with("finetune_sft")
        {
            out.unsupported.push(refuse(format!("workload '{}' is not a training step the projection models", p.workload)));
            continue;
        }
        let layout = match p.layout() {
            Ok(l) => l,
            Err(e) => {
                out.unsupported.push(refuse(e));
                continue;
            }
        };
        if let Err(why) = p.measured() {
            out.unsupported.push(refuse(why));
            continue;
        }
        let gpu = match profiles.get(&p.gpu) {
            Ok(g) => g.clone(),
            Err(e) => {
                out.unsupported.push(refuse(e));
                continue;
            }
        };
        let recipe = match Recipe::parse(&p.precision) {
            Ok(r) => r,
            Err(e) => {
                out.unsupported.push(refuse(e));
                continue;
            }
        };
        if let Err(e) = gpu.peak_flops(recipe.format()) {
            out.unsupported.push(refuse(e));
            continue;
        }
        let seq = p.seq_len.unwrap_or(0);
        let bf16_layers = match (p.num_layers_at_start_in_bf16, p.num_layers_at_end_in_bf16) {
            (None, None) => None,
            (a, b) => Some((a.unwrap_or(0) as usize, b.unwrap_or(0) as usize)),
        };
        let key = (p.model.clone(), seq, gpu.name.clone(), recipe.name().to_string(), training, bf16_layers);
        let at = match by_key.get(&key) {
            Some(&at) => at,
            None => {
                // Said once the model is found: "reading" a model that does not exist
                // came before the line that says so.
                let (family, mut source) = match resolver.resolve(&p.model, seq) {
                    Ok((family, inner)) => (family, Box::new(TrainedSource { inner, training }) as Box<dyn GraphSource>),
                    Err(e) => {
                        out.unsupported.push(refuse(e));
                        continue;
                    }
                };
                progress(&format!("reading {} at seq {seq}", p.model));
                let model = match Model::new(&p.model, seq, source.as_mut()) {
                    Ok(m) => m,
                    Err(e) => {
                        out.unsupported.push(refuse(e));
                        continue;
                    }
                };
                families.insert(p.model.clone(), family);
                let plan = Plan::builtin_with(recipe, &model.graph, bf16_layers);
                out.projectors.push(Projector::new(model, source, gpu, plan));
                by_key.insert(key, out.projectors.len() - 1);
                out.projectors.len() - 1
            }
        };
        let layers = out.projectors[at].model.depth.len();
        if let Err(e) = p.check_pipeline_layout(layers, (layout.pp as usize) * (layout.vp as usize)) {
            out.unsupported.push(refuse(e));
            continue;
        }
        let mut notes = Vec::new();
        if let Training::Lora(l) = training {
            notes.push(format!("LoRA fine-tune, rank {} on {}", l.rank, l.targets.describe()));
        }
        match p.fsdp {
            Some(1) if layout.dp * layout.cp > 1 => {
                notes.push(format!("fsdp = 1 read as the table's FSDP flag: full sharding over {} ranks", layout.dp * layout.cp));
            }
            Some(f) if f > 1 && f != layout.dp * layout.cp => {
                notes.push(format!("FSDP group {f} of {} data-parallel ranks modelled as full sharding", layout.dp * layout.cp));
            }
            _ => {}
        }
        let note = notes.join("; ");
        // A LoRA fine-tune is grouped (and held out) apart from its model's training runs.
        let family = families.get(&p.model).cloned().unwrap_or_default();
        let family = if training == Training::Full { family } else { format!("{family} LoRA") };
        out.runs.push((i, at, layout, family, note));
    }
    out
}

/// Project `layout`, turning on the fastest recompute that makes it fit if it does not
/// fit without ([`search::recompute_to_fit`]: selective recompute of Megatron's modules,
/// or full recompute of the fewest layers per pipeline chunk), as a framework user
/// would have had to. Returns the recompute used, if any; a layout nothing makes fit is
/// projected as published (`fits` false).
pub fn project_fitting(pr: &mut Projector<'_>, layout: &LayoutSpec) -> Result<(Projection, Option<String>), String> {
    let first = pr.project(layout)?;
    if first.fits {
        return Ok((first, None));
    }
    let layers = pr.model.depth.len() as u32;
    let c = pr.costed(layout.key(), layout.kernels)?;
    let p = search::recompute_to_fit(c, &layout.schedule(), layers, &mut 0).map_err(|r| r.to_string())?;
    if !p.fits {
        return Ok((first, None));
    }
    let chunk = layout.split.fullest_chunk(layers, layout.pp * layout.vp);
    let what = match p.layout.recompute {
        RecomputePolicy::Selective => format!("selective recompute of {}", p.layout.recompute_modules),
        RecomputePolicy::Full if p.layout.recompute_layers > 0 => {
            format!("full recompute of {} of {chunk} layers per chunk", p.layout.recompute_layers)
        }
        _ => "full recompute".to_string(),
    };
    Ok((p, Some(what)))
}

/// Project every point and compare with what was measured.
pub fn validate(points: &[Point], profiles: &Profiles, resolver: &mut dyn Resolver, progress: &dyn Fn(&str)) -> Validation {
    let mut prep = prepare(points, profiles, resolver, progress);
    let mut checked = Vec::new();
    for (i, at, layout, family, note) in prep.runs.clone() {
        let p = &points[i];
        progress(&format!("projecting {}", p.label()));
        let pr = &mut prep.projectors[at];
        match project_fitting(pr, &layout) {
            Ok((proj, rc)) => {
                let published = p.measured_step().unwrap_or(f64::NAN);
                let seq = f64::from(p.seq_len.unwrap_or(0));
                let n = f64::from(p.num_gpus.unwrap_or(1));
                let mut note = note;
                if let Some(rc) = rc {
                    let add = format!("{rc} to fit in memory");
                    note = if note.is_empty() { add } else { format!("{note}; {add}") };
                }
                if let Some(short) = proj.memory.shortfall() {
                    let add = format!("does not fit: {short}");
                    note = if note.is_empty() { add } else { format!("{note}; {add}") };
                }
                checked.push(Checked {
                    index: i,
                    model: p.model.clone(),
                    family,
                    gpu: pr.gpu.name.clone(),
                    precision: pr.plan.recipe.name().to_string(),
                    gpus: p.num_gpus.unwrap_or(0),
                    layout: proj.layout.short(),
                    published_step_s: published,
                    predicted_step_s: proj.step_time_s,
                    published_tokens_per_sec_per_gpu: seq * f64::from(layout.gbs) / published / n,
                    predicted_tokens_per_sec_per_gpu: proj.tokens_per_sec_per_gpu,
                    error: proj.step_time_s / published - 1.0,
                    memory_gib: proj.memory.total,
                    fits: proj.fits,
                    breakdown: proj.breakdown,
                    note,
                    source: p.source.clone(),
                });
            }
            Err(e) => prep.unsupported.push(Unsupported {
                index: i,
                label: p.label(),
                reason: format!("the layout does not fit the model: {e}"),
                source: p.source.clone(),
            }),
        }
    }
    prep.unsupported.sort_by_key(|u| u.index);
    let overall = Stats::of(checked.iter().map(|c| c.error));
    let mut groups: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for c in &checked {
        groups.entry(format!("{} / {} / {}", c.gpu, c.precision, c.family)).or_default().push(c.error);
    }
    let groups = groups.into_iter().map(|(k, v)| (k, Stats::of(v.into_iter()))).collect();
    Validation { checked, unsupported: prep.unsupported, overall, groups }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `source` is required, and a blank one is refused as a missing one is, naming the
    /// point; the other points of a file do not excuse it.
    #[test]
    fn a_blank_source_is_refused() {
        let point = |source: &str| format!("[[point]]\nsource = \"{source}\"\nmodel = \"m\"\ngpu = \"H100\"\nnum_gpus = 8\nprecision = \"BF16\"\n");
        assert_eq!(parse(&point("paper"), "f.toml").unwrap().len(), 1);
        for blank in ["", " \\t "] {
            let text = point("paper") + &point(blank);
            let e = parse(&text, "f.toml").unwrap_err();
            assert_eq!(
                e,
                "f.toml: point #1 (m H100 x8 BF16): source is empty; name where the run was published (a paper, a \
                 benchmark README's URL)"
            );
        }
        assert!(parse(&point("").replace("source = \"\"\n", ""), "f.toml").unwrap_err().contains("missing field `source`"));
    }

    /// A model no plugin provides is refused before any progress line says it is read.
    #[test]
    fn a_missing_model_is_not_said_to_be_read() {
        struct Missing;
        impl Resolver for Missing {
            fn resolve(&mut self, model: &str, _: u32) -> Result<(String, Box<dyn GraphSource>), String> {
                Err(format!("no installed workload plugin provides '{model}'"))
            }
        }
        let points = parse(&format!("{ONE}step_time_s = 2.0\n"), "f.toml").unwrap();
        let said = std::cell::RefCell::new(Vec::new());
        let prep = prepare(&points, &Profiles::builtin(), &mut Missing, &|m| said.borrow_mut().push(m.to_string()));
        assert_eq!(prep.unsupported.len(), 1);
        assert!(said.borrow().iter().all(|m| !m.starts_with("reading")), "{:?}", said.borrow());
    }

    const ONE: &str = "[[point]]\nsource = \"paper\"\nmodel = \"m\"\ngpu = \"H100\"\nnum_gpus = 16\nprecision = \"BF16\"\n\
                       seq_len = 4096\ngbs = 64\nmbs = 1\ntp = 2\npp = 2\n";

    /// A misspelt layout key would leave the layout at its default without a word: it is
    /// refused with the key it likely meant; keys that document the run (the shipped
    /// files' `notes`, `mfu`, `*_source`, ...) pass.
    #[test]
    fn an_unknown_key_is_refused_with_the_key_it_likely_meant() {
        let e = parse(&format!("{ONE}tp_size = 4\n"), "f.toml").unwrap_err();
        assert_eq!(e, "f.toml: point #0 (m H100 x16 BF16): unknown key `tp_size`\nhelp: did you mean `tp`?");
        let e = parse(&format!("{ONE}{ONE}frobnicate = 4\n").replace("gbs = 64\nmbs = 1\ntp = 2\npp = 2\n[[point]]", "gbs = 32\nmbs = 1\ntp = 2\npp = 2\n[[point]]"), "f.toml").unwrap_err();
        assert!(e.starts_with("f.toml: point #1 (m H100 x16 BF16): unknown key `frobnicate`\nhelp: a point reads source, model,"), "{e}");
        assert!(e.contains("or end in `_source`"), "{e}");
        let documented = format!("{ONE}notes = \"x\"\nmfu = 0.4\nlayout_source = \"README\"\ndp = 4\nga = 16\n");
        assert_eq!(parse(&documented, "f.toml").unwrap().len(), 1);
        // The shipped files use only keys a point reads or documents.
        for file in [include_str!("../data/calibration.toml"), include_str!("../data/other-frameworks.toml")] {
            parse(file, "shipped").unwrap();
        }
    }

    /// A point given twice would count twice in the statistics and weigh twice in a fit:
    /// refused, whatever the source says; the same layout with another figure is another
    /// run and passes.
    #[test]
    fn a_repeated_point_is_refused() {
        let twice = format!("{ONE}step_time_s = 2.0\n{}", format!("{ONE}step_time_s = 2.0\n").replace("paper", "blog"));
        let e = parse(&twice, "f.toml").unwrap_err();
        assert!(e.starts_with("f.toml: point #1 (m H100 x16 BF16) repeats point #0:"), "{e}");
        let other = format!("{ONE}step_time_s = 2.0\n{ONE}step_time_s = 2.1\n");
        assert_eq!(parse(&other, "f.toml").unwrap().len(), 2);
    }

    /// The repeat is found however far from its first, and is told by the first; a figure
    /// of -0.0 is the same as 0.0 (as `==` has it) and a NaN equals nothing.
    #[test]
    fn a_repeat_names_its_first_point_and_floats_compare_as_numbers() {
        let at = |s: f64| Point { model: "m".into(), gpu: "H100".into(), num_gpus: Some(8), precision: "BF16".into(), step_time_s: Some(s), ..Point::default() };
        let mut points: Vec<Point> = (1..=50).map(|i| at(f64::from(i))).collect();
        assert!(refuse_repeated_points(&points, "f").is_ok());
        points.push(at(7.0));
        let e = refuse_repeated_points(&points, "f").unwrap_err();
        assert!(e.starts_with("f: point #50 (m H100 x8 BF16) repeats point #6:"), "{e}");
        assert!(refuse_repeated_points(&[at(0.0), at(-0.0)], "f").unwrap_err().contains("point #1 (m H100 x8 BF16) repeats point #0"));
        assert!(refuse_repeated_points(&[at(f64::NAN), at(f64::NAN)], "f").is_ok());
    }

    /// `dp` and `ga` are only documented, but checked: one that disagrees with num_gpus,
    /// tp, pp, cp, gbs and mbs says a figure the projection reads is mistyped.
    #[test]
    fn a_documented_dp_or_ga_must_agree_with_the_layout() {
        assert_eq!(parse(&format!("{ONE}dp = 4\nga = 16\n"), "f.toml").unwrap().len(), 1);
        let e = parse(&format!("{ONE}dp = 8\n"), "f.toml").unwrap_err();
        assert_eq!(e, "f.toml: point #0 (m H100 x16 BF16): dp = 8, but num_gpus / (tp·pp·cp) = 16 / 4 = 4: correct whichever figure is mistyped");
        let e = parse(&format!("{ONE}ga = 8\n"), "f.toml").unwrap_err();
        assert_eq!(e, "f.toml: point #0 (m H100 x16 BF16): ga = 8, but gbs / (mbs·dp) = 64 / (1·4) = 16: correct whichever figure is mistyped");
    }

    /// `recompute_num_layers` is full recompute of that many layers per chunk; it is
    /// refused beside `recompute_modules` (one run recomputes one way) and at 0.
    #[test]
    fn recompute_num_layers_is_full_recompute_of_that_many_layers() {
        let p = Point { num_gpus: Some(64), seq_len: Some(4096), gbs: Some(128), fsdp: Some(64), recompute_num_layers: Some(20), ..Point::default() };
        let l = p.layout().unwrap();
        assert_eq!((l.recompute, l.recompute_layers), (RecomputePolicy::Full, 20));
        let none = Point { recompute_num_layers: None, ..p.clone() }.layout().unwrap();
        assert_eq!((none.recompute, none.recompute_layers), (RecomputePolicy::None, 0));
        let both = Point { recompute_modules: Some(vec!["core_attn".into()]), ..p.clone() };
        assert!(both.layout().unwrap_err().contains("both given"));
        assert!(Point { recompute_num_layers: Some(0), ..p }.layout().unwrap_err().contains("recompute_num_layers = 0"));
    }

    /// A tensor-parallel run overlaps its TP communication unless the row says it did not
    /// (`tp_comm_overlap = false`, Megatron-LM of 2022); without TP there is none.
    #[test]
    fn tp_comm_overlap_is_on_with_tp_unless_the_row_says_not() {
        let p = Point { num_gpus: Some(8), seq_len: Some(2048), gbs: Some(4), mbs: Some(4), tp: Some(8), ..Point::default() };
        assert!(p.layout().unwrap().tp_overlap);
        assert!(!Point { tp_comm_overlap: Some(false), ..p.clone() }.layout().unwrap().tp_overlap);
        assert!(!Point { tp: Some(1), tp_comm_overlap: Some(true), ..p }.layout().unwrap().tp_overlap);
    }

    #[test]
    fn stats_by_hand() {
        let s = Stats::of([0.01, -0.03, 0.02, 0.10, -0.05].into_iter());
        assert_eq!(s.points, 5);
        assert_eq!(s.median, 0.03);
        assert_eq!(s.p90, 0.10);
        assert_eq!(s.max, 0.10);
        let s = Stats::of([0.01, 0.02].into_iter());
        assert!((s.median - 0.015).abs() < 1e-12);
    }

    #[test]
    fn measured_step_derives_from_throughput() {
        let p = Point { seq_len: Some(4096), gbs: Some(1280), num_gpus: Some(64), tokens_per_sec_per_gpu: Some(20288.0), ..Point::default() };
        let s = p.measured_step().unwrap();
        assert!((s - 4096.0 * 1280.0 / (20288.0 * 64.0)).abs() < 1e-12);
        let none = Point { seq_len: Some(4096), ..Point::default() };
        assert!(none.measured_step().is_none());
        assert!(none.measured().unwrap_err().contains("neither"));
        // Figures that would print as infinities are refused by name.
        let zero = Point { step_time_s: Some(0.0), ..Point::default() };
        assert!(zero.measured().unwrap_err().contains("step_time_s = 0 is not a positive number"));
        let tiny = Point { step_time_s: Some(1e-300), ..Point::default() };
        assert!(tiny.measured().unwrap_err().contains("check its units"));
        let huge = Point { tokens_per_sec_per_gpu: Some(1e308), ..p.clone() };
        assert!(huge.measured().unwrap_err().contains("tokens_per_sec_per_gpu"));
        let nan = Point { tokens_per_sec_total: Some(f64::NAN), seq_len: Some(4096), gbs: Some(8), num_gpus: Some(8), ..Point::default() };
        assert!(nan.measured().unwrap_err().contains("not a positive number"));
        let partial = Point { tokens_per_sec_per_gpu: Some(1000.0), ..Point::default() };
        assert!(partial.measured().unwrap_err().contains("needs seq_len"));
        // A step time and a throughput that disagree (here a sequence length mistyped)
        // are refused; ones that agree to rounding give the step time.
        let step = 4096.0 * 1280.0 / (20288.0 * 64.0);
        let both = Point { step_time_s: Some(step * 1.001), ..p.clone() };
        assert_eq!(both.measured_step(), Some(step * 1.001));
        let typo = Point { seq_len: Some(40960), ..both.clone() };
        let e = typo.measured().unwrap_err();
        assert!(e.contains("disagree") && e.contains("tokens_per_sec_per_gpu = 20288"), "{e}");
    }

    #[test]
    fn a_vp_of_0_is_no_interleaving_and_figures_print_short() {
        let p = Point { num_gpus: Some(64), seq_len: Some(8192), gbs: Some(128), tp: Some(4), pp: Some(2), vp: Some(0), ..Point::default() };
        assert_eq!(p.layout().map(|l| (l.pp, l.vp)), Ok((2, 1)));
        // Plain below a million, scientific from it (and below a thousandth).
        assert_eq!((num(123_456.0), num(1e6), num(2.5e-4), num(0.0)), ("123456".into(), "1.0000e6".into(), "2.5000e-4".into(), "0".into()));
    }

    #[test]
    fn a_zero_count_is_refused_by_name() {
        let p = Point { num_gpus: Some(64), seq_len: Some(8192), gbs: Some(128), tp: Some(4), ..Point::default() };
        assert!(p.layout().is_ok());
        for (field, q) in [
            ("num_gpus", Point { num_gpus: Some(0), ..p.clone() }),
            ("seq_len", Point { seq_len: Some(0), ..p.clone() }),
            ("gbs", Point { gbs: Some(0), ..p.clone() }),
        ] {
            let e = q.layout().unwrap_err();
            assert!(e.starts_with(&format!("{field} = 0")), "{e}");
        }
    }

    #[test]
    fn layout_refuses_what_the_source_leaves_out() {
        let p = Point { num_gpus: Some(64), seq_len: Some(8192), gbs: Some(128), tp: Some(3), ..Point::default() };
        assert!(p.layout().unwrap_err().contains("does not divide the 64 GPUs"));
        let p = Point { num_gpus: Some(64), seq_len: Some(8192), ..Point::default() };
        assert!(p.layout().unwrap_err().contains("global batch"));
        let p = Point { num_gpus: Some(64), seq_len: Some(8192), gbs: Some(128), tp: Some(4), pp: Some(4), cp: Some(2), vp: Some(5), ..Point::default() };
        let l = p.layout().unwrap();
        assert_eq!((l.dp, l.vp, l.sequence_parallel, l.distributed_optimizer), (2, 5, true, true));
    }

    /// A run's `cpu_offloading_num_layers` becomes its layout's offload, parsed from the file.
    #[test]
    fn cpu_offloading_follows_the_point() {
        let text = "[[point]]\nsource = \"s\"\nmodel = \"m\"\ngpu = \"GB300\"\nprecision = \"FP8\"\nnum_gpus = 64\nseq_len = 8192\ngbs = 256\nmbs = 2\nfsdp = 64\ncpu_offloading_num_layers = 20\n";
        let p = &parse(text, "t").unwrap()[0];
        assert_eq!(p.layout().unwrap().offload_layers, 20);
        assert_eq!(Point { cpu_offloading_num_layers: None, ..p.clone() }.layout().unwrap().offload_layers, 0);
    }

    /// The EP overlap follows the point: on by default for an expert-parallel run, off
    /// where the file records the recipe's `moe_a2a_overlap = False`, never on without EP.
    #[test]
    fn ep_overlap_follows_the_point() {
        let moe = Point { num_gpus: Some(16), seq_len: Some(4096), gbs: Some(1024), tp: Some(1), ep: Some(16), ..Point::default() };
        assert!(moe.layout().unwrap().ep_overlap);
        let off = Point { ep_overlap: Some(false), ..moe.clone() };
        assert!(!off.layout().unwrap().ep_overlap);
        let parsed = &parse("[[point]]\nsource = \"s\"\nmodel = \"m\"\ngpu = \"H100\"\nprecision = \"FP8\"\nep_overlap = false\n", "t").unwrap()[0];
        assert_eq!(parsed.ep_overlap, Some(false));
        let dense = Point { ep: None, ep_overlap: Some(true), ..moe };
        assert!(!dense.layout().unwrap().ep_overlap);
    }

    /// Every field of a point reaches its layout, written out by hand: an MoE run with
    /// FSDP's table flag, selective recompute, the embedding counted in the pipeline
    /// split, offloading, Muon, the fused grouped MLP and the all-to-all dispatcher; a
    /// dense run with pp alone and the loss counted.
    #[test]
    fn a_points_fields_become_its_layout() {
        let moe = Point {
            num_gpus: Some(128),
            seq_len: Some(4096),
            gbs: Some(512),
            mbs: Some(2),
            tp: Some(2),
            pp: Some(4),
            cp: Some(2),
            vp: Some(3),
            ep: Some(8),
            etp: Some(2),
            fsdp: Some(1),
            recompute_modules: Some(vec!["core_attn".into(), "mlp".into()]),
            account_for_embedding_in_pipeline_split: Some(true),
            account_for_loss_in_pipeline_split: Some(false),
            cpu_offloading_num_layers: Some(3),
            optimizer: Some("muon".into()),
            cutedsl_fused_grouped_mlp: Some(true),
            ep_dispatcher: Some(Dispatcher::AllToAll),
            ..Point::default()
        };
        let want = LayoutSpec {
            tp: 2,
            pp: 4,
            cp: 2,
            vp: 3,
            ep: 8,
            etp: 2,
            dp: 8,
            mbs: 2,
            gbs: 512,
            sequence_parallel: true,
            fsdp: true,
            recompute: RecomputePolicy::Selective,
            recompute_layers: 0,
            recompute_modules: Modules::of(&[Module::CoreAttn, Module::Mlp]),
            distributed_optimizer: false,
            tp_overlap: true,
            ep_overlap: true,
            dp_overlap: true,
            grad_fp32: false,
            split: PipelineSplit::megatron(true, false),
            offload_layers: 3,
            optimizer: Optimizer::Muon,
            kernels: Kernels { fused_grouped_mlp: true, dispatcher: Dispatcher::AllToAll },
            pipeline: PipelineKind::OneFOneB,
        };
        assert_eq!(moe.layout().unwrap(), want);
        let dense = Point {
            num_gpus: Some(16),
            seq_len: Some(8192),
            gbs: Some(64),
            pp: Some(2),
            ep_overlap: Some(true),
            account_for_loss_in_pipeline_split: Some(true),
            ..Point::default()
        };
        let want = LayoutSpec {
            tp: 1,
            pp: 2,
            cp: 1,
            vp: 1,
            ep: 1,
            etp: 1,
            dp: 8,
            mbs: 1,
            gbs: 64,
            sequence_parallel: false,
            fsdp: false,
            recompute: RecomputePolicy::None,
            recompute_layers: 0,
            recompute_modules: Modules::default(),
            distributed_optimizer: true,
            tp_overlap: false,
            ep_overlap: false,
            dp_overlap: true,
            grad_fp32: false,
            split: PipelineSplit::megatron(false, true),
            offload_layers: 0,
            optimizer: Optimizer::AdamW,
            kernels: Kernels::default(),
            pipeline: PipelineKind::OneFOneB,
        };
        assert_eq!(dense.layout().unwrap(), want);
        // FSDP alone is a parallel layout (its group over the 16 GPUs); nothing is none.
        let fsdp = Point { pp: None, fsdp: Some(16), ..dense.clone() };
        assert_eq!(fsdp.layout().map(|l| (l.dp, l.fsdp)), Ok((16, true)));
        let none = Point { pp: None, ..dense };
        assert_eq!(none.layout().unwrap_err(), "the source gives no parallel layout");
    }

    /// The step range holds at both ends; a per-GPU throughput, where the total is given
    /// too, gives the step; a step time twice the throughput's is refused as one half of it.
    #[test]
    fn measured_step_bounds_precedence_and_agreement() {
        let (lo, hi) = STEP_RANGE_S;
        for s in [lo, hi] {
            assert_eq!(Point { step_time_s: Some(s), ..Point::default() }.measured(), Ok(s));
        }
        assert!(Point { step_time_s: Some(hi * 1.001), ..Point::default() }.measured().is_err());
        // 8 GPUs, 4096 x 16 tokens a step: 1000 tokens/s per GPU is 8.192 s; a total
        // figure that disagrees is not the one read.
        let both = Point { seq_len: Some(4096), gbs: Some(16), num_gpus: Some(8), tokens_per_sec_per_gpu: Some(1000.0), tokens_per_sec_total: Some(1.0), ..Point::default() };
        assert_eq!(both.measured(), Ok(8.192));
        for s in [8.192 * 2.0, 8.192 / 2.0] {
            let e = Point { step_time_s: Some(s), ..both.clone() }.measured().unwrap_err();
            assert!(e.contains("disagree"), "{s}: {e}");
        }
    }

    #[test]
    fn a_point_is_named_by_model_gpu_count_and_precision() {
        let p = Point { model: "llama3-70b".into(), gpu: "H100".into(), num_gpus: Some(64), precision: "FP8".into(), ..Point::default() };
        assert_eq!(p.label(), "llama3-70b H100 x64 FP8");
        assert_eq!(Point { num_gpus: None, ..p }.label(), "llama3-70b H100 x? FP8");
    }
}
