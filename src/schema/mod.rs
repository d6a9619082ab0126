//! JSON Schemas made from the Rust types they describe, so that a tool's declared
//! `outputSchema` and what its result serializes cannot disagree: a result struct is written
//! inside [`described!`], which keeps the struct as it is and adds its schema (each field's
//! from its type, its doc comment as the description; serde's `flatten`, `rename`, `skip` and
//! `skip_serializing_if` read as serde reads them). A described struct's schema closes it
//! (`additionalProperties: false`): a field added to the struct is in the schema by
//! construction, and one serialized without being declared fails every client that checks.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

mod input;
pub use input::{fill_field, merged, Param};

/// A type whose JSON form has a schema.
pub trait Schema {
    /// The JSON Schema of this type's serialized form.
    fn schema() -> Value;
}

macro_rules! leaf {
    ($t:literal: $($ty:ty),*) => {$(
        impl Schema for $ty {
            fn schema() -> Value {
                json!({"type": $t})
            }
        }
    )*};
}

leaf!("string": String, &str, std::path::PathBuf, std::net::Ipv4Addr);
leaf!("integer": u8, u16, u32, u64, usize, i32, i64);
leaf!("number": f32, f64);
leaf!("boolean": bool);

/// A value passed through as it came (qemu-img's JSON, cloud-init's report, an agent's OS
/// info): any JSON, each type named (clients that check schemas want a type on every one).
impl Schema for Value {
    fn schema() -> Value {
        json!({"type": ["object", "array", "string", "number", "boolean", "null"]})
    }
}

impl Schema for Map<String, Value> {
    fn schema() -> Value {
        json!({"type": "object"})
    }
}

impl<T: Schema> Schema for Option<T> {
    fn schema() -> Value {
        nullable(T::schema())
    }
}

impl<T: Schema> Schema for Vec<T> {
    fn schema() -> Value {
        json!({"type": "array", "items": T::schema()})
    }
}

impl<T: Schema, const N: usize> Schema for [T; N] {
    fn schema() -> Value {
        json!({"type": "array", "items": T::schema(), "minItems": N, "maxItems": N})
    }
}

impl<T: Schema> Schema for BTreeMap<String, T> {
    fn schema() -> Value {
        json!({"type": "object", "additionalProperties": T::schema()})
    }
}

/// An object that is one of `variants` (each an object schema): an untagged enum's.
pub fn any_of(variants: Vec<Value>) -> Value {
    json!({"type": "object", "anyOf": variants})
}

/// `schema` that also allows `null`.
pub fn nullable(mut schema: Value) -> Value {
    match schema.get("type").cloned() {
        Some(Value::String(t)) => schema["type"] = json!([t, "null"]),
        Some(Value::Array(mut ts)) => {
            if !ts.contains(&json!("null")) {
                ts.push(json!("null"));
            }
            schema["type"] = Value::Array(ts);
        }
        // No type named (any value): null is already allowed.
        _ => {}
    }
    schema
}

/// `schema` without the `null` that [`nullable`] added.
fn not_null(mut schema: Value) -> Value {
    if let Some(Value::Array(ts)) = schema.get("type").cloned() {
        let left: Vec<Value> = ts.into_iter().filter(|t| t != "null").collect();
        schema["type"] = match left.as_slice() {
            [one] => one.clone(),
            _ => Value::Array(left),
        };
    }
    schema
}

/// A struct's schema as [`described!`] builds it, a field at a time.
#[derive(Default)]
pub struct Object {
    properties: Map<String, Value>,
    required: Vec<String>,
    open: bool,
    /// The parameters the parser fills in when left out: each non-`Option` field's schema
    /// default.
    defaults: Map<String, Value>,
}

/// What serde and the doc comment say of one field (its attributes, as written).
struct Attrs {
    doc: Vec<String>,
    flatten: bool,
    skipped: bool,
    optional: bool,
    /// Left out when `None`: never serialized as `null`.
    absent_when_none: bool,
    rename: Option<String>,
    /// `#[serde(default)]`: a parameter that may be left out.
    default: bool,
}

impl Attrs {
    fn read(attrs: &[&str]) -> Attrs {
        let mut a = Attrs {
            doc: Vec::new(),
            flatten: false,
            skipped: false,
            optional: false,
            absent_when_none: false,
            rename: None,
            default: false,
        };
        for raw in attrs {
            let t = raw.trim();
            if let Some(rest) = t.strip_prefix("doc") {
                if let Some(text) = literal(rest.trim_start().trim_start_matches('=')) {
                    a.doc.push(text.trim().to_string());
                }
            } else if let Some(inner) = t.strip_prefix("serde") {
                let inner = inner.trim().trim_start_matches('(').trim_end_matches(')');
                for part in split_top(inner) {
                    let part = part.trim();
                    let key = part.split('=').next().unwrap_or("").trim();
                    match key {
                        "flatten" => a.flatten = true,
                        "skip" | "skip_serializing" => a.skipped = true,
                        "skip_serializing_if" => {
                            a.optional = true;
                            a.absent_when_none = part.contains("Option::is_none");
                        }
                        "rename" => a.rename = part.split_once('=').and_then(|(_, v)| literal(v)),
                        "default" => a.default = true,
                        _ => {}
                    }
                }
            }
        }
        a
    }
}

