//! Cost-model plugins seen from the host: validated offerings and itemised quotes. A quote
//! is asked only for a price the same instance listed last (anything else is refused
//! before the plugin is called), and checked against it: money that is finite, above zero,
//! adds up, and is not below the list price of what was asked for.

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
    PURCHASE_OPTIONS, check_request, find_price, has_upfront, hourly_per_node, list_price_floor, nodes_for,
    option_name, parse_option, term_hours, validate_offerings, validate_provider, validate_quote,
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
    /// The offerings of the last valid `offerings` call (None before the first): quotes
    /// are asked only for a price they list, and checked against it.
    listed: Option<Vec<Offering>>,
}

impl Plugin {
    /// Instantiate as a cost-model plugin.
    pub fn cost(&self, limits: Limits) -> Result<CostModel, PluginError> {
        self.expect_kind(Kind::Cost)?;
        let name = &self.info.name;
        let instance = match &self.pre {
            Pre::CostV3(pre) => Instance::V3(Sandboxed::new(name, pre.clone(), limits).of(&self.info)),
            Pre::CostV2(pre) => Instance::V2(Sandboxed::new(name, pre.clone(), limits).of(&self.info)),
            Pre::CostV1(pre) => Instance::V1(Sandboxed::new(name, pre.clone(), limits).of(&self.info)),
            _ => unreachable!("the kind was checked against the pre-instantiation"),
        };
        Ok(CostModel {
            info: self.info.clone(),
            instance,
            listed: None,
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
        self.listed = Some(offerings.clone());
        Ok(offerings)
    }

    /// An itemised quote of a price the offerings listed last hold, validated against it.
    ///
    /// # Errors
    /// [`Failure::NotAsked`], without calling the plugin, before the first
    /// [`CostModel::offerings`], for an instance, region or option it did not list, or for
    /// a request the contract rules out, 0 nodes among them (a quote with no list price, or
    /// a list price of 0, would have no floor: a hostile plugin could quote 1e-300 USD);
    /// else the plugin's own failure, or the contract rule its quote breaks.
    pub fn quote(&mut self, request: &QuoteRequest) -> Result<Quote, PluginError> {
        listed_price(request, self.listed.as_deref()).map_err(|m| PluginError::new(&self.info.name, "quote", Failure::NotAsked(m)).of(&self.info))?;
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
            result.map_err(|m| PluginError::new(&self.info.name, "quote", Failure::Refused(m)).of(&self.info))?;
        validate_quote(request, &quote, self.listed.as_deref().unwrap_or_default()).map_err(|m| self.invalid("quote", m))?;
        Ok(quote)
    }

    fn invalid(&self, call: &str, rule: String) -> PluginError {
        PluginError::new(&self.info.name, call, Failure::Invalid(rule)).of(&self.info)
    }
}

/// The price of `listed` (a plugin's last price list; None before it listed one) that
/// `request` asks for, if the request is one the contract lets a quote answer
/// ([`check_request`]): the host quotes only what a plugin listed, in whole nodes, so that
/// every quote has a list price above zero to be checked against.
///
/// # Errors
/// Why the request is not one to ask, and what to ask instead.
pub fn listed_price<'a>(request: &QuoteRequest, listed: Option<&'a [Offering]>) -> Result<&'a Price, String> {
    let Some(listed) = listed else {
        return Err(format!(
            "a quote of instance {} before any price list: list the offerings first (call `offerings` before `quote`)",
            runner_contract::text::shown(&request.instance)
        ));
    };
    check_request(request, listed).map(|(_, price)| price)
}

/// A clean, dated list price in `region` billed by the second with a one-minute minimum:
/// the one fixture behind this crate's tests and the runner's (`prices.rs`), so a field
/// the contract adds to `price` is filled in once.
#[doc(hidden)]
pub fn test_price(region: &str, option: PurchaseOption, usd_per_node_hour: f64, upfront_usd_per_node: f64) -> Price {
    Price {
        region: region.into(),
        option,
        usd_per_node_hour,
        upfront_usd_per_node,
        billing_increment_s: 1,
        minimum_charge_s: 60,
        effective_date: "2026-11-01".into(),
        source: "test".into(),
        caveats: Vec::new(),
    }
}

/// The contract's price-list and quote rules at their edges, each named by the mutation of
/// a hand audit that the other tests let through (the rule deleted or its bound moved).
#[cfg(test)]
mod tests {
    use super::*;

    use super::test_price as price;

    fn offering(instance: &str, prices: Vec<Price>) -> Offering {
        Offering {
            instance: instance.into(),
            gpu: "H100".into(),
            gpus_per_node: 8,
            scale_up_domain: 8,
            node_multiple: 1,
            interconnect_gbps: 3200.0,
            prices,
        }
    }

