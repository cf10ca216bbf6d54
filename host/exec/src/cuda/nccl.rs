//! NCCL as a [`Collective`] on [`Cuda`] buffers, through cudarc's `nccl` result layer (its
//! safe `Comm` and `Group` panic in `Drop` on an error, so they are not used).
//!
//! - Library: cudarc looks for `libnccl.so`, but NCCL's soname is `libnccl.so.2` (the pip
//!   wheel and the runtime package ship only that). [`nccl_library`] checks before any NCCL
//!   call and, when only `libnccl.so.2` exists, names it and [`nccl_shim_dir`] makes a
//!   directory with a `libnccl.so` link to it, which the runner puts on the loader path
//!   (it re-executes itself with it).
//! - Communicators: one per group, from a unique id rank 0 of the group makes and sends
//!   over the TCP control plane (`runner-dist`). `ncclCommInitRank` runs on a helper
//!   thread so a rank that never joins is a timeout, not a hang. Every connection is made
//!   there too ([`eager_connections`]: `NCCL_RUNTIME_CONNECT=0`): NCCL 2.22+ otherwise
//!   connects inside a group's first collectives, on the caller's thread, where a peer
//!   alive but not calling would hold it with no deadline.
//! - Communicators block (NCCL's default). Non-blocking ones would bound every call, but
//!   NCCL 2.28 finishes each of their calls on a fresh thread (`ncclInProgress` from every
//!   collective, polled to completion), host time per call that would inflate small
//!   messages' latency against nccl-tests. A call that returns `ncclInProgress` anyway
//!   (`NCCL_COMM_BLOCKING=0` in the environment) is polled with the deadline ([`settle`]).
//! - Errors and timeouts: no call waits on the host for its completion (so the host keeps
//!   queueing kernels while NCCL runs, as PyTorch's process group does). Each call's end
//!   event goes to the group's watchdog thread (PyTorch's NCCL watchdog), which watches
//!   the calls oldest first: each must complete within the timeout of starting (an event
//!   recorded right before it is reached; not of being queued, since the host queues
//!   ahead of the device and a call may wait behind this rank's own kernels), and
//!   meanwhile it checks NCCL's asynchronous error and the control plane (which knows
//!   when another rank's process died). Any of those makes it abort the communicator
//!   (`ncclCommAbort` unblocks the kernels waiting on peers, so the device's stream and
//!   every host wait on it go on) and keep the reason, naming the rank when it is known;
//!   the group's next call, and [`Collective::health`] (which the executor checks after
//!   each step's synchronisation), fail with it. Abort frees the communicator: every
//!   NCCL call holds the read side of a lock whose write side the abort takes, so it
//!   never runs under one, and nothing calls NCCL on the communicator after.
//!   [`NcclGroup::set_blocking`] (false) takes the calls off the watchdog for
//!   benchmarks, which wait once after a batch of calls ([`NcclGroup::wait`]).
//! - All-to-all (fixed and variable chunks) is a group of sends and receives, as in
//!   nccl-tests' `alltoall_perf`.
//! - Started collectives ([`Collective::start`]: the overlapped gradient buckets' all-
//!   reduces, FSDP's prefetched all-gathers and overlapped reduce-scatters) run on a
//!   second stream of the group, in the order they were started, after an event on the
//!   device's stream (so after the kernels that wrote their input); finishing one makes
//!   the device's stream wait for its end event (the watchdog watches it). The input of an
//!   all-gather or reduce-scatter stays alive until then (its result has a buffer of
//!   its own). Two communicators' kernels then run at once (a data-parallel reduction
//!   beside a tensor-parallel one), as in Megatron with `overlap_grad_reduce`; every
//!   rank issues each communicator's calls in the same order, and while any is started
//!   the caller makes no call on the group's own stream (the communicator runs on one
//!   stream at a time, as PyTorch's process group runs all of one communicator's
//!   collectives on its own stream).

use std::ffi::c_void;
use std::path::PathBuf;
use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream};
use cudarc::nccl::{result as nr, sys as ns};

use super::{Cuda, CudaBuffer};
use crate::collective::{Collective, InFlight, ReduceOp, Started};
use crate::device::{Device, DeviceBuffer, Elem, ExecError};

/// Reports a failure elsewhere in the run (a dead rank), when the control plane knows one.
pub type FailureOracle = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// Directories where `libnccl.so.2` may be: the loader path, the system's, and the pip
/// wheel's under every Python site-packages found.
fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect();
    dirs.extend(["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/lib", "/usr/local/cuda/lib64"].map(PathBuf::from));
    for root in ["/usr/lib", "/usr/local/lib", "/opt/conda/lib"] {
        if let Ok(rd) = std::fs::read_dir(root) {
            for e in rd.flatten() {
                let p = e.path().join("site-packages/nvidia/nccl/lib");
                if p.is_dir() {
                    dirs.push(p);
                }
                let p = e.path().join("dist-packages/nvidia/nccl/lib");
                if p.is_dir() {
                    dirs.push(p);
                }
            }
        }
    }
    dirs
}

/// The `libnccl.so.2` found in [`candidate_dirs`], if any.
pub fn find_nccl_so2() -> Option<PathBuf> {
    candidate_dirs().into_iter().map(|d| d.join("libnccl.so.2")).find(|p| p.exists())
}

/// Check that the NCCL library loads (cudarc panics on its first call otherwise).
///
/// # Errors
/// [`ExecError::NoCuda`] naming the missing library and, when only `libnccl.so.2` exists,
/// the link to make.
pub fn nccl_library() -> Result<(), ExecError> {
    // SAFETY: only tries to dlopen the names cudarc knows.
    if unsafe { ns::is_culib_present() } {
        return Ok(());
    }
    Err(ExecError::NoCuda(match find_nccl_so2() {
        Some(p) => format!(
            "NCCL is installed as {} but the runner loads libnccl.so: add a link named libnccl.so to it in a \
             directory on LD_LIBRARY_PATH (the runner does this itself for `bench collectives`)",
            p.display()
        ),
        None => "NCCL (libnccl.so) is not on the loader path: install NCCL (apt libnccl2 libnccl-dev, or pip \
                 nvidia-nccl-cu13) and put its lib directory on LD_LIBRARY_PATH"
            .into(),
    }))
}

