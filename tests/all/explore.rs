//! The explorer end to end: the published reference scenario, several GPU types and
//! precisions side by side, goals, a user's price file, caveated prices, spot, and a run
//! resumed from its journal.

use std::collections::HashMap;

use runner::explore::{self, Journal, Outcome};
use runner::plugin::PluginInfo;
use runner::pricing::CloudPrice;
use runner::runfile::{self, RunFile};
use serde_json::Value;

fn quiet(run: &RunFile) -> Outcome {
    explore::run(run, &|_, _, _| {}).unwrap_or_else(|e| panic!("{e:#}"))
}

fn parse(text: &str) -> RunFile {
    runfile::parse(text, "test").unwrap_or_else(|e| panic!("{e}"))
}

/// Llama 3.1 70B, FP8, H100, 1T tokens, TP4 PP4 CP2 VP5, GBS = 2 x GPUs: published 115.46
/// days on 64 GPUs and 3.79 on 2048 (DGX Cloud benchmarking recipes v25.02, NeMo 24.12;
/// the Performance Explorer rounds them to 115.4 and 3.8).
#[test]
fn the_reference_scenario_comes_out_within_ten_percent_and_its_cost_ratio_follows_the_days() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../workloads/llama3.1-70b-h100-fp8.toml");
    let mut run = runfile::load(&path).unwrap();
    run.cluster.gpus = vec![64, 2048];
    run.cost.plugins = vec!["aws".into()];
    run.measure.repeats = 1;
    let o = quiet(&run);
    assert_eq!(o.series.len(), 1);
    let rows = &o.series[0].rows;
    for (r, published) in rows.iter().zip([115.46, 3.79]) {
        let p = r.projection.as_ref().unwrap();
        assert_eq!((p.layout.tp, p.layout.pp, p.layout.cp, p.layout.vp), (4, 4, 2, 5));
        assert_eq!(r.global_batch, 2 * r.gpus, "GBS = 2 x GPUs");
        let days = r.days.unwrap();
        assert!((days / published - 1.0).abs() < 0.10, "{} GPUs: {days:.2} days against {published}", r.gpus);
    }
    // Money against the first row: AWS bills per second at one node price, so it follows
    // GPU-hours (storage for a shorter run costs less, egress is once): within 1 %.
    let gpu_hours = |r: &explore::Row| r.days.unwrap() * f64::from(r.gpus);
    let by_hours = gpu_hours(&rows[1]) / gpu_hours(&rows[0]);
    let money = rows[1].relative_cost.unwrap();
    assert!((money / by_hours - 1.0).abs() < 0.01, "money {money:.4} against GPU-hours {by_hours:.4}");
    assert!((0.95..1.10).contains(&money), "{money}");
    let q = rows[0].cheapest_cost().unwrap();
    assert!(q.lines.iter().any(|l| l.category == "storage") && q.lines.iter().any(|l| l.category == "egress"), "{q:?}");
}

/// Llama 3 8B is published on 8 GPUs only (16 sequences each). Growing that batch with
/// the GPUs would train 268M tokens per step on 2048 GPUs and keep each GPU's work per
/// step fixed, so the curve could not bend; the default batch stops at the job's
/// compute-optimal one (2048 sequences for 15T tokens), and past that point fewer
/// sequences per GPU leave the gradient traffic less to hide behind.
#[test]
fn the_default_batch_stops_at_the_jobs_optimal_batch_and_efficiency_falls_past_it() {
    let o = quiet(&parse(
        "[model]\nplugin = \"llama3\"\nvariant = \"llama3-8b\"\n[cluster]\ngpu = \"H100\"\ngpus = [64, 2048]\n\
         [precision]\nformat = \"bf16\"\n[cost]\nplugins = [\"aws\"]\n[measure]\nrepeats = 1\n",
    ));
    let rows = &o.series[0].rows;
    assert_eq!((rows[0].global_batch, rows[1].global_batch), (1024, 2048), "16 per GPU at 64, capped at 2048");
    assert!(o.notes.iter().any(|n| n.starts_with("GBS 2048 at 2048 GPUs") && n.contains("capped")), "{:#?}", o.notes);
    let per_gpu = |r: &explore::Row| r.projection.as_ref().unwrap().tokens_per_sec_per_gpu;
    let drop = 1.0 - per_gpu(&rows[1]) / per_gpu(&rows[0]);
    assert!(drop > 0.01, "tokens/s/GPU from 64 to 2048 GPUs falls by {:.2} %", drop * 100.0);
    // Within the published runs' GPU counts, no caveat on the straggler wait.
    assert!(!o.notes.iter().any(|n| n.contains("straggler")), "{:#?}", o.notes);
}

