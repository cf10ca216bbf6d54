//! The calibration fit on small files: runs of the tiny proxy models whose "measured"
//! step times are the projection's own under known efficiencies, so that the fit has a
//! right answer; each file takes well under a second to fit.

mod common;

use runner_project::calibrate::{self, Fit};
use runner_project::profile::{Efficiency, Profiles};
use runner_project::published::Point;

use common::{measured, run, run_at};

const DENSE: [&str; 3] = ["llama3-tiny", "gpt3-tiny", "nemotron4-tiny"];

/// Twelve BF16 runs on `gpu`, four layouts of each of three dense families, from 1 to
/// 32 GPUs (a weak-scaling series at tp 1: 1 and 16 GPUs).
fn twelve(gpu: &str) -> Vec<Point> {
    DENSE.iter().flat_map(|m| [(1, 1, 64), (8, 2, 256), (16, 1, 512), (32, 2, 1024)].map(|(n, tp, gbs)| run(m, gpu, n, tp, gbs))).collect()
}

/// The priors with H100's BF16 GEMM efficiency at 0.8 of its prior: the efficiency
/// the runs are "measured" under.
fn truth() -> Profiles {
    let mut p = Profiles::priors();
    p.gpus.iter_mut().find(|g| g.name == "H100").unwrap().efficiency.gemm.bf16 *= 0.8;
    p
}

fn fit(points: &[Point], only: Option<(&str, Option<&str>)>) -> Vec<Fit> {
    calibrate::calibrate(points, &Profiles::priors(), &mut common::Native, only, "test", &|_| {}).unwrap()
}

fn on<'f>(fits: &'f [Fit], gpu: &str) -> &'f Fit {
    fits.iter().find(|f| f.gpu == gpu).unwrap_or_else(|| panic!("no fit of {gpu}"))
}

fn names(f: &Fit) -> Vec<&str> {
    f.params.iter().map(|p| p.0.as_str()).collect()
}

/// The values of the efficiency field a parameter name stands for ("gemm.fp8+mxfp8":
/// both formats').
fn field(e: &Efficiency, name: &str) -> Vec<f64> {
    let v = serde_json::to_value(e).unwrap();
    let formats: Vec<&str> = match name.strip_prefix("gemm.") {
        Some("fp8+mxfp8") => vec!["fp8", "mxfp8"],
        Some(f) => vec![f],
        None => return vec![v[name].as_f64().unwrap_or_else(|| panic!("no field {name}"))],
    };
    formats.iter().map(|f| v["gemm"][*f].as_f64().unwrap()).collect()
}

/// Twelve runs measured under a BF16 GEMM efficiency 20 % below the prior: the fit finds
/// it to within 3 % (the pull towards the priors along the ridge it shares with the GEMM
/// size at half efficiency leaves it 2.7 % high), and its runs' median error falls from
/// 11 % to under 0.1 %; what the runs barely see (the NICs, which only the tiny models' gradients
/// cross) stays at its prior. It fits what the runs inform (the network: runs past the
/// 8-GPU NVLink domain; the straggler spread: the weak-scaling series), and reports each
/// parameter as the efficiency it returns holds it.
#[test]
fn a_fit_finds_the_efficiency_its_runs_were_measured_under() {
    let truth = truth();
    let fits = fit(&measured(&twelve("H100"), &truth, |_| 1.0), None);
    assert_eq!(fits.len(), 1);
    let f = &fits[0];
    let want = truth.get("h100").unwrap().efficiency.gemm.bf16;
    assert!((f.efficiency.gemm.bf16 / want - 1.0).abs() < 0.03, "{want}: {:?}", f.params);
    assert!(f.before.median > 0.1 && f.after.max < 0.002, "{:?} -> {:?}", f.before, f.after);
    assert!((f.efficiency.scale_out / 0.85 - 1.0).abs() < 0.001, "{:?}", f.params);
    assert_eq!(names(f), ["gemm.bf16", "gemm_half_gflop", "attention", "memory", "scale_out", "straggler"]);
    assert_eq!((f.points, f.before.points, f.after.points), (12, 12, 12));
    let prior = Profiles::priors().get("h100").unwrap().efficiency.clone();
    for (name, p, fitted) in &f.params {
        assert_eq!(field(&prior, name), [*p], "{name}'s prior");
        assert!(field(&f.efficiency, name).iter().all(|x| x == fitted), "{name}: {fitted} but the efficiency holds {:?}", field(&f.efficiency, name));
    }
    assert_eq!(f.from_data, names(f));
    assert!(f.borrowed.is_empty());
    assert_eq!(f.efficiency.fitted, "test");
}

