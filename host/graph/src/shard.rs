//! Sharding: one rank's forward graph for a parallel layout, with every collective the
//! layout implies inserted as an operation, so the executor runs and the projection model
//! costs the very same per-rank graph.
//!
//! The pass reads the parallel role each plugin op carries and applies Megatron-LM's
//! decomposition (Shoeybi et al. 2019, arXiv 1909.08053; Narayanan et al. SC'21,
//! arXiv 2104.04473; Korthikanti et al. 2022, arXiv 2205.05198):
//! - TP: column-parallel linears split N, row-parallel linears split K and their partial
//!   sums are all-reduced (or, with sequence parallelism, reduce-scattered onto a sequence
//!   shard and all-gathered again before the next column-parallel block); attention keeps
//!   heads/tp (KV heads are replicated when tp is a multiple of them); embedding, lm-head
//!   and cross-entropy are vocab-parallel (the loss all-reduces its per-row max, sum-exp
//!   and target logit, (B,T) each, as `row-stats` ops).
//! - PP: the rank keeps its stage's layers (vp chunks of them when interleaved); stage 0
//!   owns the embedding, the last stage the final norm, head, loss and MTP modules;
//!   stage boundaries are `send`/`recv` of the (B,T,C) residual stream.
//! - CP: tokens split by cp in Megatron's load-balanced way (2·cp chunks; rank r holds
//!   chunks r and 2cp−1−r, the `cp`/`cp-rank` attributes on rotary and attention say
//!   which); attention all-gathers K and V over the cp group.
//! - EP: routed experts split by ep with an all-to-all before and after the grouped
//!   linears (ETP splits each expert's width and all-reduces its output). Rank j of the
//!   `ep` group holds experts j·E/ep..(j+1)·E/ep. The tensors between the two all-to-alls
//!   are declared at their balanced-routing size (each rank receives as many rows as it
//!   sends), which is what `runner_project::comm::comm_volume` and the counters price; how many rows a rank
//!   really receives depends on the routing, and an executor follows the actual counts.
//! - DP/FSDP: gradient reduction happens once per step, outside the forward graph, so it
//!   is returned as [`StepCollective`]s next to the graph, each listing the weights it
//!   covers; so are the tied-embedding sync between the first and last stage, the tp sum
//!   of replicated weights read on tp-split data (norm gains on a sequence shard or on
//!   heads), and, when tp exceeds the kv heads, the `tp-kv` sum of the kv projections'
//!   gradients over the ranks sharing each kv head.
//!
//! Key items: [`Layout`] (with [`Layout::validate`]), [`RankCoord`], [`shard`] →
//! [`Sharded`]. What the collectives cost (`comm_volume`, bus factors, time per tier)
//! is the projection's job (`runner_project::comm`); this module only rewrites graphs.
//!
//! Shape notation: B micro-batch, T sequence, C hidden, H/Hkv heads, D head dim, V
//! vocabulary, E experts, k top-k, N = B·T tokens.
//!
//! Collective ops carry attrs `group` (text: tp, cp, ep, etp, pp), `group-size` (int) and
//! `tensor` (text: the logical tensor moved); all-gather and reduce-scatter add `axis`.
//! Vocabularies tp does not divide are padded up to the next multiple of tp (the padded
//! rows are extra parameters on the last ranks, as Megatron's padding is).

// Maps keyed by tensor ids (indices this crate assigns) hash with FxHash; names and
// layer numbers, which a plugin chooses, keep std's keyed SipHash (no crafted collisions).
use std::collections::{BTreeMap, BTreeSet, HashMap};

use rustc_hash::{FxHashMap, FxHashSet};

use serde::Serialize;

use crate::ir::{Attr, DType, Graph, GraphError, Op, OpKind, Role, Tensor, TensorId, TensorKind};
pub use crate::pipeline::PipelineSplit;

/// A parallel layout: degrees, schedule and batch. GPUs = tp·pp·cp·dp; ep and etp carve
/// the expert layers out of the tp·cp·dp ranks of one stage (Megatron's MoE folding).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Layout {
    pub tp: u32,
    pub pp: u32,
    pub cp: u32,
    pub ep: u32,
    pub etp: u32,
    pub dp: u32,
    /// Virtual pipeline chunks per stage (interleaved 1F1B); 1 = not interleaved.
    pub vp: u32,
    pub sequence_parallel: bool,
    /// Shard parameters, gradients and optimizer state over the data-parallel ranks.
    pub fsdp: bool,
    /// Sequences per micro-batch (the graph's B).
    pub micro_batch: u32,
    /// Sequences per optimizer step over all data-parallel ranks.
    pub global_batch: u32,
    /// How the layers split over the pp·vp chunks.
    pub split: PipelineSplit,
}

/// Which rank of each parallel group: the graph depends on the pipeline stage (which
/// layers) and, for padded vocabularies and causal CP, on the tp and cp ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RankCoord {
    pub tp: u32,
    pub pp: u32,
    pub cp: u32,
    pub dp: u32,
}

/// A collective that runs once per step (or per micro-batch, see `count`) outside the
/// forward graph: gradient reduction, FSDP parameter gathers, tied-embedding sync
/// (Megatron's `finalize_model_grads`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepCollective {
    pub kind: OpKind,
    /// `dp` (the dp·cp ranks that hold the same dense weights; gradients averaged),
    /// `edp` (expert data parallel; averaged), `pp-embed` (first and last stage, tied
    /// embeddings; summed), `tp` (replicated weights read in the sequence-parallel region,
    /// whose per-rank gradients are partial sums over the rank's tokens; summed).
    pub group: String,
    pub group_size: u32,
    /// The nccl-tests size S of one call (as `runner_project::comm::CommOp::bytes` sizes it).
    pub bytes: f64,
    /// Calls per step.
    pub count: u32,
    /// The reduced gradients are divided by this (1: summed): the number of times the
    /// sum counts each token's gradient, so that the result is the mean over the step's
    /// data-parallel batch (each rank's loss is a mean over its own tokens). `dp`: dp·cp.
    /// `edp`: dp·cp with sequence parallelism (each tp rank's tokens are distinct),
    /// tp·cp·dp/etp without (the tp ranks' tokens are copies, each routed to the experts);
    /// Megatron's expert gradient scaling by 1/dp·cp. An `edp` entry of group size 1 moves
    /// nothing and only divides (expert parallelism over all the data-parallel ranks); it
    /// is an all-reduce with FSDP too (a group of one has nothing to shard).
    pub mean_over: u32,
    pub what: String,
    /// The weights of this rank it covers, by name in the rank's graph, sorted (every
    /// rank of the group lists them in the same order).
    pub weights: Vec<String>,
}

/// Megatron's gradient bucket for a data-parallel group of `ranks`: max(40M, 1M·ranks)
/// elements (Megatron-LM `DistributedDataParallelConfig.bucket_size`'s default; larger
/// groups get larger buckets so their collectives do not turn latency-bound). The
/// projection prices the last bucket's reduction as exposed; the executor cuts its
/// overlapped reduction into buckets of this size unless told otherwise.
pub fn ddp_bucket_elems(ranks: u32) -> u64 {
    40_000_000u64.max(1_000_000 * u64::from(ranks))
}

/// One rank's graph and its step-level collectives.
#[derive(Clone, Debug)]
pub struct Sharded {
    pub graph: Graph,
    pub step: Vec<StepCollective>,
    /// The weights this rank holds a part of, by name: where that part lies in the
    /// unsharded weight (so a rank can start from its part of the unsharded model's
    /// initialisation, as Megatron slices a master weight).
    pub splits: BTreeMap<String, WeightSplit>,
}

/// A rank's part of a weight: the unsharded shape, and each split axis with the group
/// whose ranks divide it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightSplit {
    pub full: Vec<u64>,
    pub axes: Vec<SplitAxis>,
}

/// One split axis of a [`WeightSplit`]. Along it the rank holds part `rank` of its
/// group's ranks when `per_rank` (a vocabulary: each rank its `⌈full / size⌉` rows,
/// the last ones past the unsharded extent when the vocabulary was padded to the group),
/// else part `rank / (size / parts)` of `parts = full / local` (consecutive ranks share
/// a part when the group is larger: kv heads replicated over tp).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitAxis {
    pub axis: usize,
    /// `tp`, or `ep` and `etp` for expert weights.
    pub group: &'static str,
    pub per_rank: bool,
}

// ------------------------------------------------------------------------------------
// What the layout rules need to know about a graph
// ------------------------------------------------------------------------------------

/// Model facts read off a logical graph.
#[derive(Default)]
struct Facts {
    b: u64,
    t: u64,
    /// (query heads, kv heads) of each distinct attention shape.
    heads: BTreeSet<(u64, u64)>,
    /// Column-parallel output widths that are not per-head (MLP widths) → an op name.
    widths: BTreeMap<u64, String>,
    vocab: Option<u64>,
    /// Transformer layers in execution order (MTP layers run with the head).
    layers: Vec<i32>,
    experts: Option<u64>,
    /// Expert widths (the N of column-like grouped linears).
    expert_widths: BTreeSet<u64>,
    /// (heads, groups) of each distinct Mamba scan shape.
    ssm: BTreeSet<(u64, u64)>,
}

fn facts(g: &Graph) -> Facts {
    facts_and_places(g).0
}

