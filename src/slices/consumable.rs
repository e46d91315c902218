//! Consumable GPU capacity (KEP-5075, `DRAConsumableCapacity`): devices several claims may be
//! allocated at once, each consuming part of the device's `memory` (or of a `shares` count), with
//! the request policy NVIDIA's driver publishes, so the scheduler keeps the books.
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceCapacity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::binary_si;

/// Request granularity of `memory` (whole MiB, as MPS limits are).
pub const MEMORY_STEP: u64 = 1 << 20;

/// `--consumable-shares`, with the values NVIDIA's driver takes for its flag of the same name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ConsumableShares {
    /// Every device belongs to one claim at a time (`off`, or NVIDIA's `disabled`).
    #[default]
    Off,
    /// Devices are shared by memory: a claim asks for `capacity.requests.memory` (default: all
    /// of it, so a claim that asks for nothing has the device to itself), in 1Mi steps.
    Memory,
    /// Devices are shared without limit: `memory` may be requested (default: none), so claims
    /// that ask for nothing all fit on one device.
    Unlimited,
    /// Devices are cut into this many `shares` (default request: 1); `memory` may be requested
    /// too (default: none).
    Shares(u32),
}

impl ConsumableShares {
    pub fn is_on(&self) -> bool {
        *self != Self::Off
    }
}

impl FromStr for ConsumableShares {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "off" | "disabled" | "" => Ok(Self::Off),
            "memory" => Ok(Self::Memory),
            "unlimited" => Ok(Self::Unlimited),
            n => match n.parse::<u32>() {
                Ok(count) if count >= 1 => Ok(Self::Shares(count)),
                _ => Err(format!(
                    "{n:?} is not one of `off` (or `disabled`), `memory`, `unlimited` or a number of shares (1 or more)"
                )),
            },
        }
    }
}

impl fmt::Display for ConsumableShares {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::Memory => f.write_str("memory"),
            Self::Unlimited => f.write_str("unlimited"),
            Self::Shares(n) => write!(f, "{n}"),
        }
    }
}

/// Makes `device` (a full GPU, a static MIG device or a MIG placement) allocatable to several
/// claims under `mode`, with the request policies NVIDIA's driver publishes.
pub fn apply(device: &mut Device, mode: ConsumableShares) {
    if mode == ConsumableShares::Off {
        return;
    }
    // A GPU that reports no memory (unified memory, GB10) stays exclusive: its claims' MPS
    // clients would get no memory limit to divide.
    let Some(capacities) = device.capacity.as_mut() else {
        return;
    };
    let Some(memory) = capacities.get("memory") else {
        return;
    };
    // Max and default must be multiples of the step: whole MiB, rounded down.
    let bytes = parse_bytes(&memory.value.0) / MEMORY_STEP * MEMORY_STEP;
    let quantity = |v: u64| Quantity(binary_si(v));
    let (default, min) = match mode {
        ConsumableShares::Memory => (bytes, MEMORY_STEP),
        _ => (0, 0),
    };
    capacities.insert(
        "memory".into(),
        DeviceCapacity {
            value: quantity(bytes),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(quantity(default)),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: quantity(min),
                    max: Some(quantity(bytes)),
                    step: Some(quantity(MEMORY_STEP)),
                }),
                valid_values: None,
            }),
        },
    );
    if let ConsumableShares::Shares(count) = mode {
        let count = Quantity(count.to_string());
        let one = || Quantity("1".into());
        capacities.insert(
            "shares".into(),
            DeviceCapacity {
                value: count.clone(),
                request_policy: Some(CapacityRequestPolicy {
                    default: Some(one()),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: one(),
                        max: Some(count),
                        step: Some(one()),
                    }),
                    valid_values: None,
                }),
            },
        );
    }
    // The engine counts (multiprocessors, copy engines, ...) a dynamic-MIG GPU or a MIG device
    // publishes for selectors would otherwise be consumed whole by every allocation: one claim
    // per device, whatever the shares. Each share takes none of them, and none can be asked for
    // (no claim could be held to part of them).
    for (name, capacity) in capacities.iter_mut() {
        if capacity.request_policy.is_none() && name != "memory" && name != "shares" {
            capacity.request_policy = Some(CapacityRequestPolicy {
                default: Some(Quantity("0".into())),
                valid_range: None,
                valid_values: Some(vec![Quantity("0".into())]),
            });
        }
    }
    device.allow_multiple_allocations = Some(true);
}

