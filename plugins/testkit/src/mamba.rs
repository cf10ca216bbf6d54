//! A hand-built one-layer Mamba-2 hybrid graph in the host's IR, for host tests of the
//! mixer ops (`CausalConv1d`, `SsmScan`) until a workload plugin builds them.

use runner_graph::{Attr, DType, Graph, NamedOp, OpKind, Role, Tensor, TensorKind};

/// The sizes of a one-layer hybrid model: embedding, a Mamba-2 mixer layer (norm,
/// projections to z, x, B, C and dt, depthwise causal convolutions, the scan, the gate
/// silu(z)·y, a norm per group, the output projection and the residual add), the head.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub b: u64,
    pub t: u64,
    pub c: u64,
    pub heads: u64,
    pub p: u64,
    pub groups: u64,
    pub n: u64,
    pub k: u64,
    pub chunk: i64,
}

/// A CPU-sized mixer: 4 heads of 8 in 2 groups of state 4, kernel 4, chunks of 8.
pub const SMALL: Sizes = Sizes { b: 2, t: 16, c: 32, heads: 4, p: 8, groups: 2, n: 4, k: 4, chunk: 8 };

pub fn mamba_graph(s: Sizes) -> Graph {
    let Sizes { b, t, c, heads: h, p, groups: g, n, k, chunk } = s;
    let v = 64;
    let di = h * p;
    let act = |name: &str, shape: Vec<u64>| Tensor { name: name.into(), shape, dtype: DType::BF16, kind: TensorKind::Activation };
    let weight = |name: &str, shape: Vec<u64>| Tensor { name: name.into(), shape, dtype: DType::BF16, kind: TensorKind::Weight };
    let tensors = vec![
        Tensor { name: "tokens".into(), shape: vec![b, t], dtype: DType::I32, kind: TensorKind::Input },
        Tensor { name: "targets".into(), shape: vec![b, t], dtype: DType::I32, kind: TensorKind::Input },
        weight("embed.weight", vec![v, c]),
        act("h0", vec![b, t, c]),
        weight("l0.norm.weight", vec![c]),
        act("l0.xn", vec![b, t, c]),
        weight("l0.z.weight", vec![di, c]),
        act("l0.z", vec![b, t, h, p]),
        weight("l0.x.weight", vec![di, c]),
        act("l0.xp", vec![b, t, h, p]),
        weight("l0.b.weight", vec![g * n, c]),
        act("l0.bp", vec![b, t, g, n]),
        weight("l0.c.weight", vec![g * n, c]),
        act("l0.cp", vec![b, t, g, n]),
        weight("l0.dt.weight", vec![h, c]),
        act("l0.dt", vec![b, t, h]),
        weight("l0.conv_x.weight", vec![di, k]),
        weight("l0.conv_x.bias", vec![di]),
        act("l0.xc", vec![b, t, h, p]),
        weight("l0.conv_b.weight", vec![g * n, k]),
        weight("l0.conv_b.bias", vec![g * n]),
        act("l0.bc", vec![b, t, g, n]),
        weight("l0.conv_c.weight", vec![g * n, k]),
        weight("l0.conv_c.bias", vec![g * n]),
        act("l0.cc", vec![b, t, g, n]),
        weight("l0.a_log", vec![h]),
        weight("l0.d", vec![h]),
        weight("l0.dt_bias", vec![h]),
        act("l0.y", vec![b, t, h, p]),
        act("l0.gated", vec![b, t, g, di / g]),
        weight("l0.gnorm.weight", vec![di / g]),
        act("l0.yn", vec![b, t, g, di / g]),
        weight("l0.out.weight", vec![c, di]),
        act("l0.o", vec![b, t, c]),
        act("h1", vec![b, t, c]),
        weight("head.weight", vec![v, c]),
        act("logits", vec![b, t, v]),
        Tensor { name: "loss".into(), shape: vec![], dtype: DType::F32, kind: TensorKind::Activation },
    ];
    let op = |name: &str, kind: OpKind, i: &[&str], o: &[&str], layer: i32, role: Role, attrs: &[(&str, Attr)]| {
        NamedOp::of(name, kind, i, o, attrs, layer, role)
    };
    let eps = [("eps", Attr::Float(1e-5))];
    let (col, row, heads) = (Role::ColumnParallel, Role::RowParallel, Role::HeadParallel);
    let ops = vec![
        op("embed", OpKind::Embedding, &["tokens", "embed.weight"], &["h0"], -1, Role::VocabParallel, &[]),
        op("l0.norm", OpKind::RmsNorm, &["h0", "l0.norm.weight"], &["l0.xn"], 0, Role::Replicated, &eps),
        op("l0.z", OpKind::Linear, &["l0.xn", "l0.z.weight"], &["l0.z"], 0, col, &[]),
        op("l0.x", OpKind::Linear, &["l0.xn", "l0.x.weight"], &["l0.xp"], 0, col, &[]),
        op("l0.b", OpKind::Linear, &["l0.xn", "l0.b.weight"], &["l0.bp"], 0, col, &[]),
        op("l0.c", OpKind::Linear, &["l0.xn", "l0.c.weight"], &["l0.cp"], 0, col, &[]),
        op("l0.dt", OpKind::Linear, &["l0.xn", "l0.dt.weight"], &["l0.dt"], 0, col, &[]),
        op("l0.conv_x", OpKind::CausalConv1d, &["l0.xp", "l0.conv_x.weight", "l0.conv_x.bias"], &["l0.xc"], 0, heads, &[]),
        op("l0.conv_b", OpKind::CausalConv1d, &["l0.bp", "l0.conv_b.weight", "l0.conv_b.bias"], &["l0.bc"], 0, heads, &[]),
        op("l0.conv_c", OpKind::CausalConv1d, &["l0.cp", "l0.conv_c.weight", "l0.conv_c.bias"], &["l0.cc"], 0, heads, &[]),
        op(
            "l0.scan",
            OpKind::SsmScan,
            &["l0.xc", "l0.dt", "l0.bc", "l0.cc", "l0.a_log", "l0.d", "l0.dt_bias"],
            &["l0.y"],
            0,
            heads,
            &[("chunk", Attr::Int(chunk))],
        ),
        op("l0.gate", OpKind::SwiGlu, &["l0.z", "l0.y"], &["l0.gated"], 0, heads, &[]),
        op("l0.gnorm", OpKind::RmsNorm, &["l0.gated", "l0.gnorm.weight"], &["l0.yn"], 0, heads, &eps),
        op("l0.out", OpKind::Linear, &["l0.yn", "l0.out.weight"], &["l0.o"], 0, row, &[]),
        op("l0.residual", OpKind::Add, &["h0", "l0.o"], &["h1"], 0, Role::Replicated, &[]),
        op("head", OpKind::Linear, &["h1", "head.weight"], &["logits"], -1, Role::VocabParallel, &[]),
        op("loss", OpKind::CrossEntropy, &["logits", "targets"], &["loss"], -1, Role::VocabParallel, &[]),
    ];
    Graph::new(tensors, ops, "loss").unwrap()
}

