"""Distributed serving: the world of ranks, its process groups by role (parallel_state.py) and the
communicators the groups talk through (communicator.py: torch.distributed's gloo and NCCL;
shm_communicator.py: a shared-memory all-reduce for ranks on one host).

Tensor parallelism (issue 36) uses the tp group; pipeline, expert and attention-data parallelism
add their groups to ParallelState (see parallel_state.py) and reuse the same Communicator interface.
"""
