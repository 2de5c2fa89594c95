//! Conflation (contract 2.0.8) as the state machine applies it: a group registered by a pop
//! that declares it is delivered each partition's newest visible message only, the messages
//! behind it are retired for that group (never delivered to it later) and not for any other;
//! the stored policy wins over a later declaration and the answer says so. `Sim::apply` checks
//! the invariants, the ready index's among them, after every entry.

mod common;

use common::*;
use queen_domain::command::ConflationEcho;

const CONFLATING: ConflationEcho = ConflationEcho {
    conflating: true,
    conflict: false,
};

/// A pop of `group` on queue `q` (wildcard unless `partition`), declaring conflation or not.
fn pop(
    sim: &mut Sim,
    group: &str,
    partition: Option<&str>,
    parts: u32,
    conflation: bool,
) -> PopOutcome {
    sim.seq += 1;
    let cmd = PopCommand {
        queue: QueueName::new("q").unwrap(),
        partition: partition.map(|p| PartitionName::new(p).unwrap()),
        group: GroupName::new(group).unwrap(),
        batch: 10,
        max_partitions: parts,
        lease_id: lease(&format!("lease-{}", sim.seq)),
        auto_ack: false,
        subscription: Subscription::Default,
    };
    let command = if conflation {
        Command::PopConflating(cmd)
    } else {
        Command::Pop(cmd)
    };
    match sim.apply(command) {
        Outcome::Pop(p) => p,
        o => panic!("{o:?}"),
    }
}

fn ack_all(sim: &mut Sim, group: &str, p: &PopOutcome) {
    for (i, _) in p.claims[0].messages.iter().enumerate() {
        let verdict = sim.ack(Some(group), p, i, "completed");
        assert!(verdict.success, "{verdict:?}");
    }
}

fn push_all(sim: &mut Sim, partition: &str, txns: &[&str]) {
    for t in txns {
        sim.push("q", partition, t);
    }
}

#[test]
fn a_conflating_group_gets_the_newest_message_and_never_the_ones_behind_it() {
    let mut sim = Sim::new();
    push_all(&mut sim, "p", &["t1", "t2", "t3"]);
    let got = pop(&mut sim, "latest", None, 1, true);
    assert_eq!(txns(&got), ["t3"]);
    assert_eq!(got.conflation, CONFLATING);
    assert_eq!(got.claims[0].messages[0].offset, 2);
    // The lease runs out unacknowledged: the newest comes again, the retired ones never.
    sim.advance_secs(301);
    let again = pop(&mut sim, "latest", None, 1, true);
    assert_eq!(txns(&again), ["t3"]);
    ack_all(&mut sim, "latest", &again);
    let empty = pop(&mut sim, "latest", None, 1, true);
    assert!(empty.is_empty());
    assert_eq!(
        empty.conflation, CONFLATING,
        "an empty answer echoes it too"
    );
    push_all(&mut sim, "p", &["t4", "t5"]);
    let next = pop(&mut sim, "latest", Some("p"), 1, true);
    assert_eq!(
        txns(&next),
        ["t5"],
        "the partition route conflates the same way"
    );
    ack_all(&mut sim, "latest", &next);
    assert!(pop(&mut sim, "latest", None, 1, true).is_empty());
}

#[test]
fn other_groups_of_the_queue_still_get_every_message() {
    let mut sim = Sim::new();
    push_all(&mut sim, "p", &["t1", "t2", "t3"]);
    let latest = pop(&mut sim, "latest", None, 1, true);
    ack_all(&mut sim, "latest", &latest);
    let all = pop(&mut sim, "all", None, 1, false);
    assert_eq!(txns(&all), ["t1", "t2", "t3"]);
    assert_eq!(all.conflation, ConflationEcho::default());
    let q = reads::queue(&sim.store, "q").unwrap().unwrap();
    assert!(reads::group_conflates(&sim.store, q.qid, "latest").unwrap());
    assert!(!reads::group_conflates(&sim.store, q.qid, "all").unwrap());
}

#[test]
fn a_wildcard_pop_takes_the_newest_of_each_partition_it_claims() {
    let mut sim = Sim::new();
    for p in ["a", "b", "c"] {
        push_all(
            &mut sim,
            p,
            &[&format!("{p}1"), &format!("{p}2"), &format!("{p}3")],
        );
    }
    let got = pop(&mut sim, "latest", None, 8, true);
    let mut newest = txns(&got);
    newest.sort();
    assert_eq!(newest, ["a3", "b3", "c3"]);
    assert!(got.claims.iter().all(|c| c.messages.len() == 1));
}

#[test]
fn the_stored_policy_wins_and_a_differing_declaration_is_answered_as_a_conflict() {
    let mut sim = Sim::new();
    push_all(&mut sim, "p", &["t1", "t2"]);
    // Registered by a pop that did not declare conflation: a later declaration conflicts and
    // the group keeps getting every message.
    let plain = pop(&mut sim, "plain", None, 1, false);
    assert_eq!(txns(&plain), ["t1", "t2"]);
    sim.advance_secs(301);
    let declared = pop(&mut sim, "plain", None, 1, true);
    assert_eq!(txns(&declared), ["t1", "t2"]);
    assert_eq!(
        declared.conflation,
        ConflationEcho {
            conflating: false,
            conflict: true
        }
    );
    // Registered conflating: a pop that does not declare it still conflates.
    pop(&mut sim, "latest", Some("elsewhere"), 1, true);
    let undeclared = pop(&mut sim, "latest", None, 1, false);
    assert_eq!(txns(&undeclared), ["t2"]);
    assert_eq!(
        undeclared.conflation,
        ConflationEcho {
            conflating: true,
            conflict: true
        }
    );
}

#[test]
fn a_deleted_group_registers_again_with_its_next_pop() {
    let mut sim = Sim::new();
    push_all(&mut sim, "p", &["t1", "t2"]);
    pop(&mut sim, "g", None, 1, true);
    sim.apply(Command::DeleteGroup {
        group: GroupName::new("g").unwrap(),
        queue: Some(QueueName::new("q").unwrap()),
        delete_metadata: true,
    });
    let got = pop(&mut sim, "g", None, 1, false);
    assert_eq!(txns(&got), ["t1", "t2"]);
    assert_eq!(got.conflation, ConflationEcho::default());
}

#[test]
fn the_newest_visible_message_is_the_newest_past_its_delay_and_not_deleted() {
    let mut sim = Sim::new();
    sim.configure(
        "q",
        QueueOptions {
            delayed_processing: 2,
            ..QueueOptions::default()
        },
    );
    push_all(&mut sim, "p", &["t1", "t2"]);
    sim.advance_secs(3);
    push_all(&mut sim, "p", &["t3"]);
    // t3 is still inside its delay: t2 is the newest visible one.
    let got = pop(&mut sim, "latest", None, 1, true);
    assert_eq!(txns(&got), ["t2"]);
    ack_all(&mut sim, "latest", &got);
    assert!(pop(&mut sim, "latest", None, 1, true).is_empty());
    sim.advance_secs(3);
    push_all(&mut sim, "p", &["t4"]);
    // Deleted for every group: the newest this group may see is t3.
    let pid = reads::partition_by_name(&sim.store, "q", "p")
        .unwrap()
        .unwrap()
        .pid;
    sim.apply(Command::DeleteMessage {
        pid,
        transaction_id: tid("t4"),
    });
    let got = pop(&mut sim, "latest", None, 1, true);
    assert_eq!(txns(&got), ["t3"]);
}
