//! The broker's rules, driven through entries on an in-memory store.

mod common;
use common::*;

#[test]
fn push_assigns_offsets_from_zero_and_dedups() {
    let mut s = Sim::new();
    assert_eq!(s.push("q", "a", "t1").offset, 0);
    assert_eq!(s.push("q", "a", "t2").offset, 1);
    assert_eq!(s.push("q", "b", "t1").offset, 0, "dedup is per partition");
    let dup = s.push("q", "a", "t1");
    assert_eq!(dup.status, PushStatus::Duplicate);
    assert_eq!(dup.offset, 0);
    assert_eq!(s.pop("q", None, 10).claims[0].messages.len(), 2);
}

#[test]
fn repeats_inside_one_push_keep_the_first() {
    let mut s = Sim::new();
    let item = |t: &str, n: u8| PushItem {
        queue: QueueName::new("q").unwrap(),
        partition: PartitionName::default_partition(),
        transaction_id: tid(t),
        message_id: [n; 16],
        payload: b"1".to_vec(),
        trace_id: None,
    };
    let Outcome::Push(v) = s.apply(Command::Push(vec![
        item("x", 1),
        item("x", 2),
        item("y", 3),
    ])) else {
        panic!()
    };
    assert_eq!(v[0].status, PushStatus::Queued);
    assert_eq!(v[1].status, PushStatus::Duplicate);
    assert_eq!(v[1].message_id, [1; 16]);
    assert_eq!(v[2].offset, 1);
}

#[test]
fn stamps_rise_even_when_the_clock_goes_back() {
    let mut s = Sim::new();
    let a = s.push("q", "p", "a");
    let _ = a;
    s.now -= 10_000_000;
    let before = reads::safe_time(&s.store).unwrap();
    s.push("q", "p", "b");
    assert!(reads::safe_time(&s.store).unwrap() > before);
}

#[test]
fn a_leased_partition_is_skipped_until_acked() {
    let mut s = Sim::new();
    for i in 0..3 {
        s.push("q", "p", &format!("t{i}"));
    }
    let p1 = s.pop("q", None, 2);
    assert_eq!(txns(&p1), ["t0", "t1"]);
    assert!(
        s.pop("q", None, 2).is_empty(),
        "one live lease per partition and group"
    );
    assert!(s.ack(None, &p1, 0, "completed").success);
    let v = s.ack(None, &p1, 1, "completed");
    assert!(v.success && v.lease_released);
    assert_eq!(txns(&s.pop("q", None, 2)), ["t2"]);
}

#[test]
fn an_expired_lease_redelivers_without_counting_a_retry() {
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            lease_time: 5,
            ..QueueOptions::default()
        },
    );
    s.push("q", "Default", "t0");
    let first = s.pop("q", None, 1);
    s.advance_secs(6);
    let again = s.pop("q", None, 1);
    assert_eq!(txns(&again), ["t0"]);
    assert_eq!(again.claims[0].messages[0].attempt, 1);
    let stale = s.ack(None, &first, 0, "completed");
    assert!(!stale.success, "an ack under the expired lease is refused");
    assert!(s.ack(None, &again, 0, "completed").success);
}

#[test]
fn failures_retry_up_to_the_limit_then_dead_letter() {
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            retry_limit: 2,
            ..QueueOptions::default()
        },
    );
    s.push("q", "Default", "bad");
    s.push("q", "Default", "good");
    for attempt in 1..=3 {
        let p = s.pop("q", None, 1);
        assert_eq!(txns(&p), ["bad"]);
        assert_eq!(p.claims[0].messages[0].attempt, attempt);
        let v = s.ack(None, &p, 0, "failed");
        assert!(v.success && v.lease_released);
        assert_eq!(v.dlq, attempt == 3);
    }
    assert_eq!(txns(&s.pop("q", None, 1)), ["good"]);
    let q = reads::queue(&s.store, "q").unwrap().unwrap();
    let (dlq, total) = reads::dead_letters(&s.store, q.qid, &|_| true, 0, 10).unwrap();
    assert_eq!(total, 1);
    assert_eq!(dlq[0].transaction_id, "bad");
    assert_eq!(dlq[0].error.as_deref(), Some("boom"));
}

