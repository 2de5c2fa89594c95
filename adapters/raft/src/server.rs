//! The server side of the raft port: a small HTTP/1 server that hands raft RPCs to openraft and
//! serves the app-level routes: `/forward` and `/read_index` (a follower's commands and reads),
//! `/membership` (a follower's membership change), `/info` (the log format this node reads).
//!
//! With a token configured, a request without the right `x-queen-raft-token` is answered 401
//! (compared in constant time; the refusal is logged without the token).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use bytes::BytesMut;
use http_body_util::BodyExt;
use http_body_util::Full;
use hyper::Request;
use hyper::Response;
use hyper::StatusCode;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use openraft::ReadPolicy;
use tokio::net::TcpListener;
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::body_limits::BodyLimits;
use crate::error::map_read_error;
use crate::error::map_write_error;
use crate::membership::change_here;
use crate::network::Transport;
use crate::state_machine::Raft;
use crate::state_machine::Snapshot;
use crate::state_machine::SnapshotData;
use crate::type_config::Command;
use crate::type_config::SnapshotMeta;
use crate::type_config::Vote;
use crate::wire;
use queen_ports::MembershipChange;

/// How long the receiver waits for the next piece of a streamed snapshot.
const SNAPSHOT_FRAME_TIMEOUT: Duration = Duration::from_secs(30);

/// What the handlers need.
struct Ctx {
    /// Body bounds.
    limits: BodyLimits,
    /// The local raft node.
    raft: Raft,
    /// The expected token.
    token: Option<String>,
    /// This node's id, for logs.
    node_id: u64,
    /// The client side of the raft port (a membership change may ask the new node first).
    transport: Arc<Transport>,
    /// What `/info` answers: the highest log format this node reads and its group count.
    info: wire::InfoReply,
    /// The application's handler of peer calls, and when a leader last reached this node.
    shared: Shared,
    /// Raised when the server stops: append streams, which outlive the connection task they
    /// were upgraded from, end with it.
    stop: watch::Receiver<bool>,
}

/// Where the application's handler of peer calls is put once the application runs.
pub(crate) type AppHandler = Arc<std::sync::OnceLock<Arc<dyn queen_ports::PeerHandler>>>;

/// When this node last accepted an append (entries or a heartbeat) from a leader: a follower
/// that has not for longer than an election timeout is cut off, whatever leader it remembers
/// (with pre-vote, a cut-off follower keeps its term and its leader's id).
#[derive(Debug)]
pub(crate) struct LeaderContact {
    /// The origin of `last_ms`.
    base: std::time::Instant,
    /// Milliseconds from `base` to the last contact; `u64::MAX` before the first.
    last_ms: std::sync::atomic::AtomicU64,
}

impl Default for LeaderContact {
    fn default() -> Self {
        Self {
            base: std::time::Instant::now(),
            last_ms: std::sync::atomic::AtomicU64::new(u64::MAX),
        }
    }
}

impl LeaderContact {
    /// A leader's append was accepted now.
    pub(crate) fn touch(&self) {
        let ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.last_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Milliseconds since the last contact, `None` before the first.
    pub(crate) fn since_ms(&self) -> Option<u64> {
        let last = self.last_ms.load(std::sync::atomic::Ordering::Relaxed);
        (last != u64::MAX).then(|| {
            u64::try_from(self.base.elapsed().as_millis())
                .unwrap_or(u64::MAX)
                .saturating_sub(last)
        })
    }
}

/// What the raft port shares with the rest of the node.
#[derive(Clone, Default)]
pub(crate) struct Shared {
    /// The application's handler of calls from other nodes, once it registered one.
    pub(crate) app: AppHandler,
    /// When a leader's append was last accepted here.
    pub(crate) contact: Arc<LeaderContact>,
}

/// A running raft-port server.
pub(crate) struct RaftServer {
    /// Tells the accept loop and every connection to stop.
    stop: watch::Sender<bool>,
    /// The accept loop.
    accept: JoinHandle<()>,
}

impl RaftServer {
    /// Bind `addr` and serve raft RPCs for `raft`.
    pub(crate) async fn start(
        addr: &str,
        raft: Raft,
        node_id: u64,
        transport: Arc<Transport>,
        info: wire::InfoReply,
        limits: BodyLimits,
        shared: Shared,
    ) -> std::io::Result<RaftServer> {
        // The port expects the secret its own node sends.
        let token = transport.token();
        let listener = TcpListener::bind(addr).await?;
        tracing::info!(node_id, addr, "raft port listening");
        let (stop, stop_rx) = watch::channel(false);
        let ctx = Arc::new(Ctx {
            limits,
            raft,
            token,
            node_id,
            transport,
            info,
            shared,
            stop: stop_rx.clone(),
        });
        let accept = tokio::spawn(accept_loop(listener, ctx, stop_rx));
        Ok(RaftServer { stop, accept })
    }

