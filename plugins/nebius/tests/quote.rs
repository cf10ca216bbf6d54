//! Native tests of the Nebius price list (every row sane) and of quote arithmetic: node-hours,
//! pro-rata billing, the two disagreeing sources, and error messages.

use nebius::Nebius;
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
    let offerings = Nebius::offerings();
    audit_price_list(&offerings).unwrap();
    assert!(offerings.iter().flat_map(|o| &o.prices).filter(|p| term_hours(p.option).is_none()).all(|p| (p.billing_increment_s, p.minimum_charge_s) == (1, 0)));
    assert!(offerings.iter().flat_map(|o| &o.prices).all(|p| p.source.contains("billing")));
    assert_eq!(Nebius::provider().name, "nebius");
}

#[test]
fn two_nodes_for_ten_hours() {
    let q = Nebius::quote(request(
        "gpu-h200-sxm_8gpu-128vcpu-1600gb",
        "eu-west1",
        PurchaseOption::OnDemand,
        10.0,
    ))
    .unwrap();
    assert!(close(q.lines[0].quantity, 20.0));
    assert!(close(q.total, 2.0 * 10.0 * 28.0), "{}", q.total);
    let spot = Nebius::quote(request(
        "gpu-h200-sxm_8gpu-128vcpu-1600gb",
        "us-central1",
        PurchaseOption::Spot,
        10.0,
    ))
    .unwrap();
    assert!(close(spot.total, 2.0 * 10.0 * 11.6));
}

#[test]
fn rounds_up_to_the_billing_increment() {
    let per_second = 2.0 * 28.0 / 3600.0; // USD per second for two nodes
    let secs = |s: f64| {
        Nebius::quote(request(
            "gpu-h200-sxm_8gpu-128vcpu-1600gb",
            "eu-west1",
            PurchaseOption::OnDemand,
            s / 3600.0,
        ))
    };
    assert!(close(secs(0.5).unwrap().total, 1.0 * per_second), "0.5 s bills 1 s, no minimum");
    assert!(close(secs(90.5).unwrap().total, 91.0 * per_second), "90.5 s bills 91 s");
}

#[test]
fn storage_and_free_egress_are_list_prices() {
    let mut r =
        request("gpu-h200-sxm_8gpu-128vcpu-1600gb", "eu-west1", PurchaseOption::OnDemand, 1.0);
    r.storage_gb_months = 1000.0;
    r.egress_gb = 100.0;
    let q = Nebius::quote(r).unwrap();
    assert!(!q.lines[1].estimate && q.lines[1].item.contains("Shared Filesystem"), "{}", q.lines[1].item);
    assert!(!q.lines[2].estimate && q.lines[2].amount == 0.0);
    assert!(close(q.total, 2.0 * 28.0 + 1000.0 * 0.08 / GB_PER_GIB));
}

#[test]
fn errors_name_what_exists() {
    let err = Nebius::quote(request("no-such-node", "eu-west1", PurchaseOption::OnDemand, 1.0))
        .unwrap_err();
    assert!(
        err.contains("no-such-node") && err.contains("gpu-h200-sxm_8gpu-128vcpu-1600gb"),
        "{err}"
    );
    let err = Nebius::quote(request(
        "gpu-b200-sxm_8gpu-160vcpu-1792gb",
        "eu-north1",
        PurchaseOption::OnDemand,
        1.0,
    ))
    .unwrap_err();
    assert!(err.contains("eu-north1") && err.contains("us-central1 on-demand"), "{err}");
}

#[test]
fn page_prices_are_the_ones_in_effect_since_october() {
    let offerings = Nebius::offerings();
    let page: Vec<_> = offerings.iter().filter(|o| o.instance.starts_with("HGX ")).collect();
    assert_eq!(page.len(), 4, "H100, H200, B200, B300");
    for (o, per_gpu) in page.iter().zip([4.50, 5.40, 8.50, 9.50]) {
        let od = find_price(o, "", PurchaseOption::OnDemand).unwrap();
        assert!(close(od.usd_per_node_hour, 8.0 * per_gpu), "{}: {}", o.instance, od.usd_per_node_hour);
        assert_eq!(od.effective_date, "2026-10-01", "{}", o.instance);
        assert!(od.caveats.is_empty(), "{}: the page's dated price is clean", o.instance);
        let spot = find_price(o, "", PurchaseOption::Spot).unwrap();
        assert_eq!(spot.caveats, vec![PriceCaveat::LowerBound], "{}: a 'from' price", o.instance);
    }
    // A run that started before October is warned that this list has no earlier price.
    let mut r = request("HGX H100 (8 x per-GPU rate)", "eu-north1", PurchaseOption::OnDemand, 1.0);
    r.start_date = "2026-09-15".into();
    let q = Nebius::quote(r).unwrap();
    assert!(q.warnings.iter().any(|w| w.contains("took effect on 2026-10-01")), "{:?}", q.warnings);
    // The page's spot floor is quoted as an estimate, with its warning.
    let q = Nebius::quote(request("HGX B300 (8 x per-GPU rate)", "", PurchaseOption::Spot, 1.0)).unwrap();
    assert!(close(q.total, 2.0 * 8.0 * 0.99) && q.lines[0].estimate);
    assert!(q.warnings.iter().any(|w| w.contains("lower bound")), "{:?}", q.warnings);
}

#[test]
fn catalog_on_demand_prices_below_the_page_are_suspect_but_their_spot_is_not() {
    let offerings = Nebius::offerings();
    let catalog: Vec<_> = offerings.iter().filter(|o| o.instance.starts_with("gpu-")).collect();
    assert_eq!(catalog.len(), 3);
    for o in catalog {
        for p in &o.prices {
            let suspect = p.caveats == vec![PriceCaveat::Suspect];
            assert_eq!(suspect, p.option == PurchaseOption::OnDemand, "{} {}", o.instance, p.region);
        }
    }
}
