//! Rotary position embedding, rotate-half convention (HF Llama / GPT-NeoX).
//!
//! Shapes: x, out, dx, dout (B,T,H,D). Within each head, dims i and i + rot_dim/2
//! (i < rot_dim/2) form a pair rotated by angle pos·θ^(−2i/rot_dim), pos = pos_offset + t;
//! dims from rot_dim to D pass through unchanged (partial rotary, e.g. GPT-NeoX,
//! Phi). This is HF's `x·cos + rotate_half(x)·sin`, not the interleaved (GPT-J,
//! Meta-original) pairing of (2i, 2i+1).
//!
//! Under context parallelism ([`Rope::cp`]) the T rows are a cp rank's two chunks of
//! the global sequence ([`super::cp`]), and row t rotates by its global position:
//! pos = pos_offset + (global position of local row t). Without it rows are 0..T.
//!
//! The forward saves nothing; the backward is the inverse rotation (the transpose
//! of an orthogonal map). The cos/sin table (T, rot_dim/2) is computed once per call
//! in f64, so large positions (angles of 10⁵ rad) lose no accuracy to f32 angle
//! rounding; rows (b,t) then split over rayon tasks.

use super::cp::CpShard;
use super::{rows_per_task, simd};
use crate::{Result, check_len, numel, shape_err};
use rayon::prelude::*;

/// RoPE configuration: shape (B,T,H,D), how many leading dims rotate, frequency base
/// (e.g. 10000 for Llama 2, 500000 for Llama 3), the position of token t = 0 and, under
/// context parallelism, which chunks of the sequence the rows are.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// Batch.
    pub b: usize,
    /// Sequence length.
    pub t: usize,
    /// Heads.
    pub h: usize,
    /// Head dim.
    pub d: usize,
    /// Rotated dims per head (even, <= d).
    pub rot_dim: usize,
    /// Frequency base θ.
    pub theta: f32,
    /// Position of the first token (e.g. for a continued sequence).
    pub pos_offset: usize,
    /// The rows are this context-parallel rank's two chunks (T even): each row takes
    /// its global position. `None`: rows are positions 0..T.
    pub cp: Option<CpShard>,
}

/// The shape rules of a rotary call with input length `a` and output length `b` (every
/// backend's: the CUDA one checks with this too).
///
/// # Errors
/// `ShapeMismatch` naming the rule broken.
pub fn check(r: &Rope, a: usize, b: usize) -> Result<()> {
    if !r.rot_dim.is_multiple_of(2) || r.rot_dim > r.d {
        return shape_err(format!(
            "rope rot_dim {} must be even and <= d {}",
            r.rot_dim, r.d
        ));
    }
    if !(r.theta.is_finite() && r.theta > 0.0) {
        return shape_err(format!("rope theta {} must be positive", r.theta));
    }
    if let Some(cp) = r.cp {
        cp.check("rope", r.t)?;
    }
    // The last position must fit every backend's position type (the CUDA kernel's i64).
    if r.pos_offset.checked_add(r.t).is_none_or(|end| end > i64::MAX as usize) {
        return shape_err(format!(
            "rope pos_offset {} plus the sequence length {} overflows a position",
            r.pos_offset, r.t
        ));
    }
    let n = numel(&[r.b, r.t, r.h, r.d])?;
    check_len("rope input", a, n)?;
    check_len("rope output", b, n)
}

/// (cos, sin) tables, (T, rot_dim/2).
fn tables(r: &Rope) -> (Vec<f32>, Vec<f32>) {
    let half = r.rot_dim / 2;
    let inv: Vec<f64> = (0..half)
        .map(|i| (r.theta as f64).powf(-(2.0 * i as f64) / r.rot_dim as f64))
        .collect();
    let mut cos = Vec::with_capacity(r.t * half);
    let mut sin = Vec::with_capacity(r.t * half);
    for t in 0..r.t {
        let pos = (r.pos_offset + r.cp.map_or(t, |cp| cp.position(r.t, t))) as f64;
        for f in &inv {
            let (s, c) = (pos * f).sin_cos();
            cos.push(c as f32);
            sin.push(s as f32);
        }
    }
    (cos, sin)
}

