-- Write a run record as abandoned where the stored one still says running.
-- KEYS[1]  {prefix:runs:task}:records  (hash run_id -> JSON record, see record.lua)
-- ARGV[1]  run_id   ARGV[2]  the JSON record (outcome abandoned)
-- Returns 1 when written, 0 when the record is gone or no longer running.
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if not stored then
  return 0
end
-- The record is RunRecord's fields in order: the seventh is the outcome.
if cjson.decode(stored)[7] ~= 'running' then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
