//! A collective backend over TCP for ranks without GPUs: development machines, CI, and
//! the control plane beside NCCL (its bootstrap and its failure detection). Not built for
//! speed: every reduction moves every rank's whole buffer to every rank (n·S per rank,
//! where a ring moves 2S) and reduces in rank order, so results are bit-identical to the
//! in-process [`runner_exec::ThreadGroup`] and to a single-process run of the same layout.
//!
//! The world is a full mesh, one connection per pair of ranks ([`crate::rendezvous`]
//! builds it). A reader thread per connection drains every frame into per-(peer, group,
//! kind) queues, so a send never waits for the receiver and two ranks sending to each
//! other cannot deadlock. Sub-groups (`tp`, `dp`, ...) share the connections; each frame
//! carries its group's id and the call number, so ranks that make different calls get an
//! error naming both calls instead of mixing data. A group's started all-reduces (the
//! overlapped gradient buckets) run on its [`Lane`]: a second group of the same ranks
//! (`<name>, overlapped`), on a thread of its own.
//!
//! Failure: a connection that closes marks its rank dead; every wait that needs it fails
//! at once naming it ("rank 2 closed its connection: its process exited or was killed"),
//! and the rank that saw it tells every other rank (an abort frame), so ranks waiting on
//! someone else fail too, with the root cause. Every wait ends after the timeout with the
//! call and the ranks that did not arrive.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use runner_exec::collective::reduce_in_rank_order;
use runner_exec::{ExecError, HostCollective, HostInFlight, Lane, ReduceOp, Started};

const MAGIC: u32 = 0x524E_5231; // "RNR1"
const HEADER: usize = 32;
/// The most a reader allocates for a frame before its bytes arrive.
const MAX_UPFRONT: usize = 1 << 20;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
enum Kind {
    Collective = 0,
    P2p = 1,
    Abort = 2,
}

/// Which collective a frame belongs to (checked against the receiver's call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Op {
    AllGather = 1,
    AllReduce = 2,
    ReduceScatter = 3,
    AllToAll = 4,
    AllToAllV = 5,
    Broadcast = 6,
    Barrier = 7,
    P2p = 8,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::AllGather => "all-gather",
            Op::AllReduce => "all-reduce",
            Op::ReduceScatter => "reduce-scatter",
            Op::AllToAll => "all-to-all",
            Op::AllToAllV => "all-to-all-v",
            Op::Broadcast => "broadcast",
            Op::Barrier => "barrier",
            Op::P2p => "send/recv",
        }
    }
    fn from(b: u8) -> Option<Op> {
        Some(match b {
            1 => Op::AllGather,
            2 => Op::AllReduce,
            3 => Op::ReduceScatter,
            4 => Op::AllToAll,
            5 => Op::AllToAllV,
            6 => Op::Broadcast,
            7 => Op::Barrier,
            8 => Op::P2p,
            _ => return None,
        })
    }
}

struct Frame {
    op: u8,
    seq: u64,
    data: Vec<f32>,
}

#[derive(Default)]
struct Inbox {
    queues: HashMap<(usize, u64, u8), VecDeque<Frame>>,
    /// Per world rank: why its connection ended.
    dead: Vec<Option<String>>,
    /// The rank whose connection ended first: the likeliest root cause, where the ranks
    /// that died after it failed on its death.
    first_dead: Option<usize>,
    /// A failure another rank reported.
    abort: Option<String>,
}

struct Shared {
    rank: usize,
    size: usize,
    writers: Vec<Option<Mutex<TcpStream>>>,
    inbox: Mutex<Inbox>,
    changed: Condvar,
    timeout: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self, peer: usize, kind: Kind, op: u8, group: u64, seq: u64, data: &[f32]) -> Result<(), String> {
        let w = self.writers.get(peer).and_then(Option::as_ref).ok_or_else(|| format!("no connection to rank {peer}"))?;
        let mut h = [0u8; HEADER];
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[4] = kind as u8;
        h[5] = op;
        h[8..16].copy_from_slice(&group.to_le_bytes());
        h[16..24].copy_from_slice(&seq.to_le_bytes());
        h[24..32].copy_from_slice(&((data.len() * 4) as u64).to_le_bytes());
        let mut bytes = Vec::with_capacity(HEADER + data.len() * 4);
        bytes.extend_from_slice(&h);
        for x in data {
            bytes.extend_from_slice(&x.to_bits().to_le_bytes());
        }
        let mut s = w.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        s.write_all(&bytes).map_err(|e| format!("sending to rank {peer}: {e}"))
    }

    /// Tell every live peer that the run failed (best effort).
    fn abort_all(&self, reason: &str) {
        let words: Vec<f32> = reason.bytes().map(|b| f32::from_bits(u32::from(b))).collect();
        for peer in 0..self.size {
            if peer != self.rank && self.lock().dead.get(peer).is_some_and(Option::is_none) {
                let _ = self.write(peer, Kind::Abort, 0, 0, 0, &words);
            }
        }
    }
}

