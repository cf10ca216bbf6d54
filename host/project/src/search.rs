//! The layout search: every valid layout of a model on N GPUs, projected, ranked by step
//! time among those that fit in memory, with a verdict on each family of layouts that
//! did not win (memory, divisibility, or speed).
//!
//! What is enumerated: tp (dividing the heads and the kv heads, inside one NVLink
//! domain), cp (splitting the sequence into 2·cp chunks), pp (up to the layers), vp
//! (interleaving, up to 16 chunks per stage, the micro-batches a multiple of pp, the
//! splits Megatron-Core's flags build), ep (dividing the experts) with
//! etp 1 or tp, mbs (1 to 8, dividing the batch), FSDP or the distributed optimizer, and
//! activation recompute: none, or, for a layout that does not fit, the faster of
//! selective recompute of the fastest of Megatron's module lists that makes it fit
//! ([`selective_levels`]) and full recompute of the fewest layers per chunk that does
//! (Megatron's block method; more recompute is never faster) ([`recompute_to_fit`]), or,
//! on a GPU with a known host link, offloading the activations of the fewest layers per
//! chunk that makes it fit when that is faster still ([`offload_to_fit`]).
//! Choices the model shows are never worse are fixed: sequence parallelism with tp,
//! TP, EP (unless the caller turns it off) and DP overlap on, BF16 gradient reduction
//! (NVIDIA's performance recipes).
//! Selective recompute of the attention cores alone (Megatron's default list) is not
//! searched: with flash attention it stores what no recompute stores, so it only costs
//! time.
//!
//! The shapes of a rank's layers depend on (tp, cp, ep, etp, SP, mbs) only, so each of
//! those is sharded and timed once; the schedules on top are arithmetic over per-layer
//! prefix sums, which is what makes the search take well under a second.

use rustc_hash::FxHashMap as HashMap;

use serde::Serialize;

use runner_graph::modules::{Module, Modules};
use runner_graph::pipeline::{LAYOUT_EMBEDDING_MAX, LAYOUT_HEAD_MAX, PipelineSplit};
use runner_graph::recompute::RecomputePolicy;
use runner_graph::shard;

use crate::project::Projector;
use crate::step::{Costed, Memory, Optimizer, PipelineKind, Projection, Reject, Schedule};
use crate::template::{Kernels, ShardKey};

/// Degrees and choices the caller fixes; `None` lets the search choose.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Space {
    pub tp: Option<u32>,
    pub pp: Option<u32>,
    pub cp: Option<u32>,
    pub vp: Option<u32>,
    pub ep: Option<u32>,
    pub etp: Option<u32>,
    pub mbs: Option<u32>,
    pub fsdp: Option<bool>,
    pub recompute: Option<RecomputePolicy>,
    /// With full recompute fixed: layers per pipeline chunk recomputed (0 or absent: all);
    /// a layout whose fullest chunk has fewer is refused, not clamped.
    pub recompute_layers: Option<u32>,
    /// With selective recompute fixed: the modules (Megatron's default list, `core_attn`,
    /// when absent).
    pub recompute_modules: Option<Modules>,
    /// The pipeline split of every layout (even when absent).
    pub split: Option<PipelineSplit>,
    /// Layers per chunk whose activations every layout offloads to host memory; absent,
    /// a layout that does not fit may offload the fewest that make it fit (on a GPU whose
    /// profile gives its host link) when that beats recompute.
    pub offload_layers: Option<u32>,
    /// Whether the expert all-to-all overlaps another micro-batch's compute (Megatron's
    /// `overlap_moe_expert_parallel_comm`); absent: on, the faster.
    pub ep_overlap: Option<bool>,
    /// The optimizer every layout trains with.
    pub optimizer: Optimizer,
    /// The kernel choices every layout runs with.
    pub kernels: Kernels,
    /// The pipeline schedule every layout runs (Megatron's 1F1B by default).
    #[serde(skip_serializing_if = "PipelineKind::is_1f1b")]
    pub pipeline: PipelineKind,
}

