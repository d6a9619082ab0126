//! Tool parameters: a request struct written inside [`params!`](crate::params) is parsed by
//! serde and declares its own inputSchema, so the two cannot disagree. A field's schema is its
//! type's, merged with what is written beside it (`= {"minimum": 1, "default": 50}`): bounds,
//! defaults, patterns and enums sit on the field they govern. A field may be left out when its
//! type is an `Option`, when it has a `default` there, or when serde fills it in; the
//! defaults written in the schema are the ones the parser uses (`Args::parse` fills them in).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::{Attrs, Object};

/// A type a tool takes as a parameter.
pub trait Param {
    /// Its schema inside an inputSchema.
    fn param() -> Value;
    /// Whether the parameter may be left out (an `Option`).
    const OPTIONAL: bool = false;
    /// For a request struct: what the parser fills in for parameters left out (the schema's
    /// default of each field that is not an `Option`; an `Option`'s default is the
    /// operation's, stated for the agent, and left to the operation).
    fn defaults() -> Map<String, Value> {
        Map::new()
    }
    /// Fills [`Param::defaults`] into `v`, and into every request struct nested in it (a setup
    /// step's, a mount's), before it is parsed.
    fn fill(_v: &mut Value) {}
}

macro_rules! leaf {
    ($t:literal: $($ty:ty),*) => {$(
        impl Param for $ty {
            fn param() -> Value {
                json!({"type": $t})
            }
        }
    )*};
}

leaf!("string": String, std::path::PathBuf);
leaf!("integer": u8, u16, u32, u64, usize, i32, i64);
leaf!("number": f32, f64);
leaf!("boolean": bool);

/// A JSON object passed through (a cloud-init seed): any members.
impl Param for Map<String, Value> {
    fn param() -> Value {
        json!({"type": "object"})
    }
}

impl<T: Param> Param for Option<T> {
    fn param() -> Value {
        T::param()
    }
    const OPTIONAL: bool = true;
    fn fill(v: &mut Value) {
        T::fill(v)
    }
}

impl<T: Param> Param for Vec<T> {
    fn param() -> Value {
        json!({"type": "array", "items": T::param()})
    }
    fn fill(v: &mut Value) {
        for item in v.as_array_mut().into_iter().flatten() {
            T::fill(item);
        }
    }
}

impl<T: Param> Param for BTreeMap<String, T> {
    fn param() -> Value {
        json!({"type": "object", "additionalProperties": T::param()})
    }
}

/// `extra`'s members written over `base`'s, object members merged the same way at every depth:
/// what is written beside a field refines its type's schema (`{"items": {"minLength": 1}}`
/// keeps the items' type).
pub fn merged(base: Value, extra: Option<Value>) -> Value {
    match (base, extra) {
        (Value::Object(mut b), Some(Value::Object(e))) => {
            for (k, v) in e {
                let v = match (b.remove(&k), v) {
                    (Some(old @ Value::Object(_)), new @ Value::Object(_)) => {
                        merged(old, Some(new))
                    }
                    (_, new) => new,
                };
                b.insert(k, v);
            }
            Value::Object(b)
        }
        (base, _) => base,
    }
}

impl Object {
    /// Adds parameter `name`: its type's schema `schema` refined by `extra`, with its
    /// attributes as written; required unless it may be left out.
    pub fn param(
        &mut self,
        name: &str,
        attrs: &[&str],
        schema: Value,
        optional: bool,
        extra: Option<Value>,
        defaults: Map<String, Value>,
    ) {
        let a = Attrs::read(attrs);
        if a.skipped {
            return;
        }
        if a.flatten {
            self.flatten(schema);
            self.defaults.extend(defaults);
            return;
        }
        let mut s = schema;
        if !a.doc.is_empty() {
            if let Some(o) = s.as_object_mut() {
                o.insert("description".into(), json!(a.doc.join(" ")));
            }
        }
        let s = merged(s, extra);
        let name = a.rename.unwrap_or_else(|| name.to_string());
        match s.get("default") {
            Some(d) if !optional => {
                self.defaults.insert(name.clone(), d.clone());
            }
            _ if optional || a.default => {}
            _ => self.required.push(name.clone()),
        }
        self.properties.insert(name, s);
    }

    /// The defaults gathered so far (see [`Param::defaults`]).
    pub fn defaults(self) -> Map<String, Value> {
        self.defaults
    }
}

