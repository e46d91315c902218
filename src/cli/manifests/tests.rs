//! Unit tests of reading manifests and planning their claims: per-replica claims, generated
//! names, document numbering in Lists and streams, and errors naming the field and item.
use super::convert::Kind;
use super::*;

const MANIFESTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: ml}
---
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: ml}
spec:
  metadata:
    labels: {team: ml}
  spec:
    devices:
      requests:
      - name: gpu
        deviceClassName: gpu.nvidia.com
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: trainer, namespace: ml}
spec:
  replicas: 2
  template:
    spec:
      containers: [{name: c, image: x, resources: {claims: [{name: gpu}]}}]
      resourceClaims:
      - name: gpu
        resourceClaimTemplateName: one-gpu
      - name: shared
        resourceClaimName: shared
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: shared, namespace: ml}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}
"#;

fn read(text: &str) -> Result<Manifests, ManifestError> {
    let mut m = Manifests::default();
    for doc in parse_text(text, "t.yaml")? {
        m.add_document(doc, None, None)?;
    }
    Ok(m)
}

#[test]
fn a_deployment_gets_claims_per_replica_and_shares_named_ones() {
    let m = read(MANIFESTS).unwrap();
    assert_eq!(m.notes.len(), 1, "{:?}", m.notes);
    assert!(m.notes[0].starts_with("skipped Namespace ml (t.yaml, document 1): not a Pod"));
    let one = plan(&m, false, &[]).unwrap();
    assert_eq!(one.units.len(), 1);
    assert_eq!(one.units[0].claims.len(), 2);
    assert!(one.notes[0].contains("2 replicas, allocating one pod's claims"));
    let all = plan(&m, true, &[]).unwrap();
    assert_eq!(all.units.len(), 2);
    let generated: Vec<String> = all.generated.iter().map(claim_key).collect();
    assert_eq!(generated.len(), 2);
    assert_ne!(generated[0], generated[1]);
    let claim = &all.generated[0];
    let pod = &claim.metadata.owner_references.as_ref().unwrap()[0].name;
    assert!(pod.starts_with("trainer-"), "{pod}");
    assert!(
        claim
            .metadata
            .name
            .as_deref()
            .unwrap()
            .starts_with(&format!("{pod}-gpu-"))
    );
    assert_eq!(
        claim.metadata.labels.as_ref().unwrap()["team"],
        "ml",
        "template labels are copied"
    );
    assert_eq!(
        claim.metadata.annotations.as_ref().unwrap()[POD_CLAIM_NAME_ANNOTATION],
        "gpu"
    );
    // The shared claim is in both pods' units, under its own name.
    for unit in &all.units {
        assert!(unit.claims.iter().any(|c| claim_key(c) == "ml/shared"));
    }
}

#[test]
fn a_missing_template_names_the_pod_and_field() {
    let text = MANIFESTS.replace(
        "resourceClaimTemplateName: one-gpu",
        "resourceClaimTemplateName: two-gpus",
    );
    let err = plan(&read(&text).unwrap(), false, &[])
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "Deployment ml/trainer (t.yaml, document 3): spec.template.spec.resourceClaims[0].resourceClaimTemplateName: ResourceClaimTemplate ml/two-gpus is not in the inputs (give it with -f)"
    );
}

#[test]
fn long_names_are_cut_like_the_controller_does() {
    let template = ResourceClaimTemplate::default();
    let pod = "a".repeat(60);
    let claim = claim_from_template(&pod, "uid", "default", "gpu-claim", &template);
    let generate_name = claim.metadata.generate_name.unwrap();
    // 57 * 60 / 71 = 48 and 57 * 9 / 71 = 7, joined by '-'.
    assert_eq!(generate_name, format!("{}-gpu-cla", "a".repeat(48)));
    assert_eq!(claim.metadata.name.unwrap().len(), generate_name.len() + 5);
}

