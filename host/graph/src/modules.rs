//! Megatron-LM's selective-recompute modules (`--recompute-modules`) found in a graph:
//! which ops of each transformer layer make up each module, and which stored
//! activations recomputing that module drops ([`modules`] → [`ModuleMap`]).
//!
//! Megatron-LM (`TransformerConfig.recompute_modules`, megatron/core/transformer/
//! transformer_config.py, github:NVIDIA/Megatron-LM@002526d81b81f6ab534e93844f9a228709887494) recomputes, under
//! `--recompute-granularity selective`, the listed submodules of every layer:
//! - `core_attn`: the attention core (normal checkpoint). A flash kernel stores no
//!   scores, and the output projection keeps the core's output anyway, so it frees no
//!   graph tensor; it costs the core's forward.
//! - `layernorm`: the layer's input norm and pre-MLP norm (output-discarding checkpoint):
//!   their outputs, which the following linears keep for their weight gradients, are
//!   dropped and recomputed from the norm's input (kept by the norm anyway).
//! - `moe_act`: the routed experts' activation function (output-discarding): its output,
//!   the input the experts' second GEMM keeps, is dropped and recomputed from the
//!   activation's inputs.
//! - `mla_up_proj`: multi-latent attention's up projections, rotary embedding and
//!   concatenation (output-discarding): the attention core's q, k, v inputs are dropped
//!   and recomputed from the latents (which the up projections keep).
//! - `mlp`: a dense (non-MoE) MLP (normal checkpoint): everything inside it is dropped and
//!   recomputed from its input.
//! - `shared_experts`: the shared experts of an MoE layer (normal checkpoint), likewise.
//! - `moe`: the whole MoE layer (normal checkpoint): router, dispatch, experts, combine,
//!   LatentMoE's projections and the shared experts; everything inside is dropped,
//!   including what the all-to-alls delivered, and recomputed from the layer's input. It
//!   contains `moe_act` and `shared_experts` ([`Module::parent`]): listing it recomputes
//!   them too, once.
//!
//! A Mamba-2 mixer layer (a residual norm whose layer runs an SSM scan) has none of these
//! modules: Megatron's `MambaLayer` takes no part in `recompute_modules`.
//!
//! The graph's op kinds and dataflow identify the modules (names are the plugin's and
//! never trusted): a residual norm is a norm whose input comes from a residual add or
//! from outside the layer; it feeds attention (input norm) or the MLP (pre-MLP norm);
//! an MLA up projection is a linear reading the output of a norm that is not a residual
//! norm (a latent's norm); an expert activation reads a grouped linear's output.
//! Collectives inside a module are not counted as its ops (re-running them is not
//! modelled) and are walked through when following the dataflow.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::fmt;

use crate::ir::{Graph, OpKind, TensorId, TensorKind};

/// One of Megatron's selective-recompute modules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Module {
    CoreAttn,
    Layernorm,
    MoeAct,
    MlaUpProj,
    Mlp,
    SharedExperts,
    Moe,
}

impl Module {
    pub const ALL: [Module; 7] = [
        Module::CoreAttn,
        Module::Layernorm,
        Module::MoeAct,
        Module::MlaUpProj,
        Module::Mlp,
        Module::SharedExperts,
        Module::Moe,
    ];
    pub const COUNT: usize = Module::ALL.len();

    pub fn index(self) -> usize {
        self as usize
    }

    /// Megatron's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Module::CoreAttn => "core_attn",
            Module::Layernorm => "layernorm",
            Module::MoeAct => "moe_act",
            Module::MlaUpProj => "mla_up_proj",
            Module::Mlp => "mlp",
            Module::SharedExperts => "shared_experts",
            Module::Moe => "moe",
        }
    }

    /// The module that contains this one: recomputing the parent re-runs it too. Each op
    /// belongs to its innermost module only, so a set of modules counts an op once
    /// when it is [`Modules::expanded`].
    pub fn parent(self) -> Option<Module> {
        match self {
            Module::MoeAct | Module::SharedExperts => Some(Module::Moe),
            _ => None,
        }
    }

    /// Parse Megatron's spelling.
    ///
    /// # Errors
    /// Names the accepted modules.
    pub fn parse(s: &str) -> Result<Module, String> {
        let s = s.trim().to_ascii_lowercase();
        Module::ALL.into_iter().find(|m| m.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Module::ALL.iter().map(|m| m.name()).collect();
            format!("unknown recompute module '{s}'; use {}", names.join(", "))
        })
    }
}

/// A set of modules: Megatron's `recompute_modules` list. The default is Megatron's
/// default list, `core_attn` alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Modules(u8);

impl Default for Modules {
    fn default() -> Modules {
        Modules::of(&[Module::CoreAttn])
    }
}

impl Modules {
    pub const EMPTY: Modules = Modules(0);

    pub fn of(list: &[Module]) -> Modules {
        Modules(list.iter().fold(0, |acc, m| acc | (1 << m.index())))
    }

    pub fn contains(self, m: Module) -> bool {
        self.0 & (1 << m.index()) != 0
    }

