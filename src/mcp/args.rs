//! A tool call's arguments, typed: what handlers read them through.

use serde_json::{Map, Value};

use super::tool_error::ToolError;

/// Typed access to checked arguments. Schema checking has already run (types and bounds), so
/// a wrong type here means the schema and the handler disagree: reported as a tool error,
/// never a panic. The schema's defaults come along ([`Args::checked`]): a handler reads a
/// parameter with a default through [`Args::int`] or [`Args::number`], so the default is
/// written once, in the schema.
pub struct Args(pub Map<String, Value>, Map<String, Value>);

impl Args {
    /// Arguments without schema defaults (tests, and callers that build them by hand).
    pub fn new(values: Map<String, Value>) -> Args {
        Args(values, Map::new())
    }

    /// Arguments checked against `schema`, with the defaults its properties declare.
    pub fn checked(values: Map<String, Value>, schema: &Value) -> Args {
        let defaults = schema["properties"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, p)| Some((k.clone(), p.get("default")?.clone())))
            .collect();
        Args(values, defaults)
    }

    /// The argument, else the schema's default for it.
    fn or_default(&self, name: &str) -> Result<&Value, ToolError> {
        self.get(name)
            .or_else(|| self.1.get(name).filter(|v| !v.is_null()))
            .ok_or_else(|| {
                ToolError::new(format!(
                    "missing parameter '{name}' (its schema declares no default)"
                ))
            })
    }

    /// An integer parameter: the argument, else its schema default (bounds already checked).
    pub fn int(&self, name: &str) -> Result<i64, ToolError> {
        self.or_default(name)?
            .as_i64()
            .ok_or_else(|| ToolError::new(format!("parameter '{name}' must be an integer")))
    }

    /// A number parameter: the argument, else its schema default (bounds already checked).
    pub fn number(&self, name: &str) -> Result<f64, ToolError> {
        self.or_default(name)?
            .as_f64()
            .ok_or_else(|| ToolError::new(format!("parameter '{name}' must be a number")))
    }

    /// Raw value, treating JSON null as absent.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    /// A required string.
    pub fn str(&self, name: &str) -> Result<&str, ToolError> {
        self.opt_str(name)?
            .ok_or_else(|| ToolError::new(format!("missing required parameter '{name}'")))
    }

    /// An optional string.
    pub fn opt_str(&self, name: &str) -> Result<Option<&str>, ToolError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ToolError::new(format!(
                "parameter '{name}' must be a string"
            ))),
        }
    }

    /// A string with a default.
    pub fn str_or<'a>(&'a self, name: &str, default: &'a str) -> Result<&'a str, ToolError> {
        Ok(self.opt_str(name)?.unwrap_or(default))
    }

    /// A boolean with a default.
    pub fn bool_or(&self, name: &str, default: bool) -> Result<bool, ToolError> {
        match self.get(name) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(ToolError::new(format!(
                "parameter '{name}' must be a boolean"
            ))),
        }
    }

    /// An optional integer.
    pub fn opt_i64(&self, name: &str) -> Result<Option<i64>, ToolError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| ToolError::new(format!("parameter '{name}' must be an integer"))),
        }
    }

    /// An integer with a default.
    pub fn i64_or(&self, name: &str, default: i64) -> Result<i64, ToolError> {
        Ok(self.opt_i64(name)?.unwrap_or(default))
    }

    /// An optional number (integer or float).
    pub fn opt_f64(&self, name: &str) -> Result<Option<f64>, ToolError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| ToolError::new(format!("parameter '{name}' must be a number"))),
        }
    }

    /// An optional list of strings.
    pub fn opt_str_list(&self, name: &str) -> Result<Option<Vec<String>>, ToolError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| {
                    i.as_str().map(str::to_string).ok_or_else(|| {
                        ToolError::new(format!("parameter '{name}' must be a list of strings"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(ToolError::new(format!("parameter '{name}' must be a list"))),
        }
    }

    /// A list of strings, empty when absent.
    pub fn str_list(&self, name: &str) -> Result<Vec<String>, ToolError> {
        Ok(self.opt_str_list(name)?.unwrap_or_default())
    }
}