    fn on_demand(usd: f64) -> Offering {
        offering("p5", vec![price("us-east-1", PurchaseOption::OnDemand, usd, 0.0)])
    }

    #[track_caller]
    fn refused(offerings: &[Offering], word: &str) {
        let m = validate_offerings(offerings).expect_err("must be refused");
        assert!(m.contains(word), "{word:?} not in: {m}");
    }

    #[test]
    fn price_lists_are_refused_at_each_rule() {
        assert_eq!(validate_offerings(&[on_demand(98.32)]), Ok(()));
        refused(&[on_demand(98.32), on_demand(90.0)], "instance 'p5' is listed twice");

        let mut big = on_demand(98.32);
        (big.gpus_per_node, big.scale_up_domain) = (1024, 1024);
        assert_eq!(validate_offerings(&[big.clone()]), Ok(()));
        (big.gpus_per_node, big.scale_up_domain) = (1025, 1025);
        refused(&[big], "gpus-per-node must be in 1..=1024, got 1025");

        assert_eq!(validate_offerings(&[on_demand(1e9)]), Ok(()));
        refused(&[on_demand(2e9)], "usd-per-node-hour must be finite, >= 0 and at most 1e9 USD, got 2e9");
        refused(&[on_demand(0.0)], "the price is zero");
        // A tenth of a cent an hour is the floor; a per-second price of a GPU falls under it.
        assert_eq!(validate_offerings(&[on_demand(1e-3)]), Ok(()));
        refused(&[on_demand(1e-300)], "1e-300 USD/node-hour is under a tenth of a cent");
        refused(&[on_demand(2.0 / 3600.0)], "5.555555555555556e-4 USD/node-hour is under a tenth of a cent, less than any GPU node sells for: give the price per node-hour");

        let upfront = |usd| offering("p5", vec![price("us-east-1", PurchaseOption::OneYearAllUpfront, 0.0, usd)]);
        assert_eq!(validate_offerings(&[upfront(100_000.0)]), Ok(()));
        // An upfront term counts its payment over the term's 8760 hours.
        refused(&[upfront(1.0)], "USD/node-hour is under a tenth of a cent");
        let mut none = upfront(0.0);
        none.prices[0].usd_per_node_hour = 50.0;
        refused(&[none], "an upfront option without an upfront payment");
    }

    /// A spot or term price is checked against the on-demand price of its region, or
    /// against one that holds in every region (`*`) where the region has none.
    #[test]
    fn a_discount_dearer_than_an_every_region_on_demand_price_is_refused() {
        let list = |spot| {
            offering(
                "bm.gpu.h100.8",
                vec![
                    price(runner_contract::cost::ANY_REGION, PurchaseOption::OnDemand, 80.0, 0.0),
                    price("us-ashburn-1", PurchaseOption::Spot, spot, 0.0),
                ],
            )
        };
        assert_eq!(validate_offerings(&[list(40.0)]), Ok(()));
        refused(&[list(90.0)], "spot costs 90 USD/node-hour, more than on-demand (80)");
    }

    /// A term's price per node-hour is its hourly part plus its upfront payment spread over
    /// the term's hours, the one reading the checks against on-demand and the floor and
    /// `runner prices`' ranking share; an option with no term adds nothing. Kills: the
    /// upfront part left out, multiplied by the term, or spread over a 1-year term on a
    /// 3-year option; the on-demand check comparing the hourly part alone.
    #[test]
    fn a_terms_hourly_price_spreads_its_upfront_payment_over_the_term() {
        let term = |option, usd, upfront| price("us-east-1", option, usd, upfront);
        let one_year = runner_contract::cost::ONE_YEAR_H;
        assert_eq!(hourly_per_node(&term(PurchaseOption::OneYearPartialUpfront, 5.0, 4.0 * one_year)), 9.0);
        assert_eq!(hourly_per_node(&term(PurchaseOption::ThreeYearAllUpfront, 0.0, 6.0 * 3.0 * one_year)), 6.0);
        assert_eq!(hourly_per_node(&term(PurchaseOption::Spot, 3.0, 0.0)), 3.0);
        assert_eq!(hourly_per_node(&term(PurchaseOption::OneYearNoUpfront, 7.0, 0.0)), 7.0);

        // 5 an hour plus 4 an hour paid up front is dearer than on-demand at 8; plus 2, not.
        let list = |upfront| {
            offering(
                "p5",
                vec![
                    price("us-east-1", PurchaseOption::OnDemand, 8.0, 0.0),
                    term(PurchaseOption::OneYearPartialUpfront, 5.0, upfront * one_year),
                ],
            )
        };
        assert_eq!(validate_offerings(&[list(2.0)]), Ok(()));
        refused(&[list(4.0)], "1y-partial-upfront costs 9 USD/node-hour, more than on-demand (8)");
    }

