-- Write many run records, each as record.lua does, and name their tasks in
-- the set of tasks that have records. Single server only (each task's records
-- are in a hash slot of their own).
-- KEYS[1]  {prefix:tasks}  (the set of task names that have records)
-- then per item i, KEYS[2i .. 2i+1]: the run records hash, the run index
-- ARGV per item i, ARGV[5i-4 .. 5i]: run_id, the JSON record, start time,
--   how many records to keep (0: do not trim), task name
-- Returns how many old records were removed in all.
local removed = 0
for i = 1, (#KEYS - 1) / 2 do
  local k, a = 2 * i, 5 * i - 4
  record(KEYS[k], KEYS[k + 1], ARGV[a], ARGV[a + 1], ARGV[a + 2])
  removed = removed + trim(KEYS[k], KEYS[k + 1], tonumber(ARGV[a + 3]))
  redis.call('SADD', KEYS[1], ARGV[a + 4])
end
return removed