    pub fn with(self, m: Module) -> Modules {
        Modules(self.0 | (1 << m.index()))
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Module> {
        Module::ALL.into_iter().filter(move |m| self.contains(*m))
    }

    /// The set with every module whose parent it holds: what recomputing it re-runs.
    pub fn expanded(self) -> Modules {
        Module::ALL
            .into_iter()
            .filter(|m| m.parent().is_some_and(|p| self.contains(p)))
            .fold(self, Modules::with)
    }
}

impl fmt::Display for Modules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(Module::name).collect();
        f.write_str(&names.join("+"))
    }
}

impl serde::Serialize for Modules {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter().map(Module::name))
    }
}

impl<'de> serde::Deserialize<'de> for Modules {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Modules, D::Error> {
        let names: Vec<String> = serde::Deserialize::deserialize(d)?;
        let mut out = Modules::EMPTY;
        for n in names {
            out = out.with(Module::parse(&n).map_err(serde::de::Error::custom)?);
        }
        Ok(out)
    }
}

/// The modules of a graph's transformer layers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModuleMap {
    /// Per op: the module whose recompute re-runs it.
    pub op: Vec<Option<Module>>,
    /// Per activation: the module whose recompute drops it from what the forward keeps.
    pub frees: HashMap<TensorId, Module>,
}

fn is_norm(k: OpKind) -> bool {
    matches!(k, OpKind::RmsNorm | OpKind::LayerNorm)
}

fn is_comm(k: OpKind) -> bool {
    matches!(k, OpKind::AllGather | OpKind::ReduceScatter | OpKind::AllReduce | OpKind::AllToAll)
}

fn is_activation_fn(k: OpKind) -> bool {
    matches!(k, OpKind::SwiGlu | OpKind::GeGlu | OpKind::Gelu | OpKind::SquaredRelu)
}

