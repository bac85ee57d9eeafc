"""The scheduler process: requests in, one batch per step through the model, news out.

Scheduler only orders its components; each concern is one of them (built in __init__, each in its
own file): intake.py (new requests, aborts, grammar compiles, prefetches), prefill_manager.py
(admission, chunked prefill), decode_manager.py (the running batch, retraction), executor.py (how a
batch runs: inline or overlapped), result_processor.py (tokens, stops, logprobs), finisher.py
(the end of a request), output_streamer.py (news for the detokenizer). A feature that may be off
is a component with a no-op twin, both implementing its interface; optional_components.py picks
which one runs. A request's lifecycle is its ReqStatus (req.py), which names the container of
req_queues.py that holds it. See docs/architecture.md, "Request flow" and "KV ownership".
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from radixlm.cache.base_prefix_cache import FLUSH_LEVELS
from radixlm.cache.factory import create_prefix_cache
from radixlm.cache.kv_event_publisher import create_kv_event_publisher
from radixlm.config import PortArgs
from radixlm.distributed.rank import beat
from radixlm.errors import start_failure_report
from radixlm.ipc import (
    AbortReq,
    ControlFailed,
    DashboardSnapshotReq,
    DashboardSnapshotReqOutput,
    FinishAbort,
    FlushCacheReq,
    FlushCacheReqOutput,
    GetInternalStateReq,
    GetInternalStateReqOutput,
    ProfileReq,
    ProfileReqOutput,
    TokenizedGenerateReqInput,
)
from radixlm.model.executor.runner import ModelRunner
from radixlm.model.layers.moe.moe_block import expert_load_info
from radixlm.sampling_params import brief_repr
from radixlm.scheduler.batching.admission import NewTokenRatio
from radixlm.scheduler.batching.decode_manager import DecodeManager
from radixlm.scheduler.batching.policy import SchedulePolicy
from radixlm.scheduler.batching.prefill_manager import PrefillLimits, PrefillManager
from radixlm.scheduler.channels import BaseSchedulerIO, SchedulerIO
from radixlm.scheduler.config import SchedulerConfig
from radixlm.scheduler.control.dashboard_probe import DashboardProbe
from radixlm.scheduler.control.lora_admin import LORA_MESSAGES, LORA_REPLIES, handle_lora_message
from radixlm.scheduler.control.profiler import Profiler
from radixlm.scheduler.control.slot_files import SLOT_MESSAGES, SLOT_REPLIES, handle_slot_message
from radixlm.scheduler.control.weight_control import WEIGHT_CONTROL_REPLIES, WeightControl
from radixlm.scheduler.decoding.grammar_manager import GrammarManager
from radixlm.scheduler.execution.overlap import follows_up
from radixlm.scheduler.hybrid_support import check_hybrid_support
from radixlm.scheduler.intake import RequestIntake
from radixlm.scheduler.invariants import InvariantError
from radixlm.scheduler.kv.cache_manager import CacheManager
from radixlm.scheduler.kv.prefetcher import Prefetcher
from radixlm.scheduler.kv.session_pins import SESSION_MESSAGES, create_session_pins
from radixlm.scheduler.kv.state_tracker import create_state_tracker
from radixlm.scheduler.lazy_tokenizer import LazyTokenizer
from radixlm.scheduler.optional_components import (
    create_executor,
    create_invariant_checks,
    create_jump_forward,
    create_prefill_fold,
    create_speculation,
)
from radixlm.scheduler.output.output_streamer import OutputStreamer
from radixlm.scheduler.output.result_processor import ResultProcessor
from radixlm.scheduler.parallel.dp_attention import BaseDPAttention, NoDPAttention
from radixlm.scheduler.parallel.tp_sync import BaseStepSync, NoStepSync
from radixlm.scheduler.pd.context import PDContext
from radixlm.scheduler.pd.mode import create_pd_mode, pd_finisher_class
from radixlm.scheduler.req_queues import ReqQueues
from radixlm.scheduler.stats import SchedulerStats

if TYPE_CHECKING:
    from radixlm.distributed.rank import RankSpec

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 1000  # nothing to do: wait this long for a message
PENDING_POLL_MS = 2  # only compiles or storage reads pending: look again soon
# The reply each control call waits for (ControlFailed names it when the call raised).
_CONTROL_REPLIES = {
    FlushCacheReq: FlushCacheReqOutput,
    GetInternalStateReq: GetInternalStateReqOutput,
    ProfileReq: ProfileReqOutput,
    **WEIGHT_CONTROL_REPLIES,
    **LORA_REPLIES,
    **SLOT_REPLIES,
    DashboardSnapshotReq: DashboardSnapshotReqOutput,
}


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        io: BaseSchedulerIO,
        sync: BaseStepSync = NoStepSync(),
        dp: BaseDPAttention = NoDPAttention(),
    ):
        """sync: how the ranks of a tensor-parallel group agree (tp_sync.py); dp: how DP-attention
        ranks keep their steps together (parallel/dp_attention.py); the no-op twins alone. The other
        optional components are chosen in optional_components.py."""
        self.config = config
        self.io = io
        self.sync = sync
        self.dp = dp
        self.runner = runner = ModelRunner(config.runner)
        check_hybrid_support(config, runner.loaded.architecture, runner.state_pool is not None)
        self.context_len = runner.context_len
        eos = frozenset(runner.loaded.eos_token_ids)
        self.tokenizer = LazyTokenizer(
            lambda: _load_tokenizer(config.tokenizer_path or runner.loaded.model_path)
        )
        self.tree_cache = create_prefix_cache(
            runner.token_to_kv_pool,
            config.disable_radix_cache,
            config.hicache,
            self._model_key,
            runner.state_pool,
        )
        self.kv_events = create_kv_event_publisher(config.kv_events)  # --kv-events-config
        self.tree_cache.set_kv_events(self.kv_events.sink)
        self.cache_manager = cm = CacheManager.create(
            runner.req_to_token_pool,
            runner.token_to_kv_pool,
            self.tree_cache,
            create_state_tracker(runner.state_pool, self.tree_cache, config.mamba_track_interval),
        )
        self.queues = queues = ReqQueues()
        self.stats = stats = SchedulerStats(runner.max_total_num_tokens)
        self.outputs = OutputStreamer(io, config.stream_interval)
        self.grammar = GrammarManager(
            config.grammar_backend, self.tokenizer, runner.vocab_size, eos, stats
        )
        # The optional components (optional_components.py): the real one, or its no-op twin.
        self.spec = create_speculation(config, self.tree_cache, runner, self.grammar, sync)
        self.executor = executor = create_executor(config, runner, cm, self.grammar, self.spec)
        self.sessions = create_session_pins(cm)  # open sessions' KV stays in the tree
        # PD prefill: a finished request's KV is kept until it was sent.
        finisher_cls = pd_finisher_class(config.disaggregation)
        self.finisher = finisher_cls(queues, cm, executor, self.spec, self.outputs, self.sessions)
        self.intake = RequestIntake(
            queues,
            self.grammar,
            Prefetcher(self.tree_cache),
            self.finisher,
            eos,
            sync,
            pool_all_tokens=runner.pooler is not None and runner.pooler.needs_all_tokens,
            lora=runner.lora,
        )
        ratio = NewTokenRatio(
            config.new_token_ratio, config.min_new_token_ratio, config.new_token_ratio_decay
        )
        self.policy = SchedulePolicy(config.schedule_policy, self.tree_cache, config.random_seed)
        chunk = None if runner.encoder_only else config.chunk_size  # an encoder reads them whole
        limits = PrefillLimits(runner.max_running_requests, config.max_prefill_tokens, chunk)
        fold = create_prefill_fold(config, self.spec)
        self.prefill = PrefillManager(
            queues, cm, self.policy, limits, ratio, stats, runner.lora, fold
        )
        self.decode = DecodeManager(
            queues, cm, self.finisher, self.spec, ratio, stats, self.context_len, executor.in_flight
        )
        # Mixed chunk: new requests' prefill and the running requests' decode step in one forward.
        self.mix = self.decode.mix_with_running if config.enable_mixed_chunk else (lambda p: p)
        jump = create_jump_forward(
            config, queues, cm, self.tokenizer, stats, self.context_len, executor
        )
        self.outputs.hold_back = jump.hold_back
        self.decode_log_interval = config.decode_log_interval
        self.results = ResultProcessor(
            queues,
            cm,
            self.finisher,
            self.outputs,
            executor,
            runner,
            self.spec,
            jump,
            self.tokenizer,
            stats,
            self._log_decode,
        )
        self.checks = create_invariant_checks(config, sync, cm, queues, self.sessions.nodes)
        self.profiler = Profiler(stats, runner.device.type)  # /start_profile, /stop_profile
        self.dashboard = DashboardProbe(self.tree_cache, self.internal_state)  # /dashboard/stream
        # Pause / continue, weight updates, memory release (SGLang's RL calls; weight_control.py).
        self.control = WeightControl(
            runner,
            cm,
            queues,
            self.intake,
            io,
            dp.control_sync(sync),
            stats,
            config.hicache,
            self.decode.finish_aborted,
            self._process_in_flight,
            lambda: self.is_idle() and dp.all_idle(),
        )
        # PD disaggregation (pd/mode.py): NoDisaggregation unless --disaggregation-mode P|D.
        self.pd = create_pd_mode(
            config.disaggregation,
            PDContext(
                queues,
                cm,
                self.finisher,
                self.outputs,
                self.tokenizer,
                self.context_len,
                runner.max_running_requests,
            ),
            runner.token_to_kv_pool,
        )
        self.intake.ready_status = self.pd.ready_status
        dp.attach(runner.model, self._dp_state, runner.max_total_num_tokens)

    # ------------------------------------------------------------------ loop
    def is_idle(self) -> bool:
        return self.queues.is_idle() and not self.executor.in_flight()

    def event_loop(self, heartbeat=None) -> None:
        """heartbeat: beaten as the loop starts and after every iteration (at least once per
        IDLE_POLL_MS when idle), so the launcher tells a hung loop from a busy one
        (--watchdog-timeout).
        """
        beat(heartbeat)
        while True:
            for msg in self.io_wait():
                self.handle(msg)
            self.step()
            beat(heartbeat)

    def io_wait(self) -> list:
        return self.io.recv_requests(self.poll_timeout())

    def poll_timeout(self) -> int:
        """How long the next wait for messages may last (ms)."""
        q = self.queues
        # Held (paused, memory released): waiting requests are no work until a message changes that.
        busy = (q.has_work() and not self.control.holds_generation()) or self.executor.in_flight()
        pending = q.grammar_pending or q.prefetching or self.pd.pending()
        return 0 if busy else (PENDING_POLL_MS if pending else IDLE_POLL_MS)

    def _dp_state(self) -> tuple[int, int, int]:
        """DP attention's step exchange: (poll timeout, requests held, their tokens)."""
        reqs = list(self.queues)
        return self.poll_timeout(), len(reqs), sum(r.seqlen for r in reqs)

    def step(self) -> None:
        """One iteration: requests whose compile or reads completed move on, one batch runs (with
        overlap, a decode step may stay in flight while the next is built), news goes out."""
        self.intake.poll()
        self.pd.poll()  # PD transfers: requests whose KV arrived (or was sent) move on
        prev = self.executor.take_in_flight()
        if prev:
            self.step_behind(prev)
        else:
            batch = self.next_batch()
            self.dp.join(batch is not None)  # DP attention: a rank without one joins the forward
            if batch:
                launched = self.executor.launch(batch)
                self.dp.check(launched)
                if not self.executor.keep_in_flight(launched):
                    self.results.process(launched)
        self.outputs.flush()
        # a weight update waiting for the requests before it (their news went out)
        self.control.try_update()
        self.checks.after_step()
        self.profiler.after_step()
        self.kv_events.after_step()  # the tree's block events of this step, as one batch

    def next_batch(self):
        if self.control.holds_generation():  # paused, or memory released: only aborts are answered
            self.decode.finish_aborted()
            return None
        prefill = self.prefill.schedule()
        return self.mix(prefill) if prefill else self.decode.schedule()

    def _process_in_flight(self) -> None:
        prev = self.executor.take_in_flight()
        if prev:
            self.results.process(prev)

    def step_behind(self, prev) -> None:
        """prev: a decode step in flight. Launch what comes next, then process prev. Answers that
        finished before prev leave (their KV, a hybrid's snapshot, to the tree) when it completes:
        when a waiting request starts as one of them (a chat's next turn, an agent's next call,
        sent as the answer streamed), prev is processed first so that it matches the answer, for
        one step without overlap."""
        if follows_up(prev.deferred_release, self.queues.waiting):
            self.results.process(prev)
            return
        prefill = self.prefill.schedule()
        if prefill:  # new requests need nothing of prev: prefill them behind it
            launched = self.executor.launch(prefill)
            self.results.process(prev)
            self.results.process(launched)
            return
        decode = self.decode.schedule_overlapped()  # None when the next step needs prev's tokens
        if decode:
            self.executor.set_in_flight(self.executor.launch(decode))
        self.results.process(prev)

    def handle(self, msg) -> None:
        try:
            _HANDLERS.get(type(msg), _unknown)(self, msg)
        except InvariantError:
            raise
        except Exception as e:
            logger.exception("handling %s failed", type(msg).__name__)
            if isinstance(msg, TokenizedGenerateReqInput):
                self.outputs.reject(
                    msg.rid,
                    len(msg.input_ids),
                    FinishAbort(f"internal error: {type(e).__name__}: {e}", 500),
                )
            elif type(msg) in _CONTROL_REPLIES:  # its caller waits for an answer
                self.io.reply(ControlFailed(_CONTROL_REPLIES[type(msg)]))

    def _log_decode(self) -> None:
        if self.stats.decode_steps % self.decode_log_interval == 0:
            logger.info(
                self.stats.decode_log_line(
                    self.runner.token_to_kv_pool.available_size(),
                    self.tree_cache.evictable_size(),
                    len(self.queues.running),
                    len(self.queues.waiting),
                    self.spec.log_suffix(),
                )
            )

    # ------------------------------------------------------------- control
    def flush_cache(self, level: str = "l1") -> FlushCacheReqOutput:
        """Empty the cache: L1 (the KV pool), or with the hierarchical cache down to "l2" or
        "l3"."""
        if not self.is_idle():
            return FlushCacheReqOutput(False, "requests are running")
        if level not in FLUSH_LEVELS:
            return FlushCacheReqOutput(
                False, f"level must be one of {', '.join(FLUSH_LEVELS)}, got {brief_repr(level)}"
            )
        self.sessions.unpin_all()  # the tree goes: sessions' next turns prefill again
        self.cache_manager.flush(level)
        self.stats.reset_cache_stats()
        return FlushCacheReqOutput(True)

    def info(self) -> dict:
        r = self.runner
        return {
            "max_total_num_tokens": r.max_total_num_tokens,
            "kv_cache_bytes": r.token_to_kv_pool.total_bytes,
            "context_len": r.context_len,
            "max_running_requests": r.max_running_requests,
            "vocab_size": r.vocab_size,
            "architecture": r.loaded.architecture,
            "is_embedding": r.pooler is not None,
            "pooling": r.pooler.pooling_type.value if r.pooler is not None else None,
            "reranker": r.loaded.reranker and r.loaded.reranker.info(),  # model/reranker.py
            "hidden_size": r.hf_config.hidden_size,
            "model_path": r.loaded.model_path,
            "eos_token_ids": sorted(r.loaded.eos_token_ids),
            "model_sampling_defaults": r.loaded.sampling_defaults or {},
            "pid": os.getpid(),
            "lora_enabled": bool(r.config.lora),
            "lora_adapters": r.lora.adapters_info(),
            "modalities": list(r.modalities),
            "bidirectional_images": r.bidirectional_images,
        }

    def internal_state(self) -> dict:
        q, tree = self.queues, self.tree_cache
        hicache = tree.info()
        return {
            "max_total_num_tokens": self.runner.max_total_num_tokens,
            "available_kv_tokens": self.runner.token_to_kv_pool.available_size(),
            "evictable_tokens": tree.evictable_size(),
            "protected_tokens": tree.protected_size(),
            "req_slots_total": self.runner.req_to_token_pool.size,
            "req_slots_free": self.runner.req_to_token_pool.available_size(),
            **self.cache_manager.states.info(),  # a hybrid model's state pool
            **self.cache_manager.windows.info(),  # a sliding-window model's own slot space
            "num_running": len(q.running) + len(q.prefilling),
            "num_waiting": len(q.waiting) + len(q.grammar_pending),
            **self.stats.as_dict(),
            **self.spec.info(),
            **self.sessions.info(),
            **({"hicache": hicache} if hicache else {}),
            **self.control.info(),
            # --enable-torch-compile: what was compiled, or why not
            **self.runner.decode_graphs.info(),
            **self.runner.pp_info(),  # --pp-size: decode micro-batches and prefill pieces run
            **expert_load_info(self.runner.model),  # MoE: tokens routed per expert per layer
            **self.dashboard.info(),
            **self.runner.mm_info(),  # a vision model: encoder runs, images, encoder-cache hits
            **self.pd.info(),  # --disaggregation-mode: transfers, bytes, checksums
            **self.dp.info(),  # --enable-dp-attention: this rank, idle forwards, rank 0's dispatch
        }

    def _model_key(self, stored_dtype) -> str:
        from radixlm.cache.storage import model_key, tokenizer_fingerprint

        return model_key(self.runner, tokenizer_fingerprint(self.tokenizer.get()), stored_dtype)


