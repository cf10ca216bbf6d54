//! The rendezvous on rank 0 (tokio, TCP): every rank connects to rank 0's
//! `MASTER_ADDR:MASTER_PORT` and says who it is and what it runs ([`RunMeta`]: the
//! runner's version, the run's description, the plugins and their sha256); rank 0 checks
//! that the ranks are distinct, agree on the world size and run exactly the same thing,
//! and answers every rank with the address of every other rank's data port, or with the
//! reason it refuses (a plugin hash that differs names the plugin and both hashes, on
//! every rank). The ranks then connect pairwise into the [`TcpWorld`] mesh, each
//! connection opening with the run's token from rank 0's answer, so that a mesh listener
//! takes no connection of another run's (or a stray process's) for one of its ranks, and
//! answered with the listener's rank and the token, so that neither does a connecting rank
//! take another process at the address for the rank it wants.
//!
//! Ranks may start in any order: they retry the connection to rank 0 until the timeout;
//! rank 0 waits that long for the others and names the ranks that never came.
//!
//! The run is IPv4 unless rank 0's address resolves to IPv6 addresses only
//! (`MASTER_ADDR=::1`, a v6-only host): then rank 0 listens on IPv6, and every rank's
//! mesh listener takes the family of its own connection to rank 0.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::task::Poll;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::task::JoinSet;

use crate::launch::{Launch, MAX_WORLD};
use crate::tcp::TcpWorld;

/// What must be the same on every rank.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunMeta {
    /// The runner's version.
    pub version: String,
    /// The command and its settings, as text (e.g. "bench step tp=2 dp=2 seq=16").
    pub run: String,
    /// (plugin name, sha256) of every plugin the run loads, sorted.
    pub plugins: Vec<(String, String)>,
}

impl RunMeta {
    /// How `other` differs from `self`, in words; `None` when equal.
    pub fn difference(&self, other: &RunMeta) -> Option<String> {
        if self.version != other.version {
            return Some(format!("runner {} vs rank 0's {}", other.version, self.version));
        }
        if self.run != other.run {
            return Some(format!("run '{}' vs rank 0's '{}'", other.run, self.run));
        }
        for (name, hash) in &self.plugins {
            match other.plugins.iter().find(|(n, _)| n == name) {
                None => return Some(format!("plugin {name} missing (rank 0 has sha256 {hash})")),
                Some((_, h)) if h != hash => return Some(format!("plugin {name} has sha256 {h} vs rank 0's {hash}")),
                _ => {}
            }
        }
        if let Some((n, h)) = other.plugins.iter().find(|(n, _)| !self.plugins.iter().any(|(m, _)| m == n)) {
            return Some(format!("plugin {n} (sha256 {h}) that rank 0 does not have"));
        }
        // Every name found with rank 0's hash, yet the lists differ: a name twice on one
        // side (with another hash, or once more).
        let sorted = |p: &[(String, String)]| {
            let mut p = p.to_vec();
            p.sort();
            p
        };
        (sorted(&self.plugins) != sorted(&other.plugins)).then(|| format!("plugins {:?} vs rank 0's {:?}", other.plugins, self.plugins))
    }
}

#[derive(Serialize, Deserialize)]
struct Hello {
    rank: usize,
    world: usize,
    meta: RunMeta,
    /// The port of this rank's mesh listener.
    port: u16,
}

#[derive(Serialize, Deserialize)]
enum Answer {
    Welcome {
        /// Every rank's mesh address, by rank.
        addrs: Vec<String>,
        /// This run's [`Token`].
        token: Token,
    },
    Refuse(String),
    /// After a welcome, once every rank took its own: the ranks may build the mesh. Where
    /// a rank did not take its welcome, a `Refuse` naming it comes instead, so that the
    /// others fail then, with the cause, rather than wait out their timeout in the mesh for
    /// rank 0 (which fails) and that rank.
    Begin,
}

/// What every connection of a run's mesh says after its rank: drawn by rank 0 for the
/// run and sent in its welcome, so that a mesh listener takes only this run's ranks, not
/// a stray process or a rank of another run on the same hosts (whose welcome named a
/// port that is now this run's) saying a rank number. Not a secret against someone who
/// can read the rendezvous: a tag that keeps runs apart. A hello and its answer change
/// only with the runner's version, which rank 0 checks first (`RunMeta::version`), so
/// ranks of one run speak the same mesh greeting.
type Token = u128;

/// A fresh [`Token`] for a run of `addrs`: std's per-process random hash keys (the OS's
/// randomness, without a dependency for it), the process id, the clock and the addresses.
fn run_token(addrs: &[String]) -> Token {
    use std::hash::{BuildHasher, Hasher};
    let half = |salt: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(salt);
        h.write_u32(std::process::id());
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
        for a in addrs {
            h.write(a.as_bytes());
        }
        h.finish()
    };
    (u128::from(half(0)) << 64) | u128::from(half(1))
}

/// The greeting that opens a mesh connection: the connecting rank (u64) and the run's
/// [`Token`], little-endian.
const MESH_GREETING: usize = 8 + 16;

fn mesh_greeting(rank: usize, token: Token) -> [u8; MESH_GREETING] {
    let mut g = [0u8; MESH_GREETING];
    g[..8].copy_from_slice(&(rank as u64).to_le_bytes());
    g[8..].copy_from_slice(&token.to_le_bytes());
    g
}

/// Why the rendezvous failed.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("rendezvous: {0}")]
    Rendezvous(String),
    #[error("rank {rank}: {why}")]
    Refused { rank: usize, why: String },
}

fn rv(what: impl Into<String>) -> DistError {
    DistError::Rendezvous(what.into())
}

/// The longest hello line rank 0 reads: a run's description and its plugins' hashes
/// take a few kilobytes.
const MAX_HELLO: u64 = 1 << 20;

/// The longest answer line a rank reads from rank 0 for a world of `n`: every rank's
/// address (at most 50 bytes in JSON, an IPv6 one in brackets with its port), or a
/// refusal.
fn max_answer(n: usize) -> u64 {
    MAX_HELLO.saturating_add((n as u64).saturating_mul(64))
}

/// One line of at most `max` bytes from `r` into `line`: `Ok(false)` where the peer
/// closed before a newline or sent more than `max` bytes without one (not a runner).
async fn read_line_max(r: &mut (impl AsyncBufRead + Unpin), line: &mut String, max: u64) -> std::io::Result<bool> {
    r.take(max).read_line(line).await?;
    Ok(line.ends_with('\n'))
}

/// Meet the other ranks of `launch` and connect to every one; the collectives of the
/// returned world fail after `timeout`.
///
/// # Errors
/// Rank 0 unreachable, ranks missing, different worlds or runs (the message names the
/// rank and the difference), within `timeout`.
pub fn rendezvous(launch: &Launch, meta: &RunMeta, timeout: Duration) -> Result<TcpWorld, DistError> {
    meet(launch, meta, timeout, None)
}

/// [`rendezvous`] for rank 0 on `listener`, bound and held by the caller: ranks that run
/// as threads of one process (`bench collectives -g N`) meet on a port the OS picked
/// (bound to port 0). Held from then on, the port cannot be taken by another process (a
/// second such run) before rank 0 listens, as a port found free and let go could be.
/// `launch` is rank 0's, its port the listener's.
///
/// # Errors
/// As [`rendezvous`]; `launch` not rank 0's.
pub fn rendezvous_on(listener: TcpListener, launch: &Launch, meta: &RunMeta, timeout: Duration) -> Result<TcpWorld, DistError> {
    if launch.rank != 0 {
        return Err(rv(format!("rank {} was handed rank 0's rendezvous listener", launch.rank)));
    }
    meet(launch, meta, timeout, Some(listener))
}

/// [`rendezvous`], rank 0 on `held` where given.
fn meet(launch: &Launch, meta: &RunMeta, timeout: Duration, held: Option<TcpListener>) -> Result<TcpWorld, DistError> {
    if launch.rank >= launch.world {
        return Err(rv(format!("rank {} is not below the world size {}", launch.rank, launch.world)));
    }
    // As detect() refuses: rank 0 keeps a slot and an address per rank.
    if launch.world > MAX_WORLD {
        return Err(rv(format!("a world of {} ranks is more than this runner takes ({MAX_WORLD})", launch.world)));
    }
    let Some((host, port)) = launch.master.clone() else {
        if launch.world > 1 {
            return Err(rv(format!("{} ranks but no address for rank 0's rendezvous (MASTER_ADDR)", launch.world)));
        }
        return TcpWorld::new(0, vec![None], timeout).map_err(rv);
    };
    let deadline = Instant::now() + timeout;
    let hello = Hello {
        rank: launch.rank,
        world: launch.world,
        meta: meta.clone(),
        port: 0,
    };
    let (addrs, token, listener) = if launch.rank == 0 {
        // Rank 0 names the ranks that never came when its own wait ends.
        rank_0(launch.world, &host, port, hello, timeout, held)?
    } else {
        runtime()?.block_on(async {
            // The last connection error (an address that does not resolve, a refused
            // connection) goes into the message when the wait ends.
            let last = std::cell::RefCell::new(None);
            match tokio::time::timeout_at(deadline.into(), join(&host, port, hello, &last)).await {
                Ok(r) => r,
                Err(_) => Err(rv(format!(
                    "rank {} gave up after {timeout:.0?} (--timeout) waiting at {}{} (is rank 0 running, \
                     MASTER_ADDR right and the port open?)",
                    launch.rank,
                    host_port(&host, port),
                    last.borrow().as_ref().map_or_else(String::new, |e| format!(": {e}"))
                ))),
            }
        })?
    };
    connect_mesh(launch.rank, &addrs, token, &listener, deadline, timeout)
}

fn runtime() -> Result<tokio::runtime::Runtime, DistError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| rv(format!("tokio runtime: {e}")))
}

/// Rank 0: meet the other ranks ([`serve`]) on a thread of its own, which then stays, for
/// as long as the process runs, to refuse every later hello on the rendezvous port: a
/// process that comes after the world is complete (a rank started twice) is told so at
/// once, not left to wait out its timeout. Every rank's mesh address and this rank's mesh
/// listener come back.
fn rank_0(world: usize, host: &str, port: u16, hello: Hello, timeout: Duration, held: Option<TcpListener>) -> Result<(Vec<String>, Token, TcpListener), DistError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let host = host.to_string();
    let server = move || {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(e) => return drop(tx.send(Err(e))),
        };
        rt.block_on(async {
            match serve(world, &host, port, hello, timeout, held).await {
                Ok((addrs, token, l, mesh, reading)) => {
                    // The caller may be gone (a send that fails): the refusals go on.
                    let _ = tx.send(Ok((addrs, token, mesh)));
                    refuse_latecomers(&l, reading, world).await;
                }
                Err(e) => drop(tx.send(Err(e))),
            }
        });
    };
    std::thread::Builder::new()
        .name("rendezvous".into())
        .spawn(server)
        .map_err(|e| rv(format!("rank 0's rendezvous thread: {e}")))?;
    rx.recv().unwrap_or_else(|_| Err(rv("rank 0's rendezvous thread ended without an answer")))
}

