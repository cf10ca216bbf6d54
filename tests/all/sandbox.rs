//! A plugin that traps, loops, exhausts memory or returns nonsense is stopped and named;
//! the host never panics or hangs, and the plugin's next call gets a fresh instance.

use std::time::{Duration, Instant};

use runner::plugin::cost::{PurchaseOption, QuoteRequest};
use runner::plugin::workload::GraphRequest;
use runner::plugin::{self, Failure, Limits};

use crate::util::{on_demand, program};

fn request(instance: &str) -> QuoteRequest {
    on_demand(instance, "test-1")
}

/// The misbehaving cloud, its price list asked for (the host quotes only what it lists).
fn misbehaving(limits: Limits) -> runner::plugin::cost::CostModel {
    let mut cost = plugin::load(&program("misbehave_cost.wasm"))
        .unwrap()
        .cost(limits)
        .unwrap();
    cost.offerings().unwrap();
    cost
}

#[test]
fn trap_is_reported_with_the_panic_message_and_the_instance_recovers() {
    let mut cost = misbehaving(Limits::default());
    let err = cost.quote(&request("trap")).unwrap_err();
    assert_eq!(err.call, "quote");
    assert_eq!(err.plugin, "misbehave_cost.wasm");
    let Failure::Trap { stderr, .. } = &err.failure else {
        panic!("expected a trap, got {err}")
    };
    assert!(stderr.contains("guest panicked on purpose"), "{err}");
    assert!(err.to_string().contains("trapped in `quote`"), "{err}");
    // A fresh instance serves the next call.
    let q = cost.quote(&request("good")).unwrap();
    assert_eq!(q.total, 2.0 * 3.0 * 10.0);
}

#[test]
fn infinite_loop_is_stopped_at_the_deadline() {
    let mut cost = misbehaving(Limits {
        call_timeout_ms: 200,
        ..Limits::default()
    });
    let start = Instant::now();
    let err = cost.quote(&request("spin")).unwrap_err();
    assert_eq!(err.failure, Failure::Timeout { limit_ms: 200 }, "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    assert!(
        err.to_string().contains("call_timeout_ms"),
        "the message names the knob: {err}"
    );
    assert!(cost.quote(&request("good")).is_ok());
}

#[test]
fn runaway_allocation_hits_the_memory_cap() {
    let mut cost = misbehaving(Limits {
        memory_mib: 64,
        ..Limits::default()
    });
    let err = cost.quote(&request("hog")).unwrap_err();
    assert_eq!(err.failure, Failure::OutOfMemory { limit_mib: 64 }, "{err}");
    assert!(err.to_string().contains("memory_mib"), "{err}");
    assert!(cost.quote(&request("good")).is_ok());
}

#[test]
fn nonsense_values_are_rejected_by_name() {
    let mut cost = misbehaving(Limits::default());
    let err = cost.quote(&request("nan")).unwrap_err();
    assert!(matches!(err.failure, Failure::Invalid(_)), "{err}");
    assert!(err.to_string().contains("total"), "{err}");
    let err = cost.quote(&request("wrong-total")).unwrap_err();
    assert!(
        err.to_string().contains("not the sum of the lines"),
        "{err}"
    );
}

#[test]
fn plugin_errors_are_passed_on_as_refusals() {
    let mut cost = misbehaving(Limits::default());
    let err = cost.quote(&request("refuse")).unwrap_err();
    assert!(matches!(err.failure, Failure::Refused(_)), "{err}");
    assert!(err.to_string().contains("refused `quote`: sold out in test-1 until 2027-01-01"), "{err}");
    // 17 GPUs do not fit the 2 nodes of 8 asked for: the contract's rule, which the host
    // applies before it asks (the SDK's standard quote applies the same one).
    let err = cost.quote(&QuoteRequest { gpus: 17, ..request("good") }).unwrap_err();
    assert!(matches!(err.failure, Failure::NotAsked(_)), "{err}");
    assert!(err.to_string().contains("was not asked for `quote`: 2 nodes of 'good' for 17 GPUs: it has 8 GPUs per node"), "{err}");
    let err = cost.quote(&QuoteRequest { nodes: 0, gpus: 0, ..request("trap") }).unwrap_err();
    assert!(matches!(err.failure, Failure::NotAsked(_)), "0 nodes never reach the plugin (it would trap): {err}");
}

