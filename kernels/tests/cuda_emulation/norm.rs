//! The norm and activation kernels (`cuda/norm.cu`, `cuda/activation.cu`) under the
//! emulation, launched as the CUDA backend launches them (`host/exec/src/cuda/mod.rs`:
//! one 256-thread block per row for the row kernels, `column_sums`' two stages for the
//! weight and bias gradients, `ew` for the element-wise ones, `forward_with_cast` for
//! the fused FP8 casts), against the CPU kernels (`runner_kernels::cpu::norm`,
//! `cpu::activation`; GeGLU and `bias_backward` composed as the CPU backend composes
//! them) at `devcheck`'s tolerances: 1e-5 element-wise, 1e-4 for reductions.
//!
//! - RMSNorm forward (out, rstd) and backward (dx, dw); LayerNorm forward (out, mean,
//!   rstd) and backward (dx, dw, db): fewer columns than a block's threads (37 x 96),
//!   and a row's strided loop over more (8 x 4100).
//! - Their weight gradients over many rows (1000 x 300: chunks of 8 rows in the column
//!   sums, over two column blocks; 999 x 300: a last chunk of 7, as 1000 rows split into
//!   125 chunks exactly): the column stage alone, from the CPU forward's statistics. The
//!   row kernels there are those of the shapes above, and 1000 emulated 256-thread
//!   blocks of them would take seconds each.
//! - `bias_backward`: 50 x 60, 1000 x 300 and 999 x 300.
//! - SwiGLU, GeGLU, GELU and squared ReLU forward and backward.
//! - The fused casts (`rmsnorm_forward_codes`, `activation_forward_codes`): the f32
//!   output (and rstd) against the unfused CPU kernels, and the codes, counts and amax
//!   exactly the CPU's cast (`quant::fp8_codes`) of the output the kernel wrote.
//!
//! Weight and bias gradients add into random values; every other output starts as NaN.

use runner_kernels::cpu::precision::Fp8Format;
use runner_kernels::cpu::{activation, norm, quant};

use crate::{A, Buf, Emu, error, launcher_or_skip, normals};

/// The backend's block size (`BLOCK`): element-wise blocks, row blocks, column blocks.
const BLOCK: u32 = 256;
/// devcheck's tolerances: element-wise work, and long reductions.
const EW: f64 = 1e-5;
const RED: f64 = 1e-4;
const EPS: f32 = 1e-5;
/// (rows, columns) of the norms replayed whole, as devcheck's `layers`.
const SHAPES: [(usize, usize); 2] = [(37, 96), (8, 4100)];
/// Rows of 300 columns whose weight gradients are replayed: devcheck's 1000 (chunks of 8)
/// and 999 (a short last chunk).
const TALL: [usize; 2] = [1000, 999];

/// One block of [`BLOCK`] threads per row (the backend's `rows_cfg`).
fn per_row(e: &mut Emu, name: &str, rows: usize, args: &[A]) {
    e.launch(name, rows as u32, BLOCK, 0, args);
}

/// The backend's `column_sums`: column sums of `dout` over `rows` (times x·rstd in mode
/// 1, (x − mean)·rstd in mode 2; `stats` = [x, mean, rstd], null where the mode reads
/// none), added into `dst`, in per-chunk partials and then the chunks in order.
fn column_sums(e: &mut Emu, dst: Buf, dout: Buf, stats: [Option<Buf>; 3], rows: usize, c: usize, mode: i32) {
    let chunks = rows.clamp(1, 128);
    let per = rows.div_ceil(chunks);
    let chunks = rows.div_ceil(per);
    let partial = e.nans(chunks * c);
    // A null pointer, as the backend's Arg::P(0): the launcher leaves `p` null for an
    // integer argument.
    let opt = |b: Option<Buf>| b.map_or(A::I(0), A::P);
    let [x, mean, rstd] = stats;
    let cols = c.div_ceil(BLOCK as usize) as u32;
    let args = [A::P(partial), A::P(dout), opt(x), opt(mean), opt(rstd), A::I(rows as i64), A::I32(c as i32), A::I(per as i64), A::I32(mode)];
    e.launch3("column_partials", (cols, chunks as u32, 1), BLOCK, 0, &args);
    e.launch("column_finish", cols, BLOCK, 0, &[A::P(dst), A::P(partial), A::I32(chunks as i32), A::I32(c as i32)]);
}

