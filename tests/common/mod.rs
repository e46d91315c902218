//! Claims as the node driver's integration tests need them: allocated on pool `n1` of
//! `gpu.nvidia.com`, one device for request `gpu`, UID `uid-<name>`.
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
