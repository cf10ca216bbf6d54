//! Native tests of the AWS price list (the host's rules and the project's provenance audit,
//! dates kept, reserved and Capacity Block prices billed as AWS bills them) and of quote
//! arithmetic: node-hours, per-second rounding, the one-minute minimum, estimates, errors.

use aws::Aws;
use runner_plugin_sdk::cost::*;

/// Two 8-GPU nodes.
fn request(instance: &str, region: &str, option: PurchaseOption, hours: f64) -> QuoteRequest {
    QuoteRequest::new(instance, region, option, 8 * 2, 2, hours)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6 * b.abs().max(1.0)
}

fn price(instance: &str, region: &str, option: PurchaseOption) -> Price {
    let o = Aws::offerings().into_iter().find(|o| o.instance == instance).unwrap();
    find_price(&o, region, option).unwrap_or_else(|| panic!("{instance} {region}: no price")).clone()
}

#[test]
fn price_list_passes_the_host_rules_and_the_provenance_audit() {
    // Unique names, finite positive prices, spot and terms below on-demand, ISO dates, every
    // price sourced, undated and caveated ones explained.
    let offerings = Aws::offerings();
    audit_price_list(&offerings).unwrap();
    let p5 = offerings.iter().find(|o| o.instance == "p5.48xlarge").unwrap();
    assert_eq!((p5.gpus_per_node, p5.scale_up_domain, p5.interconnect_gbps), (8, 8, 3200.0));
    assert!(p5.prices.iter().all(|p| p.source.contains("billing: per second")));
    assert_eq!(Aws::provider().name, "aws");
}

#[test]
fn dated_rows_keep_their_date_and_undated_ones_say_so() {
    let od = price("p5.48xlarge", "us-east-1", PurchaseOption::OnDemand);
    assert_eq!((od.usd_per_node_hour, od.effective_date.as_str()), (55.04, "2026-11-09"));
    assert!(od.source.contains("datareceipts"), "{}", od.source);
    let spot = price("p5.48xlarge", "us-east-1", PurchaseOption::Spot);
    assert!(spot.effective_date.is_empty() && spot.source.contains("undated catalog snapshot"));
    let spot = price("p5en.48xlarge", "us-east-1", PurchaseOption::Spot);
    assert_eq!((spot.usd_per_node_hour, spot.effective_date.as_str()), (27.1988, "2026-08-06"));
    assert!(spot.source.contains("dstackai/dstack#4110"), "{}", spot.source);
    for (instance, date) in [("p4d.24xlarge", "2026-11-09"), ("p4de.24xlarge", "2026-11-09"), ("p6-b200.48xlarge", "2026-08-26")] {
        assert_eq!(price(instance, "us-east-1", PurchaseOption::OnDemand).effective_date, date, "{instance}");
    }
}

#[test]
fn two_nodes_for_ten_hours() {
    let q =
        Aws::quote(request("p5.48xlarge", "us-east-1", PurchaseOption::OnDemand, 10.0)).unwrap();
    assert_eq!(q.lines.len(), 1);
    assert!(close(q.lines[0].quantity, 20.0));
    assert!(close(q.total, 2.0 * 10.0 * 55.04), "{}", q.total);
    assert!(q.lines[0].item.contains("price dated 2026-11-09") && !q.lines[0].estimate);
    let spot = Aws::quote(request("p5.48xlarge", "us-east-2", PurchaseOption::Spot, 10.0)).unwrap();
    assert!(close(spot.total, 2.0 * 10.0 * 11.2543));
    assert!(spot.warnings.iter().any(|w| w.contains("undated")), "{:?}", spot.warnings);
}

#[test]
fn a_one_year_reservation_bills_the_whole_term() {
    let p = price("p4de.24xlarge", "us-east-1", PurchaseOption::OneYearNoUpfront);
    assert_eq!((p.usd_per_node_hour, p.minimum_charge_s), (17.401365, 8760 * 3600));
    let q = Aws::quote(request("p4de.24xlarge", "us-east-1", PurchaseOption::OneYearNoUpfront, 10.0))
        .unwrap();
    assert!(close(q.lines[0].quantity, 2.0 * 8760.0), "{}", q.lines[0].quantity);
    assert!(close(q.total, 2.0 * 8760.0 * 17.401365), "{}", q.total);
    // No term is published for p5: the error names what is priced instead.
    let err = Aws::quote(request("p5.48xlarge", "us-east-1", PurchaseOption::OneYearNoUpfront, 1.0))
        .unwrap_err();
    assert!(err.contains("1y-no-upfront") && err.contains("us-east-1 capacity-block"), "{err}");
}

