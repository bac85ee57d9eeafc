"""Typed messages between the processes (a leaf module: it imports nothing of radixlm above it).

tokenizer manager --TokenizedGenerateReqInput/AbortReq/...--> scheduler
scheduler --BatchTokenIDOut--> detokenizer --BatchStrOut--> tokenizer manager
scheduler --control replies (FlushCacheReqOutput, ...)--> tokenizer manager

See docs/architecture.md, "Processes" (the channels and their sockets).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixlm.mm_inputs import MultimodalInputs
from radixlm.sampling_params import SamplingParams


# --- why a request finished: typed here, turned into SGLang's JSON only at the HTTP edge --------
@dataclass(frozen=True)
class FinishReason:
    def to_json(self) -> dict:
        """SGLang's meta_info.finish_reason."""
        raise NotImplementedError


@dataclass(frozen=True)
class FinishLength(FinishReason):
    length: int  # max_new_tokens reached, or the context

    def to_json(self) -> dict:
        return {"type": "length", "length": self.length}


@dataclass(frozen=True)
class FinishStop(FinishReason):
    matched: int | str | None = None  # the stop token id, stop string or stop regex
    matched_regex: bool = False

    def to_json(self) -> dict:
        out = {"type": "stop", "matched": self.matched}
        if self.matched_regex:
            out["matched_regex"] = True
        return out


@dataclass(frozen=True)
class FinishAbort(FinishReason):
    message: str = "aborted"
    # The HTTP status the failure maps to: 400 for a request the scheduler refused, 500 for an
    # internal error; None: aborted by the client or the operator. Never shown to clients.
    status_code: int | None = None

    def to_json(self) -> dict:
        return {"type": "abort", "message": self.message}


@dataclass(frozen=True)
class TokenizedGenerateReqInput:
    """One validated, tokenized request (the tokenizer manager checked every field: the scheduler
    trusts it). Immutable: n > 1 and batches are copies made with dataclasses.replace."""

    rid: str
    input_text: str | None
    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: no prompt logprobs
    top_logprobs_num: int = 0
    stream: bool = False
    priority: int | None = None  # larger runs first (with --enable-priority-scheduling)
    # The prefix cache's namespace of this request's KV (from its cache_salt); None: the common one.
    cache_namespace: str | None = None
    lora_id: str | None = (
        None  # the LoRA adapter's uid (its cache_namespace keeps its KV apart); None: base
    )
    mm_inputs: MultimodalInputs | None = (
        None  # images: their spans (pad values in input_ids) and pixels
    )
    # PD disaggregation (docs/disaggregation.md): the prefill server and transfer room the router
    # chose.
    bootstrap: BootstrapInfo | None = None

    def __post_init__(self):
        # What the scheduler relies on without looking (the context length is the tokenizer
        # manager's to check: it knows it).
        if not self.input_ids:
            raise ValueError("the prompt is empty (text / input_ids)")
        if self.return_logprob and self.logprob_start_len >= len(self.input_ids):
            raise ValueError(
                f"logprob_start_len {self.logprob_start_len} must be below the prompt length "
                f"{len(self.input_ids)}"
            )


@dataclass(frozen=True)
class BootstrapInfo:
    """SGLang's bootstrap_host / bootstrap_port / bootstrap_room of one request: where the prefill
    server's bootstrap service answers, and the id both servers name this request's KV transfer by.
    """

    host: str
    port: int
    room: int


@dataclass
class AbortReq:
    rid: str  # "" aborts everything


@dataclass
class FlushCacheReq:
    level: str = "l1"  # l1: the KV pool; l2: also the host tier; l3: also the storage tier


@dataclass
class FlushCacheReqOutput:
    success: bool
    message: str = ""


@dataclass
class GetInternalStateReq:
    pass


@dataclass
class GetInternalStateReqOutput:
    state: dict[str, Any]


@dataclass(frozen=True)
class DashboardSnapshotReq:
    """/dashboard/stream, once per tick while a client watches: the internal state plus the radix
    tree's largest shared prefixes (cache/tree_snapshot.py). The scheduler does nothing for the
    dashboard but answer this, so with nobody watching it pays nothing."""

    max_nodes: int = 64
    with_token_ids: bool = (
        False  # --dashboard-show-text: each node's token ids (prompts are user data)
    )


@dataclass
class DashboardSnapshotReqOutput:
    state: dict[str, Any]
    tree: list[
        dict[str, Any]
    ]  # nodes, parents first: id, parent, tokens, subtree_tokens, lock_ref, age, ...


