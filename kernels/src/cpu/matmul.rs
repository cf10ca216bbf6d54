//! Dense GEMM: `c = op(a) · op(b) [+ c]`, the workhorse of every Linear layer.
//!
//! This is the one kernel that is not hand-written: it routes through faer's
//! `linalg::matmul::matmul` (measured ~190 GFLOP/s on 2 cores at 1024³), viewing the row-major slices as faer matrices
//! with strides, so transposes cost nothing. Small products run on the calling thread
//! (rayon dispatch would cost more than the work). Larger ones are cut into blocks of
//! [`BLOCK`] rows or columns of c (along the longer side), each a single-threaded faer
//! GEMM, run as rayon tasks: on the training-step shapes (K of 256..8192, one side
//! 256..688) this is 1.3-2× faster on 2 cores than faer's own parallel split, which
//! synchronises its threads inside every product. The blocks are fixed, not derived
//! from the thread count, so results do not depend on it.
//!
//! Shapes: op(a) is (M,K), op(b) is (K,N), c is (M,N). A Linear layer with weight W
//! (out,in) and input x (N,in) is `y = x · W^T` = `Gemm { m: N, n: out, k: in,
//! trans_b: true }`; its backward is `dx = dy · W` (no transposes) and
//! `dW += dy^T · x` (`trans_a`, `accumulate`). The tests check exactly these recipes
//! against finite differences.

use super::clear_upper;
use crate::{Result, check_len, numel};
use faer::linalg::matmul::matmul as faer_matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

/// One GEMM's shape: `c (m,n) = op(a) (m,k) · op(b) (k,n)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    /// Rows of op(a) and c.
    pub m: usize,
    /// Columns of op(b) and c.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// `a` is stored (K,M) and used transposed.
    pub trans_a: bool,
    /// `b` is stored (N,K) and used transposed.
    pub trans_b: bool,
}

/// Below this many multiply-adds a GEMM runs single-threaded: faer's parallel
/// path has a fixed cost of a few microseconds, which is the whole run time of a
/// 32³ product.
pub(crate) const PAR_MIN_FLOPS: usize = 1 << 18;

/// Most rows or columns of c per task of a blocked GEMM (see the module docs): large
/// enough that faer's packing amortises.
pub(crate) const BLOCK: usize = 256;

/// Block length for a side of `len`: [`BLOCK`], or smaller (a multiple of 64, at
/// least 64) so that the side splits into about 4 tasks; from the shape alone.
fn block_for(len: usize) -> usize {
    (len / 4 / 64 * 64).clamp(64, BLOCK)
}

/// One leaf of [`gemm_blocked`]: a single-threaded faer product.
///
/// A column-major `a` (a `trans_a` operand: the rows of dy in `dW += dyᵀ·x`) whose
/// column stride is a multiple of 512 floats is first copied into a scratch block
/// with a padded stride: with the lm_head's dlogits (stride 8192 = 32 KiB) every
/// column of a packing panel fell into the same cache sets, and the product ran at
/// half speed (97 vs 190 GFLOP/s). The copy is 1/(2·N) of the product's flops.
fn gemm_leaf(c: MatMut<'_, f32>, a: MatRef<'_, f32>, b: MatRef<'_, f32>, accum: Accum) {
    let (m, k) = (a.nrows(), a.ncols());
    let cs = a.col_stride();
    if a.row_stride() == 1 && cs >= 2048 && cs % 512 == 0 && k >= 256 {
        let ld = m.next_multiple_of(16) + 16;
        let mut buf = vec![0f32; ld * k];
        for (j, dst) in buf.chunks_exact_mut(ld).enumerate() {
            match a.col(j).try_as_col_major() {
                Some(col) => dst[..m].copy_from_slice(col.as_slice()),
                None => dst[..m]
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x = a[(i, j)]),
            }
        }
        let ap = MatRef::from_column_major_slice_with_stride(&buf, m, k, ld);
        faer_matmul(c, accum, ap, b, 1.0f32, Par::Seq);
    } else {
        faer_matmul(c, accum, a, b, 1.0f32, Par::Seq);
    }
    clear_upper();
}

