"""MambaRadixCache (a hybrid model's radix tree): a match ends at the deepest node with a state
snapshot, snapshots go with their nodes, eviction takes leaves without a snapshot first, and
snapshot slots are recycled least recently used first (used: taken or ending a match), never from
the node where a lock ends (its ancestors' snapshots may go). The state pool's copies run in order
(a later copy reads what an earlier one wrote)."""

from __future__ import annotations

import torch

from radixlm.cache.base_prefix_cache import PrefixKey
from radixlm.cache.mamba_radix_cache import MambaRadixCache
from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.cache.state_pool import ZERO, MambaPool, StateSpec

SPECS = [[StateSpec("conv", (2, 3), torch.float32), StateSpec("ssm", (2, 2, 2), torch.float32)]]


def make(snapshots: int = 4, kv: int = 64):
    kv_pool = TokenToKVPool(kv, num_layers=1, num_kv_heads=1, head_dim=1)
    states = MambaPool(SPECS, rows=2, snapshots=snapshots)
    return MambaRadixCache(kv_pool, states), kv_pool, states


def K(ids) -> PrefixKey:
    return PrefixKey(list(ids))


def insert(tree, kv_pool, ids) -> None:
    shared = tree.insert(K(ids), kv_pool.alloc(len(ids)))
    assert shared == 0


def test_match_stops_at_the_deepest_snapshot():
    tree, kv_pool, states = make()
    insert(tree, kv_pool, range(10))
    assert len(tree.match_prefix(K(range(10))).indices) == 0  # KV, but no snapshot: unusable
    slot = tree.attach_state(K(range(6)), states.alloc_snapshot)  # splits the edge at 6
    assert slot == states.rows  # the first snapshot slot, past the request rows
    m = tree.match_prefix(K([*range(10), 99]))
    assert len(m.indices) == 6 and m.last_node.snapshot.slot == slot
    # the full KV is still there for the cache manager
    assert len(tree.kv_match(K(range(10))).indices) == 10
    # a second snapshot at the same place keeps the first
    assert tree.attach_state(K(range(6)), states.alloc_snapshot) is None
    assert states.available_snapshots() == 3


def test_eviction_prefers_leaves_without_a_snapshot_and_frees_snapshots():
    tree, kv_pool, states = make()
    insert(tree, kv_pool, [1, 2, 3])
    insert(tree, kv_pool, [7, 8, 9])
    tree.attach_state(K([1, 2, 3]), states.alloc_snapshot)  # older, but it has a snapshot
    tree.match_prefix(K([7, 8, 9]))  # the other one is used more recently
    assert tree.evict(3) == 3
    assert len(tree.match_prefix(K([1, 2, 3])).indices) == 3  # the snapshot's leaf survived
    assert tree.evict(3) == 3
    assert states.available_snapshots() == 4 and tree.total_size() == 0


def test_snapshot_slots_recycle_least_recently_used_unlocked_first():
    tree, kv_pool, states = make(snapshots=2)
    slots = {}
    for first in (10, 20):
        insert(tree, kv_pool, [first, first + 1])
        slots[first] = tree.attach_state(K([first, first + 1]), tree.alloc_state)
    assert sorted(slots.values()) == [states.rows, states.rows + 1]
    locked = tree.match_prefix(K([10, 11])).last_node  # the older one, now locked and recent
    tree.inc_lock_ref(locked)
    insert(tree, kv_pool, [30, 31])
    assert tree.attach_state(K([30, 31]), tree.alloc_state) == slots[20]  # [20, 21]'s slot
    assert len(tree.match_prefix(K([20, 21])).indices) == 0
    tree.match_prefix(K([30, 31]))
    insert(tree, kv_pool, [40, 41])
    # [30, 31]'s slot (unlocked), not the locked node's, though that one is older
    assert tree.attach_state(K([40, 41]), tree.alloc_state) == slots[20]
    assert locked.snapshot.slot == slots[10]


def test_a_lock_pins_only_its_own_node_snapshot_not_its_ancestors():
    """A chat: the running turn's lock passes through its earlier turns' snapshots; those go before
    a waiting conversation's answer, the only snapshot it needs."""
    tree, kv_pool, states = make(snapshots=3)
    insert(tree, kv_pool, range(8))
    old_turn = tree.attach_state(K(range(4)), tree.alloc_state)  # conversation A, turn 1
    a_now = tree.attach_state(K(range(8)), tree.alloc_state)  # A's turn 2, running
    insert(tree, kv_pool, [50, 51])
    b_answer = tree.attach_state(K([50, 51]), tree.alloc_state)  # B, waiting for its next turn
    running = tree.match_prefix(K(range(8))).last_node
    tree.inc_lock_ref(running)
    insert(tree, kv_pool, [60, 61])
    # every slot taken: the least recently used evictable one is A's turn 1 (locked only as an
    # ancestor), not B's answer, nor A's running node (where the lock ends)
    assert tree.attach_state(K([60, 61]), tree.alloc_state) == old_turn
    assert running.snapshot.slot == a_now
    m = tree.match_prefix(K([50, 51]))
    assert len(m.indices) == 2 and m.last_node.snapshot.slot == b_answer


