-- fail: end this attempt as FAILED so that a follower takes over at once.
-- KEYS[1] meta  KEYS[2] stream
-- ARGV[1] token  ARGV[2] n  ARGV[3] status ('' if no response)  ARGV[4] header (JSON)
-- ARGV[5] body  ARGV[6] reason  ARGV[7] ttl_ms  ARGV[8] stream maxlen
-- returns 1 failed (or already failed by me: safe to run twice), 0 fenced
local m = redis.call('HMGET', KEYS[1], 'state', 'token')
if m[2] ~= ARGV[1] then
  return 0
end
if m[1] == 'F' then
  return 1
end
if m[1] ~= 'R' then
  return 0
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[8], '*', 't', 'failed', 'tok', ARGV[1], 'n', ARGV[2],
  's', ARGV[3], 'h', ARGV[4], 'd', ARGV[5], 'r', ARGV[6])
redis.call('HSET', KEYS[1], 'state', 'F', 'lease_until', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[7])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
return 1
