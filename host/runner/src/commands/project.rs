//! The performance-model commands: `project` (one layout, optionally with per-op times
//! measured by `runner measure`), `search` (the best layouts per GPU count and why the
//! other families lost), `validate` (against published runs) and `calibrate` (fit a
//! GPU's efficiencies to published runs, or to a local measurement: `--ops` from
//! `runner measure`, `--collectives` from `runner bench collectives`).

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::json;

use runner::input;
use runner::plugin::Limits;
use runner::project::{self, PluginResolver};
use runner::project::{closest_families, verdict_text};
use runner::report::{Table, fixed_or_significant as sig};
use runner_graph::modules::{Module, Modules};
use runner_graph::pipeline::PipelineSplit;
use runner_graph::recompute::RecomputePolicy;
use runner_project::calibrate;
use runner_project::collectives::{self, CollFit, Tier, fit_collectives};
use runner_graph::peft::{Lora, LoraTargets};
use runner_project::measured::{self, OpsFile, OpsFit, fit_ops};
use runner_project::model::{Model, Shape, TrainedSource, Training};
use runner_project::precision::Recipe;
use runner_project::profile::{Efficiency, GpuProfile};
use runner_project::project::Projector;
use runner_project::published::{self, Validation};
use runner_project::search::{self, Found, Space, Verdict};
use runner_project::step::{GroupName, LayoutSpec, Link, Optimizer, PipelineKind, Projection};
use runner_project::template::{Dispatcher, Kernels};

use super::{emit_csv, emit_rendered, progress_line};
use runner::report::OutputFormat;
use crate::Global;

/// A layout degree or micro-batch flag, under the run file's rule
/// ([`runner::runfile::within_gpu_ceiling`]).
pub(crate) fn layout_way(s: &str) -> Result<u32, String> {
    use runner::runfile::{CeilingError, parse_within_gpu_ceiling};
    parse_within_gpu_ceiling(s).map_err(|e| match e {
        CeilingError::OutOfRange => format!("{} is not in 1..={}", s.trim(), runner_contract::limits::GPUS),
        CeilingError::NotWhole => format!("'{s}' is not a whole number"),
    })
}

/// The layout flags `project` and `search` share; unset ones are chosen.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LayoutFlags {
    /// Tensor parallel size
    #[arg(long, value_parser = layout_way)]
    pub tp: Option<u32>,
    /// Pipeline parallel size
    #[arg(long, value_parser = layout_way)]
    pub pp: Option<u32>,
    /// Context parallel size
    #[arg(long, value_parser = layout_way)]
    pub cp: Option<u32>,
    /// Virtual pipeline chunks per stage (interleaved 1F1B)
    #[arg(long, value_parser = layout_way)]
    pub vp: Option<u32>,
    /// Expert parallel size
    #[arg(long, value_parser = layout_way)]
    pub ep: Option<u32>,
    /// Expert tensor parallel size: a divisor of tp, 1 or tp (Megatron's default) most often;
    /// under sequence parallelism the rows are gathered over etp before the experts;
    /// without it the search tries 1 and tp
    #[arg(long, value_parser = layout_way)]
    pub etp: Option<u32>,
    /// Micro-batch size (sequences)
    #[arg(long, value_parser = layout_way)]
    pub mbs: Option<u32>,
    /// Shard parameters, gradients and optimizer state (FSDP / ZeRO-3)
    #[arg(long)]
    pub fsdp: bool,
    /// No FSDP: every data-parallel rank holds the whole weights, the optimizer state
    /// sharded by Megatron's distributed optimizer (without either flag both are tried)
    #[arg(long, conflicts_with = "fsdp")]
    pub no_fsdp: bool,
    /// Activation recompute
    #[arg(long, value_parser = ["none", "selective", "full"])]
    pub recompute: Option<String>,
    /// With --recompute full: layers per pipeline chunk recomputed (0: all)
    #[arg(long)]
    pub recompute_layers: Option<u32>,
    /// Activations of the first N layers of each pipeline chunk offloaded to host memory
    /// between forward and backward (Megatron's cpu_offloading_num_layers); the copies
    /// ride the host link (PCIe, which the NIC's traffic shares on HGX boards, or
    /// NVLink-C2C on GB200/GB300) behind the layers' compute
    #[arg(long)]
    pub offload_layers: Option<u32>,
    /// Expose the expert all-to-all instead of overlapping it with another micro-batch's
    /// compute (Megatron's overlap_moe_expert_parallel_comm off, its default; NeMo 25.04's
    /// DeepSeek-V3 runs had it off). Without it, layouts with ep > 1 overlap where Megatron
    /// can: pp = 1 or a virtual pipeline, no full recompute, more than one micro-batch
    #[arg(long)]
    pub no_ep_overlap: bool,
    /// The optimizer: adamw (Megatron's distributed optimizer) or muon (Megatron's
    /// dist_muon under the layer-wise distributed optimizer, as Kimi-K2 trains); default:
    /// the one the workload plugin names, where the projection models it, else adamw
    #[arg(long, value_parser = Optimizer::parse)]
    pub optimizer: Option<Optimizer>,
    /// The pipeline schedule: 1f1b (Megatron's; interleaved with --vp), dualpipe
    /// (DeepSeek's bidirectional schedule, DeepSeek-V3's: an even pp, no --vp, each rank
    /// holding two stages' weights, the all-to-all and pipeline sends hidden behind the
    /// paired chunk's compute) or dualpipev (DualPipe cut in half, as MindSpeed runs it:
    /// the layers over 2·pp stages, rank r holding stage r and stage 2·pp-1-r, each stage
    /// once; pp ≥ 2, no --vp, at least 2·pp-1 micro-batches); default 1f1b
    #[arg(long, value_parser = PipelineKind::parse)]
    pub pipeline_schedule: Option<PipelineKind>,
    /// Run the routed experts' MLP as fused grouped GEMMs with the activation in their
    /// epilogue (Megatron-Bridge's cutedsl_fused_grouped_mlp, NVIDIA's 26.06 MoE presets);
    /// without it, Megatron's default GroupedLinear path
    #[arg(long)]
    pub fused_grouped_mlp: bool,
    /// The expert token dispatcher (Megatron's moe_token_dispatcher_type): flex (DeepEP or
    /// HybridEP: a token crosses to another NVLink domain once, whatever number of its experts
    /// are there) or alltoall (one NCCL all-to-all, a copy per expert); default flex
    // Not a clap default: a dispatcher named for a model without experts is refused.
    #[arg(long, value_parser = Dispatcher::parse)]
    pub dispatcher: Option<Dispatcher>,
    /// With --recompute selective: Megatron's recompute modules, comma-separated
    /// (core_attn, layernorm, moe_act, mla_up_proj, mlp, shared_experts; default core_attn)
    #[arg(long, value_delimiter = ',')]
    pub recompute_modules: Vec<String>,
    /// Count the embedding as one pipeline layer: the first stage holds one transformer
    /// layer fewer (Megatron's account_for_embedding_in_pipeline_split)
    #[arg(long)]
    pub account_for_embedding_in_pipeline_split: bool,
    /// Count the loss (head) as one pipeline layer: the last stage holds one transformer
    /// layer fewer (Megatron's account_for_loss_in_pipeline_split)
    #[arg(long)]
    pub account_for_loss_in_pipeline_split: bool,
    /// Megatron's pipeline_model_parallel_layout, e.g. "Et*4|(t*4|)*14tmL"
    /// (Megatron-Bridge's DeepSeek-V3 layout); needs --pp, sets vp = chunks / pp
    #[arg(long, conflicts_with_all = ["account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"])]
    pub pipeline_layout: Option<String>,
    /// The pipeline split as the layout labels write it: `even`, or E<n>L<m> (the
    /// embedding and the loss count as n and m layers); default: the flags above, or
    /// for the search both even and E1L1
    #[arg(long, value_name = "SPLIT", value_parser = PipelineSplit::parse,
          conflicts_with_all = ["account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "pipeline_layout"])]
    pub pipeline_split: Option<PipelineSplit>,
}

impl LayoutFlags {
    /// The kernel choices the flags ask for.
    fn kernels(&self) -> Kernels {
        Kernels { fused_grouped_mlp: self.fused_grouped_mlp, dispatcher: self.dispatcher.unwrap_or_default() }
    }

    /// The flags that shape routed experts, refused for a model without any
    /// ([`project::refuse_moe_settings_without_experts`]).
    fn refuse_moe_flags_without_experts(&self, model: &str, experts: u64) -> Result<()> {
        let given = [
            ("--fused-grouped-mlp", self.fused_grouped_mlp),
            ("--dispatcher", self.dispatcher.is_some()),
            ("--no-ep-overlap", self.no_ep_overlap),
        ];
        project::refuse_moe_settings_without_experts(&given, model, experts)
    }
}

impl LayoutFlags {
    /// The pipeline split the flags ask for, checked against a model of `layers`
    /// layers (a `--pipeline-layout` also fixes vp).
    fn split(&mut self, layers: usize) -> Result<Option<PipelineSplit>> {
        if let Some(s) = self.pipeline_split {
            return Ok(Some(s));
        }
        let Some(text) = self.pipeline_layout.clone() else {
            let (e, l) = (self.account_for_embedding_in_pipeline_split, self.account_for_loss_in_pipeline_split);
            return Ok((e || l).then(|| PipelineSplit::megatron(e, l)));
        };
        let m = PipelineSplit::from_megatron_layout(&text).map_err(|e| anyhow::anyhow!("--pipeline-layout: {e}"))?;
        let pp = self.pp.ok_or_else(|| {
            let are = if self.pipeline_schedule == Some(PipelineKind::DualPipeV) { "2·pp under DualPipeV" } else { "pp·vp" };
            anyhow::anyhow!("--pipeline-layout lists {} chunks; give --pp (the chunks are {are})", m.chunks)
        })? as usize;
        if self.pipeline_schedule == Some(PipelineKind::DualPipeV) {
            // DualPipeV's chunks are its 2·pp stages, with no virtual pipeline.
            if m.chunks != 2 * pp {
                anyhow::bail!("--pipeline-layout under DualPipeV lists {} chunks; with --pp {pp} the V has 2·pp = {} stages, one chunk each", m.chunks, 2 * pp);
            }
            m.check(layers, 2 * pp).map_err(|e| anyhow::anyhow!("--pipeline-layout under DualPipeV (2·pp stages): {e}"))?;
            return Ok(Some(m.split));
        }
        if pp == 0 || !m.chunks.is_multiple_of(pp) {
            anyhow::bail!("--pipeline-layout lists {} chunks, not a multiple of --pp {pp}", m.chunks);
        }
        let vp = (m.chunks / pp) as u32;
        if self.vp.is_some_and(|v| v != vp) {
            anyhow::bail!("--pipeline-layout lists {} chunks: with --pp {pp} that is --vp {vp}, not {}", m.chunks, self.vp.unwrap_or(1));
        }
        self.vp = Some(vp);
        m.check(layers, pp * vp as usize).map_err(|e| anyhow::anyhow!("--pipeline-layout: {e}"))?;
        Ok(Some(m.split))
    }
}

