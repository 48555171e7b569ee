-- renew: extend the owner's lease, or cut a flight nobody waits for (ADR 0074).
-- KEYS[1] meta  KEYS[2] stream
-- ARGV[1] token  ARGV[2] lease_ms  ARGV[3] ttl_ms
-- ARGV[4] idle_ms: how long no caller has waited on the owner's instance ('' = one waits,
--         or one asked that the call finish)  ARGV[5] grace_ms
-- ARGV[6] callers waiting on the owner's instance (shown by the flights listing)
-- returns the new lease_until (Redis time, ms), or 0: not the owner (fenced: another owner
-- took over, or the flight ended), or -1: the meta is gone and was not put back (Redis lost
-- it, and the lease ran out before this owner could renew it): nobody holds the flight,
-- or -2: cut: idle here for grace, no other instance's caller waits or asked to finish, and
-- the last one left grace ago; the attempt is ended (a failed entry, r=cut, in its stream)
-- and the flight with it (state A)
-- then the six ARGV of restore.lua, which runs first if the meta is gone
local m = owned(KEYS[1], KEYS[2], ARGV[1], 'token', 'lease_until', 'n')
if not m[1] then
  return -1
end
if m[1] == 'A' and m[2] == ARGV[1] then
  return -2 -- cut already, by this owner's other request
end
if m[1] ~= 'R' or m[2] ~= ARGV[1] then
  return 0
end
-- Redis went back in time (a restart from a snapshot, a failover to a replica that lagged):
-- the lease or the batches this owner knows it wrote are lost, and so may be the marks of
-- followers since: none can be trusted, the call finishes (restore.lua's rule).
local r = #ARGV - 5
if (ARGV[r + 2] ~= '' and (tonumber(m[3]) or 0) < tonumber(ARGV[r + 2])) or (tonumber(m[4]) or 0) < tonumber(ARGV[r + 3]) then
  redis.call('HSET', KEYS[1], 'finish', '1')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[4] ~= '' and tonumber(ARGV[4]) >= tonumber(ARGV[5]) then
  -- Marks are counted here, when a cut is asked, not kept counted on every follow.
  local waiting = false
  for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
    waiting = waiting or string.sub(f, 1, 2) == 'w:'
  end
  -- finish: a caller asked it, or Redis lost writes (restore.lua, above): marks are not.
  local c = redis.call('HMGET', KEYS[1], 'finish', 'left')
  if not waiting and c[1] ~= '1' and (not c[2] or now - tonumber(c[2]) >= tonumber(ARGV[5])) then
    -- The stream stays: the flight before may have late followers reading its end.
    xadd(KEYS[2], {'t', 'failed', 'tok', ARGV[1], 'n', (tonumber(m[4]) or 0) + 1, 'r', 'cut'})
    redis.call('DEL', KEYS[1])
    redis.call('HSET', KEYS[1], 'state', 'A', 'token', ARGV[1])
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return -2
  end
end
local lease_until = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'lease_until', int(lease_until), 'oc', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return lease_until
