"""The tests' servers forked from a preloaded process instead of exec'd.

`python -m radixlm.cli serve ...` spends ~4 s of CPU importing torch and transformers before it
does anything, at every start, and the suite starts a server some two hundred times. Here
`ServerProcess` (radixlm/server/process.py) starts `radixlm.cli` commands as children of this
process's fork server (radixlm/engine/process_context.py), which imported those modules once: the
child takes the command's environment, directory and output file, then runs `radixlm.cli.main`
with the command's arguments, as `python -m radixlm.cli` would. Everything the server does from
there on is the same code, its own children included (they fork from it).

`ForkedPopen` is what the tests read of subprocess.Popen: pid, poll, wait, returncode, signals.
A command that is not `python -m radixlm.cli`, or whose environment differs from the fork server's
in what the preloaded modules read at import, is exec'd as before; so is every command inside
`exec_servers()`, for tests about the process itself (its command line, `/proc/<pid>/environ`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from radixlm.engine import process_context
from radixlm.server.process import ServerProcess

_CLI = ["-m", "radixlm.cli"]


def _serve(outputs, argv: list[str], environ: dict[str, str], cwd: str, preexec) -> None:
    """The forked child: the command's environment, directory and output (outputs: stdout's and
    stderr's descriptors), then the CLI's main."""
    import atexit

    from radixlm.utils import kill_itself_when_parent_died

    fds = [out.detach() for out in outputs]
    for fd, target in zip(fds, (1, 2)):
        os.dup2(fd, target)
    for fd in set(fds):
        os.close(fd)
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    kill_itself_when_parent_died()  # as an exec'd server does with its test process gone
    if preexec is not None:
        preexec()
    sys.argv = ["radixlm", *argv]
    from radixlm.cli import main

    try:
        code = main(argv)
    finally:
        atexit._run_exitfuncs()  # what an interpreter runs at exit; multiprocessing skips them
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)


class ForkedPopen:
    """A `radixlm.cli` command run by a child of the fork server, with Popen's interface. stdout:
    a file, or PIPE; stderr: a file, PIPE or STDOUT. PIPE is a temporary file here, read by
    communicate() once the command ended (nothing streams from it before)."""

    def __init__(self, args, stdout=None, stderr=None, text=None, preexec_fn=None, env=None):
        import tempfile
        from multiprocessing import reduction

        ctx = process_context.fork_server_context(env)
        assert ctx is not None and stdout is not None and stderr is not None
        self.args = args
        self.returncode: int | None = None
        self._text = text
        self._captured = {}
        files = []
        for name, target in (("stdout", stdout), ("stderr", stderr)):
            if target == subprocess.PIPE:
                target = self._captured[name] = tempfile.TemporaryFile()
            elif target == subprocess.STDOUT:
                target = files[0]
            files.append(target)
        self._process = process_context.child_process(
            ctx,
            _serve,
            (
                [reduction.DupFd(f.fileno()) for f in files],
                list(args[len(_CLI) + 1 :]),
                dict(os.environ if env is None else env),
                os.getcwd(),
                preexec_fn,
            ),
            name="radixlm " + " ".join(args[len(_CLI) + 1 : len(_CLI) + 2]),
        )
        self._process.daemon = False  # a server starts processes of its own
        self._process.start()
        self.pid = self._process.pid

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None):
        """(stdout, stderr) as Popen gives them: what went to a PIPE, else None."""
        self.wait(timeout)
        out = []
        for name in ("stdout", "stderr"):
            f = self._captured.pop(name, None)
            if f is None:
                out.append(None)
                continue
            f.seek(0)
            data = f.read()
            f.close()
            out.append(data.decode() if self._text else data)
        return tuple(out)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_forking = True


def popen(args, **kwargs):
    """ServerProcess.popen for the tests: fork `python -m radixlm.cli ...` where it can."""
    env = kwargs.get("env")
    forkable = (
        _forking
        and list(args[1:3]) == _CLI
        and args[0] == sys.executable
        and set(kwargs) <= {"stdout", "stderr", "text", "preexec_fn", "env"}
        and process_context.fork_server_context(env) is not None
    )
    return ForkedPopen(args, **kwargs) if forkable else subprocess.Popen(args, **kwargs)


def cli_popen(argv: list[str], env=None) -> subprocess.Popen | ForkedPopen:
    """`python -m radixlm.cli ARGV` with its stdout and stderr captured (communicate()), forked
    where it can be: for the tests of what a command prints and exits with."""
    return popen(
        [sys.executable, *_CLI, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def run_cli(argv: list[str], env=None, timeout: float = 300) -> subprocess.CompletedProcess:
    """subprocess.run of `python -m radixlm.cli ARGV`, capture_output=True, text=True; forked
    where it can be."""
    proc = cli_popen(argv, env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@contextlib.contextmanager
def exec_servers():
    """Servers started meanwhile are exec'd, as outside the tests."""
    global _forking
    old, _forking = _forking, False
    try:
        yield
    finally:
        _forking = old


# What a server's start imports beyond the engine's preload (radixlm's own modules, FastAPI,
# uvicorn, zmq: ~1 s of CPU a start), imported once by the fork server instead. None of them reads
# the environment when imported.
SERVER_PRELOAD = (
    "radixlm.cli",
    "radixlm.router.launch",
    "radixlm.server.launch",
    "radixlm.server.http_server",
    "radixlm.server.metrics",
    "radixlm.engine.launcher",
    "radixlm.engine.detokenizer",
    "radixlm.scheduler.scheduler",
    "uvicorn",
)


def install() -> None:
    process_context.preload_also(*SERVER_PRELOAD)
    ServerProcess.popen = popen
