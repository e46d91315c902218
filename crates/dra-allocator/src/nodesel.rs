//! Node selection of slices and devices (`NodeMatches` with component-helpers' nodeaffinity
//! semantics): terms are ORed, requirements inside a term ANDed, empty terms ignored.
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement};

use super::NodeInfo;

/// `NodeMatches`: a node name wins over `allNodes`, which wins over a selector.
pub(crate) fn node_matches(
    node: &NodeInfo,
    node_name: &str,
    all_nodes: bool,
    selector: Option<&NodeSelector>,
) -> Result<bool, String> {
    if !node_name.is_empty() {
        return Ok(node.name == node_name);
    }
    if all_nodes {
        return Ok(true);
    }
    match selector {
        Some(sel) => selector_matches(node, sel),
        None => Ok(false),
    }
}

/// Parses every term first (any parse error fails the whole selector), then matches.
pub fn selector_matches(node: &NodeInfo, selector: &NodeSelector) -> Result<bool, String> {
    let terms: Vec<_> = selector
        .node_selector_terms
        .iter()
        .filter(|t| {
            !(t.match_expressions.as_ref().is_none_or(Vec::is_empty)
                && t.match_fields.as_ref().is_none_or(Vec::is_empty))
        })
        .collect();
    let mut errors = Vec::new();
    for term in &terms {
        for r in term.match_expressions.iter().flatten() {
            if let Err(e) = check_label_requirement(r) {
                errors.push(e);
            }
        }
        for r in term.match_fields.iter().flatten() {
            if let Err(e) = check_field_requirement(r) {
                errors.push(e);
            }
        }
    }
    if !errors.is_empty() {
        return Err(format!(
            "failed to parse node selector: {}",
            errors.join(", ")
        ));
    }
    for term in terms {
        let labels_ok = term
            .match_expressions
            .iter()
            .flatten()
            .all(|r| label_requirement_matches(node, r));
        // Node fields are only `metadata.name`; a node without a name skips field checks.
        let fields_ok = node.name.is_empty()
            || term
                .match_fields
                .iter()
                .flatten()
                .all(|r| field_requirement_matches(node, r));
        if labels_ok && fields_ok {
            return Ok(true);
        }
    }
    Ok(false)
}

fn values(r: &NodeSelectorRequirement) -> &[String] {
    r.values.as_deref().unwrap_or(&[])
}

fn check_label_requirement(r: &NodeSelectorRequirement) -> Result<(), String> {
    let n = values(r).len();
    match r.operator.as_str() {
        "In" | "NotIn" if n == 0 => Err(format!(
            "values: Required value: for 'in', 'notin' operators, values set can't be empty (key {})",
            r.key
        )),
        "Exists" | "DoesNotExist" if n != 0 => Err(format!(
            "values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist' (key {})",
            r.key
        )),
        "Gt" | "Lt" if n != 1 || values(r)[0].parse::<i64>().is_err() => Err(format!(
            "values: Invalid value: for 'Gt', 'Lt' operators, exactly one integer value is required (key {})",
            r.key
        )),
        "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt" => Ok(()),
        other => Err(format!("operator: Unsupported value: {other:?}")),
    }
}

fn check_field_requirement(r: &NodeSelectorRequirement) -> Result<(), String> {
    match r.operator.as_str() {
        "In" | "NotIn" if values(r).len() == 1 => Ok(()),
        "In" | "NotIn" => Err(format!(
            "values: Invalid value: {:?}: must have one element",
            values(r)
        )),
        other => Err(format!("operator: Unsupported value: {other:?}")),
    }
}

fn label_requirement_matches(node: &NodeInfo, r: &NodeSelectorRequirement) -> bool {
    let label = node.labels.get(&r.key);
    let vals = values(r);
    match r.operator.as_str() {
        "In" => label.is_some_and(|v| vals.contains(v)),
        "NotIn" => label.is_none_or(|v| !vals.contains(v)),
        "Exists" => label.is_some(),
        "DoesNotExist" => label.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(want)) = (
                label.and_then(|v| v.parse::<i64>().ok()),
                vals.first().and_then(|v| v.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                have > want
            } else {
                have < want
            }
        }
        _ => false,
    }
}

fn field_requirement_matches(node: &NodeInfo, r: &NodeSelectorRequirement) -> bool {
    let have = if r.key == "metadata.name" {
        node.name.as_str()
    } else {
        ""
    };
    let want = values(r).first().map(String::as_str).unwrap_or("");
    match r.operator.as_str() {
        "In" => have == want,
        _ => have != want,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSelectorTerm;

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn node() -> NodeInfo {
        let mut n = NodeInfo::named("n1");
        n.labels.insert("zone".into(), "a".into());
        n.labels.insert("gpus".into(), "8".into());
        n
    }

    #[test]
    fn terms_are_ored_and_requirements_anded() {
        let sel = NodeSelector {
            node_selector_terms: vec![
                NodeSelectorTerm {
                    match_expressions: Some(vec![req("zone", "In", &["b"])]),
                    match_fields: None,
                },
                NodeSelectorTerm {
                    match_expressions: Some(vec![
                        req("zone", "In", &["a"]),
                        req("gpus", "Gt", &["4"]),
                    ]),
                    match_fields: Some(vec![req("metadata.name", "In", &["n1"])]),
                },
            ],
        };
        assert_eq!(selector_matches(&node(), &sel), Ok(true));
        let none = NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![req("zone", "NotIn", &["a"])]),
                match_fields: None,
            }],
        };
        assert_eq!(selector_matches(&node(), &none), Ok(false));
    }

    #[test]
    fn bad_operators_are_errors() {
        let sel = NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: None,
                match_fields: Some(vec![req("metadata.name", "Exists", &[])]),
            }],
        };
        assert!(selector_matches(&node(), &sel).is_err());
    }
}
