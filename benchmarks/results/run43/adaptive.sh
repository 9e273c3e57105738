#!/bin/bash
# Run 43's first call: an H200 (>= 120 GiB) takes the shapes an H100 cannot hold (Gemma 4 31B
# with the windowed gather, the 27B at 64, the 35B-A3B under the profiler); an H100 takes the
# live levels with the compile counters and the mixed step's shapes. Override with BIG= /
# SMALL=. A group cut by the cap leaves its partial output under /tmp: all of it is tarred.
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
echo "gpu memory MiB: $mem"
if [ "${mem:-0}" -ge 120000 ]; then groups=${BIG:-"gemma31 hybrid27"}; else groups=${SMALL:-"live shapes"}; fi
echo "groups: $groups"
NO_TAR=1 timeout 570 bash benchmarks/results/run43/device_run43.sh "$groups"
cat /tmp/o43/stages.log /tmp/o43/*/stages.log 2>/dev/null
tar czf "${OUT:-/tmp/out}/run43-${groups// /-}.tgz" -C /tmp o43 \
  $(cd /tmp && ls -d o41 o 2>/dev/null) && ls -laR /tmp/o43 | head -40
