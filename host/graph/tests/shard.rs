//! Sharding and recomputation against real model graphs: Llama 3.1 8B and Mixtral 8x7B
//! from their plugins, plus builder-made GPT-style, MLA/MoE/MTP and learned-position
//! decoders, checked against Megatron's volumes and Korthikanti's activation formulas
//! (Korthikanti et al. 2022, arXiv 2205.05198, §4 and Table 2).

use std::collections::BTreeSet;

use llama3::Llama3;
use mixtral::Mixtral;
use runner_graph::count::{self, AttentionFlops, Convention, Recompute};
use runner_graph::recompute::{self, RecomputePolicy};
use runner_graph::shard::{Layout, RankCoord, Sharded, shard, shard_graph};
use runner_project::comm::comm_volume;
use runner_graph::validate::validate;
use runner_graph::{Graph, OpKind, TensorKind};
use runner_plugin_sdk::workload::builder::{decoder, moe, transformer_graph};
use runner_plugin_sdk::workload::{
    ActivationKind, AttentionKind, GraphRequest, Guest, Hyperparameters, MlaConfig, MoeConfig, NormKind, Phase, PositionScheme,
};
use runner_plugin_testkit as kit;

fn llama(layers: u32, seq: u32, mb: u32) -> Graph {
    kit::host_graph(Llama3::graph, "llama3.1-8b", seq, mb, layers)
}

fn built(h: &Hyperparameters, seq: u32, mb: u32) -> Graph {
    let req = GraphRequest { variant: "t".into(), seq_len: seq, micro_batch: mb, layers: 0, phase: Phase::Training };
    let g = kit::to_host(&transformer_graph(h, &req).unwrap());
    validate(&g).unwrap();
    g
}

/// GPT-style layer (LayerNorm, GeLU 4h MLP, biases, MHA, no positions): Korthikanti's.
fn gpt(h: u32, heads: u32, layers: u32, seq: u32, mb: u32) -> Graph {
    let hy = Hyperparameters {
        norm: NormKind::LayerNorm,
        activation: ActivationKind::Gelu,
        bias: true,
        position: PositionScheme::None,
        ..decoder(layers, h, 4 * h, heads, heads, 1024)
    };
    built(&hy, seq, mb)
}

fn layout(tp: u32, pp: u32, cp: u32, dp: u32, sp: bool, mb: u32) -> Layout {
    Layout {
        tp,
        pp,
        cp,
        dp,
        sequence_parallel: sp,
        micro_batch: mb,
        global_batch: mb * dp * 8,
        ..Layout::single(mb, mb)
    }
}

fn rank(tp: u32, pp: u32) -> RankCoord {
    RankCoord { tp, pp, ..RankCoord::default() }
}

fn sharded(g: &Graph, l: &Layout, r: RankCoord) -> Sharded {
    let s = shard(g, l, r).unwrap_or_else(|e| panic!("{l:?}: {e}"));
    if let Err(e) = validate(&s.graph) {
        panic!("{l:?} rank {r:?}: sharded graph does not validate: {e}");
    }
    // The projection's templates take the graph without the step collectives: the same graph.
    let alone = shard_graph(g, l, r).unwrap();
    assert_eq!(serde_json::to_string(&alone).unwrap(), serde_json::to_string(&s.graph).unwrap(), "{l:?} rank {r:?}");
    // The templates read what is kept and its bytes per policy in one call: the same as
    // the calls one by one, float for float.
    let policies = [RecomputePolicy::None, RecomputePolicy::Selective, RecomputePolicy::Full];
    let (kept, bytes) = recompute::kept_and_layer_bytes(&s.graph);
    assert_eq!(kept, recompute::kept_by(&s.graph), "{l:?} rank {r:?}");
    assert_eq!(bytes.to_vec(), policies.map(|p| recompute::layer_bytes(&s.graph, p)).to_vec(), "{l:?} rank {r:?}");
    s
}

fn matrix_flops(g: &Graph, kind: OpKind) -> f64 {
    g.ops.iter().filter(|o| o.kind == kind).map(|o| count::op_cost(g, o, AttentionFlops::CausalHalved).fwd_flops).sum()
}

fn weights(g: &Graph) -> impl Iterator<Item = &runner_graph::Tensor> {
    g.tensors.iter().filter(|t| t.kind == TensorKind::Weight)
}

#[test]
fn tp_splits_flops_and_parameters_of_llama3_8b() {
    let g = llama(2, 256, 1);
    let total = count::params(&g).total;
    let (lin, attn) = (matrix_flops(&g, OpKind::Linear), matrix_flops(&g, OpKind::Attention));
    let c = 4096u64;
    for tp in [1u32, 2, 4, 8] {
        let l = layout(tp, 1, 1, 1, false, 1);
        let mut split_sum = 0u64;
        for r in 0..tp {
            let s = sharded(&g, &l, rank(r, 0)).graph;
            assert_eq!(matrix_flops(&s, OpKind::Linear) * f64::from(tp), lin, "tp={tp} linear FLOPs");
            assert_eq!(matrix_flops(&s, OpKind::Attention) * f64::from(tp), attn, "tp={tp} attention FLOPs");
            // Replicated weights are those that kept their logical shape: the norms only.
            let (mut split, mut repl) = (0, 0);
            for t in weights(&s) {
                if tp > 1 && g.tensor(g.tensor_id(&t.name).unwrap()).shape == t.shape {
                    repl += t.numel()
                } else {
                    split += t.numel()
                }
            }
            if tp > 1 {
                assert_eq!(repl, (2 * 2 + 1) * c, "tp={tp}: only the 5 norms are replicated");
            }
            split_sum += split;
            if r == tp - 1 {
                assert_eq!(split_sum + if tp > 1 { repl } else { 0 }, total, "tp={tp}: ranks sum to the model");
            }
        }
    }
}

#[test]
fn kv_heads_replicate_when_tp_exceeds_them() {
    // llama3-tiny: 8 heads, 2 kv heads of 32, hidden 256: at tp=8 each rank keeps 1 kv head.
    let g = kit::host_graph(Llama3::graph, "llama3-tiny", 64, 1, 1);
    let s = sharded(&g, &layout(8, 1, 1, 1, true, 1), rank(3, 0)).graph;
    let k = s.tensor(s.tensor_id("layers.0.attn.k.weight").unwrap());
    assert_eq!(k.shape, [32, 256]);
    let q = s.tensor(s.tensor_id("layers.0.attn.q").unwrap());
    assert_eq!(q.shape, [1, 64, 1, 32]);
}

/// Megatron's tensor parallelism (Korthikanti et al. 2022, §4.2.2): 2 all-reduces forward + 2 backward of b·s·h per layer per
/// micro-batch, 8·b·s·h·(t−1)/t elements on the wire; SP's RS+AG move the same.
#[test]
fn tp_communication_matches_megatron() {
    let (b, s, h) = (2u64, 256u64, 4096u64);
    let g = llama(2, s as u32, b as u32);
    for tp in [2u32, 4, 8] {
        let t = f64::from(tp);
        let want = 8.0 * (b * s * h) as f64 * (t - 1.0) / t * 2.0; // bytes, bf16
        for sp in [false, true] {
            let sh = sharded(&g, &layout(tp, 1, 1, 1, sp, b as u32), rank(0, 0)).graph;
            let layer1: Vec<_> = comm_volume(&sh).into_iter().filter(|c| c.layer == 1 && c.group == "tp").collect();
            let kinds: Vec<OpKind> = layer1.iter().map(|c| c.kind).collect();
            if sp {
                assert_eq!(kinds, [OpKind::AllGather, OpKind::ReduceScatter, OpKind::AllGather, OpKind::ReduceScatter]);
            } else {
                assert_eq!(kinds, [OpKind::AllReduce, OpKind::AllReduce]);
                for c in &layer1 {
                    assert_eq!(c.bytes, (b * s * h * 2) as f64);
                    assert_eq!(c.bus_factor, 2.0 * (t - 1.0) / t);
                }
            }
            // Forward in the graph; each has a backward conjugate of the same size.
            assert!(layer1.iter().all(|c| c.backward.is_some()));
            let wire: f64 = layer1.iter().map(|c| 2.0 * c.bus_bytes()).sum();
            assert!((wire - want).abs() < 1e-6 * want, "tp={tp} sp={sp}: {wire} vs {want}");
        }
    }
}

#[test]
fn vocab_parallel_head_and_loss() {
    let g = llama(1, 128, 1);
    let sh = sharded(&g, &layout(4, 1, 1, 1, false, 1), rank(1, 0)).graph;
    assert_eq!(sh.tensor(sh.tensor_id("lm_head.weight").unwrap()).shape, [128_256 / 4, 4096]);
    assert_eq!(sh.tensor(sh.tensor_id("embed.weight").unwrap()).shape, [128_256 / 4, 4096]);
    let stats: Vec<_> = comm_volume(&sh).into_iter().filter(|c| c.layer == -1 && c.backward.is_none()).collect();
    // Megatron's vocab-parallel cross-entropy: row max, row sum of exponentials and the
    // target's logit, one (B,T) all-reduce each.
    assert_eq!(stats.len(), 3, "max, sum-exp and target logit");
    assert!(stats.iter().all(|c| c.bytes == 128.0 * 4.0 && c.kind == OpKind::AllReduce));
}

#[test]
fn pp_stages_partition_layers_and_exchange_activations() {
    let (b, s, h) = (1u64, 128u64, 4096u64);
    let g = llama(8, s as u32, b as u32);
    for (pp, vp, sp) in [(4u32, 1u32, false), (2, 2, false), (4, 2, true), (3, 1, false)] {
        let tp = if sp { 2 } else { 1 };
        let l = Layout { vp, ..layout(tp, pp, 1, 1, sp, 1) };
        let mut all: Vec<i32> = Vec::new();
        for stage in 0..pp {
            let st = sharded(&g, &l, rank(0, stage)).graph;
            let layers: BTreeSet<i32> = st.ops.iter().filter(|o| o.layer >= 0).map(|o| o.layer).collect();
            all.extend(&layers);
            let has = |n: &str| st.ops.iter().any(|o| o.name == n);
            assert_eq!(has("embed"), stage == 0, "pp={pp} vp={vp} stage {stage} embedding");
            assert_eq!(has("lm_head") && has("loss") && has("final_norm"), stage == pp - 1);
            let boundary = if sp { vec![b, s / 2, h] } else { vec![b, s, h] };
            let sends: Vec<_> = st.ops.iter().filter(|o| o.kind == OpKind::Send).collect();
            let recvs: Vec<_> = st.ops.iter().filter(|o| o.kind == OpKind::Recv).collect();
            let chunks_here = vp as usize;
            let first = usize::from(stage == 0);
            let last = usize::from(stage == pp - 1);
            assert_eq!(sends.len(), chunks_here - last, "pp={pp} vp={vp} stage {stage} sends");
            assert_eq!(recvs.len(), chunks_here - first, "stage {stage} recvs");
            for o in sends {
                assert_eq!(st.tensor(o.inputs[0]).shape, boundary);
            }
            for o in recvs {
                assert_eq!(st.tensor(o.outputs[0]).shape, boundary);
            }
        }
        all.sort();
        assert_eq!(all, (0..8).collect::<Vec<_>>(), "pp={pp} vp={vp}: stages partition the layers");
    }
}