/// [`facts`] and each op's [`Place`] (the first half of [`partition`], which reads the
/// layers).
fn facts_and_places(g: &Graph) -> (Facts, Vec<Place>) {
    let mut f = Facts::default();
    let shape = |id: TensorId| g.tensors.get(id).map_or(&[][..], |t| t.shape.as_slice());
    for op in &g.ops {
        match op.kind {
            OpKind::Embedding if f.b == 0 => {
                if let [b, t] = *shape(op.inputs.first().copied().unwrap_or(usize::MAX)) {
                    (f.b, f.t) = (b, t);
                }
                if op.role == Role::VocabParallel {
                    f.vocab = op.inputs.get(1).and_then(|&w| shape(w).first().copied());
                }
            }
            OpKind::Attention => {
                let (q, k) = (shape(op.inputs[0]), shape(op.inputs.get(1).copied().unwrap_or(usize::MAX)));
                if q.len() == 4 && k.len() == 4 {
                    f.heads.insert((q[2], k[2]));
                }
            }
            OpKind::Linear if op.role == Role::ColumnParallel => {
                let out = shape(op.outputs.first().copied().unwrap_or(usize::MAX));
                let n = op.inputs.get(1).and_then(|&w| shape(w).first().copied()).unwrap_or(0);
                if out.len() != 4 && n > 0 {
                    f.widths.entry(n).or_insert_with(|| op.name.clone());
                }
            }
            OpKind::Linear if op.role == Role::VocabParallel => {
                f.vocab = f.vocab.or_else(|| op.inputs.get(1).and_then(|&w| shape(w).first().copied()));
            }
            OpKind::GroupedLinear => {
                if let [e, n, _] = *shape(op.inputs.get(1).copied().unwrap_or(usize::MAX)) {
                    f.experts = Some(e);
                    f.expert_widths.insert(n);
                }
            }
            OpKind::SsmScan => {
                let (x, b) = (shape(op.inputs[0]), shape(op.inputs.get(2).copied().unwrap_or(usize::MAX)));
                if x.len() == 4 && b.len() == 4 {
                    f.ssm.insert((x[2], b[2]));
                }
            }
            _ => {}
        }
    }
    let (places, layers) = partition(g);
    f.layers = layers;
    (f, places)
}

/// Where each op runs: `Pre` (embedding: first chunk), a transformer layer, or `Post`
/// (final norm, head, loss and any MTP layers after them: last chunk).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Place {
    Pre,
    Layer(i32),
    Post,
}

/// Each op's [`Place`], and the main transformer layers in execution order (the layers
/// pipeline stages split; MTP layers come after the head and are `Post`). The pipeline
/// split and the projection's depth analysis share this one rule.
pub fn partition(g: &Graph) -> (Vec<Place>, Vec<i32>) {
    let mut places = Vec::with_capacity(g.ops.len());
    let mut layers = Vec::new();
    // Layers met so far: a plugin numbers layers as it likes (a million ops each in its
    // own layer took a scan of the list per op, 5·10^11 comparisons: a hang).
    let mut listed: FxHashSet<i32> = FxHashSet::default();
    let mut seen_layer = false;
    let mut post = false;
    for op in &g.ops {
        let p = if post {
            Place::Post
        } else if op.layer < 0 {
            if seen_layer {
                post = true;
                Place::Post
            } else {
                Place::Pre
            }
        } else {
            seen_layer = true;
            if listed.insert(op.layer) {
                layers.push(op.layer);
            }
            Place::Layer(op.layer)
        };
        places.push(p);
    }
    (places, layers)
}

/// Every divisor of `n`, in order (none for 0). Pairs (d, n/d) up to √n: a degree or a
/// GPU count of four billion takes 65,536 steps, not four billion.
pub fn divisors(n: u64) -> Vec<u64> {
    divisor_pairs(n, u64::MAX)
}

/// The divisors of `n` that pair (d, n/d) with d ≤ `up_to` (every one, where `up_to` ≥ √n),
/// in order.
fn divisor_pairs(n: u64, up_to: u64) -> Vec<u64> {
    let mut low = Vec::new();
    let mut high = Vec::new();
    let mut d = 1u64;
    while d <= up_to && d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            low.push(d);
            if d != n / d {
                high.push(n / d);
            }
        }
        d += 1;
    }
    low.extend(high.into_iter().rev());
    low
}

/// Divisors of `n` up to `max`, as a "try" list: the pairs (d, n/d) of [`divisors`], but
/// for d up to 2^20 only (every divisor below n = 2^40). The list is a hint; a graph's
/// hostile 2^61 − 1 heads took √n = 1.5·10^9 steps, seconds before the refusal.
fn try_list(n: u64, max: u64) -> String {
    divisor_pairs(n, 1 << 20).into_iter().filter(|&d| d <= max).map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
}

impl Layout {
    /// Every degree 1, no SP/FSDP: one GPU.
    pub fn single(micro_batch: u32, global_batch: u32) -> Layout {
        Layout {
            tp: 1,
            pp: 1,
            cp: 1,
            ep: 1,
            etp: 1,
            dp: 1,
            vp: 1,
            sequence_parallel: false,
            fsdp: false,
            micro_batch,
            global_batch,
            split: PipelineSplit::default(),
        }
    }

    /// tp·pp·cp·dp.
    pub fn gpus(&self) -> u32 {
        self.tp.saturating_mul(self.pp).saturating_mul(self.cp).saturating_mul(self.dp)
    }

    /// Micro-batches per data-parallel rank per step: m = global / (micro·dp).
    pub fn micro_batches(&self) -> u32 {
        self.global_batch / self.micro_batch.saturating_mul(self.dp).max(1)
    }

    /// Vocabulary rows per tp rank (padded up when tp does not divide V).
    pub fn vocab_per_rank(&self, vocab: u64) -> u64 {
        vocab.div_ceil(u64::from(self.tp.max(1)))
    }

    /// Sequence parallelism in effect (it changes nothing at tp = 1).
    fn sp(&self) -> bool {
        self.sequence_parallel && self.tp > 1
    }

    /// Check the layout against graph `g` and a run of `gpus` GPUs.
    ///
    /// # Errors
    /// Every broken rule, joined with "; ", each naming the rule and a fix: degrees of
    /// zero, tp·pp·cp·dp ≠ GPUs, tp not dividing heads, KV heads (unless tp is a multiple
    /// of them: KV heads are then replicated), MLP or expert widths; more pipeline chunks
    /// than layers, vp without pp, an interleaved schedule whose micro-batch count is not a
    /// multiple of pp; a sequence cp·2 (or, with SP, cp·tp) does not divide; ep not
    /// dividing the experts or ep·etp not dividing tp·cp·dp; expert parallelism without
    /// experts; a micro-batch different from the graph's; a global batch that is not a
    /// multiple of micro-batch·dp. A vocabulary tp does not divide is padded, not refused.
    pub fn validate(&self, g: &Graph, gpus: u32) -> Result<(), String> {
        self.check(&facts(g), gpus)
    }

