//! Errors of the kubelet plugin layer; each names the path or socket that failed.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("invalid driver name {name:?}: {reason}")]
    InvalidDriverName { name: String, reason: &'static str },
    #[error("invalid rolling-update instance id {id:?}: {reason}")]
    InvalidInstance { id: String, reason: &'static str },
    #[error("resolve absolute path of {path}: {source}")]
    AbsolutePath { path: PathBuf, source: io::Error },
    #[error("create directory {path}: {source}")]
    CreateDirectory { path: PathBuf, source: io::Error },
    #[error("{path} exists but is not a directory")]
    NotADirectory { path: PathBuf },
    #[error("{path} exists and is not a unix socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("inspect {path}: {source}")]
    Inspect { path: PathBuf, source: io::Error },
    #[error("remove stale socket {path}: {source}")]
    RemoveStaleSocket { path: PathBuf, source: io::Error },
    #[error("bind unix socket {path}: {source}")]
    Bind { path: PathBuf, source: io::Error },
    #[error("set permissions of {path}: {source}")]
    SetPermissions { path: PathBuf, source: io::Error },
    #[error("move socket into place at {path}: {source}")]
    Rename { path: PathBuf, source: io::Error },
    #[error("remove socket {path}: {source}")]
    RemoveSocket { path: PathBuf, source: io::Error },
    #[error("gRPC server on {path} failed: {source}")]
    Serve {
        path: PathBuf,
        source: tonic::transport::Error,
    },
    #[error("gRPC server on {path} did not stop within {grace:?}; aborted it")]
    StopTimeout { path: PathBuf, grace: Duration },
    #[error("gRPC server task for {path} panicked or was cancelled: {source}")]
    ServerTask {
        path: PathBuf,
        source: tokio::task::JoinError,
    },
}
