-- wrk script: POST an event with an Idempotency-Key chosen by mode (first | replay | mix).
-- args: mode token run_id path [event type, default invoice.paid]
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

function init(args)
  mode, token, run, path = args[1], args[2], args[3], args[4]
  local event_type = args[5] or "invoice.paid"
  n = 0
  body = '{"type":"' .. event_type .. '","data":{"invoice":"in_1","amount":1200}}'
  math.randomseed(tid * 7919)
end

function request()
  n = n + 1
  local key
  if mode == "first" then
    key = run .. "-" .. tid .. "-" .. n
  elseif mode == "replay" then
    key = "replay-" .. run .. "-" .. (n % 50)
  else -- mix: one request in ten retries an earlier key of this connection's thread
    if n > 10 and math.random() < 0.1 then
      key = run .. "-" .. tid .. "-" .. math.random(1, n - 1)
    else
      key = run .. "-" .. tid .. "-" .. n
    end
  end
  return wrk.format("POST", path, {
    ["Authorization"] = "Bearer " .. token, ["Idempotency-Key"] = key,
    ["Content-Type"] = "application/json"}, body)
end

function done(summary, latency, requests)
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"errors":%d,"non2xx":%d,"mean_us":%.1f,' ..
    '"p50_us":%d,"p75_us":%d,"p90_us":%d,"p99_us":%d,"p999_us":%d}\n',
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status, latency.mean, latency:percentile(50), latency:percentile(75),
    latency:percentile(90), latency:percentile(99), latency:percentile(99.9)))
end
