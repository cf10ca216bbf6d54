//! [`Executor`]: one graph's training state on one [`Device`], and the schedule that
//! runs forward, backward and the optimizer over it: AdamW, or Muon on the hidden
//! matrices and AdamW on the rest (`executor/muon.rs`, [`Executor::set_optimizer`]).
//!
//! The executor owns every buffer: weights (initialised from a seed), their gradients
//! and optimizer state (AdamW's two moments, or Muon's one momentum), the graph inputs, activations, the statistics ops save for their
//! backward, and activation gradients. It follows the liveness of the
//! [`BackwardPlan`]: an activation is freed right after its last forward reader unless a
//! backward step needs it, a saved one right after the last step that reads it, an
//! activation gradient right after the step of the op that produced the activation. So
//! the real peak stays close to the sum of the tensors the graph needs live at once,
//! which [`Executor::memory`] reports next to the measured peak.
//!
//! Under FSDP (a sharded layout with `fsdp: true`, `executor/fsdp.rs`) a rank keeps only
//! its 1/n shard of the covered weights, gradients and moments between steps; each pass
//! gathers the whole weights and frees each after its last reader, and the step's
//! reduction reduce-scatters the gradients.
//!
//! Weight initialisation is deterministic and independent of graph order: each weight's
//! stream is seeded from the run seed and a hash of its name, so a 2-layer proxy and the
//! full model start `layers.0.*` identically. Matrices draw from N(0, 0.02²); norm gains
//! are 1 and biases 0 (recognised by the op slot that reads them). A rank of a sharded
//! graph ([`Executor::for_rank`]) fills each weight it holds a part of with that part of
//! the unsharded weight's stream (the stream is counter-based, so a part is drawn without
//! the rest), so tp, ep and etp ranks start as the unsharded model would, as Megatron
//! slices a master weight, rather than every rank from the same values.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use runner_graph::autodiff::{BackwardPlan, backward_plan};
use runner_graph::recompute::{RecomputePolicy, RecomputeSchedule, schedule};
use runner_graph::validate::validate;
use runner_graph::shard::WeightSplit;
use runner_graph::{DType, Graph, OpKind, TensorId, TensorKind};
use runner_kernels::cpu::adamw::AdamW;
use serde::Serialize;

use crate::collective::Collective;
use crate::device::{Device, DeviceBuffer, Elem, ExecError, Plans, write_adamw_scalars};
use ops::{BackwardIo, GradTarget};

/// AdamW as most pretraining recipes set it (Llama 3: β2 0.95, weight decay 0.1).
pub const ADAMW_DEFAULT: AdamW = AdamW {
    lr: 1e-3,
    beta1: 0.9,
    beta2: 0.95,
    eps: 1e-8,
    weight_decay: 0.1,
};

/// Device bytes an executor holds besides the model's state, inputs and loss: the
/// constant 1 its backward copies the loss gradient from and AdamW's scalars.
pub const CONSTANT_BYTES: u64 = 4 * (1 + runner_kernels::cpu::adamw::Scalars::WORDS as u64);

/// Executor settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecOptions {
    /// Seed of the weight initialisation.
    pub seed: u64,
    /// Standard deviation of matrix weights.
    pub init_std: f32,
    /// Time every op (device events around each op, resolved after the step; free on
    /// the CPU).
    pub profile: bool,
    /// Store every activation an op writes in its declared format (BF16 activations
    /// rounded to nearest-even after each op), computing in f32 as mixed-precision
    /// training does. Off: everything stays f32 (the PyTorch f32 comparison).
    pub emulate_storage: bool,
    /// Activation recomputation: which forward work the backward repeats instead of
    /// keeping its activations (see [`RecomputeSchedule`]).
    pub recompute: RecomputePolicy,
    /// Hand a linear's per-tensor FP8 operands to the device's FP8 GEMM as FP8 codes
    /// (cuBLASLt on tensor cores) instead of multiplying their dequantised f32 copies.
    /// The product is the same either way up to accumulation order (f32 accumulation of
    /// the same values; tensor cores sum in their own order);
    /// `None`: the device's choice ([`Device::native_fp8`]: CUDA yes, CPU no).
    pub native_fp8: Option<bool>,
    /// Record the whole training step once as a CUDA graph and replay it every step
    /// after (`executor/graph.rs`): one launch instead of one per kernel, for steps of
    /// many small ops. Only [`Executor::step`] runs then; what cannot be recorded is
    /// refused up front ([`Executor::graph_blocker`]).
    pub cuda_graph: bool,
    /// The order of a pipeline stage's passes over several micro-batches
    /// ([`Executor::step_micro_batches`]; `executor/pipeline.rs`): 1F1B by default.
    pub pipeline_schedule: PipelineSchedule,
    /// Start the data-parallel gradient all-reduces during the backward, a bucket at a
    /// time as its gradients are final (`executor/overlap.rs`; Megatron's
    /// `overlap_grad_reduce`). The same bits either way; on by default.
    pub overlap_grad_reduce: bool,
    /// Gradient elements per bucket of the overlapped reduction (a bucket closes once it
    /// holds at least this many); `None`: Megatron's max(40M, 1M·ranks) for each group
    /// ([`runner_graph::shard::ddp_bucket_elems`]).
    pub grad_bucket_elems: Option<usize>,
    /// FSDP passes start the next layer's parameter all-gather as soon as they have
    /// gathered one (PyTorch FSDP's forward and backward prefetch), so it runs while the
    /// layer computes; at most one is in flight (`executor/fsdp.rs`). The same bits
    /// either way; on by default.
    pub fsdp_prefetch: bool,
    /// FSDP keeps gradients sharded across micro-batches: each micro-batch's
    /// reduce-scatter runs as its backward finishes a unit (PyTorch FSDP's default), so
    /// no whole gradient outlives its unit's backward. Off: micro-batches accumulate
    /// whole gradients and one reduce-scatter a step runs (PyTorch's `no_sync`), the
    /// sums bit for bit plain data parallelism's. The same at one micro-batch; on by
    /// default (`executor/fsdp.rs`).
    pub fsdp_sharded_grads: bool,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            seed: 0,
            init_std: 0.02,
            profile: false,
            emulate_storage: false,
            recompute: RecomputePolicy::None,
            native_fp8: None,
            cuda_graph: false,
            pipeline_schedule: PipelineSchedule::OneFOneB,
            overlap_grad_reduce: true,
            grad_bucket_elems: None,
            fsdp_prefetch: true,
            fsdp_sharded_grads: true,
        }
    }
}

/// Host data for one graph input.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// Token ids, targets, positions (graph dtype int32).
    U32(&'a [u32]),
    /// A floating-point input.
    F32(&'a [f32]),
}

/// Memory accounting of the last step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct MemoryReport {
    /// Bytes the device held at most during the last forward + backward + optimizer.
    pub peak_bytes: u64,
    /// Peak of the sum of the tensors the graph needs live at once, under the plan's
    /// liveness: parameters, gradients, optimizer state, inputs, live activations, saved
    /// activations and statistics, live activation gradients (4 bytes per element),
    /// and the flat copies the step's gradient reduction makes (its all-reduces', an
    /// overlapped bucket's from the backward step that starts it); under Muon, at least
    /// the state at rest, the inputs and the largest matrix's Newton–Schulz scratch.
    /// Tensors whose rows follow the expert routing (expert parallelism) count at their
    /// graph shape, the balanced routing's.
    pub required_bytes: u64,
    /// Parameters alone (f32), whole: what the rank's graph computes with (on an FSDP
    /// rank, what a pass gathers; its share at rest is in `state_bytes`).
    pub param_bytes: u64,
    /// What keeping every activation and gradient to the end would need, for contrast.
    pub keep_everything_bytes: u64,
    /// Parameters, gradients and optimizer state held between steps: 4 × `param_bytes`
    /// when every weight trains under AdamW and nothing is sharded (3 × for the
    /// matrices Muon takes, one momentum instead of two moments); on an FSDP rank, this rank's
    /// pieces of the sharded weights (about 1/n of them) plus the others whole.
    pub state_bytes: u64,
    /// Micro-batches the last step held between their forward and their backward at
    /// once (a 1F1B pipeline stage: up to its distance to the last stage, plus one; an
    /// interleaved one: the chunk forwards held over the chunks per stage, rounded up);
    /// `required_bytes` counts what each of the others keeps for its backward.
    pub micro_batches_in_flight: u64,
}

/// Wall time of each op and phase of the last step (filled when profiling).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepProfile {
    /// Seconds per forward op, indexed like `Graph::ops`.
    pub forward_op_s: Vec<f64>,
    /// Seconds per backward step, indexed like `Graph::ops` (0 for ops without one).
    pub backward_op_s: Vec<f64>,
    /// Seconds of each weight's optimizer update, indexed like `Graph::tensors`.
    pub optimizer_tensor_s: Vec<f64>,
    pub forward_s: f64,
    /// Whole backward, re-runs of recomputed segments included.
    pub backward_s: f64,
    /// The part of `backward_s` spent re-running forward segments.
    pub recompute_s: f64,
    /// Forward ops re-run by the last backward, in the order they ran.
    pub recomputed_ops: Vec<usize>,
    /// Seconds of each op's re-run in the last backward, indexed like `Graph::ops`.
    pub recompute_op_s: Vec<f64>,
    pub optimizer_s: f64,
    /// Seconds inside collective calls since the forward began: the graph's collective
    /// ops (included in `forward_s` and `backward_s`), the step's gradient reduction
    /// ([`Executor::reduce_gradients`], outside the three phases) and Muon's gathers and
    /// broadcasts (included in `optimizer_s`). 0 unsharded. Of an
    /// overlapped bucket ([`ExecOptions::overlap_grad_reduce`]), or of an FSDP
    /// prefetched gather or reduce-scatter, it counts the start and the wait for the
    /// end, not the time it ran beside the compute.
    pub communication_s: f64,
    /// The buckets of the last step's overlapped gradient reduction, in the order they
    /// started: the `dp`/`edp` all-reduces' buckets, and under FSDP each unit's
    /// reduce-scatter started during the backward (empty when it did not overlap).
    pub grad_buckets: Vec<GradBucket>,
}

/// Which backward steps a backward pass runs (all, or one pipeline chunk's:
/// `pipeline.rs`), and whether it begins the micro-batch's backward (seeding the loss
/// gradient) and ends it (the chunks run last to first).
pub(super) struct BackwardSpan {
    pub(super) steps: Range<usize>,
    pub(super) begins: bool,
    pub(super) ends: bool,
}

