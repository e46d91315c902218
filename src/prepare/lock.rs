//! Node-wide file locks that let two driver instances share one node during a rolling update
//! (KEP-4381 seamless upgrade): while the old pod drains and the new one starts, kubelet may call
//! either, so while both run every change of the node's state (recovery, prepare, unprepare,
//! garbage collection) happens under one exclusive `flock` and starts from what is on disk.
//!
//! An instance that is alone on the node must not pay for that: its operations take the same
//! lock *shared* (they exclude each other only through their claims and GPUs, in memory), and it
//! knows whether it is alone from [`Presence`]: every instance holds a lock file of its own for
//! its whole life, which the kernel releases when the process dies, kill -9 included.
//!
//! Every guard owns its own open file description: the lock is released when the guard is
//! dropped, wherever the guard was moved (into the blocking work that needs it), never by
//! another holder in the same process.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{FlockOperation, flock};

/// A lock file; each [`acquire`](Self::acquire) opens it anew.
#[derive(Debug, Clone)]
pub struct NodeLock {
    path: PathBuf,
}

/// Holds the lock until dropped. Owns its file, so it can move into the work it protects.
#[derive(Debug)]
pub struct NodeLockGuard {
    file: File,
    path: PathBuf,
}

/// The lock serializing state changes between instances (the kubelet plugin library's name).
pub const SERIALIZE_LOCK: &str = "serialize.lock";
/// Held by the one instance that publishes ResourceSlices.
pub const PUBLISHER_LOCK: &str = "publisher.lock";
/// The folder of the instances' presence files.
pub const INSTANCES_DIR: &str = "instances";

fn open_lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
}

impl NodeLock {
    /// Creates the lock file (0600) if missing; does not lock.
    pub fn open(path: &Path) -> io::Result<Self> {
        open_lock_file(path)?;
        Ok(Self {
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the lock exclusively, polling so other tasks keep running while it is held.
    pub async fn acquire(&self) -> io::Result<NodeLockGuard> {
        self.take(FlockOperation::NonBlockingLockExclusive).await
    }

    /// Takes the lock shared: beside other shared holders, never beside an exclusive one.
    pub async fn acquire_shared(&self) -> io::Result<NodeLockGuard> {
        self.take(FlockOperation::NonBlockingLockShared).await
    }

    async fn take(&self, operation: FlockOperation) -> io::Result<NodeLockGuard> {
        let file = open_lock_file(&self.path)?;
        let mut wait = Duration::from_millis(1);
        loop {
            match flock(&file, operation) {
                Ok(()) => {
                    return Ok(NodeLockGuard {
                        file,
                        path: self.path.clone(),
                    });
                }
                Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_millis(50));
                }
                Err(errno) => return Err(errno.into()),
            }
        }
    }
}

impl Drop for NodeLockGuard {
    fn drop(&mut self) {
        // Closing the file releases the lock too; unlocking first says so if it fails.
        if let Err(error) = flock(&self.file, FlockOperation::Unlock) {
            tracing::warn!(path = %self.path.display(), %error, "cannot release node lock");
        }
    }
}

/// This instance's presence on the node, and a view of the others'.
#[derive(Debug)]
pub struct Presence {
    view: PresenceView,
    /// Locked exclusively for this instance's life.
    _own: File,
}

/// A view of the other instances on the node, for whoever needs it beside the driver (the
/// ComputeDomain plugin keeps the node's clique label while another instance lives).
#[derive(Debug, Clone)]
pub struct PresenceView {
    dir: PathBuf,
    own_name: String,
}

impl Presence {
    /// Creates and locks `<dir>/<instance>.lock` (the folder 0700 if missing).
    pub fn register(dir: &Path, instance: &str) -> io::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let own_name = format!("{instance}.lock");
        let file = open_lock_file(&dir.join(&own_name))?;
        flock(&file, FlockOperation::NonBlockingLockExclusive).map_err(|errno| {
            io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{}: another process runs as instance {instance}: {errno}",
                    dir.join(&own_name).display()
                ),
            )
        })?;
        Ok(Self {
            view: PresenceView {
                dir: dir.to_path_buf(),
                own_name,
            },
            _own: file,
        })
    }

    /// See [`PresenceView::others`].
    pub fn others(&self) -> io::Result<Others> {
        self.view.others()
    }

    /// See [`PresenceView::forget`].
    pub fn forget(&self, gone: &[String]) -> io::Result<()> {
        self.view.forget(gone)
    }

    /// A view of the others that can go where this instance's presence does not.
    pub fn view(&self) -> PresenceView {
        self.view.clone()
    }
}

