//! The `ComputeDomain` API (`resource.nvidia.com/v1beta1`) and the channel config NVIDIA's
//! controller puts into the template, as NVIDIA defines them.
use kube::core::{ApiResource, Object};
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "resource.nvidia.com";
pub const VERSION: &str = "v1beta1";
pub const API_VERSION: &str = "resource.nvidia.com/v1beta1";
pub const KIND: &str = "ComputeDomain";
pub const CHANNEL_CONFIG_KIND: &str = "ComputeDomainChannelConfig";
pub const DAEMON_CONFIG_KIND: &str = "ComputeDomainDaemonConfig";

pub const STATUS_READY: &str = "Ready";
pub const STATUS_NOT_READY: &str = "NotReady";

pub type ComputeDomain = Object<ComputeDomainSpec, ComputeDomainStatus>;

pub fn api_resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        plural: "computedomains".into(),
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainSpec {
    /// Nodes the domain waits for (0: none; each node is released once its own daemon runs).
    #[serde(default)]
    pub num_nodes: i64,
    #[serde(default)]
    pub channel: Option<ChannelSpec>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelSpec {
    pub resource_claim_template: TemplateName,
    /// `Single` (default) or `All`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_mode: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TemplateName {
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ComputeDomainStatus {
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<DomainNode>,
}

/// A node of the domain, as its plugin registered it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainNode {
    pub name: String,
    #[serde(rename = "ipAddress")]
    pub ip_address: String,
    /// `<cluster UUID>.<clique id>`; empty on a node without multi-node NVLink.
    #[serde(rename = "cliqueID")]
    pub clique_id: String,
    #[serde(default)]
    pub index: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status: String,
}

/// `status.status` from the nodes: Ready once `numNodes` nodes registered and every registered
/// node's daemon is ready (NVIDIA's rule).
pub fn domain_status(spec: &ComputeDomainSpec, nodes: &[DomainNode]) -> &'static str {
    let enough = nodes.len() as i64 >= spec.num_nodes;
    if enough && nodes.iter().all(|n| n.status == STATUS_READY) {
        STATUS_READY
    } else {
        STATUS_NOT_READY
    }
}

/// A manifest's field that is wrong: its path and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldProblem(pub String, pub String);

/// The domain's UID offline (a manifest not yet applied has none): derived from its namespace
/// and name, so the same files always give the same template.
pub fn offline_uid(namespace: &str, name: &str) -> String {
    uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("computedomain/{namespace}/{name}").as_bytes(),
    )
    .to_string()
}

/// The channel ResourceClaimTemplate NVIDIA's controller makes for a domain: one request
/// `channel` of the default channel class, the domain's UID and allocation mode as opaque config,
/// its labels and finalizer, owned by the domain.
pub fn channel_template(
    namespace: &str,
    domain_name: &str,
    template_name: &str,
    uid: &str,
    allocation_mode: &str,
) -> serde_json::Value {
    use super::{CHANNEL_CLASS, DOMAIN_LABEL, DRIVER_NAME, FINALIZER, TARGET_LABEL};
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": template_name,
            "namespace": namespace,
            "finalizers": [FINALIZER],
            "labels": {DOMAIN_LABEL: uid, TARGET_LABEL: "Workload"},
            "ownerReferences": [{
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": domain_name,
                "uid": uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {"spec": {"devices": {
            "requests": [{"name": "channel", "exactly": {"deviceClassName": CHANNEL_CLASS}}],
            "config": [{"requests": ["channel"], "opaque": {
                "driver": DRIVER_NAME,
                "parameters": {
                    "apiVersion": API_VERSION,
                    "kind": CHANNEL_CONFIG_KIND,
                    "domainID": uid,
                    "allocationMode": allocation_mode,
                },
            }}],
        }}},
    })
}

/// A ComputeDomain manifest's channel template, checked as the CRD's schema checks it.
pub fn template_of_manifest(
    api_version: &str,
    value: &serde_json::Value,
) -> Result<serde_json::Value, FieldProblem> {
    let problem = |field: &str, what: String| FieldProblem(field.to_string(), what);
    if api_version != API_VERSION {
        return Err(problem(
            "apiVersion",
            format!("{api_version:?} does not serve ComputeDomain; use {API_VERSION}"),
        ));
    }
    let meta = value.get("metadata").cloned().unwrap_or_default();
    let name = meta.get("name").and_then(|n| n.as_str()).unwrap_or("");
    if name.is_empty() {
        return Err(problem("metadata.name", "Required value".into()));
    }
    let namespace = meta
        .get("namespace")
        .and_then(|n| n.as_str())
        .filter(|n| !n.is_empty())
        .unwrap_or("default");
    let spec: ComputeDomainSpec =
        serde_json::from_value(value.get("spec").cloned().unwrap_or_default())
            .map_err(|e| problem("spec", e.to_string()))?;
    if spec.num_nodes < 0 {
        return Err(problem(
            "spec.numNodes",
            format!("{}: must be 0 or more", spec.num_nodes),
        ));
    }
    let channel = spec
        .channel
        .ok_or_else(|| problem("spec.channel", "Required value".into()))?;
    let template = &channel.resource_claim_template.name;
    if template.is_empty() {
        return Err(problem(
            "spec.channel.resourceClaimTemplate.name",
            "Required value".into(),
        ));
    }
    let mode = channel.allocation_mode.unwrap_or_else(|| "Single".into());
    if mode != "Single" && mode != "All" {
        return Err(problem(
            "spec.channel.allocationMode",
            format!("{mode:?}: supported values: \"All\", \"Single\""),
        ));
    }
    let uid = meta
        .get("uid")
        .and_then(|u| u.as_str())
        .map(str::to_string)
        .unwrap_or_else(|| offline_uid(namespace, name));
    Ok(channel_template(namespace, name, template, &uid, &mode))
}