    fn line(category: LineCategory, amount: f64) -> QuoteLine {
        QuoteLine {
            item: "compute".into(),
            category,
            quantity: 6.0,
            unit: "node-hour".into(),
            amount,
            estimate: false,
            caveats: Vec::new(),
        }
    }

    fn quote(lines: Vec<QuoteLine>, total: f64) -> Quote {
        Quote { currency: "USD".into(), lines, total, warnings: Vec::new() }
    }

    fn request() -> QuoteRequest {
        QuoteRequest {
            instance: "p5".into(),
            gpus: 16,
            nodes: 2,
            hours: 3.0,
            region: "us-east-1".into(),
            option: PurchaseOption::OnDemand,
            start_date: String::new(),
            storage_gb_months: 0.0,
            egress_gb: 0.0,
        }
    }

    #[test]
    fn quotes_are_refused_at_each_rule() {
        // 2 nodes x 3 h x 100 USD: a list price of 600 USD.
        let offerings = [on_demand(100.0)];
        let check = |q: &Quote| validate_quote(&request(), q, &offerings);
        let refused = |q: &Quote, word: &str| {
            let m = check(q).expect_err("must be refused");
            assert!(m.contains(word), "{word:?} not in: {m}");
        };
        assert_eq!(check(&quote(vec![line(LineCategory::Compute, 600.0)], 600.0)), Ok(()));
        let discounted = vec![line(LineCategory::Compute, 700.0), line(LineCategory::Discount, -100.0)];
        assert_eq!(check(&quote(discounted, 600.0)), Ok(()));

        refused(
            &quote(vec![line(LineCategory::Compute, 700.0), line(LineCategory::Other, -100.0)], 600.0),
            "amounts are finite, and negative only on discount lines",
        );
        refused(
            &quote(vec![line(LineCategory::Compute, 600.0), line(LineCategory::Discount, 100.0)], 700.0),
            "amounts are finite, and negative only on discount lines",
        );
        refused(&quote(vec![line(LineCategory::Compute, 2e15)], 2e15), "has the amount 2e15 USD");
        refused(&quote(Vec::new(), 0.0), "the total (0 USD) is not a price above zero");
        refused(&quote(vec![line(LineCategory::Compute, 600.0)], 650.0), "is not the sum of the lines (600)");
        // Half a percent under the list price is under it.
        refused(&quote(vec![line(LineCategory::Compute, 597.0)], 597.0), "is below the list price");
    }

    /// The host asks a quote only of a price the plugin listed: the instance, then the
    /// region (or one price for every region; an empty region takes any), then the option.
    /// Without it a request off the list has no list price, and `validate_quote` lets a
    /// quote of 1e-300 USD through (asserted last).
    #[test]
    fn only_a_listed_instance_region_and_option_is_quoted() {
        let listed = [offering(
            "p5",
            vec![
                price("us-east-1", PurchaseOption::OnDemand, 100.0, 0.0),
                price(runner_contract::cost::ANY_REGION, PurchaseOption::Spot, 40.0, 0.0),
            ],
        )];
        let usd = |r: &QuoteRequest| listed_price(r, Some(&listed)).map(|p| p.usd_per_node_hour);
        let spot = QuoteRequest { region: "us-west-2".into(), option: PurchaseOption::Spot, ..request() };
        assert_eq!(usd(&request()), Ok(100.0));
        assert_eq!(usd(&spot), Ok(40.0));
        assert_eq!(usd(&QuoteRequest { region: String::new(), ..request() }), Ok(100.0));

        #[track_caller]
        fn refused(r: &QuoteRequest, listed: Option<&[Offering]>, word: &str) {
            let m = listed_price(r, listed).expect_err("must be refused");
            assert!(m.contains(word), "{word:?} not in: {m}");
        }
        refused(&request(), None, "a quote of instance 'p5' before any price list: list the offerings first");
        refused(&request(), Some(&[]), "instance 'p5' is not in the price list (it lists none); quote an instance it lists");
        let p4d = QuoteRequest { instance: "p4d".into(), ..request() };
        refused(&p4d, Some(&listed), "instance 'p4d' is not in the price list (it lists 'p5')");
        let west = QuoteRequest { region: "us-west-2".into(), ..request() };
        refused(
            &west,
            Some(&listed),
            "no on-demand price for instance 'p5' in region 'us-west-2' (it prices us-east-1 on-demand, * spot)",
        );
        let term = QuoteRequest { option: PurchaseOption::OneYearNoUpfront, ..request() };
        refused(&term, Some(&listed), "no 1y-no-upfront price for instance 'p5' in region 'us-east-1'");
        // A long price list is named in part.
        let many: Vec<Offering> = (0..26).map(|i| offering(&format!("i{i}"), Vec::new())).collect();
        refused(&p4d, Some(&many), "(it lists 'i0', 'i1', 'i2', 'i3', 'i4', 'i5', 'i6', 'i7', 'i8', 'i9', 'i10', 'i11', 'i12', \
            'i13', 'i14', 'i15', 'i16', 'i17', 'i18', 'i19', 'i20', 'i21', 'i22', 'i23', and 2 more)");
        // The option asked for first, in every region it is priced.
        let spot_west = QuoteRequest { region: "eu-west-1".into(), option: PurchaseOption::Spot, ..request() };
        let two = [offering("p5", vec![listed[0].prices[0].clone(), price("us-west-2", PurchaseOption::Spot, 40.0, 0.0)])];
        refused(&spot_west, Some(&two), "no spot price for instance 'p5' in region 'eu-west-1' (it prices us-west-2 spot, us-east-1 on-demand)");

        let crumbs = quote(vec![line(LineCategory::Compute, 1e-300)], 1e-300);
        assert_eq!(validate_quote(&p4d, &crumbs, &listed), Ok(()), "no list price, no floor");
    }

