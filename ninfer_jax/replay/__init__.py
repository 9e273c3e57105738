"""`ninfer replay`: re-send captured requests and compare their outputs with an earlier run.

records.py     read capture files (--capture-requests) and request logs (--request-log-jsonl)
sender.py      send one captured request over HTTP and time it (latency, TTFT, gaps)
local_server.py  an in-process server on an artifact (--artifact), with its own request log
compare.py     generated_token_ids of the replay against the earlier log, per request
report.py      percentiles, throughput, the text and JSON reports
run.py         the whole loop: read, send (N at a time), collect, compare, report
"""