/// How many channels a claim gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocationMode {
    Single,
    All,
}

/// The opaque config of a channel claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelConfig {
    pub domain_uid: String,
    pub mode: AllocationMode,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChannelConfig {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    #[serde(rename = "domainID", default)]
    domain_id: String,
    #[serde(rename = "allocationMode", default)]
    allocation_mode: String,
}

/// Decodes a channel claim's opaque parameters strictly: what is wrong is named.
pub fn channel_config(parameters: &serde_json::Value) -> Result<ChannelConfig, String> {
    let kind = parameters
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or("");
    if kind == DAEMON_CONFIG_KIND {
        return Err(format!(
            "kind {DAEMON_CONFIG_KIND}: daemon claims are not served; gpu-dra runs each domain's IMEX daemon from its node plugin, no daemon pod claims one"
        ));
    }
    let raw: RawChannelConfig = serde_json::from_value(parameters.clone())
        .map_err(|e| crate::config::strict_decoding_reason(&e))?;
    if raw.api_version != API_VERSION {
        return Err(format!(
            "apiVersion: {:?} is not {API_VERSION}",
            raw.api_version
        ));
    }
    if raw.kind != CHANNEL_CONFIG_KIND {
        return Err(format!("kind: {:?} is not {CHANNEL_CONFIG_KIND}", raw.kind));
    }
    if raw.domain_id.is_empty() {
        return Err("domainID: must name the ComputeDomain's UID".into());
    }
    let mode = match raw.allocation_mode.as_str() {
        "" | "Single" => AllocationMode::Single,
        "All" => AllocationMode::All,
        other => {
            return Err(format!(
                "allocationMode: {other:?} is neither Single nor All"
            ));
        }
    };
    Ok(ChannelConfig {
        domain_uid: raw.domain_id,
        mode,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn channel_configs_decode_strictly() {
        let ok = channel_config(
            &json!({"apiVersion": API_VERSION, "kind": CHANNEL_CONFIG_KIND, "domainID": "u1", "allocationMode": "All"}),
        );
        assert_eq!(
            ok,
            Ok(ChannelConfig {
                domain_uid: "u1".into(),
                mode: AllocationMode::All
            })
        );
        let single = channel_config(
            &json!({"apiVersion": API_VERSION, "kind": CHANNEL_CONFIG_KIND, "domainID": "u1"}),
        );
        assert_eq!(single.map(|c| c.mode), Ok(AllocationMode::Single));
        for (bad, field) in [
            (
                json!({"apiVersion": API_VERSION, "kind": CHANNEL_CONFIG_KIND}),
                "domainID",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": CHANNEL_CONFIG_KIND, "domainID": "u", "allocationMode": "Some"}),
                "allocationMode",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": CHANNEL_CONFIG_KIND, "domainID": "u", "extra": 1}),
                "extra",
            ),
            (
                json!({"apiVersion": "resource.nvidia.com/v1", "kind": CHANNEL_CONFIG_KIND, "domainID": "u"}),
                "apiVersion",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": DAEMON_CONFIG_KIND, "domainID": "u"}),
                DAEMON_CONFIG_KIND,
            ),
        ] {
            let error = channel_config(&bad).expect_err("refused");
            assert!(error.contains(field), "{error} names {field}");
        }
    }

    #[test]
    fn a_manifests_template_is_the_controllers() {
        let domain = json!({
            "apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": "cd", "namespace": "ml"},
            "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "cd-channel"}}},
        });
        let template = template_of_manifest(API_VERSION, &domain).expect("template");
        let uid = offline_uid("ml", "cd");
        assert_eq!(
            template,
            channel_template("ml", "cd", "cd-channel", &uid, "Single")
        );
        assert_eq!(
            template["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["domainID"],
            uid.as_str()
        );
        // A live domain's own UID wins.
        let mut live = domain.clone();
        live["metadata"]["uid"] = json!("1234");
        let template = template_of_manifest(API_VERSION, &live).expect("template");
        assert_eq!(
            template["metadata"]["labels"][super::super::DOMAIN_LABEL],
            "1234"
        );
        let wrong = template_of_manifest("resource.nvidia.com/v1", &domain).expect_err("version");
        assert_eq!(wrong.0, "apiVersion");
    }

    #[test]
    fn a_domain_is_ready_with_enough_ready_nodes() {
        let spec = ComputeDomainSpec {
            num_nodes: 2,
            channel: None,
        };
        let node = |name: &str, status: &str| DomainNode {
            name: name.into(),
            status: status.into(),
            ..DomainNode::default()
        };
        assert_eq!(
            domain_status(&spec, &[node("a", STATUS_READY)]),
            STATUS_NOT_READY
        );
        assert_eq!(
            domain_status(
                &spec,
                &[node("a", STATUS_READY), node("b", STATUS_NOT_READY)]
            ),
            STATUS_NOT_READY
        );
        assert_eq!(
            domain_status(&spec, &[node("a", STATUS_READY), node("b", STATUS_READY)]),
            STATUS_READY
        );
    }
}
