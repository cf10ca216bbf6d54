//! Shared transformer building blocks: a family plugin is a table of published
//! configurations, and this module turns any row of that table into the logical forward
//! graph the host executes, differentiates, shards and counts.
//!
//! Key items:
//! - [`GraphBuilder`]: declares tensors and operations with the graph conventions of the
//!   host (unique hierarchical names, row-major shapes, `.weight`/`.bias` suffixes) and
//!   reports the first naming mistake when finished instead of panicking.
//! - [`transformer_graph`]: the full forward graph of a decoder from [`Hyperparameters`]
//!   alone (dense/GQA/MHA/MLA attention, MoE with shared experts, dense leading layers and
//!   layer frequency, LatentMoE, sliding windows, learned or rotary positions, biases,
//!   LayerNorm or RMSNorm, SwiGLU/GeGLU/GeLU/squared-ReLU, tied embeddings, multi-token
//!   prediction), and hybrid Mamba-2/attention/MLP/MoE stacks from a layer pattern
//!   (`hybrid.rs`).
//! - [`variant`], [`Layout`], [`defaults`], [`decoder`]: shorthands for a plugin's table.
//! - [`find_variant`], [`graph_for`]: resolve and validate a [`GraphRequest`];
//!   [`graph_for_with`] for a family whose graph needs a [`GraphOptions`] choice the
//!   contract's hyperparameters do not carry (MTP modules sharing one set of weights,
//!   per-head query/key norms).
//!
//! Shape notation: B = micro-batch, T = sequence, C = hidden, H = query heads, Hkv = key/
//! value heads, D = head dim, F = MLP width, E = routed experts, k = top-k, N = B*T tokens,
//! V = vocabulary. Views are implicit: (B,T,H,D) is the same memory as (B,T,H*D) and (N,C)
//! the same as (B,T,C), so every tensor is declared with the shape its consumer wants.

use rustc_hash::{FxHashMap, FxHashSet};

use super::{
    ActivationKind, AttentionKind, AttrValue, Attribute, Dtype, Graph, GraphRequest,
    Hyperparameters, MambaConfig, MlaConfig, ModelInfo, MoeConfig, NormKind, OpKind, Operation,
    ParallelRole, Phase, PositionScheme, RecomputeGranularity, ReferenceLayout, RouterScore,
    Tensor, TensorKind, TrainingDefaults, TrainingPrecision, Variant, training_precision,
    validate_hyperparameters,
};

#[path = "hybrid.rs"]
mod hybrid;

runner_contract::reference_layout!();

/// Layer index of operations outside the transformer stack (embedding, head, loss).
pub const OUTSIDE: i32 = -1;

/// An integer attribute.
pub fn int(key: &str, value: i64) -> Attribute {
    Attribute { key: key.into(), value: AttrValue::Int(value) }
}
/// A float attribute.
pub fn float(key: &str, value: f64) -> Attribute {
    Attribute { key: key.into(), value: AttrValue::Float(value) }
}
/// A boolean attribute.
pub fn flag(key: &str, value: bool) -> Attribute {
    Attribute { key: key.into(), value: AttrValue::Flag(value) }
}
/// A text attribute.
pub fn text(key: &str, value: &str) -> Attribute {
    Attribute { key: key.into(), value: AttrValue::Text(value.into()) }
}

/// Declares tensors and operations in execution order.
///
/// Methods return the declared tensor's name so calls chain naturally. A duplicate tensor
/// or operation name does not panic: the first one is remembered and [`GraphBuilder::finish`]
/// returns it as the error.
#[derive(Default)]
pub struct GraphBuilder {
    tensors: Vec<Tensor>,
    ops: Vec<Operation>,
    /// Tensor name -> index in `tensors`. Hashed, not ordered: names share long prefixes
    /// (`layers.95.attn...`), which an ordered map compares again at every level, and a
    /// plugin's graph reads them thousands of times. Fx, not SipHash: the names are the
    /// plugin's own, with no one to defend against.
    tensor_names: FxHashMap<String, usize>,
    op_names: FxHashSet<String>,
    error: Option<String>,
    /// While set, (from, to): a weight declared as `from...` is the existing `to...`.
    reuse: Option<(String, String)>,
}

impl GraphBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Declare a tensor of any kind; returns its name.
    pub fn tensor(&mut self, name: &str, shape: &[u64], dtype: Dtype, kind: TensorKind) -> String {
        if self.tensor_names.insert(name.to_string(), self.tensors.len()).is_some() && self.error.is_none() {
            self.error = Some(format!("tensor '{name}' declared twice"));
        }
        self.tensors.push(Tensor { name: name.into(), shape: shape.to_vec(), dtype, kind });
        name.to_string()
    }

    /// An input the host feeds each step (tokens, targets, positions).
    pub fn input(&mut self, name: &str, shape: &[u64], dtype: Dtype) -> String {
        self.tensor(name, shape, dtype, TensorKind::Input)
    }

    /// A trainable bf16 parameter (logical dtype; the precision policy picks real formats).
    pub fn weight(&mut self, name: &str, shape: &[u64]) -> String {
        if let Some((from, to)) = &self.reuse
            && let Some(rest) = name.strip_prefix(from.as_str())
        {
            let target = format!("{to}{rest}");
            if self.shape(&target) == Some(shape) {
                return target;
            }
            if self.error.is_none() {
                self.error = Some(format!("weight '{name}' should reuse '{target}', which is not declared as {shape:?}"));
            }
        }
        self.tensor(name, shape, Dtype::Bf16, TensorKind::Weight)
    }

    /// Until [`GraphBuilder::own_weights`], weights declared under the name prefix `from`
    /// are the ones already declared under `to` (a module applied twice).
    fn reuse_weights(&mut self, from: &str, to: &str) {
        self.reuse = Some((from.into(), to.into()));
    }

    fn own_weights(&mut self) {
        self.reuse = None;
    }

    /// An intermediate value of the given dtype.
    pub fn activation(&mut self, name: &str, shape: &[u64], dtype: Dtype) -> String {
        self.tensor(name, shape, dtype, TensorKind::Activation)
    }

    /// The shape of a declared tensor.
    pub fn shape(&self, name: &str) -> Option<&[u64]> {
        self.tensor_names.get(name).map(|&i| self.tensors[i].shape.as_slice())
    }

    /// Append an operation. Inputs and outputs must already be declared.
    #[allow(clippy::too_many_arguments, reason = "mirrors the WIT operation record field by field")]
    pub fn op(
        &mut self,
        name: &str,
        kind: OpKind,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<Attribute>,
        layer: i32,
        role: ParallelRole,
    ) {
        if !self.op_names.insert(name.to_string()) && self.error.is_none() {
            self.error = Some(format!("operation '{name}' declared twice"));
        }
        for t in inputs.iter().chain(outputs) {
            if !self.tensor_names.contains_key(*t) && self.error.is_none() {
                self.error = Some(format!("operation '{name}' uses undeclared tensor '{t}'"));
            }
        }
        self.ops.push(Operation {
            name: name.into(),
            kind,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            attrs,
            layer,
            role,
        });
    }

    /// An op with one bf16 activation output named like the op; returns the output name.
    #[allow(clippy::too_many_arguments, reason = "one call declares output and op together")]
    pub fn unary(
        &mut self,
        name: &str,
        kind: OpKind,
        inputs: &[&str],
        out_shape: &[u64],
        attrs: Vec<Attribute>,
        layer: i32,
        role: ParallelRole,
    ) -> String {
        let out = self.activation(name, out_shape, Dtype::Bf16);
        self.op(name, kind, inputs, &[&out], attrs, layer, role);
        out
    }

    /// `linear` op `name` over `x` (last axis K) with weight `name.weight` (N,K) and, if
    /// `bias`, `name.bias` (N). The output is declared as `out_shape`, whose element count
    /// must be rows(x) * N.
    #[allow(clippy::too_many_arguments, reason = "a linear has exactly these choices")]
    pub fn linear(
        &mut self,
        name: &str,
        x: &str,
        n: u64,
        out_shape: &[u64],
        bias: bool,
        layer: i32,
        role: ParallelRole,
    ) -> String {
        let k = self.shape(x).and_then(|s| s.last().copied()).unwrap_or(0);
        self.linear_kn(name, x, k, n, out_shape, bias, layer, role)
    }

    /// [`GraphBuilder::linear`] with an explicit input width K, for inputs declared as a
    /// multi-axis view (the attention output (B,T,H,Dv) feeds a K = H*Dv projection).
    #[allow(clippy::too_many_arguments, reason = "a linear has exactly these choices")]
    pub fn linear_kn(
        &mut self,
        name: &str,
        x: &str,
        k: u64,
        n: u64,
        out_shape: &[u64],
        bias: bool,
        layer: i32,
        role: ParallelRole,
    ) -> String {
        let w = self.weight(&format!("{name}.weight"), &[n, k]);
        self.linear_with(name, x, &w, out_shape, bias, layer, role)
    }

    /// `linear` op with an existing weight (tied embeddings, shared MTP head).
    #[allow(clippy::too_many_arguments, reason = "a linear has exactly these choices")]
    pub fn linear_with(
        &mut self,
        name: &str,
        x: &str,
        w: &str,
        out_shape: &[u64],
        bias: bool,
        layer: i32,
        role: ParallelRole,
    ) -> String {
        let n = self.shape(w).and_then(|s| s.first().copied()).unwrap_or(0);
        let mut inputs = vec![x.to_string(), w.to_string()];
        if bias {
            inputs.push(self.weight(&format!("{name}.bias"), &[n]));
        }
        let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        self.unary(name, OpKind::Linear, &refs, out_shape, vec![], layer, role)
    }

    /// Normalisation `name` over the last axis of `x` (weight `name.weight`, plus
    /// `name.bias` for LayerNorm), on the residual stream (sequence-parallel).
    pub fn norm(&mut self, name: &str, x: &str, kind: NormKind, eps: f64, layer: i32) -> String {
        self.norm_as(name, x, kind, eps, layer, ParallelRole::Sequence)
    }

    /// RMSNorm `name` over the head dim of a per-head (B,T,H,D) tensor `x`, one (D) weight
    /// `name.weight` shared by every head (Qwen3's and Gemma 3's query/key norms). It is
    /// head-parallel: each tensor-parallel rank normalises the heads its column-parallel
    /// projection left it, with the whole weight, whose gradient the host sums over tp.
    pub fn head_norm(&mut self, name: &str, x: &str, eps: f64, layer: i32) -> String {
        self.norm_as(name, x, NormKind::RmsNorm, eps, layer, ParallelRole::HeadParallel)
    }

    fn norm_as(&mut self, name: &str, x: &str, kind: NormKind, eps: f64, layer: i32, role: ParallelRole) -> String {
        let shape = self.shape(x).unwrap_or(&[]).to_vec();
        let c = shape.last().copied().unwrap_or(0);
        let w = self.weight(&format!("{name}.weight"), &[c]);
        let (op, inputs) = match kind {
            NormKind::RmsNorm => (OpKind::RmsNorm, vec![x.to_string(), w]),
            NormKind::LayerNorm => {
                let b = self.weight(&format!("{name}.bias"), &[c]);
                (OpKind::LayerNorm, vec![x.to_string(), w, b])
            }
        };
        let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        self.unary(name, op, &refs, &shape, vec![float("eps", eps)], layer, role)
    }

    /// Residual (or any elementwise) sum of two same-shaped tensors.
    pub fn add(&mut self, name: &str, a: &str, b: &str, layer: i32, role: ParallelRole) -> String {
        let shape = self.shape(a).unwrap_or(&[]).to_vec();
        self.unary(name, OpKind::Add, &[a, b], &shape, vec![], layer, role)
    }

    /// Finish the graph with `loss` as its scalar objective.
    ///
    /// # Errors
    /// The first duplicate or undeclared name met while building.
    pub fn finish(self, loss: &str) -> Result<Graph, String> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if !self.tensor_names.contains_key(loss) {
            return Err(format!("loss tensor '{loss}' is not declared"));
        }
        Ok(Graph { tensors: self.tensors, operations: self.ops, loss: loss.into() })
    }
}

