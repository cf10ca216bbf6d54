//! What a precision plan asks of each GEMM site, in the executor's terms: per linear or
//! grouped (expert) linear op and role (forward `Y = X Wᵀ`, input gradient `dX = dY W`,
//! weight gradient `dW = dYᵀ X`, each expert's rows with its own W for a grouped linear), how each operand it reads is quantised and what format its result is
//! kept in; and what the quantisation did, per step (the numbers a precision policy's
//! `on-step` reads).
//!
//! The plugin contract's site plans (`runner_plugin_host::precision::SitePlan`) map onto
//! [`SitePlan`] one to one in the runner; this crate knows nothing of plugins.

use runner_graph::DType;
use runner_kernels::cpu::quant::{self, BlockSpec, FloatFormat, QuantSpec, ScaleFormat, ScaleRounding};
use serde::Serialize;

/// The three GEMMs of a linear (or grouped expert linear) layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GemmRole {
    /// Y = X Wᵀ.
    Forward,
    /// dX = dY W.
    InputGradient,
    /// dW = dYᵀ X.
    WeightGradient,
}

impl GemmRole {
    pub const ALL: [GemmRole; 3] = [GemmRole::Forward, GemmRole::InputGradient, GemmRole::WeightGradient];
    /// The two operands the GEMM reads.
    pub fn operands(self) -> [Operand; 2] {
        match self {
            GemmRole::Forward => [Operand::Activation, Operand::Weight],
            GemmRole::InputGradient => [Operand::Gradient, Operand::Weight],
            GemmRole::WeightGradient => [Operand::Gradient, Operand::Activation],
        }
    }
}

/// The tensors a site's GEMMs read: X, W, dY.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operand {
    Activation,
    Weight,
    Gradient,
}

impl Operand {
    pub const ALL: [Operand; 3] = [Operand::Activation, Operand::Weight, Operand::Gradient];
}

/// How an amax history is reduced to the amax a delayed scale is taken from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AmaxReduction {
    MostRecent,
    Max,
}

/// How an operand's scale is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scaling {
    /// A 16/32-bit float: no scale.
    None,
    /// One FP32 scale per tensor from the amax of earlier steps (Transformer Engine's
    /// DelayedScaling): `max / amax_history / 2^margin`. With an empty history (the first
    /// step, after a reset or a change of plan) the tensor's own amax is used once, so a
    /// site never starts on a cold scale.
    Delayed { history: u32, reduction: AmaxReduction, margin: i32 },
    /// One FP32 scale per tensor from this tensor's amax (Float8CurrentScaling).
    Current { margin: i32 },
    /// Block scales: rows x cols of the operand as stored (row-major) share one scale.
    Block { rows: u32, cols: u32, scale_format: ScaleFormat, scale_rounding: ScaleRounding, tensor_scale: bool },
}

/// One operand's plan.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OperandPlan {
    /// F32, BF16, F16 (no scale), FP8 E4M3 / E5M2, MXFP8 (E4M3 elements, 1x32 E8M0 blocks)
    /// or NVFP4 (E2M1 elements, 16-element E4M3 blocks under an FP32 tensor scale).
    pub format: DType,
    pub scaling: Scaling,
    /// Clip to the format's maximum instead of NaN / Inf.
    pub saturate: bool,
    /// Stochastic rounding instead of nearest-even.
    pub stochastic: bool,
    /// Random Hadamard transform size on the weight-gradient GEMM's inputs (0: none).
    pub hadamard: u32,
}

impl OperandPlan {
    /// An operand kept in `format` (F32, BF16 or F16) with no scale.
    pub fn float(format: DType) -> OperandPlan {
        OperandPlan { format, scaling: Scaling::None, saturate: true, stochastic: false, hadamard: 0 }
    }

    /// Whether the operand is FP8 or FP4.
    pub fn is_low_precision(&self) -> bool {
        matches!(self.format, DType::Fp8E4M3 | DType::Fp8E5M2 | DType::MxFp8 | DType::NvFp4)
    }

