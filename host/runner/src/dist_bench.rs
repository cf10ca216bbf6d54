//! The commands that run as one process per rank (started by `srun`, `mpirun`, torchrun
//! or a Kubernetes indexed Job, see `runner_dist::launch`), meet at rank 0's rendezvous,
//! and communicate through NCCL on GPUs or the TCP backend on CPU ranks:
//!
//! - `bench collectives`: nccl-tests' size sweep, flags (`-b -e -f -i -g -n -w -c -d`),
//!   columns and bus-bandwidth factors, so its lines compare with `all_reduce_perf` & co.
//! - `bench step`: training steps of a toy Llama sharded over tp·pp·dp ranks; each rank
//!   prints its progress, rank 0 the losses and each rank's weight digest.
//!
//! Without a launcher, `-g N` (collectives) or `--in-process` (step) run the N ranks as
//! threads of this process through the same code.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;
use sha2::{Digest, Sha256};

use runner::report::{Table, plural};
use runner_dist::{Launch, RunMeta, TcpWorld, host_port, rendezvous, rendezvous_on};
use runner_exec::collective::{Collective, HostCollective, ReduceOp, Started};
use runner_exec::cpu::Cpu;
use runner_exec::device::{Device, Elem};
use runner_exec::executor::{ADAMW_DEFAULT, Optimizer, PipelineSchedule};
use runner_exec::select::DeviceSpec;
use runner_exec::toy::{ToyConfig, batch_inputs, llama, with_roles};
use runner_exec::{ExecError, ExecOptions, Executor, Input, Stat, ThreadGroup};
use runner_graph::shard::{Layout, RankCoord, shard};
use runner_project::collectives::CollRow;

use crate::Global;
use crate::commands::emit_csv;

/// nccl-tests' size syntax: bytes, or a number with K, M or G (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mul) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| anyhow!("size '{s}': a number of bytes, or with K, M or G (e.g. 8, 64K, 32M, 1G)"))
}

/// The collectives and their nccl-tests names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Broadcast,
    SendRecv,
}

impl Coll {
    pub const ALL: [Coll; 6] = [Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter, Coll::AllToAll, Coll::Broadcast, Coll::SendRecv];

    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::AllToAll => "alltoall",
            Coll::Broadcast => "broadcast",
            Coll::SendRecv => "sendrecv",
        }
    }

    pub fn parse(s: &str) -> Result<Coll> {
        Coll::ALL
            .into_iter()
            .find(|c| c.name() == s || c.name().replace('_', "") == s.replace(['_', '-'], ""))
            .ok_or_else(|| anyhow!("--ops {s}: use all_reduce, all_gather, reduce_scatter, alltoall, broadcast, sendrecv"))
    }

    /// nccl-tests' bus-bandwidth factor for `n` ranks (`*GetBw` in its sources): the
    /// projection's own (`runner_project::comm::bus_factor`, through the op names
    /// `runner calibrate --collectives` reads), so a measured busbw and a projected
    /// collective time use one definition.
    pub fn bus_factor(self, n: usize) -> f64 {
        runner_project::collectives::bus_factor_of(self.name(), n).unwrap_or(1.0)
    }
}

impl std::fmt::Display for Coll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// nccl-tests' flags, as `bench collectives` takes them.
#[derive(Clone, Debug)]
pub struct CollArgs {
    pub minbytes: u64,
    pub maxbytes: u64,
    pub stepfactor: u64,
    pub stepbytes: Option<u64>,
    pub ngpus: usize,
    pub iters: usize,
    pub warmup: usize,
    pub check: usize,
    pub dtype: Elem,
    pub ops: Vec<Coll>,
    pub timeout: Duration,
}

impl CollArgs {
    /// The sizes of the sweep: min, ×factor (or +step) up to max, as nccl-tests; it ends
    /// where the next size would pass u64::MAX (`-e 18446744073709551615`).
    ///
    /// # Errors
    /// More than [`MAX_SIZES`] sizes (`-b 1 -e 64G -i 1`: 2^36 of them, which took every
    /// byte of memory before the first was run).
    pub fn sizes(&self) -> Result<Vec<u64>> {
        let mut v = Vec::new();
        let mut s = self.minbytes.max(1);
        while s <= self.maxbytes {
            if v.len() == MAX_SIZES {
                let step = self.stepbytes.map_or_else(|| format!("-f {}", self.stepfactor), |b| format!("-i {b}"));
                bail!(
                    "-b {} to -e {} with {step} is more than {MAX_SIZES} sizes: raise -i (or -b), lower -e, or grow the size by a factor (-f 2)",
                    self.minbytes,
                    self.maxbytes
                );
            }
            v.push(s);
            let next = match self.stepbytes {
                Some(b) => s.checked_add(b.max(1)),
                None => s.checked_mul(self.stepfactor.max(2)),
            };
            let Some(next) = next else { break };
            s = next;
        }
        Ok(v)
    }
}

/// The most sizes one `bench collectives` sweep runs (nccl-tests' `-b 8 -e 8G -f 2` is 31).
pub const MAX_SIZES: usize = 4096;

fn nccl_type_name(e: Elem) -> &'static str {
    match e {
        Elem::F32 => "float",
        Elem::BF16 => "bfloat16",
        Elem::F16 => "half",
        Elem::I32 => "int32",
        Elem::F8E4M3 => "f8e4m3",
        Elem::F8E5M2 => "f8e5m2",
    }
}

/// The ranks to run here: this process's own (from the launcher), or `n` threads of it
/// meeting on loopback when nothing launched several processes. For the threads, rank 0's
/// rendezvous listener too, on a port the OS picked, held until rank 0 serves on it
/// ([`rendezvous_on`]): a port found free and let go (as before) could be taken meanwhile
/// by another run's rank 0, two `-g` runs started at once, failing one of them.
fn local_ranks(n: usize) -> Result<(Vec<Launch>, Option<std::net::TcpListener>)> {
    let l = runner_dist::detect().map_err(|e| anyhow!(e))?;
    if l.world > 1 || n <= 1 {
        if n > 1 {
            bail!("-g {n}: one GPU per process under a launcher ({}); launch one rank per GPU", l.source);
        }
        return Ok((vec![l], None));
    }
    let held = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = held.local_addr()?.port();
    let ranks = (0..n)
        .map(|r| Launch {
            rank: r,
            world: n,
            local_rank: r,
            local_world: Some(n),
            master: Some(("127.0.0.1".into(), port)),
            source: "threads of one process (-g)",
        })
        .collect();
    Ok((ranks, Some(held)))
}

/// What a launched rank says before it waits at the rendezvous: where, for whom and for
/// how long. A rank whose peers never start otherwise sat silent until `--timeout` (300 s
/// by default) ran out; `None` for a single process.
fn waiting_note(launch: &Launch, timeout: Duration) -> Option<String> {
    let (host, port) = launch.master.as_ref().filter(|_| launch.world > 1)?;
    let whom = if launch.rank == 0 {
        format!("waiting at {} for the other {}", host_port(host, *port), plural(launch.world - 1, "rank"))
    } else {
        format!("meeting rank 0 at {}", host_port(host, *port))
    };
    Some(format!(
        "rank {} of {} ({}): {whom}; gives up after {} s (--timeout)",
        launch.rank,
        launch.world,
        launch.source,
        timeout.as_secs()
    ))
}

/// This rank's host, as `HOST_WORDS` floats for an all-gather: whether the host name
/// was read, 48 bits of its FNV-1a hash in three exact 16-bit pieces, and the local rank.
fn host_words(local_rank: usize) -> [f32; HOST_WORDS] {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok().or_else(|| std::env::var("HOSTNAME").ok());
    host_words_of(name.as_deref(), local_rank)
}

/// [`host_words`] of the host name `name` (none, or blank: not read).
fn host_words_of(name: Option<&str>, local_rank: usize) -> [f32; HOST_WORDS] {
    let name = name.map(str::trim).filter(|n| !n.is_empty());
    let hash = name.map_or(0, |n| n.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)));
    let piece = |k: u32| ((hash >> (16 * k)) & 0xffff) as f32;
    [f32::from(u8::from(name.is_some())), piece(0), piece(1), piece(2), local_rank as f32]
}

const HOST_WORDS: usize = 5;

/// The nodes among the ranks whose [`host_words`] are `all`: distinct host names, or
/// where a rank could not read its own, the ranks of local rank 0 (each node's launcher
/// numbers its ranks from 0; a launch without local ranks counts every rank then).
fn count_nodes(all: &[f32]) -> usize {
    let ranks: Vec<&[f32]> = all.chunks_exact(HOST_WORDS).collect();
    let n = if ranks.iter().all(|w| w[0] == 1.0) {
        let mut hosts: Vec<[u32; 3]> = ranks.iter().map(|w| [w[1], w[2], w[3]].map(|x| x as u32)).collect();
        hosts.sort_unstable();
        hosts.dedup();
        hosts.len()
    } else {
        ranks.iter().filter(|w| w[4] == 0.0).count()
    };
    n.max(1)
}

