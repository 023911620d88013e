//! The page around the data: one HTML file, its style and script inline (`page.html`, `page.css`
//! beside this file, the script's modules in `js/`, compiled into the binary), the data as JSON in
//! a `<script type="application/json">` element. Nothing is fetched when it opens.

use anyhow::Result;

use super::data::PageData;

const TEMPLATE: &str = include_str!("page.html");
const STYLE: &str = include_str!("page.css");

/// The page's script: the modules of `js/`, in this order, one after the other inside one closure
/// ([`script`]), so that they share one scope and leave nothing on `window`. A module may define
/// functions that use names of modules after it (they run later); what runs as it loads uses only
/// those before it, and `main.js`, last, draws the page. The unit tests of `js/` (`tests/`, under
/// node) read this list for the same order.
const SCRIPTS: &[(&str, &str)] = &[
    ("format.js", include_str!("js/format.js")),
    ("dom.js", include_str!("js/dom.js")),
    ("series.js", include_str!("js/series.js")),
    ("timeline.js", include_str!("js/timeline.js")),
    ("chart.js", include_str!("js/chart.js")),
    ("pointer.js", include_str!("js/pointer.js")),
    ("instant.js", include_str!("js/instant.js")),
    ("flame.js", include_str!("js/flame.js")),
    ("report.js", include_str!("js/report.js")),
    ("job.js", include_str!("js/job.js")),
    ("main.js", include_str!("js/main.js")),
];

/// The modules of [`SCRIPTS`] as one script: strict, inside one closure, each after a line naming
/// its file.
fn script() -> String {
    let mut out = String::from("\"use strict\";\n(function () {\n");
    for (name, text) in SCRIPTS {
        out.push_str(&format!("// ---- js/{name} ----\n{text}\n"));
    }
    out.push_str("})();");
    out
}

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
    let title = match (&data.job, data.runs.first()) {
        (Some(_), Some(first)) => format!("{} ({} processes)", first.command, data.runs.len()),
        _ => data
            .runs
            .iter()
            .map(|r| format!("{} (pid {})", r.command, r.pid))
            .collect::<Vec<_>>()
            .join(" vs "),
    };
    let title = escape_html(&format!("gpumemhook: {title}"));
    Ok(fill(
        TEMPLATE,
        &[
            ("{{TITLE}}", &title),
            ("{{STYLE}}", STYLE),
            ("{{SCRIPT}}", &script()),
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
    use gpumemhook_reader::{format_size, SIZE_RULE};
    use std::path::Path;

    #[test]
    fn the_data_cannot_close_its_script_element() {
        let data = PageData::new(Vec::new());
        let page = render(&data).unwrap();
        let sizes = serde_json::to_string(&SIZE_RULE).unwrap();
        assert!(page.contains(&format!(r#"{{"runs":[],"sizes":{sizes}}}"#)));
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

    #[test]
    fn every_module_of_js_is_in_the_page_once_and_none_can_end_its_script_element() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/page/js");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let mut listed: Vec<String> = SCRIPTS.iter().map(|s| s.0.to_string()).collect();
        listed.sort();
        assert_eq!(listed, files, "SCRIPTS lists each file of js/ once");
        assert_eq!(SCRIPTS.last().unwrap().0, "main.js", "main.js runs last");
        for (name, text) in SCRIPTS {
            let lower = text.to_ascii_lowercase();
            assert!(
                !lower.contains("</script") && !lower.contains("<!--"),
                "js/{name} holds markup that would end the page's script element"
            );
        }
    }

    /// The sizes the page's unit tests format (`tests/sizes.json`, read by `tests/format.test.js`):
    /// each unit's edges, exact ties at both precisions, the largest sizes, and a spread of others.
    fn size_cases() -> Vec<u64> {
        let mut cases = vec![
            0,
            1,
            512,
            1023,
            1 << 53,
            (1 << 53) + 1,
            u64::MAX - 1,
            u64::MAX,
        ];
        for unit in 1..=5 {
            let per = 1u64 << (10 * unit);
            cases.extend([
                per - 1,
                per,
                per + 1,
                100 * per - 1,
                100 * per,
                1000 * per - 1,
            ]);
            // x.125, x.375, ... are ties at two decimals; 100.25, 100.75, ... at one.
            cases.extend([9, 11, 13, 15, 17, 799, 807].map(|eighths| per / 8 * eighths));
            cases.extend([401, 403, 405, 4001].map(|quarters| per / 4 * quarters));
        }
        cases.extend([1_000_000, 7 << 29, (1 << 30) - 1]);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for shift in 0..64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            cases.push(x >> shift);
        }
        cases.sort_unstable();
        cases.dedup();
        cases
    }

    /// `tests/sizes.json` as it must read: the page's size rule, and each case with Rust's text.
    fn sizes_json() -> String {
        let cases: Vec<String> = size_cases()
            .into_iter()
            .map(|b| format!("    [{b}, {:?}]", format_size(b)))
            .collect();
        format!(
            "{{\n  \"rule\": {},\n  \"cases\": [\n{}\n  ]\n}}\n",
            serde_json::to_string(&SIZE_RULE).unwrap(),
            cases.join(",\n")
        )
    }

    /// The page formats sizes by the rule of `reader/src/size.rs` (`js/format.js`); its unit tests
    /// check that it writes each of these sizes as Rust does, and this test that these are Rust's.
    #[test]
    fn the_sizes_the_pages_unit_tests_expect_are_what_rust_writes() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/page/tests/sizes.json");
        let want = sizes_json();
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        let parse = |text: &str| serde_json::from_str::<serde_json::Value>(text).ok();
        assert!(
            parse(&have).is_some() && parse(&have) == parse(&want),
            "{} is not what reader/src/size.rs writes: replace it with\n{want}",
            path.display()
        );
    }
}
