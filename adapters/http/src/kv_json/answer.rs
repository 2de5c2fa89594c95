//! KV answers: rows, per-operation results and a batch's outcome, values written back as stored.

use super::*;

/// A row as answered; `value` is the stored text, verbatim (left out when keys only).
#[derive(Serialize)]
pub(crate) struct RowOut<'a> {
    key: &'a str,
    version: u64,
    #[serde(rename = "expiresAt")]
    expires_at: Option<String>,
    #[serde(rename = "updatedAt")]
    updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<StoredJson<'a>>,
}

fn row(r: &KvRowView, keys_only: bool) -> RowOut<'_> {
    RowOut {
        key: &r.key,
        version: r.version,
        expires_at: r.expires.map(|e| e.iso_millis()),
        updated_at: r.updated.iso_millis(),
        value: (!keys_only).then_some(StoredJson(&r.value)),
    }
}

/// The shape of one result, by kind of operation.
#[derive(Serialize)]
#[serde(untagged)]
enum ResultBody<'a> {
    Found {
        #[serde(flatten)]
        row: RowOut<'a>,
        found: bool,
    },
    Missing {
        found: bool,
        key: &'a str,
    },
    Many {
        rows: Vec<RowOut<'a>>,
        missing: &'a [String],
        truncated: bool,
    },
    Prefix {
        rows: Vec<RowOut<'a>>,
        truncated: bool,
        #[serde(rename = "nextAfter")]
        next_after: Option<&'a str>,
    },
    Write {
        applied: bool,
        value: Option<StoredJson<'a>>,
        version: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<&'a str>,
        /// Present (maybe null) only when there is a current row.
        #[serde(rename = "expiresAt", skip_serializing_if = "Option::is_none")]
        expires_at: Option<Option<String>>,
    },
}

/// One KV result as answered; a transaction adds `opIndex` and `type`.
#[derive(Serialize)]
pub(crate) struct ResultOut<'a> {
    #[serde(flatten)]
    body: ResultBody<'a>,
    index: usize,
    op: &'static str,
    #[serde(rename = "opIndex", skip_serializing_if = "Option::is_none")]
    op_index: Option<usize>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
}

impl ResultOut<'_> {
    /// The result as a transaction lists it: `index` counts every result before it.
    pub(crate) fn in_transaction(mut self, index: usize) -> Self {
        self.op_index = Some(self.index);
        self.index = index;
        self.kind = Some("kv");
        self
    }
}

/// One KV result.
pub(crate) fn result<'a>(i: usize, op: &'a KvOp, r: &'a KvResult) -> ResultOut<'a> {
    let body = match r {
        KvResult::Get(Some(row_v)) => ResultBody::Found {
            row: row(row_v, false),
            found: true,
        },
        KvResult::Get(None) => ResultBody::Missing {
            found: false,
            key: match op {
                KvOp::Get { key, .. } => key,
                _ => "",
            },
        },
        KvResult::Many { rows, missing } => ResultBody::Many {
            rows: rows.iter().map(|r| row(r, false)).collect(),
            missing,
            truncated: false,
        },
        KvResult::Prefix {
            rows,
            truncated,
            next_after,
            keys_only,
        } => ResultBody::Prefix {
            rows: rows.iter().map(|r| row(r, *keys_only)).collect(),
            truncated: *truncated,
            next_after: next_after.as_deref(),
        },
        KvResult::Write {
            applied,
            reason,
            current,
        } => ResultBody::Write {
            applied: *applied,
            value: current.as_ref().map(|c| StoredJson(&c.value)),
            version: current.as_ref().map(|c| c.version),
            reason: reason.as_deref(),
            expires_at: current.as_ref().map(|c| c.expires.map(|e| e.iso_millis())),
        },
    };
    ResultOut {
        body,
        index: i,
        op: op_name(op),
        op_index: None,
        kind: None,
    }
}

/// What a lost required precondition reports: its reason, and the current version and value.
#[derive(Serialize)]
pub(crate) struct Failure<'a> {
    #[serde(rename = "kvReason")]
    kv_reason: Option<&'a str>,
    version: Option<u64>,
    value: Option<StoredJson<'a>>,
}

/// The failure fields of a result (all null when it is not a write).
pub(crate) fn failure(r: &KvResult) -> Failure<'_> {
    match r {
        KvResult::Write {
            reason, current, ..
        } => Failure {
            kv_reason: reason.as_deref(),
            version: current.as_ref().map(|c| c.version),
            value: current.as_ref().map(|c| StoredJson(&c.value)),
        },
        _ => Failure {
            kv_reason: None,
            version: None,
            value: None,
        },
    }
}

/// A KV call's answer: index-aligned `results`, plus the verdict of a lost required precondition.
#[derive(Serialize)]
pub(crate) struct OutcomeOut<'a> {
    ok: bool,
    results: Vec<ResultOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    #[serde(rename = "failedIndex", skip_serializing_if = "Option::is_none")]
    failed_index: Option<usize>,
    #[serde(flatten)]
    failure: Option<Failure<'a>>,
}

/// A KV call's answer.
pub(crate) fn outcome<'a>(ops: &'a [KvOp], o: &'a KvOutcome) -> OutcomeOut<'a> {
    let results = ops
        .iter()
        .zip(&o.results)
        .enumerate()
        .map(|(i, (op, r))| result(i, op, r))
        .collect();
    let failed = o.failed.filter(|f| *f < o.results.len());
    OutcomeOut {
        ok: failed.is_none(),
        results,
        reason: failed.map(|_| "kv_precondition"),
        failed_index: failed,
        failure: failed.map(|f| failure(&o.results[f])),
    }
}
