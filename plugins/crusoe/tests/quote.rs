//! Native tests of the Crusoe price list (every row sane) and of quote arithmetic: node-hours,
//! pro-rata billing, storage estimates, unknown egress, and error messages.

use crusoe::Crusoe;
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
    let offerings = Crusoe::offerings();
    audit_price_list(&offerings).unwrap();
    assert!(offerings.iter().flat_map(|o| &o.prices).all(|p| p.effective_date == "2026-09-20"));
    assert!(offerings.iter().flat_map(|o| &o.prices).filter(|p| term_hours(p.option).is_none()).all(|p| (p.billing_increment_s, p.minimum_charge_s) == (1, 0)));
    assert!(offerings.iter().flat_map(|o| &o.prices).all(|p| p.source.contains("billing")));
    assert_eq!(Crusoe::provider().name, "crusoe");
}

#[test]
fn two_nodes_for_ten_hours() {
    let q = Crusoe::quote(request(
        "H100 80GB HGX (8 x per-GPU rate)",
        "us-east1",
        PurchaseOption::OnDemand,
        10.0,
    ))
    .unwrap();
    assert!(close(q.lines[0].quantity, 20.0));
    assert!(close(q.total, 2.0 * 10.0 * 31.2), "{}", q.total);
}

#[test]
fn rounds_up_to_the_billing_increment() {
    let per_second = 2.0 * 31.2 / 3600.0; // USD per second for two nodes
    let secs = |s: f64| {
        Crusoe::quote(request(
            "H100 80GB HGX (8 x per-GPU rate)",
            "us-east1",
            PurchaseOption::OnDemand,
            s / 3600.0,
        ))
    };
    assert!(close(secs(0.5).unwrap().total, 1.0 * per_second), "0.5 s bills 1 s, no minimum");
    assert!(close(secs(90.5).unwrap().total, 91.0 * per_second), "90.5 s bills 91 s");
}

#[test]
fn storage_is_a_list_price() {
    let mut r =
        request("H100 80GB HGX (8 x per-GPU rate)", "us-east1", PurchaseOption::OnDemand, 1.0);
    r.storage_gb_months = 1000.0;
    let q = Crusoe::quote(r).unwrap();
    assert!(!q.lines[1].estimate && q.lines[1].item.contains("shared disks"), "{}", q.lines[1].item);
    assert!(close(q.total, 2.0 * 31.2 + 1000.0 * 0.07 / GB_PER_GIB));
}

#[test]
fn errors_name_what_exists() {
    let err = Crusoe::quote(request("no-such-node", "us-east1", PurchaseOption::OnDemand, 1.0))
        .unwrap_err();
    assert!(
        err.contains("no-such-node") && err.contains("H100 80GB HGX (8 x per-GPU rate)"),
        "{err}"
    );
    // One price for every region: any region quotes, and the line names it.
    let q = Crusoe::quote(request(
        "H100 80GB HGX (8 x per-GPU rate)",
        "somewhere-9",
        PurchaseOption::OnDemand,
        1.0,
    ))
    .unwrap();
    assert!(q.lines[0].item.contains("somewhere-9"), "{}", q.lines[0].item);
}

#[test]
fn egress_has_no_known_price() {
    let mut r = request("H200 141GB HGX (8 x per-GPU rate)", "", PurchaseOption::OnDemand, 1.0);
    r.egress_gb = 100.0;
    let q = Crusoe::quote(r).unwrap();
    assert!(q.lines[1].item.contains("not costed") && q.lines[1].estimate && close(q.total, 2.0 * 34.32));
}
