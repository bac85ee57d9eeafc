"""Hugging Face Hub model ids: `--model-path org/name` (and --tokenizer-path, the draft model, the
Engine's path) resolved once, before any process starts, to a local path that every process reads.

A local path that exists always wins. Otherwise the id is looked up in the local HF cache first
(no network when its files are there), then, unless HF_HUB_OFFLINE is set, downloaded with
huggingface_hub's progress bars; --revision and --download-dir (its cache_dir) as SGLang reads them.
A GGUF repo takes llama-server's `-hf` spelling, `org/name:Q4_K_M`: the file whose name carries the
quant tag, any case, chosen by llama.cpp's rule (`find_best_model` in common/download.cpp). Nothing
here imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixlm.config import ServerArgs

logger = logging.getLogger(__name__)

# What a model directory needs (no *.bin / *.pt / *.gguf / original/*.pth: the loader reads
# safetensors).
MODEL_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
TOKENIZER_PATTERNS = ["*.json", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
# llama.cpp: with no tag, Q4_K_M, then Q8_0, then the first model file; side files are never the
# model.
DEFAULT_GGUF_TAGS = ("Q4_K_M", "Q8_0")
_SIDE_FILES = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<tag>[\w.-]+))?$")


class ModelNotFoundError(FileNotFoundError):
    """A model id that cannot be had: one line saying what to download or fix (`radixlm: error:
    ...`)."""


class NoGgufMatch(ModelNotFoundError):
    """A GGUF repo (or its cached part) without a file for the quant tag."""

    def __init__(self, repo_id: str, tag: str | None, models: list[str]):
        self.wanted = f"a GGUF file of {repo_id}" + (f" matching :{tag}" if tag else "")
        self.models = models
        super().__init__(
            f"{repo_id} has no GGUF file{f' matching :{tag}' if tag else ''}; its GGUF files: "
            f"{', '.join(models) or 'none'}"
        )


@dataclass(frozen=True)
class HubModel:
    """A model on the Hub: `org/name`, or a GGUF repo's file by its quant tag (`org/name:Q8_0`)."""

    repo_id: str
    tag: str | None = None
    revision: str | None = None

    @property
    def spec(self) -> str:
        return self.repo_id + (f":{self.tag}" if self.tag else "")


def parse_hub_id(spec: str, revision: str | None = None) -> HubModel | None:
    """The Hub model `spec` names, or None when it is no `org/name[:TAG]` (then it is a path)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    m = _HUB_ID.match(spec)
    if m is None:
        return None
    try:
        validate_repo_id(m["repo"])
    except HFValidationError:
        return None
    return HubModel(m["repo"], m["tag"], revision)


def is_offline() -> bool:
    # huggingface_hub reads HF_HUB_OFFLINE at import; an Engine's caller may set it later.
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in (
        "1",
        "ON",
        "YES",
        "TRUE",
    )


def pick_gguf(files: list[str], tag: str | None, repo_id: str) -> str:
    """The model file of a GGUF repo for `tag` (None: Q4_K_M, else Q8_0, else the first), by
    llama.cpp's rule: the tag followed by '.' or '-', any case; a split model by its first part."""
    models = sorted(
        f
        for f in files
        if f.endswith(".gguf") and not any(s in os.path.basename(f) for s in _SIDE_FILES)
    )
    firsts = [f for f in models if (m := _SPLIT.search(f)) is None or int(m[1]) == 1]
    for t in [tag] if tag else DEFAULT_GGUF_TAGS:
        pattern = re.compile(re.escape(t) + r"[.-]", re.IGNORECASE)
        chosen = next((f for f in firsts if pattern.search(f)), None)
        if chosen is not None:
            break
    else:
        chosen = firsts[0] if firsts and not tag else None
    if chosen is None:
        raise NoGgufMatch(repo_id, tag, models)
    split = _SPLIT.search(chosen)
    if split is not None and int(split[2]) > 1:
        raise ModelNotFoundError(
            f"{repo_id}: {chosen} is split in {int(split[2])} parts; radixlm loads one-file "
            "GGUFs (merge the parts with llama.cpp's llama-gguf-split --merge)"
        )
    return chosen


