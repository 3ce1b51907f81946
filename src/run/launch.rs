//! Who this process is in a data-parallel launch, read from the environment the launcher sets:
//! - torchrun (`torchrun --no-python --nproc-per-node N ablate recipe.yaml`): `RANK`, `WORLD_SIZE`,
//!   `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`; its agent serves the store there
//!   (`TORCHELASTIC_USE_AGENT_STORE`), and each restart gets its own keys (`TORCHELASTIC_RESTART_COUNT`);
//! - Slurm (`srun -n N ablate recipe.yaml`): `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS` (the step's tasks: the
//!   batch script itself, which also sees `SLURM_NTASKS`, is not a rank), `SLURM_LOCALID`, the first host of
//!   `SLURM_STEP_NODELIST` (or `SLURM_JOB_NODELIST`), and `MASTER_PORT` or a port derived from the job id.
//!
//! One process (no such variables, or a world of 1) is not a launch.
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use crate::recipe::{self, Recipe};
use crate::train::distributed::{self, Backend, Membership};

/// How long a collective or store wait may block before a rank gives up (`ABLATE_DIST_TIMEOUT` seconds;
/// torch.distributed's default of 30 minutes, since rank 0 may be unpacking a data set the others wait for).
const DEFAULT_TIMEOUT_S: u64 = 1800;

/// The membership this environment describes; `None` for a lone process.
pub fn from_env() -> Result<Option<Membership>> {
    membership(&std::env::vars().collect())
}

fn number(env: &HashMap<String, String>, key: &str) -> Result<Option<usize>> {
    env.get(key)
        .map(|v| v.trim().parse::<usize>().with_context(|| format!("environment variable {key}={v:?} is not a count")))
        .transpose()
}

fn required(env: &HashMap<String, String>, key: &str, launcher: &str) -> Result<String> {
    env.get(key).cloned().with_context(|| format!("{launcher} launch: environment variable {key} is not set"))
}

/// [`from_env`] over a given environment.
pub fn membership(env: &HashMap<String, String>) -> Result<Option<Membership>> {
    let timeout_s = match env.get("ABLATE_DIST_TIMEOUT") {
        Some(v) => v
            .parse::<u64>()
            .ok()
            .filter(|&s| s > 0)
            .with_context(|| format!("ABLATE_DIST_TIMEOUT={v:?}: give a whole number of seconds, at least 1"))?,
        None => DEFAULT_TIMEOUT_S,
    };
    let timeout = Duration::from_secs(timeout_s);
    if let Some(world) = number(env, "WORLD_SIZE")? {
        if world <= 1 {
            return Ok(None);
        }
        let rank = number(env, "RANK")?.context("torchrun launch: RANK is not set")?;
        let local_rank = number(env, "LOCAL_RANK")?.unwrap_or(0);
        let host = required(env, "MASTER_ADDR", "torchrun")?;
        let port = required(env, "MASTER_PORT", "torchrun")?;
        let port = port.parse::<u16>().with_context(|| format!("MASTER_PORT={port:?} is not a port"))?;
        let agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v == "True");
        let attempt = env.get("TORCHELASTIC_RESTART_COUNT").cloned().unwrap_or_else(|| "0".into());
        if rank >= world {
            bail!("RANK={rank} is not below WORLD_SIZE={world}");
        }
        let prefix = format!("ablate/attempt_{attempt}");
        return Ok(Some(Membership { rank, world, local_rank, host, port, agent_store, prefix, timeout }));
    }
    if let Some(world) = number(env, "SLURM_STEP_NUM_TASKS")? {
        if world <= 1 {
            return Ok(None);
        }
        let rank = number(env, "SLURM_PROCID")?.context("srun launch: SLURM_PROCID is not set")?;
        let local_rank = number(env, "SLURM_LOCALID")?.unwrap_or(0);
        let nodes = env
            .get("SLURM_STEP_NODELIST")
            .or_else(|| env.get("SLURM_JOB_NODELIST"))
            .or_else(|| env.get("SLURM_NODELIST"))
            .context("srun launch: none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST is set")?;
        let host = match env.get("MASTER_ADDR") {
            Some(h) => h.clone(),
            None => first_host(nodes).with_context(|| format!("srun launch: cannot read a host from {nodes:?}"))?,
        };
        let job = number(env, "SLURM_JOB_ID")?.unwrap_or(0);
        let step = number(env, "SLURM_STEP_ID")?.unwrap_or(0);
        let port = match env.get("MASTER_PORT") {
            Some(p) => p.parse::<u16>().with_context(|| format!("MASTER_PORT={p:?} is not a port"))?,
            // Steps of one job (and jobs sharing a node) get different ports; MASTER_PORT overrides.
            None => 20_000 + ((job * 31 + step) % 20_000) as u16,
        };
        if rank >= world {
            bail!("SLURM_PROCID={rank} is not below SLURM_STEP_NUM_TASKS={world}");
        }
        let prefix = format!("ablate/slurm_{job}_{step}");
        return Ok(Some(Membership { rank, world, local_rank, host, port, agent_store: false, prefix, timeout }));
    }
    Ok(None)
}

