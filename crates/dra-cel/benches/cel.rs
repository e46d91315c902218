//! ns per (selector, device) on the standard selector set (e2e/bench), compiled once.
use criterion::{Criterion, criterion_group, criterion_main};
use dra_cel::{DeviceView, Selector, compile};
use k8s_openapi::api::resource::v1::Device;
use serde::Deserialize;

#[derive(Deserialize)]
struct NamedSelector {
    name: String,
    expression: String,
}

const DRIVER: &str = "gpu.nvidia.com";

fn load() -> (Vec<(String, Selector)>, Vec<DeviceView>) {
    // The fixtures live at the repository root, two levels above this crate.
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let selectors: Vec<NamedSelector> = serde_json::from_str(
        &std::fs::read_to_string(format!("{root}/e2e/bench/selectors.json"))
            .expect("selectors.json"),
    )
    .expect("selectors json");
    let devices: Vec<Device> = serde_json::from_str(
        &std::fs::read_to_string(format!("{root}/e2e/bench/devices.json")).expect("devices.json"),
    )
    .expect("devices json");
    let compiled = selectors
        .into_iter()
        .filter_map(|s| compile(&s.expression).ok().map(|c| (s.name, c)))
        .collect();
    let views = devices
        .iter()
        .filter_map(|d| DeviceView::new(DRIVER, d).ok())
        .collect();
    (compiled, views)
}

fn bench(c: &mut Criterion) {
    let (selectors, devices) = load();
    let pairs = (selectors.len() * devices.len()) as u64;
    let mut group = c.benchmark_group("cel");
    group.throughput(criterion::Throughput::Elements(pairs));
    group.bench_function("standard-set/all-pairs", |b| {
        b.iter(|| {
            let mut matched = 0usize;
            for (_, s) in &selectors {
                for d in &devices {
                    if matches!(s.evaluate(d), Ok(true)) {
                        matched += 1;
                    }
                }
            }
            std::hint::black_box(matched)
        })
    });
    group.finish();
    let mut per = c.benchmark_group("cel-per-selector");
    for (name, s) in &selectors {
        per.throughput(criterion::Throughput::Elements(devices.len() as u64));
        per.bench_function(name.as_str(), |b| {
            b.iter(|| {
                devices
                    .iter()
                    .filter(|d| matches!(s.evaluate(d), Ok(true)))
                    .count()
            })
        });
    }
    per.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2)).warm_up_time(std::time::Duration::from_millis(500));
    targets = bench
}
criterion_main!(benches);
