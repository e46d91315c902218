//! Allocation speed on a node with 8 H100s as the simulator publishes them (whole GPUs and,
//! where the simulator publishes them, every MIG placement with shared counters).
//!
//! - `alloc/1-claim`: one pod, one claim (a GPU with ≥ 40Gi), allocator built from scratch,
//!   as kube-scheduler builds one per scheduling cycle.
//! - `alloc/100-claims`: 100 claims (GPUs, MIG 1g.10gb, 2g.20gb, two MIG devices) allocated
//!   one after the other, each seeing the devices taken before it, on one allocator.
//!
//! With `ALLOC_BENCH_DUMP=DIR` the exact inputs are written to DIR (slices.json,
//! classes.json, claims-1.json, claims-100.json) for the Go side of
//! e2e/alloc-fixtures/bench/compare.sh.
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use dra_allocator::{AllocatedState, Allocator, Features, NodeInfo, Outcome, load};
use dra_cel::SelectorCache;
use gpu_dra::gpu::{self, DiscoveryConfig};
use gpu_dra::slices::{self, SliceOptions};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};

const NODE: &str = "sim-node";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn node_slices() -> Vec<ResourceSlice> {
    let inventory = gpu::discover(&DiscoveryConfig::new(
        "sim:8xH100-SXM5-80GB".parse().expect("spec"),
        NODE,
    ))
    .expect("inventory");
    slices::build(
        &inventory,
        &SliceOptions::new(slices::DEFAULT_DRIVER_NAME, NODE),
    )
    .expect("slices")
}

fn classes() -> Vec<DeviceClass> {
    load::read_classes(&[root().join("deviceclasses")]).expect("deviceclasses/")
}

fn claims(name: &str) -> Vec<ResourceClaim> {
    load::read_claims(&[root().join("e2e/alloc-fixtures/bench").join(name)]).expect("claims")
}

fn dump(dir: &Path, slices: &[ResourceSlice], classes: &[DeviceClass]) {
    std::fs::create_dir_all(dir).expect("dump dir");
    let write = |name: &str, value: serde_json::Value| {
        std::fs::write(dir.join(name), serde_json::to_vec(&value).expect("json")).expect("write");
    };
    write("slices.json", serde_json::to_value(slices).expect("json"));
    write("classes.json", serde_json::to_value(classes).expect("json"));
    for name in ["claims-1.json", "claims-100.json"] {
        write(name, serde_json::to_value(claims(name)).expect("json"));
    }
}

/// Allocates claims one by one like consecutive scheduling cycles; returns how many fit.
fn allocate_in_order(allocator: &Allocator, claims: &[ResourceClaim]) -> usize {
    let node = NodeInfo::named(NODE);
    let features = Features::default();
    let mut state = AllocatedState::new();
    let mut allocated = 0;
    for claim in claims {
        if let Ok(Outcome::Allocated(results)) =
            allocator.allocate(&node, std::slice::from_ref(claim), &state)
        {
            for r in &results {
                state.mark("bench", r, &features).expect("mark");
            }
            allocated += 1;
        }
    }
    allocated
}

fn bench(c: &mut Criterion) {
    let slices = node_slices();
    let classes = classes();
    if let Some(dir) = std::env::var_os("ALLOC_BENCH_DUMP") {
        dump(Path::new(&dir), &slices, &classes);
    }
    let one = claims("claims-1.json");
    let hundred = claims("claims-100.json");
    let (slices, classes) = (Arc::new(slices), Arc::new(classes));
    // Compiled selectors live across scheduling cycles, in the scheduler as here.
    let compiled = Arc::new(SelectorCache::new());
    let fresh = || {
        Allocator::shared(
            Features::default(),
            slices.clone(),
            classes.clone(),
            compiled.clone(),
        )
    };
    let warm = fresh();
    eprintln!(
        "alloc bench: {} devices; 100 claims: {} allocated",
        slices
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .sum::<usize>(),
        allocate_in_order(&warm, &hundred)
    );

    let mut group = c.benchmark_group("alloc");
    group.bench_function("1-claim", |b| {
        b.iter(|| black_box(allocate_in_order(&fresh(), &one)))
    });
    group.bench_function("100-claims", |b| {
        b.iter(|| black_box(allocate_in_order(&fresh(), &hundred)))
    });
    group.bench_function("1-claim-warm-allocator", |b| {
        b.iter(|| black_box(allocate_in_order(&warm, &one)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