/// What names a projection: model, GPU, precision, sequence, batch.
#[derive(clap::Args, Debug, Clone)]
pub struct Target {
    /// Model variant, as `runner models` lists it (e.g. llama3.1-70b)
    #[arg(long)]
    pub model: String,
    /// GPU type: a100-40gb, a100-80gb, h100, h200, h800, h20, gh200, b200, gb200, b300, gb300, mi300x, mi355x (or one a --profile file adds)
    #[arg(long, default_value = "h100")]
    pub gpu: String,
    /// bf16, fp8, fp8-cs, mxfp8 or nvfp4
    #[arg(long, default_value = "bf16")]
    pub precision: String,
    /// Sequence length (default: the variant's)
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(runner_contract::limits::SEQ_LEN)))]
    pub seq_len: Option<u32>,
    /// Global batch in sequences (default: the variant's published rule; outside its GPU range, scaled per GPU up to the job's compute-optimal batch)
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub gbs: Option<u32>,
    /// Parameter-efficient fine-tuning: none (train every weight) or lora (frozen model,
    /// adapters on the attention and MLP linears, as Megatron-Bridge's LoRA)
    #[arg(long, default_value = "none", value_parser = ["none", "lora"])]
    pub peft: String,
    /// With --peft lora: the adapters' rank (default 32, Megatron-Bridge's)
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub lora_rank: Option<u32>,
    /// With --peft lora: the linears that carry adapters, as Megatron-Bridge's
    /// `peft.target_modules`: all (linear_qkv, linear_proj, linear_fc1, linear_fc2; the
    /// default) or qkv (linear_qkv alone, as NVIDIA's LoRA performance configs)
    #[arg(long, value_parser = LoraTargets::parse)]
    pub lora_targets: Option<LoraTargets>,
}

impl Target {
    /// What the step trains.
    fn training(&self) -> Result<Training> {
        match (self.peft.as_str(), self.lora_rank, self.lora_targets) {
            ("lora", rank, targets) => Ok(Training::Lora(Lora {
                rank: rank.unwrap_or(runner_graph::peft::DEFAULT_RANK),
                targets: targets.unwrap_or_default(),
            })),
            (_, Some(_), _) => anyhow::bail!("--lora-rank applies to a LoRA fine-tune; add --peft lora"),
            (_, _, Some(_)) => anyhow::bail!("--lora-targets applies to a LoRA fine-tune; add --peft lora"),
            _ => Ok(Training::Full),
        }
    }
}

/// The modules `--recompute-modules` names, if any.
fn modules_of(f: &LayoutFlags) -> Result<Option<Modules>> {
    // Without full recompute a layer count would be dropped unsaid.
    if f.recompute_layers.is_some() && f.recompute.as_deref() != Some("full") {
        anyhow::bail!("--recompute-layers counts the layers of full recompute; add --recompute full");
    }
    if f.recompute_modules.is_empty() {
        return Ok(None);
    }
    if f.recompute.as_deref() != Some("selective") {
        anyhow::bail!("--recompute-modules applies to selective recompute; add --recompute selective");
    }
    let mut m = Modules::EMPTY;
    for name in &f.recompute_modules {
        m = m.with(Module::parse(name).map_err(|e| anyhow::anyhow!("--recompute-modules: {e}"))?);
    }
    Ok(Some(m))
}

fn policy(s: Option<&str>) -> Option<RecomputePolicy> {
    s.map(|r| match r {
        "selective" => RecomputePolicy::Selective,
        "full" => RecomputePolicy::Full,
        _ => RecomputePolicy::None,
    })
}

/// A projector for a target, and what it needs to choose layouts.
pub(crate) struct Setup {
    pub(crate) projector: Projector<'static>,
    found: project::Found,
    pub(crate) recipe: Recipe,
    notes: Vec<String>,
}

impl Setup {
    /// `t` with the model as its plugin spells it: found in any case (`LLAMA3.1-8B`), it
    /// is reported, and written to files, under the one name.
    pub(crate) fn named(&self, t: &Target) -> Target {
        Target { model: self.found.variant.name.clone(), ..t.clone() }
    }
}

pub(crate) fn setup(t: &Target, global: &Global) -> Result<Setup> {
    let limits = Limits::default();
    let recipe = Recipe::parse(&t.precision).map_err(|e| anyhow::anyhow!("--precision: {e}"))?;
    let profiles = project::profiles(global.profile.as_deref())?;
    let gpu = profiles.get(&t.gpu).map_err(|e| anyhow::anyhow!("--gpu: {e}"))?.clone();
    gpu.peak_flops(recipe.format()).map_err(|e| anyhow::anyhow!("{e}; choose another --precision or --gpu"))?;
    let found = project::find_model(&t.model, limits)?;
    let seq = t.seq_len.unwrap_or(found.variant.defaults.seq_len);
    if seq == 0 {
        anyhow::bail!("--seq-len must be at least 1");
    }
    let training = t.training()?;
    let mut source = TrainedSource { inner: Box::new(project::source(&found, seq, limits)?), training };
    let model = Model::new(&found.variant.name, seq, &mut source).map_err(anyhow::Error::msg)?;
    let (plan, policy) = project::plan(recipe, &found.variant, &gpu, &model.graph, limits)?;
    let mut notes = vec![format!("plugin: {}", found.info.provenance())];
    notes.extend(profiles.taken_as(&t.gpu));
    if let Some(why) = project::beyond_context(&found.variant, seq) {
        notes.push(format!("{why}: projected as a context-extension run would train it"));
    }
    if let Training::Lora(l) = training {
        notes.push(format!(
            "LoRA fine-tune: rank-{} adapters on {} train {:.1} M of {:.1} B parameters; \
             the base model is frozen (no weight gradients, optimizer state or gradient reduction for it); \
             against NVIDIA's two published LoRA runs (Llama 3 70B, H100) these step times run 8-13 % long \
             (docs/VALIDATION.md)",
            l.rank,
            l.targets.describe(),
            model.params.trainable as f64 / 1e6,
            model.params.total as f64 / 1e9
        ));
    }
    if let Some(info) = &policy {
        notes.push(format!("plugin: {}", info.provenance()));
    }
    notes.push(format!("precision plan: {}", plan.summary()));
    if plan.source == "built-in" {
        notes.push(format!("no {recipe}.wasm precision plugin is installed: the built-in {recipe} plan is used"));
    }
    notes.push(format!(
        "GPU profile {} ({}), efficiencies {}",
        gpu.name,
        profiles.origin.join(" + "),
        gpu.efficiency.fitted
    ));
    Ok(Setup { projector: Projector::new(model, Box::new(source), gpu, plan), found, recipe, notes })
}

fn gbs_for(s: &Setup, t: &Target, gpus: u32, notes: &mut Vec<String>) -> u32 {
    match t.gbs {
        Some(g) => g,
        None => {
            let job = project::Job::new(&s.projector.model, s.found.variant.defaults.tokens);
            let (g, why) = project::default_gbs(&s.found.variant, &s.projector.gpu, s.recipe, gpus, job);
            notes.push(why);
            g
        }
    }
}

/// One projected layout, with where its numbers came from.
#[derive(Serialize)]
struct ProjectOut {
    model: String,
    gpu: String,
    precision: String,
    plan: String,
    layout_from: String,
    #[serde(flatten)]
    projection: Projection,
    /// How `mfu` counts FLOPs (attention causal-halved, `runner_graph::count::Convention`).
    flop_convention: String,
    /// The dense peak `mfu` divides by: the plan's low-precision format and its TFLOP/s.
    mfu_peak_format: String,
    mfu_peak_tflops: f64,
    /// `mfu` with attention counted over all keys, as NVIDIA's DGX Cloud benchmark
    /// READMEs count it (F5: their 54.5 % is this runner's 51.3 % on 70B, not a faster run).
    mfu_all_keys: f64,
    /// Where `--measured` times replaced the roofline.
    #[serde(skip_serializing_if = "Option::is_none")]
    measured: Option<MeasuredOut>,
    notes: Vec<String>,
}

/// The measured ops a projection used: the file, the device and time of the run, and
/// the op names (every other op keeps the roofline).
#[derive(Serialize)]
struct MeasuredOut {
    file: String,
    device: String,
    measured_at: String,
    ops: Vec<String>,
}

/// A `runner measure` file read and checked against a projection's target.
struct MeasuredFile {
    file: OpsFile,
    origin: String,
    /// Ops of the rank graph of a kind the file times that it does not list.
    unmeasured: Vec<String>,
}

/// Read `path` and check it stands for `s`'s model, sequence, GPU and precision and
/// names ops of its rank graph.
fn read_measured(path: &Path, s: &mut Setup, model: &str) -> Result<MeasuredFile> {
    let origin = path.display().to_string();
    let text = input::read_text(path, "--measured file", input::TEXT_LIMIT).map_err(anyhow::Error::msg)?;
    let file = OpsFile::parse(&text, &origin).map_err(anyhow::Error::msg)?;
    let p = &mut s.projector;
    file.check_target(&origin, model, p.model.seq_len, &p.gpu, s.recipe.name()).map_err(anyhow::Error::msg)?;
    let rank = p.rank_graph(file.shard).map_err(|e| anyhow::anyhow!("{origin}: {model} at {}: {e}", measured::key_text(&file.shard)))?;
    file.check_graph(&origin, &rank, &p.plan).map_err(anyhow::Error::msg)?;
    let unmeasured = file.unmeasured(&rank).into_iter().map(String::from).collect();
    Ok(MeasuredFile { file, origin, unmeasured })
}

