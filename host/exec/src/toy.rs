//! Small decoder graphs built by hand, for tests and benches that must not depend on a
//! plugin: the same op conventions and names as the SDK's `transformer_graph`
//! (`embed`, `layers.{i}.attn_norm`, `.attn.{q,k,v,q_rope,k_rope,core,out}` (and
//! `.attn.{q_norm,k_norm}` with [`ToyConfig::qk_norm`]),
//! `.residual1`, `.mlp_norm`, `.mlp.{gate,up,act,down}` or `.moe.*`, `.residual2`,
//! `final_norm`, `lm_head`, `loss`), plus optional tied embeddings and
//! multi-token-prediction modules (`mtp.{j}.*`, DeepSeek-V3 style) so that gradient
//! accumulation through shared weights and `concat` gets exercised.
//!
//! Shape notation: B batch, T sequence, C hidden, H heads, Hkv kv heads, D head dim,
//! F ffn width, E experts, k top-k, V vocabulary, N = B*T.
//!
//! [`mamba`] is a Mamba-2 decoder of the same embedding and head (`layers.{i}.mixer.*`),
//! for the causal conv1d and SSD scan ops.

use std::collections::BTreeMap;

use runner_graph::{Attr, DType, Graph, NamedOp, OpKind, Role, Tensor, TensorKind};

/// Size of a toy decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct ToyConfig {
    pub layers: u32,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub ffn: u64,
    pub vocab: u64,
    pub seq: u64,
    pub batch: u64,
    /// Routed experts instead of the dense MLP: (E, top-k, expert F).
    pub moe: Option<(u64, u64, u64)>,
    /// lm_head reuses `embed.weight`.
    pub tied: bool,
    /// Multi-token-prediction depth (inputs `mtp.{j}.tokens` / `mtp.{j}.targets`).
    pub mtp: u32,
    /// RoPE frequency base θ (10000 Llama 2, 500000 Llama 3).
    pub rope_theta: f64,
    /// Qwen3's per-head query/key RMSNorms (`.attn.q_norm`, `.attn.k_norm`, weight (D))
    /// between the projections and RoPE, as the SDK builder's `GraphOptions::qk_norm`.
    pub qk_norm: bool,
}

impl ToyConfig {
    /// 2 layers, hidden 32, 4 heads over 2 KV heads, FFN 64, vocab 64, seq 8, batch 2.
    pub fn tiny() -> ToyConfig {
        ToyConfig {
            layers: 2,
            hidden: 32,
            heads: 4,
            kv_heads: 2,
            ffn: 64,
            vocab: 64,
            seq: 8,
            batch: 2,
            moe: None,
            tied: false,
            mtp: 0,
            rope_theta: 10_000.0,
            qk_norm: false,
        }
    }

    /// The executor-issue benchmark shape: 4 layers, hidden 256, 8 heads, 2 KV heads,
    /// FFN 688, seq 256, batch 8, vocab 8192, RoPE θ 500000 (Llama 3); the same model as
    /// `host/exec/benches/pytorch_llama_step.py`.
    pub fn bench() -> ToyConfig {
        ToyConfig {
            layers: 4,
            hidden: 256,
            heads: 8,
            kv_heads: 2,
            ffn: 688,
            vocab: 8192,
            seq: 256,
            batch: 8,
            moe: None,
            tied: false,
            mtp: 0,
            rope_theta: 500_000.0,
            qk_norm: false,
        }
    }
}

impl ToyConfig {
    /// One layer of Llama 3.1 8B (hidden 4096, 32 heads over 8 KV heads of 128, SwiGLU
    /// FFN 14336, vocabulary 128256, RoPE θ 500000; Meta's model card) at sequence `seq`
    /// and micro-batch `batch`, with its embedding, head and loss: the layer step the GPU
    /// check times against PyTorch eager.
    pub fn llama31_8b_layer(seq: u64, batch: u64) -> ToyConfig {
        ToyConfig {
            layers: 1,
            hidden: 4096,
            heads: 32,
            kv_heads: 8,
            ffn: 14336,
            vocab: 128_256,
            seq,
            batch,
            moe: None,
            tied: false,
            mtp: 0,
            rope_theta: 500_000.0,
            qk_norm: false,
        }
    }
}

#[derive(Default)]
struct Builder {
    tensors: Vec<Tensor>,
    ops: Vec<NamedOp>,
}

