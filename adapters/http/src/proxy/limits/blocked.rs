//! What a push block refuses once the body is read. The gate refuses pushes and the other
//! growing writes by their route before any body byte is read; two routes are told apart from
//! their harmless twins only by their body: a `configure` that would make a new queue (a stored
//! queue may still be configured, e.g. to shorten its retention) and a lock `acquire` (a
//! release or renewal frees or keeps what is there).

use queen_domain::StateRead;
use queen_domain::kv::LockOp;
use queen_domain::tenant::Tenant;
use serde_json::Value;

/// Whether the body of `segs` adds stored data to `tenant`'s: a new queue, a new lock permit.
/// A body that does not parse adds nothing (its handler refuses it).
pub(super) fn grows(state: &dyn StateRead, tenant: &Tenant, segs: &[&str], body: &[u8]) -> bool {
    match segs {
        ["api", "v1", "configure"] => {
            let Ok(v) = serde_json::from_slice::<Value>(body) else {
                return false;
            };
            let Some(queue) = v.get("queue").and_then(Value::as_str) else {
                return false;
            };
            matches!(
                queen_domain::reads::queue(state, &tenant.name(queue)),
                Ok(None)
            )
        }
        ["api", "v1", "locks"] => crate::kv_json::lock_ops(body, &String::new)
            .is_ok_and(|ops| ops.iter().any(|op| matches!(op, LockOp::Acquire { .. }))),
        _ => false,
    }
}
