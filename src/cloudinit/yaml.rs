//! A YAML emitter for cloud-init documents: block style for maps and lists, and every string
//! double-quoted with escapes, so that values with `:`, `#`, quotes, newlines, a leading
//! `*`, `&`, `!` or `-`, or words YAML would read as booleans (`yes`, `off`) or numbers come
//! back exactly as given. Numbers, booleans and null are written as themselves.

use serde_json::Value;

/// `value` as a YAML document body (no `---`, no header line).
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(m) if !m.is_empty() => map(&mut out, m, 0),
        Value::Array(a) if !a.is_empty() => list(&mut out, a, 0),
        other => {
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
    out
}

/// A string as a double-quoted YAML scalar. Everything outside printable ASCII and plain
/// Unicode letters is escaped, so no reader can take it for syntax.
pub fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            '\t' => q.push_str("\\t"),
            '\r' => q.push_str("\\r"),
            c if (c as u32) < 0x20 || (0x7f..=0x9f).contains(&(c as u32)) => {
                q.push_str(&format!("\\x{:02x}", c as u32));
            }
            // Byte-order marks, line/paragraph separators and the like: escaped as code points.
            c if matches!(c as u32, 0x2028 | 0x2029 | 0xfeff | 0xfffe | 0xffff) => {
                q.push_str(&format!("\\u{:04x}", c as u32));
            }
            c if (c as u32) > 0xffff => q.push_str(&format!("\\U{:08x}", c as u32)),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => quote(s),
        Value::Array(_) => "[]".into(),
        Value::Object(_) => "{}".into(),
    }
}

fn is_block(v: &Value) -> bool {
    matches!(v, Value::Object(m) if !m.is_empty()) || matches!(v, Value::Array(a) if !a.is_empty())
}

fn indent(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

fn map(out: &mut String, m: &serde_json::Map<String, Value>, depth: usize) {
    for (k, v) in m {
        indent(out, depth);
        out.push_str(&quote(k));
        out.push(':');
        write_value(out, v, depth);
    }
}

fn list(out: &mut String, a: &[Value], depth: usize) {
    for v in a {
        indent(out, depth);
        out.push('-');
        match v {
            Value::Object(m) if !m.is_empty() => {
                // The first key on the dash line, the rest aligned under it.
                let mut first = true;
                for (k, val) in m {
                    if first {
                        out.push(' ');
                        first = false;
                    } else {
                        indent(out, depth + 2);
                    }
                    out.push_str(&quote(k));
                    out.push(':');
                    write_value(out, val, depth + 2);
                }
            }
            other => write_value(out, other, depth),
        }
    }
}

/// Writes `v` after a `key:` or `-` already on the line.
fn write_value(out: &mut String, v: &Value, depth: usize) {
    if is_block(v) {
        out.push('\n');
        match v {
            Value::Object(m) => map(out, m, depth + 2),
            Value::Array(a) => list(out, a, depth + 2),
            _ => {}
        }
    } else {
        out.push(' ');
        out.push_str(&scalar(v));
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_are_always_quoted_and_escaped() {
        assert_eq!(quote("a: b # c"), "\"a: b # c\"");
        assert_eq!(quote("say \"hi\"\n\\"), "\"say \\\"hi\\\"\\n\\\\\"");
        assert_eq!(quote("*x"), "\"*x\"");
        assert_eq!(quote("\u{1}\u{85}"), "\"\\x01\\x85\"");
        assert_eq!(quote("\u{1F600}"), "\"\\U0001f600\"");
        assert_eq!(quote("é"), "\"é\"");
    }

    #[test]
    fn nested_blocks_indent_under_their_dash_or_key() {
        let v = json!({
            "hostname": "h",
            "users": ["default", {"name": "u", "groups": ["a", "b"], "lock_passwd": true}],
            "runcmd": [["echo", "a b"], "ls -l"],
            "empty": [],
            "n": 3
        });
        let y = to_yaml(&v);
        let want = "\"hostname\": \"h\"\n\"users\":\n  - \"default\"\n  - \"name\": \"u\"\n    \
                    \"groups\":\n      - \"a\"\n      - \"b\"\n    \"lock_passwd\": true\n\
                    \"runcmd\":\n  -\n    - \"echo\"\n    - \"a b\"\n  - \"ls -l\"\n\"empty\": []\n\
                    \"n\": 3\n";
        assert_eq!(y, want);
    }
}
