-- Compare-and-advance the last claimed occurrence of scheduled tasks, each on its own.
-- KEYS[i]  {prefix:claims}:task (every claim key is in one hash slot)
-- ARGV[2i-1]  the occurrence's fire time (seconds)   ARGV[2i]  the claimant
-- Returns one answer per key, as claim() in _claim.lua (prepended by the store).
local answers = {}
for i, key in ipairs(KEYS) do
  local answer, older = claim(key, ARGV[2 * i - 1], ARGV[2 * i])
  if not answer then
    return redis.error_reply(older)
  end
  answers[i] = answer
end
return answers
