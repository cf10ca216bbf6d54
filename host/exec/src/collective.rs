//! Collectives: the [`Collective`] trait the executor calls for the communication ops
//! of a sharded graph, on device buffers; [`HostCollective`], the same calls on host
//! slices for transports that move host memory; and [`ThreadGroup`], an in-process
//! [`HostCollective`] over shared memory for ranks that run as threads of one process
//! (tests and CPU runs of a sharded graph).
//!
//! A [`Collective`] takes the device and its buffers: a GPU backend (NCCL, in
//! [`crate::cuda`]) enqueues on the device's stream and never copies to the host. Every
//! [`HostCollective`] is a [`Collective`] on any device through a staging copy (read
//! the buffer, move host memory, write the result back); on the CPU that copy is a
//! memcpy. Int32 buffers travel bit for bit through the f32 transport (only reductions
//! interpret the bits, and they refuse non-f32 buffers).
//!
//! Every reduction sums (or takes the max) in rank order on every rank, so all ranks get
//! bit-identical results and nothing depends on thread timing.
//!
//! An all-reduce, all-gather or reduce-scatter can also be started and finished later
//! ([`Collective::start`]), so that it runs while the rank computes: the executor
//! reduces each bucket of data-parallel gradients this way as soon as the backward has
//! finished it (PyTorch DDP's buckets, Megatron's `overlap_grad_reduce`), and FSDP
//! prefetches the next layer's parameters and reduce-scatters each layer's gradients
//! during the backward. NCCL runs them on a second stream, in the order they were
//! started (PyTorch's process group runs every collective of a communicator on one
//! stream of its own); a host transport with a [`Lane`] (a [`ThreadGroup`], the TCP
//! group of `runner-dist`) on a thread of its own, over a second group of the same
//! ranks; another host transport at once (no overlap, same result).
//!
//! Axis handling (gathering along a non-leading axis) is the caller's:
//! [`Collective::all_gather`] writes the ranks' buffers concatenated in rank order.
//!
//! Nothing waits forever: a rank whose handle is dropped (it returned an error, panicked
//! or finished early) makes every collective and receive that needs it fail at once with
//! an error naming it, and every wait ends after the group's timeout
//! ([`ThreadGroup::with_timeout`], [`DEFAULT_TIMEOUT`] otherwise) with an error naming
//! the call and the ranks that did not arrive; the group is unusable after a timeout.

use std::any::Any;
use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::cpu::Cpu;
use crate::device::{Device, DeviceBuffer, Elem, ExecError};

/// Element-wise reduction of an all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
}

/// One rank's handle on a group of `size` ranks, moving buffers of device `D` (the CPU
/// unless said otherwise).
///
/// Every rank of the group must make the same sequence of calls with equal lengths (as
/// with NCCL). A rank that stops calling makes the others' calls fail: at once when its
/// handle is dropped or its process exits, after the group's timeout otherwise. Calls
/// are ordered on `dev`'s stream with the kernels around them.
pub trait Collective<D: Device = Cpu>: Send {
    /// This rank's index in the group.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// `buf` ← the element-wise reduction of every rank's `buf`, in rank order.
    ///
    /// # Errors
    /// Ranks passed different lengths; a rank left the group or the wait timed out.
    fn all_reduce(&self, dev: &D, buf: &mut D::Buffer, op: ReduceOp) -> Result<(), ExecError>;
    /// `output` (size × `input`'s length) ← every rank's `input`, in rank order.
    ///
    /// # Errors
    /// Ranks passed different lengths; a rank left the group or the wait timed out.
    fn all_gather(&self, dev: &D, input: &D::Buffer, output: &mut D::Buffer) -> Result<(), ExecError>;
    /// `output` ← chunk `rank` (of `size` equal chunks) of the sum of every rank's `input`.
    ///
    /// # Errors
    /// Lengths differ or do not split into `size` chunks; a rank left or timed out.
    fn reduce_scatter(&self, dev: &D, input: &D::Buffer, output: &mut D::Buffer)
    -> Result<(), ExecError>;
    /// Chunk j of `input` goes to rank j; `output` holds, in rank order, the chunk each
    /// rank sent here.
    ///
    /// # Errors
    /// Lengths differ or do not split into `size` chunks; a rank left or timed out.
    fn all_to_all(&self, dev: &D, input: &D::Buffer, output: &mut D::Buffer) -> Result<(), ExecError>;
    /// All-to-all of chunks of different sizes (MPI's alltoallv): `input` holds, in rank
    /// order, `send[j]` elements for rank j; `output` holds, in rank order, the chunk
    /// each rank sent here, `recv[j]` elements from rank j. Receive sizes are known up
    /// front (as NCCL needs them to post its receives): exchange the counts first.
    ///
    /// # Errors
    /// `send` or `recv` not one entry per rank or not matching the buffers, a rank
    /// sending here other than `recv` says; a rank left or timed out.
    fn all_to_all_v(
        &self,
        dev: &D,
        input: &D::Buffer,
        send: &[usize],
        output: &mut D::Buffer,
        recv: &[usize],
    ) -> Result<(), ExecError>;
    /// `buf` ← rank `root`'s `buf`.
    ///
    /// # Errors
    /// `root` outside the group, lengths differ; a rank left or timed out.
    fn broadcast(&self, dev: &D, buf: &mut D::Buffer, root: usize) -> Result<(), ExecError>;
    /// Send `buf` to rank `peer` (a host transport queues it and does not wait for the
    /// receive; NCCL waits for it like any collective).
    ///
    /// # Errors
    /// `peer` outside the group, or it has left it.
    fn send(&self, dev: &D, peer: usize, buf: &D::Buffer) -> Result<(), ExecError>;
    /// `buf` ← the next message rank `peer` sent here, which must have its length.
    ///
    /// # Errors
    /// `peer` outside the group; it left without sending; the wait timed out; a message
    /// of another length.
    fn recv(&self, dev: &D, peer: usize, buf: &mut D::Buffer) -> Result<(), ExecError>;
    /// Every send of `sends` and receive of `recvs` (each to or from a rank of the group)
    /// as one call, all in flight at once: NCCL's one group, PyTorch's
    /// `batch_isend_irecv`, what Megatron's pipeline schedules post between passes. Where
    /// a send waits for its receive, stages that each sent before receiving would wait on
    /// each other forever; posted together, they cannot. A receive from a peer that is
    /// also sent to takes that peer's next message, as [`Collective::recv`] does.
    ///
    /// # Errors
    /// As [`Collective::send`] and [`Collective::recv`].
    fn batch_send_recv(&self, dev: &D, sends: &[(usize, &D::Buffer)], recvs: &mut [(usize, &mut D::Buffer)]) -> Result<(), ExecError> {
        for &(peer, buf) in sends {
            self.send(dev, peer, buf)?;
        }
        for (peer, buf) in recvs.iter_mut() {
            self.recv(dev, *peer, buf)?;
        }
        Ok(())
    }
    /// A failure found since this group's last call, outside any call (NCCL's watchdog:
    /// a call that timed out, an asynchronous NCCL error, a dead rank); the executor
    /// checks it at the end of each phase. Host transports fail at the call itself.
    ///
    /// # Errors
    /// That failure.
    fn health(&self) -> Result<(), ExecError> {
        Ok(())
    }
    /// Start collective `what` on `buf` (the input), to run while this rank goes on
    /// computing; [`Collective::finish`] gives its result: the buffer reduced (an
    /// all-reduce), every rank's buffer concatenated in rank order (an all-gather), or
    /// this rank's chunk of the sum (a reduce-scatter). Every rank starts the same
    /// collectives in the same order. Several may be in flight, and they run in the
    /// order they were started; the caller makes no other call on this group until it
    /// has finished them all. NCCL runs them on a second stream, after the work queued
    /// so far; the default runs each at once.
    ///
    /// # Errors
    /// As the collective's own call, for what is checked (or run) at the start; a
    /// reduce-scatter of a buffer that does not split over the group.
    fn start(&self, dev: &D, what: Started, buf: D::Buffer) -> Result<InFlight<D::Buffer>, ExecError> {
        run_started(self, dev, what, buf)
    }
    /// The result of a collective this group started ([`Collective::start`]); work
    /// queued on `dev` after this call is ordered after it.
    ///
    /// # Errors
    /// As the collective's own call; an [`InFlight`] another group started.
    fn finish(&self, _dev: &D, f: InFlight<D::Buffer>) -> Result<D::Buffer, ExecError> {
        match f.into_parts() {
            (buf, _, None) => Ok(buf),
            (_, _, Some(_)) => Err(foreign()),
        }
    }
}

