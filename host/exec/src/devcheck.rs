//! Every kernel of a device checked against the CPU backend on the same inputs, and a
//! whole training step of the toy models: what `runner bench kernels --device cuda` and
//! `scripts/gpu-check.sh` run on a GPU.
//!
//! Inputs are seeded normals (indices uniform), uploaded identically to both devices;
//! f32 outputs start from the same random values on both, not zeros, so a kernel that
//! adds into an output it should overwrite (or the reverse), or leaves elements unwritten,
//! differs. A kernel passes when max |device − cpu| ≤ tol · max(1, max |cpu|) (GEMMs of
//! small FP8 gradients: relative to max |cpu| alone); tolerances are those of f32
//! arithmetic in another order (1e-5 for element-wise work, looser where long sums or
//! exp/log meet: attention, losses). A tolerance of 0 means the same bits (NaN payloads
//! aside): the conversions, copies and storage emulation. FP8 results of arithmetic are
//! compared in their own codes: at most one step of the format apart.

use serde::Serialize;

use runner_graph::DType;
use runner_kernels::cpu::precision::Fp8Format;
use runner_kernels::cpu::quant::QuantReport;
use runner_kernels::cpu::adamw::AdamW;
use runner_kernels::cpu::attention::Attn;
use runner_kernels::cpu::cp::CpShard;
use runner_kernels::cpu::matmul::Gemm;
use runner_kernels::cpu::moe::{Router, ScoreFn};
use runner_kernels::cpu::rope::Rope;
use runner_kernels::cpu::ssm::{Conv1d, Ssm, SsmGrads, SsmInputs};

use crate::cpu::{Cpu, CpuBuffer};
use crate::device::{CastProducer, ConcatShapes, Device, DeviceBuffer, Elem, ExecError, ExpertWeights, adamw_scalars};
use crate::executor::{ADAMW_DEFAULT, ExecOptions, Executor, Input, MUON_DEFAULT, Optimizer, SplitMix};
use crate::toy;

/// One comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CheckRow {
    /// Kernel (and case).
    pub kernel: String,
    /// max |device − cpu| / max(1, max |cpu|).
    pub error: f64,
    pub tolerance: f64,
    pub ok: bool,
}

/// `error` of `got` against `want`, as [`CheckRow::error`]; a length mismatch or a NaN
/// where the reference has none is infinite.
pub fn relative_error(want: &[f32], got: &[f32]) -> f64 {
    relative_error_over(want, got, 1.0)
}

/// As [`relative_error`], relative to max(`floor`, max |want|).
fn relative_error_over(want: &[f32], got: &[f32], floor: f64) -> f64 {
    if want.len() != got.len() {
        return f64::INFINITY;
    }
    let scale = want.iter().fold(floor, |m, &x| if x.is_finite() { m.max(f64::from(x).abs()) } else { m });
    if scale == 0.0 {
        return if want == got { 0.0 } else { f64::INFINITY };
    }
    let mut worst = 0f64;
    for (&w, &g) in want.iter().zip(got) {
        let e = match (w.is_nan(), g.is_nan()) {
            (true, true) => 0.0,
            (false, false) if w == g => 0.0,
            (false, false) => (f64::from(w) - f64::from(g)).abs(),
            _ => f64::INFINITY,
        };
        worst = worst.max(e);
    }
    worst / scale
}

/// Infinite unless every element has the same bits (any NaN equals any NaN): `-0.0`
/// against `0.0` is a difference here.
fn bit_error(want: &[f32], got: &[f32]) -> f64 {
    let same = want.len() == got.len() && want.iter().zip(got).all(|(w, g)| w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan()));
    if same { 0.0 } else { f64::INFINITY }
}

/// The largest difference between two FP8 tensors of one `scale`, in steps of the format
/// at the larger value's magnitude (1: neighbouring codes, as rounding two f32 results
/// that differ in their last bits may give; a NaN or infinity against a number:
/// infinite).
pub fn code_steps(want: &[f32], got: &[f32], scale: f32, format: Fp8Format) -> f64 {
    if want.len() != got.len() {
        return f64::INFINITY;
    }
    // Mantissa bits and the smallest normal exponent (subnormals share its step).
    let (mantissa, min_exp) = match format {
        Fp8Format::E4M3 => (3, -6),
        Fp8Format::E5M2 => (2, -14),
    };
    let mut worst = 0f64;
    for (&w, &g) in want.iter().zip(got) {
        let e = match (w.is_nan(), g.is_nan()) {
            (true, true) => 0.0,
            (false, false) if w == g => 0.0,
            (false, false) if !(w.is_finite() && g.is_finite()) => f64::INFINITY,
            (false, false) => {
                let (a, b) = (f64::from(w) * f64::from(scale), f64::from(g) * f64::from(scale));
                let top = a.abs().max(b.abs());
                let exp = (top.log2().floor() as i32).max(min_exp);
                (a - b).abs() / 2f64.powi(exp - mantissa)
            }
            _ => f64::INFINITY,
        };
        worst = worst.max(e);
    }
    worst
}

/// A quantisation's counts, compared as they are (saturated, underflowed, non-finite).
fn counts(r: &QuantReport) -> [f32; 3] {
    [r.saturated as f32, r.underflowed as f32, r.nonfinite as f32]
}

/// The two devices and the rows so far.
struct Pair<'a, D: Device> {
    cpu: Cpu,
    dev: &'a D,
    rows: Vec<CheckRow>,
    rng: SplitMix,
}

type Two<B> = (CpuBuffer, B);

impl<D: Device> Pair<'_, D> {
    fn randn(&mut self, n: usize, std: f32) -> Vec<f32> {
        let mut v = vec![0f32; n];
        self.rng.normals(&mut v, std);
        v
    }
    fn ints(&mut self, n: usize, below: u32) -> Vec<u32> {
        (0..n).map(|_| (self.rng.next_u64() % u64::from(below.max(1))) as u32).collect()
    }
    fn put(&mut self, elem: Elem, data: &[f32]) -> Result<Two<D::Buffer>, ExecError> {
        let (mut c, mut d) = (self.cpu.alloc(elem, data.len())?, self.dev.alloc(elem, data.len())?);
        self.cpu.write_f32(&mut c, data)?;
        self.dev.write_f32(&mut d, data)?;
        Ok((c, d))
    }
    fn f(&mut self, data: &[f32]) -> Result<Two<D::Buffer>, ExecError> {
        self.put(Elem::F32, data)
    }
    fn randf(&mut self, n: usize) -> Result<Two<D::Buffer>, ExecError> {
        let v = self.randn(n, 1.0);
        self.f(&v)
    }
    fn ids(&mut self, data: &[u32]) -> Result<Two<D::Buffer>, ExecError> {
        let (mut c, mut d) = (self.cpu.alloc(Elem::I32, data.len())?, self.dev.alloc(Elem::I32, data.len())?);
        self.cpu.write_u32(&mut c, data)?;
        self.dev.write_u32(&mut d, data)?;
        Ok((c, d))
    }
    /// f32 outputs holding the same random values on both devices. The trait's contract
    /// is that outputs named "adds into" accumulate and every other is overwritten (real
    /// buffers start uninitialised): zeros would hide a kernel that breaks either way.
    fn out(&mut self, n: usize) -> Result<Two<D::Buffer>, ExecError> {
        self.randf(n)
    }
    /// Zeroed outputs of another element type (indices, FP8 codes).
    fn outs(&mut self, elem: Elem, n: usize) -> Result<Two<D::Buffer>, ExecError> {
        let (mut c, mut d) = (self.cpu.alloc(elem, n)?, self.dev.alloc(elem, n)?);
        self.cpu.zero(&mut c)?;
        self.dev.zero(&mut d)?;
        Ok((c, d))
    }
    fn read(&self, x: &Two<D::Buffer>) -> Result<(Vec<f32>, Vec<f32>), ExecError> {
        Ok(if x.0.elem() == Elem::I32 {
            let f = |v: Vec<u32>| v.into_iter().map(|i| i as f32).collect::<Vec<_>>();
            (f(self.cpu.read_u32(&x.0)?), f(self.dev.read_u32(&x.1)?))
        } else {
            (self.cpu.read_f32(&x.0)?, self.dev.read_f32(&x.1)?)
        })
    }
    fn push(&mut self, kernel: &str, error: f64, tol: f64) {
        self.rows.push(CheckRow {
            kernel: kernel.into(),
            error,
            tolerance: tol,
            ok: error <= tol,
        });
    }
    /// Relative to max(1, max |cpu|); a tolerance of 0 asks for the same bits.
    fn check(&mut self, kernel: &str, x: &Two<D::Buffer>, tol: f64) -> Result<(), ExecError> {
        let (want, got) = self.read(x)?;
        self.check_values(kernel, &want, &got, tol);
        Ok(())
    }
    /// Relative to max |cpu| alone (results far below 1).
    fn check_rel(&mut self, kernel: &str, x: &Two<D::Buffer>, tol: f64) -> Result<(), ExecError> {
        let (want, got) = self.read(x)?;
        self.push(kernel, relative_error_over(&want, &got, 0.0), tol);
        Ok(())
    }
    /// FP8 results of arithmetic: the same scale, codes at most `steps` apart.
    fn check_codes(&mut self, kernel: &str, x: &Two<D::Buffer>, steps: f64) -> Result<(), ExecError> {
        let format = x.0.elem().fp8().ok_or_else(|| ExecError::State(format!("{kernel}: codes of a {} buffer", x.0.elem().name())))?;
        let (want, got) = self.read(x)?;
        let (sw, sg) = (self.cpu.fp8_scale(&x.0)?, self.dev.fp8_scale(&x.1)?);
        let error = if sw.to_bits() == sg.to_bits() { code_steps(&want, &got, sw, format) } else { f64::INFINITY };
        self.push(kernel, error, steps);
        Ok(())
    }
    /// As [`Pair::check`], on values already read.
    fn check_values(&mut self, kernel: &str, want: &[f32], got: &[f32], tol: f64) {
        let error = if tol == 0.0 { bit_error(want, got) } else { relative_error(want, got) };
        self.push(kernel, error, tol);
    }
    fn check_value(&mut self, kernel: &str, want: f32, got: f32, tol: f64) {
        self.check_values(kernel, &[want], &[got], tol);
    }
}

/// Element-wise tolerance (f32 rounding of the same formula, other libm).
const EW: f64 = 1e-5;
/// Long reductions and exp/log (norms, attention, losses, GEMMs over k ~ 100s).
const RED: f64 = 1e-4;

/// One family of kernel checks.
type Family<'a, D> = fn(&mut Pair<'a, D>) -> Result<(), ExecError>;

