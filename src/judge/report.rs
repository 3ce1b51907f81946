//! `index.html`: one self-contained page per results directory — the summary table with its intervals, the
//! comparison with the reference if one was made, every plot (embedded as data: URLs), the samples and the
//! resolved recipe — that opens anywhere without the files beside it.
use anyhow::Result;
use base64::Engine;
use std::path::Path;

use super::reading::Results;
use super::summary::{summary_tables, Table};
use crate::files::write_atomically;

/// Text made safe inside HTML elements and attributes.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn html_table(table: &Table) -> String {
    let mut out = format!("<p>{}</p>\n<table>\n<thead><tr>", escape(&table.note));
    for h in &table.header {
        out.push_str(&format!("<th>{}</th>", escape(h)));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in &table.rows {
        out.push_str("<tr>");
        for (i, cell) in row.iter().enumerate() {
            let class = if i == 0 { " class=\"label\"" } else { "" };
            out.push_str(&format!("<td{class}>{}</td>", escape(cell)));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n");
    out
}

/// `reproduction.csv` as a table, if the run was compared with a reference.
fn reproduction_table(dir: &Path) -> Result<Option<Table>> {
    let path = dir.join("reproduction.csv");
    if !path.exists() {
        return Ok(None);
    }
    let (header, records) = super::reading::table(&path)?;
    let header: Vec<String> = header.iter().map(String::from).collect();
    let rows = records.iter().map(|r| r.iter().map(String::from).collect()).collect();
    let note = "Against the committed reference results: per variant and metric, whether this run reproduces them, \
                and the test that decided (README: reproducing a reference)."
        .to_string();
    Ok(Some(Table { note, header, rows }))
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em auto;max-width:1320px;color:#222}\
table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:14px}\
th{background:#dde5f0;text-align:left}\
th,td{border:1px solid #b8c2cc;padding:4px 8px}\
td.label{font-weight:bold}\
img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}\
pre{background:#f6f8fa;padding:1em;overflow-x:auto;font-size:13px}";

/// Writes `<dir>/index.html` from the files of a results directory.
pub fn write_report(results: &Results) -> Result<()> {
    let (dir, recipe) = (&results.dir, results.recipe);
    let mut body = format!("<h1>{}</h1>\n", escape(&recipe.name));
    if let Some(d) = &recipe.description {
        body.push_str(&format!("<p>{}</p>\n", escape(d)));
    }
    if !recipe.overrides.is_empty() {
        body.push_str(&format!(
            "<p>Command-line overrides: <code>{}</code></p>\n",
            escape(&recipe.overrides.describe().join(" "))
        ));
    }
    body.push_str("<h2>Summary</h2>\n");
    for table in summary_tables(results)? {
        body.push_str(&html_table(&table));
    }
    if let Some(column) = super::summary::primary_column(recipe, &results.headline) {
        if let Some(compute) = super::compute::section(results, &column)? {
            body.push_str("<h2>What each arm is worth in compute</h2>\n");
            body.push_str(&format!("<pre>{}</pre>\n", escape(compute.trim())));
        }
    }
    if let Some(table) = reproduction_table(dir)? {
        body.push_str("<h2>Reproduction</h2>\n");
        body.push_str(&html_table(&table));
    }
    let mut plots: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "png"))
        .collect();
    plots.sort();
    if !plots.is_empty() {
        body.push_str("<h2>Plots</h2>\n");
    }
    for plot in plots {
        let bytes = std::fs::read(&plot)?;
        let name = plot.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        body.push_str(&format!(
            "<figure><img alt=\"{}\" src=\"data:image/png;base64,{}\"><figcaption>{}</figcaption></figure>\n",
            escape(&name),
            base64::engine::general_purpose::STANDARD.encode(bytes),
            escape(&name)
        ));
    }
    let samples = dir.join("samples.txt");
    if samples.exists() {
        body.push_str(&format!("<h2>Samples</h2>\n<pre>{}</pre>\n", escape(&std::fs::read_to_string(samples)?)));
    }
    let resolved = dir.join("recipe.resolved.yaml");
    if resolved.exists() {
        body.push_str(&format!(
            "<h2>Resolved recipe</h2>\n<details><summary>every run's configuration</summary><pre>{}</pre></details>\n",
            escape(&std::fs::read_to_string(resolved)?)
        ));
    }
    let page = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{} — ablate</title>\n\
         <style>{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n",
        escape(&recipe.name)
    );
    write_atomically(&dir.join("index.html"), page.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(escape("<a href=\"x\">&'</a>"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
        let t = Table { note: "n<1".into(), header: vec!["a".into()], rows: vec![vec!["<b>".into()]] };
        let html = html_table(&t);
        assert!(html.contains("<td class=\"label\">&lt;b&gt;</td>") && html.contains("n&lt;1"), "{html}");
    }
}
