//! A CPU worker's share of the cores can grow while it trains. A pool of local workers
//! (`run::scale::run_workers`) splits the cores evenly; when a worker finishes its shard, the pool gives its
//! cores to the workers still training by writing each one's new thread count to the file named by
//! [`THREADS_FILE_ENV`]. The training loop looks at that file between steps, a few times a second
//! ([`follow_share`]), so the last runs of a sweep do not leave cores idle.
//!
//! A file rather than a signal: a worker still starting up (libtorch loading) would be killed by a signal
//! it has no handler for yet.
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Set by the pool in each CPU worker's environment: the file that holds the worker's thread count.
pub const THREADS_FILE_ENV: &str = "ABLATE_THREADS_FILE";

/// How often the loop looks at the file: a stat costs microseconds, a step milliseconds.
const LOOK_EVERY: Duration = Duration::from_millis(200);

static THREADS_FILE: LazyLock<Option<PathBuf>> =
    LazyLock::new(|| std::env::var_os(THREADS_FILE_ENV).map(PathBuf::from));

/// When the loop last looked at the file, and the modification time it saw then.
static LAST_LOOK: Mutex<Option<(Instant, Option<SystemTime>)>> = Mutex::new(None);

/// Between two steps: when the pool has written a new share for this worker, sets libtorch's intra-op
/// threads to it and returns the new count (None when nothing changed, and always outside a pool). An
/// unreadable file leaves the threads as they are: the share is an optimisation, never a reason to stop.
pub fn follow_share() -> Option<usize> {
    let file = THREADS_FILE.as_ref()?;
    let mut last = LAST_LOOK.lock().ok()?;
    let now = Instant::now();
    if last.is_some_and(|(at, _)| now.duration_since(at) < LOOK_EVERY) {
        return None;
    }
    let seen = last.and_then(|(_, seen)| seen);
    let modified = std::fs::metadata(file).and_then(|m| m.modified()).ok();
    *last = Some((now, modified.or(seen)));
    if modified.is_none() || modified == seen {
        return None;
    }
    let threads: usize = std::fs::read_to_string(file).ok()?.trim().parse().ok().filter(|&n| n >= 1)?;
    if threads == tch::get_num_threads() as usize {
        return None;
    }
    tch::set_num_threads(threads as i32);
    Some(threads)
}
