//! `scheduling.k8s.io` PodGroups (Kubernetes 1.37, gates `GenericWorkload` and
//! `DRAWorkloadResourceClaims`): pods name one in `spec.schedulingGroup.podGroupName`; with a
//! `gang` policy none of them binds until `minCount` fit; its `resourceClaims` are claims the
//! group's pods share (one claim per group from a template), used by a pod whose own
//! `resourceClaims` entry equals the group's.
use serde_json::Value;

use super::convert::FieldError;
use super::{ClaimRef, DEFAULT_NAMESPACE, PodClaim};

/// The API versions that serve PodGroup.
pub const VERSIONS: [&str; 2] = ["scheduling.k8s.io/v1beta1", "scheduling.k8s.io/v1alpha3"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodGroup {
    pub namespace: String,
    pub name: String,
    /// `schedulingPolicy.gang.minCount`; `None` for the `basic` policy.
    pub min_count: Option<u64>,
    /// `spec.resourceClaims`: the group's claims.
    pub claims: Vec<PodClaim>,
}

impl PodGroup {
    pub fn describe(&self) -> String {
        format!("PodGroup {}/{}", self.namespace, self.name)
    }

    pub fn parse(api_version: &str, value: &Value) -> Result<Self, FieldError> {
        if !VERSIONS.contains(&api_version) {
            return Err(FieldError::new(
                "apiVersion",
                format!(
                    "{api_version:?} does not serve PodGroup; use {}",
                    VERSIONS.join(" or ")
                ),
            ));
        }
        let text = |path: &str| value.pointer(path).and_then(Value::as_str).unwrap_or("");
        let name = text("/metadata/name");
        if name.is_empty() {
            return Err(FieldError::new("metadata.name", "Required value"));
        }
        let namespace = match text("/metadata/namespace") {
            "" => DEFAULT_NAMESPACE,
            ns => ns,
        };
        // Topology-aware placement (alpha TopologyAwareWorkloadScheduling) is not predicted.
        if value
            .pointer("/spec/schedulingConstraints")
            .is_some_and(|v| !v.is_null())
        {
            return Err(FieldError::new(
                "spec.schedulingConstraints",
                "topology constraints on a PodGroup are not predicted",
            ));
        }
        let policy = value.pointer("/spec/schedulingPolicy");
        let basic = policy
            .and_then(|p| p.get("basic"))
            .is_some_and(|b| !b.is_null());
        let gang = policy.and_then(|p| p.get("gang")).filter(|g| !g.is_null());
        let min_count = match (basic, gang) {
            (true, None) => None,
            (false, Some(gang)) => match gang.get("minCount").and_then(Value::as_u64) {
                Some(n) if n >= 1 => Some(n),
                _ => {
                    return Err(FieldError::new(
                        "spec.schedulingPolicy.gang.minCount",
                        format!(
                            "Invalid value: {}: must be greater than or equal to 1",
                            gang.get("minCount").unwrap_or(&Value::Null)
                        ),
                    ));
                }
            },
            _ => {
                return Err(FieldError::new(
                    "spec.schedulingPolicy",
                    "Invalid value: must specify exactly one of: `basic`, `gang`",
                ));
            }
        };
        let mut claims = Vec::new();
        let entries = match value.pointer("/spec/resourceClaims") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(entries)) => entries.as_slice(),
            Some(_) => {
                return Err(FieldError::new("spec.resourceClaims", "must be a list"));
            }
        };
        for (i, entry) in entries.iter().enumerate() {
            let at = format!("spec.resourceClaims[{i}]");
            let get = |key: &str| {
                entry
                    .get(key)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
            };
            let name = get("name")
                .ok_or_else(|| FieldError::new(format!("{at}.name"), "Required value"))?;
            let source = match (get("resourceClaimName"), get("resourceClaimTemplateName")) {
                (Some(claim), None) => ClaimRef::Named(claim.to_string()),
                (None, Some(template)) => ClaimRef::Template(template.to_string()),
                _ => {
                    return Err(FieldError::new(
                        at,
                        "Invalid value: must specify exactly one of: `resourceClaimName`, `resourceClaimTemplateName`",
                    ));
                }
            };
            claims.push(PodClaim {
                name: name.to_string(),
                source,
            });
        }
        Ok(PodGroup {
            namespace: namespace.to_string(),
            name: name.to_string(),
            min_count,
            claims,
        })
    }
}

/// The claim made from `template` for the group's claim `claim`: one for all its pods, owned
/// by the PodGroup (named as a pod's would be, with the group in the pod's place).
pub fn claim_for_group(
    group: &PodGroup,
    claim: &str,
    template: &k8s_openapi::api::resource::v1::ResourceClaimTemplate,
) -> k8s_openapi::api::resource::v1::ResourceClaim {
    let group_uid = super::uid(&format!("PodGroup/{}/{}", group.namespace, group.name));
    let mut made =
        super::claim_from_template(&group.name, &group_uid, &group.namespace, claim, template);
    made.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: VERSIONS[0].into(),
            kind: "PodGroup".into(),
            name: group.name.clone(),
            uid: group_uid,
            controller: Some(true),
            block_owner_deletion: None,
        },
    ]);
    made
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_gang_group_with_a_shared_claim_reads_and_bad_policies_are_named() {
        let group = PodGroup::parse(
            "scheduling.k8s.io/v1beta1",
            &json!({"metadata": {"name": "g", "namespace": "ml"}, "spec": {
                "schedulingPolicy": {"gang": {"minCount": 4}},
                "resourceClaims": [{"name": "nvl", "resourceClaimTemplateName": "domain"}]}}),
        )
        .expect("ok");
        assert_eq!(group.min_count, Some(4));
        assert_eq!(
            group.claims,
            vec![PodClaim {
                name: "nvl".into(),
                source: ClaimRef::Template("domain".into())
            }]
        );
        let bad = PodGroup::parse(
            "scheduling.k8s.io/v1beta1",
            &json!({"metadata": {"name": "g"}, "spec": {"schedulingPolicy": {"gang": {"minCount": 0}}}}),
        )
        .expect_err("minCount");
        assert_eq!(bad.field, "spec.schedulingPolicy.gang.minCount");
        let bad = PodGroup::parse(
            "scheduling.k8s.io/v1beta1",
            &json!({"metadata": {"name": "g"}, "spec": {"schedulingPolicy": {}}}),
        )
        .expect_err("policy");
        assert_eq!(bad.field, "spec.schedulingPolicy");
    }
}
