-- Prepended by the store to the scripts that write run records (record, start).
-- record(records, index, run_id, json, started): insert or replace one run
-- record (records: hash run_id -> JSON; index: sorted set run_id by start).
local function record(records, index, run_id, json, started)
  redis.call('HSET', records, run_id, json)
  redis.call('ZADD', index, started, run_id)
end