/// Past 2,048 GPUs, the largest published runs, the explorer says the wait for the slowest
/// rank is extrapolated, with its share of the largest row's step.
#[test]
fn counts_past_the_published_runs_say_the_straggler_wait_is_extrapolated() {
    let o = quiet(&parse(
        "[model]\nplugin = \"llama3\"\nvariant = \"llama3-8b\"\n[cluster]\ngpu = \"H100\"\ngpus = [1024, 4096]\n\
         [precision]\nformat = \"bf16\"\n[cost]\nplugins = [\"aws\"]\n[measure]\nrepeats = 1\n",
    ));
    let p = o.series[0].rows[1].projection.as_ref().unwrap();
    let share = format!("{:.1} % of the step at 4096 GPUs", 100.0 * p.breakdown.straggler / p.step_time_s);
    assert!(p.breakdown.straggler > 0.0);
    assert!(o.notes.iter().any(|n| n.starts_with("beyond 2048 GPUs") && n.contains(&share)), "{share}: {:#?}", o.notes);
}

/// Counts that round up to one whole-node count are one row, with a note: two equal rows
/// made a sweet spot "no faster" than itself. Rows walk up the counts in whatever order
/// they were asked (asked 128 first, the sweet-spot walk stopped at the smaller 60). The
/// same count written twice is refused (the run file's repeat rule), not merged.
#[test]
fn counts_rounding_to_one_node_count_are_one_row() {
    let o = quiet(&parse(
        "[model]\nplugin = \"llama3\"\nvariant = \"llama3-8b\"\n[cluster]\ngpu = \"H100\"\ngpus = [128, 60, 64]\n\
         [precision]\nformat = \"bf16\"\n[cost]\nplugins = [\"aws\"]\n[measure]\nrepeats = 1\n",
    ));
    let counts: Vec<(u32, u32)> = o.series[0].rows.iter().map(|r| (r.requested_gpus, r.gpus)).collect();
    assert_eq!(counts, [(60, 64), (128, 128)]);
    assert!(o.series[0].rows[1].sweet, "the walk reaches 128 GPUs");
    assert!(o.notes.iter().any(|n| n.starts_with("64 GPUs are already the row for 60 rounded up to whole nodes of 8")), "{:#?}", o.notes);
    let twice = "[model]\nplugin = \"llama3\"\nvariant = \"llama3-8b\"\n[cluster]\ngpu = \"H100\"\ngpus = [64, 64]\n";
    let e = runfile::parse(twice, "test").err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("twice"), "a repeated count: {e}");
}

