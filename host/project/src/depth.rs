//! A model's depth: which transformer layers are alike, and a reduced-depth graph that
//! keeps one of each.
//!
//! Costing a layout shards the graph, and a 126-layer graph costs as much to shard as it
//! has ops. But a transformer repeats a handful of distinct layers (dense and MoE layers,
//! windowed and global attention), and every layer with the same [`signature`] has the
//! same sharded cost. So the projection shards the shortest prefix of layers that holds
//! every distinct layer once, with the embedding before it and the head, loss and any
//! multi-token-prediction modules after it ([`reduce`]), and maps each of the model's
//! layers to its representative ([`Depth::class`]). A test checks that the composed cost
//! equals the cost of the full sharded graph.

use std::collections::BTreeMap;
// Tensor ids hash with FxHash; layer numbers, which a plugin chooses, with std's SipHash.
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::fmt::Write as _;

use runner_graph::shard::{Place, partition};
use runner_graph::{Graph, NamedOp, OpKind, TensorId};

/// The layer structure of a logical graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Depth {
    /// The main transformer layers, by `op.layer`, in execution order.
    pub layers: Vec<i32>,
    /// Per layer position: its class (an index into [`Depth::reps`]).
    pub class: Vec<usize>,
    /// Per class: the position of its first layer, which the reduced graph keeps.
    pub reps: Vec<usize>,
    /// Per layer position: the GEMM ops' logical names in op order (for precision plans).
    pub gemm_names: Vec<Vec<String>>,
    /// GEMM names of the ops before and after the layers (embedding side, head side).
    pub pre_gemms: Vec<String>,
    pub post_gemms: Vec<String>,
    /// Layers the reduced graph keeps: the shortest prefix holding every class.
    pub prefix: usize,
}

