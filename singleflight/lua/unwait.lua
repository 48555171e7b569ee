-- unwait: no caller of this local flight of an instance waits for the flight any more
-- (ADR 0074).
-- KEYS[1] meta
-- ARGV[1] "<instance>:<local flight>", as marked by lookup.lua or claim.lua
-- ARGV[2] finish ("1": one of its callers asked that the call finish)
-- returns 1: its mark was taken off (the time is noted: the owner cuts a grace later at the
-- earliest), 0: it had none
if redis.call('HDEL', KEYS[1], 'w:' .. ARGV[1]) == 0 then
  return 0
end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'left', string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
if ARGV[2] == '1' then
  redis.call('HSET', KEYS[1], 'finish', '1')
end
return 1
