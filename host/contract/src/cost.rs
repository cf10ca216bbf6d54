//! The cost contract's rules: what a price list and a quote may say, and the billing
//! arithmetic both the SDK's standard quote and the host's list-price floor use.

/// A price whose region is this holds in every region (flat global price lists such as
/// OCI's); a request for any region, or for none, finds it.
pub const ANY_REGION: &str = "*";

/// The least a GPU node's price may come to per hour (an upfront term's payment spread
/// over the term's hours): a tenth of a cent, some 100 times under the cheapest public
/// GPU-hour (spot markets' older GPUs sell at about $0.1). Below it is a price in another
/// unit (per second, per GPU-second) or a placeholder, which would rank cheapest.
pub const MIN_USD_PER_NODE_HOUR: f64 = 1e-3;

/// Hours in a one- and a three-year term (365-day years, as cloud terms count them).
pub const ONE_YEAR_H: f64 = 8760.0;
pub const THREE_YEARS_H: f64 = 3.0 * 8760.0;

/// Seconds billed for `hours` of use: rounded up to whole `increment_s` and at least
/// `minimum_s`. The tolerance keeps binary noise (1.1 h is 3960.0000000000005 s) from
/// billing one more increment; it is far below a second, so no real run is rounded down.
pub fn billed_seconds(hours: f64, increment_s: u32, minimum_s: u32) -> f64 {
    let increment = f64::from(increment_s.max(1));
    let increments = (hours * 3600.0 / increment - 1e-9).ceil().max(0.0);
    (increments * increment).max(f64::from(minimum_s))
}

