//! Every ready-made run file in workloads/ parses and runs end to end.

use runner::runfile;
use runner::session;

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
            session::run(&run, &|_| {}).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
        assert_eq!(
            outcome.rows.len(),
            run.cluster.gpus.len(),
            "{}",
            path.display()
        );
        assert!(outcome.model.flops_per_token > 0.0);
        for pair in outcome.rows.windows(2) {
            assert!(
                pair[1].days < pair[0].days,
                "{}: more GPUs must not take longer",
                path.display()
            );
        }
        ran += 1;
    }
    assert!(ran >= 8, "found only {ran} run files in {}", dir.display());
}
