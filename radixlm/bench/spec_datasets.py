"""Workloads where speculative decoding pays, for `radixlm bench serving`.

grounded   edit tasks over a passage given in the prompt (fix its spelling, punctuation, grammar and
           return it): the answer mostly copies the passage (prompt-lookup drafts).
recurring  agent-style calls that come back with the same prompt (a tool loop re-asking, a
           retried step): greedy answers repeat, so an earlier answer is a draft (radix drafts).

Passages are built from the sentences below (written for this benchmark), shuffled per prompt so
no two passages are alike.
"""

from __future__ import annotations

import random

from radixlm.bench.serving_client import RequestInput

SENTENCES = [
    "The river town holds a market every Saturday morning near the old stone bridge.",
    "Farmers bring apples, pears, honey and fresh bread from the villages in the hills.",
    "The bridge was built two hundred years ago and still carries carts and bicycles.",
    "In winter the market moves into the town hall, where the floor is warm and dry.",
    "A small library opens next to the hall on Tuesdays and Thursdays after lunch.",
    "Children borrow picture books while their parents read the weekly newspaper.",
    "The newspaper prints the train times, the weather and the prices at the market.",
    "Trains to the city leave every hour from the station at the end of Mill Street.",
    "The journey takes forty minutes and passes three lakes and a long pine forest.",
    "Hikers get off at the second lake, where a marked path climbs to a wooden tower.",
    "From the tower one can see the whole valley and, on clear days, the far mountains.",
    "The mountains keep their snow until June, and the river runs high in spring.",
    "In spring the town repairs the riverbank and plants willows along the water.",
    "The willows hold the soil in place and give shade to the people who fish there.",
    "Fishing is allowed from May to October with a permit from the town office.",
    "The town office also hands out maps, bus tickets and parking cards for visitors.",
]

# Edit tasks: the answer is the passage again with small changes, as in document and code edits.
# (Asked to "rewrite" or "extract", the 135M default model paraphrases; asked to fix and return
# the text in full it mostly copies, which is the grounded case this dataset measures.)
TASKS = [
    "Fix the spelling in this text and return it in full",
    "Fix the punctuation in this text and return it in full",
    "Correct the grammar of this text and return it in full",
]

AGENT_PROMPTS = [
    (
        "You are a file agent. Tool: list_dir(path). Task: find the largest log file under"
        " /var/log. Next action:"
    ),
    (
        "You are a shell agent. Tool: run(cmd). Task: count the Python files in the project. Next"
        " action:"
    ),
    "You are a web agent. Tool: fetch(url). Task: read the changelog of version 2.1. Next action:",
    (
        "You are a calendar agent. Tool: create_event(title, day, hour). Task: book the team"
        " meeting on Monday at ten. Next action:"
    ),
    (
        "You are a database agent. Tool: sql(query). Task: find the ten customers with the most"
        " orders. Next action:"
    ),
    (
        "You are a mail agent. Tool: send(to, subject, body). Task: thank Ana for the report. Next"
        " action:"
    ),
    (
        "You are a code agent. Tool: edit(file, old, new). Task: rename the function load_cfg to"
        " load_config. Next action:"
    ),
    (
        "You are a travel agent. Tool: search_trains(from, to, day). Task: find a morning train to"
        " the city on Friday. Next action:"
    ),
]


def passage(rng: random.Random, n_sentences: int) -> str:
    picks = (
        [rng.choice(SENTENCES) for _ in range(n_sentences)]
        if n_sentences > len(SENTENCES)
        else rng.sample(SENTENCES, n_sentences)
    )
    return " ".join(picks)


def grounded_requests(num: int, n_sentences: int, output_len: int, seed: int) -> list[RequestInput]:
    rng = random.Random(seed)
    return [
        RequestInput(
            [
                {
                    "role": "user",
                    "content": f"{TASKS[i % len(TASKS)]}:\n\n{passage(rng, n_sentences)}",
                }
            ],
            output_len,
            ignore_eos=False,
        )
        for i in range(num)
    ]


def recurring_requests(
    num_prompts: int, repeats: int, output_len: int, seed: int
) -> list[RequestInput]:
    """num_prompts distinct calls, each sent `repeats` times, in a shuffled order (a repeat comes
    back after other work, as a retried or looping agent step does)."""
    rng = random.Random(seed)
    prompts = [
        AGENT_PROMPTS[i % len(AGENT_PROMPTS)] + ("" if i < len(AGENT_PROMPTS) else f" (case {i})")
        for i in range(num_prompts)
    ]
    order = [p for p in prompts for _ in range(repeats)]
    rng.shuffle(order)
    return [
        RequestInput([{"role": "user", "content": p}], output_len, ignore_eos=False) for p in order
    ]
