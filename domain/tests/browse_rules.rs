//! Message browsing: each stored message's standing for a group, pages with and without a
//! status filter, and one message by partition and transactionId.

mod common;
use common::*;
use queen_domain::browse::{self, Status};
use queen_domain::time::Stamp;

const GROUP: &str = queen_domain::names::QUEUE_MODE_GROUP;

#[test]
fn each_message_stands_where_the_group_left_it() {
    let mut s = Sim::new();
    s.configure(
        "q",
        QueueOptions {
            retry_limit: 0,
            ..QueueOptions::default()
        },
    );
    for t in ["a", "b", "c", "d"] {
        s.push("q", "p", t);
    }
    let first = s.pop("q", None, 2);
    assert_eq!(txns(&first), vec!["a", "b"]);
    s.ack(None, &first, 0, "completed");
    s.ack(None, &first, 1, "failed");
    let second = s.pop("q", None, 1);
    assert_eq!(txns(&second), vec!["c"]);
    let now = Stamp(s.now);
    let l = browse::list(&s.store, "q", None, GROUP, None, 0, 10, None, now).unwrap();
    let (page, total) = (l.page, l.total);
    assert_eq!(total, Some(4));
    let seen: Vec<(&str, Status)> = page
        .iter()
        .map(|b| (b.message.transaction_id.as_str(), b.status))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("a", Status::Completed),
            ("b", Status::DeadLetter),
            ("c", Status::Processing),
            ("d", Status::Pending),
        ]
    );
    // A filtered page, and a page past a skip.
    let pending = browse::list(
        &s.store,
        "q",
        Some("p"),
        GROUP,
        Some(Status::Pending),
        0,
        10,
        None,
        now,
    )
    .unwrap();
    assert_eq!((pending.page.len(), pending.total), (1, None));
    let skipped = browse::list(&s.store, "q", None, GROUP, None, 3, 10, None, now)
        .unwrap()
        .page;
    assert_eq!(skipped[0].message.transaction_id, "d");
    // One message by partition and transactionId; an unknown one is none.
    let pid = page[0].partition.pid;
    let b = browse::one(&s.store, pid, "b", GROUP, now)
        .unwrap()
        .unwrap();
    assert_eq!((b.offset, b.status), (1, Status::DeadLetter));
    assert!(
        browse::one(&s.store, pid, "zz", GROUP, now)
            .unwrap()
            .is_none()
    );
    assert!(
        browse::one(&s.store, pid + 99, "a", GROUP, now)
            .unwrap()
            .is_none()
    );
}
