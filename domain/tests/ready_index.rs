//! The ready index against a full scan: over random sequences of pushes, pops, acks, nacks,
//! lease expiries, seeks, group deletions, new subscriptions, message deletions, queue
//! deletions and restarts, a pop that names no partition claims only partitions a scan of
//! every partition finds claimable, and as many of them as it may (its partition and message
//! budgets), so it answers nothing only when the scan finds nothing. `Sim::apply` checks the
//! invariants (the index's among them) after every entry.

mod common;

use common::*;
use proptest::prelude::*;
use queen_domain::command::Subscription;
use queen_domain::time::Stamp;

const PARTS: u8 = 8;

#[derive(Debug, Clone)]
enum Op {
    Push {
        part: u8,
        txn: u8,
    },
    PushMany {
        parts: u8,
    },
    Pop {
        group: u8,
        batch: u8,
        parts: u8,
    },
    AckAll {
        status: u8,
    },
    Wait {
        secs: u8,
    },
    Tick,
    Seek {
        group: u8,
        back: Option<u8>,
    },
    DeleteGroup {
        group: u8,
        metadata: bool,
    },
    Resubscribe {
        group: u8,
        back: u8,
    },
    Configure {
        lease: u8,
        delay: u8,
        retention: u8,
    },
    DeleteMessage {
        part: u8,
        txn: u8,
    },
    DeleteQueue,
    Restart,
    /// A new leader's blank entry: leases are held `skew` past their expiry.
    LeaderChange,
    /// The last pop's entry applied once more (the same lease id): a proposal sent again
    /// after its first copy was committed.
    PopAgain,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..PARTS, 0u8..24).prop_map(|(part, txn)| Op::Push { part, txn }),
        1 => (1..PARTS).prop_map(|parts| Op::PushMany { parts }),
        5 => (0u8..3, 1u8..6, 1u8..4).prop_map(|(group, batch, parts)| Op::Pop { group, batch, parts }),
        4 => (0u8..4).prop_map(|status| Op::AckAll { status }),
        2 => (0u8..5).prop_map(|secs| Op::Wait { secs }),
        1 => Just(Op::Tick),
        1 => (0u8..3, proptest::option::of(0u8..6)).prop_map(|(group, back)| Op::Seek { group, back }),
        1 => (0u8..3, any::<bool>()).prop_map(|(group, metadata)| Op::DeleteGroup { group, metadata }),
        1 => (1u8..3, 0u8..8).prop_map(|(group, back)| Op::Resubscribe { group, back }),
        1 => (1u8..4, 0u8..2, 0u8..6).prop_map(|(lease, delay, retention)| Op::Configure { lease, delay, retention }),
        1 => (0..PARTS, 0u8..24).prop_map(|(part, txn)| Op::DeleteMessage { part, txn }),
        1 => Just(Op::DeleteQueue),
        1 => Just(Op::Restart),
        1 => Just(Op::LeaderChange),
        2 => Just(Op::PopAgain),
    ]
}

fn group_name(g: u8) -> GroupName {
    if g == 0 {
        GroupName::queue_mode()
    } else {
        GroupName::new(format!("g{g}")).unwrap()
    }
}

fn pop_command(group: u8, partition: Option<String>, batch: u32, parts: u32) -> PopCommand {
    PopCommand {
        queue: QueueName::new("q").unwrap(),
        partition: partition.map(|p| PartitionName::new(p).unwrap()),
        group: group_name(group),
        batch,
        max_partitions: parts,
        lease_id: LeaseId::new("look").unwrap(),
        auto_ack: false,
        // Group 2 subscribes from its first pop on: its untouched partitions start late.
        subscription: if group == 2 {
            Subscription::New
        } else {
            Subscription::Default
        },
    }
}

/// The partitions a scan of every partition finds claimable for `group` now: each looked at
/// on its own, by a pop that names it (which reads no index).
fn claimable(sim: &Sim, group: u8) -> Vec<String> {
    (0..PARTS)
        .map(|p| format!("p{p}"))
        .filter(|name| {
            let look = pop_command(group, Some(name.clone()), 1, 1);
            !reads::would_pop(&sim.store, Stamp(sim.now), &look)
                .unwrap()
                .is_empty()
        })
        .collect()
}