/// A directory holding a `libnccl.so` link to the `libnccl.so.2` found, for the loader
/// path; `None` when there is no `libnccl.so.2` or the link cannot be made.
pub fn nccl_shim_dir() -> Option<PathBuf> {
    let target = find_nccl_so2()?;
    // The user's cache directory (an empty or relative $XDG_CACHE_HOME ignored, as the
    // XDG spec says: the link never lands under the working directory).
    let base = dirs::cache_dir().unwrap_or_else(std::env::temp_dir);
    let dir = base.join("runner").join("nccl-shim");
    std::fs::create_dir_all(&dir).ok()?;
    // Every rank of a node (and of a shared home) may do this at once: each makes its own
    // link and renames it over the shared name, which is atomic, so no rank sees the
    // name missing or fails on another's link.
    let link = dir.join("libnccl.so");
    let mine = dir.join(format!("libnccl.so.{}", std::process::id()));
    let _ = std::fs::remove_file(&mine);
    std::os::unix::fs::symlink(&target, &mine).ok()?;
    if std::fs::rename(&mine, &link).is_err() {
        let _ = std::fs::remove_file(&mine);
        return None;
    }
    Some(dir)
}

/// A fresh NCCL unique id (made by one rank, sent to the others).
///
/// # Errors
/// NCCL missing or failing.
pub fn unique_id() -> Result<[u8; 128], ExecError> {
    nccl_library()?;
    let id = nr::get_uniqueid().map_err(|e| nerr("ncclGetUniqueId", e))?;
    Ok(id.internal.map(|c| c as u8))
}

fn nerr(what: &str, e: nr::NcclError) -> ExecError {
    ExecError::Device {
        device: "nccl".into(),
        what: format!("{what}: {:?}", e.0),
    }
}

/// An oracle that knows of no failure.
/// Rank `r` of a group of `size` as NCCL's int, or an error: a rank past the group (or a
/// group past an int) is refused here rather than reaching NCCL wrapped, where a rank
/// of 2^32 + 1 would silently name rank 1.
fn rank_arg(what: &str, r: usize, size: usize) -> Result<i32, ExecError> {
    match (i32::try_from(r), i32::try_from(size)) {
        (Ok(ri), Ok(_)) if r < size => Ok(ri),
        _ => Err(ExecError::State(format!("collective: {what}: rank {r} is not one of a group of {size} (at most {} ranks)", i32::MAX))),
    }
}

fn no_oracle() -> FailureOracle {
    Arc::new(|| None)
}

fn nccl_op(op: ReduceOp) -> ns::ncclRedOp_t {
    match op {
        ReduceOp::Sum => ns::ncclRedOp_t::ncclSum,
        ReduceOp::Max => ns::ncclRedOp_t::ncclMax,
    }
}

fn nccl_type(e: Elem) -> ns::ncclDataType_t {
    match e {
        Elem::F32 => ns::ncclDataType_t::ncclFloat32,
        Elem::BF16 => ns::ncclDataType_t::ncclBfloat16,
        Elem::F16 => ns::ncclDataType_t::ncclFloat16,
        Elem::F8E4M3 => ns::ncclDataType_t::ncclFloat8e4m3,
        Elem::F8E5M2 => ns::ncclDataType_t::ncclFloat8e5m2,
        Elem::I32 => ns::ncclDataType_t::ncclInt32,
    }
}

/// Ask NCCL to make every connection while a communicator initialises (with its
/// deadline) rather than inside the first collectives (`NCCL_RUNTIME_CONNECT=0`), unless
/// the environment says otherwise. Call at the start of `main`, before any thread exists:
/// NCCL reads its environment once, and changing the environment is only sound while no
/// other thread reads it.
///
/// # Safety
/// No other thread may run (or read the environment) during the call.
pub unsafe fn eager_connections() {
    if std::env::var_os("NCCL_RUNTIME_CONNECT").is_none() {
        // SAFETY: the caller guarantees a single thread.
        unsafe { std::env::set_var("NCCL_RUNTIME_CONNECT", "0") };
    }
}

