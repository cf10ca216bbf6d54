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

/// Every layer's block, from the pattern.
///
/// # Errors
/// A pattern whose length is not `layers`, a character outside `M*-E`, or a layer kind
/// whose sizes are missing (`M` without `mamba`, `E` without `moe`, `-` with ffn 0).
pub(super) fn stack(h: &Hyperparameters) -> Result<Vec<Block<'_>>, String> {
    if h.layer_pattern.is_empty() {
        return Ok(vec![Block::Transformer; h.layers as usize]);
    }
    let n = h.layer_pattern.chars().count();
    if n != h.layers as usize {
        return Err(format!("layer-pattern has {n} characters but layers is {}: give one per layer", h.layers));
    }
    h.layer_pattern
        .chars()
        .enumerate()
        .map(|(i, ch)| match ch {
            'M' => match &h.mamba {
                // The grouped norm divides the inner width by the groups.
                Some(m) if m.groups > 0 && m.heads.is_multiple_of(m.groups) => Ok(Block::Mamba(m)),
                Some(m) => Err(format!("mamba.groups ({}) must divide mamba.heads ({})", m.groups, m.heads)),
                None => Err(format!("layer-pattern puts a Mamba-2 mixer (M) at layer {i} but no mamba sizes are given")),
            },
            '*' => Ok(Block::Attention),
            '-' if h.ffn > 0 => Ok(Block::Mlp),
            '-' => Err(format!("layer-pattern puts a dense MLP (-) at layer {i} but ffn is 0")),
            'E' => h
                .moe
                .as_ref()
                .map(Block::Moe)
                .ok_or_else(|| format!("layer-pattern puts experts (E) at layer {i} but no moe sizes are given")),
            other => Err(format!(
                "layer-pattern has {:?} at layer {i}: use M (Mamba-2), * (attention), - (MLP) or E (MoE)",
                other.escape_debug().to_string()
            )),
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