/// Rotates every head of every (b,t) row by `sign`·angle (sign −1 = inverse).
fn rotate(out: &mut [f32], x: &[f32], r: Rope, sign: f32) {
    let (half, d, row) = (r.rot_dim / 2, r.d, r.h * r.d);
    if row == 0 || out.is_empty() {
        return;
    }
    let (cos, sin) = tables(&r);
    let rows_blk = rows_per_task(row);
    out.par_chunks_mut(row * rows_blk)
        .enumerate()
        .for_each(|(blk, ob)| {
            simd(
                #[inline(always)]
                || {
                    for (ri, orow) in ob.chunks_mut(row).enumerate() {
                        let bt = blk * rows_blk + ri;
                        let t = bt % r.t;
                        let (c, s) = (
                            &cos[t * half..(t + 1) * half],
                            &sin[t * half..(t + 1) * half],
                        );
                        let xrow = &x[bt * row..(bt + 1) * row];
                        for (oh, xh) in orow.chunks_mut(d).zip(xrow.chunks(d)) {
                            let (x1, rest) = xh.split_at(half);
                            let (x2, xpass) = rest.split_at(half);
                            let (o1, orest) = oh.split_at_mut(half);
                            let (o2, opass) = orest.split_at_mut(half);
                            for i in 0..half {
                                let si = sign * s[i];
                                o1[i] = x1[i] * c[i] - x2[i] * si;
                                o2[i] = x2[i] * c[i] + x1[i] * si;
                            }
                            opass.copy_from_slice(xpass);
                        }
                    }
                },
            )
        });
}

/// out = RoPE(x); x, out (B,T,H,D). Saves nothing.
///
/// # Errors
/// `ShapeMismatch` for wrong lengths, odd or too large `rot_dim`, or θ <= 0.
pub fn rope_forward(out: &mut [f32], x: &[f32], r: Rope) -> Result<()> {
    check(&r, x.len(), out.len())?;
    rotate(out, x, r, 1.0);
    Ok(())
}

