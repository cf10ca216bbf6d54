//! Calibration: fit a GPU type's efficiency parameters to published, measured runs.
//!
//! For one GPU type, the fit adjusts a handful of physically meaningful parameters, the
//! same for every model and layout: the large-GEMM efficiency of each format its runs
//! use (per-tensor FP8 and MXFP8 as one where the chip runs both at one peak), the
//! GEMM size at half efficiency, the attention kernels' efficiency, the
//! achieved HBM bandwidth share, the NICs' achieved bandwidth share for rings and trees,
//! and for the all-to-all (the expert-parallel dispatch and combine) where runs send
//! one across scale-up domains. It minimises
//! a robust (Cauchy) loss of the log step-time errors plus a pull towards the priors,
//! so a parameter the data cannot see stays where the priors put it. Runs whose GEMM
//! format keeps an unfitted prior are projected but not fitted to. Coordinate descent
//! with a golden-section line search on each parameter's logarithm, within bounds.
//!
//! [`cross_validate`] refits with each model family left out and predicts it: the error
//! a family nobody calibrated on would see.

use serde::Serialize;

use crate::comm::Placement;
use crate::profile::{Efficiency, GemmFormat, GpuProfile};
use crate::published::{Point, Prepared, Resolver, Stats, prepare, project_fitting};
use crate::step::LayoutSpec;
use crate::profile::Profiles;
use crate::project::Projector;

/// A parameter the fit may move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Param {
    Gemm(GemmFormat),
    /// Per-tensor FP8 and MXFP8 on a chip that runs both at one peak (Blackwell): the
    /// same FP8 tensor-core instructions, block scales or not, so one efficiency fitted
    /// to the runs of both recipes ([`GpuProfile::fp8_datapath_shared`]).
    Fp8Datapath,
    GemmHalf,
    Attention,
    Memory,
    ScaleOut,
    /// The NICs' achieved share for an all-to-all's remote traffic.
    ScaleOutA2a,
    /// Routed experts' GEMMs on the unfused path against the dense efficiency.
    GroupedGemm,
    /// Mamba-2's SSD scan.
    Ssm,
    /// The spread of a rank's step time, which a synchronous step waits on at scale.
    Straggler,
}

impl Param {
    fn get(self, e: &Efficiency) -> f64 {
        match self {
            Param::Gemm(f) => e.gemm.get(f),
            Param::Fp8Datapath => e.gemm.get(GemmFormat::Fp8),
            Param::GemmHalf => e.gemm_half_gflop,
            Param::Attention => e.attention,
            Param::Memory => e.memory,
            Param::ScaleOut => e.scale_out,
            Param::ScaleOutA2a => e.scale_out_a2a,
            Param::GroupedGemm => e.grouped_gemm,
            Param::Ssm => e.ssm,
            Param::Straggler => e.straggler,
        }
    }

    fn set(self, e: &mut Efficiency, v: f64) {
        match self {
            Param::Gemm(f) => e.gemm.set(f, v),
            Param::Fp8Datapath => {
                e.gemm.set(GemmFormat::Fp8, v);
                e.gemm.set(GemmFormat::Mxfp8, v);
            }
            Param::GemmHalf => e.gemm_half_gflop = v,
            Param::Attention => e.attention = v,
            Param::Memory => e.memory = v,
            Param::ScaleOut => e.scale_out = v,
            Param::ScaleOutA2a => e.scale_out_a2a = v,
            Param::GroupedGemm => e.grouped_gemm = v,
            Param::Ssm => e.ssm = v,
            Param::Straggler => e.straggler = v,
        }
    }

    /// How hard the fit pulls the parameter towards its prior. The scan's prior is weak
    /// evidence (one forward kernel of another implementation, on another chip, where
    /// Megatron runs mamba_ssm's Triton kernels forward and backward), so it pulls an
    /// eighth as hard: moving the scan 2.7x off it costs about what one run 8 % off does, where
    /// at the full weight a chip's three or four hybrid runs could not move it at all.
    fn prior_weight(self) -> f64 {
        match self {
            Param::Ssm => PRIOR_WEIGHT / 8.0,
            // No measurement stands behind the straggler spread's prior: the weak-scaling
            // runs move it a few percent of a step at most, so at the full weight the
            // prior would decide it.
            Param::Straggler => PRIOR_WEIGHT / 64.0,
            _ => PRIOR_WEIGHT,
        }
    }