/// A quote the plugin did not list is refused by the host and never reaches the plugin:
/// `trap` would panic if it were called (before the price list, or in a region it does not
/// sell in), and the refusal says what to do.
#[test]
fn a_quote_of_an_unlisted_price_is_refused_without_calling_the_plugin() {
    let mut cost = plugin::load(&program("misbehave_cost.wasm"))
        .unwrap()
        .cost(Limits::default())
        .unwrap();
    let unlisted = |err: plugin::PluginError, expect: &str| {
        assert!(matches!(err.failure, Failure::NotAsked(_)), "{err}");
        let text = err.to_string();
        assert!(text.starts_with("plugin 'misbehave_cost.wasm' was not asked for `quote`: "), "{text}");
        assert!(text.contains(expect), "{expect:?} not in: {text}");
    };
    unlisted(
        cost.quote(&request("trap")).unwrap_err(),
        "instance 'trap' before any price list: list the offerings first",
    );
    cost.offerings().unwrap();
    unlisted(
        cost.quote(&request("no-such-instance")).unwrap_err(),
        "instance 'no-such-instance' is not in the price list (it lists 'good', 'trap', 'spin', 'hog', 'nan', 'wrong-total', 'leak', 'chatty', 'later', 'refuse', 'exotic', 'slow')",
    );
    unlisted(
        cost.quote(&on_demand("trap", "test-2")).unwrap_err(),
        "no on-demand price for instance 'trap' in region 'test-2' (it prices test-1 on-demand)",
    );
    let spot = QuoteRequest { option: PurchaseOption::Spot, ..request("trap") };
    unlisted(cost.quote(&spot).unwrap_err(), "no spot price for instance 'trap' in region 'test-1'");
    // Listed, it is called (and traps).
    assert!(matches!(cost.quote(&request("trap")).unwrap_err().failure, Failure::Trap { .. }));
}

#[test]
fn inconsistent_graphs_are_rejected_with_the_rule() {
    let mut w = plugin::load(&program("misbehave_workload.wasm"))
        .unwrap()
        .workload(Limits::default())
        .unwrap();
    let info = w.describe().unwrap();
    assert_eq!(info.variants.len(), 4);
    for (variant, expect) in [
        ("bad-shape", "lm_head"),
        ("unknown-tensor", "nowhere"),
        ("duplicate", "twice"),
        ("nan-attr", "not finite"),
    ] {
        let req = GraphRequest::training(variant, 4, 1, 0);
        let err = w.graph(&req).unwrap_err();
        assert!(
            matches!(err.failure, Failure::Invalid(_)),
            "{variant}: {err}"
        );
        assert!(err.to_string().contains(expect), "{variant}: {err}");
    }
}

#[test]
fn offering_rules_catch_bad_price_lists() {
    use runner::plugin::cost::{Offering, Price, validate_offerings};
    let price = |option, usd_per_node_hour| Price {
        region: "r".into(),
        option,
        usd_per_node_hour,
        upfront_usd_per_node: 0.0,
        billing_increment_s: 1,
        minimum_charge_s: 60,
        effective_date: String::new(),
        source: String::new(),
        caveats: Vec::new(),
    };
    let good = Offering {
        instance: "a".into(),
        gpu: "H100".into(),
        gpus_per_node: 8,
        scale_up_domain: 8,
        node_multiple: 1,
        interconnect_gbps: 0.0,
        prices: vec![
            price(PurchaseOption::OnDemand, 10.0),
            price(PurchaseOption::Spot, 4.0),
        ],
    };
    assert!(validate_offerings(std::slice::from_ref(&good)).is_ok());
    let err = validate_offerings(&[good.clone(), good.clone()]).unwrap_err();
    assert!(err.contains("listed twice"), "{err}");
    let mut pricey_spot = good.clone();
    pricey_spot.prices[1].usd_per_node_hour = 11.0;
    assert!(
        validate_offerings(&[pricey_spot])
            .unwrap_err()
            .contains("spot")
    );
    let mut nan = good.clone();
    nan.prices[0].usd_per_node_hour = f64::NAN;
    assert!(validate_offerings(&[nan]).unwrap_err().contains("finite"));
    let mut zero_gpus = good;
    zero_gpus.gpus_per_node = 0;
    assert!(
        validate_offerings(&[zero_gpus])
            .unwrap_err()
            .contains("gpus-per-node")
    );
}