/// Read frames from `peer` until its connection ends.
fn reader(shared: Arc<Shared>, peer: usize, mut s: TcpStream) {
    let why = loop {
        let mut h = [0u8; HEADER];
        if let Err(e) = s.read_exact(&mut h) {
            break if e.kind() == std::io::ErrorKind::UnexpectedEof {
                "closed its connection: its process exited or was killed".to_string()
            } else {
                format!("lost its connection ({e}): its process exited or was killed")
            };
        }
        let word = |r: std::ops::Range<usize>| u64::from_le_bytes(h[r].try_into().unwrap_or([0; 8]));
        if u32::from_le_bytes([h[0], h[1], h[2], h[3]]) != MAGIC {
            break "sent a frame this protocol does not know (another program on the port?)".into();
        }
        let (kind, op, group, seq, len) = (h[4], h[5], word(8..16), word(16..24), word(24..32));
        if kind > Kind::Abort as u8 || !len.is_multiple_of(4) {
            break format!("sent a malformed frame (kind {kind}, {len} bytes): another program on the port, or another runner version?");
        }
        // The length comes from the wire: the buffer grows with the bytes that arrive, so
        // a frame that claims 2^60 bytes costs what its sender actually sends, not an
        // allocation of its claim.
        let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(usize::MAX).min(MAX_UPFRONT));
        match (&mut s).take(len).read_to_end(&mut bytes) {
            Ok(got) if got as u64 == len => {}
            Ok(got) => break format!("its connection closed mid-message ({got} of {len} bytes): its process exited or was killed"),
            Err(e) => break format!("its connection failed mid-message ({e})"),
        }
        let data: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_bits(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect();
        let mut inbox = shared.lock();
        if kind == Kind::Abort as u8 {
            let text: String = data.iter().map(|x| char::from(x.to_bits() as u8)).collect();
            inbox.abort.get_or_insert(format!("{text} (reported by rank {peer})"));
        } else {
            inbox.queues.entry((peer, group, kind)).or_default().push_back(Frame { op, seq, data });
        }
        drop(inbox);
        shared.changed.notify_all();
    };
    let mut inbox = shared.lock();
    if let Some(d) = inbox.dead.get_mut(peer) {
        d.get_or_insert(why);
        inbox.first_dead.get_or_insert(peer);
    }
    drop(inbox);
    shared.changed.notify_all();
}

/// This rank's connections to every other rank of the run.
#[derive(Clone)]
pub struct TcpWorld {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TcpWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TcpWorld(rank {} of {})", self.rank(), self.size())
    }
}

impl TcpWorld {
    /// A world from one connected stream per other rank (index = world rank; `None` at
    /// this rank's own index), whose waits fail after `timeout`.
    ///
    /// # Errors
    /// A stream that cannot be cloned for its reader thread.
    pub fn new(rank: usize, streams: Vec<Option<TcpStream>>, timeout: Duration) -> Result<TcpWorld, String> {
        let size = streams.len();
        let mut writers = Vec::with_capacity(size);
        let mut readers = Vec::new();
        for (peer, s) in streams.into_iter().enumerate() {
            match s {
                Some(s) => {
                    let _ = s.set_nodelay(true);
                    let r = s.try_clone().map_err(|e| format!("connection to rank {peer}: {e}"))?;
                    readers.push((peer, r));
                    writers.push(Some(Mutex::new(s)));
                }
                None => writers.push(None),
            }
        }
        let shared = Arc::new(Shared {
            rank,
            size,
            writers,
            inbox: Mutex::new(Inbox {
                dead: vec![None; size],
                ..Inbox::default()
            }),
            changed: Condvar::new(),
            timeout,
        });
        for (peer, s) in readers {
            let sh = shared.clone();
            std::thread::Builder::new()
                .name(format!("runner-tcp-{peer}"))
                .spawn(move || reader(sh, peer, s))
                .map_err(|e| format!("reader thread: {e}"))?;
        }
        Ok(TcpWorld { shared })
    }

    pub fn rank(&self) -> usize {
        self.shared.rank
    }
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// The group of world ranks `members` (this rank among them), named `name` in
    /// errors. Every member must create it with the same name and member list.
    ///
    /// # Errors
    /// This rank is not a member, or a member is outside the world.
    pub fn group(&self, name: &str, members: &[usize]) -> Result<TcpGroup, String> {
        let me = members
            .iter()
            .position(|&m| m == self.rank())
            .ok_or_else(|| format!("rank {} is not in group '{name}' {members:?}", self.rank()))?;
        if let Some(&bad) = members.iter().find(|&&m| m >= self.size()) {
            return Err(format!("group '{name}': rank {bad} outside a world of {}", self.size()));
        }
        if let Some(dup) = members.iter().enumerate().find_map(|(i, m)| members[..i].contains(m).then_some(m)) {
            return Err(format!("group '{name}' {members:?}: rank {dup} appears twice (every member once)"));
        }
        let overlapped = format!("{name}, overlapped");
        let lane = self.member(&overlapped, members, me, Lane::none());
        Ok(self.member(name, members, me, Lane::new(lane)))
    }

