//! Token embedding lookup (`nn.Embedding`) and its scatter-add backward.
//!
//! Shapes: tokens (N), weight (V,C), out (N,C), N = B*T.
//!
//! Token ids come from user data, so an id >= V is an error
//! ([`KernelError::TokenOutOfRange`]), found before anything is written.
//! The backward is a scatter-add into the rows of dweight; to parallelise it without
//! atomics or per-thread copies of a (V,C) table, tokens are first bucketed by id
//! (a counting sort), then each vocabulary row sums its own tokens' gradients, in
//! token order, so the result is deterministic.

use super::rows_per_task;
use crate::{KernelError, Result, check_len, rows_of};
use rayon::prelude::*;

fn check_tokens(tokens: &[u32], vocab: usize) -> Result<()> {
    match tokens.iter().find(|&&t| t as usize >= vocab) {
        Some(&token) => Err(KernelError::TokenOutOfRange { token, vocab }),
        None => Ok(()),
    }
}

/// out (N,C) = weight[tokens[n], :]; tokens (N); weight (V,C) with V = weight.len()/c.
/// Saves nothing (the backward needs only the tokens).
///
/// # Errors
/// `TokenOutOfRange` for an id >= V; `ShapeMismatch` for inconsistent lengths.
pub fn embedding_forward(out: &mut [f32], tokens: &[u32], weight: &[f32], c: usize) -> Result<()> {
    let vocab = rows_of("embedding weight", weight.len(), c)?;
    check_len("embedding out", out.len(), tokens.len().saturating_mul(c))?;
    check_tokens(tokens, vocab)?;
    out.par_chunks_mut(c * rows_per_task(c))
        .enumerate()
        .for_each(|(blk, o)| {
            let t0 = blk * rows_per_task(c);
            for (row, &t) in o.chunks_mut(c).zip(&tokens[t0..]) {
                row.copy_from_slice(&weight[t as usize * c..(t as usize + 1) * c]);
            }
        });
    Ok(())
}

/// dweight (V,C) += Σ over positions n with tokens[n] = v of dout[n, :]; dout (N,C).
///
/// # Errors
/// As [`embedding_forward`].
pub fn embedding_backward(
    dweight: &mut [f32],
    dout: &[f32],
    tokens: &[u32],
    c: usize,
) -> Result<()> {
    let vocab = rows_of("embedding dweight", dweight.len(), c)?;
    check_len("embedding dout", dout.len(), tokens.len().saturating_mul(c))?;
    check_tokens(tokens, vocab)?;
    // Counting sort of positions by token id: positions of id v are
    // order[start[v]..start[v+1]], ascending.
    let mut start = vec![0usize; vocab + 1];
    for &t in tokens {
        start[t as usize + 1] += 1;
    }
    for v in 0..vocab {
        start[v + 1] += start[v];
    }
    let mut fill = start.clone();
    let mut order = vec![0usize; tokens.len()];
    for (n, &t) in tokens.iter().enumerate() {
        order[fill[t as usize]] = n;
        fill[t as usize] += 1;
    }
    dweight.par_chunks_mut(c).enumerate().for_each(|(v, dw)| {
        for &n in &order[start[v]..start[v + 1]] {
            for (a, b) in dw.iter_mut().zip(&dout[n * c..(n + 1) * c]) {
                *a += b;
            }
        }
    });
    Ok(())
}

/// One vocab-parallel shard of an embedding (Megatron's `VocabParallelEmbedding`): the
/// table (V/tp, C) holds ids `start..start + rows`; out (N,C) = the row of each id in
/// the shard and zeros for the others (the all-reduce over tp that follows sums the
/// shards). Ids outside the shard are not errors: another rank holds them.
///
/// # Errors
/// `ShapeMismatch` for inconsistent lengths.
pub fn embedding_shard_forward(
    out: &mut [f32],
    tokens: &[u32],
    weight: &[f32],
    c: usize,
    start: usize,
) -> Result<()> {
    let rows = rows_of("embedding weight", weight.len(), c)?;
    check_len("embedding out", out.len(), tokens.len().saturating_mul(c))?;
    out.par_chunks_mut(c * rows_per_task(c))
        .enumerate()
        .for_each(|(blk, o)| {
            let t0 = blk * rows_per_task(c);
            for (row, &t) in o.chunks_mut(c).zip(&tokens[t0..]) {
                match (t as usize).checked_sub(start).filter(|&r| r < rows) {
                    Some(r) => row.copy_from_slice(&weight[r * c..(r + 1) * c]),
                    None => row.fill(0.0),
                }
            }
        });
    Ok(())
}

