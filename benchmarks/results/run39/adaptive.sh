#!/bin/bash
# One device call of run 39: what fits the card that came. An H200 (>= 120 GiB) takes the Gemma
# 4 31B group (it does not fit an H100) and the reference-path lane comparisons; an H100 takes
# the hybrid group (27B and 35B-A3B fit in 80 GB) instead of Gemma.
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
echo "gpu memory MiB: $mem"
if [ "${mem:-0}" -ge 120000 ]; then groups=${BIG:-"gemma lanesref"}; else groups=${SMALL:-"hybrid"}; fi
echo "groups: $groups"
timeout 570 bash benchmarks/results/run39/device_run39.sh "$groups"
cat /tmp/o/stages.log
