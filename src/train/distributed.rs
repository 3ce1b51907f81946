//! Data-parallel training on libtorch's torch.distributed (c10d): a TCPStore rendezvous and a Gloo process
//! group (`csrc/distributed.cpp`), the objects `torch.distributed.init_process_group("gloo")` builds.
//!
//! What a data-parallel step does, and why it equals one process with the whole batch:
//! - every rank draws the *global* batch (its generator is seeded by (seed, step), the same on every rank)
//!   and keeps its own rows ([`BatchShard::take`]), so `W` ranks with batch B see exactly the rows one process
//!   with batch W·B sees; from there on each rank draws from its own stream (dropout);
//! - after backward the gradients are averaged with one all-reduce over a flat buffer (in buckets), which
//!   also carries the loss and a stop flag, so every rank clips, steps and stops identically;
//! - rank 0's initial (or resumed) weights and moments are broadcast before the first step.
//!
//! The group is set once per process ([`join`]) and read by the training loop ([`current`]).
use anyhow::{bail, Context, Result};
use std::ffi::{c_char, CStr, CString};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use tch::{Kind, Tensor};
use torch_sys::C_tensor;

#[repr(C)]
struct RawGroup {
    _opaque: [u8; 0],
}

extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn ablate_dist_init(
        host: *const c_char,
        port: i32,
        rank: i32,
        world: i32,
        client_only: bool,
        prefix: *const c_char,
        timeout_ms: i64,
        nccl: bool,
        out: *mut *mut RawGroup,
    ) -> *mut c_char;
    fn ablate_dist_all_reduce_sum(group: *mut RawGroup, tensor: *mut C_tensor) -> *mut c_char;
    fn ablate_dist_broadcast(group: *mut RawGroup, tensor: *mut C_tensor, root: i32) -> *mut c_char;
    fn ablate_dist_store_set(group: *mut RawGroup, key: *const c_char, data: *const u8, len: usize) -> *mut c_char;
    fn ablate_dist_store_get(
        group: *mut RawGroup,
        key: *const c_char,
        data: *mut *mut u8,
        len: *mut usize,
    ) -> *mut c_char;
    fn ablate_dist_free_bytes(data: *mut u8);
    fn ablate_dist_shutdown(group: *mut RawGroup, clean: bool) -> *mut c_char;
    fn ablate_free_error(message: *mut c_char);
}

/// The shim's error message as a `Result` (it never throws into Rust).
fn check(error: *mut c_char, what: &str) -> Result<()> {
    if error.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null result is a NUL-terminated string the shim allocated; read once, then handed back
    // to the shim's deallocator exactly once.
    let message = unsafe { CStr::from_ptr(error) }.to_string_lossy().replace('\n', " ");
    // SAFETY: freed once, by the shim's deallocator, after the message was copied.
    unsafe { ablate_free_error(error) };
    bail!("{what}: {}", message.trim())
}

/// Where and as whom this process joins: what torchrun or Slurm put in the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Membership {
    pub rank: usize,
    pub world: usize,
    /// This process's index among the group's processes on its node (its GPU on a CUDA machine).
    pub local_rank: usize,
    pub host: String,
    pub port: u16,
    /// torchrun's agent already serves the store at host:port; every rank connects as a client.
    pub agent_store: bool,
    /// Keys of this launch in the store (torchrun's restarts each get their own).
    pub prefix: String,
    /// How long a collective or a store wait may take before the rank gives up.
    pub timeout: Duration,
}

/// Which c10d backend carries the collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Gloo: CPU tensors (and CUDA ones, through the host).
    Gloo,
    /// NCCL: CUDA tensors, GPU to GPU.
    Nccl,
}

/// A joined process group.
pub struct Group {
    raw: NonNull<RawGroup>,
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    pub backend: Backend,
    /// Where host-side values (evaluation sums, flags) go for a collective: NCCL reduces only GPU tensors.
    scalars_on: tch::Device,
    /// Seconds spent in collectives since the last [`take_comm_seconds`](Self::take_comm_seconds).
    comm_seconds: Mutex<f64>,
    /// Store keys are used once: each exchange takes the next number.
    exchanges: AtomicU64,
}

// SAFETY: the raw group is a c10d TCPStore plus ProcessGroupGloo, both safe to call from any thread (c10d
// guards them internally); ablate calls them from one training thread at a time, in the same order on every
// rank, as c10d requires.
unsafe impl Send for Group {}
// SAFETY: as for Send: shared references only issue calls c10d serialises itself.
unsafe impl Sync for Group {}

static GROUP: OnceLock<Group> = OnceLock::new();

/// The process group this process joined, if it is one of several.
pub fn current() -> Option<&'static Group> {
    GROUP.get()
}

