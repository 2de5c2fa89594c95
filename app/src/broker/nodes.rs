//! Every member's own raft figures in one answer (`GET /api/v1/system/raft/nodes`): this node's
//! from itself, the others' asked over the raft port, so an operator (or the dashboard) sees
//! each node's role, term, commit and applied index without reaching every node.

use std::time::Duration;

use queen_ports::{BrokerError, ClientApi};
use serde_json::{Value, json};

use super::Broker;

/// The peer route that answers a node's own figures.
pub(super) const NODE_ROUTE: &str = "NODE";

/// How long a member may take to answer before it is shown unreachable.
const ASK_FOR: Duration = Duration::from_secs(1);

/// The most sink rows one node's answer carries (a node holding more lists the first ones and
/// says how many it left out).
const SINK_ROWS: usize = 1000;

impl Broker {
    /// This node's figures, as `/health` has them, and the S3 sink's rows of the queues this
    /// node writes (the figures only their writer knows: windows, records, lag, lost ranges).
    pub(super) fn node_figures(&self) -> Value {
        let h = self.health();
        let p = h.progress;
        let mut figures = json!({
            "nodeId": p.node_id,
            "role": p.role,
            "leaderId": p.leader,
            "term": p.term,
            "commit": p.commit,
            "applied": p.applied,
            "lastLog": p.last_log,
            "status": h.not_ready.map_or("healthy", |n| n.as_str()),
            "reachable": true,
        });
        if let Some(s3) = self.s3_status.get().map(|f| f())
            && !s3.is_null()
        {
            figures["sink"] = held_rows(&s3);
        }
        figures
    }

    /// Every member's figures, this node's first; a member that does not answer within a
    /// second is listed `reachable: false`.
    pub(super) async fn cluster_nodes(&self) -> Result<Value, BrokerError> {
        let mine = self.node_figures();
        let (Some(peers), Some(membership)) = (&self.peers, &self.membership) else {
            return Ok(json!({"nodes": [mine]}));
        };
        let me = peers.me();
        let mut asks = tokio::task::JoinSet::new();
        for m in membership.members() {
            if m.id == me {
                continue;
            }
            let peers = peers.clone();
            asks.spawn(async move {
                let answer = peers.call(m.id, NODE_ROUTE, Vec::new(), ASK_FOR).await;
                let figures = answer
                    .ok()
                    .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                    .filter(Value::is_object);
                figures.unwrap_or_else(|| {
                    json!({"nodeId": m.id, "reachable": false, "http": m.http, "voter": m.voter})
                })
            });
        }
        let mut nodes = vec![mine];
        while let Some(done) = asks.join_next().await {
            if let Ok(v) = done {
                nodes.push(v);
            }
        }
        nodes[1..].sort_by_key(|n| n["nodeId"].as_u64().unwrap_or(u64::MAX));
        Ok(json!({"nodes": nodes}))
    }
}

/// The rows of the queues this node's sinks run (`running`), each with its sink's name, at
/// most `SINK_ROWS` of them.
fn held_rows(s3: &Value) -> Value {
    let mut rows = Vec::new();
    let mut left_out = 0_usize;
    for sink in s3["sinks"].as_array().into_iter().flatten() {
        for q in sink["queues"].as_array().into_iter().flatten() {
            if q["running"] != true {
                continue;
            }
            if rows.len() == SINK_ROWS {
                left_out += 1;
                continue;
            }
            let mut row = q.clone();
            row["sink"] = sink["name"].clone();
            rows.push(row);
        }
    }
    json!({"phase": s3["phase"], "queues": rows, "leftOut": left_out})
}