    /// The pull of value `v` towards the prior, in squared log units, from the prior or,
    /// where the prior lies below the bounds, from the least value the fit may take: a
    /// profile may put the straggler spread at 0, where ln(v / 0) is infinite for every
    /// `v` and the line search, finding no value better than another, walked to the upper
    /// bound (a tenth of a step).
    fn pull(self, v: f64, prior: &Efficiency) -> f64 {
        self.prior_weight() * (v / self.get(prior).max(self.bounds().0)).ln().powi(2)
    }

    fn bounds(self) -> (f64, f64) {
        match self {
            Param::GemmHalf => (0.1, 200.0),
            // The fitted chips put the scan at 2-6 % of their BF16 peaks.
            Param::Ssm => (0.01, 1.0),
            // From next to nothing to a tenth of a step.
            Param::Straggler => (0.0005, 0.1),
            _ => (0.05, 1.0),
        }
    }

    pub fn name(self) -> String {
        match self {
            Param::Gemm(f) => format!("gemm.{f}"),
            Param::Fp8Datapath => "gemm.fp8+mxfp8".into(),
            Param::GemmHalf => "gemm_half_gflop".into(),
            Param::Attention => "attention".into(),
            Param::Memory => "memory".into(),
            Param::ScaleOut => "scale_out".into(),
            Param::ScaleOutA2a => "scale_out_a2a".into(),
            Param::GroupedGemm => "grouped_gemm".into(),
            Param::Ssm => "ssm".into(),
            Param::Straggler => "straggler".into(),
        }
    }
}

/// The outcome of fitting one GPU type.
#[derive(Clone, Debug, Serialize)]
pub struct Fit {
    pub gpu: String,
    pub points: usize,
    /// (parameter, prior, fitted).
    pub params: Vec<(String, f64, f64)>,
    pub before: Stats,
    pub after: Stats,
    pub efficiency: Efficiency,
    /// The parameters the file's runs set, here or on the GPU this one borrowed from
    /// (names as in `params`); every other one of `efficiency` is the prior the fit
    /// started from, which a written profile leaves out so that it does not override a
    /// fitted value it knows nothing about.
    pub from_data: Vec<String>,
    /// What this GPU's runs were too few to fit and it took from another GPU's fit:
    /// (parameter, that GPU), a sibling's where one fitted it, else the best-measured
    /// GPU's.
    pub borrowed: Vec<(String, String)>,
}

/// Weight of the pull towards the priors, per parameter, in squared log units (see
/// [`Param::prior_weight`]).
const PRIOR_WEIGHT: f64 = 0.02;
/// Scale of the robust loss on the log step-time error.
const SCALE: f64 = 0.10;

/// The Cauchy (Lorentzian) loss, c²/2 · ln(1 + (r/c)²): r²/2 for errors well under the
/// scale, like least squares, and an influence that falls for errors far past it: a run
/// 50 % off that no parameter explains (a framework regression, a recipe the model does
/// not see) pulls on the chip's efficiencies half as hard as a run 10 % off, one 2x off a
/// quarter as hard. Under Huber's loss, whose influence stays constant past the scale,
/// two such runs of
/// different models outvoted GB200's one well-measured BF16 run and halved its BF16
/// GEMM efficiency (docs/VALIDATION.md, 2026-12-01).
fn robust_loss(r: f64) -> f64 {
    0.5 * SCALE * SCALE * (r / SCALE).mul_add(r / SCALE, 1.0).ln()
}

/// One supported run: its projector, the layout (recompute to fit already added), the
/// measured step time and the model family.
#[derive(Clone)]
struct Run {
    at: usize,
    layout: LayoutSpec,
    measured: f64,
    family: String,
    /// Whether the objective counts it (its GEMM format's efficiency is fitted or
    /// borrowed from a fit); every run counts in the before/after figures.
    fitted: bool,
}

