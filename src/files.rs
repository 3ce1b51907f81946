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

/// An advisory lock on an output directory (`flock` on `<dir>/.ablate.lock`, which holds the owner's pid),
/// so that two processes never write one directory. Released when the last handle in this process is dropped
/// or the process ends, however it ends; locking a directory this process already holds shares the lock.
pub struct DirLock {
    _file: std::fs::File,
    dir: std::path::PathBuf,
}

static HELD: std::sync::Mutex<Vec<std::sync::Weak<DirLock>>> = std::sync::Mutex::new(Vec::new());

impl DirLock {
    pub fn acquire(dir: &Path) -> Result<std::sync::Arc<DirLock>> {
        let canonical = dir.canonicalize().with_context(|| format!("cannot open {}", dir.display()))?;
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|w| w.strong_count() > 0);
        if let Some(mine) = held.iter().filter_map(|w| w.upgrade()).find(|l| l.dir == canonical) {
            return Ok(mine);
        }
        let path = canonical.join(".ablate.lock");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        use std::os::unix::io::AsRawFd;
        // SAFETY: `flock` only reads the descriptor, which `file` keeps open for the call and beyond.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        if !locked {
            let owner = std::fs::read_to_string(&path).unwrap_or_default();
            let owner = owner.trim();
            anyhow::bail!(
                "{} is in use by another ablate process{}: wait for it to finish, or give another --out",
                dir.display(),
                if owner.is_empty() { String::new() } else { format!(" (pid {owner})") }
            );
        }
        file.set_len(0)?;
        write!(file, "{}", std::process::id())?;
        file.flush()?;
        let lock = std::sync::Arc::new(DirLock { _file: file, dir: canonical });
        held.push(std::sync::Arc::downgrade(&lock));
        Ok(lock)
    }
}

/// Fills a cache entry (a file or a directory that `complete` recognises) that several processes may need at
/// once — a pool's workers, a Slurm array's tasks, ranks on a shared file system, two terminals. The first
/// process to find it missing takes an exclusive `flock` on `<entry>.lock` beside it and runs `fill`; the
/// others say in one line that they wait, block on the lock, and then find the entry complete. `fill` must
/// write under a scratch name and rename into place, so that a killed fill leaves no half entry; the kernel
/// drops a lock when its holder ends however it ends, so a killed filler never blocks the next process,
/// which takes the lock and fills the entry itself. The lock file stays (removing it would let a third
/// process lock a new file while a second still holds the old one).
pub fn fill_cache_entry(
    entry: &Path,
    what: &str,
    complete: impl Fn(&Path) -> bool,
    fill: impl FnOnce() -> Result<()>,
) -> Result<()> {
    if complete(entry) {
        return Ok(());
    }
    let lock_path = lock_path_beside(entry);
    if let Some(dir) = lock_path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating the cache {}", dir.display()))?;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .with_context(|| format!("cannot create the lock file {}", lock_path.display()))?;
    if !flock(&file, libc::LOCK_EX | libc::LOCK_NB)? {
        eprintln!("ablate: waiting for another ablate process to finish fetching {what} into {}", entry.display());
        flock(&file, libc::LOCK_EX)?;
    }
    // A peer may have filled it while this process waited.
    if complete(entry) {
        return Ok(());
    }
    fill()?;
    if !complete(entry) {
        anyhow::bail!("fetching {what} left {} incomplete", entry.display());
    }
    Ok(())
}

/// `<entry>.lock`, beside the entry.
fn lock_path_beside(entry: &Path) -> std::path::PathBuf {
    let mut name = entry.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    entry.with_file_name(name)
}

/// `flock(file, operation)`: Ok(false) when a non-blocking request finds the lock held, retried when a
/// signal interrupts a blocking one.
fn flock(file: &std::fs::File, operation: libc::c_int) -> Result<bool> {
    use std::os::unix::io::AsRawFd;
    loop {
        // SAFETY: `flock` only reads the descriptor, which `file` keeps open for the call.
        if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
            return Ok(true);
        }
        let error = std::io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EWOULDBLOCK) if operation & libc::LOCK_NB != 0 => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(error).context("locking a cache entry"),
        }
    }
}