#[test]
fn several_gpus_and_precisions_are_series_with_fp8_against_bf16() {
    let o = quiet(&parse(
        "[model]\nplugin = \"llama3\"\nvariant = \"llama3.1-8b\"\ntokens = 1e11\n[cluster]\ngpu = [\"H100\", \"B200\"]\ngpus = [8, 64]\n\
         [precision]\nformat = [\"bf16\", \"fp8\", \"nvfp4\"]\n[cost]\nplugins = [\"aws\"]\n[measure]\nrepeats = 1\n",
    ));
    let labels: Vec<String> = o.series.iter().map(|s| s.label()).collect();
    assert_eq!(labels, ["H100 bf16", "H100 fp8", "B200 bf16", "B200 fp8", "B200 nvfp4"]);
    assert!(o.notes.iter().any(|n| n.starts_with("not explored: H100 nvfp4")), "{:#?}", o.notes);
    // MFU's convention, and what NVIDIA's READMEs would read for the same run: their
    // 4.74e14 FLOPs per 8192-token sample against the causal count's 4.22e14.
    assert!(o.notes.iter().any(|n| n.contains("causal T/2") && n.contains("12.5 % higher at seq 8192")), "{:#?}", o.notes);
    // Each low-precision series against BF16 on its own GPU, count by count.
    assert_eq!(o.comparisons.len(), 6);
    for c in &o.comparisons {
        assert!(c.speedup > 1.0, "{c:?}");
        assert!(c.usd.unwrap() < c.usd_bf16.unwrap(), "{c:?}");
        let least = if c.precision == "fp8" { 0.9 } else { 0.5 };
        assert!(c.coverage > least && c.coverage <= 1.0, "{c:?}");
    }
    // B200 is faster than H100 at the same precision and count.
    let days = |label: &str| o.series.iter().find(|s| s.label() == label).unwrap().rows[1].days.unwrap();
    assert!(days("B200 fp8") < days("H100 fp8"));
    // Every priced series marks one sweet spot.
    for s in &o.series {
        assert_eq!(s.rows.iter().filter(|r| r.sweet).count(), 1, "{}", s.label());
    }
}

/// FP8 against BF16 compares one job: where the published rules differ by precision
/// (Llama 3.1 405B on GB200: 0.5 sequences per GPU for BF16, 6 for FP8), every precision
/// takes BF16's batch, and says so; alone, FP8 keeps its own rule.
#[test]
fn precisions_on_one_gpu_compare_at_one_global_batch() {
    let run = |formats: &str| {
        quiet(&parse(&format!(
            "[model]\nplugin = \"llama3\"\nvariant = \"llama3.1-405b\"\ntokens = 1e12\n[cluster]\ngpu = [\"GB200\"]\ngpus = [64]\n\
             [precision]\nformat = [{formats}]\n[cost]\nplugins = [\"aws\"]\n[measure]\nrepeats = 1\n"
        )))
    };
    let both = run("\"bf16\", \"fp8\"");
    let batches: Vec<u32> = both.series.iter().map(|s| s.rows[0].global_batch).collect();
    assert_eq!(batches, [32, 32]);
    assert!(both.notes.iter().any(|n| n.contains("GB200 fp8 at 64 GPUs trains with bf16's GBS 32") && n.contains("384")), "{:#?}", both.notes);
    let fp8 = run("\"fp8\"");
    assert_eq!(fp8.series[0].rows[0].global_batch, 384);
}

