"""Issue 39, failures: a decode (or prefill) server killed in the middle of a transfer leaves the
other server's KV pool at its baseline after the timeout and the client a 5xx, never a hang; a
pair whose prefill server cannot be reached is retried once on another pair; the shm backend
moves the same KV as tcp."""

import concurrent.futures
import os
import signal

import pytest
import requests

from radixlm.disaggregation.backends import LAYER_DELAY_ENV
from tests.disaggregation.cluster import (
    GREEDY,
    decode,
    pool_at_baseline,
    prefill,
    router,
    server,
    state,
    wait_for,
)

TIMEOUTS = ("--disaggregation-waiting-timeout", "3", "--disaggregation-bootstrap-timeout", "3")
BODY = {"text": "a long enough prompt " * 20, "sampling_params": GREEDY}


def _kill(s) -> None:
    os.kill(s.proc.pid, signal.SIGKILL)  # the scheduler and detokenizer follow (PR_SET_PDEATHSIG)
    s.proc.wait()


def _send(r):
    return requests.post(r.url + "/generate", json=BODY, timeout=60)


@pytest.mark.parametrize("victim", ["decode", "prefill"])
def test_peer_killed_mid_transfer_frees_the_other_pool(tiny_model_dir, victim):
    # Each layer's KV takes 2 s to send: the transfer is surely under way when the victim dies.
    p = prefill(tiny_model_dir, "tcp", *TIMEOUTS, env={LAYER_DELAY_ENV: "2"})
    d = decode(tiny_model_dir, "tcp", *TIMEOUTS)
    r = router([p], [d])
    try:
        survivor = d if victim == "prefill" else p
        baseline = state(survivor)
        assert pool_at_baseline(baseline)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(_send, r)
            wait_for(
                lambda: state(p)["disaggregation"]["rooms_sending"] == 1,
                30,
                "the transfer to start",
            )
            assert not pool_at_baseline(state(survivor))  # the survivor holds the room's slots now
            _kill(p if victim == "prefill" else d)
            resp = answer.result(timeout=30)
        assert 500 <= resp.status_code < 600, resp.text
        wait_for(
            lambda: pool_at_baseline(state(survivor)), 15, f"the {survivor} pool back at baseline"
        )
        info = state(survivor)["disaggregation"]
        assert info["transfers_failed"] == 1 and info["rooms_in_flight"] == 0
        # The survivor goes on serving.
        assert requests.post(survivor.url + "/generate", json=BODY, timeout=60).status_code == 200
    finally:
        for s in (r, p, d):
            s.stop()


def test_retry_on_another_pair_and_the_shm_backend(tiny_model_dir):
    plain = server(tiny_model_dir)
    ps = [prefill(tiny_model_dir, "shm"), prefill(tiny_model_dir, "shm")]
    d = decode(tiny_model_dir, "shm")
    r = router(ps, [d], "--prefill-policy", "round_robin")
    try:
        want = requests.post(plain.url + "/generate", json=BODY, timeout=60).json()["output_ids"]
        got = requests.post(r.url + "/generate", json=BODY, timeout=60)
        assert got.status_code == 200 and got.json()["output_ids"] == want
        sent = {
            **state(ps[0])["disaggregation"]["checksums"],
            **state(ps[1])["disaggregation"]["checksums"],
        }
        received = state(d)["disaggregation"]["checksums"]
        assert received and all(sent[room] == c for room, c in received.items())
        assert (
            state(d)["disaggregation"]["backend"] == "shm"
            and state(d)["disaggregation"]["shm_pool"]
        )
        # One prefill server dies before the router's health checks notice: the requests it would
        # get never start there and go to the other pair.
        _kill(ps[0])
        for _ in range(2):
            got = requests.post(r.url + "/generate", json=BODY, timeout=60)
            assert got.status_code == 200 and got.json()["output_ids"] == want
        assert requests.get(r.url + "/get_server_info", timeout=10).json()["router"]["retries"] >= 1
        wait_for(lambda: pool_at_baseline(state(d)), 10, "the decode pool at baseline")
    finally:
        for s in (r, *ps, d, plain):
            s.stop()
