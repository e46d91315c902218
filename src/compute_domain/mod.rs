//! Multi-node NVLink: ComputeDomains and IMEX channels (`compute-domain.nvidia.com`), with
//! NVIDIA's API, names and classes so its users' manifests work unchanged.
//!
//! A user creates a `ComputeDomain`; the [`controller`] makes its channel ResourceClaimTemplate
//! and keeps `status.status`. Workers claim channel 0 from that template; on each node the
//! [`node`] plugin registers the node in the domain's `status.nodes`, runs the domain's IMEX
//! daemon ([`imex`]) with the addresses of the domain's nodes in the same NVLink clique, waits
//! until it is ready on `numNodes` nodes of that clique, and injects the channel device node.
//!
//! Unlike NVIDIA's driver there is no per-domain DaemonSet: the node plugin runs the IMEX daemon
//! itself, in the host's namespaces and a cgroup of its own, so it outlives the plugin's
//! container (as the MPS daemons do) and no daemon pod has to be scheduled first.

pub mod api;
pub mod clique_label;
pub mod controller;
pub mod credentials;
pub mod imex;
pub mod node;
pub mod node_agent;
pub mod options;

/// The DRA driver name of ComputeDomain channels.
pub const DRIVER_NAME: &str = "compute-domain.nvidia.com";
/// Label on what a domain owns (value: the domain's UID); also its finalizer.
pub const DOMAIN_LABEL: &str = "resource.nvidia.com/computeDomain";
pub const FINALIZER: &str = DOMAIN_LABEL;
/// Label telling workload from daemon templates, as NVIDIA's controller sets it.
pub const TARGET_LABEL: &str = "resource.nvidia.com/computeDomainTarget";
/// The class a domain's channel template requests.
pub const CHANNEL_CLASS: &str = "compute-domain-default-channel.nvidia.com";
/// NVIDIA's daemon class; shipped for manifests that name it, never allocated here.
pub const DAEMON_CLASS: &str = "compute-domain-daemon.nvidia.com";
/// IMEX channels a node has (`NVreg_ImexChannelCount`'s default), all injected with
/// `allocationMode: All`.
pub const CHANNEL_COUNT: u32 = 2048;
/// The kernel's name of the channels' character device (`/proc/devices`).
pub const CHANNEL_DEVICE: &str = "nvidia-caps-imex-channels";
