"""Lua scripts that change job state atomically (a transition and its indexes commit together)."""

from __future__ import annotations

from broker.kombu_redis import PUSH_MESSAGE_LUA

NOTICE_JOB_MAX_BYTES = 16_384
"""A job whose fields add up to more than this is not carried in its end notice."""
FRONT_MAX = 32
"""Newcomers' messages at the front of a queue list that keep their order (`SUBMIT`)."""

# An event's notice on the events channel is a line of fields (`jobstore.notices`), built
# inside Redis so that its stream id can go into it; a job's end goes again on the ends
# channel as JSON, with the job. `data` is JSON text already (decoding and encoding it
# again here would round its floats: cjson keeps 14 digits). `announce` returns the stream
# id; `notice_of` makes an end's JSON notice, without its closing brace, only for an end.
_PUBLISH = """
-- Notices held back until the caller has confirmed the writes (`redis.durability`):
-- a script sets `held = {}` and returns them; the caller publishes them after.
local held = nil
local function publish(channel, message)
  if held then
    held[#held + 1] = {channel, message}
  else
    redis.call('PUBLISH', channel, message)
  end
end

local function notice_of(id, job_id, etype, data, ts)
  return '{"id":' .. cjson.encode(id) .. ',"job_id":' .. cjson.encode(job_id) ..
         ',"type":' .. cjson.encode(etype) .. ',"data":' .. data .. ',"ts":' .. ts
end

local function event_line(id, job_id, etype, data, ts, text_at)
  return id .. ' ' .. job_id .. ' ' .. etype .. ' ' .. ts .. ' ' .. text_at .. ' ' .. data
end

local function announce(channel, stream, maxlen, job_id, etype, data, ts, ttl)
  local id = redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
                        'type', etype, 'data', data, 'ts', ts)
  if ttl then redis.call('EXPIRE', stream, ttl) end
  publish(channel, event_line(id, job_id, etype, data, ts, '0'))
  return id
end
"""

# Lease deadlines are Redis's time, never a worker's: a host whose clock is off must not
# get its jobs reaped early or late (the reaper compares them with Redis's time too).
_DEADLINE = """
local function now_s()
  local now = redis.call('TIME')
  return tonumber(now[1]) + tonumber(now[2]) / 1e6
end

local function deadline_after(ttl_ms)
  return now_s() + tonumber(ttl_ms) / 1000
end
"""

