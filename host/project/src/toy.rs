//! The smallest model the projection can cost, shared by this crate's unit tests and its
//! integration tests (`tests/projection.rs`) so the fixture is written once: an embedding,
//! one GEMM layer and the output head with its loss, in BF16. Test support only, hidden
//! from the documentation; no runner code path uses it.

use runner_graph::{DType, Graph, NamedOp, OpKind, Role, Tensor, TensorKind};

use crate::model::{GraphSource, Model};
use crate::precision::{Plan, Recipe};
use crate::profile::GpuProfile;
use crate::project::Projector;

/// A projector for the one-layer model at sequence length `seq`, hidden size `hidden` (the
/// layer's one `hidden` x `hidden` GEMM) and vocabulary `vocab`, under the built-in BF16
/// plan on `gpu`.
///
/// # Panics
/// Where `seq` exceeds `u32::MAX` or the sizes make the graph invalid: test input only.
#[must_use]
pub fn projector(seq: u64, hidden: u64, vocab: u64, gpu: GpuProfile) -> Projector<'static> {
    let (t, c, v) = (seq, hidden, vocab);
    let graph = move |mb: u32| -> Result<Graph, String> {
        let b = u64::from(mb);
        let ten = |n: &str, s: Vec<u64>, d: DType, k: TensorKind| Tensor { name: n.into(), shape: s, dtype: d, kind: k };
        let op = |n: &str, k: OpKind, i: &[&str], o: &[&str], layer: i32, role: Role| NamedOp::of(n, k, i, o, &[], layer, role);
        Graph::new(
            vec![
                ten("tokens", vec![b, t], DType::I32, TensorKind::Input),
                ten("targets", vec![b, t], DType::I32, TensorKind::Input),
                ten("table", vec![v, c], DType::BF16, TensorKind::Weight),
                ten("x", vec![b, t, c], DType::BF16, TensorKind::Activation),
                ten("w", vec![c, c], DType::BF16, TensorKind::Weight),
                ten("y", vec![b, t, c], DType::BF16, TensorKind::Activation),
                ten("head", vec![v, c], DType::BF16, TensorKind::Weight),
                ten("logits", vec![b, t, v], DType::BF16, TensorKind::Activation),
                ten("loss", vec![], DType::F32, TensorKind::Activation),
            ],
            vec![
                op("embed", OpKind::Embedding, &["tokens", "table"], &["x"], -1, Role::VocabParallel),
                op("layers.0.fc", OpKind::Linear, &["x", "w"], &["y"], 0, Role::ColumnParallel),
                op("head", OpKind::Linear, &["y", "head"], &["logits"], -1, Role::VocabParallel),
                op("loss", OpKind::CrossEntropy, &["logits", "targets"], &["loss"], -1, Role::VocabParallel),
            ],
            "loss",
        )
        .map_err(|e| e.to_string())
    };
    let mut source: Box<dyn GraphSource> = Box::new(graph);
    let seq = u32::try_from(t).expect("the toy's sequence fits u32");
    let model = Model::new("toy", seq, source.as_mut()).expect("the toy graph is valid");
    let plan = Plan::builtin(Recipe::Bf16, &model.graph);
    Projector::new(model, source, gpu, plan)
}
