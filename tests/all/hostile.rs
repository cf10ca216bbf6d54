//! Plugins that misbehave inside otherwise valid calls (tests/programs/hostile-*,
//! nonsense-*, misbehave-cost): each class is refused or contained with a message naming
//! the plugin, the call and the field; nothing from a plugin reaches the terminal raw; a
//! plugin is checked on every call, and one that leaks memory or prints across calls keeps
//! working.

use std::time::{Duration, Instant};

use runner::plugin::cost::{CostModel, QuoteRequest};
use runner::plugin::precision::{
    GemmRole, GemmSite, PlanRequest, device_capabilities, healthy_step,
};
use runner::plugin::workload::GraphRequest;
use runner::plugin::{self, Failure, Limits, PluginError};
use runner::{explore, runfile};

use crate::util::{on_demand, program};

fn cost(file: &str, limits: Limits) -> CostModel {
    plugin::load(&program(file)).unwrap().cost(limits).unwrap()
}

fn request(instance: &str) -> QuoteRequest {
    on_demand(instance, "r")
}

/// The message names the plugin and the call, says `expect`, and is safe to print.
fn refused(err: &PluginError, call: &str, expect: &str) {
    let msg = err.to_string();
    assert_eq!(err.call, call, "{msg}");
    assert!(
        msg.contains(&err.plugin) && msg.contains(expect),
        "expected '{expect}' in: {msg}"
    );
    assert!(
        !msg.chars().any(|c| c.is_control() && c != '\n'),
        "raw control characters in: {msg:?}"
    );
}

#[test]
fn overflowing_astronomical_and_oversized_graphs_are_refused_before_allocation() {
    let mut w = plugin::load(&program("hostile_shapes.wasm"))
        .unwrap()
        .workload(Limits::default())
        .unwrap();
    w.describe().unwrap();
    for (variant, expect) in [
        ("overflow", "more than 2^50 elements"),
        ("huge-tensor", "more than 2^50 elements"),
        ("huge-total", "more than 2^56 elements together"),
        ("rank", "1000 axes (at most 8)"),
        ("many-inputs", "100000 inputs (at most 16)"),
        ("many-tensors", "1100007 tensors (at most 1048576)"),
        ("long-name", "4194304 bytes long"),
        ("escape-name", "\\u{1b}[2J"),
    ] {
        let start = Instant::now();
        let err = w
            .graph(&GraphRequest::training(variant, 4, 1, 0))
            .unwrap_err();
        assert!(
            matches!(err.failure, Failure::Invalid(_)),
            "{variant}: {err}"
        );
        refused(&err, "graph", expect);
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{variant} took {:?}",
            start.elapsed()
        );
    }
}

#[test]
fn a_graph_too_big_to_run_is_not_measured_but_the_run_goes_on() {
    let text = format!(
        "[model]\nplugin = {:?}\nvariant = \"budget\"\n[cluster]\ngpus = [8]\n[cost]\nplugins = [\"aws\"]\n",
        program("hostile_shapes.wasm")
    );
    let outcome = explore::run(&runfile::parse(&text, "budget").unwrap(), &|_, _, _| {})
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(outcome.measurement.is_none());
    assert!(
        outcome
            .notes
            .iter()
            .any(|n| n.starts_with("not measured") && n.contains("more than the 8 GiB")),
        "{:#?}",
        outcome.notes
    );
}

#[test]
fn terminal_escapes_forged_lines_and_megabytes_never_reach_the_terminal_raw() {
    let mut c = cost("hostile_strings.wasm", Limits::default());
    c.provider().unwrap();
    let err = c.provider().unwrap_err();
    refused(&err, "provider", "control character U+001B");
    c.offerings().unwrap();
    let err = c.offerings().unwrap_err();
    refused(&err, "offerings", "instance 'x\\nGPUs");
    let err = c.quote(&request("escape")).unwrap_err();
    refused(
        &err,
        "quote",
        "\\u{1b}[31mred alert\\u{1b}[0m\\nnote: forged line",
    );
    let err = c.quote(&request("megabytes")).unwrap_err();
    refused(&err, "quote", "more bytes]");
    assert!(
        err.to_string().len() < 8 << 10,
        "{} bytes",
        err.to_string().len()
    );
    // 5,000 escaped log lines: cut to the per-call budget, escaped, and the call succeeds.
    assert!(c.quote(&request("log")).is_ok());
    let err = c.quote(&request("stderr")).unwrap_err();
    refused(&err, "quote", "cleared your screen");
    assert!(err.to_string().contains("\\u{1b}[2J"), "{err}");
}

