//! The `runner` command line: parse arguments, build a run (from a run file or flags),
//! dispatch to a command. No benchmark logic lives here.

/// `eprintln!` that never panics: a stderr that cannot be written (a closed pipe, as in
/// `runner ... 2>&1 | head`) loses the line, not the run; `eprintln!` panicked there.
macro_rules! elog {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod commands;
mod device_bench;
mod dist_bench;
mod train_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use runner::report::OutputFormat;

#[derive(Parser, Debug)]
#[command(
    name = "runner",
    version,
    about = "Workload runner for AI training benchmarks and total cost of ownership",
    long_about = "Measures a model's training step on the local device, projects it onto a GPU \
cluster, and prices the run on every installed cloud. Models, precision policies and \
price lists are sandboxed WASM plugins.",
    after_help = "Examples:\n  runner --plugin llama3.wasm\n  runner explore --model llama3.1-70b --gpu h100,b200 --precision bf16,fp8 --gpus 64,512,2048\n  runner explore --model llama3.1-70b --tokens 1e12 --target-days 30\n  runner explore --model llama3.1-70b --budget 2e6 --price-file workloads/our-contract.csv\n  runner history\n  runner show 3 --format html -o run3.html\n  runner compare 3 4\n  runner run workloads/llama3.1-70b-h100-fp8.toml --format json --output run.json\n  runner run workloads/llama3.1-70b-h100-fp8.toml -o report.html\n  runner plugins list\n  runner models\n  runner project --model llama3.1-70b --gpu h100 --gpus 64 --precision fp8\n  runner search --model gpt3-175b --gpus 1024\n  runner --device cuda measure --model llama3.1-8b --gpu h100 -o ops.json"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    quick: QuickRun,
    #[command(flatten)]
    global: Global,
}

/// Options every command shares.
#[derive(Args, Debug, Clone, Default)]
pub struct Global {
    /// Output format
    #[arg(long, value_enum, global = true)]
    pub format: Option<OutputFormat>,
    /// Write the result to FILE (format from --format, else from the extension, in any case: .json, .csv, .html or .htm, .txt or none for a table; another is refused; --format against the extension warns); the terminal shows the table. `-o -`, or a FILE that is stdout (/dev/stdout), prints the file's format alone on stdout
    #[arg(long, short = 'o', global = true, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// More logging (-v info, -vv debug, -vvv trace); RUST_LOG overrides
    #[arg(long, short = 'v', action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Only errors, no progress
    // With -v too, one of the two was dropped without a word (-q won).
    #[arg(long, short = 'q', global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// GPU profile file merged over the built-in profiles (peaks, links, efficiencies;
    /// `runner calibrate -o FILE.toml` writes one)
    #[arg(long, global = true, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Device of the local measurement and the device benches: auto (a usable GPU, else the CPU), cpu, cuda or cuda:N, or cuda-emulated (the CUDA backend with its kernels run on the CPU, for `bench kernels` and `train` without a GPU)
    #[arg(long, global = true, default_value = "auto", value_name = "DEVICE")]
    pub device: runner_exec::select::DeviceSpec,
    /// The history database that explore and run keep their runs in, and history, show and compare read
    /// (default: $RUNNER_HISTORY, else $XDG_DATA_HOME/runner/history.sqlite, else ~/.local/share/runner/history.sqlite; an empty $RUNNER_HISTORY and an empty or relative $XDG_DATA_HOME are ignored)
    #[arg(long, global = true, value_name = "FILE")]
    pub history: Option<PathBuf>,
    /// Do not keep this run in the history (explore and run; other commands keep none)
    #[arg(long, global = true)]
    pub no_history: bool,
}

/// A run given by flags instead of a run file (or over one).
#[derive(Args, Debug, Clone, Default)]
pub struct QuickRun {
    /// Workload plugin: a path, or a name in the plugin directories or embedded (e.g. llama3.wasm)
    #[arg(long)]
    pub plugin: Option<String>,
    /// Model variant, found among the installed workload plugins (`runner models` lists them)
    #[arg(long, conflicts_with = "plugin")]
    pub model: Option<String>,
    /// Model variant of --plugin (default: the plugin's first)
    // --model names the variant already: with --variant too, one silently replaced it.
    #[arg(long, conflicts_with = "model")]
    pub variant: Option<String>,
    /// GPU types, comma-separated: one series of rows each (h100, h200, b200, gb200, ...)
    #[arg(long, value_delimiter = ',')]
    pub gpu: Option<Vec<String>>,
    /// GPU counts, comma-separated (rounded up to whole nodes)
    #[arg(long, value_delimiter = ',', value_parser = gpu_count)]
    pub gpus: Option<Vec<u32>>,
    /// Precisions, comma-separated: bf16, fp8, fp8-cs, mxfp8, nvfp4 (default bf16,fp8); each uses the policy of its name (fp8.wasm); another precision plugin goes in a run file's [precision] plugin
    #[arg(long, value_delimiter = ',')]
    pub precision: Option<Vec<String>>,
    /// Global batch in sequences (default: the variant's published rule; outside its GPU range, scaled per GPU up to the job's compute-optimal batch)
    #[arg(long)]
    pub gbs: Option<u32>,
    #[command(flatten)]
    pub cloud: CloudArgs,
    /// Tokens to train, e.g. 15T, 300B or 1.5e12 (default: the variant's)
    #[arg(long, allow_negative_numbers = true, value_parser = runner::input::quantity)]
    pub tokens: Option<f64>,
    /// Sequence length (default: the variant's)
    #[arg(long)]
    pub seq_len: Option<u32>,
    /// Layout search: keep tensor parallel at N (with --pp, --cp, --vp, --ep, --mbs: reproduce a published layout)
    #[arg(long, value_name = "N", value_parser = commands::project::layout_way)]
    pub tp: Option<u32>,
    /// Layout search: keep pipeline parallel at N
    #[arg(long, value_name = "N", value_parser = commands::project::layout_way)]
    pub pp: Option<u32>,
    /// Layout search: keep context parallel at N
    #[arg(long, value_name = "N", value_parser = commands::project::layout_way)]
    pub cp: Option<u32>,
    /// Layout search: keep N virtual pipeline chunks per stage
    #[arg(long, value_name = "N", value_parser = commands::project::layout_way)]
    pub vp: Option<u32>,
    /// Layout search: keep expert parallel at N
    #[arg(long, value_name = "N", value_parser = commands::project::layout_way)]
    pub ep: Option<u32>,
    /// Layout search: keep expert tensor parallel at N (Megatron's
    /// expert_tensor_parallel_size; default: try 1 and tp)
    #[arg(long, value_name = "N", value_parser = commands::project::layout_way)]
    pub etp: Option<u32>,
    /// Layout search: keep the micro-batch at N sequences
    #[arg(long, value_name = "N", value_parser = commands::project::layout_way)]
    pub mbs: Option<u32>,
    /// Layout search: keep the pipeline split, `even` or E<n>L<m> (E1L1: the embedding
    /// and the loss count as a layer each, Megatron's account_for_*_in_pipeline_split);
    /// default: try both
    #[arg(long, value_name = "SPLIT", value_parser = runner_graph::pipeline::PipelineSplit::parse)]
    pub pipeline_split: Option<runner_graph::pipeline::PipelineSplit>,
    /// The optimizer: adamw (Megatron's distributed optimizer) or muon (Megatron's
    /// dist_muon, as Kimi-K2 trains); default: the one the workload plugin names, where
    /// the projection models it, else adamw
    #[arg(long, value_parser = runner_project::step::Optimizer::parse)]
    pub optimizer: Option<runner_project::step::Optimizer>,
    /// Layout search: the pipeline schedule, 1f1b (Megatron's), dualpipe (DeepSeek's:
    /// even pp, no virtual pipeline) or dualpipev (DualPipe cut in half: 2·pp stages, two
    /// a rank in a V, any pp ≥ 2, no virtual pipeline); default 1f1b
    #[arg(long, value_parser = runner_project::step::PipelineKind::parse)]
    pub pipeline_schedule: Option<runner_project::step::PipelineKind>,
    /// Goal: the cheapest GPU type, count, layout, precision and cloud that finishes within D days
    #[arg(long, allow_negative_numbers = true, value_name = "D")]
    pub target_days: Option<f64>,
    /// Goal: the fastest run that costs at most USD (e.g. 2e6, 2M, $500K)
    #[arg(long, allow_negative_numbers = true, value_name = "USD", conflicts_with = "target_days", value_parser = runner::input::quantity)]
    pub budget: Option<f64>,
    /// Sweet spot: the largest count whose extra cost per day saved stays under USD (default: 1 % of the cheapest run)
    #[arg(long, allow_negative_numbers = true, value_name = "USD")]
    pub max_usd_per_day_saved: Option<f64>,
    /// Timed CPU training steps of the local measurement (a note), after one warm-up: more
    /// gives a tighter measured step time and a longer run; the projections do not use it
    #[arg(long)]
    pub repeats: Option<usize>,
    /// Activation recompute of the locally measured step (a note): none, selective
    /// (attention cores) or full (each layer's forward re-run in the backward). The
    /// layouts projected keep choosing their own; `[layout] recompute` in a run file fixes it
    #[arg(long, value_parser = ["none", "selective", "full"])]
    pub recompute: Option<String>,
}

