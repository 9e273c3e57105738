#!/bin/bash
# Run 41's first call: what fits the card that came. An H200 (>= 120 GiB) takes the shapes an
# H100 cannot hold (Gemma 4 31B, the 35B-A3B's profile, the 27B at batch 64); an H100 takes the
# fp8 widening, W8A8 end to end and the live levels. Override with BIG= / SMALL=.
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
echo "gpu memory MiB: $mem"
if [ "${mem:-0}" -ge 120000 ]; then groups=${BIG:-"gemma31 moe35prof hybrid27"}; else groups=${SMALL:-"widen w8a8e2e"}; fi
echo "groups: $groups"
NO_TAR=1 timeout 560 bash benchmarks/results/run41/device_run41.sh "$groups"
cat /tmp/o41/stages.log /tmp/o41/*/stages.log 2>/dev/null
# a group cut by the cap leaves its partial output in run 39's /tmp/o: keep that too
tar czf "${OUT:-/tmp/out}/run41-${groups// /-}.tgz" -C /tmp o41 $(cd /tmp && ls -d o 2>/dev/null) && ls -laR /tmp/o41 | head -40