/// Why a family of layouts did not win.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
pub enum Verdict {
    /// It holds the fastest layout.
    Best { layout: String, step_time_s: f64 },
    /// Its best layout fits but is slower than the winner by this factor.
    Speed { layout: String, step_time_s: f64, slower: f64 },
    /// Every layout of the family that divides evenly needs more memory than the GPU has.
    Memory { layout: String, need_gib: f64, have_gib: f64 },
    /// Its layouts fit the GPU only by offloading more activations than host memory
    /// holds (GiB per GPU).
    HostMemory { layout: String, need_gib: f64, have_gib: f64 },
    /// No layout of the family divides the model and the batch.
    Divisibility {
        reason: String,
        /// What was refused, for callers that treat one kind apart without reading the
        /// words (not in the JSON: `reason` says it).
        #[serde(skip)]
        kind: Refusal,
    },
}

/// The kind of a [`Verdict::Divisibility`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Refusal {
    /// tp·cp does not divide the GPU count: no pipeline or data-parallel degree can
    /// follow. Where the search chose tp and cp itself, this is no reason a user can act
    /// on.
    StageCount,
    /// Anything else: the model, the batch, the pipeline split, a flag given.
    #[default]
    Other,
}

/// A family of layouts: which parallel dimensions it uses.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Family {
    pub name: String,
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// The search's answer for one GPU count.
#[derive(Clone, Debug, Serialize)]
pub struct Found {
    pub gpus: u32,
    pub global_batch: u32,
    /// The fastest layouts that fit, best first.
    pub best: Vec<Projection>,
    pub families: Vec<Family>,
    /// Layouts projected (each schedule of each sharding, recompute variants included).
    pub evaluated: u64,
    /// Degrees the search left out by rule rather than by projection, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_tried: Vec<String>,
}

/// The divisors of a GPU count, in order.
fn divisors(n: u32) -> Vec<u32> {
    shard::divisors(u64::from(n)).into_iter().filter_map(|d| u32::try_from(d).ok()).collect()
}

fn family(key: &ShardKey, pp: u32, dp: u32, fsdp: bool) -> String {
    let mut parts = Vec::new();
    for (name, v) in [("TP", key.tp), ("PP", pp), ("CP", key.cp), ("EP", key.ep)] {
        if v > 1 {
            parts.push(name);
        }
    }
    if fsdp {
        parts.push("FSDP");
    } else if dp > 1 {
        parts.push("DP");
    }
    if parts.is_empty() { "single GPU".into() } else { parts.join("+") }
}

/// Track of one family.
#[derive(Default)]
struct Track {
    best: Option<Projection>,
    /// The layout needing the least memory, when none fits.
    least: Option<Projection>,
    reason: Option<(String, Refusal)>,
}

/// Every family's track, by name (looked up once per pipeline degree, not per layout).
#[derive(Default)]
struct Tracks {
    all: Vec<(String, Track)>,
    at: HashMap<String, usize>,
}

impl Tracks {
    fn index(&mut self, name: &str) -> usize {
        if let Some(&i) = self.at.get(name) {
            return i;
        }
        self.all.push((name.to_string(), Track::default()));
        self.at.insert(name.to_string(), self.all.len() - 1);
        self.all.len() - 1
    }

    fn get(&mut self, name: &str) -> &mut Track {
        let i = self.index(name);
        &mut self.all[i].1
    }
}

/// The `k` fastest distinct layouts offered, fastest first; among equal step times the
/// one offered first ranks first. Recompute variants can coincide in one layout: a layout
/// already kept is not kept twice.
struct Top {
    k: usize,
    kept: Vec<Projection>,
}

impl Top {
    fn new(k: usize) -> Top {
        Top { k: k.max(1), kept: Vec::new() }
    }

    fn offer(&mut self, p: Projection) {
        let at = self.kept.partition_point(|q| q.step_time_s <= p.step_time_s);
        if at >= self.k || self.kept.iter().any(|q| q.layout == p.layout) {
            return;
        }
        self.kept.insert(at, p);
        self.kept.truncate(self.k);
    }
}

/// One (tp, cp, ep, etp, mbs) the search visits: refused when tp·cp does not divide the
/// GPUs, else tried with the `rest` of the GPUs for pp and dp.
enum Sharding {
    Refused { key: ShardKey, stage: u64 },
    Tried { key: ShardKey, rest: u32 },
}

