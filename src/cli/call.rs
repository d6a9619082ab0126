//! `mcqemu call TOOL ['{json}' | -] [--out FILE]`: one tool from the shell, through the same
//! call path as the server (`mcp::call`); its structured result on stdout, a failure on stderr
//! with its kind in brackets, and an exit status by kind (`ErrorKind::exit_code`).

#![allow(clippy::print_stdout)] // the result is this subcommand's stdout

use std::io::Read;

use serde_json::{Map, Value};

use super::usage;
use crate::mcp::call;
use crate::mcp::tool::ToolCtx;
use crate::tools;

/// `call TOOL [JSON | -] [--out FILE]`.
pub fn main(rest: &[String]) -> i32 {
    if let Err(e) = crate::state::roots::set_operator_roots(&crate::state::roots::env_roots()) {
        return usage(&e.msg);
    }
    let mut positional = Vec::new();
    let mut out_file = None;
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        if a == "--out" {
            match it.next() {
                Some(f) => out_file = Some(f.clone()),
                None => return usage("--out needs a file name"),
            }
        } else {
            positional.push(a.clone());
        }
    }
    let (name, json_arg) = match positional.as_slice() {
        [name] => (name.clone(), "{}".to_string()),
        [name, json] => (name.clone(), json.clone()),
        _ => return usage("call takes TOOL and optionally one JSON argument"),
    };
    let tool = match call::find(tools::ALL, &name) {
        Ok(t) => t,
        Err(e) => return usage(&e.msg),
    };
    let text = if json_arg == "-" {
        let mut s = String::new();
        if let Err(e) = std::io::stdin().take(64 << 20).read_to_string(&mut s) {
            return usage(&format!("cannot read arguments from stdin: {e}"));
        }
        s
    } else {
        json_arg
    };
    let args: Map<String, Value> = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return usage("the arguments must be a JSON object"),
        Err(e) => return usage(&format!("the arguments are not valid JSON: {e}")),
    };
    let args = match call::check(tool, args) {
        Ok(args) => args,
        Err(e) => return usage(&e.msg),
    };
    match call::run(tool, &ToolCtx::detached(), args) {
        Ok(out) => {
            if let Some(file) = out_file {
                if let Err(e) = save_images(&out.extra, &file) {
                    eprintln!("mcqemu: {e}");
                    return 1;
                }
            }
            println!(
                "{}",
                serde_json::to_string_pretty(&out.structured).unwrap_or_default()
            );
            0
        }
        Err(e) => {
            eprintln!("[{}] {}", e.kind.code(), e.msg);
            e.kind.exit_code()
        }
    }
}

fn save_images(extra: &[Value], file: &str) -> Result<(), String> {
    let image = extra
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("image"))
        .ok_or("the result has no image content to save")?;
    let data = image
        .get("data")
        .and_then(Value::as_str)
        .ok_or("image content without data")?;
    let bytes = crate::b64::decode(data).map_err(|e| e.to_string())?;
    std::fs::write(file, bytes).map_err(|e| format!("cannot write {file}: {e}"))
}
