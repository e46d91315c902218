//! One operation per claim at a time, whoever calls. A blocking thread cannot be cancelled: when
//! kubelet gives up on a call that hangs (a stuck GPU) and calls again, the retry must not park
//! another thread behind the first on the same claim, or a few retries take every blocking
//! thread and the whole node waits (health, rescans, every other claim).
//!
//! A call for a claim whose same operation still runs *joins* it: it waits, on no thread, for
//! that operation's result and answers with it. A call for the other operation (an unprepare
//! while a prepare runs) is answered at once: busy, retry later (kubelet does).
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::watch;

use super::{ClaimRef, Operation, PrepareResult, UnprepareResult};

/// What a claim's operation ended with, for the calls that joined it.
#[derive(Debug, Clone)]
pub enum Outcome {
    Prepared(PrepareResult),
    Unprepared(UnprepareResult),
}

/// The claims (by UID) an operation runs for now.
#[derive(Debug, Default)]
pub struct InFlight {
    claims: Mutex<HashMap<String, Running>>,
}

#[derive(Debug)]
struct Running {
    operation: Operation,
    since: Instant,
    done: watch::Receiver<Option<Outcome>>,
}

/// What a call gets for one claim.
pub enum Entry {
    /// Nothing runs for the claim: this call runs the operation.
    Started(InFlightGuard),
    /// The same operation runs: wait for its result.
    Joined(Joined),
    /// The other operation runs: why the call is refused for now.
    Busy(String),
}

/// One claim's place in [`InFlight`]. Given up when dropped, which is where the operation's work
/// ends (on its blocking thread), not where the call that started it was cancelled.
#[derive(Debug)]
pub struct InFlightGuard {
    set: Arc<InFlight>,
    uid: String,
    done: watch::Sender<Option<Outcome>>,
}

/// A call waiting for another call's operation on the same claim.
pub struct Joined {
    claim: String,
    done: watch::Receiver<Option<Outcome>>,
}

impl InFlight {
    /// Takes the claim for `operation`, or joins what runs for it, or says why not.
    pub fn start(self: &Arc<Self>, claim: &ClaimRef, operation: Operation) -> Entry {
        let mut claims = self.lock();
        if let Some(running) = claims.get(&claim.uid) {
            if running.operation == operation {
                return Entry::Joined(Joined {
                    claim: format!("ResourceClaim {}/{}", claim.namespace, claim.name),
                    done: running.done.clone(),
                });
            }
            return Entry::Busy(format!(
                "ResourceClaim {}/{} (UID {}): busy, retry later: its {} started {:.0} s ago is still running",
                claim.namespace,
                claim.name,
                claim.uid,
                running.operation.as_str(),
                running.since.elapsed().as_secs_f64()
            ));
        }
        let (done, receiver) = watch::channel(None);
        claims.insert(
            claim.uid.clone(),
            Running {
                operation,
                since: Instant::now(),
                done: receiver,
            },
        );
        Entry::Started(InFlightGuard {
            set: self.clone(),
            uid: claim.uid.clone(),
            done,
        })
    }

    /// How many claims an operation runs for now (stuck ones included).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Running>> {
        self.claims.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl InFlightGuard {
    /// Hands the result to the calls that joined, and gives the claim up.
    pub fn finish(self, outcome: Outcome) {
        // Ignored when no call joined: nobody holds a receiver but the entry, which goes now.
        let _ = self.done.send(Some(outcome));
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.set.lock().remove(&self.uid);
    }
}

impl Joined {
    /// The joined prepare's result (a call joins only the operation it is itself).
    pub async fn prepared(self) -> PrepareResult {
        match self.outcome().await? {
            Outcome::Prepared(result) => result,
            Outcome::Unprepared(_) => Err("internal error: a prepare joined an unprepare".into()),
        }
    }

    /// The joined unprepare's result.
    pub async fn unprepared(self) -> UnprepareResult {
        match self.outcome().await? {
            Outcome::Unprepared(result) => result,
            Outcome::Prepared(_) => Err("internal error: an unprepare joined a prepare".into()),
        }
    }

    /// The joined operation's result; an error if it ended without one (its call failed before
    /// the work started, or the work's thread failed).
    pub async fn outcome(mut self) -> Result<Outcome, String> {
        loop {
            if let Some(outcome) = self.done.borrow_and_update().clone() {
                return Ok(outcome);
            }
            if self.done.changed().await.is_err() {
                return self.done.borrow().clone().ok_or_else(|| {
                    format!(
                        "{}: the call this one joined ended without a result; retry",
                        self.claim
                    )
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(uid: &str) -> ClaimRef {
        ClaimRef::for_test(uid)
    }

    #[tokio::test]
    async fn the_same_operation_joins_the_other_is_busy_and_a_finished_claim_is_free() {
        let set = Arc::new(InFlight::default());
        let Entry::Started(guard) = set.start(&claim("a"), Operation::Prepare) else {
            panic!("nothing ran for the claim");
        };
        let Entry::Joined(joined) = set.start(&claim("a"), Operation::Prepare) else {
            panic!("a second prepare joins the first");
        };
        let Entry::Busy(why) = set.start(&claim("a"), Operation::Unprepare) else {
            panic!("an unprepare while a prepare runs is busy");
        };
        assert!(
            why.contains("ns/claim-a")
                && why.contains("busy, retry later")
                && why.contains("prepare"),
            "{why}"
        );
        assert!(matches!(
            set.start(&claim("b"), Operation::Unprepare),
            Entry::Started(_)
        ));
        assert_eq!(set.len(), 1, "b's guard was dropped at once");
        guard.finish(Outcome::Unprepared(Ok(())));
        assert!(matches!(
            joined.outcome().await,
            Ok(Outcome::Unprepared(Ok(())))
        ));
        assert!(set.is_empty());
        assert!(matches!(
            set.start(&claim("a"), Operation::Unprepare),
            Entry::Started(_)
        ));
    }

    #[tokio::test]
    async fn a_call_that_joined_work_that_never_finished_is_told_to_retry() {
        let set = Arc::new(InFlight::default());
        let Entry::Started(guard) = set.start(&claim("a"), Operation::Prepare) else {
            panic!("started");
        };
        let Entry::Joined(joined) = set.start(&claim("a"), Operation::Prepare) else {
            panic!("joined");
        };
        drop(guard);
        let error = joined.outcome().await.expect_err("no result");
        assert!(
            error.contains("ns/claim-a") && error.contains("retry"),
            "{error}"
        );
    }
}
