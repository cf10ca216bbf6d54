//! Reverse-mode differentiation of a forward [`Graph`] into a [`BackwardPlan`]: plain
//! data, not closures, so the executor runs it, and memory accounting, the FLOP counter
//! and the projection can walk the same plan without running anything.
//!
//! The plan holds one [`BackwardStep`] per forward op that passes a gradient on, in
//! reverse execution order. Each step names the gradients of the op's outputs it
//! consumes, the gradients of the op's inputs it produces (with whether it overwrites or
//! adds: a tensor read by several ops, like the residual stream, a tied embedding table
//! or the hidden state shared with the MTP modules, collects one contribution per
//! reader), the forward tensors it reads, and the op-internal statistics the forward must
//! keep for it ([`Aux`]). Liveness follows: when each activation can be freed in the
//! forward, when each saved tensor and each gradient can be freed in the backward.
//!
//! Which tensors carry a gradient ([`needs_grad`]): float tensors that depend on a
//! trained weight and reach the loss. Integer tensors (tokens, targets, router indices) never do; a float output
//! that does not reach the loss (none in the builder's graphs) has a zero gradient,
//! which a step sees as `None`.
//!
//! Pipeline stages: a `recv` output counts as depending on a weight (the earlier
//! stages'), and a `recv` gets a step although it has no inputs (it writes no gradient;
//! the executor sends the one it consumes back to the producing stage). A `send`'s
//! scalar token reaches the loss, so its step consumes the seed and writes the gradient
//! of the sent activation (which the executor receives from the next stage).

use std::collections::HashSet;

use serde::Serialize;

use crate::ir::{DType, Graph, GraphError, Op, OpKind, TensorId, TensorKind};

/// One gradient a step writes: the gradient of forward input `slot` (tensor `tensor`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GradOut {
    /// Input position of the forward op.
    pub slot: usize,
    /// The forward tensor whose gradient this is.
    pub tensor: TensorId,
    /// Add into the gradient already there (an earlier step, in backward order, wrote
    /// it) instead of overwriting it.
    pub accumulate: bool,
}

/// Op-internal state the forward keeps for the backward (beyond graph tensors).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Aux {
    /// What it is: `rstd`, `mean`, `lse`, `probs`, `plan`.
    pub name: &'static str,
    /// Elements (4 bytes each on every backend: f32 statistics or u32 plan entries).
    pub elems: u64,
}

/// The backward of one forward op.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackwardStep {
    /// Index of the forward op in [`Graph::ops`].
    pub op: usize,
    pub kind: OpKind,
    /// Per output slot: the gradient tensor consumed (the gradient of that output), or
    /// `None` where the output carries no gradient (integer, or not reaching the loss).
    pub grads_in: Vec<Option<TensorId>>,
    /// Gradients of the op's inputs this step produces, in slot order.
    pub grads_out: Vec<GradOut>,
    /// Forward tensors (inputs, outputs or weights) this step reads.
    pub saved: Vec<TensorId>,
    /// Op-internal statistics saved by the forward for this step.
    pub aux: Vec<Aux>,
}

/// The backward pass of a graph, plus the liveness both passes follow.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackwardPlan {
    /// Steps in execution order (the reverse of the forward).
    pub steps: Vec<BackwardStep>,
    /// Per tensor: whether it carries a gradient.
    pub needs_grad: Vec<bool>,
    /// Per forward op: activations that can be freed right after it runs (no later
    /// forward op reads them and no backward step needs them).
    pub free_after_forward: Vec<Vec<TensorId>>,
    /// Per step: saved forward activations no later step reads.
    pub free_saved_after_step: Vec<Vec<TensorId>>,
    /// Per step: activation gradients complete and consumed after this step (the
    /// gradients of the step's op outputs). Weight gradients live until the optimizer.
    pub free_grads_after_step: Vec<Vec<TensorId>>,
    /// The loss, whose gradient (1) seeds the pass.
    pub loss: TensorId,
}

impl BackwardPlan {
    /// Forward tensors that some step reads (the activations to keep past the forward).
    pub fn saved_tensors(&self) -> HashSet<TensorId> {
        self.steps.iter().flat_map(|s| s.saved.iter().copied()).collect()
    }

    /// Total op-internal statistics kept from the forward to the backward, in elements.
    pub fn aux_elems(&self) -> u64 {
        self.steps.iter().flat_map(|s| &s.aux).map(|a| a.elems).sum()
    }
}

fn numel(g: &Graph, id: TensorId) -> u64 {
    g.tensors[id].numel()
}