#[test]
fn lists_and_json_streams_keep_document_numbers() {
    let docs = parse_text(
        r#"{"kind": "List", "apiVersion": "v1", "items": [{"kind": "A"}, {"kind": "B"}]} {"kind": "C"}"#,
        "f.json",
    )
    .unwrap();
    let origins: Vec<String> = docs.iter().map(|d| d.origin.to_string()).collect();
    assert_eq!(
        origins,
        [
            "f.json, document 1, item 1",
            "f.json, document 1, item 2",
            "f.json, document 2"
        ]
    );
}

/// A JSON List of slices, as `kubectl get resourceslices -o json` writes a fleet's: read on
/// threads, straight from the text where that reads the same, in input order.
fn slice_list(items: &[String]) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "List", "items": [{}]}}"#,
        items.join(",")
    )
}

fn slice_item(i: usize, memory: &str, extra: &str) -> String {
    format!(
        r#"{{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {{"name": "s-{i}"}},
                "spec": {{"driver": "gpu.nvidia.com", "nodeName": "n-{i}",
                  "pool": {{"name": "n-{i}", "generation": 1, "resourceSliceCount": 1}},
                  "devices": [{{"name": "gpu-0", "capacity": {{"memory": {memory}}}{extra}}}]}}}}"#
    )
}

#[test]
fn a_list_of_many_slices_reads_as_one_reader_would() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("fleet.json");
    // Item 41 omits its capacity's value (Go reads 0), so it takes the general path.
    let items: Vec<String> = (0..100)
        .map(|i| match i {
            40 => slice_item(i, "{}", ""),
            _ => slice_item(i, r#"{"value": "80Gi"}"#, ""),
        })
        .collect();
    std::fs::write(&path, slice_list(&items)).expect("write");
    let mut m = Manifests::default();
    m.add_typed(std::slice::from_ref(&path), Kind::ResourceSlice)
        .expect("read");
    assert_eq!(m.slices.len(), 100);
    for (i, entry) in m.slices.iter().enumerate() {
        assert_eq!(
            entry.object.metadata.name.as_deref(),
            Some(format!("s-{i}").as_str())
        );
        assert_eq!(entry.seq, i);
        assert_eq!(entry.origin.item, Some(i + 1));
        let devices = entry.object.spec.devices.as_deref().unwrap_or_default();
        let value = &devices[0].capacity.as_ref().expect("capacity")["memory"]
            .value
            .0;
        assert_eq!(value, if i == 40 { "0" } else { "80Gi" }, "slice {i}");
    }
}

#[test]
fn a_bad_item_in_a_long_list_is_named_by_its_number() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("fleet.json");
    let items: Vec<String> = (0..100)
        .map(|i| match i {
            // Both threads' shares hold a bad item: the first in input order is reported.
            70 => slice_item(i, r#"{"value": "80Gi"}"#, r#", "colour": "red""#),
            80 => slice_item(i, r#"{"value": "lots"}"#, ""),
            _ => slice_item(i, r#"{"value": "80Gi"}"#, ""),
        })
        .collect();
    std::fs::write(&path, slice_list(&items)).expect("write");
    let mut m = Manifests::default();
    let err = m
        .add_typed(std::slice::from_ref(&path), Kind::ResourceSlice)
        .expect_err("unknown field")
        .to_string();
    assert!(err.contains("ResourceSlice s-70"), "{err}");
    assert!(err.contains("item 71"), "{err}");
    assert!(err.contains("colour"), "{err}");
}

#[test]
fn a_bad_device_field_is_named_by_its_full_path() {
    // Devices are checked without paths first; the one that fails is named in full.
    let text = r#"{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "s"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "n",
              "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
              "devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "80Gi"}}},
                          {"name": "gpu-1", "capacity": {"memory": {"value": "lots"}}}]}}"#;
    let err = read(text).expect_err("bad quantity").to_string();
    assert!(
        err.contains("spec.devices[1].capacity[memory].value"),
        "{err}"
    );
}
