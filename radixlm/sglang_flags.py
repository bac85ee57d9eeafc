"""SGLang's server flags that radixlm does not take with SGLang's meaning (a leaf: data and small
helpers).

A flag that is a ServerArgs field is "same" unless DIFFERENT lists it; every other SGLang flag is in
one group below: inert (accepted, one log line saying why it does nothing here) or refused (a
parse-time error: `radixlm: error: --flag: why ; what radixlm does instead`). VALUE_RULES give
SGLang's value spellings of radixlm's own options: renamed to radixlm's, or refused with a reason.
docs/sglang_flags.md is generated from this table (python -m radixlm.sglang_flags_doc --write).

A flag's spelling says how it parses, as SGLang's parser does: "--a" a switch, "--a V" one value,
"--a V..." one or more, "--a [V...]" any number, "--a [V]" an optional value; aliases joined by
"/"; "--[no-]a" a switch with its negation; "V=x,y" (refused groups only): these values are
accepted (what radixlm does anyway) and only the others refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

SGLANG_VERSION = (  # the parser this table was written against (tests read the installed one)
    "0.5.10.post1"
)


class Kind(str, Enum):
    SAME = "same"  # a ServerArgs field with SGLang's meaning
    DIFFERENT = "different"  # accepted; meaning or values differ (DIFFERENT / VALUE_RULES say how)
    INERT = "inert"  # accepted and ignored on this machine, with one log line
    REFUSED = "refused"  # a one-line error at parse time


@dataclass(frozen=True)
class FlagSpec:
    options: tuple[str, ...]  # the option strings (aliases), SGLang's first
    nargs: str | None  # argparse's: None one value, "+", "*", "?"; 0 for a switch
    accepted: tuple[str, ...] = ()  # values accepted by a refused flag (radixlm's own behaviour)
    negatable: bool = False  # also --no-<name> (argparse.BooleanOptionalAction)

    @property
    def name(self) -> str:
        return self.options[0]

    @staticmethod
    def parse(spelling: str) -> FlagSpec:
        opts, _, arg = spelling.partition(" ")
        negatable = opts.startswith("--[no-]")
        options = tuple(("--" + opts[7:]) if negatable else o for o in opts.split("/"))
        arg, _, accepted = arg.partition("=")
        nargs = {"": 0, "V": None, "V...": "+", "[V...]": "*", "[V]": "?"}[arg]
        return FlagSpec(options, nargs, tuple(accepted.split(",")) if accepted else (), negatable)


@dataclass(frozen=True)
class FlagGroup:
    kind: Kind
    why: str  # why radixlm ignores or refuses these
    instead: str  # what radixlm does instead
    flags: tuple[str, ...]  # spellings (see the module docstring)
    specs: tuple[FlagSpec, ...] = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "specs", tuple(FlagSpec.parse(s) for s in self.flags))


@dataclass(frozen=True)
class RefusedValues:
    values: tuple[str, ...]
    why: str
    instead: str


@dataclass(frozen=True)
class ValueRule:
    """SGLang's spellings of one radixlm option's values."""

    flag: str
    renamed: Mapping[str, str] = field(default_factory=dict)  # SGLang's value -> radixlm's
    refused: tuple[RefusedValues, ...] = ()

    def sglang_values(self) -> tuple[str, ...]:
        return tuple(self.renamed) + tuple(v for r in self.refused for v in r.values)


def _inert(why: str, *flags: str, instead: str = "") -> FlagGroup:
    return FlagGroup(Kind.INERT, why, instead, flags)


def _refused(why: str, instead: str, *flags: str) -> FlagGroup:
    return FlagGroup(Kind.REFUSED, why, instead, flags)


GPU_ATTENTION = (
    "flex_attention",
    "nsa",
    "cutlass_mla",
    "fa3",
    "fa4",
    "flashinfer",
    "flashmla",
    "trtllm_mla",
    "trtllm_mha",
    "dual_chunk_flash_attn",
    "aiter",
    "wave",
    "ascend",
    "intel_xpu",
)
_ATTENTION = ValueRule(
    "--attention-backend",
    # torch_native is SGLang's SDPA backend; intel_amx its CPU kernels, as radixlm's native backend
    # is.
    renamed={"torch_native": "torch", "intel_amx": "native"},
    refused=(
        RefusedValues(
            GPU_ATTENTION,
            "a CUDA/ROCm/Ascend/XPU kernel library (or flex attention) that radixlm does not ship",
            "triton (the paged Triton kernels, CUDA), native (the paged CPU kernel) or torch (SDPA,"
            " any device)",
        ),
    ),
)

VALUE_RULES: dict[str, ValueRule] = {
    "kv_cache_dtype": ValueRule(
        "--kv-cache-dtype",
        renamed={"bf16": "bfloat16"},
        refused=(
            RefusedValues(
                ("fp8_e5m2", "fp8_e4m3", "fp4_e2m1"),
                "radixlm's KV pools hold float32, float16, bfloat16 or int8: no fp8 "
                "or fp4 kernels on CPU",
                "--kv-cache-dtype int8 (per-token scales, a quarter of float32's bytes) or float16",
            ),
        ),
    ),
    "attention_backend": _ATTENTION,
    "prefill_attention_backend": ValueRule(
        "--prefill-attention-backend", _ATTENTION.renamed, _ATTENTION.refused
    ),
    "decode_attention_backend": ValueRule(
        "--decode-attention-backend", _ATTENTION.renamed, _ATTENTION.refused
    ),
    "speculative_algorithm": ValueRule(
        "--speculative-algorithm",
        renamed={
            "NGRAM": "ngram",
            "STANDALONE": "draft-model",
            "EAGLE": "eagle",
            "EAGLE3": "eagle3",
        },
        refused=(
            RefusedValues(
                ("NEXTN",),
                "NEXTN drafts with a model's own multi-token-prediction layers, which "
                "radixlm does not load",
                "EAGLE / EAGLE3 with a separate draft head (`radixlm "
                "train-eagle` trains one), NGRAM (ngram), STANDALONE (draft-model) or radix",
            ),
        ),
    ),
    "quantization": ValueRule(
        "--quantization",
        refused=(
            RefusedValues(
                ("w8a8_int8",),
                "SGLang's w8a8_int8 reads a checkpoint pre-quantized by llm-compressor, which "
                "radixlm cannot load",
                "serve the float checkpoint with --quantization int8 (int8 weights and "
                "activations, quantized at load)",
            ),
            RefusedValues(
                (
                    "awq",
                    "mxfp8",
                    "gptq",
                    "marlin",
                    "gptq_marlin",
                    "awq_marlin",
                    "bitsandbytes",
                    "modelopt",
                    "modelopt_fp8",
                    "modelopt_fp4",
                    "modelopt_mixed",
                    "petit_nvfp4",
                    "w8a8_fp8",
                    "moe_wna16",
                    "qoq",
                    "w4afp8",
                    "mxfp4",
                    "auto-round",
                    "compressed-tensors",
                    "modelslim",
                    "quark_int4fp8_moe",
                ),
                "a GPU checkpoint quantization format that radixlm does not load",
                "a GGUF file (its own quantization, the default) or --quantization"
                " int8|q4_0|q8_0|q4_k (quantized at load)",
            ),
        ),
    ),
    "schedule_policy": ValueRule(
        "--schedule-policy",
        refused=(
            RefusedValues(
                ("priority",),
                "SGLang's own scheduler has no such policy (it fails at start-up)",
                "--enable-priority-scheduling orders the queue by priority under any policy",
            ),
            RefusedValues(
                ("routing-key",),
                "routing keys (set by SGLang's gateway) are not in radixlm",
                "lpm, fcfs, lof, random or dfs-weight",
            ),
        ),
    ),
    "disaggregation_transfer_backend": ValueRule(
        "--disaggregation-transfer-backend",
        refused=(
            RefusedValues(
                ("mooncake", "nixl", "ascend", "mori"),
                "an RDMA transfer engine radixlm has no client for "
                "(docs/disaggregation.md says how one plugs into its Sender/Receiver interface)",
                "--disaggregation-transfer-backend tcp (ZMQ, any host) or shm (shared memory, one"
                " host)",
            ),
        ),
    ),
    "load_balance_method": ValueRule(
        "--load-balance-method",
        refused=(
            RefusedValues(
                ("follow_bootstrap_room",),
                "PD disaggregation does not run with DP attention in radixlm",
                "auto (cache-aware), round_robin, total_requests or total_tokens",
            ),
        ),
    ),
    "grammar_backend": ValueRule(
        "--grammar-backend",
        refused=(
            RefusedValues(
                ("outlines", "llguidance"),
                "radixlm compiles grammars with xgrammar only",
                "--grammar-backend xgrammar (the default) or none",
            ),
        ),
    ),
    "reasoning_parser": ValueRule(
        "--reasoning-parser",
        refused=(
            RefusedValues(
                ("gpt-oss", "minimax-append-think", "nemotron_3", "step3p5"),
                "a reasoning format radixlm/reasoning does not have",
                "a format with the same markers (qwen3 and deepseek-r1 read <think>...</think>)",
            ),
        ),
    ),
    "hicache_storage_backend": ValueRule(
        "--hicache-storage-backend",
        refused=(
            RefusedValues(
                ("mooncake", "hf3fs", "nixl", "aibrix", "dynamic", "eic"),
                "a distributed KV store radixlm has no client for",
                "--hicache-storage-backend file",
            ),
        ),
    ),
    "tool_call_parser": ValueRule(
        "--tool-call-parser",
        refused=(
            RefusedValues(
                (
                    "deepseekv32",
                    "glm",
                    "glm45",
                    "glm47",
                    "gpt-oss",
                    "kimi_k2",
                    "lfm2",
                    "mimo",
                    "qwen3_coder",
                    "step3",
                    "step3p5",
                    "minimax-m2",
                    "trinity",
                    "interns1",
                    "gigachat3",
                ),
                "radixlm has no parser for this model family's tool-call syntax yet",
                "hermes, qwen25, qwen, llama3, mistral, pythonic, deepseekv3 or deepseekv31"
                " (docs/agents.md)",
            ),
        ),
    ),
}


@dataclass(frozen=True)
class FlagCombination:
    """Accepted flags that radixlm refuses together (SGLang may take them, or assert later)."""

    flag: str  # the flag the one-line error names
    refuses: Callable[[Any], bool]  # on the parsed namespace
    why: str
    instead: str


def _dp_attention_sizes_differ(args: Any) -> bool:
    # SGLang asserts tp_size % dp_size == 0 when the server starts; radixlm also needs them equal.
    # (--dp-size 1 turns DP attention off, as in SGLang.)
    dp = getattr(args, "dp_size", 1) or 1
    return (
        bool(getattr(args, "enable_dp_attention", False))
        and dp > 1
        and getattr(args, "tp_size", 1) != dp
    )


COMBINATIONS: tuple[FlagCombination, ...] = (
    FlagCombination(
        "--enable-dp-attention",
        _dp_attention_sizes_differ,
        "DP attention needs --tp-size equal to --dp-size (one rank per attention group; radixlm"
        " does not split a group's heads over ranks)",
        "--tp-size N --dp-size N (N >= 2) on a MoE model",
    ),
)


# ServerArgs fields whose meaning differs from SGLang's (VALUE_RULES' renames and refusals come on
# top).
DIFFERENT: dict[str, str] = {
    "--dtype": (
        "auto is float32 on CPU (the HF reference) and bfloat16 on CUDA; SGLang's auto is the"
        " checkpoint's 16-bit type (half = float16, float = float32, as in SGLang)"
    ),
    "--quantization": (
        "radixlm's values: gguf (a GGUF's own block formats, its default), none (dequantized to "
        "--dtype), int8, q4_0, q8_0, q4_k, f16, bf16 (quantized at load; native CPU kernels), fp8"
        " (CUDA: FP8 weights with a scale per output row, bf16 activations, quantized at load)"
    ),
    "--kv-cache-dtype": (
        "radixlm adds float32, float16 and int8 (a float32 scale per token and head)"
    ),
    "--attention-backend": (
        "radixlm's backends: native (the paged CPU kernel), triton (the paged Triton kernels,"
        " auto's choice on CUDA) and torch (SDPA), and mla for DeepSeek-V2/V3's latent KV cache"
        " (auto picks it for them)"
    ),
    "--prefill-attention-backend": "as --attention-backend",
    "--decode-attention-backend": "as --attention-backend",
    "--speculative-algorithm": (
        "radixlm's: ngram (prompt lookup), radix (continuations in the radix cache), "
        "draft-model, eagle, eagle3"
    ),
    "--speculative-num-draft-tokens": (
        "the most draft tokens per request and step, the root (the request's last token) not"
        " counted (SGLang counts it): --speculative-draft-policy adaptive (the default) drafts"
        " fewer where they do not pay; fixed drafts SGLang's way"
    ),
    "--speculative-eagle-topk": (
        "also bounds the trees of ngram and radix (default 4: their recorded continuations; 4 for"
        " eagle / eagle3); the step's width is narrowed to the sibling ranks whose measured"
        " acceptance still pays"
    ),
    "--speculative-num-steps": (
        "the most levels of any draft tree (default: 5 for eagle / eagle3, else "
        "--speculative-num-draft-tokens)"
    ),
    "--speculative-token-map": (
        "a local torch file of token ids (SGLang also fetches one from the Hub); eagle only"
    ),
    "--schedule-policy": "default lpm (SGLang's: fcfs)",
    "--device": "cpu or cuda (xpu, hpu, npu, mps: refused when the engine starts)",
    "--dp-size": (
        "N whole servers behind radixlm's cache-aware router, on this host's cores (SGLang: N"
        " scheduler processes behind its data-parallel controller); with --enable-dp-attention, as"
        " SGLang: N attention ranks of one server"
    ),
    "--enable-dp-attention": (
        "MoE models only; --tp-size must equal --dp-size for now (no tensor parallelism inside an"
        " attention group); the experts are split by --ep-size N, or with --ep-size 1 held whole by"
        " every rank (SGLang splits each expert's matrices then); dense layers run on each rank's"
        " own tokens (SGLang's --moe-dense-tp-size 1); chunked prefill and schedule"
        " conservativeness are not scaled by dp-size"
    ),
    "--load-balance-method": (
        "auto is radixlm's cache-aware choice (the rank that was sent the prompt's prefix, else "
        "the least loaded; SGLang's auto is round_robin); follow_bootstrap_room (PD) is not taken"
    ),
    "--mem-fraction-static": (
        "on CPU the KV pool gets the RAM available after the weights load less (1 - F) x the RAM"
        " available before (SGLang's formula with RAM for GPU memory), split among this host's tp"
        " ranks; unset: --kv-memory-gb"
    ),
    "--ep-size": (
        "1 or --tp-size only: the experts are split over the whole tp group (SGLang also takes a"
        " divisor of tp-size, the experts' matrices then split over tp-size / ep-size ranks);"
        " --ep-size 1 with --tp-size N keeps every expert on every rank"
    ),
    "--schedule-conservativeness": (
        "scales radixlm's --new-token-ratio and --min-new-token-ratio (at most 1), as "
        "SGLang scales its initial new-token ratio"
    ),
}

# SGLang's deprecated spellings of radixlm switches (same meaning).
SWITCH_ALIASES: dict[str, str] = {"--stream-output": "incremental_streaming_output"}

GROUPS: tuple[FlagGroup, ...] = (
    _inert(
        "radixlm's metrics have fixed buckets and labels (docs/observability.md: SGLang's names"
        " beside radixlm's)",
        "--collect-tokens-histogram",
        "--bucket-time-to-first-token V...",
        "--bucket-inter-token-latency V...",
        "--bucket-e2e-request-latency V...",
        "--prompt-tokens-buckets V...",
        "--generation-tokens-buckets V...",
        "--enable-mfu-metrics",
        "--enable-metrics-for-all-schedulers",
        "--tokenizer-metrics-custom-labels-header V",
        "--tokenizer-metrics-allowed-custom-labels V...",
        "--extra-metric-labels V",
    ),
    _inert(
        "on CPU /release_memory_occupation and /resume_memory_occupation always work (docs/rl.md):"
        " there is no allocator to switch",
        "--enable-memory-saver",
    ),
    _inert(
        "radixlm never runs a checkpoint's own code: its models are its own implementations",
        "--trust-remote-code",
    ),
    _inert(
        "CUDA graphs: radixlm captures decode steps at --cuda-graph-bs or up to"
        " --cuda-graph-max-bs, padded (--disable-cuda-graph: none); these tune what it does not"
        " have",
        "--disable-cuda-graph-padding",
        "--enable-profile-cuda-graph",
        "--enable-cudagraph-gc",
        "--disable-piecewise-cuda-graph",
        "--enable-piecewise-cuda-graph",
        "--enforce-piecewise-cuda-graph",
        "--piecewise-cuda-graph-tokens V...",
        "--piecewise-cuda-graph-compiler V",
        "--piecewise-cuda-graph-max-tokens V",
    ),
    _inert(
        "radixlm's Triton attention always merges its KV splits in float32 and sizes them from the"
        " batch size and the GPU's multiprocessors (kernels/triton_ops)",
        "--triton-attention-reduce-in-fp32",
        "--triton-attention-num-kv-splits V",
        "--triton-attention-split-tile-size V",
    ),
    _inert(
        "tunes a GPU kernel, library or collective (CUDA, ROCm, NCCL) that radixlm does not use",
        "--disable-flashinfer-autotune",
        "--enable-flashinfer-allreduce-fusion",
        "--enforce-disable-flashinfer-allreduce-fusion",
        "--enable-aiter-allreduce-fusion",
        "--flashinfer-mla-disable-ragged",
        "--enable-nccl-nvls",
        "--enable-symm-mem",
        "--disable-custom-all-reduce",
        "--enable-mscclpp",
        "--enable-torch-symm-mem",
        "--pre-warm-nccl",
        "--enable-p2p-check",
        "--disable-flashinfer-cutlass-moe-fp4-allgather",
        "--enable-layerwise-nvtx-marker",
        "--nccl-port V",
        "--base-gpu-id V",
        "--gpu-id-step V",
        "--fp8-gemm-backend V",
        "--fp4-gemm-backend V",
        "--sampling-backend V",
        "--enable-fused-qk-norm-rope",
        "--disable-outlines-disk-cache",
        "--enable-nan-detection",
        instead=(
            "radixlm's own CPU kernels; tensor parallelism sums over gloo, shared "
            "memory or NCCL (--tp-allreduce-backend)"
        ),
    ),
    _inert(
        "a scheduler or tokenizer tuning knob radixlm does not have (outputs are the same"
        " without it)",
        "--tokenizer-worker-num V",
        "--enable-tokenizer-batch-encode",
        "--disable-tokenizer-batch-decode",
        "--enable-dynamic-batch-tokenizer",
        "--dynamic-batch-tokenizer-batch-size V",
        "--dynamic-batch-tokenizer-batch-timeout V",
        "--scheduler-recv-interval V",
        "--num-continuous-decode-steps V",
        "--sleep-on-idle",
        "--weight-loader-disable-mmap",
        "--gc-threshold V...",
        "--gc-warning-threshold-secs V",
        "--prefill-max-requests V",
        "--enable-dynamic-chunking",
        "--disable-chunked-prefix-cache",
        "--enable-prefill-delayer",
        "--prefill-delayer-max-delay-passes V",
        "--prefill-delayer-token-usage-low-watermark V",
        "--prefill-delayer-forward-passes-buckets V...",
        "--prefill-delayer-wait-seconds-buckets V...",
        "--prefill-round-robin-balance",
    ),
    _inert(
        "radixlm never preempts a running request for a higher priority"
        " (--enable-priority-scheduling orders the waiting queue)",
        "--disable-priority-preemption",
        "--priority-scheduling-preemption-threshold V",
    ),
    _inert(
        "radixlm pins each tp rank to its own slice of the cores the server may use",
        "--numa-node V...",
        instead="choose the cores (and so the NUMA node) with taskset or numactl",
    ),
    _inert(
        "radixlm runs no warm-up request: the server is ready when the model is loaded",
        "--skip-server-warmup",
        "--warmups V",
    ),
    _inert(
        "radixlm's KV pool and radix tree are token-granular (SGLang's page size 1) and evict least"
        " recently used leaves (lru)",
        "--page-size V",
        "--radix-eviction-policy V",
    ),
    _inert(
        "radixlm's hierarchical cache copies between host pools on the CPU, in its own layout, and"
        " a request waits for its L3 reads to complete (SGLang's wait_complete)",
        "--hicache-io-backend V",
        "--hicache-mem-layout V",
        "--hicache-storage-prefetch-policy V",
        "--hicache-storage-backend-extra-config V",
    ),
    _inert(
        "radixlm keeps every token of a sliding-window layer in its one KV pool",
        "--swa-full-tokens-ratio V",
        "--disable-hybrid-swa-memory",
        "--hybrid-kvcache-ratio",
    ),
    _inert(
        "tunes a model family radixlm does not load (Mamba, linear attention, DeepSeek's sparse"
        " attention)",
        "--max-mamba-cache-size V",
        "--mamba-ssm-dtype V",
        "--mamba-full-memory-ratio V",
        "--mamba-scheduler-strategy V",
        "--mamba-track-interval V",
        "--mamba-backend V",
        "--linear-attn-backend V",
        "--linear-attn-decode-backend V",
        "--linear-attn-prefill-backend V",
        "--nsa-prefill-backend V",
        "--nsa-decode-backend V",
    ),
    _inert(
        "multimodal tuning radixlm does not have (its vision encoder runs in the scheduler, batched"
        " per step)",
        "--mm-attention-backend V",
        "--disable-fast-image-processor",
        "--keep-mm-feature-on-device",
        "--enable-broadcast-mm-inputs-process",
        "--mm-process-config V",
        "--mm-enable-dp-encoder",
        "--limit-mm-data-per-request V",
        "--enable-prefix-mm-cache",
        "--enable-mm-global-cache",
        "--enable-precise-embedding-interpolation",
    ),
    _inert(
        "weights already live in host memory on a CPU: there is no GPU to offload them from or back"
        " them up for",
        "--cpu-offload-gb V",
        "--offload-group-size V",
        "--offload-num-in-group V",
        "--offload-prefetch-step V",
        "--offload-mode V",
        "--enable-weights-cpu-backup",
        "--enable-draft-weights-cpu-backup",
    ),
    _inert(
        "an observability or debugging output radixlm does not produce",
        "--enable-trace",
        "--otlp-traces-endpoint V",
        "--export-metrics-to-file",
        "--export-metrics-to-file-dir V",
        "--enable-request-time-stats-logging",
        "--show-time-cost",
        "--log-level-http V",
        "--uvicorn-access-log-exclude-prefixes [V...]",
        "--soft-watchdog-timeout V",
        "--debug-tensor-dump-output-folder V",
        "--debug-tensor-dump-layers V...",
        "--debug-tensor-dump-input-file V",
        "--debug-tensor-dump-inject V",
        "--weight-version V",
        instead="/metrics (--enable-metrics), the log at --log-level, --watchdog-timeout",
    ),
    _inert("usage always reports prompt_tokens_details.cached_tokens", "--enable-cache-report"),
    _inert(
        "radixlm loads the tokenizer anyway: input_ids requests and output_ids work as with the"
        " option",
        "--skip-tokenizer-init",
    ),
    _inert(
        "SGLang applies it with outlines and llguidance only; radixlm compiles grammars with"
        " xgrammar",
        "--constrained-json-whitespace-pattern V",
    ),
    _inert("an option of SGLang's Python Engine, not of its server", "--custom-sigquit-handler V"),
    _inert(
        "radixlm's routes answer at /: a proxy that strips the prefix works (only the OpenAPI docs'"
        " links lack it)",
        "--fastapi-root-path V",
    ),
    _inert(
        "SGLang's file storage backs its /v1/files API, which radixlm does not have",
        "--file-storage-path V",
    ),
    _inert(
        "radixlm's native CPU path (quantized weights: a GGUF's own or --quantization"
        " int8|q4_0|q8_0|q4_k) is batch-invariant already; float32 weights run MKL's GEMM, whose"
        " sums may change with the batch",
        "--enable-deterministic-inference",
    ),
    _inert(
        "radixlm's LoRA compute is one segmented torch path (--lora-backend accepts SGLang's"
        " names); adapters load synchronously",
        "--enable-lora-overlap-loading",
        "--max-lora-chunk-size V",
    ),
    _refused(
        "LoRA on mixture-of-experts models is not in radixlm",
        "a dense model's adapters (--enable-lora)",
        "--[no-]experts-shared-outer-loras",
    ),
    _refused(
        "these parts of prefill/decode disaggregation (RDMA devices, decode-side KV offload, PD "
        "multiplexing) and encoder disaggregation are not in radixlm",
        "--disaggregation-mode prefill|decode "
        "with --disaggregation-transfer-backend tcp|shm behind `radixlm router"
        " --pd-disaggregation`",
        "--disaggregation-ib-device V",
        "--disaggregation-decode-enable-offload-kvcache",
        "--disaggregation-decode-polling-interval V",
        "--enable-pdmux",
        "--pdmux-config-path V",
        "--sm-group-num V",
        "--encoder-only",
        "--language-only",
        "--encoder-transfer-backend V",
        "--encoder-urls V...",
        "--enable-adaptive-dispatch-to-encoder",
    ),
    _refused(
        "context parallelism, a data-parallel LM head and two-batch overlap (and an asynchronous"
        " pipeline depth) are not in radixlm yet",
        "--tp-size and --pp-size (ranks on this host or over --nnodes), --dp-size "
        "(servers behind the router) and --enable-dp-attention",
        "--pp-async-batch-depth V",
        "--attention-context-parallel-size/--attn-cp-size V=1",
        "--moe-data-parallel-size/--moe-dp-size V=1",
        "--enable-dp-lm-head",
        "--enable-two-batch-overlap",
        "--enable-single-batch-overlap",
        "--tbo-token-distribution-threshold V",
        "--enable-attn-tp-input-scattered",
        "--enable-nsa-prefill-context-parallel",
        "--nsa-prefill-cp-mode V",
        "--enable-prefill-context-parallel",
        "--prefill-cp-mode V",
    ),
    _refused(
        "these mixture-of-experts options (all-to-all backends, EPLB, DeepEP, other MoE runners)"
        " are not in radixlm",
        "--ep-size N (experts split over the tp group, then an all-reduce; docs/moe.md)",
        "--moe-a2a-backend V=none",
        "--moe-runner-backend V=auto",
        "--flashinfer-mxfp4-moe-precision V",
        "--deepep-mode V",
        "--ep-num-redundant-experts V",
        "--ep-dispatch-algorithm V",
        "--init-expert-location V",
        "--enable-eplb",
        "--eplb-algorithm V",
        "--eplb-rebalance-num-iterations V",
        "--eplb-rebalance-layers-per-chunk V",
        "--eplb-min-rebalancing-utilization-threshold V",
        "--expert-distribution-recorder-mode V",
        "--expert-distribution-recorder-buffer-size V",
        "--enable-expert-distribution-metrics",
        "--deepep-config V",
        "--moe-dense-tp-size V",
        "--elastic-ep-backend V=none",
        "--enable-elastic-expert-backup",
        "--mooncake-ib-device V",
        "--disable-shared-experts-fusion",
        "--enable-fused-moe-sum-all-reduce",
        "--enable-return-routed-experts",
        "--speculative-moe-runner-backend V=auto",
        "--speculative-moe-a2a-backend V=none",
        "--kt-weight-path V",
        "--kt-method V",
        "--kt-cpuinfer V",
        "--kt-threadpool-count V",
        "--kt-num-gpu-experts V",
        "--kt-max-deferred-experts-per-token V",
    ),
    _refused(
        "multi-layer EAGLE (several draft layers, one per step) is not in radixlm",
        "--speculative-algorithm EAGLE|EAGLE3 with a one-layer head",
        "--enable-multi-layer-eagle",
    ),
    _inert(
        "radixlm drafts trees whose size it picks per step (up to --speculative-num-draft-tokens,"
        " --speculative-eagle-topk wide, --speculative-num-steps deep), by its own prompt-lookup"
        " index (--speculative-ngram-min/max-match-window-size), in the draft model's own attention"
        " backend",
        "--speculative-attention-mode V",
        "--speculative-draft-attention-backend V",
        "--speculative-ngram-min-bfs-breadth V",
        "--speculative-ngram-max-bfs-breadth V",
        "--speculative-ngram-match-type V",
        "--speculative-ngram-max-trie-depth V",
        "--speculative-ngram-capacity V",
    ),
    _refused(
        "lossy acceptance: radixlm's verification is exact (outputs are plain decoding's)",
        "exact verification (SGLang's default, 1.0)",
        "--speculative-accept-threshold-single V=1,1.0",
        "--speculative-accept-threshold-acc V=1,1.0",
    ),
    _refused(
        "the draft model loads as its file is (a GGUF's own quantization, else --dtype); SGLang's"
        " revision, load-format and quantization choices for it are not in radixlm",
        "--speculative-draft-model-path a local HF directory or GGUF file",
        "--speculative-draft-load-format V=auto,safetensors,gguf",
        "--speculative-draft-model-quantization V=unquant",
    ),
    _refused(
        "radixlm loads a local HF directory (safetensors) or a GGUF file, by what the files are;"
        " SGLang's other load formats, loaders and weight sources are not in radixlm",
        "a local checkpoint",
        "--load-format V=auto,safetensors,gguf",
        "--model-loader-extra-config V={}",
        "--custom-weight-loader [V...]",
        "--remote-instance-weight-loader-seed-instance-ip V",
        "--remote-instance-weight-loader-seed-instance-service-port V",
        "--remote-instance-weight-loader-send-weights-group-ports V",
        "--remote-instance-weight-loader-backend V",
        "--remote-instance-weight-loader-start-seed-via-transfer-engine",
        "--engine-info-bootstrap-port V",
        "--modelexpress-config V",
        "--checkpoint-engine-wait-weights-before-ready",
        "--decrypted-config-file V",
        "--decrypted-draft-config-file V",
    ),
    _refused(
        "radixlm uses the fast tokenizer (the tokenizers library) only",
        "--tokenizer-mode auto",
        "--tokenizer-mode V=auto",
    ),
    _refused(
        "radixlm runs its own model implementations, never transformers' modeling code",
        "--model-impl auto",
        "--model-impl V=auto,sglang",
    ),
    _refused(
        "changing the model's config or hooking its layers is not in radixlm",
        "serve the checkpoint as it is",
        "--json-model-override-args V={}",
        "--forward-hooks V",
    ),
    _refused(
        "checking the checkpoint against checksums is not in radixlm",
        "verify the files before serving them",
        "--model-checksum [V]",
    ),
    _refused(
        "radixlm never deletes a checkpoint",
        "delete it once the server is up",
        "--delete-ckpt-after-loading",
    ),
    _refused(
        "RL-framework integrations (FSDP on-policy matching, Ray actors) are not in radixlm",
        "radixlm starts its own processes; the Python Engine runs in the caller's",
        "--rl-on-policy-target V",
        "--use-ray",
    ),
    _refused(
        "quantization through NVIDIA ModelOpt, torchao or FlashRL (CUDA libraries), or fp8 KV"
        " scales: not in radixlm",
        "a GGUF file or --quantization int8|q4_0|q8_0|q4_k (quantized at load, native CPU kernels);"
        " --kv-cache-dtype int8",
        "--modelopt-quant V",
        "--modelopt-checkpoint-restore-path V",
        "--modelopt-checkpoint-save-path V",
        "--modelopt-export-path V",
        "--quantize-and-serve",
        "--rl-quant-profile V",
        "--torchao-config V",
        "--quantization-param-path V",
    ),
    _refused(
        "a float32 LM head under 16-bit weights is not in radixlm",
        "--dtype float32 (the CPU default) computes the LM head, and the rest, in float32",
        "--enable-fp32-lm-head",
    ),
    _refused(
        "sparse or diffusion attention and LMCache are not in radixlm",
        "dense attention over the radix cache "
        "(--enable-hierarchical-cache keeps KV in host memory and on disk)",
        "--enable-double-sparsity",
        "--ds-channel-config-path V",
        "--ds-heavy-channel-num V",
        "--ds-heavy-token-num V",
        "--ds-heavy-channel-type V",
        "--ds-sparse-decode-threshold V",
        "--enable-hisparse",
        "--hisparse-config V",
        "--enable-lmcache",
        "--dllm-algorithm V",
        "--dllm-algorithm-config V",
    ),
    _refused(
        "multi-item scoring is not in radixlm",
        "score each item as a request of its own (max_new_tokens 0, return_logprob)",
        "--multi-item-scoring-delimiter V",
    ),
    _refused(
        "returning hidden states is not in radixlm",
        "logprobs (return_logprob, top_logprobs_num)",
        "--enable-return-hidden-states",
    ),
    _refused(
        "TLS is not in radixlm",
        "serve HTTP behind a TLS-terminating proxy",
        "--ssl-keyfile V",
        "--ssl-certfile V",
        "--ssl-ca-certs V",
        "--ssl-keyfile-password V",
        "--enable-ssl-refresh",
    ),
    _refused(
        "radixlm serves HTTP only",
        "the HTTP API (SGLang's native routes and OpenAI's)",
        "--grpc-mode",
    ),
    _refused(
        "built-in tool servers are not in radixlm",
        "the client runs its tools (tool_calls in the answer, tool messages back)",
        "--tool-server V",
    ),
    _refused(
        "SGLang's streaming sessions and KV-event publishing are not in radixlm",
        "the radix cache reuses a conversation's prefix without sessions; /metrics shows the cache",
        "--enable-streaming-session",
        "--kv-events-config V",
    ),
    _refused(
        "truncating over-long prompts is not in radixlm",
        "an over-long prompt is a 400 naming the limit: truncate it in the client",
        "--allow-auto-truncate",
    ),
    _refused(
        "usage in every streamed response is not in radixlm",
        "a stream asks for usage with stream_options.include_usage",
        "--stream-response-default-include-usage",
    ),
    _refused(
        "compact-JSON grammars are not in radixlm",
        "JSON follows xgrammar's default whitespace",
        "--constrained-json-disable-any-whitespace",
    ),
    _refused(
        "SGLang's priority variants are not in radixlm",
        "--enable-priority-scheduling: larger priority first, a request without one counts as 0",
        "--default-priority-value V",
        "--abort-on-priority-when-disabled",
        "--schedule-low-priority-values-first",
    ),
    _refused(
        "radixlm runs no client-supplied code (a custom logit processor is pickled Python)",
        "logit_bias, min_p, the penalties and grammars",
        "--enable-custom-logit-processor",
    ),
    _refused(
        "named chat templates are not in radixlm",
        "the tokenizer's default chat template",
        "--hf-chat-template-name V",
    ),
    _refused(
        "server-side sampling defaults as JSON are not in radixlm",
        "each request's sampling parameters",
        "--preferred-sampling-params V",
    ),
    _refused(
        "SGLang's request-log targets are not in radixlm",
        "request logs go to stdout",
        "--log-requests-target V...",
    ),
    _refused(
        "torch.compile's debug mode is not in radixlm",
        "compiled or native forward without debug checks",
        "--enable-torch-compile-debug-mode",
    ),
)


def all_specs() -> dict[str, tuple[FlagGroup, FlagSpec]]:
    """Every option string of the table -> its group and spec."""
    out: dict[str, tuple[FlagGroup, FlagSpec]] = {}
    for group in GROUPS:
        for spec in group.specs:
            for option in spec.options:
                out[option] = (group, spec)
    return out


class FlagRefused(ValueError):
    """A refused SGLang flag or value: its one-line reason."""


def refusal(flag: str, why: str, instead: str) -> FlagRefused:
    return FlagRefused(f"{flag}: {why} ; {instead}")


def normalize_values(obj, cli: bool = False) -> None:
    """SGLang's spellings of radixlm options on `obj` (ServerArgs or a parsed Namespace): renamed to
    radixlm's in place, or a FlagRefused naming the flag (cli) or the field."""
    for name, rule in VALUE_RULES.items():
        value = getattr(obj, name, None)
        if value is None:
            continue
        if value in rule.renamed:
            setattr(obj, name, rule.renamed[value])
            continue
        for r in rule.refused:
            if value in r.values:
                raise refusal(
                    f"{rule.flag} {value}" if cli else f"{name}={value!r}", r.why, r.instead
                )
    for combo in COMBINATIONS:
        if combo.refuses(obj):
            raise refusal(
                combo.flag if cli else combo.flag.lstrip("-").replace("-", "_"),
                combo.why,
                combo.instead,
            )
