//! The loss, embedding, rotary and optimiser kernels (`cuda/loss.cu`, `embedding.cu`,
//! `rope.cu`, `adamw.cu`, `muon.cu`) under the emulation, launched as the CUDA backend launches them
//! (`host/exec/src/cuda/mod.rs`: the same kernels, grids, argument order and scratch
//! buffers), against the CPU kernels at the tolerances `runner bench kernels` uses
//! (`host/exec/src/devcheck.rs`: the same bits for lookups, 1e-5 element-wise, 1e-4 where
//! long sums or exp/log meet).
//!
//! - Cross-entropy: per-row losses, lse and the mean (also recomputed here in the
//!   kernel's fixed f64 order, to the bit), the backward with a loss gradient and with
//!   none; an ignored target, a row of 5000 classes, more rows than a block has threads,
//!   and a batch with every target ignored.
//! - Megatron's vocab-parallel statistics of one shard (row max and sum of exp in one
//!   pass, the sum moved onto a larger reduced max, the target logit), the loss from them
//!   and the shard's backward; a shard row of masked (−∞) logits only.
//! - Embedding lookup and scatter-add backward, whole and as a vocab shard; the backward
//!   adds into random values, with atomics, so it matches to rounding.
//! - Rotary forward and backward: plain, from a position offset, as cp rank 1 of 2.
//! - Two AdamW steps, each reading its scalars from a buffer of words as the backend's
//!   `adamw_scalars` builds it.
//! - Muon's normalisation by a sum of squares read from device memory (a positive sum,
//!   zero, a negative and a NaN one) and its update reading the decay and learning rate
//!   from those words.

use runner_kernels::cpu::adamw::{AdamW, adamw_with, scalars};
use runner_kernels::cpu::muon::{muon_apply, scale_by_inverse_norm};
use runner_kernels::cpu::cp::CpShard;
use runner_kernels::cpu::embedding::{embedding_backward, embedding_forward, embedding_shard_backward, embedding_shard_forward};
use runner_kernels::cpu::loss::{
    IGNORE_INDEX, cross_entropy_backward, cross_entropy_forward, cross_entropy_from_stats, cross_entropy_shard_backward, row_max_sumexp,
    sumexp_rescale, target_logit,
};
use runner_kernels::cpu::rope::{Rope, rope_backward, rope_forward};

use crate::{A, Buf, Emu, check, launcher_or_skip, normals};

/// Element-wise tolerance (devcheck's `EW`).
const EW: f64 = 1e-5;
/// Reductions and losses (devcheck's `RED`).
const RED: f64 = 1e-4;
/// Threads of a row kernel's block (`rows_cfg`: one block of 256 per row).
const ROW_THREADS: u32 = 256;

/// Fixed ids below `below`, spread by a multiplicative hash: any fixed ids will do, as
/// long as some repeat.
fn ids(n: usize, below: u32, seed: u64) -> Vec<u32> {
    (0..n as u64).map(|i| ((i.wrapping_add(seed).wrapping_mul(0x9E37_79B9) >> 7) % u64::from(below)) as u32).collect()
}

fn scaled(n: usize, seed: u64, by: f32) -> Vec<f32> {
    normals(n, seed).into_iter().map(|x| by * x).collect()
}

/// `cross_entropy_mean`'s sum, redone: thread k of 256 adds the valid rows k, k + 256, …
/// in f64, then thread 0 adds the partials in thread order. The order is the kernel's
/// promise of a deterministic loss, so the mean must come out to the same bits.
fn mean_in_kernel_order(losses: &[f32], targets: &[u32]) -> f32 {
    let threads = ROW_THREADS as usize;
    let (mut total, mut valid) = (0f64, 0u64);
    for k in 0..threads {
        let rows = (k..losses.len()).step_by(threads).filter(|&r| targets[r] != IGNORE_INDEX);
        total += rows.clone().map(|r| f64::from(losses[r])).sum::<f64>();
        valid += rows.count() as u64;
    }
    if valid == 0 { 0.0 } else { (total / valid as f64) as f32 }
}