@dataclass(frozen=True)
class ProfileReq:
    """/start_profile (start=True) or /stop_profile: SGLang's fields (engine/profiling.py checks
    them)."""

    start: bool
    output_dir: str | None = (
        None  # None: $RADIXLM_TORCH_PROFILER_DIR, $SGLANG_TORCH_PROFILER_DIR, /tmp
    )
    start_step: int | None = None  # the forward step to start at (None: now)
    num_steps: int | None = (
        None  # stop by itself after this many forward steps (None: at /stop_profile)
    )
    activities: tuple[str, ...] = ("CPU",)
    with_stack: bool = True
    record_shapes: bool = True
    profile_prefix: str = ""
    profile_id: str = ""  # the same on every tp rank: the trace files' common name


@dataclass
class ProfileReqOutput:
    success: bool
    message: str = ""


# --- RL and weight updates: SGLang's messages, names and fields (io_struct.py) ---------------
PAUSE_MODES = ("abort", "retract", "in_place")
# SGLang's memory tags; "cuda_graph" holds nothing on CPU (accepted: SGLang's "all" names it).
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")


@dataclass
class UpdateWeightFromDiskReqInput:
    model_path: str  # a checkpoint of the served architecture and shape
    load_format: str | None = (
        None  # None / "auto": by the path; "safetensors" or "gguf" must match it
    )
    abort_all_requests: bool = (
        False  # abort what is in flight instead of letting it finish on the old weights
    )
    flush_cache: bool = True  # drop the prefix cache (its KV came from the old weights)
    weight_version: str | None = None
    keep_pause: bool = False  # stay paused after the update (continue_generation resumes)


@dataclass
class UpdateWeightFromDiskReqOutput:
    success: bool
    message: str
    num_paused_requests: int = 0  # requests that waited for the update


@dataclass
class GetWeightsByNameReqInput:
    name: str  # the checkpoint's (HF) tensor name
    truncate_size: int = 100  # the first rows (dim 0) of the tensor


@dataclass
class GetWeightsByNameReqOutput:
    parameter: list | None  # None: refused (message says why)
    message: str = ""


@dataclass
class PauseGenerationReqInput:
    mode: str = "abort"  # abort | retract | in_place (SGLang's)


@dataclass
class ContinueGenerationReqInput:
    pass


@dataclass
class ReleaseMemoryOccupationReqInput:
    tags: list[str] | None = None  # "weights", "kv_cache" ("cuda_graph": nothing on CPU); None: all


@dataclass
class ResumeMemoryOccupationReqInput:
    tags: list[str] | None = None


@dataclass
class WeightControlReqOutput:
    """The answer to pause / continue / release / resume (success False: refused, message says
    why)."""

    success: bool
    message: str = ""


# --- LoRA adapters (SGLang's /load_lora_adapter, /unload_lora_adapter; radixlm/lora/)
# --------------
@dataclass
class LoadLoRAAdapterReqInput:
    lora_name: str
    lora_path: str
    pinned: bool = False


@dataclass
class UnloadLoRAAdapterReqInput:
    lora_uid: str  # the loaded adapter's id (the tokenizer manager maps names to ids)


@dataclass
class LoRAUpdateReqOutput:
    success: bool
    message: str = ""
    adapter: dict | None = None  # load: {lora_name, lora_path, pinned, uid}


# --- llama-server's slot files (/slots/{id}?action=save|restore; scheduler/control/slot_files.py)
@dataclass
class SlotSaveReq:
    path: str  # under --slot-save-path, checked by the HTTP side
    token_ids: list[int]  # the slot's last prompt: its cached prefix is saved
    cache_namespace: str | None = None


@dataclass
class SlotRestoreReq:
    path: str


@dataclass
class SlotFileReqOutput:
    success: bool
    message: str = ""
    n_tokens: int = 0  # saved or restored
    n_bytes: int = 0  # the file's size
    token_ids: list[int] | None = None  # restore: the file's tokens


@dataclass
class BindSessionReq:
    """Request `rid` (sent next) is a turn of session `session_id`: when it finishes, its KV stays
    pinned in the radix tree for the session (scheduler/kv/session_pins.py). No reply."""

    rid: str
    session_id: str


@dataclass
class CloseSessionReq:
    """The session is closed (or timed out): its pinned KV becomes evictable. No reply."""

    session_id: str


@dataclass
class ControlFailed:
    """The scheduler's answer to a control call that raised (the details are in its log)."""

    reply_type: type  # the reply the call was waiting for (FlushCacheReqOutput, ...)