    /// [`Layout::validate`] on the facts of the graph, already read (the pass reads them
    /// once for the check and its own work).
    fn check(&self, f: &Facts, gpus: u32) -> Result<(), String> {
        let mut err: Vec<String> = Vec::new();
        let degrees = [
            ("tp", self.tp),
            ("pp", self.pp),
            ("cp", self.cp),
            ("ep", self.ep),
            ("etp", self.etp),
            ("dp", self.dp),
            ("vp", self.vp),
            ("micro_batch", self.micro_batch),
            ("global_batch", self.global_batch),
        ];
        let zero: Vec<&str> = degrees.iter().filter(|(_, v)| *v == 0).map(|(n, _)| *n).collect();
        if !zero.is_empty() {
            return Err(format!("{} must be at least 1", zero.join(", ")));
        }
        let (tp, pp, cp, dp) = (u64::from(self.tp), u64::from(self.pp), u64::from(self.cp), u64::from(self.dp));
        // In u128: four u32 degrees multiply to under 2^128, where their u64 product
        // overflowed (a panic; without overflow checks a wrap, and tp·pp·cp = 2^93 wrapped to a
        // zero divisor, a panic all the same).
        let tpc = u128::from(tp) * u128::from(pp) * u128::from(cp);
        let prod = tpc * u128::from(dp);
        if prod != u128::from(gpus) {
            let fix = if gpus > 0 && u128::from(gpus) % tpc == 0 {
                format!("set dp = {}", u128::from(gpus) / tpc)
            } else {
                format!("choose tp·pp·cp dividing {gpus}")
            };
            err.push(format!(
                "tp·pp·cp·dp = {}·{}·{}·{} = {prod} but the run has {gpus} GPUs; {fix}",
                self.tp, self.pp, self.cp, self.dp
            ));
        }
        let near = tp.max(8);
        for &(h, hkv) in &f.heads {
            if h % tp != 0 {
                err.push(format!("tp={tp} does not divide {h} heads; try {}", try_list(h, near)));
            } else if hkv % tp != 0 && tp % hkv != 0 {
                err.push(format!(
                    "tp={tp} neither divides the {hkv} kv heads nor is a multiple of them (kv heads are replicated only \
                     when tp is); try {}",
                    try_list(h, near).split(", ").filter(|d| {
                        let d: u64 = d.parse().unwrap_or(1);
                        hkv.is_multiple_of(d) || d.is_multiple_of(hkv)
                    }).collect::<Vec<_>>().join(", ")
                ));
            }
        }
        for &(h, groups) in &f.ssm {
            if groups % tp != 0 {
                err.push(format!(
                    "tp={tp} does not divide the {groups} groups of a Mamba mixer ({h} heads; Megatron splits whole groups); try {}",
                    try_list(groups, near)
                ));
            }
        }
        if !f.ssm.is_empty() && self.cp > 1 {
            err.push(format!("cp={cp}: context parallelism over Mamba mixers is not supported (the scan runs along the whole sequence); set cp = 1"));
        }
        for (n, op) in &f.widths {
            if n % tp != 0 {
                err.push(format!(
                    "tp={tp} does not divide the {n}-wide '{op}' (MLP width); try {}",
                    try_list(*n, near)
                ));
            }
        }
        let chunks = pp * u64::from(self.vp);
        let layers = f.layers.len() as u64;
        if self.vp > 1 && self.pp == 1 {
            err.push(format!("vp={} needs pp > 1 (virtual stages interleave pipeline stages); set vp = 1", self.vp));
        }
        if let Err(e) = self.split.starts(layers as usize, chunks as usize) {
            err.push(e);
        }
        let m = self.micro_batches();
        if self.vp > 1 && self.pp > 1 && !m.is_multiple_of(self.pp) {
            err.push(format!(
                "the interleaved schedule (vp={}) needs the micro-batches per step (m = {m}) to be a multiple of pp={}; \
                 make the global batch a multiple of micro_batch·dp·pp = {}",
                self.vp,
                self.pp,
                u64::from(self.micro_batch) * dp * pp
            ));
        }
        if f.t > 0 {
            if self.cp > 1 && !f.t.is_multiple_of(2 * cp) {
                err.push(format!(
                    "cp={cp}: sequence {} must split into 2·cp = {} equal chunks (load-balanced causal CP); try cp = {}",
                    f.t,
                    2 * cp,
                    (1..=8u64).filter(|c| f.t.is_multiple_of(2 * c) || *c == 1).map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
                ));
            } else if self.sp() && !(f.t / cp).is_multiple_of(tp) {
                err.push(format!(
                    "sequence parallelism splits the {} tokens of each cp rank over tp={tp}, which does not divide them; \
                     choose tp dividing {} or turn sequence parallelism off",
                    f.t / cp,
                    f.t / cp
                ));
            }
        }
        if f.b > 0 && f.b != u64::from(self.micro_batch) {
            err.push(format!(
                "the graph was built for micro-batch {} but the layout's micro_batch is {}; rebuild the graph with \
                 micro-batch {}",
                f.b, self.micro_batch, self.micro_batch
            ));
        }
        let per = u64::from(self.micro_batch) * dp;
        if u64::from(self.global_batch) % per != 0 {
            let gb = u64::from(self.global_batch);
            let lo = gb / per * per;
            err.push(format!(
                "global batch {gb} is not a multiple of micro_batch·dp = {per}; try {}{}",
                if lo > 0 { format!("{lo} or ") } else { String::new() },
                lo + per
            ));
        }
        let (ep, etp) = (u64::from(self.ep), u64::from(self.etp));
        match f.experts {
            None if ep > 1 || etp > 1 => {
                err.push(format!("ep={ep}, etp={etp} but the graph has no routed experts; set ep = etp = 1"));
            }
            None => {}
            Some(e) => {
                if e % ep != 0 {
                    err.push(format!("ep={ep} does not divide {e} experts; try {}", try_list(e, e)));
                }
                // In u128 as `prod` (tp·cp·dp of u32 degrees overflowed u64).
                let stage = u128::from(tp) * u128::from(cp) * u128::from(dp);
                if stage % u128::from(ep * etp) != 0 {
                    let among = u64::try_from(stage).map_or_else(|_| "the divisors of a GPU count".into(), |s| try_list(s, s));
                    err.push(format!(
                        "ep·etp = {} does not divide tp·cp·dp = {stage} (experts spread over the ranks of one pipeline \
                         stage); choose ep·etp among {among}",
                        ep * etp,
                    ));
                }
                for w in &f.expert_widths {
                    if w % etp != 0 {
                        err.push(format!("etp={etp} does not divide the expert width {w}; try {}", try_list(*w, near)));
                    }
                }
                if let Err(why) = expert_tensor_parallel_tokens(tp, etp, self.sp()) {
                    err.push(why);
                }
            }
        }
        if err.is_empty() { Ok(()) } else { Err(err.join("; ")) }
    }
}

/// Expert tensor parallelism as the sharded graph runs it: each etp rank applies its
/// share of every expert's width to the same rows, which needs the etp ranks to see the
/// same tokens. The etp group is consecutive ranks of one tp group (etp divides tp).
/// Without sequence parallelism they hold copies, and the partial outputs are summed
/// with an etp all-reduce. With it each tp rank holds its own sequence shard, and the
/// rows each rank has for its experts are all-gathered over etp before the experts and
/// the outputs reduce-scattered after (Megatron's alltoall dispatcher). An etp group
/// across tp groups would hold other sequences' tokens, which the pass's token splits
/// do not have, and is refused (an earlier graph without the gather let each rank do
/// 1/etp of its experts' work, and a projection was etp times too fast). One rule for
/// the layout check and the executor.
///
/// # Errors
/// The layout, with the fix.
pub fn expert_tensor_parallel_tokens(tp: u64, etp: u64, sequence_parallel: bool) -> Result<(), String> {
    if etp <= 1 || tp.is_multiple_of(etp) {
        return Ok(());
    }
    let why = if sequence_parallel {
        "the sharded graph gathers the etp ranks' sequence shards, which lie in one tp group"
    } else {
        "its ranks must hold the same tokens, copies within one tp group"
    };
    Err(format!(
        "etp={etp} does not divide tp={tp}: {why}; an etp group across tp groups (Megatron's MoE parallel \
         folding) is not modelled: use etp = 1 or a divisor of {tp}{}",
        if sequence_parallel { " (with sequence parallelism on)" } else { "" }
    ))
}

// ------------------------------------------------------------------------------------
// The pass
// ------------------------------------------------------------------------------------

/// Token split of an activation: `Full` holds the cp rank's T/cp tokens, `Seq` the
/// sequence-parallel shard T/(cp·tp), `Experts` the sequence-parallel shards of an etp
/// group, gathered before the experts: T·etp/(cp·tp) (the cp rank's tokens at etp = tp).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Tok {
    Full,
    Seq,
    Experts,
}

/// The local version of a logical tensor: its id in the sharded graph, token split and
/// feature divisor (1: whole feature axis; else split over tp, or etp for expert tensors).
#[derive(Clone, Copy, Debug)]
struct Local {
    id: TensorId,
    tok: Tok,
    split: u64,
}

/// Sharding state for one rank.
struct Pass<'a> {
    g: &'a Graph,
    l: &'a Layout,
    rank: RankCoord,
    b: u64,
    t: u64,
    tensors: Vec<Tensor>,
    /// The local tensors' names, as what makes names unique as they are made. Ops refer
    /// to tensors by id from the start, so the graph is not resolved again by name (a
    /// copy and a hash of every name, per sharding).
    names: Names,
    /// The first weight whose name an earlier local tensor already had (weights keep
    /// their logical names): the graph [`Graph::new`] would have refused.
    duplicate: Option<String>,
    ops: Vec<Op>,
    /// Logical activation or input → its current local version.
    local: FxHashMap<TensorId, Local>,
    /// Logical weight → local shape (a weight read twice must shard the same way).
    weights: FxHashMap<TensorId, Vec<u64>>,
    /// Logical weight → its local tensor.
    weight_ids: FxHashMap<TensorId, TensorId>,
    /// Gathered versions already made: (logical id, "tokens" | "features" | "cp").
    gathered: FxHashMap<(TensorId, &'static str), Local>,
}

/// The names of a rank's tensors, held as their keyed (SipHash) hashes with the first
/// tensor of each: asking whether a name is taken hashes it once and compares it with
/// the tensors it may be, where a map of names held a copy of every name.
struct Names {
    keys: std::collections::hash_map::RandomState,
    /// Hash → the first tensor of that hash; `more` holds the others (a second tensor of
    /// one hash is a 64-bit collision of distinct names, or a repeated weight name).
    first: FxHashMap<u64, TensorId>,
    more: Vec<(u64, TensorId)>,
}

impl Names {
    fn with_capacity(n: usize) -> Names {
        Names { keys: Default::default(), first: FxHashMap::with_capacity_and_hasher(n, Default::default()), more: Vec::new() }
    }

    fn hash(&self, name: &str) -> u64 {
        use std::hash::BuildHasher;
        self.keys.hash_one(name)
    }

    /// Whether a tensor of `tensors` named `name` is listed.
    fn contains(&self, tensors: &[Tensor], name: &str) -> bool {
        let h = self.hash(name);
        let Some(&id) = self.first.get(&h) else { return false };
        tensors[id].name == name || self.more.iter().any(|&(k, j)| k == h && tensors[j].name == name)
    }

    fn insert(&mut self, name: &str, id: TensorId) {
        let h = self.hash(name);
        match self.first.entry(h) {
            std::collections::hash_map::Entry::Occupied(_) => self.more.push((h, id)),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(id);
            }
        }
    }
}

fn attr_text(s: &str) -> Attr {
    Attr::Text(s.to_string())
}

/// Errors of the pass name the op or tensor at fault.
type R<T> = Result<T, String>;

impl<'a> Pass<'a> {
    fn tp(&self) -> u64 {
        u64::from(self.l.tp)
    }

    fn tok_div(&self, tok: Tok) -> u64 {
        u64::from(self.l.cp)
            * match tok {
                Tok::Full => 1,
                Tok::Seq => self.tp(),
                Tok::Experts => self.tp() / u64::from(self.l.etp).max(1),
            }
    }

    /// The token axis of a logical shape: 1 for (B,T,..), else 0 for (N,..) and (N·k,..).
    fn tok_axis(&self, shape: &[u64]) -> usize {
        if shape.len() >= 2 && shape[0] == self.b && shape[1] == self.t { 1 } else { 0 }
    }

