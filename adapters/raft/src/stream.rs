//! Pipelined replication: openraft's `stream_append` over one connection per stream.
//!
//! With one append in flight per follower, entries that arrive while an append waits for its
//! answer wait a whole round trip (the follower's write and `fdatasync`) before they are even
//! sent. A stream sends each append as openraft makes it, without waiting for the answer to the
//! one before; the follower hands them to its raft node in order, as one stream, and answers
//! them in order on the same connection.
//!
//! The connection is an HTTP/1 upgrade of `POST /raft/stream_append` (the token is checked
//! before it is upgraded). Frames are a big-endian u32 length and a postcard body: appends one
//! way, `Result<StreamAppendResult, String>` the other.
//!
//! Bounds:
//! - an append is sent in frames of at most [`MAX_APPEND_BYTES`] of commands (one entry at
//!   least), each answered; the leader hands openraft the last answer of the append (or the
//!   first refusal);
//! - the follower refuses a frame over its body limit, reserves each frame's bytes from the raft
//!   port's body budget until raft has taken it, and gives a started frame the body timeout to
//!   arrive;
//! - the leader gives every frame the RPC deadline of its bytes ([`rpc_timeout`]): an answer
//!   that does not come in time ends the stream as unreachable, and openraft opens another;
//! - the test fault layer ends a stream as soon as its target is listed.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use futures::Stream;
use futures::StreamExt;
use openraft::errors::NetworkError;
use openraft::errors::RPCError;
use openraft::errors::Unreachable;
use openraft::network::RPCOption;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::StreamAppendError;
use openraft::raft::StreamAppendResult;
use tokio::io::AsyncRead;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWrite;
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::append_budget::entries_within;
use crate::append_budget::rpc_timeout;
use crate::body_limits::BodyLimits;
use crate::config::MAX_APPEND_BYTES;
use crate::state_machine::Raft;
use crate::type_config::TypeConfig;
use crate::wire;

/// What the follower answers per frame.
type FrameAnswer = Result<StreamAppendResult<TypeConfig>, String>;
/// What openraft gets per append.
type Answer = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;
type Request = AppendEntriesRequest<TypeConfig>;

