-- wrk script: POST the JSON body in $WRK_BODY_FILE, each request with the next of $WRK_KEYS
-- raw API keys (sk-sync-bench-0000 ...), and print one machine-readable result line. Used by
-- perf/sync-bench.sh to give every request of a round its own key.
local path = os.getenv("WRK_BODY_FILE")
local f = assert(io.open(path, "rb"), "WRK_BODY_FILE not readable: " .. tostring(path))
local body = f:read("*a")
f:close()

local count = tonumber(os.getenv("WRK_KEYS") or "1000")
local prefix = os.getenv("WRK_KEY_PREFIX") or "sk-sync-bench-"
local keys = {}
for i = 0, count - 1 do
  keys[#keys + 1] = string.format("%s%04d", prefix, i)
end
local sent = 0

function setup(thread)
  -- Threads start at different keys so they do not send the same key at the same time.
  thread:set("offset", math.random(0, count - 1))
end

function request()
  sent = sent + 1
  local key = keys[((sent + (offset or 0)) % count) + 1]
  return wrk.format("POST", nil, {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. key,
  }, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRK_RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d err_status=%d err_timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.timeout))
end