impl Builder {
    fn t(&mut self, name: &str, shape: &[u64], dtype: DType, kind: TensorKind) -> String {
        self.tensors.push(Tensor {
            name: name.into(),
            shape: shape.to_vec(),
            dtype,
            kind,
        });
        name.into()
    }
    fn op(
        &mut self,
        name: &str,
        kind: OpKind,
        i: &[&str],
        o: &[&str],
        attrs: Vec<(&str, Attr)>,
        layer: i32,
    ) {
        self.ops.push(NamedOp {
            name: name.into(),
            kind,
            inputs: i.iter().map(|s| s.to_string()).collect(),
            outputs: o.iter().map(|s| s.to_string()).collect(),
            attrs: attrs
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect::<BTreeMap<_, _>>(),
            layer,
            role: Role::Replicated,
        });
    }
    /// Op `name` with one bf16 output named like it.
    fn unary(
        &mut self,
        name: &str,
        kind: OpKind,
        i: &[&str],
        shape: &[u64],
        attrs: Vec<(&str, Attr)>,
        layer: i32,
    ) -> String {
        let o = self.t(name, shape, DType::BF16, TensorKind::Activation);
        self.op(name, kind, i, &[&o], attrs, layer);
        o
    }
    fn linear(&mut self, name: &str, x: &str, k: u64, n: u64, shape: &[u64], layer: i32) -> String {
        let w = self.t(
            &format!("{name}.weight"),
            &[n, k],
            DType::BF16,
            TensorKind::Weight,
        );
        self.unary(name, OpKind::Linear, &[x, &w], shape, vec![], layer)
    }
    fn norm(&mut self, name: &str, x: &str, c: u64, shape: &[u64], layer: i32) -> String {
        let w = self.t(
            &format!("{name}.weight"),
            &[c],
            DType::BF16,
            TensorKind::Weight,
        );
        self.unary(
            name,
            OpKind::RmsNorm,
            &[x, &w],
            shape,
            vec![("eps", Attr::Float(1e-5))],
            layer,
        )
    }
}

