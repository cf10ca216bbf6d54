//! Per-op times measured on a device (`runner measure`): the file that carries them,
//! the rules under which a measurement may stand for a projection, and the fit of a GPU
//! profile's GEMM and memory efficiencies to it.
//!
//! A measurement is made on rank 0's graph of one model at one sharding ([`ShardKey`]),
//! sequence length and precision plan, the same graph the projection's template reads,
//! so every op has the name the projection looks it up by. It holds only for that
//! graph: [`OpsFile::check_target`], [`OpsFile::check_key`] and [`OpsFile::check_graph`]
//! refuse another model, sequence, GPU, precision or sharding, naming the field and the
//! fix, and the [`Measured`] it turns into applies at its own key and GEMM formats only.
//!
//! What an entry's times are (per micro-batch, seconds):
//! - `gemm`: the forward, input-gradient and weight-gradient GEMMs run on the device at
//!   the plan's formats for that op (`kernel_s`), plus the casts of the input and the
//!   output gradient a low-precision GEMM needs, as the roofline counts them. A grouped
//!   (expert) GEMM is `calls` calls of an even share of the routed rows.
//! - `memory`: a memory-bound op (norm, activation, rotary, residual add, embedding,
//!   loss, routing) timed inside a real training step by the executor, which computes
//!   and stores in f32; its times are scaled by the bytes the op moves at the graph's
//!   formats over the bytes it moved in f32 (`bytes / run_bytes`): these kernels are
//!   bandwidth-bound, so their time follows the bytes.
//! - `attention`: a FlashAttention core's times, accepted from a file; `runner measure`
//!   writes none (the executor's attention kernel is f32 on CUDA cores, not the tensor-
//!   core FlashAttention a BF16 run uses).
//!
//! [`fit_ops`] fits, per GEMM format measured, the large-GEMM efficiency, and the GEMM
//! size at half efficiency, to the GEMM kernels' times under the roofline's own law
//! (time = (FLOPs + h·calls) / (peak·e)), and the HBM efficiency to the memory-bound
//! ops' f32 runs (time = bytes / (HBM·e)).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use runner_graph::{Graph, OpKind};

use runner_contract::text::number as shown;

/// `v` at four significant digits, for [`shown`]: a computed share or peak without the
/// float's last digits (104.97..., 0.19999...).
fn four_digits(v: f64) -> f64 {
    format!("{v:.3e}").parse().unwrap_or(v)
}

use crate::profile::{Efficiency, GemmFormat, GpuProfile};
use crate::precision::Plan;
use crate::published::Stats;
use crate::template::{Measured, ShardKey};

/// The `format` tag of a measurement file.
pub const FORMAT: &str = "runner-measured-ops";
/// The version this runner writes and reads.
pub const VERSION: u32 = 1;

/// What kind of work an op is, as the projection times it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpClass {
    Gemm,
    Attention,
    Memory,
}

impl OpClass {
    /// How the projection times `kind` (`None`: a collective, timed by the fabric model).
    pub fn of(kind: OpKind) -> Option<OpClass> {
        match kind {
            OpKind::Linear | OpKind::GroupedLinear => Some(OpClass::Gemm),
            OpKind::Attention => Some(OpClass::Attention),
            OpKind::AllReduce | OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll | OpKind::Send | OpKind::Recv => None,
            _ => Some(OpClass::Memory),
        }
    }

    fn name(self) -> &'static str {
        match self {
            OpClass::Gemm => "gemm",
            OpClass::Attention => "attention",
            OpClass::Memory => "memory",
        }
    }
}

/// A GEMM op's measurement in detail.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmDetail {
    /// Formats of the forward, input-gradient and weight-gradient GEMMs.
    pub formats: [GemmFormat; 3],
    /// Forward FLOPs of the whole op (each backward GEMM has as many).
    pub flops: f64,
    /// Kernel calls per GEMM: 1, or the rank's local experts of a grouped GEMM.
    pub calls: u64,
    /// Forward bytes read and written at the graph's formats.
    pub bytes: f64,
    /// Seconds of the forward, input-gradient and weight-gradient GEMMs alone.
    pub kernel_s: [f64; 3],
}

/// A memory-bound op's measurement in detail.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryDetail {
    /// Forward bytes at the graph's formats.
    pub bytes: f64,
    /// Forward bytes the run moved (f32), and its forward and backward seconds.
    pub run_bytes: f64,
    pub run_fwd_s: f64,
    pub run_bwd_s: f64,
}

/// One op's times per micro-batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpTime {
    /// The op's name in rank 0's graph.
    pub name: String,
    pub kind: OpClass,
    /// Transformer layer, or -1 outside the stack.
    pub layer: i32,
    /// The shape timed: a GEMM's `[M, N, K]` of one call (x is M×K, the weight N×K);
    /// another op's output tensor. Informative: the name ties the entry to the graph.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shape: Vec<u64>,
    /// What the projection uses: forward and backward seconds.
    pub fwd_s: f64,
    pub bwd_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm: Option<GemmDetail>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryDetail>,
}

/// A measurement file (`runner measure -o ops.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpsFile {
    /// Always [`FORMAT`].
    pub format: String,
    pub version: u32,
    /// The device it ran on, as the runner names it ("cuda:0 (NVIDIA H100 80GB HBM3,
    /// sm_90)", "cpu (16 threads)").
    pub device: String,
    /// When it ran: UTC, RFC 3339 (`2026-12-01T10:24:11Z`).
    pub measured_at: String,
    /// The GPU profile it stands for.
    pub gpu: String,
    /// The model variant, its sequence length and the precision recipe whose plan gave
    /// the GEMMs their formats.
    pub model: String,
    pub seq_len: u32,
    pub precision: String,
    /// The sharding of the rank whose graph ran.
    pub shard: ShardKey,
    /// Timed repeats per op (medians are kept).
    pub repeats: usize,
    /// What the run left to the model, in words.
    #[serde(default)]
    pub notes: Vec<String>,
    pub ops: Vec<OpTime>,
}

/// The longest time an entry may hold: an op of one micro-batch that runs for longer
/// than a day is a broken measurement, and would carry the projection to absurd figures.
pub const MAX_SECONDS: f64 = 86_400.0;

/// The shortest time a measured kernel may take: no op runs in under a nanosecond, and a
/// forward of 1e-300 s would carry a projection to a step of nothing.
pub const MIN_SECONDS: f64 = 1e-9;

/// A time in seconds: finite, at most [`MAX_SECONDS`], and at least [`MIN_SECONDS`] where
/// `positive` (else >= 0: a backward that launches nothing).
fn seconds_ok(v: f64, positive: bool) -> bool {
    v.is_finite() && v <= MAX_SECONDS && if positive { v >= MIN_SECONDS } else { v >= 0.0 }
}

/// `a` at least `b`, up to rounding (a sum written to JSON and read back).
fn at_least(a: f64, b: f64) -> bool {
    a >= b * (1.0 - 1e-9)
}

/// How far above the profile's peak a measured rate may sit before it is a unit slip:
/// a GEMM cannot beat the tensor cores' dense peak (1.5x leaves room for a profile's
/// conservative clock), and a memory-bound op on a CPU can run from its caches at some
/// tens of times the DRAM bandwidth a CPU profile states, never a thousand.
const GEMM_OVER_PEAK: f64 = 1.5;
const MEMORY_OVER_PEAK: f64 = 1000.0;

fn finite_nonneg(v: f64) -> bool {
    v.is_finite() && v >= 0.0
}

fn finite_pos(v: f64) -> bool {
    v.is_finite() && v > 0.0
}

/// What a JSON error at `line`:`column` of `text` means where a hand or another tool
/// wrote NaN or Infinity there (JSON has neither; serde says only "expected value").
pub(crate) fn not_a_number_hint(text: &str, line: usize, column: usize) -> &'static str {
    let at = text.lines().nth(line.saturating_sub(1)).unwrap_or_default();
    let from = at.char_indices().nth(column.saturating_sub(1)).map_or(at.len(), |(i, _)| i);
    let rest = at[from..].trim_start().trim_start_matches('-').to_ascii_lowercase();
    if ["nan", "inf"].iter().any(|w| rest.starts_with(w)) {
        " (NaN and Infinity are not JSON numbers: the value is a broken measurement; measure again)"
    } else {
        ""
    }
}

/// `tp=1 cp=1 ep=1 etp=1 sp=off mbs=1`.
pub fn key_text(k: &ShardKey) -> String {
    format!("tp={} cp={} ep={} etp={} sp={} mbs={}", k.tp, k.cp, k.ep, k.etp, if k.sp { "on" } else { "off" }, k.mbs)
}

/// A JSON error's message without the " at line L column C" serde_json ends it with,
/// for a message that names the location first (it was said twice).
pub(crate) fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let at = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&at).map_or_else(|| text.clone(), str::to_string)
}