pub fn project(t: &Target, gpus: u32, flags: &LayoutFlags, measured_path: Option<&Path>, global: &Global) -> Result<()> {
    let mut s = setup(t, global)?;
    let t = &s.named(t);
    let measured = measured_path.map(|p| read_measured(p, &mut s, &t.model)).transpose()?;
    // Layout flags left out take the measured sharding.
    let mut flags = flags.clone();
    if let Some(m) = &measured {
        let k = m.file.shard;
        flags.tp.get_or_insert(k.tp);
        flags.cp.get_or_insert(k.cp);
        flags.ep.get_or_insert(k.ep);
        flags.etp.get_or_insert(k.etp);
        flags.mbs.get_or_insert(k.mbs);
        s.projector = s.projector.with_measured(m.file.measured());
    }
    flags.refuse_moe_flags_without_experts(&t.model, s.projector.model.shape.experts)?;
    let split = flags.split(s.projector.model.depth.len())?;
    flags.optimizer = Some(project::optimizer(flags.optimizer, &s.found.variant, &mut s.notes));
    let flags = &flags;
    if let Some(why) = project::fixed_degrees_refusal([flags.tp, flags.pp, flags.cp], gpus, "from --tp/--pp/--cp") {
        anyhow::bail!("{why}");
    }
    let modules = modules_of(flags)?;
    let mut notes = std::mem::take(&mut s.notes);
    notes.extend(partial_node_note(gpus, s.projector.gpu.gpus_per_node, &s.projector.gpu.name));
    let gbs = gbs_for(&s, t, gpus, &mut notes);
    // A published layout holds at its own sequence length: at another one its memory and
    // its batch rule are another run's (seq 131072 took seq 8192's layout and 1024 sequences).
    let seq_len = s.projector.model.seq_len;
    let default_seq = s.found.variant.defaults.seq_len;
    let mut other_seq = false;
    let reference = project::reference(&s.found.variant, &s.projector.gpu, s.recipe, gpus).cloned().filter(|r| {
        let at = if r.seq_len == 0 { default_seq } else { r.seq_len };
        let same = at == seq_len;
        if !same {
            other_seq = true;
            notes.push(format!("the published layout is for sequence length {at}, not {seq_len}: searched instead"));
        }
        same
    });
    if let Some(r) = &reference
        && !(r.gpus_min..=r.gpus_max).contains(&gpus)
    {
        notes.push(format!("the published layout is for {}-{} GPUs, taken at {gpus}", r.gpus_min, r.gpus_max));
    }
    let pick = |f: Option<u32>, v: u32| f.unwrap_or(v.max(1));
    // The published layout with the flags `flags` (split and modules parsed from them).
    let with_flags = |flags: &LayoutFlags, split: Option<PipelineSplit>, modules: Option<Modules>| reference.as_ref().and_then(|r| {
        let (tp, pp, cp) = (pick(flags.tp, r.tp), pick(flags.pp, r.pp), pick(flags.cp, r.cp));
        let per = u32::try_from(u64::from(tp) * u64::from(pp) * u64::from(cp)).ok()?;
        if per == 0 || !gpus.is_multiple_of(per) {
            return None;
        }
        let ep = pick(flags.ep, r.ep);
        let fsdp = flags.fsdp || (r.fsdp > 0 && !flags.no_fsdp);
        // The published interleaving belongs to its pipeline depth.
        let vp = if flags.pp.is_some_and(|p| p != r.pp.max(1)) { flags.vp.unwrap_or(1) } else { pick(flags.vp, r.vp) };
        // The published recompute unless --recompute says otherwise.
        let (recompute, recompute_layers) = match policy(flags.recompute.as_deref()) {
            Some(p) => (p, flags.recompute_layers.unwrap_or(0)),
            None => project::reference_recompute(r),
        };
        let layout = LayoutSpec {
            tp,
            pp,
            cp,
            vp,
            ep,
            etp: pick(flags.etp, r.etp),
            dp: gpus / per,
            mbs: pick(flags.mbs, r.mbs),
            gbs,
            sequence_parallel: tp > 1,
            fsdp,
            recompute,
            recompute_layers,
            recompute_modules: modules.unwrap_or_default(),
            distributed_optimizer: !fsdp,
            tp_overlap: tp > 1,
            ep_overlap: ep > 1 && !flags.no_ep_overlap,
            dp_overlap: true,
            grad_fp32: false,
            // Without a split given, one Megatron's flags build where there is one.
            split: split
                .or_else(|| {
                    let layers = s.projector.model.shape.layers as usize;
                    let vp = flags.pipeline_schedule.unwrap_or_default().split_vp(vp);
                    PipelineSplit::megatron_choices(layers, pp as usize, vp as usize).first().copied()
                })
                .unwrap_or_default(),
            offload_layers: flags.offload_layers.unwrap_or(0),
            optimizer: flags.optimizer.unwrap_or_default(),
            kernels: flags.kernels(),
            pipeline: flags.pipeline_schedule.unwrap_or_default(),
        };
        Some(layout)
    });
    // Every degree and the micro-batch on the command line, and nothing else the published
    // layout sets (interleaving, FSDP, recompute) left to it: the layout is the user's own.
    let own = reference.as_ref().is_some_and(|r| {
        let unset = |f: Option<u32>, v: u32| f.is_some() || v <= 1;
        [flags.tp, flags.pp, flags.cp, flags.mbs].iter().all(Option::is_some)
            && unset(flags.ep, r.ep)
            && unset(flags.etp, r.etp)
            && (flags.vp.is_some() || flags.pp.is_some_and(|p| p != r.pp.max(1)) || r.vp <= 1)
            && (flags.fsdp || flags.no_fsdp || r.fsdp == 0)
            && (flags.recompute.is_some() || project::reference_recompute(r).0 == RecomputePolicy::None)
    });
    let from_reference = with_flags(flags, split, modules).zip(reference.as_ref()).map(|(l, r)| {
        let from = if own {
            "the command line (every dimension given; the published layout not used)".to_string()
        } else {
            format!("the published layout ({}), flags given on the command line kept", r.source)
        };
        (l, from)
    });
    // The published layout of this GPU count, with the flags given; where it does not
    // apply (an EP degree the data-parallel ranks cannot hold, a batch the DP degree does
    // not divide), the search, keeping the flags given, and a note saying why.
    // One that does not fit gives way to the search too, and is shown only if nothing fits.
    let (mut refused, mut refused_for) = (None, None::<String>);
    let mut unfit = None;
    // What the refusal names: the user's own flags are not the published layout.
    // Any flag that changes the layout built (compared, not listed, so a new flag counts),
    // or a --recompute, which also stops recompute being added to make it fit.
    let named = if own {
        "the layout given"
    } else if from_reference.as_ref().map(|(l, _)| *l) != with_flags(&LayoutFlags::default(), None, None) || flags.recompute.is_some() {
        "the published layout with the flags given"
    } else {
        "the published layout"
    };
    let published = match from_reference {
        Some((l, from)) => {
            let p = if flags.recompute.is_none() {
                published::project_fitting(&mut s.projector, &l)
            } else {
                s.projector.project(&l).map(|p| (p, None))
            };
            match p {
                Ok((p, rc)) if p.fits => {
                    if let Some(rc) = rc {
                        notes.push(format!("{rc} added to fit in memory"));
                    }
                    // A model's published layouts record neither: the run may have used
                    // others (NeMo 25.04's DeepSeek-V3 runs: alltoall, no overlap).
                    if p.layout.ep > 1 {
                        notes.push(format!(
                            "the published layout gives no token dispatcher or expert all-to-all overlap: priced with {} and the \
                             all-to-all {} (--dispatcher, --no-ep-overlap; `runner validate` projects the published runs as configured)",
                            if p.layout.kernels.dispatcher == Dispatcher::AllToAll { "the alltoall dispatcher" } else { "the flex dispatcher" },
                            if p.layout.ep_overlap { "overlapped" } else { "exposed" }
                        ));
                    }
                    Some((p, from))
                }
                Ok((p, _)) => {
                    refused = Some(format!(
                        "{named} ({}) does not fit: it {}",
                        p.layout.short(),
                        p.memory.shortfall().unwrap_or_default()
                    ));
                    unfit = Some((p, from));
                    None
                }
                Err(e) => {
                    refused_for = Some(e.to_string());
                    refused = Some(format!(
                        "{named} (TP{} PP{} CP{} EP{} MBS{} at DP{}) does not apply: {e}",
                        l.tp, l.pp, l.cp, l.ep, l.mbs, l.dp
                    ));
                    None
                }
            }
        }
        None => None,
    };
    let (projection, from) = match published {
        Some(found) => found,
        None => {
            let f = search::search(&mut s.projector, gpus, gbs, &space_of(flags, modules, split), 1);
            match f.best.into_iter().next() {
                Some(p) => match refused {
                    Some(why) => {
                        notes.push(format!("{why}; searched instead"));
                        (p, "the layout search (flags given are kept; the published layout does not apply)".into())
                    }
                    None if other_seq => (p, "the layout search (flags given are kept; the published layout is for another sequence length)".into()),
                    None => (p, "the layout search (flags given are kept; no published layout for this GPU count)".into()),
                },
                None => match unfit {
                    Some(u) => {
                        notes.push(format!("no layout the search tried fits either: {}", closest_families(&f.families)));
                        u
                    }
                    None => {
                        // A flag that breaks the published layout often breaks every family
                        // for the same reason: said once.
                        let same = |why: &str| {
                            !f.families.is_empty()
                                && f.families.iter().all(|x| matches!(&x.verdict, Verdict::Divisibility { reason, .. } if reason == why))
                        };
                        let search = match (&refused, &refused_for) {
                            (Some(_), Some(why)) if same(why) => match f.families.len() {
                                1 => "; the search's one layout family is refused for the same reason".to_string(),
                                n => format!("; the search's {n} layout families are refused for the same reason"),
                            },
                            (Some(_), _) => format!("; and the search: {}", closest_families(&f.families)),
                            (None, _) => closest_families(&f.families),
                        };
                        anyhow::bail!(
                            "{} does not run on {gpus} {} at GBS {gbs}: {}{search}",
                            t.model,
                            s.projector.gpu.name,
                            refused.unwrap_or_default(),
                        )
                    }
                },
            }
        }
    };
    if let Some(m) = &measured {
        m.file.check_key(&m.origin, projection.layout.key()).map_err(anyhow::Error::msg)?;
        let counts: Vec<String> = m.file.counts().iter().map(|(k, n)| format!("{n} {k}")).collect();
        notes.push(format!(
            "measured on {} at {} ({}): {} ops replace the roofline ({}); the rest of the step keeps the model",
            m.file.device,
            m.file.measured_at,
            m.origin,
            m.file.ops.len(),
            counts.join(", ")
        ));
        if !m.unmeasured.is_empty() {
            const SHOWN: usize = 5;
            let more = m.unmeasured.len().saturating_sub(SHOWN);
            notes.push(format!(
                "{} lacks {} of the rank graph that `runner measure` times: {}{}; they keep the roofline, so the step mixes \
                 measured and modelled times: measure again to time them all",
                m.origin,
                runner::report::plural(m.unmeasured.len(), "op"),
                m.unmeasured[..m.unmeasured.len().min(SHOWN)].join(", "),
                if more > 0 { format!(" and {more} more") } else { String::new() }
            ));
        }
        notes.extend(m.file.notes.iter().map(|n| format!("{}: {n}", m.origin)));
    }
    if let Some(short) = projection.memory.shortfall() {
        let host = s.projector.gpu.host_memory_gib.is_some() && s.projector.gpu.host_link_gbs.is_some();
        let layers = s.projector.model.shape.layers;
        notes.push(format!("does not fit: {short} ({})", fit_advice(&projection.layout, projection.memory.gpu_fits(), host, layers)));
    }
    let mut projection = projection;
    let shape = &s.projector.model.shape;
    projection.pipeline_model_parallel_layout = projection.layout.pipeline_layout_needed(shape.layers, shape.mtp);
    if let Some(text) = &projection.pipeline_model_parallel_layout {
        notes.push(project::layout_string_note(&projection.layout, text));
    }
    notes.extend(kv_replication_note(projection.layout.tp, shape));
    let convention = runner_graph::count::Convention::CAUSAL;
    let all_keys = project::all_keys_ratio(&s.projector.model.graph);
    notes.push(project::flops_note(&convention, all_keys, s.projector.model.seq_len));
    let format = s.recipe.format();
    let peak = s.projector.gpu.peak_flops(format).map_err(anyhow::Error::msg)?;
    let out = ProjectOut {
        flop_convention: convention.to_string(),
        mfu_peak_format: format.name().to_uppercase(),
        mfu_peak_tflops: peak / 1e12,
        mfu_all_keys: projection.mfu * all_keys,
        model: t.model.clone(),
        gpu: s.projector.gpu.name.clone(),
        precision: s.recipe.name().into(),
        plan: s.projector.plan.source.clone(),
        layout_from: from,
        projection,
        measured: measured.map(|m| MeasuredOut {
            device: m.file.device,
            measured_at: m.file.measured_at,
            ops: m.file.ops.into_iter().map(|o| o.name).collect(),
            file: m.origin,
        }),
        notes,
    };
    let table = project_table(&out);
    emit_rendered(global, &|f| match f {
        OutputFormat::Csv => project_csv(&out, &table.notes).csv(),
        f => runner::report::render(f, &table, &out),
    })
}

