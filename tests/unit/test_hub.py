"""Hub model ids resolved to local paths (radixlm/model/hub.py), against huggingface_hub's own cache
reader and llama.cpp's GGUF file rule; nothing here reaches the network (HF_HUB_OFFLINE)."""

from __future__ import annotations

import os

import pytest

from radixlm.config import ServerArgs
from radixlm.model.hub import (
    HubResolver,
    ModelNotFoundError,
    parse_hub_id,
    pick_gguf,
    resolve_model_paths,
)
from tests.hf_cache import dir_files, put_in_hf_cache


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def cache(tmp_path_factory, tiny_model_dir):
    """An HF cache holding the tiny model as org/tiny-llama (main) and a GGUF repo of small
    files."""
    root = tmp_path_factory.mktemp("hf-cache")
    put_in_hf_cache(str(root), "org/tiny-llama", dir_files(tiny_model_dir))
    src = tmp_path_factory.mktemp("gguf-src")
    ggufs = {}
    for name in ("tiny-F16.gguf", "tiny-Q4_K_M.gguf", "tiny-q8_0.gguf", "mmproj-tiny-Q8_0.gguf"):
        (src / name).write_bytes(b"GGUF" + name.encode())  # contents do not matter to the choice
        ggufs[name] = str(src / name)
    put_in_hf_cache(str(root), "org/tiny-GGUF", ggufs)
    return str(root)


def test_the_cache_layout_is_huggingface_hubs(cache, tiny_model_dir):
    from huggingface_hub import scan_cache_dir, snapshot_download

    repos = {r.repo_id: r for r in scan_cache_dir(cache).repos}
    assert set(repos) == {"org/tiny-llama", "org/tiny-GGUF"}
    (rev,) = repos["org/tiny-llama"].revisions
    assert rev.refs == frozenset({"main"})
    assert {f.file_name for f in rev.files} == set(os.listdir(tiny_model_dir))
    snapshot = snapshot_download("org/tiny-llama", cache_dir=cache, local_files_only=True)
    assert HubResolver(cache).resolve("org/tiny-llama", None, "--model-path") == snapshot
    assert HubResolver(cache).resolve("org/tiny-llama", rev.commit_hash, "--model-path") == snapshot
    for name in os.listdir(tiny_model_dir):
        with (
            open(os.path.join(snapshot, name), "rb") as a,
            open(os.path.join(tiny_model_dir, name), "rb") as b,
        ):
            assert a.read() == b.read()


def test_gguf_repo_by_quant_tag(cache):
    from huggingface_hub import hf_hub_download

    hub = HubResolver(cache)
    for spec, name in (
        ("org/tiny-GGUF:Q8_0", "tiny-q8_0.gguf"),
        ("org/tiny-GGUF:q4_k_m", "tiny-Q4_K_M.gguf"),
        ("org/tiny-GGUF", "tiny-Q4_K_M.gguf"),
        ("org/tiny-GGUF:F16", "tiny-F16.gguf"),
    ):
        got = hub.resolve(spec, None, "--model-path")
        assert got == hf_hub_download(
            "org/tiny-GGUF", name, cache_dir=cache, local_files_only=True
        ), spec
    with pytest.raises(ModelNotFoundError) as e:
        hub.resolve("org/tiny-GGUF:Q5_K_M", None, "--model-path")
    msg = str(e.value)
    assert (
        "matching :Q5_K_M" in msg and "tiny-q8_0.gguf" in msg and "hf download org/tiny-GGUF" in msg
    )


def test_llama_cpp_file_rule():
    files = [
        "b/tiny-Q8_0.gguf",
        "a/tiny-Q4_K_S.gguf",
        "mmproj-Q4_K_M.gguf",
        "README.md",
        "tiny.imatrix-Q4_K_M.gguf",
        "big-Q6_K-00002-of-00002.gguf",
        "big-Q6_K-00001-of-00002.gguf",
    ]
    assert pick_gguf(files, "q8_0", "o/r") == "b/tiny-Q8_0.gguf"
    assert pick_gguf(files, None, "o/r") == "b/tiny-Q8_0.gguf"  # no Q4_K_M model file: Q8_0 next
    assert (
        pick_gguf(files[1:], None, "o/r") == "a/tiny-Q4_K_S.gguf"
    )  # neither: the first model file
    assert pick_gguf(files + ["c/tiny-Q4_K_M.gguf"], None, "o/r") == "c/tiny-Q4_K_M.gguf"
    with pytest.raises(
        ModelNotFoundError, match="matching :Q4_K"
    ):  # the tag must end at '.' or '-'
        pick_gguf(["tiny-Q4_K_M.gguf"], "Q4_K", "o/r")
    with pytest.raises(ModelNotFoundError, match="split in 2 parts"):
        pick_gguf(files, "Q6_K", "o/r")


