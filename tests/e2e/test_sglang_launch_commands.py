"""SGLang's documented launch commands (sglang_launch_commands.yaml, copied from SGLang's docs) run
as `radixlm serve`: `python -m sglang.launch_server` becomes `radixlm serve`, the model id a tiny
random model's directory, the port a free one. Each either starts (/health 200, and a greedy request
gives the tokens HF transformers' greedy decoding gives) or is refused with the one line the flag
table (radixlm/sglang_flags.py) gives for one of its flags, exit 2, no traceback."""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
import torch
import yaml

from radixlm.kernels.triton_ops import INTERPRET_ENV
from radixlm.model.quant.methods import refusal as quantization_refusal
from radixlm.server.process import ServerProcess
from radixlm.sglang_flags import COMBINATIONS, VALUE_RULES, Kind, all_specs
from tests.forked_servers import run_cli

CASES = yaml.safe_load((Path(__file__).parent / "sglang_launch_commands.yaml").read_text())
PROMPT = "The capital of France is"
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def tp_model_dir(tmp_path_factory, default_model_path):
    """A 2-layer Llama whose heads (12, 6 KV) and sizes split over the documented --tp 2 and --tp
    6."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from radixlm.model.loader import load_tokenizer

    path = tmp_path_factory.mktemp("tiny-tp-llama")
    tok = load_tokenizer(default_model_path)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=192,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=12,
        num_key_value_heads=6,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.25,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).eval().save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def reference(tp_model_dir):
    """The prompt's ids and HF transformers' greedy continuation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tp_model_dir)(PROMPT)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(tp_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return ids, out[0, len(ids) :].tolist()


def radixlm_argv(case: dict, model_dir: str, tmp_path: Path) -> list[str]:
    """The command as `radixlm serve` arguments: the model replaced, --port dropped (the test picks
    one), a --config file written with its model replaced."""
    argv = shlex.split(case["command"])
    assert argv[:3] in (
        ["python", "-m", "sglang.launch_server"],
        ["python3", "-m", "sglang.launch_server"],
    )
    out, rest = [], argv[3:]
    while rest:
        flag = rest.pop(0)
        if flag in ("--model-path", "--model"):
            rest.pop(0)
            out += [flag, model_dir]
        elif flag == "--port":
            rest.pop(0)
        elif flag == "--config":
            rest.pop(0)
            config = yaml.safe_load(case["config"])
            config["model-path"] = model_dir
            path = tmp_path / "config.yaml"
            path.write_text(yaml.safe_dump(config))
            out += [flag, str(path)]
        else:
            out.append(flag)
    return out


def expected_refusals(case: dict) -> set[str]:
    """The one-line errors the table gives for this command's refused flags and values (any one of
    them may come first)."""
    argv = shlex.split(case["command"])[3:]
    if "config" in case:
        for key, value in yaml.safe_load(case["config"]).items():
            argv += [f"--{key}"] + ([] if value is True else [str(value)])
    table, lines = all_specs(), set()
    for i, token in enumerate(argv):
        value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
        if token in table:
            group, spec = table[token]
            if group.kind == Kind.REFUSED and (value or "") not in spec.accepted:
                shown = spec.name if spec.nargs == 0 else f"{spec.name} {value}"
                lines.add(f"radixlm: error: {shown}: {group.why} ; {group.instead}")
        for rule in VALUE_RULES.values():
            for refused in rule.refused:
                if token == rule.flag and value in refused.values:
                    lines.add(f"radixlm: error: {token} {value}: {refused.why} ; {refused.instead}")
        if token == "--quantization" and value is not None:  # a method this CPU cannot run (fp8)
            why = quantization_refusal(value, "cpu")
            if why is not None:
                lines.add(f"radixlm: error: {why}")
    sizes = {
        dest: int(argv[argv.index(flag) + 1])
        for flag, dest in (
            ("--tp", "tp_size"),
            ("--tp-size", "tp_size"),
            ("--dp", "dp_size"),
            ("--dp-size", "dp_size"),
        )
        if flag in argv
    }
    parsed = SimpleNamespace(
        **{
            "tp_size": 1,
            "dp_size": 1,
            **sizes,
            "enable_dp_attention": "--enable-dp-attention" in argv,
        }
    )
    for combo in COMBINATIONS:  # flags refused together, with the sizes the command gives
        if combo.refuses(parsed):
            lines.add(f"radixlm: error: {combo.flag}: {combo.why} ; {combo.instead}")
    return lines


def case_id(case: dict) -> str:
    return " ".join(
        a
        for a in shlex.split(case["command"])[3:]
        if a.startswith("--")
        and a
        not in (
            "--model",
            "--model-path",
            "--host",
            "--port",
            "--trust-remote-code",
            "--device",
        )
    )


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_sglang_launch_command(case, tp_model_dir, reference, tmp_path, monkeypatch):
    argv = radixlm_argv(case, tp_model_dir, tmp_path)
    # The server runs as a user's would: without the tests' Triton interpreter (under it a
    # CUDA-only method such as fp8 would run on the CPU instead of being refused).
    monkeypatch.delenv(INTERPRET_ENV, raising=False)
    refusals = expected_refusals(case)
    if refusals:
        r = run_cli(["serve", *argv], timeout=120)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 2 and len(lines) == 1 and lines[0] in refusals, (
            case["command"],
            r.stderr,
        )
        return
    server = ServerProcess(*argv, timeout=300)
    try:
        assert requests.get(server.url + "/health", timeout=10).status_code == 200
        ids, greedy = reference
        out = requests.post(
            server.url + "/generate",
            timeout=120,
            json={
                "input_ids": ids,
                "sampling_params": {
                    "max_new_tokens": NEW_TOKENS,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            },
        )
        assert out.status_code == 200, out.text
        assert out.json()["output_ids"] == greedy, case["command"]
    finally:
        server.stop()
