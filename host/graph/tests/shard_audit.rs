//! Mutation-audit pins of the sharder (`runner_graph::shard`) on tiny builder graphs:
//! the collectives tensor parallelism inserts, with and without sequence parallelism,
//! written out by hand (kind, group, size, axis, shape, dtype), and the rules and step
//! collectives the model-sized tests in `shard.rs` did not tell apart.

use runner_graph::shard::{Layout, RankCoord, shard};
use runner_graph::{Attr, DType, Graph, OpKind};
use runner_plugin_sdk::workload::builder::{decoder, moe, transformer_graph};
use runner_plugin_sdk::workload::{GraphRequest, Hyperparameters, Phase};
use runner_plugin_testkit as kit;

fn built(h: &Hyperparameters, seq: u32, mb: u32) -> Graph {
    let req = GraphRequest { variant: "t".into(), seq_len: seq, micro_batch: mb, layers: 0, phase: Phase::Training };
    kit::to_host(&transformer_graph(h, &req).unwrap())
}

/// One inserted collective: (op name, kind, group, group-size, axis, output shape, output dtype).
type Coll = (String, OpKind, String, i64, Option<i64>, Vec<u64>, DType);

fn collectives(g: &Graph) -> Vec<Coll> {
    let text = |o: &runner_graph::Op, k: &str| match o.attrs.get(k) {
        Some(Attr::Text(t)) => t.clone(),
        _ => String::new(),
    };
    g.ops
        .iter()
        .filter(|o| matches!(o.kind, OpKind::AllReduce | OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllToAll))
        .map(|o| {
            let out = g.tensor(o.outputs[0]);
            (o.name.clone(), o.kind, text(o, "group"), o.int("group-size").unwrap_or(0), o.int("axis"), out.shape.clone(), out.dtype)
        })
        .collect()
}

fn c(name: &str, kind: OpKind, size: i64, axis: Option<i64>, shape: &[u64], dtype: DType) -> Coll {
    (name.to_string(), kind, "tp".to_string(), size, axis, shape.to_vec(), dtype)
}

/// One layer (hidden 8, SwiGLU 16, 4 heads, 2 kv heads, vocabulary 10), sequence 8, on
/// tp = 2: Megatron's collectives by hand. Without sequence parallelism: the
/// vocab-parallel embedding and both row-parallel linears all-reduce their (1,8,8)
/// partial sums and the vocab-parallel loss all-reduces three fp32 (1,8) row statistics.
/// With it: the partial sums are reduce-scattered onto (1,4,8) sequence shards along the
/// token axis 1, and each column-parallel block (attention, MLP, head) all-gathers its
/// normed input back to (1,8,8) along axis 1; the norm gains read on sequence shards are
/// summed over tp at the step (3·8 fp32 = 96 bytes). Kills the reduce-scatter's axis
/// taken as 0 (it survived the model-sized tests, which price bytes, not axes).
#[test]
fn tensor_parallel_collectives_by_hand() {
    let g = built(&decoder(1, 8, 16, 4, 2, 10), 8, 1);
    let (ar, ag, rs) = (OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter);
    let stats = |stat: &str| c(&format!("lm_head.{stat}_tp"), ar, 2, None, &[1, 8], DType::F32);
    let bf = DType::BF16;
    for tp_rank in [0, 1] {
        let rank = RankCoord { tp: tp_rank, ..RankCoord::default() };
        let plain = shard(&g, &Layout { tp: 2, ..Layout::single(1, 1) }, rank).unwrap();
        assert_eq!(
            collectives(&plain.graph),
            [
                c("embed.ar_tp", ar, 2, None, &[1, 8, 8], bf),
                c("layers.0.attn.out.ar_tp", ar, 2, None, &[1, 8, 8], bf),
                c("layers.0.mlp.down.ar_tp", ar, 2, None, &[1, 8, 8], bf),
                stats("max"),
                stats("sumexp"),
                stats("target-logit"),
            ]
        );
        assert!(plain.step.is_empty(), "{:?}", plain.step);
        let sp = shard(&g, &Layout { tp: 2, sequence_parallel: true, ..Layout::single(1, 1) }, rank).unwrap();
        assert_eq!(
            collectives(&sp.graph),
            [
                c("embed.rs_tp", rs, 2, Some(1), &[1, 4, 8], bf),
                c("layers.0.attn_norm.ag_tp", ag, 2, Some(1), &[1, 8, 8], bf),
                c("layers.0.attn.out.rs_tp", rs, 2, Some(1), &[1, 4, 8], bf),
                c("layers.0.mlp_norm.ag_tp", ag, 2, Some(1), &[1, 8, 8], bf),
                c("layers.0.mlp.down.rs_tp", rs, 2, Some(1), &[1, 4, 8], bf),
                c("final_norm.ag_tp", ag, 2, Some(1), &[1, 8, 8], bf),
                stats("max"),
                stats("sumexp"),
                stats("target-logit"),
            ]
        );
        let steps: Vec<_> = sp.step.iter().map(|s| (s.kind, s.group.as_str(), s.group_size, s.bytes, s.weights.len())).collect();
        assert_eq!(steps, [(OpKind::AllReduce, "tp", 2, 96.0, 3)]);
    }
}

