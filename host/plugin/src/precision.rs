//! Precision-policy plugins seen from the host: a validated plan per GEMM site (runnable
//! on the device it is asked for), and validated actions for each step.

use crate::bindings::v3::precision::exports::runner::plugin::precision_policy as wit;
use crate::bindings::{v1, v2, v3};
use crate::sandbox::{Limits, Sandboxed};
use crate::{Failure, Kind, Plugin, PluginError, PluginInfo, Pre, adapt};

pub use crate::bindings::v3::Dtype;
pub use wit::{
    Action, AmaxReduction, BlockShape, DeviceCapabilities, Fallback, FallbackScope, GemmRole,
    GemmSite, GlobalFallback, LayerMetrics, Operand, OperandMetrics, OperandPlan, PlanRequest,
    PlanResponse, RecipeChange, Repromotion, Rollback, ScaleFormat, ScaleRounding, ScalingRecipe,
    SiteMetrics, SitePlan, SiteSelector, StepMetrics, StepResponse, ValueRounding,
};

/// The contract's rules for plans and actions (`runner_contract`), expanded over the
/// host's 0.3 bindings: the same code the SDK runs.
mod rules {
    use super::Dtype;
    use super::wit::*;
    runner_contract::precision_rules!();
}
pub use rules::{
    dtype_name, is_low_precision, selects, unscaled, unscaled_operand, validate_operand,
    validate_plan, validate_step,
};

enum Instance {
    V3(Sandboxed<v3::precision::PrecisionPlugin>),
    /// Called with the 0.3 types (0.3 kept the precision contract word for word).
    V2(Sandboxed<v2::precision::PrecisionPlugin>),
    V1(Sandboxed<v1::precision::PrecisionPlugin>),
}

/// A live, sandboxed precision-policy plugin.
pub struct PrecisionPolicy {
    pub info: PluginInfo,
    instance: Instance,
}

impl Plugin {
    /// Instantiate as a precision-policy plugin.
    pub fn precision(&self, limits: Limits) -> Result<PrecisionPolicy, PluginError> {
        self.expect_kind(Kind::Precision)?;
        let name = &self.info.name;
        let instance = match &self.pre {
            Pre::PrecisionV3(pre) => Instance::V3(Sandboxed::new(name, pre.clone(), limits).of(&self.info)),
            Pre::PrecisionV2(pre) => Instance::V2(Sandboxed::new(name, pre.clone(), limits).of(&self.info)),
            Pre::PrecisionV1(pre) => Instance::V1(Sandboxed::new(name, pre.clone(), limits).of(&self.info)),
            _ => unreachable!("the kind was checked against the pre-instantiation"),
        };
        Ok(PrecisionPolicy {
            info: self.info.clone(),
            instance,
        })
    }
}

impl PrecisionPolicy {
    /// The policy's name and one-line description (escaped: it is printed).
    pub fn name(&mut self) -> Result<String, PluginError> {
        let name = alike!(
            &mut self.instance,
            [V3, V2, V1]
                | s
                | s.call("name", |s, p| {
                    p.runner_plugin_precision_policy().call_name(s)
                })?,
        );
        runner_contract::text::free("the policy name", &name)
            .map_err(|m| PluginError::new(&self.info.name, "name", Failure::Invalid(m)).of(&self.info))?;
        Ok(name)
    }

    pub fn plan(&mut self, request: &PlanRequest) -> Result<PlanResponse, PluginError> {
        let r = alike!(&mut self.instance, [V3, V2] |s| s.call("plan", |s, p| {
                p.runner_plugin_precision_policy().call_plan(s, request)
            })?,
            Instance::V1(s) => {
                let old = adapt::v1::plan_request(request);
                s.call("plan", |s, p| {
                    p.runner_plugin_precision_policy().call_plan(s, &old)
                })?
                .map(adapt::v1::plan_response)
            }
        );
        let r = r.map_err(|m| PluginError::new(&self.info.name, "plan", Failure::Refused(m)).of(&self.info))?;
        validate_plan(request, &r)
            .map_err(|m| PluginError::new(&self.info.name, "plan", Failure::Invalid(m)).of(&self.info))?;
        Ok(r)
    }

    pub fn on_step(&mut self, metrics: &StepMetrics) -> Result<StepResponse, PluginError> {
        let r = alike!(&mut self.instance, [V3, V2] |s| s.call("on-step", |s, p| {
                p.runner_plugin_precision_policy().call_on_step(s, metrics)
            })?,
            Instance::V1(s) => {
                let old = adapt::v1::step_metrics(metrics);
                s.call("on-step", |s, p| {
                    p.runner_plugin_precision_policy().call_on_step(s, &old)
                })?
                .map(adapt::v1::step_response)
            }
        );
        let r = r.map_err(|m| PluginError::new(&self.info.name, "on-step", Failure::Refused(m)).of(&self.info))?;
        validate_step(&r)
            .map_err(|m| PluginError::new(&self.info.name, "on-step", Failure::Invalid(m)).of(&self.info))?;
        Ok(r)
    }
}