/// Processes of the launch on this node (torchrun's `LOCAL_WORLD_SIZE`, Slurm's tasks per node), when known.
pub fn local_world(env: &HashMap<String, String>) -> Option<usize> {
    if let Some(n) = env.get("LOCAL_WORLD_SIZE").and_then(|v| v.parse().ok()) {
        return Some(n);
    }
    // "2" or "2(x3),1": the first node's count.
    let tasks = env.get("SLURM_STEP_TASKS_PER_NODE").or_else(|| env.get("SLURM_TASKS_PER_NODE"))?;
    tasks.split([',', '(']).next()?.trim().parse().ok()
}

/// The first host of a Slurm host list: `node[03-05,9],gpu1` → `node03`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let first_end = {
        let mut depth = 0;
        let mut end = list.len();
        for (i, c) in list.char_indices() {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                ',' if depth == 0 => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        end
    };
    let first = &list[..first_end];
    let host = match first.split_once('[') {
        None => first.to_string(),
        Some((prefix, rest)) => {
            let (ranges, suffix) = rest.split_once(']')?;
            let number = ranges.split([',', '-']).next()?;
            format!("{prefix}{number}{suffix}")
        }
    };
    (!host.is_empty()).then_some(host)
}

/// What a rank of a data-parallel launch was started with: the recipe as loaded (with its overrides and
/// `--smoke`), the file it came from, and the flags that apply to a launch.
pub struct Request<'a> {
    pub recipe: Recipe,
    pub recipe_path: &'a Path,
    /// `--device`: `auto`, `cuda` (each rank takes its `LOCAL_RANK`'s GPU) or `cpu`.
    pub device: &'a str,
    /// `--threads`, when given.
    pub threads: Option<usize>,
    pub quiet: bool,
}

