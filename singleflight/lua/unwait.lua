-- unwait: no caller of this instance waits for the flight any more (ADR 0074).
-- KEYS[1] meta
-- ARGV[1] instance id  ARGV[2] finish ("1": one of its callers asked that the call finish)
-- ARGV[3] "/<flight>": the local flight whose callers left; a mark a newer flight of the
--         instance wrote since ("<callers>/<flight>") stays
-- returns 1: its mark was taken off (the time is noted: the owner cuts a grace later at the
-- earliest), 0: it had none
local mark = redis.call('HGET', KEYS[1], 'w:' .. ARGV[1])
if not mark or string.sub(mark, -#ARGV[3]) ~= ARGV[3] then
  return 0
end
redis.call('HDEL', KEYS[1], 'w:' .. ARGV[1])
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'left', string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
if ARGV[2] == '1' then
  redis.call('HSET', KEYS[1], 'finish', '1')
end
return 1