#[test]
fn a_nack_rewinds_the_partition_and_refuses_the_rest_of_the_batch() {
    let mut s = Sim::new();
    for i in 0..3 {
        s.push("q", "p", &format!("t{i}"));
    }
    let p = s.pop("q", None, 3);
    assert!(s.ack(None, &p, 0, "completed").success);
    assert!(s.ack(None, &p, 1, "failed").success);
    assert!(
        !s.ack(None, &p, 2, "completed").success,
        "the lease was released by the nack"
    );
    assert_eq!(txns(&s.pop("q", None, 3)), ["t1", "t2"]);
}

#[test]
fn a_repeated_ack_is_answered_as_the_first() {
    let mut s = Sim::new();
    s.push("q", "p", "t0");
    s.push("q", "p", "t1");
    let p = s.pop("q", None, 2);
    let first = s.ack(None, &p, 0, "completed");
    let again = s.ack(None, &p, 0, "completed");
    assert_eq!(
        (first.success, first.lease_released),
        (again.success, again.lease_released)
    );
    assert!(again.noop && !first.noop);
}

#[test]
fn each_group_sees_every_message_and_new_starts_now() {
    let mut s = Sim::new();
    s.push("q", "p", "old");
    let a = s.pop("q", Some("a"), 10);
    let b = s.pop("q", Some("b"), 10);
    assert_eq!(txns(&a), ["old"]);
    assert_eq!(txns(&b), ["old"]);
    assert!(
        s.pop_with("q", None, Some("late"), 10, 1, Subscription::New)
            .is_empty()
    );
    s.advance_secs(1);
    s.push("q", "p", "fresh");
    let late = s.pop_with("q", None, Some("late"), 10, 1, Subscription::All);
    assert_eq!(txns(&late), ["fresh"], "the first choice sticks");
    assert!(
        s.pop("q", None, 10).claims[0].messages.len() == 2,
        "queue mode starts at the oldest"
    );
}

#[test]
fn one_pop_claims_several_partitions_under_one_lease() {
    let mut s = Sim::new();
    for p in ["a", "b", "c"] {
        s.push("q", p, &format!("{p}0"));
    }
    let pop = s.pop_with("q", None, None, 10, 2, Subscription::Default);
    assert_eq!(pop.claims.len(), 2);
    let Outcome::Extend {
        success, renewed, ..
    } = s.apply(Command::ExtendLease {
        lease_id: lease(&pop.lease_id),
    })
    else {
        panic!()
    };
    assert!(success);
    assert_eq!(renewed, 2);
    assert_eq!(
        txns(&s.pop_with("q", None, None, 10, 5, Subscription::Default)),
        ["c0"]
    );
}

#[test]
fn extending_an_expired_lease_fails() {
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            lease_time: 1,
            ..QueueOptions::default()
        },
    );
    s.push("q", "Default", "t");
    let p = s.pop("q", None, 1);
    s.advance_secs(2);
    let Outcome::Extend { success, .. } = s.apply(Command::ExtendLease {
        lease_id: lease(&p.lease_id),
    }) else {
        panic!()
    };
    assert!(!success);
}

#[test]
fn retention_deletes_old_messages_through_ticks_and_frees_their_dedup() {
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            retention_seconds: 10,
            ..QueueOptions::default()
        },
    );
    s.push("q", "p", "t0");
    s.advance_secs(5);
    s.push("q", "p", "t1");
    s.advance_secs(6);
    s.apply(Command::Tick);
    let v = reads::queue_view(&s.store, "q").unwrap().unwrap();
    let p = v.partitions.iter().find(|p| p.name == "p").unwrap();
    assert_eq!((p.log_start, p.next_offset), (1, 2));
    assert_eq!(v.queue.messages, 1);
    assert_eq!(
        s.push("q", "p", "t0").status,
        PushStatus::Queued,
        "dedup lasts as long as the original"
    );
    assert_eq!(s.push("q", "p", "t1").status, PushStatus::Duplicate);
}

