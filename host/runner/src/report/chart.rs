//! Charts for the HTML report as inline SVG: no script, no fonts or files fetched, so a
//! report is one file that opens anywhere and prints. Line charts (days or cost against
//! GPU count, one line per series, logarithmic axes where the data spans decades, marked
//! points such as the sweet spot) and stacked bars (the step-time breakdown per GPU count).
//!
//! Every label is escaped; points that are not finite (or not positive on a log axis) are
//! left out rather than drawn at nonsense coordinates.

use std::fmt::Write as _;

/// Okabe-Ito colours: distinguishable with the common colour-vision deficiencies.
pub const PALETTE: [&str; 8] = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"];

use crate::report::html_escape as esc;

/// One line of a chart.
#[derive(Clone, Debug, Default)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
    /// Points only, no line through them (a scatter of independent runs).
    pub scatter: bool,
    /// A tooltip per point, in `points`' order (none when empty).
    pub labels: Vec<String>,
}

/// A point called out with a label (the sweet spot).
#[derive(Clone, Debug)]
pub struct Mark {
    pub x: f64,
    pub y: f64,
    pub label: String,
}

/// A line chart.
#[derive(Clone, Debug, Default)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub log_y: bool,
    pub series: Vec<Series>,
    pub marks: Vec<Mark>,
}

const W: f64 = 720.0;
const H: f64 = 360.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 48.0;

/// An axis: data range to pixels, with its ticks.
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
}

impl Axis {
    fn new(values: impl Iterator<Item = f64>, log: bool) -> Option<Axis> {
        let v: Vec<f64> = values.filter(|x| x.is_finite() && (!log || *x > 0.0)).collect();
        let (mut lo, mut hi) = (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max));
        if !lo.is_finite() {
            return None;
        }
        if log {
            lo = 2f64.powf(lo.log2().floor());
            hi = 2f64.powf(hi.log2().ceil());
            if hi <= lo {
                hi = lo * 2.0;
            }
        } else {
            lo = lo.min(0.0);
            if hi <= lo {
                hi = lo + 1.0;
            }
            hi += (hi - lo) * 0.05;
        }
        Some(Axis { lo, hi, log })
    }

    fn frac(&self, x: f64) -> f64 {
        if self.log { (x.log2() - self.lo.log2()) / (self.hi.log2() - self.lo.log2()) } else { (x - self.lo) / (self.hi - self.lo) }
    }

    fn ok(&self, x: f64) -> bool {
        x.is_finite() && (!self.log || x > 0.0)
    }

    /// Tick values: powers of two (log) or about five round numbers.
    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (a, b) = (self.lo.log2().round() as i32, self.hi.log2().round() as i32);
            let step = ((b - a) / 8).max(1);
            return (a..=b).step_by(step as usize).map(|e| 2f64.powi(e)).collect();
        }
        let raw = (self.hi - self.lo) / 5.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
        let mut t = (self.lo / step).ceil() * step;
        let mut out = Vec::new();
        while t <= self.hi + 1e-9 * step && out.len() < 12 {
            out.push(t);
            t += step;
        }
        out
    }
}

/// A short number for a tick: 1.5K, 2M, 0.25, and two significant digits where two
/// decimals would show none (a tiny model's days: 0.00024, not 0.00).
pub fn short(v: f64) -> String {
    let a = v.abs();
    if v.fract() == 0.0 && a < 1e5 {
        return format!("{v:.0}");
    }
    let (x, unit) = if a >= 1e9 {
        (v / 1e9, "B")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "K")
    } else {
        (v, "")
    };
    let s = if x.fract().abs() < 1e-9 { format!("{x:.0}") } else if x.abs() >= 10.0 { format!("{x:.1}") } else { crate::report::fixed_or_significant(x, 2) };
    format!("{s}{unit}")
}