/// `Par::Seq` for products too small to split, else the parallel (blocked) path. Depends
/// only on the shape, so the blocking, and with it every bit of the result, is the same
/// for any thread count.
pub(crate) fn par_for(g: &Gemm) -> Par {
    if g.m.saturating_mul(g.n).saturating_mul(g.k) < PAR_MIN_FLOPS {
        Par::Seq
    } else {
        Par::rayon(rayon::current_num_threads().max(1))
    }
}

/// Side of the square tiles a product large in both output dimensions is cut into.
pub(crate) const TILE: usize = 512;

/// c = a·b (+ c) over leaves cut from c by shape alone, split in halves at leaf
/// boundaries with `rayon::join`, so the leaves are the same whatever the thread count.
///
/// When c is at least 2·[`TILE`] on both sides (square-ish products), the leaves are
/// `TILE`×`TILE` tiles: every leaf repacks its panels of a and b, and square tiles
/// repack the least per FLOP (1/rows + 1/cols of the product). Row blocks of the whole
/// width, the other case's leaves, re-read all of b per block: at 2048³ and 4096³ the
/// tiles measured 5-25 % faster (docs/PERFORMANCE.md). Otherwise (one side short, as in
/// the training-step shapes) the leaves are blocks of [`BLOCK`] rows or columns along
/// the longer side.
fn gemm_blocked(
    c: MatMut<'_, f32>,
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    accum: Accum,
    rows: bool,
) {
    let (m, n) = (c.nrows(), c.ncols());
    let (row_blk, col_blk) = if m >= 2 * TILE && n >= 2 * TILE {
        (TILE, TILE)
    } else if rows {
        (block_for(m), usize::MAX)
    } else {
        (usize::MAX, block_for(n))
    };
    split_blocks(c, a, b, accum, row_blk, col_blk);
}

/// Halve c's rows at a multiple of `row_blk` until a leaf has at most `row_blk` rows,
/// then its columns likewise; the leaves run as rayon tasks.
fn split_blocks(
    c: MatMut<'_, f32>,
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    accum: Accum,
    row_blk: usize,
    col_blk: usize,
) {
    let (m, n) = (c.nrows(), c.ncols());
    if m > row_blk {
        let at = m.div_ceil(row_blk).div_ceil(2) * row_blk;
        let (c0, c1) = c.split_at_row_mut(at);
        let (a0, a1) = a.split_at_row(at);
        rayon::join(
            || split_blocks(c0, a0, b, accum, row_blk, col_blk),
            || split_blocks(c1, a1, b, accum, row_blk, col_blk),
        );
    } else if n > col_blk {
        let at = n.div_ceil(col_blk).div_ceil(2) * col_blk;
        let (c0, c1) = c.split_at_col_mut(at);
        let (b0, b1) = b.split_at_col(at);
        rayon::join(
            || split_blocks(c0, a, b0, accum, row_blk, col_blk),
            || split_blocks(c1, a, b1, accum, row_blk, col_blk),
        );
    } else {
        gemm_leaf(c, a, b, accum);
    }
}

fn check(c: usize, a: usize, b: usize, g: &Gemm, batch: usize) -> Result<()> {
    check_len("matmul a", a, numel(&[batch, g.m, g.k])?)?;
    check_len("matmul b", b, numel(&[batch, g.k, g.n])?)?;
    check_len("matmul c", c, numel(&[batch, g.m, g.n])?)?;
    Ok(())
}

