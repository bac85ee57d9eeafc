"""GGUF tokenizers against HF's: a vocabulary trained here (tokenizers' BPE trainer, on a small
multilingual corpus) is written into a GGUF the way llama.cpp's converter writes it (token list,
types, merges or scores, the pre-tokenizer name), and the tokenizer radixlm builds from that file
(load_tokenizer, fresh and from its cache) must encode a held-out text -- eight scripts, emoji with
joiners and skin tones, code with tabs, runs of spaces and digits, special tokens -- to exactly the
ids of the HF tokenizer the model ships: Qwen2's (GPT-2 BPE, pre-tokenizer "qwen2"), Llama 3's
(GPT-2 BPE, "llama-bpe", merges ignored for whole words) and Llama 2's (SentencePiece BPE with byte
fallback, scores and no merges in the file)."""

from __future__ import annotations

import json

import gguf
import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaTokenizer, PreTrainedTokenizerFast, Qwen2Tokenizer

from radixlm.model.loader import load_tokenizer, tokenizer_cache_dir

CORPUS = [
    (
        "The quick brown fox jumps over the lazy dog. It's 2024 and we've got 1234567 reasons;"
        " they'll see."
    ),
    "Der schnelle braune Fuchs springt über den faulen Hund. Größe, Straße, Äpfel und Öl.",
    "Быстрая коричневая лиса перепрыгивает через ленивую собаку. Привет, мир!",
    "敏捷的棕色狐狸跳过了懒狗。你好，世界！我们今天学习中文。",
    "素早い茶色の狐が怠け者の犬を飛び越える。こんにちは世界。カタカナとひらがな。",
    "الثعلب البني السريع يقفز فوق الكلب الكسول. مرحبا بالعالم",
    "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है। नमस्ते दुनिया",
    "Le renard brun rapide saute par-dessus le chien paresseux. Ça va? Où est l'hôtel?",
    (
        "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n -"
        " 1) + fibonacci(n - 2)\n"
    ),
    'for (int i = 0; i < 10; ++i) {\n\tprintf("%d\\n", i * 42);\n}\n',
    "I love pizza 🍕 and sushi 🍣! 👍🏽 👨‍👩‍👧 ❤️ 🎉🎉",
    '{"name": "radixlm", "version": "0.1.0", "tags": ["llm", "serving"]}',
]
TEXT = (
    "Hello   world!\tIt's 3.14159 and 100000 cats — they're fine. Größe straße; "
    "Привет мир, ленивая собака. 你好世界，懒狗。こんにちは、犬。مرحبا الكلب. नमस्ते कुत्ता। "
    "👨‍👩‍👧‍👦 👍🏿 🍕🍣 ❤️\n\n"
    "def add(a, b):\n\treturn a + b  # sum\n    x = [1, 22, 333, 4444]\n"
    "<|im_start|>user\nhi<|im_end|>\n   trailing spaces   "
)

