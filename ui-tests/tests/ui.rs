//! Compile-pass and compile-fail cases for `#[ruststream::app]` and
//! `#[ruststream::subscriber]`.
//!
//! Pass cases are compiled *and run* by trybuild, so each `main` must finish
//! quickly. The `.stderr` snapshots of the fail cases are made with this
//! machine's stable toolchain (Rust 1.95); compiler wording changes between
//! releases, so regenerate them with that toolchain after a change to the
//! macros or their diagnostics:
//!
//! ```text
//! TRYBUILD=overwrite cargo test -p ruststream-ui-tests
//! ```
//!
//! and review every changed `.stderr` file before committing it.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
