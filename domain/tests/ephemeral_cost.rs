//! The ephemeral budget counts what the rings really hold: a counting allocator measures the
//! bytes live while many one-message queues, their groups and their leases exist, and the
//! rings' own count (`Rings::used`) must cover them (and not be wildly above). One test in
//! this file, so no other test allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

use queen_domain::ephemeral::{Declared, Limits, Rings, Take};

/// The system allocator, counting the bytes live.
struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only a counter is added.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> u64 {
    u64::try_from(LIVE.load(Ordering::Relaxed)).unwrap_or(0)
}

#[test]
fn the_counted_bytes_cover_what_queues_rings_groups_and_leases_allocate() {
    let limits = Limits {
        max_queues: 1_000_000,
        max_queues_per_tenant: 1_000_000,
        ..Limits::default()
    };
    let o = Declared::default().effective(&limits);
    let tenant = "\u{1}2f1c1a52-8d3e-4a7b-9c11-0e5d6f7a8b9c\u{1}";
    let mut r = Rings::new(1, limits);
    let names: Vec<String> = (0..20_000)
        .map(|i| format!("{tenant}queue-{i:06}"))
        .collect();
    let before = live();

    // One message in each of many queues (the probe's shape).
    for (i, q) in names.iter().enumerate() {
        let partition = if i % 2 == 0 { "Default" } else { "p" };
        r.push(q, partition, vec![vec![b'7'; 2]], &o, 0).unwrap();
    }
    let grown = live() - before;
    let counted = r.used();
    println!("pushed: live +{grown} B, counted {counted} B");
    assert!(
        counted >= grown,
        "counted {counted} < allocated {grown} for one-message queues"
    );
    assert!(
        counted <= grown * 3,
        "counted {counted} is far above {grown}"
    );

    // A group on each, with a lease held.
    for q in &names {
        let take = Take {
            partition: None,
            group: "a-consumer-group",
            batch: 1,
            auto_ack: false,
        };
        assert_eq!(r.pop(q, take, &o, 1).len(), 1);
    }
    let grown = live() - before;
    let counted = r.used();
    println!("leased: live +{grown} B, counted {counted} B");
    assert!(
        counted >= grown,
        "counted {counted} < allocated {grown} with a group and a lease each"
    );

    // A pop on a name the node does not hold creates nothing.
    let held = r.queue_count();
    let take = Take {
        partition: None,
        group: "g",
        batch: 1,
        auto_ack: false,
    };
    assert!(r.pop("never-pushed", take, &o, 2).is_empty());
    assert_eq!(r.queue_count(), held);

    // Everything goes: the count comes back to zero.
    for q in &names {
        assert!(r.delete(q));
    }
    assert_eq!(r.used(), 0, "every structure was uncounted");
}