# The split regexes as the models' tokenizer.json files state them.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_level(split: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _train_byte_bpe(split: str, specials: list[str]) -> tuple[dict, list[str]]:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _byte_level(split)
    tok.train_from_iterator(
        CORPUS * 3,
        trainers.BpeTrainer(
            vocab_size=900,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    model = json.loads(tok.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return model["vocab"], merges


def _write_gguf(
    path: str,
    arch: str,
    vocab: dict,
    specials: list[str],
    model: str,
    pre: str | None = None,
    merges: list[str] | None = None,
    scores: list[float] | None = None,
    types: dict | None = None,
    bos: int | None = None,
    eos: int | None = None,
    unk: int | None = None,
) -> None:
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    w = gguf.GGUFWriter(path, arch)
    w.add_tokenizer_model(model)
    if pre:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    kinds = types or {}
    w.add_token_types(
        [
            kinds.get(t, gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL)
            for t in tokens
        ]
    )
    if merges is not None:
        w.add_token_merges(merges)
    if scores is not None:
        w.add_token_scores(scores)
    for add, token_id in (
        (w.add_bos_token_id, bos),
        (w.add_eos_token_id, eos),
        (w.add_unk_token_id, unk),
    ):
        if token_id is not None:
            add(token_id)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _qwen2(tmp_path):
    vocab, merges = _train_byte_bpe(QWEN2_SPLIT, CHAT_SPECIALS)
    hf = Qwen2Tokenizer(vocab=dict(vocab), merges=[tuple(m.split(" ")) for m in merges])
    hf.add_special_tokens({"additional_special_tokens": CHAT_SPECIALS[1:]})
    path = str(tmp_path / "qwen2.gguf")
    _write_gguf(
        path,
        "qwen2",
        vocab,
        CHAT_SPECIALS,
        "gpt2",
        pre="qwen2",
        merges=merges,
        eos=vocab["<|endoftext|>"],
    )
    return hf, path


def _llama3(tmp_path):
    specials = ["<|begin_of_text|>", "<|end_of_text|>", *CHAT_SPECIALS]
    vocab, merges = _train_byte_bpe(LLAMA3_SPLIT, specials)
    backend = Tokenizer(
        models.BPE(
            vocab=dict(vocab), merges=[tuple(m.split(" ")) for m in merges], ignore_merges=True
        )
    )
    backend.pre_tokenizer = _byte_level(LLAMA3_SPLIT)
    backend.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        additional_special_tokens=specials[2:],
    )
    path = str(tmp_path / "llama3.gguf")
    _write_gguf(
        path,
        "llama",
        vocab,
        specials,
        "gpt2",
        pre="llama-bpe",
        merges=merges,
        bos=vocab["<|begin_of_text|>"],
        eos=vocab["<|end_of_text|>"],
    )
    return hf, path


def _llama2(tmp_path):
    """SentencePiece BPE as Llama 2 has it: <unk>, <s>, </s>, 256 byte pieces, then pieces by merge
    order with scores falling by one each (what llama.cpp's converter copies from the .model file).
    """
    byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first", split=False
    )
    tok.train_from_iterator(
        CORPUS * 3,
        trainers.BpeTrainer(
            vocab_size=1400,
            special_tokens=["<unk>", "<s>", "</s>", *byte_pieces],
            show_progress=False,
        ),
    )
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    hf = LlamaTokenizer(
        vocab=dict(vocab), merges=[tuple(m.split(" ")) for m in merges], add_bos_token=True
    )
    by_id = sorted(vocab, key=vocab.get)
    scores = [0.0 if i < 3 + 256 else -float(i) for i in range(len(by_id))]
    types = {
        "<unk>": gguf.TokenType.UNKNOWN,
        "<s>": gguf.TokenType.CONTROL,
        "</s>": gguf.TokenType.CONTROL,
        **{p: gguf.TokenType.BYTE for p in byte_pieces},
    }
    path = str(tmp_path / "llama2.gguf")
    _write_gguf(path, "llama", vocab, [], "llama", scores=scores, types=types, bos=1, eos=2, unk=0)
    return hf, path


@pytest.mark.parametrize(
    "build", [_qwen2, _llama3, _llama2], ids=["qwen2", "llama-bpe", "sentencepiece"]
)
def test_gguf_tokenizer_encodes_as_hf(build, tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    hf, path = build(tmp_path)
    want = hf(TEXT)["input_ids"]
    assert len(want) > 100 and len(set(want)) > 60  # the text really exercises the vocabulary
    fresh = load_tokenizer(path)
    assert fresh.convert_ids_to_tokens(fresh(TEXT)["input_ids"]) == hf.convert_ids_to_tokens(want)
    assert fresh(TEXT)["input_ids"] == want
    cached = load_tokenizer(path)  # read back from tokenizer_cache_dir
    assert cached is not fresh and tokenizer_cache_dir(path).startswith(str(tmp_path / "cache"))
    assert cached(TEXT)["input_ids"] == want
    assert cached.decode(want, skip_special_tokens=False) == hf.decode(
        want, skip_special_tokens=False
    )
    for line in CORPUS:
        assert cached(line)["input_ids"] == hf(line)["input_ids"], line
