//! The element-wise and layout kernels (`cuda/elementwise.cu`), the causal conv1d of
//! Mamba-2's mixer (`cuda/ssm.cu`) and the MoE dispatch and combine (`cuda/moe.cu`)
//! under the emulation, launched as the CUDA backend launches them
//! (`host/exec/src/cuda/mod.rs`: the same kernels, grids, argument order, scratch
//! buffers and uploaded tables), against what the CPU backend (`host/exec/src/cpu.rs`)
//! computes, at the tolerances `runner bench kernels` uses (`host/exec/src/devcheck.rs`:
//! the same bits for copies and layout, 1e-5 element-wise, 1e-4 for sums).
//!
//! - `add_forward`, `add_assign`, `scale` and `add_bias` on devcheck's 3000 elements
//!   (rows of 60 for the bias), the same bits as the CPU's loops.
//! - `concat_forward` and `concat_backward` with broadcast leading axes, reading the
//!   shape table `concat_meta` uploads: devcheck's (out [2,3,4,5], a [2,3,4,3], b
//!   [2,3,1,2]) and `a` broadcast on two axes, the outermost among them. The CPU backend's
//!   concat is runner-exec's, out of this crate's reach, so its loops are restated here.
//! - `transpose_outer` of f32, bf16 and FP8 buffers (its 4-, 2- and 1-byte kernels),
//!   byte for byte. The backend's `copy` is a driver memcpy, not a kernel: nothing of it
//!   runs under the emulation.
//! - The causal conv1d forward (SiLU fused, as `cpu::ssm::causal_conv1d_forward`) and
//!   backward (du into a scratch buffer, dx, dw's per-chunk partials and `column_finish`,
//!   dbias as `column_sums` of du) at devcheck's shapes: 2 x 37 x 96, T < K (3 x 2 x
//!   40) and 1200 rows (2 x 600 x 40: chunks of 10 rows).
//! - MoE `dispatch_forward` / `dispatch_backward` and `combine_forward` /
//!   `combine_backward` (dy and the warp-per-slot dweights) at devcheck's n 40, e 8, k 2,
//!   c 24, f 16, on a plan from the router's indices (`cpu::moe::dispatch_plan`, with
//!   the inverse `upload_plan` builds), and on an expert-parallel presorted plan (k 1,
//!   37 rows: a last block of idle warps in the dweights). The grouped GEMMs between them
//!   are cuBLASLt calls, not kernels: their outputs are random values here.
//!
//! Weight and bias gradients and concat's gradients add into random values; every other
//! output starts as NaN (or 0xFF bytes: NaN in f32, bf16 and E4M3).

use runner_kernels::cpu::activation::add_forward;
use runner_kernels::cpu::moe::{self, DispatchPlan, Router, ScoreFn};
use runner_kernels::cpu::ssm::{Conv1d, causal_conv1d_backward, causal_conv1d_forward};

use super::{A, Buf, Emu, check, launcher_or_skip, normals};

/// Element-wise tolerance (devcheck's `EW`).
const EW: f64 = 1e-5;
/// Sums (devcheck's `RED`).
const RED: f64 = 1e-4;
/// The backend's block size (`BLOCK`): element-wise, column and dweights blocks.
const BLOCK: u32 = 256;
/// What byte outputs start as: NaN in f32, bf16 and E4M3, so an element no kernel
/// wrote shows.
const FILL: u8 = 0xFF;

/// The backend's `column_sums` in mode 0 (plain column sums of `dout`, rows x c, added
/// into `dst`): per-chunk partials, then the chunks in order.
fn column_sums(e: &mut Emu, dst: Buf, dout: Buf, rows: usize, c: usize) {
    let chunks = rows.clamp(1, 128);
    let per = rows.div_ceil(chunks);
    let chunks = rows.div_ceil(per);
    let partial = e.nans(chunks * c);
    let cols = c.div_ceil(BLOCK as usize) as u32;
    // Null statistics, as the backend's Arg::P(0): the launcher leaves `p` null for an
    // integer argument.
    let args = [A::P(partial), A::P(dout), A::I(0), A::I(0), A::I(0), A::I(rows as i64), A::I32(c as i32), A::I(per as i64), A::I32(0)];
    e.launch3("column_partials", (cols, chunks as u32, 1), BLOCK, 0, &args);
    e.launch("column_finish", cols, BLOCK, 0, &[A::P(dst), A::P(partial), A::I32(chunks as i32), A::I32(c as i32)]);
}