/// One pre-norm block named `p`.
fn block(g: &mut Builder, c: &ToyConfig, p: &str, layer: i32, x: &str) -> String {
    let (b, t, h, hkv, cc) = (c.batch, c.seq, c.heads, c.kv_heads, c.hidden);
    let d = cc / h;
    let n1 = g.norm(&format!("{p}.attn_norm"), x, cc, &[b, t, cc], layer);
    let mut q = g.linear(&format!("{p}.attn.q"), &n1, cc, h * d, &[b, t, h, d], layer);
    let mut k = g.linear(
        &format!("{p}.attn.k"),
        &n1,
        cc,
        hkv * d,
        &[b, t, hkv, d],
        layer,
    );
    let v = g.linear(
        &format!("{p}.attn.v"),
        &n1,
        cc,
        hkv * d,
        &[b, t, hkv, d],
        layer,
    );
    if c.qk_norm {
        q = g.norm(&format!("{p}.attn.q_norm"), &q, d, &[b, t, h, d], layer);
        k = g.norm(&format!("{p}.attn.k_norm"), &k, d, &[b, t, hkv, d], layer);
    }
    let rope = |d: u64| {
        vec![
            ("theta", Attr::Float(c.rope_theta)),
            ("rot-dim", Attr::Int(d as i64)),
        ]
    };
    let qr = g.unary(
        &format!("{p}.attn.q_rope"),
        OpKind::Rotary,
        &[&q],
        &[b, t, h, d],
        rope(d),
        layer,
    );
    let kr = g.unary(
        &format!("{p}.attn.k_rope"),
        OpKind::Rotary,
        &[&k],
        &[b, t, hkv, d],
        rope(d),
        layer,
    );
    let attrs = vec![
        ("causal", Attr::Flag(true)),
        ("window", Attr::Int(0)),
        ("scale", Attr::Float(1.0 / (d as f64).sqrt())),
    ];
    let core = g.unary(
        &format!("{p}.attn.core"),
        OpKind::Attention,
        &[&qr, &kr, &v],
        &[b, t, h, d],
        attrs,
        layer,
    );
    let a = g.linear(
        &format!("{p}.attn.out"),
        &core,
        h * d,
        cc,
        &[b, t, cc],
        layer,
    );
    let r1 = g.unary(
        &format!("{p}.residual1"),
        OpKind::Add,
        &[x, &a],
        &[b, t, cc],
        vec![],
        layer,
    );
    let n2 = g.norm(&format!("{p}.mlp_norm"), &r1, cc, &[b, t, cc], layer);
    let m = match c.moe {
        None => {
            let f = c.ffn;
            let gate = g.linear(&format!("{p}.mlp.gate"), &n2, cc, f, &[b, t, f], layer);
            let up = g.linear(&format!("{p}.mlp.up"), &n2, cc, f, &[b, t, f], layer);
            let act = g.unary(
                &format!("{p}.mlp.act"),
                OpKind::SwiGlu,
                &[&gate, &up],
                &[b, t, f],
                vec![],
                layer,
            );
            g.linear(&format!("{p}.mlp.down"), &act, f, cc, &[b, t, cc], layer)
        }
        Some((e, k, f)) => {
            let n = b * t;
            let logits = g.linear(
                &format!("{p}.moe.router_logits"),
                &n2,
                cc,
                e,
                &[b, t, e],
                layer,
            );
            let w = g.t(
                &format!("{p}.moe.router.weights"),
                &[n, k],
                DType::F32,
                TensorKind::Activation,
            );
            let idx = g.t(
                &format!("{p}.moe.router.indices"),
                &[n, k],
                DType::I32,
                TensorKind::Activation,
            );
            let attrs = vec![
                ("top-k", Attr::Int(k as i64)),
                ("score", Attr::Text("softmax".into())),
                ("normalize", Attr::Flag(true)),
            ];
            g.op(
                &format!("{p}.moe.router"),
                OpKind::Router,
                &[&logits],
                &[&w, &idx],
                attrs,
                layer,
            );
            let sorted = g.unary(
                &format!("{p}.moe.dispatch"),
                OpKind::MoeDispatch,
                &[&n2, &idx],
                &[n * k, cc],
                vec![("experts", Attr::Int(e as i64))],
                layer,
            );
            let mut grouped = |name: &str, x: &str, out: u64, inp: u64| {
                let wt = g.t(
                    &format!("{p}.moe.experts.{name}.weight"),
                    &[e, out, inp],
                    DType::BF16,
                    TensorKind::Weight,
                );
                g.unary(
                    &format!("{p}.moe.experts.{name}"),
                    OpKind::GroupedLinear,
                    &[x, &wt, &idx],
                    &[n * k, out],
                    vec![],
                    layer,
                )
            };
            let gate = grouped("gate", &sorted, f, cc);
            let up = grouped("up", &sorted, f, cc);
            let act = g.unary(
                &format!("{p}.moe.experts.act"),
                OpKind::SwiGlu,
                &[&gate, &up],
                &[n * k, f],
                vec![],
                layer,
            );
            let wt = g.t(
                &format!("{p}.moe.experts.down.weight"),
                &[e, cc, f],
                DType::BF16,
                TensorKind::Weight,
            );
            let down = g.unary(
                &format!("{p}.moe.experts.down"),
                OpKind::GroupedLinear,
                &[&act, &wt, &idx],
                &[n * k, cc],
                vec![],
                layer,
            );
            g.unary(
                &format!("{p}.moe.combine"),
                OpKind::MoeCombine,
                &[&down, &w, &idx],
                &[b, t, cc],
                vec![],
                layer,
            )
        }
    };
    g.unary(
        &format!("{p}.residual2"),
        OpKind::Add,
        &[&r1, &m],
        &[b, t, cc],
        vec![],
        layer,
    )
}

/// The inputs `tokens` and `targets` (B,T), the table `embed.weight` and the lookup
/// `embed`: (the embedded tokens, the table).
fn embedding(g: &mut Builder, c: &ToyConfig) -> (String, String) {
    let (b, t, cc) = (c.batch, c.seq, c.hidden);
    g.t("tokens", &[b, t], DType::I32, TensorKind::Input);
    g.t("targets", &[b, t], DType::I32, TensorKind::Input);
    let table = g.t(
        "embed.weight",
        &[c.vocab, cc],
        DType::BF16,
        TensorKind::Weight,
    );
    let x = g.unary(
        "embed",
        OpKind::Embedding,
        &["tokens", &table],
        &[b, t, cc],
        vec![],
        -1,
    );
    (x, table)
}

