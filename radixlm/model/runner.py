"""ModelRunner: owns the model, the KV pools and the sampler; runs one ForwardBatch."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional

import torch

from radixlm.cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.config import ServerArgs
from radixlm.model.forward_batch import ForwardBatch
from radixlm.model.layers.sampler import Sampler, SamplingBatchInfo
from radixlm.utils import keep_freed_memory_in_heap

logger = logging.getLogger(__name__)


@dataclass
class LogitsOutput:
    # [bs, vocab] float32: logits predicting each request's next token.
    next_token_logits: torch.Tensor
    # Extend with prompt logprobs: per request, [rows, vocab] log-softmax for positions
    # extend_logprob_start_lens_cpu[i] .. end-1 (the last row equals next_token_logits'); else None.
    prompt_logprobs: Optional[list[Optional[torch.Tensor]]] = None
    # TARGET_VERIFY: per request, [1 + drafts, vocab] raw logits (the verifier picks tokens from
    # them exactly as decoding picks from next_token_logits; no log-softmax is spent on them).
    row_logits: Optional[list[torch.Tensor]] = None


class ModelRunner:
    def __init__(self, server_args: ServerArgs):
        from radixlm.model.loader import load_model

        self.server_args = server_args
        self.device = torch.device(server_args.device)
        self.dtype = server_args.resolved_dtype()
        if self.device.type == "cpu":
            torch.set_num_threads(server_args.num_threads or os.cpu_count() or 1)
            keep_freed_memory_in_heap()
        torch.manual_seed(server_args.random_seed)
        self.loaded = load_model(server_args.model_path, dtype=self.dtype, device=self.device,
                                 quantization=server_args.quantization)
        self.model = self.loaded.model
        cfg = self.loaded.hf_config
        self.hf_config = cfg
        self.vocab_size = cfg.vocab_size
        self.num_layers = cfg.num_hidden_layers
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.kv_dtype = self._kv_dtype()
        self.attn_backend = self._make_attn_backend()
        self.max_total_num_tokens = self._kv_capacity()
        model_ctx = server_args.context_length or self.loaded.context_len
        # A lone request must always fit in the pool, so the context never exceeds it.
        self.context_len = min(model_ctx, self.max_total_num_tokens)
        self.max_running_requests = server_args.max_running_requests
        self.req_to_token_pool = ReqToTokenPool(
            self.max_running_requests + 1, self.context_len + 4, device=self.device
        )
        self.token_to_kv_pool = TokenToKVPool(
            self.max_total_num_tokens, self.num_layers, self.num_kv_heads, self.head_dim, self.kv_dtype, self.device
        )
        self.sampler = Sampler()
        logger.info(
            "KV cache: %d tokens, %.1f MiB (%s, %d layers x %d kv heads x %d dims); context %d; attention: %s",
            self.max_total_num_tokens,
            self.token_to_kv_pool.total_bytes / 2**20,
            str(self.kv_dtype).replace("torch.", ""),
            self.num_layers,
            self.num_kv_heads,
            self.head_dim,
            self.context_len,
            type(self.attn_backend).__name__,
        )

    def _kv_dtype(self):
        """auto: float16 where quantized weights run the native kernels (llama.cpp's default KV type;
        decode attention reads half the bytes), else the model dtype (float32: the HF reference)."""
        from radixlm.model.layers.native_attention import native_attention_supported

        args = self.server_args
        if (args.kv_cache_dtype == "auto" and self.loaded.quantization != "none" and args.attention_backend != "torch"
                and native_attention_supported(self.head_dim, self.dtype, self.device)[0]):
            return torch.float16
        return args.resolved_kv_cache_dtype()

    def _make_attn_backend(self):
        from radixlm.model.layers.attention import TorchSDPABackend
        from radixlm.model.layers.native_attention import NativeCPUBackend, native_attention_supported

        args = self.server_args
        ok, why = native_attention_supported(self.head_dim, self.dtype, self.device)
        if args.attention_backend == "native" and not ok:
            raise ValueError(f"attention_backend native: {why}")
        if ok and args.attention_backend != "torch":
            return NativeCPUBackend()
        if self.kv_dtype != self.dtype:
            raise ValueError(f"kv_cache_dtype {args.kv_cache_dtype} differs from the model dtype and needs the native "
                             f"attention backend ({why or 'attention_backend is torch'})")
        return TorchSDPABackend(shared_prefix=not args.disable_shared_prefix_attention,
                                mirror_bytes=args.decode_kv_mirror_bytes)

    def _kv_capacity(self) -> int:
        if self.server_args.max_total_tokens:
            return self.server_args.max_total_tokens
        per_token = TokenToKVPool.bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, self.kv_dtype)
        return max(256, int(self.server_args.kv_memory_gb * 2**30 // per_token))

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        """Attention metadata for fb, built now (the scheduler does it at launch)."""
        fb.attn_backend = self.attn_backend
        self.attn_backend.init_forward_metadata(fb)

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch) -> LogitsOutput:
        fb.attn_backend = self.attn_backend
        hidden = self.model.forward(fb.input_ids, fb.positions, fb)
        if fb.forward_mode.is_decode():
            return LogitsOutput(next_token_logits=self.model.compute_logits(hidden).float())
        ext = fb.extend_seq_lens_cpu
        ends = torch.tensor(ext, dtype=torch.int64).cumsum(0) - 1
        starts = fb.extend_logprob_start_lens_cpu
        if not starts or all(s is None for s in starts):
            logits = self.model.compute_logits(hidden[ends.to(hidden.device)]).float()
            return LogitsOutput(next_token_logits=logits)
        # Prompt logprobs: compute logits of every needed row in one matmul.
        rows, spans, offset = [], [], 0
        for i, n in enumerate(ext):
            first = n - 1 if starts[i] is None else starts[i] - fb.extend_prefix_lens_cpu[i]
            if not 0 <= first < n:
                raise ValueError(f"logprob start {starts[i]} outside request {i}'s extend of {n} tokens "
                                 f"after {fb.extend_prefix_lens_cpu[i]}")
            rows.append(torch.arange(offset + first, offset + n))
            spans.append(n - first)
            offset += n
        logits = self.model.compute_logits(hidden[torch.cat(rows).to(hidden.device)]).float()
        parts = list(torch.split(logits, spans))
        next_logits = torch.stack([p[-1] for p in parts])
        if fb.forward_mode.is_verify():
            return LogitsOutput(next_token_logits=next_logits, row_logits=parts)
        prompt = [
            None if starts[i] is None else torch.log_softmax(parts[i], dim=-1) for i in range(len(parts))
        ]
        return LogitsOutput(next_token_logits=next_logits, prompt_logprobs=prompt)

    def sample(self, logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        return self.sampler(logits, info)