#[test]
fn goals_answer_with_the_cheapest_in_time_the_fastest_in_budget_or_the_nearest() {
    let base = "[model]\nplugin = \"llama3\"\nvariant = \"llama3.1-8b\"\ntokens = 1e11\n[cluster]\ngpus = [8, 16, 32, 64, 128]\n\
                [precision]\nformat = \"bf16\"\n[cost]\nplugins = [\"aws\", \"lambda\"]\n[measure]\nrepeats = 1\n";
    let o = quiet(&parse(base));
    let rows = &o.series[0].rows;
    let days: Vec<f64> = rows.iter().map(|r| r.days.unwrap()).collect();
    // A target between the 16- and 32-GPU runs: 32 or more GPUs meet it.
    let target = (days[1] + days[2]) / 2.0;
    let o = quiet(&parse(&format!("{base}[explore]\ntarget_days = {target}\n")));
    let g = o.goal.as_ref().unwrap();
    assert!(g.met, "{}", g.why);
    let best = g.best.as_ref().unwrap();
    assert!(best.gpus >= 32 && best.days <= target, "{best:?}");
    let cheapest_meeting = o.series[0]
        .rows
        .iter()
        .filter(|r| r.days.unwrap() <= target)
        .map(|r| r.cheapest_cost().unwrap().usd)
        .fold(f64::INFINITY, f64::min);
    assert_eq!(best.usd.unwrap(), cheapest_meeting);
    assert!(!g.runners_up.is_empty() && g.runners_up.iter().all(|c| c.usd.unwrap() >= best.usd.unwrap()));
    // A target nothing meets: the fastest run is the nearest feasible one.
    let o = quiet(&parse(&format!("{base}[explore]\ntarget_days = {}\n", days[4] / 10.0)));
    let g = o.goal.as_ref().unwrap();
    assert!(!g.met && g.best.as_ref().unwrap().gpus == 128, "{g:?}");
    assert!(g.why.contains("largest count asked was 128"), "{}", g.why);
    // A budget: the fastest run within it.
    let usd: Vec<f64> = o.series[0].rows.iter().map(|r| r.cheapest_cost().unwrap().usd).collect();
    let budget = usd.iter().copied().fold(f64::INFINITY, f64::min) * 1.0001;
    let o = quiet(&parse(&format!("{base}[explore]\nbudget_usd = {budget}\n")));
    let g = o.goal.as_ref().unwrap();
    assert!(g.met && g.best.as_ref().unwrap().usd.unwrap() <= budget, "{g:?}");
}

/// A scratch directory removed when the guard goes, also when the test fails.
fn scratch(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::Builder::new().prefix(&format!("runner-explore-{name}-")).tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    (tmp, dir)
}