// ------------------------------------------------------------------------------------
// Tables: hyperparameters, defaults, layouts, variants
// ------------------------------------------------------------------------------------

/// A dense decoder with the Llama conventions (RoPE, RMSNorm, SwiGLU, no biases, untied
/// embeddings, head dim = hidden / heads, MHA when kv-heads == heads else GQA). Families
/// override fields with struct-update syntax: `Hyperparameters { bias: true, ..decoder(..) }`.
pub fn decoder(layers: u32, hidden: u32, ffn: u32, heads: u32, kv_heads: u32, vocab: u32) -> Hyperparameters {
    Hyperparameters {
        layers,
        hidden,
        ffn,
        heads,
        kv_heads,
        head_dim: hidden.checked_div(heads).unwrap_or(0),
        vocab,
        tied_embeddings: false,
        position: PositionScheme::Rope,
        rope_theta: 10_000.0,
        max_position: 8192,
        norm: NormKind::RmsNorm,
        norm_eps: 1e-5,
        activation: ActivationKind::Swiglu,
        attention: if kv_heads == heads { AttentionKind::Mha } else { AttentionKind::Gqa },
        mla: None,
        moe: None,
        attention_window: 0,
        window_every: 0,
        bias: false,
        mtp_depth: 0,
        mamba: None,
        layer_pattern: String::new(),
    }
}

/// A routed-experts block: `experts` of width `expert_ffn`, `top_k` per token, softmax
/// scores renormalised over the top-k, no shared experts, MoE in every layer.
pub fn moe(experts: u32, top_k: u32, expert_ffn: u32) -> MoeConfig {
    MoeConfig {
        experts,
        top_k,
        shared_experts: 0,
        expert_ffn,
        shared_ffn: 0,
        dense_layers: 0,
        layer_frequency: 1,
        score: RouterScore::Softmax,
        normalize_top_k: true,
        latent: 0,
    }
}

/// Pretraining defaults: AdamW with weight decay 0.1.
pub fn defaults(seq_len: u32, tokens: f64, learning_rate: f64) -> TrainingDefaults {
    TrainingDefaults { seq_len, tokens, optimizer: "adamw".into(), learning_rate, weight_decay: 0.1 }
}

/// Shorthand for a [`ReferenceLayout`]: every parallel degree defaults to 1 (FSDP and EP
/// to off), MBS to 1, no recompute, sequence parallelism, distributed optimizer or overlap,
/// the variant's sequence length, no published measurement, and GBS to one sequence per
/// GPU until `gbs_per_gpu`/`gbs_fixed` say.
///
/// ```ignore
/// Layout::new("H100", 64, 2048, "FP8").tp(4).pp(8).vp(5).gbs_per_gpu(2.0).source("...")
/// ```
#[derive(Clone)]
pub struct Layout(pub ReferenceLayout);

impl Layout {
    /// `precision` is the name the recipe publishes (`BF16`, `FP8`, `FP8-CS`, `MXFP8`,
    /// `NVFP4`; see [`training_precision`]).
    ///
    /// # Panics
    /// On a precision name the contract does not know: a typo in a plugin's table, which
    /// its first unit test (any call of `describe`) reports.
    pub fn new(gpu: &str, gpus_min: u32, gpus_max: u32, precision: &str) -> Layout {
        let precision = training_precision(precision).unwrap_or_else(|| {
            panic!("unknown training precision '{precision}': use one of {}", runner_contract::workload::TRAINING_PRECISION_NAMES)
        });
        Layout(reference_layout(gpu, gpus_min, gpus_max, precision))
    }
    /// Megatron sequence parallelism over the tp group.
    pub fn sp(mut self) -> Self {
        self.0.sequence_parallel = true;
        self
    }
    pub fn recompute(mut self, granularity: RecomputeGranularity, layers: u32) -> Self {
        self.0.recompute = granularity;
        self.0.recompute_layers = layers;
        self
    }
    /// The distributed optimizer with gradient reduce and parameter gather overlapped.
    pub fn distributed_optimizer(mut self) -> Self {
        self.0.distributed_optimizer = true;
        self.0.overlap_grad_reduce = true;
        self.0.overlap_param_gather = true;
        self
    }
    pub fn seq_len(mut self, v: u32) -> Self {
        self.0.seq_len = v;
        self
    }
    /// What the published run measured with this layout.
    pub fn measured(mut self, m: super::PublishedMeasurement) -> Self {
        self.0.measured = Some(m);
        self
    }
    pub fn tp(mut self, v: u32) -> Self {
        self.0.tp = v;
        self
    }
    pub fn pp(mut self, v: u32) -> Self {
        self.0.pp = v;
        self
    }
    pub fn cp(mut self, v: u32) -> Self {
        self.0.cp = v;
        self
    }
    pub fn vp(mut self, v: u32) -> Self {
        self.0.vp = v;
        self
    }
    pub fn ep(mut self, v: u32) -> Self {
        self.0.ep = v;
        self
    }
    pub fn etp(mut self, v: u32) -> Self {
        self.0.etp = v;
        self
    }
    /// FSDP sharding group size (0: off).
    pub fn fsdp(mut self, v: u32) -> Self {
        self.0.fsdp = v;
        self
    }
    pub fn mbs(mut self, v: u32) -> Self {
        self.0.mbs = v;
        self
    }
    /// GBS grows with the GPU count: GBS = per_gpu * GPUs.
    pub fn gbs_per_gpu(mut self, per_gpu: f64) -> Self {
        self.0.gbs_per_gpu = per_gpu;
        self.0.gbs_fixed = 0;
        self
    }
    /// GBS is fixed whatever the GPU count.
    pub fn gbs_fixed(mut self, gbs: u32) -> Self {
        self.0.gbs_per_gpu = 0.0;
        self.0.gbs_fixed = gbs;
        self
    }
    /// Where the layout was published (repo@commit file, table).
    pub fn source(mut self, s: &str) -> Self {
        self.0.source = s.into();
        self
    }
}