/// Sequence parallelism splits each cp rank's T/cp tokens over tp: sequence 12 on cp = 2
/// leaves 6 tokens, which tp = 4 does not divide, though it divides the whole 12 (the
/// check on T instead of T/cp admitted the layout, and the pass then failed on a shape).
#[test]
fn sequence_parallelism_needs_tp_to_divide_each_cp_ranks_tokens() {
    let g = built(&decoder(1, 8, 16, 4, 4, 16), 12, 1);
    let cp2 = Layout { tp: 4, cp: 2, sequence_parallel: true, ..Layout::single(1, 1) };
    let e = cp2.validate(&g, 8).unwrap_err();
    assert!(e.contains("sequence parallelism splits the 6 tokens of each cp rank over tp=4"), "{e}");
    let cp1 = Layout { cp: 1, ..cp2 };
    assert_eq!(cp1.validate(&g, 4), Ok(()));
}

/// A tied table lives on the first and last of pp = 4 stages: its gradients are summed
/// by those two ranks (group size 2, not pp), and the middle stages take no part.
#[test]
fn the_tied_embedding_sum_is_between_two_stages_whatever_pp() {
    let g = built(&Hyperparameters { tied_embeddings: true, ..decoder(4, 8, 16, 4, 4, 16) }, 8, 1);
    let l = Layout { pp: 4, ..Layout::single(1, 1) };
    for stage in 0..4 {
        let s = shard(&g, &l, RankCoord { pp: stage, ..RankCoord::default() }).unwrap();
        let e: Vec<_> = s.step.iter().filter(|c| c.group == "pp-embed").map(|c| (c.group_size, c.bytes)).collect();
        let want: &[(u32, f64)] = if stage == 0 || stage == 3 { &[(2, 16.0 * 8.0 * 4.0)] } else { &[] };
        assert_eq!(e, want, "stage {stage}");
    }
}

/// etp splits each expert's width: a width etp does not divide is refused by name
/// (expert width 3 of the gate/up grouped linears on etp = 2), and the same graph on
/// etp = 1 passes.
#[test]
fn expert_widths_etp_does_not_divide_are_refused() {
    let g = built(&Hyperparameters { moe: Some(moe(4, 2, 3)), ..decoder(1, 8, 16, 2, 2, 16) }, 8, 1);
    let l = Layout { tp: 2, etp: 2, ..Layout::single(1, 1) };
    let e = l.validate(&g, 2).unwrap_err();
    assert!(e.contains("etp=2 does not divide the expert width 3"), "{e}");
    assert!(!e.contains("expert width 8"), "the down projection's 8 divides: {e}");
    assert_eq!(Layout { etp: 1, ..l }.validate(&g, 2), Ok(()));
}

/// Without sequence parallelism the tp ranks hold copies of their tokens and each copy
/// is routed to the experts: the expert gradients are divided by tp·cp·dp/etp = 2 (an
/// `edp` group of one rank on ep = tp = 2, dp = 1, moving nothing). With sequence
/// parallelism the tokens are distinct and the mean is over dp·cp = 1: no entry.
#[test]
fn expert_gradients_divide_by_the_token_copies() {
    let g = built(&Hyperparameters { moe: Some(moe(4, 2, 8)), ..decoder(1, 8, 16, 2, 2, 16) }, 8, 1);
    for (sp, want) in [(false, vec![("edp", 1u32, 2u32)]), (true, vec![])] {
        let l = Layout { tp: 2, ep: 2, sequence_parallel: sp, ..Layout::single(1, 1) };
        let s = shard(&g, &l, RankCoord::default()).unwrap();
        let e: Vec<_> = s.step.iter().filter(|c| c.group == "edp").map(|c| (c.group.as_str(), c.group_size, c.mean_over)).collect();
        assert_eq!(e, want, "sp={sp}: {:?}", s.step);
    }
}

