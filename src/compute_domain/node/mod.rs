//! The node plugin of `compute-domain.nvidia.com`: publishes the node's IMEX channel, and
//! prepares channel claims: registers the node in its domain, runs the domain's IMEX daemon with
//! the clique's peers, waits until the domain is ready on `numNodes` nodes of the clique, and
//! injects the channel device node(s). What it holds is in a book on disk, so a restart finds
//! its claims and daemons again.
//!
//! This module is the plugin ([`ChannelPlugin`]: prepare, unprepare and the reconcile loop, one
//! flow around the book); `book` holds the book on disk, `channel` what the node publishes.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, Patch, PatchParams};

use super::api::{self, ComputeDomain, DomainNode, STATUS_NOT_READY, STATUS_READY};
use super::credentials::{self, DomainCredentials};
use super::imex::ImexDaemons;
use super::{CHANNEL_COUNT, CHANNEL_DEVICE, DRIVER_NAME};
use crate::kubeapi::bounded;
use crate::prepare::cdi::{CdiStore, ContainerEdits, DeviceNode, Spec, SpecDevice};
use crate::prepare::claims::ClaimSource;
use crate::prepare::{ClaimRef, NodeDriver, PrepareResult, PreparedDevice, UnprepareResult};

mod book;
mod channel;

pub use channel::{channel_slices, node_clique};

use book::{Book, BookedClaim, NodeBook};
use channel::{next_clique, proc_devices_major};

/// The one channel device a node publishes (NVIDIA's: every claim is for channel 0).
pub const CHANNEL_0: &str = "channel-0";
/// A simulated node's channel major, where no kernel module registered one.
const SIMULATED_CHANNEL_MAJOR: u32 = 509;

/// How the plugin runs.
#[derive(Debug, Clone)]
pub struct ChannelPluginOptions {
    pub node_name: String,
    /// The address IMEX daemons of other nodes reach this node's at.
    pub node_ip: String,
    /// Where the controller keeps each domain's IMEX credentials (its own namespace).
    pub credentials_namespace: String,
    /// The book and the daemons' folders.
    pub state_dir: PathBuf,
    pub cdi_root: PathBuf,
    pub dev_root: Option<PathBuf>,
    /// How long one prepare call waits for the domain before it fails (kubelet retries).
    pub ready_timeout: Duration,
    pub simulated: bool,
    /// Who runs the IMEX daemon.
    pub imex: ImexMode,
}

/// Who runs a node's IMEX daemon (NVIDIA's `imex.mode`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImexMode {
    /// One daemon per domain, started and stopped by this plugin (NVIDIA's `driverManaged`).
    DriverManaged,
    /// The host's own daemon, run by the admin (NVIDIA's `hostManaged`): channels are injected
    /// once it answers READY on its command socket (`IMEX_CMD_UNIX_DOMAIN_PATH`); no daemon is
    /// started and the node is not registered in the domain's status.
    HostManaged { command_socket: PathBuf },
}

pub struct ChannelPlugin {
    client: kube::Client,
    claims: Arc<dyn ClaimSource>,
    options: ChannelPluginOptions,
    daemons: Arc<ImexDaemons>,
    cdi: CdiStore,
    channel_major: u32,
    /// The book and the daemons, changed under the node-wide book lock.
    book: Arc<NodeBook>,
    /// The GPUs whose fabric info gives the node's clique.
    gpus: Arc<dyn crate::gpu::GpuControl>,
    /// The node's clique once read: `<cluster UUID>.<clique id>`, empty on a node without
    /// multi-node NVLink. Read again at each use until it could be read (GPUs still
    /// registering with the fabric manager at start).
    clique: Mutex<Option<String>>,
    /// Each domain's IMEX credentials once read (by domain UID): they never change.
    credentials: Mutex<BTreeMap<String, DomainCredentials>>,
}

fn field_manager(node: &str) -> String {
    format!("gpu-dra-node-{node}")
}

