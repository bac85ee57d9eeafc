"""Which decoder layers each pipeline stage holds (--pp-size, --pp-layer-partition).

The spelling of a partition is SGLang's (its SGLANG_PP_LAYER_PARTITION): layers per stage, comma
separated, first stage first, e.g. "10,11,11". By default the layers split evenly and the
remainder goes to the stages just before the last (the first holds the embedding, the last the
final norm and LM head: they get the fewest layers), as SGLang's get_pp_indices does."""

from __future__ import annotations


def parse_partition(text: str | None) -> tuple[int, ...] | None:
    """ "10,10,12" -> (10, 10, 12); None or "" -> None; a ValueError naming the flag otherwise."""
    if not text:
        return None
    try:
        counts = tuple(int(p) for p in str(text).split(","))
    except ValueError:
        raise ValueError(
            "pp_layer_partition must be layers per stage, comma separated (e.g. 10,11,11), "
            f"got {text!r}"
        ) from None
    if any(c < 1 for c in counts):
        raise ValueError(f"pp_layer_partition: every stage needs at least one layer, got {text!r}")
    return counts


def layer_counts(
    num_layers: int,
    pp_size: int,
    partition: tuple[int, ...] | None = None,
    last_from: int | None = None,
) -> tuple[int, ...]:
    """Layers per stage; a ValueError naming both numbers when they cannot be split. last_from: the
    first of the layers the last stage must hold (Gemma 4's KV-sharing layers and the layers whose
    KV they read: a stage cannot read KV another stage wrote); None: any split. By default the
    stages before the last then split the layers before it."""
    if pp_size > num_layers:
        raise ValueError(
            f"pp_size {pp_size} is larger than the model's {num_layers} layers (each stage needs"
            " one)"
        )
    if partition is not None:
        if len(partition) != pp_size or sum(partition) != num_layers:
            raise ValueError(
                f"pp_layer_partition {','.join(map(str, partition))} must have pp_size {pp_size} "
                f"entries summing to the model's {num_layers} layers"
            )
        counts = partition
    else:
        counts = _even(num_layers, pp_size)
    if last_from is None or pp_size == 1 or num_layers - counts[-1] <= last_from:
        return counts
    tail = f"layers {last_from}-{num_layers - 1} share KV and stay on the last stage"
    if partition is not None:
        raise ValueError(
            f"pp_layer_partition {','.join(map(str, partition))} (pp_size {pp_size}) splits the"
            f" model's KV-sharing layers: {tail}, at least {num_layers - last_from} layers"
        )
    if last_from < pp_size - 1:
        raise ValueError(
            f"pp_size {pp_size} is too large for this model: {tail}, which leaves {last_from}"
            f" layers for the other {pp_size - 1} stages (each needs one)"
        )
    return _even(last_from, pp_size - 1) + (num_layers - last_from,)


def _even(num_layers: int, pp_size: int) -> tuple[int, ...]:
    counts = [num_layers // pp_size] * pp_size
    for i in range(2, num_layers % pp_size + 2):
        counts[-i] += 1
    return tuple(counts)


def stage_layers(counts: tuple[int, ...], stage: int) -> range:
    start = sum(counts[:stage])
    return range(start, start + counts[stage])
