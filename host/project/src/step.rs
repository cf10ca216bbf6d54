//! A training step composed from its parts: the per-layer costs of a [`Template`]
//! timed under a precision [`Plan`] on a device ([`Costed`]), then a [`Schedule`]
//! (pipeline stages and virtual chunks, data parallelism, gradient accumulation,
//! recompute, distributed optimizer or FSDP, overlaps) turned into a step time, its
//! breakdown and the memory each GPU needs ([`Costed::evaluate`]).
//!
//! The schedule model (Narayanan et al. 2021, Korthikanti et al. 2022; Megatron-LM):
//! - Layers split into pp·vp chunks as `runner_graph::shard` splits them (the first
//!   chunks take one layer more); chunk c runs on stage c mod pp; the embedding side
//!   runs on the first stage, the head side on the last.
//! - 1F1B with m = GBS/(mbs·dp) micro-batches: m × the slowest stage's micro-batch time,
//!   plus the fill and drain bubble (pp−1)/vp × the mean stage time.
//! - Per micro-batch and stage, each chunk sends its activations forward and its input
//!   gradients back; overlapped as overlap_p2p_comm overlaps them except for the fill and
//!   drain, whose sends are on the critical path.
//! - Data-parallel gradients (BF16 as NVIDIA's performance recipes reduce them, or fp32
//!   with `grad_fp32`) over the dp·cp ranks holding the same dense weights, and the expert-data-parallel ranks for experts: an all-reduce,
//!   or with the distributed optimizer a reduce-scatter plus an all-gather of the BF16
//!   parameters (the FP8 and MXFP8 recipes' low-precision weights in their format, as
//!   `fp8_param_gather` gathers them). Overlapped, the parameter gather hides behind the
//!   first micro-batch's forward but for the first bucket (Megatron's max(40M, 1M·dp)
//!   elements), with a virtual pipeline chunk by chunk ahead of each chunk's first forward,
//!   and the gradients' reduction goes where Megatron's schedules launch it: on the first
//!   stage bucket by bucket during the last backward (all but the last bucket hidden), on
//!   later stages whole after their last backward, in the pipeline's drain; with a virtual
//!   pipeline chunk by chunk as each chunk's backward ends, so all but the last chunk's
//!   hide behind the chunks still running;
//!   FSDP gathers parameters twice and reduce-scatters gradients every micro-batch,
//!   hidden behind that micro-batch's compute.
//! - The optimizer (AdamW, fp32 master weights and moments) is memory-bound over the
//!   rank's shard; low-precision weight casts happen once per step.
//! - Memory per GPU: BF16 weights, BF16 (or fp32) gradient buffers and 12 bytes of fp32
//!   master weights and AdamW moments per parameter (sharded over dp·cp with the distributed optimizer, everything sharded
//!   with FSDP), cast weight copies of low-precision GEMMs, and activations of the
//!   micro-batches in flight (1F1B: pp−s on stage s; interleaved: Megatron's warm-up
//!   count of chunks), plus allocator slack; the stage needing most decides.
//! - DeepSeek's DualPipe ([`PipelineKind::DualPipe`]) instead: each pipeline rank runs
//!   two mirrored stages, half the micro-batches each, with the bubble, activations in
//!   flight and overlaps of its reference implementation.
//! - DualPipeV ([`PipelineKind::DualPipeV`]), DualPipe cut in half: the layers split over
//!   2·pp stages, rank r running stage r and stage 2·pp−1−r for every micro-batch (a V:
//!   rank 0 holds the embedding and the head), each stage's weights held once, with
//!   DualPipe's pairing of chunks and its bubble counted over the 2·pp stages.

use serde::{Deserialize, Serialize};

use runner_graph::OpKind;
use runner_graph::modules::{Module, Modules};
use runner_graph::recompute::RecomputePolicy;

use runner_graph::pipeline::{ChunkStarts, PipelineSplit};

use crate::comm::Placement;
use crate::model::Model;
use crate::precision::{Plan, Recipe};
use crate::profile::{GIB, GpuProfile};
use crate::template::{Dispatcher, Group, Kernels, Measured, PartTime, Rates, ShardKey, Stored, Template};

/// The optimizer a run trains with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum Optimizer {
    /// AdamW under Megatron's (element-wise) distributed optimizer or FSDP: fp32 master
    /// weights and two fp32 moments, 12 bytes per parameter, sharded over data parallelism.
    #[default]
    AdamW,
    /// Muon (Megatron's `dist_muon`, as Megatron-Bridge's Kimi-K2 recipe trains): each 2D
    /// weight's momentum orthogonalised by Newton-Schulz iterations, under the layer-wise
    /// distributed optimizer, which gives each data-parallel rank whole weights to update
    /// (fp32 master and momentum, 8 bytes per parameter), all-reduces the gradients and
    /// all-gathers the updated weights after the step; the embedding and the output layer
    /// stay on AdamW. A tensor-parallel rank orthogonalises its own block of each weight
    /// (Megatron-Core `OptimizerConfig.muon_tp_mode`'s default, "blockwise"), so the
    /// iterations are counted on the rank graph's weight shapes. The executor trains
    /// either mode (`runner_exec::executor::MuonTpMode`, `--muon-tp-mode` on `runner
    /// bench step`), exact by default, to measure what blockwise does to the loss.
    Muon,
}

impl Optimizer {
    pub fn parse(s: &str) -> Result<Optimizer, String> {
        match s.to_ascii_lowercase().as_str() {
            "adamw" | "adam" => Ok(Optimizer::AdamW),
            "muon" | "dist_muon" => Ok(Optimizer::Muon),
            _ => Err(format!("unknown optimizer '{s}': use adamw or muon")),
        }
    }
}

/// Read as [`Optimizer::parse`] reads a flag, so a run file takes the same names.
impl TryFrom<String> for Optimizer {
    type Error = String;

    fn try_from(name: String) -> Result<Optimizer, String> {
        Optimizer::parse(&name)
    }
}

/// The pipeline schedule the micro-batches run in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String")]
pub enum PipelineKind {
    /// Megatron's one-forward-one-backward (interleaved with a virtual pipeline).
    #[default]
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// DeepSeek's DualPipe (DeepSeek-V3 Technical Report, arXiv:2412.19437, section
    /// 3.2.1; github:deepseek-ai/DualPipe): micro-batches fed from both ends, so pipeline
    /// rank r holds stage r for one direction and stage pp-1-r for the other (two stages'
    /// weights and gradients), and each forward chunk runs beside another micro-batch's
    /// backward chunk with their all-to-all and pipeline sends hidden behind each other's
    /// compute. Its bubble is (pp/2 - 1)(F&B + B - 3W) where 1F1B's is (pp - 1)(F + B),
    /// and each rank keeps pp + 1 micro-batches' activations. It needs an even pp, no
    /// virtual pipeline, and an even number of micro-batches, at least 2·pp (the
    /// reference implementation's assertions, `dualpipe/dualpipe.py` at bb214e8).
    #[serde(rename = "dualpipe")]
    DualPipe,
    /// DualPipeV, "a concise V-shape schedule derived from DualPipe using a 'cut-in-half'
    /// procedure, introduced by Sea AI Lab" (github:deepseek-ai/DualPipe README,
    /// "DualPipeV"; Huawei's MindSpeed runs it under Megatron as `--schedules-method
    /// dualpipev`). The layers split over 2·pp stages; pipeline rank r holds stage r and
    /// stage 2·pp-1-r and runs both for every micro-batch, down the V and back up, so each
    /// stage sits on one rank (DualPipe's weights per rank on half its devices, no stage
    /// held twice). Over PP = 2·pp stages the README gives it DualPipe's bubble, (PP/2 -
    /// 1)(F&B + B - 3W) in chunks of one stage, and PP + 1 stages' activations per rank.
    /// It needs pp ≥ 2, no virtual pipeline, at least 2·pp layers, 2·pp - 1 micro-batches
    /// and no FSDP (MindSpeed's checks, `mindspeed/features_manager/pipeline_parallel/
    /// dualpipev_feature.py` at 2c8c7d5).
    #[serde(rename = "dualpipev")]
    DualPipeV,
}

impl PipelineKind {
    pub fn parse(s: &str) -> Result<PipelineKind, String> {
        match s.to_ascii_lowercase().as_str() {
            "1f1b" | "interleaved" => Ok(PipelineKind::OneFOneB),
            "dualpipe" => Ok(PipelineKind::DualPipe),
            "dualpipev" => Ok(PipelineKind::DualPipeV),
            _ => Err(format!(
                "unknown pipeline schedule '{s}': use 1f1b (Megatron's, interleaved with --vp), dualpipe (DeepSeek's) or dualpipev (DualPipe cut in half)"
            )),
        }
    }

    /// The chunks a rank's share of the layers splits into, as the split rules (Megatron's
    /// flags, layout strings) count them: vp, or DualPipeV's 2 (its 2·pp stages, two a
    /// rank, divide as pp ranks of two virtual chunks do; only their order differs).
    pub fn split_vp(&self, vp: u32) -> u32 {
        if *self == PipelineKind::DualPipeV { 2 } else { vp }
    }

    /// The chunks a pipeline of `pp` ranks and `vp` virtual chunks splits the layers
    /// into: pp·vp, or DualPipeV's 2·pp stages (two on each rank).
    pub fn chunks(&self, pp: u32, vp: u32) -> u32 {
        pp * self.split_vp(vp)
    }

    /// Megatron's schedule: what a layout's JSON leaves out.
    pub fn is_1f1b(&self) -> bool {
        *self == PipelineKind::OneFOneB
    }
}

impl TryFrom<String> for PipelineKind {
    type Error = String;

    fn try_from(name: String) -> Result<PipelineKind, String> {
        PipelineKind::parse(&name)
    }
}

/// What a layout decides beyond the shapes of a rank's layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Schedule {
    pub pp: u32,
    pub vp: u32,
    pub dp: u32,
    pub global_batch: u32,
    pub recompute: RecomputePolicy,
    /// With full recompute: layers per pipeline chunk recomputed (Megatron's block
    /// method, the first ones of each chunk); 0: every layer.
    pub recompute_layers: u32,
    /// With selective recompute: Megatron's `recompute_modules`, in every layer.
    pub recompute_modules: Modules,
    pub distributed_optimizer: bool,
    pub fsdp: bool,
    /// Megatron's TP communication overlap (userbuffers).
    pub tp_overlap: bool,
    /// Expert-parallel all-to-all overlapped with another micro-batch's compute, where
    /// Megatron can ([`Costed::evaluate`] prices it exposed elsewhere).
    pub ep_overlap: bool,
    /// Gradient reduce-scatter (and parameter all-gather) overlapped with the backward
    /// (and forward).
    pub dp_overlap: bool,
    /// Gradient buffers and their reduction in fp32 (Megatron's grad_reduce_in_fp32);
    /// otherwise BF16, as NVIDIA's performance recipes run.
    pub grad_fp32: bool,
    /// How the layers split over the pp·vp chunks (the embedding and the loss counted
    /// as layers or not).
    pub split: PipelineSplit,
    /// Activations of the first n layers of each pipeline chunk offloaded to host memory
    /// in the forward and reloaded for the backward (Megatron's
    /// `cpu_offloading_num_layers`); 0: none.
    pub offload_layers: u32,
    pub optimizer: Optimizer,
    /// The kernels its ops are timed with.
    pub kernels: Kernels,
    /// The pipeline schedule (Megatron's 1F1B unless a layout asks for DualPipe).
    #[serde(skip_serializing_if = "PipelineKind::is_1f1b")]
    pub pipeline: PipelineKind,
}