/// What running one forward op yields: its outputs and the statistics it saves.
type Produced<B> = (Vec<B>, Vec<B>);

/// One graph's training state on device `D`.
pub struct Executor<D: Device> {
    /// Graph mode's eager first step, then the recorded step (`executor/graph.rs`).
    /// Declared before the device so the recording is destroyed while the device's
    /// kernels and handles still exist.
    recorded: graph::GraphState<D>,
    graph: Graph,
    plan: BackwardPlan,
    /// When to free activations and which forward segments the backward re-runs.
    sched: RecomputeSchedule,
    /// Per op: a backward step reads the statistics it saves (`aux`). An op without a
    /// step (a norm under frozen weights only, as LoRA's first layer's after its frozen
    /// embedding) keeps none: nothing would free them to the next forward, and the
    /// memory account ([`walk_live`]) counts a step's statistics only.
    reads_aux: Vec<bool>,
    device: D,
    options: ExecOptions,
    /// Values by tensor id: weights and inputs always, activations while live.
    vals: Vec<Option<D::Buffer>>,
    /// Gradients by tensor id: weights persistently, activations while live.
    grads: Vec<Option<D::Buffer>>,
    /// AdamW moments of each weight AdamW updates.
    moments: Vec<Option<(D::Buffer, D::Buffer)>>,
    /// Muon's momentum of each weight Muon updates (`muon.rs`).
    momentum: Vec<Option<D::Buffer>>,
    /// The optimizer the steps run, and per tensor whether Muon updates it (empty
    /// under AdamW).
    optimizer: muon::Optimizer,
    muon: Vec<bool>,
    /// Per tensor, how a Muon matrix is split over the tensor-parallel ranks (`None`:
    /// whole on this rank, or orthogonalised as this rank's block alone under
    /// `MuonTpMode::Blockwise`), set with `muon`.
    muon_split: Vec<Option<muon::MuonSplit>>,
    /// Per tensor, the data-parallel rank that updates a Muon matrix for its group and
    /// broadcasts it (`None`: this rank updates it alone), set with `muon`.
    muon_owner: Vec<Option<muon::Owner>>,
    /// Per tensor, the rank of an FSDP unit's group that runs a Muon matrix's
    /// Newton–Schulz and broadcasts it (`fsdp.rs`), set with `muon`.
    fsdp_muon_owner: Vec<Option<muon::Owner>>,
    /// Where each split weight's part lies in the unsharded weight (the sharding's,
    /// [`Executor::for_rank`]; empty otherwise).
    splits: BTreeMap<String, WeightSplit>,
    /// Saved statistics by op index.
    aux: Vec<Vec<D::Buffer>>,
    plans: Plans<D::Plan>,
    /// Weights whose gradient the last backward wrote.
    grad_written: Vec<bool>,
    /// Weights whose gradient holds the sum of earlier micro-batches of this step
    /// ([`Executor::backward_accumulate`]): the next backward adds to it.
    carry: Vec<bool>,
    forward_done: bool,
    backward_done: bool,
    adam_step: u32,
    loss: f32,
    profile: StepProfile,
    /// Upper bound on each int32 input's values (table rows / vocabulary) and who says so.
    int_bounds: HashMap<TensorId, (u64, String)>,
    /// Collective handles by group name (`tp`, `dp`, ...), for sharded graphs.
    collectives: HashMap<String, Box<dyn Collective<D>>>,
    /// Step-level collectives and communication time (`executor/comm.rs`).
    comm: comm::CommState<D>,
    /// The overlapped data-parallel reduction's buckets (`executor/overlap.rs`).
    buckets: overlap::Buckets<D::Buffer>,
    /// Device events of the per-op timings not yet resolved (profiling).
    pending: Pending<D::Event>,
    /// Expert-parallel exchanges and the data-dependent rows they set (`executor/ep.rs`).
    ep: ep::EpState,
    /// Per activation: the sum of the per-rank partial gradient contributions of the
    /// column-parallel (or width-split expert) linears that read it, and the group to
    /// all-reduce it over once it is complete (before the step that consumes it).
    pending_partials: HashMap<TensorId, (D::Buffer, &'static str)>,
    /// FSDP: this rank's shards of the weights it covers (`executor/fsdp.rs`).
    fsdp: fsdp::FsdpState<D::Buffer>,
    /// Precision plans of the linear and grouped (expert) linear layers, amax histories,
    /// numerics (`executor/quant.rs`).
    quant: quant::QuantState,
    /// FP8 codes an RMSNorm or MLP activation cast as it ran, waiting for the GEMM that reads
    /// them (`executor/quant.rs`, the fused cast).
    cast: Option<quant::Cast<D::Buffer, D::QuantStats>>,
    /// Statistics of the pass's quantisations still on the device, read at the pass's
    /// end (`Executor::settle_quant`).
    quant_stats: Vec<(quant::Key, D::QuantStats)>,
    /// The constant 1 the backward's loss gradient is copied from on the device.
    one: D::Buffer,
    /// AdamW's scalars of the coming step ([`Device::adamw`]), written before it.
    adam_scalars: D::Buffer,
    /// A step is being recorded (no events, no host transfers).
    capturing: bool,
    /// A forward of a step's later micro-batch is running: the step's peak and
    /// communication counts go on (`pipeline.rs`).
    mid_step: bool,
    /// Pipeline chunk forwards the last step held before their backward at once, and
    /// the chunks of a micro-batch on this rank (1 but on an interleaved pipeline).
    in_flight: u64,
    chunks: u64,
}

/// Device events around the ops, backward steps and optimizer updates of the current
/// phase, resolved into [`StepProfile`] when the phase ends, so profiling waits for the
/// device once per phase rather than after every op.
struct Pending<E> {
    /// (op, start, end) of forward ops.
    forward: Vec<(usize, E, E)>,
    /// (op, start, end) of backward steps.
    backward: Vec<(usize, E, E)>,
    /// (op, start, end) of re-runs in the backward.
    recompute: Vec<(usize, E, E)>,
    /// (weight, start, end) of AdamW updates.
    optimizer: Vec<(TensorId, E, E)>,
    /// (start, end) of each re-run segment.
    segments: Vec<(E, E)>,
}

impl<E> Default for Pending<E> {
    fn default() -> Self {
        Pending {
            forward: Vec::new(),
            backward: Vec::new(),
            recompute: Vec::new(),
            optimizer: Vec::new(),
            segments: Vec::new(),
        }
    }
}

/// SplitMix64: a tiny, fully specified generator, so initial weights are identical
/// across platforms and `rand` versions (rand's StdRng makes no such promise).
pub(crate) struct SplitMix(pub(crate) u64);

impl SplitMix {
    /// What the state advances by per draw.
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(Self::GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1].
    pub(crate) fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
    /// Standard normals by Box-Muller, two at a time.
    ///
    /// Each pair takes the next two draws, and SplitMix's state only advances by a
    /// constant per draw, so a chunk of pairs can start from its own offset: large
    /// tensors are filled in parallel with exactly the values one thread would give (a
    /// model's weights run to billions of values).
    pub(crate) fn normals(&mut self, out: &mut [f32], std: f32) {
        use rayon::prelude::*;
        const CHUNK: usize = 1 << 16; // values per parallel chunk (even)
        let start = self.0;
        out.par_chunks_mut(CHUNK).enumerate().for_each(|(i, chunk)| {
            SplitMix(start).normals_from(chunk, (i * CHUNK) as u64, std);
        });
        let draws = out.len().div_ceil(2) as u64 * 2;
        self.0 = start.wrapping_add(draws.wrapping_mul(Self::GAMMA));
    }

    /// Values `first..first + out.len()` of the stream [`SplitMix::normals`] draws from
    /// this state (the state is not advanced): value k is the cosine (k even) or sine
    /// (k odd) half of pair k / 2, which takes draws k − k % 2 and the one after.
    fn normals_from(&self, out: &mut [f32], first: u64, std: f32) {
        let at = |draw: u64| SplitMix(self.0.wrapping_add(draw.wrapping_mul(Self::GAMMA)));
        let (mut rest, mut k) = (out, first);
        if k % 2 == 1 {
            let Some((head, tail)) = rest.split_first_mut() else { return };
            let mut pair = [0f32; 2];
            at(k - 1).fill_pairs(&mut pair, std);
            *head = pair[1];
            (rest, k) = (tail, k + 1);
        }
        at(k).fill_pairs(rest, std);
    }

    /// A block of a tensor of shape `full` (row-major) filled as [`SplitMix::normals`]
    /// fills the whole: the block of shape `local` starting at index `start`, into
    /// `out` (row-major, `local`'s size). Indices past `full` along the first axis (a
    /// padded vocabulary) continue the stream.
    pub(crate) fn normals_block(&self, out: &mut [f32], full: &[u64], start: &[u64], local: &[u64], std: f32) {
        use rayon::prelude::*;
        let n = local.len();
        let Some(&run) = local.last() else { return };
        if run == 0 || full.len() != n || start.len() != n {
            return;
        }
        // Row-major strides of the full tensor.
        let mut stride = vec![1u64; n];
        for a in (0..n.saturating_sub(1)).rev() {
            stride[a] = stride[a + 1].saturating_mul(full[a + 1]);
        }
        out.par_chunks_mut(run as usize).enumerate().for_each(|(j, chunk)| {
            // Run j's index along the leading axes of `local`, last leading axis fastest.
            let (mut rem, mut first) = (j as u64, start[n - 1]);
            for a in (0..n - 1).rev() {
                let i = rem % local[a];
                rem /= local[a];
                first = first.wrapping_add((start[a] + i).wrapping_mul(stride[a]));
            }
            self.normals_from(chunk, first, std);
        });
    }

