//! The tokio runtime the node agent serves on (`gpu-dra run`, and the commands that talk to the
//! API server the same way).

/// The runtime `gpu-dra run` serves on. Two workers: one may be inside a MIG change or an fsync
/// (handed off with `block_in_place`) while the other keeps kubelet's registration and health
/// streams, the probes and slice publication answering. Few threads keep the resident set small
/// on every GPU node.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(8)
        .thread_name("gpu-dra")
        .enable_all()
        .build()
}