/// Ends this process's group, once, before it exits (`torch.distributed.destroy_process_group`): NCCL's
/// background threads would otherwise outlive `main`, which torchrun can count as a failed job. `clean`
/// after a finished run; otherwise the backend is aborted without waiting on peers. Nothing without a group.
pub fn shutdown(clean: bool) -> Result<()> {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let Some(group) = GROUP.get() else { return Ok(()) };
    if DONE.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    // SAFETY: the group is alive for the whole process (never freed); the shim catches every C++ exception.
    check(unsafe { ablate_dist_shutdown(group.raw.as_ptr(), clean) }, "shutting the process group down")
}

/// Processes training together: the group's size, or 1.
pub fn world_size() -> i64 {
    current().map_or(1, |g| g.world as i64)
}

/// Joins the group described by `membership` (once per process) over `backend` and returns it; `device` is
/// this rank's (NCCL's collectives run there).
pub fn join(membership: &Membership, backend: Backend, device: tch::Device) -> Result<&'static Group> {
    if GROUP.get().is_some() {
        bail!("this process already joined a process group");
    }
    let host = CString::new(membership.host.clone()).context("MASTER_ADDR holds a NUL byte")?;
    let prefix = CString::new(membership.prefix.clone()).context("the store prefix holds a NUL byte")?;
    let mut raw = std::ptr::null_mut();
    // SAFETY: the strings outlive the call; `raw` receives an owned group (freed never: it lives as long as
    // the process, like torch.distributed's default group); the shim catches every C++ exception.
    let error = unsafe {
        ablate_dist_init(
            host.as_ptr(),
            membership.port as i32,
            membership.rank as i32,
            membership.world as i32,
            membership.agent_store,
            prefix.as_ptr(),
            membership.timeout.as_millis() as i64,
            backend == Backend::Nccl,
            &mut raw,
        )
    };
    let what = format!(
        "rank {} of {} joining the group at {}:{}",
        membership.rank, membership.world, membership.host, membership.port
    );
    check(error, &what)?;
    let raw = NonNull::new(raw).context("the process group was not created")?;
    let group = Group {
        raw,
        rank: membership.rank,
        world: membership.world,
        local_rank: membership.local_rank,
        backend,
        scalars_on: if backend == Backend::Nccl { device } else { tch::Device::Cpu },
        comm_seconds: Mutex::new(0.0),
        exchanges: AtomicU64::new(0),
    };
    GROUP.set(group).map_err(|_| anyhow::anyhow!("this process already joined a process group"))?;
    Ok(GROUP.get().expect("just set"))
}

/// Gradients are all-reduced in buckets of at most this many bytes (DDP's default bucket size).
const BUCKET_BYTES: i64 = 25 << 20;