/// With sequence parallelism every rank of a stage holds distinct tokens, so the expert
/// gradients summed over the `edp` group count each token once per dp·cp replica of the
/// batch: divided by dp·cp, whatever the group's size. Hand count, ep = etp = 1 (every
/// rank holds every expert): the edp group is the tp·cp·dp ranks of the stage,
/// tp2·dp2 = 4 ranks averaging over dp·cp = 2, and tp2·cp2 = 4 ranks averaging over
/// dp·cp = 2; without SP the tp ranks' tokens are copies, 4 each. Kills the SP mean
/// taken as the group size (they agree only where ep·etp = tp, the case above).
#[test]
fn sequence_parallel_expert_gradients_divide_by_dp_cp_not_the_group() {
    let g = built(&Hyperparameters { moe: Some(moe(4, 2, 8)), ..decoder(1, 8, 16, 2, 2, 16) }, 8, 1);
    for (cp, dp, sp, want) in [(1, 2, true, (4, 2)), (2, 1, true, (4, 2)), (1, 2, false, (4, 4))] {
        let l = Layout { tp: 2, cp, dp, sequence_parallel: sp, ..Layout::single(1, dp) };
        let s = shard(&g, &l, RankCoord::default()).unwrap();
        let e: Vec<_> = s.step.iter().filter(|c| c.group == "edp").map(|c| (c.group_size, c.mean_over)).collect();
        assert_eq!(e, [want], "cp={cp} dp={dp} sp={sp}: {:?}", s.step);
    }
}

/// Each dispatch is told its ep group's size: ep = 2 with etp = 1 (tp = 2, the two
/// experts of each rank's half), not the etp degree (the model-sized test had ep = etp).
#[test]
fn the_dispatch_names_the_ep_group_not_etp() {
    let g = built(&Hyperparameters { moe: Some(moe(4, 2, 8)), ..decoder(1, 8, 16, 2, 2, 16) }, 8, 1);
    let s = shard(&g, &Layout { tp: 2, ep: 2, ..Layout::single(1, 1) }, RankCoord::default()).unwrap();
    let eps: Vec<_> = s.graph.ops.iter().filter(|o| o.kind == OpKind::MoeDispatch).map(|o| o.int("ep")).collect();
    assert_eq!(eps, [Some(2)]);
}

/// Degrees whose product overflows u64 (tp·pp·cp·dp = 2^64, or tp·cp·dp = 2^66 for the
/// expert rule) are an error naming the GPU count, not an arithmetic-overflow panic, and
/// the expert rule names the 2^66 "stage" without listing its divisors.
#[test]
fn degrees_whose_product_overflows_are_refused() {
    let dense = built(&decoder(1, 8, 16, 4, 4, 16), 8, 1);
    let big = 1u32 << 16;
    let l = Layout { tp: big, pp: big, cp: big, dp: big, ..Layout::single(1, big) };
    let e = l.validate(&dense, l.gpus()).unwrap_err();
    assert!(e.contains("tp·pp·cp·dp = 65536·65536·65536·65536 = 18446744073709551616 but the run has"), "{e}");
    let g = built(&Hyperparameters { moe: Some(moe(4, 2, 8)), ..decoder(1, 8, 16, 4, 4, 16) }, 8, 1);
    let huge = 1u32 << 22;
    let l = Layout { tp: huge, cp: huge, dp: huge, ep: 3, ..Layout::single(1, huge) };
    let e = l.validate(&g, l.gpus()).unwrap_err();
    assert!(e.contains("ep·etp = 3 does not divide tp·cp·dp = 73786976294838206464"), "{e}");
    assert!(shard(&g, &l, RankCoord::default()).is_err());
}

/// A tiny hand-made graph: every tensor bf16 unless it is `tok`/`tgt` (i32 inputs) or
/// `loss` (f32 scalar); names starting with `w` are weights, with `f` frozen weights.
/// (name, kind, inputs, outputs, layer, role) of one op of [`hand`].
type HandOp<'a> = (&'a str, OpKind, &'a [&'a str], &'a [&'a str], i32, runner_graph::Role);

