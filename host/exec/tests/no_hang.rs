//! A sharded run never hangs: when one rank errors out or panics mid-step, the others'
//! collectives fail at once with an error naming it; when a rank stays but never
//! arrives, the others fail after the group's timeout, naming the call and the rank.

mod common;

use std::time::{Duration, Instant};

use common::{Groups, mesh, options, rank_inputs, with_roles};
use runner_exec::collective::{Collective, ThreadGroup};
use runner_exec::cpu::Cpu;
use runner_exec::proxy::synthetic_inputs;
use runner_exec::toy::{self, ToyConfig};
use runner_exec::{Executor, Input};
use runner_graph::Graph;
use runner_graph::shard::{Layout, RankCoord, Sharded, shard};

fn tiny() -> Graph {
    with_roles(toy::llama(&ToyConfig::tiny()), true)
}

/// The error a rank's forward on the toy's synthetic inputs ends with.
fn forward_error(g: &Graph, s: &Sharded, groups: Groups, tp: usize) -> String {
    let mut ex = Executor::for_rank(s, Cpu::new(), options(), groups).unwrap();
    let d = rank_inputs(g, &s.graph, &synthetic_inputs(g, 1), 0, tp);
    let inputs: Vec<(&str, Input<'_>)> = d
        .iter()
        .map(|(n, u, _)| (n.as_str(), Input::U32(u)))
        .collect();
    ex.forward(&inputs).unwrap_err().to_string()
}

/// tp=2: rank 1 fails on its inputs before its first collective and returns (dropping
/// its handle); rank 0's forward fails at its first all-reduce, naming rank 1.
#[test]
fn a_rank_that_errors_out_fails_the_others_promptly() {
    let g = tiny();
    let layout = Layout {
        tp: 2,
        ..Layout::single(2, 2)
    };
    let t0 = Instant::now();
    let hs: Vec<_> = mesh(2, 1, 1)
        .into_iter()
        .map(|m| {
            let s = shard(&g, &layout, m.coord).unwrap();
            let g = g.clone();
            std::thread::spawn(move || {
                if m.coord.tp == 1 {
                    let mut ex = Executor::for_rank(&s, Cpu::new(), options(), m.groups).unwrap();
                    // No inputs: an input error before anything runs.
                    return ex.forward(&[]).unwrap_err().to_string();
                }
                forward_error(&g, &s, m.groups, 2)
            })
        })
        .collect();
    let errs: Vec<String> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        t0.elapsed() < Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
    assert!(errs[1].contains("missing input"), "{}", errs[1]);
    assert!(errs[0].contains("rank(s) 1 left the group"), "{}", errs[0]);
}

/// dp=2 with the gradient reduction overlapped, one weight per bucket: rank 1 leaves
/// after its forward; rank 0's step starts its buckets during the backward and fails at
/// once when it waits for them, naming rank 1.
#[test]
fn a_rank_that_leaves_fails_the_overlapped_gradient_reduction_promptly() {
    let g = tiny();
    let layout = Layout { dp: 2, ..Layout::single(2, 4) };
    let t0 = Instant::now();
    let hs: Vec<_> = mesh(1, 1, 2)
        .into_iter()
        .map(|m| {
            let s = shard(&g, &layout, m.coord).unwrap();
            let g = g.clone();
            std::thread::spawn(move || {
                let o = runner_exec::ExecOptions { grad_bucket_elems: Some(1), ..options() };
                let mut ex = Executor::for_rank(&s, Cpu::new(), o, m.groups).unwrap();
                let d = rank_inputs(&g, &s.graph, &synthetic_inputs(&g, 1), 0, 1);
                let inputs: Vec<(&str, Input<'_>)> = d.iter().map(|(n, u, _)| (n.as_str(), Input::U32(u))).collect();
                if m.coord.dp == 1 {
                    ex.forward(&inputs).unwrap();
                    return String::new();
                }
                ex.step(&inputs, &runner_exec::executor::ADAMW_DEFAULT).unwrap_err().to_string()
            })
        })
        .collect();
    let errs: Vec<String> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(t0.elapsed() < Duration::from_millis(900), "{:?}", t0.elapsed());
    assert!(errs[0].contains("all-reduce") && errs[0].contains("rank(s) 1 left the group"), "{}", errs[0]);
}

/// pp=2: stage 0 panics before sending; stage 1's receive fails at once, naming it.
#[test]
fn a_stage_that_panics_fails_the_next_stage_promptly() {
    let g = tiny();
    let layout = Layout {
        pp: 2,
        ..Layout::single(2, 2)
    };
    let t0 = Instant::now();
    let hs: Vec<_> = mesh(1, 2, 1)
        .into_iter()
        .map(|m| {
            let s = shard(&g, &layout, m.coord).unwrap();
            let g = g.clone();
            std::thread::spawn(move || {
                if m.coord.pp == 0 {
                    let _groups = m.groups;
                    panic!("stage 0 fails (expected in this test)");
                }
                forward_error(&g, &s, m.groups, 1)
            })
        })
        .collect();
    let out: Vec<_> = hs.into_iter().map(|h| h.join()).collect();
    assert!(
        t0.elapsed() < Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
    assert!(out[0].is_err());
    let e = out[1].as_ref().unwrap();
    assert!(
        e.contains("recv on rank 1 from rank 0") && e.contains("left the group"),
        "{e}"
    );
}

/// tp=2 with a 100 ms limit: rank 1 holds its handle but never runs; rank 0 times out at
/// its first all-reduce with the call, the missing rank and the fix named.
#[test]
fn a_rank_that_never_arrives_times_out() {
    let g = tiny();
    let layout = Layout {
        tp: 2,
        ..Layout::single(2, 2)
    };
    let s = shard(&g, &layout, RankCoord::default()).unwrap();
    let mut hs = ThreadGroup::with_timeout(2, Duration::from_millis(100));
    let idle = hs.pop().unwrap();
    let groups: Groups = vec![(
        "tp".into(),
        Box::new(hs.pop().unwrap()) as Box<dyn Collective>,
    )];
    let t0 = Instant::now();
    let e = forward_error(&g, &s, groups, 2);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_millis(900),
        "{took:?}"
    );
    assert!(
        e.contains("all-reduce") && e.contains("timed out after 100ms"),
        "{e}"
    );
    assert!(
        e.contains("rank(s) 1 did not arrive") && e.contains("ThreadGroup::with_timeout"),
        "{e}"
    );
    drop(idle);
}