/// Where the prices come from, as explore, run and prices take it: the cost plugins, a price
/// file of the user's own, the purchase option and the region. Nothing here has a default
/// of its own: each command reads the flags over its own (explore and run over the run
/// file's `[cost]`, prices over on-demand in every region), so `--help` says each one's.
#[derive(Args, Debug, Clone, Default)]
pub struct CloudArgs {
    /// Cost plugins to price with, comma-separated or repeated (default: every installed cloud;
    /// the --price-file's own name, e.g. our-contract, lists it alone)
    #[arg(long = "cloud", value_delimiter = ',')]
    pub clouds: Vec<String>,
    /// Your own prices, beside the clouds': a CSV in SkyPilot's catalog shape (InstanceType,
    /// AcceleratorName, AcceleratorCount, Region, Price, SpotPrice; EffectiveDate, Source,
    /// ... optional)
    #[arg(long, value_name = "FILE")]
    pub price_file: Option<PathBuf>,
    /// Purchase option: on-demand (the default), spot, reserved-1y, reserved-3y, capacity-block, ...
    #[arg(long)]
    pub option: Option<String>,
    /// Only this region (default: each cloud's cheapest)
    #[arg(long)]
    pub region: Option<String>,
}

impl CloudArgs {
    /// The flags given, over `cost` (what the command reads when a flag is not given).
    ///
    /// # Errors
    /// A price file whose path is not UTF-8.
    pub fn apply(&self, cost: &mut runner::runfile::CostSection) -> anyhow::Result<()> {
        if !self.clouds.is_empty() {
            cost.plugins = self.clouds.clone();
        }
        if let Some(f) = &self.price_file {
            cost.price_file = Some(commands::explore::utf8_path("--price-file", f)?.to_string());
        }
        if let Some(o) = &self.option {
            cost.option = o.clone();
        }
        if let Some(r) = &self.region {
            cost.region = r.clone();
        }
        Ok(())
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Time and cost to train against GPU count, GPU type, precision and cloud (the default command)
    #[command(
        after_help = "Examples:\n  runner explore --model llama3.1-70b --tokens 1e12 --gpus 64,128,256,512,1024,2048 --precision fp8\n  runner explore --model llama3.1-70b --gpu h100,h200,b200 --precision bf16,fp8\n  runner explore --model llama3.1-405b --target-days 30\n  runner explore --model llama3.1-8b --budget 50000 --option spot\n  runner explore --model llama3.1-70b --price-file workloads/our-contract.csv -o report.html"
    )]
    Explore {
        #[command(flatten)]
        run: QuickRun,
    },
    /// Train a small model on real text under precision policies, with their fallback rules acting on the loss
    #[command(
        after_help = "Examples:\n  runner train --plugin llama3.wasm --variant llama3-tiny --precision fp8-safe.wasm --steps 300\n  runner train --compare bf16,fp8,fp8-safe --steps 300 --seed 1 -o train.html\n  runner train --compare fp8,fp8-safe --inject amax-spike@150 --steps 300\n  runner train --precision nvfp4 --plan-for H100   (refused: H100 has no NVFP4)\n  runner train --compare bf16,fp8 --optimizer muon --steps 300   (Muon on the hidden matrices, AdamW on the rest)\n  runner --device cuda train --compare bf16,fp8 --steps 30   (per-tensor FP8 linears on the GPU's FP8 GEMMs)\n\nOn the CPU every low-precision format is emulated (quantised, dequantised, f32 GEMMs); on a GPU (--device auto finds one) per-tensor FP8 linears run on cuBLASLt FP8 GEMMs and block-scaled formats stay emulated."
    )]
    Train(train_cmd::TrainArgs),
    /// Run a run file (workloads/*.toml)
    #[command(
        mut_arg("option", |a| a.help("Purchase option: on-demand, spot, reserved-1y, reserved-3y, capacity-block, ... (default: the run file's [cost] option, else on-demand)")),
        mut_arg("region", |a| a.help("Only this region (default: the run file's [cost] region, else each cloud's cheapest)")),
        after_help = "Examples:\n  runner run workloads/llama3.1-8b-h100-bf16.toml\n  runner run my.toml --format csv -o out.csv"
    )]
    Run {
        /// The run file
        file: PathBuf,
        /// Flags that override the file's keys
        #[command(flatten)]
        run: QuickRun,
    },
    /// List, inspect and validate plugins
    #[command(
        subcommand,
        after_help = "Examples:\n  runner plugins list\n  runner plugins inspect aws\n  runner plugins validate my.wasm"
    )]
    Plugins(PluginsCommand),
    /// List prices per GPU-hour on every installed cloud, cheapest first, each with its
    /// instance, region, billing, date and source
    #[command(
        after_help = "Examples:\n  runner prices\n  runner prices --gpu h100,h200\n  runner prices --gpu b200 --option all --format csv -o b200.csv\n  runner prices --gpu h100 --region us-east-1 --cloud aws,gcp\n  runner prices --gpu h100 --price-file workloads/our-contract.csv\n\nA list price is a price row, not a quote: `runner explore` prices a run (whole nodes, billing increments, storage, egress, spot interruptions)."
    )]
    Prices(commands::prices::PricesArgs),
    /// List model variants of every installed workload plugin, or show one
    #[command(
        after_help = "Examples:\n  runner models\n  runner models llama3.1-70b\n  runner models --format json"
    )]
    Models {
        /// A variant name
        name: Option<String>,
    },
    /// Project one layout: step time, throughput, MFU, memory per GPU and the breakdown
    #[command(
        after_help = "Omitted layout flags come from the model's published layout for that GPU, precision and count, then from the layout search.\n\nExamples:\n  runner project --model llama3.1-70b --gpu h100 --gpus 64 --precision fp8\n  runner project --model llama3.1-70b --gpus 64 --tp 4 --pp 4 --cp 2 --vp 5 --gbs 128 --format json\n  runner project --model gpt3-175b --gpu gb200 --gpus 512 --recompute full"
    )]
    Project {
        #[command(flatten)]
        target: commands::project::Target,
        /// GPUs
        #[arg(long, value_parser = one_gpu_count)]
        gpus: u32,
        #[command(flatten)]
        layout: commands::project::LayoutFlags,
        /// Per-op times from `runner measure -o FILE.json`: they replace the roofline for
        /// the ops they name (same model, sequence, GPU, precision and sharding; layout
        /// flags left out take the measured sharding)
        #[arg(long, value_name = "FILE")]
        measured: Option<PathBuf>,
    },
    /// Time the ops of the projection's own rank graph on the local device: per-op
    /// forward and backward seconds for `project --measured` and `calibrate --ops`
    #[command(
        after_help = "GEMMs run at the precision plan's formats (BF16, or FP8 E4M3/E5M2 with their casts); memory-bound ops inside a real training step (unsharded ranks only); attention and collectives keep the model.\n\nExamples:\n  runner --device cuda measure --model llama3.1-8b --gpu h100 --precision bf16 -o ops.json\n  runner --device cuda measure --model llama3.1-70b --gpu h100 --precision fp8 --tp 4 -o tp4.json\n  runner project --model llama3.1-8b --gpu h100 --gpus 64 --measured ops.json\n  runner calibrate --ops ops.json -o fitted.toml\n  runner --device cpu --profile my-box.toml measure --model llama3-tiny --gpu my-box -o ops.json\n  runner calibrate --collectives all_reduce_perf.log --gpu h100   (nccl-tests' logs: fitted there, not measured)"
    )]
    Measure {
        #[command(flatten)]
        target: commands::project::Target,
        /// Tensor parallel size of the rank measured
        #[arg(long, default_value_t = 1)]
        tp: u32,
        /// Context parallel size
        #[arg(long, default_value_t = 1)]
        cp: u32,
        /// Expert parallel size
        #[arg(long, default_value_t = 1)]
        ep: u32,
        /// Expert tensor parallel size
        #[arg(long, default_value_t = 1)]
        etp: u32,
        /// Micro-batch size (sequences)
        #[arg(long, default_value_t = 1)]
        mbs: u32,
        /// Timed samples per op (medians are kept)
        #[arg(long, value_parser = count(1000), default_value_t = 5)]
        repeats: usize,
    },
    /// Search the layouts per GPU count: the best ones, and why each other family lost
    #[command(
        after_help = "Examples:\n  runner search --model gpt3-175b --gpu h100 --gpus 1024 --precision bf16\n  runner search --model llama3.1-405b --gpu gb200 --gpus 256,512 --precision fp8 --top 3\n  runner search --model deepseek-v3-671b --gpus 1024 --tp 2 --format json"
    )]
    Search {
        #[command(flatten)]
        target: commands::project::Target,
        /// GPU counts, comma-separated
        #[arg(long, value_delimiter = ',', required = true, value_parser = gpu_count)]
        gpus: Vec<u32>,
        /// Layouts to list per GPU count (at least 1)
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..))]
        top: u16,
        #[command(flatten)]
        layout: commands::project::LayoutFlags,
    },
    /// Project every published run of a calibration-shaped file and compare
    #[command(
        after_help = "Examples:\n  runner validate host/project/data/calibration.toml\n  runner validate runs.toml --format csv -o validation.csv\n  runner validate runs.toml --profile fitted.toml"
    )]
    Validate {
        /// A TOML file of [[point]] tables (source (required: where the run was published), model, gpu, num_gpus, precision, seq_len, gbs, mbs, tp, pp, cp, vp, ep, etp, fsdp, ep_overlap, tp_comm_overlap, ep_dispatcher, recompute_modules, recompute_num_layers, account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split, pipeline_layout, num_layers_at_start_in_bf16, num_layers_at_end_in_bf16, lora_target_modules, pipeline_schedule ("dualpipe" or "dualpipev"; default Megatron's 1F1B), workload ("pretrain", "finetune_sft" or "finetune_lora"), step_time_s or tokens_per_sec_per_gpu)
        file: PathBuf,
    },
    /// Fit a GPU type's efficiency parameters to published runs, or to local measurements
    #[command(
        after_help = "Examples:\n  runner calibrate host/project/data/calibration.toml -o fitted.toml\n  runner calibrate host/project/data/calibration.toml --holdout\n  runner calibrate host/project/data/calibration.toml --holdout --gpu h100\n  runner calibrate my-runs.toml --gpu h100 --precision fp8 -o h100-fp8.toml\n  runner calibrate --ops ops.json -o fitted.toml\n  runner calibrate --collectives coll.json --gpu h100 -o fitted.toml\n  runner calibrate --ops ops.json --collectives coll.json --gpu h100 -o fitted.toml\n  runner --plugin llama3.wasm --profile fitted.toml"
    )]
    Calibrate {
        /// A TOML file of [[point]] tables, as for `runner validate`
        #[arg(required_unless_present_any = ["ops", "collectives"], conflicts_with_all = ["ops", "collectives"])]
        file: Option<PathBuf>,
        /// Fit only this GPU type (with --ops/--collectives: the GPU they ran on; with
        /// --holdout: hold out the families of this GPU's runs only)
        #[arg(long)]
        gpu: Option<String>,
        /// Fit only runs of this precision (with --gpu: a precision's GEMM efficiency is
        /// fitted per GPU type; with --holdout: fit and hold out only these runs)
        #[arg(long, requires = "gpu")]
        precision: Option<String>,
        /// Instead of fitting once: for each GPU and model family, fit on the other
        /// families and report the held-out family's errors (each GPU is fitted on its own
        /// runs, so --gpu gives its rows alone)
        #[arg(long, requires = "file")]
        holdout: bool,
        /// Per-op times from `runner measure`: fit the GEMM efficiency of each measured
        /// format, the GEMM size at half efficiency and the HBM efficiency
        #[arg(long, value_name = "FILE")]
        ops: Option<PathBuf>,
        /// A collective sweep: `runner bench collectives -o FILE.json`, or nccl-tests'
        /// own output (its logs, comma-separated, or several tests in one file); fit the
        /// bandwidth efficiency and per-step latency of the tier its ranks spanned (one
        /// node: NVLink; several: the NICs)
        #[arg(long, value_name = "FILE", value_delimiter = ',')]
        collectives: Vec<PathBuf>,
        /// The tier of a --collectives run where the layout cannot tell (NVLink domains
        /// spanning nodes): scale-up or scale-out
        // Beside FILE, clap let `requires` pass (--collectives conflicts with FILE) and the
        // tier was ignored.
        #[arg(long, requires = "collectives", conflicts_with = "file")]
        tier: Option<String>,
        /// Runs of FILE to leave out of the fit, by the numbers `runner validate` gives them
        /// (from 0), comma-separated, ranges allowed: 40,54,104-108
        #[arg(long, value_name = "RUNS", requires = "file", conflicts_with = "holdout")]
        leave_out: Option<String>,
    },
    /// Runs kept in the history, newest first; --keep and --prune-before delete old ones
    #[command(
        after_help = "Examples:\n  runner history\n  runner history --limit 100 --format json\n  runner history --keep 50\n  runner history --prune-before 2026-11-01"
    )]
    History {
        /// Runs to list
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Delete every run but the newest N, with their rows, then compact the file (a
        /// run still running is kept)
        #[arg(long, value_name = "N")]
        keep: Option<usize>,
        /// Delete the runs started before DATE (UTC: 2026-11-01 or 2026-11-01T12:00:00Z),
        /// with their rows, then compact the file (a run still running is kept)
        #[arg(long, value_name = "DATE")]
        prune_before: Option<String>,
    },
    /// Reprint a run from the history, in any format
    #[command(after_help = "Examples:\n  runner show 3\n  runner show 3 --format csv\n  runner show 3 -o run3.html")]
    Show {
        /// Run id (`runner history` lists them)
        id: i64,
    },
    /// What changed between two runs: inputs, plugins (and their sha256) and results
    #[command(after_help = "Examples:\n  runner compare 3 4\n  runner compare 3 4 --format json")]
    Compare {
        /// Run ids
        a: i64,
        b: i64,
    },
    /// Micro-benchmarks of the local device and of the runner itself
    #[command(
        subcommand,
        after_help = "Examples:\n  runner bench gemm\n  runner bench memory\n  runner bench plugins\n  runner bench search"
    )]
    Bench(BenchCommand),
}