/// EP: the all-to-all before and after the experts each move tokens·top-k·C elements.
#[test]
fn ep_all_to_all_volume() {
    let g = kit::host_graph(Mixtral::graph, "mixtral-8x7b", 128, 1, 2);
    for (tp, ep, dp, sp) in [(1u32, 8u32, 8u32, false), (2, 4, 4, true), (2, 2, 2, false)] {
        let l = Layout { ep, ..layout(tp, 1, 1, dp, sp, 1) };
        let sh = sharded(&g, &l, rank(0, 0)).graph;
        let tokens = if sp { 128 / u64::from(tp) } else { 128 };
        let a2a: Vec<_> = comm_volume(&sh).into_iter().filter(|c| c.kind == OpKind::AllToAll && c.layer == 1).collect();
        assert_eq!(a2a.len(), 2, "dispatch and combine");
        for c in &a2a {
            assert_eq!((c.group.as_str(), c.group_size), ("ep", ep));
            assert_eq!(c.bytes, (tokens * 2 * 4096 * 2) as f64, "tp={tp} ep={ep}");
        }
        let w = sh.tensor(sh.tensor_id("layers.0.moe.experts.gate.weight").unwrap());
        assert_eq!(w.shape, [8 / u64::from(ep), 14_336, 4096]);
        // Expert grads reduce over the ranks that hold the same experts.
        let edp = sharded(&g, &l, rank(0, 0)).step.into_iter().find(|c| c.group == "edp").map(|c| c.group_size);
        assert_eq!(edp.unwrap_or(1), tp * dp / ep);
    }
}

/// FSDP over an expert group of one rank (ep = dp) shards nothing, but the expert
/// gradients still need their division by the dp ranks: the step keeps the divide-only
/// all-reduce of plain data parallelism for them; the dense weights reduce-scatter.
#[test]
fn fsdp_expert_group_of_one_still_divides() {
    let g = kit::host_graph(Mixtral::graph, "mixtral-8x7b", 128, 1, 2);
    let l = Layout { ep: 8, fsdp: true, ..layout(1, 1, 1, 8, false, 1) };
    let step = sharded(&g, &l, rank(0, 0)).step;
    let kinds: Vec<_> = step.iter().map(|c| (c.kind, c.group.as_str(), c.group_size, c.mean_over)).collect();
    assert_eq!(
        kinds,
        [
            (OpKind::ReduceScatter, "dp", 8, 8),
            (OpKind::AllGather, "dp", 8, 1),
            (OpKind::AllReduce, "edp", 1, 8),
        ]
    );
}

#[test]
fn cp_splits_tokens_and_gathers_kv() {
    let g = llama(2, 512, 1);
    let attn = matrix_flops(&g, OpKind::Attention);
    let sh = sharded(&g, &layout(2, 1, 2, 1, true, 1), RankCoord { cp: 1, ..RankCoord::default() }).graph;
    let core = sh.ops.iter().find(|o| o.name == "layers.0.attn.core").unwrap();
    assert_eq!(sh.tensor(core.inputs[0]).shape, [1, 256, 16, 128]);
    assert_eq!(sh.tensor(core.inputs[1]).shape, [1, 512, 4, 128]);
    assert_eq!(core.int("cp-rank"), Some(1));
    assert_eq!(matrix_flops(&sh, OpKind::Attention) * 4.0, attn, "tp·cp = 4 ranks share the attention");
    let cp: Vec<_> = comm_volume(&sh).into_iter().filter(|c| c.group == "cp" && c.layer == 0).collect();
    assert_eq!(cp.len(), 2, "K and V");
    assert!(cp.iter().all(|c| c.kind == OpKind::AllGather && c.bytes == (512 * 4 * 128 * 2) as f64));
}

#[test]
fn invalid_layouts_are_named_never_panic() {
    let g = llama(4, 128, 1);
    let l = |f: &dyn Fn(&mut Layout)| {
        let mut l = layout(1, 1, 1, 1, false, 1);
        f(&mut l);
        l
    };
    let cases: Vec<(Layout, u32, &str)> = vec![
        (l(&|l| l.tp = 3), 3, "tp=3 does not divide 32 heads; try 1, 2, 4, 8"),
        (l(&|l| l.tp = 2), 8, "= 2 but the run has 8 GPUs; set dp = 4"),
        (l(&|l| l.pp = 8), 8, "pp·vp = 8 pipeline chunks but the 4 layers fill only 4"),
        (l(&|l| l.vp = 2), 1, "vp=2 needs pp > 1"),
        (l(&|l| l.ep = 2), 1, "no routed experts; set ep = etp = 1"),
        (
            l(&|l| (l.dp, l.global_batch) = (2, 7)),
            2,
            "global batch 7 is not a multiple of micro_batch·dp = 2; try 6 or 8",
        ),
        (l(&|l| l.micro_batch = 2), 1, "rebuild the graph with micro-batch 2"),
        (l(&|l| l.cp = 3), 3, "cp=3: sequence 128 must split into 2·cp = 6"),
        (l(&|l| l.tp = 0), 1, "tp must be at least 1"),
        (l(&|l| (l.pp, l.vp, l.global_batch) = (2, 2, 3)), 2, "multiple of pp=2"),
    ];
    for (lay, gpus, want) in cases {
        let e = lay.validate(&g, gpus).unwrap_err();
        assert!(e.contains(want), "{lay:?}: '{e}' lacks '{want}'");
        // shard() checks the layout against its own GPU count, tp·pp·cp·dp.
        if gpus == lay.gpus() {
            assert!(shard(&g, &lay, RankCoord::default()).is_err(), "{lay:?}");
        }
    }
    // 12 heads, 4 kv heads: tp=6 divides the heads but not the kv heads, nor is a multiple.
    let odd = built(&decoder(2, 192, 512, 12, 4, 1000), 64, 1);
    let e = layout(6, 1, 1, 1, false, 1).validate(&odd, 6).unwrap_err();
    assert!(e.contains("neither divides the 4 kv heads") && e.contains("try 1, 2, 4"), "{e}");
    let e = layout(5, 1, 1, 1, false, 1).validate(&odd, 5).unwrap_err();
    assert!(e.contains("tp=5 does not divide 12 heads"), "{e}");
    // Experts: ep must divide them and ep·etp the tp·cp·dp ranks.
    let m = kit::host_graph(Mixtral::graph, "mixtral-8x7b", 64, 1, 1);
    let e = Layout { ep: 3, ..layout(1, 1, 1, 3, false, 1) }.validate(&m, 3).unwrap_err();
    assert!(e.contains("ep=3 does not divide 8 experts"), "{e}");
    let e = Layout { ep: 8, ..layout(1, 1, 1, 4, false, 1) }.validate(&m, 4).unwrap_err();
    assert!(e.contains("ep·etp = 8 does not divide tp·cp·dp = 4"), "{e}");
    // A sweep: every layout either shards into a valid graph or is refused by name.
    for tp in [1, 2, 3, 4, 8, 16] {
        for pp in [1, 2, 3, 5] {
            for cp in [1, 2, 3] {
                for sp in [false, true] {
                    let lay = layout(tp, pp, cp, 1, sp, 1);
                    if let Ok(s) = shard(&g, &lay, RankCoord { pp: pp - 1, ..RankCoord::default() }) {
                        validate(&s.graph).unwrap_or_else(|e| panic!("{lay:?}: {e}"));
                    }
                }
            }
        }
    }
}

/// Every rank of exotic graphs validates: MLA + MoE with shared experts + dense first
/// layer + MTP + tied embeddings, and learned positions (GPT-3) with SP.
#[test]
fn exotic_graphs_shard_on_every_rank() {
    let ds = Hyperparameters {
        attention: AttentionKind::Mla,
        mla: Some(MlaConfig {
            q_lora_rank: 32,
            kv_lora_rank: 16,
            qk_nope_head_dim: 16,
            qk_rope_head_dim: 8,
            v_head_dim: 16,
        }),
        moe: Some(MoeConfig { shared_experts: 1, dense_layers: 1, ..moe(4, 2, 32) }),
        mtp_depth: 1,
        tied_embeddings: true,
        ..decoder(4, 64, 160, 4, 4, 100)
    };
    let gpt3 = Hyperparameters {
        position: PositionScheme::Learned,
        norm: NormKind::LayerNorm,
        activation: ActivationKind::Gelu,
        bias: true,
        max_position: 64,
        ..decoder(2, 64, 256, 4, 4, 101)
    };
    for (h, name) in [(&ds, "mla-moe-mtp"), (&gpt3, "gpt3-learned")] {
        let g = built(h, 32, 2);
        for (tp, pp, cp, dp, ep, sp) in [
            (2u32, 2u32, 1u32, 2u32, 2u32, true),
            (4, 1, 2, 1, 4, false),
            (2, 1, 1, 1, 1, true),
            (1, 2, 2, 2, 4, false),
        ] {
            let ep = if h.moe.is_some() { ep } else { 1 };
            let l = Layout { ep, ..layout(tp, pp, cp, dp, sp, 2) };
            for r in 0..tp {
                for stage in 0..pp {
                    let s = sharded(&g, &l, RankCoord { tp: r, pp: stage, cp: cp - 1, dp: 0 });
                    assert!(recompute::stored_bytes(&s.graph, RecomputePolicy::Full) > 0.0, "{name}");
                    if h.tied_embeddings && pp > 1 {
                        assert!(s.step.iter().any(|c| c.group == "pp-embed"), "{name}: tied embedding sync");
                    }
                }
            }
        }
    }
}

#[test]
fn data_parallel_gradients_are_step_collectives() {
    let g = llama(2, 128, 1);
    let l = layout(2, 1, 1, 4, false, 1);
    let s = sharded(&g, &l, rank(0, 0));
    let local: f64 = weights(&s.graph).map(|t| t.numel() as f64).sum();
    assert_eq!(s.step.len(), 1);
    let ar = &s.step[0];
    assert_eq!((ar.kind, ar.group.as_str(), ar.group_size, ar.count), (OpKind::AllReduce, "dp", 4, 1));
    assert_eq!(ar.bytes, 4.0 * local, "fp32 gradients");
    let f = sharded(&g, &Layout { fsdp: true, ..l.clone() }, rank(0, 0));
    let kinds: Vec<_> = f.step.iter().map(|c| (c.kind, c.count)).collect();
    // FSDP reduce-scatters each micro-batch (the gradients stay sharded) and gathers
    // the parameters for each forward and backward.
    assert_eq!(kinds, [(OpKind::ReduceScatter, l.micro_batches()), (OpKind::AllGather, 2 * l.micro_batches())]);
}