/// A run 2x off that no parameter explains pulls on the fit a quarter as hard as a run
/// 10 % off would (the Cauchy loss): the BF16 efficiency moves 0.1 % from where the run
/// measured right puts it.
#[test]
fn a_run_far_off_barely_moves_the_fit() {
    let truth = truth();
    let mut points = twelve("H100");
    points.push(run("llama3-tiny", "H100", 4, 1, 256));
    let clean = fit(&measured(&points, &truth, |_| 1.0), None);
    let fits = fit(&measured(&points, &truth, |i| if i == 12 { 2.0 } else { 1.0 }), None);
    let want = clean[0].efficiency.gemm.bf16;
    assert!((fits[0].efficiency.gemm.bf16 / want - 1.0).abs() < 0.005, "{want}: {:?}", fits[0].params);
}

/// What the runs can inform, at each threshold's edge: a GEMM format with 3 runs of 2
/// families, not of 1; the shared parameters with 10 runs, not 9; the network only where
/// a run spans more GPUs than the 8 of an NVLink domain; the straggler spread where runs
/// of one layout per GPU span 4x the GPUs (2 to 8), not where only the tensor
/// parallelism, the batch per GPU or the sequence length differs.
#[test]
fn a_fit_takes_each_parameter_from_enough_runs() {
    let truth = truth();
    let params = |points: Vec<Point>| names(&fit(&measured(&points, &truth, |_| 1.0), None)[0]).iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let three = vec![run("llama3-tiny", "H100", 1, 1, 64), run("llama3-tiny", "H100", 2, 2, 64), run("gpt3-tiny", "H100", 1, 1, 64)];
    assert_eq!(params(three.clone()), ["gemm.bf16"]);
    let one_family: Vec<Point> = three.iter().map(|p| Point { model: "llama3-tiny".into(), ..p.clone() }).collect();
    assert!(params(one_family).is_empty());
    // Per family: a series 2 -> 8 GPUs at tp 1, and 1 and 4 GPUs at tp 2 (no series).
    let ten: Vec<Point> = DENSE
        .iter()
        .flat_map(|m| [(2, 1, 64), (8, 1, 256), (4, 2, 64)].map(|(n, tp, gbs)| run(m, "H100", n, tp, gbs)))
        .chain([run("llama3-tiny", "H100", 1, 1, 32)])
        .collect();
    assert_eq!(params(ten.clone()), ["gemm.bf16", "gemm_half_gflop", "attention", "memory", "straggler"]);
    assert_eq!(params(ten[..9].to_vec()), ["gemm.bf16", "straggler"]);
    // The same counts at another batch per GPU (the 8-GPU runs at 16 sequences a GPU, not
    // 32), or at another sequence length, are not one layout per GPU: no series.
    let other_batch: Vec<Point> = ten[..9].iter().map(|p| if p.num_gpus == Some(8) { Point { gbs: Some(128), ..p.clone() } } else { p.clone() }).collect();
    assert_eq!(params(other_batch), ["gemm.bf16"]);
    let other_seq: Vec<Point> = ten[..9].iter().map(|p| if p.num_gpus == Some(8) { Point { seq_len: Some(1024), ..p.clone() } } else { p.clone() }).collect();
    assert_eq!(params(other_seq), ["gemm.bf16"]);
    // 1 GPU at tp 1 and 8 at tp 2: another layout per GPU, not a series.
    let no_series: Vec<Point> = DENSE.iter().flat_map(|m| [run(m, "H100", 1, 1, 32), run(m, "H100", 8, 2, 128)]).collect();
    assert_eq!(params(no_series), ["gemm.bf16"]);
    // Routed experts on the unfused path: 3 runs of 2 families fit their share of the
    // dense efficiency; a run on the fused path does not count.
    let moe = |m: &str, n: u32, fused: bool| Point { cutedsl_fused_grouped_mlp: Some(fused), ..run(m, "H100", n, 1, 64) };
    assert_eq!(params(vec![moe("mixtral-tiny", 1, false), moe("qwen3-tiny", 1, false), moe("mixtral-tiny", 2, false)]), ["gemm.bf16", "grouped_gemm"]);
    assert_eq!(params(vec![moe("mixtral-tiny", 1, false), moe("qwen3-tiny", 1, false), moe("mixtral-tiny", 2, true)]), ["gemm.bf16"]);
    // On Blackwell, per-tensor FP8 and MXFP8 runs count as one format.
    let b200 = |m: &str, p: &str| run_at(m, "B200", p, 1, 1, 64);
    assert_eq!(params(vec![b200("llama3-tiny", "FP8"), b200("gpt3-tiny", "FP8"), b200("llama3-tiny", "MXFP8")]), ["gemm.fp8+mxfp8"]);
}

