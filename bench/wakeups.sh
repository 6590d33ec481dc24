#!/bin/bash
# bench/wakeups.sh SERVER [APP] [PORT]: who wakes whom, per request.
#
# SERVER is forkwsgi or bjoern (from bench/.venv), APP a callable of
# bench/framework_apps.py (default flask_app), on CPU 0; wrk -t1 -c50 on
# CPU 1 for 5 s (after 1 s of warm-up). Prints, per request: scheduler
# wake-ups (sched:sched_waking, counted system-wide: the tracepoint fires in
# the waker's context, sched_wakeup in the woken CPU's), context switches,
# and the rescheduling (RES) and function-call (CAL) interrupts the kernel
# sent (a remote wake-up in this VM). Needs perf (apt-get install linux-perf).
#
# Made for the Flask gap against bjoern: forkwsgi sends each response as it is
# ready and wakes the idle client for nearly every one; bjoern (libev)
# writes after its loop pass, and the client wakes once per batch. The wake
# (an IPI) runs in the sender's softirq and counts in its schedstat CPU.
set -euo pipefail
server=$1; app=${2:-flask_app}; port=${3:-18240}
bench=$(cd "$(dirname "$0")" && pwd)
cd "$bench"
if [ "$server" = bjoern ]; then
    taskset -c 0 .venv/bin/python -c "import bjoern, framework_apps as f; bjoern.run(f.$app, '127.0.0.1', $port)" &
else
    taskset -c 0 python3 -m forkwsgi "framework_apps:$app" --bind "127.0.0.1:$port" --log-level warning &
fi
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
url="http://127.0.0.1:$port/user/1"
for _ in $(seq 100); do curl -s -o /dev/null "$url" && break; sleep 0.1; done
taskset -c 1 wrk -t1 -c50 -d1s "$url" >/dev/null
ipis() { awk '$1 == "RES:" || $1 == "CAL:" { n = 0; for (i = 2; i <= 3; i++) n += $i; printf "%d ", n }' /proc/interrupts; }
read -r res0 cal0 <<< "$(ipis)"
out=$(mktemp)
perf stat -a -x, -e sched:sched_waking,context-switches -o "$out.perf" -- \
    taskset -c 1 wrk -t1 -c50 -d5s "$url" > "$out"
read -r res1 cal1 <<< "$(ipis)"
reqs=$(grep -o '[0-9]* requests in' "$out" | cut -d' ' -f1)
awk -F, -v r="$reqs" -v s="$server" -v res=$((res1 - res0)) -v cal=$((cal1 - cal0)) '
    NF > 2 && $1 ~ /^[0-9]/ { v[$3] = $1 }
    END { printf "%s: %d requests; per request: wake-ups %.2f, context switches %.2f, RES %.2f, CAL %.2f\n",
          s, r, v["sched:sched_waking"] / r, v["context-switches"] / r, res / r, cal / r }' "$out.perf"
rm -f "$out" "$out.perf"