/// With sequence parallelism the replicated weights (here the norm gains: embedding and
/// head are vocab-parallel) see one sequence shard per tp rank: their gradients are
/// summed over tp once per step, listed as a step collective with its weights.
#[test]
fn sequence_parallel_replicated_gradients_are_a_tp_step_collective() {
    let g = llama(2, 128, 1);
    let s = sharded(&g, &layout(2, 1, 1, 1, true, 1), rank(1, 0));
    let ar: Vec<_> = s.step.iter().filter(|c| c.group == "tp").collect();
    assert_eq!(ar.len(), 1, "{:?}", s.step);
    let ar = ar[0];
    assert_eq!((ar.kind, ar.group_size, ar.count), (OpKind::AllReduce, 2, 1));
    let replicated: Vec<String> = weights(&s.graph)
        .filter(|t| g.tensors[g.tensor_id(&t.name).unwrap()].shape == t.shape)
        .map(|t| t.name.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(ar.weights, replicated);
    assert_eq!(ar.weights.len(), 2 * 2 + 1, "two norms per layer and the final norm: {:?}", ar.weights);
    assert!(ar.weights.iter().all(|w| w.contains("norm")), "{:?}", ar.weights);
    let bytes: f64 = weights(&s.graph).filter(|t| ar.weights.contains(&t.name)).map(|t| 4.0 * t.numel() as f64).sum();
    assert_eq!(ar.bytes, bytes);
    // Without SP every rank computes them on all tokens: nothing to reduce.
    let plain = sharded(&g, &layout(2, 1, 1, 1, false, 1), rank(1, 0));
    assert!(plain.step.iter().all(|c| c.group != "tp"));
    // The dp all-reduce lists every weight of the rank.
    let dp = sharded(&g, &layout(2, 1, 1, 2, true, 1), rank(0, 0));
    let all: BTreeSet<String> = weights(&dp.graph).map(|t| t.name.clone()).collect();
    let d = dp.step.iter().find(|c| c.group == "dp").unwrap();
    assert_eq!(d.weights, all.into_iter().collect::<Vec<_>>());
}

/// Korthikanti et al. 2022 (arXiv 2205.05198) Table 2 less the two 1-byte dropout masks our graphs
/// do not have, flash attention (no 5as/h term), bf16 activations: per layer
/// none 32·sbh, TP 8·sbh + 24·sbh/t, TP+SP 32·sbh/t, full 2·sbh (2·sbh/t with SP).
#[test]
fn activation_memory_matches_korthikanti() {
    let (s, b, h, a) = (128u32, 2u32, 256u32, 8u32);
    let g = gpt(h, a, 3, s, b);
    let sbh = f64::from(s) * f64::from(b) * f64::from(h);
    let per_layer = |l: &Layout, p: RecomputePolicy| {
        let sh = sharded(&g, l, RankCoord::default()).graph;
        recompute::layer_bytes(&sh, p)[&1]
    };
    let none = RecomputePolicy::None;
    assert_eq!(per_layer(&layout(1, 1, 1, 1, false, b), none), 32.0 * sbh);
    for t in [2u32, 4, 8] {
        let tf = f64::from(t);
        assert_eq!(per_layer(&layout(t, 1, 1, 1, false, b), none), 8.0 * sbh + 24.0 * sbh / tf, "TP t={t}");
        assert_eq!(per_layer(&layout(t, 1, 1, 1, true, b), none), 32.0 * sbh / tf, "TP+SP t={t}");
        assert_eq!(
            per_layer(&layout(t, 1, 1, 1, true, b), RecomputePolicy::Selective),
            32.0 * sbh / tf,
            "TP+SP+selective"
        );
        assert_eq!(per_layer(&layout(t, 1, 1, 1, false, b), RecomputePolicy::Full), 2.0 * sbh, "full t={t}");
        assert_eq!(per_layer(&layout(t, 1, 1, 1, true, b), RecomputePolicy::Full), 2.0 * sbh / tf, "full+SP t={t}");
    }
    // Pipeline: the first stage holds pp micro-batches of its layers (m ≥ pp).
    let l = layout(1, 3, 1, 1, false, b);
    let stage0 = recompute::stored_bytes(&sharded(&g, &l, RankCoord::default()).graph, none);
    assert_eq!(recompute::activation_bytes(&g, &l, none).unwrap(), 3.0 * stage0);
    let few = Layout { global_batch: b, ..l.clone() };
    assert_eq!(recompute::activation_bytes(&g, &few, none).unwrap(), stage0, "m=1 < pp: one in flight");
}

#[test]
fn recompute_flops_agree_with_count() {
    let g = llama(2, 256, 1);
    let attn = matrix_flops(&g, OpKind::Attention);
    let none = recompute::saved_for_backward(&g, RecomputePolicy::None);
    assert_eq!(none.extra_forward_flops, 0.0);
    assert!(none.recomputed.is_empty());
    let sel = recompute::saved_for_backward(&g, RecomputePolicy::Selective);
    assert_eq!(sel.extra_forward_flops, attn);
    assert_eq!(sel.stored, none.stored, "flash attention stores no internals to drop");
    let full = recompute::saved_for_backward(&g, RecomputePolicy::Full);
    let conv = Convention { attention: AttentionFlops::CausalHalved, recompute: Recompute::Full };
    assert_eq!(
        full.extra_forward_flops,
        count::hardware_flops_per_step(&g, &conv) - count::model_flops_per_step(&g, &conv)
    );
    assert!(!full.recomputed.is_empty() && full.stored.len() < none.stored.len());
    assert!(recompute::stored_bytes(&g, RecomputePolicy::Full) < recompute::stored_bytes(&g, RecomputePolicy::None));
}

/// The divisor lists behind the search and the "try" lists of layout errors: each
/// divisor once, in order, and a four-billion count answered without counting to it.
#[test]
fn divisors_are_every_divisor_once_in_order() {
    for n in 0..=2000u64 {
        let naive: Vec<u64> = (1..=n).filter(|d| n.is_multiple_of(*d)).collect();
        assert_eq!(runner_graph::shard::divisors(n), naive, "n = {n}");
    }
    let big = u64::from(u32::MAX);
    let d = runner_graph::shard::divisors(big);
    assert_eq!(d.len(), 32, "{d:?}");
    assert!(d.iter().all(|x| big.is_multiple_of(*x)) && d.windows(2).all(|w| w[0] < w[1]), "{d:?}");
    assert_eq!(runner_graph::shard::divisors(1 << 40).len(), 41);
}

/// A plugin numbers its layers as it likes: ops in layers 0, 1, 0 list layer 0 once, in
/// first-met order, and 400,000 ops each in its own layer are partitioned in one pass
/// (the layer list was scanned once per op: 8·10^10 comparisons, 10.6 s here; a million
/// ops, the graph limit, 5·10^11: about a minute per call).
#[test]
fn partition_is_linear_in_the_layers_a_plugin_numbers() {
    use runner_graph::shard::{Place, partition};
    use runner_graph::{DType, NamedOp, Role, Tensor};
    let build = |layers: &[i32]| {
        let t = |i: usize, kind| Tensor { name: format!("x{i}"), shape: vec![1], dtype: DType::BF16, kind };
        let tensors = (0..=layers.len()).map(|i| t(i, if i == 0 { TensorKind::Input } else { TensorKind::Activation })).collect();
        let ops = layers
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                let (a, b) = (format!("x{i}"), format!("x{}", i + 1));
                NamedOp::of(&format!("op{i}"), OpKind::Add, &[&a, &a], &[&b], &[], l, Role::Replicated)
            })
            .collect();
        Graph::new(tensors, ops, &format!("x{}", layers.len())).unwrap()
    };
    let (places, layers) = partition(&build(&[-1, 0, 1, 0, 2, -1, 3]));
    assert_eq!(layers, [0, 1, 2]);
    assert_eq!(places[..5], [Place::Pre, Place::Layer(0), Place::Layer(1), Place::Layer(0), Place::Layer(2)]);
    assert_eq!(places[5..], [Place::Post, Place::Post], "after the head every op is Post, whatever its layer");
    let n = 400_000;
    let g = build(&(0..n).collect::<Vec<i32>>());
    let start = std::time::Instant::now();
    let (places, layers) = partition(&g);
    let took = start.elapsed();
    assert_eq!((places.len(), layers.len(), layers[n as usize - 1]), (n as usize, n as usize, n - 1));
    assert!(took.as_secs_f64() < 2.0, "partition of {n} layers took {took:?}");
}

/// A GPT layer's FLOPs by Narayanan et al. 2021 (arXiv 2104.04473, §5.1, eq. 3): with full
/// recompute a step is 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)): per layer and forward
/// 24·B·s·h² in GEMMs (QKV 6, projection 2, MLP 16) and 4·B·s²·h in attention (QKᵀ and
/// PV over all s keys), backward twice the forward, recompute once more inside the
/// layers; the logit GEMM 2·B·s·h·V forward, three times a step (not recomputed).
/// Causal attention counted over unmasked keys halves the 4·B·s²·h; selective recompute
/// (Korthikanti et al. 2022) re-runs only it.
#[test]
fn gpt_flops_follow_narayanans_formula() {
    let (b, s, l, h, v) = (2.0f64, 32.0f64, 2.0f64, 64.0f64, 1024.0f64);
    let g = gpt(64, 4, 2, 32, 2);
    let gemm = 24.0 * b * s * l * h * h;
    let attn = 4.0 * b * s * s * h * l;
    let logits = 2.0 * b * s * h * v;
    let conv = |attention, recompute| Convention { attention, recompute };
    let full = conv(AttentionFlops::Full, Recompute::None);
    assert_eq!(count::forward_flops(&g, &full), gemm + attn + logits);
    assert_eq!(count::model_flops_per_step(&g, &full), 3.0 * (gemm + attn + logits));
    let narayanan = 96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h));
    assert_eq!(count::hardware_flops_per_step(&g, &conv(AttentionFlops::Full, Recompute::Full)), narayanan);
    assert_eq!(count::hardware_flops_per_step(&g, &conv(AttentionFlops::Full, Recompute::Selective)), 3.0 * (gemm + attn + logits) + attn);
    let causal = conv(AttentionFlops::CausalHalved, Recompute::None);
    assert_eq!(count::model_flops_per_step(&g, &causal), 3.0 * (gemm + attn / 2.0 + logits));
    assert_eq!(count::hardware_flops_per_step(&g, &conv(AttentionFlops::CausalHalved, Recompute::Selective)), 3.0 * (gemm + attn / 2.0 + logits) + attn / 2.0);
}

/// One activation read by 100,000 GEMMs (a plugin's graph may fan a tensor out as it
/// likes): each GEMM keeps it for its weight gradient once, and the list of its keepers
/// is built in one pass (a scan of the list per keeper, 5·10^9 comparisons, took 6 s
/// here; a million readers, 10 minutes).
#[test]
fn an_activation_kept_by_many_ops_is_listed_in_one_pass() {
    use runner_graph::{DType, NamedOp, Role, Tensor};
    let n = 100_000usize;
    let t = |name: String, kind| Tensor { name, shape: vec![1, 1], dtype: DType::BF16, kind };
    let mut tensors = vec![t("in".into(), TensorKind::Input), t("x".into(), TensorKind::Activation), t("s0".into(), TensorKind::Activation)];
    let mut ops = vec![NamedOp::of("x", OpKind::Add, &["in", "in"], &["x"], &[], 0, Role::Replicated)];
    ops.push(NamedOp::of("s0", OpKind::Add, &["x", "x"], &["s0"], &[], 0, Role::Replicated));
    for i in 0..n {
        let (w, y, s0, s1) = (format!("w{i}"), format!("y{i}"), format!("s{i}"), format!("s{}", i + 1));
        tensors.extend([t(w.clone(), TensorKind::Weight), t(y.clone(), TensorKind::Activation), t(s1.clone(), TensorKind::Activation)]);
        ops.push(NamedOp::of(&y, OpKind::Linear, &["x", &w], &[&y], &[], 0, Role::Replicated));
        ops.push(NamedOp::of(&s1, OpKind::Add, &[&s0, &y], &[&s1], &[], 0, Role::Replicated));
    }
    let g = Graph::new(tensors, ops, &format!("s{n}")).unwrap();
    let start = std::time::Instant::now();
    let kept = recompute::kept_by(&g);
    let took = start.elapsed();
    let x = g.tensor_id("x").unwrap();
    let by = &kept.iter().find(|k| k.tensor == x).unwrap().by;
    assert_eq!(by.len(), n, "each GEMM once");
    assert_eq!((by[0], by[n - 1]), ((2, 0), (2 * n, 0)), "(op, input slot) in op order");
    assert!(took.as_secs_f64() < 2.0, "kept_by of {n} readers took {took:?}");
}

