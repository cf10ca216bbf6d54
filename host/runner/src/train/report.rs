//! A training report for people: the summary table (loss, gap to the baseline at equal
//! tokens, FP8 coverage, throughput), the held-out loss at each evaluation, the
//! decision log, and as HTML the loss curves drawn (inline SVG, `report/chart.rs`).

use std::fmt::Write as _;

use super::{Point, TrainReport};
use crate::report::chart::{LineChart, Series};
use crate::report::{Table, html_page};

fn pct(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    format!("{}%", crate::report::signed(100.0 * v, 2))
}

fn loss(v: f64) -> String {
    if v.is_finite() { format!("{v:.4}") } else { "non-finite".into() }
}

/// The error `runner train` exits with after writing its report when a policy's run
/// applied no step of those planned (its policy rejected every one, or it stopped first):
/// the report is written, but a run that trained nothing is not a success.
pub fn nothing_applied(r: &TrainReport) -> Option<String> {
    let idle: Vec<String> = r
        .runs
        .iter()
        .filter(|run| run.steps == 0 && r.steps > 0)
        .map(|run| format!("{}: {}", run.policy, run.aborted.as_deref().unwrap_or("stopped before its first step")))
        .collect();
    (!idle.is_empty()).then(|| {
        format!(
            "no step of the {} planned was applied by {} ({}); the report above has each run's decision log",
            r.steps,
            if idle.len() == 1 { "one run" } else { "some runs" },
            idle.join("; ")
        )
    })
}

/// The summary: one row per policy.
pub fn summary(r: &TrainReport) -> Table {
    let mut t = Table::new(
        format!(
            "{} trained {} steps x {} tokens with {} on {} ({}), seed {}",
            r.variant, r.steps, r.tokens_per_step, r.optimizer, r.text, r.device, r.seed
        ),
        &[
            "policy",
            "held-out loss",
            "gap",
            "train loss",
            "FP8 coverage planned",
            "effective",
            "tokens/s",
            "steps",
            "skipped",
            "rollbacks",
            "actions",
        ],
    );
    for run in &r.runs {
        let gap = r.gaps.iter().find(|g| g.policy == run.policy).map_or("baseline".to_string(), |g| pct(g.eval_gap));
        let acted = run.decisions.iter().filter(|d| d.action != "alert" && d.action != "inject").count();
        t.rows.push(vec![
            run.policy.clone(),
            loss(run.final_eval_loss),
            gap,
            // No step applied: no training loss nor step time to show (not a non-finite one).
            if run.steps == 0 { "n/a".into() } else { loss(run.final_train_loss) },
            format!("{:.1}%", 100.0 * run.planned_coverage),
            format!("{:.1}%", 100.0 * run.effective_coverage),
            if run.tokens_per_s.is_finite() { format!("{:.0}", run.tokens_per_s) } else { "n/a".into() },
            run.steps.to_string(),
            run.skipped.to_string(),
            run.rollbacks.to_string(),
            acted.to_string(),
        ]);
    }
    if let Some(g) = r.gaps.first() {
        // Each gap's tokens: the planned run's, or where a run stopped early, those of the
        // last evaluation both reached (it read the first gap's count for every policy).
        let planned = r.steps * r.tokens_per_step;
        let early: Vec<String> = r.gaps.iter().filter(|g| g.tokens != planned).map(|g| match g.tokens {
            0 => format!("{} none (a run stopped before the first held-out evaluation past step 0)", g.policy),
            t => format!("{} at {t}", g.policy),
        }).collect();
        let at = if early.is_empty() {
            format!("{planned} tokens trained")
        } else {
            format!("{planned} tokens planned; where a run stopped early, at the last held-out loss both reached: {}", early.join(", "))
        };
        t.notes.push(format!(
            "gap: held-out loss relative to {} at equal tokens ({at}); coverage: share of GEMM FLOPs \
             (forward, input and weight gradients) whose two operands are FP8/FP4",
            g.baseline
        ));
    }
    if r.runs.iter().any(|run| !run.decisions.is_empty()) {
        t.notes.push(
            "actions: the policy's actions, taken or refused (fallbacks, skips, rollbacks, ...); the decision log lists \
             its alerts and the injected faults too, one row each"
                .into(),
        );
    }
    // The title is not in the CSV; its notes are, so every output names the optimizer.
    t.notes.push(format!(
        "optimizer: {}",
        match r.optimizer.as_str() {
            "muon" => format!(
                "muon (Muon on the hidden matrices, AdamW on the embedding, output head, norms and biases{})",
                r.muon_tp_mode.as_ref().map(|m| format!("; tensor-parallel mode {m}")).unwrap_or_default()
            ),
            o => o.to_string(),
        }
    ));
    t.notes.push(format!(
        "tokens/s: {} tokens a step over the median optimizer step's wall time (forward, backward, policy, optimizer; \
         the held-out evaluations not included: median_step_seconds in JSON; steps x tokens / its seconds, the whole run's, is lower)",
        r.tokens_per_step
    ));
    for run in &r.runs {
        t.notes.push(format!("{}: {}; {}", run.policy, run.description, run.plugin.provenance()));
        if let Some(a) = &run.aborted {
            t.notes.push(format!(
                "{}: stopped early, at step {} of {} ({} of {} tokens): {a}",
                run.policy,
                run.steps,
                r.steps,
                run.steps * r.tokens_per_step,
                r.steps * r.tokens_per_step
            ));
        }
    }
    t.notes.push(format!(
        "tokenizer: byte-level BPE of {} tokens learnt from the text ({:.2} bytes per token); {} training and {} held-out tokens",
        r.vocab, r.bytes_per_token, r.train_tokens, r.eval_tokens
    ));
    for i in &r.injections {
        let site = i.site.as_ref().map_or(String::new(), |s| format!(" into {s}"));
        let flag = format!("{}@{}{}", i.kind.name(), i.step, i.site.as_ref().map_or(String::new(), |s| format!(":{s}")));
        t.notes.push(format!("fault injected: {} at step {}{site} (--inject {flag})", i.kind.label(), i.step));
    }
    t.notes.extend(r.notes.iter().cloned());
    t
}

