"""Scheduling policies keep outputs exact; priorities order admission; CLI; no orphan processes."""

import random
import signal
import subprocess
import sys
import time

import psutil
import pytest

from radixlm import Engine
from tests.conftest import engine_args
from tests.forked_servers import run_cli


def rand_prompt(rng, n):
    return [rng.randrange(3, 40000) for _ in range(n)]


def test_every_policy_gives_the_same_greedy_outputs(tiny_model_dir):
    """The scheduler driven in-process (tests/scheduler/harness.py: no engine processes, every
    request queued before the first step, so the policy alone decides who runs first)."""
    from tests.scheduler.harness import Driver, make_scheduler

    rng = random.Random(0)
    shared = rand_prompt(rng, 40)
    prompts = [shared + rand_prompt(rng, rng.randint(1, 20)) for _ in range(6)] + [
        rand_prompt(rng, 30) for _ in range(4)
    ]
    rng.shuffle(prompts)
    sp = [
        {"max_new_tokens": rng.randint(4, 16), "temperature": 0, "ignore_eos": True}
        for _ in prompts
    ]
    results = {}
    for policy in ("fcfs", "lpm", "dfs-weight", "lof", "random"):
        # max_running_requests 3: the policy decides who runs first, and later arrivals hit the
        # cache.
        d = Driver(
            make_scheduler(
                tiny_model_dir, schedule_policy=policy, max_running_requests=3, kv_memory_gb=0.05
            )
        )
        rids = [d.submit(p, **s) for p, s in zip(prompts, sp)]
        d.run()
        assert all(d.results[r].finishes == 1 for r in rids)
        results[policy] = [d.results[r].output_ids for r in rids]
        if policy in ("lpm", "dfs-weight"):
            assert sum(d.results[r].cached_tokens for r in rids) >= 5 * 39
    assert all(r == results["fcfs"] for r in results.values())


def test_priority_runs_first(tiny_model_dir):
    rng = random.Random(1)
    prompts = [rand_prompt(rng, 20) for _ in range(5)]
    sp = [
        {"max_new_tokens": 40 if i == 0 else 8, "temperature": 0, "ignore_eos": True}
        for i in range(5)
    ]
    with Engine(
        tiny_model_dir,
        **engine_args(
            max_running_requests=1, schedule_policy="fcfs", enable_priority_scheduling=True
        ),
    ) as e:
        # Request 0 (top priority) holds the only slot while the others queue up behind it.
        outs = e.generate(input_ids=prompts, sampling_params=sp, priority=[100, 0, 0, 0, 10])
    lat = [o["meta_info"]["e2e_latency"] for o in outs]
    assert lat[0] < lat[4] < min(lat[1:4]), f"priority order not kept: {lat}"


def test_cli_generate(tiny_model_dir):
    # Forked from the tests' preloaded fork server (run_cli): the command as a user runs it.
    out = run_cli(
        [
            "generate",
            "--model",
            tiny_model_dir,
            "--prompt",
            "Hello",
            "--max-new-tokens",
            "5",
            "--temperature",
            "0",
            "--ignore-eos",
            "--json",
            "--num-threads",
            "1",
            "--enable-invariant-checks",
        ],
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert '"completion_tokens": 5' in out.stdout
    bad = run_cli(["generate", "--model", "/no/such/model", "--prompt", "x"], timeout=120)
    assert bad.returncode != 0 and "/no/such/model" in bad.stderr


def _children_of(pid):
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


SCRIPT = """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for a traceback if it hangs
from radixlm import Engine
e = Engine(sys.argv[1], num_threads=1, kv_memory_gb=0.05, log_level="warning", enable_invariant_checks=True)
print("ready", flush=True)
e.generate("hi", {"max_new_tokens": 2})
{tail}
"""


@pytest.mark.parametrize("how", ["exit", "sigint", "sigkill"])
def test_no_orphan_processes(tiny_model_dir, how, tmp_path):
    tail = {
        "exit": "print('done', flush=True)",
        "sigint": "time.sleep(600)",
        "sigkill": "time.sleep(600)",
    }[how]
    err = open(tmp_path / "stderr", "w+")  # a file, not a pipe: a chatty child never blocks on it
    # SIGINT back to its default in the child: a test run started in the background (`cmd &` in a
    # script) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt.
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT.replace("{tail}", tail), tiny_model_dir],
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout.readline().strip() == "ready"
    kids = _children_of(proc.pid)
    assert len(kids) >= 2, "scheduler and detokenizer processes"
    if how == "sigint":
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
    elif how == "sigkill":
        proc.kill()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # every thread's stack, to stderr
        time.sleep(2)
        proc.kill()
        proc.wait()
        err.seek(0)
        pytest.fail(
            f"the engine process did not exit after {how}; its stacks and"
            f" stderr:\n{err.read()[-6000:]}"
        )
    gone, alive = psutil.wait_procs(kids, timeout=20)
    assert not alive, f"orphans after {how}: {[p.pid for p in alive]}"
