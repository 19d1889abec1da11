//! The CRDs' `x-kubernetes-validations` rules (CEL), evaluated as the API
//! server does: each at its schema node, `self` the value there. A rule
//! that names `oldSelf` is a transition rule: checked only on an update,
//! and only where the old object has that node too. The agent-sandbox
//! CRDs carry one: a Sandbox's `volumeClaimTemplates` are immutable.

use cel::{Context, Program, Value as Cel};
use serde_json::Value;

use crate::schema::Violation;

/// Every rule `new` (an update of `old`, if given) breaks.
pub fn check(schema: &Value, new: &Value, old: Option<&Value>) -> Vec<Violation> {
    let mut out = Vec::new();
    walk(schema, Some(new), old, String::new(), &mut out);
    out
}

fn walk(s: &Value, new: Option<&Value>, old: Option<&Value>, path: String, out: &mut Vec<Violation>) {
    let Some(new) = new.filter(|v| !v.is_null()) else {
        return;
    };
    for rule in s["x-kubernetes-validations"].as_array().into_iter().flatten() {
        let expr = rule["rule"].as_str().unwrap_or_default();
        let transition = expr.contains("oldSelf");
        let old_here = old.filter(|v| !v.is_null());
        if transition && old_here.is_none() {
            continue;
        }
        let message = rule["message"]
            .as_str()
            .map_or_else(|| format!("failed rule: {expr}"), str::to_owned);
        let kind = match new {
            Value::Object(_) => "object",
            Value::Array(_) => "array",
            Value::String(_) => "string",
            _ => "value",
        };
        let broken = match eval(expr, new, old_here) {
            Ok(Cel::Bool(true)) => None,
            Ok(_) => Some(format!("Invalid value: {kind:?}: {message}")),
            Err(e) => Some(format!("Invalid value: {kind:?}: {message} (evaluation error: {e})")),
        };
        if let Some(problem) = broken {
            out.push(Violation {
                path: if path.is_empty() { ".".into() } else { path.clone() },
                problem,
            });
        }
    }
    for (k, sub) in s["properties"].as_object().into_iter().flatten() {
        walk(sub, new.get(k), old.and_then(|o| o.get(k)), format!("{path}.{k}"), out);
    }
    // List items carry no old value here: transition rules under them
    // would need the API server's list correlation, which no agent-sandbox
    // rule uses.
    if let (Some(items), Some(list)) = (s.get("items"), new.as_array()) {
        for (i, v) in list.iter().enumerate() {
            walk(items, Some(v), None, format!("{path}[{i}]"), out);
        }
    }
}

fn eval(expr: &str, this: &Value, old: Option<&Value>) -> Result<Cel, String> {
    let program = Program::compile(expr).map_err(|e| e.to_string())?;
    let mut ctx = Context::default();
    ctx.add_variable("self", cel::to_value(this).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    if let Some(o) = old {
        ctx.add_variable("oldSelf", cel::to_value(o).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    program.execute(&ctx).map_err(|e| e.to_string())
}
