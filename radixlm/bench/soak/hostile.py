"""The soak's hostile side (docs/reliability.md, "Hostile load"): while the normal mix runs,
attackers send what issue 35's findings describe, each on its own connections, and a prober times
/health.

- redos: a catastrophic stop_regex with a logit_bias that forces its character (400 or 200, never a
  frozen scheduler);
- fan-out: a batch x n past --max-client-batch-size (400), a /tokenize text past the context (400);
- template bomb: a client's own Jinja chat_template in chat_template_kwargs (400);
- slow loris: connections that send a header byte now and then and never finish their request;
- forged cache files (when given the L3 directory): stored chunks flipped, truncated, swapped for
  another chunk's file, a symlink or a FIFO — the server must treat each as a cache miss.

Checks: /health answered 200 within `health_bound` seconds every time it was asked; each attack got
one of its expected statuses (never a 5xx); the normal requests keep the soak's own checks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import stat
import time
from collections import Counter
from urllib.parse import urlsplit

from radixlm.cache.storage import SUFFIX

BOMB = "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}"


@dataclasses.dataclass
class HostileConfig:
    interval: float = 2.0  # seconds between two attacks of one attacker
    health_interval: float = 0.5
    health_bound: float = 2.0  # /health must answer 200 within this, every time
    slow_loris: int = 16  # connections held open, a header byte every few seconds
    forge_dir: str | None = None  # the server's --hicache-storage-dir: its chunk files get forged
    seed: int = 0
    # Behind a gateway (fleet.py): a server that answers what the gateway does not serve
    # (/get_server_info, /tokenize, /v1/models; the oversized /tokenize goes there too).
    server_url: str | None = None
    # Statuses allowed beyond EXPECTED's, by attack: sglang-router refuses a batch of texts itself
    # (422: its /generate takes one text).
    also_expected: dict[str, set] = dataclasses.field(default_factory=dict)


# what each attack may be answered with (a ReDoS either stops on its budget, 400, or finishes)
EXPECTED = {"redos": {200, 400}, "fanout": {400}, "tokenize": {400}, "template": {400}}


class HostileLoad:
    """Attackers and the /health prober, run until `stop` is set; summary() holds their checks."""

    name = "hostile"

    def __init__(self, cfg: HostileConfig):
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.health: list[float] = []  # latency of each /health answered 200
        self.health_failures: list[str] = []
        self.attacks: dict[str, Counter] = {k: Counter() for k in EXPECTED}
        self.forged: Counter = Counter()
        self.loris_opened = 0

    async def run(self, url: str, stop: asyncio.Event) -> None:
        import httpx

        # Own connections: the normal load's client pool must not delay the prober or the attackers.
        server = self.cfg.server_url or url
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=10.0)) as client:
            info = (await client.get(server + "/get_server_info")).json()
            x_ids = (await client.post(server + "/tokenize", json={"text": "x"})).json()["tokens"]
            model = (await client.get(server + "/v1/models")).json()["data"][0]["id"]
            tasks = [
                self._health(client, url, stop),
                self._loris(url, stop),
                self._every(stop, lambda: self._redos(client, url, x_ids[-1])),
                self._every(stop, lambda: self._fanout(client, url, server, info["context_len"])),
                self._every(stop, lambda: self._template(client, url, model)),
            ]
            if self.cfg.forge_dir:
                tasks.append(self._every(stop, self._forge))
            await asyncio.gather(*tasks)

    async def _every(self, stop: asyncio.Event, attack) -> None:
        while not stop.is_set():
            await attack()
            try:
                await asyncio.wait_for(stop.wait(), self.cfg.interval * (0.5 + self.rng.random()))
            except TimeoutError:
                pass

    async def _health(self, client, url: str, stop: asyncio.Event) -> None:
        """Time /health from a process of its own: in this event loop the time would include the
        loop's lag behind the normal load's clients, which is the client's, not the server's."""
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        halt, (results, sink) = ctx.Event(), ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_probe_health,
            args=(url, self.cfg.health_bound, self.cfg.health_interval, halt, sink),
            daemon=True,
        )
        proc.start()
        await stop.wait()
        halt.set()
        if await asyncio.to_thread(results.poll, 60):
            self.health, self.health_failures = results.recv()
        else:
            self.health_failures = ["the /health prober process sent nothing"]
        await asyncio.to_thread(proc.join, 30)

    async def _post(self, client, kind: str, url: str, body: dict) -> None:
        import httpx

        try:
            r = await client.post(url, json=body)
            self.attacks[kind][r.status_code] += 1
        except httpx.HTTPError as e:
            self.attacks[kind][type(e).__name__] += 1

    async def _redos(self, client, url: str, x_id: int) -> None:
        sp = {
            "max_new_tokens": 256,
            "stop_regex": "(x|xx)+z",
            "logit_bias": {str(x_id): 100.0},
            "temperature": 0,
        }
        await self._post(client, "redos", url + "/generate", {"text": "x", "sampling_params": sp})

    async def _fanout(self, client, url: str, server: str, context_len: int) -> None:
        await self._post(
            client,
            "fanout",
            url + "/generate",
            {"text": ["hi"] * 256, "sampling_params": {"n": 64, "max_new_tokens": 4}},
        )
        await self._post(
            client, "tokenize", server + "/tokenize", {"text": "word " * (4 * context_len)}
        )

    async def _template(self, client, url: str, model: str) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "chat_template_kwargs": {"chat_template": BOMB},
        }
        await self._post(client, "template", url + "/v1/chat/completions", body)

    async def _loris(self, url: str, stop: asyncio.Event) -> None:
        """Connections that start a request and feed it a header byte every few seconds, never
        ending it."""
        u = urlsplit(url)
        writers = []
        try:
            for _ in range(self.cfg.slow_loris):
                _, w = await asyncio.open_connection(u.hostname, u.port)
                w.write(
                    f"POST /generate HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type:"
                    " application/json\r\nX-a: ".encode()
                )
                writers.append(w)
                self.loris_opened += 1
            while not stop.is_set():
                for w in writers:
                    if not w.is_closing():
                        w.write(b"a")
                try:
                    await asyncio.wait_for(stop.wait(), 3.0)
                except TimeoutError:
                    pass
        except OSError:  # the server may refuse or close them: that is allowed
            pass
        finally:
            for w in writers:
                w.close()

    async def _forge(self) -> None:
        """Tamper with one stored chunk file, as a local user with write access to the directory
        could."""
        d = self.cfg.forge_dir
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(SUFFIX))
        except OSError:
            return
        if not names:
            return
        path = os.path.join(d, self.rng.choice(names))
        kind = self.rng.choice(["flip", "truncate", "swap", "symlink", "fifo"])
        try:
            if kind in ("flip", "truncate"):
                with _open_regular(path, os.O_RDWR) as f:
                    size = os.fstat(f.fileno()).st_size
                    if kind == "truncate":
                        f.truncate(size // 2)
                    else:
                        f.seek(self.rng.randrange(max(1, size)))
                        f.write(os.urandom(8))
            elif (
                kind == "swap" and len(names) > 1
            ):  # another chunk's genuine file under this chunk's name
                other = os.path.join(
                    d, self.rng.choice([n for n in names if n != os.path.basename(path)])
                )
                with _open_regular(other, os.O_RDONLY) as src:
                    data = src.read()
                with _open_regular(path, os.O_WRONLY) as dst:
                    dst.truncate(0)
                    dst.write(data)
            elif kind == "symlink":
                os.replace(_symlink_beside(path, "/dev/zero"), path)
            elif kind == "fifo":
                tmp = path + ".fifo"
                os.mkfifo(tmp)
                os.replace(tmp, path)
            else:
                return
            self.forged[kind] += 1
        except (OSError, _NotRegular):
            # the server removed or replaced it meanwhile, or an earlier forgery left a link or FIFO
            # there
            pass

    def summary(self) -> dict:
        attacks = {k: {str(s): n for s, n in v.items()} for k, v in self.attacks.items()}
        allowed = {k: EXPECTED[k] | self.cfg.also_expected.get(k, set()) for k in EXPECTED}
        unexpected = {
            k: {s: n for s, n in v.items() if s not in allowed[k]} for k, v in self.attacks.items()
        }
        unexpected = {k: {str(s): n for s, n in v.items()} for k, v in unexpected.items() if v}
        checks = {
            "health_within_bound": bool(self.health) and not self.health_failures,
            "attacks_refused": (
                not unexpected and all(sum(v.values()) > 0 for v in self.attacks.values())
            ),
            "slow_loris_held": self.loris_opened == self.cfg.slow_loris,
        }
        if self.cfg.forge_dir:
            checks["files_forged"] = sum(self.forged.values()) > 0
        return {
            "checks": checks,
            "health_probes": len(self.health) + len(self.health_failures),
            "health_max_s": round(max(self.health, default=0.0), 3),
            "health_failures": self.health_failures[:20],
            "attacks": attacks,
            "unexpected": unexpected,
            "forged": dict(self.forged),
            "slow_loris": self.loris_opened,
        }


class _NotRegular(Exception):
    pass


def _open_regular(path: str, flags: int):
    """A regular file opened unbuffered, never through a symlink and never blocking on a FIFO (the
    forger's own earlier work may sit under any name)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _NotRegular(path)
    return os.fdopen(
        fd, "rb" if flags == os.O_RDONLY else "r+b" if flags == os.O_RDWR else "wb", buffering=0
    )


def _symlink_beside(path: str, target: str) -> str:
    tmp = path + ".lnk"
    os.symlink(target, tmp)
    return tmp


def _probe_health(url: str, bound: float, interval: float, halt, sink) -> None:
    """The prober's process: GET /health every `interval` s until `halt`; sends (latencies,
    failures)."""
    import httpx

    ok, failures = [], []
    with httpx.Client(timeout=bound) as client:
        while not halt.is_set():
            t0 = time.perf_counter()
            try:
                r = client.get(url + "/health")
                dt = time.perf_counter() - t0
                if r.status_code == 200 and dt <= bound:
                    ok.append(dt)
                else:
                    failures.append(f"{r.status_code} after {dt:.2f} s")
            except httpx.HTTPError as e:
                failures.append(f"{type(e).__name__} after {time.perf_counter() - t0:.2f} s")
            halt.wait(interval)
    sink.send((ok, failures))
