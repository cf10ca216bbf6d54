//! One rank's work for a sharding choice, read off the sharded graph: per layer, its
//! GEMMs, attention cores, memory-bound bytes, collectives, stored activations and
//! parameters ([`Template::build`]), then timed on a device ([`Template::time`]).
//!
//! The graph is the executor's own: the reduced-depth logical graph of [`crate::depth`]
//! sharded by `runner_graph::shard` for tp, cp, ep, etp and sequence parallelism at one
//! pipeline stage (pp and dp change which layers a rank holds and how often it runs
//! them, not a layer's shape, so [`crate::step`] composes them). FLOPs and bytes come
//! from `runner_graph::count`, stored activations from `runner_graph::recompute`, and
//! collectives from [`crate::comm::comm_volume`]: counting, running and projecting read
//! the same graph.
//!
//! Per-op time is a roofline: a GEMM takes the longer of its FLOPs at the format's peak
//! times an efficiency that grows with the GEMM's size (FLOPs per call, each expert of a
//! grouped GEMM a call), and its bytes at the achieved HBM bandwidth; attention cores
//! run at the attention efficiency against the BF16 peak (FlashAttention keeps them in
//! BF16 in every recipe); elementwise ops, norms, the loss, routing and the recipe's
//! casts move bytes at the achieved HBM bandwidth. Times measured on the device replace
//! the roofline op by op where a [`Measured`] table has them.

use std::collections::{HashMap, HashSet};

use rustc_hash::{FxHashMap, FxHashSet};

use serde::{Deserialize, Serialize};

use runner_graph::autodiff::needs_grad;
use runner_graph::count::{self, AttentionFlops};
use runner_graph::modules::{Module, modules};
use runner_graph::recompute::{RecomputePolicy, kept_and_layer_bytes};
use runner_graph::shard::{Layout, Place, RankCoord, partition, shard_graph};
use runner_graph::{Graph, OpKind, TensorKind};

use crate::comm::{Fabric, Placement, collective};
use crate::precision::{GemmRole, Plan, SiteFormats};
use crate::profile::{GemmFormat, GpuProfile};

/// The sharding choices that change the shape of a rank's layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardKey {
    pub tp: u32,
    pub cp: u32,
    pub ep: u32,
    pub etp: u32,
    pub sp: bool,
    pub mbs: u32,
}

/// Kernel choices of a run that change how long a rank's ops take but not its graph.
/// A layout carries them flattened into its own fields (each absent one at its default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Kernels {
    /// The routed experts' MLP as fused grouped GEMMs (Megatron-Bridge's
    /// `cutedsl_fused_grouped_mlp`: Transformer Engine's op fuser with CuTe DSL grouped
    /// GEMM kernels, the GLU activation and its casts in their epilogue) rather than
    /// Megatron's default `GroupedLinear` with the activation as kernels of its own.
    pub fused_grouped_mlp: bool,
    /// How the expert-parallel all-to-all moves the routed tokens.
    pub dispatcher: Dispatcher,
}

/// Megatron's expert token dispatcher (`moe_token_dispatcher_type`), as far as it changes
/// what crosses the scale-out network when an expert-parallel group spans scale-up
/// domains.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum Dispatcher {
    /// `flex` with DeepEP or HybridEP (`moe_flex_dispatcher_backend`), what NVIDIA's
    /// current MoE presets run: a token bound for several experts in one remote domain
    /// crosses the network once and is forwarded over NVLink there
    /// ([`crate::comm::Fabric::time_routed`]).
    #[default]
    Flex,
    /// `alltoall`: one NCCL all-to-all of the permuted tokens, a copy per routed expert
    /// (Megatron-Core's `MoEAlltoAllTokenDispatcher`; the only one token dropping with
    /// capacity padding takes).
    AllToAll,
}

impl Dispatcher {
    /// Parse Megatron's name for it, in files and flags alike (`flex`, `alltoall`;
    /// `deepep` and `hybridep`, the flex backends, read as `flex`).
    ///
    /// # Errors
    /// Another name, with the ones it takes.
    pub fn parse(name: &str) -> Result<Dispatcher, String> {
        match name.to_ascii_lowercase().as_str() {
            "flex" | "deepep" | "hybridep" => Ok(Dispatcher::Flex),
            "alltoall" => Ok(Dispatcher::AllToAll),
            _ => Err(format!("unknown expert dispatcher {name:?}: use flex (DeepEP, HybridEP) or alltoall")),
        }
    }
}

impl TryFrom<String> for Dispatcher {
    type Error = String;

    fn try_from(name: String) -> Result<Dispatcher, String> {
        Dispatcher::parse(&name)
    }
}

/// Which parallel group a collective runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Group {
    Tp,
    Cp,
    Ep,
    Etp,
}

/// One GEMM op of a layer (forward numbers; each of its backward GEMMs has the same
/// FLOPs).
#[derive(Clone, Debug, PartialEq)]
pub struct Gemm {
    /// Its logical name (how precision plans name it).
    pub name: String,
    pub flops: f64,
    /// FLOPs of one kernel call: the whole op, or one local expert of a grouped GEMM.
    pub call_flops: f64,
    /// Forward bytes read and written.
    pub bytes: f64,
    /// Elements of its input, weight and output (what a low-precision recipe casts).
    pub x: f64,
    pub w: f64,
    pub y: f64,
    /// The selective-recompute module it belongs to.
    pub module: Option<Module>,
    /// Which backward GEMMs run: the input gradient when its input carries a gradient,
    /// the weight gradient when its weight is trained (both, unless a fine-tune freezes
    /// weights: `runner_graph::peft`).
    pub dgrad: bool,
    pub wgrad: bool,
    /// Matrix FLOPs Muon's Newton-Schulz orthogonalisation of its trained weight takes (5
    /// quintic iterations on each local matrix, m ≤ n: 5·(4·m²·n + 2·m³)), and whether
    /// the weight is a routed expert's.
    pub ns_flops: f64,
    pub expert: bool,
}

/// Muon's Newton-Schulz iterations (Megatron-Bridge's `muon_num_ns_steps` default).
pub const NS_STEPS: f64 = 5.0;

/// FLOPs of Muon's orthogonalisation of `count` matrices of `a` x `b`: each quintic
/// Newton-Schulz step forms A = X·Xᵀ (2·m²·n), A² (2·m³) and (bA + cA²)·X (2·m²·n) on the
/// short side m.
pub fn newton_schulz_flops(a: u64, b: u64, count: f64) -> f64 {
    let (m, n) = (a.min(b) as f64, a.max(b) as f64);
    count * NS_STEPS * (4.0 * m * m * n + 2.0 * m * m * m)
}

/// A memory-bound op of a layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Vector {
    pub name: String,
    /// Forward bytes read and written.
    pub bytes: f64,
    /// The selective-recompute module it belongs to.
    pub module: Option<Module>,
    /// Whether it has a backward (some input carries a gradient), which moves twice the
    /// forward's bytes: it reads the saved input and the incoming gradient and writes
    /// the outgoing one.
    pub backward: bool,
}

