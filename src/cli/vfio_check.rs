//! `gpu-dra vfio-check`: hands one GPU to its VFIO driver and back, outside any cluster, through
//! the very effect a claim's prepare and unprepare run (processes waited for, persistence mode
//! off and on again, other holders of `/dev/nvidia<minor>` named, this process's NVML session
//! closed across the unbind and a new one after the rebind), and reports each half and how long
//! it took. It CHANGES the GPU's kernel binding, so it runs only when told the GPU's PCI address
//! twice (`--bus-id` and `--unbind`): the opt-in step of `e2e/gpu-check.sh` on a real node.
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use super::CliError;
use super::duration;
use super::slices::GpuArgs;
use crate::gpu::mig::GpuMode;
use crate::gpu::{self, GpuControl};
use crate::prepare::checkpoint::{Checkpoint, ClaimEntry, ClaimState, DeviceRecord, VfioRecord};
use crate::prepare::effects::vfio_bind::VfioBind;
use crate::prepare::effects::{ClaimDevice, DeviceEffect, Host};
use crate::prepare::error::PrepareError;

#[derive(Debug, Args)]
#[command(
    after_help = "Exit status: 0 when the GPU went to its VFIO driver and came back to nvidia, \
seen by NVML again; 1 when either half failed (the output says why; a refused prepare leaves the \
GPU on nvidia); 2 on bad input.\n\nExample (as root, on a node with no claim on that GPU):\n  \
gpu-dra vfio-check --gpus nvml --passthrough --bus-id 0000:3a:00.0 --unbind 0000:3a:00.0"
)]
pub struct VfioCheckArgs {
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Node name (simulated GPU UUIDs derive from it).
    #[arg(long, env = "NODE_NAME", default_value = "node")]
    pub node_name: String,
    /// The GPU to hand to its VFIO driver and back, by PCI address.
    #[arg(long)]
    pub bus_id: String,
    /// The same PCI address again: the confirmation that this GPU may be unbound from nvidia.
    #[arg(long)]
    pub unbind: String,
    /// How long the GPU gets to be let go of (processes, other holders) before the check fails
    /// naming them, as a claim's prepare would (the driver waits 20 s).
    #[arg(long, default_value = "20s", value_parser = duration::parse)]
    pub release_wait: Duration,
    /// Where the kernel makes `/dev/vfio/<group>` (the host's dev root).
    #[arg(long, default_value = "/")]
    pub dev_root: PathBuf,
}

/// What the effect needs of a node, for one claim held in memory.
struct CheckHost {
    gpus: Arc<dyn GpuControl>,
    checkpoint: Mutex<Checkpoint>,
    dev_root: PathBuf,
}

impl Host for CheckHost {
    fn gpus(&self) -> &dyn GpuControl {
        &*self.gpus
    }
    fn record(&self, change: &mut dyn FnMut(&mut Checkpoint)) -> Result<(), PrepareError> {
        change(&mut self.checkpoint.lock().unwrap_or_else(|p| p.into_inner()));
        Ok(())
    }
    fn refresh(&self, _minors: &BTreeSet<u32>) -> Result<(), PrepareError> {
        self.gpus.invalidate();
        Ok(())
    }
    fn gpu_mode(&self, _minor: u32) -> Option<GpuMode> {
        Some(GpuMode::Whole)
    }
    fn mig_mode(&self, _minor: u32) -> (bool, bool) {
        (false, false)
    }
    fn host_dev_path(&self, path: &str) -> Option<PathBuf> {
        // Simulated GPUs have no kernel to make the node.
        (!self.gpus.simulated()).then(|| self.dev_root.join(path.trim_start_matches('/')))
    }
    fn inspect_inventory(&self, look: &mut dyn FnMut(&gpu::NodeInventory)) {
        // The check holds no inventory (the vfio binding reads none): read it afresh if asked.
        match self.gpus.inventory() {
            Ok(inventory) => look(&inventory),
            Err(error) => tracing::warn!(%error, "cannot read the GPUs"),
        }
    }
}

const UID: &str = "gpu-dra-vfio-check";

