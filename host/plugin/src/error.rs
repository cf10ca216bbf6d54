//! Plugin failures, classified so the message names the plugin, the call, and the limit
//! or rule that was broken, and says how to fix it.

use std::fmt;

/// What went wrong inside (or at the boundary of) a plugin.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// Could not find, read or compile the component.
    Load(String),
    /// Built against another contract version, or of an unexpected kind.
    Contract(String),
    /// The plugin trapped (a panic, an unreachable, a bad memory access).
    Trap { message: String, stderr: String },
    /// The call ran past its deadline.
    Timeout { limit_ms: u64 },
    /// The plugin tried to grow its memory past the cap.
    OutOfMemory { limit_mib: u64 },
    /// The host could not map memory for the plugin's sandbox (the process's address-space
    /// limit, or the machine's memory): not the plugin's fault.
    HostMemory(String),
    /// The plugin returned a value that breaks a rule of the contract.
    Invalid(String),
    /// The plugin returned an error of its own (e.g. an unknown variant); printed escaped.
    Refused(String),
    /// The host refused to send a request the contract lets no plugin answer (a quote
    /// before `offerings`, of an instance, region or purchase option not in its price list,
    /// or of no or too few nodes: `check_request`): the plugin was not called.
    NotAsked(String),
}

/// A plugin error: which plugin, which call, what failed.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginError {
    pub plugin: String,
    pub call: String,
    pub failure: Failure,
    /// Where a plugin that shadows an embedded one of its name was read from: its errors
    /// say so, or they would read as the first-party plugin's.
    pub shadowing: Option<String>,
}

impl PluginError {
    pub fn new(plugin: &str, call: &str, failure: Failure) -> PluginError {
        PluginError {
            plugin: plugin.to_string(),
            call: call.to_string(),
            failure,
            shadowing: None,
        }
    }

    /// The error of the plugin `info` describes: one that shadows an embedded plugin is
    /// named with its path.
    pub fn of(mut self, info: &crate::PluginInfo) -> PluginError {
        self.shadowing = info.shadowing();
        self
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The name in quotes, a shadow's path after them.
        let mut plugin = format!("'{}'", runner_contract::text::escape(&self.plugin, 128));
        if let Some(path) = &self.shadowing {
            plugin += &format!(" (from {}, shadowing the embedded plugin of that name)", runner_contract::text::escape(path, 512));
        }
        let call = &self.call;
        match &self.failure {
            Failure::Load(m) => write!(f, "plugin {plugin} could not be loaded: {m}"),
            Failure::Contract(m) => write!(f, "plugin {plugin} is incompatible: {m}"),
            Failure::Trap { message, stderr } => {
                write!(f, "plugin {plugin} trapped in `{call}`: {message}")?;
                // Rust's hint to set RUST_BACKTRACE means nothing inside the sandbox.
                // The sandbox escapes what the plugin printed: its line breaks read `\n`.
                let mut kept: Vec<String> = stderr
                    .lines()
                    .flat_map(|l| l.split("\\n"))
                    .filter(|l| !l.starts_with("note: run with `RUST_BACKTRACE="))
                    .map(str::to_string)
                    .collect();
                // A plugin that printed in a loop: its first lines and its last (the panic).
                if kept.len() > 30 {
                    let left_out = kept.len() - 25;
                    kept.splice(5..kept.len() - 20, [format!("[{left_out} lines left out]")]);
                }
                let stderr = kept.join("\n");
                let stderr = stderr.trim();
                // Each part ends with `;` before its line break: a note that wraps the
                // message into one paragraph (explore's) would run the parts together.
                if !stderr.is_empty() {
                    write!(f, ";\n  plugin stderr: {}", stderr.replace('\n', "\n    "))?;
                }
                write!(
                    f,
                    ";\n  the instance was discarded; fix the plugin or leave it out of the run"
                )
            }
            Failure::Timeout { limit_ms } => write!(
                f,
                "plugin {plugin} ran past its time limit of {limit_ms} ms in `{call}` and was stopped \
                 (if the plugin is just slow, raise `call_timeout_ms` under [limits] in a run file and run it with `runner run FILE`)"
            ),
            Failure::OutOfMemory { limit_mib } => write!(
                f,
                "plugin {plugin} tried to use more than its memory cap of {limit_mib} MiB in `{call}` and was stopped \
                 (if the plugin really needs more, raise `memory_mib` under [limits] in a run file and run it with `runner run FILE`)"
            ),
            Failure::HostMemory(m) => {
                write!(f, "the host could not map memory for plugin {plugin} in `{call}`: {m}")?;
                match crate::engine::address_space_limit() {
                    Some(limit) => write!(
                        f,
                        "\n  this process may use at most {} MiB of address space (`ulimit -v`): raise or lift that limit \
                         (`ulimit -v unlimited`) and run again",
                        limit >> 20
                    ),
                    None => write!(f, "\n  the machine is short of memory: free some (or run fewer processes) and run again"),
                }
            }
            Failure::Invalid(rule) => {
                write!(
                    f,
                    "plugin {plugin} returned an invalid value from `{call}`: {rule}"
                )
            }
            Failure::Refused(m) => write!(
                f,
                "plugin {plugin} refused `{call}`: {}",
                runner_contract::text::escape(m, runner_contract::text::MAX_TEXT)
            ),
            Failure::NotAsked(m) => write!(f, "plugin {plugin} was not asked for `{call}`: {m}"),
        }
    }
}