/// Compare every kernel of `dev` with the CPU backend; one row per kernel and case. A
/// family of checks that fails outright on either device (a kernel or GEMM refused, a
/// device error) ends with a failed row naming the error, and the other families still
/// run: on a GPU lent for minutes, one refused call must not hide every other result.
pub fn compare_kernels<D: Device>(dev: &D) -> Vec<CheckRow> {
    let mut p = Pair {
        cpu: Cpu::new(),
        dev,
        rows: Vec::new(),
        rng: SplitMix(0x5EED),
    };
    let families: [(&str, Family<'_, D>); 10] = [
        ("element-wise", elementwise),
        ("GEMM", gemms),
        ("format", formats),
        ("layer", layers),
        ("fused cast", fused_casts),
        ("attention", attention),
        ("loss", losses),
        ("expert", experts),
        ("FP8 grouped GEMM", fp8_grouped),
        ("Mamba", mamba),
    ];
    for (name, family) in families {
        let ran = family(&mut p);
        failed_to_run(&mut p.rows, &format!("{name} kernel checks"), ran);
    }
    p.rows
}

fn elementwise<D: Device>(p: &mut Pair<'_, D>) -> Result<(), ExecError> {
    let n = 3000;
    let (a, b, g) = (p.randf(n)?, p.randf(n)?, p.randf(n)?);
    let mut o = p.out(n)?;
    p.cpu.add_forward(&mut o.0, &a.0, &b.0)?;
    p.dev.add_forward(&mut o.1, &a.1, &b.1)?;
    p.check("add_forward", &o, 0.0)?;
    p.cpu.add_assign(&mut o.0, &a.0)?;
    p.dev.add_assign(&mut o.1, &a.1)?;
    p.check("add_assign", &o, 0.0)?;
    p.cpu.scale(&mut o.0, 0.37)?;
    p.dev.scale(&mut o.1, 0.37)?;
    p.check("scale", &o, 0.0)?;
    let bias = p.randf(60)?;
    p.cpu.add_bias(&mut o.0, &bias.0)?;
    p.dev.add_bias(&mut o.1, &bias.1)?;
    p.check("add_bias", &o, 0.0)?;
    let mut db = p.out(60)?;
    p.cpu.bias_backward(&mut db.0, &a.0)?;
    p.dev.bias_backward(&mut db.1, &a.1)?;
    p.check("bias_backward", &db, EW)?;
    // Many rows a column: the two-stage column sum's chunks of several rows (999 rows:
    // 125 chunks of 8, the last of 7), over more columns than one block.
    let tall = p.randf(999 * 300)?;
    let mut db = p.out(300)?;
    p.cpu.bias_backward(&mut db.0, &tall.0)?;
    p.dev.bias_backward(&mut db.1, &tall.1)?;
    p.check("bias_backward (999 rows x 300)", &db, RED)?;
    for name in ["swiglu", "geglu", "gelu", "squared_relu"] {
        let mut o = p.out(n)?;
        let (mut d1, mut d2) = (p.out(n)?, p.out(n)?);
        match name {
            "swiglu" => {
                p.cpu.swiglu_forward(&mut o.0, &a.0, &b.0)?;
                p.dev.swiglu_forward(&mut o.1, &a.1, &b.1)?;
                p.cpu.swiglu_backward(&mut d1.0, &mut d2.0, &g.0, &a.0, &b.0)?;
                p.dev.swiglu_backward(&mut d1.1, &mut d2.1, &g.1, &a.1, &b.1)?;
            }
            "geglu" => {
                p.cpu.geglu_forward(&mut o.0, &a.0, &b.0)?;
                p.dev.geglu_forward(&mut o.1, &a.1, &b.1)?;
                p.cpu.geglu_backward(&mut d1.0, &mut d2.0, &g.0, &a.0, &b.0)?;
                p.dev.geglu_backward(&mut d1.1, &mut d2.1, &g.1, &a.1, &b.1)?;
            }
            "gelu" => {
                p.cpu.gelu_forward(&mut o.0, &a.0)?;
                p.dev.gelu_forward(&mut o.1, &a.1)?;
                p.cpu.gelu_backward(&mut d1.0, &g.0, &a.0)?;
                p.dev.gelu_backward(&mut d1.1, &g.1, &a.1)?;
            }
            _ => {
                p.cpu.squared_relu_forward(&mut o.0, &a.0)?;
                p.dev.squared_relu_forward(&mut o.1, &a.1)?;
                p.cpu.squared_relu_backward(&mut d1.0, &g.0, &a.0)?;
                p.dev.squared_relu_backward(&mut d1.1, &g.1, &a.1)?;
            }
        }
        p.check(&format!("{name}_forward"), &o, EW)?;
        p.check(&format!("{name}_backward"), &d1, EW)?;
        if matches!(name, "swiglu" | "geglu") {
            p.check(&format!("{name}_backward (up)"), &d2, EW)?;
        }
    }
    // concat with a broadcast leading axis (MLA's shared rotary key).
    let (so, sa, sb) = ([2u64, 3, 4, 5], [2u64, 3, 4, 3], [2u64, 3, 1, 2]);
    let s = ConcatShapes { out: &so, a: &sa, b: &sb };
    let (ca, cb) = (p.randf(72)?, p.randf(12)?);
    let mut co = p.out(120)?;
    p.cpu.concat_forward(&mut co.0, &ca.0, &cb.0, s)?;
    p.dev.concat_forward(&mut co.1, &ca.1, &cb.1, s)?;
    p.check("concat_forward", &co, 0.0)?;
    let gco = p.randf(120)?;
    let (mut da, mut dbb) = (p.out(72)?, p.out(12)?);
    p.cpu.concat_backward(Some(&mut da.0), Some(&mut dbb.0), &gco.0, s)?;
    p.dev.concat_backward(Some(&mut da.1), Some(&mut dbb.1), &gco.1, s)?;
    p.check("concat_backward (a)", &da, 0.0)?;
    p.check("concat_backward (broadcast b)", &dbb, EW)?;
    // layout kernels
    let x = p.randf(2 * 3 * 5)?;
    let mut t = p.out(30)?;
    p.cpu.transpose_outer(&mut t.0, &x.0, 2, 3, 5)?;
    p.dev.transpose_outer(&mut t.1, &x.1, 2, 3, 5)?;
    p.check("transpose_outer", &t, 0.0)?;
    // The 2- and 1-byte layout kernels (BF16 and FP8 buffers; FP8 keeps its scale).
    for elem in [Elem::BF16, Elem::F8E4M3] {
        let xv = p.randn(2 * 3 * 5, 1.0);
        let x = p.put(elem, &xv)?;
        let mut t = p.outs(elem, 30)?;
        p.cpu.transpose_outer(&mut t.0, &x.0, 2, 3, 5)?;
        p.dev.transpose_outer(&mut t.1, &x.1, 2, 3, 5)?;
        p.check(&format!("transpose_outer {}", elem.name()), &t, 0.0)?;
        if elem.fp8().is_some() {
            let (sc, sd) = (p.cpu.fp8_scale(&t.0)?, p.dev.fp8_scale(&t.1)?);
            p.check_value("transpose_outer fp8-e4m3 scale", sc, sd, 0.0);
        }
    }
    p.cpu.copy(&mut t.0, 4, &x.0, 11, 9)?;
    p.dev.copy(&mut t.1, 4, &x.1, 11, 9)?;
    p.check("copy", &t, 0.0)?;
    // AdamW, two steps
    let (mut w, gr) = (p.randf(n)?, p.randf(n)?);
    let (mut m, mut v) = (p.out(n)?, p.out(n)?);
    let h = AdamW { lr: 1e-2, ..ADAMW_DEFAULT };
    for step in 1..=2 {
        let s = (adamw_scalars(&p.cpu, &h, step)?, adamw_scalars(p.dev, &h, step)?);
        p.cpu.adamw(&mut w.0, &gr.0, &mut m.0, &mut v.0, &s.0)?;
        p.dev.adamw(&mut w.1, &gr.1, &mut m.1, &mut v.1, &s.1)?;
    }
    p.check("adamw (param)", &w, EW)?;
    p.check("adamw (second moment)", &v, EW)?;
    // Muon's kernels: the normalisation by a sum of squares on the device (the buffer's
    // own), and the update reading lr and decay from the step scalars.
    let mut x = p.randf(n)?;
    let own = p.cpu.read_f32(&x.0)?.iter().map(|v| v * v).sum::<f32>();
    let sq = p.f(&[own])?;
    p.cpu.scale_by_inverse_norm(&mut x.0, &sq.0, 1e-7)?;
    p.dev.scale_by_inverse_norm(&mut x.1, &sq.1, 1e-7)?;
    p.check("scale_by_inverse_norm", &x, EW)?;
    let s = (adamw_scalars(&p.cpu, &h, 3)?, adamw_scalars(p.dev, &h, 3)?);
    p.cpu.muon_apply(&mut w.0, &x.0, &s.0, -0.2 * 40f32.sqrt())?;
    p.dev.muon_apply(&mut w.1, &x.1, &s.1, -0.2 * 40f32.sqrt())?;
    p.check("muon_apply", &w, EW)?;
    Ok(())
}

fn gemms<D: Device>(p: &mut Pair<'_, D>) -> Result<(), ExecError> {
    let (m, n, k) = (48, 32, 64);
    for (ta, tb) in [(false, true), (false, false), (true, false), (true, true)] {
        let g = Gemm { m, n, k, trans_a: ta, trans_b: tb };
        for elem in [Elem::F32, Elem::BF16, Elem::F16, Elem::F8E4M3] {
            let (av, bv) = (p.randn(m * k, 1.0), p.randn(k * n, 1.0));
            let (a, b) = (p.put(elem, &av)?, p.put(elem, &bv)?);
            let mut c = p.randf(m * n)?;
            p.cpu.matmul(&mut c.0, &a.0, &b.0, g, true)?;
            p.dev.matmul(&mut c.1, &a.1, &b.1, g, true)?;
            p.check(&format!("matmul {} {}{} (+=)", elem.name(), if ta { "T" } else { "N" }, if tb { "T" } else { "N" }), &c, RED)?;
        }
    }
    // The native route's gradient GEMMs: a small E5M2 gradient times an E4M3 weight or
    // input in the layouts the input gradient (NN) and the weight gradient (TN) take, and
    // NT, into f32, written and added into (to a c of the product's size), relative to
    // the result's own size.
    for (ta, tb) in [(false, false), (true, false), (false, true)] {
        let g = Gemm { m, n, k, trans_a: ta, trans_b: tb };
        let (av, bv) = (p.randn(m * k, 1e-3), p.randn(k * n, 1.0));
        let (a, b) = (p.put(Elem::F8E5M2, &av)?, p.put(Elem::F8E4M3, &bv)?);
        for accumulate in [false, true] {
            let cv = p.randn(m * n, 1e-2);
            let mut c = p.f(&cv)?;
            p.cpu.matmul(&mut c.0, &a.0, &b.0, g, accumulate)?;
            p.dev.matmul(&mut c.1, &a.1, &b.1, g, accumulate)?;
            let layout = format!("{}{}", if ta { "T" } else { "N" }, if tb { "T" } else { "N" });
            p.check_rel(&format!("matmul fp8-e5m2 x fp8-e4m3 {layout} -> f32{}, relative", if accumulate { " (+=)" } else { "" }), &c, RED)?;
        }
    }
    // A token count that is not a multiple of 16 (37): the free dimension of the forward
    // (NT) and input-gradient (NN) GEMMs, and the weight gradient's (TN) contraction,
    // which the device pads with zeros to cuBLASLt's multiple of 16; and an odd
    // contraction in the NT layout, whose operands are padded without a transpose.
    let odd = [
        (Gemm { m: 37, n, k, trans_a: false, trans_b: true }, "NT, m = 37"),
        (Gemm { m: 37, n, k, trans_a: false, trans_b: false }, "NN, m = 37"),
        (Gemm { m: n, n: k, k: 37, trans_a: true, trans_b: false }, "TN, k = 37"),
        (Gemm { m, n, k: 40, trans_a: false, trans_b: true }, "NT, k = 40"),
    ];
    for (g, name) in odd {
        let (av, bv) = (p.randn(g.m * g.k, 1.0), p.randn(g.k * g.n, 1.0));
        let (a, b) = (p.put(Elem::F8E4M3, &av)?, p.put(Elem::F8E4M3, &bv)?);
        let mut c = p.randf(g.m * g.n)?;
        p.cpu.matmul(&mut c.0, &a.0, &b.0, g, false)?;
        p.dev.matmul(&mut c.1, &a.1, &b.1, g, false)?;
        p.check(&format!("matmul fp8-e4m3 {name} -> f32"), &c, RED)?;
    }
    // FP8 mixed formats into bf16, and an FP8 output with its amax.
    let g = Gemm { m, n, k, trans_a: false, trans_b: true };
    let (av, bv) = (p.randn(m * k, 1.0), p.randn(k * n, 0.1));
    let (a, b) = (p.put(Elem::F8E4M3, &av)?, p.put(Elem::F8E5M2, &bv)?);
    let mut c = p.outs(Elem::BF16, m * n)?;
    p.cpu.matmul(&mut c.0, &a.0, &b.0, g, false)?;
    p.dev.matmul(&mut c.1, &a.1, &b.1, g, false)?;
    p.check("matmul fp8-e4m3 x fp8-e5m2 -> bf16", &c, 1e-2)?;
    let mut c8 = p.put(Elem::F8E4M3, &p_fill(m * n, 8.0))?;
    p.cpu.matmul(&mut c8.0, &a.0, &b.0, g, false)?;
    p.dev.matmul(&mut c8.1, &a.1, &b.1, g, false)?;
    p.check_codes("matmul -> fp8-e4m3 (delayed scale), in FP8 steps", &c8, 1.0)?;
    let (ac, ad) = (p.cpu.fp8_amax(&c8.0)?, p.dev.fp8_amax(&c8.1)?);
    p.check_value("matmul fp8 output amax", ac, ad, RED);
    Ok(())
}

fn p_fill(n: usize, v: f32) -> Vec<f32> {
    let mut x = vec![0f32; n];
    x[0] = v;
    x
}

fn formats<D: Device>(p: &mut Pair<'_, D>) -> Result<(), ExecError> {
    // Values over a wide range, with the edge cases of every format.
    let mut v = p.randn(4000, 30.0);
    v.extend([0.0, -0.0, 1e-30, -1e-8, 65504.0, 70000.0, 448.0, 465.0, 57344.0, f32::INFINITY, f32::NAN]);
    let x = p.f(&v)?;
    for elem in [Elem::BF16, Elem::F16, Elem::F8E4M3, Elem::F8E5M2] {
        let mut q = p.outs(elem, v.len())?;
        p.cpu.cast(&mut q.0, &x.0)?;
        p.dev.cast(&mut q.1, &x.1)?;
        p.check(&format!("cast f32 -> {}", elem.name()), &q, 0.0)?;
        let (sc, sd) = (p.cpu.fp8_scale(&q.0)?, p.dev.fp8_scale(&q.1)?);
        p.check_value(&format!("cast f32 -> {} scale", elem.name()), sc, sd, 0.0);
    }
    for (dtype, row) in [(DType::BF16, 1), (DType::F16, 1), (DType::Fp8E4M3, 1), (DType::Fp8E5M2, 1), (DType::MxFp8, 100)] {
        let mut y = p.f(&v[..4000])?;
        p.cpu.round_to_storage(&mut y.0, dtype, row)?;
        p.dev.round_to_storage(&mut y.1, dtype, row)?;
        p.check(&format!("round_to_storage {}", dtype.name()), &y, 0.0)?;
    }
    // Scaled quantisation of GEMM operands: the same bits and the same counts.
    use runner_kernels::cpu::quant::{BlockSpec, FloatFormat, Format, QuantSpec, ScaleFormat, ScaleRounding};
    let block = |format, block, scale_format, scale_rounding, tensor_scale, stochastic| {
        QuantSpec::Blocks(BlockSpec { format, block, scale_format, scale_rounding, tensor_scale, saturate: true, stochastic })
    };
    let specs = [
        ("bf16", QuantSpec::Float(FloatFormat::Bf16)),
        ("f16", QuantSpec::Float(FloatFormat::F16)),
        ("f32", QuantSpec::Float(FloatFormat::F32)),
        ("fp8 e4m3 delayed", QuantSpec::Tensor { format: Format::E4M3, scale: Some(5.0), margin: 0, saturate: true, stochastic: None }),
        ("fp8 e5m2 current", QuantSpec::Tensor { format: Format::E5M2, scale: None, margin: 1, saturate: false, stochastic: None }),
        ("fp8 e4m3 stochastic", QuantSpec::Tensor { format: Format::E4M3, scale: None, margin: 0, saturate: true, stochastic: Some(5) }),
        ("mxfp8 1x32", block(Format::E4M3, (1, 32), ScaleFormat::E8M0, ScaleRounding::Pow2Up, false, None)),
        ("mxfp8 32x1 floor", block(Format::E4M3, (32, 1), ScaleFormat::E8M0, ScaleRounding::Pow2Down, false, None)),
        ("fp8 128x128", block(Format::E4M3, (128, 128), ScaleFormat::Fp32, ScaleRounding::Exact, false, None)),
        ("nvfp4 1x16", block(Format::E2M1, (1, 16), ScaleFormat::E4M3, ScaleRounding::Exact, true, Some(9))),
        ("nvfp4 16x16", block(Format::E2M1, (16, 16), ScaleFormat::E4M3, ScaleRounding::Exact, true, None)),
    ];
    for (name, spec) in specs {
        let mut y = p.f(&v[..4000])?;
        let rc = p.cpu.quantize(&mut y.0, 40, 100, &spec)?;
        let rd = p.dev.quantize(&mut y.1, 40, 100, &spec).and_then(|s| p.dev.report(s))?;
        p.check(&format!("quantize {name}"), &y, 0.0)?;
        p.check_values(&format!("quantize {name} counts"), &counts(&rc), &counts(&rd), 0.0);
        p.check_value(&format!("quantize {name} amax"), rc.amax, rd.amax, 0.0);
    }
    // NVFP4 of a tensor of tiny values (amax near 1e-39, below 7.9e-36): its encode scales
    // are held at FLT_MAX on both sides (an Inf one made a block's zeros NaN).
    let tiny: Vec<f32> = v[..4000].iter().map(|x| if x.is_finite() { x * 1e-40 } else { 0.0 }).collect();
    let spec = block(Format::E2M1, (1, 16), ScaleFormat::E4M3, ScaleRounding::Exact, true, None);
    let mut y = p.f(&tiny)?;
    let rc = p.cpu.quantize(&mut y.0, 40, 100, &spec)?;
    let rd = p.dev.quantize(&mut y.1, 40, 100, &spec).and_then(|s| p.dev.report(s))?;
    p.check("quantize nvfp4 1x16 of tiny values", &y, 0.0)?;
    p.check_values("quantize nvfp4 1x16 of tiny values counts", &counts(&rc), &counts(&rd), 0.0);
    p.check_value("quantize nvfp4 1x16 of tiny values scale", rc.scale, rd.scale, 0.0);
    // The native route's one-pass cast of an operand to codes (given and current scales,
    // saturating and not): the same codes, scale and counts. Current scaling on finite
    // values (the edge cases' infinity would make its amax infinite and its scale 1).
    let finite = p.f(&v[..4000])?;
    let tensor = |format, scale, saturate| QuantSpec::Tensor { format, scale, margin: 0, saturate, stochastic: None };
    for (elem, name, spec, input) in [
        (Elem::F8E4M3, "e4m3 delayed", tensor(Format::E4M3, Some(5.0), true), &x),
        (Elem::F8E4M3, "e4m3 delayed, not saturating", tensor(Format::E4M3, Some(5.0), false), &x),
        (Elem::F8E4M3, "e4m3 current, not saturating", tensor(Format::E4M3, None, false), &finite),
        (Elem::F8E5M2, "e5m2 current", tensor(Format::E5M2, None, true), &finite),
        (Elem::F8E5M2, "e5m2 current, edge cases", tensor(Format::E5M2, None, true), &x),
        (Elem::F8E5M2, "e5m2 delayed", tensor(Format::E5M2, Some(0.125), true), &x),
    ] {
        let mut q = p.outs(elem, input.0.len())?;
        let rc = p.cpu.quantize_fp8_codes(&mut q.0, &input.0, 0, &spec)?;
        let rd = p.dev.quantize_fp8_codes(&mut q.1, &input.1, 0, &spec).and_then(|s| p.dev.report(s))?;
        p.check(&format!("quantize_fp8_codes {name}"), &q, 0.0)?;
        p.check_values(&format!("quantize_fp8_codes {name} counts"), &counts(&rc), &counts(&rd), 0.0);
        p.check_value(&format!("quantize_fp8_codes {name} scale"), p.cpu.fp8_scale(&q.0)?, p.dev.fp8_scale(&q.1)?, 0.0);
        p.check_value(&format!("quantize_fp8_codes {name} amax"), p.cpu.fp8_amax(&q.0)?, p.dev.fp8_amax(&q.1)?, 0.0);
    }
    let mut h = p.f(&v[..3200])?;
    p.cpu.hadamard_rows(&mut h.0, 40, 80, 16, 3)?;
    p.dev.hadamard_rows(&mut h.1, 40, 80, 16, 3)?;
    p.check("hadamard_rows 16", &h, EW)?;
    let mut h = p.f(&v[..3200])?;
    p.cpu.hadamard_rows(&mut h.0, 100, 32, 64, 8)?;
    p.dev.hadamard_rows(&mut h.1, 100, 32, 64, 8)?;
    p.check("hadamard_rows 64 (a short last group)", &h, EW)?;
    Ok(())
}

/// The fused norm / activation + cast: the output (and RMSNorm's rstd) as the unfused
/// kernel's, to its tolerance against the CPU; the codes exactly the device's own
/// one-pass cast of the output it wrote, with the same counts and amax, and within one
/// code of the CPU's (the outputs differ in their last bits). E4M3 saturating and E5M2
/// overflowing to infinity; RMSNorm also over more columns than a block has threads.
fn fused_casts<D: Device>(p: &mut Pair<'_, D>) -> Result<(), ExecError> {
    use runner_kernels::cpu::quant::{Format, QuantSpec};
    let e4m3 = QuantSpec::Tensor { format: Format::E4M3, scale: Some(40.0), margin: 0, saturate: true, stochastic: None };
    let e5m2 = QuantSpec::Tensor { format: Format::E5M2, scale: Some(8192.0), margin: 0, saturate: false, stochastic: None };
    let mut cases = Vec::new();
    for name in ["rmsnorm", "swiglu", "geglu", "gelu", "squared_relu"] {
        cases.push((name, 37, 96, Elem::F8E4M3, &e4m3, ""));
        cases.push((name, 37, 96, Elem::F8E5M2, &e5m2, ", e5m2 not saturating"));
    }
    cases.push(("rmsnorm", 8, 4100, Elem::F8E4M3, &e4m3, ", 8 x 4100"));
    for (name, rows, c, elem, spec, tag) in cases {
        let n = rows * c;
        let (x, w, up) = (p.randf(n)?, p.randf(c)?, p.randf(n)?);
        let (mut o, mut rstd, mut q) = (p.out(n)?, p.out(rows)?, p.outs(elem, n)?);
        let (oc, od) = (&mut o.0, &mut o.1);
        let (cpu, dev): (CastProducer<'_, CpuBuffer>, CastProducer<'_, D::Buffer>) = match name {
            "rmsnorm" => (
                CastProducer::RmsNorm { out: oc, rstd: &mut rstd.0, x: &x.0, w: &w.0, c, eps: 1e-5 },
                CastProducer::RmsNorm { out: od, rstd: &mut rstd.1, x: &x.1, w: &w.1, c, eps: 1e-5 },
            ),
            "swiglu" => (CastProducer::SwiGlu { out: oc, gate: &x.0, up: &up.0 }, CastProducer::SwiGlu { out: od, gate: &x.1, up: &up.1 }),
            "geglu" => (CastProducer::GeGlu { out: oc, gate: &x.0, up: &up.0 }, CastProducer::GeGlu { out: od, gate: &x.1, up: &up.1 }),
            "gelu" => (CastProducer::Gelu { out: oc, x: &x.0 }, CastProducer::Gelu { out: od, x: &x.1 }),
            _ => (CastProducer::SquaredRelu { out: oc, x: &x.0 }, CastProducer::SquaredRelu { out: od, x: &x.1 }),
        };
        p.cpu.forward_with_cast(cpu, &mut q.0, spec)?;
        let rd = p.dev.forward_with_cast(dev, &mut q.1, spec).and_then(|s| p.dev.report(s))?;
        p.check(&format!("forward_with_cast {name}{tag} (output)"), &o, EW)?;
        if name == "rmsnorm" {
            p.check(&format!("forward_with_cast {name}{tag} (rstd)"), &rstd, EW)?;
        }
        p.check_codes(&format!("forward_with_cast {name}{tag} (codes against the CPU's), in FP8 steps"), &q, 1.0)?;
        let mut again = p.dev.alloc(elem, n)?;
        let ra = p.dev.quantize_fp8_codes(&mut again, &o.1, 0, spec).and_then(|s| p.dev.report(s))?;
        let (fused, cast) = (p.dev.read_f32(&q.1)?, p.dev.read_f32(&again)?);
        p.push(&format!("forward_with_cast {name}{tag} (codes = the cast of its output)"), bit_error(&cast, &fused), 0.0);
        p.check_values(&format!("forward_with_cast {name}{tag} (counts)"), &counts(&ra), &counts(&rd), 0.0);
        p.check_value(&format!("forward_with_cast {name}{tag} (amax)"), ra.amax, rd.amax, 0.0);
    }
    Ok(())
}

fn layers<D: Device>(p: &mut Pair<'_, D>) -> Result<(), ExecError> {
    // Norms: fewer columns than a block's threads; a row's strided loop over more; and
    // many rows (the column sums of dw, db in chunks of several rows and a short last
    // one, over more columns than one block).
    for (rows, c, tag) in [(37, 96, ""), (8, 4100, " (8 x 4100)"), (999, 300, " (999 x 300)")] {
        let (x, w, bb, g) = (p.randf(rows * c)?, p.randf(c)?, p.randf(c)?, p.randf(rows * c)?);
        let (mut o, mut rstd, mut mean) = (p.out(rows * c)?, p.out(rows)?, p.out(rows)?);
        p.cpu.rmsnorm_forward(&mut o.0, &mut rstd.0, &x.0, &w.0, c, 1e-5)?;
        p.dev.rmsnorm_forward(&mut o.1, &mut rstd.1, &x.1, &w.1, c, 1e-5)?;
        p.check(&format!("rmsnorm_forward{tag}"), &o, EW)?;
        p.check(&format!("rmsnorm_forward rstd{tag}"), &rstd, EW)?;
        let (mut dx, mut dw, mut dbias) = (p.out(rows * c)?, p.out(c)?, p.out(c)?);
        p.cpu.rmsnorm_backward(&mut dx.0, &mut dw.0, &g.0, &x.0, &w.0, &rstd.0, c)?;
        p.dev.rmsnorm_backward(&mut dx.1, &mut dw.1, &g.1, &x.1, &w.1, &rstd.1, c)?;
        p.check(&format!("rmsnorm_backward (dx){tag}"), &dx, RED)?;
        p.check(&format!("rmsnorm_backward (dw){tag}"), &dw, RED)?;
        p.cpu.layernorm_forward(&mut o.0, &mut mean.0, &mut rstd.0, &x.0, &w.0, &bb.0, c, 1e-5)?;
        p.dev.layernorm_forward(&mut o.1, &mut mean.1, &mut rstd.1, &x.1, &w.1, &bb.1, c, 1e-5)?;
        p.check(&format!("layernorm_forward{tag}"), &o, EW)?;
        p.check(&format!("layernorm_forward mean{tag}"), &mean, EW)?;
        p.cpu.layernorm_backward(&mut dx.0, &mut dw.0, &mut dbias.0, &g.0, &x.0, &w.0, &mean.0, &rstd.0, c)?;
        p.dev.layernorm_backward(&mut dx.1, &mut dw.1, &mut dbias.1, &g.1, &x.1, &w.1, &mean.1, &rstd.1, c)?;
        p.check(&format!("layernorm_backward (dx){tag}"), &dx, RED)?;
        p.check(&format!("layernorm_backward (dw){tag}"), &dw, RED)?;
        p.check(&format!("layernorm_backward (db){tag}"), &dbias, RED)?;
    }
    // embedding, whole and as a vocab shard
    let (vocab, n, cc) = (50, 70, 24);
    let table = p.randf(vocab * cc)?;
    let toks = p.ints(n, vocab as u32);
    let t = p.ids(&toks)?;
    let gy = p.randf(n * cc)?;
    for start in [None, Some(20)] {
        let rows = if start.is_some() { 20 } else { vocab };
        let tab = match start {
            Some(_) => p.randf(rows * cc)?,
            None => {
                let whole = p.cpu.read_f32(&table.0)?;
                p.f(&whole)?
            }
        };
        let mut e = p.out(n * cc)?;
        p.cpu.embedding_forward(&mut e.0, &t.0, &tab.0, cc, start)?;
        p.dev.embedding_forward(&mut e.1, &t.1, &tab.1, cc, start)?;
        p.check(&format!("embedding_forward{}", if start.is_some() { " (vocab shard)" } else { "" }), &e, 0.0)?;
        let mut dt = p.out(rows * cc)?;
        p.cpu.embedding_backward(&mut dt.0, &gy.0, &t.0, cc, start)?;
        p.dev.embedding_backward(&mut dt.1, &gy.1, &t.1, cc, start)?;
        p.check(&format!("embedding_backward{}", if start.is_some() { " (vocab shard)" } else { "" }), &dt, EW)?;
    }
    // rotary, plain, as a cp rank, and from a position offset
    for (cp, pos_offset) in [(None, 0), (Some(CpShard { size: 2, rank: 1 }), 0), (None, 37)] {
        let r = Rope { b: 2, t: 12, h: 3, d: 16, rot_dim: 12, theta: 500_000.0, pos_offset, cp };
        let n = 2 * 12 * 3 * 16;
        let (x, g) = (p.randf(n)?, p.randf(n)?);
        let (mut o, mut dx) = (p.out(n)?, p.out(n)?);
        p.cpu.rope_forward(&mut o.0, &x.0, r)?;
        p.dev.rope_forward(&mut o.1, &x.1, r)?;
        p.cpu.rope_backward(&mut dx.0, &g.0, r)?;
        p.dev.rope_backward(&mut dx.1, &g.1, r)?;
        let tag = match (cp, pos_offset) {
            (Some(_), _) => " (cp rank 1 of 2)",
            (None, 0) => "",
            _ => " (from position 37)",
        };
        p.check(&format!("rope_forward{tag}"), &o, EW)?;
        p.check(&format!("rope_backward{tag}"), &dx, EW)?;
    }
    Ok(())
}

fn attention<D: Device>(p: &mut Pair<'_, D>) -> Result<(), ExecError> {
    let cases = [
        ("causal GQA", Attn { b: 2, t: 70, h: 4, hkv: 2, d: 32, dv: 32, causal: true, window: None, scale: 0.2, cp: None }),
        ("window, dv != d", Attn { b: 1, t: 65, h: 2, hkv: 1, d: 48, dv: 24, causal: true, window: Some(9), scale: 0.15, cp: None }),
        ("not causal", Attn { b: 1, t: 40, h: 2, hkv: 2, d: 16, dv: 16, causal: false, window: None, scale: 0.25, cp: None }),
        ("cp rank 0 of 2", Attn { b: 1, t: 32, h: 2, hkv: 1, d: 32, dv: 32, causal: true, window: None, scale: 0.2, cp: Some(CpShard { size: 2, rank: 0 }) }),
        ("head dim 128", Attn { b: 1, t: 64, h: 2, hkv: 1, d: 128, dv: 128, causal: true, window: None, scale: 0.09, cp: None }),
        ("cp rank 1 of 2", Attn { b: 1, t: 36, h: 2, hkv: 1, d: 32, dv: 32, causal: true, window: None, scale: 0.2, cp: Some(CpShard { size: 2, rank: 1 }) }),
        ("MLA head dims 192 / 128", Attn { b: 1, t: 70, h: 2, hkv: 2, d: 192, dv: 128, causal: true, window: None, scale: 0.07, cp: None }),
        // Odd head dims: the tiles' rows sit at an odd pitch (d | 1), not d + 1.
        ("odd head dims 33 / 31", Attn { b: 1, t: 40, h: 2, hkv: 1, d: 33, dv: 31, causal: true, window: None, scale: 0.17, cp: None }),
    ];
    for (name, a) in cases {
        let tk = a.kv_len();
        let (q, k, v) = (p.randf(a.b * a.t * a.h * a.d)?, p.randf(a.b * tk * a.hkv * a.d)?, p.randf(a.b * tk * a.hkv * a.dv)?);
        let (mut o, mut lse) = (p.out(a.b * a.t * a.h * a.dv)?, p.out(a.b * a.h * a.t)?);
        p.cpu.attention_forward(&mut o.0, &mut lse.0, &q.0, &k.0, &v.0, a)?;
        p.dev.attention_forward(&mut o.1, &mut lse.1, &q.1, &k.1, &v.1, a)?;
        p.check(&format!("attention_forward ({name})"), &o, RED)?;
        p.check(&format!("attention_forward lse ({name})"), &lse, RED)?;
        let g = p.randf(o.0.len())?;
        let (mut dq, mut dk, mut dv) = (p.out(q.0.len())?, p.out(k.0.len())?, p.out(v.0.len())?);
        p.cpu.attention_backward(&mut dq.0, &mut dk.0, &mut dv.0, &g.0, &q.0, &k.0, &v.0, &o.0, &lse.0, a)?;
        p.dev.attention_backward(&mut dq.1, &mut dk.1, &mut dv.1, &g.1, &q.1, &k.1, &v.1, &o.1, &lse.1, a)?;
        p.check(&format!("attention_backward dq ({name})"), &dq, RED)?;
        p.check(&format!("attention_backward dk ({name})"), &dk, RED)?;
        p.check(&format!("attention_backward dv ({name})"), &dv, RED)?;
    }
    Ok(())
}

fn losses<D: Device>(p: &mut Pair<'_, D>) -> Result<(), ExecError> {
    let (n, v) = (45, 300);
    let lv = p.randn(n * v, 3.0);
    let logits = p.f(&lv)?;
    let mut tv = p.ints(n, v as u32);
    tv[3] = u32::MAX;
    let t = p.ids(&tv)?;
    let (mut loss, mut lse) = (p.out(1)?, p.out(n)?);
    p.cpu.cross_entropy_forward(&mut loss.0, &mut lse.0, &logits.0, &t.0, v)?;
    p.dev.cross_entropy_forward(&mut loss.1, &mut lse.1, &logits.1, &t.1, v)?;
    p.check("cross_entropy_forward", &loss, RED)?;
    let dloss = p.f(&[1.7])?;
    let mut dl = p.out(n * v)?;
    p.cpu.cross_entropy_backward(&mut dl.0, &logits.0, &lse.0, &t.0, v, Some(&dloss.0))?;
    p.dev.cross_entropy_backward(&mut dl.1, &logits.1, &lse.1, &t.1, v, Some(&dloss.1))?;
    p.check("cross_entropy_backward", &dl, RED)?;
    let mut dl = p.out(n * v)?;
    p.cpu.cross_entropy_backward(&mut dl.0, &logits.0, &lse.0, &t.0, v, None)?;
    p.dev.cross_entropy_backward(&mut dl.1, &logits.1, &lse.1, &t.1, v, None)?;
    // Zeros either sign: (p - 1)·0 is -0 on one device and +0 on another.
    p.check("cross_entropy_backward (no loss gradient: zeros)", &dl, EW)?;
    p.check("cross_entropy_forward lse", &lse, RED)?;
    // The vocab-parallel statistics of one shard (classes 100..250).
    let (start, w) = (100, 150);
    let shard = p.randf(n * w)?;
    let (mut mx, mut se, mut tl) = (p.out(n)?, p.out(n)?, p.out(n)?);
    p.cpu.row_max_sumexp(&mut mx.0, &mut se.0, &shard.0, w)?;
    p.dev.row_max_sumexp(&mut mx.1, &mut se.1, &shard.1, w)?;
    p.check("row_max_sumexp (max)", &mx, 0.0)?;
    p.check("row_max_sumexp (sum)", &se, RED)?;
    // The max reduced over shards: another shard's larger one on two rows in three.
    let reduced: Vec<f32> = p.cpu.read_f32(&mx.0)?.iter().enumerate().map(|(r, m)| m + (r % 3) as f32 * 0.75).collect();
    let gm = p.f(&reduced)?;
    p.cpu.sumexp_rescale(&mut se.0, &mx.0, &gm.0)?;
    p.dev.sumexp_rescale(&mut se.1, &mx.1, &gm.1)?;
    p.check("sumexp_rescale", &se, RED)?;
    let mx = gm;
    p.cpu.target_logit(&mut tl.0, &shard.0, &t.0, start, w)?;
    p.dev.target_logit(&mut tl.1, &shard.1, &t.1, start, w)?;
    p.check("target_logit", &tl, 0.0)?;
    p.cpu.cross_entropy_from_stats(&mut loss.0, &mut lse.0, &mx.0, &se.0, &tl.0, &t.0)?;
    p.dev.cross_entropy_from_stats(&mut loss.1, &mut lse.1, &mx.1, &se.1, &tl.1, &t.1)?;
    p.check("cross_entropy_from_stats", &loss, RED)?;
    let mut ds = p.out(n * w)?;
    p.cpu.cross_entropy_shard_backward(&mut ds.0, &shard.0, &lse.0, &t.0, start, w, Some(&dloss.0))?;
    p.dev.cross_entropy_shard_backward(&mut ds.1, &shard.1, &lse.1, &t.1, start, w, Some(&dloss.1))?;
    p.check("cross_entropy_shard_backward", &ds, RED)?;
    Ok(())
}

fn experts<D: Device>(p: &mut Pair<'_, D>) -> Result<(), ExecError> {
    let (n, e, k, c, f) = (40, 8, 2, 24, 16);
    for (score, normalize_topk) in [(ScoreFn::Softmax, true), (ScoreFn::Sigmoid, true), (ScoreFn::Sigmoid, false)] {
        let r = Router { n, e, k, score, normalize_topk };
        let logits = p.randf(n * e)?;
        let (mut w, mut idx, mut probs) = (p.out(n * k)?, p.outs(Elem::I32, n * k)?, p.out(n * e)?);
        p.cpu.router_forward(&mut w.0, &mut idx.0, &mut probs.0, &logits.0, &r)?;
        p.dev.router_forward(&mut w.1, &mut idx.1, &mut probs.1, &logits.1, &r)?;
        let score = format!("{score:?}{}", if normalize_topk { "" } else { ", top-k not renormalised" });
        p.check(&format!("router_forward indices ({score})"), &idx, 0.0)?;
        p.check(&format!("router_forward weights ({score})"), &w, EW)?;
        p.check(&format!("router_forward probabilities ({score})"), &probs, EW)?;
        let gw = p.randf(n * k)?;
        let mut dl = p.out(n * e)?;
        p.cpu.router_backward(&mut dl.0, &gw.0, &probs.0, &idx.0, &r)?;
        p.dev.router_backward(&mut dl.1, &gw.1, &probs.1, &idx.1, &r)?;
        p.check(&format!("router_backward ({score})"), &dl, EW)?;
        if r.score == ScoreFn::Sigmoid {
            continue;
        }
        // dispatch → grouped GEMM → combine, and back, on the CPU's indices
        let plan_c = p.cpu.dispatch_plan(&idx.0, n, k, e)?;
        let plan_d = p.dev.dispatch_plan(&idx.1, n, k, e)?;
        let x = p.randf(n * c)?;
        let mut xs = p.out(n * k * c)?;
        p.cpu.dispatch_forward(&mut xs.0, &x.0, &plan_c, c)?;
        p.dev.dispatch_forward(&mut xs.1, &x.1, &plan_d, c)?;
        p.check("dispatch_forward", &xs, 0.0)?;
        let wt = p.randf(e * f * c)?;
        let mut ys = p.out(n * k * f)?;
        p.cpu.grouped_matmul_forward(&mut ys.0, &xs.0, ExpertWeights::Stacked(&wt.0), &plan_c, c, f)?;
        p.dev.grouped_matmul_forward(&mut ys.1, &xs.1, ExpertWeights::Stacked(&wt.1), &plan_d, c, f)?;
        p.check("grouped_matmul_forward", &ys, RED)?;
        let mut out = p.out(n * f)?;
        p.cpu.combine_forward(&mut out.0, &ys.0, &w.0, &plan_c, f)?;
        p.dev.combine_forward(&mut out.1, &ys.1, &w.1, &plan_d, f)?;
        p.check("combine_forward", &out, RED)?;
        let g = p.randf(n * f)?;
        let (mut dys, mut dwts) = (p.out(n * k * f)?, p.out(n * k)?);
        p.cpu.combine_backward(&mut dys.0, &mut dwts.0, &g.0, &ys.0, &w.0, &plan_c, f)?;
        p.dev.combine_backward(&mut dys.1, &mut dwts.1, &g.1, &ys.1, &w.1, &plan_d, f)?;
        p.check("combine_backward dy", &dys, EW)?;
        p.check("combine_backward dweights", &dwts, RED)?;
        // The weight gradient reads its own dY (a precision plan's separately quantised copy).
        let dyw = p.randf(n * k * f)?;
        let (mut dxs, mut dwt) = (p.out(n * k * c)?, p.out(e * f * c)?);
        p.cpu.grouped_matmul_backward(&mut dxs.0, &mut dwt.0, &dys.0, &dyw.0, &xs.0, ExpertWeights::Stacked(&wt.0), &plan_c, c, f)?;
        p.dev.grouped_matmul_backward(&mut dxs.1, &mut dwt.1, &dys.1, &dyw.1, &xs.1, ExpertWeights::Stacked(&wt.1), &plan_d, c, f)?;
        p.check("grouped_matmul_backward dx", &dxs, RED)?;
        p.check("grouped_matmul_backward dw", &dwt, RED)?;
        let mut dx = p.out(n * c)?;
        p.cpu.dispatch_backward(&mut dx.0, &dxs.0, &plan_c, c)?;
        p.dev.dispatch_backward(&mut dx.1, &dxs.1, &plan_d, c)?;
        p.check("dispatch_backward", &dx, RED)?;
    }
    Ok(())
}

/// The native FP8 route's grouped GEMMs on routed rows: X and dY one FP8 tensor each
/// (E4M3, E5M2), the weights one E4M3 tensor per expert, each with its own scale (the
/// experts' weights decades apart, so a GEMM reading another expert's scale fails), the
/// experts' row counts not multiples of 16 (on a GPU the weight gradient's contraction
/// over them is padded with zeros). The codes are the CPU's exactly; the GEMMs differ by
/// accumulation order. The routing sends each of 40 tokens to 2 of 8 experts, drawn at
/// random.
fn fp8_grouped<D: Device>(p: &mut Pair<'_, D>) -> Result<(), ExecError> {
    use runner_kernels::cpu::quant::{Format, QuantSpec};
    let (n, e, top, c, f) = (40, 8, 2, 32, 16);
    let (first, step) = (p.ints(n, e as u32), p.ints(n, e as u32 - 1));
    let ids: Vec<u32> = first.iter().zip(&step).flat_map(|(&a, &s)| [a, (a + 1 + s) % e as u32]).collect();
    let idx = p.ids(&ids)?;
    let (plan_c, plan_d) = (p.cpu.dispatch_plan(&idx.0, n, top, e)?, p.dev.dispatch_plan(&idx.1, n, top, e)?);
    let (plan_c, plan_d) = (&plan_c, &plan_d);
    let rows = n * top;
    let codes = |p: &mut Pair<'_, D>, src: &Two<D::Buffer>, at: usize, len: usize, elem: Elem| -> Result<Two<D::Buffer>, ExecError> {
        let format = if elem == Elem::F8E5M2 { Format::E5M2 } else { Format::E4M3 };
        let spec = QuantSpec::Tensor { format, scale: None, margin: 0, saturate: true, stochastic: None };
        let mut q = p.outs(elem, len)?;
        p.cpu.quantize_fp8_codes(&mut q.0, &src.0, at, &spec)?;
        p.dev.quantize_fp8_codes(&mut q.1, &src.1, at, &spec)?;
        Ok(q)
    };
    let x = p.randf(rows * c)?;
    let xq = codes(p, &x, 0, rows * c, Elem::F8E4M3)?;
    let mut wv = p.randn(e * f * c, 1.0);
    for (i, v) in wv.iter_mut().enumerate() {
        *v *= 10f32.powi((i / (f * c)) as i32 % 4 - 2);
    }
    let w = p.f(&wv)?;
    let (mut wq_c, mut wq_d) = (Vec::new(), Vec::new());
    for ex in 0..e {
        let q = codes(p, &w, ex * f * c, f * c, Elem::F8E4M3)?;
        p.check_codes(&format!("quantize_fp8_codes of expert {ex}'s weights (from element {})", ex * f * c), &q, 0.0)?;
        wq_c.push(q.0);
        wq_d.push(q.1);
    }
    let mut y = p.out(rows * f)?;
    p.cpu.grouped_matmul_forward(&mut y.0, &xq.0, ExpertWeights::Each(&wq_c), plan_c, c, f)?;
    p.dev.grouped_matmul_forward(&mut y.1, &xq.1, ExpertWeights::Each(&wq_d), plan_d, c, f)?;
    p.check("grouped_matmul_forward, FP8 codes (a scale per expert)", &y, RED)?;
    let dy = p.randf(rows * f)?;
    let dyq = codes(p, &dy, 0, rows * f, Elem::F8E5M2)?;
    let (mut dx, mut dw) = (p.out(rows * c)?, p.out(e * f * c)?);
    p.cpu.grouped_matmul_backward(&mut dx.0, &mut dw.0, &dyq.0, &dyq.0, &xq.0, ExpertWeights::Each(&wq_c), plan_c, c, f)?;
    p.dev.grouped_matmul_backward(&mut dx.1, &mut dw.1, &dyq.1, &dyq.1, &xq.1, ExpertWeights::Each(&wq_d), plan_d, c, f)?;
    p.check("grouped_matmul_backward dx, FP8 codes", &dx, RED)?;
    p.check("grouped_matmul_backward dw, FP8 codes (each expert's rows a padded contraction)", &dw, RED)?;
    Ok(())
}

