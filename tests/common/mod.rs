//! What several integration tests share: claims as the node driver's tests need them (allocated
//! on pool `n1` of `gpu.nvidia.com`, one device for request `gpu`, UID `uid-<name>`), and the
//! `gpu-dra` binary run as a person runs it.
#![allow(dead_code)]

use gpu_dra::prepare::ClaimRef;
use k8s_openapi::api::resource::v1::ResourceClaim;

/// A claim in `default` allocated `device`.
pub fn claim(name: &str, device: &str) -> ResourceClaim {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {},
        "status": {"allocation": {"devices": {"results": [{
            "request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": device
        }]}}}
    }))
    .expect("claim")
}

/// How kubelet names that claim.
pub fn claim_ref(name: &str) -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

/// A path inside the repository.
pub fn repo(path: &str) -> String {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(path)
        .display()
        .to_string()
}

/// `gpu-dra ARGS`, with no simulated GPUs from the environment.
pub fn gpu_dra(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(args)
        .env_remove("GPU_DRA_GPUS")
        .output()
        .expect("runs")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
