//! Native tests of the Nebius price list (every row sane) and of quote arithmetic: node-hours,
//! pro-rata billing, the two disagreeing sources, and error messages.

use nebius::Nebius;
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
    let offerings = Nebius::offerings();
    validate_offerings(&offerings).unwrap();
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
fn storage_is_an_estimate() {
    let mut r =
        request("gpu-h200-sxm_8gpu-128vcpu-1600gb", "eu-west1", PurchaseOption::OnDemand, 1.0);
    r.storage_gb_months = 1000.0;
    let q = Nebius::quote(r).unwrap();
    assert!(q.lines[1].estimate && !q.lines[1].item.contains("not costed"));
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
fn page_prices_are_flagged_as_possibly_superseded() {
    let offerings = Nebius::offerings();
    let page: Vec<_> = offerings.iter().filter(|o| o.instance.starts_with("HGX ")).collect();
    assert_eq!(page.len(), 3);
    for o in page {
        let p = &o.prices[0];
        assert!(p.source.contains("SUSPECT") && p.effective_date == "2026-10-07", "{}", p.source);
        assert_eq!(p.caveats, vec![PriceCaveat::Suspect]);
    }
}
