//! Helpers shared by the sharded-execution tests (`tp.rs`, `pp.rs`, `fsdp.rs`,
//! `pp_memory.rs`, ...): the toy Llama with Megatron's parallel roles, a mesh of
//! thread-group handles, loading a rank's part of the unsharded weights and inputs, a
//! step on every rank with its memory report, and gradient comparison.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use runner_exec::collective::{Collective, ReduceOp, ThreadGroup};
use runner_exec::cpu::{Cpu, CpuBuffer};
use runner_exec::DeviceBuffer;
use runner_exec::executor::ADAMW_DEFAULT;
use runner_exec::{ExecError, ExecOptions, Executor, Input, MemoryReport};
use runner_graph::shard::{Layout, RankCoord, shard};
use runner_project::comm::comm_volume;
use runner_graph::{Graph, OpKind};

/// The toy Llama with Megatron's parallel roles ([`runner_exec::toy::with_roles`]).
pub fn with_roles(g: Graph, vocab_parallel: bool) -> Graph {
    runner_exec::toy::with_roles(g, vocab_parallel)
}

pub type Grads = HashMap<String, Vec<f32>>;
/// Named inputs: (name, u32 data, f32 data).
pub type Data = Vec<(String, Vec<u32>, Vec<f32>)>;

/// Half `k` (0 or 1) of every input of `data`: one of its two sequences (a data-parallel
/// rank's share of a batch of two).
pub fn half_of(data: &Data, k: usize) -> Data {
    data.iter()
        .map(|(n, u, f)| {
            let h = u.len() / 2;
            (n.clone(), u[k * h..(k + 1) * h].to_vec(), f.clone())
        })
        .collect()
}
pub type Groups = Vec<(String, Box<dyn Collective>)>;

pub fn options() -> ExecOptions {
    ExecOptions {
        seed: 3,
        ..ExecOptions::default()
    }
}

/// `data` as the executor's named inputs.
pub fn inputs(data: &Data) -> Vec<(&str, Input<'_>)> {
    data.iter()
        .map(|(n, u, _)| (n.as_str(), Input::U32(u)))
        .collect()
}

/// Every weight gradient of the last backward.
pub fn grads(ex: &Executor<Cpu>) -> Grads {
    ex.trainable()
        .into_iter()
        .map(|w| (w.clone(), ex.grad(&w).unwrap().unwrap()))
        .collect()
}

/// Loss and every weight gradient of one forward + backward + the step's gradient
/// reduction (nothing to reduce unsharded).
pub fn run(ex: &mut Executor<Cpu>, data: &Data) -> (f32, Grads) {
    let loss = ex.forward(&inputs(data)).unwrap();
    ex.backward().unwrap();
    ex.reduce_gradients().unwrap();
    (loss, grads(ex))
}

/// Losses of `n` training steps ([`Executor::step`]: reduction included).
pub fn train(ex: &mut Executor<Cpu>, data: &Data, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            ex.step(&inputs(data), &runner_exec::executor::ADAMW_DEFAULT)
                .unwrap()
        })
        .collect()
}

/// Every trainable weight's current value.
pub fn weights(ex: &Executor<Cpu>) -> Grads {
    ex.trainable()
        .into_iter()
        .map(|w| (w.clone(), ex.weight(&w).unwrap()))
        .collect()
}

/// The axis along which `local` splits `full` (None: replicated).
pub fn split_axis(full: &[u64], local: &[u64]) -> Option<usize> {
    assert_eq!(full.len(), local.len());
    full.iter().zip(local).position(|(f, l)| f != l)
}

/// Rank `r`'s part of `x` (shape `full`) along `axis`, `n` ranks.
pub fn slice<T: Copy>(x: &[T], full: &[u64], axis: usize, r: usize, n: usize) -> Vec<T> {
    let outer: usize = full[..axis].iter().product::<u64>() as usize;
    let inner: usize = full[axis..].iter().product::<u64>() as usize;
    let c = inner / n;
    (0..outer)
        .flat_map(|o| {
            x[o * inner + r * c..o * inner + (r + 1) * c]
                .iter()
                .copied()
        })
        .collect()
}

