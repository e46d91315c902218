//! Reading sources (files, directories, stdin) into documents: multi-document YAML, JSON
//! streams and `kind: List` items, each with where it came from.
use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{Doc, ManifestError, Origin};

/// Hands each document of `source` (a file, a directory: its `*.yaml`, `*.yml`, `*.json`, by
/// name, as `kubectl apply -f DIR`, or `-` for stdin) to `take`, one file at a time, so a
/// directory of many large files is never held whole.
pub fn for_each_document(
    source: &str,
    mut take: impl FnMut(Doc) -> Result<(), ManifestError>,
) -> Result<(), ManifestError> {
    for_each_text(source, |text, file| {
        for pending in parse_pending(text, file)? {
            take(pending.parse()?)?;
        }
        Ok(())
    })
}

/// Hands the text of each file of `source`, as [`for_each_document`] reads them, to `take`.
pub(super) fn for_each_text(
    source: &str,
    mut take: impl FnMut(&str, &str) -> Result<(), ManifestError>,
) -> Result<(), ManifestError> {
    let read_error = |file: &Path, e: std::io::Error| ManifestError::Read {
        file: file.display().to_string(),
        message: e.to_string(),
    };
    if source == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| read_error(Path::new("-"), e))?;
        return take(&text, "-");
    }
    let path = PathBuf::from(source);
    let mut files = Vec::new();
    if path.is_dir() {
        for entry in std::fs::read_dir(&path).map_err(|e| read_error(&path, e))? {
            let p = entry.map_err(|e| read_error(&path, e))?.path();
            let wanted = p
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
            if wanted && p.is_file() {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path);
    }
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| read_error(&file, e))?;
        take(&text, &file.display().to_string())?;
    }
    Ok(())
}

pub fn parse_text(text: &str, file: &str) -> Result<Vec<Doc>, ManifestError> {
    parse_pending(text, file)?
        .into_iter()
        .map(PendingDoc::parse)
        .collect()
}

/// A document read but not yet parsed. A JSON List's items stay text until taken: a fleet's
/// slices are never all parsed trees at once (that took gigabytes at 1,000 nodes), and
/// several threads can parse them.
pub(super) struct PendingDoc<'t> {
    pub(super) body: Pending<'t>,
    pub(super) origin: Origin,
}

pub(super) enum Pending<'t> {
    Parsed(Value),
    Text(&'t RawValue),
}

impl PendingDoc<'_> {
    pub(super) fn parse(self) -> Result<Doc, ManifestError> {
        let value = match self.body {
            Pending::Parsed(value) => value,
            // Already read once as JSON: only the depth limit could stop it here.
            Pending::Text(raw) => {
                serde_json::from_str(raw.get()).map_err(|e| ManifestError::Document {
                    origin: self.origin.clone(),
                    message: e.to_string(),
                })?
            }
        };
        Ok(Doc {
            value,
            origin: self.origin,
        })
    }
}

/// A v1 ResourceSlice straight from its JSON text, or `None` where the general path (a `Value`,
/// then [`convert::to_v1`](super::convert::to_v1)) must read it: that path fills in what Go
/// reads as zero values (a null list item, an omitted counter value) and names an unknown
/// field, and each of those fails to decode here (k8s-openapi also refuses another kind or
/// apiVersion). What decodes here with no field left unread is what that path decodes.
pub(super) fn slice_from_text(raw: &RawValue) -> Option<ResourceSlice> {
    let mut unknown = false;
    let mut decoder = serde_json::Deserializer::from_str(raw.get());
    let slice: ResourceSlice = serde_ignored::deserialize(&mut decoder, |_| unknown = true).ok()?;
    // k8s-openapi reads an omitted or null `value` as "", where the general path fills in 0.
    let spec = &slice.spec;
    let counters = spec
        .shared_counters
        .iter()
        .flatten()
        .flat_map(|set| set.counters.values())
        .chain(
            spec.devices
                .iter()
                .flatten()
                .flat_map(|d| d.consumes_counters.iter().flatten())
                .flat_map(|c| c.counters.values()),
        )
        .map(|counter| &counter.value);
    let capacities = spec
        .devices
        .iter()
        .flatten()
        .flat_map(|d| d.capacity.iter().flatten())
        .map(|(_, capacity)| &capacity.value);
    let omitted = counters.chain(capacities).any(|q| q.0.is_empty());
    (!unknown && !omitted).then_some(slice)
}

