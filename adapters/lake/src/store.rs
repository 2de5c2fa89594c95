//! Where the lake lives and the few requests the sink sends it.
//!
//! [`Lake`] wraps an `object_store` store behind a handful of methods with a written contract.
//! Every method is async and needs a tokio runtime (the S3 client and the local folder both use
//! one). Nothing here deletes an object.

mod guarded;
mod s3;
mod timeouts;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::encode::sha256_hex;
use crate::endpoint::AddressPolicy;
use crate::error::LakeError;
pub(crate) use s3::status_of;
use s3::{classify, open_s3, parse_key, store_error};

/// Objects of this size and above go up as a multipart upload; smaller ones in one PUT.
pub const MULTIPART_THRESHOLD_BYTES: usize = 16 * 1024 * 1024;

/// Size of every part of a multipart upload but the last (S3 refuses parts under 5 MiB).
pub const MULTIPART_PART_BYTES: usize = 8 * 1024 * 1024;

/// Parts of one upload in flight at once: two keep a link busy without holding many buffers.
const PARTS_IN_FLIGHT: usize = 2;

/// A secret (the S3 secret key). Its `Debug` and `Display` print `***`, so a secret inside any
/// struct, error or log field never shows; only the S3 client reads the text.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wrap a secret.
    #[must_use]
    pub fn new(text: impl Into<String>) -> Self {
        Secret(text.into())
    }

    /// Whether the secret is empty (a configuration error for S3).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Self {
        Secret(text)
    }
}

/// Server-side encryption the bucket applies to every object the sink writes
/// (`QUEEN_S3_SSE`). The lake is plaintext otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sse {
    /// `AES256`: S3-managed keys (SSE-S3).
    Aes256,
    /// `aws:kms` or `aws:kms:<key id>`: KMS keys, the bucket's default key when `key_id` is
    /// `None`.
    Kms {
        /// A key id, alias or ARN (not a secret).
        key_id: Option<String>,
    },
}

impl FromStr for Sse {
    type Err = LakeError;

    /// `AES256`, `aws:kms` or `aws:kms:<key id>` (the key id may itself contain `:`, as ARNs do).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let t = text.trim();
        if t.eq_ignore_ascii_case("AES256") {
            return Ok(Sse::Aes256);
        }
        if t.eq_ignore_ascii_case("aws:kms") {
            return Ok(Sse::Kms { key_id: None });
        }
        match t.get(..8) {
            Some(head) if head.eq_ignore_ascii_case("aws:kms:") && t.len() > 8 => Ok(Sse::Kms {
                key_id: Some(t[8..].to_owned()),
            }),
            _ => Err(LakeError::Config(format!(
                "sse '{t}' is not AES256, aws:kms or aws:kms:<key id>"
            ))),
        }
    }
}

impl fmt::Display for Sse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sse::Aes256 => f.write_str("AES256"),
            Sse::Kms { key_id: None } => f.write_str("aws:kms"),
            Sse::Kms { key_id: Some(id) } => write!(f, "aws:kms:{id}"),
        }
    }
}

/// An S3-compatible bucket.
///
/// Google Cloud Storage is reached through its S3-compatible XML endpoint
/// (`https://storage.googleapis.com`, region `auto`, path style, an HMAC key, no `sse`): this
/// crate builds `object_store` with the `aws` feature only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Target {
    /// `http(s)://host[:port]` of an S3-compatible service; `None` is AWS for `region`. An
    /// `http://` endpoint is allowed as such (a local MinIO or test server).
    pub endpoint: Option<String>,
    /// Region the service answers to (`us-east-1` for MinIO, `auto` for GCS).
    pub region: String,
    /// Bucket in the URL path (MinIO, GCS, test servers) instead of the host name.
    pub path_style: bool,
    /// Bucket name.
    pub bucket: String,
    /// Access key id (not a secret, but never logged either).
    pub access_key: String,
    /// Secret access key.
    pub secret_key: Secret,
    /// Server-side encryption to request on every write.
    pub sse: Option<Sse>,
    /// Which addresses the endpoint may resolve to (a tenant's endpoint is public-only unless
    /// the operator allows private ones).
    pub addresses: AddressPolicy,
}

