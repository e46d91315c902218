//! DRA device health (KEP-4680): the driver pushes device health into a [`HealthReporter`], and
//! every kubelet `NodeWatchResources` stream (v1 and v1alpha1) receives the complete list on each
//! change, starting with the current one.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::proto::{health_v1 as v1, health_v1alpha1 as v1alpha1};
use super::shutdown::ShutdownSignal;

/// Health of a device as kubelet understands it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceHealthStatus {
    Unknown,
    Healthy,
    Unhealthy,
}

/// The driver's latest health observation of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    pub pool_name: String,
    pub device_name: String,
    pub status: DeviceHealthStatus,
    /// Detail for humans, e.g. the XID that made the device unhealthy.
    pub message: String,
    /// When the device was last checked.
    pub last_updated: SystemTime,
    /// How long kubelet trusts this observation before showing Unknown; `None` is kubelet's
    /// default (30 s). The driver must re-report within it.
    pub health_check_timeout: Option<Duration>,
}

type DeviceKey = (String, String);

/// Where the driver reports device health. Cheap to clone; every clone feeds the same streams.
#[derive(Clone)]
pub struct HealthReporter {
    devices: watch::Sender<BTreeMap<DeviceKey, DeviceHealth>>,
}

impl Default for HealthReporter {
    fn default() -> Self {
        Self::new()
    }
}

impl HealthReporter {
    pub fn new() -> Self {
        Self {
            devices: watch::Sender::new(BTreeMap::new()),
        }
    }

    /// Replaces the whole list: devices not in `devices` are no longer reported.
    pub fn replace_all(&self, devices: impl IntoIterator<Item = DeviceHealth>) {
        let devices = devices.into_iter().map(|d| (device_key(&d), d)).collect();
        self.devices.send_replace(devices);
    }

    /// The same reports, observed again at `now`: every stream gets them with the new time.
    pub fn refresh(&self, now: SystemTime) {
        self.devices.send_modify(|devices| {
            for device in devices.values_mut() {
                device.last_updated = now;
            }
        });
    }

    /// Adds or refreshes one device; the others are kept.
    pub fn update(&self, device: DeviceHealth) {
        self.devices.send_if_modified(|devices| {
            let previous = devices.insert(device_key(&device), device.clone());
            previous.as_ref() != Some(&device)
        });
    }

    /// Stops reporting one device (it was removed from the node).
    pub fn remove(&self, pool_name: &str, device_name: &str) {
        let key = (pool_name.to_string(), device_name.to_string());
        self.devices
            .send_if_modified(|devices| devices.remove(&key).is_some());
    }

    /// The current list, ordered by pool and device name.
    pub fn snapshot(&self) -> Vec<DeviceHealth> {
        self.devices.borrow().values().cloned().collect()
    }

    /// The current list, then the new list after every change.
    fn watch(&self) -> impl Stream<Item = Vec<DeviceHealth>> + Send + 'static {
        futures::stream::unfold(
            (self.devices.subscribe(), true),
            |(mut updates, first)| async move {
                if !first && updates.changed().await.is_err() {
                    return None;
                }
                let devices = updates.borrow_and_update().values().cloned().collect();
                Some((devices, (updates, false)))
            },
        )
    }
}

fn device_key(device: &DeviceHealth) -> DeviceKey {
    (device.pool_name.clone(), device.device_name.clone())
}

fn unix_seconds(time: SystemTime) -> i64 {
    let seconds = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    i64::try_from(seconds).unwrap_or(i64::MAX)
}

/// Rounded up: a sub-second timeout must not turn into 0, which kubelet reads as "use the default".
fn timeout_seconds(timeout: Option<Duration>) -> i64 {
    let millis = timeout.map(|t| t.as_millis().div_ceil(1000)).unwrap_or(0);
    i64::try_from(millis).unwrap_or(i64::MAX)
}

fn device_health_v1(device: DeviceHealth) -> v1::DeviceHealth {
    let health = match device.status {
        DeviceHealthStatus::Unknown => v1::HealthStatus::Unknown,
        DeviceHealthStatus::Healthy => v1::HealthStatus::Healthy,
        DeviceHealthStatus::Unhealthy => v1::HealthStatus::Unhealthy,
    };
    v1::DeviceHealth {
        device: Some(v1::DeviceIdentifier {
            pool_name: device.pool_name,
            device_name: device.device_name,
        }),
        health: health.into(),
        last_updated_time: unix_seconds(device.last_updated),
        health_check_timeout_seconds: timeout_seconds(device.health_check_timeout),
        message: device.message,
    }
}