    /// Local shape of logical `shape` under a token split and feature divisor. The feature
    /// axis is the head axis of rank-4 (B,T,H,D) tensors and the last axis otherwise; a
    /// head axis smaller than the divisor (kv heads under a larger tp) keeps one head.
    fn shape_of(&self, what: &str, shape: &[u64], tok: Tok, split: u64) -> R<Vec<u64>> {
        let mut s = shape.to_vec();
        if s.is_empty() {
            return Ok(s);
        }
        let div = self.tok_div(tok);
        let ax = self.tok_axis(shape);
        if !s[ax].is_multiple_of(div) {
            return Err(format!("'{what}' {shape:?}: token axis {ax} does not split by {div}"));
        }
        s[ax] /= div;
        if split > 1 {
            let fa = if s.len() == 4 { 2 } else { s.len() - 1 };
            if fa == ax {
                return Err(format!("'{what}' {shape:?}: no feature axis to split by {split}"));
            }
            s[fa] = if s[fa].is_multiple_of(split) {
                s[fa] / split
            } else if s.len() == 4 && split.is_multiple_of(s[fa]) {
                1
            } else {
                return Err(format!("'{what}' {shape:?}: axis {fa} does not split by {split}"));
            };
        }
        Ok(s)
    }

    /// The name of local tensor `id`.
    fn name(&self, id: TensorId) -> &str {
        &self.tensors[id].name
    }

    /// Add a local tensor named `base`, or `base.1`, `base.2`, ... if that is taken.
    fn add_tensor(&mut self, base: String, shape: Vec<u64>, dtype: DType, kind: TensorKind) -> TensorId {
        let name = if self.names.contains(&self.tensors, &base) {
            (1..).map(|i| format!("{base}.{i}")).find(|n| !self.names.contains(&self.tensors, n)).unwrap_or_default()
        } else {
            base
        };
        let id = self.tensors.len();
        self.names.insert(&name, id);
        self.tensors.push(Tensor { name, shape, dtype, kind });
        id
    }

    #[allow(clippy::too_many_arguments, reason = "an op record field by field")]
    fn emit(
        &mut self,
        name: String,
        kind: OpKind,
        inputs: Vec<TensorId>,
        outputs: Vec<TensorId>,
        attrs: BTreeMap<String, Attr>,
        layer: i32,
        role: Role,
    ) {
        self.ops.push(Op { name, kind, inputs, outputs, attrs, layer, role });
    }

    /// Insert collective `kind` over `group` of `n` ranks, reading `src` and writing a new
    /// tensor of `shape` named after it; returns the output. Group size 1 is never emitted.
    #[allow(clippy::too_many_arguments, reason = "a collective has exactly these choices")]
    fn collective(
        &mut self,
        kind: OpKind,
        group: &str,
        n: u64,
        src: TensorId,
        tag: &str,
        shape: Vec<u64>,
        dtype: DType,
        logical: &str,
        extra: &[(&str, Attr)],
        layer: i32,
    ) -> TensorId {
        let base = format!("{}.{tag}", self.name(src));
        let out = self.add_tensor(base, shape, dtype, TensorKind::Activation);
        let mut attrs: BTreeMap<String, Attr> = BTreeMap::new();
        attrs.insert("group".into(), attr_text(group));
        attrs.insert("group-size".into(), Attr::Int(n as i64));
        attrs.insert("tensor".into(), attr_text(logical));
        for (k, v) in extra {
            attrs.insert((*k).to_string(), v.clone());
        }
        self.emit(self.name(out).to_string(), kind, vec![src], vec![out], attrs, layer, Role::Replicated);
        out
    }