fn rows(g: &Graph, id: TensorId) -> u64 {
    let t = &g.tensors[id];
    t.numel() / t.shape.last().copied().unwrap_or(1).max(1)
}

/// What op `op`'s backward reads from the forward, given which inputs need gradients.
fn saved_and_aux(g: &Graph, op: &Op, need: &[bool]) -> (Vec<TensorId>, Vec<Aux>) {
    let i = |s: usize| op.inputs[s];
    let o = |s: usize| op.outputs[s];
    let need_in = |s: usize| need.get(s).copied().unwrap_or(false);
    let mut saved = Vec::new();
    let mut aux = Vec::new();
    match op.kind {
        OpKind::Linear => {
            // dx = dy·W needs W; dW = dyᵀ·x needs x; db needs only dy.
            if need_in(0) {
                saved.push(i(1));
            }
            if need_in(1) {
                saved.push(i(0));
            }
        }
        OpKind::Embedding => saved.push(i(0)),
        OpKind::RmsNorm => {
            saved.extend([i(0), i(1)]);
            aux.push(Aux { name: "rstd", elems: rows(g, i(0)) });
        }
        OpKind::LayerNorm => {
            saved.extend([i(0), i(1)]);
            aux.push(Aux { name: "mean", elems: rows(g, i(0)) });
            aux.push(Aux { name: "rstd", elems: rows(g, i(0)) });
        }
        OpKind::Attention => {
            saved.extend([i(0), i(1), i(2), o(0)]);
            let q = &g.tensors[i(0)].shape;
            // lse (B,H,T): one log-sum-exp per query row and head.
            aux.push(Aux { name: "lse", elems: q[0] * q[1] * q[2] });
        }
        OpKind::SwiGlu | OpKind::GeGlu => saved.extend([i(0), i(1)]),
        // The pre-activation is recomputed from x, w and b.
        OpKind::CausalConv1d => saved.extend([i(0), i(1), i(2)]),
        // The scan's states are recomputed in the backward from its inputs; each chunk's
        // entering state (B·H·P·N per chunk) is kept, as the SSD kernels keep them.
        OpKind::SsmScan => {
            saved.extend([i(0), i(1), i(2), i(3), i(4), i(5), i(6)]);
            let x = &g.tensors[i(0)].shape;
            let n = g.tensors[i(2)].shape.get(3).copied().unwrap_or(1);
            let q = op.int("chunk").unwrap_or(1).max(1) as u64;
            let chunks = x.get(1).copied().unwrap_or(0).div_ceil(q);
            // Dimensions of two tensors: their product is not bounded by one's element count.
            let elems = [chunks, x[2], x[3], n].into_iter().fold(x[0], u64::saturating_mul);
            aux.push(Aux { name: "chunk-states", elems });
        }
        OpKind::Gelu | OpKind::SquaredRelu => saved.push(i(0)),
        OpKind::CrossEntropy => {
            saved.extend([i(0), i(1)]);
            aux.push(Aux { name: "lse", elems: rows(g, i(0)) });
        }
        OpKind::Router => {
            saved.push(o(1));
            aux.push(Aux { name: "probs", elems: numel(g, i(0)) });
        }
        // The routing plan is built from the indices once (at dispatch) and shared by the
        // grouped linears and the combine of the same indices; it is counted here, at
        // the dispatch that creates it (N·k order entries).
        OpKind::MoeDispatch => {
            saved.push(i(1));
            aux.push(Aux { name: "plan", elems: numel(g, i(1)) });
        }
        OpKind::GroupedLinear => {
            saved.push(i(2));
            if need_in(0) {
                saved.push(i(1));
            }
            if need_in(1) {
                saved.push(i(0));
            }
        }
        OpKind::MoeCombine => saved.extend([i(0), i(1), i(2)]),
        OpKind::Rotary
        | OpKind::Add
        | OpKind::Concat
        | OpKind::AllReduce
        | OpKind::AllGather
        | OpKind::ReduceScatter
        | OpKind::AllToAll
        | OpKind::Send
        | OpKind::Recv => {}
    }
    saved.dedup();
    (saved, aux)
}