/// Search the layouts of `pr`'s model on `gpus` GPUs at global batch `gbs`.
pub fn search(pr: &mut Projector<'_>, gpus: u32, gbs: u32, space: &Space, top: usize) -> Found {
    let shape = pr.model.shape.clone();
    let layers = shape.layers;
    let seq = pr.model.seq_len;
    let domain = pr.gpu.scale_up_domain;
    let mut tracks = Tracks::default();
    let mut split_memo: HashMap<(u32, u32), Result<Vec<PipelineSplit>, String>> = HashMap::default();
    let mut found = Top::new(top);
    let mut evaluated = 0u64;
    let note = |tracks: &mut Tracks, fam: &str, why: String| {
        tracks.get(fam).reason.get_or_insert((why, Refusal::Other));
    };
    let pick = |fixed: Option<u32>, all: Vec<u32>| -> Vec<u32> {
        match fixed {
            Some(v) => vec![v],
            None => all,
        }
    };
    // tp divides the heads and the kv heads: Megatron-Core's attention divides its query
    // groups by tp (`Attention.__init__`), so a tp past the kv heads, which the executor
    // runs by replicating them, is not a layout NeMo or Megatron-Bridge can be given. A
    // tp fixed on the command line is priced as asked.
    let tps = pick(space.tp, divisors(gpus).into_iter().filter(|&t| t <= domain && shape.tp_splits_heads(t)).collect());
    let mut not_tried = Vec::new();
    if space.tp.is_none() {
        let past_kv: Vec<(u32, u64)> =
            divisors(gpus).into_iter().filter(|&t| t <= domain).filter_map(|t| shape.kv_replicated(t).map(|kv| (t, kv))).collect();
        if let Some(&(_, kv)) = past_kv.first() {
            let tps: Vec<String> = past_kv.iter().map(|(t, _)| t.to_string()).collect();
            not_tried.push(format!(
                "tp {} not tried: they divide the attention heads but not the {kv} kv heads, which Megatron-Core's \
                 attention divides by tp (--tp prices the kv heads replicated, as this runner's executor runs them)",
                tps.join(", ")
            ));
        }
    }
    let cps = pick(space.cp, [1u32, 2, 4, 8, 16].into_iter().filter(|&c| seq.is_multiple_of(2 * c) || c == 1).collect());
    // A dense model runs at ep 1; an ep it was given stays, so the sharding refuses it by
    // name ("no routed experts") rather than the search dropping it unsaid.
    let eps: Vec<u32> = if shape.experts > 0 {
        pick(space.ep, divisors(shape.experts as u32).into_iter().filter(|&e| e <= gpus).collect())
    } else {
        vec![space.ep.unwrap_or(1)]
    };
    let mbss = pick(space.mbs, vec![1, 2, 4, 8]);
    let fsdps = space.fsdp.map_or(vec![false, true], |f| vec![f]);
    // Every sharding the search tries, in its order (a tp·cp that does not divide the
    // GPUs is refused where it falls).
    let mut shardings: Vec<Sharding> = Vec::new();
    for &tp in &tps {
        for &cp in &cps {
            let stage = u64::from(tp) * u64::from(cp);
            if stage == 0 || !u64::from(gpus).is_multiple_of(stage) {
                shardings.push(Sharding::Refused { key: ShardKey { tp, cp, ep: 1, etp: 1, sp: tp > 1, mbs: 1 }, stage });
                continue;
            }
            // stage divides gpus, so the quotient fits.
            let rest = (u64::from(gpus) / stage) as u32;
            for &ep in &eps {
                let etps = pick(space.etp, if tp > 1 && shape.experts > 0 { vec![1, tp] } else { vec![1] });
                for &etp in &etps {
                    for &mbs in &mbss {
                        shardings.push(Sharding::Tried { key: ShardKey { tp, cp, ep, etp, sp: tp > 1, mbs }, rest });
                    }
                }
            }
        }
    }
    // Their templates (sharding and timing the layers: most of a cold search) are built
    // and timed on every core first; the walk below finds them cached.
    pr.prebuild(
        &shardings.iter().filter_map(|s| match s { Sharding::Tried { key, .. } => Some(*key), Sharding::Refused { .. } => None }).collect::<Vec<_>>(),
        space.kernels,
    );
    for sharding in shardings {
        let (key, rest) = match sharding {
            Sharding::Refused { key, stage } => {
                tracks.get(&family(&key, 1, 1, false)).reason.get_or_insert((format!("tp·cp = {stage} does not divide {gpus} GPUs"), Refusal::StageCount));
                continue;
            }
            Sharding::Tried { key, rest } => (key, rest),
        };
        let (tp, cp, ep) = (key.tp, key.cp, key.ep);
        let stage = u64::from(tp) * u64::from(cp);
        let costed = match pr.costed(key, space.kernels) {
            Ok(c) => c,
            Err(e) => {
                let fam = family(&key, 1, rest, false);
                note(&mut tracks, &fam, e);
                continue;
            }
        };
        for &pp in &pick(space.pp, divisors(rest).into_iter().filter(|&p| p <= layers.max(1)).collect()) {
            if pp == 0 || !rest.is_multiple_of(pp) {
                let fam = family(&key, pp, 1, false);
                note(&mut tracks, &fam, format!("pp={pp} does not divide the {rest} GPUs tp·cp = {stage} leaves"));
                continue;
            }
            let dp = rest / pp;
            // The families this (sharding, pp, dp) falls in, without and with
            // FSDP, looked up when a layout of it is first projected.
            let mut fams: [Option<usize>; 2] = [None, None];
            // A split given on the command line may count absurdly many units.
            // Up to the most units PipelineSplit::layout_choices counts.
            let units = space.split.map_or(layers.saturating_add(LAYOUT_EMBEDDING_MAX + LAYOUT_HEAD_MAX), |s| {
                layers.saturating_add(s.embedding).saturating_add(s.loss)
            });
            // DualPipeV has no virtual pipeline: its two stages a rank are the V's.
            let vps = pick(
                space.vp,
                if pp > 1 && space.pipeline != PipelineKind::DualPipeV { (1..=16).filter(|v| pp * v <= units).collect() } else { vec![1] },
            );
            for &vp in &vps {
                // The splits depend on pp and vp alone: worked out (and a
                // refusal worded) once per pair, not once per sharding.
                let splits = match split_memo.entry((pp, vp)).or_insert_with(|| megatron_splits(space, layers, pp, vp)) {
                    Ok(splits) => splits.clone(),
                    Err(why) => {
                        for &fsdp in &fsdps {
                            if !(fsdp && dp * cp == 1) {
                                note(&mut tracks, &family(&key, pp, dp, fsdp), why.clone());
                            }
                        }
                        continue;
                    }
                };
                for (fsdp, split) in fsdps.iter().flat_map(|&f| splits.iter().map(move |&s| (f, s))) {
                    if fsdp && dp * cp == 1 {
                        continue;
                    }
                    let sched = Schedule {
                        pp,
                        vp,
                        dp,
                        global_batch: gbs,
                        recompute: space.recompute.unwrap_or(RecomputePolicy::None),
                        recompute_layers: space.recompute_layers.unwrap_or(0),
                        recompute_modules: space.recompute_modules.unwrap_or_default(),
                        distributed_optimizer: !fsdp,
                        fsdp,
                        tp_overlap: tp > 1,
                        ep_overlap: ep > 1 && space.ep_overlap.unwrap_or(true),
                        dp_overlap: true,
                        grad_fp32: false,
                        kernels: space.kernels,
                        split,
                        offload_layers: space.offload_layers.unwrap_or(0),
                        optimizer: space.optimizer,
                        pipeline: space.pipeline,
                    };
                    let choose = Choose { recompute: space.recompute.is_none(), offload: space.offload_layers.is_none() };
                    let r = fitting(costed, sched, layers, choose, &mut evaluated);
                    let i = *fams[usize::from(fsdp)].get_or_insert_with(|| tracks.index(&family(&key, pp, dp, fsdp)));
                    let t = &mut tracks.all[i].1;
                    match r {
                        Err(Reject::Divisibility(why) | Reject::Unsupported(why)) => {
                            t.reason.get_or_insert((why, Refusal::Other));
                        }
                        Err(Reject::Memory { .. }) => {}
                        Ok(p) if p.fits => {
                            if t.best.as_ref().is_none_or(|b| p.step_time_s < b.step_time_s) {
                                t.best = Some(p.clone());
                            }
                            found.offer(p);
                        }
                        Ok(p) => {
                            if t.least.as_ref().is_none_or(|b| p.memory.total < b.memory.total) {
                                t.least = Some(p);
                            }
                        }
                    }
                }
            }
        }
    }
    let mut found = found.kept;
    for p in &mut found {
        p.pipeline_model_parallel_layout = p.layout.pipeline_layout_needed(layers, shape.mtp);
    }
    let winner = found.first().map(|p| p.step_time_s);
    let mut families: Vec<Family> = tracks
        .all
        .into_iter()
        .map(|(name, t)| {
            let verdict = match (&t.best, &t.least, winner) {
                (Some(b), _, Some(w)) if b.step_time_s <= w => {
                    Verdict::Best { layout: b.layout.short(), step_time_s: b.step_time_s }
                }
                (Some(b), _, Some(w)) => {
                    Verdict::Speed { layout: b.layout.short(), step_time_s: b.step_time_s, slower: b.step_time_s / w }
                }
                (None, Some(l), _) if l.memory.gpu_fits() => {
                    Verdict::HostMemory { layout: l.layout.short(), need_gib: l.memory.host_offload, have_gib: l.memory.host_capacity }
                }
                (None, Some(l), _) => Verdict::Memory { layout: l.layout.short(), need_gib: l.memory.total, have_gib: l.memory.capacity },
                _ => {
                    let (reason, kind) =
                        t.reason.unwrap_or_else(|| ("no layout of this family divides the model and batch".into(), Refusal::Other));
                    Verdict::Divisibility { reason, kind }
                }
            };
            Family { name, verdict }
        })
        .collect();
    families.sort_by(|a, b| order(&a.verdict).total_cmp(&order(&b.verdict)).then(a.name.cmp(&b.name)));
    Found { gpus, global_batch: gbs, best: found, families, evaluated, not_tried }
}