#[test]
fn elementwise_kernels_match_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    // devcheck's 3000 elements (12 blocks, the last partly idle) and a bias of 60.
    let (n, c) = (3000, 60);
    let (a, b, start, bias) = (normals(n, 1), normals(n, 2), normals(n, 3), normals(c, 4));
    let s = 0.37f32;
    let mut sum = vec![0f32; n];
    add_forward(&mut sum, &a, &b).unwrap();
    // The CPU backend's add_assign, scale and add_bias loops.
    let assigned: Vec<f32> = start.iter().zip(&a).map(|(d, x)| d + x).collect();
    let scaled: Vec<f32> = start.iter().map(|x| x * s).collect();
    let biased: Vec<f32> = start.chunks(c).flat_map(|row| row.iter().zip(&bias).map(|(x, y)| x + y)).collect();

    let mut e = Emu::default();
    let (ea, eb, ebias) = (e.f32s(&a), e.f32s(&b), e.f32s(&bias));
    let (esum, eassigned, escaled, ebiased) = (e.nans(n), e.f32s(&start), e.f32s(&start), e.f32s(&start));
    let len = || A::I(n as i64);
    e.ew("add_forward", n, &[A::P(esum), A::P(ea), A::P(eb), len()]);
    e.ew("add_assign_f32", n, &[A::P(eassigned), A::P(ea), len()]);
    e.ew("scale_f32", n, &[A::P(escaled), A::F(s), len()]);
    e.ew("add_bias", n, &[A::P(ebiased), A::P(ebias), A::I((n / c) as i64), A::I32(c as i32)]);
    let got = e.run(bin);
    let checks = [("add_forward", &sum, esum), ("add_assign", &assigned, eassigned), ("scale", &scaled, escaled), ("add_bias", &biased, ebiased)];
    for (what, want, buf) in checks {
        check(what, want, &got[buf.0 as usize], 0.0);
    }
}

/// The table `concat_meta` uploads: the leading dimensions of out, a and b, each an i64
/// as two little-endian u32 words, at least two words.
fn shape_table(shapes: [&[u64]; 3]) -> Vec<u32> {
    let rank = shapes[0].len() - 1;
    let mut t = Vec::new();
    for sh in shapes {
        for &d in &sh[..rank] {
            t.extend([d as u32, (d >> 32) as u32]);
        }
    }
    t.resize(t.len().max(2), 0);
    t
}

