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
    // Which stream is which: where in its layer a tensor is made (the op's place among
    // the layer's ops, the output's slot).
    let mut made_at: HashMap<TensorId, (usize, usize)> = HashMap::default();
    let mut ops_seen = vec![0usize; n];
    for (i, op) in g.ops.iter().enumerate() {
        if let Place::Layer(l) = places[i] {
            let p = pos[&l];
            for (slot, &o) in op.outputs.iter().enumerate() {
                made_at.insert(o, (ops_seen[p], slot));
            }
            ops_seen[p] += 1;
        }
    }
    // Where the last layer and layer k-1 are alike, each stream the head reads takes the
    // one made at the same place in layer k-1: paired by order of first read instead, a
    // head reading s before x where layer k reads x before s would cross them. Layers of
    // different classes have no such correspondence; their streams pair in order, and
    // the shape and dtype check below refuses what cannot be.
    let pairs: Vec<(TensorId, TensorId)> = if d.class[n - 1] == d.class[k - 1] {
        into_post
            .iter()
            .map(|a| into_k.iter().find(|&b| made_at.get(b) == made_at.get(a)).map(|&b| (*a, b)))
            .collect::<Option<_>>()?
    } else {
        into_post.iter().copied().zip(into_k.iter().copied()).collect()
    };
    let mut rename: HashMap<TensorId, TensorId> = HashMap::default();
    for &(a, b) in &pairs {
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

#[cfg(test)]
mod tests {
    use super::*;
    use runner_graph::{DType, Role, Tensor, TensorKind};

    const T: u64 = 8;
    const C: u64 = 4;
    const V: u64 = 16;

    /// How one layer of the test graph differs from the plain one: `h = fc(x)`,
    /// `x' = x + h` (and with `side`, `s' = s + h`).
    #[derive(Clone, Copy, PartialEq)]
    enum L {
        Plain,
        /// `x' = h + x`: the same ops, shapes and dtypes, wired the other way round.
        Swapped,
        /// `h` in F32 (only a produced tensor's dtype differs).
        WideH,
        /// Its weight a graph input (no gradient, as a frozen weight has none, but no
        /// parameter either).
        InputWeight,
        Frozen,
        /// Its GEMM carrying an attribute.
        Tagged,
    }

    /// What the head reads: the last layer's x; x and a layer position's side stream s
    /// (in that order, or s first); the last x twice.
    #[derive(Clone, Copy, PartialEq)]
    enum Head {
        X,
        Xs(usize),
        Sx(usize),
        Xx,
    }

    /// Embedding (plus a pre-side projection where `proj`), the layers, then the head
    /// reading the last layer's `x` and, where `head_s` names a layer position, that
    /// layer's side stream `s` (every layer carries one where `side`).
    fn net(layers: &[L], proj: bool, side: bool, head: Head) -> Graph {
        net_s(layers, proj, side, head, DType::BF16, [1, T, C])
    }

    /// [`net`] with the side stream at dtype `sd` and shape `ss`.
    fn net_s(layers: &[L], proj: bool, side: bool, head: Head, sd: DType, ss: [u64; 3]) -> Graph {
        let mut tensors = Vec::new();
        let mut ten = |name: &str, s: Vec<u64>, d: DType, k: TensorKind| tensors.push(Tensor { name: name.into(), shape: s, dtype: d, kind: k });
        let act = |n: &str| (n.to_string(), vec![1, T, C]);
        let mut ops = Vec::new();
        let op = |name: &str, k: OpKind, i: &[&str], o: &[&str], layer: i32| NamedOp::of(name, k, i, o, &[], layer, Role::Replicated);
        let tagged = |name: &str, i: &[&str], o: &[&str], layer: i32| NamedOp::of(name, OpKind::Linear, i, o, &[("tag", runner_graph::Attr::Int(1))], layer, Role::Replicated);
        ten("tokens", vec![1, T], DType::I32, TensorKind::Input);
        ten("targets", vec![1, T], DType::I32, TensorKind::Input);
        ten("table", vec![V, C], DType::BF16, TensorKind::Weight);
        ten("head", vec![V, C], DType::BF16, TensorKind::Weight);
        ten("logits", vec![1, T, V], DType::BF16, TensorKind::Activation);
        ten("loss", vec![], DType::F32, TensorKind::Activation);
        for n in ["e0", "x0", "z"] {
            let (n, s) = act(n);
            ten(&n, s, DType::BF16, TensorKind::Activation);
        }
        ten("s0", ss.to_vec(), sd, TensorKind::Activation);
        ten("wp", vec![C, C], DType::BF16, TensorKind::Weight);
        ops.push(op("embed", OpKind::Embedding, &["tokens", "table"], &[if proj { "e0" } else { "x0" }], -1));
        if proj {
            ops.push(op("proj", OpKind::Linear, &["e0", "wp"], &["x0"], -1));
        }
        if side {
            ops.push(op("side", OpKind::Add, &["x0", "x0"], &["s0"], -1));
        }
        for (p, &l) in layers.iter().enumerate() {
            let (x, h, w, y, s, s1) = (format!("x{p}"), format!("h{p}"), format!("w{p}"), format!("x{}", p + 1), format!("s{p}"), format!("s{}", p + 1));
            let wk = match l {
                L::InputWeight => TensorKind::Input,
                L::Frozen => TensorKind::Frozen,
                _ => TensorKind::Weight,
            };
            ten(&w, vec![C, C], DType::BF16, wk);
            ten(&h, vec![1, T, C], if l == L::WideH { DType::F32 } else { DType::BF16 }, TensorKind::Activation);
            ten(&y, vec![1, T, C], DType::BF16, TensorKind::Activation);
            let layer = 10 + p as i32;
            ops.push(if l == L::Tagged { tagged(&format!("fc{p}"), &[&x, &w], &[&h], layer) } else { op(&format!("fc{p}"), OpKind::Linear, &[&x, &w], &[&h], layer) });
            let ins: [&str; 2] = if l == L::Swapped { [&h, &x] } else { [&x, &h] };
            ops.push(op(&format!("add{p}"), OpKind::Add, &ins, &[&y], layer));
            if side {
                ten(&s1, ss.to_vec(), sd, TensorKind::Activation);
                ops.push(op(&format!("sadd{p}"), OpKind::Add, &[&s, &h], &[&s1], layer));
            }
        }
        let last = format!("x{}", layers.len());
        match head {
            Head::X => ops.push(op("head", OpKind::Linear, &[&last, "head"], &["logits"], -1)),
            Head::Xs(_) | Head::Sx(_) | Head::Xx => {
                let s = match head {
                    Head::Xs(q) | Head::Sx(q) => format!("s{}", q + 1),
                    _ => last.clone(),
                };
                let ins: [&str; 2] = if matches!(head, Head::Sx(_)) { [&s, &last] } else { [&last, &s] };
                ops.push(op("mix", OpKind::Add, &ins, &["z"], -1));
                ops.push(op("head", OpKind::Linear, &["z", "head"], &["logits"], -1));
            }
        }
        ops.push(op("loss", OpKind::CrossEntropy, &["logits", "targets"], &["loss"], -1));
        let g = Graph::new(tensors, ops, "loss").unwrap();
        runner_graph::validate::validate(&g).unwrap();
        g
    }

    fn names(g: &Graph) -> Vec<&str> {
        g.ops.iter().map(|o| o.name.as_str()).collect()
    }

    /// Four alike layers are one class: the reduced graph keeps the first, and the head
    /// reads its output. GEMM names fall on their side: a pre-side projection's on the
    /// embedding side, the head's on the head side, each layer's its own.
    #[test]
    fn alike_layers_are_one_class_and_the_reduced_graph_keeps_the_first() {
        let g = net(&[L::Plain; 4], true, false, Head::X);
        let d = analyse(&g);
        assert_eq!(d.layers, vec![10, 11, 12, 13]);
        assert_eq!((d.class.clone(), d.reps.clone(), d.prefix), (vec![0; 4], vec![0], 1));
        assert_eq!(d.pre_gemms, vec!["proj".to_string()]);
        assert_eq!(d.post_gemms, vec!["head".to_string()]);
        for p in 0..4 {
            assert_eq!(d.gemm_names[p], vec![format!("fc{p}")]);
        }
        let r = reduce(&g, &d).expect("reducible");
        assert_eq!(names(&r), ["embed", "proj", "fc0", "add0", "head", "loss"]);
        let head = &r.ops[4];
        assert_eq!(r.tensors[head.inputs[0]].name, "x1");
    }

    /// Layers that differ only in which earlier op feeds an input, in one produced
    /// tensor's dtype, or in what kind of tensor an outside input is, are classes of
    /// their own: the shortest prefix holding each is kept.
    #[test]
    fn wiring_an_inner_dtype_or_an_inputs_kind_make_a_class() {
        for (one, other, what) in [
            (L::Plain, L::Swapped, "wiring"),
            (L::Plain, L::WideH, "inner dtype"),
            (L::Plain, L::Tagged, "an attribute"),
            (L::Frozen, L::InputWeight, "outside input's kind"),
        ] {
            let g = net(&[one, other, one, other, one], false, false, Head::X);
            let d = analyse(&g);
            assert_eq!((d.class.clone(), d.reps.clone(), d.prefix), (vec![0, 1, 0, 1, 0], vec![0, 1], 2), "{what}");
            let r = reduce(&g, &d).expect("reducible");
            assert_eq!(names(&r), ["embed", "fc0", "add0", "fc1", "add1", "head", "loss"], "{what}");
        }
        // A frozen first layer (no gradient into the embedding side either way) is a
        // class apart from trained ones.
        let d = analyse(&net(&[L::Frozen, L::Plain, L::Plain], false, false, Head::X));
        assert_eq!((d.class, d.reps, d.prefix), (vec![0, 1, 1], vec![0, 1], 2));
    }

    /// Every layer a class of its own keeps all of them: nothing to reduce.
    #[test]
    fn no_repeat_no_reduction() {
        let g = net(&[L::Frozen, L::Plain], false, false, Head::X);
        let d = analyse(&g);
        assert_eq!(d.prefix, 2);
        assert!(reduce(&g, &d).is_none());
    }

    /// Two streams between layers (x and s): the head reading both of the last layer's
    /// is rewired to the kept layer's; the head reading a stream of a removed layer
    /// other than the last, or fewer streams than a layer passes on, is not reduced.
    #[test]
    fn the_head_is_rewired_only_where_its_interface_is_a_layers() {
        let layers = [L::Plain; 4];
        let g = net(&layers, false, true, Head::Xs(3));
        let d = analyse(&g);
        assert_eq!((d.reps.clone(), d.prefix), (vec![0], 1));
        let r = reduce(&g, &d).expect("reducible");
        assert_eq!(names(&r), ["embed", "side", "fc0", "add0", "sadd0", "mix", "head", "loss"]);
        let mix = &r.ops[5];
        let read: Vec<&str> = mix.inputs.iter().map(|&t| r.tensors[t].name.as_str()).collect();
        assert_eq!(read, ["x1", "s1"]);
        // The head reads layer 2's side stream (a removed layer, not the last).
        let g = net(&layers, false, true, Head::Xs(2));
        assert!(reduce(&g, &analyse(&g)).is_none());
        // The head reads x alone, where layer 1 reads x and s from layer 0.
        let g = net(&layers, false, true, Head::X);
        assert!(reduce(&g, &analyse(&g)).is_none());
        // The head reads the last x twice: one tensor of the interface.
        let g = net(&layers, false, false, Head::Xx);
        let r = reduce(&g, &analyse(&g)).expect("reducible");
        assert_eq!(names(&r), ["embed", "fc0", "add0", "mix", "head", "loss"]);
        // The head reads s then x, where a layer reads x then s: each stream pairs with
        // its own (s4 with s1, x4 with x1), not by order of reading, whether s is like x
        // (where order would cross them silently) or differs in dtype or shape (where it
        // would refuse to reduce).
        for (sd, ss) in [(DType::BF16, [1, T, C]), (DType::F32, [1, T, C]), (DType::BF16, [1, C, T])] {
            let g = net_s(&layers, false, true, Head::Sx(3), sd, ss);
            let r = reduce(&g, &analyse(&g)).expect("reducible");
            let mix = &r.ops[5];
            assert_eq!((mix.name.as_str(), r.tensors[mix.inputs[0]].name.as_str(), r.tensors[mix.inputs[1]].name.as_str()), ("mix", "s1", "x1"), "{sd:?} {ss:?}");
        }
    }
}
