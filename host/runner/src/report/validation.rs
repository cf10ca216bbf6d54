//! The HTML page of `runner validate`: predicted against published step time for every
//! projected run (one colour per GPU type, the diagonal where they agree), what the
//! model's predicted step is made of for the runs it misses most, then the table and
//! its notes.

use std::collections::BTreeMap;

use runner_project::published::{Checked, Validation};
use runner_project::step::Breakdown;

use crate::report::chart::{LineChart, Series, StackedBars};
use crate::report::{Table, html_page};

/// Error beyond which a run counts as missed (the projection issue's p90 target).
const MISSED: f64 = 0.15;
/// Bars in the breakdown chart (its width holds about this many labels).
const BARS: usize = 16;

/// The page: the charts above `table` (the text table of the same validation).
pub fn html(v: &Validation, table: &Table) -> String {
    let mut body = String::new();
    body.push_str("<div style=\"display:flex;flex-wrap:wrap;gap:1rem\">\n");
    body.push_str(&parity(&v.checked).svg());
    body.push('\n');
    body.push_str(&missed(&v.checked).svg());
    body.push_str("\n</div>\n");
    body.push_str(&table.html_fragment());
    html_page(table.title.lines().next().unwrap_or("runner validate"), &body)
}

/// Predicted against published step time, log-log, a series per GPU type.
fn parity(checked: &[Checked]) -> LineChart {
    let mut by_gpu: BTreeMap<&str, Series> = BTreeMap::new();
    for c in checked {
        let s = by_gpu.entry(c.gpu.as_str()).or_insert_with(|| Series { name: c.gpu.clone(), scatter: true, ..Series::default() });
        s.points.push((c.published_step_s, c.predicted_step_s));
        s.labels.push(format!("#{} {} on {} {}, {}: {} %", c.index, c.model, c.gpus, c.gpu, c.precision, super::signed(100.0 * c.error, 1)));
    }
    let finite = |x: f64| x.is_finite() && x > 0.0;
    let all = checked.iter().flat_map(|c| [c.published_step_s, c.predicted_step_s]).filter(|x| finite(*x));
    let (lo, hi) = all.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let mut series: Vec<Series> = by_gpu.into_values().collect();
    if lo < hi {
        series.push(Series { name: "predicted = published".into(), points: vec![(lo, lo), (hi, hi)], dashed: true, ..Series::default() });
    }
    LineChart {
        title: "Predicted against published step time".into(),
        x_label: "published step, s".into(),
        y_label: "predicted step, s".into(),
        log_x: true,
        log_y: true,
        series,
        marks: Vec::new(),
    }
}