/// The backend's `cross_entropy_shard_backward` (and so `cross_entropy_backward`, start 0):
/// a fresh count scratch from `count_valid`, then the element-wise backward. `dloss`
/// `None` is a null pointer (`Arg::P(0)`): an integer argument leaves the launcher's
/// pointer null. Returns (dlogits, count).
fn ce_backward(e: &mut Emu, logits: Buf, lse: Buf, targets: Buf, dloss: Option<Buf>, (rows, v, start): (usize, usize, usize)) -> (Buf, Buf) {
    let count = e.nans(1);
    e.launch("count_valid", 1, ROW_THREADS, 0, &[A::P(count), A::P(targets), A::I(rows as i64)]);
    let dlogits = e.nans(rows * v);
    let dl = dloss.map_or(A::I(0), A::P);
    let args = [A::P(dlogits), A::P(logits), A::P(lse), A::P(targets), dl, A::P(count), A::I(rows as i64), A::I32(v as i32), A::I(start as i64)];
    e.launch("cross_entropy_backward", rows as u32, ROW_THREADS, 0, &args);
    (dlogits, count)
}

/// Forward (per-row losses, lse, the mean) and both backwards of the whole-vocabulary
/// loss: devcheck's 45 × 300 with an ignored target, a row of 5000 classes (20 strides of
/// the block), 300 rows (the mean's per-thread partials hold more than one row) and a
/// batch with every target ignored (loss 0, no gradient); and for the one-pass softmax's
/// running max, a row rising from start to end (the max grows at every element) and a
/// row whose first 300 logits are -inf (masked: they add nothing, even before a thread
/// has seen a finite one).
#[test]
fn cross_entropy_matches_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    let cases: [(usize, usize, &[usize]); 5] = [(45, 300, &[3]), (1, 5000, &[]), (300, 6, &[0, 257, 299]), (3, 7, &[0, 1, 2]), (2, 700, &[])];
    for (ci, (n, v, ignored)) in cases.into_iter().enumerate() {
        let seed = 1000 + 10 * ci as u64;
        let mut logits = scaled(n * v, seed, 3.0);
        let mut targets = ids(n, v as u32, seed);
        if ci == 4 {
            for (i, x) in logits[..v].iter_mut().enumerate() {
                *x = -20.0 + 0.06 * i as f32;
            }
            logits[v..v + 300].fill(f32::NEG_INFINITY);
            targets[1] = 650;
        }
        for &r in ignored {
            targets[r] = IGNORE_INDEX;
        }
        let valid = targets.iter().filter(|&&t| t != IGNORE_INDEX).count();
        let dloss = 1.7f32;
        let (mut losses, mut lse) = (vec![0f32; n], vec![0f32; n]);
        let mean = cross_entropy_forward(&mut losses, &mut lse, &logits, &targets, v).unwrap();
        let mut dlogits = vec![0f32; n * v];
        cross_entropy_backward(&mut dlogits, &logits, &lse, &targets, v, dloss).unwrap();

        let mut e = Emu::default();
        let (el, et) = (e.f32s(&logits), e.u32s(&targets));
        let (elosses, e_lse, eloss) = (e.nans(n), e.nans(n), e.nans(1));
        e.launch("cross_entropy_rows", n as u32, ROW_THREADS, 0, &[A::P(elosses), A::P(e_lse), A::P(el), A::P(et), A::I32(v as i32)]);
        e.launch("cross_entropy_mean", 1, ROW_THREADS, 0, &[A::P(eloss), A::P(elosses), A::P(et), A::I(n as i64)]);
        let edloss = e.f32s(&[dloss]);
        let (edl, ecount) = ce_backward(&mut e, el, e_lse, et, Some(edloss), (n, v, 0));
        let (edl_none, _) = ce_backward(&mut e, el, e_lse, et, None, (n, v, 0));
        let out = e.run(bin);

        let case = format!("cross-entropy {n} x {v}");
        check(&format!("{case}: losses"), &losses, &out[elosses.0 as usize], RED);
        check(&format!("{case}: lse"), &lse, &out[e_lse.0 as usize], RED);
        check(&format!("{case}: mean"), &[mean], &out[eloss.0 as usize], RED);
        let kernel_order = mean_in_kernel_order(&out[elosses.0 as usize], &targets);
        check(&format!("{case}: mean, in the kernel's order"), &[kernel_order], &out[eloss.0 as usize], 0.0);
        check(&format!("{case}: count_valid"), &[valid as f32], &out[ecount.0 as usize], 0.0);
        check(&format!("{case}: dlogits"), &dlogits, &out[edl.0 as usize], RED);
        // No loss gradient: zeros, of either sign (devcheck allows EW; nothing but 0 is right).
        let zeros = &out[edl_none.0 as usize];
        assert!(zeros.iter().all(|&x| x == 0.0), "{case}: dlogits without a loss gradient are not all zero");
    }
}