#[test]
fn capacity_blocks_bill_whole_days_and_are_flagged_suspect() {
    let q = Aws::quote(request("p5.48xlarge", "us-east-2", PurchaseOption::CapacityBlock, 30.0))
        .unwrap();
    assert!(close(q.lines[0].quantity, 2.0 * 48.0), "30 h buys two days: {}", q.lines[0].quantity);
    assert!(close(q.total, 2.0 * 48.0 * 39.33), "{}", q.total);
    assert_eq!(q.lines[0].caveats, vec![PriceCaveat::Suspect]);
    assert!(q.lines[0].estimate && q.warnings.iter().any(|w| w.contains("suspect")));
    // p5e has no on-demand price; its capacity block is its published price.
    let q = Aws::quote(request("p5e.48xlarge", "us-east-2", PurchaseOption::CapacityBlock, 24.0))
        .unwrap();
    assert!(close(q.total, 2.0 * 24.0 * 43.26), "{}", q.total);
}

/// AWS sells Capacity Blocks of 1 to 14 days, and of 7-day steps up to 182 days: a longer
/// run is several consecutive blocks, never one block of its length (a 200-day run was one
/// line of 200 days; 20 days were one block of 20, which AWS does not sell).
#[test]
fn a_run_is_bought_as_consecutive_capacity_blocks_that_aws_sells() {
    let sold = |days: f64| (1.0..=14.0).contains(&days) || (days % 7.0 == 0.0 && (14.0..=182.0).contains(&days));
    for (days, expect) in [
        (3.0, vec![(1.0, 3.0)]),
        (14.0, vec![(1.0, 14.0)]),
        (20.0, vec![(1.0, 14.0), (1.0, 6.0)]),
        (21.0, vec![(1.0, 21.0)]),
        (182.0, vec![(1.0, 182.0)]),
        (200.0, vec![(1.0, 182.0), (1.0, 14.0), (1.0, 4.0)]),
        (777.0, vec![(4.0, 182.0), (1.0, 49.0)]),
    ] {
        let blocks = aws::capacity_blocks(days);
        assert_eq!(blocks, expect, "{days} days");
        assert!(blocks.iter().all(|&(_, d)| sold(d)), "{days} days: {blocks:?}");
    }
    // A 200-day run on two nodes: a compute line per block length, adding up to the run's
    // whole days at the block rate, and a total the host accepts.
    let r = request("p5.48xlarge", "us-east-2", PurchaseOption::CapacityBlock, 200.0 * 24.0 - 5.0);
    let q = Aws::quote(r.clone()).unwrap();
    let compute: Vec<&QuoteLine> = q.lines.iter().filter(|l| l.category == LineCategory::Compute).collect();
    let days: Vec<f64> = compute.iter().map(|l| l.quantity / 2.0 / 24.0).collect();
    assert_eq!(days, [182.0, 14.0, 4.0], "{:?}", compute.iter().map(|l| &l.item).collect::<Vec<_>>());
    assert!(compute[0].item.ends_with(": 1 block of 182 days") && compute[2].item.ends_with(": 1 block of 4 days"), "{}", compute[0].item);
    assert!(close(q.total, 2.0 * 200.0 * 24.0 * 39.33), "{}", q.total);
    let offerings = Aws::offerings();
    validate_quote(&r, &q, &offerings).unwrap();
}

