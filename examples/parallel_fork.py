"""Parallel branches with `fork`: the shared prefix is computed once (sent ahead of the branches),
then every branch runs concurrently and hits the cache for it.

    python examples/parallel_fork.py [http://127.0.0.1:30000]
"""

from _backend import run_example

import radixlm as sgl

ASPECTS = ["sleep", "food", "exercise", "friends"]


@sgl.function
def tips(s, topic):
    s += f"Here are short tips about {topic}, one per aspect.\n"
    forks = s.fork(len(ASPECTS))
    for f, aspect in zip(forks, ASPECTS):
        f += f"- {aspect}:" + sgl.gen("tip", max_tokens=24, stop="\n")
    forks.join()
    s += "".join(f"- {a}:{t}\n" for a, t in zip(ASPECTS, s["tip"]))


def main(backend):
    s = tips.run("well-being", backend=backend, temperature=0)
    for aspect, tip, meta in zip(ASPECTS, s["tip"], s.get_meta_info("tip")):
        print(
            f"{aspect:>9}:{tip}   (cached {meta['cached_tokens']} of {meta['prompt_tokens']} prompt"
            " tokens)"
        )
    return s


if __name__ == "__main__":
    run_example(main)
