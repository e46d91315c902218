//! Device metadata for containers (KEP-5304, `metadata.resource.k8s.io/v1alpha1`): a file per
//! claim request with the allocated devices' attributes, bind-mounted where the container
//! expects it. KubeVirt's virt-launcher finds the PCI address of a GPU handed to its virtual
//! machine only there (`resource.kubernetes.io/pciBusID`), so claims with GPUs for virtual
//! machines get one, as NVIDIA's driver writes it for them.
//!
//! On the host: `<state dir>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json`
//! (the state folder is the same path inside the driver's container and on the host). In the
//! container: `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/
//! <driver>-metadata.json`, or `.../resourceclaimtemplates/<pod's claim name>/...` for a claim
//! made from a template.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::resource::v1::DeviceAttribute;
use serde_json::json;

use super::cdi::Mount;
use super::checkpoint::ClaimEntry;
use crate::fsutil;

pub const API_VERSION: &str = "metadata.resource.k8s.io/v1alpha1";
/// Where containers find device metadata.
pub const CONTAINER_ROOT: &str = "/var/run/kubernetes.io/dra-device-attributes";
const HOST_FOLDER: &str = "dra-device-metadata";

#[derive(Debug, thiserror::Error)]
#[error("device metadata {path}: {reason}")]
pub struct MetadataError {
    pub path: PathBuf,
    pub reason: String,
}

/// One allocated device as the metadata file lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct MetadataDevice {
    pub request: String,
    pub pool: String,
    pub device: String,
    pub attributes: BTreeMap<String, DeviceAttribute>,
}

/// Writes and removes the metadata files under one state folder.
#[derive(Debug, Clone)]
pub struct MetadataStore {
    root: PathBuf,
    driver_name: String,
}