impl LineChart {
    /// The chart as an `<svg>` element; an empty chart (no finite point) says so.
    pub fn svg(&self) -> String {
        let xs = Axis::new(self.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)), self.log_x);
        let ys = Axis::new(self.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)), self.log_y);
        let mut out = String::new();
        let _ = write!(
            out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" role=\"img\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\"><title>{}</title>",
            esc(&self.title)
        );
        let _ = write!(out, "<text x=\"{LEFT}\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>", esc(&self.title));
        let (Some(xs), Some(ys)) = (xs, ys) else {
            let _ = write!(out, "<text x=\"{LEFT}\" y=\"{}\">no data to draw</text></svg>", H / 2.0);
            return out;
        };
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        let px = |x: f64| LEFT + xs.frac(x) * pw;
        let py = |y: f64| TOP + (1.0 - ys.frac(y)) * ph;
        let _ = write!(out, "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{pw}\" height=\"{ph}\" fill=\"#ffffff\" stroke=\"#999999\"/>");
        for t in xs.ticks() {
            let x = px(t);
            let _ = write!(
                out,
                "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#e6e6e6\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                TOP + ph,
                TOP + ph + 16.0,
                short(t)
            );
        }
        for t in ys.ticks() {
            let y = py(t);
            let _ = write!(
                out,
                "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#e6e6e6\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                short(t)
            );
        }
        let _ = write!(out, "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>", LEFT + pw / 2.0, H - 8.0, esc(&self.x_label));
        let _ = write!(
            out,
            "<text x=\"14\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {:.1})\">{}</text>",
            TOP + ph / 2.0,
            TOP + ph / 2.0,
            esc(&self.y_label)
        );
        for (i, s) in self.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let kept: Vec<usize> = (0..s.points.len()).filter(|&j| xs.ok(s.points[j].0) && ys.ok(s.points[j].1)).collect();
            let pts: Vec<(f64, f64)> = kept.iter().map(|&j| s.points[j]).collect();
            let path: Vec<String> = pts.iter().map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y))).collect();
            let dash = if s.dashed { " stroke-dasharray=\"6 4\"" } else { "" };
            let _ = write!(out, "<g class=\"series\" data-name=\"{}\">", esc(&s.name));
            if !s.scatter {
                let _ = write!(out, "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2.5\"{dash} points=\"{}\"/>", path.join(" "));
            }
            for (&j, (x, y)) in kept.iter().zip(&pts) {
                let title = s.labels.get(j).map_or(String::new(), |l| format!("<title>{}</title>", esc(l)));
                let _ = write!(out, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{color}\">{title}</circle>", px(*x), py(*y));
            }
            out.push_str("</g>");
            let ly = TOP + 14.0 + 18.0 * i as f64;
            let lx = LEFT + pw + 12.0;
            if s.scatter {
                let _ = write!(out, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{color}\"/>", lx + 11.0, ly - 4.0);
            } else {
                let _ = write!(
                    out,
                    "<line x1=\"{lx:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{color}\" stroke-width=\"2.5\"{dash}/>",
                    ly - 4.0,
                    lx + 22.0,
                    ly - 4.0
                );
            }
            let _ = write!(out, "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>", lx + 28.0, ly, esc(&s.name));
        }
        for m in self.marks.iter().filter(|m| xs.ok(m.x) && ys.ok(m.y)) {
            let (x, y) = (px(m.x), py(m.y));
            let _ = write!(
                out,
                "<g class=\"mark\"><circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"8\" fill=\"none\" stroke=\"#D55E00\" stroke-width=\"2.5\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#D55E00\">{}</text></g>",
                x + 10.0,
                y - 10.0,
                esc(&m.label)
            );
        }
        out.push_str("</svg>");
        out
    }
}

/// Stacked bars: one bar per category, one colour per part.
#[derive(Clone, Debug, Default)]
pub struct StackedBars {
    pub title: String,
    pub y_label: String,
    pub categories: Vec<String>,
    /// (part name, one value per category).
    pub parts: Vec<(String, Vec<f64>)>,
}