    /// Box-Muller pairs into `out`, one after another.
    fn fill_pairs(&mut self, out: &mut [f32], std: f32) {
        for pair in out.chunks_mut(2) {
            let (u1, u2) = (self.unit(), self.unit());
            let r = (-2.0 * u1.ln()).sqrt();
            let th = 2.0 * std::f64::consts::PI * u2;
            pair[0] = (r * th.cos()) as f32 * std;
            if let Some(p) = pair.get_mut(1) {
                *p = (r * th.sin()) as f32 * std;
            }
        }
    }
}

/// Where this rank's part (shape `local`) of weight `name` starts in the unsharded
/// weight: along each split axis, the part the rank's handle on the axis's group picks
/// ([`runner_graph::shard::SplitAxis`]).
///
/// # Errors
/// A split that does not fit the weight's shape, or a split axis whose group has no
/// handle here, or whose size the parts do not divide.
fn weight_origin<D: Device>(
    name: &str,
    local: &[u64],
    split: &WeightSplit,
    groups: &[(String, Box<dyn Collective<D>>)],
) -> Result<Vec<u64>, ExecError> {
    if split.full.len() != local.len() {
        return Err(ExecError::State(format!("weight '{name}' {local:?} is split from a weight of shape {:?}", split.full)));
    }
    let mut start = vec![0u64; local.len()];
    for a in &split.axes {
        let (axis, group) = (a.axis, a.group);
        let (Some(&l), Some(&f)) = (local.get(axis), split.full.get(axis)) else {
            return Err(ExecError::State(format!("weight '{name}': split axis {axis} is outside its shape {local:?}")));
        };
        let (rank, size) = groups
            .iter()
            .find(|(n, _)| n == group)
            .map(|(_, c)| (c.rank() as u64, c.size() as u64))
            .unwrap_or((0, 1));
        let parts = if a.per_rank { size } else { f / l.max(1) };
        if parts == 0 || size % parts != 0 || l.saturating_mul(parts) < f {
            return Err(ExecError::State(format!(
                "weight '{name}' holds {l} of {f} along axis {axis}, split over group '{group}', which has {size} \
                 rank(s) here; pass this rank's handle on '{group}' to Executor::for_rank"
            )));
        }
        start[axis] = rank / (size / parts) * l;
    }
    Ok(start)
}

/// FNV-1a of a name, to give every weight its own random stream.
fn name_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The buffer type of a graph dtype: int32 ids, f32 for every float (the executor
/// computes in f32; narrower storage is emulated, `ExecOptions::emulate_storage`).
fn elem_of(dtype: DType) -> Elem {
    if dtype == DType::I32 {
        Elem::I32
    } else {
        Elem::F32
    }
}

/// How a weight starts: 1 for norm gains and an SSD scan's skip `d` (mamba_ssm's
/// `D = ones`), 0 for biases (a causal conv's included) and LoRA up-projections (the
/// fine-tune starts at the base model), N(0, std²) otherwise.
fn init_kind(g: &Graph, id: TensorId) -> f32 {
    for op in &g.ops {
        for (slot, &i) in op.inputs.iter().enumerate() {
            if i != id {
                continue;
            }
            match (op.kind, slot) {
                (OpKind::RmsNorm | OpKind::LayerNorm, 1) | (OpKind::SsmScan, 5) => return 1.0,
                (OpKind::LayerNorm | OpKind::Linear | OpKind::CausalConv1d, 2) => return 0.0,
                (OpKind::Linear, 1) if op.text(runner_graph::peft::LORA_ATTR) == Some("b") => return 0.0,
                _ => {}
            }
        }
    }
    f32::NAN
}

impl<D: Device> Executor<D> {
    /// Validate `graph`, derive its backward pass, and allocate and initialise weights,
    /// gradients and optimizer state on `device`.
    ///
    /// # Errors
    /// An invalid graph, or allocation failure.
    pub fn new(graph: &Graph, device: D, options: ExecOptions) -> Result<Executor<D>, ExecError> {
        Self::with_collectives(graph, device, options, Vec::new())
    }

    /// As [`Executor::new`], for one rank of a sharded graph
    /// ([`runner_graph::shard::shard`]): its collective ops run through `groups`, one
    /// handle per group name the graph uses (`tp`, `pp`, `ep`, ...), each this rank's
    /// handle on that group (see [`crate::collective::ThreadGroup`]). Everything the
    /// sharding emits runs: tensor parallelism (with or without sequence parallelism and
    /// its all-to-all, vocab-parallel embedding and loss included), context parallelism's
    /// K/V all-gathers, pipeline send/recv, and expert parallelism's all-to-alls (group
    /// `ep`: a dropless token exchange whose received rows follow the routing).
    /// [`Executor::for_rank`] also takes the rank's step-level gradient collectives,
    /// FSDP's included (the rank then keeps only its shard of the covered weights, their
    /// gradients and moments between steps; `executor/fsdp.rs`). Here each weight
    /// starts from its own name's stream at the rank graph's shape; [`Executor::for_rank`]
    /// starts a rank's parts of split weights as their parts of the unsharded weights.
    ///
    /// # Errors
    /// As [`Executor::new`].
    pub fn with_collectives(
        graph: &Graph,
        device: D,
        options: ExecOptions,
        groups: Vec<(String, Box<dyn Collective<D>>)>,
    ) -> Result<Executor<D>, ExecError> {
        Self::build(graph, device, options, groups, &BTreeMap::new())
    }

    /// [`Executor::with_collectives`], the weights of `splits` initialised as this
    /// rank's part of the unsharded weight (see [`weight_origin`]).
    pub(super) fn build(
        graph: &Graph,
        device: D,
        options: ExecOptions,
        groups: Vec<(String, Box<dyn Collective<D>>)>,
        splits: &BTreeMap<String, WeightSplit>,
    ) -> Result<Executor<D>, ExecError> {
        validate(graph)?;
        let plan = backward_plan(graph)?;
        let sched = schedule(graph, &plan, options.recompute);
        let g = graph.clone();
        let nt = g.tensors.len();
        let mut vals: Vec<Option<D::Buffer>> = (0..nt).map(|_| None).collect();
        let mut grads: Vec<Option<D::Buffer>> = (0..nt).map(|_| None).collect();
        let mut moments: Vec<Option<(D::Buffer, D::Buffer)>> = (0..nt).map(|_| None).collect();
        for (id, t) in g.tensors.iter().enumerate() {
            if !t.kind.is_param() {
                continue;
            }
            let n = t.numel() as usize;
            let mut host = vec![0f32; n];
            let mut stream = SplitMix(options.seed ^ name_hash(&t.name));
            match (init_kind(&g, id), splits.get(&t.name)) {
                (v, Some(split)) if v.is_nan() => {
                    let start = weight_origin(&t.name, &t.shape, split, &groups)?;
                    stream.normals_block(&mut host, &split.full, &start, &t.shape, options.init_std);
                }
                (v, None) if v.is_nan() => stream.normals(&mut host, options.init_std),
                (v, _) => host.fill(v),
            }
            let mut buf = device.alloc(elem_of(t.dtype), n)?;
            device.write_f32(&mut buf, &host)?;
            vals[id] = Some(buf);
            if plan.needs_grad[id] {
                grads[id] = Some(device.alloc(Elem::F32, n)?);
                let (mut m, mut v) = (device.alloc(Elem::F32, n)?, device.alloc(Elem::F32, n)?);
                device.zero(&mut m)?;
                device.zero(&mut v)?;
                moments[id] = Some((m, v));
            }
        }
        let int_bounds = int_bounds_of(&g);
        let nops = g.ops.len();
        let mut one = device.alloc(Elem::F32, 1)?;
        device.write_f32(&mut one, &[1.0])?;
        let adam_scalars = device.alloc(Elem::F32, runner_kernels::cpu::adamw::Scalars::WORDS)?;
        let native_fp8 = options.native_fp8.unwrap_or_else(|| device.native_fp8());
        let mut reads_aux = vec![false; nops];
        for s in &plan.steps {
            reads_aux[s.op] = true;
        }
        let ex = Executor {
            reads_aux,
            plan,
            sched,
            device,
            options,
            vals,
            grads,
            moments,
            momentum: (0..nt).map(|_| None).collect(),
            optimizer: muon::Optimizer::AdamW,
            muon: Vec::new(),
            muon_split: Vec::new(),
            muon_owner: Vec::new(),
            fsdp_muon_owner: Vec::new(),
            splits: splits.clone(),
            aux: (0..nops).map(|_| Vec::new()).collect(),
            plans: Plans::new(),
            grad_written: vec![false; nt],
            carry: vec![false; nt],
            forward_done: false,
            backward_done: false,
            adam_step: 0,
            loss: f32::NAN,
            profile: StepProfile {
                forward_op_s: vec![0.0; nops],
                backward_op_s: vec![0.0; nops],
                recompute_op_s: vec![0.0; nops],
                optimizer_tensor_s: vec![0.0; nt],
                ..StepProfile::default()
            },
            int_bounds,
            collectives: groups.into_iter().collect(),
            comm: comm::CommState::default(),
            buckets: overlap::Buckets::default(),
            pending: Pending::default(),
            ep: ep::EpState::default(),
            pending_partials: HashMap::new(),
            fsdp: fsdp::FsdpState::default(),
            quant: quant::QuantState::new(native_fp8, &g),
            cast: None,
            quant_stats: Vec::new(),
            one,
            adam_scalars,
            capturing: false,
            mid_step: false,
            in_flight: 1,
            chunks: 1,
            recorded: graph::GraphState::Cold,
            graph: g,
        };
        ex.check_expert_tensor_parallel()?;
        Ok(ex)
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    pub fn plan(&self) -> &BackwardPlan {
        &self.plan
    }
    /// The recompute schedule the passes follow.
    pub fn recompute_schedule(&self) -> &RecomputeSchedule {
        &self.sched
    }
    pub fn device(&self) -> &D {
        &self.device
    }
    /// Turn per-op timing on or off.
    pub fn set_profile(&mut self, on: bool) {
        self.options.profile = on;
    }
    /// Whether per-op timing is on ([`Executor::set_profile`], [`ExecOptions::profile`]).
    pub fn profiling(&self) -> bool {
        self.options.profile
    }
    /// Timings of the last forward, backward and optimizer step.
    pub fn profile(&self) -> &StepProfile {
        &self.profile
    }
    /// AdamW steps taken.
    pub fn steps_taken(&self) -> u32 {
        self.adam_step
    }

    fn id(&self, name: &str) -> Result<TensorId, ExecError> {
        self.graph
            .tensor_id(name)
            .ok_or_else(|| ExecError::Input(format!("the graph has no tensor '{name}'")))
    }

    /// Current values of weight `name`.
    ///
    /// On an FSDP rank a sharded weight is whole only while a pass has it gathered;
    /// otherwise this refuses it: [`Executor::gather_weights`] (a collective call) returns
    /// whole weights, [`Executor::weight_shard`] this rank's piece.
    ///
    /// # Errors
    /// Unknown name, a tensor that is not a weight, or a sharded weight not gathered now.
    pub fn weight(&self, name: &str) -> Result<Vec<f32>, ExecError> {
        let id = self.id(name)?;
        match (&self.vals[id], self.graph.tensors[id].kind) {
            (Some(b), k) if k.is_param() => self.device.read_f32(b),
            (None, k) if k.is_param() && self.fsdp_covers(id) => Err(self.sharded_error(
                id,
                "value",
                "Executor::gather_weights returns it whole, weight_shard this rank's piece",
            )),
            _ => Err(ExecError::Input(format!("'{name}' is not a weight"))),
        }
    }

    /// Activation `name` as it is stored now, if it is still live (after a forward, the
    /// tensors the backward needs are).
    ///
    /// # Errors
    /// Unknown name, not an activation, or no longer live.
    pub fn activation(&self, name: &str) -> Result<Vec<f32>, ExecError> {
        let id = self.id(name)?;
        match (&self.vals[id], self.graph.tensors[id].kind) {
            (Some(b), TensorKind::Activation) => self.device.read_f32(b),
            (None, TensorKind::Activation) => {
                Err(ExecError::State(format!("'{name}' is not live now")))
            }
            _ => Err(ExecError::Input(format!("'{name}' is not an activation"))),
        }
    }

    /// Overwrite weight `name` with its whole value (on an FSDP rank, a sharded weight
    /// keeps this rank's piece of `data`: every rank of the group passes the same data).
    ///
    /// # Errors
    /// Unknown name, not a weight, or the wrong length.
    pub fn set_weight(&mut self, name: &str, data: &[f32]) -> Result<(), ExecError> {
        let id = self.id(name)?;
        if !self.graph.tensors[id].kind.is_param() {
            return Err(ExecError::Input(format!("'{name}' is not a weight")));
        }
        if self.fsdp_covers(id) {
            return self.fsdp_set_weight(id, data);
        }
        let buf = self.vals[id]
            .as_mut()
            .ok_or_else(|| ExecError::State(format!("weight '{name}' has no buffer")))?;
        if buf.len() != data.len() {
            return Err(ExecError::Input(format!(
                "'{name}' holds {} elements, got {}",
                buf.len(),
                data.len()
            )));
        }
        self.device.write_f32(buf, data)
    }

    /// Gradient of weight `name` from the last backward (`None` if it has none).
    ///
    /// On an FSDP rank a sharded weight's whole gradient exists from the backward (this
    /// rank's, unreduced) until [`Executor::reduce_gradients`] reduce-scatters it; after
    /// that this refuses it: [`Executor::gather_grads`] (a collective call) returns the
    /// reduced gradients whole, [`Executor::grad_shard`] this rank's piece.
    ///
    /// # Errors
    /// Unknown name, or a sharded weight's gradient after the reduction.
    pub fn grad(&self, name: &str) -> Result<Option<Vec<f32>>, ExecError> {
        let id = self.id(name)?;
        if self.fsdp_covers(id) && self.comm.reduced && self.plan.needs_grad[id] {
            return Err(self.sharded_error(
                id,
                "reduced gradient",
                "Executor::gather_grads returns it whole, grad_shard this rank's piece",
            ));
        }
        if !self.grad_written[id] {
            return Ok(None);
        }
        self.grads[id]
            .as_ref()
            .map(|b| self.device.read_f32(b))
            .transpose()
    }

    /// Names of the weights that receive a gradient.
    pub fn trainable(&self) -> Vec<String> {
        self.graph
            .tensors
            .iter()
            .enumerate()
            .filter(|(id, t)| t.kind == TensorKind::Weight && self.plan.needs_grad[*id])
            .map(|(_, t)| t.name.clone())
            .collect()
    }

    /// Drop every activation, saved statistic, plan and activation gradient.
    fn release_activations(&mut self) {
        for (id, t) in self.graph.tensors.iter().enumerate() {
            if t.kind == TensorKind::Activation {
                self.vals[id] = None;
                self.grads[id] = None;
            }
        }
        for a in &mut self.aux {
            a.clear();
        }
        self.cast = None;
        self.plans.clear();
        self.ep.clear();
        self.pending_partials.clear();
    }

    /// Upload inputs, checking names, lengths and id ranges before anything runs.
    fn load_inputs(&mut self, inputs: &[(&str, Input<'_>)]) -> Result<(), ExecError> {
        let mut given = HashSet::new();
        for (name, data) in inputs {
            let id = self.id(name)?;
            let t = &self.graph.tensors[id];
            if t.kind != TensorKind::Input {
                return Err(ExecError::Input(format!(
                    "'{name}' is a graph {:?}, not an input",
                    t.kind
                )));
            }
            let n = t.numel() as usize;
            let len = match data {
                Input::U32(d) => d.len(),
                Input::F32(d) => d.len(),
            };
            if len != n {
                return Err(ExecError::Input(format!(
                    "'{name}' {:?} needs {n} values, got {len}",
                    t.shape
                )));
            }
            match (data, t.dtype) {
                (Input::U32(d), DType::I32) => {
                    if let Some((bound, who)) = self.int_bounds.get(&id)
                        && let Some((pos, &v)) =
                            d.iter().enumerate().find(|&(_, &v)| u64::from(v) >= *bound)
                    {
                        return Err(ExecError::Input(format!(
                            "'{name}' holds id {v} at position {pos}, but {who} has only {bound}"
                        )));
                    }
                }
                (Input::F32(_), dt) if dt != DType::I32 => {}
                (_, dt) => {
                    return Err(ExecError::Input(format!(
                        "'{name}' has dtype {}, given the other kind of data",
                        dt.name()
                    )));
                }
            }
            if self.vals[id].is_none() {
                self.vals[id] = Some(self.device.alloc(elem_of(t.dtype), n)?);
            }
            let buf = self.vals[id]
                .as_mut()
                .ok_or_else(|| ExecError::State("input buffer".into()))?;
            match data {
                Input::U32(d) => self.device.write_u32(buf, d)?,
                Input::F32(d) => self.device.write_f32(buf, d)?,
            }
            given.insert(id);
        }
        let missing: Vec<&str> = self
            .graph
            .tensors
            .iter()
            .enumerate()
            .filter(|(id, t)| t.kind == TensorKind::Input && !given.contains(id) && self.used(*id))
            .map(|(_, t)| t.name.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(ExecError::Input(format!(
                "missing input(s): {}",
                missing.join(", ")
            )));
        }
        Ok(())
    }

    fn used(&self, id: TensorId) -> bool {
        self.graph.ops.iter().any(|op| op.inputs.contains(&id))
    }

    /// Run the forward pass and return the loss. Keeps what the backward needs.
    ///
    /// # Errors
    /// Missing, misshapen or out-of-range inputs (nothing runs then), or a kernel error.
    pub fn forward(&mut self, inputs: &[(&str, Input<'_>)]) -> Result<f32, ExecError> {
        if self.options.cuda_graph {
            return Err(graph::whole_steps_only("forward"));
        }
        // Outside a step: `memory` must not count the last step's micro-batches.
        self.fsdp_by_hand();
        self.forward_pass(Some(inputs), 0..self.graph.ops.len(), true)
    }

    /// Forward ops `ops` of a micro-batch: a new one from `inputs`, or (`None`) the one
    /// in the store, whose earlier ops ran (a later pipeline chunk, `pipeline.rs`).
    /// `read_loss`: the range ends the graph; the loss is read and returned.
    pub(super) fn forward_pass(&mut self, inputs: Option<&[(&str, Input<'_>)]>, ops: Range<usize>, read_loss: bool) -> Result<f32, ExecError> {
        match inputs {
            Some(inputs) => self.begin_step(inputs)?,
            None => self.forget_row_stats(),
        }
        let t0 = self.device.record()?;
        self.forward_ops_in(ops)?;
        let t1 = self.device.record()?;
        self.settle_quant()?;
        if read_loss {
            let loss_buf = self.vals[self.graph.loss]
                .as_ref()
                .ok_or_else(|| ExecError::State("loss not produced".into()))?;
            self.loss = self
                .device
                .read_f32(loss_buf)?
                .first()
                .copied()
                .unwrap_or(f32::NAN);
        }
        let dt = self.device.elapsed_s(&t0, &t1)?;
        if inputs.is_some() {
            self.profile.forward_s = dt;
        } else {
            self.profile.forward_s += dt;
        }
        for (oi, s, e) in std::mem::take(&mut self.pending.forward) {
            self.profile.forward_op_s[oi] = self.device.elapsed_s(&s, &e)?;
        }
        self.note_comm()?;
        self.forward_done = true;
        Ok(self.loss)
    }

    /// What a step does before its first kernel: drop the last step's activations,
    /// start the peak and communication counts, upload the inputs.
    fn begin_step(&mut self, inputs: &[(&str, Input<'_>)]) -> Result<(), ExecError> {
        self.release_activations();
        self.forward_done = false;
        self.backward_done = false;
        if !self.mid_step {
            self.device.reset_peak();
            (self.in_flight, self.chunks) = (1, 1);
        }
        self.begin_comm_step(!self.mid_step);
        self.load_inputs(inputs)
    }

    /// The forward's device work, op by op (no host transfer: a recorded step runs it).
    fn forward_ops(&mut self) -> Result<(), ExecError> {
        self.forward_ops_in(0..self.graph.ops.len())
    }

    fn forward_ops_in(&mut self, ops: Range<usize>) -> Result<(), ExecError> {
        let end = ops.end;
        for oi in ops {
            self.fsdp_gather_before(fsdp::Pass::Forward, oi, end)?;
            let start = self.mark()?;
            self.forward_op(oi)?;
            self.fsdp_release(fsdp::Pass::Forward, Some(oi));
            if let Some(s) = start {
                self.pending.forward.push((oi, s, self.device.record()?));
            }
        }
        self.fsdp_release(fsdp::Pass::Forward, None);
        Ok(())
    }

    /// A start event for an op's timing when profiling.
    fn mark(&self) -> Result<Option<D::Event>, ExecError> {
        if self.options.profile {
            self.device.record().map(Some)
        } else {
            Ok(None)
        }
    }

    fn forward_op(&mut self, oi: usize) -> Result<(), ExecError> {
        let (outs, aux) = self.compute_op(oi)?;
        let op = &self.graph.ops[oi];
        for (&o, b) in op.outputs.iter().zip(outs) {
            self.vals[o] = Some(b);
        }
        if self.sched.keep_aux[oi] && self.reads_aux[oi] {
            self.aux[oi] = aux;
        }
        for &t in &self.sched.free_after_forward[oi] {
            self.vals[t] = None;
        }
        Ok(())
    }

    /// Re-run forward segment `s` of the recompute schedule: regenerate the activations
    /// and statistics the coming backward steps read. Outputs still live from the
    /// forward are left as they are (the re-run computes the same values).
    fn rerun(&mut self, s: usize) -> Result<(), ExecError> {
        self.quant.quiet = true;
        let r = self.rerun_segment(s);
        self.quant.quiet = false;
        r
    }

    fn rerun_segment(&mut self, s: usize) -> Result<(), ExecError> {
        // No events while a step is recorded: a recording has no clock.
        let t0 = if self.capturing { None } else { Some(self.device.record()?) };
        for pos in 0..self.sched.segments[s].len() {
            let oi = self.sched.segments[s][pos];
            let start = self.mark()?;
            let (outs, aux) = self.compute_op(oi)?;
            for (&o, b) in self.graph.ops[oi].outputs.iter().zip(outs) {
                if self.vals[o].is_none() {
                    self.vals[o] = Some(b);
                }
            }
            if self.sched.rerun_keeps_aux[oi] && self.reads_aux[oi] {
                self.aux[oi] = aux;
            }
            for &t in &self.sched.free_after_rerun[s][pos] {
                self.vals[t] = None;
            }
            if let Some(st) = start {
                self.pending.recompute.push((oi, st, self.device.record()?));
            }
            self.profile.recomputed_ops.push(oi);
        }
        if let Some(t0) = t0 {
            let t1 = self.device.record()?;
            self.pending.segments.push((t0, t1));
        }
        Ok(())
    }

    /// Run forward op `oi` on the live inputs; its outputs (stored in their declared
    /// format when emulating storage) and statistics.
    fn compute_op(&mut self, oi: usize) -> Result<Produced<D::Buffer>, ExecError> {
        let op = &self.graph.ops[oi];
        // Between an expert-parallel layer's all-to-alls, rows follow the routing.
        let rows = self.ep.propagated_rows(&self.graph, op)?;
        let mut outs = Vec::with_capacity(op.outputs.len());
        for &o in &op.outputs {
            let t = &self.graph.tensors[o];
            if let Some(r) = rows {
                self.ep.rows.insert(o, r);
            }
            outs.push(self.device.alloc(elem_of(t.dtype), self.numel_of(o))?);
        }
        let mut aux = Vec::new();
        if !self.comm_forward(oi, &mut outs, &mut aux)? {
            // A linear or grouped linear with a precision plan reads quantised copies of X and W.
            let gemm = matches!(self.graph.ops[oi].kind, OpKind::Linear | OpKind::GroupedLinear);
            let quantised = if gemm { self.forward_operands(oi)? } else { None };
            // An RMSNorm or MLP activation read only by a native-route FP8 GEMM casts as it runs.
            let fused = if gemm { None } else { self.fused_cast(oi) };
            let op = &self.graph.ops[oi];
            let zero_bias = match self.bias_added_elsewhere(op) {
                Some(n) => {
                    let mut z = self.device.alloc(Elem::F32, n)?;
                    self.device.zero(&mut z)?;
                    Some(z)
                }
                None => None,
            };
            let mut ins: Vec<&D::Buffer> = op
                .inputs
                .iter()
                .map(|&i| {
                    self.vals[i].as_ref().ok_or_else(|| {
                        ExecError::State(format!(
                            "operation '{}' reads '{}', which is not live",
                            op.name, self.graph.tensors[i].name
                        ))
                    })
                })
                .collect::<Result<_, _>>()?;
            if let Some(z) = &zero_bias {
                ins[2] = z;
            }
            let mut experts = None;
            if let Some((qx, qw, _)) = &quantised {
                ins[0] = qx;
                match qw {
                    quant::Quantised::One(w) => ins[1] = w,
                    quant::Quantised::PerExpert(ws) => experts = Some(ws.as_slice()),
                }
            }
            match fused {
                Some((key, spec, elem)) => {
                    let tensor = op.outputs[0];
                    let mut codes = self.device.alloc(elem, outs[0].len())?;
                    let stats = ops::forward_with_cast(&self.device, &self.graph, oi, &ins, &mut outs, &mut aux, &mut codes, &spec)?;
                    self.cast = Some(quant::Cast { tensor, key, codes, stats });
                }
                None => ops::forward(&self.device, &self.graph, oi, &ins, experts, &mut outs, &mut aux, &mut self.plans)?,
            }
            if let Some((_, _, output)) = quantised {
                let row = self.graph.tensors[op.outputs[0]].shape.last().copied().unwrap_or(1) as usize;
                self.device.round_to_storage(&mut outs[0], output, row)?;
            }
        }
        if self.options.emulate_storage {
            let op = &self.graph.ops[oi];
            for (&o, b) in op.outputs.iter().zip(outs.iter_mut()) {
                let t = &self.graph.tensors[o];
                if t.kind == TensorKind::Activation {
                    let row = t.shape.last().copied().unwrap_or(1) as usize;
                    self.device.round_to_storage(b, t.dtype, row)?;
                }
            }
        }
        Ok((outs, aux))
    }

    /// Run the backward pass of the last forward, leaving weight gradients.
    ///
    /// # Errors
    /// No forward before it, or a kernel error.
    pub fn backward(&mut self) -> Result<(), ExecError> {
        self.backward_pass(false)
    }

    /// As [`Executor::backward`], adding the weight gradients to those the backward
    /// passes since the last optimizer step left (gradient accumulation over the
    /// micro-batches of one step).
    ///
    /// # Errors
    /// As [`Executor::backward`].
    pub fn backward_accumulate(&mut self) -> Result<(), ExecError> {
        self.backward_pass(true)
    }

    fn backward_pass(&mut self, accumulate: bool) -> Result<(), ExecError> {
        if self.options.cuda_graph {
            return Err(graph::whole_steps_only("backward"));
        }
        self.backward_steps(accumulate, self.whole_backward())
    }

    /// Every backward step, beginning and ending the micro-batch's backward.
    fn whole_backward(&self) -> BackwardSpan {
        BackwardSpan { steps: 0..self.plan.steps.len(), begins: true, ends: true }
    }

    /// The backward steps `span` names of the micro-batch in the store.
    pub(super) fn backward_steps(&mut self, accumulate: bool, span: BackwardSpan) -> Result<(), ExecError> {
        let first = span.begins;
        let t0 = self.device.record()?;
        self.backward_ops_in(accumulate, span)?;
        let t1 = self.device.record()?;
        self.settle_quant()?;
        let dt = self.device.elapsed_s(&t0, &t1)?;
        if first {
            self.profile.backward_s = dt;
        } else {
            self.profile.backward_s += dt;
        }
        for (op, s, e) in std::mem::take(&mut self.pending.backward) {
            self.profile.backward_op_s[op] = self.device.elapsed_s(&s, &e)?;
        }
        for (op, s, e) in std::mem::take(&mut self.pending.recompute) {
            self.profile.recompute_op_s[op] = self.device.elapsed_s(&s, &e)?;
        }
        for (s, e) in std::mem::take(&mut self.pending.segments) {
            self.profile.recompute_s += self.device.elapsed_s(&s, &e)?;
        }
        self.note_comm()?;
        Ok(())
    }

    /// The backward's device work (no host transfer: a recorded step runs it).
    fn backward_ops(&mut self, accumulate: bool) -> Result<(), ExecError> {
        self.backward_ops_in(accumulate, self.whole_backward())
    }

    fn backward_ops_in(&mut self, accumulate: bool, span: BackwardSpan) -> Result<(), ExecError> {
        let BackwardSpan { steps, begins: first, ends: last } = span;
        if !self.forward_done || self.backward_done {
            return Err(ExecError::State(
                "backward needs a forward first (once per forward)".into(),
            ));
        }
        for (id, c) in self.carry.iter_mut().enumerate() {
            *c = accumulate
                && self.graph.tensors[id].kind == TensorKind::Weight
                && (*c || self.grad_written[id]);
        }
        self.grad_written.iter_mut().for_each(|w| *w = false);
        let loss = self.graph.loss;
        if first {
            // d loss / d loss = 1, copied on the device from the constant kept for it.
            let mut seed = self.device.alloc(Elem::F32, 1)?;
            self.device.copy(&mut seed, 0, &self.one, 0, 1)?;
            self.grads[loss] = Some(seed);
            self.profile.recompute_s = 0.0;
            self.profile.recomputed_ops.clear();
            self.profile
                .recompute_op_s
                .iter_mut()
                .for_each(|s| *s = 0.0);
        }
        let end = steps.end;
        for si in steps {
            self.fsdp_gather_before(fsdp::Pass::Backward, si, end)?;
            if let Some(s) = self.sched.rerun_before_step[si] {
                self.rerun(s)?;
            }
            let start = self.mark()?;
            self.backward_step(si)?;
            self.bucket_step_done(si)?;
            self.fsdp_release(fsdp::Pass::Backward, Some(si));
            if let Some(s) = start {
                let op = self.plan.steps[si].op;
                self.pending.backward.push((op, s, self.device.record()?));
            }
        }
        let left: Vec<TensorId> = self.pending_partials.keys().copied().collect();
        for t in left {
            self.flush_partial(t)?;
        }
        self.grads[loss] = None;
        self.fsdp_release(fsdp::Pass::Backward, None);
        // A weight an earlier pass reached keeps its gradient in the step.
        for (w, c) in self.grad_written.iter_mut().zip(&self.carry) {
            *w |= *c;
        }
        if last {
            self.plans.clear();
            self.backward_done = true;
            self.forward_done = false;
        }
        Ok(())
    }

    /// All-reduce the pending partial gradient of `t` (if any) and add it in: every
    /// column-parallel reader has contributed, and a step is about to consume it.
    fn flush_partial(&mut self, t: TensorId) -> Result<(), ExecError> {
        let Some((mut p, group)) = self.pending_partials.remove(&t) else {
            return Ok(());
        };
        self.all_reduce_over(group, &mut p)?;
        let dst = self.grads[t].as_mut().ok_or_else(|| {
            ExecError::State(format!(
                "gradient of '{}' for its partial sum is missing",
                self.graph.tensors[t].name
            ))
        })?;
        self.device.add_assign(dst, &p)
    }

    fn backward_step(&mut self, si: usize) -> Result<(), ExecError> {
        if !self.pending_partials.is_empty() {
            for k in 0..self.plan.steps[si].grads_in.len() {
                if let Some(t) = self.plan.steps[si].grads_in[k] {
                    self.flush_partial(t)?;
                }
            }
        }
        let contrib = match self.comm_backward(si)? {
            comm::CommBackward::NotMine => None,
            comm::CommBackward::Done => return self.after_step(si),
            comm::CommBackward::Grad(d) => Some(d),
        };
        if let Some(d) = contrib {
            let step = &self.plan.steps[si];
            for go in &step.grads_out {
                let accumulate = go.accumulate || self.carry[go.tensor];
                let buf = match self.grads[go.tensor].take() {
                    Some(mut b) if accumulate => {
                        self.device.add_assign(&mut b, &d)?;
                        b
                    }
                    None if accumulate => {
                        return Err(ExecError::State(format!(
                            "gradient of '{}' to accumulate into is missing",
                            self.graph.tensors[go.tensor].name
                        )));
                    }
                    other => {
                        let mut b = match other {
                            Some(b) => b,
                            None => self.device.alloc(Elem::F32, d.len())?,
                        };
                        self.device.copy(&mut b, 0, &d, 0, d.len())?;
                        b
                    }
                };
                self.grads[go.tensor] = Some(buf);
                self.grad_written[go.tensor] = true;
            }
            return self.after_step(si);
        }
        let linear = match (self.graph.ops[self.plan.steps[si].op].kind, self.plan.steps[si].grads_in.first()) {
            (OpKind::Linear | OpKind::GroupedLinear, Some(Some(dy))) => self.backward_operands(self.plan.steps[si].op, *dy)?,
            _ => None,
        };
        let step = &self.plan.steps[si];
        let op = &self.graph.ops[step.op];
        // Take the gradient buffers this step writes out of the store. A tensor in two
        // input slots (x + x) gets scratch for its second slot, added afterwards.
        let mut taken: Vec<(usize, TensorId, D::Buffer, bool)> = Vec::new();
        let mut dups: Vec<(usize, TensorId, D::Buffer)> = Vec::new();
        for go in &step.grads_out {
            let t = &self.graph.tensors[go.tensor];
            let n = self.numel_of(go.tensor);
            if taken.iter().any(|(_, id, _, _)| *id == go.tensor) {
                dups.push((go.slot, go.tensor, self.device.alloc(Elem::F32, n)?));
                continue;
            }
            let accumulate = go.accumulate || self.carry[go.tensor];
            let buf = match (accumulate, self.grads[go.tensor].take()) {
                (_, Some(b)) => b,
                (false, None) => self.device.alloc(Elem::F32, n)?,
                (true, None) => {
                    return Err(ExecError::State(format!(
                        "gradient of '{}' to accumulate into is missing",
                        t.name
                    )));
                }
            };
            taken.push((go.slot, go.tensor, buf, accumulate));
        }
        // A column-parallel input gradient is a per-rank partial: compute it alone and
        // add it to the input's pending partial sum, all-reduced over tp (over etp for an
        // expert linear split in width) once, when the gradient is consumed (Megatron's
        // `f` conjugate; its fused qkv and fc1 linears all-reduce once per input too).
        let mut partial: Option<(usize, D::Buffer, bool, bool)> = None;
        let etp = self.expert_input_partial(op);
        if (etp || self.column_input_partial(op))
            && let Some(i) = taken.iter().position(|(slot, ..)| *slot == 0)
        {
            let n = self.numel_of(taken[i].1);
            let fresh = self.device.alloc(Elem::F32, n)?;
            let orig = std::mem::replace(&mut taken[i].2, fresh);
            partial = Some((i, orig, taken[i].3, etp));
            taken[i].3 = false;
        }
        {
            let mut grads_out: Vec<Option<GradTarget<'_, D::Buffer>>> =
                (0..op.inputs.len()).map(|_| None).collect();
            for (slot, _, buf, acc) in taken.iter_mut() {
                grads_out[*slot] = Some(GradTarget {
                    buf,
                    accumulate: *acc,
                });
            }
            for (slot, _, buf) in dups.iter_mut() {
                grads_out[*slot] = Some(GradTarget {
                    buf,
                    accumulate: false,
                });
            }
            let io = BackwardIo {
                inputs: op.inputs.iter().map(|&i| self.vals[i].as_ref()).collect(),
                outputs: op.outputs.iter().map(|&o| self.vals[o].as_ref()).collect(),
                aux: &self.aux[step.op],
                grads_in: step
                    .grads_in
                    .iter()
                    .map(|g| g.and_then(|t| self.grads[t].as_ref()))
                    .collect(),
                grads_out,
                plans: &self.plans,
                linear: linear.as_ref(),
            };
            ops::backward(&self.device, &self.graph, step, io)?;
        }
        if let Some((i, mut orig, acc, etp)) = partial {
            let group = if etp { "etp" } else { "tp" };
            let x = taken[i].1;
            if self.pending_partials.get(&x).is_some_and(|(_, g)| *g != group) {
                self.flush_partial(x)?;
            }
            if !acc {
                // The gradient proper starts at zero; the partial sum joins it later.
                self.device.zero(&mut orig)?;
            }
            let part = std::mem::replace(&mut taken[i].2, orig);
            taken[i].3 = acc;
            match self.pending_partials.get_mut(&x) {
                Some((sum, _)) => self.device.add_assign(sum, &part)?,
                None => {
                    self.pending_partials.insert(x, (part, group));
                }
            }
        }
        for (_, id, buf, _) in taken {
            self.grads[id] = Some(buf);
            self.grad_written[id] = true;
        }
        for (_, id, buf) in dups {
            let dst = self.grads[id]
                .as_mut()
                .ok_or_else(|| ExecError::State("duplicate gradient target".into()))?;
            self.device.add_assign(dst, &buf)?;
        }
        self.after_step(si)
    }

    /// Free what backward step `si` was the last to need.
    fn after_step(&mut self, si: usize) -> Result<(), ExecError> {
        let step = &self.plan.steps[si];
        for &t in &self.plan.free_grads_after_step[si] {
            self.grads[t] = None;
        }
        for &t in &self.sched.free_saved_after_step[si] {
            self.vals[t] = None;
        }
        self.aux[step.op].clear();
        Ok(())
    }

    /// One AdamW step on every weight that has a gradient from the last backward.
    ///
    /// # Errors
    /// No backward before it, step-level collectives not yet run
    /// ([`Executor::reduce_gradients`]: the ranks would drift apart), or a kernel error.
    pub fn optimizer_step(&mut self, h: &AdamW) -> Result<(), ExecError> {
        if self.options.cuda_graph {
            return Err(graph::whole_steps_only("optimizer_step"));
        }
        write_adamw_scalars(&self.device, &mut self.adam_scalars, h, self.adam_step.saturating_add(1))?;
        let t0 = self.device.record()?;
        self.optimizer_ops()?;
        let t1 = self.device.record()?;
        self.device.synchronize()?;
        self.profile.optimizer_s = self.device.elapsed_s(&t0, &t1)?;
        // Muon's gathers and broadcasts.
        self.note_comm()?;
        for (id, s, e) in std::mem::take(&mut self.pending.optimizer) {
            self.profile.optimizer_tensor_s[id] = self.device.elapsed_s(&s, &e)?;
        }
        Ok(())
    }

    /// The optimizer on every weight with a gradient, Muon's and AdamW's scalars read
    /// from `adam_scalars` (written for this step beforehand); the device work of
    /// [`Executor::optimizer_step`].
    fn optimizer_ops(&mut self) -> Result<(), ExecError> {
        if !self.backward_done {
            return Err(ExecError::State(
                "optimizer_step needs a backward first".into(),
            ));
        }
        if !self.comm.step.is_empty() && !self.comm.reduced {
            return Err(ExecError::State(
                "optimizer_step on a sharded rank needs reduce_gradients first".into(),
            ));
        }
        self.adam_step += 1;
        for id in 0..self.graph.tensors.len() {
            if !self.grad_written[id] {
                continue;
            }
            let start = self.mark()?;
            if self.muon_shared_step(id)? {
                if let Some(s) = start {
                    self.pending.optimizer.push((id, s, self.device.record()?));
                }
                continue;
            }
            let (Some(p), Some(gr), Some((m, v))) = (
                self.vals[id].as_mut(),
                self.grads[id].as_ref(),
                self.moments[id].as_mut(),
            ) else {
                continue;
            };
            self.device.adamw(p, gr, m, v, &self.adam_scalars)?;
            if let Some(s) = start {
                self.pending.optimizer.push((id, s, self.device.record()?));
            }
        }
        self.fsdp_optimizer_step()?;
        self.backward_done = false;
        self.carry.iter_mut().for_each(|c| *c = false);
        Ok(())
    }

    /// forward + backward + the step's gradient reduction (sharded ranks,
    /// [`Executor::reduce_gradients`]) + AdamW; returns the loss before the update.
    ///
    /// # Errors
    /// As [`Executor::forward`], [`Executor::backward`], [`Executor::reduce_gradients`],
    /// [`Executor::optimizer_step`].
    pub fn step(&mut self, inputs: &[(&str, Input<'_>)], h: &AdamW) -> Result<f32, ExecError> {
        if self.options.cuda_graph {
            return self.graph_step(inputs, h);
        }
        self.arm_buckets(1);
        let loss = self.forward_pass(Some(inputs), 0..self.graph.ops.len(), true)?;
        self.backward()?;
        self.reduce_gradients()?;
        self.optimizer_step(h)?;
        Ok(loss)
    }

    /// One optimizer step over several micro-batches (gradient accumulation, as a
    /// global batch of micro-batch × `batches.len()` × dp runs): forward and backward of
    /// each, weight gradients summed, then divided by the micro-batch count (each loss is
    /// a mean over its micro-batch, so the result is the mean over all of them, as
    /// Megatron scales the loss by 1/num_microbatches), the step's gradient reduction and
    /// AdamW. Returns the mean loss. A pipeline stage runs its passes in 1F1B order
    /// ([`ExecOptions::pipeline_schedule`], `executor/pipeline.rs`); any other rank runs
    /// each micro-batch's forward and backward before the next. The backwards run in
    /// micro-batch order either way, so the gradients are the same bits.
    ///
    /// # Errors
    /// No micro-batch, or as [`Executor::step`].
    pub fn step_micro_batches(
        &mut self,
        batches: &[Vec<(&str, Input<'_>)>],
        h: &AdamW,
    ) -> Result<f32, ExecError> {
        if batches.is_empty() {
            return Err(ExecError::Input("a step needs at least one micro-batch".into()));
        }
        let plan = self.pass_plan(batches.len());
        self.arm_buckets(batches.len());
        let total = self.run_passes(&plan, batches)?;
        let m = batches.len();
        if m > 1 {
            let inv = 1.0 / m as f32;
            for id in 0..self.graph.tensors.len() {
                if let (true, Some(b)) = (self.grad_written[id], self.grads[id].as_mut()) {
                    self.device.scale(b, inv)?;
                }
            }
        }
        self.reduce_gradients()?;
        self.optimizer_step(h)?;
        Ok((total / m as f64) as f32)
    }

    /// Measured peak of the last step against what the graph needs live (on an FSDP
    /// rank: the shards at rest, the gathered parameters and the whole gradients while
    /// the passes hold them).
    pub fn memory(&self) -> MemoryReport {
        let walk = |around: Around<'_>| walk_live(&self.graph, &self.plan, &self.sched, self.fsdp.resting.as_ref(), &self.fsdp.passes, around);
        let by_chunk = self.fsdp_carried_by_chunk();
        // The whole gradients carried of the chunks `mask` names.
        let carried = |mask: &[bool]| {
            let mut ids: Vec<TensorId> = by_chunk.iter().zip(mask).filter(|(_, c)| **c).flat_map(|(ids, _)| ids.iter().copied()).collect();
            ids.sort_unstable();
            ids.dedup();
            ids
        };
        let every = vec![true; by_chunk.len()];
        // The data-parallel reduction's flat buffers: the overlapped buckets the last
        // micro-batch's backward starts, and what the reduction holds at its most.
        let (started, reduction) = self.bucket_flats();
        let lent = self.muon_lent();
        let l = walk(Around { carried: &carried(&every), scatters: &vec![self.fsdp_in_a_step(); every.len()], left: None, buckets: &started, muon: &self.muon, lent: &lent });
        // A step's passes in the order they ran: each peaks with what it finds around
        // it, besides what each other micro-batch parked holds after its last pass
        // (`pipeline.rs`) and the pipeline's mailbox keeps for the other passes of its
        // iteration.
        // A pass's walk by what it finds around it and the buckets it starts.
        type Key = (fsdp::AroundKey, Vec<(usize, u64)>);
        let mut walked: Vec<(Key, Live)> = Vec::new();
        let mut by_pass = 0;
        let last = self.fsdp.passes.order.iter().map(|&(pipeline::Pass::Forward(i, _) | pipeline::Pass::Backward(i, _))| i).max().unwrap_or(0);
        // The buckets earlier passes started (in flight through the later ones).
        let mut flying = 0;
        for (p, run) in self.fsdp_pass_walks().into_iter().zip(&self.fsdp.passes.order) {
            // The last micro-batch's backward of a chunk starts the buckets its steps
            // finish.
            let steps = self.fsdp.passes.chunks[1].get(p.chunk).cloned().unwrap_or(0..self.plan.steps.len());
            let starts: Vec<(usize, u64)> = match *run {
                pipeline::Pass::Backward(i, _) if i == last => started.iter().copied().filter(|b| steps.contains(&b.0)).collect(),
                _ => Vec::new(),
            };
            let key = (p.around, starts);
            let w = match walked.iter().position(|(k, _)| *k == key) {
                Some(w) => w,
                None => {
                    let l = walk(Around { carried: &carried(&key.0.carried), scatters: &key.0.scatters, left: key.0.left, buckets: &key.1, muon: &self.muon, lent: &lent });
                    walked.push((key.clone(), l));
                    walked.len() - 1
                }
            };
            let l = &walked[w].1;
            let parked: u64 = p.others.iter().map(|&(backward, c)| l.held[usize::from(backward)].get(c).copied().unwrap_or(0)).sum();
            let own = if p.backward { &l.backward } else { &l.forward };
            by_pass = by_pass.max(flying + parked + p.mailbox + own.get(p.chunk).copied().unwrap_or(l.peak));
            flying += key.1.iter().map(|b| b.1).sum::<u64>();
        }
        // The reduction after the passes (not walked on an FSDP rank: its whole
        // gradients' reduce-scatters are `fsdp.rs`'s): the state at rest, one
        // micro-batch's inputs and row statistics, the loss, and the reduction's flat
        // buffers.
        let reduced = if self.fsdp.resting.is_none() && reduction > 0 { l.state + l.inputs + l.row_stats + 4 + reduction } else { 0 };
        // Muon's update holds its scratch (one matrix's at a time) beside the state.
        let muon = match self.muon_scratch_elems() {
            0 => 0,
            s => l.state + l.inputs + l.row_stats + 4 + 4 * s as u64,
        };
        MemoryReport {
            peak_bytes: self.device.memory().peak_bytes,
            // A whole-graph step runs one micro-batch's passes.
            required_bytes: if walked.is_empty() { l.peak } else { by_pass }.max(reduced).max(muon),
            micro_batches_in_flight: self.in_flight.div_ceil(self.chunks.max(1)),
            param_bytes: l.params,
            keep_everything_bytes: l.all,
            state_bytes: l.state,
        }
    }
}

/// For each int32 input read by an embedding or as cross-entropy targets: the bound its
/// values must stay under, and the tensor that sets it.
pub fn int_bounds_of(g: &Graph) -> HashMap<TensorId, (u64, String)> {
    let mut b: HashMap<TensorId, (u64, String)> = HashMap::new();
    let mut tighten = |id: TensorId, bound: u64, who: String| {
        if g.tensors[id].kind != TensorKind::Input {
            return;
        }
        let e = b.entry(id).or_insert((bound, who.clone()));
        if bound < e.0 {
            *e = (bound, who);
        }
    };
    for op in &g.ops {
        match op.kind {
            // A vocab-parallel shard reads ids of the whole (padded) vocabulary: its rows
            // times the ranks of the collective that sums the shards' outputs.
            OpKind::Embedding if comm::is_vocab_parallel_embedding(op) => {
                let table = &g.tensors[op.inputs[1]];
                let shards = g
                    .ops
                    .iter()
                    .find(|o| {
                        matches!(o.kind, OpKind::AllReduce | OpKind::ReduceScatter)
                            && o.inputs.first() == op.outputs.first()
                    })
                    .and_then(|o| o.int("group-size"))
                    .unwrap_or(1)
                    .max(1) as u64;
                let v = table.shape[0] * shards;
                tighten(
                    op.inputs[0],
                    v,
                    format!(
                        "vocab-parallel table '{}' ({} rows × {shards} ranks)",
                        table.name, table.shape[0]
                    ),
                );
            }
            OpKind::Embedding => {
                let table = &g.tensors[op.inputs[1]];
                tighten(
                    op.inputs[0],
                    table.shape[0],
                    format!("table '{}' ({} rows)", table.name, table.shape[0]),
                );
            }
            OpKind::CrossEntropy => {
                let logits = &g.tensors[op.inputs[0]];
                // Vocab-parallel: the logits hold one shard of the tp group's vocabulary.
                let shards = g
                    .ops
                    .iter()
                    .find(|o| {
                        o.kind == OpKind::AllReduce
                            && o.flag("row-stats") == Some(true)
                            && o.inputs.first() == op.inputs.first()
                    })
                    .and_then(|o| o.int("group-size"))
                    .unwrap_or(1)
                    .max(1) as u64;
                let v = logits.shape.last().copied().unwrap_or(0) * shards;
                tighten(
                    op.inputs[1],
                    v,
                    format!("logits '{}' ({v} classes)", logits.name),
                );
            }
            _ => {}
        }
    }
    b
}

/// (peak live bytes under the plan's liveness and the recompute schedule, bytes if
/// nothing were freed, parameter bytes). Every element counts 4 bytes, as the executors
/// store f32/u32. Walks exactly the allocations and frees [`Executor`] makes (without
/// FSDP; an FSDP rank's [`Executor::memory`] walks its shards and gathers).
pub fn live_bytes(g: &Graph, plan: &BackwardPlan, sched: &RecomputeSchedule) -> (u64, u64, u64) {
    let l = walk_live(g, plan, sched, None, &fsdp::StepPasses::default(), Around::default());
    (l.peak, l.all, l.params)
}

/// What an FSDP micro-batch's walk ([`walk_live`]) finds around its own passes.
#[derive(Clone, Copy, Default)]
struct Around<'a> {
    /// The whole gradients earlier micro-batches left (they live through this one).
    carried: &'a [TensorId],
    /// Per pipeline chunk (one: the whole graph): its backward runs the
    /// reduce-scatters (in a step).
    scatters: &'a [bool],
    /// The unit whose reduce-scatter an earlier backward left in flight into it.
    left: Option<usize>,
    /// The overlapped data-parallel buckets this micro-batch's backward starts: the
    /// backward step after which each starts, and its flat buffer's bytes (held to the
    /// reduction).
    buckets: &'a [(usize, u64)],
    /// Per tensor: Muon updates it, so it keeps one momentum, not two moments (empty:
    /// AdamW on every weight).
    muon: &'a [bool],
    /// Per tensor: a Muon matrix another data-parallel rank updates (no optimizer state
    /// here; empty: none).
    lent: &'a [bool],
}

/// What [`walk_live`] finds.
struct Live {
    peak: u64,
    /// Per pipeline chunk (one: the whole graph): the peak through its forward, and
    /// through its backward.
    forward: Vec<u64>,
    backward: Vec<u64>,
    /// What one micro-batch holds between its passes (its inputs, the activations
    /// and activation gradients still live, the statistics saved): per chunk, once
    /// its forwards ran up to that chunk's, and once its backwards ran down to it.
    held: [Vec<u64>; 2],
    all: u64,
    params: u64,
    state: u64,
    /// One micro-batch's inputs.
    inputs: u64,
    /// The vocab-parallel loss's row statistics (held to the next forward).
    row_stats: u64,
}

/// [`live_bytes`], with the FSDP shards of `fsdp` (if any): a covered weight holds its
/// pieces at rest; each pass gathers the whole weights it reads at its start and frees
/// each after its last reader; the backward writes their whole gradients, which stay
/// to the end of the pass (the reduce-scatter frees them). `passes`: where the step's
/// forward and backward passes ended, when they ran a pipeline chunk at a time (no
/// prefetch crosses a chunk's end); `around`: what earlier micro-batches left.
fn walk_live(
    g: &Graph,
    plan: &BackwardPlan,
    sched: &RecomputeSchedule,
    fsdp: Option<&fsdp::Resting>,
    passes: &fsdp::StepPasses,
    around: Around<'_>,
) -> Live {
    let Around { carried, scatters, left, buckets, muon, lent } = around;
    // The pipeline chunk of op (forward) or step (backward) `at`, and the end of its
    // range.
    let chunk_of = |pass: fsdp::Pass, at: usize| passes.chunks[pass as usize].iter().position(|r| r.contains(&at));
    let end_of = |pass: fsdp::Pass, at: usize| chunk_of(pass, at).map_or(usize::MAX, |c| passes.chunks[pass as usize][c].end);
    let n = passes.chunks[0].len().max(1);
    let bytes = |id: TensorId| g.tensors[id].numel() * 4;
    let covered = |id: TensorId| fsdp.is_some_and(|f| f.covers(id));
    let mut params = 0;
    let mut state = 0;
    let mut inputs = 0;
    for (id, t) in g.tensors.iter().enumerate() {
        match t.kind {
            TensorKind::Weight | TensorKind::Frozen => {
                params += bytes(id);
                let rest = match fsdp.and_then(|f| f.kept[id]) {
                    Some(kept) => kept * 4,
                    None => bytes(id),
                };
                // value, gradient and two AdamW moments, or Muon's one momentum (none
                // where another rank updates the matrix)
                let held = if !plan.needs_grad[id] {
                    1
                } else if lent.get(id) == Some(&true) {
                    2
                } else if muon.get(id) == Some(&true) {
                    3
                } else {
                    4
                };
                state += rest * held;
            }
            TensorKind::Input => inputs += bytes(id),
            TensorKind::Activation => {}
        }
    }
    // FSDP's whole gradients an earlier micro-batch left (they live through this one).
    let base = inputs + state + carried.iter().map(|&id| bytes(id)).sum::<u64>();
    // FSDP's gathers and reduce-scatters (`fsdp.rs` walks them), and the whole weights
    // a pass frees after op or step `at`.
    let mut in_flight = fsdp::InFlightUnits::default();
    let freed = |pass: fsdp::Pass, at: usize| -> u64 {
        fsdp.map_or(0, |f| f.freed_after(pass, at).iter().map(|&id| bytes(id)).sum())
    };
    let aux_of = |oi: usize| -> u64 {
        plan.steps
            .iter()
            .filter(|s| s.op == oi)
            .flat_map(|s| &s.aux)
            .map(|a| a.elems * 4)
            .sum()
    };
    let mut val_live = vec![false; g.tensors.len()];
    let mut aux_live = vec![0u64; g.ops.len()];
    let mut live = base;
    let mut peak = live;
    let mut all = live;
    if let (Some(f), Some(u)) = (fsdp, left) {
        f.walk_scatter_left(u, fsdp::Walk { live: &mut live, peak: &mut peak, in_flight: &mut in_flight });
    }
    // One op's outputs and statistics appear; outputs already live are discarded (a
    // re-run of an op whose outputs the forward kept).
    let run_op = |oi: usize,
                  keep_aux: bool,
                  live: &mut u64,
                  peak: &mut u64,
                  val_live: &mut [bool],
                  aux_live: &mut [u64]| {
        let produced: u64 = g.ops[oi].outputs.iter().map(|&o| bytes(o)).sum::<u64>() + aux_of(oi);
        *live += produced;
        *peak = (*peak).max(*live);
        for &o in &g.ops[oi].outputs {
            if val_live[o] {
                *live -= bytes(o);
            }
            val_live[o] = true;
        }
        *live -= aux_of(oi);
        if keep_aux {
            *live += aux_of(oi) - aux_live[oi];
            aux_live[oi] = aux_of(oi);
        }
        produced
    };
    // The vocab-parallel loss's row statistics stay with the executor to the next
    // forward pass (`comm.rs`), past their last reader.
    let mut row_stat = vec![false; g.tensors.len()];
    for o in g.ops.iter().filter(|o| o.kind == OpKind::AllReduce && o.flag("row-stats") == Some(true)) {
        for &t in &o.outputs {
            row_stat[t] = true;
        }
    }
    let free = |ts: &[TensorId], live: &mut u64, val_live: &mut [bool]| {
        for &t in ts.iter().filter(|&&t| !row_stat[t]) {
            if std::mem::take(&mut val_live[t]) {
                *live -= bytes(t);
            }
        }
    };
    // Each chunk's peak: the window moves on as the walk enters the next chunk.
    let (mut forward, mut backward) = (vec![0u64; n], vec![0u64; n]);
    let mut at_chunk = 0;
    // The copies a backward pass's pipeline sends hold for the mailbox.
    let mut outbox = 0;
    // What the micro-batch holds when it is parked (`pipeline.rs`).
    let mut held = [vec![0u64; n], vec![0u64; n]];
    let mut grad_live = vec![false; g.tensors.len()];
    let activation = |id: TensorId| g.tensors[id].kind == TensorKind::Activation;
    let kept = |val_live: &[bool], aux_live: &[u64], grad_live: &[bool]| -> u64 {
        let live = |l: &[bool]| (0..g.tensors.len()).filter(|&id| l[id] && activation(id)).map(bytes).sum::<u64>();
        inputs + live(val_live) + live(grad_live) + aux_live.iter().sum::<u64>()
    };
    for oi in 0..g.ops.len() {
        let c = chunk_of(fsdp::Pass::Forward, oi).unwrap_or(0);
        if c != at_chunk {
            forward[at_chunk] = forward[at_chunk].max(peak);
            held[0][at_chunk] = kept(&val_live, &aux_live, &grad_live);
            (peak, at_chunk) = (live, c);
        }
        if let Some(f) = fsdp {
            f.walk_gathers(fsdp::Pass::Forward, oi, end_of(fsdp::Pass::Forward, oi), bytes, fsdp::Walk { live: &mut live, peak: &mut peak, in_flight: &mut in_flight });
        }
        all += run_op(
            oi,
            sched.keep_aux[oi],
            &mut live,
            &mut peak,
            &mut val_live,
            &mut aux_live,
        );
        free(&sched.free_after_forward[oi], &mut live, &mut val_live);
        live -= freed(fsdp::Pass::Forward, oi);
    }
    forward[at_chunk] = forward[at_chunk].max(peak);
    held[0][at_chunk] = kept(&val_live, &aux_live, &grad_live);
    let mut has_grad: HashSet<TensorId> = carried.iter().copied().collect();
    live += 4; // the loss seed
    let mut peak = live;
    at_chunk = usize::MAX;
    for (si, s) in plan.steps.iter().enumerate() {
        let c = chunk_of(fsdp::Pass::Backward, si).unwrap_or(0);
        if c != at_chunk {
            if let Some(b) = backward.get_mut(at_chunk) {
                *b = (*b).max(peak);
                held[1][at_chunk] = kept(&val_live, &aux_live, &grad_live);
                live -= std::mem::take(&mut outbox);
                peak = live;
            }
            at_chunk = c;
        }
        if let Some(f) = fsdp {
            f.walk_gathers(fsdp::Pass::Backward, si, end_of(fsdp::Pass::Backward, si), bytes, fsdp::Walk { live: &mut live, peak: &mut peak, in_flight: &mut in_flight });
        }
        if let Some(seg) = sched.rerun_before_step[si] {
            for (pos, &oi) in sched.segments[seg].iter().enumerate() {
                run_op(
                    oi,
                    sched.rerun_keeps_aux[oi],
                    &mut live,
                    &mut peak,
                    &mut val_live,
                    &mut aux_live,
                );
                free(&sched.free_after_rerun[seg][pos], &mut live, &mut val_live);
            }
        }
        for go in &s.grads_out {
            let fresh = g.tensors[go.tensor].kind == TensorKind::Activation || covered(go.tensor);
            if fresh && has_grad.insert(go.tensor) {
                live += bytes(go.tensor);
                all += bytes(go.tensor);
                grad_live[go.tensor] = true;
            }
        }
        // A pipeline send's copy for the mailbox (a receive's backward), while the
        // gradient it copies is still live; it stays to the end of the pass.
        if passes.driven && g.ops[s.op].kind == OpKind::Recv {
            let copy: u64 = g.ops[s.op].outputs.iter().map(|&o| bytes(o)).sum();
            (live, outbox) = (live + copy, outbox + copy);
        }
        // A vocab-parallel embedding's table gradient, made apart from the store
        // (`comm.rs`) and added into it.
        let beside = if comm::is_vocab_parallel_embedding(&g.ops[s.op]) { s.grads_out.iter().map(|go| bytes(go.tensor)).sum() } else { 0 };
        peak = peak.max(live + beside);
        for &t in &plan.free_grads_after_step[si] {
            live -= bytes(t);
            grad_live[t] = false;
        }
        free(&sched.free_saved_after_step[si], &mut live, &mut val_live);
        live -= std::mem::take(&mut aux_live[s.op]);
        live += buckets.iter().filter(|b| b.0 == si).map(|b| b.1).sum::<u64>();
        peak = peak.max(live);
        if let Some(f) = fsdp.filter(|_| scatters.get(c).copied().unwrap_or(false)) {
            f.walk_scatters(si, bytes, &mut has_grad, fsdp::Walk { live: &mut live, peak: &mut peak, in_flight: &mut in_flight });
        }
        live -= freed(fsdp::Pass::Backward, si);
    }
    if let Some(b) = backward.get_mut(at_chunk) {
        *b = (*b).max(peak);
        held[1][at_chunk] = kept(&val_live, &aux_live, &grad_live);
    }
    Live {
        peak: forward.iter().chain(&backward).copied().max().unwrap_or(peak).max(peak),
        forward,
        backward,
        held,
        all,
        params,
        state,
        inputs,
        row_stats: row_stat.iter().enumerate().filter(|(_, r)| **r).map(|(t, _)| bytes(t)).sum(),
    }
}

mod comm;
mod ep;
mod finalize;
mod fsdp;
mod graph;
mod muon;
mod ops;
mod overlap;
mod pipeline;
mod quant;
pub use fsdp::Shard;
pub use muon::{MOONLIGHT_SCALE, MUON_DEFAULT, Muon, MuonTpMode, NS_COEFFS, NS_EPS, Optimizer, muon_update, muon_weights, newton_schulz, scratch_elems};
pub use overlap::GradBucket;
pub use pipeline::{Pass, PipelineSchedule, Schedule, in_flight, in_order, interleaved, one_f_one_b, passes};
pub use quant::Snapshot;
#[cfg(test)]
mod audit_tests;
#[cfg(test)]
mod muon_tests;
#[cfg(test)]
mod tests;