/// How long rank 0 keeps trying to resolve its own address (`MASTER_ADDR`): a tenth of
/// the timeout (30 s of the default 300 s). A cluster's DNS may publish a name a moment
/// after its host starts (a Kubernetes pod's own record), so one failure is not final;
/// but a name that stays unresolved (a typo) fails here, naming it, rather than after the
/// whole wait for ranks that cannot resolve it either.
fn resolve_within(timeout: Duration) -> Duration {
    timeout / 10
}

/// Rank 0's own address `host` resolved, retried for `within`.
async fn resolve_rank_0(host: &str, port: u16, within: Duration) -> Result<Vec<SocketAddr>, DistError> {
    let until = tokio::time::Instant::now() + within;
    loop {
        let why = match tokio::net::lookup_host((host, port)).await {
            Ok(all) => {
                let all: Vec<SocketAddr> = all.collect();
                if !all.is_empty() {
                    return Ok(all);
                }
                "no addresses".to_string()
            }
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() >= until {
            return Err(rv(format!(
                "rank 0's address {host} does not resolve ({why}; tried for {within:.0?}): set MASTER_ADDR to rank 0's \
                 host as every rank reaches it (its IP address, or a name in DNS or /etc/hosts)"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// This rank's mesh listener, on every address of the family (IPv6 or IPv4).
fn mesh_listener(v6: bool) -> Result<TcpListener, DistError> {
    let any: IpAddr = if v6 { Ipv6Addr::UNSPECIFIED.into() } else { Ipv4Addr::UNSPECIFIED.into() };
    TcpListener::bind((any, 0)).map_err(|e| rv(format!("mesh listener: {e}")))
}

/// `host:port`, an IPv6 literal in brackets.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// A second rank 0, whose rendezvous port is taken on this host: say "rank 0" to whoever
/// holds it, so that a runner's rank 0 there fails its rendezvous at once, naming the
/// duplicate, rather than wait out its timeout for ranks that met this one's launcher.
/// Its answer (a refusal) comes back; `None` when the holder is not a runner or stays
/// silent for `within`.
async fn claim_rank_0_there(v6: bool, port: u16, hello: &Hello, within: Duration) -> Option<String> {
    let lo: IpAddr = if v6 { Ipv6Addr::LOCALHOST.into() } else { Ipv4Addr::LOCALHOST.into() };
    let ask = async {
        let mut s = BufReader::new(tokio::net::TcpStream::connect((lo, port)).await.ok()?);
        let text = serde_json::to_string(hello).ok()? + "\n";
        s.get_mut().write_all(text.as_bytes()).await.ok()?;
        let mut line = String::new();
        read_line_max(&mut s, &mut line, MAX_HELLO).await.ok()?;
        match serde_json::from_str::<Answer>(&line).ok()? {
            Answer::Refuse(why) => Some(why),
            Answer::Welcome { .. } | Answer::Begin => None,
        }
    };
    tokio::time::timeout(within, ask).await.ok().flatten()
}

/// How long rank 0 waits for a connection's hello line.
const HELLO_WITHIN: Duration = Duration::from_secs(10);

/// How many connections rank 0 reads hellos from at once (and a rank's mesh listener
/// reads greetings from, [`connect_mesh`]). A rank says hello as soon as it connects, so a
/// rank's hello takes milliseconds; the bound is for connections that stay silent or send
/// slowly (a port scanner, a stopped process, a flood): each holds a task and up to
/// [`MAX_HELLO`] bytes until its wait ends, 64 MiB in all at most. Beyond it rank 0
/// accepts no more until one ends: later connections wait in the kernel's accept queue.
const HELLOS_AT_ONCE: usize = 64;

/// A connection's hello line, read by a task of its own: the connection, its peer and the
/// line; `None` (the connection dropped) where it ended, stayed silent or sent more than
/// [`MAX_HELLO`] bytes without a newline.
type Greeting = Option<Said>;
/// A hello read: the connection, its peer and the line.
type Said = (tokio::net::TcpStream, SocketAddr, String);

/// Read `s`'s hello line by `by` (a task of [`serve`]'s or [`refuse_latecomers`]' set).
async fn read_hello(s: tokio::net::TcpStream, peer: SocketAddr, by: tokio::time::Instant) -> Greeting {
    let mut s = BufReader::new(s);
    let mut line = String::new();
    match tokio::time::timeout_at(by, read_line_max(&mut s, &mut line, MAX_HELLO)).await {
        Ok(Ok(true)) => Some((s.into_inner(), peer, line)),
        _ => None,
    }
}

/// What a listener waits for: a connection, or what a task read from one (`None`: the
/// connection was dropped).
enum Next<T> {
    Accepted(std::io::Result<(tokio::net::TcpStream, SocketAddr)>),
    Read(Option<T>),
}

/// The next greeting read by `reading` (a hello on rank 0's rendezvous port, a rank's
/// greeting on a mesh listener), or the next connection to `l` while fewer than
/// [`HELLOS_AT_ONCE`] are being read, whichever comes first.
async fn next<T: 'static>(l: &tokio::net::TcpListener, reading: &mut JoinSet<Option<T>>) -> Next<T> {
    std::future::poll_fn(|cx| {
        if let Poll::Ready(Some(r)) = reading.poll_join_next(cx) {
            return Poll::Ready(Next::Read(r.ok().flatten()));
        }
        if reading.len() < HELLOS_AT_ONCE
            && let Poll::Ready(r) = l.poll_accept(cx)
        {
            return Poll::Ready(Next::Accepted(r));
        }
        Poll::Pending
    })
    .await
}

/// Rank 0 after the rendezvous, for as long as the process runs: answer every later hello
/// on the rendezvous port with a refusal. Hellos are read as during the rendezvous (the
/// reads still going on then, `reading`, go on here), at most [`HELLOS_AT_ONCE`] at a time
/// on this one thread: a flood of connections holds a bounded number of tasks (an OS
/// thread each was spawned before), and a connection that stays silent holds only its own.
async fn refuse_latecomers(l: &tokio::net::TcpListener, mut reading: JoinSet<Greeting>, world: usize) {
    loop {
        match next(l, &mut reading).await {
            Next::Accepted(Ok((s, peer))) => {
                reading.spawn(read_hello(s, peer, tokio::time::Instant::now() + HELLO_WITHIN));
            }
            // Out of file descriptors, say: try again when some may have closed, rather
            // than spin.
            Next::Accepted(Err(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
            Next::Read(None) => {}
            Next::Read(Some((s, _, line))) => refuse_latecomer(s, &line, world).await,
        }
    }
}

/// Refuse one connection that came after the rendezvous, naming the rank its hello claims.
async fn refuse_latecomer(mut s: tokio::net::TcpStream, line: &str, world: usize) {
    let Ok(h) = serde_json::from_str::<Hello>(line) else { return };
    let why = format!(
        "rank {} came after all {world} ranks had met and the run had begun: two processes claim rank {} \
         (check the launcher's task count), or this one was started late",
        h.rank, h.rank
    );
    if let Ok(text) = serde_json::to_string(&Answer::Refuse(why)) {
        // A line into an empty send buffer; bounded all the same, so that a peer that
        // reads nothing cannot hold the refusals.
        let _ = tokio::time::timeout(Duration::from_secs(1), s.write_all((text + "\n").as_bytes())).await;
    }
}

/// Rank 0: accept `n` − 1 hellos within `timeout` (on `held` where given, else on `port`
/// of every address of the family), check them, answer everyone (a welcome, then, once
/// every rank took its own, [`Answer::Begin`] or why not); the rendezvous listener
/// comes back with the addresses, this rank's mesh listener and the hellos still being
/// read (for [`refuse_latecomers`]).
async fn serve(
    n: usize,
    host: &str,
    port: u16,
    mut mine: Hello,
    timeout: Duration,
    held: Option<TcpListener>,
) -> Result<(Vec<String>, Token, tokio::net::TcpListener, TcpListener, JoinSet<Greeting>), DistError> {
    let start_until = tokio::time::Instant::now() + timeout;
    let mut until = start_until;
    // The run is IPv6 where rank 0's address resolves to IPv6 addresses only.
    let v6 = match &held {
        Some(l) => l.local_addr().map_err(|e| rv(e.to_string()))?.is_ipv6(),
        None => resolve_rank_0(host, port, resolve_within(timeout)).await?.iter().all(SocketAddr::is_ipv6),
    };
    let mesh = mesh_listener(v6)?;
    mine.port = mesh.local_addr().map_err(|e| rv(e.to_string()))?.port();
    let any: IpAddr = if v6 { Ipv6Addr::UNSPECIFIED.into() } else { Ipv4Addr::UNSPECIFIED.into() };
    let left = until.saturating_duration_since(tokio::time::Instant::now());
    let bound = match held {
        Some(l) => l.set_nonblocking(true).and_then(|()| tokio::net::TcpListener::from_std(l)),
        None => tokio::net::TcpListener::bind((any, port)).await,
    };
    let l = match bound {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            // The first rank 0 answers once its last ranks had a moment to hear why.
            return Err(match claim_rank_0_there(v6, port, &mine, left.min(Duration::from_secs(6))).await {
                Some(why) => DistError::Refused {
                    rank: 0,
                    why: format!("{why} (this process found port {port} held by the other rank 0)"),
                },
                None => rv(format!("rank 0 cannot listen on port {port}: {e} (set MASTER_PORT to a free port; or two processes claim rank 0)")),
            });
        }
        Err(e) => return Err(rv(format!("rank 0 cannot listen on port {port}: {e} (set MASTER_PORT to a free port)"))),
    };
    let mut seen: Vec<Option<tokio::net::TcpStream>> = (0..n).map(|_| None).collect();
    let mut addrs = vec![String::new(); n];
    addrs[0] = host_port(host, mine.port);
    let mut refuse: Option<String> = None;
    let mut second_zero = Vec::new();
    // Each connection's hello is read by a task of its own, so that one that stays silent
    // delays no other.
    let mut reading = JoinSet::new();
    while seen.iter().skip(1).any(Option::is_none) {
        let (s, peer, line) = match tokio::time::timeout_at(until, next(&l, &mut reading)).await {
            Ok(Next::Accepted(Ok((s, peer)))) => {
                // A rank says hello as soon as it connects; anything else that connects
                // and stays silent (a port scanner, a stopped process) is dropped after a
                // few seconds.
                reading.spawn(read_hello(s, peer, tokio::time::Instant::now() + HELLO_WITHIN.min(left / 4)));
                continue;
            }
            Ok(Next::Accepted(Err(e))) => return Err(rv(format!("rank 0 accept: {e}"))),
            Ok(Next::Read(None)) => continue,
            Ok(Next::Read(Some(greeting))) => greeting,
            Err(_) if refuse.is_some() => break,
            Err(_) => {
                let missing: Vec<usize> = (1..n).filter(|&r| seen[r].is_none()).collect();
                return Err(rv(format!(
                    "rank 0 waited {timeout:.0?} (--timeout) for rank(s) {missing:?}, which never connected to port {port}: \
                     were they started, with MASTER_ADDR={host} and MASTER_PORT={port}?"
                )));
            }
        };
        let Ok(h) = serde_json::from_str::<Hello>(&line) else {
            continue; // not a runner: ignore it
        };
        let why = if h.rank == 0 {
            Some(format!(
                "two processes claim rank 0 of {n}: a second one found rank 0's port {port} taken on this host \
                 (give each process its own rank: check the launcher's task count and RANK)"
            ))
        } else if h.world != n {
            Some(format!("rank {} was launched with a world of {}, rank 0 with {n}", h.rank, h.world))
        } else if h.rank >= n {
            Some(format!("rank {} is not below the world size {n} (check the launcher's rank variables)", h.rank))
        } else if seen[h.rank].is_some() {
            Some(format!("two processes claim rank {} of {n}", h.rank))
        } else {
            mine.meta.difference(&h.meta).map(|d| format!("rank {} runs something else than rank 0: {d}", h.rank))
        };
        let slot = (1..n).find(|&r| r == h.rank && seen[r].is_none()).or_else(|| (1..n).find(|&r| seen[r].is_none()));
        if h.rank == 0 {
            // A second rank 0 takes no rank's place: the real ranks that come in the
            // next seconds still hear why.
            second_zero.push(s);
        } else if let Some(r) = slot {
            // A dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d.
            addrs[r] = SocketAddr::new(peer.ip().to_canonical(), h.port).to_string();
            seen[r] = Some(s);
        }
        if let Some(w) = why
            && refuse.is_none()
        {
            refuse = Some(w);
            // Tell the ranks that come soon why; do not wait the whole timeout.
            until = until.min(tokio::time::Instant::now() + Duration::from_secs(3));
        }
    }
    let token = run_token(&addrs);
    let answer = match &refuse {
        Some(why) => Answer::Refuse(why.clone()),
        None => Answer::Welcome { addrs: addrs.clone(), token },
    };
    let text = serde_json::to_string(&answer).map_err(|e| rv(e.to_string()))? + "\n";
    // The ranks have until the rendezvous' end to take the answer, and a few seconds
    // at least where the last of them came near it.
    let answering = tokio::time::Instant::now();
    let by = start_until.max(answering + HELLO_WITHIN.min(timeout / 4));
    let to = seen.into_iter().enumerate().filter_map(|(r, s)| Some((r, s?)));
    let (taken, untaken) = answer_all(to.chain(second_zero.into_iter().map(|s| (0, s))), text.clone(), by).await;
    let untaken: Vec<usize> = untaken.into_iter().map(|(r, _)| r).collect();
    if let Some(why) = refuse {
        return Err(DistError::Refused { rank: 0, why });
    }
    let why = |untaken: &[usize]| {
        format!(
            "rank(s) {untaken:?} did not take rank 0's answer (the {n} ranks' addresses, {} bytes) within {:.0?} \
             (--timeout): their processes exited, or stopped reading (suspended, hung)",
            text.len(),
            answering.elapsed()
        )
    };
    // Then the word to go on, or why not. A line into buffers that the welcome left, as a
    // rule, empty; bounded all the same.
    let then = if untaken.is_empty() { Answer::Begin } else { Answer::Refuse(why(&untaken)) };
    let then = serde_json::to_string(&then).map_err(|e| rv(e.to_string()))? + "\n";
    let (_, late) = answer_all(taken.into_iter(), then, by.max(tokio::time::Instant::now() + Duration::from_secs(1))).await;
    // A rank that took its welcome but not this line: its connection broke after the
    // welcome (its process exited, or reset it). The others may have their Begin already;
    // rank 0 fails naming the rank, and they find its mesh listener gone at once.
    let mut whys = Vec::new();
    if !untaken.is_empty() {
        whys.push(why(&untaken));
    }
    if let Some((_, e)) = late.first() {
        let late: Vec<usize> = late.iter().map(|(r, _)| *r).collect();
        whys.push(format!(
            "rank(s) {late:?} took rank 0's answer but not the word to begin that followed it ({e}): their processes \
             exited, or their connections broke, after the answer (see their errors)"
        ));
    }
    if whys.is_empty() { Ok((addrs, token, l, mesh, reading)) } else { Err(rv(whys.join("; "))) }
}

/// Write `text` to every `(rank, connection)` of `to` at once, by `by`: the ranks that
/// took it all then, with their connections, and those that had not (with why: the
/// write's error, or the deadline), sorted by rank. One after
/// another, a rank that never reads (its process stopped, with the answer more than the
/// sockets' buffers hold: a world of thousands of addresses) held rank 0, and so every
/// rank after it, for good.
async fn answer_all(
    to: impl Iterator<Item = (usize, tokio::net::TcpStream)>,
    text: String,
    by: tokio::time::Instant,
) -> (Vec<(usize, tokio::net::TcpStream)>, Vec<(usize, String)>) {
    let text: std::sync::Arc<str> = text.into();
    let mut writing = JoinSet::new();
    for (r, mut s) in to {
        let text = text.clone();
        writing.spawn(async move {
            let taken = match tokio::time::timeout_at(by, s.write_all(text.as_bytes())).await {
                Ok(Ok(())) => Ok(s),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("not taken by the deadline".to_string()),
            };
            // A write cut by the deadline leaves the rank half an answer: closed here
            // (`s` dropped), it reads a line cut short rather than wait on.
            (r, taken)
        });
    }
    let (mut taken, mut untaken) = (Vec::new(), Vec::new());
    while let Some(done) = writing.join_next().await {
        match done {
            Ok((r, Ok(s))) => taken.push((r, s)),
            Ok((r, Err(e))) => untaken.push((r, e)),
            Err(_) => {}
        }
    }
    untaken.sort_unstable();
    (taken, untaken)
}

/// Any other rank: connect to rank 0 (retrying until it listens), open the mesh listener
/// on the family of that connection, say hello, read the answer.
async fn join(host: &str, port: u16, mut hello: Hello, last: &std::cell::RefCell<Option<String>>) -> Result<(Vec<String>, Token, TcpListener), DistError> {
    let s = loop {
        match tokio::net::TcpStream::connect((host, port)).await {
            Ok(s) => break s,
            Err(e) => {
                *last.borrow_mut() = Some(e.to_string());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    *last.borrow_mut() = Some("connected, but rank 0 did not answer".into());
    let mesh = mesh_listener(s.local_addr().map_err(|e| rv(e.to_string()))?.is_ipv6())?;
    hello.port = mesh.local_addr().map_err(|e| rv(e.to_string()))?.port();
    let mut s = BufReader::new(s);
    let text = serde_json::to_string(&hello).map_err(|e| rv(e.to_string()))? + "\n";
    s.get_mut().write_all(text.as_bytes()).await.map_err(|e| rv(format!("rank {}: hello to rank 0: {e}", hello.rank)))?;
    let mut line = String::new();
    let whole = read_line_max(&mut s, &mut line, max_answer(hello.world)).await.map_err(|e| rv(format!("rank {}: answer from rank 0: {e}", hello.rank)))?;
    if line.is_empty() {
        return Err(rv(format!("rank {}: rank 0 closed the rendezvous without an answer (it failed: see its error)", hello.rank)));
    }
    let not_runner = || {
        rv(format!(
            "rank {}: port {port} of {host} answered with something that is not a runner's rendezvous{}: is another program \
             listening there? Set MASTER_PORT to a free port",
            hello.rank,
            if whole { "" } else { " (a line too long, or cut short)" }
        ))
    };
    match serde_json::from_str::<Answer>(&line).map_err(|_| not_runner())? {
        Answer::Welcome { addrs, token } if addrs.len() == hello.world => {
            *last.borrow_mut() = Some("rank 0 answered, but did not say that every rank took its answer".into());
            let mut line = String::new();
            // A refusal may list most of the world's ranks: the welcome's limit.
            let whole = read_line_max(&mut s, &mut line, max_answer(hello.world)).await.map_err(|e| {
                rv(format!("rank {}: the line after rank 0's answer: {e} (rank 0 failed, or this rank's connection broke)", hello.rank))
            })?;
            match serde_json::from_str::<Answer>(&line) {
                Ok(Answer::Begin) => Ok((addrs, token, mesh)),
                Ok(Answer::Refuse(why)) => Err(DistError::Refused { rank: hello.rank, why }),
                _ if line.is_empty() => Err(rv(format!(
                    "rank {}: rank 0 closed the rendezvous after its answer, before every rank took theirs (it failed: see its error)",
                    hello.rank
                ))),
                _ => Err(rv(format!(
                    "rank {}: rank 0's answer was followed by something that is not a runner's{}",
                    hello.rank,
                    if whole { "" } else { " (a line too long, or cut short)" }
                ))),
            }
        }
        Answer::Welcome { addrs, .. } => Err(rv(format!(
            "rank {}: rank 0 answered with {} addresses for a world of {}",
            hello.rank,
            addrs.len(),
            hello.world
        ))),
        Answer::Refuse(why) => Err(DistError::Refused { rank: hello.rank, why }),
        Answer::Begin => Err(not_runner()),
    }
}

/// Connect to every lower rank and accept every higher one: a connection is taken as
/// the rank its greeting names only with this run's `token`; one without it (a stray
/// process, a rank of another run) is closed, and the wait goes on. The greetings are
/// read at once, at most [`HELLOS_AT_ONCE`] at a time (as rank 0 reads hellos), so that
/// connections that stay silent cost one greeting wait together, not one each (before,
/// read one after another, each held the mesh up to 5 s). A rank taken is answered with
/// the listener's own greeting (its rank and the token), which each connecting rank
/// checks once its own listener is done: it too knows that it reached its own run's rank,
/// not whatever now listens at that address.
fn connect_mesh(rank: usize, addrs: &[String], token: Token, listener: &TcpListener, deadline: Instant, timeout: Duration) -> Result<TcpWorld, DistError> {
    let n = addrs.len();
    let mut streams: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    for (j, addr) in addrs.iter().enumerate().take(rank) {
        // The listeners are IPv4 unless rank 0's address is IPv6 only: of a name's
        // addresses, an IPv4 one (glibc lists ::1 first for `localhost`, and a dual-stack
        // name its IPv6 address first).
        let all: Vec<SocketAddr> = addr.to_socket_addrs().map_err(|e| rv(format!("rank {j}'s address {addr}: {e}")))?.collect();
        let target = *all
            .iter()
            .find(|a| a.is_ipv4())
            .or_else(|| all.first())
            .ok_or_else(|| rv(format!("rank {j}'s address {addr} does not resolve")))?;
        let mut s = loop {
            match TcpStream::connect_timeout(&target, Duration::from_secs(1)) {
                Ok(s) => break s,
                // Every rank opened its mesh listener before its hello, and rank 0 said
                // Begin after the last hello: a refusal now is not a rank still starting
                // (a full accept queue drops, it does not refuse), so it is not retried.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    return Err(rv(format!(
                        "rank {rank}: rank {j}'s mesh listener at {addr} refused the connection ({e}): rank {j} exited after the \
                         rendezvous (see its error), or a firewall rejects the port"
                    )));
                }
                Err(e) if Instant::now() >= deadline => return Err(rv(format!("rank {rank} cannot reach rank {j} at {addr}: {e}"))),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        std::io::Write::write_all(&mut s, &mesh_greeting(rank, token)).map_err(|e| rv(format!("to rank {j}: {e}")))?;
        streams[j] = Some(s);
    }
    if rank + 1 < n {
        runtime()?.block_on(accept_mesh(rank, token, listener, deadline, timeout, &mut streams))?;
    }
    // The lower ranks answer once they accept: each is at its listener by now, or failed.
    for (j, s) in streams.iter_mut().enumerate().take(rank) {
        let Some(s) = s else { continue };
        let addr = &addrs[j];
        let mut ack = [0u8; MESH_GREETING];
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        s.set_read_timeout(Some(left)).map_err(|e| rv(e.to_string()))?;
        match std::io::Read::read_exact(s, &mut ack) {
            Ok(()) if ack == mesh_greeting(j, token) => {}
            Ok(()) => {
                return Err(rv(format!(
                    "rank {rank}: {addr}, rank {j}'s mesh address, answered without this run's token: another process listens \
                     there (a rank of another run, or a program that took the port)"
                )));
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(rv(format!(
                    "rank {rank}: {addr}, rank {j}'s mesh address, did not answer with this run's token within {timeout:.0?} \
                     (--timeout): rank {j} stopped (suspended, hung), or another process listens there"
                )));
            }
            Err(e) => {
                return Err(rv(format!(
                    "rank {rank}: {addr}, rank {j}'s mesh address, closed the connection without this run's token ({e}): \
                     rank {j} failed (see its error), or another process listens there (a rank of another run)"
                )));
            }
        }
        s.set_read_timeout(None).map_err(|e| rv(e.to_string()))?;
    }
    TcpWorld::new(rank, streams, timeout).map_err(rv)
}

/// [`connect_mesh`]'s listening half: take every higher rank's connection on `listener`
/// by `deadline`, into `streams`, and answer each with this rank's greeting.
async fn accept_mesh(
    rank: usize,
    token: Token,
    listener: &TcpListener,
    deadline: Instant,
    timeout: Duration,
    streams: &mut [Option<TcpStream>],
) -> Result<(), DistError> {
    let n = streams.len();
    let l = listener
        .try_clone()
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .and_then(tokio::net::TcpListener::from_std)
        .map_err(|e| rv(format!("mesh listener: {e}")))?;
    let until = tokio::time::Instant::from_std(deadline);
    let mut reading = JoinSet::new();
    while streams.iter().skip(rank + 1).any(Option::is_none) {
        let (from, mut s) = match tokio::time::timeout_at(until, next(&l, &mut reading)).await {
            Ok(Next::Accepted(Ok((s, _)))) => {
                // A rank greets as soon as it connects: a connection silent for a few
                // seconds (a quarter of the timeout where that is less) gives up its slot.
                let by = tokio::time::Instant::now() + Duration::from_secs(5).min(timeout / 4);
                reading.spawn(read_mesh_greeting(s, token, until.min(by)));
                continue;
            }
            Ok(Next::Accepted(Err(e))) => return Err(rv(format!("mesh accept: {e}"))),
            Ok(Next::Read(None)) => continue,
            Ok(Next::Read(Some(greeted))) => greeted,
            Err(_) => {
                let missing: Vec<usize> = (rank + 1..n).filter(|&r| streams[r].is_none()).collect();
                return Err(rv(format!("rank {rank}: rank(s) {missing:?} never connected to the mesh within {timeout:.0?} (--timeout)")));
            }
        };
        if from <= rank || from >= n || streams[from].is_some() {
            continue;
        }
        // 24 bytes into a fresh connection's empty buffer: bounded all the same.
        if !matches!(tokio::time::timeout_at(until, s.write_all(&mesh_greeting(rank, token))).await, Ok(Ok(()))) {
            continue;
        }
        let s = s.into_std().and_then(|s| s.set_nonblocking(false).map(|()| s)).map_err(|e| rv(e.to_string()))?;
        streams[from] = Some(s);
    }
    Ok(())
}

/// A mesh connection's greeting, read by `by`: the rank it names and the connection, or
/// `None` (dropped) where it ended, stayed silent or had another run's token.
async fn read_mesh_greeting(mut s: tokio::net::TcpStream, token: Token, by: tokio::time::Instant) -> Option<(usize, tokio::net::TcpStream)> {
    let mut g = [0u8; MESH_GREETING];
    if !matches!(tokio::time::timeout_at(by, s.read_exact(&mut g)).await, Ok(Ok(_))) || g[8..] != token.to_le_bytes() {
        return None;
    }
    let from = usize::try_from(u64::from_le_bytes(g[..8].try_into().ok()?)).ok()?;
    Some((from, s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_exec::{HostCollective, ReduceOp};

    /// Rank 0's rendezvous listener, held from here on (for [`rendezvous_on`]), and its
    /// port. A port found free and let go (bound to port 0, then dropped) is one the OS
    /// may hand out again before rank 0 binds it: to another test's bind to port 0 or
    /// the local end of its connection, a rare failure of tests run in parallel.
    fn held_port() -> (TcpListener, u16) {
        let l = TcpListener::bind("0.0.0.0:0").unwrap();
        let port = l.local_addr().unwrap().port();
        (l, port)
    }

    /// Rank 0 of `world` on `held`.
    fn rank_0_on(held: TcpListener, world: usize, port: u16, meta: &RunMeta, timeout: Duration) -> Result<TcpWorld, DistError> {
        rendezvous_on(held, &launch(0, world, port), meta, timeout)
    }

    use crate::testing::free_port;

    /// [`free_port`]'s ports are outside the OS's ephemeral range (where the OS would
    /// hand them to another test's connection) and differ from call to call. (Before:
    /// a port bound to 0 and let go, always in that range.)
    #[test]
    fn test_ports_are_not_the_oss_to_hand_out() {
        let Some((lo, hi)) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_once(char::is_whitespace).map(|(a, b)| (a.trim().parse::<u16>().ok(), b.trim().parse::<u16>().ok())))
            .and_then(|(a, b)| a.zip(b))
        else {
            eprintln!("no ephemeral port range here: skipped");
            return;
        };
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        assert!(ports.iter().all(|p| !(lo..=hi).contains(p)), "{ports:?} in {lo}-{hi}");
        assert!(ports.iter().enumerate().all(|(i, p)| !ports[..i].contains(p)), "{ports:?}");
    }

    fn launch(rank: usize, world: usize, port: u16) -> Launch {
        Launch {
            rank,
            world,
            local_rank: rank,
            local_world: None,
            master: Some(("127.0.0.1".into(), port)),
            source: "test",
        }
    }

    fn meta(hash: &str) -> RunMeta {
        RunMeta {
            version: "0.1.0".into(),
            run: "test".into(),
            plugins: vec![("llama3.wasm".into(), hash.into())],
        }
    }

    /// Start a thread per launch (in the order given; rank 0 on `held` where given),
    /// meet, and all-reduce each rank's number: what each rank got.
    fn meet_and_sum_ranks(held: Option<TcpListener>, launches: Vec<Launch>) -> Vec<f32> {
        let mut held = held;
        let hs: Vec<_> = launches
            .into_iter()
            .map(|l| {
                let held = if l.rank == 0 { held.take() } else { None };
                std::thread::spawn(move || {
                    let w = match held {
                        Some(h) => rendezvous_on(h, &l, &meta("abc"), Duration::from_secs(20)),
                        None => rendezvous(&l, &meta("abc"), Duration::from_secs(20)),
                    }
                    .unwrap();
                    let mut x = vec![l.rank as f32];
                    let g = w.everyone().unwrap();
                    g.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                    // Every connection is to another rank and stays up (none to itself,
                    // which would end with its listener).
                    g.barrier().unwrap();
                    std::thread::sleep(Duration::from_millis(100));
                    assert_eq!(w.failure(), None, "rank {}", l.rank);
                    x[0]
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    /// Four ranks started in reverse order meet and all-reduce over the mesh.
    #[test]
    fn ranks_meet_in_any_order_and_talk() {
        // Rank 0 binds its own port, last: the others retry until it listens.
        let port = free_port();
        let sums = meet_and_sum_ranks(None, (0..4).rev().map(|r| launch(r, 4, port)).collect());
        assert_eq!(sums, [6.0; 4]);
    }

    /// A rank whose plugin differs is refused on every rank, naming the plugin and both
    /// hashes.
    #[test]
    fn a_different_plugin_hash_is_refused_everywhere() {
        let (held, port) = held_port();
        let mut held = Some(held);
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let held = held.take_if(|_| r == 0);
                std::thread::spawn(move || {
                    let m = meta(if r == 2 { "def" } else { "abc" });
                    match held {
                        Some(h) => rank_0_on(h, 3, port, &m, Duration::from_secs(20)),
                        None => rendezvous(&launch(r, 3, port), &m, Duration::from_secs(20)),
                    }
                    .err()
                    .map(|e| e.to_string())
                })
            })
            .collect();
        let errs: Vec<Option<String>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        // Rank 0 refuses at the first bad hello; the others get the reason (a rank not
        // yet connected when rank 0 stops waiting learns it failed).
        let e0 = errs[0].as_ref().expect("rank 0 refuses");
        assert!(e0.contains("rank 2 runs something else") && e0.contains("llama3.wasm") && e0.contains("def") && e0.contains("abc"), "{e0}");
        assert!(errs.iter().all(Option::is_some), "{errs:?}");
    }

    /// A connection that never says hello (a port scanner, a stopped process) does not
    /// hold the rendezvous: rank 0 drops it and the ranks meet within the timeout.
    #[test]
    fn a_silent_connection_does_not_hold_the_rendezvous() {
        let (held, port) = held_port();
        let zero = std::thread::spawn(move || rank_0_on(held, 2, port, &meta("a"), Duration::from_secs(4)).map(|_| ()));
        let silent = loop {
            match std::net::TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => break s,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        std::thread::sleep(Duration::from_millis(100));
        let one = rendezvous(&launch(1, 2, port), &meta("a"), Duration::from_secs(4)).map(|_| ());
        assert!(one.is_ok(), "{one:?}");
        assert!(zero.join().unwrap().is_ok());
        drop(silent);
    }

    /// Rank 0 named rather than numbered (MASTER_ADDR=localhost, a node's name): the mesh
    /// connects to the name's IPv4 address, where the listeners are, also where the name
    /// resolves to ::1 or an IPv6 address first (glibc's order for `localhost` on most
    /// distributions, a dual-stack cluster's names). RUNNER_TEST_DUAL_STACK_NAME names a
    /// host with both addresses to check that here.
    #[test]
    fn a_named_rank_0_is_reached_over_ipv4() {
        let name = std::env::var("RUNNER_TEST_DUAL_STACK_NAME").unwrap_or_else(|_| "localhost".into());
        let port = free_port();
        let sums = meet_and_sum_ranks(None, (0..2).map(|r| Launch { master: Some((name.clone(), port)), ..launch(r, 2, port) }).collect());
        assert_eq!(sums, [1.0; 2]);
    }

    /// A rank started twice: the copy that comes after the world met is refused at once,
    /// naming the rank, while the run goes on.
    #[test]
    fn a_rank_that_comes_after_the_world_met_is_refused_at_once() {
        let (held, port) = held_port();
        assert_eq!(meet_and_sum_ranks(Some(held), (0..2).map(|r| launch(r, 2, port)).collect()), [1.0; 2]);
        let start = Instant::now();
        let Err(e) = rendezvous(&launch(1, 2, port), &meta("abc"), Duration::from_secs(20)) else { panic!("a late rank 1 was let in") };
        assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
        assert!(e.to_string().contains("rank 1 came after all 2 ranks had met") && e.to_string().contains("two processes claim rank 1"), "{e}");
        // So is a second rank 0, which finds the port taken and asks.
        let Err(e) = rendezvous(&launch(0, 2, port), &meta("abc"), Duration::from_secs(20)) else { panic!("a late rank 0 was let in") };
        assert!(e.to_string().contains("rank 0 came after all 2 ranks had met") && e.to_string().contains("two processes claim rank 0"), "{e}");
    }

    /// Two processes started as rank 0 on one host: the second finds the port taken and
    /// says so to the first, so both fail at once naming the duplicate rank 0, rather than
    /// the first waiting out its timeout for a rank 1 that never comes.
    #[test]
    fn a_second_rank_0_fails_both_at_once() {
        let (held, port) = held_port();
        let start = Instant::now();
        let first = std::thread::spawn(move || rank_0_on(held, 3, port, &meta("a"), Duration::from_secs(20)).map(|_| ()));
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            std::thread::sleep(Duration::from_millis(20));
        }
        // A real rank that comes meanwhile hears why too.
        let one = std::thread::spawn(move || rendezvous(&launch(1, 3, port), &meta("a"), Duration::from_secs(20)).map(|_| ()));
        let Err(e) = rendezvous(&launch(0, 3, port), &meta("a"), Duration::from_secs(20)) else { panic!("a second rank 0 met") };
        assert!(e.to_string().contains("two processes claim rank 0 of 3") && e.to_string().contains(&format!("port {port}")), "{e}");
        for (r, h) in [(0, first), (1, one)] {
            let Err(e) = h.join().unwrap() else { panic!("rank {r} met") };
            assert!(e.to_string().contains("two processes claim rank 0 of 3"), "rank {r}: {e}");
        }
        assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    }

    /// Connections that connect and stay silent are read beside the ranks' hellos, not
    /// ahead of them: with three open before rank 1 comes, the ranks meet at once. (Read
    /// one at a time, each held rank 0 for a quarter of the timeout: 3 × 5 s here.)
    #[test]
    fn silent_connections_do_not_delay_the_ranks() {
        let (held, port) = held_port();
        let zero = std::thread::spawn(move || rank_0_on(held, 2, port, &meta("a"), Duration::from_secs(20)).map(|_| ()));
        let silent: Vec<TcpStream> = (0..3).map(|_| connect_until_up(port)).collect();
        std::thread::sleep(Duration::from_millis(50));
        let start = Instant::now();
        let one = rendezvous(&launch(1, 2, port), &meta("a"), Duration::from_secs(20)).map(|_| ());
        let took = start.elapsed();
        assert!(one.is_ok() && zero.join().unwrap().is_ok(), "{one:?}");
        assert!(took < Duration::from_secs(3), "the ranks met after {took:?}");
        drop(silent);
    }

    /// More silent connections than rank 0 reads at once, held open: each is dropped
    /// when its hello wait ends (a quarter of the timeout, 1 s here), and rank 1, queued
    /// behind them, meets then. (Read one at a time, they held rank 0 for 65 × 1 s, past
    /// its timeout.)
    #[test]
    fn a_flood_of_silent_connections_delays_the_ranks_by_one_hello_wait() {
        let (held, port) = held_port();
        let zero = std::thread::spawn(move || rank_0_on(held, 2, port, &meta("a"), Duration::from_secs(4)).map(|_| ()));
        let silent: Vec<TcpStream> = (0..HELLOS_AT_ONCE + 1).map(|_| connect_until_up(port)).collect();
        let start = Instant::now();
        let one = rendezvous(&launch(1, 2, port), &meta("a"), Duration::from_secs(4)).map(|_| ());
        let took = start.elapsed();
        assert!(one.is_ok() && zero.join().unwrap().is_ok(), "{one:?}");
        assert!(took < Duration::from_millis(2500), "the ranks met after {took:?}");
        drop(silent);
    }

    async fn within(ms: u64, l: &tokio::net::TcpListener, reading: &mut JoinSet<Greeting>) -> Result<Next<Said>, tokio::time::error::Elapsed> {
        tokio::time::timeout(Duration::from_millis(ms), next(l, reading)).await
    }

    /// With [`HELLOS_AT_ONCE`] hellos being read, rank 0 accepts no other connection
    /// until one of them ends; then it takes the one that waited.
    #[test]
    fn rank_0_reads_at_most_hellos_at_once() {
        runtime().unwrap().block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let at = l.local_addr().unwrap();
            let mut reading = JoinSet::new();
            let mut peers = Vec::new();
            for _ in 0..HELLOS_AT_ONCE {
                peers.push(tokio::net::TcpStream::connect(at).await.unwrap());
                let Ok(Next::Accepted(Ok((s, peer)))) = within(1000, &l, &mut reading).await else { panic!("not accepted") };
                reading.spawn(read_hello(s, peer, tokio::time::Instant::now() + Duration::from_secs(60)));
            }
            peers.push(tokio::net::TcpStream::connect(at).await.unwrap());
            assert!(within(200, &l, &mut reading).await.is_err(), "a connection beyond the bound was accepted");
            drop(peers.swap_remove(0));
            assert!(matches!(within(1000, &l, &mut reading).await, Ok(Next::Read(None))), "a hung-up connection was not dropped");
            assert!(matches!(within(1000, &l, &mut reading).await, Ok(Next::Accepted(Ok(_)))), "the waiting connection was not taken");
        });
    }

    /// A connection opened before the world met, whose hello (a rank started twice)
    /// comes after: still read once the ranks met, and refused as a latecomer.
    #[test]
    fn a_hello_begun_before_the_world_met_is_refused_after() {
        let (held, port) = held_port();
        let zero = std::thread::spawn(move || rank_0_on(held, 2, port, &meta("a"), Duration::from_secs(20)).map(|_| ()));
        let mut twice = connect_until_up(port);
        std::thread::sleep(Duration::from_millis(50));
        let one = rendezvous(&launch(1, 2, port), &meta("a"), Duration::from_secs(20)).map(|_| ());
        assert!(one.is_ok() && zero.join().unwrap().is_ok(), "{one:?}");
        std::io::Write::write_all(&mut twice, hello_json(1, 2).as_bytes()).unwrap();
        twice.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut answer = String::new();
        let _ = std::io::Read::read_to_string(&mut twice, &mut answer);
        assert!(answer.contains("rank 1 came after all 2 ranks had met"), "{answer:?}");
    }

    /// Rank 0's own address not resolving (a typo in MASTER_ADDR) fails after a tenth of
    /// the timeout, naming the address and the fix, not after the whole wait for ranks
    /// that cannot reach it either.
    #[test]
    fn an_unresolvable_rank_0_address_fails_early() {
        let l = Launch { master: Some(("no-such-host.invalid".into(), free_port())), ..launch(0, 2, 1) };
        let start = Instant::now();
        let e = rendezvous(&l, &meta("a"), Duration::from_secs(3)).unwrap_err().to_string();
        assert!(start.elapsed() < Duration::from_millis(1500), "failed after {:?}", start.elapsed());
        assert!(e.contains("no-such-host.invalid does not resolve") && e.contains("set MASTER_ADDR"), "{e}");
    }

    /// Rank 0 on a listener its caller bound and holds (ranks as threads of one
    /// process): the ranks meet on it; another rank handed it is refused.
    #[test]
    fn rank_0_meets_on_a_held_listener() {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let e = rendezvous_on(held.try_clone().unwrap(), &launch(1, 2, port), &meta("a"), Duration::from_secs(4)).unwrap_err();
        assert!(e.to_string().contains("rank 1 was handed rank 0's rendezvous listener"), "{e}");
        let one = std::thread::spawn(move || rendezvous(&launch(1, 2, port), &meta("a"), Duration::from_secs(4)).map(|w| w.size()));
        let zero = rendezvous_on(held, &launch(0, 2, port), &meta("a"), Duration::from_secs(4)).unwrap();
        assert_eq!((zero.size(), one.join().unwrap().unwrap()), (2, 2));
    }

    /// After the world met, a flood of connections to rank 0's port is read by a bounded
    /// number of tasks, not an OS thread each; once it ends, a late rank is refused at
    /// once. (Before: 150 connections, 150 more threads.)
    #[test]
    fn a_flood_of_latecomers_spawns_no_thread_each() {
        // Threads are counted in a process of its own: the tests that run beside this one
        // start threads of their own.
        if std::env::var_os("RUNNER_DIST_TEST_ALONE").is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "rendezvous::tests::a_flood_of_latecomers_spawns_no_thread_each", "--nocapture"])
                .env("RUNNER_DIST_TEST_ALONE", "1")
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && said.contains("1 passed"), "{said}");
            return;
        }
        let (held, port) = held_port();
        assert_eq!(meet_and_sum_ranks(Some(held), (0..2).map(|r| launch(r, 2, port)).collect()), [1.0; 2]);
        // This process's threads (Linux; elsewhere 0 and the check passes).
        let threads = || std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count);
        let before = threads();
        // 150: the connections rank 0 reads (64) and those its accept queue holds (128)
        // connect at once; more would wait for a slot (the kernel drops their SYNs).
        let flood: Vec<TcpStream> = (0..150).map(|_| connect_until_up(port)).collect();
        std::thread::sleep(Duration::from_millis(300));
        let grew = threads().saturating_sub(before);
        assert!(grew < 20, "{grew} more threads for 150 connections");
        drop(flood);
        let start = Instant::now();
        let Err(e) = rendezvous(&launch(1, 2, port), &meta("abc"), Duration::from_secs(20)) else { panic!("a late rank 1 was let in") };
        assert!(start.elapsed() < Duration::from_secs(3) && e.to_string().contains("rank 1 came after"), "{:?}: {e}", start.elapsed());
    }

    /// Rank 0's address only IPv6 (MASTER_ADDR=::1, a v6-only host): rank 0 listens on
    /// IPv6 and the mesh runs over it.
    #[test]
    fn ranks_meet_over_ipv6() {
        if TcpListener::bind("[::1]:0").is_err() {
            eprintln!("no IPv6 loopback here: skipped");
            return;
        }
        let port = free_port();
        let sums = meet_and_sum_ranks(None, (0..3).map(|r| Launch { master: Some(("::1".into(), port)), ..launch(r, 3, port) }).collect());
        assert_eq!(sums, [3.0; 3]);
    }

    #[test]
    fn a_missing_rank_is_named_after_the_timeout() {
        let (held, port) = held_port();
        let start = Instant::now();
        let e = rank_0_on(held, 2, port, &meta("a"), Duration::from_millis(600)).unwrap_err().to_string();
        // At the timeout, not later (1.2 s where the wait ran from the timeout's end).
        assert!(start.elapsed() < Duration::from_millis(1000), "{:?}", start.elapsed());
        assert!(e.contains("rank(s) [1]") && e.contains("never connected") && e.contains("--timeout") && e.contains("600ms"), "{e}");
        let e = rendezvous(&launch(1, 2, free_port()), &meta("a"), Duration::from_millis(300)).unwrap_err().to_string();
        assert!(e.contains("gave up") && e.contains("MASTER_ADDR") && e.contains("--timeout"), "{e}");
        // Why the connection failed: here nothing listens.
        assert!(e.contains("refused"), "{e}");
        // A second rank 0 on the same port is told that it may be one.
        let (first, port) = held_port();
        let e = rendezvous(&launch(0, 2, port), &meta("a"), Duration::from_millis(300)).unwrap_err().to_string();
        assert!(e.contains("MASTER_PORT") && e.contains("two processes claim rank 0"), "{e}");
        drop(first);
    }

    #[test]
    fn meta_differences_in_words() {
        assert_eq!(meta("a").difference(&meta("a")), None);
        let d = meta("a").difference(&meta("b")).unwrap();
        assert!(d.contains("llama3.wasm has sha256 b vs rank 0's a"), "{d}");
        let mut m = meta("a");
        m.run = "other".into();
        assert_eq!(meta("a").difference(&m).unwrap(), "run 'other' vs rank 0's 'test'");
        let mut m = meta("a");
        m.version = "0.2.0".into();
        assert_eq!(meta("a").difference(&m).unwrap(), "runner 0.2.0 vs rank 0's 0.1.0");
        // A plugin rank 0 has and this rank lacks, and the reverse.
        let none = RunMeta { plugins: vec![], ..meta("a") };
        assert_eq!(meta("a").difference(&none).unwrap(), "plugin llama3.wasm missing (rank 0 has sha256 a)");
        assert_eq!(none.difference(&meta("a")).unwrap(), "plugin llama3.wasm (sha256 a) that rank 0 does not have");
        // A name twice on one side, once with rank 0's hash: still a difference, both
        // ways; the order of the list is not.
        let twice = RunMeta { plugins: vec![("llama3.wasm".into(), "a".into()), ("llama3.wasm".into(), "b".into())], ..meta("a") };
        let d = meta("a").difference(&twice).unwrap();
        assert!(d.contains("(\"llama3.wasm\", \"b\")") && d.contains("vs rank 0's [(\"llama3.wasm\", \"a\")]"), "{d}");
        assert!(twice.difference(&meta("a")).is_some());
        let two = |a: &str, b: &str| RunMeta { plugins: vec![(a.into(), "1".into()), (b.into(), "2".into())], ..meta("a") };
        assert_eq!(two("x", "y").difference(&RunMeta { plugins: vec![("y".into(), "2".into()), ("x".into(), "1".into())], ..meta("a") }), None);
        assert!(two("x", "y").difference(&two("x", "z")).unwrap().contains("plugin y missing"));
    }

    /// Rank 0 fed by hand: a raw connection that sends `hello` (a line) and what rank 0
    /// answers it, with rank 0's own result.
    fn hello_to_rank_0(world: usize, hello: String) -> (String, Result<(), String>) {
        let (held, port) = held_port();
        let zero = std::thread::spawn(move || rank_0_on(held, world, port, &meta("a"), Duration::from_secs(4)).map(|_| ()).map_err(|e| e.to_string()));
        let mut s = connect_until_up(port);
        std::io::Write::write_all(&mut s, hello.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = std::io::Read::read_to_string(&mut s, &mut answer);
        (answer, zero.join().unwrap())
    }

    fn connect_until_up(port: u16) -> TcpStream {
        loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => break s,
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    fn hello_json(rank: usize, world: usize) -> String {
        serde_json::to_string(&Hello { rank, world, meta: meta("a"), port: 1 }).unwrap() + "\n"
    }

    /// A seated rank that never reads its answer (its process stopped), the answer more
    /// than the sockets' buffers hold (a world of 1000 here, the buffers shrunk): every
    /// other rank is answered at once, and rank 0 fails at the rendezvous' end naming the
    /// rank, and tells the others so: a rank (2, a real one) fails then too, with the
    /// cause. (Before: rank 0 wrote the answers one after another, blocked on rank 1's for
    /// good, and no rank after it heard anything; then, with the answers written at once,
    /// rank 2 went on to the mesh and failed only at its own timeout, 8 s here, "cannot
    /// reach rank 1".)
    /// Rank 0's listener with small send buffers (its connections inherit them), so that
    /// an answer to a world of 1000 fills them when the other side does not read.
    fn small_send_buffers(rt: &tokio::runtime::Runtime) -> std::net::TcpListener {
        rt.block_on(async {
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            s.set_send_buffer_size(4096).unwrap();
            s.bind("127.0.0.1:0".parse().unwrap()).unwrap();
            s.listen(2048).unwrap().into_std().unwrap()
        })
    }

    #[test]
    fn a_rank_that_does_not_take_its_answer_holds_no_other() {
        let n = 1000;
        let rt = runtime().unwrap();
        // Small send buffers on rank 0's listener (its connections inherit them), a small
        // receive buffer on the rank that does not read: the answer (14 kB) fills both.
        let held = small_send_buffers(&rt);
        let at = held.local_addr().unwrap();
        let start = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || drop(tx.send(rendezvous_on(held, &launch(0, n, at.port()), &meta("a"), Duration::from_secs(2)).map(|_| ()))));
        let mut stopped = rt.block_on(async {
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            s.set_recv_buffer_size(2048).unwrap();
            s.connect(at).await.unwrap().into_std().unwrap()
        });
        stopped.set_nonblocking(false).unwrap();
        std::io::Write::write_all(&mut stopped, hello_json(1, n).as_bytes()).unwrap();
        let two = std::thread::spawn(move || {
            let e = rendezvous(&launch(2, n, at.port()), &meta("a"), Duration::from_secs(8)).map(|_| ()).unwrap_err().to_string();
            (e, start.elapsed())
        });
        let mut others: Vec<TcpStream> = (3..n)
            .map(|r| {
                let mut s = TcpStream::connect(at).unwrap();
                std::io::Write::write_all(&mut s, hello_json(r, n).as_bytes()).unwrap();
                s
            })
            .collect();
        for (r, s) in others.iter_mut().enumerate() {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut line = String::new();
            let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(s), &mut line);
            assert!(line.starts_with("{\"Welcome\"") && line.len() > 10_000, "rank {}: {line:?}", r + 3);
        }
        let e = rx.recv_timeout(Duration::from_secs(10)).expect("rank 0 hung on the rank that does not read").unwrap_err().to_string();
        assert!(e.contains("rank(s) [1] did not take rank 0's answer (the 1000 ranks' addresses"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(6), "{:?}", start.elapsed());
        let (e, took) = two.join().unwrap();
        assert!(e.starts_with("rank 2: rank(s) [1] did not take rank 0's answer") && took < Duration::from_secs(5), "{took:?}: {e}");
        drop(stopped);
    }

    /// Close `s` with a reset (SO_LINGER 0), as a process killed mid-connection may: the
    /// peer's next write fails, its next read gets the reset.
    fn reset(rt: &tokio::runtime::Runtime, s: TcpStream) {
        s.set_nonblocking(true).unwrap();
        rt.block_on(async { tokio::net::TcpStream::from_std(s).unwrap().set_zero_linger().unwrap() });
    }

    /// A rank that took its welcome and then broke its connection (reset) before rank 0's
    /// second line: that line's write fails, and rank 0 fails at once naming the rank and
    /// the error, not as a rank that did not take its answer; a real rank (2), which had
    /// its word to begin, fails at once in the mesh rather than wait out its 20 s. Rank 3
    /// reads its welcome late (a world of 1000, its buffers shrunk), so that the second
    /// line goes out after rank 1's reset. (Before: the failed write went into the list of
    /// ranks that 'did not take rank 0's answer (the 1000 ranks' addresses ...)'; with it
    /// left out, rank 0 went on to the mesh and failed only at its 6 s timeout, 'rank(s)
    /// [1, 3, ...] never connected to the mesh'.) A rank whose connection to rank 0 is
    /// reset after the welcome says so, naming itself.
    #[test]
    fn a_rank_that_breaks_its_connection_after_the_welcome_is_named() {
        let n = 1000;
        let rt = runtime().unwrap();
        let held = small_send_buffers(&rt);
        let at = held.local_addr().unwrap();
        let start = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = rendezvous_on(held, &launch(0, n, at.port()), &meta("a"), Duration::from_secs(6)).map(|_| ());
            drop(tx.send(r.map_err(|e| (e.to_string(), start.elapsed()))));
        });
        let mut one = connect_until_up(at.port());
        std::io::Write::write_all(&mut one, hello_json(1, n).as_bytes()).unwrap();
        let mut slow = rt.block_on(async {
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            s.set_recv_buffer_size(2048).unwrap();
            s.connect(at).await.unwrap().into_std().unwrap()
        });
        slow.set_nonblocking(false).unwrap();
        std::io::Write::write_all(&mut slow, hello_json(3, n).as_bytes()).unwrap();
        let two = std::thread::spawn(move || {
            let e = rendezvous(&launch(2, n, at.port()), &meta("a"), Duration::from_secs(20)).map(|_| ()).unwrap_err().to_string();
            (e, start.elapsed())
        });
        let others: Vec<TcpStream> = (4..n)
            .map(|r| {
                let mut s = TcpStream::connect(at).unwrap();
                std::io::Write::write_all(&mut s, hello_json(r, n).as_bytes()).unwrap();
                s
            })
            .collect();
        // Rank 1 takes its welcome whole, then resets.
        one.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut welcome = String::new();
        let mut r1 = std::io::BufReader::new(one.try_clone().unwrap());
        std::io::BufRead::read_line(&mut r1, &mut welcome).unwrap();
        assert!(welcome.starts_with("{\"Welcome\"") && welcome.ends_with('\n'), "{welcome:?}");
        drop(r1);
        reset(&rt, one);
        std::thread::sleep(Duration::from_millis(100));
        assert!(rx.try_recv().is_err(), "rank 0 ended before rank 3 took its welcome");
        // Rank 3 takes its welcome, and its word to begin: the welcomes all went out.
        slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r3 = std::io::BufReader::new(slow);
        let (mut welcome, mut then) = (String::new(), String::new());
        std::io::BufRead::read_line(&mut r3, &mut welcome).unwrap();
        std::io::BufRead::read_line(&mut r3, &mut then).unwrap();
        assert!(welcome.starts_with("{\"Welcome\"") && then == "\"Begin\"\n", "{then:?}");
        let (e, took) = rx.recv_timeout(Duration::from_secs(10)).expect("rank 0 hung").unwrap_err();
        assert!(e.contains("rank(s) [1] took rank 0's answer but not the word to begin that followed it ("), "{e}");
        assert!(!e.contains("did not take rank 0's answer") && took < Duration::from_secs(5), "{took:?}: {e}");
        let (e, took) = two.join().unwrap();
        assert!(e.contains("rank 2: ") && took < Duration::from_secs(5), "{took:?}: {e}");
        drop(others);

        // Rank 1's side: rank 0's connection reset after the welcome.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut hello = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(s.try_clone().unwrap()), &mut hello).unwrap();
            std::io::Write::write_all(&mut s, b"{\"Welcome\":{\"addrs\":[\"127.0.0.1:1\",\"127.0.0.1:1\"],\"token\":1}}\n").unwrap();
            std::thread::sleep(Duration::from_millis(100));
            s
        });
        let one = std::thread::spawn(move || rendezvous(&launch(1, 2, port), &meta("a"), Duration::from_secs(5)).map(|_| ()).unwrap_err().to_string());
        reset(&rt, fake.join().unwrap());
        let e = one.join().unwrap();
        assert!(e.contains("rank 1: the line after rank 0's answer: ") && e.contains("reset"), "{e}");
    }

    /// Rank 0 reading hellos by hand: a rank claimed twice is refused as such; a hello
    /// cut short by its connection's end (valid JSON, no newline) is not seated, so the
    /// real rank that comes next meets.
    #[test]
    fn rank_0_seats_whole_hellos_of_distinct_ranks() {
        let (held, port) = held_port();
        let zero = std::thread::spawn(move || rank_0_on(held, 3, port, &meta("a"), Duration::from_secs(4)).map(|_| ()).map_err(|e| e.to_string()));
        let answers: Vec<String> = (0..2)
            .map(|_| {
                let mut s = connect_until_up(port);
                std::io::Write::write_all(&mut s, hello_json(1, 3).as_bytes()).unwrap();
                s
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|mut s| {
                let mut a = String::new();
                let _ = std::io::Read::read_to_string(&mut s, &mut a);
                a
            })
            .collect();
        for a in answers.iter().chain([&zero.join().unwrap().unwrap_err()]) {
            assert!(a.contains("two processes claim rank 1 of 3"), "{a}");
        }

        let (held, port) = held_port();
        let zero = std::thread::spawn(move || rank_0_on(held, 2, port, &meta("a"), Duration::from_secs(4)).map(|_| ()));
        let mut cut = connect_until_up(port);
        std::io::Write::write_all(&mut cut, hello_json(1, 2).trim_end().as_bytes()).unwrap();
        cut.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut cut, &mut rest);
        assert_eq!(rest, "", "rank 0 answered a cut hello");
        let one = rendezvous(&launch(1, 2, port), &meta("a"), Duration::from_secs(4)).map(|_| ());
        assert!(one.is_ok() && zero.join().unwrap().is_ok(), "{one:?}");
    }

    /// A hello naming a rank beyond the world is refused as that, not as a duplicate.
    #[test]
    fn a_rank_beyond_the_world_is_named() {
        for rank in [2, 5] {
            let (answer, zero) = hello_to_rank_0(2, hello_json(rank, 2));
            let want = format!("rank {rank} is not below the world size 2");
            assert!(answer.contains(&want), "{answer}");
            assert!(zero.unwrap_err().contains(&want));
        }
        let (answer, zero) = hello_to_rank_0(2, hello_json(1, 3));
        assert!(answer.contains("rank 1 was launched with a world of 3, rank 0 with 2"), "{answer}");
        assert!(zero.is_err());
        // A launch no detect() makes: an error, not an index out of bounds.
        for (rank, world) in [(0, 0), (2, 2)] {
            let e = rendezvous(&launch(rank, world, 1), &meta("a"), Duration::from_millis(100)).unwrap_err().to_string();
            assert!(e.contains(&format!("rank {rank} is not below the world size {world}")), "{e}");
        }
        // Nor a world whose tables would not fit (before: rank 0 aborted allocating them).
        for world in [MAX_WORLD + 1, 1 << 40] {
            let e = rendezvous(&launch(0, world, free_port()), &meta("a"), Duration::from_millis(100)).unwrap_err().to_string();
            assert!(e.contains(&format!("a world of {world} ranks is more than this runner takes (1048576)")), "{e}");
        }
        assert_eq!(max_answer(usize::MAX), u64::MAX);
        let e = rendezvous(&Launch { master: None, ..launch(1, 2, 1) }, &meta("a"), Duration::from_millis(100)).unwrap_err();
        assert!(e.to_string().contains("2 ranks but no address"), "{e}");
    }

    /// A hello line longer than any runner's is dropped once rank 0 has read its limit,
    /// not read on (into memory) until the hello wait ends; the real rank then meets.
    #[test]
    fn an_endless_hello_is_cut_at_its_limit() {
        let (held, port) = held_port();
        let zero = std::thread::spawn(move || rank_0_on(held, 2, port, &meta("a"), Duration::from_secs(20)).map(|_| ()));
        let mut flood = connect_until_up(port);
        let start = Instant::now();
        // Rank 0 hangs up after MAX_HELLO bytes: a write fails, or the read sees the end.
        let chunk = vec![b'x'; 1 << 16];
        let cut = (0..64).any(|_| std::io::Write::write_all(&mut flood, &chunk).is_err()) || {
            flood.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
            matches!(std::io::Read::read(&mut flood, &mut [0u8; 16]), Ok(0) | Err(_)) && start.elapsed() < Duration::from_secs(3)
        };
        // Rank 0 waits 5 s (a quarter of its timeout) for a silent or slow hello.
        assert!(cut && start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
        let one = rendezvous(&launch(1, 2, port), &meta("a"), Duration::from_secs(20)).map(|_| ());
        assert!(one.is_ok() && zero.join().unwrap().is_ok(), "{one:?}");
    }

    /// What rank 1 says when "rank 0" (a raw listener here) answers `answer` and closes
    /// (or stays silent when `None`).
    fn rank_1_hears(answer: Option<&[u8]>) -> String {
        let answer = answer.map(<[u8]>::to_vec);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut r = std::io::BufReader::new(s.try_clone().unwrap());
            let mut hello = String::new();
            std::io::BufRead::read_line(&mut r, &mut hello).unwrap();
            match answer {
                Some(a) => std::io::Write::write_all(&mut s, &a).unwrap(),
                None => std::thread::sleep(Duration::from_millis(600)),
            }
        });
        let e = rendezvous(&launch(1, 2, port), &meta("a"), Duration::from_millis(300)).unwrap_err().to_string();
        fake.join().unwrap();
        e
    }

    /// Another program on the port, an answer cut short, a wrong number of addresses, a
    /// silent rank 0: each said as such.
    #[test]
    fn a_rank_names_what_rank_0_answered() {
        let e = rank_1_hears(Some(b"HTTP/1.1 400 Bad Request\r\n\r\n"));
        assert!(e.contains("answered with something that is not a runner's rendezvous: is another program"), "{e}");
        let e = rank_1_hears(Some(b"{\"Welcome\":{\"addrs\":[\"127.0"));
        assert!(e.contains("not a runner's rendezvous (a line too long, or cut short)"), "{e}");
        let e = rank_1_hears(Some(b"{\"Welcome\":{\"addrs\":[\"127.0.0.1:1\"],\"token\":1}}\n"));
        assert!(e.contains("rank 0 answered with 1 addresses for a world of 2"), "{e}");
        let e = rank_1_hears(Some(b""));
        assert!(e.contains("rank 0 closed the rendezvous without an answer"), "{e}");
        let e = rank_1_hears(Some(b"{\"Refuse\":\"because\"}\n"));
        assert_eq!(e, "rank 1: because");
        let e = rank_1_hears(None);
        assert!(e.contains("gave up after 300ms") && e.contains("connected, but rank 0 did not answer"), "{e}");
        // A welcome, then: rank 0's word that a rank did not take its own, its end, other
        // bytes; a word to go on without a welcome.
        const WELCOME: &str = "{\"Welcome\":{\"addrs\":[\"127.0.0.1:1\",\"127.0.0.1:1\"],\"token\":1}}\n";
        let e = rank_1_hears(Some(format!("{WELCOME}{{\"Refuse\":\"rank(s) [3] did not take rank 0's answer\"}}\n").as_bytes()));
        assert_eq!(e, "rank 1: rank(s) [3] did not take rank 0's answer");
        let e = rank_1_hears(Some(WELCOME.as_bytes()));
        assert!(e.contains("rank 0 closed the rendezvous after its answer, before every rank took theirs"), "{e}");
        let e = rank_1_hears(Some(format!("{WELCOME}HTTP/1.1 400 Bad Request\r\n").as_bytes()));
        assert!(e.contains("rank 0's answer was followed by something that is not a runner's"), "{e}");
        let e = rank_1_hears(Some(b"\"Begin\"\n"));
        assert!(e.contains("not a runner's rendezvous"), "{e}");
    }

    /// A welcome longer than a hello's limit (1 MiB): 150 000 ranks' addresses, 2.7 MB.
    /// A rank reads it whole (its limit grows with the world), and the line after it, a
    /// refusal naming 149 999 ranks that did not take theirs (1.09 MB); cut at 1 MiB, either
    /// would have called rank 0 'not a runner'. (Before: the refusal was read with the
    /// hello's limit, 'rank 0's answer was followed by something that is not a runner's (a
    /// line too long, or cut short)'.)
    #[test]
    fn a_welcome_longer_than_a_hello_is_read_whole() {
        let n = 150_000;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut hello = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(s.try_clone().unwrap()), &mut hello).unwrap();
            let welcome = Answer::Welcome { addrs: vec!["127.0.0.1:65535".into(); n], token: 1 };
            let untaken: Vec<usize> = (2..=n).collect();
            let refusal = serde_json::to_string(&Answer::Refuse(format!("rank(s) {untaken:?} did not take rank 0's answer"))).unwrap();
            assert!(refusal.len() as u64 > MAX_HELLO, "{}", refusal.len());
            let text = serde_json::to_string(&welcome).unwrap() + "\n" + &refusal + "\n";
            assert!(text.len() as u64 > 2 * MAX_HELLO, "{}", text.len());
            std::io::Write::write_all(&mut s, text.as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(500));
        });
        let e = rendezvous(&launch(1, n, port), &meta("a"), Duration::from_secs(5)).map(|_| ()).unwrap_err().to_string();
        fake.join().unwrap();
        assert!(e.starts_with("rank 1: rank(s) [2, 3, 4") && e.ends_with(", 150000] did not take rank 0's answer"), "{}", &e[..200.min(e.len())]);
    }

    /// After the world met, a silent connection to rank 0's port holds only its own
    /// thread: a rank started twice behind it is still refused at once.
    #[test]
    fn a_silent_latecomer_does_not_hold_the_refusals() {
        let (held, port) = held_port();
        assert_eq!(meet_and_sum_ranks(Some(held), (0..2).map(|r| launch(r, 2, port)).collect()), [1.0; 2]);
        let silent = connect_until_up(port);
        std::thread::sleep(Duration::from_millis(50));
        let start = Instant::now();
        let Err(e) = rendezvous(&launch(1, 2, port), &meta("abc"), Duration::from_secs(20)) else { panic!("a late rank 1 was let in") };
        assert!(start.elapsed() < Duration::from_secs(3) && e.to_string().contains("rank 1 came after"), "{:?}: {e}", start.elapsed());
        drop(silent);
        // A line without end is hung up on at its limit, not read for the whole wait.
        let mut flood = connect_until_up(port);
        let start = Instant::now();
        let chunk = vec![b'x'; 1 << 16];
        let cut = (0..64).any(|_| std::io::Write::write_all(&mut flood, &chunk).is_err()) || {
            flood.set_read_timeout(Some(Duration::from_secs(4))).unwrap();
            matches!(std::io::Read::read(&mut flood, &mut [0u8; 16]), Ok(0) | Err(_))
        };
        assert!(cut && start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
    }

    /// The mesh's accept loop ends at its deadline even while connections that never
    /// say their rank (or claim one that is not to come here) keep it busy; the rank
    /// that does say is taken.
    #[test]
    fn the_mesh_wait_ends_at_its_deadline() {
        let mesh = mesh_listener(false).unwrap();
        let at = mesh.local_addr().unwrap();
        let addrs = vec![format!("127.0.0.1:{}", at.port()), "127.0.0.1:1".into(), "127.0.0.1:1".into()];
        let token = run_token(&addrs);
        let mut two = TcpStream::connect(at).unwrap();
        std::io::Write::write_all(&mut two, &mesh_greeting(2, token)).unwrap();
        let mut strays = Vec::new();
        for id in [0, 3, 1 << 40, usize::MAX] {
            let mut s = TcpStream::connect(at).unwrap();
            std::io::Write::write_all(&mut s, &mesh_greeting(id, token)).unwrap();
            strays.push(s);
        }
        let silent = TcpStream::connect(at).unwrap();
        let start = Instant::now();
        let timeout = Duration::from_millis(300);
        let e = connect_mesh(0, &addrs, token, &mesh, start + timeout, timeout).unwrap_err().to_string();
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
        assert!(e.contains("rank(s) [1] never connected to the mesh within 300ms"), "{e}");
        drop((silent, strays, two));
        // Ranks 1 and 2 both say theirs: the mesh is whole. Around them, one that claims
        // this rank's own id (and leaves) and a second rank 2: neither is kept. A rank
        // kept hears rank 0's greeting, and then nothing; one not kept, the end.
        let says = |id: usize| {
            let mut s = TcpStream::connect(at).unwrap();
            std::io::Write::write_all(&mut s, &mesh_greeting(id, token)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            s
        };
        drop(says(0));
        let (two, two_again, mut one) = (says(2), says(2), says(1));
        let w = connect_mesh(0, &addrs, token, &mesh, Instant::now() + timeout, timeout).unwrap();
        assert_eq!((w.rank(), w.size()), (0, 3));
        let mut ack = [0u8; MESH_GREETING];
        std::io::Read::read_exact(&mut one, &mut ack).unwrap();
        assert_eq!(ack, mesh_greeting(0, token));
        let (mut kept, mut dropped) = (Vec::new(), 0);
        for mut s in [two, two_again] {
            match std::io::Read::read_exact(&mut s, &mut ack) {
                Ok(()) => kept.push((ack, s)),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => dropped += 1,
                Err(e) => panic!("a rank 2 heard nothing: {e}"),
            }
        }
        assert!(kept.len() == 1 && dropped == 1 && kept[0].0 == mesh_greeting(0, token), "{} kept, {dropped} dropped", kept.len());
        kept[0].1.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        assert!(std::io::Read::read(&mut kept[0].1, &mut [0u8; 1]).is_err(), "the rank 2 kept was dropped");
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(w.failure(), None, "a connection claiming rank 0 was taken for a peer");
        drop((one, kept));
    }

    /// Ranks on `listeners` at `addrs` connect their mesh and all-reduce each rank's
    /// number + 1: what each rank got, and its world's failure after a barrier.
    fn mesh_and_sum_ranks(listeners: Vec<TcpListener>, addrs: &[String], token: Token, timeout: Duration) -> Vec<(f32, Option<String>)> {
        let deadline = Instant::now() + timeout;
        let hs: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(r, l)| {
                let addrs = addrs.to_vec();
                std::thread::spawn(move || {
                    let w = connect_mesh(r, &addrs, token, &l, deadline, timeout).unwrap();
                    let g = w.everyone().unwrap();
                    let mut x = [(r + 1) as f32];
                    g.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                    g.barrier().unwrap();
                    (x[0], w.failure())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    /// Three mesh listeners, their addresses and a token for the run.
    fn mesh_of_3() -> (Vec<TcpListener>, Vec<String>, Token) {
        let listeners: Vec<TcpListener> = (0..3).map(|_| mesh_listener(false).unwrap()).collect();
        let addrs: Vec<String> = listeners.iter().map(|l| format!("127.0.0.1:{}", l.local_addr().unwrap().port())).collect();
        let token = run_token(&addrs);
        (listeners, addrs, token)
    }

    /// Connections to a rank's mesh listener that connect and stay silent are read beside
    /// the ranks' greetings: with four open ahead of the ranks at rank 0's, the mesh is
    /// whole at once. (Read one after another, each held rank 0's listener 5 s: 4 × 5 s,
    /// past the 10 s timeout here.)
    #[test]
    fn silent_connections_do_not_delay_the_mesh() {
        let (listeners, addrs, token) = mesh_of_3();
        let silent: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&addrs[0]).unwrap()).collect();
        let start = Instant::now();
        assert_eq!(mesh_and_sum_ranks(listeners, &addrs, token, Duration::from_secs(10)), vec![(6.0, None); 3]);
        assert!(start.elapsed() < Duration::from_secs(3), "the mesh was whole after {:?}", start.elapsed());
        drop(silent);
    }

    /// More silent connections at rank 0's mesh listener than it reads at once, held open:
    /// each is dropped when its greeting wait ends (a quarter of the timeout, 1 s here),
    /// and the ranks, queued behind them, meet then. (Each held for the whole wait, the
    /// ranks never got a slot.)
    #[test]
    fn a_flood_of_silent_connections_delays_the_mesh_by_one_greeting_wait() {
        let (listeners, addrs, token) = mesh_of_3();
        let silent: Vec<TcpStream> = (0..HELLOS_AT_ONCE + 1).map(|_| TcpStream::connect(&addrs[0]).unwrap()).collect();
        let start = Instant::now();
        assert_eq!(mesh_and_sum_ranks(listeners, &addrs, token, Duration::from_secs(4)), vec![(6.0, None); 3]);
        assert!(start.elapsed() < Duration::from_millis(2500), "the mesh was whole after {:?}", start.elapsed());
        drop(silent);
    }

    /// A rank that reaches a lower rank's mesh address and is not answered with that
    /// rank's greeting and this run's token (something else listens there now: a rank of
    /// another run, which closes, or a program, which answers otherwise or echoes) fails
    /// at once naming the address, rather than take it for the rank. (Before: the
    /// connecting rank took whatever accepted its connection.)
    #[test]
    fn a_mesh_address_that_does_not_answer_with_the_token_is_refused() {
        let token: Token = 0x1234_5678_9abc_def0_1122_3344_5566_7788;
        let cases: [(Option<[u8; MESH_GREETING]>, &str); 5] = [
            (Some(mesh_greeting(0, token)), ""),
            (Some(mesh_greeting(0, token ^ 1)), "answered without this run's token: another process listens there"),
            // An echo: the connecting rank's own greeting.
            (Some(mesh_greeting(1, token)), "answered without this run's token"),
            (None, "closed the connection without this run's token"),
            (Some([0; MESH_GREETING]), "answered without this run's token"),
        ];
        for (answer, want) in cases {
            let other = TcpListener::bind("127.0.0.1:0").unwrap();
            let at = other.local_addr().unwrap();
            let fake = std::thread::spawn(move || {
                let (mut s, _) = other.accept().unwrap();
                let mut g = [0u8; MESH_GREETING];
                std::io::Read::read_exact(&mut s, &mut g).unwrap();
                if let Some(a) = answer {
                    std::io::Write::write_all(&mut s, &a).unwrap();
                }
                g
            });
            let mine = mesh_listener(false).unwrap();
            let addrs = vec![at.to_string(), format!("127.0.0.1:{}", mine.local_addr().unwrap().port())];
            let start = Instant::now();
            let timeout = Duration::from_secs(5);
            let got = connect_mesh(1, &addrs, token, &mine, start + timeout, timeout).map(|w| w.size()).map_err(|e| e.to_string());
            assert_eq!(fake.join().unwrap(), mesh_greeting(1, token));
            assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
            if want.is_empty() {
                assert_eq!(got, Ok(2));
            } else {
                let e = got.unwrap_err();
                assert!(e.contains(&format!("rank 1: {at}, rank 0's mesh address, {want}")), "{e}");
            }
        }
        // Nothing listens there any more (the rank exited after the rendezvous): said at
        // once, not retried until the deadline.
        let gone = format!("127.0.0.1:{}", crate::testing::free_port());
        let mine = mesh_listener(false).unwrap();
        let addrs = vec![gone.clone(), format!("127.0.0.1:{}", mine.local_addr().unwrap().port())];
        let (start, timeout) = (Instant::now(), Duration::from_secs(5));
        let e = connect_mesh(1, &addrs, token, &mine, start + timeout, timeout).map(|_| ()).unwrap_err().to_string();
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}: {e}", start.elapsed());
        assert!(e.contains(&format!("rank 1: rank 0's mesh listener at {gone} refused the connection")), "{e}");
        // Something that takes the connection and says nothing: named at the deadline.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let mine = mesh_listener(false).unwrap();
        let addrs = vec![silent.local_addr().unwrap().to_string(), format!("127.0.0.1:{}", mine.local_addr().unwrap().port())];
        let (start, timeout) = (Instant::now(), Duration::from_millis(300));
        let e = connect_mesh(1, &addrs, token, &mine, start + timeout, timeout).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(&format!("rank 1: {}, rank 0's mesh address, did not answer with this run's token within 300ms", addrs[0])), "{e}");
        // At the deadline, not later.
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    }

    /// A connection to a rank's mesh listener that names a rank without this run's token
    /// (a rank of another run on the same hosts, a stray process, or a rank number alone)
    /// is closed, not taken as that rank; the real ranks, which come after, meet and
    /// all-reduce right. (Before: a rank number was enough; the stray was taken as rank
    /// 2, the real rank 2 dropped, and rank 0's all-reduce waited on the stray.)
    #[test]
    fn a_mesh_connection_without_the_runs_token_is_not_a_rank() {
        let (listeners, addrs, token) = mesh_of_3();
        assert_ne!(token, run_token(&addrs), "two runs drew the same token");
        // At rank 0's listener ahead of the ranks: rank 2 with another run's token, and
        // rank 1's number alone (the connection then ends).
        let mut other_run = TcpStream::connect(&addrs[0]).unwrap();
        std::io::Write::write_all(&mut other_run, &mesh_greeting(2, token ^ 1)).unwrap();
        let mut bare = TcpStream::connect(&addrs[0]).unwrap();
        std::io::Write::write_all(&mut bare, &1u64.to_le_bytes()).unwrap();
        bare.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(mesh_and_sum_ranks(listeners, &addrs, token, Duration::from_secs(5)), vec![(6.0, None); 3]);
        for mut s in [other_run, bare] {
            s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            assert!(matches!(std::io::Read::read(&mut s, &mut [0u8; 1]), Ok(0)), "a stray was kept");
        }
    }
}
