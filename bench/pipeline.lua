-- Send GET / requests in batches of `depth` on each connection (HTTP/1.1
-- pipelining); wrk counts every response.  The path is relative to the
-- working directory, which run_core.py sets to bench/.
dofile("stats.lua")

local depth = 16

function init(args)
   local batch = {}
   for i = 1, depth do
      batch[i] = wrk.format("GET", "/")
   end
   pipelined = table.concat(batch)
end

function request()
   return pipelined
end