/// A complete layout: the sharding and the schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LayoutSpec {
    pub tp: u32,
    pub pp: u32,
    pub cp: u32,
    pub vp: u32,
    pub ep: u32,
    pub etp: u32,
    pub dp: u32,
    pub mbs: u32,
    pub gbs: u32,
    pub sequence_parallel: bool,
    pub fsdp: bool,
    pub recompute: RecomputePolicy,
    pub recompute_layers: u32,
    /// With selective recompute: the modules recomputed (Megatron's default list,
    /// `core_attn`, when absent).
    #[serde(default)]
    pub recompute_modules: Modules,
    pub distributed_optimizer: bool,
    pub tp_overlap: bool,
    pub ep_overlap: bool,
    pub dp_overlap: bool,
    pub grad_fp32: bool,
    /// Layers' worth the embedding and the loss count as in the pipeline split
    /// (Megatron's `account_for_*_in_pipeline_split`; 0 and 0 split the layers evenly).
    #[serde(default)]
    pub split: PipelineSplit,
    /// Layers per pipeline chunk whose activations go to host memory between their forward
    /// and backward (Megatron's `cpu_offloading_num_layers`).
    #[serde(default)]
    pub offload_layers: u32,
    #[serde(default)]
    pub optimizer: Optimizer,
    /// The kernels its ops are timed with, as fields of the layout
    /// (`fused_grouped_mlp`, `dispatcher`).
    #[serde(flatten)]
    pub kernels: Kernels,
    /// The pipeline schedule; absent (Megatron's 1F1B) unless DualPipe.
    #[serde(default, skip_serializing_if = "PipelineKind::is_1f1b")]
    pub pipeline: PipelineKind,
}

impl LayoutSpec {
    /// A layout without EP, recompute, FSDP or offload, Megatron's usual options otherwise:
    /// sequence parallelism and TP communication overlap where `tp > 1`, the distributed
    /// optimizer, the data-parallel reduction overlapped, 1F1B, the default split,
    /// optimizer and kernels.
    #[must_use]
    pub fn dense(tp: u32, pp: u32, cp: u32, vp: u32, dp: u32, mbs: u32, gbs: u32) -> LayoutSpec {
        LayoutSpec {
            tp,
            pp,
            cp,
            vp,
            ep: 1,
            etp: 1,
            dp,
            mbs,
            gbs,
            sequence_parallel: tp > 1,
            fsdp: false,
            recompute: RecomputePolicy::None,
            recompute_layers: 0,
            recompute_modules: Modules::default(),
            distributed_optimizer: true,
            tp_overlap: tp > 1,
            ep_overlap: false,
            dp_overlap: true,
            grad_fp32: false,
            split: PipelineSplit::default(),
            offload_layers: 0,
            optimizer: Optimizer::default(),
            kernels: Kernels::default(),
            pipeline: PipelineKind::default(),
        }
    }

    pub fn new(key: ShardKey, s: Schedule) -> LayoutSpec {
        LayoutSpec {
            tp: key.tp,
            pp: s.pp,
            cp: key.cp,
            vp: s.vp,
            ep: key.ep,
            etp: key.etp,
            dp: s.dp,
            mbs: key.mbs,
            gbs: s.global_batch,
            sequence_parallel: key.sp,
            fsdp: s.fsdp,
            recompute: s.recompute,
            recompute_layers: s.recompute_layers,
            recompute_modules: s.recompute_modules,
            distributed_optimizer: s.distributed_optimizer,
            tp_overlap: s.tp_overlap,
            ep_overlap: s.ep_overlap,
            dp_overlap: s.dp_overlap,
            grad_fp32: s.grad_fp32,
            split: s.split,
            offload_layers: s.offload_layers,
            optimizer: s.optimizer,
            kernels: s.kernels,
            pipeline: s.pipeline,
        }
    }

    pub fn key(&self) -> ShardKey {
        ShardKey { tp: self.tp, cp: self.cp, ep: self.ep, etp: self.etp, sp: self.sequence_parallel, mbs: self.mbs }
    }

    pub fn schedule(&self) -> Schedule {
        Schedule {
            pp: self.pp,
            vp: self.vp,
            dp: self.dp,
            global_batch: self.gbs,
            recompute: self.recompute,
            recompute_layers: self.recompute_layers,
            recompute_modules: self.recompute_modules,
            distributed_optimizer: self.distributed_optimizer,
            fsdp: self.fsdp,
            tp_overlap: self.tp_overlap,
            ep_overlap: self.ep_overlap,
            dp_overlap: self.dp_overlap,
            grad_fp32: self.grad_fp32,
            split: self.split,
            offload_layers: self.offload_layers,
            optimizer: self.optimizer,
            kernels: self.kernels,
            pipeline: self.pipeline,
        }
    }

    pub fn gpus(&self) -> u64 {
        u64::from(self.tp) * u64::from(self.pp) * u64::from(self.cp) * u64::from(self.dp)
    }

    /// Megatron's `pipeline_model_parallel_layout` for this layout's split of `layers`
    /// (with `mtp` MTP layers by the head), where Megatron-Core's plain flags cannot build
    /// it (uneven chunks); `None` where they can, or without a pipeline.
    pub fn pipeline_layout_needed(&self, layers: u32, mtp: u32) -> Option<String> {
        if self.pp <= 1 {
            return None;
        }
        // Under DualPipeV the layout's chunks are its 2·pp stages in order.
        let (l, pp, vp) = (layers as usize, self.pp as usize, self.pipeline.split_vp(self.vp.max(1)) as usize);
        self.split.megatron_flags(l, pp, vp).err()?;
        self.split.megatron_layout(l, pp * vp, mtp as usize).ok()
    }

    /// The parallel degrees and batch, for narrow tables: "TP4 PP4 CP2 VP5 MBS1 GBS128".
    pub fn compact(&self) -> String {
        self.spell(false)
    }

    /// Megatron-style short form: "TP4 PP4 CP2 VP5 DP2 MBS1 GBS128 RC-full" (selective
    /// recompute of other modules than `core_attn`: "RC-sel:layernorm+moe_act").
    pub fn short(&self) -> String {
        self.spell(true)
    }

    fn spell(&self, long: bool) -> String {
        let mut s = format!("TP{} PP{}", self.tp, self.pp);
        for (name, v) in [("CP", self.cp), ("VP", self.vp), ("EP", self.ep), ("ETP", self.etp)] {
            if v > 1 {
                s += &format!(" {name}{v}");
            }
        }
        if long {
            s += &format!(" DP{}", self.dp);
        }
        if self.pp > 1 && !self.split.is_even() {
            s += &format!(" {}", self.split.label());
        }
        s += &format!(" MBS{} GBS{}", self.mbs, self.gbs);
        if self.fsdp {
            s += " FSDP";
        }
        if self.offload_layers > 0 {
            s += &format!(" OFFLOAD:{}", self.offload_layers);
        }
        if self.optimizer == Optimizer::Muon {
            s += " Muon";
        }
        if self.kernels.fused_grouped_mlp {
            s += " FUSED-MLP";
        }
        match self.pipeline {
            PipelineKind::OneFOneB => {}
            PipelineKind::DualPipe => s += " DualPipe",
            PipelineKind::DualPipeV => s += " DualPipeV",
        }
        if self.ep > 1 && self.kernels.dispatcher == Dispatcher::AllToAll {
            s += " A2A-DISPATCH";
        }
        let full = if long { "RC-full" } else { "RC" };
        match self.recompute {
            RecomputePolicy::None => {}
            RecomputePolicy::Selective if self.recompute_modules == Modules::default() => s += " RC-sel",
            RecomputePolicy::Selective => s += &format!(" RC-sel:{}", self.recompute_modules),
            RecomputePolicy::Full if self.recompute_layers > 0 => s += &format!(" {full}:{}", self.recompute_layers),
            RecomputePolicy::Full => s += &format!(" {full}"),
        }
        s
    }
}

/// Where a step's time goes, seconds (they sum to the step time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Breakdown {
    /// Forward and backward compute of the slowest stage, all micro-batches, and the
    /// once-per-step low-precision weight casts.
    pub compute: f64,
    /// What `compute` is made of (inside it, not beside it: the top-level parts sum to
    /// the step time).
    #[serde(default)]
    pub compute_parts: ComputeParts,
    pub recompute: f64,
    /// Exposed (not hidden) communication.
    pub tp: f64,
    pub cp: f64,
    pub ep: f64,
    /// Pipeline sends, and a tied embedding's gradient all-reduce between the first and
    /// the last stage.
    pub pp: f64,
    pub dp: f64,
    /// Pipeline fill and drain.
    pub bubble: f64,
    pub optimizer: f64,
    /// Activation offload to host memory not hidden behind the layers' compute.
    #[serde(default)]
    pub offload: f64,
    /// Waiting for the slowest rank beyond what one node waits
    /// ([`crate::profile::Efficiency::straggler`]).
    #[serde(default)]
    pub straggler: f64,
}

/// Of a step's compute: the GEMMs (forward, input and weight gradients) and the
/// sequence-mixing kernels (attention cores; Mamba-2 scans with their chunk states' HBM
/// round trips); the rest is memory-bound work (norms, activations, rotary,
/// convolutions, residuals, routing, the loss) and the recipe's casts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ComputeParts {
    pub gemm: f64,
    pub attention: f64,
    #[serde(default)]
    pub scan: f64,
}

impl Breakdown {
    /// Of `compute`, what is neither GEMMs, attention cores nor scans: the memory-bound
    /// ops and the recipe's casts.
    pub fn other_compute(&self) -> f64 {
        let p = &self.compute_parts;
        self.compute - p.gemm - p.attention - p.scan
    }

    pub fn total(&self) -> f64 {
        self.compute + self.recompute + self.tp + self.cp + self.ep + self.pp + self.dp + self.bubble + self.optimizer + self.offload
            + self.straggler
    }
}

/// Memory of the most loaded GPU, GiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    pub weights: f64,
    pub gradients: f64,
    pub optimizer: f64,
    pub activations: f64,
    /// Context, NCCL and workspaces the profile reserves.
    pub reserved: f64,
    pub total: f64,
    pub capacity: f64,
    /// The pipeline stage it is on.
    pub stage: u32,
    /// Activations offloaded to host memory per GPU, GiB (the most loaded stage's: not
    /// part of `total`); 0 without offload.
    #[serde(default)]
    pub host_offload: f64,
    /// Host memory per GPU, GiB (0: unknown, and then nothing offloads).
    #[serde(default)]
    pub host_capacity: f64,
}

impl Memory {
    /// Whether the GPU holds its part.
    pub fn gpu_fits(&self) -> bool {
        self.total <= self.capacity
    }

    /// Whether the host holds the offloaded activations.
    pub fn host_fits(&self) -> bool {
        self.host_offload <= self.host_capacity
    }

    pub fn fits(&self) -> bool {
        self.gpu_fits() && self.host_fits()
    }

    /// What does not fit, in words; `None` when everything does.
    pub fn shortfall(&self) -> Option<String> {
        if !self.gpu_fits() {
            // `{}`: a capacity read from the device (79.65) is not rounded up past the need.
            Some(format!("needs {:.1} GiB per GPU of {}", self.total, self.capacity))
        } else if !self.host_fits() {
            Some(format!("offloads {:.0} GiB of activations per GPU to {:.0} GiB of host memory", self.host_offload, self.host_capacity))
        } else {
            None
        }
    }
}

/// The link a parallel group's collectives run over (named as `runner calibrate
/// --collectives` names its tiers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Link {
    /// Every member in one scale-up (NVLink) domain.
    #[default]
    ScaleUp,
    /// Members in several domains: what crosses them goes through the NICs.
    ScaleOut,
}

/// A parallel group of a layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupName {
    Tp,
    Cp,
    Ep,
    Etp,
    /// A pipeline stage and the next (the ranks of a send).
    Pp,
    /// The dense weights' data-parallel group (dp·cp ranks).
    Dp,
    /// The expert weights' data-parallel group (tp·cp·dp / (ep·etp) ranks).
    Edp,
}

/// Where one group's ranks sit ([`crate::comm::Placement`]) and the link that gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupPlace {
    pub group: GroupName,
    /// Ranks in the group (for `pp`, the stages).
    pub ranks: u32,
    /// Global ranks between two members (Megatron's rank order).
    pub stride: u32,
    pub fabric: Link,
    /// Members that share one scale-up domain.
    pub per_domain: u32,
}

/// A step's communication, seconds per part whether hidden or not (the breakdown has what
/// the step waits for), and where each group of more than one rank sits. Expert tensor
/// parallelism counts under `ep`, expert gradients under `dp`, as in the breakdown; `pp` is
/// the critical stage's own sends and a tied embedding's gradient all-reduce between the
/// first and the last stage; `tp`, `cp` and `ep` include the forward collectives full
/// recompute replays in the backward; `dp` the critical stage's, but with the distributed
/// optimizer's gradient reduction overlapped, the largest stage's reduction (the stage the
/// step waits for need not be the slowest).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Communication {
    pub tp: f64,
    pub cp: f64,
    pub ep: f64,
    pub pp: f64,
    pub dp: f64,
    pub groups: Vec<GroupPlace>,
}

