"""WeightControl: SGLang's calls for RL loops on a serving scheduler (docs/rl.md): pause and
continue generation, replace the weights from disk, read a weight back, release and resume the
memory of the weights and of the KV cache.

In-flight requests finish on the old weights, as in SGLang (whose update waits for its in-flight
requests under a lock): an update waits until every request the scheduler got before it has
finished; requests that arrive after it are held back (deferred) and run on the new weights. With
`abort_all_requests` the requests in flight are aborted instead. While generation is paused, or
memory is released, no batch runs: requests wait (the aborted ones are answered), and an update
applies at once (requests paused in place are retracted first: their KV came from the old weights).
The order of the messages decides what is "before": they arrive on one socket, in the order sent.

Tensor parallelism: every rank handles the same messages in the same step and loads its own shard;
whether a load succeeded is agreed across the ranks (all or none switch), and a weight read back is
gathered from every rank's shard.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from radixlm.ipc import (
    MEMORY_TAGS,
    PAUSE_MODES,
    ContinueGenerationReqInput,
    ControlFailed,
    GetWeightsByNameReqInput,
    GetWeightsByNameReqOutput,
    PauseGenerationReqInput,
    ReleaseMemoryOccupationReqInput,
    ResumeMemoryOccupationReqInput,
    TokenizedGenerateReqInput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightFromDiskReqOutput,
    WeightControlReqOutput,
)
from radixlm.model.executor import weight_update
from radixlm.model.executor.runner import ModelRunner
from radixlm.scheduler.intake import RequestIntake
from radixlm.scheduler.kv.cache_manager import CacheManager
from radixlm.scheduler.parallel.tp_sync import BaseStepSync
from radixlm.scheduler.req import ReqStatus
from radixlm.scheduler.req_queues import ReqQueues
from radixlm.scheduler.stats import SchedulerStats

if TYPE_CHECKING:
    from radixlm.cache.hicache_config import HiCacheConfig
    from radixlm.scheduler.channels import BaseSchedulerIO

logger = logging.getLogger(__name__)


class PauseMode(str, enum.Enum):  # ipc.PAUSE_MODES
    ABORT = "abort"  # abort every request in flight
    RETRACT = (  # running requests back to the queue, their KV to the cache (recomputed later)
        "retract"
    )
    IN_PLACE = "in_place"  # requests keep their place and KV


# The reply each call waits for (ControlFailed names it when the call raised).
WEIGHT_CONTROL_REPLIES = {
    UpdateWeightFromDiskReqInput: UpdateWeightFromDiskReqOutput,
    GetWeightsByNameReqInput: GetWeightsByNameReqOutput,
    PauseGenerationReqInput: WeightControlReqOutput,
    ContinueGenerationReqInput: WeightControlReqOutput,
    ReleaseMemoryOccupationReqInput: WeightControlReqOutput,
    ResumeMemoryOccupationReqInput: WeightControlReqOutput,
}


def memory_tags(tags: list | None) -> list[str]:
    """The tags a release / resume names (None or []: all), or ValueError naming the field.
    cuda_graph
    is accepted (SGLang's "all" names it) and holds nothing here."""
    if tags is None or tags == []:
        return list(MEMORY_TAGS)
    if not isinstance(tags, list) or not all(isinstance(t, str) and t in MEMORY_TAGS for t in tags):
        raise ValueError(
            f"tags must be a list of {', '.join(MEMORY_TAGS)} (or null: all), got {tags!r}"[:300]
        )
    return list(dict.fromkeys(tags))


class WeightControl:
    def __init__(
        self,
        runner: ModelRunner,
        cache_manager: CacheManager,
        queues: ReqQueues,
        intake: RequestIntake,
        io: BaseSchedulerIO,
        sync: BaseStepSync,
        stats: SchedulerStats,
        hicache: HiCacheConfig | None,
        finish_aborted: Callable[[], None],
        process_in_flight: Callable[[], None],
        is_idle: Callable[[], bool],
    ):
        """finish_aborted: answer aborted running requests now; process_in_flight: process the step
        in flight (overlap), so that nothing runs behind a pause; is_idle: no request, no step in
        flight.
        """
        self.runner, self.cm, self.queues, self.intake = runner, cache_manager, queues, intake
        self.io, self.sync, self.stats = io, sync, stats
        self.finish_aborted, self.process_in_flight, self.is_idle = (
            finish_aborted,
            process_in_flight,
            is_idle,
        )
        # The prefix cache's KV came from the weights: an update empties L2 (host memory) too. L3
        # keys its files by the weights at start, so updates are refused with it (it would serve
        # stale KV).
        self.flush_level = "l1" if hicache is None else "l2"
        self.has_storage_tier = hicache is not None and hicache.storage_backend is not None
        self.paused: PauseMode | None = None
        self.released: set[str] = set()
        self.pending: UpdateWeightFromDiskReqInput | None = None
        self.deferred: list[TokenizedGenerateReqInput] = []  # arrived after the pending update
        self.weight_version = "default"  # SGLang's --weight-version default

    # ------------------------------------------------------------------ requests
    def add(self, req: TokenizedGenerateReqInput) -> None:
        if self.pending is not None:
            self.deferred.append(req)  # runs on the new weights
        else:
            self.intake.add(req)

    def abort(self, rid: str) -> None:
        """As RequestIntake.abort, deferred requests included (answered as aborted)."""
        hit = [r for r in self.deferred if rid in ("", r.rid)]
        self.deferred = [r for r in self.deferred if r not in hit]
        for r in hit:
            self.intake.add(r)
        self.intake.abort(rid)

    def holds_generation(self) -> bool:
        """No batch runs: paused, or the weights or the KV pool are released."""
        return self.paused is not None or bool(self.released & {"weights", "kv_cache"})

    def handle(self, msg) -> None:
        if isinstance(msg, UpdateWeightFromDiskReqInput):
            self.update(msg)
        elif isinstance(msg, GetWeightsByNameReqInput):
            self.io.reply(self.get_weights_by_name(msg))
        elif isinstance(msg, PauseGenerationReqInput):
            self.io.reply(self.pause(msg.mode))
        elif isinstance(msg, ContinueGenerationReqInput):
            self.paused = None
            self.io.reply(WeightControlReqOutput(True, "Generation continued successfully."))
        elif isinstance(msg, ReleaseMemoryOccupationReqInput):
            self.io.reply(self.release(msg.tags))
        elif isinstance(msg, ResumeMemoryOccupationReqInput):
            self.io.reply(self.resume(msg.tags))

    # ------------------------------------------------------------------ pause
    def pause(self, mode: str) -> WeightControlReqOutput:
        try:
            pause_mode = PauseMode(mode)
        except ValueError:
            return WeightControlReqOutput(
                False, f"mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r}"[:300]
            )
        self.paused = pause_mode
        self.process_in_flight()  # nothing runs behind the pause
        if pause_mode is PauseMode.ABORT:
            self.abort("")
            self.finish_aborted()
        elif pause_mode is PauseMode.RETRACT:
            self._retract_all()
        self.try_update()  # an update waiting for in-flight requests applies now
        return WeightControlReqOutput(True, "Generation paused successfully.")

    def _retract_all(self) -> None:
        """Every request holding KV back to the front of the queue, its KV to the cache (it
        re-prefills prompt + outputs later, from the cache where it still is), as
        DecodeManager.retract does."""
        self.process_in_flight()
        holders = self.queues.of(ReqStatus.PREFILLING, ReqStatus.RUNNING)
        for req in holders:
            self.cm.release(req)
            req.retracted += 1
        self.queues.move_all(holders, ReqStatus.WAITING, front=True)
        self.stats.num_retracted += len(holders)

    # ------------------------------------------------------------------ update
    def update(self, req: UpdateWeightFromDiskReqInput) -> None:
        if (
            self.pending is not None
        ):  # cannot happen through the tokenizer manager, which sends one at a time
            self.io.reply(
                UpdateWeightFromDiskReqOutput(False, "another weight update is in progress")
            )
            return
        error = self._agreed_error(lambda: self._precheck(req))
        if error:  # refused before anything waits or loads: the old weights serve on
            self.io.reply(self._refusal(error, UpdateWeightFromDiskReqOutput(False, str(error))))
            return
        if req.abort_all_requests:
            self.abort("")
        self.pending = req
        self.try_update()

    def _precheck(self, req: UpdateWeightFromDiskReqInput) -> None:
        if self.has_storage_tier:
            raise weight_update.CheckpointError(
                "weights cannot be updated with the hierarchical cache's storage tier"
                " (--hicache-storage-backend): its files are keyed by the weights at start and"
                " would serve the old weights' KV"
            )
        weight_update.check_checkpoint(self.runner, req.model_path, req.load_format)

    def try_update(self) -> None:
        """Apply the pending update once the requests before it are done (at once while generation
        is held). Called after every step."""
        if self.pending is None or not (self.holds_generation() or self.is_idle()):
            return
        req, self.pending = self.pending, None
        try:
            self._apply(req)
        except Exception:
            logger.exception("weight update from %s failed", req.model_path)
            self.io.reply(ControlFailed(UpdateWeightFromDiskReqOutput))
        finally:
            deferred, self.deferred = self.deferred, []
            for r in deferred:
                self.intake.add(r)

    def _apply(self, req: UpdateWeightFromDiskReqInput) -> None:
        if req.flush_cache:
            self._retract_all()  # requests paused in place: their KV came from the old weights
        loaded = []
        error = self._agreed_error(
            lambda: loaded.append(
                weight_update.load_checkpoint(self.runner, req.model_path, req.load_format)
            )
        )
        if error:
            logger.error("weight update from %s failed: %s", req.model_path, error)
            self.io.reply(
                self._refusal(
                    error, UpdateWeightFromDiskReqOutput(False, str(error), len(self.deferred))
                )
            )
            return
        weight_update.install(self.runner, loaded[0])
        self.released.discard("weights")
        if req.flush_cache:
            self.cm.flush(self.flush_level)
            self.stats.reset_cache_stats()
        message = "Succeeded to update model weights."
        if req.weight_version is not None:
            self.weight_version = req.weight_version
            message += f" Weight version updated to {req.weight_version}."
        if req.keep_pause:
            self.paused = self.paused or PauseMode.IN_PLACE
        logger.info("weights updated from %s", req.model_path)
        self.io.reply(UpdateWeightFromDiskReqOutput(True, message, len(self.deferred)))

    def _agreed_error(self, action: Callable[[], object]) -> Exception | None:
        """Run action on every rank: None if it succeeded on all of them, else why: this rank's
        error (a CheckpointError: the caller's input; anything else: internal), or another
        rank's."""
        error = None
        try:
            action()
        except weight_update.CheckpointError as e:
            error = e
        except Exception as e:
            logger.exception("weight control failed")
            error = e
        if self.sync.all_done([error is None])[0]:
            return None
        return error or weight_update.CheckpointError(
            "another tensor-parallel rank could not do it (see its log)"
        )

    @staticmethod
    def _refusal(error: Exception, answer):
        """The answer to a call that failed: `answer` (a 400 with its message) for bad input, else a
        ControlFailed (a 500 saying only that; the details are in this log)."""
        return (
            answer
            if isinstance(error, weight_update.CheckpointError)
            else ControlFailed(type(answer))
        )

    # ------------------------------------------------------------------ reading a weight
    def get_weights_by_name(self, req: GetWeightsByNameReqInput) -> GetWeightsByNameReqOutput:
        if "weights" in self.released:
            return GetWeightsByNameReqOutput(
                None, "the weights are released (resume_memory_occupation first)"
            )
        try:
            part = weight_update.weight_by_name(self.runner.model, req.name)
        except Exception as e:
            if not isinstance(e, KeyError):
                logger.exception("reading weight %r failed", req.name)
            part = None
        parts = self.sync.gather(part)
        if any(p is None for p in parts):
            return GetWeightsByNameReqOutput(
                None, f"name: the model has no weight {req.name!r}"[:300]
            )
        full = weight_update.assemble(parts)
        return GetWeightsByNameReqOutput(full[: req.truncate_size].tolist())

    # ------------------------------------------------------------------ memory
    def release(self, tags: list | None) -> WeightControlReqOutput:
        try:
            names = memory_tags(tags)
        except ValueError as e:
            return WeightControlReqOutput(False, str(e))
        self.process_in_flight()
        if self.queues.holders() or self.pending is not None:
            if self.paused is None:
                return WeightControlReqOutput(
                    False, "requests are running: pause_generation first, or wait until they finish"
                )
            self._retract_all()
        if "kv_cache" in names and "kv_cache" not in self.released:
            self.cm.flush("l1")  # the host tier (L2) keeps its copies
            self.cm.token_to_kv_pool.release_memory()
            self.runner.reset_attention_state()
        if "weights" in names and "weights" not in self.released:
            weight_update.release_weights(self.runner)
        self.released |= set(names) - {"cuda_graph"}  # nothing of it on CPU
        return WeightControlReqOutput(True, f"Released {', '.join(names)}.")

    def resume(self, tags: list | None):  # WeightControlReqOutput, or ControlFailed
        try:
            names = memory_tags(tags)
        except ValueError as e:
            return WeightControlReqOutput(False, str(e))
        if "weights" in names and "weights" in self.released:
            error = self._agreed_error(lambda: weight_update.resume_weights(self.runner))
            if error:
                why = f"the weights could not be loaded again: {error}"
                return self._refusal(error, WeightControlReqOutput(False, why))
        if "kv_cache" in names and "kv_cache" in self.released:
            self.cm.token_to_kv_pool.resume_memory()
        self.released -= set(names)
        return WeightControlReqOutput(True, f"Resumed {', '.join(names)}.")

    def info(self) -> dict:
        return {
            "weights": {
                "model_path": self.runner.loaded.model_path,
                "weight_version": self.weight_version,
                "paused": self.paused.value if self.paused else None,
                "released": sorted(self.released),
                "update_pending": self.pending is not None,
                "deferred_requests": len(self.deferred),
            }
        }
