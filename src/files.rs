//! Writing files so that a reader (or a kill) sees the old file or the new one, never half of one, and no
//! temporary file is left behind on any error path.
use anyhow::{Context, Result};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// A temporary file next to `path` (same file system, so it can be renamed onto it), deleted unless
/// persisted. It keeps `path`'s extension: some writers (libtorch's) choose the format by it.
pub fn temporary_beside(path: &Path) -> Result<tempfile::NamedTempFile> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let extension = path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
    // Results are for others to read too: tempfile's own default is private (0600).
    let permissions = std::fs::Permissions::from_mode(0o644);
    tempfile::Builder::new()
        .prefix(".")
        .suffix(&format!(".tmp{extension}"))
        .permissions(permissions)
        .tempfile_in(dir)
        .with_context(|| format!("writing {}: cannot create a temporary file in {}", path.display(), dir.display()))
}

/// Replaces `path` with `bytes` through a temporary file and a rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = temporary_beside(path)?;
    tmp.write_all(bytes)
        .and_then(|_| tmp.as_file().sync_data())
        .with_context(|| format!("writing {}", path.display()))?;
    tmp.persist(path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Replaces `path` with what `write` puts at the temporary path it is given (a writer that only takes a
/// path, such as libtorch's safetensors writer), through a rename.
pub fn write_atomically_with(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let tmp = temporary_beside(path)?;
    write(tmp.path())?;
    tmp.persist(path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