/// Mamba-2's mixer: the causal conv1d (T shorter than K too) and the SSD scan, one
/// group and several, chunks that do not divide T, Mamba-2's P = 64, N = 128 and a state
/// past 48 KiB of shared memory. The scan's backward takes another route on a GPU (the
/// decay gradient as a reverse cumulative sum, kernels/cuda/ssm.cu), so the gradients of
/// dt and the per-head weights, sums over T of differences, get 1e-3.
fn mamba<D: Device>(p: &mut Pair<'_, D>) -> Result<(), ExecError> {
    let convs = [("", Conv1d { b: 2, t: 37, c: 96, k: 4 }), (" (T < K)", Conv1d { b: 3, t: 2, c: 40, k: 4 }), (" (1200 rows)", Conv1d { b: 2, t: 600, c: 40, k: 4 })];
    for (name, s) in convs {
        let n = s.b * s.t * s.c;
        let (x, w, bias, g) = (p.randf(n)?, p.randf(s.c * s.k)?, p.randf(s.c)?, p.randf(n)?);
        let mut o = p.out(n)?;
        p.cpu.causal_conv1d_forward(&mut o.0, &x.0, &w.0, &bias.0, s)?;
        p.dev.causal_conv1d_forward(&mut o.1, &x.1, &w.1, &bias.1, s)?;
        p.check(&format!("causal_conv1d_forward{name}"), &o, EW)?;
        let (mut dx, mut dw, mut db) = (p.out(n)?, p.out(s.c * s.k)?, p.out(s.c)?);
        p.cpu.causal_conv1d_backward(&mut dx.0, &mut dw.0, &mut db.0, &g.0, &x.0, &w.0, &bias.0, s)?;
        p.dev.causal_conv1d_backward(&mut dx.1, &mut dw.1, &mut db.1, &g.1, &x.1, &w.1, &bias.1, s)?;
        p.check(&format!("causal_conv1d_backward dx{name}"), &dx, EW)?;
        p.check(&format!("causal_conv1d_backward dw{name}"), &dw, RED)?;
        p.check(&format!("causal_conv1d_backward dbias{name}"), &db, RED)?;
    }
    let cases = [
        ("one group", Ssm { b: 2, t: 33, h: 4, p: 16, g: 1, n: 32, chunk: 8 }),
        ("two groups, P 64, N 128", Ssm { b: 1, t: 20, h: 4, p: 64, g: 2, n: 128, chunk: 7 }),
        ("N 40, P 3, a group per head", Ssm { b: 2, t: 9, h: 2, p: 3, g: 2, n: 40, chunk: 16 }),
        ("state of 64 KiB", Ssm { b: 1, t: 12, h: 2, p: 64, g: 1, n: 256, chunk: 5 }),
    ];
    for (name, s) in cases {
        let [lx, lt, lg, lh, _] = s.lens().map_err(|source| ExecError::Kernel { op: "ssm_scan".into(), source })?;
        let t: [Two<D::Buffer>; 7] = [p.randf(lx)?, p.randf(lt)?, p.randf(lg)?, p.randf(lg)?, p.randf(lh)?, p.randf(lh)?, p.randf(lh)?];
        let cpu_in = SsmInputs { x: &t[0].0, dt: &t[1].0, bm: &t[2].0, cm: &t[3].0, a_log: &t[4].0, d: &t[5].0, dt_bias: &t[6].0 };
        let dev_in = SsmInputs { x: &t[0].1, dt: &t[1].1, bm: &t[2].1, cm: &t[3].1, a_log: &t[4].1, d: &t[5].1, dt_bias: &t[6].1 };
        let (mut y, mut states) = (p.out(lx)?, p.out(s.states_len())?);
        p.cpu.ssm_scan_forward(&mut y.0, &mut states.0, cpu_in, s)?;
        p.dev.ssm_scan_forward(&mut y.1, &mut states.1, dev_in, s)?;
        p.check(&format!("ssm_scan_forward ({name})"), &y, RED)?;
        p.check(&format!("ssm_scan_forward states ({name})"), &states, RED)?;
        let dy = p.randf(lx)?;
        let mut gr: [Two<D::Buffer>; 7] = [p.out(lx)?, p.out(lt)?, p.out(lg)?, p.out(lg)?, p.out(lh)?, p.out(lh)?, p.out(lh)?];
        {
            let [g0, g1, g2, g3, g4, g5, g6] = &mut gr;
            let cpu_g = SsmGrads { dx: &mut g0.0, ddt: &mut g1.0, dbm: &mut g2.0, dcm: &mut g3.0, da_log: &mut g4.0, dd: &mut g5.0, ddt_bias: &mut g6.0 };
            p.cpu.ssm_scan_backward(cpu_g, &dy.0, cpu_in, &states.0, s)?;
            let dev_g = SsmGrads { dx: &mut g0.1, ddt: &mut g1.1, dbm: &mut g2.1, dcm: &mut g3.1, da_log: &mut g4.1, dd: &mut g5.1, ddt_bias: &mut g6.1 };
            p.dev.ssm_scan_backward(dev_g, &dy.1, dev_in, &states.1, s)?;
        }
        for (k, what) in ["dx", "ddt", "dB", "dC", "da_log", "dd", "ddt_bias"].into_iter().enumerate() {
            let tol = if matches!(what, "ddt" | "da_log" | "ddt_bias") { 1e-3 } else { RED };
            p.check(&format!("ssm_scan_backward {what} ({name})"), &gr[k], tol)?;
        }
    }
    Ok(())
}

