"""Speculative decoding: draft sources propose tokens, one extend-shaped forward verifies them.

config.py         SpeculativeConfig: the options, validated, and the algorithms' names
draft_source.py   the interface every source implements (DraftSource, and DraftReq: what it reads)
factory.py        the source of --speculative-algorithm
ngram.py          prompt lookup over the request's own prompt and output
radix.py          the continuation along the radix tree from the request's context
suffix_index.py   radix's second half: what followed the request's last tokens in recent outputs
draft_model.py    greedy decoding of a smaller draft model in its own KV pool (batched forwards)
draft_tree.py     DraftTree (a draft's shape: a chain is a tree of one path), TreeShape, best-first growth
verify.py         greedy and multi-candidate rejection-sampling acceptance of a draft tree
grammar.py        a constrained request's tree cut where its grammar rejects, its rows masked
controller.py     which requests draft how many tokens this step (adaptive), and the counters
"""  # noqa: E501 (diagrams and command lines kept whole)
