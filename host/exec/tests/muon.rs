//! Muon under the executor's layouts on the CPU, every rank a thread: where each rank
//! holds whole matrices after the gradient reduction (data parallel, pipeline stages),
//! and where tensor-parallel ranks gather their blocks of each matrix, it trains as the
//! unsharded full batch does; the data-parallel ranks deal the matrices' updates
//! between them; and under FSDP, whose flat pieces cut across the matrices, the ranks
//! gather their pieces of each matrix's update.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{Data, Grads, Groups, counted, gather, grads, half_of, inputs, load_weights, mesh, options, rank_inputs, split_axis, tp_groups, weights, with_roles};
use runner_exec::collective::{Collective, ThreadGroup};
use runner_exec::cpu::Cpu;
use runner_exec::device::{Device, Elem};
use runner_exec::executor::{ADAMW_DEFAULT, MUON_DEFAULT, Muon, MuonTpMode, Optimizer, newton_schulz};
use runner_exec::proxy::synthetic_inputs;
use runner_exec::toy::{self, ToyConfig};
use runner_exec::{AdamW, Executor};
use runner_graph::shard::{Layout, RankCoord, Sharded, shard};
use runner_graph::{Graph, OpKind};

const H: AdamW = AdamW { lr: 1e-2, ..ADAMW_DEFAULT };

fn llama(batch: u64, tied: bool) -> Graph {
    with_roles(toy::llama(&ToyConfig { batch, tied, ..ToyConfig::tiny() }), false)
}

/// `steps` steps of `opt` on the unsharded full batch: the losses and the weights.
fn unsharded(g: &Graph, data: &Data, opt: Optimizer, steps: usize) -> (Vec<f32>, Grads, Grads) {
    let mut ex = Executor::new(g, Cpu::new(), options()).unwrap();
    ex.set_optimizer(opt).unwrap();
    let w0 = weights(&ex);
    let losses = (0..steps).map(|_| ex.step(&inputs(data), &H).unwrap()).collect();
    (losses, w0, weights(&ex))
}

/// A rank graph's tensor shapes by name.
type Shapes = std::collections::HashMap<String, Vec<u64>>;

/// Weight `name` of `g` whole, from the weights and shapes of tp ranks 0, 1, ... in
/// order: a replicated weight is rank 0's, a split one its blocks joined; ranks sharing
/// a block (kv heads replicated over tp) must hold the same values.
fn whole_weight(g: &Graph, name: &str, ranks: &[(&Grads, &Shapes)]) -> Vec<f32> {
    let full = &g.tensors[g.tensor_id(name).unwrap()].shape;
    let Some(ax) = split_axis(full, &ranks[0].1[name]) else {
        return ranks[0].0[name].clone();
    };
    let parts = (full[ax] / ranks[0].1[name][ax]) as usize;
    let rep = ranks.len() / parts;
    for (r, (w, _)) in ranks.iter().enumerate() {
        assert_eq!(w[name], ranks[r - r % rep].0[name], "{name}: tp rank {r} differs from the rank it shares a block with");
    }
    let blocks: Vec<Vec<f32>> = (0..parts).map(|j| ranks[j * rep].0[name].clone()).collect();
    gather(&blocks, full, ax)
}

/// The largest difference between two runs' weights, and where.
fn worst(a: &Grads, b: &Grads) -> (f32, String) {
    let mut out = (0f32, String::new());
    for (name, v) in a {
        let d = v.iter().zip(&b[name]).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        if d > out.0 {
            out = (d, name.clone());
        }
    }
    out
}

/// One rank of a test mesh, as [`on_ranks`] hands it to its body.
struct Rank {
    coord: RankCoord,
    shard: Sharded,
    ex: Executor<Cpu>,
    /// This rank's inputs.
    data: Data,
    /// Elements its `tp` handle has moved so far (nccl-tests' S convention, `counted`).
    tp_elems: Arc<AtomicUsize>,
}