#[test]
fn non_finite_zero_negative_and_below_list_money_is_refused() {
    let mut c = cost("hostile_money.wasm", Limits::default());
    c.offerings().unwrap();
    for (instance, expect) in [
        ("nan", "not a price above zero"),
        ("inf", "amounts are finite"),
        ("zero", "not a price above zero"),
        ("negative", "negative only on discount lines"),
        (
            "below-list",
            "below the list price of what was asked for (60.00 USD",
        ),
        ("lowercase", "not an ISO 4217 code"),
    ] {
        let err = c.quote(&request(instance)).unwrap_err();
        assert!(
            matches!(err.failure, Failure::Invalid(_)),
            "{instance}: {err}"
        );
        refused(&err, "quote", expect);
    }
    assert_eq!(c.quote(&request("euro")).unwrap().currency, "EUR");
    // The price list itself, checked again on every call.
    for expect in [
        "the price is zero",
        "must be finite, >= 0",
        "must be finite, >= 0",
    ] {
        refused(&c.offerings().unwrap_err(), "offerings", expect);
    }
}

/// A quote with no list price to check it against is never asked for: the plugin's 1e-300
/// USD for an instance it never lists, or half its list price in a region it does not list
/// (or before any list), would pass every other rule. Listed, the floor refuses it.
#[test]
fn a_quote_below_any_list_price_off_the_price_list_is_refused() {
    let mut c = cost("hostile_money.wasm", Limits::default());
    let unlisted = |err: PluginError, expect: &str| {
        assert!(matches!(err.failure, Failure::NotAsked(_)), "{err}");
        refused(&err, "quote", expect);
    };
    unlisted(c.quote(&request("hidden")).unwrap_err(), "list the offerings first");
    unlisted(c.quote(&request("below-list")).unwrap_err(), "list the offerings first");
    c.offerings().unwrap();
    unlisted(
        c.quote(&request("hidden")).unwrap_err(),
        "instance 'hidden' is not in the price list",
    );
    unlisted(
        c.quote(&on_demand("below-list", "elsewhere")).unwrap_err(),
        "no on-demand price for instance 'below-list' in region 'elsewhere'",
    );
    refused(
        &c.quote(&request("below-list")).unwrap_err(),
        "quote",
        "below the list price of what was asked for (60.00 USD",
    );
}

#[test]
fn a_cloud_whose_quotes_all_fail_is_reported_failed_not_as_not_selling() {
    let text = format!(
        "[model]\nplugin = \"llama3\"\nvariant = \"llama3-tiny\"\n[cluster]\ngpus = [8]\n[cost]\nplugins = [{:?}]\n[measure]\nrepeats = 1\n",
        program("hostile_money.wasm")
    );
    let outcome = explore::run(&runfile::parse(&text, "money").unwrap(), &|_, _, _| {})
        .unwrap_or_else(|e| panic!("{e:#}"));
    let price = &outcome.series[0].rows[0].costs[0];
    assert!(
        matches!(price, runner::pricing::CloudPrice::QuoteFailed { reason } if reason.contains("hostile_money.wasm")),
        "{price:?}"
    );
    let table = runner::report::explore::text(&outcome);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("8 ") && l.ends_with("failed")),
        "{table}"
    );
    let skipped = outcome
        .notes
        .iter()
        .filter(|n| n.starts_with("skipped a quote"))
        .count();
    assert!((1..=20).contains(&skipped), "{skipped} notes");
}

