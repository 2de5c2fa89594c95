//! queen-telemetry
