//! Native tests of the Google Cloud price list (the host's rules and the provenance audit,
//! the dated us-central1 read, SUSPECT flags) and of quote arithmetic: node-hours,
//! per-second rounding after the 60 s minimum, estimates, and error messages.

use gcp::Gcp;
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
    let offerings = Gcp::offerings();
    audit_price_list(&offerings).unwrap();
    let prices = || offerings.iter().flat_map(|o| &o.prices);
    assert!(prices().all(|p| (p.billing_increment_s, p.minimum_charge_s) == (1, 60)));
    assert!(prices().all(|p| p.source.contains("billing") && p.source.contains("Local SSD")));
    assert!(prices().all(|p| term_hours(p.option).is_none()), "no CUD rate was found");
    assert_eq!(Gcp::provider().name, "gcp");
}

#[test]
fn the_cheap_tier_h100_price_is_replaced_by_a_dated_read() {
    let o = Gcp::offerings().into_iter().find(|o| o.instance == "a3-highgpu-8g").unwrap();
    let od = find_price(&o, "us-central1", PurchaseOption::OnDemand).unwrap();
    assert_eq!((od.usd_per_node_hour, od.effective_date.as_str()), (8.0 * 10.9791, "2026-09-26"));
    assert!(od.caveats.is_empty() && od.source.contains("tgarg01/silybench-data@045df3bf"));
    let spot = find_price(&o, "us-central1", PurchaseOption::Spot).unwrap();
    assert_eq!(spot.usd_per_node_hour, 8.0 * 6.571);
    let q = Gcp::quote(request("a3-highgpu-8g", "us-central1", PurchaseOption::OnDemand, 1.0)).unwrap();
    assert!(q.lines[0].item.contains("price dated 2026-09-26") && q.warnings.is_empty(), "{:?}", q);
}

#[test]
fn two_nodes_for_ten_hours() {
    let q =
        Gcp::quote(request("a3-highgpu-8g", "us-east4", PurchaseOption::OnDemand, 10.0)).unwrap();
    assert!(close(q.lines[0].quantity, 20.0));
    assert!(close(q.total, 2.0 * 10.0 * 87.83247), "{}", q.total);
    let spot =
        Gcp::quote(request("a3-highgpu-8g", "us-east4", PurchaseOption::Spot, 10.0)).unwrap();
    assert!(close(spot.total, 2.0 * 10.0 * 20.04446));
}

#[test]
fn rounds_up_to_the_billing_increment() {
    let per_second = 2.0 * 87.83247 / 3600.0; // USD per second for two nodes
    let secs = |s: f64| {
        Gcp::quote(request("a3-highgpu-8g", "us-east4", PurchaseOption::OnDemand, s / 3600.0))
    };
    assert!(close(secs(10.0).unwrap().total, 60.0 * per_second), "10 s bills the 60 s minimum");
    assert!(close(secs(90.5).unwrap().total, 91.0 * per_second), "90.5 s bills 91 s");
}

#[test]
fn storage_is_not_costed_and_egress_is_an_estimate() {
    let mut r = request("a3-highgpu-8g", "us-east4", PurchaseOption::OnDemand, 1.0);
    r.egress_gb = 100.0;
    r.storage_gb_months = 10.0;
    let q = Gcp::quote(r).unwrap();
    assert!(q.lines[1].estimate && q.lines[1].item.contains("not costed"), "storage: no price found");
    assert!(q.lines[2].estimate && q.lines[2].item.contains("Premium-tier"), "{}", q.lines[2].item);
    assert!(close(q.total, 2.0 * 87.83247 + 100.0 * 0.12 / GB_PER_GIB));
}

#[test]
fn errors_name_what_exists() {
    let err =
        Gcp::quote(request("no-such-node", "us-east4", PurchaseOption::OnDemand, 1.0)).unwrap_err();
    assert!(err.contains("no-such-node") && err.contains("a3-highgpu-8g"), "{err}");
    let err =
        Gcp::quote(request("a3-highgpu-8g", "mars-1", PurchaseOption::OnDemand, 1.0)).unwrap_err();
    assert!(err.contains("mars-1") && err.contains("us-central1 on-demand"), "{err}");
}

#[test]
fn suspect_rows_are_flagged_and_quoted_as_estimates() {
    let offerings = Gcp::offerings();
    for name in ["a4-highgpu-8g", "a2-ultragpu-8g"] {
        let o = offerings.iter().find(|o| o.instance == name).unwrap();
        let suspect: Vec<_> =
            o.prices.iter().filter(|p| p.caveats.contains(&PriceCaveat::Suspect)).collect();
        assert!(!suspect.is_empty(), "{name}: no price carries the suspect caveat");
        assert!(suspect.iter().all(|p| p.source.contains("SUSPECT")), "{name}");
    }
    let clean = offerings.iter().find(|o| o.instance == "a3-ultragpu-8g").unwrap();
    assert!(clean.prices.iter().all(|p| p.caveats.is_empty()));
    let q = Gcp::quote(request("a4-highgpu-8g", "us-central1", PurchaseOption::OnDemand, 1.0)).unwrap();
    assert!(q.lines[0].estimate && q.warnings.iter().any(|w| w.contains("suspect")), "{:?}", q);
}