impl Group {
    fn timed<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        // NCCL's wait() only makes the GPU's stream wait, not the host: without a synchronisation on both
        // sides, the compute queued before the collective would be timed as communication and the
        // collective itself as the next compute. Gloo's collectives block the host already.
        let settle = || {
            if let (Backend::Nccl, tch::Device::Cuda(i)) = (self.backend, self.scalars_on) {
                tch::Cuda::synchronize(i as i64);
            }
        };
        settle();
        let tick = Instant::now();
        let out = f();
        settle();
        *self.comm_seconds.lock().unwrap_or_else(|e| e.into_inner()) += tick.elapsed().as_secs_f64();
        out
    }

    /// Seconds spent in collectives since the last call (waiting for a slower rank included).
    pub fn take_comm_seconds(&self) -> f64 {
        std::mem::take(&mut *self.comm_seconds.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Sums `tensor` (contiguous) over the ranks, in place.
    pub fn all_reduce_sum(&self, tensor: &Tensor) -> Result<()> {
        self.timed(|| {
            // SAFETY: `tensor` is a live handle for the call; the collective writes into its storage, which
            // the handle shares (as any in-place op on a `&Tensor` in tch); the shim catches exceptions.
            let error = unsafe { ablate_dist_all_reduce_sum(self.raw.as_ptr(), tensor.as_ptr() as *mut C_tensor) };
            check(error, &format!("rank {}: all-reduce across {} ranks", self.rank, self.world))
        })
    }

    /// Copies rank 0's `tensor` into every rank's, in place.
    pub fn broadcast(&self, tensor: &Tensor) -> Result<()> {
        self.timed(|| {
            // SAFETY: as in `all_reduce_sum`.
            let error = unsafe { ablate_dist_broadcast(self.raw.as_ptr(), tensor.as_ptr() as *mut C_tensor, 0) };
            check(error, &format!("rank {}: broadcast from rank 0", self.rank))
        })
    }

    fn store_set(&self, key: &str, bytes: &[u8]) -> Result<()> {
        let k = CString::new(key)?;
        // SAFETY: key and bytes outlive the call; the shim copies them.
        let error = unsafe { ablate_dist_store_set(self.raw.as_ptr(), k.as_ptr(), bytes.as_ptr(), bytes.len()) };
        check(error, &format!("rank {}: writing {key} to the store", self.rank))
    }

    fn store_get(&self, key: &str) -> Result<Vec<u8>> {
        let k = CString::new(key)?;
        let (mut data, mut len) = (std::ptr::null_mut(), 0usize);
        // SAFETY: the shim waits for the key, then fills `data` with a malloc'ed buffer of `len` bytes that
        // is copied here and freed by the shim's own deallocator once.
        let error = unsafe { ablate_dist_store_get(self.raw.as_ptr(), k.as_ptr(), &mut data, &mut len) };
        check(error, &format!("rank {}: waiting for {key} in the store (another rank is gone or stuck)", self.rank))?;
        // SAFETY: on success `data` points at `len` initialised bytes the shim allocated for this call.
        let bytes = unsafe { std::slice::from_raw_parts(data, len) }.to_vec();
        // SAFETY: the buffer is freed once, by the shim that allocated it, after the copy above.
        unsafe { ablate_dist_free_bytes(data) };
        Ok(bytes)
    }

    fn next_key(&self, what: &str) -> String {
        format!("{what}/{}", self.exchanges.fetch_add(1, Ordering::SeqCst))
    }

    /// Rank 0's `bytes` on every rank (other ranks pass anything; it is ignored).
    pub fn share_from_rank0(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        let key = self.next_key("share");
        self.timed(|| {
            if self.rank == 0 {
                self.store_set(&key, bytes)?;
                Ok(bytes.to_vec())
            } else {
                self.store_get(&key)
            }
        })
    }

    /// Checks that every rank has the same `value` of `what` (the recipe, the build): if one differs, every
    /// rank fails with the same line naming the first that does.
    pub fn agree(&self, what: &str, value: &str) -> Result<()> {
        let key = self.next_key("agree");
        self.store_set(&format!("{key}/{}", self.rank), value.as_bytes())?;
        let rank0 = self.store_get(&format!("{key}/0"))?;
        for r in 1..self.world {
            let theirs = self.store_get(&format!("{key}/{r}"))?;
            if theirs != rank0 {
                bail!(
                    "rank {r} has a different {what} than rank 0 ({} against {}): every rank must run the same \
                     recipe, overrides and ablate build",
                    String::from_utf8_lossy(&theirs),
                    String::from_utf8_lossy(&rank0)
                );
            }
        }
        Ok(())
    }

    /// Replaces `grads` by their mean over the ranks, and `extras` (scalars riding in the same buffer: the
    /// loss, flags) by theirs. One flat buffer, all-reduced in buckets.
    pub fn average(&self, grads: &[Tensor], extras: &[f64]) -> Result<(Vec<Tensor>, Vec<f64>)> {
        let _guard = tch::no_grad_guard();
        let (kind, device) = grads.first().map_or((Kind::Float, tch::Device::Cpu), |g| (g.kind(), g.device()));
        let mut parts: Vec<Tensor> = grads.iter().map(|g| g.reshape([-1])).collect();
        parts.push(Tensor::from_slice(extras).to_kind(kind).to_device(device));
        let mut flat = Tensor::cat(&parts, 0);
        let n = flat.numel() as i64;
        let per_bucket = (BUCKET_BYTES / flat.kind().elt_size_in_bytes() as i64).max(1);
        let mut start = 0;
        while start < n {
            let len = per_bucket.min(n - start);
            self.all_reduce_sum(&flat.narrow(0, start, len))?;
            start += len;
        }
        let _ = flat.g_div_scalar_(self.world as f64);
        let mut offset = 0;
        let mut averaged = Vec::with_capacity(grads.len());
        for g in grads {
            let k = g.numel() as i64;
            averaged.push(flat.narrow(0, offset, k).view(g.size().as_slice()));
            offset += k;
        }
        let tail = Vec::<f64>::try_from(flat.narrow(0, offset, extras.len() as i64).to_kind(Kind::Double))?;
        Ok((averaged, tail))
    }

    /// Rank 0's parameters (or any tensor) on every rank.
    pub fn broadcast_all(&self, tensors: &[&Tensor]) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for t in tensors {
            self.broadcast(t)?;
        }
        Ok(())
    }

    /// Sums of `K` values over the ranks (f64, on the host).
    pub fn sum<const K: usize>(&self, values: [f64; K]) -> Result<[f64; K]> {
        let t = Tensor::from_slice(&values).to_device(self.scalars_on);
        self.all_reduce_sum(&t)?;
        let v = Vec::<f64>::try_from(t.to_device(tch::Device::Cpu))?;
        Ok(std::array::from_fn(|i| v[i]))
    }
}

