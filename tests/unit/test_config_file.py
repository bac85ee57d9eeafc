"""`--config FILE.yaml` as SGLang reads it: SGLang's own ConfigArgumentMerger (its
server_args_config_parser, importable without its GPU dependencies) is the reference; radixlm's CLI
must read a file the same way, with the command line winning."""

import textwrap

import pytest

from tests.sglang_cli import parse, run_cli, serve_parser_of_main

# SGLang's documented example (docs/advanced_features/server_arguments.md, "Common launch
# commands"), less log-requests (another part of issue 49), with the model replaced.
EXAMPLE = """\
model-path: /models/tiny
host: 0.0.0.0
port: 30000
tensor-parallel-size: 2
enable-metrics: true
"""


def write(tmp_path, text, name="config.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def run(argv, monkeypatch, capsys, command="serve"):
    rc, err, args, seen = run_cli(argv, monkeypatch, capsys, command=command)
    return rc, err, args, seen.get("ns")


def test_same_options_as_sglangs_merger(tmp_path, monkeypatch, capsys):
    """The file's options reach ServerArgs as SGLang's ConfigArgumentMerger puts them on the command
    line."""
    from sglang.srt.server_args_config_parser import ConfigArgumentMerger

    path = write(
        tmp_path,
        EXAMPLE + "disable-radix-cache: false\nchunked-prefill-size: 512\nkv-cache-dtype: bf16\n",
    )
    rc, err, mine, _ = run(["--config", path], monkeypatch, capsys)
    assert rc == 0, err
    parser = serve_parser_of_main()
    reference = ConfigArgumentMerger(parser).merge_config_with_args(["--config", path])
    rc_ref, err_ref, theirs = parse(parser, reference)
    assert rc_ref == 0, err_ref
    assert mine == theirs
    assert (mine.model_path, mine.host, mine.port, mine.tp_size, mine.enable_metrics) == (
        "/models/tiny",
        "0.0.0.0",
        30000,
        2,
        True,
    )
    assert (mine.disable_radix_cache, mine.chunked_prefill_size, mine.kv_cache_dtype) == (
        False,
        512,
        "bfloat16",
    )


def test_command_line_wins_wherever_it_is(tmp_path, monkeypatch, capsys):
    path = write(tmp_path, EXAMPLE)
    for argv in (
        ["--config", path, "--port", "31234", "--tp", "1"],
        ["--port", "31234", "--tp", "1", "--config", path],
        [f"--config={path}", "--port", "31234", "--tp", "1"],
    ):
        rc, err, args, _ = run(argv, monkeypatch, capsys)
        assert rc == 0, err
        assert (args.port, args.tp_size, args.host, args.model_path) == (
            31234,
            1,
            "0.0.0.0",
            "/models/tiny",
        )


def test_sglang_keys_of_every_kind(tmp_path, monkeypatch, capsys):
    """Underscored keys, an inert switch (one log line), lists (radixlm's own and an inert one), a
    refused flag (its one line)."""
    path = write(
        tmp_path,
        """\
        model_path: /m
        disable-cuda-graph-padding: true
        cuda-graph-bs: [1, 2, 4]
        piecewise-cuda-graph-tokens: [1, 2, 4]
        enable-mixed-chunk: false
        speculative-algorithm: NGRAM
    """,
    )
    rc, err, args, ns = run(["--config", path], monkeypatch, capsys)
    assert rc == 0, err
    assert (args.model_path, args.enable_mixed_chunk, args.speculative_algorithm) == (
        "/m",
        False,
        "ngram",
    )
    # radixlm's own flag (model/executor/cuda_graph_runner.py)
    assert args.cuda_graph_bs == [1, 2, 4]
    assert ns.__dict__["sglang:piecewise-cuda-graph-tokens"] == ["1", "2", "4"]
    assert sum("--disable-cuda-graph-padding ignored" in line for line in err) == 1
    path = write(tmp_path, "enable-pdmux: true\n", "pdmux.yaml")
    rc, err, _, _ = run(["--config", path], monkeypatch, capsys)
    assert rc == 2 and err == [
        "radixlm: error: --enable-pdmux: these parts of prefill/decode disaggregation (RDMA "
        "devices, decode-side KV offload, PD multiplexing) and encoder disaggregation are not in "
        "radixlm ; --disaggregation-mode prefill|decode with --disaggregation-transfer-backend "
        "tcp|shm behind `radixlm router --pd-disaggregation`"
    ]


@pytest.mark.parametrize(
    "text,name,argv_extra,message",
    [
        ("port: 1\n", "config.json", [], "the file must be YAML (.yaml or .yml)"),
        ("no-such-option: 1\n", "config.yaml", [], "unknown option 'no-such-option'"),
        ("- a\n- b\n", "config.yaml", [], "the file must hold a mapping"),
        ("port: [\n", "config.yaml", [], "not valid YAML"),
        ("port: 1\n", "config.yaml", ["--config", "other.yaml"], "give one config file"),
    ],
)
def test_bad_files_are_one_line(tmp_path, monkeypatch, capsys, text, name, argv_extra, message):
    path = write(tmp_path, text, name)
    rc, err, args, _ = run(["--config", path, *argv_extra], monkeypatch, capsys)
    assert (
        rc == 2
        and len(err) == 1
        and err[0].startswith("radixlm: error: --config")
        and message in err[0]
    ), err
    assert args is None


def test_other_commands_take_it(tmp_path, monkeypatch, capsys):
    path = write(tmp_path, "model-path: /m\nmax-running-requests: 7\n")
    rc, err, args, ns = run(
        ["--config", path, "--prompt", "hi"], monkeypatch, capsys, command="generate"
    )
    assert rc == 0, err
    assert (args.model_path, args.max_running_requests, ns.prompt) == ("/m", 7, "hi")