/// The GEMM proper, lengths already checked.
pub(crate) fn gemm_unchecked(
    c: &mut [f32],
    a: &[f32],
    b: &[f32],
    g: Gemm,
    accumulate: bool,
    par: Par,
) {
    if g.m == 0 || g.n == 0 {
        return;
    }
    if g.k == 0 {
        if !accumulate {
            c.fill(0.0);
        }
        return;
    }
    let a = if g.trans_a {
        MatRef::from_row_major_slice(a, g.k, g.m).transpose()
    } else {
        MatRef::from_row_major_slice(a, g.m, g.k)
    };
    let b = if g.trans_b {
        MatRef::from_row_major_slice(b, g.n, g.k).transpose()
    } else {
        MatRef::from_row_major_slice(b, g.k, g.n)
    };
    let c = MatMut::from_row_major_slice_mut(c, g.m, g.n);
    let accum = if accumulate {
        Accum::Add
    } else {
        Accum::Replace
    };
    match par {
        Par::Seq => {
            faer_matmul(c, accum, a, b, 1.0f32, Par::Seq);
            clear_upper();
        }
        _ => gemm_blocked(c, a, b, accum, g.m >= g.n),
    }
}

/// c (M,N) = op(a) · op(b) [+ c if accumulate]; op(a) is (M,K): a stored (M,K) or, if
/// trans_a, (K,M); op(b) is (K,N): b stored (K,N) or, if trans_b, (N,K).
///
/// # Errors
/// `ShapeMismatch` unless `a`, `b`, `c` hold exactly M·K, K·N and M·N elements.
pub fn matmul(c: &mut [f32], a: &[f32], b: &[f32], g: Gemm, accumulate: bool) -> Result<()> {
    check(c.len(), a.len(), b.len(), &g, 1)?;
    gemm_unchecked(c, a, b, g, accumulate, par_for(&g));
    Ok(())
}