pub fn run(args: VfioCheckArgs) -> Result<ExitCode, CliError> {
    if args.unbind != args.bus_id {
        return Err(CliError::Usage(format!(
            "--unbind {:?} is not --bus-id {:?}: give the GPU's PCI address twice to confirm it may leave nvidia",
            args.unbind, args.bus_id
        )));
    }
    if !args.gpu.passthrough {
        return Err(CliError::Usage(
            "--passthrough is needed: the check reads the GPUs' PCI functions".into(),
        ));
    }
    let control = gpu::open_control(&args.gpu.discovery(&args.node_name))?;
    let inventory = control.inventory()?;
    let gpu = inventory
        .gpus
        .iter()
        .find(|g| g.pci_bus_id == args.bus_id)
        .ok_or_else(|| {
            CliError::Usage(format!(
                "--bus-id {}: no GPU NVML sees has this PCI address (it must be on nvidia)",
                args.bus_id
            ))
        })?;
    let group = inventory
        .pci
        .by_bus_id(&args.bus_id)
        .and_then(|f| f.iommu_group)
        .ok_or_else(|| {
            CliError::Usage(format!(
                "--bus-id {}: the GPU is in no IOMMU group (IOMMU off?)",
                args.bus_id
            ))
        })?;
    let device = DeviceRecord {
        request_names: vec!["vm".into()],
        pool: args.node_name.clone(),
        device: format!("gpu-vfio ({})", args.bus_id),
        cdi_device_ids: vec![],
        share_id: None,
        consumed: BTreeMap::new(),
        admin_access: false,
        uuid: gpu.uuid.clone(),
        mig: None,
        config: None,
        sharing: None,
        vfio: Some(VfioRecord {
            bus_id: args.bus_id.clone(),
            minor: Some(gpu.minor),
            iommu_group: group,
            cdev: None,
            persistence: false,
        }),
        unknown: Default::default(),
    };
    let mut checkpoint = Checkpoint::new("vfio-check");
    checkpoint.claims.insert(
        UID.into(),
        ClaimEntry {
            namespace: String::new(),
            name: UID.into(),
            uid: UID.into(),
            state: ClaimState::PrepareStarted,
            devices: vec![device],
            pod_claim_name: None,
            taken_over: None,
            unknown: Default::default(),
        },
    );
    let host = CheckHost {
        gpus: Arc::clone(&control),
        checkpoint: Mutex::new(checkpoint),
        dev_root: args.dev_root.clone(),
    };
    let effect = VfioBind {
        release_wait: args.release_wait,
    };
    let recorded = || {
        host.checkpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .claims[UID]
            .devices[0]
            .clone()
    };
    let timed = |f: &dyn Fn() -> Result<(), PrepareError>| {
        let started = Instant::now();
        let result = f();
        (result, started.elapsed().as_millis())
    };
    let before = recorded();
    let device = |record| ClaimDevice {
        uid: UID,
        index: 0,
        record,
    };
    let (bound, bind_ms) = timed(&|| effect.apply(&host, &device(&before)));
    // Undone whatever happened: a refused or half-done prepare is rolled back as the driver does.
    let after = recorded();
    let (back, unbind_ms) = timed(&|| effect.undo(&host, &device(&after)));
    let seen_again = control
        .inventory()?
        .gpus
        .iter()
        .any(|g| g.pci_bus_id == args.bus_id);
    let half = |result: &Result<(), PrepareError>, ms: u128| match result {
        Ok(()) => json!({"ok": true, "ms": ms}),
        Err(e) => json!({"ok": false, "ms": ms, "error": e.to_string()}),
    };
    let report = json!({
        "busId": args.bus_id,
        "minor": gpu.minor,
        "iommuGroup": group,
        "toVfio": half(&bound, bind_ms),
        "vfioCdev": after.vfio.as_ref().and_then(|v| v.cdev.clone()),
        "persistenceWasOn": after.vfio.as_ref().is_some_and(|v| v.persistence),
        "backToNvidia": half(&back, unbind_ms),
        "seenByNvmlAgain": seen_again,
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&report).map_err(|e| CliError::Encode(e.to_string()))?
    );
    Ok(if bound.is_ok() && back.is_ok() && seen_again {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
