//! The autopilot's rule, one behaviour per test.

use super::*;

const LEFT: SetKnobs = SetKnobs {
    batch: None,
    partitions: None,
    wait: None,
};

fn backlog(messages: u64, partitions: u64) -> Option<Backlog> {
    Some(Backlog {
        messages,
        partitions,
    })
}

fn after_pops(pops: &[LastPop]) -> History {
    pops.iter()
        .fold(History::default(), |h, p| h.after(*p, true))
}

fn empty(width: u32, batch: u32) -> LastPop {
    LastPop {
        width,
        batch,
        claimed: 0,
        delivered: 0,
    }
}

#[test]
fn a_deep_backlog_over_many_partitions_widens_the_sweep() {
    let c = choose(backlog(5_000, 5_000), History::default(), LEFT, true);
    assert_eq!((c.partitions, c.batch, c.hold_ms), (MAX_WIDTH, 100, None));
    let c = choose(
        backlog(1_000_000, 1_000_000),
        History::default(),
        LEFT,
        true,
    );
    assert_eq!((c.partitions, c.batch), (MAX_WIDTH, 100));
    // Ten messages a partition: fifty partitions fill the largest budget.
    let c = choose(backlog(10_000, 1_000), History::default(), LEFT, true);
    assert_eq!((c.partitions, c.batch), (50, MAX_BATCH));
}

#[test]
fn a_queue_of_few_deep_partitions_sweeps_one_with_a_large_batch() {
    let c = choose(backlog(50_000, 1), History::default(), LEFT, true);
    assert_eq!((c.partitions, c.batch), (1, MAX_BATCH));
    let c = choose(backlog(50_000, 10), History::default(), LEFT, true);
    assert_eq!((c.partitions, c.batch), (1, MAX_BATCH));
    // Never wider than the queue.
    let c = choose(backlog(6, 3), History::default(), LEFT, true);
    assert_eq!((c.partitions, c.batch), (3, MIN_BATCH));
}

#[test]
fn knobs_the_client_set_are_used_exactly() {
    let set = SetKnobs {
        batch: Some(7),
        partitions: Some(3),
        wait: Some(false),
    };
    let streak = after_pops(&[empty(3, 7), empty(3, 7)]);
    for (b, h) in [
        (backlog(5_000, 5_000), History::default()),
        (backlog(1, 1), streak),
        (None, streak),
    ] {
        let c = choose(b, h, set, true);
        assert_eq!((c.batch, c.partitions, c.hold_ms), (7, 3, None));
    }
    // One knob set: the other is chosen around it.
    let only_batch = SetKnobs {
        batch: Some(20),
        ..LEFT
    };
    let c = choose(backlog(5_000, 5_000), History::default(), only_batch, true);
    assert_eq!((c.batch, c.partitions), (20, 20));
    let only_width = SetKnobs {
        partitions: Some(1),
        ..LEFT
    };
    let c = choose(backlog(5_000, 5_000), History::default(), only_width, true);
    assert_eq!((c.batch, c.partitions), (MIN_BATCH, 1));
}

#[test]
fn empty_pops_grow_the_wait_advice_and_a_delivery_resets_it() {
    let mut h = History::default();
    let mut advice = Vec::new();
    for _ in 0..8 {
        h = h.after(empty(1, 200), true);
        advice.push(h.wait_advice_ms());
    }
    assert_eq!(advice, [100, 200, 400, 800, 1_600, 2_000, 2_000, 2_000]);
    let full = LastPop {
        width: 1,
        batch: 10,
        claimed: 1,
        delivered: 10,
    };
    assert_eq!(h.after(full, true).wait_advice_ms(), 0);
    // The streak saturates instead of overflowing.
    let long = History {
        empty_streak: u32::MAX,
        last: None,
    };
    assert_eq!(long.after(empty(1, 1), true).wait_advice_ms(), MAX_WAIT_MS);
}

#[test]
fn a_client_that_did_not_say_whether_to_wait_is_held_after_empty_pops() {
    let c = choose(backlog(0, 4), History::default(), LEFT, true);
    assert_eq!(c.hold_ms, None, "the first pop answers at once");
    let h = after_pops(&[empty(4, 10), empty(4, 10)]);
    assert_eq!(choose(backlog(0, 4), h, LEFT, true).hold_ms, Some(200));
    let said = SetKnobs {
        wait: Some(false),
        ..LEFT
    };
    assert_eq!(choose(backlog(0, 4), h, said, true).hold_ms, None);
}

#[test]
fn a_sweep_that_was_too_narrow_for_its_budget_doubles() {
    // The counters say a thousand messages a partition (delivered ones still retained), the
    // consumer's pops find one: the width follows what the pops found.
    let b = backlog(1_000_000, 1_000);
    let mut h = History::default();
    let mut widths = Vec::new();
    for _ in 0..9 {
        let c = choose(b, h, LEFT, true);
        widths.push(c.partitions);
        let got = LastPop {
            width: c.partitions,
            batch: c.batch,
            claimed: c.partitions,
            delivered: c.partitions,
        };
        h = h.after(got, true);
    }
    assert_eq!(widths, [1, 2, 4, 8, 16, 32, 64, 100, 100]);
    // A sweep that filled its budget keeps its width; one that found fewer ready partitions
    // than it was allowed goes back to the queue's figure.
    let filled = LastPop {
        width: 64,
        batch: 500,
        claimed: 64,
        delivered: 500,
    };
    let h = History::default().after(filled, true);
    assert_eq!(choose(b, h, LEFT, true).partitions, 64);
    let short = LastPop {
        width: 64,
        batch: 500,
        claimed: 3,
        delivered: 3,
    };
    let h = History::default().after(short, true);
    assert_eq!(choose(b, h, LEFT, true).partitions, 1);
}

#[test]
fn the_partition_route_and_an_unknown_queue_keep_the_defaults() {
    let c = choose(backlog(5_000, 5_000), History::default(), LEFT, false);
    assert_eq!((c.partitions, c.batch), (1, MIN_BATCH));
    let c = choose(backlog(50_000, 5), History::default(), LEFT, false);
    assert_eq!((c.partitions, c.batch), (1, MAX_BATCH));
    let c = choose(None, History::default(), LEFT, true);
    assert_eq!((c.partitions, c.batch), (1, DEFAULT_BATCH));
    // A pop of the partition route leaves the wildcard history as it was.
    let wide = LastPop {
        width: 50,
        batch: 500,
        claimed: 50,
        delivered: 500,
    };
    let h = History::default()
        .after(wide, true)
        .after(empty(1, 10), false);
    assert_eq!(h.last, Some(wide));
    assert_eq!(h.empty_streak, 1);
}