#[test]
fn a_price_file_is_priced_as_a_cloud_and_caveated_rows_are_chosen_only_without_a_clean_one() {
    let (_dir, dir) = scratch("price-file");
    let file = dir.join("our-contract.csv");
    std::fs::write(
        &file,
        "InstanceType,AcceleratorName,AcceleratorCount,Region,Price,SpotPrice,EffectiveDate,Source,Caveats\n\
         broker-8xh100,H100,8,eu-1,8.00,,2026-11-20,resale listing,resale\n\
         dear-8xh100,H100,8,eu-1,20.00,,2026-11-15,contract 41,\n\
         ours-8xh100,H100,8,eu-1,16.00,6.00,2026-11-15,contract 42,\n",
    )
    .unwrap();
    let text = |extra: &str| {
        format!(
            "[model]\nplugin = \"llama3\"\nvariant = \"llama3-tiny\"\n[cluster]\ngpus = [8]\n[precision]\nformat = \"bf16\"\n\
             [cost]\nplugins = [\"aws\"]\nprice_file = {:?}\n{extra}[measure]\nrepeats = 1\n",
            file.display().to_string()
        )
    };
    let o = quiet(&parse(&text("")));
    let i = o.clouds.iter().position(|c| c == "our-contract").expect("the file is a cloud named after it");
    let q = o.series[0].rows[0].costs[i].quote().unwrap();
    assert_eq!((q.instance.as_str(), q.price_date.as_str()), ("ours-8xh100", "2026-11-15"), "the cheapest clean price, not the resale one");
    assert!(q.caveats.is_empty() && q.price_source.starts_with("contract 42"), "{q:?}");
    assert!(o.plugins.iter().any(|p| p.name == "price_file.wasm"));
    // Only the caveated row left: it is chosen, and says so.
    std::fs::write(&file, "InstanceType,AcceleratorName,AcceleratorCount,Region,Price,Caveats\nbroker,H100,8,eu-1,8.00,resale\n").unwrap();
    let o = quiet(&parse(&text("")));
    let i = o.clouds.iter().position(|c| c == "our-contract").unwrap();
    let q = o.series[0].rows[0].costs[i].quote().unwrap();
    assert_eq!(q.caveats, ["resale"]);
    assert!(runner::report::explore::text(&o).contains('!'), "the cell is marked");
    // Cheaper, but resale: every listing of the clouds puts the clean price first, JSON's
    // `clouds` (and the CSV's lines with it) as the table's columns (JSON put the resale first).
    assert_eq!(o.clouds, ["aws", "our-contract"]);
    let table = runner::report::explore::text(&o);
    let header = table.lines().find(|l| l.starts_with("GPUs ")).unwrap();
    // The clean one first, or alone where a second cloud would pass 100 columns.
    let aws = header.find("aws").unwrap_or_else(|| panic!("{header}"));
    assert!(header.find("our-contract").is_none_or(|c| aws < c), "{header}");
    let csv = runner::report::explore::csv(&o);
    let clouds: Vec<&str> = csv.lines().skip(1).filter(|l| !l.starts_with('#')).map(|l| l.split(',').nth(14).unwrap()).collect();
    assert_eq!(clouds, ["aws", "our-contract"], "{csv}");
    // A row whose GPU is no known type is said, not dropped in silence.
    std::fs::write(&file, "InstanceType,AcceleratorName,AcceleratorCount,Region,Price\nours,H100,8,eu-1,16.00\nx,ZZ9,8,eu-1,10\n").unwrap();
    let o = quiet(&parse(&text("")));
    assert!(o.notes.iter().any(|n| n.contains("x (ZZ9) match no GPU type and are never priced") && n.contains("H100")), "{:#?}", o.notes);
    // Spot: billed hours are the run's hours inflated by the interruption assumption.
    std::fs::write(&file, "InstanceType,AcceleratorName,AcceleratorCount,Region,Price,SpotPrice\nours,H100,8,eu-1,16.00,6.00\n").unwrap();
    let o = quiet(&parse(&text("option = \"spot\"\n")));
    let r = &o.series[0].rows[0];
    let i = o.clouds.iter().position(|c| c == "our-contract").unwrap();
    let q = r.costs[i].quote().unwrap();
    assert!(q.hours > r.days.unwrap() * 24.0 && q.hours < r.days.unwrap() * 24.0 * 1.01, "{} h for {} days", q.hours, r.days.unwrap());
    // ... and the checkpoints and data are stored for as long: storage grows with the hours.
    let storage = |q: &runner::pricing::CloudCost| q.lines.iter().find(|l| l.category == "storage").map(|l| l.quantity).unwrap();
    let on_demand = quiet(&parse(&text("")));
    let od = on_demand.series[0].rows[0].costs[on_demand.clouds.iter().position(|c| c == "our-contract").unwrap()].quote().unwrap().clone();
    let (ratio, stretch) = (storage(q) / storage(&od), q.hours / od.hours);
    assert!(stretch > 1.0 && (ratio - stretch).abs() < 1e-9, "storage x{ratio}, hours x{stretch}");
    // Storage holds two checkpoints of 14 bytes per parameter and the data set at 4 bytes
    // per token for the run's days (months of 365.25 / 12 days); egress is the BF16 weights.
    let m = &on_demand.model;
    let months = on_demand.series[0].rows[0].days.unwrap() / (365.25 / 12.0);
    let gb_months = (2.0 * 14.0 * m.params_total as f64 + 4.0 * m.tokens) / 1e9 * months;
    assert!((storage(&od) / gb_months - 1.0).abs() < 1e-9, "{} GB-months, not {gb_months}", storage(&od));
    let egress = od.lines.iter().find(|l| l.category == "egress").map(|l| l.quantity).unwrap();
    assert!((egress / (2.0 * m.params_total as f64 / 1e9) - 1.0).abs() < 1e-9, "{egress} GB");
    assert!(o.notes.iter().any(|n| n.contains("interrupted 0.033 times per node-day")), "the assumption is stated");
    // A bad row stops the run, naming the file and the line.
    std::fs::write(&file, "InstanceType,AcceleratorName,AcceleratorCount,Region,Price\nok,H100,8,eu-1,16\nbad,H100,8,eu-1,free\n").unwrap();
    let err = explore::run(&parse(&text("")), &|_, _, _| {}).unwrap_err().to_string();
    assert!(err.contains("our-contract.csv") && err.contains("line 3") && err.contains("'free'"), "{err}");
    // ... as the user's mistake, one line each, not as a plugin's trap and panic.
    std::fs::write(&file, "InstanceType,AcceleratorName,AcceleratorCount,Region,Price\nok,H100,8,eu-1,-16\nbad,H100,8,eu-1,free\n").unwrap();
    let err = explore::run(&parse(&text("")), &|_, _, _| {}).unwrap_err().to_string();
    assert!(err.contains("cannot be used:\n  line 2: Price '-16'") && err.contains("\n  line 3: Price 'free'"), "{err}");
    assert!(!err.contains("trapped") && !err.contains("panicked") && !err.contains("fix the plugin"), "{err}");
}