#[derive(Subcommand, Debug)]
pub enum PluginsCommand {
    /// Every installed plugin: name, kind, contract version, source, sha256
    #[command(after_help = "Examples:\n  runner plugins list\n  runner plugins list --format json")]
    List,
    /// What one plugin provides
    #[command(
        after_help = "Examples:\n  runner plugins inspect llama3\n  runner plugins inspect ./my-cloud.wasm"
    )]
    Inspect {
        /// Plugin name or path
        name: String,
    },
    /// Load a plugin, check its contract and imports, call each export on sample input
    #[command(
        after_help = "Examples:\n  runner plugins validate target/wasm32-wasip2/release/my_cloud.wasm"
    )]
    Validate {
        /// Path to a .wasm component (or a plugin name)
        path: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Achieved f32 GEMM GFLOP/s across sizes against the machine's theoretical peak
    #[command(
        after_help = "Examples:\n  runner bench gemm\n  runner bench gemm --sizes 512,1024,2048 --format json"
    )]
    Gemm {
        /// Square sizes (M = N = K)
        #[arg(long, value_delimiter = ',', default_values_t = [256usize, 512, 1024, 2048])]
        sizes: Vec<usize>,
        /// Operand format: f32, bf16, f16, fp8 (E4M3); other than f32 on the device's GEMM path (cuBLASLt on a GPU)
        #[arg(long, default_value = "f32")]
        dtype: String,
    },
    /// Memory bandwidth: STREAM copy and triad over arrays far beyond the caches
    #[command(
        after_help = "Examples:\n  runner bench memory\n  runner bench memory --format json -o mem.json"
    )]
    Memory,
    /// Scaled quantisation throughput per recipe (FP8 per tensor, MXFP8, 1x128/128x128 blocks, NVFP4), GB/s per core
    #[command(
        after_help = "Examples:\n  runner bench quantize\n  runner bench quantize --rows 4096 --cols 4096 --format json"
    )]
    Quantize {
        /// Rows of the operand
        #[arg(long, default_value_t = 4096)]
        rows: usize,
        /// Columns of the operand
        #[arg(long, default_value_t = 4096)]
        cols: usize,
    },
    /// Every kernel of the device checked against the CPU backend, and a toy training step
    #[command(
        after_help = "Examples:\n  runner bench kernels --device cuda\n  runner bench kernels --device cuda --format json -o kernels.json"
    )]
    Kernels,
    /// Forward + backward + optimizer step (AdamW, or Muon) of one Llama 3.1 8B layer (with embedding, head and loss) on the device
    #[command(
        after_help = "Examples:\n  runner bench layer --device cuda\n  runner bench layer --device cuda --seq 2048 --batch 2\n  runner bench layer --device cuda --seq 128 --cuda-graph   (the step eager and replayed as one CUDA graph)\n  runner bench layer --device cuda --seq 128 --cuda-graph --optimizer muon"
    )]
    Layer {
        /// Sequence length
        #[arg(long, default_value_t = 2048)]
        seq: u64,
        /// Micro-batch
        #[arg(long, default_value_t = 1)]
        batch: u64,
        /// Timed steps after two warm-up steps
        #[arg(long, value_parser = count(1000), default_value_t = 5)]
        repeats: usize,
        /// Also time the step recorded once as a CUDA graph and replayed (one launch per step), against the eager step; GPU only
        #[arg(long)]
        cuda_graph: bool,
        /// The optimizer: adamw, or muon (Muon on the layer's seven matrices, AdamW on
        /// the rest; its Newton-Schulz GEMMs on 4096 x 14336 matrices take minutes a
        /// step on a CPU)
        #[arg(long, default_value = "adamw", value_parser = ["adamw", "muon"])]
        optimizer: String,
    },
    /// Collective bandwidth over a size sweep, nccl-tests style (NCCL on GPUs, TCP on CPU ranks); one process per rank under srun, mpirun, torchrun or a Kubernetes indexed Job, or -g N ranks as threads
    #[command(
        after_help = "Examples:\n  runner --device cuda bench collectives -b 8M -e 1G -f 2 -g 8\n  srun -N 2 --ntasks-per-node 8 runner --device cuda bench collectives -b 1M -e 4G -f 4\n  torchrun-style: RANK=0 WORLD_SIZE=2 MASTER_ADDR=host MASTER_PORT=29500 runner bench collectives\n\nall_reduce and broadcast run in place, the others out of place: compare each row with the matching column of nccl-tests."
    )]
    Collectives {
        /// Smallest size (bytes; K, M, G suffixes as nccl-tests)
        #[arg(short = 'b', long = "minbytes", default_value = "32M")]
        minbytes: String,
        /// Largest size
        #[arg(short = 'e', long = "maxbytes", default_value = "32M")]
        maxbytes: String,
        /// Size multiplication factor between steps
        #[arg(short = 'f', long = "stepfactor", default_value_t = 2, value_parser = step_factor)]
        stepfactor: u64,
        /// Fixed size increment between steps (instead of -f)
        #[arg(short = 'i', long = "stepbytes")]
        stepbytes: Option<String>,
        /// Ranks (GPUs) run as threads of this process when no launcher started several processes
        #[arg(short = 'g', long = "ngpus", value_parser = count(4096), default_value_t = 1)]
        ngpus: usize,
        /// Timed iterations per size
        #[arg(short = 'n', long = "iters", value_parser = count(1_000_000), default_value_t = 20)]
        iters: usize,
        /// Warm-up iterations per size
        #[arg(short = 'w', long = "warmup_iters", value_parser = count_or_none(1_000_000), default_value_t = 5)]
        warmup: usize,
        /// Checked iterations per size (0: no check)
        #[arg(short = 'c', long = "check", value_parser = count_or_none(1_000_000), default_value_t = 1)]
        check: usize,
        /// Data type: float, bfloat16, half
        #[arg(short = 'd', long = "datatype", default_value = "float")]
        datatype: String,
        /// Collectives to run
        #[arg(long, value_delimiter = ',', default_value = "all_reduce,all_gather,reduce_scatter,alltoall,broadcast,sendrecv")]
        ops: Vec<String>,
        /// Seconds a rank waits for the others before failing
        #[arg(long, default_value_t = 300, value_parser = wait_seconds)]
        timeout: u64,
    },
    /// Training steps of a toy Llama sharded over tp x pp x dp ranks (one process per rank under a launcher, or threads with --in-process); rank 0 prints every rank's losses, step times and weight digest
    #[command(
        after_help = "Examples:\n  runner bench step --layout tp=2,dp=2 --in-process\n  runner bench step --layout pp=2 --micro-batches 8 --toy bench --in-process\n  runner bench step --layout pp=2,vp=2 --micro-batches 8 --toy bench --schedule in-order\n  runner bench step --layout dp=2 --toy bench --ddp-bucket-size 1000000 --in-process\n  runner bench step --layout dp=2,fsdp --toy bench --fsdp-prefetch off\n  runner bench step --layout pp=2,dp=2 --optimizer muon --in-process\n  runner bench step --layout tp=2,dp=2 --optimizer muon --muon-tp-mode blockwise --in-process\n  RANK=r WORLD_SIZE=4 MASTER_ADDR=host MASTER_PORT=29500 runner bench step --layout tp=2,dp=2   (torchrun-style)"
    )]
    Step {
        /// Parallel layout: tp=N,pp=N,dp=N[,vp=N][,fsdp] (vp: pipeline chunks per stage;
        /// fsdp: the dp ranks shard the weights, gradients and AdamW moments)
        #[arg(long, default_value = "tp=2,dp=2")]
        layout: String,
        /// Training steps (a long run is how the launch tests kill a rank mid-run)
        #[arg(long, value_parser = count(1_000_000), default_value_t = 3)]
        steps: usize,
        /// Micro-batches per step and data-parallel rank (Megatron's num_microbatches:
        /// global batch / (micro-batch x dp)), their gradients accumulated
        #[arg(long, value_parser = count(4096), default_value_t = 1)]
        micro_batches: usize,
        /// Order of a pipeline stage's passes: 1f1b (Megatron's; interleaved over the
        /// chunks when vp > 1) or in-order (each micro-batch there and back before the
        /// next: the stages take turns)
        #[arg(long, default_value = "1f1b", value_parser = ["1f1b", "in-order"])]
        schedule: String,
        /// The toy model: tiny (2 layers per stage, width 32) or bench (4 layers per
        /// stage, width 256, 8 x 256 tokens a micro-batch)
        #[arg(long, default_value = "tiny", value_parser = ["tiny", "bench"])]
        toy: String,
        /// Run every rank as a thread of this process (the single-process run of the layout)
        #[arg(long)]
        in_process: bool,
        /// Start the data-parallel gradient all-reduces during the backward, a bucket at
        /// a time as its gradients are final (Megatron's overlap_grad_reduce), and under
        /// FSDP each layer's reduce-scatter (the same bits either way)
        #[arg(long, default_value = "on", value_parser = ["on", "off"])]
        overlap_grad_reduce: String,
        /// Under FSDP, start the next layer's parameter all-gather as soon as one is
        /// gathered (PyTorch FSDP's prefetch; the same bits either way)
        #[arg(long, default_value = "on", value_parser = ["on", "off"])]
        fsdp_prefetch: String,
        /// Under FSDP, reduce-scatter each micro-batch's gradients so they stay sharded
        /// (PyTorch FSDP's default); off: accumulate whole gradients over the
        /// micro-batches and reduce-scatter once a step (PyTorch's no_sync)
        #[arg(long, default_value = "on", value_parser = ["on", "off"])]
        fsdp_sharded_grads: String,
        /// Gradient elements per bucket of the overlapped reduction (Megatron's
        /// --ddp-bucket-size; default: its max(40M, 1M x dp))
        #[arg(long, value_parser = count(1 << 40))]
        ddp_bucket_size: Option<usize>,
        /// The optimizer: adamw, or muon (Muon on the hidden matrices, AdamW on the rest;
        /// tp ranks gather each matrix's blocks, fsdp ranks their pieces of it)
        #[arg(long, default_value = "adamw", value_parser = ["adamw", "muon"])]
        optimizer: String,
        /// With --optimizer muon, how a tp rank's block of a matrix is orthogonalised:
        /// exact (the blocks gathered, the whole orthogonalised on one tp rank; the
        /// default) or blockwise (Megatron-Core's muon_tp_mode default: each tp rank
        /// its own block alone, no tp communication; an approximation)
        #[arg(long, value_parser = ["exact", "blockwise"])]
        muon_tp_mode: Option<String>,
        /// Seconds a rank waits for the others before failing
        #[arg(long, default_value_t = 300, value_parser = wait_seconds)]
        timeout: u64,
    },
    /// Plugin host overhead: warm load, instantiation, per-call cost
    #[command(
        after_help = "Examples:\n  runner bench plugins\n  runner bench plugins --calls 100000"
    )]
    Plugins {
        /// Calls to time, at most 10000000 (timed in batches of 100, one batch at least;
        /// quote() a tenth as often): near 2^32 it ran for hours without a line
        #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
        calls: u32,
    },
    /// Layout search speed: layouts evaluated per second (cold: sharding and timing the
    /// layers; warm: the schedules only)
    #[command(
        after_help = "Examples:\n  runner bench search\n  runner bench search --model llama3.1-405b --gpu gb200 --gpus 2048 --precision fp8"
    )]
    Search {
        /// Model variant
        #[arg(long, default_value = "gpt3-175b")]
        model: String,
        /// GPU type
        #[arg(long, default_value = "h100")]
        gpu: String,
        /// GPU count
        #[arg(long, default_value_t = 1024, value_parser = one_gpu_count)]
        gpus: u32,
        /// bf16, fp8, fp8-cs, mxfp8 or nvfp4
        #[arg(long, default_value = "bf16")]
        precision: String,
        /// Warm searches to time
        #[arg(long, value_parser = count(1000), default_value_t = 10)]
        repeats: usize,
    },
}

