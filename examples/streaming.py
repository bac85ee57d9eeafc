"""Streaming: `run(stream=True)` returns at once; `text_iter` yields the text as it is produced.

python examples/streaming.py [http://127.0.0.1:30000]
"""

from _backend import run_example

import radixlm as sgl


@sgl.function
def story(s, topic):
    s += sgl.user(f"Write two sentences about {topic}.")
    s += sgl.assistant(sgl.gen("story", max_tokens=48))


def main(backend) -> tuple:
    s = story.run("a lighthouse", backend=backend, temperature=0, stream=True)
    chunks = []
    for chunk in s.text_iter("story"):
        chunks.append(chunk)
        print(chunk, end="", flush=True)
    print()
    return chunks, s


if __name__ == "__main__":
    run_example(main)