/// Runs of a format too few families use (FP8: one) are projected, not fitted to; runs
/// of a hybrid model inform only the scan's efficiency (too few here to fit it): neither
/// moves what the other runs fit, however far off they are, nor adds a parameter.
#[test]
fn runs_the_fit_cannot_use_leave_it_as_it_was() {
    let truth = truth();
    let base = twelve("H100");
    let plain = fit(&measured(&base, &truth, |_| 1.0), None);
    let mut fp8 = base.clone();
    fp8.extend([run_at("llama3-tiny", "H100", "FP8", 8, 1, 256), run_at("llama3-tiny", "H100", "FP8", 16, 2, 256)]);
    let with_fp8 = fit(&measured(&fp8, &truth, |i| if i >= 12 { 1.5 } else { 1.0 }), None);
    assert_eq!(with_fp8[0].efficiency, plain[0].efficiency);
    assert_eq!((with_fp8[0].points, with_fp8[0].before.points), (12, 14));
    // Ten dense runs within one NVLink domain, three hybrid ones beyond it.
    let small: Vec<Point> = DENSE.iter().flat_map(|m| [(1, 1, 64), (2, 1, 64), (8, 2, 256)].map(|(n, tp, gbs)| run(m, "H100", n, tp, gbs))).chain([run("llama3-tiny", "H100", 4, 1, 128)]).collect();
    let dense = fit(&measured(&small, &truth, |_| 1.0), None);
    let mut hybrid = small.clone();
    hybrid.extend([(16, 1, 256), (32, 2, 512), (64, 1, 1024)].map(|(n, tp, gbs)| run("nemotronh-tiny", "H100", n, tp, gbs)));
    let with_hybrid = fit(&measured(&hybrid, &truth, |i| if i >= 10 { 2.0 } else { 1.0 }), None);
    assert_eq!(names(&with_hybrid[0]), names(&dense[0]));
    assert_eq!(with_hybrid[0].efficiency, dense[0].efficiency);
}

