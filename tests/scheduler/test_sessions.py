"""SessionPins in the scheduler, in-process on the tiny model with a small KV pool: a session's
finished turn stays in the tree through eviction, the next turn moves the pin, closing (or a
flush) lets go; the invariant checks (on in every test scheduler) count the pins' locks."""

import random

import pytest

from radixlm.ipc import BindSessionReq, CloseSessionReq
from tests.scheduler.harness import Driver, assert_idle_memory_ok, make_scheduler

POOL = 200


def prompt(rng, n):
    return [rng.randrange(3, 40000) for _ in range(n)]


def fill(d: Driver, rng, times: int = 4) -> None:
    """Unrelated prompts that together exceed the pool: everything unpinned is evicted."""
    for _ in range(times):
        d.submit(prompt(rng, 60), max_new_tokens=2, temperature=0, ignore_eos=True)
    d.run()


@pytest.mark.parametrize(
    "opts",
    [{}, {"enable_overlap_schedule": True}, {"enable_hierarchical_cache": True}],
    ids=["inline", "overlap", "hicache"],
)
def test_a_pinned_turn_survives_eviction_until_closed(tiny_model_dir, opts):
    rng = random.Random(3)
    d = Driver(make_scheduler(tiny_model_dir, max_total_tokens=POOL, **opts))
    first = prompt(rng, 30)
    d.s.handle(BindSessionReq("t1", "S"))
    d.submit(first, "t1", max_new_tokens=5, temperature=0, ignore_eos=True)
    d.run()
    history = first + d.results["t1"].output_ids
    st = d.s.internal_state()
    assert st["pinned_sessions"] == 1 and st["session_pinned_tokens"] == len(history) - 1
    fill(d, rng)
    assert d.s.tree_cache.protected_size() == len(history) - 1

    second = history + prompt(rng, 10)
    d.s.handle(BindSessionReq("t2", "S"))
    d.submit(second, "t2", max_new_tokens=5, temperature=0, ignore_eos=True)
    d.run()
    assert d.results["t2"].cached_tokens == len(history) - 1  # the whole first turn, after the fill
    history = second + d.results["t2"].output_ids
    assert d.s.internal_state()["session_pinned_tokens"] == len(history) - 1  # the pin moved on
    assert d.s.tree_cache.protected_size() == len(history) - 1

    d.s.handle(CloseSessionReq("S"))
    assert d.s.internal_state()["pinned_sessions"] == 0
    assert_idle_memory_ok(d.s)  # no lock left, every slot free or in the tree once
    fill(d, rng)
    d.submit(history + [5], "t3", max_new_tokens=1)
    d.run()
    if (
        "enable_hierarchical_cache" not in opts
    ):  # unpinned, it was evicted like any prefix (the hierarchical cache brings it back from L2)
        assert d.results["t3"].cached_tokens < len(history) - 1


def test_the_control_without_a_pin_is_evicted(tiny_model_dir):
    rng = random.Random(3)
    d = Driver(make_scheduler(tiny_model_dir, max_total_tokens=POOL))
    first = prompt(rng, 30)
    d.submit(first, "t1", max_new_tokens=5, temperature=0, ignore_eos=True)
    d.run()
    fill(d, rng)
    d.submit(first + d.results["t1"].output_ids + [7], "t2", max_new_tokens=1)
    d.run()
    assert d.results["t2"].cached_tokens == 0


def test_abort_close_and_flush_leave_nothing_locked(tiny_model_dir):
    rng = random.Random(4)
    d = Driver(make_scheduler(tiny_model_dir, max_total_tokens=POOL))
    # A turn aborted before it ran pins nothing; a binding whose request never came goes at close.
    d.s.handle(BindSessionReq("a", "S"))
    d.submit(prompt(rng, 10), "a", max_new_tokens=3)
    d.abort("a")
    d.run()
    assert d.s.internal_state()["pinned_sessions"] == 0
    d.s.handle(BindSessionReq("never-sent", "S"))
    d.s.handle(CloseSessionReq("S"))
    assert not d.s.sessions.turns
    # Two sessions pinning a shared prefix; a flush drops the pins with the tree.
    shared = prompt(rng, 20)
    for sid in ("A", "B"):
        d.s.handle(BindSessionReq(f"r{sid}", sid))
        d.submit(
            shared + prompt(rng, 5), f"r{sid}", max_new_tokens=3, temperature=0, ignore_eos=True
        )
    d.run()
    assert d.s.internal_state()["pinned_sessions"] == 2
    assert d.s.flush_cache().success
    assert d.s.internal_state()["pinned_sessions"] == 0
    assert_idle_memory_ok(d.s)
    d.s.handle(CloseSessionReq("A"))  # closing after a flush is harmless
    d.s.checks.after_step()


def test_sessions_pin_at_most_half_the_pool(tiny_model_dir):
    rng = random.Random(6)
    d = Driver(make_scheduler(tiny_model_dir, max_total_tokens=POOL))
    for sid in ("A", "B"):  # 60 tokens each: the second would pass POOL / 2
        d.s.handle(BindSessionReq(f"r{sid}", sid))
        d.submit(prompt(rng, 57), f"r{sid}", max_new_tokens=4, temperature=0, ignore_eos=True)
        d.run()
    st = d.s.internal_state()
    assert st["pinned_sessions"] == 1 and st["session_pins_refused"] == 1
    assert d.s.tree_cache.protected_size() == 60
    fill(d, rng)  # the other traffic still has room
    d.s.handle(CloseSessionReq("A"))
    d.s.handle(CloseSessionReq("B"))
    assert_idle_memory_ok(d.s)