/// Every (name, CPU result, emulated buffer, tolerance) within its tolerance.
fn check(case: &str, out: &[Vec<f32>], checks: &[(&str, &[f32], Buf, f64)]) {
    for &(what, want, buf, tol) in checks {
        let err = error(want, &out[buf.0 as usize]);
        assert!(err <= tol, "{case}: {what} off by {err:.2e} (tolerance {tol:.0e})");
    }
}

fn as_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn rmsnorm_matches_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    for (si, (rows, c)) in SHAPES.into_iter().enumerate() {
        let n = rows * c;
        let seed = 1000 + 10 * si as u64;
        let (x, w, dout, dw0) = (normals(n, seed + 1), normals(c, seed + 2), normals(n, seed + 3), normals(c, seed + 4));
        let (mut out, mut rstd) = (vec![0f32; n], vec![0f32; rows]);
        norm::rmsnorm_forward(&mut out, &mut rstd, &x, &w, c, EPS).unwrap();
        let (mut dx, mut dw) = (vec![0f32; n], dw0.clone());
        norm::rmsnorm_backward(&mut dx, &mut dw, &dout, &x, &w, &rstd, c).unwrap();

        let mut e = Emu::default();
        let (ex, ew, edout) = (e.f32s(&x), e.f32s(&w), e.f32s(&dout));
        let (eout, erstd, edx, edw) = (e.nans(n), e.nans(rows), e.nans(n), e.f32s(&dw0));
        let ci = || A::I32(c as i32);
        per_row(&mut e, "rmsnorm_forward", rows, &[A::P(eout), A::P(erstd), A::P(ex), A::P(ew), ci(), A::F(EPS)]);
        // The backward reads the emulated forward's rstd, as the device's reads its own.
        per_row(&mut e, "rmsnorm_backward_dx", rows, &[A::P(edx), A::P(edout), A::P(ex), A::P(ew), A::P(erstd), ci()]);
        column_sums(&mut e, edw, edout, [Some(ex), None, Some(erstd)], rows, c, 1);
        let got = e.run(bin);
        check(
            &format!("rmsnorm {rows} x {c}"),
            &got,
            &[("out", &out, eout, EW), ("rstd", &rstd, erstd, EW), ("dx", &dx, edx, RED), ("dw (+=)", &dw, edw, RED)],
        );
    }
    for (si, rows) in TALL.into_iter().enumerate() {
        let (c, seed) = (300, 1100 + 10 * si as u64);
        let (x, w, dout, dw0) = (normals(rows * c, seed + 1), normals(c, seed + 2), normals(rows * c, seed + 3), normals(c, seed + 4));
        let (mut out, mut rstd) = (vec![0f32; rows * c], vec![0f32; rows]);
        norm::rmsnorm_forward(&mut out, &mut rstd, &x, &w, c, EPS).unwrap();
        let (mut dx, mut dw) = (vec![0f32; rows * c], dw0.clone());
        norm::rmsnorm_backward(&mut dx, &mut dw, &dout, &x, &w, &rstd, c).unwrap();
        let mut e = Emu::default();
        let (ex, edout, erstd, edw) = (e.f32s(&x), e.f32s(&dout), e.f32s(&rstd), e.f32s(&dw0));
        column_sums(&mut e, edw, edout, [Some(ex), None, Some(erstd)], rows, c, 1);
        check(&format!("rmsnorm {rows} x {c}"), &e.run(bin), &[("dw (+=)", &dw, edw, RED)]);
    }
}

