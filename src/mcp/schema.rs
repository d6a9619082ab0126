//! Checks tool arguments against the subset of JSON Schema our tools declare (types, enums,
//! numeric bounds, string and array lengths, required, additionalProperties: false), so a
//! handler only ever sees arguments of the declared shape.

use crate::kind::Failed;
use serde_json::{Map, Value};

/// The schema as hosts with one type per field take it: every `"type": [A, B]` becomes
/// `"anyOf": [{"type": A}, {"type": B}]` (the same values, each branch one type), at every
/// depth. The tools write nullable results as `["integer", "null"]`; this is what they list.
pub fn portable(schema: Value) -> Value {
    match schema {
        Value::Object(mut m) => {
            if let Some(Value::Array(types)) = m.get("type").cloned() {
                m.remove("type");
                let branches: Vec<Value> = types
                    .into_iter()
                    .map(|t| serde_json::json!({ "type": t }))
                    .collect();
                m.insert("anyOf".into(), Value::Array(branches));
            }
            Value::Object(m.into_iter().map(|(k, v)| (k, portable(v))).collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(portable).collect()),
        other => other,
    }
}

/// Validates `args` against an object schema; the error names the offending parameter.
pub fn check_arguments(schema: &Value, args: &Map<String, Value>) -> Result<(), Failed> {
    let empty = Map::new();
    let props = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    for key in args.keys() {
        if !props.contains_key(key) {
            let valid: Vec<&str> = props.keys().map(String::as_str).collect();
            let list = if valid.is_empty() {
                "this tool takes no parameters".to_string()
            } else {
                format!("valid parameters: {}", valid.join(", "))
            };
            return Err(Failed::invalid(format!(
                "unknown parameter '{key}'; {list}"
            )));
        }
    }
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if !args.contains_key(name) {
                return Err(Failed::invalid(format!(
                    "missing required parameter '{name}'"
                )));
            }
        }
    }
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (key, value) in args {
        // An optional parameter given as null means absent (schemas declare one type per
        // field, and clients that fill every field with null are still served).
        if value.is_null() && !required.contains(&key.as_str()) {
            continue;
        }
        if let Some(prop) = props.get(key) {
            check_value(prop, value, key)?;
        }
    }
    Ok(())
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(want: &str, v: &Value) -> bool {
    let have = type_name(v);
    have == want || (want == "number" && have == "integer")
}

