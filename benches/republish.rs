//! What the driver pays at each republish for its device order (the policy
//! `gpu-dra-packing-study` measures): 8 H100s in dynamic MIG mode, half of them holding MIG
//! instances.
//!
//! - `republish/order`: the placements in publication order (`slices::placement_order`), the
//!   policy's own cost;
//! - `republish/build`: the node's ResourceSlices as published (devices, counters, order);
//! - `republish/build-name-order`: the same in plain name order, for comparison.
use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_dra::gpu::mig::GpuMode;
use gpu_dra::gpu::{self, DiscoveryConfig, MigInstance, NodeInventory};
use gpu_dra::slices::{self, DeviceOrder, SliceOptions};

const NODE: &str = "sim-node";

/// The simulator's 8 H100s with a mixed load on GPUs 0–3 (3g+2g+1g, 4g+1g+1g, 7 × 1g, 2 × 3g).
fn half_full() -> NodeInventory {
    let mut inventory = gpu::discover(&DiscoveryConfig::new(
        "sim:8xH100-SXM5-80GB".parse().expect("spec"),
        NODE,
    ))
    .expect("inventory");
    let layouts: [&[(&str, u32)]; 4] = [
        &[("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2)],
        &[("4g.40gb", 0), ("1g.10gb", 6), ("1g.10gb", 5)],
        &[
            ("1g.10gb", 0),
            ("1g.10gb", 1),
            ("1g.10gb", 2),
            ("1g.10gb", 3),
            ("1g.10gb", 4),
            ("1g.10gb", 5),
            ("1g.10gb", 6),
        ],
        &[("3g.40gb", 0), ("3g.40gb", 4)],
    ];
    for (gpu, layout) in inventory.gpus.iter_mut().zip(layouts) {
        let Some(mig) = gpu.mig.as_mut() else {
            continue;
        };
        mig.mode.current = true;
        for (id, (name, start)) in layout.iter().enumerate() {
            let profile = mig
                .profiles
                .iter()
                .find(|p| p.name == *name)
                .expect("profile");
            let placement = *profile
                .placements
                .iter()
                .find(|p| p.start == *start)
                .expect("placement");
            let profile_id = profile.id;
            mig.instances.push(MigInstance {
                gpu_instance_id: id as u32 + 1,
                compute_instance_id: 0,
                profile_id,
                placement,
                uuid: format!("MIG-bench-{id}"),
            });
        }
    }
    inventory
}

fn bench(c: &mut Criterion) {
    let inventory = half_full();
    let modes: BTreeMap<u32, GpuMode> = inventory
        .gpus
        .iter()
        .map(|g| (g.minor, GpuMode::Dynamic))
        .collect();
    let options = |order| SliceOptions {
        modes: Some(modes.clone()),
        order,
        ..SliceOptions::new(slices::DEFAULT_DRIVER_NAME, NODE)
    };
    let (packed, by_name) = (options(DeviceOrder::Packed), options(DeviceOrder::Name));
    eprintln!(
        "republish bench: {} placements ordered",
        slices::placement_order(&inventory, &packed).len()
    );
    let mut group = c.benchmark_group("republish");
    group.bench_function("order", |b| {
        b.iter(|| black_box(slices::placement_order(&inventory, &packed).len()))
    });
    group.bench_function("build", |b| {
        b.iter(|| black_box(slices::build(&inventory, &packed).expect("slices").len()))
    });
    group.bench_function("build-name-order", |b| {
        b.iter(|| black_box(slices::build(&inventory, &by_name).expect("slices").len()))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
