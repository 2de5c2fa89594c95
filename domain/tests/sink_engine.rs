//! The window commit engine and the recovery decision together, in-process: a queue of ten
//! windows runs against a KV store and a bucket held in memory, and the process "crashes"
//! (forgets everything not stored) after chosen actions. Whatever the crashes, the bucket
//! must end holding every window's objects once, under the same keys, with the same bytes, and
//! the pointer must name the last window.
//!
//! A second simulation has several owners compete for the queue's lease: the fenced KV writes
//! (intent, pointer) succeed only under the lease version the writer holds; any call may fail
//! before it takes effect or after (its answer lost); owners pause past their lease and wake up
//! as zombies that go on with what they knew, and crash. Everything comes from one seed.
//!
//! Every run is named by its seed; a failure prints it, and
//! `QUEEN_SINK_ENGINE_SEED=<seed> cargo test -p queen-domain --test sink_engine` (one owner) or
//! `QUEEN_SINK_SIM_SEED=<seed> cargo test -p queen-domain --test sink_engine` (competing
//! owners) replays it exactly.

use std::collections::BTreeMap;

use queen_domain::sink::commit::{Intent, Manifest, ManifestObject, Pointer, Recovery, recover};
use queen_domain::sink::engine::{Action, Event, Put, Stop, WindowCommit};

const WRITER: &str = "queen-s3/test jsonl";
const WINDOW: u64 = 10;
const END: u64 = 100;
const WINDOWS: u64 = END / WINDOW;

/// A tiny deterministic generator (splitmix64), so a seed names a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// What survives a crash: the KV documents and the bucket.
#[derive(Default)]
struct Stored {
    pointer: Option<Pointer>,
    intent: Option<Intent>,
    bucket: BTreeMap<String, Vec<u8>>,
    created: BTreeMap<String, u32>,
}

impl Stored {
    fn put_create(&mut self, key: &str, bytes: Vec<u8>) -> Put {
        match self.bucket.get(key) {
            Some(b) if *b == bytes => Put::Identical,
            Some(_) => Put::Different,
            None => {
                self.bucket.insert(key.to_owned(), bytes);
                *self.created.entry(key.to_owned()).or_default() += 1;
                Put::Created
            }
        }
    }
}

fn object_key(k: u64) -> String {
    format!("q/k={k:04}/part-0.jsonl")
}

fn manifest_key(k: u64) -> String {
    format!("q/k={k:04}/manifest.json")
}

/// The records of a window are the stamps in it (one every 3 µs); the object is their
/// encoding under the intent's writer: the same intent always gives the same bytes.
fn object_bytes(i: &Intent) -> Vec<u8> {
    let stamps: Vec<u64> = (i.t_start..i.t_end).filter(|t| t % 3 == 0).collect();
    format!("{}:{stamps:?}", i.writer).into_bytes()
}

fn manifest_bytes(i: &Intent, objects: &[ManifestObject], run: u64) -> Vec<u8> {
    let m = Manifest {
        sink: "default".into(),
        tenant: "t".into(),
        queue: "q".into(),
        k: i.k,
        t_start: i.t_start,
        t_end: i.t_end,
        format: "jsonl".into(),
        compression: "none".into(),
        layout: "merged".into(),
        objects: objects.to_vec(),
        records: objects.iter().map(|o| o.records).sum(),
        bytes: objects.iter().map(|o| o.bytes).sum(),
        partitions: 1,
        min_ts: i.t_start,
        max_ts: i.t_end,
        lost: Vec::new(),
        writer: i.writer.clone(),
        // The one wall-clock field: a manifest written again after a crash differs here.
        committed_at: format!("run {run}"),
    };
    serde_json::to_vec(&m).unwrap()
}