/// The projection as CSV: a `field,value` row per value of its JSON, named by its path
/// there (`memory.weights`, `comm.groups.0.ranks`) and written as the JSON writes it, so a
/// script reads the same numbers either way; the table's cells carried units ("12.7 s",
/// "53.7 %") and indented labels. The notes stay `#` lines, as in every CSV.
fn project_csv(o: &ProjectOut, notes: &[String]) -> Table {
    let mut t = Table::new("", &["field", "value"]);
    if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(o) {
        for (k, v) in fields.iter().filter(|(k, _)| k.as_str() != "notes") {
            json_rows(k, v, &mut t.rows);
        }
    }
    t.notes = notes.to_vec();
    t
}

/// `(path, value)` rows for every scalar under `v`, list items by their index.
fn json_rows(path: &str, v: &serde_json::Value, rows: &mut Vec<Vec<String>>) {
    use serde_json::Value;
    match v {
        Value::Object(m) => m.iter().for_each(|(k, v)| json_rows(&format!("{path}.{k}"), v, rows)),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, v)| json_rows(&format!("{path}.{i}"), v, rows)),
        Value::String(s) => rows.push(vec![path.into(), s.clone()]),
        Value::Null => rows.push(vec![path.into(), String::new()]),
        scalar => rows.push(vec![path.into(), scalar.to_string()]),
    }
}

/// What to tell a user who asked for a tp past the kv heads: the search never offers it
/// (search.rs), and Megatron cannot build it; priced as the runner's executor runs it.
/// A projection of GPUs that fill no whole number of nodes: it is projected as asked
/// (its step time does not depend on billing), where `explore` rounds up to whole nodes
/// as they are billed; said, so the two commands' counts are not read as one rule.
fn partial_node_note(gpus: u32, node: u32, gpu: &str) -> Option<String> {
    let node = node.max(1);
    (!gpus.is_multiple_of(node)).then(|| {
        format!(
            "{} on {gpu}, whose nodes hold {node}: projected as asked (`runner explore` rounds up to {}, as nodes are billed)",
            runner::report::plural(gpus, "GPU"),
            gpus.div_ceil(node).saturating_mul(node)
        )
    })
}

/// What would make a layout that does not fit fit, naming only what it does not
/// already use: the user who gave `--recompute full --fsdp` is not told to add them.
/// `gpu_fits` false: GPU memory is short; true: host memory (offloaded activations) is.
/// `host`: whether the GPU's profile has the host memory that offloading needs.
fn fit_advice(l: &LayoutSpec, gpu_fits: bool, host: bool, layers: u32) -> String {
    if gpu_fits {
        // Only the offloaded activations miss: fewer of them, or more GPUs to spread them.
        return "try fewer --offload-layers, or more GPUs".into();
    }
    let mut tries = Vec::new();
    if l.recompute != RecomputePolicy::Full {
        tries.push("--recompute full".to_string());
    }
    // FSDP shards the weights over the data-parallel ranks: nothing to shard over at DP 1.
    if !l.fsdp && l.dp > 1 {
        tries.push("--fsdp".into());
    }
    // More model parallelism at this GPU count takes it from the data-parallel ranks.
    if l.dp > 1 {
        tries.push("more --tp or --pp".into());
    }
    let chunk = layers.div_ceil(l.pp.max(1) * l.vp.max(1));
    if host && l.offload_layers < chunk {
        tries.push(if l.offload_layers == 0 { "--offload-layers".into() } else { "more --offload-layers".into() });
    }
    // At DP 1 nothing more can be split at this GPU count.
    if l.dp == 1 || tries.is_empty() {
        tries.push("more GPUs".into());
    }
    let last = tries.pop().unwrap_or_default();
    if tries.is_empty() { format!("try {last}") } else { format!("try {}, or {last}", tries.join(", ")) }
}

fn kv_replication_note(tp: u32, shape: &Shape) -> Option<String> {
    let kv = shape.kv_replicated(tp)?;
    let tp = u64::from(tp);
    Some(format!(
        "tp={tp} exceeds the {kv} kv heads: priced with each kv head replicated on {} tp ranks, as this runner's \
         executor runs it; Megatron-Core's attention divides the kv heads (num_query_groups) by tp, so NeMo and \
         Megatron-Bridge cannot run this layout (a tp dividing {kv} can)",
        tp / kv
    ))
}

fn project_table(o: &ProjectOut) -> Table {
    let p = &o.projection;
    let b = &p.breakdown;
    let m = &p.memory;
    let mut t = Table::new(format!("{} on {} {}, {}: {}", o.model, p.gpus, o.gpu, o.precision, p.layout.short()), &["", "value"]);
    let mut kv = |k: &str, v: String| t.rows.push(vec![k.to_string(), v]);
    kv("step time", format!("{} s", sig(p.step_time_s, 3)));
    kv("tokens/s/GPU", format!("{:.0}", p.tokens_per_sec_per_gpu));
    kv("model TFLOP/s/GPU", sig(p.model_tflops_per_gpu, 1));
    kv("MFU", format!("{:.1} %", 100.0 * p.mfu));
    // The convention is in the notes; the peak and NVIDIA's count are beside the figure, so
    // 48 % here is not read against a README's 52 % for the same speed (F5).
    kv("  of the dense peak", format!("{} {:.0} TFLOP/s", o.mfu_peak_format, o.mfu_peak_tflops));
    kv("  attention over all keys", format!("{:.1} %", 100.0 * o.mfu_all_keys));
    // `{}`: a capacity read from the device (79.65 GiB) is not rounded up to what it lacks.
    kv("memory/GPU", format!("{} of {} GiB ({})", sig(m.total, 1), m.capacity, if p.fits { "fits" } else { "does not fit" }));
    kv("  weights / grads / optimizer", format!("{} / {} / {} GiB", sig(m.weights, 1), sig(m.gradients, 1), sig(m.optimizer, 1)));
    kv("  activations / reserved", format!("{} / {} GiB ({})", sig(m.activations, 1), sig(m.reserved, 1), pipeline_rank(&p.layout, m.stage)));
    if m.host_offload > 0.0 {
        kv("  offloaded to host", format!("{} of {:.0} GiB host memory per GPU", sig(m.host_offload, 1), m.host_capacity));
    }
    kv("micro-batches", p.micro_batches.to_string());
    let parts = &b.compute_parts;
    let scans = [("  Mamba scans", parts.scan)];
    for (k, v) in [
        ("compute", b.compute),
        ("  GEMMs", parts.gemm),
        ("  attention", parts.attention),
    ]
    .into_iter()
    // A model without Mamba layers has no scan line.
    .chain(scans.into_iter().filter(|s| s.1 > 0.0))
    .chain([
        ("  memory-bound, casts", b.other_compute()),
        ("recompute", b.recompute),
        ("exposed TP comm", b.tp),
        ("exposed CP comm", b.cp),
        ("exposed EP comm", b.ep),
        ("exposed PP comm", b.pp),
        ("exposed DP comm", b.dp),
        ("pipeline bubble", b.bubble),
        ("optimizer", b.optimizer),
        ("exposed activation offload", b.offload),
        ("waiting for stragglers", b.straggler),
    ]) {
        kv(&format!("  {k}"), format!("{} s ({:.1} %)", sig(v, 3), 100.0 * v / p.step_time_s));
    }
    // Each group's traffic in all (the breakdown shows what is exposed) and its link.
    let c = &p.comm;
    if !c.groups.is_empty() {
        kv("communication in all", String::new());
    }
    for g in &c.groups {
        let (name, all) = match g.group {
            GroupName::Tp => ("TP", Some(c.tp)),
            GroupName::Cp => ("CP", Some(c.cp)),
            GroupName::Ep => ("EP", Some(c.ep)),
            GroupName::Etp => ("ETP", None),
            GroupName::Pp => ("PP", Some(c.pp)),
            GroupName::Dp => ("DP", Some(c.dp)),
            GroupName::Edp => ("expert DP", None),
        };
        let link = match g.fabric {
            Link::ScaleUp => "NVLink".to_string(),
            Link::ScaleOut => format!("NICs ({} per NVLink domain)", g.per_domain),
        };
        let time = match (all, g.group) {
            (Some(all), _) => format!("{} s", sig(all, 3)),
            (None, GroupName::Etp) => "in EP's".into(),
            (None, _) => "in DP's".into(),
        };
        let ranks = match (g.group, p.layout.pipeline) {
            (GroupName::Pp, PipelineKind::DualPipeV) => format!("{}, {}", runner::report::plural(g.ranks, "rank"), runner::report::plural(2 * g.ranks, "stage")),
            (GroupName::Pp, _) => runner::report::plural(g.ranks, "stage"),
            _ => runner::report::plural(g.ranks, "GPU"),
        };
        kv(&format!("  {name} ({ranks})"), format!("{time}, {link}"));
    }
    t.notes = o.notes.clone();
    t.notes.insert(0, format!("layout from {}", o.layout_from));
    t
}

