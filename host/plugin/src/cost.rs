//! Cost-model plugins seen from the host: validated offerings and itemised quotes. A quote
//! is checked against the offerings the same instance listed last: money that is finite,
//! above zero, adds up, and is not below the list price of what was asked for.

use crate::bindings::v3::cost::exports::runner::plugin::cost_model as wit;
use crate::bindings::{v1, v2, v3};
use crate::sandbox::{Limits, Sandboxed};
use crate::{Failure, Kind, Plugin, PluginError, PluginInfo, Pre, adapt};

pub use wit::{
    ItemisedQuote as Quote, LineCategory, Offering, Price, PriceCaveat, ProviderInfo as Provider,
    PurchaseOption, QuoteLine, QuoteRequest,
};

/// The contract's rules for price lists and quotes (`runner_contract`), expanded over the
/// host's 0.3 bindings: the same code the SDK runs.
mod rules {
    use super::wit::*;
    runner_contract::cost_rules!();
}
pub use rules::{
    PURCHASE_OPTIONS, find_price, has_upfront, list_price_floor, nodes_for, option_name,
    parse_option, term_hours, validate_offerings, validate_provider, validate_quote,
};

enum Instance {
    V3(Sandboxed<v3::cost::CostPlugin>),
    /// Called with the 0.3 types (0.3 kept the cost contract word for word).
    V2(Sandboxed<v2::cost::CostPlugin>),
    V1(Sandboxed<v1::cost::CostPlugin>),
}

/// A live, sandboxed cost-model plugin.
pub struct CostModel {
    pub info: PluginInfo,
    instance: Instance,
    /// The offerings of the last `offerings` call: quotes are checked against them.
    listed: Vec<Offering>,
}

impl Plugin {
    /// Instantiate as a cost-model plugin.
    pub fn cost(&self, limits: Limits) -> Result<CostModel, PluginError> {
        self.expect_kind(Kind::Cost)?;
        let name = &self.info.name;
        let instance = match &self.pre {
            Pre::CostV3(pre) => Instance::V3(Sandboxed::new(name, pre.clone(), limits)),
            Pre::CostV2(pre) => Instance::V2(Sandboxed::new(name, pre.clone(), limits)),
            Pre::CostV1(pre) => Instance::V1(Sandboxed::new(name, pre.clone(), limits)),
            _ => unreachable!("the kind was checked against the pre-instantiation"),
        };
        Ok(CostModel {
            info: self.info.clone(),
            instance,
            listed: Vec::new(),
        })
    }
}

impl Plugin {
    /// Instantiate as a cost-model plugin that reads `data` (a user's price list) on its
    /// standard input: the generic pricing plugin's way to price a negotiated contract.
    pub fn cost_with_input(&self, limits: Limits, data: Vec<u8>) -> Result<CostModel, PluginError> {
        let mut model = self.cost(limits)?;
        model.instance = match model.instance {
            Instance::V3(s) => Instance::V3(s.with_input(data)),
            Instance::V2(s) => Instance::V2(s.with_input(data)),
            Instance::V1(s) => Instance::V1(s.with_input(data)),
        };
        Ok(model)
    }
}

impl CostModel {
    pub fn provider(&mut self) -> Result<Provider, PluginError> {
        let p = alike!(&mut self.instance, [V3, V2] |s| s.call("provider", |s, p| {
                p.runner_plugin_cost_model().call_provider(s)
            })?,
            Instance::V1(s) => adapt::v1::provider(s.call("provider", |s, p| {
                p.runner_plugin_cost_model().call_provider(s)
            })?),
        );
        validate_provider(&p).map_err(|m| self.invalid("provider", m))?;
        Ok(p)
    }

    pub fn offerings(&mut self) -> Result<Vec<Offering>, PluginError> {
        let offerings = alike!(&mut self.instance, [V3, V2] |s| s.call("offerings", |s, p| {
                p.runner_plugin_cost_model().call_offerings(s)
            })?,
            Instance::V1(s) => s
                .call("offerings", |s, p| {
                    p.runner_plugin_cost_model().call_offerings(s)
                })?
                .into_iter()
                .map(adapt::v1::offering)
                .collect(),
        );
        validate_offerings(&offerings).map_err(|m| self.invalid("offerings", m))?;
        self.listed.clone_from(&offerings);
        Ok(offerings)
    }

    /// An itemised quote, validated against the offerings listed last (call
    /// [`CostModel::offerings`] first, or the list-price floor is not checked).
    pub fn quote(&mut self, request: &QuoteRequest) -> Result<Quote, PluginError> {
        let result = alike!(&mut self.instance, [V3, V2] |s| s.call("quote", |s, p| {
                p.runner_plugin_cost_model().call_quote(s, request)
            })?,
            Instance::V1(s) => {
                let old = adapt::v1::quote_request(request);
                s.call("quote", |s, p| {
                    p.runner_plugin_cost_model().call_quote(s, &old)
                })?
                .map(adapt::v1::quote)
            }
        );
        let quote =
            result.map_err(|m| PluginError::new(&self.info.name, "quote", Failure::Refused(m)))?;
        validate_quote(request, &quote, &self.listed).map_err(|m| self.invalid("quote", m))?;
        Ok(quote)
    }

    fn invalid(&self, call: &str, rule: String) -> PluginError {
        PluginError::new(&self.info.name, call, Failure::Invalid(rule))
    }
}
