//! The kubelet plugin: how kubelet finds the driver and asks it to prepare devices.
//!
//! [`PluginServer::start`] serves, over unix sockets:
//! - `<registrar-dir>/<driver>-reg.sock`: plugin registration (`pluginregistration.Registration`),
//!   advertising `v1.DRAPlugin` then `v1beta1.DRAPlugin`;
//! - `<plugin-dir>/dra.sock`: DRA v1 and v1beta1 (calls into a [`NodeDriver`](crate::prepare::NodeDriver)),
//!   device health v1 and v1alpha1 (fed through [`HealthReporter`]) and `grpc.health.v1` for probes.

pub mod authority;
mod dra;
mod error;
mod health;
pub mod proto;
mod registration;
mod server;
mod shutdown;
mod socket;

pub use error::PluginError;
pub use health::{DeviceHealth, DeviceHealthStatus, HealthReporter};
pub use registration::{
    DRA_PLUGIN_TYPE, DRA_SERVICE_VERSIONS, HEALTH_SERVICE_VERSIONS, KubeletRegistration,
};
pub use server::{DRA_SOCKET_NAME, PluginConfig, PluginServer};

#[cfg(test)]
mod tests;
