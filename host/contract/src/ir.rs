//! A plugin's graph into the host's IR (`runner_graph`), with the checks that make it safe
//! to count, differentiate and allocate: bounded sizes, printable names, no non-finite or
//! duplicate attributes, and element counts that cannot overflow u64 anywhere later.

/// Expand `graph_to_ir` (and `dtype_to_ir`) in a module that has the generated workload
/// types (`ModelGraph`, `OpKind`, `ParallelRole`, `AttrValue`, `TensorKind`) and `Dtype` in
/// scope. The expanding crate depends on `runner-graph`. The host converts every graph a
/// plugin returns with it; the testkit converts a plugin's graph in its native unit tests
/// with the very same code, so a plugin that passes its own tests passes the host.
#[macro_export]
macro_rules! graph_to_ir {
    () => {
        /// A contract number format as the IR's.
        pub fn dtype_to_ir(d: Dtype) -> ::runner_graph::DType {
            use ::runner_graph::DType;
            match d {
                Dtype::Fp32 => DType::F32,
                Dtype::Bf16 => DType::BF16,
                Dtype::Fp16 => DType::F16,
                Dtype::Fp8E4m3 => DType::Fp8E4M3,
                Dtype::Fp8E5m2 => DType::Fp8E5M2,
                Dtype::Mxfp8 => DType::MxFp8,
                Dtype::Nvfp4 => DType::NvFp4,
                Dtype::Int32 => DType::I32,
            }
        }

        /// The graph as host IR: names resolved to indices, attributes keyed. Sizes are
        /// checked before anything is allocated from them.
        ///
        /// # Errors
        /// The first broken rule, naming the tensor or operation.
        pub fn graph_to_ir(g: ModelGraph) -> Result<::runner_graph::Graph, String> {
            use ::runner_graph::{Attr, NamedOp, OpKind as K, Role, Tensor, TensorKind as TK};
            use $crate::limits;
            use $crate::text;
            text::at_most("tensors", g.tensors.len(), limits::GRAPH_TENSORS)?;
            text::at_most("operations", g.operations.len(), limits::GRAPH_OPS)?;
            // The graph is taken by value so that its names, shapes and attributes move
            // into the IR rather than being copied, and names are escaped for a message
            // only when there is one: both were most of a conversion's allocations.
            let mut total: u64 = 0;
            let mut tensors = Vec::with_capacity(g.tensors.len());
            for t in g.tensors {
                text::name("a tensor's name", &t.name)?;
                if t.shape.len() > limits::RANK {
                    return Err(format!(
                        "tensor {} has {} axes (at most {})",
                        text::shown(&t.name),
                        t.shape.len(),
                        limits::RANK
                    ));
                }
                let numel = t
                    .shape
                    .iter()
                    .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                    .filter(|&n| n <= limits::TENSOR_ELEMENTS)
                    .ok_or_else(|| {
                        format!(
                            "tensor {}: shape {:?} has more than 2^50 elements",
                            text::shown(&t.name),
                            t.shape
                        )
                    })?;
                total = total
                    .checked_add(numel)
                    .filter(|&n| n <= limits::GRAPH_ELEMENTS)
                    .ok_or_else(|| {
                        "the graph's tensors hold more than 2^56 elements together".to_string()
                    })?;
                tensors.push(Tensor {
                    name: t.name,
                    shape: t.shape,
                    dtype: dtype_to_ir(t.dtype),
                    kind: match t.kind {
                        TensorKind::Weight => TK::Weight,
                        TensorKind::Activation => TK::Activation,
                        TensorKind::Input => TK::Input,
                    },
                });
            }
            text::name("the loss tensor's name", &g.loss)?;
            // Every operation is checked, in order, before any is taken apart: the set of
            // names seen borrows them.
            {
                let mut op_names = std::collections::HashSet::with_capacity(g.operations.len());
                // An operation's keys so far, sorted: a repeat is found in O(log n).
                let mut keys: Vec<&str> = Vec::new();
                for op in &g.operations {
                    text::name("an operation's name", &op.name)?;
                    let ctx = |m: String| format!("operation {}: {m}", text::shown(&op.name));
                    if !op_names.insert(op.name.as_str()) {
                        return Err(format!("operation name {} appears twice", text::shown(&op.name)));
                    }
                    text::at_most("inputs", op.inputs.len(), limits::OP_INPUTS).map_err(ctx)?;
                    text::at_most("outputs", op.outputs.len(), limits::OP_OUTPUTS).map_err(ctx)?;
                    text::at_most("attributes", op.attrs.len(), limits::OP_ATTRS).map_err(ctx)?;
                    for t in op.inputs.iter().chain(&op.outputs) {
                        text::name("a tensor it names", t).map_err(ctx)?;
                    }
                    keys.clear();
                    for a in &op.attrs {
                        text::name("an attribute key", &a.key).map_err(ctx)?;
                        match &a.value {
                            AttrValue::Float(v) if !v.is_finite() => {
                                return Err(ctx(format!(
                                    "attribute {} is not finite ({v})",
                                    text::shown(&a.key)
                                )));
                            }
                            AttrValue::Text(v) => text::name("a text attribute", v).map_err(ctx)?,
                            _ => {}
                        }
                        match keys.binary_search(&a.key.as_str()) {
                            Ok(_) => {
                                return Err(ctx(format!(
                                    "attribute {} given twice",
                                    text::shown(&a.key)
                                )));
                            }
                            Err(at) => keys.insert(at, &a.key),
                        }
                    }
                }
            }
            let mut ops = Vec::with_capacity(g.operations.len());
            for op in g.operations {
                ops.push(NamedOp {
                    name: op.name,
                    kind: match op.kind {
                        OpKind::Linear => K::Linear,
                        OpKind::Embedding => K::Embedding,
                        OpKind::RmsNorm => K::RmsNorm,
                        OpKind::LayerNorm => K::LayerNorm,
                        OpKind::Rotary => K::Rotary,
                        OpKind::Attention => K::Attention,
                        OpKind::Swiglu => K::SwiGlu,
                        OpKind::Geglu => K::GeGlu,
                        OpKind::Gelu => K::Gelu,
                        OpKind::SquaredRelu => K::SquaredRelu,
                        OpKind::Add => K::Add,
                        OpKind::Concat => K::Concat,
                        OpKind::CrossEntropy => K::CrossEntropy,
                        OpKind::Router => K::Router,
                        OpKind::MoeDispatch => K::MoeDispatch,
                        OpKind::GroupedLinear => K::GroupedLinear,
                        OpKind::MoeCombine => K::MoeCombine,
                        OpKind::CausalConv1d => K::CausalConv1d,
                        OpKind::SsmScan => K::SsmScan,
                    },
                    inputs: op.inputs,
                    outputs: op.outputs,
                    // Keys are distinct (checked above), so collecting keeps every one.
                    attrs: op
                        .attrs
                        .into_iter()
                        .map(|a| {
                            let value = match a.value {
                                AttrValue::Int(v) => Attr::Int(v),
                                AttrValue::Float(v) => Attr::Float(v),
                                AttrValue::Flag(v) => Attr::Flag(v),
                                AttrValue::Text(v) => Attr::Text(v),
                            };
                            (a.key, value)
                        })
                        .collect(),
                    layer: op.layer,
                    role: match op.role {
                        ParallelRole::Replicated => Role::Replicated,
                        ParallelRole::ColumnParallel => Role::ColumnParallel,
                        ParallelRole::RowParallel => Role::RowParallel,
                        ParallelRole::HeadParallel => Role::HeadParallel,
                        ParallelRole::Sequence => Role::Sequence,
                        ParallelRole::Expert => Role::Expert,
                        ParallelRole::VocabParallel => Role::VocabParallel,
                    },
                });
            }
            ::runner_graph::Graph::new(tensors, ops, &g.loss).map_err(|e| e.to_string())
        }
    };
}
