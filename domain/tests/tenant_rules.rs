//! Tenants in the state machine: two tenants' queues, groups, locks and KV rows of the same
//! names never meet, and a purge pass names exactly one tenant's state.

mod common;
use common::*;
use queen_domain::kv::{Expiry, KvOp, LockOp, LockResult};
use queen_domain::tenant::{Tenant, purge};
use queen_domain::timers::TimerOp;

fn tenants() -> (Tenant, Tenant) {
    (
        Tenant::parse("11111111-2222-4333-8444-555555555555").unwrap(),
        Tenant::default(),
    )
}

fn q(t: &Tenant) -> String {
    t.queue("orders").unwrap().as_str().to_owned()
}

#[test]
fn the_same_queue_name_is_two_queues() {
    let (a, d) = tenants();
    let mut s = Sim::new();
    s.push(&q(&a), "p", "a-1");
    s.push(&q(&d), "p", "d-1");
    s.push(&q(&d), "p", "d-2");
    assert_eq!(txns(&s.pop(&q(&a), None, 10)), vec!["a-1"]);
    assert_eq!(txns(&s.pop(&q(&d), None, 10)), vec!["d-1", "d-2"]);
    let listed = |t: &Tenant| -> Vec<String> {
        reads::tenant_queues(&s.store, t, 100)
            .unwrap()
            .into_iter()
            .map(|r| t.local(&r.name).to_owned())
            .collect()
    };
    assert_eq!(listed(&a), vec!["orders"]);
    assert_eq!(listed(&d), vec!["orders"]);
}

#[test]
fn a_group_command_without_a_queue_stays_in_its_tenant() {
    let (a, d) = tenants();
    let mut s = Sim::new();
    for t in [&a, &d] {
        s.push(&q(t), "p", "m");
        s.pop(&q(t), Some("g"), 10);
    }
    let g = GroupName::new("g").unwrap();
    let out = s.apply(Command::Resubscribe {
        group: a.group_everywhere(g.clone()),
        from: queen_domain::time::Stamp(1),
    });
    assert!(matches!(out, Outcome::Resubscribed { rows: 1 }), "{out:?}");
    let out = s.apply(Command::DeleteGroup {
        group: d.group_everywhere(g),
        queue: None,
        delete_metadata: true,
    });
    assert!(
        matches!(
            out,
            Outcome::GroupDeleted {
                partitions: 1,
                metadata: 1
            }
        ),
        "{out:?}"
    );
    // Tenant a's group still has its cursor: its message is not delivered again.
    assert!(s.pop(&q(&a), Some("g"), 10).is_empty());
}

#[test]
fn locks_of_the_same_name_are_two_locks() {
    let (a, d) = tenants();
    let mut s = Sim::new();
    let acquire = |t: &Tenant, owner: &str| LockOp::Acquire {
        name: t.name("job"),
        ttl: 60,
        owner: owner.into(),
        limit: 1,
    };
    let Outcome::Locks(r) = s.apply(Command::Locks(vec![acquire(&a, "x"), acquire(&d, "y")]))
    else {
        panic!()
    };
    assert!(
        r.iter()
            .all(|r| matches!(r, LockResult::Acquired { already: false, .. })),
        "{r:?}"
    );
}

#[test]
fn a_purge_pass_names_only_its_tenants_state() {
    let (a, d) = tenants();
    let mut s = Sim::new();
    let put = |t: &Tenant| KvOp::Put {
        ns: t.name("cfg"),
        key: "k".into(),
        value: b"1".to_vec(),
        expiry: Expiry::Forever,
        expect: None,
        required: false,
    };
    let timer = |t: &Tenant| TimerOp::Schedule {
        queue: t.queue("orders").unwrap(),
        key: "later".into(),
        payload: b"{}".to_vec(),
        delay_ms: 60_000,
        txn: "t".into(),
        partition: None,
        message_id: [7; 16],
        reschedule: false,
    };
    for t in [&a, &d] {
        s.push(&q(t), "p", "m");
        s.apply(Command::Kv(vec![put(t)]));
        s.apply(Command::Timers(vec![timer(t)]));
    }
    let p = purge::plan(&s.store, &a).unwrap();
    assert_eq!(p.queues, vec![(a.queue("orders").unwrap(), 1)]);
    assert_eq!(p.rows, vec![(a.name("cfg"), "k".to_owned())]);
    assert_eq!(
        p.timers,
        vec![(a.queue("orders").unwrap(), "later".to_owned())]
    );
    assert!(!p.more);
    assert_eq!(p.partitions(), 1);
    let other = purge::plan(&s.store, &d).unwrap();
    assert_eq!(other.queues, vec![(d.queue("orders").unwrap(), 1)]);
}

#[test]
fn the_tenants_with_rows_in_a_table_are_listed_one_seek_each() {
    let ids = [
        "11111111-2222-4333-8444-555555555555",
        "22222222-2222-4333-8444-555555555555",
        "33333333-2222-4333-8444-555555555555",
    ];
    let mut s = Sim::new();
    let mut ops = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let t = Tenant::parse(id).unwrap();
        for k in 0..=i {
            ops.push(KvOp::Put {
                ns: t.name(&format!("ns{k}")),
                key: format!("k{k}"),
                value: b"1".to_vec(),
                expiry: Expiry::Forever,
                expect: None,
                required: false,
            });
        }
    }
    // The default tenant's rows are not listed.
    ops.push(KvOp::Put {
        ns: "plain".into(),
        key: "k".into(),
        value: b"1".to_vec(),
        expiry: Expiry::Forever,
        expect: None,
        required: false,
    });
    s.apply(Command::Kv(ops));
    let found = reads::scoped_tenants(&s.store, queen_domain::keys::table::KV).unwrap();
    assert_eq!(found, ids.to_vec());
    assert!(
        reads::scoped_tenants(&s.store, queen_domain::keys::table::TIMER)
            .unwrap()
            .is_empty()
    );
}
