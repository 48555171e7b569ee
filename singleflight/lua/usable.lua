-- usable: write and publish as the proxy's scripts do, on a key its ACL covers: a PING is
-- answered by servers that refuse the scripts (a read-only replica, an ACL without the
-- proxy's commands or channels). See ADR 0022.
-- KEYS[1] the probe key (left absent: PEXPIRE of an absent key changes nothing)
-- returns 0
redis.call('PUBLISH', KEYS[1], '')
return redis.call('PEXPIRE', KEYS[1], 1)