impl PresenceView {
    /// The other instances on the node: those alive now, and those that are gone but whose
    /// file is still there (they may have changed the node's state since this instance last
    /// read it). Nothing is removed here: a gone instance's file stays until [`forget`]
    /// (Self::forget) is called by whoever has read what it left.
    pub fn others(&self) -> io::Result<Others> {
        let mut others = Others::default();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == self.own_name || !name.ends_with(".lock") {
                continue;
            }
            let file = match OpenOptions::new().write(true).open(entry.path()) {
                Ok(file) => file,
                // Removed meanwhile by another instance that read what it left.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            match flock(&file, FlockOperation::NonBlockingLockExclusive) {
                // Its owner is gone (the kernel released its lock).
                Ok(()) => others.gone.push(name),
                Err(rustix::io::Errno::WOULDBLOCK) => others.alive.push(name),
                Err(errno) => return Err(errno.into()),
            }
        }
        Ok(others)
    }

    /// Removes the files of instances that are gone, once the caller has read the node's state
    /// they may have changed (under the node lock, held exclusively). A file whose instance came
    /// back to life under the same name (it re-registered) is kept.
    pub fn forget(&self, gone: &[String]) -> io::Result<()> {
        for name in gone {
            let path = self.dir.join(name);
            let file = match OpenOptions::new().write(true).open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            match flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                },
                Err(rustix::io::Errno::WOULDBLOCK) => {}
                Err(errno) => return Err(errno.into()),
            }
        }
        Ok(())
    }
}

/// The other instances [`Presence::others`] found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Others {
    /// Running now (their lock is held).
    pub alive: Vec<String>,
    /// Gone since this instance last forgot them: each may have written the checkpoint and
    /// changed the hardware before it died, so the node's state must be read again.
    pub gone: Vec<String>,
}

impl Others {
    /// No other instance runs, and none ran since the last [`Presence::forget`].
    pub fn none(&self) -> bool {
        self.alive.is_empty() && self.gone.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn second_holder_waits_until_the_first_releases() {
        let dir = tempfile::tempdir().expect("tempdir");
        let lock = NodeLock::open(&dir.path().join(SERIALIZE_LOCK)).expect("open");
        // Each guard is its own open file description: flock treats them like two processes.
        let guard = lock.acquire().await.expect("lock");
        let waiting = tokio::time::timeout(Duration::from_millis(100), lock.acquire()).await;
        assert!(waiting.is_err(), "the lock is held");
        let shared = tokio::time::timeout(Duration::from_millis(100), lock.acquire_shared()).await;
        assert!(shared.is_err(), "no shared holder beside an exclusive one");
        drop(guard);
        let _guard = tokio::time::timeout(Duration::from_secs(2), lock.acquire())
            .await
            .expect("released")
            .expect("lock");
    }

    #[tokio::test]
    async fn shared_holders_go_together_and_keep_an_exclusive_one_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let lock = NodeLock::open(&dir.path().join(SERIALIZE_LOCK)).expect("open");
        let first = lock.acquire_shared().await.expect("shared");
        let second = tokio::time::timeout(Duration::from_millis(500), lock.acquire_shared())
            .await
            .expect("a second shared holder does not wait")
            .expect("shared");
        drop(first);
        let exclusive = tokio::time::timeout(Duration::from_millis(100), lock.acquire()).await;
        assert!(exclusive.is_err(), "one shared holder is still there");
        drop(second);
        tokio::time::timeout(Duration::from_secs(2), lock.acquire())
            .await
            .expect("released")
            .expect("lock");
    }

    #[test]
    fn presence_sees_live_instances_and_remembers_gone_ones_until_forgotten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let instances = dir.path().join(INSTANCES_DIR);
        let old = Presence::register(&instances, "old-pod").expect("register");
        assert!(old.others().expect("look").none(), "alone");
        let new = Presence::register(&instances, "new-pod").expect("register");
        assert_eq!(old.others().expect("look").alive, vec!["new-pod.lock"]);
        assert_eq!(new.others().expect("look").alive, vec!["old-pod.lock"]);
        assert!(
            Presence::register(&instances, "new-pod").is_err(),
            "one process per instance"
        );
        drop(new);
        // The new pod died (a crash-looping image): the old one must still learn that it ran,
        // however many times it looks, until it has read what the new one left and forgets it.
        for _ in 0..2 {
            let others = old.others().expect("look");
            assert!(others.alive.is_empty());
            assert_eq!(others.gone, vec!["new-pod.lock"]);
            assert!(!others.none());
        }
        old.forget(&["new-pod.lock".to_string()]).expect("forget");
        assert!(old.others().expect("look").none(), "forgotten");
        assert!(
            !instances.join("new-pod.lock").exists(),
            "its file was removed"
        );
        // A file whose instance is back is not removed.
        let back = Presence::register(&instances, "back-pod").expect("register");
        old.forget(&["back-pod.lock".to_string()]).expect("forget");
        assert_eq!(old.others().expect("look").alive, vec!["back-pod.lock"]);
        drop(back);
    }
}
