//! An f64 interpreter of forward graphs, for the gradient tests: it evaluates the loss
//! with `runner_kernels::reference` (naive loops, f64 throughout), so central finite
//! differences of it are accurate to ~1e-10 and the f32 executor's gradients can be
//! checked against them with a tight tolerance.
//!
//! MoE routing (top-k) is piecewise constant; the tests perturb weights by 1e-4, far
//! too little to flip a selection at random init.

use std::collections::HashMap;

use runner_graph::{Graph, OpKind, TensorId, TensorKind};
use runner_kernels::cpu::attention::Attn;
use runner_kernels::cpu::moe::{Router, ScoreFn};
use runner_kernels::cpu::rope::Rope;
use runner_kernels::cpu::ssm::{Conv1d, Ssm, SsmInputs};
use runner_kernels::reference as r;

enum Val {
    F(Vec<f64>),
    U(Vec<u32>),
}

impl Val {
    fn f(&self) -> &[f64] {
        match self {
            Val::F(v) => v,
            Val::U(_) => panic!("expected a float tensor"),
        }
    }
    fn u(&self) -> &[u32] {
        match self {
            Val::U(v) => v,
            Val::F(_) => panic!("expected an int tensor"),
        }
    }
}

fn bcast(out_lead: &[u64], src_lead: &[u64], row: usize) -> usize {
    let (mut rr, mut idx, mut stride) = (row, 0usize, 1usize);
    for ax in (0..out_lead.len()).rev() {
        let d = out_lead[ax] as usize;
        let i = rr % d;
        rr /= d;
        if src_lead[ax] != 1 {
            idx += i * stride;
        }
        stride *= src_lead[ax] as usize;
    }
    idx
}

/// Sorted row → slot order (stable by expert), as the kernels' dispatch plan.
fn order(idx: &[u32], e: usize) -> Vec<usize> {
    let mut o: Vec<usize> = (0..idx.len()).collect();
    o.sort_by_key(|&s| (idx[s] as usize).min(e));
    o
}