/// One layer of 60,000 operations under full recompute (a plugin's graph may put every
/// operation in layer 0): the re-run's free list finds each intermediate's last reader in
/// the segment in one pass over it (a backward scan of the segment per output,
/// quadratic, took 7.4 s here).
#[test]
fn a_rerun_frees_its_intermediates_in_one_pass_over_the_segment() {
    use runner_graph::{DType, NamedOp, Role, Tensor};
    let n = 30_000usize;
    let t = |name: String, kind| Tensor { name, shape: vec![1, 1], dtype: DType::BF16, kind };
    let mut tensors = vec![t("in".into(), TensorKind::Input), t("s0".into(), TensorKind::Activation)];
    let mut ops = vec![NamedOp::of("s0", OpKind::Add, &["in", "in"], &["s0"], &[], 0, Role::Replicated)];
    for i in 0..n {
        let (w, y, s0, s1) = (format!("w{i}"), format!("y{i}"), format!("s{i}"), format!("s{}", i + 1));
        tensors.extend([t(w.clone(), TensorKind::Weight), t(y.clone(), TensorKind::Activation), t(s1.clone(), TensorKind::Activation)]);
        ops.push(NamedOp::of(&y, OpKind::Linear, &[&s0, &w], &[&y], &[], 0, Role::Replicated));
        ops.push(NamedOp::of(&s1, OpKind::Add, &[&s0, &y], &[&s1], &[], 0, Role::Replicated));
    }
    let g = Graph::new(tensors, ops, &format!("s{n}")).unwrap();
    let plan = runner_graph::autodiff::backward_plan(&g).unwrap();
    let start = std::time::Instant::now();
    let sched = recompute::schedule(&g, &plan, RecomputePolicy::Full);
    let took = start.elapsed();
    assert_eq!(sched.segments.len(), 1, "one layer, one segment");
    assert!(took.as_secs_f64() < 2.0, "schedule of a {}-op layer took {took:?}", 2 * n + 1);
}

/// What a Llama-style layer keeps for the backward with no recompute, by the list of
/// recompute.rs (Korthikanti et al. 2022 §4, flash attention, no dropout): the norm its
/// input, each GEMM its input (q, k, v share theirs; the output projection's is the
/// attention output), attention q, k, v and its output, SwiGLU both inputs, the loss its
/// logits; the residual adds and the weights nothing. B 1, T 2, C 4, 2 heads of 2, FFN 8,
/// V 16, bf16: 8 + 8 + 3·8 + 8 + 8 + 16 + 16 + 16 + 8 + 32 = 144 elements, 288 bytes.
#[test]
fn a_swiglu_layer_keeps_korthikantis_tensors() {
    use runner_graph::{Attr, DType, NamedOp, Role, Tensor};
    let t = |name: &str, shape: &[u64], kind| Tensor { name: name.into(), shape: shape.to_vec(), dtype: DType::BF16, kind };
    let (w, a) = (TensorKind::Weight, TensorKind::Activation);
    let tensors = vec![
        Tensor { dtype: DType::I32, ..t("tok", &[1, 2], TensorKind::Input) },
        Tensor { dtype: DType::I32, ..t("tgt", &[1, 2], TensorKind::Input) },
        t("emb.w", &[16, 4], w), t("e", &[1, 2, 4], a), t("nw", &[4], w), t("n", &[1, 2, 4], a),
        t("wq", &[4, 4], w), t("wk", &[4, 4], w), t("wv", &[4, 4], w),
        t("q", &[1, 2, 2, 2], a), t("k", &[1, 2, 2, 2], a), t("v", &[1, 2, 2, 2], a), t("att", &[1, 2, 2, 2], a),
        t("wo", &[4, 4], w), t("y", &[1, 2, 4], a), t("r", &[1, 2, 4], a),
        t("wg", &[8, 4], w), t("wu", &[8, 4], w), t("g", &[1, 2, 8], a), t("u", &[1, 2, 8], a), t("s", &[1, 2, 8], a),
        t("wd", &[4, 8], w), t("d", &[1, 2, 4], a), t("h", &[1, 2, 4], a),
        t("wh", &[16, 4], w), t("logits", &[1, 2, 16], a), Tensor { dtype: DType::F32, ..t("loss", &[], a) },
    ];
    let op = |name: &str, kind, i: &[&str], o: &[&str], attrs: &[(&str, Attr)], layer| NamedOp::of(name, kind, i, o, attrs, layer, Role::Replicated);
    let attn = [("causal", Attr::Flag(true)), ("window", Attr::Int(0)), ("scale", Attr::Float(0.5))];
    let ops = vec![
        op("embed", OpKind::Embedding, &["tok", "emb.w"], &["e"], &[], -1),
        op("norm", OpKind::RmsNorm, &["e", "nw"], &["n"], &[("eps", Attr::Float(1e-5))], 0),
        op("q", OpKind::Linear, &["n", "wq"], &["q"], &[], 0),
        op("k", OpKind::Linear, &["n", "wk"], &["k"], &[], 0),
        op("v", OpKind::Linear, &["n", "wv"], &["v"], &[], 0),
        op("attn", OpKind::Attention, &["q", "k", "v"], &["att"], &attn, 0),
        op("o", OpKind::Linear, &["att", "wo"], &["y"], &[], 0),
        op("res1", OpKind::Add, &["e", "y"], &["r"], &[], 0),
        op("gate", OpKind::Linear, &["r", "wg"], &["g"], &[], 0),
        op("up", OpKind::Linear, &["r", "wu"], &["u"], &[], 0),
        op("act", OpKind::SwiGlu, &["g", "u"], &["s"], &[], 0),
        op("down", OpKind::Linear, &["s", "wd"], &["d"], &[], 0),
        op("res2", OpKind::Add, &["r", "d"], &["h"], &[], 0),
        op("head", OpKind::Linear, &["h", "wh"], &["logits"], &[], -1),
        op("ce", OpKind::CrossEntropy, &["logits", "tgt"], &["loss"], &[], -1),
    ];
    let g = Graph::new(tensors, ops, "loss").unwrap();
    validate(&g).unwrap();
    assert_eq!(recompute::stored_bytes(&g, RecomputePolicy::None), 288.0);
    let kept = recompute::kept_by(&g);
    let names: BTreeSet<&str> = kept.iter().map(|k| g.tensor(k.tensor).name.as_str()).collect();
    assert_eq!(names, ["e", "n", "q", "k", "v", "att", "r", "g", "u", "s", "h", "logits"].into_iter().collect());
    // The attention output is kept by attention itself (an output: slot usize::MAX) and by
    // the output projection (its input 0).
    let att = kept.iter().find(|k| g.tensor(k.tensor).name == "att").unwrap();
    assert_eq!(att.by, [(5, usize::MAX), (6, 0)]);
}

/// Micro-batches the first stage holds under 1F1B (Megatron's theoretical_memory_usage.py):
/// pp of them, times the interleaving penalty 1 + (pp − 1)/(pp·vp), times m/pp when there
/// are fewer micro-batches than stages.
#[test]
fn in_flight_micro_batches_follow_megatrons_memory_model() {
    let l = |pp: u32, vp: u32, m: u32| Layout { pp, vp, global_batch: m, ..Layout::single(1, m) };
    assert_eq!(recompute::in_flight_micro_batches(&l(1, 1, 8)), 1.0);
    assert_eq!(recompute::in_flight_micro_batches(&l(4, 1, 8)), 4.0);
    assert_eq!(recompute::in_flight_micro_batches(&l(4, 2, 8)), 4.0 * (1.0 + 3.0 / 8.0));
    assert_eq!(recompute::in_flight_micro_batches(&l(4, 1, 2)), 2.0);
}

/// The logical op named `name` and its sharded counterpart (the pass keeps op names).
fn op_named<'g>(g: &'g Graph, name: &str) -> &'g runner_graph::Op {
    g.ops.iter().find(|o| o.name == name).unwrap_or_else(|| panic!("no op '{name}'"))
}

/// A vocabulary tp does not divide is padded up: 101 rows over tp = 2 are 51 per rank
/// (rank 1 holds rows 51..102, one past the table), over tp = 4 26 per rank, rank r
/// starting at 26·r; the embedding, the head and its logits agree, and the rank's part
/// of the unsharded table is one block per rank along the rows.
#[test]
fn a_padded_vocabulary_gives_each_rank_the_ceiling_of_its_share() {
    let g = built(&decoder(1, 64, 256, 4, 4, 101), 32, 1);
    for (tp, rows) in [(2u32, 51u64), (4, 26)] {
        for r in 0..tp {
            let s = sharded(&g, &layout(tp, 1, 1, 1, false, 1), rank(r, 0));
            let sg = &s.graph;
            assert_eq!(sg.tensor(sg.tensor_id("embed.weight").unwrap()).shape, [rows, 64], "tp={tp}");
            assert_eq!(sg.tensor(sg.tensor_id("lm_head.weight").unwrap()).shape, [rows, 64], "tp={tp}");
            let start = i64::from(r) * rows as i64;
            assert_eq!(op_named(sg, "embed").int("vocab-start"), Some(start), "tp={tp} rank {r}");
            assert_eq!(op_named(sg, "lm_head").int("vocab-start"), Some(start), "tp={tp} rank {r}");
            assert_eq!(sg.tensor(op_named(sg, "lm_head").outputs[0]).shape, [1, 32, rows]);
            let split = &s.splits["embed.weight"];
            assert_eq!(split.full, [101, 64]);
            assert_eq!(split.axes, [runner_graph::shard::SplitAxis { axis: 0, group: "tp", per_rank: true }]);
        }
    }
}

/// Sequence parallelism over one tp rank splits nothing: the graph is the one without
/// it, with no collective (a group of one is never emitted).
#[test]
fn sequence_parallelism_at_tp_1_is_no_sequence_parallelism() {
    let g = llama(2, 128, 1);
    for (pp, stage) in [(1, 0), (2, 0), (2, 1)] {
        let on = sharded(&g, &layout(1, pp, 1, 1, true, 1), rank(0, stage));
        let off = sharded(&g, &layout(1, pp, 1, 1, false, 1), rank(0, stage));
        assert_eq!(serde_json::to_string(&on.graph).unwrap(), serde_json::to_string(&off.graph).unwrap(), "pp={pp}");
        assert!(comm_volume(&on.graph).iter().all(|c| c.group == "pp"), "pp={pp}");
        assert_eq!(on.step, off.step);
    }
}

/// m = global / (micro·dp): 64 sequences of 2 over 4 data-parallel ranks are 8 each.
#[test]
fn micro_batches_count_every_data_parallel_rank() {
    let l = Layout { dp: 4, ..Layout::single(2, 64) };
    assert_eq!(l.micro_batches(), 8);
}