    /// What the kernels run for this operand: `delayed_scale` is the scale a delayed recipe
    /// takes from its history (`None`: empty history, current scaling this once), `seed`
    /// the stochastic-rounding seed.
    ///
    /// # Errors
    /// A combination the executor cannot run (named).
    pub fn spec(&self, delayed_scale: Option<f32>, seed: u64) -> Result<QuantSpec, String> {
        let sr = self.stochastic.then_some(seed);
        let elem = match self.format {
            DType::F32 | DType::BF16 | DType::F16 => {
                if self.scaling != Scaling::None {
                    return Err(format!("{} is not scaled", self.format.name()));
                }
                return Ok(QuantSpec::Float(match self.format {
                    DType::BF16 => FloatFormat::Bf16,
                    DType::F16 => FloatFormat::F16,
                    _ => FloatFormat::F32,
                }));
            }
            DType::Fp8E4M3 | DType::MxFp8 => quant::Format::E4M3,
            DType::Fp8E5M2 => quant::Format::E5M2,
            DType::NvFp4 => quant::Format::E2M1,
            DType::I32 => return Err("int32 is not a GEMM operand format".into()),
        };
        match self.scaling {
            Scaling::None => Err(format!("{} needs a scaling recipe", self.format.name())),
            Scaling::Delayed { margin, .. } | Scaling::Current { margin }
                if matches!(self.format, DType::Fp8E4M3 | DType::Fp8E5M2) =>
            {
                let scale = match self.scaling {
                    Scaling::Delayed { .. } => delayed_scale,
                    _ => None,
                };
                Ok(QuantSpec::Tensor { format: elem, scale, margin, saturate: self.saturate, stochastic: sr })
            }
            Scaling::Delayed { .. } | Scaling::Current { .. } => {
                Err(format!("{} uses block scales, not per-tensor scaling", self.format.name()))
            }
            Scaling::Block { rows, cols, scale_format, scale_rounding, tensor_scale } => {
                if rows == 0 || cols == 0 {
                    return Err(format!("block {rows}x{cols}"));
                }
                Ok(QuantSpec::Blocks(BlockSpec {
                    format: elem,
                    block: (rows as usize, cols as usize),
                    scale_format,
                    scale_rounding,
                    tensor_scale,
                    saturate: self.saturate,
                    stochastic: sr,
                }))
            }
        }
    }
}

/// One GEMM site's plan: each operand, and the format its result is kept in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SitePlan {
    pub activation: OperandPlan,
    pub weight: OperandPlan,
    pub gradient: OperandPlan,
    /// F32, BF16 or F16 (FP8 outputs are kept with a current per-tensor scale).
    pub output: DType,
}

impl SitePlan {
    /// Every operand and the output in `format` (F32, BF16 or F16), unscaled.
    pub fn float(format: DType) -> SitePlan {
        let o = OperandPlan::float(format);
        SitePlan { activation: o, weight: o, gradient: o, output: format }
    }
    pub fn operand(&self, o: Operand) -> &OperandPlan {
        match o {
            Operand::Activation => &self.activation,
            Operand::Weight => &self.weight,
            Operand::Gradient => &self.gradient,
        }
    }
    /// Whether the GEMM of `role` runs in low precision (both its operands FP8/FP4).
    pub fn low_precision(&self, role: GemmRole) -> bool {
        role.operands().iter().all(|o| self.operand(*o).is_low_precision())
    }
}

/// What quantising one operand did over a step (several quantisations of it, e.g. with
/// micro-batches, merged: the largest amax, counts added).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct OperandNumerics {
    /// max |x| before quantisation.
    pub amax: f32,
    /// The scale used (`q = x·scale`; per block: the block holding the amax).
    pub scale: f32,
    pub saturated: u64,
    pub underflowed: u64,
    /// NaN or Inf elements before quantisation.
    pub nonfinite: u64,
    pub elements: u64,
}

impl OperandNumerics {
    /// Fraction of elements clipped at the format's maximum.
    pub fn saturation_rate(&self) -> f64 {
        self.saturated as f64 / self.elements.max(1) as f64
    }
    /// Fraction of elements flushed to zero.
    pub fn underflow_rate(&self) -> f64 {
        self.underflowed as f64 / self.elements.max(1) as f64
    }
    pub(crate) fn merge(&mut self, r: &quant::QuantReport) {
        if self.elements == 0 || r.amax >= self.amax {
            self.scale = r.scale;
        }
        self.amax = self.amax.max(r.amax);
        self.saturated += r.saturated;
        self.underflowed += r.underflowed;
        self.nonfinite += r.nonfinite;
        self.elements += r.elements;
    }
}

