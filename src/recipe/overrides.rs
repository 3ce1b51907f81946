//! Changes to a recipe given on the command line, as nanoGPT, Hydra and the Lightning CLI take them:
//! `key=value` overrides, `--sweep key=v1,v2` axes and `--seeds 0,1,2`. They are laid over the file
//! before expansion, so they get the file's validation (an error names the argument instead of a line),
//! change the config hash of the runs they touch, and are recorded in `recipe.resolved.yaml`.
use serde_yaml::Value;

use super::RecipeError;

/// The command line's changes to one recipe, each with the argument it came from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// `key=value`: the key takes this value in every run (a swept key stops being swept).
    pub set: Vec<(String, Value, String)>,
    /// `--sweep key=v1,v2`: replaces the key's axis, or adds one after the recipe's.
    pub sweep: Vec<(String, Vec<Value>, String)>,
    /// `--seeds 0,1,2`: replaces the recipe's seeds.
    pub seeds: Option<(Vec<u64>, String)>,
}

fn bad(argument: &str, message: impl Into<String>) -> RecipeError {
    RecipeError { file: String::new(), line: 0, message: message.into(), argument: Some(argument.to_string()) }
}

/// `key=value` split, with the key checked for shape (the schema check comes with the recipe).
fn key_value(argument: &str) -> Result<(String, &str), RecipeError> {
    let Some((key, value)) = argument.split_once('=') else {
        return Err(bad(argument, "expected key=value, e.g. train.steps=300"));
    };
    let key = key.trim();
    let well_formed = !key.is_empty()
        && key.split('.').all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    if !well_formed {
        return Err(bad(argument, format!("`{key}` is not a dotted config key such as transformer.heads")));
    }
    if key == "train.seed" {
        return Err(bad(argument, "set the seeds with --seeds (e.g. --seeds 0,1,2)"));
    }
    if value.trim().is_empty() {
        return Err(bad(argument, format!("no value after `{key}=`")));
    }
    Ok((key.to_string(), value))
}

/// A YAML value written on the command line: `300`, `rope`, `[1, 2]`, `{dataset: mnist}`.
fn yaml(argument: &str, text: &str) -> Result<Value, RecipeError> {
    serde_yaml::from_str(text).map_err(|e| {
        let message = e.to_string();
        let message = message.split(" at line ").next().unwrap_or(&message).to_string();
        bad(argument, format!("`{text}` is not a YAML value: {message}"))
    })
}

impl Overrides {
    /// Reads `key=value` arguments, `--sweep` arguments and the `--seeds` list.
    pub fn parse(set: &[String], sweep: &[String], seeds: Option<&str>) -> Result<Self, RecipeError> {
        let mut out = Overrides::default();
        for argument in set {
            let (key, text) = key_value(argument)?;
            if out.set.iter().any(|(k, _, _)| *k == key) {
                return Err(bad(argument, format!("`{key}` is given twice")));
            }
            let value = yaml(argument, text)?;
            out.set.push((key, value, argument.clone()));
        }
        for text in sweep {
            let argument = format!("--sweep {text}");
            let (key, list) = key_value(text).map_err(|e| RecipeError { argument: Some(argument.clone()), ..e })?;
            if out.sweep.iter().any(|(k, _, _)| *k == key) {
                return Err(bad(&argument, format!("`{key}` is swept twice")));
            }
            if out.set.iter().any(|(k, _, _)| *k == key) {
                return Err(bad(&argument, format!("`{key}` is both set (`{key}=…`) and swept; give one")));
            }
            let values = match yaml(&argument, &format!("[{list}]"))? {
                Value::Sequence(values) if !values.is_empty() => values,
                _ => {
                    return Err(bad(
                        &argument,
                        "expected a comma-separated list of values, e.g. transformer.heads=1,4,16",
                    ))
                }
            };
            out.sweep.push((key, values, argument));
        }
        if let Some(text) = seeds {
            let argument = format!("--seeds {text}");
            let parsed: Result<Vec<u64>, _> = text.split(',').map(|s| s.trim().parse::<u64>()).collect();
            let list = parsed
                .map_err(|_| bad(&argument, "expected a comma-separated list of non-negative integers, e.g. 0,1,2"))?;
            let mut unique = list.clone();
            unique.sort_unstable();
            unique.dedup();
            if unique.len() != list.len() {
                return Err(bad(&argument, "a seed is listed twice"));
            }
            out.seeds = Some((list, argument));
        }
        Ok(out)
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.sweep.is_empty() && self.seeds.is_none()
    }

    /// These overrides and one more `key=value`, last in order (an earlier value of the key is dropped):
    /// how a data-parallel launch records its number of processes as `train.world_size`.
    pub fn with(mut self, argument: &str) -> Result<Self, RecipeError> {
        let (key, text) = key_value(argument)?;
        let value = yaml(argument, text)?;
        self.set.retain(|(k, _, _)| *k != key);
        self.set.push((key, value, argument.to_string()));
        Ok(self)
    }

