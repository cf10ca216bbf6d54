//! Hybrid stacks: Megatron-LM's `hybrid_override_pattern`, one character per layer, each
//! layer one pre-norm residual block (`x + mixer(norm(x))`) of a single kind: `M` a Mamba-2
//! mixer, `*` self-attention, `-` a dense MLP, `E` a mixture of experts. An empty pattern
//! is the classic transformer: every layer attention then MLP or MoE.
//!
//! Names: `layers.{i}.mixer_norm` and `.mixer.*` (Mamba-2), `.attn_norm` and `.attn.*`,
//! `.mlp_norm` and `.mlp.*` or `.moe.*`, then `.residual`. Layer indices are the pattern's
//! positions, so pipeline stages split the stack where Megatron splits it.

use super::{
    Dims, GraphBuilder, Hyperparameters, MambaConfig, MoeConfig, OpKind, ParallelRole, block, float, int, is_moe_layer, mlp,
    moe_mlp, self_attention,
};

/// What one layer of the stack is.
#[derive(Clone, Copy)]
pub(super) enum Block<'a> {
    /// Self-attention followed by an MLP or MoE (an empty pattern).
    Transformer,
    /// `M`: a Mamba-2 mixer.
    Mamba(&'a MambaConfig),
    /// `*`: self-attention alone.
    Attention,
    /// `-`: a dense MLP alone.
    Mlp,
    /// `E`: routed experts (and shared ones) alone.
    Moe(&'a MoeConfig),
}

/// Every layer's block, from the pattern. The contract's `validate_hyperparameters`,
/// which [`super::builder::transformer_graph`] runs first, has checked the pattern (its
/// length, its characters, the sizes each block kind needs): the rules are written once
/// there, and this only reads the pattern.
///
/// # Errors
/// Hyperparameters that did not pass those rules.
pub(super) fn stack(h: &Hyperparameters) -> Result<Vec<Block<'_>>, String> {
    if h.layer_pattern.is_empty() {
        return Ok(vec![Block::Transformer; h.layers as usize]);
    }
    h.layer_pattern
        .chars()
        .map(|ch| match (ch, &h.mamba, &h.moe) {
            ('M', Some(m), _) => Ok(Block::Mamba(m)),
            ('*', ..) => Ok(Block::Attention),
            ('-', ..) => Ok(Block::Mlp),
            ('E', _, Some(m)) => Ok(Block::Moe(m)),
            _ => Err("layer-pattern: run validate_hyperparameters before building the stack".to_string()),
        })
        .collect()
}

/// Layer `i` named `p`: a classic transformer block, or a single-mixer block (norm, the
/// block's mixer, residual); returns its output.
#[allow(clippy::too_many_arguments, reason = "the block's place in the graph and its kind")]
pub(super) fn layer(
    g: &mut GraphBuilder,
    h: &Hyperparameters,
    d: &Dims,
    p: &str,
    i: u32,
    x: &str,
    kind: Block<'_>,
) -> String {
    let layer = i as i32;
    let norm = |g: &mut GraphBuilder, name: &str| g.norm(&format!("{p}.{name}"), x, h.norm, h.norm_eps, layer);
    let out = match kind {
        Block::Transformer => return block(g, h, d, p, i, x, h.moe.as_ref().filter(|_| is_moe_layer(h, i))),
        Block::Mamba(m) => {
            let n = norm(g, "mixer_norm");
            mamba_mixer(g, h, m, d, p, layer, &n)
        }
        Block::Attention => {
            let n = norm(g, "attn_norm");
            self_attention(g, h, d, p, i, &n)
        }
        Block::Mlp => {
            let n = norm(g, "mlp_norm");
            mlp(g, h, d, &format!("{p}.mlp"), u64::from(h.ffn), layer, &n)
        }
        Block::Moe(m) => {
            let n = norm(g, "mlp_norm");
            moe_mlp(g, h, m, d, p, layer, &n)
        }
    };
    g.add(&format!("{p}.residual"), x, &out, layer, ParallelRole::Sequence)
}

