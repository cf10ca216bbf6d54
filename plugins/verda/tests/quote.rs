//! Native tests of the Verda price list (every row sane) and of quote arithmetic: node-hours,
//! pro-rata billing, spot-only rows, and error messages.

use runner_plugin_sdk::cost::*;
use verda::Verda;

/// Two 8-GPU nodes.
fn request(instance: &str, region: &str, option: PurchaseOption, hours: f64) -> QuoteRequest {
    QuoteRequest::new(instance, region, option, 8 * 2, 2, hours)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6 * b.abs().max(1.0)
}

#[test]
fn price_list_passes_the_host_rules_and_the_provenance_audit() {
    let offerings = Verda::offerings();
    audit_price_list(&offerings).unwrap();
    assert!(offerings.iter().flat_map(|o| &o.prices).filter(|p| term_hours(p.option).is_none()).all(|p| (p.billing_increment_s, p.minimum_charge_s) == (1, 0)));
    assert!(offerings.iter().flat_map(|o| &o.prices).all(|p| p.source.contains("billing")));
    assert_eq!(Verda::provider().name, "verda");
}

#[test]
fn two_nodes_for_ten_hours() {
    let q =
        Verda::quote(request("8H100.80S.176V", "FIN-02", PurchaseOption::OnDemand, 10.0)).unwrap();
    assert!(close(q.lines[0].quantity, 20.0));
    assert!(close(q.total, 2.0 * 10.0 * 15.77), "{}", q.total);
    let spot =
        Verda::quote(request("8H100.80S.176V", "ICE-01", PurchaseOption::Spot, 10.0)).unwrap();
    assert!(close(spot.total, 2.0 * 10.0 * 6.84));
}

#[test]
fn rounds_up_to_the_billing_increment() {
    let per_second = 2.0 * 15.77 / 3600.0; // USD per second for two nodes
    let secs = |s: f64| {
        Verda::quote(request("8H100.80S.176V", "FIN-02", PurchaseOption::OnDemand, s / 3600.0))
    };
    assert!(close(secs(0.5).unwrap().total, 1.0 * per_second), "0.5 s bills 1 s, no minimum");
    assert!(close(secs(90.5).unwrap().total, 91.0 * per_second), "90.5 s bills 91 s");
}

#[test]
fn egress_has_no_known_price() {
    let mut r = request("8H100.80S.176V", "FIN-02", PurchaseOption::OnDemand, 1.0);
    r.egress_gb = 100.0;
    let q = Verda::quote(r).unwrap();
    assert!(q.lines[1].estimate && q.lines[1].item.contains("not costed"), "{}", q.lines[1].item);
    assert!(close(q.total, 2.0 * 15.77));
}

#[test]
fn errors_name_what_exists() {
    let err =
        Verda::quote(request("no-such-node", "FIN-02", PurchaseOption::OnDemand, 1.0)).unwrap_err();
    assert!(err.contains("no-such-node") && err.contains("8H100.80S.176V"), "{err}");
    let err =
        Verda::quote(request("8B200.240V", "FIN-03", PurchaseOption::OnDemand, 1.0)).unwrap_err();
    assert!(err.contains("FIN-03") && err.contains("FIN-03 spot"), "{err}");
}

#[test]
fn marketplace_listings_carry_the_resale_caveat_and_verdas_own_row_does_not() {
    for o in Verda::offerings() {
        let resale = o.instance != "8B200.240V";
        for p in &o.prices {
            assert_eq!(p.caveats.contains(&PriceCaveat::Resale), resale, "{} {}", o.instance, p.region);
            assert_eq!(p.source.contains("Prime Intellect"), resale, "{}", p.source);
        }
    }
    let q = Verda::quote(request("8H200.141S.176V", "FIN-02", PurchaseOption::OnDemand, 1.0)).unwrap();
    assert_eq!(q.lines[0].caveats, vec![PriceCaveat::Resale]);
    assert!(!q.lines[0].estimate, "a resale listing is the marketplace's list price");
    assert!(q.warnings.iter().any(|w| w.contains("resale")), "{:?}", q.warnings);
}
