-- forget: drop a key's stored answer. A flight still running (its owner's final write may
-- be on its way after the owner's client had the answer: see answered.go) is marked with
-- this server's time, and that final write does not store an answer given before it.
-- KEYS[1] meta  KEYS[2] result
-- returns 1 if a stored answer was dropped, else 0
local t = redis.call('TIME')
local n = redis.call('DEL', KEYS[2])
if redis.call('HGET', KEYS[1], 'state') == 'R' then
  redis.call('HSET', KEYS[1], 'forgot', tonumber(t[1]) * 1000000 + tonumber(t[2]))
end
return n