/// One row of a family's table.
pub fn variant(
    name: &str,
    family: &str,
    citation: &str,
    hyper: Hyperparameters,
    defaults: TrainingDefaults,
    layouts: impl IntoIterator<Item = Layout>,
) -> Variant {
    Variant {
        name: name.into(),
        family: family.into(),
        citation: citation.into(),
        hyper,
        defaults,
        layouts: layouts.into_iter().map(|l| l.0).collect(),
    }
}

/// The variant called `name`.
///
/// # Errors
/// Names the unknown variant and lists the ones this family has.
pub fn find_variant<'a>(info: &'a ModelInfo, name: &str) -> Result<&'a Variant, String> {
    info.variants.iter().find(|v| v.name == name).ok_or_else(|| {
        let known: Vec<&str> = info.variants.iter().map(|v| v.name.as_str()).collect();
        format!("unknown {} variant '{name}'; known variants: {}", info.family, known.join(", "))
    })
}

/// The forward graph for `request` against a family's table: what a plugin's `graph`
/// export returns.
///
/// # Errors
/// Unknown variant, or a request the variant cannot satisfy (see [`transformer_graph`]).
pub fn graph_for(info: &ModelInfo, request: &GraphRequest) -> Result<Graph, String> {
    graph_for_with(info, request, GraphOptions::default())
}

/// [`graph_for`] with the family's [`GraphOptions`].
///
/// # Errors
/// As [`transformer_graph_with`].
pub fn graph_for_with(info: &ModelInfo, request: &GraphRequest, options: GraphOptions) -> Result<Graph, String> {
    let v = find_variant(info, &request.variant)?;
    transformer_graph_with(&v.hyper, request, options).map_err(|e| format!("{}: {e}", v.name))
}

/// Architecture choices a family's plugin knows and the contract's `hyperparameters`
/// record does not carry (a field there would change the WIT contract and bump its
/// version). The default builds the graph the hyperparameters alone describe; a plugin
/// passes its family's choices to [`graph_for_with`] for every variant it lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphOptions {
    /// How the multi-token-prediction modules hold their weights.
    pub mtp_weights: MtpWeights,
    /// An RMSNorm over each query and key head (its own (D) weight for q and for k, shared
    /// by the heads) after the projections and before RoPE: `{p}.attn.q_norm` and
    /// `{p}.attn.k_norm`, with the model's `norm-eps`. Qwen3 (Hugging Face
    /// `Qwen3Attention.q_norm`/`k_norm`, `Qwen3RMSNorm(head_dim)`) and Gemma 3 have them.
    /// MHA/GQA attention only: MLA normalises its latents instead, and is refused.
    pub qk_norm: bool,
}

impl Default for GraphOptions {
    /// Per-module MTP weights, no query/key norms.
    fn default() -> Self {
        GraphOptions { mtp_weights: MtpWeights::PerModule, qk_norm: false }
    }
}

/// How the `mtp-depth` multi-token-prediction modules hold their weights. The contract
/// says only how many there are; the family's plugin knows which kind it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MtpWeights {
    /// Each depth has its own module (DeepSeek-V3 §2.2).
    PerModule,
    /// One module, applied at every depth (Megatron's `mtp_use_repeated_layer`; Nemotron
    /// 3 Super trains one `*E` module twice): every depth computes, the weights count once.
    Repeated,
}

// ------------------------------------------------------------------------------------
// The decoder graph
// ------------------------------------------------------------------------------------

/// Whether transformer layer `i` uses the routed-experts MLP. With a layer pattern: the
/// layers marked `E`. Otherwise dense leading layers first; then every `layer-frequency`-th
/// layer, counting so that the last of each group is MoE (frequency 2 gives layers 1, 3,
/// 5, ... as in Llama 4's `interleave_moe_layer_step`).
pub fn is_moe_layer(hyper: &Hyperparameters, i: u32) -> bool {
    if !hyper.layer_pattern.is_empty() {
        return hyper.moe.is_some() && hyper.layer_pattern.as_bytes().get(i as usize) == Some(&b'E');
    }
    match &hyper.moe {
        None => false,
        Some(m) => {
            let f = m.layer_frequency.max(1);
            i >= m.dense_layers && (i - m.dense_layers + 1).is_multiple_of(f)
        }
    }
}

/// Whether transformer layer `i` uses the sliding window (every `window-every`-th layer,
/// starting at layer 0).
pub fn is_window_layer(hyper: &Hyperparameters, i: u32) -> bool {
    hyper.attention_window > 0 && hyper.window_every > 0 && i.is_multiple_of(hyper.window_every)
}

/// The full logical forward graph of a decoder-only transformer.
///
/// Layout: `embed` (+ `pos_embed`, `embed.add` for learned positions), then per layer
/// `layers.{i}.attn_norm`, attention (`.attn.*`), `.residual1`, `.mlp_norm`, the MLP
/// (`.mlp.*`) or routed experts (`.moe.*`), `.residual2`; then `final_norm`, `lm_head`,
/// `loss`. With a `layer-pattern`, layer i is the single block its character names
/// (Mamba-2 mixer, attention, MLP or MoE; see `hybrid.rs`), and a partial request builds
/// the pattern's first `layers` characters. Multi-token-prediction modules (`mtp.{j}.*`,
/// layer = layers + j) follow when the request builds every layer, and their losses are
/// added to the main loss.
///
/// # Errors
/// Zero sequence length or micro-batch, more layers requested than the model has, a
/// sequence longer than a learned position table, a layer pattern the builder cannot
/// build, or inconsistent hyperparameters.
pub fn transformer_graph(hyper: &Hyperparameters, request: &GraphRequest) -> Result<Graph, String> {
    transformer_graph_with(hyper, request, GraphOptions::default())
}

