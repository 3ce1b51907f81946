//! English–Spanish sentence pairs: the World English Bible (Debian `sword-text-web`) and the Reina-Valera
//! 1909 (`sword-text-sparv`), both public domain, aligned by verse reference (testament and index in the
//! shared versification), as the data notes describe. Cached as tab-separated pairs.
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::Path;

use crate::data::{cached_files, fetch_deb};

fn module_verses(package: &str, work: &Path) -> Result<HashMap<(usize, usize), String>> {
    let dir = work.join(package);
    std::fs::create_dir_all(&dir)?;
    let unpacked = fetch_deb(package, &dir, "the parallel Bible")?;
    let ztext = unpacked.join("usr/share/sword/modules/texts/ztext");
    let module = std::fs::read_dir(&ztext)
        .with_context(|| format!("{package} has no {}", ztext.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.join("ot.bzs").exists() || p.join("nt.bzs").exists())
        .with_context(|| format!("no SWORD ztext module in {package}"))?;
    Ok(super::sword::read_verses(&module)?.into_iter().map(|(t, i, v)| ((t, i), v)).collect())
}

/// Every verse present in both translations, in canonical order: (English, Spanish), one line each.
pub fn bible_en_es() -> Result<Vec<(String, String)>> {
    let dir = cached_files(
        "bible-en-es",
        &["pairs.tsv"],
        "the English–Spanish Bible pairs (Debian sword-text-web and sword-text-sparv)",
        |partial, work| {
            let en = module_verses("sword-text-web", work)?;
            let es = module_verses("sword-text-sparv", work)?;
            let mut keys: Vec<&(usize, usize)> = en.keys().filter(|k| es.contains_key(k)).collect();
            keys.sort();
            let clean = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
            let mut out = String::new();
            for k in keys {
                let (e, s) = (clean(&en[k]), clean(&es[k]));
                if !e.is_empty() && !s.is_empty() {
                    out.push_str(&format!("{e}\t{s}\n"));
                }
            }
            std::fs::write(partial.join("pairs.tsv"), out)?;
            Ok(())
        },
    )?;
    let text = std::fs::read_to_string(dir.join("pairs.tsv"))?;
    let pairs: Vec<(String, String)> =
        text.lines().filter_map(|l| l.split_once('\t')).map(|(e, s)| (e.to_string(), s.to_string())).collect();
    if pairs.len() < 30_000 {
        bail!("{} holds only {} pairs: delete it to fetch again", dir.join("pairs.tsv").display(), pairs.len());
    }
    Ok(pairs)
}
