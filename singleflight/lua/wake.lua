-- wake: prepended to each script that adds to a flight's stream (lookup, claim, append,
-- complete, fail, restore). xadd adds an entry and publishes it on the channel named like
-- the stream, so that followers waiting on it in any process are pushed the entry itself
-- over one pub/sub connection per process (ADR 0012). The message is the entry's ID and
-- fields as length-prefixed strings ("<len>:<bytes>"), binary safe; an entry whose data
-- is larger than 2048 bytes is published without it, marked x=1, and followers read it
-- from the stream. The stream stays the truth: a follower that missed messages
-- (subscribing, reconnecting) reads it from where it is.
--
-- int writes an integer (a time, a count) with %d: a Lua number passed to redis.call or
-- joined to a string is written through printf's floating point. See ADR 0019.
local function int(x)
  return string.format('%d', x)
end

-- xadd adds fields to stream (trimming the entries with IDs below minid, if given, in the
-- same command) and publishes the entry.
local function xadd(stream, fields, minid)
  for i = 1, #fields do
    if type(fields[i]) == 'number' then
      fields[i] = int(fields[i])
    end
  end
  local id
  if minid then
    id = redis.call('XADD', stream, 'MINID', int(minid), '*', unpack(fields))
  else
    id = redis.call('XADD', stream, '*', unpack(fields))
  end
  local parts = {string.format('%d:', #id), id}
  local big = false
  for i = 1, #fields, 2 do
    local k, v = fields[i], fields[i + 1]
    if k == 'd' and #v > 2048 then
      big, v = true, ''
    end
    parts[#parts + 1] = string.format('%d:%s%d:', #k, k, #v)
    parts[#parts + 1] = v
  end
  if big then
    parts[#parts + 1] = '1:x1:1'
  end
  redis.call('PUBLISH', stream, table.concat(parts))
  return id
end