/// A cloud that quotes a GPU only in another currency is not priced in a USD table, and
/// its cell says why: the reason read "no quote came back", the currency only in the notes.
#[test]
fn a_cloud_that_quotes_only_in_euros_says_so_in_its_cell() {
    let text = format!(
        "[model]\nplugin = \"llama3\"\nvariant = \"llama3-tiny\"\n[cluster]\ngpu = \"B200\"\ngpus = [8]\n\
         [precision]\nformat = \"bf16\"\n[cost]\nplugins = [{:?}]\n[measure]\nrepeats = 1\n",
        program("hostile_money.wasm")
    );
    let outcome = explore::run(&runfile::parse(&text, "euro").unwrap(), &|_, _, _| {})
        .unwrap_or_else(|e| panic!("{e:#}"));
    let price = &outcome.series[0].rows[0].costs[0];
    let runner::pricing::CloudPrice::QuoteFailed { reason } = price else { panic!("{price:?}") };
    assert_eq!(reason, "hostile-money: its quotes were in EUR, and the table compares USD (no exchange rate is applied)");
    let csv = runner::report::explore::csv(&outcome);
    assert!(csv.lines().any(|l| l.contains(",failed,") && l.contains("quotes were in EUR")), "{csv}");
}

#[test]
fn nonsense_layouts_and_hyperparameters_are_refused_on_every_call() {
    let mut w = plugin::load(&program("nonsense_workload.wasm"))
        .unwrap()
        .workload(Limits::default())
        .unwrap();
    for expect in [
        "tp x pp x cp = 3 x 1 x 1 = 3 does not divide 8 GPUs",
        "on a model without experts",
        "heads (32) must be a multiple of kv-heads (5)",
        "layers must be in 1..=10000, got 4000000000",
        "moe.top-k must be in 1..=8, got 9",
        "vp 2 needs pipeline stages",
        "defaults.tokens must be finite",
    ] {
        refused(&w.describe().unwrap_err(), "describe", expect);
    }
    assert!(w.describe().is_ok(), "the eighth answer is sound");
}

#[test]
fn nonsense_price_lists_are_refused_on_every_call() {
    let mut c = cost("nonsense_cost.wasm", Limits::default());
    for expect in [
        "a scale-up domain of 0 GPUs",
        "a scale-up domain of 7 GPUs does not fit nodes of 8",
        "billing-increment-s must be at least 1",
        "is priced twice",
        "an upfront payment on an option that has none",
        "'2026-13-45' is not an ISO date",
        "7000 offerings (at most 4096)",
    ] {
        refused(&c.offerings().unwrap_err(), "offerings", expect);
    }
    assert_eq!(c.offerings().unwrap().len(), 1);
}

/// A policy's name is printed (run reports, `plugins validate`): one that would set the
/// terminal's title, or fill the screen, is refused on the call that answers it.
#[test]
fn a_precision_policy_name_that_is_not_printable_text_is_refused() {
    let mut p = plugin::load(&program("nonsense_precision.wasm"))
        .unwrap()
        .precision(Limits::default())
        .unwrap();
    assert_eq!(p.name().unwrap(), "nonsense: a different wrong plan on every call");
    for expect in [
        "the policy name '\\u{1b}]0;pwned\\u{7}nonsense' contains the control character U+001B",
        "the policy name is 5000 bytes long (at most 4096)",
    ] {
        let err = p.name().unwrap_err();
        assert!(matches!(err.failure, Failure::Invalid(_)), "{err}");
        refused(&err, "name", expect);
    }
    assert!(p.name().is_ok());
}

#[test]
fn nonsense_precision_plans_and_actions_are_refused_on_every_call() {
    let mut p = plugin::load(&program("nonsense_precision.wasm"))
        .unwrap()
        .precision(Limits::default())
        .unwrap();
    let sites = vec![GemmSite {
        layer: 0,
        name: "layers.0.mlp.up".into(),
        role: GemmRole::Forward,
        m: 256,
        n: 256,
        k: 256,
    }];
    let request = PlanRequest {
        model: "m".into(),
        layers: 1,
        device: device_capabilities("H100"),
        sites,
        state: Vec::new(),
    };
    for expect in [
        "weight: int32 is not a GEMM operand format",
        "mxfp8 uses 1x32 blocks with e8m0 scales, got 1x128",
        "nvfp4 uses 1x16 (or 16x16 weight) blocks with e4m3 scales under an fp32 tensor scale",
        "both operands use 2-D blocks",
        "e8m0 scales are powers of two",
        "nvfp4 is neither native nor emulated on H100 (compute capability 90)",
        "1 sites were asked for but 0 plans came back",
        "activation: block 0x16: both sides are 0 (per tensor) or both in 1..=4096",
        "weight: block 4294967295x4294967295: both sides are 0",
        "gradient: delayed scaling needs an amax history of 1..=65536, got 0",
    ] {
        refused(&p.plan(&request).unwrap_err(), "plan", expect);
    }
    let plan = p.plan(&request).unwrap();
    let metrics = healthy_step(1, plan.sites, Vec::new());
    for expect in [
        "rollback of 0 steps",
        "re-promotion to bf16, which is not a low-precision format",
        "int32 is not a format to run GEMMs in",
        "100000 actions in one step (at most 1024)",
        "a fallback to fp8-e4m3, which needs a scaling recipe",
        "a fallback to nvfp4, which needs a scaling recipe",
    ] {
        refused(&p.on_step(&metrics).unwrap_err(), "on-step", expect);
    }
    assert!(p.on_step(&metrics).unwrap().actions.is_empty());
}