/// The predicted step's parts, as shares of it, for the runs missed by more than
/// [`MISSED`] (the worst [`BARS`] of them), labelled with their error.
fn missed(checked: &[Checked]) -> StackedBars {
    let mut worst: Vec<&Checked> = checked.iter().filter(|c| c.error.abs() > MISSED).collect();
    worst.sort_by(|a, b| b.error.abs().total_cmp(&a.error.abs()));
    worst.truncate(BARS);
    worst.sort_by_key(|c| c.index);
    let share = |f: &dyn Fn(&Breakdown) -> f64| -> Vec<f64> {
        worst.iter().map(|c| if c.predicted_step_s > 0.0 { 100.0 * f(&c.breakdown) / c.predicted_step_s } else { 0.0 }).collect()
    };
    let parts: Vec<(String, Vec<f64>)> = [
        ("GEMMs".to_string(), share(&|b| b.compute_parts.gemm)),
        ("attention, scans".to_string(), share(&|b| b.compute_parts.attention + b.compute_parts.scan)),
        ("other compute".to_string(), share(&Breakdown::other_compute)),
        ("recompute".to_string(), share(&|b| b.recompute)),
        ("exposed comm".to_string(), share(&|b| b.tp + b.cp + b.ep + b.pp + b.dp)),
        ("bubble".to_string(), share(&|b| b.bubble)),
        ("optimizer, offload, stragglers".to_string(), share(&|b| b.optimizer + b.offload + b.straggler)),
    ]
    .into_iter()
    .filter(|(_, v)| v.iter().any(|x| *x > 0.0))
    .collect();
    StackedBars {
        title: format!("Runs missed by more than {:.0} %: what the prediction is made of", 100.0 * MISSED),
        y_label: "% of the predicted step".into(),
        categories: worst.iter().map(|c| format!("#{} {}%", c.index, super::signed(100.0 * c.error, 0))).collect(),
        parts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_project::step::ComputeParts;

    fn run(index: usize, gpu: &str, published: f64, predicted: f64) -> Checked {
        Checked {
            index,
            model: "m<1>".into(),
            family: "f".into(),
            gpu: gpu.into(),
            precision: "bf16".into(),
            gpus: 8,
            layout: "TP1".into(),
            published_step_s: published,
            predicted_step_s: predicted,
            published_tokens_per_sec_per_gpu: 1.0,
            predicted_tokens_per_sec_per_gpu: 1.0,
            error: predicted / published - 1.0,
            memory_gib: 1.0,
            fits: true,
            breakdown: Breakdown {
                compute: 0.8 * predicted,
                compute_parts: ComputeParts { gemm: 0.6 * predicted, attention: 0.1 * predicted, scan: 0.0 },
                ep: 0.2 * predicted,
                ..Breakdown::default()
            },
            note: String::new(),
            source: String::new(),
        }
    }

    /// Past sixteen missed runs the bars show the sixteen missed most, in run order.
    #[test]
    fn the_breakdown_keeps_the_worst_sixteen_in_run_order() {
        // Run i is off by 20 + i %: runs 4..19 are the worst sixteen.
        let checked: Vec<Checked> = (0..20).map(|i| run(i, "H100", 1.0, 1.2 + 0.01 * i as f64)).collect();
        let bars = missed(&checked);
        let want: Vec<String> = (4..20).map(|i| format!("#{i} +{}%", 20 + i)).collect();
        assert_eq!(bars.categories, want);
    }

    /// Published step on x, predicted on y; the diagonal spans the smallest to the
    /// largest positive time, and is left out when there is only one.
    #[test]
    fn parity_puts_published_on_x_and_spans_the_diagonal_over_positive_times() {
        let chart = parity(&[run(0, "H100", 2.0, 3.0), run(1, "H100", 0.0, 5.0)]);
        assert_eq!(chart.series[0].points, vec![(2.0, 3.0), (0.0, 5.0)]);
        assert_eq!(chart.series[1].points, vec![(2.0, 2.0), (5.0, 5.0)], "0 s is not on a log axis");
        assert_eq!(parity(&[run(0, "H100", 2.0, 2.0)]).series.len(), 1, "one time: no diagonal");
    }

    /// Every part of the breakdown lands in a bar: the shares of a run's predicted step
    /// sum to 100 % with data-parallel communication and stragglers in it.
    #[test]
    fn every_part_of_the_step_is_in_the_bars() {
        let mut c = run(0, "H100", 1.0, 2.0);
        c.breakdown = Breakdown {
            compute: 0.5,
            compute_parts: ComputeParts { gemm: 0.3, attention: 0.1, scan: 0.0 },
            recompute: 0.1,
            tp: 0.1,
            dp: 0.4,
            bubble: 0.2,
            optimizer: 0.1,
            offload: 0.1,
            straggler: 0.5,
            ..Breakdown::default()
        };
        let bars = missed(&[c]);
        let share = |name: &str| bars.parts.iter().find(|(n, _)| n == name).map(|(_, v)| v[0]);
        // (0.1 + 0.4) / 2 and (0.1 + 0.1 + 0.5) / 2 of the step.
        assert!((share("exposed comm").unwrap() - 25.0).abs() < 1e-9);
        assert!((share("optimizer, offload, stragglers").unwrap() - 35.0).abs() < 1e-9);
        let total: f64 = bars.parts.iter().map(|(_, v)| v[0]).sum();
        assert!((total - 100.0).abs() < 1e-9, "{total}");
        let t = Table::new("first line\nsecond line", &["#"]);
        let v = Validation { checked: Vec::new(), unsupported: Vec::new(), overall: Default::default(), groups: Default::default() };
        assert!(html(&v, &t).contains("<title>first line</title>"));
    }

    #[test]
    fn the_page_plots_every_run_and_breaks_down_the_missed_ones() {
        let checked = vec![run(0, "H100", 10.0, 10.2), run(1, "GB200", 4.0, 3.0), run(2, "H100", 2.0, 2.5), run(3, "GB200", 1.0, f64::NAN)];
        let v = Validation { checked, unsupported: Vec::new(), overall: Default::default(), groups: Default::default() };
        let mut table = Table::new("projection vs published <file>", &["#"]);
        table.rows.push(vec!["0".into()]);
        let page = html(&v, &table);
        assert!(page.starts_with("<!DOCTYPE html>") && page.contains("projection vs published &lt;file&gt;"));
        // Three finite points in two GPU series (no line through them), and the diagonal.
        let chart = parity(&v.checked).svg();
        assert_eq!(chart.matches("<polyline").count(), 1, "{chart}");
        assert!(chart.contains("data-name=\"GB200\"") && chart.contains("data-name=\"H100\""));
        assert!(!chart.contains("NaN"));
        assert!(chart.contains("<title>#1 m&lt;1&gt; on 8 GB200, bf16: -25.0 %</title>"), "each point says which run it is: {chart}");
        // Runs 1 (-25 %) and 2 (+25 %) are missed, run 0 (+2 %) is not; their bars fill 100 %.
        let bars = missed(&v.checked);
        assert_eq!(bars.categories, vec!["#1 -25%".to_string(), "#2 +25%".to_string()]);
        for i in 0..2 {
            let total: f64 = bars.parts.iter().map(|(_, v)| v[i]).sum();
            assert!((total - 100.0).abs() < 1e-9, "{total}");
        }
        assert!(bars.parts.iter().all(|(name, _)| name != "bubble"), "parts no run has are left out");
    }

    /// "Missed by more than 15 %": a run off by exactly 15 % is not. Kills: `>` made `>=`.
    #[test]
    fn a_run_off_by_exactly_the_target_is_not_missed() {
        let (mut at, mut past) = (run(0, "H100", 1.0, 1.15), run(1, "H100", 1.0, 1.16));
        (at.error, past.error) = (MISSED, -MISSED - 1e-12);
        assert_eq!(missed(&[at, past]).categories, vec!["#1 -15%".to_string()]);
    }

    /// A run predicted at 0 s (missed by 100 %) has no shares, not 0/0: every share is a
    /// number. Attention and Mamba scans are one part. Kills: the division unguarded, the
    /// scans left out.
    #[test]
    fn shares_are_numbers_and_scans_count_with_attention() {
        let mut scan = run(1, "H100", 1.0, 2.0);
        scan.breakdown.compute_parts = ComputeParts { gemm: 0.6, attention: 0.2, scan: 0.4 };
        let bars = missed(&[run(0, "H100", 1.0, 0.0), scan]);
        assert!(bars.parts.iter().all(|(_, v)| v[0] == 0.0), "{:?}", bars.parts);
        let attention = bars.parts.iter().find(|(n, _)| n == "attention, scans").unwrap();
        assert!((attention.1[1] - 30.0).abs() < 1e-9, "(0.2 + 0.4) / 2: {:?}", attention.1);
    }

    /// The page has both charts. Kills: the breakdown chart left out.
    #[test]
    fn the_page_has_the_parity_and_the_breakdown_charts() {
        let v = Validation { checked: vec![run(0, "H100", 1.0, 2.0)], unsupported: Vec::new(), overall: Default::default(), groups: Default::default() };
        let page = html(&v, &Table::new("t", &["#"]));
        assert!(page.contains("<title>Predicted against published step time</title>"), "{page}");
        assert!(page.contains("<title>Runs missed by more than 15 %: what the prediction is made of</title>"), "{page}");
        assert_eq!(page.matches("class=\"bar\"").count(), 4, "GEMMs, attention, other compute and exposed comm of run 0: {page}");
    }
}
