//! Dense GEMM: `c = op(a) · op(b) [+ c]`, the workhorse of every Linear layer.
//!
//! This is the one kernel that is not hand-written: it routes through faer's
//! `linalg::matmul::matmul` (measured ~190 GFLOP/s on 2 cores at 1024³, see
//! `shared/notes/rust-stack.md` §3), viewing the row-major slices as faer matrices
//! with strides, so transposes cost nothing. Small products run on the calling thread
//! (rayon dispatch would cost more than the work); larger ones use all of rayon's
//! current threads.
//!
//! Shapes: op(a) is (M,K), op(b) is (K,N), c is (M,N). A Linear layer with weight W
//! (out,in) and input x (N,in) is `y = x · W^T` = `Gemm { m: N, n: out, k: in,
//! trans_b: true }`; its backward is `dx = dy · W` (no transposes) and
//! `dW += dy^T · x` (`trans_a`, `accumulate`). The tests check exactly these recipes
//! against finite differences.

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

pub(crate) fn par_for(g: &Gemm) -> Par {
    let threads = rayon::current_num_threads();
    if threads <= 1 || g.m.saturating_mul(g.n).saturating_mul(g.k) < PAR_MIN_FLOPS {
        Par::Seq
    } else {
        Par::rayon(threads)
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
    faer_matmul(c, accum, a, b, 1.0f32, par);
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
