"""Few-shot question answering: examples in the prompt, a `gen` that stops at the line's end.

python examples/few_shot_qa.py [http://127.0.0.1:30000]
"""

from _backend import run_example

import radixlm as sgl

EXAMPLES = (
    "Q: What is the capital of France?\nA: Paris\n\nQ: How many legs does a dog have?\nA: Four\n\n"
)


@sgl.function
def few_shot_qa(s, question):
    s += EXAMPLES
    s += "Q: " + question + "\nA:" + sgl.gen("answer", max_tokens=16, stop="\n")


def main(backend) -> list:
    questions = [
        "What is the capital of Italy?",
        "How many legs does a bird have?",
        "What color is the sky?",
    ]
    # run_batch sends the shared examples once, then runs the questions concurrently.
    states = few_shot_qa.run_batch(
        [{"question": q} for q in questions], backend=backend, temperature=0
    )
    for q, s in zip(questions, states):
        print(f"Q: {q}\nA:{s['answer']}\n")
    return states


if __name__ == "__main__":
    run_example(main)
