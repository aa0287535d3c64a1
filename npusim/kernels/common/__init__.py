"""What kernel families share, named as the upstream sources name it.

- :mod:`.split`: SplitToCore, a range of items over the cores;
- :mod:`.status`: the MC2 status MiB (STATE_OFFSET, WIN_STATE_OFFSET, FLAG_FIELD_OFFSET,
  CUMSUM_CAL_OFFSET, ...) as one object both window layouts ask;
- :mod:`.drain`: the flag-drain round robin of LocalWindowCopy;
- :mod:`.chain`: the dispatch -> combine chain and the digest of what combine reads;
- :mod:`.limits`: the DispatchV3 / CombineV3 shape limits (DISPATCH_V3_LIMITS);
- :mod:`.int8_quant`: the INT8 quantisations (per token, per block of 8) as vector
  instructions;
- :mod:`.moe_distribute`: the MoeDistributeDispatch / Combine operators' chain and
  quantisation options, for the families that take their tensor names;
- :mod:`.mix`: a MIX launch's blocks, cores and AIVs (block_dim, aiv_num);
- :mod:`.heap`: tensors stacked in a rank's symmetric window, and their regions;
- :mod:`.cumsum`: GetCumSum's last step, the cum-sum columns re-armed;
- :mod:`.padded`: a dispatch's padded outputs as the SHMEM ports write them, their chain
  to combine and their goldens;
- :mod:`.part`: a kernel run on one part of a composite tiling (a layer chaining other
  sources' kernels on their own tilings);
- :mod:`.article`: the cann-recipes-infer SHMEM article's inputs and what its two
  tilings share.

The typed routing draw a family's make_inputs receives is :class:`npusim.workload.routing.Routing`.

Ceil / Align and byte units are :mod:`npusim.units`, the number formats
:mod:`npusim.formats`, the MoE shape :mod:`npusim.workload.shape`.

Nothing here names a family or an op; families import from here, never from each other.
"""
