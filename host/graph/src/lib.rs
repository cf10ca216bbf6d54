//! The runner's operation graph.
//!
//! A workload plugin returns a logical forward graph (tensors with shapes, operations
//! from a fixed primitive set, each tagged with its layer and parallel role). The host
//! converts it into [`Graph`], validates it, counts it, derives its backward pass and
//! shards it for a layout. The same graph feeds execution and projection, so counting
//! and running never disagree.
//!
//! Core concepts:
//! - [`Graph`], [`Tensor`], [`Op`]: the IR ([`ir`]).
//! - [`validate::validate`]: shape, dtype, attribute and dataflow checks of a plugin's graph.
//! - [`count`]: the canonical FLOP/byte/parameter counter and its printed [`count::Convention`].
//! - [`peft::lora`]: a model's LoRA fine-tuning graph (frozen base, trained adapters).
//! - [`pipeline::PipelineSplit`]: how the layers split over pipeline chunks (Megatron's
//!   accounting of the embedding and loss, and its layout strings).

pub mod autodiff;
pub mod count;
pub mod ir;
pub mod modules;
pub mod peft;
pub mod pipeline;
pub mod recompute;
pub mod shard;
pub mod validate;

pub use ir::{Attr, DType, Graph, GraphError, NamedOp, Op, OpKind, Role, Tensor, TensorId, TensorKind};

/// Builders for hand-written test graphs, shared by the unit tests of every module.
#[cfg(test)]
pub(crate) mod testing {
    use crate::ir::{Attr, DType, NamedOp, OpKind, Role, Tensor, TensorKind};

    pub fn t(name: &str, shape: &[u64], dtype: DType, kind: TensorKind) -> Tensor {
        Tensor { name: name.into(), shape: shape.to_vec(), dtype, kind }
    }

    /// A replicated operation in `layer`.
    pub fn op_in(name: &str, kind: OpKind, i: &[&str], o: &[&str], attrs: &[(&str, Attr)], layer: i32) -> NamedOp {
        NamedOp::of(name, kind, i, o, attrs, layer, Role::Replicated)
    }

    /// A replicated operation in layer 0.
    pub fn op(name: &str, kind: OpKind, i: &[&str], o: &[&str], attrs: &[(&str, Attr)]) -> NamedOp {
        op_in(name, kind, i, o, attrs, 0)
    }
}
