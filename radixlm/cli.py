"""Command line: `radixlm serve | generate | bench | router | train-eagle`."""

from __future__ import annotations

import argparse
import json
import sys

SAMPLING_FLAGS = {
    "max_new_tokens": int,
    "min_new_tokens": int,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "frequency_penalty": float,
    "presence_penalty": float,
    "repetition_penalty": float,
    "seed": int,
    "n": int,
}


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    for name, typ in SAMPLING_FLAGS.items():
        p.add_argument("--" + name.replace("_", "-"), type=typ, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")


def _sampling_params(args) -> dict:
    sp = {k: getattr(args, k) for k in SAMPLING_FLAGS if getattr(args, k) is not None}
    sp.setdefault("max_new_tokens", 128)
    if args.stop:
        sp["stop"] = args.stop
    if args.ignore_eos:
        sp["ignore_eos"] = True
    return sp


def cmd_generate(args) -> int:
    from radixlm.config import ServerArgs
    from radixlm.engine.engine import Engine

    server_args = ServerArgs.from_cli_args(args)
    kwargs = {k: v for k, v in vars(server_args).items() if k != "model_path"}
    with Engine(server_args.model_path, **kwargs) as engine:
        prompt = args.prompt
        if args.chat:
            prompt = engine.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        sp = _sampling_params(args)
        if args.stream and sp.get("n", 1) == 1:
            shown = ""
            for out in engine.generate(prompt, sp, stream=True):
                sys.stdout.write(out["text"][len(shown) :])
                sys.stdout.flush()
                shown = out["text"]
            sys.stdout.write("\n")
            if args.json:
                print(json.dumps(out["meta_info"]))
            return 0
        outs = engine.generate(prompt, sp)
        for out in outs if isinstance(outs, list) else [outs]:
            print(out["text"])
            if args.json:
                print(json.dumps(out["meta_info"]))
    return 0


def cmd_serve(args) -> int:
    from radixlm.config import ServerArgs
    from radixlm.http_access import ADMIN_API_KEY_ENV, API_KEY_ENV, key_from_env
    from radixlm.router.model_front_launch import is_multi_model
    from radixlm.server.launch import launch_server

    server_args = ServerArgs.from_cli_args(args)
    # Keys given by the environment (how `serve --dp` and Runtime hand them to a server): out of
    # `ps`.
    server_args.api_key = key_from_env(server_args.api_key, API_KEY_ENV)
    server_args.admin_api_key = key_from_env(server_args.admin_api_key, ADMIN_API_KEY_ENV)
    if is_multi_model(args):
        return _serve_models(args, server_args)
    server_args = _local_model_paths(server_args)
    if server_args.node_rank > 0:  # this node's tensor-parallel ranks only: node 0 serves HTTP
        from radixlm.engine.node import run_node

        run_node(server_args)
    elif (
        server_args.dp_size > 1 and not server_args.enable_dp_attention
    ):  # DP attention: one server
        from radixlm.server.dp import launch_dp

        launch_dp(server_args)
    else:
        launch_server(server_args)
    return 0


def _serve_models(args, server_args) -> int:
    """Several models behind one server: a child `serve` per model, loaded on demand
    (radixlm/router/model_front.py). The engine options are checked here once, with no model."""
    import dataclasses

    from radixlm.cache.hicache_config import STORAGE_KEY_ENV
    from radixlm.engine.launcher import check_server_args
    from radixlm.router.model_front_launch import check_front_args, model_specs, run_model_front

    check_front_args(server_args)
    check_server_args(dataclasses.replace(server_args, model_path=None))
    specs = model_specs(args)
    key = server_args.hicache_storage_key
    run_model_front(
        server_args,
        specs,
        args.models_max,
        args.model_load_timeout,
        {STORAGE_KEY_ENV: key} if key else {},
    )
    return 0


def _local_model_paths(server_args):
    """Hub model ids resolved to local paths once, before any process starts (a bad option fails
    first)."""
    from radixlm.engine.launcher import check_server_args
    from radixlm.model.hub import resolve_model_paths

    check_server_args(server_args)
    return resolve_model_paths(server_args)


def cmd_router(args) -> int:
    from radixlm.router.launch import router_args_from_cli, run_router

    run_router(router_args_from_cli(args))
    return 0


def cmd_models(args) -> int:
    """The architectures radixlm serves (a config.json's `architectures`), each with the GGUF
    architectures (llama.cpp's `general.architecture`) it reads as that model."""
    from radixlm.model.registry import supported_architectures
    from radixlm.model_coverage_doc import gguf_archs_by_hf

    gguf = gguf_archs_by_hf()
    lines = [
        arch + "".join(f" gguf:{g}" for g in gguf.get(arch, []))
        for arch in supported_architectures()
    ]
    sys.stdout.write("\n".join(lines) + "\n")  # one write: `| head` closes no pipe mid-list
    return 0


def option_choices() -> dict[str, tuple[str, ...]]:
    """ServerArgs field -> its allowed values, from the component that owns each list."""
    from radixlm.cache.hicache_config import (
        HICACHE_DTYPES,
        STORAGE_BACKEND_REGISTRY,
        WRITE_POLICIES,
    )
    from radixlm.constrained import GRAMMAR_BACKEND_REGISTRY
    from radixlm.disaggregation.config import DISAGGREGATION_MODES, TRANSFER_BACKENDS
    from radixlm.engine.request_log import LOG_REQUESTS_FORMATS, LOG_REQUESTS_LEVELS
    from radixlm.function_call.registry import TOOL_CALL_PARSER_REGISTRY
    from radixlm.lora.config import EVICTION_POLICIES, LORA_BACKENDS
    from radixlm.model.executor.runner_config import DTYPES, KV_CACHE_DTYPES, MAMBA_SSM_DTYPES
    from radixlm.model.layers.attention import ATTENTION_BACKEND_REGISTRY
    from radixlm.model.layers.linear_attn import LINEAR_ATTN_BACKEND_REGISTRY
    from radixlm.model.quant.methods import QUANTIZATIONS
    from radixlm.model.sampling_defaults import SAMPLING_DEFAULTS_MODES
    from radixlm.reasoning.formats import REASONING_PARSER_REGISTRY
    from radixlm.scheduler.batching.policy import SCHEDULE_POLICY_REGISTRY
    from radixlm.scheduler.parallel.dp_dispatch import LOAD_BALANCE_METHODS
    from radixlm.speculative.config import DRAFT_POLICIES, DRAFT_SOURCE_REGISTRY

    return {
        "dtype": DTYPES,
        "quantization": QUANTIZATIONS,
        "kv_cache_dtype": KV_CACHE_DTYPES,
        "attention_backend": ATTENTION_BACKEND_REGISTRY.names(),
        "prefill_attention_backend": ATTENTION_BACKEND_REGISTRY.names(),
        "decode_attention_backend": ATTENTION_BACKEND_REGISTRY.names(),
        "linear_attn_backend": ("auto", *LINEAR_ATTN_BACKEND_REGISTRY.names()),
        "mamba_ssm_dtype": MAMBA_SSM_DTYPES,
        "schedule_policy": SCHEDULE_POLICY_REGISTRY.names(),
        "grammar_backend": GRAMMAR_BACKEND_REGISTRY.names(),
        "speculative_algorithm": DRAFT_SOURCE_REGISTRY.names(),
        "speculative_draft_policy": DRAFT_POLICIES,
        "hicache_write_policy": WRITE_POLICIES,
        "hicache_dtype": HICACHE_DTYPES,
        "hicache_storage_backend": STORAGE_BACKEND_REGISTRY.names(),
        "log_requests_level": LOG_REQUESTS_LEVELS,
        "log_requests_format": LOG_REQUESTS_FORMATS,
        "sampling_defaults": SAMPLING_DEFAULTS_MODES,
        "reasoning_parser": REASONING_PARSER_REGISTRY.names(),
        "lora_eviction_policy": EVICTION_POLICIES,
        "lora_backend": LORA_BACKENDS,
        "tool_call_parser": TOOL_CALL_PARSER_REGISTRY.names(),
        "disaggregation_mode": DISAGGREGATION_MODES,
        "disaggregation_transfer_backend": TRANSFER_BACKENDS,
        "load_balance_method": LOAD_BALANCE_METHODS,
    }


def _starts_engine(argv: list[str]) -> bool:
    """`generate`: an in-process Engine, whose children fork from the fork server (not --help),
    read from the raw arguments before the parser is built. `serve` forks its children itself
    (process_context.fork_context)."""
    return argv[:1] == ["generate"] and not {"-h", "--help"} & set(argv)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if _starts_engine(argv):
        from radixlm.engine.process_context import start_fork_server

        # Its imports (torch, transformers) then overlap the parser's (the option choices import
        # torch) and the tokenizer's: a second earlier to /health.
        start_fork_server()
    try:
        args = parse_args(argv)
    except ValueError as e:  # a refused flag or value, a bad config file: one line, no traceback
        print(f"radixlm: error: {e}", file=sys.stderr)
        return 2
    if args.command in ("generate", "bench") and getattr(args, "log_level", None) == "info":
        args.log_level = (  # keep the answer readable; --log-level info shows the engine log
            "warning"
        )
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"radixlm: error: {e}", file=sys.stderr)
        return 2


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line as `main` reads it, without running it (a manifest's container command is
    checked with it): ValueError for a refused flag or value, SystemExit for an unknown one."""
    from radixlm.config import ServerArgs

    choices = option_choices()
    parser = argparse.ArgumentParser(prog="radixlm")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text for one prompt with the in-process engine")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--model", dest="model_path_alias", default=None, help="alias of --model-path")
    gen.add_argument(
        "--chat", action="store_true", help="wrap the prompt in the model's chat template"
    )
    gen.add_argument("--stream", action="store_true")
    gen.add_argument("--json", action="store_true", help="also print meta_info as JSON")
    _add_sampling_args(gen)
    ServerArgs.add_cli_args(gen, choices)
    gen.set_defaults(func=cmd_generate)
    serve = sub.add_parser(
        "serve", help="serve the native (SGLang-compatible) and OpenAI-compatible HTTP APIs"
    )
    from radixlm.router.model_front_launch import ModelPathAction, add_multi_model_args

    serve.add_argument(
        "--model",
        dest="model_path_alias",
        default=None,
        action=ModelPathAction,
        help="alias of --model-path",
    )
    # --model-path repeated: several models behind one server (--models-dir too).
    ServerArgs.add_cli_args(serve, choices, actions={"model_path": ModelPathAction})
    add_multi_model_args(serve)
    serve.set_defaults(func=cmd_serve)
    models = sub.add_parser(
        "models", help="the model architectures radixlm serves, and the GGUF ones it reads"
    )
    models.set_defaults(func=cmd_models)
    router = sub.add_parser(
        "router", help="one endpoint in front of several radixlm servers (cache-aware routing)"
    )
    from radixlm.router.launch import add_router_args

    add_router_args(router)
    router.set_defaults(func=cmd_router)
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    offline = bench_sub.add_parser("offline", help="a workload through the in-process Engine")
    from radixlm.bench import offline as offline_bench

    offline_bench.add_args(offline)
    ServerArgs.add_cli_args(offline, choices)
    offline.set_defaults(func=lambda a: offline_bench.main(a, ServerArgs.from_cli_args(a)))
    serving = bench_sub.add_parser(
        "serving", help="load a running server (radixlm or OpenAI-compatible) over HTTP"
    )
    from radixlm.bench import serving as serving_bench

    serving_bench.add_args(serving)
    serving.set_defaults(func=serving_bench.main)
    quality = bench_sub.add_parser(
        "quality", help="quantized weights / KV cache vs float32: perplexity, greedy agreement"
    )
    from radixlm.bench import quality as quality_bench

    quality_bench.add_args(quality)
    ServerArgs.add_cli_args(quality, choices)
    quality.set_defaults(func=lambda a: quality_bench.main(a, ServerArgs.from_cli_args(a)))
    limits = bench_sub.add_parser(
        "limits", help="this machine's read rate, compute peaks per ISA and kernel levels"
    )
    from radixlm.bench import limits as limits_bench

    limits_bench.add_args(limits)
    limits.set_defaults(func=limits_bench.main)
    one_batch = bench_sub.add_parser(
        "one-batch", help="one static batch on the ModelRunner: prefill and decode steps"
    )
    from radixlm.bench import one_batch as one_batch_bench

    one_batch_bench.add_args(one_batch)
    ServerArgs.add_cli_args(one_batch, choices)
    one_batch.set_defaults(func=lambda a: one_batch_bench.main(a, ServerArgs.from_cli_args(a)))
    train_eagle = sub.add_parser(
        "train-eagle",
        help=(
            "train an EAGLE draft head for a model from its own answers "
            "(self-distillation, on this machine)"
        ),
    )
    from radixlm.speculative import eagle_train

    eagle_train.add_args(train_eagle)
    train_eagle.set_defaults(func=eagle_train.main)
    # SGLang's flags, value spellings and --config FILE.yaml (radixlm/sglang_flags.yaml,
    # config_file.py).
    from radixlm.config_file import expand_config_file
    from radixlm.sglang_compat import check_sglang_flags, install_sglang_flags

    install_sglang_flags(parser, argv)
    args = parser.parse_args(expand_config_file(parser, argv))
    check_sglang_flags(args)
    if getattr(args, "model_path_alias", None):
        args.model_path = args.model_path_alias
    return args


if __name__ == "__main__":
    sys.exit(main())