/// Which launcher started the ranks and where they met, for the report: a run that
/// read the wrong launcher's variables is seen at once.
fn launch_note(l: &Launch) -> String {
    match l.rendezvous() {
        Some(at) => format!("launch: {}, rendezvous at {at}", l.source),
        None => format!("launch: {}", l.source),
    }
}

fn meta(run: String) -> RunMeta {
    // Every plugin a rank would find (embedded and dropped in), not only those this
    // command loads: two builds of the runner, or one node with a stray plugin, differ
    // here. A file that fails to load counts as unloadable.
    let mut plugins: Vec<(String, String)> = runner::plugin::list()
        .into_iter()
        .filter(|(_, shadowed)| !shadowed)
        .map(|(info, _)| match info {
            Ok(i) => (i.name, i.sha256),
            Err(e) => (e.plugin.clone(), "unloadable".into()),
        })
        .collect();
    plugins.sort();
    RunMeta { version: env!("CARGO_PKG_VERSION").into(), run, plugins }
}

/// How a rank on `gpu` (or the CPU) talks to the others, for the rendezvous to compare: a
/// node whose GPU `--device auto` could not use would otherwise join NCCL ranks over TCP.
fn transport_of(gpu: Option<usize>) -> &'static str {
    if gpu.is_some() { "on GPUs (NCCL)" } else { "on CPUs (TCP)" }
}

/// Whether this rank computes on a GPU, and which: [`runner_dist::launch::gpu_of_rank`]
/// of the GPUs this process sees, for `auto` and `cuda` (`cuda:N`, N > 0, is GPU N + the
/// local rank).
fn rank_device(spec: DeviceSpec, local_rank: usize, local_world: Option<usize>) -> Result<Option<usize>> {
    let assigned = std::env::var_os("CUDA_VISIBLE_DEVICES").is_some();
    let mine = || runner_dist::launch::gpu_of_rank(visible_gpus(), local_rank, local_world, assigned).map_err(|e| anyhow!(e));
    match spec {
        DeviceSpec::Cpu => Ok(None),
        // No GPU seen: opening the local rank's names why (no driver, none visible).
        DeviceSpec::Cuda(0) => Ok(Some(mine()?.unwrap_or(local_rank))),
        DeviceSpec::Cuda(n) => Ok(Some(n + local_rank)),
        DeviceSpec::CudaEmulated => bail!("--device cuda-emulated runs no NCCL: collectives need GPUs (or --device cpu for the TCP backend)"),
        DeviceSpec::Auto => Ok(mine()?.filter(|&g| runner_exec::select::cuda_unusable(g).is_none())),
    }
}

/// How many GPUs this process sees: 0 without a CUDA build, a driver or a device (or
/// the libraries the CUDA backend loads, as `--device auto` has always counted them).
fn visible_gpus() -> usize {
    #[cfg(feature = "cuda")]
    {
        runner_exec::cuda::probe(0).map_or(0, |i| i.devices)
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

/// Re-run this command with a `libnccl.so` link on the loader path when only NCCL's
/// `libnccl.so.2` is installed (cudarc loads `libnccl.so`). `None`: nothing to do.
#[cfg(feature = "cuda")]
fn reexec_for_nccl() -> Option<Result<()>> {
    use runner_exec::cuda::nccl;
    if nccl::nccl_library().is_ok() || std::env::var_os("RUNNER_NCCL_SHIM").is_some() {
        return None;
    }
    let dir = nccl::nccl_shim_dir()?;
    let ld = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
        _ => dir.display().to_string(),
    };
    let exe = std::env::current_exe().ok()?;
    let status = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", ld)
        .env("RUNNER_NCCL_SHIM", "1")
        .status();
    Some(match status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(anyhow!("exit status {s}")),
        Err(e) => Err(anyhow!("re-running with the NCCL link: {e}")),
    })
}

/// The handle of group `name` over world ranks `members` for this rank: TCP on the CPU,
/// NCCL (bootstrapped and watched over TCP) on a GPU.
trait Groups: Device + Sized {
    type G: Collective<Self> + 'static;
    fn group(&self, world: &TcpWorld, name: &str, members: &[usize], timeout: Duration) -> Result<Self::G>;
    /// Benchmarks: calls queue without waiting, [`Groups::finish`] waits for them all.
    fn batch(_g: &mut Self::G, _on: bool) {}
    fn finish(_g: &Self::G) -> Result<()> {
        Ok(())
    }
    fn transport() -> &'static str;
}

impl Groups for Cpu {
    type G = runner_dist::TcpGroup;
    fn group(&self, world: &TcpWorld, name: &str, members: &[usize], _timeout: Duration) -> Result<Self::G> {
        world.group(name, members).map_err(|e| anyhow!(e))
    }
    fn transport() -> &'static str {
        "tcp"
    }
}

