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
//! memory_mib = 256         # linear memory per plugin instance, 1 to 4096 MiB (wasm32's 4 GiB)
//! call_timeout_ms = 10000  # deadline of one plugin call, 1 ms to a day
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
    #[serde(deserialize_with = "section")]
    pub model: ModelSection,
    #[serde(default, deserialize_with = "section")]
    pub cluster: ClusterSection,
    #[serde(default, deserialize_with = "section")]
    pub precision: PrecisionSection,
    #[serde(default, deserialize_with = "section")]
    pub cost: CostSection,
    #[serde(default, deserialize_with = "limits")]
    pub limits: Limits,
    #[serde(default, deserialize_with = "section")]
    pub measure: MeasureSection,
    #[serde(default, deserialize_with = "section")]
    pub layout: LayoutSection,
    #[serde(default, deserialize_with = "section")]
    pub explore: ExploreSection,
    #[serde(default, deserialize_with = "section")]
    pub assumptions: Assumptions,
}

/// A section of the run file, by the name the file gives it.
trait Section {
    const NAME: &'static str;
}

/// Each section type with the name the file gives it.
macro_rules! sections {
    ($($ty:ty => $name:literal),* $(,)?) => {
        $(impl Section for $ty {
            const NAME: &'static str = $name;
        })*
    };
}
sections! {
    ModelSection => "model",
    ClusterSection => "cluster",
    PrecisionSection => "precision",
    CostSection => "cost",
    Limits => "limits",
    MeasureSection => "measure",
    LayoutSection => "layout",
    ExploreSection => "explore",
    Assumptions => "assumptions",
}

/// A section, read from a table and from nothing else. Serde reads a list as a struct's
/// fields in order, so `measure = [3]` ran with repeats = 3 without a word, and
/// `[[cluster]]` was answered about a key the file never wrote; any other value was
/// answered "expected struct ModelSection", a name the file never wrote. (The file was
/// parsed a second time, as a document, to catch the lists before serde read them.)
fn section<'de, D: serde::Deserializer<'de>, T: Section + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    use serde::de::{DeserializeSeed, Error, MapAccess, SeqAccess, Visitor};
    struct Table<T>(std::marker::PhantomData<T>);
    /// The error for a section written as `what` (a value, shown short), with the fix.
    fn not_a_table<T: Section, E: Error>(what: &str) -> E {
        E::custom(format!("[{0}] must be a table, not {what}: write [{0}] with its keys under it, or {0} = {{ key = value, ... }}", T::NAME))
    }
    impl<'de, T: Section + Deserialize<'de>> Visitor<'de> for Table<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "the [{}] table", T::NAME)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(Keys(map, std::marker::PhantomData::<T>)))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<T, A::Error> {
            Err(A::Error::custom(format!(
                "[{0}] is one table, not a list: write [{0}] with its keys under it (not [[{0}]] or {0} = [...])",
                T::NAME
            )))
        }
        fn visit_bool<E: Error>(self, v: bool) -> Result<T, E> {
            Err(not_a_table::<T, _>(&format!("{v}")))
        }
        fn visit_i64<E: Error>(self, v: i64) -> Result<T, E> {
            Err(not_a_table::<T, _>(&format!("the number {v}")))
        }
        fn visit_u64<E: Error>(self, v: u64) -> Result<T, E> {
            Err(not_a_table::<T, _>(&format!("the number {v}")))
        }
        fn visit_f64<E: Error>(self, v: f64) -> Result<T, E> {
            Err(not_a_table::<T, _>(&format!("the number {}", number(v))))
        }
        fn visit_str<E: Error>(self, v: &str) -> Result<T, E> {
            Err(not_a_table::<T, _>(&format!("the string {}", runner_contract::text::shown(v))))
        }
    }
    /// A section's map, its keys checked for the one TOML hands a date-time over with (a
    /// map of one private key, which the section refused as an unknown key of that name).
    struct Keys<A, T>(A, std::marker::PhantomData<T>);
    struct Key<K, T>(K, std::marker::PhantomData<T>);
    impl<'de, A: MapAccess<'de>, T: Section> MapAccess<'de> for Keys<A, T> {
        type Error = A::Error;
        fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
            self.0.next_key_seed(Key(seed, std::marker::PhantomData::<T>))
        }
        fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
            self.0.next_value_seed(seed)
        }
        fn size_hint(&self) -> Option<usize> {
            self.0.size_hint()
        }
    }
    impl<'de, K: DeserializeSeed<'de>, T: Section> DeserializeSeed<'de> for Key<K, T> {
        type Value = K::Value;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<K::Value, D::Error> {
            let key = String::deserialize(d)?;
            if key == "$__toml_private_datetime" {
                return Err(not_a_table::<T, _>("a date-time"));
            }
            self.0.deserialize(serde::de::IntoDeserializer::<D::Error>::into_deserializer(key))
        }
    }
    d.deserialize_map(Table(std::marker::PhantomData))
}

