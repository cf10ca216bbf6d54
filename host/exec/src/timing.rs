//! The timing harness: warm-up steps, then N timed steps of forward, backward and AdamW,
//! reported as median and spread (p10/p90) per phase, per step and per op.
//!
//! Medians, not means: a step on a shared machine sometimes loses a scheduler slice, and
//! one slow repeat should not move the figure a projection is built on. p10/p90 show how
//! noisy the run was. Communication is reported on its own: the seconds a sharded rank
//! spent inside collective calls (its forward and backward collective ops, which those
//! phases include, and the step's gradient reduction, which they do not); 0 unsharded.

use serde::Serialize;

use crate::device::{Device, ExecError};
use crate::executor::{Executor, Input};
use runner_kernels::cpu::adamw::AdamW;

/// Summary of repeated measurements, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Stat {
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Stat {
    /// Summary of `xs` (all zero for an empty slice). Percentiles interpolate linearly
    /// between order statistics.
    pub fn of(xs: &[f64]) -> Stat {
        if xs.is_empty() {
            return Stat::default();
        }
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        let q = |p: f64| {
            let pos = p * (v.len() - 1) as f64;
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
        };
        Stat {
            median: q(0.5),
            p10: q(0.1),
            p90: q(0.9),
            min: v[0],
            max: v[v.len() - 1],
            n: v.len(),
        }
    }
}

/// Times of one op over the repeats.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpTiming {
    pub name: String,
    pub kind: String,
    /// Transformer layer, or -1 outside the stack.
    pub layer: i32,
    pub forward: Stat,
    /// Zero for ops with no backward step.
    pub backward: Stat,
    /// Its re-runs inside the backward under activation recomputation (0 without).
    pub recompute: Stat,
}

/// What [`time_steps`] measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepTiming {
    pub device: String,
    pub warmup: usize,
    pub repeats: usize,
    /// Whole step (forward + backward + gradient reduction + optimizer).
    pub step: Stat,
    pub forward: Stat,
    pub backward: Stat,
    pub optimizer: Stat,
    /// Seconds inside collective calls (overlapping `forward` and `backward`, which
    /// include their collective ops); 0 on a single device.
    pub communication: Stat,
    /// The part of `backward` spent re-running forward segments (activation recompute).
    pub recompute: Stat,
    /// Loss of each timed step.
    pub losses: Vec<f32>,
    pub ops: Vec<OpTiming>,
    /// Median AdamW seconds of each weight, by tensor name (for per-layer attribution).
    pub optimizer_by_weight: Vec<(String, f64)>,
}

/// Harness settings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TimingOptions {
    pub warmup: usize,
    pub repeats: usize,
}

impl Default for TimingOptions {
    fn default() -> Self {
        TimingOptions {
            warmup: 1,
            repeats: 5,
        }
    }
}

