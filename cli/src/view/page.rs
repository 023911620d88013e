//! The page around the data: one HTML file, its style and script inline (`page.html`, `page.css`,
//! `page.js` beside this file, compiled into the binary), the data as JSON in a
//! `<script type="application/json">` element. Nothing is fetched when it opens.

use anyhow::Result;

use super::data::PageData;

const TEMPLATE: &str = include_str!("page.html");
const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// The whole page of `data`.
pub fn render(data: &PageData) -> Result<String> {
    // `</` inside the data would end its script element; `<\/` is the same JSON string.
    let json = serde_json::to_string(data)?.replace("</", "<\\/");
    let title = data
        .runs
        .iter()
        .map(|r| format!("{} (pid {})", r.command, r.pid))
        .collect::<Vec<_>>()
        .join(" vs ");
    Ok(TEMPLATE
        .replacen(
            "{{TITLE}}",
            &escape_html(&format!("gpumemhook: {title}")),
            1,
        )
        .replacen("{{STYLE}}", STYLE, 1)
        .replacen("{{SCRIPT}}", SCRIPT, 1)
        // Last: the data may hold any of the placeholders as text.
        .replacen("{{DATA}}", &json, 1))
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
        assert_eq!(escape_html("a</script>&"), "a&lt;/script&gt;&amp;");
        assert!(!page.contains("{{"), "every placeholder filled");
    }
}
