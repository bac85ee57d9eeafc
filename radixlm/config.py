"""ServerArgs: every option of radixlm, once, with its CLI flag and default (a leaf module).

ServerArgs is the one CLI surface; each component takes a small typed config built from it and
validated where the component lives (ModelRunnerConfig, SchedulerConfig, HiCacheConfig,
SpeculativeConfig, TokenizerManagerConfig; engine/launcher.py: check_server_args builds them
all before any process starts). The choice lists live with their owners too: the CLI hands them
to add_cli_args. What is checked here are the HTTP server's own options."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional, Sequence

# SGLang's other spellings of these flags (radixlm/sglang_flags.py has the rest of SGLang's flags)
_ALIASES = {"dp_size": ("--dp", "--data-parallel-size"), "tp_size": ("--tp", "--tensor-parallel-size"),
            "pp_size": ("--pipeline-parallel-size",), "ep_size": ("--expert-parallel-size", "--ep"),
            "dist_init_addr": ("--nccl-init-addr",), "speculative_draft_model_path": ("--speculative-draft-model",)}


_VISION_HELPS = {  # kept out of ServerArgs (its size limit)
    "enable_multimodal": "serve images where the architecture could also run text-only (SGLang's flag); "
    "vision-language architectures (LLaVA) take images without it",
    "mm_cache_size_mb": "MiB of vision-encoder outputs kept by image hash (LRU): an image asked about again "
    "is not encoded again",
    "allowed_media_domains": "hosts (and their subdomains) http(s) image URLs may point at; default none: "
    "only data: URLs and base64",
    "allowed_local_media_path": "directory file:// image paths may point into (vLLM's flag); default none: "
    "a request cannot read the server's files",
    "media_url_max_file_size_mb": "largest image file a request may give (any source), in MiB",
    "media_url_timeout": "seconds an image download may take",
    "max_image_pixels": "largest image (width x height) decoded; more is refused as a decompression bomb",
}
# PD disaggregation's flag help (docs/disaggregation.md), kept out of ServerArgs (its size limit).
_PD_HELPS = {
    "disaggregation_mode": "PD disaggregation: null (one server does both), prefill (runs prompts and sends "
    "their KV; runs the bootstrap service) or decode (receives the KV into slots it reserved, then decodes); "
    "behind `radixlm router --pd-disaggregation`",
    "disaggregation_transfer_backend": "how KV moves: tcp (ZMQ, per layer), shm (the decode server's KV pool in "
    "shared memory, written at its slots; same host, CPU) or fake (nothing moves: warm-up)",
    "disaggregation_bootstrap_port": "prefill: the port of the bootstrap service where its ranks register and "
    "decode servers find them",
    "num_reserved_decode_tokens": "decode: KV tokens kept free per request for its outputs when slots are "
    "reserved for an arriving prompt",
    "disaggregation_bootstrap_timeout": "seconds a request may wait for its peer (prefill: the decode side's "
    "slots; decode: the prefill server's bootstrap and KV room) before it fails with a 5xx",
    "disaggregation_waiting_timeout": "seconds a transfer may take once started (prefill: until the decode "
    "side acknowledges; decode: until the KV arrived) before both sides free its slots and it fails",
    "disaggregation_debug_checksum": "debug: SHA-256 of every transfer's KV on both sides (compared on the "
    "decode side; both in /get_server_info)",
}


@dataclass
class ServerArgs:
    # Model
    model_path: Optional[str] = None  # None: the embedded default model (SmolLM2-135M-Instruct GGUF)
    tokenizer_path: Optional[str] = None
    served_model_name: Optional[str] = None
    # Hub model ids (model/hub.py): the version and the cache directory (SGLang's flags, huggingface_hub's cache_dir)
    revision: Optional[str] = None
    download_dir: Optional[str] = None
    context_length: Optional[int] = None  # default: the model's own
    device: str = "cpu"
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    # Weights: None = "gguf" for a GGUF file (its own block formats through the native CPU kernels,
    # like llama.cpp), else "none"; "none" dequantizes to `dtype` (the HF-equality reference);
    # int8 (per output channel) / q4_0 / q8_0 quantize at load. CUDA: always the torch path.
    quantization: Optional[str] = None
    # KV cache element type; auto = float16 for quantized weights on the native CPU kernels (like
    # llama.cpp), else the model dtype. int8 keeps a float32 scale per token and head.
    kv_cache_dtype: str = "auto"
    # native: the project's paged CPU kernel (any KV dtype, batch-invariant); torch: SDPA over
    # gathered K/V (any device). None: native on CPU when the kernels load, else torch.
    attention_backend: Optional[str] = None
    # SGLang's per-phase backends (a HybridAttnBackend when they differ); None: attention_backend.
    prefill_attention_backend: Optional[str] = None
    decode_attention_backend: Optional[str] = None

    # Memory
    max_total_tokens: Optional[int] = None  # KV pool size in tokens; default from kv_memory_gb
    kv_memory_gb: float = 1.0  # KV budget when max_total_tokens is not given
    # SGLang's: the KV pool from RAM available after the weights load, less (1 - F) x RAM available before
    # (model/kv_budget.py); max_total_tokens caps it. None: kv_memory_gb.
    mem_fraction_static: Optional[float] = None
    # Dense copy of the decoding requests' KV (model/layers/attention/decode_kv_mirror.py), on top of the pool;
    # None: 1 GiB on CPU (where it saves the per-step gather), 0 (off) on CUDA.
    decode_kv_mirror_gb: Optional[float] = None
    max_running_requests: int = 64
    chunked_prefill_size: int = 2048  # -1 disables chunking
    max_prefill_tokens: int = 4096  # new tokens per extend batch
    new_token_ratio: float = 0.4  # share of each running request's max_new_tokens reserved at admission
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay: float = 0.001
    schedule_conservativeness: float = 1.0  # SGLang's: scales the two ratios above (at most 1)

    # Structured generation
    grammar_backend: str = "xgrammar"  # or "none"
    disable_jump_forward: bool = False  # decode grammar-forced text token by token
    # model: the model's generation_config.json / GGUF general.sampling.* are requests' defaults; openai: not
    sampling_defaults: str = "model"
    reasoning_parser: Optional[str] = None  # SGLang's: the think block's format (radixlm/reasoning)

    # Scheduling
    schedule_policy: str = "lpm"
    enable_priority_scheduling: bool = False  # honour requests' `priority` (else it is ignored, as SGLang)
    # Sessions (/open_session, engine/sessions.py): their KV stays pinned until closed or idle this long.
    session_timeout: float = 300.0
    max_sessions: int = 64  # open sessions in all (0: /open_session refused)
    max_sessions_per_key: int = 16
    # Stored responses (/v1/responses, server/responses_store.py): in memory, per API key, LRU.
    max_stored_responses: int = 1000
    stored_response_ttl: float = 3600.0
    disable_radix_cache: bool = False
    disable_shared_prefix_attention: bool = False  # decode reads a shared cached prefix once per group
    # Run new requests' prefill and the running requests' decode step in one forward (SGLang's
    # mixed chunk): the step reads the weights once for both.
    enable_mixed_chunk: bool = False
    # Overlap scheduling (scheduler/overlap.py) is on by default on CUDA only: on a CPU the forward
    # already uses every core, and the scheduler's ~1% of a step is not worth the GIL contention.
    disable_overlap_schedule: bool = False
    enable_overlap_schedule: bool = False  # turn it on on CPU too
    random_seed: int = 42
    enable_torch_compile: bool = False  # SGLang's: compile decode steps (model/compiled_decode.py)
    torch_compile_max_bs: int = 32  # SGLang's default
    is_embedding: bool = False  # SGLang's: serve an embedding model (/v1/embeddings, /encode; model/pooler.py)

    # Speculative decoding (radixlm/speculative/): drafts verified in one forward, outputs unchanged.
    speculative_algorithm: Optional[str] = None  # ngram, radix or draft-model; None: off
    speculative_num_draft_tokens: int = 16  # most draft tokens per request and step (the controller picks fewer where they do not pay)
    speculative_draft_policy: str = "adaptive"  # adaptive | fixed (every draft up to the maximum, as SGLang)
    speculative_ngram_min_match_window_size: int = 2  # shortest suffix a lookup match may use (ngram, radix's index)
    speculative_ngram_max_match_window_size: int = 8  # longest suffix tried first
    # radix: where a request leaves the tree, drafts come from an index of the last this many tokens of
    # finished requests' outputs (speculative/suffix_index.py; about 1 KB a token). 0: tree only.
    speculative_suffix_index_tokens: int = 16384
    # draft-model (SGLang's STANDALONE): a smaller model with the target's vocabulary drafts by greedy
    # decoding, in its own KV pool of speculative_draft_kv_tokens tokens (None: as many as the target's).
    speculative_draft_model_path: Optional[str] = None
    speculative_draft_kv_tokens: Optional[int] = None
    speculative_draft_model_revision: Optional[str] = None

    # Hierarchical cache (cache/hiradix_cache.py, SGLang's HiCache flags): the radix tree over L1 (the
    # KV pool), L2 (a larger host pool, --hicache-ratio x L1 or --hicache-size GiB) and L3 (a storage
    # backend that outlives the process: --hicache-storage-backend file in --hicache-storage-dir).
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = 2.0
    hicache_size: float = 0.0  # GiB; 0: from hicache_ratio
    hicache_write_policy: str = "write_through"
    hicache_dtype: str = "auto"  # L2/L3 element type; auto: float16 for a float32 L1, else L1's
    hicache_storage_backend: Optional[str] = None
    hicache_storage_dir: Optional[str] = None  # default $RADIXLM_CACHE_DIR/hicache (~/.cache/radixlm/hicache)
    hicache_storage_size_gb: float = 16.0  # least recently used chunks go past this (0: unbounded)
    hicache_storage_chunk_size: int = 64  # tokens per stored chunk
    # The stored chunks' MAC key (and their names'); None: $RADIXLM_HICACHE_STORAGE_KEY, else a random
    # key kept 0600 in the directory (.key). Not shown by /get_server_info.
    hicache_storage_key: Optional[str] = dataclasses.field(default=None, repr=False)

    # LoRA adapters (radixlm/lora/, docs/lora.md; SGLang's flags): many peft adapters on one base, mixed in a batch.
    enable_lora: bool = False
    lora_paths: Optional[list[str]] = None  # NAME=PATH, PATH or {"lora_name", "lora_path", "pinned"} JSON
    max_loras_per_batch: int = 8
    max_loaded_loras: Optional[int] = None
    max_lora_rank: Optional[int] = None
    lora_target_modules: Optional[list[str]] = None
    lora_eviction_policy: str = "lru"
    lora_backend: str = "csgmv"

    # Images in (docs/vision.md; help texts in _VISION_HELPS): the encoder cache, where images may come from.
    enable_multimodal: bool = False
    mm_cache_size_mb: int = 64
    allowed_media_domains: Optional[list[str]] = None
    allowed_local_media_path: Optional[str] = None
    media_url_max_file_size_mb: float = 16.0
    media_url_timeout: float = 10.0
    max_image_pixels: int = 64 * 2**20
    # Templates (SGLang's flags): the chat route's template (engine/chat_templates.py) and the FIM
    # tokens of completions' suffix and /infill (server/fim.py); None: the tokenizer's own.
    chat_template: Optional[str] = None
    completion_template: Optional[str] = None
    # Agents (docs/agents.md): how tool calls are read out of chat output; None: detected from the template.
    tool_call_parser: Optional[str] = None

    # HTTP server
    host: str = "127.0.0.1"
    port: int = 30000
    # Keys (radixlm/http_access.py): users', and the operator's for admin actions (/flush_cache,
    # aborting every request). Left out of repr, so that no log line shows them.
    api_key: Optional[str] = dataclasses.field(default=None, repr=False)
    admin_api_key: Optional[str] = dataclasses.field(default=None, repr=False)
    allowed_origins: Optional[str] = None  # browser origins allowed to call (CSRF); "*": any
    enable_metrics: bool = False  # Prometheus /metrics
    strict_model_name: bool = False  # vLLM's 404 for a `model` not served; default: any name (SGLang)
    # /dashboard's radix tree and recent requests show token text and prompt heads (prompts are user data).
    dashboard_show_text: bool = False
    # Observability (docs/observability.md; SGLang's flags): the request log, the crash dump.
    log_requests: bool = False
    log_requests_level: int = 2  # 0: metadata, 1: + sampling params, 2: + inputs/outputs cut at 2048, 3: all
    log_requests_format: str = "text"
    crash_dump_folder: Optional[str] = None
    max_queued_requests: Optional[int] = None  # beyond this many waiting, 429
    incremental_streaming_output: bool = False  # stream text deltas instead of cumulative text
    stream_interval: int = 1  # tokens per streamed chunk (a request's sampling_params.stream_interval wins)
    watchdog_interval: float = 0.5  # seconds between checks that the child processes live
    # A scheduler (or detokenizer) loop that completes no iteration for this long while a request
    # waits as long is hung: killed, then handled as a dead process (SGLang's flag and default).
    watchdog_timeout: float = 300.0
    # Faults (docs/reliability.md): when the scheduler or detokenizer dies, in-flight requests fail
    # with a 503 and /health answers 503; then the server exits non-zero after engine_failure_exit_delay
    # seconds (time for health checkers to see it), or, with restart_on_failure, starts a new engine.
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
    # cache-aware router (radixlm/router/) on --host/--port. Every other option is per server.
    dp_size: int = 1

    # Tensor parallelism and multi-node serving (issue 36; docs/architecture.md, "Tensor parallelism"):
    # tp_size scheduler processes (ranks), each holding 1/tp_size of every layer, rank 0 talking to
    # the tokenizer manager; nnodes hosts each run tp_size / nnodes of them (node_rank > 0 runs no
    # HTTP server), meeting at dist_init_addr (rank 0's HOST:PORT). With dp_size, each replica is a
    # tp group. num_threads is per rank (default: the rank's share of the cores, pinned).
    tp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: Optional[str] = None  # None: a free loopback port (one node)
    dist_timeout: float = 600.0  # seconds a rendezvous or collective may wait
    tp_allreduce_backend: str = "auto"  # auto: nccl on CUDA, shm on one host, gloo across hosts
    # Pipeline parallelism (issue 45): pp_size stages of consecutive layers, each a tp group.
    pp_size: int = 1
    pp_max_micro_batch_size: Optional[int] = None  # None: a decode step splits into pp_size micro-batches
    pp_layer_partition: Optional[str] = None  # layers per stage, "10,11,11"; None: even
    # Expert parallelism (issue 38, docs/moe.md): 1 or tp_size; tp_size splits each MoE layer's experts
    # over the tp ranks (each computes its experts for every token, then an all-reduce).
    ep_size: int = 1
    disaggregation_mode: str = "null"  # PD disaggregation (docs/disaggregation.md; help: _PD_HELPS)
    disaggregation_transfer_backend: str = "tcp"
    disaggregation_bootstrap_port: int = 8998
    num_reserved_decode_tokens: int = 512
    disaggregation_bootstrap_timeout: float = 300.0  # SGLang's SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT
    disaggregation_waiting_timeout: float = 300.0  # SGLang's SGLANG_DISAGGREGATION_WAITING_TIMEOUT
    disaggregation_debug_checksum: bool = False

    # Runtime
    num_threads: Optional[int] = None  # torch intra-op threads; default all cores
    log_level: str = "info"
    decode_log_interval: int = 40
    # After every scheduler step, check that every KV slot has exactly one owner and every radix-tree
    # lock is held (scheduler/invariants.py); a broken invariant stops the scheduler. On in tests.
    enable_invariant_checks: bool = False

    def __post_init__(self):
        from radixlm.sglang_flags import normalize_values

        normalize_values(self)  # SGLang's value spellings (bf16, torch_native, NGRAM, ...) or a refusal
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise ValueError(f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}")
        if not self.schedule_conservativeness > 0:
            raise ValueError(f"schedule_conservativeness must be > 0, got {self.schedule_conservativeness}")
        if self.dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {self.dp_size}")
        if self.max_request_body_bytes < 1:
            raise ValueError(f"max_request_body_bytes must be >= 1, got {self.max_request_body_bytes}")
        if self.graceful_shutdown_timeout < 0 or self.engine_failure_exit_delay < 0:
            raise ValueError("graceful_shutdown_timeout and engine_failure_exit_delay must be >= 0")
        if not self.watchdog_timeout > 0:
            raise ValueError(f"watchdog_timeout must be > 0, got {self.watchdog_timeout}")
        if self.decode_kv_mirror_gb is not None and self.decode_kv_mirror_gb < 0:
            raise ValueError(f"decode_kv_mirror_gb must be >= 0, got {self.decode_kv_mirror_gb}")
        if self.max_client_batch_size < 1:
            raise ValueError(f"max_client_batch_size must be >= 1, got {self.max_client_batch_size}")
        if not self.tokenizer_timeout > 0:
            raise ValueError(f"tokenizer_timeout must be > 0, got {self.tokenizer_timeout}")
        if self.max_stored_responses < 0 or not self.stored_response_ttl > 0:
            raise ValueError("max_stored_responses must be >= 0 and stored_response_ttl > 0")

    # --- CLI -------------------------------------------------------------------
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, choices: Mapping[str, Sequence[str]] = MappingProxyType({})) -> None:
        """A flag per field; choices: field -> its allowed values (from the component that owns it)."""
        helps = {
            "model_path": "HF directory, GGUF file or Hugging Face model id (org/name; a GGUF repo's file by its quant "
            "tag, org/name:Q4_K_M); default: the embedded SmolLM2-135M-Instruct",
            "revision": "the Hub model's version: a branch, tag or commit id (default: main)",
            "download_dir": "Hugging Face cache directory for Hub models (default: $HF_HUB_CACHE)",
            "speculative_draft_model_revision": "the Hub draft model's version (default: main)",
            "strict_model_name": "answer 404 to a request whose `model` is neither the served model name nor its "
            "path (as vLLM); default: any name is served (as SGLang)",
            "dashboard_show_text": "/dashboard shows token text in the radix tree and prompt heads in the recent "
            "requests (off by default: prompts are user data; counts and shapes only)",
            "max_total_tokens": "KV cache capacity in tokens",
            "kv_memory_gb": "KV cache budget in GiB when --max-total-tokens is not given",
            "chunked_prefill_size": "max new tokens of one request per extend step (-1: off)",
            "disable_radix_cache": "no prefix sharing (a baseline)",
            "enable_torch_compile": "compile decode steps with torch.compile at start-up where the layers run in "
            "Python (CPU, the native attention backend; not where the fused native decoder op runs); batches are "
            "padded to the next compiled size; one log line says what was compiled or why not",
            "torch_compile_max_bs": "largest decode batch --enable-torch-compile compiles (larger ones run eager)",
            "is_embedding": "serve an embedding model: /v1/embeddings and /encode return its pooled, normalized "
            "final hidden states (pooling from its sentence-transformers config or GGUF, else last-token); the "
            "generation routes answer 400",
            "quantization": "weights: gguf (a GGUF's own quantization, its default), none (dequantize to --dtype, "
            "the default for other checkpoints), "
            "int8, q4_0, q8_0, q4_k (quantize at load), f16, bf16 (16-bit weights); quantized weights run the "
            "native CPU kernels",
            "kv_cache_dtype": "KV cache element type (auto: float16 for quantized weights on the native CPU kernels, else the model dtype; int8 with per-token scales)",
            "attention_backend": "native (the paged CPU kernel; default on CPU when the kernels build) or torch (SDPA)",
            "prefill_attention_backend": "attention backend of extend-shaped batches (prefill, mixed, verify); "
            "default: --attention-backend",
            "decode_attention_backend": "attention backend of decode batches; default: --attention-backend",
            "speculative_algorithm": "draft tokens to verify in one forward: ngram (prompt lookup over the "
            "request's own text), radix (continuations in the radix cache), draft-model (greedy decoding of "
            "--speculative-draft-model-path); outputs stay those of plain decoding",
            "speculative_draft_model_path": "draft-model: the draft model (HF directory or GGUF file), smaller than "
            "the target, with the same vocabulary",
            "speculative_draft_kv_tokens": "draft-model: the draft model's KV pool in tokens (default: the target's "
            "KV capacity)",
            "speculative_num_draft_tokens": "most draft tokens per request and step",
            "speculative_draft_policy": "adaptive: per step, each request's draft length that maximizes expected "
            "tokens per second (its recent acceptance, the measured cost of verify steps at this batch size); fixed: "
            "every draft the source has, up to the maximum (reproducible step shapes, for tests and comparisons)",
            "speculative_suffix_index_tokens": "radix: tokens of recently finished requests' outputs kept to draft "
            "from where a request leaves the radix tree (0: off; about 1 KB of memory a token)",
            "dp_size": "data parallelism: N servers, each on its share of the cores, behind the cache-aware router "
            "on --host/--port (one endpoint); the other options apply to each server",
            "restart_on_failure": "when the scheduler or detokenizer process dies, start a new engine (in-flight "
            "requests fail with a 503) instead of exiting non-zero",
            "engine_failure_exit_delay": "seconds the server keeps answering 503 after its engine died, before it exits",
            "watchdog_timeout": "seconds the scheduler's (or detokenizer's) loop may go without completing an "
            "iteration while a request waits: then it counts as hung, /health answers 503, in-flight requests fail "
            "with a 503 and the engine is killed (restarted with --restart-on-failure, else the server exits)",
            "graceful_shutdown_timeout": "on SIGTERM, seconds in-flight requests may take to finish before every "
            "process stops (new connections are refused at once)",
            "max_request_body_bytes": "larger request bodies are refused with 413",
            "api_key": "clients must send Authorization: Bearer <key> (every route but /health); default "
            "$RADIXLM_API_KEY (the environment keeps it out of `ps`)",
            "admin_api_key": "the operator's key, needed by admin actions (/flush_cache, aborting every request) and "
            "accepted everywhere; default $RADIXLM_ADMIN_API_KEY. Without it admin actions are refused, except "
            "with no key at all on a loopback address",
            "allowed_origins": "browser origins (comma-separated, or a JSON list; \"*\": any) whose pages may call "
            "the server; other cross-origin browser requests are refused with 403",
            "max_n": "largest n (completions per prompt) a request may ask for",
            "max_top_logprobs_num": "largest top_logprobs_num (OpenAI: logprobs / top_logprobs) a request may ask for",
            "max_client_batch_size": "most sequences one request may start: its prompts (a batch) times n; "
            "beyond it a 400 (as TGI's flag, n counted)",
            "tokenizer_timeout": "seconds one request's tokenization and chat template may take (they run off the "
            "event loop); beyond it a 504",
            "reasoning_parser": "the reasoning model's think-block format (SGLang's names): thinking budgets "
            "(max_thinking_tokens), grammars that apply after the thinking, and the chat answer's reasoning_content",
            "chat_template": "the chat template: a Jinja file, SGLang's JSON conversation file, or a built-in name "
            "(chatml, gemma-it, llama-2, llama-4, mistral, vicuna_v1.1); default: the tokenizer's own",
            "tool_call_parser": "how tool calls are read out of the chat output (SGLang's names); default: detected "
            "from the chat template, else hermes's <tool_call> format, described to the model in a system message",
            "completion_template": "the fill-in-the-middle tokens of completions' suffix and /infill: star_coder, "
            "qwen_coder, deepseek_coder, or SGLang's JSON file; default: found in the tokenizer by their spellings",
            "enable_hierarchical_cache": "keep KV evicted from the pool in host memory (L2) and, with "
            "--hicache-storage-backend, on disk (L3), and load it back instead of recomputing",
            "hicache_ratio": "L2 size as a multiple of the KV pool (when --hicache-size is 0)",
            "hicache_size": "L2 size in GiB (0: --hicache-ratio)",
            "hicache_write_policy": "when KV is copied down: write_through (at insert), write_through_selective "
            "(once a prefix is hit twice), write_back (at eviction)",
            "hicache_dtype": "L2/L3 element type (auto: float16 for a float32 KV pool, else the pool's)",
            "hicache_storage_backend": "L3: file (chunks of KV in --hicache-storage-dir, kept across restarts)",
            "hicache_storage_dir": "the file backend's directory (default: $RADIXLM_CACHE_DIR/hicache)",
            "hicache_storage_size_gb": "the file backend's size bound in GiB (least recently used chunks go; 0: none)",
            "hicache_storage_chunk_size": "tokens per stored chunk (a prefix is stored in whole chunks)",
            "hicache_storage_key": "secret (16+ characters) that authenticates the stored chunks (HMAC-SHA256) and "
            "keys their file names; default: $RADIXLM_HICACHE_STORAGE_KEY, else a random key created 0600 in "
            "--hicache-storage-dir/.key (servers sharing the directory share it)",
            "enable_lora": "serve LoRA adapters (peft format) on the base model: requests name theirs (/generate "
            "lora_path, OpenAI model BASE:ADAPTER); implied by --lora-paths",
            "lora_paths": "adapters loaded at start: NAME=PATH, PATH, or JSON {\"lora_name\", \"lora_path\", \"pinned\"}",
            "max_loras_per_batch": "distinct adapters in one batch, the base model counting as one (also the adapter slots)",
            "max_loaded_loras": "most adapters loaded at once (default: no limit)",
            "max_lora_rank": "the adapter slots' rank (default: the largest of --lora-paths); larger ranks are refused",
            "lora_target_modules": "projections adapters may target: q_proj k_proj v_proj o_proj gate_proj up_proj "
            "down_proj, qkv_proj, gate_up_proj or all (default: those of --lora-paths)",
            "lora_eviction_policy": "which adapter leaves a full slot pool: lru or fifo (pinned ones never)",
            "lora_backend": "SGLang's LoRA kernels (csgmv, triton, torch_native, ...): accepted; every one runs "
            "radixlm's segmented torch compute (one shrink and one expand per adapter and layer)",
            "enable_priority_scheduling": "order the waiting queue by the requests' `priority` field (larger first); "
            "without it the field is ignored",
            "session_timeout": "seconds a session (/open_session) may stay idle before it is closed and its pinned KV "
            "becomes evictable; also the most a session's own `timeout` may ask",
            "max_sessions": "most open sessions in all (each pins its history's KV in the cache); beyond it a 429",
            "max_sessions_per_key": "most open sessions of one API key; beyond it a 429",
            "max_stored_responses": "most /v1/responses kept for GET and previous_response_id (all keys; least "
            "recently used out first; 0: none kept)",
            "stored_response_ttl": "seconds a stored response is kept after its last use",
            "ep_size": "expert parallelism for MoE models: 1 (every tp rank holds every expert) or --tp-size (each "
            "rank holds num_experts / N experts and computes them for all tokens, then an all-reduce)",
            "tp_size": "tensor parallelism: N ranks (scheduler processes), each with 1/N of every layer and its "
            "share of the cores (--num-threads is per rank)",
            "nnodes": "hosts the tp ranks are spread over (each runs tp_size / nnodes ranks)",
            "node_rank": "this host's index among --nnodes; hosts other than 0 run their ranks and no HTTP server",
            "dist_init_addr": "HOST:PORT where the ranks meet (rank 0's host; the same on every node); default a "
            "free loopback port",
            "dist_timeout": "seconds the ranks' rendezvous or a collective may wait before it fails",
            "pp_size": "pipeline parallelism: N stages (each a tp group of --tp-size ranks), each holding a "
            "contiguous range of layers and their KV; ranks = tp x pp",
            "pp_max_micro_batch_size": "most requests in one pipeline micro-batch of a decode step (default: the "
            "step's requests in pp-size micro-batches)",
            "pp_layer_partition": "layers per pipeline stage, comma separated, first stage first (e.g. 10,11,11; "
            "SGLang's SGLANG_PP_LAYER_PARTITION spelling); default: even, the remainder to the middle stages",
            "tp_allreduce_backend": "how a tp group sums its partial outputs: gloo (torch.distributed), shm (shared "
            "memory, one host), nccl (CUDA); auto: nccl on CUDA, shm on one host, else gloo",
            "log_requests": "log every request's metadata, inputs and outputs (as --log-requests-level says) to "
            "stdout, whatever --log-level; keys and cache_salt values are never logged",
            "log_requests_level": "0: metadata; 1: also sampling params; 2: also inputs and outputs, each cut to "
            "2048 characters or ids; 3: everything",
            "log_requests_format": "text (SGLang's Receive: / Finish: lines) or json (one object per line)",
            "crash_dump_folder": "when the engine dies, write the requests of the last 5 minutes (finished or "
            "running) to FOLDER/<hostname>/crash_dump_<time>.json (0600; no keys)",
            "mem_fraction_static": "SGLang's: the KV pool gets the RAM available after the weights load less (1 - F) x "
            "the RAM available before (on CPU; split among this host's tp ranks); --max-total-tokens caps it",
            "schedule_conservativeness": "SGLang's: scales --new-token-ratio and --min-new-token-ratio (at most 1); "
            "lower admits more requests, higher retracts fewer",
            "decode_kv_mirror_gb": "memory for a dense copy of the decoding requests' KV (0: off; default 1 on CPU, "
            "0 on CUDA)",
            "sampling_defaults": "model: a request's unset temperature, top_p, top_k, min_p, repetition_penalty come "
            "from the model's generation_config.json (a GGUF: its general.sampling.* metadata); openai: the "
            "OpenAI defaults (temperature 1, top_p 1, no top-k) (SGLang's flag)",
        }
        helps.update(_VISION_HELPS)
        helps.update(_PD_HELPS)
        for f in dataclasses.fields(ServerArgs):
            flag = "--" + f.name.replace("_", "-")
            default = f.default
            if f.type in ("bool",) or isinstance(default, bool):
                parser.add_argument(flag, action="store_true", default=default, help=helps.get(f.name))
                continue
            typ = {"int": int, "float": float, "str": str}
            base = str(f.type).replace("Optional[", "").rstrip("]")
            kw = dict(type=typ.get(base, str), default=default, help=helps.get(f.name))
            if f.name in choices:
                kw["choices"] = tuple(choices[f.name])
            if base.startswith("list"):  # SGLang's list flags (--lora-paths A B)
                kw["nargs"] = "*"
            flags = [flag, *_ALIASES.get(f.name, ())]  # SGLang's --dp-size / --tp-size, and their short forms
            parser.add_argument(*flags, **kw)

    @staticmethod
    def to_cli_argv(**options) -> list[str]:
        """`radixlm serve` flags for these ServerArgs options (names checked here; values by the server)."""
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
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


@dataclass
class PortArgs:
    """ZMQ endpoints between the processes (ipc:// sockets in a private temp dir)."""

    tokenizer_ipc_name: str  # detokenizer -> tokenizer manager
    scheduler_input_ipc_name: str  # tokenizer manager -> scheduler
    detokenizer_ipc_name: str  # scheduler -> detokenizer
    ipc_dir: str = ""  # removed by cleanup() when the processes stop

    @staticmethod
    def init_new() -> "PortArgs":
        import tempfile

        d = tempfile.mkdtemp(prefix="radixlm-")
        return PortArgs(
            tokenizer_ipc_name=f"ipc://{d}/tokenizer",
            scheduler_input_ipc_name=f"ipc://{d}/scheduler",
            detokenizer_ipc_name=f"ipc://{d}/detokenizer",
            ipc_dir=d,
        )

    def cleanup(self) -> None:
        if self.ipc_dir:
            import shutil

            shutil.rmtree(self.ipc_dir, ignore_errors=True)