/// What a (re)started owner does, decided from what is stored: the window to work on, or
/// `None` when the queue is done.
fn start(stored: &Stored) -> Option<WindowCommit> {
    let manifest = stored
        .intent
        .as_ref()
        .and_then(|i| stored.bucket.get(&manifest_key(i.k)))
        .and_then(|b| serde_json::from_slice::<Manifest>(b).ok());
    let decision = recover(
        stored.pointer.as_ref(),
        stored.intent.as_ref(),
        manifest.as_ref(),
        WRITER,
    )
    .expect("recoverable");
    Some(match decision {
        Recovery::Continue { from, .. } if from >= END => return None,
        Recovery::Continue { next_k, from } => WindowCommit::new(Intent {
            k: next_k,
            t_start: from,
            t_end: from + WINDOW,
            writer: WRITER.into(),
        }),
        Recovery::Redo(i) => WindowCommit::redo(i),
        Recovery::CommitUploaded { intent, manifest } => {
            WindowCommit::commit_uploaded(intent, manifest.objects)
        }
    })
}

/// Runs `action` of `w` against `stored` (the KV documents and the bucket) and answers what
/// happened; `None` for `Nothing`. `run` tells this owner's manifests apart.
fn perform(stored: &mut Stored, w: &WindowCommit, action: Action, run: u64) -> Option<Event> {
    let intent = w.intent().clone();
    Some(match action {
        Action::WriteIntent(i) => {
            stored.intent = Some(i);
            Event::IntentWritten
        }
        Action::CloseAt(_) => Event::Closed,
        Action::CheckPointer => Event::Pointer(stored.pointer.as_ref().map_or(0, |p| p.k)),
        Action::Upload => {
            let bytes = object_bytes(&intent);
            let object = ManifestObject {
                key: object_key(intent.k),
                bytes: bytes.len() as u64,
                records: (intent.t_start..intent.t_end)
                    .filter(|t| t % 3 == 0)
                    .count() as u64,
                sha256: format!("{:x}", bytes.iter().map(|b| u64::from(*b)).sum::<u64>()),
            };
            let put = stored.put_create(&object.key, bytes);
            assert_ne!(
                put,
                Put::Different,
                "an object changed its bytes: {}",
                object.key
            );
            Event::Uploaded(vec![object])
        }
        Action::PutManifest => {
            let bytes = manifest_bytes(&intent, w.objects(), run);
            Event::ManifestPut(stored.put_create(&manifest_key(intent.k), bytes))
        }
        Action::ReadManifest => {
            let found = stored
                .bucket
                .get(&manifest_key(intent.k))
                .and_then(|b| serde_json::from_slice::<Manifest>(b).ok());
            Event::ManifestFound(
                found.is_some_and(|m| m.names(&intent) && m.objects == w.objects()),
            )
        }
        Action::MovePointer(p) => {
            stored.pointer = Some(p);
            Event::PointerMoved
        }
        Action::Nothing => return None,
    })
}

/// Run the queue to its end, crashing where `crash` says (it is told each action's number);
/// answers the actions run and the crashes.
fn run(stored: &mut Stored, mut crash: impl FnMut(u64) -> bool) -> (u64, u64) {
    let (mut actions, mut crashes, mut run) = (0u64, 0u64, 0u64);
    let mut engine: Option<WindowCommit> = None;
    for _ in 0..100_000 {
        let w = match engine.as_mut() {
            Some(w) => w,
            // A (re)start: decide from what is stored.
            None => match start(stored) {
                Some(w) => engine.insert(w),
                None => return (actions, crashes),
            },
        };
        let Some(event) = perform(stored, w, w.next(), run) else {
            engine = None;
            continue;
        };
        w.on(event).expect("one owner is never stopped");
        actions += 1;
        if crash(actions) {
            engine = None;
            crashes += 1;
            run += 1;
        }
    }
    panic!("the queue did not finish within 100,000 steps");
}

/// Every window is in the bucket once, with the bytes its intent gives, listed by a manifest
/// that names it, and the pointer names the last window.
fn check(stored: &Stored, seed: &str) {
    assert_eq!(
        stored.pointer,
        Some(Pointer {
            k: WINDOWS,
            t_end: END
        }),
        "{seed}"
    );
    for k in 1..=WINDOWS {
        let intent = Intent {
            k,
            t_start: (k - 1) * WINDOW,
            t_end: k * WINDOW,
            writer: WRITER.into(),
        };
        assert_eq!(
            stored.bucket.get(&object_key(k)),
            Some(&object_bytes(&intent)),
            "window {k}'s object ({seed})"
        );
        assert_eq!(stored.created.get(&object_key(k)), Some(&1), "{seed}");
        let m: Manifest = serde_json::from_slice(&stored.bucket[&manifest_key(k)]).unwrap();
        assert!(m.names(&intent), "window {k}'s manifest ({seed})");
        assert_eq!(m.objects.len(), 1, "{seed}");
    }
    assert_eq!(
        stored.bucket.len() as u64,
        2 * WINDOWS,
        "nothing else ({seed})"
    );
}