#[test]
fn completed_retention_waits_for_every_group() {
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            completed_retention_seconds: 1,
            ..QueueOptions::default()
        },
    );
    s.push("q", "p", "t0");
    let a = s.pop("q", Some("a"), 1);
    let _b = s.pop("q", Some("b"), 1);
    s.ack(Some("a"), &a, 0, "completed");
    s.advance_secs(2);
    s.apply(Command::Tick);
    assert_eq!(
        reads::queue(&s.store, "q").unwrap().unwrap().messages,
        1,
        "group b has not consumed it"
    );
}

#[test]
fn deleting_a_queue_removes_everything_in_bounded_ticks() {
    let mut s = Sim::new();
    for i in 0..50 {
        s.push("q", &format!("p{}", i % 3), &format!("t{i}"));
    }
    let Outcome::Deleted { existed } = s.apply(Command::DeleteQueue {
        queue: QueueName::new("q").unwrap(),
    }) else {
        panic!()
    };
    assert!(existed);
    assert!(s.pop("q", None, 10).is_empty());
    for _ in 0..3 {
        s.apply(Command::Tick);
    }
    // Only meta keys and the lease expiry-free tables remain.
    assert!(s.store.len() < 8, "rows left: {}", s.store.len());
    assert_eq!(
        s.push("q", "p0", "t0").status,
        PushStatus::Queued,
        "a new queue of the same name starts empty"
    );
}

#[test]
fn delayed_processing_hides_messages_until_due() {
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            delayed_processing: 10,
            ..QueueOptions::default()
        },
    );
    s.push("q", "Default", "t");
    assert!(s.pop("q", None, 1).is_empty());
    s.advance_secs(11);
    assert_eq!(txns(&s.pop("q", None, 1)), ["t"]);
}

#[test]
fn max_size_refuses_per_item() {
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            max_size: 1,
            ..QueueOptions::default()
        },
    );
    assert_eq!(s.push("q", "Default", "a").status, PushStatus::Queued);
    assert!(matches!(
        s.push("q", "Default", "b").status,
        PushStatus::Failed(_)
    ));
}

#[test]
fn unknown_ack_targets_are_refused_not_errors() {
    let mut s = Sim::new();
    s.push("q", "p", "t");
    let Outcome::Ack(v) = s.apply(Command::Ack {
        group: GroupName::queue_mode(),
        items: vec![
            AckItem {
                transaction_id: tid("t"),
                partition_id: PartitionRef::parse("999"),
                status: "completed".into(),
                error: None,
                lease_id: None,
            },
            AckItem {
                transaction_id: tid("t"),
                partition_id: PartitionRef::parse("nope"),
                status: "completed".into(),
                error: None,
                lease_id: None,
            },
            AckItem {
                transaction_id: tid("t"),
                partition_id: PartitionRef::parse("1"),
                status: "weird".into(),
                error: None,
                lease_id: None,
            },
        ],
    }) else {
        panic!()
    };
    assert!(
        v.iter()
            .all(|o| !o.verdict.success && o.verdict.error.is_some())
    );
}

#[test]
fn would_pop_writes_nothing() {
    let mut s = Sim::new();
    s.push("q", "p", "t");
    let before = s.store.clone();
    let cmd = PopCommand {
        queue: QueueName::new("q").unwrap(),
        partition: None,
        group: GroupName::new("g").unwrap(),
        batch: 1,
        max_partitions: 1,
        lease_id: lease("x"),
        auto_ack: false,
        subscription: Subscription::Default,
    };
    assert!(
        !reads::would_pop(&s.store, queen_domain::time::Stamp(s.now), &cmd)
            .unwrap()
            .is_empty()
    );
    assert_eq!(before, s.store);
}

