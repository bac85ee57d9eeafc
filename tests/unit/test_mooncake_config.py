"""Mooncake's settings read as SGLang reads them (cache/storage_mooncake.py: mooncake_env): the
extra config's JSON when it names master_server_address (its own defaults for what it leaves
out), else SGLANG_HICACHE_MOONCAKE_CONFIG_PATH's file, else the MOONCAKE_* variables; and what
--hicache-storage-backend-extra-config may hold, each refusal naming its field."""

import json

import pytest

from radixlm.cache.hicache_config import HiCacheConfig, extra_config
from radixlm.cache.storage_mooncake import ENV_DEFAULTS, mooncake_env

ENV = {
    "MOONCAKE_MASTER": "10.0.0.1:50051",
    "MOONCAKE_PROTOCOL": "rdma",
    "MOONCAKE_GLOBAL_SEGMENT_SIZE": "1024",
}


def test_the_environment_when_nothing_else_is_given():
    env = mooncake_env(ENV)
    assert env == {**ENV_DEFAULTS, **ENV}


def test_the_extra_config_wins_and_fills_its_own_defaults():
    config = {
        "master_server_address": "10.0.0.2:50051",
        "metadata_server": "http://10.0.0.2:8080/metadata",
        "global_segment_size": "4gb",
        "local_buffer_size": 1 << 20,
    }
    env = mooncake_env(ENV, extra_config=config)
    assert env["MOONCAKE_MASTER"] == "10.0.0.2:50051"
    assert env["MOONCAKE_TE_META_DATA_SERVER"] == "http://10.0.0.2:8080/metadata"
    assert env["MOONCAKE_GLOBAL_SEGMENT_SIZE"] == str(4 << 30)
    assert env["MOONCAKE_LOCAL_BUFFER_SIZE"] == str(1 << 20)
    assert env["MOONCAKE_PROTOCOL"] == ENV_DEFAULTS["MOONCAKE_PROTOCOL"]  # not the variable's


def test_the_config_file_before_the_environment(tmp_path):
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps({"master_server_address": "10.0.0.3:1", "protocol": "tcp"}))
    env = mooncake_env({**ENV, "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": str(path)})
    assert env["MOONCAKE_MASTER"] == "10.0.0.3:1" and env["MOONCAKE_PROTOCOL"] == "tcp"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="SGLANG_HICACHE_MOONCAKE_CONFIG_PATH.*JSON object"):
        mooncake_env({"SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": str(path)})


@pytest.mark.parametrize(
    "config, named",
    [
        ({"protocol": "tcp"}, "master_server_address is required"),
        ({"master_server_address": "h:1", "tenant_id": "a"}, "unknown key 'tenant_id'"),
        ({"master_server_address": "h:1", "global_segment_size": "lots"}, "global_segment_size"),
        ({"master_server_address": "h:1", "global_segment_size": 0}, "global_segment_size"),
        ({"master_server_address": 5}, "master_server_address must be a string"),
    ],
)
def test_a_bad_extra_config_is_refused_by_name(config, named):
    with pytest.raises(ValueError, match=named) as e:
        mooncake_env({}, extra_config=config)
    assert "hicache_storage_backend_extra_config" in str(e.value)


def test_the_flag_is_a_json_object_for_a_backend_that_reads_one():
    assert extra_config('{"master_server_address": "h:1"}') == {"master_server_address": "h:1"}
    assert extra_config(None) is None
    with pytest.raises(ValueError, match="not JSON"):
        extra_config("{master")
    with pytest.raises(ValueError, match="must be a JSON object"):
        extra_config("[1]")
    with pytest.raises(ValueError, match="read by the mooncake backend, not 'file'"):
        HiCacheConfig(storage_backend="file", storage_extra_config={"a": 1})
    HiCacheConfig(storage_backend="mooncake", storage_extra_config={"a": 1})