/// The Mamba-2 mixer of layer `p` over the normalised `x` (B,T,C); returns (B,T,C).
///
/// Megatron-LM's `MambaMixer` (megatron/core/ssm/mamba_mixer.py@2255f6b): one in_proj
/// C -> [z (di) | x (di) | B (G*N) | C (G*N) | dt (H)], di = H*P; a depthwise causal conv
/// of width K with bias and a SiLU over x, B and C; the SSD scan with per-head A_log, D and
/// dt_bias; `RMSNormGated(di, group_size = di/G, norm_before_gate=False)`, i.e.
/// norm(y * silu(z)) over each of the G groups; out_proj di -> C. Tensor parallelism
/// splits in_proj by columns (whole heads and groups per rank, which is why tp must divide
/// both), the conv, scan and norm by heads, and out_proj by rows.
///
/// The fused in_proj and conv are split by output here (five projections, three convs)
/// so no slicing op is needed; parameters and FLOPs are identical. One departure: the
/// host's norm op takes a weight as wide as its last axis, so the grouped norm's weight is
/// di/G wide (shared by the groups) where Megatron's is di wide: (G-1)*di/G parameters
/// fewer per mixer, under 1e-5 of any Nemotron-H model.
#[allow(clippy::too_many_arguments, reason = "the mixer's place in the graph and its sizes")]
fn mamba_mixer(
    g: &mut GraphBuilder,
    h: &Hyperparameters,
    m: &MambaConfig,
    d: &Dims,
    p: &str,
    layer: i32,
    x: &str,
) -> String {
    let (b, t) = (d.b, d.t);
    let (heads, hd, groups, n) = (u64::from(m.heads), u64::from(m.head_dim), u64::from(m.groups), u64::from(m.state));
    let di = heads * hd;
    let q = format!("{p}.mixer");
    let (col, per_head) = (ParallelRole::ColumnParallel, ParallelRole::HeadParallel);
    let z = g.linear(&format!("{q}.z"), x, di, &[b, t, heads, hd], false, layer, col);
    let xs = g.linear(&format!("{q}.x"), x, di, &[b, t, heads, hd], false, layer, col);
    let bs = g.linear(&format!("{q}.b"), x, groups * n, &[b, t, groups, n], false, layer, col);
    let cs = g.linear(&format!("{q}.c"), x, groups * n, &[b, t, groups, n], false, layer, col);
    let dt = g.linear(&format!("{q}.dt"), x, heads, &[b, t, heads], false, layer, col);
    let conv = |g: &mut GraphBuilder, name: &str, input: &str, channels: u64| -> String {
        let w = g.weight(&format!("{q}.{name}.weight"), &[channels, u64::from(m.conv_kernel)]);
        let bias = g.weight(&format!("{q}.{name}.bias"), &[channels]);
        let shape = g.shape(input).unwrap_or(&[]).to_vec();
        g.unary(&format!("{q}.{name}"), OpKind::CausalConv1d, &[input, &w, &bias], &shape, vec![], layer, per_head)
    };
    let xc = conv(g, "conv_x", &xs, di);
    let bc = conv(g, "conv_b", &bs, groups * n);
    let cc = conv(g, "conv_c", &cs, groups * n);
    let a_log = g.weight(&format!("{q}.scan.a_log"), &[heads]);
    let skip = g.weight(&format!("{q}.scan.d"), &[heads]);
    let dt_bias = g.weight(&format!("{q}.scan.dt_bias"), &[heads]);
    let y = g.unary(
        &format!("{q}.scan"),
        OpKind::SsmScan,
        &[&xc, &dt, &bc, &cc, &a_log, &skip, &dt_bias],
        &[b, t, heads, hd],
        vec![int("chunk", i64::from(m.chunk))],
        layer,
        per_head,
    );
    let grouped = [b, t, groups, di / groups];
    let gated = g.unary(&format!("{q}.gate"), OpKind::Swiglu, &[&z, &y], &grouped, vec![], layer, per_head);
    let w = g.weight(&format!("{q}.norm.weight"), &[di / groups]);
    let normed = g.unary(
        &format!("{q}.norm"),
        OpKind::RmsNorm,
        &[&gated, &w],
        &grouped,
        vec![float("eps", h.norm_eps)],
        layer,
        per_head,
    );
    g.linear_kn(&format!("{q}.out"), &normed, di, d.c, &[b, t, d.c], false, layer, ParallelRole::RowParallel)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::{
        ActivationKind, AttrValue, Graph, GraphOptions, GraphRequest, MoeConfig, MtpWeights, OpKind, Phase, TensorKind, decoder,
        is_moe_layer, moe, transformer_graph, transformer_graph_with,
    };
    use super::*;

    fn req(layers: u32) -> GraphRequest {
        GraphRequest { variant: "t".into(), seq_len: 16, micro_batch: 2, layers, phase: Phase::Training }
    }

    const MAMBA: MambaConfig = MambaConfig { heads: 4, head_dim: 8, state: 4, groups: 2, conv_kernel: 4, chunk: 8 };

    /// Hidden 64, 4 query heads of 16 over 2 KV heads, SwiGLU MLP of 96, 4 experts of 32
    /// (top-2) where the pattern has E, a 4-head Mamba-2 mixer (heads of 8, state 4, 2
    /// groups) where it has M, vocab 100.
    fn small(pattern: &str) -> Hyperparameters {
        Hyperparameters {
            layers: pattern.chars().count() as u32,
            layer_pattern: pattern.into(),
            mamba: pattern.contains('M').then_some(MAMBA),
            moe: pattern.contains('E').then(|| moe(4, 2, 32)),
            ..decoder(1, 64, 96, 4, 2, 100)
        }
    }

    fn weights(g: &Graph) -> u64 {
        g.tensors.iter().filter(|t| t.kind == TensorKind::Weight).map(|t| t.shape.iter().product::<u64>()).sum()
    }

    fn kinds(g: &Graph, layer: i32) -> BTreeSet<String> {
        g.operations.iter().filter(|o| o.layer == layer).map(|o| format!("{:?}", o.kind)).collect()
    }

    fn shape<'g>(g: &'g Graph, name: &str) -> &'g [u64] {
        &g.tensors.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no tensor {name}")).shape
    }

    #[test]
    fn pattern_builds_one_block_kind_per_layer() {
        let g = transformer_graph(&small("M*M-ME"), &req(0)).unwrap();
        let has = |layer: i32, k: OpKind| kinds(&g, layer).contains(&format!("{k:?}"));
        for (layer, ch) in "M*M-ME".chars().enumerate() {
            let l = layer as i32;
            assert_eq!(has(l, OpKind::SsmScan), ch == 'M', "layer {l} ({ch}): scan");
            assert_eq!(has(l, OpKind::CausalConv1d), ch == 'M', "layer {l} ({ch}): conv");
            assert_eq!(has(l, OpKind::Attention), ch == '*', "layer {l} ({ch}): attention");
            assert_eq!(has(l, OpKind::Router), ch == 'E', "layer {l} ({ch}): router");
            assert_eq!(has(l, OpKind::Swiglu), ch != '*', "layer {l} ({ch}): gate or MLP activation");
            // One pre-norm and one residual add per layer, whatever its kind.
            let per_layer = |suffix: &str| g.operations.iter().filter(|o| o.layer == l && o.name.ends_with(suffix)).count();
            assert_eq!((per_layer("_norm"), per_layer(".residual")), (1, 1), "layer {l} ({ch})");
        }
        let conv: Vec<_> = g.operations.iter().filter(|o| o.layer == 0 && o.kind == OpKind::CausalConv1d).collect();
        assert_eq!(conv.len(), 3, "x, B and C are convolved");
        // di = 4 x 8 = 32; B and C: 2 groups x state 4; the grouped norm over (B,T,2,16).
        assert_eq!(shape(&g, "layers.0.mixer.conv_x.weight"), [32, 4]);
        assert_eq!(shape(&g, "layers.0.mixer.conv_b.weight"), [8, 4]);
        assert_eq!(shape(&g, "layers.0.mixer.dt"), [2, 16, 4]);
        assert_eq!(shape(&g, "layers.0.mixer.norm"), [2, 16, 2, 16]);
        assert_eq!(shape(&g, "layers.0.mixer.out.weight"), [64, 32]);
        let scan = g.operations.iter().find(|o| o.name == "layers.2.mixer.scan").unwrap();
        assert_eq!(scan.inputs.len(), 7);
        assert!(matches!(scan.attrs[..], [ref a] if a.key == "chunk" && matches!(a.value, AttrValue::Int(8))));
        assert_eq!(g.operations.iter().filter(|o| o.kind == OpKind::Attention).count(), 1);
    }

    /// embed and head 2 x 100 x 64, final norm 64, and per layer (three M, one each of *, -, E):
    /// M: norm 64, z and x 2 x 32x64, B and C 2 x 8x64, dt 4x64, convs (32+8+8) x (4+1),
    ///    A_log/D/dt_bias 3 x 4, grouped norm 16, out 64x32 = 7,756;
    /// *: norm 64, q 64x64, k and v 2 x 32x64, out 64x64 = 12,352;
    /// -: norm 64, gate/up/down 3 x 64x96 = 18,496;
    /// E: norm 64, router 4x64, experts 4 x 3 x 32x64 = 24,896.
    #[test]
    fn weights_are_the_hand_count() {
        let g = transformer_graph(&small("M*M-ME"), &req(0)).unwrap();
        let mamba = 64 + 2 * 32 * 64 + 2 * 8 * 64 + 4 * 64 + (32 + 8 + 8) * 5 + 3 * 4 + 16 + 64 * 32;
        assert_eq!(mamba, 7756);
        assert_eq!(weights(&g), 2 * 6400 + 64 + 3 * mamba + 12_352 + 18_496 + 24_896);
        // A partial request builds the pattern's first layers.
        let two = transformer_graph(&small("M*M-ME"), &req(2)).unwrap();
        assert_eq!(weights(&two), 2 * 6400 + 64 + mamba + 12_352);
        assert!(!two.operations.iter().any(|o| o.layer >= 2));
    }

    /// LatentMoE: the router and the shared expert read the hidden state (64); the routed
    /// experts, dispatch and combine run at the latent width (16), between a C -> L and an
    /// L -> C replicated projection.
    #[test]
    fn latent_moe_runs_routed_experts_at_the_latent_width() {
        let mut h = small("ME");
        h.activation = ActivationKind::SquaredRelu;
        h.moe = Some(MoeConfig { latent: 16, shared_experts: 1, shared_ffn: 48, ..moe(4, 2, 32) });
        let g = transformer_graph(&h, &req(0)).unwrap();
        let p = "layers.1.moe";
        assert_eq!(shape(&g, &format!("{p}.router_logits.weight")), [4, 64]);
        assert_eq!(shape(&g, &format!("{p}.fc1_latent_proj.weight")), [16, 64]);
        assert_eq!(shape(&g, &format!("{p}.dispatch")), [2 * 16 * 2, 16]);
        assert_eq!(shape(&g, &format!("{p}.experts.up.weight")), [4, 32, 16]);
        assert_eq!(shape(&g, &format!("{p}.experts.down.weight")), [4, 16, 32]);
        assert_eq!(shape(&g, &format!("{p}.combine")), [2, 16, 16]);
        assert_eq!(shape(&g, &format!("{p}.fc2_latent_proj.weight")), [64, 16]);
        assert_eq!(shape(&g, &format!("{p}.shared.up.weight")), [48, 64]);
        let op = |n: &str| g.operations.iter().find(|o| o.name == n).unwrap();
        for proj in ["fc1_latent_proj", "fc2_latent_proj"] {
            assert_eq!(op(&format!("{p}.{proj}")).role, ParallelRole::Replicated, "{proj}");
        }
        assert_eq!(op(&format!("{p}.dispatch")).inputs[0], format!("{p}.fc1_latent_proj"));
        assert_eq!(op(&format!("{p}.router_logits")).inputs[0], "layers.1.mlp_norm");
        assert_eq!(op(&format!("{p}.out")).inputs, [format!("{p}.fc2_latent_proj"), format!("{p}.shared.down")]);
        // Without a latent width nothing changes shape or appears.
        h.moe = Some(MoeConfig { shared_experts: 1, shared_ffn: 48, ..moe(4, 2, 32) });
        let plain = transformer_graph(&h, &req(0)).unwrap();
        assert!(!plain.tensors.iter().any(|t| t.name.contains("latent")));
        assert_eq!(shape(&plain, &format!("{p}.experts.up.weight")), [4, 32, 64]);
        assert_eq!(weights(&g) + 4 * 32 * (64 - 16) * 2, weights(&plain) + 2 * 16 * 64);
    }

    #[test]
    fn moe_layers_and_mtp_follow_the_pattern() {
        let mut h = small("MEM*E");
        let moe_layers: Vec<u32> = (0..5).filter(|&i| is_moe_layer(&h, i)).collect();
        assert_eq!(moe_layers, [1, 4]);
        h.mtp_depth = 1;
        let g = transformer_graph(&h, &req(0)).unwrap();
        // The MTP module is one attention and one MoE layer (Nemotron 3 Super's "*E").
        let mtp: BTreeSet<_> = g.operations.iter().filter(|o| o.name.starts_with("mtp.0.")).map(|o| o.kind).map(|k| format!("{k:?}")).collect();
        for k in [OpKind::Attention, OpKind::Router, OpKind::GroupedLinear, OpKind::Concat] {
            assert!(mtp.contains(&format!("{k:?}")), "{k:?} missing from the MTP module");
        }
        assert!(g.operations.iter().filter(|o| o.name.starts_with("mtp.0.")).all(|o| o.layer == 5));
    }

    /// Each error names the pattern's fault: the contract's `validate_hyperparameters`,
    /// which the builder runs first, reaches a plugin's author through the builder.
    #[test]
    fn bad_patterns_are_named() {
        let err = |h: Hyperparameters| transformer_graph(&h, &req(0)).unwrap_err();
        let has = |e: &str, parts: &[&str]| assert!(parts.iter().all(|p| e.contains(p)), "{e:?} should name {parts:?}");
        has(&err(Hyperparameters { layers: 5, ..small("M*M-ME") }), &["layer-pattern has 6 characters but layers is 5"]);
        has(&err(small("M*X")), &["layer-pattern", "X", "M (Mamba-2"]);
        let e = err(small("*\u{1b}"));
        assert!(e.contains("layer-pattern") && !e.contains('\u{1b}'), "a control character reaches the message raw: {e:?}");
        has(&err(Hyperparameters { mamba: None, ..small("*M") }), &["(M)", "no mamba sizes are given"]);
        has(&err(Hyperparameters { moe: None, ..small("ME") }), &["(E)", "no moe config is given"]);
        has(&err(Hyperparameters { ffn: 0, ..small("E-") }), &["ffn", "0", "-"]);
        let odd = MambaConfig { groups: 3, ..MAMBA };
        has(&err(Hyperparameters { mamba: Some(odd), ..small("M") }), &["mamba.groups (3) must divide mamba.heads (4)"]);
        let none = MambaConfig { groups: 0, ..MAMBA };
        has(&err(Hyperparameters { mamba: Some(none), ..small("M") }), &["mamba.groups", "0"]);
    }

    /// Nemotron 3 Super's MTP: one `*E` module applied at depth 1 and 2. Repeated, the
    /// second depth computes everything the first does but declares no weight of its own.
    #[test]
    fn repeated_mtp_shares_one_module() {
        let h = Hyperparameters { mtp_depth: 2, ..small("MEM*E") };
        let own = transformer_graph(&h, &req(0)).unwrap();
        let shared = transformer_graph_with(&h, &req(0), GraphOptions { mtp_weights: MtpWeights::Repeated, ..GraphOptions::default() }).unwrap();
        let ops = |g: &Graph, p: &str| g.operations.iter().filter(|o| o.name.starts_with(p)).count();
        assert_eq!(ops(&shared, "mtp.1."), ops(&shared, "mtp.0."));
        assert_eq!(ops(&shared, "mtp.1."), ops(&own, "mtp.1."));
        assert!(!shared.tensors.iter().any(|t| t.kind == TensorKind::Weight && t.name.starts_with("mtp.1.")));
        let module: u64 =
            own.tensors.iter().filter(|t| t.kind == TensorKind::Weight && t.name.starts_with("mtp.1.")).map(|t| t.shape.iter().product::<u64>()).sum();
        assert!(module > 0);
        assert_eq!(weights(&shared) + module, weights(&own));
        let q = shared.operations.iter().find(|o| o.name == "mtp.1.attn.q").unwrap();
        assert_eq!((q.inputs[1].as_str(), q.layer), ("mtp.0.attn.q.weight", 6));
        // Only the MTP modules share: the main stack and the head are as before.
        assert_eq!(ops(&shared, "layers."), ops(&own, "layers."));
    }

    /// What the wiring test above leaves open: each single-mixer block reads its own
    /// pre-norm (not the raw residual stream), each norm reads the previous layer's
    /// residual (the first the embedding, the final norm the last layer's), the B
    /// convolution reads the B projection and out_proj the grouped norm, and the scan, gate
    /// and grouped norm split by heads like the convolutions. Kills the 9 of 41 hand
    /// mutations of this file that survived every SDK test: the Mamba, attention or MLP
    /// block reading `x`, conv_b reading C, out_proj skipping the norm, the scan, gate or
    /// grouped norm made column-parallel, the Mamba pre-norm named `attn_norm`.
    #[test]
    fn each_block_reads_its_pre_norm_and_the_mixer_its_own_projections() {
        let g = transformer_graph(&small("M*-E"), &req(0)).unwrap();
        let op = |n: &str| g.operations.iter().find(|o| o.name == n).unwrap_or_else(|| panic!("no op {n}"));
        let q = "layers.0.mixer";
        for proj in ["z", "x", "b", "c", "dt"] {
            assert_eq!(op(&format!("{q}.{proj}")).inputs[0], "layers.0.mixer_norm", "{proj}");
        }
        for (conv, proj) in [("conv_x", "x"), ("conv_b", "b"), ("conv_c", "c")] {
            assert_eq!(op(&format!("{q}.{conv}")).inputs[0], format!("{q}.{proj}"), "{conv}");
        }
        assert_eq!(op(&format!("{q}.out")).inputs[0], format!("{q}.norm"));
        for k in ["scan", "gate", "norm"] {
            assert_eq!(op(&format!("{q}.{k}")).role, ParallelRole::HeadParallel, "{k}");
        }
        assert_eq!(op("layers.1.attn.q").inputs[0], "layers.1.attn_norm");
        assert_eq!(op("layers.2.mlp.gate").inputs[0], "layers.2.mlp_norm");
        assert_eq!(op("layers.3.moe.router_logits").inputs[0], "layers.3.mlp_norm");
        let norms = ["layers.0.mixer_norm", "layers.1.attn_norm", "layers.2.mlp_norm", "layers.3.mlp_norm"];
        let before = ["embed", "layers.0.residual", "layers.1.residual", "layers.2.residual"];
        for (norm, x) in norms.iter().zip(before) {
            assert_eq!(op(norm).inputs[0], x, "{norm}");
        }
        assert_eq!(op("final_norm").inputs[0], "layers.3.residual");
    }

    /// The pattern's first and last characters are its first and last layers, whatever
    /// they are, and a partial request stops after the layers asked for: "*EM" builds
    /// attention at layer 0 and the Mamba mixer at layer 2; one layer is the attention
    /// block alone, and two add the experts.
    #[test]
    fn first_and_last_layers_follow_the_pattern_and_partial_requests_stop_in_it() {
        let h = small("*EM");
        let g = transformer_graph(&h, &req(0)).unwrap();
        let has = |g: &Graph, layer: i32, k: OpKind| kinds(g, layer).contains(&format!("{k:?}"));
        assert!(has(&g, 0, OpKind::Attention) && !has(&g, 0, OpKind::SsmScan) && !has(&g, 0, OpKind::Router));
        assert!(has(&g, 1, OpKind::Router) && !has(&g, 1, OpKind::Attention));
        assert!(has(&g, 2, OpKind::SsmScan) && !has(&g, 2, OpKind::Attention) && !has(&g, 2, OpKind::Router));
        assert_eq!(g.operations.iter().find(|o| o.name == "final_norm").unwrap().inputs[0], "layers.2.residual");
        for (layers, last) in [(1, "layers.0.residual"), (2, "layers.1.residual")] {
            let part = transformer_graph(&h, &req(layers)).unwrap();
            assert!(part.operations.iter().all(|o| o.layer < layers as i32), "{layers} layers");
            assert_eq!(part.operations.iter().find(|o| o.name == "final_norm").unwrap().inputs[0], last);
        }
        // Embedding and head 2 x 6,400, the final norm 64, the attention block 12,352
        // (norm 64, q and out 64x64, k and v 32x64).
        let one = transformer_graph(&h, &req(1)).unwrap();
        assert_eq!(weights(&one), 2 * 6400 + 64 + 12_352);
    }

    /// The mixer's wiring, which parameter and FLOP counts cannot see: the scan reads
    /// x, dt, B, C in that order (B and C have one shape), the gate is silu(z)·y (z first),
    /// the grouped norm has the model's epsilon, the projections to z, x, B, C and dt split
    /// by columns, the convolutions by heads like the scan, out_proj by rows, and the
    /// residual add is a sequence-parallel op like every other layer's.
    #[test]
    fn mixer_wiring_roles_and_attributes() {
        let h = Hyperparameters { norm_eps: 1e-4, ..small("M") };
        let g = transformer_graph(&h, &req(0)).unwrap();
        let op = |n: &str| g.operations.iter().find(|o| o.name == n).unwrap_or_else(|| panic!("no op {n}"));
        let q = "layers.0.mixer";
        let scan: Vec<String> = ["conv_x", "dt", "conv_b", "conv_c", "scan.a_log", "scan.d", "scan.dt_bias"].iter().map(|n| format!("{q}.{n}")).collect();
        assert_eq!(op(&format!("{q}.scan")).inputs, scan);
        assert_eq!(op(&format!("{q}.gate")).inputs, [format!("{q}.z"), format!("{q}.scan")]);
        assert!(matches!(op(&format!("{q}.norm")).attrs[..], [ref a] if a.key == "eps" && matches!(a.value, AttrValue::Float(e) if e == 1e-4)));
        for proj in ["z", "x", "b", "c", "dt"] {
            assert_eq!(op(&format!("{q}.{proj}")).role, ParallelRole::ColumnParallel, "{proj}");
        }
        assert_eq!(op(&format!("{q}.out")).role, ParallelRole::RowParallel);
        for conv in ["conv_x", "conv_b", "conv_c"] {
            assert_eq!(op(&format!("{q}.{conv}")).role, ParallelRole::HeadParallel, "{conv}");
        }
        assert_eq!(op("layers.0.residual").role, ParallelRole::Sequence);
        assert_eq!(op("layers.0.residual").inputs, ["embed", "layers.0.mixer.out"]);
    }
}