/// One training step's forward and backward of the toy Llama, MoE and Mamba on the CPU
/// and on `dev` from the same weights and batch, and of the toy Llama at tp=2: the
/// losses and every weight gradient compared ([`step_rows`]); and three FP8 steps.
/// A part that fails to run on either device is a failed row naming the error.
pub fn compare_steps<D: Device + Clone + Send>(dev: D) -> Vec<CheckRow> {
    let mut rows = Vec::new();
    let mut moe = toy::ToyConfig::tiny();
    moe.moe = Some((4, 2, 32));
    let tiny = toy::ToyConfig::tiny();
    for (name, g) in [("toy llama", toy::llama(&tiny)), ("toy moe", toy::llama(&moe)), ("toy mamba", toy::mamba(&tiny))] {
        let ran = (|| {
            let (tokens, targets) = toy::repeating_batch(&g, 11);
            let inputs = [("tokens", Input::U32(&tokens)), ("targets", Input::U32(&targets))];
            let mut a = Executor::new(&g, Cpu::new(), ExecOptions::default())?;
            let mut b = Executor::new(&g, dev.clone(), ExecOptions::default())?;
            let (la, lb) = (a.forward(&inputs)?, b.forward(&inputs)?);
            a.backward()?;
            b.backward()?;
            step_rows(&mut rows, &format!("{name} step"), &step_of(&a, la)?, &step_of(&b, lb)?);
            Ok(())
        })();
        failed_to_run(&mut rows, &format!("{name} step"), ran);
    }
    // The toy Llama at tp=2, vocab-parallel with sequence parallelism: two ranks as
    // threads on each device joined by in-process groups (host transports: the device's
    // buffers go through them as they would through NCCL's), so the sharded paths'
    // kernels run in a real step (the vocab-parallel embedding and loss statistics, the
    // shard backward, the layout copies around reduce-scatter and all-gather).
    let ran = (|| {
        let (cpu, device) = (tp2_step(Cpu::new())?, tp2_step(dev.clone())?);
        for (r, (a, b)) in cpu.iter().zip(&device).enumerate() {
            step_rows(&mut rows, &format!("toy llama tp=2 (vocab-parallel, SP) rank {r}"), a, b);
        }
        Ok(())
    })();
    failed_to_run(&mut rows, "toy llama tp=2 step", ran);
    // The FP8 training route: every linear of the toy Llama per-tensor FP8 (E4M3 forward,
    // E5M2 gradients) under delayed scaling, three steps with AdamW. A device with FP8
    // GEMMs (CUDA) takes the native route: operands cast to codes in one pass, from the
    // second step by the norm or activation that produces them, into cuBLASLt's FP8 GEMM
    // with scale pointers; the CPU emulates the same values. Accumulation order differs
    // (and an FP8 code can round the other way after it), so losses agree closely, not
    // bit for bit.
    // The same for the MoE toy (4 experts, top-2): its expert linears' grouped GEMMs on
    // codes too, each expert's weights with their own scale, the experts' row counts
    // not multiples of 16. Its tolerance is wider: an FP8 code rounding the other way
    // moves the next layer's router logits and expert outputs too. On the emulated
    // device its losses differ from the CPU's by 6.9e-4, by the same whether its GEMMs
    // read codes or quantised f32 copies (the toy Llama's: 1.8e-4); a wrong expert scale
    // fails the grouped FP8 kernel rows far above their tolerance.
    for (name, g, tol) in [("toy llama", toy::llama(&tiny), 1e-3), ("toy moe", toy::llama(&moe), 2e-3)] {
        let ran = (|| {
            let (cpu, device) = (fp8_steps(&g, Cpu::new())?, fp8_steps(&g, dev.clone())?);
            let e = relative_error(&cpu.losses, &device.losses);
            rows.push(CheckRow { kernel: format!("{name} FP8 steps (delayed scaling): losses of 3 steps"), error: e, tolerance: tol, ok: e <= tol });
            if dev.native_fp8() {
                // Every planned GEMM on codes (the toys' weights' dimensions are multiples
                // of 16), and from the second step each (expert) SwiGLU and the final norm
                // cast their own output: 2 steps x (2 layers + 1).
                let (gemms, fused) = (device.planned_gemms, 6u64);
                let missing = gemms.abs_diff(device.native_gemms) + fused.abs_diff(device.fused_casts);
                rows.push(CheckRow {
                    kernel: format!("{name} FP8 steps: native route ({} of {gemms} GEMMs on codes, {} of {fused} fused casts)", device.native_gemms, device.fused_casts),
                    error: missing as f64,
                    tolerance: 0.0,
                    ok: missing == 0,
                });
            }
            Ok(())
        })();
        failed_to_run(&mut rows, &format!("{name} FP8 steps"), ran);
    }
    // Muon: momentum orthogonalised by Newton–Schulz on the toy Llama's hidden matrices,
    // composed from the device's GEMM, scale, add and copy kernels (no kernel of its own),
    // its norm read back; three steps against the CPU's: the losses and the worst weight.
    let ran = (|| {
        let g = toy::llama(&tiny);
        let (cpu, device) = (muon_steps(&g, Cpu::new())?, muon_steps(&g, dev.clone())?);
        let e = relative_error(&cpu.0, &device.0);
        rows.push(CheckRow { kernel: "toy llama Muon steps: losses of 3 steps".into(), error: e, tolerance: 1e-3, ok: e <= 1e-3 });
        let (e, w) = worst_named(&cpu.1, &device.1);
        rows.push(CheckRow { kernel: format!("toy llama Muon steps: worst weight after 3 ({w})"), error: e, tolerance: 1e-3, ok: e <= 1e-3 });
        Ok(())
    })();
    failed_to_run(&mut rows, "toy llama Muon steps", ran);
    rows
}