/// One of the comma-separated GPU counts of --gpus, under the run file's rule
/// ([`runner::runfile::within_gpu_ceiling`]) for every command that takes them.
fn gpu_count(s: &str) -> Result<u32, String> {
    use runner::runfile::{CeilingError, parse_within_gpu_ceiling};
    parse_within_gpu_ceiling(s).map_err(|e| match e {
        CeilingError::OutOfRange => {
            format!("{} GPUs: a GPU count must be in 1..={}", s.trim(), runner_contract::limits::GPUS)
        }
        CeilingError::NotWhole => {
            let hint = if s.contains('-') || s.contains("..") { " (ranges are not taken: list each count)" } else { "" };
            format!("'{s}' is not a GPU count: give whole numbers, comma-separated, e.g. --gpus 64,512,2048{hint}")
        }
    })
}

/// The --gpus of a command that takes one count (`project`, `bench search`), under
/// [`gpu_count`]'s rule: a list was answered "'8,16' is not a GPU count: give whole
/// numbers, comma-separated", the very thing given.
fn one_gpu_count(s: &str) -> Result<u32, String> {
    if s.contains(',') {
        return Err(format!(
            "'{s}' is several GPU counts: this command takes one, e.g. --gpus 64 (`runner search` and `runner explore` take several)"
        ));
    }
    gpu_count(s)
}