/// Bytes of a quantity this module published (`binary_si` output).
fn parse_bytes(quantity: &str) -> u64 {
    k8s_quantity::Quantity::parse(quantity)
        .map(|q| q.as_approximate_float().max(0.0) as u64)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_bad_values_are_named() {
        assert_eq!("off".parse(), Ok(ConsumableShares::Off));
        assert_eq!("memory".parse(), Ok(ConsumableShares::Memory));
        assert_eq!("4".parse(), Ok(ConsumableShares::Shares(4)));
        // NVIDIA's spellings: its default `disabled`, and `unlimited`.
        assert_eq!("disabled".parse(), Ok(ConsumableShares::Off));
        assert_eq!("unlimited".parse(), Ok(ConsumableShares::Unlimited));
        for mode in ["off", "memory", "unlimited", "4"] {
            assert_eq!(
                mode.parse::<ConsumableShares>().map(|m| m.to_string()),
                Ok(mode.into())
            );
        }
        for bad in ["0", "-1", "lots", "memory,4"] {
            let e = bad.parse::<ConsumableShares>().expect_err(bad);
            assert!(e.contains(bad) && e.contains("memory"), "{e}");
        }
    }

    /// NVIDIA's own cases (`TestApplyConsumableShares`, cmd/gpu-kubelet-plugin at 95932046): a
    /// 16Gi GPU (or 10Mi + 500 bytes, rounded down to whole MiB) under each flag value.
    #[test]
    fn policies_match_nvidias_table() {
        let device = |memory: &str| -> Device {
            serde_json::from_value(serde_json::json!({
                "name": "gpu-0",
                "capacity": {"memory": {"value": memory}}
            }))
            .expect("device")
        };
        let bytes = |q: &Option<Quantity>| q.as_ref().map(|q| parse_bytes(&q.0));
        let sixteen = 16 << 30;
        // (flag, memory, max, default, min, shares)
        let cases = [
            ("disabled", "16Gi", None, 0, 0, None),
            ("unlimited", "16Gi", Some(sixteen), 0, 0, None),
            ("unlimited", "10486260", Some(10 << 20), 0, 0, None),
            ("memory", "16Gi", Some(sixteen), sixteen, 1 << 20, None),
            ("4", "16Gi", Some(sixteen), 0, 0, Some(4)),
        ];
        for (flag, memory, max, default, min, shares) in cases {
            let mode: ConsumableShares = flag.parse().expect("flag");
            let mut d = device(memory);
            apply(&mut d, mode);
            let caps = d.capacity.as_ref().expect("capacity");
            let Some(max) = max else {
                assert_eq!(d.allow_multiple_allocations, None, "{flag}");
                assert!(caps["memory"].request_policy.is_none(), "{flag}");
                assert!(!caps.contains_key("shares"), "{flag}");
                continue;
            };
            assert_eq!(d.allow_multiple_allocations, Some(true), "{flag}");
            let mem = &caps["memory"];
            let policy = mem.request_policy.as_ref().expect("policy");
            let range = policy.valid_range.as_ref().expect("range");
            assert_eq!(parse_bytes(&mem.value.0), max, "{flag} {memory}: value");
            assert_eq!(bytes(&range.max), Some(max), "{flag} {memory}: max");
            assert_eq!(bytes(&range.step), Some(1 << 20), "{flag}: step");
            assert_eq!(bytes(&policy.default), Some(default), "{flag}: default");
            assert_eq!(parse_bytes(&range.min.0), min, "{flag}: min");
            match shares {
                None => assert!(!caps.contains_key("shares"), "{flag}"),
                Some(n) => {
                    let s = &caps["shares"];
                    let policy = s.request_policy.as_ref().expect("shares policy");
                    let range = policy.valid_range.as_ref().expect("shares range");
                    assert_eq!(parse_bytes(&s.value.0), n);
                    assert_eq!(bytes(&policy.default), Some(1));
                    assert_eq!(parse_bytes(&range.min.0), 1);
                    assert_eq!(bytes(&range.max), Some(n));
                    assert_eq!(bytes(&range.step), Some(1));
                }
            }
        }
    }
}