/// The runs of one GPU type, ready to re-project under new efficiencies.
struct Runs<'p, 's> {
    prep: &'p mut Prepared<'s>,
    runs: Vec<Run>,
}

impl Runs<'_, '_> {
    fn errors(&mut self, gpu: &GpuProfile) -> Vec<f64> {
        self.errors_of(gpu, false)
    }

    /// Log step-time errors of every run, or of the fitted ones only.
    fn errors_of(&mut self, gpu: &GpuProfile, fitted_only: bool) -> Vec<f64> {
        self.errors_where(gpu, |_, r| r.fitted || !fitted_only).into_iter().flatten().collect()
    }

    /// Each run's log step-time error, in run order: `None` where it does not project, or
    /// is not one `keep` (its index, the run) asks for, which is not projected at all.
    fn errors_where(&mut self, gpu: &GpuProfile, keep: impl Fn(usize, &Run) -> bool) -> Vec<Option<f64>> {
        let mut out = Vec::with_capacity(self.runs.len());
        let mut last: Option<usize> = None;
        for (i, r) in self.runs.iter().enumerate() {
            if !keep(i, r) {
                out.push(None);
                continue;
            }
            let pr = &mut self.prep.projectors[r.at];
            if last != Some(r.at) || pr.gpu.efficiency != gpu.efficiency {
                pr.set_gpu(gpu.clone());
            }
            last = Some(r.at);
            out.push(pr.project(&r.layout).ok().map(|p| (p.step_time_s / r.measured).ln()));
        }
        out
    }

    fn objective(&mut self, gpu: &GpuProfile, prior: &Efficiency, params: &[Param]) -> f64 {
        let fit: f64 = self.errors_of(gpu, true).iter().map(|&r| robust_loss(r)).sum();
        let pull: f64 = params.iter().map(|p| p.pull(p.get(&gpu.efficiency), prior)).sum();
        fit + pull
    }
}

/// Runs a GPU needs before its shared parameters (GEMM size curve, attention, memory,
/// network) are fitted rather than taken from the best-measured GPU.
pub const SHARED_MIN_RUNS: usize = 10;
/// Runs, from at least two model families, a GEMM format needs on a GPU before its
/// efficiency is fitted: fewer would fit one model's quirks, not the chip.
pub const FORMAT_MIN_RUNS: usize = 3;

/// The GEMM format a run's efficiency is fitted under: its recipe's, with per-tensor FP8
/// and MXFP8 as one on a chip that runs them at one peak.
fn fitted_format(pr: &Projector<'_>) -> GemmFormat {
    match pr.plan.recipe.format() {
        GemmFormat::Fp8 if pr.gpu.fp8_datapath_shared() => GemmFormat::Mxfp8,
        f => f,
    }
}

/// The parameter holding format `f`'s GEMM efficiency on a GPU (`shared`: one that runs
/// per-tensor FP8 and MXFP8 at one peak).
fn format_param(f: GemmFormat, shared: bool) -> Param {
    match f {
        GemmFormat::Fp8 | GemmFormat::Mxfp8 if shared => Param::Fp8Datapath,
        f => Param::Gemm(f),
    }
}