/// A projected step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Projection {
    pub layout: LayoutSpec,
    pub gpus: u64,
    pub step_time_s: f64,
    pub tokens_per_sec_per_gpu: f64,
    pub model_tflops_per_gpu: f64,
    /// Against the dense peak of the plan's low-precision format (BF16 for BF16 runs),
    /// as NVIDIA's recipes define it.
    pub mfu: f64,
    pub memory_per_gpu_gib: f64,
    pub fits: bool,
    pub memory: Memory,
    pub breakdown: Breakdown,
    /// All of the step's communication and the links of its groups.
    #[serde(default)]
    pub comm: Communication,
    pub micro_batches: u32,
    /// Megatron's `pipeline_model_parallel_layout` where its pp/vp flags cannot build the
    /// split ([`LayoutSpec::pipeline_layout_needed`]); filled in for what is shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline_model_parallel_layout: Option<String>,
}

/// One model layer's (or side's) costs per micro-batch under every choice the schedule
/// makes, seconds and bytes.
#[derive(Clone, Copy, Debug, Default)]
struct LayerCost {
    compute: f64,
    /// Of `compute`: GEMMs, attention cores and Mamba scans.
    gemm: f64,
    attention: f64,
    scan: f64,
    fwd: f64,
    bwd: f64,
    weight_cast: f64,
    /// Per overlap setting (see [`overlap_index`]) and recompute policy.
    recompute: [[f64; 3]; 4],
    /// Exposed tp, cp, ep per overlap setting.
    exposed: [[f64; 3]; 4],
    /// Their collectives' seconds, forward and backward, hidden or not.
    comm: [f64; 3],
    /// Bytes those collectives move through the GPU's NIC per direction: forward,
    /// backward.
    nic: [f64; 2],
    /// Of them, the forward's: full recompute replays them in the backward (selective
    /// recompute's modules hold no collectives in this model, `PartTime::module_fwd`).
    comm_fwd: [f64; 3],
    activations: [f64; 3],
    /// Per selective-recompute module: the forward it repeats, the bytes it frees.
    module_rc: [f64; Module::COUNT],
    module_freed: [f64; Module::COUNT],
    dense: f64,
    expert: f64,
    frozen: f64,
    low_weights: f64,
    /// Of them, the trained ones: dense, routed-expert.
    low_trained: [f64; 2],
    /// Muon's Newton-Schulz FLOPs over the layer's trained weights: dense, routed experts.
    ns_dense: f64,
    ns_expert: f64,
}

/// A stage's parameter elements: trained dense and routed-expert, frozen, and the
/// weights of its low-precision GEMMs (whose cast copies stay resident).
#[derive(Clone, Copy, Debug, Default)]
struct StageParams {
    dense: f64,
    expert: f64,
    frozen: f64,
    low: f64,
    /// Trained weight elements of low-precision GEMMs: dense, routed-expert.
    low_trained: [f64; 2],
    /// Muon's Newton-Schulz FLOPs over them (the weights Muon updates).
    ns_dense: f64,
    ns_expert: f64,
    /// Trained dense weights of the embedding and the output layer (and a tied copy):
    /// AdamW's under Muon, whose 2D-matrix updates are for the layers' weights.
    side: f64,
}

impl LayerCost {
    fn new(t: &PartTime, part: &crate::template::Part, stored: &Stored, rates: &Rates) -> LayerCost {
        let attn = Module::CoreAttn.index();
        let mut c = LayerCost {
            compute: t.fwd + t.bwd,
            gemm: t.gemm,
            attention: t.attention,
            scan: t.scan,
            fwd: t.fwd,
            bwd: t.bwd,
            weight_cast: t.weight_cast,
            // Full recompute keeps each layer's input as it is.
            activations: [stored.none, stored.none - stored.freed[attn], part.activations[2]],
            module_rc: t.module_fwd,
            module_freed: stored.freed,
            comm: [0, 1, 2].map(|i| t.comm_fwd[i] + t.comm_bwd[i]),
            nic: [t.nic_fwd, t.nic_bwd],
            comm_fwd: t.comm_fwd,
            dense: part.dense_params,
            expert: part.expert_params,
            frozen: part.frozen_params,
            low_weights: t.low_precision_weights,
            low_trained: t.low_precision_trained,
            ns_dense: part.gemms.iter().filter(|g| !g.expert).map(|g| g.ns_flops).sum(),
            ns_expert: part.gemms.iter().filter(|g| g.expert).map(|g| g.ns_flops).sum(),
            ..LayerCost::default()
        };
        for ov in 0..4 {
            c.exposed[ov] = t.exposed(rates, ov & 1 == 1, ov & 2 == 2);
            for (i, p) in [RecomputePolicy::None, RecomputePolicy::Selective, RecomputePolicy::Full].into_iter().enumerate() {
                c.recompute[ov][i] = t.recompute(p, c.exposed[ov]);
            }
        }
        c
    }

    fn time(&self, policy: usize, ov: usize) -> f64 {
        self.compute + self.recompute[ov][policy] + self.exposed[ov].iter().sum::<f64>()
    }

    /// Forward repeated and bytes freed by selective recompute of `modules`.
    fn selective(&self, modules: Modules) -> (f64, f64) {
        modules.iter().map(Module::index).fold((0.0, 0.0), |(t, b), m| (t + self.module_rc[m], b + self.module_freed[m]))
    }
}

/// A template timed on a device under a plan: per model layer, ready for any schedule.
pub struct Costed {
    pub key: ShardKey,
    pub kernels: Kernels,
    layers: Vec<LayerCost>,
    pre: LayerCost,
    post: LayerCost,
    /// Tied weights the last stage holds beside the first when pp > 1: trained, frozen.
    tied: f64,
    tied_frozen: f64,
    stage_message_bytes: f64,
    rates: Rates,
    /// The host side of activation offload, if the GPU's profile gives it.
    host: Option<Host>,
    capacity: f64,
    reserved: f64,
    slack: f64,
    /// The spread of a rank's step time ([`crate::profile::Efficiency::straggler`]).
    straggler: f64,
    peak: f64,
    /// Per-tensor FP8 and MXFP8 recipes keep the weights of their low-precision GEMMs
    /// as FP8 parameters (Megatron's `fp8_param_gather`, on in Megatron-Bridge's FP8
    /// delayed, current-scaling and MXFP8 precision configs, off in its NVFP4 one:
    /// github:NVIDIA-NeMo/Megatron-Bridge/src/megatron/bridge/training/mixed_precision.py
    /// @d9f7643; in NeMo 2's FP8 delayed and current-scaling ones, which its performance
    /// scripts take, github:NVIDIA/NeMo nemo/collections/llm/recipes/precision/
    /// mixed_precision.py and scripts/performance/helpers.py `set_precision_configs`, off
    /// in its MXFP8 one, which no published run here used; and passed as
    /// `+model.fp8_params` by DGX Cloud's NeMo 24.09 and 24.12 Llama 3.1 runs,
    /// github:NVIDIA/dgxc-benchmarking llama3.1/configure.sh): with the distributed
    /// optimizer no BF16 copy of those weights stays resident, the fp32 master weights
    /// hold the precision.
    fp8_params: bool,
    /// Bytes per element of such an FP8 parameter as the distributed optimizer gathers
    /// it (one row-wise copy, MXFP8 with its block scales).
    fp8_param_bytes: f64,
    /// Bytes per low-precision weight element of the casts kept through the step
    /// ([`Recipe::resident_cast_bytes_per_element`]).
    cast_bytes: f64,
    flops_per_sequence: f64,
    seq_len: u32,
    /// Prefix sums over layers of everything a stage adds up, so a stage costs a few
    /// lookups per chunk rather than a pass over its layers; and the embedding and head
    /// sides' rows in the same layout.
    sums: Sums,
    pre_row: Row,
    post_row: Row,
    /// The largest layer's parameter elements (all, trained) and low-precision weight
    /// elements: what FSDP gathers whole per unit.
    largest: [f64; 3],
}

/// What activation offload goes over and into.
#[derive(Clone, Copy, Debug)]
struct Host {
    /// Achieved host-link bytes/s per direction.
    bps: f64,
    /// Host memory per GPU, GiB.
    capacity: f64,
    /// Whether the NIC's traffic crosses the host link too
    /// ([`crate::profile::GpuProfile::nic_shares_host_link`]).
    shared: bool,
}

/// The link an offloading schedule's copies cross and what else crosses it.
#[derive(Clone, Copy, Debug, Default)]
struct OffloadLink {
    /// Achieved host-link bytes/s per direction (0 without offload).
    bps: f64,
    /// Whether the layers' scale-out traffic shares it.
    shared: bool,
    /// FSDP's groups (dense, routed-expert) and gradient bytes per element, where FSDP
    /// gathers and reduce-scatters each layer's weights beside its compute.
    fsdp: Option<(Placement, Placement, f64)>,
}

/// Seconds one direction of an offloaded layer's copy (`copy` bytes) adds to a window
/// of `compute` seconds when `nic` bytes of scale-out traffic cross the same link
/// (`bps` per direction) in that window: the link carries both, so the window lasts
/// (copy + nic) / bps at the least; it would have lasted the compute, or the NIC's own
/// time on the link, anyway (what the NIC's traffic leaves exposed is priced with its
/// collectives). With no NIC traffic on the link, the copy's time past the compute.
fn exposed_copy(copy: f64, nic: f64, bps: f64, compute: f64) -> f64 {
    ((copy + nic) / bps - compute.max(nic / bps)).max(0.0)
}

/// A schedule checked against a sharding and its stages added up ([`Costed::evaluate`]'s
/// first part), from which both its memory and its step time are worked out.
struct Staged {
    /// The schedule with the overlaps it runs (EP and TP overlap where they can).
    s: Schedule,
    /// Per pipeline stage, or under DualPipe and DualPipeV per rank.
    stages: Vec<Stage>,
    /// DualPipeV's 2·pp stages before they are paired into ranks (empty otherwise): what
    /// each holds in flight and when each finishes differ.
    legs: Vec<Stage>,
    /// The pipeline's stages: pp, or DualPipeV's 2·pp.
    n_stages: usize,
    /// The selectively recomputed modules (expanded; none without selective recompute).
    selective: Modules,
    pp: usize,
    vp: usize,
    dp: u32,
    /// Micro-batches per step.
    m: u32,
    dual: bool,
    /// DualPipeV.
    v: bool,
    /// Recompute policy index of the chunks' layers (of the first ones under partial
    /// full recompute).
    base: usize,
    stage_gpus: u64,
    expert_ranks: u64,
    muon: bool,
    /// The chunks' first layers, and the link offloaded activations cross.
    starts: ChunkStarts,
    link: OffloadLink,
    /// Whether the stages hold their times and breakdown (else their memory alone).
    time: bool,
}

impl Drop for Staged {
    /// Its stages go back to the thread's spare ([`pooled_stages`]).
    fn drop(&mut self) {
        let stages = std::mem::take(&mut self.stages);
        SPARE_STAGES.with(|spare| {
            let kept = spare.take();
            spare.set(if kept.capacity() >= stages.capacity() { kept } else { stages });
        });
    }
}