/// [`transformer_graph`] with the family's [`GraphOptions`].
///
/// # Errors
/// As [`transformer_graph`], and query/key norms asked of MLA attention.
pub fn transformer_graph_with(hyper: &Hyperparameters, request: &GraphRequest, options: GraphOptions) -> Result<Graph, String> {
    validate_hyperparameters(hyper)?;
    if options.qk_norm && hyper.attention == AttentionKind::Mla {
        return Err("qk-norm normalises MHA/GQA query and key heads; MLA attention normalises its latents instead".into());
    }
    if !matches!(request.phase, Phase::Training) {
        return Err("only training graphs are built so far (the inference phases are reserved)".into());
    }
    if request.seq_len == 0 {
        return Err("seq-len must be positive".into());
    }
    if request.micro_batch == 0 {
        return Err("micro-batch must be positive".into());
    }
    if request.layers > hyper.layers {
        return Err(format!("requested {} layers but the model has {}", request.layers, hyper.layers));
    }
    if hyper.position == PositionScheme::Learned && request.seq_len > hyper.max_position {
        return Err(format!(
            "seq-len {} exceeds the learned position table ({} positions)",
            request.seq_len, hyper.max_position
        ));
    }
    let stack = hybrid::stack(hyper)?;
    let layers = if request.layers == 0 { hyper.layers } else { request.layers };
    let d = Dims { b: u64::from(request.micro_batch), t: u64::from(request.seq_len), c: u64::from(hyper.hidden), qk_norm: options.qk_norm };
    let mut g = GraphBuilder::new();
    let tokens = g.input("tokens", &[d.b, d.t], Dtype::Int32);
    let targets = g.input("targets", &[d.b, d.t], Dtype::Int32);

    let table = g.weight("embed.weight", &[u64::from(hyper.vocab), d.c]);
    let mut x = g.unary(
        "embed",
        OpKind::Embedding,
        &[&tokens, &table],
        &[d.b, d.t, d.c],
        vec![],
        OUTSIDE,
        ParallelRole::VocabParallel,
    );
    if hyper.position == PositionScheme::Learned {
        let positions = g.input("positions", &[d.b, d.t], Dtype::Int32);
        let pos_table = g.weight("pos_embed.weight", &[u64::from(hyper.max_position), d.c]);
        let p = g.unary(
            "pos_embed",
            OpKind::Embedding,
            &[&positions, &pos_table],
            &[d.b, d.t, d.c],
            vec![],
            OUTSIDE,
            ParallelRole::Replicated,
        );
        x = g.add("embed.add", &x, &p, OUTSIDE, ParallelRole::Sequence);
    }
    for (i, &kind) in (0..layers).zip(&stack) {
        x = hybrid::layer(&mut g, hyper, &d, &format!("layers.{i}"), i, &x, kind);
    }
    let main_hidden = x.clone();
    let normed = g.norm("final_norm", &x, hyper.norm, hyper.norm_eps, OUTSIDE);
    let head = head_weight(&mut g, hyper, d.c);
    let logits =
        g.linear_with("lm_head", &normed, &head, &[d.b, d.t, u64::from(hyper.vocab)], false, OUTSIDE, ParallelRole::VocabParallel);
    let mtp = if request.layers == 0 { hyper.mtp_depth } else { 0 };
    let main_loss = if mtp == 0 { "loss" } else { "loss.lm" };
    let mut loss = g.activation(main_loss, &[], Dtype::Fp32);
    g.op("loss", OpKind::CrossEntropy, &[&logits, &targets], &[&loss], vec![], OUTSIDE, ParallelRole::VocabParallel);

    // DeepSeek-V3 §2.2: module j combines the previous depth's hidden state with the
    // embedding of the token j+1 ahead (RMSNorm both, concatenate, project 2C -> C), runs
    // one transformer block and predicts with the shared head. Embedding and head weights
    // are shared with the main model, so the module adds only norms, projection and block.
    let mut h = main_hidden;
    for j in 0..mtp {
        let p = format!("mtp.{j}");
        let layer = (layers + j) as i32;
        if options.mtp_weights == MtpWeights::Repeated && j > 0 {
            g.reuse_weights(&format!("{p}."), "mtp.0.");
        }
        let tok = g.input(&format!("{p}.tokens"), &[d.b, d.t], Dtype::Int32);
        let tgt = g.input(&format!("{p}.targets"), &[d.b, d.t], Dtype::Int32);
        let emb = g.unary(
            &format!("{p}.embed"),
            OpKind::Embedding,
            &[&tok, &table],
            &[d.b, d.t, d.c],
            vec![],
            layer,
            ParallelRole::VocabParallel,
        );
        let en = g.norm(&format!("{p}.enorm"), &emb, hyper.norm, hyper.norm_eps, layer);
        let hn = g.norm(&format!("{p}.hnorm"), &h, hyper.norm, hyper.norm_eps, layer);
        let cat = g.unary(
            &format!("{p}.concat"),
            OpKind::Concat,
            &[&hn, &en],
            &[d.b, d.t, 2 * d.c],
            vec![],
            layer,
            ParallelRole::Sequence,
        );
        let proj =
            g.linear(&format!("{p}.eh_proj"), &cat, d.c, &[d.b, d.t, d.c], false, layer, ParallelRole::ColumnParallel);
        // A hybrid model's MTP module is one attention and one MoE (or MLP) layer
        // (Nemotron 3 Super's `mtp_hybrid_override_pattern` "*E"): the classic block
        // with the experts in it whatever the main stack's pattern says.
        let moe = if hyper.layer_pattern.is_empty() { hyper.moe.as_ref().filter(|_| is_moe_layer(hyper, layers + j)) } else { hyper.moe.as_ref() };
        h = block(&mut g, hyper, &d, &p, layers + j, &proj, moe);
        let n = g.norm(&format!("{p}.final_norm"), &h, hyper.norm, hyper.norm_eps, layer);
        g.own_weights();
        let lg = g.linear_with(
            &format!("{p}.lm_head"),
            &n,
            &head,
            &[d.b, d.t, u64::from(hyper.vocab)],
            false,
            layer,
            ParallelRole::VocabParallel,
        );
        let l = g.activation(&format!("{p}.loss"), &[], Dtype::Fp32);
        g.op(&format!("{p}.loss"), OpKind::CrossEntropy, &[&lg, &tgt], &[&l], vec![], layer, ParallelRole::VocabParallel);
        // The published recipe weights the MTP loss (lambda 0.3, later 0.1); the primitive
        // set has no scale op, and a constant factor changes no FLOP or byte count.
        let total = if j + 1 == mtp { "loss".to_string() } else { format!("{p}.loss_sum") };
        let sum = g.activation(&total, &[], Dtype::Fp32);
        g.op(&format!("{p}.loss_add"), OpKind::Add, &[&loss, &l], &[&sum], vec![], layer, ParallelRole::Replicated);
        loss = sum;
    }
    g.finish(&loss)
}

/// Batch dimensions shared by every op of one graph, and the [`GraphOptions`] the layers'
/// builders read.
struct Dims {
    b: u64,
    t: u64,
    c: u64,
    /// [`GraphOptions::qk_norm`].
    qk_norm: bool,
}

/// The lm-head weight: the embedding table when tied, else its own (V,C) matrix.
fn head_weight(g: &mut GraphBuilder, hyper: &Hyperparameters, c: u64) -> String {
    if hyper.tied_embeddings {
        "embed.weight".into()
    } else {
        g.weight("lm_head.weight", &[u64::from(hyper.vocab), c])
    }
}

/// One pre-norm transformer block named `p` (e.g. `layers.3`): self-attention, then the
/// routed experts of `moe` or, without it, the dense MLP; returns the block output.
#[allow(clippy::too_many_arguments, reason = "the block's place in the graph and its MLP choice")]
fn block(g: &mut GraphBuilder, h: &Hyperparameters, d: &Dims, p: &str, i: u32, x: &str, moe: Option<&MoeConfig>) -> String {
    let layer = i as i32;
    let n1 = g.norm(&format!("{p}.attn_norm"), x, h.norm, h.norm_eps, layer);
    let a = self_attention(g, h, d, p, i, &n1);
    let r1 = g.add(&format!("{p}.residual1"), x, &a, layer, ParallelRole::Sequence);
    let n2 = g.norm(&format!("{p}.mlp_norm"), &r1, h.norm, h.norm_eps, layer);
    let m = match moe {
        Some(cfg) => moe_mlp(g, h, cfg, d, p, layer, &n2),
        None => mlp(g, h, d, &format!("{p}.mlp"), u64::from(h.ffn), layer, &n2),
    };
    g.add(&format!("{p}.residual2"), &r1, &m, layer, ParallelRole::Sequence)
}

/// The layer's attention (MLA when configured, else MHA/GQA) over the normalised `x`.
fn self_attention(g: &mut GraphBuilder, h: &Hyperparameters, d: &Dims, p: &str, i: u32, x: &str) -> String {
    match &h.mla {
        Some(mla) if h.attention == AttentionKind::Mla => mla_attention(g, h, mla, d, p, i, x),
        _ => attention(g, h, d, p, i, x),
    }
}

/// The attention-core attributes: causal, the window of this layer, and 1/sqrt(qk dim).
fn core_attrs(h: &Hyperparameters, i: u32, qk_dim: u32) -> Vec<Attribute> {
    let window = if is_window_layer(h, i) { h.attention_window } else { 0 };
    vec![
        flag("causal", true),
        int("window", i64::from(window)),
        float("scale", 1.0 / f64::from(qk_dim).sqrt()),
    ]
}

