//! `runner train`: flags into a [`runner::train::TrainConfig`], the run, and its output
//! (terminal tables, JSON, CSV of the summary, or the HTML report with the loss curves).

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use runner::report::OutputFormat;
use runner::train::{self, Injection, Progress, TrainConfig, defaults};

use crate::Global;
use crate::commands::{Steps, print_stdout, progress_line, write_output};

/// --checkpoint-every: a step count of at least one (0 read as every step before).
fn checkpoint_interval(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("0 steps: rollbacks return to a checkpoint, so one is kept every N >= 1 steps (a large N keeps few)".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{s:?} is not a step count ({e})")),
    }
}

/// Flags of `runner train`.
#[derive(Args, Debug, Clone)]
pub struct TrainArgs {
    /// Workload plugin (a path, or a name in the plugin directories or embedded)
    #[arg(long, default_value = defaults::MODEL)]
    pub plugin: String,
    /// Model variant (default: the plugin's -tiny variant)
    #[arg(long)]
    pub variant: Option<String>,
    /// Precision policy plugin (fp8-safe.wasm, fp8, bf16, a path)
    #[arg(long, conflicts_with = "compare")]
    pub precision: Option<String>,
    /// Several policies on the same text, seed and batches, comma-separated (bf16,fp8,fp8-safe)
    #[arg(long, value_delimiter = ',')]
    pub compare: Option<Vec<String>>,
    /// Optimizer steps
    #[arg(long, default_value_t = defaults::STEPS)]
    pub steps: u64,
    /// Seed of the weights and of the batch order
    #[arg(long, default_value_t = defaults::SEED)]
    pub seed: u64,
    /// Sequence length
    #[arg(long, default_value_t = defaults::SEQ_LEN)]
    pub seq_len: u32,
    /// Sequences per step
    #[arg(long, default_value_t = defaults::MICRO_BATCH)]
    pub micro_batch: u32,
    /// Transformer layers (default: the variant's)
    #[arg(long)]
    pub layers: Option<u32>,
    /// Peak learning rate, 1e-8 to 10 (default: the variant's)
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// AdamW's decoupled weight decay, 0 to 1 (default: the variant's); Muon's too
    #[arg(long, allow_negative_numbers = true)]
    pub weight_decay: Option<f64>,
    /// adamw, or muon (Muon on the hidden matrices, AdamW on embeddings, head, norms and biases; default: the plugin's when it is one of them, else adamw)
    #[arg(long, value_parser = ["adamw", "muon"], ignore_case = true)]
    pub optimizer: Option<String>,
    /// With Muon: exact (each matrix orthogonalised whole, the default) or blockwise
    /// (Megatron-Core's muon_tp_mode default: each tensor-parallel block alone). One
    /// device holds every matrix whole, so here both give the same update; refused
    /// unless the run trains with Muon
    #[arg(long, value_parser = ["exact", "blockwise"], ignore_case = true)]
    pub muon_tp_mode: Option<String>,
    /// Held-out loss every N steps (default: a tenth of the steps)
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Batches (each --micro-batch x --seq-len tokens) in each held-out loss
    #[arg(long, default_value_t = defaults::EVAL_BATCHES)]
    pub eval_batches: usize,
    /// Train on this UTF-8 text instead of the shipped King James Bible
    #[arg(long, value_name = "FILE")]
    pub text: Option<PathBuf>,
    /// Plan for this GPU's formats (H100, B200, ...) instead of the CPU's (which emulates every format)
    #[arg(long, default_value = defaults::PLAN_FOR, value_name = "GPU")]
    pub plan_for: String,
    /// Inject a fault: amax-spike@STEP, nan@STEP, grad-spike@STEP or bad-batch@STEP (optionally :SITE); repeatable or comma-separated
    #[arg(long, value_delimiter = ',')]
    pub inject: Vec<String>,
    /// Most of the low-precision layers that per-layer fallbacks may put in BF16 at once
    #[arg(long, allow_negative_numbers = true, default_value_t = defaults::MAX_BF16_SHARE)]
    pub max_bf16_share: f64,
    /// Checkpoint every N steps (rollbacks return to the newest known-good one)
    #[arg(long, default_value_t = defaults::CHECKPOINT_EVERY, value_parser = checkpoint_interval)]
    pub checkpoint_every: u64,
    /// Clip the gradient norm to this (0: off, so a gradient spike reaches the optimizer unless a policy stops it)
    #[arg(long, allow_negative_numbers = true, default_value_t = defaults::CLIP_GRAD)]
    pub clip_grad: f64,
}

