//! The async runtime openraft runs on: tokio, with one change. openraft draws random numbers
//! (the election timeout, the phase of its tick) from the runtime's generator; here that
//! generator can be seeded for a whole tree of tasks, so that the deterministic simulation
//! (`crate::sim`) replays a run exactly from its seed. Outside a seeded scope (always, in the
//! product) every draw comes from a generator seeded by the operating system, as with plain
//! `TokioRuntime`.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::time::Duration;

use openraft_rt::AsyncRuntime;
use openraft_rt::OptionalSend;
use openraft_rt::Select2;
use openraft_rt::Select3;
use openraft_rt::Select4;
use openraft_rt_tokio::TokioRuntime;
use rand::SeedableRng;
use rand::rngs::SmallRng;

tokio::task_local! {
    /// The seed of the current task's generator, inside a seeded scope.
    static SEED: Cell<u64>;
}

/// SplitMix64 step with a chosen increment: a bijection with good mixing, so a parent's and a
/// child's sequences (different increments) do not meet.
fn mix(seed: u64, gamma: u64) -> u64 {
    let z = seed.wrapping_add(gamma);
    let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Increment for the next draw of the same task.
const NEXT: u64 = 0x6a09_e667_f3bc_c908;
/// Increment for a spawned child's seed.
const CHILD: u64 = 0x9e37_79b9_7f4a_7c15;

/// The current task's seed, advanced; `None` outside a seeded scope.
fn take_seed() -> Option<u64> {
    SEED.try_with(|c| {
        let s = c.get();
        c.set(mix(s, NEXT));
        s
    })
    .ok()
}

/// Draws made outside a seeded scope (tests check the simulation makes none).
#[cfg(test)]
pub(crate) static UNSEEDED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Run `future` (and every task openraft spawns from it) with its randomness drawn from `seed`.
#[cfg(test)]
pub(crate) fn seeded<F: Future>(seed: u64, future: F) -> impl Future<Output = F::Output> {
    SEED.scope(Cell::new(seed), future)
}

/// tokio, with a generator that a seeded scope makes deterministic.
#[derive(Debug)]
pub(crate) struct QueenRuntime {
    /// The runtime every call goes to.
    inner: TokioRuntime,
}

impl AsyncRuntime for QueenRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> =
        <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = SmallRng;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        match take_seed() {
            Some(seed) => TokioRuntime::spawn(SEED.scope(Cell::new(mix(seed, CHILD)), future)),
            None => TokioRuntime::spawn(future),
        }
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn select2<A, B>(
        a: A,
        b: B,
    ) -> impl Future<Output = Select2<A::Output, B::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
    {
        TokioRuntime::select2(a, b)
    }

    fn select3<A, B, C>(
        a: A,
        b: B,
        c: C,
    ) -> impl Future<Output = Select3<A::Output, B::Output, C::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
        C: Future + OptionalSend,
    {
        TokioRuntime::select3(a, b, c)
    }

    fn select4<A, B, C, D>(
        a: A,
        b: B,
        c: C,
        d: D,
    ) -> impl Future<Output = Select4<A::Output, B::Output, C::Output, D::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
        C: Future + OptionalSend,
        D: Future + OptionalSend,
    {
        TokioRuntime::select4(a, b, c, d)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        match take_seed() {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => {
                #[cfg(test)]
                UNSEEDED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                SmallRng::from_rng(&mut rand::rng())
            }
        }
    }

    type Mpsc = <TokioRuntime as AsyncRuntime>::Mpsc;
    type Watch = <TokioRuntime as AsyncRuntime>::Watch;
    type Oneshot = <TokioRuntime as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::Mutex<T>;

    fn new(threads: usize) -> Self {
        Self {
            inner: TokioRuntime::new(threads),
        }
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.inner.block_on(future)
    }

    fn spawn_blocking<F, T>(f: F) -> impl Future<Output = Result<T, io::Error>> + Send
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        TokioRuntime::spawn_blocking(f)
    }
}
