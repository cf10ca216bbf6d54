//! `runner-dist`: runs of several processes, one per rank (per GPU).
//!
//! - [`launch`]: which rank this process is, from the launcher's environment (Slurm
//!   `srun`, Open MPI / MPICH `mpirun`, torchrun's variables, a Kubernetes indexed Job).
//! - [`rendezvous`]: the ranks meet at rank 0 over TCP (tokio), which checks that they run
//!   the same thing (plugins and their hashes) and tells each where the others listen.
//! - [`tcp`]: a full TCP mesh between the ranks and a collective backend on it
//!   ([`tcp::TcpGroup`], a [`runner_exec::HostCollective`]) for ranks without GPUs, and
//!   the control plane beside NCCL (its bootstrap, failure detection naming the rank).
//!
//! The TCP backend exists for development, CI and CPU runs: it reduces in rank order so
//! results equal a single-process run bit for bit, and is not built for speed.

pub mod launch;
pub mod rendezvous;
pub mod tcp;
#[doc(hidden)]
pub mod testing;

pub use launch::{Launch, detect};
pub use rendezvous::{DistError, RunMeta, host_port, rendezvous, rendezvous_on};
pub use tcp::{TcpGroup, TcpWorld};
