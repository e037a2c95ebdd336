"""One device's room in Redis, as the workers on it share it (`workers.residency`): the
model each worker holds there (`keys.device_models`), the evictions asked of idle ones,
the models waiting for room (`keys.device_waiting`, which the scheduler reads for
on-demand turns), and `CLAIM`, the one script that takes room for a model or asks the
idle ones in the way to go."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import redis

from jobs import keys
from jobs.device_models import ModelEntry, device_member, split_member

CLAIM = """
-- KEYS: the device's models hash, the workers' heartbeats, the device's evictions hash,
--   the set of devices
-- ARGV: the worker, its entry (JSON: pipeline, bytes), the budget (bytes, 0: none),
--   seconds after which a heartbeat is stale, min_loaded_s, the device (`host|device`)
-- Takes room for the worker's model if it fits beside the others (a worker whose
-- heartbeat stopped counts for nothing and is dropped). Otherwise asks the idle models
-- loaded for min_loaded_s, least recently used first, to make room: {'wait', asked...},
-- or {'full', asked...} where even they would not make enough.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local mine = cjson.decode(ARGV[2])
local budget = tonumber(ARGV[3])
local used, idle = 0, {}
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  local worker = flat[i]
  if worker ~= ARGV[1] then
    local beat = redis.call('ZSCORE', KEYS[2], worker)
    if not beat or tonumber(beat) < now - tonumber(ARGV[4]) then
      redis.call('HDEL', KEYS[1], worker)
      redis.call('HDEL', KEYS[3], worker)
    else
      local e = cjson.decode(flat[i + 1])
      used = used + e.bytes
      if not e.resident and e.idle_since > 0 and now - e.loaded_at >= tonumber(ARGV[5]) then
        idle[#idle + 1] = {worker, e.idle_since, e.bytes}
      end
    end
  end
end
redis.call('SADD', KEYS[4], ARGV[6])
if budget == 0 or used + mine.bytes <= budget then
  mine.loaded_at = now
  mine.idle_since = 0
  redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(mine))
  return {'ok'}
end
table.sort(idle, function(x, y) return x[2] < y[2] end)
local short = used + mine.bytes - budget
local asked = {'wait'}
for _, c in ipairs(idle) do
  if short <= 0 then break end
  redis.call('HSET', KEYS[3], c[1], ARGV[1])
  short = short - c[3]
  asked[#asked + 1] = c[1]
end
if short > 0 then asked[1] = 'full' end
return asked
"""


@dataclass
class DeviceRoom:
    """The models of one device of this host, in Redis."""

    r: redis.Redis
    host: str
    device: str
    worker: str
    stale_s: float

    def __post_init__(self) -> None:
        self._claim = self.r.register_script(CLAIM)
        self.member = device_member(self.host, self.device)

    @property
    def models_key(self) -> str:
        return keys.device_models(self.host, self.device)

    @property
    def evictions_key(self) -> str:
        return keys.device_evictions(self.host, self.device)

    def hold(self, pipeline: str, nbytes: int) -> None:
        """Count this worker's resident model, loaded at start."""
        entry = ModelEntry(pipeline=pipeline, bytes=nbytes, resident=True, loaded_at=time.time())
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self.models_key, self.worker, entry.model_dump_json())
        pipe.sadd(keys.MODEL_DEVICES, self.member)
        pipe.execute()

    def claim(
        self, pipeline: str, nbytes: int, budget: int, min_loaded_s: float, slots: int = 1
    ) -> list[str]:
        """`CLAIM`'s answer: ['ok'], or ['wait' | 'full', the workers asked for room...]."""
        entry = ModelEntry(pipeline=pipeline, bytes=nbytes, resident=False, slots=slots)
        entry_json = entry.model_dump_json()
        args: list[str | float] = [
            self.worker, entry_json, budget, self.stale_s, min_loaded_s, self.member
        ]  # fmt: skip
        keys_ = [self.models_key, keys.WORKERS, self.evictions_key, keys.MODEL_DEVICES]
        return [str(v) for v in self._claim(keys=keys_, args=args)]

    def warm_sibling(self, pipeline: str) -> str | None:
        """Another live worker of `pipeline`, on any device of any host, whose model is
        loaded and has a free slot (idle, or an engine with room in its batch); None where
        there is none."""
        devices = [split_member(str(d)) for d in self.r.smembers(keys.MODEL_DEVICES)]
        pipe = self.r.pipeline(transaction=False)
        for host, device in devices:
            pipe.hgetall(keys.device_models(host, device))
        candidates = [
            worker
            for models in pipe.execute()
            for worker, raw in models.items()
            if worker != self.worker
            and (entry := ModelEntry.model_validate_json(raw)).pipeline == pipeline
            and entry.takes_more()
        ]
        if not candidates:
            return None
        (now_s, now_us) = self.r.time()
        live_since = now_s + now_us / 1e6 - self.stale_s
        pipe = self.r.pipeline(transaction=False)
        for worker in candidates:
            pipe.zscore(keys.WORKERS, worker)
        beats = pipe.execute()
        return next(
            (w for w, beat in zip(candidates, beats, strict=True) if beat and beat >= live_since),
            None,
        )

    def mark_use(self, busy: int, idle_since: float) -> None:
        """Note how many jobs this worker's loaded model runs, and since when it is idle
        (0: it has work)."""
        raw = self.r.hget(self.models_key, self.worker)
        if raw:
            entry = ModelEntry.model_validate_json(raw)
            entry.busy, entry.idle_since = busy, idle_since
            self.r.hset(self.models_key, self.worker, entry.model_dump_json())

    def eviction_asked(self) -> bool:
        return bool(self.r.hexists(self.evictions_key, self.worker))

    def refuse_eviction(self) -> None:
        self.r.hdel(self.evictions_key, self.worker)

    def wait_for_room(self, pipeline: str, since: float) -> None:
        entry = json.dumps({"pipeline": pipeline, "since": since})
        self.r.hset(keys.device_waiting(self.host, self.device), self.worker, entry)

    def stop_waiting(self) -> None:
        self.r.hdel(keys.device_waiting(self.host, self.device), self.worker)

    def free(self) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.hdel(self.models_key, self.worker)
        pipe.hdel(self.evictions_key, self.worker)
        pipe.execute()

    def queued(self, lists: list[str]) -> int:
        """Messages waiting in these queue lists (a pipeline's, one per priority)."""
        pipe = self.r.pipeline(transaction=False)
        for name in lists:
            pipe.llen(name)
        return sum(int(n) for n in pipe.execute())