/// Sums `f` over `items`: in one process over all of them, in order; in a group, each rank over its share
/// (every `world`-th item from its rank) and then across the ranks. What held-out evaluations use, so that
/// W ranks score the held-out set in 1/W of the time and agree on the result.
pub fn sum_over_share<T, const K: usize>(items: &[T], mut f: impl FnMut(&T) -> [f64; K]) -> Result<[f64; K]> {
    let (rank, world) = current().map_or((0, 1), |g| (g.rank, g.world));
    let mut total = [0.0; K];
    for item in items.iter().skip(rank).step_by(world) {
        for (t, v) in total.iter_mut().zip(f(item)) {
            *t += v;
        }
    }
    match current() {
        Some(g) => g.sum(total),
        None => Ok(total),
    }
}

/// This rank's rows of a step's global batch.
pub struct BatchShard {
    pub rank: usize,
    pub world: usize,
    /// The seed this rank's generator takes once it has its rows (dropout, masks drawn after the batch).
    own_seed: i64,
}

impl BatchShard {
    /// The whole batch: one process.
    pub fn whole() -> Self {
        Self { rank: 0, world: 1, own_seed: 0 }
    }

    /// Rank `rank` of `world` at a step whose own streams start from `own_seed`.
    pub fn of(rank: usize, world: usize, own_seed: i64) -> Self {
        Self { rank, world, own_seed }
    }

    /// The global batch size for a per-rank `batch`: what to draw.
    pub fn global(&self, batch: i64) -> i64 {
        batch * self.world as i64
    }

    /// This rank's rows of each tensor of the global batch (their first dimension, in equal parts), after
    /// which the generator switches to this rank's own stream. In one process: the tensors as they are.
    pub fn take<const N: usize>(&self, tensors: [Tensor; N]) -> [Tensor; N] {
        if self.world == 1 {
            return tensors;
        }
        let out = tensors.map(|t| {
            let rows = t.size()[0] / self.world as i64;
            t.narrow(0, rows * self.rank as i64, rows)
        });
        tch::manual_seed(self.own_seed);
        out
    }

    /// The index range of this rank's rows in a global batch of `n` rows.
    pub fn range(&self, n: usize) -> std::ops::Range<usize> {
        let rows = n / self.world;
        rows * self.rank..rows * (self.rank + 1)
    }

    /// [`range`](Self::range) for a list drawn as the global batch, then the switch to the rank's stream.
    pub fn take_items<'a, T>(&self, items: &'a [T]) -> &'a [T] {
        if self.world == 1 {
            return items;
        }
        let r = self.range(items.len());
        tch::manual_seed(self.own_seed);
        &items[r]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rank_keeps_only_its_rows_of_the_global_batch_then_draws_from_its_own_stream() {
        let name = "train::distributed::tests::each_rank_keeps_only_its_rows_of_the_global_batch_then_draws_from_its_own_stream";
        crate::alone_in_a_process(name, rank_rows_and_stream);
    }

    fn rank_rows_and_stream() {
        let batch = Tensor::arange(12, (Kind::Int64, tch::Device::Cpu)).view([6, 2]);
        let shard = BatchShard::of(1, 3, 42);
        assert_eq!(shard.global(2), 6);
        let [rows] = shard.take([batch.shallow_clone()]);
        assert_eq!(Vec::<i64>::try_from(rows.reshape([-1])).unwrap(), vec![4, 5, 6, 7]);
        // After taking its rows the rank draws what a generator seeded with its own seed draws.
        let drawn = Tensor::rand([4], (Kind::Float, tch::Device::Cpu));
        tch::manual_seed(42);
        assert!(drawn.equal(&Tensor::rand([4], (Kind::Float, tch::Device::Cpu))));
        assert_eq!(shard.range(6), 2..4);
        let items = ["a", "b", "c", "d", "e", "f"];
        assert_eq!(BatchShard::of(2, 3, 0).take_items(&items), &["e", "f"]);
        // One process: the batch as drawn, and the generator left alone.
        tch::manual_seed(7);
        let expected = Tensor::rand([3], (Kind::Float, tch::Device::Cpu));
        tch::manual_seed(7);
        let [whole] = BatchShard::whole().take([batch.shallow_clone()]);
        assert!(whole.equal(&batch));
        assert!(Tensor::rand([3], (Kind::Float, tch::Device::Cpu)).equal(&expected));
        assert_eq!(BatchShard::whole().take_items(&items).len(), 6);
    }

    #[test]
    fn a_lone_process_sums_every_item_in_order() {
        let sums = sum_over_share(&[1.0, 2.0, 3.0], |&x| [x, x * x, 1.0]).unwrap();
        assert_eq!(sums, [6.0, 14.0, 3.0]);
    }
}
