//! The Helm chart ships copies of `deviceclasses/` (Helm cannot package files outside the chart,
//! and symlinks break `helm package`); they must stay byte-for-byte identical.
use std::collections::BTreeMap;
use std::path::Path;

fn yaml_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .map(|path| {
            let name = path
                .file_name()
                .expect("file name")
                .to_string_lossy()
                .into_owned();
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (name, bytes)
        })
        .collect()
}

#[test]
fn chart_ships_exactly_the_repository_deviceclasses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repo = yaml_files(&root.join("deviceclasses"));
    let chart = yaml_files(&root.join("deploy/helm/gpu-dra/files/deviceclasses"));
    assert!(!repo.is_empty(), "no DeviceClasses in deviceclasses/");
    assert_eq!(
        repo.keys().collect::<Vec<_>>(),
        chart.keys().collect::<Vec<_>>(),
        "the chart's files/deviceclasses/ must hold the same files as deviceclasses/"
    );
    for (name, bytes) in &repo {
        assert!(
            chart[name] == *bytes,
            "deploy/helm/gpu-dra/files/deviceclasses/{name} differs from deviceclasses/{name}; \
             copy it over: cp deviceclasses/*.yaml deploy/helm/gpu-dra/files/deviceclasses/"
        );
    }
}