#[test]
fn layernorm_matches_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    for (si, (rows, c)) in SHAPES.into_iter().enumerate() {
        let n = rows * c;
        let seed = 2000 + 10 * si as u64;
        // Rows centred away from zero, so a one-pass variance would show.
        let x: Vec<f32> = normals(n, seed + 1).iter().map(|v| v + 3.0).collect();
        let (w, b, dout) = (normals(c, seed + 2), normals(c, seed + 3), normals(n, seed + 4));
        let (dw0, db0) = (normals(c, seed + 5), normals(c, seed + 6));
        let (mut out, mut mean, mut rstd) = (vec![0f32; n], vec![0f32; rows], vec![0f32; rows]);
        norm::layernorm_forward(&mut out, &mut mean, &mut rstd, &x, &w, &b, c, EPS).unwrap();
        let (mut dx, mut dw, mut db) = (vec![0f32; n], dw0.clone(), db0.clone());
        norm::layernorm_backward(&mut dx, &mut dw, &mut db, &dout, &x, &w, &mean, &rstd, c).unwrap();

        let mut e = Emu::default();
        let (ex, ew, eb, edout) = (e.f32s(&x), e.f32s(&w), e.f32s(&b), e.f32s(&dout));
        let (eout, emean, erstd) = (e.nans(n), e.nans(rows), e.nans(rows));
        let (edx, edw, edb) = (e.nans(n), e.f32s(&dw0), e.f32s(&db0));
        let ci = || A::I32(c as i32);
        per_row(&mut e, "layernorm_forward", rows, &[A::P(eout), A::P(emean), A::P(erstd), A::P(ex), A::P(ew), A::P(eb), ci(), A::F(EPS)]);
        per_row(&mut e, "layernorm_backward_dx", rows, &[A::P(edx), A::P(edout), A::P(ex), A::P(ew), A::P(emean), A::P(erstd), ci()]);
        column_sums(&mut e, edw, edout, [Some(ex), Some(emean), Some(erstd)], rows, c, 2);
        column_sums(&mut e, edb, edout, [None; 3], rows, c, 0);
        let got = e.run(bin);
        check(
            &format!("layernorm {rows} x {c}"),
            &got,
            &[
                ("out", &out, eout, EW),
                ("mean", &mean, emean, EW),
                ("rstd", &rstd, erstd, EW),
                ("dx", &dx, edx, RED),
                ("dw (+=)", &dw, edw, RED),
                ("db (+=)", &db, edb, RED),
            ],
        );
    }
    for (si, rows) in TALL.into_iter().enumerate() {
        let (c, seed) = (300, 2100 + 10 * si as u64);
        let x: Vec<f32> = normals(rows * c, seed + 1).iter().map(|v| v + 3.0).collect();
        let (w, b, dout) = (normals(c, seed + 2), normals(c, seed + 3), normals(rows * c, seed + 4));
        let (dw0, db0) = (normals(c, seed + 5), normals(c, seed + 6));
        let (mut out, mut mean, mut rstd) = (vec![0f32; rows * c], vec![0f32; rows], vec![0f32; rows]);
        norm::layernorm_forward(&mut out, &mut mean, &mut rstd, &x, &w, &b, c, EPS).unwrap();
        let (mut dx, mut dw, mut db) = (vec![0f32; rows * c], dw0.clone(), db0.clone());
        norm::layernorm_backward(&mut dx, &mut dw, &mut db, &dout, &x, &w, &mean, &rstd, c).unwrap();
        let mut e = Emu::default();
        let (ex, edout, emean, erstd) = (e.f32s(&x), e.f32s(&dout), e.f32s(&mean), e.f32s(&rstd));
        let (edw, edb) = (e.f32s(&dw0), e.f32s(&db0));
        column_sums(&mut e, edw, edout, [Some(ex), Some(emean), Some(erstd)], rows, c, 2);
        column_sums(&mut e, edb, edout, [None; 3], rows, c, 0);
        check(&format!("layernorm {rows} x {c}"), &e.run(bin), &[("dw (+=)", &dw, edw, RED), ("db (+=)", &db, edb, RED)]);
    }
}

/// `bias_backward` is `column_sums` in mode 0 on the device and a row-by-row sum into
/// dbias on the CPU backend (`host/exec/src/cpu.rs`).
#[test]
fn bias_backward_matches_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    // devcheck's 50 rows of 60 (a chunk a row) and 1000 x 300, and 999 x 300 (TALL).
    for (si, (rows, c, tol)) in [(50, 60, EW), (1000, 300, RED), (999, 300, RED)].into_iter().enumerate() {
        let seed = 3000 + 10 * si as u64;
        let (dout, db0) = (normals(rows * c, seed + 1), normals(c, seed + 2));
        let mut db = db0.clone();
        for row in dout.chunks(c) {
            for (d, g) in db.iter_mut().zip(row) {
                *d += g;
            }
        }
        let mut e = Emu::default();
        let (edout, edb) = (e.f32s(&dout), e.f32s(&db0));
        column_sums(&mut e, edb, edout, [None; 3], rows, c, 0);
        let got = e.run(bin);
        check(&format!("bias_backward {rows} x {c}"), &got, &[("dbias (+=)", &db, edb, tol)]);
    }
}