/// Pipeline rank `r` as the memory line names it: a stage under 1F1B; under DualPipe and
/// DualPipeV a rank holds two stages, and the line says which.
fn pipeline_rank(l: &LayoutSpec, r: u32) -> String {
    let stages = l.pipeline.chunks(l.pp, 1);
    match l.pipeline {
        PipelineKind::OneFOneB => format!("stage {r}"),
        _ => format!("rank {r}: stages {r} and {}", stages.saturating_sub(r.saturating_add(1))),
    }
}

fn space_of(f: &LayoutFlags, recompute_modules: Option<Modules>, split: Option<PipelineSplit>) -> Space {
    Space {
        tp: f.tp,
        pp: f.pp,
        cp: f.cp,
        vp: f.vp,
        ep: f.ep,
        etp: f.etp,
        mbs: f.mbs,
        fsdp: if f.fsdp { Some(true) } else { f.no_fsdp.then_some(false) },
        recompute: policy(f.recompute.as_deref()),
        recompute_layers: f.recompute_layers,
        recompute_modules,
        ep_overlap: f.no_ep_overlap.then_some(false),
        split,
        offload_layers: f.offload_layers,
        optimizer: f.optimizer.unwrap_or_default(),
        kernels: f.kernels(),
        pipeline: f.pipeline_schedule.unwrap_or_default(),
    }
}

/// Why each family but the best lost, in the search's order; families that lost for the
/// same reason share one note (a DualPipe search at 2,048 GPUs printed twelve notes that
/// a family without a pipeline "lost on divisibility: DualPipe needs an even pp").
fn lost_notes(gpus: u32, families: &[search::Family]) -> Vec<String> {
    let mut lost: Vec<(Vec<&str>, String)> = Vec::new();
    for fam in families {
        if !matches!(fam.verdict, Verdict::Best { .. }) {
            let why = verdict_text(&fam.verdict);
            match lost.iter_mut().find(|(_, w)| *w == why) {
                Some((names, _)) => names.push(&fam.name),
                None => lost.push((vec![&fam.name], why)),
            }
        }
    }
    lost.into_iter().map(|(names, why)| format!("{gpus} GPUs, {} lost on {why}", names.join(", "))).collect()
}

pub fn search(t: &Target, gpus: &[u32], top: usize, flags: &LayoutFlags, global: &Global) -> Result<()> {
    // A count given twice was searched twice, its layouts and notes printed twice; it is
    // refused, as explore and run files refuse it.
    input::refuse_repeated_gpu_counts("--gpus", gpus).map_err(anyhow::Error::msg)?;
    let mut s = setup(t, global)?;
    let t = &s.named(t);
    let mut flags = flags.clone();
    flags.refuse_moe_flags_without_experts(&t.model, s.projector.model.shape.experts)?;
    let split = flags.split(s.projector.model.depth.len())?;
    flags.optimizer = Some(project::optimizer(flags.optimizer, &s.found.variant, &mut s.notes));
    let flags = &flags;
    let space = space_of(flags, modules_of(flags)?, split);
    let mut notes = std::mem::take(&mut s.notes);
    let mut all: Vec<Found> = Vec::new();
    let mut table = Table::new(
        format!("layouts of {} on {} ({}), best first", t.model, s.projector.gpu.name, s.recipe),
        &["GPUs", "rank", "layout", "step s", "tok/s/GPU", "MFU", "GiB"],
    );
    if let Some(tp) = space.tp {
        notes.extend(kv_replication_note(tp, &s.projector.model.shape));
    }
    for &n in gpus {
        let gbs = gbs_for(&s, t, n, &mut notes);
        progress_line(global, &format!("searching {n} GPUs"));
        let started = std::time::Instant::now();
        let f = search::search(&mut s.projector, n, gbs, &space, top);
        let took = started.elapsed().as_secs_f64();
        if f.best.is_empty() {
            // Memory is the usual reason; where no family got as far as a projection, the
            // layouts asked for do not exist at this count (the notes say why).
            let projected = f.families.iter().any(|fam| !matches!(fam.verdict, Verdict::Divisibility { .. }));
            let why = if projected { "nothing fits" } else { "no valid layout (notes)" };
            table.rows.push(vec![n.to_string(), "-".into(), why.into(), "-".into(), "-".into(), "-".into(), "-".into()]);
        }
        for (i, p) in f.best.iter().enumerate() {
            if let Some(text) = &p.pipeline_model_parallel_layout {
                notes.push(format!("{n} GPUs, rank {}: {}", i + 1, project::layout_string_note(&p.layout, text)));
            }
            table.rows.push(vec![
                n.to_string(),
                (i + 1).to_string(),
                p.layout.short(),
                sig(p.step_time_s, 3),
                format!("{:.0}", p.tokens_per_sec_per_gpu),
                format!("{:.1}%", 100.0 * p.mfu),
                sig(p.memory_per_gpu_gib, 1),
            ]);
        }
        notes.extend(lost_notes(n, &f.families));
        notes.extend(f.not_tried.iter().map(|w| format!("{n} GPUs: {w}")));
        notes.push(format!("{n} GPUs: {} layouts evaluated in {:.0} ms (GBS {gbs})", f.evaluated, took * 1e3));
        all.push(f);
    }
    notes.dedup();
    let all_keys = project::all_keys_ratio(&s.projector.model.graph);
    notes.push(project::flops_note(&runner_graph::count::Convention::CAUSAL, all_keys, s.projector.model.seq_len));
    table.notes = notes;
    emit_rendered(global, &|f| match f {
        OutputFormat::Csv => search_csv(&all, &table.notes).csv(),
        f => runner::report::render(f, &table, &all),
    })
}

/// The search as CSV: a row per layout found, its figures as the JSON writes them under
/// the JSON's names (the table's were "12.7" seconds and "53.7%"). A count where no layout
/// fits has no row; the notes (`#` lines) say why.
fn search_csv(all: &[Found], notes: &[String]) -> Table {
    const FIGURES: [&str; 6] = ["step_time_s", "tokens_per_sec_per_gpu", "model_tflops_per_gpu", "mfu", "memory_per_gpu_gib", "fits"];
    let mut t = Table::new("", &[&["gpus", "global_batch", "rank", "layout"][..], &FIGURES[..]].concat());
    for f in all {
        for (i, p) in f.best.iter().enumerate() {
            let json = serde_json::to_value(p).unwrap_or_default();
            let mut row = vec![f.gpus.to_string(), f.global_batch.to_string(), (i + 1).to_string(), p.layout.short()];
            row.extend(FIGURES.iter().map(|k| json.get(k).map(ToString::to_string).unwrap_or_default()));
            t.rows.push(row);
        }
    }
    t.notes = notes.to_vec();
    t
}

