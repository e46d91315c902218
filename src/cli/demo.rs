//! `gpu-dra demo`: the whole driver on one simulated node, no GPU and no cluster needed.
//!
//! It walks through what happens on a real node, step by step: discover GPUs, publish them as
//! ResourceSlices, let the scheduler's allocator pick devices for the example claims in
//! `deploy/examples/`, prepare them as kubelet would ask (carving MIG slices, writing CDI specs
//! and the checkpoint), then unprepare and show that nothing is left behind.
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use dra_allocator::{AllocatedState, Allocator, Features, NodeInfo, Outcome, load};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimStatus};

use super::CliError;
use crate::gpu::mig::MigPolicy;
use crate::gpu::sim::{SimNode, SimSpec};
use crate::prepare::ClaimRef;
use crate::prepare::state::{DeviceState, DriverConfig};
use crate::slices::{self, SliceOptions};

const DRIVER: &str = "gpu.nvidia.com";
const NODE: &str = "demo-node";

/// Shipped with the binary so the demo runs from anywhere.
const CLASSES: &[&str] = &[
    include_str!("../../deviceclasses/gpu.nvidia.com.yaml"),
    include_str!("../../deviceclasses/mig.nvidia.com.yaml"),
];
const CLAIMS: &[&str] = &[
    include_str!("../../deploy/examples/gpu-40gi.yaml"),
    include_str!("../../deploy/examples/mig-3g40gb.yaml"),
    include_str!("../../deploy/examples/mig-1g-pair.yaml"),
    include_str!("../../deploy/examples/gpu-timesliced.yaml"),
];

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The simulated node.
    #[arg(long, default_value = "sim:2xH100-SXM5-80GB,1xT4", value_parser = parse_spec)]
    pub gpus: SimSpec,
    /// Keep the CDI specs, checkpoint and hardware state in this directory (default: a temporary
    /// directory, removed at the end).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

fn parse_spec(s: &str) -> Result<SimSpec, String> {
    s.parse().map_err(|e: crate::gpu::GpuError| e.to_string())
}

fn err(what: &str, e: impl std::fmt::Display) -> CliError {
    CliError::Usage(format!("demo: {what}: {e}"))
}

fn parse<T: k8s_openapi::Resource + serde::de::DeserializeOwned>(
    texts: &[&str],
) -> Result<Vec<T>, CliError> {
    let mut out = Vec::new();
    for text in texts {
        let docs = load::parse_documents(text).map_err(|e| err("example file", e))?;
        out.extend(
            load::objects::<T>(docs, Path::new("<embedded>"))
                .map_err(|e| err("example file", e))?,
        );
    }
    Ok(out)
}

fn heading(step: u32, text: &str) {
    println!("\n── {step}. {text}");
}

