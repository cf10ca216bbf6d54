//! The graph IR: tensors, operations, attributes. Mirrors the WIT `graph` record, with
//! tensor references resolved from names to indices.

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use serde::Serialize;

/// Index of a tensor in [`Graph::tensors`].
pub type TensorId = usize;

/// Number formats (mirrors WIT `dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum DType {
    F32,
    BF16,
    F16,
    Fp8E4M3,
    Fp8E5M2,
    MxFp8,
    NvFp4,
    I32,
}

impl DType {
    /// Storage bytes per element (MXFP8 and NVFP4 include their block scales).
    pub fn bytes(self) -> f64 {
        match self {
            DType::F32 | DType::I32 => 4.0,
            DType::BF16 | DType::F16 => 2.0,
            DType::Fp8E4M3 | DType::Fp8E5M2 => 1.0,
            DType::MxFp8 => 1.0 + 1.0 / 32.0,
            DType::NvFp4 => 0.5 + 1.0 / 16.0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "fp32",
            DType::BF16 => "bf16",
            DType::F16 => "fp16",
            DType::Fp8E4M3 => "fp8-e4m3",
            DType::Fp8E5M2 => "fp8-e5m2",
            DType::MxFp8 => "mxfp8",
            DType::NvFp4 => "nvfp4",
            DType::I32 => "int32",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum TensorKind {
    /// A trained parameter: it gets a gradient and optimizer state.
    Weight,
    /// A parameter that is read but not trained (the base weights of a LoRA fine-tune,
    /// [`crate::peft`]): no gradient, no optimizer state. Plugins never declare one; the
    /// host's fine-tuning transforms do.
    Frozen,
    Activation,
    Input,
}

impl TensorKind {
    /// A parameter, trained or frozen: held by the model, not produced by an op.
    pub fn is_param(self) -> bool {
        matches!(self, TensorKind::Weight | TensorKind::Frozen)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tensor {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: DType,
    pub kind: TensorKind,
}

impl Tensor {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// The host's primitive set (mirrors WIT `op-kind`), plus the collectives the sharding
/// pass inserts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum OpKind {
    Linear,
    Embedding,
    RmsNorm,
    LayerNorm,
    Rotary,
    Attention,
    SwiGlu,
    GeGlu,
    Gelu,
    SquaredRelu,
    Add,
    Concat,
    CrossEntropy,
    Router,
    MoeDispatch,
    GroupedLinear,
    MoeCombine,
    /// Mamba's depthwise causal convolution along the sequence with SiLU fused
    /// (`causal_conv1d_fn(x, w, b, activation="silu")`): inputs [x (B,T,..) with Ch
    /// channels in its trailing axes, w (Ch,K), b (Ch)] -> silu(b + sum_k w[c,k] x[t-K+1+k]),
    /// the shape of x; positions before the sequence read zero.
    CausalConv1d,
    /// Mamba-2's selective state-space scan (SSD): inputs [x (B,T,H,P), dt (B,T,H),
    /// b (B,T,G,N), c (B,T,G,N), a_log (H), d (H), dt_bias (H)] -> y (B,T,H,P). Per head
    /// h of group g = h / (H/G), with dt' = softplus(dt + dt_bias) and a = -exp(a_log):
    /// S_t = exp(dt'_t a) S_{t-1} + dt'_t x_t b_t^T (S is P x N, zero before the sequence),
    /// y_t = S_t c_t + d x_t. Attribute `chunk`: the chunk length GPU kernels split the
    /// sequence into (what their work is counted by; the result does not depend on it).
    SsmScan,
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Send,
    Recv,
}

/// How an operation's work splits across a parallel layout (mirrors WIT `parallel-role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Role {
    Replicated,
    ColumnParallel,
    RowParallel,
    HeadParallel,
    Sequence,
    Expert,
    VocabParallel,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Attr {
    Int(i64),
    Float(f64),
    Flag(bool),
    Text(String),
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Op {
    pub name: String,
    pub kind: OpKind,
    pub inputs: Vec<TensorId>,
    pub outputs: Vec<TensorId>,
    pub attrs: BTreeMap<String, Attr>,
    /// Transformer layer, or -1 for embedding, head and loss.
    pub layer: i32,
    pub role: Role,
}

impl Op {
    pub fn int(&self, key: &str) -> Option<i64> {
        match self.attrs.get(key) {
            Some(Attr::Int(v)) => Some(*v),
            _ => None,
        }
    }
    pub fn float(&self, key: &str) -> Option<f64> {
        match self.attrs.get(key) {
            Some(Attr::Float(v)) => Some(*v),
            Some(Attr::Int(v)) => Some(*v as f64),
            _ => None,
        }
    }
    pub fn flag(&self, key: &str) -> Option<bool> {
        match self.attrs.get(key) {
            Some(Attr::Flag(v)) => Some(*v),
            _ => None,
        }
    }
    pub fn text(&self, key: &str) -> Option<&str> {
        match self.attrs.get(key) {
            Some(Attr::Text(v)) => Some(v),
            _ => None,
        }
    }
}

/// A forward graph: tensors, operations in execution order, and the scalar loss.
#[derive(Clone, Debug, Serialize)]
pub struct Graph {
    pub tensors: Vec<Tensor>,
    pub ops: Vec<Op>,
    pub loss: TensorId,
    /// Each tensor's name → its id, made on first use (the projection's graphs, read,
    /// reduced and sharded per layout, never look a name up: a copy of every name per
    /// graph for nothing).
    #[serde(skip)]
    index: OnceLock<HashMap<String, TensorId>>,
}

/// What is wrong with a graph, named precisely enough to fix the plugin.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GraphError {
    #[error("tensor name '{0}' is used twice")]
    DuplicateTensor(String),
    #[error("operation '{op}' refers to tensor '{tensor}', which the graph does not declare")]
    UnknownTensor { op: String, tensor: String },
    #[error("operation '{op}': {problem}")]
    Invalid { op: String, problem: String },
    #[error("tensor '{0}': {1}")]
    BadTensor(String, String),
}

impl Graph {
    /// The op that writes each tensor, by tensor id (the last if several do); none for
    /// parameters and inputs.
    pub fn producers(&self) -> Vec<Option<usize>> {
        let mut producer = vec![None; self.tensors.len()];
        for (i, op) in self.ops.iter().enumerate() {
            for &o in &op.outputs {
                producer[o] = Some(i);
            }
        }
        producer
    }

    /// Build a graph, resolving tensor names. Operations reference tensors by name.
    pub fn new(tensors: Vec<Tensor>, ops: Vec<NamedOp>, loss: &str) -> Result<Graph, GraphError> {
        // Names are resolved through borrowed keys; the graph's own index is made only if
        // a name is looked up later, which the layout search, reading a plugin's graph per
        // micro-batch size and reducing each, never does.
        let mut index: HashMap<&str, TensorId> = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if index.insert(&t.name, i).is_some() {
                return Err(GraphError::DuplicateTensor(t.name.clone()));
            }
        }
        let resolve = |op: &str, names: &[String]| -> Result<Vec<TensorId>, GraphError> {
            names
                .iter()
                .map(|n| {
                    index.get(n.as_str()).copied().ok_or_else(|| GraphError::UnknownTensor {
                        op: op.to_string(),
                        tensor: n.clone(),
                    })
                })
                .collect()
        };
        let mut resolved = Vec::with_capacity(ops.len());
        for op in ops {
            resolved.push(Op {
                inputs: resolve(&op.name, &op.inputs)?,
                outputs: resolve(&op.name, &op.outputs)?,
                name: op.name,
                kind: op.kind,
                attrs: op.attrs,
                layer: op.layer,
                role: op.role,
            });
        }
        let loss = *index.get(loss).ok_or_else(|| GraphError::UnknownTensor {
            op: "(loss)".into(),
            tensor: loss.to_string(),
        })?;
        Ok(Graph { tensors, ops: resolved, loss, index: OnceLock::new() })
    }

    /// A graph whose ops already refer to tensors by id, with distinct tensor names (the
    /// sharding pass makes both as it goes, where resolving its names again through
    /// [`Graph::new`] copied and hashed every name a second time). The name index is
    /// made on first use.
    pub(crate) fn from_resolved(tensors: Vec<Tensor>, ops: Vec<Op>, loss: TensorId) -> Graph {
        debug_assert!(loss < tensors.len() && ops.iter().all(|o| o.inputs.iter().chain(&o.outputs).all(|&t| t < tensors.len())));
        let g = Graph { tensors, ops, loss, index: OnceLock::new() };
        debug_assert!(g.index().len() == g.tensors.len(), "tensor names are distinct");
        g
    }

    /// The name index, made on first use (the last id of a name, were one repeated).
    fn index(&self) -> &HashMap<String, TensorId> {
        self.index.get_or_init(|| self.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect())
    }

    pub fn tensor_id(&self, name: &str) -> Option<TensorId> {
        self.index().get(name).copied()
    }

    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id]
    }

    /// `op` with its tensors by name again, as [`Graph::new`] takes it (for transforms
    /// that rebuild a graph).
    pub fn named(&self, op: &Op) -> NamedOp {
        let names = |ids: &[TensorId]| ids.iter().map(|&t| self.tensors[t].name.clone()).collect();
        NamedOp {
            name: op.name.clone(),
            kind: op.kind,
            inputs: names(&op.inputs),
            outputs: names(&op.outputs),
            attrs: op.attrs.clone(),
            layer: op.layer,
            role: op.role,
        }
    }

    /// Add a tensor (used by graph transforms); returns its id.
    pub fn add_tensor(&mut self, t: Tensor) -> Result<TensorId, GraphError> {
        self.index();
        let index = self.index.get_mut().expect("made just above");
        if index.contains_key(&t.name) {
            return Err(GraphError::DuplicateTensor(t.name));
        }
        let id = self.tensors.len();
        index.insert(t.name.clone(), id);
        self.tensors.push(t);
        Ok(id)
    }
}

/// An operation as a plugin writes it: tensors by name.
#[derive(Clone, Debug)]
pub struct NamedOp {
    pub name: String,
    pub kind: OpKind,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attrs: BTreeMap<String, Attr>,
    pub layer: i32,
    pub role: Role,
}

impl NamedOp {
    /// An operation from borrowed names (hand-written graphs: tests and fixtures).
    pub fn of(name: &str, kind: OpKind, inputs: &[&str], outputs: &[&str], attrs: &[(&str, Attr)], layer: i32, role: Role) -> NamedOp {
        NamedOp {
            name: name.into(),
            kind,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            attrs: attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            layer,
            role,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{op, t};

    /// Storage per element: MXFP8 one 8-bit scale per 32 elements (1 + 1/32 bytes),
    /// NVFP4 4 bits plus one 8-bit scale per 16 (0.5 + 1/16); names as the WIT spells them.
    #[test]
    fn dtype_bytes_and_names() {
        let all = [DType::F32, DType::BF16, DType::F16, DType::Fp8E4M3, DType::Fp8E5M2, DType::MxFp8, DType::NvFp4, DType::I32];
        let bytes: Vec<f64> = all.iter().map(|d| d.bytes()).collect();
        assert_eq!(bytes, [4.0, 2.0, 2.0, 1.0, 1.0, 1.03125, 0.5625, 4.0]);
        let names: Vec<&str> = all.iter().map(|d| d.name()).collect();
        assert_eq!(names, ["fp32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2", "mxfp8", "nvfp4", "int32"]);
    }

    #[test]
    fn graph_building_resolves_names_and_refuses_duplicates() {
        let f = |n: &str, s: &[u64]| t(n, s, DType::F32, TensorKind::Activation);
        let dup = Graph::new(vec![f("a", &[1]), f("a", &[2])], vec![], "a");
        assert_eq!(dup.unwrap_err(), GraphError::DuplicateTensor("a".into()));
        let attrs = [("eps", Attr::Int(2)), ("on", Attr::Flag(false))];
        let mut g = Graph::new(
            vec![f("x", &[2, 3]), f("y", &[2, 3]), f("loss", &[])],
            vec![op("a", OpKind::Add, &["x", "x"], &["y"], &attrs), op("b", OpKind::Add, &["y", "y"], &["y"], &[])],
            "loss",
        )
        .unwrap();
        // The last writer is the producer.
        assert_eq!(g.producers(), [None, Some(1), None]);
        assert_eq!(g.tensor(g.loss).numel(), 1, "a scalar has one element");
        assert_eq!(g.tensor(0).numel(), 6);
        assert_eq!((g.ops[0].float("eps"), g.ops[0].int("eps"), g.ops[0].flag("on")), (Some(2.0), Some(2), Some(false)));
        assert_eq!(g.add_tensor(f("x", &[1])).unwrap_err(), GraphError::DuplicateTensor("x".into()));
        assert_eq!(g.add_tensor(f("z", &[1])), Ok(3));
        assert_eq!(g.tensor_id("z"), Some(3));
    }

    /// A name the graph does not declare, as an op's tensor or as the loss, is an error;
    /// an attribute is read only as its own type.
    #[test]
    fn unknown_names_are_errors_and_attributes_keep_their_type() {
        let f = |n: &str| t(n, &[1], DType::F32, TensorKind::Activation);
        let e = Graph::new(vec![f("x")], vec![], "loss").unwrap_err();
        assert_eq!(e, GraphError::UnknownTensor { op: "(loss)".into(), tensor: "loss".into() });
        let e = Graph::new(vec![f("x")], vec![op("a", OpKind::Add, &["x", "y"], &["x"], &[])], "x").unwrap_err();
        assert_eq!(e, GraphError::UnknownTensor { op: "a".into(), tensor: "y".into() });
        let attrs = [("scale", Attr::Float(0.5)), ("name", Attr::Text("tp".into()))];
        let g = Graph::new(vec![f("x")], vec![op("a", OpKind::Add, &["x", "x"], &["x"], &attrs)], "x").unwrap();
        let a = &g.ops[0];
        assert_eq!((a.int("scale"), a.float("scale"), a.text("scale")), (None, Some(0.5), None));
        assert_eq!((a.text("name"), a.int("name"), a.flag("name")), (Some("tp"), None, None));
    }
}