/// The splits of `layers` over pp·vp chunks the search prices: the one given on the
/// command line, else those Megatron-Core builds from its flags (the embedding and the
/// loss counted as a layer or not, [`PipelineSplit::megatron_flags`]), so that what it
/// recommends runs as NeMo and Megatron-Bridge configure it. Where none does, the splits
/// a `pipeline_model_parallel_layout` builds with every chunk holding the same units
/// ([`PipelineSplit::layout_choices`], Megatron-Bridge's DeepSeek-V3 presets): the first
/// of them, or every one where the user fixed pp, and then (with `--vp` or no
/// interleaving) the even split too; the output names the layout string Megatron then
/// needs.
///
/// # Errors
/// No split builds at this pp and vp, with Megatron's reason.
fn megatron_splits(space: &Space, layers: u32, pp: u32, vp: u32) -> Result<Vec<PipelineSplit>, String> {
    if let Some(s) = space.split {
        return Ok(vec![s]);
    }
    if pp <= 1 {
        return Ok(vec![PipelineSplit::default()]);
    }
    let dualpipev = space.pipeline == PipelineKind::DualPipeV;
    let vp = space.pipeline.split_vp(vp);
    let (l, p, v) = (layers as usize, pp as usize, vp as usize);
    let mut ok = PipelineSplit::megatron_choices(l, p, v);
    if ok.is_empty() {
        // A split a pipeline_model_parallel_layout builds, as Megatron-Bridge's DeepSeek-V3
        // presets use them: without it the search never reached PP4 VP4 or PP8 VP2 for 61
        // layers, and called the pipelined families 1.4x slower than layouts 1 % slower.
        // The first (fewest units counted, the head before the embedding, as the presets
        // count it): pricing every one took DeepSeek-V3's cold search from 0.7 to 1.1 s.
        // Where the user fixed pp the search is small, and every one is priced: NeMo's
        // DeepSeek-V3 PP16 script counts the embedding as one layer and the head as two
        // (E1L2) where the first choice is E0L3, and which is faster depends on the model.
        let choices = PipelineSplit::layout_choices(l, p, v);
        ok = if space.pp.is_some() { choices } else { choices.into_iter().take(1).collect() };
        if space.pp.is_some() && (space.vp.is_some() || vp == 1 || dualpipev) && !ok.contains(&PipelineSplit::default()) {
            ok.push(PipelineSplit::default());
        }
    }
    // Under DualPipe rank r holds stage r and stage pp-1-r: a split and its mirror (the
    // embedding's and the loss's counts swapped) put the same layers on every rank and
    // project alike, and were listed as two layouts of one figure. Price the first. Not
    // under DualPipeV: rank 0 holds both ends there too, but its first stage keeps 2·pp
    // micro-batches' activations and its last one, so the mirror changes its memory.
    if space.pipeline == PipelineKind::DualPipe {
        let mut kept: Vec<PipelineSplit> = Vec::with_capacity(ok.len());
        for s in ok {
            if !kept.contains(&PipelineSplit { embedding: s.loss, loss: s.embedding }) {
                kept.push(s);
            }
        }
        ok = kept;
    }
    if !ok.is_empty() {
        return Ok(ok);
    }
    let why = PipelineSplit::default().megatron_flags(l, p, v).err().unwrap_or_default();
    let at = if dualpipev { format!("pp={pp} (DualPipeV's 2·pp stages)") } else { format!("pp={pp} vp={vp}") };
    Err(format!(
        "Megatron-Core's flags build no split at {at}: {why}, nor with the embedding or the loss counted as a layer, \
         nor does a pipeline_model_parallel_layout with the embedding as 0-{LAYOUT_EMBEDDING_MAX} layers and the head as \
         0-{LAYOUT_HEAD_MAX} divide them evenly (give --pp{} to price the even split)",
        if dualpipev { "" } else { " and --vp" }
    ))
}