/// Find the modules of `g` (a logical or sharded graph).
pub fn modules(g: &Graph) -> ModuleMap {
    let producer = g.producers();
    let made_by = |t: TensorId| producer.get(t).copied().flatten();
    // The ops reading each tensor, in op order: tensor t's are `reader[start[t]..start[t + 1]]`
    // (one list for the graph, where a vector per tensor was an allocation each).
    let mut start = vec![0usize; g.tensors.len() + 1];
    for op in &g.ops {
        for &x in &op.inputs {
            start[x + 1] += 1;
        }
    }
    for t in 0..g.tensors.len() {
        start[t + 1] += start[t];
    }
    let mut reader = vec![0usize; start[g.tensors.len()]];
    let mut fill = start.clone();
    for (i, op) in g.ops.iter().enumerate() {
        for &x in &op.inputs {
            reader[fill[x]] = i;
            fill[x] += 1;
        }
    }
    let consumers = |t: TensorId| start.get(t..t + 2).map_or(&[][..], |s| &reader[s[0]..s[1]]);
    // The op that made `t`, looking through collectives.
    let origin = |mut t: TensorId| -> Option<usize> {
        loop {
            let p = made_by(t)?;
            if !is_comm(g.ops[p].kind) {
                return Some(p);
            }
            t = *g.ops[p].inputs.first()?;
        }
    };
    let mut out = ModuleMap { op: vec![None; g.ops.len()], frees: HashMap::default() };
    let residual: HashSet<usize> = g
        .ops
        .iter()
        .enumerate()
        .filter(|(_, op)| op.layer >= 0 && is_norm(op.kind))
        .filter(|(_, op)| {
            op.inputs.first().is_none_or(|&x| match origin(x) {
                None => true,
                Some(p) => g.ops[p].kind == OpKind::Add || g.ops[p].layer != op.layer,
            })
        })
        .map(|(i, _)| i)
        .collect();
    // Ops reachable from `from` within its layer, not past a residual add.
    let reach = |from: usize, stop: &dyn Fn(usize) -> bool| -> Vec<usize> {
        let layer = g.ops[from].layer;
        let mut seen: HashSet<usize> = HashSet::default();
        let mut stack: Vec<usize> = g.ops[from].outputs.clone();
        let mut found = Vec::new();
        while let Some(t) = stack.pop() {
            for &c in consumers(t) {
                let op = &g.ops[c];
                if op.layer != layer || op.kind == OpKind::Add || stop(c) || !seen.insert(c) {
                    continue;
                }
                found.push(c);
                stack.extend(op.outputs.iter().copied());
            }
        }
        found
    };
    let mark = |out: &mut ModuleMap, i: usize, m: Module, frees: bool| {
        if !is_comm(g.ops[i].kind) {
            out.op[i] = Some(m);
            if frees {
                for &o in &g.ops[i].outputs {
                    if g.tensors[o].kind == TensorKind::Activation {
                        out.frees.insert(o, m);
                    }
                }
            }
        }
    };
    for &n in &residual {
        let inside = reach(n, &|_| false);
        if inside.iter().any(|&i| g.ops[i].kind == OpKind::SsmScan) {
            continue;
        }
        mark(&mut out, n, Module::Layernorm, true);
        if inside.iter().any(|&i| g.ops[i].kind == OpKind::Attention) {
            continue;
        }
        // The pre-MLP norm: a dense MLP, or an MoE layer's shared experts (everything
        // that is not routing, dispatch, the experts or the combine).
        let moe = inside.iter().any(|&i| matches!(g.ops[i].kind, OpKind::GroupedLinear | OpKind::MoeDispatch | OpKind::Router));
        let routed = |i: usize| {
            let op = &g.ops[i];
            matches!(op.kind, OpKind::Router | OpKind::MoeDispatch | OpKind::MoeCombine | OpKind::GroupedLinear | OpKind::AllToAll)
                || op.outputs.iter().any(|&o| consumers(o).iter().any(|&j| g.ops[j].kind == OpKind::Router))
        };
        let module = if moe { Module::SharedExperts } else { Module::Mlp };
        for i in reach(n, &routed) {
            mark(&mut out, i, module, true);
        }
        if moe {
            // The rest of the MoE layer (the expert activation is marked `moe_act`
            // below). What collectives deliver inside it is dropped too.
            for &i in &inside {
                if out.op[i].is_none() && !is_comm(g.ops[i].kind) {
                    mark(&mut out, i, Module::Moe, true);
                } else if is_comm(g.ops[i].kind) {
                    for &o in &g.ops[i].outputs {
                        if g.tensors[o].kind == TensorKind::Activation {
                            out.frees.entry(o).or_insert(Module::Moe);
                        }
                    }
                }
            }
        }
    }
    for (i, op) in g.ops.iter().enumerate() {
        if op.layer < 0 {
            continue;
        }
        if is_activation_fn(op.kind)
            && op.inputs.first().and_then(|&x| origin(x)).is_some_and(|p| g.ops[p].kind == OpKind::GroupedLinear)
        {
            mark(&mut out, i, Module::MoeAct, true);
        }
        if op.kind != OpKind::Attention {
            continue;
        }
        mark(&mut out, i, Module::CoreAttn, false);
        // MLA: q, k, v made from latents by up projections (a linear reading a norm that
        // is not a residual norm), through rotary embeddings and concatenations.
        for &x in op.inputs.iter().take(3) {
            let mut chain: Vec<usize> = Vec::new();
            let mut up = false;
            let mut stack = vec![x];
            let mut seen: HashSet<usize> = HashSet::default();
            while let Some(t) = stack.pop() {
                let Some(p) = origin(t) else { continue };
                if !seen.insert(p) {
                    continue;
                }
                let pop = &g.ops[p];
                match pop.kind {
                    OpKind::Rotary | OpKind::Concat => {
                        chain.push(p);
                        stack.extend(pop.inputs.iter().copied().filter(|&t| g.tensors[t].kind == TensorKind::Activation));
                    }
                    OpKind::Linear => {
                        let latent = pop
                            .inputs
                            .first()
                            .and_then(|&t| origin(t))
                            .is_some_and(|q| is_norm(g.ops[q].kind) && !residual.contains(&q));
                        if latent {
                            up = true;
                            chain.push(p);
                        }
                    }
                    _ => {}
                }
            }
            if up {
                for p in chain {
                    mark(&mut out, p, Module::MlaUpProj, false);
                }
                // The core keeps the tensor as it was before any gather (see
                // `recompute`), so the drop is recorded on both.
                let mut t = x;
                loop {
                    out.frees.insert(t, Module::MlaUpProj);
                    match made_by(t) {
                        Some(p) if is_comm(g.ops[p].kind) => match g.ops[p].inputs.first() {
                            Some(&y) => t = y,
                            None => break,
                        },
                        _ => break,
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ir::{Attr, DType, Graph, NamedOp, Tensor, TensorKind};
    use crate::testing::{op_in, t};

    /// A dense layer (norm, q/k/v, attention, out, add; norm, gate/up, SwiGLU, down, add)
    /// and an MLA + MoE layer with a shared expert.
    pub(crate) fn layers() -> Graph {
        let a = |n: &str, s: &[u64]| t(n, s, DType::BF16, TensorKind::Activation);
        let w = |n: &str, s: &[u64]| t(n, s, DType::BF16, TensorKind::Weight);
        let x = &[1u64, 8, 16][..];
        let tensors = vec![
            a("x", x),
            w("n1", &[16]),
            a("h1", x),
            w("wq", &[16, 16]),
            w("wk", &[16, 16]),
            w("wv", &[16, 16]),
            a("q", &[1, 8, 2, 8]),
            a("k", &[1, 8, 2, 8]),
            a("v", &[1, 8, 2, 8]),
            a("o", &[1, 8, 2, 8]),
            w("wo", &[16, 16]),
            a("ao", x),
            a("r1", x),
            w("n2", &[16]),
            a("h2", x),
            w("wg", &[32, 16]),
            w("wu", &[32, 16]),
            a("g", &[1, 8, 32]),
            a("u", &[1, 8, 32]),
            a("act", &[1, 8, 32]),
            w("wd", &[16, 32]),
            a("d", x),
            a("r2", x),
            // Layer 1: MLA attention, then routed + shared experts.
            w("m1", &[16]),
            a("k1", x),
            w("wqa", &[4, 16]),
            a("qa", &[1, 8, 4]),
            w("qn", &[4]),
            a("qan", &[1, 8, 4]),
            w("wqu", &[16, 4]),
            a("qu", &[1, 8, 2, 8]),
            a("qr", &[1, 8, 2, 8]),
            w("wkva", &[4, 16]),
            a("kva", &[1, 8, 4]),
            w("kvn", &[4]),
            a("kvan", &[1, 8, 4]),
            w("wku", &[16, 4]),
            a("ku", &[1, 8, 2, 8]),
            w("wvu", &[16, 4]),
            a("vu", &[1, 8, 2, 8]),
            a("o1", &[1, 8, 2, 8]),
            w("wo1", &[16, 16]),
            a("ao1", x),
            a("s1", x),
            w("m2", &[16]),
            a("k2", x),
            w("wr", &[4, 16]),
            a("logits", &[1, 8, 4]),
            a("rw", &[8, 2]),
            t("ri", &[8, 2], DType::I32, TensorKind::Activation),
            a("disp", &[16, 16]),
            w("eg", &[4, 32, 16]),
            w("eu", &[4, 32, 16]),
            a("eg_o", &[16, 32]),
            a("eu_o", &[16, 32]),
            a("eact", &[16, 32]),
            w("ed", &[4, 16, 32]),
            a("ed_o", &[16, 16]),
            a("comb", x),
            w("sg", &[32, 16]),
            w("su", &[32, 16]),
            a("sg_o", &[1, 8, 32]),
            a("su_o", &[1, 8, 32]),
            a("sact", &[1, 8, 32]),
            w("sd", &[16, 32]),
            a("sd_o", x),
            a("moe", x),
            a("s2", x),
        ];
        let causal = [("causal", Attr::Flag(true))];
        let ops = vec![
            op_in("l0.n1", OpKind::RmsNorm, &["x", "n1"], &["h1"], &[], 0),
            op_in("l0.q", OpKind::Linear, &["h1", "wq"], &["q"], &[], 0),
            op_in("l0.k", OpKind::Linear, &["h1", "wk"], &["k"], &[], 0),
            op_in("l0.v", OpKind::Linear, &["h1", "wv"], &["v"], &[], 0),
            op_in("l0.core", OpKind::Attention, &["q", "k", "v"], &["o"], &causal, 0),
            op_in("l0.out", OpKind::Linear, &["o", "wo"], &["ao"], &[], 0),
            op_in("l0.res1", OpKind::Add, &["x", "ao"], &["r1"], &[], 0),
            op_in("l0.n2", OpKind::RmsNorm, &["r1", "n2"], &["h2"], &[], 0),
            op_in("l0.gate", OpKind::Linear, &["h2", "wg"], &["g"], &[], 0),
            op_in("l0.up", OpKind::Linear, &["h2", "wu"], &["u"], &[], 0),
            op_in("l0.act", OpKind::SwiGlu, &["g", "u"], &["act"], &[], 0),
            op_in("l0.down", OpKind::Linear, &["act", "wd"], &["d"], &[], 0),
            op_in("l0.res2", OpKind::Add, &["r1", "d"], &["r2"], &[], 0),
            op_in("l1.n1", OpKind::RmsNorm, &["r2", "m1"], &["k1"], &[], 1),
            op_in("l1.qa", OpKind::Linear, &["k1", "wqa"], &["qa"], &[], 1),
            op_in("l1.qn", OpKind::RmsNorm, &["qa", "qn"], &["qan"], &[], 1),
            op_in("l1.qu", OpKind::Linear, &["qan", "wqu"], &["qu"], &[], 1),
            op_in("l1.qr", OpKind::Rotary, &["qu"], &["qr"], &[("rot-dim", Attr::Int(8)), ("theta", Attr::Float(1e4))], 1),
            op_in("l1.kva", OpKind::Linear, &["k1", "wkva"], &["kva"], &[], 1),
            op_in("l1.kvn", OpKind::RmsNorm, &["kva", "kvn"], &["kvan"], &[], 1),
            op_in("l1.ku", OpKind::Linear, &["kvan", "wku"], &["ku"], &[], 1),
            op_in("l1.vu", OpKind::Linear, &["kvan", "wvu"], &["vu"], &[], 1),
            op_in("l1.core", OpKind::Attention, &["qr", "ku", "vu"], &["o1"], &causal, 1),
            op_in("l1.out", OpKind::Linear, &["o1", "wo1"], &["ao1"], &[], 1),
            op_in("l1.res1", OpKind::Add, &["r2", "ao1"], &["s1"], &[], 1),
            op_in("l1.n2", OpKind::RmsNorm, &["s1", "m2"], &["k2"], &[], 1),
            op_in("l1.router_logits", OpKind::Linear, &["k2", "wr"], &["logits"], &[], 1),
            op_in("l1.router", OpKind::Router, &["logits"], &["rw", "ri"], &[("top-k", Attr::Int(2))], 1),
            op_in("l1.dispatch", OpKind::MoeDispatch, &["k2", "ri"], &["disp"], &[("experts", Attr::Int(4))], 1),
            op_in("l1.eg", OpKind::GroupedLinear, &["disp", "eg", "ri"], &["eg_o"], &[], 1),
            op_in("l1.eu", OpKind::GroupedLinear, &["disp", "eu", "ri"], &["eu_o"], &[], 1),
            op_in("l1.eact", OpKind::SwiGlu, &["eg_o", "eu_o"], &["eact"], &[], 1),
            op_in("l1.ed", OpKind::GroupedLinear, &["eact", "ed", "ri"], &["ed_o"], &[], 1),
            op_in("l1.combine", OpKind::MoeCombine, &["ed_o", "rw", "ri"], &["comb"], &[], 1),
            op_in("l1.sg", OpKind::Linear, &["k2", "sg"], &["sg_o"], &[], 1),
            op_in("l1.su", OpKind::Linear, &["k2", "su"], &["su_o"], &[], 1),
            op_in("l1.sact", OpKind::SwiGlu, &["sg_o", "su_o"], &["sact"], &[], 1),
            op_in("l1.sd", OpKind::Linear, &["sact", "sd"], &["sd_o"], &[], 1),
            op_in("l1.moe", OpKind::Add, &["comb", "sd_o"], &["moe"], &[], 1),
            op_in("l1.res2", OpKind::Add, &["s1", "moe"], &["s2"], &[], 1),
        ];
        Graph::new(tensors, ops, "s2").expect("test graph")
    }

    fn module_of(g: &Graph, m: &ModuleMap, op: &str) -> Option<Module> {
        m.op[g.ops.iter().position(|o| o.name == op).unwrap()]
    }

    fn freed(g: &Graph, m: &ModuleMap, module: Module) -> Vec<String> {
        let mut v: Vec<String> = m.frees.iter().filter(|(_, x)| **x == module).map(|(t, _)| g.tensors[*t].name.clone()).collect();
        v.sort();
        v
    }

    #[test]
    fn modules_of_a_dense_and_an_mla_moe_layer() {
        let g = layers();
        let m = modules(&g);
        for (op, want) in [
            ("l0.n1", Some(Module::Layernorm)),
            ("l0.n2", Some(Module::Layernorm)),
            ("l1.n1", Some(Module::Layernorm)),
            ("l1.n2", Some(Module::Layernorm)),
            // Latent norms are MLA's own, not the layer's.
            ("l1.qn", None),
            ("l1.kvn", None),
            ("l0.q", None),
            ("l0.core", Some(Module::CoreAttn)),
            ("l0.gate", Some(Module::Mlp)),
            ("l0.act", Some(Module::Mlp)),
            ("l0.down", Some(Module::Mlp)),
            ("l1.qa", None),
            ("l1.qu", Some(Module::MlaUpProj)),
            ("l1.qr", Some(Module::MlaUpProj)),
            ("l1.ku", Some(Module::MlaUpProj)),
            ("l1.vu", Some(Module::MlaUpProj)),
            ("l1.router_logits", Some(Module::Moe)),
            ("l1.router", Some(Module::Moe)),
            ("l1.dispatch", Some(Module::Moe)),
            ("l1.eg", Some(Module::Moe)),
            ("l1.combine", Some(Module::Moe)),
            // The sum of routed and shared outputs and the residual are outside it.
            ("l1.moe", None),
            ("l1.eact", Some(Module::MoeAct)),
            ("l1.sg", Some(Module::SharedExperts)),
            ("l1.sact", Some(Module::SharedExperts)),
            ("l1.sd", Some(Module::SharedExperts)),
        ] {
            assert_eq!(module_of(&g, &m, op), want, "{op}");
        }
        assert_eq!(freed(&g, &m, Module::Layernorm), ["h1", "h2", "k1", "k2"]);
        assert_eq!(freed(&g, &m, Module::MlaUpProj), ["ku", "qr", "vu"]);
        assert_eq!(freed(&g, &m, Module::MoeAct), ["eact"]);
        assert_eq!(freed(&g, &m, Module::Mlp), ["act", "d", "g", "u"]);
        assert_eq!(freed(&g, &m, Module::SharedExperts), ["sact", "sd_o", "sg_o", "su_o"]);
        assert_eq!(freed(&g, &m, Module::Moe), ["comb", "disp", "ed_o", "eg_o", "eu_o", "logits", "ri", "rw"]);
        assert!(freed(&g, &m, Module::CoreAttn).is_empty());
    }

    #[test]
    fn module_sets_spell_and_parse_as_megatron() {
        let s = Modules::of(&[Module::Layernorm, Module::MoeAct]);
        assert_eq!(s.to_string(), "layernorm+moe_act");
        assert!(s.contains(Module::MoeAct) && !s.contains(Module::Mlp));
        assert_eq!(Modules::default().to_string(), "core_attn");
        assert_eq!(Module::parse("MLA_UP_PROJ"), Ok(Module::MlaUpProj));
        // `moe` re-runs the expert activation and the shared experts inside it.
        let moe = Modules::of(&[Module::Moe, Module::CoreAttn]).expanded();
        assert_eq!(moe.to_string(), "core_attn+moe_act+shared_experts+moe");
        assert_eq!(s.expanded(), s);
        assert!(Module::parse("experts").unwrap_err().contains("core_attn, layernorm"));
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, r#"["layernorm","moe_act"]"#);
        assert_eq!(serde_json::from_str::<Modules>(&json).unwrap(), s);
    }

    /// Every module's spelling parses back to it; a list with an unknown name is refused;
    /// the empty set is empty and Megatron's default is not.
    #[test]
    fn every_module_name_round_trips() {
        for m in Module::ALL {
            assert_eq!(Module::parse(m.name()), Ok(m));
        }
        let names: Vec<&str> = Module::ALL.iter().map(|m| m.name()).collect();
        assert_eq!(names, ["core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "shared_experts", "moe"]);
        assert!(serde_json::from_str::<Modules>(r#"["mlp","experts"]"#).is_err());
        assert_eq!(serde_json::from_str::<Modules>(r#"["mlp"]"#).unwrap(), Modules::of(&[Module::Mlp]));
        assert!(Modules::EMPTY.is_empty() && Modules::of(&[]).is_empty());
        assert!(!Modules::default().is_empty() && !Modules::of(&[Module::CoreAttn]).is_empty());
    }

    /// Megatron's list is read case- and space-insensitively.
    #[test]
    fn module_names_parse_with_spaces_and_capitals() {
        assert_eq!(Module::parse(" moe "), Ok(Module::Moe));
        assert_eq!(Module::parse("Shared_Experts\n"), Ok(Module::SharedExperts));
        assert_eq!(Modules::of(&[Module::SharedExperts]).expanded(), Modules::of(&[Module::SharedExperts]));
        assert_eq!(Modules::of(&[Module::Moe]).expanded().to_string(), "moe_act+shared_experts+moe");
    }

    /// Experts with a single-input activation (squared ReLU, as Nemotron's; GeLU): the
    /// activation after the grouped linear is `moe_act` and drops its output.
    #[test]
    fn single_input_expert_activations_are_moe_act() {
        for kind in [OpKind::SquaredRelu, OpKind::Gelu] {
            let g = layers();
            let ops = g
                .ops
                .iter()
                .map(|o| {
                    let mut n = g.named(o);
                    if o.name == "l1.eact" {
                        n.kind = kind;
                        n.inputs.truncate(1);
                    }
                    n
                })
                .collect();
            let g = Graph::new(g.tensors.clone(), ops, "s2").unwrap();
            let m = modules(&g);
            assert_eq!(module_of(&g, &m, "l1.eact"), Some(Module::MoeAct), "{kind:?}");
            assert_eq!(freed(&g, &m, Module::MoeAct), ["eact"], "{kind:?}");
        }
    }

    /// `layers()` with each op passed through `f` (the graph's tensors plus `extra`).
    fn edited(extra: &[Tensor], f: impl Fn(NamedOp) -> Vec<NamedOp>) -> Graph {
        let g = layers();
        let mut tensors = g.tensors.clone();
        tensors.extend(extra.iter().cloned());
        let ops = g.ops.iter().flat_map(|o| f(g.named(o))).collect();
        Graph::new(tensors, ops, "s2").unwrap()
    }

    fn sorted(m: &ModuleMap, g: &Graph, module: Option<Module>) -> Vec<String> {
        let mut v: Vec<String> = g.ops.iter().zip(&m.op).filter(|(_, x)| **x == module).map(|(o, _)| o.name.clone()).collect();
        v.sort();
        v
    }

    /// MLA as the builder lays it out (DeepSeek-V3): q and k are each the concatenation of
    /// a no-position part, up-projected from a latent, and a rotary part. `mla_up_proj`
    /// is the up projections, both rotaries and both concatenations, and drops q, k and
    /// v; the down projections, the latent norms and the rotary key's projection (it
    /// reads the layer's input norm, not a latent) stay outside.
    #[test]
    fn mla_with_concatenated_rope_parts() {
        let a = |n: &str, s: &[u64]| t(n, s, DType::BF16, TensorKind::Activation);
        let w = |n: &str, s: &[u64]| t(n, s, DType::BF16, TensorKind::Weight);
        let rot = [("rot-dim", Attr::Int(4)), ("theta", Attr::Float(1e4))];
        let ops = vec![
            op_in("n1", OpKind::RmsNorm, &["x", "n1w"], &["h"], &[], 0),
            op_in("q_a", OpKind::Linear, &["h", "wqa"], &["qa"], &[], 0),
            op_in("q_a_norm", OpKind::RmsNorm, &["qa", "qn"], &["qan"], &[], 0),
            op_in("q_nope", OpKind::Linear, &["qan", "wq"], &["qno"], &[], 0),
            op_in("q_pe", OpKind::Linear, &["qan", "wqp"], &["qp"], &[], 0),
            op_in("q_rope", OpKind::Rotary, &["qp"], &["qr"], &rot, 0),
            op_in("q_cat", OpKind::Concat, &["qno", "qr"], &["q"], &[], 0),
            op_in("kv_a", OpKind::Linear, &["h", "wkva"], &["kva"], &[], 0),
            op_in("k_rope_proj", OpKind::Linear, &["h", "wkr"], &["kp"], &[], 0),
            op_in("k_rope", OpKind::Rotary, &["kp"], &["kr"], &rot, 0),
            op_in("kv_norm", OpKind::RmsNorm, &["kva", "kvn"], &["kvan"], &[], 0),
            op_in("k_nope", OpKind::Linear, &["kvan", "wkn"], &["kno"], &[], 0),
            op_in("v", OpKind::Linear, &["kvan", "wv"], &["v"], &[], 0),
            op_in("k_cat", OpKind::Concat, &["kno", "kr"], &["k"], &[], 0),
            op_in("core", OpKind::Attention, &["q", "k", "v"], &["o"], &[("causal", Attr::Flag(true))], 0),
            op_in("out", OpKind::Linear, &["o", "wo"], &["ao"], &[], 0),
            op_in("res", OpKind::Add, &["x", "ao"], &["r"], &[], 0),
        ];
        let x = &[1u64, 8, 16][..];
        let tensors = vec![
            a("x", x),
            w("n1w", &[16]),
            a("h", x),
            w("wqa", &[4, 16]),
            a("qa", &[1, 8, 4]),
            w("qn", &[4]),
            a("qan", &[1, 8, 4]),
            w("wq", &[16, 4]),
            a("qno", &[1, 8, 2, 8]),
            w("wqp", &[8, 4]),
            a("qp", &[1, 8, 2, 4]),
            a("qr", &[1, 8, 2, 4]),
            a("q", &[1, 8, 2, 12]),
            w("wkva", &[4, 16]),
            a("kva", &[1, 8, 4]),
            w("wkr", &[4, 16]),
            a("kp", &[1, 8, 1, 4]),
            a("kr", &[1, 8, 1, 4]),
            w("kvn", &[4]),
            a("kvan", &[1, 8, 4]),
            w("wkn", &[16, 4]),
            a("kno", &[1, 8, 2, 8]),
            w("wv", &[16, 4]),
            a("v", &[1, 8, 2, 8]),
            a("k", &[1, 8, 2, 12]),
            a("o", &[1, 8, 2, 8]),
            w("wo", &[16, 16]),
            a("ao", x),
            a("r", x),
        ];
        let g = Graph::new(tensors, ops, "r").unwrap();
        let m = modules(&g);
        assert_eq!(sorted(&m, &g, Some(Module::MlaUpProj)), ["k_cat", "k_nope", "k_rope", "q_cat", "q_nope", "q_pe", "q_rope", "v"]);
        assert_eq!(sorted(&m, &g, None), ["k_rope_proj", "kv_a", "kv_norm", "out", "q_a", "q_a_norm", "res"]);
        assert_eq!(sorted(&m, &g, Some(Module::Layernorm)), ["n1"]);
        assert_eq!(sorted(&m, &g, Some(Module::CoreAttn)), ["core"]);
        assert_eq!(freed(&g, &m, Module::MlaUpProj), ["k", "q", "v"]);
        assert_eq!(freed(&g, &m, Module::Layernorm), ["h"]);
        assert_eq!(m.frees.len(), 4);
    }

    /// The first layer's input norm reads the embedding (outside the layers, not a residual
    /// add): it is a residual norm all the same, and the embedding is in no module.
    #[test]
    fn the_first_layers_norm_reads_the_embedding() {
        let extra = [t("tok", &[1, 8], DType::I32, TensorKind::Input), t("table", &[10, 16], DType::BF16, TensorKind::Weight)];
        let g = edited(&extra, |o| {
            if o.name == "l0.n1" {
                vec![op_in("embed", OpKind::Embedding, &["tok", "table"], &["x"], &[], -1), o]
            } else {
                vec![o]
            }
        });
        let m = modules(&g);
        assert_eq!(module_of(&g, &m, "embed"), None);
        assert_eq!(module_of(&g, &m, "l0.n1"), Some(Module::Layernorm));
        assert_eq!(freed(&g, &m, Module::Layernorm), ["h1", "h2", "k1", "k2"]);
        assert_eq!(freed(&g, &m, Module::Mlp), ["act", "d", "g", "u"]);
    }

    /// Ops outside the transformer layers (layer -1: embedding, final norm, head) belong
    /// to no module, whatever their kinds: the same two layers moved outside have none.
    #[test]
    fn ops_outside_the_layers_are_in_no_module() {
        let g = edited(&[], |o| vec![NamedOp { layer: -1, ..o }]);
        let m = modules(&g);
        assert!(m.op.iter().all(Option::is_none), "{:?}", m.op);
        assert!(m.frees.is_empty());
    }

    /// An expert-parallel MoE layer: an all-to-all delivers the dispatched tokens and an
    /// all-gather sits between the gate experts and the activation. The collectives are
    /// in no module; what they deliver inside the layer is dropped by `moe`; the
    /// activation, reading a grouped linear's output through the gather, is `moe_act`.
    #[test]
    fn collectives_inside_an_moe_layer() {
        let a = |n: &str, s: &[u64]| t(n, s, DType::BF16, TensorKind::Activation);
        let g = edited(&[a("disp_ep", &[16, 16]), a("eg_g", &[16, 32])], |o| match o.name.as_str() {
            "l1.dispatch" => vec![o, op_in("l1.a2a", OpKind::AllToAll, &["disp"], &["disp_ep"], &[], 1)],
            "l1.eg" => vec![
                NamedOp { inputs: vec!["disp_ep".into(), "eg".into(), "ri".into()], ..o },
                op_in("l1.eg_ag", OpKind::AllGather, &["eg_o"], &["eg_g"], &[], 1),
            ],
            "l1.eu" => vec![NamedOp { inputs: vec!["disp_ep".into(), "eu".into(), "ri".into()], ..o }],
            "l1.eact" => vec![NamedOp { inputs: vec!["eg_g".into(), "eu_o".into()], ..o }],
            _ => vec![o],
        });
        let m = modules(&g);
        assert_eq!(module_of(&g, &m, "l1.a2a"), None);
        assert_eq!(module_of(&g, &m, "l1.eg_ag"), None);
        assert_eq!(module_of(&g, &m, "l1.eact"), Some(Module::MoeAct));
        assert_eq!(module_of(&g, &m, "l1.eg"), Some(Module::Moe));
        assert_eq!(freed(&g, &m, Module::MoeAct), ["eact"]);
        assert_eq!(freed(&g, &m, Module::Moe), ["comb", "disp", "disp_ep", "ed_o", "eg_g", "eg_o", "eu_o", "logits", "ri", "rw"]);
        assert_eq!(freed(&g, &m, Module::SharedExperts), ["sact", "sd_o", "sg_o", "su_o"]);
    }

    /// Two layers with no residual add between them: an MLP layer whose output the next
    /// (attention) layer's norm reads directly. The walk from a norm stops at its layer's
    /// end, so layer 0 stays an MLP (its norm is not taken for an attention norm), and
    /// layer 1's norm, reading another layer's linear, is a residual norm. q, k and v read
    /// that norm (not a latent's): no `mla_up_proj`.
    #[test]
    fn the_walk_stops_at_the_layer() {
        let a = |n: &str| t(n, &[1, 8, 16], DType::BF16, TensorKind::Activation);
        let w = |n: &str, s: &[u64]| t(n, s, DType::BF16, TensorKind::Weight);
        let mut tensors = vec![a("x"), w("n0", &[16]), a("h0"), w("wu", &[16, 16]), a("u"), a("act"), w("wd", &[16, 16]), a("d0")];
        tensors.extend([w("n1", &[16]), a("h1"), w("wq", &[16, 16]), w("wk", &[16, 16]), w("wv", &[16, 16])]);
        tensors.extend(["q", "k", "v", "o"].map(|n| t(n, &[1, 8, 2, 8], DType::BF16, TensorKind::Activation)));
        tensors.extend([w("wo", &[16, 16]), a("ao")]);
        let ops = vec![
            op_in("l0.n", OpKind::RmsNorm, &["x", "n0"], &["h0"], &[], 0),
            op_in("l0.up", OpKind::Linear, &["h0", "wu"], &["u"], &[], 0),
            op_in("l0.act", OpKind::Gelu, &["u"], &["act"], &[], 0),
            op_in("l0.down", OpKind::Linear, &["act", "wd"], &["d0"], &[], 0),
            op_in("l1.n", OpKind::RmsNorm, &["d0", "n1"], &["h1"], &[], 1),
            op_in("l1.q", OpKind::Linear, &["h1", "wq"], &["q"], &[], 1),
            op_in("l1.k", OpKind::Linear, &["h1", "wk"], &["k"], &[], 1),
            op_in("l1.v", OpKind::Linear, &["h1", "wv"], &["v"], &[], 1),
            op_in("l1.core", OpKind::Attention, &["q", "k", "v"], &["o"], &[("causal", Attr::Flag(true))], 1),
            op_in("l1.out", OpKind::Linear, &["o", "wo"], &["ao"], &[], 1),
        ];
        let g = Graph::new(tensors, ops, "ao").unwrap();
        let m = modules(&g);
        assert_eq!(sorted(&m, &g, Some(Module::Mlp)), ["l0.act", "l0.down", "l0.up"]);
        assert_eq!(sorted(&m, &g, Some(Module::Layernorm)), ["l0.n", "l1.n"]);
        assert_eq!(sorted(&m, &g, Some(Module::CoreAttn)), ["l1.core"]);
        assert_eq!(sorted(&m, &g, None), ["l1.k", "l1.out", "l1.q", "l1.v"]);
        assert_eq!(freed(&g, &m, Module::Mlp), ["act", "d0", "u"]);
        assert_eq!(freed(&g, &m, Module::Layernorm), ["h0", "h1"]);
        assert_eq!(m.frees.len(), 5);
    }

    /// q, k and v projected straight from the embedding (a layer with no input norm): a
    /// linear is an MLA up projection only when it reads a latent's norm, so nothing here
    /// is `mla_up_proj` and nothing is dropped.
    #[test]
    fn a_projection_of_no_norm_is_no_up_projection() {
        let extra = [t("tok", &[1, 8], DType::I32, TensorKind::Input), t("table", &[10, 16], DType::BF16, TensorKind::Weight)];
        let g = edited(&extra, |o| match o.name.as_str() {
            "l0.n1" => vec![op_in("embed", OpKind::Embedding, &["tok", "table"], &["x"], &[], -1)],
            "l0.q" | "l0.k" | "l0.v" => vec![NamedOp { inputs: vec!["x".into(), o.inputs[1].clone()], ..o }],
            _ => vec![o],
        });
        let m = modules(&g);
        for op in ["l0.q", "l0.k", "l0.v"] {
            assert_eq!(module_of(&g, &m, op), None, "{op}");
        }
        assert_eq!(module_of(&g, &m, "l0.core"), Some(Module::CoreAttn));
        assert!(!m.frees.contains_key(&g.tensor_id("q").unwrap()));
        assert_eq!(freed(&g, &m, Module::MlaUpProj), ["ku", "qr", "vu"], "layer 1's MLA is unchanged");
    }
}
