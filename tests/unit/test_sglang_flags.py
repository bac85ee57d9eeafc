"""Every SGLang server flag on radixlm's command line (radixlm/sglang_flags.py): the installed
sglang's parser (read with ast) is the reference for the flags, their arity and their choices; the
CLI runs for real up to the engine's option check (check_server_args), with no server."""

import pytest
import torch

import radixlm.cli as cli
from radixlm.config import ServerArgs
from radixlm.engine.launcher import check_server_args
from radixlm.sglang_flags import GROUPS, VALUE_RULES, Kind, all_specs
from radixlm.sglang_flags_doc import DOC, classify, generate, radixlm_parser, read_sglang_flags
from tests.sglang_cli import parse, run_cli, serve_parser_of_main

SGLANG_FLAGS = read_sglang_flags()
# A value of each SGLang `type=` (the CLI's spelling); choices use their own values.
DUMMY = {
    "int": "1",
    "float": "0.5",
    "human_readable_int": "2k",
    "json.loads": "{}",
    "json_list_type": "[]",
}


def run(argv, monkeypatch, capsys, check=False):
    rc, err, args, seen = run_cli(argv, monkeypatch, capsys, check=check)
    return rc, err, {**seen, "args": args} if args else seen


@pytest.fixture(scope="module")
def serve_parser():
    """The parser cli.main builds for `radixlm serve`, built once: the exhaustive tests below parse
    ~700 command lines, and building it costs ~0.1 s."""
    return serve_parser_of_main()


REFUSED_VALUES = {r.flag: {v for rv in r.refused for v in rv.values} for r in VALUE_RULES.values()}


def argv_for(flag, option):
    """option with values of SGLang's arity (a choice radixlm takes, when it takes any)."""
    values = {0: [], "?": [], "*": []}.get(flag.nargs)
    if values is None:
        ok = [c for c in flag.choices or () if c not in REFUSED_VALUES.get(flag.name, ())]
        one = ok[0] if ok else DUMMY.get(flag.type_name, "x")
        values = [one, one] if flag.nargs == "+" else [one]
    return [option, *values], values


def test_every_sglang_flag_parses_as_sglang_parses_it(serve_parser):
    """Each option string of each SGLang flag, with SGLang's arity: accepted (same, different,
    inert, a refused flag's accepted value) or refused with its one line, as the table says."""
    table = all_specs()
    for flag in SGLANG_FLAGS:
        for option in flag.options:
            argv, values = argv_for(flag, option)
            rc, err, sa = parse(serve_parser, argv)
            entry = table.get(option)
            if (
                entry
                and entry[0].kind == Kind.REFUSED
                and " ".join(values) not in entry[1].accepted
            ):
                group = entry[0]
                assert (
                    rc == 2
                    and err.startswith(f"radixlm: error: {entry[1].name}")
                    and err.endswith(f"{group.why} ; {group.instead}")
                ), (option, err)
            else:
                assert rc == 0 and isinstance(sa, ServerArgs), (option, err)


def test_every_sglang_choice_is_accepted_or_refused_in_one_line(serve_parser):
    """Every value of every SGLang flag with choices, through the CLI's parser and the engine's
    option check: accepted (its configs build, its dtypes resolve) or one line naming the flag."""
    for flag in SGLANG_FLAGS:
        for value in flag.choices or ():
            rc, err, _ = parse(serve_parser, [flag.name, value], check=True)
            if rc:
                assert "\n" not in err and (
                    flag.name in err or flag.name[2:].replace("-", "_") in err
                ), err


