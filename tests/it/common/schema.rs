//! Every tool result the harness reads is checked against that tool's declared `outputSchema`,
//! as the official TypeScript SDK client does (it refuses a result whose structuredContent does
//! not match). The schemas are the binary's own (`mcqemu tools --json`), read once per test
//! process. The checker knows the JSON Schema keywords the tools use and fails on any other, so
//! a new keyword cannot pass unchecked.

use std::collections::HashMap;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use super::server::BIN;

/// Each tool's output schema, by tool name (tools without one are absent).
fn schemas() -> Result<&'static HashMap<String, Value>, String> {
    static SCHEMAS: OnceLock<Result<HashMap<String, Value>, String>> = OnceLock::new();
    SCHEMAS
        .get_or_init(|| {
            let out = Command::new(BIN)
                .args(["tools", "--json"])
                .env_remove("MCQEMU_TOOLS_PAGE_SIZE")
                .output()
                .map_err(|e| format!("cannot run {BIN} tools --json: {e}"))?;
            if !out.status.success() {
                return Err(format!("{BIN} tools --json failed: {}", out.status));
            }
            let tools: Vec<Value> = serde_json::from_slice(&out.stdout)
                .map_err(|e| format!("{BIN} tools --json is not a JSON list: {e}"))?;
            Ok(tools
                .into_iter()
                .filter_map(|t| {
                    let name = t["name"].as_str()?.to_string();
                    let schema = t.get("outputSchema")?.clone();
                    Some((name, schema))
                })
                .collect())
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Checks one `tools/call` response of tool `tool`: a successful `CallToolResult` of a tool with
/// an output schema must carry `structuredContent` that matches it. Errors (JSON-RPC or
/// `isError`) are not checked.
pub fn check_call_response(tool: &str, resp: &Value) -> Result<(), String> {
    let Some(result) = resp.get("result") else {
        return Ok(());
    };
    if result["isError"] == Value::Bool(true) {
        return Ok(());
    }
    let Some(schema) = schemas()?.get(tool) else {
        return Ok(());
    };
    let Some(sc) = result.get("structuredContent") else {
        return Err(format!(
            "{tool} declares an outputSchema but its result has no structuredContent: {result}"
        ));
    };
    let mut problems = Vec::new();
    check(schema, sc, "data", &mut problems);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{tool}'s structuredContent does not match its outputSchema (the official SDK \
             client refuses it): {}; structuredContent: {sc}",
            problems.join("; ")
        ))
    }
}

/// Annotations: no effect on validity.
const ANNOTATIONS: &[&str] = &["description", "title", "default", "examples", "format"];

/// Checks `v` against `schema`, adding what is wrong (at `at`) to `problems`.
pub fn check(schema: &Value, v: &Value, at: &str, problems: &mut Vec<String>) {
    let obj = match schema {
        Value::Bool(true) => return,
        Value::Bool(false) => {
            problems.push(format!("{at}: no value is allowed here"));
            return;
        }
        Value::Object(o) => o,
        other => {
            problems.push(format!("{at}: the schema {other} is not a schema"));
            return;
        }
    };
    for (k, s) in obj {
        match k.as_str() {
            "type" => {
                let allowed: Vec<&str> = match s {
                    Value::String(t) => vec![t.as_str()],
                    Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                    _ => vec![],
                };
                if !allowed.iter().any(|t| is_type(v, t)) {
                    problems.push(format!("{at} must be {}, not {v}", allowed.join(" or ")));
                }
            }
            "properties" => {
                if let (Some(props), Some(o)) = (s.as_object(), v.as_object()) {
                    for (name, sub) in props {
                        if let Some(field) = o.get(name) {
                            check(sub, field, &format!("{at}/{name}"), problems);
                        }
                    }
                }
            }
            "additionalProperties" => {
                if let Some(o) = v.as_object() {
                    let known = obj.get("properties").and_then(Value::as_object);
                    for (name, field) in o {
                        if !known.is_some_and(|p| p.contains_key(name)) {
                            check(s, field, &format!("{at}/{name}"), problems);
                        }
                    }
                }
            }
            "required" => {
                if let Some(o) = v.as_object() {
                    for name in s.as_array().into_iter().flatten().filter_map(Value::as_str) {
                        if !o.contains_key(name) {
                            problems.push(format!("{at} must have required property {name:?}"));
                        }
                    }
                }
            }
            "items" => {
                if let Some(a) = v.as_array() {
                    for (i, item) in a.iter().enumerate() {
                        check(s, item, &format!("{at}/{i}"), problems);
                    }
                }
            }
            "anyOf" | "oneOf" => {
                let passing = s
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|sub| {
                        let mut p = Vec::new();
                        check(sub, v, at, &mut p);
                        p.is_empty()
                    })
                    .count();
                let ok = if k == "anyOf" {
                    passing >= 1
                } else {
                    passing == 1
                };
                if !ok {
                    problems.push(format!("{at} must match {k} ({passing} matched): {v}"));
                }
            }
            "allOf" => {
                for sub in s.as_array().into_iter().flatten() {
                    check(sub, v, at, problems);
                }
            }
            "enum" => {
                if !s.as_array().is_some_and(|e| e.contains(v)) {
                    problems.push(format!("{at} must be one of {s}, not {v}"));
                }
            }
            "const" => {
                if s != v {
                    problems.push(format!("{at} must be {s}, not {v}"));
                }
            }
            "minimum" | "maximum" => {
                if let (Some(bound), Some(n)) = (s.as_f64(), v.as_f64()) {
                    if (k == "minimum" && n < bound) || (k == "maximum" && n > bound) {
                        problems.push(format!("{at} must be {k} {bound}, not {n}"));
                    }
                }
            }
            "minLength" | "maxLength" | "minItems" | "maxItems" => {
                let len = match v {
                    Value::String(t) => Some(t.chars().count()),
                    Value::Array(a) => Some(a.len()),
                    _ => None,
                };
                if let (Some(bound), Some(len)) = (s.as_u64(), len) {
                    let bound = bound as usize;
                    if (k.starts_with("min") && len < bound)
                        || (k.starts_with("max") && len > bound)
                    {
                        problems.push(format!("{at} must have {k} {bound}, has {len}"));
                    }
                }
            }
            a if ANNOTATIONS.contains(&a) => {}
            other => problems.push(format!(
                "{at}: the harness's schema checker does not know the keyword {other:?}; teach \
                 it (tests/common/schema.rs) before a tool uses it"
            )),
        }
    }
}

/// Whether `v` is of JSON Schema type `t` (an integer is a number without a fraction).
fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    }
}