pub fn validate(file: &Path, global: &Global) -> Result<()> {
    let text = input::read_text(file, "calibration file", input::TEXT_LIMIT).map_err(anyhow::Error::msg)?;
    let points = published::parse(&text, &file.display().to_string()).map_err(anyhow::Error::msg)?;
    let profiles = project::profiles(global.profile.as_deref())?;
    let mut resolver = PluginResolver { limits: Limits::default() };
    let v = published::validate(&points, &profiles, &mut resolver, &|m| progress_line(global, m));
    let table = validation_table(&v, &file.display().to_string());
    // The CSV: a row per projected point under the JSON's names (`checked`: seconds,
    // tokens/s and the error as a fraction, unrounded); the table's "+2.0%" is for people.
    let mut csv = runner::report::records(&v.checked);
    csv.notes = table.notes.clone();
    emit_rendered(global, &|f| match f {
        OutputFormat::Csv => csv.csv(),
        OutputFormat::Html => runner::report::validation::html(&v, &table),
        f => runner::report::render(f, &table, &v),
    })?;
    // Printed with every point's reason; the exit status tells a script nothing was checked.
    if v.checked.is_empty() {
        anyhow::bail!("no point of {} could be projected (the reasons are above)", file.display());
    }
    Ok(())
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// The validation as one table: every projected point, then the statistics and the
/// unsupported points as notes.
pub fn validation_table(v: &Validation, origin: &str) -> Table {
    let mut t = Table::new(
        format!("projection vs published step time ({origin})"),
        &["#", "model", "GPU", "prec", "GPUs", "layout", "published s", "predicted s", "error", "tok/s/GPU pub", "pred"],
    );
    for c in &v.checked {
        t.rows.push(vec![
            c.index.to_string(),
            c.model.clone(),
            c.gpu.clone(),
            c.precision.clone(),
            c.gpus.to_string(),
            c.layout.clone(),
            format!("{:.3}", c.published_step_s),
            format!("{:.3}", c.predicted_step_s),
            format!("{}%", runner::report::signed(100.0 * c.error, 1)),
            format!("{:.0}", c.published_tokens_per_sec_per_gpu),
            format!("{:.0}", c.predicted_tokens_per_sec_per_gpu),
        ]);
    }
    if v.overall.points == 0 {
        t.notes.push("no point could be projected: each one's reason is below".into());
    } else {
        t.notes.push(format!(
            "absolute step-time error over {}: median {}, p90 {}, max {}",
            runner::report::plural(v.overall.points, "point"),
            pct(v.overall.median),
            pct(v.overall.p90),
            pct(v.overall.max)
        ));
    }
    for (k, s) in &v.groups {
        t.notes.push(format!("{k}: {}, median {}, p90 {}, max {}", runner::report::plural(s.points, "point"), pct(s.median), pct(s.p90), pct(s.max)));
    }
    for c in v.checked.iter().filter(|c| !c.note.is_empty()) {
        t.notes.push(format!("#{} {}: {}", c.index, c.model, c.note));
    }
    for u in &v.unsupported {
        t.notes.push(format!("#{} {} not projected: {}", u.index, u.label, u.reason));
    }
    t
}

pub fn calibrate(file: &Path, gpu: Option<&str>, precision: Option<&str>, leave_out: Option<&str>, global: &Global) -> Result<()> {
    let text = input::read_text(file, "calibration file", input::TEXT_LIMIT).map_err(anyhow::Error::msg)?;
    let mut points = published::parse(&text, &file.display().to_string()).map_err(anyhow::Error::msg)?;
    let left_out = match leave_out {
        Some(spec) => run_numbers(spec, points.len()).map_err(|e| anyhow::anyhow!("--leave-out {spec}: {e}"))?,
        None => Vec::new(),
    };
    if !left_out.is_empty() {
        let runs = points.len();
        points = points.into_iter().enumerate().filter(|(i, _)| !left_out.contains(i)).map(|(_, p)| p).collect();
        // Every run left out read as "no supported run to fit", pointing at the runs.
        if points.is_empty() {
            anyhow::bail!("--leave-out {} leaves none of the {runs} runs of {} to fit; leave fewer out", leave_out.unwrap_or_default(), file.display());
        }
    }
    if let Some(p) = precision {
        Recipe::parse(p).map_err(|e| anyhow::anyhow!("--precision: {e}"))?;
    }
    // Fits start from the priors (or the user's file), not from the shipped fit.
    let profiles = match global.profile.as_deref() {
        Some(_) => project::profiles(global.profile.as_deref())?,
        None => runner_project::profile::Profiles::priors(),
    };
    let mut resolver = PluginResolver { limits: Limits::default() };
    let today = today();
    let label = match leave_out {
        Some(spec) if !left_out.is_empty() => format!("runner calibrate {} --leave-out {spec} on {today}", file.display()),
        _ => format!("runner calibrate {} on {today}", file.display()),
    };
    // An unknown --gpu is refused as it is; past it, the fit's one refusal is a GPU with
    // no run to fit, whose reasons `runner validate` gives.
    if let Some(g) = gpu {
        profiles.get(g).map_err(|e| anyhow::anyhow!("--gpu: {e}"))?;
    }
    let fits = calibrate::calibrate(&points, &profiles, &mut resolver, gpu.map(|g| (g, precision)), &label, &|m| {
        progress_line(global, m)
    })
    .map_err(|e| anyhow::anyhow!("{}: {e}; {}", file.display(), why_no_run(file)))?;
    if fits.is_empty() {
        anyhow::bail!("{} has no supported run to fit{}; {}", file.display(), gpu.map_or(String::new(), |g| format!(" on {g}")), why_no_run(file));
    }
    // A GPU too thinly measured to fit anything of its own would write its priors (or
    // another GPU's fit), which --profile would then put over the shipped fit.
    let why_none = format!(
        "a GEMM format's efficiency needs at least {} runs of 2 model families on the GPU type, \
         the shared parameters (GEMM size curve, attention, HBM, network) {} runs",
        calibrate::FORMAT_MIN_RUNS,
        calibrate::SHARED_MIN_RUNS
    );
    if fits.iter().all(|f| f.params.is_empty()) {
        // "H200 0" read as "no H200 run found" in a file of three: the file's own count too.
        let runs: Vec<String> = fits
            .iter()
            .map(|f| {
                let all = points.iter().filter(|p| profiles.get(&p.gpu).is_ok_and(|g| g.name == f.gpu)).count();
                format!("{}: {} of its {}", f.gpu, f.points, runner::report::plural(all, "run"))
            })
            .collect();
        anyhow::bail!(
            "{} has too few runs to fit any parameter (runs that can inform a fit, per GPU type: {}): {why_none}",
            file.display(),
            runs.join(", ")
        );
    }
    let mut t = Table::new(format!("efficiencies fitted to {}", file.display()), &["GPU", "runs", "parameter", "prior", "fitted"]);
    // The CSV: a row per fitted parameter, each naming its GPU, the figures unrounded.
    let mut csv_rows = Vec::new();
    for f in fits.iter().filter(|f| f.params.is_empty()) {
        t.notes.push(format!("{}: its runs fit nothing of its own, and a written profile leaves it out: {why_none}", f.gpu));
    }
    for f in &fits {
        for (i, (name, prior, fitted)) in f.params.iter().enumerate() {
            t.rows.push(vec![
                if i == 0 { f.gpu.clone() } else { String::new() },
                if i == 0 { f.points.to_string() } else { String::new() },
                name.clone(),
                format!("{prior:.3}"),
                format!("{fitted:.3}"),
            ]);
            csv_rows.push(runner::report::record([("gpu", json!(f.gpu)), ("runs", json!(f.points)), ("parameter", json!(name)), ("prior", json!(prior)), ("fitted", json!(fitted))]));
        }
        t.notes.push(format!(
            "{}: absolute step-time error median {} -> {}, p90 {} -> {}",
            f.gpu,
            pct(f.before.median),
            pct(f.after.median),
            pct(f.before.p90),
            pct(f.after.p90)
        ));
        if !f.borrowed.is_empty() {
            t.notes.push(format!("{}: too few runs to fit {}", f.gpu, borrowed_from(&f.borrowed)));
        }
    }
    // Only what the runs set (a GPU's own fit, with what it took from the best-measured
    // GPU to fit it): a parameter left at its prior would override the shipped fit where
    // the profile is used.
    let written: Vec<(&str, toml::Table)> = fits
        .iter()
        .filter(|f| !f.params.is_empty())
        .map(|f| (f.gpu.as_str(), runner_project::profile::Profiles::efficiency_only(&f.efficiency, &f.from_data)))
        .collect();
    let toml = runner_project::profile::Profiles::efficiency_file(&written);
    emit_profile(global, t, runner::report::records_of(&csv_rows), &toml, &fits)
}

/// Where a calibration file with no run to fit says why: each run's reason is in
/// `runner validate` (calibrate said only that none was supported).
fn why_no_run(file: &Path) -> String {
    format!("`runner validate {}` gives each run's reason (a zero or missing step time, an unknown model or GPU, a layout that does not divide)", file.display())
}

/// Run numbers (from 0) in `spec`, "40,54,104-108", each below `runs`, sorted.
fn run_numbers(spec: &str, runs: usize) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let num = |s: &str| s.trim().parse::<usize>().map_err(|_| format!("'{s}' is not a run number (runs are numbered from 0, as `runner validate` lists them)"));
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(part)?, num(part)?),
        };
        if a > b {
            return Err(format!("the range {part} runs backwards"));
        }
        if b >= runs {
            return Err(format!("run {b} is past the file's last run ({})", runs.saturating_sub(1)));
        }
        out.extend(a..=b);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// "a, b (taken from X); c (taken from Y)": the borrowed parameters grouped by the GPU
/// whose runs set them, in the order the fit took them.
fn borrowed_from(borrowed: &[(String, String)]) -> String {
    let mut donors: Vec<&str> = Vec::new();
    for (_, d) in borrowed {
        if !donors.contains(&d.as_str()) {
            donors.push(d);
        }
    }
    let parts: Vec<String> = donors
        .iter()
        .map(|d| {
            let names: Vec<&str> = borrowed.iter().filter(|(_, x)| x == d).map(|(n, _)| n.as_str()).collect();
            format!("{} (taken from {d})", names.join(", "))
        })
        .collect();
    parts.join("; ")
}

/// Print a fit; with `-o FILE.toml` write the fitted profile there (any other `-o` gets
/// the fit itself in that format).
/// `csv` is the fit for scripts (raw figures), given the table's notes.
fn emit_profile<T: Serialize>(global: &Global, mut t: Table, mut csv: Table, toml: &str, value: &T) -> Result<()> {
    match &global.output {
        Some(path) if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("toml")) => {
            crate::commands::write_atomic(path, toml.as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
            t.notes.push(format!("wrote {}: use it with --profile {}", path.display(), path.display()));
            csv.notes = t.notes.clone();
            let g = Global { output: None, ..global.clone() };
            emit_csv(&g, &t, value, &csv)
        }
        _ => {
            t.notes.push("write the fitted profile with -o FILE.toml and use it with --profile FILE.toml".into());
            csv.notes = t.notes.clone();
            emit_csv(global, &t, value, &csv)
        }
    }
}

/// What `calibrate --ops/--collectives` fitted.
#[derive(Serialize)]
struct LocalFit {
    gpu: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    ops: Option<OpsFit>,
    #[serde(skip_serializing_if = "Option::is_none")]
    collectives: Option<CollFit>,
    efficiency: Efficiency,
}