/// Which parameters the runs of a GPU can inform: the GEMM efficiency of each format
/// enough runs of enough models use, the unfused grouped GEMMs' share where as many
/// runs of as many models route tokens to experts on that path, and, with enough runs,
/// the shared ones (each NIC efficiency only where some run crosses the scale-up domain
/// with that traffic).
fn params_for(prep: &Prepared<'_>, runs: &[Run]) -> Vec<Param> {
    let mut by_format: std::collections::BTreeMap<GemmFormat, (usize, std::collections::BTreeSet<String>)> =
        std::collections::BTreeMap::new();
    let mut network = false;
    let mut a2a = false;
    let mut tied = false;
    let mut grouped: (usize, std::collections::BTreeSet<String>) = Default::default();
    // Hybrid models: one plugin family holds them all, so their models must differ.
    let mut scans: (usize, std::collections::BTreeSet<String>) = Default::default();
    for r in runs {
        let pr = &prep.projectors[r.at];
        if pr.model.shape.experts > 0 && !r.layout.kernels.fused_grouped_mlp {
            grouped.0 += 1;
            grouped.1.insert(r.family.clone());
        }
        if hybrid(prep, r) {
            scans.0 += 1;
            scans.1.insert(pr.model.name.clone());
        }
        tied |= pr.gpu.fp8_datapath_shared();
        let f = fitted_format(pr);
        let e = by_format.entry(f).or_default();
        e.0 += 1;
        e.1.insert(r.family.clone());
        network |= r.layout.gpus() > u64::from(pr.gpu.scale_up_domain);
        let ep = Placement { size: r.layout.ep, stride: r.layout.etp.max(1) };
        a2a |= r.layout.ep > 1 && !pr.gpu.fabric().members_per_domain(ep).1;
    }
    let mut p: Vec<Param> = by_format
        .into_iter()
        .filter(|(_, (n, fams))| *n >= FORMAT_MIN_RUNS && fams.len() >= 2)
        .map(|(f, _)| format_param(f, tied))
        .collect();
    if grouped.0 >= FORMAT_MIN_RUNS && grouped.1.len() >= 2 {
        p.push(Param::GroupedGemm);
    }
    if scans.0 >= FORMAT_MIN_RUNS && scans.1.len() >= 2 {
        p.push(Param::Ssm);
    }
    if weak_scaling_runs(prep, runs) >= FORMAT_MIN_RUNS {
        p.push(Param::Straggler);
    }
    if runs.len() >= SHARED_MIN_RUNS {
        p.extend([Param::GemmHalf, Param::Attention, Param::Memory]);
        if network {
            p.push(Param::ScaleOut);
        }
        if a2a {
            p.push(Param::ScaleOutA2a);
        }
    }
    p
}

/// GPU counts apart two runs of one layout must be for their difference to measure the
/// wait for stragglers.
const WEAK_SCALING_SPAN: u64 = 4;

/// Each run's weak-scaling series, if it is in one: the runs of one layout per GPU (model
/// and sequence length, recipe, tp, pp, cp, vp, ep, etp, micro-batch, micro-batches per
/// step) at GPU counts of which some two are at least [`WEAK_SCALING_SPAN`] apart. Within
/// a series only the wait for stragglers (and the little data-parallel traffic a larger
/// count adds) differs, so the series pin the straggler spread whatever the other
/// parameters are; runs at another sequence length or batch per GPU would differ by the
/// efficiencies' errors as well. Recompute is not part of the key: where a run does not
/// publish it, the layout resolved for it may recompute a few layers more at one count
/// than at another to fit memory (the MaxText Llama 3 70B pair), the same run otherwise.
fn weak_scaling_series(prep: &Prepared<'_>, runs: &[Run]) -> Vec<Option<usize>> {
    type Key = (String, u32, String, [u32; 7], u64);
    let key = |r: &Run| -> Key {
        let (pr, l) = (&prep.projectors[r.at], &r.layout);
        let per_step = u64::from(l.gbs) / (u64::from(l.dp) * u64::from(l.mbs)).max(1);
        (pr.model.name.clone(), pr.model.seq_len, pr.plan.recipe.name().to_string(), [l.tp, l.pp, l.cp, l.vp, l.ep, l.etp, l.mbs], per_step)
    };
    let mut groups: std::collections::BTreeMap<Key, (u64, u64)> = std::collections::BTreeMap::new();
    for r in runs {
        let g = groups.entry(key(r)).or_insert((u64::MAX, 0));
        *g = (g.0.min(r.layout.gpus()), g.1.max(r.layout.gpus()));
    }
    let ids: Vec<Key> = groups.iter().filter(|(_, (lo, hi))| *hi >= WEAK_SCALING_SPAN * *lo).map(|(k, _)| k.clone()).collect();
    runs.iter().map(|r| ids.iter().position(|k| *k == key(r))).collect()
}

fn weak_scaling_runs(prep: &Prepared<'_>, runs: &[Run]) -> usize {
    weak_scaling_series(prep, runs).iter().flatten().count()
}

