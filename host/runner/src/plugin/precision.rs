//! Precision-policy plugins seen from the host: a validated plan per GEMM site, and
//! validated actions for each step.

use super::bindings::precision::PrecisionPlugin;
use super::bindings::precision::exports::runner::plugin::precision_policy as wit;
use super::sandbox::{Limits, Sandboxed, linker};
use super::{Failure, Kind, Plugin, PluginError, PluginInfo};

pub use super::bindings::Dtype;
pub use wit::{
    Action, AmaxReduction, FallbackScope, GemmRole, GemmSite, PlanRequest, PlanResponse,
    ScalingRecipe, SiteMetrics, SitePlan, SiteSelector, StepMetrics, StepResponse,
};

/// The largest opaque state blob a policy may keep between calls.
const MAX_STATE_BYTES: usize = 1 << 20;

/// A live, sandboxed precision-policy plugin.
pub struct PrecisionPolicy {
    pub info: PluginInfo,
    sandbox: Sandboxed<PrecisionPlugin>,
}

impl Plugin {
    /// Instantiate as a precision-policy plugin.
    pub fn precision(&self, limits: Limits) -> Result<PrecisionPolicy, PluginError> {
        self.expect_kind(Kind::Precision)?;
        let pre = linker()
            .and_then(|l| l.instantiate_pre(&self.component))
            .and_then(super::bindings::precision::PrecisionPluginPre::new)
            .map_err(|e| {
                PluginError::new(&self.info.name, "load", Failure::Load(format!("{e:#}")))
            })?;
        Ok(PrecisionPolicy {
            info: self.info.clone(),
            sandbox: Sandboxed::new(&self.info.name, pre, limits),
        })
    }
}

impl PrecisionPolicy {
    pub fn name(&mut self) -> Result<String, PluginError> {
        self.sandbox.call("name", |s, p| {
            p.runner_plugin_precision_policy().call_name(s)
        })
    }

    pub fn plan(&mut self, request: &PlanRequest) -> Result<PlanResponse, PluginError> {
        let r = self.sandbox.call("plan", |s, p| {
            p.runner_plugin_precision_policy().call_plan(s, request)
        })?;
        let r = r.map_err(|m| PluginError::new(&self.info.name, "plan", Failure::Refused(m)))?;
        validate_plan(request, &r)
            .map_err(|m| PluginError::new(&self.info.name, "plan", Failure::Invalid(m)))?;
        Ok(r)
    }

    pub fn on_step(&mut self, metrics: &StepMetrics) -> Result<StepResponse, PluginError> {
        let r = self.sandbox.call("on-step", |s, p| {
            p.runner_plugin_precision_policy().call_on_step(s, metrics)
        })?;
        let r = r.map_err(|m| PluginError::new(&self.info.name, "on-step", Failure::Refused(m)))?;
        validate_step(&r)
            .map_err(|m| PluginError::new(&self.info.name, "on-step", Failure::Invalid(m)))?;
        Ok(r)
    }
}

/// One plan per site, in order, with sane recipe parameters.
pub fn validate_plan(request: &PlanRequest, r: &PlanResponse) -> Result<(), String> {
    if r.sites.len() != request.sites.len() {
        return Err(format!(
            "{} sites were asked for but {} plans came back",
            request.sites.len(),
            r.sites.len()
        ));
    }
    if r.state.len() > MAX_STATE_BYTES {
        return Err(format!(
            "state blob of {} bytes exceeds {MAX_STATE_BYTES}",
            r.state.len()
        ));
    }
    for (site, plan) in request.sites.iter().zip(&r.sites) {
        let ctx = |m: &str| format!("site '{}' ({:?}): {m}", site.name, site.role);
        if plan.block_size > 4096 {
            return Err(ctx(&format!(
                "block-size {} is larger than 4096",
                plan.block_size
            )));
        }
        if plan.recipe == ScalingRecipe::Block && plan.block_size == 0 {
            return Err(ctx("the block recipe needs a block-size > 0"));
        }
        if plan.amax_history > 65_536 {
            return Err(ctx(&format!(
                "amax-history {} is larger than 65536",
                plan.amax_history
            )));
        }
        if !(-64..=64).contains(&plan.margin) {
            return Err(ctx(&format!("margin {} is outside -64..=64", plan.margin)));
        }
    }
    Ok(())
}

/// Actions must be well-formed: a rollback moves back at least one step.
pub fn validate_step(r: &StepResponse) -> Result<(), String> {
    if r.state.len() > MAX_STATE_BYTES {
        return Err(format!(
            "state blob of {} bytes exceeds {MAX_STATE_BYTES}",
            r.state.len()
        ));
    }
    if r.actions.len() > 10_000 {
        return Err(format!(
            "{} actions in one step is not a decision",
            r.actions.len()
        ));
    }
    for a in &r.actions {
        if let Action::Rollback(rb) = a
            && rb.steps == 0
        {
            return Err("rollback of 0 steps".into());
        }
    }
    Ok(())
}
