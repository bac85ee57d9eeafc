"""Images in: time to first token for one image (a new image; the same image after the radix cache
was flushed, so only the encoder cache saves work; the same image with its span cached), and
throughput of 8 concurrent requests sharing one image (the encoder runs once for all of them).

    python benchmarks/vision.py --size tiny                 # a 2-layer CLIP at 32 px: a check only
    python benchmarks/vision.py --size llava-1.5            # LLaVA-1.5's CLIP ViT-L/14 at 336 px (576
                                                            # image tokens), SmolLM2-135M's decoder shape
    python benchmarks/vision.py --size qwen2-vl-tiny        # a 2-layer Qwen2-VL ViT: a check only
    python benchmarks/vision.py --size qwen2-vl-2b          # Qwen2-VL-2B's ViT at 336x336 (144 image
                                                            # tokens), SmolLM2-135M's decoder shape, M-RoPE

Random weights (written with transformers, the tokenizer of the default model); the server is a
real `radixlm serve`. Run it on an otherwise idle machine; the figures go to docs/benchmarks.md.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import requests  # noqa: E402 (after the sys.path insert above)

from radixlm.server.process import ServerProcess  # noqa: E402 (after the sys.path insert above)
from tests.vision.checkpoints import png_bytes, write_tiny_llava, write_tiny_qwen2vl  # noqa: E402 (after the sys.path insert above)

SMOLLM2_DECODER = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=4096,
)
# Per size: the checkpoint writer, the side of the square test images (px), the writer's arguments.
SIZES = {
    "tiny": dict(write=write_tiny_llava, px=52, image_size=32, patch=8),
    "llava-1.5": dict(
        write=write_tiny_llava,
        px=356,
        image_size=336,
        patch=14,
        vision=dict(
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=24,
            num_attention_heads=16,
            projection_dim=768,
        ),
        text=SMOLLM2_DECODER,
    ),
    "qwen2-vl-tiny": dict(write=write_tiny_qwen2vl, px=40),
    # Qwen2-VL-2B's ViT (32 blocks of 1280, patch 14, 2x2 merge) at 336x336 (12x12 = 144 image
    # tokens), SmolLM2-135M's decoder shape with M-RoPE (mrope_section scaled to its 64-dim heads).
    "qwen2-vl-2b": dict(
        write=write_tiny_qwen2vl,
        px=336,
        max_pixels=336 * 336,
        vision=dict(depth=32, embed_dim=1280, num_heads=16, mlp_ratio=4, patch_size=14),
        text=dict(
            SMOLLM2_DECODER,
            rope_parameters={
                "rope_type": "default",
                "mrope_section": [8, 12, 12],
                "rope_theta": 10000.0,
            },
        ),
    ),
}


def data_url(seed: int, px: int) -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(png_bytes(seed, (px, px))).decode()


def chat_ttft(url: str, image: str, max_tokens: int) -> tuple[float, dict]:
    body = {
        "model": "m",
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": image}},
                    {"type": "text", "text": "Describe the picture."},
                ],
            }
        ],
    }
    t0 = time.perf_counter()
    ttft, usage = None, {}
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ttft is None and ev.get("choices") and ev["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - t0
            usage = ev.get("usage") or usage
    return ttft, usage


def encoder(url: str) -> dict:
    state = requests.get(url + "/get_server_info", timeout=60).json()["internal_state"]
    return {k: v for k, v in state.items() if k.startswith("mm_")}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--server-args", default="", help="more `radixlm serve` flags, space-separated")
    args = ap.parse_args()
    from radixlm.model.loader import default_model_path, load_tokenizer

    spec = dict(SIZES[args.size])
    write, px = spec.pop("write"), spec.pop("px")
    with tempfile.TemporaryDirectory() as tmp:
        load_tokenizer(default_model_path()).save_pretrained(tmp + "/tok")
        model = write(tmp + "/model", tmp + "/tok", **spec)
        server = ServerProcess("--model-path", model, *args.server_args.split(), timeout=600)
        try:
            url, res = server.url, {"size": args.size}
            chat_ttft(url, data_url(10_000, px), 2)  # warm-up
            new, enc_hit, radix_hit = [], [], []
            for i in range(args.repeats):
                img = data_url(i, px)
                requests.post(url + "/flush_cache", timeout=60)
                new.append(chat_ttft(url, img, 1)[0])  # a new image: encode + prefill
                requests.post(url + "/flush_cache", timeout=60)
                enc_hit.append(chat_ttft(url, img, 1)[0])  # encoder cache hit, prefill again
                t, usage = chat_ttft(url, img, 1)  # the span is in the radix cache
                radix_hit.append(t)
            res["ttft_new_image_s"] = statistics.median(new)
            res["ttft_encoder_cache_hit_s"] = statistics.median(enc_hit)
            res["ttft_radix_hit_s"] = statistics.median(radix_hit)
            res["radix_hit_cached_tokens"] = usage.get("prompt_tokens_details", {}).get(
                "cached_tokens"
            )
            requests.post(url + "/flush_cache", timeout=60)
            shared, before = data_url(20_000, px), encoder(url)
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                outs = list(
                    pool.map(
                        lambda _: chat_ttft(url, shared, args.max_tokens), range(args.concurrency)
                    )
                )
            wall = time.perf_counter() - t0
            after = encoder(url)
            res["concurrent_requests"] = args.concurrency
            res["concurrent_output_tok_per_s"] = (
                sum(u.get("completion_tokens", 0) for _, u in outs) / wall
            )
            res["concurrent_median_ttft_s"] = statistics.median(t for t, _ in outs)
            res["concurrent_images_encoded"] = (
                after["mm_images_encoded"] - before["mm_images_encoded"]
            )
            print(json.dumps(res, indent=1))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