/// dweight (V/tp, C) += the rows of dout whose ids this shard holds (see
/// [`embedding_shard_forward`]), each table row summing its positions in token order.
///
/// # Errors
/// `ShapeMismatch` for inconsistent lengths.
pub fn embedding_shard_backward(
    dweight: &mut [f32],
    dout: &[f32],
    tokens: &[u32],
    c: usize,
    start: usize,
) -> Result<()> {
    let rows = rows_of("embedding dweight", dweight.len(), c)?;
    check_len("embedding dout", dout.len(), tokens.len().saturating_mul(c))?;
    let local = |t: u32| (t as usize).checked_sub(start).filter(|&r| r < rows);
    let mut first = vec![0usize; rows + 1];
    for &t in tokens {
        if let Some(r) = local(t) {
            first[r + 1] += 1;
        }
    }
    for r in 0..rows {
        first[r + 1] += first[r];
    }
    let mut fill = first.clone();
    let mut order = vec![0usize; first[rows]];
    for (n, &t) in tokens.iter().enumerate() {
        if let Some(r) = local(t) {
            order[fill[r]] = n;
            fill[r] += 1;
        }
    }
    dweight.par_chunks_mut(c).enumerate().for_each(|(r, dw)| {
        for &n in &order[first[r]..first[r + 1]] {
            for (a, b) in dw.iter_mut().zip(&dout[n * c..(n + 1) * c]) {
                *a += b;
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{self as r, check::*};
    use rand::Rng as _;

    #[test]
    fn embedding_forward_matches_reference() {
        let mut rng = rng(10);
        for &(n, v, c) in &[(1, 1, 1), (7, 5, 13), (300, 50, 64), (4096, 33, 9)] {
            let w = randn(&mut rng, v * c);
            let tokens: Vec<u32> = (0..n).map(|_| rng.random_range(0..v as u32)).collect();
            let mut out = vec![f32::NAN; n * c];
            embedding_forward(&mut out, &tokens, &w, c).unwrap();
            // a copy: exact
            assert_close(
                "embedding",
                &out,
                &r::embedding(&tokens, &f64s(&w), c),
                0.0,
                0.0,
            );
        }
    }

    #[test]
    fn embedding_backward_matches_finite_differences_and_accumulates() {
        let mut rng = rng(11);
        for &(n, v, c) in &[(1, 3, 1), (7, 5, 13), (3000, 40, 3)] {
            let w = randn(&mut rng, v * c);
            // repeated ids on purpose (n > v) so rows sum several positions
            let tokens: Vec<u32> = (0..n).map(|_| rng.random_range(0..v as u32)).collect();
            let rr = randn(&mut rng, n * c);
            let dw0 = randn(&mut rng, v * c);
            let mut dw = dw0.clone();
            embedding_backward(&mut dw, &rr, &tokens, c).unwrap();
            let wf = f64s(&w);
            let idx = some(&mut rng, v * c, 60);
            let fd = fd_grad(&wf, &idx, |wp| loss(&r::embedding(&tokens, wp, c), &rr));
            let delta: Vec<f32> = idx.iter().map(|&i| dw[i] - dw0[i]).collect();
            // sums of up to ~n/v f32 terms of size 1: 1e-5 relative is ample
            assert_close("embedding dweight (+=)", &delta, &fd, 1e-5, 1e-5);
        }
    }

    #[test]
    fn embedding_rejects_bad_tokens_without_writing() {
        let w = vec![1.0f32; 4 * 3];
        let mut out = vec![f32::NAN; 2 * 3];
        let err = embedding_forward(&mut out, &[0, 4], &w, 3).unwrap_err();
        assert_eq!(err, KernelError::TokenOutOfRange { token: 4, vocab: 4 });
        assert!(out.iter().all(|x| x.is_nan()));
        let mut dw = vec![0.0f32; 12];
        assert!(embedding_backward(&mut dw, &[0.0; 6], &[1, u32::MAX], 3).is_err());
        assert!(dw.iter().all(|&x| x == 0.0));
        assert!(embedding_forward(&mut out, &[0, 1], &w, 0).is_err());
        assert!(embedding_forward(&mut out, &[0], &w, 3).is_err());
        assert!(embedding_forward(&mut out, &[0, 1], &w[..11], 3).is_err());
    }

    /// A row sums its positions' gradients in token order, whole table and shard alike
    /// (so a tp-sharded table's gradient is the unsharded one bit for bit). Values where
    /// f32 addition order shows: 1 + 1e8 − 1e8 is 0 left to right, 1 right to left. The
    /// other tests' random rows of ~3 terms sum alike in either order.
    #[test]
    fn embedding_rows_sum_their_gradients_in_token_order() {
        let tokens = [2u32, 0, 2, 2];
        let dout = [1.0f32, 5.0, 1e8, -1e8];
        let mut dw = vec![0.0f32; 3];
        embedding_backward(&mut dw, &dout, &tokens, 1).unwrap();
        assert_eq!(dw, [5.0, 0.0, 0.0]);
        let mut ds = vec![0.0f32; 2];
        embedding_shard_backward(&mut ds, &dout, &tokens, 1, 1).unwrap();
        assert_eq!(ds, [0.0, 0.0]);
    }

    #[test]
    fn a_vocab_shard_reads_and_updates_only_its_rows() {
        let mut rng = rng(12);
        let (v, c, n, tp) = (12, 5, 40, 3);
        let w = randn(&mut rng, v * c);
        let tokens: Vec<u32> = (0..n).map(|_| rng.random_range(0..v as u32)).collect();
        let dout = randn(&mut rng, n * c);
        let mut whole = vec![0.0; n * c];
        embedding_forward(&mut whole, &tokens, &w, c).unwrap();
        let mut dwhole = vec![0.0; v * c];
        embedding_backward(&mut dwhole, &dout, &tokens, c).unwrap();
        let rows = v / tp;
        let mut sum = vec![0.0f32; n * c];
        for s in 0..tp {
            let shard = &w[s * rows * c..(s + 1) * rows * c];
            let mut out = vec![f32::NAN; n * c];
            embedding_shard_forward(&mut out, &tokens, shard, c, s * rows).unwrap();
            for (a, b) in sum.iter_mut().zip(&out) {
                *a += b;
            }
            let mut dw = vec![0.0; rows * c];
            embedding_shard_backward(&mut dw, &dout, &tokens, c, s * rows).unwrap();
            // the same additions in the same order as the whole table's rows
            assert_eq!(dw, dwhole[s * rows * c..(s + 1) * rows * c]);
        }
        // exactly one shard holds each id, the others add zeros
        assert_eq!(sum, whole);
    }
}
