//! The writes of a request under its tenant: a push body read once (JSON or QPB1), the push
//! and the transaction. Kept apart from the route table because the streams routes and the
//! embedded proxy's push path call them too, and they must not reach back into the router.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use queen_domain::command::{TxnOp, TxnOutcome};
use queen_domain::ids::LeaseId;
use queen_domain::kv::KvOp;
use queen_domain::timers::TimerOp;

use crate::api::ApiError;
use crate::error::{json_response, text_response};
use crate::tenancy::Scope;
use crate::{json, push_binary, render};
use queen_ports::ClientApi;

/// How a request body is written, from its `content-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyKind {
    /// JSON (any content type but the binary one; the default).
    Json,
    /// `application/x-queen-push`: QPB1 on push, QTB1 on transaction.
    Binary {
        /// Most bytes the body may decompress to in all (the body limit).
        max_decoded: usize,
    },
}

/// A push body, read and checked: its items as the client named them, in wire order.
pub(crate) struct PushBody {
    pub(crate) items: Vec<queen_domain::command::PushItem>,
    /// Answer `{"count", "queued", "duplicate", "error"}` instead of one object per item (QPB1).
    counts: bool,
}

/// Read a push body of either kind: a body that is not valid is refused here, before anything
/// is proposed. The embedded proxy reads it with this too and checks the plan on the items, so
/// a body is parsed once whoever looks at it.
pub(crate) fn push_body(body: &[u8], kind: BodyKind) -> Result<PushBody, ApiError> {
    Ok(match kind {
        BodyKind::Json => PushBody {
            items: json::push_items(body)?,
            counts: false,
        },
        BodyKind::Binary { max_decoded } => {
            let b = push_binary::push(body, max_decoded)?;
            PushBody {
                items: b.items,
                counts: b.counts,
            }
        }
    })
}

/// Push the items of a body under the request's tenant and answer as the body asked.
pub(crate) async fn push<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    mut b: PushBody,
) -> Result<Response<Full<Bytes>>, ApiError> {
    let out = if b.items.is_empty() {
        Vec::new()
    } else {
        scope.push(&mut b.items);
        let mut out = api.push(b.items, scope.producer.clone()).await?;
        scope.push_answers(&mut out);
        out
    };
    Ok(if b.counts {
        json_response(200, &render::push_counts(&out))
    } else {
        text_response(200, "application/json", render::push(&out))
    })
}

/// A transaction under the request's tenant; its answer names things as the client did.
pub(crate) async fn transaction<A: ClientApi>(
    api: &Arc<A>,
    scope: &Scope,
    mut ops: Vec<TxnOp>,
    leases: Vec<LeaseId>,
    kv: &[KvOp],
    mut timers: Vec<TimerOp>,
) -> Result<TxnOutcome, ApiError> {
    let mut kv = kv.to_vec();
    if scope.guarded() {
        let state = api.state();
        // Another tenant's lease is answered as an unknown one.
        for l in &leases {
            if !scope.lease_ours(&*state, l.as_str())? {
                return Ok(TxnOutcome::lease_not_live(l));
            }
        }
        scope.transaction(Some(&*state), &mut ops, &mut kv, &mut timers)?;
    } else {
        scope.transaction(None, &mut ops, &mut kv, &mut timers)?;
    }
    let mut out = api
        .transaction(ops, leases, kv, timers, scope.producer.clone())
        .await?;
    scope.transaction_answer(&mut out);
    Ok(out)
}