/// The ranks' parts concatenated along `axis` (inverse of [`slice`]).
pub fn gather(parts: &[Vec<f32>], full: &[u64], axis: usize) -> Vec<f32> {
    let outer: usize = full[..axis].iter().product::<u64>() as usize;
    let c = parts[0].len() / outer.max(1);
    (0..outer)
        .flat_map(|o| {
            parts
                .iter()
                .flat_map(move |p| p[o * c..(o + 1) * c].iter().copied())
        })
        .collect()
}

/// `got` matches `want` to 1e-5 of `want`'s largest magnitude.
pub fn close(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= 1e-5 * scale,
        "{name}: max |Δ| {worst:e} against max |grad| {scale:e}"
    );
}

/// Rank `r`'s part (of `tp`) of full tensor `w` whose rank-local shape is `local`. A
/// tensor split into fewer parts than tp (kv heads replicated over tp) gives each part
/// to tp/parts consecutive ranks.
pub fn part_of(w: &[f32], full: &[u64], local: &[u64], r: usize, tp: usize) -> Vec<f32> {
    match split_axis(full, local) {
        None => w.to_vec(),
        Some(ax) => {
            let parts = (full[ax] / local[ax]) as usize;
            slice(w, full, ax, r / (tp / parts), parts)
        }
    }
}

/// Set each weight of rank graph `s` to tp rank `r`'s part (of `tp`) of the unsharded
/// `weights` of `g` ([`part_of`]).
pub fn load_weights(
    ex: &mut Executor<Cpu>,
    g: &Graph,
    s: &Graph,
    weights: &Grads,
    r: usize,
    tp: usize,
) {
    for t in s.tensors.iter().filter(|t| t.kind.is_param()) {
        let fshape = &g.tensors[g.tensor_id(&t.name).unwrap()].shape;
        let w = &weights[&t.name];
        ex.set_weight(&t.name, &part_of(w, fshape, &t.shape, r, tp))
            .unwrap();
    }
}

/// The inputs rank graph `s` reads, those split over the sequence (SP) cut to tp rank
/// `r`'s shard.
pub fn rank_inputs(g: &Graph, s: &Graph, data: &Data, r: usize, tp: usize) -> Data {
    data.iter()
        .filter_map(|(n, u, f)| {
            let ls = &s.tensors[s.tensor_id(n)?].shape;
            let fs = &g.tensors[g.tensor_id(n).unwrap()].shape;
            Some(match split_axis(fs, ls) {
                None => (n.clone(), u.clone(), f.clone()),
                Some(ax) => (n.clone(), slice(u, fs, ax, r, tp), f.clone()),
            })
        })
        .collect()
}

/// Each rank's handles on a tensor-parallel group of `tp` ranks of the tiny toy (two kv
/// heads): `tp`, and at tp 4 the step's `tp-kv` all-reduce over the ranks sharing a kv
/// head.
pub fn tp_groups(tp: usize) -> Vec<Groups> {
    let mut groups: Vec<Groups> = ThreadGroup::new(tp).into_iter().map(|h| vec![("tp".to_string(), Box::new(h) as Box<dyn Collective>)]).collect();
    if tp == 4 {
        for pair in [[0usize, 1], [2, 3]] {
            for (&r, h) in pair.iter().zip(ThreadGroup::new(2)) {
                groups[r].push(("tp-kv".to_string(), Box::new(h)));
            }
        }
    }
    groups
}

/// One rank of a tp × pp × dp mesh: its coordinates and its handle on each group of more
/// than one rank it belongs to: `tp` (same stage and dp rank), `pp` (same tp and dp
/// rank), `pp-embed` (first and last stage), `dp` (same tp rank and stage).
pub struct MeshRank {
    pub coord: RankCoord,
    pub groups: Groups,
}

