"""SGLang's documented OpenAI-client snippets, copied as they are published (facts, not code of
ours): test_sglang_openai_snippets.py runs each through the official `openai` client against a
radixlm server, with only the server's address put in (the README's fixed port 30000; the docs'
`port` variable).

Sources:
- README: SGLang's README.md, "Backend: SGLang Runtime (SRT)" -> "OpenAI Compatible API" (the 2024
  releases, v0.2-v0.3), https://github.com/sgl-project/sglang/blob/main/README.md (history); the
  same `model="default"` calls as SGLang's own OpenAI-server tests. Split in its two calls; its
  third, text embedding, is left out (radixlm serves no embedding models).
- DOCS: "OpenAI APIs - Completions", https://docs.sglang.ai/basic_usage/openai_api_completions.html,
  from docs/basic_usage/openai_api_completions.ipynb at
  sgl-project/sglang@0c7e859d6a3afa2d1f2c03eb024b8823dbabbd78: its code cells in order (they share
  `client`, made by the first) and the `base-model:adapter-name` LoRA call of its "Using LoRA
  Adapters" section (radixlm serves no adapter yet: a 404 naming it). Left out: the reasoning
  examples (Qwen3 / DeepSeek-V3.1 with --reasoning-parser, not served) and the
  `extra_body={"lora_path": ...}` call (LoRA).
"""

from __future__ import annotations

from dataclasses import dataclass

README_URL = "https://github.com/sgl-project/sglang/blob/main/README.md (2024 history)"
DOCS_URL = "https://docs.sglang.ai/basic_usage/openai_api_completions.html"


@dataclass(frozen=True)
class Snippet:
    name: str
    source: str
    code: str


SNIPPETS = [
    Snippet(
        "readme-completion",
        README_URL,
        r"""import openai
client = openai.Client(
    base_url="http://127.0.0.1:30000/v1", api_key="EMPTY")

# Text completion
response = client.completions.create(
	model="default",
	prompt="The capital of France is",
	temperature=0,
	max_tokens=32,
)
print(response)
""",
    ),
    Snippet(
        "readme-chat",
        README_URL,
        r"""# Chat completion
response = client.chat.completions.create(
    model="default",
    messages=[
        {"role": "system", "content": "You are a helpful AI assistant"},
        {"role": "user", "content": "List 3 countries and their capitals."},
    ],
    temperature=0,
    max_tokens=64,
)
print(response)
""",
    ),
    Snippet(
        "docs-chat",
        DOCS_URL,
        r"""import openai

client = openai.Client(base_url=f"http://127.0.0.1:{port}/v1", api_key="None")

response = client.chat.completions.create(
    model="qwen/qwen2.5-0.5b-instruct",
    messages=[
        {"role": "user", "content": "List 3 countries and their capitals."},
    ],
    temperature=0,
    max_tokens=64,
)

print_highlight(f"Response: {response}")
""",
    ),
    Snippet(
        "docs-chat-logit-bias",
        DOCS_URL,
        r"""# Example with logit_bias parameter
# Note: You need to get the actual token IDs from your tokenizer
# For demonstration, we'll use some example token IDs
response = client.chat.completions.create(
    model="qwen/qwen2.5-0.5b-instruct",
    messages=[
        {"role": "user", "content": "Complete this sentence: The weather today is"}
    ],
    temperature=0.7,
    max_tokens=20,
    logit_bias={
        "12345": 50,  # Increase likelihood of token ID 12345
        "67890": -50,  # Decrease likelihood of token ID 67890
        "11111": 25,  # Slightly increase likelihood of token ID 11111
    },
)

print_highlight(f"Response with logit bias: {response.choices[0].message.content}")
""",
    ),
    Snippet(
        "docs-chat-parameters",
        DOCS_URL,
        r"""response = client.chat.completions.create(
    model="qwen/qwen2.5-0.5b-instruct",
    messages=[
        {
            "role": "system",
            "content": "You are a knowledgeable historian who provides concise responses.",
        },
        {"role": "user", "content": "Tell me about ancient Rome"},
        {
            "role": "assistant",
            "content": "Ancient Rome was a civilization centered in Italy.",
        },
        {"role": "user", "content": "What were their major achievements?"},
    ],
    temperature=0.3,  # Lower temperature for more focused responses
    max_tokens=128,  # Reasonable length for a concise response
    top_p=0.95,  # Slightly higher for better fluency
    presence_penalty=0.2,  # Mild penalty to avoid repetition
    frequency_penalty=0.2,  # Mild penalty for more natural language
    n=1,  # Single response is usually more stable
    seed=42,  # Keep for reproducibility
)

print_highlight(response.choices[0].message.content)
""",
    ),
    Snippet(
        "docs-chat-stream",
        DOCS_URL,
        r"""stream = client.chat.completions.create(
    model="qwen/qwen2.5-0.5b-instruct",
    messages=[{"role": "user", "content": "Say this is a test"}],
    stream=True,
)
for chunk in stream:
    if chunk.choices[0].delta.content is not None:
        print(chunk.choices[0].delta.content, end="")
""",
    ),
    Snippet(
        "docs-completion-logit-bias",
        DOCS_URL,
        r"""# Example with logit_bias parameter for completions API
# Note: You need to get the actual token IDs from your tokenizer
# For demonstration, we'll use some example token IDs
response = client.completions.create(
    model="qwen/qwen2.5-0.5b-instruct",
    prompt="The best programming language for AI is",
    temperature=0.7,
    max_tokens=20,
    logit_bias={
        "12345": 75,  # Strongly favor token ID 12345
        "67890": -100,  # Completely avoid token ID 67890
        "11111": -25,  # Slightly discourage token ID 11111
    },
)

print_highlight(f"Response with logit bias: {response.choices[0].text}")
""",
    ),
    Snippet(
        "docs-completion",
        DOCS_URL,
        r"""response = client.completions.create(
    model="qwen/qwen2.5-0.5b-instruct",
    prompt="List 3 countries and their capitals.",
    temperature=0,
    max_tokens=64,
    n=1,
    stop=None,
)

print_highlight(f"Response: {response}")
""",
    ),
    Snippet(
        "docs-completion-parameters",
        DOCS_URL,
        r"""response = client.completions.create(
    model="qwen/qwen2.5-0.5b-instruct",
    prompt="Write a short story about a space explorer.",
    temperature=0.7,  # Moderate temperature for creative writing
    max_tokens=150,  # Longer response for a story
    top_p=0.9,  # Balanced diversity in word choice
    stop=["\n\n", "THE END"],  # Multiple stop sequences
    presence_penalty=0.3,  # Encourage novel elements
    frequency_penalty=0.3,  # Reduce repetitive phrases
    n=1,  # Generate one completion
    seed=123,  # For reproducible results
)

print_highlight(f"Response: {response}")
""",
    ),
    Snippet(
        "docs-lora-model-adapter",
        DOCS_URL,
        r"""response = client.chat.completions.create(
    model="qwen/qwen2.5-0.5b-instruct:adapter_a",  # ← base-model:adapter-name
    messages=[{"role": "user", "content": "Convert to SQL: show all users"}],
    max_tokens=50,
)
""",
    ),
]

BY_NAME = {s.name: s for s in SNIPPETS}
