"""hicann/shmem's doubleplane MoE examples (MTE + SDMA planes) as a family."""
