//! Native tests of the Oci price list (every row sane) and of quote arithmetic: node-hours,
//! pro-rata billing, the one global price, and error messages.

use oci::Oci;
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
    let offerings = Oci::offerings();
    audit_price_list(&offerings).unwrap();
    assert!(offerings.iter().flat_map(|o| &o.prices).all(|p| p.option == PurchaseOption::OnDemand && p.region == ANY_REGION));
    assert!(offerings.iter().flat_map(|o| &o.prices).filter(|p| term_hours(p.option).is_none()).all(|p| (p.billing_increment_s, p.minimum_charge_s) == (1, 0)));
    assert!(offerings.iter().flat_map(|o| &o.prices).all(|p| p.source.contains("billing")));
    assert_eq!(Oci::provider().name, "oci");
}

#[test]
fn two_nodes_for_ten_hours() {
    let q = Oci::quote(request("BM.GPU.H100.8", "us-ashburn-1", PurchaseOption::OnDemand, 10.0))
        .unwrap();
    assert!(close(q.lines[0].quantity, 20.0));
    assert!(close(q.total, 2.0 * 10.0 * 80.0), "{}", q.total);
    assert!(q.lines[0].item.contains("undated price") && q.warnings.iter().any(|w| w.contains("undated")));
}

#[test]
fn rounds_up_to_the_billing_increment() {
    let per_second = 2.0 * 80.0 / 3600.0; // USD per second for two nodes
    let secs = |s: f64| {
        Oci::quote(request("BM.GPU.H100.8", "us-ashburn-1", PurchaseOption::OnDemand, s / 3600.0))
    };
    assert!(close(secs(0.5).unwrap().total, 1.0 * per_second), "0.5 s bills 1 s, no minimum");
    assert!(close(secs(90.5).unwrap().total, 91.0 * per_second), "90.5 s bills 91 s");
}

#[test]
fn egress_has_no_known_price() {
    let mut r = request("BM.GPU.H100.8", "us-ashburn-1", PurchaseOption::OnDemand, 1.0);
    r.egress_gb = 100.0;
    let q = Oci::quote(r).unwrap();
    assert!(q.lines[1].estimate && q.lines[1].item.contains("not costed"), "{}", q.lines[1].item);
    assert!(close(q.total, 2.0 * 80.0));
}

#[test]
fn errors_name_what_exists() {
    let err = Oci::quote(request("no-such-node", "us-ashburn-1", PurchaseOption::OnDemand, 1.0))
        .unwrap_err();
    assert!(err.contains("no-such-node") && err.contains("BM.GPU.H100.8"), "{err}");
    // One price for every region: any region quotes, and the line names it.
    let q =
        Oci::quote(request("BM.GPU.H100.8", "somewhere-9", PurchaseOption::OnDemand, 1.0)).unwrap();
    assert!(q.lines[0].item.contains("somewhere-9"), "{}", q.lines[0].item);
}

#[test]
fn grace_blackwell_shapes_are_four_gpu_trays_in_an_nvl72_domain() {
    for (shape, usd) in [("BM.GPU.GB200.4", 64.0), ("BM.GPU.GB300.4", 72.0)] {
        let o = Oci::offerings().into_iter().find(|o| o.instance == shape).unwrap();
        assert_eq!((o.gpus_per_node, o.scale_up_domain, o.node_multiple), (4, 72, 1), "{shape}");
        assert!(o.prices[0].source.contains("unknown"), "the missing billing facts are said: {}", o.prices[0].source);
        // 5 GPUs take 2 trays, and the quote bills both.
        let nodes = nodes_for(&o, 5).unwrap();
        assert_eq!(nodes, 2);
        let mut r = request(shape, "us-ashburn-1", PurchaseOption::OnDemand, 10.0);
        (r.gpus, r.nodes) = (5, nodes);
        let q = Oci::quote(r.clone()).unwrap();
        assert!(close(q.lines[0].quantity, 20.0) && close(q.total, 2.0 * 10.0 * usd), "{shape}: {}", q.total);
        r.nodes = 1;
        assert!(Oci::quote(r).unwrap_err().contains("ask for 2 nodes"), "one tray is too few for 5 GPUs");
    }
}
