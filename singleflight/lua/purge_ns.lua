-- purge_ns: start a new generation of a namespace, so that every answer stored under the
-- old one is out of reach at once (it is part of their keys) and expires by itself.
-- KEYS[1] the namespace's generation  ARGV[1] ttl_ms (the longest result TTL and more)
-- returns the new generation: Redis time in microseconds, or one more than the last if
-- that is not larger. It is never handed out twice, even after the key expired (the
-- counter would start again at 1 and reach generations whose answers may still live).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local old = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local gen = now
if gen <= old then
  gen = old + 1
end
redis.call('SET', KEYS[1], string.format('%.0f', gen), 'PX', ARGV[1])
return string.format('%.0f', gen)