#[test]
fn concat_matches_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    let cases: [[&[u64]; 3]; 2] = [
        // devcheck's: b broadcast on the third axis (MLA's shared rotary key).
        [&[2, 3, 4, 5], &[2, 3, 4, 3], &[2, 3, 1, 2]],
        // a broadcast on the first and third axes.
        [&[2, 3, 4, 5], &[1, 3, 1, 3], &[2, 3, 4, 2]],
    ];
    for (ci, [so, sa, sb]) in cases.into_iter().enumerate() {
        let case = format!("concat {sa:?} + {sb:?} -> {so:?}");
        let r = so.len() - 1;
        let numel = |s: &[u64]| s.iter().product::<u64>() as usize;
        let (la, lb, lo) = (sa[r] as usize, sb[r] as usize, so[r] as usize);
        let (na, nb, no) = (numel(sa), numel(sb), numel(so));
        let seed = 100 + 10 * ci as u64;
        let (xa, xb, dout, da0, db0) = (normals(na, seed + 1), normals(nb, seed + 2), normals(no, seed + 3), normals(na, seed + 4), normals(nb, seed + 5));
        // The CPU backend's concat_forward and concat_backward.
        let mut out = vec![0f32; no];
        for (row, dst) in out.chunks_mut(lo).enumerate() {
            let (ra, rb) = (runner_kernels::cpu::broadcast_row(&so[..r], &sa[..r], row), runner_kernels::cpu::broadcast_row(&so[..r], &sb[..r], row));
            dst[..la].copy_from_slice(&xa[ra * la..(ra + 1) * la]);
            dst[la..].copy_from_slice(&xb[rb * lb..(rb + 1) * lb]);
        }
        let (mut da, mut db) = (da0.clone(), db0.clone());
        for (dx, ss, col0) in [(&mut da, sa, 0), (&mut db, sb, la)] {
            let ls = ss[r] as usize;
            for (row, src) in dout.chunks(lo).enumerate() {
                let rs = runner_kernels::cpu::broadcast_row(&so[..r], &ss[..r], row);
                for (a, b) in dx[rs * ls..(rs + 1) * ls].iter_mut().zip(&src[col0..col0 + ls]) {
                    *a += b;
                }
            }
        }

        let mut e = Emu::default();
        let (ea, eb, edout, table) = (e.f32s(&xa), e.f32s(&xb), e.f32s(&dout), e.u32s(&shape_table([so, sa, sb])));
        let (eout, eda, edb) = (e.nans(no), e.f32s(&da0), e.f32s(&db0));
        let rank = A::I32(r as i32);
        let args = [A::P(eout), A::P(ea), A::P(eb), A::P(table), rank, A::I((no / lo) as i64), A::I32(la as i32), A::I32(lb as i32)];
        e.ew("concat_forward", no, &args);
        for (which, dx, nx, lx, col0) in [(1, eda, na, la, 0), (2, edb, nb, lb, la)] {
            let args = [
                A::P(dx),
                A::P(edout),
                A::P(table),
                A::I32(r as i32),
                A::I32(which),
                A::I((nx / lx) as i64),
                A::I32(lx as i32),
                A::I32(col0 as i32),
                A::I32(lo as i32),
            ];
            e.ew("concat_backward", nx, &args);
        }
        let got = e.run(bin);
        check(&format!("{case}: forward"), &out, &got[eout.0 as usize], 0.0);
        // A broadcast input's gradient sums its copies before adding (the CPU adds each
        // in turn): devcheck's EW there, the same bits where there is one copy.
        for (what, want, buf, src) in [("da", &da, eda, sa), ("db", &db, edb, sb)] {
            let tol = if src == so { 0.0 } else { EW };
            check(&format!("{case}: {what} (+=)"), want, &got[buf.0 as usize], tol);
        }
    }
}

/// runner-exec's `transpose_outer` (cpu.rs) on elements of `w` bytes: dst (b, a, c) <-
/// src (a, b, c).
fn transpose_bytes(src: &[u8], a: usize, b: usize, c: usize, w: usize) -> Vec<u8> {
    let mut dst = vec![0u8; src.len()];
    let row = c * w;
    for i in 0..a {
        for j in 0..b {
            let (from, to) = ((i * b + j) * row, (j * a + i) * row);
            dst[to..to + row].copy_from_slice(&src[from..from + row]);
        }
    }
    dst
}

#[test]
fn transpose_outer_matches_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    // devcheck's (2, 3, 5), and 1940 elements over 8 blocks with an odd inner length.
    let shapes = [(2, 3, 5), (5, 4, 97)];
    let kernels = [("f32", 4, "transpose_outer_u32"), ("bf16", 2, "transpose_outer_u16"), ("fp8", 1, "transpose_outer_u8")];
    let mut e = Emu::default();
    let mut checks = Vec::new();
    for (si, (a, b, c)) in shapes.into_iter().enumerate() {
        let n = a * b * c;
        let xs = normals(n, 200 + si as u64);
        for (kind, w, kernel) in kernels {
            // The f32 itself, its bf16 word (the high half), and for FP8 the low
            // mantissa byte: any code will do, as long as neighbours differ.
            let src: Vec<u8> = xs
                .iter()
                .flat_map(|v| {
                    let bytes = v.to_le_bytes();
                    if w == 1 { bytes[..1].to_vec() } else { bytes[4 - w..].to_vec() }
                })
                .collect();
            let want = transpose_bytes(&src, a, b, c, w);
            let (esrc, edst) = (e.bytes(&src), e.bytes(&vec![FILL; n * w]));
            e.ew(kernel, n, &[A::P(edst), A::P(esrc), A::I(a as i64), A::I(b as i64), A::I(c as i64)]);
            checks.push((format!("transpose_outer {kind} ({a},{b},{c})"), want, edst));
        }
    }
    let got = e.run_bytes(bin);
    for (what, want, buf) in checks {
        let got = &got[buf.0 as usize];
        let bad = want.iter().zip(got).filter(|(w, g)| w != g).count();
        assert_eq!(bad, 0, "{what}: {bad} of {} bytes differ", want.len());
    }
}

