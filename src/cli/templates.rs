//! `gpu-dra templates`: the ResourceSlices a node of a model will publish, as an autoscaler's
//! templates (see [`crate::slices::template`]): Karpenter's instance-type form, or plain
//! ResourceSlices for autoscalers that take those (Cluster Autoscaler's node group templates).
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use serde_json::json;

use super::CliError;
use super::slices::{GatedArgs, GpuArgs, OutputFormat, write_document};
use crate::slices::{self, template};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TemplateForm {
    /// Karpenter's `cloudprovider.DynamicResources` of an instance type:
    /// `resourceSliceTemplates` (`{driver, pool, devices | sharedCounters}` each) and
    /// `attributeBindings` (a GPU's MIG devices share `parentUUID`), as
    /// `e2e/karpenter`'s cloud provider reads them.
    Karpenter,
    /// A `kind: List` of ResourceSlices for node `--node-name`, without the GPUs' UUIDs.
    Slices,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  gpu-dra templates --gpus sim:8xH100-SXM5-80GB --form karpenter -o json\n  \
    gpu-dra templates --gpus sim:4xL40S --form slices --node-name gpu-node-template"
)]
pub struct TemplatesArgs {
    /// The node model: `sim:<N>x<MODEL>` (or `nvml`: this machine's GPUs). Flags that change
    /// what the driver publishes (`--mig`, `--consumable-shares`, `--passthrough`,
    /// `--feature-gates`) must be the chart's, so that the templates equal the live slices.
    #[command(flatten)]
    pub gpu: GpuArgs,
    #[command(flatten)]
    pub gated: GatedArgs,
    /// Device order within the pool: the driver's `--device-order` (`packed` or `name`).
    #[arg(long, env = "GPU_DRA_DEVICE_ORDER", default_value = "packed", value_parser = super::run::device_order())]
    pub device_order: slices::DeviceOrder,
    /// The node (and pool) name the templates carry; the real node's replaces it.
    #[arg(long, default_value = "template")]
    pub node_name: String,
    /// DRA driver name the slices are published under.
    #[arg(long, env = "GPU_DRA_DRIVER_NAME", default_value = slices::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// Which autoscaler's form.
    #[arg(long, value_enum, default_value = "karpenter")]
    pub form: TemplateForm,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "yaml")]
    pub output: OutputFormat,
}

pub fn run(args: TemplatesArgs) -> Result<ExitCode, CliError> {
    let (inventory, mut options) = super::slices::discover_with_options(
        &args.gpu,
        &args.gated,
        &args.driver_name,
        &args.node_name,
    )?;
    options.order = args.device_order;
    let built = slices::build(&inventory, &options)?;
    let encode = |e: serde_json::Error| CliError::Encode(e.to_string());
    let document = match args.form {
        TemplateForm::Karpenter => {
            serde_json::to_value(template::dynamic_resources(built)).map_err(encode)?
        }
        TemplateForm::Slices => {
            let items = built
                .into_iter()
                .map(template::without_unit_identity)
                .map(|s| serde_json::to_value(s).map_err(encode))
                .collect::<Result<Vec<_>, _>>()?;
            json!({ "apiVersion": "v1", "kind": "List", "items": items })
        }
    };
    write_document(&document, args.output)?;
    Ok(ExitCode::SUCCESS)
}
