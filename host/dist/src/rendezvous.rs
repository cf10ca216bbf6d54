//! The rendezvous on rank 0 (tokio, TCP): every rank connects to rank 0's
//! `MASTER_ADDR:MASTER_PORT` and says who it is and what it runs ([`RunMeta`]: the
//! runner's version, the run's description, the plugins and their sha256); rank 0 checks
//! that the ranks are distinct, agree on the world size and run exactly the same thing,
//! and answers every rank with the address of every other rank's data port, or with the
//! reason it refuses (a plugin hash that differs names the plugin and both hashes, on
//! every rank). The ranks then connect pairwise into the [`TcpWorld`] mesh.
//!
//! Ranks may start in any order: they retry the connection to rank 0 until the timeout;
//! rank 0 waits that long for the others and names the ranks that never came.
//!
//! The run is IPv4 unless rank 0's address resolves to IPv6 addresses only
//! (`MASTER_ADDR=::1`, a v6-only host): then rank 0 listens on IPv6, and every rank's
//! mesh listener takes the family of its own connection to rank 0.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

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
    /// Every rank's mesh address, by rank.
    Welcome(Vec<String>),
    Refuse(String),
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| rv(format!("tokio runtime: {e}")))?;
    let hello = Hello {
        rank: launch.rank,
        world: launch.world,
        meta: meta.clone(),
        port: 0,
    };
    let (addrs, listener) = rt.block_on(async {
        let left = deadline.saturating_duration_since(Instant::now());
        if launch.rank == 0 {
            // Rank 0 names the ranks that never came when its own wait ends.
            let (addrs, l, mesh) = serve(launch, &host, port, hello, left, timeout).await?;
            // A process that comes after the world is complete (a rank started twice)
            // is told so at once, not left to wait out its timeout.
            if let Ok(l) = l.into_std() {
                refuse_latecomers(l, launch.world);
            }
            return Ok((addrs, mesh));
        }
        // The last connection error (an address that does not resolve, a refused
        // connection) goes into the message when the wait ends.
        let last = std::cell::RefCell::new(None);
        match tokio::time::timeout(left, join(&host, port, hello, &last)).await {
            Ok(r) => r,
            Err(_) => Err(rv(format!(
                "rank {} gave up after {timeout:.0?} (--timeout) waiting at {}{} (is rank 0 running, \
                 MASTER_ADDR right and the port open?)",
                launch.rank,
                host_port(&host, port),
                last.borrow().as_ref().map_or_else(String::new, |e| format!(": {e}"))
            ))),
        }
    })?;
    connect_mesh(launch.rank, &addrs, &listener, deadline, timeout)
}

/// Whether `host` resolves to IPv6 addresses only (rank 0 then listens on IPv6). A name
/// that does not resolve (yet) counts as IPv4, as before IPv6 was supported.
fn v6_only(host: &str, port: u16) -> bool {
    let all: Vec<SocketAddr> = (host, port).to_socket_addrs().map(Iterator::collect).unwrap_or_default();
    !all.is_empty() && all.iter().all(SocketAddr::is_ipv6)
}

/// This rank's mesh listener, on every address of the family (IPv6 or IPv4).
fn mesh_listener(v6: bool) -> Result<TcpListener, DistError> {
    let any: IpAddr = if v6 { Ipv6Addr::UNSPECIFIED.into() } else { Ipv4Addr::UNSPECIFIED.into() };
    TcpListener::bind((any, 0)).map_err(|e| rv(format!("mesh listener: {e}")))
}

/// `host:port`, an IPv6 literal in brackets.
fn host_port(host: &str, port: u16) -> String {
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
            Answer::Welcome(_) => None,
        }
    };
    tokio::time::timeout(within, ask).await.ok().flatten()
}

/// How long rank 0 waits for a connection's hello line.
const HELLO_WITHIN: Duration = Duration::from_secs(10);