thread_local! {
    /// A stages vector a dropped [`Staged`] left, for the next to take: the search stages
    /// hundreds of thousands of schedules, and a vector allocated, filled and freed for
    /// each was about 5 % of a warm search (a profile of llama3.1-405b's, 2026-12-07).
    static SPARE_STAGES: std::cell::Cell<Vec<Stage>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `n` empty stages, in the thread's spare vector when there is one.
fn pooled_stages(n: usize) -> Vec<Stage> {
    let mut stages = SPARE_STAGES.with(std::cell::Cell::take);
    stages.clear();
    stages.resize(n, Stage::default());
    stages
}

/// Which parts of a stage [`Costed::add_up`] adds up.
#[derive(Clone, Copy)]
struct Pass {
    memory: bool,
    time: bool,
}

/// One pipeline stage's sums in [`Costed::evaluate`]: time per micro-batch, stored
/// activations, parameters, the breakdown's parts, and the offloaded activations' buffer
/// (one layer's stays on the GPU as the copy in flight).
#[derive(Clone, Copy, Debug, Default)]
struct Stage {
    t: f64,
    acts: f64,
    params: StageParams,
    comp: [f64; COMP],
    offload: f64,
    /// Activations of one micro-batch it offloads to host memory.
    host: f64,
    /// Its forward and backward, the embedding and head sides it holds included (what
    /// data-parallel traffic hides behind), and how many transformer layers it holds.
    fwd: f64,
    bwd: f64,
    layers: usize,
}

impl Stage {
    /// A rank holding stage `self` and stage `other`, each for `share` of the
    /// micro-batches (DualPipe: a half, so times, breakdown and per-micro-batch
    /// activations are the two stages' mean; DualPipeV: all, so their sum), weights summed.
    fn paired(&self, other: &Stage, share: f64) -> Stage {
        let per = |a: f64, b: f64| (a + b) * share;
        let (p, q) = (&self.params, &other.params);
        Stage {
            t: per(self.t, other.t),
            acts: per(self.acts, other.acts),
            params: StageParams {
                dense: p.dense + q.dense,
                expert: p.expert + q.expert,
                frozen: p.frozen + q.frozen,
                low: p.low + q.low,
                low_trained: [p.low_trained[0] + q.low_trained[0], p.low_trained[1] + q.low_trained[1]],
                ns_dense: p.ns_dense + q.ns_dense,
                ns_expert: p.ns_expert + q.ns_expert,
                side: p.side + q.side,
            },
            comp: std::array::from_fn(|i| per(self.comp[i], other.comp[i])),
            offload: self.offload.max(other.offload),
            host: per(self.host, other.host),
            fwd: per(self.fwd, other.fwd),
            bwd: per(self.bwd, other.bwd),
            layers: self.layers + other.layers,
        }
    }
}

/// One layer's figures as [`Costed::evaluate`] adds them up, in the layout the `ROW_*`
/// offsets name: compute, GEMMs, attention, weight casts, dense, expert, frozen and
/// low-precision weight elements, Newton-Schulz FLOPs dense and expert, forward, backward,
/// Mamba scans (13); per overlap setting the recompute per policy (12) and the exposed
/// tp, cp, ep (12); per policy and overlap setting the layer's time (12); per policy the stored
/// activations (3); per selective-recompute module the forward it repeats and the bytes
/// it frees; the tp, cp, ep collectives' seconds, hidden or not (3); trained weight
/// elements of low-precision GEMMs, dense and expert (2).
type Row = [f64; ROW_FIELDS];

const FWD: usize = 10;
const BWD: usize = FWD + 1;
const SCAN: usize = BWD + 1;
const RECOMPUTE: usize = SCAN + 1;
const EXPOSED: usize = RECOMPUTE + 12;
const TIME: usize = EXPOSED + 12;
const ACTS: usize = TIME + 12;
const MODULE_RC: usize = ACTS + 3;
const MODULE_FREED: usize = MODULE_RC + Module::COUNT;
const COMM: usize = MODULE_FREED + Module::COUNT;
const COMM_FWD: usize = COMM + 3;
const LOW_TRAINED: usize = COMM_FWD + 3;
const ROW_FIELDS: usize = LOW_TRAINED + 2;

impl LayerCost {
    fn row(&self) -> Row {
        let mut r = [0.0; ROW_FIELDS];
        let plain = [
            self.compute,
            self.gemm,
            self.attention,
            self.weight_cast,
            self.dense,
            self.expert,
            self.frozen,
            self.low_weights,
            self.ns_dense,
            self.ns_expert,
            self.fwd,
            self.bwd,
            self.scan,
        ];
        debug_assert_eq!(plain.len(), RECOMPUTE, "the plain fields end where the recompute ones start");
        r[..plain.len()].copy_from_slice(&plain);
        for ov in 0..4 {
            for k in 0..3 {
                r[RECOMPUTE + 3 * ov + k] = self.recompute[ov][k];
                r[EXPOSED + 3 * ov + k] = self.exposed[ov][k];
                r[TIME + 4 * k + ov] = self.time(k, ov);
            }
        }
        r[ACTS..ACTS + 3].copy_from_slice(&self.activations);
        r[MODULE_RC..MODULE_FREED].copy_from_slice(&self.module_rc);
        r[MODULE_FREED..COMM].copy_from_slice(&self.module_freed);
        r[COMM..COMM_FWD].copy_from_slice(&self.comm);
        r[COMM_FWD..LOW_TRAINED].copy_from_slice(&self.comm_fwd);
        r[LOW_TRAINED..ROW_FIELDS].copy_from_slice(&self.low_trained);
        r
    }
}

/// Prefix sums over layers of their [`Row`]s, one per layer boundary, so a range of
/// layers reads two rows.
struct Sums {
    rows: Vec<Row>,
}

impl Sums {
    fn new(layers: &[LayerCost]) -> Sums {
        let mut rows = Vec::with_capacity(layers.len() + 1);
        let mut acc = [0.0; ROW_FIELDS];
        rows.push(acc);
        for l in layers {
            for (a, v) in acc.iter_mut().zip(l.row()) {
                *a += v;
            }
            rows.push(acc);
        }
        Sums { rows }
    }

    /// Sum of field `i` over layers `a..b`.
    #[inline]
    fn range(&self, i: usize, a: usize, b: usize) -> f64 {
        self.rows[b][i] - self.rows[a][i]
    }

    /// Field `i` over all layers.
    fn total(&self, i: usize) -> f64 {
        self.rows.last().map_or(0.0, |r| r[i])
    }

    /// Add layers `a..b` under `pol` and `ov` to a stage's breakdown ([`add_comp`]).
    #[inline]
    fn add_comp(&self, comp: &mut [f64; COMP], a: usize, b: usize, pol: usize, ov: usize) {
        if a < b {
            let (lo, hi) = (&self.rows[a], &self.rows[b]);
            add_comp(comp, |i| hi[i] - lo[i], pol, ov);
        }
    }

    /// Add the parameters of layers `a..b` to a stage's ([`add_params`]).
    #[inline]
    fn add_params(&self, params: &mut StageParams, a: usize, b: usize) {
        if a < b {
            let (lo, hi) = (&self.rows[a], &self.rows[b]);
            add_params(params, |i| hi[i] - lo[i]);
        }
    }
}

/// Index of an overlap setting: bit 0 TP overlap, bit 1 EP overlap.
fn overlap_index(s: &Schedule) -> usize {
    usize::from(s.tp_overlap) | (usize::from(s.ep_overlap) << 1)
}

/// The selectively recomputed modules (expanded; none without selective recompute) and
/// the recompute policy index of a schedule's layers (of the first ones under partial full
/// recompute). Selective recompute: the layers as with none, plus the listed modules'
/// forward repeated and their activations dropped, in every layer.
fn recompute_rows(s: &Schedule) -> (Modules, usize) {
    match s.recompute {
        RecomputePolicy::Selective => (s.recompute_modules.expanded(), 0),
        p => (Modules::EMPTY, policy_index(p)),
    }
}

/// `v` as a u32, at most u32::MAX (degrees given on a command line may multiply past it).
fn saturate(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// [`policy_index`] of full recompute.
const FULL_POLICY: usize = 2;

fn policy_index(p: RecomputePolicy) -> usize {
    match p {
        RecomputePolicy::None => 0,
        RecomputePolicy::Selective => 1,
        RecomputePolicy::Full => 2,
    }
}

/// Why a layout cannot run, for the search's rejection report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Reject {
    /// Degrees that do not divide what they split.
    Divisibility(String),
    /// A schedule this GPU cannot run (activation offload without a known host link).
    Unsupported(String),
    /// Needs more memory than the GPU has (GiB needed, GiB available).
    Memory { need_gib: f64, have_gib: f64, stage: u32 },
}

impl std::fmt::Display for Reject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reject::Divisibility(m) | Reject::Unsupported(m) => f.write_str(m),
            Reject::Memory { need_gib, have_gib, stage } => {
                write!(f, "needs {need_gib:.1} GiB per GPU (stage {stage}) but the GPU has {have_gib:.1} GiB")
            }
        }
    }
}

impl Costed {
    /// Time `template` (built from `model`) on `gpu` under `plan` with `kernels`
    /// (schedules evaluated on it must ask for the same).
    ///
    /// # Errors
    /// The plan uses a format the GPU has no tensor-core path for.
    pub fn new(
        model: &Model,
        template: &Template,
        plan: &Plan,
        gpu: &GpuProfile,
        measured: &Measured,
        kernels: Kernels,
    ) -> Result<Costed, String> {
        Costed::new_with(model, template, plan, gpu, measured, kernels, &Costed::fresh_layers(model, plan))
    }

    /// Per model layer, whether [`Costed::new`] times it afresh (`true`) or takes the
    /// costing of the last layer of its class timed before it, whose GEMMs the plan
    /// gives the same formats. It depends on the model and the plan alone, not on the
    /// template: worked out once for every sharding a search times (a format lookup
    /// hashes a GEMM's name, which the plugin chose, with SipHash: two per GEMM per
    /// layer, for every sharding, were a third of the timing).
    pub fn fresh_layers(model: &Model, plan: &Plan) -> Vec<bool> {
        let d = &model.depth;
        // Per representative layer position, the GEMM names of the layer last timed afresh.
        let mut last: Vec<Option<&[String]>> = vec![None; d.reps.iter().max().map_or(0, |&r| r + 1)];
        (0..d.len())
            .map(|p| {
                let rep = model.rep(p);
                let names = d.gemm_names[p].as_slice();
                match last[rep] {
                    Some(n) if plan_formats_equal(plan, n, names) => false,
                    _ => {
                        last[rep] = Some(names);
                        true
                    }
                }
            })
            .collect()
    }

    /// [`Costed::new`] with [`Costed::fresh_layers`] of the same model and plan given.
    ///
    /// # Errors
    /// As [`Costed::new`], and `fresh` not one flag per layer of `model`.
    pub fn new_with(
        model: &Model,
        template: &Template,
        plan: &Plan,
        gpu: &GpuProfile,
        measured: &Measured,
        kernels: Kernels,
        fresh: &[bool],
    ) -> Result<Costed, String> {
        for (f, share) in &plan.coverage {
            if *share > 0.0 {
                gpu.peak_flops(*f)?;
            }
        }
        let rates = Rates::new(gpu);
        let d = &model.depth;
        let mut by_rep: Vec<Option<LayerCost>> = vec![None; template.layers.len()];
        let mut layers = Vec::with_capacity(d.len());
        if fresh.len() != d.len() {
            return Err(format!("Costed::fresh_layers of another model: {} layers for {}", fresh.len(), d.len()));
        }
        for (p, &afresh) in fresh.iter().enumerate() {
            let rep = model.rep(p);
            let names = &d.gemm_names[p];
            // Layers of one class usually share their formats: reuse the costing.
            let cost = match by_rep[rep] {
                Some(c) if !afresh => c,
                _ => {
                    let part = &template.layers[rep];
                    let t = template.time_part(part, names, plan, &rates, measured, kernels);
                    let c = LayerCost::new(&t, part, &Template::stored(part, names, plan), &rates);
                    by_rep[rep] = Some(c);
                    c
                }
            };
            layers.push(cost);
        }
        // The embedding and the output layer stay on AdamW under Muon.
        let side = |part: &crate::template::Part, names: &[String]| LayerCost {
            ns_dense: 0.0,
            ns_expert: 0.0,
            ..LayerCost::new(&template.time_part(part, names, plan, &rates, measured, kernels), part, &Template::stored(part, names, plan), &rates)
        };
        let pre = side(&template.pre, &d.pre_gemms);
        let post = side(&template.post, &d.post_gemms);
        let largest = |f: fn(&LayerCost) -> f64| layers.iter().map(f).fold(0.0, f64::max);
        let largest = [largest(|l| l.dense + l.expert + l.frozen), largest(|l| l.dense + l.expert), largest(|l| l.low_weights)];
        let sums = Sums::new(&layers);
        let (pre_row, post_row) = (pre.row(), post.row());
        Ok(Costed {
            key: template.key,
            kernels,
            layers,
            pre,
            post,
            tied: template.post.tied_params,
            tied_frozen: template.post.tied_frozen_params,
            stage_message_bytes: template.stage_message_bytes,
            host: gpu.host_link_gbs.zip(gpu.host_memory_gib).map(|(gbs, gib)| Host { bps: gbs * 1e9 * HOST_LINK_EFFICIENCY, capacity: gib, shared: gpu.nic_shares_host_link }),
            rates,
            capacity: gpu.memory_gib,
            reserved: gpu.efficiency.reserved_gib,
            slack: gpu.efficiency.allocator_slack,
            straggler: gpu.efficiency.straggler,
            peak: gpu.peak_flops(plan.recipe.format())?,
            fp8_params: matches!(plan.recipe, Recipe::Fp8 | Recipe::Fp8Cs | Recipe::Mxfp8),
            fp8_param_bytes: plan.recipe.format().element_bytes(),
            cast_bytes: plan.recipe.resident_cast_bytes_per_element(),
            flops_per_sequence: model.flops_per_sequence,
            seq_len: model.seq_len,
            sums,
            pre_row,
            post_row,
            largest,
        })
    }

