-- claim: become the owner of a flight, compare-and-set on the token the claimer saw.
-- KEYS[1] meta  KEYS[2] stream
-- ARGV[1] token (new, from INCR owner-seq + instance id)  ARGV[2] seen_token ('' = absent)
-- ARGV[3] owner (instance id)  ARGV[4] lease_ms  ARGV[5] ttl_ms  ARGV[6] max_attempts
-- ARGV[7] fresh ("1": a new caller, may restart the attempt count of a flight that gave up)
-- ARGV[8] seen_state (R, F, D, A; '' = absent)  ARGV[9] linger_ms
-- ARGV[10] route  ARGV[11] model   (shown by the flights listing)
-- ARGV[12] ARGV[13] the local flight and its callers, marked when it follows (see lookup.lua),
--          its mark taken off when it claims
-- returns {"owner", attempt, gen_id, lease_until, now_us}
--      or {"follow", token, lease_remaining_ms, gen_id, attempt, now_us}   (now_us: as lookup's)
--      or {"changed"}     the meta moved on since the claimer looked: look again
--      or {"exhausted"}   no attempt left for this flight
-- Safe to run twice: a repeated claim with my own token answers "owner" again.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])

local m = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease_until', 'attempt', 'gen')
if m[2] == ARGV[1] then
  return {'owner', tonumber(m[4]), m[5], tonumber(m[3]), now_us}
end
if m[1] == 'R' and tonumber(m[3]) > now then
  if (ARGV[12] or '') ~= '' then
    redis.call('HSET', KEYS[1], 'w:' .. ARGV[3] .. ':' .. ARGV[12], ARGV[13])
  end
  return {'follow', m[2], tonumber(m[3]) - now, m[5], tonumber(m[4]), now_us}
end
-- Compare-and-set on what the claimer saw, state included: an owner that completed since
-- (complete.lua keeps its token) must not be claimed over, its answer asked a second time.
if (m[2] or '') ~= ARGV[2] or (m[1] or '') ~= ARGV[8] then
  return {'changed'}
end

local attempt = 1
if m[1] == 'D' or m[1] == 'A' then
  redis.call('DEL', KEYS[1]) -- a new flight: no mark of an earlier one's callers stays (ADR 0074)
end
if m[1] == 'R' or m[1] == 'F' then
  attempt = (tonumber(m[4]) or 0) + 1
  if attempt > tonumber(ARGV[6]) then
    if ARGV[7] ~= '1' then
      return {'exhausted'}
    end
    attempt = 1
    -- A flight begun anew: those who waited for the last one have given up (ADR 0074).
    for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
      if string.sub(f, 1, 2) == 'w:' or f == 'left' or f == 'finish' then
        redis.call('HDEL', KEYS[1], f)
      end
    end
  end
end

-- Older generations are over, but their followers may be between two reads: they stay
-- for linger (stream IDs are this server's time); new readers start at gen.
local gen = xadd(KEYS[2], {'t', 'gen', 'tok', ARGV[1], 'a', attempt}, now - tonumber(ARGV[9]))
redis.call('HSET', KEYS[1], 'state', 'R', 'token', ARGV[1], 'owner', ARGV[3],
  'lease_until', int(now + tonumber(ARGV[4])), 'attempt', int(attempt), 'created', int(now), 'gen', gen, 'n', '0',
  'route', ARGV[10] or '', 'model', ARGV[11] or '')
-- Its own mark, left from when it followed, is no caller waiting elsewhere (ADR 0074).
if (ARGV[12] or '') ~= '' then
  redis.call('HDEL', KEYS[1], 'w:' .. ARGV[3] .. ':' .. ARGV[12])
end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return {'owner', attempt, gen, now + tonumber(ARGV[4]), now_us}