/// Rank 0 after the rendezvous: answer every later hello on the rendezvous port with a
/// refusal, for as long as the process runs (a detached thread that only accepts).
fn refuse_latecomers(l: std::net::TcpListener, world: usize) {
    if l.set_nonblocking(false).is_err() {
        return;
    }
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            // A thread each: a connection that stays silent holds only its own.
            std::thread::spawn(move || refuse_latecomer(&s, world));
        }
    });
}

/// Refuse one connection that came after the rendezvous, naming the rank it claims.
fn refuse_latecomer(s: &TcpStream, world: usize) {
    let Some(line) = read_line_within(s, HELLO_WITHIN, MAX_HELLO) else { return };
    let Ok(h) = serde_json::from_str::<Hello>(&line) else { return };
    let why = format!(
        "rank {} came after all {world} ranks had met and the run had begun: two processes claim rank {} \
         (check the launcher's task count), or this one was started late",
        h.rank, h.rank
    );
    if let Ok(text) = serde_json::to_string(&Answer::Refuse(why)) {
        let _ = std::io::Write::write_all(&mut &*s, (text + "\n").as_bytes());
    }
}

/// One line from `s` within `within` (all reads together, so that a peer sending a byte
/// now and then cannot hold the caller) and `max` bytes; `None` otherwise.
fn read_line_within(mut s: &TcpStream, within: Duration, max: u64) -> Option<String> {
    let deadline = Instant::now() + within;
    let mut line = Vec::new();
    let mut buf = [0u8; 4096];
    while !line.ends_with(b"\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || line.len() as u64 >= max {
            return None;
        }
        s.set_read_timeout(Some(left)).ok()?;
        match std::io::Read::read(&mut s, &mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(k) => line.extend_from_slice(&buf[..k]),
        }
    }
    String::from_utf8(line).ok()
}

/// Rank 0: accept world − 1 hellos within `left` (what remains of `timeout`, the limit
/// its message names), check them, answer everyone; the rendezvous listener comes back
/// with the addresses.
async fn serve(
    launch: &Launch,
    host: &str,
    port: u16,
    mut mine: Hello,
    left: Duration,
    timeout: Duration,
) -> Result<(Vec<String>, tokio::net::TcpListener, TcpListener), DistError> {
    let v6 = v6_only(host, port);
    let mesh = mesh_listener(v6)?;
    mine.port = mesh.local_addr().map_err(|e| rv(e.to_string()))?.port();
    let any: IpAddr = if v6 { Ipv6Addr::UNSPECIFIED.into() } else { Ipv4Addr::UNSPECIFIED.into() };
    let l = match tokio::net::TcpListener::bind((any, port)).await {
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
    let n = launch.world;
    let mut seen: Vec<Option<tokio::net::TcpStream>> = (0..n).map(|_| None).collect();
    let mut addrs = vec![String::new(); n];
    addrs[0] = host_port(host, mine.port);
    let mut refuse: Option<String> = None;
    let mut second_zero = Vec::new();
    let mut until = tokio::time::Instant::now() + left;
    while seen.iter().skip(1).any(Option::is_none) {
        let (s, peer) = match tokio::time::timeout_at(until, l.accept()).await {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => return Err(rv(format!("rank 0 accept: {e}"))),
            Err(_) if refuse.is_some() => break,
            Err(_) => {
                let missing: Vec<usize> = (1..n).filter(|&r| seen[r].is_none()).collect();
                return Err(rv(format!(
                    "rank 0 waited {timeout:.0?} (--timeout) for rank(s) {missing:?}, which never connected to port {port}: \
                     were they started, with MASTER_ADDR={host} and MASTER_PORT={port}?"
                )));
            }
        };
        let mut s = BufReader::new(s);
        let mut line = String::new();
        // A rank says hello as soon as it connects; anything else that connects and stays
        // silent (a port scanner, a stopped process) is dropped after a few seconds rather
        // than holding the rendezvous.
        let hello_by = until.min(tokio::time::Instant::now() + HELLO_WITHIN.min(left / 4));
        if !matches!(tokio::time::timeout_at(hello_by, read_line_max(&mut s, &mut line, MAX_HELLO)).await, Ok(Ok(true))) {
            continue;
        }
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
            second_zero.push(s.into_inner());
        } else if let Some(r) = slot {
            // A dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d.
            addrs[r] = SocketAddr::new(peer.ip().to_canonical(), h.port).to_string();
            seen[r] = Some(s.into_inner());
        }
        if let Some(w) = why
            && refuse.is_none()
        {
            refuse = Some(w);
            // Tell the ranks that come soon why; do not wait the whole timeout.
            until = until.min(tokio::time::Instant::now() + Duration::from_secs(3));
        }
    }
    let answer = match &refuse {
        Some(why) => Answer::Refuse(why.clone()),
        None => Answer::Welcome(addrs.clone()),
    };
    let text = serde_json::to_string(&answer).map_err(|e| rv(e.to_string()))? + "\n";
    for s in seen.iter_mut().flatten().chain(&mut second_zero) {
        let _ = s.write_all(text.as_bytes()).await;
    }
    match refuse {
        Some(why) => Err(DistError::Refused { rank: 0, why }),
        None => Ok((addrs, l, mesh)),
    }
}

