//! The client side of the raft port: openraft's `RaftNetworkV2` over HTTP/1 with a pooled
//! hyper client, plus the app-level calls a follower makes to the leader (`/forward`,
//! `/read_index`).
//!
//! Every request carries the shared token (when set). Timeouts come from `rpc_timeout` (`append_budget.rs`):
//! openraft's budget, never under a second, plus time for an append's bytes; appends to a target
//! shrink after a failure and grow back after successes. Transport failures become
//! `Unreachable` (openraft backs off and retries); a reply that cannot be decoded becomes
//! `NetworkError`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use http_body_util::BodyExt;
use http_body_util::Full;
use http_body_util::StreamBody;
use http_body_util::combinators::BoxBody;
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use hyper_util::rt::TokioIo;
use openraft::errors::NetworkError;
use openraft::errors::RPCError;
use openraft::errors::ReplicationClosed;
use openraft::errors::StreamingError;
use openraft::errors::Unreachable;
use openraft::network::RPCOption;
use openraft::network::RaftNetworkFactory;
use openraft::network::v2::RaftNetworkV2;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::AppendEntriesResponse;
use openraft::raft::SnapshotResponse;
use openraft::raft::StreamAppendResult;
use openraft::raft::TransferLeaderRequest;
use openraft::raft::TransferLeaderResponse;
use openraft::raft::VoteRequest;
use openraft::raft::VoteResponse;

use crate::append_budget::{entries_within, next_append_budget, rpc_timeout};
use crate::config::MAX_APPEND_BYTES;
use crate::state_machine::Snapshot;
use crate::state_machine::SnapshotData;
use crate::type_config::NodeInfo;
use crate::type_config::TypeConfig;
use crate::type_config::Vote;
use crate::wire;

/// Error type of request bodies.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body of every outgoing request.
type ReqBody = BoxBody<Bytes, BoxError>;

/// Idle pooled connections kept per peer: as many as requests a node may have in flight to one
/// peer at once (forwarded writes, ephemeral operations), so a busy node does not open and
/// close a connection per request (8 made a third of an ephemeral push's CPU connection churn).
const POOL_IDLE_PER_HOST: usize = 128;
/// How long an idle pooled connection is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Upper bound of a whole snapshot transfer (chunks also time out one by one).
const SNAPSHOT_TOTAL_TIMEOUT: Duration = Duration::from_secs(600);
/// Why a call over the raft port failed.
#[derive(Debug)]
pub(crate) enum CallError {
    /// No connection could be made: nothing was sent.
    Connect(String),
    /// No answer within the deadline: the request may have arrived.
    Timeout,
    /// The connection failed after the request may have been sent.
    Sent(String),
    /// The peer answered with a non-success status.
    Status(u16, String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Connect(e) => write!(f, "connect failed: {e}"),
            CallError::Timeout => write!(f, "timed out"),
            CallError::Sent(e) => write!(f, "failed after sending: {e}"),
            CallError::Status(s, b) => write!(f, "status {s}: {b}"),
        }
    }
}

/// Test only: drops every call to the node ids listed in a file (comma or whitespace
/// separated), re-read at most every 100 ms. A partition is made by listing each side in the
/// other side's file, so calls fail in both directions. Built only when `faults_file` is set
/// (`QUEEN_TEST_FAULTS=1`); without it no call looks at any file.
pub(crate) struct Faults {
    /// The file the test writes.
    path: std::path::PathBuf,
    /// The ids read last, and when.
    cache: std::sync::Mutex<(Option<std::time::Instant>, std::collections::BTreeSet<u64>)>,
}

impl Faults {
    /// How long a read of the file is reused.
    const REFRESH: Duration = Duration::from_millis(100);

    pub(crate) fn new(path: std::path::PathBuf) -> Self {
        tracing::warn!(path = %path.display(), "TEST FAULT LAYER ENABLED: raft traffic to the node ids in this file is dropped");
        Self {
            path,
            cache: std::sync::Mutex::new((None, Default::default())),
        }
    }