/// An attention core of a layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Core {
    pub name: String,
    /// Forward FLOPs over unmasked keys.
    pub flops: f64,
    pub bytes: f64,
    /// Bytes its kernels pass among themselves through HBM, forward and backward (the
    /// SSD scan's chunk states; none for a flash-attention kernel, which keeps its scores
    /// on chip).
    pub spill: [f64; 2],
    /// Whether it has a backward (some input carries a gradient).
    pub backward: bool,
}

/// One collective and its backward twin.
#[derive(Clone, Debug, PartialEq)]
pub struct Comm {
    pub group: Group,
    pub kind: OpKind,
    pub bytes: f64,
    pub backward: Option<OpKind>,
    /// For the expert-parallel all-to-all of a routed layer: (top-k, routed experts),
    /// what decides how many scale-up domains one token's copies reach
    /// ([`crate::comm::Fabric::time_routed`]).
    pub routing: Option<(u32, u32)>,
}

/// An activation the forward keeps (with no recompute) for the backward.
#[derive(Clone, Debug, PartialEq)]
pub struct KeptTensor {
    pub elements: f64,
    /// Its bytes at the graph's dtype.
    pub bytes: f64,
    /// The part's GEMMs (indices into [`Part::gemms`]) that keep it as their input for the
    /// weight gradient: a low-precision one keeps its own cast copy instead.
    pub gemms: Vec<usize>,
    /// Whether an op other than those GEMMs keeps it as it is.
    pub other: bool,
    /// The selective-recompute module whose recompute drops it.
    pub module: Option<Module>,
}

/// What a layer (or the embedding side, or the head side) of one rank does per
/// micro-batch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Part {
    pub gemms: Vec<Gemm>,
    pub attention: Vec<Core>,
    /// Mamba-2 scans (SSD): chunked matrix work like an attention core's, timed at the
    /// profile's `ssm` efficiency, plus the chunk states their kernels pass through HBM.
    pub ssm: Vec<Core>,
    /// Memory-bound ops: norms, activations, rotary, residual adds, embedding gathers,
    /// routing, the loss.
    pub vector: Vec<Vector>,
    pub comm: Vec<Comm>,
    /// Stored activation bytes per micro-batch under none, selective (the attention
    /// cores), full recompute, at the graph's dtypes.
    pub activations: [f64; 3],
    /// What is stored with no recompute, tensor by tensor.
    pub kept: Vec<KeptTensor>,
    /// Trained parameter elements this rank holds: dense, and routed-expert.
    pub dense_params: f64,
    pub expert_params: f64,
    /// Frozen parameter elements this rank holds (a fine-tune's base weights): held, but
    /// without gradients or optimizer state.
    pub frozen_params: f64,
    /// Elements of weights this part shares with the embedding side (a tied output head):
    /// counted once on one stage, on both the first and the last stage when pp > 1;
    /// trained, and frozen.
    pub tied_params: f64,
    pub tied_frozen_params: f64,
}

/// A rank's parts for one [`ShardKey`]: the embedding side, each layer of the reduced
/// graph, the head side.
#[derive(Clone, Debug)]
pub struct Template {
    pub key: ShardKey,
    pub pre: Part,
    /// Per layer position of the reduced graph.
    pub layers: Vec<Part>,
    pub post: Part,
    /// Bytes of one pipeline send (the residual stream between stages, this rank's share).
    pub stage_message_bytes: f64,
}

fn policy_index(p: RecomputePolicy) -> usize {
    match p {
        RecomputePolicy::None => 0,
        RecomputePolicy::Selective => 1,
        RecomputePolicy::Full => 2,
    }
}

/// The data-parallel size the template shards with: the smallest that lets ep·etp
/// divide tp·cp·dp (a rank's graph does not otherwise depend on dp).
fn min_dp(key: &ShardKey) -> Result<u32, String> {
    let stage = u64::from(key.tp) * u64::from(key.cp);
    let experts = (u64::from(key.ep) * u64::from(key.etp)).max(1);
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    // The fewest d with stage·d a multiple of ep·etp.
    let dp = experts / gcd(stage.max(1), experts);
    match u32::try_from(dp) {
        Ok(d) if stage.saturating_mul(dp) <= u64::from(u32::MAX) => Ok(d),
        _ => Err(format!(
            "ep·etp = {experts} needs {dp} data-parallel ranks of tp·cp = {stage} GPUs each, more GPUs than a run can \
             have; ep must divide the routed experts"
        )),
    }
}

/// Rank 0's graph of `reduced` sharded for `key` at one pipeline stage: what
/// [`Template::build`] reads, and what `runner measure` runs.
///
/// # Errors
/// The sharding does not fit the graph (`Layout::validate`'s message).
pub fn rank_graph(reduced: &Graph, key: ShardKey) -> Result<Graph, String> {
    let dp = min_dp(&key)?;
    let layout = Layout {
        tp: key.tp,
        pp: 1,
        cp: key.cp,
        ep: key.ep,
        etp: key.etp,
        dp,
        vp: 1,
        sequence_parallel: key.sp,
        fsdp: false,
        micro_batch: key.mbs,
        global_batch: key.mbs.saturating_mul(dp),
        split: Default::default(),
    };
    shard_graph(reduced, &layout, RankCoord::default())
}