/// A GPU takes what its runs cannot fit from a fitted sibling (the nearest first), else
/// from the best-measured GPU: the one with the most runs that has 10 without hybrid
/// models, not merely the most runs. The borrowed list names where each value was fitted,
/// through a GPU that borrowed it in turn, and holds only fitted values.
#[test]
fn a_gpu_borrows_from_its_sibling_then_from_the_best_measured_gpu() {
    let truth = truth();
    let mut points = twelve("H100");
    // H100 also fits FP8 (3 runs of 2 families).
    points.extend([("llama3-tiny", 8), ("gpt3-tiny", 8), ("llama3-tiny", 16)].map(|(m, n)| run_at(m, "H100", "FP8", n, 1, 256)));
    // B200: the most runs, but seven are hybrid: 9 dense runs fit its BF16 efficiency
    // only, and it is fitted first, with no GPU to borrow from.
    points.extend(DENSE.iter().flat_map(|m| [(1, 1, 64), (2, 1, 64), (8, 2, 256)].map(|(n, tp, gbs)| run(m, "B200", n, tp, gbs))));
    let hybrid = [(1, 1, 64), (2, 1, 64), (8, 2, 256), (16, 1, 512), (4, 1, 128), (32, 2, 1024), (64, 1, 2048)];
    points.extend(hybrid.map(|(n, tp, gbs)| run("nemotronh-tiny", "B200", n, tp, gbs)));
    // B300 (B200's sibling) and GB300 (B300's) too few to fit anything; A100 no sibling.
    points.extend([run("llama3-tiny", "B300", 8, 1, 64), run("gpt3-tiny", "B300", 8, 1, 64)]);
    points.extend([run("llama3-tiny", "GB300", 4, 1, 64)]);
    points.extend([run("llama3-tiny", "A100-80GB", 8, 1, 64)]);
    let fits = fit(&measured(&points, &truth, |_| 1.0), None);
    assert_eq!(fits.iter().map(|f| f.gpu.as_str()).collect::<Vec<_>>(), ["B200", "H100", "B300", "A100-80GB", "GB300"]);
    let h100 = on(&fits, "H100");
    assert!(h100.borrowed.is_empty() && names(h100).contains(&"gemm.fp8"), "{:?}", h100.params);
    let b200 = on(&fits, "B200");
    assert_eq!(names(b200), ["gemm.bf16"]);
    assert!(b200.borrowed.is_empty(), "{:?}", b200.borrowed);
    let shared = ["gemm_half_gflop", "attention", "memory", "scale_out"];
    let from = |f: &Fit| -> Vec<(String, String)> { f.borrowed.clone() };
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> { v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect() };
    let b300 = on(&fits, "B300");
    let mut want = vec![("gemm.bf16", "B200"), ("gemm.fp8+mxfp8", "H100"), ("straggler", "H100")];
    want.extend(shared.iter().map(|s| (*s, "H100")));
    assert_eq!(from(b300), pairs(&want), "B300");
    assert_eq!(b300.efficiency.gemm.bf16, b200.efficiency.gemm.bf16);
    assert_eq!((b300.efficiency.gemm.fp8, b300.efficiency.gemm.mxfp8), (h100.efficiency.gemm.fp8, h100.efficiency.gemm.fp8));
    assert_eq!(b300.efficiency.attention, h100.efficiency.attention);
    // GB300 takes B300's BF16 value, fitted on B200.
    assert_eq!(on(&fits, "GB300").borrowed[0], ("gemm.bf16".to_string(), "B200".to_string()));
    let a100 = on(&fits, "A100-80GB");
    assert_eq!(a100.borrowed[0], ("gemm.bf16".to_string(), "H100".to_string()));
    assert_eq!(a100.efficiency.gemm.bf16, h100.efficiency.gemm.bf16);
}

/// Leave-one-family-out: a family 30 % slower than the efficiency the others measure,
/// held out, is predicted at the others' fit (1/1.3 - 1 = -23 %); a GPU with one family
/// holds nothing out.
#[test]
fn a_held_out_family_is_predicted_from_the_others_alone() {
    let truth = truth();
    let mut points = twelve("H100");
    points.extend([run("llama3-tiny", "A100-80GB", 8, 1, 64), run("llama3-tiny", "A100-80GB", 8, 2, 64)]);
    let points = measured(&points, &truth, |i| if (4..8).contains(&i) { 1.3 } else { 1.0 });
    assert_eq!(points[4].model, "gpt3-tiny");
    let held = calibrate::cross_validate(&points, &Profiles::priors(), &mut common::Native, None).unwrap();
    let keys: Vec<(&str, &str)> = held.iter().map(|h| (h.gpu.as_str(), h.family.as_str())).collect();
    assert_eq!(keys, [("H100", "gpt3"), ("H100", "llama3"), ("H100", "nemotron4")]);
    let gpt = held.iter().find(|h| h.family == "gpt3").unwrap();
    assert!(gpt.errors.len() == 4 && gpt.errors.iter().all(|e| (e - (1.0 / 1.3 - 1.0)).abs() < 0.01), "{:?}", gpt.errors);
}

