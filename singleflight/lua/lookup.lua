-- lookup: what should a new caller of a flight do?
-- KEYS[1] meta  KEYS[2] result
-- ARGV[1] no_cache ("1": ignore a stored result)
-- returns {"hit", status, header, body, age_ms}
--      or {"follow", token, lease_remaining_ms, gen_id, attempt}
--      or {"claim", seen_token, attempt, reason, gen_id}   reason: absent | expired | failed | done
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if ARGV[1] ~= '1' then
  local r = redis.call('HMGET', KEYS[2], 'status', 'header', 'body', 'at')
  if r[1] then
    return {'hit', r[1], r[2], r[3], now - tonumber(r[4])}
  end
end

local m = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease_until', 'attempt', 'gen')
if not m[1] then
  return {'claim', '', 0, 'absent', ''}
end
local attempt = tonumber(m[4]) or 0
if m[1] == 'R' then
  local rem = tonumber(m[3]) - now
  if rem > 0 then
    return {'follow', m[2], rem, m[5], attempt}
  end
  return {'claim', m[2], attempt, 'expired', m[5]}
end
if m[1] == 'F' then
  return {'claim', m[2], attempt, 'failed', m[5]}
end
return {'claim', m[2], attempt, 'done', m[5]}
