"""The router's routing key of a request with a cache_salt (issue 35, finding 9): the salt's mark
plus the prompt, so requests of one salt gather on the worker that holds their prefixes, and a
prefix cached under another salt (useless to them on the worker) does not attract them."""

from radixlm.router.policies import CacheAwareConfig, CacheAwarePolicy
from radixlm.router.routing_text import routing_text

W = ["http://a", "http://b"]
DOC = "The lease of the premises at number 91, clause by clause. " * 10


def test_routing_text_carries_the_salt():
    plain = routing_text("/generate", {"text": DOC})
    assert plain == DOC
    a = routing_text("/generate", {"text": DOC, "cache_salt": "alice"})
    assert a.endswith(DOC) and a != DOC and "alice" not in a  # a hash of the salt, not the salt
    assert routing_text("/v1/completions", {"prompt": DOC, "cache_salt": "alice"}) == a
    assert (
        routing_text("/generate", {"text": [DOC, "x"], "cache_salt": ["alice", "bob"]}) == a
    )  # a batch: its first
    chat = routing_text(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": DOC}], "cache_salt": "alice"},
    )
    assert chat.startswith(a[: a.index(DOC)])
    assert routing_text("/generate", {"text": DOC, "cache_salt": "bob"}) != a


def test_cache_aware_routing_keeps_salts_apart():
    t = iter(range(10_000))
    p = CacheAwarePolicy(CacheAwareConfig(cache_threshold=0.5), clock=lambda: float(next(t)))
    key = lambda salt, q: routing_text("/generate", {"text": DOC + q, "cache_salt": salt})
    alice = p.select(W, {}, key("alice", "q1"))
    assert p.select(W, {alice: 1}, key("alice", "q2")) == alice  # her prefix: her worker
    # Bob's copy of the same document is not cached for him anywhere: the less loaded worker.
    bob = p.select(W, {alice: 1}, key("bob", "q1"))
    assert bob != alice
    assert p.select(W, {alice: 0, bob: 1}, key("bob", "q2")) == bob