impl ChannelPlugin {
    pub fn new(
        client: kube::Client,
        claims: Arc<dyn ClaimSource>,
        options: ChannelPluginOptions,
        daemons: ImexDaemons,
        gpus: Arc<dyn crate::gpu::GpuControl>,
    ) -> Result<Self, String> {
        let clique = match node_clique(gpus.as_ref()) {
            Ok(clique) => Some(clique),
            Err(e) => {
                tracing::warn!(error = %e, "the node's NVLink clique cannot be read yet; channel prepares fail until it can");
                None
            }
        };
        let channel_major = match proc_devices_major(Path::new("/proc/devices"), CHANNEL_DEVICE) {
            Some(major) => major,
            None if options.simulated => SIMULATED_CHANNEL_MAJOR,
            None if clique.as_deref() == Some("") => 0,
            None => {
                return Err(format!(
                    "/proc/devices has no {CHANNEL_DEVICE}: the NVIDIA kernel module of this multi-node NVLink node registered no IMEX channels"
                ));
            }
        };
        let book = NodeBook::open(&options.state_dir)?;
        let cdi = CdiStore::new(&options.cdi_root, DRIVER_NAME)
            .with_dev_root(options.dev_root.as_deref());
        Ok(Self {
            client,
            claims,
            options,
            daemons: Arc::new(daemons),
            cdi,
            channel_major,
            book: Arc::new(book),
            gpus,
            clique: Mutex::new(clique),
            credentials: Mutex::default(),
        })
    }

    /// The node's clique, read again while it could not be.
    pub fn clique(&self) -> Result<String, String> {
        let mut known = self.clique.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(clique) = known.as_ref() {
            return Ok(clique.clone());
        }
        let clique = node_clique(self.gpus.as_ref())
            .map_err(|e| format!("this node's NVLink clique: {e}"))?;
        tracing::info!(clique, "the node's NVLink clique");
        *known = Some(clique.clone());
        Ok(clique)
    }

    /// Reads the node's clique again: fabric partitioning can move a node to another clique
    /// while the driver runs. A read that fails or finds none keeps the last known clique.
    pub fn refresh_clique(&self) {
        let read = node_clique(self.gpus.as_ref());
        let mut known = self.clique.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(next) = next_clique(known.as_deref(), read) {
            match known.as_deref() {
                Some(previous) => {
                    tracing::info!(previous, clique = next, "the node's NVLink clique changed");
                }
                None => tracing::info!(clique = next, "the node's NVLink clique"),
            }
            *known = Some(next);
        }
    }

    /// The node's pool: channel 0, with NVIDIA's attributes and the node's clique once known.
    pub fn slices(&self) -> Vec<ResourceSlice> {
        let clique = self
            .clique
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        channel_slices(&self.options.node_name, clique.as_deref())
    }

    /// The book as this instance last read it (for what needs no decision: counts).
    fn book(&self) -> Book {
        self.book.cached()
    }