SUBMIT = (
    _PUBLISH
    + PUSH_MESSAGE_LUA
    + """
-- KEYS: job, owner index, queued set, idempotency key, events stream, task list, counter,
--   index of every owner's jobs, deadlines, limits hash, the owner's usage hash, the
--   owner's requests in this quota window, the set of owners, the owner's cost of the
--   job's kind in this quota window
-- ARGV[1]: JSON {job_id, max_queued, score, idem_ttl_s, idem_value ('' for none), maxlen,
--   channel, event (JSON text), ts, message ('' for none), counter_field ('' for none),
--   deadline (unix seconds, '' for none), fields: the job's fields as [name, value, ...],
--   quota: {owner, counts (false for a batch line), max_queued, requests, max_running,
--   cost_limit (the deployment's defaults, 0: none), kind, cost (the job's, counted when
--   it is admitted), window_ttl_s},
--   hold: fair share's (absent: push the message at once) {entry: JSON of the held job
--   for its hold list, field: `pipeline|priority`, priority, takes: the priorities whose
--   room a pushed message takes (its own and those below)}}
-- More KEYS with `hold`: the pipeline's room (hash by priority, `newcomers` and the
--   newcomers' marks, see below), the holders of priorities high, normal and low (those
--   below the job's: unused names), the job's own holders, its hold list, the passes,
--   the held counts.
-- Returns {'ok', event id, requests limit, requests used, cost limit, cost used} or
-- {'dup', value} or {'full', ''} or {'quota', name, limit, used}.
local a = cjson.decode(ARGV[1])
-- Sent again after its connection broke (see common.redis_client.RESEND_ON_BROKEN): the
-- first run made the job; a second message or queued event would be a duplicate.
if redis.call('EXISTS', KEYS[1]) == 1 then return {'ok', '', '0', '0', '0', '0'} end
if a.idem_value ~= '' then
  local prev = redis.call('GET', KEYS[4])
  if prev then return {'dup', prev} end
end
local q = a.quota
local limits = {max_queued = q.max_queued, requests = q.requests, max_running = q.max_running}
local cost_limit = q.cost_limit
local own = redis.call('HGET', KEYS[10], q.owner)
if own then
  local mine = cjson.decode(own)
  for name, value in pairs(mine) do limits[name] = value end
  if type(mine.costs) == 'table' and mine.costs[q.kind] then cost_limit = mine.costs[q.kind] end
end
local used = tonumber(redis.call('GET', KEYS[12]) or '0')
local spent = tonumber(redis.call('GET', KEYS[14]) or '0')
if q.counts then
  if limits.requests > 0 and used >= limits.requests then
    return {'quota', 'requests', tostring(limits.requests), tostring(used)}
  end
  local queued = tonumber(redis.call('HGET', KEYS[11], 'queued') or '0')
  if limits.max_queued > 0 and queued >= limits.max_queued then
    return {'quota', 'queued', tostring(limits.max_queued), tostring(queued)}
  end
  -- At the limit, or over it with this job: a cost known only at the end (0 here) is
  -- admitted while the window has some left.
  if cost_limit > 0 and (spent >= cost_limit or spent + q.cost > cost_limit) then
    return {'quota', 'cost', tostring(cost_limit), tostring(spent)}
  end
end
if redis.call('SCARD', KEYS[3]) >= a.max_queued then return {'full', ''} end
-- Fair share: a job that finds no free slot of its pipeline at its priority (the release
-- stage's `room`), a job of another key waiting at its priority or above, or its key at
-- its `max_running`, is held for the scheduler; the owner joins the turn at the last
-- release's pass if it was not waiting.
-- A newcomer's job is released here, as the scheduler's next release would release it,
-- without waiting for that step: its key has nothing at the workers (no job released
-- and not ended, so none in the queue) and none held at its priority, nothing is held
-- above it, no held key's pass is below the one it would join at, and the pipeline takes
-- newcomers (`newcomers`: it has live workers and is not draining). Its message goes to
-- the consumers' end of its list, behind the newcomers' still there (taken next, not
-- behind what waits in the queue). Like a push that found room, it moves no pass.
local hold_job, front = false, false
if a.message ~= '' and a.hold then
  local room = redis.call('HGET', KEYS[15], a.hold.priority)
  if room then
    local waiting, above = 0, 0
    for i = 16, 18 do
      local n = redis.call('ZCARD', KEYS[i])
      waiting = waiting + n
      if KEYS[i] ~= KEYS[19] then above = above + n end
    end
    local running = tonumber(redis.call('HGET', KEYS[11], 'running') or '0')
    local capped = limits.max_running > 0 and running >= limits.max_running
    if q.counts and running == 0 and above == 0
        and redis.call('HGET', KEYS[15], 'newcomers') == '1'
        and not redis.call('ZSCORE', KEYS[19], q.owner) then
      local mine = tonumber(redis.call('HGET', KEYS[21], q.owner) or '0')
      local pass = math.max(mine, tonumber(redis.call('HGET', KEYS[21], '') or '0'))
      local first = redis.call('ZRANGE', KEYS[19], 0, 0, 'WITHSCORES')
      front = #first == 0 or pass <= tonumber(first[2])
    end
    if front or (waiting == 0 and tonumber(room) > 0 and not capped) then
      for _, p in ipairs(a.hold.takes) do redis.call('HINCRBY', KEYS[15], p, -1) end
    else
      hold_job = true
    end
  end
end
if front then
  -- After the last newcomer's message (its mark) if it is among the FRONT_MAX last.
  local mark = 'front|' .. a.hold.priority
  local last = redis.call('HGET', KEYS[15], mark)
  local moved = {}
  if last then
    local ends = redis.call('LRANGE', KEYS[6], -FRONT_MAX, -1)
    for i = #ends, 1, -1 do
      if ends[i] == last then
        for j = 1, #ends - i + 1 do moved[j] = redis.call('RPOP', KEYS[6]) end
        break
      end
    end
  end
  redis.call('RPUSH', KEYS[6], a.message)
  for j = #moved, 1, -1 do redis.call('RPUSH', KEYS[6], moved[j]) end
  redis.call('HSET', KEYS[15], mark, a.message)
elseif hold_job then
  redis.call('RPUSH', KEYS[20], a.hold.entry)
  if not redis.call('ZSCORE', KEYS[19], q.owner) then
    local mine = tonumber(redis.call('HGET', KEYS[21], q.owner) or '0')
    local now_pass = tonumber(redis.call('HGET', KEYS[21], '') or '0')
    redis.call('ZADD', KEYS[19], math.max(mine, now_pass), q.owner)
  end
  redis.call('HINCRBY', KEYS[22], a.hold.field, 1)
elseif a.message ~= '' then
  push_message(KEYS[6], a.message)
end
redis.call('HSET', KEYS[1], unpack(a.fields))
if hold_job then
  redis.call('HSET', KEYS[1], 'held', '1')
elseif a.message ~= '' and q.counts then
  -- Released to the workers: counted against `max_running` until it ends.
  redis.call('HSET', KEYS[1], 'released', '1')
  redis.call('HINCRBY', KEYS[11], 'running', 1)
end
redis.call('ZADD', KEYS[2], a.score, a.job_id)
redis.call('ZADD', KEYS[8], a.score, a.job_id)
redis.call('SADD', KEYS[3], a.job_id)
if a.deadline ~= '' then redis.call('ZADD', KEYS[9], a.deadline, a.job_id) end
if a.idem_value ~= '' then redis.call('SET', KEYS[4], a.idem_value, 'EX', a.idem_ttl_s) end
local id = announce(a.channel, KEYS[5], a.maxlen, a.job_id, 'status', a.event, a.ts, nil)
if a.counter_field ~= '' then redis.call('HINCRBY', KEYS[7], a.counter_field, 1) end
redis.call('SADD', KEYS[13], q.owner)
if q.counts then
  redis.call('HINCRBY', KEYS[11], 'queued', 1)
  used = redis.call('INCR', KEYS[12])
  redis.call('EXPIRE', KEYS[12], q.window_ttl_s)
  if q.cost > 0 then
    spent = redis.call('INCRBY', KEYS[14], q.cost)
    redis.call('EXPIRE', KEYS[14], q.window_ttl_s)
  end
end
return {'ok', id, tostring(limits.requests), tostring(used), tostring(cost_limit),
        tostring(spent)}
""".replace("FRONT_MAX", str(FRONT_MAX))
)