/// `body` on every rank of `layout` over `g` (the tp × pp × dp mesh), each in its own
/// thread with an executor of its shard (`w0`'s weights loaded, where given) and its
/// inputs of `data` (a data-parallel rank's half where `halve`); the results in mesh
/// order.
fn on_ranks<T: Send + 'static>(g: &Graph, layout: &Layout, data: &Data, halve: bool, w0: Option<&Grads>, body: impl Fn(Rank) -> T + Send + Sync + 'static) -> Vec<T> {
    let body = std::sync::Arc::new(body);
    let tp = layout.tp as usize;
    let hs: Vec<_> = mesh(layout.tp, layout.pp, layout.dp)
        .into_iter()
        .map(|m| {
            let shard = shard(g, layout, m.coord).unwrap();
            let data = if halve { half_of(data, m.coord.dp as usize) } else { data.clone() };
            let (g, w0, body, r) = (g.clone(), w0.cloned(), body.clone(), m.coord.tp as usize);
            std::thread::spawn(move || {
                // The tp handle counted, so a test can tell what Muon moves over it.
                let (tp_group, mut groups): (Groups, Groups) = m.groups.into_iter().partition(|(n, _)| n == "tp");
                let tp_elems = Arc::new(AtomicUsize::new(0));
                groups.extend(counted(tp_group, &Arc::new(AtomicUsize::new(0)), &tp_elems));
                let mut ex = Executor::for_rank(&shard, Cpu::new(), options(), groups).unwrap();
                if let Some(w0) = &w0 {
                    load_weights(&mut ex, &g, &shard.graph, w0, r, tp);
                }
                let data = rank_inputs(&g, &shard.graph, &data, r, tp);
                body(Rank { coord: m.coord, shard, ex, data, tp_elems })
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Three Muon steps at dp 2 (pp 1 and 2, a tied embedding split over the first and
/// last stage; and pp 2 with FSDP) track the unsharded full batch within 1e-5, where
/// AdamW's three steps are 1e-3 away: each matrix's update is one rank's, from the same
/// reduced gradient (or, under FSDP, every rank's from the gathered pieces).
#[test]
fn muon_data_parallel_and_pipeline_track_unsharded() {
    let (full_g, half_g) = (llama(2, true), llama(1, true));
    let data = synthetic_inputs(&full_g, 29);
    let (want, w0, w3) = unsharded(&full_g, &data, Optimizer::Muon(MUON_DEFAULT), 3);
    let adamw = unsharded(&full_g, &data, Optimizer::AdamW, 3).2;
    let (apart, _) = worst(&adamw, &w3);
    assert!(apart > 1e-3, "AdamW and Muon are {apart} apart: the check below would not tell them apart");
    for (pp, fsdp) in [(1u32, false), (2, false), (2, true)] {
        let layout = Layout { dp: 2, pp, fsdp, ..Layout::single(1, 2) };
        let out = on_ranks(&half_g, &layout, &data, true, Some(&w0), move |Rank { shard, mut ex, data, .. }| {
            assert_eq!(ex.fsdp_sharded(), fsdp);
            ex.set_optimizer(Optimizer::Muon(MUON_DEFAULT)).unwrap();
            let last = shard.graph.ops.iter().any(|o| o.kind == OpKind::CrossEntropy);
            let losses: Vec<f32> = (0..3).map(|_| ex.step(&inputs(&data), &H).unwrap()).collect();
            let muon = ex.trainable().into_iter().filter(|w| ex.takes_muon(w)).count();
            (last, losses, ex.gather_weights().unwrap(), muon)
        });
        let lasts: Vec<&Vec<f32>> = out.iter().filter(|o| o.0).map(|o| &o.1).collect();
        assert_eq!(lasts.len(), 2);
        for i in 0..3 {
            let mean = (lasts[0][i] + lasts[1][i]) / 2.0;
            assert!((mean - want[i]).abs() <= 1e-5 * want[i], "pp {pp}, fsdp {fsdp}, step {i}: mean over dp {mean} vs unsharded {}", want[i]);
        }
        for (_, _, w, muon) in &out {
            assert!(*muon > 0, "pp {pp}, fsdp {fsdp}: every stage holds hidden matrices");
            let (d, name) = worst(w, &w3);
            assert!(d < 1e-5, "pp {pp}, fsdp {fsdp}: {name} drifted from the unsharded Muon run by {d:e}");
        }
    }
}

/// Three Muon steps at tp 2 and at tp 4 (2 kv heads: each kv projection's block held
/// by 2 ranks), vocab-parallel embedding and head, track the unsharded run within 1e-5:
/// each rank gathers the blocks of every hidden matrix (row blocks of the q, k, v, gate
/// and up projections, column blocks of o and down); one rank of the tp group runs
/// Newton–Schulz on the whole (the ranks deal the matrices) and broadcasts it, and each
/// keeps its block. Ranks that share a kv block end equal.
#[test]
fn muon_tensor_parallel_gathers_blocks_and_tracks_unsharded() {
    let g = with_roles(toy::llama(&ToyConfig::tiny()), true);
    let data = synthetic_inputs(&g, 31);
    let (want, w0, w3) = unsharded(&g, &data, Optimizer::Muon(MUON_DEFAULT), 3);
    for tp in [2usize, 4] {
        let layout = Layout { tp: tp as u32, ..Layout::single(2, 2) };
        let hs: Vec<_> = tp_groups(tp)
            .into_iter()
            .enumerate()
            .map(|(r, groups)| {
                let coord = runner_graph::shard::RankCoord { tp: r as u32, ..Default::default() };
                let s = shard(&g, &layout, coord).unwrap();
                let (g, w0, data) = (g.clone(), w0.clone(), data.clone());
                std::thread::spawn(move || {
                    let mut ex = Executor::for_rank(&s, Cpu::new(), options(), groups).unwrap();
                    ex.set_optimizer(Optimizer::Muon(MUON_DEFAULT)).unwrap();
                    load_weights(&mut ex, &g, &s.graph, &w0, r, tp);
                    let d = rank_inputs(&g, &s.graph, &data, r, tp);
                    let losses: Vec<f32> = (0..3).map(|_| ex.step(&inputs(&d), &H).unwrap()).collect();
                    let shapes: Shapes = s.graph.tensors.iter().map(|t| (t.name.clone(), t.shape.clone())).collect();
                    let split = ex.trainable().into_iter().filter(|w| ex.takes_muon(w) && shapes[w] != g.tensors[g.tensor_id(w).unwrap()].shape).count();
                    let ns: Vec<String> = ex.trainable().into_iter().filter(|w| ex.orthogonalises(w)).collect();
                    (losses, weights(&ex), shapes, split, ns)
                })
            })
            .collect();
        let out: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        // The tp ranks deal the whole matrices' Newton–Schulz between them: each runs
        // on one rank, which broadcasts it.
        let mut runs: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for o in &out {
            assert!(!o.4.is_empty(), "tp {tp}: a rank orthogonalises nothing: {:?}", out.iter().map(|o| &o.4).collect::<Vec<_>>());
            for w in &o.4 {
                *runs.entry(w.as_str()).or_default() += 1;
            }
        }
        assert!(runs.len() >= 14 && runs.values().all(|&n| n == 1), "tp {tp}: {runs:?}");
        for (r, (losses, _, _, split, _)) in out.iter().enumerate() {
            assert!(*split >= 14, "tp {tp} rank {r}: {split} split matrices take Muon (7 a layer)");
            for (i, (a, b)) in losses.iter().zip(&want).enumerate() {
                assert!((a - b).abs() <= 1e-5 * b.abs(), "tp {tp} rank {r} step {i}: loss {a} vs unsharded {b}");
            }
        }
        let ranks: Vec<(&Grads, &Shapes)> = out.iter().map(|o| (&o.1, &o.2)).collect();
        for (name, want) in &w3 {
            let got = whole_weight(&g, name, &ranks);
            let d = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(d < 1e-5, "tp {tp}: {name} drifted from the unsharded Muon run by {d:e}");
        }
    }
}

/// Three Muon steps at dp 2 and at tp 2 × dp 2, with and without FSDP, track the
/// unsharded full batch within 1e-5, where AdamW's three steps are 1e-3 away.
///
/// Without FSDP the data-parallel ranks deal the matrices between them (Megatron's
/// layer-wise distributed optimizer): each matrix's owner alone keeps its momentum,
/// runs its Newton–Schulz (at tp 2 with the owner's tp peers, which own the same
/// matrices) and broadcasts the update, so each rank's optimizer state lacks the
/// momentum of the matrices the other owns, the two ranks' lacks sum to one momentum
/// per matrix, and the weights end equal on both. Under FSDP each rank keeps a flat
/// piece of each unit, so the pieces' Nesterov updates are all-gathered into the whole
/// matrices (and, at tp 2, the blocks further over tp), each orthogonalised by the rank
/// it is dealt to and broadcast, and each rank applies its own range. Either way each
/// matrix's Newton–Schulz runs on one rank.
#[test]
fn muon_data_parallel_deals_matrices_or_fsdp_gathers_pieces_and_tracks_unsharded() {
    for (tp, fsdp) in [(1u32, true), (2, true), (1, false), (2, false)] {
        let (full_g, half_g) = if tp == 1 {
            (llama(2, false), llama(1, false))
        } else {
            let g = |batch| with_roles(toy::llama(&ToyConfig { batch, ..ToyConfig::tiny() }), true);
            (g(2), g(1))
        };
        let data = synthetic_inputs(&full_g, 37);
        let (want, w0, w3) = unsharded(&full_g, &data, Optimizer::Muon(MUON_DEFAULT), 3);
        let adamw = unsharded(&full_g, &data, Optimizer::AdamW, 3).2;
        let (apart, _) = worst(&adamw, &w3);
        assert!(apart > 1e-3, "AdamW and Muon are {apart} apart: the check below would not tell them apart");
        let layout = Layout { tp, dp: 2, fsdp, ..Layout::single(1, 2) };
        let out = on_ranks(&half_g, &layout, &data, true, Some(&w0), move |Rank { coord, shard: s, mut ex, data, .. }| {
            assert_eq!(ex.fsdp_sharded(), fsdp);
            ex.set_optimizer(Optimizer::Muon(MUON_DEFAULT)).unwrap();
            // What AdamW would hold (value, gradient, two moments) less this
            // rank's state: one word per Muon matrix element, two where
            // another rank updates it.
            let adamw_state: u64 = ex.trainable().iter().map(|w| 16 * s.graph.tensors[s.graph.tensor_id(w).unwrap()].numel()).sum();
            let muon_bytes: u64 = ex.trainable().iter().filter(|w| ex.takes_muon(w)).map(|w| 4 * s.graph.tensors[s.graph.tensor_id(w).unwrap()].numel()).sum();
            let lent = adamw_state - ex.memory().state_bytes - muon_bytes;
            let losses: Vec<f32> = (0..3).map(|_| ex.step(&inputs(&data), &H).unwrap()).collect();
            let muon = ex.trainable().into_iter().filter(|w| ex.takes_muon(w)).count();
            let shapes: Shapes = s.graph.tensors.iter().map(|t| (t.name.clone(), t.shape.clone())).collect();
            let ns: Vec<String> = ex.trainable().into_iter().filter(|w| ex.orthogonalises(w)).collect();
            (coord, losses, ex.gather_weights().unwrap(), muon, shapes, (lent, muon_bytes), ns)
        });
        for (i, &want) in want.iter().enumerate() {
            for t in 0..tp {
                let l: Vec<f32> = out.iter().filter(|o| o.0.tp == t).map(|o| o.1[i]).collect();
                let mean = (l[0] + l[1]) / 2.0;
                assert!((mean - want).abs() <= 1e-5 * want, "tp {tp} rank {t}, step {i}: mean over dp {mean} vs unsharded {want}");
            }
        }
        for o in &out {
            assert!(o.3 >= 14, "tp {tp}: {} matrices take Muon (7 a layer)", o.3);
        }
        // Each matrix's Newton–Schulz runs on one rank of the tp × dp mesh, dealt
        // about evenly, with or without FSDP.
        let mut runs: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for o in &out {
            for w in &o.6 {
                *runs.entry(w.as_str()).or_default() += 1;
            }
        }
        assert_eq!(runs.len(), out[0].3, "tp {tp}, fsdp {fsdp}: some matrix is orthogonalised nowhere: {runs:?}");
        assert!(runs.values().all(|&n| n == 1), "tp {tp}, fsdp {fsdp}: {runs:?}");
        let per_rank: Vec<usize> = out.iter().map(|o| o.6.len()).collect();
        assert!(per_rank.iter().all(|&n| 3 * n >= out[0].3 / per_rank.len()), "tp {tp}, fsdp {fsdp}: {per_rank:?}");
        if !fsdp {
            // The dp peers of each tp rank lack one momentum per matrix between them,
            // dealt about evenly (the toy's largest matrix is well under half).
            for t in 0..tp {
                // Rank (tp t, dp d) sits at d·tp + t.
                let ((lent0, muon), (lent1, muon1)) = (out[t as usize].5, out[(tp + t) as usize].5);
                assert_eq!(muon, muon1);
                assert_eq!(lent0 + lent1, muon, "tp rank {t}: the dp ranks lend {lent0} and {lent1} bytes of {muon} Muon bytes");
                assert!(lent0.min(lent1) * 3 >= muon, "tp rank {t}: {lent0} and {lent1} bytes lent: not dealt evenly");
            }
        }
        // Rank (tp t, dp d) sits at d·tp + t: dp rank 0's tp ranks hold the blocks.
        let ranks: Vec<(&Grads, &Shapes)> = out[..tp as usize].iter().map(|o| (&o.2, &o.4)).collect();
        for (name, want) in &w3 {
            let (full, local) = (&full_g.tensors[full_g.tensor_id(name).unwrap()].shape, &out[0].4[name]);
            let got = whole_weight(&full_g, name, &ranks);
            let d = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(d < 1e-5, "tp {tp}: {name} drifted from the unsharded Muon run by {d:e}");
            for o in &out {
                if o.0.tp == 0 || split_axis(full, local).is_none() {
                    let mine = &o.2[name];
                    let first = &out[o.0.tp as usize].2[name];
                    assert_eq!(mine, first, "tp {tp}: {name} differs over dp");
                }
            }
        }
    }
}

/// A tensor-parallel rank made without the sharding's weight splits cannot tell where its
/// blocks lie: Muon is refused naming Executor::for_rank.
#[test]
fn muon_on_a_tp_rank_needs_the_weight_splits() {
    let g = llama(2, false);
    let layout = Layout { tp: 2, ..Layout::single(2, 2) };
    let s = shard(&g, &layout, runner_graph::shard::RankCoord::default()).unwrap();
    let groups: Vec<(String, Box<dyn Collective>)> = vec![("tp".to_string(), Box::new(ThreadGroup::new(2).remove(0)))];
    let mut ex = Executor::with_collectives(&s.graph, Cpu::new(), options(), groups).unwrap();
    let e = ex.set_optimizer(Optimizer::Muon(MUON_DEFAULT)).unwrap_err().to_string();
    assert!(e.contains("Executor::for_rank"), "{e}");
}

/// A data-parallel rank that chose Muon, then AdamW before its first step, holds
/// AdamW's two moments again for the matrices it had lent to its peer, and trains as
/// the unsharded AdamW run does.
#[test]
fn adamw_after_muon_on_a_dp_rank_brings_back_the_lent_state() {
    let (full_g, half_g) = (llama(2, false), llama(1, false));
    let data = synthetic_inputs(&full_g, 41);
    let (want, w0, w2) = unsharded(&full_g, &data, Optimizer::AdamW, 2);
    let layout = Layout { dp: 2, ..Layout::single(1, 2) };
    let out = on_ranks(&half_g, &layout, &data, true, Some(&w0), |Rank { mut ex, data, .. }| {
        let adamw_state = ex.memory().state_bytes;
        ex.set_optimizer(Optimizer::Muon(MUON_DEFAULT)).unwrap();
        let muon_state = ex.memory().state_bytes;
        ex.set_optimizer(Optimizer::AdamW).unwrap();
        assert_eq!(ex.memory().state_bytes, adamw_state, "under Muon the rank held {muon_state}");
        let losses: Vec<f32> = (0..2).map(|_| ex.step(&inputs(&data), &H).unwrap()).collect();
        (losses, weights(&ex))
    });
    for (i, want) in want.iter().enumerate() {
        let mean = (out[0].0[i] + out[1].0[i]) / 2.0;
        assert!((mean - want).abs() <= 1e-5 * want, "step {i}: mean over dp {mean} vs unsharded {want}");
    }
    for (_, w) in &out {
        let (d, name) = worst(w, &w2);
        assert!(d < 1e-5, "{name} drifted from the unsharded AdamW run by {d:e}");
    }
}

/// Where Muon's update sets a rank's peak (wide matrices, two tokens a rank), the memory
/// account's required bytes are the peak the device saw, to its constant scalars: at
/// tp 2, the rank's block of the update, the gathered blocks and the whole's
/// Newton–Schulz scratch; under FSDP at dp 2 and at tp 2 × dp 2, besides, the unit's
/// chunk of the updates and their gathered copy. (At dp 2 without FSDP the reduction's
/// flat buffer of every gradient outgrows any one matrix's update.)
///
/// Under blockwise (tp 2, and tp 2 × dp 2 with FSDP) each rank's update is its block's
/// alone, no gathered blocks: the account is its block's Newton–Schulz scratch, and
/// still the peak.
#[test]
fn muon_memory_account_matches_the_peak_where_the_update_sets_it() {
    use MuonTpMode::{Blockwise, Exact};
    for (tp, dp, fsdp, tp_mode) in [(2u32, 1u32, false, Exact), (1, 2, true, Exact), (2, 2, true, Exact), (2, 1, false, Blockwise), (2, 2, true, Blockwise)] {
        let g = with_roles(toy::llama(&ToyConfig { layers: 1, ffn: 2048, seq: 2, batch: 1, ..ToyConfig::tiny() }), tp > 1);
        let data = synthetic_inputs(&g, 43);
        let layout = Layout { tp, dp, fsdp, ..Layout::single(1, 2) };
        let muon = Optimizer::Muon(Muon { tp_mode, ..MUON_DEFAULT });
        let run = |opt: Optimizer| {
            on_ranks(&g, &layout, &data, false, None, move |Rank { mut ex, data, .. }| {
                ex.set_optimizer(opt).unwrap();
                for _ in 0..2 {
                    ex.step(&inputs(&data), &H).unwrap();
                }
                ex.memory()
            })
        };
        let (muon, adamw) = (run(muon), run(Optimizer::AdamW));
        for (r, (m, a)) in muon.iter().zip(&adamw).enumerate() {
            let at = format!("tp {tp}, dp {dp}, fsdp {fsdp}, {tp_mode:?}, rank {r}");
            // The passes hold the same above the state under either optimizer: more
            // above Muon's is its update's.
            assert!(m.peak_bytes - m.state_bytes > a.peak_bytes - a.state_bytes, "{at}: the update does not set the peak: {m:?} vs AdamW's {a:?}");
            assert!(m.peak_bytes <= m.required_bytes + runner_exec::executor::CONSTANT_BYTES, "under-counted: {at}: {m:?}");
            assert!(m.required_bytes <= m.peak_bytes, "over-counted: {at}: {m:?}");
        }
    }
}

/// Muon's gathers and broadcasts count in the step's communication time: at tp 2 × dp 2
/// (and with FSDP) the optimizer adds to what the passes and the gradient reduction
/// spent in collective calls; AdamW's optimizer calls none, so adds nothing.
#[test]
fn muon_collectives_count_in_the_communication_time() {
    let g = with_roles(toy::llama(&ToyConfig { batch: 1, ..ToyConfig::tiny() }), true);
    let data = synthetic_inputs(&g, 47);
    for fsdp in [false, true] {
        let layout = Layout { tp: 2, dp: 2, fsdp, ..Layout::single(1, 2) };
        let run = |opt: Optimizer| {
            on_ranks(&g, &layout, &data, false, None, move |Rank { mut ex, data, .. }| {
                ex.set_optimizer(opt).unwrap();
                ex.forward(&inputs(&data)).unwrap();
                ex.backward().unwrap();
                ex.reduce_gradients().unwrap();
                let before = ex.profile().communication_s;
                ex.optimizer_step(&H).unwrap();
                (before, ex.profile().communication_s)
            })
        };
        for (r, ((mb, ma), (ab, aa))) in run(Optimizer::Muon(MUON_DEFAULT)).into_iter().zip(run(Optimizer::AdamW)).enumerate() {
            assert!(mb > 0.0 && ma > mb, "fsdp {fsdp}, rank {r}: Muon's optimizer took {ma} - {mb} s of collectives");
            assert_eq!(aa, ab, "fsdp {fsdp}, rank {r}: AdamW's optimizer calls no collective");
        }
    }
}

/// Muon with blockwise tensor-parallel mode.
fn blockwise() -> Optimizer {
    Optimizer::Muon(Muon { tp_mode: MuonTpMode::Blockwise, ..MUON_DEFAULT })
}

/// Without tensor parallelism every matrix is whole, so the blockwise mode is the exact
/// one bit for bit: unsharded, at dp 2 (the matrices dealt) and at dp 2 with FSDP.
#[test]
fn muon_blockwise_without_tensor_parallelism_is_exact_bit_for_bit() {
    let (full_g, half_g) = (llama(2, false), llama(1, false));
    let data = synthetic_inputs(&full_g, 51);
    let (exact, w0, we) = unsharded(&full_g, &data, Optimizer::Muon(MUON_DEFAULT), 3);
    let (block, _, wb) = unsharded(&full_g, &data, blockwise(), 3);
    assert_eq!(exact, block);
    assert_eq!(we, wb);
    for fsdp in [false, true] {
        let layout = Layout { dp: 2, fsdp, ..Layout::single(1, 2) };
        let run = |opt: Optimizer| {
            on_ranks(&half_g, &layout, &data, true, Some(&w0), move |Rank { mut ex, data, .. }| {
                ex.set_optimizer(opt).unwrap();
                let losses: Vec<f32> = (0..3).map(|_| ex.step(&inputs(&data), &H).unwrap()).collect();
                let ns: Vec<String> = ex.trainable().into_iter().filter(|w| ex.orthogonalises(w)).collect();
                (losses, ex.gather_weights().unwrap(), ns)
            })
        };
        let (e, b) = (run(Optimizer::Muon(MUON_DEFAULT)), run(blockwise()));
        for (r, (e, b)) in e.iter().zip(&b).enumerate() {
            assert_eq!(e.0, b.0, "fsdp {fsdp}, rank {r}: losses");
            assert!(e.1 == b.1, "fsdp {fsdp}, rank {r}: the weights differ");
            assert_eq!(e.2, b.2, "fsdp {fsdp}, rank {r}: the deal differs");
        }
    }
}

/// One blockwise step at tp 2 from the same weights: each rank's Muon matrices move by
/// the update of its own block alone, computed here from the rank's reduced gradient
/// (momentum zero, so U = G + μ·G) through `newton_schulz` on the block and the block's
/// 0.2·√max(m, n) scale (Megatron-Core's blockwise); the gate, up and down blocks,
/// whose long side the split halves, would be off by √2 with the whole's scale. Both tp
/// ranks orthogonalise every matrix and the optimizer moves nothing over `tp`, where
/// the exact mode gathers the blocks, orthogonalises each matrix on one rank, and ends
/// elsewhere.
#[test]
fn muon_blockwise_at_tp_2_updates_each_block_from_its_own_newton_schulz() {
    let g = with_roles(toy::llama(&ToyConfig::tiny()), true);
    let data = synthetic_inputs(&g, 53);
    let (_, w0, _) = unsharded(&g, &data, Optimizer::AdamW, 0);
    let layout = Layout { tp: 2, ..Layout::single(2, 2) };
    let run = |opt: Optimizer| {
        on_ranks(&g, &layout, &data, false, Some(&w0), move |Rank { shard, mut ex, data, tp_elems, .. }| {
            ex.set_optimizer(opt).unwrap();
            let before = weights(&ex);
            ex.forward(&inputs(&data)).unwrap();
            ex.backward().unwrap();
            ex.reduce_gradients().unwrap();
            let grad = grads(&ex);
            let passes = tp_elems.load(Ordering::SeqCst);
            ex.optimizer_step(&H).unwrap();
            let moved = tp_elems.load(Ordering::SeqCst) - passes;
            let shapes: Shapes = shard.graph.tensors.iter().map(|t| (t.name.clone(), t.shape.clone())).collect();
            let muon: Vec<String> = ex.trainable().into_iter().filter(|w| ex.takes_muon(w)).collect();
            let ns: Vec<String> = ex.trainable().into_iter().filter(|w| ex.orthogonalises(w)).collect();
            (before, grad, weights(&ex), shapes, muon, ns, moved)
        })
    };
    let (block, exact) = (run(blockwise()), run(Optimizer::Muon(MUON_DEFAULT)));
    let dev = Cpu::new();
    let (mu, lr) = (MUON_DEFAULT.momentum, H.lr);
    let decay = 1.0 - H.lr * H.weight_decay;
    let mut rescaled = 0;
    for (r, (before, grad, after, shapes, muon, ns, moved)) in block.iter().enumerate() {
        assert!(muon.len() >= 14, "rank {r}: {muon:?}");
        assert_eq!(ns, muon, "rank {r}: blockwise, every tp rank orthogonalises each of its blocks");
        assert_eq!(*moved, 0, "rank {r}: blockwise Muon moved {moved} elements over tp");
        for name in muon {
            let (rows, cols) = (shapes[name][0] as usize, shapes[name][1] as usize);
            let full = &g.tensors[g.tensor_id(name).unwrap()].shape;
            let u: Vec<f32> = grad[name].iter().map(|&x| x * mu + x).collect();
            let mut o = dev.alloc(Elem::F32, u.len()).unwrap();
            dev.write_f32(&mut o, &u).unwrap();
            newton_schulz(&dev, &mut o, rows, cols, MUON_DEFAULT.ns_steps).unwrap();
            let o = dev.read_f32(&o).unwrap();
            let want = |long: u64| -> Vec<f32> {
                let step = -lr * 0.2 * (long as f32).sqrt();
                before[name].iter().zip(&o).map(|(&w, &o)| w * decay + step * o).collect()
            };
            // The change against the change wanted: f32 rounding apart.
            let off = |want: &[f32]| {
                let dw = want.iter().zip(&before[name]).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                after[name].iter().zip(want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / dw
            };
            let e = off(&want(rows.max(cols) as u64));
            assert!(e < 1e-4, "rank {r}: {name} {rows} x {cols} is {e} off its block's update");
            if rows.max(cols) as u64 != full[0].max(full[1]) {
                rescaled += 1;
                let whole = off(&want(full[0].max(full[1])));
                assert!(whole > 0.1, "rank {r}: {name}: the whole's scale is only {whole} off");
            }
        }
    }
    assert!(rescaled >= 2 * 6, "{rescaled} blocks whose scale the split changes (gate, up and down a layer, each rank)");
    // The exact mode gathers over tp, deals the Newton–Schulz and ends elsewhere.
    let mut runs: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (r, ((_, _, we, shapes, _, ns, moved), (_, _, wb, _, _, _, _))) in exact.iter().zip(&block).enumerate() {
        assert!(*moved > 0, "rank {r}: exact Muon moved nothing over tp");
        for w in ns {
            *runs.entry(w.as_str()).or_default() += 1;
        }
        let split = we.keys().filter(|n| shapes[n.as_str()] != g.tensors[g.tensor_id(n).unwrap()].shape).count();
        let (d, name) = worst(we, wb);
        assert!(split >= 14 && d > 1e-4, "rank {r}: blockwise and exact are {d} apart at most ({name})");
    }
    assert!(runs.values().all(|&n| n == 1), "exact: {runs:?}");
}

/// Blockwise at tp 2 × dp 2, with and without FSDP, trains as blockwise at tp 2 alone on
/// the full batch does (the dp ranks' halves reduce to the same gradient, and each
/// block's update is the same), within 1e-5 over three steps, and lowers the loss: the
/// data-parallel owner (or FSDP unit group) deal still holds, each tp rank's block
/// orthogonalised on one dp rank, with no tp gather.
#[test]
fn muon_blockwise_at_tp_2_by_dp_2_with_and_without_fsdp_tracks_tp_2_alone() {
    let gb = |batch| with_roles(toy::llama(&ToyConfig { batch, ..ToyConfig::tiny() }), true);
    let (full_g, half_g) = (gb(2), gb(1));
    let data = synthetic_inputs(&full_g, 59);
    let (_, w0, _) = unsharded(&full_g, &data, Optimizer::AdamW, 0);
    let steps = |opt: Optimizer| {
        move |Rank { mut ex, data, coord, .. }: Rank| {
            ex.set_optimizer(opt).unwrap();
            let losses: Vec<f32> = (0..3).map(|_| ex.step(&inputs(&data), &H).unwrap()).collect();
            let ns: Vec<String> = ex.trainable().into_iter().filter(|w| ex.orthogonalises(w)).collect();
            let muon = ex.trainable().into_iter().filter(|w| ex.takes_muon(w)).count();
            (coord, losses, ex.gather_weights().unwrap(), ns, muon)
        }
    };
    let tp_only = Layout { tp: 2, ..Layout::single(2, 2) };
    let want = on_ranks(&full_g, &tp_only, &data, false, Some(&w0), steps(blockwise()));
    let exact = on_ranks(&full_g, &tp_only, &data, false, Some(&w0), steps(Optimizer::Muon(MUON_DEFAULT)));
    for (w, e) in want.iter().zip(&exact) {
        assert!(w.1[2] < w.1[0], "tp rank {}: blockwise losses {:?} do not fall", w.0.tp, w.1);
        assert!(worst(&w.2, &e.2).0 > 1e-4, "tp rank {}: blockwise ends where exact does", w.0.tp);
    }
    for fsdp in [false, true] {
        let layout = Layout { tp: 2, dp: 2, fsdp, ..Layout::single(1, 2) };
        let out = on_ranks(&half_g, &layout, &data, true, Some(&w0), steps(blockwise()));
        for t in 0..2u32 {
            let ranks: Vec<_> = out.iter().filter(|o| o.0.tp == t).collect();
            let reference = &want[t as usize];
            for i in 0..3 {
                let mean = (ranks[0].1[i] + ranks[1].1[i]) / 2.0;
                assert!((mean - reference.1[i]).abs() <= 1e-5 * reference.1[i], "fsdp {fsdp}, tp rank {t}, step {i}: mean over dp {mean} vs tp 2 alone {}", reference.1[i]);
            }
            let mut runs: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
            for o in &ranks {
                let (d, name) = worst(&o.2, &reference.2);
                assert!(d < 1e-5, "fsdp {fsdp}, {:?}: {name} drifted from tp 2 alone by {d:e}", o.0);
                for w in &o.3 {
                    *runs.entry(w.as_str()).or_default() += 1;
                }
            }
            // Each block orthogonalised by one dp rank, both holding some.
            assert_eq!(runs.len(), ranks[0].4, "fsdp {fsdp}, tp rank {t}: {runs:?}");
            assert!(runs.values().all(|&n| n == 1) && ranks.iter().all(|o| !o.3.is_empty()), "fsdp {fsdp}, tp rank {t}: {runs:?}");
        }
    }
}

/// Blockwise at tp 4 with 2 kv heads: the two ranks that hold each kv projection's block
/// reduce the same gradient (`tp-kv`) and orthogonalise it alike, so they end equal
/// (`whole_weight` checks it); every rank orthogonalises each of its blocks, and the
/// loss falls.
#[test]
fn muon_blockwise_ranks_sharing_a_kv_block_end_equal() {
    let g = with_roles(toy::llama(&ToyConfig::tiny()), true);
    let data = synthetic_inputs(&g, 61);
    let (_, w0, _) = unsharded(&g, &data, Optimizer::AdamW, 0);
    let tp = 4usize;
    let layout = Layout { tp: tp as u32, ..Layout::single(2, 2) };
    let hs: Vec<_> = tp_groups(tp)
        .into_iter()
        .enumerate()
        .map(|(r, groups)| {
            let s = shard(&g, &layout, RankCoord { tp: r as u32, ..Default::default() }).unwrap();
            let (g, w0, data) = (g.clone(), w0.clone(), data.clone());
            std::thread::spawn(move || {
                let mut ex = Executor::for_rank(&s, Cpu::new(), options(), groups).unwrap();
                ex.set_optimizer(blockwise()).unwrap();
                load_weights(&mut ex, &g, &s.graph, &w0, r, tp);
                let d = rank_inputs(&g, &s.graph, &data, r, tp);
                let losses: Vec<f32> = (0..3).map(|_| ex.step(&inputs(&d), &H).unwrap()).collect();
                let shapes: Shapes = s.graph.tensors.iter().map(|t| (t.name.clone(), t.shape.clone())).collect();
                let muon: Vec<String> = ex.trainable().into_iter().filter(|w| ex.takes_muon(w)).collect();
                let ns: Vec<String> = ex.trainable().into_iter().filter(|w| ex.orthogonalises(w)).collect();
                (losses, weights(&ex), shapes, muon == ns && ns.len() >= 14)
            })
        })
        .collect();
    let out: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    for (r, (losses, _, _, all)) in out.iter().enumerate() {
        assert!(*all, "rank {r}: blockwise, each rank orthogonalises every block it holds");
        assert!(losses[2] < losses[0], "rank {r}: {losses:?}");
    }
    let ranks: Vec<(&Grads, &Shapes)> = out.iter().map(|o| (&o.1, &o.2)).collect();
    for name in out[0].1.keys() {
        whole_weight(&g, name, &ranks);
    }
}