/// Any other rank: connect to rank 0 (retrying until it listens), open the mesh listener
/// on the family of that connection, say hello, read the answer.
async fn join(host: &str, port: u16, mut hello: Hello, last: &std::cell::RefCell<Option<String>>) -> Result<(Vec<String>, TcpListener), DistError> {
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
    s.get_mut().write_all(text.as_bytes()).await.map_err(|e| rv(format!("hello to rank 0: {e}")))?;
    let mut line = String::new();
    let whole = read_line_max(&mut s, &mut line, max_answer(hello.world)).await.map_err(|e| rv(format!("answer from rank 0: {e}")))?;
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
        Answer::Welcome(addrs) if addrs.len() == hello.world => Ok((addrs, mesh)),
        Answer::Welcome(addrs) => Err(rv(format!(
            "rank {}: rank 0 answered with {} addresses for a world of {}",
            hello.rank,
            addrs.len(),
            hello.world
        ))),
        Answer::Refuse(why) => Err(DistError::Refused { rank: hello.rank, why }),
    }
}

/// Connect to every lower rank and accept every higher one.
fn connect_mesh(rank: usize, addrs: &[String], listener: &TcpListener, deadline: Instant, timeout: Duration) -> Result<TcpWorld, DistError> {
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
                Err(e) if Instant::now() >= deadline => return Err(rv(format!("rank {rank} cannot reach rank {j} at {addr}: {e}"))),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        std::io::Write::write_all(&mut s, &(rank as u64).to_le_bytes()).map_err(|e| rv(format!("to rank {j}: {e}")))?;
        streams[j] = Some(s);
    }
    listener.set_nonblocking(true).map_err(|e| rv(e.to_string()))?;
    while streams.iter().skip(rank + 1).any(Option::is_none) {
        let missing = || (rank + 1..n).filter(|&r| streams[r].is_none()).collect::<Vec<usize>>();
        // Checked at every turn: connections that stay silent must not hold the wait
        // past the deadline.
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(rv(format!("rank {rank}: rank(s) {:?} never connected to the mesh within {timeout:.0?} (--timeout)", missing())));
        }
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false).map_err(|e| rv(e.to_string()))?;
                let mut id = [0u8; 8];
                s.set_read_timeout(Some(left.min(Duration::from_secs(5)))).map_err(|e| rv(e.to_string()))?;
                if std::io::Read::read_exact(&mut s, &mut id).is_err() {
                    continue;
                }
                s.set_read_timeout(None).map_err(|e| rv(e.to_string()))?;
                let from = u64::from_le_bytes(id) as usize;
                if from > rank && from < n && streams[from].is_none() {
                    streams[from] = Some(s);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(rv(format!("mesh accept: {e}"))),
        }
    }
    TcpWorld::new(rank, streams, timeout).map_err(rv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_exec::{HostCollective, ReduceOp};

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
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

    /// Start a thread per launch (in the order given), meet, and all-reduce each rank's
    /// number: what each rank got.
    fn meet_and_sum_ranks(launches: Vec<Launch>) -> Vec<f32> {
        let hs: Vec<_> = launches
            .into_iter()
            .map(|l| {
                std::thread::spawn(move || {
                    let w = rendezvous(&l, &meta("abc"), Duration::from_secs(20)).unwrap();
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
        let port = free_port();
        let sums = meet_and_sum_ranks((0..4).rev().map(|r| launch(r, 4, port)).collect());
        assert_eq!(sums, [6.0; 4]);
    }

    /// A rank whose plugin differs is refused on every rank, naming the plugin and both
    /// hashes.
    #[test]
    fn a_different_plugin_hash_is_refused_everywhere() {
        let port = free_port();
        let hs: Vec<_> = (0..3)
            .map(|r| {
                std::thread::spawn(move || {
                    let m = meta(if r == 2 { "def" } else { "abc" });
                    rendezvous(&launch(r, 3, port), &m, Duration::from_secs(20)).err().map(|e| e.to_string())
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
        let port = free_port();
        let zero = std::thread::spawn(move || rendezvous(&launch(0, 2, port), &meta("a"), Duration::from_secs(4)).map(|_| ()));
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
        let sums = meet_and_sum_ranks((0..2).map(|r| Launch { master: Some((name.clone(), port)), ..launch(r, 2, port) }).collect());
        assert_eq!(sums, [1.0; 2]);
    }

    /// A rank started twice: the copy that comes after the world met is refused at once,
    /// naming the rank, while the run goes on.
    #[test]
    fn a_rank_that_comes_after_the_world_met_is_refused_at_once() {
        let port = free_port();
        assert_eq!(meet_and_sum_ranks((0..2).map(|r| launch(r, 2, port)).collect()), [1.0; 2]);
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
        let port = free_port();
        let start = Instant::now();
        let first = std::thread::spawn(move || rendezvous(&launch(0, 3, port), &meta("a"), Duration::from_secs(20)).map(|_| ()));
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

    /// Rank 0's address only IPv6 (MASTER_ADDR=::1, a v6-only host): rank 0 listens on
    /// IPv6 and the mesh runs over it.
    #[test]
    fn ranks_meet_over_ipv6() {
        if TcpListener::bind("[::1]:0").is_err() {
            eprintln!("no IPv6 loopback here: skipped");
            return;
        }
        let port = free_port();
        let sums = meet_and_sum_ranks((0..3).map(|r| Launch { master: Some(("::1".into(), port)), ..launch(r, 3, port) }).collect());
        assert_eq!(sums, [3.0; 3]);
    }

    #[test]
    fn a_missing_rank_is_named_after_the_timeout() {
        let port = free_port();
        let e = rendezvous(&launch(0, 2, port), &meta("a"), Duration::from_millis(300)).unwrap_err().to_string();
        assert!(e.contains("rank(s) [1]") && e.contains("never connected") && e.contains("--timeout") && e.contains("300ms"), "{e}");
        let e = rendezvous(&launch(1, 2, free_port()), &meta("a"), Duration::from_millis(300)).unwrap_err().to_string();
        assert!(e.contains("gave up") && e.contains("MASTER_ADDR") && e.contains("--timeout"), "{e}");
        // Why the connection failed: here nothing listens.
        assert!(e.contains("refused"), "{e}");
        // A second rank 0 on the same port is told that it may be one.
        let first = std::net::TcpListener::bind(("0.0.0.0", port)).unwrap();
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
        let port = free_port();
        let zero = std::thread::spawn(move || rendezvous(&launch(0, world, port), &meta("a"), Duration::from_secs(4)).map(|_| ()).map_err(|e| e.to_string()));
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

    /// Rank 0 reading hellos by hand: a rank claimed twice is refused as such; a hello
    /// cut short by its connection's end (valid JSON, no newline) is not seated, so the
    /// real rank that comes next meets.
    #[test]
    fn rank_0_seats_whole_hellos_of_distinct_ranks() {
        let port = free_port();
        let zero = std::thread::spawn(move || rendezvous(&launch(0, 3, port), &meta("a"), Duration::from_secs(4)).map(|_| ()).map_err(|e| e.to_string()));
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

        let port = free_port();
        let zero = std::thread::spawn(move || rendezvous(&launch(0, 2, port), &meta("a"), Duration::from_secs(4)).map(|_| ()));
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
        let port = free_port();
        let zero = std::thread::spawn(move || rendezvous(&launch(0, 2, port), &meta("a"), Duration::from_secs(20)).map(|_| ()));
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
    fn rank_1_hears(answer: Option<&'static [u8]>) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut r = std::io::BufReader::new(s.try_clone().unwrap());
            let mut hello = String::new();
            std::io::BufRead::read_line(&mut r, &mut hello).unwrap();
            match answer {
                Some(a) => std::io::Write::write_all(&mut s, a).unwrap(),
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
        let e = rank_1_hears(Some(b"{\"Welcome\":[\"127.0"));
        assert!(e.contains("not a runner's rendezvous (a line too long, or cut short)"), "{e}");
        let e = rank_1_hears(Some(b"{\"Welcome\":[\"127.0.0.1:1\"]}\n"));
        assert!(e.contains("rank 0 answered with 1 addresses for a world of 2"), "{e}");
        let e = rank_1_hears(Some(b""));
        assert!(e.contains("rank 0 closed the rendezvous without an answer"), "{e}");
        let e = rank_1_hears(Some(b"{\"Refuse\":\"because\"}\n"));
        assert_eq!(e, "rank 1: because");
        let e = rank_1_hears(None);
        assert!(e.contains("gave up after 300ms") && e.contains("connected, but rank 0 did not answer"), "{e}");
    }

    /// After the world met, a silent connection to rank 0's port holds only its own
    /// thread: a rank started twice behind it is still refused at once.
    #[test]
    fn a_silent_latecomer_does_not_hold_the_refusals() {
        let port = free_port();
        assert_eq!(meet_and_sum_ranks((0..2).map(|r| launch(r, 2, port)).collect()), [1.0; 2]);
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
        let mut two = TcpStream::connect(at).unwrap();
        std::io::Write::write_all(&mut two, &2u64.to_le_bytes()).unwrap();
        let mut strays = Vec::new();
        for id in [0u64, 3, 1 << 40] {
            let mut s = TcpStream::connect(at).unwrap();
            std::io::Write::write_all(&mut s, &id.to_le_bytes()).unwrap();
            strays.push(s);
        }
        let silent = TcpStream::connect(at).unwrap();
        let start = Instant::now();
        let timeout = Duration::from_millis(300);
        let e = connect_mesh(0, &addrs, &mesh, start + timeout, timeout).unwrap_err().to_string();
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
        assert!(e.contains("rank(s) [1] never connected to the mesh within 300ms"), "{e}");
        drop((silent, strays, two));
        // Ranks 1 and 2 both say theirs: the mesh is whole. Around them, one that claims
        // this rank's own id (and leaves) and a second rank 2: neither is kept.
        let says = |id: u64| {
            let mut s = TcpStream::connect(at).unwrap();
            std::io::Write::write_all(&mut s, &id.to_le_bytes()).unwrap();
            s
        };
        drop(says(0));
        let (mut two, mut two_again, one) = (says(2), says(2), says(1));
        let w = connect_mesh(0, &addrs, &mesh, Instant::now() + timeout, timeout).unwrap();
        assert_eq!((w.rank(), w.size()), (0, 3));
        two_again.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        assert!(matches!(std::io::Read::read(&mut two_again, &mut [0u8; 1]), Ok(0)), "the second rank 2 was kept");
        two.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        assert!(std::io::Read::read(&mut two, &mut [0u8; 1]).is_err(), "the first rank 2 was dropped");
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(w.failure(), None, "a connection claiming rank 0 was taken for a peer");
        drop((one, two, two_again));
    }
}
