//! The peak memory of a run, for `runs.csv`: on the CPU the process's resident-set high-water mark
//! (`VmHWM`), reset when the run starts by writing 5 to `/proc/self/clear_refs` after handing the heap's free
//! pages back (`malloc_trim`), so each run of a sweep reports its own peak (the process's libtorch, data and
//! model included); on a GPU the CUDA caching
//! allocator's peak of allocated bytes, reset the same way (`torch.cuda.reset_peak_memory_stats`).
use tch::Device;

use super::native;

/// Measures from its creation on.
pub struct PeakMemory {
    device: Device,
}

/// A `kB` field (`VmRSS:`, `VmHWM:`) of a process's `/proc/<pid>/status`; `None` if unreadable.
pub fn status_kb(status_file: &str, field: &str) -> Option<f64> {
    let text = std::fs::read_to_string(status_file).ok()?;
    text.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

impl PeakMemory {
    /// Resets the peak of `device` to what is held now.
    pub fn start(device: Device) -> Self {
        match device {
            Device::Cuda(i) => {
                let _ = native::reset_cuda_peak_memory(i);
            }
            _ => {
                // Memory an earlier run freed stays resident in glibc's heap and would count as this run's:
                // hand it back to the kernel first.
                #[cfg(all(target_os = "linux", target_env = "gnu"))]
                // SAFETY: malloc_trim only releases free heap pages; it touches no live allocation.
                unsafe {
                    libc::malloc_trim(0);
                }
                // Without the reset (a kernel without clear_refs) the peak is the process's since it started.
                let _ = std::fs::write("/proc/self/clear_refs", "5");
            }
        }
        Self { device }
    }

    /// The peak in MB (2^20 bytes) since `start`; NaN where it cannot be read.
    pub fn megabytes(&self) -> f64 {
        match self.device {
            Device::Cuda(i) => {
                native::cuda_peak_memory(i).map_or(f64::NAN, |(allocated, _)| allocated as f64 / 1048576.0)
            }
            _ => status_kb("/proc/self/status", "VmHWM:").map_or(f64::NAN, |kb| kb / 1024.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_peak_covers_a_buffer_touched_after_the_start_and_restarts_below_it() {
        let peak = PeakMemory::start(Device::Cpu);
        let before = peak.megabytes();
        // 256 MB written, so every page is resident, then freed.
        let buffer = tch::Tensor::ones([64 << 20], (tch::Kind::Float, Device::Cpu));
        drop(buffer);
        let after = peak.megabytes();
        assert!(after - before > 200.0, "peak {before} MB -> {after} MB");
        // A new start forgets it: the freed buffer is no longer resident.
        let again = PeakMemory::start(Device::Cpu).megabytes();
        assert!(again < after - 200.0, "after a reset the peak is {again} MB, before it {after} MB");
    }
}