/// One (site, operand) of the step's numerics.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SiteNumerics {
    /// The linear or grouped linear op (index into the graph's ops) and its name.
    pub op: usize,
    pub name: String,
    pub layer: i32,
    pub role: GemmRole,
    pub operand: Operand,
    pub numerics: OperandNumerics,
}

/// A fault injected into one operand the next time it is quantised (fault-injection
/// tests of precision policies), before quantisation, so the numerics see it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum FaultKind {
    /// The operand's largest element multiplied by this factor (an amax spike).
    Outlier(f32),
    /// The first element set to NaN.
    Nan,
}

/// Where and what to inject.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fault {
    /// Linear or grouped linear op name.
    pub op: String,
    pub role: GemmRole,
    pub operand: Operand,
    pub kind: FaultKind,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(format: DType, scaling: Scaling) -> OperandPlan {
        OperandPlan { format, scaling, saturate: false, stochastic: false, hadamard: 0 }
    }

    /// Each GEMM reads its own two operands (forward X and W, input gradient dY and W,
    /// weight gradient dY and X) and runs in low precision only when both are FP8/FP4:
    /// every combination of the three operands low or not, for each role. FP8, MXFP8
    /// and NVFP4 are low precision; the 16/32-bit floats (and int32) are not.
    #[test]
    fn a_gemm_is_low_precision_when_both_its_own_operands_are() {
        use Operand::*;
        assert_eq!(GemmRole::Forward.operands(), [Activation, Weight]);
        assert_eq!(GemmRole::InputGradient.operands(), [Gradient, Weight]);
        assert_eq!(GemmRole::WeightGradient.operands(), [Gradient, Activation]);
        for f in [DType::Fp8E4M3, DType::Fp8E5M2, DType::MxFp8, DType::NvFp4] {
            assert!(plan(f, Scaling::None).is_low_precision(), "{f:?}");
        }
        for f in [DType::F32, DType::BF16, DType::F16, DType::I32] {
            assert!(!plan(f, Scaling::None).is_low_precision(), "{f:?}");
        }
        let (low, high) = (plan(DType::NvFp4, Scaling::None), OperandPlan::float(DType::BF16));
        for bits in 0..8u8 {
            let pick = |b: u8| if bits & b != 0 { low } else { high };
            let p = SitePlan { activation: pick(1), weight: pick(2), gradient: pick(4), output: DType::BF16 };
            let (a, w, g) = (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
            assert_eq!(p.low_precision(GemmRole::Forward), a && w, "a {a} w {w} g {g}");
            assert_eq!(p.low_precision(GemmRole::InputGradient), g && w, "a {a} w {w} g {g}");
            assert_eq!(p.low_precision(GemmRole::WeightGradient), g && a, "a {a} w {w} g {g}");
        }
    }

    /// What an operand plan asks of the kernels: the float it is kept in (no scale), a
    /// per-tensor FP8 scale (the delayed scale for delayed scaling only; current scaling
    /// takes its own amax whatever history there is), block scales as planned (rows x
    /// cols, element format, scale format and rounding, NVFP4's tensor scale), the
    /// plan's saturation and a stochastic-rounding seed only when it rounds
    /// stochastically.
    #[test]
    fn an_operand_plan_becomes_the_kernels_spec() {
        use quant::Format;
        for (d, f) in [(DType::F32, FloatFormat::F32), (DType::BF16, FloatFormat::Bf16), (DType::F16, FloatFormat::F16)] {
            assert_eq!(OperandPlan::float(d).spec(Some(2.0), 7), Ok(QuantSpec::Float(f)), "{d:?}");
        }
        let current = plan(DType::Fp8E4M3, Scaling::Current { margin: 2 });
        let want = QuantSpec::Tensor { format: Format::E4M3, scale: None, margin: 2, saturate: false, stochastic: None };
        assert_eq!(current.spec(Some(3.0), 7), Ok(want));
        let delayed = plan(DType::Fp8E5M2, Scaling::Delayed { history: 4, reduction: AmaxReduction::Max, margin: 1 });
        let want = |scale| QuantSpec::Tensor { format: Format::E5M2, scale, margin: 1, saturate: false, stochastic: None };
        assert_eq!(delayed.spec(Some(3.0), 7), Ok(want(Some(3.0))));
        assert_eq!(delayed.spec(None, 7), Ok(want(None)), "an empty history: current scaling this once");
        let sr = OperandPlan { saturate: true, stochastic: true, ..current };
        let want = QuantSpec::Tensor { format: Format::E4M3, scale: None, margin: 2, saturate: true, stochastic: Some(7) };
        assert_eq!(sr.spec(None, 7), Ok(want));

        let block = |rows, cols, scale_format, scale_rounding, tensor_scale| Scaling::Block { rows, cols, scale_format, scale_rounding, tensor_scale };
        let mx = plan(DType::MxFp8, block(1, 32, ScaleFormat::E8M0, ScaleRounding::Pow2Up, false));
        let want = BlockSpec {
            format: Format::E4M3,
            block: (1, 32),
            scale_format: ScaleFormat::E8M0,
            scale_rounding: ScaleRounding::Pow2Up,
            tensor_scale: false,
            saturate: false,
            stochastic: None,
        };
        assert_eq!(mx.spec(None, 7), Ok(QuantSpec::Blocks(want)));
        let nv = OperandPlan { stochastic: true, saturate: true, ..plan(DType::NvFp4, block(16, 1, ScaleFormat::E4M3, ScaleRounding::Exact, true)) };
        let want = BlockSpec {
            format: Format::E2M1,
            block: (16, 1),
            scale_format: ScaleFormat::E4M3,
            scale_rounding: ScaleRounding::Exact,
            tensor_scale: true,
            saturate: true,
            stochastic: Some(9),
        };
        assert_eq!(nv.spec(None, 9), Ok(QuantSpec::Blocks(want)));
    }

    /// Plans the kernels cannot run are refused by `spec` (which `set_precision` runs on
    /// every operand), each saying what is wrong: a scaled 16/32-bit float, an FP8 plan
    /// without a scaling recipe, per-tensor scaling of a block format, an empty block
    /// side, int32.
    #[test]
    fn plans_the_kernels_cannot_run_are_refused_by_name() {
        let err = |p: OperandPlan| p.spec(None, 0).unwrap_err();
        assert!(err(plan(DType::BF16, Scaling::Current { margin: 0 })).contains("bf16 is not scaled"));
        assert!(err(plan(DType::F16, Scaling::Delayed { history: 1, reduction: AmaxReduction::MostRecent, margin: 0 })).contains("fp16 is not scaled"));
        assert!(err(plan(DType::Fp8E4M3, Scaling::None)).contains("fp8-e4m3 needs a scaling recipe"));
        assert!(err(plan(DType::MxFp8, Scaling::Current { margin: 0 })).contains("mxfp8 uses block scales"));
        assert!(err(plan(DType::NvFp4, Scaling::Delayed { history: 1, reduction: AmaxReduction::Max, margin: 0 })).contains("nvfp4 uses block scales"));
        for (rows, cols) in [(0, 32), (1, 0)] {
            let b = Scaling::Block { rows, cols, scale_format: ScaleFormat::E8M0, scale_rounding: ScaleRounding::Pow2Up, tensor_scale: false };
            assert_eq!(err(plan(DType::MxFp8, b)), format!("block {rows}x{cols}"));
        }
        assert!(err(plan(DType::I32, Scaling::None)).contains("int32"));
    }

    /// A step's numerics of one operand over several quantisations: the largest amax and
    /// the scale used with it (a smaller amax later keeps it), the counts added, each to
    /// its own; the rates are of all the elements, and 0 (not NaN) before any.
    #[test]
    fn numerics_merge_to_the_largest_amax_and_summed_counts() {
        let none = OperandNumerics::default();
        assert_eq!((none.saturation_rate(), none.underflow_rate()), (0.0, 0.0));
        let report = |amax, scale, saturated, underflowed, nonfinite, elements| quant::QuantReport { amax, scale, saturated, underflowed, nonfinite, elements };
        let mut n = OperandNumerics::default();
        n.merge(&report(2.0, 10.0, 1, 2, 0, 100));
        n.merge(&report(5.0, 4.0, 3, 0, 1, 50));
        n.merge(&report(1.0, 99.0, 0, 6, 2, 50));
        let want = OperandNumerics { amax: 5.0, scale: 4.0, saturated: 4, underflowed: 8, nonfinite: 3, elements: 200 };
        assert_eq!(n, want);
        assert_eq!((n.saturation_rate(), n.underflow_rate()), (0.02, 0.04));
    }
}