/// Waits until an NCCL call that returned `ncclInProgress` has finished its work: polls
/// `state` (NCCL's asynchronous error for the communicator) until it is no longer
/// `ncclInProgress`, checking `oracle` (a dead rank elsewhere) and `deadline` between
/// polls.
///
/// # Errors
/// Why it did not finish: NCCL's error, the oracle's reason, or `on_timeout`.
fn settle(
    mut state: impl FnMut() -> ns::ncclResult_t,
    oracle: &FailureOracle,
    deadline: Instant,
    on_timeout: impl FnOnce() -> String,
) -> Result<(), String> {
    let mut pause = Duration::from_micros(20);
    loop {
        match state() {
            ns::ncclResult_t::ncclSuccess => return Ok(()),
            ns::ncclResult_t::ncclInProgress => {}
            st => {
                let more = oracle().map(|w| format!(" ({w})")).unwrap_or_default();
                return Err(format!("NCCL reported {st:?}{more}"));
            }
        }
        if let Some(why) = oracle() {
            return Err(why);
        }
        if Instant::now() >= deadline {
            return Err(on_timeout());
        }
        // Connections settle in microseconds within a node and in milliseconds across
        // nodes: poll fast first, then back off to a millisecond.
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

/// NCCL's asynchronous error (or `ncclInProgress`) for `comm`.
fn async_state(comm: ns::ncclComm_t) -> ns::ncclResult_t {
    let mut st = ns::ncclResult_t::ncclSuccess;
    // SAFETY: a live communicator; `st` is written.
    let got = unsafe { ns::ncclCommGetAsyncError(comm, &mut st) };
    if got == ns::ncclResult_t::ncclSuccess { st } else { got }
}

/// Abort `comm` (once; `health` then keeps `why`). Waits for the NCCL calls under way on
/// it (they hold `health`'s read side): abort frees the communicator.
fn abort(comm: &Comm, health: &RwLock<Option<String>>, why: String) {
    let mut h = health.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    if h.is_none() {
        // SAFETY: the communicator is live (no abort yet) and no call runs on it.
        let _ = unsafe { nr::comm_abort(comm.0) };
        *h = Some(why);
    }
}

/// A call the watchdog watches: the events right before and after it on its stream, how
/// long it may take once it started, what it was.
struct Call<E> {
    start: E,
    end: E,
    timeout: Duration,
    what: String,
}

/// The watchdog's loop (PyTorch's NCCL watchdog): takes [`Call`]s from `calls` and
/// watches them oldest first (a stream's work completes in order), each until `complete`
/// says its end event is reached. While one is pending it checks `nccl_error` (the
/// communicator's asynchronous error), the oracle (a dead rank) and the call's timeout,
/// counted from when it was first seen started (its start event reached, the front call),
/// polling fast at first and then every millisecond. Returns the first failure, naming
/// the call, or `None` once `calls` is closed and every call completed.
fn watch<E>(
    calls: &mpsc::Receiver<Call<E>>,
    complete: impl Fn(&E) -> Result<bool, String>,
    nccl_error: impl Fn() -> Option<String>,
    oracle: &FailureOracle,
) -> Option<String> {
    let mut pending: VecDeque<Call<E>> = VecDeque::new();
    let mut pause = Duration::from_micros(20);
    let mut open = true;
    // When the front call was seen started: a call queued behind this rank's own long
    // kernels is not a rank that stopped calling.
    let mut started: Option<Instant> = None;
    loop {
        if pending.is_empty() {
            if !open {
                return None;
            }
            // Nothing to watch: sleep until a call comes (or the group ends).
            match calls.recv() {
                Ok(c) => pending.push_back(c),
                Err(_) => return None,
            }
        }
        loop {
            match calls.try_recv() {
                Ok(c) => pending.push_back(c),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        while let Some(c) = pending.front() {
            match complete(&c.end) {
                Ok(true) => {
                    pending.pop_front();
                    started = None;
                    pause = Duration::from_micros(20);
                }
                Ok(false) => break,
                Err(e) => return Some(format!("{}: {e}", c.what)),
            }
        }
        let Some(Call { start, timeout, what, .. }) = pending.front() else { continue };
        if started.is_none() {
            match complete(start) {
                Ok(true) => started = Some(Instant::now()),
                Ok(false) => {}
                Err(e) => return Some(format!("{what}: {e}")),
            }
        }
        if let Some(e) = nccl_error() {
            let more = oracle().map(|w| format!(" ({w})")).unwrap_or_default();
            return Some(format!("{what}: {e}{more}"));
        }
        if let Some(why) = oracle() {
            return Some(format!("{what}: {why}"));
        }
        if started.is_some_and(|t| t.elapsed() >= *timeout) {
            return Some(format!("{what}: timed out: a rank of the group stopped calling (see the other ranks' errors)"));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

struct Comm(ns::ncclComm_t);

/// A collective started on the side stream: its end event.
struct SideCall {
    end: CudaEvent,
}
// SAFETY: an NCCL communicator may be used from any thread (one at a time: the group
// owns it).
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

/// One rank's NCCL communicator over a group.
pub struct NcclGroup {
    comm: Comm,
    dev: Cuda,
    /// The device's stream: collectives are ordered with its kernels.
    stream: Arc<CudaStream>,
    /// The stream of started all-reduces, which overlap the device's kernels.
    side: Arc<CudaStream>,
    rank: usize,
    size: usize,
    name: String,
    timeout: Duration,
    oracle: FailureOracle,
    /// Whether the watchdog watches each call (off: the caller waits, [`NcclGroup::wait`]).
    watched: bool,
    /// `Some(why)` once the communicator was aborted. NCCL calls hold the read side; the
    /// abort takes the write side.
    health: Arc<RwLock<Option<String>>>,
    /// The watchdog's queue of calls, and its thread.
    watchdog: Option<(mpsc::Sender<Call<CudaEvent>>, std::thread::JoinHandle<()>)>,
}

impl NcclGroup {
    /// Join the communicator of `size` ranks that `id` names, as `rank`, on `dev`;
    /// `name` says which group in errors. Waits at most `timeout` for the others.
    ///
    /// # Errors
    /// NCCL missing, a failed or timed-out initialisation (naming a dead rank when the
    /// oracle knows one).
    pub fn new(dev: &Cuda, name: &str, rank: usize, size: usize, id: [u8; 128], timeout: Duration, oracle: FailureOracle) -> Result<NcclGroup, ExecError> {
        nccl_library()?;
        // Both as NCCL's ints (and the group's every rank then, below size).
        let (rank_i, size_i) = (rank_arg(&format!("NCCL init of group '{name}'"), rank, size)?, size as i32);
        let gpu = dev.gpu("NCCL")?;
        let (ctx, stream) = (gpu.ctx.clone(), gpu.stream.clone());
        let side = ctx
            .new_stream()
            .map_err(|e| ExecError::Device { device: dev.name(), what: format!("a stream for group '{name}': {e}") })?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = ctx.bind_to_thread().map_err(|e| format!("{e}")).and_then(|_| {
                let mut comm = std::ptr::null_mut();
                let uid = ns::ncclUniqueId { internal: id.map(|b| b as std::ffi::c_char) };
                // SAFETY: `comm` is written by NCCL; the id is 128 bytes as NCCL's.
                let st = unsafe { ns::ncclCommInitRank(&mut comm, size_i, uid, rank_i) };
                let joined = match st {
                    ns::ncclResult_t::ncclSuccess => Ok(()),
                    ns::ncclResult_t::ncclInProgress => settle(|| async_state(comm), &no_oracle(), Instant::now() + timeout, || "timed out".into()),
                    e => Err(format!("{e:?}")),
                };
                match joined {
                    Ok(()) => Ok(comm as usize),
                    Err(e) => {
                        if !comm.is_null() {
                            // SAFETY: NCCL hands back the communicator of a failed init;
                            // abort frees it and its threads.
                            let _ = unsafe { nr::comm_abort(comm) };
                        }
                        Err(e)
                    }
                }
            });
            let _ = tx.send(r);
        });
        let deadline = Instant::now() + timeout;
        let comm = loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(Ok(c)) => break c as ns::ncclComm_t,
                Ok(Err(e)) => return Err(ExecError::Device { device: dev.name(), what: format!("NCCL init of group '{name}' (rank {rank} of {size}): {e}") }),
                Err(_) => {
                    if let Some(why) = oracle() {
                        return Err(ExecError::State(format!("collective: NCCL init of group '{name}' on rank {rank}: {why}")));
                    }
                    if Instant::now() >= deadline {
                        return Err(ExecError::State(format!(
                            "collective: NCCL init of group '{name}' on rank {rank} timed out after {timeout:?}: a rank \
                             of the group never joined"
                        )));
                    }
                }
            }
        };
        let health: Arc<RwLock<Option<String>>> = Arc::new(RwLock::new(None));
        let (calls, queued) = mpsc::channel::<Call<CudaEvent>>();
        let thread = {
            let (health, oracle, comm) = (Arc::clone(&health), Arc::clone(&oracle), Comm(comm));
            let ctx = gpu.ctx.clone();
            let what = format!("group '{name}' of {size} on rank {rank}");
            std::thread::Builder::new()
                .name(format!("nccl watchdog, {what}"))
                .spawn(move || {
                    let _ = ctx.bind_to_thread();
                    let nccl_error = || {
                        let live = health.read().unwrap_or_else(std::sync::PoisonError::into_inner);
                        match (&*live, async_state(comm.0)) {
                            (Some(_), _) => None,
                            (None, ns::ncclResult_t::ncclSuccess | ns::ncclResult_t::ncclInProgress) => None,
                            (None, st) => Some(format!("NCCL reported {st:?}")),
                        }
                    };
                    let complete = |ev: &CudaEvent| ev.try_is_complete().map_err(|e| format!("CUDA error {e}"));
                    if let Some(why) = watch(&queued, complete, nccl_error, &oracle) {
                        abort(&comm, &health, format!("collective: {why} ({what})"));
                    }
                })
                .map_err(|e| ExecError::Device { device: dev.name(), what: format!("the NCCL watchdog of group '{name}': {e}") })?
        };
        Ok(NcclGroup {
            comm: Comm(comm),
            dev: dev.clone(),
            stream,
            side,
            rank,
            size,
            name: name.into(),
            timeout,
            oracle,
            watched: true,
            health,
            watchdog: Some((calls, thread)),
        })
    }

    /// Whether the watchdog watches each call (true, the default: errors and dead ranks
    /// surface at the next call, or at [`Collective::health`]). Benchmarks turn it off
    /// and [`NcclGroup::wait`] after a batch.
    pub fn set_blocking(&mut self, on: bool) {
        self.watched = on;
    }

    fn fail(&self, what: &str, why: String) -> ExecError {
        let why = format!("collective: {what} (group '{}' of {}) on rank {}: {why}", self.name, self.size, self.rank);
        abort(&self.comm, &self.health, why.clone());
        ExecError::State(why)
    }

    /// A hold on the live communicator, for one NCCL call (the abort waits for it).
    ///
    /// # Errors
    /// It was aborted.
    fn enter(&self, what: &str) -> Result<RwLockReadGuard<'_, Option<String>>, ExecError> {
        let live = self.health.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*live {
            None => Ok(live),
            Some(why) => Err(self.aborted(what, why)),
        }
    }

    fn aborted(&self, what: &str, why: &str) -> ExecError {
        ExecError::State(format!(
            "collective: {what} (group '{}' of {}) on rank {}: the communicator was aborted by an earlier failure: {why}",
            self.name, self.size, self.rank
        ))
    }

    /// NCCL's asynchronous state of the live communicator (an error once aborted).
    fn state(&self) -> ns::ncclResult_t {
        match self.enter("state") {
            Ok(_live) => async_state(self.comm.0),
            Err(_) => ns::ncclResult_t::ncclInternalError,
        }
    }

    /// The start of a call about to be queued on `stream`, for the watchdog (none when
    /// unwatched: benchmarks keep their host time per call).
    fn began(&self, stream: &CudaStream, what: &str) -> Result<Option<CudaEvent>, ExecError> {
        if self.watched { self.event(stream, what).map(Some) } else { Ok(None) }
    }

    /// Hand the call queued on `stream` since `start` to the watchdog.
    fn watch(&self, stream: &CudaStream, start: Option<CudaEvent>, what: &str) -> Result<(), ExecError> {
        let Some(start) = start.filter(|_| self.watched) else { return Ok(()) };
        let end = self.event(stream, what)?;
        if let Some((calls, _)) = &self.watchdog {
            // Its thread ends only after an abort, which the next call reports.
            let _ = calls.send(Call { start, end, timeout: self.timeout, what: what.to_string() });
        }
        Ok(())
    }

    /// Wait for every call queued so far, with the timeout; checks NCCL's asynchronous
    /// error and the control plane while waiting.
    ///
    /// # Errors
    /// An NCCL error, a dead rank, or the timeout: the communicator is aborted.
    pub fn wait(&self, what: &str) -> Result<(), ExecError> {
        self.live(what)?;
        let ev = self.event(&self.stream, what)?;
        self.wait_for(&ev, what)
    }

    fn event(&self, stream: &CudaStream, what: &str) -> Result<CudaEvent, ExecError> {
        stream.record_event(None).map_err(|e| self.fail(what, format!("event: {e}")))
    }

    /// Wait on the host for `ev`, with the timeout, as [`NcclGroup::wait`].
    fn wait_for(&self, ev: &CudaEvent, what: &str) -> Result<(), ExecError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match ev.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(self.fail(what, format!("CUDA error {e}"))),
            }
            self.live(what)?;
            let st = self.state();
            if st != ns::ncclResult_t::ncclSuccess && st != ns::ncclResult_t::ncclInProgress {
                let more = (self.oracle)().map(|w| format!(" ({w})")).unwrap_or_default();
                return Err(self.fail(what, format!("NCCL reported {st:?}{more}")));
            }
            if let Some(why) = (self.oracle)() {
                return Err(self.fail(what, why));
            }
            if Instant::now() >= deadline {
                return Err(self.fail(
                    what,
                    format!("timed out after {:?}: a rank of the group stopped calling (see the other ranks' errors)", self.timeout),
                ));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Refuses a call once the communicator was aborted (abort frees it: NCCL must not
    /// see it again).
    fn live(&self, what: &str) -> Result<(), ExecError> {
        self.enter(what).map(|_| ())
    }

    /// What every call checks before NCCL sees it: the buffer's type ([`movable`]) and
    /// that the communicator is live.
    fn ready(&self, what: &str, b: &CudaBuffer) -> Result<(), ExecError> {
        movable(what, b)?;
        self.live(what)
    }

    fn done(&self, what: &str, start: Option<CudaEvent>, r: Result<nr::NcclStatus, nr::NcclError>) -> Result<(), ExecError> {
        let st = r.map_err(|e| self.fail(what, format!("{:?}", e.0)))?;
        if st == nr::NcclStatus::InProgress {
            // A non-blocking communicator (NCCL_COMM_BLOCKING=0) finishes the call in its
            // own threads: nothing may be called on it, nor an event recorded after the
            // call, until it has.
            self.settle(what)?;
        }
        self.watch(&self.stream, start, what)
    }

    /// [`settle`] on this group's communicator with its timeout and oracle.
    fn settle(&self, what: &str) -> Result<(), ExecError> {
        let timeout = self.timeout;
        settle(|| self.state(), &self.oracle, Instant::now() + timeout, || {
            format!("timed out after {timeout:?}: a rank of the group stopped calling (see the other ranks' errors)")
        })
        .map_err(|why| self.fail(what, why))
    }

    fn ptr(&self, b: &CudaBuffer) -> *mut c_void {
        self.dev.ptr(b) as *mut c_void
    }

    fn stream(&self) -> ns::cudaStream_t {
        self.stream.cu_stream() as ns::cudaStream_t
    }

    fn check(&self, what: &str, got: usize, want: usize) -> Result<(), ExecError> {
        if got != want {
            return Err(ExecError::State(format!("collective: {what} on rank {}: {got} elements where {want} are needed", self.rank)));
        }
        Ok(())
    }

    /// Sends `send[j]` elements (from `input` at its offset) to every rank j and receives
    /// `recv[j]` into `output` from each, as one NCCL group.
    fn exchange(&self, what: &str, input: &CudaBuffer, send: &[usize], output: &CudaBuffer, recv: &[usize]) -> Result<(), ExecError> {
        let w = input.elem().bytes();
        let t = nccl_type(input.elem());
        let (src, dst) = (self.dev.ptr(input), self.dev.ptr(output));
        let (mut so, mut ro) = (0usize, 0usize);
        let start = self.began(&self.stream, what)?;
        let live = self.enter(what)?;
        let r = nr::group_start().and_then(|_| {
            let posted = (|| {
                for j in 0..self.size {
                    // SAFETY: offsets stay inside the buffers (the counts sum to their lengths).
                    unsafe {
                        if send[j] > 0 {
                            // j < size, an int (checked when the group was made).
                            nr::send((src + (so * w) as u64) as *const c_void, send[j], t, j as i32, self.comm.0, self.stream())?;
                        }
                        if recv[j] > 0 {
                            nr::recv((dst + (ro * w) as u64) as *mut c_void, recv[j], t, j as i32, self.comm.0, self.stream())?;
                        }
                    }
                    so += send[j];
                    ro += recv[j];
                }
                Ok(())
            })();
            // The group is closed even when a post failed, so this thread's NCCL group
            // depth is back to zero for any later call.
            let ended = nr::group_end();
            posted.and(ended)
        });
        drop(live);
        self.done(what, start, r)
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        // Finish queued work (on both streams); then, every rank alive, finalize (which
        // may wait for the others at a barrier) and destroy; with a rank known dead, abort.
        let side = self.event(&self.side, "teardown");
        let finished = self.wait("teardown").is_ok() && side.and_then(|ev| self.wait_for(&ev, "teardown")).is_ok();
        // Then the watchdog: every call it watches is complete (or the communicator is
        // aborted), so it ends at once, and never sees the communicator destroyed.
        if let Some((calls, thread)) = self.watchdog.take() {
            drop(calls);
            let _ = thread.join();
        }
        if !finished || self.live("teardown").is_err() {
            return;
        }
        if (self.oracle)().is_some() {
            abort(&self.comm, &self.health, "teardown: a rank of the run died".into());
            return;
        }
        // SAFETY: the communicator is live and idle.
        let settled = match unsafe { nr::comm_finalize(self.comm.0) } {
            Ok(nr::NcclStatus::InProgress) => self.settle("teardown").is_ok(),
            Ok(_) => true,
            Err(_) => false,
        };
        if !settled {
            abort(&self.comm, &self.health, "teardown: finalize failed".into());
            return;
        }
        // SAFETY: finalized; nothing uses it after this.
        let _ = unsafe { nr::comm_destroy(self.comm.0) };
    }
}

/// NCCL moves f32, bf16, f16 and int32 buffers. FP8 codes are refused: each rank's
/// codes carry that rank's own scale, which NCCL would not move (a host transport widens
/// them through the staging copy instead).
fn movable(what: &str, b: &CudaBuffer) -> Result<(), ExecError> {
    match b.elem().fp8() {
        None => Ok(()),
        Some(_) => Err(ExecError::State(format!(
            "collective: {what} of {} codes over NCCL: each rank's FP8 codes have their own scale; widen them to bf16 or f32 first",
            b.elem().name()
        ))),
    }
}

impl Collective<Cuda> for NcclGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn health(&self) -> Result<(), ExecError> {
        self.live("a call the watchdog watched")
    }
    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce(&self, _dev: &Cuda, buf: &mut CudaBuffer, op: ReduceOp) -> Result<(), ExecError> {
        self.ready("all-reduce", buf)?;
        let p = self.ptr(buf);
        // SAFETY: in place on a live buffer of buf.len() elements.
        let start = self.began(&self.stream, "all-reduce")?;
        let r = {
            let _live = self.enter("all-reduce")?;
            unsafe { nr::all_reduce(p, p, buf.len(), nccl_type(buf.elem()), nccl_op(op), self.comm.0, self.stream()) }
        };
        self.done("all-reduce", start, r)
    }

    fn start(&self, dev: &Cuda, what: Started, buf: CudaBuffer) -> Result<InFlight<CudaBuffer>, ExecError> {
        let name = format!("started {}", what.name());
        let name = name.as_str();
        self.ready(name, &buf)?;
        let len = what.out_len(buf.len(), self.size)?;
        // The result's buffer (none: in place), allocated on the device's stream before
        // the event the side stream waits for.
        let out = match what {
            Started::AllReduce(_) => None,
            _ => Some(dev.alloc(buf.elem(), len)?),
        };
        // The side stream takes the input once the kernels queued so far wrote it.
        let written = self.event(&self.stream, name)?;
        self.side.wait(&written).map_err(|e| self.fail(name, format!("stream wait: {e}")))?;
        let side = self.side.cu_stream() as ns::cudaStream_t;
        let (p, q) = (self.ptr(&buf), out.as_ref().map_or(self.ptr(&buf), |o| self.ptr(o)));
        let ty = nccl_type(buf.elem());
        // SAFETY: `p` holds buf.len() elements and `q` the result's `len` (in place for
        // an all-reduce); the InFlight keeps both alive until finish orders the device's
        // stream after the side stream's work.
        let start = self.began(&self.side, name)?;
        let r = {
            let _live = self.enter(name)?;
            unsafe {
                match what {
                    Started::AllReduce(op) => nr::all_reduce(p, q, len, ty, nccl_op(op), self.comm.0, side),
                    Started::AllGather => nr::all_gather(p, q, buf.len(), ty, self.comm.0, side),
                    Started::ReduceScatter => nr::reduce_scatter(p, q, len, ty, ns::ncclRedOp_t::ncclSum, self.comm.0, side),
                }
            }
        };
        if r.map_err(|e| self.fail(name, format!("{:?}", e.0)))? == nr::NcclStatus::InProgress {
            self.settle(name)?;
        }
        let end = self.event(&self.side, name)?;
        self.watch(&self.side, start, name)?;
        Ok(match out {
            None => InFlight::running(buf, None, Box::new(SideCall { end })),
            Some(out) => InFlight::running(out, Some(buf), Box::new(SideCall { end })),
        })
    }

    fn finish(&self, _dev: &Cuda, f: InFlight<CudaBuffer>) -> Result<CudaBuffer, ExecError> {
        let what = "started collective";
        let (buf, input, pending) = f.into_parts();
        let Some(pending) = pending else { return Ok(buf) };
        let started = pending.downcast::<SideCall>().map_err(|_| {
            ExecError::State(format!("collective: {what} (group '{}'): finished on a group that did not start it", self.name))
        })?;
        self.live(what)?;
        self.stream.wait(&started.end).map_err(|e| self.fail(what, format!("stream wait: {e}")))?;
        // An input freed now is freed on the device's stream, after the wait.
        drop(input);
        Ok(buf)
    }

    fn all_gather(&self, _dev: &Cuda, input: &CudaBuffer, output: &mut CudaBuffer) -> Result<(), ExecError> {
        self.ready("all-gather", input)?;
        self.check("all-gather", output.len(), input.len() * self.size)?;
        // SAFETY: output holds size × input elements.
        let start = self.began(&self.stream, "all-gather")?;
        let r = {
            let _live = self.enter("all-gather")?;
            unsafe { nr::all_gather(self.ptr(input), self.ptr(output), input.len(), nccl_type(input.elem()), self.comm.0, self.stream()) }
        };
        self.done("all-gather", start, r)
    }

    fn reduce_scatter(&self, _dev: &Cuda, input: &CudaBuffer, output: &mut CudaBuffer) -> Result<(), ExecError> {
        self.ready("reduce-scatter", input)?;
        self.check("reduce-scatter", input.len(), output.len() * self.size)?;
        // SAFETY: input holds size × output elements.
        let start = self.began(&self.stream, "reduce-scatter")?;
        let r = {
            let _live = self.enter("reduce-scatter")?;
            unsafe {
                nr::reduce_scatter(self.ptr(input), self.ptr(output), output.len(), nccl_type(input.elem()), ns::ncclRedOp_t::ncclSum, self.comm.0, self.stream())
            }
        };
        self.done("reduce-scatter", start, r)
    }

    fn all_to_all(&self, _dev: &Cuda, input: &CudaBuffer, output: &mut CudaBuffer) -> Result<(), ExecError> {
        self.ready("all-to-all", input)?;
        self.check("all-to-all", output.len(), input.len())?;
        if !input.len().is_multiple_of(self.size) {
            return Err(ExecError::State(format!("collective: all-to-all: {} elements do not split over {} ranks", input.len(), self.size)));
        }
        let c = vec![input.len() / self.size; self.size];
        self.exchange("all-to-all", input, &c, output, &c)
    }

    fn all_to_all_v(&self, _dev: &Cuda, input: &CudaBuffer, send: &[usize], output: &mut CudaBuffer, recv: &[usize]) -> Result<(), ExecError> {
        self.ready("all-to-all-v", input)?;
        if send.len() != self.size || recv.len() != self.size {
            return Err(ExecError::State(format!("collective: all-to-all-v: counts for {} ranks in a group of {}", send.len(), self.size)));
        }
        self.check("all-to-all-v send", input.len(), send.iter().sum())?;
        self.check("all-to-all-v recv", output.len(), recv.iter().sum())?;
        self.exchange("all-to-all-v", input, send, output, recv)
    }

    fn broadcast(&self, _dev: &Cuda, buf: &mut CudaBuffer, root: usize) -> Result<(), ExecError> {
        self.ready("broadcast", buf)?;
        let root = rank_arg("broadcast", root, self.size)?;
        let p = self.ptr(buf);
        // SAFETY: in place on a live buffer.
        let start = self.began(&self.stream, "broadcast")?;
        let r = {
            let _live = self.enter("broadcast")?;
            unsafe { nr::broadcast(p, p, buf.len(), nccl_type(buf.elem()), root, self.comm.0, self.stream()) }
        };
        self.done("broadcast", start, r)
    }

    fn send(&self, _dev: &Cuda, peer: usize, buf: &CudaBuffer) -> Result<(), ExecError> {
        self.ready("send", buf)?;
        let peer = rank_arg("send", peer, self.size)?;
        // SAFETY: a live buffer of buf.len() elements.
        let start = self.began(&self.stream, "send")?;
        let r = {
            let _live = self.enter("send")?;
            unsafe { nr::send(self.ptr(buf), buf.len(), nccl_type(buf.elem()), peer, self.comm.0, self.stream()) }
        };
        self.done("send", start, r)
    }

    fn recv(&self, _dev: &Cuda, peer: usize, buf: &mut CudaBuffer) -> Result<(), ExecError> {
        self.ready("recv", buf)?;
        let peer = rank_arg("recv", peer, self.size)?;
        // SAFETY: a live buffer of buf.len() elements.
        let start = self.began(&self.stream, "recv")?;
        let r = {
            let _live = self.enter("recv")?;
            unsafe { nr::recv(self.ptr(buf), buf.len(), nccl_type(buf.elem()), peer, self.comm.0, self.stream()) }
        };
        self.done("recv", start, r)
    }

    fn batch_send_recv(&self, _dev: &Cuda, sends: &[(usize, &CudaBuffer)], recvs: &mut [(usize, &mut CudaBuffer)]) -> Result<(), ExecError> {
        for &(peer, b) in sends {
            self.ready("batched send", b)?;
            rank_arg("batched send", peer, self.size)?;
        }
        for (peer, b) in recvs.iter() {
            self.ready("batched recv", b)?;
            rank_arg("batched recv", *peer, self.size)?;
        }
        let start = self.began(&self.stream, "batched send-recv")?;
        let live = self.enter("batched send-recv")?;
        let r = nr::group_start().and_then(|_| {
            let mut posted = Ok(());
            for &(peer, b) in sends {
                // SAFETY: a live buffer of b.len() elements.
                // Every peer is a rank of the group, an int (checked above).
                posted = posted.and_then(|_| unsafe { nr::send(self.ptr(b), b.len(), nccl_type(b.elem()), peer as i32, self.comm.0, self.stream()) }.map(|_| ()));
            }
            for (peer, b) in recvs.iter_mut() {
                let (p, n, t) = (self.ptr(b), b.len(), nccl_type(b.elem()));
                // SAFETY: a live buffer of n elements.
                posted = posted.and_then(|_| unsafe { nr::recv(p, n, t, *peer as i32, self.comm.0, self.stream()) }.map(|_| ()));
            }
            // Closed even when a post failed (as in `exchange`).
            let ended = nr::group_end();
            posted.and(ended)
        });
        drop(live);
        self.done("batched send-recv", start, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake end event: reached once its flag is set.
    type Flag = Arc<std::sync::atomic::AtomicBool>;

    fn reached(f: &Flag) -> Result<bool, String> {
        Ok(f.load(std::sync::atomic::Ordering::SeqCst))
    }

    fn flag(on: bool) -> Flag {
        Arc::new(std::sync::atomic::AtomicBool::new(on))
    }

    /// A call that started (its start event reached) and ends when `end` is set.
    fn call(end: Flag, timeout: Duration, what: &str) -> Call<Flag> {
        Call { start: flag(true), end, timeout, what: what.to_string() }
    }

    #[test]
    fn the_watchdog_lets_calls_complete_and_ends_with_the_group() {
        let (tx, rx) = mpsc::channel();
        let far = Duration::from_secs(30);
        let flags: Vec<Flag> = (0..3).map(|_| flag(false)).collect();
        for (k, f) in flags.iter().enumerate() {
            tx.send(call(f.clone(), far, &format!("call {k}"))).unwrap();
        }
        // Already past its deadline but reached: not a failure.
        tx.send(call(flag(true), Duration::ZERO, "done late")).unwrap();
        let setter = std::thread::spawn(move || {
            for f in flags {
                std::thread::sleep(Duration::from_millis(5));
                f.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            drop(tx);
        });
        assert_eq!(watch(&rx, reached, || None, &no_oracle()), None);
        setter.join().unwrap();
    }

    #[test]
    fn the_watchdog_times_out_a_call_that_never_completes() {
        let (tx, rx) = mpsc::channel();
        let t0 = Instant::now();
        tx.send(call(flag(true), Duration::ZERO, "all-gather")).unwrap();
        tx.send(call(flag(false), Duration::from_millis(50), "all-reduce")).unwrap();
        let why = watch(&rx, reached, || None, &no_oracle()).unwrap();
        let took = t0.elapsed();
        assert!(why.starts_with("all-reduce: timed out"), "{why}");
        assert!(took >= Duration::from_millis(50) && took < Duration::from_secs(5), "{took:?}");
        drop(tx);
    }

    /// A call queued behind this rank's own kernels for longer than the timeout is not
    /// a rank that stopped calling: its time counts from its start (it counted from
    /// when it was queued, and this one timed out at 50 ms of its 160). One that starts
    /// and then hangs still times out, the timeout after its start.
    #[test]
    fn the_watchdog_counts_a_call_from_its_start_not_from_its_queueing() {
        let set = |f: &Flag| f.store(true, std::sync::atomic::Ordering::SeqCst);
        for hangs in [false, true] {
            let (tx, rx) = mpsc::channel();
            let t0 = Instant::now();
            let (start, end) = (flag(false), flag(false));
            tx.send(Call { start: start.clone(), end: end.clone(), timeout: Duration::from_millis(50), what: "all-reduce".into() }).unwrap();
            let kernels = std::thread::spawn(move || {
                // 150 ms of kernels before the all-reduce, which then takes 10 ms.
                std::thread::sleep(Duration::from_millis(150));
                set(&start);
                if !hangs {
                    std::thread::sleep(Duration::from_millis(10));
                    set(&end);
                    drop(tx);
                }
            });
            let why = watch(&rx, reached, || None, &no_oracle());
            let took = t0.elapsed();
            kernels.join().unwrap();
            if hangs {
                assert!(why.as_deref().is_some_and(|w| w.starts_with("all-reduce: timed out")), "{why:?}");
                assert!(took >= Duration::from_millis(200) && took < Duration::from_secs(5), "{took:?}");
            } else {
                assert_eq!(why, None, "after {took:?}");
            }
        }
    }

    #[test]
    fn the_watchdog_reports_nccls_error_and_a_dead_rank_at_once() {
        let far = Duration::from_secs(30);
        let (tx, rx) = mpsc::channel();
        tx.send(call(flag(false), far, "send")).unwrap();
        let dead: FailureOracle = Arc::new(|| Some("rank 3's process exited".into()));
        let t0 = Instant::now();
        let why = watch(&rx, reached, || Some("NCCL reported ncclRemoteError".into()), &dead).unwrap();
        assert_eq!(why, "send: NCCL reported ncclRemoteError (rank 3's process exited)");
        tx.send(call(flag(false), far, "recv")).unwrap();
        let why = watch(&rx, reached, || None, &dead).unwrap();
        assert_eq!(why, "recv: rank 3's process exited");
        assert!(t0.elapsed() < Duration::from_secs(5));
        // A CUDA error on the event is a failure too.
        let (tx, rx) = mpsc::channel();
        tx.send(call(flag(false), far, "broadcast")).unwrap();
        let why = watch(&rx, |_: &Flag| Err("CUDA error 700".to_string()), || None, &no_oracle()).unwrap();
        assert_eq!(why, "broadcast: CUDA error 700");
    }

    #[test]
    fn settle_waits_while_in_progress_then_succeeds() {
        let mut left = 5;
        let r = settle(
            || {
                if left == 0 {
                    ns::ncclResult_t::ncclSuccess
                } else {
                    left -= 1;
                    ns::ncclResult_t::ncclInProgress
                }
            },
            &no_oracle(),
            Instant::now() + Duration::from_secs(30),
            || unreachable!("no timeout"),
        );
        assert_eq!(r, Ok(()));
        assert_eq!(left, 0, "returned before NCCL finished");
    }

    #[test]
    fn settle_times_out_on_a_peer_that_never_calls() {
        let t0 = Instant::now();
        let r = settle(|| ns::ncclResult_t::ncclInProgress, &no_oracle(), t0 + Duration::from_millis(50), || "timed out".into());
        assert_eq!(r, Err("timed out".into()));
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(50) && took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn settle_reports_nccls_error_and_a_dead_rank() {
        let dead: FailureOracle = Arc::new(|| Some("rank 2's process exited".into()));
        let far = Instant::now() + Duration::from_secs(30);
        let r = settle(|| ns::ncclResult_t::ncclRemoteError, &no_oracle(), far, || unreachable!());
        assert_eq!(r, Err("NCCL reported ncclRemoteError".into()));
        let r = settle(|| ns::ncclResult_t::ncclRemoteError, &dead, far, || unreachable!());
        assert_eq!(r, Err("NCCL reported ncclRemoteError (rank 2's process exited)".into()));
        // Still in progress, but a rank is known dead: fail now, not at the deadline.
        let r = settle(|| ns::ncclResult_t::ncclInProgress, &dead, far, || unreachable!());
        assert_eq!(r, Err("rank 2's process exited".into()));
    }

    /// A rank reaches NCCL as an int only when it is one of the group's: a peer of
    /// 2^32 + 1 used to pass as rank 1 (`as i32`), and a group past an int as a negative
    /// size.
    #[test]
    fn a_rank_outside_its_group_or_past_an_int_is_refused() {
        assert_eq!(rank_arg("send", 0, 2).unwrap(), 0);
        assert_eq!(rank_arg("send", 1, 2).unwrap(), 1);
        let last = i32::MAX as usize;
        assert_eq!(rank_arg("send", last - 1, last).unwrap(), i32::MAX - 1);
        let e = rank_arg("send", 2, 2).unwrap_err().to_string();
        assert_eq!(e, "executor state: collective: send: rank 2 is not one of a group of 2 (at most 2147483647 ranks)");
        assert!(rank_arg("recv", (1 << 32) + 1, 2).is_err(), "2^32 + 1 wraps to rank 1");
        assert!(rank_arg("init", 0, last + 1).is_err(), "a group past an int");
        assert!(rank_arg("init", last, last + 1).is_err());
    }
}
