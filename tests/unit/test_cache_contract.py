"""The scheduler asks a prefix cache for its capabilities, never for its attributes (issue 89).

What a cache does beyond BasePrefixCache's methods it declares in `capabilities()`
(CacheCapabilities); a pool's windowed layers are TokenToKVPool.window. The rule, checked on the
source (ast) of every module under radixlm/scheduler and radixlm/cache:

1. no `hasattr(...)` call at all: a capability, a typed attribute of the interface or isinstance
   on a typing Protocol says what an object can do;
2. no `getattr(x, "<string constant>", ...)`: with a constant name it is an attribute read with a
   fallback, i.e. a probe, unless x is
   - a module the file binds with `import` (a platform feature: mmap.MADV_HUGEPAGE), or
   - a config or arguments object: x's last name is `config`, `args`, `cfg`, or ends in `_config`,
     `_args` (options are data, read by name);
   getattr with a computed name (dataclass fields, registry lookups) is not a probe;
3. under radixlm/scheduler only: no `isinstance(x, C)` where C (or one in a tuple of classes) is a
   class radixlm/cache defines, other than a typing Protocol: the scheduler asks what a cache can
   do, not which one it is.

The finder runs on small sources with and without each fault, so that a pass means the probes are
gone, not that the finder is blind. The last test pins which cache declares what.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCOPE = ("radixlm/scheduler", "radixlm/cache")
CONFIG_NAME = re.compile(r"^(config|args|cfg)$|_(config|args)$")


def last_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def imported_modules(tree: ast.Module) -> set[str]:
    """The names `import a.b [as c]` binds anywhere in the file (lazy imports too)."""
    return {
        alias.asname or alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }


def protocol_free_classes(sources: dict[str, str]) -> set[str]:
    """Names of the classes the sources define, but typing Protocols."""
    return {
        node.name
        for source in sources.values()
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef) and "Protocol" not in map(last_name, node.bases)
    }


def probes(source: str, rel: str, cache_classes: set[str], scheduler: bool) -> list[str]:
    """The module's probes by the rule above, as 'rel:line: what'."""
    tree = ast.parse(source)
    modules = imported_modules(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        fn, args = node.func.id, node.args
        if fn == "hasattr":
            found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
        elif fn == "getattr" and len(args) >= 2:
            name, obj = args[1], args[0]
            constant = isinstance(name, ast.Constant) and isinstance(name.value, str)
            module = isinstance(obj, ast.Name) and obj.id in modules
            config = CONFIG_NAME.search(last_name(obj) or "") is not None
            if constant and not (module or config):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
        elif fn == "isinstance" and scheduler and len(args) == 2:
            classes = args[1].elts if isinstance(args[1], ast.Tuple) else [args[1]]
            if any(last_name(c) in cache_classes for c in classes):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def scope_probes(root: Path) -> list[str]:
    files = {
        p.relative_to(root).as_posix(): p.read_text()
        for d in SCOPE
        for p in sorted((root / d).rglob("*.py"))
    }
    cache_classes = protocol_free_classes(
        {rel: s for rel, s in files.items() if rel.startswith("radixlm/cache/")}
    )
    return [
        hit
        for rel, source in files.items()
        for hit in probes(source, rel, cache_classes, rel.startswith("radixlm/scheduler/"))
    ]


# ----------------------------------------------------------------------------- the rule
def test_scheduler_and_caches_do_not_probe_attributes():
    found = scope_probes(ROOT)
    assert not found, "attribute probes (see this module's docstring):\n" + "\n".join(found)


# ----------------------------------------------------------------------------- the finder
CACHE = "class RadixCache:\n    pass\n\nclass HostTier(Protocol):\n    pass\n"


@pytest.mark.parametrize(
    "code, scheduler, flagged",
    [
        ('self.keeps = hasattr(tree, "attach_state")', False, True),
        ('ok = hasattr(config, "x")', False, True),  # hasattr: never
        ('w = getattr(pool, "window", 0)', False, True),
        ('w = getattr(x, "host_state", None)', False, True),
        ('self.e = getattr(self, "free_epoch", 0) + 1', False, True),
        ('b = getattr(self.backend, "bytes", None)', False, True),
        ("v = getattr(self, name)", False, False),  # a computed name
        ("v = getattr(r, f.name)", False, False),
        ('import mmap\nh = getattr(mmap, "MADV_HUGEPAGE", None)', False, False),
        ('h = getattr(mmap, "MADV_HUGEPAGE", None)', False, True),  # not imported: not a module
        ('d = getattr(config, "disable_x", False)', False, False),
        ('d = getattr(self.server_args, "x", 0)', False, False),
        ('d = getattr(self.hicache_config, "x", 0)', False, False),
        ("ok = isinstance(tree, RadixCache)", True, True),
        ("ok = isinstance(tree, (int, cache.RadixCache))", True, True),
        ("ok = isinstance(tree, RadixCache)", False, False),  # a cache module's own classes
        ("ok = isinstance(pool, HostTier)", True, False),  # a Protocol
        ("ok = isinstance(msg, BindSessionReq)", True, False),
    ],
)
def test_probe_finder(code, scheduler, flagged):
    cache_classes = protocol_free_classes({"c.py": CACHE})
    found = probes(textwrap.dedent(code), "m.py", cache_classes, scheduler)
    assert bool(found) == flagged, found


def test_probe_finder_walks_the_scope(tmp_path):
    for d in SCOPE:
        (tmp_path / d / "kv").mkdir(parents=True)
    (tmp_path / "radixlm/cache/radix_cache.py").write_text(CACHE)
    tracker = tmp_path / "radixlm/scheduler/kv/tracker.py"
    tracker.write_text("def f(tree):\n    return tree.capabilities().tracks_windows\n")
    assert scope_probes(tmp_path) == []
    tracker.write_text("def f(tree):\n    return isinstance(tree, RadixCache)\n")
    assert scope_probes(tmp_path) == [
        "radixlm/scheduler/kv/tracker.py:2: isinstance(tree, RadixCache)"
    ]


# ----------------------------------------------------------------------------- the declarations
def test_every_cache_declares_its_capabilities():
    """Each cache kind the factory builds says what it does; a new kind must be added here."""
    from radixlm.cache.base_prefix_cache import CacheCapabilities

    kinds = cache_kinds()
    snapshots, windows = (
        CacheCapabilities(keeps_state_snapshots=True),
        CacheCapabilities(tracks_windows=True),
    )
    expected = {
        "NoPrefixCache": CacheCapabilities(shares_prefixes=False),
        "RadixCache": CacheCapabilities(),
        "HiRadixCache": CacheCapabilities(),
        "MambaRadixCache": snapshots,
        "HiMambaRadixCache": snapshots,
        "SWARadixCache": windows,
    }
    assert set(kinds) == set(expected)
    for name, cls in kinds.items():
        # object.__new__: a declaration depends on the kind, not on a built pool
        assert cls.capabilities(object.__new__(cls)) == expected[name], name


# ----------------------------------------------------------------------------- the parts
def cache_kinds() -> dict[str, type]:
    from radixlm.cache.base_prefix_cache import BasePrefixCache

    for mod in pkgutil.iter_modules([str(ROOT / "radixlm/cache")]):
        importlib.import_module(f"radixlm.cache.{mod.name}")
    kinds, todo = {}, [BasePrefixCache]
    while todo:
        for sub in todo.pop().__subclasses__():
            kinds[sub.__name__] = sub
            todo.append(sub)
    return kinds


def test_parts_declare_the_capabilities():
    """A tree's capabilities are what its parts declare (payloads.py), and each part names a
    real CacheCapabilities field and a real TreeNode payload slot."""
    from dataclasses import fields

    from radixlm.cache.base_prefix_cache import CacheCapabilities
    from radixlm.cache.payloads import CachePart, HostSlots, StateSnapshot, WindowedKV
    from radixlm.cache.tree_node import PAYLOAD_SLOTS

    assert {p.__name__: (p.NODE_SLOT, p.CACHE_CAPABILITY) for p in CachePart.__subclasses__()} == {
        "HostSlots": ("host", None),
        "StateSnapshot": ("snapshot", "keeps_state_snapshots"),
        "WindowedKV": (None, "tracks_windows"),
    }
    flags = {f.name for f in fields(CacheCapabilities)}
    for part in (HostSlots, StateSnapshot, WindowedKV):
        assert part.CACHE_CAPABILITY is None or part.CACHE_CAPABILITY in flags
        assert part.NODE_SLOT is None or part.NODE_SLOT in PAYLOAD_SLOTS
    expected = {
        "RadixCache": (),
        "HiRadixCache": (HostSlots,),
        "MambaRadixCache": (StateSnapshot,),
        "HiMambaRadixCache": (HostSlots, StateSnapshot),
        "SWARadixCache": (WindowedKV,),
    }
    for name, cls in cache_kinds().items():
        if name in expected:
            assert cls.PARTS == expected[name], name
            assert cls.capabilities(object.__new__(cls)) == CacheCapabilities.of(cls.PARTS), name


def test_nodes_carry_only_their_trees_payloads():
    """A plain tree's nodes have no variant fields; a variant's nodes (root, leaves, split halves)
    each get their own payload of every part; the old variant-only fields are gone."""
    from radixlm.cache.payloads import HostSlots, StateSnapshot
    from radixlm.cache.tree_node import TreeNode

    plain = TreeNode([1, 2, 3])
    assert plain.host is None and plain.snapshot is None
    for old in ("host_value", "host_lock", "hit_count", "state", "host_state", "ends_answer"):
        with pytest.raises(AttributeError):
            setattr(plain, old, 1)
    both = TreeNode([1, 2, 3], parts=(HostSlots, StateSnapshot))
    assert isinstance(both.host, HostSlots) and isinstance(both.snapshot, StateSnapshot)
    assert TreeNode(parts=(HostSlots,)).host is not both.host
    both.host.value, both.host.lock, both.host.hits = torch.arange(3), 1, 2
    both.snapshot.slot, both.snapshot.host_slot, both.snapshot.ends_answer = 4, 5, True
    upper = TreeNode([1])
    both.split_payloads(upper, 1)
    assert upper.host.value.tolist() == [0] and both.host.value.tolist() == [1, 2]
    assert (upper.host.lock, upper.host.hits) == (1, 2)
    # the snapshot is after the edge's last token: it stays with the lower half
    assert not upper.snapshot.held() and not upper.snapshot.ends_answer
    assert (both.snapshot.slot, both.snapshot.host_slot) == (4, 5)