/// Held out on one GPU (`--holdout --gpu`), the rows are that GPU's alone and the same
/// as beside the others (each GPU fits on its own runs); with a precision, only its runs;
/// a GPU, or a precision of it, the file has no run on is refused by name.
#[test]
fn a_holdout_of_one_gpu_holds_out_its_families_alone() {
    let truth = truth();
    let mut points = twelve("H100");
    points.extend(twelve("A100-80GB"));
    points.extend([("llama3-tiny", 8), ("gpt3-tiny", 8)].map(|(m, n)| run_at(m, "H100", "FP8", n, 1, 256)));
    let points = measured(&points, &truth, |i| if (4..8).contains(&i) { 1.3 } else { 1.0 });
    let cv = |only| calibrate::cross_validate(&points, &Profiles::priors(), &mut common::Native, only);
    let all = cv(None).unwrap();
    let keys = |h: &[calibrate::HeldOut]| h.iter().map(|h| format!("{} {} {}", h.gpu, h.family, h.errors.len())).collect::<Vec<_>>();
    assert_eq!(keys(&all), ["A100-80GB gpt3 4", "A100-80GB llama3 4", "A100-80GB nemotron4 4", "H100 gpt3 5", "H100 llama3 5", "H100 nemotron4 4"]);
    let a100 = cv(Some(("a100-80gb", None))).unwrap();
    assert_eq!(keys(&a100), ["A100-80GB gpt3 4", "A100-80GB llama3 4", "A100-80GB nemotron4 4"]);
    for h in &a100 {
        let same = all.iter().find(|a| a.gpu == h.gpu && a.family == h.family).unwrap();
        assert_eq!(h.errors, same.errors, "{} {}", h.gpu, h.family);
    }
    // FP8 alone: two families of one run each, each fitted on the other.
    let fp8 = cv(Some(("h100", Some("fp8")))).unwrap();
    assert_eq!(keys(&fp8), ["H100 gpt3 1", "H100 llama3 1"]);
    let e = cv(Some(("b200", None))).unwrap_err();
    assert_eq!(e, "the file has no supported run on B200");
    let e = cv(Some(("a100-80gb", Some("fp8")))).unwrap_err();
    assert_eq!(e, "the file has no supported FP8 run on A100-80GB");
}

/// `--gpu` and `--precision` fit one GPU's runs of one precision; a GPU the file has no
/// run on is refused by name.
#[test]
fn a_fit_of_one_gpu_and_precision_takes_only_those_runs() {
    let truth = truth();
    let mut points = twelve("H100");
    points.extend([("llama3-tiny", 8), ("gpt3-tiny", 8), ("llama3-tiny", 16)].map(|(m, n)| run_at(m, "H100", "FP8", n, 1, 256)));
    points.push(run("llama3-tiny", "A100-80GB", 8, 1, 64));
    let points = measured(&points, &truth, |_| 1.0);
    let fits = fit(&points, Some(("h100", Some("bf16"))));
    assert_eq!(fits.len(), 1);
    assert_eq!((fits[0].gpu.as_str(), fits[0].points, fits[0].before.points), ("H100", 12, 12));
    assert!(!names(&fits[0]).contains(&"gemm.fp8"));
    let e = calibrate::calibrate(&points, &Profiles::priors(), &mut common::Native, Some(("b200", None)), "test", &|_| {}).unwrap_err();
    assert!(e.contains("no supported run on B200"), "{e}");
}

