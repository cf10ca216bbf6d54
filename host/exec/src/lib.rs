//! The executor (see the Executor issue): device trait, CPU backend, timing harness.