/// MHA/GQA attention: q/k/v projections declared per head, the optional per-head q/k
/// norms, RoPE, core, output projection.
fn attention(g: &mut GraphBuilder, h: &Hyperparameters, d: &Dims, p: &str, i: u32, x: &str) -> String {
    let layer = i as i32;
    let (hq, hkv, hd) = (u64::from(h.heads), u64::from(h.kv_heads), u64::from(h.head_dim));
    let col = ParallelRole::ColumnParallel;
    let mut q = g.linear(&format!("{p}.attn.q"), x, hq * hd, &[d.b, d.t, hq, hd], h.bias, layer, col);
    let mut k = g.linear(&format!("{p}.attn.k"), x, hkv * hd, &[d.b, d.t, hkv, hd], h.bias, layer, col);
    let v = g.linear(&format!("{p}.attn.v"), x, hkv * hd, &[d.b, d.t, hkv, hd], h.bias, layer, col);
    if d.qk_norm {
        // Hugging Face Qwen3Attention.forward: q_norm(q_proj(x).view(.., head_dim)), the
        // same for k, then RoPE; v is not normalised.
        q = g.head_norm(&format!("{p}.attn.q_norm"), &q, h.norm_eps, layer);
        k = g.head_norm(&format!("{p}.attn.k_norm"), &k, h.norm_eps, layer);
    }
    if h.position == PositionScheme::Rope {
        q = rotary(g, h, &format!("{p}.attn.q_rope"), &q, h.head_dim, layer);
        k = rotary(g, h, &format!("{p}.attn.k_rope"), &k, h.head_dim, layer);
    }
    let core = g.unary(
        &format!("{p}.attn.core"),
        OpKind::Attention,
        &[&q, &k, &v],
        &[d.b, d.t, hq, hd],
        core_attrs(h, i, h.head_dim),
        layer,
        ParallelRole::HeadParallel,
    );
    g.linear_kn(&format!("{p}.attn.out"), &core, hq * hd, d.c, &[d.b, d.t, d.c], h.bias, layer, ParallelRole::RowParallel)
}

fn rotary(g: &mut GraphBuilder, h: &Hyperparameters, name: &str, x: &str, rot_dim: u32, layer: i32) -> String {
    let shape = g.shape(x).unwrap_or(&[]).to_vec();
    g.unary(
        name,
        OpKind::Rotary,
        &[x],
        &shape,
        vec![float("theta", h.rope_theta), int("rot-dim", i64::from(rot_dim))],
        layer,
        ParallelRole::HeadParallel,
    )
}

/// Multi-head latent attention (DeepSeek-V2/V3). The fused projections of the reference
/// implementation (q_b -> [q_nope | q_pe], kv_a -> [latent | k_pe], kv_b -> [k_nope | v])
/// are split into one linear per output so no slicing primitive is needed; the parameter
/// and FLOP counts are identical.
fn mla_attention(
    g: &mut GraphBuilder,
    h: &Hyperparameters,
    m: &MlaConfig,
    d: &Dims,
    p: &str,
    i: u32,
    x: &str,
) -> String {
    let layer = i as i32;
    let col = ParallelRole::ColumnParallel;
    let (b, t, hq) = (d.b, d.t, u64::from(h.heads));
    let (nope, rope, vd) = (u64::from(m.qk_nope_head_dim), u64::from(m.qk_rope_head_dim), u64::from(m.v_head_dim));
    // Query: optionally through a low-rank latent (q_a, normalised), then per-head parts.
    let q_src = if m.q_lora_rank > 0 {
        // The down-projections see the whole hidden state and are not split across TP ranks.
        let qa = g.linear(&format!("{p}.attn.q_a"), x, u64::from(m.q_lora_rank), &[b, t, u64::from(m.q_lora_rank)], false, layer, ParallelRole::Replicated);
        g.norm(&format!("{p}.attn.q_a_norm"), &qa, NormKind::RmsNorm, h.norm_eps, layer)
    } else {
        x.to_string()
    };
    let q_nope = g.linear(&format!("{p}.attn.q"), &q_src, hq * nope, &[b, t, hq, nope], false, layer, col);
    let q_pe = g.linear(&format!("{p}.attn.q_pe"), &q_src, hq * rope, &[b, t, hq, rope], false, layer, col);
    let q_rot = rotary(g, h, &format!("{p}.attn.q_rope"), &q_pe, m.qk_rope_head_dim, layer);
    let q = g.unary(&format!("{p}.attn.q_cat"), OpKind::Concat, &[&q_nope, &q_rot], &[b, t, hq, nope + rope], vec![], layer, ParallelRole::HeadParallel);
    // Key/value: a compressed latent shared by all heads plus one decoupled RoPE key.
    let kv_rank = u64::from(m.kv_lora_rank);
    let kv_a = g.linear(&format!("{p}.attn.kv_a"), x, kv_rank, &[b, t, kv_rank], false, layer, ParallelRole::Replicated);
    let k_pe = g.linear(&format!("{p}.attn.k_rope_proj"), x, rope, &[b, t, 1, rope], false, layer, ParallelRole::Replicated);
    let k_rot = rotary(g, h, &format!("{p}.attn.k_rope"), &k_pe, m.qk_rope_head_dim, layer);
    let kv = g.norm(&format!("{p}.attn.kv_norm"), &kv_a, NormKind::RmsNorm, h.norm_eps, layer);
    let k_nope = g.linear(&format!("{p}.attn.k_nope"), &kv, hq * nope, &[b, t, hq, nope], false, layer, col);
    let v = g.linear(&format!("{p}.attn.v"), &kv, hq * vd, &[b, t, hq, vd], false, layer, col);
    let k = g.unary(&format!("{p}.attn.k_cat"), OpKind::Concat, &[&k_nope, &k_rot], &[b, t, hq, nope + rope], vec![], layer, ParallelRole::HeadParallel);
    let core = g.unary(
        &format!("{p}.attn.core"),
        OpKind::Attention,
        &[&q, &k, &v],
        &[b, t, hq, vd],
        core_attrs(h, i, m.qk_nope_head_dim + m.qk_rope_head_dim),
        layer,
        ParallelRole::HeadParallel,
    );
    g.linear_kn(&format!("{p}.attn.out"), &core, hq * vd, d.c, &[b, t, d.c], false, layer, ParallelRole::RowParallel)
}

/// A dense MLP named `p` (`{p}.gate/up/act/down`) of width `f`. Gated activations use a
/// gate and an up projection; GeLU and squared-ReLU use the up projection alone.
fn mlp(g: &mut GraphBuilder, h: &Hyperparameters, d: &Dims, p: &str, f: u64, layer: i32, x: &str) -> String {
    let col = ParallelRole::ColumnParallel;
    let rows = [d.b, d.t, f];
    let act = match h.activation {
        ActivationKind::Swiglu | ActivationKind::Geglu => {
            let gate = g.linear(&format!("{p}.gate"), x, f, &rows, h.bias, layer, col);
            let up = g.linear(&format!("{p}.up"), x, f, &rows, h.bias, layer, col);
            g.unary(&format!("{p}.act"), act_kind(h.activation), &[&gate, &up], &rows, vec![], layer, col)
        }
        ActivationKind::Gelu | ActivationKind::SquaredRelu => {
            let up = g.linear(&format!("{p}.up"), x, f, &rows, h.bias, layer, col);
            g.unary(&format!("{p}.act"), act_kind(h.activation), &[&up], &rows, vec![], layer, col)
        }
    };
    g.linear(&format!("{p}.down"), &act, d.c, &[d.b, d.t, d.c], h.bias, layer, ParallelRole::RowParallel)
}

fn act_kind(a: ActivationKind) -> OpKind {
    match a {
        ActivationKind::Swiglu => OpKind::Swiglu,
        ActivationKind::Geglu => OpKind::Geglu,
        ActivationKind::Gelu => OpKind::Gelu,
        ActivationKind::SquaredRelu => OpKind::SquaredRelu,
    }
}

