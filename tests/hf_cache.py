"""A model placed in a Hugging Face cache the way huggingface_hub lays one out (what `hf download`
leaves behind), for tests that must not reach the Hub: models--ORG--NAME/blobs/<hash> (an LFS file
by its sha256, another by its git blob sha1), snapshots/<commit>/<path> (relative links into blobs)
and refs/<revision> (the commit). huggingface_hub's own scan_cache_dir reads it back
(tests/unit/test_hub.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil

# Files huggingface_hub stores through LFS in a model repo (its default .gitattributes).
LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".model", ".pt")


def blob_name(path: str) -> str:
    from huggingface_hub.utils.sha import git_hash, sha_fileobj

    with open(path, "rb") as f:
        if path.endswith(LFS_SUFFIXES):
            return sha_fileobj(f).hex()
        return git_hash(f.read())


def put_in_hf_cache(
    cache_dir: str, repo_id: str, files: dict[str, str], revision: str = "main"
) -> str:
    """Cache `files` (repo path -> local file) as `repo_id` at `revision`; returns the snapshot
    directory. The commit id is a hash of the contents, so the same files give the same commit."""
    from huggingface_hub.file_download import repo_folder_name

    storage = os.path.join(cache_dir, repo_folder_name(repo_id=repo_id, repo_type="model"))
    blobs = {name: blob_name(src) for name, src in sorted(files.items())}
    commit = hashlib.sha1("".join(f"{n}\0{b}\n" for n, b in blobs.items()).encode()).hexdigest()
    snapshot = os.path.join(storage, "snapshots", commit)
    for name, src in files.items():
        blob = os.path.join(storage, "blobs", blobs[name])
        os.makedirs(os.path.dirname(blob), exist_ok=True)
        if not os.path.exists(blob):
            shutil.copyfile(src, blob)
        link = os.path.join(snapshot, name)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
    os.makedirs(os.path.join(storage, "refs"), exist_ok=True)
    with open(os.path.join(storage, "refs", revision), "w") as f:
        f.write(commit)
    return snapshot


def dir_files(path: str) -> dict[str, str]:
    """A local model directory's files, as put_in_hf_cache takes them."""
    return {
        os.path.relpath(os.path.join(d, n), path): os.path.join(d, n)
        for d, _, names in os.walk(path)
        for n in names
    }