/// Three Muon steps of `g` on `dev` (learning rate 1e-2, a fresh batch each): the losses,
/// and every trained weight after them by name.
fn muon_steps<D: Device>(g: &runner_graph::Graph, dev: D) -> Result<(Vec<f32>, Named), ExecError> {
    let mut ex = Executor::new(g, dev, ExecOptions::default())?;
    ex.set_optimizer(Optimizer::Muon(MUON_DEFAULT))?;
    let h = AdamW { lr: 1e-2, ..ADAMW_DEFAULT };
    let mut losses = Vec::new();
    for s in 0..3u32 {
        let (tokens, targets) = toy::repeating_batch(g, s);
        losses.push(ex.step(&[("tokens", Input::U32(&tokens)), ("targets", Input::U32(&targets))], &h)?);
    }
    let weights = ex.trainable().into_iter().map(|w| ex.weight(&w).map(|x| (w, x))).collect::<Result<_, _>>()?;
    Ok((losses, weights))
}

/// The largest [`relative_error`] of a tensor of `got` against `want`'s of the same name,
/// and that name (one `got` lacks compares as empty, an infinite error).
fn worst_named(want: &[(String, Vec<f32>)], got: &[(String, Vec<f32>)]) -> (f64, String) {
    let mut worst = (0f64, String::new());
    for (w, a) in want {
        let b = got.iter().find(|(n, _)| n == w).map(|x| x.1.as_slice()).unwrap_or_default();
        let e = relative_error(a, b);
        if e >= worst.0 {
            worst = (e, w.clone());
        }
    }
    worst
}