impl Template {
    /// Shard `reduced` (the reduced-depth logical graph built for micro-batch
    /// `key.mbs`) for `key` and read off each part.
    ///
    /// # Errors
    /// The sharding does not fit the graph (`Layout::validate`'s message).
    pub fn build(reduced: &Graph, depth_layers: &[i32], key: ShardKey) -> Result<Template, String> {
        let rank = rank_graph(reduced, key)?;
        let g = &rank;
        let (places, layers) = partition(g);
        // Layers beyond the model's main ones (MTP modules) belong to the head side.
        // Layer numbers are the plugin's (std's SipHash); op and tensor indices are ours (FxHash).
        let main: HashSet<i32> = depth_layers.iter().copied().collect();
        let pos: HashMap<i32, usize> = layers.iter().enumerate().map(|(p, &l)| (l, p)).collect();
        let mut parts: Vec<Part> = vec![Part::default(); layers.len() + 2];
        let post = layers.len() + 1;
        // Each op's part, looked up once (the loops below ask for it several times per op);
        // a layer's ops come one after another, so the last layer's part is kept at hand
        // rather than hashed again for each op.
        let mut last: Option<(i32, usize)> = None;
        let part: Vec<usize> = places
            .iter()
            .map(|p| match *p {
                Place::Pre => 0,
                Place::Layer(l) => match last {
                    Some((k, at)) if k == l => at,
                    _ => {
                        let at = if main.contains(&l) { 1 + pos[&l] } else { post };
                        last = Some((l, at));
                        at
                    }
                },
                Place::Post => post,
            })
            .collect();
        // Weights: the part of their first reader, and whether the head side reads them
        // too; expert weights are grouped-linear's. By tensor id: the parameter sums
        // below add whole numbers (under 2^53), exact in any order.
        let mut first_reader: Vec<Option<usize>> = vec![None; g.tensors.len()];
        let mut read_by_post = vec![false; g.tensors.len()];
        let mut expert: FxHashSet<usize> = FxHashSet::default();
        for (i, op) in g.ops.iter().enumerate() {
            for (j, &x) in op.inputs.iter().enumerate() {
                if !g.tensors[x].kind.is_param() {
                    continue;
                }
                first_reader[x].get_or_insert(part[i]);
                read_by_post[x] |= part[i] == post;
                if op.kind == OpKind::GroupedLinear && j == 1 {
                    expert.insert(x);
                }
            }
        }
        for (w, p) in first_reader.iter().enumerate().filter_map(|(w, p)| Some((w, (*p)?))) {
            let n = g.tensors[w].numel() as f64;
            if g.tensors[w].kind == TensorKind::Frozen {
                parts[p].frozen_params += n;
            } else if expert.contains(&w) {
                parts[p].expert_params += n;
            } else {
                parts[p].dense_params += n;
            }
            if p == 0 && read_by_post[w] {
                if g.tensors[w].kind == TensorKind::Frozen {
                    parts[post].tied_frozen_params += n;
                } else {
                    parts[post].tied_params += n;
                }
            }
        }
        let mods = modules(g);
        // Which ops run a backward, and which backward GEMMs (a fine-tune's frozen
        // weights and the layers before its first adapter drop some).
        let needs = needs_grad(g);
        let need = |t: usize| needs.get(t).copied().unwrap_or(false);
        let has_backward = |op: &runner_graph::Op| op.inputs.iter().any(|&t| need(t));
        // Where each GEMM op lands: (part, index in its gemms).
        let mut gemm_at: FxHashMap<usize, (usize, usize)> = FxHashMap::default();
        let local_experts = |op: &runner_graph::Op| -> f64 {
            op.inputs.get(1).and_then(|&w| g.tensors[w].shape.first().copied()).unwrap_or(1).max(1) as f64
        };
        for (i, op) in g.ops.iter().enumerate() {
            let at = part[i];
            let p = &mut parts[at];
            let c = count::op_cost(g, op, AttentionFlops::CausalHalved);
            match op.kind {
                OpKind::Linear | OpKind::GroupedLinear => {
                    let numel = |k: Option<&usize>| k.map_or(0.0, |&t| g.tensors[t].numel() as f64);
                    let calls = if op.kind == OpKind::GroupedLinear { local_experts(op) } else { 1.0 };
                    let wgrad = op.inputs.get(1).is_some_and(|&t| need(t));
                    gemm_at.insert(i, (at, p.gemms.len()));
                    p.gemms.push(Gemm {
                        name: op.name.clone(),
                        flops: c.fwd_flops,
                        call_flops: c.fwd_flops / calls,
                        bytes: c.bytes,
                        x: numel(op.inputs.first()),
                        w: numel(op.inputs.get(1)),
                        y: numel(op.outputs.first()),
                        module: mods.op[i],
                        dgrad: op.inputs.first().is_some_and(|&t| need(t)),
                        wgrad,
                        // Muon updates trained weights only.
                        ns_flops: match op.inputs.get(1).map(|&w| g.tensors[w].shape.as_slice()) {
                            Some(&[n, k]) if wgrad => newton_schulz_flops(n, k, 1.0),
                            Some(&[e, n, k]) if wgrad => newton_schulz_flops(n, k, e as f64),
                            _ => 0.0,
                        },
                        expert: op.kind == OpKind::GroupedLinear,
                    });
                }
                OpKind::SsmScan => p.ssm.push(Core {
                    name: op.name.clone(),
                    flops: c.fwd_flops,
                    bytes: c.bytes,
                    spill: count::ssm_scan_spill(g, op),
                    backward: has_backward(op),
                }),
                OpKind::Attention => p.attention.push(Core {
                    name: op.name.clone(),
                    flops: c.fwd_flops,
                    bytes: c.bytes,
                    spill: [0.0; 2],
                    backward: has_backward(op),
                }),
                OpKind::AllReduce
                | OpKind::AllGather
                | OpKind::ReduceScatter
                | OpKind::AllToAll
                | OpKind::Send
                | OpKind::Recv => {}
                _ => p.vector.push(Vector {
                    name: op.name.clone(),
                    bytes: c.bytes,
                    module: mods.op[i],
                    backward: has_backward(op),
                }),
            }
        }
        // Per part: the router's top-k and the routed experts of its dispatch.
        let mut top_k: FxHashMap<usize, u32> = FxHashMap::default();
        let mut experts: FxHashMap<usize, u32> = FxHashMap::default();
        for (i, op) in g.ops.iter().enumerate() {
            let v = |key: &str| op.int(key).and_then(|x| u32::try_from(x).ok()).filter(|&x| x > 0);
            match op.kind {
                OpKind::Router => {
                    if let Some(k) = v("top-k") {
                        top_k.insert(part[i], k);
                    }
                }
                OpKind::MoeDispatch => {
                    if let Some(e) = v("experts") {
                        experts.insert(part[i], e);
                    }
                }
                _ => {}
            }
        }
        // Each collective (what `comm_volume` lists, in op order) in the part of its own op:
        // the sharding pass names a collective op after the tensor it writes, which no
        // other op's name repeats (a map from names to the first op of each, made per
        // sharding, found the same op).
        for (i, op) in g.ops.iter().enumerate() {
            let Some(c) = collective(g, op) else { continue };
            let group = match c.group {
                "tp" => Group::Tp,
                "cp" => Group::Cp,
                "ep" => Group::Ep,
                "etp" => Group::Etp,
                other => return Err(format!("a collective over group '{other}' in a single-stage rank graph")),
            };
            let at = part[i];
            let routing = match (group, op.kind) {
                (Group::Ep, OpKind::AllToAll) => top_k.get(&at).copied().zip(experts.get(&at).copied()),
                _ => None,
            };
            let backward = c.backward.filter(|_| has_backward(op));
            parts[at].comm.push(Comm { group, kind: op.kind, bytes: c.bytes, backward, routing });
        }
        let (kept, activations) = kept_and_layer_bytes(g);
        for k in kept {
            let p = if k.layer >= 0 && main.contains(&k.layer) { 1 + pos[&k.layer] } else { post };
            let t = &g.tensors[k.tensor];
            let mut gemms = Vec::new();
            let mut other = false;
            for &(op, slot) in &k.by {
                match gemm_at.get(&op) {
                    Some(&(q, j)) if q == p && slot == 0 => gemms.push(j),
                    _ => other = true,
                }
            }
            parts[p].kept.push(KeptTensor {
                elements: t.numel() as f64,
                bytes: t.numel() as f64 * t.dtype.bytes(),
                gemms,
                other,
                module: mods.frees.get(&k.tensor).copied(),
            });
        }
        for (policy, by) in [RecomputePolicy::None, RecomputePolicy::Selective, RecomputePolicy::Full].into_iter().zip(activations) {
            for (layer, bytes) in by {
                let p = if layer >= 0 && main.contains(&layer) { 1 + pos[&layer] } else { post };
                parts[p].activations[policy_index(policy)] += bytes;
            }
        }
        // The residual stream between stages: (B, T/cp[/tp with SP], C) at its dtype.
        let stage_message_bytes = g
            .ops
            .iter()
            .enumerate()
            .rev()
            .filter(|(i, _)| matches!(places[*i], Place::Layer(_)))
            .find_map(|(_, op)| op.outputs.last())
            .map_or(0.0, |&t| g.tensors[t].numel() as f64 * g.tensors[t].dtype.bytes());
        let post_part = parts.pop().unwrap_or_default();
        let pre = parts.remove(0);
        Ok(Template { key, pre, layers: parts, post: post_part, stage_message_bytes })
    }