/// Where the lake lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LakeTarget {
    /// An S3-compatible bucket.
    S3(S3Target),
    /// A folder on this machine, created when missing (keys become relative paths).
    Local(PathBuf),
    /// Process memory: each [`Lake::open`] makes a new empty lake, shared by its clones.
    Memory,
}

/// What a create-only put found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    /// The key was free; the object is ours now.
    Created,
    /// The key held these very bytes already (same sha256): a rebuilt window, nothing to do.
    Identical,
    /// The key holds other bytes, which were left as they are.
    Different {
        /// Hex sha256 of the bytes found under the key.
        existing_sha256: String,
    },
}

/// Called once per request the lake sends, with the operation (`put`, `get`, `head`, `list` or
/// `multipart`) and the HTTP status (`200` on success, `404`, `412`, `500`, ... from the
/// service, `0` when no status was received: a transport error, or a local failure). The app
/// exports it as `queen_s3_s3_requests_total{operation,status}`. It runs on the request's task:
/// keep it cheap and never block.
pub type RequestObserver = Arc<dyn Fn(&'static str, u16) + Send + Sync>;

/// A handle on the lake. Cheap to clone; clones share the connection pool and the observer.
#[derive(Clone)]
pub struct Lake {
    /// The backend.
    store: Arc<dyn ObjectStore>,
    /// What [`Lake::describe`] returns, computed once (never holds a secret).
    description: Arc<str>,
    /// Metrics hook, if the app set one.
    observer: Option<RequestObserver>,
}

impl fmt::Debug for Lake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lake")
            .field("target", &self.description)
            .finish_non_exhaustive()
    }
}