/// Routed experts (+ shared experts) for one layer named `p`.
///
/// router_logits (N,E) -> router -> weights/indices (N,k); dispatch sorts the k copies of
/// every token by expert into (N*k, C); the experts run as grouped linears over (E, out, in)
/// weights; combine scatters back and sums with the router weights into (B,T,C).
///
/// LatentMoE (`latent` L > 0, Nemotron 3 Super): the router and the shared experts still
/// read the hidden state, but the routed experts run at width L: `fc1_latent_proj` (C -> L)
/// before dispatch, so the all-to-all carries L-wide tokens, and `fc2_latent_proj` (L -> C)
/// after combine. Megatron-LM builds both as `TELinear(parallel_mode="duplicated")`: whole
/// on every tensor-parallel rank, hence `Replicated` (megatron/core/transformer/moe/
/// moe_layer.py@0011998, `MoELayer.__init__`, `router_and_preprocess`, `combine`).
fn moe_mlp(
    g: &mut GraphBuilder,
    h: &Hyperparameters,
    m: &MoeConfig,
    d: &Dims,
    p: &str,
    layer: i32,
    x: &str,
) -> String {
    let (e, k, f) = (u64::from(m.experts), u64::from(m.top_k), u64::from(m.expert_ffn));
    let n = d.b * d.t;
    let ex = ParallelRole::Expert;
    let logits = g.linear(&format!("{p}.moe.router_logits"), x, e, &[d.b, d.t, e], h.bias, layer, ParallelRole::Replicated);
    // The width the routed experts run at, and their input at that width.
    let (w, routed_in) = if m.latent > 0 {
        let l = u64::from(m.latent);
        let down = g.linear(&format!("{p}.moe.fc1_latent_proj"), x, l, &[d.b, d.t, l], h.bias, layer, ParallelRole::Replicated);
        (l, down)
    } else {
        (d.c, x.to_string())
    };
    let weights = g.activation(&format!("{p}.moe.router.weights"), &[n, k], Dtype::Fp32);
    let indices = g.activation(&format!("{p}.moe.router.indices"), &[n, k], Dtype::Int32);
    let score = match m.score {
        RouterScore::Softmax => "softmax",
        RouterScore::Sigmoid => "sigmoid",
    };
    g.op(
        &format!("{p}.moe.router"),
        OpKind::Router,
        &[&logits],
        &[&weights, &indices],
        vec![int("top-k", i64::from(m.top_k)), text("score", score), flag("normalize", m.normalize_top_k)],
        layer,
        ParallelRole::Replicated,
    );
    let sorted = g.unary(
        &format!("{p}.moe.dispatch"),
        OpKind::MoeDispatch,
        &[&routed_in, &indices],
        &[n * k, w],
        vec![int("experts", i64::from(m.experts))],
        layer,
        ex,
    );
    let grouped = |g: &mut GraphBuilder, name: &str, input: &str, out: u64, inp: u64| -> String {
        let w = g.weight(&format!("{p}.moe.experts.{name}.weight"), &[e, out, inp]);
        g.unary(&format!("{p}.moe.experts.{name}"), OpKind::GroupedLinear, &[input, &w, &indices], &[n * k, out], vec![], layer, ex)
    };
    let act = match h.activation {
        ActivationKind::Swiglu | ActivationKind::Geglu => {
            let gate = grouped(g, "gate", &sorted, f, w);
            let up = grouped(g, "up", &sorted, f, w);
            g.unary(&format!("{p}.moe.experts.act"), act_kind(h.activation), &[&gate, &up], &[n * k, f], vec![], layer, ex)
        }
        ActivationKind::Gelu | ActivationKind::SquaredRelu => {
            let up = grouped(g, "up", &sorted, f, w);
            g.unary(&format!("{p}.moe.experts.act"), act_kind(h.activation), &[&up], &[n * k, f], vec![], layer, ex)
        }
    };
    let down = grouped(g, "down", &act, w, f);
    let mut combined = g.unary(
        &format!("{p}.moe.combine"),
        OpKind::MoeCombine,
        &[&down, &weights, &indices],
        &[d.b, d.t, w],
        vec![],
        layer,
        ex,
    );
    if m.latent > 0 {
        combined = g.linear(&format!("{p}.moe.fc2_latent_proj"), &combined, d.c, &[d.b, d.t, d.c], h.bias, layer, ParallelRole::Replicated);
    }
    let shared_ffn = if m.shared_ffn > 0 { m.shared_ffn } else { m.shared_experts * m.expert_ffn };
    if shared_ffn == 0 {
        return combined;
    }
    let s = mlp(g, h, d, &format!("{p}.moe.shared"), u64::from(shared_ffn), layer, x);
    g.add(&format!("{p}.moe.out"), &combined, &s, layer, ParallelRole::Sequence)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn req(seq: u32, mb: u32, layers: u32) -> GraphRequest {
        GraphRequest { variant: "t".into(), seq_len: seq, micro_batch: mb, layers, phase: Phase::Training }
    }

    fn weights(g: &Graph) -> u64 {
        g.tensors.iter().filter(|t| t.kind == TensorKind::Weight).map(|t| t.shape.iter().product::<u64>()).sum()
    }

    #[test]
    fn dense_llama_like_counts_and_names() {
        let h = decoder(2, 64, 160, 4, 2, 100);
        let g = transformer_graph(&h, &req(8, 2, 0)).unwrap();
        // embed 6400 + head 6400 + final norm 64; per layer: q 4096 + k,v 2*2048 + o 4096
        // + mlp 3*10240 + 2 norms 128 = 43,136.
        assert_eq!(weights(&g), 6400 * 2 + 64 + 2 * 43_136);
        assert!(g.operations.iter().any(|o| o.name == "layers.1.attn.q_rope"));
        assert_eq!(g.loss, "loss");
        let names: BTreeSet<_> = g.operations.iter().map(|o| &o.name).collect();
        assert_eq!(names.len(), g.operations.len());
    }

    #[test]
    fn request_errors_are_named() {
        let h = decoder(2, 64, 160, 4, 2, 100);
        assert!(transformer_graph(&h, &req(0, 1, 0)).unwrap_err().contains("seq-len"));
        assert!(transformer_graph(&h, &req(8, 0, 0)).unwrap_err().contains("micro-batch"));
        assert!(transformer_graph(&h, &req(8, 1, 3)).unwrap_err().contains("3 layers"));
        let bad = Hyperparameters { kv_heads: 3, ..h };
        assert!(transformer_graph(&bad, &req(8, 1, 0)).unwrap_err().contains("multiple of kv-heads"));
    }

    #[test]
    fn moe_frequency_and_dense_layers() {
        let mut h = decoder(6, 64, 160, 4, 4, 100);
        h.moe = Some(MoeConfig { dense_layers: 1, layer_frequency: 2, ..moe(4, 2, 32) });
        let moe_layers: Vec<u32> = (0..6).filter(|&i| is_moe_layer(&h, i)).collect();
        assert_eq!(moe_layers, vec![2, 4]);
        let g = transformer_graph(&h, &req(4, 1, 0)).unwrap();
        assert!(g.operations.iter().any(|o| o.name == "layers.2.moe.experts.down"));
        assert!(g.operations.iter().any(|o| o.name == "layers.1.mlp.down"));
    }

    /// FNV-1a over every tensor (name, shape, dtype, kind) and operation (name, kind,
    /// inputs, outputs, layer, role, attributes) of a graph, in order.
    fn fingerprint(g: &Graph) -> u64 {
        let mut s = String::new();
        for t in &g.tensors {
            s += &format!("T {} {:?} {:?} {:?}\n", t.name, t.shape, t.dtype, t.kind);
        }
        for o in &g.operations {
            s += &format!("O {} {:?} {:?} {:?} {} {:?}", o.name, o.kind, o.inputs, o.outputs, o.layer, o.role);
            for a in &o.attrs {
                s += &format!(" {}={:?}", a.key, a.value);
            }
            s += "\n";
        }
        s += &g.loss;
        s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
    }

    /// Contract 0.3 (layer patterns, Mamba-2, LatentMoE) changes no classic graph: five
    /// published shapes covering GQA + RoPE, MLA + MoE with shared experts, dense leading
    /// layers and MTP, learned positions + LayerNorm + GeLU + biases + tied embeddings,
    /// sliding windows + biased MoE, and MoE every other layer with squared-ReLU build
    /// exactly the graphs the 0.2.0 builder (commit 6a24d38) built: operation and tensor
    /// counts, weight totals and a fingerprint of every name, shape, role and attribute,
    /// all printed by that commit's builder at seq 64, micro-batch 2.
    #[test]
    fn classic_graphs_are_those_of_contract_0_2() {
        let llama = Hyperparameters { rope_theta: 500_000.0, max_position: 131_072, ..decoder(32, 4096, 14_336, 32, 8, 128_256) };
        let mla = MlaConfig { q_lora_rank: 1536, kv_lora_rank: 512, qk_nope_head_dim: 128, qk_rope_head_dim: 64, v_head_dim: 128 };
        let deepseek = Hyperparameters {
            head_dim: 192,
            max_position: 163_840,
            norm_eps: 1e-6,
            attention: AttentionKind::Mla,
            mla: Some(mla),
            moe: Some(MoeConfig { shared_experts: 1, dense_layers: 3, score: RouterScore::Sigmoid, ..moe(256, 8, 2048) }),
            mtp_depth: 1,
            ..decoder(61, 7168, 18_432, 128, 128, 129_280)
        };
        let gpt3 = Hyperparameters {
            tied_embeddings: true,
            position: PositionScheme::Learned,
            max_position: 2048,
            norm: NormKind::LayerNorm,
            activation: ActivationKind::Gelu,
            bias: true,
            ..decoder(96, 12_288, 4 * 12_288, 96, 96, 50_257)
        };
        let gptoss = Hyperparameters {
            head_dim: 64,
            rope_theta: 150_000.0,
            max_position: 131_072,
            moe: Some(moe(128, 4, 2880)),
            attention_window: 128,
            window_every: 2,
            bias: true,
            ..decoder(36, 2880, 0, 64, 8, 201_088)
        };
        let interleaved = Hyperparameters {
            head_dim: 128,
            moe: Some(MoeConfig {
                shared_experts: 1,
                layer_frequency: 2,
                score: RouterScore::Sigmoid,
                normalize_top_k: false,
                ..moe(128, 1, 8192)
            }),
            activation: ActivationKind::SquaredRelu,
            ..decoder(48, 5120, 16_384, 40, 8, 202_048)
        };
        for (name, h, ops, tensors, w, fp) in [
            ("llama3.1-8b", llama, 484, 777, 8_030_261_248, 0x87b6_7f7d_529a_6b6a_u64),
            ("deepseek-v3", deepseek, 1970, 3206, 682_636_472_320, 0xfe11_bb77_a15e_3c51),
            ("gpt3-175b", gpt3, 1158, 2701, 174_604_259_328, 0x585d_3372_912a_8db7),
            ("gpt-oss-120b", gptoss, 688, 1269, 116_789_341_248, 0x55a9_215f_6a5a_0952),
            ("interleaved-moe", interleaved, 868, 1353, 268_842_931_200, 0xac74_e979_fe9b_6158),
        ] {
            let g = transformer_graph(&h, &req(64, 2, 0)).unwrap();
            assert_eq!((g.operations.len(), g.tensors.len(), weights(&g)), (ops, tensors, w), "{name}");
            assert_eq!(fingerprint(&g), fp, "{name}: a name, shape, role or attribute changed");
        }
    }

    #[test]
    fn mtp_only_for_full_depth_and_tied_head_shared() {
        let mut h = decoder(2, 64, 160, 4, 4, 100);
        h.mtp_depth = 1;
        h.tied_embeddings = true;
        let full = transformer_graph(&h, &req(4, 1, 0)).unwrap();
        assert!(full.operations.iter().any(|o| o.name == "mtp.0.attn.core" && o.layer == 2));
        assert!(!full.tensors.iter().any(|t| t.name == "lm_head.weight"));
        let proxy = transformer_graph(&h, &req(4, 1, 2)).unwrap();
        assert!(!proxy.operations.iter().any(|o| o.name.starts_with("mtp.")));
        assert_eq!(proxy.loss, "loss");
    }

    /// The builder reports the first naming mistake at `finish` instead of panicking: a
    /// duplicate tensor, a duplicate operation, an undeclared input or output, an
    /// undeclared loss, and a reused weight declared with another shape; the first error
    /// wins over later ones.
    #[test]
    fn builder_mistakes_surface_at_finish() {
        let base = || {
            let mut g = GraphBuilder::new();
            let x = g.input("x", &[2, 4], Dtype::Int32);
            let w = g.weight("w", &[4]);
            (g, x, w)
        };
        let (mut g, ..) = base();
        g.activation("x", &[2, 4], Dtype::Bf16);
        g.op("other", OpKind::Add, &["nowhere"], &["x"], vec![], 0, ParallelRole::Sequence);
        assert_eq!(g.finish("x").unwrap_err(), "tensor 'x' declared twice");
        let (mut g, x, w) = base();
        g.unary("y", OpKind::Add, &[&x, &w], &[2, 4], vec![], 0, ParallelRole::Sequence);
        g.op("y", OpKind::Add, &[&x, &w], &["y"], vec![], 0, ParallelRole::Sequence);
        assert_eq!(g.finish("y").unwrap_err(), "operation 'y' declared twice");
        let (mut g, x, _) = base();
        g.op("a", OpKind::Add, &[&x, "ghost"], &["x"], vec![], 0, ParallelRole::Sequence);
        assert_eq!(g.finish("x").unwrap_err(), "operation 'a' uses undeclared tensor 'ghost'");
        let (mut g, x, w) = base();
        g.op("a", OpKind::Add, &[&x, &w], &["out"], vec![], 0, ParallelRole::Sequence);
        assert_eq!(g.finish("x").unwrap_err(), "operation 'a' uses undeclared tensor 'out'");
        let (g, ..) = base();
        assert_eq!(g.finish("loss").unwrap_err(), "loss tensor 'loss' is not declared");
        // Reuse: the same shape maps to the existing weight, another shape is an error.
        let (mut g, ..) = base();
        g.weight("m0.w", &[4, 4]);
        g.reuse_weights("m1.", "m0.");
        assert_eq!(g.weight("m1.w", &[4, 4]), "m0.w");
        assert_eq!(g.weight("m1.w", &[4, 2]), "m1.w");
        g.own_weights();
        assert_eq!(g.finish("x").unwrap_err(), "weight 'm1.w' should reuse 'm0.w', which is not declared as [4, 2]");
    }

    /// Every setter of [`Layout`] writes its own field (and only it), the defaults are a
    /// layout of one GPU per degree and one sequence per GPU, and GBS is either per GPU or
    /// fixed, never both.
    #[test]
    fn layout_setters_write_their_fields() {
        let base = Layout::new("H100", 8, 64, "BF16").0;
        assert_eq!((base.tp, base.pp, base.cp, base.vp, base.ep, base.etp, base.fsdp, base.mbs), (1, 1, 1, 1, 1, 1, 0, 1));
        assert_eq!((base.gbs_per_gpu, base.gbs_fixed, base.seq_len), (1.0, 0, 0));
        assert!(!base.sequence_parallel && !base.distributed_optimizer && !base.overlap_grad_reduce && !base.overlap_param_gather);
        let m = super::super::PublishedMeasurement { step_time_s: 1.5, tokens_per_s_per_gpu: 0.0, model_tflops_per_gpu: 0.0, gpus: 8, source: "s".into() };
        let l = Layout::new("H100", 8, 64, "FP8")
            .tp(2)
            .pp(3)
            .cp(4)
            .vp(5)
            .ep(6)
            .etp(7)
            .fsdp(8)
            .mbs(9)
            .sp()
            .distributed_optimizer()
            .recompute(RecomputeGranularity::Selective, 11)
            .seq_len(4096)
            .gbs_per_gpu(2.5)
            .measured(m)
            .source("src")
            .0;
        assert_eq!((l.tp, l.pp, l.cp, l.vp, l.ep, l.etp, l.fsdp, l.mbs), (2, 3, 4, 5, 6, 7, 8, 9));
        assert!(l.sequence_parallel && l.distributed_optimizer && l.overlap_grad_reduce && l.overlap_param_gather);
        assert_eq!((l.recompute, l.recompute_layers, l.seq_len), (RecomputeGranularity::Selective, 11, 4096));
        assert_eq!((l.gbs_per_gpu, l.gbs_fixed, l.source.as_str()), (2.5, 0, "src"));
        assert_eq!(l.measured.map(|m| (m.step_time_s, m.gpus)), Some((1.5, 8)));
        let fixed = Layout::new("H100", 8, 64, "BF16").gbs_per_gpu(2.0).gbs_fixed(512).0;
        assert_eq!((fixed.gbs_per_gpu, fixed.gbs_fixed), (0.0, 512));
        let per_gpu = Layout::new("H100", 8, 64, "BF16").gbs_fixed(512).gbs_per_gpu(2.0).0;
        assert_eq!((per_gpu.gbs_per_gpu, per_gpu.gbs_fixed), (2.0, 0));
        let d = defaults(4096, 1e12, 3e-4);
        assert_eq!((d.optimizer.as_str(), d.weight_decay, d.seq_len, d.learning_rate), ("adamw", 0.1, 4096, 3e-4));
    }

    /// `graph_for` builds one MTP module per depth (its own weights), `graph_for_with`
    /// `Repeated` one set of weights; a request error names the variant.
    #[test]
    fn graph_for_resolves_the_variant_and_its_mtp_weights() {
        let h = Hyperparameters { mtp_depth: 2, ..decoder(2, 64, 160, 4, 4, 100) };
        let info = ModelInfo {
            family: "fam".into(),
            variants: vec![
                variant("a", "fam", "c", decoder(2, 64, 160, 4, 4, 100), defaults(8, 1e9, 1e-4), []),
                variant("b", "fam", "c", h, defaults(8, 1e9, 1e-4), [Layout::new("H100", 8, 8, "BF16")]),
            ],
        };
        assert_eq!(info.variants[1].layouts.len(), 1);
        let mut r = req(8, 1, 0);
        r.variant = "b".into();
        let own = graph_for(&info, &r).unwrap();
        assert!(own.tensors.iter().any(|t| t.name == "mtp.1.attn.q.weight"));
        let shared = graph_for_with(&info, &r, GraphOptions { mtp_weights: MtpWeights::Repeated, ..GraphOptions::default() }).unwrap();
        assert!(!shared.tensors.iter().any(|t| t.name == "mtp.1.attn.q.weight"));
        assert!(weights(&shared) < weights(&own));
        r.seq_len = 0;
        assert_eq!(graph_for(&info, &r).unwrap_err(), "b: seq-len must be positive");
        r.variant = "zz".into();
        assert_eq!(graph_for(&info, &r).unwrap_err(), "unknown fam variant 'zz'; known variants: a, b");
    }

    /// `qk_norm` adds, in every layer (MTP modules included), one RMSNorm over the head dim
    /// of q and one of k: weight (head_dim), head-parallel, the model's eps, between the
    /// projection and RoPE (v untouched); the weights grow by 2 x head_dim a layer and
    /// nothing else changes. MLA attention refuses it.
    #[test]
    fn qk_norm_normalises_each_query_and_key_head() {
        let h = Hyperparameters { head_dim: 32, norm_eps: 1e-6, mtp_depth: 1, ..decoder(3, 64, 160, 4, 2, 100) };
        let on = GraphOptions { qk_norm: true, ..GraphOptions::default() };
        let plain = transformer_graph(&h, &req(8, 2, 0)).unwrap();
        let g = transformer_graph_with(&h, &req(8, 2, 0), on).unwrap();
        let shape = |n: &str| g.tensors.iter().find(|t| t.name == n).map(|t| t.shape.clone());
        let op = |n: &str| g.operations.iter().find(|o| o.name == n).unwrap_or_else(|| panic!("no op {n}"));
        let norms: Vec<&Operation> = g.operations.iter().filter(|o| o.name.ends_with("q_norm") || o.name.ends_with("k_norm")).collect();
        assert_eq!(norms.len(), 2 * 4, "two per layer, three layers and one MTP module");
        for p in ["layers.0", "layers.2", "mtp.0"] {
            for (x, heads) in [("q", 4), ("k", 2)] {
                let n = op(&format!("{p}.attn.{x}_norm"));
                let w = format!("{p}.attn.{x}_norm.weight");
                assert_eq!((n.kind, n.role), (OpKind::RmsNorm, ParallelRole::HeadParallel));
                assert_eq!(n.inputs, [format!("{p}.attn.{x}"), w.clone()]);
                assert!(matches!(n.attrs.as_slice(), [a] if a.key == "eps" && matches!(a.value, AttrValue::Float(e) if e == 1e-6)));
                assert_eq!(shape(&w), Some(vec![32]));
                assert_eq!(shape(&n.outputs[0]), Some(vec![2, 8, heads, 32]));
                assert_eq!(op(&format!("{p}.attn.{x}_rope")).inputs, [n.outputs[0].clone()]);
            }
            assert_eq!(op(&format!("{p}.attn.core")).inputs[2], format!("{p}.attn.v"));
        }
        assert_eq!(weights(&g), weights(&plain) + 4 * 2 * 32);
        assert_eq!((g.operations.len(), g.tensors.len()), (plain.operations.len() + 8, plain.tensors.len() + 16));
        let mla = MlaConfig { q_lora_rank: 0, kv_lora_rank: 16, qk_nope_head_dim: 16, qk_rope_head_dim: 8, v_head_dim: 16 };
        let mla = Hyperparameters { attention: AttentionKind::Mla, mla: Some(mla), ..decoder(1, 64, 160, 4, 4, 100) };
        assert!(transformer_graph_with(&mla, &req(8, 1, 0), on).unwrap_err().contains("MLA"));
    }

    /// Requests the builder refuses: an inference phase, and a sequence longer than a
    /// learned position table (at the table's length it builds).
    #[test]
    fn inference_phases_and_long_learned_positions_are_refused() {
        let h = decoder(2, 64, 160, 4, 4, 100);
        let prefill = GraphRequest { phase: Phase::Prefill(super::super::InferenceShape { kv_len: 8, concurrency: 1 }), ..req(8, 1, 0) };
        assert!(transformer_graph(&h, &prefill).unwrap_err().contains("only training graphs"));
        let learned = Hyperparameters { position: PositionScheme::Learned, max_position: 16, ..h };
        assert!(transformer_graph(&learned, &req(16, 1, 0)).is_ok());
        assert!(transformer_graph(&learned, &req(17, 1, 0)).unwrap_err().contains("seq-len 17 exceeds the learned position table (16"));
    }

    /// Paths no shipped family takes: a gated dense MLP with biases (each of gate, up and
    /// down has one), two shared experts without a shared width (2 x expert width), MLA
    /// sizes given with GQA attention (the `attention` field decides), a pattern's `E`
    /// without a MoE config (never a MoE layer), GeGLU's own op, and `decoder`'s MHA/GQA.
    #[test]
    fn biased_gated_mlp_shared_experts_and_attention_choice() {
        let biased = Hyperparameters { bias: true, ..decoder(1, 64, 160, 4, 4, 100) };
        let g = transformer_graph(&biased, &req(8, 1, 0)).unwrap();
        for n in ["gate", "up", "down"] {
            assert!(g.tensors.iter().any(|t| t.name == format!("layers.0.mlp.{n}.bias")), "mlp.{n}.bias");
        }
        let mut h = decoder(1, 64, 160, 4, 4, 100);
        h.moe = Some(MoeConfig { shared_experts: 2, ..moe(4, 2, 32) });
        let g = transformer_graph(&h, &req(8, 1, 0)).unwrap();
        let up = g.tensors.iter().find(|t| t.name == "layers.0.moe.shared.up.weight").unwrap();
        assert_eq!(up.shape, [64, 64]);
        let mla = MlaConfig { q_lora_rank: 0, kv_lora_rank: 16, qk_nope_head_dim: 16, qk_rope_head_dim: 8, v_head_dim: 16 };
        let gqa = Hyperparameters { mla: Some(mla), ..decoder(1, 64, 160, 4, 2, 100) };
        let g = transformer_graph(&gqa, &req(8, 1, 0)).unwrap();
        assert!(g.tensors.iter().any(|t| t.name == "layers.0.attn.k.weight"));
        assert!(!g.operations.iter().any(|o| o.name.contains("kv_norm")));
        let pattern = Hyperparameters { layer_pattern: "*E".into(), layers: 2, ..decoder(2, 64, 160, 4, 4, 100) };
        assert!(!is_moe_layer(&pattern, 1));
        let geglu = Hyperparameters { activation: ActivationKind::Geglu, ..decoder(1, 64, 160, 4, 4, 100) };
        let g = transformer_graph(&geglu, &req(8, 1, 0)).unwrap();
        assert_eq!(g.operations.iter().find(|o| o.name == "layers.0.mlp.act").unwrap().kind, OpKind::Geglu);
        assert_eq!((decoder(1, 64, 160, 4, 4, 100).attention, decoder(1, 64, 160, 4, 2, 100).attention), (AttentionKind::Mha, AttentionKind::Gqa));
    }
}
