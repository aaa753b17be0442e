-- Release many leases, each on its own as release.lua does (see _release.lua).
-- Single server only (the keys of different names are in different hash slots).
-- KEYS per item i, KEYS[4i-3 .. 4i]: as release.lua's
-- ARGV per item i, ARGV[2i-1 .. 2i]: as release.lua's
-- Returns one answer per item, as release.lua's.
local answers = {}
for i = 1, #KEYS / 4 do
  local k, a = 4 * i - 3, 2 * i - 1
  answers[i] = release(KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[a], ARGV[a + 1])
end
return answers