/// A healthy training step (loss 2.5, gradient norm 1, all finite, no per-site numerics)
/// under `plan`, to see how a policy answers (`plugins validate`, tests).
pub fn healthy_step(step: u64, plan: Vec<SitePlan>, state: Vec<u8>) -> StepMetrics {
    StepMetrics {
        step,
        tokens: step * 4096,
        loss: 2.5,
        grad_norm: 1.0,
        learning_rate: 1e-4,
        loss_finite: true,
        grads_finite: true,
        layers: Vec::new(),
        sites: Vec::new(),
        plan,
        state,
    }
}

/// What a device offers a plan: its name, compute capability, and the formats its tensor
/// cores run (Ampere: BF16/FP16; Ada and Hopper: FP8 too; Blackwell: MXFP8 and NVFP4 too).
/// `cpu` runs FP32 and emulates every other format; a GPU this table does not know is
/// offered the high-precision formats only.
pub fn device_capabilities(name: &str) -> DeviceCapabilities {
    use Dtype::*;
    let high = [Fp32, Bf16, Fp16];
    let upper = name.to_ascii_uppercase();
    let (cc, native, emulated): (u32, Vec<Dtype>, Vec<Dtype>) = match upper.as_str() {
        "CPU" => (
            0,
            vec![Fp32],
            vec![Bf16, Fp16, Fp8E4m3, Fp8E5m2, Mxfp8, Nvfp4],
        ),
        "H100" | "H200" | "H800" | "H20" | "GH200" => (
            90,
            [high.as_slice(), &[Fp8E4m3, Fp8E5m2]].concat(),
            Vec::new(),
        ),
        "B200" | "B300" | "GB200" | "GB300" => (
            100,
            [high.as_slice(), &[Fp8E4m3, Fp8E5m2, Mxfp8, Nvfp4]].concat(),
            Vec::new(),
        ),
        // AMD's CDNA 3 and 4 boards run FP8 (E4M3/E5M2) on their matrix cores; they have
        // no CUDA compute capability (0), as the runner's profiles plan them.
        "MI300X" | "MI355X" => (
            0,
            [high.as_slice(), &[Fp8E4m3, Fp8E5m2]].concat(),
            Vec::new(),
        ),
        "L40S" | "L4" => (
            89,
            [high.as_slice(), &[Fp8E4m3, Fp8E5m2]].concat(),
            Vec::new(),
        ),
        a if a.starts_with("A100") || a.starts_with("A10") => (80, high.to_vec(), Vec::new()),
        _ => (0, high.to_vec(), Vec::new()),
    };
    DeviceCapabilities {
        name: name.to_string(),
        compute_capability: cc,
        native_formats: native,
        emulated_formats: emulated,
    }
}

