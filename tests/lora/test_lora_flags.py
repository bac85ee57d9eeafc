"""SGLang's LoRA flags on `radixlm serve`'s command line, up to the engine's option check: the three
--lora-paths forms, the defaults, and the refusals that name the option."""

import json

from radixlm.engine.launcher import check_server_args
from radixlm.lora.config import LoRARef
from tests.sglang_cli import run_cli


def test_lora_paths_forms_and_defaults(monkeypatch, capsys):
    pinned = json.dumps({"lora_name": "legal", "lora_path": "/ad/legal", "pinned": True})
    rc, err, args, _ = run_cli(
        [
            "--lora-paths",
            "sql=/ad/sql",
            "/ad/chat",
            pinned,
            "--lora-backend",
            "triton",
            "--lora-target-modules",
            "qkv_proj",
            "o_proj",
        ],
        monkeypatch,
        capsys,
    )
    assert rc == 0, err
    lora = check_server_args(args).runner.lora
    assert lora.adapters == (
        LoRARef("sql", "/ad/sql"),
        LoRARef("/ad/chat", "/ad/chat"),
        LoRARef("legal", "/ad/legal", pinned=True),
    )
    assert lora.target_modules == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert (
        lora.max_loras_per_batch,
        lora.max_loaded_loras,
        lora.max_lora_rank,
        lora.eviction_policy,
        lora.backend,
    ) == (8, None, None, "lru", "triton")
    rc, err, args, _ = run_cli([], monkeypatch, capsys)
    assert rc == 0 and check_server_args(args).runner.lora is None


def test_lora_refusals_name_the_option(monkeypatch, capsys):
    for argv, named in [
        (["--lora-eviction-policy", "mru"], "--lora-eviction-policy"),
        (["--lora-paths", "a=/x", "--max-loras-per-batch", "0"], "max_loras_per_batch"),
        (["--lora-paths", "a=/x", "a=/y"], "twice"),
        (["--lora-paths", "{bad json"], "lora_paths"),
        (["--lora-paths", "a:b=/x"], "lora_name"),
        (["--enable-lora"], "max_lora_rank"),
        (["--lora-paths", "a=/x", "--tp-size", "2"], "tp_size"),
        (
            ["--lora-paths", "a=/x", "--max-lora-rank", "8", "--lora-target-modules", "lm_head"],
            "lora_target_modules",
        ),
    ]:
        rc, err, args, _ = run_cli(argv, monkeypatch, capsys, check=True)
        assert rc != 0, argv
        assert any(named in line for line in err), (argv, err)