/// `final_norm` and `lm_head` over x (the table when tied): (the logits, the head's
/// weight).
fn lm_head(g: &mut Builder, c: &ToyConfig, table: &str, x: &str) -> (String, String) {
    let (b, t, cc, v) = (c.batch, c.seq, c.hidden, c.vocab);
    let normed = g.norm("final_norm", x, cc, &[b, t, cc], -1);
    let head = if c.tied {
        table.to_string()
    } else {
        g.t("lm_head.weight", &[v, cc], DType::BF16, TensorKind::Weight)
    };
    let logits = g.unary(
        "lm_head",
        OpKind::Linear,
        &[&normed, &head],
        &[b, t, v],
        vec![],
        -1,
    );
    (logits, head)
}

/// The forward graph of a toy llama-style decoder (MoE if `c.moe` is set).
///
/// # Panics
/// If the configuration is inconsistent (hidden not divisible by heads, heads by kv
/// heads): these are test fixtures, and a fixture that cannot build is a test bug.
pub fn llama(c: &ToyConfig) -> Graph {
    assert!(
        c.hidden.is_multiple_of(c.heads) && c.heads.is_multiple_of(c.kv_heads),
        "toy config {c:?} is inconsistent"
    );
    let mut g = Builder::default();
    let (b, t, cc, v) = (c.batch, c.seq, c.hidden, c.vocab);
    let out = -1;
    let (mut x, table) = embedding(&mut g, c);
    for i in 0..c.layers {
        x = block(&mut g, c, &format!("layers.{i}"), i as i32, &x);
    }
    let (logits, head) = lm_head(&mut g, c, &table, &x);
    let main = if c.mtp == 0 { "loss" } else { "loss.lm" };
    let mut loss = g.t(main, &[], DType::F32, TensorKind::Activation);
    g.op(
        "loss",
        OpKind::CrossEntropy,
        &[&logits, "targets"],
        &[&loss],
        vec![],
        out,
    );
    let mut h = x;
    for j in 0..c.mtp {
        let p = format!("mtp.{j}");
        let layer = (c.layers + j) as i32;
        let tok = g.t(
            &format!("{p}.tokens"),
            &[b, t],
            DType::I32,
            TensorKind::Input,
        );
        let tgt = g.t(
            &format!("{p}.targets"),
            &[b, t],
            DType::I32,
            TensorKind::Input,
        );
        let emb = g.unary(
            &format!("{p}.embed"),
            OpKind::Embedding,
            &[&tok, &table],
            &[b, t, cc],
            vec![],
            layer,
        );
        let en = g.norm(&format!("{p}.enorm"), &emb, cc, &[b, t, cc], layer);
        let hn = g.norm(&format!("{p}.hnorm"), &h, cc, &[b, t, cc], layer);
        let cat = g.unary(
            &format!("{p}.concat"),
            OpKind::Concat,
            &[&hn, &en],
            &[b, t, 2 * cc],
            vec![],
            layer,
        );
        let proj = g.linear(
            &format!("{p}.eh_proj"),
            &cat,
            2 * cc,
            cc,
            &[b, t, cc],
            layer,
        );
        h = block(&mut g, c, &p, layer, &proj);
        let n = g.norm(&format!("{p}.final_norm"), &h, cc, &[b, t, cc], layer);
        let lg = g.unary(
            &format!("{p}.lm_head"),
            OpKind::Linear,
            &[&n, &head],
            &[b, t, v],
            vec![],
            layer,
        );
        let l = g.t(
            &format!("{p}.loss"),
            &[],
            DType::F32,
            TensorKind::Activation,
        );
        g.op(
            &format!("{p}.loss"),
            OpKind::CrossEntropy,
            &[&lg, &tgt],
            &[&l],
            vec![],
            layer,
        );
        let total = if j + 1 == c.mtp {
            "loss".to_string()
        } else {
            format!("{p}.loss_sum")
        };
        let sum = g.t(&total, &[], DType::F32, TensorKind::Activation);
        g.op(
            &format!("{p}.loss_add"),
            OpKind::Add,
            &[&loss, &l],
            &[&sum],
            vec![],
            layer,
        );
        loss = sum;
    }
    let loss = loss.clone();
    Graph::new(g.tensors, g.ops, &loss).unwrap_or_else(|e| panic!("toy graph does not build: {e}"))
}