/// A top-level document of a file: a JSON List's items, other JSON as text, YAML parsed.
enum Top<'t> {
    List(Vec<&'t RawValue>),
    Text(&'t RawValue),
    Parsed(Value),
}

/// What says whether a JSON document is a List, its items left as text.
#[derive(serde::Deserialize)]
struct ListPeek<'t> {
    #[serde(borrow, default)]
    kind: Option<std::borrow::Cow<'t, str>>,
    #[serde(borrow, default)]
    items: Option<Vec<&'t RawValue>>,
}

/// The items of a JSON List (`kind` ending in `List`, `items` a list), as text; `None` for any
/// other document, which is then parsed whole (and a malformed List refused as before).
fn list_items_of(text: &str) -> Option<Vec<&RawValue>> {
    match serde_json::from_str::<ListPeek<'_>>(text) {
        Ok(ListPeek {
            kind: Some(kind),
            items: Some(items),
        }) if kind.ends_with("List") => Some(items),
        _ => None,
    }
}

pub(super) fn parse_pending<'t>(
    text: &'t str,
    file: &str,
) -> Result<Vec<PendingDoc<'t>>, ManifestError> {
    let file: Arc<str> = Arc::from(file);
    let parse_error = |document: usize, e: &dyn fmt::Display| ManifestError::Read {
        file: file.to_string(),
        message: format!("document {document}: {e}"),
    };
    let mut tops = Vec::new();
    let trimmed = text.trim_start();
    let whole_list = trimmed
        .starts_with('{')
        .then(|| list_items_of(text))
        .flatten();
    if let Some(items) = whole_list {
        // One List, as `kubectl get -o json` writes a fleet's slices: its items found in one
        // pass over the text.
        tops.push(Top::List(items));
    } else if trimmed.starts_with('{') || trimmed.starts_with('[') {
        for (i, raw) in serde_json::Deserializer::from_str(text)
            .into_iter::<&RawValue>()
            .enumerate()
        {
            tops.push(Top::Text(raw.map_err(|e| parse_error(i + 1, &e))?));
        }
    } else {
        for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let value: Value =
                serde::Deserialize::deserialize(document).map_err(|e| parse_error(i + 1, &e))?;
            tops.push(Top::Parsed(value));
        }
    }
    let mut docs = Vec::new();
    for (i, top) in tops.into_iter().enumerate() {
        let origin = Origin {
            file: file.clone(),
            document: i + 1,
            item: None,
        };
        // A JSON List's items are kept as text, unparsed.
        let push_items = |docs: &mut Vec<PendingDoc<'t>>, items: Vec<&'t RawValue>| {
            for (n, item) in items.into_iter().enumerate() {
                if item.get().trim() == "null" {
                    continue;
                }
                docs.push(PendingDoc {
                    body: Pending::Text(item),
                    origin: Origin {
                        item: Some(n + 1),
                        ..origin.clone()
                    },
                });
            }
        };
        let value = match top {
            Top::List(items) => {
                push_items(&mut docs, items);
                continue;
            }
            Top::Text(raw) => {
                if let Some(items) = list_items_of(raw.get()) {
                    push_items(&mut docs, items);
                    continue;
                }
                serde_json::from_str(raw.get()).map_err(|e| parse_error(i + 1, &e))?
            }
            Top::Parsed(value) => value,
        };
        let items = match value {
            Value::Null => continue,
            Value::Array(items) => items,
            Value::Object(mut map) if is_list(&map) => match map.remove("items") {
                Some(Value::Array(items)) => items,
                Some(Value::Null) | None => Vec::new(),
                Some(_) => {
                    return Err(ManifestError::Document {
                        origin,
                        message: "items: must be a list".into(),
                    });
                }
            },
            other => {
                docs.push(PendingDoc {
                    body: Pending::Parsed(other),
                    origin,
                });
                continue;
            }
        };
        for (n, item) in items.into_iter().enumerate() {
            if item.is_null() {
                continue;
            }
            docs.push(PendingDoc {
                body: Pending::Parsed(item),
                origin: Origin {
                    item: Some(n + 1),
                    ..origin.clone()
                },
            });
        }
    }
    Ok(docs)
}

pub(super) fn is_list(map: &Map<String, Value>) -> bool {
    map.contains_key("items")
        && map
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| k.ends_with("List"))
}