    fn logical(&self, id: TensorId) -> &'a Tensor {
        &self.g.tensors[id]
    }

    /// The local version of activation or input `id` (inputs are created on first use with
    /// token split `tok`).
    fn get(&mut self, id: TensorId, tok: Tok) -> R<Local> {
        if let Some(&l) = self.local.get(&id) {
            return Ok(l);
        }
        let t = self.logical(id);
        match t.kind {
            TensorKind::Input => {
                let shape = self.shape_of(&t.name, &t.shape, tok, 1)?;
                let l = Local { id: self.add_tensor(t.name.clone(), shape, t.dtype, TensorKind::Input), tok, split: 1 };
                self.local.insert(id, l);
                Ok(l)
            }
            _ => Err(format!("activation '{}' is read on this rank before it is produced", t.name)),
        }
    }

    /// The weight `id` at local shape `shape` (created on first use, under its logical
    /// name).
    fn weight(&mut self, id: TensorId, shape: Vec<u64>) -> R<TensorId> {
        let t = self.logical(id);
        if let Some(s) = self.weights.get(&id) {
            if *s != shape {
                return Err(format!("weight '{}' is read sharded both as {s:?} and {shape:?}", t.name));
            }
            return Ok(self.weight_ids[&id]);
        }
        self.weights.insert(id, shape.clone());
        let local = self.tensors.len();
        if self.names.contains(&self.tensors, &t.name) && self.duplicate.is_none() {
            self.duplicate = Some(t.name.clone());
        }
        self.names.insert(&t.name, local);
        self.tensors.push(Tensor { name: t.name.clone(), shape, dtype: t.dtype, kind: t.kind });
        self.weight_ids.insert(id, local);
        Ok(local)
    }

    /// `id` with all of this cp rank's tokens (all-gather over tp of the SP shard).
    fn full_tokens(&mut self, id: TensorId, l: Local, layer: i32) -> R<Local> {
        if l.tok == Tok::Full {
            return Ok(l);
        }
        if let Some(&g) = self.gathered.get(&(id, "tokens")) {
            return Ok(g);
        }
        let t = self.logical(id);
        let shape = self.shape_of(&t.name, &t.shape, Tok::Full, l.split)?;
        let ax = self.tok_axis(&t.shape) as i64;
        let name = self.collective(
            OpKind::AllGather,
            "tp",
            self.tp(),
            l.id,
            "ag_tp",
            shape,
            t.dtype,
            &t.name,
            &[("axis", Attr::Int(ax))],
            layer,
        );
        let g = Local { id: name, tok: Tok::Full, split: l.split };
        self.gathered.insert((id, "tokens"), g);
        Ok(g)
    }

    /// `id` with its whole feature axis: an all-gather over tp, or with sequence
    /// parallelism an all-to-all that trades the feature split for a sequence split (the
    /// consumer is then in the sequence-parallel region; Megatron gathers and drops).
    fn full_features(&mut self, id: TensorId, l: Local, layer: i32) -> R<Local> {
        if l.split == 1 {
            return Ok(l);
        }
        if let Some(&g) = self.gathered.get(&(id, "features")) {
            return Ok(g);
        }
        let t = self.logical(id);
        let (kind, tok, tag) = if self.l.sp() && l.tok == Tok::Full {
            (OpKind::AllToAll, Tok::Seq, "a2a_tp")
        } else {
            (OpKind::AllGather, l.tok, "agf_tp")
        };
        let shape = self.shape_of(&t.name, &t.shape, tok, 1)?;
        let ax = if t.shape.len() == 4 { 2 } else { t.shape.len().saturating_sub(1) } as i64;
        let name = self.collective(
            kind,
            "tp",
            l.split,
            l.id,
            tag,
            shape,
            t.dtype,
            &t.name,
            &[("axis", Attr::Int(ax))],
            layer,
        );
        let g = Local { id: name, tok, split: 1 };
        self.gathered.insert((id, "features"), g);
        Ok(g)
    }

    /// Reduce the partial sums of a tp-split contraction: reduce-scatter onto the
    /// sequence shard with SP, else all-reduce.
    fn reduce_tp(&mut self, id: TensorId, partial: TensorId, layer: i32) -> R<Local> {
        let t = self.logical(id);
        if self.tp() == 1 {
            return Ok(Local { id: partial, tok: Tok::Full, split: 1 });
        }
        if self.l.sp() {
            let shape = self.shape_of(&t.name, &t.shape, Tok::Seq, 1)?;
            let ax = self.tok_axis(&t.shape) as i64;
            let name = self.collective(
                OpKind::ReduceScatter,
                "tp",
                self.tp(),
                partial,
                "rs_tp",
                shape,
                t.dtype,
                &t.name,
                &[("axis", Attr::Int(ax))],
                layer,
            );
            Ok(Local { id: name, tok: Tok::Seq, split: 1 })
        } else {
            let shape = self.shape_of(&t.name, &t.shape, Tok::Full, 1)?;
            let name = self.collective(
                OpKind::AllReduce,
                "tp",
                self.tp(),
                partial,
                "ar_tp",
                shape,
                t.dtype,
                &t.name,
                &[],
                layer,
            );
            Ok(Local { id: name, tok: Tok::Full, split: 1 })
        }
    }

    /// Declare the local output of logical `id` and record it.
    fn output(&mut self, id: TensorId, tok: Tok, split: u64) -> R<TensorId> {
        let t = self.logical(id);
        let shape = self.shape_of(&t.name, &t.shape, tok, split)?;
        let local = self.add_tensor(t.name.clone(), shape, t.dtype, TensorKind::Activation);
        self.local.insert(id, Local { id: local, tok, split });
        Ok(local)
    }

    fn local_numel(&self, id: TensorId) -> u64 {
        self.tensors[id].numel()
    }

    /// The local tensors split over tp along their features (heads or columns).
    fn split_ids(&self) -> FxHashSet<TensorId> {
        self.local.values().chain(self.gathered.values()).filter(|l| l.split > 1).map(|l| l.id).collect()
    }

    /// The local tensors that hold a sequence-parallel shard (Tok::Seq). Every such
    /// tensor an op reads is a current local or gathered version: the only versions
    /// later replaced in `local` are the inputs of a collective, which reads no weight.
    fn seq_ids(&self) -> FxHashSet<TensorId> {
        self.local.values().chain(self.gathered.values()).filter(|l| l.tok == Tok::Seq).map(|l| l.id).collect()
    }

    fn cp_attrs(&self, attrs: &mut BTreeMap<String, Attr>) {
        if self.l.cp > 1 {
            attrs.insert("cp".into(), Attr::Int(i64::from(self.l.cp)));
            attrs.insert("cp-rank".into(), Attr::Int(i64::from(self.rank.cp)));
        }
    }

    /// Shard one logical op onto this rank.
    fn op(&mut self, i: usize) -> R<()> {
        let g = self.g;
        let op = &g.ops[i];
        let (layer, role) = (op.layer, op.role);
        let name = op.name.clone();
        let mut attrs = op.attrs.clone();
        let bad = |m: String| Err(format!("operation '{name}': {m}"));
        let tp = self.tp();
        let resid = if self.l.sp() { Tok::Seq } else { Tok::Full };
        match op.kind {
            OpKind::Embedding => {
                let (idx, table, out) = (op.inputs[0], op.inputs[1], op.outputs[0]);
                let w = self.logical(table);
                let c = w.shape.get(1).copied().unwrap_or(0);
                if role == Role::VocabParallel && tp > 1 {
                    let x = self.get(idx, Tok::Full)?;
                    let rows = self.l.vocab_per_rank(w.shape[0]);
                    let wn = self.weight(table, vec![rows, c])?;
                    attrs.insert("vocab-start".into(), Attr::Int((rows * u64::from(self.rank.tp)) as i64));
                    let partial = self.output(out, Tok::Full, 1)?;
                    self.emit(name, op.kind, vec![x.id, wn], vec![partial], attrs, layer, role);
                    let r = self.reduce_tp(out, partial, layer)?;
                    self.local.insert(out, r);
                } else {
                    let tok = if role == Role::VocabParallel { Tok::Full } else { resid };
                    let x = self.get(idx, tok)?;
                    let wn = self.weight(table, w.shape.clone())?;
                    let o = self.output(out, x.tok, 1)?;
                    self.emit(name, op.kind, vec![x.id, wn], vec![o], attrs, layer, role);
                }
            }
            OpKind::Linear => {
                let (xi, wi, out) = (op.inputs[0], op.inputs[1], op.outputs[0]);
                let w = &self.logical(wi).shape;
                let (n, k) = (w[0], w[1]);
                let bias = op.inputs.get(2).copied();
                let x = self.get(xi, resid)?;
                match role {
                    Role::ColumnParallel | Role::VocabParallel => {
                        let x = self.full_features(xi, x, layer)?;
                        let x = self.full_tokens(xi, x, layer)?;
                        let (o, n_local) = if role == Role::VocabParallel {
                            let v = self.l.vocab_per_rank(n);
                            let t = self.logical(out);
                            let mut s = self.shape_of(&t.name, &t.shape, Tok::Full, 1)?;
                            if let Some(last) = s.last_mut() {
                                *last = v;
                            }
                            let o = self.add_tensor(t.name.clone(), s, t.dtype, TensorKind::Activation);
                            self.local.insert(out, Local { id: o, tok: Tok::Full, split: tp });
                            attrs.insert("vocab-start".into(), Attr::Int((v * u64::from(self.rank.tp)) as i64));
                            (o, v)
                        } else {
                            let o = self.output(out, Tok::Full, tp)?;
                            let rows = self.local_numel(x.id) / k.max(1);
                            (o, self.local_numel(o) / rows.max(1))
                        };
                        let mut ins = vec![x.id, self.weight(wi, vec![n_local, k])?];
                        if let Some(b) = bias {
                            ins.push(self.weight(b, vec![n_local])?);
                        }
                        self.emit(name, op.kind, ins, vec![o], attrs, layer, role);
                    }
                    Role::RowParallel => {
                        if x.split != tp {
                            return bad(format!(
                                "row-parallel input '{}' is not split by tp={tp}",
                                self.logical(xi).name
                            ));
                        }
                        let rows = self.b * self.t / self.tok_div(x.tok);
                        let k_local = self.local_numel(x.id) / rows.max(1);
                        let mut ins = vec![x.id, self.weight(wi, vec![n, k_local])?];
                        if let Some(b) = bias {
                            // Megatron adds the row-parallel bias once, after the reduction.
                            ins.push(self.weight(b, vec![n])?);
                        }
                        let partial = self.output(out, Tok::Full, 1)?;
                        self.emit(name, op.kind, ins, vec![partial], attrs, layer, role);
                        let r = self.reduce_tp(out, partial, layer)?;
                        self.local.insert(out, r);
                    }
                    _ => {
                        let x = self.full_features(xi, x, layer)?;
                        let mut ins = vec![x.id, self.weight(wi, w.clone())?];
                        if let Some(b) = bias {
                            ins.push(self.weight(b, vec![n])?);
                        }
                        let o = self.output(out, x.tok, 1)?;
                        self.emit(name, op.kind, ins, vec![o], attrs, layer, role);
                    }
                }
            }
            OpKind::RmsNorm
            | OpKind::LayerNorm
            | OpKind::Add
            | OpKind::Gelu
            | OpKind::SquaredRelu
            | OpKind::SwiGlu
            | OpKind::GeGlu
            | OpKind::Rotary
            | OpKind::Concat => {
                let head_side = matches!(role, Role::HeadParallel | Role::ColumnParallel);
                let mut ins: Vec<(TensorId, Local)> = Vec::new();
                for &id in &op.inputs {
                    if self.logical(id).kind.is_param() {
                        continue;
                    }
                    let mut l = self.get(id, resid)?;
                    if head_side {
                        l = self.full_tokens(id, l, layer)?;
                    } else if role != Role::Expert && op.kind != OpKind::Concat {
                        l = self.full_features(id, l, layer)?;
                    }
                    ins.push((id, l));
                }
                // Inputs must agree on the token split; gather the sequence shards if not.
                if ins.iter().any(|(_, l)| l.tok != ins[0].1.tok) {
                    for (id, l) in ins.iter_mut() {
                        *l = self.full_tokens(*id, *l, layer)?;
                    }
                }
                let tok = ins.first().map_or(resid, |(_, l)| l.tok);
                let split = ins.iter().map(|(_, l)| l.split).max().unwrap_or(1);
                let out = op.outputs[0];
                let o = if op.kind == OpKind::Concat {
                    let (Some(a), Some(b)) = (ins.first(), ins.get(1)) else { return bad("concat inputs missing".into()) };
                    let (a, b) = (&self.tensors[a.1.id].shape, &self.tensors[b.1.id].shape);
                    if a.len() != b.len() || a.is_empty() {
                        return bad(format!("concat of {a:?} and {b:?}"));
                    }
                    let mut s: Vec<u64> = a.iter().zip(b).map(|(x, y)| *x.max(y)).collect();
                    let r = s.len() - 1;
                    s[r] = a[r] + b[r];
                    let t = self.logical(out);
                    let o = self.add_tensor(t.name.clone(), s, t.dtype, TensorKind::Activation);
                    self.local.insert(out, Local { id: o, tok, split });
                    o
                } else {
                    self.output(out, tok, split)?
                };
                if op.kind == OpKind::Rotary {
                    self.cp_attrs(&mut attrs);
                }
                let mut names: Vec<TensorId> = Vec::with_capacity(op.inputs.len());
                for &id in &op.inputs {
                    if self.logical(id).kind.is_param() {
                        names.push(self.weight(id, self.logical(id).shape.clone())?);
                    } else {
                        let pos = ins.iter().position(|(j, _)| *j == id).unwrap_or(0);
                        names.push(ins[pos].1.id);
                    }
                }
                self.emit(name, op.kind, names, vec![o], attrs, layer, role);
            }
            OpKind::Attention => {
                let mut ins = Vec::with_capacity(op.inputs.len());
                for (slot, &id) in op.inputs.iter().enumerate() {
                    let l = self.get(id, resid)?;
                    let mut l = self.full_tokens(id, l, layer)?;
                    if slot > 0 && self.l.cp > 1 {
                        l = match self.gathered.get(&(id, "cp")) {
                            Some(&g) => g,
                            None => {
                                let t = self.logical(id);
                                let mut s = self.shape_of(&t.name, &t.shape, Tok::Full, l.split)?;
                                s[1] *= u64::from(self.l.cp);
                                let n = self.collective(
                                    OpKind::AllGather,
                                    "cp",
                                    u64::from(self.l.cp),
                                    l.id,
                                    "ag_cp",
                                    s,
                                    t.dtype,
                                    &t.name,
                                    &[("axis", Attr::Int(1))],
                                    layer,
                                );
                                let g = Local { id: n, ..l };
                                self.gathered.insert((id, "cp"), g);
                                g
                            }
                        };
                    }
                    ins.push(l.id);
                }
                let o = self.output(op.outputs[0], Tok::Full, tp)?;
                self.cp_attrs(&mut attrs);
                self.emit(name, op.kind, ins, vec![o], attrs, layer, role);
            }
            // Mamba's mixer: per channel (the conv) and per head and group (the scan), on
            // the heads the column-parallel projections left this rank; its weights are
            // split along their first axis with them. `Layout::validate` has refused cp > 1
            // and a tp that does not divide the scans' groups.
            OpKind::CausalConv1d | OpKind::SsmScan => {
                let mut acts: Vec<Local> = Vec::new();
                for &id in &op.inputs {
                    if self.logical(id).kind.is_param() {
                        continue;
                    }
                    let l = self.get(id, resid)?;
                    acts.push(self.full_tokens(id, l, layer)?);
                }
                let split = acts.first().map_or(1, |l| l.split);
                if acts.iter().any(|l| l.split != split) || (split != 1 && split != tp) {
                    return bad(format!("its inputs must all be split by tp={tp} (from column-parallel projections) or none"));
                }
                let mut names: Vec<TensorId> = Vec::with_capacity(op.inputs.len());
                let mut a = acts.into_iter();
                for &id in &op.inputs {
                    let t = self.logical(id);
                    if t.kind.is_param() {
                        let mut shape = t.shape.clone();
                        if !shape.is_empty() && !shape[0].is_multiple_of(split) {
                            return bad(format!("weight '{}' {:?} does not split over tp={split}", t.name, t.shape));
                        }
                        if let Some(s0) = shape.first_mut() {
                            *s0 /= split;
                        }
                        names.push(self.weight(id, shape)?);
                    } else if let Some(l) = a.next() {
                        names.push(l.id);
                    }
                }
                let o = self.output(op.outputs[0], Tok::Full, split)?;
                self.emit(name, op.kind, names, vec![o], attrs, layer, role);
            }
            OpKind::CrossEntropy => {
                let logits = self.get(op.inputs[0], Tok::Full)?;
                let logits = self.full_tokens(op.inputs[0], logits, layer)?;
                let targets = self.get(op.inputs[1], Tok::Full)?;
                if role == Role::VocabParallel && tp > 1 {
                    // Vocab-parallel softmax (Megatron's vocab_parallel_cross_entropy): each
                    // rank reduces its shard per row, then the row max, the row sum of
                    // exponentials and the target's logit are all-reduced, (B,T) each.
                    let rows = self.b * self.t / self.tok_div(Tok::Full);
                    let lt = self.logical(op.inputs[0]).name.clone();
                    for stat in ["max", "sumexp", "target-logit"] {
                        let shape = vec![self.b, rows / self.b.max(1)];
                        self.collective(
                            OpKind::AllReduce,
                            "tp",
                            tp,
                            logits.id,
                            &format!("{stat}_tp"),
                            shape,
                            DType::F32,
                            &lt,
                            &[("row-stats", Attr::Flag(true)), ("reduce", attr_text(stat))],
                            layer,
                        );
                    }
                } else if logits.split > 1 {
                    return bad("cross-entropy over tp-split logits needs the vocab-parallel role".into());
                }
                let o = self.output(op.outputs[0], Tok::Full, 1)?;
                self.emit(name, op.kind, vec![logits.id, targets.id], vec![o], attrs, layer, role);
            }
            OpKind::Router => {
                let x = self.get(op.inputs[0], resid)?;
                let x = self.full_features(op.inputs[0], x, layer)?;
                let w = self.output(op.outputs[0], x.tok, 1)?;
                let idx = self.output(op.outputs[1], x.tok, 1)?;
                self.emit(name, op.kind, vec![x.id], vec![w, idx], attrs, layer, role);
            }
            OpKind::MoeDispatch => {
                let x = self.get(op.inputs[0], resid)?;
                let x = self.full_features(op.inputs[0], x, layer)?;
                let idx = self.get(op.inputs[1], x.tok)?;
                if idx.tok != x.tok {
                    return bad("tokens and router indices are split differently".into());
                }
                let ep = u64::from(self.l.ep);
                attrs.insert("ep".into(), Attr::Int(ep as i64));
                let out = op.outputs[0];
                let o = self.output(out, x.tok, 1)?;
                self.emit(name, op.kind, vec![x.id, idx.id], vec![o], attrs, layer, role);
                if ep > 1 {
                    // Declared for balanced routing (each rank receives as many rows as it
                    // sends): the size the volume is priced at. The rows really received
                    // depend on the routing; the executor sizes them at run time.
                    let t = self.logical(out);
                    let s = self.shape_of(&t.name, &t.shape, x.tok, 1)?;
                    let a = self.collective(OpKind::AllToAll, "ep", ep, o, "a2a_ep", s, t.dtype, &t.name, &[], layer);
                    self.local.insert(out, Local { id: a, tok: x.tok, split: 1 });
                }
                let etp = u64::from(self.l.etp);
                if etp > 1 && x.tok == Tok::Seq {
                    // Sequence parallelism: the etp ranks (consecutive tp ranks) hold
                    // different tokens, so the rows each has for its experts are
                    // all-gathered over etp before the experts (Megatron's alltoall
                    // dispatcher gathers them over the expert tensor-parallel group), and
                    // the routing indices with them, which the grouped linears between
                    // here and the reduce-scatter read.
                    let rows = self.local[&out];
                    let t = self.logical(out);
                    let s = self.shape_of(&t.name, &t.shape, Tok::Experts, 1)?;
                    let ax = Attr::Int(self.tok_axis(&t.shape) as i64);
                    let a = self.collective(OpKind::AllGather, "etp", etp, rows.id, "ag_etp", s, t.dtype, &t.name, &[("axis", ax)], layer);
                    self.local.insert(out, Local { id: a, tok: Tok::Experts, split: 1 });
                    let it = self.logical(op.inputs[1]);
                    let si = self.shape_of(&it.name, &it.shape, Tok::Experts, 1)?;
                    let ax = Attr::Int(self.tok_axis(&it.shape) as i64);
                    let gi = self.collective(OpKind::AllGather, "etp", etp, idx.id, "ag_etp", si, it.dtype, &it.name, &[("axis", ax)], layer);
                    self.gathered.insert((op.inputs[1], "etp"), Local { id: gi, tok: Tok::Experts, split: 1 });
                }
            }
            OpKind::GroupedLinear => {
                let (xi, wi, ii, out) = (op.inputs[0], op.inputs[1], op.inputs[2], op.outputs[0]);
                let x = self.get(xi, resid)?;
                let idx = match self.gathered.get(&(ii, "etp")) {
                    Some(&g) => g,
                    None => self.get(ii, x.tok)?,
                };
                let w = &self.logical(wi).shape;
                let (ep, etp) = (u64::from(self.l.ep), u64::from(self.l.etp));
                if w.len() != 3 || !w[0].is_multiple_of(ep) {
                    return bad(format!("expert weight {w:?} does not split by ep={ep}"));
                }
                if x.split == 1 {
                    let wn = self.weight(wi, vec![w[0] / ep, w[1] / etp, w[2]])?;
                    let o = self.output(out, x.tok, etp)?;
                    self.emit(name, op.kind, vec![x.id, wn, idx.id], vec![o], attrs, layer, role);
                } else {
                    let wn = self.weight(wi, vec![w[0] / ep, w[1], w[2] / etp])?;
                    let partial = self.output(out, x.tok, 1)?;
                    self.emit(name, op.kind, vec![x.id, wn, idx.id], vec![partial], attrs, layer, role);
                    if etp > 1 && x.tok == Tok::Experts {
                        // The rows gathered over etp at the dispatch go back to the ranks
                        // they came from, summed over the etp ranks' partial outputs.
                        let t = self.logical(out);
                        let s = self.shape_of(&t.name, &t.shape, Tok::Seq, 1)?;
                        let ax = Attr::Int(self.tok_axis(&t.shape) as i64);
                        let r = self.collective(
                            OpKind::ReduceScatter,
                            "etp",
                            etp,
                            partial,
                            "rs_etp",
                            s,
                            t.dtype,
                            &t.name,
                            &[("axis", ax)],
                            layer,
                        );
                        self.local.insert(out, Local { id: r, tok: Tok::Seq, split: 1 });
                    } else if etp > 1 {
                        // The etp ranks hold the same tokens: the partial outputs are
                        // summed with an all-reduce (the same bytes as Megatron's gather of
                        // the tokens and reduce-scatter of the output).
                        let t = self.logical(out);
                        let s = self.shape_of(&t.name, &t.shape, x.tok, 1)?;
                        let r = self.collective(
                            OpKind::AllReduce,
                            "etp",
                            etp,
                            partial,
                            "ar_etp",
                            s,
                            t.dtype,
                            &t.name,
                            &[],
                            layer,
                        );
                        self.local.insert(out, Local { id: r, tok: x.tok, split: 1 });
                    }
                }
            }
            OpKind::MoeCombine => {
                let (yi, wi, ii) = (op.inputs[0], op.inputs[1], op.inputs[2]);
                let mut y = self.get(yi, resid)?;
                let ep = u64::from(self.l.ep);
                if ep > 1 {
                    let t = self.logical(yi);
                    let s = self.shape_of(&t.name, &t.shape, y.tok, 1)?;
                    let a =
                        self.collective(OpKind::AllToAll, "ep", ep, y.id, "a2a_ep", s, t.dtype, &t.name, &[], layer);
                    y = Local { id: a, ..y };
                }
                let w = self.get(wi, y.tok)?;
                let idx = self.get(ii, y.tok)?;
                let o = self.output(op.outputs[0], idx.tok, 1)?;
                self.emit(name, op.kind, vec![y.id, w.id, idx.id], vec![o], attrs, layer, role);
            }
            OpKind::AllReduce
            | OpKind::AllGather
            | OpKind::ReduceScatter
            | OpKind::AllToAll
            | OpKind::Send
            | OpKind::Recv => return bad("the graph is already sharded (it contains collectives)".into()),
        }
        Ok(())
    }
}

