-- complete: end the flight with its answer; store it when it may be cached.
-- KEYS[1] meta  KEYS[2] stream  KEYS[3] result
-- ARGV[1] token
-- ARGV[2] landed_n  ARGV[3] skip: the first skip bytes of data are batch landed_n, whose
--         append failed on the owner's side; if the flight's batch count shows it landed
--         after all, they are not added again (0 0: no such batch)
-- ARGV[4] status  ARGV[5] header (JSON)  ARGV[6] data (not yet streamed)
-- ARGV[7] transcript (the whole body)  ARGV[8] store ("1")  ARGV[9] result_ttl_ms
-- ARGV[10] linger_ms
-- returns 1 completed (or already completed by me: safe to run twice; a flight it cut
-- itself included), 0 fenced, -1 the meta is gone and was not put back (see renew.lua)
-- then the six ARGV of restore.lua, which runs first if the meta is gone
local m = owned(KEYS[1], KEYS[2], ARGV[1], 'token', 'n')
if not m[1] then
  return -1 -- gone, and not put back (see renew.lua)
end
if m[2] ~= ARGV[1] then
  return 0
end
if m[1] == 'D' then
  return 1
end
-- Cut (A) with this token: nobody claimed it since; an answer whole when the cut landed is
-- still this owner's to end and store (ADR 0074).
if m[1] ~= 'R' and m[1] ~= 'A' then
  return 0
end
-- The batches landed: the meta's count, or more where the owner knows more landed (a
-- Redis restarted from data a moment old has the flight but not its last batches; the done
-- entry numbered after the owner's count shows a follower that gap).
local n = math.max(tonumber(m[3]) or 0, tonumber(ARGV[#ARGV - 2]) or 0)
local data = ARGV[6]
if tonumber(ARGV[2]) > 0 and n >= tonumber(ARGV[2]) then
  data = string.sub(data, tonumber(ARGV[3]) + 1)
end
-- landed: when this write ran, in µs: no client had the answer before it. A caller that may
-- have joined a local flight after it is not given the answer (answered.go).
-- (Written as digits: tostring of a Lua number past 14 digits gives an exponent.)
local t = redis.call('TIME')
local landed = t[1] .. string.format('%06d', tonumber(t[2]))
local id = xadd(KEYS[2], {'t', 'done', 'tok', ARGV[1], 'n', n + 1, 's', ARGV[4], 'h', ARGV[5], 'd', data, 'landed', landed})
if ARGV[8] == '1' then
  -- The entry's ID is this server's time in ms (or the stream's last, if the clock went
  -- back): the answer's time. The six fields are all a result ever holds, so writing them
  -- replaces one stored before; landed goes with it, for a follower that ends from it.
  local at = string.match(id, '^%d+')
  redis.call('HSET', KEYS[3], 'status', ARGV[4], 'header', ARGV[5], 'body', ARGV[7], 'at', at, 'token', ARGV[1],
    'landed', landed)
  redis.call('PEXPIRE', KEYS[3], ARGV[9])
end
redis.call('HSET', KEYS[1], 'state', 'D', 'lease_until', '0', 'n', int(n + 1))
-- The finished meta outlives any lease still running (restore.lua's rule: within its
-- lease, no other owner can have finished a flight whose meta is gone).
local keep = int(math.max(tonumber(ARGV[10]), tonumber(ARGV[#ARGV - 1])))
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[2], keep)
return 1
