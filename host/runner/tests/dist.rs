//! Multi-process runs through the real launch path: four `runner` processes on loopback
//! with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), meeting at
//! rank 0's rendezvous and training over the TCP backend. They give exactly the
//! single-process run's losses and weights; a rank killed mid-step makes every other
//! rank fail, naming it, well within the timeout; ranks that run different commands are
//! refused.

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

// Ports for rank 0's rendezvous (a process of its own binds it).
use runner_dist::testing::free_port;

fn scratch(name: &str) -> common::Scratch {
    common::scratch("dist", name)
}

/// Start rank `r` of `n` with `args`; stdout and stderr go to files in `dir`.
fn rank(dir: &Path, r: usize, n: usize, port: u16, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .env("RANK", r.to_string())
        .env("WORLD_SIZE", n.to_string())
        .env("LOCAL_RANK", r.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(std::fs::File::create(dir.join(format!("out{r}"))).unwrap())
        .stderr(std::fs::File::create(dir.join(format!("err{r}"))).unwrap())
        .spawn()
        .expect("runner starts")
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

fn in_process(args: &[&str]) -> serde_json::Value {
    let o = Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .arg("--in-process")
        .env_remove("RANK")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `bench step`'s JSON without what the clock and the allocator decide (step times,
/// peak bytes).
fn results(mut v: serde_json::Value) -> serde_json::Value {
    for r in v.as_array_mut().unwrap() {
        let r = r.as_object_mut().unwrap();
        assert!(r.remove("step_s").is_some() && r.remove("peak_bytes").is_some() && r.remove("comm_s").is_some(), "{r:?}");
    }
    v
}

/// The pipeline layouts run 3 and 4 micro-batches a step, so their stages run 1F1B and
/// interleaved 1F1B (two chunks a stage) across processes (TCP) as across threads.
#[test]
fn four_processes_train_exactly_as_one() {
    for (layout, m) in [("tp=2,dp=2", "1"), ("pp=2,dp=2", "3"), ("pp=2,dp=2,vp=2", "4"), ("pp=2,dp=2,fsdp", "2")] {
        // Small gradient buckets: several overlapped all-reduces a step, on the dp groups'
        // second lanes (a thread per rank over TCP, as over shared memory).
        let args = ["--device", "cpu", "bench", "step", "--layout", layout, "--steps", "3", "--micro-batches", m, "--ddp-bucket-size", "2000", "--timeout", "60", "--format", "json"];
        let dir = scratch(&layout.replace(['=', ','], "_"));
        let port = free_port();
        let kids: Vec<Child> = (0..4).map(|r| rank(&dir, r, 4, port, &args)).collect();
        for (r, mut k) in kids.into_iter().enumerate() {
            let st = k.wait().unwrap();
            assert!(st.success(), "{layout} rank {r}: {}", read(&dir, &format!("err{r}")));
        }
        let multi = results(serde_json::from_str(&read(&dir, "out0")).unwrap());
        let single = results(in_process(&args));
        assert_eq!(multi, single, "{layout}: four processes differ from the single-process run");
        let ranks = multi.as_array().unwrap();
        assert_eq!(ranks.len(), 4);
        for r in ranks.iter().filter(|_| !layout.contains("fsdp")) {
            let started = r["buckets_in_backward"].as_u64().unwrap();
            assert!(started >= 1 && started <= r["buckets"].as_u64().unwrap(), "{layout}: {r}");
        }
        // The loss falls, and the data-parallel replicas end with the same weights.
        let l = &ranks[0]["losses"];
        if layout.starts_with("tp") {
            assert!(l[2].as_f64().unwrap() < l[0].as_f64().unwrap(), "{l}");
            assert_eq!(ranks[0]["weights_sha256"], ranks[2]["weights_sha256"]);
        }
        for r in 1..4 {
            assert!(read(&dir, &format!("out{r}")).trim().is_empty(), "only rank 0 prints the results");
            assert!(read(&dir, &format!("err{r}")).contains(&format!("rank {r}: step 2 loss")));
        }
    }
}

/// `--schedule`: 1F1B and the in-order schedule make the same weights bit for bit; under
/// 1F1B the first of two stages holds two of the three micro-batches at once, and
/// interleaved over two chunks a stage, five chunk forwards (three micro-batches' worth)
/// of four.
#[test]
fn both_pipeline_schedules_make_the_same_weights() {
    for (layout, m, held) in [("pp=2", "3", [2, 1]), ("pp=2,vp=2", "4", [3, 2])] {
        let run = |schedule: &str| -> Vec<(String, u64)> {
            let v = in_process(&["--device", "cpu", "bench", "step", "--layout", layout, "--steps", "2", "--micro-batches", m, "--schedule", schedule, "--format", "json"]);
            v.as_array()
                .unwrap()
                .iter()
                .map(|r| (r["weights_sha256"].as_str().unwrap().to_string(), r["micro_batches_in_flight"].as_u64().unwrap()))
                .collect()
        };
        let (a, b) = (run("in-order"), run("1f1b"));
        assert_eq!(a.iter().map(|r| r.1).collect::<Vec<_>>(), [1, 1], "{layout}");
        assert_eq!(b.iter().map(|r| r.1).collect::<Vec<_>>(), held, "{layout}");
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.0, y.0, "{layout}: the schedules' weights differ");
        }
    }
}

#[test]
fn a_rank_killed_mid_run_fails_every_other_rank_naming_it() {
    let dir = scratch("kill");
    let port = free_port();
    let args = ["--device", "cpu", "bench", "step", "--layout", "tp=2,dp=2", "--steps", "1000000", "--timeout", "120"];
    let mut kids: Vec<Child> = (0..4).map(|r| rank(&dir, r, 4, port, &args)).collect();
    // Let the ranks train a few steps, then kill rank 2 hard.
    let t0 = Instant::now();
    while !read(&dir, "err0").contains("step 3 loss") {
        assert!(t0.elapsed() < Duration::from_secs(60), "ranks did not start: {}", read(&dir, "err0"));
        std::thread::sleep(Duration::from_millis(50));
    }
    kids[2].kill().unwrap();
    let killed = Instant::now();
    let _ = kids[2].wait();
    for r in [0, 1, 3] {
        let st = loop {
            if let Some(st) = kids[r].try_wait().unwrap() {
                break st;
            }
            if killed.elapsed() > Duration::from_secs(30) {
                for k in &mut kids {
                    let _ = k.kill();
                }
                panic!("rank {r} still running 30 s after rank 2 was killed: {}", read(&dir, &format!("err{r}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let err = read(&dir, &format!("err{r}"));
        assert!(!st.success(), "rank {r} exited successfully");
        assert!(err.contains("rank 2"), "rank {r} does not name rank 2: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert!(killed.elapsed() < Duration::from_secs(30));
}

/// A node with a plugin the others lack (or another build of the runner, with other
/// embedded plugins) is refused at the rendezvous, naming the plugin, on every rank.
#[test]
fn ranks_with_different_plugins_are_refused() {
    let dir = scratch("plugins");
    let extra = dir.join("extra");
    std::fs::create_dir_all(&extra).unwrap();
    let misbehave = runner::plugin::test_programs().iter().find(|(n, _)| *n == "misbehave_cost.wasm").map(|(_, p)| *p).unwrap();
    std::fs::copy(misbehave, extra.join("stray.wasm")).unwrap();
    let port = free_port();
    let kids: Vec<Child> = (0..2)
        .map(|r| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_runner"));
            c.args(["--device", "cpu", "bench", "collectives", "-b", "4K", "-e", "4K", "--ops", "all_reduce", "--timeout", "30"])
                .current_dir(&dir)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", r.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env_remove("RUNNER_PLUGIN_PATH")
                .stdout(std::fs::File::create(dir.join(format!("out{r}"))).unwrap())
                .stderr(std::fs::File::create(dir.join(format!("err{r}"))).unwrap());
            if r == 1 {
                c.env("RUNNER_PLUGIN_PATH", &extra);
            }
            c.spawn().expect("runner starts")
        })
        .collect();
    for (r, mut k) in kids.into_iter().enumerate() {
        assert!(!k.wait().unwrap().success(), "rank {r} was not refused");
        let err = read(&dir, &format!("err{r}"));
        assert!(err.contains("plugin stray.wasm (sha256 ") && err.contains("that rank 0 does not have"), "rank {r}: {err}");
    }
}

#[test]
fn ranks_that_run_different_things_are_refused() {
    let dir = scratch("refuse");
    let port = free_port();
    let kids: Vec<Child> = (0..2)
        .map(|r| {
            let steps = if r == 1 { "5" } else { "3" };
            rank(&dir, r, 2, port, &["--device", "cpu", "bench", "step", "--layout", "tp=2", "--steps", steps, "--timeout", "30"])
        })
        .collect();
    for (r, mut k) in kids.into_iter().enumerate() {
        assert!(!k.wait().unwrap().success(), "rank {r} was not refused");
        let err = read(&dir, &format!("err{r}"));
        assert!(err.contains("rank 1 runs something else than rank 0") && err.contains("--steps 5"), "rank {r}: {err}");
    }
}

#[test]
fn four_process_collectives_check_every_value() {
    let dir = scratch("coll");
    let port = free_port();
    let args = ["--device", "cpu", "bench", "collectives", "-b", "1K", "-e", "16K", "-f", "4", "-n", "2", "-w", "1", "--format", "json"];
    let kids: Vec<Child> = (0..4).map(|r| rank(&dir, r, 4, port, &args)).collect();
    for (r, mut k) in kids.into_iter().enumerate() {
        assert!(k.wait().unwrap().success(), "rank {r}: {}", read(&dir, &format!("err{r}")));
    }
    let rows: serde_json::Value = serde_json::from_str(&read(&dir, "out0")).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 6 * 3, "six collectives x three sizes");
    for r in rows {
        assert_eq!(r["wrong"], 0, "{r}");
        assert_eq!(r["ranks"], 4);
    }
    let ar = rows.iter().find(|r| r["op"] == "all_reduce" && r["size_bytes"] == 4096).unwrap();
    let (alg, bus) = (ar["algbw_gbps"].as_f64().unwrap(), ar["busbw_gbps"].as_f64().unwrap());
    assert!((bus / alg - 1.5).abs() < 1e-9, "all-reduce busbw = 2(n-1)/n x algbw");
}

/// The table says which launcher's variables the ranks read and where they met, so a
/// run that picked up a stray RANK from a wrapper script is seen in its report.
#[test]
fn the_report_names_the_launch() {
    let dir = scratch("launch-note");
    let port = free_port();
    let args = ["--device", "cpu", "bench", "collectives", "-b", "1K", "-e", "1K", "--ops", "all_reduce", "-n", "1", "-w", "1", "-q"];
    let kids: Vec<Child> = (0..2)
        .map(|r| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_runner"));
            c.args(args).env("RANK", r.to_string()).env("WORLD_SIZE", "2").env_remove("LOCAL_RANK");
            c.env("MASTER_ADDR", "127.0.0.1").env("MASTER_PORT", port.to_string());
            c.stdout(std::fs::File::create(dir.join(format!("out{r}"))).unwrap());
            c.stderr(std::fs::File::create(dir.join(format!("err{r}"))).unwrap());
            c.spawn().expect("runner starts")
        })
        .collect();
    for (r, mut k) in kids.into_iter().enumerate() {
        assert!(k.wait().unwrap().success(), "rank {r}: {}", read(&dir, &format!("err{r}")));
    }
    let out = read(&dir, "out0");
    // The ranks set no LOCAL_RANK here: both are local rank 0, yet on one host.
    assert!(out.contains("collectives over 2 ranks on 1 node, tcp"), "{out}");
    assert!(out.contains(&format!("launch: torchrun environment (RANK, WORLD_SIZE), rendezvous at 127.0.0.1:{port}")), "{out}");
    assert_eq!(read(&dir, "out1"), "", "only rank 0 prints");
}

/// tp = 4 over the toy model's 2 kv heads: each kv head is replicated on two tp ranks,
/// whose gradients of it are summed over a `tp-kv` group the mesh must provide (the
/// step failed for want of it). The ranks start from their parts of the unsharded
/// model's weights, so they train as one process of the unsharded model does: the same
/// losses, step by step (before, every tp rank started from the same values).
#[test]
fn tp_beyond_the_kv_heads_trains_as_the_unsharded_model() {
    let losses = |layout: &str| -> Vec<f64> {
        let v = in_process(&["--device", "cpu", "bench", "step", "--layout", layout, "--steps", "2", "--format", "json"]);
        let ranks = v.as_array().unwrap().clone();
        assert_eq!(ranks.len(), if layout == "tp=4" { 4 } else { 1 });
        ranks[0]["losses"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
    };
    let (sharded, whole) = (losses("tp=4"), losses("tp=1"));
    assert!(sharded[1] < sharded[0], "{sharded:?}");
    for (a, b) in sharded.iter().zip(&whole) {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "tp=4 losses {sharded:?}, unsharded {whole:?}");
    }
}

/// `--optimizer muon`: the ranks train with Muon (other weights than AdamW's), the two
/// data-parallel replicas of each pipeline stage or tensor-parallel block bit for bit
/// alike (they deal the matrices between them, each owner updating its own from the
/// same reduced gradient and broadcasting it; tp ranks gather the same matrix); FSDP
/// ranks train as plain data parallelism does.
#[test]
fn muon_trains_data_parallel_pipeline_and_tensor_parallel_ranks_alike() {
    for layout in ["pp=2,dp=2", "tp=2,dp=2"] {
        let run = |opt: &str| in_process(&["--device", "cpu", "bench", "step", "--layout", layout, "--steps", "2", "--optimizer", opt, "--format", "json"]);
        let digests = |v: &serde_json::Value| v.as_array().unwrap().iter().map(|r| r["weights_sha256"].as_str().unwrap().to_string()).collect::<Vec<_>>();
        let (muon, adamw) = (run("muon"), run("adamw"));
        let (m, a) = (digests(&muon), digests(&adamw));
        assert_eq!((m[0] == m[2], m[1] == m[3], m[0] == m[1]), (true, true, false), "{layout}: replicas alike, stages or blocks not: {m:?}");
        assert!(m.iter().zip(&a).all(|(x, y)| x != y), "{layout}: Muon's weights are not AdamW's: {m:?} {a:?}");
        assert_eq!(muon[1]["losses"][0], adamw[1]["losses"][0], "{layout}: the first loss comes before any update");
        // The toy's 2 layers a stage hold 7 matrices each; every one is orthogonalised
        // on one rank.
        let ns = |v: &serde_json::Value| v.as_array().unwrap().iter().map(|r| r["orthogonalised"].as_u64().unwrap()).collect::<Vec<_>>();
        let stages = if layout.starts_with("pp=2") { 2 } else { 1 };
        assert_eq!(ns(&muon).iter().sum::<u64>(), 14 * stages, "{layout}: {:?}", ns(&muon));
        assert!(ns(&muon).iter().all(|&n| n > 0) && ns(&adamw).iter().all(|&n| n == 0), "{layout}: {:?} {:?}", ns(&muon), ns(&adamw));
    }
    // FSDP ranks gather their pieces of each matrix's update: the same reduced gradients
    // and the same whole matrices as plain data parallelism, so the same losses and
    // (gathered) weights bit for bit, and not AdamW's.
    let run = |layout: &str, opt: &str| in_process(&["--device", "cpu", "bench", "step", "--layout", layout, "--steps", "2", "--optimizer", opt, "--format", "json"]);
    let (plain, fsdp, adamw) = (run("dp=2", "muon"), run("dp=2,fsdp", "muon"), run("dp=2,fsdp", "adamw"));
    for ((a, b), c) in plain.as_array().unwrap().iter().zip(fsdp.as_array().unwrap()).zip(adamw.as_array().unwrap()) {
        assert_eq!(a["losses"], b["losses"], "dp=2,fsdp: Muon's losses are plain dp's");
        assert_eq!(a["weights_sha256"], b["weights_sha256"], "dp=2,fsdp: Muon's weights are plain dp's");
        assert_ne!(b["weights_sha256"], c["weights_sha256"], "dp=2,fsdp: Muon's weights are not AdamW's");
        assert_eq!(b["orthogonalised"], 7, "dp=2,fsdp: the ranks deal the 14 matrices");
    }
}

/// `--muon-tp-mode blockwise` at tp=2,dp=2: each tp rank orthogonalises its own block,
/// so other weights than exact's (the first loss the same, before any update), the dp
/// replicas alike, and each tp rank's 14 blocks dealt over its dp pair (28 in all, where
/// exact orthogonalises each of the 14 matrices once); each rank's JSON names the mode.
#[test]
fn muon_blockwise_bench_step_orthogonalises_each_block_on_its_own_tp_rank() {
    let run = |mode: &str| in_process(&["--device", "cpu", "bench", "step", "--layout", "tp=2,dp=2", "--steps", "2", "--optimizer", "muon", "--muon-tp-mode", mode, "--format", "json"]);
    let (block, exact) = (run("blockwise"), run("exact"));
    let digests = |v: &serde_json::Value| v.as_array().unwrap().iter().map(|r| r["weights_sha256"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    let (b, e) = (digests(&block), digests(&exact));
    assert_eq!((b[0] == b[2], b[1] == b[3], b[0] == b[1]), (true, true, false), "replicas alike, blocks not: {b:?}");
    assert!(b.iter().zip(&e).all(|(x, y)| x != y), "blockwise ends where exact does: {b:?}");
    assert_eq!(block[0]["losses"][0], exact[0]["losses"][0]);
    let ns = |v: &serde_json::Value| v.as_array().unwrap().iter().map(|r| r["orthogonalised"].as_u64().unwrap()).collect::<Vec<_>>();
    assert_eq!((ns(&block).iter().sum::<u64>(), ns(&exact).iter().sum::<u64>()), (28, 14), "{:?} {:?}", ns(&block), ns(&exact));
    assert!(block.as_array().unwrap().iter().all(|r| r["muon_tp_mode"] == "blockwise"), "{block}");
    assert!(exact.as_array().unwrap().iter().all(|r| r["muon_tp_mode"] == "exact"), "{exact}");
}

/// `--layout dp=2,fsdp`: the ranks keep their shards of the weights (gathered a layer
/// at a time) and train exactly as plain data parallelism: the same losses and weights
/// bit for bit, at a lower peak.
#[test]
fn fsdp_trains_as_plain_data_parallelism() {
    let run = |layout: &str| in_process(&["--device", "cpu", "bench", "step", "--layout", layout, "--steps", "2", "--format", "json"]);
    let (plain, fsdp) = (run("dp=2"), run("dp=2,fsdp"));
    for (a, b) in plain.as_array().unwrap().iter().zip(fsdp.as_array().unwrap()) {
        assert_eq!(a["losses"], b["losses"]);
        assert_eq!(a["weights_sha256"], b["weights_sha256"]);
        assert!(b["peak_bytes"].as_u64().unwrap() < a["peak_bytes"].as_u64().unwrap(), "{a} {b}");
    }
}

/// The layout of the Slurm example's training step (workloads/slurm-multinode.sbatch,
/// 2 nodes x 8 GPUs) runs: as 16 CPU ranks in one process here. Its first version asked
/// for tp = 8 of the toy model's 4 heads, which every rank would have refused.
#[test]
fn the_slurm_examples_layout_runs() {
    let sbatch = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../workloads/slurm-multinode.sbatch")).unwrap();
    let layout = sbatch
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .find_map(|l| l.split("--layout ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the example runs bench step --layout");
    let world: usize = layout.split(',').map(|kv| kv.split('=').nth(1).unwrap().parse::<usize>().unwrap()).product();
    assert_eq!(world, 16, "the example's 2 nodes x 8 tasks");
    let v = in_process(&["--device", "cpu", "bench", "step", "--layout", layout, "--steps", "1", "--format", "json"]);
    assert_eq!(v.as_array().unwrap().len(), 16, "{v}");
}

/// The launch mistakes the launch path catches at once, through the binary: two processes
/// started as rank 0 both fail within seconds naming the duplicate (the first waited out
/// its --timeout for rank 1); a Slurm batch script's own environment (no srun step) is told
/// to use srun rather than wait for ranks nothing starts; and rank 0 at an IPv6 address
/// (MASTER_ADDR=::1) is met.
#[test]
fn launch_mistakes_fail_at_once_and_ipv6_meets() {
    let dir = scratch("launch-mistakes");
    let args = ["--device", "cpu", "bench", "collectives", "-b", "1K", "-e", "1K", "--ops", "all_reduce", "-n", "1", "-w", "1", "-q", "--timeout", "60"];
    let start = |name: &str, env: &[(&str, String)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_runner"));
        c.args(args).env_remove("LOCAL_RANK").env_remove("RANK").env_remove("WORLD_SIZE");
        for (k, v) in env {
            c.env(k, v);
        }
        c.stdout(std::fs::File::create(dir.join(format!("out-{name}"))).unwrap());
        c.stderr(std::fs::File::create(dir.join(format!("err-{name}"))).unwrap());
        c.spawn().expect("runner starts")
    };
    let torchrun = |r: usize, addr: &str, port: u16| vec![("RANK", r.to_string()), ("WORLD_SIZE", "2".into()), ("MASTER_ADDR", addr.into()), ("MASTER_PORT", port.to_string())];

    let t0 = Instant::now();
    let port = free_port();
    let first = start("first", &torchrun(0, "127.0.0.1", port));
    std::thread::sleep(Duration::from_millis(500));
    let second = start("second", &torchrun(0, "127.0.0.1", port));
    for (name, mut k) in [("first", first), ("second", second)] {
        assert!(!k.wait().unwrap().success(), "the {name} rank 0 ran");
        let err = read(&dir, &format!("err-{name}"));
        assert!(err.contains("two processes claim rank 0 of 2"), "{name}: {err}");
    }
    assert!(t0.elapsed() < Duration::from_secs(20), "took {:?} (--timeout 60)", t0.elapsed());

    let t0 = Instant::now();
    let batch = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "0"), ("SLURM_JOB_ID", "7"), ("SLURM_JOB_NODELIST", "localhost")];
    let mut k = start("batch", &batch.map(|(k, v)| (k, v.to_string())));
    assert!(!k.wait().unwrap().success());
    let err = read(&dir, "err-batch");
    assert!(err.contains("batch script") && err.contains("srun"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());

    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        let port = free_port();
        let kids: Vec<Child> = (0..2).map(|r| start(&format!("v6-{r}"), &torchrun(r, "::1", port))).collect();
        for (r, mut k) in kids.into_iter().enumerate() {
            assert!(k.wait().unwrap().success(), "rank {r} over IPv6: {}", read(&dir, &format!("err-v6-{r}")));
        }
        assert!(read(&dir, "out-v6-0").contains(&format!("rendezvous at [::1]:{port}")), "{}", read(&dir, "out-v6-0"));
    }
}
