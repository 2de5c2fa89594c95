//! The broker as the node's own S3 sink sees it (the `SinkLog` port).

use queen_domain::command::{Command, Outcome};
use queen_domain::kv::{KvOp, KvOutcome};
use queen_domain::time::Stamp;
use queen_ports::{BoxFuture, BrokerError, SinkLog};

use super::Broker;

/// The node's own S3 sink: its KV writes (leases, intents, commit pointers, checkpoints) pass a
/// closed disk gate, like acks, so a node above the gate keeps committing its backlog to the
/// lake; only the reserve stops them.
impl SinkLog for Broker {
    fn sink_kv(&self, ops: Vec<KvOp>) -> BoxFuture<'_, Result<KvOutcome, BrokerError>> {
        Box::pin(
            self.proposer
                .propose_internal_for(Command::Kv(ops), Outcome::into_kv),
        )
    }

    fn sink_barrier(&self) -> BoxFuture<'_, Result<(), BrokerError>> {
        Box::pin(self.proposer.read_barrier())
    }

    fn applied(&self) -> Box<dyn queen_domain::StateRead + Send + '_> {
        self.state.view()
    }

    fn directory(&self) -> Box<dyn queen_domain::StateRead + Send + '_> {
        match self.directory.get() {
            Some(home) => home.view(),
            None => self.state.view(),
        }
    }

    fn wall_clock(&self) -> Stamp {
        Stamp(self.clock.now_micros())
    }

    fn alone(&self) -> bool {
        self.membership
            .as_ref()
            .is_none_or(|m| m.members().len() <= 1)
    }

    fn open_stored(&self, stored: &[u8]) -> queen_ports::Opened {
        self.cipher.open(stored)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use queen_domain::kv::{Expiry, KvResult};
    use queen_ports::ClientApi;

    use super::*;
    use crate::broker::twins::{FakeLog, ManualClock, MemState, broker};

    fn lease_put() -> Vec<KvOp> {
        vec![KvOp::Put {
            ns: "queen-s3".into(),
            key: "lease/orders".into(),
            value: b"{\"holder\":\"n1\"}".to_vec(),
            expiry: Expiry::Ttl(30),
            expect: Some(0),
            required: true,
        }]
    }

    #[tokio::test]
    async fn above_the_gate_the_sinks_writes_commit_and_a_clients_do_not() {
        let log = FakeLog::leader(MemState::default());
        let b = broker(&log, Arc::new(ManualClock::at(1)), Duration::from_secs(5))
            .with_disk_gate(50, 0);
        b.set_disk_use(1 << 30, (1 << 30) / 10 * 9);
        assert!(matches!(
            b.kv(lease_put()).await.unwrap_err(),
            BrokerError::DiskFull(_)
        ));
        let out = b
            .sink_kv(lease_put())
            .await
            .expect("the sink's lease write");
        assert_eq!(out.failed, None, "{out:?}");
        assert!(matches!(
            out.results.first(),
            Some(KvResult::Write { applied: true, .. })
        ));
        assert!(b.alone(), "no raft group: alone");
        assert!(b.sink_barrier().await.is_ok());
    }
}
