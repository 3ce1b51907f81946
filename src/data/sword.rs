//! Reader for SWORD "ztext" Bible modules, the format of Debian's `sword-text-*` packages: zlib-compressed
//! blocks (`*.bzz`) indexed by `*.bzs` (offset, size, uncompressed size: three u32) and verses indexed by
//! `*.bzv` (block, offset, size: u32, u32, u16), all little-endian. Verse text is OSIS markup, reduced here
//! to plain text: footnotes and headings are dropped whole, other tags are dropped and their text kept.
use anyhow::{bail, Context, Result};
use std::io::Read;
use std::path::Path;

/// Every non-empty verse (and book/chapter introduction) of a module, in canonical order: Old Testament then
/// New Testament. Each entry is `(testament, index in that testament's verse table, plain text)`.
pub fn read_verses(module_dir: &Path) -> Result<Vec<(usize, usize, String)>> {
    let mut out = Vec::new();
    for (t, testament) in ["ot", "nt"].iter().enumerate() {
        let bzs = module_dir.join(format!("{testament}.bzs"));
        if !bzs.exists() {
            continue;
        }
        let blocks = read_blocks(&bzs, &module_dir.join(format!("{testament}.bzz")))?;
        let bzv = std::fs::read(module_dir.join(format!("{testament}.bzv")))
            .with_context(|| format!("reading {testament}.bzv in {}", module_dir.display()))?;
        for (i, e) in bzv.chunks_exact(10).enumerate() {
            let block = u32::from_le_bytes(e[0..4].try_into().unwrap()) as usize;
            let offset = u32::from_le_bytes(e[4..8].try_into().unwrap()) as usize;
            let size = u16::from_le_bytes(e[8..10].try_into().unwrap()) as usize;
            if size == 0 {
                continue;
            }
            let Some(raw) = blocks.get(block).and_then(|b| b.get(offset..offset + size)) else {
                bail!("{testament}.bzv entry {i} points outside the text blocks: is the module corrupt?");
            };
            let text = osis_to_text(&String::from_utf8_lossy(raw));
            if !text.is_empty() {
                out.push((t, i, text));
            }
        }
    }
    if out.is_empty() {
        bail!("no verses found in {}", module_dir.display());
    }
    Ok(out)
}

fn read_blocks(bzs: &Path, bzz: &Path) -> Result<Vec<Vec<u8>>> {
    let index = std::fs::read(bzs).with_context(|| format!("reading {}", bzs.display()))?;
    let data = std::fs::read(bzz).with_context(|| format!("reading {}", bzz.display()))?;
    index
        .chunks_exact(12)
        .map(|e| {
            let offset = u32::from_le_bytes(e[0..4].try_into().unwrap()) as usize;
            let size = u32::from_le_bytes(e[4..8].try_into().unwrap()) as usize;
            let compressed = data.get(offset..offset + size).context("block index points past the data file")?;
            let mut out = Vec::new();
            flate2::read::ZlibDecoder::new(compressed).read_to_end(&mut out).context("inflating a text block")?;
            Ok(out)
        })
        .collect()
}

/// OSIS verse markup to plain text. `<note>` (footnotes) and `<title>` (headings) are removed with their
/// content and replaced by a space so that the words on either side are not glued together.
pub fn osis_to_text(osis: &str) -> String {
    let mut text = String::with_capacity(osis.len());
    let mut skip_depth = 0usize;
    let mut rest = osis;
    while let Some(lt) = rest.find('<') {
        if skip_depth == 0 {
            text.push_str(&rest[..lt]);
        }
        let Some(gt) = rest[lt..].find('>') else {
            rest = "";
            break;
        };
        let tag = &rest[lt + 1..lt + gt];
        let name: String = tag.trim_start_matches('/').chars().take_while(|c| c.is_alphanumeric()).collect();
        if name == "note" || name == "title" {
            if tag.starts_with('/') {
                skip_depth = skip_depth.saturating_sub(1);
            } else if !tag.ends_with('/') {
                skip_depth += 1;
            }
            text.push(' ');
        }
        rest = &rest[lt + gt + 1..];
    }
    if skip_depth == 0 {
        text.push_str(rest);
    }
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    // A removed footnote right before punctuation leaves "word ," behind.
    let mut cleaned = String::with_capacity(collapsed.len());
    for c in collapsed.chars() {
        if matches!(c, ',' | '.' | ';' | ':' | '!' | '?') && cleaned.ends_with(' ') {
            cleaned.pop();
        }
        cleaned.push(c);
    }
    cleaned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn footnotes_and_titles_go_and_words_stay_apart() {
        let osis = r#"<title type="x">Heading</title><w lemma="a">In</w> <w>the</w> <w>beginning</w>, <w>God</w><note placement="foot"><reference>1:1 </reference>The word “God”.</note><w>created</w><note>x</note>."#;
        assert_eq!(osis_to_text(osis), "In the beginning, God created.");
    }

    #[test]
    fn self_closing_markers_keep_surrounding_text() {
        assert_eq!(osis_to_text(r#"<div sID="a"/>Jesus <lb/>wept.<chapter n="2"/>"#), "Jesus wept.");
    }
}
