//! Device metadata for containers (KEP-5304, `metadata.resource.k8s.io` v1beta1 and v1alpha1): a file per
//! claim request with the allocated devices' attributes, bind-mounted where the container
//! expects it. KubeVirt's virt-launcher finds the PCI address of a GPU handed to its virtual
//! machine only there (`resource.kubernetes.io/pciBusID`), so claims with GPUs for virtual
//! machines get one, as NVIDIA's driver writes it for them.
//!
//! On the host: `<state dir>/dra-device-metadata/<claim UID>/<request>/metadata.json` (the state
//! folder is the same path inside the driver's container and on the host). Keyed by UID, not by
//! name: a claim deleted and re-created under the same name (a GitOps replace) is another claim,
//! and the old one's unprepare must not remove the new one's files. Claims prepared by a version
//! that keyed them `<namespace>_<claim>` keep that folder until they are unprepared. In the
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

/// The versions each file holds, in this order, as one JSON stream: those Kubernetes' kubelet
/// plugin library (v0.37) writes for NVIDIA's driver, so a reader of either finds its own.
pub const API_VERSIONS: [&str; 2] = [
    "metadata.resource.k8s.io/v1beta1",
    "metadata.resource.k8s.io/v1alpha1",
];
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
        self.root.join(&claim.uid)
    }

    /// Where an earlier version wrote a claim's files (by name), if what is there is this
    /// claim's (its files name the claim's UID).
    fn legacy_dir(&self, claim: &ClaimEntry) -> Option<PathBuf> {
        let dir = self
            .root
            .join(format!("{}_{}", claim.namespace, claim.name));
        let entries = std::fs::read_dir(&dir).ok()?;
        let mut files = entries
            .flatten()
            .map(|request| request.path().join("metadata.json"))
            .filter(|file| file.exists())
            .peekable();
        files.peek()?;
        files
            .all(|file| {
                std::fs::read(&file)
                    .ok()
                    // The stream's first object (every version names the same claim).
                    .and_then(|text| {
                        serde_json::Deserializer::from_slice(&text)
                            .into_iter::<serde_json::Value>()
                            .next()?
                            .ok()
                    })
                    .is_some_and(|document| document["metadata"]["uid"] == claim.uid.as_str())
            })
            .then_some(dir)
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
                "apiVersion": API_VERSIONS[0],
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
            // A stream of one object per API version, each ending in a newline.
            let mut text = String::new();
            for version in API_VERSIONS {
                document["apiVersion"] = json!(version);
                text += &serde_json::to_string_pretty(&document).map_err(|e| failed(&e))?;
                text.push('\n');
            }
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| failed(&e))?;
            }
            fsutil::write_atomically(&path, text.as_bytes()).map_err(|e| failed(&e))?;
            mounts.push(self.mount(claim, request));
        }
        Ok(mounts)
    }

    fn mount(&self, claim: &ClaimEntry, request: &str) -> Mount {
        self.mount_of(self.host_file(claim, request), claim, request)
    }

    fn mount_of(&self, host_file: PathBuf, claim: &ClaimEntry, request: &str) -> Mount {
        Mount {
            host_path: host_file.to_string_lossy().into_owned(),
            container_path: self.container_file(claim, request),
            options: vec!["ro".into(), "bind".into()],
        }
    }

    /// The mounts of the files written for `requests` of a claim (those on disk, where an
    /// earlier version wrote them for a claim it prepared).
    pub fn mounts(&self, claim: &ClaimEntry, requests: &[&str]) -> Vec<Mount> {
        let mut requests: Vec<&str> = requests.iter().map(|r| base_request(r)).collect();
        requests.sort_unstable();
        requests.dedup();
        let legacy = self.legacy_dir(claim);
        requests
            .into_iter()
            .filter_map(|r| {
                let file = self.host_file(claim, r);
                if file.exists() {
                    return Some(self.mount_of(file, claim, r));
                }
                let old = legacy.as_ref()?.join(r).join("metadata.json");
                old.exists().then(|| self.mount_of(old, claim, r))
            })
            .collect()
    }

    /// Removes a claim's files (and an earlier version's folder of them, if it is this claim's);
    /// none is fine.
    pub fn remove(&self, claim: &ClaimEntry) -> Result<(), MetadataError> {
        let legacy = self.legacy_dir(claim);
        for dir in std::iter::once(self.claim_dir(claim)).chain(legacy) {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(MetadataError {
                        path: dir,
                        reason: e.to_string(),
                    });
                }
            }
        }
        Ok(())
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
            taken_over: None,
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
            .join("dra-device-metadata/uid-1/gpu/metadata.json");
        assert_eq!(mounts[0].host_path, host.to_string_lossy());
        let text = std::fs::read_to_string(&host).expect("file");
        assert!(text.ends_with("}\n"));
        let stream: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&text)
            .into_iter()
            .collect::<Result<_, _>>()
            .expect("json stream");
        let versions: Vec<&str> = stream
            .iter()
            .filter_map(|d| d["apiVersion"].as_str())
            .collect();
        assert_eq!(versions, API_VERSIONS);
        let mut unversioned: Vec<serde_json::Value> = stream.clone();
        for d in &mut unversioned {
            d["apiVersion"] = serde_json::Value::Null;
        }
        assert_eq!(
            unversioned[0], unversioned[1],
            "the same content in each version"
        );
        let document = &stream[1];
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

    #[test]
    fn a_claim_recreated_under_the_same_name_keeps_its_files_when_the_old_one_goes() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = MetadataStore::new(dir.path(), "gpu.nvidia.com");
        let old = entry(None);
        let mut new = entry(None);
        new.uid = "uid-2".into();
        store.write(&old, &[device("gpu")]).expect("old");
        let mounts = store.write(&new, &[device("gpu")]).expect("new");
        // GitOps replaced the claim: kubelet unprepares the old one after the new one started.
        store.remove(&old).expect("remove the old claim's");
        assert!(
            std::path::Path::new(&mounts[0].host_path).exists(),
            "the new claim's file is still there for its VM's next start"
        );
        assert_eq!(store.mounts(&new, &["gpu"]), mounts);
    }

    #[test]
    fn a_claim_an_earlier_version_prepared_keeps_its_by_name_folder_until_unprepared() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = MetadataStore::new(dir.path(), "gpu.nvidia.com");
        let claim = entry(None);
        let written = store.write(&claim, &[device("gpu")]).expect("write");
        // What the earlier version left: the same file under <namespace>_<claim>.
        let root = dir.path().join("dra-device-metadata");
        let legacy = root.join("vms_vm-gpu-x7k2p");
        std::fs::rename(root.join("uid-1"), &legacy).expect("move");
        let mounts = store.mounts(&claim, &["gpu"]);
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].container_path, written[0].container_path);
        assert!(mounts[0].host_path.contains("vms_vm-gpu-x7k2p"));
        // Another claim of the same name does not take it, nor remove it.
        let mut other = entry(None);
        other.uid = "uid-2".into();
        assert!(store.mounts(&other, &["gpu"]).is_empty());
        store.remove(&other).expect("remove other");
        assert!(legacy.exists());
        store.remove(&claim).expect("remove");
        assert!(!legacy.exists());
    }
}