fn check_value(schema: &Value, value: &Value, path: &str) -> Result<(), Failed> {
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !types.is_empty() && !types.iter().any(|t| type_matches(t, value)) {
        return Err(Failed::invalid(format!(
            "parameter '{path}' must be {}, got {}",
            types.join(" or "),
            type_name(value)
        )));
    }
    if value.is_null() {
        return Ok(());
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        if !options.contains(value) {
            let names: Vec<String> = options.iter().map(|o| o.to_string()).collect();
            return Err(Failed::invalid(format!(
                "parameter '{path}' must be one of {}, got {value}",
                names.join(", ")
            )));
        }
    }
    if let Some(n) = value.as_f64() {
        if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
            if n < min {
                return Err(Failed::invalid(format!(
                    "parameter '{path}' must be at least {min}, got {n}"
                )));
            }
        }
        if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
            if n > max {
                return Err(Failed::invalid(format!(
                    "parameter '{path}' must be at most {max}, got {n}"
                )));
            }
        }
    }
    if let Some(s) = value.as_str() {
        let len = s.chars().count() as u64;
        if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
            if len > max {
                return Err(Failed::invalid(format!(
                    "parameter '{path}' is {len} characters long; the limit is {max}"
                )));
            }
        }
        if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
            if len < min {
                return Err(Failed::invalid(format!(
                    "parameter '{path}' must be at least {min} characters long"
                )));
            }
        }
    }
    if let Some(items) = value.as_array() {
        if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
            if items.len() as u64 > max {
                return Err(Failed::invalid(format!(
                    "parameter '{path}' has {} items; the limit is {max}",
                    items.len()
                )));
            }
        }
        if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
            if (items.len() as u64) < min {
                return Err(Failed::invalid(format!(
                    "parameter '{path}' needs at least {min} item(s)"
                )));
            }
        }
        if let Some(item_schema) = schema.get("items") {
            for (i, item) in items.iter().enumerate() {
                check_value(item_schema, item, &format!("{path}[{i}]"))?;
            }
        }
    }
    // A nested object (a mount, a region, a setup step) is checked as a whole call's are,
    // its members named by their path.
    if let (Some(members), Some(_)) = (value.as_object(), schema.get("properties")) {
        check_arguments(schema, members).map_err(|e| {
            Failed::invalid(e.msg.replace("parameter '", &format!("parameter '{path}.")))
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "n": {"type": "integer", "minimum": 1, "maximum": 10},
                "fmt": {"type": "string", "enum": ["raw", "qcow2"]},
                "list": {"type": "array", "items": {"type": "string"}},
                "opt": {"type": ["string", "null"]},
                "plain": {"type": "string"}
            },
            "required": ["path"],
            "additionalProperties": false
        })
    }

    fn check(args: Value) -> Result<(), String> {
        check_arguments(&schema(), args.as_object().unwrap()).map_err(|e| e.msg)
    }

    #[test]
    fn accepts_valid_arguments() {
        assert!(
            check(json!({"path": "/x", "n": 3, "fmt": "raw", "list": ["a"], "opt": null})).is_ok()
        );
    }

    #[test]
    fn type_unions_become_one_type_branches_at_every_depth() {
        let s = json!({"type": "object", "properties": {
            "pid": {"type": ["integer", "null"], "description": "d"},
            "list": {"type": "array", "items": {"type": ["string", "null"]}}
        }});
        let p = portable(s);
        assert_eq!(
            p["properties"]["pid"],
            json!({"anyOf": [{"type": "integer"}, {"type": "null"}], "description": "d"})
        );
        assert_eq!(
            p["properties"]["list"]["items"],
            json!({"anyOf": [{"type": "string"}, {"type": "null"}]})
        );
        assert_eq!(p["type"], json!("object"));
    }

    #[test]
    fn null_means_absent_for_an_optional_parameter_only() {
        assert!(check(json!({"path": "/x", "plain": null})).is_ok());
        assert!(check(json!({"path": null}))
            .unwrap_err()
            .contains("must be string"));
    }

    #[test]
    fn names_the_offending_parameter() {
        assert!(check(json!({})).unwrap_err().contains("'path'"));
        let e = check(json!({"path": "/x", "pth": 1})).unwrap_err();
        assert!(
            e.contains("'pth'") && e.contains("valid parameters: path, n"),
            "{e}"
        );
        assert!(check(json!({"path": 1}))
            .unwrap_err()
            .contains("must be string"));
        assert!(check(json!({"path": "/", "n": 11}))
            .unwrap_err()
            .contains("at most"));
        assert!(check(json!({"path": "/", "n": 1.5}))
            .unwrap_err()
            .contains("integer"));
        assert!(check(json!({"path": "/", "fmt": "vmdk"}))
            .unwrap_err()
            .contains("one of"));
        assert!(check(json!({"path": "/", "list": [1]}))
            .unwrap_err()
            .contains("list[0]"));
    }

    #[test]
    fn nested_objects_and_short_lists_are_named_by_their_path() {
        let schema = json!({"type": "object", "properties": {
            "region": {"type": "object", "properties": {
                "x": {"type": "integer", "minimum": 0}
            }, "required": ["x"], "additionalProperties": false},
            "keys": {"type": "array", "items": {"type": "string"}, "minItems": 1}
        }});
        let check = |v: Value| check_arguments(&schema, v.as_object().unwrap()).map_err(|e| e.msg);
        let e = check(json!({"region": {"x": -1}})).unwrap_err();
        assert!(e.contains("'region.x' must be at least 0"), "{e}");
        let e = check(json!({"region": {"x": 1, "y": 2}})).unwrap_err();
        assert!(e.contains("unknown parameter 'region.y'"), "{e}");
        let e = check(json!({"region": {}})).unwrap_err();
        assert!(e.contains("'region.x'"), "{e}");
        let e = check(json!({"keys": []})).unwrap_err();
        assert!(e.contains("'keys' needs at least 1"), "{e}");
        assert!(check(json!({"region": {"x": 0}, "keys": ["a"]})).is_ok());
    }
}