/// Batched: `batch` independent GEMMs laid out back to back (strides m*k, k*n, m*n),
/// e.g. per-head products. Small GEMMs run one per rayon task; large ones one after
/// another, each using all threads.
///
/// # Errors
/// `ShapeMismatch` unless the slices hold exactly `batch` times the sizes of [`matmul`].
pub fn matmul_batched(
    c: &mut [f32],
    a: &[f32],
    b: &[f32],
    g: Gemm,
    batch: usize,
    accumulate: bool,
) -> Result<()> {
    check(c.len(), a.len(), b.len(), &g, batch)?;
    let (sa, sb, sc) = (g.m * g.k, g.k * g.n, g.m * g.n);
    if batch == 0 || sc == 0 {
        return Ok(());
    }
    let par = par_for(&g);
    match par {
        Par::Seq if batch > 1 => {
            c.par_chunks_mut(sc).enumerate().for_each(|(i, ci)| {
                let ai = if sa == 0 {
                    &a[..0]
                } else {
                    &a[i * sa..(i + 1) * sa]
                };
                let bi = if sb == 0 {
                    &b[..0]
                } else {
                    &b[i * sb..(i + 1) * sb]
                };
                gemm_unchecked(ci, ai, bi, g, accumulate, Par::Seq);
            });
        }
        _ => {
            for (i, ci) in c.chunks_mut(sc).enumerate() {
                gemm_unchecked(
                    ci,
                    &a[i * sa..(i + 1) * sa],
                    &b[i * sb..(i + 1) * sb],
                    g,
                    accumulate,
                    par,
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{self as r, check::*};

    fn run_case(m: usize, n: usize, k: usize, ta: bool, tb: bool, acc: bool, rng: &mut Rng) {
        let g = Gemm {
            m,
            n,
            k,
            trans_a: ta,
            trans_b: tb,
        };
        let a = randn(rng, m * k);
        let b = randn(rng, k * n);
        let c0 = randn(rng, m * n);
        let mut c = if acc {
            c0.clone()
        } else {
            vec![f32::NAN; m * n]
        };
        matmul(&mut c, &a, &b, g, acc).unwrap();
        let mut want = r::matmul(&f64s(&a), &f64s(&b), m, n, k, ta, tb);
        if acc {
            for (w, c0) in want.iter_mut().zip(&c0) {
                *w += *c0 as f64;
            }
        }
        // f32 accumulation over K terms of size ~1: error ~ sqrt(K)·eps·|a||b|; K <= 300.
        assert_close(
            &format!("matmul {m}x{n}x{k} ta={ta} tb={tb} acc={acc}"),
            &c,
            &want,
            1e-4,
            1e-4,
        );
    }

    #[test]
    fn matmul_matches_reference_all_transposes() {
        let mut rng = rng(1);
        for &(m, n, k) in &[
            (1, 1, 1),
            (7, 13, 5),
            (33, 17, 65),
            (64, 64, 64),
            (130, 70, 300),
            (5, 0, 3),
            (4, 6, 0),
        ] {
            for ta in [false, true] {
                for tb in [false, true] {
                    for acc in [false, true] {
                        run_case(m, n, k, ta, tb, acc, &mut rng);
                    }
                }
            }
        }
    }

    #[test]
    fn matmul_large_parallel_path() {
        // Big enough to take faer's multithreaded path.
        let mut rng = rng(2);
        run_case(257, 129, 200, false, true, false, &mut rng);
        run_case(200, 300, 129, true, false, true, &mut rng);
        // uneven blocks (block_for) and a trans_a operand with a 2048-float stride,
        // which gemm_leaf copies to a padded scratch block first
        run_case(2048, 40, 256, true, false, true, &mut rng);
        run_case(70, 2048, 300, true, false, false, &mut rng);
        // Large in both output dimensions: square tiles, the last ones ragged.
        run_case(1100, 1030, 40, false, true, true, &mut rng);
    }

    /// The leaves come from the shape alone, so the bits do not depend on the threads.
    #[test]
    fn matmul_bits_do_not_depend_on_the_thread_count() {
        let mut rng = rng(9);
        for &(m, n, k) in &[(1100usize, 1030usize, 64usize), (700, 300, 96)] {
            let a = randn(&mut rng, m * k);
            let b = randn(&mut rng, k * n);
            let g = Gemm {
                m,
                n,
                k,
                trans_a: false,
                trans_b: false,
            };
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut c = vec![0f32; m * n];
                pool.install(|| matmul(&mut c, &a, &b, g, false).unwrap());
                c
            };
            let one = run(1);
            for t in [2, 3] {
                assert!(
                    run(t)
                        .iter()
                        .zip(&one)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{m}x{n}x{k}, {t} threads"
                );
            }
        }
    }

    #[test]
    fn matmul_batched_matches_per_batch() {
        let mut rng = rng(3);
        for &(m, n, k, batch, tb) in &[
            (7, 5, 3, 4, false),
            (2, 3, 4, 1, true),
            (70, 65, 80, 3, true),
        ] {
            let g = Gemm {
                m,
                n,
                k,
                trans_a: false,
                trans_b: tb,
            };
            let a = randn(&mut rng, batch * m * k);
            let b = randn(&mut rng, batch * k * n);
            let mut c = vec![f32::NAN; batch * m * n];
            matmul_batched(&mut c, &a, &b, g, batch, false).unwrap();
            for i in 0..batch {
                let want = r::matmul(
                    &f64s(&a[i * m * k..(i + 1) * m * k]),
                    &f64s(&b[i * k * n..(i + 1) * k * n]),
                    m,
                    n,
                    k,
                    false,
                    tb,
                );
                assert_close(
                    "matmul_batched",
                    &c[i * m * n..(i + 1) * m * n],
                    &want,
                    1e-4,
                    1e-4,
                );
            }
            // accumulate: c += same product again -> 2x
            let c1 = c.clone();
            matmul_batched(&mut c, &a, &b, g, batch, true).unwrap();
            for (x, y) in c.iter().zip(&c1) {
                assert!((x - 2.0 * y).abs() <= 1e-5 * (1.0 + y.abs()));
            }
        }
    }

    /// Batched products with an empty dimension: M or N of 0 is an empty c (and no
    /// chunks of length 0 to cut it into, which would panic); K of 0 is c = 0, or c kept
    /// when accumulating.
    #[test]
    fn matmul_batched_handles_empty_dimensions() {
        let batch = 3;
        for (m, n, k) in [(0, 4, 3), (3, 0, 4), (3, 4, 0)] {
            let g = Gemm {
                m,
                n,
                k,
                trans_a: false,
                trans_b: true,
            };
            let (a, b) = (vec![1.0; batch * m * k], vec![1.0; batch * k * n]);
            let mut c = vec![f32::NAN; batch * m * n];
            matmul_batched(&mut c, &a, &b, g, batch, false).unwrap();
            assert!(c.iter().all(|&x| x == 0.0), "{m}x{n}x{k}");
            let mut c = vec![2.5; batch * m * n];
            matmul_batched(&mut c, &a, &b, g, batch, true).unwrap();
            assert!(c.iter().all(|&x| x == 2.5), "{m}x{n}x{k}");
        }
    }

    #[test]
    fn matmul_rejects_bad_lengths() {
        let g = Gemm {
            m: 2,
            n: 3,
            k: 4,
            trans_a: false,
            trans_b: false,
        };
        let mut c = vec![0.0; 6];
        assert!(matmul(&mut c, &[0.0; 7], &[0.0; 12], g, false).is_err());
        assert!(matmul(&mut c, &[0.0; 8], &[0.0; 11], g, false).is_err());
        assert!(matmul(&mut c[..5], &[0.0; 8], &[0.0; 12], g, false).is_err());
        let huge = Gemm {
            m: usize::MAX,
            n: 2,
            k: 2,
            trans_a: false,
            trans_b: false,
        };
        assert!(matmul(&mut c, &[0.0; 8], &[0.0; 12], huge, false).is_err());
        assert!(matmul_batched(&mut c, &[0.0; 8], &[0.0; 12], g, 2, false).is_err());
    }

    /// The Linear-layer backward recipes documented at the top of this file,
    /// checked against finite differences of y = x · W^T.
    #[test]
    fn linear_backward_recipes_match_finite_differences() {
        let mut rng = rng(4);
        let (n, din, dout) = (5, 7, 3);
        let x = randn(&mut rng, n * din);
        let w = randn(&mut rng, dout * din);
        let rr = randn(&mut rng, n * dout);
        let fwd = |x: &[f64], w: &[f64]| r::matmul(x, w, n, dout, din, false, true);
        let mut dx = vec![f32::NAN; n * din];
        matmul(
            &mut dx,
            &rr,
            &w,
            Gemm {
                m: n,
                n: din,
                k: dout,
                trans_a: false,
                trans_b: false,
            },
            false,
        )
        .unwrap();
        let dw0 = randn(&mut rng, dout * din);
        let mut dw = dw0.clone();
        matmul(
            &mut dw,
            &rr,
            &x,
            Gemm {
                m: dout,
                n: din,
                k: n,
                trans_a: true,
                trans_b: false,
            },
            true,
        )
        .unwrap();
        let (xf, wf, rf) = (f64s(&x), f64s(&w), f64s(&rr));
        let fd_x = fd_grad(&xf, &all(xf.len()), |xp| dot64(&fwd(xp, &wf), &rf));
        let fd_w = fd_grad(&wf, &all(wf.len()), |wp| dot64(&fwd(&xf, wp), &rf));
        assert_close("linear dx", &dx, &fd_x, 1e-4, 1e-4);
        let dw_delta: Vec<f32> = dw.iter().zip(&dw0).map(|(a, b)| a - b).collect();
        assert_close("linear dW (+=)", &dw_delta, &fd_w, 1e-4, 1e-4);
    }
}
