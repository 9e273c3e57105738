#!/bin/bash
# One device call of run 39: what fits the card that came. An H200 (>= 120 GiB) takes the Gemma
# 4 31B figures (it does not fit an H100) and the 35B-A3B's decode profile; an H100 (where
# the 27B and 35B-A3B ran out of memory in run 39) takes the kernel sweeps and the lanes.
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
echo "gpu memory MiB: $mem"
if [ "${mem:-0}" -ge 120000 ]; then groups=${BIG:-"gemma31 moe35prof moe35fold lanesref"}; else groups=${SMALL:-"gemvsweep kvsweep lanesref"}; fi
echo "groups: $groups"
NO_TAR=1 timeout 550 bash benchmarks/results/run39/device_run39.sh "$groups"
cat /tmp/o/stages.log
tar czf "${OUT:-/tmp/out}/run39-${groups// /-}.tgz" -C /tmp/o . && ls -la /tmp/o