/// The loss of `g` in f64 for the given weights (by name) and int inputs (by name).
pub fn loss(
    g: &Graph,
    weights: &HashMap<String, Vec<f64>>,
    ints: &HashMap<String, Vec<u32>>,
) -> f64 {
    let mut v: Vec<Option<Val>> = (0..g.tensors.len()).map(|_| None).collect();
    for (id, t) in g.tensors.iter().enumerate() {
        match t.kind {
            TensorKind::Weight | TensorKind::Frozen => v[id] = Some(Val::F(weights[&t.name].clone())),
            TensorKind::Input => v[id] = ints.get(&t.name).map(|x| Val::U(x.clone())),
            TensorKind::Activation => {}
        }
    }
    let shape = |id: TensorId| g.tensors[id].shape.clone();
    let last = |id: TensorId| *g.tensors[id].shape.last().unwrap_or(&1) as usize;
    for op in &g.ops {
        let i = |s: usize| v[op.inputs[s]].as_ref().unwrap();
        let out: Vec<Val> = match op.kind {
            OpKind::Linear => {
                let w = shape(op.inputs[1]);
                let (n, k) = (w[0] as usize, w[1] as usize);
                let m = i(0).f().len() / k;
                let mut y = r::matmul(i(0).f(), i(1).f(), m, n, k, false, true);
                if op.inputs.len() > 2 {
                    for row in y.chunks_mut(n) {
                        for (a, b) in row.iter_mut().zip(i(2).f()) {
                            *a += b;
                        }
                    }
                }
                vec![Val::F(y)]
            }
            OpKind::Embedding => vec![Val::F(r::embedding(i(0).u(), i(1).f(), last(op.inputs[1])))],
            OpKind::RmsNorm => vec![Val::F(r::rmsnorm(
                i(0).f(),
                i(1).f(),
                last(op.inputs[0]),
                op.float("eps").unwrap(),
            ))],
            OpKind::LayerNorm => {
                vec![Val::F(r::layernorm(
                    i(0).f(),
                    i(1).f(),
                    i(2).f(),
                    last(op.inputs[0]),
                    op.float("eps").unwrap(),
                ))]
            }
            OpKind::Rotary => {
                let s = shape(op.inputs[0]);
                let rp = Rope {
                    b: s[0] as usize,
                    t: s[1] as usize,
                    h: s[2] as usize,
                    d: s[3] as usize,
                    rot_dim: op.int("rot-dim").unwrap() as usize,
                    theta: op.float("theta").unwrap() as f32,
                    pos_offset: 0,
                    cp: None,
                };
                vec![Val::F(r::rope(i(0).f(), &rp))]
            }
            OpKind::Attention => {
                let (q, k, vv) = (
                    shape(op.inputs[0]),
                    shape(op.inputs[1]),
                    shape(op.inputs[2]),
                );
                let w = op.int("window").unwrap();
                let a = Attn {
                    b: q[0] as usize,
                    t: q[1] as usize,
                    h: q[2] as usize,
                    hkv: k[2] as usize,
                    d: q[3] as usize,
                    dv: vv[3] as usize,
                    causal: op.flag("causal").unwrap(),
                    window: (w > 0).then_some(w as usize),
                    scale: op.float("scale").unwrap() as f32,
                    cp: None,
                };
                vec![Val::F(r::attention(i(0).f(), i(1).f(), i(2).f(), &a).0)]
            }
            OpKind::SwiGlu => vec![Val::F(r::swiglu(i(0).f(), i(1).f()))],
            OpKind::GeGlu => vec![Val::F(
                r::gelu(i(0).f())
                    .iter()
                    .zip(i(1).f())
                    .map(|(a, b)| a * b)
                    .collect(),
            )],
            OpKind::Gelu => vec![Val::F(r::gelu(i(0).f()))],
            OpKind::SquaredRelu => vec![Val::F(r::squared_relu(i(0).f()))],
            OpKind::Add => vec![Val::F(
                i(0).f().iter().zip(i(1).f()).map(|(a, b)| a + b).collect(),
            )],
            OpKind::Concat => {
                let (a, b, o) = (op.inputs[0], op.inputs[1], op.outputs[0]);
                let (so, sa, sb) = (shape(o), shape(a), shape(b));
                let rk = so.len() - 1;
                let (la, lb, lo) = (last(a), last(b), last(o));
                let rows = g.tensors[o].numel() as usize / lo;
                let mut y = Vec::with_capacity(rows * lo);
                for row in 0..rows {
                    let (ra, rb) = (
                        bcast(&so[..rk], &sa[..rk], row),
                        bcast(&so[..rk], &sb[..rk], row),
                    );
                    y.extend_from_slice(&i(0).f()[ra * la..(ra + 1) * la]);
                    y.extend_from_slice(&i(1).f()[rb * lb..(rb + 1) * lb]);
                }
                vec![Val::F(y)]
            }
            OpKind::CrossEntropy => vec![Val::F(vec![
                r::cross_entropy(i(0).f(), i(1).u(), last(op.inputs[0])).2,
            ])],
            OpKind::Router => {
                let e = last(op.inputs[0]);
                let rt = Router {
                    n: i(0).f().len() / e,
                    e,
                    k: op.int("top-k").unwrap() as usize,
                    score: if op.text("score") == Some("sigmoid") {
                        ScoreFn::Sigmoid
                    } else {
                        ScoreFn::Softmax
                    },
                    normalize_topk: op.flag("normalize").unwrap(),
                };
                let (_, idx, w) = r::router(i(0).f(), &rt);
                vec![Val::F(w), Val::U(idx)]
            }
            OpKind::MoeDispatch => {
                let idx = i(1).u();
                let k = shape(op.inputs[1])[1] as usize;
                let c = last(op.outputs[0]);
                let o = order(idx, op.int("experts").unwrap() as usize);
                let x = i(0).f();
                vec![Val::F(
                    o.iter()
                        .flat_map(|&s| x[(s / k) * c..(s / k + 1) * c].to_vec())
                        .collect(),
                )]
            }
            OpKind::GroupedLinear => {
                let w = shape(op.inputs[1]);
                let (e, n_out, k_in) = (w[0] as usize, w[1] as usize, w[2] as usize);
                let idx = i(2).u();
                let o = order(idx, e);
                let (x, wv) = (i(0).f(), i(1).f());
                let mut y = vec![0.0; o.len() * n_out];
                for (row, &slot) in o.iter().enumerate() {
                    let ex = idx[slot] as usize;
                    for j in 0..n_out {
                        let wr = &wv[(ex * n_out + j) * k_in..][..k_in];
                        y[row * n_out + j] = x[row * k_in..][..k_in]
                            .iter()
                            .zip(wr)
                            .map(|(a, b)| a * b)
                            .sum();
                    }
                }
                vec![Val::F(y)]
            }
            OpKind::MoeCombine => {
                let c = last(op.inputs[0]);
                let idx = i(2).u();
                let k = shape(op.inputs[2])[1] as usize;
                let e = idx.iter().map(|&x| x as usize + 1).max().unwrap_or(1);
                let o = order(idx, e);
                let mut inv = vec![0; o.len()];
                for (row, &s) in o.iter().enumerate() {
                    inv[s] = row;
                }
                let (ys, w) = (i(0).f(), i(1).f());
                let n = idx.len() / k;
                let mut y = vec![0.0; n * c];
                for t in 0..n {
                    for j in 0..k {
                        let row = inv[t * k + j];
                        for ch in 0..c {
                            y[t * c + ch] += w[t * k + j] * ys[row * c + ch];
                        }
                    }
                }
                vec![Val::F(y)]
            }
            OpKind::CausalConv1d => {
                let x = shape(op.inputs[0]);
                let s = Conv1d {
                    b: x[0] as usize,
                    t: x[1] as usize,
                    c: x[2..].iter().product::<u64>() as usize,
                    k: shape(op.inputs[1])[1] as usize,
                };
                vec![Val::F(r::causal_conv1d(i(0).f(), i(1).f(), i(2).f(), &s))]
            }
            OpKind::SsmScan => {
                let (x, bm) = (shape(op.inputs[0]), shape(op.inputs[2]));
                let s = Ssm {
                    b: x[0] as usize,
                    t: x[1] as usize,
                    h: x[2] as usize,
                    p: x[3] as usize,
                    g: bm[2] as usize,
                    n: bm[3] as usize,
                    chunk: op.int("chunk").unwrap() as usize,
                };
                let inputs = SsmInputs {
                    x: i(0).f(),
                    dt: i(1).f(),
                    bm: i(2).f(),
                    cm: i(3).f(),
                    a_log: i(4).f(),
                    d: i(5).f(),
                    dt_bias: i(6).f(),
                };
                vec![Val::F(r::ssm_scan(inputs, &s))]
            }
            k => panic!("reference interpreter has no {k:?}"),
        };
        for (&o, val) in op.outputs.iter().zip(out) {
            v[o] = Some(val);
        }
    }
    v[g.loss].as_ref().unwrap().f()[0]
}