    /// Time one part with the GEMM formats of the model layer it stands for: `names`
    /// are that layer's GEMM names in op order (the part's own when the part is that
    /// layer), and the part's j-th GEMM takes the plan's formats for `names[j]`.
    ///
    /// With `kernels.fused_grouped_mlp` the routed experts' MLP runs fused: their GEMMs at the
    /// dense efficiency and the activation between them inside the GEMMs; otherwise
    /// their GEMMs at the profile's `grouped_gemm` share of it and the activation as an
    /// op of its own. On that unfused path an NVFP4 expert GEMM runs at the MXFP8 rate:
    /// Transformer Engine's `GroupedLinear` quantised and Hadamard-transformed each local
    /// expert's operands one kernel after another and reached no more than MXFP8's
    /// throughput (TransformerEngine issue 2281, October 2025), until its grouped NVFP4
    /// GEMMs (issues 2455 and 2456, TE 2.16).
    pub fn time_part(&self, part: &Part, names: &[String], plan: &Plan, rates: &Rates, measured: &Measured, kernels: Kernels) -> PartTime {
        let mut t = PartTime::default();
        let cast = plan.recipe.cast_bytes_per_element();
        for (j, gm) in part.gemms.iter().enumerate() {
            let f: SiteFormats = plan.formats(names.get(j).map_or(gm.name.as_str(), String::as_str));
            let low = |r: GemmRole| f[r.index()] != GemmFormat::Bf16;
            let (dgrad, wgrad) = (gm.dgrad, gm.wgrad);
            let (fwd, bwd) = match measured.gemm(&self.key, &gm.name, &f) {
                // `runner measure` times both backward GEMMs; a frozen weight's runs the
                // input gradient only, taken as half.
                Some((fwd, bwd)) => (fwd, bwd * (f64::from(u8::from(dgrad)) + f64::from(u8::from(wgrad))) / 2.0),
                None => {
                    let unfused = gm.expert && !kernels.fused_grouped_mlp;
                    let share = if unfused { rates.grouped } else { 1.0 };
                    let time = |r: GemmRole| {
                        let format = match f[r.index()] {
                            GemmFormat::Nvfp4 if unfused => GemmFormat::Mxfp8,
                            other => other,
                        };
                        rates.gemm_at(gm.flops, gm.call_flops, gm.bytes, format, share)
                    };
                    let mut fwd = time(GemmRole::Forward);
                    let mut bwd = 0.0;
                    if dgrad {
                        bwd += time(GemmRole::InputGradient);
                    }
                    if wgrad {
                        bwd += time(GemmRole::WeightGradient);
                    }
                    if low(GemmRole::Forward) || (wgrad && low(GemmRole::WeightGradient)) {
                        fwd += gm.x * cast / rates.hbm;
                    }
                    if (dgrad && low(GemmRole::InputGradient)) || (wgrad && low(GemmRole::WeightGradient)) {
                        bwd += gm.y * cast / rates.hbm;
                    }
                    (fwd, bwd)
                }
            };
            t.fwd += fwd;
            t.bwd += bwd;
            t.gemm += fwd + bwd;
            if let Some(m) = gm.module {
                t.module_fwd[m.index()] += fwd;
            }
            if low(GemmRole::Forward) || low(GemmRole::InputGradient) {
                t.weight_cast += gm.w * cast / rates.hbm;
                t.low_precision_weights += gm.w;
                if gm.wgrad {
                    t.low_precision_trained[usize::from(gm.expert)] += gm.w;
                }
            }
        }
        // A sequence-mixing core: its measured times, else the roofline's plus the
        // round trips of what its kernels pass each other through HBM; no backward where
        // nothing upstream needs a gradient.
        type Time = fn(&Rates, f64, f64) -> f64;
        let core = |c: &Core, forward: Time, backward: Time| {
            let (f, b) = measured.get(&self.key, &c.name).unwrap_or_else(|| {
                (
                    forward(rates, c.flops, c.bytes) + c.spill[0] / rates.hbm,
                    backward(rates, c.flops, c.bytes) + c.spill[1] / rates.hbm,
                )
            });
            (f, if c.backward { b } else { 0.0 })
        };
        for a in &part.attention {
            let (f, b) = core(a, Rates::attention_forward, Rates::attention_backward);
            t.fwd += f;
            t.bwd += b;
            t.attention_fwd += f;
            t.module_fwd[Module::CoreAttn.index()] += f;
            t.attention += f + b;
        }
        for c in &part.ssm {
            let (f, b) = core(c, Rates::scan_forward, Rates::scan_backward);
            t.fwd += f;
            t.bwd += b;
            t.scan += f + b;
        }
        for v in &part.vector {
            if kernels.fused_grouped_mlp && v.module == Some(Module::MoeAct) {
                // In the fused grouped GEMMs' epilogue (forward) and the dgrad's (backward).
                continue;
            }
            let (f, b) = measured.get(&self.key, &v.name).unwrap_or((v.bytes / rates.hbm, 2.0 * v.bytes / rates.hbm));
            t.fwd += f;
            t.bwd += if v.backward { b } else { 0.0 };
            if let Some(m) = v.module {
                t.module_fwd[m.index()] += f;
            }
        }
        for c in &part.comm {
            let p = rates.placement(&self.key, c.group);
            let i = match c.group {
                Group::Tp => 0,
                Group::Cp => 1,
                Group::Ep | Group::Etp => 2,
            };
            let routing = c.routing.filter(|_| kernels.dispatcher == Dispatcher::Flex);
            let time = |kind: OpKind| match routing {
                Some((k, e)) => rates.fabric.time_routed(kind, c.bytes, p, k, e),
                None => rates.fabric.time(kind, c.bytes, p),
            };
            let nic = |kind: OpKind| rates.fabric.nic_bytes(kind, c.bytes, p, routing);
            t.comm_fwd[i] += time(c.kind);
            t.nic_fwd += nic(c.kind);
            if let Some(b) = c.backward {
                t.comm_bwd[i] += time(b);
                t.nic_bwd += nic(b);
            }
            // Context parallelism saves only the rank's own K/V chunk for the backward:
            // Transformer Engine's attention gathers K and V again before reduce-scattering
            // their gradients (cp_comm_type all_gather), or passes them around the ring
            // again beside dK/dV (p2p), so its backward moves twice the forward's bytes.
            if c.group == Group::Cp && c.kind == OpKind::AllGather && c.backward.is_some() {
                t.comm_bwd[i] += time(OpKind::AllGather);
                t.nic_bwd += nic(OpKind::AllGather);
            }
        }
        t
    }
}

