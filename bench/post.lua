-- POST a 1 KiB JSON document on each request (kept-alive connections); the
-- app (apps.py post_json) reads it through wsgi.input.  The path is relative
-- to the working directory, which run_core.py sets to bench/.
dofile("stats.lua")

local items = {}
for i = 1, 24 do
   items[i] = string.format('{"id":%d,"name":"item-%02d","ok":true}', i, i)
end
local doc = '{"items":[' .. table.concat(items, ",") .. '],"pad":"'
doc = doc .. string.rep("p", 1024 - #doc - 2) .. '"}'
assert(#doc == 1024, "the body must be 1 KiB")

wrk.method = "POST"
wrk.body = doc
wrk.headers["Content-Type"] = "application/json"