impl Lake {
    /// Open the lake a target names. Sends nothing: use [`Lake::probe`] to see that it answers.
    ///
    /// # Errors
    /// [`LakeError::Config`] for an unusable target (empty bucket, region or keys, an endpoint
    /// that is not `http(s)://host`, an unknown SSE) or a local folder that cannot be created.
    pub fn open(target: &LakeTarget) -> Result<Lake, LakeError> {
        let (store, description): (Arc<dyn ObjectStore>, String) = match target {
            LakeTarget::S3(t) => {
                let description = format!(
                    "s3 bucket={} endpoint={} region={} style={}{}",
                    t.bucket.trim(),
                    t.endpoint.as_deref().map_or("aws", str::trim),
                    t.region.trim(),
                    if t.path_style {
                        "path"
                    } else {
                        "virtual-hosted"
                    },
                    t.sse
                        .as_ref()
                        .map(|s| format!(" sse={s}"))
                        .unwrap_or_default(),
                );
                (open_s3(t)?, description)
            }
            LakeTarget::Local(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| {
                    LakeError::Config(format!("cannot create lake folder {}: {e}", dir.display()))
                })?;
                let fs = LocalFileSystem::new_with_prefix(dir).map_err(|e| {
                    LakeError::Config(format!("cannot open lake folder {}: {e}", dir.display()))
                })?;
                (Arc::new(fs), format!("local dir={}", dir.display()))
            }
            LakeTarget::Memory => (Arc::new(InMemory::new()), "memory".to_owned()),
        };
        tracing::debug!(target: "queen-s3", lake = %description, "lake opened");
        Ok(Lake {
            store,
            description: description.into(),
            observer: None,
        })
    }

    /// The same lake, reporting every request to `observer`.
    #[must_use]
    pub fn with_observer(mut self, observer: RequestObserver) -> Lake {
        self.observer = Some(observer);
        self
    }

    /// The target for logs and status pages: kind, bucket, endpoint, region, style, SSE; never a
    /// key or secret.
    #[must_use]
    pub fn describe(&self) -> String {
        self.description.to_string()
    }

    /// Whether a put can be made create-only (`If-None-Match: *`), so that [`Lake::put_create`]
    /// never replaces other bytes. True for S3, the local folder and memory.
    #[must_use]
    pub fn supports_create_only(&self) -> bool {
        true
    }

    fn observe(&self, operation: &'static str, status: u16) {
        if let Some(observer) = &self.observer {
            observer(operation, status);
        }
    }

    fn observe_result<T>(&self, operation: &'static str, result: &Result<T, object_store::Error>) {
        self.observe(operation, result.as_ref().map_or_else(status_of, |_| 200));
    }

    /// Prove that the bucket answers and lets this key list `prefix` (one delimited list
    /// request: it fails on a missing bucket, bad credentials or a wrong endpoint, where a HEAD
    /// of a missing key would not tell a missing bucket from a missing key).
    ///
    /// # Errors
    /// [`LakeError::Probe`], saying what to check. Retrying helps once the cause is fixed.
    pub async fn probe(&self, prefix: &str) -> Result<(), LakeError> {
        let path = parse_key(prefix)?;
        let result = self.store.list_with_delimiter(Some(&path)).await;
        self.observe_result("list", &result);
        let Err(e) = result else {
            return Ok(());
        };
        let failure = classify(&e);
        let check = match (failure.status, failure.reason) {
            (404, _) => {
                "check that the bucket exists (create it first) and the endpoint and region"
            }
            (401 | 403, _) => {
                "check the access key, the secret key and s3:ListBucket on the prefix"
            }
            (_, crate::error::FailureReason::RefusedAddress) => {
                "the endpoint resolves to a loopback, private, link-local or metadata address, which this node's tenant sinks may not reach (QUEEN_S3_ALLOW_PRIVATE_ENDPOINTS)"
            }
            (0, _) => "check the endpoint URL, the network and path style",
            _ => "check the endpoint, region, bucket and that the service is up",
        };
        Err(LakeError::Probe {
            target: self.describe(),
            failure,
            check,
        })
    }

    /// Store `bytes` under `key` unless the key is taken, and say what was there.
    ///
    /// Under [`MULTIPART_THRESHOLD_BYTES`] this is one create-only PUT; a taken key is read back
    /// and compared by sha256. From the threshold up, a HEAD first (a taken key is read back
    /// and compared), then a multipart upload of [`MULTIPART_PART_BYTES`] parts, aborted on any
    /// failure. The multipart path is not atomic against a concurrent writer of the same key,
    /// which the sink's lease rules out; two writers of one window write the same bytes anyway.
    ///
    /// A retry after an error may observe [`PutOutcome::Identical`]: the first attempt landed.
    ///
    /// # Errors
    /// [`LakeError::InvalidKey`], or [`LakeError::Store`] when a request failed (after the
    /// store's bounded retries); its `retryable` says whether trying again can help.
    pub async fn put_create(&self, key: &str, bytes: Bytes) -> Result<PutOutcome, LakeError> {
        let path = parse_key(key)?;
        let ours = sha256_hex(&bytes);
        if bytes.len() < MULTIPART_THRESHOLD_BYTES {
            let options = PutOptions {
                mode: PutMode::Create,
                ..PutOptions::default()
            };
            let result = self
                .store
                .put_opts(&path, PutPayload::from(bytes), options)
                .await;
            self.observe_result("put", &result);
            return match result {
                Ok(_) => Ok(PutOutcome::Created),
                Err(
                    object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. },
                ) => self.compare_existing(&path, key, &ours).await,
                Err(e) => Err(store_error("put", key, e)),
            };
        }
        let head = self.store.head(&path).await;
        self.observe_result("head", &head);
        match head {
            Ok(_) => self.compare_existing(&path, key, &ours).await,
            Err(object_store::Error::NotFound { .. }) => {
                self.upload_multipart(&path, key, bytes).await?;
                Ok(PutOutcome::Created)
            }
            Err(e) => Err(store_error("head", key, e)),
        }
    }

    async fn compare_existing(
        &self,
        path: &Path,
        key: &str,
        ours: &str,
    ) -> Result<PutOutcome, LakeError> {
        let existing = self
            .get_path(path, key)
            .await
            .map_err(|e| store_error("get", key, e))?;
        let theirs = sha256_hex(&existing);
        if theirs == ours {
            tracing::debug!(target: "queen-s3", key, "object already stored with the same bytes");
            Ok(PutOutcome::Identical)
        } else {
            Ok(PutOutcome::Different {
                existing_sha256: theirs,
            })
        }
    }

    async fn upload_multipart(
        &self,
        path: &Path,
        key: &str,
        bytes: Bytes,
    ) -> Result<(), LakeError> {
        let started = self.store.put_multipart(path).await;
        self.observe_result("multipart", &started);
        let mut upload = started.map_err(|e| store_error("multipart", key, e))?;
        let parts: Vec<_> = (0..bytes.len())
            .step_by(MULTIPART_PART_BYTES)
            .map(|start| {
                let end = bytes.len().min(start + MULTIPART_PART_BYTES);
                upload.put_part(PutPayload::from(bytes.slice(start..end)))
            })
            .collect();
        let mut in_flight = futures::stream::iter(parts).buffer_unordered(PARTS_IN_FLIGHT);
        let mut failure = None;
        while let Some(result) = in_flight.next().await {
            self.observe_result("multipart", &result);
            if let Err(e) = result {
                failure = Some(e);
                break;
            }
        }
        drop(in_flight);
        let failure = match failure {
            Some(e) => e,
            None => {
                let completed = upload.complete().await;
                self.observe_result("multipart", &completed);
                match completed {
                    Ok(_) => return Ok(()),
                    Err(e) => e,
                }
            }
        };
        let aborted = upload.abort().await;
        self.observe_result("multipart", &aborted);
        if let Err(abort_error) = aborted {
            // The upload's error is returned; this one is handled here, by a lifecycle rule.
            tracing::warn!(target: "queen-s3", key, error = %classify(&abort_error),
                "could not abort a failed multipart upload; a bucket lifecycle rule must remove it");
        }
        Err(store_error("multipart", key, failure))
    }

    async fn get_path(&self, path: &Path, key: &str) -> Result<Bytes, object_store::Error> {
        let result = match self.store.get(path).await {
            Ok(found) => found.bytes().await,
            Err(e) => Err(e),
        };
        self.observe_result("get", &result);
        if let Err(e) = &result
            && !matches!(e, object_store::Error::NotFound { .. })
        {
            tracing::debug!(target: "queen-s3", key, error = %classify(e), "get failed");
        }
        result
    }

    /// Read a whole object; `None` when the key holds nothing.
    ///
    /// # Errors
    /// [`LakeError::InvalidKey`] or [`LakeError::Store`].
    pub async fn get(&self, key: &str) -> Result<Option<Bytes>, LakeError> {
        let path = parse_key(key)?;
        match self.get_path(&path, key).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(store_error("get", key, e)),
        }
    }

    /// Every object under `prefix` (whole path segments: `a/b` lists `a/b/...`, not `a/bc`),
    /// recursively, as `(key, size)` sorted by key. The observer sees one `list` per call,
    /// whatever the number of pages.
    ///
    /// # Errors
    /// [`LakeError::InvalidKey`] or [`LakeError::Store`].
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, LakeError> {
        let path = parse_key(prefix)?;
        let root = path.as_ref().is_empty();
        let result: Result<Vec<_>, _> = self
            .store
            .list(if root { None } else { Some(&path) })
            .try_collect()
            .await;
        self.observe_result("list", &result);
        let metas = result.map_err(|e| store_error("list", prefix, e))?;
        let mut out: Vec<(String, u64)> = metas
            .into_iter()
            .map(|m| (m.location.to_string(), m.size))
            .collect();
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
