-- Appended to every wrk run: print the run's figures as one machine-readable
-- line (latency in microseconds) after wrk's own human-readable report.
function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "BENCH-STATS requests=%d duration_us=%d bytes=%d " ..
      "connect=%d read=%d write=%d status=%d timeout=%d " ..
      "p50_us=%d p90_us=%d p99_us=%d p999_us=%d max_us=%d\n",
      summary.requests, summary.duration, summary.bytes,
      e.connect, e.read, e.write, e.status, e.timeout,
      latency:percentile(50), latency:percentile(90),
      latency:percentile(99), latency:percentile(99.9), latency.max))
end
