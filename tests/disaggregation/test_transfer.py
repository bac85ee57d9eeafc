"""The transfer layer alone (no model): the prefill and decode managers, their bootstrap service
and each backend move a prompt's KV slot for slot (checked against a naive copy), acknowledge it,
refuse a mismatched layout, and a cancelled room takes no late write."""

import time

import pytest
import torch

from radixlm.cache.memory_pool import TokenToKVPool
from radixlm.disaggregation.backends import LAYER_DELAY_ENV
from radixlm.disaggregation.config import DisaggregationConfig, DisaggregationMode, parse_bootstrap
from radixlm.disaggregation.decode_transfer import DecodeTransfer
from radixlm.disaggregation.prefill_transfer import PrefillTransfer
from radixlm.disaggregation.protocol import AuxRecord, KVPoll
from radixlm.ipc import BootstrapInfo
from radixlm.server.process import free_port
from tests.mooncake import requires_mooncake


def until(fn, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.01)
    raise AssertionError("timed out")


def pools(layers=3, heads=2, dim=8, size=64):
    torch.manual_seed(0)
    src, dst = TokenToKVPool(size, layers, heads, dim), TokenToKVPool(size, layers, heads, dim)
    for layer in range(layers):
        for t in src.get_kv_buffer(layer):
            t.copy_(torch.randn(t.shape))
    return src, dst


def pair(backend, src, dst):
    port = free_port()
    p = PrefillTransfer(
        DisaggregationConfig(DisaggregationMode.PREFILL, backend, port, debug_checksum=True), src
    )
    d = DecodeTransfer(
        DisaggregationConfig(DisaggregationMode.DECODE, backend, debug_checksum=True), dst
    )
    return p, d, BootstrapInfo("127.0.0.1", port, 12345)


@pytest.mark.parametrize(
    "backend", ["tcp", "shm", pytest.param("mooncake", marks=requires_mooncake), "fake"]
)
def test_a_room_moves_slot_for_slot(backend):
    src, dst = pools()
    p, d, info = pair(backend, src, dst)
    route = until(lambda: d.route(info))
    assert d.check_route(route) is None and route["backend"] == backend
    src_slots, dst_slots = torch.tensor([5, 9, 2, 40, 41, 7]), torch.tensor([33, 1, 60, 12, 13, 14])
    prefix_len = 4  # the decode side holds 4 prompt tokens already: positions 4..9 move
    d.start(info.room, route, dst_slots, prefix_len)
    dest = until(lambda: p.dest(info.room))
    assert (
        p.check_dest(dest, prompt_len=prefix_len + 6) is None
        and dest.dst_slots == dst_slots.tolist()
    )
    assert p.poll(info.room) is KVPoll.TRANSFERRING
    p.send(dest, src_slots, AuxRecord(info.room, first_token=17, num_tokens=6, cached_tokens=3))
    aux = until(lambda: d.arrived(info.room))
    assert (aux.first_token, aux.cached_tokens) == (17, 3)
    checksum = d.finish(info.room, route, ok=True)
    assert until(lambda: p.poll(info.room) is KVPoll.SUCCESS)
    for layer in range(src.num_layers):
        for s_buf, d_buf in zip(src.get_kv_buffer(layer), dst.get_kv_buffer(layer)):
            moved = torch.equal(d_buf[dst_slots], s_buf[src_slots])
            assert moved == (backend != "fake"), (backend, layer)
            if backend == "fake":
                assert not d_buf.any()  # nothing moved, nothing written
    if backend != "fake":
        assert checksum == aux.checksum == p.checksums[info.room]
        assert d.info()["bytes_received"] == (p.info()["bytes_sent"] if backend == "tcp" else 0)


def test_a_cancelled_room_takes_no_late_write(monkeypatch):
    monkeypatch.setenv(LAYER_DELAY_ENV, "0.3")
    src, dst = pools()
    p, d, info = pair("tcp", src, dst)
    route = until(lambda: d.route(info))
    d.start(info.room, route, torch.tensor([1, 2, 3]), 0)
    p.send(
        until(lambda: p.dest(info.room)),
        torch.tensor([4, 5, 6]),
        AuxRecord(info.room, 1, num_tokens=3),
    )
    time.sleep(0.1)  # the first layer is in
    d.finish(info.room, route, ok=False, reason="timed out")
    assert until(lambda: p.poll(info.room) is KVPoll.FAILED) and "timed out" in p.failure(info.room)
    time.sleep(1.2)  # the other layers and the aux record arrive after the cancel
    assert torch.equal(dst.get_kv_buffer(0)[0][1:4], src.get_kv_buffer(0)[0][4:7])
    for layer in range(1, src.num_layers):
        assert not dst.get_kv_buffer(layer)[0][1:4].any()
    assert d.arrived(info.room) is None


def test_a_mismatched_layout_is_refused():
    src, _ = pools(layers=3)
    p, d, info = pair("tcp", src, TokenToKVPool(64, 2, 2, 8))
    problem = d.check_route(until(lambda: d.route(info)))
    assert problem and "layout" in problem


def test_bootstrap_fields_are_checked():
    assert parse_bootstrap(None, None, None, "null", 1) is None
    assert parse_bootstrap("h", 1, 2, "decode", 1) == BootstrapInfo("h", 1, 2)
    for args, field in [
        (("h", None, 2, "decode", 1), "bootstrap_port"),
        (("h", 1, 2, "null", 1), "bootstrap_room"),
        (("h", 0, 2, "decode", 1), "bootstrap_port"),
        (("h", 1, -2, "decode", 1), "bootstrap_room"),
        (("h", 1, 2, "decode", 2), "sampling_params.n"),
        (("", 1, 2, "prefill", 1), "bootstrap_host"),
    ]:
        with pytest.raises(ValueError, match=field):
            parse_bootstrap(*args)
