//! A structural OpenAPI v3 schema check: what the API server applies to a
//! custom resource before storing it, plus what `kubectl --validate=strict`
//! adds (an unknown field is an error, not silently pruned). Used to prove
//! every object the backend builds is one the agent-sandbox CRDs accept,
//! and by the control-plane simulator to refuse what a real API server
//! would.
//!
//! Covers: `type`, `properties` (unknown fields refused unless
//! `x-kubernetes-preserve-unknown-fields` or an `additionalProperties`
//! schema), `required`, `items`, `enum`, `nullable`, `anyOf`,
//! `x-kubernetes-int-or-string`, integer `format` ranges, `minimum`,
//! `maximum`, `minLength`, `maxLength`, `pattern`, and `date-time`.

use serde_json::Value;

/// One way an object breaks its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// JSON path from the object's root, like `.spec.warmPoolRef.name`.
    pub path: String,
    pub problem: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}",
            if self.path.is_empty() { "." } else { &self.path },
            self.problem
        )
    }
}

/// The `openAPIV3Schema` of `version` in a CustomResourceDefinition.
pub fn crd_schema<'a>(crd: &'a Value, version: &str) -> Option<&'a Value> {
    crd.get("spec")?
        .get("versions")?
        .as_array()?
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(version))?
        .get("schema")?
        .get("openAPIV3Schema")
}

/// Every violation of `schema` by `value`; empty when it conforms.
pub fn validate(schema: &Value, value: &Value) -> Vec<Violation> {
    let mut out = Vec::new();
    check(schema, value, String::new(), &mut out);
    out
}

fn flag(s: &Value, key: &str) -> bool {
    s.get(key).and_then(Value::as_bool) == Some(true)
}

fn check(s: &Value, v: &Value, path: String, out: &mut Vec<Violation>) {
    let mut bad = |problem: String| {
        out.push(Violation {
            path: path.clone(),
            problem,
        })
    };
    if v.is_null() {
        if !flag(s, "nullable") {
            bad("null is not allowed here".into());
        }
        return;
    }
    if flag(s, "x-kubernetes-int-or-string") {
        if !(v.is_i64() || v.is_u64() || v.is_string()) {
            bad(format!("expected an integer or a string, got {v}"));
        }
        return;
    }
    if let Some(options) = s.get("anyOf").and_then(Value::as_array) {
        let fits = options.iter().any(|o| validate(o, v).is_empty());
        if !fits {
            bad(format!("matches none of anyOf: {v}"));
            return;
        }
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array) {
        if !allowed.contains(v) {
            bad(format!("{v} is not one of {}", Value::Array(allowed.clone())));
        }
    }
    match s.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Some(map) = v.as_object() else {
                return bad(format!("expected an object, got {v}"));
            };
            for r in s.get("required").and_then(Value::as_array).into_iter().flatten() {
                if let Some(r) = r.as_str() {
                    if !map.contains_key(r) {
                        out.push(Violation {
                            path: path.clone(),
                            problem: format!("required field {r:?} is missing"),
                        });
                    }
                }
            }
            let props = s.get("properties").and_then(Value::as_object);
            let extra = s.get("additionalProperties").filter(|a| a.is_object());
            let open = flag(s, "x-kubernetes-preserve-unknown-fields") || (props.is_none() && extra.is_none());
            for (k, sub) in map {
                let p = format!("{path}.{k}");
                match (props.and_then(|ps| ps.get(k)), extra) {
                    (Some(ps), _) => check(ps, sub, p, out),
                    (None, Some(a)) => check(a, sub, p, out),
                    (None, None) if open => {}
                    (None, None) => out.push(Violation {
                        path: p,
                        problem: "unknown field".into(),
                    }),
                }
            }
        }
        Some("array") => {
            let Some(items) = v.as_array() else {
                return bad(format!("expected an array, got {v}"));
            };
            if let Some(is) = s.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(is, item, format!("{path}[{i}]"), out);
                }
            }
        }
        Some("string") => {
            let Some(text) = v.as_str() else {
                return bad(format!("expected a string, got {v}"));
            };
            let len = text.chars().count() as u64;
            if s.get("maxLength").and_then(Value::as_u64).is_some_and(|m| len > m) {
                bad(format!("longer than maxLength {}", s["maxLength"]));
            }
            if s.get("minLength").and_then(Value::as_u64).is_some_and(|m| len < m) {
                bad(format!("shorter than minLength {}", s["minLength"]));
            }
            if let Some(p) = s.get("pattern").and_then(Value::as_str) {
                match regex::Regex::new(p) {
                    Ok(re) if !re.is_match(text) => bad(format!("{text:?} does not match {p:?}")),
                    Ok(_) => {}
                    Err(e) => bad(format!("the schema's pattern {p:?} does not compile: {e}")),
                }
            }
            if s.get("format").and_then(Value::as_str) == Some("date-time") && !is_rfc3339(text) {
                bad(format!("{text:?} is not an RFC 3339 date-time"));
            }
        }
        Some("integer") => {
            let Some(n) = v.as_i64() else {
                return bad(format!("expected an integer, got {v}"));
            };
            let range = match s.get("format").and_then(Value::as_str) {
                Some("int32") => Some((i64::from(i32::MIN), i64::from(i32::MAX))),
                _ => None,
            };
            if range.is_some_and(|(lo, hi)| n < lo || n > hi) {
                bad(format!("{n} does not fit int32"));
            }
            if s.get("minimum").and_then(Value::as_i64).is_some_and(|m| n < m) {
                bad(format!("{n} is below the minimum {}", s["minimum"]));
            }
            if s.get("maximum").and_then(Value::as_i64).is_some_and(|m| n > m) {
                bad(format!("{n} is above the maximum {}", s["maximum"]));
            }
        }
        Some("number") if !v.is_number() => bad(format!("expected a number, got {v}")),
        Some("boolean") if !v.is_boolean() => bad(format!("expected a boolean, got {v}")),
        _ => {}
    }
}