fn order(v: &Verdict) -> f64 {
    match v {
        Verdict::Best { .. } => 0.0,
        Verdict::Speed { slower, .. } => *slower,
        Verdict::HostMemory { need_gib, .. } => 1e6 + need_gib / 1e3,
        Verdict::Memory { need_gib, .. } => 2e6 + need_gib,
        Verdict::Divisibility { .. } => 1e12,
    }
}

/// What the search may choose for a layout that does not fit.
#[derive(Clone, Copy)]
struct Choose {
    recompute: bool,
    offload: bool,
}

/// Project `s`; if it does not fit and recompute is the search's to choose, the fastest
/// recompute that makes it fit ([`recompute_to_fit`]), or the fewest layers offloaded
/// that do ([`offload_to_fit`]) where offload is the search's to choose too and faster.
fn fitting(c: &Costed, s: Schedule, layers: u32, choose: Choose, evaluated: &mut u64) -> Result<Projection, Reject> {
    *evaluated += 1;
    // A layout that does not fit, where the search will recompute, is only a starting
    // point: its step time is not worked out.
    if let Ok(first) = c.evaluate_where(&s, |m| m.fits() || !choose.recompute)? {
        return Ok(first);
    }
    let rc = recompute_to_fit(c, &s, layers, evaluated)?;
    if !choose.offload || s.offload_layers > 0 || !c.can_offload() {
        return Ok(rc);
    }
    Ok(match offload_to_fit(c, &s, layers, evaluated)? {
        Ok(o) if !rc.fits || o.step_time_s < rc.step_time_s => o,
        // Nothing fits, and offload fits the GPU but not the host: the closer miss, and
        // the one that says what stands in the way.
        Err(o) if !rc.fits && o.memory.gpu_fits() => o,
        _ => rc,
    })
}

