//! The plugin walkthroughs of docs/PLUGINS.md are real crates (tests/programs/walkthrough-*):
//! the page shows their files exactly, and a plugin written from it builds, validates and runs.

use runner::plugin::{self, Limits};
use runner::runfile;
use runner::explore;

use crate::util::program;

fn read(rel: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).unwrap()
}

#[test]
fn the_page_shows_the_walkthrough_files_exactly() {
    let page = read("../docs/PLUGINS.md");
    for file in [
        "programs/walkthrough-model/src/lib.rs",
        "programs/walkthrough-model/Cargo.toml",
        "programs/walkthrough-cloud/src/lib.rs",
    ] {
        assert!(
            page.contains(&read(file)),
            "docs/PLUGINS.md no longer shows tests/{file}; update the page"
        );
    }
}

#[test]
fn the_walkthrough_model_validates_and_runs_priced_by_the_walkthrough_cloud() {
    let model = program("mymodel.wasm");
    let cloud = program("mycloud.wasm");
    let mut w = plugin::load(&model)
        .unwrap()
        .workload(Limits::default())
        .unwrap();
    let info = w.describe().unwrap();
    assert_eq!(info.variants.len(), 2);
    let text = format!(
        "[model]\nplugin = {model:?}\nvariant = \"mymodel-7b\"\n[cluster]\ngpus = [16, 64]\n[cost]\nplugins = [{cloud:?}]\n"
    );
    let run = runfile::parse(&text, "walkthrough").unwrap();
    let outcome = explore::run(&run, &|_, _, _| {}).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(outcome.model.variant, "mymodel-7b");
    assert!(
        outcome.model.params_total > 6_000_000_000 && outcome.model.params_total < 8_000_000_000
    );
    assert_eq!(outcome.clouds, vec!["mycloud".to_string()]);
    let cost = outcome.series[0].rows[0].costs[0]
        .quote()
        .expect("mycloud sells H100");
    assert_eq!(cost.nodes, 2);
    assert_eq!(cost.region, "us-east", "the cheaper region wins");
}
