-- Prepended by the store to the scripts that claim occurrences (claim, start).
-- claim(key, fire, claimant): compare-and-advance the last claimed occurrence
-- of one task. A key holds '<fire time>\n<claimant>'. Returns 1 when fire is
-- later than the last claim (and is now the last), or when this claimant made
-- the last claim, of this fire time (a resent claim); 0 when another claimed
-- it or a later one; nil and a message when the key is of an older shape.
local function claim(key, fire, claimant)
  local last = redis.call('GET', key)
  if last then
    local sep = string.find(last, '\n', 1, true)
    if not sep then
      return nil, 'tenure: claim key ' .. key .. ' is of an older shape'
    end
    local was = tonumber(string.sub(last, 1, sep - 1))
    if was > tonumber(fire) then
      return 0
    elseif was == tonumber(fire) and string.sub(last, sep + 1) ~= claimant then
      return 0
    end
  end
  redis.call('SET', key, fire .. '\n' .. claimant)
  return 1
end