def test_a_match_passing_through_does_not_refresh_a_snapshot():
    tree, kv_pool, states = make(snapshots=3)
    insert(tree, kv_pool, range(6))
    shallow = tree.attach_state(K(range(3)), tree.alloc_state)
    insert(tree, kv_pool, [50, 51])
    other = tree.attach_state(K([50, 51]), tree.alloc_state)  # taken after the shallow one
    tree.attach_state(K(range(6)), tree.alloc_state)
    for _ in range(3):  # matches end at the deeper snapshot, passing through the shallow one
        assert len(tree.match_prefix(K(range(6))).indices) == 6
    insert(tree, kv_pool, [70, 71])
    assert tree.attach_state(K([70, 71]), tree.alloc_state) == shallow
    m = tree.match_prefix(K([50, 51]))
    assert len(m.indices) == 2 and m.last_node.snapshot.slot == other
    assert len(tree.match_prefix(K(range(6))).indices) == 6


def test_copies_run_in_order():
    states = MambaPool(SPECS, rows=2, snapshots=2)
    conv = states.layer(0)["conv"]
    conv[0] = 1.0
    conv[1] = 2.0
    # row 0 -> snapshot 2, then snapshot 2 -> row 1, then zeros -> row 0
    states.apply_copies([(0, 2), (2, 1), (ZERO, 0)])
    assert torch.all(conv[2] == 1) and torch.all(conv[1] == 1) and torch.all(conv[0] == 0)
    assert torch.all(states.layer(0)["ssm"][0] == 0)


def test_a_row_copied_out_then_cleared_in_one_batch_keeps_the_copy():
    """A released request's state goes to a snapshot, and a new request that starts from no prefix
    takes the same row: one batch of copies, the snapshot must get the old state."""
    states = MambaPool(SPECS, rows=2, snapshots=2)
    states.layer(0)["ssm"][0] = 5.0
    states.apply_copies([(0, 2), (ZERO, 0)])
    assert torch.all(states.layer(0)["ssm"][2] == 5) and torch.all(states.layer(0)["ssm"][0] == 0)


def test_superseded_snapshots_go_first():
    """An interval's snapshot and the one a token before a prompt's end are superseded by the
    prompt's end below them (every longer match ends there): they go before any other, however
    recently taken."""
    tree, kv_pool, states = make(snapshots=4)
    insert(tree, kv_pool, [50, 51])
    other = tree.attach_state(K([50, 51]), tree.alloc_state)  # the oldest
    insert(tree, kv_pool, range(10))
    interval = tree.attach_state(K(range(4)), tree.alloc_state)
    before_end = tree.attach_state(K(range(9)), tree.alloc_state)
    end = tree.attach_state(K(range(10)), tree.alloc_state)
    insert(tree, kv_pool, [60, 61])
    assert tree.attach_state(K([60, 61]), tree.alloc_state) == interval
    insert(tree, kv_pool, [70, 71])
    assert tree.attach_state(K([70, 71]), tree.alloc_state) == before_end
    insert(tree, kv_pool, [80, 81])
    assert tree.attach_state(K([80, 81]), tree.alloc_state) == other  # then least recently used
    assert tree.match_prefix(K([*range(10), 5])).last_node.snapshot.slot == end


def _prompt_then_answer():
    """3 snapshot slots: an older prompt's, then a prompt (6 tokens) and its answer (to 10)."""
    tree, kv_pool, states = make(snapshots=3)
    insert(tree, kv_pool, [50, 51])
    older = tree.attach_state(K([50, 51]), tree.alloc_state)
    insert(tree, kv_pool, range(10))
    prompt = tree.attach_state(K(range(6)), tree.alloc_state)
    answer = tree.attach_state(K(range(10)), tree.alloc_state, from_answer=True)
    return tree, kv_pool, (older, prompt, answer)


