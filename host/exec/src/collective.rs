//! In-process collectives: the [`Collective`] trait the executor calls for the
//! communication ops of a sharded graph, and [`ThreadGroup`], an implementation over
//! shared memory for ranks that run as threads of one process (tests and CPU runs of a
//! sharded graph).
//!
//! Every reduction sums (or takes the max) in rank order on every rank, so all ranks get
//! bit-identical results and nothing depends on thread timing.
//!
//! Buffers are flat f32 slices; axis handling (gathering along a non-leading axis) is the
//! caller's: [`Collective::all_gather`] returns the ranks' buffers concatenated in rank
//! order.

use std::collections::VecDeque;
use std::sync::{Arc, Barrier, Condvar, Mutex};

use crate::device::ExecError;

/// Element-wise reduction of an all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
}

/// One rank's handle on a group of `size` ranks.
///
/// Every rank of the group must make the same sequence of calls with equal lengths (as
/// with NCCL); a rank that stops calling leaves the others waiting.
pub trait Collective: Send {
    /// This rank's index in the group.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// `buf` ← the element-wise reduction of every rank's `buf`, in rank order.
    ///
    /// # Errors
    /// Ranks passed different lengths.
    fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), ExecError>;
    /// Every rank's `input`, concatenated in rank order.
    ///
    /// # Errors
    /// Ranks passed different lengths.
    fn all_gather(&self, input: &[f32]) -> Result<Vec<f32>, ExecError>;
    /// Chunk `rank` (of `size` equal chunks) of the sum of every rank's `input`.
    ///
    /// # Errors
    /// Lengths differ or do not split into `size` chunks.
    fn reduce_scatter(&self, input: &[f32]) -> Result<Vec<f32>, ExecError>;
    /// Chunk j of `input` goes to rank j; the result holds, in rank order, the chunk each
    /// rank sent here.
    ///
    /// # Errors
    /// Lengths differ or do not split into `size` chunks.
    fn all_to_all(&self, input: &[f32]) -> Result<Vec<f32>, ExecError>;
    /// Queue `data` for rank `peer` (does not wait for the receive).
    ///
    /// # Errors
    /// `peer` outside the group.
    fn send(&self, peer: usize, data: &[f32]) -> Result<(), ExecError>;
    /// The next message rank `peer` sent here (waits for it).
    ///
    /// # Errors
    /// `peer` outside the group.
    fn recv(&self, peer: usize) -> Result<Vec<f32>, ExecError>;
}

fn err(what: String) -> ExecError {
    ExecError::State(format!("collective: {what}"))
}

struct Shared {
    n: usize,
    barrier: Barrier,
    /// One staging slot per rank for the current collective.
    slots: Mutex<Vec<Vec<f32>>>,
    /// Point-to-point queues, indexed `src * n + dst`.
    queues: Mutex<Vec<VecDeque<Vec<f32>>>>,
    arrived: Condvar,
}

/// A group of ranks that are threads of this process. [`ThreadGroup::new`] returns one
/// handle per rank; move each to its thread.
pub struct ThreadGroup {
    rank: usize,
    shared: Arc<Shared>,
}

impl ThreadGroup {
    /// Handles for `n` ranks (index = rank).
    pub fn new(n: usize) -> Vec<ThreadGroup> {
        let n = n.max(1);
        let shared = Arc::new(Shared {
            n,
            barrier: Barrier::new(n),
            slots: Mutex::new(vec![Vec::new(); n]),
            queues: Mutex::new((0..n * n).map(|_| VecDeque::new()).collect()),
            arrived: Condvar::new(),
        });
        (0..n)
            .map(|rank| ThreadGroup {
                rank,
                shared: Arc::clone(&shared),
            })
            .collect()
    }

    /// Publish `data`, wait for every rank, and return all ranks' data in rank order.
    fn exchange(&self, data: &[f32]) -> Result<Vec<Vec<f32>>, ExecError> {
        let s = &self.shared;
        {
            let mut slots = s.slots.lock().map_err(|_| err("poisoned".into()))?;
            slots[self.rank] = data.to_vec();
        }
        s.barrier.wait();
        let all = s.slots.lock().map_err(|_| err("poisoned".into()))?.clone();
        // Nobody overwrites a slot before every rank has read them all.
        s.barrier.wait();
        if let Some(bad) = all.iter().position(|v| v.len() != data.len()) {
            return Err(err(format!(
                "rank {} passed {} elements, rank {bad} passed {}",
                self.rank,
                data.len(),
                all[bad].len()
            )));
        }
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

impl Collective for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.n
    }

    fn all_reduce(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), ExecError> {
        let all = self.exchange(buf)?;
        for (i, b) in buf.iter_mut().enumerate() {
            let mut acc = all[0][i];
            for r in &all[1..] {
                acc = match op {
                    ReduceOp::Sum => acc + r[i],
                    ReduceOp::Max => acc.max(r[i]),
                };
            }
            *b = acc;
        }
        Ok(())
    }

    fn all_gather(&self, input: &[f32]) -> Result<Vec<f32>, ExecError> {
        Ok(self.exchange(input)?.concat())
    }

    fn reduce_scatter(&self, input: &[f32]) -> Result<Vec<f32>, ExecError> {
        let c = self.chunk(input.len())?;
        let all = self.exchange(input)?;
        let lo = self.rank * c;
        Ok((lo..lo + c)
            .map(|i| {
                let mut acc = all[0][i];
                for r in &all[1..] {
                    acc += r[i];
                }
                acc
            })
            .collect())
    }

    fn all_to_all(&self, input: &[f32]) -> Result<Vec<f32>, ExecError> {
        let c = self.chunk(input.len())?;
        let all = self.exchange(input)?;
        let lo = self.rank * c;
        Ok(all
            .iter()
            .flat_map(|r| r[lo..lo + c].iter().copied())
            .collect())
    }

    fn send(&self, peer: usize, data: &[f32]) -> Result<(), ExecError> {
        self.peer(peer)?;
        let s = &self.shared;
        let mut q = s.queues.lock().map_err(|_| err("poisoned".into()))?;
        q[self.rank * s.n + peer].push_back(data.to_vec());
        s.arrived.notify_all();
        Ok(())
    }

    fn recv(&self, peer: usize) -> Result<Vec<f32>, ExecError> {
        self.peer(peer)?;
        let s = &self.shared;
        let mut q = s.queues.lock().map_err(|_| err("poisoned".into()))?;
        loop {
            if let Some(m) = q[peer * s.n + self.rank].pop_front() {
                return Ok(m);
            }
            q = s.arrived.wait(q).map_err(|_| err("poisoned".into()))?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn g_peer_checked() -> bool {
        let g = ThreadGroup::new(1).pop().unwrap();
        g.send(1, &[0.0]).is_err() && g.recv(5).is_err()
    }
}