/// The fewest layers per chunk whose activations, offloaded to host memory, make schedule
/// `s` fit without recompute (binary search: GPU memory falls and time grows with every
/// layer offloaded); `Err` with the closest miss when offloading every layer is not enough
/// for the GPU, or the fewest that are enough need more host memory than there is.
///
/// # Errors
/// The schedule does not divide ([`Reject::Divisibility`]), or the GPU's profile gives no
/// host link or host memory.
pub fn offload_to_fit(c: &Costed, s: &Schedule, layers: u32, evaluated: &mut u64) -> Result<Result<Projection, Projection>, Reject> {
    let chunk = s.split.fullest_chunk(layers, s.pipeline.chunks(s.pp, s.vp));
    fewest_that_fit(c, chunk, |n| Schedule { offload_layers: n, ..*s }, evaluated)
}

/// The projection at the fewest n in 1..=`chunk` whose GPU memory fits, where GPU memory
/// falls with n (a binary search); `Err` with the projection at `chunk` when not even that
/// fits the GPU, or with the one found when it does not fit the host (offloaded
/// activations grow with n, so no larger n fits the host either).
///
/// `at(n)` is the schedule at n; each projection and each probe counts as evaluated. A
/// probe (`mid`) asks only whether n fits, so it is priced for its memory alone
/// ([`Costed::memory_of`]).
fn fewest_that_fit(
    c: &Costed,
    chunk: u32,
    at: impl Fn(u32) -> Schedule,
    evaluated: &mut u64,
) -> Result<Result<Projection, Projection>, Reject> {
    *evaluated += 1;
    let all = c.evaluate(&at(chunk))?;
    if !all.memory.gpu_fits() {
        return Ok(Err(all));
    }
    let (mut lo, mut hi) = (0u32, chunk);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        *evaluated += 1;
        if c.memory_of(&at(mid))?.gpu_fits() { hi = mid } else { lo = mid }
    }
    let fewest = if hi == chunk {
        all
    } else {
        *evaluated += 1;
        c.evaluate(&at(hi))?
    };
    Ok(if fewest.fits { Ok(fewest) } else { Err(fewest) })
}