/// The run the flags ask for: the policies checked (one each, none empty), the device
/// known, the faults parsed, and every flag in its own field.
fn config(a: TrainArgs, profiles: &runner_project::profile::Profiles) -> Result<TrainConfig> {
    let policies = match (&a.precision, &a.compare) {
        (Some(p), None) => vec![p.clone()],
        (None, Some(c)) if !c.is_empty() => c.clone(),
        _ => anyhow::bail!("name a policy with --precision POLICY or several with --compare bf16,fp8,fp8-safe"),
    };
    for (i, p) in policies.iter().enumerate() {
        if p.trim().is_empty() {
            let flag = if a.compare.is_some() { "--compare" } else { "--precision" };
            anyhow::bail!("{flag} '{}': an empty policy name; name policies separated by single commas (bf16,fp8,fp8-safe)", policies.join(","));
        }
        // bf16 and bf16.wasm name one plugin: it ran twice, in two identical rows.
        let stem = |s: &str| s.strip_suffix(".wasm").unwrap_or(s).to_string();
        if let Some(first) = policies[..i].iter().find(|q| stem(q) == stem(p)) {
            let spelled = if first == p { String::new() } else { format!(" (as {first} and {p})") };
            anyhow::bail!("--compare names {}{spelled} twice: each policy runs once on the same text, seed and batches; list it once", stem(p));
        }
    }
    // An unknown device would be planned with the high-precision formats alone, silently.
    let plan_for = runner::project::plan_for(&a.plan_for, profiles)?;
    let injections = a.inject.iter().map(|s| Injection::parse(s)).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::msg)?;
    // 0 is the config's "not given" (the variant's layers, a tenth of the steps): typed,
    // it would silently mean that, where --steps 0 and --eval-batches 0 are refused.
    if a.layers == Some(0) {
        anyhow::bail!("--layers 0: a model needs at least one transformer layer; leave --layers out for the variant's");
    }
    if a.eval_every == Some(0) {
        anyhow::bail!("--eval-every 0: the held-out loss is taken every N steps, N at least 1; leave it out for N = a tenth of the steps");
    }
    Ok(TrainConfig {
        variant: a.variant,
        steps: a.steps,
        seed: a.seed,
        seq_len: a.seq_len,
        micro_batch: a.micro_batch,
        layers: a.layers.unwrap_or(defaults::LAYERS),
        lr: a.lr,
        weight_decay: a.weight_decay,
        optimizer: a.optimizer,
        muon_tp_mode: a.muon_tp_mode,
        eval_every: a.eval_every.unwrap_or(defaults::EVAL_EVERY),
        eval_batches: a.eval_batches,
        text: a.text,
        plan_for,
        injections,
        max_bf16_share: a.max_bf16_share,
        checkpoint_every: a.checkpoint_every,
        clip_grad: a.clip_grad,
        ..TrainConfig::new(&a.plugin, policies)
    })
}