/// Parallel dimensions the layout search must keep (a published layout to reproduce, or
/// what a cluster's software supports); what is left out is searched.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LayoutSection {
    #[serde(deserialize_with = "degree")]
    pub tp: Option<u32>,
    #[serde(deserialize_with = "degree")]
    pub pp: Option<u32>,
    #[serde(deserialize_with = "degree")]
    pub cp: Option<u32>,
    /// Virtual pipeline chunks per stage (interleaved 1F1B).
    #[serde(deserialize_with = "degree")]
    pub vp: Option<u32>,
    #[serde(deserialize_with = "degree")]
    pub ep: Option<u32>,
    #[serde(deserialize_with = "degree")]
    pub etp: Option<u32>,
    /// Micro-batch, sequences.
    #[serde(deserialize_with = "degree")]
    pub mbs: Option<u32>,
    /// Shard parameters, gradients and optimizer state (FSDP / ZeRO-3): true or false.
    pub fsdp: Option<bool>,
    /// Activation recompute: none, selective or full.
    pub recompute: Option<RecomputePolicy>,
    /// How the layers split over pipeline chunks: `{ embedding = 1, loss = 1 }` counts
    /// the embedding and the loss as a layer each (Megatron's
    /// `account_for_*_in_pipeline_split`), `{ embedding = 0, loss = 0 }` splits evenly;
    /// absent, the search tries both. Each key counts 0 to the contract's layer ceiling.
    #[serde(deserialize_with = "pipeline_split")]
    pub pipeline_split: Option<PipelineSplit>,
    /// Layers per pipeline chunk whose activations go to host memory between forward and
    /// backward (Megatron's `cpu_offloading_num_layers`); absent: none.
    #[serde(deserialize_with = "offload_layers")]
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
    /// The pipeline schedule: `1f1b` (Megatron's), `dualpipe` (DeepSeek's) or
    /// `dualpipev` (DualPipe cut in half); absent: 1f1b.
    pub pipeline_schedule: Option<runner_project::step::PipelineKind>,
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
            pipeline: self.pipeline_schedule.unwrap_or_default(),
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
        match self.pipeline_schedule {
            Some(runner_project::step::PipelineKind::DualPipe) => parts.push("DualPipe".into()),
            Some(runner_project::step::PipelineKind::DualPipeV) => parts.push("DualPipeV".into()),
            _ => {}
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
/// An integer is a number here: serde's f64 takes every integer TOML has (i64), so an
/// `Int(i64)` variant after `Float` was never reached.
fn quantity<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Quantity {
        Float(f64),
        Text(String),
    }
    match Quantity::deserialize(d) {
        Ok(Quantity::Float(v)) => Ok(Some(v)),
        Ok(Quantity::Text(s)) => crate::input::quantity(&s).map(Some).map_err(serde::de::Error::custom),
        Err(_) => Err(serde::de::Error::custom("expected a number, e.g. 1.5e12, or a string with a suffix, e.g. \"15T\"")),
    }
}

/// A whole number of a key whose range is `LO..=HI`: a value its type does not hold (`-1`,
/// `"8"`, `8.5`, 2^40 for a u32) is refused with that range, not the type's ("0 to
/// 4294967295" for `seq_len = -1`); one the type holds is left to [`check`], which says
/// the same range with the key's name.
struct Whole<T, const LO: u64, const HI: u64>(T);

impl<'de, T: TryFrom<u64>, const LO: u64, const HI: u64> Deserialize<'de> for Whole<T, LO, HI> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor<T, const LO: u64, const HI: u64>(std::marker::PhantomData<T>);
        impl<T: TryFrom<u64>, const LO: u64, const HI: u64> serde::de::Visitor<'_> for Visitor<T, LO, HI> {
            type Value = Whole<T, LO, HI>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "a whole number from {LO} to {HI}")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::invalid_value(serde::de::Unexpected::Signed(v), &self)),
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                T::try_from(v).map(Whole).map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
            }
        }
        d.deserialize_u64(Visitor(std::marker::PhantomData))
    }
}

/// A GPU count or a layout degree ([`within_gpu_ceiling`]).
type Count = Whole<u32, 1, { runner_contract::limits::GPUS as u64 }>;

fn gpu_counts<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    Ok(Vec::<Count>::deserialize(d)?.into_iter().map(|c| c.0).collect())
}

fn degree<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Ok(Option::<Count>::deserialize(d)?.map(|c| c.0))
}

fn seq_len<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Ok(Option::<Whole<u32, 1, { runner_contract::limits::SEQ_LEN as u64 }>>::deserialize(d)?.map(|c| c.0))
}

fn gbs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Ok(Option::<Whole<u32, 1, { u32::MAX as u64 }>>::deserialize(d)?.map(|c| c.0))
}

fn offload_layers<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Ok(Option::<Whole<u32, 0, { runner_contract::limits::LAYERS as u64 }>>::deserialize(d)?.map(|c| c.0))
}

/// Layers the embedding or the loss may count as in `[layout] pipeline_split`: no more
/// than a model may have layers ([`runner_contract::limits::LAYERS`]).
type SplitUnits = Whole<u32, 0, { runner_contract::limits::LAYERS as u64 }>;

/// `[layout] pipeline_split` as the file writes it: each key ranged like
/// `offload_layers` (a value u32 does not hold was refused as "0 to 4294967295"); a value
/// that is no table is told the table's example by `expecting` (serde never names
/// `PipelineSplit` to [`plain`]: the file is read as these keys).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table, e.g. { embedding = 1, loss = 1 }")]
struct SplitKeys {
    #[serde(default)]
    embedding: Option<SplitUnits>,
    #[serde(default)]
    loss: Option<SplitUnits>,
}

fn pipeline_split<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<PipelineSplit>, D::Error> {
    let split = |k: SplitKeys| PipelineSplit { embedding: k.embedding.map_or(0, |u| u.0), loss: k.loss.map_or(0, |u| u.0) };
    Ok(Option::<SplitKeys>::deserialize(d)?.map(split))
}

/// Most timed steps `[measure] repeats` takes: past a thousand the figures are no tighter.
const MAX_REPEATS: usize = 1000;

fn repeats<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    Ok(Whole::<usize, 1, { MAX_REPEATS as u64 }>::deserialize(d)?.0)
}

/// The most linear memory a plugin instance may be given, MiB: a wasm32 instance
/// addresses 4 GiB at most (65 536 pages of 64 KiB), so a larger cap would not be one.
pub const MAX_PLUGIN_MEMORY_MIB: u64 = 4096;
/// The longest deadline of one plugin call, milliseconds: a day (no plugin call is
/// meant to take more than seconds).
pub const MAX_CALL_TIMEOUT_MS: u64 = 86_400_000;

