-- renew: extend the owner's lease, or cut a flight nobody waits for (ADR 0074).
-- KEYS[1] meta  KEYS[2] stream
-- ARGV[1] token  ARGV[2] lease_ms  ARGV[3] ttl_ms
-- ARGV[4] idle_ms: how long no caller has waited on the owner's instance ('' = one waits,
--         or one asked that the call finish)  ARGV[5] grace_ms
-- ARGV[6] the mark of the owner's own local flight ("<instance>:<local flight>", left from
--         when it followed), not counted
-- ARGV[7] callers waiting on the owner's instance (shown by the flights listing)
-- returns the new lease_until (Redis time, ms), or 0: not the owner (fenced: another owner
-- took over, or the flight ended), or -1: the meta is gone and was not put back (Redis lost
-- it, and the lease ran out before this owner could renew it): nobody holds the flight,
-- or -2: cut: idle here for grace, no other instance's caller waits or asked to finish, and
-- the last one left grace ago; the flight is ended (state A) and its stream deleted
-- then the six ARGV of restore.lua, which runs first if the meta is gone
local m = owned(KEYS[1], KEYS[2], ARGV[1], 'token')
if not m[1] then
  return -1
end
if m[1] == 'A' and m[2] == ARGV[1] then
  return -2 -- cut already, by this owner's other request
end
if m[1] ~= 'R' or m[2] ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[4] ~= '' and tonumber(ARGV[4]) >= tonumber(ARGV[5]) then
  -- Marks are counted here, when a cut is asked, not kept counted on every follow.
  local waiting = 0
  for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(f, 1, 2) == 'w:' and f ~= 'w:' .. ARGV[6] then
      waiting = waiting + 1
    end
  end
  -- finish: a caller asked it, or the meta was restored (restore.lua): marks are not.
  local c = redis.call('HMGET', KEYS[1], 'finish', 'left')
  if waiting == 0 and c[1] ~= '1' and (not c[2] or now - tonumber(c[2]) >= tonumber(ARGV[5])) then
    redis.call('DEL', KEYS[1], KEYS[2])
    redis.call('HSET', KEYS[1], 'state', 'A', 'token', ARGV[1])
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return -2
  end
end
local lease_until = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'lease_until', int(lease_until), 'oc', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return lease_until
