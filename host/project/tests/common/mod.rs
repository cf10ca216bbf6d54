//! Test support: the first-party model plugins, built natively, as a projection
//! [`Resolver`] (the same builder code their wasm builds run; the runner resolves through
//! the sandboxed plugins instead).

#![allow(dead_code, reason = "each test binary uses part of this module")]

use runner_plugin_sdk::workload::{GraphRequest, Guest, ModelInfo, Phase};
use runner_plugin_testkit as kit;
use runner_project::model::{GraphSource, Model};
use runner_project::precision::{Plan, Recipe};
use runner_project::profile::Profiles;
use runner_project::project::Projector;
use runner_project::published::{self, Point, Resolver};
use runner_project::step::LayoutSpec;

type Describe = fn() -> ModelInfo;

/// Every first-party workload plugin: its description and its graph export.
pub fn plugins() -> Vec<(Describe, kit::GraphFn)> {
    vec![
        (llama3::Llama3::describe as Describe, llama3::Llama3::graph as kit::GraphFn),
        (llama2::Llama2::describe, llama2::Llama2::graph),
        (gpt3::Gpt3::describe, gpt3::Gpt3::graph),
        (nemotron4::Nemotron4::describe, nemotron4::Nemotron4::graph),
        (deepseek::DeepSeek::describe, deepseek::DeepSeek::graph),
        (gptoss::GptOss::describe, gptoss::GptOss::graph),
        (qwen3::Qwen3::describe, qwen3::Qwen3::graph),
        (mixtral::Mixtral::describe, mixtral::Mixtral::graph),
        (nemotronh::NemotronH::describe, nemotronh::NemotronH::graph),
    ]
}

/// A graph source over one variant of a natively built plugin.
pub fn source(graph: kit::GraphFn, variant: &str, seq: u32) -> Box<dyn GraphSource> {
    let variant = variant.to_string();
    Box::new(move |mb: u32| -> Result<runner_graph::Graph, String> {
        let req = GraphRequest { variant: variant.clone(), seq_len: seq, micro_batch: mb, layers: 0, phase: Phase::Training };
        graph(req).map(|g| kit::to_host(&g))
    })
}

/// Finds the plugin providing a variant by name.
pub struct Native;

impl Resolver for Native {
    fn resolve(&mut self, model: &str, seq_len: u32) -> Result<(String, Box<dyn GraphSource>), String> {
        for (describe, graph) in plugins() {
            let info = describe();
            if info.variants.iter().any(|v| v.name == model) {
                return Ok((info.family.clone(), source(graph, model, seq_len)));
            }
        }
        Err(format!("no installed workload plugin provides '{model}'"))
    }
}

/// The published runs shipped with the crate.
pub fn calibration() -> Vec<runner_project::published::Point> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/data/calibration.toml")).unwrap();
    runner_project::published::parse(&text, "data/calibration.toml").unwrap()
}

/// The published runs of other frameworks than Megatron and NeMo, never fitted.
pub fn other_frameworks() -> Vec<runner_project::published::Point> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/data/other-frameworks.toml")).unwrap();
    runner_project::published::parse(&text, "data/other-frameworks.toml").unwrap()
}

/// The published runs but the hybrid Mamba models' (Nemotron-H, Nemotron 3), which the
/// shipped fit keeps out of sample.
pub fn calibration_without_hybrids() -> Vec<runner_project::published::Point> {
    let mut points = calibration();
    points.retain(|p| !p.model.starts_with("nemotron-h") && !p.model.starts_with("nemotron-3"));
    points
}

/// A projector for a first-party model variant on a built-in GPU under a built-in plan.
pub fn projector(model: &str, seq: u32, gpu: &str, recipe: Recipe) -> Projector<'static> {
    let (_, mut src) = Native.resolve(model, seq).unwrap();
    let m = Model::new(model, seq, src.as_mut()).unwrap();
    let plan = Plan::builtin(recipe, &m.graph);
    Projector::new(m, src, Profiles::builtin().get(gpu).unwrap().clone(), plan)
}

/// A layout without EP, recompute or FSDP; SP and TP overlap where tp > 1.
pub fn layout(tp: u32, pp: u32, cp: u32, vp: u32, dp: u32, mbs: u32, gbs: u32) -> LayoutSpec {
    LayoutSpec::dense(tp, pp, cp, vp, dp, mbs, gbs)
}

/// A run of `model` on `gpu` under `precision`: `n` GPUs at tensor parallelism `tp`,
/// `gbs` sequences of 2,048 tokens, micro-batch 1.
pub fn run_at(model: &str, gpu: &str, precision: &str, n: u32, tp: u32, gbs: u32) -> Point {
    Point {
        source: "synthetic".into(),
        model: model.into(),
        gpu: gpu.into(),
        num_gpus: Some(n),
        precision: precision.into(),
        seq_len: Some(2048),
        gbs: Some(gbs),
        mbs: Some(1),
        tp: Some(tp),
        pp: Some(1),
        step_time_s: Some(1.0),
        ..Point::default()
    }
}

/// The same in BF16.
pub fn run(model: &str, gpu: &str, n: u32, tp: u32, gbs: u32) -> Point {
    run_at(model, gpu, "BF16", n, tp, gbs)
}

/// `points` with each step time what `truth` projects for it, times `slow` of its index:
/// runs with a known right answer for the calibration fit.
pub fn measured(points: &[Point], truth: &Profiles, slow: impl Fn(usize) -> f64) -> Vec<Point> {
    let v = published::validate(points, truth, &mut Native, &|_| {});
    assert!(v.unsupported.is_empty(), "{:?}", v.unsupported);
    let mut out = points.to_vec();
    for c in &v.checked {
        out[c.index].step_time_s = Some(c.predicted_step_s * slow(c.index));
    }
    out
}