# What handles each message (a group of types: one entry each; a new request is held back while a
# weight update waits). A control call's handler replies: its caller waits for the answer.
_HANDLERS: dict[type, Callable[[Scheduler, Any], None]] = {
    TokenizedGenerateReqInput: lambda s, m: s.control.add(s.pd.on_add(m)),
    AbortReq: lambda s, m: s.control.abort(m.rid),
    FlushCacheReq: lambda s, m: s.io.reply(s.flush_cache(m.level)),
    GetInternalStateReq: lambda s, _: s.io.reply(GetInternalStateReqOutput(s.internal_state())),
    ProfileReq: lambda s, m: s.io.reply(s.profiler.handle(m)),
    DashboardSnapshotReq: lambda s, m: s.io.reply(s.dashboard.handle(m)),
    **dict.fromkeys(WEIGHT_CONTROL_REPLIES, lambda s, m: s.control.handle(m)),
    **dict.fromkeys(LORA_MESSAGES, lambda s, m: s.io.reply(handle_lora_message(s.runner.lora, m))),
    **dict.fromkeys(  # llama-server's slot files
        SLOT_MESSAGES,
        lambda s, m: s.io.reply(handle_slot_message(m, s.cache_manager, s._model_key)),
    ),
    **dict.fromkeys(SESSION_MESSAGES, lambda s, m: s.sessions.handle(m)),
}
_unknown = lambda s, m: logger.error("unknown message %r", type(m))