/// One tp rank's shard of the vocabulary (devcheck's classes 100..250 of 300, and a shard
/// of 1300 classes so a row spans several strides): the three row statistics, the loss
/// from them (as if all-reduced over one rank) and the shard's backward. Targets fall
/// inside the shard, outside it, and one is ignored.
#[test]
fn vocab_parallel_cross_entropy_matches_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    // (rows, vocabulary, shard start, shard width)
    for (ci, (n, vocab, start, w)) in [(45, 300, 100, 150), (5, 2600, 1300, 1300)].into_iter().enumerate() {
        let seed = 2000 + 10 * ci as u64;
        let shard = normals(n * w, seed);
        let mut targets = ids(n, vocab as u32, seed);
        targets[3] = IGNORE_INDEX;
        // Both sides of the shard, whatever the hash gave.
        targets[0] = start as u32;
        targets[1] = (start + w) as u32;
        let dloss = 1.7f32;
        let (mut mx, mut se, mut tl, mut lse) = (vec![0f32; n], vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        row_max_sumexp(&mut mx, &mut se, &shard, w).unwrap();
        let local_se = se.clone();
        // The max reduced over the shards: another shard's larger one on two rows in three.
        let reduced: Vec<f32> = mx.iter().enumerate().map(|(r, m)| m + (r % 3) as f32 * 0.75).collect();
        sumexp_rescale(&mut se, &mx, &reduced).unwrap();
        target_logit(&mut tl, &shard, &targets, start, w).unwrap();
        let mean = cross_entropy_from_stats(&mut lse, &reduced, &se, &tl, &targets).unwrap();
        let mut ds = vec![0f32; n * w];
        cross_entropy_shard_backward(&mut ds, &shard, &lse, &targets, start, w, dloss).unwrap();

        let mut e = Emu::default();
        let (ex, et) = (e.f32s(&shard), e.u32s(&targets));
        let (emx, ese, etl, e_lse, eloss, elosses) = (e.nans(n), e.nans(n), e.nans(n), e.nans(n), e.nans(1), e.nans(n));
        // The one-pass statistics twice: kept as they are, and rescaled in place.
        let (ered, emx_local, ese_local) = (e.f32s(&reduced), e.nans(n), e.nans(n));
        e.launch("row_max_sumexp", n as u32, ROW_THREADS, 0, &[A::P(emx_local), A::P(ese_local), A::P(ex), A::I32(w as i32)]);
        e.launch("row_max_sumexp", n as u32, ROW_THREADS, 0, &[A::P(emx), A::P(ese), A::P(ex), A::I32(w as i32)]);
        e.ew("sumexp_rescale", n, &[A::P(ese), A::P(emx), A::P(ered), A::I(n as i64)]);
        e.ew("target_logit", n, &[A::P(etl), A::P(ex), A::P(et), A::I(n as i64), A::I32(w as i32), A::I(start as i64)]);
        let stats = [A::P(elosses), A::P(e_lse), A::P(ered), A::P(ese), A::P(etl), A::P(et), A::I(n as i64)];
        e.ew("cross_entropy_stats_rows", n, &stats);
        e.launch("cross_entropy_mean", 1, ROW_THREADS, 0, &[A::P(eloss), A::P(elosses), A::P(et), A::I(n as i64)]);
        let edloss = e.f32s(&[dloss]);
        let (eds, _) = ce_backward(&mut e, ex, e_lse, et, Some(edloss), (n, w, start));
        let out = e.run(bin);

        let case = format!("vocab shard {start}..{} of {vocab}, {n} rows", start + w);
        check(&format!("{case}: row max"), &mx, &out[emx_local.0 as usize], 0.0);
        check(&format!("{case}: row sum of exp"), &local_se, &out[ese_local.0 as usize], RED);
        check(&format!("{case}: row sum of exp rescaled"), &se, &out[ese.0 as usize], RED);
        check(&format!("{case}: target_logit"), &tl, &out[etl.0 as usize], 0.0);
        check(&format!("{case}: lse from the statistics"), &lse, &out[e_lse.0 as usize], RED);
        check(&format!("{case}: loss from the statistics"), &[mean], &out[eloss.0 as usize], RED);
        check(&format!("{case}: shard backward"), &ds, &out[eds.0 as usize], RED);
    }
    // Masked logits: row 1 of the shard is −∞ throughout (its max stays −∞ and its sum
    // 0, rescaled or not, not NaN), row 2 in every other class.
    let (n, w) = (3, 300);
    let mut shard = normals(n * w, 2100);
    shard[w..2 * w].fill(f32::NEG_INFINITY);
    shard[2 * w..].iter_mut().step_by(2).for_each(|x| *x = f32::NEG_INFINITY);
    let (mut mx, mut se) = (vec![0f32; n], vec![0f32; n]);
    row_max_sumexp(&mut mx, &mut se, &shard, w).unwrap();
    assert_eq!((mx[1], se[1]), (f32::NEG_INFINITY, 0.0), "the CPU's statistics of a masked row");
    let reduced = [mx[0], 2.0, mx[2] + 0.5];
    let mut rescaled = se.clone();
    sumexp_rescale(&mut rescaled, &mx, &reduced).unwrap();
    let mut e = Emu::default();
    let ex = e.f32s(&shard);
    let (emx, ese, ered) = (e.nans(n), e.nans(n), e.f32s(&reduced));
    let (emx2, erescaled) = (e.nans(n), e.nans(n));
    e.launch("row_max_sumexp", n as u32, ROW_THREADS, 0, &[A::P(emx), A::P(ese), A::P(ex), A::I32(w as i32)]);
    e.launch("row_max_sumexp", n as u32, ROW_THREADS, 0, &[A::P(emx2), A::P(erescaled), A::P(ex), A::I32(w as i32)]);
    e.ew("sumexp_rescale", n, &[A::P(erescaled), A::P(emx2), A::P(ered), A::I(n as i64)]);
    let out = e.run(bin);
    check("masked rows: row max", &mx, &out[emx.0 as usize], 0.0);
    check("masked rows: row sum of exp", &se, &out[ese.0 as usize], RED);
    check("masked rows: row sum of exp rescaled", &rescaled, &out[erescaled.0 as usize], RED);
    assert_eq!(out[erescaled.0 as usize][1], 0.0, "a masked row's rescaled sum");
}

