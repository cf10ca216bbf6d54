//! Mamba-2 mixer ops (`CausalConv1d`, `SsmScan`) in the graph: their shape rules, their
//! counted work against the SSD algorithm's by hand, and tensor parallelism splitting
//! whole heads and groups as Megatron's Mamba mixer does.

use runner_graph::count::{self, AttentionFlops};
use runner_graph::shard::{Layout, RankCoord, shard};
use runner_graph::validate::validate;
use runner_graph::{Attr, Graph, OpKind};
use runner_plugin_testkit::mamba::{SMALL, Sizes, mamba_graph};

fn op_named<'g>(g: &'g Graph, name: &str) -> &'g runner_graph::Op {
    g.ops.iter().find(|o| o.name == name).unwrap_or_else(|| panic!("no op '{name}'"))
}

fn shape<'g>(g: &'g Graph, name: &str) -> &'g [u64] {
    &g.tensors.iter().rev().find(|t| t.name == name).unwrap_or_else(|| panic!("no tensor '{name}'")).shape
}

#[test]
fn mixer_ops_validate_and_bad_shapes_are_named() {
    validate(&mamba_graph(SMALL)).unwrap();
    let bad = |edit: &dyn Fn(&mut Graph), want: &str| {
        let mut g = mamba_graph(SMALL);
        edit(&mut g);
        let e = validate(&g).unwrap_err().to_string();
        assert!(e.contains(want), "'{e}' lacks '{want}'");
    };
    let t = |g: &mut Graph, name: &str, s: Vec<u64>| {
        let i = g.tensors.iter().position(|t| t.name == name).unwrap();
        g.tensors[i].shape = s;
    };
    bad(&|g| t(g, "l0.conv_x.weight", vec![31, 4]), "must be [32, K >= 1]");
    bad(&|g| t(g, "l0.conv_b.bias", vec![7]), "must be [8]");
    bad(&|g| t(g, "l0.d", vec![3]), "d 'l0.d' [3] must be [4], one per head");
    bad(
        &|g| {
            t(g, "l0.dt", vec![2, 16, 3]);
            t(g, "l0.dt.weight", vec![3, 32]);
        },
        "dt 'l0.dt' [2, 16, 3] must be [2, 16, 4]",
    );
    bad(
        &|g| {
            let i = g.ops.iter().position(|o| o.name == "l0.scan").unwrap();
            g.ops[i].attrs.insert("chunk".into(), Attr::Int(0));
        },
        "attribute 'chunk' must be an integer >= 1",
    );
    // 4 heads do not split into 3 groups.
    let e = validate(&mamba_graph(Sizes { groups: 3, ..SMALL })).unwrap_err().to_string();
    assert!(e.contains("4 heads of x 'l0.xc' do not split into the 3 groups"), "{e}");
}

/// The SSD algorithm's forward FLOPs by hand (arXiv 2405.21060 §6) for one sequence
/// batch: per chunk of Q tokens and group the scores C·Bᵀ, per chunk and head the masked
/// scores times x, the chunk state Bᵀ·x and the output from the entering state; the
/// backward counted as twice the forward, as for the other matrix ops.
#[test]
fn scan_work_is_the_chunked_ssd_algorithm() {
    let s = Sizes { b: 3, t: 64, c: 32, heads: 8, p: 16, groups: 2, n: 8, k: 4, chunk: 16 };
    let g = mamba_graph(s);
    let c = count::op_cost(&g, op_named(&g, "l0.scan"), AttentionFlops::CausalHalved);
    let (b, t, h, p, gr, n, q) = (3.0, 64.0, 8.0, 16.0, 2.0, 8.0, 16.0);
    let want = b * (gr * 2.0 * t * q * n + h * (2.0 * t * q * p + 4.0 * t * n * p));
    assert_eq!(c.fwd_flops, want);
    assert_eq!(c.bwd_flops, 2.0 * want);
    assert!(c.matrix);
    // A chunk longer than the sequence counts the sequence: one chunk.
    let mut long = s;
    long.chunk = 1024;
    let g = mamba_graph(long);
    let c = count::op_cost(&g, op_named(&g, "l0.scan"), AttentionFlops::CausalHalved);
    assert_eq!(c.fwd_flops, b * (gr * 2.0 * t * t * n + h * (2.0 * t * t * p + 4.0 * t * n * p)));
    // What the kernels pass each other through HBM (mamba_ssm's ssd_combined.py): per
    // chunk the states (H·P·N), 12 bytes each forward and 34 backward, and the scores
    // (G·Q²), 8 and 24; 4 chunks of 16 here, one of 64 with the long chunk.
    let spill = |chunks: f64, q: f64| {
        let (states, scores) = (b * chunks * h * p * n, b * chunks * gr * q * q);
        [12.0 * states + 8.0 * scores, 34.0 * states + 24.0 * scores]
    };
    assert_eq!(count::ssm_scan_spill(&g, op_named(&g, "l0.scan")), spill(1.0, 64.0));
    let short = mamba_graph(s);
    assert_eq!(count::ssm_scan_spill(&short, op_named(&short, "l0.scan")), spill(4.0, 16.0));
    let ragged = mamba_graph(Sizes { t: 56, ..s });
    assert_eq!(count::ssm_scan_spill(&ragged, op_named(&ragged, "l0.scan")), spill(4.0, 16.0), "a part chunk is a chunk");
    // The convolution: K multiply-adds and the SiLU per element, memory-bound.
    let conv = count::op_cost(&g, op_named(&g, "l0.conv_x"), AttentionFlops::CausalHalved);
    assert!(!conv.matrix);
    assert_eq!(conv.fwd_flops, (2.0 * 4.0 + 5.0) * 3.0 * 64.0 * 8.0 * 16.0);
}

