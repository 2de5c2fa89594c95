//! Calls to the owner of an ephemeral partition (the routes and the error that crosses them),
//! and forwarded pushes grouped per owner. A node that does not own a partition hands a
//! push to the owner over the raft port; one call per push made the hop a whole HTTP request
//! for every message. Here the pushes bound for one owner wait in that owner's lane, and at most
//! `MAX_CALLS` calls per owner carry whatever has gathered, in arrival order, each answered op
//! by op: under load a call carries many pushes, and a lone push still leaves at once (an idle
//! lane starts a call for it).
//!
//! The owner serves a call's pushes one after another, in order, as if they had come one by
//! one; each push keeps its own answer (a full queue refuses one push, not the call). A member
//! that does not know the grouped route (an older version) answers so, and the lane sends the
//! pushes one by one instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use queen_domain::ephemeral;
use queen_ports::{BrokerError, EphemeralAnswer, EphemeralOp, PeerCallError, PeerCalls};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

/// The peer route of single ephemeral operations.
pub(crate) const ROUTE: &str = "ephemeral";
/// The peer route of grouped pushes.
pub(crate) const MANY_ROUTE: &str = "ephemeral_many";
/// An error as it crosses to the node that asked.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Remote {
    /// A bound refused a push.
    Refused(ephemeral::PushRefusal),
    /// `depth` of a queue the node does not know.
    NotFound(String),
    /// Bad input.
    Invalid(String, String),
    /// Anything else (the node's own log has the detail).
    Unavailable(String),
}

impl From<BrokerError> for Remote {
    fn from(e: BrokerError) -> Self {
        match e {
            BrokerError::EphemeralRefused(r) => Remote::Refused(r),
            BrokerError::EphemeralQueueNotFound { queue } => Remote::NotFound(queue),
            BrokerError::Invalid { field, problem } => Remote::Invalid(field, problem),
            BrokerError::TooLarge { field, len, max } => {
                Remote::Invalid(field, format!("is {len} bytes; at most {max}"))
            }
            other => Remote::Unavailable(other.to_string()),
        }
    }
}

impl From<Remote> for BrokerError {
    fn from(r: Remote) -> Self {
        match r {
            Remote::Refused(r) => BrokerError::EphemeralRefused(r),
            Remote::NotFound(queue) => BrokerError::EphemeralQueueNotFound { queue },
            Remote::Invalid(field, problem) => BrokerError::Invalid { field, problem },
            Remote::Unavailable(m) => BrokerError::Unavailable(m),
        }
    }
}

/// Calls in flight to one owner at most.
const MAX_CALLS: usize = 4;
/// Pushes in one call at most.
const MAX_OPS: usize = 256;
/// Payload bytes in one call at most (a single larger push still goes, alone).
const MAX_BYTES: usize = 4 << 20;

/// What a waiting push hears: its answer, or why the hand-off failed and whether the owner was
/// unreachable (the caller marks it down).
type Outcome = Result<EphemeralAnswer, (BrokerError, bool)>;

struct Waiting {
    op: EphemeralOp,
    bytes: usize,
    reply: oneshot::Sender<Outcome>,
}

#[derive(Default)]
struct Lane {
    waiting: Vec<Waiting>,
    calls: usize,
}

/// Every owner's lane.
#[derive(Clone, Default)]
pub(crate) struct Lanes(Arc<Mutex<HashMap<u64, Lane>>>);