/// State size N of the toy Mamba mixer's scan.
pub const MAMBA_STATE: u64 = 8;
/// Taps K of the toy Mamba mixer's causal convolution.
pub const MAMBA_CONV: u64 = 4;
/// The scan's `chunk` attribute in the toy Mamba (4 steps: two chunks of seq 8, uneven
/// ones of odd lengths).
pub const MAMBA_CHUNK: i64 = 4;

/// One Mamba-2 mixer block named `p`: x + out(silu(z) ∘ scan(conv(in_x), dt, B, C)), the
/// projections of the pre-norm input each a linear of their own (Mamba-2's one fused
/// in_proj split by output), the conv over x's channels only (Mamba-2 convolves x, B and C
/// together) and the gate without Mamba-2's norm. Names `{p}.mixer_norm`,
/// `{p}.mixer.{x,z,b,c,dt,conv,scan,gate,out}`, `{p}.residual`.
fn mamba_block(g: &mut Builder, c: &ToyConfig, p: &str, layer: i32, x: &str) -> String {
    let (b, t, cc, h, gr) = (c.batch, c.seq, c.hidden, c.heads, c.kv_heads);
    let (hp, n) = (c.hidden / c.heads, MAMBA_STATE);
    let xn = g.norm(&format!("{p}.mixer_norm"), x, cc, &[b, t, cc], layer);
    let m = format!("{p}.mixer");
    let xin = g.linear(&format!("{m}.x"), &xn, cc, h * hp, &[b, t, h, hp], layer);
    let z = g.linear(&format!("{m}.z"), &xn, cc, h * hp, &[b, t, h, hp], layer);
    let bm = g.linear(&format!("{m}.b"), &xn, cc, gr * n, &[b, t, gr, n], layer);
    let cm = g.linear(&format!("{m}.c"), &xn, cc, gr * n, &[b, t, gr, n], layer);
    let dt = g.linear(&format!("{m}.dt"), &xn, cc, h, &[b, t, h], layer);
    let weight = |g: &mut Builder, name: &str, shape: &[u64]| {
        g.t(
            &format!("{m}.{name}"),
            shape,
            DType::BF16,
            TensorKind::Weight,
        )
    };
    let cw = weight(g, "conv.weight", &[h * hp, MAMBA_CONV]);
    let cb = weight(g, "conv.bias", &[h * hp]);
    let conv = g.unary(
        &format!("{m}.conv"),
        OpKind::CausalConv1d,
        &[&xin, &cw, &cb],
        &[b, t, h, hp],
        vec![],
        layer,
    );
    let (a_log, d, dt_bias) = (
        weight(g, "scan.a_log", &[h]),
        weight(g, "scan.d", &[h]),
        weight(g, "scan.dt_bias", &[h]),
    );
    let y = g.unary(
        &format!("{m}.scan"),
        OpKind::SsmScan,
        &[&conv, &dt, &bm, &cm, &a_log, &d, &dt_bias],
        &[b, t, h, hp],
        vec![("chunk", Attr::Int(MAMBA_CHUNK))],
        layer,
    );
    let gated = g.unary(
        &format!("{m}.gate"),
        OpKind::SwiGlu,
        &[&z, &y],
        &[b, t, h, hp],
        vec![],
        layer,
    );
    let out = g.linear(&format!("{m}.out"), &gated, h * hp, cc, &[b, t, cc], layer);
    g.unary(
        &format!("{p}.residual"),
        OpKind::Add,
        &[x, &out],
        &[b, t, cc],
        vec![],
        layer,
    )
}