def _load_tokenizer(path: str):
    from radixlm.model.loader import load_tokenizer

    return load_tokenizer(path)


def run_scheduler_process(
    config: SchedulerConfig,
    port_args: PortArgs | None,
    pipe_writer,
    rank: RankSpec | None = None,
    loop_heartbeat=None,
) -> None:
    """Entry point of the scheduler process; rank: this process is that rank of a tensor-parallel
    group (port_args: rank 0's channels, None on the other ranks); loop_heartbeat: see event_loop.
    """
    from radixlm.utils import configure_logging, kill_itself_when_parent_died

    configure_logging(
        config.log_level, prefix="scheduler" if rank is None else f"scheduler tp{rank.rank}"
    )
    kill_itself_when_parent_died()
    faulthandler.enable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    try:
        if rank is None:
            scheduler = Scheduler(config, SchedulerIO(port_args))
        else:
            from radixlm.scheduler.rank import join_tp_group

            scheduler = Scheduler(*join_tp_group(config, port_args, rank))
        pipe_writer.send({"status": "ready", **scheduler.info()})
    except Exception as e:  # report load errors to the launcher instead of dying silently
        report = start_failure_report(e)  # a refusal: one line, the launcher's to print
        level = logging.ERROR if report["status"] == "error" else logging.DEBUG
        logger.log(level, "scheduler failed to start", exc_info=True)
        pipe_writer.send(report)
        return

    def finish_stores(*_):  # KV queued for storage is what the next start serves from
        scheduler.tree_cache.wait_writes(timeout=4.0)
        if rank is not None:  # no interpreter teardown: the process group's threads would abort it
            logging.shutdown()
            os._exit(0)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, finish_stores)
    try:
        scheduler.event_loop(loop_heartbeat)
    except InvariantError:
        logger.exception("scheduler invariant broken: stopping")
        if rank is not None:
            os._exit(1)
        raise
    except Exception:
        if rank is None:
            # Not one request's failure (those are contained where they happen): the scheduler's
            # state is unknown, so it stops, and the server exits or (--restart-on-failure)
            # restarts.
            logger.exception("scheduler step failed: stopping")
            raise
        # A rank whose peer died (or that failed) exits now: the interpreter's teardown would wait
        # on the process group's pending work, up to --dist-timeout.
        logger.exception("tp rank %d stopping", rank.rank)
        os._exit(1)
