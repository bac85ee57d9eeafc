"""--reasoning-parser qwen3 on the chat route: the think block as `reasoning_content`, the rest as
`content`, streamed (`delta.reasoning_content`) and not, through the `openai` client.

The model is a tiny random Llama (SmolLM2's tokenizer) taught, in a few hundred optimizer steps,
to answer one chat prompt with a think block, served with a Qwen3-Thinking-style template whose
generation prompt opens <think> (so the output starts inside the block). The reference is HF
transformers' greedy output of the same model, split where it writes </think>."""

import openai
import pytest
import torch

from radixlm.server.process import ServerProcess

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
MESSAGES = [{"role": "user", "content": "Is the sky blue?"}]
TAUGHT = "The sky scatters blue light.\n</think>\n\nYes, it is blue."


@pytest.fixture(scope="module")
def thinker(tmp_path_factory, default_model_path):
    """(model dir, template file, HF greedy output text) of the taught tiny model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from radixlm.model.loader import load_tokenizer

    path = tmp_path_factory.mktemp("tiny-thinker")
    tok = load_tokenizer(default_model_path)
    tok.chat_template = TEMPLATE
    prompt = tok.encode(
        tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )
    target = tok.encode(TAUGHT, add_special_tokens=False) + [2]  # then <|im_end|>, the model's eos
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    ids = torch.tensor([prompt + target])
    labels = torch.tensor([[-100] * len(prompt) + target])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only wait on each other
    try:
        for _ in range(400):  # until every target token wins by a clear margin (~80 steps)
            opt.zero_grad()
            out = model(input_ids=ids, labels=labels)
            out.loss.backward()
            opt.step()
            top2 = out.logits[0, len(prompt) - 1 : -1].topk(2, -1)
            if (top2.indices[:, 0] == torch.tensor(target)).all() and (
                top2.values[:, 0] - top2.values[:, 1]
            ).min() > 3:
                break
    finally:
        torch.set_num_threads(threads)
    model.eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=len(target) + 8, do_sample=False
        )
    text = tok.decode(out[0, len(prompt) :], skip_special_tokens=True)
    assert "</think>" in text, text  # taught: else the split below would not be exercised
    model.save_pretrained(path)
    tok.save_pretrained(path)
    template = path / "thinking.jinja"
    template.write_text(TEMPLATE)
    return str(path), str(template), text


@pytest.fixture(scope="module")
def client(thinker):
    path, template, _ = thinker
    s = ServerProcess(
        "--model-path",
        path,
        "--reasoning-parser",
        "qwen3",
        "--chat-template",
        template,
        "--num-threads",
        "1",
    )
    yield openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
    s.stop()


def test_reasoning_content_split_streamed_and_not(thinker, client):
    reasoning, _, content = thinker[2].partition("</think>")
    reasoning, content = reasoning.strip(), content.lstrip()  # the parser's whitespace rules
    kw = dict(model="m", messages=MESSAGES, temperature=0, max_tokens=40)
    msg = client.chat.completions.create(**kw).choices[0].message
    assert msg.reasoning_content == reasoning and msg.content == content
    got_r, got_c = "", ""
    for chunk in client.chat.completions.create(stream=True, **kw):
        d = chunk.choices[0].delta if chunk.choices else None
        if d is not None:
            got_r += getattr(d, "reasoning_content", None) or ""
            got_c += d.content or ""
    assert (got_r, got_c) == (reasoning, content)
    # SGLang's separate_reasoning false: the whole output is content.
    whole = (
        client.chat.completions.create(extra_body={"separate_reasoning": False}, **kw)
        .choices[0]
        .message
    )
    assert whole.content == thinker[2] and whole.reasoning_content is None