    /// Whether the GPU's profile gives a host link to offload activations over, and host
    /// memory to hold them.
    pub fn can_offload(&self) -> bool {
        self.host.is_some()
    }

    /// The modules of `m` this model has: recomputing one it lacks (a dense model's
    /// `moe_act`, a model without MLA's `mla_up_proj`) changes nothing.
    pub fn present(&self, m: Modules) -> Modules {
        let has = |x: Module| {
            let i = x.index();
            [&self.pre, &self.post].iter().any(|l| l.module_rc[i] > 0.0 || l.module_freed[i] > 0.0)
                || self.sums.total(MODULE_RC + i) > 0.0
                || self.sums.total(MODULE_FREED + i) > 0.0
        };
        m.iter().filter(|&x| has(x)).fold(Modules::EMPTY, Modules::with)
    }

    /// Project one schedule.
    ///
    /// # Errors
    /// The schedule's degrees do not divide what they split ([`Reject::Divisibility`]).
    /// A layout that does not fit in memory is still projected, with `fits: false`.
    pub fn evaluate(&self, s: &Schedule) -> Result<Projection, Reject> {
        let x = self.staged(s, true)?;
        let memory = self.memory(&x);
        Ok(self.project(&x, memory))
    }

    /// [`Costed::evaluate`] that stops at the memory where `wanted(memory)` is false: the
    /// search throws away the step time of a layout that does not fit when it will
    /// recompute, and its binary searches ask only whether a count fits, so they skip the
    /// data-parallel timing and the projection's assembly. A projection it returns is
    /// [`Costed::evaluate`]'s, bit for bit.
    ///
    /// # Errors
    /// As [`Costed::evaluate`].
    pub fn evaluate_where(&self, s: &Schedule, wanted: impl FnOnce(&Memory) -> bool) -> Result<Result<Projection, Memory>, Reject> {
        let x = self.staged(s, false)?;
        let memory = self.memory(&x);
        if !wanted(&memory) {
            return Ok(Err(memory));
        }
        // The times added to the same stages: the memory is what it was.
        let x = self.add_times(s, x)?;
        Ok(Ok(self.project(&x, memory)))
    }

    /// The memory of the most loaded GPU under schedule `s`, without its step time: what a
    /// search probing how much to recompute or offload asks of a count.
    ///
    /// # Errors
    /// As [`Costed::evaluate`].
    pub fn memory_of(&self, s: &Schedule) -> Result<Memory, Reject> {
        Ok(self.memory(&self.staged(s, false)?))
    }

    /// Check schedule `s` against this sharding and add up its stages (the first part of
    /// [`Costed::evaluate`]); without `time`, only what their memory needs ([`Costed::memory`]:
    /// parameters, stored and offloaded activations), the bulk of a layer row's fields
    /// skipped, for a search asking only whether a layout fits.
    fn staged(&self, s: &Schedule, time: bool) -> Result<Staged, Reject> {
        let key = self.key;
        if s.kernels != self.kernels {
            return Err(Reject::Unsupported("a schedule evaluated on ops timed for other kernels".into()));
        }
        let layers = self.layers.len();
        let (pp, vp, dp) = (s.pp.max(1) as usize, s.vp.max(1) as usize, s.dp.max(1));
        let dual = s.pipeline == PipelineKind::DualPipe;
        let v = s.pipeline == PipelineKind::DualPipeV;
        // The pipeline's stages: pp, or DualPipeV's 2·pp (rank r holds stage r and stage
        // 2·pp-1-r); chunk c runs on stage c mod stages.
        let n_stages = if v { 2 * pp } else { pp };
        let chunks = s.pipeline.chunks(pp as u32, vp as u32) as usize;
        if vp > 1 && pp == 1 {
            return Err(Reject::Divisibility("vp > 1 needs pp > 1".into()));
        }
        if v {
            // Unlike DualPipe, an odd pp is fine: each rank holds a stage of the way down
            // and one of the way back up, and no rank is paired with another.
            if pp < 2 || vp > 1 {
                return Err(Reject::Divisibility(format!(
                    "DualPipeV needs pp ≥ 2 (rank r holds stage r and stage 2·pp-1-r of the 2·pp stages) and no virtual pipeline (its two stages a rank are the V's): pp = {pp}, vp = {vp}"
                )));
            }
            if layers < 2 * pp {
                return Err(Reject::Divisibility(format!(
                    "DualPipeV splits the {layers} transformer layers over 2·pp = {} stages and needs one a stage at least: use pp ≤ {}",
                    2 * pp,
                    layers / 2
                )));
            }
            if s.fsdp {
                return Err(Reject::Unsupported(
                    "DualPipeV under FSDP is not modelled (MindSpeed, which runs it under Megatron, refuses FSDP with it): leave out --fsdp".into(),
                ));
            }
        }
        let starts = s.split.starts(layers, chunks).map_err(Reject::Divisibility)?;
        // Offload and full recompute count layers per chunk; past the fullest chunk they
        // would be clamped and the layout label would show a number the step never ran.
        let most = starts.max_len();
        let past_chunk = |what: &str, n: u32, fix: &str| {
            Reject::Unsupported(format!(
                "{what} of {n} layers per chunk is more than this layout's fullest chunk has ({most} of the {layers} layers over \
                 {chunks} chunk{}): {fix} at most {most}",
                if chunks == 1 { "" } else { "s" }
            ))
        };
        if s.recompute == RecomputePolicy::Full && s.recompute_layers as usize > most {
            return Err(past_chunk("full recompute", s.recompute_layers, "leave the count out for every layer, or recompute"));
        }
        if s.offload_layers as usize > most {
            return Err(past_chunk("offload", s.offload_layers, "offload"));
        }
        let per_step = u64::from(key.mbs) * u64::from(dp);
        if s.global_batch == 0 || !u64::from(s.global_batch).is_multiple_of(per_step) {
            return Err(Reject::Divisibility(format!(
                "GBS {} is not a multiple of MBS·DP = {per_step}",
                s.global_batch
            )));
        }
        let m = (u64::from(s.global_batch) / per_step) as u32;
        // Rank 0 runs its steady phase m - 2·pp + 1 times (m - 2·pp + r + 1 on rank r, the
        // schedule's step 4): MindSpeed's least, where DeepSeek's reference asks for 2·pp.
        if v && (m as usize) < 2 * pp - 1 {
            return Err(Reject::Divisibility(format!(
                "DualPipeV needs at least 2·pp - 1 = {} micro-batches: GBS/(MBS·DP) = {m}",
                2 * pp - 1
            )));
        }
        if dual {
            if pp < 2 || !pp.is_multiple_of(2) || vp > 1 {
                return Err(Reject::Divisibility(format!(
                    "DualPipe needs an even pp (each rank holds stage r and stage pp-1-r) and no virtual pipeline: pp = {pp}, vp = {vp}"
                )));
            }
            if !m.is_multiple_of(2) || (m as usize) < 2 * pp {
                return Err(Reject::Divisibility(format!(
                    "DualPipe needs an even number of micro-batches, at least 2·pp = {}: GBS/(MBS·DP) = {m}",
                    2 * pp
                )));
            }
            if s.fsdp {
                return Err(Reject::Unsupported(
                    "DualPipe under FSDP is not modelled (DeepSeek-V3 ran it under ZeRO-1, the distributed optimizer): leave out --fsdp".into(),
                ));
            }
        }
        if vp > 1 && !(m as usize).is_multiple_of(pp) {
            return Err(Reject::Divisibility(format!(
                "the interleaved schedule needs the {m} micro-batches to be a multiple of pp = {pp}"
            )));
        }
        // Megatron overlaps the expert all-to-all with another micro-batch's compute only
        // in its combined 1F1B schedule, which needs a virtual pipeline when pp > 1 and
        // no full recompute (TransformerConfig asserts both), and a second micro-batch to
        // overlap with; elsewhere the all-to-all is exposed, and the layout says so.
        // DualPipe and DualPipeV run each forward chunk beside another micro-batch's backward
        // chunk, the same pairing.
        let overlap_runs = (pp == 1 || vp > 1 || dual || v) && s.recompute != RecomputePolicy::Full && m > 1;
        // TP communication overlap runs on Transformer Engine's userbuffers, which map the
        // tensor-parallel ranks' buffers into each other's memory through CUDA IPC or, on
        // multi-node NVLink, fabric handles: one NVLink domain per TP group
        // (github:NVIDIA/TransformerEngine transformer_engine/pytorch/module/base.py
        // `initialize_ub`, which colours the domains by host; common/comm_gemm_overlap/
        // userbuffers/userbuffers-host.cpp). A TP group across domains (TP16 on 8-GPU
        // nodes) runs its collectives through NCCL, exposed, and the layout says so.
        let tp_inside = key.tp <= 1 || self.rates.fabric.members_per_domain(self.rates.placement(&key, Group::Tp)).1;
        let s = &Schedule { ep_overlap: s.ep_overlap && overlap_runs, tp_overlap: s.tp_overlap && tp_inside, ..*s };
        // In u64: degrees given on a command line may multiply past u32.
        let stage_gpus = u64::from(key.tp) * u64::from(key.cp) * u64::from(dp);
        let expert_ranks = u64::from(key.ep) * u64::from(key.etp);
        if !stage_gpus.is_multiple_of(expert_ranks) {
            return Err(Reject::Divisibility(format!("ep·etp = {expert_ranks} does not divide tp·cp·dp = {stage_gpus}")));
        }
        let muon = s.optimizer == Optimizer::Muon;
        if muon && s.fsdp {
            return Err(Reject::Unsupported(
                "Muon runs under Megatron's layer-wise distributed optimizer (whole weights per data-parallel rank), not FSDP".into(),
            ));
        }
        let host = match (s.offload_layers, self.host) {
            (0, _) => None,
            (_, Some(h)) => Some(h),
            (_, None) => {
                return Err(Reject::Unsupported(
                    "activation offload needs the GPU's host link bandwidth and host memory (host_link_gbs and host_memory_gib in its profile, --profile FILE)".into(),
                ));
            }
        };
        // FSDP gathers every layer's weights in the forward and again in the backward,
        // and reduce-scatters its gradients there, over the same groups as
        // [`Costed::project`] prices them on.
        let link = host.map_or(OffloadLink::default(), |h| OffloadLink {
            bps: h.bps,
            shared: h.shared,
            fsdp: s.fsdp.then(|| {
                let dense = Placement { size: dp.saturating_mul(key.cp), stride: key.tp };
                let expert = Placement { size: saturate(stage_gpus / expert_ranks), stride: saturate(expert_ranks) };
                (dense, expert, if s.grad_fp32 { 4.0 } else { 2.0 })
            }),
        });
        let (selective, base) = recompute_rows(s);
        let mut stages = pooled_stages(n_stages);
        self.add_up(&mut stages, s, &starts, link, Pass { memory: true, time });
        // DualPipe: pipeline rank r runs stage r for the half of the micro-batches fed from
        // the first rank and stage pp-1-r for the half fed from the last, and holds both
        // stages' weights. DualPipeV: rank r runs stage r and stage 2·pp-1-r for every
        // micro-batch, so its time is both stages'. From here on `stages` are the ranks;
        // DualPipeV keeps its stages as `legs` (what each holds in flight and when each
        // finishes differ).
        let legs = if v { stages.clone() } else { Vec::new() };
        if dual || v {
            let share = if dual { 0.5 } else { 1.0 };
            stages = (0..pp).map(|r| stages[r].paired(&stages[n_stages - 1 - r], share)).collect();
        }
        let s = *s;
        Ok(Staged { s, stages, legs, n_stages, selective, pp, vp, dp, m, dual, v, base, stage_gpus, expert_ranks, muon, starts, link, time })
    }