/// Joins the data-parallel launch this process is part of: puts the rank on its device (`LOCAL_RANK`'s
/// GPU) and its share of the node's cores, joins the group (NCCL between GPUs where built, else Gloo),
/// records the number of processes as `train.world_size`, and refuses ranks whose recipe or ablate build
/// differ from rank 0's.
pub fn join(membership: &Membership, request: Request) -> Result<(Recipe, tch::Device)> {
    let device = rank_device(membership, request.device)?;
    if let tch::Device::Cuda(i) = device {
        // The rank's GPU becomes its current device, so NCCL and any kernel launched without an explicit
        // device do not all land on GPU 0 (torch.cuda.set_device(local_rank)). Without the CUDA shim the
        // build has no NCCL either, and Gloo takes explicit devices only.
        if crate::train::native::has_cuda_extras() {
            crate::train::native::cuda_set_device(i)?;
        }
    }
    if request.threads.is_none() && std::env::var_os("OMP_NUM_THREADS").is_none() && device == tch::Device::Cpu {
        // The node's cores shared among its ranks (torchrun sets OMP_NUM_THREADS itself).
        let env: HashMap<String, String> = std::env::vars().collect();
        if let Some(local) = local_world(&env).filter(|&n| n > 1) {
            let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
            tch::set_num_threads((cores / local).max(1) as i32);
        }
    }
    let backend = match device {
        tch::Device::Cuda(_) if crate::train::native::has_cuda_extras() => Backend::Nccl,
        tch::Device::Cuda(_) => {
            eprintln!("ablate: warning: this build has no NCCL (CUDA headers missing at build time): gradients go through Gloo and the host");
            Backend::Gloo
        }
        _ => Backend::Gloo,
    };
    let group = distributed::join(membership, backend, device)?;
    let recipe = recipe_for_world(request.recipe, request.recipe_path, membership.world)?;
    let runs: Vec<(&str, &str)> = recipe.runs.iter().map(|r| (r.id.as_str(), r.config_hash.as_str())).collect();
    let recipe_print = fingerprint(serde_json::to_string(&(&recipe.name, recipe.smoke, runs))?.as_bytes());
    group.agree("recipe (its runs and their configs)", &format!("recipe {recipe_print}"))?;
    let exe = std::fs::read(std::env::current_exe()?).context("reading this ablate binary")?;
    group.agree("ablate build", &format!("build {} v{}", fingerprint(&exe), env!("CARGO_PKG_VERSION")))?;
    if group.rank == 0 && !request.quiet {
        eprintln!(
            "ablate: data-parallel over {} processes ({backend:?}), {device:?} each; global batch {}",
            membership.world,
            recipe.runs.first().map_or(0, |r| r.config.train.global_batch())
        );
    }
    Ok((recipe, device))
}

/// The device of one rank: the CPU, or the GPU of its `LOCAL_RANK`.
fn rank_device(membership: &Membership, spec: &str) -> Result<tch::Device> {
    let visible = if tch::Cuda::is_available() { tch::Cuda::device_count() as usize } else { 0 };
    match spec {
        "cpu" => Ok(tch::Device::Cpu),
        "auto" if visible == 0 => Ok(tch::Device::Cpu),
        "auto" | "cuda" => local_gpu(membership, visible).map(tch::Device::Cuda),
        other => bail!(
            "--device {other}: in a data-parallel launch each rank takes the GPU of its LOCAL_RANK: give --device cuda, auto or cpu"
        ),
    }
}

/// The index of the GPU a rank trains on, among the `visible` ones. torchrun shows every rank all the
/// node's GPUs (rank k takes cuda:k), but Slurm's `--gpus-per-task` binds each task to its own GPU, which
/// it then sees as cuda:0 whatever its SLURM_LOCALID: so one visible GPU is always cuda:0, and more than
/// one are shared out by local rank (several ranks per GPU when there are more ranks than GPUs).
fn local_gpu(membership: &Membership, visible: usize) -> Result<usize> {
    match visible {
        0 => bail!(
            "rank {} (LOCAL_RANK {}): --device cuda, but no CUDA device is visible to this process",
            membership.rank,
            membership.local_rank
        ),
        1 => Ok(0),
        n => Ok(membership.local_rank % n),
    }
}

/// `recipe` with `train.world_size` equal to the launch's processes: loaded again from `path` with it set
/// when the recipe leaves it at 1, refused when the recipe asks for another number.
fn recipe_for_world(recipe: Recipe, path: &Path, world: usize) -> Result<Recipe> {
    let asked = recipe.runs.iter().map(|r| r.config.train.world_size).max().unwrap_or(1);
    if asked as usize == world {
        return Ok(recipe);
    }
    if asked != 1 {
        bail!("{}: train.world_size is {asked}, but this launch has {world} processes", path.display());
    }
    let with_world = recipe.overrides.clone().with(&format!("train.world_size={world}"))?;
    Ok(recipe::load_with(path, recipe.smoke, &with_world)?)
}