def test_sglang_spellings_become_radixlms(monkeypatch, capsys):
    cases = {
        ("--dtype", "half"): ("dtype", "half", torch.float16),
        ("--dtype", "float"): ("dtype", "float", torch.float32),
        ("--kv-cache-dtype", "bf16"): ("kv_cache_dtype", "bfloat16", torch.bfloat16),
        ("--attention-backend", "torch_native"): ("attention_backend", "torch", None),
        ("--attention-backend", "intel_amx"): ("attention_backend", "native", None),
        ("--speculative-algorithm", "NGRAM"): ("speculative_algorithm", "ngram", None),
    }
    for (flag, value), (field, expected, dtype) in cases.items():
        rc, err, seen = run([flag, value], monkeypatch, capsys, check=True)
        assert rc == 0, err
        assert getattr(seen["args"], field) == expected
        if dtype is not None:
            assert dtype in seen["dtypes"]
    # STANDALONE is the draft-model algorithm, with SGLang's --speculative-draft-model spelling of
    # its path
    rc, err, seen = run(
        ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model", "/d"],
        monkeypatch,
        capsys,
    )
    assert rc == 0 and (
        seen["args"].speculative_algorithm,
        seen["args"].speculative_draft_model_path,
    ) == ("draft-model", "/d")
    # the Python API takes the same spellings, and refuses with the field's name
    assert (
        ServerArgs(kv_cache_dtype="bf16", attention_backend="torch_native").kv_cache_dtype
        == "bfloat16"
    )
    with pytest.raises(ValueError, match=r"^kv_cache_dtype='fp8_e4m3': .* ; "):
        ServerArgs(kv_cache_dtype="fp8_e4m3")


def test_every_radixlm_choice_reaches_its_consumer(serve_parser):
    """The class of bug where argparse offers a value the component then cannot use (dtype
    half/float used to pass the parser and fail in resolved_dtype): every choice of every option,
    SGLang's spellings included, builds the engine's configs and resolves."""
    for action in serve_parser._actions:
        if action.choices is None or action.dest.startswith("sglang:"):
            continue
        rule = VALUE_RULES.get(action.dest)
        refused = {v for r in rule.refused for v in r.values} if rule else set()
        for value in action.choices:
            if value in refused:
                with pytest.raises(ValueError, match=" ; "):
                    ServerArgs(**{action.dest: value})
                continue
            kw = {action.dest: value}
            if action.dest == "speculative_algorithm" and ServerArgs(
                **kw
            ).speculative_algorithm in ("draft-model", "eagle", "eagle3"):
                kw["speculative_draft_model_path"] = "/draft"
            if action.dest == "hicache_storage_backend":
                kw["enable_hierarchical_cache"] = True
            runner = check_server_args(ServerArgs(**kw)).runner
            assert isinstance(runner.resolved_dtype(), torch.dtype) and isinstance(
                runner.resolved_kv_cache_dtype(), torch.dtype
            ), kw


def test_refusal_and_inert_lines(monkeypatch, capsys):
    rc, err, _ = run(["--enable-pdmux", "--disable-cuda-graph"], monkeypatch, capsys)
    assert rc == 2 and err == [
        "radixlm: error: --enable-pdmux: these parts of prefill/decode disaggregation (RDMA "
        "devices, decode-side KV offload, PD multiplexing) and encoder disaggregation are not in "
        "radixlm ; --disaggregation-mode prefill|decode with --disaggregation-transfer-backend "
        "tcp|shm behind `radixlm router --pd-disaggregation`"
    ]
    rc, err, _ = run(
        [
            "--disable-cuda-graph-padding",
            "--piecewise-cuda-graph-tokens",
            "8",
            "--attn-cp-size",
            "1",
        ],
        monkeypatch,
        capsys,
    )
    assert rc == 0 and len(err) == 3
    assert any("--disable-cuda-graph-padding ignored: CUDA graphs" in line for line in err)
    assert any("--piecewise-cuda-graph-tokens 8 ignored" in line for line in err)
    assert any("--attention-context-parallel-size 1: accepted" in line for line in err)
    # SGLang's CUDA-graph switches radixlm implements are its own flags
    # (model/executor/cuda_graph_runner.py).
    rc, err, seen = run(
        ["--disable-cuda-graph", "--cuda-graph-max-bs", "8", "--cuda-graph-bs", "1", "8"],
        monkeypatch,
        capsys,
    )
    assert rc == 0 and not err
    args = seen["args"]
    assert (args.disable_cuda_graph, args.cuda_graph_max_bs, args.cuda_graph_bs) == (
        True,
        8,
        [1, 8],
    )
    rc, err, _ = run(["--attn-cp-size", "2"], monkeypatch, capsys)
    assert rc == 2 and err[0].startswith(
        "radixlm: error: --attention-context-parallel-size 2: context"
    )


