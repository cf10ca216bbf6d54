//! Muon under the executor's layouts on the CPU, every rank a thread: where each rank
//! holds whole matrices after the gradient reduction (data parallel, pipeline stages) it
//! trains as the unsharded full batch does; tensor parallelism and FSDP, which hold
//! pieces of the matrices Newton–Schulz needs whole, are refused naming the fix.

mod common;

use common::{Data, Grads, half_of, inputs, load_weights, mesh, options, rank_inputs, weights, with_roles};
use runner_exec::cpu::Cpu;
use runner_exec::executor::{ADAMW_DEFAULT, MUON_DEFAULT, Optimizer};
use runner_exec::proxy::synthetic_inputs;
use runner_exec::toy::{self, ToyConfig};
use runner_exec::{AdamW, Executor};
use runner_graph::shard::{Layout, shard};
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

/// Three Muon steps at dp 2 (pp 1 and 2, a tied embedding split over the first and
/// last stage) track the unsharded full batch within 1e-5, where AdamW's three steps
/// are 1e-3 away: every rank runs Newton–Schulz on the same reduced gradient.
#[test]
fn muon_data_parallel_and_pipeline_track_unsharded() {
    let (full_g, half_g) = (llama(2, true), llama(1, true));
    let data = synthetic_inputs(&full_g, 29);
    let (want, w0, w3) = unsharded(&full_g, &data, Optimizer::Muon(MUON_DEFAULT), 3);
    let adamw = unsharded(&full_g, &data, Optimizer::AdamW, 3).2;
    let (apart, _) = worst(&adamw, &w3);
    assert!(apart > 1e-3, "AdamW and Muon are {apart} apart: the check below would not tell them apart");
    for pp in [1u32, 2] {
        let layout = Layout { dp: 2, pp, ..Layout::single(1, 2) };
        let hs: Vec<_> = mesh(1, pp, 2)
            .into_iter()
            .map(|m| {
                let s = shard(&half_g, &layout, m.coord).unwrap();
                let half = half_of(&data, m.coord.dp as usize);
                let (g, w0) = (half_g.clone(), w0.clone());
                std::thread::spawn(move || {
                    let mut ex = Executor::for_rank(&s, Cpu::new(), options(), m.groups).unwrap();
                    ex.set_optimizer(Optimizer::Muon(MUON_DEFAULT)).unwrap();
                    load_weights(&mut ex, &g, &s.graph, &w0, 0, 1);
                    let half = rank_inputs(&g, &s.graph, &half, 0, 1);
                    let last = s.graph.ops.iter().any(|o| o.kind == OpKind::CrossEntropy);
                    let losses: Vec<f32> = (0..3).map(|_| ex.step(&inputs(&half), &H).unwrap()).collect();
                    let muon = ex.trainable().into_iter().filter(|w| ex.takes_muon(w)).count();
                    (last, losses, weights(&ex), muon)
                })
            })
            .collect();
        let out: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let lasts: Vec<&Vec<f32>> = out.iter().filter(|o| o.0).map(|o| &o.1).collect();
        assert_eq!(lasts.len(), 2);
        for i in 0..3 {
            let mean = (lasts[0][i] + lasts[1][i]) / 2.0;
            assert!((mean - want[i]).abs() <= 1e-5 * want[i], "pp {pp}, step {i}: mean over dp {mean} vs unsharded {}", want[i]);
        }
        for (_, _, w, muon) in &out {
            assert!(*muon > 0, "pp {pp}: every stage holds hidden matrices");
            let (d, name) = worst(w, &w3);
            assert!(d < 1e-5, "pp {pp}: {name} drifted from the unsharded Muon run by {d:e}");
        }
    }
}

/// Tensor parallelism and FSDP hold pieces of each matrix: Muon is refused on every
/// rank, naming the layout and the fix; AdamW runs there as before.
#[test]
fn muon_is_refused_under_tensor_parallelism_and_fsdp() {
    let g = llama(2, false);
    let cases = [
        ("a tensor parallel layout (tp 2)", Layout { tp: 2, ..Layout::single(2, 2) }, mesh(2, 1, 1)),
        ("an FSDP layout keeps a shard", Layout { dp: 2, fsdp: true, ..Layout::single(1, 2) }, mesh(1, 1, 2)),
    ];
    for (what, layout, ranks) in cases {
        let g = if layout.dp > 1 { llama(1, false) } else { g.clone() };
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|m| {
                let s = shard(&g, &layout, m.coord).unwrap();
                std::thread::spawn(move || {
                    let mut ex = Executor::for_rank(&s, Cpu::new(), options(), m.groups).unwrap();
                    let e = ex.set_optimizer(Optimizer::Muon(MUON_DEFAULT)).unwrap_err().to_string();
                    ex.set_optimizer(Optimizer::AdamW).unwrap();
                    e
                })
            })
            .collect();
        for h in hs {
            let e = h.join().unwrap();
            assert!(e.contains(what) && e.contains("use adamw, or a layout without tp/fsdp"), "{what}: {e}");
        }
    }
}
