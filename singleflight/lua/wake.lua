-- wake: prepended to each script that adds to a flight's stream (lookup, claim, append,
-- complete, fail, restore). xadd adds an entry and publishes it on the channel named like
-- the stream, so that followers waiting on it in any process are pushed the entry itself
-- over one pub/sub connection per process, instead of each holding a blocked XREAD. The
-- message is the entry's ID and fields as length-prefixed strings ("<len>:<bytes>"), binary
-- safe; an entry whose data is larger than 2048 bytes is published without it, marked
-- x=1, and followers read it from the stream. The stream stays the truth: a follower that
-- missed messages (subscribing, reconnecting) reads it from where it is.
local function xadd(stream, fields)
  for i = 1, #fields do
    fields[i] = tostring(fields[i])
  end
  local id = redis.call('XADD', stream, '*', unpack(fields))
  local parts = {#id, ':', id}
  local big = false
  for i = 1, #fields, 2 do
    local v = fields[i + 1]
    if fields[i] == 'd' and #v > 2048 then
      big, v = true, ''
    end
    parts[#parts + 1] = #fields[i] .. ':' .. fields[i] .. #v .. ':' .. v
  end
  if big then
    parts[#parts + 1] = '1:x1:1'
  end
  redis.call('PUBLISH', stream, table.concat(parts))
  return id
end