/// Fit a GPU's efficiencies to local measurements: per-op times from `runner measure`
/// (GEMM efficiency of each measured format, GEMM size at half efficiency, HBM
/// efficiency) and a `bench collectives` sweep (the network tier its ranks spanned).
/// Starts from the profile as `--profile` leaves it and changes only what was fitted.
pub fn calibrate_local(ops: Option<&Path>, coll: &[std::path::PathBuf], gpu: Option<&str>, tier: Option<&str>, global: &Global) -> Result<()> {
    let profiles = project::profiles(global.profile.as_deref())?;
    let builtin = |g: &GpuProfile| runner_project::profile::Profiles::builtin().get(&g.name).is_ok();
    let tier = tier.map(Tier::parse).transpose().map_err(|e| anyhow::anyhow!("--tier: {e}"))?;
    let mut t = Table::new("efficiencies fitted to local measurements", &["from", "parameter", "before", "fitted"]);
    let mut sources = Vec::new();
    let mut current: Option<GpuProfile> = None;
    let mut out_ops = None;
    let mut out_coll = None;
    // The CSV: a row per parameter, each naming its source, the figures unrounded.
    let mut csv_rows = Vec::new();
    let row = |t: &mut Table, csv_rows: &mut Vec<runner::report::Record>, from: &str, params: &[(String, f64, f64)]| {
        for (i, (name, before, after)) in params.iter().enumerate() {
            t.rows.push(vec![if i == 0 { from.to_string() } else { String::new() }, name.clone(), format!("{before:.4}"), format!("{after:.4}")]);
            csv_rows.push(runner::report::record([("from", json!(from)), ("parameter", json!(name)), ("before", json!(before)), ("fitted", json!(after))]));
        }
    };
    if let Some(path) = ops {
        let origin = path.display().to_string();
        let text = input::read_text(path, "--ops file", input::TEXT_LIMIT).map_err(anyhow::Error::msg)?;
        let file = OpsFile::parse(&text, &origin).map_err(anyhow::Error::msg)?;
        let g = match gpu {
            Some(name) => profiles.get(name).map_err(|e| anyhow::anyhow!("--gpu: {e}"))?,
            // The file's own GPU: one a --profile file added needs that file again.
            None => profiles.get(&file.gpu).map_err(|e| {
                anyhow::anyhow!("{origin} stands for GPU '{}' (its `gpu` field): {e}; pass the --profile FILE it was measured with", file.gpu)
            })?,
        }
        .clone();
        // The file's own statement of the GPU must agree with --gpu.
        file.check_gpu(&origin, &g).map_err(anyhow::Error::msg)?;
        measured::stands_for(&file.device, &g, builtin(&g)).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
        let fit = fit_ops(&file, &g, &origin).map_err(anyhow::Error::msg)?;
        row(&mut t, &mut csv_rows, &origin, &fit.params);
        t.notes.push(format!(
            "{origin}: {} GEMM kernel and {} memory-bound rows on {}; relative time error median {} -> {}, max {} -> {}",
            fit.gemm_rows,
            fit.memory_rows,
            file.device,
            pct(fit.before.median),
            pct(fit.after.median),
            pct(fit.before.max),
            pct(fit.after.max)
        ));
        t.notes.extend(fit.notes.iter().map(|n| format!("{origin}: {n}")));
        let mut g = g;
        g.efficiency = fit.efficiency.clone();
        sources.push(format!("--ops {origin}"));
        current = Some(g);
        out_ops = Some(fit);
    }
    if !coll.is_empty() {
        let origin = coll.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
        let g = match (&current, gpu) {
            (Some(g), _) => g.clone(),
            (None, Some(name)) => profiles.get(name).map_err(|e| anyhow::anyhow!("--gpu: {e}"))?.clone(),
            (None, None) => anyhow::bail!("--collectives {origin}: name the GPU type the sweep ran on with --gpu NAME"),
        };
        let mut files = Vec::new();
        // One file named twice would pass the check that two files measure no size twice
        // (a file's rows never clash with its own) and count every size twice.
        let mut named: Vec<(std::path::PathBuf, String)> = Vec::new();
        for path in coll {
            let origin = path.display().to_string();
            let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
            if let Some((_, first)) = named.iter().find(|(c, _)| *c == canonical) {
                let names = if *first == origin { format!("{origin} twice") } else { format!("one file twice ({first} and {origin})") };
                anyhow::bail!("--collectives names {names}: give each test's log once");
            }
            named.push((canonical, origin.clone()));
            let text = input::read_text(path, "--collectives file", input::TEXT_LIMIT).map_err(anyhow::Error::msg)?;
            files.push((origin.clone(), collectives::parse(&text, &origin).map_err(anyhow::Error::msg)?));
        }
        let rows = collectives::join(files).map_err(anyhow::Error::msg)?;
        let device = rows.first().map_or("", |r| r.device.as_str());
        measured::stands_for(device, &g, builtin(&g)).map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
        let fit = fit_collectives(&rows, &g, tier, &origin).map_err(anyhow::Error::msg)?;
        row(&mut t, &mut csv_rows, &origin, &fit.params);
        t.notes.push(format!(
            "{origin}: {} tier from {} on {} ({} per domain), {}: {:.2} GB/s per {}, {:.2} us per step; largest row error {}",
            fit.tier.name(),
            runner::report::plural(fit.ranks, "rank"),
            runner::report::plural(fit.nodes, "node"),
            fit.local,
            fit.transport,
            fit.pooled.gbs,
            if fit.tier == Tier::ScaleUp { "GPU" } else { "NIC" },
            fit.pooled.latency_us,
            pct(fit.pooled.max_error)
        ));
        for l in &fit.per_op {
            t.notes.push(format!("{origin}: {} alone: {:.2} GB/s, {:.2} us per step ({} sizes)", l.op, l.gbs, l.latency_us, l.rows));
        }
        t.notes.extend(fit.notes.iter().map(|n| format!("{origin}: {n}")));
        let mut g = g;
        g.efficiency = fit.efficiency.clone();
        sources.push(format!("--collectives {origin}"));
        current = Some(g);
        out_coll = Some(fit);
    }
    let Some(mut g) = current else {
        anyhow::bail!("nothing to fit: give --ops FILE (from runner measure) and/or --collectives FILE (from runner bench collectives)");
    };
    g.efficiency.fitted = format!("runner calibrate {} on {}, over: {}", sources.join(" "), today(), g.efficiency.fitted);
    t.title = format!("{} efficiencies fitted to local measurements", g.name);
    // A built-in GPU needs only its new efficiencies; a GPU the user's file added needs
    // its whole table, so that the written file works alone with --profile.
    let toml = if runner_project::profile::Profiles::builtin().get(&g.name).is_ok() {
        runner_project::profile::Profiles::efficiency_file(&[(g.name.as_str(), &g.efficiency)])
    } else {
        #[derive(Serialize)]
        struct Whole<'a> {
            gpu: [&'a GpuProfile; 1],
        }
        toml::to_string(&Whole { gpu: [&g] }).context("the fitted profile as TOML")?
    };
    let out = LocalFit { gpu: g.name.clone(), ops: out_ops, collectives: out_coll, efficiency: g.efficiency.clone() };
    emit_profile(global, t, runner::report::records_of(&csv_rows), &toml, &out)
}

/// Today's date (UTC) as YYYY-MM-DD, for the calibration label.
fn today() -> String {
    runner_store::now().chars().take(10).collect()
}

/// Leave-one-family-out: the error a model family the fit never saw gets; with `gpu`
/// (and `precision`), of that GPU's runs (of that precision) alone.
pub fn holdout(file: &Path, gpu: Option<&str>, precision: Option<&str>, global: &Global) -> Result<()> {
    let text = input::read_text(file, "calibration file", input::TEXT_LIMIT).map_err(anyhow::Error::msg)?;
    let points = published::parse(&text, &file.display().to_string()).map_err(anyhow::Error::msg)?;
    if let Some(p) = precision {
        Recipe::parse(p).map_err(|e| anyhow::anyhow!("--precision: {e}"))?;
    }
    let profiles = match global.profile.as_deref() {
        Some(_) => project::profiles(global.profile.as_deref())?,
        None => runner_project::profile::Profiles::priors(),
    };
    // An unknown --gpu is refused as calibrate refuses it, before anything is projected.
    if let Some(g) = gpu {
        profiles.get(g).map_err(|e| anyhow::anyhow!("--gpu: {e}"))?;
    }
    let mut resolver = PluginResolver { limits: Limits::default() };
    progress_line(global, "fitting with each family held out");
    let held = calibrate::cross_validate(&points, &profiles, &mut resolver, gpu.map(|g| (g, precision)))
        .map_err(|e| anyhow::anyhow!("{}: {e} to hold out; {}", file.display(), why_no_run(file)))?;
    // Which runs were held out, for the messages and the title: "H100's FP8 runs".
    let of = match (gpu.and_then(|g| profiles.get(g).ok()), precision) {
        (Some(g), Some(p)) => format!(" of {}'s {} runs", g.name, p.to_uppercase()),
        (Some(g), None) => format!(" of {}'s runs", g.name),
        _ => String::new(),
    };
    if held.iter().all(|h| h.errors.is_empty()) {
        anyhow::bail!(
            "{}: no model family{of} could be held out: each needs runs of at least one other family on the same GPU to fit without it ({} runs in the file); add runs of more families, or fit them all with `runner calibrate FILE`",
            file.display(),
            points.len()
        );
    }
    let mut t = Table::new(
        format!("held-out error per model family{of} ({}): fit on the other families of the same GPU", file.display()),
        &["GPU", "family held out", "runs", "median", "max"],
    );
    let mut all = Vec::new();
    // The CSV: the table's figures unrounded, the errors as fractions (the table's "3.1%").
    let mut csv_rows = Vec::new();
    for h in &held {
        let s = published::Stats::of(h.errors.iter().copied());
        all.extend(h.errors.iter().copied());
        t.rows.push(vec![h.gpu.clone(), h.family.clone(), s.points.to_string(), pct(s.median), pct(s.max)]);
        csv_rows.push(runner::report::record([("gpu", json!(h.gpu)), ("family", json!(h.family)), ("runs", json!(s.points)), ("median_error", json!(s.median)), ("max_error", json!(s.max))]));
    }
    let s = published::Stats::of(all.into_iter());
    t.notes.push(format!("all held-out runs: {}, median {}, p90 {}, max {}", runner::report::plural(s.points, "point"), pct(s.median), pct(s.p90), pct(s.max)));
    let mut csv = runner::report::records_of(&csv_rows);
    csv.notes = t.notes.clone();
    emit_csv(global, &t, &held, &csv)
}

#[derive(Serialize)]
struct SearchBench {
    model: String,
    gpu: String,
    gpus: u32,
    layouts: u64,
    /// Loading the plugin and reading the model's graph.
    load_ms: f64,
    cold_ms: f64,
    warm_median_ms: f64,
    warm_layouts_per_s: f64,
    cold_layouts_per_s: f64,
}