/// Held-out loss at each evaluation, one column per policy.
pub fn curves(r: &TrainReport) -> Table {
    let mut headers = vec!["step", "tokens"];
    headers.extend(r.runs.iter().map(|run| run.policy.as_str()));
    let mut t = Table::new("held-out loss", &headers);
    let mut steps: Vec<u64> = r.runs.iter().flat_map(|run| run.eval.iter().map(|p| p.step)).collect();
    steps.sort_unstable();
    steps.dedup();
    for s in steps {
        let mut row = vec![s.to_string(), (s * r.tokens_per_step).to_string()];
        for run in &r.runs {
            row.push(run.eval.iter().find(|p| p.step == s).map_or(String::new(), |p| loss(p.loss)));
        }
        t.rows.push(row);
    }
    t
}

/// Every decision of every run. A policy numbers its step by the iteration (the
/// contract's `step-metrics.step`, which the host passes as every attempt, skipped and
/// rolled-back ones included), so its alerts' "step N" is the iteration column's N; the
/// steps applied before it (the count faults and curves use) are another column, named so.
pub fn decisions(r: &TrainReport) -> Table {
    let mut t = Table::new("precision decisions", &["policy", "iteration (policy's step)", "steps applied", "action", "applied", "detail"]);
    for run in &r.runs {
        for d in &run.decisions {
            t.rows.push(vec![
                run.policy.clone(),
                d.iteration.to_string(),
                d.step.to_string(),
                d.action.clone(),
                if d.applied { "yes".into() } else { "refused".into() },
                d.detail.clone(),
            ]);
        }
    }
    if t.rows.is_empty() {
        t.notes.push("no policy acted or alerted".into());
    } else {
        t.notes.push(
            "iteration: every attempt, skipped and rolled-back ones included, the step a policy's text names (\"step N: ...\"); \
             steps applied: optimizer steps applied before it, the step of --inject KIND@STEP and of the curves"
                .into(),
        );
    }
    t
}