impl Lanes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Lane>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands push `op` to owner `to` through its lane and waits for its answer.
    pub(crate) async fn push(
        &self,
        peers: &Arc<dyn PeerCalls>,
        to: u64,
        op: EphemeralOp,
        timeout: Duration,
    ) -> Outcome {
        let bytes = match &op {
            EphemeralOp::Push { payloads, .. } => payloads.iter().map(Vec::len).sum(),
            _ => 0,
        };
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut lanes = self.lock();
            let lane = lanes.entry(to).or_default();
            lane.waiting.push(Waiting { op, bytes, reply });
            let start = lane.calls < MAX_CALLS;
            if start {
                lane.calls += 1;
            }
            start
        };
        if start {
            tokio::spawn(self.clone().send(Arc::clone(peers), to, timeout));
        }
        answer.await.unwrap_or_else(|_| {
            Err((
                BrokerError::Unavailable("the hand-off to the owner was dropped; retry".into()),
                false,
            ))
        })
    }

    /// One call slot of owner `to`'s lane: sends what has gathered until nothing waits.
    async fn send(self, peers: Arc<dyn PeerCalls>, to: u64, timeout: Duration) {
        loop {
            let batch = {
                let mut lanes = self.lock();
                let Some(lane) = lanes.get_mut(&to) else {
                    return;
                };
                if lane.waiting.is_empty() {
                    lane.calls -= 1;
                    if lane.calls == 0 {
                        lanes.remove(&to);
                    }
                    return;
                }
                let mut bytes = 0;
                let take = lane
                    .waiting
                    .iter()
                    .take(MAX_OPS)
                    .take_while(|w| {
                        bytes += w.bytes;
                        bytes <= MAX_BYTES
                    })
                    .count()
                    .max(1);
                lane.waiting.drain(..take).collect::<Vec<_>>()
            };
            let (ops, replies): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|w| (w.op, w.reply)).unzip();
            let outcomes = call_many(&*peers, to, ops, timeout).await;
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(outcome);
            }
        }
    }
}

/// Sends `ops` to `to` in one call; one outcome per op, in order.
async fn call_many(
    peers: &dyn PeerCalls,
    to: u64,
    ops: Vec<EphemeralOp>,
    timeout: Duration,
) -> Vec<Outcome> {
    let n = ops.len();
    let all = |e: BrokerError, unreachable: bool| -> Vec<Outcome> {
        (0..n).map(|_| Err((e.clone(), unreachable))).collect()
    };
    let body = match postcard::to_allocvec(&ops) {
        Ok(b) => b,
        Err(e) => return all(BrokerError::Internal(e.to_string()), false),
    };
    let reply = match peers.call(to, MANY_ROUTE, body, timeout).await {
        Ok(r) => r,
        Err(e) => {
            return all(
                unavailable(&e),
                matches!(e, PeerCallError::Unreachable { .. }),
            );
        }
    };
    match postcard::from_bytes::<Result<Vec<Result<EphemeralAnswer, Remote>>, Remote>>(&reply) {
        Ok(Ok(answers)) if answers.len() == n => answers
            .into_iter()
            .map(|a| a.map_err(|r| (BrokerError::from(r), false)))
            .collect(),
        Ok(Ok(answers)) => all(
            BrokerError::Internal(format!(
                "the owner answered {} of {n} grouped pushes",
                answers.len()
            )),
            false,
        ),
        // A member without the grouped route: one call per push, as before it.
        Ok(Err(Remote::Unavailable(m))) if m.starts_with("no peer route") => {
            let mut out = Vec::with_capacity(n);
            for op in ops {
                out.push(call_one(peers, to, &op, timeout).await);
            }
            out
        }
        Ok(Err(r)) => all(BrokerError::from(r), false),
        Err(e) => all(
            BrokerError::Internal(format!("a grouped ephemeral answer did not decode: {e}")),
            false,
        ),
    }
}

/// Sends one op to `to` on the single-op route; a failure says whether `to` was unreachable.
pub(super) async fn call_one(
    peers: &dyn PeerCalls,
    to: u64,
    op: &EphemeralOp,
    timeout: Duration,
) -> Outcome {
    let body =
        postcard::to_allocvec(op).map_err(|e| (BrokerError::Internal(e.to_string()), false))?;
    let reply = peers.call(to, ROUTE, body, timeout).await.map_err(|e| {
        (
            unavailable(&e),
            matches!(e, PeerCallError::Unreachable { .. }),
        )
    })?;
    let answer: Result<EphemeralAnswer, Remote> = postcard::from_bytes(&reply).map_err(|e| {
        (
            BrokerError::Internal(format!("an ephemeral answer did not decode: {e}")),
            false,
        )
    })?;
    answer.map_err(|r| (BrokerError::from(r), false))
}