/// A Capacity Block holds at most 64 instances and an account at most 256 across its
/// blocks (EC2 User Guide): 100 nodes are two blocks side by side at the same rate, 256
/// are four, 257 cannot be bought that way (they were quoted as if one block held them).
#[test]
fn capacity_blocks_hold_64_instances_and_an_account_256() {
    assert_eq!(aws::blocks_side_by_side(64), [64]);
    assert_eq!(aws::blocks_side_by_side(100), [64, 36]);
    assert_eq!(aws::blocks_side_by_side(256), [64, 64, 64, 64]);
    let at = |nodes: u32, days: f64| {
        let r = QuoteRequest { gpus: 8 * nodes, nodes, ..request("p5.48xlarge", "us-east-2", PurchaseOption::CapacityBlock, days * 24.0) };
        Aws::quote(r.clone()).map(|q| (r, q))
    };
    let (r, q) = at(100, 20.0).unwrap();
    let items: Vec<&str> = q.lines.iter().filter(|l| l.category == LineCategory::Compute).map(|l| l.item.as_str()).collect();
    assert_eq!(items.len(), 2, "{items:?}");
    assert!(items.iter().all(|i| i.ends_with(", as 2 blocks side by side (64 + 36 instances)")), "{items:?}");
    assert!(close(q.total, 100.0 * 20.0 * 24.0 * 39.33), "{}", q.total);
    validate_quote(&r, &q, &Aws::offerings()).unwrap();
    let (_, q) = at(64, 3.0).unwrap();
    assert!(q.lines[0].item.ends_with(": 1 block of 3 days"), "{}", q.lines[0].item);
    assert!(at(256, 3.0).is_ok());
    let err = at(257, 3.0).unwrap_err();
    assert!(err.contains("257 p5.48xlarge") && err.contains("at most 256 instances") && err.contains("at most 2048 GPUs"), "{err}");
    // Other purchase options have no such limit.
    let r = QuoteRequest { gpus: 8 * 257, nodes: 257, ..request("p5.48xlarge", "us-east-1", PurchaseOption::OnDemand, 72.0) };
    assert!(Aws::quote(r).is_ok());
}

#[test]
fn rounds_up_to_the_second_after_a_one_minute_minimum() {
    let hourly = 2.0 * 55.04 / 3600.0; // USD per second for two nodes
    let secs = |s: f64| {
        Aws::quote(request("p5.48xlarge", "us-east-1", PurchaseOption::OnDemand, s / 3600.0))
    };
    assert!(close(secs(10.0).unwrap().total, 60.0 * hourly), "10 s bills the 60 s minimum");
    assert!(close(secs(90.5).unwrap().total, 91.0 * hourly), "90.5 s bills 91 s");
}

#[test]
fn storage_and_egress_are_estimates_that_name_their_source() {
    let mut r = request("p4d.24xlarge", "us-east-1", PurchaseOption::OnDemand, 1.0);
    r.storage_gb_months = 1200.0;
    r.egress_gb = 100.0;
    let q = Aws::quote(r).unwrap();
    assert_eq!(q.lines.len(), 3);
    assert!(!q.lines[0].estimate && q.lines[1].estimate && q.lines[2].estimate);
    assert!(q.lines[1].item.contains("FSx for Lustre") && q.lines[2].item.contains("first tier"));
    assert!(close(q.total, 2.0 * 21.957642 + 1200.0 * 0.14 + 100.0 * 0.09));
    assert_eq!(q.currency, "USD");
}

#[test]
fn errors_name_what_exists() {
    let err =
        Aws::quote(request("p9.huge", "us-east-1", PurchaseOption::OnDemand, 1.0)).unwrap_err();
    assert!(err.contains("p9.huge") && err.contains("p5.48xlarge"), "{err}");
    // p5e has no on-demand price (Capacity Blocks only): the error offers what it has.
    let err = Aws::quote(request("p5e.48xlarge", "us-east-2", PurchaseOption::OnDemand, 1.0))
        .unwrap_err();
    assert!(err.contains("us-east-2 spot") && err.contains("us-east-2 capacity-block"), "{err}");
    let err =
        Aws::quote(request("p5.48xlarge", "mars-1", PurchaseOption::OnDemand, 1.0)).unwrap_err();
    assert!(err.contains("mars-1") && err.contains("us-west-2 on-demand"), "{err}");
    // Too few nodes for the GPUs asked for.
    let mut r = request("p5.48xlarge", "us-east-1", PurchaseOption::OnDemand, 1.0);
    r.gpus = 17;
    assert!(Aws::quote(r).unwrap_err().contains("ask for 3 nodes"));
}
