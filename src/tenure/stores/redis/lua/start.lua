-- Start occurrences of scheduled tasks, each one atomic step: claim it; if
-- claimed, acquire its task's lock; if granted, write its start record.
-- Single server only (the keys of one item are in different hash slots).
-- KEYS[1]  {prefix:tasks}  (the set of task names that have records)
-- then per item i, KEYS[5i-3 .. 5i+1]: the claim key, the lease hash, the
--   fence counter, the run records hash, the run index
-- ARGV per item i, ARGV[9i-8 .. 9i]: fire time, claimant, token, ttl in ms,
--   holder id, run_id, the JSON start record (a JSON array whose last item,
--   the fence, is null: the grant's fencing token is written in its place),
--   start time, task name
-- Returns one answer per item: -1 claimed elsewhere; 0 claimed, the lock is
-- held; else the fencing token of the grant (the record is written).
local answers = {}
local n = (#KEYS - 1) / 5
for i = 1, n do
  local k, a = 5 * i - 3, 9 * i - 8
  local claimed, older = claim(KEYS[k], ARGV[a], ARGV[a + 1])
  if not claimed then
    return redis.error_reply(older)
  end
  local answer = -1
  if claimed == 1 then
    answer = acquire(KEYS[k + 1], KEYS[k + 2], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]) or 0
    if answer ~= 0 then
      local json = string.sub(ARGV[a + 6], 1, -6) .. string.format('%d', answer) .. ']'
      record(KEYS[k + 3], KEYS[k + 4], ARGV[a + 5], json, ARGV[a + 7])
      redis.call('SADD', KEYS[1], ARGV[a + 8])
    end
  end
  answers[i] = answer
end
return answers