/// Shard logical graph `g` for `layout` and return rank `rank`'s graph (which passes
/// [`crate::validate::validate`]) with its step-level collectives.
///
/// A pipeline stage that does not own the head ends at the `send` of its output: its
/// loss is the scalar token that `send` writes (summed over its chunks with `add`), and
/// the backward pass starts from the gradient received for the sent tensor.
///
/// # Errors
/// The layout breaks a rule of [`Layout::validate`] for this graph, the rank is outside
/// the layout, or the graph is already sharded or uses a role its op cannot have.
pub fn shard(g: &Graph, layout: &Layout, rank: RankCoord) -> Result<Sharded, String> {
    shard_with(g, layout, rank, true)
}

/// [`shard`]'s graph alone, without working out the step-level collectives or the
/// weight splits (what the projection's per-sharding templates read; the search builds
/// one per sharding).
///
/// # Errors
/// As [`shard`].
pub fn shard_graph(g: &Graph, layout: &Layout, rank: RankCoord) -> Result<Graph, String> {
    shard_with(g, layout, rank, false).map(|s| s.graph)
}

fn shard_with(g: &Graph, layout: &Layout, rank: RankCoord, with_step: bool) -> Result<Sharded, String> {
    let (f, places) = facts_and_places(g);
    layout.check(&f, layout.gpus())?;
    for (what, r, n) in
        [("tp", rank.tp, layout.tp), ("pp", rank.pp, layout.pp), ("cp", rank.cp, layout.cp), ("dp", rank.dp, layout.dp)]
    {
        if r >= n {
            return Err(format!("rank {what}={r} is outside the layout's {what}={n}"));
        }
    }
    let layers = &f.layers;
    let chunks = (layout.pp * layout.vp) as usize;
    let starts = layout.split.starts(layers.len(), chunks)?;
    // Layer position → chunk.
    let mut chunk_of_layer: HashMap<i32, usize> = HashMap::default();
    for c in 0..chunks {
        for &l in &layers[starts.start(c)..starts.start(c + 1)] {
            chunk_of_layer.insert(l, c);
        }
    }
    let chunk: Vec<usize> = places
        .iter()
        .map(|p| match p {
            Place::Pre => 0,
            Place::Post => chunks - 1,
            Place::Layer(l) => chunk_of_layer.get(l).copied().unwrap_or(0),
        })
        .collect();
    let owned = |c: usize| c % layout.pp as usize == rank.pp as usize;
    // Producer chunk of each activation (the last writer's), and the lowest and highest
    // chunk that reads it: all a send needs to know is whether another chunk reads it,
    // and a set of chunks per tensor was an allocation per tensor per sharding.
    let mut producer: Vec<Option<usize>> = vec![None; g.tensors.len()];
    let mut readers: Vec<Option<(usize, usize)>> = vec![None; g.tensors.len()];
    for (i, op) in g.ops.iter().enumerate() {
        for &o in &op.outputs {
            producer[o] = Some(chunk[i]);
        }
        for &x in &op.inputs {
            let c = chunk[i];
            readers[x] = Some(readers[x].map_or((c, c), |(lo, hi)| (lo.min(c), hi.max(c))));
        }
    }
    let mut p = Pass {
        g,
        l: layout,
        rank,
        b: f.b,
        t: f.t,
        // A rank holds at most the logical graph's tensors and ops plus the collectives.
        tensors: Vec::with_capacity(g.tensors.len()),
        names: Names::with_capacity(g.tensors.len()),
        duplicate: None,
        ops: Vec::with_capacity(g.ops.len()),
        local: FxHashMap::default(),
        weights: FxHashMap::default(),
        weight_ids: FxHashMap::default(),
        gathered: FxHashMap::default(),
    };
    let pp = i64::from(layout.pp);
    // Which activations carry a gradient back: a receive of one that carries none (every
    // weight before it frozen, as the embedding of a LoRA fine-tune) sends nothing back,
    // as its sender's send, which sees the frozen weights, receives nothing.
    let carries = crate::autodiff::needs_grad(g);
    let mut sent: Vec<TensorId> = Vec::new();
    let mut i = 0;
    while i < g.ops.len() {
        let c = chunk[i];
        let end = (i..g.ops.len()).find(|&j| chunk[j] != c).unwrap_or(g.ops.len());
        if !owned(c) {
            i = end;
            continue;
        }
        // Receive the activations this chunk reads from earlier chunks: the residual
        // stream, in its between-layer split.
        let mut received: BTreeSet<TensorId> = BTreeSet::new();
        for op in &g.ops[i..end] {
            for &x in &op.inputs {
                if let Some(pc) = producer[x]
                    && pc != c
                    && !p.local.contains_key(&x)
                    && received.insert(x)
                {
                    let t = &g.tensors[x];
                    let tok = if layout.sp() { Tok::Seq } else { Tok::Full };
                    let local = p.output(x, tok, 1)?;
                    let mut a = BTreeMap::new();
                    a.insert("group".into(), attr_text("pp"));
                    a.insert("group-size".into(), Attr::Int(pp));
                    a.insert("tensor".into(), attr_text(&t.name));
                    a.insert("peer".into(), Attr::Int((pc % layout.pp as usize) as i64));
                    if !carries[x] {
                        a.insert("no-grad".into(), Attr::Flag(true));
                    }
                    p.emit(
                        format!("{}.recv", p.name(local)),
                        OpKind::Recv,
                        vec![],
                        vec![local],
                        a,
                        op.layer,
                        Role::Replicated,
                    );
                }
            }
        }
        for j in i..end {
            p.op(j)?;
        }
        // Send what later chunks read.
        let mut outs: BTreeSet<TensorId> = BTreeSet::new();
        for op in &g.ops[i..end] {
            for &o in &op.outputs {
                if readers[o].is_some_and(|(lo, hi)| lo != c || hi != c) {
                    outs.insert(o);
                }
            }
        }
        for o in outs {
            let l = p.local.get(&o).copied().ok_or_else(|| format!("'{}' was not produced", g.tensors[o].name))?;
            let token = p.add_tensor(format!("{}.sent", p.name(l.id)), vec![], DType::F32, TensorKind::Activation);
            let mut a = BTreeMap::new();
            a.insert("group".into(), attr_text("pp"));
            a.insert("group-size".into(), Attr::Int(pp));
            a.insert("tensor".into(), attr_text(&g.tensors[o].name));
            a.insert("peer".into(), Attr::Int(((c + 1) % layout.pp as usize) as i64));
            let layer = g.ops[end - 1].layer;
            p.emit(
                format!("{}.send", p.name(l.id)),
                OpKind::Send,
                vec![l.id],
                vec![token],
                a,
                layer,
                Role::Replicated,
            );
            sent.push(token);
        }
        i = end;
    }
    // The objective: the loss on the last stage, plus every send token.
    let mut parts: Vec<TensorId> = Vec::new();
    if owned(chunks - 1) {
        parts.push(p.local.get(&g.loss).map(|l| l.id).ok_or("the loss was not produced on the last stage")?);
    }
    parts.extend(sent);
    let mut loss = parts.first().copied().ok_or("this rank runs no operation")?;
    for (k, &part) in parts.iter().enumerate().skip(1) {
        let sum = p.add_tensor(format!("pipeline.objective.{k}"), vec![], DType::F32, TensorKind::Activation);
        p.emit(
            p.name(sum).to_string(),
            OpKind::Add,
            vec![loss, part],
            vec![sum],
            BTreeMap::new(),
            -1,
            Role::Replicated,
        );
        loss = sum;
    }
    let step = if with_step { step_collectives(g, layout, &p, owned(0), owned(chunks - 1)) } else { Vec::new() };
    let splits = if with_step { weight_splits(g, &p.weights) } else { BTreeMap::new() };
    if let Some(name) = p.duplicate {
        return Err(GraphError::DuplicateTensor(name).to_string());
    }
    let graph = Graph::from_resolved(p.tensors, p.ops, loss);
    Ok(Sharded { graph, step, splits })
}