/// Fit the straggler spread alone to the weak-scaling series: each run's log error less
/// its series' mean, so how fast the step grows with the GPU count decides it, not how
/// far every run of a series sits from its measurement (which the other parameters set).
fn fit_spread(r: &mut Runs<'_, '_>, current: &mut GpuProfile, prior: &Efficiency, series: &[Option<usize>]) {
    let p = Param::Straggler;
    let (lo, hi) = p.bounds();
    let mut trial = current.clone();
    let best = golden(
        |x| {
            p.set(&mut trial.efficiency, x.exp());
            // Only the series' runs: the others do not enter the loss.
            let e = r.errors_where(&trial, |i, _| series[i].is_some());
            let mut sums: std::collections::HashMap<usize, (f64, usize)> = std::collections::HashMap::new();
            for (s, e) in series.iter().zip(&e) {
                if let (Some(s), Some(e)) = (s, e) {
                    let t = sums.entry(*s).or_default();
                    *t = (t.0 + e, t.1 + 1);
                }
            }
            let fit: f64 = series
                .iter()
                .zip(&e)
                .filter_map(|(s, e)| {
                    let (sum, n) = sums.get(&(*s)?)?;
                    Some(robust_loss(e.as_ref()? - sum / *n as f64))
                })
                .sum();
            fit + p.pull(p.get(&trial.efficiency), prior)
        },
        lo.ln(),
        hi.ln(),
        30,
    );
    p.set(&mut current.efficiency, best.exp());
}

/// Whether a run's model has Mamba-2 scans (a hybrid).
fn hybrid(prep: &Prepared<'_>, r: &Run) -> bool {
    prep.projectors[r.at].model.shape.scans > 0
}

/// The parameters a GPU's runs inform, in the two stages the fit takes them: every
/// parameter the runs without Mamba scans inform, from those runs alone; then the scan's
/// efficiency (`true`) from the hybrid runs, the first stage's values held. A hybrid's
/// Mamba layers cost more than any op of its graph shows (docs/VALIDATION.md, item 10);
/// fitted jointly, its runs pulled the HBM, expert and NVFP4 efficiencies off what the
/// other runs measure to explain that, and moved those runs (their p90 18.1 -> 22.3 %).
fn stages(prep: &Prepared<'_>, runs: &[Run]) -> (Vec<Param>, bool) {
    let plain: Vec<Run> = runs.iter().filter(|r| !hybrid(prep, r)).cloned().collect();
    (params_for(prep, &plain), params_for(prep, runs).contains(&Param::Ssm))
}

/// Coordinate descent over `params` (a golden-section search on each one's logarithm,
/// within its bounds), from `current`.
fn descend(r: &mut Runs<'_, '_>, current: &mut GpuProfile, prior: &Efficiency, params: &[Param]) {
    for _sweep in 0..6 {
        for &p in params {
            let (lo, hi) = p.bounds();
            let mut trial = current.clone();
            let best = golden(
                |x| {
                    p.set(&mut trial.efficiency, x.exp());
                    r.objective(&trial, prior, params)
                },
                lo.ln(),
                hi.ln(),
                24,
            );
            p.set(&mut current.efficiency, best.exp());
        }
    }
}

