//! This process's session with the GPUs (an initialised NVML, or the simulator's stand-in for
//! it), opened on first use and closable on demand.
//!
//! The kernel's `nvidia` module does not let go of a GPU while any file handle on it is open:
//! `driver/unbind` sleeps until the last one closes, and a thread that wrote it holds the claim's
//! locks forever. An NVML session keeps every GPU it enumerated open, and so does an event set
//! registered on it. Before a GPU leaves `nvidia` the session is closed: users wait, the handles
//! still in use are given back (bounded), the session is dropped (`nvmlShutdown`), and it stays
//! closed until the caller's [`Closed`] guard goes. The next use opens a fresh one, which also
//! enumerates again: a GPU given back to `nvidia` is seen by the new session only.
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often a close looks whether the session's last users are gone.
const POLL: Duration = Duration::from_millis(10);

/// The session, shared by every user: each holds a [`Lease`] while it uses it.
pub struct SessionGate<T> {
    state: Mutex<GateState<T>>,
    reopened: Condvar,
}

struct GateState<T> {
    current: Option<Arc<T>>,
    /// Closes in progress or held: no session opens while any is.
    closes: u32,
    /// Bumped at each open: what was read through an older session (handles, enumerations) is
    /// not valid in this one.
    generation: u64,
}

/// One use of the session; the session stays open while any lease lives.
pub struct Lease<T> {
    session: Arc<T>,
    generation: u64,
}

impl<T> Lease<T> {
    /// Which session this is (see [`SessionGate`]): changes each time one is opened.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl<T> std::ops::Deref for Lease<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.session
    }
}

/// Why the session could not be closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StillInUse {
    /// Leases that were not given back in time.
    pub leases: usize,
    pub waited: Duration,
}

/// The session is closed while this lives; dropping it lets the next use open a new one.
pub struct Closed<'a, T> {
    gate: &'a SessionGate<T>,
}

impl<T> Drop for Closed<'_, T> {
    fn drop(&mut self) {
        let mut state = self.gate.lock();
        state.closes = state.closes.saturating_sub(1);
        drop(state);
        self.gate.reopened.notify_all();
    }
}

