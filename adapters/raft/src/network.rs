//! The raft network. This issue runs a single node, so there is nobody to talk to: every RPC to
//! any target fails with `Unreachable`, which openraft treats as "back off and retry".
//!
//! The HTTP transport on the raft port (shared token checked in constant time, streamed
//! snapshots with per-chunk timeouts) arrives with the cluster issue and replaces this module.

use std::future::Future;

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
use openraft::raft::VoteRequest;
use openraft::raft::VoteResponse;

use crate::state_machine::SnapshotData;
use crate::type_config::NodeInfo;
use crate::type_config::Snapshot;
use crate::type_config::TypeConfig;
use crate::type_config::Vote;

/// Hands out clients that cannot reach anyone (no transport yet).
#[derive(Debug, Default, Clone)]
pub(crate) struct NoTransportFactory;

/// A client for one target that has no transport to reach it.
#[derive(Debug, Clone)]
pub(crate) struct NoTransportClient {
    /// The node openraft wanted to reach, for the error message.
    target: u64,
}

impl NoTransportClient {
    fn unreachable(&self) -> Unreachable<TypeConfig> {
        Unreachable::from_string(format!(
            "node {} is unreachable: this build has no raft transport (single node only)",
            self.target
        ))
    }
}

impl RaftNetworkFactory<TypeConfig> for NoTransportFactory {
    type Network = NoTransportClient;

    async fn new_client(&mut self, target: u64, _node: &NodeInfo) -> NoTransportClient {
        tracing::warn!(
            target,
            "raft asked for a peer client, but no transport exists yet"
        );
        NoTransportClient { target }
    }
}

impl RaftNetworkV2<TypeConfig> for NoTransportClient {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        Err(RPCError::Unreachable(self.unreachable()))
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        Err(RPCError::Unreachable(self.unreachable()))
    }

    async fn full_snapshot(
        &mut self,
        _vote: Vote,
        _snapshot: Snapshot,
        _cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        Err(StreamingError::Unreachable(self.unreachable()))
    }
}