/// A failed row for a part of [`compare_kernels`] or [`compare_steps`] that did not run
/// to the end, naming the error: the parts after it still run (on a GPU lent for
/// minutes, one failing part must not hide the others' results).
fn failed_to_run(rows: &mut Vec<CheckRow>, part: &str, ran: Result<(), ExecError>) {
    if let Err(e) = ran {
        rows.push(CheckRow { kernel: format!("{part}: did not run ({e})"), error: f64::INFINITY, tolerance: 0.0, ok: false });
    }
}

/// Tensors by name.
type Named = Vec<(String, Vec<f32>)>;

/// A step's loss and its weight gradients by name.
type RankStep = (f32, Named);

/// `ex`'s step after a forward (its loss) and backward.
fn step_of<D: Device>(ex: &Executor<D>, loss: f32) -> Result<RankStep, ExecError> {
    let grads = ex.trainable().into_iter().map(|w| ex.grad(&w).map(|x| (w, x.unwrap_or_default()))).collect::<Result<_, _>>()?;
    Ok((loss, grads))
}

/// Rows for step `got` against `want`: the loss, and the worst weight gradient (a
/// weight `got` lacks compares as empty, an infinite error). AdamW's kernel has its own
/// row: after an update, a gradient near zero whose sign differs by rounding would move
/// its weight by up to twice the learning rate.
fn step_rows(rows: &mut Vec<CheckRow>, name: &str, want: &RankStep, got: &RankStep) {
    let e = relative_error(&[want.0], &[got.0]);
    rows.push(CheckRow { kernel: format!("{name}: loss"), error: e, tolerance: RED, ok: e <= RED });
    let worst = worst_named(&want.1, &got.1);
    rows.push(CheckRow { kernel: format!("{name}: worst gradient ({})", worst.1), error: worst.0, tolerance: 1e-3, ok: worst.0 <= 1e-3 });
}