#[test]
fn both_random_generators_are_seeded_so_two_runs_agree() {
    let draw = || {
        plugin::load(&program("draw_random.wasm"))
            .unwrap()
            .precision(Limits::default())
            .unwrap()
            .name()
            .unwrap()
    };
    let (first, second) = (draw(), draw());
    assert_eq!(first, second, "two fresh instances drew differently");
    let field = |name: &str| {
        first
            .split(' ')
            .skip_while(|w| *w != name)
            .nth(1)
            .unwrap_or_else(|| panic!("no {name} in {first}"))
            .to_string()
    };
    let (secure, insecure) = (field("secure"), field("insecure"));
    assert_eq!(secure.len(), 32, "{first}");
    assert!(secure != "0".repeat(32) && secure != insecure, "{first}");
}

/// A draw from WASI random is capped (1 MiB): a plugin that asks for more in one call
/// traps, named, instead of making the host allocate it (wasmtime's own cap is 64 MiB);
/// the next call gets a fresh instance and draws as before.
#[test]
fn a_random_draw_past_the_cap_traps_and_the_next_call_works() {
    use runner::plugin::precision::{PlanRequest, device_capabilities};
    let mut p = plugin::load(&program("draw_random.wasm")).unwrap().precision(Limits::default()).unwrap();
    let mut plan = |bytes: u64| {
        p.plan(&PlanRequest {
            model: format!("draw {bytes}"),
            layers: 1,
            device: device_capabilities("H100"),
            sites: Vec::new(),
            state: Vec::new(),
        })
    };
    assert!(plan(1 << 20).is_ok(), "a draw at the cap");
    let err = plan((1 << 20) + 1).unwrap_err();
    assert_eq!(err.call, "plan", "{err}");
    let Failure::Trap { message, .. } = &err.failure else { panic!("{err}") };
    assert!(message.contains("1048577") || message.contains("1048576"), "the draw or the cap is named: {message}");
    assert!(plan(16).is_ok(), "a fresh instance after the trap");
}

/// A component made by hand: a core module with one empty funcref table whose start
/// function is `start` (no params, a local i32), exporting the cost world's instance with
/// its three function names (of the wrong type, which is only seen after instantiation,
/// by the typed lookups).
fn component_with_start(start: &wasm_encoder::Function) -> Vec<u8> {
    use wasm_encoder::{
        CanonicalFunctionSection, CodeSection, Component, ComponentAliasSection, ComponentExportKind, ComponentExportSection,
        ComponentInstanceSection, ComponentTypeSection, ComponentValType, ExportKind, ExportSection, Function, FunctionSection,
        InstanceSection, Instruction, Module, ModuleArg, ModuleSection, RefType, StartSection, TableSection, TableType,
        TypeSection,
    };
    let mut module = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([], []);
    module.section(&types);
    let mut funcs = FunctionSection::new();
    funcs.function(0).function(0);
    module.section(&funcs);
    let mut tables = TableSection::new();
    tables.table(TableType { element_type: RefType::FUNCREF, table64: false, minimum: 0, maximum: None, shared: false });
    module.section(&tables);
    let mut exports = ExportSection::new();
    exports.export("nop", ExportKind::Func, 1);
    module.section(&exports);
    module.section(&StartSection { function_index: 0 });
    let mut code = CodeSection::new();
    let mut nop = Function::new([]);
    nop.instruction(&Instruction::End);
    code.function(start).function(&nop);
    module.section(&code);

    let mut c = Component::new();
    c.section(&ModuleSection(&module));
    let mut core = InstanceSection::new();
    core.instantiate(0, Vec::<(&str, ModuleArg)>::new());
    c.section(&core);
    let mut alias = ComponentAliasSection::new();
    alias.alias(wasm_encoder::Alias::CoreInstanceExport { instance: 0, kind: ExportKind::Func, name: "nop" });
    c.section(&alias);
    let mut ty = ComponentTypeSection::new();
    ty.function().params(Vec::<(&str, ComponentValType)>::new()).result(None);
    c.section(&ty);
    let mut canon = CanonicalFunctionSection::new();
    canon.lift(0, 0, []);
    c.section(&canon);
    let mut instance = ComponentInstanceSection::new();
    instance.export_items(["provider", "offerings", "quote"].map(|n| (n, ComponentExportKind::Func, 0)));
    c.section(&instance);
    let mut export = ComponentExportSection::new();
    export.export("runner:plugin/cost-model@0.3.0", ComponentExportKind::Instance, 0, None);
    c.section(&export);
    c.finish()
}