/// Read a frame's length: `None` at a clean end of the stream.
async fn read_len<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<usize>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => Ok(Some(u32::from_be_bytes(len) as usize)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// A frame of `n` bytes in a buffer of its own (the leader reads its small answer frames so).
async fn read_body<R: AsyncRead + Unpin>(r: &mut R, n: usize) -> std::io::Result<Vec<u8>> {
    let mut b = Vec::new();
    read_body_into(r, &mut b, n).await?;
    Ok(b)
}

/// The largest receive buffer a follower's stream keeps between frames; a larger frame (a
/// follower catching up reads appends of up to [`MAX_APPEND_BYTES`]) gets a buffer of its own
/// that is freed after it.
const KEPT_FRAME_BUFFER: usize = 1 << 20;

/// Read a frame of `n` bytes into `buf`, which keeps its pages from frame to frame. A fresh
/// buffer per frame is fresh memory: the allocator hands freed pages back to the system within
/// a fifth of a second, so the kernel faulted in and zeroed every page of every append it
/// copied in (4% of a follower's samples under batch pushes). Nothing is zeroed here: the
/// socket's bytes are written into the spare capacity.
async fn read_body_into<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    n: usize,
) -> std::io::Result<()> {
    use bytes::BufMut as _;
    buf.clear();
    if buf.capacity() > KEPT_FRAME_BUFFER && n <= KEPT_FRAME_BUFFER {
        *buf = Vec::new();
    }
    buf.reserve_exact(n);
    while buf.len() < n {
        let want = n - buf.len();
        if r.read_buf(&mut (&mut *buf).limit(want)).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, b: &[u8]) -> std::io::Result<()> {
    let n = u32::try_from(b.len()).map_err(std::io::Error::other)?;
    w.write_all(&n.to_be_bytes()).await?;
    w.write_all(b).await?;
    w.flush().await
}

// ---- the follower's side ----

/// Serve one stream: read appends, hand them to raft as one stream, write its answers. `touch`
/// notes a leader's contact (not for an append refused for a higher vote).
pub(crate) async fn serve<IO>(
    raft: Raft,
    io: IO,
    limits: &BodyLimits,
    touch: impl Fn() + Send + Sync + 'static,
) where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    // Raft takes the appends one by one: two waiting is enough to keep it busy.
    let (tx, rx) = tokio::sync::mpsc::channel::<(Request, tokio::sync::OwnedSemaphorePermit)>(2);
    let max = limits.max_bytes;
    let budget = limits.budget.clone();
    let body_timeout = limits.timeout;
    // Aborted when the stream ends or its future is dropped (the server stopped).
    let reader = AbortOnDrop(tokio::spawn(async move {
        let mut body = Vec::new();
        loop {
            let n = match read_len(&mut rd).await {
                Ok(Some(n)) if n <= max => n,
                Ok(Some(n)) => {
                    tracing::warn!(
                        bytes = n,
                        max,
                        "raft stream frame over the body limit; stream closed"
                    );
                    break;
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "raft stream ended");
                    break;
                }
            };
            let Ok(permit) = budget
                .clone()
                .acquire_many_owned(u32::try_from(n).unwrap_or(u32::MAX))
                .await
            else {
                break;
            };
            match tokio::time::timeout(body_timeout, read_body_into(&mut rd, &mut body, n)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "raft stream ended inside a frame");
                    break;
                }
                Err(_) => {
                    tracing::warn!("a raft stream frame did not arrive in time; stream closed");
                    break;
                }
            }
            let req = match wire::decode::<Request>(&body) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "undecodable raft stream frame; stream closed");
                    break;
                }
            };
            if tx.send((req, permit)).await.is_err() {
                break;
            }
        }
    }));
    let mut rx = rx;
    // The permit of an append is released once raft has taken it from the stream.
    let input = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(|(r, _)| r)));
    let mut out = std::pin::pin!(raft.stream_append(input));
    while let Some(r) = out.next().await {
        let a: FrameAnswer = match r {
            Ok(r) => {
                if !matches!(r, Err(StreamAppendError::HigherVote(_))) {
                    touch();
                }
                Ok(r)
            }
            Err(fatal) => Err(fatal.to_string()),
        };
        let last = !matches!(a, Ok(Ok(_)));
        let Ok(b) = wire::encode(&a) else { break };
        if write_frame(&mut wr, &b).await.is_err() || last {
            break;
        }
    }
    let _ = wr.shutdown().await;
    drop(reader);
}

// ---- the leader's side ----

/// A frame sent and not yet answered: when its answer is due, and whether it is the last
/// frame of its append (the one whose answer openraft gets).
struct Sent {
    due: Instant,
    last: bool,
}