#[test]
fn the_sink_hold_keeps_what_the_lake_has_not_committed_up_to_its_cap() {
    use queen_domain::kv::{Expiry, KvOp};
    use queen_domain::sink::documents;
    let mut s = Sim::new();
    let o = QueueOptions {
        retention_seconds: 10,
        retention_sink_hold: Some("default".into()),
        retention_sink_hold_max_seconds: 1000,
        ..QueueOptions::default()
    };
    s.configure("q", o);
    let t0 = s.now;
    s.push("q", "p", "t0");
    s.advance_secs(5);
    s.push("q", "p", "t1");
    s.advance_secs(20);
    s.apply(Command::Tick);
    let part = |s: &Sim| {
        reads::partition_by_name(&s.store, "q", "p")
            .unwrap()
            .unwrap()
    };
    assert_eq!(
        part(&s).log_start,
        0,
        "no commit pointer yet: everything younger than the cap stays"
    );
    let pointer = format!(r#"{{"k":1,"tEnd":{}}}"#, t0 + 62_000_000);
    s.apply(Command::Kv(vec![KvOp::Put {
        ns: documents::NS.into(),
        key: documents::pointer_key("default", "q"),
        value: pointer.into_bytes(),
        expiry: Expiry::Forever,
        expect: None,
        required: true,
    }]));
    s.apply(Command::Tick);
    let p = part(&s);
    assert_eq!(
        p.log_start, 1,
        "t0 is older than the pointer minus a minute, t1 is not"
    );
    assert!(
        reads::purged_stamp(&s.store, p.pid)
            .unwrap()
            .is_some_and(|t| t.0 >= t0 && t.0 < t0 + 1_000_000)
    );
    s.advance_secs(1000);
    s.apply(Command::Tick);
    assert_eq!(
        part(&s).log_start,
        2,
        "past retentionSinkHoldMaxSeconds the hold lets go"
    );
}

#[test]
fn a_leader_change_holds_leases_past_their_expiry_by_the_clock_skew() {
    // Without a leader change a lease ends at its expiry.
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            lease_time: 2,
            ..QueueOptions::default()
        },
    );
    s.push("q", "p", "t1");
    assert_eq!(txns(&s.pop("q", None, 1)), ["t1"]);
    s.advance_ms(2100);
    assert_eq!(
        txns(&s.pop("q", None, 1)),
        ["t1"],
        "redelivered 100 ms past expiry"
    );

    // After a leader change the same lease is held the default 500 ms past its expiry: not
    // redelivered, not expired by a tick, still good for an extension and an ack.
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            lease_time: 2,
            ..QueueOptions::default()
        },
    );
    s.push("q", "p", "t1");
    s.push("q", "p", "t2");
    let first = s.pop("q", None, 1);
    assert_eq!(txns(&first), ["t1"]);
    s.advance_ms(1000);
    s.leader_change();
    s.advance_ms(1100);
    s.apply(Command::Tick);
    assert!(
        s.pop("q", None, 1).is_empty(),
        "held within the skew of its expiry"
    );
    let v = s.ack(None, &first, 0, "completed");
    assert!(
        v.success && v.lease_released,
        "the holder's ack is accepted: {v:?}"
    );
    let second = s.pop("q", None, 1);
    assert_eq!(txns(&second), ["t2"]);
    // The hold is over once every lease granted before the change is past expiry + skew;
    // a lease granted afterwards expires on time again.
    s.advance_ms(2100);
    assert_eq!(
        txns(&s.pop("q", None, 1)),
        ["t2"],
        "redelivered after the hold ended"
    );

    // The leader's setting replaces the default; 0 turns the hold off.
    for (skew, held) in [(0, false), (1500, true)] {
        let mut s = Sim::new();
        s.apply(Command::ClusterSettings {
            version: 1,
            max_clock_skew_ms: skew,
        });
        s.configure(
            "q",
            QueueOptions {
                lease_time: 2,
                ..QueueOptions::default()
            },
        );
        s.push("q", "p", "t1");
        s.pop("q", None, 1);
        s.leader_change();
        s.advance_ms(2000 + 1000);
        let at_1s = s.pop("q", None, 1);
        if held {
            assert!(at_1s.is_empty(), "skew {skew} ms: held 1 s past expiry");
            s.advance_ms(600);
            assert_eq!(
                txns(&s.pop("q", None, 1)),
                ["t1"],
                "skew {skew} ms, 1.6 s past expiry"
            );
        } else {
            assert_eq!(txns(&at_1s), ["t1"], "skew 0: redelivered 1 s past expiry");
        }
    }
}