#[test]
fn a_plugin_that_misbehaves_only_later_is_caught_on_that_call() {
    let mut c = cost("misbehave_cost.wasm", Limits::default());
    c.offerings().unwrap();
    let later = QuoteRequest {
        region: "test-1".into(),
        ..request("later")
    };
    for _ in 0..3 {
        assert!(c.quote(&later).is_ok());
    }
    refused(
        &c.quote(&later).unwrap_err(),
        "quote",
        "not a price above zero",
    );
}

#[test]
fn a_plugin_that_leaks_across_calls_is_recycled_before_it_hits_the_cap() {
    // 8 MiB leaked per call under a 64 MiB cap: without recycling the eighth call fails.
    let mut c = cost(
        "misbehave_cost.wasm",
        Limits {
            memory_mib: 64,
            ..Limits::default()
        },
    );
    c.offerings().unwrap();
    let leak = QuoteRequest {
        region: "test-1".into(),
        ..request("leak")
    };
    for call in 0..40 {
        c.quote(&leak)
            .unwrap_or_else(|e| panic!("call {call}: {e}"));
    }
}

#[test]
fn a_plugin_that_prints_on_every_call_keeps_working() {
    // 230 bytes printed per call fill the 64 KiB the host captures after ~285 calls; a
    // print past it fails and Rust's println! panics, unless the instance is recycled.
    let mut c = cost("misbehave_cost.wasm", Limits::default());
    c.offerings().unwrap();
    let chatty = QuoteRequest {
        region: "test-1".into(),
        ..request("chatty")
    };
    for call in 0..600 {
        c.quote(&chatty)
            .unwrap_or_else(|e| panic!("call {call}: {e}"));
    }
}

/// A plugin file that carries an embedded plugin's name and shadows it is named with its
/// path in its errors, from the host's checks (a refused quote) and from the sandbox (a
/// trap) alike, so that its failure does not read as the first-party plugin's; the same
/// file under its own name is named as before. Kills: `PluginError::of` dropped in
/// cost.rs or in the sandbox; `shadowing()` giving nothing.
#[test]
fn a_shadowing_plugins_errors_name_its_path() {
    let path = program("misbehave_cost.wasm");
    let bytes = std::fs::read(&path).unwrap();
    assert!(plugin::embedded().iter().any(|(n, _, _)| *n == "aws.wasm"), "aws.wasm is embedded");
    let fake = std::path::PathBuf::from("/somewhere/plugins/aws.wasm");
    let shadow = plugin::load_bytes("aws.wasm", plugin::Source::Path(fake), &bytes).unwrap();
    assert!(shadow.info.shadows_embedded);
    let mut c = shadow.cost(Limits::default()).unwrap();
    c.offerings().unwrap();
    let said = "plugin 'aws.wasm' (from /somewhere/plugins/aws.wasm, shadowing the embedded plugin of that name) ";
    let refuse = QuoteRequest { region: "test-1".into(), ..request("refuse") };
    let trap = QuoteRequest { region: "test-1".into(), ..request("trap") };
    for r in [&refuse, &trap] {
        let text = c.quote(r).unwrap_err().to_string();
        assert!(text.starts_with(said), "{text}");
    }
    let own = plugin::load_bytes("misbehave_cost.wasm", plugin::Source::Path(path.into()), &bytes).unwrap();
    let mut c = own.cost(Limits::default()).unwrap();
    c.offerings().unwrap();
    let text = c.quote(&trap).unwrap_err().to_string();
    assert!(text.starts_with("plugin 'misbehave_cost.wasm' trapped in `quote`"), "{text}");
}