impl StackedBars {
    pub fn svg(&self) -> String {
        let totals: Vec<f64> = (0..self.categories.len())
            .map(|i| self.parts.iter().filter_map(|(_, v)| v.get(i)).copied().filter(|x| x.is_finite() && *x > 0.0).sum())
            .collect();
        let mut out = String::new();
        let _ = write!(
            out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" role=\"img\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\"><title>{}</title><text x=\"{LEFT}\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>",
            esc(&self.title),
            esc(&self.title)
        );
        let Some(ys) = Axis::new(totals.iter().copied().chain([0.0]), false).filter(|_| totals.iter().any(|t| *t > 0.0)) else {
            let _ = write!(out, "<text x=\"{LEFT}\" y=\"{}\">no data to draw</text></svg>", H / 2.0);
            return out;
        };
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        let py = |y: f64| TOP + (1.0 - ys.frac(y)) * ph;
        let _ = write!(out, "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{pw}\" height=\"{ph}\" fill=\"#ffffff\" stroke=\"#999999\"/>");
        for t in ys.ticks() {
            let y = py(t);
            let _ = write!(
                out,
                "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#e6e6e6\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                short(t)
            );
        }
        let _ = write!(
            out,
            "<text x=\"14\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {:.1})\">{}</text>",
            TOP + ph / 2.0,
            TOP + ph / 2.0,
            esc(&self.y_label)
        );
        let n = self.categories.len().max(1) as f64;
        let slot = pw / n;
        let bw = (slot * 0.6).min(60.0);
        for (i, cat) in self.categories.iter().enumerate() {
            let x = LEFT + slot * (i as f64 + 0.5) - bw / 2.0;
            let mut acc = 0.0;
            for (j, (_, vals)) in self.parts.iter().enumerate() {
                let v = vals.get(i).copied().unwrap_or(0.0);
                if !(v.is_finite() && v > 0.0) {
                    continue;
                }
                let (y0, y1) = (py(acc), py(acc + v));
                acc += v;
                let _ = write!(
                    out,
                    "<rect class=\"bar\" x=\"{x:.1}\" y=\"{y1:.1}\" width=\"{bw:.1}\" height=\"{:.1}\" fill=\"{}\"/>",
                    (y0 - y1).max(0.0),
                    PALETTE[j % PALETTE.len()]
                );
            }
            let (lx, ly) = (x + bw / 2.0, TOP + ph + 16.0);
            if self.categories.len() > 8 {
                // Many bars: the labels slant so that neighbours do not overlap.
                let _ = write!(out, "<text x=\"{lx:.1}\" y=\"{ly:.1}\" text-anchor=\"end\" transform=\"rotate(-35 {lx:.1} {ly:.1})\">{}</text>", esc(cat));
            } else {
                let _ = write!(out, "<text x=\"{lx:.1}\" y=\"{ly:.1}\" text-anchor=\"middle\">{}</text>", esc(cat));
            }
        }
        for (j, (name, _)) in self.parts.iter().enumerate() {
            let ly = TOP + 14.0 + 18.0 * j as f64;
            let lx = LEFT + pw + 12.0;
            let _ = write!(
                out,
                "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"14\" height=\"10\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{ly:.1}\">{}</text>",
                ly - 10.0,
                PALETTE[j % PALETTE.len()],
                lx + 20.0,
                esc(name)
            );
        }
        out.push_str("</svg>");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_chart_draws_each_series_and_skips_nonsense() {
        let c = LineChart {
            title: "days <vs> GPUs".into(),
            x_label: "GPUs".into(),
            y_label: "days".into(),
            log_x: true,
            log_y: true,
            series: vec![
                Series { name: "fp8".into(), points: vec![(64.0, 115.9), (2048.0, 3.8), (128.0, f64::NAN)], ..Series::default() },
                Series { name: "bf16".into(), points: vec![(64.0, 161.0), (2048.0, 5.1), (0.0, 1.0)], dashed: true, ..Series::default() },
            ],
            marks: vec![Mark { x: 512.0, y: 14.0, label: "sweet spot".into() }],
        };
        let svg = c.svg();
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4 + 1, "two finite points per series and the mark");
        assert!(svg.contains("days &lt;vs&gt; GPUs") && !svg.contains("NaN") && !svg.contains("inf"));
        assert!(svg.contains(">2048<") && svg.contains(">64<"), "powers-of-two ticks: {svg}");
        let empty = LineChart { title: "t".into(), ..LineChart::default() }.svg();
        assert!(empty.contains("no data to draw"));
    }

    #[test]
    fn stacked_bars_sum_their_parts() {
        let b = StackedBars {
            title: "breakdown".into(),
            y_label: "s".into(),
            categories: vec!["64".into(), "128".into()],
            parts: vec![("compute".into(), vec![10.0, 5.0]), ("bubble".into(), vec![1.0, f64::INFINITY])],
        };
        let svg = b.svg();
        assert_eq!(svg.matches("class=\"bar\"").count(), 3);
        assert!(!svg.contains("inf"));
    }

    /// The `y="..."` of every `<rect class="bar"` in `svg`, and its height.
    fn bars(svg: &str) -> Vec<(String, String)> {
        svg.split("<rect class=\"bar\"")
            .skip(1)
            .map(|r| {
                let attr = |name: &str| r.split(&format!(" {name}=\"")).nth(1).unwrap().split('"').next().unwrap().to_string();
                (attr("y"), attr("height"))
            })
            .collect()
    }