/// Billed hours are what the quote's compute lines bill, not the run's hours: a 1-year
/// term bills 8760 hours per node for a run of minutes, hourly billing a whole hour. The CSV's
/// `billed_hours` and the HTML's "h billed" showed the run's hours.
#[test]
fn billed_hours_are_the_hours_the_quote_bills() {
    let (_dir, dir) = scratch("billed");
    let file = dir.join("ours.csv");
    std::fs::write(
        &file,
        "InstanceType,AcceleratorName,AcceleratorCount,Region,Price,Reserved1yPrice,BillingIncrementS,Source\n\
         ours-8xh100,H100,8,eu-1,16.00,10.00,3600,contract 42\n",
    )
    .unwrap();
    let run = |option: &str| {
        quiet(&parse(&format!(
            "[model]\nplugin = \"llama3\"\nvariant = \"llama3-tiny\"\n[cluster]\ngpus = [8]\n[precision]\nformat = \"bf16\"\n\
             [cost]\nplugins = [\"aws\"]\nprice_file = {:?}\noption = {option:?}\n[measure]\nrepeats = 1\n",
            file.display().to_string()
        )))
    };
    for (option, usd_per_node_hour, billed) in [("reserved-1y", 10.0, 8760.0), ("on-demand", 16.0, 1.0)] {
        let o = run(option);
        let q = o.series[0].rows[0].costs[o.clouds.iter().position(|c| c == "ours").unwrap()].quote().unwrap();
        assert!(q.hours < 1.0, "a run of minutes: {} h", q.hours);
        assert_eq!(q.billed_hours, Some(billed), "{option}");
        let compute: f64 = q.lines.iter().filter(|l| l.category == "compute").map(|l| l.amount).sum();
        assert!((billed * usd_per_node_hour * f64::from(q.nodes) - compute).abs() < 1e-6, "{option}: {compute}");
        let csv = runner::report::explore::csv(&o);
        let mut lines = csv.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        let at = |name: &str| header.iter().position(|h| *h == name).unwrap();
        let row: Vec<&str> = lines.map(|l| l.split(',').collect::<Vec<_>>()).find(|r| r[at("cloud")] == "ours").unwrap();
        let cell = |name: &str| row[at(name)];
        assert_eq!((cell("billed_hours"), cell("run_hours")), (billed.to_string().as_str(), q.hours.to_string().as_str()), "{option}");
        let html = runner::report::explore::html(&o);
        assert!(html.contains(&format!("{billed:.1} h billed per node")), "{option}");
    }
}

/// A journal that keeps pieces in memory and can hand back doctored ones.
#[derive(Default)]
struct Memory {
    kept: HashMap<String, Value>,
    recalled: usize,
}

impl Journal for Memory {
    fn begin(&mut self, _: &Value, _: &[PluginInfo]) -> anyhow::Result<()> {
        Ok(())
    }
    fn recall(&mut self, key: &str) -> Option<Value> {
        let v = self.kept.get(key).cloned();
        self.recalled += usize::from(v.is_some());
        v
    }
    fn record(&mut self, key: &str, value: &Value) -> anyhow::Result<()> {
        self.kept.insert(key.into(), value.clone());
        Ok(())
    }
}

