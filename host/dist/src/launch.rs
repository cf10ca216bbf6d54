//! Which rank this process is, from the launcher's environment: torchrun (or anything
//! that sets its variables), Open MPI's and MPICH's `mpirun`, Slurm's `srun`, or a
//! Kubernetes indexed Job. One process per rank (per GPU); without a launcher the run is
//! a single process.
//!
//! | launcher | rank | world | local rank | rank 0's address |
//! |---|---|---|---|---|
//! | torchrun | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` | `MASTER_ADDR`:`MASTER_PORT` |
//! | Open MPI | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` | `MASTER_ADDR` (pass `-x MASTER_ADDR`) |
//! | MPICH / Hydra | `PMI_RANK` | `PMI_SIZE` | `MPI_LOCALRANKID` | `MASTER_ADDR` |
//! | Slurm `srun` (a step: `SLURM_STEP_ID` set) | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` | `MASTER_ADDR`, else the first host of `SLURM_STEP_NODELIST` (the step's, else the job's) |
//! | Kubernetes indexed Job | `JOB_COMPLETION_INDEX` | `WORLD_SIZE` | 0 | `MASTER_ADDR` (pod 0's stable name) |
//!
//! The port is `MASTER_PORT`, else 29500 (torchrun's default); under Slurm without
//! `MASTER_PORT`, [`slurm_port`]: 29500 + the job id mod 1000 for a job's first step, a
//! thousand lower for each later one (mod 10), so two jobs on a node, or two steps of one
//! job running at once, do not collide.

use std::collections::HashMap;
use std::fmt;

/// Torchrun's default rendezvous port.
pub const DEFAULT_PORT: u16 = 29500;

/// The largest world a launch may claim: far above any run (a rank keeps a connection to
/// every other), low enough that the rendezvous's per-rank tables stay small when a
/// variable is wrong (WORLD_SIZE=2^40 would allocate terabytes).
pub const MAX_WORLD: usize = 1 << 20;

/// This process's place in the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub rank: usize,
    pub world: usize,
    /// Rank among the processes of this node (the GPU it drives, see [`gpu_of_rank`]).
    pub local_rank: usize,
    /// How many ranks run on this node, where the launcher says (`LOCAL_WORLD_SIZE`,
    /// `OMPI_COMM_WORLD_LOCAL_SIZE`, `MPI_LOCALNRANKS`, Slurm's step tasks per node when
    /// every node has as many).
    pub local_world: Option<usize>,
    /// Where rank 0 listens for the rendezvous (host, port); `None` for a single process.
    pub master: Option<(String, u16)>,
    /// Which launcher's variables were read.
    pub source: &'static str,
}

impl Launch {
    /// A run of one process.
    pub fn single() -> Launch {
        Launch {
            rank: 0,
            world: 1,
            local_rank: 0,
            local_world: Some(1),
            master: None,
            source: "single process",
        }
    }
}

impl fmt::Display for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} of {} (local {}, {})", self.rank, self.world, self.local_rank, self.source)?;
        if let Some(at) = self.rendezvous() {
            write!(f, ", rendezvous at {at}")?;
        }
        Ok(())
    }
}

impl Launch {
    /// Rank 0's rendezvous address as one writes it: `host:port`, an IPv6 address in
    /// brackets (`[::1]:29500`, not the ambiguous `::1:29500`).
    pub fn rendezvous(&self) -> Option<String> {
        self.master.as_ref().map(|(h, p)| if h.contains(':') && !h.starts_with('[') { format!("[{h}]:{p}") } else { format!("{h}:{p}") })
    }
}

/// The launch this process's environment describes.
///
/// # Errors
/// Inconsistent variables (a rank beyond the world, an unparsable number, a rank without
/// its world size or the reverse, a multi-rank launch without rank 0's address), each
/// named with the fix.
pub fn detect() -> Result<Launch, String> {
    detect_from(&std::env::vars().collect())
}