#[test]
fn causal_conv1d_matches_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    // devcheck's shapes: one chunk a row (74 rows, two column blocks of dw), T < K, and
    // 1200 rows in 120 chunks of 10.
    let shapes = [Conv1d { b: 2, t: 37, c: 96, k: 4 }, Conv1d { b: 3, t: 2, c: 40, k: 4 }, Conv1d { b: 2, t: 600, c: 40, k: 4 }];
    for (si, s) in shapes.into_iter().enumerate() {
        let (n, ck) = (s.b * s.t * s.c, s.c * s.k);
        let seed = 300 + 10 * si as u64;
        let (x, w, bias, dout) = (normals(n, seed + 1), normals(ck, seed + 2), normals(s.c, seed + 3), normals(n, seed + 4));
        let (dw0, db0) = (normals(ck, seed + 5), normals(s.c, seed + 6));
        let mut out = vec![0f32; n];
        causal_conv1d_forward(&mut out, &x, &w, &bias, s).unwrap();
        let (mut dx, mut dw, mut db) = (vec![0f32; n], dw0.clone(), db0.clone());
        causal_conv1d_backward(&mut dx, &mut dw, &mut db, &dout, &x, &w, &bias, s).unwrap();

        let mut e = Emu::default();
        let (ex, ew, eb, edout) = (e.f32s(&x), e.f32s(&w), e.f32s(&bias), e.f32s(&dout));
        let (eout, du, edx, edw, edb) = (e.nans(n), e.nans(n), e.nans(n), e.f32s(&dw0), e.f32s(&db0));
        let dims = || [A::I(s.b as i64), A::I(s.t as i64), A::I32(s.c as i32), A::I32(s.k as i32)];
        let with_dims = |bufs: &[Buf]| -> Vec<A> { bufs.iter().map(|&b| A::P(b)).chain(dims()).collect() };
        e.ew("causal_conv1d_forward", n, &with_dims(&[eout, ex, ew, eb]));
        e.ew("causal_conv1d_backward_du", n, &with_dims(&[du, edout, ex, ew, eb]));
        e.ew("causal_conv1d_backward_dx", n, &with_dims(&[edx, du, ew]));
        // dw: the chunking of column_sums, over C·K columns.
        let rows = s.b * s.t;
        let per = rows.div_ceil(rows.clamp(1, 128));
        let chunks = rows.div_ceil(per);
        let partial = e.nans(chunks * ck);
        let blocks = ck.div_ceil(BLOCK as usize) as u32;
        let args = [A::P(partial), A::P(du), A::P(ex), A::I(rows as i64), A::I(s.t as i64), A::I32(s.c as i32), A::I32(s.k as i32), A::I(per as i64)];
        e.launch3("causal_conv1d_dw_partials", (blocks, chunks as u32, 1), BLOCK, 0, &args);
        e.launch("column_finish", blocks, BLOCK, 0, &[A::P(edw), A::P(partial), A::I32(chunks as i32), A::I32(ck as i32)]);
        column_sums(&mut e, edb, du, rows, s.c);
        let got = e.run(bin);

        let case = format!("{s:?}");
        check(&format!("{case}: forward"), &out, &got[eout.0 as usize], EW);
        check(&format!("{case}: dx"), &dx, &got[edx.0 as usize], EW);
        check(&format!("{case}: dw (+=)"), &dw, &got[edw.0 as usize], RED);
        check(&format!("{case}: dbias (+=)"), &db, &got[edb.0 as usize], RED);
    }
}