#[test]
fn activations_match_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    // devcheck's 3000, and enough elements for many blocks; neither a multiple of 256.
    for (si, n) in [3000, 8 * 4100].into_iter().enumerate() {
        let seed = 4000 + 10 * si as u64;
        // Gates of ±3σ reach the saturated tails of silu and gelu.
        let a: Vec<f32> = normals(n, seed + 1).iter().map(|v| 3.0 * v).collect();
        let (b, dout) = (normals(n, seed + 2), normals(n, seed + 3));
        let mut e = Emu::default();
        let (ea, eb, edout) = (e.f32s(&a), e.f32s(&b), e.f32s(&dout));
        let len = || A::I(n as i64);
        let mut checks: Vec<(String, Vec<f32>, Buf)> = Vec::new();

        let (mut o, mut dg, mut du) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        activation::swiglu_forward(&mut o, &a, &b).unwrap();
        activation::swiglu_backward(&mut dg, &mut du, &dout, &a, &b).unwrap();
        let (eo, edg, edu) = (e.nans(n), e.nans(n), e.nans(n));
        e.ew("swiglu_forward", n, &[A::P(eo), A::P(ea), A::P(eb), len()]);
        e.ew("swiglu_backward", n, &[A::P(edg), A::P(edu), A::P(edout), A::P(ea), A::P(eb), len()]);
        checks.extend([("swiglu out".into(), o, eo), ("swiglu dgate".into(), dg, edg), ("swiglu dup".into(), du, edu)]);

        // The CPU backend's GeGLU: out = gelu(g)·u; dgate = gelu'(g)·(dout·u), dup = dout·gelu(g).
        let mut o = vec![0f32; n];
        activation::gelu_forward(&mut o, &a).unwrap();
        let du: Vec<f32> = o.iter().zip(&dout).map(|(g, d)| g * d).collect();
        o.iter_mut().zip(&b).for_each(|(o, u)| *o *= u);
        let dxu: Vec<f32> = dout.iter().zip(&b).map(|(d, u)| d * u).collect();
        let mut dg = vec![0f32; n];
        activation::gelu_backward(&mut dg, &dxu, &a).unwrap();
        let (eo, edg, edu) = (e.nans(n), e.nans(n), e.nans(n));
        e.ew("geglu_forward", n, &[A::P(eo), A::P(ea), A::P(eb), len()]);
        e.ew("geglu_backward", n, &[A::P(edg), A::P(edu), A::P(edout), A::P(ea), A::P(eb), len()]);
        checks.extend([("geglu out".into(), o, eo), ("geglu dgate".into(), dg, edg), ("geglu dup".into(), du, edu)]);

        // The one-input activations: forward and backward kernels named after them.
        type Forward = fn(&mut [f32], &[f32]) -> runner_kernels::Result<()>;
        type Backward = fn(&mut [f32], &[f32], &[f32]) -> runner_kernels::Result<()>;
        let unary: [(&str, Forward, Backward); 2] = [
            ("gelu", activation::gelu_forward, activation::gelu_backward),
            ("squared_relu", activation::squared_relu_forward, activation::squared_relu_backward),
        ];
        for (name, forward, backward) in unary {
            let (mut o, mut dx) = (vec![0f32; n], vec![0f32; n]);
            forward(&mut o, &a).unwrap();
            backward(&mut dx, &dout, &a).unwrap();
            let (eo, edx) = (e.nans(n), e.nans(n));
            e.ew(&format!("{name}_forward"), n, &[A::P(eo), A::P(ea), len()]);
            e.ew(&format!("{name}_backward"), n, &[A::P(edx), A::P(edout), A::P(ea), len()]);
            checks.extend([(format!("{name} out"), o, eo), (format!("{name} dx"), dx, edx)]);
        }

        let got = e.run(bin);
        let checks: Vec<(&str, &[f32], Buf, f64)> = checks.iter().map(|(w, v, b)| (w.as_str(), &v[..], *b, EW)).collect();
        check(&format!("activations, {n} elements"), &got, &checks);
    }
}