/// Fills the defaults of field `name` (with its attributes as written) of type `T` in the
/// object `v`: a flattened field's into `v` itself, another's into its own value.
pub fn fill_field<T: Param>(v: &mut Value, name: &str, attrs: &[&str]) {
    let a = Attrs::read(attrs);
    if a.skipped {
        return;
    }
    if a.flatten {
        T::fill(v);
        return;
    }
    let key = a.rename.unwrap_or_else(|| name.to_string());
    if let Some(field) = v.get_mut(&key).filter(|f| !f.is_null()) {
        T::fill(field);
    }
}

/// Declares a tool's request struct as written (add `#[derive(serde::Deserialize)]`) and its
/// [`Param`] schema: each field's type's, its doc comment as the description, refined by the
/// JSON object written after `=` (see the module doc). Generic structs are not supported.
#[macro_export]
macro_rules! params {
    (
        $(#[$sm:meta])*
        $vis:vis struct $name:ident {
            $($(#[$fm:meta])* $fvis:vis $field:ident: $ty:ty $(= $extra:tt)?),* $(,)?
        }
    ) => {
        $(#[$sm])*
        $vis struct $name {
            $($(#[$fm])* $fvis $field: $ty,)*
        }

        impl $name {
            fn described() -> $crate::schema::Object {
                #[allow(unused_mut)]
                let mut o = $crate::schema::Object::default();
                $(o.param(
                    stringify!($field),
                    &[$(stringify!($fm)),*],
                    <$ty as $crate::schema::Param>::param(),
                    <$ty as $crate::schema::Param>::OPTIONAL,
                    None$(.or(Some(serde_json::json!($extra))))?,
                    <$ty as $crate::schema::Param>::defaults(),
                );)*
                o
            }
        }

        impl $crate::schema::Param for $name {
            fn param() -> serde_json::Value {
                $name::described().finish()
            }
            fn defaults() -> serde_json::Map<String, serde_json::Value> {
                $name::described().defaults()
            }
            fn fill(v: &mut serde_json::Value) {
                if let Some(o) = v.as_object_mut() {
                    o.retain(|_, x| !x.is_null());
                    for (k, d) in <$name as $crate::schema::Param>::defaults() {
                        o.entry(k).or_insert(d);
                    }
                }
                $($crate::schema::fill_field::<$ty>(v, stringify!($field), &[$(stringify!($fm)),*]);)*
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::params! {
        #[derive(serde::Deserialize)]
        struct Common {
            /// Seconds.
            wait: f64 = {"minimum": 0, "default": 5},
        }
    }

    crate::params! {
        #[derive(serde::Deserialize)]
        struct Req {
            /// The VM.
            name: String = {"minLength": 1},
            lines: i64 = {"minimum": 1, "maximum": 9, "default": 3},
            note: Option<String>,
            /// The operation's default, stated.
            cpus: Option<i64> = {"default": 2},
            #[serde(default)]
            hold: Vec<String>,
            #[serde(flatten)]
            common: Common,
            steps: Vec<Step> = {"default": []},
        }
    }

    crate::params! {
        #[derive(serde::Deserialize)]
        struct Step {
            cmd: String,
            wait: f64 = {"default": 5},
        }
    }

    #[test]
    fn a_request_s_schema_and_its_parsing_agree() {
        let s = Req::param();
        assert_eq!(
            s["properties"]["name"],
            json!({"type": "string", "description": "The VM.", "minLength": 1})
        );
        assert_eq!(s["properties"]["lines"]["maximum"], json!(9));
        assert_eq!(s["properties"]["note"], json!({"type": "string"}));
        assert_eq!(s["properties"]["wait"]["default"], json!(5));
        assert_eq!(s["required"], json!(["name"]));
        assert_eq!(s["additionalProperties"], json!(false));
        let mut given = json!({"name": "a", "steps": [{"cmd": "x"}, {"cmd": "y", "wait": 9}]});
        Req::fill(&mut given);
        let r: Req = serde_json::from_value(given).unwrap();
        let steps: Vec<(&str, f64)> = r.steps.iter().map(|s| (s.cmd.as_str(), s.wait)).collect();
        assert_eq!(steps, [("x", 5.0), ("y", 9.0)]);
        assert_eq!(
            (r.name.as_str(), r.lines, r.note, r.hold.len()),
            ("a", 3, None, 0)
        );
        assert_eq!(r.common.wait, 5.0);
        assert_eq!(
            r.cpus, None,
            "an Option's default is the operation's to apply"
        );
        assert_eq!(s["properties"]["cpus"]["default"], json!(2));
    }
}
