//! Property tests: random command sequences keep the invariants, batching does not change the
//! outcome (determinism), nor does applying without an answer (a follower), and a group never
//! holds two live deliveries of one message; message deletions and dead-letter retries among
//! them.

use proptest::prelude::*;
use queen_domain::command::{AckItem, Command, Entry, Outcome, PopCommand, PushItem, Subscription};
use queen_domain::ids::{LeaseId, PartitionRef, TransactionId};
use queen_domain::machine::{DeliveredOffsets, apply_encoded, apply_entry_as, resolve_ack_offsets};
use queen_domain::model::QueueOptions;
use queen_domain::names::{GroupName, PartitionName, QueueName};
use queen_domain::{MemStore, Txn, apply_entry, invariants};

#[derive(Debug, Clone)]
enum Op {
    Push { part: u8, txn: u8 },
    Pop { group: u8, batch: u8, parts: u8 },
    AckLast { status: u8, idx: u8 },
    AckAll { status: u8 },
    Extend,
    Tick,
    Wait { secs: u8 },
    Configure { retention: u8, retry: u8, lease: u8 },
    Delete,
    DeleteMessage { part: u8, txn: u8 },
    RetryDead { part: u8, txn: u8, group: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, 0u8..12).prop_map(|(part, txn)| Op::Push { part, txn }),
        3 => (0u8..3, 1u8..4, 1u8..3).prop_map(|(group, batch, parts)| Op::Pop { group, batch, parts }),
        3 => (0u8..4, 0u8..4).prop_map(|(status, idx)| Op::AckLast { status, idx }),
        1 => (0u8..4).prop_map(|status| Op::AckAll { status }),
        1 => Just(Op::Extend),
        1 => Just(Op::Tick),
        1 => (0u8..8).prop_map(|secs| Op::Wait { secs }),
        1 => (0u8..6, 0u8..3, 1u8..5).prop_map(|(retention, retry, lease)| Op::Configure { retention, retry, lease }),
        1 => Just(Op::Delete),
        1 => (0u8..3, 0u8..12).prop_map(|(part, txn)| Op::DeleteMessage { part, txn }),
        1 => (0u8..3, 0u8..12, 0u8..3).prop_map(|(part, txn, group)| Op::RetryDead { part, txn, group }),
    ]
}

/// The pop of `group`: group 2 declares conflation (its pops deliver each partition's newest
/// message and retire the rest), the others do not.
fn pop_as(group: u8, cmd: PopCommand) -> Command {
    if group == 2 {
        Command::PopConflating(cmd)
    } else {
        Command::Pop(cmd)
    }
}

/// An ack of message `m` of partition `pid`, delivered by `pop`, under its lease.
fn ack_item(
    pop: &queen_domain::command::PopOutcome,
    pid: u64,
    m: &queen_domain::command::Delivered,
    status: u8,
) -> AckItem {
    AckItem {
        transaction_id: TransactionId::new(m.transaction_id.clone()).unwrap(),
        partition_id: PartitionRef::Id(pid),
        status: ["completed", "failed", "dlq", "retry"][status as usize].into(),
        error: None,
        lease_id: Some(LeaseId::new(pop.lease_id.clone()).unwrap()),
    }
}