/// The fused norm / activation + FP8 cast, set up as `forward_with_cast` does (meta =
/// [scale, 1/scale, 0, 0], a zeroed statistics record): devcheck's cases, E4M3 at 40
/// saturating and E5M2 at 8192 overflowing to infinity. The output (and rstd) against
/// the unfused CPU kernels; the codes, the counts and the amax exactly those of the CPU's
/// cast of the output the kernel wrote.
#[test]
fn fused_casts_match_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    let formats = [(Fp8Format::E4M3, 0, 40.0f32, true), (Fp8Format::E5M2, 1, 8192.0, false)];
    let mut cases = Vec::new();
    for act in ["rmsnorm", "swiglu", "geglu", "gelu", "squared_relu"] {
        cases.extend(formats.map(|f| (act, 37, 96, f)));
    }
    cases.push(("rmsnorm", 8, 4100, formats[0]));
    for (ci, (act, rows, c, (format, fmt, scale, saturate))) in cases.into_iter().enumerate() {
        let n = rows * c;
        let seed = 5000 + 10 * ci as u64;
        let (x, w, up) = (normals(n, seed + 1), normals(c, seed + 2), normals(n, seed + 3));
        let (mut out, mut rstd) = (vec![0f32; n], vec![0f32; rows]);
        match act {
            "rmsnorm" => norm::rmsnorm_forward(&mut out, &mut rstd, &x, &w, c, EPS).unwrap(),
            "swiglu" => activation::swiglu_forward(&mut out, &x, &up).unwrap(),
            "geglu" => {
                activation::gelu_forward(&mut out, &x).unwrap();
                out.iter_mut().zip(&up).for_each(|(o, u)| *o *= u);
            }
            "gelu" => activation::gelu_forward(&mut out, &x).unwrap(),
            _ => activation::squared_relu_forward(&mut out, &x).unwrap(),
        }

        let mut e = Emu::default();
        let (ex, ew, eup) = (e.f32s(&x), e.f32s(&w), e.f32s(&up));
        let (eout, erstd, eq) = (e.nans(n), e.nans(rows), e.bytes(&vec![0; n]));
        let (meta, rec) = (e.f32s(&[scale, 1.0 / scale, 0.0, 0.0]), e.u32s(&[0; 8]));
        let tail = [A::I32(fmt), A::F(scale), A::I32(i32::from(saturate))];
        if act == "rmsnorm" {
            let mut args = vec![A::P(eout), A::P(erstd), A::P(eq), A::P(meta), A::P(rec), A::P(ex), A::P(ew), A::I32(c as i32), A::F(EPS)];
            args.extend(tail);
            per_row(&mut e, "rmsnorm_forward_codes", rows, &args);
        } else {
            // GELU and squared ReLU pass x as the unused second input too.
            let (code, b) = match act {
                "swiglu" => (0, eup),
                "geglu" => (1, eup),
                "gelu" => (2, ex),
                _ => (3, ex),
            };
            let mut args = vec![A::P(eout), A::P(eq), A::P(meta), A::P(rec), A::P(ex), A::P(b), A::I(n as i64), A::I32(code)];
            args.extend(tail);
            e.ew("activation_forward_codes", n, &args);
        }
        let got = e.run_bytes(bin);

        let case = format!("{act} + {format:?} cast, {rows} x {c}");
        let got_out = as_f32(&got[eout.0 as usize]);
        let err = error(&out, &got_out);
        assert!(err <= EW, "{case}: output off by {err:.2e} (tolerance {EW:.0e})");
        if act == "rmsnorm" {
            let err = error(&rstd, &as_f32(&got[erstd.0 as usize]));
            assert!(err <= EW, "{case}: rstd off by {err:.2e} (tolerance {EW:.0e})");
        }
        let mut codes = vec![0u8; n];
        let want = quant::fp8_codes(&mut codes, &got_out, scale, format, saturate).unwrap();
        let bad = codes.iter().zip(&got[eq.0 as usize]).filter(|(a, b)| a != b).count();
        assert_eq!(bad, 0, "{case}: {bad} of {n} codes are not the cast of the output");
        let words: Vec<u64> = got[rec.0 as usize].chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap())).collect();
        let counts = [want.saturated, want.underflowed, want.nonfinite];
        assert_eq!(words[..3], counts, "{case}: counts (saturated, underflowed, non-finite)");
        let meta = as_f32(&got[meta.0 as usize]);
        assert_eq!(meta[..3], [scale, 1.0 / scale, want.amax], "{case}: meta (scale, 1/scale, amax)");
    }
}