    /// Stop accepting, close every connection, and wait for the accept loop to end.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.accept.await;
    }
}

async fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            _ = stop.changed() => break,
            a = listener.accept() => a,
        };
        let (stream, _peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "raft port accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let ctx = ctx.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let ctx = ctx.clone();
                async move { Ok::<_, Infallible>(handle(ctx, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::select! {
                _ = stop.changed() => {}
                r = conn => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "raft port connection ended");
                    }
                }
            }
        });
    }
}

fn reply(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r
}

fn ok(body: Result<Bytes, String>) -> Response<Full<Bytes>> {
    match body {
        Ok(b) => reply(StatusCode::OK, b),
        Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, Bytes::from(e)),
    }
}

fn fail(status: StatusCode, e: impl std::fmt::Display) -> Response<Full<Bytes>> {
    reply(status, Bytes::from(e.to_string()))
}

async fn handle(ctx: Arc<Ctx>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if let Some(expected) = &ctx.token {
        let given = req
            .headers()
            .get(wire::TOKEN_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if !wire::ct_eq(given, expected.as_bytes()) {
            tracing::warn!(
                node_id = ctx.node_id,
                path = req.uri().path(),
                token_present = !given.is_empty(),
                "raft port refused a request with a wrong or missing token"
            );
            return fail(StatusCode::UNAUTHORIZED, "bad raft token");
        }
    }
    if req.method() != hyper::Method::POST {
        return fail(StatusCode::METHOD_NOT_ALLOWED, "POST only");
    }
    let path = req.uri().path().to_string();
    if path == wire::STREAM {
        return upgrade_stream(&ctx, req);
    }
    if path == wire::SNAPSHOT {
        return receive_snapshot(&ctx, req.into_body()).await;
    }
    let (body, _held) = match read_body(&ctx.limits, req).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    let raft = &ctx.raft;
    match path.as_str() {
        wire::APPEND => match wire::decode(&body) {
            Ok(rpc) => match raft.append_entries(rpc).await {
                Ok(r) => {
                    // A stale leader's append (answered with our higher vote) is no contact.
                    if !matches!(r, openraft::raft::AppendEntriesResponse::HigherVote(_)) {
                        ctx.shared.contact.touch();
                    }
                    ok(wire::encode(&r))
                }
                Err(e) => fail(StatusCode::SERVICE_UNAVAILABLE, e),
            },
            Err(e) => fail(StatusCode::BAD_REQUEST, e),
        },
        wire::VOTE => match wire::decode(&body) {
            Ok(rpc) => match raft.vote(rpc).await {
                Ok(r) => ok(wire::encode(&r)),
                Err(e) => fail(StatusCode::SERVICE_UNAVAILABLE, e),
            },
            Err(e) => fail(StatusCode::BAD_REQUEST, e),
        },
        wire::PRE_VOTE => match wire::decode(&body) {
            Ok(rpc) => match raft.pre_vote(rpc).await {
                Ok(r) => ok(wire::encode(&r)),
                Err(e) => fail(StatusCode::SERVICE_UNAVAILABLE, e),
            },
            Err(e) => fail(StatusCode::BAD_REQUEST, e),
        },
        wire::TRANSFER_LEADER => match wire::decode(&body) {
            Ok(rpc) => match raft.handle_transfer_leader(rpc).await {
                Ok(r) => ok(wire::encode(&r)),
                Err(e) => fail(StatusCode::SERVICE_UNAVAILABLE, e),
            },
            Err(e) => fail(StatusCode::BAD_REQUEST, e),
        },
        wire::FORWARD => {
            let r: wire::ForwardReply = match raft.client_write(Command(body.clone())).await {
                Ok(resp) => Ok(wire::Forwarded {
                    index: resp.log_id.index,
                    data: resp.data.into_bytes(),
                }),
                Err(e) => Err(map_write_error(e).into()),
            };
            ok(wire::encode(&r))
        }
        wire::READ_INDEX => {
            let r: wire::ReadIndexReply =
                match raft.ensure_linearizable(ReadPolicy::ReadIndex).await {
                    Ok(read) => Ok(read.log_id().index),
                    Err(e) => Err(map_read_error(e).into()),
                };
            ok(wire::encode(&r))
        }
        wire::INFO => ok(wire::encode(&ctx.info)),
        wire::MEMBERSHIP => match wire::decode::<MembershipChange>(&body) {
            Ok(op) => {
                let r: wire::MembershipReply =
                    change_here(raft, ctx.node_id, &ctx.transport, op).await;
                ok(wire::encode(&r))
            }
            Err(e) => fail(StatusCode::BAD_REQUEST, e),
        },
        p if p.starts_with(wire::APP_PREFIX) => match ctx.shared.app.get() {
            Some(h) => {
                let route = p[wire::APP_PREFIX.len()..].to_owned();
                ok(Ok(Bytes::from(h.handle(route, body.to_vec()).await)))
            }
            None => fail(
                StatusCode::SERVICE_UNAVAILABLE,
                "the node is still starting",
            ),
        },
        _ => fail(StatusCode::NOT_FOUND, "no such route"),
    }
}

/// Answer an append stream's upgrade and serve the stream on the upgraded connection.
fn upgrade_stream(ctx: &Arc<Ctx>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let ctx = ctx.clone();
    let mut stop = ctx.stop.clone();
    tokio::spawn(async move {
        let serve = async {
            match hyper::upgrade::on(req).await {
                Ok(up) => {
                    let touched = ctx.clone();
                    let touch = move || touched.shared.contact.touch();
                    crate::stream::serve(ctx.raft.clone(), TokioIo::new(up), &ctx.limits, touch)
                        .await;
                }
                Err(e) => tracing::debug!(error = %e, "raft stream upgrade failed"),
            }
        };
        // Dropping the stream's future on stop closes it (and its reader, see `serve`).
        tokio::select! {
            _ = stop.wait_for(|s| *s) => {}
            () = serve => {}
        }
    });
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    r.headers_mut().insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("upgrade"),
    );
    r.headers_mut().insert(
        hyper::header::UPGRADE,
        hyper::header::HeaderValue::from_static(wire::STREAM_PROTOCOL),
    );
    r
}

