//! A tool call's arguments: what handlers parse their typed request from.

use serde_json::{Map, Value};

use super::tool_error::ToolError;

/// A call's arguments, checked against the tool's input schema (types and bounds) before the
/// handler sees them. A handler parses them into its request struct ([`Args::parse`]); a
/// shape the schema let through but the struct refuses is a tool error, never a panic.
pub struct Args(pub Map<String, Value>);

impl Args {
    /// The arguments as given.
    pub fn new(values: Map<String, Value>) -> Args {
        Args(values)
    }

    /// The arguments as the tool's typed request (a [`crate::params!`] struct): JSON null is
    /// absent, and the request's declared defaults fill in what was left out (an `Option`'s
    /// stays None: its default is the operation's).
    pub fn parse<T: serde::de::DeserializeOwned + crate::schema::Param>(
        &self,
    ) -> Result<T, ToolError> {
        let mut values = Value::Object(self.0.clone());
        T::fill(&mut values);
        serde_json::from_value(values).map_err(|e| ToolError::new(e.to_string()))
    }

    /// One argument as given, JSON null as absent.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }
}
