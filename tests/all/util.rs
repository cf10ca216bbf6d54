//! Helpers: find a test program by name.

/// Path of a test program (tests/programs/<name>) built by host/runner/build.rs.
pub fn program(file: &str) -> String {
    runner::plugin::test_programs()
        .iter()
        .find(|(n, _)| *n == file)
        .map(|(_, p)| p.to_string())
        .unwrap_or_else(|| panic!("test program {file} was not built; see host/runner/build.rs"))
}