/// A count flag's parser: 1 to `max` (0 would run nothing, or loop).
fn count(max: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..=max)
}

/// A count flag that may be 0 (`-w 0`: no warm-up): 0 to `max` (past it, a run that
/// never ends: `-w 18446744073709551615` warmed up for ever, without a line of output).
fn count_or_none(max: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(0..=max)
}

/// The most seconds a rank waits for the others (`bench collectives`, `bench step`): a day.
const MAX_WAIT_S: u64 = 86_400;

/// `--timeout` of the benches whose ranks meet: 1 to [`MAX_WAIT_S`] seconds. 0 was taken
/// as 1 without a word, and 18446744073709551615 panicked adding it to the clock.
fn wait_seconds(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if (1..=MAX_WAIT_S).contains(&n) => Ok(n),
        _ => Err(format!("'{s}' is not a wait in seconds: a rank waits for the others 1 to {MAX_WAIT_S} seconds (a day), e.g. --timeout 300")),
    }
}

fn init_logging(global: &Global) {
    use tracing_subscriber::EnvFilter;
    let level = if global.quiet {
        "error"
    } else {
        match global.verbose {
            0 => "warn",
            1 => "info",
            2 => "debug",
            _ => "trace",
        }
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour(std::io::IsTerminal::is_terminal(&std::io::stderr()), std::env::var_os("NO_COLOR")))
        .without_time()
        .try_init();
}