/// Each rank's loss and weight gradients (by name) of one forward and backward of the
/// toy Llama at tp=2 (vocab-parallel, sequence parallel) on `dev`, the ranks threads of
/// this process, each from its part of the unsharded model's seeded weights.
fn tp2_step<D: Device + Clone + Send>(dev: D) -> Result<Vec<RankStep>, ExecError> {
    use runner_graph::shard::{Layout, RankCoord, shard};
    let g = toy::with_roles(toy::llama(&toy::ToyConfig::tiny()), true);
    let (tokens, targets) = toy::repeating_batch(&g, 11);
    let b = g.tensors[g.tensor_id("tokens").ok_or_else(|| ExecError::State("the toy has no tokens".into()))?].shape[0] as u32;
    let layout = Layout { tp: 2, sequence_parallel: true, ..Layout::single(b, b) };
    let groups = crate::collective::ThreadGroup::new(2);
    std::thread::scope(|sc| {
        let runs: Vec<_> = groups
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                let (g, layout, dev, tokens, targets) = (&g, &layout, dev.clone(), &tokens, &targets);
                sc.spawn(move || -> Result<_, ExecError> {
                    let coord = RankCoord { tp: r as u32, pp: 0, cp: 0, dp: 0 };
                    let s = shard(g, layout, coord).map_err(|e| ExecError::State(format!("sharding the toy at tp=2: {e}")))?;
                    let groups: Vec<(String, Box<dyn crate::collective::Collective<D>>)> = vec![("tp".into(), Box::new(h))];
                    let mut ex = Executor::for_rank(&s, dev, ExecOptions::default(), groups)?;
                    let inputs = [("tokens", Input::U32(tokens)), ("targets", Input::U32(targets))];
                    let loss = ex.forward(&inputs)?;
                    ex.backward()?;
                    step_of(&ex, loss)
                })
            })
            .collect();
        runs.into_iter().map(|h| h.join().map_err(|_| ExecError::State("a tp=2 rank panicked".into()))?).collect()
    })
}

/// What [`fp8_steps`] reports.
struct Fp8Steps {
    losses: Vec<f32>,
    /// GEMMs the plan quantised over the steps (each linear's three, each step).
    planned_gemms: u64,
    native_gemms: u64,
    fused_casts: u64,
}