    /// Whether calls to `target` are dropped now.
    pub(crate) fn blocks(&self, target: u64) -> bool {
        let Ok(mut cache) = self.cache.lock() else {
            return false;
        };
        let fresh = cache.0.is_some_and(|t| t.elapsed() < Self::REFRESH);
        if !fresh {
            let text = std::fs::read_to_string(&self.path).unwrap_or_default();
            cache.1 = text
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter_map(|t| t.trim().parse().ok())
                .collect();
            cache.0 = Some(std::time::Instant::now());
        }
        cache.1.contains(&target)
    }
}

/// The shared HTTP client of one node (one connection pool for all peers).
pub(crate) struct Transport {
    /// Pooled HTTP/1 client.
    client: Client<HttpConnector, ReqBody>,
    /// The shared secret sent with every request.
    token: Option<String>,
    /// Test only: the fault layer.
    faults: Option<Faults>,
}

impl Transport {
    /// The shared secret this transport sends (the server expects the same).
    pub(crate) fn token(&self) -> Option<String> {
        self.token.clone()
    }

    /// A client with a connection pool, sending `token` with every request; `faults` drops
    /// calls to chosen nodes (tests only).
    pub(crate) fn new(token: Option<String>, faults: Option<Faults>) -> Arc<Self> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(POOL_IDLE_PER_HOST)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .build(connector);
        Arc::new(Self {
            client,
            token,
            faults,
        })
    }

    /// POST `body` to node `target` at `http://addr{path}` and return the reply body of a 200
    /// answer.
    pub(crate) async fn post(
        &self,
        target: u64,
        addr: &str,
        path: &str,
        body: ReqBody,
        timeout: Duration,
    ) -> Result<Bytes, CallError> {
        let req = hyper::Request::builder()
            .method(hyper::Method::POST)
            .uri(format!("http://{addr}{path}"))
            .header(hyper::header::CONTENT_TYPE, "application/octet-stream");
        self.send(target, req, body, timeout, |resp| async move {
            let status = resp.status();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| CallError::Sent(e.to_string()))?
                .to_bytes();
            if status != hyper::StatusCode::OK {
                let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
                return Err(CallError::Status(status.as_u16(), text));
            }
            Ok(bytes)
        })
        .await
    }

    /// Send `req` (with the token) to node `target` and hand its answer to `then`, all within
    /// `timeout`. The test fault layer fails it as a connection that could not be made.
    async fn send<T, F, Fut>(
        &self,
        target: u64,
        mut req: hyper::http::request::Builder,
        body: ReqBody,
        timeout: Duration,
        then: F,
    ) -> Result<T, CallError>
    where
        F: FnOnce(hyper::Response<hyper::body::Incoming>) -> Fut,
        Fut: Future<Output = Result<T, CallError>>,
    {
        if self.blocks(target) {
            // Like a partition: nothing arrives. Wait a little so retry loops do not spin.
            tokio::time::sleep(timeout.min(Duration::from_millis(50))).await;
            return Err(CallError::Connect(format!(
                "test fault: traffic to node {target} is dropped"
            )));
        }
        if let Some(t) = &self.token {
            req = req.header(wire::TOKEN_HEADER, t.as_str());
        }
        let req = req
            .body(body)
            .map_err(|e| CallError::Connect(format!("bad request: {e}")))?;
        let call = async {
            let resp = self.client.request(req).await.map_err(|e| {
                if e.is_connect() {
                    CallError::Connect(e.to_string())
                } else {
                    CallError::Sent(e.to_string())
                }
            })?;
            then(resp).await
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout),
        }
    }

    /// Whether the test fault layer drops traffic to `target` now.
    pub(crate) fn blocks(&self, target: u64) -> bool {
        self.faults.as_ref().is_some_and(|f| f.blocks(target))
    }

    /// Open a pipelined append stream to `target`: an upgraded connection.
    pub(crate) async fn open_stream(
        &self,
        target: u64,
        addr: &str,
        timeout: Duration,
    ) -> Result<TokioIo<hyper::upgrade::Upgraded>, CallError> {
        let req = hyper::Request::builder()
            .method(hyper::Method::POST)
            .uri(format!("http://{addr}{}", wire::STREAM))
            .header(hyper::header::CONNECTION, "upgrade")
            .header(hyper::header::UPGRADE, wire::STREAM_PROTOCOL);
        self.send(
            target,
            req,
            full(Bytes::new()),
            timeout,
            |resp| async move {
                if resp.status() != hyper::StatusCode::SWITCHING_PROTOCOLS {
                    return Err(CallError::Status(resp.status().as_u16(), String::new()));
                }
                let up = hyper::upgrade::on(resp)
                    .await
                    .map_err(|e| CallError::Sent(e.to_string()))?;
                Ok(TokioIo::new(up))
            },
        )
        .await
    }

    /// POST an encoded value and decode the reply.
    pub(crate) async fn call<Req, Resp>(
        &self,
        target: u64,
        addr: &str,
        path: &str,
        req: &Req,
        timeout: Duration,
        capacity: usize,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Req: serde::Serialize,
        Resp: for<'de> serde::Deserialize<'de>,
    {
        let body = wire::encode_sized(req, capacity)
            .map_err(|e| RPCError::Network(NetworkError::from_string(e)))?;
        let bytes = self
            .post(target, addr, path, full(body), timeout)
            .await
            .map_err(|e| {
                RPCError::Unreachable(Unreachable::from_string(format!("{addr}{path}: {e}")))
            })?;
        wire::decode(&bytes).map_err(|e| RPCError::Network(NetworkError::from_string(e)))
    }
}

