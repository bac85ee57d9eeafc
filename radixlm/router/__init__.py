"""The cache-aware router: one endpoint in front of several radixlm servers (data parallelism).

It talks HTTP to its workers only and imports nothing of the engine: a worker is a URL.
tree.py    approximate radix tree over request text, each worker a tenant
policies.py which worker a request goes to (cache_aware, round_robin, random, power_of_two)
"""