/// How fast the layout search is: one cold search (graphs read, every sharding built
/// and timed) and `repeats` warm ones (schedules only).
pub fn bench_search(model: &str, gpu: &str, gpus: u32, precision: &str, repeats: usize, global: &Global) -> Result<()> {
    let t = Target { model: model.into(), gpu: gpu.into(), precision: precision.into(), seq_len: None, gbs: None, peft: "none".into(), lora_rank: None, lora_targets: None };
    let load = std::time::Instant::now();
    let mut s = setup(&t, global)?;
    let load_ms = load.elapsed().as_secs_f64() * 1e3;
    let mut notes = Vec::new();
    let gbs = gbs_for(&s, &t, gpus, &mut notes);
    let started = std::time::Instant::now();
    let first = search::search(&mut s.projector, gpus, gbs, &Space::default(), 1);
    let cold = started.elapsed().as_secs_f64();
    let mut warm: Vec<f64> = (0..repeats.max(1))
        .map(|_| {
            let t0 = std::time::Instant::now();
            let _ = search::search(&mut s.projector, gpus, gbs, &Space::default(), 1);
            t0.elapsed().as_secs_f64()
        })
        .collect();
    warm.sort_by(f64::total_cmp);
    let median = warm[warm.len() / 2];
    let out = SearchBench {
        model: model.into(),
        gpu: s.projector.gpu.name.clone(),
        gpus,
        layouts: first.evaluated,
        load_ms,
        cold_ms: cold * 1e3,
        warm_median_ms: median * 1e3,
        warm_layouts_per_s: first.evaluated as f64 / median,
        cold_layouts_per_s: first.evaluated as f64 / cold,
    };
    let mut table = Table::new(
        format!("layout search: {model} on {gpus} {}, {precision}, GBS {gbs}", out.gpu),
        &["layouts", "load ms", "cold ms", "warm ms (median)", "layouts/s cold", "layouts/s warm"],
    );
    table.rows.push(vec![
        out.layouts.to_string(),
        format!("{:.1}", out.load_ms),
        format!("{:.1}", out.cold_ms),
        format!("{:.1}", out.warm_median_ms),
        format!("{:.0}", out.cold_layouts_per_s),
        format!("{:.0}", out.warm_layouts_per_s),
    ]);
    table.notes.push(format!(
        "load: the workload plugin loaded and the full graph read; cold: the search with graphs per micro-batch read, each (tp, cp, ep, etp, mbs) sharding built and timed; warm: the schedules over cached timings ({} runs)",
        warm.len()
    ));
    if let Some(best) = first.best.first() {
        table.notes.push(format!("best: {} at {:.3} s per step", best.layout.short(), best.step_time_s));
    }
    emit_csv(global, &table, &out, &runner::report::records(&[&out]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dense layout on `dp` data-parallel ranks, nothing set that saves memory.
    fn plain(dp: u32) -> LayoutSpec {
        LayoutSpec::dense(1, 1, 1, 1, dp, 1, 64)
    }

    /// "Does not fit" names only what the layout does not already use: `--recompute full
    /// --fsdp` was told to try `--recompute full` and `--fsdp`. Kills: either check of
    /// what is set dropped, more GPUs never or always offered, offload offered without
    /// host memory.
    #[test]
    fn the_fit_advice_names_only_what_is_not_in_use() {
        assert_eq!(fit_advice(&plain(8), false, false, 80), "try --recompute full, --fsdp, or more --tp or --pp");
        let set = LayoutSpec { recompute: RecomputePolicy::Full, fsdp: true, ..plain(8) };
        assert_eq!(fit_advice(&set, false, true, 80), "try more --tp or --pp, or --offload-layers");
        assert_eq!(fit_advice(&set, false, false, 80), "try more --tp or --pp");
        // Nothing left to split at DP 1: more GPUs, whatever else is named.
        let one = LayoutSpec { recompute: RecomputePolicy::Selective, ..plain(1) };
        assert_eq!(fit_advice(&one, false, false, 80), "try --recompute full, or more GPUs");
        let maxed = LayoutSpec { recompute: RecomputePolicy::Full, offload_layers: 80, ..plain(1) };
        assert_eq!(fit_advice(&maxed, false, true, 80), "try more GPUs");
        assert_eq!(fit_advice(&LayoutSpec { offload_layers: 10, ..maxed }, false, true, 80), "try more --offload-layers, or more GPUs");
        assert_eq!(fit_advice(&maxed, true, true, 80), "try fewer --offload-layers, or more GPUs");
    }

    /// A projection of GPUs that fill no whole node says it is projected as asked.
    #[test]
    fn a_partial_node_is_said() {
        assert_eq!(partial_node_note(16, 8, "H100"), None);
        assert_eq!(
            partial_node_note(12, 8, "H100").as_deref(),
            Some("12 GPUs on H100, whose nodes hold 8: projected as asked (`runner explore` rounds up to 16, as nodes are billed)")
        );
        assert!(partial_node_note(1, 8, "H100").unwrap().starts_with("1 GPU on H100,"));
    }

    /// Layout degrees and the micro-batch on the command line follow the run file's rule
    /// (they took any u32: `--mbs 4000000000` reached the plugin's graph and was reported
    /// as the plugin's invalid value).
    #[test]
    fn layout_flags_take_the_run_files_range() {
        assert_eq!(layout_way("8"), Ok(8));
        assert_eq!(layout_way("1048576"), Ok(1048576));
        assert_eq!(layout_way("1048577").unwrap_err(), "1048577 is not in 1..=1048576");
        assert_eq!(layout_way("0").unwrap_err(), "0 is not in 1..=1048576");
        assert_eq!(layout_way("x").unwrap_err(), "'x' is not a whole number");
        assert_eq!(layout_way("4294967297").unwrap_err(), "4294967297 is not in 1..=1048576");
    }

    /// `--leave-out`: single runs and inclusive ranges, spaces and empty parts ignored,
    /// sorted and each once; the last run is the file's last, the first past it refused.
    #[test]
    fn leave_out_takes_runs_and_inclusive_ranges_sorted_and_once() {
        assert_eq!(run_numbers(" 7, 3-5 ,,4, 9-9,0", 10), Ok(vec![0, 3, 4, 5, 7, 9]));
        assert_eq!(run_numbers("2 - 3", 4), Ok(vec![2, 3]));
        assert_eq!(run_numbers("", 4), Ok(vec![]));
        assert_eq!(run_numbers("10", 10), Err("run 10 is past the file's last run (9)".into()));
        assert_eq!(run_numbers("8-10", 10), Err("run 10 is past the file's last run (9)".into()));
        assert_eq!(run_numbers("4-3", 10), Err("the range 4-3 runs backwards".into()));
        assert!(run_numbers("1-x", 10).unwrap_err().starts_with("'x' is not a run number"));
    }

    /// Families that lost for one reason share a note, in the order the search lists them;
    /// the best family has none, and a family that lost otherwise keeps its own.
    #[test]
    fn families_that_lost_for_one_reason_share_a_note() {
        let fam = |name: &str, verdict: Verdict| search::Family { name: name.into(), verdict };
        let odd = || Verdict::Divisibility { reason: "pp odd".into(), kind: search::Refusal::Other };
        let families = [
            fam("TP+PP", Verdict::Best { layout: "a".into(), step_time_s: 1.0 }),
            fam("DP", odd()),
            fam("TP+DP", Verdict::Speed { layout: "b".into(), step_time_s: 2.0, slower: 2.0 }),
            fam("CP+DP", odd()),
            fam("EP+DP", Verdict::Divisibility { reason: "gbs".into(), kind: search::Refusal::Other }),
        ];
        assert_eq!(
            lost_notes(8, &families),
            vec![
                "8 GPUs, DP, CP+DP lost on divisibility: pp odd",
                "8 GPUs, TP+DP lost on speed: 2.00x slower at best (b)",
                "8 GPUs, EP+DP lost on divisibility: gbs",
            ]
        );
    }

    /// Borrowed parameters are grouped by the GPU that set them, in the order first taken.
    #[test]
    fn borrowed_parameters_are_grouped_by_their_donor_in_order() {
        let b = |n: &str, d: &str| (n.to_string(), d.to_string());
        let borrowed = [b("a", "H100"), b("b", "B200"), b("c", "H100")];
        assert_eq!(borrowed_from(&borrowed), "a, c (taken from H100); b (taken from B200)");
        assert_eq!(borrowed_from(&[]), "");
    }

    /// Why nothing ran: the first three families as ranked, and a count of the rest.
    #[test]
    fn closest_families_shows_three_and_counts_the_rest() {
        let fam = |i: usize| search::Family { name: format!("f{i}"), verdict: Verdict::Divisibility { reason: format!("r{i}"), kind: search::Refusal::Other } };
        assert!(closest_families(&[]).starts_with("no layout family applies"));
        let three: Vec<_> = (0..3).map(fam).collect();
        assert_eq!(closest_families(&three), "f0: divisibility: r0; f1: divisibility: r1; f2: divisibility: r2");
        let five: Vec<_> = (0..5).map(fam).collect();
        assert_eq!(
            closest_families(&five),
            "f0: divisibility: r0; f1: divisibility: r1; f2: divisibility: r2; and 2 more families (`runner search` lists each)"
        );
        // One reason for every family is given once, with the families' names.
        let same = |i: usize| search::Family { name: format!("f{i}"), verdict: Verdict::Divisibility { reason: "r".into(), kind: search::Refusal::Other } };
        assert_eq!(closest_families(&[same(0), same(1)]), "f0, f1: divisibility: r");
        assert!(closest_families(&(0..4).map(fam).collect::<Vec<_>>()).ends_with("; and 1 more family (`runner search` lists each)"));
        let nine: Vec<_> = (0..9).map(same).collect();
        assert_eq!(closest_families(&nine), "f0, f1, f2 and 6 more: divisibility: r");
        // Shared reasons group wherever their families rank; groups past three are counted.
        let mixed: Vec<_> = [0, 1, 0, 2, 3, 4, 3].into_iter().enumerate().map(|(i, r)| search::Family { name: format!("f{i}"), verdict: Verdict::Divisibility { reason: format!("r{r}"), kind: search::Refusal::Other } }).collect();
        assert_eq!(
            closest_families(&mixed),
            "f0, f2: divisibility: r0; f1: divisibility: r1; f3: divisibility: r2; and 3 more families (`runner search` lists each)"
        );
    }

    /// A loss under 10 % reads in percent; from 10 % as a factor.
    #[test]
    fn a_near_tie_reads_in_percent_and_a_clear_loss_as_a_factor() {
        let speed = |slower: f64| verdict_text(&Verdict::Speed { layout: "L".into(), step_time_s: 1.0, slower });
        assert_eq!(speed(1.05), "speed: 5.0 % slower at best (L)");
        assert_eq!(speed(1.1), "speed: 1.10x slower at best (L)");
        assert_eq!(speed(2.5), "speed: 2.50x slower at best (L)");
        let mem = Verdict::Memory { layout: "L".into(), need_gib: 90.4, have_gib: 80.0 };
        assert_eq!(verdict_text(&mem), "memory: needs at least 90 GiB of 80 (L)");
        let best = Verdict::Best { layout: "L".into(), step_time_s: 1.234 };
        assert_eq!(verdict_text(&best), "best (L, 1.23 s)");
    }
}
