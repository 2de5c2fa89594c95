//! Rules of the S3 sink that are pure: object keys, the JSONL line encoding and window bounds.
//! The runtime (leases, uploads, the commit sequence) builds on these; keeping them here lets
//! every rule be tested exhaustively and gives every node the same bytes for the same window.

pub mod builder;
pub mod commit;
pub mod documents;
pub mod engine;
pub mod jsonl;
pub mod keys;
pub mod window;
