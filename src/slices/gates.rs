//! Slice fields behind Kubernetes alpha gates, published only when the driver's gate of the same
//! name is on (`--feature-gates`, chart `featureGates`, as NVIDIA's driver names them):
//!
//! - `DRAListTypeAttributes` (KEP-6072): `resource.kubernetes.io/numaNode` as a one-element list;
//! - `DRANodeAllocatableResources` (KEP-5517): per-device node-allocatable overhead from the
//!   admin's table (see [`super::node_allocatable`]).
//!
//! An API server with the gate off drops such fields without a word (or refuses a device left
//! without a value), and one with it on refuses node-allocatable resources for a node whose
//! kubelet does not declare the feature (NodeDeclaredFeatures admission); so before the first
//! publication the driver creates one such device with `dryRun=All` and refuses to start, naming
//! the gate, when the field does not come back.
use std::time::Duration;

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

pub const LIST_TYPE_ATTRIBUTES: &str = "DRAListTypeAttributes";
pub const NODE_ALLOCATABLE_RESOURCES: &str = "DRANodeAllocatableResources";

/// The driver's feature gates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverGates {
    pub list_type_attributes: bool,
    pub node_allocatable_resources: bool,
}

/// NVIDIA's gates for what gpu-dra always does: `true` is accepted (it is on), `false` refused
/// saying what gpu-dra does.
const ALWAYS_ON: &[(&str, &str)] = &[
    (
        "TimeSlicingSettings",
        "time-slicing intervals are always applied",
    ),
    ("MPSSupport", "MPS configs are always served"),
    (
        "NVMLDeviceHealthCheck",
        "GPU health is always watched through NVML",
    ),
    (
        "IMEXDaemonsWithDNSNames",
        "IMEX daemons always find their peers by name (NVIDIA's static node names, mapped to the nodes' addresses)",
    ),
    (
        "DeviceMetadata",
        "claims with GPUs for virtual machines always get their KEP-5304 device metadata (KubeVirt reads the PCI address there)",
    ),
    (
        "HostManagedIMEXDaemon",
        "the hostManaged IMEX mode is always available; it is chosen with computeDomains.imex.mode (--imex-mode)",
    ),
    (
        "CrashOnNVLinkFabricErrors",
        "the ComputeDomain plugin never falls back to running without the NVLink fabric: while the fabric reports an error, channel prepares fail naming it (the plugin keeps running and recovers with the fabric)",
    ),
];
/// NVIDIA's gates for what gpu-dra never does: `false` is accepted, `true` refused saying why.
const ALWAYS_OFF: &[(&str, &str)] = &[
    (
        "ComputeDomainCliques",
        "gpu-dra keeps each domain's nodes (with their cliqueID) in the domain's status.nodes and makes no ComputeDomainClique objects",
    ),
    (
        "FabricManagerPartitioning",
        "gpu-dra does not activate Fabric Manager partitions (that needs NVIDIA's Fabric Manager library); GPUs are allocated as published",
    ),
];
/// NVIDIA's gates for what gpu-dra sets with a value of its own.
const SET_ELSEWHERE: &[(&str, &str)] = &[
    (
        "DynamicMIG",
        "mig (--mig; auto, the default, is dynamic on Hopper and newer)",
    ),
    ("PassthroughSupport", "passthrough (--passthrough)"),
    ("ConsumableShares", "consumableShares (--consumable-shares)"),
];

impl DriverGates {
    /// `NAME=BOOL,...`; an unknown or unsupported gate is an error naming it.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut gates = Self::default();
        for pair in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not NAME=true|false"))?;
            let on = match value.trim().to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => return Err(format!("{name}: {value:?} is not true or false")),
            };
            match name.trim() {
                LIST_TYPE_ATTRIBUTES => gates.list_type_attributes = on,
                NODE_ALLOCATABLE_RESOURCES => gates.node_allocatable_resources = on,
                gate if ALWAYS_ON.iter().any(|(g, _)| *g == gate) => {
                    if !on {
                        let does = ALWAYS_ON
                            .iter()
                            .find(|(g, _)| *g == gate)
                            .map_or("", |(_, d)| d);
                        return Err(format!(
                            "{gate}=false: gpu-dra always has this on and cannot turn it off: {does}"
                        ));
                    }
                }
                gate if ALWAYS_OFF.iter().any(|(g, _)| *g == gate) => {
                    if on {
                        let why = ALWAYS_OFF
                            .iter()
                            .find(|(g, _)| *g == gate)
                            .map_or("", |(_, w)| w);
                        return Err(format!("{gate}=true: not supported: {why}"));
                    }
                }
                gate => {
                    if let Some((_, value)) = SET_ELSEWHERE.iter().find(|(g, _)| *g == gate) {
                        return Err(format!(
                            "{gate}: gpu-dra sets this with the chart value {value}"
                        ));
                    }
                    let names = |gates: &[(&str, &str)]| {
                        gates.iter().map(|(g, _)| *g).collect::<Vec<_>>().join(", ")
                    };
                    return Err(format!(
                        "{gate}: not a gpu-dra feature gate (known: {LIST_TYPE_ATTRIBUTES}, {NODE_ALLOCATABLE_RESOURCES}; NVIDIA's {} are always on, {} always off)",
                        names(ALWAYS_ON),
                        names(ALWAYS_OFF)
                    ));
                }
            }
        }
        Ok(gates)
    }
}

/// The API server kept no gated field: which gate it lacks.
#[derive(Debug, thiserror::Error)]
#[error(
    "{field} (driver feature gate {gate}): the API server {verdict}; turn the {gate} feature gate on in kube-apiserver and kube-scheduler, or off in the driver (--feature-gates {gate}=false, chart featureGates.{gate})"
)]
pub struct GateOff {
    pub gate: &'static str,
    pub field: String,
    pub verdict: String,
}

