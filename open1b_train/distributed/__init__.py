"""Deterministic data-parallel training on torch.distributed (gloo on CPU, NCCL on GPU).

A run's logical mesh (``dp_replicate`` R x ``dp_shard`` S virtual ranks) is fixed by its
config; P physical processes (any divisor of R * S) each run a contiguous block of virtual
ranks (``placement.py``). Virtual ranks talk through ``exchange.py`` (one torch.distributed
all-to-all per round between processes, plain references inside one), so the
deterministic collectives of ``collectives.py`` - the reduce-scatter over shards and the
all-reduce over replicas with TreeFold's tree - compute exactly the single-process Algorithm 1's bits
on any P. ``engine.py`` is the training loop; ``launch.py`` starts P local workers.
"""
