//! `gpu-dra match` and `gpu-dra explain`: allocate ResourceClaims offline exactly as
//! kube-scheduler would, and explain the outcome device by device.
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use dra_allocator::explain::{self, Explanation};
use dra_allocator::{AllocatedState, Allocator, Features, NodeInfo, Outcome, load};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimStatus, ResourceSlice};

use super::CliError;
use super::slices::{OutputFormat, write_document};
use crate::gpu::{self, DiscoveryConfig, GpuSource};
use crate::slices::{self, SliceOptions};

/// Inputs shared by `match` and `explain`.
#[derive(Debug, Args)]
pub struct ClaimInputs {
    /// ResourceSlices: a YAML/JSON file or directory, or `sim:<N>x<MODEL>[,...]` for the
    /// slices a simulated node publishes. Repeat for more.
    #[arg(long = "slices", required = true, value_name = "FILE|DIR|sim:SPEC")]
    pub slices: Vec<String>,
    /// DeviceClasses: YAML/JSON files or directories. Repeat for more.
    #[arg(long = "classes", value_name = "FILE|DIR")]
    pub classes: Vec<PathBuf>,
    /// Node to allocate on (also the node name of `sim:` slices).
    #[arg(long, default_value = "sim-node")]
    pub node: String,
    /// Extra node labels `k=v,...` for slices that select nodes by label.
    #[arg(long, value_name = "K=V,...")]
    pub node_labels: Option<String>,
    /// Claims that are already allocated (status.allocation set): their devices are in use.
    #[arg(long = "allocated", value_name = "FILE|DIR")]
    pub allocated: Vec<PathBuf>,
    /// Driver name of `sim:` slices.
    #[arg(long, default_value = slices::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// The ResourceClaim(s) of one pod; several claims are allocated together.
    #[arg(value_name = "CLAIM.yaml")]
    pub claim: PathBuf,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  gpu-dra match --slices sim:1xT4,1xH100-SXM5-80GB \
    --classes deviceclasses/ claim.yaml\n\nExit status: 0 allocated, 1 not satisfiable \
    (explanation on stderr), 2 bad input."
)]
pub struct MatchArgs {
    #[command(flatten)]
    pub inputs: ClaimInputs,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "yaml")]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  gpu-dra explain --slices sim:1xT4,1xH100-SXM5-80GB \
    --classes deviceclasses/ claim.yaml"
)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub inputs: ClaimInputs,
}

/// Everything loaded and ready to allocate.
struct Loaded {
    allocator: Allocator,
    node: NodeInfo,
    claims: Vec<ResourceClaim>,
    state: AllocatedState,
}

fn usage(e: impl std::fmt::Display) -> CliError {
    CliError::Usage(e.to_string())
}

fn simulated_slices(spec: &str, node: &str, driver: &str) -> Result<Vec<ResourceSlice>, CliError> {
    let source: GpuSource = spec.parse()?;
    let inventory = gpu::discover(&DiscoveryConfig {
        source,
        node_name: node.to_string(),
        sim_state: None,
        nvml_library: None,
        sysfs_root: PathBuf::from("/sys"),
        nvidia_smi: None,
    })?;
    Ok(slices::build(&inventory, &SliceOptions::new(driver, node))?)
}

fn load(inputs: &ClaimInputs) -> Result<Loaded, CliError> {
    let mut all_slices = Vec::new();
    for source in &inputs.slices {
        if source.starts_with("sim:") {
            all_slices.extend(simulated_slices(source, &inputs.node, &inputs.driver_name)?);
        } else {
            all_slices.extend(load::read_slices(&[PathBuf::from(source)]).map_err(usage)?);
        }
    }
    let classes = load::read_classes(&inputs.classes).map_err(usage)?;
    let claims = load::read_claims(std::slice::from_ref(&inputs.claim)).map_err(usage)?;
    if claims.is_empty() {
        return Err(usage(format!(
            "{}: no ResourceClaim",
            inputs.claim.display()
        )));
    }
    let features = Features::default();
    let mut state = AllocatedState::new();
    for claim in load::read_claims(&inputs.allocated).map_err(usage)? {
        let name = dra_allocator::claim_name(&claim);
        let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
            return Err(usage(format!(
                "--allocated claim {name} has no status.allocation"
            )));
        };
        state.mark(&name, allocation, &features).map_err(usage)?;
    }
    let mut node = NodeInfo::named(&inputs.node);
    for pair in inputs
        .node_labels
        .iter()
        .flat_map(|l| l.split(','))
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| usage(format!("--node-labels: {pair:?} is not k=v")))?;
        node.labels.insert(k.to_string(), v.to_string());
    }
    Ok(Loaded {
        allocator: Allocator::new(features, all_slices, classes),
        node,
        claims,
        state,
    })
}

pub fn run_match(args: MatchArgs) -> Result<ExitCode, CliError> {
    let loaded = load(&args.inputs)?;
    let outcome = loaded
        .allocator
        .allocate(&loaded.node, &loaded.claims, &loaded.state);
    let results = match outcome {
        Ok(Outcome::Allocated(results)) => results,
        Ok(Outcome::Unsatisfiable { .. }) | Err(_) => {
            let explanation = explain::explain(
                &loaded.allocator,
                &loaded.node,
                &loaded.claims,
                &loaded.state,
            );
            eprint!("{}", short_explanation(&explanation));
            return Ok(ExitCode::from(1));
        }
    };
    let mut out = Vec::new();
    for (mut claim, allocation) in loaded.claims.into_iter().zip(results) {
        let status = claim
            .status
            .get_or_insert_with(ResourceClaimStatus::default);
        status.allocation = Some(allocation);
        out.push(serde_json::to_value(&claim).map_err(|e| CliError::Encode(e.to_string()))?);
    }
    let document = if out.len() == 1 {
        out.remove(0)
    } else {
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": out})
    };
    write_document(&document, args.output)?;
    Ok(ExitCode::SUCCESS)
}

/// The verdict plus, per request, the devices that came closest.
fn short_explanation(e: &Explanation) -> String {
    let full = e.render();
    let mut lines = full.lines();
    let mut out = String::new();
    if let Some(first) = lines.next() {
        out.push_str(first);
        out.push('\n');
    }
    // Keep request summaries and the near misses; device-by-device detail is for `explain`.
    let mut in_near = false;
    for line in lines {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.starts_with("Claim ")
            || trimmed.starts_with("Request ")
            || trimmed.starts_with("pool ")
        {
            in_near = false;
            out.push_str(line);
            out.push('\n');
        } else if trimmed.starts_with("Would fit instead") {
            in_near = true;
            out.push_str(line);
            out.push('\n');
        } else if (in_near && indent >= 6) || indent <= 2 && !trimmed.is_empty() {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str("Run `gpu-dra explain` with the same arguments for every device.\n");
    out
}

pub fn run_explain(args: ExplainArgs) -> Result<ExitCode, CliError> {
    let loaded = load(&args.inputs)?;
    let explanation = explain::explain(
        &loaded.allocator,
        &loaded.node,
        &loaded.claims,
        &loaded.state,
    );
    print!("{}", explanation.render());
    Ok(if explanation.allocated() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
