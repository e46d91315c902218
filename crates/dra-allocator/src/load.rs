//! Reading resource.k8s.io/v1 objects from files: YAML (several documents) or JSON, single
//! objects, `kind: List` with `items`, or JSON arrays; directories are read file by file.
use std::path::{Path, PathBuf};

use k8s_openapi::Resource;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde::de::DeserializeOwned;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {message}")]
    Read { path: PathBuf, message: String },
}

fn read_error(path: &Path, message: impl Into<String>) -> LoadError {
    LoadError::Read {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Files under `path` (itself if a file; `*.yaml`, `*.yml`, `*.json` by name if a directory).
fn files(path: &Path) -> Result<Vec<PathBuf>, LoadError> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| read_error(path, e.to_string()))?;
    let mut out = Vec::new();
    for entry in entries {
        let p = entry.map_err(|e| read_error(path, e.to_string()))?.path();
        let wanted = p
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
        if wanted && p.is_file() {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// Documents of a text, flattened: Lists and arrays become their items; nulls are dropped.
pub fn parse_documents(text: &str) -> Result<Vec<Value>, String> {
    let mut docs = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        let value: Value = serde::Deserialize::deserialize(document).map_err(|e| e.to_string())?;
        flatten(value, &mut docs);
    }
    Ok(docs)
}

fn flatten(value: Value, out: &mut Vec<Value>) {
    match value {
        Value::Null => {}
        Value::Array(items) => items.into_iter().for_each(|v| flatten(v, out)),
        Value::Object(ref map)
            if map
                .get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k.ends_with("List"))
                && map.contains_key("items") =>
        {
            if let Value::Object(mut map) = value
                && let Some(items) = map.remove("items")
            {
                flatten(items, out);
            }
        }
        other => out.push(other),
    }
}

/// Converts documents to `T`, rejecting other kinds (a missing kind/apiVersion is assumed).
pub fn objects<T: Resource + DeserializeOwned>(
    docs: Vec<Value>,
    origin: &Path,
) -> Result<Vec<T>, LoadError> {
    let mut out = Vec::new();
    for (i, mut doc) in docs.into_iter().enumerate() {
        let Value::Object(map) = &mut doc else {
            return Err(read_error(origin, format!("document {i} is not an object")));
        };
        let kind = map.get("kind").and_then(Value::as_str).unwrap_or(T::KIND);
        if kind != T::KIND {
            return Err(read_error(
                origin,
                format!("document {i}: expected a {}, found a {kind}", T::KIND),
            ));
        }
        map.insert("kind".into(), Value::from(T::KIND));
        map.entry("apiVersion")
            .or_insert_with(|| Value::from(T::API_VERSION));
        let object = serde_json::from_value(doc)
            .map_err(|e| read_error(origin, format!("document {i}: {e}")))?;
        out.push(object);
    }
    Ok(out)
}

/// Reads all objects of type `T` from files or directories, in argument order.
pub fn read<T: Resource + DeserializeOwned>(paths: &[PathBuf]) -> Result<Vec<T>, LoadError> {
    let mut out = Vec::new();
    for path in paths {
        for file in files(path)? {
            let text =
                std::fs::read_to_string(&file).map_err(|e| read_error(&file, e.to_string()))?;
            let docs = parse_documents(&text).map_err(|e| read_error(&file, e))?;
            out.extend(objects::<T>(docs, &file)?);
        }
    }
    Ok(out)
}

pub fn read_slices(paths: &[PathBuf]) -> Result<Vec<ResourceSlice>, LoadError> {
    read(paths)
}

pub fn read_classes(paths: &[PathBuf]) -> Result<Vec<DeviceClass>, LoadError> {
    read(paths)
}

pub fn read_claims(paths: &[PathBuf]) -> Result<Vec<ResourceClaim>, LoadError> {
    read(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_arrays_and_documents_flatten() {
        let text = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: resource.k8s.io/v1, kind: DeviceClass, metadata: {name: a}, spec: {}}
---
{"kind": "DeviceClass", "metadata": {"name": "b"}, "spec": {}}
---
[{"metadata": {"name": "c"}, "spec": {}}]
"#;
        let docs = parse_documents(text).unwrap();
        let classes: Vec<DeviceClass> = objects(docs, Path::new("t")).unwrap();
        let names: Vec<_> = classes
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    #[test]
    fn other_kinds_are_rejected() {
        let docs = parse_documents("kind: ResourceClaim\nmetadata: {name: x}\nspec: {}").unwrap();
        let err = objects::<DeviceClass>(docs, Path::new("f.yaml")).unwrap_err();
        assert!(err.to_string().contains("expected a DeviceClass"), "{err}");
    }
}