/// Run `opts.warmup` untimed and `opts.repeats` timed training steps of `ex` on the
/// same `inputs`, with per-op profiling on (and after them, failed or not, as the
/// executor had it: [`Executor::profiling`]). `on_step(step, steps, warmup)` is called as
/// each step begins (`step` from 1 of `steps` in all, `warmup` for an untimed one), so a
/// caller can show progress through steps that may each take a minute on a CPU.
///
/// # Errors
/// Whatever a step returns; `repeats == 0`.
pub fn time_steps<D: Device>(
    ex: &mut Executor<D>,
    inputs: &[(&str, Input<'_>)],
    adamw: &AdamW,
    opts: TimingOptions,
    on_step: &mut dyn FnMut(usize, usize, bool),
) -> Result<StepTiming, ExecError> {
    if opts.repeats == 0 {
        return Err(ExecError::State("timing needs at least one repeat".into()));
    }
    // A recorded step (CUDA graph) has no per-op clock: only whole steps are timed, and
    // the first two steps (eager, then recorded) are warm-up whatever was asked. The
    // executor's own setting comes back after, whether the steps ran or one failed.
    let was = ex.profiling();
    ex.set_profile(!ex.cuda_graph());
    let r = timed_steps(ex, inputs, adamw, opts, on_step);
    ex.set_profile(was);
    r
}

/// [`time_steps`] with profiling set as it wants.
fn timed_steps<D: Device>(
    ex: &mut Executor<D>,
    inputs: &[(&str, Input<'_>)],
    adamw: &AdamW,
    opts: TimingOptions,
    on_step: &mut dyn FnMut(usize, usize, bool),
) -> Result<StepTiming, ExecError> {
    let opts = if ex.cuda_graph() { TimingOptions { warmup: opts.warmup.max(2), ..opts } } else { opts };
    let steps = opts.warmup + opts.repeats;
    for i in 0..opts.warmup {
        on_step(i + 1, steps, true);
        ex.step(inputs, adamw)?;
    }
    let nops = ex.graph().ops.len();
    let nt = ex.graph().tensors.len();
    let (mut fwd, mut bwd, mut opt, mut step) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut comm = Vec::new();
    let mut per_op_f = vec![Vec::new(); nops];
    let mut per_op_b = vec![Vec::new(); nops];
    let mut per_op_r = vec![Vec::new(); nops];
    let mut rec = Vec::new();
    let mut per_w = vec![Vec::new(); nt];
    let mut losses = Vec::new();
    for i in 0..opts.repeats {
        on_step(opts.warmup + i + 1, steps, false);
        let t0 = std::time::Instant::now();
        losses.push(ex.step(inputs, adamw)?);
        ex.device().synchronize()?;
        step.push(t0.elapsed().as_secs_f64());
        let p = ex.profile();
        fwd.push(p.forward_s);
        bwd.push(p.backward_s);
        rec.push(p.recompute_s);
        opt.push(p.optimizer_s);
        comm.push(p.communication_s);
        for i in 0..nops {
            per_op_f[i].push(p.forward_op_s[i]);
            per_op_b[i].push(p.backward_op_s[i]);
            per_op_r[i].push(p.recompute_op_s[i]);
        }
        for (w, &s) in per_w.iter_mut().zip(&p.optimizer_tensor_s) {
            w.push(s);
        }
    }
    let g = ex.graph();
    let ops = g
        .ops
        .iter()
        .enumerate()
        .map(|(i, op)| OpTiming {
            name: op.name.clone(),
            kind: format!("{:?}", op.kind),
            layer: op.layer,
            forward: Stat::of(&per_op_f[i]),
            backward: Stat::of(&per_op_b[i]),
            recompute: Stat::of(&per_op_r[i]),
        })
        .collect();
    let optimizer_by_weight = g
        .tensors
        .iter()
        .enumerate()
        .filter(|(i, _)| per_w[*i].iter().any(|&s| s > 0.0))
        .map(|(i, t)| (t.name.clone(), Stat::of(&per_w[i]).median))
        .collect();
    Ok(StepTiming {
        device: ex.device().name(),
        warmup: opts.warmup,
        repeats: opts.repeats,
        step: Stat::of(&step),
        forward: Stat::of(&fwd),
        backward: Stat::of(&bwd),
        optimizer: Stat::of(&opt),
        communication: Stat::of(&comm),
        recompute: Stat::of(&rec),
        losses,
        ops,
        optimizer_by_weight,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let s = Stat::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!((s.median, s.min, s.max, s.n), (3.0, 1.0, 5.0, 5));
        assert!((s.p10 - 1.4).abs() < 1e-12 && (s.p90 - 4.6).abs() < 1e-12);
        assert_eq!(Stat::of(&[]).n, 0);
    }

    /// An even count: the median is halfway between the middle two, and p10/p90 sit at
    /// p·(n−1) between order statistics. Skewed values, so a mean is not a median.
    #[test]
    fn median_of_an_even_count_is_halfway_between_the_middle_two() {
        let s = Stat::of(&[10.0, 1.0, 4.0, 2.0]);
        // Sorted 1 2 4 10. Median at 1.5: (2 + 4) / 2 = 3. p10 at 0.3: 1 + 0.3 × 1 = 1.3.
        // p90 at 2.7: 4 + 0.7 × 6 = 8.2.
        assert!((s.median - 3.0).abs() < 1e-12, "{s:?}");
        assert!((s.p10 - 1.3).abs() < 1e-12 && (s.p90 - 8.2).abs() < 1e-12, "{s:?}");
        assert_eq!((s.min, s.max, s.n), (1.0, 10.0, 4));
        let one = Stat::of(&[7.0]);
        assert_eq!((one.median, one.p10, one.p90, one.min, one.max, one.n), (7.0, 7.0, 7.0, 7.0, 7.0, 1));
    }

    /// Percentiles sit at p·(n − 1) between order statistics, interpolated: with 11
    /// samples p10 and p90 are the 2nd and 10th exactly, with 6 the median is halfway
    /// between the 3rd and 4th and p10 half the way from the 1st to the 2nd (not the
    /// nearest rank, nor p·n). Skewed, unsorted values, so no two rules agree by chance.
    #[test]
    fn percentiles_interpolate_at_p_times_n_minus_one() {
        let eleven = [9.0, 0.0, 100.0, 1.0, 4.0, 25.0, 16.0, 36.0, 49.0, 64.0, 81.0];
        let s = Stat::of(&eleven);
        assert_eq!((s.p10, s.median, s.p90, s.min, s.max, s.n), (1.0, 25.0, 81.0, 0.0, 100.0, 11), "{s:?}");
        // Sorted 1 2 4 8 16 64: median at 2.5 (4 + 0.5 × 4 = 6), p10 at 0.5 (1.5), p90 at
        // 4.5 (16 + 0.5 × 48 = 40).
        let s = Stat::of(&[64.0, 2.0, 16.0, 1.0, 8.0, 4.0]);
        assert_eq!((s.p10, s.median, s.p90, s.min, s.max, s.n), (1.5, 6.0, 40.0, 1.0, 64.0, 6), "{s:?}");
    }

    /// A NaN among the samples does not panic (the sort is a total order, NaN above
    /// every number): it counts, it shows as the max, and the median of the rest stays.
    #[test]
    fn a_nan_sample_sorts_last_and_does_not_panic() {
        let s = Stat::of(&[3.0, f64::NAN, 1.0, 2.0, 5.0]);
        assert_eq!((s.median, s.min, s.n), (3.0, 1.0, 5), "{s:?}");
        assert!(s.max.is_nan() && s.p90.is_nan() && (s.p10 - 1.4).abs() < 1e-12, "{s:?}");
        let all = Stat::of(&[f64::NAN, f64::NAN]);
        assert!(all.median.is_nan() && all.n == 2, "{all:?}");
    }

    fn toy_executor() -> (runner_graph::Graph, Executor<crate::cpu::Cpu>) {
        let g = crate::toy::llama(&crate::toy::ToyConfig { hidden: 16, ffn: 32, ..crate::toy::ToyConfig::tiny() });
        let ex = Executor::new(&g, crate::cpu::Cpu::new(), crate::executor::ExecOptions::default()).unwrap();
        (g, ex)
    }

    fn run(ex: &mut Executor<crate::cpu::Cpu>, g: &runner_graph::Graph, warmup: usize, repeats: usize) -> Result<StepTiming, ExecError> {
        let data = crate::proxy::synthetic_inputs(g, 0);
        let inputs: Vec<(&str, Input<'_>)> = data.iter().map(|(n, u, _)| (n.as_str(), Input::U32(u))).collect();
        time_steps(ex, &inputs, &crate::executor::ADAMW_DEFAULT, TimingOptions { warmup, repeats }, &mut |_, _, _| {})
    }

    /// Warm-up steps are real training steps (they update the weights) that are not
    /// timed: after two warm-up steps the one timed step is the third step of the same
    /// run, the one whose loss a run of three timed steps from the same start reports
    /// last. No repeats is an error, not an empty timing.
    #[test]
    fn warm_up_steps_train_but_are_not_timed() {
        let (g, mut ex) = toy_executor();
        let warm = run(&mut ex, &g, 2, 1).unwrap();
        assert_eq!((warm.warmup, warm.repeats, warm.step.n, warm.losses.len()), (2, 1, 1, 1));
        let (_, mut ex) = toy_executor();
        let cold = run(&mut ex, &g, 0, 3).unwrap();
        assert_eq!((cold.warmup, cold.repeats, cold.step.n), (0, 3, 3));
        assert!(cold.losses[0] != cold.losses[2], "{:?}", cold.losses);
        assert_eq!(warm.losses[0], cold.losses[2], "{:?} vs {:?}", warm.losses, cold.losses);
        assert!(run(&mut ex, &g, 1, 0).is_err());
    }

    /// `on_step(step, steps, warmup)` comes once per step before it runs, numbered from
    /// 1 over the warm-up and timed steps together, the warm-up ones marked. A recorded
    /// step (CUDA graph) warms up at least two steps whatever was asked: on the CPU,
    /// which cannot record, the first step fails, announced as the first of 2 + 3.
    #[test]
    fn progress_numbers_every_step_and_marks_the_warm_up() {
        let (g, mut ex) = toy_executor();
        let data = crate::proxy::synthetic_inputs(&g, 0);
        let inputs: Vec<(&str, Input<'_>)> = data.iter().map(|(n, u, _)| (n.as_str(), Input::U32(u))).collect();
        let mut seen = Vec::new();
        let t = time_steps(&mut ex, &inputs, &crate::executor::ADAMW_DEFAULT, TimingOptions { warmup: 2, repeats: 3 }, &mut |s, n, w| seen.push((s, n, w))).unwrap();
        assert_eq!(seen, [(1, 5, true), (2, 5, true), (3, 5, false), (4, 5, false), (5, 5, false)]);
        assert_eq!((t.losses.len(), ex.steps_taken()), (3, 5));
        let opts = crate::executor::ExecOptions { cuda_graph: true, ..Default::default() };
        let mut ex = Executor::new(&g, crate::cpu::Cpu::new(), opts).unwrap();
        let mut seen = Vec::new();
        let r = time_steps(&mut ex, &inputs, &crate::executor::ADAMW_DEFAULT, TimingOptions { warmup: 0, repeats: 3 }, &mut |s, n, w| seen.push((s, n, w)));
        assert!(r.is_err());
        assert_eq!(seen, [(1, 5, true)]);
    }

    /// Over one timed step each figure is that step's one sample, so each must be what
    /// the executor's profile holds after it: phase by phase, op by op (forward,
    /// backward, re-run) and weight by weight. Under full recompute, so no clock the
    /// harness could read instead is zero; the clocks differ, so a figure read from
    /// another one (forward from backward, a re-run from a backward, ...) shows. The
    /// step's own clock encloses its phases. Unsharded, the communication is 0.
    #[test]
    fn one_timed_step_reports_that_steps_clocks() {
        let g = crate::toy::llama(&crate::toy::ToyConfig { hidden: 16, ffn: 32, ..crate::toy::ToyConfig::tiny() });
        let opts = crate::executor::ExecOptions { recompute: runner_graph::recompute::RecomputePolicy::Full, ..Default::default() };
        let mut ex = Executor::new(&g, crate::cpu::Cpu::new(), opts).unwrap();
        let t = run(&mut ex, &g, 1, 1).unwrap();
        let p = ex.profile().clone();
        let one = |x: f64| Stat { median: x, p10: x, p90: x, min: x, max: x, n: 1 };
        assert!(p.forward_s > 0.0 && p.backward_s > 0.0 && p.optimizer_s > 0.0 && p.recompute_s > 0.0, "{p:?}");
        assert_eq!(
            (t.forward, t.backward, t.optimizer, t.recompute, t.communication),
            (one(p.forward_s), one(p.backward_s), one(p.optimizer_s), one(p.recompute_s), one(0.0))
        );
        assert!(t.step.n == 1 && t.step.median >= p.forward_s + p.backward_s + p.optimizer_s, "{:?} vs {p:?}", t.step);
        for (i, o) in t.ops.iter().enumerate() {
            let want = (one(p.forward_op_s[i]), one(p.backward_op_s[i]), one(p.recompute_op_s[i]));
            assert_eq!((o.forward, o.backward, o.recompute), want, "op {}", o.name);
        }
        assert!(t.ops.iter().any(|o| o.recompute.median > 0.0) && t.ops.iter().any(|o| o.backward.median > 0.0));
        assert!(!t.optimizer_by_weight.is_empty());
        for (name, s) in &t.optimizer_by_weight {
            let id = g.tensor_id(name).unwrap();
            assert!(*s > 0.0 && *s == p.optimizer_tensor_s[id], "{name}: {s} vs {}", p.optimizer_tensor_s[id]);
        }
    }

    /// A sharded rank's communication is its own collective seconds (here dp = 2's
    /// gradient all-reduce, over two threads): over one timed step, what its profile
    /// holds after the step, and not 0.
    #[test]
    fn a_sharded_ranks_communication_is_its_collective_seconds() {
        use runner_graph::shard::{Layout, RankCoord, shard};
        let g = crate::toy::with_roles(crate::toy::llama(&crate::toy::ToyConfig { hidden: 16, ffn: 32, ..crate::toy::ToyConfig::tiny() }), false);
        let layout = Layout { dp: 2, ..Layout::single(2, 4) };
        let ranks: Vec<_> = crate::collective::ThreadGroup::new(2)
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                let s = shard(&g, &layout, RankCoord { tp: 0, pp: 0, cp: 0, dp: r as u32 }).unwrap();
                std::thread::spawn(move || {
                    let groups: Vec<(String, Box<dyn crate::collective::Collective<crate::cpu::Cpu>>)> = vec![("dp".into(), Box::new(h))];
                    let mut ex = Executor::for_rank(&s, crate::cpu::Cpu::new(), crate::executor::ExecOptions::default(), groups).unwrap();
                    let data = crate::proxy::synthetic_inputs(&s.graph, r as u64);
                    let inputs: Vec<(&str, Input<'_>)> = data.iter().map(|(n, u, _)| (n.as_str(), Input::U32(u))).collect();
                    let t = time_steps(&mut ex, &inputs, &crate::executor::ADAMW_DEFAULT, TimingOptions { warmup: 0, repeats: 1 }, &mut |_, _, _| {}).unwrap();
                    (t.communication, ex.profile().communication_s)
                })
            })
            .collect();
        for h in ranks {
            let (got, s) = h.join().unwrap();
            assert!(s > 0.0 && got == Stat { median: s, p10: s, p90: s, min: s, max: s, n: 1 }, "{got:?} vs {s}");
        }
    }

    /// Timing turns per-op profiling on for its steps and puts the executor's own setting
    /// back after them, also when a step fails (it was left on, so every later step of
    /// the executor paid for per-op events) and when it was on before (it was turned off).
    #[test]
    fn timing_puts_the_profiling_setting_back_on_every_path() {
        let (g, mut ex) = toy_executor();
        assert!(!ex.profiling());
        let missing = time_steps(&mut ex, &[], &crate::executor::ADAMW_DEFAULT, TimingOptions { warmup: 0, repeats: 1 }, &mut |_, _, _| {});
        assert!(missing.is_err(), "a step without its inputs fails");
        assert!(!ex.profiling(), "a failed step left per-op profiling on");
        run(&mut ex, &g, 0, 1).unwrap();
        assert!(!ex.profiling());
        for fails in [false, true] {
            let opts = crate::executor::ExecOptions { profile: true, ..Default::default() };
            let mut ex = Executor::new(&g, crate::cpu::Cpu::new(), opts).unwrap();
            let r = if fails {
                time_steps(&mut ex, &[], &crate::executor::ADAMW_DEFAULT, TimingOptions::default(), &mut |_, _, _| {}).map(|_| ())
            } else {
                run(&mut ex, &g, 0, 1).map(|_| ())
            };
            assert_eq!(r.is_err(), fails);
            assert!(ex.profiling(), "profiling was on before timing (step fails: {fails})");
        }
    }

    /// Each op's row is that op's (name, layer) with its own forward and backward clocks:
    /// a phase encloses its ops' kernels in every step, so the fastest phase is at least
    /// the sum of its ops' fastest runs. Without recompute nothing is re-run. The AdamW
    /// times are one per weight, under the weight's own name.
    #[test]
    fn op_and_weight_rows_are_their_own() {
        let (g, mut ex) = toy_executor();
        let t = run(&mut ex, &g, 1, 3).unwrap();
        let rows: Vec<(&str, i32)> = t.ops.iter().map(|o| (o.name.as_str(), o.layer)).collect();
        let want: Vec<(&str, i32)> = g.ops.iter().map(|o| (o.name.as_str(), o.layer)).collect();
        assert_eq!(rows, want);
        assert!(g.ops.iter().any(|o| o.layer < 0));
        let fwd_ops: f64 = t.ops.iter().map(|o| o.forward.min).sum();
        let bwd_ops: f64 = t.ops.iter().map(|o| o.backward.min).sum();
        assert!(t.forward.min >= fwd_ops - 1e-9, "forward {:?} vs ops {fwd_ops}", t.forward);
        assert!(t.backward.min >= bwd_ops - 1e-9, "backward {:?} vs ops {bwd_ops}", t.backward);
        assert_eq!(t.recompute.max, 0.0);
        assert!(t.ops.iter().all(|o| o.recompute.max == 0.0));
        let names: Vec<&str> = t.optimizer_by_weight.iter().map(|(n, _)| n.as_str()).collect();
        let weights: Vec<&str> = g.tensors.iter().filter(|t| t.kind == runner_graph::TensorKind::Weight).map(|t| t.name.as_str()).collect();
        assert_eq!(names, weights);
    }

    /// Under full recompute the backward phase runs each op's backward and, before it,
    /// the layer's re-run forward, each on its own clock: in every step the phase is at
    /// least the sum of both, so its fastest step is at least the sum of the ops' fastest
    /// backward and re-run times. Only the layers' ops are re-run.
    #[test]
    fn the_backward_phase_encloses_its_ops_and_their_re_runs() {
        let g = crate::toy::llama(&crate::toy::ToyConfig { hidden: 16, ffn: 32, ..crate::toy::ToyConfig::tiny() });
        let opts = crate::executor::ExecOptions { recompute: runner_graph::recompute::RecomputePolicy::Full, ..Default::default() };
        let mut ex = Executor::new(&g, crate::cpu::Cpu::new(), opts).unwrap();
        let t = run(&mut ex, &g, 1, 3).unwrap();
        let ops: f64 = t.ops.iter().map(|o| o.backward.min + o.recompute.min).sum();
        assert!(t.backward.min >= ops - 1e-9, "backward {:?} vs its ops and re-runs {ops}", t.backward);
        assert!(t.ops.iter().all(|o| (o.recompute.min > 0.0) == (o.layer >= 0)), "{:?}", t.ops);
    }
}