/// Read a whole body within the port's bounds; the permit holds its bytes in the budget until
/// the answer is built.
async fn read_body(
    limits: &BodyLimits,
    req: Request<Incoming>,
) -> Result<(Bytes, OwnedSemaphorePermit), Response<Full<Bytes>>> {
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let too_large = || {
        fail(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("raft-port bodies are at most {} bytes", limits.max_bytes),
        )
    };
    // Raft RPCs declare their length (full bodies; hyper leaves it out only when empty): the
    // whole of it is reserved before a byte is read. An undeclared body is read up to the limit
    // and then takes its budget.
    let len = declared.unwrap_or(0);
    if len > limits.max_bytes {
        return Err(too_large());
    }
    let busy = || {
        fail(
            StatusCode::SERVICE_UNAVAILABLE,
            "the raft port holds its limit of request bodies in memory; retry",
        )
    };
    let reserve = |n: usize| {
        u32::try_from(n)
            .ok()
            .and_then(|n| limits.budget.clone().try_acquire_many_owned(n).ok())
    };
    let mut permit = reserve(len).ok_or_else(busy)?;
    let limited = http_body_util::Limited::new(
        req.into_body(),
        if declared.is_some() {
            len
        } else {
            limits.max_bytes
        },
    );
    let bytes = match tokio::time::timeout(limits.timeout, limited.collect()).await {
        Err(_) => {
            return Err(fail(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive in time",
            ));
        }
        Ok(Err(e))
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return Err(too_large());
        }
        Ok(Err(e)) => return Err(fail(StatusCode::BAD_REQUEST, e)),
        Ok(Ok(b)) => b.to_bytes(),
    };
    if bytes.len() > len {
        permit.merge(reserve(bytes.len() - len).ok_or_else(busy)?);
    }
    Ok((bytes, permit))
}

