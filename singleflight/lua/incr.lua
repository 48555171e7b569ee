-- incr: reserve a block of owner sequence numbers, for fencing tokens.
-- KEYS[1] owner-seq  ARGV[1] block size  ARGV[2] ttl_ms
-- returns the last number of the block: the block is (n - size, n]
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return n