/// Rules whose wrong variant admits a layout the right one refuses: the load-balanced CP
/// split needs 2·cp chunks (66 tokens split by cp = 2 but not into 4 chunks), ep·etp
/// (not ep alone) must divide tp·cp·dp, and etp needs its ranks to hold the same tokens.
#[test]
fn layouts_that_only_half_a_rule_admits_are_refused() {
    // The MLP width (not the per-head q/k/v widths, which tp divides) is what tp = 4 fails.
    let g = built(&decoder(1, 64, 250, 4, 4, 100), 32, 1);
    let e = layout(4, 1, 1, 1, false, 1).validate(&g, 4).unwrap_err();
    assert!(e.contains("tp=4 does not divide the 250-wide"), "{e}");
    let g = llama(2, 66, 1);
    let e = layout(1, 1, 2, 1, false, 1).validate(&g, 2).unwrap_err();
    assert!(e.contains("sequence 66 must split into 2·cp = 4 equal chunks"), "{e}");
    let m = kit::host_graph(Mixtral::graph, "mixtral-8x7b", 64, 1, 1);
    let e = Layout { ep: 4, etp: 2, ..layout(2, 1, 1, 2, false, 1) }.validate(&m, 4).unwrap_err();
    assert!(e.contains("ep·etp = 8 does not divide tp·cp·dp = 4"), "{e}");
    use runner_graph::shard::expert_tensor_parallel_tokens as etp_ok;
    assert!(etp_ok(2, 2, false).is_ok());
    assert!(etp_ok(4, 1, true).is_ok());
    assert!(etp_ok(4, 2, false).is_ok());
    // With sequence parallelism the rows are gathered over etp, within one tp group.
    assert!(etp_ok(2, 2, true).is_ok());
    assert!(etp_ok(4, 2, true).is_ok());
    assert!(etp_ok(2, 4, true).unwrap_err().contains("use etp = 1 or a divisor of 2 (with sequence parallelism on)"));
    assert!(etp_ok(4, 3, false).unwrap_err().contains("etp=3 does not divide tp=4"));
}

/// Expert tensor parallelism (Mixtral, tp = dp = ep = etp = 2): each expert's width
/// 14336 splits over etp (gate/up along N, down along K), the down projection's partial
/// output is all-reduced over etp once per MoE layer, and the expert gradients reduce
/// over tp·cp·dp/(ep·etp) = 1 rank with the mean over tp·cp·dp/etp = 2 copies of each
/// token: 3 weights × 4 experts × 7168 × 4096 × 2 layers, 4 bytes each.
#[test]
fn expert_tensor_parallelism_splits_widths_and_reduces_over_etp() {
    let g = kit::host_graph(Mixtral::graph, "mixtral-8x7b", 64, 1, 2);
    let l = Layout { ep: 2, etp: 2, ..layout(2, 1, 1, 2, false, 1) };
    let s = sharded(&g, &l, rank(1, 0));
    let sg = &s.graph;
    let shape = |n: &str| sg.tensor(sg.tensor_id(n).unwrap()).shape.clone();
    assert_eq!(shape("layers.0.moe.experts.gate.weight"), [4, 7168, 4096]);
    assert_eq!(shape("layers.0.moe.experts.up.weight"), [4, 7168, 4096]);
    assert_eq!(shape("layers.0.moe.experts.down.weight"), [4, 4096, 7168]);
    let etp: Vec<_> = sg.ops.iter().filter(|o| o.text("group") == Some("etp")).collect();
    assert_eq!(etp.len(), 2, "one per MoE layer");
    assert!(etp.iter().all(|o| o.kind == OpKind::AllReduce && o.int("group-size") == Some(2)));
    assert!(etp.iter().all(|o| sg.tensor(o.outputs[0]).shape == [64 * 2, 4096]), "N·k rows of C");
    let edp = s.step.iter().find(|c| c.group == "edp").unwrap();
    assert_eq!((edp.kind, edp.group_size, edp.mean_over), (OpKind::AllReduce, 1, 2));
    assert_eq!(edp.bytes, 4.0 * (3 * 4 * 7168 * 4096 * 2) as f64);
    use runner_graph::shard::SplitAxis;
    let ax = |axis, group| SplitAxis { axis, group, per_rank: false };
    assert_eq!(s.splits["layers.0.moe.experts.gate.weight"].axes, [ax(0, "ep"), ax(1, "etp")]);
    assert_eq!(s.splits["layers.1.moe.experts.down.weight"].axes, [ax(0, "ep"), ax(2, "etp")]);
    // Each dispatch is told the ep group it feeds.
    assert!(sg.ops.iter().filter(|o| o.kind == OpKind::MoeDispatch).all(|o| o.int("ep") == Some(2)));
}

/// Expert tensor parallelism under sequence parallelism (Mixtral, tp = dp = ep = etp =
/// 2, Megatron's default etp = tp): each rank routes its 32-token sequence shard (64
/// rows of top-2 copies), the rows are gathered over etp to the tp group's 128 before
/// the experts, with the routing indices, and the down projection's partial output is
/// reduce-scattered back to 64; the expert gradients are the same as without etp
/// gathering (each etp rank's half width saw every row of the etp group): mean over
/// dp·cp = 2.
#[test]
fn expert_tensor_parallelism_with_sequence_parallelism_gathers_rows_over_etp() {
    let g = kit::host_graph(Mixtral::graph, "mixtral-8x7b", 64, 1, 2);
    let l = Layout { ep: 2, etp: 2, ..layout(2, 1, 1, 2, true, 1) };
    let s = sharded(&g, &l, rank(1, 0));
    let sg = &s.graph;
    let etp: Vec<_> = sg.ops.iter().filter(|o| o.text("group") == Some("etp")).collect();
    let kinds: Vec<OpKind> = etp.iter().map(|o| o.kind).collect();
    let layer = [OpKind::AllGather, OpKind::AllGather, OpKind::ReduceScatter];
    assert_eq!(kinds, [layer, layer].concat());
    let shape = |id| sg.tensor(id).shape.clone();
    for o in &etp {
        let (i, out) = (shape(o.inputs[0]), shape(o.outputs[0]));
        match (o.kind, i.last()) {
            (OpKind::AllGather, Some(4096)) => assert_eq!((i, out), (vec![64, 4096], vec![128, 4096])),
            (OpKind::AllGather, _) => assert_eq!(i[0] * 2, out[0], "the routing indices, gathered"),
            _ => assert_eq!((i, out), (vec![128, 4096], vec![64, 4096])),
        }
    }
    // The rows' gather sums the etp ranks' partial input gradients in the backward; the
    // indices' gather has none.
    for o in etp.iter().filter(|o| o.kind == OpKind::AllGather) {
        let rows = shape(o.inputs[0]).last() == Some(&4096);
        assert_eq!(runner_graph::shard::all_gather_backward_reduces(sg, o), rows, "{}", o.name);
    }
    // Every grouped linear runs on the gathered rows, its half of each expert's width.
    for o in sg.ops.iter().filter(|o| o.kind == OpKind::GroupedLinear) {
        assert_eq!(shape(o.inputs[0])[0], 128, "{}", o.name);
        let gathered = etp.iter().any(|e| e.kind == OpKind::AllGather && e.outputs[0] == o.inputs[2]);
        assert!(gathered, "{} reads the gathered routing indices", o.name);
    }
    assert_eq!(shape(sg.tensor_id("layers.0.moe.experts.gate.weight").unwrap()), [4, 7168, 4096]);
    let edp = s.step.iter().find(|c| c.group == "edp").unwrap();
    assert_eq!((edp.group_size, edp.mean_over), (1, 2));
}

/// A rank outside the layout is refused, the last valid one sharded.
#[test]
fn ranks_outside_the_layout_are_refused() {
    let g = llama(2, 128, 1);
    let l = layout(2, 2, 1, 1, false, 1);
    assert!(shard(&g, &l, rank(1, 1)).is_ok());
    assert!(shard(&g, &l, rank(2, 0)).unwrap_err().contains("rank tp=2 is outside the layout's tp=2"));
    assert!(shard(&g, &l, rank(0, 2)).unwrap_err().contains("rank pp=2 is outside"));
}

/// Interleaved pipeline (pp = 4, vp = 2): every chunk sends to the next stage and
/// receives from the previous one, around the ring (stage 3's first chunk sends to
/// stage 0's second).
#[test]
fn pipeline_peers_are_the_neighbouring_stages() {
    let g = llama(8, 64, 1);
    let l = Layout { vp: 2, ..layout(1, 4, 1, 1, false, 1) };
    for stage in 0..4u32 {
        let sg = sharded(&g, &l, rank(0, stage)).graph;
        let (next, prev) = (i64::from((stage + 1) % 4), i64::from((stage + 3) % 4));
        for o in sg.ops.iter().filter(|o| o.kind == OpKind::Send) {
            assert_eq!(o.int("peer"), Some(next), "stage {stage} {}", o.name);
        }
        for o in sg.ops.iter().filter(|o| o.kind == OpKind::Recv) {
            assert_eq!(o.int("peer"), Some(prev), "stage {stage} {}", o.name);
        }
    }
}

/// GPT with biases at tp = 2: the column-parallel linears split their biases with their
/// columns, the row-parallel ones keep theirs whole (added once, after the all-reduce);
/// without sequence parallelism every rank sees all tokens, so no replicated weight (the
/// row biases included) needs a tp sum of its gradient. The ranks' weights sum to the
/// model's with the replicated ones once.
#[test]
fn tensor_parallel_biases_split_with_columns_and_stay_whole_after_rows() {
    let (h, layers) = (64u64, 2u64);
    let g = gpt(64, 4, 2, 32, 2);
    let total = count::params(&g).total;
    let mut split = 0;
    for r in 0..2 {
        let s = sharded(&g, &layout(2, 1, 1, 1, false, 2), rank(r, 0));
        let sg = &s.graph;
        for o in sg.ops.iter().filter(|o| o.kind == OpKind::Linear && o.layer >= 0) {
            let bias = sg.tensor(o.inputs[2]).shape.clone();
            let w = sg.tensor(o.inputs[1]).shape.clone();
            match o.role {
                runner_graph::Role::RowParallel => assert_eq!(bias, [h], "{}", o.name),
                _ => assert_eq!(bias, [w[0]], "{}", o.name),
            }
        }
        assert!(s.step.iter().all(|c| c.group != "tp"), "{:?}", s.step);
        let mut repl = 0;
        for t in weights(sg) {
            if g.tensor(g.tensor_id(&t.name).unwrap()).shape == t.shape {
                repl += t.numel();
            } else {
                split += t.numel();
            }
        }
        // Per layer two LayerNorms (gain and bias) and two row biases, plus the final
        // LayerNorm: 6·h·layers + 2·h.
        assert_eq!(repl, 6 * h * layers + 2 * h, "rank {r}");
        if r == 1 {
            assert_eq!(split + repl, total);
        }
    }
}