/// The text of a string literal as `stringify!` shows it: `" text"` (unescaped) or a raw
/// `r" text"`, `r#" text"#` (a doc comment's form).
fn literal(s: &str) -> Option<String> {
    let s = s.trim();
    if let Some(raw) = s.strip_prefix('r') {
        let hashes = raw.len() - raw.trim_start_matches('#').len();
        let fence = "#".repeat(hashes);
        let body = raw
            .strip_prefix(fence.as_str())?
            .strip_prefix('"')?
            .strip_suffix(fence.as_str())?
            .strip_suffix('"')?;
        return Some(body.to_string());
    }
    let body = s.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::new();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push(' '),
                Some(other) => out.push(other),
                None => {}
            }
        } else {
            out.push(c);
        }
    }
    Some(out)
}

/// `a, b = "x, y", c` split at its top-level commas.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

impl Object {
    /// Adds field `name` of schema `schema`, with its attributes as written.
    pub fn field(&mut self, name: &str, attrs: &[&str], schema: fn() -> Value) {
        let a = Attrs::read(attrs);
        if a.skipped {
            return;
        }
        let mut s = schema();
        if a.flatten {
            self.flatten(s);
            return;
        }
        if a.absent_when_none {
            s = not_null(s);
        }
        let name = a.rename.unwrap_or_else(|| name.to_string());
        if !a.doc.is_empty() {
            if let Some(o) = s.as_object_mut() {
                o.insert("description".into(), json!(a.doc.join(" ")));
            }
        }
        if !a.optional {
            self.required.push(name.clone());
        }
        self.properties.insert(name, s);
    }

    /// Takes in a flattened struct's (or map's) properties.
    fn flatten(&mut self, s: Value) {
        if let Some(props) = s.get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                self.properties.insert(k.clone(), v.clone());
            }
            for r in s["required"].as_array().into_iter().flatten() {
                if let Some(r) = r.as_str() {
                    self.required.push(r.to_string());
                }
            }
        }
        // A flattened map (or an open struct) lets any other name through.
        if s.get("properties").is_none() || s["additionalProperties"] != json!(false) {
            self.open = true;
        }
    }

    /// The struct's schema.
    pub fn finish(self) -> Value {
        let mut o = json!({"type": "object", "properties": self.properties});
        if !self.required.is_empty() {
            o["required"] = json!(self.required);
        }
        if !self.open {
            o["additionalProperties"] = json!(false);
        }
        o
    }
}

/// Declares a struct as written and its [`Schema`], from its fields' types, doc comments and
/// serde attributes (see the module doc). Generic structs are not supported.
#[macro_export]
macro_rules! described {
    (
        $(#[$sm:meta])*
        $vis:vis struct $name:ident {
            $($(#[$fm:meta])* $fvis:vis $field:ident: $ty:ty),* $(,)?
        }
    ) => {
        $(#[$sm])*
        $vis struct $name {
            $($(#[$fm])* $fvis $field: $ty,)*
        }

        impl $crate::schema::Schema for $name {
            fn schema() -> serde_json::Value {
                let mut o = $crate::schema::Object::default();
                $(o.field(
                    stringify!($field),
                    &[$(stringify!($fm)),*],
                    <$ty as $crate::schema::Schema>::schema,
                );)*
                o.finish()
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::described! {
        /// A nested part.
        #[derive(serde::Serialize, Default)]
        pub struct Inner {
            /// How many.
            pub n: u64,
            /// Only when known.
            #[serde(skip_serializing_if = "Option::is_none")]
            pub note: Option<String>,
        }
    }

    crate::described! {
        /// The whole.
        #[derive(serde::Serialize, Default)]
        pub struct Outer {
            /// A "quoted" name, with a comma.
            pub name: String,
            #[serde(flatten)]
            pub inner: Inner,
            /// Renamed.
            #[serde(rename = "type")]
            pub kind: Vec<String>,
            #[serde(skip)]
            pub _hidden: bool,
            /// Maybe.
            pub pid: Option<i32>,
        }
    }

    #[test]
    fn a_struct_s_schema_is_what_serde_writes() {
        let s = Outer::schema();
        assert_eq!(
            s["properties"]["name"],
            json!({"type": "string", "description": "A \"quoted\" name, with a comma."})
        );
        assert_eq!(s["properties"]["n"]["type"], json!("integer"));
        assert_eq!(s["properties"]["type"]["items"], json!({"type": "string"}));
        assert_eq!(s["properties"]["pid"]["type"], json!(["integer", "null"]));
        assert_eq!(
            s["properties"]["note"]["type"],
            json!("string"),
            "absent, never null"
        );
        assert!(s["properties"].get("_hidden").is_none());
        assert!(s["properties"].get("inner").is_none());
        assert_eq!(s["required"], json!(["name", "n", "type", "pid"]));
        assert_eq!(s["additionalProperties"], json!(false));
        // Every field serde writes is declared, and nothing else.
        let v = serde_json::to_value(Outer::default()).unwrap();
        let declared: Vec<&String> = s["properties"].as_object().unwrap().keys().collect();
        for k in v.as_object().unwrap().keys() {
            assert!(declared.contains(&k), "{k} is not declared");
        }
    }
}
