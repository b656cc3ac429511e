"""The sharded layer: the one place that tells a DTensor (DTensor, FSDP2) from a plain tensor.

Every public function of its modules takes plain tensors or DTensors. Plain ones
go to the single-process code of :mod:`prunereg._selection`; DTensors are pruned
shard by shard, with the masks of the full tensors. What crosses the network is
small: element counts, one norm per channel, shard sizes; weights never do, so
memory per rank stays proportional to its shard. ``torch.distributed`` is
imported only when a tensor is a DTensor.

- :mod:`.layout`: what the core needs of a DTensor: tell one, lay a tensor out
  like another, write values into a sharded parameter, a shard and its wrapper;
- :mod:`.collectives`: sums over shards, prefixes, per-channel statistics;
- :mod:`.vectors`: each rank's part of a vector as one DTensor spread over the ranks;
- :mod:`.draws`: random draws that do not depend on the number of ranks;
- :mod:`.select`, :mod:`.channels`, :mod:`.remaining`: selection, channel norms
  and masks, and what earlier pruning left, for plain tensors and DTensors alike;
- :mod:`.global_shares`: the local view of a global pruning over DTensors.

Pruning methods never ask which kind of tensor they hold: they call these
functions through :mod:`prunereg.toolkit`.
"""