impl Depth {
    /// Layers of the model.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

/// A layer's structure without its names: op kinds, roles, attributes, shapes and
/// dtypes, which earlier op of the layer produced each input, and whether an input from
/// outside the layer carries a gradient (`needs_grad`, per tensor: a LoRA fine-tune's
/// first layer receives none from the frozen embedding, so its backward differs). Two
/// layers with equal signatures shard and cost alike.
pub fn signature(g: &Graph, ops: &[usize], needs_grad: &[bool]) -> String {
    let mut local: HashMap<TensorId, usize> = HashMap::default();
    let mut s = String::new();
    for (j, &i) in ops.iter().enumerate() {
        let op = &g.ops[i];
        let _ = write!(s, "{:?}/{:?}/{:?}(", op.kind, op.role, op.attrs);
        for &x in &op.inputs {
            let t = &g.tensors[x];
            match local.get(&x) {
                Some(k) => {
                    let _ = write!(s, "@{k},");
                }
                None => {
                    let grad = if needs_grad.get(x).copied().unwrap_or(false) { "g" } else { "" };
                    let _ = write!(s, "{:?}{:?}{:?}{grad},", t.shape, t.dtype, t.kind);
                }
            }
        }
        s.push_str(")->");
        for &o in &op.outputs {
            let t = &g.tensors[o];
            let _ = write!(s, "{:?}{:?},", t.shape, t.dtype);
            local.insert(o, j);
        }
        s.push(';');
    }
    s
}

fn gemm(op: &runner_graph::Op) -> bool {
    matches!(op.kind, OpKind::Linear | OpKind::GroupedLinear)
}

/// Classify the layers of logical graph `g`.
pub fn analyse(g: &Graph) -> Depth {
    let (places, layers) = partition(g);
    let pos: std::collections::HashMap<i32, usize> = layers.iter().enumerate().map(|(p, &l)| (l, p)).collect();
    let mut ops_of: Vec<Vec<usize>> = vec![Vec::new(); layers.len()];
    let (mut pre_gemms, mut post_gemms) = (Vec::new(), Vec::new());
    for (i, place) in places.iter().enumerate() {
        match place {
            Place::Layer(l) => ops_of[pos[l]].push(i),
            Place::Pre if gemm(&g.ops[i]) => pre_gemms.push(g.ops[i].name.clone()),
            Place::Post if gemm(&g.ops[i]) => post_gemms.push(g.ops[i].name.clone()),
            _ => {}
        }
    }
    let needs_grad = runner_graph::autodiff::needs_grad(g);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut class = Vec::with_capacity(layers.len());
    let mut reps = Vec::new();
    for (p, ops) in ops_of.iter().enumerate() {
        let sig = signature(g, ops, &needs_grad);
        let c = *seen.entry(sig).or_insert_with(|| {
            reps.push(p);
            reps.len() - 1
        });
        class.push(c);
    }
    let prefix = reps.last().map_or(0, |&p| p + 1);
    let gemm_names =
        ops_of.iter().map(|ops| ops.iter().filter(|&&i| gemm(&g.ops[i])).map(|&i| g.ops[i].name.clone()).collect()).collect();
    Depth { layers, class, reps, gemm_names, pre_gemms, post_gemms, prefix }
}

/// The graph with only the first `d.prefix` layers: the embedding side, those layers,
/// then the head side (final norm, head, loss, MTP modules) reading the last kept
/// layer's output in place of the last layer's. `None` when that rewiring is not
/// possible (the head reads several layers, or layer interfaces differ in shape): the
/// caller then costs the full graph.
pub fn reduce(g: &Graph, d: &Depth) -> Option<Graph> {
    let k = d.prefix;
    let n = d.len();
    if k >= n {
        return None;
    }
    let (places, _) = partition(g);
    let pos: std::collections::HashMap<i32, usize> = d.layers.iter().enumerate().map(|(p, &l)| (l, p)).collect();
    let where_of = |i: usize| match places[i] {
        Place::Pre => -1i64,
        Place::Layer(l) => pos[&l] as i64,
        Place::Post => n as i64,
    };
    let mut producer: HashMap<TensorId, i64> = HashMap::default();
    for (i, op) in g.ops.iter().enumerate() {
        for &o in &op.outputs {
            producer.insert(o, where_of(i));
        }
    }
    // What the head side reads from the removed layers, and what layer k reads from
    // layer k-1: the two interfaces must match one to one.
    let crossing = |at: i64, from: i64| -> Vec<TensorId> {
        let mut out = Vec::new();
        for (i, op) in g.ops.iter().enumerate() {
            if where_of(i) != at {
                continue;
            }
            for &x in &op.inputs {
                if producer.get(&x) == Some(&from) && !out.contains(&x) {
                    out.push(x);
                }
            }
        }
        out
    };
    let into_post: Vec<TensorId> = {
        let mut v = Vec::new();
        for (i, op) in g.ops.iter().enumerate() {
            if where_of(i) != n as i64 {
                continue;
            }
            for &x in &op.inputs {
                if let Some(&p) = producer.get(&x)
                    && p >= k as i64
                    && p < n as i64
                {
                    if p != n as i64 - 1 {
                        return None;
                    }
                    if !v.contains(&x) {
                        v.push(x);
                    }
                }
            }
        }
        v
    };
    let into_k = crossing(k as i64, k as i64 - 1);
    if into_post.len() != into_k.len() {
        return None;
    }
    let mut rename: HashMap<TensorId, TensorId> = HashMap::default();
    for (&a, &b) in into_post.iter().zip(&into_k) {
        let (ta, tb) = (&g.tensors[a], &g.tensors[b]);
        if ta.shape != tb.shape || ta.dtype != tb.dtype {
            return None;
        }
        rename.insert(a, b);
    }
    let keep: Vec<usize> = (0..g.ops.len()).filter(|&i| where_of(i) < k as i64 || where_of(i) == n as i64).collect();
    let mut used: HashSet<TensorId> = HashSet::default();
    let mut ops = Vec::with_capacity(keep.len());
    for &i in &keep {
        let op = &g.ops[i];
        let ins: Vec<TensorId> = op.inputs.iter().map(|x| *rename.get(x).unwrap_or(x)).collect();
        used.extend(ins.iter().copied());
        used.extend(op.outputs.iter().copied());
        ops.push(NamedOp { inputs: ins.iter().map(|&x| g.tensors[x].name.clone()).collect(), ..g.named(op) });
    }
    let tensors = g.tensors.iter().enumerate().filter(|(i, _)| used.contains(i)).map(|(_, t)| t.clone()).collect();
    let out = Graph::new(tensors, ops, &g.tensors[g.loss].name).ok()?;
    runner_graph::validate::validate(&out).ok()?;
    Some(out)
}