    /// `change` on the book as it is on disk, under the node-wide lock, on a blocking thread.
    async fn with_book<R: Send + 'static>(
        &self,
        change: impl FnOnce(&mut Book) -> Result<R, String> + Send + 'static,
    ) -> Result<R, String> {
        let book = self.book.clone();
        tokio::task::spawn_blocking(move || book.change(change))
            .await
            .map_err(|e| e.to_string())?
    }

    fn domains_api(&self, namespace: &str) -> Api<ComputeDomain> {
        Api::namespaced_with(self.client.clone(), namespace, &api::api_resource())
    }

    async fn domain_by_uid(
        &self,
        namespace: &str,
        uid: &str,
    ) -> Result<Option<ComputeDomain>, String> {
        let list = bounded(
            Duration::from_secs(10),
            self.domains_api(namespace).list(&Default::default()),
        )
        .await
        .map_err(|e| format!("list ComputeDomains in {namespace}: {e}"))?;
        Ok(list
            .items
            .into_iter()
            .find(|d| d.metadata.uid.as_deref() == Some(uid)))
    }

    /// This node's entry in the domain's `status.nodes`, applied as this node's field manager:
    /// each node owns its own entry of the list-map, so nodes never overwrite each other.
    /// Returns the domain as the server has it afterwards. The index is the clique's smallest
    /// free one; two nodes that took the same one at once are told apart by name: the later
    /// name takes another.
    async fn register(
        &self,
        domain: &ComputeDomain,
        clique: &str,
        ready: bool,
    ) -> Result<ComputeDomain, String> {
        let name = domain.metadata.name.clone().unwrap_or_default();
        let namespace = domain.metadata.namespace.clone().unwrap_or_default();
        let status = domain.status.clone().unwrap_or_default();
        let me = &self.options.node_name;
        let others = || {
            status
                .nodes
                .iter()
                .filter(|n| &n.name != me && n.clique_id == clique)
        };
        let index = status
            .nodes
            .iter()
            .find(|n| &n.name == me)
            .map(|n| n.index)
            .filter(|index| !others().any(|n| n.index == *index && n.name < *me))
            .unwrap_or_else(|| {
                let used: BTreeSet<i64> = others().map(|n| n.index).collect();
                (0..).find(|i| !used.contains(i)).unwrap_or(0)
            });
        let entry = DomainNode {
            name: me.clone(),
            ip_address: self.options.node_ip.clone(),
            clique_id: clique.to_string(),
            index,
            status: if ready {
                STATUS_READY
            } else {
                STATUS_NOT_READY
            }
            .into(),
        };
        if status.nodes.iter().any(|n| n == &entry) {
            return Ok(domain.clone());
        }
        Ok(self
            .apply_nodes(&namespace, &name, vec![entry])
            .await?
            .unwrap_or_else(|| domain.clone()))
    }

    async fn apply_nodes(
        &self,
        namespace: &str,
        name: &str,
        nodes: Vec<DomainNode>,
    ) -> Result<Option<ComputeDomain>, String> {
        let patch = serde_json::json!({
            "apiVersion": api::API_VERSION,
            "kind": api::KIND,
            "metadata": {"name": name, "namespace": namespace},
            "status": {"nodes": nodes},
        });
        let params = PatchParams::apply(&field_manager(&self.options.node_name)).force();
        match bounded(
            Duration::from_secs(10),
            self.domains_api(namespace)
                .patch_status(name, &params, &Patch::Apply(&patch)),
        )
        .await
        {
            Ok(updated) => Ok(Some(updated)),
            Err(e) if e.is_not_found() && nodes.is_empty() => Ok(None),
            Err(e) => Err(format!(
                "ComputeDomain {namespace}/{name}: update status.nodes: {e}"
            )),
        }
    }

    /// Index and address of the domain's nodes in this node's clique (this node's among them,
    /// once registered).
    fn peers(&self, domain: &ComputeDomain, clique: &str) -> Vec<(i64, String)> {
        let mut peers: Vec<(i64, String)> = domain
            .status
            .iter()
            .flat_map(|s| s.nodes.iter())
            .filter(|n| n.clique_id == clique && !n.ip_address.is_empty())
            .map(|n| (n.index, n.ip_address.clone()))
            .collect();
        peers.sort();
        peers.dedup();
        peers
    }

    /// Runs the domain's daemon with its current peers; reports whether it is ready (connected
    /// to those peers) and the peers it was given.
    async fn run_daemon(
        &self,
        domain: &ComputeDomain,
        clique: &str,
    ) -> Result<(bool, Vec<(i64, String)>), String> {
        let uid = domain.metadata.uid.clone().unwrap_or_default();
        let peers = self.peers(domain, clique);
        let given = peers.clone();
        let daemons = self.daemons.clone();
        let ip = self.options.node_ip.clone();
        // Only a daemon about to start reads them.
        let credentials = if daemons.pids(&uid).is_empty() {
            Some(self.domain_credentials(&uid).await?)
        } else {
            None
        };
        self.with_book(move |_| {
            daemons
                .ensure(&uid, &ip, &peers, credentials.as_ref())
                .map_err(|e| e.to_string())?;
            daemons.ready(&uid).map_err(|e| e.to_string())
        })
        .await
        .map(|ready| (ready, given))
    }

    /// The domain's IMEX credentials, from the Secret the controller made for it.
    async fn domain_credentials(&self, domain_uid: &str) -> Result<DomainCredentials, String> {
        if let Some(known) = self
            .credentials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(domain_uid)
        {
            return Ok(known.clone());
        }
        let namespace = &self.options.credentials_namespace;
        let name = credentials::secret_name(domain_uid);
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(self.client.clone(), namespace);
        let secret = bounded(Duration::from_secs(10), secrets.get_opt(&name))
            .await
            .map_err(|e| format!("read the domain's IMEX credentials (Secret {namespace}/{name}): {e}"))?
            .ok_or_else(|| {
                format!(
                    "the domain's IMEX credentials (Secret {namespace}/{name}) are not there yet: the ComputeDomain controller makes them"
                )
            })?;
        let read = DomainCredentials::from_secret(&secret).map_err(|e| e.to_string())?;
        self.credentials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(domain_uid.to_string(), read.clone());
        Ok(read)
    }

    async fn prepare_one(&self, claim: &ClaimRef) -> PrepareResult {
        let object = self
            .claims
            .get(&claim.namespace, &claim.name)
            .await?
            .ok_or_else(|| format!("ResourceClaim {claim} not found"))?;
        if object.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Err(format!("ResourceClaim {claim}: UID is not {}", claim.uid));
        }
        let (requests, config) = self.allocation(&object)?;
        if requests.is_empty() {
            return Ok(vec![]);
        }
        let domain = self
            .domain_by_uid(&claim.namespace, &config.domain_uid)
            .await?
            .ok_or_else(|| {
                format!(
                    "ResourceClaim {claim}: config domainID {}: no ComputeDomain with this UID in namespace {} (a domain's channels serve its own namespace only)",
                    config.domain_uid, claim.namespace
                )
            })?;
        let domain_name = format!(
            "{}/{}",
            claim.namespace,
            domain.metadata.name.clone().unwrap_or_default()
        );
        let channels: Vec<u32> = match config.mode {
            api::AllocationMode::Single => vec![0],
            api::AllocationMode::All => (0..CHANNEL_COUNT).collect(),
        };
        // Booked under the node-wide book lock (on a blocking thread: a daemon start may hold it
        // for seconds), from the book on disk, so a stop decided on an older book, by this
        // instance or another one of a rolling update, cannot take the daemon this claim is
        // about to use (see `stop_unless_served`).
        let entry = BookedClaim {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            domain: config.domain_uid.clone(),
        };
        let uid = claim.uid.clone();
        let shown = claim.to_string();
        self.with_book(move |book| {
            if let Some((_, other)) = book
                .claims
                .iter()
                .find(|(other_uid, c)| c.domain != entry.domain && **other_uid != uid)
            {
                return Err(format!(
                    "ResourceClaim {shown}: this node already serves another ComputeDomain (UID {}, claim {}/{}); a node serves one domain at a time",
                    other.domain, other.namespace, other.name
                ));
            }
            book.claims.insert(uid, entry);
            Ok(())
        })
        .await?;
        crate::prepare::failpoint::failpoint("cd-prepare-booked");
        let clique = self
            .clique()
            .map_err(|e| format!("ResourceClaim {claim}: {e}"))?;
        if let ImexMode::HostManaged { command_socket } = &self.options.imex {
            if clique.is_empty() {
                self.write_cdi(&claim.uid, &[])?;
                return Ok(self.prepared(&claim.uid, &requests, false));
            }
            let daemons = self.daemons.clone();
            let socket = command_socket.clone();
            let ready = tokio::task::spawn_blocking(move || daemons.host_ready(&socket))
                .await
                .map_err(|e| e.to_string())?;
            ready
                .map_err(|e| format!("ResourceClaim {claim}: {e}; kubelet retries the prepare"))?;
            self.write_cdi(&claim.uid, &channels)?;
            tracing::info!(claim = %claim, claimUID = %claim.uid, domain = %domain_name, "IMEX channel prepared (host-managed IMEX daemon)");
            return Ok(self.prepared(&claim.uid, &requests, true));
        }
        let num_nodes = domain.spec.num_nodes.max(0) as usize;
        if clique.is_empty() {
            // No multi-node NVLink here: no daemon, no channel (NVIDIA's behaviour), but the
            // node counts as ready so a single-node workload starts.
            let _ = self.register(&domain, &clique, true).await?;
            self.write_cdi(&claim.uid, &[])?;
            return Ok(self.prepared(&claim.uid, &requests, false));
        }
        let mut domain = self.register(&domain, &clique, false).await?;
        let deadline = Instant::now() + self.options.ready_timeout;
        let mut told = false;
        loop {
            let (ready, peers) = self.run_daemon(&domain, &clique).await?;
            crate::prepare::failpoint::failpoint("cd-prepare-daemon-started");
            domain = self.register(&domain, &clique, ready).await?;
            // Ready means connected to the peers it was given: nodes that registered meanwhile
            // are not among them yet.
            let ready = ready && self.peers(&domain, &clique) == peers;
            let nodes = domain.status.clone().unwrap_or_default().nodes;
            let ready_here = nodes
                .iter()
                .filter(|n| n.clique_id == clique && n.status == STATUS_READY)
                .count();
            if ready && ready_here >= num_nodes {
                break;
            }
            let waiting = format!(
                "ComputeDomain {domain_name}: {ready_here} of {num_nodes} nodes of NVLink clique {} ready (this node's IMEX daemon {})",
                clique,
                if ready { "ready" } else { "not ready yet" }
            );
            if Instant::now() >= deadline {
                return Err(format!(
                    "{waiting} after {:?}; kubelet retries the prepare",
                    self.options.ready_timeout
                ));
            }
            if !told {
                told = true;
                if let Err(e) = self
                    .claims
                    .warn(claim, "WaitingForComputeDomain", &waiting)
                    .await
                {
                    tracing::warn!(error = %e, "cannot record the waiting event");
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            domain = self
                .domain_by_uid(&claim.namespace, &config.domain_uid)
                .await?
                .ok_or_else(|| {
                    format!("ComputeDomain {domain_name} was deleted while the claim waited")
                })?;
        }
        self.write_cdi(&claim.uid, &channels)?;
        tracing::info!(claim = %claim, claimUID = %claim.uid, domain = %domain_name, channels = channels.len(), "IMEX channel prepared");
        Ok(self.prepared(&claim.uid, &requests, true))
    }

    fn prepared(&self, uid: &str, requests: &[String], with_device: bool) -> Vec<PreparedDevice> {
        vec![PreparedDevice {
            request_names: requests.to_vec(),
            pool_name: self.options.node_name.clone(),
            device_name: CHANNEL_0.into(),
            cdi_device_ids: if with_device {
                vec![self.cdi.device_id(uid, CHANNEL_0)]
            } else {
                vec![]
            },
            share_id: None,
        }]
    }

    /// The requests of this node's channel in the claim and their config.
    fn allocation(
        &self,
        claim: &ResourceClaim,
    ) -> Result<(Vec<String>, api::ChannelConfig), String> {
        let name = format!(
            "{}/{}",
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.metadata.name.as_deref().unwrap_or_default()
        );
        let allocation = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .ok_or_else(|| format!("ResourceClaim {name} is not allocated"))?;
        let devices = allocation.devices.as_ref();
        let mut requests = vec![];
        for result in devices
            .and_then(|d| d.results.as_ref())
            .into_iter()
            .flatten()
        {
            if result.driver != DRIVER_NAME || result.pool != self.options.node_name {
                continue;
            }
            if result.device != CHANNEL_0 {
                return Err(format!(
                    "ResourceClaim {name}: request {}: device {} is not this node's {CHANNEL_0}",
                    result.request, result.device
                ));
            }
            requests.push(result.request.clone());
        }
        if requests.is_empty() {
            return Err(format!(
                "ResourceClaim {name}: no {DRIVER_NAME} device of node {} is allocated to it",
                self.options.node_name
            ));
        }
        let mut config = None;
        for entry in devices
            .and_then(|d| d.config.as_ref())
            .into_iter()
            .flatten()
        {
            let Some(opaque) = entry.opaque.as_ref().filter(|o| o.driver == DRIVER_NAME) else {
                continue;
            };
            let applies = entry
                .requests
                .as_ref()
                .is_none_or(|r| r.is_empty() || requests.iter().any(|q| r.contains(q)));
            if applies {
                config = Some(api::channel_config(&opaque.parameters.0).map_err(|e| {
                    format!("ResourceClaim {name}: opaque config of {DRIVER_NAME}: {e}")
                })?);
            }
        }
        let config = config.ok_or_else(|| {
            format!(
                "ResourceClaim {name}: request {}: no ComputeDomainChannelConfig; channel claims come from a ComputeDomain's ResourceClaimTemplate",
                requests.join(",")
            )
        })?;
        Ok((requests, config))
    }

    fn write_cdi(&self, uid: &str, channels: &[u32]) -> Result<(), String> {
        let nodes = channels
            .iter()
            .map(|id| {
                let path = format!("/dev/{CHANNEL_DEVICE}/channel{id}");
                DeviceNode {
                    host_path: self.options.dev_root.as_ref().map(|root| {
                        root.join(path.trim_start_matches('/'))
                            .to_string_lossy()
                            .into_owned()
                    }),
                    path,
                    kind: Some("c".into()),
                    major: Some(self.channel_major),
                    minor: Some(*id),
                    file_mode: Some(0o666),
                }
            })
            .collect();
        let spec = Spec {
            cdi_version: crate::prepare::cdi::CDI_VERSION.into(),
            kind: format!("k8s.{DRIVER_NAME}/{}", crate::prepare::cdi::CLASS),
            annotations: BTreeMap::from([(
                crate::prepare::cdi::WRITTEN_BY.to_string(),
                DRIVER_NAME.to_string(),
            )]),
            devices: vec![SpecDevice {
                name: format!("{uid}-{CHANNEL_0}"),
                container_edits: ContainerEdits {
                    device_nodes: nodes,
                    ..ContainerEdits::default()
                },
            }],
            container_edits: ContainerEdits::default(),
        };
        let path = self.cdi.spec_path(uid);
        let bytes = serde_json::to_vec_pretty(&spec).map_err(|e| e.to_string())?;
        crate::fsutil::write_atomically(&path, &bytes)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    async fn unprepare_one(&self, uid: &str) -> UnprepareResult {
        let owned = uid.to_string();
        let Some(booked) = self
            .with_book(move |book| Ok(book.claims.get(&owned).cloned()))
            .await?
        else {
            return Ok(());
        };
        self.cdi.remove(uid).map_err(|e| e.to_string())?;
        let (owned, domain) = (uid.to_string(), booked.domain.clone());
        let last = self
            .with_book(move |book| {
                book.claims.remove(&owned);
                Ok(!book.claims.values().any(|c| c.domain == domain))
            })
            .await?;
        crate::prepare::failpoint::failpoint("cd-unprepare-unbooked");
        if last && self.options.imex == ImexMode::DriverManaged {
            self.leave(&booked.namespace, &booked.domain).await?;
        }
        tracing::info!(claimUID = %uid, domain = %booked.domain, "IMEX channel unprepared");
        Ok(())
    }

    /// Stops the domain's daemon unless a claim of the domain is booked (decided under the
    /// daemon lock, so a prepare booking meanwhile keeps it); `false` when it was kept.
    async fn stop_unless_served(&self, domain_uid: &str) -> Result<bool, String> {
        let daemons = self.daemons.clone();
        let uid = domain_uid.to_string();
        self.with_book(move |book| {
            if book.claims.values().any(|c| c.domain == uid) {
                return Ok(false);
            }
            daemons.stop(&uid).map(|_| true).map_err(|e| e.to_string())
        })
        .await
    }

    /// Stops the domain's daemon and takes this node out of the domain's status, unless a
    /// claim of the domain was booked meanwhile.
    async fn leave(&self, namespace: &str, domain_uid: &str) -> Result<(), String> {
        self.credentials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(domain_uid);
        if !self.stop_unless_served(domain_uid).await? {
            return Ok(());
        }
        if let Some(domain) = self.domain_by_uid(namespace, domain_uid).await? {
            let name = domain.metadata.name.clone().unwrap_or_default();
            self.apply_nodes(namespace, &name, vec![]).await?;
        }
        Ok(())
    }

    /// Keeps what the book holds true: every served domain's daemon runs with the clique's
    /// current peers and this node's readiness in its status; daemons of domains no claim holds
    /// (a crash between the last unprepare and the stop) are stopped; claims whose object is
    /// gone are unprepared.
    pub async fn reconcile(&self) {
        let book = match self.with_book(|book| Ok(book.clone())).await {
            Ok(book) => book,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the ComputeDomain book");
                return;
            }
        };
        let booked: Vec<(String, BookedClaim)> = book
            .claims
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (uid, claim) in &booked {
            match self.claims.get(&claim.namespace, &claim.name).await {
                Ok(Some(object)) if object.metadata.uid.as_deref() == Some(uid.as_str()) => {}
                Ok(_) => {
                    tracing::info!(claimUID = %uid, claim = %format!("{}/{}", claim.namespace, claim.name), "claim gone: unpreparing its channel");
                    if let Err(e) = self.unprepare_one(uid).await {
                        tracing::warn!(claimUID = %uid, error = %e, "cannot unprepare a gone claim's channel");
                    }
                }
                Err(e) => tracing::debug!(error = %e, "cannot read a booked claim"),
            }
        }
        let served: BTreeMap<String, String> = self
            .book()
            .claims
            .values()
            .map(|c| (c.domain.clone(), c.namespace.clone()))
            .collect();
        for domain in self.daemons.domains() {
            if !served.contains_key(&domain)
                && let Err(e) = self.stop_unless_served(&domain).await
            {
                tracing::warn!(error = %e, "cannot stop an IMEX daemon no claim holds");
            }
        }
        self.refresh_clique();
        let Ok(clique) = self.clique() else {
            return;
        };
        if clique.is_empty() || self.options.imex != ImexMode::DriverManaged {
            return;
        }
        for (uid, namespace) in served {
            let domain = match self.domain_by_uid(&namespace, &uid).await {
                Ok(Some(domain)) => domain,
                Ok(None) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read a served ComputeDomain");
                    continue;
                }
            };
            match self.run_daemon(&domain, &clique).await {
                Ok((ready, _)) => {
                    if let Err(e) = self.register(&domain, &clique, ready).await {
                        tracing::warn!(error = %e, "cannot update this node's IMEX readiness");
                    }
                }
                Err(e) => tracing::warn!(domain = %uid, error = %e, "IMEX daemon not running"),
            }
        }
    }
}

#[tonic::async_trait]
impl NodeDriver for ChannelPlugin {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, PrepareResult)> {
        let results = futures::future::join_all(claims.iter().map(|c| self.prepare_one(c))).await;
        claims.into_iter().zip(results).collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, UnprepareResult)> {
        let mut out = Vec::with_capacity(claims.len());
        for claim in claims {
            let result = self.unprepare_one(&claim.uid).await;
            out.push((claim, result));
        }
        out
    }

    /// NVIDIA's channel plugin types: a prepared claim holds one channel device (its CDI spec,
    /// written last, says the prepare completed); daemons are never claimed here (the IMEX
    /// daemon is this plugin's or the host's, not a pod's).
    fn prepared_device_counts(&self) -> Vec<(&'static str, usize)> {
        let channels = self
            .book()
            .claims
            .keys()
            .filter(|uid| self.cdi.spec_path(uid).exists())
            .count();
        vec![("channel", channels), ("daemon", 0), ("unknown", 0)]
    }
}