    fn member(&self, name: &str, members: &[usize], me: usize, lane: Lane<TcpGroup>) -> TcpGroup {
        // FNV-1a of the name and members: the same on every member.
        let mut id = 0xcbf2_9ce4_8422_2325u64;
        for b in name.bytes().chain(members.iter().flat_map(|m| (*m as u64).to_le_bytes())) {
            id = (id ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        TcpGroup {
            shared: self.shared.clone(),
            name: name.into(),
            members: members.to_vec(),
            me,
            id,
            seq: AtomicU64::new(0),
            lane,
        }
    }

    /// Every rank of the world, as a group.
    ///
    /// # Errors
    /// Never for a well-formed world.
    pub fn everyone(&self) -> Result<TcpGroup, String> {
        self.group("world", &(0..self.size()).collect::<Vec<_>>())
    }

    /// Close every connection (the other ranks see this rank leave, as if its process
    /// had exited).
    pub fn close(&self) {
        for w in self.shared.writers.iter().flatten() {
            let s = w.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// The first failure seen: an abort reported by another rank, else the rank that died
    /// first.
    pub fn failure(&self) -> Option<String> {
        let inbox = self.shared.lock();
        if let Some(a) = &inbox.abort {
            return Some(a.clone());
        }
        let r = inbox.first_dead?;
        inbox.dead[r].as_ref().map(|why| format!("rank {r} {why}"))
    }
}

/// One rank's handle on a group of a [`TcpWorld`].
pub struct TcpGroup {
    shared: Arc<Shared>,
    name: String,
    /// World ranks, in group-rank order.
    members: Vec<usize>,
    me: usize,
    id: u64,
    seq: AtomicU64,
    /// Where started all-reduces run.
    lane: Lane<TcpGroup>,
}

fn err(what: String) -> ExecError {
    ExecError::State(format!("collective: {what}"))
}

impl TcpGroup {
    fn n(&self) -> usize {
        self.members.len()
    }

    fn describe(&self, op: Op, seq: u64) -> String {
        format!("{} (call {seq} of group '{}' of {}) on rank {}", op.name(), self.name, self.n(), self.shared.rank)
    }

    /// Fail, telling the other ranks why when the cause is another rank's failure.
    fn fail(&self, what: String, tell: bool) -> ExecError {
        if tell {
            self.shared.abort_all(&what);
        }
        err(what)
    }

    /// Wait briefly for another rank's report of the failure behind a lost peer (the
    /// peer may have exited because of it): the root cause, if one arrives.
    fn reported_cause(&self) -> Option<String> {
        let deadline = Instant::now() + Duration::from_millis(500);
        let mut inbox = self.shared.lock();
        loop {
            if let Some(a) = &inbox.abort {
                return Some(a.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            inbox = self
                .shared
                .changed
                .wait_timeout(inbox, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// The error for a peer lost with `why`: another rank's report of the root cause when
    /// one arrives, else this peer, told to every other rank.
    fn lost(&self, op: Op, seq: u64, peer: usize, why: &str) -> ExecError {
        match self.reported_cause() {
            Some(a) => self.fail(format!("{}: the run was aborted: {a}", self.describe(op, seq)), false),
            None => self.fail(format!("{}: rank {peer} {why}", self.describe(op, seq)), true),
        }
    }

    fn send_to(&self, j: usize, kind: Kind, op: Op, seq: u64, data: &[f32]) -> Result<(), ExecError> {
        let peer = self.members[j];
        self.shared
            .write(peer, kind, op as u8, self.id, seq, data)
            .map_err(|e| self.lost(op, seq, peer, &format!("is unreachable ({e}): its process exited or was killed")))
    }

    /// The next frame from group member `j` of `kind`, waiting at most the timeout.
    fn take(&self, j: usize, kind: Kind, op: Op, seq: u64, deadline: Instant) -> Result<Frame, ExecError> {
        let peer = self.members[j];
        let mut inbox = self.shared.lock();
        loop {
            if let Some(f) = inbox.queues.get_mut(&(peer, self.id, kind as u8)).and_then(VecDeque::pop_front) {
                return Ok(f);
            }
            if let Some(a) = &inbox.abort {
                let a = a.clone();
                drop(inbox);
                return Err(self.fail(format!("{}: the run was aborted: {a}", self.describe(op, seq)), false));
            }
            if let Some(why) = &inbox.dead[peer] {
                let why = why.clone();
                drop(inbox);
                return Err(self.lost(op, seq, peer, &why));
            }
            let now = Instant::now();
            if now >= deadline {
                drop(inbox);
                return Err(self.fail(
                    format!(
                        "{} timed out after {:?}: rank {peer} did not arrive. Every rank must make the same \
                         collective calls in the same order; find why rank {peer} is stuck or slow, or raise the \
                         limit (--timeout)",
                        self.describe(op, seq),
                        self.shared.timeout
                    ),
                    true,
                ));
            }
            inbox = self
                .shared
                .changed
                .wait_timeout(inbox, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// A collective frame from member `j`, checked to be call `seq` of `op`.
    fn take_call(&self, j: usize, op: Op, seq: u64, deadline: Instant) -> Result<Vec<f32>, ExecError> {
        let f = self.take(j, Kind::Collective, op, seq, deadline)?;
        if f.op != op as u8 || f.seq != seq {
            let theirs = Op::from(f.op).map_or("an unknown call", Op::name);
            return Err(self.fail(
                format!(
                    "{}: rank {} made {theirs} (call {}) here; every rank must make the same collective calls in \
                     the same order",
                    self.describe(op, seq),
                    self.members[j],
                    f.seq
                ),
                true,
            ));
        }
        Ok(f.data)
    }

    /// Send `parts[j]` to every member j and return what each member sent here, in
    /// member order (this rank's own part included).
    fn exchange(&self, op: Op, parts: &[&[f32]]) -> Result<Vec<Vec<f32>>, ExecError> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + self.shared.timeout;
        for (j, p) in parts.iter().enumerate() {
            if j != self.me {
                self.send_to(j, Kind::Collective, op, seq, p)?;
            }
        }
        (0..self.n())
            .map(|j| if j == self.me { Ok(parts[j].to_vec()) } else { self.take_call(j, op, seq, deadline) })
            .collect()
    }

    /// [`TcpGroup::exchange`] of the same `data` to everyone, lengths checked equal.
    fn exchange_same(&self, op: Op, data: &[f32]) -> Result<Vec<Vec<f32>>, ExecError> {
        let parts = vec![data; self.n()];
        let all = self.exchange(op, &parts)?;
        if let Some(bad) = all.iter().position(|v| v.len() != data.len()) {
            return Err(err(format!(
                "{} on rank {}: rank {} passed {} elements, this rank {}",
                op.name(),
                self.shared.rank,
                self.members[bad],
                all[bad].len(),
                data.len()
            )));
        }
        Ok(all)
    }

    fn chunks<'a>(&self, input: &'a [f32], op: Op) -> Result<Vec<&'a [f32]>, ExecError> {
        if !input.len().is_multiple_of(self.n()) {
            return Err(err(format!("{}: {} elements do not split over {} ranks", op.name(), input.len(), self.n())));
        }
        // Slices, not `chunks`: an empty input is n empty parts (chunks(0) panics).
        let c = input.len() / self.n();
        Ok((0..self.n()).map(|j| &input[j * c..(j + 1) * c]).collect())
    }

    /// Wait until every member reached this call.
    ///
    /// # Errors
    /// A member left or the wait timed out.
    pub fn barrier(&self) -> Result<(), ExecError> {
        self.exchange_same(Op::Barrier, &[]).map(|_| ())
    }

    /// The world ranks of the group, in group-rank order.
    pub fn members(&self) -> &[usize] {
        &self.members
    }
}

impl HostCollective for TcpGroup {
    fn rank(&self) -> usize {
        self.me
    }
    fn size(&self) -> usize {
        self.n()
    }

    fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), ExecError> {
        let all = self.exchange_same(Op::AllReduce, buf)?;
        // Rank order on every rank, as ThreadGroup: bit-identical results everywhere.
        let parts: Vec<&[f32]> = all.iter().map(Vec::as_slice).collect();
        buf.copy_from_slice(&reduce_in_rank_order(&parts, op));
        Ok(())
    }

    fn start(&self, what: Started, data: Vec<f32>) -> Result<HostInFlight, ExecError> {
        self.lane.start(self, what, data)
    }

    fn all_gather(&self, input: &[f32]) -> Result<Vec<f32>, ExecError> {
        Ok(self.exchange_same(Op::AllGather, input)?.concat())
    }

    fn reduce_scatter(&self, input: &[f32]) -> Result<Vec<f32>, ExecError> {
        let parts = self.chunks(input, Op::ReduceScatter)?;
        let c = parts[0].len();
        let got = self.exchange(Op::ReduceScatter, &parts)?;
        if got.iter().any(|v| v.len() != c) {
            return Err(err(format!("reduce-scatter on rank {}: the ranks passed different lengths", self.shared.rank)));
        }
        let parts: Vec<&[f32]> = got.iter().map(Vec::as_slice).collect();
        Ok(reduce_in_rank_order(&parts, ReduceOp::Sum))
    }

    fn all_to_all(&self, input: &[f32]) -> Result<Vec<f32>, ExecError> {
        let parts = self.chunks(input, Op::AllToAll)?;
        let c = parts[0].len();
        let got = self.exchange(Op::AllToAll, &parts)?;
        if got.iter().any(|v| v.len() != c) {
            return Err(err(format!("all-to-all on rank {}: the ranks passed different lengths", self.shared.rank)));
        }
        Ok(got.concat())
    }

    fn all_to_all_v(&self, input: &[f32], send: &[usize], recv: &[usize]) -> Result<Vec<f32>, ExecError> {
        let n = self.n();
        if send.len() != n || recv.len() != n || send.iter().try_fold(0usize, |a, &c| a.checked_add(c)) != Some(input.len()) {
            return Err(err(format!(
                "all-to-all-v on rank {}: counts {send:?} / {recv:?} for {} elements over {n} ranks",
                self.shared.rank,
                input.len()
            )));
        }
        let mut parts = Vec::with_capacity(n);
        let mut at = 0;
        for &c in send {
            parts.push(&input[at..at + c]);
            at += c;
        }
        let got = self.exchange(Op::AllToAllV, &parts)?;
        for (j, (g, &want)) in got.iter().zip(recv).enumerate() {
            if g.len() != want {
                return Err(err(format!(
                    "all-to-all-v: rank {} sends {} elements to rank {}, which expects {want} (the ranks disagree on \
                     the counts)",
                    self.members[j],
                    g.len(),
                    self.shared.rank
                )));
            }
        }
        Ok(got.concat())
    }

    fn broadcast(&self, data: &[f32], root: usize) -> Result<Vec<f32>, ExecError> {
        if root >= self.n() {
            return Err(err(format!("broadcast from rank {root} in a group of {}", self.n())));
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + self.shared.timeout;
        if self.me == root {
            for j in (0..self.n()).filter(|&j| j != root) {
                self.send_to(j, Kind::Collective, Op::Broadcast, seq, data)?;
            }
            return Ok(data.to_vec());
        }
        let got = self.take_call(root, Op::Broadcast, seq, deadline)?;
        if got.len() != data.len() {
            return Err(err(format!(
                "broadcast: rank {} sent {} elements, rank {} expects {}",
                self.members[root],
                got.len(),
                self.shared.rank,
                data.len()
            )));
        }
        Ok(got)
    }

    fn send(&self, peer: usize, data: &[f32]) -> Result<(), ExecError> {
        if peer >= self.n() || peer == self.me {
            return Err(err(format!("send to rank {peer} of a group of {} from rank {}", self.n(), self.me)));
        }
        self.send_to(peer, Kind::P2p, Op::P2p, 0, data)
    }

    fn recv(&self, peer: usize) -> Result<Vec<f32>, ExecError> {
        if peer >= self.n() || peer == self.me {
            return Err(err(format!("recv from rank {peer} of a group of {} on rank {}", self.n(), self.me)));
        }
        let deadline = Instant::now() + self.shared.timeout;
        self.take(peer, Kind::P2p, Op::P2p, 0, deadline).map(|f| f.data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A full mesh of `n` worlds over loopback, built directly (no rendezvous).
    pub(crate) fn mesh(n: usize, timeout: Duration) -> Vec<TcpWorld> {
        let listeners: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
        let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let mut streams: Vec<Vec<Option<TcpStream>>> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        for (i, j) in (0..n).flat_map(|i| (0..i).map(move |j| (i, j))) {
            let a = TcpStream::connect(addrs[j]).unwrap();
            let (b, _) = listeners[j].accept().unwrap();
            streams[i][j] = Some(a);
            streams[j][i] = Some(b);
        }
        streams.into_iter().enumerate().map(|(r, s)| TcpWorld::new(r, s, timeout).unwrap()).collect()
    }

    fn on_ranks<T: Send + 'static>(n: usize, f: impl Fn(TcpWorld) -> T + Send + Sync + 'static) -> Vec<T> {
        let f = Arc::new(f);
        let hs: Vec<_> = mesh(n, Duration::from_secs(10))
            .into_iter()
            .map(|w| {
                let f = f.clone();
                std::thread::spawn(move || f(w))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    /// Every call gives what the in-process ThreadGroup gives, bit for bit.
    #[test]
    fn collectives_match_the_thread_group_bit_for_bit() {
        let out = on_ranks(3, |w| {
            let g = w.everyone().unwrap();
            let r = g.rank() as f32;
            let mut s = vec![r, 1.0, 0.1 * (r + 1.0)];
            g.all_reduce(&mut s, ReduceOp::Sum).unwrap();
            let mut m = vec![r, -r];
            g.all_reduce(&mut m, ReduceOp::Max).unwrap();
            let ag = g.all_gather(&[r, r + 10.0]).unwrap();
            let rs = g.reduce_scatter(&[1.0, 2.0, 3.0 + r, 4.0, 5.0, 6.0]).unwrap();
            let a2a = g.all_to_all(&[10.0 * r, 10.0 * r + 1.0, 10.0 * r + 2.0]).unwrap();
            let bc = g.broadcast(&[r, r], 2).unwrap();
            // Rank order, not any other: (1 + 1e8) - 1e8 = 0 in f32, (-1e8 + 1e8) + 1 = 1.
            let x = [1.0f32, 1e8, -1e8][g.rank()];
            let mut o = vec![x];
            g.all_reduce(&mut o, ReduceOp::Sum).unwrap();
            let o_rs = g.reduce_scatter(&[x; 3]).unwrap();
            assert_eq!((o[0], o_rs[0]), (0.0, 0.0), "rank {r}");
            (s, m, ag, rs, a2a, bc)
        });
        for (s, m, ag, _, _, bc) in &out {
            assert_eq!(s[2].to_bits(), ((0.1f32 + 0.2) + 0.3f32).to_bits());
            assert_eq!(*m, vec![2.0, 0.0]);
            assert_eq!(*ag, vec![0.0, 10.0, 1.0, 11.0, 2.0, 12.0]);
            assert_eq!(*bc, vec![2.0, 2.0]);
        }
        assert_eq!(out[0].3, vec![3.0, 6.0]);
        assert_eq!(out[1].3, vec![12.0, 12.0]);
        assert_eq!(out[2].4, vec![2.0, 12.0, 22.0]);
    }

    #[test]
    fn sub_groups_and_point_to_point_keep_their_own_streams() {
        let out = on_ranks(4, |w| {
            let r = w.rank();
            // pairs {0,1} {2,3} and a dp group {r%2 ...}
            let tp = w.group("tp", &if r < 2 { [0, 1] } else { [2, 3] }).unwrap();
            let dp = w.group("dp", &if r % 2 == 0 { [0, 2] } else { [1, 3] }).unwrap();
            let mut a = vec![r as f32];
            tp.all_reduce(&mut a, ReduceOp::Sum).unwrap();
            let mut b = vec![r as f32];
            dp.all_reduce(&mut b, ReduceOp::Sum).unwrap();
            if tp.rank() == 0 {
                tp.send(1, &[100.0 + r as f32]).unwrap();
                tp.send(1, &[200.0]).unwrap();
                (a, b, vec![])
            } else {
                let x = tp.recv(0).unwrap();
                let y = tp.recv(0).unwrap();
                (a, b, [x, y].concat())
            }
        });
        assert_eq!(out[0].0, [1.0]);
        assert_eq!(out[3].0, [5.0]);
        assert_eq!(out[1].1, [4.0]);
        assert_eq!(out[3].2, [102.0, 200.0]);
    }

    /// Started collectives run on the group's second lane, beside calls on the group
    /// itself, with the bits of the calls in place; one whose peer died fails, naming
    /// it.
    #[test]
    fn started_collectives_run_beside_the_group_and_fail_on_a_dead_rank() {
        let out = on_ranks(3, |w| {
            let g = w.group("dp", &[0, 1, 2]).unwrap();
            let r = g.rank() as f32;
            let data = vec![0.1 * (r + 1.0), r, 2.0 * r];
            let started = g.start(Started::AllReduce(ReduceOp::Sum), data.clone()).unwrap();
            let scattered = g.start(Started::ReduceScatter, data.clone()).unwrap();
            let gathered = g.all_gather(&[r]).unwrap();
            let got = [started.wait().unwrap(), scattered.wait().unwrap()].concat();
            let mut want = data.clone();
            g.all_reduce(&mut want, ReduceOp::Sum).unwrap();
            want.extend(g.reduce_scatter(&data).unwrap());
            let dead = if g.rank() == 2 {
                w.close();
                String::new()
            } else {
                let s = g.start(Started::AllGather, vec![1.0]).unwrap();
                s.wait().unwrap_err().to_string()
            };
            (got, want, gathered, dead)
        });
        for (got, want, gathered, _) in &out {
            assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            assert_eq!(*gathered, [0.0, 1.0, 2.0]);
        }
        for (_, _, _, dead) in &out[..2] {
            assert!(dead.contains("rank 2") && dead.contains("dp, overlapped"), "{dead}");
        }
    }

    /// A rank that goes away (its connections close) fails the others at once, naming
    /// it; ranks waiting on someone else learn it from the abort.
    #[test]
    fn a_rank_that_dies_is_named_on_every_other_rank() {
        let worlds = mesh(3, Duration::from_secs(20));
        let t0 = Instant::now();
        let mut hs = Vec::new();
        for w in worlds {
            hs.push(std::thread::spawn(move || {
                if w.rank() == 2 {
                    // Dies: its connections close, as when its process is killed.
                    w.close();
                    return String::new();
                }
                let g = w.everyone().unwrap();
                let mut b = vec![1.0];
                g.all_reduce(&mut b, ReduceOp::Sum).unwrap_err().to_string()
            }));
        }
        let errs: Vec<String> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        for e in &errs[..2] {
            assert!(e.contains("rank 2"), "{e}");
        }
    }

    /// Rank 0 of a world of two whose rank 1 is a raw socket this test writes to.
    fn with_raw_peer(timeout: Duration) -> (TcpWorld, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let raw = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mine, _) = l.accept().unwrap();
        (TcpWorld::new(0, vec![None, Some(mine)], timeout).unwrap(), raw)
    }

    fn header(kind: u8, op: u8, group: u64, seq: u64, len: u64) -> Vec<u8> {
        let mut h = vec![0u8; HEADER];
        h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        h[4] = kind;
        h[5] = op;
        h[8..16].copy_from_slice(&group.to_le_bytes());
        h[16..24].copy_from_slice(&seq.to_le_bytes());
        h[24..32].copy_from_slice(&len.to_le_bytes());
        h
    }

    /// What rank 0's all-reduce says when rank 1 sends `bytes` (then closes when `close`).
    fn all_reduce_against(bytes: &[u8], close: bool, timeout: Duration) -> String {
        let (w, mut raw) = with_raw_peer(timeout);
        raw.write_all(bytes).unwrap();
        if close {
            raw.shutdown(std::net::Shutdown::Both).unwrap();
        }
        let g = w.everyone().unwrap();
        let e = g.all_reduce(&mut [1.0], ReduceOp::Sum).unwrap_err().to_string();
        drop(raw);
        e
    }

    /// A peer's frame header is not trusted: a length of 2^60 allocates what arrives
    /// (before: `vec![0; 2^60]`, an abort of the whole process), half a frame then a
    /// close, a length that is no whole number of floats, a kind nobody reads, another
    /// program's bytes, silence: each an error naming rank 1, within the timeout.
    #[test]
    fn a_hostile_peer_is_an_error_not_an_abort_or_a_hang() {
        let t = Duration::from_millis(300);
        let world = TcpWorld::new(0, vec![None, None], t).unwrap();
        let id = world.everyone().unwrap().id;
        let start = Instant::now();
        let frame = |kind: u8, len: u64, body: usize| [header(kind, Op::AllReduce as u8, id, 0, len), vec![0; body]].concat();
        let cases: Vec<(Vec<u8>, bool, String)> = vec![
            (frame(0, 1 << 60, 8), true, "rank 1 its connection closed mid-message (8 of 1152921504606846976 bytes)".into()),
            ([header(0, Op::AllReduce as u8, id, 5, 4), vec![0; 4]].concat(), false, "rank 1 made all-reduce (call 5) here".into()),
            ([header(0, Op::Broadcast as u8, id, 0, 4), vec![0; 4]].concat(), false, "rank 1 made broadcast (call 0) here".into()),
            (frame(0, 8, 4), true, "rank 1 its connection closed mid-message (4 of 8 bytes)".into()),
            (frame(0, 3, 3), false, "rank 1 sent a malformed frame (kind 0, 3 bytes)".into()),
            (frame(3, 4, 4), false, "rank 1 sent a malformed frame (kind 3, 4 bytes)".into()),
            (frame(255, 0, 0), false, "rank 1 sent a malformed frame (kind 255, 0 bytes)".into()),
            (b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n".to_vec(), false, "rank 1 sent a frame this protocol does not know".into()),
            (vec![], false, "timed out after 300ms: rank 1 did not arrive".into()),
        ];
        // In parallel: each lost peer waits half a second for a root cause.
        let hs: Vec<_> = cases.into_iter().map(|(bytes, close, want)| std::thread::spawn(move || (all_reduce_against(&bytes, close, t), want))).collect();
        // Silence ends at the timeout, not later.
        let silent = std::thread::spawn(|| {
            let t = Instant::now();
            (all_reduce_against(&[], false, Duration::from_secs(1)), t.elapsed())
        });
        for h in hs {
            let (e, want) = h.join().unwrap();
            assert!(e.contains(&want), "want '{want}': {e}");
        }
        let (e, took) = silent.join().unwrap();
        assert!(e.contains("timed out after 1s") && took >= Duration::from_secs(1) && took < Duration::from_secs(2), "{took:?}: {e}");
        // A whole frame of the right call is taken.
        let (w, mut raw) = with_raw_peer(t);
        raw.write_all(&[header(0, Op::AllReduce as u8, id, 0, 4), 2.5f32.to_le_bytes().to_vec()].concat()).unwrap();
        let mut x = [1.0];
        w.everyone().unwrap().all_reduce(&mut x, ReduceOp::Sum).unwrap();
        assert_eq!(x, [3.5]);
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    }

    /// Empty inputs split into empty parts (before: `chunks(0)` panicked); counts that
    /// overflow and groups that name a rank twice are errors.
    #[test]
    fn empty_inputs_and_bad_counts_are_not_panics() {
        let out = on_ranks(2, |w| {
            let g = w.everyone().unwrap();
            let rs = g.reduce_scatter(&[]).unwrap();
            let a2a = g.all_to_all(&[]).unwrap();
            let over = g.all_to_all_v(&[1.0], &[usize::MAX, 2], &[0, 0]).unwrap_err().to_string();
            let dup = w.group("tp", &[0, 0, 1]).err().unwrap_or_default();
            (rs, a2a, over, dup)
        });
        for (rs, a2a, over, dup) in &out {
            assert!(rs.is_empty() && a2a.is_empty());
            assert!(over.contains("counts [18446744073709551615, 2]"), "{over}");
            assert!(dup.contains("rank 0 appears twice"), "{dup}");
        }
    }

    /// Every local check of a call's arguments, made the same way on both ranks (so the
    /// calls stay in step), and all-to-all-v's data in its places.
    #[test]
    fn each_call_checks_its_arguments() {
        let out = on_ranks(2, |w| {
            let g = w.everyone().unwrap();
            let r = g.rank();
            let e = |x: Result<Vec<f32>, ExecError>| x.map(|_| ()).unwrap_err().to_string();
            let split = e(g.reduce_scatter(&[1.0, 2.0, 3.0]));
            let a2a_split = e(g.all_to_all(&[1.0, 2.0, 3.0]));
            // Lengths that split, but differ between the ranks.
            let rs_len = e(g.reduce_scatter(&vec![1.0; 2 + 2 * r]));
            let a2a_len = e(g.all_to_all(&vec![1.0; 2 + 2 * r]));
            let input: Vec<f32> = if r == 0 { vec![1.0, 2.0, 3.0] } else { vec![10.0, 20.0, 30.0, 40.0] };
            let send: &[usize] = if r == 0 { &[1, 2] } else { &[3, 1] };
            let recv: &[usize] = if r == 0 { &[1, 3] } else { &[2, 1] };
            let v = g.all_to_all_v(&input, send, recv).unwrap();
            // One count for two ranks, however well it sums.
            let short_send = e(g.all_to_all_v(&input, &[input.len()], recv));
            let short_recv = e(g.all_to_all_v(&input, send, &recv[..1]));
            // Rank 0 expects one more from rank 1 than it sends; rank 1 one more from rank 0.
            let more: Vec<usize> = if r == 0 { vec![1, 4] } else { vec![3, 1] };
            let disagree = e(g.all_to_all_v(&input, send, &more));
            let root = e(g.broadcast(&[1.0], 2));
            let bc_len = g.broadcast(&vec![1.0; 1 + r], 0).err().map(|e| e.to_string()).unwrap_or_default();
            let to_self = g.send(r, &[1.0]).unwrap_err().to_string();
            let from_beyond = e(g.recv(2));
            let outside = w.group("x", &[0, 2]).err().unwrap_or_default();
            (split, a2a_split, rs_len, a2a_len, v, short_send, short_recv, disagree, root, bc_len, to_self, from_beyond, outside)
        });
        let (split, a2a_split, rs_len, a2a_len, v, short_send, short_recv, disagree, root, _, to_self, from_beyond, outside) = &out[0];
        assert!(split.contains("reduce-scatter: 3 elements do not split over 2 ranks"), "{split}");
        assert!(a2a_split.contains("all-to-all: 3 elements do not split over 2 ranks"), "{a2a_split}");
        assert!(rs_len.contains("reduce-scatter on rank 0: the ranks passed different lengths"), "{rs_len}");
        assert!(a2a_len.contains("all-to-all on rank 0: the ranks passed different lengths"), "{a2a_len}");
        assert_eq!(*v, [1.0, 10.0, 20.0, 30.0]);
        assert_eq!(out[1].4, [2.0, 3.0, 40.0]);
        assert!(short_send.contains("counts [3] / [1, 3]") && short_recv.contains("counts [1, 2] / [1]"), "{short_send} | {short_recv}");
        assert!(disagree.contains("rank 1 sends 3 elements to rank 0, which expects 4"), "{disagree}");
        assert!(out[1].7.contains("rank 0 sends 2 elements to rank 1, which expects 3"), "{}", out[1].7);
        assert!(root.contains("broadcast from rank 2 in a group of 2"), "{root}");
        assert!(out[1].9.contains("broadcast: rank 0 sent 1 elements, rank 1 expects 2"), "{}", out[1].9);
        assert!(to_self.contains("send to rank 0 of a group of 2 from rank 0"), "{to_self}");
        assert!(from_beyond.contains("recv from rank 2 of a group of 2 on rank 0"), "{from_beyond}");
        assert!(outside.contains("group 'x': rank 2 outside a world of 2"), "{outside}");
    }

    /// Two groups of one name over different members keep their calls apart on the
    /// connection they share (the group id hashes the members too).
    #[test]
    fn groups_of_one_name_and_other_members_do_not_mix() {
        let out = on_ranks(3, |w| {
            let r = w.rank();
            let three = w.group("g", &[0, 1, 2]).unwrap();
            if r == 2 {
                return (three.broadcast(&[0.0], 1).unwrap(), vec![]);
            }
            let two = w.group("g", &[0, 1]).unwrap();
            let mut b = vec![(r + 1) as f32];
            // Rank 1's broadcast (it does not wait) reaches rank 0 before its all-reduce
            // of the other group: rank 0's all-reduce must take the all-reduce.
            if r == 1 {
                let got = three.broadcast(&[20.0], 1).unwrap();
                two.all_reduce(&mut b, ReduceOp::Sum).unwrap();
                (got, b)
            } else {
                two.all_reduce(&mut b, ReduceOp::Sum).unwrap();
                (three.broadcast(&[0.0], 1).unwrap(), b)
            }
        });
        assert_eq!(out.iter().map(|o| o.0[0]).collect::<Vec<_>>(), [20.0; 3]);
        assert_eq!((out[0].1.clone(), out[1].1.clone()), (vec![3.0], vec![3.0]));
    }

    /// Who says what when a rank fails: a rank that times out tells the others; a rank
    /// that loses a peer waits briefly for another rank's report of the root cause and
    /// gives that, else names the peer and tells the others; the first report is kept.
    #[test]
    fn failures_reach_every_rank_with_their_root_cause() {
        // Rank 0 times out waiting on rank 1: rank 1's next call learns it.
        let worlds = mesh(2, Duration::from_millis(200));
        let hs: Vec<_> = worlds
            .into_iter()
            .map(|w| {
                std::thread::spawn(move || {
                    let g = w.everyone().unwrap();
                    if w.rank() == 0 {
                        g.all_reduce(&mut [1.0], ReduceOp::Sum).unwrap_err().to_string()
                    } else {
                        std::thread::sleep(Duration::from_millis(400));
                        let _ = g.all_reduce(&mut [1.0], ReduceOp::Sum);
                        g.all_reduce(&mut [1.0], ReduceOp::Sum).unwrap_err().to_string()
                    }
                })
            })
            .collect();
        let errs: Vec<String> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(errs[0].contains("timed out after 200ms: rank 1 did not arrive"), "{}", errs[0]);
        assert!(errs[1].contains("the run was aborted: ") && errs[1].contains("timed out after 200ms") && errs[1].contains("(reported by rank 0)"), "{}", errs[1]);

        // Rank 2 dies; rank 1, which needed it, names it and tells rank 0, which waits
        // on rank 1 only; then rank 0's world reports the failure.
        let worlds = mesh(3, Duration::from_secs(10));
        let t0 = Instant::now();
        let hs: Vec<_> = worlds
            .into_iter()
            .map(|w| {
                std::thread::spawn(move || match w.rank() {
                    2 => {
                        w.close();
                        (String::new(), None)
                    }
                    1 => {
                        let g = w.group("b", &[1, 2]).unwrap();
                        (g.all_reduce(&mut [1.0], ReduceOp::Sum).unwrap_err().to_string(), None)
                    }
                    _ => {
                        let g = w.group("a", &[0, 1]).unwrap();
                        let e = g.all_reduce(&mut [1.0], ReduceOp::Sum).unwrap_err().to_string();
                        (e, w.failure())
                    }
                })
            })
            .collect();
        let out: Vec<(String, Option<String>)> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert!(out[1].0.contains("rank 2 closed its connection"), "{}", out[1].0);
        assert!(out[0].0.contains("the run was aborted: ") && out[0].0.contains("rank 2 closed its connection") && out[0].0.contains("(reported by rank 1)"), "{}", out[0].0);
        assert!(out[0].1.as_deref().is_some_and(|f| f.contains("(reported by rank 1)")), "{:?}", out[0].1);

        // Rank 2 dies without a word while rank 1 reports the root cause a moment later:
        // rank 0, waiting on rank 2, gives rank 1's cause.
        let worlds = mesh(3, Duration::from_secs(10));
        let hs: Vec<_> = worlds
            .into_iter()
            .map(|w| {
                std::thread::spawn(move || match w.rank() {
                    2 => {
                        w.close();
                        String::new()
                    }
                    1 => {
                        std::thread::sleep(Duration::from_millis(100));
                        w.shared.abort_all("rank 1 ran out of memory");
                        String::new()
                    }
                    _ => {
                        let g = w.group("a", &[0, 2]).unwrap();
                        g.all_reduce(&mut [1.0], ReduceOp::Sum).unwrap_err().to_string()
                    }
                })
            })
            .collect();
        let errs: Vec<String> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(errs[0].contains("the run was aborted: rank 1 ran out of memory (reported by rank 1)"), "{}", errs[0]);

        // A world with nothing wrong reports nothing; a dead peer is named; of two
        // reports, the first.
        let (w, raw) = with_raw_peer(Duration::from_secs(1));
        assert_eq!(w.failure(), None);
        drop(raw);
        let (w2, mut raw2) = with_raw_peer(Duration::from_secs(1));
        let report = |text: &str| {
            let words: Vec<u8> = text.bytes().flat_map(|b| f32::from_bits(u32::from(b)).to_le_bytes()).collect();
            [header(Kind::Abort as u8, 0, 0, 0, words.len() as u64), words].concat()
        };
        raw2.write_all(&[report("first"), report("second")].concat()).unwrap();
        drop(raw2);
        let t = Instant::now();
        // Both reports read once the reader saw the connection end.
        while (w.failure().is_none() || w2.shared.lock().dead[1].is_none()) && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(w.failure().as_deref(), Some("rank 1 closed its connection: its process exited or was killed"));
        assert_eq!(w2.failure().as_deref(), Some("first (reported by rank 1)"));
        let e = w2.everyone().unwrap().all_reduce(&mut [1.0], ReduceOp::Sum).unwrap_err().to_string();
        assert!(e.contains("the run was aborted: first (reported by rank 1)"), "{e}");
    }

    /// A call's timeout is one deadline for the whole call, not one per peer: rank 1
    /// arrives late but within it, rank 2 never; rank 0 fails at its timeout (1 s) naming
    /// rank 2, not a timeout after rank 1 came (1.7 s with a deadline per peer).
    #[test]
    fn a_call_has_one_deadline_not_one_per_peer() {
        let mut worlds = mesh(3, Duration::from_secs(1));
        let two = worlds.pop().unwrap();
        let hs: Vec<_> = worlds
            .into_iter()
            .map(|w| {
                std::thread::spawn(move || {
                    let g = w.everyone().unwrap();
                    if w.rank() == 1 {
                        std::thread::sleep(Duration::from_millis(700));
                    }
                    let start = Instant::now();
                    (g.all_reduce(&mut [1.0], ReduceOp::Sum).unwrap_err().to_string(), start.elapsed())
                })
            })
            .collect();
        let out: Vec<(String, Duration)> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        drop(two);
        let (e, took) = &out[0];
        assert!(e.contains("timed out after 1s: rank 2 did not arrive") && *took < Duration::from_millis(1400), "{took:?}: {e}");
    }

    /// A broadcast's root is a rank of the group, not of the world: in the group of world
    /// ranks [1, 2], root 1 is world rank 2.
    #[test]
    fn a_broadcast_root_is_a_group_rank() {
        let out = on_ranks(3, |w| {
            let r = w.rank();
            if r == 0 {
                return vec![];
            }
            let g = w.group("pair", &[1, 2]).unwrap();
            g.broadcast(&[10.0 * r as f32], 1).unwrap()
        });
        assert_eq!((out[1].clone(), out[2].clone()), (vec![20.0], vec![20.0]));
    }

    /// failure() (the NCCL backend's oracle for a hung call) names the rank that died
    /// first, not the lowest-numbered dead one: rank 2 dies, then rank 1 (as a rank does
    /// once its own call failed on rank 2's death). (Before: 'rank 1 closed its
    /// connection' once both were dead.)
    #[test]
    fn failure_names_the_rank_that_died_first() {
        let worlds = mesh(3, Duration::from_secs(5));
        let until = |done: &dyn Fn() -> bool| {
            let t = Instant::now();
            while !done() && t.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        worlds[2].close();
        until(&|| worlds[0].failure().is_some());
        worlds[1].close();
        until(&|| worlds[0].shared.lock().dead[1].is_some());
        assert!(worlds[0].shared.lock().dead[1].is_some(), "rank 1's death not seen");
        assert_eq!(worlds[0].failure().as_deref(), Some("rank 2 closed its connection: its process exited or was killed"));
    }

    #[test]
    fn mismatched_calls_and_lengths_are_errors() {
        let out = on_ranks(2, |w| {
            let g = w.everyone().unwrap();
            let mut b = vec![0.0; 1 + g.rank()];
            let len = g.all_reduce(&mut b, ReduceOp::Sum).unwrap_err().to_string();
            let other = if g.rank() == 0 {
                g.all_gather(&[1.0]).map(|_| ()).unwrap_err().to_string()
            } else {
                g.broadcast(&[1.0], 1).map(|_| ()).err().map(|e| e.to_string()).unwrap_or_default()
            };
            (len, other)
        });
        assert!(out[0].0.contains("passed"), "{}", out[0].0);
        assert!(out[0].1.contains("made broadcast"), "{}", out[0].1);
    }

    /// A receive from this rank itself is refused at once, naming the call: no frame ever
    /// comes from oneself, so without the check it waited out the whole timeout (a minute
    /// by default) and then blamed this rank for not arriving.
    #[test]
    fn a_recv_from_oneself_is_refused_at_once() {
        let worlds = mesh(2, Duration::from_secs(30));
        let g = worlds[1].everyone().unwrap();
        let started = Instant::now();
        let e = g.recv(1).unwrap_err().to_string();
        assert!(e.contains("recv from rank 1 of a group of 2 on rank 1"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    }
}