/// Whether [`device_capabilities`] knows `name` (any other is planned as a GPU of the
/// high-precision formats only).
pub fn known_device(name: &str) -> bool {
    name.eq_ignore_ascii_case("cpu") || device_capabilities(name).compute_capability > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_offer_what_their_tensor_cores_run() {
        assert!(known_device("cpu") && known_device("gb300") && known_device("A100-40GB") && !known_device("H1000"));
        let has = |gpu: &str, d: Dtype| {
            let c = device_capabilities(gpu);
            c.native_formats.contains(&d) || c.emulated_formats.contains(&d)
        };
        assert!(
            has("H100", Dtype::Fp8E4m3) && !has("H100", Dtype::Nvfp4) && !has("H100", Dtype::Mxfp8)
        );
        assert!(has("GB200", Dtype::Nvfp4) && has("B200", Dtype::Mxfp8));
        assert!(!has("A100-80GB", Dtype::Fp8E4m3) && has("A100-40GB", Dtype::Bf16));
        assert!(
            has("cpu", Dtype::Nvfp4) && device_capabilities("cpu").native_formats == [Dtype::Fp32]
        );
        assert!(
            !has("X9000", Dtype::Fp8E4m3),
            "an unknown GPU is not assumed to emulate"
        );
    }

    /// FP8 E4M3 under delayed scaling, per tensor: a valid operand to vary one rule at a time.
    fn fp8() -> OperandPlan {
        OperandPlan {
            format: Dtype::Fp8E4m3,
            recipe: ScalingRecipe::Delayed,
            amax_history: 1024,
            amax_reduction: AmaxReduction::Max,
            ..unscaled_operand(Dtype::Fp8E4m3)
        }
    }

    #[track_caller]
    fn operand_refused(p: &OperandPlan, word: &str) {
        let m = validate_operand(p).expect_err("must be refused");
        assert!(m.contains(word), "{word:?} not in: {m}");
    }

    /// Each operand rule at its edge, named by the mutation of a hand audit that the other
    /// tests let through (the rule deleted or its bound moved).
    #[test]
    fn operands_are_refused_at_each_rule() {
        assert_eq!(validate_operand(&fp8()), Ok(()));
        operand_refused(
            &OperandPlan { hadamard: 16, ..unscaled_operand(Dtype::Bf16) },
            "bf16 is not scaled: recipe none, no blocks, no tensor scale, no Hadamard transform",
        );
        let block = |rows, cols| OperandPlan {
            recipe: ScalingRecipe::Block,
            block: BlockShape { rows, cols },
            ..fp8()
        };
        assert_eq!(validate_operand(&block(4096, 4096)), Ok(()));
        operand_refused(&block(4097, 128), "block 4097x128: both sides are 0 (per tensor) or both in 1..=4096");
        operand_refused(&block(128, 4097), "block 128x4097");
        for margin in [-64, 64] {
            assert_eq!(validate_operand(&OperandPlan { margin, ..fp8() }), Ok(()));
        }
        operand_refused(&OperandPlan { margin: 65, ..fp8() }, "margin 65 is outside -64..=64");
        operand_refused(&OperandPlan { margin: -65, ..fp8() }, "margin -65 is outside -64..=64");
        assert_eq!(validate_operand(&OperandPlan { hadamard: 256, ..fp8() }), Ok(()));
        operand_refused(&OperandPlan { hadamard: 512, ..fp8() }, "hadamard size 512 is not 0 or a power of two up to 256");
        operand_refused(&OperandPlan { hadamard: 48, ..fp8() }, "hadamard size 48");
        operand_refused(&OperandPlan { amax_history: 65_537, ..fp8() }, "amax history of 1..=65536, got 65537");
        operand_refused(
            &OperandPlan { recipe: ScalingRecipe::Current, amax_history: 65_537, ..fp8() },
            "amax-history 65537 is larger than 65536",
        );
    }

    #[test]
    fn a_plan_with_an_integer_output_or_oversized_state_is_refused() {
        let site = GemmSite { layer: 0, name: "layers.0.mlp.up".into(), role: GemmRole::Forward, m: 64, n: 64, k: 64 };
        let request = PlanRequest {
            model: "m".into(),
            layers: 1,
            device: device_capabilities("H100"),
            sites: vec![site],
            state: Vec::new(),
        };
        let plan = |output, state: usize| PlanResponse {
            sites: vec![SitePlan { output, ..unscaled(Dtype::Bf16) }],
            state: vec![0; state],
        };
        let max = runner_contract::limits::STATE_BYTES;
        assert_eq!(validate_plan(&request, &plan(Dtype::Bf16, max)), Ok(()));
        let m = validate_plan(&request, &plan(Dtype::Int32, 0)).unwrap_err();
        assert!(m.contains("the output format int32 is not a GEMM result format"), "{m}");
        let m = validate_plan(&request, &plan(Dtype::Bf16, max + 1)).unwrap_err();
        assert!(m.contains("bytes of state"), "{m}");
    }

    #[test]
    fn steps_are_refused_at_each_rule() {
        let step = |actions, state: usize| StepResponse { actions, state: vec![0; state] };
        let max = runner_contract::limits::STATE_BYTES;
        assert_eq!(validate_step(&step(Vec::new(), max)), Ok(()));
        let m = validate_step(&step(Vec::new(), max + 1)).unwrap_err();
        assert!(m.contains("bytes of state"), "{m}");
        let sites = SiteSelector { layers: Vec::new(), names: Vec::new(), roles: Vec::new() };
        let change = |margin, amax_history| {
            step(vec![Action::ChangeRecipe(RecipeChange { sites: sites.clone(), recipe: ScalingRecipe::Current, margin, amax_history })], 0)
        };
        assert_eq!(validate_step(&change(64, 65_536)), Ok(()));
        for (margin, history) in [(65, 16), (-65, 16), (0, 65_537)] {
            let m = validate_step(&change(margin, history)).unwrap_err();
            assert!(m.contains(&format!("recipe change with margin {margin} / amax-history {history}")), "{m}");
        }
        let m = validate_step(&step(vec![Action::Alert("a\u{1b}[2J".into())], 0)).unwrap_err();
        assert!(m.contains("a message") && m.contains("U+001B"), "{m}");
    }
}
