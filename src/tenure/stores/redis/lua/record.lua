-- Write one run record of a scheduled task and keep only the newest ones.
-- KEYS[1]  {prefix:runs:task}:records  (hash run_id -> JSON record)
-- KEYS[2]  {prefix:runs:task}:index    (sorted set run_id by start time)
-- ARGV[1]  run_id   ARGV[2]  the JSON record (or '' to only trim)   ARGV[3]  start time
-- ARGV[4]  how many records to keep (0: do not trim)
-- Returns how many old records were removed.
if ARGV[2] ~= '' then
  record(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
end
return trim(KEYS[1], KEYS[2], tonumber(ARGV[4]))
