//! `runner train`: a real small model trained on real text under a precision policy
//! plugin, to see what the policy does to the loss.
//!
//! The workload plugin gives the graph (llama3-tiny by default), the precision plugin
//! the plan of every GEMM site; the executor runs each linear's three GEMMs with
//! operands quantised as planned. After each step the policy's `on-step` receives what
//! the step's numerics were (per site and operand: amax, scale, saturation and underflow
//! rates, non-finite flags; per layer: gradient norms and non-finite flags; the loss and
//! the gradient norm) and its actions are carried out (`train/plan.rs`): skip the
//! step, roll back to the last known-good checkpoint and skip batches, fall back layers
//! or everything to BF16, change a recipe, re-promote, reset amax histories, abort.
//! Faults can be injected (`--inject`) to see the rules act. `--compare` runs several
//! policies on the same text, seed and batches and reports the loss gap at equal tokens
//! and each one's effective FP8 coverage.
//!
//! On the CPU, low-precision GEMMs are emulated (operands quantised and dequantised,
//! then an f32 GEMM): the numerics are those of the hardware, the speed is not.

pub mod corpus;
pub mod plan;
pub mod report;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use runner_contract::text::number;
use runner_exec::select::{Chosen, choose};
use runner_exec::executor::ADAMW_DEFAULT;
use runner_exec::precision::{Fault, FaultKind, GemmRole as XRole, Operand as XOperand};
use runner_exec::executor::{MUON_DEFAULT, Muon, MuonTpMode, Optimizer};
use runner_exec::{AdamW, Device, ExecOptions, Executor, Input};
use runner_graph::{Graph, TensorKind};

use crate::plugin::precision::{
    self as pp, GemmRole, GemmSite, LayerMetrics, Operand, OperandMetrics, PlanRequest, SiteMetrics, StepMetrics,
};
use crate::plugin::workload::GraphRequest;
use crate::plugin::{self, Kind, Limits, PluginInfo};
use corpus::Bpe;
use plan::{Decision, PlanState};

/// What fault to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum InjectKind {
    /// The largest input element of every linear of one layer (the middle low-precision
    /// one by default) multiplied by 2^16 before it is quantised, in the forward and the
    /// weight-gradient GEMMs: an outlier a delayed scale carries for its history's length.
    AmaxSpike,
    /// One element of that activation set to NaN.
    Nan,
    /// Every weight gradient multiplied by 10^4 before the policy sees the step.
    GradSpike,
    /// The step's batch replaced by uniformly random tokens (corrupted data): a loss
    /// spike with healthy numerics, the case for rolling back and skipping batches.
    BadBatch,
}

impl InjectKind {
    const ALL: [InjectKind; 4] = [InjectKind::AmaxSpike, InjectKind::Nan, InjectKind::GradSpike, InjectKind::BadBatch];

    /// As `--inject` spells it.
    pub fn name(self) -> &'static str {
        match self {
            InjectKind::AmaxSpike => "amax-spike",
            InjectKind::Nan => "nan",
            InjectKind::GradSpike => "grad-spike",
            InjectKind::BadBatch => "bad-batch",
        }
    }

    /// In words, for the report's notes (`{:?}` printed "Nan").
    pub fn label(self) -> &'static str {
        match self {
            InjectKind::AmaxSpike => "amax spike",
            InjectKind::Nan => "NaN",
            InjectKind::GradSpike => "gradient spike",
            InjectKind::BadBatch => "bad batch",
        }
    }
}

/// `--inject KIND@STEP[:SITE]`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Injection {
    pub kind: InjectKind,
    /// The optimizer step it hits (the step about to be taken).
    pub step: u64,
    /// The linear op for amax-spike (its layer) and nan (default: the middle
    /// low-precision layer's `mlp.down`); `all` for amax-spike: every low-precision layer.
    pub site: Option<String>,
}

impl Injection {
    /// Parse `amax-spike@150`, `nan@200:layers.2.mlp.up`, `grad-spike@100`.
    ///
    /// # Errors
    /// Names the accepted forms.
    pub fn parse(s: &str) -> Result<Injection, String> {
        let usage = "use KIND@STEP[:SITE] with KIND amax-spike, nan, grad-spike or bad-batch (e.g. amax-spike@150)";
        let (kind, rest) = s.split_once('@').ok_or_else(|| format!("--inject '{s}': {usage}"))?;
        let Some(kind) = InjectKind::ALL.into_iter().find(|k| k.name() == kind) else {
            return Err(format!("--inject '{s}': unknown fault '{kind}'; {usage}"));
        };
        let (step, site) = match rest.split_once(':') {
            Some((st, site)) => (st, Some(site.to_string())),
            None => (rest, None),
        };
        let step = step.parse().map_err(|_| format!("--inject '{s}': '{step}' is not a step number; {usage}"))?;
        if site.is_some() && matches!(kind, InjectKind::GradSpike | InjectKind::BadBatch) {
            return Err(format!(
                "--inject '{s}': {} takes no site (it hits {}); sites are for amax-spike and nan",
                kind.name(),
                if kind == InjectKind::GradSpike { "every weight gradient" } else { "the whole batch" }
            ));
        }
        Ok(Injection { kind, step, site })
    }
}

/// The defaults of a training run: [`TrainConfig::new`]'s, and the flags' of `runner
/// train` (which name these, so the two cannot drift apart).
pub mod defaults {
    pub const MODEL: &str = "llama3.wasm";
    pub const STEPS: u64 = 300;
    pub const SEED: u64 = 0;
    pub const SEQ_LEN: u32 = 128;
    pub const MICRO_BATCH: u32 = 8;
    /// 0: the variant's.
    pub const LAYERS: u32 = 0;
    /// 0: a tenth of the steps.
    pub const EVAL_EVERY: u64 = 0;
    pub const EVAL_BATCHES: usize = 8;
    /// `cpu` emulates every format.
    pub const PLAN_FOR: &str = "cpu";
    pub const MAX_BF16_SHARE: f64 = 0.5;
    pub const CHECKPOINT_EVERY: u64 = 25;
    /// 0: off.
    pub const CLIP_GRAD: f64 = 0.0;
}

/// A training run (or a comparison of policies).
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Workload plugin spec.
    pub model: String,
    /// Variant (default: the plugin's first whose name ends in `-tiny`, else its first).
    pub variant: Option<String>,
    /// Precision plugin specs (`fp8-safe.wasm`, `fp8-safe`, a path): one run each.
    pub policies: Vec<String>,
    pub steps: u64,
    pub seed: u64,
    pub seq_len: u32,
    pub micro_batch: u32,
    /// Transformer layers (0: the variant's).
    pub layers: u32,
    /// Peak learning rate (default: the variant's).
    pub lr: Option<f64>,
    /// AdamW's decoupled weight decay, 0..=1 (default: the variant's); Muon's too.
    pub weight_decay: Option<f64>,
    /// `adamw` or `muon` (default: the plugin's `defaults.optimizer` when it names one of
    /// them, else AdamW).
    pub optimizer: Option<String>,
    /// Muon's tensor-parallel mode, `exact` or `blockwise` (`--muon-tp-mode`; default
    /// exact); refused unless the run trains with Muon. `runner train` runs on one
    /// device, where every matrix is whole and the two give the same update.
    pub muon_tp_mode: Option<String>,
    /// Evaluate on the held-out text every this many steps (and at the end).
    pub eval_every: u64,
    /// Batches in each held-out loss.
    pub eval_batches: usize,
    /// A UTF-8 text file instead of the shipped King James Bible.
    pub text: Option<PathBuf>,
    /// The device the plan is made for (default `cpu`, which emulates every format;
    /// [`crate::project::plan_for`] gives a GPU's from its profile).
    pub plan_for: pp::DeviceCapabilities,
    pub injections: Vec<Injection>,
    pub max_bf16_share: f64,
    pub checkpoint_every: u64,
    /// Clip the global gradient norm to this (0: off).
    pub clip_grad: f64,
    pub limits: Limits,
}

impl TrainConfig {
    /// Defaults for `model` and `policies`.
    pub fn new(model: &str, policies: Vec<String>) -> TrainConfig {
        TrainConfig {
            model: model.into(),
            variant: None,
            policies,
            steps: defaults::STEPS,
            seed: defaults::SEED,
            seq_len: defaults::SEQ_LEN,
            micro_batch: defaults::MICRO_BATCH,
            layers: defaults::LAYERS,
            lr: None,
            weight_decay: None,
            optimizer: None,
            muon_tp_mode: None,
            eval_every: defaults::EVAL_EVERY,
            eval_batches: defaults::EVAL_BATCHES,
            text: None,
            plan_for: pp::device_capabilities(defaults::PLAN_FOR),
            injections: Vec::new(),
            max_bf16_share: defaults::MAX_BF16_SHARE,
            checkpoint_every: defaults::CHECKPOINT_EVERY,
            clip_grad: defaults::CLIP_GRAD,
            limits: Limits::default(),
        }
    }
}

/// One point of a loss curve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Point {
    /// Optimizer steps applied.
    pub step: u64,
    /// Tokens trained (applied steps x tokens per step).
    pub tokens: u64,
    pub loss: f64,
    /// A training point's learning rate: the schedule's at its applied step, the one the
    /// update took (a skipped or rolled-back iteration's, the one it would have taken; JSON
    /// `learning_rate`). Absent on held-out points.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learning_rate: Option<f64>,
}

/// One policy's run.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    /// The spec asked for and the policy's own name.
    pub policy: String,
    pub description: String,
    pub plugin: PluginInfo,
    /// Training loss of every iteration that ran a forward (x = tokens trained before it).
    pub train: Vec<Point>,
    /// Held-out loss.
    pub eval: Vec<Point>,
    /// Mean training loss over the last tenth of the applied steps.
    pub final_train_loss: f64,
    pub final_eval_loss: f64,
    pub steps: u64,
    pub iterations: u64,
    pub skipped: u64,
    pub rollbacks: u64,
    /// Share of GEMM FLOPs in low precision, as planned and averaged over the steps run.
    pub planned_coverage: f64,
    pub effective_coverage: f64,
    /// Tokens of a step over [`RunResult::median_step_seconds`].
    pub tokens_per_s: f64,
    /// The median optimizer step's wall time (forward, backward, policy, optimizer; the
    /// held-out evaluations not included).
    pub median_step_seconds: f64,
    /// The whole run's wall time, evaluations included.
    pub seconds: f64,
    pub decisions: Vec<Decision>,
    /// Why the run stopped early, if it did (`abort`, a non-finite loss that never
    /// recovered is not a stop: the run goes on and the curve shows it).
    pub aborted: Option<String>,
    /// GEMMs that ran on FP8 codes (the device's FP8 GEMMs: the native route), and of
    /// their operands those cast by the norm or activation that produced them; 0 where
    /// every low-precision GEMM was emulated (the CPU, or a shape the route refuses).
    pub native_fp8_gemms: u64,
    pub fused_fp8_casts: u64,
}