def _missing(path: str, weights: bool) -> str | None:
    """What a model (weights) or tokenizer directory still lacks; None when it is complete."""
    if not os.path.isfile(os.path.join(path, "config.json")):
        return "config.json"
    if not weights:
        return (
            None
            if any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES)
            else "tokenizer files"
        )
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f).get("weight_map", {}).values()))
        lost = [s for s in shards if not os.path.isfile(os.path.join(path, s))]
        return ", ".join(lost) or None
    return (
        None
        if any(n.endswith(".safetensors") for n in os.listdir(path))
        else "*.safetensors weights"
    )


class HubResolver:
    """Turns Hub ids into local paths: the cache (`cache_dir`; None: huggingface_hub's), then a
    download."""

    def __init__(self, cache_dir: str | None = None):
        from huggingface_hub import constants

        self.cache_dir = os.path.expanduser(cache_dir) if cache_dir else constants.HF_HUB_CACHE
        self.cache_flag = (
            f" --cache-dir {self.cache_dir}" if cache_dir else ""
        )  # for the download command shown

    def resolve(
        self, spec: str | None, revision: str | None, flag: str, weights: bool = True
    ) -> str | None:
        """A local path for `spec` (None stays None: the default model); a ModelNotFoundError
        naming what to download when it cannot be had."""
        if spec is None or os.path.exists(os.path.expanduser(spec)):
            if revision and spec is not None:
                logger.warning(
                    "%s %s is a local path: its revision %r is not used", flag, spec, revision
                )
            return spec
        model = parse_hub_id(spec, revision)
        if model is None:
            return spec  # neither a path nor an id: the loader names the missing path
        try:
            path, lacking = self._cached(model, weights)
        except ModelNotFoundError as e:  # a cached file radixlm cannot load (a split GGUF)
            raise ModelNotFoundError(f"{flag} {model.spec}: {e}") from None
        if path is not None:
            return path
        if is_offline():
            raise ModelNotFoundError(self._offline_message(model, flag, lacking))
        return self._download(model, flag, weights)

    # ---------------------------------------------------------------- the cache
    def _storage(self, model: HubModel) -> str:
        from huggingface_hub.file_download import repo_folder_name

        return os.path.join(
            self.cache_dir, repo_folder_name(repo_id=model.repo_id, repo_type="model")
        )

    def _snapshot(self, model: HubModel) -> str | None:
        """The cached snapshot directory of the model's revision (the HF cache layout: refs/<branch>
        holds a commit; snapshots/<commit>/ its files), None when absent."""
        rev = model.revision or "main"
        ref = os.path.join(self._storage(model), "refs", rev)
        commit = rev
        if os.path.isfile(ref):
            with open(ref, encoding="utf-8") as f:
                commit = f.read().strip()
        snapshot = os.path.join(self._storage(model), "snapshots", commit)
        return snapshot if os.path.isdir(snapshot) else None

    def _cached(self, model: HubModel, weights: bool) -> tuple[str | None, str]:
        """(the local path, "") when the cache has the model; else (None, what the cache lacks)."""
        from huggingface_hub import hf_hub_download, snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        snapshot = self._snapshot(model)
        if snapshot is None:
            refs = os.path.join(self._storage(model), "refs")
            if not os.path.isdir(refs):
                return None, f"{model.repo_id}"
            known = []
            for name in sorted(os.listdir(refs)):
                with open(os.path.join(refs, name), encoding="utf-8") as f:
                    known.append(f"{name} = {f.read().strip()[:12]}")
            return (
                None,
                (
                    f"revision {model.revision or 'main'!r} of {model.repo_id} (it has"
                    f" {', '.join(known)})"
                ),
            )
        files = [
            os.path.relpath(os.path.join(d, n), snapshot)
            for d, _, names in os.walk(snapshot)
            for n in names
        ]
        try:
            if self._is_gguf(model, files):
                name = pick_gguf(files, model.tag, model.repo_id)
                return (
                    hf_hub_download(
                        model.repo_id,
                        name,
                        revision=model.revision,
                        cache_dir=self.cache_dir,
                        local_files_only=True,
                    ),
                    "",
                )
            path = snapshot_download(
                model.repo_id,
                revision=model.revision,
                cache_dir=self.cache_dir,
                local_files_only=True,
                allow_patterns=MODEL_PATTERNS if weights else TOKENIZER_PATTERNS,
            )
        except NoGgufMatch as e:
            return None, f"{e.wanted} (cached: {', '.join(e.models) or 'none'})"
        except LocalEntryNotFoundError:
            return None, f"all the files of {model.repo_id}"
        lacking = _missing(path, weights)
        return (None, f"{lacking} of {model.repo_id}") if lacking else (path, "")

    @staticmethod
    def _is_gguf(model: HubModel, files: list[str]) -> bool:
        return model.tag is not None or (
            "config.json" not in files and any(f.endswith(".gguf") for f in files)
        )

    def _offline_message(self, model: HubModel, flag: str, lacking: str) -> str:
        rev = f" --revision {model.revision}" if model.revision else ""
        include = f' --include "*{model.tag}*.gguf"' if model.tag else ""
        return (
            f"{flag} {model.spec}: not a local path, and the Hugging Face cache {self.cache_dir}"
            f" lacks {lacking}; HF_HUB_OFFLINE is set, so nothing is downloaded: run `hf download"
            f" {model.repo_id}{rev}{include}{self.cache_flag}` first"
        )

    # ------------------------------------------------------------- the network
    def _download(self, model: HubModel, flag: str, weights: bool) -> str:
        from huggingface_hub import HfApi, hf_hub_download, snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        where = f"{flag} {model.spec}"
        try:
            files = HfApi().list_repo_files(model.repo_id, revision=model.revision)
            if self._is_gguf(model, files):
                name = pick_gguf(files, model.tag, model.repo_id)
                _notice(f"{where}: downloading {name} from the Hugging Face Hub")
                return hf_hub_download(
                    model.repo_id, name, revision=model.revision, cache_dir=self.cache_dir
                )
            _notice(f"{where}: downloading {model.repo_id} from the Hugging Face Hub")
            path = snapshot_download(
                model.repo_id,
                revision=model.revision,
                cache_dir=self.cache_dir,
                allow_patterns=MODEL_PATTERNS if weights else TOKENIZER_PATTERNS,
            )
        except ModelNotFoundError as e:
            raise ModelNotFoundError(f"{where}: {e}") from None
        except RevisionNotFoundError:
            raise ModelNotFoundError(
                f"{where}: the Hub has no revision {model.revision!r} of {model.repo_id} "
                "(--revision takes a branch, a tag or a commit id)"
            ) from None
        except GatedRepoError:
            raise ModelNotFoundError(
                f"{where} is gated: accept its terms on huggingface.co and log in "
                "(`hf auth login` or HF_TOKEN)"
            ) from None
        except RepositoryNotFoundError:
            raise ModelNotFoundError(
                f"{where}: no such model on the Hugging Face Hub (a private one needs "
                "`hf auth login` or HF_TOKEN; a local path must exist)"
            ) from None
        except Exception as e:
            cause = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
            raise ModelNotFoundError(
                f"{where} is not in the Hugging Face cache {self.cache_dir} and could not be "
                f"downloaded ({cause}); download it with `hf download {model.repo_id}"
                f"{self.cache_flag}`, or set HF_HUB_OFFLINE=1 to use the cache only"
            ) from None
        lost = _missing(path, weights)
        if lost:
            raise ModelNotFoundError(
                f"{where}: the repo has no {lost} (radixlm loads safetensors checkpoints and "
                "GGUF files)"
            )
        return path


def _notice(message: str) -> None:
    # Before logging is configured (the CLI resolves first): stderr, beside huggingface_hub's
    # progress bars.
    print(f"radixlm: {message}", file=sys.stderr, flush=True)


def resolve_model_paths(args: ServerArgs) -> ServerArgs:
    """`args` with every Hub id (model, tokenizer, draft model) replaced by a local path; the served
    model name stays the id the user gave (as SGLang names it)."""
    hub = HubResolver(args.download_dir)
    model = hub.resolve(args.model_path, args.revision, "--model-path")
    tokenizer = hub.resolve(args.tokenizer_path, args.revision, "--tokenizer-path", weights=False)
    draft = hub.resolve(
        args.speculative_draft_model_path,
        args.speculative_draft_model_revision,
        "--speculative-draft-model-path",
    )
    served = args.served_model_name or (args.model_path if model != args.model_path else None)
    return dataclasses.replace(
        args,
        model_path=model,
        tokenizer_path=tokenizer,
        speculative_draft_model_path=draft,
        served_model_name=served,
    )
