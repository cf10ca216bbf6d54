//! What a hand mutation audit of the calibration fit and of `validate` found no test
//! for (the `wt-mutants` branch's report names each mutant): each test names the mutant
//! it kills. The runs are the tiny proxy models', measured at the projection's own step
//! times under the priors, as in `tests/calibrate.rs`.

mod common;

use runner_project::calibrate::{self, Fit};
use runner_project::profile::Profiles;
use runner_project::published::{self, Point};

use common::run;

/// `points` with each step time what the priors project for it, times `slow`.
fn measured(points: &[Point], slow: f64) -> Vec<Point> {
    common::measured(points, &Profiles::priors(), |_| slow)
}

fn fit(points: &[Point]) -> Vec<Fit> {
    calibrate::calibrate(points, &Profiles::priors(), &mut common::Native, None, "test", &|_| {}).unwrap()
}

/// A run's error is the projection against the measurement (projected / measured - 1:
/// a run measured 25 % slower than projected is -20 %), its published throughput per
/// GPU the measured step's tokens over its GPUs, and the groups are keyed by GPU,
/// precision and family. Kills: the error's ratio inverted (+25 %), the published
/// throughput not divided by the GPUs, the precision left out of the groups' key.
#[test]
fn validate_reports_each_run_against_its_measurement() {
    let points = measured(&[run("llama3-tiny", "H100", 8, 2, 256), run("gpt3-tiny", "H100", 1, 1, 64)], 1.25);
    let v = published::validate(&points, &Profiles::priors(), &mut common::Native, &|_| {});
    assert_eq!(v.checked.len(), 2);
    for c in &v.checked {
        assert!((c.error - (1.0 / 1.25 - 1.0)).abs() < 1e-9, "{}: {}", c.model, c.error);
        let p = &points[c.index];
        let tokens = 2048.0 * f64::from(p.gbs.unwrap()) / p.step_time_s.unwrap() / f64::from(p.num_gpus.unwrap());
        assert!((c.published_tokens_per_sec_per_gpu / tokens - 1.0).abs() < 1e-9, "{}: {}", c.model, c.published_tokens_per_sec_per_gpu);
    }
    let keys: Vec<&str> = v.groups.keys().map(String::as_str).collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys.iter().all(|k| k.starts_with("H100 / bf16 / ")), "{keys:?}");
}

/// Routed experts on the unfused path fit their share of the dense efficiency only from
/// runs of two families at least, as a GEMM format does: three runs of one family (with
/// dense runs of another, so that their BF16 efficiency is fitted) fit no grouped-GEMM
/// share. Kills: the family count dropped for the grouped GEMMs.
#[test]
fn grouped_gemms_of_one_family_fit_no_share() {
    let moe = |n: u32| Point { cutedsl_fused_grouped_mlp: Some(false), ..run("mixtral-tiny", "H100", n, 1, 64) };
    let fits = fit(&measured(&[moe(1), moe(2), moe(4), run("gpt3-tiny", "H100", 1, 1, 64)], 1.0));
    let names: Vec<&str> = fits[0].params.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(names, ["gemm.bf16"]);
}

/// A GPU with runs enough to fit the shared parameters itself, none of them past its
/// NVLink domain, keeps its prior NIC efficiency: it borrows the network from no other
/// GPU (what it borrows it lists, and a profile written from the fit would carry it).
/// Kills: the shared parameters borrowed by a GPU that fits its own.
#[test]
fn a_gpu_that_fits_its_own_shared_parameters_borrows_no_network() {
    let dense = ["llama3-tiny", "gpt3-tiny", "nemotron4-tiny"];
    // H100: past its 8-GPU domain (32 GPUs), so it fits scale_out, and the most runs, so
    // it is the best-measured GPU; A100: within its domain.
    let mut points: Vec<Point> =
        dense.iter().flat_map(|m| [(1, 1, 64), (8, 2, 256), (16, 1, 512), (32, 2, 1024)].map(|(n, tp, gbs)| run(m, "H100", n, tp, gbs))).collect();
    points.push(run("llama3-tiny", "H100", 2, 1, 64));
    points.extend(dense.iter().flat_map(|m| [(1, 1, 64), (2, 1, 64), (4, 2, 128), (8, 1, 256)].map(|(n, tp, gbs)| run(m, "A100-80GB", n, tp, gbs))));
    let fits = fit(&measured(&points, 1.0));
    let h100 = fits.iter().find(|f| f.gpu == "H100").unwrap();
    assert!(h100.from_data.iter().any(|n| n == "scale_out"), "{:?}", h100.from_data);
    let a100 = fits.iter().find(|f| f.gpu == "A100-80GB").unwrap();
    assert!(a100.from_data.iter().any(|n| n == "attention"), "{:?}", a100.from_data);
    assert!(!a100.from_data.iter().any(|n| n == "scale_out"), "{:?} {:?}", a100.from_data, a100.borrowed);
    let prior = Profiles::priors().get("A100-80GB").unwrap().efficiency.scale_out;
    assert_eq!(a100.efficiency.scale_out, prior);
}

/// A GPU whose own hybrid runs fit the scan starts that fit from its own prior, and
/// reports it as the prior: a fitted GPU's scan rate is what a GPU that cannot fit the
/// scan takes, not a prior that overrides the profile's. Kills: the borrowed scan rate
/// set also where the GPU fits the scan itself.
#[test]
fn a_gpu_that_fits_its_scan_keeps_its_own_prior_for_it() {
    let dense = ["llama3-tiny", "gpt3-tiny", "nemotron4-tiny"];
    let mut points: Vec<Point> =
        dense.iter().flat_map(|m| [(1, 1, 64), (8, 2, 256), (16, 1, 512), (32, 2, 1024)].map(|(n, tp, gbs)| run(m, "H100", n, tp, gbs))).collect();
    points.extend([("nemotronh-tiny", 1, 1, 64), ("nemotronh-tiny", 8, 2, 256), ("nemotron-h-4b", 8, 1, 64), ("nemotron-h-4b", 16, 2, 128)].map(|(m, n, tp, gbs)| run(m, "B200", n, tp, gbs)));
    let fits = fit(&measured(&points, 1.0));
    let b200 = fits.iter().find(|f| f.gpu == "B200").unwrap();
    let ssm = b200.params.iter().find(|p| p.0 == "ssm").unwrap_or_else(|| panic!("B200 fits no scan: {:?}", b200.params));
    assert_eq!(ssm.1, Profiles::priors().get("B200").unwrap().efficiency.ssm, "{:?}", b200.params);
}