/// Per tensor: whether it carries a gradient, i.e. it is a float tensor that depends on
/// a trained weight (a `recv` output counts: it carries the earlier stages', unless the
/// sharder marked it `no-grad` because none of theirs trains) and the loss depends on
/// it. Frozen weights ([`TensorKind::Frozen`]) start no gradient: the embedding and
/// layer inputs of a LoRA fine-tune before its first adapter carry none.
/// Tensor ids must be in range (as [`backward_plan`] checks).
pub fn needs_grad(g: &Graph) -> Vec<bool> {
    let nt = g.tensors.len();
    let float = |id: TensorId| g.tensors[id].dtype != DType::I32;
    let mut depends = vec![false; nt];
    for (id, t) in g.tensors.iter().enumerate() {
        depends[id] = t.kind == TensorKind::Weight && float(id);
    }
    for op in &g.ops {
        // A received activation carries the earlier stages' weights.
        let carried = op.kind == OpKind::Recv && op.flag("no-grad") != Some(true);
        if carried || op.inputs.iter().any(|&i| depends.get(i).copied().unwrap_or(false)) {
            for &o in &op.outputs {
                if o < nt {
                    depends[o] = float(o);
                }
            }
        }
    }
    let mut reaches = vec![false; nt];
    if g.loss < nt {
        reaches[g.loss] = true;
    }
    for op in g.ops.iter().rev() {
        if op.outputs.iter().any(|&o| reaches.get(o).copied().unwrap_or(false)) {
            for &i in &op.inputs {
                if i < nt {
                    reaches[i] = true;
                }
            }
        }
    }
    (0..nt).map(|i| depends[i] && reaches[i]).collect()
}

