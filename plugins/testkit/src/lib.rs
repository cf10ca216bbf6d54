//! Native test support for workload plugins. A plugin's unit tests call its `Guest`
//! functions directly, convert the returned SDK graph into the host's IR with [`to_host`],
//! and validate and count it with the host's own `runner-graph` code, so the published
//! parameter and FLOP checks run against exactly what the host will see.
//!
//! Plugins use this crate only as a dev-dependency: their wasm builds never link the host.

use runner_graph::count::{self, Convention, ParamCount};
use runner_graph::{Attr, DType, NamedOp, OpKind, Role, TensorKind};
use runner_plugin_sdk::workload as wit;

/// The SDK graph as the host's IR (names resolved, attributes keyed).
///
/// # Panics
/// If the graph names an undeclared tensor; the host would reject it the same way.
pub fn to_host(g: &wit::Graph) -> runner_graph::Graph {
    let tensors = g
        .tensors
        .iter()
        .map(|t| runner_graph::Tensor {
            name: t.name.clone(),
            shape: t.shape.clone(),
            dtype: dtype(t.dtype),
            kind: match t.kind {
                wit::TensorKind::Weight => TensorKind::Weight,
                wit::TensorKind::Activation => TensorKind::Activation,
                wit::TensorKind::Input => TensorKind::Input,
            },
        })
        .collect();
    let ops = g
        .operations
        .iter()
        .map(|o| NamedOp {
            name: o.name.clone(),
            kind: kind(o.kind),
            inputs: o.inputs.clone(),
            outputs: o.outputs.clone(),
            attrs: o
                .attrs
                .iter()
                .map(|a| {
                    let v = match &a.value {
                        wit::AttrValue::Int(v) => Attr::Int(*v),
                        wit::AttrValue::Float(v) => Attr::Float(*v),
                        wit::AttrValue::Flag(v) => Attr::Flag(*v),
                        wit::AttrValue::Text(v) => Attr::Text(v.clone()),
                    };
                    (a.key.clone(), v)
                })
                .collect(),
            layer: o.layer,
            role: role(o.role),
        })
        .collect();
    runner_graph::Graph::new(tensors, ops, &g.loss).unwrap_or_else(|e| panic!("graph does not resolve: {e}"))
}

fn dtype(d: wit::Dtype) -> DType {
    match d {
        wit::Dtype::Fp32 => DType::F32,
        wit::Dtype::Bf16 => DType::BF16,
        wit::Dtype::Fp16 => DType::F16,
        wit::Dtype::Fp8E4m3 => DType::Fp8E4M3,
        wit::Dtype::Fp8E5m2 => DType::Fp8E5M2,
        wit::Dtype::Mxfp8 => DType::MxFp8,
        wit::Dtype::Nvfp4 => DType::NvFp4,
        wit::Dtype::Int32 => DType::I32,
    }
}

fn kind(k: wit::OpKind) -> OpKind {
    use wit::OpKind as W;
    match k {
        W::Linear => OpKind::Linear,
        W::Embedding => OpKind::Embedding,
        W::RmsNorm => OpKind::RmsNorm,
        W::LayerNorm => OpKind::LayerNorm,
        W::Rotary => OpKind::Rotary,
        W::Attention => OpKind::Attention,
        W::Swiglu => OpKind::SwiGlu,
        W::Geglu => OpKind::GeGlu,
        W::Gelu => OpKind::Gelu,
        W::SquaredRelu => OpKind::SquaredRelu,
        W::Add => OpKind::Add,
        W::Concat => OpKind::Concat,
        W::CrossEntropy => OpKind::CrossEntropy,
        W::Router => OpKind::Router,
        W::MoeDispatch => OpKind::MoeDispatch,
        W::GroupedLinear => OpKind::GroupedLinear,
        W::MoeCombine => OpKind::MoeCombine,
    }
}

fn role(r: wit::ParallelRole) -> Role {
    use wit::ParallelRole as W;
    match r {
        W::Replicated => Role::Replicated,
        W::ColumnParallel => Role::ColumnParallel,
        W::RowParallel => Role::RowParallel,
        W::HeadParallel => Role::HeadParallel,
        W::Sequence => Role::Sequence,
        W::Expert => Role::Expert,
        W::VocabParallel => Role::VocabParallel,
    }
}

/// A plugin's `graph` export.
pub type GraphFn = fn(wit::GraphRequest) -> Result<wit::Graph, String>;

/// Build `variant` (seq `seq`, micro-batch `mb`, `layers` layers, 0 = all), convert and
/// validate it with the host's validator.
///
/// # Panics
/// If the plugin refuses the request or the host rejects the graph.
pub fn host_graph(graph: GraphFn, variant: &str, seq: u32, mb: u32, layers: u32) -> runner_graph::Graph {
    let req = wit::GraphRequest { variant: variant.into(), seq_len: seq, micro_batch: mb, layers };
    let g = graph(req).unwrap_or_else(|e| panic!("{variant}: {e}"));
    let h = to_host(&g);
    if let Err(e) = runner_graph::validate::validate(&h) {
        panic!("{variant}: host validation failed: {e}");
    }
    h
}

/// Every variant builds at its default sequence length with micro-batch 1 and validates,
/// and a 1-layer proxy builds too.
pub fn check_all_variants(info: &wit::ModelInfo, graph: GraphFn) {
    assert!(!info.variants.is_empty(), "{}: no variants", info.family);
    for v in &info.variants {
        assert_eq!(v.family, info.family, "{}: family mismatch", v.name);
        assert!(!v.citation.is_empty(), "{}: no citation", v.name);
        host_graph(graph, &v.name, v.defaults.seq_len, 1, 0);
        host_graph(graph, &v.name, v.defaults.seq_len.min(128), 2, 1);
        for l in &v.layouts {
            assert!(!l.source.is_empty(), "{}: layout without source", v.name);
            assert!(l.gpus_min <= l.gpus_max && l.gpus_min > 0, "{}: bad GPU range", v.name);
        }
    }
    let err = graph(wit::GraphRequest { variant: "no-such-model".into(), seq_len: 8, micro_batch: 1, layers: 0 })
        .expect_err("unknown variant must fail");
    assert!(err.contains(&info.variants[0].name), "error should list known variants: {err}");
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

/// Relative error of `got` against `want`, printed for the test log.
pub fn rel_err(what: &str, got: f64, want: f64) -> f64 {
    let e = (got - want) / want;
    println!("{what}: {got:.4e} vs published {want:.4e} ({:+.3}%)", 100.0 * e);
    e
}

/// Assert `got` is within `tol` (fraction) of `want`.
pub fn assert_close(what: &str, got: f64, want: f64, tol: f64) {
    let e = rel_err(what, got, want);
    assert!(e.abs() <= tol, "{what}: {got:.4e} is {:+.3}% from {want:.4e} (tolerance {:.2}%)", 100.0 * e, 100.0 * tol);
}