/// Whether log lines carry colour: only on a terminal (a file or a pipe would keep the
/// raw escape codes), and never where `NO_COLOR` is set to anything but empty
/// (no-color.org's convention).
fn colour(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The file `-o` names when another argument of the command line names it too (a run
/// file, a calibration file, a profile, a text, a plugin): the output would overwrite
/// what the command reads. Compared as files (device and inode on Unix), so `./x`, `x`,
/// a symbolic link to it and a hard link of it are one file.
/// Only values that are paths or free text are candidates: `--format json -o json` writes
/// a file named json, which no argument reads.
fn output_is_an_input(output: &std::path::Path, matches: &clap::ArgMatches) -> Option<PathBuf> {
    let target = std::fs::metadata(output).ok()?;
    let mut values: Vec<PathBuf> = Vec::new();
    let mut m = Some(matches);
    while let Some(level) = m {
        for id in level.ids().map(clap::Id::as_str).filter(|&id| id != "output") {
            // An argument of another type (an enum, a number, a flag) answers Err.
            if let Ok(Some(v)) = level.try_get_many::<PathBuf>(id) {
                values.extend(v.cloned());
            } else if let Ok(Some(v)) = level.try_get_many::<String>(id) {
                values.extend(v.map(PathBuf::from));
            }
        }
        m = level.subcommand().map(|(_, sub)| sub);
    }
    values.into_iter().find(|p| std::fs::metadata(p).is_ok_and(|m| same_file(&m, &target, p, output)))
}

/// Whether `a` and `b` name one existing file, compared as [`output_is_an_input`] does.
pub(crate) fn is_same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(ma), Ok(mb)) => same_file(&ma, &mb, a, b),
        _ => false,
    }
}

#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata, _: &std::path::Path, _: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

#[cfg(not(unix))]
fn same_file(_: &std::fs::Metadata, _: &std::fs::Metadata, a: &std::path::Path, b: &std::path::Path) -> bool {
    std::fs::canonicalize(a).ok().is_some_and(|a| std::fs::canonicalize(b).is_ok_and(|b| a == b))
}

/// nccl-tests' -f: a factor that grows the size (1 would never reach -e).
fn step_factor(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(f) if f >= 2 => Ok(f),
        Ok(f) => Err(format!("{f} never grows the size: give a factor of at least 2, or a fixed increment with -i BYTES")),
        Err(e) => Err(format!("{s:?} is not a whole factor ({e}): -f 2 doubles the size each step")),
    }
}

/// The first of the default run's own flags (not a global one) given before a
/// subcommand, if any.
fn run_flag_before(matches: &clap::ArgMatches) -> Option<String> {
    let run = <QuickRun as clap::Args>::augment_args(clap::Command::new("run"));
    run.get_arguments()
        .map(|a| a.get_id().as_str())
        .find(|id| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine))
        .map(|id| {
            let arg = run.get_arguments().find(|a| a.get_id() == id);
            arg.and_then(|a| a.get_long()).unwrap_or(id).to_string()
        })
}

/// The command line parsed, or clap's error (or help) printed and the process ended.
fn parse_args(args: Vec<std::ffi::OsString>) -> clap::ArgMatches {
    match <Cli as clap::CommandFactory>::command().try_get_matches_from(&args) {
        Ok(m) => m,
        Err(e) => shown_parse_error(e, &args).exit(),
    }
}