/// Derive the backward pass of `g`, which should have passed [`crate::validate::validate`].
///
/// # Errors
/// A tensor id out of range, or a loss that does not depend on any weight.
pub fn backward_plan(g: &Graph) -> Result<BackwardPlan, GraphError> {
    let nt = g.tensors.len();
    let bad = |problem: String| GraphError::Invalid { op: "(autodiff)".into(), problem };
    for op in &g.ops {
        if let Some(&id) = op.inputs.iter().chain(&op.outputs).find(|&&id| id >= nt) {
            return Err(bad(format!("operation '{}' refers to tensor id {id}, beyond the graph", op.name)));
        }
    }
    if g.loss >= nt {
        return Err(bad(format!("loss id {} is not a tensor of the graph", g.loss)));
    }
    let needs_grad = needs_grad(g);
    if !needs_grad[g.loss] {
        return Err(bad(format!("loss '{}' does not depend on any weight", g.tensors[g.loss].name)));
    }

    let mut steps = Vec::new();
    let mut written: HashSet<TensorId> = HashSet::new();
    for (oi, op) in g.ops.iter().enumerate().rev() {
        let grads_in: Vec<Option<TensorId>> = op.outputs.iter().map(|&o| needs_grad[o].then_some(o)).collect();
        if grads_in.iter().all(Option::is_none) {
            continue;
        }
        let need: Vec<bool> = op.inputs.iter().map(|&i| needs_grad[i]).collect();
        // A recv has no inputs, but its step sends the gradient back to the stage that
        // produced the activation.
        if !need.iter().any(|&n| n) && op.kind != OpKind::Recv {
            continue;
        }
        let grads_out = op
            .inputs
            .iter()
            .enumerate()
            .filter(|&(_, &t)| needs_grad[t])
            .map(|(slot, &tensor)| GradOut { slot, tensor, accumulate: !written.insert(tensor) })
            .collect();
        let (saved, aux) = saved_and_aux(g, op, &need);
        steps.push(BackwardStep { op: oi, kind: op.kind, grads_in, grads_out, saved, aux });
    }

    // Liveness. A saved activation is freed after the last step (in backward order)
    // that reads it; everything else after its last forward reader.
    let mut last_bwd: Vec<Option<usize>> = vec![None; nt];
    for (si, s) in steps.iter().enumerate() {
        for &t in &s.saved {
            last_bwd[t] = Some(si);
        }
    }
    let mut last_fwd: Vec<Option<usize>> = vec![None; nt];
    for (oi, op) in g.ops.iter().enumerate() {
        for &t in op.inputs.iter().chain(&op.outputs) {
            last_fwd[t] = Some(oi);
        }
    }
    let mut free_after_forward = vec![Vec::new(); g.ops.len()];
    let mut free_saved_after_step = vec![Vec::new(); steps.len()];
    for (t, tensor) in g.tensors.iter().enumerate() {
        // The loss is kept for the caller; weights and inputs belong to the caller too.
        if tensor.kind != TensorKind::Activation || t == g.loss {
            continue;
        }
        match (last_bwd[t], last_fwd[t]) {
            (Some(s), _) => free_saved_after_step[s].push(t),
            (None, Some(o)) => free_after_forward[o].push(t),
            (None, None) => {}
        }
    }
    let free_grads_after_step = steps
        .iter()
        .map(|s| s.grads_in.iter().flatten().copied().filter(|&t| g.tensors[t].kind != TensorKind::Weight).collect())
        .collect();
    Ok(BackwardPlan {
        steps,
        needs_grad,
        free_after_forward,
        free_saved_after_step,
        free_grads_after_step,
        loss: g.loss,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{op, t};
    use crate::ir::Attr;

    use DType::*;
    use TensorKind::*;

    /// embed -> norm -> linear, residual add with the embedding, tied head, loss.
    fn tied_residual() -> Graph {
        Graph::new(
            vec![
                t("tokens", &[2, 3], I32, Input),
                t("targets", &[2, 3], I32, Input),
                t("embed.weight", &[10, 4], BF16, Weight),
                t("embed", &[2, 3, 4], BF16, Activation),
                t("n.weight", &[4], BF16, Weight),
                t("n", &[2, 3, 4], BF16, Activation),
                t("lin.weight", &[4, 4], BF16, Weight),
                t("lin", &[2, 3, 4], BF16, Activation),
                t("res", &[2, 3, 4], BF16, Activation),
                t("logits", &[2, 3, 10], BF16, Activation),
                t("loss", &[], F32, Activation),
            ],
            vec![
                op("embed", OpKind::Embedding, &["tokens", "embed.weight"], &["embed"], &[]),
                op("n", OpKind::RmsNorm, &["embed", "n.weight"], &["n"], &[("eps", Attr::Float(1e-5))]),
                op("lin", OpKind::Linear, &["n", "lin.weight"], &["lin"], &[]),
                op("res", OpKind::Add, &["embed", "lin"], &["res"], &[]),
                op("head", OpKind::Linear, &["res", "embed.weight"], &["logits"], &[]),
                op("loss", OpKind::CrossEntropy, &["logits", "targets"], &["loss"], &[]),
            ],
            "loss",
        )
        .unwrap()
    }

    #[test]
    fn reverse_order_and_accumulation() {
        let g = tied_residual();
        crate::validate::validate(&g).unwrap();
        let p = backward_plan(&g).unwrap();
        let names: Vec<&str> = p.steps.iter().map(|s| g.ops[s.op].name.as_str()).collect();
        assert_eq!(names, ["loss", "head", "res", "lin", "n", "embed"]);
        let id = |n: &str| g.tensor_id(n).unwrap();
        // The tied table: the head writes its gradient first, the embedding adds.
        let head = &p.steps[1];
        assert!(head.grads_out.iter().any(|o| o.tensor == id("embed.weight") && !o.accumulate));
        let embed = &p.steps[5];
        assert_eq!(embed.grads_out, vec![GradOut { slot: 1, tensor: id("embed.weight"), accumulate: true }]);
        // The residual stream: `res` writes d(embed) first, the norm adds to it.
        assert!(p.steps[2].grads_out.iter().any(|o| o.tensor == id("embed") && !o.accumulate));
        assert!(p.steps[4].grads_out.iter().any(|o| o.tensor == id("embed") && o.accumulate));
        // Integer tensors never carry gradients; the embedding step produces no d(tokens).
        assert!(!p.needs_grad[id("tokens")] && !p.needs_grad[id("targets")]);
        // Norm saves rstd; loss saves lse; the residual add saves nothing.
        assert_eq!(p.steps[4].aux, vec![Aux { name: "rstd", elems: 6 }]);
        assert!(p.steps[2].saved.is_empty());
        // `lin` is read by no backward step: freed right after the add that reads it.
        assert!(p.free_after_forward[3].contains(&id("lin")));
        assert!(p.saved_tensors().contains(&id("logits")));
    }

    /// Pipeline stages: the first ends at a `send` whose token is its loss; the second
    /// starts at a `recv`. Both get the steps that move the gradient between them.
    #[test]
    fn pipeline_send_and_recv_get_steps() {
        let pp = |peer: i64| {
            vec![
                ("group", Attr::Text("pp".into())),
                ("group-size", Attr::Int(2)),
                ("peer", Attr::Int(peer)),
                ("tensor", Attr::Text("h".into())),
            ]
        };
        let first = Graph::new(
            vec![
                t("x", &[2, 4], F32, Input),
                t("w", &[4, 4], F32, Weight),
                t("h", &[2, 4], F32, Activation),
                t("h.sent", &[], F32, Activation),
            ],
            vec![
                op("lin", OpKind::Linear, &["x", "w"], &["h"], &[]),
                op("h.send", OpKind::Send, &["h"], &["h.sent"], &pp(1)),
            ],
            "h.sent",
        )
        .unwrap();
        crate::validate::validate(&first).unwrap();
        let p = backward_plan(&first).unwrap();
        let id = |g: &Graph, n: &str| g.tensor_id(n).unwrap();
        assert_eq!(p.steps[0].kind, OpKind::Send);
        assert_eq!(p.steps[0].grads_in, vec![Some(id(&first, "h.sent"))]);
        assert_eq!(p.steps[0].grads_out, vec![GradOut { slot: 0, tensor: id(&first, "h"), accumulate: false }]);

        let second = Graph::new(
            vec![
                t("h", &[2, 4], F32, Activation),
                t("w2", &[5, 4], F32, Weight),
                t("logits", &[2, 5], F32, Activation),
                t("y", &[2], I32, Input),
                t("loss", &[], F32, Activation),
            ],
            vec![
                op("h.recv", OpKind::Recv, &[], &["h"], &pp(0)),
                op("head", OpKind::Linear, &["h", "w2"], &["logits"], &[]),
                op("loss", OpKind::CrossEntropy, &["logits", "y"], &["loss"], &[]),
            ],
            "loss",
        )
        .unwrap();
        crate::validate::validate(&second).unwrap();
        let p = backward_plan(&second).unwrap();
        assert!(p.needs_grad[id(&second, "h")], "the received activation carries a gradient");
        let last = p.steps.last().unwrap();
        assert_eq!((last.kind, last.grads_in.clone()), (OpKind::Recv, vec![Some(id(&second, "h"))]));
        assert!(last.grads_out.is_empty());
        // The head writes d(h) (its input now needs one); the recv step consumes it.
        assert!(p.steps[1].grads_out.iter().any(|o| o.tensor == id(&second, "h")));
        assert!(p.free_grads_after_step[p.steps.len() - 1].contains(&id(&second, "h")));
    }

    /// A graph whose ids run past its tensors (a transform's bug) is an error, not a panic.
    #[test]
    fn ids_beyond_the_graph_are_errors() {
        let n = tied_residual().tensors.len();
        let mut g = tied_residual();
        g.ops[2].inputs[0] = n;
        assert!(backward_plan(&g).unwrap_err().to_string().contains(&format!("refers to tensor id {n}, beyond the graph")));
        let mut g = tied_residual();
        g.ops[5].outputs[0] = n;
        assert!(backward_plan(&g).is_err());
        let mut g = tied_residual();
        g.loss = n;
        assert!(backward_plan(&g).unwrap_err().to_string().contains("is not a tensor of the graph"));
    }

    #[test]
    fn loss_without_weights_is_an_error() {
        let g = Graph::new(
            vec![t("x", &[2, 5], F32, Input), t("y", &[2], I32, Input), t("loss", &[], F32, Activation)],
            vec![op("loss", OpKind::CrossEntropy, &["x", "y"], &["loss"], &[])],
            "loss",
        )
        .unwrap();
        assert!(backward_plan(&g).unwrap_err().to_string().contains("does not depend on any weight"));
    }

    /// What each step keeps, by the op's backward formulas, on a graph of B 2, T 3, C 8:
    /// LayerNorm its input and gain (x̂ needs x; the bias gradient needs only dy) with a
    /// mean and an rstd per row (6 each); GeLU its input; SwiGLU both inputs (once when
    /// they are one tensor); a linear whose input carries no gradient only that input
    /// (for dW), the head its weight and its input; the loss its logits, targets and one
    /// lse per row. A branch that does not reach the loss gets no step; a tensor kept by
    /// two steps is freed after the later one; the loss is never freed.
    #[test]
    fn each_step_keeps_what_its_backward_reads() {
        let g = Graph::new(
            vec![
                t("x", &[2, 3, 8], F32, Input),
                t("lw", &[8], F32, Weight),
                t("lb", &[8], F32, Weight),
                t("h", &[2, 3, 8], F32, Activation),
                t("a", &[2, 3, 8], F32, Activation),
                t("wx", &[8, 8], F32, Weight),
                t("p", &[2, 3, 8], F32, Activation),
                t("s", &[2, 3, 8], F32, Activation),
                t("r", &[2, 3, 8], F32, Activation),
                t("r2", &[2, 3, 8], F32, Activation),
                t("w3", &[4, 8], F32, Weight),
                t("dead", &[2, 3, 4], F32, Activation),
                t("w2", &[5, 8], F32, Weight),
                t("logits", &[2, 3, 5], F32, Activation),
                t("y", &[2, 3], I32, Input),
                t("loss", &[], F32, Activation),
            ],
            vec![
                op("ln", OpKind::LayerNorm, &["x", "lw", "lb"], &["h"], &[("eps", Attr::Float(1e-5))]),
                op("gelu", OpKind::Gelu, &["h"], &["a"], &[]),
                op("px", OpKind::Linear, &["x", "wx"], &["p"], &[]),
                op("sw1", OpKind::SwiGlu, &["a", "h"], &["s"], &[]),
                op("sum", OpKind::Add, &["s", "p"], &["r"], &[]),
                op("sw2", OpKind::SwiGlu, &["r", "r"], &["r2"], &[]),
                op("dead", OpKind::Linear, &["a", "w3"], &["dead"], &[]),
                op("head", OpKind::Linear, &["r2", "w2"], &["logits"], &[]),
                op("ce", OpKind::CrossEntropy, &["logits", "y"], &["loss"], &[]),
            ],
            "loss",
        )
        .unwrap();
        crate::validate::validate(&g).unwrap();
        let id = |n: &str| g.tensor_id(n).unwrap();
        let ids = |ns: &[&str]| ns.iter().map(|n| id(n)).collect::<Vec<_>>();
        let p = backward_plan(&g).unwrap();
        let names: Vec<&str> = p.steps.iter().map(|s| g.ops[s.op].name.as_str()).collect();
        assert_eq!(names, ["ce", "head", "sw2", "sum", "sw1", "px", "gelu", "ln"]);
        assert!(!p.needs_grad[id("dead")], "does not reach the loss");
        let step = |n: &str| p.steps.iter().find(|s| g.ops[s.op].name == n).unwrap();
        assert_eq!(step("ce").saved, ids(&["logits", "y"]));
        assert_eq!(step("ce").aux, [Aux { name: "lse", elems: 6 }]);
        assert_eq!(step("head").saved, ids(&["w2", "r2"]));
        assert_eq!(step("sw2").saved, ids(&["r"]));
        assert_eq!(
            step("sw2").grads_out,
            [GradOut { slot: 0, tensor: id("r"), accumulate: false }, GradOut { slot: 1, tensor: id("r"), accumulate: true }]
        );
        assert!(step("sum").saved.is_empty());
        assert_eq!(step("sw1").saved, ids(&["a", "h"]));
        assert_eq!(step("px").saved, ids(&["x"]));
        assert_eq!(step("px").grads_out, [GradOut { slot: 1, tensor: id("wx"), accumulate: false }]);
        assert_eq!(step("gelu").saved, ids(&["h"]));
        assert_eq!(step("ln").saved, ids(&["x", "lw"]));
        assert_eq!(step("ln").aux, [Aux { name: "mean", elems: 6 }, Aux { name: "rstd", elems: 6 }]);
        assert_eq!(p.aux_elems(), 18);
        // h is read by sw1's step (4) and gelu's (6): freed after gelu's.
        let freed_at = |t: TensorId| p.free_saved_after_step.iter().position(|f| f.contains(&t));
        assert_eq!(freed_at(id("h")), Some(6));
        assert_eq!(freed_at(id("logits")), Some(0));
        let all_freed: Vec<TensorId> = p.free_after_forward.iter().chain(&p.free_saved_after_step).flatten().copied().collect();
        assert!(!all_freed.contains(&id("loss")), "the loss is the caller's");
        assert!(p.free_after_forward[6].contains(&id("dead")));
    }

    /// The MoE and attention steps of the modules' test layers (B 1, T 8, C 16, 2 heads of
    /// 8, 4 experts, top-2): attention keeps q, k, v and its output and one lse per query
    /// row and head (8·2); the router its indices and the probabilities over all experts
    /// (8·4), writing no gradient for the integer indices; the dispatch the indices and
    /// its plan (8·2 entries); a grouped linear the indices, its weight and its input; the
    /// combine the experts' output, the routing weights and the indices; an RMSNorm its
    /// input and gain and an rstd per row (8).
    #[test]
    fn attention_and_moe_steps_keep_their_statistics() {
        let g = crate::modules::tests::layers();
        let id = |n: &str| g.tensor_id(n).unwrap();
        let ids = |ns: &[&str]| ns.iter().map(|n| id(n)).collect::<Vec<_>>();
        let p = backward_plan(&g).unwrap();
        let step = |n: &str| p.steps.iter().find(|s| g.ops[s.op].name == n).unwrap();
        assert_eq!(step("l0.core").saved, ids(&["q", "k", "v", "o"]));
        assert_eq!(step("l0.core").aux, [Aux { name: "lse", elems: 16 }]);
        assert!(!p.needs_grad[id("ri")]);
        assert_eq!(step("l1.router").grads_in, [Some(id("rw")), None]);
        assert_eq!(step("l1.router").saved, ids(&["ri"]));
        assert_eq!(step("l1.router").aux, [Aux { name: "probs", elems: 32 }]);
        assert_eq!(step("l1.dispatch").saved, ids(&["ri"]));
        assert_eq!(step("l1.dispatch").aux, [Aux { name: "plan", elems: 16 }]);
        assert_eq!(step("l1.eg").saved, ids(&["ri", "eg", "disp"]));
        assert_eq!(step("l1.combine").saved, ids(&["ed_o", "rw", "ri"]));
        assert_eq!(step("l0.n1").saved, ids(&["x", "n1"]));
        assert_eq!(step("l0.n1").aux, [Aux { name: "rstd", elems: 8 }]);
    }

    /// A received activation whose stages train nothing (`no-grad`) carries no gradient:
    /// the head writes none for it and the recv gets no step.
    #[test]
    fn a_no_grad_recv_carries_no_gradient() {
        let attrs = [("group", Attr::Text("pp".into())), ("peer", Attr::Int(0)), ("no-grad", Attr::Flag(true))];
        let g = Graph::new(
            vec![
                t("h", &[2, 4], F32, Activation),
                t("w2", &[5, 4], F32, Weight),
                t("logits", &[2, 5], F32, Activation),
                t("y", &[2], I32, Input),
                t("loss", &[], F32, Activation),
            ],
            vec![
                op("h.recv", OpKind::Recv, &[], &["h"], &attrs),
                op("head", OpKind::Linear, &["h", "w2"], &["logits"], &[]),
                op("loss", OpKind::CrossEntropy, &["logits", "y"], &["loss"], &[]),
            ],
            "loss",
        )
        .unwrap();
        let p = backward_plan(&g).unwrap();
        assert!(!p.needs_grad[g.tensor_id("h").unwrap()]);
        let names: Vec<&str> = p.steps.iter().map(|s| g.ops[s.op].name.as_str()).collect();
        assert_eq!(names, ["loss", "head"]);
        assert_eq!(p.steps[1].grads_out, [GradOut { slot: 1, tensor: g.tensor_id("w2").unwrap(), accumulate: false }]);
    }

    /// The embedding's backward scatters into the rows its indices name: it keeps them.
    #[test]
    fn the_embedding_keeps_its_indices() {
        let g = tied_residual();
        let p = backward_plan(&g).unwrap();
        let embed = p.steps.iter().find(|s| g.ops[s.op].name == "embed").unwrap();
        assert_eq!(embed.saved, [g.tensor_id("tokens").unwrap()]);
    }

    /// Which readers pass a gradient on, on a graph of N 4 rows of C 4 whose tensor `h` has
    /// three readers: a live linear with a frozen weight, and a two-linear branch that
    /// never reaches the loss. Derived by hand: the dead branch (d1, d2 and its weights)
    /// carries no gradient and gets no step, so the frozen linear alone writes d(h),
    /// overwriting; it keeps only its weight (dx = dy·W; no dW, so not its input). The
    /// grouped linear reads a plain input (no dx): it keeps the indices and its input,
    /// not its weight. Only trained weights get gradients. The saved tensors are the
    /// union over every step; of them only the activation `s` is freed (after the loss's
    /// step); the unsaved activations go after their last forward reader.
    #[test]
    fn dead_readers_and_frozen_weights_pass_no_gradient() {
        let g = Graph::new(
            vec![
                t("x", &[4, 4], F32, Input),
                t("w1", &[4, 4], F32, Weight),
                t("h", &[4, 4], F32, Activation),
                t("wd1", &[4, 4], F32, Weight),
                t("d1", &[4, 4], F32, Activation),
                t("wd2", &[4, 4], F32, Weight),
                t("d2", &[4, 4], F32, Activation),
                t("wf", &[4, 4], F32, Frozen),
                t("hf", &[4, 4], F32, Activation),
                t("xs", &[4, 4], F32, Input),
                t("idx", &[2, 2], I32, Input),
                t("ew", &[2, 4, 4], F32, Weight),
                t("ey", &[4, 4], F32, Activation),
                t("s", &[4, 4], F32, Activation),
                t("y", &[4], I32, Input),
                t("loss", &[], F32, Activation),
            ],
            vec![
                op("lin1", OpKind::Linear, &["x", "w1"], &["h"], &[]),
                op("dl1", OpKind::Linear, &["h", "wd1"], &["d1"], &[]),
                op("dl2", OpKind::Linear, &["d1", "wd2"], &["d2"], &[]),
                op("linf", OpKind::Linear, &["h", "wf"], &["hf"], &[]),
                op("gl", OpKind::GroupedLinear, &["xs", "ew", "idx"], &["ey"], &[]),
                op("sum", OpKind::Add, &["hf", "ey"], &["s"], &[]),
                op("ce", OpKind::CrossEntropy, &["s", "y"], &["loss"], &[]),
            ],
            "loss",
        )
        .unwrap();
        crate::validate::validate(&g).unwrap();
        let id = |n: &str| g.tensor_id(n).unwrap();
        let ids = |ns: &[&str]| ns.iter().map(|n| id(n)).collect::<Vec<_>>();
        let p = backward_plan(&g).unwrap();
        let grads: Vec<&str> = g.tensors.iter().zip(&p.needs_grad).filter(|(_, n)| **n).map(|(t, _)| t.name.as_str()).collect();
        assert_eq!(grads, ["w1", "h", "hf", "ew", "ey", "s", "loss"]);
        let names: Vec<&str> = p.steps.iter().map(|s| g.ops[s.op].name.as_str()).collect();
        assert_eq!(names, ["ce", "sum", "gl", "linf", "lin1"]);
        let out = |slot: usize, n: &str| GradOut { slot, tensor: id(n), accumulate: false };
        let want = [
            (id("loss"), vec![out(0, "s")], ids(&["s", "y"])),
            (id("s"), vec![out(0, "hf"), out(1, "ey")], vec![]),
            (id("ey"), vec![out(1, "ew")], ids(&["idx", "xs"])),
            (id("hf"), vec![out(0, "h")], ids(&["wf"])),
            (id("h"), vec![out(1, "w1")], ids(&["x"])),
        ];
        for (s, (gin, gout, saved)) in p.steps.iter().zip(want) {
            assert_eq!((&s.grads_in, &s.grads_out, &s.saved), (&vec![Some(gin)], &gout, &saved), "{}", g.ops[s.op].name);
        }
        let mut saved: Vec<TensorId> = p.saved_tensors().into_iter().collect();
        saved.sort_unstable();
        assert_eq!(saved, ids(&["x", "wf", "xs", "idx", "s", "y"]));
        assert_eq!(p.aux_elems(), 4, "one lse per row of the loss, nothing else");
        assert_eq!(p.free_saved_after_step, [ids(&["s"]), vec![], vec![], vec![], vec![]]);
        assert_eq!(p.free_after_forward, [vec![], vec![], ids(&["d1", "d2"]), ids(&["h"]), vec![], ids(&["hf", "ey"]), vec![]]);
        assert_eq!(p.free_grads_after_step, [ids(&["loss"]), ids(&["s"]), ids(&["ey"]), ids(&["hf"]), ids(&["h"])]);
    }

    /// An integer tensor never carries a gradient, even one held as a weight (indices kept
    /// with the model): only the float weight of the grouped linear gets one.
    #[test]
    fn an_integer_weight_carries_no_gradient() {
        let g = Graph::new(
            vec![
                t("xs", &[4, 4], F32, Input),
                t("ew", &[2, 4, 4], F32, Weight),
                t("idx", &[2, 2], I32, Weight),
                t("ey", &[4, 4], F32, Activation),
                t("y", &[4], I32, Input),
                t("loss", &[], F32, Activation),
            ],
            vec![
                op("gl", OpKind::GroupedLinear, &["xs", "ew", "idx"], &["ey"], &[]),
                op("ce", OpKind::CrossEntropy, &["ey", "y"], &["loss"], &[]),
            ],
            "loss",
        )
        .unwrap();
        crate::validate::validate(&g).unwrap();
        assert_eq!(needs_grad(&g), [false, true, false, true, false, true]);
        let p = backward_plan(&g).unwrap();
        assert_eq!(p.steps[1].grads_out, [GradOut { slot: 1, tensor: 1, accumulate: false }]);
    }
}