/// devcheck's lookup (50 ids × 24 channels, 70 tokens) whole and as the shard of ids
/// 20..40; tokens repeat, one id eight times, so the backward's atomics meet on rows. The
/// table gradient starts from the same random values on both sides (it adds).
#[test]
fn embedding_matches_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    let (vocab, n, c) = (50usize, 70usize, 24usize);
    let mut tokens = ids(n, vocab as u32, 3000);
    for k in (0..n).step_by(9) {
        tokens[k] = 27;
    }
    let dout = normals(n * c, 3001);
    for (start, rows) in [(None, vocab), (Some(20usize), 20usize)] {
        let table = normals(rows * c, 3002 + rows as u64);
        let dtable0 = normals(rows * c, 3003 + rows as u64);
        let (mut out, mut dtable) = (vec![0f32; n * c], dtable0.clone());
        match start {
            None => {
                embedding_forward(&mut out, &tokens, &table, c).unwrap();
                embedding_backward(&mut dtable, &dout, &tokens, c).unwrap();
            }
            Some(s) => {
                embedding_shard_forward(&mut out, &tokens, &table, c, s).unwrap();
                embedding_shard_backward(&mut dtable, &dout, &tokens, c, s).unwrap();
            }
        }

        let mut e = Emu::default();
        let (etok, etab, edout, edtab, eout) = (e.u32s(&tokens), e.f32s(&table), e.f32s(&dout), e.f32s(&dtable0), e.nans(n * c));
        let shape = || [A::I(n as i64), A::I32(c as i32), A::I(rows as i64), A::I(start.unwrap_or(0) as i64)];
        let forward: Vec<A> = [A::P(eout), A::P(etok), A::P(etab)].into_iter().chain(shape()).collect();
        e.ew("embedding_forward", n * c, &forward);
        let backward: Vec<A> = [A::P(edtab), A::P(edout), A::P(etok)].into_iter().chain(shape()).collect();
        e.ew("embedding_backward", n * c, &backward);
        let out_e = e.run(bin);

        let case = match start {
            Some(s) => format!("embedding shard {s}..{}", s + rows),
            None => "embedding".to_string(),
        };
        check(&format!("{case}: forward"), &out, &out_e[eout.0 as usize], 0.0);
        check(&format!("{case}: backward (added into the table gradient)"), &dtable, &out_e[edtab.0 as usize], EW);
    }
}