/// A collective that can be started and finished later ([`Collective::start`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Started {
    /// In place: the buffer comes back reduced.
    AllReduce(ReduceOp),
    /// Every rank's buffer, concatenated in rank order (group size × its length).
    AllGather,
    /// This rank's chunk of the sum of every rank's buffer (its length / group size).
    ReduceScatter,
}

impl Started {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Started::AllReduce(_) => "all-reduce",
            Started::AllGather => "all-gather",
            Started::ReduceScatter => "reduce-scatter",
        }
    }

    /// Elements of the result for an input of `len` elements over `n` ranks.
    ///
    /// # Errors
    /// A reduce-scatter input that does not split into `n` equal chunks.
    pub fn out_len(self, len: usize, n: usize) -> Result<usize, ExecError> {
        match self {
            Started::AllReduce(_) => Ok(len),
            Started::AllGather => Ok(len * n),
            Started::ReduceScatter if n > 0 && len.is_multiple_of(n) => Ok(len / n),
            Started::ReduceScatter => Err(err(format!("reduce-scatter: {len} elements do not split over {n} ranks"))),
        }
    }
}

/// Run started collective `what` at once with `c`'s own calls (what [`Collective::start`]
/// does by default). The input stays allocated until the finish, as where it runs
/// later, so device memory follows the same course on every transport.
fn run_started<D: Device, C: Collective<D> + ?Sized>(c: &C, dev: &D, what: Started, buf: D::Buffer) -> Result<InFlight<D::Buffer>, ExecError> {
    let mut buf = buf;
    let len = what.out_len(buf.len(), c.size())?;
    match what {
        Started::AllReduce(op) => {
            c.all_reduce(dev, &mut buf, op)?;
            Ok(InFlight::done(buf))
        }
        Started::AllGather => {
            let mut out = dev.alloc(buf.elem(), len)?;
            c.all_gather(dev, &buf, &mut out)?;
            Ok(InFlight { buf: out, input: Some(buf), pending: None })
        }
        Started::ReduceScatter => {
            let mut out = dev.alloc(buf.elem(), len)?;
            c.reduce_scatter(dev, &buf, &mut out)?;
            Ok(InFlight { buf: out, input: Some(buf), pending: None })
        }
    }
}

/// What a host transport's started collective runs (the default of
/// [`HostCollective::start`], and a [`Lane`]'s thread).
fn run_started_on_host<H: HostCollective + ?Sized>(h: &H, what: Started, data: Vec<f32>) -> Result<Vec<f32>, ExecError> {
    match what {
        Started::AllReduce(op) => {
            let mut data = data;
            h.all_reduce(&mut data, op)?;
            Ok(data)
        }
        Started::AllGather => h.all_gather(&data),
        Started::ReduceScatter => h.reduce_scatter(&data),
    }
}

/// A collective [`Collective::start`] started: its result's buffer (or the input,
/// for a host transport), and what the group needs to finish it (none when it already
/// ran).
pub struct InFlight<B> {
    buf: B,
    /// The input, when the result has a buffer of its own: it stays allocated until the
    /// finish, as the collective may still read it.
    input: Option<B>,
    pending: Option<Box<dyn Any + Send>>,
}

impl<B> InFlight<B> {
    /// A collective that already ran: its result.
    pub fn done(buf: B) -> Self {
        InFlight { buf, input: None, pending: None }
    }
    /// A collective still running into `buf`, reading `input` (none: in place);
    /// `pending` is the group's own record of it.
    pub fn running(buf: B, input: Option<B>, pending: Box<dyn Any + Send>) -> Self {
        InFlight { buf, input, pending: Some(pending) }
    }
    /// The result's buffer, the input and the group's record, for the group that
    /// finishes it (which frees the input once the collective no longer reads it).
    pub fn into_parts(self) -> (B, Option<B>, Option<Box<dyn Any + Send>>) {
        (self.buf, self.input, self.pending)
    }
}

fn foreign() -> ExecError {
    err("finish of a collective another group started".into())
}

/// A host transport's started collective ([`HostCollective::start`]).
pub enum HostInFlight {
    /// It already ran: the result.
    Done(Vec<f32>),
    /// It runs elsewhere; the result (or the error) arrives here.
    Running(mpsc::Receiver<Result<Vec<f32>, ExecError>>),
}

impl HostInFlight {
    /// The result, once it is there.
    ///
    /// # Errors
    /// The collective failed, or what ran it ended without answering.
    pub fn wait(self) -> Result<Vec<f32>, ExecError> {
        match self {
            HostInFlight::Done(d) => Ok(d),
            HostInFlight::Running(rx) => rx.recv().unwrap_or_else(|_| {
                Err(err("a started collective: the thread running it ended without an answer".into()))
            }),
        }
    }
}

/// The calls of [`Collective`] on host memory, for transports that move host data
/// ([`ThreadGroup`], the TCP group of `runner-dist`). Each is a [`Collective`] on every
/// device through a staging copy.
pub trait HostCollective: Send {
    /// This rank's index in the group.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// As [`Collective::all_reduce`].
    fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), ExecError>;
    /// Every rank's `input`, concatenated in rank order.
    fn all_gather(&self, input: &[f32]) -> Result<Vec<f32>, ExecError>;
    /// Chunk `rank` of the sum of every rank's `input`.
    fn reduce_scatter(&self, input: &[f32]) -> Result<Vec<f32>, ExecError>;
    /// As [`Collective::all_to_all`].
    fn all_to_all(&self, input: &[f32]) -> Result<Vec<f32>, ExecError>;
    /// As [`Collective::all_to_all_v`].
    fn all_to_all_v(&self, input: &[f32], send: &[usize], recv: &[usize])
    -> Result<Vec<f32>, ExecError>;
    /// Rank `root`'s `data` (every rank passes a buffer of the same length).
    fn broadcast(&self, data: &[f32], root: usize) -> Result<Vec<f32>, ExecError>;
    /// Queue `data` for rank `peer` (does not wait for the receive, unless the
    /// transport says so: [`ThreadGroup::rendezvous`]).
    fn send(&self, peer: usize, data: &[f32]) -> Result<(), ExecError>;
    /// The next message rank `peer` sent here (waits for it).
    fn recv(&self, peer: usize) -> Result<Vec<f32>, ExecError>;
    /// As [`Collective::batch_send_recv`]: each of `sends` to its peer, and the next
    /// message from each peer of `recvs`, in that order.
    fn batch_send_recv(&self, sends: &[(usize, &[f32])], recvs: &[usize]) -> Result<Vec<Vec<f32>>, ExecError> {
        for &(peer, data) in sends {
            self.send(peer, data)?;
        }
        recvs.iter().map(|&peer| self.recv(peer)).collect()
    }
    /// As [`Collective::start`]; the default runs it at once.
    ///
    /// # Errors
    /// As the collective's own call.
    fn start(&self, what: Started, data: Vec<f32>) -> Result<HostInFlight, ExecError> {
        run_started_on_host(self, what, data).map(HostInFlight::Done)
    }
}

