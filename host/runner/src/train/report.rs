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
    let shown = format!("{:+.2}%", 100.0 * v);
    // A gap that rounds to nothing has no sign.
    if shown == "-0.00%" || shown == "+0.00%" { "0.00%".into() } else { shown }
}

fn loss(v: f64) -> String {
    if v.is_finite() { format!("{v:.4}") } else { "non-finite".into() }
}

/// The summary: one row per policy.
pub fn summary(r: &TrainReport) -> Table {
    let mut t = Table::new(
        format!(
            "{} trained {} steps x {} tokens on {} ({}), seed {}",
            r.variant, r.steps, r.tokens_per_step, r.text, r.device, r.seed
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
            "decisions",
        ],
    );
    for run in &r.runs {
        let gap = r.gaps.iter().find(|g| g.policy == run.policy).map_or("baseline".to_string(), |g| pct(g.eval_gap));
        let acted = run.decisions.iter().filter(|d| d.action != "alert" && d.action != "inject").count();
        t.rows.push(vec![
            run.policy.clone(),
            loss(run.final_eval_loss),
            gap,
            loss(run.final_train_loss),
            format!("{:.1}%", 100.0 * run.planned_coverage),
            format!("{:.1}%", 100.0 * run.effective_coverage),
            format!("{:.0}", run.tokens_per_s),
            run.steps.to_string(),
            run.skipped.to_string(),
            run.rollbacks.to_string(),
            acted.to_string(),
        ]);
    }
    if let Some(g) = r.gaps.first() {
        t.notes.push(format!(
            "gap: held-out loss relative to {} at equal tokens ({} tokens trained); coverage: share of GEMM FLOPs \
             (forward, input and weight gradients) whose two operands are FP8/FP4",
            g.baseline, g.tokens
        ));
    }
    t.notes.push(format!(
        "tokens/s: {} tokens a step over the median optimizer step's wall time (forward, backward, policy, AdamW; \
         the held-out evaluations not included: median_step_seconds in JSON; steps x tokens / its seconds, the whole run's, is lower)",
        r.tokens_per_step
    ));
    for run in &r.runs {
        t.notes.push(format!("{}: {}; {}", run.policy, run.description, run.plugin.provenance()));
        if let Some(a) = &run.aborted {
            t.notes.push(format!("{}: stopped early: {a}", run.policy));
        }
    }
    t.notes.push(format!(
        "tokenizer: byte-level BPE of {} tokens learnt from the text ({:.2} bytes per token); {} training and {} held-out tokens",
        r.vocab, r.bytes_per_token, r.train_tokens, r.eval_tokens
    ));
    for i in &r.injections {
        t.notes.push(format!("fault injected: {:?} at step {}{}", i.kind, i.step, i.site.as_ref().map_or(String::new(), |s| format!(" into {s}"))));
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

/// Every decision of every run.
pub fn decisions(r: &TrainReport) -> Table {
    let mut t = Table::new("precision decisions", &["policy", "iteration", "step", "action", "applied", "detail"]);
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
    }
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
}
