"""ProgramState (the `s` a program writes to) and ForkGroup. Each state runs its `+=` operations
in order on its own worker thread, one backend call per gen/select; reading the state (s["x"],
s.text(), fork, join) waits for what was queued before, so forks run concurrently."""

from __future__ import annotations

import copy
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from radixlm.lang import choices as choices_mod
from radixlm.lang.base_backend import Prompt
from radixlm.lang.ir import Expr, Gen, Image, RoleBegin, RoleEnd, Select, Seq, sampling_params

_END = object()


def _image_b64(path: str) -> str:
    import base64

    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


class ProgramState:
    def __init__(
        self, backend, defaults: dict | None = None, stream: bool = False, precache: bool = True
    ):
        if backend is None:
            raise ValueError("no backend: pass backend= or call radixlm.lang.set_default_backend()")
        self.backend = backend
        self.defaults = dict(defaults or {})
        self.stream = stream
        self.precache = precache  # fork() sends the shared prefix first
        self.fork_prefill_meta: dict | None = None
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.ret_value: Any = None
        self._text = ""
        self._images: list[str] = []  # image(): base64, one per image token in _text
        self._messages: list[dict] = []
        self._role: tuple[str, int] | None = None  # open role and where its content starts
        self._error: BaseException | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list[Future] = []
        self._lock = threading.Lock()
        self._chunks: queue.Queue = queue.Queue()

    # ------------------------------------------------------------ queueing
    def __iadd__(self, expr) -> ProgramState:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="radixlm-lang")
            self._futures.append(self._pool.submit(self._run_op, expr))
        return self

    def sync(self) -> ProgramState:
        """Wait for every queued operation; re-raise the first error."""
        while True:
            with self._lock:
                futs, self._futures = self._futures, []
                if not futs:
                    if self._pool is not None:
                        self._pool.shutdown(wait=False)
                        self._pool = None
                    break
            for f in futs:
                f.result()
        if self._error is not None:
            raise self._error
        return self

    def _run_op(self, expr) -> None:
        if self._error is not None:
            return
        try:
            self._exec(expr)
        except BaseException as e:
            self._error = e

    # ------------------------------------------------------------ interpreter
    def _exec(self, expr) -> None:
        if isinstance(expr, str):
            self._append(expr)
        elif isinstance(expr, Seq):
            for item in expr.items:
                self._exec(item)
        elif isinstance(expr, Gen):
            self._gen(expr)
        elif isinstance(expr, Select):
            self._select(expr)
        elif isinstance(expr, RoleBegin):
            if self._role is not None:
                raise ValueError(f"{expr.role}() inside an open {self._role[0]}()")
            first = not self._messages
            self._append(self.backend.chat_template.prefix(expr.role, first))
            self._role = (expr.role, len(self._text))
        elif isinstance(expr, RoleEnd):
            if self._role is None or self._role[0] != expr.role:
                raise ValueError(f"{expr.role}_end() without {expr.role}_begin()")
            role, start = self._role
            self._messages.append({"role": role, "content": self._text[start:]})
            self._role = None
            self._append(self.backend.chat_template.suffix(role))
        elif isinstance(
            expr, Image
        ):  # as SGLang's frontend: the image token here, the image as image_data
            self._images.append(_image_b64(expr.path))
            self._append(self.backend.image_token)
        elif isinstance(expr, Expr):
            raise TypeError(f"cannot execute {type(expr).__name__}")
        else:
            raise TypeError(
                f"s += expects a string or gen/select/role expression, got {type(expr).__name__}"
            )

    def _append(self, text: str, var: str | None = None) -> None:
        self._text += text
        if self.stream and text:
            self._chunks.put((var, text))

    def _sampling(self, g: Gen) -> dict:
        merged = {"max_tokens": 128, **self.defaults}
        merged.update({k: v for k, v in g.params.items() if v is not None})
        return sampling_params(merged)

    def _prompt(self) -> Prompt:
        role, start = self._role if self._role else (None, len(self._text))
        return Prompt(self._text, self._messages, role, self._text[start:], list(self._images))

    def _gen(self, g: Gen) -> None:
        sp = self._sampling(g)
        if g.tools is not None:
            sp.update(g.tools.sampling_params())
        if self.stream:
            out, sent = None, 0
            for out in self.backend.generate_stream(self._prompt(), sp, g.logprob):
                delta = out["text"][sent:]
                sent = len(out["text"])
                self._append(delta, g.name)
            text = out["text"] if out else ""
        else:
            out = self.backend.generate(self._prompt(), sp, g.logprob)
            text = out["text"]
            self._append(text, g.name)
        if g.name is not None:
            self.variables[g.name] = text
            self.meta_info[g.name] = out["meta_info"] if out else {}
            if g.tools is not None:
                calls, content = g.tools.parse(text)
                self.variables[g.name] = calls
                self.meta_info[g.name] = {**self.meta_info[g.name], "content": content}

    def _select(self, sel: Select) -> None:
        method = choices_mod.resolve(sel.choices_method)
        if self._images:
            raise NotImplementedError(
                "select() after image(): choices are scored by token ids, which carry no image"
            )
        idx, meta = self.backend.select(self._prompt(), sel.choices, method)
        choice = sel.choices[idx]
        self._append(choice, sel.name)
        if sel.name is not None:
            self.variables[sel.name] = choice
            self.meta_info[sel.name] = meta

    # ------------------------------------------------------------ reading
    def text(self) -> str:
        return self.sync()._text

    def messages(self) -> list[dict]:
        return copy.deepcopy(self.sync()._messages)

    def __getitem__(self, name: str):
        return self.sync().variables[name]

    def __contains__(self, name: str) -> bool:
        return name in self.sync().variables

    def get_var(self, name: str):
        return self[name]

    def set_var(self, name: str, value) -> None:
        self.sync().variables[name] = value

    def get_meta_info(self, name: str):
        return self.sync().meta_info.get(name)

    def error(self) -> BaseException | None:
        try:
            self.sync()
        except BaseException:
            pass
        return self._error

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """With run(stream=True): the text as it is produced (only `var_name`'s, if given)."""
        if not self.stream:
            yield self.text() if var_name is None else self[var_name]
            return
        while True:
            item = self._chunks.get()
            if item is _END:
                self._chunks.put(_END)  # let another iterator finish too
                if self._error is not None:
                    raise self._error
                return
            var, chunk = item
            if var_name is None or var == var_name:
                yield chunk

    def _finish_stream(self) -> None:
        self._chunks.put(_END)

    # ------------------------------------------------------------ fork / join
    def fork(self, n: int = 1) -> ForkGroup:
        """n branch states that start from this state's text. The shared prefix is sent once
        first (no generation), so every branch's request hits the radix cache."""
        self.sync()
        if (
            self._text and self.precache and not self._images
        ):  # with images, the branches' first gens share it
            self.fork_prefill_meta = self.backend.prefill(self._text)
        branches = []
        for _ in range(n):
            b = ProgramState(self.backend, self.defaults, precache=self.precache)
            b._text, b._role, b._images = self._text, self._role, list(self._images)
            b.variables, b.meta_info = dict(self.variables), dict(self.meta_info)
            b._messages = copy.deepcopy(self._messages)
            branches.append(b)
        return ForkGroup(self, branches, len(self._text))

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class ForkGroup:
    """The branches of `s.fork(n)`; indexable and iterable. `join()` waits for them all and
    writes back to the parent."""

    def __init__(self, parent: ProgramState, branches: list[ProgramState], fork_pos: int):
        self.parent, self.branches, self.fork_pos = parent, branches, fork_pos

    def __len__(self) -> int:
        return len(self.branches)

    def __getitem__(self, i):
        return self.branches[i]

    def __iter__(self):
        return iter(self.branches)

    def __setitem__(
        self, i, value
    ) -> None:  # `for f in forks: f += ...` rebinds via iteration only,
        if value is not self.branches[i]:  # but `forks[i] += ...` calls this with the same object
            raise TypeError("cannot replace a fork branch")

    def join(self, mode: str = "gather_variable") -> None:
        """gather_variable: each variable a branch set becomes a list (one value per branch) in
        the parent. concate_and_append: the branches' new text is appended to the parent."""
        for b in self.branches:
            b.sync()
        p = self.parent.sync()
        if mode == "gather_variable":
            names = []
            for b in self.branches:
                for k, v in b.variables.items():
                    if k not in names and (k not in p.variables or v is not p.variables[k]):
                        names.append(k)
            for k in names:
                p.variables[k] = [b.variables.get(k) for b in self.branches]
                p.meta_info[k] = [b.meta_info.get(k) for b in self.branches]
        elif mode == "concate_and_append":
            p += "".join(b._text[self.fork_pos :] for b in self.branches)
            p.sync()
        else:
            raise ValueError(f"unknown join mode {mode!r}")