/// The weights held at a shape other than their unsharded one, and which group splits
/// each axis: an expert weight's (E, n, k) is split over `ep` along the experts and over
/// `etp` along n or k; every other weight over `tp`, a vocabulary-parallel embedding
/// table or head one part per rank (the `vocab-start` the ops are given).
fn weight_splits(g: &Graph, local: &FxHashMap<TensorId, Vec<u64>>) -> BTreeMap<String, WeightSplit> {
    // The weights (input 1) of grouped linears and of vocabulary-parallel ops, in one pass.
    let (mut experts, mut vocabs) = (FxHashSet::default(), FxHashSet::default());
    for o in &g.ops {
        if let Some(&w) = o.inputs.get(1) {
            if o.kind == OpKind::GroupedLinear {
                experts.insert(w);
            }
            if o.role == Role::VocabParallel {
                vocabs.insert(w);
            }
        }
    }
    local
        .iter()
        .filter_map(|(&id, shape)| {
            let t = &g.tensors[id];
            let (expert, vocab) = (experts.contains(&id), vocabs.contains(&id));
            let axes: Vec<SplitAxis> = t
                .shape
                .iter()
                .zip(shape)
                .enumerate()
                .filter(|(_, (f, l))| f != l)
                .map(|(axis, _)| SplitAxis {
                    axis,
                    group: if !expert { "tp" } else if axis == 0 { "ep" } else { "etp" },
                    per_rank: vocab && !expert,
                })
                .collect();
            (!axes.is_empty()).then(|| (t.name.clone(), WeightSplit { full: t.shape.clone(), axes }))
        })
        .collect()
}

