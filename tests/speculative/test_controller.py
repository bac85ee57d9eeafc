"""The adaptive draft length: StepCostModel's estimates and SpecController.allocate's choice,
checked against a brute force over every allocation, and the behaviour the issue asks for
(long drafts where they are accepted and rows are cheap, none at compute-bound batch sizes or
where drafts fail)."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlm.speculative.controller import MIN_WORTH, SpecController
from radixlm.speculative.cost_model import StepCostModel
from radixlm.speculative.draft_source import DraftSourceBase
from radixlm.speculative.draft_tree import DraftTree


class NoSource(DraftSourceBase):
    def propose(self, reqs, ks, shape=None):
        raise AssertionError("not called here")


def verified(ctl: SpecController, req, drafted: int, accepted: int) -> None:
    """A verify step of a chain of `drafted` tokens of which the first `accepted` were accepted."""
    ctl.on_verified(
        req,
        DraftTree.chain([7] * drafted),
        list(range(accepted)),
        accepted,
        list(range(accepted + 1)),
    )


def model_with(points: dict[int, float]) -> StepCostModel:
    m = StepCostModel()
    for rows, sec in points.items():
        m.observe(rows, sec)
    return m


def test_cost_model_interpolates_and_extrapolates():
    m = StepCostModel()
    assert m.cost(1) == 1.0 and m.cost(5) == pytest.approx(2.0)  # the prior: 1 + 0.25 per extra row
    m = model_with({1: 4.0, 5: 8.0, 9: 10.0})
    assert m.cost(1) == 4.0 and m.cost(3) == pytest.approx(6.0) and m.cost(7) == pytest.approx(9.0)
    # Past the largest: the least-squares line through the medians (7.33 at 5 rows, 0.75 per row).
    assert m.cost(13) == pytest.approx(22 / 3 + 0.75 * 8)
    m.observe(5, 8.2)
    m.observe(5, 30.0)  # the median of the recent ones: an outlier does not move it
    assert m.cost(5) == 8.2
    for _ in range(9):
        m.observe(5, 12.0)  # a lasting change does
    assert m.cost(5) == 12.0
    one = model_with({4: 8.0})
    assert one.cost(2) == pytest.approx(4.0) and one.cost(8) == pytest.approx(8.0 + 0.25 * 2.0 * 4)


def test_cost_model_extrapolates_past_a_noisy_neighbour():
    """Two large row counts a row apart, the larger one slow by noise: the price of twice as many
    rows follows the trend of every measurement, not the noise between the two (a local slope of
    6 s per row would put 64 rows at ~212 s here and drafts would never grow to be measured)."""
    points = {1: 8.0, 8: 15.0, 16: 21.0, 32: 36.0, 35: 38.0, 36: 44.0}
    m = model_with(points)
    xs, ys = list(points), list(points.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    assert 0.9 < slope < 1.1
    assert m.cost(64) == pytest.approx(my + slope * (64 - mx))
    assert m.cost(37) == 44.0  # never below the largest measured count's own cost


def test_allocation_drafts_a_whole_certain_answer():
    """A request whose drafts are always accepted, step costs linear with a fixed part (8 ms, and
    1 ms per row: this CPU's figures): the controller drafts its whole cap in one step, though the
    largest row count measured so far (36) was slow by noise."""
    ctl = SpecController(NoSource(), 64)
    for rows in range(1, 36):
        ctl.costs.observe(rows, 0.008 + 0.001 * (rows - 1))
    ctl.costs.observe(36, 0.060)
    assert ctl.allocate([0.999], [62], spare_slots=1000) == [62]


def test_a_new_request_starts_from_its_draft_class_rate():
    """Recorded answers are accepted whole, lookups one token in two: a new request whose draft is
    a recorded answer drafts all of it in its first step (its class's rate, ~0.9996; at the two
    classes' mixed rate, ~0.97, the step would draft 18), a new lookup request a token or two."""
    from types import SimpleNamespace

    from radixlm.sampling_params import SamplingParams

    class Source(NoSource):
        def draft_class(self, req):
            return "recorded" if req.rid.startswith("rec") else "lookup"

        def propose(self, reqs, ks, shape=None):
            return [[7] * k for k in ks]

    def req(rid):
        return SimpleNamespace(
            rid=rid,
            grammar=None,
            output_ids=[],
            seqlen=10,
            sampling_params=SamplingParams(max_new_tokens=64, temperature=0),
        )

    ctl = SpecController(Source(), 64)
    for rows in range(1, 65):
        ctl.costs.observe(rows, 0.008 + 0.001 * (rows - 1))
    for i in range(40):
        for r, accepted in ((req(f"rec{i}"), 30), (req(f"look{i}"), 1)):
            assert ctl.propose([r], 1000, 10_000)[0]
            verified(ctl, r, 30, accepted)
            ctl.release(r)
    assert len(ctl.propose([req("rec-new")], 1000, 10_000)[0]) == 63
    assert 1 <= len(ctl.propose([req("look-new")], 1000, 10_000)[0]) <= 2


def brute_force(ctl: SpecController, rates, caps, spare):
    bs, best = len(rates), (len(rates) / ctl.costs.cost(len(rates)), [0] * len(rates))
    for ks in itertools.product(*(range(c + 1) for c in caps)):
        if sum(ks) > spare or any(rates[i] ** k < MIN_WORTH for i, k in enumerate(ks) if k):
            continue
        tokens = bs + sum(sum(rates[i] ** j for j in range(1, k + 1)) for i, k in enumerate(ks))
        rate = tokens / ctl.costs.cost(bs + sum(ks))
        if rate > best[0] + 1e-12:
            best = (rate, list(ks))
    return best


@settings(max_examples=150, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(st.sampled_from([0.0, 0.2, 0.5, 0.7, 0.9, 0.97, 1.0]), st.integers(0, 4)),
        min_size=1,
        max_size=4,
    ),
    costs=st.lists(st.floats(0.5, 3.0), min_size=1, max_size=6),
    spare=st.integers(0, 12),
)
def test_allocate_maximizes_expected_tokens_per_second(reqs, costs, spare):
    ctl = SpecController(NoSource(), 4)
    # Measured costs at some row counts (increasing: a row never makes a step cheaper).
    total = 0.0
    for rows, c in enumerate(costs, 1):
        total += c
        ctl.costs.observe(rows * 2 - 1, total)
    rates, caps = [r for r, _ in reqs], [c for _, c in reqs]
    ks = ctl.allocate(rates, caps, spare)
    assert all(0 <= k <= c for k, c in zip(ks, caps)) and sum(ks) <= spare
    bs = len(rates)
    got = (
        bs + sum(sum(rates[i] ** j for j in range(1, k + 1)) for i, k in enumerate(ks))
    ) / ctl.costs.cost(bs + sum(ks))
    assert got == pytest.approx(brute_force(ctl, rates, caps, spare)[0], rel=1e-9)


def cpu_like() -> SpecController:
    """Costs as measured on the 2-core CPU (docs/benchmarks.md): a 1-row step 4 ms, each extra
    row ~1.3 ms."""
    ctl = SpecController(NoSource(), 8)
    for rows in range(1, 40):
        ctl.costs.observe(rows, 4.0 + 1.3 * (rows - 1))
    return ctl


def test_adaptive_lengths():
    ctl = cpu_like()
    assert ctl.allocate([1.0], [8], 100) == [8]  # always accepted, cheap rows: the whole draft
    # 75%: 1.75 / 5.3, 2.31 / 6.6, 2.73 / 7.9 expected tokens per ms for 1, 2, 3 drafts: 2 is best.
    assert ctl.allocate([0.75], [8], 100) == [2]
    assert ctl.allocate([0.1], [8], 100) == [0]  # drafts that fail: none
    assert ctl.allocate([1.0, 0.1], [8, 8], 100) == [8, 0]
    assert ctl.allocate([1.0], [8], 5) == [5]  # KV room
    # Compute-bound steps (a batch of 8 costs 2 + 8 units, each more row 1): a row gains less than
    # the step's 0.8 tokens per unit unless it is a sure draft.
    big = SpecController(NoSource(), 8)
    for rows in range(1, 80):
        big.costs.observe(rows, 2.0 + rows)
    assert big.allocate([0.75] * 8, [8] * 8, 100) == [0] * 8
    assert sum(big.allocate([1.0] * 8, [8] * 8, 100)) > 0


def test_rates_follow_recent_acceptance():
    class R:
        def __init__(self, rid):
            self.rid = rid

    ctl = cpu_like()
    good, bad = R("good"), R("bad")
    for _ in range(6):
        verified(ctl, good, 4, 4)
        verified(ctl, bad, 4, 0)
    assert ctl.rate("good") > 0.9 and ctl.rate("bad") < 0.3
    assert 0.3 < ctl.rate("new") < 0.9  # a new request starts from the global rate
    for _ in range(6):
        verified(ctl, good, 4, 0)  # it stopped being predictable: its drafts shrink, then stop
    assert ctl.allocate([ctl.rate("good")], [8], 100) == [1]
    for _ in range(6):
        verified(ctl, good, 4, 0)
    assert ctl.allocate([ctl.rate("good")], [8], 100) == [0]
    ctl.release(good)
    assert ctl.rate("good") == ctl.rate("new")


def test_probe_after_a_run_of_unpaying_steps():
    """Costs measured during a slowdown must not switch drafting off for good: after
    PROBE_INTERVAL steps without drafts, one step drafts as the prior would."""
    from types import SimpleNamespace

    from radixlm.sampling_params import SamplingParams
    from radixlm.speculative.controller import PROBE_INTERVAL

    class Source(NoSource):
        def propose(self, reqs, ks, shape=None):
            return [[7] * k for k in ks]

    ctl = SpecController(Source(), 4)
    for rows in range(1, 10):
        ctl.costs.observe(rows, 1.0 * rows**2)  # extra rows look ruinous
    req = SimpleNamespace(
        rid="r",
        grammar=None,
        output_ids=[1],
        seqlen=10,
        sampling_params=SamplingParams(max_new_tokens=100, temperature=0),
    )
    drafted = [i for i in range(1, 3 * PROBE_INTERVAL + 1) if ctl.propose([req], 100, 1000)[0]]
    assert drafted == [PROBE_INTERVAL, 2 * PROBE_INTERVAL, 3 * PROBE_INTERVAL]


def test_cheap_sources_learn_rates_without_verifying():
    """A batch where the prior rate does not pay: a cheap source's unverified drafts are scored
    against the tokens the steps produce, and drafting starts once they prove right; a source
    whose drafts are wrong never starts."""
    from types import SimpleNamespace

    from radixlm.sampling_params import SamplingParams

    def run(right: bool) -> list[int]:
        class Source(NoSource):
            cheap = True

            def propose(self, reqs, ks, shape=None):  # the next token is always 5
                return [[5 if right else 6] * k for k in ks]

        ctl = SpecController(Source(), 4)
        for rows in range(1, 80):
            ctl.costs.observe(rows, 2.0 + rows)  # compute-bound: only likely drafts pay at bs 8
        reqs = [
            SimpleNamespace(
                rid=f"r{i}",
                grammar=None,
                output_ids=[1],
                seqlen=10,
                sampling_params=SamplingParams(max_new_tokens=100, temperature=0),
            )
            for i in range(8)
        ]
        drafted = []
        for _ in range(12):
            drafts = ctl.propose(reqs, 1000, 1000)
            drafted.append(sum(map(len, drafts)))
            for r in reqs:
                r.output_ids.append(5)  # the step's token
        return drafted

    assert run(right=False) == [0] * 12
    got = run(right=True)
    assert got[0] == 0 and got[-1] > 0


def test_fixed_policy_sends_every_draft():
    ctl = SpecController(NoSource(), 8, policy="fixed")
    for rows in range(1, 40):
        ctl.costs.observe(rows, rows**2)  # drafts that never pay
    assert ctl.allocate([0.1, 0.0, 1.0], [8, 3, 8], 100) == [8, 3, 8]
    assert ctl.allocate([0.1, 0.0, 1.0], [8, 3, 8], 10) == [8, 2, 0]  # KV room


def test_tree_worth_prunes_nodes_and_sibling_acceptance_sets_the_width():
    """A node's worth is the product along its path of its request's rate (first children) and
    the measured acceptance of j-th children (j >= 1); nodes worth less than MIN_WORTH go. Sibling
    ranks whose acceptance falls below it leave the step's width; the fixed policy keeps them all.
    """
    from types import SimpleNamespace

    from radixlm.speculative.draft_tree import ROOT, TreeShape

    ctl = SpecController(NoSource(), 16, max_shape=TreeShape(3, 16))
    # A - A1 - A2, B - B1, C under the root.
    tree = DraftTree((1, 2, 3, 4, 5, 6), (ROOT, 0, 1, ROOT, 3, ROOT))
    req = SimpleNamespace(rid="r", grammar=None)
    assert ctl.shape(9) == TreeShape(3, 9)
    # Worth at rate 0.3, j-th children 0.2 (the prior): A .3, A1 .09, A2 .027, B .2, B1 .06, C .2.
    kept = ctl._fit(req, tree, 16, ctl.shape(16), 0.3)
    assert kept.tokens == (1, 2, 4, 5, 6)
    assert ctl._fit(req, tree, 2, ctl.shape(16), 0.3).tokens == (
        1,
        2,
    )  # the budget: the first nodes
    assert ctl._fit(req, tree, 16, TreeShape(2, 1), 0.3).tokens == (1, 4)  # the step's shape
    for _ in range(60):  # B is always the one accepted, C never, and nothing below B
        ctl.on_verified(req, tree, [3], 1, [0, 4])
    assert ctl._siblings[0].value() > 0.5 and ctl._siblings[1].value() < MIN_WORTH
    assert ctl.shape(16) == TreeShape(2, 16) and ctl.rate("r") < 0.1
    assert ctl.stats.tree_drafts == 60 and ctl.stats.branch_accepted == 60
    fixed = SpecController(NoSource(), 16, policy="fixed", max_shape=TreeShape(3, 16))
    fixed._siblings = ctl._siblings
    assert (
        fixed.shape(16) == TreeShape(3, 16)
        and fixed._fit(req, tree, 16, fixed.shape(16), 0.01) == tree
    )


def test_trees_follow_the_cost_model_and_go_off_for_compute_bound_batches():
    """A tree source (two branches under every node) gets tree budgets where rows are cheap and
    none at a batch size where a verify row costs more than it saves."""
    from types import SimpleNamespace

    from radixlm.sampling_params import SamplingParams
    from radixlm.speculative.draft_tree import ROOT, TreeShape

    class Trees(NoSource):
        cheap = True

        def propose(
            self, reqs, ks, shape=None
        ):  # (width 1: the chain of first children, as shadow drafts ask)
            return [
                DraftTree((5, 6, 5, 6), (ROOT, ROOT, 0, 0)).bounded(shape, k) if k else []
                for k in ks
            ]

    def reqs(n):
        return [
            SimpleNamespace(
                rid=f"r{i}",
                grammar=None,
                output_ids=[1],
                seqlen=10,
                sampling_params=SamplingParams(max_new_tokens=100, temperature=0),
            )
            for i in range(n)
        ]

    cheap = SpecController(Trees(), 8, max_shape=TreeShape(2, 8))
    for rows in range(1, 80):
        cheap.costs.observe(rows, 4.0 + 0.1 * (rows - 1))  # an extra row: 2.5% of a step
    (tree,) = cheap.propose(reqs(1), 100, 1000)
    assert len(tree) == 4 and not tree.is_chain
    bound = SpecController(Trees(), 8, max_shape=TreeShape(2, 8))
    for rows in range(1, 80):
        bound.costs.observe(rows, 2.0 + rows)  # compute-bound
    assert all(len(t) == 0 for t in bound.propose(reqs(8), 100, 1000))