#[test]
fn the_cluster_version_only_rises() {
    let mut s = Sim::before_ready_index();
    assert_eq!(reads::cluster_version(&s.store).unwrap(), 0);
    let r = s.apply(Command::ClusterSettings {
        version: 2,
        max_clock_skew_ms: 500,
    });
    assert_eq!(r, Outcome::ClusterSettings { version: 2 });
    let r = s.apply(Command::ClusterSettings {
        version: 1,
        max_clock_skew_ms: 700,
    });
    assert_eq!(r, Outcome::ClusterSettings { version: 2 }, "never lowered");
    assert_eq!(reads::cluster_version(&s.store).unwrap(), 2);
    assert_eq!(reads::max_clock_skew_ms(&s.store).unwrap(), Some(700));
}

#[test]
fn an_ack_takes_the_offset_its_proposer_found_while_the_lease_still_covers_it() {
    // Four messages under one lease, the first acknowledged; the proposer finds each where it is.
    let mut s = Sim::new();
    for t in ["a", "b", "c", "d"] {
        s.push("q", "p", t);
    }
    let pop = s.pop("q", None, 4);
    let pid = pop.claims[0].pid;
    let item = |t: &str| AckItem {
        transaction_id: tid(t),
        partition_id: PartitionRef::Id(pid),
        status: "completed".into(),
        error: None,
        lease_id: Some(lease(&pop.lease_id)),
    };
    let group = GroupName::queue_mode();
    assert!(s.ack(None, &pop, 0, "completed").success);
    let found =
        queen_domain::machine::resolve_ack_offsets(&s.store, &group, &[item("c")], |_, _, _| None)
            .unwrap();
    let at = |m: &PopOutcome, t: &str| {
        m.claims[0]
            .messages
            .iter()
            .find(|x| x.transaction_id == t)
            .unwrap()
            .offset
    };
    assert_eq!(found, [Some(at(&pop, "c"))]);
    // The replica takes the offset it is given instead of reading the messages: an entry
    // that says "b" is at c's offset moves the cursor past c (no proposer writes that; it
    // shows the offset is what the apply used).
    let cursor = |s: &Sim| {
        reads::cursor(&s.store, pid, group.as_str())
            .unwrap()
            .unwrap()
            .next
    };
    let mut taken = s.clone();
    let Outcome::Ack(v) = taken.apply(Command::AckAt {
        group: group.clone(),
        items: vec![item("b")],
        offsets: vec![Some(at(&pop, "c"))],
    }) else {
        panic!()
    };
    assert!(v[0].verdict.success);
    assert_eq!(cursor(&taken), at(&pop, "c") + 1);
    // An offset outside what the lease still covers (behind the cursor, or past the lease's
    // end) is not taken: the messages are read, as for a plain ack.
    for wrong in [at(&pop, "a"), at(&pop, "d") + 1] {
        let mut read = s.clone();
        let Outcome::Ack(v) = read.apply(Command::AckAt {
            group: group.clone(),
            items: vec![item("b")],
            offsets: vec![Some(wrong)],
        }) else {
            panic!()
        };
        assert!(v[0].verdict.success);
        assert_eq!(cursor(&read), at(&pop, "b") + 1, "offset {wrong}");
    }
}
