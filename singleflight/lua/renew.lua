-- renew: extend the owner's lease.
-- KEYS[1] meta  KEYS[2] stream
-- ARGV[1] token  ARGV[2] lease_ms  ARGV[3] ttl_ms
-- returns the new lease_until (Redis time, ms), or 0: not the owner (fenced: another owner
-- took over, or the flight ended), or -1: the meta is gone and was not put back (Redis lost
-- it, and the lease ran out before this owner could renew it): nobody holds the flight
-- then the six ARGV of restore.lua, which runs first if the meta is gone
local m = owned(KEYS[1], KEYS[2], ARGV[1], 'token')
if not m[1] then
  return -1
end
if m[1] ~= 'R' or m[2] ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_until = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'lease_until', int(lease_until))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return lease_until
