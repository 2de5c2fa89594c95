//! Bounded status reads: a queue's partitions and the group rows come a page at a time, and
//! following the cursor visits each exactly once, whatever the page size or budget.

mod common;
use common::*;
use queen_domain::pages::{self, Flow};

const GROUP: &str = queen_domain::names::QUEUE_MODE_GROUP;

fn queue_with(s: &mut Sim, partitions: usize) -> queen_domain::model::QueueRec {
    for i in 0..partitions {
        s.push("q", &format!("p{i:03}"), &format!("t{i}"));
    }
    queen_domain::reads::queue(&s.store, "q").unwrap().unwrap()
}

#[test]
fn partition_pages_visit_every_partition_once_at_any_page_size() {
    let mut s = Sim::new();
    let q = queue_with(&mut s, 10);
    for limit in 1..=11 {
        let (mut after, mut seen) = (None, Vec::new());
        for _ in 0..20 {
            let (page, next) = pages::partitions_page(&s.store, q.qid, after, limit).unwrap();
            assert!(page.len() <= limit);
            seen.extend(page.into_iter().map(|p| p.name));
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        let want: Vec<String> = (0..10).map(|i| format!("p{i:03}")).collect();
        assert_eq!(seen, want, "limit {limit}");
    }
}

#[test]
fn a_stopped_walk_answers_a_cursor_only_when_partitions_follow() {
    let mut s = Sim::new();
    let q = queue_with(&mut s, 3);
    let mut n = 0;
    let w = pages::walk_partitions(&s.store, q.qid, None, 10, &mut |_| {
        n += 1;
        Ok(if n == 3 { Flow::Stop } else { Flow::Continue })
    })
    .unwrap();
    assert_eq!((w.visited, w.next), (3, None), "stopped on the last one");
    let w = pages::walk_partitions(&s.store, q.qid, None, 3, &mut |_| Ok(Flow::Continue)).unwrap();
    assert_eq!((w.visited, w.next), (3, None), "a budget of exactly all");
    let w = pages::walk_partitions(&s.store, q.qid, None, 2, &mut |_| Ok(Flow::Continue)).unwrap();
    assert_eq!(w.visited, 2);
    assert!(w.next.is_some());
}

#[test]
fn pending_sums_say_when_they_stopped_short() {
    let mut s = Sim::new();
    let q = queue_with(&mut s, 5);
    let all = pages::pending(
        &s.store,
        &q,
        GROUP,
        queen_domain::model::SubscriptionStart::All,
        10,
    )
    .unwrap();
    assert_eq!((all.sum, all.counted, all.complete), (5, 5, true));
    let part = pages::pending(
        &s.store,
        &q,
        GROUP,
        queen_domain::model::SubscriptionStart::All,
        2,
    )
    .unwrap();
    assert_eq!((part.sum, part.counted, part.complete), (2, 2, false));
}

#[test]
fn group_rows_page_after_their_key() {
    let mut s = Sim::new();
    queue_with(&mut s, 2);
    for g in ["a", "b", "c"] {
        s.pop("q", Some(g), 1);
    }
    let keep = |_: &queen_domain::model::QueueRec, _: &str| true;
    let (mut after, mut seen) = (None::<Vec<u8>>, Vec::new());
    for _ in 0..10 {
        let (rows, next) =
            pages::group_rows(&s.store, after.as_deref(), false, 1, 100, &keep).unwrap();
        seen.extend(rows.into_iter().map(|r| r.group));
        match next {
            Some(k) => after = Some(k),
            None => break,
        }
    }
    assert_eq!(seen, ["a", "b", "c"]);
}