/// `[limits]` as the run file writes it: [`Limits`] with its keys' ranges said.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct LimitsKeys {
    #[serde(deserialize_with = "memory_mib")]
    memory_mib: u64,
    #[serde(deserialize_with = "call_timeout_ms")]
    call_timeout_ms: u64,
}

impl Default for LimitsKeys {
    fn default() -> Self {
        let l = Limits::default();
        LimitsKeys { memory_mib: l.memory_mib, call_timeout_ms: l.call_timeout_ms }
    }
}

impl Section for LimitsKeys {
    const NAME: &'static str = "limits";
}

fn memory_mib<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(Whole::<u64, 1, MAX_PLUGIN_MEMORY_MIB>::deserialize(d)?.0)
}

fn call_timeout_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(Whole::<u64, 1, MAX_CALL_TIMEOUT_MS>::deserialize(d)?.0)
}

fn limits<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Limits, D::Error> {
    let k: LimitsKeys = section(d)?;
    Ok(Limits { memory_mib: k.memory_mib, call_timeout_ms: k.call_timeout_ms })
}

/// How long to spend measuring on the local device.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MeasureSection {
    /// Timed training steps after one warm-up; more gives tighter figures.
    #[serde(deserialize_with = "repeats")]
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
    #[serde(default, deserialize_with = "seq_len")]
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
    #[serde(deserialize_with = "gpu_counts")]
    pub gpus: Vec<u32>,
    /// Global batch in sequences; default: the variant's published rule, off its GPU range scaled per GPU up to the job's compute-optimal batch.
    #[serde(deserialize_with = "gbs")]
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
    let run: RunFile = toml::from_str(text).map_err(|e| {
        // Quoted here rather than by the error's own rendering, which shows the line raw
        // and whole (its carets then land early after an escape a terminal needs, and a
        // 600 KB line is quoted in full).
        let at = e.span().map_or_else(String::new, |span| quote(text, span.clone()));
        let value = e.span().and_then(|span| text.get(span)).unwrap_or_default();
        let help = hint(e.message()).map_or_else(String::new, |h| format!("\nhelp: {h}"));
        format!("{origin}: {at}{}{help}", short(&plain(e.message(), value)))
    })?;
    check(&run).map_err(|m| format!("{origin}: {}{}", snippet(text, &m), short(&m)))?;
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
    quote(text, span)
}

/// The most columns of a line [`quote`] shows: a refused line of 600 KB (one long list)
/// was quoted whole.
const QUOTE_WIDTH: usize = 120;

