-- Release one lease (see _release.lua).
-- KEYS[1]  the lease hash      {prefix:name}:lease
-- KEYS[2]  the fence counter   {prefix:name}:fence
-- KEYS[3]  the queued waiter   {prefix:name}:next   (see enlist.lua)
-- KEYS[4]  the hand-over list  {prefix:name}:handed (the queued waiter BLPOPs it)
-- ARGV[1]  token   ARGV[2]  the lease's release channel
-- Returns 1 when the live lease held by the token was deleted, else 0.
return release(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2])