def test_an_answer_ranks_below_the_prompts_until_a_prompt_continues_it():
    """A finished answer's snapshot goes before the prompts' (a next turn whose text re-tokenizes
    the answer otherwise resumes at its prompt's end, which must stay), and it supersedes nothing
    until a match ends at it; then its prompt's snapshot is the superseded one."""
    tree, kv_pool, (older, prompt, answer) = _prompt_then_answer()
    insert(tree, kv_pool, [60, 61])
    assert tree.attach_state(K([60, 61]), tree.alloc_state) == answer
    # the text of the next turn diverged inside the answer: it resumes at the prompt's end
    assert tree.match_prefix(K([*range(7), 99])).last_node.snapshot.slot == prompt
    assert tree.match_prefix(K([50, 51])).last_node.snapshot.slot == older

    tree, kv_pool, (older, prompt, answer) = _prompt_then_answer()
    assert tree.match_prefix(K([*range(10), 99])).last_node.snapshot.slot == answer  # continued
    insert(tree, kv_pool, [60, 61])
    assert tree.attach_state(K([60, 61]), tree.alloc_state) == prompt
    insert(tree, kv_pool, [70, 71])
    assert tree.attach_state(K([70, 71]), tree.alloc_state) == older


def test_an_answer_on_a_path_that_continued_one_ranks_as_a_prompt():
    """Once a conversation's turn continued an earlier answer (its client sends answers back as
    they were), its next answer's snapshot is kept like a prompt's."""
    tree, kv_pool, states = make(snapshots=3)
    insert(tree, kv_pool, range(20))
    turn1 = tree.attach_state(K(range(10)), tree.alloc_state, from_answer=True)
    insert(tree, kv_pool, [50, 51])
    older = tree.attach_state(K([50, 51]), tree.alloc_state)
    turn2 = tree.attach_state(K(range(14)), tree.alloc_state)  # turn 2's prompt, past turn 1
    # turn 1's answer is superseded by turn 2's prompt below it
    assert tree.attach_state(K(range(20)), tree.alloc_state, from_answer=True) == turn1
    insert(tree, kv_pool, [60, 61])
    # turn 2's prompt is superseded by its answer (ranked as a prompt's: it supersedes)
    assert tree.attach_state(K([60, 61]), tree.alloc_state) == turn2
    insert(tree, kv_pool, [70, 71])
    # then the least recently used, the older prompt: not turn 2's answer, as an answer
    # nothing continued would have been
    assert tree.attach_state(K([70, 71]), tree.alloc_state) == older
    assert tree.match_prefix(K([*range(20), 7])).last_node.snapshot.slot == turn1


def test_an_interval_snapshot_displaces_only_superseded_ones():
    """Tracks inside a prompt (alloc_state(superseded_only=True)) never evict a whole prefix
    another request may resume at, only snapshots a deeper one stands in for."""
    tree, kv_pool, states = make(snapshots=3)
    insert(tree, kv_pool, [50, 51])
    insert(tree, kv_pool, [60, 61, 62])
    kept = [tree.attach_state(K(k), tree.alloc_state) for k in ([50, 51], [60, 61])]
    end = tree.attach_state(K([60, 61, 62]), tree.alloc_state)
    assert states.available_snapshots() == 0
    assert tree.alloc_state(superseded_only=True) == kept[1]  # [60, 61]: under [60, 61, 62]'s
    assert tree.alloc_state(superseded_only=True) is None  # the rest are whole prefixes
    assert tree.match_prefix(K([50, 51])).last_node.snapshot.slot == kept[0]
    assert tree.match_prefix(K([60, 61, 62])).last_node.snapshot.slot == end


def test_a_prompt_takes_its_end_snapshots_before_its_intervals():
    """Slots short: a prefill's tracks go to the prompt's end and the token before it (what a next
    turn or a retry resumes at); its interval points get none rather than evict a whole prefix."""
    from types import SimpleNamespace

    from radixlm.scheduler.kv.state_tracker import StateTracker

    tree, kv_pool, states = make(snapshots=3)
    for k in ([50, 51], [60, 61], [70, 71]):
        insert(tree, kv_pool, k)
        tree.attach_state(K(k), tree.alloc_state)
    tracker = StateTracker(states, tree, track_interval=256)
    req = SimpleNamespace(rid=1, state_len=0, state_tracks=[], state_branch=None, seqlen=600)
    chunk = SimpleNamespace(req=req, start=0, end=600, is_last=True)
    _, tracks, _ = tracker.plan_step([chunk], [], None)
    assert [p for p, _ in req.state_tracks] == [599, 600]
    assert [off for off, _ in tracks[0]] == [599, 600]
    assert tree.snapshot_count() == 1  # the two least recently used prefixes made room
    # with room, the intervals come too, in order
    states.free_snapshot(tracks[0][0][1])
    states.free_snapshot(tracks[0][1][1])
    req2 = SimpleNamespace(rid=2, state_len=0, state_tracks=[], state_branch=None, seqlen=600)
    tree.evict_states(1)
    _, tracks, _ = tracker.plan_step(
        [SimpleNamespace(req=req2, start=0, end=600, is_last=True)], [], None
    )
    assert [p for p, _ in req2.state_tracks] == [512, 599, 600]