/// The element-wise reduction of every rank's part, `parts` in rank order, accumulated in
/// that order (rank 0, then 1, ...): what every host transport computes on every rank, so
/// all ranks, and every transport, get the same bits. Parts have equal lengths.
pub fn reduce_in_rank_order(parts: &[&[f32]], op: ReduceOp) -> Vec<f32> {
    let Some((first, rest)) = parts.split_first() else {
        return Vec::new();
    };
    let mut acc = first.to_vec();
    for r in rest {
        for (a, &x) in acc.iter_mut().zip(r.iter()) {
            *a = match op {
                ReduceOp::Sum => *a + x,
                ReduceOp::Max => a.max(x),
            };
        }
    }
    acc
}

/// A buffer's contents as f32 words for a host transport: floats widened, int32 ids
/// carried bit for bit.
fn stage_out<D: Device>(dev: &D, b: &D::Buffer) -> Result<Vec<f32>, ExecError> {
    match b.elem() {
        Elem::I32 => Ok(dev.read_u32(b)?.into_iter().map(f32::from_bits).collect()),
        _ => dev.read_f32(b),
    }
}

/// Write words a host transport delivered into `b` (see [`stage_out`]).
fn stage_in<D: Device>(dev: &D, b: &mut D::Buffer, data: &[f32], what: &str) -> Result<(), ExecError> {
    if data.len() != b.len() {
        return Err(ExecError::State(format!(
            "collective: {what} delivered {} elements into a buffer of {}",
            data.len(),
            b.len()
        )));
    }
    match b.elem() {
        Elem::I32 => dev.write_u32(b, &data.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
        _ => dev.write_f32(b, data),
    }
}

fn reducible<B: DeviceBuffer>(b: &B, what: &str) -> Result<(), ExecError> {
    match b.elem() {
        Elem::F32 => Ok(()),
        e => Err(ExecError::State(format!(
            "collective: {what} reduces f32 buffers on a host transport, got {}",
            e.name()
        ))),
    }
}

impl<D: Device, H: HostCollective> Collective<D> for H {
    fn rank(&self) -> usize {
        HostCollective::rank(self)
    }
    fn size(&self) -> usize {
        HostCollective::size(self)
    }
    fn all_reduce(&self, dev: &D, buf: &mut D::Buffer, op: ReduceOp) -> Result<(), ExecError> {
        reducible(buf, "all-reduce")?;
        let mut h = dev.read_f32(buf)?;
        HostCollective::all_reduce(self, &mut h, op)?;
        dev.write_f32(buf, &h)
    }
    fn all_gather(&self, dev: &D, input: &D::Buffer, output: &mut D::Buffer) -> Result<(), ExecError> {
        let all = HostCollective::all_gather(self, &stage_out(dev, input)?)?;
        stage_in(dev, output, &all, "all-gather")
    }
    fn reduce_scatter(&self, dev: &D, input: &D::Buffer, output: &mut D::Buffer) -> Result<(), ExecError> {
        reducible(input, "reduce-scatter")?;
        let mine = HostCollective::reduce_scatter(self, &dev.read_f32(input)?)?;
        stage_in(dev, output, &mine, "reduce-scatter")
    }
    fn all_to_all(&self, dev: &D, input: &D::Buffer, output: &mut D::Buffer) -> Result<(), ExecError> {
        let got = HostCollective::all_to_all(self, &stage_out(dev, input)?)?;
        stage_in(dev, output, &got, "all-to-all")
    }
    fn all_to_all_v(
        &self,
        dev: &D,
        input: &D::Buffer,
        send: &[usize],
        output: &mut D::Buffer,
        recv: &[usize],
    ) -> Result<(), ExecError> {
        let got = HostCollective::all_to_all_v(self, &stage_out(dev, input)?, send, recv)?;
        stage_in(dev, output, &got, "all-to-all-v")
    }
    fn broadcast(&self, dev: &D, buf: &mut D::Buffer, root: usize) -> Result<(), ExecError> {
        let got = HostCollective::broadcast(self, &stage_out(dev, buf)?, root)?;
        stage_in(dev, buf, &got, "broadcast")
    }
    fn send(&self, dev: &D, peer: usize, buf: &D::Buffer) -> Result<(), ExecError> {
        HostCollective::send(self, peer, &stage_out(dev, buf)?)
    }
    fn recv(&self, dev: &D, peer: usize, buf: &mut D::Buffer) -> Result<(), ExecError> {
        let got = HostCollective::recv(self, peer)?;
        received(HostCollective::rank(self), peer, &got, buf)?;
        stage_in(dev, buf, &got, "recv")
    }
    fn batch_send_recv(&self, dev: &D, sends: &[(usize, &D::Buffer)], recvs: &mut [(usize, &mut D::Buffer)]) -> Result<(), ExecError> {
        let staged: Vec<(usize, Vec<f32>)> = sends.iter().map(|&(p, b)| Ok((p, stage_out(dev, b)?))).collect::<Result<_, ExecError>>()?;
        let sends: Vec<(usize, &[f32])> = staged.iter().map(|(p, d)| (*p, d.as_slice())).collect();
        let peers: Vec<usize> = recvs.iter().map(|(p, _)| *p).collect();
        let got = HostCollective::batch_send_recv(self, &sends, &peers)?;
        for ((peer, buf), data) in recvs.iter_mut().zip(&got) {
            received(HostCollective::rank(self), *peer, data, *buf)?;
            stage_in(dev, buf, data, "recv")?;
        }
        Ok(())
    }
    fn start(&self, dev: &D, what: Started, buf: D::Buffer) -> Result<InFlight<D::Buffer>, ExecError> {
        if what != Started::AllGather {
            reducible(&buf, what.name())?;
        }
        let len = what.out_len(buf.len(), HostCollective::size(self))?;
        let h = HostCollective::start(self, what, stage_out(dev, &buf)?)?;
        // Device memory as on NCCL: the result's buffer from the start (an all-reduce's
        // is its input), the input until the finish.
        Ok(match what {
            Started::AllReduce(_) => InFlight::running(buf, None, Box::new((h, what))),
            _ => InFlight::running(dev.alloc(buf.elem(), len)?, Some(buf), Box::new((h, what))),
        })
    }
    fn finish(&self, dev: &D, f: InFlight<D::Buffer>) -> Result<D::Buffer, ExecError> {
        let (mut buf, input, pending) = f.into_parts();
        let Some(pending) = pending else { return Ok(buf) };
        let (h, what) = *pending.downcast::<(HostInFlight, Started)>().map_err(|_| foreign())?;
        stage_in(dev, &mut buf, &h.wait()?, what.name())?;
        drop(input);
        Ok(buf)
    }
}

/// A received message's length against the buffer waiting for it.
fn received<B: DeviceBuffer>(me: usize, peer: usize, got: &[f32], buf: &B) -> Result<(), ExecError> {
    if got.len() != buf.len() {
        return Err(ExecError::State(format!(
            "collective: recv on rank {me} from rank {peer}: received {} elements, expected \
             {} (the ranks disagree on the message: different layouts, or calls out of order)",
            got.len(),
            buf.len()
        )));
    }
    Ok(())
}

/// How long a [`ThreadGroup`] waits for the other ranks before failing, unless
/// [`ThreadGroup::with_timeout`] says otherwise: generous, since a slow rank may be
/// computing a large op on a busy machine.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

fn err(what: String) -> ExecError {
    ExecError::State(format!("collective: {what}"))
}

fn list(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// One rank's data of a collective call and its split into chunks.
type Part = (Vec<f32>, Vec<usize>);

/// The ranks' buffers of one collective call (the k-th of the group).
struct Round {
    data: Vec<Option<Vec<f32>>>,
    /// Per rank: how its data splits into chunks (all-to-all-v; empty otherwise).
    split: Vec<Vec<usize>>,
    /// Ranks that have taken their result; the round is dropped when all have.
    taken: usize,
}

struct State {
    /// Collective calls in progress, by call number.
    rounds: BTreeMap<u64, Round>,
    /// Per rank: the number of its next collective call.
    next: Vec<u64>,
    /// Point-to-point queues, indexed `src * n + dst`.
    queues: Vec<VecDeque<Vec<f32>>>,
    /// Messages ever queued and ever received on each queue (a rendezvous send waits
    /// until its number is received).
    posted: Vec<u64>,
    delivered: Vec<u64>,
    /// Per rank: its handle was dropped.
    left: Vec<bool>,
    /// Set by a timeout: the ranks no longer agree on the call sequence.
    broken: Option<String>,
}

struct Shared {
    n: usize,
    timeout: Duration,
    /// Sends wait for their receive ([`ThreadGroup::rendezvous`]).
    rendezvous: bool,
    state: Mutex<State>,
    changed: Condvar,
}

/// A group of ranks that are threads of this process. [`ThreadGroup::new`] returns one
/// handle per rank; move each to its thread. Dropping a handle tells the others that
/// rank has left (see the module notes).
///
/// Started collectives ([`HostCollective::start`]) run on its [`Lane`].
pub struct ThreadGroup {
    rank: usize,
    shared: Arc<Shared>,
    lane: Lane<ThreadGroup>,
}

/// A host group's second lane, where its started collectives
/// ([`HostCollective::start`]) run: a handle of this rank on a second group
/// of the same ranks (its own call sequence, so calls the rank makes meanwhile on the
/// group itself are not matched with them), moved at the first start to a thread that
/// runs them in order. Dropping the lane ends the thread, which drops the handle: the
/// other ranks' lanes see this rank leave.
pub struct Lane<H> {
    state: Mutex<LaneState<H>>,
}

enum LaneState<H> {
    /// Not started: this rank's handle on the second group (none: no lane, run at once).
    Idle(Option<Box<H>>),
    /// Its thread runs each collective sent here, in order, and answers on the channel.
    Running(mpsc::Sender<LaneJob>),
}

type LaneJob = (Vec<f32>, Started, mpsc::Sender<Result<Vec<f32>, ExecError>>);

impl<H: HostCollective + 'static> Lane<H> {
    /// A lane over `on_lane`, this rank's handle on the second group.
    pub fn new(on_lane: H) -> Self {
        Lane { state: Mutex::new(LaneState::Idle(Some(Box::new(on_lane)))) }
    }

    /// No lane: [`Lane::start`] runs each collective at once (the lane's own handle).
    pub fn none() -> Self {
        Lane { state: Mutex::new(LaneState::Idle(None)) }
    }

    /// Start collective `what` on `data` on the lane (on `me`, the group itself, at
    /// once when there is none).
    ///
    /// # Errors
    /// The thread cannot start or has ended; as `me`'s call where it runs at once.
    pub fn start(&self, me: &dyn HostCollective, what: Started, data: Vec<f32>) -> Result<HostInFlight, ExecError> {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let jobs = match &mut *state {
            LaneState::Running(jobs) => jobs.clone(),
            LaneState::Idle(handle) => {
                let Some(on_lane) = handle.take() else {
                    drop(state);
                    return run_started_on_host(me, what, data).map(HostInFlight::Done);
                };
                let (jobs, todo) = mpsc::channel::<LaneJob>();
                std::thread::Builder::new()
                    .name(format!("collective lane, rank {}", me.rank()))
                    .spawn(move || {
                        for (data, what, answer) in todo {
                            let _ = answer.send(run_started_on_host(&*on_lane, what, data));
                        }
                    })
                    .map_err(|e| err(format!("{} on rank {}: cannot start its thread: {e}", what.name(), me.rank())))?;
                *state = LaneState::Running(jobs.clone());
                jobs
            }
        };
        let (answer, result) = mpsc::channel();
        jobs.send((data, what, answer))
            .map_err(|_| err(format!("{} on rank {}: the thread of started collectives ended", what.name(), me.rank())))?;
        Ok(HostInFlight::Running(result))
    }
}

impl ThreadGroup {
    /// Handles for `n` ranks (index = rank), waiting at most [`DEFAULT_TIMEOUT`].
    pub fn new(n: usize) -> Vec<ThreadGroup> {
        Self::with_timeout(n, DEFAULT_TIMEOUT)
    }

    /// Handles for `n` ranks whose waits fail after `timeout`.
    pub fn with_timeout(n: usize, timeout: Duration) -> Vec<ThreadGroup> {
        Self::build(n, timeout, false)
    }

    /// As [`ThreadGroup::with_timeout`], but each send returns only once the peer has
    /// received it, as NCCL's do (a send is a kernel that waits for its peer's receive),
    /// where this transport otherwise queues sends. Schedules tried on it show on the
    /// CPU whether their order of sends and receives would hang ranks on GPUs: such an
    /// order times out here, naming the send.
    pub fn rendezvous(n: usize, timeout: Duration) -> Vec<ThreadGroup> {
        Self::build(n, timeout, true)
    }

    fn build(n: usize, timeout: Duration, rendezvous: bool) -> Vec<ThreadGroup> {
        let n = n.max(1);
        let (shared, lane) = (Self::shared(n, timeout, rendezvous), Self::shared(n, timeout, rendezvous));
        (0..n)
            .map(|rank| {
                let on_lane = ThreadGroup { rank, shared: Arc::clone(&lane), lane: Lane::none() };
                ThreadGroup { rank, shared: Arc::clone(&shared), lane: Lane::new(on_lane) }
            })
            .collect()
    }

    fn shared(n: usize, timeout: Duration, rendezvous: bool) -> Arc<Shared> {
        Arc::new(Shared {
            n,
            timeout,
            rendezvous,
            state: Mutex::new(State {
                rounds: BTreeMap::new(),
                next: vec![0; n],
                queues: (0..n * n).map(|_| VecDeque::new()).collect(),
                posted: vec![0; n * n],
                delivered: vec![0; n * n],
                left: vec![false; n],
                broken: None,
            }),
            changed: Condvar::new(),
        })
    }

    /// The state, whatever a panicking rank left behind: every update under the lock is
    /// complete before anything that can panic, so a poisoned lock holds a usable state.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Wait for a change, at most until `deadline` (which the caller checked is ahead).
    fn wait<'a>(&self, st: MutexGuard<'a, State>, deadline: Instant) -> MutexGuard<'a, State> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.shared
            .changed
            .wait_timeout(st, left)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
    }

    /// Publish `data` as this rank's part of its next collective call (`what`), wait for
    /// every rank's, and return all of them in rank order; every rank must pass the same
    /// length.
    fn exchange(&self, data: &[f32], what: &str) -> Result<Vec<Vec<f32>>, ExecError> {
        let all = self.exchange_split(data, &[], what)?;
        if let Some(bad) = all.iter().position(|(v, _)| v.len() != data.len()) {
            return Err(err(format!(
                "{what}: rank {} passed {} elements, rank {bad} passed {}",
                self.rank,
                data.len(),
                all[bad].0.len()
            )));
        }
        Ok(all.into_iter().map(|(v, _)| v).collect())
    }

    /// As [`ThreadGroup::exchange`], with each rank's data of any length and its split
    /// into chunks (`split`) published beside it.
    fn exchange_split(
        &self,
        data: &[f32],
        split: &[usize],
        what: &str,
    ) -> Result<Vec<Part>, ExecError> {
        let (n, me) = (self.shared.n, self.rank);
        let mut st = self.lock();
        if let Some(b) = &st.broken {
            return Err(err(format!(
                "{what} on rank {me}: the group is unusable: {b}"
            )));
        }
        let k = st.next[me];
        st.next[me] += 1;
        let round = st.rounds.entry(k).or_insert_with(|| Round {
            data: vec![None; n],
            split: vec![Vec::new(); n],
            taken: 0,
        });
        round.data[me] = Some(data.to_vec());
        round.split[me] = split.to_vec();
        self.shared.changed.notify_all();
        let deadline = Instant::now() + self.shared.timeout;
        loop {
            let Some(round) = st.rounds.get(&k) else {
                return Err(err(format!("{what}: call {k} vanished")));
            };
            let missing: Vec<usize> = round
                .data
                .iter()
                .enumerate()
                .filter(|(_, d)| d.is_none())
                .map(|(r, _)| r)
                .collect();
            if missing.is_empty() {
                break;
            }
            if let Some(b) = &st.broken {
                return Err(err(format!(
                    "{what} on rank {me}: the group is unusable: {b}"
                )));
            }
            let gone: Vec<usize> = missing.iter().copied().filter(|&r| st.left[r]).collect();
            if !gone.is_empty() {
                return Err(err(format!(
                    "{what} (call {k} of this group of {n}) on rank {me}: rank(s) {} left the group \
                     before joining it (the handle was dropped: that rank returned an error, \
                     panicked or ran fewer collectives); see its error",
                    list(&gone)
                )));
            }
            if Instant::now() >= deadline {
                let msg = format!(
                    "{what} (call {k} of this group of {n}) timed out after {:?} on rank {me}: \
                     rank(s) {} did not arrive. Every rank must make the same collective calls \
                     in the same order; find why those ranks are stuck or slow, or raise the \
                     limit with ThreadGroup::with_timeout",
                    self.shared.timeout,
                    list(&missing)
                );
                st.broken = Some(msg.clone());
                self.shared.changed.notify_all();
                return Err(err(msg));
            }
            st = self.wait(st, deadline);
        }
        let round = st
            .rounds
            .get_mut(&k)
            .ok_or_else(|| err(format!("{what}: call {k} vanished")))?;
        let all: Vec<Part> = round
            .data
            .iter()
            .flatten()
            .cloned()
            .zip(round.split.iter().cloned())
            .collect();
        round.taken += 1;
        if round.taken == n {
            st.rounds.remove(&k);
        }
        drop(st);
        Ok(all)
    }

    fn chunk(&self, len: usize) -> Result<usize, ExecError> {
        if !len.is_multiple_of(self.shared.n) {
            return Err(err(format!(
                "{len} elements do not split over {} ranks",
                self.shared.n
            )));
        }
        Ok(len / self.shared.n)
    }

    fn peer(&self, peer: usize) -> Result<(), ExecError> {
        if peer >= self.shared.n {
            return Err(err(format!(
                "peer {peer} outside a group of {}",
                self.shared.n
            )));
        }
        Ok(())
    }
}