def test_human_readable_ints_and_conservativeness(monkeypatch, capsys):
    rc, err, seen = run(
        [
            "--context-length",
            "32k",
            "--max-total-tokens",
            "1Mi",
            "--schedule-conservativeness",
            "0.3",
        ],
        monkeypatch,
        capsys,
    )
    assert rc == 0, err
    assert (seen["args"].context_length, seen["args"].max_total_tokens) == (32000, 2**20)
    sched = check_server_args(seen["args"])
    assert sched.new_token_ratio == pytest.approx(ServerArgs.new_token_ratio * 0.3)
    assert sched.min_new_token_ratio == pytest.approx(ServerArgs.min_new_token_ratio * 0.3)
    assert check_server_args(ServerArgs(schedule_conservativeness=5)).new_token_ratio == 1.0


def test_own_flags_parse_to_their_field_types(monkeypatch, capsys):
    """A field typed `X | None` parses as X (ruff's rewrite of Optional[X] once turned them into
    strings, and mem_fraction_static's range check into a TypeError)."""
    rc, err, seen = run(
        ["--mem-fraction-static", "0.5", "--num-threads", "3", "--decode-kv-mirror-gb", "1"],
        monkeypatch,
        capsys,
    )
    assert rc == 0, err
    args = seen["args"]
    assert (args.mem_fraction_static, args.num_threads, args.decode_kv_mirror_gb) == (0.5, 3, 1.0)
    assert isinstance(args.num_threads, int) and isinstance(args.decode_kv_mirror_gb, float)


def test_table_is_consistent():
    """No table flag is also one of radixlm's own options (after a merge, the radixlm option wins
    and the table entry must go), none is listed twice, and the generated table covers every SGLang
    flag.
    """
    import argparse

    own = argparse.ArgumentParser()
    ServerArgs.add_cli_args(own, cli.option_choices())
    spellings = [o for g in GROUPS for s in g.specs for o in s.options]
    assert len(spellings) == len(set(spellings))
    assert not set(spellings) & set(own._option_string_actions)
    rows = classify(SGLANG_FLAGS, radixlm_parser())
    assert [r.flag.name for r in rows if r.kind is None] == []


def test_docs_parser_is_serves(serve_parser):
    """The generated table reads radixlm_parser(): the same options, arities and choices as
    serve's."""

    def shape(parser):
        return {
            o: (a.nargs, tuple(a.choices or ())) for a in parser._actions for o in a.option_strings
        }

    assert shape(radixlm_parser()) == shape(serve_parser)


def test_docs_table_is_generated_from_the_code():
    """docs/sglang_flags.md is what `python -m radixlm.sglang_flags_doc --write` writes now."""
    assert DOC.read_text() == generate(), "run: python -m radixlm.sglang_flags_doc --write"
    assert "**missing**" not in DOC.read_text()


def test_bench_offline_takes_them_too(monkeypatch, capsys):
    """The other commands built on ServerArgs take SGLang's flags and spellings, --model
    included."""
    import radixlm.bench.offline as offline

    seen = {}
    monkeypatch.setattr(
        offline, "main", lambda args, server_args: seen.setdefault("args", server_args) and 0
    )
    rc = cli.main(
        [
            "bench",
            "offline",
            "--model",
            "/m",
            "--disable-cuda-graph-padding",
            "--kv-cache-dtype",
            "bf16",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 0 and "--disable-cuda-graph-padding ignored" in err, err
    assert (seen["args"].model_path, seen["args"].kv_cache_dtype) == ("/m", "bfloat16")