/// `2026-01-02T03:04:05Z`, with optional fraction and offset.
fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let shape = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && matches!(b[10], b'T' | b't')
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !shape {
        return false;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return false;
        }
        rest = &frac[n..];
    }
    rest == "Z" || rest == "z" || {
        let r = rest.as_bytes();
        r.len() == 6
            && matches!(r[0], b'+' | b'-')
            && r[1..3].iter().all(u8::is_ascii_digit)
            && r[3] == b':'
            && r[4..].iter().all(u8::is_ascii_digit)
    }
}

/// Fills in what the schema defaults, as the API server does on every
/// write: a property the object lacks takes its `default`, recursively
/// through present objects and array items (so a claim's
/// `lifecycle.shutdownPolicy` becomes `Retain` and a pool's `replicas` 1).
pub fn apply_defaults(s: &Value, v: &mut Value) {
    if let (Some(props), Some(obj)) = (s.get("properties").and_then(Value::as_object), v.as_object_mut()) {
        for (k, ps) in props {
            match obj.get_mut(k) {
                Some(child) if !child.is_null() => apply_defaults(ps, child),
                _ => {
                    if let Some(d) = ps.get("default") {
                        let mut d = d.clone();
                        apply_defaults(ps, &mut d);
                        obj.insert(k.clone(), d);
                    }
                }
            }
        }
    }
    if let (Some(items), Some(arr)) = (s.get("items"), v.as_array_mut()) {
        for child in arr {
            apply_defaults(items, child);
        }
    }
}

/// Why `name` is not a DNS subdomain (RFC 1123: at most 253 characters,
/// lowercase alphanumerics, `-` and `.`, alphanumeric at both ends), the
/// rule for the name of every object the simulator stores.
pub fn dns_subdomain(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    (!ok).then(|| {
        format!("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (at most 253 characters); got {name:?}")
    })
}

/// Why `name` is not a DNS label (RFC 1035: at most 63 characters,
/// lowercase alphanumerics and `-`, a letter first): the rule for a
/// Service's name.
pub fn dns_label(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && !name.ends_with('-');
    (!ok).then(|| format!("a DNS-1035 label must be at most 63 lowercase alphanumerics or '-', start with a letter and end with an alphanumeric; got {name:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_checks_refuse_what_they_name() {
        let schema = json!({
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "maxLength": 5, "pattern": "^[a-z]+$"},
                        "mode": {"type": "string", "enum": ["A", "B"]},
                        "n": {"type": "integer", "format": "int32", "minimum": 0},
                        "when": {"type": "string", "format": "date-time"},
                        "q": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {}}
                    }
                }
            }
        });
        let ok = json!({"spec": {"name": "abc", "mode": "A", "n": 3, "when": "2026-11-29T13:00:00Z", "q": "1Gi",
                         "labels": {"a": "b"}, "free": {"anything": [1]}}});
        assert_eq!(validate(&schema, &ok), vec![]);
        let bad = json!({"spec": {"name": "ABCDEFG", "mode": "C", "n": -1, "when": "yesterday", "q": 1.5,
                          "labels": {"a": 1}, "typo": true}});
        let got: Vec<String> = validate(&schema, &bad).iter().map(ToString::to_string).collect();
        for want in [
            ".spec.name: longer than maxLength",
            ".spec.name: \"ABCDEFG\" does not match",
            ".spec.mode: \"C\" is not one of",
            ".spec.n: -1 is below the minimum",
            ".spec.when: \"yesterday\" is not an RFC 3339",
            ".spec.q: expected an integer or a string",
            ".spec.labels.a: expected a string",
            ".spec.typo: unknown field",
        ] {
            assert!(got.iter().any(|g| g.starts_with(want)), "missing {want:?} in {got:#?}");
        }
        assert_eq!(got.len(), 8, "{got:#?}");
        let missing = validate(&schema, &json!({"spec": {}}));
        assert_eq!(missing[0].to_string(), ".spec: required field \"name\" is missing");
        assert_eq!(
            validate(&schema, &json!({}))[0].to_string(),
            ".: required field \"spec\" is missing"
        );
    }

    #[test]
    fn date_times_are_rfc3339() {
        for ok in [
            "2026-11-29T13:00:00Z",
            "2026-11-29T13:00:00.123Z",
            "2026-11-29T13:00:00+02:00",
        ] {
            assert!(is_rfc3339(ok), "{ok}");
        }
        for no in [
            "2026-11-29",
            "2026-11-29 13:00:00Z",
            "2026-11-29T13:00:00",
            "2026-11-29T13:00:00.Z",
        ] {
            assert!(!is_rfc3339(no), "{no}");
        }
    }
}