    /// Add the times and the breakdown to `x`, staged for its memory alone: what
    /// [`Costed::staged`] with them gives, bit for bit ([`Costed::add_up`]). DualPipe's and
    /// DualPipeV's stages are paired into ranks once added up, and are staged again.
    ///
    /// # Errors
    /// As [`Costed::staged`] of `s`, the schedule `x` was staged from (only when staged
    /// again).
    fn add_times(&self, s: &Schedule, x: Staged) -> Result<Staged, Reject> {
        if x.time {
            return Ok(x);
        }
        if x.dual || x.v {
            return self.staged(s, true);
        }
        let mut x = x;
        let (s, starts, link) = (x.s, x.starts, x.link);
        self.add_up(&mut x.stages, &s, &starts, link, Pass { memory: false, time: true });
        x.time = true;
        Ok(x)
    }

    /// Add up the chunks of a checked schedule `s` (as [`Costed::staged`] adjusted it)
    /// into `stages` (pp, or DualPipeV's 2·pp, before any pairing), and the embedding and
    /// head sides into the first and last: with `pass.memory` what a stage's memory needs
    /// (parameters, stored and offloaded activations, layers), with `pass.time` its times
    /// and breakdown. Each field adds up in the same order whichever parts run, so a
    /// memory pass followed by a time pass over the same stages leaves them as one pass
    /// of both, bit for bit.
    fn add_up(&self, stages: &mut [Stage], s: &Schedule, starts: &ChunkStarts, link: OffloadLink, pass: Pass) {
        let Pass { memory: mem, time } = pass;
        let n_stages = stages.len();
        let v = s.pipeline == PipelineKind::DualPipeV;
        let pp = if v { n_stages / 2 } else { n_stages };
        let chunks = s.pipeline.chunks(s.pp.max(1), s.vp.max(1)) as usize;
        let (selective, base) = recompute_rows(s);
        let ov = overlap_index(s);
        // Full recompute of the first n layers of each chunk (block method), none for
        // the rest; n = 0 means every layer.
        let partial = s.recompute == RecomputePolicy::Full && s.recompute_layers > 0;
        let rest = if partial { 0 } else { base };
        let sums = &self.sums;
        let mut b = starts.start(0);
        for c in 0..chunks {
            let stage = &mut stages[c % n_stages];
            let a = b;
            b = starts.start(c + 1);
            let m_ = if partial { (a + s.recompute_layers as usize).min(b) } else { b };
            // The first layers of the chunk copy their stored activations to the host as
            // the next layer runs its forward and back ahead of their backward (Megatron's
            // CPU offloading through Transformer Engine's double-buffered handler): what
            // the copy takes beyond that layer's compute is exposed. Where the NIC shares
            // the link, the layer's scale-out traffic crosses it in the same window, one
            // direction each way: what leaves the GPU in the forward (the copy out beside
            // the collectives' sends), what reaches it in the backward.
            for (j, l) in self.layers[a..(a + s.offload_layers as usize).min(b)].iter().enumerate() {
                let pol = if a + j < m_ { base } else { rest };
                let bytes = l.activations[pol] - l.selective(selective).1;
                if time {
                    let [fwd_nic, bwd_nic] = if link.shared { self.nic_beside(l, link) } else { [0.0; 2] };
                    let exposed = exposed_copy(bytes, fwd_nic, link.bps, l.fwd) + exposed_copy(bytes, bwd_nic, link.bps, l.bwd);
                    stage.t += exposed;
                    stage.comp[OFFLOAD] += exposed;
                }
                if mem {
                    stage.acts -= bytes;
                    stage.host += bytes;
                    stage.offload = stage.offload.max(bytes);
                }
            }
            if time {
                stage.fwd += sums.range(FWD, a, b);
                stage.bwd += sums.range(BWD, a, b);
                stage.t += sums.range(TIME + 4 * base + ov, a, m_) + sums.range(TIME + 4 * rest + ov, m_, b);
            }
            if mem {
                stage.layers += b - a;
                stage.acts += sums.range(ACTS + base, a, m_) + sums.range(ACTS + rest, m_, b);
            }
            for mi in selective.iter().map(Module::index) {
                if time {
                    let rc = sums.range(MODULE_RC + mi, a, b);
                    stage.t += rc;
                    stage.comp[1] += rc;
                }
                if mem {
                    stage.acts -= sums.range(MODULE_FREED + mi, a, b);
                }
            }
            if time {
                sums.add_comp(&mut stage.comp, a, m_, base, ov);
                sums.add_comp(&mut stage.comp, m_, b, rest, ov);
            }
            if mem {
                sums.add_params(&mut stage.params, a, m_);
                sums.add_params(&mut stage.params, m_, b);
            }
        }
        // The embedding and the output layer with the loss sit outside the layers full
        // recompute checkpoints (Megatron-Core's TransformerBlock checkpoints its layers;
        // the GPTModel's embedding and output_layer run once): their forward is never
        // repeated, and their stored activations are counted so (`runner_graph::recompute`
        // keeps what no layer owns). Selective recompute's modules are added apart.
        // Each side once, its selective modules' forward added apart, in the fields' order
        // of a layer chunk (so a memory pass then a time pass is one pass of both).
        let edge = policy_index(RecomputePolicy::None);
        let add_side = |stage: &mut Stage, cost: &LayerCost, row: &Row| {
            if time {
                let rc = cost.selective(selective).0;
                add_comp(&mut stage.comp, |i| row[i], edge, ov);
                stage.comp[1] += rc;
                stage.t += row[TIME + 4 * edge + ov] + rc;
                stage.fwd += row[FWD];
                stage.bwd += row[BWD];
            }
            if mem {
                add_params(&mut stage.params, |i| row[i]);
                stage.params.side += cost.dense;
            }
        };
        add_side(&mut stages[0], &self.pre, &self.pre_row);
        let last = &mut stages[n_stages - 1];
        add_side(last, &self.post, &self.post_row);
        // Under DualPipeV the head's stage is on the embedding's rank: a tied table is one
        // weight there, as with no pipeline.
        if mem && pp > 1 && !v {
            last.params.dense += self.tied;
            last.params.side += self.tied;
            last.params.frozen += self.tied_frozen;
        }
    }

    /// Bytes a layer's scale-out traffic moves through the GPU's NIC per direction in its
    /// forward and in its backward, per micro-batch: its own collectives' across domains
    /// (tp, cp, ep) and, under FSDP, the gathers of its weights (forward and backward) and
    /// the reduce-scatter of its gradients (backward). The data-parallel reduction outside
    /// FSDP runs once a step, in the last micro-batch's backward, and the pipeline's sends
    /// at chunk boundaries: neither is counted beside every layer's copy.
    fn nic_beside(&self, l: &LayerCost, link: OffloadLink) -> [f64; 2] {
        let [mut fwd, mut bwd] = l.nic;
        if let Some((dense, expert, gb)) = link.fsdp {
            let fabric = &self.rates.fabric;
            let on = |kind: OpKind, per: f64, d: f64, e: f64| fabric.nic_bytes(kind, per * d, dense, None) + fabric.nic_bytes(kind, per * e, expert, None);
            let gather = on(OpKind::AllGather, 2.0, l.dense + l.frozen, l.expert);
            fwd += gather;
            bwd += gather + on(OpKind::ReduceScatter, gb, l.dense, l.expert);
        }
        [fwd, bwd]
    }

    /// Memory of the most loaded GPU under a staged schedule (its host offload included).
    fn memory(&self, x: &Staged) -> Memory {
        let Staged { ref s, ref stages, ref legs, n_stages, selective, pp, vp, dp, m, dual, v, base, stage_gpus, expert_ranks, muon, .. } = *x;
        let key = self.key;
        let pol = base;
        let mf = f64::from(m);
        let edp = saturate(stage_gpus / expert_ranks);
        let gb = if s.grad_fp32 { 4.0 } else { 2.0 };
        let holders = if dual { 2.0 } else { 1.0 };
        // Memory, the most loaded stage.
        let mut worst = Memory { capacity: self.capacity, reserved: self.reserved, ..Memory::default() };
        // The EP overlap's combined 1F1B warms up one chunk forward more (`in_flight`).
        let extra_warmup = s.ep_overlap && key.ep > 1;
        // Offloaded activations wait in host memory for their backward, for every
        // micro-batch in flight, as they would have on the GPU.
        // DualPipe keeps pp + 1 chunks' activations on every rank. DualPipeV holds what 1F1B
        // over its 2·pp stages would: 2·pp - s micro-batches on stage s (its schedule's
        // forwards ahead of the first backward, plus the one its steady phase pairs), so
        // rank r's two stages hold 2·pp + 1 together, the README's PP + 1.
        let in_flight = |st: usize| if dual { (pp as f64 + 1.0).min(mf) } else { self.in_flight(st, n_stages, vp, m, extra_warmup) };
        // Bytes of `f` (a stage's per micro-batch) a rank holds at its peak.
        let held = |st: usize, f: fn(&Stage) -> f64| {
            if v {
                let back = n_stages - 1 - st;
                in_flight(st) * f(&legs[st]) + in_flight(back) * f(&legs[back])
            } else {
                in_flight(st) * f(&stages[st])
            }
        };
        // Without offload every stage's host bytes are 0, and so is the most of them
        // (the micro-batches in flight are finite): not worked out per stage.
        let host_gib =
            if s.offload_layers == 0 { 0.0 } else { (0..pp).map(|st| held(st, |x| x.host) * (1.0 + self.slack) / GIB).fold(0.0, f64::max) };
        for (st, stage) in stages.iter().enumerate() {
            let p = &stage.params;
            let StageParams { dense: d, expert: e, frozen: f, low: lw, side, .. } = *p;
            let n_dense = f64::from(dp * key.cp);
            let n_exp = f64::from(edp);
            // Frozen weights: BF16 values only, sharded like dense ones under FSDP.
            let (w, g, o) = if s.fsdp {
                let [big, big_trained, _] = self.largest;
                let shard = d / n_dense + e / n_exp;
                (2.0 * (shard + f / n_dense) + 2.0 * 2.0 * big, gb * shard + gb * big_trained, 12.0 * shard)
            } else if s.distributed_optimizer || muon {
                // Muon's layer-wise optimizer owns whole weights per rank: fp32 master and
                // momentum, 8 B, for AdamW's 12, which the embedding and the output layer
                // keep.
                let o = if muon { 8.0 * ((d - side) / n_dense + e / n_exp) + 12.0 * side / n_dense } else { 12.0 * (d / n_dense + e / n_exp) };
                (2.0 * (d + e + f), gb * (d + e), o / holders)
            } else {
                (2.0 * (d + e + f), gb * (d + e), 12.0 * (d + e))
            };
            // The casts of each low-precision GEMM weight (row-wise and transposed) stay
            // resident; under FSDP weights exist whole only per gathered unit (the one
            // in use and the one prefetched), and so do their casts.
            let cast = self.cast_bytes;
            let w = if s.fsdp {
                w + 2.0 * cast * self.largest[2]
            } else if s.distributed_optimizer && !muon && self.fp8_params {
                // FP8 parameters: the low-precision copy and its transpose replace the
                // BF16 one.
                w - 2.0 * lw + cast * lw
            } else {
                w + cast * lw
            };
            // The embedding's activations for every micro-batch in flight through the first
            // stage, the head's for one; under DualPipe both end ranks hold both ends, each
            // for half the micro-batches; under DualPipeV rank 0 holds both.
            let end = st == 0 || st == pp - 1;
            let (first, last) = if dual { (end, end) } else if v { (st == 0, st == 0) } else { (st == 0, st == pp - 1) };
            let a = held(st, |x| x.acts)
                + stages[st].offload
                + if first { in_flight(0) / holders * (self.pre.activations[pol] - self.pre.selective(selective).1) } else { 0.0 }
                + if last { self.post.activations[pol] - self.post.selective(selective).1 } else { 0.0 };
            let a = a * (1.0 + self.slack);
            let total = (w + g + o + a) / GIB + self.reserved;
            if total > worst.total {
                worst = Memory {
                    weights: w / GIB,
                    gradients: g / GIB,
                    optimizer: o / GIB,
                    activations: a / GIB,
                    reserved: self.reserved,
                    total,
                    capacity: self.capacity,
                    stage: st as u32,
                    ..Memory::default()
                };
            }
        }
        worst.host_offload = host_gib;
        worst.host_capacity = self.host.map_or(0.0, |h| h.capacity);
        worst
    }

