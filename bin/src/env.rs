//! The one place the process reads its environment: every setting and every test hook
//! (`QUEEN_TEST_*`) comes through `env_var` (clap reads its flags' own variables), and the app
//! and the adapters receive values. `clippy.toml` forbids `std::env::var` everywhere else.

/// The variable `name`, when it is set and valid Unicode.
#[allow(
    clippy::disallowed_methods,
    reason = "this is the home of the process's environment reads"
)]
pub(crate) fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}