    /// The host asks only what the contract lets a quote answer: whole nodes enough for the
    /// GPUs (never 0: its list price is 0, and a quote of 1e-300 USD passes, asserted
    /// last), in the offering's node multiple, finite hours, storage and egress, an ISO
    /// start date. The SDK's standard quote refuses the same requests with the same rule.
    #[test]
    fn only_a_request_the_contract_allows_is_quoted() {
        let listed = [on_demand(100.0)];
        let ok = |r: &QuoteRequest| listed_price(r, Some(&listed)).map(|p| p.usd_per_node_hour);
        #[track_caller]
        fn refused(r: &QuoteRequest, listed: &[Offering], word: &str) {
            let m = listed_price(r, Some(listed)).expect_err("must be refused");
            assert!(m.contains(word), "{word:?} not in: {m}");
        }
        // 16 GPUs on 8-GPU nodes: 2 nodes, or more.
        assert_eq!(ok(&QuoteRequest { nodes: 3, ..request() }), Ok(100.0));
        assert_eq!(ok(&QuoteRequest { hours: 0.0, start_date: "2026-12-05".into(), ..request() }), Ok(100.0));
        let none = QuoteRequest { nodes: 0, gpus: 0, ..request() };
        refused(&none, &listed, "0 nodes of 'p5' for 0 GPUs: it has 8 GPUs per node and is sold in multiples of 1 node");
        refused(&QuoteRequest { nodes: 1, ..request() }, &listed, "1 node of 'p5' for 16 GPUs: it has 8 GPUs per node");
        refused(&QuoteRequest { nodes: 1, ..request() }, &listed, "so ask for 2 nodes");
        let racks = [Offering { node_multiple: 18, ..on_demand(100.0) }];
        refused(&QuoteRequest { nodes: 2, ..request() }, &racks, "sold in multiples of 18 nodes, so ask for 18 nodes");
        assert_eq!(listed_price(&QuoteRequest { nodes: 36, ..request() }, Some(&racks)).map(|p| p.usd_per_node_hour), Ok(100.0));
        let single = [Offering { gpus_per_node: 1, ..racks[0].clone() }];
        refused(&QuoteRequest { gpus: u32::MAX, ..request() }, &single, "4294967295 GPUs is more nodes of 'p5' than can be counted");
        refused(&QuoteRequest { hours: f64::NAN, ..request() }, &listed, "hours must be a finite, non-negative number, got NaN");
        refused(&QuoteRequest { hours: -1.0, ..request() }, &listed, "hours must be");
        refused(&QuoteRequest { storage_gb_months: f64::INFINITY, ..request() }, &listed, "storage GB-months must be");
        refused(&QuoteRequest { egress_gb: -1.0, ..request() }, &listed, "egress GB must be");
        refused(&QuoteRequest { start_date: "12/05/2026".into(), ..request() }, &listed, "start-date '12/05/2026' is not an ISO date");

        let crumbs = quote(vec![line(LineCategory::Compute, 1e-300)], 1e-300);
        assert_eq!(list_price_floor(&none, &listed), Some(0.0));
        assert_eq!(validate_quote(&none, &crumbs, &listed), Ok(()), "0 nodes: a list price of 0, no floor");
    }

    /// The refusal of a quote below the list price names the request's hours as every
    /// other figure: 1e300 as `1e300`, not 301 digits (the property test found it).
    #[test]
    fn a_below_list_refusal_shows_astronomical_hours_short() {
        let request = QuoteRequest { hours: 1e300, ..request() };
        let m = validate_quote(&request, &quote(vec![line(LineCategory::Compute, 600.0)], 600.0), &[on_demand(100.0)]).unwrap_err();
        assert!(m.contains("2 nodes of p5 for 1e300 h, on-demand"), "{m}");
    }
}
