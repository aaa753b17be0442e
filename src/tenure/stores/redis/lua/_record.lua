-- Prepended by the store to the scripts that write run records (record,
-- records, start).
-- record(records, index, run_id, json, started): insert or replace one run
-- record (records: hash run_id -> JSON; index: sorted set run_id by start).
local function record(records, index, run_id, json, started)
  redis.call('HSET', records, run_id, json)
  redis.call('ZADD', index, started, run_id)
end

-- trim(records, index, keep): keep only the newest keep records of a task (0:
-- all of them); returns how many old ones were removed.
local function trim(records, index, keep)
  if keep == 0 then
    return 0
  end
  local old = redis.call('ZRANGE', index, 0, -keep - 1)
  if #old > 0 then
    redis.call('HDEL', records, unpack(old))
    redis.call('ZREM', index, unpack(old))
  end
  return #old
end