/// The CSV, for scripts: one table in long form, a `kind` column saying what a row is:
/// `summary` (a policy's figures, under the JSON's `runs[]` names, with its `gaps[]`
/// entry's `eval_gap` and `train_gap` as fractions), `train` and `eval` (a loss curve's
/// point: `step`, `tokens`, `loss`, `learning_rate` as in `runs[].train` and
/// `runs[].eval`), and `decision` (`runs[].decisions`). Every figure as JSON writes it,
/// unrounded and without a unit; a non-finite loss (null in JSON) is empty. One header
/// row, as every CSV of the runner has: `df[df.kind == "eval"]` picks the held-out
/// curves, and a second table after the first would break readers. The summary's notes
/// are the `#` lines.
pub fn csv(r: &TrainReport) -> Table {
    use crate::report::{Record, fields, record};
    use serde_json::json;
    let mut rows: Vec<Record> = Vec::new();
    for run in &r.runs {
        let gap = r.gaps.iter().find(|g| g.policy == run.policy);
        let mut summary = record([
            ("kind", json!("summary")),
            ("policy", json!(run.policy)),
            ("eval_gap", json!(gap.map(|g| g.eval_gap))),
            ("train_gap", json!(gap.map(|g| g.train_gap))),
        ]);
        // The curves and the decisions are rows of their own; the plugin and the
        // description are in the notes.
        summary.extend(fields(run).into_iter().filter(|(k, _)| {
            !(matches!(k.as_str(), "policy" | "description" | "train" | "eval" | "decisions") || k.starts_with("plugin."))
        }));
        rows.push(summary);
        for (kind, points) in [("train", &run.train), ("eval", &run.eval)] {
            for p in points {
                let mut row = record([("kind", json!(kind)), ("policy", json!(run.policy))]);
                row.extend(fields(p));
                rows.push(row);
            }
        }
        for d in &run.decisions {
            let mut row = record([("kind", json!("decision")), ("policy", json!(run.policy))]);
            row.extend(fields(d));
            rows.push(row);
        }
    }
    let mut t = crate::report::records_of(&rows);
    t.notes = summary(r).notes;
    t.notes.push(
        "kind: summary (a policy's figures; eval_gap and train_gap fractions of the baseline's loss; coverage a fraction; \
         seconds), train and eval (a loss curve's point: step = optimizer steps applied before it), decision (iteration = \
         the policy's step, every attempt counted)"
            .into(),
    );
    t
}

/// The terminal text: the summary, the held-out curve and the decision log.
pub fn text(r: &TrainReport) -> String {
    let mut out = summary(r).render();
    out.push('\n');
    out.push_str(&curves(r).render());
    out.push('\n');
    out.push_str(&decisions(r).render());
    out
}

/// Smooth a training curve for drawing: the mean over windows of `w` points.
fn smoothed(points: &[Point], w: usize) -> Vec<(f64, f64)> {
    points
        .chunks(w.max(1))
        .map(|c| {
            let x = c.last().map_or(0.0, |p| p.tokens as f64);
            let y = c.iter().map(|p| p.loss).sum::<f64>() / c.len() as f64;
            (x, y)
        })
        .collect()
}

