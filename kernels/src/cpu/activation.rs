//! Element-wise activations of the MLP block and the residual add.
//!
//! Shapes: everything is (N,F) (or any shape: these kernels only need equal lengths).
//!
//! - SwiGLU (Llama, Mixtral, DeepSeek): out = silu(gate) ∘ up, with gate and up the two
//!   halves of the fused up-projection.
//! - GELU, tanh approximation (GPT-2, Megatron `bias_gelu`).
//! - Squared ReLU, relu(x)² (Primer, Nemotron-4).
//! - Residual add: its backward is the identity, so there is no backward function; the
//!   executor passes the same gradient to both branches.
//!
//! Forwards save nothing beyond their inputs (the backward recomputes the cheap
//! nonlinearity). Work splits into chunks of [`super::ELEM_GRAIN`] elements; the loops
//! use the polynomial `exp` from `cpu/mod.rs` so they vectorise.

use super::{ELEM_GRAIN, exp_f32, sigmoid, simd};
use crate::{Result, check_len};
use rayon::prelude::*;

/// √(2/π), the GELU tanh-approximation constant.
const GELU_K: f32 = 0.797_884_6;
const GELU_C: f32 = 0.044_715;

fn same(name: &str, lens: &[usize]) -> Result<()> {
    for &l in &lens[1..] {
        check_len(name, l, lens[0])?;
    }
    Ok(())
}

/// tanh via exp, vectorisable: 1 − 2/(e^{2u}+1). Saturates cleanly to ±1 because
/// `exp_f32` clamps instead of overflowing.
#[inline(always)]
fn tanh_f32(u: f32) -> f32 {
    1.0 - 2.0 / (exp_f32(2.0 * u) + 1.0)
}

/// out = silu(gate) ∘ up, silu(g) = g·σ(g); all (N,F). Saves nothing (backward reads gate, up).
///
/// # Errors
/// `ShapeMismatch` unless all slices have one length.
pub fn swiglu_forward(out: &mut [f32], gate: &[f32], up: &[f32]) -> Result<()> {
    same("swiglu", &[out.len(), gate.len(), up.len()])?;
    out.par_chunks_mut(ELEM_GRAIN)
        .enumerate()
        .for_each(|(c, o)| {
            let s = c * ELEM_GRAIN;
            simd(
                #[inline(always)]
                || {
                    for ((o, &g), &u) in o.iter_mut().zip(&gate[s..]).zip(&up[s..]) {
                        *o = g * sigmoid(g) * u;
                    }
                },
            )
        });
    Ok(())
}

/// dgate = dout ∘ up ∘ σ(g)(1 + g(1 − σ(g))), dup = dout ∘ silu(g); both overwritten.
///
/// # Errors
/// `ShapeMismatch` unless all slices have one length.
pub fn swiglu_backward(
    dgate: &mut [f32],
    dup: &mut [f32],
    dout: &[f32],
    gate: &[f32],
    up: &[f32],
) -> Result<()> {
    same(
        "swiglu backward",
        &[dgate.len(), dup.len(), dout.len(), gate.len(), up.len()],
    )?;
    dgate
        .par_chunks_mut(ELEM_GRAIN)
        .zip(dup.par_chunks_mut(ELEM_GRAIN))
        .enumerate()
        .for_each(|(c, (dg, du))| {
            simd(
                #[inline(always)]
                || {
                    let s = c * ELEM_GRAIN;
                    for ((((dg, du), &d), &g), &u) in dg
                        .iter_mut()
                        .zip(du.iter_mut())
                        .zip(&dout[s..])
                        .zip(&gate[s..])
                        .zip(&up[s..])
                    {
                        let sg = sigmoid(g);
                        *dg = d * u * sg * (1.0 + g * (1.0 - sg));
                        *du = d * g * sg;
                    }
                },
            )
        });
    Ok(())
}

/// out = 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))); all (N,F). Saves nothing.
///
/// # Errors
/// `ShapeMismatch` unless the slices have one length.
pub fn gelu_forward(out: &mut [f32], x: &[f32]) -> Result<()> {
    same("gelu", &[out.len(), x.len()])?;
    out.par_chunks_mut(ELEM_GRAIN)
        .zip(x.par_chunks(ELEM_GRAIN))
        .for_each(|(o, x)| {
            for (o, &x) in o.iter_mut().zip(x) {
                *o = 0.5 * x * (1.0 + tanh_f32(GELU_K * (x + GELU_C * x * x * x)));
            }
        });
    Ok(())
}

