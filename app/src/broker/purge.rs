//! The tenant purge use case: one bounded pass per call, run as ordinary commands so every
//! replica applies the same deletions. Timers go first (a timer left behind would push into,
//! and so bring back, a queue this pass deletes), then the queues, then the ephemeral queues
//! (their messages live only in the owners' memory, so each owner is told to drop them), then
//! the KV rows.

use queen_domain::command::{Command, Outcome};
use queen_domain::kv::KvOp;
use queen_domain::tenant::{Tenant, purge};
use queen_domain::timers::TimerOp;
use queen_ports::{BrokerError, ClientApi, EphemeralAnswer, EphemeralOp, PurgeReport};

use super::Broker;

impl Broker {
    pub(super) async fn purge_pass(&self, tenant: &Tenant) -> Result<PurgeReport, BrokerError> {
        self.proposer.read_barrier().await?;
        let plan = purge::plan(&*self.state.view(), tenant).map_err(|e| Self::read_error(&e))?;
        if !plan.timers.is_empty() {
            let ops = plan
                .timers
                .iter()
                .map(|(queue, key)| TimerOp::Cancel {
                    queue: queue.clone(),
                    key: key.clone(),
                })
                .collect();
            self.propose(Command::Timers(ops)).await?;
        }
        for (queue, _) in &plan.queues {
            self.delete_queue(queue.clone()).await?;
        }
        let ephemeral = self.purge_ephemeral(tenant).await?;
        if !plan.rows.is_empty() {
            let ops = plan
                .rows
                .iter()
                .map(|(ns, key)| KvOp::Delete {
                    ns: ns.clone(),
                    key: key.clone(),
                    expect: None,
                    required: false,
                })
                .collect();
            let out = self.propose(Command::Kv(ops)).await?.outcome;
            if !matches!(out, Outcome::Kv(_)) {
                return Err(BrokerError::unexpected_outcome());
            }
        }
        let report = PurgeReport {
            partitions_deleted: plan.partitions(),
            done: !plan.more,
        };
        tracing::info!(target: "queen", tenant = tenant.id(), queues = plan.queues.len(), timers = plan.timers.len(), ephemeral, rows = plan.rows.len(), partitions = report.partitions_deleted, done = report.done, "tenant purge pass");
        Ok(report)
    }

    /// Deletes every ephemeral queue of `tenant` on every live member (its rings, leases and
    /// cursors, and its configuration row); answers how many there were.
    async fn purge_ephemeral(&self, tenant: &Tenant) -> Result<usize, BrokerError> {
        let EphemeralAnswer::Queues(queues) = self
            .ephemeral_op(EphemeralOp::Queues {
                tenant: tenant.id().to_owned(),
            })
            .await?
        else {
            return Err(BrokerError::unexpected_outcome());
        };
        for q in &queues {
            self.ephemeral_op(EphemeralOp::Delete {
                queue: q.queue.clone(),
            })
            .await?;
        }
        Ok(queues.len())
    }
}