/// devcheck's rotary shape (B 2, T 12, H 3, D 16, 12 dims rotated, θ 500000): plain, as
/// cp rank 1 of 2 (rows at global positions 6..12 and 18..24) and from position 37;
/// forward (sign +1) and backward (sign −1) launch one kernel.
#[test]
fn rope_matches_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    for (ci, (cp, pos_offset)) in [(None, 0), (Some(CpShard { size: 2, rank: 1 }), 0), (None, 37)].into_iter().enumerate() {
        let r = Rope { b: 2, t: 12, h: 3, d: 16, rot_dim: 12, theta: 500_000.0, pos_offset, cp };
        let n = r.b * r.t * r.h * r.d;
        let (x, g) = (normals(n, 4000 + 2 * ci as u64), normals(n, 4001 + 2 * ci as u64));
        let (mut out, mut dx) = (vec![0f32; n], vec![0f32; n]);
        rope_forward(&mut out, &x, r).unwrap();
        rope_backward(&mut dx, &g, r).unwrap();

        let mut e = Emu::default();
        let (ex, eg, eout, edx) = (e.f32s(&x), e.f32s(&g), e.nans(n), e.nans(n));
        for (dst, src, sign) in [(eout, ex, 1.0), (edx, eg, -1.0)] {
            let args = [
                A::P(dst),
                A::P(src),
                A::I(r.b as i64),
                A::I(r.t as i64),
                A::I32(r.h as i32),
                A::I32(r.d as i32),
                A::I32(r.rot_dim as i32),
                A::F(r.theta),
                A::I(r.pos_offset as i64),
                A::I32(r.cp.map_or(1, |c| c.size as i32)),
                A::I32(r.cp.map_or(0, |c| c.rank as i32)),
                A::F(sign),
            ];
            e.ew("rope", n, &args);
        }
        let o = e.run(bin);
        check(&format!("{r:?}: forward"), &out, &o[eout.0 as usize], EW);
        check(&format!("{r:?}: backward"), &dx, &o[edx.0 as usize], EW);
    }
}

