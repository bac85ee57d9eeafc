"""The hierarchical cache through `radixlm serve` with the default model: a document prefilled by
one server is served from disk by the next one started on the same directory (same greedy tokens and
logprobs as computing it), with per-tier metrics and /flush_cache levels."""

import time

import requests

from radixlm.server.process import ServerProcess

CHUNK = 64


def hicache_server(storage_dir, *extra):
    return ServerProcess(
        "--enable-hierarchical-cache",
        "--hicache-storage-backend",
        "file",
        "--hicache-storage-dir",
        str(storage_dir),
        "--hicache-storage-chunk-size",
        str(CHUNK),
        "--max-total-tokens",
        "4000",
        "--enable-metrics",
        "--enable-invariant-checks",
        *extra,
    )


def generate(url, text):
    r = requests.post(
        url + "/generate",
        json={
            "text": text,
            "return_logprob": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True},
        },
        timeout=300,
    )
    assert r.status_code == 200, r.text
    return r.json()


def hicache_info(url):
    return requests.get(url + "/get_server_info", timeout=30).json()["internal_state"]["hicache"]


def test_document_served_from_disk_after_restart(tmp_path):
    doc = " ".join(
        f"Clause {i}: the tenant shall keep the premises at number {i * 7} in good repair."
        for i in range(40)
    )
    question = "\n\nQuestion: which clause mentions number 91? Answer:"
    a = hicache_server(tmp_path)
    try:
        first = generate(a.url, doc + question)
        prompt_tokens = first["meta_info"]["prompt_tokens"]
        assert prompt_tokens > 500 and first["meta_info"]["cached_tokens"] == 0
        deadline = time.time() + 60
        while (
            hicache_info(a.url)["l3_chunks_written"] < (prompt_tokens - 1) // CHUNK
            and time.time() < deadline
        ):
            time.sleep(0.2)
    finally:
        assert a.stop() in (0, 143)
    b = hicache_server(tmp_path)
    try:
        again = generate(b.url, doc + question)
        cached = again["meta_info"]["cached_tokens"]
        assert (
            cached == (prompt_tokens - 1) // CHUNK * CHUNK
        )  # every full chunk of the prompt, from disk
        assert again["text"] == first["text"]
        lp_a = [x[0] for x in first["meta_info"]["output_token_logprobs"]]
        lp_b = [x[0] for x in again["meta_info"]["output_token_logprobs"]]
        # The default model's KV is float16 and so are the stored copies: bit-exact, only the
        # batch shape of the prefill differs.
        assert len(lp_a) == len(lp_b) == 12
        assert max(abs(x - y) for x, y in zip(lp_a, lp_b)) < 1e-3
        info = hicache_info(b.url)
        assert info["l3_hit_tokens"] == cached and info["corrupt_chunks"] == 0
        metrics = requests.get(b.url + "/metrics", timeout=30).text
        assert f'radixlm:hicache_hit_tokens{{tier="l3"}} {float(cached)}' in metrics
        assert 'radixlm:hicache_bytes_moved{direction="from_l3"}' in metrics

        r = requests.post(b.url + "/flush_cache?level=l9", timeout=30)
        assert r.status_code == 400 and "level" in r.json()["error"]["message"]
        assert requests.post(b.url + "/flush_cache", timeout=30).status_code == 200  # L1 only
        assert (
            generate(b.url, doc + question)["meta_info"]["cached_tokens"] == prompt_tokens - 1
        )  # from L2
    finally:
        b.stop()
