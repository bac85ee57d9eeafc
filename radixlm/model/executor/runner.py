"""ModelRunner: owns the model, the KV pools and the sampler; runs one ForwardBatch."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from radixlm.cache.memory_pool import ReqToTokenPool
from radixlm.lora.runtime import create_lora_runtime
from radixlm.model import model_summary
from radixlm.model.decoder_stack import DecoderStack, decoder_stack_of
from radixlm.model.executor import pp_micro
from radixlm.model.executor.compiled_decode import EagerDecode, create_decode_graphs
from radixlm.model.executor.cuda_graph_runner import create_cuda_graphs
from radixlm.model.executor.mrope import mrope_positions
from radixlm.model.executor.runner_config import ModelRunnerConfig
from radixlm.model.executor.worker_batch import ModelWorkerBatch
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.hidden_capture import HiddenCapture, NoHiddenCapture
from radixlm.model.host_copy import to_device
from radixlm.model.layers.attention import (
    AttentionBackendSpec,
    attention_features,
    create_attention_backend,
    resolve_attention_backends,
)
from radixlm.model.layers.rotary import MRotaryEmbedding
from radixlm.model.layers.sampler import Sampler, SamplingBatchInfo
from radixlm.model.memory.kv_budget import available_memory_bytes, stage_kv_capacity
from radixlm.model.memory.kv_layout import held_kv_layers, kv_layout
from radixlm.model.memory.state_memory import StateMemory
from radixlm.model.memory.swa_memory import SWAMemory, check_kv_shapes, model_refusal
from radixlm.model.pooler import Pooler
from radixlm.model.pp_stage import pp_stage
from radixlm.model.quant.methods import quant_method
from radixlm.model.tree_mask import TreeMask
from radixlm.utils import host_threads, keep_freed_memory_in_heap

logger = logging.getLogger(__name__)


@dataclass
class LogitsOutput:
    # [bs, vocab] float32: logits predicting each request's next token.
    next_token_logits: torch.Tensor
    # Extend with prompt logprobs: per request, [rows, vocab] log-softmax for positions
    # extend_logprob_start_lens_cpu[i] .. end-1 (the last row equals next_token_logits'); else None.
    prompt_logprobs: list[torch.Tensor | None] | None = None
    # TARGET_VERIFY: per request, [1 + drafts, vocab] raw logits (the verifier picks tokens from
    # them exactly as decoding picks from next_token_logits; no log-softmax is spent on them).
    row_logits: list[torch.Tensor] | None = None
    # An embedding model's extend: per request, its pooled part of this forward [bs, hidden] float32
    # (model/pooler.py); next_token_logits is then empty ([bs, 0]) and nothing is sampled.
    embeddings: torch.Tensor | None = None


class ModelRunner:
    def __init__(self, config: ModelRunnerConfig):
        from radixlm.model.loader import load_model

        self.config = config
        self.device = torch.device(config.device)
        self.dtype = config.resolved_dtype()
        if self.device.type == "cpu":
            torch.set_num_threads(config.num_threads or host_threads())
        torch.manual_seed(config.random_seed)
        # --mem-fraction-static sizes the pool from what the weights leave (SGLang's before / after
        # reading).
        self._memory_before_load = (
            available_memory_bytes(self.device) if config.mem_fraction_static else 0
        )
        self.loaded = load_model(
            config.model_path,
            dtype=self.dtype,
            device=self.device,
            quantization=config.quantization,
            is_embedding=config.is_embedding,
            overrides=config.model_overrides,
        )
        if self.device.type == "cpu":  # after the load, whose own policy suits only its copies
            keep_freed_memory_in_heap()
        self.model = self.loaded.model
        # --is-embedding: pooled hidden states (a cross-encoder: its classifier's logits).
        self.pooler = Pooler.of(self.model, self.loaded.model_path) if config.is_embedding else None
        traits = self.model.traits()  # what the model is (model/traits.py)
        self.encoder_only = traits.encoder_only  # models/bert.py
        cfg = self.loaded.hf_config
        self.hf_config = cfg
        self.modalities = traits.modalities  # text, image
        # Qwen2-VL: three positions per token where images are (model/executor/mrope.py), built per
        # step.
        self.uses_mrope = any(isinstance(m, MRotaryEmbedding) for m in self.model.modules())
        if traits.encoder_cache is not None:  # its LRU of encoder outputs (model/mm_embed.py)
            traits.encoder_cache.max_bytes = config.mm_cache_size_mb * 2**20
        self.vocab_size = cfg.vocab_size
        self.num_layers = cfg.num_hidden_layers
        # a pipeline stage holds (and keeps KV for) its layers only: those its decoder stack built
        # (a family may split them its own way: Gemma 4's KV-sharing layers stay together)
        stack = decoder_stack_of(self.model)
        self.pp = stack.pp if stack is not None and stack.pp.size > 1 else pp_stage(self.num_layers)
        self.pp_micro_batches = self.pp_prefill_pieces = 0  # parts run (pp_micro.py)
        # This rank's KV heads (tensor parallelism splits or replicates them; all of them with tp
        # 1). (An MLA model's pool holds one latent per token instead: model/memory/kv_layout.py.)
        self.kv_layout = kv_layout(self.model, cfg)
        self.num_kv_heads, self.head_dim = self.kv_layout.num_kv_heads, self.kv_layout.head_dim
        # Per-layer attention features a backend must support (sliding windows, logit soft-capping,
        # attention sinks).
        self.attn_features = attention_features(self.model.modules())
        self.sliding_window_size, self.logit_cap = self.attn_features[:2]
        self.kv_dtype = self._kv_dtype()
        # A hybrid model's recurrent states (model/memory/state_memory.py; None: attention only):
        # its KV pool holds the full-attention layers only.
        self.state_memory = StateMemory.of(self.model, config, self.dtype)
        kv_layers = traits.num_kv_layers  # (0: a state-space model: the pool numbers slots only)
        self.num_kv_layers = self.num_layers if kv_layers is None else kv_layers
        self.attn_backend = create_attention_backend(
            config.attention_backend,
            self._attn_spec(self.kv_dtype),
            prefill=config.prefill_attention_backend,
            decode=config.decode_attention_backend,
        )
        self.bidirectional_images = traits.bidirectional_images  # Gemma 3 (models/gemma3_mm.py)
        if self.bidirectional_images and not self.attn_backend.supports_bidirectional_spans:
            raise ValueError(
                f"--attention-backend: {type(self.attn_backend).__name__} cannot let an image's"
                " tokens attend each other both ways (Gemma 3); use native (CPU) or torch"
            )
        # Sliding-window layers in their own, smaller slot space (None: one pool for all layers).
        self.swa_memory = SWAMemory.of(
            self.model,
            self.sliding_window_size,
            config.swa_full_tokens_ratio,
            config.swa_memory_off or model_refusal(self),
        )
        check_kv_shapes(self)
        self.max_total_num_tokens = self._kv_capacity()
        model_ctx = config.context_length or self.loaded.context_len
        # A lone request must always fit in the pool, so the context never exceeds it.
        self.context_len = min(model_ctx, self.max_total_num_tokens)
        self.max_running_requests = config.max_running_requests
        self.state_pool, self.linear_attn_backend = self._create_state_pool()
        self.req_to_token_pool = ReqToTokenPool(
            self.max_running_requests + 1, self.context_len + 4, device=self.device
        )
        self.token_to_kv_pool = (
            self.kv_layout.create_pool(
                self.max_total_num_tokens,
                self.num_kv_layers,
                self.kv_dtype,
                self.device,
                layers=self._kv_pool_layers(),
            )
            if self.swa_memory is None
            else self.swa_memory.create_pool(
                self.max_total_num_tokens,
                self.num_kv_layers,
                self.num_kv_heads,
                self.head_dim,
                self.kv_dtype,
                self.device,
                self.kv_layout.layer_shapes,
            )
        )
        self.sampler = Sampler()
        # Who reads the target's hidden states (an EAGLE draft head; NoHiddenCapture: nobody).
        self.hidden_capture: HiddenCapture = NoHiddenCapture()
        # --enable-lora: the adapters and their batched delta on the target layers (NoLoRA: none).
        self.lora = create_lora_runtime(config.lora, self.model, self.dtype, self.device)
        # Decode steps through graphs: CUDA graphs on CUDA (--disable-cuda-graph: none),
        # torch.compile on CPU with --enable-torch-compile (EagerDecode: none, or an encoder).
        self.decode_graphs = (
            EagerDecode("a hybrid model's state layers run eagerly")
            if self.state_pool is not None
            else EagerDecode("an encoder never decodes")
            if self.encoder_only
            else create_cuda_graphs(self, config)
            if self.device.type == "cuda"
            else create_decode_graphs(
                self, config.enable_torch_compile, config.torch_compile_max_bs
            )
        )
        logger.info(
            "KV cache: %d tokens, %.1f MiB (%s, %d layers x %d kv heads x %d dims)%s; context %d;"
            " attention: %r",
            self.max_total_num_tokens,
            self.token_to_kv_pool.total_bytes / 2**20,
            str(self.kv_dtype).replace("torch.", ""),
            self.num_kv_layers,
            self.num_kv_heads,
            self.head_dim,
            SWAMemory.describe(self.swa_memory, self.token_to_kv_pool),
            self.context_len,
            self.attn_backend,
        )
        logger.info(
            "model: %s",
            model_summary.summary(
                self.loaded.architecture,
                self.model,
                cfg,
                self.kv_layout,
                len(self._kv_pool_layers() or range(self.num_kv_layers)),
                self.kv_dtype,
            ),
        )

    def _attn_spec(self, kv_dtype: torch.dtype) -> AttentionBackendSpec:
        return AttentionBackendSpec(
            head_dim=self.head_dim,
            dtype=self.dtype,
            kv_dtype=kv_dtype,
            device=self.device,
            shared_prefix=not self.config.disable_shared_prefix_attention,
            mirror_bytes=self.config.decode_kv_mirror_bytes,
            sliding_window_size=self.sliding_window_size,
            logit_cap=self.logit_cap,
            sinks=self.attn_features.sinks,
            attention_chunk_size=self.attn_features.attention_chunk_size,
            mla=self.kv_layout.mla,
        )

    def _kv_dtype(self) -> torch.dtype:
        """auto: float16 where weights run in the native CPU formats (QuantMethod.float16_kv) and
        every attention backend in use reads float16 KV (the native kernels; llama.cpp's default KV
        type: decode attention reads half the bytes), else the model dtype (float32: the HF
        reference; FP8 weights keep it)."""
        cfg = self.config
        method = quant_method(self.loaded.quantization)  # None: float weights
        if cfg.kv_cache_dtype == "auto" and method is not None and method.float16_kv:
            try:
                resolve_attention_backends(
                    self._attn_spec(torch.float16),
                    cfg.attention_backend,
                    cfg.prefill_attention_backend,
                    cfg.decode_attention_backend,
                )
                return torch.float16
            except (
                ValueError
            ):  # a backend that needs the model dtype (the error, if any, comes below)
                pass
        return cfg.resolved_kv_cache_dtype()

    def _kv_capacity(self) -> int:
        # The stages' pools hold the same slots (the scheduler's slot indices are the same on every
        # stage), each sized by its own layers: the smallest count wins.
        return self.pp.agree_min(
            stage_kv_capacity(
                self.config,
                self._kv_bytes_per_token(),
                self.state_memory,
                self._memory_before_load,
                self.device,
            )
        )

    def _kv_bytes_per_token(self) -> int:
        if self.swa_memory is not None:
            memory, layout = self.swa_memory, self.kv_layout
            return memory.bytes_per_token(self.num_kv_layers, layout, self.kv_dtype)
        layers = self._kv_pool_layers()
        count = self.num_kv_layers if layers is None else len(layers)
        return self.kv_layout.bytes_per_token(count, self.kv_dtype)

    def _kv_pool_layers(self):
        """The KV layers this rank's pool holds (None: all): a stage's layers, or for a hybrid
        (its attention layers numbered among themselves) those its attention writes."""
        if self.state_memory is None:
            return self.pp.layers
        return held_kv_layers(self.model) if self.pp.size > 1 else None

    def _create_state_pool(self):
        """(the state pool, the recurrences' kernels), (None, None) without state layers; caps
        max_running_requests at what the pool holds."""
        if self.state_memory is None:
            return None, None
        from radixlm.model.layers.linear_attn import create_linear_attn_backend

        kv_bytes = self.max_total_num_tokens * self._kv_bytes_per_token()
        pool, self.max_running_requests = self.state_memory.create_pool(
            kv_bytes, self.max_running_requests, self.device, self.pp.agree_min
        )
        return pool, create_linear_attn_backend(self.config.linear_attn_backend, self.device)

    def prepare(self, b: ModelWorkerBatch) -> ForwardBatch:
        """The forward of a step: tensors on the device, the attention metadata and the sampler's
        tensors, built now (the scheduler calls it at launch, possibly while another step runs:
        the backend copies what it reads of the request rows)."""
        as_tensor = lambda xs: to_device(xs, torch.int64, self.device)
        extend = b.forward_mode.is_extend()
        fb = ForwardBatch(
            forward_mode=b.forward_mode,
            batch_size=b.batch_size,
            input_ids=as_tensor(b.input_ids),
            positions=as_tensor(b.positions),
            req_pool_indices=as_tensor(b.req_pool_indices),
            seq_lens=as_tensor(b.seq_lens),
            out_cache_loc=to_device(b.out_cache_loc, torch.int64, self.device),
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool,
            seq_lens_cpu=b.seq_lens,
            extend_prefix_lens_cpu=b.extend_prefix_lens if extend else None,
            extend_seq_lens_cpu=b.extend_seq_lens if extend else None,
            extend_logprob_start_lens_cpu=b.extend_logprob_start_lens if extend else None,
            num_decode=b.num_decode,
            attn_backend=self.attn_backend,
            lora_ids=b.lora_ids,
            mm_inputs=b.mm_inputs,
            mrope_positions=mrope_positions(b, self.device) if self.uses_mrope else None,
            tree_mask=b.tree_parents and TreeMask.from_parents(b.tree_parents, self.device),
            state_pool=self.state_pool,
            state_copies=b.state_copies,
            state_tracks=b.state_tracks,
            state_drafts=b.state_drafts,
            linear_attn_backend=self.linear_attn_backend,
        )
        if b.sampling:
            fb.sampling_info = SamplingBatchInfo.build(b.sampling, self.vocab_size, self.device)
        self.attn_backend.init_forward_metadata(fb)
        return fb

    def set_hidden_capture(self, capture: HiddenCapture) -> None:
        """Hand every forward's hidden states to `capture` from now on (and the residual stream
        entering its aux_layers: the model's decoder stack records them)."""
        decoder = decoder_stack_of(self.model)
        if capture.aux_layers:
            if not isinstance(decoder, DecoderStack):
                raise ValueError(
                    f"{self.loaded.architecture}: the hidden states of inner layers (EAGLE-3's"
                    " features) are recorded by a decoder stack, which this model has not"
                )
            bad = [i for i in capture.aux_layers if not 0 <= i < self.num_layers]
            if bad:
                raise ValueError(
                    f"aux hidden-state layers {bad} outside the target's {self.num_layers} layers"
                )
        if isinstance(decoder, DecoderStack):
            decoder.hidden_capture = capture
        self.hidden_capture = capture
        if not isinstance(capture, NoHiddenCapture) and not isinstance(
            self.decode_graphs, EagerDecode
        ):
            # A replayed graph returns logits only: every forward must run where the capture sees
            # it.
            logger.info("decode graphs off: the hidden states of every forward are read (EAGLE)")
            self.decode_graphs = EagerDecode("the hidden states of every forward are read")

    def reset_attention_state(self) -> None:
        """Forget what the attention backend keeps across steps (a forward failed half way)."""
        self.attn_backend.reset()

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch) -> LogitsOutput:
        if fb.state_copies:  # states that must be in place before the layers read them
            self.state_pool.apply_copies(fb.state_copies)
        if self.decode_graphs.can_run(fb):
            return LogitsOutput(next_token_logits=self.decode_graphs.forward(fb))
        self.lora.begin_forward(fb)
        if self.pp.size == 1:
            hidden = self.model.forward(fb.input_ids, fb.positions, fb)
            self.hidden_capture.on_forward(fb, hidden)
            return self._logits(fb, hidden)
        # Pipeline: the last stage's logits reach every stage, which then samples alike (the same
        # scheduler state and seeded generators everywhere, as in a tensor-parallel group).
        out = None
        try:
            out = self._pp_forward(fb)
        except Exception as e:
            if not self.pp.is_last:
                raise
            out = e
        return self.pp.from_last(out)

    def mm_info(self) -> dict:
        """A vision model's encoder counters (runs, images, cache hits) for the internal state."""
        cache = self.model.traits().encoder_cache
        return cache.info() if cache is not None else {}

    def pp_info(self) -> dict:
        if self.pp.size == 1:
            return {}
        return {
            "pp_micro_batches": self.pp_micro_batches,
            "pp_prefill_pieces": self.pp_prefill_pieces,
        }

    def _pp_forward(self, fb: ForwardBatch) -> LogitsOutput | None:
        """This stage's part of the step: the LogitsOutput on the last stage, None before it. A
        decode step or one request's prefill runs as parts following each other through the stages
        (pp_micro.py)."""
        parts = pp_micro.plan(fb, self.pp.size, self.config.pp_max_micro_batch_size)
        if parts is None:
            hidden = self.model.forward(fb.input_ids, fb.positions, fb)
            return self._logits(fb, hidden) if self.pp.is_last else None
        if fb.forward_mode.is_decode():
            self.pp_micro_batches += len(parts)
        else:
            self.pp_prefill_pieces += len(parts)
        hidden = []
        for mb in parts:
            self.attn_backend.init_forward_metadata(mb)
            hidden.append(self.model.forward(mb.input_ids, mb.positions, mb))
        if not self.pp.is_last:
            return None
        if fb.forward_mode.is_decode():
            return LogitsOutput(
                next_token_logits=self.model.compute_logits(torch.cat(hidden)).float()
            )
        return self._logits(parts[-1], hidden[-1])  # a prefill's pieces: the last token's logits

    def _logits(self, fb: ForwardBatch, hidden: torch.Tensor) -> LogitsOutput:
        if fb.forward_mode.is_decode():
            return LogitsOutput(next_token_logits=self.model.compute_logits(hidden).float())
        ext = fb.extend_seq_lens_cpu
        if self.pooler is not None:
            return LogitsOutput(
                next_token_logits=hidden.new_empty((fb.batch_size, 0), dtype=torch.float32),
                embeddings=self.pooler.partial(hidden, ext),
            )
        ends = torch.tensor(ext, dtype=torch.int64).cumsum(0) - 1
        starts = fb.extend_logprob_start_lens_cpu
        if not starts or all(s is None for s in starts):
            logits = self.model.compute_logits(
                hidden[to_device(ends, torch.int64, hidden.device)]
            ).float()
            return LogitsOutput(next_token_logits=logits)
        # Prompt logprobs: compute logits of every needed row in one matmul.
        rows, spans, offset = [], [], 0
        for i, n in enumerate(ext):
            first = n - 1 if starts[i] is None else starts[i] - fb.extend_prefix_lens_cpu[i]
            if not 0 <= first < n:
                raise ValueError(
                    f"logprob start {starts[i]} outside request {i}'s extend of {n} tokens "
                    f"after {fb.extend_prefix_lens_cpu[i]}"
                )
            rows.append(torch.arange(offset + first, offset + n))
            spans.append(n - first)
            offset += n
        rows = to_device(torch.cat(rows), torch.int64, hidden.device)
        logits = self.model.compute_logits(hidden[rows]).float()
        parts = list(torch.split(logits, spans))
        next_logits = torch.stack([p[-1] for p in parts])
        if fb.forward_mode.is_verify():
            return LogitsOutput(next_token_logits=next_logits, row_logits=parts)
        prompt = [
            None if starts[i] is None else torch.log_softmax(parts[i], dim=-1)
            for i in range(len(parts))
        ]
        return LogitsOutput(next_token_logits=next_logits, prompt_logprobs=prompt)

    def sample(self, fb: ForwardBatch, logits: torch.Tensor) -> torch.Tensor:
        """Next token ids [bs] from logits [bs, vocab] (raw, or grammar-masked) with fb's
        sampling."""
        if self.pooler is not None:  # an embedding model's prefill-only requests sample nothing
            return torch.zeros(fb.batch_size, dtype=torch.int64, device=logits.device)
        return self.sampler(logits, fb.sampling_info)