/// Receive a streamed snapshot (header, chunks, end marker), spooling its chunks to a file as
/// they arrive (memory holds one frame at a time, the disk bounds the whole), and install it.
async fn receive_snapshot(ctx: &Ctx, mut body: Incoming) -> Response<Full<Bytes>> {
    let mut buf = BytesMut::new();
    let mut header: Option<(Vote, SnapshotMeta)> = None;
    let mut spool = match ctx.limits.snapshot_spool.create().await {
        Ok(w) => w,
        Err(e) => return spool_failed(ctx, "create", &e),
    };
    let mut ended = false;
    while !ended {
        let next = match tokio::time::timeout(SNAPSHOT_FRAME_TIMEOUT, body.frame()).await {
            Ok(n) => n,
            Err(_) => return fail(StatusCode::REQUEST_TIMEOUT, "snapshot stream stalled"),
        };
        match next {
            None => break,
            Some(Err(e)) => return fail(StatusCode::BAD_REQUEST, e),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
        }
        while let Some(len) = wire::frame_len(&buf) {
            // A chunk is a few MiB at most: a frame past the body limit is never buffered.
            if len > ctx.limits.max_bytes {
                return fail(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "snapshot frame of {len} bytes is above the raft port's limit of {}",
                        ctx.limits.max_bytes
                    ),
                );
            }
            let Some((tag, payload)) = wire::take_frame(&mut buf) else {
                break;
            };
            match tag {
                wire::FRAME_HEADER => match wire::decode(&payload) {
                    Ok(h) => header = Some(h),
                    Err(e) => return fail(StatusCode::BAD_REQUEST, e),
                },
                wire::FRAME_CHUNK => {
                    if let Err(e) = spool.push(&payload).await {
                        return spool_failed(ctx, "write", &e);
                    }
                }
                wire::FRAME_END => {
                    ended = true;
                    break;
                }
                t => return fail(StatusCode::BAD_REQUEST, format!("unknown frame tag {t}")),
            }
        }
    }
    if !ended {
        return fail(StatusCode::BAD_REQUEST, "snapshot stream truncated");
    }
    let Some((vote, meta)) = header else {
        return fail(StatusCode::BAD_REQUEST, "snapshot stream has no header");
    };
    let spooled = match spool.finish().await {
        Ok(s) => s,
        Err(e) => return spool_failed(ctx, "sync", &e),
    };
    tracing::info!(
        node_id = ctx.node_id,
        chunks = spooled.chunks(),
        bytes = spooled.bytes(),
        last_log_id = ?meta.last_log_id,
        "snapshot received"
    );
    let snapshot = Snapshot {
        meta,
        snapshot: SnapshotData::Received(spooled),
    };
    match ctx.raft.install_full_snapshot(vote, snapshot).await {
        Ok(r) => ok(wire::encode(&r)),
        Err(e) => fail(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

/// A spool file that could not be written (a full disk among the causes): logged here, once, and
/// answered 507 so the leader retries the transfer later. The partial file goes with its writer.
fn spool_failed(ctx: &Ctx, step: &'static str, e: &std::io::Error) -> Response<Full<Bytes>> {
    tracing::warn!(node_id = ctx.node_id, step, error = %e, "could not spool a received snapshot");
    fail(
        StatusCode::INSUFFICIENT_STORAGE,
        format!("snapshot spool {step} failed: {e}"),
    )
}