/// dx = dout ∘ gelu'(x) (overwritten).
///
/// # Errors
/// `ShapeMismatch` unless the slices have one length.
pub fn gelu_backward(dx: &mut [f32], dout: &[f32], x: &[f32]) -> Result<()> {
    same("gelu backward", &[dx.len(), dout.len(), x.len()])?;
    dx.par_chunks_mut(ELEM_GRAIN)
        .enumerate()
        .for_each(|(c, dxc)| {
            let s = c * ELEM_GRAIN;
            for ((dx, &d), &x) in dxc.iter_mut().zip(&dout[s..]).zip(&x[s..]) {
                let th = tanh_f32(GELU_K * (x + GELU_C * x * x * x));
                let sech2 = 1.0 - th * th;
                let local =
                    0.5 * (1.0 + th) + 0.5 * x * sech2 * GELU_K * (1.0 + 3.0 * GELU_C * x * x);
                *dx = d * local;
            }
        });
    Ok(())
}

/// out = relu(x)²; all (N,F). Saves nothing.
///
/// # Errors
/// `ShapeMismatch` unless the slices have one length.
pub fn squared_relu_forward(out: &mut [f32], x: &[f32]) -> Result<()> {
    same("squared_relu", &[out.len(), x.len()])?;
    out.par_chunks_mut(ELEM_GRAIN)
        .zip(x.par_chunks(ELEM_GRAIN))
        .for_each(|(o, x)| {
            for (o, &x) in o.iter_mut().zip(x) {
                let r = if x > 0.0 { x } else { 0.0 };
                *o = r * r;
            }
        });
    Ok(())
}

/// dx = dout ∘ 2·relu(x) (overwritten).
///
/// # Errors
/// `ShapeMismatch` unless the slices have one length.
pub fn squared_relu_backward(dx: &mut [f32], dout: &[f32], x: &[f32]) -> Result<()> {
    same("squared_relu backward", &[dx.len(), dout.len(), x.len()])?;
    dx.par_chunks_mut(ELEM_GRAIN)
        .enumerate()
        .for_each(|(c, dxc)| {
            let s = c * ELEM_GRAIN;
            for ((dx, &d), &x) in dxc.iter_mut().zip(&dout[s..]).zip(&x[s..]) {
                let r = if x > 0.0 { x } else { 0.0 };
                *dx = 2.0 * r * d;
            }
        });
    Ok(())
}

