"""ServerArgs: every option of radixlm, once, with its CLI flag and default (a leaf module).

ServerArgs is the one CLI surface; each component takes a small typed config built from it and
validated where the component lives (ModelRunnerConfig, SchedulerConfig, HiCacheConfig,
SpeculativeConfig, TokenizerManagerConfig; engine/launcher.py: check_server_args builds them
all before any process starts). The choice lists live with their owners too: the CLI hands them
to add_cli_args. What is checked here are the HTTP server's own options."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from radixlm.config_help import HELPS

# SGLang's other spellings of these flags (radixlm/sglang_flags.py has the rest of SGLang's flags)
_ALIASES = {
    "dp_size": ("--dp", "--data-parallel-size"),
    "tp_size": ("--tp", "--tensor-parallel-size"),
    "pp_size": ("--pipeline-parallel-size",),
    "ep_size": ("--expert-parallel-size", "--ep"),
    "dist_init_addr": ("--nccl-init-addr",),
    "speculative_draft_model_path": ("--speculative-draft-model",),
}


@dataclass
class ServerArgs:
    # Model
    model_path: str | None = None  # None: the embedded default model (SmolLM2-135M-Instruct GGUF)
    tokenizer_path: str | None = None
    served_model_name: str | None = None
    # Hub model ids (model/hub.py): the version and the cache directory (SGLang's flags,
    # huggingface_hub's cache_dir)
    revision: str | None = None
    download_dir: str | None = None
    context_length: int | None = None  # default: the model's own
    device: str = "cpu"
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    # Weights: None = "gguf" for a GGUF file (its own block formats through the native CPU kernels,
    # like llama.cpp), else "none"; "none" dequantizes to `dtype` (the HF-equality reference);
    # int8 (per output channel) / q4_0 / q8_0 quantize at load (CPU; float on CUDA); fp8: FP8
    # weights with a scale per output row on CUDA, a Triton GEMM (model/quant/methods.py), or an
    # FP8 checkpoint's own weights (quant_method fp8, on the CPU: model/quant/checkpoint.py).
    quantization: str | None = None
    # KV cache element type; auto = float16 for quantized weights on the native CPU kernels (like
    # llama.cpp), else the model dtype. int8 keeps a float32 scale per token and head.
    kv_cache_dtype: str = "auto"
    # native: the project's paged CPU kernel (any KV dtype, batch-invariant); torch: SDPA over
    # gathered K/V (any device). None: native on CPU when the kernels load, else torch.
    attention_backend: str | None = None
    # SGLang's per-phase backends (a HybridAttnBackend when they differ); None: attention_backend.
    prefill_attention_backend: str | None = None
    decode_attention_backend: str | None = None

    # Memory
    max_total_tokens: int | None = None  # KV pool size in tokens; default from kv_memory_gb
    kv_memory_gb: float = 1.0  # KV budget when max_total_tokens is not given
    # SGLang's: the KV pool from RAM available after the weights load, less (1 - F) x RAM available
    # before (model/memory/kv_budget.py); max_total_tokens caps it. None: kv_memory_gb.
    mem_fraction_static: float | None = None
    # Dense copy of the decoding requests' KV (model/layers/attention/decode_kv_mirror.py), on top
    # of the pool; None: 1 GiB on CPU (where it saves the per-step gather), 0 (off) on CUDA.
    decode_kv_mirror_gb: float | None = None
    max_running_requests: int = 64
    # Hybrid models (docs/hybrid.md): the recurrent states of their state layers share the memory
    # budget with the KV pool. max_mamba_cache_size: state slots in all (one per running request,
    # the rest hold snapshots for the prefix cache); None: mamba_full_memory_ratio x the KV pool's
    # bytes (SGLang's split). mamba_ssm_dtype: the recurrent state's element type.
    max_mamba_cache_size: int | None = None
    mamba_full_memory_ratio: float = 0.9
    mamba_ssm_dtype: str = "float32"
    # The recurrences' kernels: auto (native on CPU when the kernels load, triton on CUDA, torch).
    linear_attn_backend: str = "auto"
    # Inside a prompt's prefill, keep a state snapshot every this many tokens (a prompt that
    # branches off a long cached one resumes at the last snapshot before the branch).
    mamba_track_interval: int = 256
    # Sliding-window layers (model/memory/swa_memory.py): their KV in a second slot space of
    # swa_full_tokens_ratio x the full layers' slots, a running request keeping only its window
    # of it (SGLang's hybrid SWA memory; disable_hybrid_swa_memory: one slot space for all layers).
    swa_full_tokens_ratio: float = 0.8
    disable_hybrid_swa_memory: bool = False
    chunked_prefill_size: int = 2048  # -1 disables chunking
    max_prefill_tokens: int = 4096  # new tokens per extend batch
    new_token_ratio: float = (
        0.4  # share of each running request's max_new_tokens reserved at admission
    )
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay: float = 0.001
    schedule_conservativeness: float = 1.0  # SGLang's: scales the two ratios above (at most 1)

    # Structured generation
    grammar_backend: str = "xgrammar"  # or "none"
    disable_jump_forward: bool = False  # decode grammar-forced text token by token
    # model: the model's generation_config.json / GGUF general.sampling.* are requests' defaults;
    # openai: not
    sampling_defaults: str = "model"
    reasoning_parser: str | None = None  # SGLang's: the think block's format (radixlm/reasoning)
    disable_billing_header_normalization: bool = False  # /v1/messages: server/billing_header.py

    # Scheduling
    schedule_policy: str = "lpm"
    enable_priority_scheduling: bool = (
        False  # honour requests' `priority` (else it is ignored, as SGLang)
    )
    # Sessions (/open_session, engine/sessions.py): their KV stays pinned until closed or idle this
    # long.
    session_timeout: float = 300.0
    max_sessions: int = 64  # open sessions in all (0: /open_session refused)
    max_sessions_per_key: int = 16
    # Stored responses (/v1/responses, server/responses_store.py): in memory, per API key, LRU.
    max_stored_responses: int = 1000
    stored_response_ttl: float = 3600.0
    disable_radix_cache: bool = False
    disable_shared_prefix_attention: bool = (
        False  # decode reads a shared cached prefix once per group
    )
    # Run new requests' prefill and the running requests' decode step in one forward (SGLang's
    # mixed chunk): the step reads the weights once for both.
    enable_mixed_chunk: bool = False
    # Overlap scheduling (scheduler/execution/overlap.py) is on by default on CUDA only: on a CPU
    # the forward already uses every core, and the scheduler's ~1% of a step is not worth the GIL
    # contention.
    disable_overlap_schedule: bool = False
    enable_overlap_schedule: bool = False  # turn it on on CPU too
    random_seed: int = 42
    enable_torch_compile: bool = False  # SGLang's: compiled decode (executor/compiled_decode.py)
    torch_compile_max_bs: int = 32  # SGLang's default
    # Decode steps' CUDA graphs (model/executor/cuda_graph_runner.py), SGLang's flags: on CUDA, for
    # batches of up to cuda_graph_max_bs requests (None: min(256, max_running_requests)), padded up
    # to a captured size; cuda_graph_bs: the batch sizes captured (None: SGLang's list to the max).
    cuda_graph_max_bs: int | None = None
    cuda_graph_bs: list[int] | None = None
    disable_cuda_graph: bool = False
    is_embedding: bool = (
        False  # SGLang's: serve an embedding model (/v1/embeddings, /encode; model/pooler.py)
    )
    # SGLang's: a JSON object merged into the model's HF config before it is built (vLLM's
    # --hf-overrides): e.g. vLLM's keys that declare a Qwen3-Reranker (model/reranker.py).
    json_model_override_args: str = "{}"

    # Speculative decoding (radixlm/speculative/): drafts verified in one forward, outputs
    # unchanged.
    speculative_algorithm: str | None = (
        None  # ngram, radix, draft-model, eagle, eagle3 or nextn; None: off
    )
    # Most draft tokens per request and step (the controller picks fewer where they do not pay);
    # None: the algorithm's default (64 for radix, 16 for the others).
    speculative_num_draft_tokens: int | None = None
    speculative_draft_policy: str = (
        "adaptive"  # adaptive | fixed (every draft up to the maximum, as SGLang)
    )
    # Draft trees (SGLang's EAGLE flags): at most this many children per node (1: chains; None: the
    # algorithm's default, 4 for ngram, radix and eagle, 1 for draft-model) and this many levels
    # below the request's last token (None: 5 for eagle, else speculative_num_draft_tokens).
    speculative_eagle_topk: int | None = None
    speculative_num_steps: int | None = None
    speculative_ngram_min_match_window_size: int = (
        2  # shortest suffix a lookup match may use (ngram, radix's index)
    )
    speculative_ngram_max_match_window_size: int = 8  # longest suffix tried first
    # radix: where a request leaves the tree, drafts come from an index of the last this many tokens
    # of finished requests' outputs (speculative/suffix_index.py; about 1 KB a token). 0: tree only.
    speculative_suffix_index_tokens: int = 16384
    # draft-model (SGLang's STANDALONE): a smaller model with the target's vocabulary drafts by
    # greedy decoding, in its own KV pool of speculative_draft_kv_tokens tokens (None: as many as
    # the target's).
    speculative_draft_model_path: str | None = None
    speculative_draft_kv_tokens: int | None = None
    speculative_draft_model_revision: str | None = None
    # eagle / eagle3 (SGLang's EAGLE / EAGLE3; speculative/eagle.py): a draft head in EAGLE's
    # published layout (--speculative-draft-model-path: config.json + safetensors) drafts trees on
    # the target's own hidden states. eagle: the head's logits over these token ids only (a torch
    # file of ids, SGLang's FR-Spec token map): top-k over a few thousand frequent tokens instead of
    # the whole vocabulary (`radixlm train-eagle` writes one).
    speculative_token_map: str | None = None

    # Hierarchical cache (cache/hiradix_cache.py, SGLang's HiCache flags): the radix tree over L1
    # (the KV pool), L2 (a larger host pool, --hicache-ratio x L1 or --hicache-size GiB) and L3 (a
    # storage backend that outlives the process: --hicache-storage-backend file in
    # --hicache-storage-dir).
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = 2.0
    hicache_size: float = 0.0  # GiB; 0: from hicache_ratio
    hicache_write_policy: str = "write_through"
    hicache_dtype: str = "auto"  # L2/L3 element type; auto: float16 for a float32 L1, else L1's
    hicache_storage_backend: str | None = None
    hicache_storage_dir: str | None = (
        None  # default $RADIXLM_CACHE_DIR/hicache (~/.cache/radixlm/hicache)
    )
    hicache_storage_size_gb: float = 16.0  # least recently used chunks go past this (0: unbounded)
    hicache_storage_chunk_size: int = 64  # tokens per stored chunk
    # The stored chunks' MAC key (and their names'); None: $RADIXLM_HICACHE_STORAGE_KEY, else a
    # random key kept 0600 in the directory (.key). Not shown by /get_server_info.
    hicache_storage_key: str | None = dataclasses.field(default=None, repr=False)
    hicache_storage_backend_extra_config: str | None = None  # a JSON object (mooncake's settings)
    kv_events_config: str | None = None  # SGLang's JSON: KV events for routers (cache/kv_events.py)

    # LoRA adapters (radixlm/lora/, docs/lora.md; SGLang's flags): many peft adapters on one base,
    # mixed in a batch.
    enable_lora: bool = False
    lora_paths: list[str] | None = (
        None  # NAME=PATH, PATH or {"lora_name", "lora_path", "pinned"} JSON
    )
    max_loras_per_batch: int = 8
    max_loaded_loras: int | None = None
    max_lora_rank: int | None = None
    lora_target_modules: list[str] | None = None
    lora_eviction_policy: str = "lru"
    lora_backend: str = "csgmv"

    # Images in (docs/vision.md; help texts in config_help.py): the encoder cache, where images may
    # come from.
    enable_multimodal: bool = False
    mm_cache_size_mb: int = 64
    allowed_media_domains: list[str] | None = None
    allowed_local_media_path: str | None = None
    media_url_max_file_size_mb: float = 16.0
    media_url_timeout: float = 10.0
    max_image_pixels: int = 64 * 2**20
    # Templates (SGLang's flags): the chat route's template (engine/chat_templates.py) and the FIM
    # tokens of completions' suffix and /infill (server/fim.py); None: the tokenizer's own.
    chat_template: str | None = None
    completion_template: str | None = None
    # llama-server's --slot-save-path: where /slots/{id}?action=save|restore keep slot files
    # (server/llama_api.py); None: slot files are refused.
    slot_save_path: str | None = None
    # Agents (docs/agents.md): how tool calls are read out of chat output; None: detected from the
    # template.
    tool_call_parser: str | None = None

    # HTTP server
    host: str = "127.0.0.1"
    port: int = 30000
    # Keys (radixlm/http_access.py): users', and the operator's for admin actions (/flush_cache,
    # aborting every request). Left out of repr, so that no log line shows them.
    api_key: str | None = dataclasses.field(default=None, repr=False)
    admin_api_key: str | None = dataclasses.field(default=None, repr=False)
    allowed_origins: str | None = None  # browser origins allowed to call (CSRF); "*": any
    enable_metrics: bool = False  # Prometheus /metrics
    strict_model_name: bool = (
        False  # vLLM's 404 for a `model` not served; default: any name (SGLang)
    )
    # /dashboard's radix tree and recent requests show token text and prompt heads (prompts are user
    # data).
    dashboard_show_text: bool = False
    # Observability (docs/observability.md; SGLang's flags): the request log, the crash dump.
    log_requests: bool = False
    log_requests_level: int = (
        2  # 0: metadata, 1: + sampling params, 2: + inputs/outputs cut at 2048, 3: all
    )
    log_requests_format: str = "text"
    crash_dump_folder: str | None = None
    max_queued_requests: int | None = None  # beyond this many waiting, 429
    incremental_streaming_output: bool = False  # stream text deltas instead of cumulative text
    stream_interval: int = (
        1  # tokens per streamed chunk (a request's sampling_params.stream_interval wins)
    )
    watchdog_interval: float = 0.5  # seconds between checks that the child processes live
    # A scheduler (or detokenizer) loop that completes no iteration for this long while a request
    # waits as long is hung: killed, then handled as a dead process (SGLang's flag and default).
    watchdog_timeout: float = 300.0
    # Faults (docs/reliability.md): when the scheduler or detokenizer dies, in-flight requests fail
    # with a 503 and /health answers 503; then the server exits non-zero after
    # engine_failure_exit_delay seconds (time for health checkers to see it), or, with
    # restart_on_failure, starts a new engine.
    restart_on_failure: bool = False
    engine_failure_exit_delay: float = 2.0
    graceful_shutdown_timeout: float = 30.0  # on SIGTERM: seconds to let in-flight requests finish
    # Limits: a larger body is a 413; n and top_logprobs_num above these are a 400.
    max_request_body_bytes: int = 32 * 2**20
    max_n: int = 128
    max_top_logprobs_num: int = 20
    # Fan-out: one request's prompts x n (each a sequence the scheduler runs) above this are a 400.
    max_client_batch_size: int = 1024
    # Seconds one request's tokenization and chat template may take (on worker threads): then a 504.
    tokenizer_timeout: float = 30.0
    # Data parallelism: `--dp N` runs N servers (each on its share of the cores) behind the
    # cache-aware router (radixlm/router/) on --host/--port. Every other option is per server. With
    # enable_dp_attention it is instead the attention groups of one server (below).
    dp_size: int = 1

    # Tensor parallelism and multi-node serving (issue 36; docs/architecture.md, "Tensor
    # parallelism"): tp_size scheduler processes (ranks), each holding 1/tp_size of every layer,
    # rank 0 talking to the tokenizer manager; nnodes hosts each run tp_size / nnodes of them
    # (node_rank > 0 runs no HTTP server), meeting at dist_init_addr (rank 0's HOST:PORT). With
    # dp_size, each replica is a tp group. num_threads is per rank (default: the rank's share of the
    # cores, pinned).
    tp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None  # None: a free loopback port (one node)
    dist_timeout: float = 600.0  # seconds a rendezvous or collective may wait
    tp_allreduce_backend: str = "auto"  # auto: nccl on CUDA, shm on one host, gloo across hosts
    # Pipeline parallelism (issue 45): pp_size stages of consecutive layers, each a tp group.
    pp_size: int = 1
    pp_max_micro_batch_size: int | None = (
        None  # None: a decode step splits into pp_size micro-batches
    )
    pp_layer_partition: str | None = None  # layers per stage, "10,11,11"; None: even
    # Expert parallelism (issue 38, docs/moe.md): 1 or tp_size; tp_size splits each MoE layer's
    # experts over the tp ranks (each computes its experts for every token, then an all-reduce).
    ep_size: int = 1
    # DP attention (issue 46, docs/architecture.md "DP attention"): with dp_size N and tp_size N, N
    # ranks each serving their own requests with their own KV, the MoE layers over all of them
    # (SGLang's flags).
    enable_dp_attention: bool = False
    load_balance_method: str = "auto"  # which DP-attention rank a request goes to
    disaggregation_mode: str = (
        "null"  # PD disaggregation (docs/disaggregation.md; help: config_help.py)
    )
    disaggregation_transfer_backend: str = "tcp"
    disaggregation_bootstrap_port: int = 8998
    num_reserved_decode_tokens: int = 512
    disaggregation_bootstrap_timeout: float = (
        300.0  # SGLang's SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT
    )
    disaggregation_waiting_timeout: float = 300.0  # SGLang's SGLANG_DISAGGREGATION_WAITING_TIMEOUT
    disaggregation_debug_checksum: bool = False

    # Runtime
    num_threads: int | None = None  # torch intra-op threads; default $OMP_NUM_THREADS, else cores
    log_level: str = "info"
    decode_log_interval: int = 40
    # After every scheduler step, check that every KV slot has exactly one owner and every
    # radix-tree lock is held (scheduler/invariants.py); a broken invariant stops the scheduler. On
    # in tests.
    enable_invariant_checks: bool = False

    def __post_init__(self):
        from radixlm.sglang_flags import normalize_values

        normalize_values(
            self
        )  # SGLang's value spellings (bf16, torch_native, NGRAM, ...) or a refusal
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise ValueError(
                f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}"
            )
        if not self.schedule_conservativeness > 0:
            raise ValueError(
                f"schedule_conservativeness must be > 0, got {self.schedule_conservativeness}"
            )
        if self.dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {self.dp_size}")
        if self.dp_size == 1:  # SGLang's rule: DP attention over one rank is no DP attention
            self.enable_dp_attention = False
        if self.max_request_body_bytes < 1:
            raise ValueError(
                f"max_request_body_bytes must be >= 1, got {self.max_request_body_bytes}"
            )
        if self.graceful_shutdown_timeout < 0 or self.engine_failure_exit_delay < 0:
            raise ValueError("graceful_shutdown_timeout and engine_failure_exit_delay must be >= 0")
        if not self.watchdog_timeout > 0:
            raise ValueError(f"watchdog_timeout must be > 0, got {self.watchdog_timeout}")
        if self.decode_kv_mirror_gb is not None and self.decode_kv_mirror_gb < 0:
            raise ValueError(f"decode_kv_mirror_gb must be >= 0, got {self.decode_kv_mirror_gb}")
        if self.max_client_batch_size < 1:
            raise ValueError(
                f"max_client_batch_size must be >= 1, got {self.max_client_batch_size}"
            )
        if not self.tokenizer_timeout > 0:
            raise ValueError(f"tokenizer_timeout must be > 0, got {self.tokenizer_timeout}")
        if self.max_stored_responses < 0 or not self.stored_response_ttl > 0:
            raise ValueError("max_stored_responses must be >= 0 and stored_response_ttl > 0")

    # --- CLI -------------------------------------------------------------------
    @staticmethod
    def add_cli_args(
        parser: argparse.ArgumentParser,
        choices: Mapping[str, Sequence[str]] = MappingProxyType({}),
        actions: Mapping[str, type[argparse.Action]] = MappingProxyType({}),
    ) -> None:
        """A flag per field; choices: field -> its allowed values (from the component that owns
        it); actions: field -> its argparse action, where not the plain one (`serve`'s repeatable
        --model-path)."""
        helps = HELPS
        for f in dataclasses.fields(ServerArgs):
            flag = "--" + f.name.replace("_", "-")
            default = f.default
            if f.type in ("bool",) or isinstance(default, bool):
                parser.add_argument(
                    flag, action="store_true", default=default, help=helps.get(f.name)
                )
                continue
            typ = {"int": int, "float": float, "str": str}
            base = str(f.type).removesuffix(" | None")  # int | None -> int; list[int] | None, ...
            if base.startswith("list["):  # SGLang's list flags (--lora-paths A B): their items
                base = base.removeprefix("list[").removesuffix("]")
                kw = dict(nargs="*")
            else:
                kw = {}
            kw.update(type=typ.get(base, str), default=default, help=helps.get(f.name))
            if f.name in choices:
                kw["choices"] = tuple(choices[f.name])
            if f.name in actions:
                kw["action"] = actions[f.name]
            flags = [
                flag,
                *_ALIASES.get(f.name, ()),
            ]  # SGLang's --dp-size / --tp-size, and their short forms
            parser.add_argument(*flags, **kw)

    @staticmethod
    def to_cli_argv(**options) -> list[str]:
        """`radixlm serve` flags for these ServerArgs options (names checked here; values by the
        server)."""
        fields = {f.name: f for f in dataclasses.fields(ServerArgs)}
        unknown = sorted(set(options) - set(fields))
        if unknown:
            raise ValueError(f"unknown server option(s) {unknown}: options are ServerArgs fields")
        ServerArgs(**options)
        argv: list[str] = []
        for name, value in options.items():
            flag = "--" + name.replace("_", "-")
            if isinstance(fields[name].default, bool):
                argv += [flag] if value else []
            elif isinstance(value, (list, tuple)):
                argv += [flag, *map(str, value)]
            elif value is not None:
                argv += [flag, str(value)]
        return argv

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


@dataclass
class PortArgs:
    """ZMQ endpoints between the processes (ipc:// sockets in a private temp dir)."""

    tokenizer_ipc_name: str  # detokenizer -> tokenizer manager
    scheduler_input_ipc_name: str  # tokenizer manager -> scheduler
    detokenizer_ipc_name: str  # scheduler -> detokenizer
    ipc_dir: str = ""  # removed by cleanup() when the processes stop

    @staticmethod
    def init_new() -> PortArgs:
        import tempfile

        d = tempfile.mkdtemp(prefix="radixlm-")
        return PortArgs(
            tokenizer_ipc_name=f"ipc://{d}/tokenizer",
            scheduler_input_ipc_name=f"ipc://{d}/scheduler",
            detokenizer_ipc_name=f"ipc://{d}/detokenizer",
            ipc_dir=d,
        )

    @property
    def dp_reply_ipc_name(self) -> str:
        """DP attention: ranks > 0 -> rank 0, their answers to control calls
        (scheduler/parallel/dp_io.py)."""
        return f"ipc://{self.ipc_dir}/dp_replies"

    def cleanup(self) -> None:
        if self.ipc_dir:
            import shutil

            shutil.rmtree(self.ipc_dir, ignore_errors=True)
