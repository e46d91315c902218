//! Shared by the tests that load the fake libnvidia-ml.
use std::path::{Path, PathBuf};

use gpu_dra::gpu::mig::MigPolicy;
use gpu_dra::prepare::ClaimRef;
use gpu_dra::prepare::state::DriverConfig;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The fake library this test build made.
pub fn fake_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // Test builds leave the cdylib next to the test in target/<profile>/deps; plain builds put
    // it in target/<profile>.
    let deps = exe.parent().expect("deps dir");
    let candidates = [
        deps.join("libnvidia_ml.so"),
        deps.parent().expect("target dir").join("libnvidia_ml.so"),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| panic!("fake NVML not built; looked at {candidates:?}"))
}

#[allow(dead_code)]
pub fn config(dir: &Path, node: &str) -> DriverConfig {
    DriverConfig {
        driver_name: "gpu.nvidia.com".into(),
        mig_policy: MigPolicy::Dynamic,
        node_name: node.into(),
        cdi_root: dir.join("cdi"),
        state_dir: dir.join("state"),
        dev_root: None,
        consumable: Default::default(),
        passthrough: false,
        driver_root: None,
    }
}

#[allow(dead_code)]
pub fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
    }
}

/// A claim allocated one device of the node's pool.
#[allow(dead_code)]
pub fn claim(uid: &str, node: &str, device: &str) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(format!("claim-{uid}")),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![DeviceRequestAllocationResult {
                        request: "gpu".into(),
                        driver: "gpu.nvidia.com".into(),
                        pool: node.into(),
                        device: device.into(),
                        ..Default::default()
                    }]),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}
