-- restore: prepended (after wake.lua) to each script an owner writes with (renew, append, complete, fail).
-- It puts back the meta of a running flight that Redis lost (a restart without persistence,
-- a failover to a replica that had not received the claim) for the owner that still holds
-- its lease by Redis's own clock: a compare-and-set on absence, so that new callers follow
-- the call in progress instead of starting another, and its followers read on.
-- The last six ARGV of each such script: owner (instance id), attempt, until (the
-- lease_until this owner last got; '' = restore nothing), n (batches appended so far),
-- lease_ms, ttl_ms.
local function restore(meta, stream, token)
  local r = #ARGV - 5
  if ARGV[r + 2] == '' or redis.call('EXISTS', meta) == 1 then
    return
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if now >= tonumber(ARGV[r + 2]) then
    return -- the lease ran out: another may have owned and finished the flight since
  end
  local gen = xadd(stream, {'t', 'gen', 'tok', token, 'a', ARGV[r + 1]})
  -- Followers' marks are lost with the meta: finish, so that no cut counts on them (ADR 0074).
  redis.call('HSET', meta, 'state', 'R', 'token', token, 'owner', ARGV[r],
    'lease_until', int(now + tonumber(ARGV[r + 4])), 'attempt', ARGV[r + 1], 'created', int(now),
    'gen', gen, 'n', ARGV[r + 3], 'finish', '1')
  redis.call('PEXPIRE', meta, ARGV[r + 5])
  redis.call('PEXPIRE', stream, ARGV[r + 5])
end

-- owned reads the owner's fields of the meta ('state' first, then those given), restoring
-- the meta first if Redis lost it. A meta that exists has a state, so the common case costs
-- one command: the check for absence is the read itself.
local function owned(meta, stream, token, ...)
  local m = redis.call('HMGET', meta, 'state', ...)
  if m[1] then
    return m
  end
  restore(meta, stream, token)
  return redis.call('HMGET', meta, 'state', ...)
end
