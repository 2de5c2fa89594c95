//! queen-lake: the object-store side of the S3 sink.
//!
//! Owns: where the lake lives ([`LakeTarget`]: an S3-compatible bucket, a local folder or memory)
//! and the few operations the sink performs on it ([`Lake`]: a probe, a create-only put that
//! tells an identical rebuild from a conflicting one, get and list); the deterministic encoders
//! of a window's objects (JSONL compression and Parquet, in [`encode`]); and the read-only
//! [`verify`] of a lake against its manifests, behind `queen lake verify`.
//!
//! The pure rules (keys, the JSONL line, windows, manifests, recovery) stay in
//! `queen_domain::sink`; this crate turns them into bytes and requests.
//! Must never depend on: the broker's runtime (openraft, hyper, fjall, queen-app), and no other
//! crate may reach `object_store` except through this one. Secrets never appear in a log line,
//! an error or a `Debug` output (see [`Secret`]).

#![warn(missing_docs)]

pub mod encode;
mod endpoint;
mod error;
mod store;
mod verify;

pub use encode::{Compression, Format, ParquetCodec};
pub use endpoint::{AddressPolicy, EndpointError, check_bucket, check_endpoint, refused_class};
pub use error::{Failure, FailureReason, LakeError};
pub use store::{
    Lake, LakeTarget, MULTIPART_PART_BYTES, MULTIPART_THRESHOLD_BYTES, PutOutcome, RequestObserver,
    S3Target, Secret, Sse,
};
pub use verify::{QueueReport, VerifyReport, verify};
