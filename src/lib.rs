//! gpu-dra: a Kubernetes Dynamic Resource Allocation driver for NVIDIA GPUs.
//!
//! Data flows one way: NVML (or the simulator) → [`gpu`] device model → [`slices`]
//! ResourceSlices → API server; claim → allocation (`dra-allocator`, `dra-cel` selectors) →
//! kubelet ([`plugin`]) → [`prepare`] (MIG carving, [`config`], CDI specs, checkpoint). [`node`]
//! runs it all as `gpu-dra run`; [`cli`] holds the commands. The CEL engine and the allocator are
//! workspace crates used only by the offline commands (cargo feature `tools`), so the node agent
//! links neither. [`health`] turns GPU faults into device taints and kubelet health updates.
pub mod cli;
pub mod compute_domain;
pub mod config;
pub mod fsutil;
pub mod gpu;
pub mod health;
pub mod kubeapi;
pub mod metrics;
pub mod node;
pub mod plugin;
pub mod prepare;
pub mod slices;