/// KV heads replicated over tp (llama3-tiny: 2 kv heads of 32, hidden 256): at tp = 8
/// each kv head is on 4 ranks, which sum the k and v projections' gradients, 2 × 32 ×
/// 256 fp32 per layer; at tp = 2 each rank has its own kv head and nothing is summed.
#[test]
fn replicated_kv_heads_sum_their_projection_gradients() {
    let g = kit::host_graph(Llama3::graph, "llama3-tiny", 64, 1, 1);
    let s = sharded(&g, &layout(8, 1, 1, 1, false, 1), rank(5, 0));
    let kv: Vec<_> = s.step.iter().filter(|c| c.group.starts_with("tp-kv")).collect();
    assert_eq!(kv.len(), 1, "{:?}", s.step);
    assert_eq!((kv[0].group.as_str(), kv[0].group_size, kv[0].kind), ("tp-kv", 4, OpKind::AllReduce));
    assert_eq!(kv[0].weights, ["layers.0.attn.k.weight", "layers.0.attn.v.weight"]);
    assert_eq!(kv[0].bytes, 4.0 * (2 * 32 * 256) as f64);
    let s = sharded(&g, &layout(2, 1, 1, 1, false, 1), rank(1, 0));
    assert!(s.step.iter().all(|c| !c.group.starts_with("tp-kv")), "{:?}", s.step);
}

/// An all-gather's backward reduces when every reader leaves a partial gradient:
/// column-parallel linears reading the SP gather, attention reading the CP gathers as
/// keys and values; a gather read by one such reader and a replicated op, or as the
/// queries, keeps its part.
#[test]
fn all_gather_backward_reduces_only_under_partial_readers() {
    use runner_graph::shard::all_gather_backward_reduces as reduces;
    use runner_graph::{DType, NamedOp, Role, Tensor};
    let g = llama(1, 128, 1);
    let sp = sharded(&g, &layout(2, 1, 1, 1, true, 1), rank(0, 0)).graph;
    let cp = sharded(&g, &layout(1, 1, 2, 1, false, 1), rank(0, 0)).graph;
    for (sg, group) in [(&sp, "tp"), (&cp, "cp")] {
        let gathers: Vec<_> = sg.ops.iter().filter(|o| o.kind == OpKind::AllGather && o.text("group") == Some(group)).collect();
        assert!(!gathers.is_empty());
        assert!(gathers.iter().all(|o| reduces(sg, o)), "{group}");
        // Along the tokens of (B,T,..): axis 1.
        assert!(gathers.iter().all(|o| o.int("axis") == Some(1)), "{group}");
    }
    let t = |name: &str, shape: &[u64], kind| Tensor { name: name.into(), shape: shape.to_vec(), dtype: DType::BF16, kind };
    let (a, w) = (TensorKind::Activation, TensorKind::Weight);
    let ag = [("group", runner_graph::Attr::Text("tp".into())), ("group-size", runner_graph::Attr::Int(2))];
    let mixed = Graph::new(
        vec![t("x", &[1, 4, 8], TensorKind::Input), t("y", &[1, 8, 8], a), t("w", &[4, 8], w), t("z", &[1, 8, 4], a), t("s", &[1, 8, 8], a)],
        vec![
            NamedOp::of("ag", OpKind::AllGather, &["x"], &["y"], &ag, 0, Role::Replicated),
            NamedOp::of("lin", OpKind::Linear, &["y", "w"], &["z"], &[], 0, Role::ColumnParallel),
            NamedOp::of("add", OpKind::Add, &["y", "y"], &["s"], &[], 0, Role::Replicated),
        ],
        "s",
    )
    .unwrap();
    assert!(!reduces(&mixed, &mixed.ops[0]), "a replicated reader holds the whole gradient");
    let q = Graph::new(
        vec![
            t("x", &[1, 4, 2, 4], TensorKind::Input),
            t("q", &[1, 8, 2, 4], a),
            t("k", &[1, 8, 2, 4], TensorKind::Input),
            t("o", &[1, 8, 2, 4], a),
        ],
        vec![
            NamedOp::of("ag", OpKind::AllGather, &["x"], &["q"], &ag, 0, Role::Replicated),
            NamedOp::of("attn", OpKind::Attention, &["q", "k", "k"], &["o"], &[], 0, Role::HeadParallel),
        ],
        "o",
    )
    .unwrap();
    assert!(!reduces(&q, &q.ops[0]), "gathered queries");
}

/// Megatron's gradient bucket: 40M elements, or 1M per rank past 40 ranks.
#[test]
fn ddp_buckets_grow_with_the_group_past_40_ranks() {
    use runner_graph::shard::ddp_bucket_elems;
    assert_eq!(ddp_bucket_elems(8), 40_000_000);
    assert_eq!(ddp_bucket_elems(40), 40_000_000);
    assert_eq!(ddp_bucket_elems(64), 64_000_000);
}

/// The tp sum of replicated weights' gradients lists weights that every tp rank holds
/// whole: a Mamba mixer's conv and scan weights, split with their heads, are not in it.
#[test]
fn the_tp_gradient_sum_lists_only_whole_weights() {
    use runner_plugin_testkit::mamba::{SMALL, mamba_graph};
    let m = mamba_graph(SMALL);
    let l = llama(1, 128, 1);
    for (g, sp) in [(&m, false), (&m, true), (&l, true)] {
        let s = sharded(g, &layout(2, 1, 1, 1, sp, g.tensors[g.ops[0].inputs[0]].shape[0] as u32), rank(1, 0));
        for c in s.step.iter().filter(|c| c.group == "tp") {
            for w in &c.weights {
                let local = s.graph.tensor(s.graph.tensor_id(w).unwrap()).shape.clone();
                assert_eq!(local, g.tensor(g.tensor_id(w).unwrap()).shape, "sp={sp}: '{w}' is split");
            }
        }
    }
}

/// The modules of a sharded graph are its logical graph's: every op keeps its module
/// (collectives have none), and every tensor a module drops is dropped under the same
/// module, gathered copies with the shard they came from; the final norm, head and loss
/// are in none.
#[test]
fn sharding_keeps_the_recompute_modules() {
    use runner_graph::modules::modules;
    let ds = Hyperparameters {
        attention: AttentionKind::Mla,
        mla: Some(MlaConfig { q_lora_rank: 32, kv_lora_rank: 16, qk_nope_head_dim: 16, qk_rope_head_dim: 8, v_head_dim: 16 }),
        moe: Some(MoeConfig { shared_experts: 1, dense_layers: 1, ..moe(4, 2, 32) }),
        ..decoder(3, 64, 160, 4, 4, 100)
    };
    let g = built(&ds, 32, 2);
    let want = modules(&g);
    for name in ["final_norm", "lm_head", "loss"] {
        assert_eq!(want.op[g.ops.iter().position(|o| o.name == name).unwrap()], None, "{name}");
    }
    for (tp, cp, ep, sp) in [(2u32, 1u32, 1u32, true), (1, 2, 1, false), (2, 1, 2, false), (2, 2, 4, true)] {
        let l = Layout { ep, ..layout(tp, 1, cp, 4 / (tp * cp).min(4), sp, 2) };
        let sg = sharded(&g, &l, RankCoord { tp: tp - 1, cp: cp - 1, ..RankCoord::default() }).graph;
        let got = modules(&sg);
        for (i, o) in sg.ops.iter().enumerate() {
            let logical = g.ops.iter().position(|x| x.name == o.name).map(|j| want.op[j]);
            match logical {
                Some(m) => assert_eq!(got.op[i], m, "{l:?}: '{}'", o.name),
                None => assert_eq!(got.op[i], None, "{l:?}: collective '{}'", o.name),
            }
        }
        for (&t, &m) in &want.frees {
            let name = &g.tensor(t).name;
            let local = sg.tensor_id(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(got.frees.get(&local), Some(&m), "{l:?}: '{name}'");
        }
    }
}

/// A replicated op reading a head-split (B,T,H,D) tensor (a norm over the head dim)
/// gathers it whole along the head axis, 2: an all-gather over tp, or with sequence
/// parallelism an all-to-all that trades the heads for a sequence shard.
#[test]
fn a_head_split_tensor_gathers_along_its_head_axis() {
    use runner_graph::{DType, NamedOp, Role, Tensor};
    let t = |name: &str, shape: &[u64], kind| Tensor { name: name.into(), shape: shape.to_vec(), dtype: DType::BF16, kind };
    let (a, w) = (TensorKind::Activation, TensorKind::Weight);
    let g = Graph::new(
        vec![
            Tensor { dtype: DType::I32, ..t("tok", &[1, 4], TensorKind::Input) },
            t("emb", &[16, 8], w),
            t("e", &[1, 4, 8], a),
            t("wq", &[8, 8], w),
            t("q", &[1, 4, 2, 4], a),
            t("nw", &[4], w),
            t("qn", &[1, 4, 2, 4], a),
        ],
        vec![
            NamedOp::of("embed", OpKind::Embedding, &["tok", "emb"], &["e"], &[], -1, Role::Replicated),
            NamedOp::of("q", OpKind::Linear, &["e", "wq"], &["q"], &[], 0, Role::ColumnParallel),
            NamedOp::of("norm", OpKind::RmsNorm, &["q", "nw"], &["qn"], &[], 0, Role::Replicated),
        ],
        "qn",
    )
    .unwrap();
    for (sp, kind, shape) in [(false, OpKind::AllGather, [1u64, 4, 2, 4]), (true, OpKind::AllToAll, [1, 2, 2, 4])] {
        let s = shard(&g, &layout(2, 1, 1, 1, sp, 1), rank(1, 0)).unwrap().graph;
        let gathers: Vec<_> = s.ops.iter().filter(|o| o.kind == kind).collect();
        assert_eq!(gathers.len(), 1, "sp={sp}");
        assert_eq!(gathers[0].int("axis"), Some(2), "sp={sp}");
        assert_eq!(s.tensor(gathers[0].outputs[0]).shape, shape, "sp={sp}");
        assert_eq!(s.tensor(gathers[0].inputs[0]).shape, [1, 4, 1, 4], "sp={sp}");
    }
}

/// A tied table (embedding and head read the same weight) on a first and a last stage:
/// its gradients are summed over the two, fp32: 100 × 64 × 4 bytes, or 50 rows per rank
/// at tp = 2. An untied model's embedding and head sync nothing.
#[test]
fn only_a_tied_table_is_summed_between_the_first_and_last_stage() {
    let tied = built(&Hyperparameters { tied_embeddings: true, ..decoder(2, 64, 256, 4, 4, 100) }, 32, 1);
    for (tp, rows) in [(1u32, 100.0), (2, 50.0)] {
        for stage in [0, 1] {
            let s = sharded(&tied, &layout(tp, 2, 1, 1, false, 1), rank(0, stage));
            let e: Vec<_> = s.step.iter().filter(|c| c.group == "pp-embed").collect();
            assert_eq!(e.len(), 1, "tp={tp} stage {stage}: {:?}", s.step);
            assert_eq!((e[0].kind, e[0].group_size, e[0].weights.as_slice()), (OpKind::AllReduce, 2, &["embed.weight".to_string()][..]));
            assert_eq!(e[0].bytes, rows * 64.0 * 4.0, "tp={tp}");
        }
    }
    let untied = built(&decoder(2, 64, 256, 4, 4, 100), 32, 1);
    for stage in [0, 1] {
        let s = sharded(&untied, &layout(1, 2, 1, 1, false, 1), rank(0, stage));
        assert!(s.step.iter().all(|c| c.group != "pp-embed"), "stage {stage}: {:?}", s.step);
    }
}

/// FSDP of a LoRA fine-tune: the trained adapters' gradients are reduce-scattered, and
/// every parameter, the frozen base included, is sharded and gathered.
#[test]
fn fsdp_gathers_frozen_weights_and_reduces_only_trained_ones() {
    use runner_graph::peft::{Lora, lora};
    let g = lora(&llama(1, 128, 1), &Lora::default()).unwrap();
    let s = sharded(&g, &Layout { fsdp: true, ..layout(1, 1, 1, 2, false, 1) }, rank(0, 0));
    let names = |kind: TensorKind| -> Vec<String> {
        s.graph.tensors.iter().filter(|t| t.kind == kind).map(|t| t.name.clone()).collect::<BTreeSet<_>>().into_iter().collect()
    };
    let (trained, frozen) = (names(TensorKind::Weight), names(TensorKind::Frozen));
    assert!(!trained.is_empty() && !frozen.is_empty());
    let rs = s.step.iter().find(|c| c.kind == OpKind::ReduceScatter).unwrap();
    assert_eq!(rs.weights, trained);
    let ag = s.step.iter().find(|c| c.kind == OpKind::AllGather).unwrap();
    let all: BTreeSet<String> = trained.into_iter().chain(frozen).collect();
    assert_eq!(ag.weights, all.into_iter().collect::<Vec<_>>());
}

/// The dense gradients of a cp·dp = 2·2 layout are reduced over the 4 ranks that hold the
/// same weights and averaged over them (each cp rank's loss covers its own tokens).
#[test]
fn context_parallel_ranks_join_the_gradient_reduction() {
    let g = llama(1, 128, 1);
    let s = sharded(&g, &layout(1, 1, 2, 2, false, 1), RankCoord { cp: 1, dp: 1, ..RankCoord::default() });
    let dp = s.step.iter().find(|c| c.group == "dp").unwrap();
    assert_eq!((dp.kind, dp.group_size, dp.mean_over), (OpKind::AllReduce, 4, 4));
}

/// KV heads replicated over tp with biased projections (8 heads, 2 kv heads of 8, tp 4):
/// the k and v biases are summed over the 2 ranks sharing a kv head with their weights,
/// one head each: 4 × (2·8·64 + 2·8) bytes.
#[test]
fn replicated_kv_heads_sum_their_biases_too() {
    let g = built(&Hyperparameters { bias: true, ..decoder(1, 64, 128, 8, 2, 100) }, 32, 1);
    let s = sharded(&g, &layout(4, 1, 1, 1, false, 1), rank(2, 0));
    let kv = s.step.iter().find(|c| c.group == "tp-kv").unwrap();
    assert_eq!(kv.group_size, 2);
    assert_eq!(
        kv.weights,
        ["layers.0.attn.k.bias", "layers.0.attn.k.weight", "layers.0.attn.v.bias", "layers.0.attn.v.weight"]
    );
    assert_eq!(kv.bytes, 4.0 * (2 * 8 * 64 + 2 * 8) as f64);
}

/// The interleaved schedule needs m a multiple of pp, not of vp: pp = 2, vp = 3 and m = 3
/// is refused.
#[test]
fn the_interleaved_schedule_needs_micro_batches_in_multiples_of_pp() {
    let g = llama(6, 64, 1);
    let l = Layout { vp: 3, global_batch: 3, ..layout(1, 2, 1, 1, false, 1) };
    let e = l.validate(&g, 2).unwrap_err();
    assert!(e.contains("multiple of pp=2"), "{e}");
    assert!(Layout { global_batch: 4, ..l }.validate(&g, 2).is_ok());
}

/// A replicated concatenation of a column-parallel output (tokens whole, features split)
/// and the residual stream (a sequence shard under SP): the residual is gathered over tp
/// first, so both inputs hold the rank's 4 tokens.
#[test]
fn inputs_on_different_token_splits_are_gathered_first() {
    use runner_graph::{DType, NamedOp, Role, Tensor};
    let t = |name: &str, shape: &[u64], kind| Tensor { name: name.into(), shape: shape.to_vec(), dtype: DType::BF16, kind };
    let (a, w) = (TensorKind::Activation, TensorKind::Weight);
    let g = Graph::new(
        vec![
            Tensor { dtype: DType::I32, ..t("tok", &[1, 4], TensorKind::Input) },
            t("emb", &[16, 8], w),
            t("e", &[1, 4, 8], a),
            t("wq", &[4, 8], w),
            t("q", &[1, 4, 4], a),
            t("cat", &[1, 4, 12], a),
        ],
        vec![
            NamedOp::of("embed", OpKind::Embedding, &["tok", "emb"], &["e"], &[], -1, Role::Replicated),
            NamedOp::of("q", OpKind::Linear, &["e", "wq"], &["q"], &[], 0, Role::ColumnParallel),
            NamedOp::of("cat", OpKind::Concat, &["q", "e"], &["cat"], &[], 0, Role::Replicated),
        ],
        "cat",
    )
    .unwrap();
    let s = shard(&g, &layout(2, 1, 1, 1, true, 1), rank(0, 0)).unwrap().graph;
    let cat = op_named(&s, "cat");
    let shapes: Vec<_> = cat.inputs.iter().map(|&i| s.tensor(i).shape.clone()).collect();
    assert_eq!(shapes, [vec![1, 4, 2], vec![1, 4, 8]]);
    assert_eq!(s.tensor(cat.outputs[0]).shape, [1, 4, 10]);
}

/// (name, kind, inputs, outputs, layer) of one op of [`small_graph`].
type SmallOp<'a> = (&'a str, OpKind, &'a [&'a str], &'a [&'a str], i32);