/// Dispatch, combine and their backwards on `plan`, replayed as the backend does with
/// the tables `upload_plan` writes (order, and its inverse slot → sorted row), against
/// `cpu::moe`. `weights` are the router's (one per slot); the grouped GEMM's output
/// `y_sorted` and the gradient it passes back, `dx_sorted`, are random.
fn dispatch_and_combine(bin: &std::path::Path, case: &str, plan: &DispatchPlan, weights: &[f32], c: usize, f: usize, seed: u64) {
    let (rows, k) = (plan.order.len(), plan.k);
    let tokens = rows / k;
    let (x, ys, dout, dxs) = (normals(tokens * c, seed + 1), normals(rows * f, seed + 2), normals(tokens * f, seed + 3), normals(rows * c, seed + 4));
    let mut xs = vec![0f32; rows * c];
    moe::dispatch_forward(&mut xs, &x, plan, c).unwrap();
    let mut out = vec![0f32; tokens * f];
    moe::combine_forward(&mut out, &ys, weights, plan, f).unwrap();
    let (mut dys, mut dwts) = (vec![0f32; rows * f], vec![0f32; rows]);
    moe::combine_backward(&mut dys, &mut dwts, &dout, &ys, weights, plan, f).unwrap();
    let mut dx = vec![0f32; tokens * c];
    moe::dispatch_backward(&mut dx, &dxs, plan, c).unwrap();

    let mut inv = vec![0u32; rows];
    for (row, &slot) in plan.order.iter().enumerate() {
        inv[slot as usize] = row as u32;
    }
    let mut e = Emu::default();
    let (order, inv) = (e.u32s(&plan.order), e.u32s(&inv));
    let (ex, eys, ew, edout, edxs) = (e.f32s(&x), e.f32s(&ys), e.f32s(weights), e.f32s(&dout), e.f32s(&dxs));
    let (exs, eout, edys, edwts, edx) = (e.nans(rows * c), e.nans(tokens * f), e.nans(rows * f), e.nans(rows), e.nans(tokens * c));
    e.ew("dispatch_forward", rows * c, &[A::P(exs), A::P(ex), A::P(order), A::I(rows as i64), A::I32(c as i32), A::I32(k as i32)]);
    e.ew("combine_forward", tokens * f, &[A::P(eout), A::P(eys), A::P(ew), A::P(inv), A::I(tokens as i64), A::I32(f as i32), A::I32(k as i32)]);
    e.ew("combine_backward_dy", rows * f, &[A::P(edys), A::P(edout), A::P(ew), A::P(order), A::I(rows as i64), A::I32(f as i32), A::I32(k as i32)]);
    // A warp per slot.
    let args = [A::P(edwts), A::P(edout), A::P(eys), A::P(inv), A::I(rows as i64), A::I32(f as i32), A::I32(k as i32)];
    e.launch("combine_backward_dw", (rows * 32).div_ceil(BLOCK as usize) as u32, BLOCK, 0, &args);
    e.ew("dispatch_backward", tokens * c, &[A::P(edx), A::P(edxs), A::P(inv), A::I(tokens as i64), A::I32(c as i32), A::I32(k as i32)]);
    let got = e.run(bin);

    let checks: [(&str, &[f32], Buf, f64); 5] = [
        ("dispatch_forward", &xs, exs, 0.0),
        ("combine_forward", &out, eout, RED),
        ("combine_backward dy", &dys, edys, EW),
        ("combine_backward dweights", &dwts, edwts, RED),
        ("dispatch_backward", &dx, edx, RED),
    ];
    for (what, want, buf, tol) in checks {
        check(&format!("{case}: {what}"), want, &got[buf.0 as usize], tol);
    }
}

#[test]
fn moe_dispatch_and_combine_match_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    // devcheck's: 40 tokens to 2 of 8 experts, 24 features in, 16 out, routed by a
    // softmax router with renormalised top-k (the plan `dispatch_plan` builds from the
    // indices the backend downloads).
    let (n, e, k, c, f) = (40, 8, 2, 24, 16);
    let r = Router { n, e, k, score: ScoreFn::Softmax, normalize_topk: true };
    let (mut weights, mut indices, mut probs) = (vec![0f32; n * k], vec![0u32; n * k], vec![0f32; n * e]);
    moe::router_forward(&mut weights, &mut indices, &mut probs, &normals(n * e, 400), &r).unwrap();
    let plan = moe::dispatch_plan(&indices, n, k, e).unwrap();
    dispatch_and_combine(bin, "routed plan", &plan, &weights, c, f, 410);
    // Rows an expert-parallel rank received, grouped by expert (experts with none
    // among them); 37 slots leave three warps of the last dweights block idle.
    let plan = moe::presorted_plan(&[7, 0, 5, 9, 3, 0, 8, 5]).unwrap();
    let weights: Vec<f32> = normals(37, 420).iter().map(|v| v.abs()).collect();
    dispatch_and_combine(bin, "presorted plan", &plan, &weights, c, f, 430);
}
