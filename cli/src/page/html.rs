//! The page around the data: one HTML file, its style and script inline (`page.html`, `page.css`,
//! `page.js` beside this file, compiled into the binary), the data as JSON in a
//! `<script type="application/json">` element. Nothing is fetched when it opens.

use anyhow::Result;

use super::data::PageData;

const TEMPLATE: &str = include_str!("page.html");
const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// The whole page of `data`.
///
/// Every string of the run (its command line, job label, module and file names, function and
/// scope names, the timeline's path) reaches the page only as inert text: in the title escaped as
/// HTML, in the data as JSON with every `<`, `>` and `&` written as a `\u` escape, so that no
/// sequence of it (`</script>`, `<!--<script>`) can end or reopen the data's element. The template
/// is filled in one pass over the template alone: a placeholder's name inside a value (`{{SCRIPT}}`
/// in the command line) is never taken for the placeholder.
pub fn render(data: &PageData) -> Result<String> {
    let json = inert_json(&serde_json::to_string(data)?);
    let title = data
        .runs
        .iter()
        .map(|r| format!("{} (pid {})", r.command, r.pid))
        .collect::<Vec<_>>()
        .join(" vs ");
    let title = escape_html(&format!("gpumemhook: {title}"));
    Ok(fill(
        TEMPLATE,
        &[
            ("{{TITLE}}", &title),
            ("{{STYLE}}", STYLE),
            ("{{SCRIPT}}", SCRIPT),
            ("{{DATA}}", &json),
        ],
    ))
}

/// JSON text with `<`, `>` and `&` as `\u` escapes: the same value, and nothing an HTML parser
/// reads as markup inside a script element.
fn inert_json(json: &str) -> String {
    json.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// `template` with each placeholder of `values` replaced by its value, scanning the template only
/// (the values are never searched again).
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out =
        String::with_capacity(template.len() + values.iter().map(|v| v.1.len()).sum::<usize>());
    let mut rest = template;
    while let Some((at, (name, value))) = values
        .iter()
        .filter_map(|v| rest.find(v.0).map(|at| (at, *v)))
        .min_by_key(|(at, _)| *at)
    {
        out.push_str(&rest[..at]);
        out.push_str(value);
        rest = &rest[at + name.len()..];
    }
    out.push_str(rest);
    out
}

/// `text` safe between HTML tags.
fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_cannot_close_its_script_element() {
        let data = PageData { runs: Vec::new() };
        let page = render(&data).unwrap();
        assert!(page.contains(r#"{"runs":[]}"#));
        assert_eq!(
            inert_json(r#"["</script><!--<script>&"]"#),
            r#"["\u003c/script\u003e\u003c!--\u003cscript\u003e\u0026"]"#
        );
        assert_eq!(
            fill("a{{X}}b{{Y}}", &[("{{X}}", "{{Y}}"), ("{{Y}}", "1")]),
            "a{{Y}}b1"
        );
        assert_eq!(escape_html("a</script>&"), "a&lt;/script&gt;&amp;");
        assert!(!page.contains("{{"), "every placeholder filled");
    }
}