    /// The step time, its breakdown and communication of a staged schedule, with its
    /// `worst` memory ([`Costed::memory`]): the rest of [`Costed::evaluate`].
    fn project(&self, x: &Staged, worst: Memory) -> Projection {
        let Staged { ref s, ref stages, ref legs, n_stages, pp, vp, dp, m, dual, v, stage_gpus, expert_ranks, muon, .. } = *x;
        let key = self.key;
        let crit = (0..pp).max_by(|&a, &b| stages[a].t.total_cmp(&stages[b].t)).unwrap_or(0);
        let t_max = stages[crit].t;
        let mean = |f: fn(&Stage) -> f64| stages.iter().map(f).sum::<f64>() / pp as f64;
        let t_mean = mean(|x| x.t);
        let mf = f64::from(m);
        let bubble = if dual || v {
            // (PP/2 - 1)(F&B + B - 3W) over PP stages: F&B a forward and a backward chunk
            // run together (a stage's time per micro-batch), B a whole backward, W its
            // weight-gradient part: a third of the GEMMs' time (forward, input and weight
            // gradients are the same FLOPs); attention and memory-bound work have none. A
            // DualPipe rank's figures are a stage's (its two stages' mean); a DualPipeV
            // rank's are two stages' (their sum), half of them a chunk's.
            let chunk = if v { 0.5 } else { 1.0 };
            let (b_mean, w_mean) = (mean(|x| x.bwd), mean(|x| x.comp[6] / 3.0));
            (n_stages as f64 / 2.0 - 1.0) * (chunk * (t_mean + b_mean - 3.0 * w_mean)).max(0.0)
        } else {
            (pp as f64 - 1.0) / vp as f64 * t_mean
        };
        let fabric = &self.rates.fabric;
        // Pipeline sends: 2 per chunk per micro-batch (activation forward, gradient back).
        let ppg = Placement { size: 2, stride: saturate(stage_gpus) };
        let (pp_total, pp_exposed) = if pp > 1 {
            let msg = fabric.time(OpKind::Send, self.stage_message_bytes, ppg);
            // A DualPipeV rank sends for both its stages, but the V turns on rank pp-1
            // (stage pp-1 to pp, no send) and the ends have no outer neighbour: ranks 0 and
            // pp-1 send 2 a micro-batch, those between 4. A micro-batch crosses 2·pp-2 links.
            let (per_micro_batch, hops) = match (v, pp) {
                (true, 2) => (2.0, n_stages - 2),
                (true, _) => (4.0, n_stages - 2),
                (false, _) => (2.0 * vp as f64, pp - 1),
            };
            let sends = mf * per_micro_batch * msg;
            // DualPipe (and DualPipeV) sends a chunk's output while the paired chunk
            // computes: only the fill and the drain wait for theirs.
            let hidden = if dual || v { 1.0 } else { self.rates.pp_overlap };
            (sends, sends * (1.0 - hidden) + 2.0 * hops as f64 * msg)
        } else {
            (0.0, 0.0)
        };
        // Data parallelism over the critical stage's parameters.
        let StageParams { dense, expert, frozen, ns_dense, ns_expert, low_trained, side, .. } = stages[crit].params;
        let dpg = Placement { size: dp.saturating_mul(key.cp), stride: key.tp };
        let edp = saturate(stage_gpus / expert_ranks);
        let edpg = Placement { size: edp, stride: saturate(expert_ranks) };
        let stage_fwd = stages[crit].fwd;
        // Bytes per element over the dense and the expert group.
        let grads = |kind: OpKind, (on_dense, on_expert): (f64, f64)| {
            fabric.time(kind, on_dense * dense, dpg) + fabric.time(kind, on_expert * expert, edpg)
        };
        // The distributed optimizer gathers FP8 parameters in their format (Megatron's
        // fp8_param_gather): one byte per element of a trained low-precision GEMM weight
        // (MXFP8 with its block scales), BF16 for the rest.
        let gathered = |n: f64, low: f64| if n > 0.0 { 2.0 - (2.0 - self.fp8_param_bytes) * low.min(n) / n } else { 2.0 };
        let params = if self.fp8_params { (gathered(dense, low_trained[0]), gathered(expert, low_trained[1])) } else { (2.0, 2.0) };
        let gb = if s.grad_fp32 { 4.0 } else { 2.0 };
        let grad_bytes = (gb, gb);
        // A tied embedding is one weight on two stages: Megatron all-reduces its gradient
        // between the first and the last stage once the data-parallel reduction is done,
        // before the optimizer step, so nothing hides it (github:NVIDIA/Megatron-LM
        // megatron/core/distributed/finalize_model_grads.py `_allreduce_word_embedding_grads`,
        // the whole gradient, at the gradient buffer's precision).
        let tied_sync = if pp > 1 && !v && self.tied > 0.0 {
            let ends = Placement { size: 2, stride: saturate(stage_gpus.saturating_mul(pp as u64 - 1)) };
            fabric.time(OpKind::AllReduce, gb * self.tied, ends)
        } else {
            0.0
        };
        let (dp_total, dp_exposed) = if s.fsdp {
            // FSDP gathers the frozen weights too; only trained ones have gradients.
            let gathers = grads(OpKind::AllGather, (2.0, 2.0)) + fabric.time(OpKind::AllGather, 2.0 * frozen, dpg);
            let per_mb = 2.0 * gathers + grads(OpKind::ReduceScatter, grad_bytes);
            let layers_here = stages[crit].layers.max(1) as f64;
            // What a micro-batch's compute cannot hide, plus one layer's share the first
            // gather waits for; never more than the whole step's traffic.
            (mf * per_mb, (mf * (per_mb - t_max).max(0.0) + per_mb / layers_here).min(mf * per_mb))
        } else {
            // Megatron reduces gradients in buckets of max(40M, 1M·dp) elements as the
            // backward produces them; the last bucket's reduction (and the first
            // bucket's parameter gather) has nothing left to hide behind. Dense and expert
            // parameters sit in buffers of their own, each bucketed for and reduced over
            // its own group, so the tail is the slower of the two last buckets (never more
            // than the whole reduction: a group of one moves nothing).
            let buckets = [runner_graph::shard::ddp_bucket_elems(dp * key.cp) as f64, runner_graph::shard::ddp_bucket_elems(edp) as f64];
            let tail_of = |kind: OpKind, (on_dense, on_expert): (f64, f64), d: f64, e: f64| {
                fabric.time(kind, on_dense * buckets[0].min(d), dpg).max(fabric.time(kind, on_expert * buckets[1].min(e), edpg))
            };
            let tail = |kind: OpKind, bytes: (f64, f64)| tail_of(kind, bytes, dense, expert);
            let ag_crit = || grads(OpKind::AllGather, params);
            // What the step waits for of the gradients' reduction (`kind` at `bytes`), the
            // most any stage leaves exposed. NeMo 2 and Megatron-Bridge both hand Megatron's
            // schedules a grad_sync_func per model chunk (github:NVIDIA/NeMo
            // nemo/lightning/megatron_parallel.py `extract_ddp_funcs`;
            // github:NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/setup.py
            // `_update_model_config_funcs`, align_grad_reduce on by default), and then
            // (github:NVIDIA/Megatron-LM megatron/core/pipeline_parallel/schedules.py):
            // - without a virtual pipeline, the first stage (and pp = 1) reduces bucket by
            //   bucket during its last micro-batch's backward; every other stage launches its
            //   whole reduction after its last backward, "during pipeline bubble": stage s
            //   has the drain, the last backward of the s stages before it, to hide it in;
            // - with one, each chunk's reduction is launched whole once its last micro-batch's
            //   backward is done, at the same time on every stage, so the c-th chunk from the
            //   end has c groups of pp chunk-backwards left to hide behind, the reductions
            //   queue on the one data-parallel communicator, and the last chunk's, launched
            //   at the stage's own end, is exposed but for the drain.
            // Also the largest stage's reduction, the traffic that exposure is part of.
            let exposed_reduction = |kind: OpKind, bytes: (f64, f64)| {
                let mut drain = 0.0;
                let (mut worst, mut largest) = (0.0f64, 0.0f64);
                let (on_dense, on_expert) = (fabric.rate(kind, dpg), fabric.rate(kind, edpg));
                for (i, st) in stages.iter().enumerate() {
                    let (d, e) = (st.params.dense, st.params.expert);
                    let all = on_dense.time(bytes.0 * d) + on_expert.time(bytes.1 * e);
                    let exposed = if vp > 1 {
                        let (a, b) = (all / vp as f64, st.bwd / vp as f64);
                        (1..vp).map(|c| (c + 1) as f64 * a - (c * pp) as f64 * b).fold((a - drain / vp as f64).max(0.0), f64::max)
                    } else if i == 0 {
                        (all - st.bwd).max(tail_of(kind, bytes, d, e))
                    } else {
                        (all - drain).max(0.0)
                    };
                    worst = worst.max(exposed);
                    largest = largest.max(all);
                    // A DualPipeV rank's last backward is its stage on the way down's: the
                    // ranks before it run only theirs after it.
                    drain += if v { legs[i].bwd } else { st.bwd };
                }
                (worst, largest)
            };
            // The same for the parameters' all-gather. Without a virtual pipeline Megatron
            // dispatches a bucket's gather at the forward pre-hook that needs it and
            // prefetches the next, so the first micro-batch's forward hides all but the first
            // bucket. With one, NeMo and Megatron-Bridge turn on align_param_gather (pp > 1,
            // vp > 1, dp > 1: github:NVIDIA-NeMo/Megatron-Bridge
            // src/megatron/bridge/training/comm_overlap.py), and the schedule dispatches the
            // first two chunks' gathers whole as the step starts and each later chunk's as the
            // group of pp micro-batches before it begins (schedules.py
            // `forward_step_helper_preprocess`, aligned across stages); they queue on the one
            // communicator, and chunk c is needed, bucket by bucket, through its first
            // forward after c groups, the stage's fill later on later stages.
            let exposed_gather = || {
                if vp <= 1 {
                    return ((ag_crit() - stage_fwd).max(tail(OpKind::AllGather, params)), ag_crit());
                }
                let (mut fill, mut worst, mut largest) = (0.0, 0.0f64, 0.0f64);
                let (on_dense, on_expert) = (fabric.rate(OpKind::AllGather, dpg), fabric.rate(OpKind::AllGather, edpg));
                for (i, st) in stages.iter().enumerate() {
                    let (d, e, low) = (st.params.dense, st.params.expert, st.params.low_trained);
                    let bytes = if self.fp8_params { (gathered(d, low[0]), gathered(e, low[1])) } else { (2.0, 2.0) };
                    let all = on_dense.time(bytes.0 * d) + on_expert.time(bytes.1 * e);
                    let (a, f, start) = (all / vp as f64, st.fwd / vp as f64, fill / vp as f64);
                    let group = pp as f64 * f;
                    let first = if i == 0 { tail_of(OpKind::AllGather, bytes, d, e) } else { 0.0 };
                    let (mut done, mut exposed) = (a, (a - f - start).max(first));
                    for c in 1..vp {
                        done = if c == 1 { done + a } else { done.max((c - 1) as f64 * group) + a };
                        exposed = exposed.max(done - c as f64 * group - f - start);
                    }
                    worst = worst.max(exposed);
                    largest = largest.max(all);
                    fill += st.fwd;
                }
                (worst, largest)
            };
            if s.distributed_optimizer && !muon {
                let rs = grads(OpKind::ReduceScatter, grad_bytes);
                let ag = ag_crit();
                if s.dp_overlap {
                    let (exposed, largest) = exposed_reduction(OpKind::ReduceScatter, grad_bytes);
                    let (exposed_ag, largest_ag) = exposed_gather();
                    (largest + largest_ag, exposed + exposed_ag)
                } else {
                    (rs + ag, rs + ag)
                }
            } else {
                let (all, ar) = if s.dp_overlap {
                    let (exposed, largest) = exposed_reduction(OpKind::AllReduce, grad_bytes);
                    (largest, exposed)
                } else {
                    let all = grads(OpKind::AllReduce, grad_bytes);
                    (all, all)
                };
                // Muon's layer-wise distributed optimizer all-reduces the gradients and
                // all-gathers the updated weights after the step, unhidden
                // (Megatron-Bridge's Kimi-K2 recipe: overlap_param_gather False, "Muon
                // needs this to be False").
                let gather = if muon { grads(OpKind::AllGather, (2.0, 2.0)) } else { 0.0 };
                (all + gather, ar + gather)
            }
        };
        // AdamW over the shard: fp32 master, two moments and the gradient read and
        // written (28 B), plus the full gradient buffer zeroed and its norm taken (8 B).
        // Muon: each rank updates the weights it owns, fp32 master and momentum read and
        // written, the gradient read and the BF16 weight written (22 B), and
        // orthogonalises their momentum (Newton-Schulz in BF16 GEMMs,
        // `muon_fp32_matmul_prec = "medium"`); the embedding and the output layer take
        // AdamW's 28 B.
        // Under DualPipe each stage's weights sit on two ranks of every data-parallel
        // replica, so a sharded optimizer spreads them over twice the holders.
        let holders = if dual { 2.0 } else { 1.0 };
        let shard = |n: f64, g: u32| if s.fsdp || s.distributed_optimizer || muon { n / f64::from(g.max(1)) / holders } else { n };
        let local = shard(dense, dp * key.cp) + shard(expert, edp);
        let optimizer = if muon {
            let ns = shard(ns_dense, dp * key.cp) + shard(ns_expert, edp);
            let adamw = shard(side, dp * key.cp);
            (22.0 * (local - adamw) + 28.0 * adamw + 8.0 * (dense + expert)) / self.rates.hbm
                + self.rates.gemm(ns, ns, 0.0, crate::profile::GemmFormat::Bf16)
        } else {
            (28.0 * local + 8.0 * (dense + expert)) / self.rates.hbm
        };
        let casts = stages[crit].comp[5];
        let mut breakdown = Breakdown {
            compute: mf * stages[crit].comp[0] + casts,
            compute_parts: ComputeParts {
                gemm: mf * stages[crit].comp[6],
                attention: mf * stages[crit].comp[7],
                scan: mf * stages[crit].comp[8],
            },
            recompute: mf * stages[crit].comp[1],
            tp: mf * stages[crit].comp[2],
            cp: mf * stages[crit].comp[3],
            ep: mf * stages[crit].comp[4],
            pp: pp_exposed + tied_sync,
            dp: dp_exposed,
            bubble,
            optimizer,
            offload: mf * stages[crit].comp[OFFLOAD],
            straggler: 0.0,
        };
        let rates = &self.rates;
        let has_experts = stages[crit].params.expert > 0.0;
        let groups = [
            (GroupName::Tp, rates.placement(&key, Group::Tp)),
            (GroupName::Cp, rates.placement(&key, Group::Cp)),
            (GroupName::Ep, rates.placement(&key, Group::Ep)),
            (GroupName::Etp, rates.placement(&key, Group::Etp)),
            // A send runs between a stage and the next, wherever the other stages are.
            (GroupName::Pp, ppg),
            (GroupName::Dp, dpg),
            (GroupName::Edp, edpg),
        ]
        .into_iter()
        .filter_map(|(group, p)| {
            let ranks = if group == GroupName::Pp { s.pp } else { p.size };
            // A model without routed experts has no expert groups to show.
            let expert_group = matches!(group, GroupName::Ep | GroupName::Etp | GroupName::Edp);
            if ranks <= 1 || (expert_group && !has_experts) {
                return None;
            }
            let (per_domain, inside) = fabric.members_per_domain(p);
            let fabric = if inside { Link::ScaleUp } else { Link::ScaleOut };
            Some(GroupPlace { group, ranks, stride: p.stride, fabric, per_domain })
        })
        .collect();
        let comm = Communication {
            tp: mf * stages[crit].comp[COMM_SLOTS],
            cp: mf * stages[crit].comp[COMM_SLOTS + 1],
            ep: mf * stages[crit].comp[COMM_SLOTS + 2],
            pp: pp_total + tied_sync,
            dp: dp_total,
            groups,
        };
        let gpus = stage_gpus * pp as u64;
        breakdown.straggler = self.straggler * straggler_excess(gpus) * breakdown.total();
        let step = breakdown.total();
        let sequences = f64::from(s.global_batch);
        let n = gpus as f64;
        let tflops = self.flops_per_sequence * sequences / step / n / 1e12;
        Projection {
            layout: LayoutSpec::new(key, *s),
            gpus,
            step_time_s: step,
            tokens_per_sec_per_gpu: f64::from(self.seq_len) * sequences / step / n,
            model_tflops_per_gpu: tflops,
            mfu: tflops * 1e12 / self.peak,
            memory_per_gpu_gib: worst.total,
            fits: worst.fits(),
            memory: worst,
            breakdown,
            comm,
            micro_batches: m,
            pipeline_model_parallel_layout: None,
        }
    }

