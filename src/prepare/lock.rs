//! Node-wide file locks that let two driver instances share one node during a rolling update
//! (KEP-4381 seamless upgrade): while the old pod drains and the new one starts, kubelet may call
//! either, so every change of the node's state (recovery, prepare, unprepare, garbage collection)
//! happens under one `flock` and starts from what is on disk.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{FlockOperation, flock};

/// An exclusive `flock` on a file, taken without blocking the async runtime.
#[derive(Debug)]
pub struct NodeLock {
    path: PathBuf,
    file: File,
}

/// Held while the lock is; unlocks on drop.
#[derive(Debug)]
pub struct NodeLockGuard<'a> {
    lock: &'a NodeLock,
}

/// The lock serializing state changes between instances (the kubelet plugin library's name).
pub const SERIALIZE_LOCK: &str = "serialize.lock";
/// Held by the one instance that publishes ResourceSlices.
pub const PUBLISHER_LOCK: &str = "publisher.lock";

impl NodeLock {
    /// Opens (creating, 0600) the lock file; does not lock.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the lock, polling so other tasks keep running while another process holds it.
    pub async fn acquire(&self) -> io::Result<NodeLockGuard<'_>> {
        let mut wait = Duration::from_millis(1);
        loop {
            match flock(&self.file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(NodeLockGuard { lock: self }),
                Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_millis(50));
                }
                Err(errno) => return Err(errno.into()),
            }
        }
    }
}

impl Drop for NodeLockGuard<'_> {
    fn drop(&mut self) {
        if let Err(error) = flock(&self.lock.file, FlockOperation::Unlock) {
            tracing::warn!(path = %self.lock.path.display(), %error, "cannot release node lock");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn second_holder_waits_until_the_first_releases() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(SERIALIZE_LOCK);
        // Two opens are two open file descriptions: flock treats them like two processes.
        let first = NodeLock::open(&path).expect("open");
        let second = NodeLock::open(&path).expect("open");
        let guard = first.acquire().await.expect("lock");
        let waiting = tokio::time::timeout(Duration::from_millis(100), second.acquire()).await;
        assert!(waiting.is_err(), "the lock is held");
        drop(guard);
        let _guard = tokio::time::timeout(Duration::from_secs(2), second.acquire())
            .await
            .expect("released")
            .expect("lock");
    }
}