/// Where `span` (byte offsets in `text`) sits, as TOML's own errors show it: "line L,
/// column C" (C counts the file's characters, as an editor does), the line, and carets
/// under the span. The line is shown as a terminal must print it, each control or bidi
/// character as a visible escape (`\u{1b}`), and the carets are counted in that rendering
/// (counted in the file's characters, they landed early after an escape). A line wider
/// than [`QUOTE_WIDTH`] is cut to a window around the span, with "..." where it is cut.
fn quote(text: &str, span: std::ops::Range<usize>) -> String {
    let boundary = |i: usize| (0..=i.min(text.len())).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    let start = boundary(span.start);
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let line = text[line_start..line_end].trim_end_matches('\r');
    let number = text[..start].matches('\n').count() + 1;
    let column = text[line_start..start].chars().count();
    // The span within the shown line: a span on the line's trailing CR, or past it, sits
    // just after the line.
    let (from, to) = (start - line_start, boundary(span.end).saturating_sub(line_start));
    // Each character as shown, and the columns it takes.
    let shown = |c: char| if runner_contract::text::is_escaped(c) { runner_contract::text::escape(c.encode_utf8(&mut [0; 4]), usize::MAX) } else { c.to_string() };
    // A wide character (CJK, most emoji) takes two columns, a combining mark none.
    let width = |c: char| if runner_contract::text::is_escaped(c) { shown(c).len() } else { crate::report::char_columns(c) };
    // An empty span (TOML's, at a character it refuses) underlines that one character.
    let (mut caret, mut caret_end, mut total, mut first_width) = (None, None, 0, 1);
    for (i, c) in line.char_indices() {
        if caret.is_none() && i >= from {
            caret = Some(total);
            first_width = width(c);
        }
        if caret_end.is_none() && i >= to {
            caret_end = Some(total);
        }
        total += width(c);
    }
    let caret = caret.unwrap_or(total);
    let caret_end = caret_end.unwrap_or(total).max(caret + first_width);
    // The window of columns shown: the whole line when it fits, else QUOTE_WIDTH columns
    // around the span (from its start when it is wider).
    let (lo, hi) = if total <= QUOTE_WIDTH {
        (0, total)
    } else {
        let room = (QUOTE_WIDTH.saturating_sub(caret_end - caret) / 2).max(QUOTE_WIDTH / 8);
        let lo = caret.saturating_sub(room).min(total - QUOTE_WIDTH);
        (lo, lo + QUOTE_WIDTH)
    };
    // The characters wholly in the window (an escape is never cut).
    let (mut body, mut first, mut last, mut at) = (String::new(), None, 0, 0);
    for c in line.chars() {
        let w = width(c);
        if at >= lo && at + w <= hi {
            first.get_or_insert(at);
            last = at + w;
            body.push_str(&shown(c));
        }
        at += w;
    }
    let first = first.unwrap_or(lo.min(total));
    let last = last.max(first);
    let (left, right) = (if first > 0 { "..." } else { "" }, if last < total { "..." } else { "" });
    let under_from = caret.clamp(first, last);
    let under_to = caret_end.clamp(first, last.max(first + 1)).max(under_from + 1);
    let gutter = " ".repeat(number.to_string().len());
    format!(
        "line {number}, column {}\n{gutter} |\n{number} | {left}{body}{right}\n{gutter} | {}{}\n",
        column + 1,
        " ".repeat(left.len() + under_from - first),
        "^".repeat(under_to - under_from)
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
    let near: Vec<String> = crate::input::nearest(&unknown, &expected).iter().map(|k| format!("`{k}`")).collect();
    if !near.is_empty() {
        return Some(format!("did you mean {}?", near.join(" or ")));
    }
    // A key of another section: where it goes.
    let home = SECTIONS.iter().find(|(_, keys)| keys().contains(&unknown))?;
    Some(format!("`{unknown}` goes in [{}]", home.0))
}

/// A deserializer's message in the file's words: the Rust types serde names ("expected
/// u32", "expected usize", "expected struct ...") said as what to write, serde's
/// "map" and "sequence" as the table, date-time or list `value` (the refused text) is, and
/// toml's words for a name given as another type ("wanted string or table").
fn plain(message: &str, value: &str) -> String {
    // A date-time is handed over as a map of one private key (see `section`).
    if message.contains("`$__toml_private_datetime`") {
        return "invalid type: date-time, expected a table".into();
    }
    if message.starts_with("wanted ") {
        return "expected one of its names, in quotes (e.g. recompute = \"full\")".into();
    }
    let Some((head, wanted)) = message.rsplit_once(", expected ") else {
        return message.to_string();
    };
    let found = if value.starts_with(|c: char| c.is_ascii_digit()) { "date-time" } else { "table" };
    let head = match head.strip_prefix("invalid type: ") {
        Some("map") => format!("invalid type: {found}"),
        Some("sequence") => "invalid type: list".to_string(),
        _ => head.to_string(),
    };
    let whole = |max: u64| format!("a whole number from 0 to {max}");
    let wanted = match wanted {
        "u8" => whole(u8::MAX.into()),
        "u16" => whole(u16::MAX.into()),
        "u32" => whole(u32::MAX.into()),
        "u64" | "usize" => whole(u64::MAX),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".into(),
        "f32" | "f64" => "a number".into(),
        "a sequence" => "a list, e.g. [1, 2]".into(),
        w if w.starts_with("struct ") => "a table".into(),
        w if w.starts_with("enum ") => "one of its names, in quotes".into(),
        w => w.into(),
    };
    format!("{head}, expected {wanted}")
}

/// `message` with every word of over 80 characters cut to its first 64 and "...", its
/// closing quote or punctuation kept: a message quotes what it refuses (`tp = "<600 KB>"`
/// was "invalid type: string \"<600 KB>\"", an unknown key of 600 KB "unknown field").
fn short(message: &str) -> String {
    if !message.split(' ').any(|w| w.chars().count() > 80) {
        return message.to_string();
    }
    let words: Vec<String> = message
        .split(' ')
        .map(|w| {
            if w.chars().count() <= 80 {
                return w.to_string();
            }
            let kept: String = w.chars().take(64).collect();
            let tail = w.trim_end_matches(['"', '\'', '`', ',', ';', ':', ')']);
            format!("{kept}...{}", &w[tail.len()..])
        })
        .collect();
    words.join(" ")
}

/// A section's keys.
type Keys = fn() -> Vec<String>;

/// Each section and its keys, for [`hint`].
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
    if !(1..=MAX_REPEATS).contains(&run.measure.repeats) {
        return Err(format!(
            "[measure] repeats must be in 1..={MAX_REPEATS}, got {}",
            run.measure.repeats
        ));
    }
    if run.limits.memory_mib < 1 || run.limits.call_timeout_ms < 1 {
        return Err("[limits] memory_mib and call_timeout_ms must be at least 1".into());
    }
    if run.limits.memory_mib > MAX_PLUGIN_MEMORY_MIB {
        return Err(format!(
            "[limits] memory_mib must be in 1..={MAX_PLUGIN_MEMORY_MIB} (a wasm32 plugin addresses 4 GiB at most), got {}",
            run.limits.memory_mib
        ));
    }
    if run.limits.call_timeout_ms > MAX_CALL_TIMEOUT_MS {
        return Err(format!(
            "[limits] call_timeout_ms must be in 1..={MAX_CALL_TIMEOUT_MS} (a day), got {}",
            run.limits.call_timeout_ms
        ));
    }
    if let Some(n) = run.layout.offload_layers
        && n > runner_contract::limits::LAYERS
    {
        return Err(format!("[layout] offload_layers must be in 0..={}, got {n}", runner_contract::limits::LAYERS));
    }
    if let Some(s) = run.layout.pipeline_split {
        for (key, n) in [("embedding", s.embedding), ("loss", s.loss)] {
            if n > runner_contract::limits::LAYERS {
                return Err(format!(
                    "[layout] pipeline_split {key} must be in 0..={} (the layers the {key} counts as), got {n}",
                    runner_contract::limits::LAYERS
                ));
            }
        }
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
            "[cost] option {} is not one of {} (reserved-1y and reserved-3y also name the no-upfront terms)",
            runner_contract::text::shown(s),
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

/// Why a flag's text is not a number under [`within_gpu_ceiling`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CeilingError {
    /// Not a whole number at all (`x`, `-3`, `1.5`, empty).
    NotWhole,
    /// A whole number outside 1 to the ceiling: 0, or past it (past u32 too, which a
    /// plain `parse::<u32>` reported as "not a whole number").
    OutOfRange,
}

/// A flag's text as a number under [`within_gpu_ceiling`], surrounding spaces ignored.
pub fn parse_within_gpu_ceiling(s: &str) -> Result<u32, CeilingError> {
    let t = s.trim();
    let digits = t.strip_prefix('+').unwrap_or(t);
    match t.parse::<u32>() {
        Ok(n) if within_gpu_ceiling(n) => Ok(n),
        Ok(_) => Err(CeilingError::OutOfRange),
        Err(_) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => Err(CeilingError::OutOfRange),
        Err(_) => Err(CeilingError::NotWhole),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole number too big for u32 is out of range, not "not a whole number".
    #[test]
    fn ceiling_numbers_tell_out_of_range_from_not_whole() {
        let max = runner_contract::limits::GPUS;
        assert_eq!(parse_within_gpu_ceiling(" 8 "), Ok(8));
        assert_eq!(parse_within_gpu_ceiling("+8"), Ok(8));
        assert_eq!(parse_within_gpu_ceiling(&max.to_string()), Ok(max));
        for out in ["0", "1048577", "4294967296", "99999999999999999999999"] {
            assert_eq!(parse_within_gpu_ceiling(out), Err(CeilingError::OutOfRange), "{out}");
        }
        for bad in ["", "x", "-3", "1.5", "8,16", "+", "8\u{1b}[2J"] {
            assert_eq!(parse_within_gpu_ceiling(bad), Err(CeilingError::NotWhole), "{bad}");
        }
    }

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

    /// A TOML integer is a quantity as a float is: serde's untagged `Float(f64)` takes
    /// every integer TOML has (i64), so `quantity` needs no integer branch (the one it
    /// had was never reached: with `unreachable!()` in it, every test passed).
    #[test]
    fn integers_are_quantities() {
        let run = |body: &str| parse(&format!("[model]\nplugin = \"x\"\n{body}\n"), "t.toml");
        assert_eq!(run("tokens = 1000000").unwrap().model.tokens, Some(1e6));
        assert_eq!(run("tokens = 0x10").unwrap().model.tokens, Some(16.0));
        assert_eq!(run("[explore]\nbudget_usd = 2_000_000").unwrap().explore.budget_usd, Some(2e6));
        let e = run("tokens = 9223372036854775807").unwrap_err();
        assert!(e.ends_with("[model] tokens must be a positive number up to 1e16, got 9.223372036854776e18"), "{e}");
        let e = run("[explore]\nbudget_usd = -9223372036854775808").unwrap_err();
        assert!(e.ends_with("budget_usd must be a positive number from 1 to 1e12, got -9.223372036854776e18"), "{e}");
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
        // A key left out counts as 0.
        let run = parse("[model]\nplugin = \"x\"\n[layout]\npipeline_split = { loss = 3 }\n", "t.toml").unwrap();
        assert_eq!(run.layout.space().split, Some(PipelineSplit { embedding: 0, loss: 3 }));
        // Each key's range, the key named and the line shown. Kills: the `check` rule
        // deleted, or one key left out of it.
        for (key, split) in [("embedding", "{ embedding = 10001, loss = 1 }"), ("loss", "{ embedding = 1, loss = 10001 }")] {
            let err = parse(&format!("[model]\nplugin = \"x\"\n[layout]\npipeline_split = {split}\n"), "t.toml").unwrap_err();
            assert!(err.contains(&format!("[layout] pipeline_split {key} must be in 0..=10000 (the layers the {key} counts as), got 10001")), "{err}");
            assert!(err.contains("line 4"), "{err}");
        }
        let run = parse("[model]\nplugin = \"x\"\n[layout]\npipeline_split = { embedding = 10000, loss = 10000 }\n", "t.toml").unwrap();
        assert_eq!(run.layout.space().split, Some(PipelineSplit { embedding: 10000, loss: 10000 }));
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

    /// `[layout] pipeline_schedule` picks DeepSeek's DualPipe, or DualPipeV, for every
    /// layout (absent: Megatron's 1F1B); another name is refused with the three.
    #[test]
    fn pipeline_schedule_is_read() {
        use runner_project::step::PipelineKind;
        let run = parse("[model]\nplugin = \"x\"\n[layout]\npipeline_schedule = \"DualPipe\"\n", "t.toml").unwrap();
        assert_eq!(run.layout.space().pipeline, PipelineKind::DualPipe);
        assert!(run.layout.describe().contains("DualPipe"), "{}", run.layout.describe());
        let run = parse("[model]\nplugin = \"x\"\n[layout]\npipeline_schedule = \"dualpipev\"\n", "t.toml").unwrap();
        assert_eq!(run.layout.space().pipeline, PipelineKind::DualPipeV);
        assert!(run.layout.describe().ends_with("DualPipeV"), "{}", run.layout.describe());
        let run = parse("[model]\nplugin = \"x\"\n", "t.toml").unwrap();
        assert_eq!(run.layout.space().pipeline, PipelineKind::OneFOneB);
        let e = parse("[model]\nplugin = \"x\"\n[layout]\npipeline_schedule = \"gpipe\"\n", "t.toml").unwrap_err();
        assert!(e.contains("unknown pipeline schedule 'gpipe': use 1f1b") && e.contains("dualpipev"), "{e}");
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
        // A plugin's linear memory past wasm32's 4 GiB, a deadline past a day, an offload
        // past the layer ceiling: refused, not taken silently.
        accepted("[limits]\nmemory_mib = 4096");
        refused("[limits]\nmemory_mib = 4097", "[limits] memory_mib must be in 1..=4096 (a wasm32 plugin addresses 4 GiB at most), got 4097");
        refused("[limits]\nmemory_mib = 100000000000", "[limits] memory_mib must be in 1..=4096");
        accepted("[limits]\ncall_timeout_ms = 86400000");
        refused("[limits]\ncall_timeout_ms = 86400001", "[limits] call_timeout_ms must be in 1..=86400000 (a day), got 86400001");
        accepted("[layout]\noffload_layers = 10000");
        refused("[layout]\noffload_layers = 10001", "[layout] offload_layers must be in 0..=10000, got 10001");
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
    /// rest of the message is escaped where it is printed. A zero-width space is escaped
    /// in the snippet too, the carets under the escape (it was left raw, and escaped only
    /// where printed, eight columns the carets did not count).
    #[test]
    fn a_refused_line_shows_bidi_controls_escaped() {
        let e = parse("[model]\nplugin = \"x\"\n[cost]\noption = \"\u{202e}spot\"\n", "t.toml").unwrap_err();
        let shown = e.lines().find(|l| l.starts_with("4 | ")).unwrap_or_default();
        assert_eq!(shown, "4 | option = \"\\u{202e}spot\"", "{e}");
        let e = parse("[model]\nplugin = \"x\"\n[cost]\noption = \"\u{200b}spot\"\n", "t.toml").unwrap_err();
        let mut lines = e.lines().skip_while(|l| !l.starts_with("4 | "));
        assert_eq!(lines.next(), Some("4 | option = \"\\u{200b}spot\""), "{e}");
        assert_eq!(lines.next(), Some("  |          ^^^^^^^^^^^^^^"), "{e}");
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

    /// A section written as a list is refused at its line, the list underlined:
    /// `measure = [3]` ran as repeats = 3 (serde reads a list as the fields in order), and
    /// `[[cluster]]` was answered about a key the file never wrote.
    #[test]
    fn a_section_written_as_a_list_is_refused() {
        let e = parse("measure = [3]\n[model]\nplugin = \"x\"\n", "t.toml").unwrap_err();
        assert_eq!(under(&e), "[3]", "{e}");
        assert!(e.starts_with("t.toml: line 1, column 11\n") && e.ends_with("[measure] is one table, not a list: write [measure] with its keys under it (not [[measure]] or measure = [...])"), "{e}");
        let e = parse("[model]\nplugin = \"x\"\n[[cluster]]\ngpus = [8]\n", "t.toml").unwrap_err();
        assert!(e.starts_with("t.toml: line 3, column 1\n") && e.contains("[cluster] is one table, not a list"), "{e}");
        assert_eq!(under(&e), "[[cluster]]", "{e}");
        assert!(parse("[model]\nplugin = \"x\"\n[limits]\nmemory_mib = 64\n", "t.toml").is_ok());
    }

    /// The sections refuse a list themselves, as they are deserialized (the file was
    /// parsed a second time, as a document, to catch one first): any reader of a run
    /// file, the command line's included, gets the refusal, once.
    #[test]
    fn a_run_files_sections_refuse_a_list_as_they_are_read() {
        for (text, section) in [
            ("measure = [3]\n[model]\nplugin = \"x\"\n", "measure"),
            ("layout = [4, 4]\n[model]\nplugin = \"x\"\n", "layout"),
            ("model = [\"x\"]\n", "model"),
            ("[model]\nplugin = \"x\"\n[[assumptions]]\nrestart_h = 1.0\n", "assumptions"),
        ] {
            let message = format!("[{section}] is one table, not a list");
            let e = toml::from_str::<RunFile>(text).map(|_| ()).unwrap_err();
            assert!(e.message().starts_with(&message), "{text}: {e}");
            let e = parse_flags(text).unwrap_err();
            assert!(e.contains(&message), "{text}: {e}");
        }
    }

    /// The quoted line and the columns its carets cover, as a terminal shows an error
    /// (escaped where it is printed, as `main` does).
    fn underlined(e: &str) -> (String, std::ops::Range<usize>) {
        let shown = crate::report::visible(e);
        let lines: Vec<&str> = shown.lines().collect();
        let at = lines.iter().position(|l| l.split_once(" | ").is_some_and(|(n, _)| n.parse::<usize>().is_ok())).unwrap_or_else(|| panic!("no quoted line: {e}"));
        let (number, quoted) = lines[at].split_once(" | ").unwrap();
        let carets = lines.get(at + 1).and_then(|l| l.get(number.len() + 3..)).unwrap_or_else(|| panic!("no carets: {e}"));
        let (from, to) = (carets.find('^').expect(e), carets.rfind('^').expect(e) + 1);
        assert!(carets[..from].chars().all(|c| c == ' ') && carets[from..to].chars().all(|c| c == '^'), "{e}");
        (quoted.to_string(), from..to)
    }

    /// What the carets sit under in the quoted line, in terminal columns (a wide
    /// character takes two).
    fn under(e: &str) -> String {
        let (quoted, span) = underlined(e);
        let mut at = 0;
        let mut out = String::new();
        for c in quoted.chars() {
            if span.contains(&at) {
                out.push(c);
            }
            at += crate::report::char_columns(c);
        }
        out
    }

    /// A wide character (CJK, emoji) before the span takes two terminal columns: counted
    /// as one, the carets landed a column early for each.
    #[test]
    fn the_carets_count_wide_characters_as_two_columns() {
        let e = parse("cost = { region = \"東京\", option = \"spotty\" }\n[model]\nplugin = \"x\"\n", "t.toml").unwrap_err();
        assert_eq!(under(&e), "\"spotty\"", "{e}");
        assert!(e.starts_with("t.toml: line 1, column 34\n"), "the column counts the file's characters: {e}");
        let e = parse("[model]\nplugin = \"🦙🦙\" zzz\n", "t.toml").unwrap_err();
        assert_eq!(under(&e), "z", "{e}");
    }

    /// The carets sit under the refused span of the line as it is shown, where a control
    /// or bidi character before it shows as an escape wider than the character: they were
    /// counted in the file's characters and landed early, by 7 columns after a U+202E and
    /// by one after each tab, in a rule's error and in TOML's own.
    #[test]
    fn the_carets_sit_under_the_span_in_the_escaped_line() {
        let e = parse("cost = { region = \"\u{202e}x\", option = \"spotty\" }\n[model]\nplugin = \"x\"\n", "t.toml").unwrap_err();
        assert_eq!(under(&e), "\"spotty\"", "{e}");
        assert!(e.starts_with("t.toml: line 1, column 34\n"), "the column counts the file's characters: {e}");
        let e = parse("[model]\nplugin = \"x\"\n[measure]\nrepeats =\t\t0\n", "t.toml").unwrap_err();
        assert_eq!(under(&e), "0", "{e}");
        let e = parse("[model]\nplugin = \"x\"\t\tzzz\n", "t.toml").unwrap_err();
        assert_eq!(under(&e), "z", "{e}");
        let e = parse("[model]\nplugin = \"\u{202e}\u{202e}x\" zzz\n", "t.toml").unwrap_err();
        assert_eq!(under(&e), "z", "{e}");
        // A character TOML refuses is underlined whole, as its escape shows.
        let e = parse("[model]\nplugin = \"x\"\t# \u{1b}[31m\n", "t.toml").unwrap_err();
        assert_eq!(under(&e), "\\u{1b}", "{e}");
        // A span that starts with an escape is underlined whole.
        let e = parse("[model]\nplugin = \"x\"\n[cost]\noption = \"\u{202e}spot\"\n", "t.toml").unwrap_err();
        assert_eq!(under(&e), "\"\\u{202e}spot\"", "{e}");
    }

    /// A refused line is quoted as a window of about [`QUOTE_WIDTH`] columns around the
    /// span, with "..." where it is cut and the carets still under the span: a 600 KB
    /// line was quoted whole.
    #[test]
    fn a_long_refused_line_is_cut_around_the_span() {
        let long = "a".repeat(600_000);
        let quoted = |e: &str| underlined(e).0;
        // The span at the end of the line, in the middle, at the start; a rule's error
        // and TOML's own.
        let e = parse(&format!("cost = {{ region = \"{long}\", option = \"spotty\" }}\n[model]\nplugin = \"x\"\n"), "t.toml").unwrap_err();
        assert!(e.len() < 1000 && quoted(&e).starts_with("...aaa") && quoted(&e).ends_with("option = \"spotty\" }"), "{e}");
        assert_eq!(under(&e), "\"spotty\"", "{e}");
        let e = parse(&format!("[model]\nplugin = \"x\"\n[cost]\nregion = \"{long}\" zzz \"{long}\"\n"), "t.toml").unwrap_err();
        let line = quoted(&e);
        assert!(e.len() < 1000 && line.starts_with("...aaa") && line.ends_with("aaa...") && line.contains("\" zzz \""), "{e}");
        assert!(line.chars().count() <= QUOTE_WIDTH + 6, "{line}");
        assert_eq!(under(&e), "z", "{e}");
        let e = parse(&format!("[model]\nplugin = \"x\"\n[cost]\noption = \"spotty\" # {long}\n"), "t.toml").unwrap_err();
        assert!(e.len() < 1000 && quoted(&e).starts_with("option = \"spotty\" # aaa") && quoted(&e).ends_with("aaa..."), "{e}");
        assert_eq!(under(&e), "\"spotty\"", "{e}");
        // Escapes in a long line are never cut in half, and still counted.
        let escaped = "\u{202e}".repeat(100_000);
        let e = parse(&format!("[model]\nplugin = \"x\"\n[cost]\nregion = \"{escaped}\" zzz\n"), "t.toml").unwrap_err();
        let line = quoted(&e);
        assert!(e.len() < 1000 && line.starts_with("...\\u{202e}") && line.ends_with("\" zzz"), "{e}");
        assert_eq!(under(&e), "z", "{e}");
        // What a message quotes of a long value or key is cut too.
        for body in [format!("[layout]\ntp = \"{long}\""), format!("{long} = 1"), format!("[precision]\nformat = \"{long}\""), format!("tokens = \"{long}\"")] {
            let e = parse(&format!("[model]\nplugin = \"x\"\n{body}\n"), "t.toml").unwrap_err();
            assert!(e.len() < 1000 && e.contains("aaa..."), "{}", &e[..e.len().min(2000)]);
        }
        // A value wider than the window is underlined from its start to the cut.
        let e = parse(&format!("[model]\nplugin = \"x\"\n[cost]\noption = \"{long}\"\n"), "t.toml").unwrap_err();
        let (line, span) = underlined(&e);
        assert!(e.len() < 1000 && line.starts_with("option = \"aaa") && line.ends_with("aaa...") && under(&e).starts_with("\"aaa"), "{e}");
        assert!(span.end >= QUOTE_WIDTH - 10, "{e}");
    }

    /// Every error a value of the wrong type gets names what to write in the file's
    /// words: a section as the table it must be, a key by what it takes. Serde named Rust
    /// types ("expected struct ModelSection", "expected usize", "expected struct
    /// PipelineSplit") and toml a private key (`$__toml_private_datetime`).
    #[test]
    fn a_value_of_the_wrong_type_is_named_in_the_files_words() {
        for (text, words) in [
            ("model = 3\n", "[model] must be a table, not the number 3: write [model] with its keys under it, or model = { key = value, ... }"),
            ("layout = \"x\"\n[model]\nplugin = \"x\"\n", "[layout] must be a table, not the string 'x'"),
            ("cluster = true\n[model]\nplugin = \"x\"\n", "[cluster] must be a table, not true"),
            ("measure = 1.5\n[model]\nplugin = \"x\"\n", "[measure] must be a table, not the number 1.5"),
            ("explore = 1979-05-27\n[model]\nplugin = \"x\"\n", "[explore] must be a table, not a date-time"),
            ("limits = 170141183460469231731687303715884105727\n[model]\nplugin = \"x\"\n", "limits"),
            ("[model]\nplugin = \"x\"\n[layout]\ntp = \"4\"\n", "expected a whole number from 1 to 1048576"),
            ("[model]\nplugin = \"x\"\n[layout]\ntp = -4\n", "invalid value: integer `-4`, expected a whole number from 1 to 1048576"),
            ("[model]\nplugin = \"x\"\n[layout]\nmbs = 4294967296\n", "expected a whole number from 1 to 1048576"),
            ("[model]\nplugin = \"x\"\n[cluster]\ngpus = [8, -8]\n", "invalid value: integer `-8`, expected a whole number from 1 to 1048576"),
            ("[model]\nplugin = \"x\"\n[cluster]\ngpus = [8.5]\n", "invalid type: floating point `8.5`, expected a whole number from 1 to 1048576"),
            // Each bounded key's own range, not its type's ("0 to 4294967295" for seq_len).
            ("[model]\nplugin = \"x\"\nseq_len = 4096.5\n", "expected a whole number from 1 to 16777216"),
            ("[model]\nplugin = \"x\"\nseq_len = -1\n", "invalid value: integer `-1`, expected a whole number from 1 to 16777216"),
            ("[model]\nplugin = \"x\"\nseq_len = 4294967296\n", "expected a whole number from 1 to 16777216"),
            ("[model]\nplugin = \"x\"\n[measure]\nrepeats = -5\n", "invalid value: integer `-5`, expected a whole number from 1 to 1000"),
            ("[model]\nplugin = \"x\"\n[limits]\nmemory_mib = 1.5\n", "expected a whole number from 1 to 4096"),
            ("[model]\nplugin = \"x\"\n[limits]\ncall_timeout_ms = -1\n", "expected a whole number from 1 to 86400000"),
            ("[model]\nplugin = \"x\"\n[cluster]\ngbs = -1\n", "expected a whole number from 1 to 4294967295"),
            ("[model]\nplugin = \"x\"\n[layout]\noffload_layers = -1\n", "expected a whole number from 0 to 10000"),
            ("[model]\nplugin = \"x\"\n[layout]\npipeline_split = { embedding = -1 }\n", "invalid value: integer `-1`, expected a whole number from 0 to 10000"),
            ("[model]\nplugin = \"x\"\n[layout]\npipeline_split = { loss = 1.5 }\n", "invalid type: floating point `1.5`, expected a whole number from 0 to 10000"),
            ("[model]\nplugin = \"x\"\n[assumptions]\nrestart_h = \"1h\"\n", "expected a number"),
            ("[model]\nplugin = \"x\"\n[explore]\ntarget_days = \"30\"\n", "expected a number"),
            ("[model]\nplugin = \"x\"\n[layout]\npipeline_split = 1\n", "expected a table, e.g. { embedding = 1, loss = 1 }"),
            ("[model]\nplugin = \"x\"\n[layout]\npipeline_split = 1979-05-27\n", "invalid type: date-time, expected a table"),
            ("[model]\nplugin = \"x\"\n[layout]\nrecompute = 1\n", "expected one of its names, in quotes"),
            ("[model]\nplugin = \"x\"\n[measure]\nrecompute = true\n", "expected one of its names, in quotes"),
            ("[model]\nplugin = \"x\"\n[cluster]\ngpus = 8\n", "expected a list, e.g. [1, 2]"),
            ("[model]\nplugin = \"x\"\n[cost]\nplugins = \"aws\"\n", "expected a list"),
            ("[model]\nplugin = \"x\"\n[layout]\nfsdp = 1\n", "expected a boolean"),
            ("[model]\nplugin = 3\n", "expected a string"),
            ("[model]\nplugin = { a = 1 }\n", "invalid type: table, expected a string"),
            ("[model]\nplugin = 1979-05-27T07:32:00Z\n", "invalid type: date-time, expected a string"),
            ("[model]\nplugin = [\"x\"]\n", "invalid type: list, expected a string"),
            ("[model]\nplugin = \"x\"\n[measure]\nrecompute = {}\n", "expected one of its names, in quotes"),
            ("[model]\nplugin = \"x\"\n[layout]\ndispatcher = 1\n", "expected a string"),
        ] {
            let e = parse(text, "t.toml").unwrap_err();
            assert!(e.contains(words), "{text}: {words:?} not in: {e}");
            for rust in ["struct", "enum", "Section", "PipelineSplit", "Recompute", "u32", "u64", "usize", "f64", "i64", "private", "sequence", "map", "wanted"] {
                assert!(!e.contains(rust), "{text}: {rust:?} in: {e}");
            }
            assert!(e.contains("line "), "{text}: no line: {e}");
        }
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

            /// Any span of any text is quoted without a panic, in the window, with at
            /// least one caret and none past the shown line's end but one.
            #[test]
            fn any_span_is_quoted_in_the_window(text in "[a \u{1b}\t\u{202e}\u{e9}\r\n]{0,600}", a in 0usize..700, b in 0usize..700) {
                let quoted = super::super::quote(&text, a.min(b)..a.max(b));
                let lines: Vec<&str> = quoted.lines().collect();
                prop_assert_eq!(lines.len(), 4, "{}", quoted);
                let (gutter, line) = lines[2].split_once(" | ").unwrap();
                let carets = &lines[3][gutter.len() + 3..];
                let width = line.chars().count();
                prop_assert!(width <= super::super::QUOTE_WIDTH + 6, "{}", quoted);
                let (from, to) = (carets.find('^'), carets.rfind('^'));
                prop_assert!(from.is_some() && to.unwrap() <= width, "{}", quoted);
                prop_assert!(line.chars().all(|c| !runner_contract::text::is_unsafe(c)), "{}", quoted);
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
