"""The Communicator implementations on real ranks (gloo on this host): gloo and the shared-memory
all-reduce give the sum computed here from every rank's known input, the same bits on every rank;
all-gather, broadcast, broadcast_pyobj, send/recv and barrier do what they say; shm tensors larger
than a slot go in pieces; the shm segment leaves no file behind."""

from __future__ import annotations

import glob

import pytest
import torch

from tests.distributed.ranks import run_ranks


def _input(rank: int, n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(100 + rank))


def _exercise(rank: int, n: int, slot_bytes: int) -> dict:
    from radixlm.distributed.parallel_state import get_tp_group
    from radixlm.distributed.shm_communicator import ShmCommunicator

    g = get_tp_group()
    comm = g.device_comm
    if slot_bytes and isinstance(comm, ShmCommunicator):  # a small slot: the pieces path
        comm = ShmCommunicator(comm.fallback, slot_bytes=slot_bytes)
    world = g.world_size
    out = {"backend": type(comm).__name__}
    reduced = comm.all_reduce(_input(rank, n))
    out["all_reduce"] = reduced.numpy()
    again = comm.all_reduce(_input(rank, n) * 2)  # the next call uses the other buffer
    out["all_reduce_2"] = again.numpy()
    x = torch.arange(6, dtype=torch.float32).view(2, 3) + 10 * rank
    out["all_gather"] = comm.all_gather(x, dim=-1).numpy()
    out["all_gather_0"] = comm.all_gather(x, dim=0).numpy()
    b = torch.full((4,), float(rank))
    out["broadcast"] = comm.broadcast(b, src=world - 1).numpy()
    out["pyobj"] = g.cpu_comm.broadcast_pyobj(
        {"rank": rank, "msgs": ["a", 1]} if rank == 0 else None
    )
    if rank == 0:
        g.cpu_comm.send(torch.tensor([7.0, 8.0]), dst=world - 1)
    elif rank == world - 1:
        out["recv"] = g.cpu_comm.recv(torch.zeros(2), src=0).numpy()
    g.cpu_comm.barrier()
    return out


@pytest.mark.parametrize(
    "backend,world,n,slot_bytes",
    [
        ("gloo", 2, 1000, 0),
        ("shm", 2, 1000, 0),
        ("shm", 3, 5000, 4096),  # 20 KB through 4 KB slots: 5 pieces
    ],
)
def test_collectives(backend, world, n, slot_bytes):
    before = set(glob.glob("/dev/shm/radixlm-shm-*"))
    results = run_ranks(_exercise, world, n, slot_bytes, backend=backend)
    expected_name = {"gloo": "GlooCommunicator", "shm": "ShmCommunicator"}[backend]
    want = sum(_input(r, n).double() for r in range(world))
    for rank, res in enumerate(results):
        assert res["backend"] == expected_name
        assert torch.allclose(torch.from_numpy(res["all_reduce"]).double(), want, atol=1e-5), rank
        assert torch.allclose(
            torch.from_numpy(res["all_reduce_2"]).double(), 2 * want, atol=1e-5
        ), rank
        xs = [torch.arange(6, dtype=torch.float32).view(2, 3) + 10 * r for r in range(world)]
        assert torch.equal(torch.from_numpy(res["all_gather"]), torch.cat(xs, dim=-1))
        assert torch.equal(torch.from_numpy(res["all_gather_0"]), torch.cat(xs, dim=0))
        assert res["broadcast"].tolist() == [float(world - 1)] * 4
        assert res["pyobj"] == {"rank": 0, "msgs": ["a", 1]}
    assert results[-1]["recv"].tolist() == [7.0, 8.0]
    for res in results[1:]:  # the same bits everywhere: the ranks decide alike on them
        assert (res["all_reduce"] == results[0]["all_reduce"]).all()
    assert set(glob.glob("/dev/shm/radixlm-shm-*")) == before