/// Expand the cost rules in a module that has the generated cost-model types in scope
/// (`Offering`, `Price`, `PurchaseOption`, `QuoteRequest`, `ItemisedQuote`, `QuoteLine`,
/// `LineCategory`, `ProviderInfo`). Defines `validate_provider`, `validate_offerings`,
/// `validate_quote`, `check_request`, `find_price`, `nodes_for`, `list_price_floor`,
/// `option_name`, `term_hours` and `hourly_per_node`.
#[macro_export]
macro_rules! cost_rules {
    () => {
        /// Every purchase option, in the contract's order.
        pub const PURCHASE_OPTIONS: [PurchaseOption; 9] = [
            PurchaseOption::OnDemand,
            PurchaseOption::Spot,
            PurchaseOption::CapacityBlock,
            PurchaseOption::OneYearNoUpfront,
            PurchaseOption::OneYearPartialUpfront,
            PurchaseOption::OneYearAllUpfront,
            PurchaseOption::ThreeYearNoUpfront,
            PurchaseOption::ThreeYearPartialUpfront,
            PurchaseOption::ThreeYearAllUpfront,
        ];

        /// The option [`option_name`] calls `name`; `reserved-1y` and `reserved-3y` (the
        /// names of contract 0.1) are the no-upfront terms.
        pub fn parse_option(name: &str) -> Option<PurchaseOption> {
            match name {
                "reserved-1y" => Some(PurchaseOption::OneYearNoUpfront),
                "reserved-3y" => Some(PurchaseOption::ThreeYearNoUpfront),
                _ => PURCHASE_OPTIONS.into_iter().find(|&o| option_name(o) == name),
            }
        }

        /// The human name of a purchase option, as quote lines and reports print it.
        pub fn option_name(option: PurchaseOption) -> &'static str {
            match option {
                PurchaseOption::OnDemand => "on-demand",
                PurchaseOption::Spot => "spot",
                PurchaseOption::CapacityBlock => "capacity-block",
                PurchaseOption::OneYearNoUpfront => "1y-no-upfront",
                PurchaseOption::OneYearPartialUpfront => "1y-partial-upfront",
                PurchaseOption::OneYearAllUpfront => "1y-all-upfront",
                PurchaseOption::ThreeYearNoUpfront => "3y-no-upfront",
                PurchaseOption::ThreeYearPartialUpfront => "3y-partial-upfront",
                PurchaseOption::ThreeYearAllUpfront => "3y-all-upfront",
            }
        }

        /// The length of a committed-use term in hours (None: not a term).
        pub fn term_hours(option: PurchaseOption) -> Option<f64> {
            match option {
                PurchaseOption::OneYearNoUpfront
                | PurchaseOption::OneYearPartialUpfront
                | PurchaseOption::OneYearAllUpfront => Some($crate::cost::ONE_YEAR_H),
                PurchaseOption::ThreeYearNoUpfront
                | PurchaseOption::ThreeYearPartialUpfront
                | PurchaseOption::ThreeYearAllUpfront => Some($crate::cost::THREE_YEARS_H),
                _ => None,
            }
        }

        /// What a price comes to per node-hour: its hourly part plus a committed term's
        /// upfront payment spread over the term's hours (an option with no term has no
        /// upfront payment). The price-list checks hold it to the floor and to on-demand,
        /// and `runner prices` ranks by it.
        pub fn hourly_per_node(p: &Price) -> f64 {
            p.usd_per_node_hour + term_hours(p.option).map_or(0.0, |h| p.upfront_usd_per_node / h)
        }

        /// Whether the option charges part or all of a term up front.
        pub fn has_upfront(option: PurchaseOption) -> bool {
            matches!(
                option,
                PurchaseOption::OneYearPartialUpfront
                    | PurchaseOption::OneYearAllUpfront
                    | PurchaseOption::ThreeYearPartialUpfront
                    | PurchaseOption::ThreeYearAllUpfront
            )
        }

        /// # Errors
        /// An empty or unprintable name.
        pub fn validate_provider(p: &ProviderInfo) -> Result<(), String> {
            $crate::text::name("provider name", &p.name)?;
            $crate::text::name("display name", &p.display_name)
        }

        /// The rules a price list follows: unique printable names, whole nodes inside a
        /// scale-up domain that fits them, finite positive money, each (region, option)
        /// priced once, spot and committed terms no dearer than on-demand, ISO dates.
        /// Linear in the size of the list.
        ///
        /// # Errors
        /// The first broken rule, naming the instance, region and option.
        pub fn validate_offerings(offerings: &[Offering]) -> Result<(), String> {
            use $crate::text;
            text::at_most("offerings", offerings.len(), $crate::limits::OFFERINGS)?;
            let mut names = std::collections::HashSet::new();
            for o in offerings {
                text::name("instance", &o.instance)?;
                let name = text::shown(&o.instance);
                if !names.insert(o.instance.as_str()) {
                    return Err(format!("instance {name} is listed twice"));
                }
                text::name("gpu", &o.gpu).map_err(|m| format!("instance {name}: {m}"))?;
                if o.gpus_per_node == 0 || o.gpus_per_node > 1024 {
                    return Err(format!("instance {name}: gpus-per-node must be in 1..=1024, got {}", o.gpus_per_node));
                }
                let (g, d) = (o.gpus_per_node, o.scale_up_domain);
                if d == 0 || d > 1 << 16 || !(d.is_multiple_of(g) || g.is_multiple_of(d)) {
                    return Err(format!(
                        "instance {name}: a scale-up domain of {d} GPUs does not fit nodes of {g} GPUs \
                         (one must divide the other: 8 for HGX, 72 for NVL72 trays of 4, 1 without NVLink)"
                    ));
                }
                if o.node_multiple == 0 || o.node_multiple > 1024 {
                    return Err(format!("instance {name}: node-multiple must be in 1..=1024, got {}", o.node_multiple));
                }
                if !(o.interconnect_gbps.is_finite() && (0.0..=1e6).contains(&o.interconnect_gbps)) {
                    return Err(format!("instance {name}: interconnect-gbps {} is not a bandwidth", text::number(o.interconnect_gbps)));
                }
                if o.prices.is_empty() {
                    return Err(format!("instance {name} has no prices"));
                }
                text::at_most("prices", o.prices.len(), $crate::limits::PRICES).map_err(|m| format!("instance {name}: {m}"))?;
                let mut priced = std::collections::HashMap::new();
                for p in &o.prices {
                    let what = format!("instance {name} in {} ({})", text::shown(&p.region), option_name(p.option));
                    validate_price(p).map_err(|m| format!("{what}: {m}"))?;
                    if priced.insert((p.region.as_str(), option_name(p.option)), p).is_some() {
                        return Err(format!("{what} is priced twice"));
                    }
                }
                for p in &o.prices {
                    if p.option == PurchaseOption::OnDemand || p.option == PurchaseOption::CapacityBlock {
                        continue;
                    }
                    let on_demand = priced
                        .get(&(p.region.as_str(), "on-demand"))
                        .or_else(|| priced.get(&($crate::cost::ANY_REGION, "on-demand")));
                    if let Some(od) = on_demand {
                        let hourly = hourly_per_node(p);
                        if hourly > od.usd_per_node_hour * (1.0 + 1e-9) {
                            return Err(format!(
                                "instance {name} in {}: {} costs {} USD/node-hour, more than on-demand ({})",
                                text::shown(&p.region),
                                option_name(p.option),
                                text::number(hourly),
                                text::number(od.usd_per_node_hour)
                            ));
                        }
                    }
                }
            }
            Ok(())
        }

        fn validate_price(p: &Price) -> Result<(), String> {
            use $crate::text;
            text::name("region", &p.region)?;
            text::date("effective-date", &p.effective_date)?;
            text::free("source", &p.source)?;
            text::at_most("caveats", p.caveats.len(), $crate::limits::CAVEATS)?;
            let money = |what: &str, x: f64| {
                if x.is_finite() && (0.0..=1e9).contains(&x) {
                    Ok(())
                } else {
                    Err(format!("{what} must be finite, >= 0 and at most 1e9 USD, got {}", $crate::text::number(x)))
                }
            };
            money("usd-per-node-hour", p.usd_per_node_hour)?;
            money("upfront-usd-per-node", p.upfront_usd_per_node)?;
            if p.usd_per_node_hour + p.upfront_usd_per_node <= 0.0 {
                return Err("the price is zero; a free node is a missing price".into());
            }
            let hourly = hourly_per_node(p);
            if hourly < $crate::cost::MIN_USD_PER_NODE_HOUR {
                return Err(format!(
                    "{} USD/node-hour is under a tenth of a cent, less than any GPU node sells for: \
                     give the price per node-hour (not per second or per GPU-second)",
                    text::number(hourly)
                ));
            }
            if p.upfront_usd_per_node > 0.0 && !has_upfront(p.option) {
                return Err("an upfront payment on an option that has none".into());
            }
            if has_upfront(p.option) && p.upfront_usd_per_node == 0.0 {
                return Err("an upfront option without an upfront payment".into());
            }
            if p.billing_increment_s == 0 {
                return Err("billing-increment-s must be at least 1".into());
            }
            Ok(())
        }

        /// The nodes a run of `gpus` GPUs takes on `offering`: whole nodes, bought in its
        /// `node-multiple` (5 GPUs on 4-GPU trays take 2 trays; on trays sold by the 18-tray
        /// NVL72 rack, 18). The host sizes quote requests with it and a standard quote checks
        /// them with it. None where the count overflows.
        pub fn nodes_for(offering: &Offering, gpus: u32) -> Option<u32> {
            gpus.div_ceil(offering.gpus_per_node.max(1)).checked_next_multiple_of(offering.node_multiple.max(1))
        }

        /// The price `offering` lists for `option` in `region`: that region's, else one that
        /// holds in every region; an empty region takes the first priced for the option.
        pub fn find_price<'a>(offering: &'a Offering, region: &str, option: PurchaseOption) -> Option<&'a Price> {
            let matches = |p: &&Price| p.option == option;
            if region.is_empty() {
                return offering.prices.iter().find(matches);
            }
            offering
                .prices
                .iter()
                .filter(matches)
                .find(|p| p.region == region)
                .or_else(|| offering.prices.iter().filter(matches).find(|p| p.region == $crate::cost::ANY_REGION))
        }

        /// The offering and price `request` asks for in `offerings`, if the request is one a
        /// quote can answer: an instance and a region and purchase option it lists, whole
        /// nodes enough for the GPUs in the offering's node multiple (never 0: a request for
        /// no nodes has a list price of 0, so no floor), finite non-negative hours, storage
        /// and egress, and an ISO start date or none. The host asks only such requests; the
        /// SDK's standard quote checks them with it too.
        ///
        /// # Errors
        /// The first rule the request breaks, with what exists or what to ask instead.
        pub fn check_request<'a>(request: &QuoteRequest, offerings: &'a [Offering]) -> Result<(&'a Offering, &'a Price), String> {
            use $crate::text;
            // Some names say what to ask for; a hostile list of thousands would flood the line.
            fn some(names: Vec<String>) -> String {
                const SHOWN: usize = 24;
                let n = names.len();
                let mut shown: Vec<String> = names.into_iter().take(SHOWN).collect();
                if n > SHOWN {
                    shown.push(format!("and {} more", n - SHOWN));
                }
                if shown.is_empty() { "none".into() } else { shown.join(", ") }
            }
            let instance = text::shown(&request.instance);
            let Some(offering) = offerings.iter().find(|o| o.instance == request.instance) else {
                return Err(format!(
                    "instance {instance} is not in the price list (it lists {}); quote an instance it lists",
                    some(offerings.iter().map(|o| text::shown(&o.instance)).collect())
                ));
            };
            let Some(price) = find_price(offering, &request.region, request.option) else {
                let region = if request.region.is_empty() { "any region".to_string() } else { format!("region {}", text::shown(&request.region)) };
                return Err(format!(
                    "the price list has no {} price for instance {instance} in {region} (it prices {}); \
                     quote a region and purchase option it lists",
                    option_name(request.option),
                    // The option asked for first: its other regions are the likeliest fix.
                    some(
                        offering.prices.iter().filter(|p| p.option == request.option)
                            .chain(offering.prices.iter().filter(|p| p.option != request.option))
                            .map(|p| format!("{} {}", text::escape(&p.region, 64), option_name(p.option)))
                            .collect()
                    )
                ));
            };
            let multiple = offering.node_multiple.max(1);
            let enough = nodes_for(offering, request.gpus)
                .ok_or_else(|| format!("{} GPUs is more nodes of {instance} than can be counted", request.gpus))?;
            if request.nodes == 0 || request.nodes < enough || !request.nodes.is_multiple_of(multiple) {
                return Err(format!(
                    "{} of {instance} for {}: it has {} per node and is sold in multiples of {}, \
                     so ask for {} (or more, in multiples of {multiple})",
                    text::count(request.nodes, "node"),
                    text::count(request.gpus, "GPU"),
                    text::count(offering.gpus_per_node, "GPU"),
                    text::count(multiple, "node"),
                    text::count(enough.max(multiple), "node"),
                ));
            }
            for (what, value) in [("hours", request.hours), ("storage GB-months", request.storage_gb_months), ("egress GB", request.egress_gb)] {
                if !(value.is_finite() && value >= 0.0) {
                    return Err(format!("{what} must be a finite, non-negative number, got {}", text::number(value)));
                }
            }
            text::date("start-date", &request.start_date)?;
            Ok((offering, price))
        }

        /// What `request` costs at the list price of its instance, region and option in
        /// `offerings` (node time billed as the price says, plus the upfront part), in USD:
        /// no quote may come in below it. None where the list has no such price.
        pub fn list_price_floor(request: &QuoteRequest, offerings: &[Offering]) -> Option<f64> {
            let o = offerings.iter().find(|o| o.instance == request.instance)?;
            let p = find_price(o, &request.region, request.option)?;
            let nodes = f64::from(request.nodes);
            let billed_h = $crate::cost::billed_seconds(request.hours, p.billing_increment_s, p.minimum_charge_s) / 3600.0;
            Some(nodes * (billed_h * p.usd_per_node_hour + p.upfront_usd_per_node))
        }

        /// The rules a quote follows: a currency, printable lines with finite amounts
        /// (negative only on discount lines) that add up to a total above zero, and, in
        /// USD, a total no lower than the list price of what was asked for.
        ///
        /// # Errors
        /// The first broken rule, naming the line.
        pub fn validate_quote(request: &QuoteRequest, q: &ItemisedQuote, offerings: &[Offering]) -> Result<(), String> {
            use $crate::text;
            text::currency(&q.currency)?;
            text::at_most("lines", q.lines.len(), $crate::limits::QUOTE_LINES)?;
            text::at_most("warnings", q.warnings.len(), $crate::limits::WARNINGS)?;
            for w in &q.warnings {
                text::free("a warning", w)?;
            }
            let mut sum = 0.0;
            for l in &q.lines {
                text::free("a line's item", &l.item)?;
                let item = text::shown(&l.item);
                text::name("unit", &l.unit).map_err(|m| format!("line {item}: {m}"))?;
                text::at_most("caveats", l.caveats.len(), $crate::limits::CAVEATS)?;
                if !(l.quantity.is_finite() && l.quantity >= 0.0) {
                    return Err(format!("line {item} has a non-finite or negative quantity ({})", text::number(l.quantity)));
                }
                let discount = l.category == LineCategory::Discount;
                if !l.amount.is_finite() || l.amount.abs() > 1e15 || (l.amount < 0.0 && !discount) || (l.amount > 0.0 && discount) {
                    return Err(format!(
                        "line {item} has the amount {} {}; amounts are finite, and negative only on discount lines",
                        text::number(l.amount), q.currency
                    ));
                }
                sum += l.amount;
            }
            if !(q.total.is_finite() && q.total > 0.0) {
                return Err(format!("the total ({} {}) is not a price above zero", text::number(q.total), q.currency));
            }
            if (sum - q.total).abs() > 1e-6 * sum.abs().max(1.0) {
                return Err(format!("the total ({}) is not the sum of the lines ({})", text::number(q.total), text::number(sum)));
            }
            if q.currency == "USD"
                && let Some(floor) = list_price_floor(request, offerings)
                && q.total < floor * (1.0 - 1e-9) - 1e-9
            {
                // Cents hide the gap on a short request; six decimals show it.
                let usd = |x: f64| if x >= 1e6 { text::number(x) } else if x >= 1.0 { format!("{x:.2}") } else { format!("{x:.6}") };
                return Err(format!(
                    "the total ({} USD) is below the list price of what was asked for ({} USD: {} nodes of {} for {} h, {}); \
                     put discounts in the price list",
                    usd(q.total),
                    usd(floor),
                    request.nodes,
                    text::escape(&request.instance, 64),
                    text::number(request.hours),
                    option_name(request.option)
                ));
            }
            Ok(())
        }
    };
}