/// Gradient reduction (and FSDP parameter gathers) for the weights this rank holds.
/// Gradients are reduced in fp32 (Megatron's default for bf16 training,
/// accumulate-allreduce-grads-in-fp32); FSDP gathers parameters at their own dtype in
/// the forward and again in the backward of every micro-batch.
fn step_collectives(g: &Graph, l: &Layout, p: &Pass, first: bool, last: bool) -> Vec<StepCollective> {
    let mut expert: FxHashSet<TensorId> = FxHashSet::default();
    let mut embed: FxHashSet<TensorId> = FxHashSet::default();
    let mut head: FxHashSet<TensorId> = FxHashSet::default();
    for op in &g.ops {
        match op.kind {
            OpKind::GroupedLinear => {
                expert.insert(op.inputs[1]);
            }
            // Whatever their roles: a tied table read by the embedding and the head of
            // a replicated (not vocab-parallel) model is split over pipeline stages too.
            OpKind::Embedding => {
                embed.insert(op.inputs[1]);
            }
            OpKind::Linear => {
                head.insert(op.inputs[1]);
            }
            _ => {}
        }
    }
    let (mut dense, mut dense_param, mut exp, mut exp_param) = (0.0, 0.0, 0.0, 0.0);
    let (mut dense_names, mut exp_names) = (Vec::new(), Vec::new());
    // Frozen weights (a LoRA fine-tune's base) have no gradient to reduce; FSDP still
    // shards and gathers them.
    let (mut frozen_dense, mut frozen_exp) = (Vec::new(), Vec::new());
    for (id, shape) in &p.weights {
        let n = shape.iter().product::<u64>() as f64;
        let bytes = g.tensors[*id].dtype.bytes();
        let name = g.tensors[*id].name.clone();
        let trained = g.tensors[*id].kind == TensorKind::Weight;
        match (expert.contains(id), trained) {
            (true, true) => {
                exp += 4.0 * n;
                exp_param += bytes * n;
                exp_names.push(name);
            }
            (false, true) => {
                dense += 4.0 * n;
                dense_param += bytes * n;
                dense_names.push(name);
            }
            (true, false) => {
                exp_param += bytes * n;
                frozen_exp.push(name);
            }
            (false, false) => {
                dense_param += bytes * n;
                frozen_dense.push(name);
            }
        }
    }
    dense_names.sort();
    exp_names.sort();
    let dp = l.dp * l.cp;
    let edp = (l.tp * l.cp * l.dp) / (l.ep * l.etp).max(1);
    // An expert sees each token of its ep group once per copy of it: the tp ranks hold
    // copies of their tokens unless sequence parallelism splits them.
    let edp_mean = if l.sp() { dp } else { (l.tp * l.cp * l.dp) / l.etp.max(1) };
    let m = l.micro_batches();
    let mut out = Vec::new();
    for (group, n, mean_over, grads, params, what, names, frozen) in [
        ("dp", dp, dp, dense, dense_param, "dense weights", dense_names, frozen_dense),
        ("edp", edp, edp_mean, exp, exp_param, "expert weights", exp_names, frozen_exp),
    ] {
        if (grads == 0.0 && !(l.fsdp && n > 1 && params > 0.0)) || (n <= 1 && mean_over <= 1) {
            continue;
        }
        let reduce = |kind: OpKind, weights: Vec<String>| StepCollective {
            kind,
            group: group.into(),
            group_size: n,
            bytes: grads,
            count: 1,
            mean_over,
            what: format!("fp32 gradients of the {what}"),
            weights,
        };
        // FSDP over one rank shards nothing: like plain data parallelism, the group of
        // one moves nothing and only divides (expert parallelism over all the dp ranks).
        if l.fsdp && n > 1 {
            if grads > 0.0 {
                // Each micro-batch's (PyTorch FSDP's default: the gradients stay sharded).
                out.push(StepCollective { count: m, ..reduce(OpKind::ReduceScatter, names.clone()) });
            }
            let mut gathered = names;
            gathered.extend(frozen);
            gathered.sort();
            out.push(StepCollective {
                kind: OpKind::AllGather,
                group: group.into(),
                group_size: n,
                bytes: params,
                count: 2 * m,
                mean_over: 1,
                what: format!("FSDP parameter gathers of the {what} (forward and backward, every micro-batch)"),
                weights: gathered,
            });
        } else {
            out.push(reduce(OpKind::AllReduce, names));
        }
    }
    // A tied table lives on the first and the last stage; their gradients are summed.
    if l.pp > 1 && (first || last) {
        let tied: Vec<(TensorId, &Vec<u64>)> =
            p.weights.iter().filter(|(id, _)| embed.contains(id) && head.contains(id) && g.tensors[**id].kind == TensorKind::Weight).map(|(&id, s)| (id, s)).collect();
        let tied_bytes: f64 = tied.iter().map(|(_, s)| 4.0 * s.iter().product::<u64>() as f64).sum();
        let mut names: Vec<String> = tied.iter().map(|(id, _)| g.tensors[*id].name.clone()).collect();
        names.sort();
        // On a single stage both readers are local and nothing crosses stages.
        let both_local = first && last;
        if !both_local && tied_bytes > 0.0 {
            out.push(StepCollective {
                kind: OpKind::AllReduce,
                group: "pp-embed".into(),
                group_size: 2,
                bytes: tied_bytes,
                count: 1,
                mean_over: 1,
                what: "fp32 gradients of the tied embedding (first and last stage)".into(),
                weights: names,
            });
        }
    }
    // A replicated weight read by an op on tp-split data gets the gradient of this rank's
    // part only: the tokens of its sequence shard (sequence parallelism: norm gains, a
    // replicated head) or its heads (a head-parallel norm, as Qwen3's q/k norms). The tp
    // ranks' parts are summed (Megatron's allreduce of layernorm grads in
    // finalize_model_grads). Linears on feature-split data are row-parallel: their
    // weight is split, and their bias is added once, after the reduction.
    if l.tp > 1 {
        let seq = if l.sp() { p.seq_ids() } else { FxHashSet::default() };
        let split = p.split_ids();
        // Local weight tensor → its logical weight.
        let logical: FxHashMap<TensorId, TensorId> = p.weight_ids.iter().map(|(&w, &local)| (local, w)).collect();
        let mut names: BTreeSet<String> = BTreeSet::new();
        for op in &p.ops {
            let on_seq = op.inputs.iter().any(|i| seq.contains(i));
            let on_heads = op.kind != OpKind::Linear && op.inputs.iter().any(|i| split.contains(i));
            if !on_seq && !on_heads {
                continue;
            }
            for i in &op.inputs {
                let Some(&id) = logical.get(i) else {
                    continue;
                };
                if !expert.contains(&id) && p.weights[&id] == g.tensors[id].shape && g.tensors[id].kind == TensorKind::Weight {
                    names.insert(g.tensors[id].name.clone());
                }
            }
        }
        if !names.is_empty() {
            let bytes = names
                .iter()
                .filter_map(|n| g.tensor_id(n))
                .map(|id| 4.0 * g.tensors[id].numel() as f64)
                .sum();
            out.push(StepCollective {
                kind: OpKind::AllReduce,
                group: "tp".into(),
                group_size: l.tp,
                bytes,
                count: 1,
                mean_over: 1,
                what: "fp32 gradients of the replicated weights read on tp-split data (norm gains in the \
                       sequence-parallel region or on heads, a replicated embedding or head), partial per tp rank"
                    .into(),
                weights: names.into_iter().collect(),
            });
        }
    }
    // KV heads replicated over tp (tp a multiple of the kv heads): the tp/kv ranks that
    // share a kv head each back-propagate only their own query heads into its
    // projection, so those ranks sum its gradients.
    let mut kv: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
    for op in g.ops.iter().filter(|o| o.kind == OpKind::Linear && o.role == Role::ColumnParallel) {
        let out = &g.tensors[op.outputs[0]].shape;
        let heads = if out.len() == 4 { out[2] } else { continue };
        if heads == 0 || u64::from(l.tp) <= heads || !u64::from(l.tp).is_multiple_of(heads) {
            continue;
        }
        for &w in &op.inputs[1..] {
            if p.weights.contains_key(&w) && g.tensors[w].kind == TensorKind::Weight {
                kv.entry((u64::from(l.tp) / heads) as u32).or_default().insert(g.tensors[w].name.clone());
            }
        }
    }
    let several = kv.len() > 1;
    for (rep, names) in kv {
        let bytes = names
            .iter()
            .filter_map(|n| p.weights.iter().find(|(id, _)| g.tensors[**id].name == *n))
            .map(|(_, s)| 4.0 * s.iter().product::<u64>() as f64)
            .sum();
        out.push(StepCollective {
            kind: OpKind::AllReduce,
            group: if several { format!("tp-kv{rep}") } else { "tp-kv".into() },
            group_size: rep,
            bytes,
            count: 1,
            what: format!(
                "fp32 gradients of the kv projections, each kv head replicated on {rep} tp ranks that see different \
                 query heads"
            ),
            weights: names.into_iter().collect(),
            mean_over: 1,
        });
    }
    out
}

/// Whether all-gather `op`'s backward sums the ranks' gradients (a reduce-scatter): when
/// every reader leaves a per-rank partial gradient of the gathered tensor, as a
/// column- or vocab-parallel linear reading it as its input (sequence parallelism),
/// attention reading it as keys or values (context parallelism: only this rank's queries
/// reach them) or a grouped linear reading the rows gathered over etp (each etp rank
/// applies its part of the experts' width) does. Otherwise the readers are replicated, every rank holds the whole
/// gradient, and the backward keeps this rank's part without communicating (Megatron's
/// `tensor_parallel_output_grad=False`).
pub fn all_gather_backward_reduces(g: &Graph, op: &Op) -> bool {
    let Some(&out) = op.outputs.first() else { return false };
    let mut readers = g.ops.iter().filter(|o| o.inputs.contains(&out)).peekable();
    if readers.peek().is_none() {
        return false;
    }
    let readers: Vec<&Op> = readers.collect();
    let split_linear = |o: &&Op| {
        o.kind == OpKind::Linear && o.inputs[0] == out && matches!(o.role, Role::ColumnParallel | Role::VocabParallel)
    };
    let kv = |o: &&Op| o.kind == OpKind::Attention && o.inputs[0] != out;
    let experts = |o: &&Op| o.kind == OpKind::GroupedLinear && o.inputs[0] == out;
    readers.iter().all(split_linear) || readers.iter().all(kv) || readers.iter().all(experts)
}