    /// The arguments that give these overrides again (for worker processes and Slurm scripts).
    pub fn args(&self) -> Vec<String> {
        let mut out: Vec<String> = self.set.iter().map(|(_, _, a)| a.clone()).collect();
        for (_, _, argument) in &self.sweep {
            out.push("--sweep".into());
            out.push(argument.trim_start_matches("--sweep ").to_string());
        }
        if let Some((_, argument)) = &self.seeds {
            out.push("--seeds".into());
            out.push(argument.trim_start_matches("--seeds ").to_string());
        }
        out
    }

    /// Each override as written, for `recipe.resolved.yaml` and messages.
    pub fn describe(&self) -> Vec<String> {
        let mut out: Vec<String> = self.set.iter().map(|(_, _, a)| a.clone()).collect();
        out.extend(self.sweep.iter().map(|(_, _, a)| a.clone()));
        out.extend(self.seeds.iter().map(|(_, a)| a.clone()));
        out
    }

    /// A readable directory-name suffix naming the overrides (`train.steps=300+seeds=0`), hashed when long,
    /// so that runs with overrides never share a directory with runs without them.
    pub fn slug(&self) -> String {
        let mut parts: Vec<String> = self.set.iter().map(|(_, _, a)| a.clone()).collect();
        parts.extend(self.sweep.iter().map(|(_, _, a)| format!("sweep={}", a.trim_start_matches("--sweep "))));
        parts.extend(self.seeds.iter().map(|(_, a)| format!("seeds={}", a.trim_start_matches("--seeds "))));
        let text = parts.join("+");
        let safe: String =
            text.chars().map(|c| if c.is_ascii_alphanumeric() || "._=,+-".contains(c) { c } else { '_' }).collect();
        if safe.len() <= 80 {
            return safe;
        }
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(text.as_bytes());
        let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
        format!("{}-{hex}", &safe[..60])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_parse_into_values_and_back() {
        let o = Overrides::parse(
            &strings(&["train.steps=300", "transformer.pe=rope", "data.images={dataset: mnist}"]),
            &strings(&["transformer.heads=1,4,16"]),
            Some("0,2"),
        )
        .unwrap();
        assert_eq!(o.set[0].1, Value::from(300));
        assert_eq!(o.set[1].1, Value::from("rope"));
        assert!(o.set[2].1.is_mapping());
        assert_eq!(o.sweep[0].1, vec![Value::from(1), Value::from(4), Value::from(16)]);
        assert_eq!(o.seeds.as_ref().unwrap().0, [0, 2]);
        let again = Overrides::parse(
            &o.args().iter().take(3).cloned().collect::<Vec<_>>(),
            &[o.args()[4].clone()],
            Some(&o.args()[6]),
        )
        .unwrap();
        assert_eq!(again, o);
        let short = Overrides::parse(&strings(&["data.images={dataset: mnist}"]), &[], Some("0,2")).unwrap();
        assert_eq!(short.slug(), "data.images=_dataset__mnist_+seeds=0,2");
        assert_eq!(o.slug().len(), 69, "a long one is cut and hashed: {}", o.slug());
        assert!(Overrides::parse(&[], &[], None).unwrap().is_empty());
        let long = Overrides::parse(&[format!("data.text={}", "x".repeat(200))], &[], None).unwrap();
        assert_eq!(long.slug().len(), 69);
    }

    #[test]
    fn bad_arguments_are_one_line_naming_the_argument() {
        type Case<'a> = (&'a [&'a str], &'a [&'a str], Option<&'a str>, &'a str);
        let cases: [Case; 10] = [
            (&["train.steps"], &[], None, "argument `train.steps`: expected key=value"),
            (&["=3"], &[], None, "is not a dotted config key"),
            (&["train..steps=3"], &[], None, "is not a dotted config key"),
            (&["train.steps="], &[], None, "no value after `train.steps=`"),
            (&["train.seed=3"], &[], None, "--seeds"),
            (&["a.b=1", "a.b=2"], &[], None, "given twice"),
            (&["a.b=[1"], &[], None, "is not a YAML value"),
            (&["a.b=1"], &["a.b=1,2"], None, "argument `--sweep a.b=1,2`: `a.b` is both set"),
            (&[], &["a.b=1", "a.b=2"], None, "swept twice"),
            (&[], &[], Some("0,x"), "argument `--seeds 0,x`: expected a comma-separated list"),
        ];
        for (set, sweep, seeds, expected) in cases {
            let e = Overrides::parse(&strings(set), &strings(sweep), seeds).unwrap_err().to_string();
            assert!(e.contains(expected) && !e.contains('\n'), "{set:?} {sweep:?} {seeds:?}: {e}");
        }
        assert!(Overrides::parse(&[], &[], Some("1,1")).unwrap_err().to_string().contains("twice"));
        assert!(Overrides::parse(&[], &strings(&["a.b="]), None).unwrap_err().to_string().contains("--sweep a.b="));
    }
}
