-- append: add batch n of the owner's streamed bytes to the flight's stream.
-- KEYS[1] meta  KEYS[2] stream
-- ARGV[1] token  ARGV[2] n (1, 2, ...)  ARGV[3] status ('' unless the head rides along)
-- ARGV[4] header (JSON)  ARGV[5] data  ARGV[6] ttl_ms  ARGV[7] stream maxlen
-- returns 1 appended (or already appended: safe to run twice), 0 fenced, 2 the stream
-- holds maxlen entries: the owner sends the rest with its final write, -1 the meta is
-- gone and was not put back (see renew.lua), -2 this owner's flight was cut
-- then the six ARGV of restore.lua, which runs first if the meta is gone
local m = owned(KEYS[1], KEYS[2], ARGV[1], 'token', 'n')
if not m[1] then
  return -1
end
if m[1] == 'A' and m[2] == ARGV[1] then
  return -2 -- cut: nobody waits (ADR 0074)
end
if m[1] ~= 'R' or m[2] ~= ARGV[1] then
  return 0
end
if (tonumber(m[3]) or 0) >= tonumber(ARGV[2]) then
  return 1
end
-- The cap counts this generation's entries (its gen entry and n batches), not the
-- finished generations still kept for their followers.
if (tonumber(m[3]) or 0) + 1 >= tonumber(ARGV[7]) then
  return 2
end
if ARGV[3] ~= '' then
  xadd(KEYS[2], {'t', 'chunk', 'tok', ARGV[1], 'n', ARGV[2], 's', ARGV[3], 'h', ARGV[4], 'd', ARGV[5]})
else
  xadd(KEYS[2], {'t', 'chunk', 'tok', ARGV[1], 'n', ARGV[2], 'd', ARGV[5]})
end
redis.call('HSET', KEYS[1], 'n', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
return 1
