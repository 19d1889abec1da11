//! Label selectors as policy objects carry them (`matchLabels`,
//! `matchExpressions`), evaluated against a pod's real labels. Read
//! defensively: a field of an unexpected shape, or an operator this does
//! not know, is an error — a selector that cannot be read is never taken to
//! select nothing.

use std::collections::BTreeMap;

use serde_json::Value;

/// Why a selector could not be evaluated.
pub type Unreadable = String;

/// Strips Cilium's label source prefixes (`k8s:`, `any:`).
fn plain_key(key: &str) -> &str {
    key.strip_prefix("k8s:")
        .or_else(|| key.strip_prefix("any:"))
        .unwrap_or(key)
}

/// Whether `selector` selects a pod with `labels` in `namespace`. `None`
/// or `{}` selects every pod. Cilium's namespace pseudo-label
/// (`io.kubernetes.pod.namespace`) is matched against `namespace`.
pub fn selects(
    selector: Option<&Value>,
    labels: &BTreeMap<String, String>,
    namespace: &str,
) -> Result<bool, Unreadable> {
    let Some(sel) = selector else { return Ok(true) };
    let Some(obj) = sel.as_object() else {
        return Err(format!("a selector that is not an object: {sel}"));
    };
    if let Some(k) = obj.keys().find(|k| *k != "matchLabels" && *k != "matchExpressions") {
        return Err(format!("a selector field this cannot read: {k}"));
    }
    let value_of = |key: &str| -> Option<String> {
        let key = plain_key(key);
        if key == "io.kubernetes.pod.namespace" {
            return Some(namespace.to_owned());
        }
        labels.get(key).cloned()
    };
    if let Some(ml) = obj.get("matchLabels") {
        let Some(ml) = ml.as_object() else {
            return Err(format!("matchLabels is not a map: {ml}"));
        };
        for (k, v) in ml {
            let Some(v) = v.as_str() else {
                return Err(format!("matchLabels[{k}] is not a string"));
            };
            if value_of(k).as_deref() != Some(v) {
                return Ok(false);
            }
        }
    }
    if let Some(me) = obj.get("matchExpressions") {
        let Some(me) = me.as_array() else {
            return Err(format!("matchExpressions is not a list: {me}"));
        };
        for e in me {
            let (Some(key), Some(op)) = (e["key"].as_str(), e["operator"].as_str()) else {
                return Err(format!("a match expression without key or operator: {e}"));
            };
            let values: Vec<&str> = match &e["values"] {
                Value::Null => Vec::new(),
                Value::Array(a) => a
                    .iter()
                    .map(|v| v.as_str().ok_or(format!("a non-string value in {e}")))
                    .collect::<Result<_, _>>()?,
                other => return Err(format!("values is not a list: {other}")),
            };
            let have = value_of(key);
            let ok = match op {
                "In" => have.as_deref().is_some_and(|h| values.contains(&h)),
                "NotIn" => have.as_deref().is_none_or(|h| !values.contains(&h)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                other => return Err(format!("an operator this cannot read: {other}")),
            };
            if !ok {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_match_labels_expressions_and_the_namespace() {
        let labels = BTreeMap::from([("app".to_owned(), "x".to_owned()), ("tier".to_owned(), "a".to_owned())]);
        let s = |v: Value| selects(Some(&v), &labels, "ns");
        assert_eq!(selects(None, &labels, "ns"), Ok(true));
        assert_eq!(s(json!({})), Ok(true));
        assert_eq!(s(json!({"matchLabels": {"app": "x"}})), Ok(true));
        assert_eq!(s(json!({"matchLabels": {"app": "y"}})), Ok(false));
        assert_eq!(
            s(json!({"matchLabels": {"k8s:app": "x", "k8s:io.kubernetes.pod.namespace": "ns"}})),
            Ok(true)
        );
        assert_eq!(
            s(json!({"matchLabels": {"k8s:io.kubernetes.pod.namespace": "other"}})),
            Ok(false)
        );
        assert_eq!(
            s(json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]})),
            Ok(true)
        );
        assert_eq!(
            s(json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]})),
            Ok(false)
        );
        assert_eq!(
            s(json!({"matchExpressions": [{"key": "gone", "operator": "DoesNotExist"}]})),
            Ok(true)
        );
        assert_eq!(
            s(json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]})),
            Ok(true)
        );
        assert!(s(json!({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]})).is_err());
        assert!(s(json!({"matchLabels": ["app"]})).is_err());
        assert!(s(json!({"matchFields": {}})).is_err());
    }
}