/// What one part keeps for the backward under a precision plan, bytes per micro-batch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stored {
    /// With no recompute.
    pub none: f64,
    /// Of that, what recomputing each selective module drops.
    pub freed: [f64; Module::COUNT],
}

impl Template {
    /// What `part` keeps with no recompute under `plan` (the GEMM names as in
    /// [`Template::time_part`]): Transformer Engine keeps a low-precision GEMM's input
    /// as the cast copy its weight-gradient GEMM reads (TE `Linear` saves the quantized
    /// input, column-wise usage only, and drops the high-precision one), so a tensor
    /// only such GEMMs keep is stored at the format's bytes, and one that another op
    /// keeps as well is stored twice (as it is and cast).
    pub fn stored(part: &Part, names: &[String], plan: &Plan) -> Stored {
        let wgrad = |j: usize| {
            let name = names.get(j).map_or(part.gemms[j].name.as_str(), String::as_str);
            plan.formats(name)[GemmRole::WeightGradient.index()]
        };
        let mut out = Stored::default();
        for k in &part.kept {
            let cast: Vec<GemmFormat> = k.gemms.iter().map(|&j| wgrad(j)).filter(|&f| f != GemmFormat::Bf16).collect();
            let cast_bytes = cast.iter().map(|f| f.element_bytes()).fold(0.0, f64::max) * k.elements;
            let bytes = if cast.is_empty() {
                k.bytes
            } else if !k.other && cast.len() == k.gemms.len() {
                cast_bytes
            } else {
                k.bytes + cast_bytes
            };
            out.none += bytes;
            if let Some(m) = k.module {
                out.freed[m.index()] += bytes;
            }
        }
        out
    }
}

/// Per-op times measured on the device the projection targets: forward and backward
/// seconds per micro-batch, by op name in the rank's graph. Where an op is listed its
/// measurement replaces the roofline (formats and casts included, as it ran).
///
/// Op names repeat across shardings and precision plans, so a measurement says where it
/// holds: at `key` only (a template of another sharding keeps the roofline), and a GEMM
/// listed in `formats` only where the plan gives it those formats. `crate::measured`
/// builds one from a `runner measure` file.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    pub ops: HashMap<String, (f64, f64)>,
    /// The sharding the times were measured at (`None`: any).
    pub key: Option<ShardKey>,
    /// The formats (forward, input gradient, weight gradient) each measured GEMM ran in.
    pub formats: HashMap<String, SiteFormats>,
}

impl Measured {
    fn get(&self, key: &ShardKey, name: &str) -> Option<(f64, f64)> {
        if self.key.is_some_and(|k| k != *key) {
            return None;
        }
        self.ops.get(name).copied()
    }

    fn gemm(&self, key: &ShardKey, name: &str, formats: &SiteFormats) -> Option<(f64, f64)> {
        self.get(key, name).filter(|_| self.formats.get(name).is_none_or(|f| f == formats))
    }
}

/// One part's times per micro-batch, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PartTime {
    /// Forward and backward compute (GEMMs, attention, memory-bound ops, activation and
    /// gradient casts).
    pub fwd: f64,
    pub bwd: f64,
    /// GEMM time forward and backward (what TP communication overlaps with).
    pub gemm: f64,
    /// Attention cores' time forward and backward (what CP exchange overlaps with), and
    /// their forward only (what selective recompute of `core_attn` repeats).
    pub attention: f64,
    pub attention_fwd: f64,
    /// Mamba-2 scans' time forward and backward, their chunk states' HBM round trips
    /// included.
    pub scan: f64,
    /// Weight casts of a low-precision recipe: once per step, not per micro-batch.
    pub weight_cast: f64,
    /// Elements of weights read by low-precision GEMMs (their cast copies stay resident
    /// between micro-batches, as Transformer Engine caches them).
    pub low_precision_weights: f64,
    /// Of them, the trained ones (what the distributed optimizer gathers), dense and
    /// routed-expert.
    pub low_precision_trained: [f64; 2],
    /// Collective time forward and backward: tp, cp, ep (with etp).
    pub comm_fwd: [f64; 3],
    pub comm_bwd: [f64; 3],
    /// Bytes those collectives move through the GPU's NIC per direction, forward and
    /// backward ([`crate::comm::Fabric::nic_bytes`]).
    pub nic_fwd: f64,
    pub nic_bwd: f64,
    /// Forward compute of each selective-recompute module (what recomputing it repeats;
    /// the collectives inside a module are not repeated in this model).
    pub module_fwd: [f64; Module::COUNT],
}

impl PartTime {
    /// Exposed communication per micro-batch (tp, cp, ep) given whether TP overlap and
    /// EP overlap are on. Overlapped communication hides up to the compute it runs
    /// beside (TP: the GEMMs it feeds; CP: attention; EP: the rest of the layer, another
    /// micro-batch's, in Megatron's 1F1B A2A overlap) and never more than the
    /// profile's share of itself.
    pub fn exposed(&self, rates: &Rates, tp_overlap: bool, ep_overlap: bool) -> [f64; 3] {
        let tp = self.comm_fwd[0] + self.comm_bwd[0];
        let cp = self.comm_fwd[1] + self.comm_bwd[1];
        let ep = self.comm_fwd[2] + self.comm_bwd[2];
        let hide = |c: f64, window: f64, share: f64| (c - window).max(c * (1.0 - share)).max(0.0);
        let tp = if tp_overlap { hide(tp, self.gemm, rates.tp_overlap) } else { tp };
        let ep = if ep_overlap { hide(ep, self.fwd + self.bwd, rates.ep_overlap) } else { ep };
        [tp, hide(cp, self.attention, rates.cp_overlap), ep]
    }