/// The ranks of a tp × pp × dp mesh in Megatron's order (tp fastest, then pp, then dp).
/// Every group's sends wait for their receive, as NCCL's do ([`ThreadGroup::rendezvous`]):
/// every sharded test here also shows that its order of pipeline sends and receives would
/// not hang GPUs (such an order times out after a minute, naming the send).
pub fn mesh(tp: u32, pp: u32, dp: u32) -> Vec<MeshRank> {
    let group = |n| ThreadGroup::rendezvous(n, std::time::Duration::from_secs(60));
    let at = |t: u32, p: u32, d: u32| ((d * pp + p) * tp + t) as usize;
    let n = (tp * pp * dp) as usize;
    let mut ranks: Vec<MeshRank> = (0..n)
        .map(|i| {
            let i = i as u32;
            MeshRank {
                coord: RankCoord {
                    tp: i % tp,
                    pp: i / tp % pp,
                    cp: 0,
                    dp: i / (tp * pp),
                },
                groups: Vec::new(),
            }
        })
        .collect();
    let push = |ranks: &mut Vec<MeshRank>, members: Vec<usize>, name: &str| {
        if members.len() < 2 {
            return;
        }
        for (m, h) in members.iter().zip(group(members.len())) {
            ranks[*m].groups.push((name.to_string(), Box::new(h)));
        }
    };
    for d in 0..dp {
        for p in 0..pp {
            push(&mut ranks, (0..tp).map(|t| at(t, p, d)).collect(), "tp");
        }
        for t in 0..tp {
            push(&mut ranks, (0..pp).map(|p| at(t, p, d)).collect(), "pp");
            if pp > 1 {
                push(&mut ranks, vec![at(t, 0, d), at(t, pp - 1, d)], "pp-embed");
            }
        }
    }
    for p in 0..pp {
        for t in 0..tp {
            push(&mut ranks, (0..dp).map(|d| at(t, p, d)).collect(), "dp");
        }
    }
    ranks
}