/// Turn ops into concrete entries; ack and extend entries refer to the last pop's answer, so
/// the entries are built while a reference replica runs.
fn build_entries(ops: &[Op]) -> (Vec<Entry>, MemStore) {
    let mut store = MemStore::new();
    let mut now = 1_000_000_000_000u64;
    let mut entries = Vec::new();
    // Every member reads this build's format: pops read the ready index.
    let settings = Entry {
        proposed_at: now,
        command: Command::ClusterSettings {
            version: Command::LATEST_FORMAT,
            max_clock_skew_ms: queen_domain::machine::cluster::DEFAULT_MAX_CLOCK_SKEW_MS,
        },
    };
    let mut txn = Txn::new(&store);
    apply_entry(&mut txn, &settings, 1).unwrap();
    let w = txn.into_writes();
    store.commit(w);
    entries.push(settings);
    let mut last_pop: Option<(String, queen_domain::command::PopOutcome)> = None;
    let q = QueueName::new("q").unwrap();
    for (i, op) in ops.iter().enumerate() {
        let command = match op {
            Op::Push { part, txn } => Command::Push(vec![PushItem {
                queue: q.clone(),
                partition: PartitionName::new(format!("p{part}")).unwrap(),
                transaction_id: TransactionId::new(format!("t{txn}")).unwrap(),
                message_id: [i as u8; 16],
                payload: b"{}".to_vec(),
                trace_id: None,
            }]),
            Op::Pop {
                group,
                batch,
                parts,
            } => pop_as(
                *group,
                PopCommand {
                    queue: q.clone(),
                    partition: None,
                    group: if *group == 0 {
                        GroupName::queue_mode()
                    } else {
                        GroupName::new(format!("g{group}")).unwrap()
                    },
                    batch: u32::from(*batch),
                    max_partitions: u32::from(*parts),
                    lease_id: LeaseId::new(format!("L{i}")).unwrap(),
                    auto_ack: false,
                    subscription: Subscription::Default,
                },
            ),
            Op::AckLast { status, idx } => {
                let Some((group, pop)) = &last_pop else {
                    continue;
                };
                let msgs: Vec<_> = pop
                    .claims
                    .iter()
                    .flat_map(|c| c.messages.iter().map(move |m| (c.pid, m)))
                    .collect();
                let Some((pid, m)) = msgs.get(*idx as usize % msgs.len().max(1)) else {
                    continue;
                };
                Command::Ack {
                    group: GroupName::or_queue_mode(Some(group)).unwrap(),
                    items: vec![ack_item(pop, *pid, m, *status)],
                }
            }
            Op::AckAll { status } => {
                let Some((group, pop)) = &last_pop else {
                    continue;
                };
                Command::Ack {
                    group: GroupName::or_queue_mode(Some(group)).unwrap(),
                    items: pop
                        .claims
                        .iter()
                        .flat_map(|c| c.messages.iter().map(move |m| (c.pid, m)))
                        .map(|(pid, m)| ack_item(pop, pid, m, *status))
                        .collect(),
                }
            }
            Op::Extend => {
                let Some((_, pop)) = &last_pop else { continue };
                Command::ExtendLease {
                    lease_id: LeaseId::new(pop.lease_id.clone()).unwrap(),
                }
            }
            Op::Tick => Command::Tick,
            Op::Wait { secs } => {
                now += u64::from(*secs) * 1_000_000;
                continue;
            }
            Op::Configure {
                retention,
                retry,
                lease,
            } => Command::Configure {
                queue: q.clone(),
                namespace: None,
                task: None,
                options: QueueOptions {
                    retention_seconds: u64::from(*retention),
                    retry_limit: u32::from(*retry),
                    lease_time: u64::from(*lease),
                    ..QueueOptions::default()
                },
            },
            Op::Delete => Command::DeleteQueue { queue: q.clone() },
            Op::DeleteMessage { part, txn } => {
                let Some(p) =
                    queen_domain::reads::partition_by_name(&store, "q", &format!("p{part}"))
                        .unwrap()
                else {
                    continue;
                };
                Command::DeleteMessage {
                    pid: p.pid,
                    transaction_id: TransactionId::new(format!("t{txn}")).unwrap(),
                }
            }
            Op::RetryDead { part, txn, group } => {
                let Some(p) =
                    queen_domain::reads::partition_by_name(&store, "q", &format!("p{part}"))
                        .unwrap()
                else {
                    continue;
                };
                Command::RetryDeadLetter {
                    pid: p.pid,
                    transaction_id: TransactionId::new(format!("t{txn}")).unwrap(),
                    group: (*group > 0).then(|| GroupName::new(format!("g{group}")).unwrap()),
                    message_id: [i as u8; 16],
                }
            }
        };
        let entry = Entry {
            proposed_at: now,
            command,
        };
        let mut txn = Txn::new(&store);
        let r = apply_entry(&mut txn, &entry, entries.len() as u64 + 1).unwrap();
        let w = txn.into_writes();
        store.commit(w);
        if let Outcome::Pop(p) = &r.outcome {
            let group = match &entry.command {
                Command::Pop(c) | Command::PopConflating(c) => c.group.as_str().to_owned(),
                _ => unreachable!(),
            };
            if !p.is_empty() {
                last_pop = Some((group, p.clone()));
            }
        }
        entries.push(entry);
    }
    (entries, store)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_and_batching_changes_nothing(ops in proptest::collection::vec(op(), 1..60), cut in 1usize..8) {
        let (entries, one_by_one) = build_entries(&ops);
        prop_assert!(invariants::check(&one_by_one).is_ok(), "{:?}", invariants::check(&one_by_one));
        // The same entries applied in batches of `cut` (one overlay per batch, as the node does).
        let mut batched = MemStore::new();
        let mut answers = Vec::new();
        for (c, chunk) in entries.chunks(cut).enumerate() {
            let mut txn = Txn::new(&batched);
            for (j, e) in chunk.iter().enumerate() {
                let mut inner = Txn::new(&txn);
                answers.push(apply_entry(&mut inner, e, (c * cut + j) as u64 + 1).unwrap());
                let w = inner.into_writes();
                txn.absorb(w);
            }
            let w = txn.into_writes();
            batched.commit(w);
        }
        prop_assert_eq!(&one_by_one, &batched);
        // The same entries applied from their bytes in batches of `cut` on one overlay, as the
        // node's store applies them: pushes are read in place and their messages stay as
        // pushed in the overlay until something reads them (a pop of the same batch) or the
        // batch commits. The same state and the same answers.
        let encoded: Vec<Vec<u8>> = entries.iter().map(Entry::encode).collect();
        let mut in_place = MemStore::new();
        let mut in_place_answers = Vec::new();
        for (c, chunk) in encoded.chunks(cut).enumerate() {
            let mut txn = Txn::new(&in_place);
            for (j, e) in chunk.iter().enumerate() {
                in_place_answers.push(apply_encoded(&mut txn, e, (c * cut + j) as u64 + 1, true).unwrap());
            }
            let w = txn.into_writes();
            in_place.commit(w);
        }
        prop_assert_eq!(&one_by_one, &in_place);
        prop_assert_eq!(answers, in_place_answers);
        // The same entries applied as a follower applies them (nobody waits for the answers,
        // so pops do not read the messages they claim): the same state.
        let mut follower = MemStore::new();
        for (i, e) in entries.iter().enumerate() {
            let mut txn = Txn::new(&follower);
            apply_entry_as(&mut txn, e, i as u64 + 1, false).unwrap();
            let w = txn.into_writes();
            follower.commit(w);
        }
        prop_assert_eq!(one_by_one, follower);
    }

    #[test]
    fn acks_with_offsets_found_ahead_apply_as_acks_without(ops in proptest::collection::vec(op(), 1..60), lag in 0usize..4, from_pops: bool) {
        // Each ack goes again as `AckAt`, its offsets found in the state `lag` entries before
        // it (a proposer whose applied state lags the log), or first in what the pops
        // delivered (the node that served them): the same answers and the same state.
        let (entries, plain) = build_entries(&ops);
        let mut states = vec![MemStore::new()];
        let mut at = MemStore::new();
        let mut answers = (Vec::new(), Vec::new());
        let mut delivered: Vec<(String, u64, DeliveredOffsets)> = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            let mut txn = Txn::new(&states[states.len() - 1]);
            let outcome = apply_entry(&mut txn, e, i as u64 + 1).unwrap().outcome;
            if let Outcome::Pop(p) = &outcome {
                for c in &p.claims {
                    if let Some(d) = DeliveredOffsets::of_claim(c) {
                        delivered.push((p.lease_id.clone(), c.pid, d));
                    }
                }
            }
            answers.0.push(outcome);
            let w = txn.into_writes();
            let mut next = states[states.len() - 1].clone();
            next.commit(w);
            let command = match &e.command {
                Command::Ack { group, items } => {
                    let seen = &states[states.len().saturating_sub(1 + lag)];
                    let known = |lease: &LeaseId, pid: u64, t: &str| {
                        if !from_pops {
                            return None;
                        }
                        delivered
                            .iter()
                            .find(|(l, p, _)| l == lease.as_str() && *p == pid)?
                            .2
                            .get(t)
                    };
                    Command::AckAt {
                        group: group.clone(),
                        items: items.clone(),
                        offsets: resolve_ack_offsets(seen, group, items, known).unwrap(),
                    }
                }
                c => c.clone(),
            };
            let e = Entry { proposed_at: e.proposed_at, command };
            let mut txn = Txn::new(&at);
            answers.1.push(apply_entry(&mut txn, &e, i as u64 + 1).unwrap().outcome);
            let w = txn.into_writes();
            at.commit(w);
            states.push(next);
        }
        prop_assert_eq!(&plain, &at);
        prop_assert_eq!(answers.0, answers.1);
    }

    #[test]
    fn a_message_is_never_delivered_twice_to_a_group_under_a_live_lease(ops in proptest::collection::vec(op(), 1..80)) {
        let (entries, _) = build_entries(&ops);
        // Replay and track, per (pid, group, offset), the expiry of the live delivery.
        let mut store = MemStore::new();
        let mut live: std::collections::HashMap<(u64, String, u64), u64> = Default::default();
        for (i, e) in entries.iter().enumerate() {
            let mut txn = Txn::new(&store);
            let r = apply_entry(&mut txn, e, i as u64 + 1).unwrap();
            let w = txn.into_writes();
            store.commit(w);
            match (&e.command, &r.outcome) {
                (Command::Pop(c) | Command::PopConflating(c), Outcome::Pop(p)) => {
                    for cl in &p.claims {
                        for m in &cl.messages {
                            let key = (cl.pid, c.group.as_str().to_owned(), m.offset);
                            if let Some(exp) = live.get(&key) {
                                prop_assert!(*exp <= r.stamp.0, "delivered again while a lease lives: {key:?}");
                            }
                            live.insert(key, p.lease_expires.0);
                        }
                    }
                }
                (Command::Ack { .. } | Command::DeleteQueue { .. } | Command::ExtendLease { .. }, _) => {
                    // Acks and nacks may end a lease early; extension moves expiries: be conservative.
                    live.clear();
                }
                _ => {}
            }
        }
    }
}