/// Instantiation runs guest code (a component's start functions), so it runs under the
/// call's deadline. Rust-built plugins run their constructors inside the first export
/// call, so only a component made by hand reaches it. A start function that loops
/// forever times out, named, within the test's bound, and again on the next call (a
/// fresh instance each time: nothing hangs); one that counts to 2^20 first (about a
/// millisecond) instantiates, and the call fails on the exports' types instead (with no
/// deadline set before instantiation, the store's own is already past: that start
/// function timed out at its first loop).
#[test]
fn instantiation_is_under_the_call_deadline() {
    use wasm_encoder::{BlockType, Function, Instruction, ValType};
    let load = |start: &Function| {
        let bytes = component_with_start(start);
        plugin::load_bytes("spin", plugin::Source::Path("spin.wasm".into()), &bytes).unwrap()
    };
    let mut forever = Function::new([]);
    forever.instruction(&Instruction::Loop(BlockType::Empty)).instruction(&Instruction::Br(0)).instruction(&Instruction::End).instruction(&Instruction::End);
    let mut cost = load(&forever).cost(Limits { call_timeout_ms: 300, ..Limits::default() }).unwrap();
    for _ in 0..2 {
        let t0 = Instant::now();
        let err = cost.provider().unwrap_err();
        assert!(matches!(err.failure, Failure::Timeout { limit_ms: 300 }), "{err}");
        assert_eq!(err.call, "provider", "{err}");
        assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    }

    let mut counts = Function::new([(1, ValType::I32)]);
    for i in [
        Instruction::Loop(BlockType::Empty),
        Instruction::LocalGet(0),
        Instruction::I32Const(1),
        Instruction::I32Add,
        Instruction::LocalTee(0),
        Instruction::I32Const(1 << 20),
        Instruction::I32Ne,
        Instruction::BrIf(0),
        Instruction::End,
        Instruction::End,
    ] {
        counts.instruction(&i);
    }
    let err = load(&counts).cost(Limits::default()).unwrap().provider().unwrap_err();
    assert!(!matches!(err.failure, Failure::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("type"), "the exports' types are wrong: {err}");
}

/// A table grows to at most 2^20 elements (the store's limiter): a start function growing
/// its table to 2^20 instantiates (the call then fails on the exports' types), one growing
/// it to 2^20 + 1 is refused (`table.grow` gives -1, and the function traps on it), so a
/// plugin cannot make the host allocate a table of 2^32 elements (32 GiB of references).
#[test]
fn a_table_grows_to_at_most_2_to_the_20_elements() {
    use wasm_encoder::{BlockType, Function, HeapType, Instruction};
    let grow_or_trap = |n: i32| {
        let mut f = Function::new([]);
        for i in [
            Instruction::RefNull(HeapType::FUNC),
            Instruction::I32Const(n),
            Instruction::TableGrow(0),
            Instruction::I32Const(-1),
            Instruction::I32Eq,
            Instruction::If(BlockType::Empty),
            Instruction::Unreachable,
            Instruction::End,
            Instruction::End,
        ] {
            f.instruction(&i);
        }
        let bytes = component_with_start(&f);
        let p = plugin::load_bytes("grow", plugin::Source::Path("grow.wasm".into()), &bytes).unwrap();
        p.cost(Limits::default()).unwrap().provider().unwrap_err()
    };
    let err = grow_or_trap(1 << 20).to_string();
    assert!(err.contains("type") && !err.contains("unreachable"), "2^20 elements: {err}");
    let err = grow_or_trap((1 << 20) + 1).to_string();
    assert!(err.contains("unreachable") && !err.contains("type"), "2^20 + 1 elements: {err}");
}
