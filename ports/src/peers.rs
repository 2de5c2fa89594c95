//! Application calls between the nodes of a cluster, over the raft port (authenticated like
//! raft traffic): an ephemeral operation handed to the node that owns its partition.

use std::sync::Arc;
use std::time::Duration;

use crate::replicated_log::BoxFuture;

/// Why a call to another node did not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerCallError {
    /// The node could not be reached (not connected, no such member): nothing arrived.
    #[error("node {node} could not be reached: {detail}")]
    Unreachable {
        /// The node.
        node: u64,
        /// Why.
        detail: String,
    },
    /// The call was sent but no answer came back in time, or the answer was an error.
    #[error("node {node} did not answer: {detail}")]
    Failed {
        /// The node.
        node: u64,
        /// Why.
        detail: String,
    },
}

/// Serves the calls other nodes make to this one.
pub trait PeerHandler: Send + Sync + 'static {
    /// Answer one call to `route` with `body`.
    fn handle(&self, route: String, body: Vec<u8>) -> BoxFuture<'static, Vec<u8>>;
}

/// Calls between the members of a cluster.
pub trait PeerCalls: Send + Sync + 'static {
    /// This node's id.
    fn me(&self) -> u64;
    /// Send `body` to `route` on node `target` and wait for its answer.
    ///
    /// # Errors
    /// See [`PeerCallError`].
    fn call(
        &self,
        target: u64,
        route: &'static str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<Vec<u8>, PeerCallError>>;
    /// Answer other nodes' calls with `handler` from now on.
    fn serve(&self, handler: Arc<dyn PeerHandler>);
}
