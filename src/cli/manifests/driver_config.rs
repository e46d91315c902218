//! The opaque configs a claim, template or class hands to gpu-dra's drivers, decoded as the node
//! driver decodes them at prepare: kube-scheduler passes them through unread, so a bad one would
//! only fail the pod on its node. Read here, it fails `match`/`explain` first, naming the object
//! and field.
use super::{Entry, ManifestError, Manifests};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Decodes every opaque config for `gpu_driver` (and for NVIDIA's ComputeDomain channel driver,
/// which gpu-dra also serves); other drivers' configs are theirs.
pub fn check(m: &Manifests, gpu_driver: &str) -> Result<(), ManifestError> {
    for claim in m.device_claims() {
        let configs = claim.devices.and_then(|d| d.config.as_deref());
        for (i, config) in configs.unwrap_or_default().iter().enumerate() {
            if let Some(opaque) = &config.opaque {
                decode(&opaque.driver, &opaque.parameters.0, gpu_driver).map_err(|message| {
                    claim.field_error(
                        format!("{}.config[{i}].opaque.parameters{}", claim.at, message.0),
                        message.1,
                    )
                })?;
            }
        }
    }
    for entry in &m.classes {
        let configs = entry.object.spec.as_ref().and_then(|s| s.config.as_deref());
        for (i, config) in configs.unwrap_or_default().iter().enumerate() {
            if let Some(opaque) = &config.opaque {
                decode(&opaque.driver, &opaque.parameters.0, gpu_driver).map_err(|message| {
                    field(
                        entry,
                        format!("DeviceClass {}", name(&entry.object.metadata)),
                        format!("spec.config[{i}].opaque.parameters{}", message.0),
                        message.1,
                    )
                })?;
            }
        }
    }
    Ok(())
}

/// `Err((field inside the parameters, reason))`.
fn decode(
    driver: &str,
    parameters: &serde_json::Value,
    gpu_driver: &str,
) -> Result<(), (String, String)> {
    if driver == gpu_driver {
        // Its field is a path inside the parameters (`parameters` itself when serde names it).
        crate::config::decode(parameters).map(|_| ()).map_err(|e| {
            if e.field == "parameters" {
                (String::new(), e.reason)
            } else {
                (format!(".{}", e.field), e.reason)
            }
        })
    } else if driver == crate::compute_domain::DRIVER_NAME {
        crate::compute_domain::api::channel_config(parameters)
            .map(|_| ())
            .map_err(|reason| (String::new(), reason))
    } else {
        Ok(())
    }
}

fn name(meta: &ObjectMeta) -> &str {
    meta.name
        .as_deref()
        .or(meta.generate_name.as_deref())
        .unwrap_or("<no name>")
}

fn field<T>(entry: &Entry<T>, object: String, field: String, message: String) -> ManifestError {
    ManifestError::Field {
        object,
        origin: entry.origin.clone(),
        field,
        message,
    }
}
