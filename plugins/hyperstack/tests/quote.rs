//! Native tests of the Hyperstack price list (every row sane) and of quote arithmetic: node-hours,
//! pro-rata billing and error messages.

use hyperstack::Hyperstack;
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
    let offerings = Hyperstack::offerings();
    audit_price_list(&offerings).unwrap();
    assert!(offerings.iter().flat_map(|o| &o.prices).filter(|p| term_hours(p.option).is_none()).all(|p| (p.billing_increment_s, p.minimum_charge_s) == (1, 0)));
    assert!(offerings.iter().flat_map(|o| &o.prices).all(|p| p.source.contains("billing")));
    assert_eq!(Hyperstack::provider().name, "hyperstack");
}

#[test]
fn two_nodes_for_ten_hours() {
    let q = Hyperstack::quote(request("n3-H100-SXM5x8", "US-1", PurchaseOption::OnDemand, 10.0))
        .unwrap();
    assert!(close(q.lines[0].quantity, 20.0));
    assert!(close(q.total, 2.0 * 10.0 * 19.2), "{}", q.total);
    assert!(q.lines[0].item.contains("undated price") && q.warnings.iter().any(|w| w.contains("undated")));
}

#[test]
fn rounds_up_to_the_billing_increment() {
    let per_second = 2.0 * 19.2 / 3600.0; // USD per second for two nodes
    let secs = |s: f64| {
        Hyperstack::quote(request("n3-H100-SXM5x8", "US-1", PurchaseOption::OnDemand, s / 3600.0))
    };
    assert!(close(secs(0.5).unwrap().total, 1.0 * per_second), "0.5 s bills 1 s, no minimum");
    assert!(close(secs(90.5).unwrap().total, 91.0 * per_second), "90.5 s bills 91 s");
}

#[test]
fn storage_has_no_known_price() {
    let mut r = request("n3-H100-SXM5x8", "US-1", PurchaseOption::OnDemand, 1.0);
    r.storage_gb_months = 1000.0;
    let q = Hyperstack::quote(r).unwrap();
    assert!(q.lines[1].estimate && q.lines[1].item.contains("not costed"), "{}", q.lines[1].item);
    assert!(close(q.total, 2.0 * 19.2));
}

#[test]
fn errors_name_what_exists() {
    let err = Hyperstack::quote(request("no-such-node", "US-1", PurchaseOption::OnDemand, 1.0))
        .unwrap_err();
    assert!(err.contains("no-such-node") && err.contains("n3-H100-SXM5x8"), "{err}");
    let err = Hyperstack::quote(request("n3-H100-SXM5x8", "EU-1", PurchaseOption::OnDemand, 1.0))
        .unwrap_err();
    assert!(err.contains("EU-1") && err.contains("CANADA-1 on-demand"), "{err}");
}