    /// Forward work the backward repeats under `policy`, seconds: the attention cores'
    /// forward (selective with Megatron's default module list; other lists add up
    /// [`PartTime::module_fwd`]), or the whole forward with its exposed communication
    /// (full).
    pub fn recompute(&self, policy: RecomputePolicy, exposed: [f64; 3]) -> f64 {
        match policy {
            RecomputePolicy::None => 0.0,
            RecomputePolicy::Selective => self.module_fwd[Module::CoreAttn.index()],
            RecomputePolicy::Full => {
                let total: f64 = self.comm_fwd.iter().zip(&self.comm_bwd).map(|(a, b)| a + b).sum();
                let fwd: f64 = self.comm_fwd.iter().sum();
                let share = if total > 0.0 { fwd / total } else { 0.0 };
                self.fwd + share * exposed.iter().sum::<f64>()
            }
        }
    }
}

/// A device's achieved rates, precomputed from its profile for the inner loops.
#[derive(Clone, Debug)]
pub struct Rates {
    /// Peak FLOP/s × asymptotic efficiency per format (0: the chip lacks it).
    gemm_rate: [f64; 4],
    half_flops: f64,
    /// Share of the dense GEMM efficiency unfused routed-expert GEMMs reach.
    grouped: f64,
    attention_rate: f64,
    attention_backward: f64,
    ssm_rate: f64,
    /// Achieved HBM bytes/s.
    pub hbm: f64,
    pub fabric: Fabric,
    pub tp_overlap: f64,
    pub cp_overlap: f64,
    pub ep_overlap: f64,
    pub pp_overlap: f64,
}

fn format_index(f: GemmFormat) -> usize {
    match f {
        GemmFormat::Bf16 => 0,
        GemmFormat::Fp8 => 1,
        GemmFormat::Mxfp8 => 2,
        GemmFormat::Nvfp4 => 3,
    }
}

impl Rates {
    pub fn new(gpu: &GpuProfile) -> Rates {
        let e = &gpu.efficiency;
        let mut gemm_rate = [0.0; 4];
        for f in GemmFormat::ALL {
            gemm_rate[format_index(f)] = gpu.peak_tflops.get(f).map_or(0.0, |p| p * 1e12 * e.gemm.get(f));
        }
        Rates {
            gemm_rate,
            half_flops: e.gemm_half_gflop * 1e9,
            grouped: e.grouped_gemm,
            attention_rate: gpu.peak_tflops.bf16 * 1e12 * e.attention,
            attention_backward: e.attention_backward,
            ssm_rate: gpu.peak_tflops.bf16 * 1e12 * e.ssm,
            hbm: gpu.hbm_gbs * 1e9 * e.memory,
            fabric: gpu.fabric(),
            tp_overlap: e.tp_overlap,
            cp_overlap: e.cp_overlap,
            ep_overlap: e.ep_overlap,
            pp_overlap: e.pp_overlap,
        }
    }

    /// Size-dependent share of the asymptotic rate a call of `call_flops` reaches.
    fn size(&self, call_flops: f64) -> f64 {
        call_flops / (call_flops + self.half_flops)
    }

    /// Seconds of one GEMM of `flops` (calls of `call_flops`) moving `bytes`, in `f`.
    /// A format the chip lacks runs at the BF16 rate (the caller refuses such plans
    /// before timing them).
    pub fn gemm(&self, flops: f64, call_flops: f64, bytes: f64, f: GemmFormat) -> f64 {
        self.gemm_at(flops, call_flops, bytes, f, 1.0)
    }

    /// [`Rates::gemm`] for kernels that reach `share` of the dense efficiency.
    fn gemm_at(&self, flops: f64, call_flops: f64, bytes: f64, f: GemmFormat, share: f64) -> f64 {
        if flops <= 0.0 {
            return bytes / self.hbm;
        }
        let mut rate = self.gemm_rate[format_index(f)];
        if rate <= 0.0 {
            rate = self.gemm_rate[0];
        }
        (flops / (rate * share * self.size(call_flops))).max(bytes / self.hbm)
    }

    pub fn attention_forward(&self, flops: f64, bytes: f64) -> f64 {
        self.mixing(self.attention_rate, 1.0, flops, bytes)
    }

    /// The backward kernel recomputes the scores: 2.5x the forward's matrix work.
    pub fn attention_backward(&self, flops: f64, bytes: f64) -> f64 {
        self.mixing(self.attention_rate * self.attention_backward, 2.5, flops, 2.0 * bytes)
    }

    /// A Mamba-2 scan's forward, at the profile's `ssm` efficiency.
    pub fn scan_forward(&self, flops: f64, bytes: f64) -> f64 {
        self.mixing(self.ssm_rate, 1.0, flops, bytes)
    }

    /// A Mamba-2 scan's backward: twice the forward's matrix work (the states recomputed,
    /// the gradients of x, dt, B and C), with the attention backward's relative efficiency.
    pub fn scan_backward(&self, flops: f64, bytes: f64) -> f64 {
        self.mixing(self.ssm_rate * self.attention_backward, 2.0, flops, 2.0 * bytes)
    }

    /// A sequence-mixing kernel doing `work` times a forward's `flops` at `rate` (less
    /// for small calls), or moving `bytes` at the HBM rate if that is slower.
    fn mixing(&self, rate: f64, work: f64, flops: f64, bytes: f64) -> f64 {
        (work * flops / (rate * self.size(flops))).max(bytes / self.hbm)
    }