/// Three training steps of `g` on `dev` with every linear and expert linear (not the
/// router) planned per-tensor FP8 under delayed scaling (see [`compare_steps`]).
fn fp8_steps<D: Device>(g: &runner_graph::Graph, dev: D) -> Result<Fp8Steps, ExecError> {
    use crate::precision::{AmaxReduction, GemmRole, OperandPlan, Scaling, SitePlan};
    let scaling = Scaling::Delayed { history: 4, reduction: AmaxReduction::Max, margin: 0 };
    let operand = |format| OperandPlan { format, scaling, saturate: true, stochastic: false, hadamard: 0 };
    let plan = SitePlan { activation: operand(DType::Fp8E4M3), weight: operand(DType::Fp8E4M3), gradient: operand(DType::Fp8E5M2), output: DType::BF16 };
    let sites: Vec<_> = g
        .ops
        .iter()
        .filter(|o| matches!(o.kind, runner_graph::OpKind::Linear | runner_graph::OpKind::GroupedLinear) && !o.name.contains("router"))
        .flat_map(|o| GemmRole::ALL.map(|r| (o.name.clone(), r, plan)))
        .collect();
    let mut ex = Executor::new(g, dev, ExecOptions { seed: 3, ..ExecOptions::default() })?;
    ex.set_precision(&sites)?;
    let h = AdamW { lr: 1e-2, ..ADAMW_DEFAULT };
    const STEPS: u32 = 3;
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (tokens, targets) = toy::repeating_batch(g, 11 + step);
        losses.push(ex.step(&[("tokens", Input::U32(&tokens)), ("targets", Input::U32(&targets))], &h)?);
        ex.end_precision_step();
    }
    Ok(Fp8Steps { losses, planned_gemms: u64::from(STEPS) * sites.len() as u64, native_gemms: ex.native_fp8_gemms(), fused_casts: ex.fused_fp8_casts() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_error_scales_and_flags_nan_and_length() {
        assert_eq!(relative_error(&[1.0, -4.0], &[1.0, -4.0]), 0.0);
        assert!((relative_error(&[1.0, -4.0], &[1.0, -4.004]) - 1e-3).abs() < 1e-6);
        assert!((relative_error(&[0.01], &[0.02]) - 0.01).abs() < 1e-9, "small values are absolute");
        assert_eq!(relative_error(&[1.0], &[f32::NAN]), f64::INFINITY);
        assert_eq!(relative_error(&[f32::NAN], &[f32::NAN]), 0.0);
        assert_eq!(relative_error(&[1.0], &[1.0, 2.0]), f64::INFINITY);
    }

    #[test]
    fn bit_error_tells_signed_zeros_apart_but_not_nans() {
        assert_eq!(bit_error(&[0.0, f32::NAN, 1.5], &[0.0, -f32::NAN, 1.5]), 0.0);
        assert_eq!(bit_error(&[0.0], &[-0.0]), f64::INFINITY);
        assert_eq!(bit_error(&[1.0], &[1.0, 1.0]), f64::INFINITY);
        // Relative to the values alone: 1 % of 0.01, not 1e-4 of 1.
        assert!((relative_error_over(&[0.01], &[0.0101], 0.0) - 0.01).abs() < 1e-5);
        assert!((relative_error(&[0.01], &[0.0101]) - 1e-4).abs() < 1e-7);
    }

    #[test]
    fn code_steps_counts_fp8_steps_at_the_values_magnitude() {
        // E4M3 at scale 2: codes 10 and 11 (step 1 in [8, 16)) are one step apart; 10 and 12 two.
        assert_eq!(code_steps(&[5.0], &[5.5], 2.0, Fp8Format::E4M3), 1.0);
        assert_eq!(code_steps(&[5.0], &[6.0], 2.0, Fp8Format::E4M3), 2.0);
        // E5M2: in [256, 512) the step is 64.
        assert_eq!(code_steps(&[256.0], &[320.0], 1.0, Fp8Format::E5M2), 1.0);
        // Subnormals share the smallest normal's step (E4M3: 2^-9).
        assert_eq!(code_steps(&[0.0], &[2f32.powi(-9)], 1.0, Fp8Format::E4M3), 1.0);
        assert_eq!(code_steps(&[f32::INFINITY], &[f32::INFINITY], 1.0, Fp8Format::E5M2), 0.0);
        assert_eq!(code_steps(&[f32::INFINITY], &[57344.0], 1.0, Fp8Format::E5M2), f64::INFINITY);
        assert_eq!(code_steps(&[1.0], &[f32::NAN], 1.0, Fp8Format::E4M3), f64::INFINITY);
    }

    /// A part of `compare_steps` that failed is one failed row naming it and the error;
    /// one that ran adds none.
    #[test]
    fn a_step_that_fails_to_run_is_a_failed_row() {
        let mut rows = Vec::new();
        failed_to_run(&mut rows, "toy llama tp=2 step", Ok(()));
        assert!(rows.is_empty());
        failed_to_run(&mut rows, "toy llama tp=2 step", Err(ExecError::State("a rank panicked".into())));
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert!(!r.ok && r.error.is_infinite(), "{r:?}");
        assert!(r.kernel.starts_with("toy llama tp=2 step: did not run") && r.kernel.contains("a rank panicked"), "{r:?}");
    }

    /// The CPU against itself: every kernel runs, every row is exact; on a GPU the same
    /// harness is the correctness check.
    #[test]
    fn the_cpu_matches_itself_on_every_kernel_and_step() {
        let rows = compare_kernels(&Cpu::new());
        assert!(rows.len() > 80, "{}", rows.len());
        for r in &rows {
            assert_eq!(r.error, 0.0, "{r:?}");
        }
        let steps = compare_steps(Cpu::new());
        assert_eq!(steps.len(), 14, "three steps, tp=2, FP8 and Muon rows");
        assert!(steps.iter().all(|r| r.error == 0.0), "{steps:?}");
        assert!(rows.iter().chain(&steps).all(|r| r.ok), "an exact row passes, at tolerance 0 too");
    }

    /// The harness against a device that differs (here a second CPU buffer written
    /// apart): a tolerance of 0 asks for the same bits (-0.0 against 0.0 fails, although
    /// relatively it is no error) and passes the same bits; a tolerance passes what is
    /// within it and fails what is not; `check_rel` is relative to the values alone
    /// (1 % of 0.01 fails 1e-3 there, where relative to 1 it would pass).
    #[test]
    fn the_harness_fails_a_device_that_differs() {
        let dev = Cpu::new();
        let mut p = Pair { cpu: Cpu::new(), dev: &dev, rows: Vec::new(), rng: SplitMix(1) };
        let mut pair = |want: &[f32], got: &[f32]| {
            let mut x = p.f(want).unwrap();
            p.dev.write_f32(&mut x.1, got).unwrap();
            x
        };
        let same = pair(&[1.0, -2.0], &[1.0, -2.0]);
        let zero = pair(&[0.0, 1.0], &[-0.0, 1.0]);
        let near = pair(&[2.0, 1.0], &[2.0 + 1e-4, 1.0]);
        let small = pair(&[0.01, 0.0], &[0.0101, 0.0]);
        p.check("same bits", &same, 0.0).unwrap();
        p.check("signed zero, bits", &zero, 0.0).unwrap();
        p.check("signed zero, tolerance", &zero, 1e-9).unwrap();
        p.check("within", &near, 1e-4).unwrap();
        p.check("beyond", &near, 1e-5).unwrap();
        p.check("small, absolute", &small, 1e-3).unwrap();
        p.check_rel("small, relative", &small, 1e-3).unwrap();
        // FP8 codes of the same values on grids of other scales (1 and 2: both hold these
        // values exactly) are not the same result.
        use runner_kernels::cpu::quant::{Format, QuantSpec};
        let spec = |scale| QuantSpec::Tensor { format: Format::E4M3, scale: Some(scale), margin: 0, saturate: true, stochastic: None };
        let src = p.f(&[1.0, -2.0, 0.5]).unwrap();
        let mut q = p.outs(Elem::F8E4M3, 3).unwrap();
        p.cpu.quantize_fp8_codes(&mut q.0, &src.0, 0, &spec(1.0)).unwrap();
        p.dev.quantize_fp8_codes(&mut q.1, &src.1, 0, &spec(2.0)).unwrap();
        let (a, b) = p.read(&q).unwrap();
        assert_eq!(a, b, "the values are the same");
        p.check_codes("codes, other scales", &q, 1.0).unwrap();
        p.dev.quantize_fp8_codes(&mut q.1, &src.1, 0, &spec(1.0)).unwrap();
        p.check_codes("codes, same scale", &q, 0.0).unwrap();
        let ok: Vec<(&str, bool)> = p.rows.iter().map(|r| (r.kernel.as_str(), r.ok)).collect();
        assert_eq!(
            ok,
            [
                ("same bits", true),
                ("signed zero, bits", false),
                ("signed zero, tolerance", true),
                ("within", true),
                ("beyond", false),
                ("small, absolute", true),
                ("small, relative", false),
                ("codes, other scales", false),
                ("codes, same scale", true)
            ]
        );
    }

    /// A step's rows: the loss within 1e-4, and the worst gradient by name within 1e-3;
    /// a gradient the device lacks is an infinite error, not one left out.
    #[test]
    fn step_rows_name_the_worst_gradient_and_a_missing_one_fails() {
        let want: RankStep = (2.0, vec![("a".into(), vec![1.0, 2.0]), ("b".into(), vec![3.0]), ("c".into(), vec![0.5])]);
        let grads = |a: f32, b: Option<f32>| -> RankStep {
            let mut g = vec![("a".to_string(), vec![1.0, a])];
            g.extend(b.map(|b| ("b".to_string(), vec![b])));
            g.push(("c".into(), vec![0.5]));
            (2.0, g)
        };
        let rows_of = |got: &RankStep| {
            let mut rows = Vec::new();
            step_rows(&mut rows, "s", &want, got);
            rows.into_iter().map(|r| (r.kernel, r.error, r.ok)).collect::<Vec<_>>()
        };
        let r = rows_of(&grads(2.0 + 4e-3, Some(3.0)));
        assert_eq!((r[0].2, r[1].0.as_str(), r[1].2), (true, "s: worst gradient (a)", false), "{r:?}");
        assert!((r[1].1 - 2e-3).abs() < 1e-6, "{r:?}");
        let r = rows_of(&grads(2.0, None));
        assert_eq!((r[1].0.as_str(), r[1].1, r[1].2), ("s: worst gradient (b)", f64::INFINITY, false), "{r:?}");
        let r = rows_of(&(2.001, want.1.clone()));
        assert_eq!((r[0].2, r[1].2), (false, true), "{r:?}");
    }

    /// Values of zero magnitude: the same is no error, any difference infinite; a
    /// reference's infinity does not set the scale. E5M2's subnormals share its smallest
    /// normal's step (2^-16), and FP8 tensors of other lengths are infinitely apart.
    #[test]
    fn zeros_infinities_subnormals_and_lengths() {
        assert_eq!(relative_error_over(&[0.0, 0.0], &[0.0, 0.0], 0.0), 0.0);
        assert_eq!(relative_error_over(&[0.0, 0.0], &[0.0, 1e-3], 0.0), f64::INFINITY);
        assert_eq!(relative_error(&[f32::INFINITY, 2.0], &[f32::INFINITY, 2.5]), 0.25);
        assert_eq!(code_steps(&[0.0], &[2f32.powi(-16)], 1.0, Fp8Format::E5M2), 1.0);
        assert_eq!(code_steps(&[1.0], &[1.0, 1.0], 1.0, Fp8Format::E4M3), f64::INFINITY);
        assert_eq!(code_steps(&[1.0, 1.0], &[1.0], 1.0, Fp8Format::E4M3), f64::INFINITY);
    }
}