/// The selective-recompute module lists a layout that does not fit may take: the
/// output-discarding re-runs of memory-bound ops (the layer's two norms, the experts'
/// activation), MLA's up projections (small GEMMs), both, and either with the dense MLP
/// and the shared experts (their GEMMs). NVIDIA's performance recipes use such lists
/// (Megatron-Bridge scripts/performance/configs/deepseek/
/// deepseek_workload_base_configs.py@0426418: `["mla_up_proj"]`, `["mla_up_proj",
/// "mlp"]`, `["mla_up_proj", "layernorm", "moe_act"]`). They are not nested (MLA's q, k,
/// v outweigh the norms' outputs but cost GEMMs to redo), so every one is tried.
pub fn selective_levels() -> [Modules; 5] {
    let cheap = Modules::of(&[Module::Layernorm, Module::MoeAct]);
    let up = Modules::of(&[Module::MlaUpProj]);
    let mla = cheap.with(Module::MlaUpProj);
    [cheap, up, mla, up.with(Module::Mlp).with(Module::SharedExperts), mla.with(Module::Mlp).with(Module::SharedExperts)]
}

/// The fastest recompute that makes schedule `s` (which does not fit as it is) fit: the
/// fastest of [`selective_levels`] that fits, or full recompute of the fewest layers per
/// chunk that does (binary search: memory falls and time grows with every layer
/// recomputed), whichever is faster. When nothing fits: full recompute of every layer
/// (the least memory), with `fits` false.
///
/// # Errors
/// The schedule does not divide ([`Reject::Divisibility`]).
pub fn recompute_to_fit(c: &Costed, s: &Schedule, layers: u32, evaluated: &mut u64) -> Result<Projection, Reject> {
    let mut best: Option<Projection> = None;
    let mut tried: Vec<Modules> = Vec::new();
    for modules in selective_levels() {
        // Only the modules the model has: a dense model's lists spell `layernorm`,
        // `mlp` and `layernorm+mlp`, and a list the model reduces to one already tried
        // is not tried again.
        let modules = c.present(modules);
        if modules.is_empty() || tried.contains(&modules) {
            continue;
        }
        tried.push(modules);
        *evaluated += 1;
        // Only a list that fits is a candidate: the step time of one that does not is not
        // worked out.
        let sel = Schedule { recompute: RecomputePolicy::Selective, recompute_layers: 0, recompute_modules: modules, ..*s };
        if let Ok(p) = c.evaluate_where(&sel, Memory::fits)?
            && best.as_ref().is_none_or(|b| p.step_time_s < b.step_time_s)
        {
            best = Some(p);
        }
    }
    // Recompute counts run per chunk; the fullest chunk bounds them.
    let chunk = s.split.fullest_chunk(layers, s.pipeline.chunks(s.pp, s.vp));
    let at = |n: u32| Schedule {
        recompute: RecomputePolicy::Full,
        recompute_layers: if n >= chunk { 0 } else { n },
        recompute_modules: Modules::default(),
        ..*s
    };
    let full = match fewest_that_fit(c, chunk, at, evaluated)? {
        Ok(full) => full,
        Err(all) => return Ok(best.unwrap_or(all)),
    };
    Ok(match best {
        Some(b) if b.step_time_s <= full.step_time_s => b,
        _ => full,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profiles;

    /// A projection of a one-layer toy model (an embedding, one GEMM, the head) on an H100.
    fn projection() -> Projection {
        let mut pr = crate::toy::projector(256, 128, 1024, Profiles::builtin().get("h100").unwrap().clone());
        let space = Space { tp: Some(1), pp: Some(1), cp: Some(1), mbs: Some(1), fsdp: Some(false), ..Space::default() };
        search(&mut pr, 1, 4, &space, 1).best.remove(0)
    }

    /// `p` as a layout of `mbs` taking `s` seconds a step.
    fn at(p: &Projection, mbs: u32, s: f64) -> Projection {
        let mut q = p.clone();
        q.layout.mbs = mbs;
        q.step_time_s = s;
        q
    }

    /// The top keeps the fastest, fastest first; of equal step times the one offered first
    /// ranks first (and stays when the top is full); a layout offered twice is kept once;
    /// a top of none keeps one.
    #[test]
    fn the_top_keeps_the_fastest_distinct_layouts_first_offered_first() {
        let p = projection();
        let mbs = |top: &Top| top.kept.iter().map(|q| q.layout.mbs).collect::<Vec<_>>();
        let mut top = Top::new(3);
        for (m, s) in [(1, 2.0), (2, 1.0), (3, 2.0), (4, 3.0), (5, 1.0)] {
            top.offer(at(&p, m, s));
        }
        assert_eq!(mbs(&top), [2, 5, 1]);
        // An equal one offered later does not displace the last kept.
        top.offer(at(&p, 6, 2.0));
        assert_eq!(mbs(&top), [2, 5, 1]);
        // The same layout again (a recompute variant that coincides), even faster: kept once.
        top.offer(at(&p, 2, 0.5));
        assert_eq!(mbs(&top), [2, 5, 1]);
        let mut none = Top::new(0);
        none.offer(at(&p, 7, 4.0));
        none.offer(at(&p, 8, 5.0));
        assert_eq!(mbs(&none), [7]);
    }

    /// Families are listed winner first, then the slower ones by how much slower, then
    /// those short of host memory, then those short of GPU memory, then those that do not
    /// divide, whatever the figures.
    #[test]
    fn verdicts_are_ordered_speed_then_host_memory_then_memory_then_divisibility() {
        let layout = String::new;
        let verdicts = [
            Verdict::Best { layout: layout(), step_time_s: 9.0 },
            Verdict::Speed { layout: layout(), step_time_s: 1.0, slower: 1.5 },
            Verdict::Speed { layout: layout(), step_time_s: 1.0, slower: 1e5 },
            Verdict::HostMemory { layout: layout(), need_gib: 1.0, have_gib: 0.5 },
            Verdict::HostMemory { layout: layout(), need_gib: 1e5, have_gib: 0.5 },
            Verdict::Memory { layout: layout(), need_gib: 0.1, have_gib: 0.05 },
            Verdict::Memory { layout: layout(), need_gib: 1e5, have_gib: 80.0 },
            Verdict::Divisibility { reason: String::new(), kind: Refusal::Other },
        ];
        for w in verdicts.windows(2) {
            assert!(order(&w[0]) < order(&w[1]), "{:?} before {:?}", w[0], w[1]);
        }
    }
}