/// A kept row whose quote is of an offering on another node than the GPU's profile (as
/// a runner older than that rule kept it: the price file's 1-GPU H100 row) is computed
/// again, not shown beside this runner's quotes.
#[test]
fn a_kept_row_quoted_on_another_node_is_computed_again() {
    let (_dir, dir) = scratch("resume-node");
    let file = dir.join("ours.csv");
    std::fs::write(
        &file,
        "InstanceType,AcceleratorName,AcceleratorCount,Region,Price\nours-8xh100,H100,8,eu-1,16.00\nours-1xh100,H100,1,eu-1,1.00\n",
    )
    .unwrap();
    let run = parse(&format!(
        "[model]\nplugin = \"llama3\"\nvariant = \"llama3-tiny\"\n[cluster]\ngpus = [8]\n[precision]\nformat = \"bf16\"\n\
         [cost]\nplugins = [\"aws\"]\nprice_file = {:?}\n[measure]\nrepeats = 1\n",
        file.display().to_string()
    ));
    let mut j = Memory::default();
    let first = explore::run_with(&run, &|_, _, _| {}, &mut j).unwrap();
    let ours = first.clouds.iter().position(|c| c == "ours").unwrap();
    let quote = |o: &Outcome| o.series[0].rows[0].costs[ours].quote().map(|q| q.instance.clone());
    assert_eq!(quote(&first).as_deref(), Some("ours-8xh100"));
    let key = "row/H100/bf16/8";
    // The same row kept as it was: recalled as is (its days doctored, to see it is used).
    j.kept.get_mut(key).unwrap()["days"] = Value::from(12345.0);
    let again = explore::run_with(&run, &|_, _, _| {}, &mut j).unwrap();
    assert_eq!(again.series[0].rows[0].days, Some(12345.0));
    // Its quote moved to the 1-GPU row: computed again.
    // Kept in the order the clouds load, not the table's.
    let costs = j.kept.get_mut(key).unwrap()["costs"].as_array_mut().unwrap();
    let kept = costs.iter_mut().find(|c| c["cloud"] == "ours").unwrap();
    assert_eq!(kept["instance"], "ours-8xh100", "{kept}");
    kept["instance"] = Value::from("ours-1xh100");
    let again = explore::run_with(&run, &|_, _, _| {}, &mut j).unwrap();
    assert_eq!(again.series[0].rows[0].days, first.series[0].rows[0].days);
    assert_eq!(quote(&again).as_deref(), Some("ours-8xh100"));
}

#[test]
fn a_resumed_run_takes_the_rows_it_kept_and_computes_the_rest() {
    let run = parse(
        "[model]\nplugin = \"llama3\"\nvariant = \"llama3.1-8b\"\n[cluster]\ngpus = [8, 16, 32]\n[precision]\nformat = \"bf16\"\n\
         [cost]\nplugins = [\"aws\"]\n[measure]\nrepeats = 1\n",
    );
    let mut j = Memory::default();
    let first = explore::run_with(&run, &|_, _, _| {}, &mut j).unwrap();
    assert!(j.kept.contains_key("measurement"));
    assert_eq!(j.kept.keys().filter(|k| k.starts_with("row/")).count(), 3);
    // Keep the first two rows (one doctored, to see it is used), lose the third.
    let key = |n: u32| format!("row/H100/bf16/{n}");
    j.kept.remove(&key(32));
    j.kept.get_mut(&key(16)).unwrap()["days"] = Value::from(12345.0);
    let again = explore::run_with(&run, &|_, _, _| {}, &mut j).unwrap();
    assert_eq!(j.recalled, 3, "the measurement and two rows");
    let rows = &again.series[0].rows;
    assert_eq!(rows[1].days, Some(12345.0), "a kept row is not recomputed");
    assert_eq!(rows[2].days, first.series[0].rows[2].days, "a lost row is");
    assert!(matches!(rows[0].costs[0], CloudPrice::Quoted(_)));
}
