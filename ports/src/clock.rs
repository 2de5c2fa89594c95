//! The wall clock, used only to stamp proposals and logs. Never read by the state machine.

/// Microseconds since the Unix epoch (UTC).
pub trait Clock: Send + Sync + 'static {
    /// The current wall-clock time in microseconds since the epoch.
    fn now_micros(&self) -> u64;
}

/// The operating system's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(
        clippy::disallowed_methods,
        reason = "the one home of the wall clock (clippy.toml)"
    )]
    fn now_micros(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }
}