/// A parse error whose echoed values show terminal sequences (ESC, a bidi override) as
/// visible escapes, as the run's own errors do ([`runner::report::visible`]): clap echoed
/// a value as typed, so on a terminal `--gpus $'8\e[31m'` ran the sequence, and elsewhere
/// the sequence was stripped and the error read "'8' is not a GPU count". The error is
/// the one the arguments give with each such value escaped; where that one differs (the
/// escaped value parsed), the original is printed without styling, what control
/// characters are left escaped.
fn shown_parse_error(e: clap::Error, args: &[std::ffi::OsString]) -> clap::Error {
    let has_sequences = |a: &std::ffi::OsString| a.to_string_lossy().chars().any(runner_contract::text::is_escaped);
    if !args.iter().any(has_sequences) {
        return e;
    }
    let escaped: Vec<std::ffi::OsString> = args
        .iter()
        .map(|a| a.to_str().map_or_else(|| a.clone(), |s| runner_contract::text::escape(s, usize::MAX).into()))
        .collect();
    match <Cli as clap::CommandFactory>::command().try_get_matches_from(escaped) {
        Err(shown) if shown.kind() == e.kind() => shown,
        _ => {
            elog!("{}", runner::report::visible(e.render().to_string().trim_end()));
            std::process::exit(e.exit_code());
        }
    }
}

/// Print `message` as the run's error, terminal sequences escaped, and fail.
fn refuse(message: &str) -> ExitCode {
    elog!("error: {}", runner::report::visible(message));
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    // SAFETY: the first statement of main: no other thread exists yet.
    #[cfg(feature = "cuda")]
    unsafe {
        runner_exec::cuda::nccl::eager_connections()
    };
    let matches = parse_args(std::env::args_os().collect());
    let mut cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches)
        .unwrap_or_else(|e| e.format(&mut <Cli as clap::CommandFactory>::command()).exit());
    init_logging(&cli.global);
    // -o - (or an -o that is stdout): the file's format alone on stdout, as --format
    // without -o prints it, and no file named `-`.
    if let Some(out) = &cli.global.output
        && commands::is_stdout(out)
    {
        cli.global.format = commands::output_format(&cli.global);
        cli.global.output = None;
    }
    // The default run's flags before a subcommand would be dropped without a word.
    if let Some((sub, _)) = matches.subcommand()
        && let Some(flag) = run_flag_before(&matches)
    {
        let fix = if sub == "explore" {
            format!("put it after `explore`: `runner explore --{flag} ...`")
        } else if flag == "plugin" {
            format!(
                "`runner {sub}` finds models among the installed plugins: copy the plugin into a plugin directory \
                 (`runner plugins list` names them) or set RUNNER_PLUGIN_PATH to its folder; its variants then show in \
                 `runner models`"
            )
        } else {
            format!("see `runner {sub} --help` for its options")
        };
        return refuse(&format!("--{flag} before `{sub}` is an option of the default run, not of `{sub}`: {fix}"));
    }
    runner::local_device::set_requested(cli.global.device);
    // An explicit CUDA device that is not there is refused whatever the command, as a
    // missing --profile is: a global flag means the same to every command.
    if let runner_exec::select::DeviceSpec::Cuda(n) = cli.global.device
        && let Some(why) = runner_exec::select::cuda_unusable(n)
    {
        return refuse(&format!("--device cuda:{n}: {why}"));
    }
    // A profile named is read by the commands that project; for the others a missing one
    // would pass unnoticed.
    if let Some(p) = &cli.global.profile
        && !p.is_file()
    {
        return refuse(&format!("--profile {}: no such file (a GPU profile TOML, as `runner calibrate -o` writes)", p.display()));
    }
    if let Some(out) = &cli.global.output
        && let Some(input) = output_is_an_input(out, &matches)
    {
        return refuse(&format!(
            "-o {} is also an input of this command ({}): writing it would destroy it; choose another output file",
            out.display(),
            input.display()
        ));
    }
    // The history is read and written under a path no argument need name (its default):
    // a report written over it lost every run kept there.
    if let Some(out) = &cli.global.output
        && let Ok(history) = runner::history::path(cli.global.history.as_deref())
        && is_same_file(out, &history)
    {
        return refuse(&format!(
            "-o {} is the history database ({}): writing it would destroy the runs kept there; choose another output file",
            out.display(),
            history.display()
        ));
    }
    // Refused before the work, as the places below are: a table written to out.xyz
    // unasked helps no one.
    if let Some(why) = commands::unknown_output_extension(&cli.global, matches!(cli.command, Some(Command::Calibrate { .. }))) {
        return refuse(&why);
    }
    if let Some(why) = commands::format_against_extension(&cli.global) {
        elog!("warning: {why}");
    }
    // A result that takes minutes to compute is not thrown away for want of a place to
    // write it: the output's directory is checked first.
    if let Some(out) = &cli.global.output
        && let Err(why) = runner::report::writable(out)
    {
        return refuse(&why);
    }
    let result = match cli.command {
        None => commands::explore::quick_run(&cli.quick, &cli.global),
        Some(Command::Explore { run }) => commands::explore::quick_run(&run, &cli.global),
        Some(Command::Run { file, run }) => commands::explore::run_file(&file, &run, &cli.global),
        Some(Command::History { limit, keep, prune_before }) => {
            commands::explore::list(limit, keep, prune_before.as_deref(), &cli.global)
        }
        Some(Command::Show { id }) => commands::explore::show(id, &cli.global),
        Some(Command::Compare { a, b }) => commands::explore::compare(a, b, &cli.global),
        Some(Command::Train(args)) => train_cmd::train(args, &cli.global),
        Some(Command::Plugins(cmd)) => commands::plugins(cmd, &cli.global),
        Some(Command::Models { name }) => commands::models(name.as_deref(), &cli.global),
        Some(Command::Prices(args)) => commands::prices::prices(&args, &cli.global),
        Some(Command::Bench(cmd)) => device_bench::bench(cmd, &cli.global),
        Some(Command::Project { target, gpus, layout, measured }) => {
            commands::project::project(&target, gpus, &layout, measured.as_deref(), &cli.global)
        }
        Some(Command::Measure { target, tp, cp, ep, etp, mbs, repeats }) => {
            let gpu_given = matches
                .subcommand_matches("measure")
                .is_some_and(|m| m.value_source("gpu") == Some(clap::parser::ValueSource::CommandLine));
            device_bench::measure(&target, gpu_given, [tp, cp, ep, etp, mbs], repeats, &cli.global)
        }
        Some(Command::Search { target, gpus, top, layout }) => {
            commands::project::search(&target, &gpus, usize::from(top), &layout, &cli.global)
        }
        Some(Command::Validate { file }) => commands::project::validate(&file, &cli.global),
        Some(Command::Calibrate { file: Some(file), holdout: true, gpu, precision, .. }) => {
            commands::project::holdout(&file, gpu.as_deref(), precision.as_deref(), &cli.global)
        }
        Some(Command::Calibrate { file: Some(file), gpu, precision, leave_out, .. }) => {
            commands::project::calibrate(&file, gpu.as_deref(), precision.as_deref(), leave_out.as_deref(), &cli.global)
        }
        Some(Command::Calibrate { file: None, gpu, ops, collectives, tier, .. }) => commands::project::calibrate_local(
            ops.as_deref(),
            &collectives,
            gpu.as_deref(),
            tier.as_deref(),
            &cli.global,
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => refuse(&format!("{e:#}")),
    }
}