/// [`detect`] on an explicit environment (for tests).
///
/// # Errors
/// As [`detect`].
pub fn detect_from(env: &HashMap<String, String>) -> Result<Launch, String> {
    let get = |k: &str| env.get(k).map(|s| s.trim()).filter(|s| !s.is_empty());
    let num = |k: &str| -> Result<Option<usize>, String> {
        get(k)
            .map(|v| v.parse::<usize>().map_err(|_| format!("{k}={v} is not a non-negative integer")))
            .transpose()
    };
    // srun sets SLURM_STEP_ID (and SLURM_STEPID) in its tasks' environment; sbatch's
    // batch script gets SLURM_PROCID=0 and SLURM_NTASKS but no step id: the OUTPUT
    // ENVIRONMENT VARIABLES of srun(1) and sbatch(1), https://slurm.schedmd.com/srun.html
    // and https://slurm.schedmd.com/sbatch.html (checked in Slurm 20.11's man pages). A
    // step id that names the batch step ("batch", 4294967294 = SLURM_BATCH_SCRIPT) counts
    // as none.
    let srun_step = ["SLURM_STEP_ID", "SLURM_STEPID"].iter().any(|k| get(k).is_some_and(|v| v != "batch" && v != "4294967294"));
    // (source, rank, world, local rank, ranks on the node, the variables of those four)
    let (source, rank, world, local, local_world, names) = if let (Some(r), Some(w)) = (num("RANK")?, num("WORLD_SIZE")?) {
        ("torchrun environment (RANK, WORLD_SIZE)", r, w, num("LOCAL_RANK")?, num("LOCAL_WORLD_SIZE")?, ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"])
    } else if let (Some(r), Some(w)) = (num("OMPI_COMM_WORLD_RANK")?, num("OMPI_COMM_WORLD_SIZE")?) {
        (
            "Open MPI mpirun",
            r,
            w,
            num("OMPI_COMM_WORLD_LOCAL_RANK")?,
            num("OMPI_COMM_WORLD_LOCAL_SIZE")?,
            ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"],
        )
    } else if let (Some(r), Some(w)) = (num("SLURM_PROCID")?, num("SLURM_NTASKS")?)
        && srun_step
        && [(num("PMI_RANK")?, r), (num("PMI_SIZE")?, w)].iter().all(|(p, s)| p.is_none_or(|p| p == *s))
    {
        // srun with its pmi2 plugin sets PMI_RANK and PMI_SIZE too, equal to Slurm's;
        // MPICH's mpiexec inside an allocation sets them to the MPI rank, while the
        // SLURM_ variables it inherits describe its proxies: there PMI wins (next).
        (
            "Slurm srun",
            r,
            w,
            num("SLURM_LOCALID")?,
            get("SLURM_STEP_TASKS_PER_NODE").and_then(uniform_tasks_per_node),
            ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"],
        )
    } else if let (Some(r), Some(w)) = (num("PMI_RANK")?, num("PMI_SIZE")?) {
        ("MPICH mpirun (PMI)", r, w, num("MPI_LOCALRANKID")?, num("MPI_LOCALNRANKS")?, ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"])
    } else if let Some(r) = num("JOB_COMPLETION_INDEX")? {
        let w = num("WORLD_SIZE")?.ok_or_else(|| {
            "a Kubernetes indexed Job (JOB_COMPLETION_INDEX is set) needs WORLD_SIZE = the Job's completions in its \
             env"
                .to_string()
        })?;
        ("Kubernetes indexed Job", r, w, Some(0), Some(1), ["JOB_COMPLETION_INDEX", "WORLD_SIZE", "", ""])
    } else {
        // The batch script of a job of several tasks, not an srun step: alone there, rank 0
        // would wait for ranks that nothing starts.
        if let (Some(_), Some(n)) = (num("SLURM_PROCID")?, num("SLURM_NTASKS")?)
            && n > 1
            && !srun_step
        {
            return Err(format!(
                "this is a Slurm job's batch script (SLURM_NTASKS={n}, no SLURM_STEP_ID), not one of its tasks: launch the \
                 runner with srun (`srun --mpi=none runner ...`, one task per GPU), or unset SLURM_NTASKS to run one process"
            ));
        }
        // Half a launcher's variables is a launch gone wrong, not a single process: run
        // alone, every rank would print its own results. (SLURM_PROCID alone, as in a
        // batch script submitted without a task count, stays a single process.)
        for (r, w) in [("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")] {
            match (get(r), num(w)?) {
                (Some(v), None) => return Err(format!("{r}={v} is set but {w} is not: set both (or neither, for one process)")),
                (None, Some(n)) if n > 1 => {
                    return Err(format!("{w}={n} is set but {r} is not: set both (or neither, for one process)"));
                }
                _ => {}
            }
        }
        return Ok(Launch::single());
    };
    let [rank_var, world_var, local_var, local_world_var] = names;
    if world == 0 || rank >= world {
        return Err(format!("{source}: rank {rank} ({rank_var}) is not below the world size {world} ({world_var}): the launcher's variables disagree"));
    }
    if world > MAX_WORLD {
        return Err(format!("{source}: {world_var}={world} ranks is more than this runner takes ({MAX_WORLD}): is the variable right?"));
    }
    match (local, local_world) {
        (_, Some(lw)) if lw == 0 || lw > world => {
            return Err(format!("{source}: {local_world_var}={lw} ranks on this node, in a world of {world}: set it to 1..={world}"));
        }
        (Some(l), Some(lw)) if l >= lw => {
            return Err(format!("{source}: local rank {l} ({local_var}) is not below the node's {lw} ranks ({local_world_var})"));
        }
        (Some(l), _) if l >= world => {
            return Err(format!("{source}: local rank {l} ({local_var}) is not below the world size {world}"));
        }
        _ => {}
    }
    if world == 1 {
        return Ok(Launch {
            source,
            ..Launch::single()
        });
    }
    let port = match get("MASTER_PORT") {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("MASTER_PORT={p} is not a port number: set it to a free port in 1..=65535 (or unset it: {DEFAULT_PORT})"))?,
        // Slurm's job id only under srun: another launcher inside an allocation has its
        // own port.
        None if source == "Slurm srun" => match num("SLURM_JOB_ID")? {
            Some(job) => slurm_port(job, get("SLURM_STEP_ID").or_else(|| get("SLURM_STEPID")).and_then(|s| s.parse().ok()).unwrap_or(0)),
            None => DEFAULT_PORT,
        },
        None => DEFAULT_PORT,
    };
    let host = match get("MASTER_ADDR") {
        // An IPv6 address may come in URL brackets ([::1]).
        Some(h) => h.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(h).to_string(),
        None if source == "Slurm srun" => {
            // The step's nodes, not the job's: `srun -N1 -w node02` in a two-node job
            // runs its task 0 on node02.
            let list = get("SLURM_STEP_NODELIST").or_else(|| get("SLURM_JOB_NODELIST")).or_else(|| get("SLURM_NODELIST")).ok_or_else(|| {
                "Slurm srun: neither MASTER_ADDR nor SLURM_STEP_NODELIST / SLURM_JOB_NODELIST says where rank 0 runs".to_string()
            })?;
            first_host(list)?
        }
        None => {
            return Err(format!(
                "{source}: {world} ranks but no address for rank 0's rendezvous: set MASTER_ADDR (and MASTER_PORT, \
                 default {DEFAULT_PORT}) in every rank's environment{}",
                if source.contains("mpirun") { " (mpirun -x MASTER_ADDR=<host of rank 0>)" } else { "" }
            ));
        }
    };
    Ok(Launch {
        rank,
        world,
        local_rank: local.unwrap_or(0),
        local_world,
        master: Some((host, port)),
        source,
    })
}

/// Slurm's tasks per node (`8(x2)`, `4,4`: srun(1), SLURM_STEP_TASKS_PER_NODE) where every
/// node runs as many; `None` where they differ or the text is not Slurm's.
fn uniform_tasks_per_node(list: &str) -> Option<usize> {
    let counts: Vec<usize> = list.split(',').map(|item| item.split('(').next()?.trim().parse().ok()).collect::<Option<_>>()?;
    counts.iter().all(|&c| c == counts[0]).then(|| counts[0])
}

/// The GPU a rank drives, of the `visible` ones (CUDA's ordinals), from its place on the
/// node; `None` where it sees none (it runs on the CPU). `assigned`: the launcher or the
/// user chose this process's GPUs (CUDA_VISIBLE_DEVICES is set).
///
/// Every rank sees the node's GPUs: local rank `r` drives GPU `r`. A rank that sees one GPU
/// it was assigned (Slurm's `--gpus-per-task=1` or `--gpu-bind=single:1`, one
/// CUDA_VISIBLE_DEVICES per rank) drives that one, whatever its local rank. Anything else
/// (more local ranks than GPUs, a local rank beyond several GPUs it sees: shared or its
/// own, no rank can tell) is an error naming the counts and the fixes, not a silent fall
/// to the CPU beside ranks on GPUs.
///
/// # Errors
/// As above.
pub fn gpu_of_rank(visible: usize, local_rank: usize, local_world: Option<usize>, assigned: bool) -> Result<Option<usize>, String> {
    if visible == 0 {
        return Ok(None);
    }
    if local_rank < visible && local_world.is_none_or(|w| w <= visible) {
        return Ok(Some(local_rank));
    }
    if visible == 1 && assigned {
        return Ok(Some(0));
    }
    let ranks = local_world.map_or_else(|| format!("local rank {local_rank}"), |w| format!("local rank {local_rank} of {w} on this node"));
    Err(format!(
        "{ranks} sees {visible} GPU(s){}: one GPU per rank is needed. Give every rank its own GPU (Slurm \
         --gpus-per-task=1, or one CUDA_VISIBLE_DEVICES per rank), or every rank all of the node's GPUs with at most \
         one rank per GPU; or run on CPUs with --device cpu",
        if assigned { "" } else { " (CUDA_VISIBLE_DEVICES unset: the node's GPUs)" }
    ))
}

/// The rendezvous port of a Slurm job's step: `29500 + job mod 1000` for step 0, a
/// thousand lower per step after it (steps 10 apart share a port). Every port stays in
/// 20500..=30499, below Linux's ephemeral range (32768 up), where an outgoing connection
/// could hold it.
pub fn slurm_port(job: usize, step: u64) -> u16 {
    DEFAULT_PORT - 1000 * (step % 10) as u16 + (job % 1000) as u16
}

/// The first host of a Slurm node list (`node[01-04,07],gpu5` → `node01`).
///
/// # Errors
/// An empty or malformed list.
pub fn first_host(list: &str) -> Result<String, String> {
    let bad = || format!("cannot read the Slurm node list '{list}'");
    let first = split_top(list).into_iter().next().ok_or_else(bad)?;
    match first.find('[') {
        None => Ok(first.to_string()),
        Some(open) => {
            let close = first[open..].find(']').map(|c| open + c).ok_or_else(bad)?;
            let (prefix, inner, suffix) = (&first[..open], &first[open + 1..close], &first[close + 1..]);
            let range = inner.split(',').next().ok_or_else(bad)?;
            let lo = range.split('-').next().ok_or_else(bad)?;
            if lo.is_empty() || !lo.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            Ok(format!("{prefix}{lo}{suffix}"))
        }
    }
}

/// The comma-separated items of a node list, commas inside brackets kept.
fn split_top(list: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0usize);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&list[start..]);
    out.into_iter().map(str::trim).filter(|s| !s.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn each_launcher_is_read() {
        let l = detect_from(&env(&[("RANK", "3"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "1234")])).unwrap();
        assert_eq!((l.rank, l.world, l.local_rank, l.master.clone()), (3, 4, 1, Some(("10.0.0.1".into(), 1234))));
        assert!(l.source.contains("torchrun"));
        for addr in ["::1", "[::1]"] {
            let l = detect_from(&env(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", addr), ("MASTER_PORT", "1234")])).unwrap();
            assert_eq!(l.master.clone().unwrap().0, "::1");
            // Written back with brackets: "::1:1234" reads as an address of its own.
            assert_eq!(l.rendezvous().as_deref(), Some("[::1]:1234"));
            assert!(l.to_string().ends_with("rendezvous at [::1]:1234"), "{l}");
        }
        let l = detect_from(&env(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_LOCAL_RANK", "1"), ("MASTER_ADDR", "h")])).unwrap();
        assert_eq!((l.rank, l.local_rank, l.master.unwrap().1), (1, 1, DEFAULT_PORT));
        let l = detect_from(&env(&[("PMI_RANK", "0"), ("PMI_SIZE", "2"), ("MASTER_ADDR", "h")])).unwrap();
        assert!(l.source.contains("MPICH"));
        let l = detect_from(&env(&[("SLURM_PROCID", "5"), ("SLURM_NTASKS", "16"), ("SLURM_LOCALID", "5"), ("SLURM_JOB_NODELIST", "gpu-[003-004],gpu-010"), ("SLURM_JOB_ID", "12345"), ("SLURM_STEP_ID", "0")])).unwrap();
        assert_eq!(l.master, Some(("gpu-003".into(), DEFAULT_PORT + 345)));
        // Two steps of one job running at once (`srun ... &` twice) meet on different
        // ports.
        let step = |id: &str| {
            let l = detect_from(&env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_JOB_NODELIST", "n1"), ("SLURM_JOB_ID", "12345"), ("SLURM_STEP_ID", id)])).unwrap();
            l.master.unwrap().1
        };
        assert_eq!((step("0"), step("1"), step("9"), step("10")), (29845, 28845, 20845, 29845));
        assert_eq!((slurm_port(999, 9), slurm_port(0, 0)), (21499, 29500));
        // A step on some of the job's nodes: its task 0 runs on the step's first node.
        let l = detect_from(&env(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "8"), ("SLURM_JOB_NODELIST", "gpu-[003-004]"), ("SLURM_STEP_NODELIST", "gpu-004"), ("SLURM_STEPID", "1")])).unwrap();
        assert_eq!(l.master.unwrap().0, "gpu-004");
        // srun's pmi2 plugin adds PMI_RANK/PMI_SIZE equal to Slurm's: still srun (its
        // node list and local rank); MPICH's mpiexec inside an allocation: its own ranks.
        let pmi2 = [("SLURM_PROCID", "5"), ("SLURM_NTASKS", "16"), ("SLURM_LOCALID", "5"), ("SLURM_JOB_NODELIST", "gpu-[003-004]"), ("SLURM_STEP_ID", "0"), ("PMI_RANK", "5"), ("PMI_SIZE", "16")];
        let l = detect_from(&env(&pmi2)).unwrap();
        assert_eq!((l.source, l.local_rank, l.master.unwrap().0), ("Slurm srun", 5, "gpu-003".to_string()));
        let hydra = [("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2"), ("PMI_RANK", "9"), ("PMI_SIZE", "16"), ("MPI_LOCALRANKID", "1"), ("MASTER_ADDR", "h")];
        let l = detect_from(&env(&hydra)).unwrap();
        assert_eq!((l.source, l.rank, l.world, l.local_rank), ("MPICH mpirun (PMI)", 9, 16, 1));
        let l = detect_from(&env(&[("JOB_COMPLETION_INDEX", "2"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "train-0.train")])).unwrap();
        assert_eq!((l.rank, l.world, l.local_rank), (2, 4, 0));
        assert_eq!(detect_from(&env(&[])).unwrap(), Launch::single());
        // torchrun wins over Slurm when both are set (torchrun inside an allocation).
        let l = detect_from(&env(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "a"), ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")])).unwrap();
        assert_eq!(l.rank, 1);
    }

    /// Which launcher wins where two set their variables: torchrun's, whose workers
    /// inherit the variables of the launcher that started torchrun (`srun torchrun`,
    /// `mpirun torchrun`: one outer task per node, describing torchrun, not its workers);
    /// and MPICH's PMI over an srun step's where the two disagree, in the rank or in the
    /// size alone (MPICH's mpiexec, whose proxies srun started: its SLURM_ variables are
    /// the proxies').
    #[test]
    fn the_innermost_launcher_wins() {
        let torch = "torchrun environment (RANK, WORLD_SIZE)";
        let srun_torchrun = [("RANK", "3"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("MASTER_ADDR", "h"), ("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1"), ("SLURM_STEP_ID", "0"), ("SLURM_LOCALID", "0"), ("SLURM_JOB_NODELIST", "n1")];
        let l = detect_from(&env(&srun_torchrun)).unwrap();
        assert_eq!((l.source, l.rank, l.world, l.local_rank), (torch, 3, 4, 1));
        let mpirun_torchrun = [("RANK", "5"), ("WORLD_SIZE", "8"), ("MASTER_ADDR", "h"), ("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_LOCAL_RANK", "0")];
        let l = detect_from(&env(&mpirun_torchrun)).unwrap();
        assert_eq!((l.source, l.rank, l.world), (torch, 5, 8));
        for (rank, size) in [("1", "8"), ("0", "2")] {
            let kv = [("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2"), ("SLURM_STEP_ID", "0"), ("SLURM_JOB_NODELIST", "n[1-2]"), ("PMI_RANK", rank), ("PMI_SIZE", size), ("MASTER_ADDR", "h")];
            let l = detect_from(&env(&kv)).unwrap();
            assert_eq!((l.source, l.rank.to_string(), l.world.to_string()), ("MPICH mpirun (PMI)", rank.to_string(), size.to_string()), "{kv:?}");
        }
    }

    /// Values with blanks around them (a Kubernetes value from a file with its newline, a
    /// wrapper's padding) are read trimmed; Slurm's rank 0 comes from SLURM_NODELIST, the
    /// older name of the job's node list, where the other two are not set.
    #[test]
    fn padded_values_and_the_older_node_list_are_read() {
        let l = detect_from(&env(&[("RANK", " 1"), ("WORLD_SIZE", "2\n"), ("LOCAL_RANK", "1 "), ("MASTER_ADDR", " h\n"), ("MASTER_PORT", "1234 ")])).unwrap();
        assert_eq!((l.rank, l.world, l.local_rank, l.master), (1, 2, 1, Some(("h".into(), 1234))));
        let l = detect_from(&env(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2"), ("SLURM_STEP_ID", "0"), ("SLURM_NODELIST", "n[3-4]")])).unwrap();
        assert_eq!(l.master.unwrap().0, "n3");
    }

    #[test]
    fn bad_launches_say_what_to_set() {
        let e = detect_from(&env(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")])).unwrap_err();
        assert!(e.contains("MASTER_ADDR") && e.contains("mpirun -x"), "{e}");
        let e = detect_from(&env(&[("RANK", "4"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert!(e.contains("not below the world size"), "{e}");
        let e = detect_from(&env(&[("RANK", "x"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert!(e.contains("RANK=x"), "{e}");
        let e = detect_from(&env(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "99999")])).unwrap_err();
        assert!(e.contains("MASTER_PORT"), "{e}");
        let e = detect_from(&env(&[("JOB_COMPLETION_INDEX", "0")])).unwrap_err();
        assert!(e.contains("WORLD_SIZE"), "{e}");
        // Half a launch is refused, not run as one process that prints on every rank.
        for (kv, want) in [
            (vec![("RANK", "1")], "RANK=1 is set but WORLD_SIZE is not"),
            (vec![("RANK", "0"), ("MASTER_ADDR", "h")], "RANK=0 is set but WORLD_SIZE"),
            (vec![("WORLD_SIZE", "4")], "WORLD_SIZE=4 is set but RANK is not"),
            (vec![("RANK", ""), ("WORLD_SIZE", "2")], "WORLD_SIZE=2 is set but RANK"),
            (vec![("OMPI_COMM_WORLD_RANK", "1")], "OMPI_COMM_WORLD_SIZE is not"),
            (vec![("PMI_SIZE", "8")], "PMI_RANK is not"),
        ] {
            let e = detect_from(&env(&kv)).unwrap_err();
            assert!(e.contains(want), "{kv:?}: {e}");
        }
        // The batch script of a job of 16 tasks (no step id, or the batch step's) is told
        // to use srun, at once; MPICH's mpiexec run there is MPICH's, its rank 0 too.
        for step in [None, Some("batch"), Some("4294967294")] {
            let mut kv = vec![("SLURM_PROCID", "0"), ("SLURM_NTASKS", "16"), ("SLURM_LOCALID", "0"), ("SLURM_JOB_NODELIST", "gpu-[003-004]"), ("SLURM_JOB_ID", "12345")];
            kv.extend(step.map(|s| ("SLURM_STEP_ID", s)));
            let e = detect_from(&env(&kv)).unwrap_err();
            assert!(e.contains("batch script") && e.contains("srun"), "{step:?}: {e}");
            kv.extend([("PMI_RANK", "0"), ("PMI_SIZE", "16"), ("MASTER_ADDR", "h")]);
            assert_eq!(detect_from(&env(&kv)).unwrap().source, "MPICH mpirun (PMI)");
        }
        // A world of one, a lone LOCAL_RANK and a Slurm batch script without a task
        // count are single processes.
        for kv in [vec![("WORLD_SIZE", "1")], vec![("LOCAL_RANK", "3")], vec![("SLURM_PROCID", "0")], vec![("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")]] {
            assert_eq!(detect_from(&env(&kv)).unwrap(), Launch::single(), "{kv:?}");
        }
    }

    /// Hostile or broken environments: every one an error naming the variable, never a
    /// launch that allocates by a wrong world size or a local rank beyond its node.
    #[test]
    fn hostile_environments_are_named_errors() {
        let t = |kv: &[(&str, &str)]| detect_from(&env(kv));
        let torch = |r: &str, w: &str, more: &[(&'static str, &'static str)]| {
            let mut kv = vec![("RANK", r.to_string()), ("WORLD_SIZE", w.to_string()), ("MASTER_ADDR", "h".to_string())];
            kv.extend(more.iter().map(|(k, v)| (*k, v.to_string())));
            detect_from(&kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
        };
        for (r, w, want) in [
            ("0", "0", "rank 0 (RANK) is not below the world size 0 (WORLD_SIZE)"),
            ("3", "2", "rank 3 (RANK) is not below the world size 2"),
            ("0", "1099511627776", "WORLD_SIZE=1099511627776 ranks is more than this runner takes (1048576)"),
            ("0", "18446744073709551616", "WORLD_SIZE=18446744073709551616 is not a non-negative integer"),
            ("-1", "2", "RANK=-1 is not a non-negative integer"),
            ("1.0", "2", "RANK=1.0 is not"),
        ] {
            let e = torch(r, w, &[]).unwrap_err();
            assert!(e.contains(want), "RANK={r} WORLD_SIZE={w}: {e}");
        }
        // The largest world taken, and one more.
        assert_eq!(torch("0", &MAX_WORLD.to_string(), &[]).unwrap().world, MAX_WORLD);
        assert!(torch("0", &(MAX_WORLD + 1).to_string(), &[]).unwrap_err().contains("more than this runner takes"));
        for p in ["0", "70000", "65536", "-1", "http", "29500x"] {
            let e = torch("0", "2", &[("MASTER_PORT", p)]).unwrap_err();
            assert!(e.contains(&format!("MASTER_PORT={p} is not a port number")) && e.contains("1..=65535"), "{p}: {e}");
        }
        assert_eq!(torch("0", "2", &[("MASTER_PORT", "65535")]).unwrap().master.unwrap().1, 65535);
        assert_eq!(torch("0", "2", &[("MASTER_PORT", "1")]).unwrap().master.unwrap().1, 1);
        // Local ranks beyond their node or the world.
        for (more, want) in [
            (&[("LOCAL_RANK", "2"), ("LOCAL_WORLD_SIZE", "2")][..], "local rank 2 (LOCAL_RANK) is not below the node's 2 ranks (LOCAL_WORLD_SIZE)"),
            (&[("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "0")][..], "LOCAL_WORLD_SIZE=0 ranks on this node"),
            (&[("LOCAL_WORLD_SIZE", "3")][..], "LOCAL_WORLD_SIZE=3 ranks on this node, in a world of 2"),
            (&[("LOCAL_RANK", "2")][..], "local rank 2 (LOCAL_RANK) is not below the world size 2"),
            (&[("LOCAL_RANK", "x")][..], "LOCAL_RANK=x is not a non-negative integer"),
        ] {
            let e = torch("1", "2", more).unwrap_err();
            assert!(e.contains(want), "{more:?}: {e}");
        }
        let l = torch("1", "2", &[("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")]).unwrap();
        assert_eq!((l.local_rank, l.local_world), (1, Some(2)));
        assert_eq!(torch("1", "2", &[("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")]).unwrap().local_world, Some(1));
        // Each launcher's own variables, named.
        let slurm = [("SLURM_NTASKS", "4"), ("SLURM_STEP_ID", "0"), ("SLURM_JOB_NODELIST", "n1")];
        for (kv, want) in [
            (vec![("SLURM_PROCID", "abc")], "SLURM_PROCID=abc is not a non-negative integer"),
            (vec![("SLURM_PROCID", "4")], "rank 4 (SLURM_PROCID) is not below the world size 4 (SLURM_NTASKS)"),
            (vec![("SLURM_PROCID", "1"), ("SLURM_LOCALID", "2"), ("SLURM_STEP_TASKS_PER_NODE", "2(x2)")], "local rank 2 (SLURM_LOCALID) is not below the node's 2 ranks (SLURM_STEP_TASKS_PER_NODE)"),
            (vec![("SLURM_PROCID", "1"), ("SLURM_STEP_TASKS_PER_NODE", "0")], "SLURM_STEP_TASKS_PER_NODE=0 ranks"),
            (vec![("SLURM_PROCID", "1"), ("SLURM_JOB_ID", "j1")], "SLURM_JOB_ID=j1 is not"),
        ] {
            let mut kv = kv;
            kv.extend(slurm);
            let e = t(&kv).unwrap_err();
            assert!(e.contains(want), "{kv:?}: {e}");
        }
        for (kv, want) in [
            (vec![("OMPI_COMM_WORLD_RANK", "1e3"), ("OMPI_COMM_WORLD_SIZE", "2")], "OMPI_COMM_WORLD_RANK=1e3 is not"),
            (vec![("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "2")], "rank 2 (OMPI_COMM_WORLD_RANK) is not below the world size 2 (OMPI_COMM_WORLD_SIZE)"),
            (vec![("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_LOCAL_RANK", "1"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "1")], "(OMPI_COMM_WORLD_LOCAL_RANK) is not below the node's 1 ranks (OMPI_COMM_WORLD_LOCAL_SIZE)"),
            (vec![("PMI_RANK", "0"), ("PMI_SIZE", "2"), ("MPI_LOCALRANKID", "2")], "local rank 2 (MPI_LOCALRANKID) is not below the world size 2"),
            (vec![("JOB_COMPLETION_INDEX", "x"), ("WORLD_SIZE", "4")], "JOB_COMPLETION_INDEX=x is not"),
            (vec![("JOB_COMPLETION_INDEX", "4"), ("WORLD_SIZE", "4")], "rank 4 (JOB_COMPLETION_INDEX) is not below the world size 4 (WORLD_SIZE)"),
            (vec![("JOB_COMPLETION_INDEX", "0"), ("WORLD_SIZE", "0")], "is not below the world size 0"),
        ] {
            let mut kv = kv;
            kv.push(("MASTER_ADDR", "h"));
            let e = t(&kv).unwrap_err();
            assert!(e.contains(want), "{kv:?}: {e}");
        }
        // A world of one is one process, whatever the launcher, without rank 0's address.
        assert_eq!(torch("0", "1", &[]).unwrap(), Launch { source: "torchrun environment (RANK, WORLD_SIZE)", ..Launch::single() });
        assert_eq!(t(&[("RANK", "0"), ("WORLD_SIZE", "1")]).unwrap().master, None);
        // No local rank from the launcher: 0.
        assert_eq!(t(&[("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("MASTER_ADDR", "h")]).unwrap().local_rank, 0);
        // Slurm's job id is read under srun only: torchrun inside an allocation whose
        // SLURM_JOB_ID some wrapper set oddly keeps its own port.
        assert_eq!(torch("0", "2", &[("SLURM_JOB_ID", "12345_7")]).unwrap().master.unwrap().1, DEFAULT_PORT);
        assert_eq!(torch("0", "2", &[("SLURM_JOB_ID", "12345")]).unwrap().master.unwrap().1, DEFAULT_PORT);
    }

    /// Which GPU a rank drives under each way of handing out GPUs. Slurm's
    /// --gpus-per-task=1 gives every task one GPU, as CUDA device 0: local ranks 1..7 fell to
    /// the CPU (their local rank is no device they see).
    #[test]
    fn the_gpu_of_each_rank() {
        // Every rank sees the node's 8 GPUs: GPU = local rank.
        assert_eq!((0..8).map(|r| gpu_of_rank(8, r, Some(8), false).unwrap()).collect::<Vec<_>>(), (0..8).map(Some).collect::<Vec<_>>());
        assert_eq!(gpu_of_rank(8, 3, None, true).unwrap(), Some(3));
        // One GPU each, assigned by the launcher: that one, whatever the local rank.
        for r in 0..8 {
            assert_eq!(gpu_of_rank(1, r, Some(8), true).unwrap(), Some(0), "local rank {r}");
            assert_eq!(gpu_of_rank(1, r, None, true).unwrap(), Some(0), "local rank {r}");
        }
        // No GPU: the CPU.
        assert_eq!(gpu_of_rank(0, 5, Some(8), false).unwrap(), None);
        assert_eq!(gpu_of_rank(1, 0, Some(1), false).unwrap(), Some(0));
        // Ambiguous or short: an error on every rank, never the CPU beside GPU ranks.
        for (visible, r, w, assigned) in [(1, 1, Some(2), false), (1, 0, Some(2), false), (2, 2, None, false), (4, 1, Some(8), false), (4, 6, None, false), (2, 3, Some(8), true), (2, 0, Some(8), true)] {
            let e = gpu_of_rank(visible, r, w, assigned).unwrap_err();
            assert!(e.contains(&format!("local rank {r}")) && e.contains(&format!("sees {visible} GPU(s)")) && e.contains("--gpus-per-task=1") && e.contains("--device cpu"), "{e}");
        }
        // Each launcher's count of ranks on the node.
        let lw = |kv: &[(&str, &str)]| detect_from(&env(kv)).unwrap().local_world;
        assert_eq!(lw(&[("RANK", "1"), ("WORLD_SIZE", "16"), ("LOCAL_WORLD_SIZE", "8"), ("MASTER_ADDR", "h")]), Some(8));
        assert_eq!(lw(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "16"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "8"), ("MASTER_ADDR", "h")]), Some(8));
        assert_eq!(lw(&[("PMI_RANK", "1"), ("PMI_SIZE", "16"), ("MPI_LOCALNRANKS", "8"), ("MASTER_ADDR", "h")]), Some(8));
        let slurm = |tpn: &str| lw(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "16"), ("SLURM_STEP_ID", "0"), ("SLURM_JOB_NODELIST", "n[1-2]"), ("SLURM_STEP_TASKS_PER_NODE", tpn)]);
        assert_eq!((slurm("8(x2)"), slurm("8,8"), slurm("8(x1),7"), slurm("x")), (Some(8), Some(8), None, None));
        assert_eq!(lw(&[("JOB_COMPLETION_INDEX", "1"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "h")]), Some(1));
        assert_eq!(lw(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]), None);
    }

    #[test]
    fn slurm_node_lists() {
        assert_eq!(first_host("node01").unwrap(), "node01");
        assert_eq!(first_host("node[07-09,11]").unwrap(), "node07");
        assert_eq!(first_host("a[1-2]-ib,b3").unwrap(), "a1-ib");
        assert_eq!(first_host(" x , y").unwrap(), "x");
        assert!(first_host("").is_err());
        assert!(first_host("n[").is_err());
        assert!(first_host("n[a-b]").is_err());
        assert!(first_host("n[]").is_err());
        assert!(first_host("n[-3]").is_err());
    }

    /// A step whose task environment names its step by SLURM_STEPID alone (the older of
    /// srun's two names for it) takes that step's port, as with SLURM_STEP_ID: two steps
    /// of one job running at once must not meet on one port.
    #[test]
    fn the_older_step_id_alone_picks_the_step_s_port() {
        let port = |step: &str| {
            let kv = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_JOB_NODELIST", "n1"), ("SLURM_JOB_ID", "12345"), ("SLURM_STEPID", step)];
            let l = detect_from(&env(&kv)).unwrap();
            assert_eq!(l.source, "Slurm srun");
            l.master.unwrap().1
        };
        assert_eq!((port("0"), port("1"), port("3")), (29845, 28845, 26845));
    }

    /// A launch built with an IPv6 host already in brackets (as a caller may hand it) is
    /// written with one pair of them, not `[[::1]]:29500`, which no resolver reads.
    #[test]
    fn a_bracketed_ipv6_host_is_written_with_one_pair_of_brackets() {
        let l = |h: &str| Launch { master: Some((h.into(), 29500)), world: 2, ..Launch::single() };
        assert_eq!(l("[::1]").rendezvous().as_deref(), Some("[::1]:29500"));
        assert_eq!(l("::1").rendezvous().as_deref(), Some("[::1]:29500"));
        assert_eq!(l("n1").rendezvous().as_deref(), Some("n1:29500"));
    }
}
