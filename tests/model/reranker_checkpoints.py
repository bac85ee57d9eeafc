"""Tiny random rerankers of both kinds, saved as HF directories (no hub): a BERT and an XLM-RoBERTa
cross-encoder (one label) with tokenizers built from a small vocabulary, and a Qwen3 causal LM with
SmolLM2's tokenizer ("yes", "no" and ChatML's tokens are in it) for the yes/no kind."""

from __future__ import annotations

import os

import torch

# Enough words for the tests' texts; anything else falls back to letters (BERT's "##x" pieces,
# the unigram model's single characters).
WORDS = (
    "what is a the of in and to panda bear giant species china bamboo eats capital city paris"
    " france berlin germany gravity force mass weather today sunny rain cats dogs are pets"
    " python language snake code programming fast slow car engine"
).split()
LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789.,?!'-"

QUERY = "what is a panda?"
DOCUMENTS = [
    "hi",
    "the giant panda is a bear species of china and eats bamboo.",
    "paris is the capital of france.",
    "gravity is a force of mass",
    "pandas are bears in china",
]


def _encoder_dims(**extra) -> dict:
    return dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=1,
        # Spread-out scores: the documents' order is far from ties.
        initializer_range=0.5,
        **extra,
    )


def tiny_bert_reranker(path: str) -> str:
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    os.makedirs(path, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *LETTERS]
    vocab += [f"##{c}" for c in LETTERS]
    tok = BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)})
    cfg = BertConfig(vocab_size=len(vocab), max_position_embeddings=128, **_encoder_dims())
    torch.manual_seed(0)
    BertForSequenceClassification(cfg).eval().save_pretrained(path)
    tok.save_pretrained(path)
    return path


def tiny_xlm_roberta_reranker(path: str) -> str:
    from transformers import (
        XLMRobertaConfig,
        XLMRobertaForSequenceClassification,
        XLMRobertaTokenizer,
    )

    os.makedirs(path, exist_ok=True)
    pieces = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [(f"\u2581{w}", -1.0) for w in WORDS] + [("\u2581", -2.0)]
    pieces += [(c, -5.0) for c in LETTERS]
    tok = XLMRobertaTokenizer(vocab=pieces)
    cfg = XLMRobertaConfig(
        vocab_size=len(pieces) + 1,  # <mask> is added after the pieces
        max_position_embeddings=130,  # 128 positions after padding_idx + 1, as XLM-R's 514
        type_vocab_size=1,
        pad_token_id=1,
        **_encoder_dims(),
    )
    torch.manual_seed(1)
    XLMRobertaForSequenceClassification(cfg).eval().save_pretrained(path)
    tok.save_pretrained(path)
    return path


def tiny_qwen3_reranker(path: str, tokenizer) -> str:
    """A random Qwen3ForCausalLM (the original Qwen3-Reranker's architecture)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        initializer_range=0.25,
    )
    torch.manual_seed(2)
    Qwen3ForCausalLM(cfg).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# vLLM's --hf-overrides for the original Qwen3-Reranker (radixlm: --json-model-override-args).
QWEN3_RERANKER_OVERRIDES = {
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"],
    "is_original_qwen3_reranker": True,
}


def hf_cross_encoder_logits(path: str, query: str, documents: list[str]) -> list[float]:
    """HF transformers' logits of each (query, document) pair, tokenized as sentence-transformers'
    CrossEncoder does (the tokenizer's pair encoding, padded batch)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    batch = tok([query] * len(documents), documents, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).logits[:, 0].tolist()


# The Qwen3-Reranker model card's template.
CARD_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query"
    ' and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
CARD_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
CARD_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def hf_qwen3_reranker_scores(
    path: str, query: str, documents: list[str], instruction: str | None = None
) -> list[float]:
    """The Qwen3-Reranker model card's scoring, literally: prefix + format_instruction + suffix
    tokenized as the card does, left-padded, p(yes) of the softmax over the [no, yes] logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prefix, suffix, instruction = CARD_PREFIX, CARD_SUFFIX, instruction or CARD_INSTRUCTION
    pairs = [f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {d}" for d in documents]
    prefix_ids = tok.encode(prefix, add_special_tokens=False)
    suffix_ids = tok.encode(suffix, add_special_tokens=False)
    ids = [prefix_ids + tok.encode(p, add_special_tokens=False) + suffix_ids for p in pairs]
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    batch = tok.pad({"input_ids": ids}, padding=True, return_tensors="pt")
    no, yes = tok.convert_tokens_to_ids("no"), tok.convert_tokens_to_ids("yes")
    with torch.no_grad():
        last = model(**batch).logits[:, -1, :]
    two = torch.log_softmax(torch.stack([last[:, no], last[:, yes]], dim=1), dim=1)
    return two[:, 1].exp().tolist()
