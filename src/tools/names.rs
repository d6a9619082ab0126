//! The names tools take: checked as they are parsed, so a handler only ever holds a valid one.

use serde_json::{json, Value};

use crate::kind::Failed;
use crate::ops::vm::records::{invalid_name, valid_name};
use crate::schema::Param;

macro_rules! name_type {
    ($(#[$m:meta])* $t:ident, $what:literal) => {
        $(#[$m])*
        #[derive(serde::Deserialize, Debug, Clone, PartialEq, Eq)]
        #[serde(try_from = "String")]
        pub struct $t(pub String);

        impl TryFrom<String> for $t {
            type Error = Failed;
            fn try_from(name: String) -> Result<Self, Failed> {
                if valid_name(&name) {
                    Ok($t(name))
                } else {
                    Err(Failed::invalid(invalid_name($what, &name)))
                }
            }
        }

        impl Param for $t {
            fn param() -> Value {
                let mut s = String::param();
                s["minLength"] = json!(1);
                s
            }
        }
    };
}

name_type!(
    /// The `name` of an existing VM (registry rules: 1-48 of A-Z a-z 0-9 _ . -).
    VmName,
    "VM"
);
name_type!(
    /// The `name` of an existing template (checked like a VM's: it names its folder).
    TemplateName,
    "template"
);

crate::params! {
    /// The parameters of a tool that takes only a VM's name.
    #[derive(serde::Deserialize)]
    pub struct VmOnly {
        name: VmName,
    }
}

impl VmOnly {
    /// The VM's name.
    pub fn name(self) -> String {
        self.name.0
    }
}

crate::params! {
    /// The parameters of a tool that takes only a template's name.
    #[derive(serde::Deserialize)]
    pub struct TemplateOnly {
        name: TemplateName,
    }
}

impl TemplateOnly {
    /// The template's name.
    pub fn name(self) -> String {
        self.name.0
    }
}

/// A snapshot tag (1-64 of A-Z a-z 0-9 _ . -, starting with a letter or digit).
#[derive(serde::Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(try_from = "String")]
pub struct Tag(pub String);

impl TryFrom<String> for Tag {
    type Error = Failed;
    fn try_from(tag: String) -> Result<Self, Failed> {
        crate::tools::check_tag(&tag).map_err(|e| Failed::invalid(e.msg))?;
        Ok(Tag(tag))
    }
}

impl Param for Tag {
    fn param() -> Value {
        crate::schema::merged(
            String::param(),
            Some(
                json!({"minLength": 1, "maxLength": 64, "pattern": crate::tools::params::TAG_PATTERN}),
            ),
        )
    }
}