fn hand(tensors: &[(&str, &[u64])], ops: &[HandOp]) -> Graph {
    use runner_graph::{NamedOp, Tensor, TensorKind};
    let tensors = tensors
        .iter()
        .map(|&(n, shape)| {
            let (kind, dtype) = match n {
                "tok" | "tgt" => (TensorKind::Input, DType::I32),
                "loss" => (TensorKind::Activation, DType::F32),
                _ if n.starts_with('w') => (TensorKind::Weight, DType::BF16),
                _ if n.starts_with('f') => (TensorKind::Frozen, DType::BF16),
                _ => (TensorKind::Activation, DType::BF16),
            };
            Tensor { name: n.into(), shape: shape.to_vec(), dtype, kind }
        })
        .collect();
    let ops = ops.iter().map(|&(name, kind, i, o, layer, role)| NamedOp::of(name, kind, i, o, &[], layer, role)).collect();
    Graph::new(tensors, ops, "loss").unwrap()
}

/// Two attention ops reading the same K and V (shared KV) and two replicated ops reading
/// the same head-split attention output, on tp = cp = 2: each tensor is gathered once
/// and the gathered copy reused, two cp all-gathers (K, V) and one tp all-gather of `a1`
/// along its head axis 2. Kills dropping either gather cache (4 cp gathers, 2 tp ones).
#[test]
fn a_tensor_read_twice_is_gathered_once() {
    use runner_graph::Role::{ColumnParallel as Col, HeadParallel as Head, Replicated as Rep, RowParallel as Row};
    let g = hand(
        &[
            ("tok", &[1, 4]),
            ("wemb", &[8, 4]),
            ("e", &[1, 4, 4]),
            ("wq", &[4, 4]),
            ("wk", &[4, 4]),
            ("wv", &[4, 4]),
            ("q", &[1, 4, 2, 2]),
            ("k", &[1, 4, 2, 2]),
            ("v", &[1, 4, 2, 2]),
            ("a1", &[1, 4, 2, 2]),
            ("a2", &[1, 4, 2, 2]),
            ("g1", &[1, 4, 2, 2]),
            ("g2", &[1, 4, 2, 2]),
            ("wo", &[4, 4]),
            ("o", &[1, 4, 4]),
            ("s1", &[1, 4, 2, 2]),
            ("s2", &[1, 4, 2, 2]),
            ("wo2", &[4, 4]),
            ("o2", &[1, 4, 4]),
            ("r", &[1, 4, 4]),
            ("wh", &[8, 4]),
            ("logits", &[1, 4, 8]),
            ("tgt", &[1, 4]),
            ("loss", &[]),
        ],
        &[
            ("embed", OpKind::Embedding, &["tok", "wemb"], &["e"], -1, Rep),
            ("q", OpKind::Linear, &["e", "wq"], &["q"], 0, Col),
            ("k", OpKind::Linear, &["e", "wk"], &["k"], 0, Col),
            ("v", OpKind::Linear, &["e", "wv"], &["v"], 0, Col),
            ("a1", OpKind::Attention, &["q", "k", "v"], &["a1"], 0, Head),
            ("a2", OpKind::Attention, &["q", "k", "v"], &["a2"], 0, Head),
            ("g1", OpKind::Gelu, &["a1"], &["g1"], 0, Rep),
            ("g2", OpKind::Gelu, &["a1"], &["g2"], 0, Rep),
            ("s1", OpKind::Add, &["g1", "g2"], &["s1"], 0, Rep),
            ("o", OpKind::Linear, &["a2", "wo"], &["o"], 0, Row),
            ("s2", OpKind::Add, &["s1", "s1"], &["s2"], 0, Rep),
            ("o2", OpKind::Linear, &["s2", "wo2"], &["o2"], 0, Rep),
            ("r", OpKind::Add, &["o", "o2"], &["r"], 0, Rep),
            ("head", OpKind::Linear, &["r", "wh"], &["logits"], -1, Rep),
            ("loss", OpKind::CrossEntropy, &["logits", "tgt"], &["loss"], -1, Rep),
        ],
    );
    let l = Layout { tp: 2, cp: 2, ..Layout::single(1, 1) };
    let s = shard(&g, &l, RankCoord { cp: 1, ..RankCoord::default() }).unwrap().graph;
    let got: Vec<_> = collectives(&s).into_iter().filter(|c| c.1 == OpKind::AllGather).collect();
    let ag = |name: &str, group: &str, axis: i64, shape: &[u64]| {
        (name.to_string(), OpKind::AllGather, group.to_string(), 2, Some(axis), shape.to_vec(), DType::BF16)
    };
    assert_eq!(
        got,
        [ag("k.ag_cp", "cp", 1, &[1, 4, 1, 2]), ag("v.ag_cp", "cp", 1, &[1, 4, 1, 2]), ag("a1.agf_tp", "tp", 2, &[1, 2, 2, 2])]
    );
}

