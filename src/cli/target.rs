//! What a subcommand is pointed at: a recipe file found as given or under `recipes/`, loaded with the
//! command line's overrides, and the directory its results go to. Every subcommand that reads a recipe goes
//! through [`Target::load`] or [`Sweep::load`], so the lookup, the loading and the default output directory
//! are written once.
use std::path::{Path, PathBuf};

use ablate::recipe::{self, Recipe, RecipeError};
use ablate::run::complexity::{self, ComplexityRecipe};

use super::OverrideArgs;

/// A recipe of training runs, loaded, with its output directory.
pub struct Sweep {
    pub path: PathBuf,
    pub recipe: Recipe,
    pub out: PathBuf,
}

impl Sweep {
    /// Loads the training recipe `name` with `overrides`; the output directory is `out` or the default.
    pub fn load(name: &Path, smoke: bool, overrides: &recipe::Overrides, out: Option<PathBuf>) -> anyhow::Result<Self> {
        Self::from_file(find_recipe(name)?, smoke, overrides, out)
    }

    /// [`Sweep::load`] of a recipe file already found.
    fn from_file(
        path: PathBuf,
        smoke: bool,
        overrides: &recipe::Overrides,
        out: Option<PathBuf>,
    ) -> anyhow::Result<Self> {
        let recipe = recipe::load_with(&path, smoke, overrides)?;
        let out = out.unwrap_or_else(|| default_out(&recipe));
        Ok(Self { path, recipe, out })
    }

    /// The committed reference results of this recipe (`results/<name>` beside its `recipes/` folder).
    pub fn reference(&self) -> PathBuf {
        reference_dir(&self.path, &self.recipe.name)
    }
}

/// A recipe file as the subcommands that take either kind read it.
// One Target per command, built once: its size does not matter, boxing would only add noise.
#[allow(clippy::large_enum_variant)]
pub enum Target {
    Sweep(Sweep),
    /// A complexity benchmark (`complexity:` at the top): timed points, no training runs, no overrides.
    Benchmark {
        path: PathBuf,
        recipe: ComplexityRecipe,
        out: PathBuf,
    },
}

impl Target {
    pub fn load(name: &Path, smoke: bool, overrides: &OverrideArgs, out: Option<PathBuf>) -> anyhow::Result<Self> {
        let path = find_recipe(name)?;
        if !complexity::is_complexity_recipe(&path) {
            return Ok(Target::Sweep(Sweep::from_file(path, smoke, &overrides.parse()?, out)?));
        }
        if !overrides.is_empty() {
            anyhow::bail!(
                "{}: a complexity benchmark takes no overrides (edit its lengths and variants in the file)",
                path.display()
            );
        }
        let recipe = complexity::load(&path, smoke)?;
        let name = recipe.name.clone().unwrap_or_else(|| "complexity".into());
        let out = out.unwrap_or_else(|| output_root(smoke).join(name));
        Ok(Target::Benchmark { path, recipe, out })
    }
}

/// `auto` (CUDA when available), `cpu`, `cuda` or `cuda:N`, as an error the CLI prints.
pub fn device(spec: &str) -> anyhow::Result<tch::Device> {
    ablate::parse_device(spec).map_err(anyhow::Error::msg)
}

/// A recipe file as given, else under the repository's `recipes/`.
pub fn find_recipe(name: &Path) -> anyhow::Result<PathBuf> {
    // bin/ablate points at the repository's recipes/; a binary run directly falls back to the recipes/ two
    // levels above target/release/.
    let dir = std::env::var_os("ABLATE_RECIPES_DIR").map(PathBuf::from).or_else(|| {
        let exe = std::env::current_exe().ok()?;
        Some(exe.parent()?.parent()?.parent()?.join("recipes"))
    });
    recipe::resolve_path(name, dir.as_deref()).ok_or_else(|| {
        anyhow::Error::new(RecipeError {
            file: name.display().to_string(),
            line: 0,
            message: "no such recipe (looked as given and under recipes/)".into(),
            argument: None,
        })
    })
}

/// Where runs go when no `--out` is given: `runs/`, or `target/smoke/` with --smoke.
fn output_root(smoke: bool) -> PathBuf {
    PathBuf::from(if smoke { "target/smoke" } else { "runs" })
}

/// Where a recipe's runs go by default: `runs/<name>` (`target/smoke/<name>` with --smoke), with a suffix
/// naming the overrides, so runs with and without them never share a directory. The committed reference
/// results in `results/<name>` are only written with an explicit --out.
pub fn default_out(recipe: &Recipe) -> PathBuf {
    let name = if recipe.overrides.is_empty() {
        recipe.name.clone()
    } else {
        format!("{}+{}", recipe.name, recipe.overrides.slug())
    };
    output_root(recipe.smoke).join(name)
}

/// The committed reference results of a recipe: `results/<name>` beside the `recipes/` folder it is in.
pub fn reference_dir(recipe_path: &Path, name: &str) -> PathBuf {
    let folder = recipe_path.parent().unwrap_or(Path::new("."));
    let root = folder.parent().unwrap_or(Path::new("."));
    root.join("results").join(name)
}
