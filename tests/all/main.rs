//! End-to-end tests: one binary, one module per theme.