#[cfg(test)]
mod tests {
    use super::{gpu_count, one_gpu_count, wait_seconds};

    /// Colour only on a terminal, and `NO_COLOR` (set, not empty) turns it off there.
    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(super::colour(true, None));
        assert!(super::colour(true, Some("".into())));
        assert!(!super::colour(true, Some("1".into())));
        assert!(!super::colour(false, None));
    }

    /// A command of one GPU count answers a list by saying it takes one, and where
    /// several go; one count reads as in every command.
    #[test]
    fn a_list_where_one_gpu_count_goes_says_so() {
        assert_eq!(one_gpu_count("64"), Ok(64));
        assert_eq!(
            one_gpu_count("8,16").unwrap_err(),
            "'8,16' is several GPU counts: this command takes one, e.g. --gpus 64 (`runner search` and `runner explore` take several)"
        );
        assert_eq!(one_gpu_count("0"), gpu_count("0"));
    }

    /// A rank's wait is 1 second to a day: 0 was taken as 1 without a word, and a wait
    /// past the clock's range panicked every rank.
    #[test]
    fn a_wait_is_one_second_to_a_day() {
        assert_eq!(wait_seconds("1"), Ok(1));
        assert_eq!(wait_seconds("86400"), Ok(86_400));
        for bad in ["0", "86401", "18446744073709551615", "-1", "5m", ""] {
            let e = wait_seconds(bad).unwrap_err();
            assert!(e.contains("a rank waits for the others 1 to 86400 seconds (a day), e.g. --timeout 300"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_gpu_count_that_is_not_one_says_how_to_write_them() {
        assert_eq!(gpu_count("64"), Ok(64));
        // `--gpus "64, 512"`: the space after a comma is how people write lists.
        assert_eq!(gpu_count(" 512"), Ok(512));
        assert!(gpu_count("8x").unwrap_err().contains("e.g. --gpus 64,512,2048"));
        assert!(gpu_count("8-64").unwrap_err().contains("ranges are not taken"));
        assert!(gpu_count("").unwrap_err().contains("'' is not a GPU count"));
        // The run file's range, for every command (project and search took any u32).
        assert_eq!(gpu_count("1048576"), Ok(1048576));
        assert_eq!(gpu_count("1048577").unwrap_err(), "1048577 GPUs: a GPU count must be in 1..=1048576");
        assert_eq!(gpu_count("99999999999").unwrap_err(), "99999999999 GPUs: a GPU count must be in 1..=1048576");
        assert_eq!(gpu_count("0").unwrap_err(), "0 GPUs: a GPU count must be in 1..=1048576");
    }

    /// explore, run and prices declare the cloud flags once and read them alike, each over
    /// its own default: a run file's `[cost]` stays where a flag is not given, and prices
    /// starts from on-demand; each command's `--help` says its own option (only prices
    /// takes `all`). Kills: a clap default on the shared `--option` (it would override a
    /// run file's), a flag left out of `apply`, the prices help override dropped.
    #[test]
    fn the_cloud_flags_are_one_declaration_read_over_each_commands_default() {
        use super::{CloudArgs, Command};
        use clap::Parser;
        let cloud = |args: &[&str]| -> CloudArgs {
            match super::Cli::try_parse_from(args).unwrap().command {
                Some(Command::Explore { run } | Command::Run { run, .. }) => run.cloud,
                Some(Command::Prices(p)) => p.cloud,
                _ => unreachable!("{args:?}"),
            }
        };
        let flags = ["--cloud", "aws,gcp", "--price-file", "ours.csv", "--option", "spot", "--region", "us-east-1"];
        let mut file = runner::runfile::CostSection { option: "1y-no-upfront".into(), region: "eu-west-1".into(), ..Default::default() };
        cloud(&["runner", "run", "f.toml"]).apply(&mut file).unwrap();
        assert_eq!((file.option.as_str(), file.region.as_str(), file.plugins.len(), file.price_file.as_deref()), ("1y-no-upfront", "eu-west-1", 0, None));
        for command in [&["runner", "explore"][..], &["runner", "run", "f.toml"], &["runner", "prices"]] {
            let given = cloud(&[command, &flags[..]].concat());
            let mut cost = runner::runfile::CostSection::default();
            given.apply(&mut cost).unwrap();
            assert_eq!(
                (cost.plugins.join(","), cost.price_file.as_deref(), cost.option.as_str(), cost.region.as_str()),
                ("aws,gcp".to_string(), Some("ours.csv"), "spot", "us-east-1"),
                "{command:?}"
            );
        }
        let mut listing = runner::runfile::CostSection::default();
        cloud(&["runner", "prices"]).apply(&mut listing).unwrap();
        assert_eq!((listing.option.as_str(), listing.region.as_str()), ("on-demand", ""));

        let help = |sub: &str| {
            let cmd = <super::Cli as clap::CommandFactory>::command();
            let sub = cmd.find_subcommand(sub).unwrap().clone();
            sub.get_arguments().find(|a| a.get_id() == "option").and_then(|a| a.get_help()).map(ToString::to_string).unwrap()
        };
        assert!(help("prices").ends_with("..., or all") && help("prices").contains("on-demand (the default)"), "{}", help("prices"));
        assert!(!help("explore").contains("all"), "{}", help("explore"));
        assert!(help("run").contains("default: the run file's [cost] option, else on-demand"), "{}", help("run"));

        // Prices lists every region unless told; explore takes each cloud's cheapest; run
        // reads its file's first. Kills: the prices or run override dropped (the shared
        // text names each cloud's cheapest).
        let region = |sub: &str| {
            let cmd = <super::Cli as clap::CommandFactory>::command();
            let sub = cmd.find_subcommand(sub).unwrap().clone();
            sub.get_arguments().find(|a| a.get_id() == "region").and_then(|a| a.get_help()).map(ToString::to_string).unwrap()
        };
        assert_eq!(region("prices"), "Only this region (default: every region)");
        assert_eq!(region("explore"), "Only this region (default: each cloud's cheapest)");
        assert_eq!(region("run"), "Only this region (default: the run file's [cost] region, else each cloud's cheapest)");
    }

    /// A flag whose help says its default in words ("default: the variant's") shows no
    /// clap default beside it: `train --layers` read "(default: the variant's) [default: 0]".
    #[test]
    fn no_flag_gives_two_defaults() {
        fn walk(cmd: &clap::Command, path: &str, bad: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let help = a.get_long_help().or(a.get_help()).map(ToString::to_string).unwrap_or_default();
                if help.contains("(default") && !a.get_default_values().is_empty() && !a.is_hide_default_value_set() {
                    bad.push(format!("{path} --{}", a.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), bad);
            }
        }
        let mut bad = Vec::new();
        walk(&<super::Cli as clap::CommandFactory>::command(), "runner", &mut bad);
        assert!(bad.is_empty(), "{bad:?}");
    }
}