_TRANSITION = (
    _PUBLISH
    + _DEADLINE
    + PUSH_MESSAGE_LUA
    + """
-- K (keys): job, events stream, lease, running zset, queued set, task list, deadlines zset,
--   the kind's queued set of batch lines (where a job of priority `batch` is counted)
-- The owner's usage hash (`keys.usage`) is named here from the job's owner and
-- `usage_prefix` (a): a worker that starts a job knows only its id. (One Redis, or
-- Sentinel: not Redis Cluster.)
-- a (the change, from JSON): {job_id, sources: [status, ...], target, now, lease_mode,
--   lease_token, lease_ttl_ms, end_ttl_s (0: not an end), maxlen, channel, ends_channel,
--   event (JSON text), pre_event_type ('' for none: an output or error event written just
--   before the status event), pre_event (JSON text), read_back: [field, ...] (['*']: all of them),
--   fields: {name: value}, message: a task message to push on the task list ('' for none),
--   hold: true to return the notices instead of publishing them, charge: absent, or a
--   cost known at the end, {key (`keys.cost_in`), amount, ttl_s}}
-- Returns {'ok', event id, pre-event id, held notices (JSON [[channel, message], ...] or
-- ''), read-back values...} or {reason, status}. A start ('acquire') is refused with
-- 'expired' once the job's deadline has passed (Redis's time): it must never run.
local function transition(K, a)
  held = nil
  if a.hold then held = {} end
  local current = redis.call('HMGET', K[1], 'status', 'cancel_requested', 'deadline',
                             'cancel_at_deadline', 'priority', 'owner', 'released')
  local queued_set = K[5]
  if current[5] == 'batch' then queued_set = K[8] end
  local status = current[1]
  if not status then return {'missing', ''} end
  local allowed = false
  for _, source in ipairs(a.sources) do
    if source == status then allowed = true end
  end
  if not allowed then return {'status', status} end
  local mode = a.lease_mode
  if mode == 'check' then
    if redis.call('GET', K[3]) ~= a.lease_token then return {'lease', status} end
  elseif mode == 'absent' then
    if redis.call('EXISTS', K[3]) == 1 then return {'lease', status} end
  elseif mode == 'acquire' then
    if current[2] == '1' then return {'canceled', status} end
    if current[3] and current[3] ~= '' and now_s() > tonumber(current[3]) then
      return {'expired', status}
    end
    if not redis.call('SET', K[3], a.lease_token, 'NX', 'PX', a.lease_ttl_ms) then
      return {'lease', status}
    end
    redis.call('HINCRBY', K[1], 'attempts', 1)
  end
  -- The first write of a requeue: should it fail, the job is left as it was.
  if a.message ~= '' then push_message(K[6], a.message) end
  local target = a.target
  local pairs_ = {'status', target}
  for name, value in pairs(a.fields) do
    pairs_[#pairs_ + 1] = name
    pairs_[#pairs_ + 1] = value
  end
  redis.call('HSET', K[1], unpack(pairs_))
  local ttl = nil
  local pre_id = ''
  if a.end_ttl_s > 0 then ttl = a.end_ttl_s end
  if a.pre_event_type ~= '' then
    if a.pre_event_type == 'output' then
      local cur = redis.call('HGET', K[1], 'first_output_at')
      if not cur or cur == '' then redis.call('HSET', K[1], 'first_output_at', a.now) end
    end
    pre_id = announce(a.channel, K[2], a.maxlen, a.job_id, a.pre_event_type, a.pre_event,
                      a.now, nil)
  end
  if target == 'queued' then
    redis.call('SADD', queued_set, a.job_id)
    redis.call('ZREM', K[4], a.job_id)
  elseif target == 'running' then
    redis.call('SREM', queued_set, a.job_id)
    redis.call('ZADD', K[4], deadline_after(a.lease_ttl_ms), a.job_id)
  else
    redis.call('SREM', queued_set, a.job_id)
    redis.call('ZREM', K[4], a.job_id)
  end
  -- A run that leaves `running` under its lease (an end, or a preempted line queued again)
  -- gives the lease up: the next start takes the job at once.
  if mode == 'check' and target ~= 'running' then redis.call('DEL', K[3]) end
  -- The owner's queued count follows the job in and out of `queued` (batch lines apart).
  if current[6] and current[5] ~= 'batch' and (status == 'queued') ~= (target == 'queued') then
    local usage = a.usage_prefix .. current[6]
    if target == 'queued' then
      redis.call('HINCRBY', usage, 'queued', 1)
    elseif redis.call('HINCRBY', usage, 'queued', -1) < 0 then
      redis.call('HSET', usage, 'queued', 0)  -- a job queued before counts were kept
    end
  end
  -- A job released to the workers gives its key's `max_running` slot back when it ends.
  if ttl and current[7] == '1' and current[6] then
    local usage = a.usage_prefix .. current[6]
    if redis.call('HINCRBY', usage, 'running', -1) < 0 then
      redis.call('HSET', usage, 'running', 0)
    end
    redis.call('HDEL', K[1], 'released')
  end
  if a.charge then
    redis.call('INCRBY', a.charge.key, a.charge.amount)
    redis.call('EXPIRE', a.charge.key, a.charge.ttl_s)
  end
  -- A deadline is watched while the job waits, and while it runs if it asked to be
  -- canceled at it; the reaper sweeps the set.
  local deadline = current[3]
  if deadline and deadline ~= '' then
    if target == 'queued' or (target == 'running' and current[4] == '1') then
      redis.call('ZADD', K[7], deadline, a.job_id)
    else
      redis.call('ZREM', K[7], a.job_id)
    end
  end
  if ttl then redis.call('EXPIRE', K[1], ttl) end
  local id = announce(a.channel, K[2], a.maxlen, a.job_id, 'status', a.event, a.now, ttl)
  local function held_json()
    if held and #held > 0 then return cjson.encode(held) end
    return ''
  end
  if not ttl and #a.read_back == 0 then return {'ok', id, pre_id, held_json()} end
  -- The job as it is now, read once: an end publishes it on the ends channel (so that a
  -- request waiting for the end needs no second read) unless it is large, and the caller
  -- gets the fields it asked for.
  local flat = redis.call('HGETALL', K[1])
  local fields, size = {}, 0
  for i = 1, #flat, 2 do
    size = size + #flat[i] + #flat[i + 1]
    fields[flat[i]] = flat[i + 1]
  end
  if ttl then
    local job = ''
    if size <= NOTICE_JOB_MAX_BYTES then job = ',"job":' .. cjson.encode(fields) end
    publish(a.ends_channel, notice_of(id, a.job_id, 'status', a.event, a.now) .. job .. '}')
  end
  if #a.read_back == 0 then return {'ok', id, pre_id, held_json()} end
  if a.read_back[1] == '*' then return {'ok', id, pre_id, held_json(), unpack(flat)} end
  local values = {}
  for _, name in ipairs(a.read_back) do values[#values + 1] = fields[name] or '' end
  return {'ok', id, pre_id, held_json(), unpack(values)}
end
""".replace("NOTICE_JOB_MAX_BYTES", str(NOTICE_JOB_MAX_BYTES))
)