/// v1alpha1 has the same fields and numbers as v1 (including the enum values).
fn device_health_to_v1alpha1(device: v1::DeviceHealth) -> v1alpha1::DeviceHealth {
    v1alpha1::DeviceHealth {
        device: device.device.map(|id| v1alpha1::DeviceIdentifier {
            pool_name: id.pool_name,
            device_name: id.device_name,
        }),
        health: device.health,
        last_updated_time: device.last_updated_time,
        health_check_timeout_seconds: device.health_check_timeout_seconds,
        message: device.message,
    }
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// `v1.DRAResourceHealth` (Kubernetes 1.37+).
#[derive(Clone)]
pub struct HealthV1Service {
    reporter: HealthReporter,
    shutdown: ShutdownSignal,
}

impl HealthV1Service {
    pub fn new(reporter: HealthReporter, shutdown: ShutdownSignal) -> Self {
        Self { reporter, shutdown }
    }

    fn responses(&self) -> impl Stream<Item = v1::NodeWatchResourcesResponse> + Send + 'static {
        tracing::debug!("kubelet opened a device health stream");
        self.reporter
            .watch()
            .map(|devices| v1::NodeWatchResourcesResponse {
                devices: devices.into_iter().map(device_health_v1).collect(),
            })
            .take_until(self.shutdown.clone().triggered())
    }
}

#[tonic::async_trait]
impl v1::dra_resource_health_server::DraResourceHealth for HealthV1Service {
    type NodeWatchResourcesStream = ResponseStream<v1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _request: Request<v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(Box::pin(self.responses().map(Ok))))
    }
}

/// `v1alpha1.DRAResourceHealth` (Kubernetes 1.34-1.36 kubelets): v1 converted message by message.
#[derive(Clone)]
pub struct HealthV1alpha1Service {
    v1: HealthV1Service,
}

impl HealthV1alpha1Service {
    pub fn new(v1: HealthV1Service) -> Self {
        Self { v1 }
    }
}

#[tonic::async_trait]
impl v1alpha1::dra_resource_health_server::DraResourceHealth for HealthV1alpha1Service {
    type NodeWatchResourcesStream = ResponseStream<v1alpha1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _request: Request<v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        let responses = self.v1.responses().map(|response| {
            Ok(v1alpha1::NodeWatchResourcesResponse {
                devices: response
                    .devices
                    .into_iter()
                    .map(device_health_to_v1alpha1)
                    .collect(),
            })
        });
        Ok(Response::new(Box::pin(responses)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str, status: DeviceHealthStatus) -> DeviceHealth {
        DeviceHealth {
            pool_name: "node-a".into(),
            device_name: name.into(),
            status,
            message: String::new(),
            last_updated: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            health_check_timeout: Some(Duration::from_millis(1500)),
        }
    }

    #[tokio::test]
    async fn streams_current_list_then_each_change() {
        let reporter = HealthReporter::new();
        reporter.update(device("gpu-0", DeviceHealthStatus::Healthy));
        let mut updates = Box::pin(reporter.watch());
        assert_eq!(
            updates.next().await.unwrap(),
            [device("gpu-0", DeviceHealthStatus::Healthy)]
        );

        reporter.update(device("gpu-1", DeviceHealthStatus::Unhealthy));
        let list = updates.next().await.unwrap();
        assert_eq!(list.len(), 2, "each update carries the complete list");

        reporter.remove("node-a", "gpu-0");
        assert_eq!(
            updates.next().await.unwrap(),
            [device("gpu-1", DeviceHealthStatus::Unhealthy)]
        );
    }

    #[test]
    fn wire_fields_follow_the_proto() {
        let message = device_health_v1(device("gpu-0", DeviceHealthStatus::Unhealthy));
        assert_eq!(message.health, v1::HealthStatus::Unhealthy as i32);
        assert_eq!(message.last_updated_time, 1_700_000_000);
        assert_eq!(
            message.health_check_timeout_seconds, 2,
            "sub-second rest rounds up"
        );
        let alpha = device_health_to_v1alpha1(message);
        assert_eq!(alpha.health, v1alpha1::HealthStatus::Unhealthy as i32);
        assert_eq!(alpha.device.unwrap().device_name, "gpu-0");
    }
}
