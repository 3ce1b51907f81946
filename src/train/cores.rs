//! A CPU worker's share of the cores can grow while it trains. A pool of local workers
//! (`run::scale::run_workers`) splits the cores evenly; when a worker finishes its shard, the pool gives its
//! cores to the workers still training by writing each one's new thread count to the file named by
//! [`THREADS_FILE_ENV`]. The training loop looks at that file between steps, a few times a second
//! ([`follow_share`]), so the last runs of a sweep do not leave cores idle.
//!
//! A file rather than a signal: a worker still starting up (libtorch loading) would be killed by a signal
//! it has no handler for yet.
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// Set by the pool in each CPU worker's environment: the file that holds the worker's thread count.
pub const THREADS_FILE_ENV: &str = "ABLATE_THREADS_FILE";

/// How often the loop looks at the file: a stat costs microseconds, a step milliseconds.
const LOOK_EVERY: Duration = Duration::from_millis(200);

struct Watch {
    file: Option<PathBuf>,
    last_look: Option<Instant>,
    seen: Option<SystemTime>,
}

static WATCH: Mutex<Watch> = Mutex::new(Watch { file: None, last_look: None, seen: None });

/// Between two steps: when the pool has written a new share for this worker, sets libtorch's intra-op
/// threads to it and returns the new count (None when nothing changed, and always outside a pool). An
/// unreadable file leaves the threads as they are: the share is an optimisation, never a reason to stop.
pub fn follow_share() -> Option<usize> {
    let mut watch = WATCH.lock().ok()?;
    let now = Instant::now();
    if watch.last_look.is_some_and(|t| now.duration_since(t) < LOOK_EVERY) {
        return None;
    }
    if watch.last_look.is_none() {
        watch.file = std::env::var_os(THREADS_FILE_ENV).map(PathBuf::from);
    }
    watch.last_look = Some(now);
    let file = watch.file.clone()?;
    let modified = std::fs::metadata(&file).and_then(|m| m.modified()).ok()?;
    if watch.seen == Some(modified) {
        return None;
    }
    watch.seen = Some(modified);
    let threads: usize = std::fs::read_to_string(&file).ok()?.trim().parse().ok().filter(|&n| n >= 1)?;
    if threads == tch::get_num_threads() as usize {
        return None;
    }
    tch::set_num_threads(threads as i32);
    Some(threads)
}