    /// Where a group of `key`'s layout sits (Megatron order: tp, cp; experts etp, ep).
    pub fn placement(&self, key: &ShardKey, g: Group) -> Placement {
        match g {
            Group::Tp => Placement { size: key.tp, stride: 1 },
            Group::Cp => Placement { size: key.cp, stride: key.tp },
            Group::Etp => Placement { size: key.etp, stride: 1 },
            Group::Ep => Placement { size: key.ep, stride: key.etp },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profiles;

    fn key(tp: u32, cp: u32, ep: u32, etp: u32) -> ShardKey {
        ShardKey { tp, cp, ep, etp, sp: false, mbs: 1 }
    }

    /// The fewest data-parallel ranks for ep·etp to divide tp·cp·dp, by hand; a stage of
    /// exactly 2^32 - 1 GPUs is still a run, one more GPU than that is not.
    #[test]
    fn min_dp_is_the_fewest_ranks_experts_need() {
        assert_eq!(min_dp(&key(2, 1, 8, 1)), Ok(4));
        assert_eq!(min_dp(&key(2, 2, 4, 2)), Ok(2));
        assert_eq!(min_dp(&key(4, 2, 8, 1)), Ok(1));
        assert_eq!(min_dp(&key(65535, 65537, 1, 1)), Ok(1));
        assert!(min_dp(&key(65535, 65537, 2, 1)).is_err());
    }

    /// Muon's Newton-Schulz FLOPs on the short side: two 3 x 5 matrices (or 5 x 3) take
    /// 2 · 5 · (4·9·5 + 2·27) = 2340.
    #[test]
    fn newton_schulz_flops_by_hand() {
        assert_eq!(newton_schulz_flops(3, 5, 2.0), 2340.0);
        assert_eq!(newton_schulz_flops(5, 3, 2.0), 2340.0);
    }

    /// Megatron's dispatcher names, any case; DeepEP and HybridEP are flex's backends.
    #[test]
    fn dispatcher_names() {
        for (name, d) in [("flex", Dispatcher::Flex), ("DeepEP", Dispatcher::Flex), ("hybridep", Dispatcher::Flex), ("AllToAll", Dispatcher::AllToAll)] {
            assert_eq!(Dispatcher::parse(name), Ok(d), "{name}");
        }
        assert!(Dispatcher::parse("nccl").unwrap_err().contains("use flex"));
    }

    /// Where each group sits in Megatron's order: tp innermost, cp over tp, etp innermost
    /// of the experts, ep over etp. With etp below tp (etp 1, tp 4: Megatron's expert
    /// order etp-ep-edp-pp) the ep ranks are etp = 1 apart, not tp: eight of them fill one
    /// 8-GPU node rather than spanning four.
    #[test]
    fn group_placements() {
        let rates = Rates::new(Profiles::builtin().get("h100").unwrap());
        let at = |k: ShardKey, g| {
            let p = rates.placement(&k, g);
            (p.size, p.stride)
        };
        let k = key(2, 4, 8, 2);
        assert_eq!([at(k, Group::Tp), at(k, Group::Cp), at(k, Group::Etp), at(k, Group::Ep)], [(2, 1), (4, 2), (2, 1), (8, 2)]);
        let k = key(4, 2, 8, 1);
        assert_eq!([at(k, Group::Tp), at(k, Group::Cp), at(k, Group::Etp), at(k, Group::Ep)], [(4, 1), (2, 4), (1, 1), (8, 1)]);
    }

    /// Overlapped communication hides up to the compute beside it and at most its
    /// overlap share: TP behind the GEMMs, CP behind attention (always on), EP behind
    /// the whole layer's compute; by hand with shares of 0.8.
    #[test]
    fn exposed_communication_by_hand() {
        let mut rates = Rates::new(Profiles::builtin().get("h100").unwrap());
        (rates.tp_overlap, rates.cp_overlap, rates.ep_overlap) = (0.8, 0.8, 0.8);
        let t = PartTime { fwd: 1.0, bwd: 2.0, gemm: 0.5, attention: 3.0, comm_fwd: [1.0, 1.0, 2.0], comm_bwd: [1.0, 1.0, 2.0], ..PartTime::default() };
        // tp 2 behind 0.5 of GEMMs: 1.5 left; cp 2 behind 3 of attention: 20 % of it
        // left, 0.4; ep 4 behind 3 of compute: 1.
        let e = t.exposed(&rates, true, true);
        let want = [1.5, 0.4, 1.0];
        for i in 0..3 {
            assert!((e[i] - want[i]).abs() < 1e-12, "{e:?}");
        }
        assert_eq!(t.exposed(&rates, false, false)[0], 2.0);
        assert_eq!(t.exposed(&rates, false, false)[2], 4.0);
        assert!((t.exposed(&rates, false, false)[1] - 0.4).abs() < 1e-12);
    }

    /// What recompute repeats: nothing; the attention cores' forward; the whole forward
    /// with the forward's share of the exposed communication (here 1 of 4 seconds).
    #[test]
    fn recompute_repeats_by_hand() {
        let mut t = PartTime { fwd: 2.0, attention: 5.0, attention_fwd: 1.5, comm_fwd: [1.0, 0.0, 0.0], comm_bwd: [3.0, 0.0, 0.0], ..PartTime::default() };
        t.module_fwd[Module::CoreAttn.index()] = 1.5;
        assert_eq!(t.recompute(RecomputePolicy::None, [4.0, 0.0, 0.0]), 0.0);
        assert_eq!(t.recompute(RecomputePolicy::Selective, [4.0, 0.0, 0.0]), 1.5);
        assert_eq!(t.recompute(RecomputePolicy::Full, [4.0, 0.0, 0.0]), 3.0);
    }

    /// A GEMM's time: its FLOPs at the format's achieved rate times the size factor
    /// call/(call + half), or its bytes at HBM if slower; a GEMM of no FLOPs moves bytes
    /// only, one in a format the chip lacks runs at BF16's rate; attention's backward
    /// does 2.5 times the forward's matrix work at its relative efficiency and twice its
    /// bytes; a scan's twice.
    #[test]
    fn roofline_by_hand() {
        let gpu = Profiles::builtin().get("h100").unwrap().clone();
        let r = Rates::new(&gpu);
        let e = &gpu.efficiency;
        let rate = gpu.peak_tflops.bf16 * 1e12 * e.gemm.bf16;
        let half = e.gemm_half_gflop * 1e9;
        let hbm = gpu.hbm_gbs * 1e9 * e.memory;
        let (f, call) = (1e12, 2.5e11);
        let want = f / (rate * call / (call + half));
        assert!((r.gemm(f, call, 1.0, GemmFormat::Bf16) / want - 1.0).abs() < 1e-12);
        assert!((r.gemm(f, call, 1e12, GemmFormat::Bf16) / (1e12 / hbm) - 1.0).abs() < 1e-12);
        assert!((r.gemm(0.0, 0.0, 1e6, GemmFormat::Bf16) / (1e6 / hbm) - 1.0).abs() < 1e-12);
        // H100 has no NVFP4: such a GEMM is timed at the BF16 rate.
        assert_eq!(r.gemm(f, call, 1.0, GemmFormat::Nvfp4), r.gemm(f, call, 1.0, GemmFormat::Bf16));
        let att = gpu.peak_tflops.bf16 * 1e12 * e.attention;
        let size = f / (f + half);
        assert!((r.attention_backward(f, 1.0) / (2.5 * f / (att * e.attention_backward * size)) - 1.0).abs() < 1e-12);
        assert!((r.attention_backward(1.0, 1e12) / (2e12 / hbm) - 1.0).abs() < 1e-12);
        let ssm = gpu.peak_tflops.bf16 * 1e12 * e.ssm;
        assert!((r.scan_forward(f, 1.0) / (f / (ssm * size)) - 1.0).abs() < 1e-12);
        assert!((r.scan_backward(f, 1.0) / (2.0 * f / (ssm * e.attention_backward * size)) - 1.0).abs() < 1e-12);
        assert!((r.scan_backward(1.0, 1e12) / (2e12 / hbm) - 1.0).abs() < 1e-12);
    }

    fn one_gemm(dgrad: bool, wgrad: bool) -> Part {
        let gemm = Gemm { name: "g".into(), flops: 0.0, call_flops: 0.0, bytes: 0.0, x: 1000.0, w: 2000.0, y: 3000.0, module: None, dgrad, wgrad, ns_flops: 0.0, expert: false };
        Part { gemms: vec![gemm], ..Part::default() }
    }

    fn plan(sites: &[(&str, GemmFormat, GemmFormat, GemmFormat)]) -> Plan {
        let g = runner_graph::Graph::new(
            vec![runner_graph::Tensor { name: "l".into(), shape: vec![], dtype: runner_graph::DType::F32, kind: TensorKind::Activation }],
            vec![],
            "l",
        )
        .unwrap();
        let answers = sites.iter().flat_map(|&(n, f, i, w)| {
            [(n.to_string(), GemmRole::Forward, f), (n.to_string(), GemmRole::InputGradient, i), (n.to_string(), GemmRole::WeightGradient, w)]
        });
        Plan::from_sites(crate::precision::Recipe::Fp8, "test", &g, answers)
    }

    /// Each role's format decides its casts (a GEMM of no FLOPs and no bytes, so the
    /// casts are all its time; FP8's cast moves 4 bytes an element): a low weight
    /// gradient casts the input in the forward (x, 1000) and the output gradient in the
    /// backward (y, 3000) but not the weight; a low input gradient casts the output
    /// gradient and the weight (w, 2000, once per step, resident).
    #[test]
    fn each_roles_format_decides_its_casts() {
        use GemmFormat::{Bf16, Fp8};
        let rates = Rates::new(Profiles::builtin().get("h100").unwrap());
        let t = Template { key: key(1, 1, 1, 1), pre: Part::default(), layers: vec![], post: Part::default(), stage_message_bytes: 0.0 };
        let time = |part: &Part, p: &Plan| t.time_part(part, &[], p, &rates, &Measured::default(), Kernels::default());
        let hbm = rates.hbm;
        let trained = one_gemm(true, true);
        let w = time(&trained, &plan(&[("g", Bf16, Bf16, Fp8)]));
        assert_eq!((w.fwd, w.bwd, w.weight_cast, w.low_precision_weights), (1000.0 * 4.0 / hbm, 3000.0 * 4.0 / hbm, 0.0, 0.0));
        let i = time(&trained, &plan(&[("g", Bf16, Fp8, Bf16)]));
        assert_eq!((i.fwd, i.bwd, i.weight_cast, i.low_precision_weights), (0.0, 3000.0 * 4.0 / hbm, 2000.0 * 4.0 / hbm, 2000.0));
        assert_eq!(i.low_precision_trained, [2000.0, 0.0]);
        let none = time(&trained, &plan(&[]));
        assert_eq!((none.fwd, none.bwd, none.weight_cast), (0.0, 0.0, 0.0));
        // A frozen weight under a low weight gradient: no weight gradient runs, no casts
        // for it.
        let frozen = time(&one_gemm(true, false), &plan(&[("g", Bf16, Bf16, Fp8)]));
        assert_eq!((frozen.fwd, frozen.bwd), (0.0, 0.0));
    }

    /// A tensor kept only by GEMMs whose weight gradients are all low precision is
    /// stored as their cast copy (FP8: 1 byte an element); kept by one such GEMM and one
    /// in BF16 (or by another op as well), as it is and cast; by none, as it is.
    #[test]
    fn a_kept_tensor_is_stored_cast_where_only_low_precision_gemms_keep_it() {
        use GemmFormat::Fp8;
        let mut part = one_gemm(true, true);
        part.gemms.push(Gemm { name: "h".into(), ..part.gemms[0].clone() });
        let kept = KeptTensor { elements: 100.0, bytes: 200.0, gemms: vec![0, 1], other: false, module: Some(Module::Mlp) };
        part.kept = vec![kept.clone()];
        let stored = |part: &Part, p: &Plan| Template::stored(part, &[], p);
        let both = plan(&[("g", Fp8, Fp8, Fp8), ("h", Fp8, Fp8, Fp8)]);
        assert_eq!(stored(&part, &both).none, 100.0);
        assert_eq!(stored(&part, &both).freed[Module::Mlp.index()], 100.0);
        assert_eq!(stored(&part, &plan(&[("g", Fp8, Fp8, Fp8)])).none, 300.0);
        assert_eq!(stored(&part, &plan(&[])).none, 200.0);
        part.kept = vec![KeptTensor { other: true, ..kept }];
        assert_eq!(stored(&part, &both).none, 300.0);
    }

    /// Each group's collectives land in its own share: tp's, cp's, and the experts' (ep
    /// and etp together), forward and backward.
    #[test]
    fn collectives_land_in_their_groups_share() {
        let rates = Rates::new(Profiles::builtin().get("h100").unwrap());
        let t = Template { key: key(2, 2, 2, 2), pre: Part::default(), layers: vec![], post: Part::default(), stage_message_bytes: 0.0 };
        for (group, at) in [(Group::Tp, 0), (Group::Cp, 1), (Group::Ep, 2), (Group::Etp, 2)] {
            let comm = Comm { group, kind: OpKind::AllReduce, bytes: 1e6, backward: Some(OpKind::AllReduce), routing: None };
            let part = Part { comm: vec![comm], ..Part::default() };
            let pt = t.time_part(&part, &[], &plan(&[]), &rates, &Measured::default(), Kernels::default());
            for i in 0..3 {
                assert_eq!(pt.comm_fwd[i] > 0.0, i == at, "{group:?}");
                assert_eq!(pt.comm_bwd[i] > 0.0, i == at, "{group:?}");
            }
        }
    }

    /// Each selective-recompute module's forward time is that of its ops: a GEMM of the
    /// MLP, the attention core, a norm (what recomputing each repeats).
    #[test]
    fn module_forward_times() {
        let rates = Rates::new(Profiles::builtin().get("h100").unwrap());
        let t = Template { key: key(1, 1, 1, 1), pre: Part::default(), layers: vec![], post: Part::default(), stage_message_bytes: 0.0 };
        let mut part = one_gemm(true, true);
        (part.gemms[0].flops, part.gemms[0].call_flops, part.gemms[0].module) = (1e9, 1e9, Some(Module::Mlp));
        part.attention = vec![Core { name: "a".into(), flops: 1e9, bytes: 0.0, spill: [0.0; 2], backward: true }];
        part.vector = vec![Vector { name: "n".into(), bytes: 1e6, module: Some(Module::Layernorm), backward: true }];
        let pt = t.time_part(&part, &[], &plan(&[]), &rates, &Measured::default(), Kernels::default());
        let (gemm, attn, norm) = (rates.gemm(1e9, 1e9, 0.0, GemmFormat::Bf16), rates.attention_forward(1e9, 0.0), 1e6 / rates.hbm);
        assert!(gemm > 0.0 && attn > 0.0);
        assert_eq!(pt.module_fwd[Module::Mlp.index()], gemm);
        assert_eq!(pt.module_fwd[Module::CoreAttn.index()], attn);
        assert_eq!(pt.attention_fwd, attn);
        assert_eq!(pt.module_fwd[Module::Layernorm.index()], norm);
        assert!((pt.fwd - (gemm + attn + norm)).abs() < 1e-15);
    }
}