/// An ack with `status` of every message `pop` delivered, under its lease.
fn acks(pop: &PopOutcome, status: &str) -> Vec<AckItem> {
    pop.claims
        .iter()
        .flat_map(|c| c.messages.iter().map(move |m| (c.pid, m)))
        .map(|(pid, m)| AckItem {
            transaction_id: tid(&m.transaction_id),
            partition_id: PartitionRef::Id(pid),
            status: status.into(),
            error: None,
            lease_id: Some(lease(&pop.lease_id)),
        })
        .collect()
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut sim = Sim::new();
    let mut last: Option<(u8, PopOutcome)> = None;
    let mut last_pop: Option<Command> = None;
    for op in ops {
        match op {
            Op::Push { part, txn } => {
                sim.push("q", &format!("p{part}"), &format!("t{txn}"));
            }
            Op::PushMany { parts } => {
                sim.seq += 1;
                let items = (0..*parts)
                    .map(|p| PushItem {
                        queue: QueueName::new("q").unwrap(),
                        partition: PartitionName::new(format!("p{p}")).unwrap(),
                        transaction_id: tid(&format!("m{}-{p}", sim.seq)),
                        message_id: [p; 16],
                        payload: b"{}".to_vec(),
                        trace_id: None,
                    })
                    .collect();
                sim.apply(Command::Push(items));
            }
            Op::Pop {
                group,
                batch,
                parts,
            } => {
                let scan = claimable(&sim, *group);
                sim.seq += 1;
                let mut cmd = pop_command(*group, None, u32::from(*batch), u32::from(*parts));
                cmd.lease_id = LeaseId::new(format!("L{}", sim.seq)).unwrap();
                // Group 2 also declares conflation: its claims are each partition's newest.
                let pop = if *group == 2 {
                    Command::PopConflating(cmd)
                } else {
                    Command::Pop(cmd)
                };
                last_pop = Some(pop.clone());
                let Outcome::Pop(p) = sim.apply(pop) else {
                    return Err(TestCaseError::fail("a pop answers a pop"));
                };
                let claimed: Vec<&str> = p.claims.iter().map(|c| c.partition.as_str()).collect();
                for name in &claimed {
                    prop_assert!(
                        scan.iter().any(|s| s == name),
                        "claimed {name}, the scan found only {scan:?}"
                    );
                }
                let messages: usize = p.claims.iter().map(|c| c.messages.len()).sum();
                let room = usize::from(*parts).min(scan.len());
                prop_assert!(
                    claimed.len() >= room || messages >= usize::from(*batch),
                    "claimed {claimed:?} ({messages} messages) of {scan:?}, room for {room}"
                );
                if !p.is_empty() {
                    last = Some((*group, p));
                }
            }
            Op::AckAll { status } => {
                let Some((group, pop)) = &last else { continue };
                sim.apply(Command::Ack {
                    group: group_name(*group),
                    items: acks(
                        pop,
                        ["completed", "failed", "dlq", "retry"][*status as usize],
                    ),
                });
            }
            Op::Wait { secs } => sim.advance_secs(u64::from(*secs)),
            Op::Tick => {
                sim.apply(Command::Tick);
            }
            Op::Seek { group, back } => {
                sim.apply(Command::Seek {
                    group: group_name(*group),
                    queue: QueueName::new("q").unwrap(),
                    to: back.map(|b| Stamp(sim.now - u64::from(b) * 1_000_000)),
                });
            }
            Op::DeleteGroup { group, metadata } => {
                sim.apply(Command::DeleteGroup {
                    group: group_name(*group),
                    queue: Some(QueueName::new("q").unwrap()),
                    delete_metadata: *metadata,
                });
            }
            Op::Resubscribe { group, back } => {
                sim.apply(Command::Resubscribe {
                    group: group_name(*group),
                    from: Stamp(sim.now - u64::from(*back) * 1_000_000),
                });
            }
            Op::Configure {
                lease,
                delay,
                retention,
            } => sim.configure(
                "q",
                QueueOptions {
                    lease_time: u64::from(*lease),
                    delayed_processing: u64::from(*delay),
                    retention_seconds: u64::from(*retention),
                    ..QueueOptions::default()
                },
            ),
            Op::DeleteMessage { part, txn } => {
                let Some(p) =
                    reads::partition_by_name(&sim.store, "q", &format!("p{part}")).unwrap()
                else {
                    continue;
                };
                sim.apply(Command::DeleteMessage {
                    pid: p.pid,
                    transaction_id: tid(&format!("t{txn}")),
                });
            }
            Op::DeleteQueue => {
                sim.apply(Command::DeleteQueue {
                    queue: QueueName::new("q").unwrap(),
                });
                last = None;
            }
            Op::LeaderChange => sim.leader_change(),
            Op::PopAgain => {
                // While the first copy's lease is on record the second claims nothing (once it
                // is acknowledged, a claim under the old id is released like any other); the
                // invariants, checked after the entry, say every lease is still released.
                let Some(pop) = last_pop.clone() else {
                    continue;
                };
                sim.apply(pop);
            }
            // The index is rows of the store: a restart reads the same rows back.
            Op::Restart => sim.store = sim.store.clone(),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_pop_without_a_partition_claims_what_a_full_scan_finds(ops in proptest::collection::vec(op(), 1..80)) {
        run(&ops)?;
    }
}

/// A queue drained by pops that name no partition, with more partitions than one fill step:
/// every message is delivered once, each partition's in order, and the last pop finds nothing.
#[test]
fn a_wide_queue_drains_completely_in_partition_order() {
    let mut sim = Sim::new();
    let parts = 700;
    for round in 0..2 {
        for p in 0..parts {
            sim.push("wide", &format!("p{p}"), &format!("t{round}-{p}"));
        }
    }
    let mut seen: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for _ in 0..(2 * parts + 10) {
        let pop = sim.pop_with("wide", None, None, 10, 4, Subscription::Default);
        if pop.is_empty() {
            break;
        }
        for c in &pop.claims {
            for m in &c.messages {
                seen.entry(c.partition.clone())
                    .or_default()
                    .push(m.transaction_id.clone());
            }
        }
        sim.apply(Command::Ack {
            group: GroupName::queue_mode(),
            items: acks(&pop, "completed"),
        });
    }
    assert_eq!(seen.len(), parts);
    for (p, got) in &seen {
        let n = p.trim_start_matches('p');
        assert_eq!(got, &vec![format!("t0-{n}"), format!("t1-{n}")], "{p}");
    }
    assert!(sim.pop("wide", None, 10).is_empty());
}

/// A group that popped before the cluster read the index's format, on a queue whose first
/// partitions it drained: once the format switches, its pops fill past the drained ones instead
/// of answering nothing while later partitions still hold messages.
#[test]
fn a_group_drained_before_the_switch_finds_the_partitions_past_its_fill() {
    let mut sim = Sim::before_ready_index();
    let parts = 1_000;
    for p in 0..parts {
        sim.push("late", &format!("p{p}"), &format!("t{p}"));
    }
    let mut got = 0;
    for _ in 0..40 {
        let pop = sim.pop_with("late", None, None, 16, 16, Subscription::Default);
        got += pop.claims.len();
        sim.apply(Command::Ack {
            group: GroupName::queue_mode(),
            items: acks(&pop, "completed"),
        });
    }
    assert_eq!(got, 640, "drained the first partitions by scanning");
    sim.apply(Command::ClusterSettings {
        version: Command::LATEST_FORMAT,
        max_clock_skew_ms: queen_domain::machine::cluster::DEFAULT_MAX_CLOCK_SKEW_MS,
    });
    for _ in 0..(parts / 16 + 5) {
        let pop = sim.pop_with("late", None, None, 16, 16, Subscription::Default);
        if pop.is_empty() {
            break;
        }
        got += pop.claims.len();
        sim.apply(Command::Ack {
            group: GroupName::queue_mode(),
            items: acks(&pop, "completed"),
        });
    }
    assert_eq!(got, parts, "every partition delivered once");
}

/// A group that starts on a wide queue where almost nothing is left for it: each pop adds at
/// most `MAX_FILL_STEPS` steps of partitions to its index (its apply stays bounded, however
/// wide the queue), `reads::index_covers` says so until the index covers the queue, and pops
/// proposed on that word find the one message past the first steps.
#[test]
fn a_pop_fills_a_late_groups_index_a_bounded_share_at_a_time() {
    let mut sim = Sim::new();
    let parts: usize = 10_000;
    for chunk in 0..parts / 500 {
        sim.seq += 1;
        let items = (chunk * 500..(chunk + 1) * 500)
            .map(|p| PushItem {
                queue: QueueName::new("wide").unwrap(),
                partition: PartitionName::new(format!("p{p}")).unwrap(),
                transaction_id: tid(&format!("old-{p}")),
                message_id: [1; 16],
                payload: b"{}".to_vec(),
                trace_id: None,
            })
            .collect();
        sim.apply(Command::Push(items));
    }
    sim.advance_secs(1);
    // Group "late" subscribes from its first pop on: every message so far is behind it.
    let first = sim.pop_with("wide", None, Some("late"), 10, 10, Subscription::New);
    assert!(first.is_empty(), "{first:?}");
    assert!(
        !reads::index_covers(&sim.store, "wide", "late").unwrap(),
        "one pop covered at most {} partitions of {parts}",
        queen_domain::machine::MAX_FILL_STEPS * 256
    );
    sim.advance_secs(1);
    sim.push("wide", &format!("p{}", parts - 1), "new");
    let mut pops = 1;
    let got = loop {
        assert!(pops < 100, "the new message was never found");
        let pop = sim.pop_with("wide", None, Some("late"), 10, 10, Subscription::New);
        pops += 1;
        if !pop.is_empty() {
            break pop;
        }
        assert!(
            !reads::index_covers(&sim.store, "wide", "late").unwrap(),
            "an empty pop with the index covering the queue means nothing is left"
        );
    };
    assert_eq!(got.claims[0].partition, format!("p{}", parts - 1));
    assert_eq!(got.claims[0].messages[0].transaction_id, "new");
    assert!(
        pops >= parts.div_ceil(queen_domain::machine::MAX_FILL_STEPS * 256),
        "each pop covered a bounded share: found after {pops} pops"
    );
    assert!(reads::index_covers(&sim.store, "wide", "late").unwrap());
}
