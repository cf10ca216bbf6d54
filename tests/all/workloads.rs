//! Every ready-made run file in workloads/ parses and runs end to end.

use runner::runfile;
use runner::explore;

#[test]
fn every_workload_file_runs() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../workloads");
    let mut ran = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let mut run = runfile::load(&path).unwrap_or_else(|e| panic!("{e}"));
        run.cost.plugins = vec!["aws.wasm".into()];
        run.measure.repeats = 1;
        let outcome =
            explore::run(&run, &|_, _, _| {}).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
        assert!(!outcome.series.is_empty(), "{}", path.display());
        for s in &outcome.series {
            assert_eq!(s.rows.len(), run.cluster.gpus.len(), "{}", path.display());
        }
        assert!(outcome.model.flops_per_token > 0.0);
        // Every row is either a projected layout that fits on exactly that many GPUs,
        // whose days are its steps (tokens over the global batch's tokens) times its step
        // time, or says why nothing fits.
        for (s, r) in outcome.series.iter().flat_map(|s| s.rows.iter().map(move |r| (s, r))) {
            match (&r.projection, r.days) {
                (Some(p), Some(days)) => {
                    assert!(p.fits, "{}: {} GPUs", path.display(), r.gpus);
                    assert_eq!(p.layout.gpus(), u64::from(r.gpus), "{}", path.display());
                    assert_eq!(p.layout.gbs, r.global_batch, "{}", path.display());
                    let steps = outcome.model.tokens / (f64::from(r.global_batch) * f64::from(outcome.model.seq_len));
                    let want = steps * p.step_time_s / 86_400.0;
                    assert!((days / want - 1.0).abs() < 1e-9, "{}: {days} days, {want} from the steps", path.display());
                    assert_eq!(r.gpus % s.gpu.gpus_per_node, 0, "whole nodes");
                }
                (None, None) => assert!(r.why_not.as_deref().is_some_and(|w| !w.is_empty())),
                _ => panic!("{}: a row with days but no layout, or the reverse", path.display()),
            }
        }
        ran += 1;
    }
    assert!(ran >= 8, "found only {ran} run files in {}", dir.display());
}
