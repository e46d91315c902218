//! Where ResourceClaims come from: the API server in production, a map in the demo and tests.
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::ClaimRef;

use crate::kubeapi::{ApiTimeouts, bounded};

/// Reads claims and reports prepared devices in their status (KEP-4817).
#[tonic::async_trait]
pub trait ClaimSource: Send + Sync + 'static {
    /// `Ok(None)` when the claim does not exist.
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String>;
    /// Replaces this driver's entries in `status.devices` (an empty list removes them).
    async fn set_device_status(
        &self,
        namespace: &str,
        name: &str,
        devices: Vec<AllocatedDeviceStatus>,
    ) -> Result<(), String>;
    /// Tells the claim's owner something about its preparation they should know (a Warning
    /// Event on the claim, seen in `kubectl describe`).
    async fn warn(&self, claim: &ClaimRef, reason: &str, note: &str) -> Result<(), String>;
}

/// Claims through the API server.
pub struct KubeClaims {
    client: kube::Client,
    /// Field manager for server-side apply of `status.devices`: the driver name, so each driver
    /// owns exactly its own entries of the list-map.
    field_manager: String,
    /// Deadline of each call: a hung API server must not hold prepare or garbage collection.
    timeout: Duration,
    /// Events on claims, as this driver on this node.
    recorder: Recorder,
}

impl KubeClaims {
    pub fn new(client: kube::Client, driver_name: &str) -> Self {
        Self::on_node(client, driver_name, None)
    }

    /// Claims as the driver on `node` sees them; its Events name the node as their instance.
    pub fn on_node(client: kube::Client, driver_name: &str, node: Option<&str>) -> Self {
        let reporter = Reporter {
            controller: format!("{driver_name}/gpu-dra"),
            instance: node.map(str::to_string),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            field_manager: driver_name.to_string(),
            timeout: ApiTimeouts::default().request,
        }
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

#[tonic::async_trait]
impl ClaimSource for KubeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        bounded(self.timeout, api.get_opt(name))
            .await
            .map_err(|e| format!("get ResourceClaim {namespace}/{name}: {e}"))
    }

    async fn set_device_status(
        &self,
        namespace: &str,
        name: &str,
        devices: Vec<AllocatedDeviceStatus>,
    ) -> Result<(), String> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"devices": devices},
        });
        let params = PatchParams::apply(&self.field_manager).force();
        bounded(
            self.timeout,
            api.patch_status(name, &params, &Patch::Apply(&patch)),
        )
        .await
        .map(|_| ())
        .map_err(|e| format!("update status.devices of ResourceClaim {namespace}/{name}: {e}"))
    }

    async fn warn(&self, claim: &ClaimRef, reason: &str, note: &str) -> Result<(), String> {
        let regarding = ObjectReference {
            api_version: Some("resource.k8s.io/v1".into()),
            kind: Some("ResourceClaim".into()),
            namespace: Some(claim.namespace.clone()),
            name: Some(claim.name.clone()),
            uid: Some(claim.uid.clone()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: reason.to_string(),
            note: Some(note.to_string()),
            action: "PrepareResources".into(),
            secondary: None,
        };
        bounded(self.timeout, self.recorder.publish(&event, &regarding))
            .await
            .map_err(|e| format!("Event {reason} on ResourceClaim {claim}: {e}"))
    }
}

/// Claims held in memory (the demo, tests).
#[derive(Default)]
pub struct MemoryClaims {
    claims: Mutex<HashMap<(String, String), ResourceClaim>>,
    /// Warnings given, as `(claim UID, reason, note)`.
    warnings: Mutex<Vec<(String, String, String)>>,
}

impl MemoryClaims {
    pub fn insert(&self, claim: ResourceClaim) {
        let key = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        self.lock().insert(key, claim);
    }

    pub fn remove(&self, namespace: &str, name: &str) -> Option<ResourceClaim> {
        self.lock()
            .remove(&(namespace.to_string(), name.to_string()))
    }

    pub fn snapshot(&self, namespace: &str, name: &str) -> Option<ResourceClaim> {
        self.lock()
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// The warnings given so far, as `(claim UID, reason, note)`.
    pub fn warnings(&self) -> Vec<(String, String, String)> {
        self.warnings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), ResourceClaim>> {
        self.claims.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[tonic::async_trait]
impl ClaimSource for MemoryClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
        Ok(self.snapshot(namespace, name))
    }

    async fn set_device_status(
        &self,
        namespace: &str,
        name: &str,
        devices: Vec<AllocatedDeviceStatus>,
    ) -> Result<(), String> {
        let mut claims = self.lock();
        let claim = claims
            .get_mut(&(namespace.to_string(), name.to_string()))
            .ok_or_else(|| format!("ResourceClaim {namespace}/{name} not found"))?;
        let status = claim.status.get_or_insert_with(Default::default);
        status.devices = if devices.is_empty() {
            None
        } else {
            Some(devices)
        };
        Ok(())
    }

    async fn warn(&self, claim: &ClaimRef, reason: &str, note: &str) -> Result<(), String> {
        self.warnings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((claim.uid.clone(), reason.to_string(), note.to_string()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{ClaimSource, KubeClaims};
    use crate::kubeapi::{TEST_TIMEOUTS, hung_api_server};

    #[tokio::test]
    async fn claim_calls_to_a_hung_api_server_fail_within_the_deadline() {
        let (client, server) = hung_api_server().await;
        let claims = KubeClaims::new(client, "gpu.nvidia.com").with_timeout(TEST_TIMEOUTS.request);
        let started = std::time::Instant::now();
        let error = claims.get("default", "c").await.expect_err("no answer");
        assert!(error.contains("no answer"), "{error}");
        claims
            .set_device_status("default", "c", vec![])
            .await
            .expect_err("no answer");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        server.abort();
    }
}
