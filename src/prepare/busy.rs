//! Keys (claim UIDs, GPU minors) that one prepare or unprepare holds at a time, so work on
//! different claims and GPUs runs side by side while work on the same claim or GPU takes turns.
//!
//! A caller takes all its keys at once (or waits until none of them is held), so two callers can
//! never each hold a key the other waits for. Waiting blocks the thread: callers run on blocking
//! threads, never on the async workers.
use std::collections::BTreeSet;
use std::sync::{Condvar, Mutex, MutexGuard};

pub struct BusySet<K> {
    busy: Mutex<BTreeSet<K>>,
    freed: Condvar,
}

/// Holds its keys until dropped.
pub struct BusyGuard<'a, K: Ord> {
    set: &'a BusySet<K>,
    keys: BTreeSet<K>,
}

impl<K: Ord + Clone> Default for BusySet<K> {
    fn default() -> Self {
        Self {
            busy: Mutex::new(BTreeSet::new()),
            freed: Condvar::new(),
        }
    }
}

impl<K: Ord + Clone> BusySet<K> {
    /// Waits until none of `keys` is held, then holds them all.
    pub fn acquire(&self, keys: BTreeSet<K>) -> BusyGuard<'_, K> {
        let mut busy = self.lock();
        while keys.iter().any(|k| busy.contains(k)) {
            busy = self
                .freed
                .wait(busy)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        busy.extend(keys.iter().cloned());
        BusyGuard { set: self, keys }
    }

    /// Holds those of `keys` that no one holds now, without waiting for the others.
    pub fn acquire_free(&self, keys: BTreeSet<K>) -> BusyGuard<'_, K> {
        let mut busy = self.lock();
        let free: BTreeSet<K> = keys.into_iter().filter(|k| !busy.contains(k)).collect();
        busy.extend(free.iter().cloned());
        BusyGuard {
            set: self,
            keys: free,
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeSet<K>> {
        // The set stays consistent even if a holder panicked: guards release in Drop.
        self.busy
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<K: Ord> BusyGuard<'_, K> {
    /// The keys this guard holds.
    pub fn keys(&self) -> &BTreeSet<K> {
        &self.keys
    }
}

impl<K: Ord> Drop for BusyGuard<'_, K> {
    fn drop(&mut self) {
        let mut busy = self
            .set
            .busy
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for key in &self.keys {
            busy.remove(key);
        }
        drop(busy);
        self.set.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn disjoint_keys_are_held_together_and_shared_keys_take_turns() {
        let set = Arc::new(BusySet::<u32>::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let most_inside_on_gpu0 = Arc::new(AtomicUsize::new(0));
        let first = set.acquire(BTreeSet::from([1]));
        // Key 1 is held; key 0 is free.
        let second = set.acquire(BTreeSet::from([0]));
        drop((first, second));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (set, inside, most) =
                    (set.clone(), inside.clone(), most_inside_on_gpu0.clone());
                std::thread::spawn(move || {
                    let _held = set.acquire(BTreeSet::from([0, 7]));
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert_eq!(most_inside_on_gpu0.load(Ordering::SeqCst), 1);
        assert!(set.lock().is_empty(), "every key released");
    }

    #[test]
    fn acquire_free_takes_only_what_nobody_holds() {
        let set = BusySet::<u32>::default();
        let held = set.acquire(BTreeSet::from([1]));
        let free = set.acquire_free(BTreeSet::from([0, 1, 2]));
        assert_eq!(free.keys(), &BTreeSet::from([0, 2]));
        drop(held);
        assert!(set.acquire_free(BTreeSet::from([1])).keys().contains(&1));
        drop(free);
        assert!(set.lock().is_empty());
    }
}
