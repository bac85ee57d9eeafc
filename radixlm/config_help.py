"""Help texts of `radixlm serve`'s flags, by ServerArgs field (config.py adds a flag per field;
a field without an entry here has its comment in ServerArgs as its only documentation)."""

HELPS = {
    "model_path": (
        "HF directory, GGUF file or Hugging Face model id (org/name; a GGUF repo's file by its"
        " quant tag, org/name:Q4_K_M); default: the embedded SmolLM2-135M-Instruct"
    ),
    "revision": "the Hub model's version: a branch, tag or commit id (default: main)",
    "download_dir": "Hugging Face cache directory for Hub models (default: $HF_HUB_CACHE)",
    "speculative_draft_model_revision": "the Hub draft model's version (default: main)",
    "strict_model_name": (
        "answer 404 to a request whose `model` is neither the served model name nor its "
        "path (as vLLM); default: any name is served (as SGLang)"
    ),
    "dashboard_show_text": (
        "/dashboard shows token text in the radix tree and prompt heads in the recent "
        "requests (off by default: prompts are user data; counts and shapes only)"
    ),
    "max_total_tokens": "KV cache capacity in tokens",
    "kv_memory_gb": "KV cache budget in GiB when --max-total-tokens is not given",
    "chunked_prefill_size": "max new tokens of one request per extend step (-1: off)",
    "disable_radix_cache": "no prefix sharing (a baseline)",
    "enable_torch_compile": (
        "compile decode steps with torch.compile at start-up where the layers run in Python (CPU,"
        " the native attention backend; not where the fused native decoder op runs); batches are"
        " padded to the next compiled size; one log line says what was compiled or why not"
    ),
    "torch_compile_max_bs": (
        "largest decode batch --enable-torch-compile compiles (larger ones run eager)"
    ),
    "cuda_graph_max_bs": (
        "CUDA: largest decode batch captured as a CUDA graph (default: min(256,"
        " --max-running-requests)); a batch is padded up to the next captured size, larger ones run"
        " eager"
    ),
    "cuda_graph_bs": (
        "CUDA: the decode batch sizes captured as CUDA graphs (SGLang's flag; default: 1, 2, 4, 8,"
        " 12, then every 8 up to --cuda-graph-max-bs); sizes above --max-running-requests (or"
        " --cuda-graph-max-bs, if given) are left out"
    ),
    "disable_cuda_graph": "CUDA: run every decode step eagerly (no CUDA graphs)",
    "is_embedding": (
        "serve an embedding model: /v1/embeddings and /encode return its pooled, normalized final"
        " hidden states (pooling from its sentence-transformers config or GGUF, else last-token);"
        " the generation routes answer 400"
    ),
    "json_model_override_args": (
        "a JSON object merged into the model's config before it is built (vLLM's --hf-overrides);"
        ' e.g. \'{"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token":'
        ' ["no", "yes"], "is_original_qwen3_reranker": true}\' serves a Qwen3-Reranker on'
        " /v1/rerank"
    ),
    "quantization": (
        "weights: gguf (a GGUF's own quantization, its default), none (dequantize to --dtype, the"
        " default for other checkpoints), int8, q4_0, q8_0, q4_k (quantize at load), f16, bf16"
        " (16-bit weights): these run the native CPU kernels; fp8 (CUDA only: each linear layer's"
        " weight in FP8 with a scale per output row, bf16 activations, a Triton GEMM); awq, gptq,"
        " mxfp4 (a pre-quantized checkpoint's own 4- / 8-bit weights, or gpt-oss's MXFP4 experts,"
        " repacked for the native CPU kernels; its config.json's quantization_config selects them)"
    ),
    "kv_cache_dtype": (
        "KV cache element type (auto: float16 for quantized weights on the native CPU kernels, else"
        " the model dtype; int8 with per-token scales)"
    ),
    "attention_backend": (
        "native (the paged CPU kernel; default on CPU when the kernels build), triton (the "
        "paged Triton kernels; default on CUDA) or torch (SDPA)"
    ),
    "prefill_attention_backend": (
        "attention backend of extend-shaped batches (prefill, mixed, verify); "
        "default: --attention-backend"
    ),
    "max_mamba_cache_size": (
        "hybrid models: recurrent-state slots in all (one per running request, the rest keep prefix"
        " snapshots); default: --mamba-full-memory-ratio of the KV budget"
    ),
    "mamba_full_memory_ratio": (
        "hybrid models: state memory / KV memory, splitting the one budget (SGLang's default 0.9)"
    ),
    "mamba_ssm_dtype": "hybrid models: element type of the recurrent states (float32, bfloat16)",
    "linear_attn_backend": (
        "kernels of the recurrent layers: auto, native (CPU), triton (CUDA) or torch"
    ),
    "swa_full_tokens_ratio": (
        "models with sliding-window layers: their KV slots per full-attention KV slot (SGLang's"
        " default 0.8)"
    ),
    "disable_hybrid_swa_memory": (
        "keep every layer's KV in one pool, sliding-window layers included (windows stay a mask)"
    ),
    "mamba_track_interval": (
        "hybrid models: keep a state snapshot every N prompt tokens, so a prompt branching inside a"
        " cached one resumes near the branch"
    ),
    "decode_attention_backend": "attention backend of decode batches; default: --attention-backend",
    "speculative_algorithm": (
        "draft tokens to verify in one forward: ngram (prompt lookup over the request's own text),"
        " radix (continuations in the radix cache), draft-model (greedy decoding of"
        " --speculative-draft-model-path), eagle / eagle3 (an EAGLE / EAGLE-3 draft head on the"
        " target's hidden states; SGLang's EAGLE / EAGLE3), nextn (the model's own"
        " multi-token-prediction layer, SGLang's NEXTN); outputs stay those of plain decoding"
    ),
    "speculative_draft_model_path": (
        "draft-model: the draft model (HF directory or GGUF file), smaller than the target, with"
        " the same vocabulary; eagle / eagle3: the draft head's directory (config.json +"
        " safetensors in EAGLE's published layout; `radixlm train-eagle` writes one)"
    ),
    "speculative_token_map": (
        "eagle: a torch file of token ids (SGLang's FR-Spec token map): the head ranks "
        "these tokens only, a fraction of the LM head's cost per draft step"
    ),
    "speculative_draft_kv_tokens": (
        "draft-model: the draft model's KV pool in tokens (default: the target's KV capacity)"
    ),
    "speculative_num_draft_tokens": (
        "most draft tokens per request and step (a draft tree's nodes; default 64 for radix, "
        "16 for the others)"
    ),
    "speculative_eagle_topk": (
        "most children per node of a draft tree (1: chains; default 4 for ngram and radix, whose"
        " trees are the continuations recorded after the same context, and for eagle / eagle3, a"
        " head's top candidates; 1 for draft-model)"
    ),
    "speculative_num_steps": (
        "most levels of a draft tree below the request's last token (default 5 for eagle / "
        "eagle3, one head forward each; else --speculative-num-draft-tokens)"
    ),
    "speculative_draft_policy": (
        "adaptive: per step, each request's draft length that maximizes expected tokens per second"
        " (its recent acceptance, the measured cost of verify steps at this batch size); fixed:"
        " every draft the source has, up to the maximum (reproducible step shapes, for tests and"
        " comparisons)"
    ),
    "speculative_suffix_index_tokens": (
        "radix: tokens of recently finished requests' outputs kept to draft "
        "from where a request leaves the radix tree (0: off; about 1 KB of memory a token)"
    ),
    "dp_size": (
        "data parallelism: N servers, each on its share of the cores, behind the cache-aware router"
        " on --host/--port (one endpoint); the other options apply to each server. With"
        " --enable-dp-attention: N attention ranks inside one server instead"
    ),
    "enable_dp_attention": (
        "DP attention for MoE models (DeepSeek-V2/V3, ...): --dp-size N ranks (with --tp-size N)"
        " each serve their own requests with their own KV cache; the MoE layers gather every rank's"
        " tokens (--ep-size N: each rank holds 1/N of the experts)"
    ),
    "load_balance_method": (
        "DP attention: which rank a new request goes to: auto or cache_aware (the rank that was"
        " sent its prefix, else the least loaded), round_robin, total_requests, total_tokens"
    ),
    "restart_on_failure": (
        "when the scheduler or detokenizer process dies, start a new engine (in-flight "
        "requests fail with a 503) instead of exiting non-zero"
    ),
    "engine_failure_exit_delay": (
        "seconds the server keeps answering 503 after its engine died, before it exits"
    ),
    "watchdog_timeout": (
        "seconds the scheduler's (or detokenizer's) loop may go without completing an iteration"
        " while a request waits: then it counts as hung, /health answers 503, in-flight requests"
        " fail with a 503 and the engine is killed (restarted with --restart-on-failure, else the"
        " server exits)"
    ),
    "graceful_shutdown_timeout": (
        "on SIGTERM, seconds in-flight requests may take to finish before every "
        "process stops (new connections are refused at once)"
    ),
    "max_request_body_bytes": "larger request bodies are refused with 413",
    "api_key": (
        "clients must send Authorization: Bearer <key> (every route but /health); default "
        "$RADIXLM_API_KEY (the environment keeps it out of `ps`)"
    ),
    "admin_api_key": (
        "the operator's key, needed by admin actions (/flush_cache, aborting every request) and"
        " accepted everywhere; default $RADIXLM_ADMIN_API_KEY. Without it admin actions are"
        " refused, except with no key at all on a loopback address"
    ),
    "allowed_origins": (
        'browser origins (comma-separated, or a JSON list; "*": any) whose pages may call '
        "the server; other cross-origin browser requests are refused with 403"
    ),
    "max_n": "largest n (completions per prompt) a request may ask for",
    "max_top_logprobs_num": (
        "largest top_logprobs_num (OpenAI: logprobs / top_logprobs) a request may ask for"
    ),
    "max_client_batch_size": (
        "most sequences one request may start: its prompts (a batch) times n; "
        "beyond it a 400 (as TGI's flag, n counted)"
    ),
    "tokenizer_timeout": (
        "seconds one request's tokenization and chat template may take (they run off the "
        "event loop); beyond it a 504"
    ),
    "reasoning_parser": (
        "the reasoning model's think-block format (SGLang's names): thinking budgets"
        " (max_thinking_tokens), grammars that apply after the thinking, and the chat answer's"
        " reasoning_content"
    ),
    "disable_billing_header_normalization": (
        "send Claude Code's x-anthropic-billing-header line to the model as it came: its cch and"
        " version fingerprint change every request, so each turn re-prefills the whole prompt"
        " (default: those two values fixed, docs/agents.md)"
    ),
    "chat_template": (
        "the chat template: a Jinja file, SGLang's JSON conversation file, or a built-in name "
        "(chatml, gemma-it, llama-2, llama-4, mistral, vicuna_v1.1); default: the tokenizer's own"
    ),
    "tool_call_parser": (
        "how tool calls are read out of the chat output (SGLang's names); default: detected from"
        " the chat template, else hermes's <tool_call> format, described to the model in a system"
        " message"
    ),
    "slot_save_path": (
        "llama-server's flag: the directory where POST /slots/{id}?action=save writes a slot's"
        " cached prompt (token ids and KV) and action=restore reads it back; default: refused"
    ),
    "completion_template": (
        "the fill-in-the-middle tokens of completions' suffix and /infill: star_coder, qwen_coder,"
        " deepseek_coder, or SGLang's JSON file; default: found in the tokenizer by their spellings"
    ),
    "enable_hierarchical_cache": (
        "keep KV evicted from the pool in host memory (L2) and, with "
        "--hicache-storage-backend, on disk (L3), and load it back instead of recomputing"
    ),
    "hicache_ratio": (
        "L2 size as a multiple of the KV pool (when --hicache-size is 0); a hybrid model's host"
        " state snapshots: this multiple of its device snapshot slots"
    ),
    "hicache_size": (
        "L2 size in GiB (0: --hicache-ratio); a hybrid model splits it between KV and state"
        " snapshots as its device memory is split"
    ),
    "hicache_write_policy": (
        "when KV is copied down: write_through (at insert), write_through_selective "
        "(once a prefix is hit twice), write_back (at eviction)"
    ),
    "hicache_dtype": "L2/L3 element type (auto: float16 for a float32 KV pool, else the pool's)",
    "hicache_storage_backend": (
        "L3: file (chunks of KV in --hicache-storage-dir, kept across restarts)"
    ),
    "hicache_storage_dir": "the file backend's directory (default: $RADIXLM_CACHE_DIR/hicache)",
    "hicache_storage_size_gb": (
        "the file backend's size bound in GiB (least recently used chunks go; 0: none)"
    ),
    "hicache_storage_chunk_size": "tokens per stored chunk (a prefix is stored in whole chunks)",
    "hicache_storage_key": (
        "secret (16+ characters) that authenticates the stored chunks (HMAC-SHA256) and keys their"
        " file names; default: $RADIXLM_HICACHE_STORAGE_KEY, else a random key created 0600 in"
        " --hicache-storage-dir/.key (servers sharing the directory share it)"
    ),
    "hicache_storage_backend_extra_config": (
        "JSON object of the backend's settings (mooncake: master_server_address, metadata_server,"
        " protocol, device_name, local_hostname, global_segment_size, local_buffer_size), read"
        " before SGLANG_HICACHE_MOONCAKE_CONFIG_PATH's file and the MOONCAKE_* variables"
    ),
    "kv_events_config": (
        "publish the radix tree's KV events for cache-aware routers, SGLang's JSON: {\"publisher\":"
        ' "zmq", "endpoint": "tcp://*:5557", "topic": "", "replay_endpoint": null, "buffer_steps",'
        ' "hwm", "max_queue_size"} (docs/fleet.md, "KV events")'
    ),
    "enable_lora": (
        "serve LoRA adapters (peft format) on the base model: requests name theirs (/generate "
        "lora_path, OpenAI model BASE:ADAPTER); implied by --lora-paths"
    ),
    "lora_paths": (
        'adapters loaded at start: NAME=PATH, PATH, or JSON {"lora_name", "lora_path", "pinned"}'
    ),
    "max_loras_per_batch": (
        "distinct adapters in one batch, the base model counting as one (also the adapter slots)"
    ),
    "max_loaded_loras": "most adapters loaded at once (default: no limit)",
    "max_lora_rank": (
        "the adapter slots' rank (default: the largest of --lora-paths); larger ranks are refused"
    ),
    "lora_target_modules": (
        "projections adapters may target: q_proj k_proj v_proj o_proj gate_proj up_proj "
        "down_proj, qkv_proj, gate_up_proj or all (default: those of --lora-paths)"
    ),
    "lora_eviction_policy": (
        "which adapter leaves a full slot pool: lru or fifo (pinned ones never)"
    ),
    "lora_backend": (
        "SGLang's LoRA kernels (csgmv, triton, torch_native, ...): accepted; every one runs "
        "radixlm's segmented torch compute (one shrink and one expand per adapter and layer)"
    ),
    "enable_priority_scheduling": (
        "order the waiting queue by the requests' `priority` field (larger first); "
        "without it the field is ignored"
    ),
    "session_timeout": (
        "seconds a session (/open_session) may stay idle before it is closed and its pinned KV "
        "becomes evictable; also the most a session's own `timeout` may ask"
    ),
    "max_sessions": (
        "most open sessions in all (each pins its history's KV in the cache); beyond it a 429"
    ),
    "max_sessions_per_key": "most open sessions of one API key; beyond it a 429",
    "max_stored_responses": (
        "most /v1/responses kept for GET and previous_response_id (all keys; least "
        "recently used out first; 0: none kept)"
    ),
    "stored_response_ttl": "seconds a stored response is kept after its last use",
    "ep_size": (
        "expert parallelism for MoE models: 1 (every tp rank holds every expert) or --tp-size (each"
        " rank holds num_experts / N experts and computes them for all tokens, then an all-reduce)"
    ),
    "tp_size": (
        "tensor parallelism: N ranks (scheduler processes), each with 1/N of every layer and its "
        "share of the cores (--num-threads is per rank)"
    ),
    "nnodes": "hosts the tp ranks are spread over (each runs tp_size / nnodes ranks)",
    "node_rank": (
        "this host's index among --nnodes; hosts other than 0 run their ranks and no HTTP server"
    ),
    "dist_init_addr": (
        "HOST:PORT where the ranks meet (rank 0's host; the same on every node); default a "
        "free loopback port"
    ),
    "dist_timeout": "seconds the ranks' rendezvous or a collective may wait before it fails",
    "pp_size": (
        "pipeline parallelism: N stages (each a tp group of --tp-size ranks), each holding a "
        "contiguous range of layers and their KV; ranks = tp x pp"
    ),
    "pp_max_micro_batch_size": (
        "most requests in one pipeline micro-batch of a decode step (default: the "
        "step's requests in pp-size micro-batches)"
    ),
    "pp_layer_partition": (
        "layers per pipeline stage, comma separated, first stage first (e.g. 10,11,11; SGLang's"
        " SGLANG_PP_LAYER_PARTITION spelling); default: even, the remainder to the middle stages"
    ),
    "tp_allreduce_backend": (
        "how a tp group sums its partial outputs: gloo (torch.distributed), shm (shared "
        "memory, one host), nccl (CUDA); auto: nccl on CUDA, shm on one host, else gloo"
    ),
    "log_requests": (
        "log every request's metadata, inputs and outputs (as --log-requests-level says) to "
        "stdout, whatever --log-level; keys and cache_salt values are never logged"
    ),
    "log_requests_level": (
        "0: metadata; 1: also sampling params; 2: also inputs and outputs, each cut to "
        "2048 characters or ids; 3: everything"
    ),
    "log_requests_format": "text (SGLang's Receive: / Finish: lines) or json (one object per line)",
    "crash_dump_folder": (
        "when the engine dies, write the requests of the last 5 minutes (finished or "
        "running) to FOLDER/<hostname>/crash_dump_<time>.json (0600; no keys)"
    ),
    "mem_fraction_static": (
        "SGLang's: the KV pool gets the RAM available after the weights load less (1 - F) x the RAM"
        " available before (on CPU; split among this host's tp ranks); --max-total-tokens caps it"
    ),
    "schedule_conservativeness": (
        "SGLang's: scales --new-token-ratio and --min-new-token-ratio (at most 1); "
        "lower admits more requests, higher retracts fewer"
    ),
    "decode_kv_mirror_gb": (
        "memory for a dense copy of the decoding requests' KV (0: off; default 1 on CPU, 0 on CUDA)"
    ),
    "sampling_defaults": (
        "model: a request's unset temperature, top_p, top_k, min_p, repetition_penalty come from"
        " the model's generation_config.json (a GGUF: its general.sampling.* metadata); openai: the"
        " OpenAI defaults (temperature 1, top_p 1, no top-k) (SGLang's flag)"
    ),
    # Images in (docs/vision.md).
    "enable_multimodal": (
        "serve images where the architecture could also run text-only (SGLang's flag); "
        "vision-language architectures (LLaVA) take images without it"
    ),
    "mm_cache_size_mb": (
        "MiB of vision-encoder outputs kept by image hash (LRU): an image asked about again "
        "is not encoded again"
    ),
    "allowed_media_domains": (
        "hosts (and their subdomains) http(s) image URLs may point at; default none: "
        "only data: URLs and base64"
    ),
    "allowed_local_media_path": (
        "directory file:// image paths may point into (vLLM's flag); default none: "
        "a request cannot read the server's files"
    ),
    "media_url_max_file_size_mb": "largest image file a request may give (any source), in MiB",
    "media_url_timeout": "seconds an image download may take",
    "max_image_pixels": (
        "largest image (width x height) decoded; more is refused as a decompression bomb"
    ),
    # PD disaggregation (docs/disaggregation.md).
    "disaggregation_mode": (
        "PD disaggregation: null (one server does both), prefill (runs prompts and sends their KV;"
        " runs the bootstrap service) or decode (receives the KV into slots it reserved, then"
        " decodes); behind `radixlm router --pd-disaggregation`"
    ),
    "disaggregation_transfer_backend": (
        "how KV moves: tcp (ZMQ, per layer), shm (the decode server's KV pool in "
        "shared memory, written at its slots; same host, CPU) or fake (nothing moves: warm-up)"
    ),
    "disaggregation_bootstrap_port": (
        "prefill: the port of the bootstrap service where its ranks register and "
        "decode servers find them"
    ),
    "num_reserved_decode_tokens": (
        "decode: KV tokens kept free per request for its outputs when slots are "
        "reserved for an arriving prompt"
    ),
    "disaggregation_bootstrap_timeout": (
        "seconds a request may wait for its peer (prefill: the decode side's "
        "slots; decode: the prefill server's bootstrap and KV room) before it fails with a 5xx"
    ),
    "disaggregation_waiting_timeout": (
        "seconds a transfer may take once started (prefill: until the decode side acknowledges;"
        " decode: until the KV arrived) before both sides free its slots and it fails"
    ),
    "disaggregation_debug_checksum": (
        "debug: SHA-256 of every transfer's KV on both sides (compared on the "
        "decode side; both in /get_server_info)"
    ),
}