/// Two steps on 3000 parameters (devcheck's lr 1e-2 with the executor's default betas,
/// eps and decay) from a state that is not zero, a new gradient each step. Each step's
/// scalars are a fresh buffer of `Scalars::words`, as `adamw_scalars` allocates and writes
/// one per step; the kernel reads them from memory so a recorded step can replay.
#[test]
fn adamw_matches_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    let n = 3000;
    let h = AdamW { lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 };
    let (mut p, mut m) = (normals(n, 5000), scaled(n, 5001, 0.1));
    // The second moment is a running mean of squares: never negative.
    let mut v: Vec<f32> = normals(n, 5002).into_iter().map(|x| 0.01 * x * x).collect();
    let grads = [normals(n, 5003), normals(n, 5004)];

    let mut e = Emu::default();
    let (ep, em, ev) = (e.f32s(&p), e.f32s(&m), e.f32s(&v));
    for (step, g) in (1..=2).zip(&grads) {
        let s = scalars(&h, step).unwrap();
        adamw_with(&mut p, g, &mut m, &mut v, &s).unwrap();
        let (eg, es) = (e.f32s(g), e.f32s(&s.words()));
        e.ew("adamw", n, &[A::P(ep), A::P(eg), A::P(em), A::P(ev), A::I(n as i64), A::P(es)]);
    }
    let out = e.run(bin);
    check("adamw: param", &p, &out[ep.0 as usize], EW);
    check("adamw: first moment", &m, &out[em.0 as usize], EW);
    check("adamw: second moment", &v, &out[ev.0 as usize], EW);
}

/// Muon's two kernels on devcheck's 3000 elements: `scale_by_inverse_norm` with its sum
/// of squares in a one-element buffer (the matrix's own, 0 with ε keeping it finite, a
/// negative and a NaN sum that count as 0), and `muon_apply` with each step's scalars
/// from a buffer of words, two steps of different learning rates.
#[test]
fn muon_kernels_match_the_cpu_under_emulation() {
    let Some(bin) = launcher_or_skip() else { return };
    let n = 3000;
    let x = normals(n, 6000);
    let own: f32 = x.iter().map(|v| v * v).sum();
    let mut e = Emu::default();
    let mut want = Vec::new();
    for (sumsq, eps) in [(own, 1e-7f32), (0.0, 1e-7), (-1e-30, 0.5), (f32::NAN, 0.5)] {
        let mut w = x.clone();
        scale_by_inverse_norm(&mut w, sumsq, eps);
        let (ex, es) = (e.f32s(&x), e.f32s(&[sumsq]));
        e.ew("scale_by_inverse_norm", n, &[A::P(ex), A::P(es), A::F(eps), A::I(n as i64)]);
        want.push((format!("scale_by_inverse_norm (sum {sumsq}, eps {eps})"), w, ex));
    }
    let (mut w, o) = (normals(n, 6001), normals(n, 6002));
    let ew = e.f32s(&w);
    let k = -0.2 * 40f32.sqrt();
    for step in 1..=2u32 {
        let h = AdamW { lr: 1e-2 / step as f32, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 };
        let s = scalars(&h, step).unwrap();
        muon_apply(&mut w, &o, &s, k).unwrap();
        let (eo, es) = (e.f32s(&o), e.f32s(&s.words()));
        e.ew("muon_apply", n, &[A::P(ew), A::P(eo), A::P(es), A::F(k), A::I(n as i64)]);
    }
    want.push(("muon_apply".into(), w, ew));
    let out = e.run(bin);
    for (what, w, buf) in want {
        check(&what, &w, &out[buf.0 as usize], EW);
    }
}