/// Tensor parallelism splits whole heads and groups: each rank's scan holds H/tp heads
/// and G/tp groups, its convolutions H·P/tp and G·N/tp channels, and the per-head and
/// per-channel weights split with them; the output projection reduces over tp. A tp that
/// does not divide the groups, and context parallelism, are refused by name.
#[test]
fn tensor_parallelism_splits_heads_and_groups() {
    let g = mamba_graph(SMALL);
    let l = |tp: u32| Layout { tp, ..Layout::single(2, 2) };
    for r in 0..2 {
        let s = shard(&g, &l(2), RankCoord { tp: r, ..RankCoord::default() }).unwrap();
        validate(&s.graph).unwrap();
        let sg = &s.graph;
        let scan = op_named(sg, "l0.scan");
        let ins: Vec<&[u64]> = scan.inputs.iter().map(|&i| sg.tensors[i].shape.as_slice()).collect();
        assert_eq!(ins, [&[2, 16, 2, 8][..], &[2, 16, 2], &[2, 16, 1, 4], &[2, 16, 1, 4], &[2], &[2], &[2]]);
        assert_eq!(shape(sg, "l0.conv_x.weight"), [16, 4]);
        assert_eq!(shape(sg, "l0.conv_b.bias"), [4]);
        assert!(sg.ops.iter().any(|o| o.kind == OpKind::AllReduce), "the output projection reduces over tp");
        // Half the scan's work on each rank.
        let full = count::op_cost(&g, op_named(&g, "l0.scan"), AttentionFlops::CausalHalved).fwd_flops;
        let part = count::op_cost(sg, scan, AttentionFlops::CausalHalved).fwd_flops;
        assert_eq!(2.0 * part, full);
    }
    let e = l(4).validate(&g, 4).unwrap_err();
    assert!(e.contains("tp=4 does not divide the 2 groups of a Mamba mixer"), "{e}");
    assert!(shard(&g, &l(4), RankCoord::default()).is_err());
    let cp = Layout { cp: 2, ..Layout::single(2, 2) };
    let e = cp.validate(&g, 2).unwrap_err();
    assert!(e.contains("context parallelism over Mamba mixers is not supported"), "{e}");
}

#[test]
fn a_mixer_layer_has_no_recompute_module() {
    // Megatron's MambaLayer takes no part in `recompute_modules`: its norm is not the
    // `layernorm` module and the mixer is not an `mlp`.
    let g = mamba_graph(SMALL);
    let m = runner_graph::modules::modules(&g);
    for (op, module) in g.ops.iter().zip(&m.op) {
        assert_eq!(*module, None, "{}", op.name);
    }
    assert!(m.frees.is_empty());
}

/// The mixer's backward keeps what the SSD kernels keep: the conv its input, weight and
/// bias (the pre-activation is recomputed), the scan its seven inputs and the state
/// entering each chunk, B·⌈T/Q⌉·H·P·N: with T = 20 in chunks of 8 that is 2·3·4·8·4 =
/// 768 elements (the last chunk is partial but has its state).
#[test]
fn the_mixers_backward_keeps_inputs_and_chunk_states() {
    let g = mamba_graph(Sizes { t: 20, ..SMALL });
    validate(&g).unwrap();
    let p = runner_graph::autodiff::backward_plan(&g).unwrap();
    let step = |n: &str| p.steps.iter().find(|s| g.ops[s.op].name == n).unwrap();
    let ids = |ns: &[&str]| ns.iter().map(|n| g.tensor_id(n).unwrap()).collect::<Vec<_>>();
    assert_eq!(step("l0.conv_x").saved, ids(&["l0.xp", "l0.conv_x.weight", "l0.conv_x.bias"]));
    assert!(step("l0.conv_x").aux.is_empty());
    let scan = step("l0.scan");
    assert_eq!(scan.saved, ids(&["l0.xc", "l0.dt", "l0.bc", "l0.cc", "l0.a_log", "l0.d", "l0.dt_bias"]));
    assert_eq!(scan.aux.len(), 1);
    assert_eq!((scan.aux[0].name, scan.aux[0].elems), ("chunk-states", 2 * 3 * 4 * 8 * 4));
}
