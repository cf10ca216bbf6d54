//! Helpers: find a test program by name; a plain quote request.

/// Path of a test program (tests/programs/<name>) built by host/plugin/build.rs.
pub fn program(file: &str) -> String {
    runner::plugin::test_programs()
        .iter()
        .find(|(n, _)| *n == file)
        .map(|(_, p)| p.to_string())
        .unwrap_or_else(|| panic!("test program {file} was not built; see host/plugin/build.rs"))
}

/// An on-demand quote request for 2 nodes (16 GPUs) of `instance` in `region` for 3 hours.
pub fn on_demand(instance: &str, region: &str) -> runner::plugin::cost::QuoteRequest {
    runner::plugin::cost::QuoteRequest {
        instance: instance.into(),
        gpus: 16,
        nodes: 2,
        hours: 3.0,
        region: region.into(),
        option: runner::plugin::cost::PurchaseOption::OnDemand,
        start_date: String::new(),
        storage_gb_months: 0.0,
        egress_gb: 0.0,
    }
}