fn unavailable(e: &PeerCallError) -> BrokerError {
    tracing::debug!(target: "queen-app", error = %e, "ephemeral hand-off failed");
    BrokerError::Unavailable(format!(
        "the node that owns this ephemeral partition did not answer ({e}); retry"
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A member that answers grouped pushes (or says it does not know the route), counting
    /// calls and the most in flight at once.
    struct Owner {
        grouped: bool,
        unreachable: bool,
        calls: AtomicUsize,
        singles: AtomicUsize,
        in_flight: AtomicUsize,
        most: AtomicUsize,
    }

    fn owner(grouped: bool, unreachable: bool) -> Arc<Owner> {
        Arc::new(Owner {
            grouped,
            unreachable,
            calls: AtomicUsize::new(0),
            singles: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        })
    }

    /// Answers a push with the number of payloads it carried.
    fn pushed(op: &EphemeralOp) -> Result<EphemeralAnswer, Remote> {
        match op {
            EphemeralOp::Push { payloads, .. } => {
                Ok(EphemeralAnswer::Pushed(payloads.len() as u64))
            }
            _ => Err(Remote::Invalid("op".into(), "not a push".into())),
        }
    }

    impl PeerCalls for Owner {
        fn me(&self) -> u64 {
            1
        }
        fn call(
            &self,
            target: u64,
            route: &'static str,
            body: Vec<u8>,
            _timeout: Duration,
        ) -> queen_ports::BoxFuture<'_, Result<Vec<u8>, PeerCallError>> {
            Box::pin(async move {
                if self.unreachable {
                    return Err(PeerCallError::Unreachable {
                        node: target,
                        detail: "connection refused".into(),
                    });
                }
                let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                self.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                let reply = if route == MANY_ROUTE {
                    self.calls.fetch_add(1, Ordering::SeqCst);
                    let ops: Vec<EphemeralOp> = postcard::from_bytes(&body).expect("ops");
                    let answer: Result<Vec<_>, Remote> = if self.grouped {
                        Ok(ops.iter().map(pushed).collect())
                    } else {
                        Err(Remote::Unavailable(format!("no peer route {route}")))
                    };
                    postcard::to_allocvec(&answer)
                } else {
                    self.singles.fetch_add(1, Ordering::SeqCst);
                    let op: EphemeralOp = postcard::from_bytes(&body).expect("op");
                    postcard::to_allocvec(&pushed(&op))
                };
                Ok(reply.expect("encode"))
            })
        }
        fn serve(&self, _handler: Arc<dyn queen_ports::PeerHandler>) {}
    }

    fn push(k: usize) -> EphemeralOp {
        EphemeralOp::Push {
            queue: "q".into(),
            partition: format!("p{}", k % 3),
            payloads: vec![b"{}".to_vec(); k % 4 + 1],
        }
    }

    /// `n` pushes at once through one lane; each one's outcome.
    async fn push_all(peers: Arc<dyn PeerCalls>, n: usize) -> Vec<Outcome> {
        let lanes = Lanes::default();
        let tasks: Vec<_> = (0..n)
            .map(|k| {
                let (lanes, peers) = (lanes.clone(), Arc::clone(&peers));
                tokio::spawn(
                    async move { lanes.push(&peers, 2, push(k), Duration::from_secs(5)).await },
                )
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("task"));
        }
        assert!(lanes.lock().is_empty(), "an idle lane is removed");
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_pushes_share_calls_and_keep_their_own_answers() {
        let o = owner(true, false);
        let got = push_all(o.clone(), 200).await;
        for (k, outcome) in got.iter().enumerate() {
            assert!(
                matches!(outcome, Ok(EphemeralAnswer::Pushed(n)) if *n == (k % 4 + 1) as u64),
                "push {k}: {outcome:?}"
            );
        }
        let calls = o.calls.load(Ordering::SeqCst);
        assert!(calls < 200, "{calls} calls for 200 pushes");
        assert!(o.most.load(Ordering::SeqCst) <= MAX_CALLS);
        assert_eq!(o.singles.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_member_without_the_grouped_route_gets_the_pushes_one_by_one() {
        let o = owner(false, false);
        let got = push_all(o.clone(), 20).await;
        assert!(
            got.iter()
                .all(|g| matches!(g, Ok(EphemeralAnswer::Pushed(_)))),
            "{got:?}"
        );
        assert_eq!(o.singles.load(Ordering::SeqCst), 20);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unreachable_owner_fails_every_waiting_push_and_says_so() {
        let got = push_all(owner(true, true), 10).await;
        assert!(
            got.iter()
                .all(|g| matches!(g, Err((BrokerError::Unavailable(_), true)))),
            "{got:?}"
        );
    }
}
