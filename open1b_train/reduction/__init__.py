"""The reductions of a step, in the one order every run of a config uses.

``gradient.py`` is Algorithm 1 on one process: each virtual rank's micro-batches
accumulated, the shards of a replica added, the replica partials folded; ``treefold.py``
is the fold (the cluster's butterfly all-reduce, computed online, its dormant partials
optionally spilled). The distributed engine's collectives (``distributed/collectives.py``)
reproduce the same order element for element.
"""
