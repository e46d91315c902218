//! gpu-dra: a Kubernetes Dynamic Resource Allocation driver for NVIDIA GPUs.
//!
//! Data flows one way: NVML (or the simulator) → [`gpu`] device model → [`slices`]
//! ResourceSlices → API server; claims are matched with [`cel`] selectors.
pub mod allocator;
pub mod cel;
pub mod fsutil;
pub mod cli;
pub mod config;
pub mod gpu;
pub mod metrics;
pub mod node;
pub mod plugin;
pub mod prepare;
pub mod slices;
