-- complete: end the flight with its response; store it when it may be cached.
-- KEYS[1] meta  KEYS[2] stream  KEYS[3] result
-- ARGV[1] token  ARGV[2] n  ARGV[3] status  ARGV[4] header (JSON)  ARGV[5] data (not yet streamed)
-- ARGV[6] transcript (the whole body)  ARGV[7] store ("1")  ARGV[8] result_ttl_ms
-- ARGV[9] linger_ms  ARGV[10] stream maxlen
-- returns 1 completed (or already completed by me: safe to run twice), 0 fenced
local m = redis.call('HMGET', KEYS[1], 'state', 'token')
if m[2] ~= ARGV[1] then
  return 0
end
if m[1] == 'D' then
  return 1
end
if m[1] ~= 'R' then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[10], '*', 't', 'done', 'tok', ARGV[1], 'n', ARGV[2],
  's', ARGV[3], 'h', ARGV[4], 'd', ARGV[5])
if ARGV[7] == '1' then
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[3], 'status', ARGV[3], 'header', ARGV[4], 'body', ARGV[6], 'at', now, 'token', ARGV[1])
  redis.call('PEXPIRE', KEYS[3], ARGV[8])
end
redis.call('HSET', KEYS[1], 'state', 'D', 'lease_until', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[9])
redis.call('PEXPIRE', KEYS[2], ARGV[9])
return 1