pub fn train(a: TrainArgs, global: &Global) -> Result<()> {
    let cfg = config(a, &runner::project::profiles(global.profile.as_deref())?)?;
    // Each policy's steps through a bar (on a log, the step and, while a long one runs,
    // its seconds so far at least every 15 s); the stages between as progress lines.
    let steps: std::cell::RefCell<Option<Steps>> = std::cell::RefCell::new(None);
    let report = train::run(&cfg, &|p| match p {
        Progress::Stage(m) => {
            steps.borrow_mut().take();
            progress_line(global, m);
        }
        Progress::Step { step, steps: of, last } => {
            let mut s = steps.borrow_mut();
            let bar = s.get_or_insert_with(|| {
                // The bar starts on a clean line, not after the stage's.
                progress_line(global, "");
                Steps::new(global, of as usize)
            });
            bar.at(step as usize, last);
        }
    });
    drop(steps.take());
    progress_line(global, "");
    let report = report?;
    let render = |f: OutputFormat| match f {
        OutputFormat::Table => train::report::text(&report),
        OutputFormat::Csv => train::report::csv(&report).csv(),
        OutputFormat::Html => train::report::html(&report),
        OutputFormat::Json => serde_json::to_string_pretty(&report).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}")) + "\n",
    };
    let format = crate::commands::stdout_format(global);
    // The -o file first, so a stdout that fails (`>/dev/full`) loses nothing and is an
    // error, not a panic of `print!`.
    write_output(global, &render)?;
    print_stdout(&render(format))?;
    match train::report::nothing_applied(&report) {
        Some(e) => anyhow::bail!(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `runner train`'s flags alone.
    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        a: TrainArgs,
    }

    fn cfg(args: &[&str]) -> Result<TrainConfig> {
        config(Cmd::try_parse_from([&["train"][..], args].concat())?.a, &runner_project::profile::Profiles::builtin())
    }

    fn refused(args: &[&str]) -> String {
        format!("{:#}", cfg(args).unwrap_err())
    }

    /// Each flag a value of its own: each lands in its own field (two numeric flags of one
    /// type swapped, or a flag dropped for the default, would pass the CLI tests, which
    /// only train briefly).
    #[test]
    fn each_flag_lands_in_its_own_field() {
        let c = cfg(&[
            "--plugin", "m.wasm", "--variant", "v-tiny", "--precision", "fp8", "--steps", "11", "--seed", "12", "--seq-len", "13",
            "--micro-batch", "14", "--layers", "15", "--lr", "0.016", "--weight-decay", "0.021", "--optimizer", "muon", "--muon-tp-mode", "blockwise", "--eval-every", "17", "--eval-batches", "18", "--text",
            "t.txt", "--plan-for", "H100", "--inject", "nan@3,grad-spike@4", "--max-bf16-share", "0.19", "--checkpoint-every",
            "20", "--clip-grad", "2.1",
        ])
        .unwrap();
        assert_eq!((c.model.as_str(), c.variant.as_deref(), &c.policies[..]), ("m.wasm", Some("v-tiny"), &["fp8".to_string()][..]));
        assert_eq!((c.steps, c.seed, c.seq_len, c.micro_batch, c.layers), (11, 12, 13, 14, 15));
        assert_eq!((c.lr, c.weight_decay, c.eval_every, c.eval_batches), (Some(0.016), Some(0.021), 17, 18));
        assert_eq!((c.optimizer.as_deref(), c.muon_tp_mode.as_deref()), (Some("muon"), Some("blockwise")));
        assert_eq!((c.text.as_deref(), c.plan_for.name.as_str()), (Some(std::path::Path::new("t.txt")), "H100"));
        assert_eq!(c.injections, [Injection::parse("nan@3").unwrap(), Injection::parse("grad-spike@4").unwrap()]);
        assert_eq!((c.max_bf16_share, c.checkpoint_every, c.clip_grad), (0.19, 20, 2.1));
    }

    /// Flags left out: the library's defaults (which the flags' defaults name).
    #[test]
    fn flags_left_out_are_the_librarys_defaults() {
        let c = cfg(&["--precision", "bf16"]).unwrap();
        let d = TrainConfig::new(defaults::MODEL, vec!["bf16".into()]);
        assert_eq!(format!("{c:?}"), format!("{d:?}"));
    }

    /// One policy, or several in their order; the refusals name the flag the user gave.
    #[test]
    fn policies_come_from_either_flag_and_odd_lists_are_refused_naming_it() {
        assert_eq!(cfg(&["--compare", "bf16,fp8,fp8-safe"]).unwrap().policies, ["bf16", "fp8", "fp8-safe"]);
        assert_eq!(cfg(&["--precision", "fp8"]).unwrap().policies, ["fp8"]);
        assert!(refused(&[]).contains("name a policy with --precision POLICY or several with --compare"));
        let e = refused(&["--precision", " "]);
        assert!(e.starts_with("--precision ' ': an empty policy name"), "{e}");
        let e = refused(&["--compare", "bf16,,fp8"]);
        assert!(e.starts_with("--compare 'bf16,,fp8': an empty policy name"), "{e}");
        let e = refused(&["--compare", "fp8,bf16,fp8"]);
        assert!(e.starts_with("--compare names fp8 twice"), "{e}");
        let e = refused(&["--compare", "bf16,fp8,bf16.wasm"]);
        assert!(e.starts_with("--compare names bf16 (as bf16 and bf16.wasm) twice"), "{e}");
        assert!(cfg(&["--precision", "bf16", "--compare", "fp8"]).is_err(), "the two flags conflict");
    }

    /// The device is checked (in any case), the faults parsed, before the run.
    #[test]
    fn an_unknown_device_or_fault_is_refused_before_the_run() {
        assert!(refused(&["--precision", "bf16", "--plan-for", "H1000"]).starts_with("--plan-for H1000: no such device"));
        // A GPU by its profile's name or alias, planned with its profile's formats; a device
        // without a profile from the host's table.
        let b200 = cfg(&["--precision", "bf16", "--plan-for", "dgx-b200"]).unwrap().plan_for;
        assert_eq!((b200.name.as_str(), b200.compute_capability), ("B200", 100));
        assert!(b200.native_formats.contains(&runner::plugin::precision::Dtype::Nvfp4), "{b200:?}");
        assert_eq!(cfg(&["--precision", "bf16", "--plan-for", "l40s"]).unwrap().plan_for.compute_capability, 89);
        assert_eq!(cfg(&["--precision", "bf16", "--plan-for", "cpu"]).unwrap().plan_for.native_formats, [runner::plugin::precision::Dtype::Fp32]);
        assert!(refused(&["--precision", "bf16", "--inject", "nan@1,melt@2"]).contains("--inject 'melt@2': unknown fault"));
    }

    /// `--optimizer` takes adamw or muon (in any case) and refuses anything else, naming them.
    #[test]
    fn the_optimizer_flag_takes_adamw_or_muon() {
        assert_eq!(cfg(&["--precision", "bf16", "--optimizer", "adamw"]).unwrap().optimizer.as_deref(), Some("adamw"));
        assert_eq!(cfg(&["--precision", "bf16", "--optimizer", "MUON"]).unwrap().optimizer.map(|o| o.to_ascii_lowercase()).as_deref(), Some("muon"));
        let e = refused(&["--precision", "bf16", "--optimizer", "sgd"]);
        assert!(e.contains("sgd") && e.contains("adamw") && e.contains("muon"), "{e}");
    }

    #[test]
    fn a_checkpoint_interval_is_a_step_count_of_at_least_one() {
        assert_eq!(checkpoint_interval("1"), Ok(1));
        assert!(checkpoint_interval("0").unwrap_err().starts_with("0 steps: rollbacks return to a checkpoint"));
        assert_eq!(checkpoint_interval("x").unwrap_err(), "\"x\" is not a step count (invalid digit found in string)");
    }
}