impl<T> Default for SessionGate<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> SessionGate<T> {
    /// A gate with no session open yet.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(GateState {
                current: None,
                closes: 0,
                generation: 0,
            }),
            reopened: Condvar::new(),
        }
    }

    /// A gate around a session opened already.
    pub fn opened(session: T) -> Self {
        let gate = Self::new();
        {
            let mut state = gate.lock();
            state.current = Some(Arc::new(session));
            state.generation = 1;
        }
        gate
    }

    fn lock(&self) -> MutexGuard<'_, GateState<T>> {
        // The state is a few counters and an `Arc`, consistent after any panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open session, opened with `open` if none is; waits while a close is in progress or
    /// held (those are bounded: see [`close`](Self::close)).
    pub fn lease<E>(&self, open: impl FnOnce() -> Result<T, E>) -> Result<Lease<T>, E> {
        let mut state = self.lock();
        while state.closes > 0 {
            state = self.reopened.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        if let Some(session) = &state.current {
            return Ok(Lease {
                session: Arc::clone(session),
                generation: state.generation,
            });
        }
        // Opened under the lock: two first users make one session.
        let session = Arc::new(open()?);
        state.generation += 1;
        state.current = Some(Arc::clone(&session));
        Ok(Lease {
            session,
            generation: state.generation,
        })
    }

    /// The open session without opening one, or `None` while none is open or a close is under
    /// way (for users that must not hold up a close, such as an event set).
    pub fn lease_if_open(&self) -> Option<Lease<T>> {
        let state = self.lock();
        if state.closes > 0 {
            return None;
        }
        state.current.as_ref().map(|session| Lease {
            session: Arc::clone(session),
            generation: state.generation,
        })
    }

    /// Whether a close is under way or held: users that keep a lease across waits (event sets)
    /// give theirs back when this is true.
    pub fn closing(&self) -> bool {
        self.lock().closes > 0
    }

    /// Closes the session: new users wait, and once the last lease is given back (within
    /// `within`) the session is dropped, which ends it. It stays closed while the guard lives.
    /// When leases are still out after `within`, the session stays open and nothing changed.
    pub fn close(&self, within: Duration) -> Result<Closed<'_, T>, StillInUse> {
        let taken = {
            let mut state = self.lock();
            state.closes += 1;
            state.current.take()
        };
        let guard = Closed { gate: self };
        let Some(session) = taken else {
            return Ok(guard);
        };
        let started = Instant::now();
        let mut session = session;
        loop {
            match Arc::try_unwrap(session) {
                Ok(last) => {
                    // The session ends here, outside the gate's lock.
                    drop(last);
                    return Ok(guard);
                }
                Err(shared) if started.elapsed() >= within => {
                    let leases = Arc::strong_count(&shared) - 1;
                    // Put back as it was: the users keep a working session.
                    self.lock().current = Some(shared);
                    drop(guard);
                    return Err(StillInUse {
                        leases,
                        waited: started.elapsed(),
                    });
                }
                Err(shared) => {
                    session = shared;
                    std::thread::sleep(POLL);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A session that counts how many are open.
    struct Counted(Arc<AtomicU32>);
    impl Counted {
        fn open(open: &Arc<AtomicU32>) -> Result<Self, ()> {
            open.fetch_add(1, Ordering::SeqCst);
            Ok(Self(Arc::clone(open)))
        }
    }
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_close_ends_the_session_and_the_next_use_opens_a_new_one() {
        let open = Arc::new(AtomicU32::new(0));
        let gate = SessionGate::new();
        let first = gate.lease(|| Counted::open(&open)).expect("lease");
        let again = gate.lease(|| Counted::open(&open)).expect("lease");
        assert_eq!(open.load(Ordering::SeqCst), 1, "one session for both users");
        assert_eq!(first.generation(), again.generation());
        drop((first, again));
        let closed = gate.close(Duration::from_secs(1)).expect("closed");
        assert_eq!(open.load(Ordering::SeqCst), 0, "the session ended");
        assert!(gate.closing());
        assert!(gate.lease_if_open().is_none());
        drop(closed);
        let next = gate.lease(|| Counted::open(&open)).expect("lease");
        assert_eq!(open.load(Ordering::SeqCst), 1);
        assert_eq!(next.generation(), 2, "a new session");
    }

    #[test]
    fn a_lease_not_given_back_in_time_keeps_the_session_open() {
        let open = Arc::new(AtomicU32::new(0));
        let gate = SessionGate::new();
        let held = gate.lease(|| Counted::open(&open)).expect("lease");
        let error = gate
            .close(Duration::from_millis(50))
            .err()
            .expect("still in use");
        assert_eq!(error.leases, 1);
        assert_eq!(open.load(Ordering::SeqCst), 1, "nothing changed");
        assert!(!gate.closing());
        let same = gate.lease(|| Counted::open(&open)).expect("lease");
        assert_eq!(same.generation(), held.generation());
    }

    #[test]
    fn users_wait_while_a_close_is_held_and_a_lease_given_back_lets_it_through() {
        let open = Arc::new(AtomicU32::new(0));
        let gate = Arc::new(SessionGate::new());
        let held = gate.lease(|| Counted::open(&open)).expect("lease");
        let giver = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(held);
        });
        let closed = gate.close(Duration::from_secs(5)).expect("closed");
        giver.join().expect("join");
        assert_eq!(open.load(Ordering::SeqCst), 0);
        let waiter = {
            let (gate, open) = (Arc::clone(&gate), Arc::clone(&open));
            std::thread::spawn(move || {
                gate.lease(|| Counted::open(&open))
                    .expect("lease")
                    .generation()
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !waiter.is_finished(),
            "no session opens while the close is held"
        );
        drop(closed);
        assert_eq!(waiter.join().expect("join"), 2);
    }
}