/// A tiny graph of named ops for the recompute tests: every tensor [1, 2, 4] bf16 unless
/// listed in `shapes`, `x` and `tgt` inputs, names starting with `w` weights.
fn small_graph(ops: &[SmallOp], shapes: &[(&str, &[u64])]) -> Graph {
    use runner_graph::{DType, NamedOp, Role, Tensor};
    let mut names: Vec<&str> = Vec::new();
    for (_, _, i, o, _) in ops {
        for &n in i.iter().chain(o.iter()) {
            if !names.contains(&n) {
                names.push(n);
            }
        }
    }
    let tensors = names
        .iter()
        .map(|&n| {
            let shape = shapes.iter().find(|(s, _)| *s == n).map_or(vec![1, 2, 4], |(_, s)| s.to_vec());
            let (kind, dtype) = match n {
                "x" => (TensorKind::Input, DType::BF16),
                "tgt" => (TensorKind::Input, DType::I32),
                "loss" => (TensorKind::Activation, DType::F32),
                _ if n.starts_with('w') => (TensorKind::Weight, DType::BF16),
                _ => (TensorKind::Activation, DType::BF16),
            };
            Tensor { name: n.into(), shape, dtype, kind }
        })
        .collect();
    let ops = ops.iter().map(|&(name, kind, i, o, layer)| NamedOp::of(name, kind, i, o, &[], layer, Role::Replicated)).collect();
    Graph::new(tensors, ops, "loss").unwrap()
}

fn names<'g>(g: &'g Graph, ids: &[runner_graph::TensorId]) -> Vec<&'g str> {
    ids.iter().map(|&t| g.tensor(t).name.as_str()).collect()
}

/// Full recompute keeps each layer's inputs from outside it and drops what the layer
/// makes and reads again: in layer 0, `a` (read by the GELU) and `b` (by the second
/// GEMM) are made inside; `a` is also an input of layer 1, so it is stored, not
/// recomputed; `c` is layer 1's input; the loss keeps its logits `e`.
#[test]
fn full_recompute_keeps_layer_inputs_and_recomputes_the_rest() {
    let g = small_graph(
        &[
            ("lin1", OpKind::Linear, &["x", "w1"], &["a"], 0),
            ("gelu", OpKind::Gelu, &["a"], &["b"], 0),
            ("lin2", OpKind::Linear, &["b", "w2"], &["c"], 0),
            ("lin3", OpKind::Linear, &["a", "w3"], &["d"], 1),
            ("add", OpKind::Add, &["c", "d"], &["e"], 1),
            ("ce", OpKind::CrossEntropy, &["e", "tgt"], &["loss"], -1),
        ],
        &[("tgt", &[1, 2]), ("loss", &[])],
    );
    let full = recompute::saved_for_backward(&g, RecomputePolicy::Full);
    assert_eq!(names(&g, &full.stored), ["a", "c", "e"]);
    assert_eq!(names(&g, &full.recomputed), ["b"], "a stored tensor is not also recomputed");
    let none = recompute::saved_for_backward(&g, RecomputePolicy::None);
    assert_eq!(names(&g, &none.stored), ["a", "b", "e"]);
}

/// Per layer (of the first op keeping each tensor), with the embedding, head and loss
/// under -1: full recompute keeps 2·sbh in every layer, layer 0 included, and the head
/// side the same as without recompute (it runs its forward once). On the second of three
/// pipeline stages the layer's input arrives by a receive, which the layer keeps (it is
/// not made inside the layer), and no re-run segment holds a send or a receive.
#[test]
fn full_recompute_by_layer_and_on_a_later_stage() {
    let (s, b, h) = (32.0, 2.0, 64.0);
    let g = gpt(64, 4, 3, 32, 2);
    let none = recompute::layer_bytes(&g, RecomputePolicy::None);
    let full = recompute::layer_bytes(&g, RecomputePolicy::Full);
    assert_eq!(none.keys().copied().collect::<Vec<_>>(), [-1, 0, 1, 2]);
    assert_eq!(full.keys().copied().collect::<Vec<_>>(), [-1, 0, 1, 2]);
    for l in 0..3 {
        assert_eq!(full[&l], 2.0 * s * b * h, "layer {l}");
        assert_eq!(none[&l], 32.0 * s * b * h, "layer {l}");
    }
    assert_eq!(full[&-1], none[&-1]);
    let stage1 = sharded(&g, &layout(1, 3, 1, 1, false, 2), rank(0, 1)).graph;
    assert_eq!(recompute::layer_bytes(&stage1, RecomputePolicy::Full).get(&1), Some(&(2.0 * s * b * h)));
    let plan = runner_graph::autodiff::backward_plan(&stage1).unwrap();
    let sched = recompute::schedule(&stage1, &plan, RecomputePolicy::Full);
    assert_eq!(sched.segments.len(), 1, "the stage's one layer");
    for &oi in &sched.segments[0] {
        assert!(!matches!(stage1.ops[oi].kind, OpKind::Send | OpKind::Recv), "{} in a re-run", stage1.ops[oi].name);
    }
}

/// Who keeps what around an MoE layer with no recompute: the router its logits, the
/// dispatch the indices (not the tokens it permutes), the experts their input rows and
/// the indices, the combine the weights and indices (not the experts' outputs, whose
/// routing weights Megatron applies inside the experts); attention reading one tensor
/// as q, k and v keeps it once, as its first input.
#[test]
fn moe_and_attention_keepers_by_op_and_slot() {
    let g = small_graph(
        &[
            ("lin0", OpKind::Linear, &["x", "w0"], &["q"], 0),
            ("attn", OpKind::Attention, &["q", "q", "q"], &["a"], 0),
            ("rl", OpKind::Linear, &["a", "wr"], &["logits"], 0),
            ("router", OpKind::Router, &["logits"], &["gw", "gi"], 0),
            ("dispatch", OpKind::MoeDispatch, &["a", "gi"], &["xs"], 0),
            ("experts", OpKind::GroupedLinear, &["xs", "we", "gi"], &["ys"], 0),
            ("combine", OpKind::MoeCombine, &["ys", "gw", "gi"], &["y"], 0),
            ("ce", OpKind::CrossEntropy, &["y", "tgt"], &["loss"], -1),
        ],
        &[
            ("q", &[1, 2, 1, 4]),
            ("a", &[1, 2, 1, 4]),
            ("gw", &[2, 2]),
            ("gi", &[2, 2]),
            ("xs", &[4, 4]),
            ("we", &[4, 4, 4]),
            ("ys", &[4, 4]),
            ("tgt", &[1, 2]),
            ("loss", &[]),
        ],
    );
    let kept = recompute::kept_by(&g);
    let got: Vec<(&str, Vec<(usize, usize)>)> = kept.iter().map(|k| (g.tensor(k.tensor).name.as_str(), k.by.clone())).collect();
    let m = usize::MAX;
    assert_eq!(
        got,
        [
            ("q", vec![(1, 0)]),
            ("a", vec![(1, m), (2, 0)]),
            ("logits", vec![(3, 0)]),
            ("gi", vec![(4, 1), (5, 2), (6, 2)]),
            ("xs", vec![(5, 0)]),
            ("gw", vec![(6, 1)]),
            ("y", vec![(7, 0)]),
        ]
    );
}