@dataclass
class ReqOutputChunk:
    """What one request produced since its last chunk (ids and logprobs are increments)."""

    rid: str
    new_output_ids: list[int]
    finished_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    # Detokenization options, so the detokenizer needs no per-request registration.
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    # Trim the matched stop from the text (False when no_stop_trim is set).
    trim_stop: bool = True
    # Stop strings: while streaming, text that may be the start of one is held back. Sent in a
    # request's first chunk only: the detokenizer keeps them with the request's decode state.
    stop_strs: list[str] | None = None
    stop_regex: list[str] | None = None  # likewise, text a stop_regex may yet match from
    # Logprobs, each a list of [logprob, token_id]; top: per position a list of them.
    input_token_logprobs: list | None = None
    input_top_logprobs: list | None = None
    output_token_logprobs: list | None = None
    output_top_logprobs: list | None = None
    forward_passes: int = 0
    spec_verify_ct: int = 0
    spec_accepted_tokens: int = 0
    first_token_time: float | None = None  # wall clock (time.time) of the first output token
    embedding: list[float] | None = None  # an embedding model's finished request: its vector


@dataclass
class BatchTokenIDOut:
    chunks: list[ReqOutputChunk]


@dataclass
class ReqStrChunk:
    """ReqOutputChunk plus the text decoded so far (cumulative, stop strings trimmed)."""

    chunk: ReqOutputChunk
    text: str


@dataclass
class BatchStrOut:
    chunks: list[ReqStrChunk]


@dataclass
class SchedulerReady:
    """First message of the scheduler: it loaded the model and sized its pools."""

    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class SchedulerError:
    message: str


@dataclass
class GenerateReqInput:
    """A user-level generate request (native API / Engine), single or batch."""

    text: Any | None = None  # str | list[str]
    input_ids: Any | None = None  # list[int] | list[list[int]]
    sampling_params: Any | None = None  # dict | list[dict]
    rid: Any | None = None  # str | list[str]
    return_logprob: Any = False
    logprob_start_len: Any = -1
    top_logprobs_num: Any = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    priority: Any | None = None
    # vLLM's cache_salt: requests share cached KV only with requests of the same salt (str |
    # list[str]).
    cache_salt: Any | None = None
    lora_path: Any | None = (
        None  # SGLang's: the LoRA adapter's name (str | list per prompt); None: base
    )
    # SGLang's: images (data: URL, base64, file:// or http(s) URL), str | list per prompt; the text
    # holds the model's image token where each goes (engine/mm_processor.py).
    image_data: Any | None = None
    # SGLang's PD disaggregation fields, set by the router (docs/disaggregation.md).
    bootstrap_host: Any | None = None
    bootstrap_port: Any | None = None
    bootstrap_room: Any | None = None

    def __post_init__(self):
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("exactly one of text or input_ids must be given")
        if self.image_data not in (None, [], "") and self.input_ids is not None:
            raise ValueError(
                "image_data needs text with the model's image token (input_ids cannot place images)"
            )
        t = self.text
        if t is not None and not (
            isinstance(t, str) or (isinstance(t, list) and t and all(isinstance(x, str) for x in t))
        ):
            raise ValueError("text must be a string or a non-empty list of strings")
        ids = self.input_ids
        is_int = lambda x: isinstance(x, int) and not isinstance(x, bool)
        if ids is not None and not (
            isinstance(ids, list)
            and (
                all(is_int(x) for x in ids)
                or (ids and all(isinstance(x, list) and all(is_int(y) for y in x) for x in ids))
            )
        ):
            raise ValueError("input_ids must be a list of token ids or a list of such lists")
        if not isinstance(self.stream, bool):
            raise ValueError("stream must be a boolean")

    @property
    def is_single(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, str)
        return not self.input_ids or not isinstance(self.input_ids[0], list)

    @property
    def batch_size(self) -> int:
        if self.is_single:
            return 1
        return len(self.text if self.text is not None else self.input_ids)

    def item(self, i: int, name: str, default=None):
        """Field `name` for batch item i: per-item lists are indexed, scalars shared."""
        v = getattr(self, name)
        per_item = {
            "sampling_params": dict,
            "rid": str,
            "return_logprob": bool,
            "logprob_start_len": int,
            "top_logprobs_num": int,
            "priority": int,
            "cache_salt": str,
            "lora_path": str,
            "bootstrap_host": str,
            "bootstrap_port": int,
            "bootstrap_room": int,
        }
        if not self.is_single and isinstance(v, list) and name in per_item:
            if len(v) != self.batch_size:
                raise ValueError(f"{name} has {len(v)} items but the batch has {self.batch_size}")
            return v[i]
        return default if v is None else v


class EmbeddingReqInput(GenerateReqInput):
    """A GenerateReqInput that asks for embeddings (engine/embedding.py): what an embedding server
    serves."""
