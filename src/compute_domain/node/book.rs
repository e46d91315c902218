//! The node's book of the channel claims it prepared, kept on disk under a node-wide lock so a
//! restart, or a second driver instance during a rolling update, finds them again.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// A claim this node prepared, or began to. Its channels are not booked: prepare writes the
/// claim's channel CDI spec anew each time and unprepare removes it by claim UID. (Books of older
/// versions list them; the field is ignored when read.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct BookedClaim {
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) domain: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Book {
    pub(super) claims: BTreeMap<String, BookedClaim>,
}

/// The book on disk (`book.json`) and the node-wide lock (`book.lock`, flock) every change of
/// the book or of a daemon takes. During a rolling update two driver instances serve the node's
/// channels: each change starts from the book as the other may have left it, never from a copy
/// in memory, so neither stops the other's daemon nor writes its book over the other's.
pub(super) struct NodeBook {
    state_dir: PathBuf,
    /// What this instance last read or wrote.
    cache: Mutex<Book>,
}

impl NodeBook {
    pub(super) fn open(state_dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(state_dir).map_err(|e| format!("{}: {e}", state_dir.display()))?;
        let book = Self {
            state_dir: state_dir.to_path_buf(),
            cache: Mutex::default(),
        };
        book.change(|_| Ok(()))?;
        Ok(book)
    }

    pub(super) fn cached(&self) -> Book {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Takes the node-wide lock (blocking), reads the book, runs `change` on it and writes it
    /// back if it changed.
    pub(super) fn change<R>(
        &self,
        change: impl FnOnce(&mut Book) -> Result<R, String>,
    ) -> Result<R, String> {
        let lock_path = self.state_dir.join("book.lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| format!("{}: {e}", lock_path.display()))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
        let path = self.state_dir.join("book.json");
        let before: Book = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| format!("{}: cannot parse: {e}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Book::default(),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let mut book = before.clone();
        let result = change(&mut book);
        if book != before {
            let bytes = serde_json::to_vec_pretty(&book).map_err(|e| e.to_string())?;
            crate::fsutil::write_atomically(&path, &bytes)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        *self.cache.lock().unwrap_or_else(|p| p.into_inner()) = book;
        // The lock goes with the file.
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn booked(domain: &str) -> BookedClaim {
        BookedClaim {
            namespace: "ns".into(),
            name: format!("claim-{domain}"),
            domain: domain.into(),
        }
    }

    /// Two driver instances of a rolling update on one state folder: each change starts from
    /// what the other wrote, so neither writes its book over the other's, and a decision taken
    /// under the lock (stop a daemon no claim holds) sees the other's claims.
    #[test]
    fn two_instances_change_one_book_each_from_what_the_other_wrote() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = NodeBook::open(dir.path()).expect("old");
        old.change(|book| {
            book.claims.insert("uid-old".into(), booked("d1"));
            Ok(())
        })
        .expect("old books");
        let new = NodeBook::open(dir.path()).expect("new");
        new.change(|book| {
            book.claims.insert("uid-new".into(), booked("d2"));
            Ok(())
        })
        .expect("new books");
        // The old instance's copy in memory still lacks the new one's claim ...
        assert!(!old.cached().claims.contains_key("uid-new"));
        // ... but its decisions see it, and its writes keep it.
        let served = old
            .change(|book| Ok(book.claims.values().any(|c| c.domain == "d2")))
            .expect("look");
        assert!(served, "the old instance would stop the new one's daemon");
        old.change(|book| {
            book.claims.remove("uid-old");
            Ok(())
        })
        .expect("old unbooks");
        let on_disk = NodeBook::open(dir.path()).expect("read").cached();
        assert_eq!(on_disk.claims.keys().collect::<Vec<_>>(), vec!["uid-new"]);
    }

    /// The lock is held for the whole change: another change waits for it.
    #[test]
    fn a_change_holds_the_node_wide_lock() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = NodeBook::open(dir.path()).expect("first");
        let second = NodeBook::open(dir.path()).expect("second");
        let (inside_tx, inside_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            first
                .change(|book| {
                    inside_tx.send(()).expect("inside");
                    release_rx.recv().expect("release");
                    book.claims.insert("uid-1".into(), booked("d1"));
                    Ok(())
                })
                .expect("first change")
        });
        inside_rx.recv().expect("the first change runs");
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let seen = second
                .change(|book| Ok(book.claims.contains_key("uid-1")))
                .expect("second change");
            done_tx.send(seen).expect("done");
        });
        assert!(
            done_rx
                .recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "the second change ran while the first held the lock"
        );
        release_tx.send(()).expect("release");
        assert!(done_rx.recv().expect("second"), "it saw the first's write");
        holder.join().expect("holder");
        waiter.join().expect("waiter");
    }

    #[test]
    fn books_of_older_versions_still_load() {
        let old = r#"{"claims": {"uid-1": {"namespace": "ns", "name": "c", "domain": "d-uid", "channels": [0]}}}"#;
        let book: Book = serde_json::from_str(old).expect("old book");
        let entry = book.claims.get("uid-1").expect("claim uid-1");
        assert_eq!(
            (
                entry.namespace.as_str(),
                entry.name.as_str(),
                entry.domain.as_str()
            ),
            ("ns", "c", "d-uid")
        );
    }
}
