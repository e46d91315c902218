//! `gpu-dra compute-domain-controller`: per ComputeDomain, the channel ResourceClaimTemplate
//! (NVIDIA's name, labels, class and config), a finalizer, and `status.status` from the nodes
//! the node plugins registered. Deleting a domain removes its template, then the finalizer.
//! Everything it knows is in the API, so a restart (or kill -9) picks up where it stopped.
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;

use super::api::{self, ComputeDomain};
use super::credentials::{self, DomainCredentials};
use super::{DOMAIN_LABEL, FINALIZER};
use crate::kubeapi::bounded;

const FIELD_MANAGER: &str = "gpu-dra-compute-domain-controller";
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("ComputeDomain {domain}: {reason}")]
    Domain { domain: String, reason: String },
    #[error("list ComputeDomains: {0}")]
    List(String),
}

pub struct Controller {
    client: kube::Client,
    /// Only this namespace's domains (`None`: all).
    namespace: Option<String>,
    /// The admin runs the IMEX daemons (NVIDIA's `hostManaged`): no node registers, so a domain
    /// is Ready once its template exists, and its channels are one per claim.
    host_managed: bool,
    /// Where each domain's IMEX credentials are kept (driver-managed daemons only).
    credentials_namespace: String,
}

fn name_of(domain: &ComputeDomain) -> String {
    format!(
        "{}/{}",
        domain.metadata.namespace.as_deref().unwrap_or_default(),
        domain.metadata.name.as_deref().unwrap_or_default()
    )
}

