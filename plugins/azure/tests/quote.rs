//! Native tests of the Azure price list (every row sane) and of quote arithmetic: node-hours,
//! per-minute rounding, the missing spot price, and error messages.

use azure::Azure;
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
    let offerings = Azure::offerings();
    audit_price_list(&offerings).unwrap();
    assert!(offerings.iter().flat_map(|o| &o.prices).all(|p| term_hours(p.option).is_none()), "no term was found");
    assert!(offerings.iter().flat_map(|o| &o.prices).filter(|p| term_hours(p.option).is_none()).all(|p| (p.billing_increment_s, p.minimum_charge_s) == (60, 0)));
    assert!(offerings.iter().flat_map(|o| &o.prices).all(|p| p.source.contains("billing")));
    assert_eq!(Azure::provider().name, "azure");
}

#[test]
fn two_nodes_for_ten_hours() {
    let q =
        Azure::quote(request("Standard_ND96isr_H100_v5", "eastus", PurchaseOption::OnDemand, 10.0))
            .unwrap();
    assert!(close(q.lines[0].quantity, 20.0));
    assert!(close(q.total, 2.0 * 10.0 * 98.32), "{}", q.total);
    // The eastus H100 price is the one a 2026-11-09 read confirms; westus is undated.
    assert!(q.lines[0].item.contains("price dated 2026-11-09") && q.warnings.is_empty(), "{:?}", q);
    let q = Azure::quote(request("Standard_ND96isr_H100_v5", "westus", PurchaseOption::OnDemand, 1.0))
        .unwrap();
    assert!(q.lines[0].item.contains("undated price") && q.warnings[0].contains("undated"));
}

#[test]
fn rounds_up_to_the_billing_increment() {
    let per_second = 2.0 * 98.32 / 3600.0; // USD per second for two nodes
    let secs = |s: f64| {
        Azure::quote(request(
            "Standard_ND96isr_H100_v5",
            "eastus",
            PurchaseOption::OnDemand,
            s / 3600.0,
        ))
    };
    assert!(close(secs(1.0).unwrap().total, 60.0 * per_second), "1 s bills a minute");
    assert!(close(secs(61.0).unwrap().total, 120.0 * per_second), "61 s bills two minutes");
}

#[test]
fn storage_has_no_known_price_and_egress_is_an_estimate() {
    let mut r = request("Standard_ND96isr_H100_v5", "eastus", PurchaseOption::OnDemand, 1.0);
    r.storage_gb_months = 1000.0;
    r.egress_gb = 100.0;
    let q = Azure::quote(r).unwrap();
    assert!(q.lines[1].estimate && q.lines[1].item.contains("not costed"), "{}", q.lines[1].item);
    assert!(q.lines[2].estimate && q.lines[2].item.contains("first tier"), "{}", q.lines[2].item);
    assert!(close(q.total, 2.0 * 98.32 + 100.0 * 0.087));
}

#[test]
fn errors_name_what_exists() {
    let err =
        Azure::quote(request("no-such-node", "eastus", PurchaseOption::OnDemand, 1.0)).unwrap_err();
    assert!(err.contains("no-such-node") && err.contains("Standard_ND96isr_H100_v5"), "{err}");
    let err = Azure::quote(request(
        "Standard_ND96isr_H100_v5",
        "westeurope",
        PurchaseOption::OnDemand,
        1.0,
    ))
    .unwrap_err();
    assert!(err.contains("westeurope") && err.contains("westus on-demand"), "{err}");
}

#[test]
fn h100_has_eight_gpus_and_no_spot() {
    // The catalog says 12 GPUs and lists spot == on-demand; both are catalog errors.
    let o =
        Azure::offerings().into_iter().find(|o| o.instance == "Standard_ND96isr_H100_v5").unwrap();
    assert_eq!(o.gpus_per_node, 8);
    assert!(o.prices.iter().all(|p| p.option == PurchaseOption::OnDemand));
    let err = Azure::quote(request(&o.instance, "eastus", PurchaseOption::Spot, 1.0)).unwrap_err();
    assert!(err.contains("no spot price") && err.contains("eastus on-demand"), "{err}");
}
