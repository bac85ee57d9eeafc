"""A multi-turn chat: roles render through the model's own chat template.

python examples/multi_turn_chat.py [http://127.0.0.1:30000]
"""

from _backend import run_example

import radixlm as sgl


@sgl.function
def chat(s, questions):
    s += sgl.system("You are a helpful assistant. Answer in one short sentence.")
    for i, q in enumerate(questions):
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen(f"answer_{i}", max_tokens=40))


def main(backend):
    s = chat.run(
        ["What is the largest planet?", "And the smallest one?"], backend=backend, temperature=0
    )
    for m in s.messages():
        print(f"{m['role']:>9}: {m['content']}")
    return s


if __name__ == "__main__":
    run_example(main)