/// A row-parallel linear must read a tp-split input: one reading the whole residual
/// (here the embedding) is refused by name, not sharded to tp copies of the whole sum.
/// A tp-split logit reaching a cross-entropy without the vocab-parallel role is refused
/// too (a column-parallel head: each rank would take the softmax of its own half).
#[test]
fn row_parallel_and_loss_inputs_must_be_split_as_their_roles_need() {
    use runner_graph::Role::{ColumnParallel as Col, Replicated as Rep, RowParallel as Row};
    let tensors: &[(&str, &[u64])] =
        &[("tok", &[1, 4]), ("wemb", &[8, 4]), ("e", &[1, 4, 4]), ("wh", &[8, 4]), ("logits", &[1, 4, 8]), ("tgt", &[1, 4]), ("loss", &[])];
    let l = Layout { tp: 2, ..Layout::single(1, 1) };
    for (role, want) in [
        (Row, "operation 'head': row-parallel input 'e' is not split by tp=2"),
        (Col, "operation 'loss': cross-entropy over tp-split logits needs the vocab-parallel role"),
    ] {
        let g = hand(
            tensors,
            &[
                ("embed", OpKind::Embedding, &["tok", "wemb"], &["e"], -1, Rep),
                ("head", OpKind::Linear, &["e", "wh"], &["logits"], -1, role),
                ("loss", OpKind::CrossEntropy, &["logits", "tgt"], &["loss"], -1, Rep),
            ],
        );
        let e = shard(&g, &l, RankCoord::default()).map(|_| ()).unwrap_err();
        assert_eq!(e, want);
    }
}

/// A pipeline receive of an activation no trained weight before it reaches (a frozen
/// embedding and frozen layer 0 on stage 0) is marked `no-grad`; once layer 0 trains,
/// the same receive carries a gradient back.
#[test]
fn a_receive_before_any_trained_weight_carries_no_gradient() {
    use runner_graph::Role::Replicated as Rep;
    for (w0, no_grad) in [("f0", true), ("w0", false)] {
        let g = hand(
            &[
                ("tok", &[1, 4]),
                ("femb", &[8, 4]),
                ("e", &[1, 4, 4]),
                (w0, &[4, 4]),
                ("h0", &[1, 4, 4]),
                ("w1", &[4, 4]),
                ("h1", &[1, 4, 4]),
                ("wh", &[8, 4]),
                ("logits", &[1, 4, 8]),
                ("tgt", &[1, 4]),
                ("loss", &[]),
            ],
            &[
                ("embed", OpKind::Embedding, &["tok", "femb"], &["e"], -1, Rep),
                ("l0", OpKind::Linear, &["e", w0], &["h0"], 0, Rep),
                ("l1", OpKind::Linear, &["h0", "w1"], &["h1"], 1, Rep),
                ("head", OpKind::Linear, &["h1", "wh"], &["logits"], -1, Rep),
                ("loss", OpKind::CrossEntropy, &["logits", "tgt"], &["loss"], -1, Rep),
            ],
        );
        let l = Layout { pp: 2, ..Layout::single(1, 1) };
        let s = shard(&g, &l, RankCoord { pp: 1, ..RankCoord::default() }).unwrap().graph;
        let recv = s.ops.iter().find(|o| o.kind == OpKind::Recv).unwrap();
        assert_eq!(recv.attrs.get("no-grad") == Some(&Attr::Flag(true)), no_grad, "{w0}: {:?}", recv.attrs);
        assert_eq!(recv.int("peer"), Some(0));
    }
}

/// A hostile head count (2^61 − 1, a prime; the graph's tensors still fit in u64) that
/// tp does not divide is refused with its short "try" list at once: listing every
/// divisor of it walked √n = 1.5·10^9 candidates (seconds), the list stops at 2^20.
#[test]
fn a_hostile_head_count_is_refused_at_once() {
    use runner_graph::Role::HeadParallel as Head;
    let p = (1u64 << 61) - 1;
    let g = hand(
        &[("q", &[1, 2, p, 1]), ("k", &[1, 2, p, 1]), ("v", &[1, 2, p, 1]), ("a", &[1, 2, p, 1]), ("loss", &[])],
        &[("a", OpKind::Attention, &["q", "k", "v"], &["a"], 0, Head)],
    );
    let start = std::time::Instant::now();
    let e = Layout { tp: 2, ..Layout::single(1, 1) }.validate(&g, 2).unwrap_err();
    assert!(e.contains(&format!("tp=2 does not divide {p} heads; try 1")), "{e}");
    assert!(start.elapsed().as_secs() < 2, "{:?}", start.elapsed());
}
