-- lookup: what should a new caller of a flight do? With a candidate token, a flight that
-- is absent or over (and not stored) is claimed at once: the first caller of a key is its
-- owner in one round trip. Claims of expired or failed flights go through claim.lua,
-- after the takeover jitter.
-- KEYS[1] meta  KEYS[2] result  KEYS[3] stream
-- ARGV[1] no_cache ("1": ignore a stored result)  ARGV[2] candidate token ('' = look only)
-- ARGV[3] owner (instance id)  ARGV[4] lease_ms  ARGV[5] ttl_ms  ARGV[6] linger_ms
-- ARGV[7] max_age_ms (> 0: a stored result older than this is not served)
-- ARGV[8] route  ARGV[9] model   (shown by the flights listing; written when claiming)
-- ARGV[10] local flight: a follow marks the flight waited for by that local flight of this
--          instance (w:<instance>:<local flight> = ARGV[11], its callers), so that its
--          owner does not cut it (ADR 0074); '' marks nothing
-- returns {"hit", status, header, body, age_ms, token, ttl_left_ms, landed_us}   token: of the attempt
--          that stored it; landed_us: when its complete ran
--      or {"owner", attempt, gen_id, lease_until, now_us}    claimed with the candidate
--      or {"follow", token, lease_remaining_ms, gen_id, attempt, batches, now_us}   batches: appended so far
--      (now_us and landed_us: this server's time in µs, for the fence of answered.go)
--      or {"claim", seen_token, attempt, reason, gen_id}     reason: absent | expired | failed | done | cut
-- Safe to run twice: a repeated lookup with my own candidate answers "owner" again.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])

if ARGV[1] ~= '1' then
  local r = redis.call('HMGET', KEYS[2], 'status', 'header', 'body', 'at', 'token', 'landed')
  local max_age = tonumber(ARGV[7]) or 0
  -- An answer stored by a server whose clock was ahead of this one (a failover, a clock
  -- stepped back) is as new as can be, not younger than that.
  local age = r[1] and math.max(0, now - tonumber(r[4]))
  if r[1] and (max_age <= 0 or age <= max_age) then
    return {'hit', r[1], r[2], r[3], age, r[5] or '', redis.call('PTTL', KEYS[2]), r[6] or ''}
  end
end

local m = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease_until', 'attempt', 'gen', 'n')
local cand = ARGV[2]
if cand ~= '' and m[2] == cand then
  return {'owner', tonumber(m[4]), m[5], tonumber(m[3]), now_us}
end
if cand ~= '' and (not m[1] or m[1] == 'D' or m[1] == 'A') then
  -- A new flight: no mark of an earlier one's callers stays (ADR 0074). The finished
  -- generation stays readable for linger: its followers may be between two reads. Only
  -- what is older than that goes (stream IDs are this server's time).
  if m[1] then
    redis.call('DEL', KEYS[1])
  end
  local gen = xadd(KEYS[3], {'t', 'gen', 'tok', cand, 'a', '1'}, now - tonumber(ARGV[6]))
  redis.call('HSET', KEYS[1], 'state', 'R', 'token', cand, 'owner', ARGV[3],
    'lease_until', int(now + tonumber(ARGV[4])), 'attempt', '1', 'created', int(now), 'gen', gen, 'n', '0',
    'route', ARGV[8] or '', 'model', ARGV[9] or '')
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
  return {'owner', 1, gen, now + tonumber(ARGV[4]), now_us}
end
if not m[1] then
  return {'claim', '', 0, 'absent', ''}
end
local attempt = tonumber(m[4]) or 0
if m[1] == 'R' then
  local rem = tonumber(m[3]) - now
  if rem > 0 then
    if (ARGV[10] or '') ~= '' then
      redis.call('HSET', KEYS[1], 'w:' .. ARGV[3] .. ':' .. ARGV[10], ARGV[11])
    end
    return {'follow', m[2], rem, m[5], attempt, tonumber(m[6]) or -1, now_us}
  end
  return {'claim', m[2], attempt, 'expired', m[5]}
end
if m[1] == 'F' then
  return {'claim', m[2], attempt, 'failed', m[5]}
end
if m[1] == 'A' then
  return {'claim', m[2], 0, 'cut', ''}
end
return {'claim', m[2], attempt, 'done', m[5]}