impl std::error::Error for PluginError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panicking plugin's message keeps where and why it panicked, without Rust's hint
    /// to set an environment variable the sandbox does not pass.
    #[test]
    fn a_trap_shows_the_panic_without_the_backtrace_hint() {
        let stderr = "\nthread '<unnamed>' panicked at src/lib.rs:12:5:\nno price for x\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        let e = PluginError::new("aws.wasm", "quote", Failure::Trap { message: "wasm trap: unreachable".into(), stderr: stderr.into() });
        let text = e.to_string();
        assert!(text.contains("panicked at src/lib.rs:12:5:\n    no price for x"), "{text}");
        assert!(!text.contains("RUST_BACKTRACE"), "{text}");

        // As the sandbox hands it over: escaped, its line breaks the two characters `\n`.
        let escaped = runner_contract::text::escape(stderr, usize::MAX);
        let e = PluginError::new("aws.wasm", "quote", Failure::Trap { message: "wasm trap: unreachable".into(), stderr: escaped });
        let text = e.to_string();
        assert!(text.contains("panicked at src/lib.rs:12:5:\n    no price for x"), "{text}");
        assert!(!text.contains("RUST_BACKTRACE"), "{text}");

        // A plugin that printed in a loop: the first lines and the last, the panic with them.
        let spam: String = (0..100).map(|i| format!("line {i}\\n")).collect::<String>() + "boom";
        let e = PluginError::new("x.wasm", "graph", Failure::Trap { message: "unreachable".into(), stderr: spam });
        let text = e.to_string();
        assert!(text.contains("line 4\n    [76 lines left out]\n    line 81"), "{text}");
        assert!(text.contains("line 99\n    boom") && !text.contains("line 5\n"), "{text}");
    }

    /// A memory the host could not map says so, not "fix the plugin", and names the fix:
    /// the address-space limit where there is one. Kills: the failure shown as a trap.
    #[test]
    fn host_memory_is_not_blamed_on_the_plugin() {
        let e = PluginError::new("bf16.wasm", "plan", Failure::HostMemory("mmap failed".into()));
        let text = e.to_string();
        assert!(text.starts_with("the host could not map memory for plugin 'bf16.wasm' in `plan`: mmap failed\n  "), "{text}");
        assert!(!text.contains("fix the plugin"), "{text}");
        let fix = if crate::engine::address_space_limit().is_some() { "ulimit -v unlimited" } else { "short of memory" };
        assert!(text.contains(fix), "{text}");
    }

    /// Every message names the plugin (escaped: a file name can hold a terminal sequence)
    /// and, for a failure in a call, the call; a plugin's own refusal is escaped too.
    #[test]
    fn every_message_names_the_plugin_escaped_and_the_call() {
        let plugin = "evil\u{1b}[2J.wasm";
        for failure in [
            Failure::Load("no such file".into()),
            Failure::Contract("0.4.0".into()),
            Failure::Trap { message: "unreachable".into(), stderr: String::new() },
            Failure::Timeout { limit_ms: 300 },
            Failure::OutOfMemory { limit_mib: 64 },
            Failure::Invalid("total is NaN".into()),
            Failure::Refused("sold out \u{1b}[31m".into()),
            Failure::NotAsked("no price".into()),
        ] {
            let in_call = !matches!(failure, Failure::Load(_) | Failure::Contract(_));
            let text = PluginError::new(plugin, "graph", failure).to_string();
            assert!(text.contains("'evil\\u{1b}[2J.wasm'"), "{text}");
            assert!(!text.contains('\u{1b}'), "{text:?}");
            assert!(!in_call || text.contains("`graph`"), "{text}");
        }
    }

    /// The limits' hints name a run file as one to write, not "the run file": `explore`,
    /// `prices` and the default run have none, and no flag sets the limits. Kills: "the run
    /// file" again.
    #[test]
    fn the_limits_hints_say_how_to_use_a_run_file() {
        for failure in [Failure::Timeout { limit_ms: 10_000 }, Failure::OutOfMemory { limit_mib: 256 }] {
            let text = PluginError::new("x.wasm", "quote", failure).to_string();
            assert!(text.contains("under [limits] in a run file and run it with `runner run FILE`"), "{text}");
            assert!(!text.contains("the run file"), "{text}");
        }
    }

    /// A trap's parts (the trap, the plugin's stderr, what the host did) are each closed by
    /// `;`: a note that wraps the message into one paragraph keeps them apart ("executed;
    /// plugin stderr: ...; the instance was discarded"). Kills: a part's `;` dropped.
    #[test]
    fn a_traps_parts_are_kept_apart_when_the_message_is_one_paragraph() {
        let trap = Failure::Trap { message: "wasm trap: unreachable executed".into(), stderr: "thread panicked at x:\\ncapacity overflow".into() };
        let text = PluginError::new("x.wasm", "quote", trap).to_string();
        let one: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(
            one.join(" "),
            "plugin 'x.wasm' trapped in `quote`: wasm trap: unreachable executed; plugin stderr: thread panicked at x: \
             capacity overflow; the instance was discarded; fix the plugin or leave it out of the run"
        );
        let bare = PluginError::new("x.wasm", "quote", Failure::Trap { message: "unreachable".into(), stderr: String::new() }).to_string();
        assert!(bare.split_whitespace().collect::<Vec<_>>().join(" ").contains("unreachable; the instance was discarded"), "{bare}");
    }

    /// Up to 30 lines of stderr are shown whole; from 31 the first 5 and the last 20.
    #[test]
    fn thirty_lines_of_stderr_are_shown_whole_and_thirty_one_cut() {
        let lines = |n: usize| (0..n).map(|i| format!("line {i}")).collect::<Vec<_>>().join("\n");
        let shown = |n| {
            let trap = Failure::Trap { message: "unreachable".into(), stderr: lines(n) };
            PluginError::new("x.wasm", "graph", trap).to_string()
        };
        let thirty = shown(30);
        assert!(thirty.contains("line 0\n") && thirty.contains("line 29;\n") && !thirty.contains("left out"), "{thirty}");
        let cut = shown(31);
        assert!(cut.contains("line 4\n    [6 lines left out]\n    line 11\n"), "{cut}");
    }
}