/// A complete body.
pub(crate) fn full(b: Bytes) -> ReqBody {
    Full::new(b).map_err(|never| match never {}).boxed()
}

/// What a stream of appends yields per append.
type StreamAnswer = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

/// Hands openraft one client per target, all sharing the node's connection pool.
#[derive(Clone)]
pub(crate) struct NetworkFactory {
    /// The shared transport.
    pub(crate) transport: Arc<Transport>,
}

/// openraft's client for one target.
pub(crate) struct NetworkClient {
    /// The target's node id.
    target: u64,
    /// The target's raft address.
    addr: String,
    /// The shared transport.
    transport: Arc<Transport>,
    /// Bytes of commands the next append may carry (see [`next_append_budget`]).
    append_budget: usize,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = NetworkClient;

    async fn new_client(&mut self, target: u64, node: &NodeInfo) -> NetworkClient {
        tracing::debug!(target, addr = %node.raft_addr, "raft peer client");
        NetworkClient {
            target,
            addr: node.raft_addr.clone(),
            transport: self.transport.clone(),
            append_budget: MAX_APPEND_BYTES,
        }
    }
}

impl RaftNetworkV2<TypeConfig> for NetworkClient {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        // Bodies on the raft port are bounded: send the entries that fit in the budget (at most
        // MAX_APPEND_BYTES, at least one entry) and tell openraft how far this append went; it
        // sends the rest next.
        let (keep, bytes) = entries_within(&rpc.entries, self.append_budget);
        let cut = keep < rpc.entries.len();
        if cut {
            rpc.entries.truncate(keep);
        }
        let last = rpc.entries.last().map(|e| e.log_id);
        let sent: Result<AppendEntriesResponse<TypeConfig>, _> = self
            .transport
            .call(
                self.target,
                &self.addr,
                wire::APPEND,
                &rpc,
                rpc_timeout(&option, bytes),
                bytes + 64 * keep + 256,
            )
            .await;
        if keep > 0 {
            self.append_budget = next_append_budget(self.append_budget, sent.is_ok());
        }
        Ok(match sent? {
            AppendEntriesResponse::Success if cut => AppendEntriesResponse::PartialSuccess(last),
            other => other,
        })
    }

    /// Appends as a pipelined stream (see `crate::stream`). A stream of one append (a heartbeat,
    /// a probe of where the follower's log matches) goes as a plain call on a pooled connection
    /// instead, with the byte budget of [`Self::append_entries`].
    fn stream_append<'s, S>(
        &'s mut self,
        mut input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, StreamAnswer>, RPCError<TypeConfig>>>
    where
        S: futures::Stream<Item = AppendEntriesRequest<TypeConfig>>
            + openraft::OptionalSend
            + Unpin
            + 'static,
    {
        Box::pin(async move {
            let Some(first) = input.next().await else {
                return Ok(Box::pin(futures::stream::empty()) as BoxStream<'s, StreamAnswer>);
            };
            // openraft's one-shot streams end right after their append; a replication stream
            // waits for more entries (or has them already).
            let second = match input.next().now_or_never() {
                Some(None) => {
                    let prev = first.prev_log_id;
                    let last = first.entries.last().map(|e| e.log_id).or(prev);
                    let r = self.append_entries(first, option).await;
                    return Ok(Box::pin(futures::stream::once(async move {
                        r.map(|r| r.into_stream_result(prev, last))
                    })) as BoxStream<'s, StreamAnswer>);
                }
                Some(Some(second)) => Some(second),
                None => None,
            };
            let io = self
                .transport
                .open_stream(self.target, &self.addr, crate::stream::OPEN_TIMEOUT)
                .await
                .map_err(|e| {
                    RPCError::Unreachable(Unreachable::from_string(format!(
                        "{}{}: {e}",
                        self.addr,
                        wire::STREAM
                    )))
                })?;
            let input = futures::stream::iter(std::iter::once(first).chain(second)).chain(input);
            let transport = self.transport.clone();
            let target = self.target;
            let blocked = move || transport.blocks(target);
            Ok(Box::pin(crate::stream::client(io, input, option, blocked))
                as BoxStream<'s, StreamAnswer>)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.transport
            .call(
                self.target,
                &self.addr,
                wire::VOTE,
                &rpc,
                rpc_timeout(&option, 0),
                256,
            )
            .await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.transport
            .call(
                self.target,
                &self.addr,
                wire::PRE_VOTE,
                &rpc,
                rpc_timeout(&option, 0),
                256,
            )
            .await
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.transport
            .call(
                self.target,
                &self.addr,
                wire::TRANSFER_LEADER,
                &req,
                rpc_timeout(&option, 0),
                256,
            )
            .await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let SnapshotData::Pinned(view) = snapshot.snapshot else {
            return Err(StreamingError::Network(NetworkError::from_string(
                "only a pinned snapshot can be sent",
            )));
        };
        let header = wire::encode(&(vote, snapshot.meta))
            .map_err(|e| StreamingError::Network(NetworkError::from_string(e)))?;
        let per_chunk = option.soft_ttl();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(2);
        // Read chunks off the pinned view one at a time and feed them to the request body;
        // a chunk that is not taken within the per-chunk timeout aborts the transfer.
        let producer = tokio::spawn(async move {
            let send = |f: Bytes| {
                let tx = tx.clone();
                async move {
                    match tokio::time::timeout(per_chunk, tx.send(Ok(Frame::data(f)))).await {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(_)) => Err("snapshot receiver went away".to_string()),
                        Err(_) => Err("snapshot chunk timed out".to_string()),
                    }
                }
            };
            send(wire::frame(wire::FRAME_HEADER, &header)).await?;
            let mut i = 0usize;
            loop {
                let v = view.clone();
                let chunk = tokio::task::spawn_blocking(move || v.chunk(i))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string());
                match chunk {
                    Ok(Some(c)) => send(wire::frame(wire::FRAME_CHUNK, &c)).await?,
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.send(Err(e.clone().into())).await;
                        return Err(e);
                    }
                }
                i += 1;
            }
            send(wire::frame(wire::FRAME_END, &[])).await?;
            Ok::<usize, String>(i)
        });
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        let body: ReqBody = BodyExt::boxed(StreamBody::new(stream));
        let addr = self.addr.clone();
        let target = self.target;
        let transport = self.transport.clone();
        let request = async move {
            transport
                .post(target, &addr, wire::SNAPSHOT, body, SNAPSHOT_TOTAL_TIMEOUT)
                .await
        };
        let result = tokio::select! {
            closed = cancel => {
                producer.abort();
                return Err(StreamingError::Closed(closed));
            }
            r = request => r,
        };
        producer.abort();
        let bytes = result.map_err(|e| {
            StreamingError::Unreachable(Unreachable::from_string(format!(
                "{}: snapshot: {e}",
                self.addr
            )))
        })?;
        wire::decode(&bytes).map_err(|e| StreamingError::Network(NetworkError::from_string(e)))
    }
}
