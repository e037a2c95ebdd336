"""Lua scripts that change job state atomically (a transition and its indexes commit together)."""

from __future__ import annotations

NOTICE_JOB_MAX_BYTES = 16_384
"""A job whose fields add up to more than this is not carried in its end notice."""

# A status event as JSON, built inside Redis so that its stream id can go into the notice.
# Returns the stream id and the notice without its closing brace (an end notice is
# published again, with the job, on the ends channel).
_PUBLISH = """
local function announce(channel, stream, maxlen, job_id, etype, data, ts, ttl)
  local id = redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*',
                        'type', etype, 'data', data, 'ts', ts)
  if ttl then redis.call('EXPIRE', stream, ttl) end
  local notice = '{"id":"' .. id .. '","job_id":"' .. job_id .. '","type":"' .. etype ..
                 '","data":' .. data .. ',"ts":' .. ts
  redis.call('PUBLISH', channel, notice .. '}')
  return id, notice
end
"""

SUBMIT = (
    _PUBLISH
    + """
-- KEYS: job, owner index, queued set, idempotency key, events stream, task list, counter
-- ARGV: job_id, max_queued, score, idem_ttl, idem_value, maxlen, channel, event data, ts,
--       task message ('' for none), counter field ('' for none), the job's fields as
--       a JSON array of name, value pairs (one argument: cheaper to send than 40)
if ARGV[5] ~= '' then
  local prev = redis.call('GET', KEYS[4])
  if prev then return {'dup', prev} end
end
if redis.call('SCARD', KEYS[3]) >= tonumber(ARGV[2]) then return {'full', ''} end
redis.call('HSET', KEYS[1], unpack(cjson.decode(ARGV[12])))
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
if ARGV[5] ~= '' then redis.call('SET', KEYS[4], ARGV[5], 'EX', ARGV[4]) end
local id = announce(ARGV[7], KEYS[5], ARGV[6], ARGV[1], 'status', ARGV[8], ARGV[9], nil)
if ARGV[10] ~= '' then redis.call('LPUSH', KEYS[6], ARGV[10]) end
if ARGV[11] ~= '' then redis.call('HINCRBY', KEYS[7], ARGV[11], 1) end
return {'ok', id}
"""
)

TRANSITION = (
    _PUBLISH
    + """
-- KEYS: job, events stream, lease, running zset, queued set
-- ARGV: job_id, sources (comma-joined), target, now, lease mode, lease token, lease ttl ms,
--       end ttl s, maxlen, channel, event data, terminal (0/1), pre-event type ('' for
--       none: an output or error event written just before the status event), pre-event
--       data, fields to read back after the change (comma-joined, '' for none, '*' for
--       all of them), ends channel, field pairs...
local current = redis.call('HMGET', KEYS[1], 'status', 'cancel_requested')
local status = current[1]
if not status then return {'missing', ''} end
if not string.find(',' .. ARGV[2] .. ',', ',' .. status .. ',', 1, true) then
  return {'status', status}
end
local mode = ARGV[5]
if mode == 'check' then
  if redis.call('GET', KEYS[3]) ~= ARGV[6] then return {'lease', status} end
elseif mode == 'absent' then
  if redis.call('EXISTS', KEYS[3]) == 1 then return {'lease', status} end
elseif mode == 'acquire' then
  if current[2] == '1' then
    return {'canceled', status}
  end
  if not redis.call('SET', KEYS[3], ARGV[6], 'NX', 'PX', ARGV[7]) then
    return {'lease', status}
  end
  redis.call('HINCRBY', KEYS[1], 'attempts', 1)
end
local target = ARGV[3]
redis.call('HSET', KEYS[1], 'status', target, unpack(ARGV, 17))
local ttl = nil
local pre_id = ''
if ARGV[12] == '1' then ttl = ARGV[8] end
if ARGV[13] ~= '' then
  if ARGV[13] == 'output' then
    local cur = redis.call('HGET', KEYS[1], 'first_output_at')
    if not cur or cur == '' then redis.call('HSET', KEYS[1], 'first_output_at', ARGV[4]) end
  end
  pre_id = announce(ARGV[10], KEYS[2], ARGV[9], ARGV[1], ARGV[13], ARGV[14], ARGV[4], nil)
end
if target == 'queued' then
  redis.call('SADD', KEYS[5], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
elseif target == 'running' then
  redis.call('SREM', KEYS[5], ARGV[1])
  redis.call('ZADD', KEYS[4], tonumber(ARGV[4]) + tonumber(ARGV[7]) / 1000, ARGV[1])
else
  redis.call('SREM', KEYS[5], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  if mode == 'check' then redis.call('DEL', KEYS[3]) end
end
if ttl then redis.call('EXPIRE', KEYS[1], ttl) end
local id, notice = announce(ARGV[10], KEYS[2], ARGV[9], ARGV[1], 'status', ARGV[11], ARGV[4], ttl)
if not ttl and ARGV[15] == '' then return {'ok', id, pre_id} end
-- The job as it is now, read once: an end publishes it on the ends channel (so that a
-- request waiting for the end needs no second read) unless it is large, and the caller
-- gets the fields it asked for.
local flat = redis.call('HGETALL', KEYS[1])
local fields, size = {}, 0
for i = 1, #flat, 2 do
  size = size + #flat[i] + #flat[i + 1]
  fields[flat[i]] = flat[i + 1]
end
if ttl then
  local job = ''
  if size <= NOTICE_JOB_MAX_BYTES then job = ',"job":' .. cjson.encode(fields) end
  redis.call('PUBLISH', ARGV[16], notice .. job .. '}')
end
if ARGV[15] == '' then return {'ok', id, pre_id} end
if ARGV[15] == '*' then return {'ok', id, pre_id, unpack(flat)} end
local values = {}
for name in string.gmatch(ARGV[15], '[^,]+') do values[#values + 1] = fields[name] or '' end
return {'ok', id, pre_id, unpack(values)}
""".replace("NOTICE_JOB_MAX_BYTES", str(NOTICE_JOB_MAX_BYTES))
)

APPEND_EVENT = (
    _PUBLISH
    + """
-- KEYS: events stream, job
-- ARGV: channel, maxlen, job_id, type, data, ts, first-output field value ('' to skip)
if ARGV[7] ~= '' then
  local cur = redis.call('HGET', KEYS[2], 'first_output_at')
  if not cur or cur == '' then redis.call('HSET', KEYS[2], 'first_output_at', ARGV[7]) end
end
local id = announce(ARGV[1], KEYS[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], nil)
return id
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

RENEW_LEASE = """
-- KEYS: lease, running zset; ARGV: token, ttl ms, job_id, deadline
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
return 1
"""
