//! Keeps cloud-init's end visible on the console when verbatim user-data sets its own
//! `final_message`: that message replaces the default "Cloud-init v. X finished at ..." line
//! the console watch waits for. cloud-init takes one `final_message`, so the seed carries the
//! caller's document unchanged plus a second cloud-config part (multipart user-data: a later
//! part's keys replace an earlier one's) whose `final_message` is the caller's text followed by
//! one fixed line, [`MARKER`], rendered by cloud-init with the same substitutions.

use serde_json::json;

use super::yaml;

/// The start of the line mcqemu adds to a caller's `final_message`.
pub const MARKER: &str = "MCQEMU-CLOUD-INIT-FINISHED";
/// Separates the fields of the marker line (a datasource name has spaces and brackets).
pub const SEP: &str = " | ";
/// The part boundary: hyphens never occur in base64, so no part's text can contain it.
const BOUNDARY: &str = "----MCQEMU-PART-BOUNDARY----";

/// The marker line in the caller's template language: cloud-init renders `final_message` with
/// Jinja when it starts with `## template: jinja`, else with `$NAME` / `${NAME}` substitutions.
fn marker_line(jinja: bool) -> String {
    let fields = if jinja {
        ["{{version}}", "{{datasource}}", "{{uptime}}"]
    } else {
        ["${VERSION}", "${DATASOURCE}", "${UPTIME}"]
    };
    format!("{MARKER} v. {}", fields.join(SEP))
}

/// The user-data for verbatim `raw`: unchanged, unless it is a `#cloud-config` document with a
/// `final_message` of its own, then the two-part document described above.
pub fn user_data(raw: &str) -> String {
    if !raw.starts_with("#cloud-config") {
        return raw.to_string();
    }
    let Some(message) = top_level_final_message(raw) else {
        return raw.to_string();
    };
    let jinja = message.starts_with("## template: jinja");
    let combined = format!("{}\n{}", message.trim_end(), marker_line(jinja));
    let ours = format!(
        "#cloud-config\n{}",
        yaml::to_yaml(&json!({ "final_message": combined }))
    );
    let part = |name: &str, text: &str| {
        format!(
            "--{BOUNDARY}\nContent-Type: text/cloud-config; charset=\"utf-8\"\n\
             Content-Transfer-Encoding: base64\n\
             Content-Disposition: attachment; filename=\"{name}\"\n\n{}\n",
            wrap(&crate::b64::encode(text.as_bytes()))
        )
    };
    format!(
        "Content-Type: multipart/mixed; boundary=\"{BOUNDARY}\"\nMIME-Version: 1.0\n\n{}{}--{BOUNDARY}--\n",
        part("user-data", raw),
        part("mcqemu-final-message", &ours)
    )
}

/// Base64 in lines of 76 characters, as MIME wants.
fn wrap(b64: &str) -> String {
    b64.as_bytes()
        .chunks(76)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of a top-level `final_message:` key of a YAML document, for the forms a person
/// writes (plain, quoted on one line, `|` or `>` block); None for an empty one (cloud-init then
/// prints its default) or a form not read here (the document is then left alone).
pub fn top_level_final_message(doc: &str) -> Option<String> {
    let mut lines = doc.lines();
    let value = lines
        .by_ref()
        .find_map(|l| l.strip_prefix("final_message:"))?
        .trim();
    let text = match value.chars().next() {
        Some('|') | Some('>') => block(value.starts_with('>'), value, lines)?,
        Some('"') => double_quoted(value)?,
        Some('\'') => single_quoted(value)?,
        Some('[' | '{' | '&' | '*' | '!' | '#') | None => return None,
        Some(_) => value
            .split_once(" #")
            .map_or(value, |(v, _)| v)
            .trim_end()
            .to_string(),
    };
    (!text.trim().is_empty()).then_some(text)
}

/// A block scalar: the indented lines after its `|` or `>` header (folded: lines joined by
/// spaces, an empty line a line break).
fn block<'a>(folded: bool, header: &str, rest: impl Iterator<Item = &'a str>) -> Option<String> {
    let flags = header
        .split_once(" #")
        .map_or(header, |(h, _)| h)
        .trim_end();
    if flags.len() > 3
        || !flags[1..]
            .chars()
            .all(|c| matches!(c, '+' | '-' | '1'..='9'))
    {
        return None;
    }
    let body: Vec<&str> = rest
        .take_while(|l| l.trim().is_empty() || l.starts_with([' ', '\t']))
        .collect();
    let indent = body
        .iter()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())?;
    let lines: Vec<&str> = body
        .iter()
        .map(|l| l.get(indent..).unwrap_or("").trim_end_matches('\r'))
        .collect();
    if !folded {
        return Some(lines.join("\n"));
    }
    let mut out = String::new();
    for l in lines {
        if l.is_empty() {
            out.push('\n');
        } else {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push(' ');
            }
            out.push_str(l);
        }
    }
    Some(out)
}

