"""The cache-aware router: one endpoint in front of several radixlm servers (data parallelism).

It talks HTTP to its workers (and, with --kv-events, subscribes to their KV events over ZMQ)
and imports nothing of the engine: a worker is a URL.
tree.py    approximate radix tree over request text, each worker a tenant
policies.py which worker a request goes to (cache_aware, round_robin, random, power_of_two)
kv_routing.py --kv-events: cache_aware on the workers' KV events (kv_index.py, kv_events.py)
"""
