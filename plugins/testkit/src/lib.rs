//! Native test support for workload plugins. A plugin's unit tests call its `Guest`
//! functions directly, convert the returned SDK graph into the host's IR with [`to_host`],
//! and validate and count it with the host's own `runner-graph` code, so the published
//! parameter and FLOP checks run against exactly what the host will see.
//!
//! Plugins use this crate only as a dev-dependency: their wasm builds never link the host.

use runner_graph::count::{self, Convention, ParamCount};
use runner_plugin_sdk::workload as wit;

pub mod mamba;

/// The host's conversion, expanded over the SDK's types: one definition (in
/// `runner_contract`), so a graph that converts here converts in the host.
mod convert {
    use runner_plugin_sdk::workload::Graph as ModelGraph;
    use runner_plugin_sdk::workload::*;
    runner_contract::graph_to_ir!();
}

/// The SDK graph as the host's IR (names resolved, attributes keyed), converted and
/// bounded by exactly the code the host runs on the graph a plugin returns.
///
/// # Panics
/// With the host's message, where the host would refuse the graph.
pub fn to_host(g: &wit::Graph) -> runner_graph::Graph {
    convert::graph_to_ir(g.clone()).unwrap_or_else(|e| panic!("the host would refuse this graph: {e}"))
}

/// A plugin's `graph` export.
pub type GraphFn = fn(wit::GraphRequest) -> Result<wit::Graph, String>;

/// Build `variant` (seq `seq`, micro-batch `mb`, `layers` layers, 0 = all), convert and
/// validate it with the host's validator.
///
/// # Panics
/// If the plugin refuses the request or the host rejects the graph.
pub fn host_graph(graph: GraphFn, variant: &str, seq: u32, mb: u32, layers: u32) -> runner_graph::Graph {
    let req = wit::GraphRequest { variant: variant.into(), seq_len: seq, micro_batch: mb, layers, phase: wit::Phase::Training };
    let g = graph(req).unwrap_or_else(|e| panic!("{variant}: {e}"));
    let h = to_host(&g);
    if let Err(e) = runner_graph::validate::validate(&h) {
        panic!("{variant}: host validation failed: {e}");
    }
    h
}

/// `describe` passes the host's rules, every variant builds at its default sequence length
/// with micro-batch 1 and validates, and a 1-layer proxy builds too.
pub fn check_all_variants(info: &wit::ModelInfo, graph: GraphFn) {
    // The contract's rules (no variants, GPU ranges, sizes, ...) are the host's own code;
    // below are only the first-party plugins' stricter habits.
    if let Err(e) = wit::validate_model_info(info) {
        panic!("the host would refuse describe: {e}");
    }
    for v in &info.variants {
        assert_eq!(v.family, info.family, "{}: family mismatch", v.name);
        assert!(!v.citation.is_empty(), "{}: no citation", v.name);
        host_graph(graph, &v.name, v.defaults.seq_len, 1, 0);
        host_graph(graph, &v.name, v.defaults.seq_len.min(128), 2, 1);
        for l in &v.layouts {
            assert!(!l.source.is_empty(), "{}: layout without source", v.name);
        }
    }
    let err = graph(wit::GraphRequest { variant: "no-such-model".into(), seq_len: 8, micro_batch: 1, layers: 0, phase: wit::Phase::Training })
        .expect_err("unknown variant must fail");
    assert!(err.contains(&info.variants[0].name), "error should list known variants: {err}");
}

/// The graph the host measures of `variant` on a CPU, and the parameters of its measured
/// layers: asserts that those fit the host's budget
/// ([`runner_contract::measurement`]: 2 layers at 16 bytes per parameter in 1 GiB), and
/// builds it at the measured size (sequence 256, 2048 tokens a step) with `layers` layers
/// (0: the whole model).
pub fn measured_graph(graph: GraphFn, variant: &str, layers: u32) -> (runner_graph::Graph, ParamCount) {
    use runner_contract::measurement::{BYTES_PER_PARAM, CPU_MAX_SEQ, CPU_PARAM_BUDGET_BYTES, CPU_TOKENS, LAYERS_RUN};
    let measured = params(graph, variant, LAYERS_RUN);
    assert!(
        measured.total * BYTES_PER_PARAM < CPU_PARAM_BUDGET_BYTES,
        "{variant}: {LAYERS_RUN} layers of {} params need {} bytes, past the CPU measurement's {CPU_PARAM_BUDGET_BYTES}; \
         give the family a smaller proxy variant (a small hidden size and vocabulary, as llama3-tiny)",
        measured.total,
        measured.total * BYTES_PER_PARAM
    );
    (host_graph(graph, variant, CPU_MAX_SEQ, CPU_TOKENS / CPU_MAX_SEQ, layers), measured)
}

/// Parameters of `variant` (`layers` = 0: the whole model including MTP modules; the
/// model's layer count: without them).
pub fn params(graph: GraphFn, variant: &str, layers: u32) -> ParamCount {
    count::params(&host_graph(graph, variant, 128, 1, layers))
}

/// Model FLOPs per sequence (forward + backward) at `seq` under `conv`.
pub fn flops_per_sample(graph: GraphFn, variant: &str, seq: u32, layers: u32, conv: &Convention) -> f64 {
    count::model_flops_per_step(&host_graph(graph, variant, seq, 1, layers), conv)
}

/// Assert that counting causal attention as T/2 keys saves exactly half the attention
/// scores of `layers` layers at `seq`: forward, and backward twice over, of Q·Kᵀ
/// (2·T²·`qk_width` FLOPs) and P·V (2·T²·`v_width`), where a width is heads × head dim.
/// Catches an attention op built without its causal flag, with the wrong head count or
/// dims, or missing from some layers.
pub fn assert_causal_halves_scores(graph: GraphFn, variant: &str, seq: u32, layers: u32, qk_width: u32, v_width: u32) {
    let full = flops_per_sample(graph, variant, seq, 0, &Convention::FULL);
    let causal = flops_per_sample(graph, variant, seq, 0, &Convention::CAUSAL);
    let t2 = f64::from(seq) * f64::from(seq);
    let scores = 3.0 * 2.0 * t2 * f64::from(qk_width + v_width) * f64::from(layers);
    assert_close(&format!("{variant} FLOPs/sample, full less causal"), full - causal, scores / 2.0, 1e-9);
}

/// Assert `got` is within `tol` (fraction) of `want` (printed for the test log either way).
pub fn assert_close(what: &str, got: f64, want: f64, tol: f64) {
    let e = (got - want) / want;
    println!("{what}: {got:.4e} vs {want:.4e} ({:+.3}%)", 100.0 * e);
    assert!(e.abs() <= tol, "{what}: {got:.4e} is {:+.3}% from {want:.4e} (tolerance {:.2}%)", 100.0 * e, 100.0 * tol);
}