/// `"..."` closed on its line, with YAML's common escapes.
fn double_quoted(value: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = value[1..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => out.push(match chars.next()? {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                '0' => '\0',
                c @ ('"' | '\\' | '/' | ' ') => c,
                _ => return None,
            }),
            c => out.push(c),
        }
    }
    None
}

/// `'...'` closed on its line (`''` is one quote).
fn single_quoted(value: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = value[1..].chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\'' {
            out.push(c);
        } else if chars.peek() == Some(&'\'') {
            chars.next();
            out.push('\'');
        } else {
            return Some(out);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_forms_people_write_final_message_in() {
        let plain = "#cloud-config\nruncmd: [true]\nfinal_message: booted in $UPTIME s # note\n";
        assert_eq!(
            top_level_final_message(plain).as_deref(),
            Some("booted in $UPTIME s")
        );
        let dq = "#cloud-config\nfinal_message: \"done: \\\"$VERSION\\\"\\nbye\"\n";
        assert_eq!(
            top_level_final_message(dq).as_deref(),
            Some("done: \"$VERSION\"\nbye")
        );
        let sq = "#cloud-config\nfinal_message: 'it''s up'\n";
        assert_eq!(top_level_final_message(sq).as_deref(), Some("it's up"));
        let lit = "#cloud-config\nfinal_message: |\n  line one\n  up $UPTIME\npackages: []\n";
        assert_eq!(
            top_level_final_message(lit).as_deref(),
            Some("line one\nup $UPTIME")
        );
        let folded = "#cloud-config\nfinal_message: >-\n  all\n  done\n";
        assert_eq!(top_level_final_message(folded).as_deref(), Some("all done"));
        let nested = "#cloud-config\nusers:\n  - final_message: no\n";
        assert_eq!(top_level_final_message(nested), None);
        assert_eq!(top_level_final_message("final_message: \"\"\n"), None);
        assert_eq!(top_level_final_message("final_message: [a]\n"), None);
    }

    #[test]
    fn user_data_without_its_own_final_message_is_left_verbatim() {
        let raw = "#cloud-config\nruncmd:\n  - echo hi\n";
        assert_eq!(user_data(raw), raw);
        let script = "#!/bin/sh\n# final_message: x\necho hi\n";
        assert_eq!(user_data(script), script);
    }

    /// The base64 body of each part of a multipart document, decoded.
    fn parts(doc: &str) -> Vec<String> {
        doc.split(&format!("--{BOUNDARY}"))
            .skip(1)
            .filter_map(|p| p.split_once("\n\n"))
            .map(|(_, body)| {
                let b64: String = body.split_whitespace().collect();
                String::from_utf8(crate::b64::decode(&b64).unwrap()).unwrap()
            })
            .collect()
    }

    #[test]
    fn a_custom_final_message_is_kept_and_followed_by_the_marker_line() {
        let raw = "#cloud-config\nfinal_message: \"up after $UPTIME s, é\"\n";
        let doc = user_data(raw);
        assert!(doc.starts_with("Content-Type: multipart/mixed; boundary="));
        let p = parts(&doc);
        assert_eq!(p.len(), 2, "{doc}");
        assert_eq!(p[0], raw, "the caller's document rides unchanged");
        assert_eq!(
            p[1],
            "#cloud-config\n\"final_message\": \"up after $UPTIME s, é\\nMCQEMU-CLOUD-INIT-FINISHED v. \
             ${VERSION} | ${DATASOURCE} | ${UPTIME}\"\n"
        );
        let jinja = "#cloud-config\nfinal_message: |\n  ## template: jinja\n  hi {{uptime}}\n";
        let p = parts(&user_data(jinja));
        assert!(
            p[1].contains("v. {{version}} | {{datasource}} | {{uptime}}"),
            "{}",
            p[1]
        );
    }
}