/// A profile may put the straggler spread at 0 (no wait for stragglers); refitted from it
/// to runs that show none, the spread stays at the least the fit allows, not at the most
/// (the pull towards a prior of 0 was infinite for every value, so the line search
/// walked to the upper bound, a tenth of a step).
#[test]
fn a_prior_of_no_straggler_spread_is_a_prior_like_any_other() {
    let mut truth = truth();
    truth.gpus.iter_mut().for_each(|g| g.efficiency.straggler = 0.0);
    let mut priors = Profiles::priors();
    priors.gpus.iter_mut().for_each(|g| g.efficiency.straggler = 0.0);
    let points = measured(&twelve("H100"), &truth, |_| 1.0);
    let fits = calibrate::calibrate(&points, &priors, &mut common::Native, None, "test", &|_| {}).unwrap();
    let f = &fits[0];
    assert!(names(f).contains(&"straggler"), "{:?}", f.params);
    assert!(f.efficiency.straggler < 0.001 && f.after.max < 0.002, "{:?} {:?}", f.params, f.after);
}


/// Hybrid runs of two models fit the scan's efficiency, from those runs alone and after
/// the rest: measured under a scan at 0.05 of the peak (its prior 0.14, pulled an eighth as
/// hard as the others'), the fit finds it within 3 %, and leaves every other parameter
/// where the dense runs alone put it.
#[test]
fn hybrid_runs_of_two_models_fit_the_scan_alone() {
    let mut truth = truth();
    truth.gpus.iter_mut().find(|g| g.name == "H100").unwrap().efficiency.ssm = 0.05;
    let dense = fit(&measured(&twelve("H100"), &truth, |_| 1.0), None);
    let mut points = twelve("H100");
    points.extend([("nemotronh-tiny", 1, 1, 64), ("nemotronh-tiny", 8, 2, 256), ("nemotron-h-4b", 8, 1, 64), ("nemotron-h-4b", 16, 2, 128)].map(|(m, n, tp, gbs)| run(m, "H100", n, tp, gbs)));
    let with = fit(&measured(&points, &truth, |_| 1.0), None);
    let (d, w) = (&dense[0], &with[0]);
    assert_eq!(w.params.last().map(|p| p.0.as_str()), Some("ssm"));
    assert_eq!(w.params[..w.params.len() - 1], d.params[..]);
    assert!((w.efficiency.ssm / 0.05 - 1.0).abs() < 0.03, "{:?}", w.params);
}

/// A GPU that cannot fit the scan takes a fitted GPU's rate in TFLOP/s, as a share of its
/// own peak never past 1: at a scan efficiency of 1 (a profile may state it), H100's
/// 989 TFLOP/s are all of A100's 312, not 3.2 times them.
#[test]
fn a_borrowed_scan_rate_is_never_past_the_peak() {
    let mut priors = Profiles::priors();
    priors.gpus.iter_mut().for_each(|g| g.efficiency.ssm = 1.0);
    let mut points = twelve("H100");
    points.push(run("llama3-tiny", "A100-80GB", 8, 1, 64));
    let points = measured(&points, &truth(), |_| 1.0);
    let fits = calibrate::calibrate(&points, &priors, &mut common::Native, None, "test", &|_| {}).unwrap();
    assert_eq!(on(&fits, "A100-80GB").efficiency.ssm, 1.0);
}

/// What the runs barely see stays where the priors put it: with the runs' times off by up
/// to 2 % (as a published table's are), the NICs' share, which only the tiny models'
/// gradient traffic crosses, stays within 1 % of its prior (without the pull, the noise
/// took it to the bound, 1.0).
#[test]
fn what_noisy_runs_barely_see_stays_at_its_prior() {
    let noise = [1.0, -1.0, 0.5, -0.5, 0.0, 1.0, -1.0, 0.0, 0.5, -0.5, 1.0, -1.0];
    let f = &fit(&measured(&twelve("H100"), &truth(), |i| 1.0 + 0.02 * noise[i]), None)[0];
    assert!(names(f).contains(&"scale_out") && (f.efficiency.scale_out / 0.85 - 1.0).abs() < 0.01, "{:?}", f.params);
}