    /// Micro-batches' worth of a stage's layer activations held at the 1F1B peak:
    /// pp−s on stage s, or with interleaving Megatron's warm-up count of chunks plus
    /// one, in stage units (never more than the step has). With the MoE EP overlap
    /// (`overlap_moe_expert_parallel_comm`) the interleaved warm-up runs one chunk forward
    /// more, so that each overlapped step pairs a forward and a backward of different
    /// micro-batches (`num_warmup_microbatches += 1` in
    /// `get_pp_rank_microbatches`, megatron/core/pipeline_parallel/schedules.py).
    fn in_flight(&self, s: usize, pp: usize, vp: usize, m: u32, ep_overlap: bool) -> f64 {
        use runner_graph::pipeline::{warmup_chunk_forwards, warmup_forwards};
        let m = m as usize;
        if vp <= 1 {
            return (warmup_forwards(pp, s, m) + 1).min(m) as f64;
        }
        ((warmup_chunk_forwards(pp, s, vp, m) + usize::from(ep_overlap) + 1).min(m * vp)) as f64 / vp as f64
    }
}

/// Share of a host link's rate pinned-memory copies reach (assumed, not fitted: of the
/// published runs only two offload, both over NVLink-C2C where the copies hide).
const HOST_LINK_EFFICIENCY: f64 = 0.8;

/// Slots of a stage's breakdown sums: compute, recompute, exposed tp, cp, ep, weight
/// casts, and of compute the GEMMs, the attention cores and the Mamba scans; then exposed
/// offload; then the tp, cp, ep collectives' seconds, hidden or not.
const COMP: usize = 13;
const OFFLOAD: usize = 9;
const COMM_SLOTS: usize = 10;

/// Add [`Row`] fields (`d(i)`: one layer's, or a range's sum) to a stage's breakdown sums
/// under recompute policy `pol` and overlap setting `ov` (what a stage's times need of a
/// row); the selective modules' forward is the caller's to add.
#[inline]
fn add_comp(comp: &mut [f64; COMP], d: impl Fn(usize) -> f64, pol: usize, ov: usize) {
    comp[0] += d(0);
    comp[6] += d(1);
    comp[7] += d(2);
    comp[8] += d(SCAN);
    comp[1] += d(RECOMPUTE + 3 * ov + pol);
    for i in 0..3 {
        comp[2 + i] += d(EXPOSED + 3 * ov + i);
        comp[COMM_SLOTS + i] += d(COMM + i);
        // Full recompute re-runs the layer's forward, its collectives with it (F7).
        if pol == FULL_POLICY {
            comp[COMM_SLOTS + i] += d(COMM_FWD + i);
        }
    }
    comp[5] += d(3);
}

/// A row's parameter fields: all that a stage's memory needs of it.
#[inline]
fn add_params(params: &mut StageParams, d: impl Fn(usize) -> f64) {
    params.dense += d(4);
    params.expert += d(5);
    params.frozen += d(6);
    params.low += d(7);
    params.low_trained[0] += d(LOW_TRAINED);
    params.low_trained[1] += d(LOW_TRAINED + 1);
    params.ns_dense += d(8);
    params.ns_expert += d(9);
}

fn plan_formats_equal(plan: &Plan, a: &[String], b: &[String]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| plan.formats(x) == plan.formats(y))
}

/// GPUs of the node the efficiencies hold at: the straggler term counts the wait beyond
/// theirs.
const STRAGGLER_BASE_GPUS: u64 = 8;

/// The largest GPU count among the published runs the straggler spread is fitted to
/// (`data/calibration.toml`: DGX Cloud's 2,048-H100 rows); past it the term is its law
/// carried beyond the data, which the explorer says.
pub const STRAGGLER_FITTED_UP_TO: u64 = 2048;

/// How many standard deviations of a rank's step time `gpus` ranks wait for their slowest,
/// beyond what [`STRAGGLER_BASE_GPUS`] wait (0 at or below them): E[max of n standard
/// normal draws], the expected largest of n, grows like √(2 ln n) (n = 8: 1.42, 64: 2.34,
/// 1,024: 3.25, 16,384: 3.97). Memoised per count for the process (each quadrature takes
/// about half a millisecond), and each thread checks the count it asked for last first: a
/// search asks for one count hundreds of thousands of times.
pub fn straggler_excess(gpus: u64) -> f64 {
    static SEEN: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<u64, f64>>> = std::sync::OnceLock::new();
    thread_local! {
        static LAST: std::cell::Cell<(u64, f64)> = const { std::cell::Cell::new((0, 0.0)) };
    }
    if gpus <= STRAGGLER_BASE_GPUS {
        return 0.0;
    }
    let (n, x) = LAST.get();
    if n == gpus {
        return x;
    }
    let seen = SEEN.get_or_init(Default::default);
    let known = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&gpus).copied();
    let x = known.unwrap_or_else(|| {
        let x = expected_max_normal(gpus) - expected_max_normal(STRAGGLER_BASE_GPUS);
        seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(gpus, x);
        x
    });
    LAST.set((gpus, x));
    x
}

/// E[max of `n` independent standard normal draws]: the sum of x over the change of
/// Φ(x)ⁿ on a fine grid (Φ by the trapezoid rule on the same grid), over ±12.
pub fn expected_max_normal(n: u64) -> f64 {
    const H: f64 = 1e-3;
    const LO: f64 = -12.0;
    let steps = (24.0 / H) as usize;
    let pdf = |x: f64| (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let nf = n.max(1) as f64;
    let (mut cdf, mut prev_pow, mut sum) = (0.0f64, 0.0f64, 0.0f64);
    for i in 0..steps {
        let x0 = LO + i as f64 * H;
        cdf = (cdf + 0.5 * H * (pdf(x0) + pdf(x0 + H))).min(1.0);
        let pow = cdf.powf(nf);
        sum += (x0 + 0.5 * H) * (pow - prev_pow);
        prev_pow = pow;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::{expected_max_normal, straggler_excess};

    /// Against the tabulated expected largest of n standard normal draws (Harter, 1961;
    /// n = 2 is 1/√π exactly).
    #[test]
    fn the_expected_largest_normal_draw_matches_the_tables() {
        for (n, want) in [(1, 0.0), (2, 0.564190), (3, 0.846284), (5, 1.162964), (10, 1.538753), (100, 2.507594), (1000, 3.241436)] {
            let got = expected_max_normal(n);
            assert!((got - want).abs() < 1e-4, "n = {n}: {got} vs {want}");
        }
        assert_eq!(straggler_excess(8), 0.0);
        assert_eq!(straggler_excess(1), 0.0);
        let (a, b, c) = (straggler_excess(64), straggler_excess(1024), straggler_excess(16384));
        assert!(0.0 < a && a < b && b < c, "{a} {b} {c}");
        assert!((b - (expected_max_normal(1024) - expected_max_normal(8))).abs() < 1e-12);
    }
}