impl ThreadGroup {
    /// Queue `data` for `peer`; its number on that queue.
    fn post(&self, peer: usize, data: &[f32]) -> Result<u64, ExecError> {
        self.peer(peer)?;
        let q = self.rank * self.shared.n + peer;
        let mut st = self.lock();
        if st.left[peer] {
            return Err(err(format!(
                "send from rank {} to rank {peer}: rank {peer} has left the group (it returned \
                 an error, panicked or finished); see its error",
                self.rank
            )));
        }
        st.queues[q].push_back(data.to_vec());
        st.posted[q] += 1;
        self.shared.changed.notify_all();
        Ok(st.posted[q])
    }

    /// On a rendezvous group, wait until `peer` has received message `seq` this rank
    /// sent it.
    fn received_by(&self, peer: usize, seq: u64) -> Result<(), ExecError> {
        if !self.shared.rendezvous {
            return Ok(());
        }
        let (me, q) = (self.rank, self.rank * self.shared.n + peer);
        let mut st = self.lock();
        let deadline = Instant::now() + self.shared.timeout;
        loop {
            if st.delivered[q] >= seq {
                return Ok(());
            }
            if st.left[peer] {
                return Err(err(format!(
                    "send from rank {me} to rank {peer}: rank {peer} left the group without \
                     receiving it; see its error"
                )));
            }
            if Instant::now() >= deadline {
                return Err(err(format!(
                    "send from rank {me} to rank {peer} timed out after {:?}: rank {peer} never \
                     received it (a send waits for its receive here, as on NCCL: two ranks that \
                     each send to the other before receiving wait forever; post them together \
                     with batch_send_recv)",
                    self.shared.timeout
                )));
            }
            st = self.wait(st, deadline);
        }
    }
}