/// The gap of one run to the baseline at equal tokens.
#[derive(Clone, Debug, Serialize)]
pub struct Gap {
    pub policy: String,
    pub baseline: String,
    /// (final eval loss - baseline's) / baseline's.
    pub eval_gap: f64,
    pub train_gap: f64,
    /// Tokens at which the two were compared: the planned run's, or where either stopped
    /// early, those of the last evaluation both reached (`gaps`).
    pub tokens: u64,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct TrainReport {
    pub model: String,
    pub variant: String,
    /// The optimizer every run trained with (`adamw`, or `muon`: Muon on the hidden
    /// matrices, AdamW on the rest).
    pub optimizer: String,
    /// Under Muon, its tensor-parallel mode (`exact` or `blockwise`); absent under AdamW.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub muon_tp_mode: Option<String>,
    pub device: String,
    pub plan_for: String,
    pub text: String,
    pub text_bytes: usize,
    pub vocab: usize,
    pub bytes_per_token: f64,
    pub train_tokens: usize,
    pub eval_tokens: usize,
    pub tokens_per_step: u64,
    pub seed: u64,
    pub steps: u64,
    pub injections: Vec<Injection>,
    pub runs: Vec<RunResult>,
    pub gaps: Vec<Gap>,
    pub notes: Vec<String>,
}

/// The token stream, split into training and held-out parts.
struct Data {
    train: Vec<u32>,
    eval: Vec<u32>,
    seq: usize,
    batch: usize,
    /// Window starts of the training stream in the seed's order.
    order: Vec<usize>,
}

impl Data {
    fn new(tokens: Vec<u32>, seq: usize, batch: usize, seed: u64) -> Result<Data> {
        let eval_len = (tokens.len() / 50).max((seq + 1) * batch * 2);
        if tokens.len() < eval_len + (seq + 1) * batch * 4 {
            // Two batches of windows held out for evaluation and four to train on: 6 x
            // (seq + 1) x batch at the least (the evaluation share is 1/50 of longer texts).
            bail!(
                "the text has {} tokens, too few for batches of {batch} x {seq}: it needs at least {} (six batches of \
                 {batch} windows of {} tokens: two held out for evaluation, four to train on); give a longer --text, or a \
                 smaller --micro-batch or --seq-len",
                tokens.len(),
                6 * (seq + 1) * batch,
                seq + 1
            );
        }
        let split = tokens.len() - eval_len;
        let (train, eval) = (tokens[..split].to_vec(), tokens[split..].to_vec());
        let windows = (train.len() - 1) / seq;
        let mut order: Vec<usize> = (0..windows).map(|w| w * seq).collect();
        let mut rng = Rng(seed ^ 0x5EED_DA7A);
        for i in (1..order.len()).rev() {
            order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        Ok(Data { train, eval, seq, batch, order })
    }

    /// Batch `b` of the training stream (wrapping over the shuffled windows).
    fn batch(&self, b: u64) -> (Vec<u32>, Vec<u32>) {
        let mut tokens = Vec::with_capacity(self.seq * self.batch);
        let mut targets = Vec::with_capacity(self.seq * self.batch);
        for j in 0..self.batch {
            let w = self.order[((b as usize) * self.batch + j) % self.order.len()];
            tokens.extend_from_slice(&self.train[w..w + self.seq]);
            targets.extend_from_slice(&self.train[w + 1..w + 1 + self.seq]);
        }
        (tokens, targets)
    }

    /// Held-out batch `b` (consecutive windows).
    fn eval_batch(&self, b: usize) -> (Vec<u32>, Vec<u32>) {
        let per = self.seq * self.batch;
        let start = (b * per) % (self.eval.len() - per - 1).max(1);
        let tokens = self.eval[start..start + per].to_vec();
        let targets = self.eval[start + 1..start + 1 + per].to_vec();
        (tokens, targets)
    }
}

/// SplitMix64 (batch order).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// A policy spec as a plugin spec: `fp8-safe` -> `fp8-safe.wasm`.
pub fn policy_spec(s: &str) -> String {
    if s.ends_with(".wasm") || s.contains('/') { s.to_string() } else { format!("{s}.wasm") }
}

/// What [`run`] reports as it goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Progress<'a> {
    /// A stage of the setup, or a policy's run beginning.
    Stage(&'a str),
    /// Training step `step` (from 1, again after a rollback or a skipped update) of
    /// `steps` begins; `last` is where the run stands. Said as the step begins, so a
    /// caller can show a long one running (a bar's clock, a log's seconds so far).
    Step { step: u64, steps: u64, last: &'a str },
}

/// Run the training(s).
///
/// # Errors
/// Plugins that cannot be loaded or plan, a plan the executor or the host's guardrails
/// refuse (named), a text too short, an executor error.
pub fn run(cfg: &TrainConfig, progress: &dyn Fn(Progress<'_>)) -> Result<TrainReport> {
    if cfg.policies.is_empty() {
        bail!("no precision policy: give --precision or --compare");
    }
    if cfg.steps == 0 || cfg.steps > 1_000_000 {
        bail!("--steps {}: use 1..=1000000", cfg.steps);
    }
    if cfg.seq_len == 0 || cfg.micro_batch == 0 || u64::from(cfg.seq_len) * u64::from(cfg.micro_batch) > 1 << 20 {
        bail!("--seq-len x --micro-batch {} x {}: each at least 1, at most 2^20 tokens a step", cfg.seq_len, cfg.micro_batch);
    }
    if cfg.eval_batches == 0 || cfg.eval_batches > 10_000 {
        bail!("--eval-batches {}: use 1..=10000", cfg.eval_batches);
    }
    if !(0.0..=1.0).contains(&cfg.max_bf16_share) {
        bail!("--max-bf16-share {}: a fraction in 0..=1", number(cfg.max_bf16_share));
    }
    if let Some(lr) = cfg.lr
        && !runner_contract::limits::LEARNING_RATE.contains(&lr)
    {
        bail!("--lr {}: a peak learning rate is from 1e-8 to 10 (leave it out for the variant's)", number(lr));
    }
    if let Some(wd) = cfg.weight_decay
        && !runner_contract::limits::WEIGHT_DECAY.contains(&wd)
    {
        bail!("--weight-decay {}: AdamW's decoupled weight decay is from 0 to 1 (leave it out for the variant's)", number(wd));
    }
    // --muon-tp-mode's name, and beside an --optimizer other than muon, refused before
    // the plugin loads (the plugin's optimizer, where none is given, once it is read).
    let given = cfg.optimizer.as_deref().map(optimizer_flag).transpose()?;
    with_muon_tp_mode(given.unwrap_or(Optimizer::Muon(MUON_DEFAULT)), cfg.muon_tp_mode.as_deref())?;
    if !(cfg.clip_grad.is_finite() && cfg.clip_grad >= 0.0) {
        bail!("--clip-grad {}: a gradient norm of 0 (off) or more", number(cfg.clip_grad));
    }
    // A fault past the last step would never fire, and the run would read as clean.
    if let Some(i) = cfg.injections.iter().find(|i| i.step >= cfg.steps) {
        bail!("--inject at step {} would never fire: the run takes steps 0 to {}; give a step below --steps", i.step, cfg.steps - 1);
    }
    // The same fault twice is one fault (it fires once), so the report would list one
    // more than the run had.
    for (n, i) in cfg.injections.iter().enumerate() {
        if cfg.injections[..n].contains(i) {
            bail!("--inject gives {}@{} twice; give each fault once", i.kind.name(), i.step);
        }
    }
    progress(Progress::Stage(&format!("loading {}", cfg.model)));
    let wp = plugin::load(&cfg.model)?;
    let mut workload = wp.workload(cfg.limits)?;
    let info = workload.describe()?;
    let variant = match &cfg.variant {
        Some(v) => info.variants.iter().find(|x| &x.name == v).ok_or_else(|| {
            let names: Vec<&str> = info.variants.iter().map(|v| v.name.as_str()).collect();
            anyhow::anyhow!("{} has no variant '{v}'; it provides: {}", wp.info.name, names.join(", "))
        })?,
        None => info.variants.iter().find(|v| v.name.ends_with("-tiny")).unwrap_or(&info.variants[0]),
    }
    .clone();
    let graph = workload
        .graph(&GraphRequest::training(&variant.name, cfg.seq_len, cfg.micro_batch, cfg.layers))
        .with_context(|| format!("building the {} graph", variant.name))?;
    let params: u64 = graph.tensors.iter().filter(|t| t.kind == TensorKind::Weight).map(|t| t.numel()).sum();
    if params > 200_000_000 {
        bail!(
            "{} has {:.1}B parameters in this graph; `runner train` trains small models on the CPU (use a -tiny variant or --layers)",
            variant.name,
            params as f64 / 1e9
        );
    }
    let (optimizer, unknown) = choose_optimizer(cfg.optimizer.as_deref(), &variant.defaults.optimizer)?;
    let optimizer = with_muon_tp_mode(optimizer, cfg.muon_tp_mode.as_deref())?;
    let vocab = graph.tensor_id("embed.weight").map_or(variant.hyper.vocab as usize, |id| graph.tensors[id].shape[0] as usize);

    let (text_name, text) = match &cfg.text {
        Some(p) => (p.display().to_string(), crate::input::read_text(p, "--text file", crate::input::CORPUS_LIMIT).map_err(anyhow::Error::msg)?),
        None => ("King James Bible (workloads/text/kjv.txt, public domain)".to_string(), corpus::KJV.to_string()),
    };
    progress(Progress::Stage(&format!("learning a {vocab}-token BPE on {} bytes of text", text.len())));
    let bpe = Bpe::learn(&text, vocab);
    let tokens = bpe.encode(&text);
    let bytes_per_token = text.len() as f64 / tokens.len().max(1) as f64;
    let data = Data::new(tokens, cfg.seq_len as usize, cfg.micro_batch as usize, cfg.seed)?;

    // `--device`: on a GPU, per-tensor FP8 linears and expert linears run on its FP8
    // GEMMs (the executor's native route); the CPU emulates every format.
    let chosen = choose(crate::local_device::requested())?;
    let device_name = chosen.name();
    let mut runs = Vec::new();
    for spec in &cfg.policies {
        progress(Progress::Stage(&format!("training under {spec} on {device_name}")));
        let spec_path = policy_spec(spec);
        let r = match &chosen {
            Chosen::Cpu(cpu, _) => train_one(cfg, &graph, &variant, &data, &spec_path, optimizer, cpu, progress),
            #[cfg(feature = "cuda")]
            Chosen::Cuda(gpu) => train_one(cfg, &graph, &variant, &data, &spec_path, optimizer, gpu, progress),
        };
        runs.push(r.with_context(|| format!("policy {spec}"))?);
    }
    let gaps = gaps(&runs, cfg.steps, u64::from(cfg.seq_len) * u64::from(cfg.micro_batch));
    let how = match &chosen {
        Chosen::Cpu(_, why) => format!(
            "the CPU{}: low-precision GEMMs are emulated (operands quantised and dequantised exactly as the format \
             stores them, then an f32 GEMM with f32 accumulation), so FP8 and FP4 give the hardware's numerics but not \
             its speed: their tokens/s here time the emulation (BF16 is rounded in software too), not the 1.3-1.6x \
             of Hopper and Blackwell tensor cores",
            why.as_ref().map(|w| format!(" ({w})")).unwrap_or_default()
        ),
        #[cfg(feature = "cuda")]
        Chosen::Cuda(_) => format!(
            "{device_name}: per-tensor FP8 linears run on its FP8 GEMMs (cuBLASLt, operands as FP8 codes with their \
             scales); block-scaled formats (MXFP8, NVFP4, 1x128 blocks) and MoE expert linears are emulated as on the CPU"
        ),
    };
    let notes = vec![
        format!(
            "the {} graph ({}, {:.1}M parameters) trained on {how}",
            variant.name,
            crate::report::plural(graph.ops.iter().map(|o| o.layer).max().unwrap_or(-1) + 1, "layer"),
            params as f64 / 1e6
        ),
        format!(
            "{}{} (beta2 {}, weight decay {}{}), linear warm-up then cosine decay to a tenth, peak lr {}; gradient clipping {}",
            match optimizer {
                Optimizer::AdamW => "AdamW".to_string(),
                Optimizer::Muon(m) => format!(
                    "Muon on the hidden matrices (momentum {}, Nesterov, {} Newton-Schulz steps, update scaled by 0.2 sqrt(max(m, n)) as Moonlight's; the same lr and weight decay; \
                     tensor-parallel mode {}, the same update here: one device holds every matrix whole), \
                     AdamW on the embedding, output head, norms and biases",
                    m.momentum,
                    m.ns_steps,
                    m.tp_mode.name()
                ),
            },
            // The plugin's optimizer names its recipe's; this trainer has AdamW and Muon.
            match unknown {
                Some(named) => format!(" (the plugin names {}, which `runner train` does not implement)", crate::report::visible(&named)),
                None => String::new(),
            },
            ADAMW_DEFAULT.beta2,
            weight_decay(cfg.weight_decay, &variant.defaults),
            if cfg.weight_decay.is_some() { "" } else { ", the plugin's" },
            peak_lr(cfg.lr, variant.defaults.learning_rate),
            if cfg.clip_grad > 0.0 { format!("at norm {}", cfg.clip_grad) } else { "off".into() }
        ),
        format!(
            "held-out loss over {} batches of the last {} tokens; every run reads the same batches in the same order (seed {})",
            cfg.eval_batches,
            data.eval.len(),
            cfg.seed
        ),
    ];
    Ok(TrainReport {
        model: wp.info.name.clone(),
        variant: variant.name.clone(),
        optimizer: optimizer.name().into(),
        muon_tp_mode: optimizer.muon_tp_mode().map(|m| m.name().into()),
        device: device_name,
        plan_for: cfg.plan_for.name.clone(),
        text: text_name,
        text_bytes: text.len(),
        vocab: bpe.vocab(),
        bytes_per_token,
        train_tokens: data.train.len(),
        eval_tokens: data.eval.len(),
        tokens_per_step: u64::from(cfg.seq_len) * u64::from(cfg.micro_batch),
        seed: cfg.seed,
        steps: cfg.steps,
        injections: cfg.injections.clone(),
        runs,
        gaps,
        notes,
    })
}

/// Each run's gap to the baseline (the first BF16 run, else the first) at equal tokens.
/// Where both ran every step, their final losses. Where one stopped early, the held-out
/// losses of the last evaluation both reached, and the mean training loss of the tenth of
/// the steps before it: a run stopped at step 57 of 300 was compared with the baseline's
/// loss at step 300 (and called equal tokens). Nothing trained by then (step 0): NaN.
pub(crate) fn gaps(runs: &[RunResult], steps: u64, tokens_per_step: u64) -> Vec<Gap> {
    let base = runs.iter().position(|r| r.policy.starts_with("bf16")).unwrap_or(0);
    let Some(b) = runs.get(base) else { return Vec::new() };
    let rel = |x: f64, of: f64| (x - of) / of;
    runs.iter()
        .enumerate()
        .filter(|(i, _)| *i != base)
        .map(|(_, r)| {
            let (eval_gap, train_gap, at) = if r.steps == steps && b.steps == steps {
                (rel(r.final_eval_loss, b.final_eval_loss), rel(r.final_train_loss, b.final_train_loss), steps)
            } else {
                let last = |run: &RunResult| run.eval.last().map_or(0, |p| p.step);
                let at = last(r).min(last(b));
                // The last evaluation at that step: one before a rollback was undone with it.
                let eval_at = |run: &RunResult| run.eval.iter().rev().find(|p| p.step == at).map_or(f64::NAN, |p| p.loss);
                let eval_gap = if at == 0 { f64::NAN } else { rel(eval_at(r), eval_at(b)) };
                (eval_gap, rel(train_loss_to(r, at), train_loss_to(b, at)), at)
            };
            Gap { policy: r.policy.clone(), baseline: b.policy.clone(), eval_gap, train_gap, tokens: at * tokens_per_step }
        })
        .collect()
}

/// The mean training loss over the last tenth (at least one) of the steps applied before
/// step `n`, as [`RunResult::final_train_loss`] is over the whole run: the applied
/// iteration of each step is the curve's last point at that step (a skipped one, or one
/// undone by a rollback, came before it). NaN for `n` 0.
fn train_loss_to(run: &RunResult, n: u64) -> f64 {
    let tail = (n / 10).max(1);
    let applied: Vec<f64> = (n.saturating_sub(tail)..n).filter_map(|k| run.train.iter().rev().find(|p| p.step == k).map(|p| p.loss)).collect();
    if applied.is_empty() { f64::NAN } else { applied.iter().sum::<f64>() / applied.len() as f64 }
}

/// [`RunResult::final_train_loss`]: the mean loss of the last tenth (at least one) of the
/// applied steps, in the order applied; NaN when no step was applied (it read 0 from an
/// empty curve).
fn final_train_loss(applied: &[f64]) -> f64 {
    let tail = (applied.len() / 10).max(1);
    if applied.is_empty() { f64::NAN } else { applied.iter().rev().take(tail).sum::<f64>() / tail as f64 }
}

/// Transformer layers of the graph trained, as a plan request names them (a policy keeps
/// the first or last N in BF16 by them): the variant's, or fewer with `--layers`. The
/// first plan and every replan ask with the same count.
fn plan_layers(asked: u32, variant: u32) -> u32 {
    if asked > 0 { variant.min(asked) } else { variant }
}

/// `--lr`, else the variant's default, else (a variant that gives none: 0) 1e-3.
fn peak_lr(lr: Option<f64>, variant_lr: f64) -> f64 {
    lr.unwrap_or(if variant_lr > 0.0 { variant_lr } else { 1e-3 })
}

/// The weight decay a run applies: `--weight-decay`, else the plugin's (its recipe's,
/// 0.1 for Llama 3).
fn weight_decay(given: Option<f64>, defaults: &crate::plugin::workload::TrainingDefaults) -> f64 {
    given.unwrap_or(defaults.weight_decay)
}

/// The optimizer `--optimizer` or a plugin's `defaults.optimizer` names, read by the
/// projection's rule (`adamw`, `muon`, Megatron's `dist_muon`; any case), so the trainer
/// and the projection take the same names.
fn optimizer_named(s: &str) -> Result<Optimizer, String> {
    Ok(match runner_project::step::Optimizer::parse(s)? {
        runner_project::step::Optimizer::AdamW => Optimizer::AdamW,
        runner_project::step::Optimizer::Muon => Optimizer::Muon(MUON_DEFAULT),
    })
}

/// The optimizer an `--optimizer NAME` flag names ([`optimizer_named`]), or the error
/// that names the flag; `runner train`, `bench step` and `bench layer` read it alike.
pub fn optimizer_flag(name: &str) -> anyhow::Result<Optimizer> {
    optimizer_named(name).map_err(|why| anyhow::anyhow!("--optimizer {}: {why}", crate::report::visible(name)))
}

/// `optimizer` with `--muon-tp-mode MODE` (`exact` or `blockwise`, any case) where one is
/// given: Muon's tensor-parallel mode, so refused unless `optimizer` is Muon.
/// `runner train` and `bench step` read it alike.
pub fn with_muon_tp_mode(optimizer: Optimizer, mode: Option<&str>) -> anyhow::Result<Optimizer> {
    let Some(mode) = mode else { return Ok(optimizer) };
    let tp_mode = MuonTpMode::parse(mode).map_err(|why| anyhow::anyhow!("--muon-tp-mode {}: {why}", crate::report::visible(mode)))?;
    match optimizer {
        Optimizer::Muon(m) => Ok(Optimizer::Muon(Muon { tp_mode, ..m })),
        Optimizer::AdamW => anyhow::bail!(
            "--muon-tp-mode {}: it sets how Muon orthogonalises tensor-parallel blocks, and this run's optimizer is adamw; give --optimizer muon with it, or leave it out",
            tp_mode.name()
        ),
    }
}

/// The optimizer of a run: `--optimizer`'s, else the plugin's when `runner train` has
/// it, else AdamW, with the plugin's name it does not implement (for the note).
fn choose_optimizer(given: Option<&str>, plugin: &str) -> Result<(Optimizer, Option<String>)> {
    match given {
        Some(o) => Ok((optimizer_flag(o)?, None)),
        None => Ok(optimizer_named(plugin).map_or((Optimizer::AdamW, Some(plugin.to_string())), |o| (o, None))),
    }
}

/// The optimizer step at learning rate `lr`: AdamW with weight decay `wd` and the
/// runner's betas and epsilon (Muon's matrices read the same learning rate and decay).
fn adamw(lr: f64, wd: f64) -> AdamW {
    AdamW { lr: lr as f32, weight_decay: wd as f32, ..ADAMW_DEFAULT }
}

/// Learning rate at applied step `t` of `n`: linear warm-up over a tenth (at most 100
/// steps), cosine decay to a tenth of the peak.
fn lr_at(peak: f64, t: u64, n: u64) -> f64 {
    let warm = (n / 10).clamp(1, 100);
    if t < warm {
        return peak * (t + 1) as f64 / warm as f64;
    }
    let p = (t - warm) as f64 / (n - warm).max(1) as f64;
    peak * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * p.min(1.0)).cos()))
}

/// Layer of each weight: the layer of the first op that reads it.
fn weight_layers(g: &Graph) -> Vec<(String, i32)> {
    g.tensors
        .iter()
        .enumerate()
        .filter(|(_, t)| t.kind == TensorKind::Weight)
        .map(|(id, t)| (t.name.clone(), g.ops.iter().find(|o| o.inputs.contains(&id)).map_or(-1, |o| o.layer)))
        .collect()
}

/// The fault's default site: the forward of `mlp.down` in the middle transformer layer
/// the plan runs in low precision (else the middle layer).
fn default_site(sites: &[GemmSite], plans: &[pp::SitePlan]) -> Option<String> {
    let mut low: Vec<i32> = sites.iter().zip(plans).filter(|(s, p)| plan::low_precision(s, p)).map(|(s, _)| s.layer).collect();
    low.dedup();
    let layers: Vec<i32> = if low.is_empty() { sites.iter().map(|s| s.layer).filter(|l| *l >= 0).collect() } else { low };
    let l = *layers.get(layers.len() / 2)?;
    sites
        .iter()
        .find(|s| s.layer == l && s.name.ends_with("mlp.down"))
        .or_else(|| sites.iter().find(|s| s.layer == l))
        .map(|s| s.name.clone())
}

fn xrole(r: GemmRole) -> XRole {
    match r {
        GemmRole::Forward => XRole::Forward,
        GemmRole::InputGradient => XRole::InputGradient,
        GemmRole::WeightGradient => XRole::WeightGradient,
    }
}

/// A plan the host refuses (`plan::known_bad`), named by its plugin: the first plan, or
/// a replan the policy asked for at `step` (which said only the site).
fn bad_plan(plugin: &str, replan_at: Option<u64>, why: &str) -> anyhow::Error {
    match replan_at {
        None => anyhow::anyhow!("{plugin}: {why}"),
        Some(step) => anyhow::anyhow!("{plugin}, replanning at step {step}: {why}"),
    }
}

/// Held-out loss: the mean over the eval batches, numerics discarded.
fn evaluate<D: Device>(ex: &mut Executor<D>, data: &Data, batches: usize) -> Result<f64> {
    let mut sum = 0.0;
    for b in 0..batches {
        let (tokens, targets) = data.eval_batch(b);
        sum += f64::from(ex.forward(&[("tokens", Input::U32(&tokens)), ("targets", Input::U32(&targets))])?);
    }
    ex.discard_precision_step();
    Ok(sum / batches as f64)
}

/// A known-good checkpoint (taken after a clean step).
struct Checkpoint {
    step: u64,
    snapshot: runner_exec::executor::Snapshot,
}

/// Checkpoints kept for rollbacks.
const KEEP: usize = 3;
/// Steps in a row the policy may skip or roll back before the run is called diverged: a
/// fault (an injected one, a bad batch) costs one or two; a learning rate the model cannot
/// take makes every step non-finite, and retrying to the iteration cap would take as long
/// as the run.
const REJECTED_IN_A_ROW: u64 = 10;
/// Rollbacks to one checkpoint before the run is called diverged there: redone steps take
/// fresh batches, so a transient fault does not bring the run back a third time.
const ROLLBACKS_TO_ONE_CHECKPOINT: usize = 3;

/// Why a run stopped when its precision policy (plugin `plugin`) rejected too many steps:
/// `what` it asked for, `diverged` the message that blames the learning rate, `finite`
/// whether every rejected step's loss and gradients were finite, `never_applied` whether
/// no update was ever applied. With finite numbers and the initial weights untouched the
/// learning rate cannot be the cause: the policy is named instead. With finite numbers
/// after some updates a spike (which a policy rightly rejects) and a rule that misfires
/// look alike, so both are said.
fn rejected_stop(plugin: &str, what: &str, diverged: String, finite: bool, never_applied: bool) -> String {
    let plugin = crate::report::visible(plugin);
    match (finite, never_applied) {
        (true, true) => format!(
            "the precision policy {plugin} {what} although their loss and gradients were finite and no update had been applied \
             (the learning rate is not the cause): its on-step rules fire on every step: fix the policy"
        ),
        (true, false) => format!(
            "{diverged}; the precision policy {plugin} {what} with finite loss and gradients: where the loss or gradient norm \
             did not spike, its on-step rules misfire: check them"
        ),
        _ => diverged,
    }
}

/// Steps rejected in a row after one more step: one more when it was skipped or rolled
/// back (`rejected`), else none.
fn rejected_after(in_a_row: u64, rejected: bool) -> u64 {
    if rejected { in_a_row + 1 } else { 0 }
}

/// A rollback of `back` steps that skips `skip` batches, asked at applied step `applied`
/// with batch `cursor` next: the checkpoint it returns to, as an index into `kept` (the
/// kept checkpoints' steps, oldest first), the newest at least `back - 1` steps old (none
/// where every one is newer); and the batch read next, `skip` past the cursor.
fn rollback_to(kept: &[u64], applied: u64, back: u32, skip: u32, cursor: u64) -> (Option<usize>, u64) {
    let target = applied.saturating_sub(u64::from(back).saturating_sub(1));
    (kept.iter().rposition(|&s| s <= target), cursor + u64::from(skip))
}

/// Clean steps in a row after an applied step: one more when the policy only alerted (or
/// said nothing) and the loss was finite, else none.
fn clean_after(clean_since: u64, actions: &[pp::Action], loss_finite: bool) -> u64 {
    let quiet = actions.iter().all(|a| matches!(a, pp::Action::Alert(_)));
    if quiet && loss_finite { clean_since + 1 } else { 0 }
}

/// Whether a checkpoint is taken after applied step `applied`: asked for
/// (`checkpoint-now`) or on the `every`-step interval, and known-good: after
/// `clean_since` clean steps, at least a fifth of the interval (at least one; the steps
/// applied, where fewer).
fn checkpoint_due(asked: bool, applied: u64, every: u64, clean_since: u64) -> bool {
    (asked || applied.is_multiple_of(every.max(1))) && clean_since >= (every / 5).max(1).min(applied)
}

/// `--clip-grad`: the factor the gradients are scaled by before the update, from their
/// sum of squares `sum_sq`: `clip` over the global norm where clipping is on (`clip` > 0)
/// and the norm exceeds it; `None` (left alone) otherwise.
fn clip_factor(sum_sq: f64, clip: f64) -> Option<f32> {
    let norm = sum_sq.sqrt();
    (clip > 0.0 && norm > clip).then(|| (clip / norm) as f32)
}

/// `bad-batch`: a batch's tokens and targets replaced by tokens drawn uniformly from
/// `vocab` with SplitMix64 from `seed`.
fn corrupt(tokens: &mut [u32], targets: &mut [u32], seed: u64, vocab: u64) {
    let mut rng = Rng(seed);
    for t in tokens.iter_mut().chain(targets.iter_mut()) {
        *t = (rng.next() % vocab) as u32;
    }
}

/// What the training loop asks of a precision policy: the plugin's three calls (a test
/// drives the loop with a scripted policy of its own through [`train_under`]).
trait Policy {
    fn name(&mut self) -> Result<String>;
    fn plan(&mut self, request: &PlanRequest) -> Result<pp::PlanResponse>;
    fn on_step(&mut self, metrics: &StepMetrics) -> Result<pp::StepResponse>;
}

impl Policy for pp::PrecisionPolicy {
    fn name(&mut self) -> Result<String> {
        Ok(pp::PrecisionPolicy::name(self)?)
    }
    fn plan(&mut self, request: &PlanRequest) -> Result<pp::PlanResponse> {
        Ok(pp::PrecisionPolicy::plan(self, request)?)
    }
    fn on_step(&mut self, metrics: &StepMetrics) -> Result<pp::StepResponse> {
        Ok(pp::PrecisionPolicy::on_step(self, metrics)?)
    }
}

#[allow(clippy::too_many_arguments)]
fn train_one<D: Device + Clone>(
    cfg: &TrainConfig,
    graph: &Graph,
    variant: &crate::plugin::workload::Variant,
    data: &Data,
    spec: &str,
    optimizer: Optimizer,
    dev: &D,
    progress: &dyn Fn(Progress<'_>),
) -> Result<RunResult> {
    let p = plugin::load(spec)?;
    if p.info.kind != Kind::Precision {
        bail!("{} is a {} plugin, not a precision policy", p.info.name, p.info.kind.name());
    }
    let mut policy = p.precision(cfg.limits)?;
    train_under(cfg, graph, variant, data, spec, &p.info, &mut policy, optimizer, dev, progress)
}

/// One run of the training loop under `policy` (the plugin `info` names).
#[allow(clippy::too_many_arguments)]
fn train_under<D: Device + Clone>(
    cfg: &TrainConfig,
    graph: &Graph,
    variant: &crate::plugin::workload::Variant,
    data: &Data,
    spec: &str,
    info: &PluginInfo,
    policy: &mut dyn Policy,
    optimizer: Optimizer,
    dev: &D,
    progress: &dyn Fn(Progress<'_>),
) -> Result<RunResult> {
    let description = policy.name()?;
    let indexed = crate::project::gemm_sites(graph);
    let ops: Vec<usize> = indexed.iter().map(|(o, _)| *o).collect();
    let sites: Vec<GemmSite> = indexed.into_iter().map(|(_, s)| s).collect();
    // A named site must be a GEMM of this graph, checked before the first step (a typo
    // found when the fault fires would cost the steps before it).
    for inj in &cfg.injections {
        if let Some(site) = inj.site.as_deref().filter(|s| *s != "all" || inj.kind != InjectKind::AmaxSpike)
            && !sites.iter().any(|s| s.name == site)
        {
            let mut names: Vec<&str> = sites.iter().map(|s| s.name.as_str()).collect();
            names.dedup();
            let shown = names.iter().take(8).copied().collect::<Vec<_>>().join(", ");
            bail!(
                "--inject site '{}' is not a GEMM of {}: its sites are {shown}{} (and `all` for amax-spike)",
                crate::report::visible(site),
                variant.name,
                if names.len() > 8 { format!(", ... ({} in all)", names.len()) } else { String::new() }
            );
        }
    }
    let device = cfg.plan_for.clone();
    let answer = policy.plan(&PlanRequest {
        model: variant.name.clone(),
        layers: plan_layers(cfg.layers, variant.hyper.layers),
        device,
        sites: sites.clone(),
        state: Vec::new(),
    })?;
    plan::known_bad(&sites, &answer.sites).map_err(|m| bad_plan(&info.name, None, &m))?;
    let mut state = answer.state;
    let mut plans = PlanState::new(sites.clone(), answer.sites, cfg.max_bf16_share);
    let planned_coverage = plan::coverage(&sites, &plans.current);

    let mut ex = Executor::new(graph, dev.clone(), ExecOptions { seed: cfg.seed, ..ExecOptions::default() })?;
    ex.set_optimizer(optimizer)?;
    let set = |ex: &mut Executor<D>, plans: &PlanState| -> Result<()> {
        let x = plan::executor_plan(&sites, &plans.current).map_err(anyhow::Error::msg)?;
        ex.set_precision(&x).map_err(anyhow::Error::from)
    };
    set(&mut ex, &plans)?;

    let layers = weight_layers(graph);
    let tokens_per_step = u64::from(cfg.seq_len) * u64::from(cfg.micro_batch);
    let peak = peak_lr(cfg.lr, variant.defaults.learning_rate);
    let eval_every = if cfg.eval_every > 0 { cfg.eval_every } else { (cfg.steps / 10).max(1) };
    let fault_site = default_site(&sites, &plans.current);

    let mut decisions: Vec<Decision> = Vec::new();
    let mut train = Vec::new();
    // The loss of each applied step, in order (`applied` of them): the final training
    // loss is theirs, not the skipped iterations' (whose loss may be NaN).
    let mut applied_losses: Vec<f64> = Vec::new();
    let mut eval = Vec::new();
    let (mut applied, mut iteration, mut cursor, mut skipped, mut rollbacks) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut coverage_sum = 0.0;
    let mut checkpoints: Vec<Checkpoint> = vec![Checkpoint { step: 0, snapshot: ex.snapshot()? }];
    let mut clean_since = 0u64;
    let mut fired: Vec<usize> = Vec::new();
    let mut aborted = None;
    let mut rejected_in_a_row = 0u64;
    // Whether every step of the current rejected streak had a finite loss and finite
    // gradients, and which actions rejected them: a streak the numbers do not explain is
    // the policy's doing, not divergence.
    let mut streak_finite = true;
    let mut streak_actions = (false, false);
    // Applied steps over the whole run (`applied` goes back with a rollback).
    let mut applied_ever = 0u64;
    // Each rollback's checkpoint, and whether its step's loss and gradients were finite.
    let mut rolled_back_to: Vec<(u64, bool)> = Vec::new();
    let started = Instant::now();
    let mut step_seconds = Vec::new();
    eval.push(Point { step: 0, tokens: 0, loss: evaluate(&mut ex, data, cfg.eval_batches)?, learning_rate: None });
    let mut last = format!("{spec}: held-out loss {:.4}", eval[0].loss);

    while applied < cfg.steps {
        progress(Progress::Step { step: applied + 1, steps: cfg.steps, last: &last });
        if iteration >= 3 * cfg.steps + 100 {
            aborted = Some(format!("stopped after {iteration} iterations with {applied} of {} steps applied", cfg.steps));
            break;
        }
        let t0 = Instant::now();
        let mut grad_spike = false;
        let mut bad_batch = false;
        for (i, inj) in cfg.injections.iter().enumerate() {
            if inj.step != applied || fired.contains(&i) {
                continue;
            }
            fired.push(i);
            let detail;
            match inj.kind {
                InjectKind::GradSpike => {
                    grad_spike = true;
                    detail = "every weight gradient x 1e4".to_string();
                }
                InjectKind::BadBatch => {
                    bad_batch = true;
                    detail = "the batch's tokens and targets replaced by random tokens".to_string();
                }
                InjectKind::Nan => {
                    let site = inj.site.clone().or_else(|| fault_site.clone()).context("no GEMM site to inject into")?;
                    ex.inject(Fault { op: site.clone(), role: XRole::Forward, operand: XOperand::Activation, kind: FaultKind::Nan })?;
                    detail = format!("{site} forward activation: one element NaN");
                }
                InjectKind::AmaxSpike => {
                    // An outlier in the inputs of every linear of the layer, as both GEMMs
                    // that read them (forward and weight gradient) see it.
                    // `:all`: every low-precision layer at once (an outlier the whole
                    // residual stream carries); default: the middle one.
                    let all = inj.site.as_deref() == Some("all");
                    let site = inj.site.clone().filter(|_| !all).or_else(|| fault_site.clone()).context("no GEMM site to inject into")?;
                    let layer = sites.iter().find(|s| s.name == site).map(|s| s.layer).context("unknown --inject site")?;
                    let hit_layer = |s: &GemmSite, i: usize| if all { plan::low_precision(s, &plans.current[i]) } else { s.layer == layer };
                    let mut hit = Vec::new();
                    for (_, s) in sites.iter().enumerate().filter(|(i, s)| hit_layer(s, *i) && s.role != GemmRole::InputGradient) {
                        let fault = Fault { op: s.name.clone(), role: xrole(s.role), operand: XOperand::Activation, kind: FaultKind::Outlier(65536.0) };
                        ex.inject(fault)?;
                        hit.push(s.name.clone());
                    }
                    hit.dedup();
                    let which = if all { "every low-precision layer".to_string() } else { runner_contract::precision::layer_name(layer) };
                    detail = format!("{which}: the largest input element of {} x 2^16 (forward and weight gradient)", hit.join(", "));
                }
            }
            decisions.push(Decision { iteration, step: applied, action: "inject".into(), detail: format!("{:?}: {detail}", inj.kind), applied: true });
        }
        let (mut tokens, mut targets) = data.batch(cursor);
        cursor += 1;
        if bad_batch {
            let vocab = graph.tensor_id("embed.weight").map_or(256, |id| graph.tensors[id].shape[0]);
            corrupt(&mut tokens, &mut targets, cfg.seed ^ cursor, vocab);
        }
        let loss = ex.forward(&[("tokens", Input::U32(&tokens)), ("targets", Input::U32(&targets))])?;
        ex.backward()?;
        if grad_spike {
            ex.scale_grads(1e4)?;
        }
        let sums = ex.grad_sums()?;
        let total: f64 = sums.iter().map(|s| s.1).sum();
        let grads_finite = sums.iter().all(|s| s.2) && total.is_finite();
        let numerics = ex.precision_numerics();
        let mut layer_metrics: Vec<LayerMetrics> = Vec::new();
        for (name, ss, finite) in &sums {
            let l = layers.iter().find(|(n, _)| n == name).map_or(-1, |x| x.1);
            match layer_metrics.iter_mut().find(|m| m.layer == l) {
                Some(m) => {
                    m.grad_norm += ss;
                    m.nonfinite |= !finite;
                }
                None => layer_metrics.push(LayerMetrics { layer: l, grad_norm: *ss, nonfinite: !finite }),
            }
        }
        for m in &mut layer_metrics {
            m.grad_norm = m.grad_norm.sqrt();
            m.nonfinite |= numerics.iter().any(|n| n.layer == m.layer && n.numerics.nonfinite > 0);
        }
        layer_metrics.sort_by_key(|m| m.layer);
        let mut site_metrics: Vec<SiteMetrics> = Vec::new();
        for n in &numerics {
            let Some(i) = (0..sites.len()).find(|&i| ops[i] == n.op && xrole(sites[i].role) == n.role) else { continue };
            let om = OperandMetrics {
                operand: match n.operand {
                    XOperand::Activation => Operand::Activation,
                    XOperand::Weight => Operand::Weight,
                    XOperand::Gradient => Operand::Gradient,
                },
                amax: f64::from(n.numerics.amax),
                scale: f64::from(n.numerics.scale),
                saturation_rate: n.numerics.saturation_rate(),
                underflow_rate: n.numerics.underflow_rate(),
                nonfinite: n.numerics.nonfinite > 0,
            };
            match site_metrics.iter_mut().find(|s| s.site as usize == i) {
                Some(s) => s.operands.push(om),
                None => site_metrics.push(SiteMetrics { site: i as u32, operands: vec![om] }),
            }
        }
        let lr = lr_at(peak, applied, cfg.steps);
        let metrics = StepMetrics {
            step: iteration,
            tokens: applied * tokens_per_step,
            loss: f64::from(loss),
            grad_norm: total.sqrt(),
            learning_rate: lr,
            loss_finite: loss.is_finite(),
            grads_finite,
            layers: layer_metrics,
            sites: site_metrics,
            plan: plans.current.clone(),
            state: std::mem::take(&mut state),
        };
        let response = policy.on_step(&metrics)?;
        state = response.state;
        ex.end_precision_step();
        let before = applied;
        let outcome = plans.apply(&response.actions, |action, detail, ok| {
            decisions.push(Decision { iteration, step: before, action: action.into(), detail, applied: ok });
        });
        coverage_sum += plan::coverage(&sites, &plans.current);
        for &i in &outcome.reset {
            ex.reset_amax(ops[i], &[xrole(sites[i].role)]);
        }
        if outcome.replan {
            let again = policy.plan(&PlanRequest {
                model: variant.name.clone(),
                layers: plan_layers(cfg.layers, variant.hyper.layers),
                device: cfg.plan_for.clone(),
                sites: sites.clone(),
                state: std::mem::take(&mut state),
            })?;
            plan::known_bad(&sites, &again.sites).map_err(|m| bad_plan(&info.name, Some(applied), &m))?;
            state = again.state;
            plans.current = again.sites;
        }
        if outcome.changed || outcome.replan {
            set(&mut ex, &plans)?;
        }
        train.push(Point { step: applied, tokens: applied * tokens_per_step, loss: f64::from(loss), learning_rate: Some(lr) });
        iteration += 1;
        if let Some(m) = outcome.abort {
            aborted = Some(m);
            break;
        }
        let rejected = outcome.rollback.is_some() || outcome.skip;
        let finite = loss.is_finite() && grads_finite;
        if rejected {
            let first = rejected_in_a_row == 0;
            streak_finite = finite && (first || streak_finite);
            let (skip, back) = if first { (false, false) } else { streak_actions };
            streak_actions = (skip || outcome.skip, back || outcome.rollback.is_some());
        }
        rejected_in_a_row = rejected_after(rejected_in_a_row, rejected);
        if rejected_in_a_row >= REJECTED_IN_A_ROW {
            let action = match streak_actions {
                (true, true) => "skip-step or rollback",
                (true, false) => "skip-step",
                _ => "rollback",
            };
            aborted = Some(rejected_stop(
                &info.name,
                &format!("asked for {action} on {rejected_in_a_row} steps in a row (the last: loss {loss})"),
                format!(
                    "diverged: {rejected_in_a_row} steps in a row were skipped or rolled back (the last: loss {loss}, gradients {}); \
                     lower the learning rate (--lr, peak {peak}) or clip gradients (--clip-grad)",
                    if grads_finite { "finite" } else { "not finite" }
                ),
                streak_finite,
                applied_ever == 0,
            ));
            break;
        }
        if let Some((back, skip)) = outcome.rollback {
            rollbacks += 1;
            let kept: Vec<u64> = checkpoints.iter().map(|c| c.step).collect();
            let (ck, next) = rollback_to(&kept, applied, back, skip, cursor);
            match ck {
                Some(i) => {
                    let c = &checkpoints[i];
                    rolled_back_to.push((c.step, finite));
                    let to_this = || rolled_back_to.iter().filter(|r| r.0 == c.step);
                    let times = to_this().count();
                    if times >= ROLLBACKS_TO_ONE_CHECKPOINT {
                        aborted = Some(rejected_stop(
                            &info.name,
                            &format!("asked for rollback to the checkpoint of step {} {times} times (the last: loss {loss} at step {applied})", c.step),
                            format!(
                                "diverged: rolled back to the checkpoint of step {} {times} times, and each time the run failed again after it \
                                 (the last: loss {loss} at step {applied}); lower the learning rate (--lr, peak {peak}) or clip gradients (--clip-grad)",
                                c.step
                            ),
                            to_this().all(|r| r.1),
                            applied_ever == 0,
                        ));
                        break;
                    }
                    ex.restore(&c.snapshot)?;
                    applied = c.step;
                    // Newer checkpoints hold the steps undone: a later rollback must not
                    // find them (one of the abandoned steps' weights would come back).
                    checkpoints.truncate(i + 1);
                    // Steps after the checkpoint are redone with fresh batches.
                    train.retain(|p| p.step <= applied);
                    applied_losses.truncate(applied as usize);
                    eval.retain(|p| p.step <= applied);
                }
                None => {
                    if let Some(d) = decisions.last_mut() {
                        d.detail += "; no known-good checkpoint yet: the update is discarded instead";
                    }
                }
            }
            cursor = next;
            clean_since = 0;
            continue;
        }
        if outcome.skip {
            skipped += 1;
            clean_since = 0;
            continue;
        }
        if let Some(f) = clip_factor(total, cfg.clip_grad) {
            ex.scale_grads(f)?;
        }
        ex.optimizer_step(&adamw(lr, weight_decay(cfg.weight_decay, &variant.defaults)))?;
        applied += 1;
        applied_ever += 1;
        applied_losses.push(f64::from(loss));
        step_seconds.push(t0.elapsed().as_secs_f64());
        clean_since = clean_after(clean_since, &response.actions, loss.is_finite());
        // A checkpoint is known-good when it follows a stretch of clean steps.
        if checkpoint_due(outcome.checkpoint, applied, cfg.checkpoint_every, clean_since) {
            checkpoints.push(Checkpoint { step: applied, snapshot: ex.snapshot()? });
            if checkpoints.len() > KEEP {
                checkpoints.remove(0);
            }
        }
        if applied % eval_every == 0 || applied == cfg.steps {
            let l = evaluate(&mut ex, data, cfg.eval_batches)?;
            eval.push(Point { step: applied, tokens: applied * tokens_per_step, loss: l, learning_rate: None });
            last = format!("{spec}: train loss {loss:.4} held-out {l:.4}");
        } else {
            last = format!("{spec}: train loss {loss:.4}");
        }
    }
    let final_train_loss = final_train_loss(&applied_losses);
    let final_eval_loss = eval.last().map_or(f64::NAN, |p| p.loss);
    step_seconds.sort_by(f64::total_cmp);
    let median = step_seconds.get(step_seconds.len() / 2).copied().unwrap_or(f64::NAN);
    Ok(RunResult {
        policy: spec.trim_end_matches(".wasm").rsplit('/').next().unwrap_or(spec).to_string(),
        description,
        plugin: info.clone(),
        train,
        eval,
        final_train_loss,
        final_eval_loss,
        steps: applied,
        iterations: iteration,
        skipped,
        rollbacks,
        planned_coverage,
        effective_coverage: coverage_sum / iteration.max(1) as f64,
        tokens_per_s: tokens_per_step as f64 / median,
        median_step_seconds: median,
        seconds: started.elapsed().as_secs_f64(),
        decisions,
        aborted,
        native_fp8_gemms: ex.native_fp8_gemms(),
        fused_fp8_casts: ex.fused_fp8_casts(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn injections_parse_and_name_what_is_wrong() {
        assert_eq!(Injection::parse("amax-spike@150").unwrap(), Injection { kind: InjectKind::AmaxSpike, step: 150, site: None });
        let i = Injection::parse("nan@7:layers.1.mlp.up").unwrap();
        assert_eq!((i.kind, i.step, i.site.as_deref()), (InjectKind::Nan, 7, Some("layers.1.mlp.up")));
        // A site on a fault that has none was ignored in silence.
        let e = Injection::parse("grad-spike@3:foo").unwrap_err();
        assert!(e.contains("grad-spike takes no site"), "{e}");
        assert!(Injection::parse("grad-spike@x").unwrap_err().contains("not a step number"));
        assert!(Injection::parse("melt@3").unwrap_err().contains("unknown fault"));
        assert!(Injection::parse("nan").unwrap_err().contains("KIND@STEP"));
    }

    /// The plugin's weight decay is the one applied (it was the runner's 0.1 whatever the
    /// plugin said) unless `--weight-decay` gives one, beside the scheduled rate and the
    /// runner's betas.
    #[test]
    fn the_optimizer_takes_the_plugins_weight_decay_or_the_flags() {
        let d = |weight_decay: f64| crate::plugin::workload::TrainingDefaults {
            seq_len: 8,
            tokens: 1e9,
            optimizer: "adamw".into(),
            learning_rate: 3e-4,
            weight_decay,
        };
        for wd in [0.0, 0.05, 1.0] {
            let a = adamw(2e-3, weight_decay(None, &d(wd)));
            assert_eq!((a.lr, a.weight_decay, a.beta1, a.beta2, a.eps), (2e-3, wd as f32, 0.9, 0.95, 1e-8), "{wd}");
            assert_eq!(weight_decay(Some(0.3), &d(wd)), 0.3);
        }
    }

    /// `--optimizer` wins; left out, the plugin's when it is adamw or muon (Megatron's
    /// dist_muon too), else AdamW with the plugin's name kept for the note.
    #[test]
    fn the_optimizer_is_the_flags_else_the_plugins_else_adamw() {
        let muon = Optimizer::Muon(MUON_DEFAULT);
        assert_eq!(choose_optimizer(Some("muon"), "adamw").unwrap(), (muon, None));
        assert_eq!(choose_optimizer(Some("adamw"), "muon").unwrap(), (Optimizer::AdamW, None));
        assert_eq!(choose_optimizer(None, "AdamW").unwrap(), (Optimizer::AdamW, None));
        assert_eq!(choose_optimizer(None, "muon").unwrap(), (muon, None));
        assert_eq!(choose_optimizer(None, "dist_muon").unwrap(), (muon, None));
        assert_eq!(choose_optimizer(None, "MuonClip").unwrap(), (Optimizer::AdamW, Some("MuonClip".into())));
        assert!(format!("{:#}", choose_optimizer(Some("lion"), "adamw").unwrap_err()).contains("--optimizer lion: unknown optimizer"));
    }

    /// `--muon-tp-mode` sets Muon's tensor-parallel mode (any case), leaves the
    /// optimizer alone where it is not given, and is refused beside AdamW.
    #[test]
    fn the_muon_tp_mode_sets_muons_and_refuses_adamw() {
        let muon = Optimizer::Muon(MUON_DEFAULT);
        assert_eq!(MUON_DEFAULT.tp_mode, MuonTpMode::Exact);
        assert_eq!(with_muon_tp_mode(muon, None).unwrap(), muon);
        assert_eq!(with_muon_tp_mode(Optimizer::AdamW, None).unwrap(), Optimizer::AdamW);
        assert_eq!(with_muon_tp_mode(muon, Some("BLOCKWISE")).unwrap(), Optimizer::Muon(Muon { tp_mode: MuonTpMode::Blockwise, ..MUON_DEFAULT }));
        assert_eq!(with_muon_tp_mode(muon, Some("exact")).unwrap(), muon);
        let e = format!("{:#}", with_muon_tp_mode(Optimizer::AdamW, Some("exact")).unwrap_err());
        assert!(e.contains("--muon-tp-mode exact") && e.contains("--optimizer muon"), "{e}");
        let e = format!("{:#}", with_muon_tp_mode(muon, Some("duplicated")).unwrap_err());
        assert!(e.contains("use exact or blockwise"), "{e}");
    }

    #[test]
    fn the_schedule_warms_up_then_decays_to_a_tenth() {
        assert!((lr_at(1.0, 0, 100) - 0.1).abs() < 1e-12);
        assert!((lr_at(1.0, 9, 100) - 1.0).abs() < 1e-12);
        assert!((lr_at(1.0, 99, 100) - 0.1).abs() < 0.01);
        assert!(lr_at(1.0, 50, 100) < 1.0 && lr_at(1.0, 50, 100) > 0.1);
    }

    #[test]
    fn batches_are_shifted_windows_in_a_seeded_order() {
        let tokens: Vec<u32> = (0..10_000).collect();
        let d = Data::new(tokens.clone(), 16, 4, 1).unwrap();
        let (t, y) = d.batch(3);
        assert_eq!(t.len(), 64);
        for (a, b) in t.iter().zip(&y) {
            assert_eq!(*b, a + 1);
        }
        assert_eq!(Data::new(tokens.clone(), 16, 4, 1).unwrap().batch(3), d.batch(3));
        assert_ne!(Data::new(tokens.clone(), 16, 4, 2).unwrap().batch(3), d.batch(3));
        assert!(d.eval_batch(0).0[0] as usize >= d.train.len());
        assert!(Data::new((0..100).collect(), 16, 4, 1).is_err());
        // The minimum the message names is the minimum: 6 x 17 x 4 = 408 tokens.
        let err = Data::new((0..407).collect(), 16, 4, 1).err().unwrap().to_string();
        assert!(err.contains("has 407 tokens") && err.contains("at least 408"), "{err}");
        assert!(Data::new((0..408).collect(), 16, 4, 1).is_ok());
        assert_eq!(policy_spec("fp8-safe"), "fp8-safe.wasm");
        assert_eq!(policy_spec("x/y.wasm"), "x/y.wasm");
        assert_eq!(policy_spec("fp8.wasm"), "fp8.wasm");
        assert_eq!(policy_spec("./policies/mine"), "./policies/mine", "a path is taken as given");
    }

    /// The split: 1/50 of a long text held out (at least two batches of windows), the rest
    /// trained on; the training windows are every seq-th start whose targets fit, each read
    /// once an epoch; held-out batches are consecutive windows, all in range.
    #[test]
    fn the_split_the_windows_and_the_epochs() {
        let tokens: Vec<u32> = (0..10_000).collect();
        let d = Data::new(tokens.clone(), 8, 4, 3).unwrap();
        assert_eq!((d.train.len(), d.eval.len()), (9_800, 200));
        assert_eq!([&d.train[..], &d.eval[..]].concat(), tokens);
        // 9800 is a multiple of 8: the window at 9792 has no target for its last token.
        let mut starts = d.order.clone();
        starts.sort_unstable();
        assert_eq!(starts, (0..1224).map(|w| w * 8).collect::<Vec<usize>>());
        // One epoch (306 batches of 4) reads each window once; then it wraps.
        let mut seen: Vec<u32> = (0..306).flat_map(|b| d.batch(b).0.chunks(8).map(|c| c[0]).collect::<Vec<_>>()).collect();
        assert_eq!(d.batch(306), d.batch(0));
        seen.sort_unstable();
        assert_eq!(seen, (0..1224).map(|w| w * 8).collect::<Vec<u32>>());
        // A short text holds out two batches of windows: 2 x 17 x 4 of 1000.
        assert_eq!(Data::new((0..1000).collect(), 16, 4, 0).unwrap().eval.len(), 136);
        // Held-out batches: consecutive windows, targets one ahead, never out of range.
        let per = 8 * 4;
        assert_eq!(d.eval_batch(0).0, d.eval[..per]);
        assert_eq!(d.eval_batch(1).0, d.eval[per..2 * per]);
        for b in 0..50 {
            let (t, y) = d.eval_batch(b);
            assert_eq!(t.len(), per);
            assert!(t.iter().zip(&y).all(|(a, b)| *b == a + 1), "batch {b}");
        }
    }

    /// Fisher-Yates: over seeds every window reaches every place (a shuffle that leaves
    /// the last one in place, or Sattolo's, which moves every one, would not).
    #[test]
    fn the_window_order_is_a_uniform_shuffle() {
        // 19 tokens: 6 held out, 13 trained on: 6 windows of 2.
        let mut hit = [[false; 6]; 6];
        for seed in 0..300 {
            let d = Data::new((0..19).collect(), 2, 1, seed).unwrap();
            assert_eq!(d.order.len(), 6);
            for (place, w) in d.order.iter().enumerate() {
                hit[place][w / 2] = true;
            }
        }
        assert!(hit.iter().all(|r| r.iter().all(|&h| h)), "{hit:?}");
        // SplitMix64's published first output for seed 0.
        assert_eq!(Rng(0).next(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn the_schedule_warms_up_over_a_tenth_at_most_100_steps_then_decays() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        // 100 steps: 10 of warm-up, then the cosine from the peak: half-way (step 55) it
        // is 0.55, at the end 0.1, and after it stays there.
        assert!(close(lr_at(1.0, 4, 100), 0.5));
        assert!(close(lr_at(1.0, 10, 100), 1.0));
        assert!(close(lr_at(2.0, 55, 100), 1.1));
        assert!(close(lr_at(1.0, 100, 100), 0.1));
        assert!(close(lr_at(1.0, 500, 100), 0.1));
        assert!((10..100).all(|t| lr_at(1.0, t + 1, 100) < lr_at(1.0, t, 100)));
        // 3000 steps: warm-up capped at 100.
        assert!(close(lr_at(1.0, 49, 3000), 0.5));
        assert!(close(lr_at(1.0, 99, 3000), 1.0));
        assert!(close(lr_at(1.0, 100, 3000), 1.0));
        // Runs of under 10 steps warm up in one.
        assert!(close(lr_at(1.0, 0, 5), 1.0));
        assert!(close(lr_at(1.0, 0, 1), 1.0));
    }

    #[test]
    fn every_fault_kind_parses_and_sites_are_for_activation_faults_only() {
        assert_eq!(Injection::parse("bad-batch@4").unwrap(), Injection { kind: InjectKind::BadBatch, step: 4, site: None });
        assert_eq!(Injection::parse("grad-spike@0").unwrap(), Injection { kind: InjectKind::GradSpike, step: 0, site: None });
        assert_eq!(Injection::parse("amax-spike@2:all").unwrap().site.as_deref(), Some("all"));
        let e = Injection::parse("bad-batch@4:layers.0.mlp.up").unwrap_err();
        assert!(e.contains("bad-batch takes no site (it hits the whole batch)"), "{e}");
        let e = Injection::parse("grad-spike@4:x").unwrap_err();
        assert!(e.contains("(it hits every weight gradient)"), "{e}");
        assert!(Injection::parse("nan@-1").unwrap_err().contains("'-1' is not a step number"));
        assert!(Injection::parse("NaN@1").unwrap_err().contains("unknown fault 'NaN'"));
    }

    /// Each flag's range, at its edges: refused before any plugin loads, or let through
    /// (to the load of a plugin that does not exist).
    #[test]
    fn flags_are_checked_at_their_edges_before_anything_loads() {
        let base = TrainConfig { steps: 10, ..TrainConfig::new("no-such-model-for-this-test.wasm", vec!["bf16".into()]) };
        let check = |cfg: TrainConfig, refused: Option<&str>| {
            let loading = std::cell::Cell::new(false);
            let e = format!("{:#}", run(&cfg, &|p| loading.set(loading.get() || matches!(p, Progress::Stage(m) if m.starts_with("loading")))).unwrap_err());
            match refused {
                Some(want) => assert!(!loading.get() && e.contains(want), "{want}: {e}"),
                None => assert!(loading.get(), "refused: {e}"),
            }
        };
        let b = || base.clone();
        check(TrainConfig { policies: vec![], ..b() }, Some("no precision policy"));
        check(TrainConfig { steps: 0, ..b() }, Some("--steps 0: use 1..=1000000"));
        check(TrainConfig { steps: 1, ..b() }, None);
        check(TrainConfig { steps: 1_000_000, ..b() }, None);
        check(TrainConfig { steps: 1_000_001, ..b() }, Some("--steps 1000001"));
        check(TrainConfig { seq_len: 0, ..b() }, Some("--seq-len x --micro-batch 0 x 8"));
        check(TrainConfig { micro_batch: 0, ..b() }, Some("--seq-len x --micro-batch 128 x 0"));
        check(TrainConfig { seq_len: 1024, micro_batch: 1024, ..b() }, None);
        check(TrainConfig { seq_len: 1025, micro_batch: 1024, ..b() }, Some("at most 2^20 tokens"));
        check(TrainConfig { eval_batches: 10_000, ..b() }, None);
        check(TrainConfig { eval_batches: 1, ..b() }, None);
        for share in [-0.01, 1.01, f64::NAN] {
            check(TrainConfig { max_bf16_share: share, ..b() }, Some("a fraction in 0..=1"));
        }
        for share in [0.0, 1.0] {
            check(TrainConfig { max_bf16_share: share, ..b() }, None);
        }
        // The plugin contract's range for a default learning rate, ends included: 1e300
        // trained to NaN and printed 301 digits of advice.
        for lr in [1e-8, 10.0] {
            check(TrainConfig { lr: Some(lr), ..b() }, None);
        }
        for lr in [0.0, -1e-3, 1e-30, 9.9e-9, 10.01, 1e300, f64::NAN, f64::INFINITY] {
            check(TrainConfig { lr: Some(lr), ..b() }, Some("a peak learning rate is from 1e-8 to 10 (leave it out"));
        }
        for wd in [0.0, 0.01, 1.0] {
            check(TrainConfig { weight_decay: Some(wd), ..b() }, None);
        }
        for wd in [-0.1, 1.01, f64::NAN, f64::INFINITY] {
            check(TrainConfig { weight_decay: Some(wd), ..b() }, Some("from 0 to 1 (leave it out for the variant's)"));
        }
        for o in ["adamw", "muon", "Muon"] {
            check(TrainConfig { optimizer: Some(o.into()), ..b() }, None);
        }
        check(TrainConfig { optimizer: Some("sgd".into()), ..b() }, Some("--optimizer sgd: unknown optimizer 'sgd': use adamw or muon"));
        // Muon's tensor-parallel mode: with Muon, or left to the plugin's optimizer
        // (checked once it loads); beside --optimizer adamw, or misnamed, refused.
        for m in ["exact", "blockwise", "Blockwise"] {
            check(TrainConfig { optimizer: Some("muon".into()), muon_tp_mode: Some(m.into()), ..b() }, None);
            check(TrainConfig { muon_tp_mode: Some(m.into()), ..b() }, None);
        }
        check(TrainConfig { optimizer: Some("adamw".into()), muon_tp_mode: Some("blockwise".into()), ..b() }, Some("--muon-tp-mode blockwise: it sets how Muon"));
        check(TrainConfig { optimizer: Some("muon".into()), muon_tp_mode: Some("rowwise".into()), ..b() }, Some("--muon-tp-mode rowwise: unknown Muon tensor-parallel mode"));
        check(TrainConfig { clip_grad: 0.0, ..b() }, None);
        check(TrainConfig { clip_grad: 1.0, ..b() }, None);
        for c in [-1.0, f64::NAN, f64::INFINITY] {
            check(TrainConfig { clip_grad: c, ..b() }, Some("a gradient norm of 0 (off) or more"));
        }
        // A refused value is echoed short: `{}` of 1e300 is 301 digits of error.
        check(TrainConfig { lr: Some(1e300), ..b() }, Some("--lr 1e300: a peak learning rate"));
        check(TrainConfig { weight_decay: Some(-1e300), ..b() }, Some("--weight-decay -1e300: AdamW's"));
        check(TrainConfig { max_bf16_share: 1e300, ..b() }, Some("--max-bf16-share 1e300: a fraction"));
        check(TrainConfig { clip_grad: -1e300, ..b() }, Some("--clip-grad -1e300: a gradient norm"));
        let at = |s: &str| vec![Injection::parse(s).unwrap()];
        check(TrainConfig { injections: at("nan@9"), ..b() }, None);
        check(TrainConfig { injections: at("nan@10"), ..b() }, Some("--inject at step 10 would never fire: the run takes steps 0 to 9"));
        let twice = |a: &str, b: &str| vec![Injection::parse(a).unwrap(), Injection::parse(b).unwrap()];
        check(TrainConfig { injections: twice("bad-batch@3", "bad-batch@3"), ..b() }, Some("--inject gives bad-batch@3 twice; give each fault once"));
        check(TrainConfig { injections: twice("nan@3", "nan@4"), ..b() }, None);
        check(TrainConfig { injections: twice("nan@3:layers.0.mlp.up", "nan@3:layers.1.mlp.up"), ..b() }, None);
    }

    /// The fault's default site is `mlp.down` of the middle low-precision layer (of the
    /// upper middle where there are two); with none in low precision, the middle layer.
    /// Each weight belongs to the layer of the first op reading it.
    #[test]
    fn faults_default_to_the_middle_low_precision_layer() {
        use crate::plugin::precision::{Dtype, OperandPlan, ScalingRecipe, SitePlan, unscaled, unscaled_operand};
        use runner_exec::toy::{ToyConfig, llama};
        let g = llama(&ToyConfig { layers: 5, ..ToyConfig::tiny() });
        let sites: Vec<GemmSite> = crate::project::gemm_sites(&g).into_iter().map(|(_, s)| s).collect();
        let d = |f| OperandPlan { recipe: ScalingRecipe::Delayed, amax_history: 16, ..unscaled_operand(f) };
        let fp8 = SitePlan { activation: d(Dtype::Fp8E4m3), weight: d(Dtype::Fp8E4m3), gradient: d(Dtype::Fp8E5m2), output: Dtype::Bf16 };
        let plan = |low: &[i32]| sites.iter().map(|s| if low.contains(&s.layer) { fp8 } else { unscaled(Dtype::Bf16) }).collect::<Vec<_>>();
        assert_eq!(default_site(&sites, &plan(&[1, 3])).as_deref(), Some("layers.3.mlp.down"));
        assert_eq!(default_site(&sites, &plan(&[0, 1, 4])).as_deref(), Some("layers.1.mlp.down"));
        assert_eq!(default_site(&sites, &plan(&[])).as_deref(), Some("layers.2.mlp.down"));
        for (name, layer) in weight_layers(&g) {
            if let Some(l) = name.strip_prefix("layers.").and_then(|r| r.split('.').next()) {
                assert_eq!(layer.to_string(), l, "{name}");
            }
        }
        assert_eq!(
            [GemmRole::Forward, GemmRole::InputGradient, GemmRole::WeightGradient].map(xrole),
            [XRole::Forward, XRole::InputGradient, XRole::WeightGradient]
        );
    }

    /// A plan request names the layers of the graph trained: `--layers` when given (a
    /// replan asked with the variant's count, so a policy keeping the last layer in BF16
    /// kept one the graph does not have and planned the real last one in FP8).
    #[test]
    fn plans_are_asked_for_the_layers_trained() {
        assert_eq!(plan_layers(0, 16), 16);
        assert_eq!(plan_layers(2, 16), 2);
        assert_eq!(plan_layers(32, 16), 16);
    }

    /// The peak learning rate: --lr, else the variant's, else (a variant that gives 0)
    /// 1e-3.
    #[test]
    fn the_peak_lr_is_the_flags_else_the_variants_else_1e_3() {
        assert_eq!(peak_lr(Some(0.5), 3e-4), 0.5);
        assert_eq!(peak_lr(None, 3e-4), 3e-4);
        assert_eq!(peak_lr(None, 0.0), 1e-3);
        assert_eq!(peak_lr(Some(0.5), 0.0), 0.5);
    }

    /// A plan the host refuses is named by its plugin, a replan's by its step too (the
    /// replan's said only the site).
    #[test]
    fn a_refused_plan_names_its_plugin_and_a_replan_its_step() {
        assert_eq!(bad_plan("p.wasm", None, "site a (forward): why").to_string(), "p.wasm: site a (forward): why");
        assert_eq!(bad_plan("p.wasm", Some(7), "site a: why").to_string(), "p.wasm, replanning at step 7: site a: why");
    }

    /// A tiny run of the real loop (three layers, 8 x 2 tokens a step, 10 steps): a NaN
    /// at step 1 that fp8-safe skips, then a gradient spike at step 3. Faults fire at the
    /// applied step, not the iteration (the skip makes them differ); the report counts
    /// the applied steps and the skips; each point's tokens are its step's; with no
    /// --eval-every the held-out loss is taken every tenth of the steps. Kills: faults
    /// keyed on the iteration, `steps` reporting iterations, skips not counted, points'
    /// tokens off by a step or not scaled, a default evaluation interval of a fifth, the
    /// effective coverage averaged over the planned steps rather than the iterations, a
    /// NaN fault injected into the weight-gradient GEMM instead of the forward; each
    /// training point's learning rate is the schedule's at its applied step (kills the
    /// schedule read at the iteration, which the skip puts one ahead, or not at all).
    #[test]
    fn a_tiny_run_fires_faults_at_applied_steps_and_records_them() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("t.txt");
        std::fs::write(&text, &corpus::KJV[..20_000]).unwrap();
        let cfg = TrainConfig {
            steps: 10,
            seq_len: 8,
            micro_batch: 2,
            layers: 3,
            eval_batches: 1,
            text: Some(text),
            injections: vec![Injection::parse("nan@1").unwrap(), Injection::parse("grad-spike@3").unwrap()],
            ..TrainConfig::new("llama3.wasm", vec!["fp8-safe".into()])
        };
        let r = run(&cfg, &|_| {}).unwrap();
        let run = &r.runs[0];
        let injected: Vec<u64> = run.decisions.iter().filter(|d| d.action == "inject").map(|d| d.step).collect();
        assert_eq!(injected, [1, 3], "{:?}", run.decisions);
        // The NaN is in the forward's input: the skipped iteration's loss is NaN, the
        // redone step's is not.
        let at1: Vec<f64> = run.train.iter().filter(|p| p.step == 1).map(|p| p.loss).collect();
        assert!(at1.len() == 2 && at1[0].is_nan() && at1[1].is_finite(), "{at1:?}");
        let skips = run.decisions.iter().filter(|d| d.action == "skip-step" && d.applied).count() as u64;
        assert!(skips >= 1, "{:?}", run.decisions);
        assert_eq!((run.steps, run.skipped, run.rollbacks, run.iterations), (10, skips, 0, 10 + skips));
        assert!(run.train.iter().chain(&run.eval).all(|p| p.tokens == p.step * 16), "{:?} {:?}", run.train, run.eval);
        assert_eq!(run.eval.iter().map(|p| p.step).collect::<Vec<_>>(), (0..=10).collect::<Vec<_>>());
        // Ten steps warm up in one: step 0 takes the peak, then the cosine decays.
        let peak = run.train[0].learning_rate.unwrap();
        assert!(peak > 0.0 && run.eval.iter().all(|p| p.learning_rate.is_none()));
        for p in &run.train {
            let want = lr_at(peak, p.step, 10);
            assert!((p.learning_rate.unwrap() - want).abs() <= 1e-12 * peak, "step {}: {:?} vs {want}", p.step, p.learning_rate);
        }
        assert!(run.train.last().unwrap().learning_rate.unwrap() < 0.2 * peak, "{:?}", run.train);
        // One FP8 layer of three, which the cap keeps in FP8: the plan never changed, so
        // the coverage averaged over the iterations (the skipped one too) is the planned.
        assert!((run.effective_coverage - run.planned_coverage).abs() < 1e-12, "{} vs {}", run.effective_coverage, run.planned_coverage);
    }

    /// A policy's text names its step by the iteration (the contract's
    /// `step-metrics.step`, as the host passes it and as the fp8-safe rules' cooldowns
    /// count it: a number that never goes back), and the decision log's column it agrees
    /// with says so: after a skipped step the two numbers differ, and each alert's "step
    /// N" is its row's iteration. The CSV carries the report in long form: its summary
    /// and curve rows hold the JSON's figures unrounded. Kills: the host passing the
    /// applied step (the alert after the skip would say 3 beside iteration 4), the
    /// column named plain "step", the CSV's losses rounded or its gap in percent.
    #[test]
    fn an_alert_names_the_step_of_its_iteration_column_and_the_csv_is_the_json() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("t.txt");
        std::fs::write(&text, &corpus::KJV[..20_000]).unwrap();
        let cfg = TrainConfig {
            steps: 6,
            seq_len: 8,
            micro_batch: 2,
            layers: 3,
            eval_batches: 1,
            text: Some(text),
            injections: vec![Injection::parse("nan@1").unwrap(), Injection::parse("nan@3").unwrap()],
            ..TrainConfig::new("llama3.wasm", vec!["bf16".into(), "fp8-safe".into()])
        };
        let r = run(&cfg, &|_| {}).unwrap();
        let alerts: Vec<&Decision> = r.runs.iter().flat_map(|run| &run.decisions).filter(|d| d.action == "alert").collect();
        let named = |d: &Decision| -> u64 {
            let at = d.detail.find("step ").unwrap_or_else(|| panic!("{d:?}")) + 5;
            d.detail[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
        };
        assert!(alerts.iter().any(|d| d.iteration != d.step), "a skip must come before an alert: {alerts:?}");
        for d in &alerts {
            assert_eq!(named(d), d.iteration, "{d:?}");
        }
        let t = report::decisions(&r);
        assert_eq!(t.headers[1..3], ["iteration (policy's step)", "steps applied"]);
        let row = t.rows.iter().find(|row| row[3] == "alert" && row[1] != row[2]).unwrap();
        assert!(row[5].starts_with(&format!("step {}:", row[1])) || row[5].contains(&format!("at step {} ", row[1])), "{row:?}");
        // The summary's count of actions is named as such, and says what it leaves out.
        let summary = report::summary(&r);
        assert_eq!(summary.headers.last().map(String::as_str), Some("actions"));
        assert!(summary.notes.iter().any(|n| n.starts_with("actions: ")), "{:?}", summary.notes);

        let csv = report::csv(&r).csv();
        let (header, rows, notes) = crate::report::parse_csv(&csv).unwrap();
        assert_eq!(header[..2], ["kind", "policy"], "{csv}");
        assert!(notes.iter().any(|n| n.starts_with("kind: ")), "{notes:?}");
        let col = |name: &str| header.iter().position(|h| h == name).unwrap_or_else(|| panic!("{name}: {header:?}"));
        let json = serde_json::to_value(&r).unwrap();
        let figure = |cell: &str| -> f64 { cell.parse().unwrap_or_else(|e| panic!("{cell:?}: {e}")) };
        for (i, run) in json["runs"].as_array().unwrap().iter().enumerate() {
            let policy = run["policy"].as_str().unwrap();
            let mine = |kind: &str| rows.iter().filter(|row| row[0] == kind && row[1] == policy).collect::<Vec<_>>();
            let summary = mine("summary");
            assert_eq!(summary.len(), 1, "{csv}");
            for name in ["final_eval_loss", "final_train_loss", "planned_coverage", "effective_coverage", "steps", "skipped"] {
                assert_eq!(figure(&summary[0][col(name)]), run[name].as_f64().unwrap(), "{name}: {csv}");
            }
            if i > 0 {
                assert_eq!(figure(&summary[0][col("eval_gap")]), json["gaps"][i - 1]["eval_gap"].as_f64().unwrap(), "{csv}");
            }
            for kind in ["train", "eval"] {
                let points = mine(kind);
                let want = run[kind].as_array().unwrap();
                assert_eq!(points.len(), want.len(), "{kind}: {csv}");
                for (row, p) in points.iter().zip(want) {
                    assert_eq!(figure(&row[col("step")]), p["step"].as_f64().unwrap());
                    // A NaN loss (the injected fault's iteration) is null in JSON, empty here.
                    match p["loss"].as_f64() {
                        Some(l) => assert_eq!(figure(&row[col("loss")]), l, "{csv}"),
                        None => assert_eq!(row[col("loss")], "", "{csv}"),
                    }
                }
            }
            assert_eq!(mine("decision").len(), run["decisions"].as_array().unwrap().len(), "{csv}");
        }
    }

    /// The seed sets the initial weights as well as the batch order (the held-out loss
    /// before any step differs between seeds: the held-out batches do not depend on it),
    /// and a run replays: the same seed gives the same curves to the bit. Kills the
    /// executor's seed left at its default.
    #[test]
    fn the_seed_sets_the_initial_weights_and_runs_replay() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("t.txt");
        std::fs::write(&text, &corpus::KJV[..20_000]).unwrap();
        let cfg = |seed| TrainConfig { steps: 2, seed, seq_len: 8, micro_batch: 2, layers: 1, eval_batches: 1, text: Some(text.clone()), ..TrainConfig::new("llama3.wasm", vec!["bf16".into()]) };
        let curves = |seed| {
            let r = run(&cfg(seed), &|_| {}).unwrap();
            (r.runs[0].train.clone(), r.runs[0].eval.clone())
        };
        let (a, b) = (curves(3), curves(3));
        assert_eq!(a, b);
        let c = curves(4);
        assert_ne!(a.1[0].loss, c.1[0].loss, "the initial weights ignore the seed");
    }

    /// The final training loss is the mean of the last tenth of the applied steps (at
    /// least one), NaN with none. Kills: averaging the first tenth (the curve's start, not
    /// its end), and a tail one longer than a tenth.
    #[test]
    fn the_final_training_loss_is_the_mean_of_the_last_tenth_applied() {
        let losses: Vec<f64> = (1..=25).map(f64::from).collect();
        assert_eq!(final_train_loss(&losses), 24.5);
        assert_eq!(final_train_loss(&losses[..5]), 5.0);
        assert_eq!(final_train_loss(&[3.0]), 3.0);
        assert!(final_train_loss(&[]).is_nan());
    }

    /// The held-out loss is the mean of the forward losses of the first `batches`
    /// held-out batches.
    #[test]
    fn the_held_out_loss_is_the_mean_over_its_batches() {
        use runner_exec::toy::{ToyConfig, llama};
        let c = ToyConfig::tiny();
        let g = llama(&c);
        let mut ex = Executor::new(&g, runner_exec::cpu::Cpu::new(), ExecOptions::default()).unwrap();
        let tokens: Vec<u32> = (0..3000u32).map(|i| (i * 7 + i / 13) % c.vocab as u32).collect();
        let d = Data::new(tokens, c.seq as usize, c.batch as usize, 0).unwrap();
        let mut want = 0.0;
        for b in 0..3 {
            let (t, y) = d.eval_batch(b);
            want += f64::from(ex.forward(&[("tokens", Input::U32(&t)), ("targets", Input::U32(&y))]).unwrap());
        }
        ex.discard_precision_step();
        let got = evaluate(&mut ex, &d, 3).unwrap();
        assert!((got - want / 3.0).abs() < 1e-6, "{got} vs {}", want / 3.0);
    }

    /// The learning rate and `--clip-grad` reach the optimizer: two steps at a peak of
    /// 1e-2 move the held-out loss; at 1e-8, or with the gradients clipped to a norm of
    /// 1e-12 (each element far below AdamW's epsilon), it moves a hundredth as far or
    /// less. Kills the optimizer given a constant learning rate, and the clipping left
    /// out.
    #[test]
    fn the_learning_rate_and_clipping_reach_the_optimizer() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("t.txt");
        std::fs::write(&text, &corpus::KJV[..20_000]).unwrap();
        let moved = |lr: f64, clip_grad: f64| {
            let cfg = TrainConfig {
                steps: 2,
                seq_len: 8,
                micro_batch: 2,
                layers: 1,
                eval_batches: 1,
                lr: Some(lr),
                clip_grad,
                text: Some(text.clone()),
                ..TrainConfig::new("llama3.wasm", vec!["bf16".into()])
            };
            let r = run(&cfg, &|_| {}).unwrap();
            let run = &r.runs[0];
            assert_eq!(run.train.iter().map(|p| p.learning_rate).collect::<Vec<_>>(), [Some(lr), Some(lr)], "two steps warm up in one");
            (run.eval.last().unwrap().loss - run.eval[0].loss).abs()
        };
        let normal = moved(1e-2, 0.0);
        let tiny = moved(1e-8, 0.0);
        let clipped = moved(1e-2, 1e-12);
        // 0.16, 2.6e-4 and 8e-5 when written (the BF16 weights' rounding moves a little).
        assert!(normal > 0.02, "{normal}");
        assert!(tiny < 0.01 * normal, "{tiny} vs {normal}");
        assert!(clipped < 0.01 * normal, "{clipped} vs {normal}");
    }

    /// The clip factor is the limit over the norm, the square root of the sum of squares,
    /// and only where the norm exceeds a limit that is on. Kills the square root left out
    /// (of the test or of the factor), the test inverted, and clipping at 0.
    #[test]
    fn gradients_are_clipped_to_the_norm() {
        assert_eq!(clip_factor(16.0, 2.0), Some(0.5));
        assert_eq!(clip_factor(100.0, 1.0), Some(0.1));
        // Norm 3 under a limit of 4 (the sum of squares, 9, is over it).
        assert_eq!(clip_factor(9.0, 4.0), None);
        assert_eq!(clip_factor(16.0, 4.0), None);
        assert_eq!(clip_factor(16.0, 0.0), None);
        assert_eq!(clip_factor(f64::NAN, 1.0), None);
        assert_eq!(clip_factor(f64::INFINITY, 1.0), Some(0.0));
    }

    /// A rollback returns to the newest kept checkpoint at least `back - 1` steps old, and
    /// the data moves `skip` batches on. Kills: the oldest checkpoint taken, the target
    /// `back` steps back (or not back at all), the skipped batches not skipped.
    #[test]
    fn a_rollback_returns_to_the_newest_checkpoint_old_enough_and_skips_batches() {
        let kept = [0, 25, 50];
        // One step back at step 60: the newest, 50; the batches move on past two.
        assert_eq!(rollback_to(&kept, 60, 1, 2, 70), (Some(2), 72));
        // At step 50 itself, one step back: 50 (the update is discarded).
        assert_eq!(rollback_to(&kept, 50, 1, 0, 9), (Some(2), 9));
        // Two back from 51: at most step 50; two back from 50: at most 49, so 25.
        assert_eq!(rollback_to(&kept, 51, 2, 1, 9).0, Some(2));
        assert_eq!(rollback_to(&kept, 50, 2, 1, 9).0, Some(1));
        assert_eq!(rollback_to(&kept, 60, 20, 1, 9).0, Some(1));
        assert_eq!(rollback_to(&kept, 60, 0, 1, 9).0, Some(2));
        // Further back than any kept: none (the update is discarded instead).
        assert_eq!(rollback_to(&[25, 50], 30, 10, 3, 40), (None, 43));
        assert_eq!(rollback_to(&[0], 3, 100, 1, 4), (Some(0), 5));
    }

    /// A checkpoint is taken on the interval or when asked, and only after a fifth of the
    /// interval (at least one step, at most the steps applied) of clean steps; a step is
    /// clean when the policy only alerted and the loss was finite; a step neither skipped
    /// nor rolled back ends a run of rejected ones. Kills: each bound of the clean-steps
    /// condition, the interval or the request ignored, a clean step counted from an
    /// action or a NaN, the rejected-in-a-row count not reset.
    #[test]
    fn checkpoints_follow_clean_steps_and_rejections_count_in_a_row() {
        // Every 25: due at 25 and 50 after 5 clean steps, not after 4, not at 26.
        assert!(checkpoint_due(false, 25, 25, 5));
        assert!(checkpoint_due(false, 50, 25, 7));
        assert!(!checkpoint_due(false, 25, 25, 4));
        assert!(!checkpoint_due(false, 26, 25, 26));
        // Asked for (checkpoint-now): off the interval too, still after clean steps; early
        // in a run, after every step so far.
        assert!(checkpoint_due(true, 26, 25, 5));
        assert!(!checkpoint_due(true, 26, 25, 4));
        assert!(checkpoint_due(true, 3, 25, 3));
        assert!(!checkpoint_due(true, 3, 25, 2));
        // An interval under 5: one clean step; 0 taken as every step.
        assert!(checkpoint_due(false, 3, 3, 1));
        assert!(!checkpoint_due(false, 3, 3, 0));
        assert!(checkpoint_due(false, 7, 0, 1));
        assert!(!checkpoint_due(false, 7, 0, 0));
        let alert = pp::Action::Alert("a".into());
        assert_eq!(clean_after(4, &[], true), 5);
        assert_eq!(clean_after(4, std::slice::from_ref(&alert), true), 5);
        assert_eq!(clean_after(4, &[alert.clone(), pp::Action::CheckpointNow], true), 0);
        assert_eq!(clean_after(4, &[], false), 0);
        assert_eq!(rejected_after(3, true), 4);
        assert_eq!(rejected_after(0, true), 1);
        assert_eq!(rejected_after(9, false), 0);
    }

    /// `bad-batch` replaces the targets as well as the tokens, with tokens of the
    /// vocabulary, the same for a seed. Kills the targets left as they were.
    #[test]
    fn a_bad_batch_replaces_tokens_and_targets() {
        let corrupted = |seed| {
            let (mut tokens, mut targets) = (vec![7u32; 64], vec![7u32; 64]);
            corrupt(&mut tokens, &mut targets, seed, 50);
            (tokens, targets)
        };
        let (tokens, targets) = corrupted(3);
        assert!(tokens.iter().chain(&targets).all(|&t| t < 50));
        assert!(targets.iter().filter(|&&t| t != 7).count() > 50, "{targets:?}");
        assert!(tokens.iter().filter(|&&t| t != 7).count() > 50, "{tokens:?}");
        assert_ne!(tokens, targets);
        assert_eq!(corrupted(3), (tokens.clone(), targets.clone()));
        assert_ne!(corrupted(4).1, targets);
    }

    /// An evaluation leaves no numerics behind: the next training step's (what the policy
    /// sees, what enters the amax histories) are its own. Kills the discard left out of
    /// `evaluate`.
    #[test]
    fn an_evaluation_leaves_no_numerics_behind() {
        use crate::plugin::precision::{Dtype, OperandPlan, ScalingRecipe, SitePlan, unscaled_operand};
        use runner_exec::toy::{ToyConfig, llama};
        let c = ToyConfig::tiny();
        let g = llama(&c);
        let sites: Vec<GemmSite> = crate::project::gemm_sites(&g).into_iter().map(|(_, s)| s).collect();
        let d = |f| OperandPlan { recipe: ScalingRecipe::Delayed, amax_history: 16, ..unscaled_operand(f) };
        let fp8 = SitePlan { activation: d(Dtype::Fp8E4m3), weight: d(Dtype::Fp8E4m3), gradient: d(Dtype::Fp8E5m2), output: Dtype::Bf16 };
        let mut ex = Executor::new(&g, runner_exec::cpu::Cpu::new(), ExecOptions::default()).unwrap();
        ex.set_precision(&plan::executor_plan(&sites, &vec![fp8; sites.len()]).unwrap()).unwrap();
        let tokens: Vec<u32> = (0..3000u32).map(|i| (i * 7 + i / 13) % c.vocab as u32).collect();
        let data = Data::new(tokens, c.seq as usize, c.batch as usize, 0).unwrap();
        let (t, y) = data.eval_batch(0);
        ex.forward(&[("tokens", Input::U32(&t)), ("targets", Input::U32(&y))]).unwrap();
        assert!(!ex.precision_numerics().is_empty(), "an FP8 forward gathers numerics");
        ex.discard_precision_step();
        assert!(evaluate(&mut ex, &data, 2).unwrap().is_finite());
        assert!(ex.precision_numerics().is_empty());
    }

    /// A policy of the test's own, through the real loop: every GEMM in BF16, and at each
    /// step the actions `script` gives for the iteration and the applied step. Its plans
    /// and actions pass the contract's checks, as a plugin's do.
    struct Scripted<F>(F);

    impl<F: FnMut(u64, u64) -> Vec<pp::Action>> Policy for Scripted<F> {
        fn name(&mut self) -> Result<String> {
            Ok("scripted: BF16, actions at set steps".into())
        }
        fn plan(&mut self, request: &PlanRequest) -> Result<pp::PlanResponse> {
            let r = pp::PlanResponse { sites: request.sites.iter().map(|_| pp::unscaled(pp::Dtype::Bf16)).collect(), state: Vec::new() };
            pp::validate_plan(request, &r).map_err(anyhow::Error::msg)?;
            Ok(r)
        }
        fn on_step(&mut self, m: &StepMetrics) -> Result<pp::StepResponse> {
            let r = pp::StepResponse { actions: (self.0)(m.step, m.tokens / TINY_TOKENS), state: Vec::new() };
            pp::validate_step(&r).map_err(anyhow::Error::msg)?;
            Ok(r)
        }
    }

    /// Tokens a step of [`scripted`]'s runs: 2 x 8.
    const TINY_TOKENS: u64 = 16;

    /// What [`run`] sets up, once for the scripted runs: llama3-tiny cut to one layer,
    /// batches of 2 x 8 tokens, a BPE learned on 20,000 bytes of the Bible.
    struct Tiny {
        graph: Graph,
        variant: crate::plugin::workload::Variant,
        data: Data,
    }

    fn tiny() -> &'static Tiny {
        static TINY: std::sync::OnceLock<Tiny> = std::sync::OnceLock::new();
        TINY.get_or_init(|| {
            let wp = plugin::load("llama3.wasm").unwrap();
            let mut workload = wp.workload(Limits::default()).unwrap();
            let variant = workload.describe().unwrap().variants.into_iter().find(|v| v.name.ends_with("-tiny")).unwrap();
            let graph = workload.graph(&GraphRequest::training(&variant.name, 8, 2, 1)).unwrap();
            let vocab = graph.tensor_id("embed.weight").map_or(variant.hyper.vocab as usize, |id| graph.tensors[id].shape[0] as usize);
            let text = &corpus::KJV[..20_000];
            let data = Data::new(Bpe::learn(text, vocab).encode(text), 8, 2, 0).unwrap();
            Tiny { graph, variant, data }
        })
    }

    /// `steps` steps of the real loop under a [`Scripted`] policy: a checkpoint every two
    /// steps (after one clean step), the held-out loss (one batch) after every step.
    fn scripted(steps: u64, script: impl FnMut(u64, u64) -> Vec<pp::Action>) -> RunResult {
        let t = tiny();
        let cfg = TrainConfig {
            steps,
            seq_len: 8,
            micro_batch: 2,
            layers: 1,
            eval_every: 1,
            eval_batches: 1,
            checkpoint_every: 2,
            ..TrainConfig::new("llama3.wasm", vec!["scripted".into()])
        };
        let info = PluginInfo {
            name: "scripted".into(),
            kind: Kind::Precision,
            contract: plugin::CONTRACT_VERSION.into(),
            source: plugin::Source::Embedded,
            sha256: String::new(),
            bytes: 0,
            shadows_embedded: false,
        };
        let cpu = runner_exec::cpu::Cpu::new();
        train_under(&cfg, &t.graph, &t.variant, &t.data, "scripted", &info, &mut Scripted(script), Optimizer::AdamW, &cpu, &|_| {}).unwrap()
    }

    fn rollback(steps: u32, skip_batches: u32) -> Vec<pp::Action> {
        vec![pp::Action::Rollback(pp::Rollback { steps, skip_batches })]
    }

    fn curve_steps(r: &RunResult) -> Vec<u64> {
        r.train.iter().map(|p| p.step).collect()
    }

    /// A rollback in the real loop returns to the checkpoint's weights and optimizer state
    /// and skips the batches it was asked to: at step 5 (checkpoints at 0, 2 and 4) three
    /// steps back, with two batches skipped, lands on step 2's checkpoint, and the run then
    /// replays to the bit a run that applied steps 0 and 1, skipped the six batches 2 to 7
    /// (read by the undone steps 2 to 4, the rejected step 5 and the two skipped) and went
    /// on from batch 8: the same training losses from there, the same held-out losses at
    /// every step. The undone steps' points are gone (the first attempt at step 2, the
    /// checkpoint's own step, stays before its replay). Kills: the snapshot not restored,
    /// the optimizer's state or step count not restored with it, the oldest checkpoint
    /// taken, the skipped batches not skipped, the undone points or evaluations kept.
    #[test]
    fn a_rollback_restores_the_checkpoint_and_replays_from_it() {
        let a = scripted(8, |iteration, _| if iteration == 5 { rollback(3, 2) } else { Vec::new() });
        let b = scripted(8, |iteration, _| if (2..8).contains(&iteration) { vec![pp::Action::SkipStep] } else { Vec::new() });
        // 8 applied, 3 undone (steps 2 to 4) and the rejected iteration 5.
        assert_eq!((a.steps, a.iterations, a.rollbacks, a.skipped, a.aborted.as_deref()), (8, 12, 1, 0, None));
        assert_eq!((b.steps, b.iterations, b.rollbacks, b.skipped, b.aborted.as_deref()), (8, 14, 0, 6, None));
        let rb: Vec<(u64, u64, bool)> = a.decisions.iter().filter(|d| d.action == "rollback").map(|d| (d.iteration, d.step, d.applied)).collect();
        assert_eq!(rb, [(5, 5, true)], "{:?}", a.decisions);
        assert!(!a.decisions.iter().any(|d| d.detail.contains("no known-good checkpoint")), "{:?}", a.decisions);
        assert_eq!(curve_steps(&a), [0, 1, 2, 2, 3, 4, 5, 6, 7]);
        assert_eq!(curve_steps(&b), [0, 1, 2, 2, 2, 2, 2, 2, 2, 3, 4, 5, 6, 7]);
        // Steps 0 and 1, and the first attempt at step 2 on batch 2: the same in both.
        assert_eq!(a.train[..3], b.train[..3]);
        // After the rollback: step 2 on batch 8, from step 2's weights and moments.
        assert_eq!(a.train[3..], b.train[8..]);
        assert_eq!(a.eval, b.eval);
        assert_eq!(a.eval.iter().map(|p| p.step).collect::<Vec<_>>(), (0..=8).collect::<Vec<_>>());
        assert_eq!(a.final_train_loss, b.final_train_loss);
        // The replay of step 2 starts from the weights of its first attempt, on another
        // batch (8, not 2).
        assert_ne!(a.train[2].loss, a.train[3].loss);
    }

    /// KEEP (3) checkpoints are kept, no more, no fewer: at step 9 of a run checkpointing
    /// every two steps they are those of steps 4, 6 and 8. Six steps back (to at most step 4)
    /// lands on the oldest, 4; seven back (to at most 3) reaches past it and finds none,
    /// so that update is discarded and the run stays at step 9. Kills KEEP 2 (step 4's
    /// gone: the second rollback finds none either) and KEEP 4 or more, or the newest
    /// dropped instead of the oldest (step 2's kept: the first lands on it).
    #[test]
    fn rollbacks_reach_the_oldest_of_keep_checkpoints_and_no_further() {
        let r = scripted(10, |iteration, _| match iteration {
            9 => rollback(7, 0),
            10 => rollback(6, 0),
            _ => Vec::new(),
        });
        let rb: Vec<(u64, u64, bool)> = r.decisions.iter().filter(|d| d.action == "rollback").map(|d| (d.iteration, d.step, d.detail.contains("no known-good checkpoint yet"))).collect();
        assert_eq!(rb, [(9, 9, true), (10, 9, false)], "{:?}", r.decisions);
        // Steps 0 to 9, the rejected 9 undone with 5 to 9, then 4 to 9 replayed.
        assert_eq!(curve_steps(&r), [0, 1, 2, 3, 4, 4, 5, 6, 7, 8, 9]);
        assert_eq!((r.steps, r.iterations, r.rollbacks, r.skipped, r.aborted.as_deref()), (10, 17, 2, 0, None));
        assert_eq!(r.eval.iter().map(|p| p.step).collect::<Vec<_>>(), (0..=10).collect::<Vec<_>>());
    }

    /// The third rollback to one checkpoint (ROLLBACKS_TO_ONE_CHECKPOINT) stops the run,
    /// naming it, before restoring it; two do not, nor a third rollback to another checkpoint. Kills: a limit of two
    /// (or of four: `>` for `>=`), rollbacks counted over all checkpoints.
    #[test]
    fn the_third_rollback_to_one_checkpoint_aborts_the_run_and_the_second_does_not() {
        // Every time the run reaches step 5, one step back: to step 4's checkpoint.
        let r = scripted(10, |_, applied| if applied == 5 { rollback(1, 0) } else { Vec::new() });
        let e = r.aborted.as_deref().expect("aborted");
        assert!(e.starts_with("diverged: rolled back to the checkpoint of step 4 3 times") && e.contains("at step 5)"), "{e}");
        // Steps 0 to 4, then three times step 5 rolled back (twice after redoing step 4).
        assert_eq!((r.steps, r.iterations, r.rollbacks), (5, 10, 3));
        assert_eq!(curve_steps(&r), [0, 1, 2, 3, 4, 4, 4, 5]);
        // Twice to step 4's, then once to step 8's: three rollbacks, the run completes.
        let mut at = [0u32; 10];
        let r = scripted(10, move |_, applied| {
            at[applied as usize] += 1;
            if (applied == 5 && at[5] <= 2) || (applied == 9 && at[9] == 1) { rollback(1, 0) } else { Vec::new() }
        });
        assert_eq!((r.steps, r.rollbacks, r.aborted.as_deref()), (10, 3, None));
        assert_eq!(r.iterations, 10 + 3 + 3, "10 applied, 3 rejected, step 4 redone twice and step 8 once");
        assert_eq!(curve_steps(&r), [0, 1, 2, 3, 4, 4, 4, 5, 6, 7, 8, 8, 9]);
    }

    /// A policy that rejects every step from the first (skip-step, or rollback to step 0's
    /// checkpoint) with finite loss and gradients is named as the cause, with the action:
    /// no update was applied, so the learning rate is not blamed (it was: "diverged ...
    /// lower the learning rate"). Rejections after applied steps still say diverged, and
    /// that the policy's rules may misfire. Kills: the finite flag ignored (or taken from
    /// the last step only), the never-applied flag ignored, the action misnamed.
    #[test]
    fn a_policy_that_rejects_every_healthy_step_is_blamed_not_the_learning_rate() {
        let skip = scripted(30, |_, _| vec![pp::Action::SkipStep]);
        let e = skip.aborted.as_deref().expect("stopped");
        assert!(e.starts_with("the precision policy scripted asked for skip-step on 10 steps in a row (the last: loss "), "{e}");
        assert!(e.ends_with("no update had been applied (the learning rate is not the cause): its on-step rules fire on every step: fix the policy"), "{e}");
        assert_eq!((skip.steps, skip.iterations), (0, 10));
        let back = scripted(30, |_, _| rollback(1, 0));
        let e = back.aborted.as_deref().expect("stopped");
        assert!(e.starts_with("the precision policy scripted asked for rollback to the checkpoint of step 0 3 times (the last: loss "), "{e}");
        assert!(e.contains("fix the policy") && !e.contains("--lr"), "{e}");
        let later = scripted(30, |_, applied| if applied >= 3 { vec![pp::Action::SkipStep] } else { Vec::new() });
        let e = later.aborted.as_deref().expect("stopped");
        assert!(e.starts_with("diverged: 10 steps in a row were skipped or rolled back") && e.contains("--lr"), "{e}");
        assert!(e.ends_with("with finite loss and gradients: where the loss or gradient norm did not spike, its on-step rules misfire: check them"), "{e}");
        assert_eq!(later.steps, 3);
    }

    /// A rollback forgets the checkpoints newer than the one it returns to: they hold the
    /// steps it undoes. At step 9 (checkpoints 4, 6 and 8 kept) six steps back lands on
    /// step 4's; in the replay step 5 is not clean (the policy acts on it), so none is
    /// taken at 6; one step back at step 7 then returns to step 4's again, not to the
    /// undone step 6's, whose weights were trained on the steps the first rollback threw
    /// away (they were kept and found first). Kills the newer checkpoints kept.
    #[test]
    fn a_rollback_forgets_the_checkpoints_of_the_steps_it_undoes() {
        let mut second = false;
        let r = scripted(10, move |iteration, applied| match (iteration, applied) {
            (9, 9) => rollback(6, 0),
            (10.., 5) => vec![pp::Action::CheckpointNow],
            (10.., 7) if !second => {
                second = true;
                rollback(1, 0)
            }
            _ => Vec::new(),
        });
        let rb: Vec<(u64, u64)> = r.decisions.iter().filter(|d| d.action == "rollback").map(|d| (d.iteration, d.step)).collect();
        assert_eq!(rb, [(9, 9), (13, 7)], "{:?}", r.decisions);
        // 0 to 9; back to 4; 4 to 7 replayed; back to 4 again; 4 to 9.
        assert_eq!(curve_steps(&r), [0, 1, 2, 3, 4, 4, 4, 5, 6, 7, 8, 9]);
        assert_eq!((r.steps, r.iterations, r.rollbacks, r.aborted.as_deref()), (10, 20, 2, None));
        assert_eq!(r.eval.iter().map(|p| p.step).collect::<Vec<_>>(), (0..=10).collect::<Vec<_>>());
    }
}
