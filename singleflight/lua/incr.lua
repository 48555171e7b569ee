-- incr: the next owner sequence number, for a fencing token.
-- KEYS[1] owner-seq  ARGV[1] ttl_ms
-- returns the new counter value
local n = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return n
