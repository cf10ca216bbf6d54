//! Cost-model plugins seen from the host: validated offerings and itemised quotes.

use std::collections::HashSet;

use super::bindings::cost::CostPlugin;
use super::bindings::cost::exports::runner::plugin::cost_model as wit;
use super::sandbox::{Limits, Sandboxed, linker};
use super::{Failure, Kind, Plugin, PluginError, PluginInfo};

pub use wit::{
    ItemisedQuote as Quote, Offering, Price, ProviderInfo as Provider, PurchaseOption, QuoteLine,
    QuoteRequest,
};

/// A live, sandboxed cost-model plugin.
pub struct CostModel {
    pub info: PluginInfo,
    sandbox: Sandboxed<CostPlugin>,
}

impl Plugin {
    /// Instantiate as a cost-model plugin.
    pub fn cost(&self, limits: Limits) -> Result<CostModel, PluginError> {
        self.expect_kind(Kind::Cost)?;
        let pre = linker()
            .and_then(|l| l.instantiate_pre(&self.component))
            .and_then(super::bindings::cost::CostPluginPre::new)
            .map_err(|e| {
                PluginError::new(&self.info.name, "load", Failure::Load(format!("{e:#}")))
            })?;
        Ok(CostModel {
            info: self.info.clone(),
            sandbox: Sandboxed::new(&self.info.name, pre, limits),
        })
    }
}

impl CostModel {
    pub fn provider(&mut self) -> Result<Provider, PluginError> {
        let p = self.sandbox.call("provider", |s, p| {
            p.runner_plugin_cost_model().call_provider(s)
        })?;
        if p.name.trim().is_empty() {
            return Err(self.invalid("provider", "the provider name is empty".into()));
        }
        Ok(p)
    }

    pub fn offerings(&mut self) -> Result<Vec<Offering>, PluginError> {
        let offerings = self.sandbox.call("offerings", |s, p| {
            p.runner_plugin_cost_model().call_offerings(s)
        })?;
        validate_offerings(&offerings).map_err(|m| self.invalid("offerings", m))?;
        Ok(offerings)
    }

    pub fn quote(&mut self, request: &QuoteRequest) -> Result<Quote, PluginError> {
        let result = self.sandbox.call("quote", |s, p| {
            p.runner_plugin_cost_model().call_quote(s, request)
        })?;
        let quote =
            result.map_err(|m| PluginError::new(&self.info.name, "quote", Failure::Refused(m)))?;
        validate_quote(&quote).map_err(|m| self.invalid("quote", m))?;
        Ok(quote)
    }

    fn invalid(&self, call: &str, rule: String) -> PluginError {
        PluginError::new(&self.info.name, call, Failure::Invalid(rule))
    }
}

/// The rules `offerings` output must follow.
pub fn validate_offerings(offerings: &[Offering]) -> Result<(), String> {
    let mut names = HashSet::new();
    for o in offerings {
        if !names.insert(o.instance.as_str()) {
            return Err(format!("instance '{}' is listed twice", o.instance));
        }
        if o.gpus_per_node == 0 {
            return Err(format!(
                "instance '{}': gpus-per-node must be at least 1",
                o.instance
            ));
        }
        if !(o.interconnect_gbps.is_finite() && o.interconnect_gbps >= 0.0) {
            return Err(format!(
                "instance '{}': interconnect-gbps must be finite and >= 0",
                o.instance
            ));
        }
        if o.prices.is_empty() {
            return Err(format!("instance '{}' has no prices", o.instance));
        }
        for p in &o.prices {
            if !(p.usd_per_node_hour.is_finite() && p.usd_per_node_hour > 0.0) {
                return Err(format!(
                    "instance '{}' in '{}': price must be finite and > 0 USD/node-hour, got {}",
                    o.instance, p.region, p.usd_per_node_hour
                ));
            }
        }
        for spot in o.prices.iter().filter(|p| p.option == PurchaseOption::Spot) {
            if let Some(od) = o
                .prices
                .iter()
                .find(|p| p.option == PurchaseOption::OnDemand && p.region == spot.region)
                && spot.usd_per_node_hour > od.usd_per_node_hour
            {
                return Err(format!(
                    "instance '{}' in '{}': spot ({}) costs more than on-demand ({})",
                    o.instance, spot.region, spot.usd_per_node_hour, od.usd_per_node_hour
                ));
            }
        }
    }
    Ok(())
}

/// The rules a quote must follow: finite, non-negative lines that add up to the total.
pub fn validate_quote(q: &Quote) -> Result<(), String> {
    for l in &q.lines {
        if !(l.usd.is_finite() && l.usd >= 0.0 && l.quantity.is_finite() && l.quantity >= 0.0) {
            return Err(format!(
                "line '{}' has a non-finite or negative amount ({} {}, {} USD)",
                l.item, l.quantity, l.unit, l.usd
            ));
        }
    }
    let sum: f64 = q.lines.iter().map(|l| l.usd).sum();
    if !q.total_usd.is_finite() || (sum - q.total_usd).abs() > 1e-6 * sum.abs().max(1.0) {
        return Err(format!(
            "the total ({}) is not the sum of the lines ({sum})",
            q.total_usd
        ));
    }
    Ok(())
}