#[test]
fn without_a_crash_every_window_commits_once() {
    let mut stored = Stored::default();
    let (actions, crashes) = run(&mut stored, |_| false);
    assert_eq!(
        (actions, crashes),
        (5 * WINDOWS, 0),
        "intent, pointer check, upload, manifest, pointer"
    );
    check(&stored, "no crash");
}

#[test]
fn a_crash_after_any_single_action_changes_nothing_in_the_lake() {
    for at in 1..=5 * WINDOWS {
        let mut stored = Stored::default();
        let (_, crashes) = run(&mut stored, |n| n == at);
        assert_eq!(crashes, 1);
        check(&stored, &format!("one crash after action {at}"));
    }
}

#[test]
#[allow(clippy::disallowed_methods, reason = "a test: the seed to replay")]
fn crashes_after_random_actions_over_many_seeds() {
    let seeds: Vec<u64> = match std::env::var("QUEEN_SINK_ENGINE_SEED") {
        Ok(s) => vec![s.parse().expect("QUEEN_SINK_ENGINE_SEED is a number")],
        Err(_) => (0..500).collect(),
    };
    let mut total = 0;
    for seed in seeds {
        let name = format!("seed {seed}: replay with QUEEN_SINK_ENGINE_SEED={seed}");
        let mut rng = Rng(seed);
        let percent = 5 + seed % 40;
        let mut stored = Stored::default();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let (_, crashes) = run(&mut stored, |_| rng.chance(percent));
            check(&stored, &name);
            crashes
        }));
        match result {
            Ok(c) => total += c,
            Err(e) => {
                eprintln!("{name}");
                std::panic::resume_unwind(e);
            }
        }
    }
    assert!(total > 0, "some runs crashed");
}

/// Ticks a lease lasts after it is taken or renewed.
const LEASE_TICKS: u64 = 20;

/// The queue's sink lease in KV: its holder, its version (every take-over raises it), and when
/// it expires on the simulated clock.
#[derive(Default)]
struct Lease {
    holder: Option<usize>,
    version: u64,
    expires: u64,
}

/// One sink instance (a node) competing for the queue.
#[derive(Default)]
struct Owner {
    /// The lease version it believes it holds.
    holds: Option<u64>,
    engine: Option<WindowCommit>,
    /// Paused (SIGSTOP, a stall) until this tick; it then goes on with what it knew.
    paused_until: u64,
    /// Its (re)starts, which tell its manifests apart.
    run: u64,
}

/// What a simulation did.
#[derive(Default, Debug, Clone, Copy)]
struct Tally {
    steps: u64,
    takeovers: u64,
    pauses: u64,
    crashes: u64,
    failed_calls: u64,
    lost_answers: u64,
    /// Fenced writes refused, or renewals that found the lease taken: the owner let go.
    fenced_out: u64,
    /// A zombie found the pointer past its window and stopped (`Stop::Passed`).
    passed: u64,
}

impl Tally {
    fn add(&mut self, o: Tally) {
        self.steps += o.steps;
        self.takeovers += o.takeovers;
        self.pauses += o.pauses;
        self.crashes += o.crashes;
        self.failed_calls += o.failed_calls;
        self.lost_answers += o.lost_answers;
        self.fenced_out += o.fenced_out;
        self.passed += o.passed;
    }
}

