//! The queue's lease row and the fenced KV batches written under it.

use super::*;

impl QueueTask {
    pub(super) fn ttl_secs(&self) -> u64 {
        self.shared.settings.lease_ttl_ms.div_ceil(1000)
    }

    pub(super) fn lease_doc(&self) -> Vec<u8> {
        serde_json::to_vec(&LeaseDoc {
            holder: self.shared.settings.instance.clone(),
            since: wall_iso(),
        })
        .unwrap_or_default()
    }

    pub(super) fn lease_key(&self) -> String {
        documents::lease_key(&self.shared.settings.name, &self.queue)
    }

    /// Read the queue's lease row: free, written under this instance's name (a run of this
    /// node before a restart), or held by another instance.
    pub(in crate::sink) async fn look(&self) -> Result<Look, String> {
        let got = self
            .shared
            .log
            .sink_kv(vec![KvOp::Get {
                ns: NS.into(),
                key: self.lease_key(),
            }])
            .await
            .map_err(|e| e.to_string())?;
        let current = match got.results.first() {
            Some(KvResult::Get(row)) => row.clone(),
            _ => None,
        };
        Ok(match current {
            None => Look::Free,
            Some(row) => {
                let holder = serde_json::from_slice::<LeaseDoc>(&row.value)
                    .map(|d| d.holder)
                    .unwrap_or_default();
                if holder == self.shared.settings.instance {
                    Look::Mine(row.version)
                } else {
                    Look::Held {
                        holder,
                        expires: row.expires,
                    }
                }
            }
        })
    }

    /// Write the lease row at version `expect` (0: put-if-absent): `Ok(None)` when it is ours,
    /// `Ok(Some(holder))` when another instance got there first.
    pub(in crate::sink) async fn take(&mut self, expect: u64) -> Result<Option<String>, String> {
        let put = KvOp::Put {
            ns: NS.into(),
            key: self.lease_key(),
            value: self.lease_doc(),
            expiry: Expiry::Ttl(self.ttl_secs()),
            expect: Some(expect),
            required: true,
        };
        let out = self
            .shared
            .log
            .sink_kv(vec![put])
            .await
            .map_err(|e| e.to_string())?;
        match write_result(&out, 0) {
            Some((true, Some(row))) => {
                self.lease_version = row.version;
                self.lease_refreshed = Instant::now();
                Ok(None)
            }
            Some((false, Some(row))) => Ok(Some(
                serde_json::from_slice::<LeaseDoc>(&row.value)
                    .map(|d| d.holder)
                    .unwrap_or_default(),
            )),
            _ => Err("the lease write answered nothing".into()),
        }
    }

    /// One KV batch whose first operation rewrites the lease row at the version this node last
    /// wrote: the fence.
    pub(super) async fn fenced(&mut self, mut rest: Vec<KvOp>) -> Result<(), BatchError> {
        let mut ops = vec![KvOp::Put {
            ns: NS.into(),
            key: self.lease_key(),
            value: self.lease_doc(),
            expiry: Expiry::Ttl(self.ttl_secs()),
            expect: Some(self.lease_version),
            required: true,
        }];
        ops.append(&mut rest);
        let out = self
            .shared
            .log
            .sink_kv(ops)
            .await
            .map_err(|e| BatchError::Retry(e.to_string()))?;
        if out.failed == Some(0) {
            self.shared
                .telemetry
                .metrics()
                .s3()
                .precondition_lost(&self.metric);
            return Err(BatchError::Fenced);
        }
        if let Some(i) = out.failed {
            return Err(BatchError::Retry(format!(
                "operation {i} of the batch was refused"
            )));
        }
        match write_result(&out, 0) {
            Some((true, Some(row))) => {
                self.lease_version = row.version;
                self.lease_refreshed = Instant::now();
                Ok(())
            }
            _ => Err(BatchError::Retry("the lease write answered nothing".into())),
        }
    }

    pub(super) async fn put_doc(&mut self, key: String, value: Vec<u8>) -> Result<(), BatchError> {
        self.fenced(vec![KvOp::Put {
            ns: NS.into(),
            key,
            value,
            expiry: Expiry::Forever,
            expect: None,
            required: true,
        }])
        .await
    }
}

pub(super) fn write_result(out: &KvOutcome, i: usize) -> Option<(bool, Option<KvRowView>)> {
    match out.results.get(i)? {
        KvResult::Write {
            applied, current, ..
        } => Some((*applied, current.clone())),
        _ => None,
    }
}