/// `req/sub` → `req`: files are per request, as the kubelet names requests to containers.
fn base_request(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

impl MetadataStore {
    pub fn new(state_dir: &Path, driver_name: &str) -> Self {
        Self {
            root: state_dir.join(HOST_FOLDER),
            driver_name: driver_name.to_string(),
        }
    }

    fn claim_dir(&self, claim: &ClaimEntry) -> PathBuf {
        self.root
            .join(format!("{}_{}", claim.namespace, claim.name))
    }

    fn host_file(&self, claim: &ClaimEntry, request: &str) -> PathBuf {
        self.claim_dir(claim)
            .join(base_request(request))
            .join("metadata.json")
    }

    fn container_file(&self, claim: &ClaimEntry, request: &str) -> String {
        let (kind, name) = match &claim.pod_claim_name {
            Some(pod_claim) => ("resourceclaimtemplates", pod_claim.as_str()),
            None => ("resourceclaims", claim.name.as_str()),
        };
        format!(
            "{CONTAINER_ROOT}/{kind}/{name}/{}/{}-metadata.json",
            base_request(request),
            self.driver_name
        )
    }

    /// Writes one file per request of `devices` (replacing what was there) and returns the
    /// mounts that put them in the claim's containers.
    pub fn write(
        &self,
        claim: &ClaimEntry,
        devices: &[MetadataDevice],
    ) -> Result<Vec<Mount>, MetadataError> {
        let mut requests: BTreeMap<&str, Vec<&MetadataDevice>> = BTreeMap::new();
        for device in devices {
            requests
                .entry(base_request(&device.request))
                .or_default()
                .push(device);
        }
        let mut mounts = Vec::new();
        for (request, devices) in requests {
            let mut document = json!({
                "apiVersion": API_VERSION,
                "kind": "DeviceMetadata",
                "metadata": {
                    "name": claim.name,
                    "namespace": claim.namespace,
                    "uid": claim.uid,
                    "generation": 1,
                },
                "requests": [{
                    "name": request,
                    "devices": devices.iter().map(|d| json!({
                        "driver": self.driver_name,
                        "pool": d.pool,
                        "name": d.device,
                        "attributes": d.attributes,
                    })).collect::<Vec<_>>(),
                }],
            });
            if let Some(pod_claim) = &claim.pod_claim_name {
                document["podClaimName"] = json!(pod_claim);
            }
            let path = self.host_file(claim, request);
            let failed = |e: &dyn std::fmt::Display| MetadataError {
                path: path.clone(),
                reason: e.to_string(),
            };
            let mut text = serde_json::to_string_pretty(&document).map_err(|e| failed(&e))?;
            // A stream of one object per API version, each ending in a newline.
            text.push('\n');
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| failed(&e))?;
            }
            fsutil::write_atomically(&path, text.as_bytes()).map_err(|e| failed(&e))?;
            mounts.push(self.mount(claim, request));
        }
        Ok(mounts)
    }

    fn mount(&self, claim: &ClaimEntry, request: &str) -> Mount {
        Mount {
            host_path: self
                .host_file(claim, request)
                .to_string_lossy()
                .into_owned(),
            container_path: self.container_file(claim, request),
            options: vec!["ro".into(), "bind".into()],
        }
    }

    /// The mounts of the files written for `requests` of a claim (those on disk).
    pub fn mounts(&self, claim: &ClaimEntry, requests: &[&str]) -> Vec<Mount> {
        let mut requests: Vec<&str> = requests.iter().map(|r| base_request(r)).collect();
        requests.sort_unstable();
        requests.dedup();
        requests
            .into_iter()
            .filter(|r| self.host_file(claim, r).exists())
            .map(|r| self.mount(claim, r))
            .collect()
    }

    /// Removes a claim's files; none is fine.
    pub fn remove(&self, claim: &ClaimEntry) -> Result<(), MetadataError> {
        let dir = self.claim_dir(claim);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(MetadataError {
                path: dir,
                reason: e.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::checkpoint::ClaimState;

    fn entry(pod_claim_name: Option<&str>) -> ClaimEntry {
        ClaimEntry {
            namespace: "vms".into(),
            name: "vm-gpu-x7k2p".into(),
            uid: "uid-1".into(),
            state: ClaimState::PrepareStarted,
            devices: vec![],
            pod_claim_name: pod_claim_name.map(str::to_string),
            unknown: Default::default(),
        }
    }

    fn device(request: &str) -> MetadataDevice {
        MetadataDevice {
            request: request.into(),
            pool: "node-1".into(),
            device: "gpu-vfio-0".into(),
            attributes: BTreeMap::from([(
                "resource.kubernetes.io/pciBusID".to_string(),
                DeviceAttribute {
                    string: Some("0000:18:00.0".into()),
                    ..Default::default()
                },
            )]),
        }
    }

    #[test]
    fn a_template_claims_file_is_where_kubevirt_reads_it() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = MetadataStore::new(dir.path(), "gpu.nvidia.com");
        let claim = entry(Some("gpu-claim"));
        let mounts = store.write(&claim, &[device("gpu/sub")]).expect("write");
        assert_eq!(mounts.len(), 1);
        assert_eq!(
            mounts[0].container_path,
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu-claim/gpu/gpu.nvidia.com-metadata.json"
        );
        let host = dir
            .path()
            .join("dra-device-metadata/vms_vm-gpu-x7k2p/gpu/metadata.json");
        assert_eq!(mounts[0].host_path, host.to_string_lossy());
        let text = std::fs::read_to_string(&host).expect("file");
        assert!(text.ends_with("}\n"));
        let document: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(document["apiVersion"], API_VERSION);
        assert_eq!(document["kind"], "DeviceMetadata");
        assert_eq!(document["podClaimName"], "gpu-claim");
        assert_eq!(document["metadata"]["uid"], "uid-1");
        let listed = &document["requests"][0];
        assert_eq!(listed["name"], "gpu");
        assert_eq!(listed["devices"][0]["name"], "gpu-vfio-0");
        assert_eq!(
            listed["devices"][0]["attributes"]["resource.kubernetes.io/pciBusID"]["string"],
            "0000:18:00.0"
        );
        assert_eq!(store.mounts(&claim, &["gpu/sub", "gpu"]), mounts);
        store.remove(&claim).expect("remove");
        assert!(!host.exists());
        assert!(store.mounts(&claim, &["gpu"]).is_empty());
        store.remove(&claim).expect("again");
    }

    #[test]
    fn a_named_claims_file_is_under_resourceclaims() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = MetadataStore::new(dir.path(), "gpu.nvidia.com");
        let mounts = store.write(&entry(None), &[device("gpu")]).expect("write");
        assert_eq!(
            mounts[0].container_path,
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-gpu-x7k2p/gpu/gpu.nvidia.com-metadata.json"
        );
    }
}
