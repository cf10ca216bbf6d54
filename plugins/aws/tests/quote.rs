//! Native tests of the AWS price list (every row sane) and of quote arithmetic: node-hours,
//! per-second rounding, the one-minute minimum, and error messages that name what exists.

use aws::Aws;
use runner_plugin_sdk::cost::*;

fn request(instance: &str, region: &str, option: PurchaseOption, hours: f64) -> QuoteRequest {
    QuoteRequest {
        instance: instance.into(),
        gpus: 8 * 2,
        nodes: 2,
        hours,
        region: region.into(),
        option,
        start_date: String::new(),
        storage_gb_months: 0.0,
        egress_gb: 0.0,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6 * b.abs().max(1.0)
}

#[test]
fn price_list_is_sane() {
    // Non-empty, unique names, every price finite and positive, spot <= on-demand.
    let offerings = Aws::offerings();
    validate_offerings(&offerings).unwrap();
    let p5 = offerings.iter().find(|o| o.instance == "p5.48xlarge").unwrap();
    assert_eq!((p5.gpus_per_node, p5.scale_up_domain, p5.interconnect_gbps), (8, 8, 3200.0));
    assert_eq!((p5.prices[0].billing_increment_s, p5.prices[0].minimum_charge_s), (1, 60));
    assert!(p5.prices[0].source.contains("skypilot-catalog") && p5.prices[0].source.contains("billing"));
    assert_eq!(Aws::provider().name, "aws");
}

#[test]
fn two_nodes_for_ten_hours() {
    let q =
        Aws::quote(request("p5.48xlarge", "us-east-1", PurchaseOption::OnDemand, 10.0)).unwrap();
    assert_eq!(q.lines.len(), 1);
    assert!(close(q.lines[0].quantity, 20.0));
    assert!(close(q.total, 2.0 * 10.0 * 55.04), "{}", q.total);
    let spot = Aws::quote(request("p5.48xlarge", "us-east-2", PurchaseOption::Spot, 10.0)).unwrap();
    assert!(close(spot.total, 2.0 * 10.0 * 11.2543));
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
fn storage_and_egress_are_estimates() {
    let mut r = request("p4d.24xlarge", "us-east-1", PurchaseOption::OnDemand, 1.0);
    r.storage_gb_months = 1200.0;
    r.egress_gb = 100.0;
    let q = Aws::quote(r).unwrap();
    assert_eq!(q.lines.len(), 3);
    assert!(!q.lines[0].estimate && q.lines[1].estimate && q.lines[2].estimate);
    assert!(close(q.total, 2.0 * 21.957642 + 1200.0 * 0.14 + 100.0 * 0.09));
}

#[test]
fn errors_name_what_exists() {
    let err =
        Aws::quote(request("p9.huge", "us-east-1", PurchaseOption::OnDemand, 1.0)).unwrap_err();
    assert!(err.contains("p9.huge") && err.contains("p5.48xlarge"), "{err}");
    // p5e has no on-demand price (Capacity Blocks only): the error offers its spot price.
    let err = Aws::quote(request("p5e.48xlarge", "us-east-2", PurchaseOption::OnDemand, 1.0))
        .unwrap_err();
    assert!(err.contains("us-east-2 spot"), "{err}");
    let err =
        Aws::quote(request("p5.48xlarge", "mars-1", PurchaseOption::OnDemand, 1.0)).unwrap_err();
    assert!(err.contains("mars-1") && err.contains("us-west-2 on-demand"), "{err}");
}
