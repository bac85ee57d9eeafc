"""The cases of the default run's larger matrices that move to the extended tier (`pytest -m
extended`), each with why its representatives suffice. The tests themselves stay as they are;
conftest.py marks these by node id before `-m` deselects. What decided the list: CI's budget (30
minutes) on an AVX2-only 2-core machine, where the default run took 37 minutes (tests/README.md,
Durations), and which cases repeat a code path another default case already runs.

A key is a node id, or a node id without its parameters (every case of that test)."""

from __future__ import annotations

_PP = "the pipeline split is the same for every family past its layer kinds: qwen3_5 (gated delta"
_PP += " + attention), qwen3-moe (MoE), deepseek-v2 (MLA), gemma2 (windows), nemotron-h (Mamba-2)"
_PP += " and falcon-h1 (parallel hybrid) stay"
_Q8 = "the Q8_0 kernels are every family's; this family's GGUF names and layout are proven by its"
_Q8 += " float GGUF test, which stays"
_RADIX = "plain grouped-query attention: the radix cache's exactness over it is tested by the"
_RADIX += " default model's and the windowed / latent families' cases"
_SPEC = "the same drafter and verifier on another tiny family: one family per drafter stays"

EXTENDED: dict[str, str] = {
    **{
        f"tests/distributed/test_pp_families.py::test_pp2_gives_hf_greedy[{f}]": _PP
        for f in (
            "lfm2",
            "kimi-linear",
            "gpt-oss",
            "qwen3-next",
            "qwen3_5-moe",
            "olmo3",
            "glm4-moe",
            "nemotron-h-moe",
            "granite-4.0-h",
            "gemma4",
            "gemma4-moe",
            "gemma3n",
        )
    },
    # 32 s: test_serve_dp_two_is_one_endpoint (it stays) serves --dp 2 --tp-size 2 and asserts
    # this test's checks (a TP group per replica, requests spread, TP=1's greedy tokens)
    "tests/distributed/test_tp_serving.py::test_dp2_tp2_router_sees_one_worker_per_replica": (
        "tests/router/test_dp.py serves --dp 2 --tp-size 2 with these checks"
    ),
    # 47 s: the hostile soak (which stays) runs the same workload with attackers alongside and
    # asserts every check of this one on it
    "tests/e2e/test_soak.py::test_soak_tiny": (
        "test_hostile_soak_tiny runs this workload (overloaded pool, every kind, disconnects,"
        " greedy replay) with attackers alongside and asserts every one of its checks"
    ),
    # 120 s on a 2-core machine (two default-model engines, one at TP=3): the same options over
    # TP run on the tiny Llama at TP=2 (its case stays), and the default model's TP=3 sharding is
    # compared with TP=1 in test_tp_models.py (its quantized case stays)
    "tests/distributed/test_tp_engine.py::test_tp_matches_tp1[default-3]": (
        "the engine's options over TP are the tiny Llama's TP=2 case; the default model's TP=3"
        " sharding is test_tp_models.py's quantized case"
    ),
    # 75 s on a 2-core machine: Zamba2's own path (a later stage embedding the tokens for its
    # shared blocks) is short beside the pipeline split falcon-h1 and nemotron-h keep in the run
    "tests/distributed/test_pp_families.py::test_pp2_gives_hf_greedy[zamba2]": _PP,
    **{
        f"tests/{path}::test_q8_0_gguf_agrees_with_hf_top1": _Q8
        for path in (
            "hybrid/test_falcon_h1.py",
            "hybrid/test_nemotron_h_moe.py",
            "hybrid/test_granite_hybrid.py",
            "hybrid/test_kimi_linear.py",
            "model/test_hunyuan_moe.py",
            "model/test_dots1.py",
            "model/test_bamba.py",
            "model/test_jamba.py",
            "model/test_minimax_m2.py",
            "model/test_cohere2.py",
            "model/test_gemma3n.py",
        )
    },
    **{
        f"tests/hybrid/test_hybrid_gguf.py::test_q8_0_gguf_agrees_with_hf_top1[{f}]": _Q8
        for f in ("qwen35moe", "qwen3next", "lfm2moe")
    },
    **{
        f"tests/model/{path}::test_radix_cache_stays_exact": _RADIX
        for path in (
            "test_hunyuan.py",
            "test_hunyuan_moe.py",
            "test_dots1.py",
            "test_seed_oss.py",
            "test_ernie4_5.py",
            "test_ernie4_5_moe.py",
            "test_minimax_m2.py",
            "test_ministral3.py",
        )
    },
    "tests/model/test_arcee.py::test_radix_cache_stays_exact[apertus]": _RADIX,
    **{
        "tests/speculative/test_spec_engine.py::"
        f"test_greedy_outputs_equal_plain_decoding[{c}]": _SPEC
        for c in ("ngram-qwen2-16", "radix-qwen3-16", "ngram-qwen3-16")
    },
    "tests/speculative/test_spec_engine.py::test_default_model_greedy_equal[ngram]": (
        "n-gram drafting on the default model: the radix drafter's case runs the same verifier"
        " there, and n-gram drafts stay on the tiny families"
    ),
    "tests/distributed/test_tp_models.py::test_tp_greedy_and_logits_match_tp1[2]": (
        "TP=3 splits the heads unevenly and stays; TP=2 is the even split of test_tp_serving.py"
    ),
    "tests/distributed/test_moe_ep.py::test_ep_greedy_and_logits_match_single_process[1]": (
        "expert parallelism over 2 ranks stays"
    ),
    **{
        f"tests/bench/test_make_random_gguf.py::test_tiny_file_loads[{c}]": (
            "the writer's other types: the Q4_0 cases stay, and the f16 / Q8_0 writers are the"
            " gguf library's, loaded by every family's GGUF tests"
        )
        for c in ("tiny-f16", "tiny-q8_0")
    },
    **{
        f"tests/bench/test_make_random_gguf.py::{t}": (
            "the benchmark writer's larger shapes: the families' own GGUF tests load such files"
            " (tests/model/test_gpt_oss_mxfp4.py, test_gemma4.py)"
        )
        for t in ("test_tiny_gpt_oss_file_loads_with_mxfp4_experts", "test_tiny_gemma4_file_loads")
    },
    "tests/e2e/test_default_model_greedy.py::test_default_engine_variants[no-radix-cache]": (
        "the cache-off scheduler runs in tests/engine/test_engine_tiny.py, test_randomized.py and"
        " test_regressions.py; chunked prefill on the default model stays"
    ),
    "tests/engine/test_policies_and_processes.py::test_no_orphan_processes[exit]": (
        "a normal exit: every test's engine ends so; SIGKILL and SIGINT stay"
    ),
    "tests/kernels/test_fallback_and_quality.py::test_default_model_low_bit_kv_quality"
    "[int8-0.02]": (
        "int4 KV (the tighter case for quality) stays; int8 KV's exactness after a restore is in"
        " tests/scheduler/test_hicache.py"
    ),
    "tests/scheduler/test_randomized.py::test_randomized_scheduler_speculative[ngram]": (
        "the randomized scheduler with the radix drafter stays: the same verify and retraction"
        " paths"
    ),
    "tests/speculative/test_grammar_drafts.py::"
    "test_constrained_requests_draft_and_equal_plain_decoding[ngram]": (
        "grammar-constrained drafts from the radix drafter stay: the same constrained verifier"
    ),
    **{
        f"tests/triton/test_attention_kernels.py::{t}[{c}]": (
            "the interpreter runs the same kernel: every shape in one dtype, every dtype in one"
            " shape stay"
        )
        for t in (
            "test_decode_split_kv_with_shared_prefixes",
            "test_extend_over_a_prefix_in_the_pool",
        )
        for c in ("2-2-dtype1", "2-2-dtype2", "8-1-dtype1", "8-1-dtype2")
    },
    **{
        f"tests/speculative/{path}::{t}[eagle3]": (
            "EAGLE-3's head drafting exactly as ranked stays (test_eagle_source's"
            " test_drafts_equal_the_heads_own_ranking_from_scratch); the verify path is EAGLE's"
        )
        for path, t in (
            ("test_eagle_default_model.py", "test_random_heads_keep_greedy_outputs"),
            ("test_eagle_source.py", "test_engine_greedy_outputs_equal_plain_decoding"),
        )
    },
    **{
        f"tests/hybrid/test_hybrid_engine.py::test_prefix_reuse_ends_at_state_snapshots[{f}]": (
            "the snapshot rule is the state pool's: qwen35, nemotron_h, kimi-linear and lfm2 stay"
        )
        for f in ("qwen3next", "qwen35moe", "lfm2moe")
    },
    **{
        "tests/scheduler/test_hicache.py::"
        f"test_restored_prefix_equals_recompute_every_kv_dtype[{c}]": (
            "one KV dtype per storage width: float32, int4 and the lossy float32 case stay"
        )
        for c in ("int8-auto-0.0001", "bfloat16-auto-0.0001", "float16-auto-0.0001")
    },
    "tests/scheduler/test_hicache.py::test_eviction_pressure_and_chunked_prefill"
    "[write_through_selective]": "write-through and write-back stay",
    "tests/e2e/test_sglang_launch_commands.py::test_sglang_launch_command"
    "[--enable-torch-compile]": (
        "compiling on the CPU is most of this case's time: compiled decode equals eager in"
        " tests/engine/test_torch_compile.py, and the flag's parsing is the flag table's, checked"
        " for every flag by tests/unit/test_sglang_flags.py"
    ),
    **{
        f"tests/vision/test_internvl_onevision_server.py::{t}[{f}]": (
            "the chat route's images are the same code for every LLaVA-style family: InternVL's and"
            " OneVision's server cases stay; the family's HF comparison runs through the Engine in"
            " its own file"
        )
        for t in (
            "test_chat_with_images_matches_hf",
            "test_repeated_image_is_encoded_once",
            "test_malformed_image_is_a_400_naming_the_field",
            "test_video_is_refused",
        )
        for f in ("kimi_k25", "lfm2vl")
    },
    **{
        f"tests/vision/{path}::{t}[whole{c}]": (
            "the same prompts prefilled whole: the chunked cases (chunks of 8, cut through the"
            " images) stay, and whole-prompt prefill is every family's"
        )
        for path, t, cases in (
            (
                "test_kimi_k25.py",
                "test_greedy_and_logprobs_match_hf",
                ("-text", "-one-image", "-two-images"),
            ),
            (
                "test_lfm2_vl_vs_hf.py",
                "test_greedy_and_logprobs_match_hf",
                ("-text", "-one-image", "-two-images"),
            ),
            ("test_kimi_k25.py", "test_text_alone_and_batched", ("",)),
            ("test_kimi_k25.py", "test_text_second_turn_from_the_radix_cache", ("",)),
            ("test_lfm2_vl_vs_hf.py", "test_text_batched_and_second_turn_from_the_cache", ("",)),
        )
        for c in cases
    },
    **{
        "tests/vision/test_glm4v_vs_hf.py::test_greedy_and_logprobs_match_hf_and_the_cache_serves"
        f"_the_images[glm46v-{c}]": (
            "GLM-4.6V's dense text is GLM-4.1V's decoder and tower: its processor stays (the"
            " text-only case) and GLM-4.6V over the MoE decoder has its own test"
        )
        for c in ("one", "two-sizes", "same-twice")
    },
    **{
        f"tests/vision/test_vision_pp.py::test_qwen_vl_pp2_matches_hf[{f}]": (
            "the vision tower on the first stage is the same for every Qwen-VL; qwen35vl stays"
        )
        for f in ("qwen2vl", "qwen3vl")
    },
}


def extended_reason(nodeid: str) -> str | None:
    return EXTENDED.get(nodeid) or EXTENDED.get(nodeid.split("[", 1)[0])