def test_a_local_path_wins(cache, tiny_model_dir, tmp_path, monkeypatch):
    (tmp_path / "org").mkdir()
    os.symlink(
        tiny_model_dir, tmp_path / "org" / "tiny-GGUF"
    )  # shadows the cached repo of that name
    monkeypatch.chdir(tmp_path)
    assert HubResolver(cache).resolve("org/tiny-GGUF", None, "--model-path") == "org/tiny-GGUF"
    assert parse_hub_id("./org/tiny-GGUF") is None and parse_hub_id("/abs/path") is None
    assert parse_hub_id("org/name:Q4_K_M").tag == "Q4_K_M" and parse_hub_id("a/b/c") is None


def test_offline_errors_name_what_to_download(cache):
    hub = HubResolver(cache)
    with pytest.raises(ModelNotFoundError) as e:
        hub.resolve("org/absent", None, "--model-path")
    assert str(e.value).startswith("--model-path org/absent: not a local path")
    assert f"`hf download org/absent --cache-dir {cache}`" in str(e.value)
    with pytest.raises(ModelNotFoundError) as e:
        hub.resolve("org/tiny-llama", "v2", "--model-path")
    assert "revision 'v2' of org/tiny-llama" in str(e.value) and "it has main = " in str(e.value)
    assert "hf download org/tiny-llama --revision v2" in str(e.value)


def test_server_args_resolved_once(cache, tiny_model_dir):
    from huggingface_hub import snapshot_download

    snapshot = snapshot_download("org/tiny-llama", cache_dir=cache, local_files_only=True)
    args = resolve_model_paths(
        ServerArgs(
            model_path="org/tiny-llama",
            tokenizer_path="org/tiny-llama",
            speculative_algorithm="draft-model",
            speculative_draft_model_path="org/tiny-llama",
            download_dir=cache,
        )
    )
    assert (args.model_path, args.tokenizer_path, args.speculative_draft_model_path) == (
        snapshot,
    ) * 3
    assert args.served_model_name == "org/tiny-llama"  # SGLang's served name: the id given
    local = resolve_model_paths(ServerArgs(model_path=tiny_model_dir, download_dir=cache))
    assert local.model_path == tiny_model_dir and local.served_model_name is None
    with pytest.raises(
        ModelNotFoundError, match="--speculative-draft-model-path org/tiny-llama: .*revision 'x'"
    ):
        resolve_model_paths(
            ServerArgs(
                model_path=tiny_model_dir,
                speculative_algorithm="draft-model",
                speculative_draft_model_path="org/tiny-llama",
                speculative_draft_model_revision="x",
                download_dir=cache,
            )
        )


def test_download_when_not_cached(cache, tiny_model_dir, tmp_path, monkeypatch):
    """Online (no network here: huggingface_hub's calls are stood in for): what is asked of the
    Hub."""
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    calls = []
    repo_files = {
        "org/new": ["config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json"],
        "org/new-GGUF": ["README.md", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "mmproj-m-Q8_0.gguf"],
    }

    def list_repo_files(self, repo_id, revision=None, **kw):
        return repo_files[repo_id]

    real_snapshot_download = huggingface_hub.snapshot_download

    def snapshot_download(repo_id, revision=None, cache_dir=None, allow_patterns=None, **kw):
        if kw.get("local_files_only"):  # the cache lookup: no network in any case
            return real_snapshot_download(
                repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=allow_patterns, **kw
            )
        calls.append(("snapshot", repo_id, revision, cache_dir, tuple(allow_patterns)))
        return tiny_model_dir

    def hf_hub_download(repo_id, filename, revision=None, cache_dir=None, **kw):
        calls.append(("file", repo_id, filename, revision, cache_dir))
        return str(tmp_path / filename)

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", list_repo_files)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    hub = HubResolver(cache)
    assert hub.resolve("org/new", "v1", "--model-path") == tiny_model_dir
    assert hub.resolve("org/new-GGUF:q8_0", None, "--model-path") == str(tmp_path / "m-Q8_0.gguf")
    snap, file_ = calls
    assert snap[:4] == ("snapshot", "org/new", "v1", cache)
    import fnmatch

    wanted = {f for f in repo_files["org/new"] if any(fnmatch.fnmatch(f, p) for p in snap[4])}
    assert wanted == {"config.json", "model.safetensors", "tokenizer.json"}  # no .bin: never read
    assert file_ == ("file", "org/new-GGUF", "m-Q8_0.gguf", None, cache)
    assert hub.resolve("org/tiny-llama", None, "--model-path").startswith(cache)  # cached: no call
    assert len(calls) == 2