impl OpsFile {
    /// Read a measurement file; `origin` names it in messages.
    ///
    /// # Errors
    /// JSON syntax (with line and column), a missing or unknown field, another format or
    /// version, or a value out of range; each names the op and the field.
    pub fn parse(text: &str, origin: &str) -> Result<OpsFile, String> {
        let f: OpsFile = serde_json::from_str(text).map_err(|e| {
            if let Some(m) = crate::file_kind::misplaced(text, origin, crate::file_kind::Reader::Measurement) {
                return m;
            }
            let hint = if text.trim_start().starts_with('[') {
                " (an array: is it a `bench collectives` file? use it with --collectives)"
            } else {
                not_a_number_hint(text, e.line(), e.column())
            };
            format!("{origin}: line {} column {}: {}{hint}; write the file with `runner measure ... -o FILE.json`", e.line(), e.column(), json_message(&e))
        })?;
        if f.format != FORMAT {
            return Err(format!("{origin}: format is '{}', not '{FORMAT}': write the file with `runner measure ... -o FILE.json`", f.format));
        }
        if f.version != VERSION {
            return Err(format!("{origin}: version {} (this runner reads version {VERSION}): measure again with this runner", f.version));
        }
        f.check(origin)?;
        Ok(f)
    }

    fn check(&self, origin: &str) -> Result<(), String> {
        let k = &self.shard;
        for (what, v) in [("tp", k.tp), ("cp", k.cp), ("ep", k.ep), ("etp", k.etp), ("mbs", k.mbs)] {
            if v == 0 {
                return Err(format!("{origin}: shard.{what} must be at least 1"));
            }
        }
        if self.seq_len == 0 {
            return Err(format!("{origin}: seq_len must be at least 1"));
        }
        if self.device.trim().is_empty() || self.measured_at.trim().is_empty() {
            return Err(format!("{origin}: device and measured_at must name the device and the UTC time the run was on"));
        }
        if self.ops.is_empty() {
            return Err(format!("{origin}: ops is empty: nothing was measured"));
        }
        if self.repeats == 0 {
            return Err(format!("{origin}: repeats must be at least 1 (the timed runs each median is of)"));
        }
        let mut seen = HashSet::new();
        for (i, op) in self.ops.iter().enumerate() {
            let at = format!("{origin}: ops[{i}] ('{}')", op.name);
            if op.name.is_empty() {
                return Err(format!("{origin}: ops[{i}]: name is empty"));
            }
            if !seen.insert(op.name.as_str()) {
                return Err(format!("{at}: the op is listed twice; keep one entry per op"));
            }
            if op.layer < -1 {
                return Err(format!("{at}: layer must be a layer index, or -1 for an op outside the stack, got {}", op.layer));
            }
            if !seconds_ok(op.fwd_s, true) {
                return Err(format!("{at}: fwd_s must be a number of seconds in {MIN_SECONDS:e}..={MAX_SECONDS}, got {}", shown(op.fwd_s)));
            }
            if !seconds_ok(op.bwd_s, false) {
                return Err(format!("{at}: bwd_s must be a number of seconds in 0..={MAX_SECONDS}, got {}", shown(op.bwd_s)));
            }
            match (op.kind, &op.gemm, &op.memory) {
                (OpClass::Gemm, Some(g), None) => {
                    if !finite_pos(g.flops) || !finite_nonneg(g.bytes) {
                        return Err(format!("{at}: gemm.flops must be > 0 and gemm.bytes >= 0 (finite)"));
                    }
                    if g.calls == 0 {
                        return Err(format!("{at}: gemm.calls must be at least 1"));
                    }
                    if let Some(v) = g.kernel_s.iter().find(|v| !seconds_ok(**v, true)) {
                        return Err(format!(
                            "{at}: gemm.kernel_s must hold three times in seconds, {MIN_SECONDS:e}..={MAX_SECONDS}, got {}",
                            shown(*v)
                        ));
                    }
                    // fwd_s and bwd_s are the kernels' times plus the casts (`runner measure`).
                    if !at_least(op.fwd_s, g.kernel_s[0]) || !at_least(op.bwd_s, g.kernel_s[1] + g.kernel_s[2]) {
                        return Err(format!(
                            "{at}: fwd_s and bwd_s must be at least their GEMMs' kernel_s ({} and {} + {}); the file's times \
                             disagree with each other: measure again",
                            shown(g.kernel_s[0]),
                            shown(g.kernel_s[1]),
                            shown(g.kernel_s[2])
                        ));
                    }
                }
                (OpClass::Memory, None, Some(m)) => {
                    if !finite_nonneg(m.bytes) || !finite_pos(m.run_bytes) || !seconds_ok(m.run_fwd_s, true) || !seconds_ok(m.run_bwd_s, false) {
                        return Err(format!(
                            "{at}: memory.bytes must be finite and >= 0, memory.run_bytes > 0, run_fwd_s seconds in \
                             {MIN_SECONDS:e}..={MAX_SECONDS} and run_bwd_s in 0..={MAX_SECONDS}"
                        ));
                    }
                    // fwd_s and bwd_s are the run's times scaled by the bytes (`runner measure`).
                    let scale = m.bytes / m.run_bytes;
                    // An infinite scale (bytes over run_bytes past the largest float) matches nothing:
                    // inf - inf is no nearer than 1e-6 of inf.
                    let near = |a: f64, b: f64| b.is_finite() && (a - b).abs() <= 1e-6 * a.abs().max(b.abs());
                    if !near(op.fwd_s, m.run_fwd_s * scale) || !near(op.bwd_s, m.run_bwd_s * scale) {
                        return Err(format!(
                            "{at}: fwd_s and bwd_s must be run_fwd_s and run_bwd_s scaled by bytes / run_bytes ({} and {}); \
                             the file's times disagree with each other: measure again",
                            shown(m.run_fwd_s * scale),
                            shown(m.run_bwd_s * scale)
                        ));
                    }
                }
                (OpClass::Attention, None, None) => {}
                (kind, _, _) => {
                    return Err(format!(
                        "{at}: a {} op takes {}",
                        kind.name(),
                        match kind {
                            OpClass::Gemm => "a `gemm` object and no `memory`",
                            OpClass::Memory => "a `memory` object and no `gemm`",
                            OpClass::Attention => "neither a `gemm` nor a `memory` object",
                        }
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether this measurement is of `model` at `seq_len` on `gpu` under `precision`.
    ///
    /// # Errors
    /// The first field that differs, and what to change.
    pub fn check_target(&self, origin: &str, model: &str, seq_len: u32, gpu: &GpuProfile, precision: &str) -> Result<(), String> {
        if self.model != model {
            return Err(format!("{origin} was measured on {}, not {model}: pass --model {} or measure {model}", self.model, self.model));
        }
        if self.seq_len != seq_len {
            return Err(format!(
                "{origin} was measured at sequence length {}, not {seq_len}: pass --seq-len {} or measure at {seq_len}",
                self.seq_len, self.seq_len
            ));
        }
        self.check_gpu(origin, gpu)?;
        if !self.precision.eq_ignore_ascii_case(precision) {
            return Err(format!(
                "{origin} was measured under {} GEMM formats, not {precision}: pass --precision {} or measure with --precision {precision}",
                self.precision, self.precision
            ));
        }
        Ok(())
    }

    /// Whether this measurement stands for `gpu` (its name or an alias).
    ///
    /// # Errors
    /// It stands for another GPU.
    pub fn check_gpu(&self, origin: &str, gpu: &GpuProfile) -> Result<(), String> {
        let named = |n: &str| gpu.name.eq_ignore_ascii_case(n) || gpu.aliases.iter().any(|a| a.eq_ignore_ascii_case(n));
        if named(&self.gpu) {
            self.check_rates(origin, gpu)
        } else {
            Err(format!("{origin} stands for {}, not {}: pass --gpu {} or measure on {}", self.gpu, gpu.name, self.gpu, gpu.name))
        }
    }

    /// Whether the rates the times imply are ones `gpu` can reach: a GEMM no faster than
    /// its format's peak, a memory-bound op not a thousand times past its bandwidth (a
    /// unit slip or a hand-edited file would otherwise project a step of nothing).
    fn check_rates(&self, origin: &str, gpu: &GpuProfile) -> Result<(), String> {
        for (i, op) in self.ops.iter().enumerate() {
            let at = format!("{origin}: ops[{i}] ('{}')", op.name);
            if let Some(g) = &op.gemm {
                for (role, (&format, &secs)) in ["forward", "input-gradient", "weight-gradient"].iter().zip(g.formats.iter().zip(&g.kernel_s)) {
                    let Ok(peak) = gpu.peak_flops(format) else { continue };
                    let rate = g.flops / secs;
                    if rate > GEMM_OVER_PEAK * peak {
                        return Err(format!(
                            "{at}: the {role} GEMM's {} FLOP in {} s is {:.0} TFLOP/s, past {}'s {} peak of {:.0}: check the file's units, or measure again",
                            shown(g.flops),
                            shown(secs),
                            rate / 1e12,
                            gpu.name,
                            format.name(),
                            peak / 1e12
                        ));
                    }
                }
            }
            if let Some(m) = &op.memory {
                let rate = m.run_bytes / m.run_fwd_s;
                if rate > MEMORY_OVER_PEAK * gpu.hbm_gbs * 1e9 {
                    return Err(format!(
                        "{at}: {} bytes in {} s is {:.0} GB/s, a thousand times past {}'s {:.0} GB/s: check the file's units, or measure again",
                        shown(m.run_bytes),
                        shown(m.run_fwd_s),
                        rate / 1e9,
                        gpu.name,
                        gpu.hbm_gbs
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether this measurement holds for a layout of sharding `key`.
    ///
    /// # Errors
    /// The degrees that differ, and the flags that fix them.
    pub fn check_key(&self, origin: &str, key: ShardKey) -> Result<(), String> {
        if self.shard == key {
            return Ok(());
        }
        let m = &self.shard;
        Err(format!(
            "{origin} was measured at {}, the layout is {}: a rank's op shapes change with the sharding, so the times do \
             not carry over; pass --tp {} --cp {} --ep {} --etp {} --mbs {} (sequence parallel follows tp > 1), or measure \
             at this layout with `runner measure --tp {} --cp {} --ep {} --etp {} --mbs {}`",
            key_text(m),
            key_text(&key),
            m.tp,
            m.cp,
            m.ep,
            m.etp,
            m.mbs,
            key.tp,
            key.cp,
            key.ep,
            key.etp,
            key.mbs
        ))
    }

    /// Whether every measured op is an op of `rank` (rank 0's graph at the file's
    /// sharding) of the kind the file says, and every GEMM ran at the formats `plan`
    /// gives it (the projection uses a GEMM's times only at those: a GEMM of other
    /// formats, an edited file or another plan's, would be listed as measured and not be).
    ///
    /// # Errors
    /// The first op the graph lacks or times differently, or a GEMM of other formats.
    pub fn check_graph(&self, origin: &str, rank: &Graph, plan: &Plan) -> Result<(), String> {
        let formats = |f: &[GemmFormat; 3]| f.iter().map(|f| f.name()).collect::<Vec<_>>().join("/");
        for (i, op) in self.ops.iter().enumerate() {
            if let Some(g) = &op.gemm
                && g.formats != plan.formats(&op.name)
            {
                return Err(format!(
                    "{origin}: ops[{i}] '{}' ran at {} but the {} plan runs it at {}: the file was edited or comes from \
                     another precision plan; measure again with this plan",
                    op.name,
                    formats(&g.formats),
                    self.precision,
                    formats(&plan.formats(&op.name))
                ));
            }
        }
        let by_name: HashMap<&str, OpKind> = rank.ops.iter().map(|o| (o.name.as_str(), o.kind)).collect();
        for (i, op) in self.ops.iter().enumerate() {
            match by_name.get(op.name.as_str()).copied().map(OpClass::of) {
                None => {
                    return Err(format!(
                        "{origin}: ops[{i}] '{}' is not an op of {}'s rank graph at {}: the file comes from another model \
                         or runner version; measure again with this runner",
                        op.name,
                        self.model,
                        key_text(&self.shard)
                    ));
                }
                Some(c) if c != Some(op.kind) => {
                    return Err(format!(
                        "{origin}: ops[{i}] '{}' is listed as {} but the graph's op is {}",
                        op.name,
                        op.kind.name(),
                        c.map_or("a collective", OpClass::name)
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The ops of `rank` this file does not list though `runner measure` times ops of
    /// their kind: every GEMM, and the memory-bound ops where the file has any (a sharded
    /// rank's are not measured). They keep the roofline, and a step that mixes them with
    /// measured ones is off by what they miss, so the projection names them.
    pub fn unmeasured<'g>(&self, rank: &'g Graph) -> Vec<&'g str> {
        let listed: HashSet<&str> = self.ops.iter().map(|o| o.name.as_str()).collect();
        let memory = self.ops.iter().any(|o| o.kind == OpClass::Memory);
        rank.ops
            .iter()
            .filter(|o| match OpClass::of(o.kind) {
                Some(OpClass::Gemm) => true,
                Some(OpClass::Memory) => memory,
                _ => false,
            })
            .map(|o| o.name.as_str())
            .filter(|n| !listed.contains(n))
            .collect()
    }

    /// The table the projection looks measured ops up in: at this file's sharding, each
    /// GEMM at its formats.
    pub fn measured(&self) -> Measured {
        Measured {
            ops: self.ops.iter().map(|o| (o.name.clone(), (o.fwd_s, o.bwd_s))).collect(),
            key: Some(self.shard),
            formats: self.ops.iter().filter_map(|o| o.gemm.as_ref().map(|g| (o.name.clone(), g.formats))).collect(),
        }
    }

    /// Ops per class.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        let mut c = BTreeMap::new();
        for o in &self.ops {
            *c.entry(o.kind.name()).or_insert(0) += 1;
        }
        c
    }
}

/// Whether a run on `device` may stand for `gpu`. A built-in profile needs a GPU whose
/// name carries the profile's (or an alias's) model, e.g. "NVIDIA H100 80GB HBM3" for
/// h100: never the CPU. A profile the user's `--profile` file adds is the user's own
/// statement about their machine and takes any device.
///
/// # Errors
/// The device is not that GPU; the message says which flag fixes it.
pub fn stands_for(device: &str, gpu: &GpuProfile, builtin: bool) -> Result<(), String> {
    if !builtin {
        return Ok(());
    }
    let lower = device.to_ascii_lowercase();
    if lower.starts_with("cpu") {
        return Err(format!(
            "a run on the CPU ({device}) cannot stand for the built-in {} profile; add a profile for this machine with \
             --profile FILE (a [[gpu]] table with its own name, peaks and links) and name it with --gpu",
            gpu.name
        ));
    }
    let tokens: HashSet<&str> = lower.split(|c: char| !c.is_ascii_alphanumeric()).filter(|t| !t.is_empty()).collect();
    // "a100-80gb" is an A100: the model is the name's first part, past the vendor, family
    // and system words ("nvidia-tesla-a100", "hgx-b200", "amd-instinct-mi300x"), which
    // other models' devices share: "AMD Instinct MI355X" is no MI300X.
    let model_of = |n: &str| {
        let lower = n.to_ascii_lowercase();
        let mut parts = lower.split(|c: char| !c.is_ascii_alphanumeric()).filter(|t| !t.is_empty());
        parts.find(|t| !matches!(*t, "nvidia" | "tesla" | "hgx" | "dgx" | "amd" | "instinct")).unwrap_or_default().to_string()
    };
    let mut names: Vec<String> = Vec::new();
    for n in std::iter::once(&gpu.name).chain(&gpu.aliases).map(|n| model_of(n)) {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    if names.iter().any(|n| tokens.contains(n.as_str())) {
        Ok(())
    } else {
        // "an H100", "an A100", "a B200": the article goes by the first letter's sound.
        let article = if gpu.name.starts_with(|c: char| "AEFHILMNORSXaefhilmnorsx".contains(c)) { "an" } else { "a" };
        Err(format!("the run was on {device}, which is not {article} {} ({}): pass the --gpu it ran on", gpu.name, names.join(", ")))
    }
}

/// Weighted least squares in relative error: the `a`, `b` minimising
/// Σ ((a·x0 + b·x1 − t) / t)², with `a` kept >= 0 (a negative intercept is no
/// latency). Rows are (x0, x1, t); t > 0.
pub(crate) fn relative_fit(rows: &[(f64, f64, f64)]) -> (f64, f64) {
    let (mut uu, mut uv, mut vv, mut u1, mut v1) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x0, x1, t) in rows {
        let (u, v) = (x0 / t, x1 / t);
        uu += u * u;
        uv += u * v;
        vv += v * v;
        u1 += u;
        v1 += v;
    }
    let det = uu * vv - uv * uv;
    if det > 1e-12 * uu * vv && det > 0.0 {
        let a = (u1 * vv - v1 * uv) / det;
        let b = (uu * v1 - uv * u1) / det;
        if a >= 0.0 {
            return (a, b);
        }
    }
    (0.0, if vv > 0.0 { v1 / vv } else { 0.0 })
}

/// The fit of one GPU's efficiencies to a measurement.
#[derive(Clone, Debug, Serialize)]
pub struct OpsFit {
    pub gpu: String,
    /// (parameter, before, fitted).
    pub params: Vec<(String, f64, f64)>,
    /// GEMM kernel and memory-bound rows fitted.
    pub gemm_rows: usize,
    pub memory_rows: usize,
    /// Relative error of each fitted row's time under the profile before and after.
    pub before: Stats,
    pub after: Stats,
    pub efficiency: Efficiency,
    pub notes: Vec<String>,
}

/// The pull of the GEMM size at half efficiency towards its prior, in squared log units
/// against the relative errors' squares: weak, so that GEMMs of several sizes move it,
/// while a measurement of large GEMMs alone (which cannot see it) leaves it in place.
const HALF_PRIOR_WEIGHT: f64 = 0.02;

/// One GEMM kernel: its name (the op's, and which of its three GEMMs), format, FLOPs,
/// calls, seconds.
struct KernelRow {
    name: String,
    format: GemmFormat,
    flops: f64,
    calls: f64,
    time: f64,
}

/// The most a memory fit may exceed the profile's HBM bandwidth and still be read as 1.
const MEMORY_OVER_HBM: f64 = 1.25;

/// How far the fitted profile's total over the GEMM kernels may stray from their
/// measured total before `fit_ops` says so.
const GEMM_TOTAL_TOLERANCE: f64 = 0.05;

/// How far it may stray before `fit_ops` refuses the fit: a profile that misses the very
/// step it was fitted to by more would project every other step as wrongly.
const GEMM_TOTAL_REFUSED: f64 = 0.25;

/// The fitted total over the GEMM kernels against the measured one, from each kernel's
/// (name, fitted seconds, measured seconds): a note past [`GEMM_TOTAL_TOLERANCE`], an
/// error past [`GEMM_TOTAL_REFUSED`], each naming the kernel that misses by the most
/// time (the one to look at: a shape the device runs far slower than the others).
fn gemm_total_check(kernels: &[(&str, f64, f64)], origin: &str) -> Result<Option<String>, String> {
    let fitted: f64 = kernels.iter().map(|k| k.1).sum();
    let measured: f64 = kernels.iter().map(|k| k.2).sum();
    let off = fitted / measured - 1.0;
    if off.is_nan() || off.abs() <= GEMM_TOTAL_TOLERANCE {
        return Ok(None);
    }
    let worst = kernels.iter().max_by(|a, b| (a.1 - a.2).abs().total_cmp(&(b.1 - b.2).abs())).map_or(String::new(), |k| {
        format!("; the kernel that misses most: {} ({:.3} ms fitted against {:.3} ms measured)", k.0, 1e3 * k.1, 1e3 * k.2)
    });
    let said = format!(
        "the fitted profile gives the {} GEMM kernels {:.3} ms in all against the {:.3} ms measured ({:+.0}%){worst}",
        kernels.len(),
        1e3 * fitted,
        1e3 * measured,
        100.0 * off
    );
    if off.abs() > GEMM_TOTAL_REFUSED {
        return Err(format!(
            "{origin}: {said}: a profile that misses the step it was fitted to by more than {:.0}% is not written; \
             measure again (`runner measure --repeats 5`, on an idle device), or project with the measurement itself \
             (`runner project --measured {origin}`)",
            100.0 * GEMM_TOTAL_REFUSED
        ));
    }
    Ok(Some(format!("{said}: one rate per format does not follow kernels whose rates differ by more than their sizes explain")))
}

/// Fit `gpu`'s GEMM efficiency of each measured format, its GEMM size at half
/// efficiency and its HBM efficiency to `file` (measured on that GPU:
/// [`OpsFile::check_target`]'s GPU rule is the caller's). GEMM kernels the profile
/// says are bound by memory (their bytes at the achieved HBM rate take more than half
/// their time) are left out: they say nothing about the tensor cores.
///
/// # Errors
/// Nothing to fit, or a fitted efficiency outside (0, 1] (a profile whose peaks the
/// device beats: wrong GPU, or wrong peaks).
pub fn fit_ops(file: &OpsFile, gpu: &GpuProfile, origin: &str) -> Result<OpsFit, String> {
    let before_eff = gpu.efficiency.clone();
    let hbm = gpu.hbm_gbs * 1e9;
    let mut notes = Vec::new();
    let mut rows: Vec<KernelRow> = Vec::new();
    let mut memory_bound = 0;
    for op in &file.ops {
        let Some(g) = &op.gemm else { continue };
        for (r, &format) in g.formats.iter().enumerate() {
            let time = g.kernel_s[r];
            if g.bytes / (hbm * before_eff.memory) > 0.5 * time {
                memory_bound += 1;
                continue;
            }
            let name = format!("{} {}", op.name, ["forward", "input gradient", "weight gradient"][r]);
            rows.push(KernelRow { name, format, flops: g.flops, calls: g.calls as f64, time });
        }
    }
    if memory_bound > 0 {
        notes.push(format!("{memory_bound} GEMM kernel(s) left out: bound by memory at the profile's HBM rate"));
    }
    let mem_rows: Vec<(f64, f64)> = file
        .ops
        .iter()
        .filter_map(|o| o.memory.as_ref())
        .filter(|m| m.run_fwd_s > 0.0)
        .map(|m| (m.run_bytes, m.run_fwd_s))
        .collect();
    if rows.is_empty() && mem_rows.is_empty() {
        return Err(format!("{origin}: no GEMM or memory-bound op to fit (measure with `runner measure`, which times both)"));
    }
    let formats: Vec<GemmFormat> = GemmFormat::ALL.into_iter().filter(|f| rows.iter().any(|r| r.format == *f)).collect();
    // For a size at half efficiency h (FLOPs), each format's 1/(peak·e) is the scale that
    // gives its kernels their measured total time (a least-squares scale in relative
    // error weighs a kernel of 0.1 ms like one of 50 ms, and a slow large one, a CPU's
    // lm_head, was missed: its step projected 4x too fast); h itself by a golden-section
    // search on its logarithm over the kernels' relative errors, unweighted: the small
    // kernels, a sliver of the time, are the ones that show it.
    let scales = |h: f64| -> Vec<(GemmFormat, f64)> {
        formats
            .iter()
            .map(|&f| {
                let (x, t) = rows.iter().filter(|r| r.format == f).fold((0.0, 0.0), |(x, t), r| (x + r.flops + h * r.calls, t + r.time));
                (f, t / x)
            })
            .collect()
    };
    let residuals = |h: f64| -> Vec<f64> {
        let s = scales(h);
        rows.iter()
            .map(|r| {
                let a = s.iter().find(|(f, _)| *f == r.format).map_or(0.0, |x| x.1);
                a * (r.flops + h * r.calls) / r.time - 1.0
            })
            .collect()
    };
    let h0 = before_eff.gemm_half_gflop * 1e9;
    let mut eff = before_eff.clone();
    let mut params = Vec::new();
    let mut before = Vec::new();
    let mut after = Vec::new();
    if !rows.is_empty() {
        // The size at half efficiency shows only as a rate that changes with the size:
        // with one call size per format, any size fits once the efficiency absorbs it,
        // so the size keeps its value and the efficiency is fitted at it.
        let sizes = |f: GemmFormat| {
            let mut s: Vec<f64> = rows.iter().filter(|r| r.format == f).map(|r| r.flops / r.calls).collect();
            s.sort_by(f64::total_cmp);
            s.dedup();
            s
        };
        let one_size = formats.iter().all(|&f| sizes(f).len() < 2);
        let h = if one_size {
            notes.push(format!(
                "the GEMMs measured have one size per format ({}): their size at half efficiency cannot be told from their \
                 efficiency, so gemm_half_gflop keeps its value ({} GFLOP) and the efficiency is fitted at it; measure GEMMs \
                 of several sizes (`runner measure` times every GEMM of the rank graph) to fit both",
                formats.iter().map(|&f| format!("{f}: {} FLOP per call", shown(sizes(f)[0]))).collect::<Vec<_>>().join(", "),
                shown(h0 / 1e9)
            ));
            h0
        } else {
            let objective = |lnh: f64| {
                let r: f64 = residuals(lnh.exp()).iter().map(|x| x * x).sum();
                r + HALF_PRIOR_WEIGHT * (lnh - h0.ln()).powi(2)
            };
            // Wider than the published-run fit's bounds: a device's own GEMMs can show a
            // half-efficiency size far below a GPU's (a CPU's is a few MFLOP).
            crate::calibrate::golden(objective, (1e6f64).ln(), (200e9f64).ln(), 80).exp()
        };
        for (f, a) in scales(h) {
            let peak = gpu.peak_flops(f).map_err(|e| format!("{origin}: {e}"))?;
            let e = 1.0 / (a * peak);
            if !(e.is_finite() && (crate::profile::MIN_EFFICIENCY..=1.0).contains(&e)) {
                // The peak in the profile's own unit, short: `{:.0}` showed a CPU's 0.2 TFLOP/s as 0.
                let peak_text = format!("{}'s {f} peak ({} TFLOP/s)", gpu.name, shown(four_digits(peak / 1e12)));
                let share = four_digits(100.0 * e);
                return Err(if one_size && e > 1.0 {
                    // Not the device outrunning its peak: the profile's size at half
                    // efficiency is far from this device's, and one size cannot fit it.
                    format!(
                        "{origin}: the measured {f} GEMMs, all of one size ({} FLOP per call), fitted at the profile's GEMM size \
                         at half efficiency ({} GFLOP) would run at {}% of {peak_text}, which no device does: one size cannot \
                         tell that size from the efficiency; measure GEMMs of several sizes (`runner measure` times every GEMM \
                         of the rank graph), or set gemm_half_gflop in the profile",
                        shown(sizes(f)[0]),
                        shown(h0 / 1e9),
                        shown(share)
                    )
                } else if e > 1.0 {
                    format!(
                        "{origin}: the measured {f} GEMMs run at {}% of {peak_text}, faster than the peak allows: the run was \
                         not on this GPU, or the profile's peak_tflops.{f} is too low",
                        shown(share)
                    )
                } else {
                    format!(
                        "{origin}: the measured {f} GEMMs reach only {}% of {peak_text}: the run was not on this GPU, or the \
                         profile's peak_tflops.{f} is too high",
                        shown(share)
                    )
                });
            }
            params.push((format!("gemm.{f}"), before_eff.gemm.get(f), e));
            eff.gemm.set(f, e);
        }
        if !one_size {
            params.push(("gemm_half_gflop".into(), before_eff.gemm_half_gflop, h / 1e9));
            eff.gemm_half_gflop = h / 1e9;
        }
        // The projection's own law (`Rates::gemm`, the one the fit's linear form above
        // rewrites: flops / (rate · call/(call + half)) = (flops + half · calls) / rate),
        // before and after, per row. Rows carry no bytes: the HBM floor is not in play.
        let law = |e: &Efficiency, r: &KernelRow| {
            let rates = crate::template::Rates::new(&GpuProfile { efficiency: e.clone(), ..gpu.clone() });
            rates.gemm(r.flops, r.flops / r.calls.max(1.0), 0.0, r.format) / r.time - 1.0
        };
        before.extend(rows.iter().map(|r| law(&before_eff, r)));
        after.extend(rows.iter().map(|r| law(&eff, r)));
        // Each format's scale gives its kernels their measured total, so the fitted total
        // matches by construction; checked through the projection's own law all the
        // same, so a later change to the fit or the law that loses the step is caught.
        // `after` holds the GEMM rows' relative errors alone so far (memory rows come later).
        let kernels: Vec<(&str, f64, f64)> = after.iter().zip(&rows).map(|(e, r)| (r.name.as_str(), (e + 1.0) * r.time, r.time)).collect();
        notes.extend(gemm_total_check(&kernels, origin)?);
    } else {
        notes.push("no GEMM measured: the GEMM efficiencies keep their values".into());
    }
    if !mem_rows.is_empty() {
        // As the GEMMs': the scale that gives the ops their measured total time.
        let (bytes, time) = mem_rows.iter().fold((0.0, 0.0), |(b, t), &(rb, rt)| (b + rb, t + rt));
        let c = time / bytes;
        let mut e = 1.0 / (c * hbm);
        // An op whose bytes partly stay in L2 (a tensor read twice, smaller than the cache)
        // looks a little faster than HBM allows; up to a quarter over is read as the full
        // bandwidth, beyond that the run or the profile is wrong.
        if e > 1.0 && e <= MEMORY_OVER_HBM {
            notes.push(format!(
                "the memory-bound ops moved {:.0}% of {}'s HBM bandwidth (some bytes stayed in the cache): memory is set to 1",
                100.0 * e,
                gpu.name
            ));
            e = 1.0;
        }
        if !(e.is_finite() && (crate::profile::MIN_EFFICIENCY..=1.0).contains(&e)) {
            return Err(format!(
                "{origin}: the memory-bound ops move {}% of {}'s HBM bandwidth ({} GB/s): the run was not on this GPU, or \
                 the profile's hbm_gbs is wrong",
                shown(four_digits(100.0 * e)),
                gpu.name,
                shown(gpu.hbm_gbs)
            ));
        }
        before.extend(mem_rows.iter().map(|&(b, t)| b / (hbm * before_eff.memory) / t - 1.0));
        after.extend(mem_rows.iter().map(|&(b, t)| b / (hbm * e) / t - 1.0));
        params.push(("memory".into(), before_eff.memory, e));
        eff.memory = e;
    } else {
        notes.push("no memory-bound op measured (a sharded rank's step needs its peers): memory keeps its value".into());
    }
    notes.push("attention keeps its value: no FlashAttention time was measured".into());
    Ok(OpsFit {
        gpu: gpu.name.clone(),
        params,
        gemm_rows: rows.len(),
        memory_rows: mem_rows.len(),
        before: Stats::of(before.into_iter()),
        after: Stats::of(after.into_iter()),
        efficiency: eff,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profiles;

    use crate::profile::test_h100 as h100;

    /// GEMM rows whose times follow the roofline's law exactly for known efficiencies.
    fn synthetic(gpu: &GpuProfile, e_bf16: f64, half_gflop: f64, e_mem: f64) -> OpsFile {
        let peak = gpu.peak_tflops.bf16 * 1e12;
        let mut ops = Vec::new();
        for (i, (m, n, k, calls)) in [(4096.0, 4096.0, 4096.0, 1u64), (1024.0, 1024.0, 512.0, 1), (8192.0, 14336.0, 4096.0, 1), (256.0, 2048.0, 1024.0, 8), (2048.0, 512.0, 512.0, 1)]
            .into_iter()
            .enumerate()
        {
            let flops = 2.0 * m * n * k;
            let t = (flops + half_gflop * 1e9 * calls as f64) / (peak * e_bf16);
            ops.push(OpTime {
                name: format!("g{i}"),
                kind: OpClass::Gemm,
                layer: 0,
                shape: Vec::new(),
                fwd_s: t,
                bwd_s: 2.0 * t,
                gemm: Some(GemmDetail { formats: [GemmFormat::Bf16; 3], flops, calls, bytes: 2.0 * (m * k + n * k + m * n), kernel_s: [t; 3] }),
                memory: None,
            });
        }
        for (i, bytes) in [1e6, 3e7, 2e8].into_iter().enumerate() {
            let t = bytes / (gpu.hbm_gbs * 1e9 * e_mem);
            ops.push(OpTime {
                name: format!("v{i}"),
                kind: OpClass::Memory,
                layer: 0,
                shape: Vec::new(),
                fwd_s: t / 2.0,
                bwd_s: t,
                gemm: None,
                memory: Some(MemoryDetail { bytes: bytes / 2.0, run_bytes: bytes, run_fwd_s: t, run_bwd_s: 2.0 * t }),
            });
        }
        OpsFile {
            format: FORMAT.into(),
            version: VERSION,
            device: "cuda:0 (NVIDIA H100 80GB HBM3, sm_90)".into(),
            measured_at: "2026-12-01T10:00:00Z".into(),
            gpu: "H100".into(),
            model: "m".into(),
            seq_len: 4096,
            precision: "bf16".into(),
            shard: ShardKey { tp: 1, cp: 1, ep: 1, etp: 1, sp: false, mbs: 1 },
            repeats: 3,
            notes: Vec::new(),
            ops,
        }
    }

    #[test]
    fn a_synthetic_measurement_is_fitted_back_to_its_efficiencies() {
        let gpu = h100();
        let f = fit_ops(&synthetic(&gpu, 0.62, 7.5, 0.71), &gpu, "ops.json").unwrap();
        // The fit's pull towards the shipped table (gemm_half_gflop 3.3 there) leaves the
        // size at 7.46 and the efficiency a few thousandths low along their ridge.
        assert!((f.efficiency.gemm.bf16 - 0.62).abs() < 3e-3, "{:?}", f.params);
        assert!((f.efficiency.gemm_half_gflop - 7.5).abs() < 0.1, "{:?}", f.params);
        assert!((f.efficiency.memory - 0.71).abs() < 1e-9, "{:?}", f.params);
        assert!(f.after.max < 5e-3 && f.after.max < f.before.max, "{:?} {:?}", f.before, f.after);
        assert_eq!(f.efficiency.gemm.fp8, gpu.efficiency.gemm.fp8, "a format not measured keeps its value");
        assert_eq!(f.efficiency.attention, gpu.efficiency.attention);
    }

    /// The fitted profile gives the GEMM kernels their measured total time, even where one
    /// large kernel runs at half the others' rate (as a CPU's lm_head): the step the
    /// profile was fitted to is projected as measured. The fit weighed each kernel's
    /// relative error alike and missed it (the note said -9% here, -82% on a CPU). Kills
    /// the per-format scale fitted in relative error again.
    #[test]
    fn the_fitted_total_matches_the_measured_one_with_a_slow_large_kernel() {
        let gpu = h100();
        let mut file = synthetic(&gpu, 0.62, 7.5, 0.71);
        let g = file.ops[2].gemm.as_mut().unwrap();
        g.kernel_s = g.kernel_s.map(|t| 2.0 * t);
        let fit = fit_ops(&file, &gpu, "ops.json").unwrap();
        assert_eq!(fit.gemm_rows, 15);
        let rates = crate::template::Rates::new(&GpuProfile { efficiency: fit.efficiency.clone(), ..gpu.clone() });
        let (mut fitted, mut measured) = (0.0, 0.0);
        for g in file.ops.iter().filter_map(|o| o.gemm.as_ref()) {
            for t in g.kernel_s {
                fitted += rates.gemm(g.flops, g.flops / g.calls as f64, 0.0, GemmFormat::Bf16);
                measured += t;
            }
        }
        assert!((fitted / measured - 1.0).abs() < 1e-9, "fitted {fitted} against {measured} measured");
        assert!(!fit.notes.iter().any(|n| n.contains("GEMM kernels")), "{:?}", fit.notes);
    }

    /// The fitted total against the measured one: nothing within 5 %, a note past it, and
    /// past 25 % a refusal (the profile is not written); both name the kernel that misses
    /// by the most time. Kills either threshold dropped or swapped, the worst kernel
    /// picked by relative error (the small one, off by more in relative terms, would be
    /// named).
    #[test]
    fn a_fitted_total_off_the_measured_one_is_said_and_far_off_refused() {
        assert_eq!(gemm_total_check(&[("a", 1.0, 1.0), ("b", 2.0, 2.0)], "ops.json"), Ok(None));
        assert_eq!(gemm_total_check(&[("a", 0.9, 1.0), ("b", 2.0, 2.0)], "ops.json"), Ok(None), "-3%: within 5%");
        let note = gemm_total_check(&[("a", 0.7, 1.0), ("b", 2.0, 2.0)], "ops.json").unwrap().expect("said");
        assert!(
            note.starts_with(
                "the fitted profile gives the 2 GEMM kernels 2700.000 ms in all against the 3000.000 ms measured (-10%); \
                 the kernel that misses most: a (700.000 ms fitted against 1000.000 ms measured): one rate per format"
            ),
            "{note}"
        );
        let e = gemm_total_check(&[("q forward", 0.0005, 0.001), ("lm_head forward", 0.02, 0.05)], "ops.json").unwrap_err();
        assert!(
            e.starts_with(
                "ops.json: the fitted profile gives the 2 GEMM kernels 20.500 ms in all against the 51.000 ms measured (-60%); \
                 the kernel that misses most: lm_head forward (20.000 ms fitted against 50.000 ms measured): a profile that \
                 misses the step it was fitted to by more than 25% is not written"
            ),
            "{e}"
        );
        let note = gemm_total_check(&[("a", 1.0, 1.0), ("b", 1.4, 1.2)], "ops.json").unwrap().expect("said");
        assert!(note.contains("(+9%); the kernel that misses most: b (1400.000 ms fitted against 1200.000 ms measured)"), "{note}");
    }

    #[test]
    fn a_device_faster_than_the_peak_is_refused() {
        let gpu = h100();
        let e = fit_ops(&synthetic(&gpu, 1.6, 7.5, 0.7), &gpu, "ops.json").unwrap_err();
        assert!(e.contains("ops.json") && e.contains("bf16") && e.contains("peak"), "{e}");
        // Memory-bound ops a little over HBM (cache hits) read as the full bandwidth, with
        // a note; far over is refused.
        let f = fit_ops(&synthetic(&gpu, 0.6, 7.5, 1.1), &gpu, "ops.json").unwrap();
        assert_eq!(f.efficiency.memory, 1.0);
        assert!(f.notes.iter().any(|n| n.contains("stayed in the cache")), "{:?}", f.notes);
        let e = fit_ops(&synthetic(&gpu, 0.6, 7.5, 1.5), &gpu, "ops.json").unwrap_err();
        assert!(e.contains("HBM bandwidth"), "{e}");
    }

    /// A small peak (a CPU's 0.2 TFLOP/s) is printed as given, not rounded to 0, and a
    /// share over 100 % is said to be past the peak.
    #[test]
    fn a_small_peak_is_printed_as_given() {
        let mut cpu = h100();
        cpu.peak_tflops.bf16 = 0.2;
        let e = fit_ops(&synthetic(&cpu, 1.6, 7.5, 0.7), &cpu, "ops.json").unwrap_err();
        assert!(e.contains("bf16 peak (0.2 TFLOP/s)") && e.contains("faster than the peak allows"), "{e}");
    }

    /// GEMMs of one size cannot separate the size at half efficiency from the
    /// efficiency: the size keeps its value, and where the efficiency it leaves is past
    /// the peak the error says so (it blamed the GPU or its peaks: a CPU's 256x256x256
    /// GEMMs of a hand-trimmed `runner measure` file read "765% of peak").
    #[test]
    fn gemms_of_one_size_keep_the_size_at_half_efficiency() {
        let gpu = h100();
        let keep = |f: &OpsFile, name: &str| OpsFile { ops: f.ops.iter().filter(|o| o.name == name || o.memory.is_some()).cloned().collect(), ..f.clone() };
        // Small GEMMs (1 GFLOP) with a small true size at half efficiency: the prior's
        // 2 GFLOP would take them past the peak. (HBM raised so that the profile does
        // not call them bound by memory and leave them out.)
        let fast = GpuProfile { hbm_gbs: 1e5, ..gpu.clone() };
        let e = fit_ops(&keep(&synthetic(&fast, 0.6, 0.01, 0.7), "g1"), &fast, "ops.json").unwrap_err();
        assert!(e.contains("ops.json") && e.contains("one size") && e.contains("several sizes") && !e.contains("not on this GPU"), "{e}");
        assert!(e.contains("which no device does"), "a share past the peak is said to be impossible: {e}");
        // Large GEMMs of one size: the efficiency is fitted at the kept size, which the
        // table does not list as fitted.
        let f = fit_ops(&keep(&synthetic(&gpu, 0.62, 7.5, 0.7), "g2"), &gpu, "ops.json").unwrap();
        assert_eq!(f.efficiency.gemm_half_gflop, gpu.efficiency.gemm_half_gflop);
        assert!(f.params.iter().all(|p| p.0 != "gemm_half_gflop"), "{:?}", f.params);
        assert!((f.efficiency.gemm.bf16 - 0.62).abs() < 5e-3, "{:?}", f.params);
        assert!(f.notes.iter().any(|n| n.contains("one size per format")), "{:?}", f.notes);
    }

    #[test]
    fn relative_fit_recovers_a_line_and_keeps_the_intercept_non_negative() {
        let rows: Vec<(f64, f64, f64)> = [1e3, 1e5, 1e7].iter().map(|&x| (1.0, x, 3e-6 + x * 2e-11)).collect();
        let (a, b) = relative_fit(&rows);
        assert!((a - 3e-6).abs() < 1e-15 && (b - 2e-11).abs() < 1e-20, "{a} {b}");
        let rows: Vec<(f64, f64, f64)> = [1e3f64, 1e5, 1e7].iter().map(|&x| (1.0, x, (x * 2e-11 - 1e-7).max(1e-9))).collect();
        assert!(relative_fit(&rows).0 >= 0.0);
        // Columns in proportion (x1 = x0 / 10) leave a determinant of rounding noise
        // (7e-18): no intercept, the slope alone, not a solve of the noise ((0.5, 8)).
        let rows: Vec<(f64, f64, f64)> = [1.0, 2.0, 3.0].iter().map(|&t| (1.0, 0.1, t)).collect();
        let (a, b) = relative_fit(&rows);
        assert!(a == 0.0 && (b - 13.469_387_755_102_04).abs() < 1e-9, "{a} {b}");
    }

    #[test]
    fn files_are_parsed_strictly_and_errors_name_the_field() {
        let good = serde_json::to_string_pretty(&synthetic(&h100(), 0.6, 5.0, 0.7)).unwrap();
        let f = OpsFile::parse(&good, "ops.json").unwrap();
        assert_eq!(f.counts().get("gemm"), Some(&5));
        let bad = |text: &str, want: &str| {
            let e = OpsFile::parse(text, "ops.json").unwrap_err();
            assert!(e.contains("ops.json") && e.contains(want), "want '{want}': {e}");
        };
        bad("{\"format\": ", "line 1");
        bad(&good.replace(FORMAT, "other"), "format is 'other'");
        bad(&good.replacen("\"version\": 1", "\"version\": 9", 1), "version 9");
        bad(&good.replacen("\"repeats\": 3", "\"repeats\": 3, \"bogus\": 1", 1), "bogus");
        bad(&good.replacen("\"name\": \"g1\"", "\"name\": \"g0\"", 1), "listed twice");
        bad(&good.replacen("\"calls\": 1", "\"calls\": 0", 1), "gemm.calls");
        bad(&good.replacen("\"kind\": \"memory\"", "\"kind\": \"gemm\"", 1), "a `gemm` object");
        bad(&good.replacen("\"mbs\": 1", "\"mbs\": 0", 1), "shard.mbs");
        bad(&good.replacen("\"fwd_s\": ", "\"fwd_s\": -", 1), "ops[0] ('g0'): fwd_s must be a number of seconds");
        bad(&good.replacen("\"measured_at\": \"2026-12-01T10:00:00Z\"", "\"measured_at\": \"\"", 1), "measured_at");
        bad(&good.replacen(",\n  \"measured_at\": \"2026-12-01T10:00:00Z\"", "", 1), "missing field `measured_at`");
        bad("[{\"op\": \"all_reduce\"}]", "--collectives");
        // JSON has no NaN: serde says "expected value", the hint says why.
        for v in ["NaN", "-Infinity", "Infinity"] {
            bad(&good.replacen("\"repeats\": 3", &format!("\"repeats\": {v}"), 1), "NaN and Infinity are not JSON numbers");
        }
    }

    /// NaN, negative, zero and huge values give an error or a finite fit, never a panic;
    /// the parser refuses every time that is not a finite number >= 0.
    #[test]
    fn extreme_values_never_panic() {
        let gpu = h100();
        let good = synthetic(&gpu, 0.6, 5.0, 0.7);
        let finite_fit = |f: &OpsFile, what: &str| {
            if let Ok(fit) = fit_ops(f, &gpu, "ops.json") {
                let e = &fit.efficiency;
                assert!(e.gemm.bf16.is_finite() && e.gemm_half_gflop.is_finite() && e.memory.is_finite(), "{what}: {:?}", fit.params);
            }
        };
        for v in [f64::NAN, f64::INFINITY, -1.0, 0.0, 1e-300, 1e300, f64::MAX] {
            let mut f = good.clone();
            f.ops[0].gemm.as_mut().unwrap().kernel_s[1] = v;
            f.ops[1].gemm.as_mut().unwrap().flops = v;
            f.ops[6].memory.as_mut().unwrap().run_fwd_s = v;
            f.ops[7].fwd_s = v;
            finite_fit(&f, &format!("{v}"));
            let text = serde_json::to_string(&f).unwrap();
            let parsed = OpsFile::parse(&text, "ops.json");
            if !(v.is_finite() && v > 0.0 && v <= MAX_SECONDS) {
                assert!(parsed.is_err(), "{v} accepted");
            }
        }
        let mut f = good.clone();
        f.ops[0].gemm.as_mut().unwrap().calls = u64::MAX;
        f.ops[0].gemm.as_mut().unwrap().bytes = f64::MAX;
        finite_fit(&f, "calls u64::MAX");
        assert!(OpsFile::parse("{\"format\": 1e999}", "ops.json").unwrap_err().contains("line 1"));
    }

    #[test]
    fn a_measurement_holds_only_for_its_own_target_and_sharding() {
        let gpu = h100();
        let f = synthetic(&gpu, 0.6, 5.0, 0.7);
        assert!(f.check_target("ops.json", "m", 4096, &gpu, "BF16").is_ok());
        let e = f.check_target("ops.json", "other", 4096, &gpu, "bf16").unwrap_err();
        assert!(e.contains("--model m"), "{e}");
        let e = f.check_target("ops.json", "m", 8192, &gpu, "bf16").unwrap_err();
        assert!(e.contains("--seq-len 4096"), "{e}");
        let b200 = Profiles::builtin().get("b200").unwrap().clone();
        let e = f.check_target("ops.json", "m", 4096, &b200, "bf16").unwrap_err();
        assert!(e.contains("--gpu H100"), "{e}");
        let e = f.check_target("ops.json", "m", 4096, &gpu, "fp8").unwrap_err();
        assert!(e.contains("--precision bf16"), "{e}");
        let other = ShardKey { tp: 2, sp: true, ..f.shard };
        let e = f.check_key("ops.json", other).unwrap_err();
        assert!(e.contains("tp=1") && e.contains("tp=2") && e.contains("--tp 1"), "{e}");
        assert!(f.check_key("ops.json", f.shard).is_ok());
    }

    #[test]
    fn only_the_gpu_it_ran_on_stands_for_a_builtin_profile() {
        let p = Profiles::builtin();
        let h100 = p.get("h100").unwrap();
        assert!(stands_for("cuda:0 (NVIDIA H100 80GB HBM3, sm_90)", h100, true).is_ok());
        assert!(stands_for("cuda:0 (NVIDIA A100-SXM4-80GB, sm_80)", p.get("a100-80gb").unwrap(), true).is_ok());
        assert!(stands_for("cuda:0 (NVIDIA H200, sm_90)", p.get("nvidia-h200-141gb").unwrap(), true).is_ok());
        assert!(stands_for("cuda:0 (Tesla A100-SXM4-40GB, sm_80)", p.get("nvidia-tesla-a100").unwrap(), true).is_ok());
        // GCP's names start with "nvidia", which every NVIDIA device's name holds.
        let e = stands_for("cuda:0 (NVIDIA GH200 480GB, sm_90)", p.get("h200").unwrap(), true).unwrap_err();
        assert!(e.contains("--gpu"), "{e}");
        let e = stands_for("cpu (2 threads)", h100, true).unwrap_err();
        assert!(e.contains("--profile FILE"), "{e}");
        assert!(stands_for("cpu (2 threads)", h100, false).is_ok(), "a user's own profile takes any device");
    }

    /// Each rule of the parser refuses its own field by name, and what the rules allow
    /// parses: a time of exactly a day, an op outside the stack (layer -1), a backward
    /// that launches nothing, a forward a rounding error below its kernel's time.
    #[test]
    fn each_rule_refuses_its_own_field_and_allows_its_edges() {
        let good = synthetic(&h100(), 0.6, 5.0, 0.7);
        let parse = |f: &OpsFile| OpsFile::parse(&serde_json::to_string(f).unwrap(), "ops.json");
        let with = |edit: &dyn Fn(&mut OpsFile)| {
            let mut f = good.clone();
            edit(&mut f);
            f
        };
        let refused = |f: OpsFile, want: &str| {
            let e = parse(&f).unwrap_err();
            assert!(e.contains(want), "want '{want}': {e}");
        };
        parse(&good).unwrap();
        refused(with(&|f| f.shard.etp = 0), "shard.etp must be at least 1");
        refused(with(&|f| f.seq_len = 0), "seq_len must be at least 1");
        refused(with(&|f| f.ops.clear()), "ops is empty");
        refused(with(&|f| f.ops[1].name.clear()), "ops[1]: name is empty");
        refused(with(&|f| f.ops[1].gemm.as_mut().unwrap().flops = 0.0), "ops[1] ('g1'): gemm.flops must be > 0");
        refused(with(&|f| f.ops[1].gemm.as_mut().unwrap().kernel_s[2] = 0.0), "ops[1] ('g1'): gemm.kernel_s must hold three times");
        // A backward longer than one of its GEMMs but shorter than the two.
        refused(with(&|f| f.ops[1].bwd_s = 1.5 * f.ops[1].gemm.as_ref().unwrap().kernel_s[1]), "ops[1] ('g1'): fwd_s and bwd_s must be at least");
        // A memory op: no bytes moved by the run, or a backward off its bytes' share.
        refused(with(&|f| f.ops[5].memory.as_mut().unwrap().run_bytes = 0.0), "ops[5] ('v0'): memory.bytes must be finite");
        refused(with(&|f| f.ops[5].bwd_s *= 1.5), "ops[5] ('v0'): fwd_s and bwd_s must be run_fwd_s and run_bwd_s scaled");
        // Bytes over run bytes past the largest float: no scaling to check the times by.
        refused(
            with(&|f| {
                let m = f.ops[5].memory.as_mut().unwrap();
                (m.bytes, m.run_bytes) = (1e300, 1e-10);
            }),
            "ops[5] ('v0'): fwd_s and bwd_s must be run_fwd_s and run_bwd_s scaled",
        );
        // The edges each rule allows.
        let attention = |fwd: f64| OpTime {
            name: "a0".into(),
            kind: OpClass::Attention,
            layer: -1,
            shape: Vec::new(),
            fwd_s: fwd,
            bwd_s: 0.0,
            gemm: None,
            memory: None,
        };
        parse(&with(&|f| f.ops.push(attention(MAX_SECONDS)))).unwrap();
        refused(with(&|f| f.ops.push(attention(MAX_SECONDS * (1.0 + 1e-12)))), "ops[8] ('a0'): fwd_s must be");
        parse(&with(&|f| {
            f.ops[5].memory.as_mut().unwrap().run_bwd_s = 0.0;
            f.ops[5].bwd_s = 0.0;
        }))
        .unwrap();
        parse(&with(&|f| f.ops[1].fwd_s = f.ops[1].gemm.as_ref().unwrap().kernel_s[0] * (1.0 - 1e-12))).unwrap();
    }

    /// The GPU a file stands for is named by the profile's name or any alias; a memory op
    /// whose run moved bytes a thousand times past HBM is refused by its run's bytes
    /// (f32), not the graph's (half of them at BF16).
    #[test]
    fn the_gpu_rule_takes_aliases_and_reads_the_runs_own_bytes() {
        let gpu = h100();
        let good = synthetic(&gpu, 0.6, 5.0, 0.7);
        good.check_gpu("ops.json", &gpu).unwrap();
        OpsFile { gpu: "h100-sxm".into(), ..good.clone() }.check_gpu("ops.json", &gpu).unwrap();
        let mut fast = good.clone();
        let run_fwd_s = 1e-6;
        let run_bytes = 1500.0 * gpu.hbm_gbs * 1e9 * run_fwd_s;
        fast.ops[5].memory = Some(MemoryDetail { bytes: run_bytes / 2.0, run_bytes, run_fwd_s, run_bwd_s: 2.0 * run_fwd_s });
        (fast.ops[5].fwd_s, fast.ops[5].bwd_s) = (run_fwd_s / 2.0, run_fwd_s);
        let e = fast.check_gpu("ops.json", &gpu).unwrap_err();
        assert!(e.contains("ops[5] ('v0')") && e.contains("a thousand times past H100"), "{e}");
        // The message names both shardings as they are.
        let e = good.check_key("ops.json", ShardKey { tp: 2, sp: true, ..good.shard }).unwrap_err();
        assert!(e.contains("measured at tp=1 cp=1 ep=1 etp=1 sp=off mbs=1, the layout is tp=2 cp=1 ep=1 etp=1 sp=on mbs=1"), "{e}");
    }

    /// The margins of the rate and scale rules: a GEMM kernel twice past its format's
    /// peak is a unit slip (1.5x leaves room for a conservative clock), 1.4x is not; a
    /// memory op's backward a thousandth off its bytes' share disagrees with the file's
    /// own figures (JSON keeps far more digits), one a rounding error off does not.
    #[test]
    fn the_rate_and_scale_rules_hold_at_their_margins() {
        let gpu = h100();
        let good = synthetic(&gpu, 0.6, 5.0, 0.7);
        let peak = gpu.peak_flops(GemmFormat::Bf16).unwrap();
        let at = |by: f64| {
            let mut f = good.clone();
            let g = f.ops[0].gemm.as_mut().unwrap();
            let t = g.flops / (by * peak);
            g.kernel_s = [t; 3];
            (f.ops[0].fwd_s, f.ops[0].bwd_s) = (t, 2.0 * t);
            f.check_gpu("ops.json", &gpu)
        };
        let e = at(2.0).unwrap_err();
        assert!(e.starts_with("ops.json: ops[0] ('g0'): the forward GEMM's") && e.contains("past H100's bf16 peak of 989"), "{e}");
        at(1.4).unwrap();
        let parse = |f: &OpsFile| OpsFile::parse(&serde_json::to_string(f).unwrap(), "ops.json");
        let mut f = good.clone();
        f.ops[5].bwd_s *= 1.001;
        assert!(parse(&f).unwrap_err().contains("ops[5] ('v0'): fwd_s and bwd_s must be run_fwd_s and run_bwd_s scaled"));
        f.ops[5].bwd_s = good.ops[5].bwd_s * (1.0 + 1e-9);
        parse(&f).unwrap();
        // A GEMM that reads and writes nothing the file counts (bytes 0) is a GEMM still.
        let mut f = good.clone();
        f.ops[1].gemm.as_mut().unwrap().bytes = 0.0;
        parse(&f).unwrap();
    }

    /// The NaN hint reads past a sign, wherever the error's column points: at the value or
    /// at its minus.
    #[test]
    fn the_not_a_number_hint_reads_past_a_sign() {
        let text = "{\"repeats\": -Infinity}";
        for column in [13, 14] {
            assert!(not_a_number_hint(text, 1, column).contains("NaN and Infinity are not JSON numbers"), "column {column}");
        }
        assert_eq!(not_a_number_hint(text, 1, 2), "");
    }

    /// The size a GEMM's efficiency follows is its call's: a grouped GEMM of four calls
    /// the size of another GEMM's one is the same size, so the file has one size and
    /// gemm_half_gflop keeps its value.
    #[test]
    fn a_grouped_gemm_is_sized_by_its_call() {
        let gpu = h100();
        let mut f = synthetic(&gpu, 0.62, 7.5, 0.7);
        let mut four = f.ops[0].clone();
        four.name = "g9".into();
        let g = four.gemm.as_mut().unwrap();
        (g.flops, g.calls, g.bytes) = (4.0 * g.flops, 4, 4.0 * g.bytes);
        g.kernel_s = g.kernel_s.map(|t| 4.0 * t);
        (four.fwd_s, four.bwd_s) = (4.0 * four.fwd_s, 4.0 * four.bwd_s);
        f.ops.retain(|o| o.name == "g0" || o.memory.is_some());
        f.ops.push(four);
        let fit = fit_ops(&f, &gpu, "ops.json").unwrap();
        assert!(fit.notes.iter().any(|n| n.contains("one size per format")), "{:?}", fit.notes);
        assert!(fit.params.iter().all(|p| p.0 != "gemm_half_gflop"), "{:?}", fit.params);
        assert_eq!(fit.efficiency.gemm_half_gflop, gpu.efficiency.gemm_half_gflop);
    }

    /// A Tesla V100 is no A100 though the A100's GCP alias starts with "nvidia-tesla".
    #[test]
    fn the_vendor_words_of_an_alias_name_no_gpu() {
        let p = Profiles::builtin();
        let a100 = p.get("nvidia-tesla-a100").unwrap();
        let e = stands_for("cuda:0 (Tesla V100-SXM2-16GB, sm_70)", a100, true).unwrap_err();
        assert!(e.contains("not an A100-40GB") && e.contains("--gpu"), "{e}");
        // Each alias's model once, however many aliases share it.
        let e = stands_for("cuda:0 (NVIDIA L40S, sm_89)", p.get("h100").unwrap(), true).unwrap_err();
        assert!(e.starts_with("the run was on cuda:0 (NVIDIA L40S, sm_89), which is not an H100 (h100): pass"), "{e}");
        let e = stands_for("cuda:0 (NVIDIA L40S, sm_89)", p.get("b200").unwrap(), true).unwrap_err();
        assert!(e.starts_with("the run was on cuda:0 (NVIDIA L40S, sm_89), which is not a B200 (b200): pass"), "{e}");
        // System and family words name no model: an MI355X is no MI300X, an HGX H100 no B200.
        let e = stands_for("rocm:0 (AMD Instinct MI355X)", p.get("mi300x").unwrap(), true).unwrap_err();
        assert!(e.contains("which is not an MI300X (mi300x)"), "{e}");
        assert!(stands_for("cuda:0 (NVIDIA HGX H100 80GB)", p.get("b200").unwrap(), true).is_err());
        assert!(stands_for("rocm:0 (AMD Instinct MI300X)", p.get("mi300x").unwrap(), true).is_ok());
    }

    /// A GEMM whose bytes take more than half its time at the achieved HBM rate is left
    /// out of the GEMM fit (it says nothing about the tensor cores), though at the full
    /// HBM rate it would take less than half.
    #[test]
    fn gemms_bound_by_memory_are_left_out_of_the_fit() {
        let gpu = h100();
        let mut f = synthetic(&gpu, 0.62, 7.5, 0.71);
        assert!(gpu.efficiency.memory < 0.9, "{}", gpu.efficiency.memory);
        let g = f.ops[1].gemm.as_mut().unwrap();
        g.bytes = 0.55 * g.kernel_s[0] * gpu.hbm_gbs * 1e9 * gpu.efficiency.memory;
        let fit = fit_ops(&f, &gpu, "ops.json").unwrap();
        assert_eq!(fit.gemm_rows, 12);
        assert!(fit.notes.iter().any(|n| n.starts_with("3 GEMM kernel(s) left out")), "{:?}", fit.notes);
        // A memory op with no forward time is left out of the HBM fit, not divided by.
        let mut f = synthetic(&gpu, 0.62, 7.5, 0.71);
        f.ops[5].memory.as_mut().unwrap().run_fwd_s = 0.0;
        let fit = fit_ops(&f, &gpu, "ops.json").unwrap();
        assert_eq!(fit.memory_rows, 2);
        assert!((fit.efficiency.memory - 0.71).abs() < 1e-9, "{:?}", fit.params);
    }

    /// GEMMs of two sizes fit the size at half efficiency; GEMMs of several sizes all far
    /// past it (whose times cannot see it) leave it near its value.
    #[test]
    fn two_sizes_fit_the_size_at_half_efficiency_and_large_gemms_keep_it() {
        let gpu = h100();
        let keep = |f: &OpsFile, names: &[&str]| OpsFile { ops: f.ops.iter().filter(|o| names.contains(&o.name.as_str()) || o.memory.is_some()).cloned().collect(), ..f.clone() };
        let f = fit_ops(&keep(&synthetic(&gpu, 0.62, 7.5, 0.7), &["g1", "g2"]), &gpu, "ops.json").unwrap();
        assert!(f.params.iter().any(|p| p.0 == "gemm_half_gflop"), "{:?}", f.params);
        // The pull towards the table's 2.46 leaves it at 7.36.
        assert!((f.efficiency.gemm_half_gflop - 7.5).abs() < 0.3, "{:?}", f.params);
        // GEMMs of 137 and 962 GFLOP a call, timed 2 % slow and 2 % fast: their ratio
        // alone would put the size near 10 GFLOP; the pull towards the prior holds it.
        let h0 = gpu.efficiency.gemm_half_gflop;
        let mut f = keep(&synthetic(&gpu, 0.62, h0, 0.7), &["g0", "g2"]);
        for (op, by) in f.ops.iter_mut().take(2).zip([1.02, 0.98]) {
            let g = op.gemm.as_mut().unwrap();
            g.kernel_s = g.kernel_s.map(|t| t * by);
            (op.fwd_s, op.bwd_s) = (op.fwd_s * by, op.bwd_s * by);
        }
        let fit = fit_ops(&f, &gpu, "ops.json").unwrap();
        assert!((fit.efficiency.gemm_half_gflop / h0 - 1.0).abs() < 0.1, "{h0}: {:?}", fit.params);
    }
}