/// What the writer and the reader of one stream share.
#[derive(Default)]
struct Pending {
    sent: Mutex<VecDeque<Sent>>,
    /// Raised by the writer after each frame, so the reader arms its deadline.
    wrote: Notify,
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Sent>> {
        self.sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// An append cut into frames of at most [`MAX_APPEND_BYTES`] of commands (one entry at least),
/// each continuing where the one before ended; with the bytes of each.
fn frames(req: Request) -> Vec<(Request, usize)> {
    let Request {
        vote,
        mut prev_log_id,
        leader_commit,
        mut entries,
    } = req;
    let mut out = Vec::new();
    loop {
        let (keep, bytes) = entries_within(&entries, MAX_APPEND_BYTES);
        let rest = entries.split_off(keep.min(entries.len()));
        let last_id = entries.last().map(|e| e.log_id).or(prev_log_id);
        out.push((
            Request {
                vote,
                prev_log_id,
                leader_commit,
                entries,
            },
            bytes,
        ));
        if rest.is_empty() {
            return out;
        }
        prev_log_id = last_id;
        entries = rest;
    }
}

/// Send every append of `input` as it comes, over `io`, and yield the answers in order.
/// `blocked` tells whether the test fault layer drops traffic to the target now.
pub(crate) fn client<IO, S>(
    io: IO,
    input: S,
    option: RPCOption,
    blocked: impl Fn() -> bool + Send + 'static,
) -> impl Stream<Item = Answer> + Send + 'static
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    S: Stream<Item = Request> + Send + Unpin + 'static,
{
    let (rd, mut wr) = tokio::io::split(io);
    let pending = Arc::new(Pending::default());
    let p = pending.clone();
    let writer = tokio::spawn(async move {
        let mut input = input;
        'appends: while let Some(req) = input.next().await {
            let parts = frames(req);
            let count = parts.len();
            for (i, (part, bytes)) in parts.into_iter().enumerate() {
                if blocked() {
                    break 'appends;
                }
                let Ok(b) = wire::encode_sized(&part, bytes + 64 * part.entries.len() + 256) else {
                    break 'appends;
                };
                p.lock().push_back(Sent {
                    due: Instant::now() + rpc_timeout(&option, bytes),
                    last: i + 1 == count,
                });
                p.wrote.notify_one();
                if write_frame(&mut wr, &b).await.is_err() {
                    break 'appends;
                }
            }
        }
        let _ = wr.shutdown().await;
    });
    let state = Reader {
        rd,
        pending,
        _writer: AbortOnDrop(writer),
        done: false,
    };
    futures::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        let a = s.next_answer().await?;
        if a.is_err() || matches!(a, Ok(Err(_))) {
            s.done = true;
        }
        Some((a, s))
    })
}

/// The reading half of a stream, with what it waits for.
struct Reader<R> {
    rd: R,
    pending: Arc<Pending>,
    _writer: AbortOnDrop,
    done: bool,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    /// The answer of the next append: `None` when the stream ended with nothing owed.
    async fn next_answer(&mut self) -> Option<Answer> {
        loop {
            let frame = match self.next_frame().await {
                Ok(Some(f)) => f,
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            };
            let last = self.pending.lock().pop_front().is_none_or(|s| s.last);
            match wire::decode::<FrameAnswer>(&frame) {
                // A frame before the last of its append: its answer is only progress.
                Ok(Ok(Ok(_))) if !last => {}
                Ok(Ok(r)) => return Some(Ok(r)),
                Ok(Err(e)) => return Some(Err(RPCError::Network(NetworkError::from_string(e)))),
                Err(e) => return Some(Err(RPCError::Network(NetworkError::from_string(e)))),
            }
        }
    }

    /// The next answer frame, within the deadline of the oldest frame owed one.
    async fn next_frame(&mut self) -> Result<Option<Vec<u8>>, RPCError<TypeConfig>> {
        let unreachable = |what: String| RPCError::Unreachable(Unreachable::from_string(what));
        let pending = self.pending.clone();
        let read = async {
            let Some(n) = read_len(&mut self.rd).await? else {
                return Ok(None);
            };
            if n > wire::MAX_REPLY_BYTES {
                return Err(std::io::Error::other(format!("answer frame of {n} bytes")));
            }
            read_body(&mut self.rd, n).await.map(Some)
        };
        let mut read = std::pin::pin!(read);
        loop {
            let due = pending.lock().front().map(|s| s.due);
            let wrote = pending.wrote.notified();
            tokio::select! {
                r = &mut read => {
                    return match r {
                        Ok(Some(b)) => Ok(Some(b)),
                        // The follower closed the stream: owed answers make it a failure.
                        Ok(None) if pending.lock().is_empty() => Ok(None),
                        Ok(None) => Err(unreachable("the follower closed the stream".into())),
                        Err(e) => Err(unreachable(e.to_string())),
                    };
                }
                () = wrote => {}
                () = sleep_until(due) => {
                    return Err(unreachable("no answer within the deadline".into()));
                }
            }
        }
    }
}

/// Sleep until `due`, or forever without one.
async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How long a stream's upgrade may take.
pub(crate) const OPEN_TIMEOUT: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests;