/// The forward graph of a toy Mamba-2 decoder: `c.layers` mixer blocks
/// ([`mamba_block`]) between the embedding and the head, `c.heads` SSD heads of
/// hidden/heads channels whose B and C come in `c.kv_heads` groups, state
/// [`MAMBA_STATE`], conv [`MAMBA_CONV`] taps, scan chunk [`MAMBA_CHUNK`]; tied if
/// `c.tied`.
///
/// # Panics
/// If the configuration is inconsistent (hidden not divisible by heads, heads by
/// groups) or asks for what the toy Mamba lacks (experts, MTP).
pub fn mamba(c: &ToyConfig) -> Graph {
    assert!(
        c.hidden.is_multiple_of(c.heads)
            && c.heads.is_multiple_of(c.kv_heads)
            && c.moe.is_none()
            && c.mtp == 0,
        "toy mamba config {c:?} is inconsistent"
    );
    let mut g = Builder::default();
    let (mut x, table) = embedding(&mut g, c);
    for i in 0..c.layers {
        x = mamba_block(&mut g, c, &format!("layers.{i}"), i as i32, &x);
    }
    let (logits, _) = lm_head(&mut g, c, &table, &x);
    let loss = g.t("loss", &[], DType::F32, TensorKind::Activation);
    g.op(
        "loss",
        OpKind::CrossEntropy,
        &[&logits, "targets"],
        &[&loss],
        vec![],
        -1,
    );
    Graph::new(g.tensors, g.ops, &loss)
        .unwrap_or_else(|e| panic!("toy mamba graph does not build: {e}"))
}

/// A fixed batch for every int32 input of `g`: a short repeating token sequence (period
/// 5, offset per row) as tokens, the next token as targets (the pattern a tiny model can
/// learn), and for MTP inputs the sequence shifted further. Values stay under each
/// input's vocabulary. Returns (tokens, targets) of the main model; the full list is in
/// [`batch_inputs`].
/// The toy graph with Megatron's parallel roles (the SDK builder's), the embedding, head
/// and loss vocab-parallel or replicated; a MoE toy's dispatch, experts and combine are
/// expert ops, its router replicated.
pub fn with_roles(mut g: Graph, vocab_parallel: bool) -> Graph {
    for op in &mut g.ops {
        let n = op.name.as_str();
        let ends = |s: &[&str]| s.iter().any(|x| n.ends_with(x));
        op.role = if n.ends_with(".moe.dispatch")
            || n.ends_with(".moe.combine")
            || n.contains(".moe.experts.")
        {
            Role::Expert
        } else if ends(&[
            ".attn.q",
            ".attn.k",
            ".attn.v",
            ".mlp.gate",
            ".mlp.up",
            ".mlp.act",
        ]) {
            Role::ColumnParallel
        } else if ends(&[".attn.q_norm", ".attn.k_norm", ".attn.q_rope", ".attn.k_rope", ".attn.core"]) {
            Role::HeadParallel
        } else if ends(&[".attn.out", ".mlp.down"]) {
            Role::RowParallel
        } else if vocab_parallel && matches!(n, "embed" | "lm_head" | "loss") {
            Role::VocabParallel
        } else {
            Role::Replicated
        };
    }
    g
}

pub fn repeating_batch(g: &Graph, seed: u32) -> (Vec<u32>, Vec<u32>) {
    let all = batch_inputs(g, seed);
    let get = |n: &str| {
        all.iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    (get("tokens"), get("targets"))
}

/// Values for every int32 input of `g` (see [`repeating_batch`]): `tokens` at shift 0,
/// `targets` 1, `mtp.{j}.tokens` j+1, `mtp.{j}.targets` j+2, anything else 0.
pub fn batch_inputs(g: &Graph, seed: u32) -> Vec<(String, Vec<u32>)> {
    let vocab = g
        .tensor_id("embed.weight")
        .map_or(2, |id| g.tensors[id].shape[0]) as u32;
    let pattern = [3u32, 1, 4, 1, 5];
    g.tensors
        .iter()
        .filter(|t| t.kind == TensorKind::Input && t.dtype == DType::I32)
        .map(|t| {
            let shift = match t.name.as_str() {
                "tokens" => 0,
                "targets" => 1,
                n => match (n.strip_prefix("mtp."), n.ends_with(".tokens")) {
                    (Some(rest), is_tok) => {
                        let j: u32 = rest
                            .split('.')
                            .next()
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(0);
                        j + if is_tok { 1 } else { 2 }
                    }
                    _ => 0,
                },
            };
            let (rows, cols) = (
                t.shape[0] as u32,
                t.shape.get(1).copied().unwrap_or(1) as u32,
            );
            let v: Vec<u32> = (0..rows)
                .flat_map(|r| {
                    (0..cols).map(move |c| {
                        let i = (c + shift + r * 2 + seed) as usize;
                        (pattern[i % pattern.len()] * 7 + r + seed) % vocab
                    })
                })
                .collect();
            (t.name.clone(), v)
        })
        .collect()
}