TRANSITION = (
    _TRANSITION
    + """
-- KEYS: the eight keys of `transition`; ARGV[1]: the change (JSON).
return transition(KEYS, cjson.decode(ARGV[1]))
"""
)

TRANSITIONS = (
    _TRANSITION
    + """
-- Several changes in one call (a worker's group commit): ARGV[i] is change i (JSON),
-- and its eight keys (`Transition.script_args`) are KEYS[8(i-1)+1 .. 8i]. Each runs as
-- `TRANSITION` would, and returns what it would, in order; a change that raises an error
-- returns {'error', message} in its place, and the others are made all the same.
local out = {}
for i = 1, #ARGV do
  local K = {}
  for k = 1, 8 do K[k] = KEYS[(i - 1) * 8 + k] end
  local ok, reply = pcall(transition, K, cjson.decode(ARGV[i]))
  if ok then
    out[i] = reply
  else  -- redis.call's errors are tables {err = message}
    if type(reply) == 'table' then reply = reply.err end
    out[i] = {'error', tostring(reply)}
  end
end
return out
"""
)

RESEND = (
    PUSH_MESSAGE_LUA
    + """
-- KEYS: job, task list; ARGV: the job's task message
-- Push the message of a job that is still queued (one whose message went missing).
if redis.call('HGET', KEYS[1], 'status') ~= 'queued' then return 0 end
push_message(KEYS[2], ARGV[1])
return 1
"""
)

