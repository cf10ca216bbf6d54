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

pub mod autodiff;
pub mod count;
pub mod ir;
pub mod recompute;
pub mod shard;
pub mod validate;

pub use ir::{Attr, DType, Graph, GraphError, NamedOp, Op, OpKind, Role, Tensor, TensorId, TensorKind};
