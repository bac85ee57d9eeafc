"""The target's hidden states handed to an EAGLE head (model/hidden_capture.py) on the default
model, whose layers run as one native op: recording the stream entering three layers runs the op in
segments, and that changes no bit of the forward; the streams are those the Python layers compute;
the final hidden states are those the logits come from."""

import pytest
import torch

from radixlm.model.executor.worker_batch import ModelWorkerBatch
from radixlm.model.forward_batch import ForwardMode
from radixlm.model.hidden_capture import NoHiddenCapture, layer_segments

PROMPT = list(range(1000, 1037))


class Recorder:
    def __init__(self, aux_layers):
        self.aux_layers = aux_layers
        self.streams, self.hidden = {}, []

    def record_layer(self, layer, stream):
        self.streams.setdefault(layer, []).append(stream.clone())

    def on_forward(self, fb, hidden):
        self.hidden.append(hidden.clone())


@pytest.fixture(scope="module")
def runner(default_model_path):
    from radixlm.model.executor.runner import ModelRunner
    from radixlm.model.executor.runner_config import ModelRunnerConfig

    threads = torch.get_num_threads()
    try:
        yield ModelRunner(
            ModelRunnerConfig(
                model_path=default_model_path,
                num_threads=1,
                max_total_tokens=512,
                max_running_requests=2,
            )
        )
    finally:
        torch.set_num_threads(threads)


def prefill_and_decode(runner) -> list[torch.Tensor]:
    """A prefill of PROMPT and two decode steps, on fresh KV; -> each forward's next-token
    logits."""
    r2t_pool, kv = runner.req_to_token_pool, runner.token_to_kv_pool
    row, slots = r2t_pool.alloc(), kv.alloc(len(PROMPT) + 2)
    r2t = r2t_pool.req_to_token
    r2t[row, : len(PROMPT) + 2] = slots
    out, n = [], len(PROMPT)
    try:
        with torch.inference_mode():
            fb = runner.prepare(
                ModelWorkerBatch(
                    ForwardMode.EXTEND,
                    PROMPT,
                    list(range(n)),
                    [row],
                    [n],
                    slots[:n],
                    extend_prefix_lens=[0],
                    extend_seq_lens=[n],
                )
            )
            out.append(runner.forward(fb).next_token_logits)
            for step in range(2):
                tok, pos = int(out[-1].argmax()), n + step
                fb = runner.prepare(
                    ModelWorkerBatch(
                        ForwardMode.DECODE, [tok], [pos], [row], [pos + 1], r2t[row, pos : pos + 1]
                    )
                )
                out.append(runner.forward(fb).next_token_logits)
    finally:
        kv.free(slots)
        r2t_pool.free(row)
    return out


def test_layer_segments():
    assert layer_segments(range(0, 30), ()) == [(0, 30)]
    assert layer_segments(range(0, 30), (2, 15, 27)) == [(0, 2), (2, 15), (15, 27), (27, 30)]
    assert layer_segments(range(0, 4), (1, 1, 0)) == [
        (0, 1),
        (1, 4),
    ]  # repeats and the embedding: no empty segment


def test_segmented_capture_changes_nothing_and_matches_the_python_layers(runner):
    decoder = runner.model.model
    assert decoder.fused_layers(), "the default model runs its layers as one native op"
    plain = prefill_and_decode(runner)
    fused = Recorder((2, 15, 27))  # SGLang's default EAGLE-3 layers of a 30-layer model
    runner.set_hidden_capture(fused)
    try:
        captured = prefill_and_decode(runner)
        decoder.use_fused_layers, decoder._fused = False, None
        python = Recorder((2, 15, 27))
        runner.set_hidden_capture(python)
        by_python = prefill_and_decode(runner)
    finally:
        decoder.use_fused_layers, decoder._fused = True, None
        runner.set_hidden_capture(NoHiddenCapture())
    for a, b in zip(plain, captured):
        assert torch.equal(a, b)  # the segmented op: bitwise the single op
    for a, b in zip(plain, by_python):
        assert torch.equal(a, b)
    assert [h.shape[0] for h in fused.hidden] == [len(PROMPT), 1, 1]
    for layer in (2, 15, 27):
        assert len(fused.streams[layer]) == 3
        for a, b in zip(fused.streams[layer], python.streams[layer]):
            assert torch.equal(a, b), layer
    for a, b in zip(fused.hidden, python.hidden):
        assert torch.equal(a, b)
    # The final hidden state is what the logits come from.
    last = runner.model.compute_logits(fused.hidden[0][-1:]).float()
    assert torch.equal(last[0], plain[0][0])


def test_refused_capture(runner):
    with pytest.raises(ValueError, match=r"outside the target's 30 layers"):
        runner.set_hidden_capture(Recorder((2, 30)))
