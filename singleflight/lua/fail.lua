-- fail: end this attempt as FAILED so that a follower takes over at once.
-- KEYS[1] meta  KEYS[2] stream
-- ARGV[1] token  ARGV[2] status ('' if no response)  ARGV[3] header (JSON)  ARGV[4] body
-- ARGV[5] reason (error, timeout, shutdown)  ARGV[6] ttl_ms
-- A release at shutdown is no fault of the request: it does not use up an attempt.
-- returns 1 failed (or already failed by me: safe to run twice), 0 fenced, -1 the meta is
-- gone and was not put back (see renew.lua)
-- then the six ARGV of restore.lua, which runs first if the meta is gone
local m = owned(KEYS[1], KEYS[2], ARGV[1], 'token', 'n', 'attempt')
if not m[1] then
  return -1 -- gone, and not put back (see renew.lua)
end
if m[2] ~= ARGV[1] then
  return 0
end
if m[1] == 'F' then
  return 1
end
if m[1] ~= 'R' then
  return 0
end
local n = (tonumber(m[3]) or 0) + 1
xadd(KEYS[2], {'t', 'failed', 'tok', ARGV[1], 'n', n, 's', ARGV[2], 'h', ARGV[3], 'd', ARGV[4], 'r', ARGV[5]})
redis.call('HSET', KEYS[1], 'state', 'F', 'lease_until', '0', 'n', int(n))
if ARGV[5] == 'shutdown' then
  redis.call('HSET', KEYS[1], 'attempt', int(math.max((tonumber(m[4]) or 1) - 1, 0)))
end
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
return 1