/// One gated field a device may carry.
struct Gated {
    gate: &'static str,
    field: &'static str,
    on: fn(&Device) -> bool,
}

/// The device with only what `gated` asks about: no counters (they live in other slices of the
/// pool), no taints, and no field of another gate (a refusal must name the right one).
fn probe_device(device: &Device, gated: &Gated) -> Device {
    let mut probe = Device {
        name: device.name.clone(),
        attributes: device.attributes.clone(),
        capacity: device.capacity.clone(),
        ..Device::default()
    };
    if gated.gate == NODE_ALLOCATABLE_RESOURCES {
        probe.node_allocatable_resources = device.node_allocatable_resources.clone();
        if let Some(attributes) = probe.attributes.as_mut() {
            attributes.retain(|_, a| {
                a.ints.is_none() && a.bools.is_none() && a.strings.is_none() && a.versions.is_none()
            });
        }
    }
    probe
}

const GATED: &[Gated] = &[
    Gated {
        gate: LIST_TYPE_ATTRIBUTES,
        field: "spec.devices[].attributes[].ints (resource.kubernetes.io/numaNode)",
        on: |d| {
            d.attributes
                .iter()
                .flat_map(|a| a.values())
                .any(|a| a.ints.is_some())
        },
    },
    Gated {
        gate: NODE_ALLOCATABLE_RESOURCES,
        field: "spec.devices[].nodeAllocatableResources",
        on: |d| {
            d.node_allocatable_resources
                .as_ref()
                .is_some_and(|r| !r.is_empty())
        },
    },
];

/// Asks the API server (dry run) whether it keeps each gated field the slices use. `Ok` also
/// when it cannot be asked now (an outage must not stop the node): that is logged.
pub async fn check(
    client: &kube::Client,
    slices: &[ResourceSlice],
    timeout: Duration,
) -> Result<(), GateOff> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    for gated in GATED {
        let Some((slice, device)) = slices.iter().find_map(|s| {
            s.spec
                .devices
                .iter()
                .flatten()
                .find(|d| (gated.on)(d))
                .map(|d| (s, d))
        }) else {
            continue;
        };
        let mut probe = slice.clone();
        probe.metadata = ObjectMeta {
            generate_name: Some("gpu-dra-gate-check-".into()),
            ..ObjectMeta::default()
        };
        probe.spec.shared_counters = None;
        probe.spec.devices = Some(vec![probe_device(device, gated)]);
        let params = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let answer = tokio::time::timeout(timeout, api.create(&params, &probe)).await;
        let verdict = match answer {
            Ok(Ok(created)) => {
                let kept = created.spec.devices.iter().flatten().any(|d| (gated.on)(d));
                if kept {
                    tracing::info!(gate = gated.gate, "the API server keeps {}", gated.field);
                    continue;
                }
                "drops it from the ResourceSlices it stores".to_string()
            }
            Ok(Err(kube::Error::Api(status))) if status.code == 422 => {
                format!("refuses the device ({})", status.message)
            }
            // The NodeDeclaredFeatures admission: the node's kubelet does not declare the
            // feature (it runs without the gate).
            Ok(Err(kube::Error::Api(status)))
                if status.code == 403 && status.message.contains("does not support") =>
            {
                format!(
                    "refuses the device: {} (the node's kubelet declares the feature only with the gate on)",
                    status.message
                )
            }
            Ok(Err(error)) => {
                tracing::warn!(gate = gated.gate, %error, "cannot ask the API server whether it keeps {}; publishing it anyway", gated.field);
                continue;
            }
            Err(_) => {
                tracing::warn!(
                    gate = gated.gate,
                    "the API server did not answer within {timeout:?} whether it keeps {}; publishing it anyway",
                    gated.field
                );
                continue;
            }
        };
        return Err(GateOff {
            gate: gated.gate,
            field: gated.field.to_string(),
            verdict,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_parse_and_nvidias_are_answered() {
        let gates =
            DriverGates::parse("DRAListTypeAttributes=true, DRANodeAllocatableResources=false")
                .expect("gates");
        assert!(gates.list_type_attributes && !gates.node_allocatable_resources);
        assert_eq!(DriverGates::parse(""), Ok(DriverGates::default()));
        assert_eq!(
            DriverGates::parse("MPSSupport=true,TimeSlicingSettings=true"),
            Ok(DriverGates::default())
        );
        let err = |spec: &str| DriverGates::parse(spec).expect_err(spec);
        assert!(err("MPSSupport=false").contains("cannot turn it off"));
        // Every gate of NVIDIA's driver (0.5) is answered: on, off, or set elsewhere.
        assert_eq!(
            DriverGates::parse(
                "IMEXDaemonsWithDNSNames=true,DeviceMetadata=true,HostManagedIMEXDaemon=true,\
                 CrashOnNVLinkFabricErrors=true,NVMLDeviceHealthCheck=true,\
                 ComputeDomainCliques=false,FabricManagerPartitioning=false"
            ),
            Ok(DriverGates::default())
        );
        assert!(err("ComputeDomainCliques=true").contains("no ComputeDomainClique objects"));
        assert!(err("FabricManagerPartitioning=true").contains("not supported"));
        assert!(err("DeviceMetadata=false").contains("KEP-5304"));
        assert!(err("PassthroughSupport=true").contains("chart value passthrough"));
        assert!(err("Bogus=true").contains("Bogus: not a gpu-dra feature gate"));
        assert!(err("DRAListTypeAttributes=yes").contains("\"yes\" is not true or false"));
        assert!(err("DRAListTypeAttributes").contains("NAME=true|false"));
    }
}