impl Drop for ThreadGroup {
    /// Mark this rank as gone and wake every waiter, so nobody waits for it.
    fn drop(&mut self) {
        let mut st = self.lock();
        st.left[self.rank] = true;
        self.shared.changed.notify_all();
    }
}

impl HostCollective for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.n
    }

    fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), ExecError> {
        let all = self.exchange(buf, "all-reduce")?;
        let parts: Vec<&[f32]> = all.iter().map(Vec::as_slice).collect();
        buf.copy_from_slice(&reduce_in_rank_order(&parts, op));
        Ok(())
    }

    fn start(&self, what: Started, data: Vec<f32>) -> Result<HostInFlight, ExecError> {
        self.lane.start(self, what, data)
    }

    fn all_gather(&self, input: &[f32]) -> Result<Vec<f32>, ExecError> {
        Ok(self.exchange(input, "all-gather")?.concat())
    }

    fn reduce_scatter(&self, input: &[f32]) -> Result<Vec<f32>, ExecError> {
        let c = self.chunk(input.len())?;
        let all = self.exchange(input, "reduce-scatter")?;
        let lo = self.rank * c;
        let parts: Vec<&[f32]> = all.iter().map(|r| &r[lo..lo + c]).collect();
        Ok(reduce_in_rank_order(&parts, ReduceOp::Sum))
    }

    fn all_to_all(&self, input: &[f32]) -> Result<Vec<f32>, ExecError> {
        let c = self.chunk(input.len())?;
        let all = self.exchange(input, "all-to-all")?;
        let lo = self.rank * c;
        Ok(all
            .iter()
            .flat_map(|r| r[lo..lo + c].iter().copied())
            .collect())
    }

    fn all_to_all_v(
        &self,
        input: &[f32],
        send: &[usize],
        recv: &[usize],
    ) -> Result<Vec<f32>, ExecError> {
        let (n, me) = (self.shared.n, self.rank);
        if send.len() != n || recv.len() != n {
            return Err(err(format!(
                "all-to-all-v on rank {me}: {} send and {} receive counts for a group of {n}",
                send.len(),
                recv.len()
            )));
        }
        if send.iter().sum::<usize>() != input.len() {
            return Err(err(format!(
                "all-to-all-v on rank {me}: send counts {send:?} do not sum to the {} elements \
                 passed",
                input.len()
            )));
        }
        let all = self.exchange_split(input, send, "all-to-all-v")?;
        let mut out = Vec::with_capacity(recv.iter().sum());
        for (src, ((data, split), &want)) in all.iter().zip(recv).enumerate() {
            let Some(&len) = split.get(me) else {
                return Err(err(format!(
                    "all-to-all-v on rank {me}: rank {src} made another collective call (no \
                     chunk sizes); every rank must make the same calls in the same order"
                )));
            };
            if len != want {
                return Err(err(format!(
                    "all-to-all-v: rank {src} sends {len} elements to rank {me}, which expects \
                     {want} (the ranks disagree on the counts)"
                )));
            }
            let at: usize = split[..me].iter().sum();
            out.extend_from_slice(&data[at..at + len]);
        }
        Ok(out)
    }

    fn broadcast(&self, data: &[f32], root: usize) -> Result<Vec<f32>, ExecError> {
        self.peer(root)?;
        let mut all = self.exchange(data, "broadcast")?;
        Ok(std::mem::take(&mut all[root]))
    }

    fn send(&self, peer: usize, data: &[f32]) -> Result<(), ExecError> {
        let seq = self.post(peer, data)?;
        self.received_by(peer, seq)
    }

    fn batch_send_recv(&self, sends: &[(usize, &[f32])], recvs: &[usize]) -> Result<Vec<Vec<f32>>, ExecError> {
        let posted: Vec<(usize, u64)> = sends.iter().map(|&(peer, data)| Ok((peer, self.post(peer, data)?))).collect::<Result<_, ExecError>>()?;
        let got = recvs.iter().map(|&peer| HostCollective::recv(self, peer)).collect::<Result<Vec<_>, _>>()?;
        for (peer, seq) in posted {
            self.received_by(peer, seq)?;
        }
        Ok(got)
    }

    fn recv(&self, peer: usize) -> Result<Vec<f32>, ExecError> {
        self.peer(peer)?;
        let (n, me) = (self.shared.n, self.rank);
        let mut st = self.lock();
        let deadline = Instant::now() + self.shared.timeout;
        loop {
            if let Some(m) = st.queues[peer * n + me].pop_front() {
                st.delivered[peer * n + me] += 1;
                self.shared.changed.notify_all();
                return Ok(m);
            }
            if st.left[peer] {
                return Err(err(format!(
                    "recv on rank {me} from rank {peer}: rank {peer} left the group without \
                     sending (it returned an error, panicked or made fewer sends); see its error"
                )));
            }
            if Instant::now() >= deadline {
                return Err(err(format!(
                    "recv on rank {me} from rank {peer} timed out after {:?}: rank {peer} \
                     sent nothing. Every recv needs a matching send; find why rank {peer} is \
                     stuck or slow, or raise the limit with ThreadGroup::with_timeout",
                    self.shared.timeout
                )));
            }
            st = self.wait(st, deadline);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Cpu, Device, Elem, HostCollective, ReduceOp, Started, ThreadGroup};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Run `f` on every rank of a fresh group of `n`, one thread each; results by rank.
    fn on_ranks<T: Send + 'static>(
        n: usize,
        f: impl Fn(ThreadGroup) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let hs: Vec<_> = ThreadGroup::new(n)
            .into_iter()
            .map(|h| {
                let f = Arc::clone(&f);
                std::thread::spawn(move || f(h))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn all_reduce_is_identical_on_every_rank() {
        let out = on_ranks(3, |g| {
            let r = g.rank() as f32;
            let mut s = vec![r, 1.0, 0.1 * (r + 1.0)];
            g.all_reduce(&mut s, ReduceOp::Sum).unwrap();
            let mut m = vec![r, -r];
            g.all_reduce(&mut m, ReduceOp::Max).unwrap();
            (s, m)
        });
        for (s, m) in &out {
            assert_eq!(s[..2], [3.0, 3.0]);
            // Rank-order summation: bitwise equal everywhere.
            assert_eq!(s[2].to_bits(), ((0.1f32 + 0.2) + 0.3f32).to_bits());
            assert_eq!(*m, vec![2.0, 0.0]);
        }
    }

    #[test]
    fn gather_scatter_and_all_to_all() {
        let out = on_ranks(2, |g| {
            let r = g.rank() as f32;
            let ag = g.all_gather(&[r, r + 10.0]).unwrap();
            let rs = g.reduce_scatter(&[1.0, 2.0, 3.0 + r, 4.0]).unwrap();
            let a2a = g.all_to_all(&[10.0 * r, 10.0 * r + 1.0]).unwrap();
            let bad = g.reduce_scatter(&[1.0, 2.0, 3.0]).is_err();
            (ag, rs, a2a, bad)
        });
        assert_eq!(out[0].0, [0.0, 10.0, 1.0, 11.0]);
        assert_eq!(out[1].0, out[0].0);
        assert_eq!(out[0].1, [2.0, 4.0]);
        assert_eq!(out[1].1, [7.0, 8.0]);
        assert_eq!(out[0].2, [0.0, 10.0]);
        assert_eq!(out[1].2, [1.0, 11.0]);
        assert!(out[0].3 && out[1].3);
    }

    #[test]
    fn all_to_all_v_moves_chunks_of_any_size() {
        // Rank r sends r+j+1 copies of 10r+j to rank j (rank 0 sends rank 2 nothing).
        let out = on_ranks(3, |g| {
            let r = g.rank();
            let send: Vec<usize> = (0..3)
                .map(|j| if (r, j) == (0, 2) { 0 } else { r + j + 1 })
                .collect();
            let input: Vec<f32> = (0..3)
                .flat_map(|j| std::iter::repeat_n((10 * r + j) as f32, send[j]))
                .collect();
            let recv: Vec<usize> = (0..3)
                .map(|s| if (s, r) == (0, 2) { 0 } else { s + r + 1 })
                .collect();
            let got = g.all_to_all_v(&input, &send, &recv).unwrap();
            let wrong = recv.iter().map(|c| c + 1).collect::<Vec<_>>();
            let bad = g
                .all_to_all_v(&input, &send, &wrong)
                .unwrap_err()
                .to_string();
            (got, bad)
        });
        assert_eq!(out[0].0, [0.0, 10.0, 10.0, 20.0, 20.0, 20.0]);
        assert_eq!(
            out[2].0,
            [12.0, 12.0, 12.0, 12.0, 22.0, 22.0, 22.0, 22.0, 22.0]
        );
        assert!(out[1].1.contains("expects"), "{}", out[1].1);
    }

    #[test]
    fn mismatched_lengths_fail_on_every_rank() {
        let out = on_ranks(2, |g| {
            let mut b = vec![0.0; 1 + g.rank()];
            g.all_reduce(&mut b, ReduceOp::Sum).is_err()
        });
        assert_eq!(out, [true, true]);
    }

    #[test]
    fn send_and_recv_keep_order() {
        let out = on_ranks(2, |g| {
            if g.rank() == 0 {
                g.send(1, &[1.0]).unwrap();
                g.send(1, &[2.0, 3.0]).unwrap();
                g.recv(1).unwrap()
            } else {
                let a = g.recv(0).unwrap();
                let b = g.recv(0).unwrap();
                g.send(0, &[a[0] + b[0] + b[1]]).unwrap();
                vec![]
            }
        });
        assert_eq!(out[0], [6.0]);
        assert!(g_peer_checked());
    }

    /// A rank that drops its handle (returns early, errors, panics) fails the others'
    /// collectives at once, naming it, while messages it queued before leaving still
    /// arrive.
    #[test]
    fn a_rank_that_leaves_fails_the_others_at_once() {
        let t0 = Instant::now();
        let out = on_ranks(3, |g| {
            match g.rank() {
                2 => {
                    g.send(0, &[7.0]).unwrap();
                    drop(g);
                    return (String::new(), String::new(), Vec::new());
                }
                // Returns (as on an error) before its collectives.
                1 => return (String::new(), String::new(), Vec::new()),
                _ => {}
            }
            let mut b = vec![1.0];
            let ar = g.all_reduce(&mut b, ReduceOp::Sum).unwrap_err().to_string();
            let queued = g.recv(2).unwrap();
            let rv = g.recv(2).unwrap_err().to_string();
            (ar, rv, queued)
        });
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        let (ar, rv, queued) = &out[0];
        assert!(
            ar.contains("all-reduce") && ar.contains("left the group"),
            "{ar}"
        );
        assert!(
            ar.contains("rank(s) 1") || ar.contains("rank(s) 2"),
            "names the rank: {ar}"
        );
        assert_eq!(*queued, [7.0]);
        assert!(rv.contains("rank 2 left the group without sending"), "{rv}");
    }

    /// Started collectives run on the group's second lane while the rank makes other
    /// calls on the group, and give the same bits as the calls made in place; several
    /// in flight, of every kind, come back each with its own result.
    #[test]
    fn started_collectives_overlap_other_calls_and_match() {
        let out = on_ranks(3, |g| {
            let r = g.rank() as f32;
            let data: Vec<Vec<f32>> = (0..3).map(|k| vec![0.1 * (r + 1.0) + k as f32, r * 1e-3, -r]).collect();
            let kinds = [Started::AllReduce(ReduceOp::Sum), Started::ReduceScatter, Started::AllGather];
            let started: Vec<_> = data.iter().zip(kinds).map(|(d, k)| HostCollective::start(&g, k, d.clone()).unwrap()).collect();
            // The group itself stays usable meanwhile (its own call sequence).
            let gathered = g.all_gather(&[r]).unwrap();
            let got: Vec<Vec<f32>> = started.into_iter().map(|s| s.wait().unwrap()).collect();
            let mut sum = data[0].clone();
            g.all_reduce(&mut sum, ReduceOp::Sum).unwrap();
            let want = vec![sum, g.reduce_scatter(&data[1]).unwrap(), g.all_gather(&data[2]).unwrap()];
            (got, want, gathered)
        });
        for (got, want, gathered) in &out {
            let bits = |v: &Vec<Vec<f32>>| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(got), bits(want));
            let shared = |v: &Vec<Vec<f32>>| bits(&vec![v[0].clone(), v[2].clone()]);
            assert_eq!(shared(got), shared(&out[0].0), "identical on every rank");
            assert_eq!(*gathered, [0.0, 1.0, 2.0]);
        }
        assert!((out[0].0[0][0] - 0.6).abs() < 1e-5, "{:?}", out[0].0);
        assert_eq!(out[1].0[1].len(), 1, "a reduce-scatter keeps a third");
        assert_eq!(out[1].0[2].len(), 9, "an all-gather brings all three");
    }

    /// Started on a device buffer (the CPU's), each kind gives the result of its
    /// in-place call in a buffer of the result's length; a reduce-scatter that does not
    /// split over the group is refused at the start.
    #[test]
    fn started_collectives_on_device_buffers() {
        let out = on_ranks(2, |g| {
            let dev = Cpu::new();
            let r = g.rank() as f32;
            let buf = |v: &[f32]| {
                let mut b = dev.alloc(Elem::F32, v.len()).unwrap();
                dev.write_f32(&mut b, v).unwrap();
                b
            };
            let c: &dyn super::Collective<Cpu> = &g;
            let mut got = Vec::new();
            for k in [Started::AllGather, Started::ReduceScatter, Started::AllReduce(ReduceOp::Max)] {
                let f = c.start(&dev, k, buf(&[r, 10.0 + r])).unwrap();
                got.push(dev.read_f32(&c.finish(&dev, f).unwrap()).unwrap());
            }
            let odd = c.start(&dev, Started::ReduceScatter, buf(&[1.0, 2.0, 3.0])).err().unwrap().to_string();
            (got, odd)
        });
        assert_eq!(out[0].0, [vec![0.0, 10.0, 1.0, 11.0], vec![1.0], vec![1.0, 11.0]]);
        assert_eq!(out[1].0[1], [21.0]);
        assert!(out[0].1.contains("3 elements do not split over 2 ranks"), "{}", out[0].1);
    }

    /// A rank that leaves with all-reduces started elsewhere fails them at once, naming
    /// it, instead of leaving them to wait.
    #[test]
    fn a_rank_that_leaves_fails_the_started_all_reduces() {
        let t0 = Instant::now();
        let out = on_ranks(2, |g| {
            if g.rank() == 1 {
                // Starts one (so its lane thread runs), then leaves before the second.
                let first = HostCollective::start(&g, Started::AllReduce(ReduceOp::Sum), vec![1.0]).unwrap();
                let _ = first.wait();
                return String::new();
            }
            let first = HostCollective::start(&g, Started::AllReduce(ReduceOp::Sum), vec![1.0]).unwrap();
            assert_eq!(first.wait().unwrap(), [2.0]);
            let second = HostCollective::start(&g, Started::AllReduce(ReduceOp::Sum), vec![1.0]).unwrap();
            second.wait().unwrap_err().to_string()
        });
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert!(out[0].contains("all-reduce") && out[0].contains("rank(s) 1 left the group"), "{}", out[0]);
    }

    fn on_ranks_catching<T: Send + 'static>(
        n: usize,
        f: impl Fn(ThreadGroup) -> T + Send + Sync + 'static,
    ) -> Vec<std::thread::Result<T>> {
        let f = Arc::new(f);
        let hs: Vec<_> = ThreadGroup::new(n)
            .into_iter()
            .map(|h| {
                let f = Arc::clone(&f);
                std::thread::spawn(move || f(h))
            })
            .collect();
        hs.into_iter().map(|h| h.join()).collect()
    }

    #[test]
    fn a_panicking_rank_releases_the_others() {
        let t0 = Instant::now();
        let out = on_ranks_catching(2, |g| {
            if g.rank() == 1 {
                std::thread::sleep(Duration::from_millis(20));
                panic!("expected in this test");
            }
            g.all_gather(&[1.0]).unwrap_err().to_string()
        });
        // Released by the leaving rank, long before the 300 s timeout; the message says
        // which (a timeout would say "timed out"). The bound is loose: 1 s failed under a
        // load of 12 on 2 cores.
        assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
        assert!(out[1].is_err());
        let e = out[0].as_ref().unwrap();
        assert!(e.contains("rank(s) 1 left the group"), "{e}");
    }

    /// A rank that stays but never calls: the others time out with the call, the missing
    /// ranks and the fix named; the group refuses further calls.
    #[test]
    fn waits_time_out_naming_the_missing_ranks() {
        // 400 ms: at 50 ms a loaded machine (load 7) once let rank 0 time out before rank 1's
        // thread ran, and the message named ranks 1 and 2.
        let mut hs = ThreadGroup::with_timeout(3, Duration::from_millis(400));
        let idle = hs.pop().unwrap();
        let t0 = Instant::now();
        let joins: Vec<_> = hs
            .into_iter()
            .map(|g| {
                std::thread::spawn(move || {
                    let e = g.reduce_scatter(&[1.0, 2.0, 3.0]).unwrap_err().to_string();
                    let again = g.all_gather(&[1.0]).unwrap_err().to_string();
                    let rv = g.recv(2).unwrap_err().to_string();
                    (e, again, rv)
                })
            })
            .collect();
        for j in joins {
            let (e, again, rv) = j.join().unwrap();
            assert!(
                e.contains("reduce-scatter") && e.contains("timed out"),
                "{e}"
            );
            assert!(e.contains("rank(s) 2 did not arrive"), "{e}");
            assert!(e.contains("ThreadGroup::with_timeout"), "{e}");
            assert!(again.contains("unusable"), "{again}");
            assert!(
                rv.contains("recv on rank") && rv.contains("timed out"),
                "{rv}"
            );
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
        drop(idle);
    }

    /// Through the device adapter: int32 ids cross an f32 transport bit for bit (even
    /// ids whose bits are a NaN pattern), reductions refuse them, a message of the wrong
    /// length is an error naming both lengths.
    #[test]
    fn device_buffers_travel_through_a_host_transport() {
        use crate::cpu::Cpu;
        use crate::device::{Device, Elem};
        let out = on_ranks(2, |g| {
            let dev = Cpu::new();
            let r = HostCollective::rank(&g) as u32;
            let mut ids = dev.alloc(Elem::I32, 2).unwrap();
            dev.write_u32(&mut ids, &[r, 0x7FC0_0001 + r]).unwrap();
            let mut all = dev.alloc(Elem::I32, 4).unwrap();
            super::Collective::all_gather(&g, &dev, &ids, &mut all).unwrap();
            let refused = super::Collective::all_reduce(&g, &dev, &mut ids, ReduceOp::Sum).unwrap_err().to_string();
            let msg = if r == 0 {
                super::Collective::send(&g, &dev, 1, &ids).unwrap();
                String::new()
            } else {
                let mut three = dev.alloc(Elem::I32, 3).unwrap();
                super::Collective::recv(&g, &dev, 0, &mut three).unwrap_err().to_string()
            };
            (dev.read_u32(&all).unwrap(), refused, msg)
        });
        for (all, refused, _) in &out {
            assert_eq!(*all, [0, 0x7FC0_0001, 1, 0x7FC0_0002]);
            assert!(refused.contains("int32"), "{refused}");
        }
        assert!(out[1].2.contains("received 2 elements, expected 3"), "{}", out[1].2);
    }

    /// A batched call of sends and receives on ranks whose sends wait for their receive
    /// (NCCL's semantics): a ring of three ranks each sending to the next and receiving
    /// from the one before completes when posted as one call, with each message where it
    /// belongs, and times out when each rank sends before it receives.
    #[test]
    fn batched_sends_and_receives_complete_a_ring_that_separate_ones_hang() {
        let ring = |batched: bool| {
            let hs: Vec<_> = ThreadGroup::rendezvous(3, Duration::from_secs(2))
                .into_iter()
                .map(|g| {
                    std::thread::spawn(move || {
                        let (r, n) = (g.rank(), g.size());
                        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
                        let mine = [r as f32, 10.0 + r as f32];
                        if batched {
                            g.batch_send_recv(&[(next, &mine[..1]), (prev, &mine[1..])], &[prev, next])
                        } else {
                            g.send(next, &mine).and_then(|()| g.recv(prev).map(|m| vec![m]))
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        };
        for (r, got) in ring(true).into_iter().enumerate() {
            let (prev, next) = ((r + 2) % 3, (r + 1) % 3);
            assert_eq!(got.unwrap(), vec![vec![prev as f32], vec![10.0 + next as f32]], "rank {r}");
        }
        let apart = ring(false);
        assert!(apart.iter().all(Result::is_err), "{apart:?}");
        assert!(apart.iter().any(|r| r.as_ref().is_err_and(|e| e.to_string().contains("timed out"))), "{apart:?}");
    }

    /// Sums in rank order on every rank, even where the order changes the bits:
    /// (1e8 + 1) - 1e8 is 0 in f32, (1e8 - 1e8) + 1 is 1. Kills accumulating the ranks
    /// after the first in reverse order.
    #[test]
    fn all_reduce_sums_in_rank_order_where_order_matters() {
        let out = on_ranks(3, |g| {
            let mut b = vec![[1e8f32, 1.0, -1e8][g.rank()]];
            g.all_reduce(&mut b, ReduceOp::Sum).unwrap();
            b[0]
        });
        assert_eq!(out, [0.0, 0.0, 0.0]);
    }

    /// Broadcast takes the root's data, whichever rank the root is; a root outside the
    /// group is refused before any exchange.
    #[test]
    fn broadcast_takes_the_roots_data() {
        let out = on_ranks(3, |g| {
            let r = g.rank() as f32;
            let from1 = g.broadcast(&[r, 10.0 + r], 1).unwrap();
            let from2 = g.broadcast(&[r], 2).unwrap();
            let bad = g.broadcast(&[r], 3).unwrap_err().to_string();
            (from1, from2, bad)
        });
        for (from1, from2, bad) in &out {
            assert_eq!(*from1, [1.0, 11.0]);
            assert_eq!(*from2, [2.0]);
            assert!(bad.contains("peer 3 outside a group of 3"), "{bad}");
        }
    }

    /// All-to-all-v refuses counts that are not one per rank, and send counts that do
    /// not sum to the data passed, naming the fault (every rank makes the same bad call).
    #[test]
    fn all_to_all_v_refuses_bad_counts() {
        let out = on_ranks(2, |g| {
            let few = g.all_to_all_v(&[1.0], &[1], &[1, 0]).unwrap_err().to_string();
            let short = g.all_to_all_v(&[1.0, 2.0], &[1, 2], &[1, 2]).unwrap_err().to_string();
            (few, short)
        });
        for (few, short) in &out {
            assert!(few.contains("1 send and 2 receive counts for a group of 2"), "{few}");
            assert!(short.contains("do not sum to the 2 elements"), "{short}");
        }
    }

    /// A send to a rank that has left fails at once; on a rendezvous group a send whose
    /// peer leaves without receiving fails at once too (not after the timeout), and a
    /// batched send waits for its receive like a single one (times out when the peer
    /// never receives).
    #[test]
    fn sends_to_ranks_that_left_or_never_receive_fail() {
        let mut hs = ThreadGroup::new(2);
        drop(hs.pop());
        let e = hs[0].send(1, &[1.0]).unwrap_err().to_string();
        assert!(e.contains("rank 1 has left the group"), "{e}");

        let mut hs = ThreadGroup::rendezvous(2, Duration::from_secs(5));
        let late = hs.pop().unwrap();
        let t0 = Instant::now();
        let leaver = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(late);
        });
        let e = hs[0].send(1, &[1.0]).unwrap_err().to_string();
        leaver.join().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}: {e}", t0.elapsed());
        assert!(e.contains("left the group") || e.contains("has left"), "{e}");

        let hs = ThreadGroup::rendezvous(2, Duration::from_millis(50));
        let e = hs[0].batch_send_recv(&[(1, &[1.0][..])], &[]).unwrap_err().to_string();
        assert!(e.contains("timed out") && e.contains("never received it"), "{e}");
        drop(hs);
    }

    /// Started on a device buffer of int32 ids, an all-reduce or reduce-scatter is
    /// refused (it would add bit patterns as floats); an all-gather carries them bit for
    /// bit.
    #[test]
    fn started_reductions_refuse_int32_buffers() {
        let out = on_ranks(2, |g| {
            let dev = Cpu::new();
            let ids = |v: &[u32]| {
                let mut b = dev.alloc(Elem::I32, v.len()).unwrap();
                dev.write_u32(&mut b, v).unwrap();
                b
            };
            let c: &dyn super::Collective<Cpu> = &g;
            let r = g.rank() as u32;
            let sum = c.start(&dev, Started::AllReduce(ReduceOp::Sum), ids(&[r, 7])).err().unwrap().to_string();
            let rs = c.start(&dev, Started::ReduceScatter, ids(&[r, 7])).err().unwrap().to_string();
            let f = c.start(&dev, Started::AllGather, ids(&[r, 0x7FC0_0001])).unwrap();
            let all = dev.read_u32(&c.finish(&dev, f).unwrap()).unwrap();
            (sum, rs, all)
        });
        for (sum, rs, all) in &out {
            assert!(sum.contains("all-reduce") && sum.contains("int32"), "{sum}");
            assert!(rs.contains("reduce-scatter") && rs.contains("int32"), "{rs}");
            assert_eq!(*all, [0, 0x7FC0_0001, 1, 0x7FC0_0001]);
        }
    }

    fn g_peer_checked() -> bool {
        let g = ThreadGroup::new(1).pop().unwrap();
        g.send(1, &[0.0]).is_err() && g.recv(5).is_err()
    }
}