/// The executor's recompute schedule for two layers under full recompute, worked out by
/// hand. Layer 0 is one add of the inputs (no backward step: its segment is never
/// re-run); layer 1 makes a, b, h0, c; layer 2 d, e, h1, h2. Steps run ops 10..1
/// (step = 10 − op); layer 1 re-runs before step 6 (its last op, lin1), layer 2 before
/// step 2.
/// - a: read again only by layer 1 (gelu0): dropped, freed after its last forward reader.
/// - b: saved by layer 2's lin2 (step 5) and read by layer 1's add: kept, freed after step
///   5, not held until layer 1's re-run (step 6); the re-run's copy is freed after its
///   last reader there.
/// - h0: read back only by layer 1 (lin1, step 6) but read by layer 2's add in the
///   forward, which re-runs first: kept, not dropped; still live when layer 1 re-runs
///   (freed after step 6), so that re-run leaves it alone.
/// - c: read by no backward step, but by layer 2's re-run: kept until step 2.
/// - d dropped; e and h1 read by no step: freed in the forward and in the re-run after
///   their last reader; h2 saved by the head (step 1), freed again right after the
///   re-run remakes it; the loss is never freed.
#[test]
fn full_recompute_schedule_by_hand() {
    let g = small_graph(
        &[
            ("pre", OpKind::Add, &["x", "x"], &["xx"], 0),
            ("lin0", OpKind::Linear, &["xx", "w0"], &["a"], 1),
            ("gelu0", OpKind::Gelu, &["a"], &["b"], 1),
            ("add0", OpKind::Add, &["a", "b"], &["h0"], 1),
            ("lin1", OpKind::Linear, &["h0", "w1"], &["c"], 1),
            ("lin2", OpKind::Linear, &["b", "w2"], &["d"], 2),
            ("gelu1", OpKind::Gelu, &["d"], &["e"], 2),
            ("add1", OpKind::Add, &["e", "h0"], &["h1"], 2),
            ("add2", OpKind::Add, &["h1", "c"], &["h2"], 2),
            ("head", OpKind::Linear, &["h2", "wh"], &["logits"], -1),
            ("ce", OpKind::CrossEntropy, &["logits", "tgt"], &["loss"], -1),
        ],
        &[("wh", &[8, 4]), ("logits", &[1, 2, 8]), ("tgt", &[1, 2]), ("loss", &[])],
    );
    let plan = runner_graph::autodiff::backward_plan(&g).unwrap();
    assert_eq!(plan.steps.iter().map(|s| s.op).collect::<Vec<_>>(), (1..=10).rev().collect::<Vec<_>>());
    let s = recompute::schedule(&g, &plan, RecomputePolicy::Full);
    let each = |lists: &[Vec<runner_graph::TensorId>]| lists.iter().map(|l| names(&g, l)).collect::<Vec<_>>();
    assert_eq!(s.segments, [vec![1, 2, 3, 4], vec![5, 6, 7, 8]]);
    let mut rerun = vec![None; 10];
    (rerun[2], rerun[6]) = (Some(1), Some(0));
    assert_eq!(s.rerun_before_step, rerun);
    assert_eq!(names(&g, &s.dropped), ["a", "d"]);
    let e: Vec<&str> = Vec::new();
    assert_eq!(each(&s.free_after_forward), [e.clone(), e.clone(), e.clone(), vec!["a"], e.clone(), e.clone(), vec!["d"], vec!["e"], vec!["h1"], e.clone(), e.clone()]);
    assert_eq!(
        each(&s.free_saved_after_step),
        [vec!["logits"], vec!["h2"], vec!["c"], e.clone(), vec!["d"], vec!["b"], vec!["h0"], e.clone(), vec!["a"], vec!["xx"]]
    );
    assert_eq!(each(&s.free_after_rerun[0]), [e.clone(), e.clone(), vec!["b"], vec!["c"]]);
    assert_eq!(each(&s.free_after_rerun[1]), [e.clone(), e.clone(), vec!["e"], vec!["h1", "h2"]]);
    let mut keep_aux = vec![false; 11];
    (keep_aux[0], keep_aux[9], keep_aux[10]) = (true, true, true);
    assert_eq!(s.keep_aux, keep_aux);
    let mut rerun_keeps = vec![true; 11];
    rerun_keeps[0] = false;
    assert_eq!(s.rerun_keeps_aux, rerun_keeps, "the first add has no backward step");
    // Without recompute the lists are the plan's own; with selective recompute and no
    // attention core nothing is re-run.
    let none = recompute::schedule(&g, &plan, RecomputePolicy::None);
    assert!(none.segments.is_empty() && none.dropped.is_empty());
    assert_eq!((none.free_after_forward, none.free_saved_after_step), (plan.free_after_forward.clone(), plan.free_saved_after_step.clone()));
    let sel = recompute::schedule(&g, &plan, RecomputePolicy::Selective);
    assert!(sel.segments.is_empty() && sel.dropped.is_empty() && sel.keep_aux.iter().all(|&k| k));
}

/// Qwen3's per-head q/k RMSNorms (the SDK builder's `GraphOptions::qk_norm`) on a
/// Qwen3-shaped graph (GQA, heads wider than hidden / heads, routed experts): q and k
/// leave the column-parallel projections with the cp rank's tokens whole and the heads
/// split, which is what a head-parallel norm reads, so under tp (with sequence
/// parallelism, and at tp 4 over 2 kv heads), cp and ep the norms add no collective to
/// the graph; each rank normalises its (B, T/cp, heads/tp, D) part with the whole (D)
/// gain; the gains join the tp sum of replicated weights' gradients (each rank holds
/// only its heads' part) and the dp·cp reduction, and nothing else in the step
/// changes. Neither norm is a residual norm of Megatron's `layernorm` recompute module.
#[test]
fn qk_norms_stay_head_parallel_and_add_only_their_gradient_sums() {
    use runner_graph::modules::modules;
    use runner_plugin_sdk::workload::builder::{GraphOptions, transformer_graph_with};
    let h = Hyperparameters { head_dim: 32, moe: Some(moe(8, 2, 64)), ..decoder(2, 128, 0, 8, 2, 256) };
    let req = GraphRequest { variant: "t".into(), seq_len: 32, micro_batch: 2, layers: 0, phase: Phase::Training };
    let build = |qk_norm| {
        let g = kit::to_host(&transformer_graph_with(&h, &req, GraphOptions { qk_norm, ..GraphOptions::default() }).unwrap());
        validate(&g).unwrap();
        g
    };
    let (g, plain) = (build(true), build(false));
    let gains: BTreeSet<String> = (0..2).flat_map(|i| ["q", "k"].map(|x| format!("layers.{i}.attn.{x}_norm.weight"))).collect();
    let collectives = |g: &Graph| -> Vec<(OpKind, Option<String>, Option<String>)> {
        g.ops.iter().filter(|o| o.text("group").is_some()).map(|o| (o.kind, o.text("group").map(str::to_string), o.text("tensor").map(str::to_string))).collect()
    };
    let m = modules(&g);
    for (i, o) in g.ops.iter().enumerate().filter(|(_, o)| o.name.ends_with("_norm") && o.name.contains(".attn.")) {
        assert_eq!(m.op[i], None, "{}", o.name);
    }
    for (tp, cp, ep, sp) in [(2u32, 1u32, 1u32, true), (2, 1, 1, false), (4, 1, 1, true), (1, 2, 1, false), (2, 2, 1, true), (2, 1, 2, true)] {
        let l = Layout { ep, ..layout(tp, 1, cp, 1, sp, 2) };
        let r = RankCoord { tp: tp - 1, cp: cp - 1, ..RankCoord::default() };
        let (s, p) = (sharded(&g, &l, r), sharded(&plain, &l, r));
        let what = format!("tp={tp} cp={cp} ep={ep} sp={sp}");
        assert_eq!(collectives(&s.graph), collectives(&p.graph), "{what}");
        for i in 0..2 {
            for (x, heads) in [("q", 8u64), ("k", 2)] {
                let n = op_named(&s.graph, &format!("layers.{i}.attn.{x}_norm"));
                let local = vec![2, 32 / u64::from(cp), (heads / u64::from(tp)).max(1), 32];
                assert_eq!(s.graph.tensor(n.inputs[0]).shape, local, "{what}: {x}");
                assert_eq!(s.graph.tensor(n.inputs[1]).shape, [32], "{what}: {x}");
                assert_eq!(s.graph.tensor(n.outputs[0]).shape, local, "{what}: {x}");
            }
        }
        // Four gains of 32 fp32 gradients each.
        let gain_bytes = 4.0 * 32.0 * 4.0;
        let tp_sum = |s: &Sharded| s.step.iter().find(|c| c.group == "tp").map(|c| (c.weights.iter().cloned().collect::<BTreeSet<_>>(), c.bytes));
        match (tp_sum(&s), tp_sum(&p)) {
            (None, None) => assert_eq!(tp, 1, "{what}"),
            (Some((w, bytes)), plain_sum) => {
                let (pw, pbytes) = plain_sum.unwrap_or_default();
                assert_eq!(w, pw.union(&gains).cloned().collect(), "{what}");
                assert_eq!(bytes - pbytes, gain_bytes, "{what}");
            }
            (None, Some(_)) => panic!("{what}: the plain graph has a tp sum, the qk-norm graph none"),
        }
        let others = |s: &Sharded| s.step.iter().filter(|c| c.group != "tp").cloned().collect::<Vec<_>>();
        let (a, b) = (others(&s), others(&p));
        assert_eq!(a.len(), b.len(), "{what}: {a:?}");
        for (a, b) in a.iter().zip(&b) {
            assert_eq!((a.kind, &a.group, a.group_size, a.mean_over), (b.kind, &b.group, b.group_size, b.mean_over), "{what}");
            let added: BTreeSet<String> = a.weights.iter().filter(|w| !b.weights.contains(w)).cloned().collect();
            let dense = a.group == "dp";
            assert_eq!(added, if dense { gains.clone() } else { BTreeSet::new() }, "{what}: {}", a.group);
            assert_eq!(a.weights.len(), b.weights.len() + added.len(), "{what}: {}", a.group);
            assert_eq!(a.bytes - b.bytes, if dense { gain_bytes } else { 0.0 }, "{what}: {}", a.group);
        }
    }
}