/// One step of `layout` over `data`'s micro-batches on every rank of its tp × pp × dp
/// mesh, each on its own thread with options `o`: each rank's coordinates and its memory
/// report after the step (what the memory-account tests compare, walked against measured).
pub fn step_memories(g: &Graph, layout: &Layout, data: &[Data], o: &ExecOptions) -> Vec<(RankCoord, MemoryReport)> {
    let hs: Vec<_> = mesh(layout.tp, layout.pp, layout.dp)
        .into_iter()
        .map(|r| {
            let s = shard(g, layout, r.coord).unwrap();
            let (t, n) = (r.coord.tp as usize, layout.tp as usize);
            let d: Vec<Data> = data.iter().map(|d| rank_inputs(g, &s.graph, d, t, n)).collect();
            let o = o.clone();
            std::thread::spawn(move || {
                let mut ex = Executor::for_rank(&s, Cpu::new(), o, r.groups).unwrap();
                let batches: Vec<_> = d.iter().map(inputs).collect();
                ex.step_micro_batches(&batches, &ADAMW_DEFAULT).unwrap();
                (r.coord, ex.memory())
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Stage-local expert coordinates of a rank of [`mesh`] (Megatron's expert layout: the
/// tp·dp ranks of a stage, tp fastest, renumbered with etp fastest, then ep, then edp):
/// (etp rank, ep rank, edp rank).
pub fn expert_coord(coord: RankCoord, tp: u32, ep: u32, etp: u32) -> (u32, u32, u32) {
    let l = coord.tp + tp * coord.dp;
    (l % etp, l / etp % ep, l / (etp * ep))
}

/// [`mesh`] plus the expert groups of expert parallelism `ep` and expert tensor
/// parallelism `etp`: `etp` (consecutive stage-local ranks splitting the same experts'
/// width), `ep` (the ranks of a stage that exchange tokens) and `edp` (the ranks of a
/// stage holding the same expert shards), each where it has more than one rank.
pub fn expert_mesh(tp: u32, pp: u32, dp: u32, ep: u32, etp: u32) -> Vec<MeshRank> {
    let mut ranks = mesh(tp, pp, dp);
    assert_eq!(
        (tp * dp) % (ep * etp),
        0,
        "ep·etp divides the tp·dp ranks of a stage"
    );
    let edp = tp * dp / (ep * etp);
    for p in 0..pp {
        let of = |ranks: &[MeshRank], pred: &dyn Fn((u32, u32, u32)) -> bool| -> Vec<usize> {
            (0..ranks.len())
                .filter(|&i| {
                    ranks[i].coord.pp == p && pred(expert_coord(ranks[i].coord, tp, ep, etp))
                })
                .collect()
        };
        let mut groups: Vec<(Vec<usize>, &str)> = Vec::new();
        for a in 0..ep {
            for b in 0..edp {
                groups.push((of(&ranks, &|(_, e, q)| (e, q) == (a, b)), "etp"));
            }
        }
        for a in 0..etp {
            for b in 0..edp {
                groups.push((of(&ranks, &|(t, _, q)| (t, q) == (a, b)), "ep"));
            }
        }
        for a in 0..etp {
            for b in 0..ep {
                groups.push((of(&ranks, &|(t, e, _)| (t, e) == (a, b)), "edp"));
            }
        }
        for (members, name) in groups {
            if members.len() < 2 {
                continue;
            }
            for (m, h) in members.iter().zip(ThreadGroup::new(members.len())) {
                ranks[*m].groups.push((name.to_string(), Box::new(h)));
            }
        }
    }
    ranks
}

/// A handle that counts its all-reduce calls and the elements every call moves, in
/// nccl-tests' S convention (the buffer of an all-reduce, the gathered output of an
/// all-gather, the whole input of a reduce-scatter or all-to-all, the message of a send
/// or receive), the size `comm_volume` prices.
pub struct Counting {
    inner: Box<dyn Collective>,
    all_reduces: Arc<AtomicUsize>,
    elems: Arc<AtomicUsize>,
}

impl Counting {
    fn count(&self, n: usize) {
        self.elems.fetch_add(n, Ordering::SeqCst);
    }
}

impl Collective<Cpu> for Counting {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn all_reduce(&self, dev: &Cpu, buf: &mut CpuBuffer, op: ReduceOp) -> Result<(), ExecError> {
        self.all_reduces.fetch_add(1, Ordering::SeqCst);
        self.count(buf.len());
        self.inner.all_reduce(dev, buf, op)
    }
    fn all_gather(&self, dev: &Cpu, input: &CpuBuffer, output: &mut CpuBuffer) -> Result<(), ExecError> {
        self.count(input.len() * self.size());
        self.inner.all_gather(dev, input, output)
    }
    fn reduce_scatter(&self, dev: &Cpu, input: &CpuBuffer, output: &mut CpuBuffer) -> Result<(), ExecError> {
        self.count(input.len());
        self.inner.reduce_scatter(dev, input, output)
    }
    fn all_to_all(&self, dev: &Cpu, input: &CpuBuffer, output: &mut CpuBuffer) -> Result<(), ExecError> {
        self.count(input.len());
        self.inner.all_to_all(dev, input, output)
    }
    fn all_to_all_v(
        &self,
        dev: &Cpu,
        input: &CpuBuffer,
        send_counts: &[usize],
        output: &mut CpuBuffer,
        recv_counts: &[usize],
    ) -> Result<(), ExecError> {
        self.count(input.len());
        self.inner.all_to_all_v(dev, input, send_counts, output, recv_counts)
    }
    fn broadcast(&self, dev: &Cpu, buf: &mut CpuBuffer, root: usize) -> Result<(), ExecError> {
        self.count(buf.len());
        self.inner.broadcast(dev, buf, root)
    }
    fn send(&self, dev: &Cpu, peer: usize, buf: &CpuBuffer) -> Result<(), ExecError> {
        self.count(buf.len());
        self.inner.send(dev, peer, buf)
    }
    fn recv(&self, dev: &Cpu, peer: usize, buf: &mut CpuBuffer) -> Result<(), ExecError> {
        self.inner.recv(dev, peer, buf)?;
        self.count(buf.len());
        Ok(())
    }
}

/// `groups` with every handle counted into `all_reduces` and `elems`.
pub fn counted(groups: Groups, all_reduces: &Arc<AtomicUsize>, elems: &Arc<AtomicUsize>) -> Groups {
    groups
        .into_iter()
        .map(|(name, inner)| {
            let c: Box<dyn Collective> = Box::new(Counting {
                inner,
                all_reduces: all_reduces.clone(),
                elems: elems.clone(),
            });
            (name, c)
        })
        .collect()
}

/// Elements `comm_volume` prices for rank graph `s`, every collective with its backward
/// conjugate, in the S convention [`Counting`] measures.
pub fn priced_elems(s: &Graph) -> usize {
    comm_volume(s)
        .iter()
        .map(|c| {
            let op = s.ops.iter().find(|o| o.name == c.op).unwrap();
            // The priced tensor's format: a send's message is its input (its output is
            // the pipeline token).
            let t = if op.kind == OpKind::Send {
                op.inputs[0]
            } else {
                op.outputs[0]
            };
            let one = (c.bytes / s.tensors[t].dtype.bytes()).round() as usize;
            one * if c.backward.is_some() { 2 } else { 1 }
        })
        .sum()
}
