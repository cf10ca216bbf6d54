//! Native tests of the Lambda price list (every row sane) and of quote arithmetic: node-hours,
//! per-minute rounding, free egress, one price everywhere, and error messages.

use lambda::Lambda;
use runner_plugin_sdk::cost::*;

/// Two 8-GPU nodes.
fn request(instance: &str, region: &str, option: PurchaseOption, hours: f64) -> QuoteRequest {
    QuoteRequest::new(instance, region, option, 8 * 2, 2, hours)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6 * b.abs().max(1.0)
}

#[test]
fn price_list_passes_the_host_rules_and_the_provenance_audit() {
    let offerings = Lambda::offerings();
    audit_price_list(&offerings).unwrap();
    // Every price is dated by a page read, the latest that shows it.
    let date = |name: &str| offerings.iter().find(|o| o.instance == name).unwrap().prices[0].effective_date.clone();
    assert_eq!(date("gpu_8x_h100_sxm5"), "2026-09-25");
    assert_eq!(date("gpu_8x_b200_sxm6"), "2026-09-20");
    assert!(offerings.iter().flat_map(|o| &o.prices).filter(|p| term_hours(p.option).is_none()).all(|p| (p.billing_increment_s, p.minimum_charge_s) == (60, 0)));
    assert!(offerings.iter().flat_map(|o| &o.prices).all(|p| p.source.contains("billing")));
    assert_eq!(Lambda::provider().name, "lambda");
}

#[test]
fn two_nodes_for_ten_hours() {
    let q = Lambda::quote(request("gpu_8x_h100_sxm5", "us-east-1", PurchaseOption::OnDemand, 10.0))
        .unwrap();
    assert!(close(q.lines[0].quantity, 20.0));
    assert!(close(q.total, 2.0 * 10.0 * 31.92), "{}", q.total);
}

#[test]
fn rounds_up_to_the_billing_increment() {
    let per_second = 2.0 * 31.92 / 3600.0; // USD per second for two nodes
    let secs = |s: f64| {
        Lambda::quote(request(
            "gpu_8x_h100_sxm5",
            "us-east-1",
            PurchaseOption::OnDemand,
            s / 3600.0,
        ))
    };
    assert!(close(secs(1.0).unwrap().total, 60.0 * per_second), "1 s bills a minute");
    assert!(close(secs(61.0).unwrap().total, 120.0 * per_second), "61 s bills two minutes");
}

#[test]
fn egress_is_free_and_storage_not_costed() {
    let mut r = request("gpu_8x_h100_sxm5", "us-east-1", PurchaseOption::OnDemand, 1.0);
    r.egress_gb = 100.0;
    r.storage_gb_months = 10.0;
    let q = Lambda::quote(r).unwrap();
    assert!(q.lines[1].estimate && q.lines[1].item.contains("not costed"), "{}", q.lines[1].item);
    assert!(!q.lines[2].estimate && q.lines[2].item.contains("no egress fees") && q.lines[2].amount == 0.0);
    assert!(close(q.total, 2.0 * 31.92 + 0.0));
}

#[test]
fn errors_name_what_exists() {
    let err = Lambda::quote(request("no-such-node", "us-east-1", PurchaseOption::OnDemand, 1.0))
        .unwrap_err();
    assert!(err.contains("no-such-node") && err.contains("gpu_8x_h100_sxm5"), "{err}");
    // One price for every region: any region quotes, and the line names it.
    let q =
        Lambda::quote(request("gpu_8x_h100_sxm5", "somewhere-9", PurchaseOption::OnDemand, 1.0))
            .unwrap();
    assert!(q.lines[0].item.contains("somewhere-9"), "{}", q.lines[0].item);
}