APPEND_EVENTS = (
    _PUBLISH
    + """
-- KEYS: events stream, job and lease of each event, in threes
-- ARGV: the events channel, the streams' maxlen, then seven per event: job id, type, data
--   (JSON text), ts, first_output (the job's first-output time, '' to leave it), lease (the
--   token the event was made under, '' for none), text_at (`jobstore.notices`). Flat, not
--   one JSON argument: an event's data is JSON already, and decoding it inside a JSON
--   argument would escape it twice (and cost Redis a decode per token).
-- Appends every event to its job's stream and publishes them in one notice: their lines,
-- one per event. An event made under a lease that its job no longer has (it ran out, the
-- job was requeued or ended) is dropped: an abandoned run's events never follow the job's
-- next status. Returns the stream ids ('' for a dropped event).
local channel, maxlen = ARGV[1], ARGV[2]
local ids, lines = {}, {}
for i = 1, (#ARGV - 2) / 7 do
  local a = 2 + 7 * (i - 1)
  local job_id, etype, data, ts = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local first_output, lease = ARGV[a + 5], ARGV[a + 6]
  local job = KEYS[3 * i - 1]
  if lease ~= '' and redis.call('GET', KEYS[3 * i]) ~= lease then
    ids[i] = ''
  else
    if first_output ~= '' then
      local cur = redis.call('HGET', job, 'first_output_at')
      if not cur or cur == '' then redis.call('HSET', job, 'first_output_at', first_output) end
    end
    local id = redis.call('XADD', KEYS[3 * i - 2], 'MAXLEN', '~', maxlen, '*',
                          'type', etype, 'data', data, 'ts', ts)
    ids[i] = id
    lines[#lines + 1] = event_line(id, job_id, etype, data, ts, ARGV[a + 7])
  end
end
if #lines > 0 then
  redis.call('PUBLISH', channel, table.concat(lines, '\\n'))
end
return ids
"""
)