impl Controller {
    pub fn new(
        client: kube::Client,
        namespace: Option<String>,
        host_managed: bool,
        credentials_namespace: String,
    ) -> Self {
        Self {
            client,
            namespace,
            host_managed,
            credentials_namespace,
        }
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.credentials_namespace)
    }

    /// Makes the domain's IMEX credentials unless they exist. Never replaced: running daemons
    /// hold the first ones (a create that lost a race to another writer keeps theirs).
    async fn ensure_credentials(&self, uid: &str) -> Result<(), String> {
        let name = credentials::secret_name(uid);
        let where_ = format!("Secret {}/{name}", self.credentials_namespace);
        if bounded(TIMEOUT, self.secrets().get_metadata_opt(&name))
            .await
            .map_err(|e| format!("get {where_}: {e}"))?
            .is_some()
        {
            return Ok(());
        }
        let secret = DomainCredentials::generate(uid)
            .map_err(|e| e.to_string())?
            .to_secret(&self.credentials_namespace, uid);
        match bounded(
            TIMEOUT,
            self.secrets().create(&PostParams::default(), &secret),
        )
        .await
        {
            Ok(_) => {
                tracing::info!(secret = %where_, "ComputeDomain IMEX credentials made");
                Ok(())
            }
            Err(e) if e.is_conflict() => Ok(()),
            Err(e) => Err(format!("create {where_}: {e}")),
        }
    }

    async fn delete_credentials(&self, uid: &str) -> Result<(), String> {
        let name = credentials::secret_name(uid);
        match bounded(
            TIMEOUT,
            self.secrets().delete(&name, &DeleteParams::default()),
        )
        .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(format!(
                "delete Secret {}/{name}: {e}",
                self.credentials_namespace
            )),
        }
    }

    fn domains(&self) -> Api<ComputeDomain> {
        match &self.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &api::api_resource()),
            None => Api::all_with(self.client.clone(), &api::api_resource()),
        }
    }

    fn domains_in(&self, namespace: &str) -> Api<ComputeDomain> {
        Api::namespaced_with(self.client.clone(), namespace, &api::api_resource())
    }

    /// Reconciles every domain on each change and every `resync` until `shutdown` fires.
    pub async fn run(&self, resync: Duration, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut events = watcher(self.domains(), watcher::Config::default()).boxed();
        loop {
            if let Err(e) = self.reconcile_all().await {
                tracing::warn!(error = %e, "ComputeDomain reconcile failed; retrying");
            }
            tokio::select! {
                _ = tokio::time::sleep(resync) => {}
                event = events.next() => {
                    if let Some(Err(e)) = event {
                        tracing::debug!(error = %e, "ComputeDomain watch");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    // Let a burst of events settle into one pass.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                _ = shutdown.changed() => return,
            }
        }
    }

    pub async fn reconcile_all(&self) -> Result<(), ControllerError> {
        let list = bounded(TIMEOUT, self.domains().list(&ListParams::default()))
            .await
            .map_err(|e| ControllerError::List(e.to_string()))?;
        // Nodes that left the cluster leave the domains too: their plugins cannot.
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let existing: Option<std::collections::BTreeSet<String>> =
            match bounded(TIMEOUT, nodes.list_metadata(&ListParams::default())).await {
                Ok(list) => Some(
                    list.items
                        .into_iter()
                        .filter_map(|n| n.metadata.name)
                        .collect(),
                ),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot list Nodes; stale domain nodes stay");
                    None
                }
            };
        let mut failed = None;
        for domain in &list.items {
            if let Some(existing) = &existing
                && let Err(e) = self.drop_gone_nodes(domain, existing).await
            {
                tracing::warn!(error = %e, "ComputeDomain keeps nodes that are gone");
            }
            if let Err(e) = self.reconcile(domain).await {
                tracing::warn!(error = %e, "ComputeDomain not reconciled");
                failed = Some(e);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    pub async fn reconcile(&self, domain: &ComputeDomain) -> Result<(), ControllerError> {
        let err = |reason: String| ControllerError::Domain {
            domain: name_of(domain),
            reason,
        };
        let namespace = domain.metadata.namespace.clone().unwrap_or_default();
        let name = domain.metadata.name.clone().unwrap_or_default();
        let uid = domain.metadata.uid.clone().unwrap_or_default();
        let finalizers = domain.metadata.finalizers.clone().unwrap_or_default();
        let has_finalizer = finalizers.iter().any(|f| f == FINALIZER);
        if domain.metadata.deletion_timestamp.is_some() {
            if !has_finalizer {
                return Ok(());
            }
            if let Some(channel) = &domain.spec.channel {
                self.delete_template(&namespace, &channel.resource_claim_template.name, &uid)
                    .await
                    .map_err(err)?;
            }
            crate::prepare::failpoint::failpoint("cd-controller-template-deleted");
            if !self.host_managed {
                self.delete_credentials(&uid).await.map_err(err)?;
            }
            let rest: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
            self.patch_finalizers(domain, serde_json::json!(rest))
                .await
                .map_err(err)?;
            tracing::info!(domain = %name_of(domain), "ComputeDomain deleted: template and finalizer removed");
            return Ok(());
        }
        if !has_finalizer {
            let mut all = finalizers.clone();
            all.push(FINALIZER.to_string());
            self.patch_finalizers(domain, serde_json::json!(all))
                .await
                .map_err(err)?;
            crate::prepare::failpoint::failpoint("cd-controller-finalizer-added");
        }
        let Some(channel) = &domain.spec.channel else {
            return Err(err(
                "spec.channel is missing: it names the channel ResourceClaimTemplate to make"
                    .into(),
            ));
        };
        self.ensure_template(
            domain,
            &namespace,
            &channel.resource_claim_template.name,
            &uid,
        )
        .await
        .map_err(err)?;
        crate::prepare::failpoint::failpoint("cd-controller-template-created");
        if !self.host_managed {
            self.ensure_credentials(&uid).await.map_err(err)?;
        }
        let nodes = domain.status.clone().unwrap_or_default().nodes;
        let status = if self.host_managed {
            api::STATUS_READY
        } else {
            api::domain_status(&domain.spec, &nodes)
        };
        if domain.status.as_ref().map(|s| s.status.as_str()) != Some(status) {
            let patch = serde_json::json!({
                "apiVersion": api::API_VERSION,
                "kind": api::KIND,
                "metadata": {"name": name, "namespace": namespace},
                "status": {"status": status},
            });
            bounded(
                TIMEOUT,
                self.domains_in(&namespace).patch_status(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&patch),
                ),
            )
            .await
            .map_err(|e| err(format!("update status.status: {e}")))?;
            tracing::info!(domain = %name_of(domain), status, nodes = nodes.len(), "ComputeDomain status");
        }
        Ok(())
    }

    /// Removes the entries of nodes that no longer exist from `status.nodes` (guarded by the
    /// resourceVersion: a node registering meanwhile makes it fail, and the next pass retries).
    async fn drop_gone_nodes(
        &self,
        domain: &ComputeDomain,
        existing: &std::collections::BTreeSet<String>,
    ) -> Result<(), ControllerError> {
        let nodes = domain.status.clone().unwrap_or_default().nodes;
        let (kept, gone): (Vec<_>, Vec<_>) =
            nodes.into_iter().partition(|n| existing.contains(&n.name));
        if gone.is_empty() {
            return Ok(());
        }
        let namespace = domain.metadata.namespace.clone().unwrap_or_default();
        let name = domain.metadata.name.clone().unwrap_or_default();
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": domain.metadata.resource_version},
            "status": {"nodes": kept},
        });
        bounded(
            TIMEOUT,
            self.domains_in(&namespace).patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            ),
        )
        .await
        .map_err(|e| ControllerError::Domain {
            domain: name_of(domain),
            reason: format!("remove nodes that are gone from status.nodes: {e}"),
        })?;
        let gone: Vec<String> = gone.into_iter().map(|n| n.name).collect();
        tracing::info!(domain = %name_of(domain), ?gone, "nodes that left the cluster removed from the domain");
        Ok(())
    }

    async fn patch_finalizers(
        &self,
        domain: &ComputeDomain,
        finalizers: serde_json::Value,
    ) -> Result<(), String> {
        let namespace = domain.metadata.namespace.clone().unwrap_or_default();
        let name = domain.metadata.name.clone().unwrap_or_default();
        // The resourceVersion makes a concurrent change of the list fail instead of being lost.
        let patch = serde_json::json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": domain.metadata.resource_version,
        }});
        match bounded(
            TIMEOUT,
            self.domains_in(&namespace).patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            ),
        )
        .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(format!("update metadata.finalizers: {e}")),
        }
    }

    fn templates(&self, namespace: &str) -> Api<ResourceClaimTemplate> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// NVIDIA's workload template: one request `channel` of the default channel class, with
    /// the domain's UID and allocation mode as opaque config.
    async fn ensure_template(
        &self,
        domain: &ComputeDomain,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<(), String> {
        let api = self.templates(namespace);
        if let Some(existing) = bounded(TIMEOUT, api.get_opt(name))
            .await
            .map_err(|e| format!("get ResourceClaimTemplate {namespace}/{name}: {e}"))?
        {
            let owner = existing
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(DOMAIN_LABEL))
                .cloned()
                .unwrap_or_default();
            if owner == uid {
                return Ok(());
            }
            return Err(format!(
                "spec.channel.resourceClaimTemplate.name: ResourceClaimTemplate {namespace}/{name} exists and is not this domain's (label {DOMAIN_LABEL}={owner:?})"
            ));
        }
        let mode = match &domain.spec.channel {
            _ if self.host_managed => "Single".to_string(),
            Some(channel) => channel
                .allocation_mode
                .clone()
                .unwrap_or_else(|| "Single".into()),
            None => "Single".into(),
        };
        let template: ResourceClaimTemplate = serde_json::from_value(api::channel_template(
            namespace,
            domain.metadata.name.as_deref().unwrap_or_default(),
            name,
            uid,
            &mode,
        ))
        .map_err(|e| e.to_string())?;
        match bounded(TIMEOUT, api.create(&PostParams::default(), &template)).await {
            Ok(_) => {
                tracing::info!(domain = %name_of(domain), template = %format!("{namespace}/{name}"), "channel ResourceClaimTemplate created");
                Ok(())
            }
            Err(e) if e.is_conflict() => Ok(()),
            Err(e) => Err(format!(
                "create ResourceClaimTemplate {namespace}/{name}: {e}"
            )),
        }
    }

    /// Removes the domain's template (its finalizer first); one of another domain is left.
    async fn delete_template(&self, namespace: &str, name: &str, uid: &str) -> Result<(), String> {
        let api = self.templates(namespace);
        let Some(existing) = bounded(TIMEOUT, api.get_opt(name))
            .await
            .map_err(|e| format!("get ResourceClaimTemplate {namespace}/{name}: {e}"))?
        else {
            return Ok(());
        };
        let owner = existing
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(DOMAIN_LABEL))
            .cloned();
        if owner.as_deref() != Some(uid) {
            return Ok(());
        }
        let rest: Vec<String> = existing
            .metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != FINALIZER)
            .collect();
        let patch = serde_json::json!({"metadata": {"finalizers": rest}});
        let gone = |e: &crate::kubeapi::CallError| e.is_not_found();
        match bounded(
            TIMEOUT,
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        {
            Ok(_) => {}
            Err(e) if gone(&e) => return Ok(()),
            Err(e) => {
                return Err(format!(
                    "update ResourceClaimTemplate {namespace}/{name}: {e}"
                ));
            }
        }
        match bounded(TIMEOUT, api.delete(name, &DeleteParams::default())).await {
            Ok(_) => Ok(()),
            Err(e) if gone(&e) => Ok(()),
            Err(e) => Err(format!(
                "delete ResourceClaimTemplate {namespace}/{name}: {e}"
            )),
        }
    }
}
