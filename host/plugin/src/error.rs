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
    /// The plugin returned a value that breaks a rule of the contract.
    Invalid(String),
    /// The plugin returned an error of its own (e.g. an unknown variant); printed escaped.
    Refused(String),
}

/// A plugin error: which plugin, which call, what failed.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginError {
    pub plugin: String,
    pub call: String,
    pub failure: Failure,
}

impl PluginError {
    pub fn new(plugin: &str, call: &str, failure: Failure) -> PluginError {
        PluginError {
            plugin: plugin.to_string(),
            call: call.to_string(),
            failure,
        }
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plugin = runner_contract::text::escape(&self.plugin, 128);
        let call = &self.call;
        match &self.failure {
            Failure::Load(m) => write!(f, "plugin '{plugin}' could not be loaded: {m}"),
            Failure::Contract(m) => write!(f, "plugin '{plugin}' is incompatible: {m}"),
            Failure::Trap { message, stderr } => {
                write!(f, "plugin '{plugin}' trapped in `{call}`: {message}")?;
                // Rust's hint to set RUST_BACKTRACE means nothing inside the sandbox.
                let kept: Vec<&str> = stderr.lines().filter(|l| !l.starts_with("note: run with `RUST_BACKTRACE=")).collect();
                let stderr = kept.join("\n");
                let stderr = stderr.trim();
                if !stderr.is_empty() {
                    write!(f, "\n  plugin stderr: {}", stderr.replace('\n', "\n    "))?;
                }
                write!(
                    f,
                    "\n  the instance was discarded; fix the plugin or leave it out of the run"
                )
            }
            Failure::Timeout { limit_ms } => write!(
                f,
                "plugin '{plugin}' ran past its time limit of {limit_ms} ms in `{call}` and was stopped \
                 (raise `call_timeout_ms` under [limits] in the run file if the plugin is just slow)"
            ),
            Failure::OutOfMemory { limit_mib } => write!(
                f,
                "plugin '{plugin}' tried to use more than its memory cap of {limit_mib} MiB in `{call}` and was stopped \
                 (raise `memory_mib` under [limits] in the run file if the plugin really needs more)"
            ),
            Failure::Invalid(rule) => {
                write!(
                    f,
                    "plugin '{plugin}' returned an invalid value from `{call}`: {rule}"
                )
            }
            Failure::Refused(m) => write!(
                f,
                "plugin '{plugin}' refused `{call}`: {}",
                runner_contract::text::escape(m, runner_contract::text::MAX_TEXT)
            ),
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
    }
}
