//! The filesystem side of the plugin sockets: private directories, stale-socket replacement, an
//! atomic appearance with final permissions, and removal that never deletes a successor's socket.

use std::fs::{self, DirBuilder, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use super::error::PluginError;

const DIRECTORY_MODE: u32 = 0o700;
const SOCKET_MODE: u32 = 0o600;

/// Creates `dir` (and missing parents) with mode 0700. An existing directory is left as it is:
/// it may be shared (kubelet's registry dir) and is not ours to tighten.
pub fn ensure_private_dir(dir: &Path) -> Result<(), PluginError> {
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(_) => {
            return Err(PluginError::NotADirectory {
                path: dir.to_path_buf(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(PluginError::Inspect {
                path: dir.to_path_buf(),
                source,
            });
        }
    }
    DirBuilder::new()
        .recursive(true)
        .mode(DIRECTORY_MODE)
        .create(dir)
        .map_err(|source| PluginError::CreateDirectory {
            path: dir.to_path_buf(),
            source,
        })?;
    tracing::debug!(path = %dir.display(), "created directory");
    Ok(())
}

/// Removes a socket left behind by a previous run. Anything else at the path is an error: a
/// mistyped flag must not delete a user's file.
fn remove_stale_socket(path: &Path) -> Result<(), PluginError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(PluginError::Inspect {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if !meta.file_type().is_socket() {
        return Err(PluginError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    fs::remove_file(path).map_err(|source| PluginError::RemoveStaleSocket {
        path: path.to_path_buf(),
        source,
    })?;
    tracing::info!(path = %path.display(), "removed stale socket from a previous run");
    Ok(())
}

/// A socket file we bound; removes it on [`OwnedSocket::remove`] or drop.
#[derive(Debug)]
pub struct OwnedSocket {
    path: PathBuf,
    /// (device, inode) of our socket: a later instance may have replaced the path, and its socket
    /// must survive our shutdown.
    identity: (u64, u64),
    removed: bool,
}

/// Binds a listening socket at `path` with mode 0600. The socket is bound under a dot-name first
/// (kubelet's plugin watcher ignores those), chmod-ed, then renamed into place, so whoever sees
/// the final path sees a listening socket with its final permissions.
pub fn bind_private_socket(path: &Path) -> Result<(UnixListener, OwnedSocket), PluginError> {
    let staging = staging_path(path);
    remove_stale_socket(path)?;
    remove_stale_socket(&staging)?;

    let listener = UnixListener::bind(&staging).map_err(|source| PluginError::Bind {
        path: staging.clone(),
        source,
    })?;
    let placed = fs::set_permissions(&staging, Permissions::from_mode(SOCKET_MODE))
        .map_err(|source| PluginError::SetPermissions {
            path: staging.clone(),
            source,
        })
        .and_then(|()| {
            fs::rename(&staging, path).map_err(|source| PluginError::Rename {
                path: path.to_path_buf(),
                source,
            })
        })
        .and_then(|()| {
            fs::symlink_metadata(path).map_err(|source| PluginError::Inspect {
                path: path.to_path_buf(),
                source,
            })
        });
    let meta = match placed {
        Ok(meta) => meta,
        Err(e) => {
            // Best effort: do not leave a half-made socket behind; the first error is the one to report.
            let _ = fs::remove_file(&staging);
            return Err(e);
        }
    };
    tracing::debug!(path = %path.display(), "listening");
    let socket = OwnedSocket {
        path: path.to_path_buf(),
        identity: (meta.dev(), meta.ino()),
        removed: false,
    };
    Ok((listener, socket))
}

fn staging_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

impl OwnedSocket {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the socket file if it is still ours. Idempotent.
    pub fn remove(&mut self) -> Result<(), PluginError> {
        if self.removed {
            return Ok(());
        }
        self.removed = true;
        let meta = match fs::symlink_metadata(&self.path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(PluginError::Inspect {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        if (meta.dev(), meta.ino()) != self.identity {
            tracing::info!(path = %self.path.display(), "socket was replaced by another instance; leaving it");
            return Ok(());
        }
        fs::remove_file(&self.path).map_err(|source| PluginError::RemoveSocket {
            path: self.path.clone(),
            source,
        })?;
        tracing::debug!(path = %self.path.display(), "removed socket");
        Ok(())
    }
}

impl Drop for OwnedSocket {
    fn drop(&mut self) {
        if let Err(error) = self.remove() {
            tracing::warn!(%error, "could not remove socket");
        }
    }
}