/// Owners that compete for one queue until its last window is committed; the store and what
/// happened.
fn compete(rng: &mut Rng, owners: usize) -> (Stored, Tally) {
    let mut stored = Stored::default();
    let mut lease = Lease::default();
    let mut all: Vec<Owner> = (0..owners).map(|_| Owner::default()).collect();
    let mut t = Tally::default();
    for now in 0..300_000_u64 {
        if stored.pointer.as_ref().is_some_and(|p| p.k == WINDOWS) {
            return (stored, t);
        }
        t.steps += 1;
        let i = usize::try_from(rng.next() % owners as u64).expect("small");
        let o = &mut all[i];
        if now < o.paused_until {
            continue;
        }
        if rng.chance(1) {
            // A crash: everything in memory is gone.
            *o = Owner {
                run: o.run + 1,
                ..Owner::default()
            };
            t.crashes += 1;
            continue;
        }
        if rng.chance(1) {
            o.paused_until = now + rng.next() % (3 * LEASE_TICKS * owners as u64);
            t.pauses += 1;
            continue;
        }
        // The lease: take it when it is free, expired or already this owner's; renew it now
        // and then (a renewal that finds it taken lets the queue go).
        let Some(held) = o.holds else {
            if lease.expires <= now || lease.holder == Some(i) {
                if lease.holder != Some(i) {
                    t.takeovers += 1;
                }
                lease.version += 1;
                lease.holder = Some(i);
                lease.expires = now + LEASE_TICKS;
                o.holds = Some(lease.version);
                o.engine = None;
            }
            continue;
        };
        if rng.chance(30) {
            if lease.version != held {
                o.holds = None;
                o.engine = None;
                t.fenced_out += 1;
                continue;
            }
            lease.expires = now + LEASE_TICKS;
        }
        let w = match o.engine.as_mut() {
            Some(w) => w,
            None => match start(&stored) {
                Some(w) => o.engine.insert(w),
                None => continue,
            },
        };
        let action = w.next();
        if matches!(action, Action::WriteIntent(_) | Action::MovePointer(_))
            && lease.version != held
        {
            // The fenced KV batch is refused: another owner took the queue.
            o.holds = None;
            o.engine = None;
            t.fenced_out += 1;
            continue;
        }
        if rng.chance(5) {
            // The call failed before it took effect.
            w.interrupted();
            t.failed_calls += 1;
            continue;
        }
        let Some(event) = perform(&mut stored, w, action, o.run * 100 + i as u64) else {
            o.engine = None;
            continue;
        };
        if rng.chance(5) {
            // It took effect, but its answer was lost.
            w.interrupted();
            t.lost_answers += 1;
            continue;
        }
        match w.on(event) {
            Ok(()) => {}
            Err(Stop::Passed { .. }) => {
                o.holds = None;
                o.engine = None;
                t.passed += 1;
            }
            Err(e) => panic!("owner {i}: {e}"),
        }
    }
    panic!("the queue did not finish within 300,000 ticks");
}

#[test]
#[allow(clippy::disallowed_methods, reason = "a test: the seed to replay")]
fn competing_owners_with_pauses_lost_answers_and_takeovers_over_many_seeds() {
    let seeds: Vec<u64> = match std::env::var("QUEEN_SINK_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("QUEEN_SINK_SIM_SEED is a number")],
        Err(_) => (0..1000).collect(),
    };
    let mut total = Tally::default();
    for seed in &seeds {
        let name = format!("seed {seed}: replay with QUEEN_SINK_SIM_SEED={seed}");
        let mut rng = Rng(*seed);
        let owners = 2 + usize::try_from(seed % 2).expect("small");
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let (stored, tally) = compete(&mut rng, owners);
            check(&stored, &name);
            tally
        }));
        match result {
            Ok(tally) => total.add(tally),
            Err(e) => {
                eprintln!("{name}");
                std::panic::resume_unwind(e);
            }
        }
    }
    println!("{} seeds: {total:?}", seeds.len());
    if seeds.len() > 1 {
        // The runs must have gone through what they are meant to test.
        assert!(
            total.takeovers > 0 && total.pauses > 0 && total.crashes > 0,
            "{total:?}"
        );
        assert!(
            total.lost_answers > 0 && total.failed_calls > 0,
            "{total:?}"
        );
        assert!(
            total.fenced_out > 0 && total.passed > 0,
            "zombies were fenced: {total:?}"
        );
    }
}
