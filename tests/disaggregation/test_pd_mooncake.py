"""PD over Mooncake's transfer engine (`--disaggregation-transfer-backend mooncake`, TCP here): one
prefill and one decode server behind `radixlm router --pd-disaggregation` answer an ordinary
server's greedy tokens, plain and streamed, for a prompt of one chunk and of several; the KV the
decode side holds equals what the prefill sent (checksums), written one-sided into its pool
(nothing crossed the data socket but the aux records)."""

import json

import pytest
import requests

from tests.disaggregation.cluster import GREEDY, decode, prefill, router, server, state
from tests.mooncake import requires_mooncake

pytestmark = requires_mooncake


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    plain = server(tiny_model_dir)
    p, d = prefill(tiny_model_dir, "mooncake"), decode(tiny_model_dir, "mooncake")
    r = router([p], [d])
    yield r, plain, p, d
    for s in (r, plain, p, d):
        s.stop()


def post(s, body):
    r = requests.post(s.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def streamed_ids(s, body) -> list[int]:
    with requests.post(
        s.url + "/generate", json={**body, "stream": True}, stream=True, timeout=120
    ) as r:
        assert r.status_code == 200, r.text
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith(b"data: ")]
    assert lines[-1] == b"[DONE]"
    return json.loads(lines[-2])["output_ids"]


def test_greedy_tokens_and_kv_over_mooncake(cluster):
    r, plain, p, d = cluster
    for text in ("The quick brown fox jumps over the lazy dog", "word " * 150):
        body = {"text": text, "sampling_params": GREEDY}
        want = post(plain, body)
        got = post(r, body)
        assert got["output_ids"] == want["output_ids"] and got["text"] == want["text"]
        assert streamed_ids(r, body) == want["output_ids"]
    sent = state(p)["disaggregation"]["checksums"]
    received = state(d)["disaggregation"]["checksums"]
    assert len(received) >= 4 and all(sent[room] == received[room] for room in received)
    assert state(p)["disaggregation"]["bytes_sent"] > 0
    assert state(d)["disaggregation"]["bytes_received"] == 0  # one-sided writes, no KV frames
