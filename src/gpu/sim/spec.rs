//! [`SimSpec`]: which GPUs a simulated node has (`sim:<N>x<MODEL>[,...]`).
use std::fmt;
use std::str::FromStr;

use crate::gpu::GpuError;
use crate::gpu::catalog::{self, SimModel};

/// Most GPUs a spec may describe; far above any real node, low enough to catch typos like `8000x`.
const MAX_GPUS: u32 = 1024;

/// `<N>x<MODEL>[,<N>x<MODEL>...]`, optionally prefixed with `sim:`.
#[derive(Debug, Clone)]
pub struct SimSpec {
    groups: Vec<(u32, &'static SimModel)>,
}

impl PartialEq for SimSpec {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for SimSpec {}

impl SimSpec {
    /// Models in minor order.
    pub fn models(&self) -> impl Iterator<Item = &'static SimModel> + '_ {
        self.groups
            .iter()
            .flat_map(|(n, m)| std::iter::repeat_n(*m, *n as usize))
    }

    pub fn gpu_count(&self) -> u32 {
        self.groups.iter().map(|(n, _)| n).sum()
    }
}

impl FromStr for SimSpec {
    type Err = GpuError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| GpuError::Spec {
            spec: input.to_string(),
            reason,
        };
        let body = input.strip_prefix("sim:").unwrap_or(input);
        if body.trim().is_empty() {
            return Err(err(
                "no GPUs given; expected <N>x<MODEL>, e.g. sim:8xH100-SXM5-80GB".into(),
            ));
        }
        let mut groups = Vec::new();
        let mut total = 0u32;
        for part in body.split(',') {
            let part = part.trim();
            let digits = part.bytes().take_while(u8::is_ascii_digit).count();
            let (count, rest) = part.split_at(digits);
            let model_key = rest
                .strip_prefix(['x', 'X'])
                .filter(|_| !count.is_empty())
                .ok_or_else(|| err(format!("{part:?} is not <N>x<MODEL>")))?;
            let count: u32 = count
                .parse()
                .map_err(|_| err(format!("{count:?} in {part:?} is not a GPU count")))?;
            if count == 0 {
                return Err(err(format!("{part:?} asks for zero GPUs")));
            }
            let model = catalog::model(model_key).ok_or_else(|| {
                let known: Vec<_> = catalog::MODELS.iter().map(|m| m.key).collect();
                err(format!(
                    "unknown model {model_key:?} (known: {})",
                    known.join(", ")
                ))
            })?;
            total = total.saturating_add(count);
            if total > MAX_GPUS {
                return Err(err(format!("more than {MAX_GPUS} GPUs")));
            }
            groups.push((count, model));
        }
        Ok(Self { groups })
    }
}

impl fmt::Display for SimSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .groups
            .iter()
            .map(|(n, m)| format!("{n}x{}", m.key))
            .collect();
        f.write_str(&parts.join(","))
    }
}