GIVE_BACK_LEASE = """
-- KEYS: lease, running zset; ARGV: token, job_id
-- Drop the lease now and mark the job's deadline as past: the reaper's next sweep
-- takes the job back as it would a dead worker's.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZADD', KEYS[2], 0, ARGV[2])
return 1
"""

REQUEST_PREEMPT = """
-- KEYS: job; ARGV: the cancel channel, job_id
-- Flag a running job to stop at its next step and go back to the queue (`batches.preempt`),
-- and wake its worker as a cancel does; nothing for a job that is no longer running.
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'preempt_requested', '1')
redis.call('PUBLISH', ARGV[1], ARGV[2])
return 1
"""

RENEW_LEASE = (
    _DEADLINE
    + """
-- KEYS: lease, running zset; ARGV: token, ttl ms, job_id
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], deadline_after(ARGV[2]), ARGV[3])
return 1
"""
)

RELEASE_HELD = (
    PUSH_MESSAGE_LUA
    + """
-- KEYS: holders of one pipeline and priority, its passes, the limits hash, the held counts
-- ARGV: the hold lists' prefix with `pipeline|priority|`, the jobs' key prefix, the held
--   counts' field (`pipeline|priority`), how many to release at most, the usage hashes'
--   prefix, the deployment's `max_running` (0: none)
-- Releases up to N held jobs, one at a time to the owner with the lowest pass (stride
-- scheduling: each release adds 1 / weight to its owner's pass) that is below its
-- `max_running`. A held job that left `queued` meanwhile (canceled, expired) is dropped,
-- not pushed. The hold lists, job and usage hashes are named from their prefixes (one
-- Redis or Sentinel, not Redis Cluster).
-- Returns the ids pushed.
local pushed = {}
local capped = {}
local tries = 0
while #pushed < tonumber(ARGV[4]) and tries < 10 * tonumber(ARGV[4]) + 10 do
  tries = tries + 1
  local owners = redis.call('ZRANGE', KEYS[1], 0, 63, 'WITHSCORES')
  local owner, pass, score = nil, nil, nil
  for i = 1, #owners, 2 do
    if not capped[owners[i]] then
      owner, score = owners[i], owners[i + 1]
      break
    end
  end
  if not owner then break end
  pass = tonumber(score)
  local weight, max_running = 1, tonumber(ARGV[6])
  local own = redis.call('HGET', KEYS[3], owner)
  if own then
    local mine = cjson.decode(own)
    weight = tonumber(mine.weight or 1)
    max_running = tonumber(mine.max_running or max_running)
  end
  local usage = ARGV[5] .. owner
  if max_running > 0 and tonumber(redis.call('HGET', usage, 'running') or '0') >= max_running then
    capped[owner] = true  -- its turn waits for one of its jobs to end; others go
  else
    local list = ARGV[1] .. owner
    local raw = redis.call('LPOP', list)
    if raw then
      redis.call('HINCRBY', KEYS[4], ARGV[3], -1)
      local entry = cjson.decode(raw)
      local job = ARGV[2] .. entry.job_id
      if redis.call('HGET', job, 'status') == 'queued' then
        push_message(entry.list, entry.envelope)
        redis.call('HDEL', job, 'held')
        redis.call('HSET', job, 'released', '1')
        redis.call('HINCRBY', usage, 'running', 1)
        pushed[#pushed + 1] = entry.job_id
        pass = pass + 1 / weight
        redis.call('HSET', KEYS[2], '', score)
      end
    end
    redis.call('HSET', KEYS[2], owner, tostring(pass))
    if redis.call('LLEN', list) > 0 then
      redis.call('ZADD', KEYS[1], pass, owner)
    else
      redis.call('ZREM', KEYS[1], owner)
    end
  end
end
return pushed
"""
)