/// dx = RoPE⁻¹(dout): the same pairs rotated by the negative angle.
///
/// # Errors
/// As [`rope_forward`].
pub fn rope_backward(dx: &mut [f32], dout: &[f32], r: Rope) -> Result<()> {
    check(&r, dout.len(), dx.len())?;
    rotate(dx, dout, r, -1.0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{self as r, check::*};

    fn cases() -> Vec<Rope> {
        let mk = |b, t, h, d, rot_dim, theta, pos_offset| Rope {
            b,
            t,
            h,
            d,
            rot_dim,
            theta,
            pos_offset,
            cp: None,
        };
        vec![
            mk(1, 1, 1, 2, 2, 10000.0, 0),
            mk(2, 7, 3, 8, 8, 500000.0, 0),
            mk(1, 13, 2, 10, 6, 10000.0, 5), // partial rotary, pass-through dims
            mk(2, 5, 6, 64, 64, 500000.0, 100_000), // large positions
            mk(1, 3, 2, 5, 0, 10000.0, 0),   // rot_dim 0: identity
        ]
    }

    /// The plain cases and the context-parallel ones (rows at global positions).
    #[test]
    fn rope_forward_matches_reference() {
        let mut rng = rng(30);
        for c in cases().into_iter().chain(cp_cases()) {
            let x = randn(&mut rng, c.b * c.t * c.h * c.d);
            let mut out = vec![f32::NAN; x.len()];
            rope_forward(&mut out, &x, c).unwrap();
            // cos/sin rounded to f32 then one multiply-add: ~2 ulp of |x| <= 1
            assert_close(
                &format!("rope {c:?}"),
                &out,
                &r::rope(&f64s(&x), &c),
                5e-7,
                1e-6,
            );
        }
    }

    #[test]
    fn rope_backward_matches_finite_differences() {
        let mut rng = rng(31);
        for c in cases() {
            let n = c.b * c.t * c.h * c.d;
            let x = randn(&mut rng, n);
            let rr = randn(&mut rng, n);
            let mut dx = vec![f32::NAN; n];
            rope_backward(&mut dx, &rr, c).unwrap();
            let xf = f64s(&x);
            let idx = some(&mut rng, n, 100);
            let fd = fd_grad(&xf, &idx, |p| loss(&r::rope(p, &c), &rr));
            assert_close(
                &format!("rope backward {c:?}"),
                &pick(&dx, &idx),
                &fd,
                1e-6,
                1e-5,
            );
        }
    }

    #[test]
    fn rope_rejects_bad_config() {
        let ok = Rope {
            b: 1,
            t: 2,
            h: 1,
            d: 4,
            rot_dim: 4,
            theta: 1e4,
            pos_offset: 0,
            cp: None,
        };
        let mut out = vec![0.0; 8];
        assert!(rope_forward(&mut out, &[0.0; 8], ok).is_ok());
        assert!(rope_forward(&mut out, &[0.0; 8], Rope { rot_dim: 3, ..ok }).is_err());
        assert!(rope_forward(&mut out, &[0.0; 8], Rope { rot_dim: 6, ..ok }).is_err());
        assert!(rope_forward(&mut out, &[0.0; 8], Rope { theta: 0.0, ..ok }).is_err());
        assert!(rope_forward(&mut out, &[0.0; 7], ok).is_err());
        assert!(rope_backward(&mut out[..7], &[0.0; 8], ok).is_err());
        let cp = |size, rank| Some(CpShard { size, rank });
        assert!(rope_forward(&mut out, &[0.0; 8], Rope { cp: cp(2, 1), ..ok }).is_ok());
        assert!(rope_forward(&mut out, &[0.0; 8], Rope { cp: cp(2, 2), ..ok }).is_err());
        // The last position must fit: usize::MAX - 1 + 2 rows overflows (it wrapped to
        // position 0 in release builds and panicked in debug ones).
        let err = rope_forward(&mut out, &[0.0; 8], Rope { pos_offset: usize::MAX - 1, ..ok }).unwrap_err();
        assert!(format!("{err:?}").contains("pos_offset"), "{err:?}");
        assert!(rope_backward(&mut out, &[0.0; 8], Rope { pos_offset: i64::MAX as usize, ..ok }).is_err());
        assert!(rope_forward(&mut out, &[0.0; 8], Rope { pos_offset: i64::MAX as usize - 2, ..ok }).is_ok());
        let odd = Rope { t: 1, h: 2, ..ok };
        assert!(
            rope_forward(
                &mut out,
                &[0.0; 8],
                Rope {
                    cp: cp(2, 0),
                    ..odd
                }
            )
            .is_err()
        );
    }

    /// θ must be finite as well as positive: θ = ∞ would pass a `> 0` test and make every
    /// frequency but the first 0 (those pairs silently unrotated).
    #[test]
    fn rope_rejects_a_non_finite_theta() {
        let ok = Rope {
            b: 1,
            t: 2,
            h: 1,
            d: 4,
            rot_dim: 4,
            theta: 1e4,
            pos_offset: 0,
            cp: None,
        };
        let mut out = vec![0.0; 8];
        for theta in [f32::INFINITY, f32::NAN, f32::NEG_INFINITY] {
            let err = rope_forward(&mut out, &[0.0; 8], Rope { theta, ..ok }).unwrap_err();
            assert!(format!("{err:?}").contains("theta"), "{err:?}");
            assert!(rope_backward(&mut out, &[0.0; 8], Rope { theta, ..ok }).is_err());
        }
    }

    /// Context-parallel ranks: cp sizes 1 to 3, odd chunk lengths, partial rotary and a
    /// position offset.
    fn cp_cases() -> Vec<Rope> {
        let mk = |t, h, d, rot_dim, pos_offset, size, rank| Rope {
            b: 2,
            t,
            h,
            d,
            rot_dim,
            theta: 10000.0,
            pos_offset,
            cp: Some(CpShard { size, rank }),
        };
        vec![
            mk(4, 2, 8, 8, 0, 2, 0),
            mk(4, 2, 8, 8, 0, 2, 1),
            mk(6, 3, 10, 6, 7, 3, 2), // chunks of 3, partial rotary, offset
            mk(2, 1, 4, 4, 0, 3, 1),  // chunks of 1
            mk(10, 1, 6, 6, 0, 1, 0), // cp of 1: positions 0..T
        ]
    }

    #[test]
    fn rope_cp_rows_match_the_unsharded_rows() {
        let mut rng = rng(32);
        for c in cp_cases() {
            let n = c.b * c.t * c.h * c.d;
            let x = randn(&mut rng, n);
            let mut out = vec![f32::NAN; n];
            rope_forward(&mut out, &x, c).unwrap();
            // The same rows rotated by an unsharded rope over the global sequence,
            // placed at their global positions: bit-identical.
            let cp = c.cp.unwrap();
            let tg = c.t * cp.size;
            let row = c.h * c.d;
            let mut full_x = vec![0f32; c.b * tg * row];
            for b in 0..c.b {
                for i in 0..c.t {
                    let p = r::cp_positions(c.t, c.cp)[i];
                    full_x[(b * tg + p) * row..][..row]
                        .copy_from_slice(&x[(b * c.t + i) * row..][..row]);
                }
            }
            let full = Rope {
                t: tg,
                cp: None,
                ..c
            };
            let mut full_out = vec![f32::NAN; full_x.len()];
            rope_forward(&mut full_out, &full_x, full).unwrap();
            for b in 0..c.b {
                for i in 0..c.t {
                    let p = r::cp_positions(c.t, c.cp)[i];
                    assert_eq!(
                        out[(b * c.t + i) * row..][..row],
                        full_out[(b * tg + p) * row..][..row],
                        "{c:?}: row {i} (global {p})"
                    );
                }
            }
            let rr = randn(&mut rng, n);
            let mut dx = vec![f32::NAN; n];
            rope_backward(&mut dx, &rr, c).unwrap();
            let idx = some(&mut rng, n, 100);
            let fd = fd_grad(&f64s(&x), &idx, |p| loss(&r::rope(p, &c), &rr));
            assert_close(
                &format!("rope backward {c:?}"),
                &pick(&dx, &idx),
                &fd,
                1e-6,
                1e-5,
            );
        }
    }
}
