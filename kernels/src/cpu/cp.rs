//! Context parallelism's token layout: which global positions the rows of a
//! sequence-sharded tensor hold (Megatron-LM's load-balanced causal split).
//!
//! The global sequence of `size·T` tokens is cut into `2·size` chunks of `T/2`; rank
//! `r` holds chunk `r` and chunk `2·size − 1 − r`, in that order, as its `T` local rows
//! (so every rank gets the same share of causal attention work). The K/V all-gather
//! over the cp group concatenates the ranks' local rows in rank order, so a gathered
//! tensor's `size·T` rows are rank 0's two chunks, then rank 1's, and so on.
//!
//! The kernels that need positions ([`super::rope`], [`super::attention`]) walk rows as
//! [`Run`]s: stretches of rows whose global positions are consecutive.

use crate::{Result, shape_err};

/// One rank of a context-parallel group of `size` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpShard {
    /// Ranks in the cp group (>= 1).
    pub size: usize,
    /// This rank (< `size`).
    pub rank: usize,
}

/// Rows `row..row + len` of a buffer hold global positions `pos..pos + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// First row (in the buffer's row order).
    pub row: usize,
    /// Global position of that row.
    pub pos: usize,
    /// Rows in the run.
    pub len: usize,
}

impl CpShard {
    /// Checks `size >= 1`, `rank < size` and that `t` local rows split into two chunks.
    pub(crate) fn check(&self, what: &str, t: usize) -> Result<()> {
        if self.size == 0 || self.rank >= self.size {
            return shape_err(format!(
                "{what}: cp rank {} outside a group of {}",
                self.rank, self.size
            ));
        }
        if !t.is_multiple_of(2) {
            return shape_err(format!(
                "{what}: {t} local rows do not split into the two chunks of a cp rank"
            ));
        }
        if t.checked_mul(self.size).is_none() {
            return shape_err(format!("{what}: {t}·{} rows overflow", self.size));
        }
        Ok(())
    }

    /// The chunks (of `2·size`) rank `r` holds, in its row order.
    fn chunks(&self, r: usize) -> [usize; 2] {
        [r, 2 * self.size - 1 - r]
    }

    /// Rank `r`'s `t` local rows, starting at buffer row `row0`, as two runs.
    fn rank_runs(&self, r: usize, t: usize, row0: usize) -> [Run; 2] {
        let c = t / 2;
        let [a, b] = self.chunks(r);
        [
            Run {
                row: row0,
                pos: a * c,
                len: c,
            },
            Run {
                row: row0 + c,
                pos: b * c,
                len: c,
            },
        ]
    }

    /// This rank's `t` local rows (`t` even).
    pub fn local_runs(&self, t: usize) -> [Run; 2] {
        self.rank_runs(self.rank, t, 0)
    }

    /// The `size·t` rows gathered over the cp group: every rank's local rows, in rank
    /// order.
    pub fn gathered_runs(&self, t: usize) -> Vec<Run> {
        (0..self.size)
            .flat_map(|r| self.rank_runs(r, t, r * t))
            .collect()
    }

    /// Global position of local row `i` of `t` (`t` even).
    pub fn position(&self, t: usize, i: usize) -> usize {
        let c = t / 2;
        self.chunks(self.rank)[i / c] * c + i % c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_follow_megatrons_load_balanced_split() {
        // cp = 2, 8 global tokens in 4 chunks of 2: rank 0 holds chunks 0 and 3, rank 1
        // chunks 1 and 2; gathered: rank 0's rows, then rank 1's.
        let s = CpShard { size: 2, rank: 1 };
        let pos: Vec<usize> = (0..4).map(|i| s.position(4, i)).collect();
        assert_eq!(pos, [2, 3, 4, 5]);
        let s0 = CpShard { size: 2, rank: 0 };
        let pos: Vec<usize> = (0..4).map(|i| s0.position(4, i)).collect();
        assert_eq!(pos, [0, 1, 6, 7]);
        let rows: Vec<usize> = s
            .gathered_runs(4)
            .iter()
            .flat_map(|r| r.pos..r.pos + r.len)
            .collect();
        assert_eq!(rows, [0, 1, 6, 7, 2, 3, 4, 5]);
        for (k, run) in s.gathered_runs(4).iter().enumerate() {
            assert_eq!(run.row, 2 * k);
        }
        assert!(CpShard { size: 2, rank: 2 }.check("x", 4).is_err());
        assert!(CpShard { size: 0, rank: 0 }.check("x", 4).is_err());
        assert!(s.check("x", 3).is_err());
        assert!(s.check("x", 0).is_ok());
    }
}