/// The HTML page: charts of the training and held-out loss against tokens, then the
/// tables.
pub fn html(r: &TrainReport) -> String {
    let window = (r.steps as usize / 60).max(1);
    let train = LineChart {
        title: format!("training loss (mean of {window} steps)"),
        x_label: "tokens trained".into(),
        y_label: "loss".into(),
        series: r.runs.iter().map(|run| Series { name: run.policy.clone(), points: smoothed(&run.train, window), ..Series::default() }).collect(),
        ..LineChart::default()
    };
    let eval = LineChart {
        title: "held-out loss".into(),
        x_label: "tokens trained".into(),
        y_label: "loss".into(),
        series: r
            .runs
            .iter()
            .map(|run| Series { name: run.policy.clone(), points: run.eval.iter().map(|p| (p.tokens as f64, p.loss)).collect(), dashed: true, ..Series::default() })
            .collect(),
        ..LineChart::default()
    };
    let mut body = String::new();
    let _ = writeln!(body, "{}", summary(r).html_fragment());
    let _ = writeln!(body, "<div>{}</div>\n<div>{}</div>", train.svg(), eval.svg());
    let _ = writeln!(body, "{}", curves(r).html_fragment());
    let _ = writeln!(body, "{}", decisions(r).html_fragment());
    html_page(&format!("runner train: {}", r.variant), &body)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_gap_that_rounds_to_nothing_has_no_sign() {
        assert_eq!(super::pct(-0.00001), "0.00%");
        assert_eq!(super::pct(0.00001), "0.00%");
        assert_eq!(super::pct(-0.0123), "-1.23%");
        assert_eq!(super::pct(0.0123), "+1.23%");
        assert_eq!(super::pct(f64::NAN), "n/a");
    }

    use super::super::{Decision, Gap, Point, RunResult, TrainReport};
    use super::*;

    fn pt(step: u64, loss: f64) -> Point {
        Point { step, tokens: step * 100, loss, learning_rate: None }
    }

    fn decision(action: &str, applied: bool) -> Decision {
        Decision { iteration: 3, step: 2, action: action.into(), detail: format!("{action} detail"), applied }
    }

    fn result(policy: &str, eval: Vec<Point>, decisions: Vec<Decision>) -> RunResult {
        RunResult {
            policy: policy.into(),
            description: format!("{policy} policy"),
            plugin: crate::plugin::PluginInfo {
                name: format!("{policy}.wasm"),
                kind: crate::plugin::Kind::Precision,
                contract: "0.3.0".into(),
                source: crate::plugin::Source::Embedded,
                sha256: "00".into(),
                bytes: 1,
                shadows_embedded: false,
            },
            train: (0..5).map(|i| pt(i, 5.0 - i as f64)).collect(),
            final_eval_loss: eval.last().map_or(f64::NAN, |p| p.loss),
            eval,
            final_train_loss: 2.5,
            steps: 20,
            iterations: 21,
            skipped: 1,
            rollbacks: 0,
            planned_coverage: 0.625,
            effective_coverage: 0.5,
            tokens_per_s: 1234.6,
            median_step_seconds: 0.081,
            seconds: 2.0,
            decisions,
            aborted: None,
            native_fp8_gemms: 0,
            fused_fp8_casts: 0,
        }
    }

    fn report() -> TrainReport {
        let bf16 = result("bf16", vec![pt(0, 9.0), pt(10, 6.0), pt(20, 5.0)], vec![]);
        let fp8 = result(
            "fp8",
            vec![pt(0, 9.0), pt(10, f64::INFINITY)],
            vec![decision("inject", true), decision("alert", true), decision("skip-step", true), decision("fallback", false)],
        );
        TrainReport {
            model: "llama3".into(),
            variant: "llama3-tiny".into(),
            optimizer: "muon".into(),
            muon_tp_mode: Some("blockwise".into()),
            device: "cpu".into(),
            plan_for: "cpu".into(),
            text: "t.txt".into(),
            text_bytes: 1000,
            vocab: 512,
            bytes_per_token: 3.5,
            train_tokens: 900,
            eval_tokens: 100,
            tokens_per_step: 100,
            seed: 7,
            steps: 300,
            injections: vec![],
            gaps: vec![Gap { policy: "fp8".into(), baseline: "bf16".into(), eval_gap: 0.0123, train_gap: 0.0, tokens: 30000 }],
            runs: vec![bf16, fp8],
            notes: vec![],
        }
    }

    /// One row per policy: the baseline named, the others' gap, coverage, throughput,
    /// and the decisions that acted (alerts and injections are not policy actions;
    /// refused ones are counted: the policy asked).
    #[test]
    fn the_summary_rows_say_what_each_run_did() {
        let t = summary(&report());
        assert_eq!(t.rows[0], ["bf16", "5.0000", "baseline", "2.5000", "62.5%", "50.0%", "1235", "20", "1", "0", "0"]);
        assert_eq!(t.rows[1][1..3], ["non-finite", "+1.23%"]);
        assert_eq!(t.rows[1][10], "2");
        assert!(t.notes[0].contains("relative to bf16 at equal tokens (30000 tokens trained)"), "{:?}", t.notes);
        assert!(t.title.contains("trained 300 steps x 100 tokens") && t.title.contains("seed 7"), "{}", t.title);
    }

    /// A run that applied no step (its policy rejected every one) has no training loss
    /// nor step time: "n/a", not "non-finite" (its loss was finite) nor a raw NaN; a run
    /// whose applied steps' loss was not finite still says so. Kills either column
    /// printed from the NaN as before.
    #[test]
    fn a_run_that_applied_no_step_shows_n_a_not_nan_or_non_finite() {
        let mut r = report();
        r.runs[1].steps = 0;
        r.runs[1].final_train_loss = f64::NAN;
        r.runs[1].tokens_per_s = f64::NAN;
        let t = summary(&r);
        assert_eq!((t.rows[1][3].as_str(), t.rows[1][6].as_str(), t.rows[1][7].as_str()), ("n/a", "n/a", "0"), "{:?}", t.rows[1]);
        r.runs[1].steps = 5;
        assert_eq!(summary(&r).rows[1][3], "non-finite");
    }

    /// `runner train` fails after its report when a run applied none of its steps, naming
    /// the run and why it stopped; a run that applied some does not. Kills the check
    /// dropped (None always) or made to look at the total of all runs.
    #[test]
    fn a_run_that_applied_no_step_makes_the_command_fail() {
        let mut r = report();
        assert_eq!(nothing_applied(&r), None);
        r.runs[1].steps = 0;
        r.runs[1].aborted = Some("the precision policy fp8 asked for skip-step".into());
        let e = nothing_applied(&r).expect("an error");
        assert!(e.starts_with("no step of the 300 planned was applied by one run (fp8: the precision policy fp8 asked for skip-step)"), "{e}");
    }

    /// The table's title and the notes (which the CSV keeps) name the optimizer.
    #[test]
    fn the_summary_names_the_optimizer() {
        let t = summary(&report());
        assert!(t.title.contains("tokens with muon on t.txt"), "{}", t.title);
        assert!(t.csv().contains("# optimizer: muon (Muon on the hidden matrices"), "{}", t.csv());
        assert!(t.csv().contains("; tensor-parallel mode blockwise)"), "{}", t.csv());
        let t = summary(&TrainReport { optimizer: "adamw".into(), muon_tp_mode: None, ..report() });
        assert!(t.title.contains("with adamw") && t.notes.iter().any(|n| n == "optimizer: adamw"), "{t:?}");
    }

    /// The held-out table: every evaluated step once, in order, its tokens, a blank where
    /// a run has no point there; the decision log says which actions were refused.
    #[test]
    fn the_curve_and_decision_tables() {
        let r = report();
        let c = curves(&r);
        assert_eq!(c.rows, [["0", "0", "9.0000", "9.0000"], ["10", "1000", "6.0000", "non-finite"], ["20", "2000", "5.0000", ""]]);
        let d = decisions(&r);
        assert_eq!(d.rows.len(), 4);
        assert_eq!(d.rows[3], ["fp8", "3", "2", "fallback", "refused", "fallback detail"]);
        assert_eq!(d.rows[2][4], "yes");
        // One note, saying which count a policy's "step N" is.
        assert!(d.notes.len() == 1 && d.notes[0].starts_with("iteration: every attempt"), "{:?}", d.notes);
        let quiet = TrainReport { runs: vec![result("bf16", vec![pt(0, 1.0)], vec![])], ..report() };
        assert_eq!(decisions(&quiet).notes, ["no policy acted or alerted"]);
    }

    /// The drawn training curve: the mean of each window, at the window's last tokens.
    #[test]
    fn the_training_curve_is_drawn_as_window_means() {
        let p: Vec<Point> = (1..=5).map(|i| pt(i, i as f64)).collect();
        assert_eq!(smoothed(&p, 2), [(200.0, 1.5), (400.0, 3.5), (500.0, 5.0)]);
        assert_eq!(smoothed(&p, 0).len(), 5);
        assert!(html(&report()).contains("training loss (mean of 5 steps)"));
    }

    /// A run that stopped early says so, at which step of how many and at how many
    /// tokens of the planned; the gap note gives each gap's tokens where they are not the
    /// planned run's (it gave the first gap's for all, and a stopped run's read as a
    /// finished one's).
    #[test]
    fn a_run_that_stopped_early_says_where_and_its_gap_at_what_tokens() {
        let mut r = report();
        r.runs[1].aborted = Some("diverged: 10 steps in a row".into());
        r.runs[1].steps = 7;
        r.runs.push(result("fp8-safe", vec![pt(0, 9.0)], vec![]));
        r.gaps[0].tokens = 500;
        r.gaps.push(Gap { policy: "fp8-safe".into(), baseline: "bf16".into(), eval_gap: 0.0, train_gap: 0.0, tokens: 30000 });
        r.gaps.push(Gap { policy: "nvfp4".into(), baseline: "bf16".into(), eval_gap: f64::NAN, train_gap: f64::NAN, tokens: 0 });
        let t = summary(&r);
        let early: Vec<&String> = t.notes.iter().filter(|n| n.contains("stopped early")).collect();
        assert_eq!(
            early[0],
            "gap: held-out loss relative to bf16 at equal tokens (30000 tokens planned; where a run stopped early, at the last \
             held-out loss both reached: fp8 at 500, nvfp4 none (a run stopped before the first held-out evaluation past \
             step 0)); coverage: share of GEMM FLOPs (forward, input and weight gradients) whose \
             two operands are FP8/FP4"
        );
        assert_eq!(early[1], "fp8: stopped early, at step 7 of 300 (700 of 30000 tokens): diverged: 10 steps in a row");
        assert_eq!(early.len(), 2, "{early:?}");
    }

    /// The training loss to step n is over the last tenth of the steps before it, at
    /// least one: before step 5 that is step 4 alone (kills a tail of `n / 10` without
    /// the floor, which read no step and gave NaN for every gap taken before step 10).
    #[test]
    fn the_training_loss_before_a_step_early_on_is_the_last_steps() {
        use super::super::train_loss_to;
        let mut r = result("fp8", vec![pt(0, 9.0)], vec![]);
        r.train = (0..8).map(|i| pt(i, 10.0 + i as f64)).collect();
        assert_eq!(train_loss_to(&r, 5), 14.0);
        assert_eq!(train_loss_to(&r, 1), 10.0);
        assert!(train_loss_to(&r, 0).is_nan());
    }

    fn curve(steps: std::ops::Range<u64>, loss: f64) -> Vec<Point> {
        steps.map(|s| pt(s, loss)).collect()
    }

    /// Gaps at equal tokens: the final losses where both ran every step; where one
    /// stopped early, the last evaluation both reached and the training loss of the tenth
    /// of the steps before it (each step's applied iteration: the last at that step).
    #[test]
    fn gaps_compare_equal_tokens_even_when_a_run_stops_early() {
        use super::super::gaps;
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        // 40 steps planned, evaluated every 20, 100 tokens a step.
        let mut bf16 = result("bf16", vec![pt(0, 9.0), pt(20, 4.0), pt(40, 3.0)], vec![]);
        (bf16.steps, bf16.final_train_loss, bf16.train) = (40, 2.0, curve(0..40, 2.0));
        let mut fp8 = result("fp8", vec![pt(0, 9.0), pt(20, 5.0), pt(40, 3.3)], vec![]);
        (fp8.steps, fp8.final_train_loss) = (40, 2.5);
        // Both finished: their final losses, at the planned tokens; the baseline is the
        // BF16 run wherever it is listed.
        let g = gaps(&[fp8.clone(), bf16.clone()], 40, 100);
        assert_eq!((g.len(), g[0].policy.as_str(), g[0].baseline.as_str(), g[0].tokens), (1, "fp8", "bf16", 4000));
        assert!(close(g[0].eval_gap, 0.1) && close(g[0].train_gap, 0.25), "{g:?}");
        // Without a BF16 run, the first is the baseline.
        let mut other = fp8.clone();
        other.policy = "mxfp8".into();
        assert_eq!(gaps(&[other.clone(), fp8.clone()], 40, 100)[0].baseline, "mxfp8");
        // fp8 stopped at step 25: compared at step 20 (its last evaluation) with the
        // baseline's loss there, not its final; the training loss over steps 18 and 19,
        // step 19 skipped once (NaN) before it was applied at 3.0.
        fp8.steps = 25;
        fp8.eval.pop();
        fp8.final_eval_loss = 5.0;
        fp8.train = curve(0..19, 2.0);
        fp8.train.extend([pt(19, f64::NAN), pt(19, 3.0)]);
        fp8.train.extend(curve(20..26, 9.0));
        let g = gaps(&[bf16.clone(), fp8.clone()], 40, 100);
        assert_eq!(g[0].tokens, 2000);
        assert!(close(g[0].eval_gap, 0.25) && close(g[0].train_gap, 0.25), "{g:?}");
        // Rolled back past step 20 and evaluated there again: the later evaluation is the
        // run's (the first was undone with the rollback).
        let mut again = fp8.clone();
        again.eval = vec![pt(0, 9.0), pt(20, 8.0), pt(20, 5.0)];
        assert!(close(gaps(&[bf16.clone(), again], 40, 100)[0].eval_gap, 0.25));
        // The baseline stopped early at step 30: both compared at its last evaluation.
        let (mut short, mut done) = (bf16.clone(), fp8.clone());
        (short.steps, short.eval) = (30, vec![pt(0, 9.0), pt(20, 4.0)]);
        short.train.truncate(31);
        (done.steps, done.eval) = (40, vec![pt(0, 9.0), pt(20, 6.0), pt(40, 3.0)]);
        let g = gaps(&[short, done], 40, 100);
        assert_eq!(g[0].tokens, 2000);
        assert!(close(g[0].eval_gap, 0.5), "{g:?}");
        // Stopped before its first evaluation past step 0: nothing to compare.
        fp8.steps = 3;
        fp8.eval.truncate(1);
        let g = gaps(&[bf16, fp8], 40, 100);
        assert_eq!(g[0].tokens, 0);
        assert!(g[0].eval_gap.is_nan() && g[0].train_gap.is_nan(), "{g:?}");
    }

    /// The CSV's decisions are rows of their own (kind `decision`), never columns of a
    /// policy's summary row as well: its header names no `decisions` field. Kills (a
    /// mutation audit's survivor): `decisions` left out of the summary's excluded fields.
    #[test]
    fn the_csv_summary_rows_carry_no_decisions() {
        let t = csv(&report());
        assert!(!t.headers.iter().any(|h| h.starts_with("decisions")), "{:?}", t.headers);
        let kind = t.headers.iter().position(|h| h == "kind").unwrap();
        assert_eq!(t.rows.iter().filter(|r| r[kind] == "decision").count(), 4);
    }
}
