//! The tracing targets the node logs under, so an operator can filter one part with
//! `RUST_LOG=info,queen-s3=debug`. Use them as `tracing::info!(target: targets::S3, ...)`.

/// Node assembly, use cases, shutdown.
pub const APP: &str = "queen-app";
/// The client HTTP listener.
pub const HTTP: &str = "queen-http";
/// Replication: the raft log, network and state machine.
pub const RAFT: &str = "queen-raft";
/// The embedded on-disk state store.
pub const STORE: &str = "queen-store";
/// The embedded S3 sink (its threads carry the same name).
pub const S3: &str = "queen-s3";
/// This crate: exporter setup and shutdown.
pub const TELEMETRY: &str = "queen-telemetry";