    /// Points at infinity, one GPU count alone on a log axis, all-zero values on a linear
    /// one: nothing is drawn at a coordinate that is not a number.
    #[test]
    fn degenerate_data_draws_no_nonsense_coordinates() {
        for (log, points) in [
            (false, vec![(1.0, 1.0), (2.0, f64::INFINITY), (f64::NEG_INFINITY, 3.0)]),
            (true, vec![(64.0, 5.0)]),
            (false, vec![(0.0, 0.0)]),
        ] {
            let c = LineChart { log_x: log, log_y: log, series: vec![Series { name: "s".into(), points, ..Series::default() }], ..LineChart::default() };
            let svg = c.svg();
            assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
            assert_eq!(svg.matches("<circle").count(), 1, "{svg}");
        }
    }

    /// A linear axis starts at zero and leaves room above the highest point; a log axis
    /// spanning 2^0..2^16 ticks every other power of two.
    #[test]
    fn axes_start_at_zero_with_headroom_and_log_ticks_thin_out() {
        let a = Axis::new([5.0, 9.0].into_iter(), false).unwrap();
        assert!(a.lo == 0.0 && (a.hi - 9.45).abs() < 1e-12, "{} {}", a.lo, a.hi);
        let c = LineChart { series: vec![Series { name: "s".into(), points: vec![(1.0, 5.0), (2.0, 10.0)], ..Series::default() }], ..LineChart::default() };
        // y of 10 on an axis to 10.5: 36 + (1 - 10/10.5) * 276 = 49.1.
        assert!(c.svg().contains("cy=\"49.1\""), "{}", c.svg());
        let log = Axis::new([1.0, 65536.0].into_iter(), true).unwrap();
        let powers: Vec<f64> = (0..=8).map(|e| 4f64.powi(e)).collect();
        assert_eq!(log.ticks(), powers);
        // Five round steps: 10 / 5 = 2 exactly is a step, and the last tick is the top.
        assert_eq!(Axis { lo: 0.0, hi: 10.0, log: false }.ticks(), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
    }

    /// Every label is escaped: titles, axis labels, series names (legend and data-name),
    /// tooltips, marks, categories and parts.
    #[test]
    fn every_label_is_escaped() {
        let c = LineChart {
            title: "<t>".into(),
            x_label: "<x>".into(),
            y_label: "<y>".into(),
            series: vec![Series { name: "<s>".into(), points: vec![(1.0, 1.0)], labels: vec!["<l>".into()], ..Series::default() }],
            marks: vec![Mark { x: 1.0, y: 1.0, label: "<m>".into() }],
            ..LineChart::default()
        };
        let b = StackedBars { title: "<t>".into(), y_label: "<y>".into(), categories: vec!["<c>".into()], parts: vec![("<p>".into(), vec![1.0])] };
        for svg in [c.svg(), b.svg()] {
            for raw in ["<t>", "<x>", "<y>", "<s>", "<l>", "<m>", "<c>", "<p>"] {
                assert!(!svg.contains(raw), "{raw}: {svg}");
            }
        }
        assert_eq!(c.svg().matches("&lt;s&gt;").count(), 2, "legend and data-name");
        assert_eq!(c.svg().matches("&lt;t&gt;").count(), 2, "<title> and heading");
        assert_eq!(b.svg().matches("&lt;t&gt;").count(), 2, "<title> and heading");
    }

    /// Each series its colour and dash; a tooltip stays with its point when an earlier
    /// point is left out; a mark off a log axis is not drawn.
    #[test]
    fn series_keep_their_colour_dash_and_tooltips() {
        let c = LineChart {
            log_x: true,
            log_y: true,
            series: vec![
                Series { name: "a".into(), points: vec![(0.0, 1.0), (2.0, 2.0)], labels: vec!["first".into(), "second".into()], ..Series::default() },
                Series { name: "b".into(), points: vec![(4.0, 4.0)], dashed: true, ..Series::default() },
            ],
            marks: vec![Mark { x: 0.0, y: 1.0, label: "off".into() }],
            ..LineChart::default()
        };
        let svg = c.svg();
        assert!(svg.contains(&format!("fill=\"{}\"><title>second</title>", PALETTE[0])) && !svg.contains("first"), "{svg}");
        assert!(svg.contains(&format!("stroke=\"{}\" stroke-width=\"2.5\" stroke-dasharray", PALETTE[1])), "{svg}");
        assert_eq!(svg.matches("stroke-dasharray").count(), 2, "line and legend of b: {svg}");
        assert!(!svg.contains("class=\"mark\""), "{svg}");
    }

    /// Bars stack from zero part on part (the axis to the total + 5 %); a negative part
    /// is neither drawn nor taken off the total; bars are at most 60 px wide; past eight
    /// categories the labels slant; all-zero data says so.
    #[test]
    fn bars_stack_from_zero_and_skip_what_takes_no_time() {
        let b = StackedBars { categories: vec!["8".into()], parts: vec![("a".into(), vec![2.0]), ("b".into(), vec![3.0]), ("c".into(), vec![-4.0])], ..StackedBars::default() };
        let svg = b.svg();
        // Axis 0..5.25 over 276 px from y = 36: 2 s at 206.9 (105.1 high), 5 s at 49.1.
        assert_eq!(bars(&svg), vec![("206.9".to_string(), "105.1".to_string()), ("49.1".to_string(), "157.7".to_string())], "{svg}");
        assert!(svg.contains("width=\"60.0\""), "{svg}");
        assert!(!svg.contains("rotate(-35"));
        let many = |n: usize| StackedBars { categories: (0..n).map(|i| i.to_string()).collect(), parts: vec![("a".into(), vec![1.0; n])], ..StackedBars::default() };
        assert!(!many(8).svg().contains("rotate(-35") && many(9).svg().matches("rotate(-35").count() == 9);
        let zero = StackedBars { categories: vec!["8".into()], parts: vec![("a".into(), vec![0.0])], ..StackedBars::default() };
        assert!(zero.svg().contains("no data to draw"));
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(short(1500.5), "1.50K");
        assert_eq!(short(2048.0), "2048");
        assert_eq!(short(2.5e6), "2.50M");
        assert_eq!(short(64.0), "64");
        assert_eq!(short(5e5), "500K");
        assert_eq!(short(1e9), "1B");
        assert_eq!(short(12_500.5), "12.5K");
        // Below 0.01: two significant digits, not "0.00" on every tick of a tiny model's axis.
        assert_eq!((short(0.25), short(0.001), short(2f64.powi(-12)), short(-0.004)), ("0.25".into(), "0.0010".into(), "0.00024".into(), "-0.0040".into()));
        let c = LineChart { log_y: true, series: vec![Series { name: "s".into(), points: vec![(8.0, 0.0003), (64.0, 0.00005)], ..Series::default() }], ..LineChart::default() };
        let svg = c.svg();
        assert!(!svg.contains(">0.00<") && svg.contains(">0.00024<") && svg.contains(">0.000031<"), "{svg}");
        let a = Axis::new([0.0, 9.3].into_iter(), false).unwrap();
        assert_eq!(a.ticks(), vec![0.0, 2.0, 4.0, 6.0, 8.0]);
    }

    /// A log axis runs from the power of two at or below the smallest value to the one at
    /// or above the largest; a linear axis under negative values runs from the lowest one,
    /// which maps to the bottom as the top does to the top. Kills: floor or ceil made round,
    /// the linear fraction not taken from the low end.
    #[test]
    fn axes_hold_every_value() {
        let log = Axis::new([3.0, 90.0].into_iter(), true).unwrap();
        assert_eq!((log.lo, log.hi), (2.0, 128.0));
        let lin = Axis::new([-10.0, 10.0].into_iter(), false).unwrap();
        assert_eq!((lin.lo, lin.hi), (-10.0, 11.0));
        assert_eq!((lin.frac(-10.0), lin.frac(11.0), lin.frac(0.5)), (0.0, 1.0, 0.5));
    }

    /// Each part of the bars its colour in the legend. Kills: every legend entry in the
    /// first colour.
    #[test]
    fn bar_legend_colours_follow_the_parts() {
        let b = StackedBars { categories: vec!["8".into()], parts: vec![("a".into(), vec![1.0]), ("b".into(), vec![2.0])], ..StackedBars::default() };
        let svg = b.svg();
        for (j, name) in ["a", "b"].iter().enumerate() {
            let legend = format!("width=\"14\" height=\"10\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\">{name}</text>", PALETTE[j], W - RIGHT + 32.0, TOP + 14.0 + 18.0 * j as f64);
            assert!(svg.contains(&legend), "{legend}: {svg}");
        }
    }
}