#[cfg(feature = "cuda")]
impl Groups for runner_exec::cuda::Cuda {
    type G = runner_exec::cuda::nccl::NcclGroup;
    fn group(&self, world: &TcpWorld, name: &str, members: &[usize], timeout: Duration) -> Result<Self::G> {
        use runner_exec::cuda::nccl::{NcclGroup, unique_id};
        let tcp = world.group(name, members).map_err(|e| anyhow!(e))?;
        // Group rank 0 makes the id; it travels as 32 f32 words, bit for bit.
        let mut words = vec![0f32; 32];
        if HostCollective::rank(&tcp) == 0 {
            let id = unique_id()?;
            for (w, c) in words.iter_mut().zip(id.chunks(4)) {
                *w = f32::from_bits(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
        }
        let words = HostCollective::broadcast(&tcp, &words, 0)?;
        let mut id = [0u8; 128];
        for (c, w) in id.chunks_mut(4).zip(&words) {
            c.copy_from_slice(&w.to_bits().to_le_bytes());
        }
        let w = world.clone();
        Ok(NcclGroup::new(self, name, HostCollective::rank(&tcp), members.len(), id, timeout, std::sync::Arc::new(move || w.failure()))?)
    }
    fn batch(g: &mut Self::G, on: bool) {
        g.set_blocking(!on);
    }
    fn finish(g: &Self::G) -> Result<()> {
        Ok(g.wait("benchmark")?)
    }
    fn transport() -> &'static str {
        "nccl"
    }
}

// ---------------------------------------------------------------------------------------
// bench collectives
// ---------------------------------------------------------------------------------------

pub fn collectives(args: CollArgs, global: &Global) -> Result<()> {
    let esize = args.dtype.bytes();
    #[cfg(feature = "cuda")]
    if rank_device(global.device, 0, None)?.is_some()
        && let Some(r) = reexec_for_nccl()
    {
        return r;
    }
    let (ranks, held) = local_ranks(args.ngpus)?;
    let held = std::sync::Mutex::new(held);
    let launched = launch_note(&ranks[0]);
    let run = format!(
        "bench collectives -b {} -e {} -f {} -i {:?} -n {} -w {} -d {} ops {:?}",
        args.minbytes,
        args.maxbytes,
        args.stepfactor,
        args.stepbytes,
        args.iters,
        args.warmup,
        nccl_type_name(args.dtype),
        args.ops
    );
    // Threads of one process meet at once; a launched process says where it waits.
    if let [launch] = ranks.as_slice()
        && !global.quiet
        && let Some(note) = waiting_note(launch, args.timeout)
    {
        eprintln!("{}", runner::report::visible(&note));
    }
    let g = global.clone();
    let results = on_ranks(ranks, global.device, move |launch, gpu| {
        let meta = meta(format!("{run} {}", transport_of(gpu)));
        let held = if launch.rank == 0 { held.lock().ok().and_then(|mut h| h.take()) } else { None };
        let world = match held {
            Some(l) => rendezvous_on(l, &launch, &meta, args.timeout)?,
            None => rendezvous(&launch, &meta, args.timeout)?,
        };
        let progress = |m: &str| crate::commands::progress_line(&g, m);
        let r = match gpu {
            None => coll_rank(&Cpu::new(), &world, launch.local_rank, &args, &progress),
            #[cfg(feature = "cuda")]
            Some(n) => runner_exec::cuda::Cuda::new(n)
                .map_err(|e| anyhow!(e))
                .and_then(|dev| coll_rank(&dev, &world, launch.local_rank, &args, &progress)),
            #[cfg(not(feature = "cuda"))]
            Some(_) => Err(anyhow!("built without CUDA")),
        };
        if r.is_err() {
            // Tell the others at once (ranks run as threads here: the sockets stay open
            // until the world is dropped, and the others would wait out the timeout).
            world.close();
        }
        r
    })?;
    if !global.quiet && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        crate::commands::progress_line(global, "");
    }
    let Some(rows) = results.into_iter().flatten().next() else {
        return Ok(()); // not rank 0: rank 0 prints
    };
    if rows.is_empty() {
        bail!(
            "no size from -b to -e holds one {esize}-byte element per rank: raise -b (and -e)"
        );
    }
    let n = rows.first().map_or(1, |r| r.ranks);
    let nodes = rows.first().map_or(1, |r| r.nodes);
    let transport = rows.first().map_or("tcp", |r| r.transport.as_str());
    let mut t = Table::new(
        format!("collectives over {} on {}, {transport}", plural(n, "rank"), plural(nodes, "node")),
        &["op", "size (B)", "count (elements)", "type", "redop", "root", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"],
    );
    for r in &rows {
        t.rows.push(vec![
            r.op.clone(),
            r.size_bytes.to_string(),
            r.count.to_string(),
            r.dtype.clone(),
            r.redop.clone(),
            r.root.to_string(),
            format!("{:.2}", r.time_us),
            format!("{:.2}", r.algbw_gbps),
            format!("{:.2}", r.busbw_gbps),
            // nccl-tests' N/A where nothing was checked (-c 0).
            r.wrong.map_or_else(|| "N/A".to_string(), |w| w.to_string()),
        ]);
    }
    let wrong: u64 = rows.iter().filter_map(|r| r.wrong).sum();
    // nccl-tests prints "0 OK" here with -c 0 too (its count of errors stays 0 when it
    // checks nothing): this line says that nothing was checked instead.
    t.notes.push(if rows.iter().any(|r| r.wrong.is_none()) {
        "Out of bounds values : N/A, not checked (-c 0)".to_string()
    } else {
        format!("Out of bounds values : {wrong} {}", if wrong == 0 { "OK" } else { "FAILED" })
    });
    // nccl-tests runs one collective per binary and averages its sizes: one line per op.
    let mut ops: Vec<&str> = Vec::new();
    for r in &rows {
        if !ops.contains(&r.op.as_str()) {
            ops.push(&r.op);
        }
    }
    for op in ops {
        let bw: Vec<f64> = rows.iter().filter(|r| r.op == op).map(|r| r.busbw_gbps).collect();
        t.notes.push(format!("Avg bus bandwidth    : {:.3} ({op})", bw.iter().sum::<f64>() / bw.len() as f64));
    }
    t.notes.push(
        "nccl-tests conventions: size = the S of each collective's *GetBw (all_gather: the gathered output, \
         reduce_scatter and alltoall: the per-rank input), algbw = S / time, busbw = algbw x its factor (all_reduce \
         2(n-1)/n; all_gather, reduce_scatter, alltoall (n-1)/n; broadcast, sendrecv 1); time = mean over ranks of \
         the mean over -n iterations after -w warm-up ones, GB = 1e9 bytes"
            .into(),
    );
    if transport == "tcp" {
        t.notes.push("TCP backend (ranks without GPUs): for tests and development, not a network benchmark".into());
    }
    t.notes.push(launched);
    t.notes.push("fit the projection's network tier to it: -o FILE.json, then runner calibrate --collectives FILE.json --gpu NAME".into());
    // The CSV: a row per (op, size) under the JSON's names (`size_bytes`, `time_us`,
    // `algbw_gbps`, `busbw_gbps`: nccl-tests' columns, unrounded), the notes as `#` lines.
    emit_csv(global, &t, &rows, &runner::report::records(&rows))?;
    if wrong > 0 {
        bail!("{wrong} wrong values in the collectives' results");
    }
    Ok(())
}

/// Run `f` on each local rank (threads when several), returning each rank's result in
/// rank order; the first error wins.
fn on_ranks<T: Send + 'static>(
    ranks: Vec<Launch>,
    spec: DeviceSpec,
    f: impl Fn(Launch, Option<usize>) -> Result<T> + Send + Sync + 'static,
) -> Result<Vec<T>> {
    let f = std::sync::Arc::new(f);
    let mut hs = Vec::new();
    for l in ranks {
        let gpu = rank_device(spec, l.local_rank, l.local_world)?;
        let f = f.clone();
        hs.push(std::thread::spawn(move || f(l, gpu)));
    }
    let mut out = Vec::new();
    let mut first_err = None;
    for h in hs {
        match h.join() {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(anyhow!("a rank thread panicked"));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// One rank's sweep; rank 0 returns the rows.
/// Rank 0 reports each size as it completes through `progress` (a sweep of large sizes
/// takes minutes; nccl-tests prints each line as it goes).
fn coll_rank<D: Groups>(dev: &D, world: &TcpWorld, local_rank: usize, a: &CollArgs, progress: &dyn Fn(&str)) -> Result<Option<Vec<CollRow>>> {
    let n = world.size();
    let me = world.rank();
    if D::transport() == "tcp" && a.dtype != Elem::F32 {
        bail!("-d {}: ranks without GPUs reduce f32 on the host; bfloat16 and half need NCCL (GPU ranks): use -d float", nccl_type_name(a.dtype));
    }
    let all: Vec<usize> = (0..n).collect();
    let mut g = dev.group(world, "world", &all, a.timeout)?;
    D::batch(&mut g, true);
    let ctl = world.everyone().map_err(|e| anyhow!(e))?;
    // What `runner calibrate --collectives` reads the network tier from.
    let nodes = count_nodes(&HostCollective::all_gather(&ctl, &host_words(local_rank))?);
    let esize = a.dtype.bytes() as u64;
    let mut rows = Vec::new();
    let sizes = a.sizes()?;
    let total = a.ops.len() * sizes.len();
    let mut done = 0usize;
    for &op in &a.ops {
        for &size in &sizes {
            done += 1;
            // nccl-tests' count: elements of the size, rounded down to split over the ranks.
            let mut count = size / esize;
            if matches!(op, Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll) {
                count = count / n as u64 * n as u64;
            }
            if count == 0 {
                continue;
            }
            let c = count as usize;
            let per = c / n;
            let (in_len, out_len) = match op {
                Coll::AllReduce | Coll::Broadcast => (c, c),
                Coll::AllGather => (per, c),
                Coll::ReduceScatter => (c, per),
                Coll::AllToAll => (c, c),
                Coll::SendRecv => (c, c),
            };
            let mut input = dev.alloc(a.dtype, in_len)?;
            let mut output = dev.alloc(a.dtype, out_len)?;
            // Rank r, element i: a small integer, exact in every format and its sums.
            let value = |r: usize, i: usize| ((r * 7 + i * 3) % 5) as f32;
            let host: Vec<f32> = (0..in_len).map(|i| value(me, i)).collect();
            let next = (me + 1) % n;
            let prev = (me + n - 1) % n;
            let call = |input: &mut D::Buffer, output: &mut D::Buffer| -> Result<(), ExecError> {
                match op {
                    Coll::AllReduce => g.all_reduce(dev, input, ReduceOp::Sum),
                    Coll::AllGather => g.all_gather(dev, input, output),
                    Coll::ReduceScatter => g.reduce_scatter(dev, input, output),
                    Coll::AllToAll => g.all_to_all(dev, input, output),
                    Coll::Broadcast => g.broadcast(dev, input, 0),
                    Coll::SendRecv => {
                        // To the next rank, from the previous one; a single rank sends to
                        // itself, as nccl-tests' sendrecv does on one GPU.
                        let mut send = vec![0; n];
                        let mut recv = vec![0; n];
                        send[next] = c;
                        recv[prev] = c;
                        g.all_to_all_v(dev, input, &send, output, &recv)
                    }
                }
            };
            for _ in 0..a.warmup {
                dev.write_f32(&mut input, &host)?;
                call(&mut input, &mut output)?;
            }
            dev.write_f32(&mut input, &host)?;
            D::finish(&g)?;
            dev.synchronize()?;
            ctl.barrier()?;
            let start = dev.record()?;
            for _ in 0..a.iters.max(1) {
                call(&mut input, &mut output)?;
            }
            let end = dev.record()?;
            D::finish(&g)?;
            let mut secs = vec![(dev.elapsed_s(&start, &end)? / a.iters.max(1) as f64) as f32];
            HostCollective::all_reduce(&ctl, &mut secs, ReduceOp::Sum)?;
            let time = f64::from(secs[0]) / n as f64;
            // Check: fresh inputs, one call, every element against its expected value.
            // The all-reduce's check is a started one (the overlapped gradient buckets'
            // path: NCCL's second stream, a host transport's second lane).
            let mut wrong = 0u64;
            for _ in 0..a.check {
                dev.write_f32(&mut input, &host)?;
                if op == Coll::AllReduce {
                    let fresh = dev.alloc(a.dtype, in_len)?;
                    let started = g.start(dev, Started::AllReduce(ReduceOp::Sum), std::mem::replace(&mut input, fresh))?;
                    input = g.finish(dev, started)?;
                } else {
                    call(&mut input, &mut output)?;
                }
                D::finish(&g)?;
                let got = match op {
                    Coll::AllReduce | Coll::Broadcast => dev.read_f32(&input)?,
                    _ => dev.read_f32(&output)?,
                };
                let want: Vec<f32> = match op {
                    Coll::AllReduce => (0..c).map(|i| (0..n).map(|r| value(r, i)).sum()).collect(),
                    Coll::Broadcast => (0..c).map(|i| value(0, i)).collect(),
                    Coll::AllGather => (0..c).map(|i| value(i / per, i % per)).collect(),
                    Coll::ReduceScatter => (0..per).map(|i| (0..n).map(|r| value(r, me * per + i)).sum()).collect(),
                    Coll::AllToAll => (0..c).map(|i| value(i / per, me * per + i % per)).collect(),
                    Coll::SendRecv if n > 1 => (0..c).map(|i| value(prev, i)).collect(),
                    Coll::SendRecv => got.clone(),
                };
                wrong += got.iter().zip(&want).filter(|(x, y)| x != y).count() as u64 + got.len().abs_diff(want.len()) as u64;
            }
            let mut w = vec![wrong as f32];
            HostCollective::all_reduce(&ctl, &mut w, ReduceOp::Sum)?;
            let s = match op {
                Coll::AllGather | Coll::AllToAll | Coll::ReduceScatter => count * esize,
                _ => count * esize,
            } as f64;
            let algbw = s / time / 1e9;
            rows.push(CollRow {
                op: op.name().into(),
                size_bytes: count * esize,
                // nccl-tests prints each rank's own count for these: the send buffer of
                // an all-gather, the receive buffer of a reduce-scatter, a peer's share of
                // an all-to-all.
                count: if matches!(op, Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll) { count / n as u64 } else { count },
                dtype: nccl_type_name(a.dtype).into(),
                redop: if matches!(op, Coll::AllReduce | Coll::ReduceScatter) { "sum" } else { "none" }.into(),
                root: if op == Coll::Broadcast { 0 } else { -1 },
                time_us: time * 1e6,
                algbw_gbps: algbw,
                busbw_gbps: algbw * op.bus_factor(n),
                // None with -c 0: nothing was checked (JSON null, the table's N/A).
                wrong: (a.check > 0).then_some(w[0] as u64),
                ranks: n,
                nodes,
                transport: D::transport().into(),
                device: dev.name(),
            });
            if me == 0 {
                progress(&format!("{done}/{total}: {} {} B: {:.2} us, busbw {:.2} GB/s", op.name(), count * esize, time * 1e6, algbw * op.bus_factor(n)));
            }
        }
    }
    Ok((me == 0).then_some(rows))
}

// ---------------------------------------------------------------------------------------
// bench step
// ---------------------------------------------------------------------------------------

/// A tp·pp·dp layout with vp chunks per stage, and whether dp shards the weights (FSDP),
/// from `tp=2,pp=1,dp=2`, `pp=2,vp=2` or `dp=2,fsdp`.
pub fn parse_layout(s: &str) -> Result<(u32, u32, u32, u32, bool)> {
    let (mut tp, mut pp, mut dp, mut vp, mut fsdp) = (1, 1, 1, 1, false);
    let mut given = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        // `tp=2,tp=4` ran the last one without a word; `fsdp,fsdp` passed as one.
        let key = part.split_once('=').map_or(part, |(k, _)| k.trim());
        if given.contains(&key) {
            bail!("--layout {s}: {key} is given twice; give each of tp, pp, dp, vp and fsdp once");
        }
        given.push(key);
        if part == "fsdp" {
            fsdp = true;
            continue;
        }
        let (k, v) = part.split_once('=').ok_or_else(|| anyhow!("--layout {s}: use tp=N,pp=N,dp=N,vp=N[,fsdp]"))?;
        let v: u32 = v.trim().parse().ok().filter(|&v| v > 0).ok_or_else(|| anyhow!("--layout {s}: {k} must be a positive integer"))?;
        match k.trim() {
            "tp" => tp = v,
            "pp" => pp = v,
            "dp" => dp = v,
            "vp" => vp = v,
            other => bail!("--layout {s}: '{other}' is not tp, pp, dp, vp or fsdp"),
        }
    }
    // The ranks (tp·pp·dp) and the toy's layers (a few per stage) are u32 products: past
    // a launcher's most ranks they wrapped ("the run has 0 GPUs", "0 layers"), and at
    // pp=4294967295 the toy grew 4294967294 layers and the run hung building them.
    let ranks = u64::from(tp) * u64::from(pp) * u64::from(dp);
    if ranks > runner_dist::launch::MAX_WORLD as u64 {
        bail!("--layout {s}: tp·pp·dp = {ranks} ranks; at most {} (a launcher's most)", runner_dist::launch::MAX_WORLD);
    }
    Ok((tp, pp, dp, vp, fsdp))
}

/// A rank's collective handles, by group name.
type RankGroups<D> = Vec<(String, Box<dyn Collective<D>>)>;

/// What one rank reports.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct RankResult {
    pub rank: usize,
    pub coord: (u32, u32, u32),
    /// Loss of each step; `None` (JSON null) on a pipeline stage without the loss, which
    /// has none to report (it printed as 0.000000, a loss no model reaches).
    pub losses: Vec<Option<f32>>,
    /// Wall seconds of each step on this rank.
    pub step_s: Vec<f64>,
    /// Micro-batches this rank held between their forward and backward at once (a 1F1B
    /// stage: its distance to the last stage plus one, at most the micro-batches).
    pub micro_batches_in_flight: u64,
    /// The device's peak bytes in the last step.
    pub peak_bytes: u64,
    /// Seconds of each step inside collective calls: the graph's, and the gradient
    /// reduction's start and wait (not what an overlapped bucket ran beside the backward).
    pub comm_s: Vec<f64>,
    /// The last step's overlapped gradient buckets, and those of them started while
    /// backward steps were still to run.
    pub buckets: usize,
    pub buckets_in_backward: usize,
    /// sha256 of every weight's bits after the steps, by name order.
    pub weights_sha256: String,
    /// Under Muon, the matrices whose Newton–Schulz this rank runs each step (the
    /// ranks deal them, `Executor::orthogonalises`); 0 under AdamW.
    #[serde(default)]
    pub orthogonalised: usize,
    /// Under Muon, its tensor-parallel mode (`exact` or `blockwise`); absent under AdamW.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub muon_tp_mode: Option<String>,
}

/// What `bench step` runs: the layout, the steps, the micro-batches of each and their
/// schedule, and the toy model (its layers scaled with the pipeline stages).
#[derive(Clone, Debug)]
pub struct StepRun {
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    /// Pipeline chunks per stage (Megatron's virtual pipeline size).
    pub vp: u32,
    /// The dp ranks shard the weights, gradients and AdamW moments (FSDP).
    pub fsdp: bool,
    pub steps: usize,
    pub micro_batches: usize,
    pub schedule: PipelineSchedule,
    pub toy: ToyConfig,
    /// The `--toy` name of `toy`.
    pub toy_name: &'static str,
    /// Overlap the data-parallel gradient reduction with the backward
    /// ([`ExecOptions::overlap_grad_reduce`]), in buckets of at least `bucket` elements
    /// (none: Megatron's size for the group).
    pub overlap: bool,
    pub bucket: Option<usize>,
    /// FSDP passes prefetch the next layer's gather ([`ExecOptions::fsdp_prefetch`]).
    pub prefetch: bool,
    /// FSDP reduce-scatters each micro-batch ([`ExecOptions::fsdp_sharded_grads`]).
    pub sharded_grads: bool,
    /// The optimizer every rank's step runs (AdamW; Muon on layouts that hold whole
    /// matrices, [`StepRun::with_optimizer`]).
    pub optimizer: Optimizer,
}

impl StepRun {
    /// From the command line's words (`--schedule 1f1b|in-order`, `--toy tiny|bench`).
    pub fn new(layout: &str, steps: usize, micro_batches: usize, schedule: &str, toy: &str) -> Result<StepRun> {
        let (tp, pp, dp, vp, fsdp) = parse_layout(layout)?;
        if steps == 0 || micro_batches == 0 {
            bail!("--steps and --micro-batches must be positive");
        }
        let schedule = match schedule {
            "1f1b" => PipelineSchedule::OneFOneB,
            "in-order" => PipelineSchedule::InOrder,
            s => bail!("--schedule {s}: use 1f1b or in-order"),
        };
        let (mut toy, per_stage, toy_name) = match toy {
            "tiny" => (ToyConfig::tiny(), 2, "tiny"),
            "bench" => (ToyConfig::bench(), 4, "bench"),
            t => bail!("--toy {t}: use tiny or bench"),
        };
        toy.layers = per_stage * pp;
        let (overlap, bucket, prefetch, sharded_grads) = (true, None, true, true);
        let optimizer = Optimizer::AdamW;
        let run = StepRun { tp, pp, dp, vp, fsdp, steps, micro_batches, schedule, toy, toy_name, overlap, bucket, prefetch, sharded_grads, optimizer };
        // The sharder's own rules (vp without a pipeline, chunks the layers cannot share,
        // micro-batches the interleaved schedule refuses), before any rank starts.
        run.layout()
            .validate(&run.graph(), tp * pp * dp)
            .map_err(|e| anyhow!("--layout {layout} with the {toy_name} toy ({} layers) and --micro-batches {micro_batches}: {e}", run.toy.layers))?;
        Ok(run)
    }

    /// The run with `--optimizer NAME` (adamw or muon) and `--muon-tp-mode MODE` where
    /// given (exact or blockwise; refused beside adamw). Muon runs on every layout: tp
    /// ranks gather each matrix's blocks (exact) or orthogonalise each their own
    /// (blockwise), FSDP ranks gather their flat pieces of it (`executor/muon.rs`,
    /// `executor/fsdp.rs`).
    pub fn with_optimizer(self, name: &str, muon_tp_mode: Option<&str>) -> Result<StepRun> {
        let optimizer = runner::train::with_muon_tp_mode(runner::train::optimizer_flag(name)?, muon_tp_mode)?;
        Ok(StepRun { optimizer, ..self })
    }

    /// The toy model, with its tensor-parallel roles.
    fn graph(&self) -> runner_graph::Graph {
        with_roles(llama(&self.toy), true)
    }

    /// The layout the ranks shard the toy for.
    fn layout(&self) -> Layout {
        Layout {
            tp: self.tp,
            pp: self.pp,
            cp: 1,
            ep: 1,
            etp: 1,
            dp: self.dp,
            vp: self.vp,
            sequence_parallel: false,
            fsdp: self.fsdp,
            micro_batch: self.toy.batch as u32,
            global_batch: self.toy.batch as u32 * self.dp * self.micro_batches as u32,
            split: Default::default(),
        }
    }

    fn ranks(&self) -> usize {
        (self.tp * self.pp * self.dp) as usize
    }

    /// The run as the flags that say it (what the ranks compare at the rendezvous).
    fn flags(&self) -> String {
        let s = match self.schedule {
            PipelineSchedule::OneFOneB => "1f1b",
            PipelineSchedule::InOrder => "in-order",
        };
        format!(
            "--layout tp={},pp={},dp={},vp={}{} --steps {} --micro-batches {} --schedule {s} --toy {} --overlap-grad-reduce {} --fsdp-prefetch {} --fsdp-sharded-grads {} --ddp-bucket-size {} --optimizer {}{}",
            self.tp,
            self.pp,
            self.dp,
            self.vp,
            if self.fsdp { ",fsdp" } else { "" },
            self.steps,
            self.micro_batches,
            self.toy_name,
            if self.overlap { "on" } else { "off" },
            if self.prefetch { "on" } else { "off" },
            if self.sharded_grads { "on" } else { "off" },
            self.bucket.map_or_else(|| "megatron".to_string(), |b| b.to_string()),
            self.optimizer.name(),
            self.optimizer.muon_tp_mode().map_or_else(String::new, |m| format!(" --muon-tp-mode {}", m.name()))
        )
    }
}

/// The groups rank `r` of a tp·pp·dp mesh belongs to (name, world ranks), those of more
/// than one rank: Megatron's order, tp fastest, then pp, then dp. With more tp ranks than
/// the model's `kv_heads` (a multiple of them), the consecutive tp ranks that share a
/// replicated kv head form `tp-kv`, which sums that head's gradients.
pub fn mesh_groups(tp: u32, pp: u32, dp: u32, kv_heads: u32, r: usize) -> Vec<(&'static str, Vec<usize>)> {
    let at = |t: u32, p: u32, d: u32| ((d * pp + p) * tp + t) as usize;
    let (t, p, d) = ((r as u32) % tp, (r as u32) / tp % pp, (r as u32) / (tp * pp));
    let rep = if kv_heads > 0 && tp > kv_heads && tp.is_multiple_of(kv_heads) { tp / kv_heads } else { 1 };
    let mut out = vec![
        ("tp", (0..tp).map(|x| at(x, p, d)).collect::<Vec<_>>()),
        ("tp-kv", (0..tp).filter(|x| x / rep == t / rep).map(|x| at(x, p, d)).collect()),
        ("pp", (0..pp).map(|x| at(t, x, d)).collect()),
        ("dp", (0..dp).map(|x| at(t, p, x)).collect()),
    ];
    if pp > 1 && (p == 0 || p == pp - 1) {
        out.push(("pp-embed", vec![at(t, 0, d), at(t, pp - 1, d)]));
    }
    out.retain(|(_, m)| m.len() > 1);
    out
}

fn weight_digest<D: Device>(ex: &Executor<D>) -> Result<String> {
    let mut names: Vec<String> = ex
        .graph()
        .tensors
        .iter()
        .filter(|t| t.kind == runner_graph::TensorKind::Weight)
        .map(|t| t.name.clone())
        .collect();
    names.sort();
    // An FSDP rank holds pieces: the whole weights are gathered (every rank calls this).
    let gathered = if ex.fsdp_sharded() { Some(ex.gather_weights()?) } else { None };
    let mut h = Sha256::new();
    for n in names {
        h.update(n.as_bytes());
        let w = match &gathered {
            Some(all) => all.get(&n).cloned().ok_or_else(|| anyhow!("weight '{n}' was not gathered"))?,
            None => ex.weight(&n)?,
        };
        for x in w {
            h.update(x.to_bits().to_le_bytes());
        }
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A step's loss as the table and the progress lines show it: "-" on a stage without it.
fn loss_text(loss: Option<f32>) -> String {
    loss.map_or_else(|| "-".into(), |l| format!("{l:.6}"))
}

/// The toy Llama's kv heads, which decide the `tp-kv` groups of its mesh.
fn toy_kv_heads() -> u32 {
    u32::try_from(ToyConfig::tiny().kv_heads).unwrap_or(u32::MAX)
}

/// One rank's training steps.
fn step_rank<D: Device>(dev: D, groups: RankGroups<D>, run: &StepRun, rank: usize) -> Result<RankResult> {
    let (tp, pp, dp, m) = (run.tp, run.pp, run.dp, run.micro_batches);
    let g = run.graph();
    let l = run.layout();
    let coord = RankCoord {
        tp: rank as u32 % tp,
        pp: rank as u32 / tp % pp,
        cp: 0,
        dp: rank as u32 / (tp * pp),
    };
    let sharded = shard(&g, &l, coord).map_err(|e| anyhow!("sharding the toy model for {l:?}: {e}"))?;
    let options = ExecOptions {
        seed: 3,
        pipeline_schedule: run.schedule,
        overlap_grad_reduce: run.overlap,
        grad_bucket_elems: run.bucket,
        fsdp_prefetch: run.prefetch,
        fsdp_sharded_grads: run.sharded_grads,
        ..ExecOptions::default()
    };
    let mut ex = Executor::for_rank(&sharded, dev, options, groups)?;
    ex.set_optimizer(run.optimizer)?;
    // Each dp rank and micro-batch its own batch; every tp rank and stage of it the same.
    let data: Vec<Vec<(String, Vec<u32>)>> = (0..m as u32).map(|k| batch_inputs(&g, 7 + coord.dp + k * dp)).collect();
    let batches: Vec<Vec<(&str, Input<'_>)>> = data
        .iter()
        .map(|d| {
            d.iter()
                .filter(|(n, _)| sharded.graph.tensor_id(n).is_some())
                .map(|(n, v)| (n.as_str(), Input::U32(v)))
                .collect()
        })
        .collect();
    let (mut losses, mut step_s, mut comm_s) = (Vec::new(), Vec::new(), Vec::new());
    // Both schedules (1F1B, in order) end the model on the last stage.
    let has_loss = coord.pp + 1 == pp;
    for k in 0..run.steps {
        let t0 = std::time::Instant::now();
        let loss = ex.step_micro_batches(&batches, &ADAMW_DEFAULT).with_context(|| format!("rank {rank}, step {k}"))?;
        ex.device().synchronize()?;
        let dt = t0.elapsed().as_secs_f64();
        let loss = has_loss.then_some(loss);
        elog!("rank {rank}: step {k} loss {} ({:.1} ms)", loss_text(loss), dt * 1e3);
        losses.push(loss);
        step_s.push(dt);
        comm_s.push(ex.profile().communication_s);
    }
    let mem = ex.memory();
    let buckets = &ex.profile().grad_buckets;
    Ok(RankResult {
        rank,
        coord: (coord.tp, coord.pp, coord.dp),
        losses,
        step_s,
        micro_batches_in_flight: mem.micro_batches_in_flight,
        peak_bytes: mem.peak_bytes,
        comm_s,
        buckets: buckets.len(),
        buckets_in_backward: buckets.iter().filter(|b| b.steps_left > 0).count(),
        weights_sha256: weight_digest(&ex)?,
        orthogonalised: ex.trainable().iter().filter(|w| ex.orthogonalises(w)).count(),
        muon_tp_mode: run.optimizer.muon_tp_mode().map(|m| m.name().to_string()),
    })
}

/// The most ranks a run in one process takes (`bench collectives -g`'s ceiling).
pub const MAX_THREAD_RANKS: usize = 4096;

pub fn step(run: StepRun, in_process: bool, timeout: Duration, global: &Global) -> Result<()> {
    let (tp, pp, dp) = (run.tp, run.pp, run.dp);
    let n = run.ranks();
    let launch = runner_dist::detect().map_err(|e| anyhow!(e))?;
    let results: Vec<RankResult> = if in_process || (launch.world == 1 && n > 1) {
        // As `bench collectives -g`: past that, the threads' stacks and groups ran the
        // process out of memory (an abort) or for minutes unsaid.
        if n > MAX_THREAD_RANKS {
            bail!(
                "--layout tp={tp},pp={pp},dp={dp} is {n} ranks: a run in one process takes at most {MAX_THREAD_RANKS}, \
                 one thread each; start the ranks under a launcher (srun, torchrun) for more"
            );
        }
        // The single-process run of the layout: every rank a thread, ThreadGroup handles
        // whose sends wait for their receive as NCCL's do, so an order of pipeline sends
        // and receives that would hang GPUs fails here too.
        let mut made: HashMap<(&str, Vec<usize>), Vec<Option<ThreadGroup>>> = HashMap::new();
        let mut handles: Vec<RankGroups<Cpu>> = (0..n).map(|_| Vec::new()).collect();
        for (r, h) in handles.iter_mut().enumerate() {
            for (name, members) in mesh_groups(tp, pp, dp, toy_kv_heads(), r) {
                let pos = members.iter().position(|&m| m == r).unwrap_or(0);
                let hs = made
                    .entry((name, members.clone()))
                    .or_insert_with(|| ThreadGroup::rendezvous(members.len(), timeout).into_iter().map(Some).collect());
                let mine = hs[pos].take().ok_or_else(|| anyhow!("group {name} handed out twice"))?;
                h.push((name.to_string(), Box::new(mine)));
            }
        }
        let hs: Vec<_> = handles
            .into_iter()
            .enumerate()
            .map(|(r, groups)| {
                let run = run.clone();
                std::thread::spawn(move || step_rank(Cpu::new(), groups, &run, r))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| anyhow!("a rank thread panicked"))?)
            .collect::<Result<_>>()?
    } else {
        if launch.world != n {
            bail!("--layout tp={tp},pp={pp},dp={dp} needs {n} ranks, the launcher started {} ({})", launch.world, launch.source);
        }
        #[cfg(feature = "cuda")]
        if rank_device(global.device, launch.local_rank, launch.local_world)?.is_some()
            && let Some(r) = reexec_for_nccl()
        {
            return r;
        }
        let device = rank_device(global.device, launch.local_rank, launch.local_world)?;
        if !global.quiet
            && let Some(note) = waiting_note(&launch, timeout)
        {
            eprintln!("{}", runner::report::visible(&note));
        }
        let world = rendezvous(&launch, &meta(format!("bench step {} {}", run.flags(), transport_of(device))), timeout)?;
        let r = launch.rank;
        let mine = match device {
            None => dist_step(Cpu::new(), &world, &run, r, timeout),
            #[cfg(feature = "cuda")]
            Some(g) => dist_step(runner_exec::cuda::Cuda::new(g)?, &world, &run, r, timeout),
            #[cfg(not(feature = "cuda"))]
            Some(_) => bail!("built without CUDA"),
        };
        let mine = match mine {
            Ok(m) => m,
            Err(e) => {
                // Tell the others at once, then fail.
                world.close();
                return Err(e.context(format!("rank {r} of {n}")));
            }
        };
        // Rank 0 gathers every rank's report over the world group (as text, bit for bit).
        let text = serde_json::to_string(&mine)?;
        let ctl = world.everyone().map_err(|e| anyhow!(e))?;
        let mut len = vec![text.len() as f32];
        HostCollective::all_reduce(&ctl, &mut len, ReduceOp::Max)?;
        let mut words: Vec<f32> = text.bytes().map(|b| f32::from_bits(u32::from(b))).collect();
        words.resize(len[0] as usize, f32::from_bits(u32::from(b' ')));
        let all = HostCollective::all_gather(&ctl, &words)?;
        if r != 0 {
            return Ok(());
        }
        all.chunks(len[0] as usize)
            .map(|c| {
                let s: String = c.iter().map(|w| char::from(w.to_bits() as u8)).collect();
                serde_json::from_str(s.trim_end()).map_err(anyhow::Error::from)
            })
            .collect::<Result<_>>()?
    };
    let muon = matches!(run.optimizer, Optimizer::Muon(_));
    let blockwise = run.optimizer.muon_tp_mode() == Some(runner_exec::executor::MuonTpMode::Blockwise);
    let mut head = vec!["rank", "(tp, pp, dp)", "losses", "step ms (median)", "comm ms", "buckets (in backward)", "in flight", "peak MiB"];
    if muon {
        head.push("NS matrices");
    }
    head.push("weights sha256");
    let mut t = Table::new(format!("toy Llama ({} layers, width {}), {}", run.toy.layers, run.toy.hidden, run.flags()), &head);
    for r in &results {
        // The first step, alone when there is one, warms up.
        let median = |s: &[f64]| Stat::of(&s[usize::from(s.len() > 1)..]).median * 1e3;
        let mut row = vec![
            r.rank.to_string(),
            format!("{:?}", r.coord),
            r.losses.iter().map(|&l| loss_text(l)).collect::<Vec<_>>().join(" "),
            format!("{:.1}", median(&r.step_s)),
            format!("{:.1}", median(&r.comm_s)),
            format!("{} ({})", r.buckets, r.buckets_in_backward),
            r.micro_batches_in_flight.to_string(),
            format!("{:.1}", r.peak_bytes as f64 / f64::from(1u32 << 20)),
        ];
        if muon {
            row.push(r.orthogonalised.to_string());
        }
        row.push(r.weights_sha256[..16].to_string());
        t.rows.push(row);
    }
    t.notes.push(format!(
        "{}; a stage without the loss shows \"-\" (null in JSON); the same digests from two runs mean bit-identical weights; \
         step times are each rank's wall time, the median of the steps after the first (the first, alone, when there is one); \
         comm ms: time inside collective calls, the overlapped gradient buckets' start and wait only (buckets: the data-parallel \
         all-reduces, or under FSDP the layers' reduce-scatters, started during the backward where in backward; \
         --ddp-bucket-size sets the all-reduces' size)",
        plural(results.len(), "rank")
    ));
    if blockwise {
        t.notes.push(
            "NS matrices: the Muon matrices whose Newton-Schulz iteration the rank runs; --muon-tp-mode blockwise: each \
             tensor-parallel rank orthogonalises its own block of a split matrix alone, scaled by the block's shape \
             (Megatron-Core's muon_tp_mode default, an approximation: no tp gather or broadcast); the data-parallel and \
             FSDP ranks deal the matrices, each to one rank of the group, which broadcasts it"
                .into(),
        );
    } else if muon {
        t.notes.push(
            "NS matrices: the Muon matrices whose Newton-Schulz iteration the rank runs; the data-parallel, FSDP and \
             tensor-parallel ranks deal them, each matrix to one rank, which broadcasts it (--muon-tp-mode exact: \
             a split matrix's blocks gathered and orthogonalised whole)"
                .into(),
        );
    }
    if !in_process && launch.world > 1 {
        t.notes.push(launch_note(&launch));
    }
    // The CSV: each rank's figures as the JSON has them (its losses and step times as
    // lists of seconds, the whole digest), not the table's medians in ms.
    emit_csv(global, &t, &results, &runner::report::records(&results))
}

fn dist_step<D: Groups>(dev: D, world: &TcpWorld, run: &StepRun, r: usize, timeout: Duration) -> Result<RankResult> {
    let mut groups = Vec::new();
    for (name, members) in mesh_groups(run.tp, run.pp, run.dp, toy_kv_heads(), r) {
        let g: Box<dyn Collective<D>> = Box::new(dev.group(world, name, &members, timeout)?);
        groups.push((name.to_string(), g));
    }
    step_rank(dev, groups, run, r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_exec::executor::{MUON_DEFAULT, Muon, MuonTpMode};

    /// A launched rank says where it waits and for how long, rank 0 for how many; a single
    /// process (or one without a rendezvous address) says nothing.
    #[test]
    fn a_launched_rank_says_where_it_waits() {
        let at = |rank, world, host: &str| Launch {
            rank,
            world,
            local_rank: rank,
            local_world: None,
            master: Some((host.into(), 29657)),
            source: "torchrun environment",
        };
        let t = Duration::from_secs(300);
        assert_eq!(
            waiting_note(&at(0, 3, "127.0.0.1"), t).unwrap(),
            "rank 0 of 3 (torchrun environment): waiting at 127.0.0.1:29657 for the other 2 ranks; gives up after 300 s (--timeout)"
        );
        assert_eq!(
            waiting_note(&at(1, 2, "::1"), t).unwrap(),
            "rank 1 of 2 (torchrun environment): meeting rank 0 at [::1]:29657; gives up after 300 s (--timeout)"
        );
        assert_eq!(waiting_note(&at(0, 2, "h"), t).unwrap().split(';').next().unwrap(), "rank 0 of 2 (torchrun environment): waiting at h:29657 for the other 1 rank");
        assert_eq!(waiting_note(&at(0, 1, "h"), t), None);
        assert_eq!(waiting_note(&Launch { master: None, ..at(0, 2, "h") }, t), None);
    }

    /// Nodes are distinct host names: ranks on one host whose launcher gave no local
    /// ranks (each local 0) are one node, two hosts whose launcher did are two.
    #[test]
    fn nodes_are_hosts() {
        let w = |named: bool, h: [f32; 3], local: f32| [f32::from(u8::from(named)), h[0], h[1], h[2], local];
        let (a, b) = ([1.0, 2.0, 65535.0], [1.0, 2.0, 65534.0]);
        assert_eq!(count_nodes(&[w(true, a, 0.0), w(true, a, 0.0), w(true, a, 0.0)].concat()), 1);
        assert_eq!(count_nodes(&[w(true, a, 0.0), w(true, a, 1.0), w(true, b, 0.0), w(true, b, 1.0)].concat()), 2);
        // A rank without a host name: local ranks 0 count.
        assert_eq!(count_nodes(&[w(true, a, 0.0), w(false, [0.0; 3], 0.0), w(true, a, 1.0)].concat()), 2);
        let me = host_words(3);
        assert_eq!((me[0], me[4]), (1.0, 3.0), "this Linux host's name is read");
        assert!(me[1..4].iter().all(|&x| x.fract() == 0.0 && (0.0..65536.0).contains(&x)));
    }

    /// Threads of one process (-g 2) meet on a port held from the moment it is picked:
    /// no other process can take it before rank 0 listens (a second -g run started at
    /// once; before, the port was let go, and rank 0 bound it again later or failed).
    #[test]
    fn threads_meet_on_a_port_held_from_the_start() {
        let (ranks, held) = local_ranks(2).unwrap();
        let port = ranks[0].master.as_ref().unwrap().1;
        for at in ["127.0.0.1", "0.0.0.0"] {
            assert!(std::net::TcpListener::bind((at, port)).is_err(), "another process could take port {port} on {at}");
        }
        let meta = RunMeta::default();
        let one = {
            let (l, m) = (ranks[1].clone(), meta.clone());
            std::thread::spawn(move || rendezvous(&l, &m, Duration::from_secs(10)).map(|w| w.size()))
        };
        let zero = rendezvous_on(held.unwrap(), &ranks[0], &meta, Duration::from_secs(10)).unwrap();
        assert_eq!((zero.size(), one.join().unwrap().unwrap()), (2, 2));
    }

    /// The host words: read or not, FNV-1a 64 of the name (trimmed) in three 16-bit
    /// pieces from the low end, the local rank; a blank name is not read.
    #[test]
    fn host_words_are_the_names_fnv_hash_in_pieces() {
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c.
        assert_eq!(host_words_of(Some(" a\n"), 2), [1.0, 60556.0, 34305.0, 56396.0, 2.0]);
        assert_eq!(host_words_of(Some(" "), 1), [0.0, 0.0, 0.0, 0.0, 1.0]);
        assert_eq!(host_words_of(None, 0), [0.0; HOST_WORDS]);
        // How a rank on this device talks: NCCL on a GPU, TCP on a CPU.
        assert_eq!((transport_of(Some(0)), transport_of(None)), ("on GPUs (NCCL)", "on CPUs (TCP)"));
    }

    /// Which GPU a rank computes on, where no GPU count is read: none for `cpu`, GPU N +
    /// the local rank for `cuda:N` (N > 0); the emulated device runs no collectives.
    #[test]
    fn ranks_of_cuda_n_count_from_n() {
        assert_eq!(rank_device(DeviceSpec::Cpu, 3, Some(4)).unwrap(), None);
        assert_eq!(rank_device(DeviceSpec::Cuda(2), 1, Some(2)).unwrap(), Some(3));
        let e = rank_device(DeviceSpec::CudaEmulated, 0, None).unwrap_err().to_string();
        assert!(e.starts_with("--device cuda-emulated runs no NCCL"), "{e}");
    }

    /// A one-rank all-reduce sweep from `minbytes` to `maxbytes` by `stepfactor`.
    fn sweep(minbytes: u64, maxbytes: u64, stepfactor: u64) -> CollArgs {
        CollArgs {
            minbytes,
            maxbytes,
            stepfactor,
            stepbytes: None,
            ngpus: 1,
            iters: 1,
            warmup: 0,
            check: 1,
            dtype: Elem::F32,
            ops: vec![Coll::AllReduce],
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn sizes_and_flags_follow_nccl_tests() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("32M").unwrap(), 32 << 20);
        assert!(parse_size("3X").is_err());
        let a = sweep(8, 128, 4);
        assert_eq!(a.sizes().unwrap(), [8, 32, 128]);
        let a = CollArgs { stepbytes: Some(40), ..a };
        assert_eq!(a.sizes().unwrap(), [8, 48, 88, 128]);
        assert_eq!(Coll::AllReduce.bus_factor(4), 1.5);
        assert_eq!(Coll::AllGather.bus_factor(4), 0.75);
        assert_eq!(Coll::SendRecv.bus_factor(4), 1.0);
        assert_eq!(Coll::parse("alltoall").unwrap(), Coll::AllToAll);
        assert_eq!(Coll::parse("all-reduce").unwrap(), Coll::AllReduce);
    }

    #[test]
    fn mesh_groups_match_megatron_order() {
        assert_eq!(mesh_groups(2, 1, 2, 2, 3), vec![("tp", vec![2, 3]), ("dp", vec![1, 3])]);
        // tp = 4 over 2 kv heads: ranks 0-1 and 2-3 share a kv head each.
        assert_eq!(mesh_groups(4, 1, 1, 2, 2), vec![("tp", vec![0, 1, 2, 3]), ("tp-kv", vec![2, 3])]);
        let g = mesh_groups(1, 2, 1, 2, 1);
        assert_eq!(g, vec![("pp", vec![0, 1]), ("pp-embed", vec![0, 1])]);
        // Three stages: the tied embedding joins the first and the last, not the middle.
        assert_eq!(mesh_groups(1, 3, 1, 2, 1), vec![("pp", vec![0, 1, 2])]);
        assert_eq!(mesh_groups(1, 3, 1, 2, 2), vec![("pp", vec![0, 1, 2]), ("pp-embed", vec![0, 2])]);
        assert!(parse_layout("tp=2,dp=2").is_ok() && parse_layout("xp=2").is_err() && parse_layout("tp=0").is_err());
        assert_eq!(parse_layout("pp=2,vp=2").unwrap(), (1, 2, 1, 2, false));
        assert_eq!(parse_layout("dp=2,fsdp").unwrap(), (1, 1, 2, 1, true));
        // The sharder's rules, before any rank starts.
        let bad = |layout: &str, m: usize| StepRun::new(layout, 1, m, "1f1b", "tiny").unwrap_err().to_string();
        assert!(bad("vp=2", 1).contains("needs pp > 1"), "{}", bad("vp=2", 1));
        assert!(StepRun::new("pp=2,vp=2", 1, 4, "1f1b", "tiny").is_ok());
        let odd = bad("pp=2,vp=2", 3);
        assert!(odd.contains("(m = 3) to be a multiple of pp=2"), "{odd}");
        let chunks = bad("pp=2,vp=3", 3 * 2);
        assert!(chunks.contains("6 pipeline chunks but the 4 layers"), "{chunks}");
    }

    /// Sizes from 0 start at 1 byte, a step factor under 2 doubles, a step of 0 bytes
    /// adds 1: the sweep always ends. Sizes take k as K and spaces; a size past 2^64 is refused.
    #[test]
    fn sweeps_always_end_and_sizes_read_as_written() {
        let a = sweep(0, 4, 1);
        assert_eq!(a.sizes().unwrap(), [1, 2, 4]);
        assert_eq!(CollArgs { stepbytes: Some(0), maxbytes: 3, ..a }.sizes().unwrap(), [1, 2, 3]);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size(" 64 K").unwrap(), 65536);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("17179869183G").unwrap(), ((1 << 34) - 1) << 30);
        assert!(parse_size("17179869184G").is_err(), "2^64 bytes");
    }

    /// A sweep up to the largest size there is ends: the next size would not fit in a
    /// u64 (it saturated at u64::MAX and was pushed again for ever, taking all memory).
    #[test]
    fn a_sweep_to_the_largest_size_ends() {
        let a = sweep(1 << 62, u64::MAX, 2);
        assert_eq!(a.sizes().unwrap(), [1 << 62, 1 << 63]);
        assert_eq!(CollArgs { minbytes: u64::MAX - 1, stepbytes: Some(1 << 20), ..a }.sizes().unwrap(), [u64::MAX - 1]);
    }

    /// A sweep of more than MAX_SIZES sizes is refused before one is run: `-b 1 -e 64G -i 1`
    /// built a list of 2^36 sizes and took every byte of memory. The last count that fits runs.
    #[test]
    fn a_sweep_of_too_many_sizes_is_refused() {
        let by = |step: u64, max: u64| CollArgs { stepbytes: Some(step), ..sweep(1, max, 2) }.sizes();
        assert_eq!(by(1, MAX_SIZES as u64).unwrap().len(), MAX_SIZES);
        let e = by(1, MAX_SIZES as u64 + 1).unwrap_err().to_string();
        assert_eq!(e, "-b 1 to -e 4097 with -i 1 is more than 4096 sizes: raise -i (or -b), lower -e, or grow the size by a factor (-f 2)");
        assert!(by(1, 64 << 30).is_err());
    }

    /// Without every host name, the ranks of local rank 0 are the nodes (at least one);
    /// with them all, the distinct names.
    #[test]
    fn nodes_without_every_host_name_are_local_ranks_zero() {
        let w = |named: bool, h: f32, local: f32| [f32::from(u8::from(named)), h, 0.0, 0.0, local];
        assert_eq!(count_nodes(&[w(true, 7.0, 0.0), w(true, 7.0, 1.0), w(false, 0.0, 1.0)].concat()), 1);
        assert_eq!(count_nodes(&[w(false, 0.0, 0.0), w(false, 0.0, 1.0), w(false, 0.0, 2.0)].concat()), 1);
        assert_eq!(count_nodes(&w(false, 0.0, 1.0)), 1, "at least one node");
        // tp = 8 over 3 kv heads (not a multiple): no rank shares a kv head.
        assert_eq!(mesh_groups(8, 1, 1, 3, 0), vec![("tp", (0..8).collect::<Vec<_>>())]);
    }

    /// The layout's words as people write them (spaces, an empty part); zero steps or
    /// micro-batches refused; the flags the ranks compare say the whole run.
    #[test]
    fn step_runs_read_their_words_and_say_them_back() {
        assert_eq!(parse_layout("tp = 2,, dp= 2").unwrap(), (2, 1, 2, 1, false));
        // A degree given twice, and ranks past a launcher's most (their u32 products wrapped).
        assert_eq!(parse_layout("tp=2, tp =4").unwrap_err().to_string(), "--layout tp=2, tp =4: tp is given twice; give each of tp, pp, dp, vp and fsdp once");
        assert_eq!(parse_layout("dp=2,fsdp, fsdp").unwrap_err().to_string(), "--layout dp=2,fsdp, fsdp: fsdp is given twice; give each of tp, pp, dp, vp and fsdp once");
        assert_eq!(parse_layout("pp=1048576").unwrap(), (1, 1048576, 1, 1, false));
        assert_eq!(parse_layout("dp=65536,tp=65536").unwrap_err().to_string(), "--layout dp=65536,tp=65536: tp·pp·dp = 4294967296 ranks; at most 1048576 (a launcher's most)");
        assert!(parse_layout("pp=4294967295").unwrap_err().to_string().contains("4294967295 ranks"));
        for (steps, micro_batches) in [(0, 1), (1, 0)] {
            let e = StepRun::new("dp=2", steps, micro_batches, "1f1b", "tiny").unwrap_err().to_string();
            assert_eq!(e, "--steps and --micro-batches must be positive");
        }
        let a = StepRun::new("dp=2,fsdp", 3, 2, "in-order", "tiny").unwrap();
        assert_eq!(
            a.flags(),
            "--layout tp=1,pp=1,dp=2,vp=1,fsdp --steps 3 --micro-batches 2 --schedule in-order --toy tiny \
             --overlap-grad-reduce on --fsdp-prefetch on --fsdp-sharded-grads on --ddp-bucket-size megatron --optimizer adamw"
        );
        let b = StepRun { bucket: Some(1000), ..StepRun::new("pp=2,vp=2", 1, 4, "1f1b", "tiny").unwrap() };
        assert!(b.flags().starts_with("--layout tp=1,pp=2,dp=1,vp=2 --steps 1 --micro-batches 4 --schedule 1f1b"), "{}", b.flags());
        assert!(b.flags().ends_with("--ddp-bucket-size 1000 --optimizer adamw"), "{}", b.flags());
        // The optimizer is part of what the ranks compare at the rendezvous.
        let muon = b.clone().with_optimizer("muon", None).unwrap();
        assert_eq!((muon.optimizer, muon.flags().ends_with("--optimizer muon --muon-tp-mode exact")), (Optimizer::Muon(MUON_DEFAULT), true), "{}", muon.flags());
        // So is Muon's tensor-parallel mode.
        let blockwise = b.with_optimizer("muon", Some("blockwise")).unwrap();
        assert_eq!(blockwise.optimizer, Optimizer::Muon(Muon { tp_mode: MuonTpMode::Blockwise, ..MUON_DEFAULT }));
        assert!(blockwise.flags().ends_with("--optimizer muon --muon-tp-mode blockwise"), "{}", blockwise.flags());
    }

    /// `--optimizer` takes adamw and muon on every layout (tensor-parallel ranks gather
    /// their blocks of each matrix, FSDP ranks their flat pieces), and names the two
    /// for anything else.
    #[test]
    fn muon_is_taken_on_every_layout() {
        let run = |layout: &str, opt: &str| StepRun::new(layout, 1, 1, "1f1b", "tiny").unwrap().with_optimizer(opt, None);
        for layout in ["dp=2", "pp=2,dp=2", "pp=4", "tp=2", "tp=2,pp=2", "dp=2,fsdp", "tp=2,pp=2,fsdp"] {
            assert_eq!(run(layout, "muon").unwrap().optimizer, Optimizer::Muon(MUON_DEFAULT), "{layout}");
            assert_eq!(run(layout, "adamw").unwrap().optimizer, Optimizer::AdamW, "{layout}");
        }
        assert!(run("dp=2", "sgd").unwrap_err().to_string().contains("--optimizer sgd: unknown optimizer 'sgd': use adamw or muon"));
        // Muon's tensor-parallel mode, on every layout; beside adamw, refused.
        let run = |layout: &str, opt: &str, mode: &str| StepRun::new(layout, 1, 1, "1f1b", "tiny").unwrap().with_optimizer(opt, Some(mode));
        for layout in ["tp=2", "tp=2,dp=2", "tp=2,pp=2,fsdp", "dp=2"] {
            assert_eq!(run(layout, "muon", "blockwise").unwrap().optimizer, Optimizer::Muon(Muon { tp_mode: MuonTpMode::Blockwise, ..MUON_DEFAULT }), "{layout}");
            assert_eq!(run(layout, "muon", "exact").unwrap().optimizer, Optimizer::Muon(MUON_DEFAULT), "{layout}");
            let e = run(layout, "adamw", "blockwise").unwrap_err().to_string();
            assert!(e.contains("--muon-tp-mode blockwise") && e.contains("give --optimizer muon"), "{layout}: {e}");
        }
    }
}