/// out = a + b (residual connection). The backward is the identity for both inputs.
///
/// # Errors
/// `ShapeMismatch` unless the slices have one length.
pub fn add_forward(out: &mut [f32], a: &[f32], b: &[f32]) -> Result<()> {
    same("add", &[out.len(), a.len(), b.len()])?;
    out.par_chunks_mut(ELEM_GRAIN)
        .enumerate()
        .for_each(|(c, o)| {
            let s = c * ELEM_GRAIN;
            for ((o, &x), &y) in o.iter_mut().zip(&a[s..]).zip(&b[s..]) {
                *o = x + y;
            }
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{self as r, check::*};

    /// Includes a length above ELEM_GRAIN so chunk boundaries are covered.
    const LENS: &[usize] = &[1, 7, 13 * 5, 40_001];

    fn wide(rng: &mut Rng, n: usize) -> Vec<f32> {
        // [-6, 6]: both saturated tails and the curved middle
        randn(rng, n).iter().map(|x| 6.0 * x).collect()
    }

    #[test]
    fn activations_forward_match_reference() {
        let mut rng = rng(50);
        for &n in LENS {
            let (g, u) = (wide(&mut rng, n), wide(&mut rng, n));
            let mut out = vec![f32::NAN; n];
            swiglu_forward(&mut out, &g, &u).unwrap();
            // values up to ~36; sigmoid via exp_f32 (2 ulp) and a few roundings
            assert_close("swiglu", &out, &r::swiglu(&f64s(&g), &f64s(&u)), 1e-6, 2e-6);
            let mut out = vec![f32::NAN; n];
            gelu_forward(&mut out, &g).unwrap();
            // tanh as 1 − 2/(e^{2u}+1) cancels near u = 0: absolute ~1e-7·|x|
            assert_close("gelu", &out, &r::gelu(&f64s(&g)), 1e-6, 2e-6);
            let mut out = vec![f32::NAN; n];
            squared_relu_forward(&mut out, &g).unwrap();
            assert_close("squared_relu", &out, &r::squared_relu(&f64s(&g)), 0.0, 1e-7);
            let mut out = vec![f32::NAN; n];
            add_forward(&mut out, &g, &u).unwrap();
            let want: Vec<f64> = g.iter().zip(&u).map(|(a, b)| (a + b) as f64).collect();
            assert_close("add", &out, &want, 0.0, 0.0);
        }
    }

    #[test]
    fn activations_backward_match_finite_differences() {
        let mut rng = rng(51);
        for &n in LENS {
            let (g, u, rr) = (wide(&mut rng, n), wide(&mut rng, n), randn(&mut rng, n));
            let (gf, uf) = (f64s(&g), f64s(&u));
            let idx = some(&mut rng, n, 200);
            // Element-wise: only element i of out depends on x_i, so the FD is cheap
            // to do on the full reference anyway. Tolerances: f32 evaluation of a
            // smooth derivative, values up to ~40.
            let (mut dg, mut du) = (vec![f32::NAN; n], vec![f32::NAN; n]);
            swiglu_backward(&mut dg, &mut du, &rr, &g, &u).unwrap();
            let fg = fd_grad(&gf, &idx, |p| loss(&r::swiglu(p, &uf), &rr));
            let fu = fd_grad(&uf, &idx, |p| loss(&r::swiglu(&gf, p), &rr));
            assert_close("swiglu dgate", &pick(&dg, &idx), &fg, 1e-5, 1e-5);
            assert_close("swiglu dup", &pick(&du, &idx), &fu, 1e-5, 1e-5);
            assert!(dg.iter().chain(&du).all(|x| !x.is_nan()));

            let mut dx = vec![f32::NAN; n];
            gelu_backward(&mut dx, &rr, &g).unwrap();
            let f = fd_grad(&gf, &idx, |p| loss(&r::gelu(p), &rr));
            assert_close("gelu dx", &pick(&dx, &idx), &f, 1e-5, 1e-5);
            assert!(dx.iter().all(|x| !x.is_nan()));

            let mut dx = vec![f32::NAN; n];
            squared_relu_backward(&mut dx, &rr, &g).unwrap();
            let f = fd_grad(&gf, &idx, |p| loss(&r::squared_relu(p), &rr));
            assert_close("squared_relu dx", &pick(&dx, &idx), &f, 1e-5, 1e-5);
            assert!(dx.iter().all(|x| !x.is_nan()));
        }
    }

    /// Every kernel refuses a slice one shorter than the rest, whichever argument it is
    /// (the loops zip, so a short input would leave the output's tail unwritten), and
    /// writes nothing then. Each argument in turn: dropping any one length from a
    /// kernel's check fails here.
    #[test]
    fn activations_reject_any_argument_of_another_length() {
        let n = 3;
        let v = |i: usize, short: usize| vec![0.5f32; if i == short { n - 1 } else { n }];
        let untouched = |o: &[f32]| o.iter().all(|&x| x == 0.5);
        for s in 0..3 {
            let (mut o, a, b) = (v(0, s), v(1, s), v(2, s));
            assert!(swiglu_forward(&mut o, &a, &b).is_err(), "swiglu, argument {s}");
            assert!(add_forward(&mut o, &a, &b).is_err(), "add, argument {s}");
            assert!(gelu_backward(&mut o, &a, &b).is_err(), "gelu backward, argument {s}");
            assert!(squared_relu_backward(&mut o, &a, &b).is_err(), "squared_relu backward, argument {s}");
            assert!(untouched(&o), "argument {s}");
        }
        for s in 0..2 {
            let (mut o, a) = (v(0, s), v(1, s));
            assert!(gelu_forward(&mut o, &a).is_err(), "gelu, argument {s}");
            assert!(squared_relu_forward(&mut o, &a).is_err(), "squared_relu, argument {s}");
            assert!(untouched(&o), "argument {s}");
        }
        for s in 0..5 {
            let (mut dg, mut du) = (v(0, s), v(1, s));
            assert!(swiglu_backward(&mut dg, &mut du, &v(2, s), &v(3, s), &v(4, s)).is_err(), "swiglu backward, argument {s}");
            assert!(untouched(&dg) && untouched(&du), "argument {s}");
        }
        let mut o = vec![0.0; n];
        assert!(add_forward(&mut o, &[1.0; 3], &[2.0; 3]).is_ok());
        assert_eq!(o, [3.0; 3]);
    }
}