pub(crate) fn golden(mut f: impl FnMut(f64) -> f64, lo: f64, hi: f64, iters: usize) -> f64 {
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let (mut a, mut b) = (lo, hi);
    let mut c = b - g * (b - a);
    let mut d = a + g * (b - a);
    let (mut fc, mut fd) = (f(c), f(d));
    for _ in 0..iters {
        if fc < fd {
            b = d;
            d = c;
            fd = fc;
            c = b - g * (b - a);
            fc = f(c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + g * (b - a);
            fd = f(d);
        }
    }
    if fc < fd { c } else { d }
}

/// Fit `gpu` to the runs `prep.runs` selects (already fitted to memory), starting from
/// its current efficiency table. Where the runs cannot fit the scan, `scan_tflops` (a
/// fitted sibling's scan rate, else the best-measured GPU's) sets it: the fitted chips
/// agree in rate (H100 and
/// GB300 near 55-60 TFLOP/s) where their shares of the peak differ 2.7x
/// (docs/VALIDATION.md, item 11).
fn fit_runs(prep: &mut Prepared<'_>, gpu: &GpuProfile, runs: Vec<Run>, label: &str, scan_tflops: Option<f64>) -> Fit {
    let informing: Vec<Run> = runs.iter().filter(|r| r.fitted).cloned().collect();
    let (first, ssm) = stages(prep, &informing);
    let hybrids: Vec<bool> = runs.iter().map(|r| hybrid(prep, r)).collect();
    let mut current = gpu.clone();
    if let Some(rate) = scan_tflops.filter(|_| !ssm) {
        current.efficiency.ssm = (rate / gpu.peak_tflops.bf16).min(1.0);
    }
    let prior = current.efficiency.clone();
    let n = informing.len();
    let mut r = Runs { prep, runs };
    let before = Stats::of(r.errors(&current).iter().map(|e| e.exp() - 1.0));
    let fitted: Vec<bool> = r.runs.iter().map(|x| x.fitted).collect();
    let count = |r: &mut Runs<'_, '_>, hybrid: bool| {
        for ((run, &f), &h) in r.runs.iter_mut().zip(&fitted).zip(&hybrids) {
            run.fitted = f && h == hybrid;
        }
    };
    count(&mut r, false);
    // The straggler spread from the weak-scaling series alone, around the others' fit.
    let spread = first.contains(&Param::Straggler);
    let first: Vec<Param> = first.into_iter().filter(|p| *p != Param::Straggler).collect();
    // Hybrid runs inform the scan alone, here too.
    let series: Vec<Option<usize>> =
        weak_scaling_series(r.prep, &r.runs).into_iter().zip(&hybrids).map(|(s, &h)| s.filter(|_| !h)).collect();
    for _ in 0..if spread { 2 } else { 1 } {
        if spread {
            fit_spread(&mut r, &mut current, &prior, &series);
        }
        descend(&mut r, &mut current, &prior, &first);
    }
    let mut params = first;
    if spread {
        params.push(Param::Straggler);
    }
    if ssm {
        count(&mut r, true);
        descend(&mut r, &mut current, &prior, &[Param::Ssm]);
        params.push(Param::Ssm);
    }
    for (run, f) in r.runs.iter_mut().zip(fitted) {
        run.fitted = f;
    }
    let after = Stats::of(r.errors(&current).iter().map(|e| e.exp() - 1.0));
    current.efficiency.fitted = label.to_string();
    Fit {
        gpu: gpu.name.clone(),
        points: n,
        params: params.iter().map(|&p| (p.name(), p.get(&prior), p.get(&current.efficiency))).collect(),
        before,
        after,
        efficiency: current.efficiency,
        from_data: params.iter().map(|p| p.name()).collect(),
        borrowed: Vec::new(),
    }
}

/// The supported runs of `prep` on `gpu` (optionally one precision), each with the
/// recompute it needs to fit and its measured step time.
fn runs_on(prep: &mut Prepared<'_>, points: &[Point], gpu: &str, precision: Option<&str>) -> Vec<Run> {
    let mut out = Vec::new();
    for (i, at, layout, family, _) in prep.runs.clone() {
        let pr = &mut prep.projectors[at];
        if !pr.gpu.name.eq_ignore_ascii_case(gpu) || precision.is_some_and(|p| !pr.plan.recipe.name().eq_ignore_ascii_case(p)) {
            continue;
        }
        let Some(measured) = points[i].measured_step() else { continue };
        let Ok((p, _)) = project_fitting(pr, &layout) else { continue };
        out.push(Run { at, layout: p.layout, measured, family, fitted: true });
    }
    out
}

/// The GPU whose runs set `p`: `donor`, or where it took `p` itself, its own donor.
fn origin(p: Param, donor: &Fit) -> String {
    let name = p.name();
    donor.borrowed.iter().find(|(n, _)| *n == name).map_or_else(|| donor.gpu.clone(), |(_, o)| o.clone())
}

/// Whether a fit's runs set `p` (`from_data`, names as in [`Fit::params`]); a donor
/// names its FP8 efficiency after its own datapath.
fn donor_fitted(p: Param, from_data: &[String]) -> bool {
    match p {
        Param::Gemm(GemmFormat::Fp8) | Param::Fp8Datapath => {
            [Param::Gemm(GemmFormat::Fp8).name(), Param::Fp8Datapath.name()].iter().any(|n| from_data.contains(n))
        }
        _ => from_data.contains(&p.name()),
    }
}

/// Fit every GPU type `points` has runs for (or just `only`, optionally one precision).
pub fn calibrate(
    points: &[Point],
    profiles: &Profiles,
    resolver: &mut dyn Resolver,
    only: Option<(&str, Option<&str>)>,
    label: &str,
    progress: &dyn Fn(&str),
) -> Result<Vec<Fit>, String> {
    let mut prep = prepare(points, profiles, resolver, progress);
    let mut gpus: Vec<String> = prep.projectors.iter().map(|p| p.gpu.name.clone()).collect();
    gpus.sort();
    gpus.dedup();
    if let Some((g, _)) = only {
        let name = profiles.get(g)?.name.clone();
        gpus.retain(|x| *x == name);
        if gpus.is_empty() {
            return Err(format!("the file has no supported run on {name}"));
        }
    }
    // The GPU with the most runs first: GPUs with too few runs to fit the shared
    // parameters take them from it (same kernels and libraries, another chip).
    let mut runs: Vec<(String, Vec<Run>)> =
        gpus.into_iter().map(|g| { let r = runs_on(&mut prep, points, &g, only.and_then(|o| o.1)); (g, r) }).collect();
    runs.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
    let mut fits: Vec<Fit> = Vec::new();
    // The best-measured GPU: the first fitted with enough runs of its own (in `fits`).
    let mut best: Option<usize> = None;
    for (g, r) in runs {
        if r.is_empty() {
            continue;
        }
        progress(&format!("fitting {g} ({} runs)", r.len()));
        let mut gpu = profiles.get(&g)?.clone();
        // Hybrid runs inform the scan's efficiency alone ([`stages`]).
        let plain: Vec<Run> = r.iter().filter(|x| !hybrid(&prep, x)).cloned().collect();
        let own = plain.len() >= SHARED_MIN_RUNS;
        let fitted_here = params_for(&prep, &plain);
        let mut known = fitted_here.clone();
        let mut borrowed: Vec<(String, String)> = Vec::new();
        // The scan's rate in TFLOP/s, where this GPU's hybrid runs cannot fit it.
        let mut scan_tflops: Option<f64> = None;
        if let Some(b) = best {
            // Where this GPU's runs cannot speak, take what a fitted sibling's runs set
            // (the same die or architecture: its kernels, clocks and memory system), else
            // the best-measured GPU's (the unfused MoE path's share included: the same
            // software on another chip).
            let siblings: Vec<&Fit> =
                gpu.siblings.iter().filter_map(|s| fits.iter().find(|f| f.gpu.eq_ignore_ascii_case(s))).collect();
            let donor = |p: Param| siblings.iter().copied().find(|f| donor_fitted(p, &f.from_data)).unwrap_or(&fits[b]);
            let fp8 = format_param(GemmFormat::Fp8, gpu.fp8_datapath_shared());
            let mut take = vec![Param::Gemm(GemmFormat::Bf16), fp8, Param::GroupedGemm, Param::Straggler];
            if !own {
                take.extend([Param::GemmHalf, Param::Attention, Param::Memory, Param::ScaleOut, Param::ScaleOutA2a]);
            }
            for p in take.into_iter().filter(|p| !fitted_here.contains(p)) {
                let d = donor(p);
                p.set(&mut gpu.efficiency, p.get(&d.efficiency));
                known.push(p);
                if donor_fitted(p, &d.from_data) {
                    borrowed.push((p.name(), origin(p, d)));
                }
            }
            let d = donor(Param::Ssm);
            scan_tflops = Some(d.efficiency.ssm * profiles.get(&d.gpu)?.peak_tflops.bf16);
            if donor_fitted(Param::Ssm, &d.from_data) {
                borrowed.push((Param::Ssm.name(), origin(Param::Ssm, d)));
            }
        }
        // A run whose GEMM format keeps its unfitted prior (too few runs or families,
        // here or on the GPU it borrows from) would push that prior's error into the
        // shared parameters (attention, HBM): it is projected, not fitted to.
        let r: Vec<Run> = r
            .into_iter()
            .map(|run| {
                let pr = &prep.projectors[run.at];
                Run { fitted: known.contains(&format_param(fitted_format(pr), pr.gpu.fp8_datapath_shared())), ..run }
            })
            .collect();
        let mut fit = fit_runs(&mut prep, &gpu, r, label, scan_tflops);
        for (name, donor) in borrowed {
            if !fit.from_data.contains(&name) {
                fit.from_data.push(name.clone());
                fit.borrowed.push((name, donor));
            }
        }
        if own && best.is_none() {
            best = Some(fits.len());
        }
        fits.push(fit);
    }
    Ok(fits)
}

/// One family's error when the fit never saw it.
#[derive(Clone, Debug, Serialize)]
pub struct HeldOut {
    pub gpu: String,
    pub family: String,
    pub errors: Vec<f64>,
}

/// Leave-one-family-out: for each GPU type (or just `only`'s, optionally its runs of one
/// precision, as [`calibrate`] fits them) and model family with runs on it, fit on the
/// other families' runs and predict the held-out family. Each GPU is fitted on its own
/// runs alone, so one GPU's rows are the same held out alone or beside the others.
///
/// # Errors
/// `only` names a GPU no profile describes, or one (or a precision of it) the file has
/// no supported run on.
pub fn cross_validate(points: &[Point], profiles: &Profiles, resolver: &mut dyn Resolver, only: Option<(&str, Option<&str>)>) -> Result<Vec<HeldOut>, String> {
    let only = only.map(|(g, p)| profiles.get(g).map(|g| (g.name.clone(), p))).transpose()?;
    let mut prep = prepare(points, profiles, resolver, &|_| {});
    let mut out = Vec::new();
    let precision = only.as_ref().and_then(|o| o.1);
    let mut keys: Vec<(String, String)> = prep
        .runs
        .iter()
        .filter(|(_, at, ..)| {
            let pr = &prep.projectors[*at];
            only.as_ref().is_none_or(|(g, _)| pr.gpu.name == *g) && precision.is_none_or(|p| pr.plan.recipe.name().eq_ignore_ascii_case(p))
        })
        .map(|(_, at, _, fam, _)| (prep.projectors[*at].gpu.name.clone(), fam.clone()))
        .collect();
    if let Some((gpu, precision)) = &only
        && keys.is_empty()
    {
        return Err(format!("the file has no supported {}run on {gpu}", precision.map_or(String::new(), |p| format!("{} ", p.to_uppercase()))));
    }
    keys.sort();
    keys.dedup();
    for (gpu, family) in keys {
        let runs_all: Vec<Run> = runs_on(&mut prep, points, &gpu, precision);
        let train: Vec<Run> = runs_all.iter().filter(|r| r.family != family).cloned().collect();
        let test: Vec<Run> = runs_all.iter().filter(|r| r.family == family).cloned().collect();
        if train.is_empty() || test.is_empty() {
            continue;
        }
        let Ok(base) = profiles.get(&gpu).cloned() else { continue };
        let fit = fit_runs(&mut prep, &base, train, "cross-validation", None);
        let mut g = base.clone();
        g.efficiency = fit.efficiency;
        let mut r = Runs { prep: &mut prep, runs: test };
        out.push(HeldOut { gpu, family, errors: r.errors(&g).iter().map(|e| e.exp() - 1.0).collect() });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line search returns the better of the two points it ends between: with no
    /// narrowing, the golden points of [0, 1] (0.382 and 0.618), the one nearer the minimum.
    #[test]
    fn golden_returns_the_better_of_its_last_two_points() {
        let g = (5f64.sqrt() - 1.0) / 2.0;
        assert_eq!(golden(|x| (x - 0.7) * (x - 0.7), 0.0, 1.0, 0), g);
        assert_eq!(golden(|x| (x - 0.3) * (x - 0.3), 0.0, 1.0, 0), 1.0 - g);
        let x = golden(|x| (x - 0.3) * (x - 0.3), 0.0, 1.0, 40);
        assert!((x - 0.3).abs() < 1e-7, "{x}");
    }
}
