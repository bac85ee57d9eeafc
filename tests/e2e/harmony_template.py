"""A compact harmony chat template (gpt-oss's chat_template.jinja, its structure without the
built-in tools) and a tiny random Llama that speaks it: SmolLM2's tokenizer with harmony's control
tokens added as special tokens, and gpt-oss's eos list (<|return|>, the tokenizer's eos, <|call|>)
in generation_config.json. The output format does not depend on the architecture."""

from __future__ import annotations

import torch

CONTROL_TOKENS = (
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
)

# system (Reasoning: effort), developer (instructions + the functions namespace), the messages
# (assistant tool calls as commentary messages to=functions.NAME ending in <|call|>, tool results
# from functions.NAME to=assistant), then the generation prompt <|start|>assistant.
HARMONY_TEMPLATE = r"""
{%- macro ts_type(p) -%}
{%- if p.type == "string" -%}{%- if p.enum is defined -%}"{{ p.enum | join('" | "') }}"
{%- else -%}string{%- endif -%}
{%- elif p.type in ["integer", "number"] -%}number
{%- elif p.type == "boolean" -%}boolean
{%- elif p.type == "array" -%}any[]
{%- else -%}any{%- endif -%}
{%- endmacro -%}
{%- set effort = reasoning_effort if reasoning_effort is defined and reasoning_effort
    else "medium" -%}
<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.
Knowledge cutoff: 2024-06

Reasoning: {{ effort }}

# Valid channels: analysis, commentary, final. Channel must be included for every message.
{% if tools %}
Calls to these tools must go to the commentary channel: 'functions'.
{%- endif -%}
<|end|>
{%- set ns = namespace(dev="", last_tool="") -%}
{%- if messages and messages[0].role in ["system", "developer"] -%}
{%- set ns.dev = messages[0].content -%}
{%- endif -%}
{%- if ns.dev or tools -%}
<|start|>developer<|message|>
{%- if ns.dev %}# Instructions

{{ ns.dev }}
{% endif -%}
{%- if tools %}
# Tools

## functions

namespace functions {
{% for t in tools -%}
{%- set f = t.function if t.function is defined else t %}
// {{ f.description | default("") }}
type {{ f.name }} = (_: {
{%- set params = f.parameters if f.parameters is defined and f.parameters else {} -%}
{%- for name, p in (params.properties | default({})).items() %}
{{ name }}{{ "" if name in (params.required | default([])) else "?" }}: {{ ts_type(p) }},
{%- endfor %}
}) => any;
{% endfor %}
} // namespace functions
{%- endif -%}
<|end|>
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == "user" -%}
<|start|>user<|message|>{{ m.content }}<|end|>
{%- elif m.role == "assistant" and m.tool_calls -%}
{%- if m.thinking is defined and m.thinking -%}
<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>
{%- endif -%}
{%- for c in m.tool_calls -%}
{%- set fn = c.function if c.function is defined else c -%}
{%- set ns.last_tool = fn.name -%}
<|start|>assistant to=functions.{{ fn.name }}<|channel|>commentary json<|message|>
{%- if fn.arguments is string %}{{ fn.arguments }}{% else %}{{ fn.arguments | tojson }}{% endif -%}
<|call|>
{%- endfor -%}
{%- elif m.role == "assistant" -%}
<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>
{%- elif m.role == "tool" -%}
<|start|>functions.{{ ns.last_tool }} to=assistant<|channel|>commentary<|message|>
{{- m.content }}<|end|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|start|>assistant
{%- endif -%}
""".strip()


def harmony_checkpoint(path: str, base_tokenizer_path: str) -> str:
    """A 2-layer random gpt-oss (a sliding layer of window 8, a full one; 4 experts, top 2; sinks
    drawn N(0, 1)) at path with the tokenizer of base_tokenizer_path plus harmony's control tokens,
    the template above, and eos ids [<|return|>, eos, <|call|>]."""
    from tokenizers import AddedToken
    from transformers import GptOssConfig, GptOssForCausalLM

    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(base_tokenizer_path)
    tok.add_tokens([AddedToken(t, special=True) for t in CONTROL_TOKENS], special_tokens=True)
    tok.chat_template = HARMONY_TEMPLATE
    ids = {t: tok.convert_tokens_to_ids(t) for t in CONTROL_TOKENS}
    cfg = GptOssConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
        initializer_range=0.25,
    )
    torch.manual_seed(0)
    model = GptOssForCausalLM(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_()
    # gpt-oss's generation_config.json: [200002 (<|return|>), 199999, 200012 (<|call|>)]
    model.generation_config.eos_token_id = [ids["<|return|>"], tok.eos_token_id, ids["<|call|>"]]
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
