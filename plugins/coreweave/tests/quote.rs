//! Native tests of the CoreWeave price list (every row sane) and of quote arithmetic: node-hours,
//! per-minute rounding with no minimum, free egress, and error messages.

use coreweave::CoreWeave;
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
    let offerings = CoreWeave::offerings();
    audit_price_list(&offerings).unwrap();
    // Every price is dated by the page read.
    assert!(offerings.iter().flat_map(|o| &o.prices).all(|p| p.effective_date == "2026-09-20"));
    assert!(offerings.iter().flat_map(|o| &o.prices).filter(|p| term_hours(p.option).is_none()).all(|p| (p.billing_increment_s, p.minimum_charge_s) == (60, 0)));
    assert!(offerings.iter().flat_map(|o| &o.prices).all(|p| p.source.contains("billing")));
    assert_eq!(CoreWeave::provider().name, "coreweave");
}

#[test]
fn two_nodes_for_ten_hours() {
    let q = CoreWeave::quote(request(
        "HGX H100 (8 GPU)",
        "north-america",
        PurchaseOption::OnDemand,
        10.0,
    ))
    .unwrap();
    assert!(close(q.lines[0].quantity, 20.0));
    assert!(close(q.total, 2.0 * 10.0 * 49.24), "{}", q.total);
    let spot =
        CoreWeave::quote(request("HGX H100 (8 GPU)", "north-america", PurchaseOption::Spot, 10.0))
            .unwrap();
    assert!(close(spot.total, 2.0 * 10.0 * 19.71));
}

#[test]
fn rounds_up_to_the_billing_increment() {
    let per_second = 2.0 * 49.24 / 3600.0; // USD per second for two nodes
    let secs = |s: f64| {
        CoreWeave::quote(request(
            "HGX H100 (8 GPU)",
            "north-america",
            PurchaseOption::OnDemand,
            s / 3600.0,
        ))
    };
    assert!(close(secs(1.0).unwrap().total, 60.0 * per_second), "1 s bills a minute");
    assert!(close(secs(61.0).unwrap().total, 120.0 * per_second), "61 s bills two minutes");
}

#[test]
fn storage_and_free_egress_are_list_prices() {
    let mut r = request("HGX H100 (8 GPU)", "north-america", PurchaseOption::OnDemand, 1.0);
    r.storage_gb_months = 1000.0;
    r.egress_gb = 500.0;
    let q = CoreWeave::quote(r).unwrap();
    assert_eq!(q.lines.len(), 3);
    assert!(!q.lines[1].estimate && !q.lines[2].estimate && q.lines[2].amount == 0.0);
    assert!(q.lines[1].item.contains("Distributed File Storage") && q.lines[2].item.contains("free"));
    assert!(close(q.total, 2.0 * 49.24 + 1000.0 * 0.07));
}

#[test]
fn errors_name_what_exists() {
    let err =
        CoreWeave::quote(request("no-such-node", "north-america", PurchaseOption::OnDemand, 1.0))
            .unwrap_err();
    assert!(err.contains("no-such-node") && err.contains("HGX H100 (8 GPU)"), "{err}");
    let err =
        CoreWeave::quote(request("HGX H100 (8 GPU)", "europe", PurchaseOption::OnDemand, 1.0))
            .unwrap_err();
    assert!(err.contains("europe") && err.contains("north-america spot"), "{err}");
}

#[test]
fn gb200_is_a_four_gpu_tray_in_an_nvl72_domain_billed_per_tray() {
    let o = CoreWeave::offerings().into_iter().find(|o| o.gpu == "GB200").unwrap();
    assert_eq!((o.gpus_per_node, o.scale_up_domain, o.node_multiple), (4, 72, 1));
    assert_eq!(o.prices[0].effective_date, "2026-09-20");
    // 5 GPUs take 2 trays, and the quote bills both.
    let mut r = request(&o.instance, "north-america", PurchaseOption::OnDemand, 10.0);
    (r.gpus, r.nodes) = (5, nodes_for(&o, 5).unwrap());
    let q = CoreWeave::quote(r).unwrap();
    assert!(close(q.lines[0].quantity, 20.0) && close(q.total, 2.0 * 10.0 * 42.0), "{}", q.total);
}

#[test]
fn b300_is_sold_spot_only() {
    let o = CoreWeave::offerings().into_iter().find(|o| o.gpu == "B300").unwrap();
    assert!(o.prices.iter().all(|p| p.option == PurchaseOption::Spot));
    let q = CoreWeave::quote(request(&o.instance, "north-america", PurchaseOption::Spot, 1.0)).unwrap();
    assert!(close(q.total, 2.0 * 35.84), "{}", q.total);
    let err = CoreWeave::quote(request(&o.instance, "north-america", PurchaseOption::OnDemand, 1.0))
        .unwrap_err();
    assert!(err.contains("north-america spot"), "{err}");
}