pub fn run(args: DemoArgs) -> Result<ExitCode, CliError> {
    let temp;
    let dir = match &args.work_dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir().map_err(|e| err("temporary directory", e))?;
            temp.path().to_path_buf()
        }
    };
    println!(
        "gpu-dra demo: a simulated node `{NODE}` with sim:{} (files in {})",
        args.gpus,
        dir.display()
    );

    heading(
        1,
        "Discover the GPUs (here: the simulator; on a node: NVML)",
    );
    let sim = Arc::new(SimNode::new(
        args.gpus.clone(),
        NODE,
        Some(dir.join("hardware.json")),
    ));
    let inventory = sim.inventory()?;
    for gpu in &inventory.gpus {
        let mig = match &gpu.mig {
            Some(m) => format!("MIG-capable, {} profiles", m.profiles.len()),
            None => "no MIG".into(),
        };
        println!(
            "   gpu-{:<2} {:<24} {:>11}  {:<12} {}",
            gpu.minor,
            gpu.product_name,
            gpu.memory_bytes
                .map_or_else(|| "unified".to_string(), |b| format!("{} MiB", b >> 20)),
            gpu.architecture.as_str(),
            mig
        );
    }

    heading(
        2,
        "Publish them as ResourceSlices (what the API server would receive)",
    );
    // A driver root with the simulated driver's (empty) files, so the CDI specs below show what
    // a CUDA container gets from a real one.
    let driver_root = dir.join("driver-root");
    crate::prepare::driver_files::write_fake_driver_root(&driver_root, &inventory.driver_version)
        .and_then(|()| {
            // With the toolkit's hook, as most nodes have: the spec then calls it for the links.
            std::fs::write(driver_root.join("usr/bin/nvidia-cdi-hook"), b"")
        })
        .map_err(|e| err("writing a fake driver root", e))?;
    let (state, _) = DeviceState::open(
        DriverConfig {
            driver_root: Some(crate::prepare::driver_files::DriverRoot {
                here: driver_root.clone(),
                host: driver_root,
                hook: None,
                firmware: Default::default(),
            }),
            driver_name: DRIVER.into(),
            mig_policy: MigPolicy::Auto,
            node_name: NODE.into(),
            cdi_root: dir.join("cdi"),
            state_dir: dir.join("state"),
            dev_root: None,
            consumable: Default::default(),
            passthrough: false,
        },
        sim.clone(),
    )
    .map_err(|e| err("opening the driver state", e))?;
    let options = SliceOptions {
        modes: Some(state.modes().clone()),
        ..SliceOptions::new(DRIVER, NODE)
    };
    let published = slices::build(&inventory, &options)?;
    let devices: Vec<_> = published
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect();
    let counter_sets = published
        .iter()
        .flat_map(|s| s.spec.shared_counters.iter().flatten())
        .count();
    println!(
        "   {} slices, {} devices ({} whole GPUs, {} MIG placements), {} counter sets",
        published.len(),
        devices.len(),
        devices.iter().filter(|d| !d.name.contains("-mig-")).count(),
        devices.iter().filter(|d| d.name.contains("-mig-")).count(),
        counter_sets
    );
    println!(
        "   (the H100s are dynamic MIG GPUs: every profile placement is a device; the T4 is whole only)"
    );

    heading(3, "Allocate the example claims as kube-scheduler would");
    let classes: Vec<DeviceClass> = parse(CLASSES)?;
    let mut claims: Vec<ResourceClaim> = parse(CLAIMS)?;
    let allocator = Allocator::new(Features::KUBERNETES_1_37, published, classes);
    let node = NodeInfo::named(NODE);
    let mut in_use = AllocatedState::new();
    let memory = Arc::new(crate::prepare::claims::MemoryClaims::default());
    for (i, claim) in claims.iter_mut().enumerate() {
        let name = claim.metadata.name.clone().unwrap_or_default();
        claim.metadata.uid = Some(format!("00000000-0000-4000-8000-{:012}", i + 1));
        match allocator
            .allocate(&node, std::slice::from_ref(claim), &in_use)
            .map_err(|e| err(&name, e))?
        {
            Outcome::Allocated(results) => {
                let allocation = results
                    .into_iter()
                    .next()
                    .ok_or_else(|| err(&name, "no result"))?;
                in_use
                    .mark(&name, &allocation, allocator.features())
                    .map_err(|e| err(&name, e))?;
                let picked: Vec<String> = allocation
                    .devices
                    .iter()
                    .flat_map(|d| d.results.iter().flatten())
                    .map(|r| r.device.clone())
                    .collect();
                println!("   {name:<18} → {}", picked.join(", "));
                claim.status = Some(ResourceClaimStatus {
                    allocation: Some(allocation),
                    ..Default::default()
                });
                memory.insert(claim.clone());
            }
            Outcome::Unsatisfiable { reason } => {
                println!(
                    "   {name:<18} → does not fit ({})",
                    reason.unwrap_or_else(|| "no matching devices".into())
                );
            }
        }
    }

    heading(
        4,
        "Prepare them, as kubelet asks the driver before starting the pods",
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let driver = crate::prepare::driver::Driver::new(state, memory.clone());
    let refs: Vec<ClaimRef> = claims
        .iter()
        .filter(|c| c.status.is_some())
        .map(|c| ClaimRef {
            namespace: c.metadata.namespace.clone().unwrap_or_default(),
            name: c.metadata.name.clone().unwrap_or_default(),
            uid: c.metadata.uid.clone().unwrap_or_default(),
        })
        .collect();
    for (claim, result) in
        runtime.block_on(crate::prepare::NodeDriver::prepare(&driver, refs.clone()))
    {
        match result {
            Ok(devices) => {
                for d in devices {
                    println!(
                        "   {:<18} {} → {}",
                        claim.name,
                        d.device_name,
                        d.cdi_device_ids.join(" ")
                    );
                }
            }
            Err(e) => println!("   {:<18} failed: {e}", claim.name),
        }
    }
    let hardware = sim.state()?;
    for gpu in hardware.gpus.iter().filter(|g| !g.gpu_instances.is_empty()) {
        let carved: Vec<String> = gpu
            .gpu_instances
            .iter()
            .map(|gi| {
                format!(
                    "GI {} at {}:{}",
                    gi.id, gi.placement.start, gi.placement.size
                )
            })
            .collect();
        println!("   carved on gpu-{}: {}", gpu.minor, carved.join(", "));
    }
    if let Some(first) = refs.iter().find(|r| r.name == "mig-3g") {
        let spec = dir
            .join("cdi")
            .join(format!("k8s.gpu.nvidia.com-claim_{}.json", first.uid));
        println!("\n   CDI spec for {} ({}):", first.name, spec.display());
        let text = std::fs::read_to_string(&spec).map_err(|e| err("CDI spec", e))?;
        for line in text.lines() {
            println!("     {line}");
        }
    }
    let checkpoint = runtime.block_on(driver.with_state(|s| s.checkpoint().clone()));
    println!(
        "\n   checkpoint ({} claims, boot {}):",
        checkpoint.claims.len(),
        checkpoint.node_boot_id
    );
    for entry in checkpoint.claims.values() {
        let devices: Vec<&str> = entry.devices.iter().map(|d| d.device.as_str()).collect();
        println!(
            "     {:<18} {:?} {}",
            entry.name,
            entry.state,
            devices.join(", ")
        );
    }

    heading(5, "Unprepare them (pods gone) and check nothing is left");
    for (claim, result) in runtime.block_on(crate::prepare::NodeDriver::unprepare(&driver, refs)) {
        println!(
            "   {:<18} {}",
            claim.name,
            if result.is_ok() {
                "unprepared"
            } else {
                "FAILED"
            }
        );
    }
    let specs = std::fs::read_dir(dir.join("cdi"))
        .map(|d| d.count())
        .unwrap_or(0);
    let instances: usize = sim
        .state()?
        .gpus
        .iter()
        .map(|g| g.gpu_instances.len())
        .sum();
    let claims_left = runtime.block_on(driver.with_state(|s| s.checkpoint().claims.len()));
    println!(
        "   CDI specs left: {specs} · MIG instances left: {instances} · claims in checkpoint: {claims_left}"
    );
    if specs + instances + claims_left > 0 {
        return Err(err("cleanup", "something was left behind"));
    }
    println!(
        "\nDone. Run it on a cluster: `gpu-dra run --help`; explain a claim: `gpu-dra explain --help`."
    );
    Ok(ExitCode::SUCCESS)
}
