"""model/pooler.py: the pooling a model's sentence-transformers config names, and the pooled vector
folded over prefill chunks equal to pooling the whole sequence at once."""

import json
import os

import pytest
import torch

from radixlm.model.pooler import Pooler, PoolingType, read_pooling_type


def _st_dir(tmp_path, **modes) -> str:
    with open(tmp_path / "modules.json", "w") as f:
        json.dump(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
            ],
            f,
        )
    os.makedirs(tmp_path / "1_Pooling")
    with open(tmp_path / "1_Pooling" / "config.json", "w") as f:
        json.dump({"word_embedding_dimension": 8, **modes}, f)
    return str(tmp_path)


@pytest.mark.parametrize(
    "key, kind",
    [
        ("pooling_mode_mean_tokens", PoolingType.MEAN),
        ("pooling_mode_cls_token", PoolingType.CLS),
        ("pooling_mode_lasttoken", PoolingType.LAST),
    ],
)
def test_sentence_transformers_pooling(tmp_path, key, kind):
    assert read_pooling_type(_st_dir(tmp_path, **{key: True})) is kind


def test_no_pooling_config_is_last_token_and_max_pooling_is_refused(tmp_path):
    assert read_pooling_type(str(tmp_path)) is PoolingType.LAST
    with pytest.raises(ValueError, match="pooling"):
        read_pooling_type(_st_dir(tmp_path, pooling_mode_max_tokens=True))


@pytest.mark.parametrize("kind", list(PoolingType))
def test_chunks_fold_to_the_whole_sequence(kind):
    torch.manual_seed(0)
    seqs = [torch.randn(n, 8) for n in (7, 1, 5)]
    pooler = Pooler(kind)
    whole = {
        PoolingType.MEAN: lambda h: h.mean(0),
        PoolingType.CLS: lambda h: h[0],
        PoolingType.LAST: lambda h: h[-1],
    }
    # Two forwards: the first 3 tokens of each sequence (where it has them), then the rest.
    first = [s[:3] for s in seqs]
    rest = [s[3:] for s in seqs if len(s) > 3]
    acc = list(pooler.partial(torch.cat(first), [len(x) for x in first]))
    part2 = pooler.partial(torch.cat(rest), [len(x) for x in rest])
    for j, i in enumerate(i for i, s in enumerate(seqs) if len(s) > 3):
        acc[i] = pooler.fold(acc[i], part2[j])
    for s, a in zip(seqs, acc):
        want = torch.nn.functional.normalize(whole[kind](s.double()), dim=-1)
        torch.testing.assert_close(
            torch.tensor(pooler.finish(a, len(s)), dtype=torch.float64), want, atol=1e-6, rtol=0
        )
