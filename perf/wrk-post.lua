-- wrk script: POST the JSON body in $WRK_BODY_FILE and print one machine-readable result line.
-- Used by perf/bench.sh; responses are read to the end by wrk (chunked/SSE included).
local path = os.getenv("WRK_BODY_FILE")
local f = assert(io.open(path, "rb"), "WRK_BODY_FILE not readable: " .. tostring(path))
local body = f:read("*a")
f:close()

wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/json"
local key = os.getenv("BENCH_API_KEY")
if key and key ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. key
end

-- BENCH_KEY_PREFIX and BENCH_KEYS (optional): thread i sends every request with key
-- BENCH_KEY_PREFIX .. (i % BENCH_KEYS) instead. With as many threads as connections (wrk -t N
-- -c N) each connection keeps one key, as an SDK client's does: the shape the router's
-- connection handoff is for (perf/README.md, "Keys per connection").
local prefix = os.getenv("BENCH_KEY_PREFIX")
local keys = tonumber(os.getenv("BENCH_KEYS") or "0")
local threads = 0

function setup(thread)
  if prefix and prefix ~= "" and keys > 0 then
    thread:set("thread_key", prefix .. tostring(threads % keys))
  end
  threads = threads + 1
end

function init(args)
  if thread_key then
    wrk.headers["Authorization"] = "Bearer " .. thread_key
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRK_RESULT requests=%d duration_us=%d bytes=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d " ..
    "err_connect=%d err_read=%d err_write=%d err_status=%d err_timeout=%d\n",
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    e.connect, e.read, e.write, e.status, e.timeout))
end