/// The first 8 bytes of a SHA-256, in hex: enough to tell two recipes or builds apart.
fn fingerprint(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_rank_takes_the_one_gpu_slurm_binds_it_to_and_shares_several_out_by_local_rank() {
        let m = |local_rank| Membership {
            rank: local_rank + 4,
            world: 8,
            local_rank,
            host: "127.0.0.1".into(),
            port: 29500,
            agent_store: false,
            prefix: String::new(),
            timeout: std::time::Duration::from_secs(1),
        };
        // --gpus-per-task=1: every task sees its own GPU as cuda:0, whatever its SLURM_LOCALID.
        assert_eq!(local_gpu(&m(3), 1).unwrap(), 0);
        // torchrun on a 4-GPU node: local rank k takes cuda:k; 8 ranks on 4 GPUs take two each.
        assert_eq!(local_gpu(&m(2), 4).unwrap(), 2);
        assert_eq!(local_gpu(&m(6), 4).unwrap(), 2);
        let none = local_gpu(&m(1), 0).unwrap_err().to_string();
        assert!(none.contains("rank 5 (LOCAL_RANK 1)") && none.contains("no CUDA device"), "{none}");
    }

    #[test]
    fn slurm_host_lists_name_their_first_host_with_its_zero_padding() {
        assert_eq!(first_host("node[03-05,9],gpu1").as_deref(), Some("node03"));
        assert_eq!(first_host("gpu1,node[1-2]").as_deref(), Some("gpu1"));
        assert_eq!(first_host("localhost").as_deref(), Some("localhost"));
        assert_eq!(first_host("rack[7]-n[1-4]").as_deref(), Some("rack7-n[1-4]"));
        assert_eq!(first_host(""), None);
    }

    #[test]
    fn torchrun_and_srun_environments_give_the_same_membership_fields() {
        let torchrun = env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
        ]);
        let m = membership(&torchrun).unwrap().unwrap();
        assert_eq!((m.rank, m.world, m.local_rank, m.port), (1, 2, 1, 29500));
        assert!(m.agent_store);
        assert_eq!(m.prefix, "ablate/attempt_2");
        let srun = env(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_STEP_NUM_TASKS", "4"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_NODELIST", "n[07-08]"),
            ("SLURM_JOB_ID", "100"),
            ("SLURM_STEP_ID", "0"),
        ]);
        let m = membership(&srun).unwrap().unwrap();
        assert_eq!((m.rank, m.world, m.local_rank, m.host.as_str()), (3, 4, 1, "n07"));
        assert_eq!(m.port, 20_000 + 3100);
        assert!(!m.agent_store);
        // The batch script of a 4-task job is no rank; nor is a world of one.
        assert_eq!(membership(&env(&[("SLURM_NTASKS", "4"), ("SLURM_PROCID", "0")])).unwrap(), None);
        assert_eq!(membership(&env(&[("WORLD_SIZE", "1"), ("RANK", "0")])).unwrap(), None);
    }

    #[test]
    fn a_broken_launch_environment_is_named_in_one_line() {
        let e = membership(&env(&[("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_PORT", "1")])).unwrap_err();
        assert_eq!(e.to_string(), "torchrun launch: environment variable MASTER_ADDR is not set");
        let e = membership(&env(&[("WORLD_SIZE", "two")])).unwrap_err();
        assert!(e.to_string().contains("WORLD_SIZE=\"two\""), "{e}");
        let e = membership(&env(&[("WORLD_SIZE", "2"), ("RANK", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]))
            .unwrap_err();
        assert!(e.to_string().contains("not below"), "{e}");
        assert_eq!(local_world(&env(&[("SLURM_TASKS_PER_NODE", "2(x3),1")])), Some(2));
    }
}
